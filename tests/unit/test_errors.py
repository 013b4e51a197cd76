"""The exception tree: data, hints, built-in bases, pickling."""

import inspect
import pickle

import pytest

from pgsnap import errors


def _all_errors():
    return [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.PgsnapError)
    ]


SAMPLES = {
    "step_id": "restore-vol-1",
    "action": "storage.restore_volume",
    "volume_id": "vol-1",
    "snapshot_id": "snap-1",
    "plan_id": "ab" * 32,
    "state": "failed",
    "argv": ("umount", "/x"),
    "returncode": 32,
    "path": "/pg/data",
    "target": "/pg/data",
    "device": "/dev/sdb",
}


def _required(cls):
    """The keyword arguments the class's constructor requires, with sample values."""
    params = inspect.signature(cls).parameters.values()
    return {
        p.name: SAMPLES[p.name] for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    }


@pytest.mark.parametrize("cls", _all_errors(), ids=lambda c: c.__name__)
def test_every_error_pickles_with_its_data(cls):
    required = _required(cls)
    err = cls("something broke", hint="do this", missing=("a", "b"), extra_detail="x", **required)
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls
    assert str(copy) == str(err) == "something broke (hint: do this)"
    assert copy.missing == ("a", "b")
    assert copy.extra_detail == "x"
    assert copy.hint == "do this"
    for name, value in required.items():
        assert getattr(copy, name) == value


def test_execution_errors_always_say_what_was_done_and_undone():
    err = errors.ExecutionError(
        "boom",
        step_id="s2",
        completed=["s0", "s1"],
        compensated=["s1"],
        compensation_failures=["s0: x"],
        cause=errors.BackendUnavailable("array down", backend="mock"),
    )
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.step_id, copy.completed, copy.compensated) == ("s2", ("s0", "s1"), ("s1",))
    assert copy.compensation_failures == ("s0: x",)
    assert copy.past_point_of_no_return is False and copy.leftovers == ()
    assert isinstance(copy.cause, errors.BackendUnavailable) and copy.cause.backend == "mock"
    with pytest.raises(TypeError):
        errors.ExecutionError("no step")  # type: ignore[call-arg]  # the step is not optional


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
