"""DirectoryCatalog: atomic, private, locked; MemoryCatalog: same contract."""

import datetime as dt
import multiprocessing
import os
import stat

import attrs
import pytest

from pgsnap import errors
from pgsnap.catalog import DirectoryCatalog, MemoryCatalog, UnreadableEntry
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


def _corrupt(path, backup_id, **changes):
    """A record file whose fields are valid JSON but not a valid record (a bad LSN...)."""
    import json

    from pgsnap.model import to_dict

    doc = to_dict(_record(id=backup_id))
    doc.update(changes)
    (path / f"{backup_id}.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"start_lsn": "garbage"}, id="bad-lsn"),
        pytest.param({"state": "exploded"}, id="bad-state"),
        pytest.param({"start_time": "yesterday"}, id="bad-time"),
        pytest.param({"snapshots": 7}, id="bad-shape"),
    ],
)
def test_a_record_with_a_bad_field_is_unreadable_with_its_file_name(tmp_path, changes):
    # Valid JSON with one bad value used to escape as a bare LSNError ("malformed LSN
    # 'garbage'"), aborting list() and naming no file.
    cat = DirectoryCatalog(tmp_path / "cat")
    cat.put(_record(id="good"))
    _corrupt(tmp_path / "cat", "bad", **changes)
    with pytest.raises(errors.CatalogError, match="unreadable") as info:
        cat.get("bad")
    assert str(tmp_path / "cat" / "bad.json") in str(info.value)
    assert info.value.details["path"] == str(tmp_path / "cat" / "bad.json")
    assert [r.id for r in cat.list()] == ["good"]


def test_scan_lists_records_and_unreadable_entries_with_path_and_error(tmp_path, caplog):
    cat = DirectoryCatalog(tmp_path / "cat")
    cat.put(_record(id="good"))
    (tmp_path / "cat" / "truncated.json").write_text("{trunc")
    _corrupt(tmp_path / "cat", "bad-lsn", start_lsn="garbage")
    (tmp_path / "cat" / "notes.txt").write_text("not a record")  # not a catalog entry
    scan = cat.scan()
    assert [r.id for r in scan.records] == ["good"]
    assert [(u.path, u.backup_id) for u in scan.unreadable] == [
        (str(tmp_path / "cat" / "bad-lsn.json"), "bad-lsn"),
        (str(tmp_path / "cat" / "truncated.json"), "truncated"),
    ]
    assert "malformed LSN 'garbage'" in scan.unreadable[0].error
    assert "not valid JSON" in scan.unreadable[1].error
    assert str(scan.unreadable[0]).startswith(f"{tmp_path / 'cat' / 'bad-lsn.json'}: ")
    # scan() leaves the reporting to its caller; list() after it does not repeat it.
    assert "skipping catalog entry" not in caplog.text
    assert [r.id for r in cat.list()] == ["good"]
    assert "skipping catalog entry" not in caplog.text


def test_list_warns_once_per_unreadable_file(tmp_path, caplog):
    cat = DirectoryCatalog(tmp_path / "cat")
    (tmp_path / "cat" / "bad.json").write_text("{trunc")
    with caplog.at_level("WARNING", logger="pgsnap.catalog"):
        assert cat.list() == ()
        assert cat.list() == ()
    warnings = [r for r in caplog.records if "skipping catalog entry" in r.getMessage()]
    assert len(warnings) == 1
    assert str(tmp_path / "cat" / "bad.json") in warnings[0].getMessage()


def test_list_hands_unreadable_files_to_its_hook_once(tmp_path, caplog):
    found: list[UnreadableEntry] = []
    cat = DirectoryCatalog(tmp_path / "cat", on_unreadable=found.append)
    (tmp_path / "cat" / "bad.json").write_text("{trunc")
    cat.put(_record(id="good"))
    with caplog.at_level("WARNING", logger="pgsnap.catalog"):
        assert [r.id for r in cat.list()] == ["good"]
        assert [r.id for r in cat.list()] == ["good"]
    assert [(u.path, u.backup_id) for u in found] == [(str(tmp_path / "cat" / "bad.json"), "bad")]
    assert "not valid JSON" in found[0].error
    assert caplog.records == []  # the hook said it, not the log
    (tmp_path / "cat" / "bad.json").write_text("{trunc again")  # a new version: said again
    cat.list()
    assert len(found) == 2


def test_memory_catalog_scans_too():
    cat = MemoryCatalog()
    cat.put(_record(id="b-1"))
    scan = cat.scan()
    assert [r.id for r in scan.records] == ["b-1"]
    assert scan.unreadable == ()
