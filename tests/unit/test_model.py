"""Records: LSN, layout, targets, backup records, JSON round trips."""

import datetime as dt
import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgsnap import errors
from pgsnap.model import (
    LSN,
    BackupRecord,
    BackupState,
    Layout,
    RecoveryAction,
    RecoverySettings,
    RecoveryTarget,
    TargetKind,
    Volume,
    VolumeRole,
    from_dict,
    from_json,
    to_dict,
    to_json,
)

UTC = dt.UTC


def test_lsn_parse_and_format():
    assert str(LSN.parse("16/B374D848")) == "16/B374D848"
    assert LSN.parse("16/b374d848") == LSN.parse("00000016/B374D848")
    assert LSN.parse("0/0000ABCD").value == 0xABCD  # PostgreSQL 19 pads the low half
    assert LSN.parse("1/0").value == 1 << 32


@pytest.mark.parametrize("text", ["", "16", "16/", "/1", "G/1", "1/123456789", "-1/0", "1/2/3"])
def test_lsn_malformed(text):
    with pytest.raises(errors.LSNError) as info:
        LSN.parse(text)
    assert isinstance(info.value, ValueError)
    assert "16/B374D848" in str(info.value)  # says what a good one looks like


@pytest.mark.parametrize("value", [-1, 1 << 64, True, 1.5])
def test_lsn_out_of_range(value):
    with pytest.raises(errors.LSNError):
        LSN(value)


def test_lsn_arithmetic_and_order():
    a = LSN.parse("0/3000000")
    assert a + 0x28 == LSN.parse("0/3000028")
    assert (a + 0x28) - a == 0x28
    assert a - 1 == LSN.parse("0/2FFFFFF")
    assert sorted([LSN(5), LSN(1), LSN(3)]) == [LSN(1), LSN(3), LSN(5)]
    with pytest.raises(errors.LSNError):
        _ = LSN(0) - 1


@given(st.integers(0, (1 << 64) - 1))
def test_lsn_text_round_trip(value):
    assert LSN.parse(str(LSN(value))).value == value


def test_target_time_needs_zone():
    with pytest.raises(errors.TargetError, match="no time zone"):
        RecoveryTarget.time(dt.datetime(2026, 1, 1, 12))
    with pytest.raises(errors.TargetError):
        RecoveryTarget.time("2026-01-01 12:00:00")
    t = RecoveryTarget.time("2026-01-01 12:00:00+02:00")
    assert t.value == dt.datetime(2026, 1, 1, 10, tzinfo=UTC)


def test_target_value_must_match_kind():
    with pytest.raises(errors.TargetError):
        RecoveryTarget(TargetKind.LSN, "0/1")  # a string, not an LSN
    with pytest.raises(errors.TargetError):
        RecoveryTarget(TargetKind.LATEST, 5)
    with pytest.raises(errors.TargetError):
        RecoveryTarget.name("x" * 64)
    with pytest.raises(errors.TargetError):
        RecoveryTarget.xid(1)


