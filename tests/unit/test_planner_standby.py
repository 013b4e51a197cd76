"""Backups taken on a standby: the preflight's rules and the plan's shape (pure)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from pgsnap import errors
from pgsnap.model import LSN, ServerFacts, StandbyStatus
from pgsnap.plan import Plan
from pgsnap.planner.backup import (
    DEFAULT_MAX_STANDBY_LAG,
    BackupRequest,
    Severity,
    archiving_status,
    plan_backup,
    preflight,
)
from pgsnap.protocols import Capability
from tests.unit.test_planner_backup import ARCHIVER, SERVER, codes, facts

MIB = 1024 * 1024
STREAMING = StandbyStatus(
    receiver="streaming",
    sender="db1:5432",
    receive_lsn="0/9000000",
    replay_lsn="0/8F00000",
    full_page_writes=True,
)
STANDBY = attrs.evolve(
    SERVER,
    in_recovery=True,
    current_lsn=None,
    standby=STREAMING,
    settings={**SERVER.settings, "archive_mode": "on"},
)
PRIMARY = attrs.evolve(SERVER, current_lsn="0/9000100")
# A standby with archive_mode = on archives nothing itself.
QUIET = attrs.evolve(ARCHIVER, archived_count=0, last_archived_wal=None, last_archived_time=None)


def standby_facts(**kw: Any) -> Any:
    base: dict[str, Any] = dict(
        server=STANDBY, archiver=QUIET, primary=PRIMARY, primary_archiver=ARCHIVER
    )
    base.update(kw)
    return facts(**base)


def test_a_healthy_standby_with_its_primary_is_backed_up_there_and_switches_wal_on_the_primary():
    f = standby_facts()
    assert codes(preflight(f)) == []
    assert codes(preflight(f), Severity.WARNING) == []
    plan = plan_backup(f, BackupRequest("b1", "nightly"))
    ids = [s.id for s in plan.steps]
    assert ids == [
        "backup-start",
        "record-start",
        "snapshot",
        "backup-stop",
        "record-stop",
        "primary-switch-wal",
        "wait-wal",
        "done",
    ]
    assert plan.step("primary-switch-wal").action == "db.primary_switch_wal"
    assert "no .backup file" in plan.step("wait-wal").description
    assert "a standby on db1" in plan.summary["taken on"]
    assert any("backup's I/O is on the standby" in k for k in plan.kept)
    assert Plan.from_json(plan.to_json()) == plan


def test_without_its_primary_the_standby_waits_for_the_segment_and_the_plan_says_so():
    f = standby_facts(primary=None, primary_archiver=None)
    assert codes(preflight(f)) == []
    assert codes(preflight(f), Severity.WARNING) == ["standby_wal"]
    plan = plan_backup(f, BackupRequest("b1", "nightly"))
    assert "primary-switch-wal" not in [s.id for s in plan.steps]
    assert "the primary completes that segment in its own time" in plan.step("wait-wal").description
    assert any("standby_wal" in w for w in plan.warnings)
    # Archiving is the primary's: it cannot be judged, so it is not judged on the standby.
    assert archiving_status(f) is None


def test_a_standby_that_archives_itself_is_judged_on_its_own_archiver():
    always = attrs.evolve(STANDBY, settings={**STANDBY.settings, "archive_mode": "always"})
    f = standby_facts(server=always, archiver=ARCHIVER, primary=None, primary_archiver=None)
    assert archiving_status(f) is ARCHIVER
    assert "standby_wal" not in codes(preflight(f), Severity.WARNING)
    failing = attrs.evolve(ARCHIVER, failed_count=3, last_failed_time=ARCHIVER.last_archived_time)
    assert "archiving" in codes(preflight(standby_facts(server=always, archiver=failing)))


def test_the_primarys_failing_archiver_blocks_a_standby_backup():
    failing = attrs.evolve(ARCHIVER, failed_count=3, last_failed_time=ARCHIVER.last_archived_time)
    found = [f for f in preflight(standby_facts(primary_archiver=failing)) if f.code == "archiving"]
    assert found and found[0].severity is Severity.ERROR
    assert found[0].message.startswith("the primary: ")


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (attrs.evolve(STREAMING, receiver=None), "no WAL receiver runs"),
        (attrs.evolve(STREAMING, receiver="waiting"), "its WAL receiver is waiting"),
        (attrs.evolve(STREAMING, receiver=""), "pg_read_all_stats"),
    ],
)
def test_a_standby_that_does_not_stream_is_refused(status: StandbyStatus, words: str) -> None:
    f = standby_facts(server=attrs.evolve(STANDBY, standby=status))
    found = [x for x in preflight(f) if x.code == "standby_streaming"]
    assert found and found[0].severity is Severity.ERROR and words in found[0].message
    with pytest.raises(errors.PreflightError):
        plan_backup(f, BackupRequest("b", "b"))


def test_lag_is_measured_against_the_primary_when_reached_else_against_what_was_received():
    # 1 MiB behind what it received, 300 MiB behind the primary.
    far = attrs.evolve(PRIMARY, current_lsn=LSN(LSN.parse("0/8F00000").value + 300 * MIB))
    found = [x for x in preflight(standby_facts(primary=far)) if x.code == "standby_lag"]
    assert found and "300.0 MiB behind the primary's position" in found[0].message
    assert "standby_lag" not in codes(
        preflight(standby_facts(primary=far), max_standby_lag=400 * MIB)
    )
    alone = standby_facts(primary=None, primary_archiver=None)
    assert "standby_lag" not in codes(preflight(alone))
    assert "standby_lag" in codes(preflight(alone, max_standby_lag=MIB // 2))
    assert DEFAULT_MAX_STANDBY_LAG == 256 * MIB
    request = BackupRequest("b", "b", max_standby_lag=400 * MIB)
    assert plan_backup(standby_facts(primary=far), request).request["max_standby_lag"] == 400 * MIB


def test_full_page_writes_off_on_the_primary_is_refused_from_either_side():
    off = attrs.evolve(STANDBY, standby=attrs.evolve(STREAMING, full_page_writes=False))
    assert "full_page_writes" in codes(preflight(standby_facts(server=off)))
    primary_off = attrs.evolve(PRIMARY, settings={**PRIMARY.settings, "full_page_writes": "off"})
    assert "full_page_writes" in codes(preflight(standby_facts(primary=primary_off)))


@pytest.mark.parametrize(
    ("primary", "words"),
    [
        (attrs.evolve(PRIMARY, system_identifier="42"), "another cluster"),
        (attrs.evolve(PRIMARY, in_recovery=True, current_lsn=None), "itself in recovery"),
    ],
)
def test_a_primary_that_is_not_this_standbys_is_refused(primary: ServerFacts, words: str) -> None:
    found = [x for x in preflight(standby_facts(primary=primary)) if x.code == "primary"]
    assert found and found[0].severity is Severity.ERROR and words in found[0].message


def test_an_unreachable_primary_is_a_warning_and_the_plan_waits_instead_of_switching():
    f = standby_facts(primary=None, primary_archiver=None, primary_error="connection refused")
    warnings = [x for x in preflight(f) if x.code == "primary"]
    assert warnings and warnings[0].severity is Severity.WARNING
    assert "connection refused" in warnings[0].message
    assert "primary-switch-wal" not in [s.id for s in plan_backup(f, BackupRequest("b", "b")).steps]


def test_after_a_failover_the_archive_is_compared_with_the_primarys_timeline():
    promoted = attrs.evolve(PRIMARY, timeline=2)
    assert "split_brain" not in codes(
        preflight(standby_facts(primary=promoted, archive_timelines=(1, 2)))
    )
    assert "split_brain" in codes(preflight(standby_facts(archive_timelines=(1, 2))))


def test_without_consistency_groups_the_data_volume_is_snapshotted_last_on_a_standby():
    apart = frozenset(Capability) - {Capability.CONSISTENCY_GROUPS}
    plan = plan_backup(standby_facts(capabilities=apart), BackupRequest("b", "b"))
    assert plan.step("snapshot").params["volume_ids"] == ["v-wal", "v-ts", "v-data"]
    assert "pg_control" in plan.step("snapshot").description
    primary_plan = plan_backup(facts(capabilities=apart), BackupRequest("b", "b"))
    assert primary_plan.step("snapshot").params["volume_ids"] == ["v-data", "v-wal", "v-ts"]


def test_the_catalog_keeps_where_a_backup_was_taken_and_older_records_read_as_primary():
    import json

    from pgsnap.model import BackupRecord, ServerRole, from_json, to_json
    from pgsnap.operations.catalog import required_wal_files
    from tests.unit.test_model import _record

    rec = _record(taken_on=ServerRole.STANDBY, taken_host="db2")
    assert from_json(BackupRecord, to_json(rec)) == rec
    old = json.loads(to_json(_record()))
    old.pop("taken_on"), old.pop("taken_host")
    assert from_json(BackupRecord, json.dumps(old)).taken_on is ServerRole.PRIMARY
    # A standby writes no .backup history file: the backup waits for its stop segment only.
    assert required_wal_files(rec) == ("000000010000000000000004", None)
    assert required_wal_files(_record())[1] == "000000010000000000000004.00000028.backup"


# --------------------------------------------------------------------------- seeding (pure)


def _seed_facts(**kw: Any) -> Any:
    from tests.unit.test_planner_recovery import B1, B2
    from tests.unit.test_planner_recovery import facts as recovery_facts

    return recovery_facts([B1, B2], **kw)


def _primary(current: str | None = "0/1500100", **kw: Any) -> ServerFacts:
    return attrs.evolve(SERVER, system_identifier="1", current_lsn=current, **kw)


def _request(**kw: Any) -> Any:
    from pgsnap.planner.standby import StandbyRequest

    base: dict[str, Any] = dict(name="replica-2", port=55432, primary_conninfo="host=db1")
    base.update(kw)
    return StandbyRequest(**base)


def test_a_seeded_standby_makes_its_slot_before_it_starts_and_waits_until_it_streams():
    from pgsnap.planner.standby import plan_seed_standby

    plan = plan_seed_standby(_seed_facts(), _request(), _primary(), "000000010000000000000013")
    ids = [s.id for s in plan.steps]
    assert ids[0] == "verify-wal" and ids[-1] == "mark-clone-ready"
    assert ids.index("write-clone-label") < ids.index("create-slot") < ids.index("start-clone")
    assert ids.index("configure-standby") < ids.index("start-clone") < ids.index("wait-standby")
    create = plan.step("create-slot")
    assert create.params["slot"] == "pgsnap_replica_2"
    assert create.compensation == "db.drop_slot"
    record = plan.step("record-clone")
    assert record.params["purpose"] == "standby" and record.params["slot"] == "pgsnap_replica_2"
    assert plan.summary["backup"].startswith("b2") and plan.kind == "standby"
    assert "outlive" in " ".join(plan.kept)
    assert Plan.from_json(plan.to_json()) == plan


def test_seeding_is_refused_when_archive_and_pg_wal_do_not_meet():
    from pgsnap.planner.standby import plan_seed_standby

    # The archive holds segments 1..20; the primary keeps 23 onwards: 21 and 22 are
    # in neither place.
    with pytest.raises(errors.PlanningError, match="in neither") as info:
        plan_seed_standby(
            _seed_facts(), _request(), _primary("0/18000100"), "000000010000000000000017"
        )
    assert "take a new backup" in (info.value.hint or "")
    # Without pg_ls_waldir() only the primary's current segment counts.
    with pytest.raises(errors.PlanningError, match="could not be listed"):
        plan_seed_standby(_seed_facts(), _request(), _primary("0/1800100"), None)
    assert plan_seed_standby(_seed_facts(), _request(), _primary("0/1500100"), None)


def test_seeding_is_refused_for_a_primary_in_recovery_or_of_another_cluster():
    from pgsnap.planner.standby import plan_seed_standby

    with pytest.raises(errors.PlanningError, match="in recovery"):
        plan_seed_standby(_seed_facts(), _request(), _primary(None, in_recovery=True))
    with pytest.raises(errors.PlanningError, match="another cluster"):
        plan_seed_standby(
            _seed_facts(), _request(), attrs.evolve(_primary(), system_identifier="9")
        )


def test_a_standby_request_refuses_passwords_and_bad_slot_names():
    from pgsnap.planner.standby import StandbyRequest, default_slot

    with pytest.raises(errors.ConfigurationError, match="password") as info:
        _request(primary_conninfo="host=db1 password=s3cret")
    assert "s3cret" not in str(info.value) and ".pgpass" in (info.value.hint or "")
    with pytest.raises(errors.ConfigurationError, match="slot"):
        _request(slot="Bad-Name")
    with pytest.raises(errors.ConfigurationError, match="primary_conninfo"):
        _request(primary_conninfo=" ")
    assert default_slot("a-b") == "pgsnap_a_b"
    assert isinstance(_request(), StandbyRequest)


def test_destroying_a_seeded_standby_drops_its_slot_after_its_server_stops():
    from pgsnap.model import (
        CloneRecord,
        CloneState,
        CloneVolume,
        RecoveryAction,
        RecoveryTarget,
        VolumeRole,
    )
    from pgsnap.planner.standby import plan_standby_destroy
    from tests.unit.test_planner_recovery import T0

    record = CloneRecord(
        name="s1", backup_id="b1", target=RecoveryTarget.latest(), host="db1", at="/c",
        data_directory="/c/data", port=55432, socket_directory="/c",
        action=RecoveryAction.PAUSE, state=CloneState.READY, created_at=T0,
        created_by="me", plan_id="p", purpose="standby", slot="pgsnap_s1",
        volumes=[CloneVolume("vol-data", VolumeRole.DATA, "snap-1", "/c/data")],
    )  # fmt: skip
    plan = plan_standby_destroy(record)
    ids = [s.id for s in plan.steps]
    assert ids[:2] == ["stop-clone", "drop-slot"] and ids[-1] == "forget-clone"
    assert plan.kind == "standby-destroy"
    assert "pgsnap_s1" in plan.explain()
