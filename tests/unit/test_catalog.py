"""DirectoryCatalog: atomic, private, locked; MemoryCatalog: same contract."""

import datetime as dt
import multiprocessing
import os
import stat

import attrs
import pytest

from pgsnap import errors
from pgsnap.catalog import DirectoryCatalog, MemoryCatalog
from pgsnap.model import BackupState
from tests.unit.test_model import _record


@pytest.fixture(params=["dir", "memory"])
def catalog(request, tmp_path):
    return DirectoryCatalog(tmp_path / "cat") if request.param == "dir" else MemoryCatalog()


def test_put_get_list_delete(catalog):
    a = _record(id="b-1")
    b = attrs.evolve(_record(id="b-2"), start_time=a.start_time.replace(hour=5))
    catalog.put(b)
    catalog.put(a)
    assert catalog.get("b-1") == a
    assert [r.id for r in catalog.list()] == ["b-1", "b-2"]  # oldest first
    catalog.put(attrs.evolve(a, state=BackupState.FAILED, failure_reason="x"))
    assert catalog.get("b-1").state is BackupState.FAILED
    catalog.delete("b-1")
    with pytest.raises(errors.BackupNotFound):
        catalog.get("b-1")
    with pytest.raises(errors.BackupNotFound):
        catalog.delete("b-1")


@pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "", ".hidden", "x" * 200])
def test_bad_ids_refused(catalog, bad):
    with pytest.raises(errors.CatalogError):
        catalog.get(bad)


def test_files_are_private_and_atomic(tmp_path):
    cat = DirectoryCatalog(tmp_path / "cat")
    cat.put(_record(id="b-1"))
    path = tmp_path / "cat" / "b-1.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "cat").st_mode) == 0o700
    assert [p.name for p in (tmp_path / "cat").iterdir() if p.name.endswith(".tmp")] == []


def test_corrupt_file_is_reported_not_crashing(tmp_path):
    cat = DirectoryCatalog(tmp_path / "cat")
    cat.put(_record(id="good"))
    (tmp_path / "cat" / "bad.json").write_text("{truncated")
    with pytest.raises(errors.CatalogError, match="unreadable"):
        cat.get("bad")
    assert [r.id for r in cat.list()] == ["good"]


def _writer(path, n):
    cat = DirectoryCatalog(path)
    for i in range(20):
        cat.put(_record(id=f"w{n}-{i}", label="x" * 5000))


def test_concurrent_writers_do_not_corrupt(tmp_path):
    path = tmp_path / "cat"
    DirectoryCatalog(path)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, n)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    records = DirectoryCatalog(path).list()
    assert len(records) == 80
    assert all(r.label == "x" * 5000 for r in records)


def test_lock_timeout(tmp_path):
    import fcntl

    cat = DirectoryCatalog(tmp_path / "cat", lock_timeout=0.1)
    fd = os.open(tmp_path / "cat" / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(errors.CatalogLockedError):
            # A separate open file description, so the lock conflicts in-process too.
            cat.put(_record(id="b-1"))
    finally:
        os.close(fd)


def test_records_are_ordered_by_instant_across_a_daylight_saving_change(tmp_path):
    """Files written with local offsets (an older pgsnap, a hand edit) sort by time, not text."""
    from pgsnap.model import to_dict

    cat = DirectoryCatalog(tmp_path / "cat")
    early = to_dict(_record(id="b-early"))
    late = to_dict(_record(id="b-late"))
    early["start_time"] = "2026-10-25T03:30:00+02:00"  # summer time: 01:30 UTC
    late["start_time"] = "2026-10-25T02:45:00+00:00"  # 02:45 UTC, but sorts first as text
    import json

    for doc in (early, late):
        (tmp_path / "cat" / f"{doc['id']}.json").write_text(json.dumps(doc))
    listed = cat.list()
    assert [r.id for r in listed] == ["b-early", "b-late"]
    assert all(r.start_time.utcoffset() == dt.timedelta(0) for r in listed)