def test_recovery_settings_render_one_target():
    when = dt.datetime(2026, 11, 30, 12, 0, 1, 500, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    s = RecoverySettings(
        "cp '/a/%f' '%p'", RecoveryTarget.time(when, inclusive=False), action=RecoveryAction.PAUSE
    )
    params = s.parameters()
    assert params["recovery_target_time"] == "2026-11-30 11:00:01.000500+00"
    assert params["recovery_target_inclusive"] == "off"
    assert params["recovery_target_action"] == "pause"
    assert (
        sum(
            k.startswith("recovery_target")
            and k
            not in (
                "recovery_target_timeline",
                "recovery_target_action",
                "recovery_target_inclusive",
            )
            for k in params
        )
        == 1
    )
    assert "restore_command = 'cp ''/a/%f'' ''%p'''" in s.lines()
    assert (
        RecoverySettings("x", RecoveryTarget.immediate()).parameters()["recovery_target"]
        == "immediate"
    )
    assert (
        "recovery_target_inclusive"
        not in RecoverySettings("x", RecoveryTarget.name("rp")).parameters()
    )


def _layout():
    return Layout(
        [
            Volume("v1", "data", VolumeRole.DATA, "/pg/data"),
            Volume("v2", "wal", VolumeRole.WAL, "/pg/wal"),
            Volume("v3", "ts", VolumeRole.TABLESPACE, "/pg/ts", tablespace_oid=16384),
            Volume("v4", "archive", VolumeRole.ARCHIVE, "/archive"),
        ]
    )


def test_layout_rules():
    layout = _layout()
    assert layout.data.id == "v1" and layout.wal is not None and layout.wal.id == "v2"
    assert [v.id for v in layout.snapshotted] == ["v1", "v2", "v3"]
    with pytest.raises(errors.ConfigurationError, match="exactly one"):
        Layout([Volume("v2", "wal", VolumeRole.WAL, "/pg/wal")])
    with pytest.raises(errors.ConfigurationError, match="more than once"):
        Layout([Volume("v1", "d", VolumeRole.DATA, "/a"), Volume("v1", "w", VolumeRole.WAL, "/b")])
    with pytest.raises(errors.ConfigurationError, match="tablespace_oid"):
        Volume("v3", "ts", VolumeRole.TABLESPACE, "/pg/ts")
    with pytest.raises(errors.VolumeNotFound) as info:
        layout.get("nope")
    assert info.value.volume_id == "nope"


def _record(**kw):
    base = dict(
        id="20261130T000000000Z",
        label="nightly",
        state=BackupState.DONE,
        system_identifier="7300000000000000001",
        server_version=150018,
        wal_segment_size=16 << 20,
        layout=_layout(),
        start_lsn="0/4000028",
        start_timeline=1,
        start_time=dt.datetime(2026, 11, 30, 0, 0, 1, tzinfo=UTC),
        stop_lsn="0/4000100",
        stop_timeline=1,
        stop_time=dt.datetime(2026, 11, 30, 0, 0, 2, 123456, tzinfo=UTC),
        labelfile="START WAL LOCATION: 0/4000028 (file 000000010000000000000004)\nLABEL: x\n",
        spcmapfile="16384 /pg/ts\n",
        snapshot_group_id="cg-1",
        snapshots={"v2": "s2", "v1": "s1", "v3": "s3"},
        backup_mode_seconds=0.05,
    )
    base.update(kw)
    return BackupRecord(**base)


def test_backup_record_json_round_trip():
    rec = _record()
    text = to_json(rec)
    assert from_json(BackupRecord, text) == rec
    data = json.loads(text)
    assert data["format_version"] == "1.0"
    assert data["system_identifier"] == "7300000000000000001"  # text: no float precision loss
    assert data["start_lsn"] == "0/4000028"


def test_unknown_keys_ignored_and_major_version_refused():
    data = to_dict(_record())
    data["format_version"] = "1.7"
    data["added_in_1_7"] = {"anything": [1, 2]}
    assert from_dict(BackupRecord, data) == _record()
    data["format_version"] = "2.0"
    with pytest.raises(errors.FormatError, match="use the pgsnap version that wrote it"):
        from_dict(BackupRecord, data)
    with pytest.raises(errors.FormatError):
        from_json(BackupRecord, "[]")
    with pytest.raises(errors.FormatError):
        from_json(BackupRecord, "{not json")


def test_missing_field_and_wrong_type_are_format_errors():
    data = to_dict(_record())
    del data["start_lsn"]
    with pytest.raises(errors.FormatError, match="start_lsn"):
        from_dict(BackupRecord, data)
    data = to_dict(_record())
    data["server_version"] = "fifteen"
    with pytest.raises(errors.FormatError, match="server_version"):
        from_dict(BackupRecord, data)


@pytest.mark.parametrize(
    "target",
    [
        RecoveryTarget.latest(),
        RecoveryTarget.immediate(),
        RecoveryTarget.time(dt.datetime(2026, 1, 1, tzinfo=UTC), inclusive=False),
        RecoveryTarget.lsn("0/3000060"),
        RecoveryTarget.xid(735),
        RecoveryTarget.name("2026-01-01 00:00:00+00"),  # a name that looks like a time stays a name
    ],
)
def test_target_round_trip(target):
    assert from_json(RecoveryTarget, to_json(target)) == target


def test_naive_time_in_record_refused():
    with pytest.raises(errors.TimeError, match="no time zone"):
        _record(stop_time=dt.datetime(2026, 1, 1))


def test_every_time_is_stored_in_utc():
    cet = dt.timezone(dt.timedelta(hours=1))
    rec = _record(stop_time=dt.datetime(2026, 3, 29, 3, 30, tzinfo=cet))
    assert rec.stop_time == dt.datetime(2026, 3, 29, 2, 30, tzinfo=UTC)
    assert rec.stop_time.utcoffset() == dt.timedelta(0)
    target = RecoveryTarget.time("2026-03-29 03:30:00+01:00")
    assert target.value == dt.datetime(2026, 3, 29, 2, 30, tzinfo=UTC)
    assert isinstance(target.value, dt.datetime)
    assert target.value.tzinfo is UTC


def test_time_out_of_range_in_utc_is_a_typed_error():
    with pytest.raises(errors.TargetError, match="out of range"):
        RecoveryTarget.time("9999-12-31 23:59:59.999999-12:00")
    with pytest.raises(errors.TimeError, match="out of range"):
        _record(stop_time=dt.datetime.fromisoformat("9999-12-31 23:00:00-12:00"))


def test_records_pickle():
    rec = _record()
    assert pickle.loads(pickle.dumps(rec)) == rec


def test_settings_quoting_survives_backslashes_and_quotes():
    s = RecoverySettings(r"copy 'C:\wal\%f' '%p'", RecoveryTarget.latest())
    assert s.lines()[0] == r"restore_command = 'copy ''C:\\wal\\%f'' ''%p'''"


@pytest.mark.parametrize(
    ("volume_id", "name", "key"),
    [
        ("vol-0001", "pgdata", "vol-0001"),  # a plain id stays (mock, PowerFlex)
        ("/srv/pg/data", "data", "data"),  # btrfs: the path gives way to the name
        ("vg0/data", "data", "data"),  # LVM
        ("/srv/pg/data", "my data", "srv-pg-data"),  # no plain name: the id, made plain
    ],
)
def test_step_ids_name_volumes_by_a_plain_word(volume_id, name, key):
    from pgsnap.model import Volume, step_key

    assert step_key(volume_id, name) == key
    assert Volume(volume_id, name, VolumeRole.DATA, "/pg").step_key == key


def test_a_layout_whose_volumes_would_share_a_step_name_is_refused():
    from pgsnap.model import Layout, Volume

    with pytest.raises(errors.ConfigurationError, match="would both be named 'data'") as info:
        Layout(
            [
                Volume("/a/data", "data", VolumeRole.DATA, "/pg/data"),
                Volume("/b/data", "data", VolumeRole.WAL, "/pg/wal"),
            ]
        )
    assert "different names" in (info.value.hint or "")
