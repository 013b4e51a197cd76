"""DirectoryCatalog's ``.index``: a cache of the records, never trusted over the files.

Every test compares what a catalog with an index answers with what the record
files alone say (a fresh catalog object over a copy of the directory without
the index), after writes through pgsnap and changes made behind its back.
"""

import datetime as dt
import json
import shutil
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgsnap.catalog import DirectoryCatalog, MemoryCatalog, catalog_system_identifiers
from pgsnap.model import BackupRecord, BackupState, to_dict, to_json
from tests.unit.test_model import _record

UTC = dt.UTC


def _rec(i: int, **kw):
    start = dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(hours=i)
    return attrs.evolve(
        _record(id=f"b-{i:03d}", label=f"n{i}"),
        start_time=start,
        stop_time=start + dt.timedelta(seconds=5),
        **kw,
    )


def _id(record: BackupRecord | None) -> str | None:
    return None if record is None else record.id


def _from_files(path, tmp_path):
    """What the record files alone say: a copy of the directory without the index."""
    copy = tmp_path / "files-only"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy)
    (copy / ".index").unlink(missing_ok=True)
    return DirectoryCatalog(copy).list()


def test_put_appends_to_the_index_and_a_fresh_object_lists_from_it(tmp_path, monkeypatch):
    cat = DirectoryCatalog(tmp_path / "c")
    for i in range(5):
        cat.put(_rec(i))
    lines = (tmp_path / "c" / ".index").read_text().splitlines()
    assert json.loads(lines[0])["format"] == "pgsnap-catalog-index"
    assert len(lines) == 6
    assert oct((tmp_path / "c" / ".index").stat().st_mode & 0o777) == "0o600"

    def no_file_reads(self, backup_id):
        raise AssertionError(f"read {backup_id} from its file")

    monkeypatch.setattr(DirectoryCatalog, "get", no_file_reads)
    fresh = DirectoryCatalog(tmp_path / "c")
    assert [r.id for r in fresh.list()] == [f"b-{i:03d}" for i in range(5)]
    assert fresh.list() == tuple(_rec(i) for i in range(5))


