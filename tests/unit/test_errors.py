"""The exception tree: data, hints, built-in bases, pickling."""

import inspect
import pickle

import pytest

from pgsnap import errors


def _all_errors():
    return [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
            if issubclass(obj, errors.PgsnapError)]


@pytest.mark.parametrize("cls", _all_errors(), ids=lambda c: c.__name__)
def test_every_error_pickles_with_its_data(cls):
    err = cls("something broke", hint="do this", volume_id="vol-1", missing=("a", "b"))
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls
    assert str(copy) == str(err) == "something broke (hint: do this)"
    assert copy.volume_id == "vol-1"
    assert copy.missing == ("a", "b")
    assert copy.hint == "do this"


@pytest.mark.parametrize("cls", _all_errors(), ids=lambda c: c.__name__)
def test_every_error_is_in_the_drawn_tree(cls):
    assert cls.__name__ in errors.__doc__
    assert cls.__name__ in errors.__all__
    assert cls.__doc__


def test_misuse_errors_subclass_builtins():
    assert issubclass(errors.LSNError, ValueError)
    assert issubclass(errors.TargetError, ValueError)
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.BackendNotFound, LookupError)
    assert issubclass(errors.VolumeNotFound, LookupError)
    assert issubclass(errors.SnapshotNotFound, LookupError)
    assert issubclass(errors.BackupNotFound, LookupError)


def test_retryable_flags():
    assert errors.BackendUnavailable.retryable
    assert errors.CatalogLockedError.retryable
    assert not errors.PlanningError.retryable