def test_a_record_changed_behind_pgsnaps_back_is_read_from_its_file(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    cat.list()
    edited = attrs.evolve(_rec(1), state=BackupState.FAILED, failure_reason="by hand")
    (path / "b-001.json").write_text(to_json(edited))  # same name, new content
    assert cat.get("b-001") == edited
    assert DirectoryCatalog(path).list()[1] == edited
    assert cat.list()[1] == edited  # this object's memory is checked too
    assert cat.list() == _from_files(path, tmp_path)


def test_records_added_or_removed_by_hand(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    (path / "b-000.json").unlink()
    (path / "b-009.json").write_text(to_json(_rec(9)))
    assert [r.id for r in DirectoryCatalog(path).list()] == ["b-001", "b-002", "b-009"]
    assert [r.id for r in cat.list()] == ["b-001", "b-002", "b-009"]


def test_missing_damaged_or_foreign_index_is_rebuilt(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(4):
        cat.put(_rec(i))
    expected = cat.list()
    index = path / ".index"

    index.unlink()
    assert DirectoryCatalog(path).list() == expected
    assert index.exists()  # rebuilt by the listing

    with index.open("ab") as fh:
        fh.write(b'["put","b-003",[1,2')  # a write cut short
    assert DirectoryCatalog(path).list() == expected

    text = index.read_text().splitlines()
    text[2] = "not json at all"
    index.write_text("\n".join(text) + "\n")
    assert DirectoryCatalog(path).list() == expected

    header = json.loads(text[0])
    header["fields"] = ["id", "something", "else"]
    index.write_text(json.dumps(header) + "\n")
    assert DirectoryCatalog(path).list() == expected
    assert json.loads(index.read_text().splitlines()[0])["fields"] != ["id", "something", "else"]


def test_a_damaged_index_entry_is_read_from_its_file(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    cat.put(_rec(0))
    lines = (path / ".index").read_text().splitlines()
    head, lazy = lines[1].split("\t")
    entry = json.loads(head)
    entry[4][entry[4].index("0/4000028")] = "not an LSN"  # valid JSON, a bad value
    (path / ".index").write_text(lines[0] + "\n" + json.dumps(entry) + "\t" + lazy + "\n")
    fresh = DirectoryCatalog(path)
    assert fresh.scan().unreadable == ()
    assert fresh.list() == (_rec(0),)


def _spoilt(entry: list[Any], how: str) -> Any:
    if how == "not a list":
        return {"put": entry}
    if how == "too short":
        return entry[:4]
    if how == "id not text":
        return [entry[0], 7, *entry[2:]]
    if how in ("identity of two", "identity of text", "identity of booleans"):
        ident = {
            "identity of two": entry[2][:2],
            "identity of text": [str(v) for v in entry[2]],
            "identity of booleans": [True, True, True],
        }[how]
        return [*entry[:2], ident, *entry[3:]]
    if how == "crc of other values":
        return [*entry[:3], entry[3] ^ 1, entry[4]]
    if how == "values not a list":
        return [*entry[:4], {"values": entry[4]}]
    if how == "a value short":
        return [*entry[:4], entry[4][:-1]]
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "not a list",
        "too short",
        "id not text",
        "identity of two",
        "identity of text",
        "identity of booleans",
        "crc of other values",
        "values not a list",
        "a value short",
    ],
)
def test_an_entry_of_another_shape_is_skipped_and_its_record_read_from_its_file(
    tmp_path, monkeypatch, how
):
    path = tmp_path / "c"
    DirectoryCatalog(path).put(_rec(0))
    lines = (path / ".index").read_text().splitlines()
    head, lazy = lines[1].split("\t")
    spoilt = json.dumps(_spoilt(json.loads(head), how))
    (path / ".index").write_text(lines[0] + "\n" + spoilt + "\t" + lazy + "\n")
    read: list[str] = []
    get = DirectoryCatalog.get

    def reading(self: DirectoryCatalog, backup_id: str) -> BackupRecord:
        read.append(backup_id)
        return get(self, backup_id)

    monkeypatch.setattr(DirectoryCatalog, "get", reading)
    fresh = DirectoryCatalog(path)
    assert fresh.list() == (_rec(0),)
    assert read == ["b-000"]  # from its file, not from the entry
    assert fresh.scan().unreadable == ()


def test_an_entry_whose_lazy_values_changed_is_read_from_its_file(tmp_path, monkeypatch):
    """The fields decoded when first read (the layout, the label...) are checked against
    the CRC of what pgsnap wrote when the index is read: an entry whose lazy values
    changed is not used, so a listed record's fields always decode."""
    path = tmp_path / "c"
    DirectoryCatalog(path).put(_rec(0))
    lines = (path / ".index").read_text().splitlines()
    head, lazy = lines[1].split("\t")
    assert "START WAL LOCATION" in lazy and "START WAL LOCATION" not in head
    damaged = lazy.replace("START WAL", "START LAW")  # still JSON, not what was written
    (path / ".index").write_text(lines[0] + "\n" + head + "\t" + damaged + "\n")
    read: list[str] = []
    real = DirectoryCatalog.get

    def counted(self, backup_id):
        read.append(backup_id)
        return real(self, backup_id)

    monkeypatch.setattr(DirectoryCatalog, "get", counted)
    (record,) = DirectoryCatalog(path).list()
    assert read == ["b-000"]  # from its file
    assert record.labelfile == _rec(0).labelfile


def test_a_listed_record_decodes_its_large_fields_when_first_read(tmp_path):
    """Issue 27: a record listed from the index parses its layout, label and snapshots
    only when they are read, and is the record in every other way: equal to (and
    hashed as: not at all, as it holds a mapping) the checked decoding, shown and encoded as a BackupRecord, copied and
    pickled whole, made whole by attrs.evolve."""
    import copy
    import pickle

    from pgsnap.catalog import _LAZY_FIELDS

    path = tmp_path / "c"
    DirectoryCatalog(path).put(_rec(0))
    (listed,) = DirectoryCatalog(path).list()
    checked = _rec(0)
    assert type(listed) is not BackupRecord and isinstance(listed, BackupRecord)
    assert listed.is_usable and listed.start_lsn == checked.start_lsn  # eager fields
    with pytest.raises(AttributeError):
        object.__getattribute__(listed, "layout")  # not decoded yet
    assert listed == checked and checked == listed
    assert (listed != checked) is False and (checked != listed) is False
    assert listed != attrs.evolve(checked, label="other")
    for name in _LAZY_FIELDS:
        assert getattr(listed, name) == getattr(checked, name)
    assert repr(listed) == repr(checked)
    assert to_dict(listed) == to_dict(checked)
    for twin in (copy.copy(listed), copy.deepcopy(listed), pickle.loads(pickle.dumps(listed))):
        assert type(twin) is BackupRecord and twin == checked
    (fresh,) = DirectoryCatalog(path).list()
    evolved = attrs.evolve(fresh, label="other")
    assert evolved == attrs.evolve(checked, label="other")
    with pytest.raises(AttributeError):
        _ = fresh.no_such_field  # type: ignore[attr-defined]


def test_an_index_of_the_previous_version_is_read_then_rewritten(tmp_path, monkeypatch):
    """A catalog listed by a new pgsnap for the first time reads its records from the
    old index (not from ten thousand files), then writes the index anew."""
    from pgsnap.catalog import _FIELDS

    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    expected = _from_files(path, tmp_path)
    lines = [json.dumps({"format": "pgsnap-catalog-index", "version": 1, "fields": _FIELDS})]
    for name in sorted(path.glob("b-*.json")):
        st = name.stat()
        document = to_dict(DirectoryCatalog(path).get(name.stem))
        ident = [st.st_ino, st.st_size, st.st_mtime_ns]
        lines.append(json.dumps(["put", name.stem, ident, [document.get(f) for f in _FIELDS]]))
    (path / ".index").write_text("\n".join(lines) + "\n")

    def no_file_reads(self, backup_id):
        raise AssertionError(f"read {backup_id} from its file")

    monkeypatch.setattr(DirectoryCatalog, "get", no_file_reads)
    assert DirectoryCatalog(path).list() == expected
    assert json.loads((path / ".index").read_text().splitlines()[0])["version"] == 2
    assert DirectoryCatalog(path).list() == expected


def test_the_index_is_compacted_by_a_listing(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for round_ in range(12):
        for i in range(3):
            cat.put(_rec(i, label=f"round {round_}"))
    assert len((path / ".index").read_text().splitlines()) == 1 + 36
    assert DirectoryCatalog(path).list() == _from_files(path, tmp_path)
    assert len((path / ".index").read_text().splitlines()) == 1 + 3


def test_an_index_that_cannot_be_written_costs_only_speed(tmp_path):
    path = tmp_path / "c"
    (path / ".index").mkdir(parents=True)  # neither appended to nor replaced
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    cat.delete("b-001")
    assert [r.id for r in DirectoryCatalog(path).list()] == ["b-000", "b-002"]
    assert _id(DirectoryCatalog(path).newest()) == "b-002"
    assert (path / ".index").is_dir()


def test_newest_reads_one_record_and_follows_the_files(tmp_path, monkeypatch):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(6):
        cat.put(_rec(i, start_timeline=1 + i % 2, stop_timeline=1 + i % 2))
    cat.put(_rec(6, state=BackupState.FAILED, failure_reason="x"))
    assert _id(cat.newest()) == "b-005"
    assert _id(cat.newest(1)) == "b-004"
    assert _id(cat.newest(2)) == "b-005"
    assert cat.newest(3) is None

    decoded = []
    real = DirectoryCatalog._decode

    def counting(backup_id, where, text):
        decoded.append(backup_id)
        return real(backup_id, where, text)

    monkeypatch.setattr(DirectoryCatalog, "_decode", staticmethod(counting))
    assert _id(DirectoryCatalog(path).newest(1)) == "b-004"
    assert decoded == ["b-004"]

    # Changed behind pgsnap's back: the files win.
    (path / "b-004.json").write_text(
        to_json(_rec(4, start_timeline=1, stop_timeline=1, state=BackupState.FAILED))
    )
    assert _id(DirectoryCatalog(path).newest(1)) == "b-002"
    (path / "b-010.json").write_text(to_json(_rec(10, start_timeline=1, stop_timeline=1)))
    assert _id(DirectoryCatalog(path).newest(1)) == "b-010"


_ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete", "edit by hand", "remove by hand", "damage index"]),
        st.integers(0, 5),
        st.sampled_from(list(BackupState)),
    ),
    max_size=25,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_ops)
def test_the_index_never_changes_what_a_listing_says(tmp_path, ops):
    path = tmp_path / "prop"
    shutil.rmtree(path, ignore_errors=True)
    cat = DirectoryCatalog(path)
    for op, i, state in ops:
        rec = _rec(i, state=state, failure_reason="x" if state is BackupState.FAILED else None)
        rec = attrs.evolve(rec, system_identifier=f"73{i % 3:017d}")
        if op == "put":
            cat.put(rec)
        elif op == "delete" and (path / f"b-{i:03d}.json").exists():
            cat.delete(rec.id)
        elif op == "edit by hand":
            (path / f"b-{i:03d}.json").write_text(to_json(attrs.evolve(rec, label="by hand")))
        elif op == "remove by hand":
            (path / f"b-{i:03d}.json").unlink(missing_ok=True)
        elif op == "damage index" and (path / ".index").exists():
            raw = (path / ".index").read_bytes()
            (path / ".index").write_bytes(raw[: len(raw) * 2 // 3])
        expected = _from_files(path, tmp_path)
        assert cat.list() == expected
        assert DirectoryCatalog(path).list() == expected
        documents = [to_dict(r) for r in expected]
        for reader in (cat, DirectoryCatalog(path)):  # from memory, from the index
            assert [reader.document(r) for r in reader.list()] == documents
        # list --json's documents, from the index without building records, and its
        # text, kept beside the records while no file changes
        assert DirectoryCatalog(path).documents() == (documents, ())
        for _ in range(2):  # made (after a change), then read back
            assert DirectoryCatalog(path).documents_text() == (json.dumps(documents), ())
        done = [r for r in expected if r.is_usable]
        newest = DirectoryCatalog(path).newest()
        assert (newest.id if newest else None) == (done[-1].id if done else None)
        assert catalog_system_identifiers(DirectoryCatalog(path)) == {
            r.system_identifier for r in expected
        }


def test_delete_is_recorded_so_newest_needs_no_listing(tmp_path, monkeypatch):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    cat.delete("b-002")
    assert json.loads((path / ".index").read_text().splitlines()[-1]) == ["delete", "b-002"]

    def no_listing(self):
        raise AssertionError("newest() fell back to list()")

    monkeypatch.setattr(DirectoryCatalog, "list", no_listing)
    assert _id(DirectoryCatalog(path).newest()) == "b-001"


def test_system_identifiers_from_the_index_or_the_records(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    cat.put(_rec(0))
    cat.put(attrs.evolve(_rec(1), system_identifier="7300000000000000999"))
    assert cat.system_identifiers() == {"7300000000000000001", "7300000000000000999"}
    (path / "b-001.json").unlink()  # by hand: the index still names it
    assert cat.system_identifiers() == {"7300000000000000001"}
    mem = MemoryCatalog()
    mem.put(_rec(0))
    assert catalog_system_identifiers(mem) == {"7300000000000000001"}


def test_system_identifiers_in_constant_time_between_writes(tmp_path, monkeypatch):
    """Issue 27: a backup asks twice (its plan and the freshness check) which clusters
    the catalog holds; `.newest` keeps the answer with every pgsnap write, so at ten
    thousand records neither asks the index. A deletion, or a file added or removed by
    hand, makes the next answer come from the files again."""
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    cat.put(_rec(0))
    cat.put(attrs.evolve(_rec(1), system_identifier="7300000000000000999"))
    reads: list[int] = []
    real = DirectoryCatalog._read_index

    def counted(self):
        reads.append(1)
        return real(self)

    monkeypatch.setattr(DirectoryCatalog, "_read_index", counted)
    both = {"7300000000000000001", "7300000000000000999"}
    assert DirectoryCatalog(path).system_identifiers() == both
    assert reads == []
    cat.put(attrs.evolve(_rec(2), system_identifier="7300000000000000777"))
    assert DirectoryCatalog(path).system_identifiers() == both | {"7300000000000000777"}
    assert reads == []
    cat.delete("b-001")  # perhaps the last of its cluster: read from the files again
    assert DirectoryCatalog(path).system_identifiers() == {
        "7300000000000000001",
        "7300000000000000777",
    }
    assert reads != []
    reads.clear()
    assert DirectoryCatalog(path).system_identifiers() == {
        "7300000000000000001",
        "7300000000000000777",
    }
    assert reads == []  # known again
    (path / "b-002.json").unlink()  # by hand: the directory changed
    assert DirectoryCatalog(path).system_identifiers() == {"7300000000000000001"}


_maybe = st.none() | st.just(True)


@settings(max_examples=100, deadline=None)
@given(
    stop=_maybe,
    spcmap=_maybe,
    failure=_maybe,
    seconds=st.none() | st.floats(0, 1e6, allow_nan=False),
    orphaned=st.lists(st.text("abc", min_size=1, max_size=3), max_size=2),
    offset=st.integers(-12, 14),
    state=st.sampled_from(list(BackupState)),
)
def test_a_record_from_the_index_equals_the_checked_decoding(
    stop, spcmap, failure, seconds, orphaned, offset, state
):
    """The index's values are built into a record without re-running its validators
    (_from_index): it must be the very record the checked decoder makes, for every
    shape of record (optional fields absent or present, any UTC offset)."""
    from pgsnap.catalog import _FIELDS, _from_index
    from pgsnap.model import BackupRecord, from_dict, to_dict

    tz = dt.timezone(dt.timedelta(hours=offset))
    rec = attrs.evolve(
        _record(),
        state=state,
        start_time=dt.datetime(2026, 3, 1, 12, 0, tzinfo=tz),
        stop_lsn=None if stop is None else _record().stop_lsn,
        stop_timeline=None if stop is None else 1,
        stop_time=None if stop is None else dt.datetime(2026, 3, 1, 12, 5, tzinfo=tz),
        spcmapfile=None if spcmap is None else "16384 /ts\n",
        failure_reason=None if failure is None else "because",
        backup_mode_seconds=seconds,
        orphaned_snapshots=tuple(orphaned),
    )
    document = to_dict(rec)
    values = [document.get(name) for name in _FIELDS]
    fast = _from_index(json.loads(json.dumps(values)))
    assert fast == from_dict(BackupRecord, document) == rec
    assert repr(fast) == repr(rec)
    bad = list(values)
    bad[_FIELDS.index("start_lsn")] = "not an LSN"
    assert _from_index(bad) is None  # the caller then decodes it the checked way
    assert _from_index(values[:-1]) is None  # a value short


def test_records_from_the_index_share_a_layout_object_only_when_equal():
    """Records with the same layout share one (immutable) Layout; another layout, or a
    layout value written otherwise than pgsnap writes it, is decoded as the checked way
    does, and never mistaken for one seen before."""
    from pgsnap.catalog import _FIELDS, _from_index
    from pgsnap.model import Layout, Volume, VolumeRole, from_dict

    def values(rec):
        document = to_dict(rec)
        return json.loads(json.dumps([document.get(name) for name in _FIELDS]))

    data = Volume("v1", "data", VolumeRole.DATA, "/pg")
    wal = Volume("v2", "wal", VolumeRole.WAL, "/wal")
    one = attrs.evolve(_record(), layout=Layout((data, wal)))
    other = attrs.evolve(_record(), layout=Layout((data, attrs.evolve(wal, mount_point="/x"))))
    a, b, c = (_from_index(values(r)) for r in (one, one, other))
    assert a is not None and b is not None and c is not None
    assert a == b == one and c == other
    assert a.layout is b.layout and c.layout is not a.layout
    assert c.layout == other.layout != one.layout

    odd = values(one)
    where = _FIELDS.index("layout")
    odd[where] = {**odd[where], "unknown": 1}  # not how pgsnap writes a layout
    document = to_dict(one) | {"layout": odd[where]}
    assert _from_index(odd) == from_dict(BackupRecord, document)
    odd[where] = {"volumes": [[1, 2]]}  # a volume that is not an object: the checked way
    assert _from_index(odd) is None


@given(
    field=st.sampled_from(
        ["state", "start_lsn", "start_time", "stop_time", "layout", "copies", "taken_on"]
    ),
    value=st.sampled_from(
        [
            *("", "x", "0/0/0", "1/2", "2026-13-01", 7, [1], {"a": 1}, ["x"], []),
            *("2026-03-01T12:00:00", "2026-03-01T12:00:00+02:00", "done", "standby"),
        ]
    ),
)
def test_a_value_the_fast_path_cannot_convert_is_decoded_the_checked_way(field, value):
    """Whatever an index entry holds, the record built from it is either the one the
    checked decoder makes from the same values, or None (the caller then reads the
    record's file): never a record the checked decoder would refuse."""
    from pgsnap.catalog import _FIELDS, _from_index
    from pgsnap.errors import PgsnapError
    from pgsnap.model import from_dict

    document = to_dict(_record())
    values = json.loads(json.dumps([document.get(name) for name in _FIELDS]))
    values[_FIELDS.index(field)] = value
    fast = _from_index(values)
    try:
        checked = from_dict(BackupRecord, document | {field: value})
    except (PgsnapError, TypeError, ValueError):
        checked = None
    if fast is not None:
        assert fast == checked


def test_newest_in_constant_time_reads_one_file(tmp_path, monkeypatch):
    """Issue 9: the newest backup (per timeline) without parsing the index or listing:
    `.newest`, kept by every write, names it; one record file is read."""
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(8):
        cat.put(_rec(i, start_timeline=1 + i % 2, stop_timeline=1 + i % 2))
    cat.put(_rec(8, state=BackupState.FAILED, failure_reason="x"))

    def no_index(self):
        raise AssertionError("the index was read")

    monkeypatch.setattr(DirectoryCatalog, "_read_index", no_index)
    monkeypatch.setattr(DirectoryCatalog, "list", no_index)
    fresh = DirectoryCatalog(path)
    assert _id(fresh.newest()) == "b-007"
    assert _id(fresh.newest(1)) == "b-006"
    assert _id(fresh.newest(2)) == "b-007"
    assert fresh.newest(3) is None
    monkeypatch.undo()

    cat.delete("b-007")  # the newest goes: recomputed under the lock
    cat.put(_rec(5, state=BackupState.FAILED, failure_reason="x"))  # an older one fails
    monkeypatch.setattr(DirectoryCatalog, "_read_index", no_index)
    assert _id(DirectoryCatalog(path).newest()) == "b-006"
    assert _id(DirectoryCatalog(path).newest(2)) == "b-003"


def test_newest_sees_records_added_or_removed_behind_pgsnaps_back(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    (path / "b-009.json").write_text(to_json(_rec(9)))  # a new file: the directory changed
    assert _id(cat.newest()) == "b-009"
    (path / "b-009.json").unlink()
    assert _id(cat.newest()) == "b-002"
    (path / ".newest").write_text("{torn")
    assert _id(cat.newest()) == "b-002"
    assert json.loads((path / ".newest").read_text())["newest"]["*"][1] == "b-002"  # rewritten


def test_an_index_removed_under_a_long_lived_catalog_is_written_again(tmp_path):
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    cat.list()  # every record now in this object's memory
    (path / ".index").unlink()
    assert [r.id for r in cat.list()] == ["b-000", "b-001", "b-002"]
    assert len((path / ".index").read_text().splitlines()) == 1 + 3


def test_documents_report_unreadable_files_as_a_scan_does(tmp_path):
    """``documents()`` (``pgsnap list --json``) skips what :meth:`scan` skips and names
    the same unreadable entries: a damaged file, a file whose name is no backup id, a
    file edited by hand to a bad value while its index entry still says otherwise."""
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(4):
        cat.put(_rec(i))
    (path / "b-001.json").write_text("{not json")
    (path / "not a backup id.json").write_text(to_json(_rec(7)))
    text = (path / "b-002.json").read_text().replace("0/4000028", "not an LSN")
    (path / "b-002.json").write_text(text)
    scan = DirectoryCatalog(path).scan()
    docs, unreadable = DirectoryCatalog(path).documents()
    assert docs == [to_dict(r) for r in scan.records]
    assert [d["id"] for d in docs] == ["b-000", "b-003"]
    assert unreadable == scan.unreadable
    assert {u.backup_id for u in unreadable} == {"b-001", "b-002", "not a backup id"}


def test_the_documents_text_is_kept_until_a_file_changes(tmp_path, monkeypatch):
    """``pgsnap list --json`` at ten thousand backups: the text is read back while no
    record file was added, removed or changed, and made again (with the unreadable
    entries named again) when one was; a kept text cut short or of another format is
    not trusted."""
    path = tmp_path / "c"
    cat = DirectoryCatalog(path)
    for i in range(3):
        cat.put(_rec(i))
    (path / "b-009.json").write_text("{not json")
    made: list[int] = []
    real = DirectoryCatalog._documents

    def counted(self: DirectoryCatalog) -> Any:
        made.append(1)
        return real(self)

    monkeypatch.setattr(DirectoryCatalog, "_documents", counted)

    def listed() -> tuple[list[str], list[str]]:
        text, bad = DirectoryCatalog(path).documents_text()
        return [d["id"] for d in json.loads(text)], [u.backup_id for u in bad]

    assert listed() == (["b-000", "b-001", "b-002"], ["b-009"]) and len(made) == 1
    assert listed() == (["b-000", "b-001", "b-002"], ["b-009"]) and len(made) == 1
    cat.put(_rec(3))  # added
    assert listed()[0] == ["b-000", "b-001", "b-002", "b-003"] and len(made) == 2
    cat.delete("b-001")  # removed
    assert listed()[0] == ["b-000", "b-002", "b-003"] and len(made) == 3
    (path / "b-000.json").write_text(to_json(attrs.evolve(_rec(0), label="by hand")))
    text, _ = DirectoryCatalog(path).documents_text()  # changed by hand
    assert json.loads(text)[0]["label"] == "by hand" and len(made) == 4
    assert listed() and len(made) == 4
    kept = path / ".documents"
    kept.write_bytes(kept.read_bytes()[:-40])  # cut short
    assert listed()[0] == ["b-000", "b-002", "b-003"] and len(made) == 5
    lines = kept.read_text().splitlines(keepends=True)
    kept.write_text(lines[0].replace('"version": 1', '"version": 99') + "".join(lines[1:]))
    assert listed()[1] == ["b-009"] and len(made) == 6
