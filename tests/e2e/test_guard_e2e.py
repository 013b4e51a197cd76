"""Issue 19: pgsnap guards what may be the only copy of a database.

Each case was found by trying pgsnap as a new user would, and each lost data
or failed after the point of no return before this issue. Real PostgreSQL
(the system's 15), mock volumes; every recovery ends with which rows exist.

- an edited plan (a snapshot of another backup, another label, another
  volume, a mount point...) is refused before its first step, with nothing
  changed: a property test draws the edits;
- a restored data directory of another cluster is found before PostgreSQL
  starts, and the restores are undone;
- a truncated archived segment is a gap for planning and for ``check``, and
  the plan's first step finds one that appears after planning;
- a server that promotes but refuses pgsnap's connection fails the wait at
  once, and the recovery settings are removed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgsnap.errors import (
    DamagedSegmentError,
    ExecutionError,
    FormatError,
    InvalidPlanError,
    InvariantError,
    PgsnapError,
    ServerRefusedError,
    StalePlanError,
    WalGapError,
)
from pgsnap.executor import Event, EventKind
from pgsnap.model import LSN, BackupRecord, RecoveryTarget
from pgsnap.plan import Plan, Step
from pgsnap.wal import segment_name, segment_start
from pgsnap.wal.archive import DirectoryWalArchive

from .conftest import Env, backed_up, make_env

pytestmark = pytest.mark.postgres


def unchecked(data: dict[str, Any]) -> Plan:
    """The plan a caller builds in Python from edited data (no id to disagree with)."""
    return Plan(
        kind=data["kind"],
        steps=tuple(Step.from_dict(s) for s in data["steps"]),
        fingerprint=data["fingerprint"],
        summary=data.get("summary") or {},
        request=data.get("request") or {},
        kept=tuple(data.get("kept") or ()),
        lost=tuple(data.get("lost") or ()),
        warnings=tuple(data.get("warnings") or ()),
    )


def two_backups_then_lose_data(env: Env) -> tuple[BackupRecord, BackupRecord]:
    """Batch 1, backup, batch 2, backup, batch 3 (archived); crash; the data is gone."""
    first = backed_up(env)
    env.write(2)
    env.switch_wal()
    second = env.cluster.backup("e2e second")
    env.write(3)
    env.switch_wal()
    env.crash()
    env.lose_data()
    return first, second


def volume_digest(env: Env) -> dict[str, Any]:
    """What is on the data and WAL volumes (names, sizes, times) and on the storage."""
    out: dict[str, Any] = {}
    for directory in (env.server.data_dir, env.server.wal_dir):
        for root, dirs, files in os.walk(directory):
            dirs.sort()
            for name in sorted(files):
                st_ = os.lstat(os.path.join(root, name))
                out[os.path.join(root, name)] = (st_.st_size, st_.st_mtime_ns)
    out["snapshots"] = sorted(env.snapshot_ids())
    out["running"] = env.server.is_running()
    return out


# --------------------------------------------------------------------------- edited plans


def test_an_edited_plan_cannot_restore_another_backups_snapshot(e2e_env: Any) -> None:
    """Issue 19: pointing the restore at an older backup's snapshot (and removing the
    plan's id) made the recovery succeed with committed rows and a table gone."""
    env: Env = e2e_env()
    first, second = two_backups_then_lose_data(env)
    plan = env.cluster.plan_recovery()
    assert plan.summary["backup"].startswith(second.id)
    data = plan.to_dict()
    restore = next(s for s in data["steps"] if s["action"] == "storage.restore_volume")
    assert restore["params"]["backup_id"] == second.id
    restore["params"]["snapshot_id"] = first.snapshots[env.data_vol]
    with pytest.raises(FormatError, match='no "id"'):
        Plan.from_json(json.dumps({k: v for k, v in data.items() if k != "id"}))
    with pytest.raises(FormatError, match="does not match its id"):
        Plan.from_json(json.dumps(data))

    edited = unchecked(data)
    before = volume_digest(env)
    events: list[Event] = []
    with pytest.raises(InvariantError, match=r"is not backup .*'s snapshot of volume") as info:
        env.cluster.execute(edited, on_event=events.append)
    assert info.value.step_id == restore["id"]
    assert "make a new plan" in (info.value.hint or "")
    assert [e for e in events if e.kind is EventKind.STARTED] == []
    assert volume_digest(env) == before
    assert not [j for j in env.journals() if not j.startswith("backup-")]
    env.cluster.execute(plan)  # the plan as it was made still recovers everything
    assert env.batches() == env.expect(1, 2, 3)


@pytest.fixture(scope="module")
def edit_world(pg_bindir: Path) -> Iterator[dict[str, Any]]:
    """One cluster on simulated block devices (unmount, detach, restore, attach, mount),
    two backups, the data lost, and the recovery plan: the property test edits it."""
    from tests.conftest import PgServerFactory

    factory = PgServerFactory(pg_bindir)
    env = make_env(factory, block=True)
    try:
        first, second = two_backups_then_lose_data(env)
        plan = env.cluster.plan_recovery()
        yield {"env": env, "first": first, "second": second, "plan": plan}
    finally:
        env.backend.close()
        factory.cleanup(show_logs=False)


Edit = tuple[str, str, str, Any]
"""(action, where, parameter, new value)"""


def _edits(world: dict[str, Any]) -> list[Edit]:
    """(action, where, parameter, new value): every edit a hostile or careless hand
    could make to the storage and backup parameters of the plan."""
    env: Env = world["env"]
    first: BackupRecord = world["first"]
    second: BackupRecord = world["second"]
    data = world["plan"].to_dict()
    actions = {s["action"] for s in data["steps"]}
    assert {"host.unmount", "storage.detach", "storage.attach", "host.mount"} <= actions
    others = sorted(env.snapshot_ids() - {second.snapshots[env.data_vol]})
    points = [str(env.server.wal_dir), str(env.archive_dir), "/tmp/elsewhere"]
    sha = hashlib.sha256((first.labelfile or "").encode()).hexdigest()
    edits: list[Edit] = []
    edits += [("storage.restore_volume", "params", "snapshot_id", s) for s in others]
    edits += [("storage.restore_volume", "params", "snapshot_id", "snap-9999")]
    edits += [
        ("storage.restore_volume", "params", "volume_id", v)
        for v in (env.wal_vol, env.archive_vol, "vol-9999")
    ]
    edits += [("storage.restore_volume", "params", "backup_id", b) for b in (first.id, "nosuch")]
    edits += [
        (
            "storage.restore_volume",
            "compensation_params",
            "snapshot_id",
            first.snapshots[env.data_vol],
        )
    ]
    edits += [
        (
            "storage.restore_volume",
            "compensation_params",
            "snapshot_id",
            {"$ref": ["safety-snapshot", "snapshots", env.wal_vol]},
        )
    ]
    edits += [("db.write_backup_label", "params", "backup_id", b) for b in (first.id, "nosuch")]
    edits += [("db.write_backup_label", "params", "label_sha256", v) for v in (sha, "0" * 64)]
    edits += [("host.unmount", "params", "mount_point", p) for p in points]
    edits += [("host.mount", "params", "mount_point", p) for p in points]
    edits += [("host.mount", "params", "volume_id", env.wal_vol)]
    edits += [("storage.detach", "params", "host", "db-other")]
    edits += [("storage.attach", "params", "volume_id", env.wal_vol)]
    edits += [("storage.snapshot_group", "params", "volume_ids", v) for v in ([env.wal_vol], [])]
    edits += [("db.verify", "params", "min_replay_lsn", "0/1")]
    edits += [("db.write_backup_label", "drop", "", None)]
    edits += [("db.write_recovery_settings", "drop", "", None)]
    edits += [("storage.restore_volume", "drop", "", None)]
    return edits


def _apply(data: dict[str, Any], edit: Edit) -> bool:
    """Apply one edit to the first step of its action; False when it changes nothing."""
    action, where, param, value = edit
    for n, step in enumerate(data["steps"]):
        if step["action"] != action:
            continue
        if where == "drop":
            del data["steps"][n]
            return True
        if step[where].get(param) == value:
            return False
        step[where][param] = value
        return True
    return False


def _refused_unchanged(world: dict[str, Any], combo: Sequence[Edit]) -> bool:
    """Run the plan with ``combo`` applied: it must be refused before its first step
    with nothing changed. False when the edits change nothing or the plan is refused
    as it is built."""
    env: Env = world["env"]
    if "digest" not in world:  # what every refused run must leave as it found it
        world["digest"] = volume_digest(env)
        world["journals"] = sorted(env.journals())  # the backups' and copies' own
    data = world["plan"].to_dict()
    if not [e for e in combo if _apply(data, e)]:
        return False
    try:
        edited = unchecked(data)
    except InvalidPlanError:
        return False  # refused as it was built: nothing ran
    events: list[Event] = []
    with pytest.raises((InvariantError, StalePlanError, InvalidPlanError)) as refused:
        env.cluster.execute(edited, on_event=events.append)
    world.setdefault("refusals", set()).add(type(refused.value).__name__)
    assert [e.step_id for e in events if e.kind is EventKind.STARTED] == [], combo
    assert volume_digest(env) == world["digest"], combo
    assert sorted(env.journals()) == world["journals"], combo
    return True


def _place(edit: Edit) -> tuple[str, str, str]:
    return edit[0], edit[1], edit[2]


# The edit_world tests share one world (a module fixture: one per xdist worker) and the
# last checks what the others did: one group runs them on one worker, in this order.
EDITS_IN_ORDER = pytest.mark.xdist_group("guard-edits")


@EDITS_IN_ORDER
def test_every_edit_and_pair_of_edits_of_a_recovery_plan_is_refused_before_anything_changes(
    edit_world: dict[str, Any],
) -> None:
    """Whatever is edited among snapshot ids, volume ids, the backup, its label, mount
    points and the steps themselves, alone or two at a time, the run is refused before
    its first step and nothing changes on the volumes or the storage. (Every pair, not
    only a sample: a random sample found that dropping both the restore and the label
    step reached the point of no return.)"""
    edits = _edits(edit_world)
    combos: list[tuple[Edit, ...]] = [(e,) for e in edits] + [
        pair for pair in itertools.combinations(edits, 2) if _place(pair[0]) != _place(pair[1])
    ]
    # And every set of dropped steps, alone and with each other edit: dropping the
    # restore, the label and the recovery settings at once (a random draw of three)
    # made the plan look like a plain restart that cleans the live data directory.
    drops = [e for e in edits if e[1] == "drop"]
    others = [e for e in edits if e[1] != "drop"]
    for k in range(2, len(drops) + 1):
        for dropped in itertools.combinations(drops, k):
            combos += [dropped, *((*dropped, e) for e in others)]
    tried = sum(_refused_unchanged(edit_world, combo) for combo in combos)
    assert tried > len(edits)


@EDITS_IN_ORDER
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(choice=st.data())
def test_random_edits_of_a_recovery_plan_are_refused_before_anything_changes(
    edit_world: dict[str, Any], choice: st.DataObject
) -> None:
    """Three to five edits at once, drawn at random: refused before the first step, with
    nothing changed on the volumes or the storage."""
    if "edits" not in edit_world:
        edit_world["edits"] = _edits(edit_world)
    combo = choice.draw(
        st.lists(st.sampled_from(edit_world["edits"]), min_size=3, max_size=5, unique_by=_place),
        label="edits",
    )
    _refused_unchanged(edit_world, combo)


@EDITS_IN_ORDER
def test_the_unedited_plan_of_the_property_test_recovers(edit_world: dict[str, Any]) -> None:
    """The same plan, unedited, recovers every row (it ran after the edits were refused)."""
    env: Env = edit_world["env"]
    # The edits were refused by the steps' own checks, not only as stale plans.
    assert "InvariantError" in edit_world.get("refusals", set()), edit_world.get("refusals")
    env.cluster.execute(edit_world["plan"])
    assert env.batches() == env.expect(1, 2, 3)


@pytest.fixture(scope="module")
def copy_edit_world(pg_bindir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Issue 21: two backups copied off the array, the data lost and the newer backup's
    snapshots gone: the recovery plan restores its copy and the copy's WAL."""
    from tests.conftest import PgServerFactory

    factory = PgServerFactory(pg_bindir)
    env = make_env(factory, copy_target=tmp_path_factory.mktemp("copies"))
    try:
        first, second = two_backups_then_lose_data(env)
        first_copy = env.cluster.copy(first.id)
        env.cluster.copy(second.id)
        assert second.snapshot_group_id is not None
        env.backend.delete_snapshot_group(second.snapshot_group_id)
        plan = env.cluster.plan_recovery()
        yield {"env": env, "first": first, "second": second, "plan": plan, "copy": first_copy}
    finally:
        env.backend.close()
        factory.cleanup(show_logs=False)


def _copy_edits(world: dict[str, Any]) -> list[Edit]:
    """Every edit of the parameters that say what a restore from a copy writes where."""
    env: Env = world["env"]
    first: BackupRecord = world["first"]
    other = world["copy"]
    data = world["plan"].to_dict()
    actions = [s["action"] for s in data["steps"]]
    assert "copy.restore" in actions and "copy.restore_wal" in actions
    assert "storage.restore_volume" not in actions
    names = next(s for s in data["steps"] if s["action"] == "copy.restore_wal")["params"]["names"]
    dirs = [str(env.server.wal_dir), str(env.archive_dir), "/tmp/elsewhere"]
    sha = hashlib.sha256((first.labelfile or "").encode()).hexdigest()
    edits: list[Edit] = []
    edits += [("copy.restore", "params", "directory", d) for d in dirs]
    edits += [("copy.restore", "params", "volume_id", v) for v in (env.wal_vol, "vol-9999")]
    edits += [("copy.restore", "params", "copy_id", c) for c in (other.copy_id, "nosuch.1")]
    edits += [("copy.restore", "params", "backup_id", b) for b in (first.id, "nosuch")]
    edits += [
        ("copy.restore", "params", "manifest_digest", d) for d in (other.manifest_digest, "0" * 64)
    ]
    edits += [("copy.restore", "params", "tree", t) for t in ("pg_wal", "tablespace-1")]
    edits += [("copy.restore", "params", "target_dir", "/tmp/elsewhere")]
    edits += [("copy.restore_wal", "params", "directory", d) for d in dirs]
    edits += [("copy.restore_wal", "params", "names", [*names, "000000010000000000000099"])]
    edits += [("copy.restore_wal", "params", "copy_id", other.copy_id)]
    edits += [("copy.restore_wal", "params", "backup_id", first.id)]
    edits += [("copy.restore_wal", "params", "manifest_digest", other.manifest_digest)]
    edits += [("copy.restore_wal", "params", "data_tree", "pg_wal")]
    edits += [("db.write_backup_label", "params", "backup_id", first.id)]
    edits += [("db.write_backup_label", "params", "label_sha256", sha)]
    edits += [("copy.restore", "drop", "", None)]
    edits += [("db.prepare_data_directory", "drop", "", None)]
    edits += [("db.write_backup_label", "drop", "", None)]
    edits += [("db.write_recovery_settings", "drop", "", None)]
    return edits


def test_every_edit_of_a_restore_from_a_copy_is_refused_then_the_plan_recovers(
    copy_edit_world: dict[str, Any],
) -> None:
    """Each edit of where the copy's trees and WAL go, of which copy, manifest, backup
    or tree, every set of dropped steps and each dropped step with each other edit:
    refused before the first step with nothing changed. Then the unedited plan
    recovers every row the newer backup's copy and the archive hold."""
    edits = _copy_edits(copy_edit_world)
    drops = [e for e in edits if e[1] == "drop"]
    others = [e for e in edits if e[1] != "drop"]
    combos: list[tuple[Edit, ...]] = [(e,) for e in edits]
    for k in range(1, len(drops) + 1):
        for dropped in itertools.combinations(drops, k):
            combos += [dropped, *((*dropped, e) for e in others if k == 1)]
    tried = sum(_refused_unchanged(copy_edit_world, combo) for combo in combos)
    assert tried > len(edits)
    assert "InvariantError" in copy_edit_world["refusals"]
    env: Env = copy_edit_world["env"]
    result = env.cluster.execute(copy_edit_world["plan"])
    assert env.batches() == env.expect(1, 2, 3)
    step = next(s for s in copy_edit_world["plan"].steps if s.action == "copy.restore_wal")
    assert result.outputs[step.id]["written"] or result.outputs[step.id]["kept"]


def test_a_snapshot_of_another_cluster_is_found_before_the_point_of_no_return(
    e2e_env: Any, pg_server: Any
) -> None:
    """The catalog names the right snapshot, but the storage holds another cluster's
    data directory under it: the system identifier in the restored pg_control is
    checked before PostgreSQL starts, and the restore is undone."""
    env: Env = e2e_env()
    record = backed_up(env)
    env.write(2)
    env.switch_wal()
    env.crash()
    env.lose_data()
    stranger = pg_server(wal_segsize_mb=1)  # initdb only: another system identifier
    snap = record.snapshots[env.data_vol]
    copies = [p / "tree" for p in (env.server.base_dir / "snapshots").rglob(snap) if p.is_dir()]
    assert len(copies) == 1 and copies[0].is_dir(), copies
    shutil.rmtree(copies[0])
    shutil.copytree(stranger.data_dir, copies[0], symlinks=True)
    plan = env.cluster.plan_recovery()
    with pytest.raises(ExecutionError) as info:
        env.cluster.execute(plan)
    err = info.value
    assert isinstance(err.cause, InvariantError), err
    assert "system identifier" in str(err) and record.system_identifier in str(err)
    assert not err.past_point_of_no_return
    assert f"restore-{env.data_vol}" in err.compensated
    assert not env.server.is_running()
    assert list(env.server.data_dir.iterdir()) == []  # the (lost) state from before


# --------------------------------------------------------------------------- damaged WAL


def _next_segment(env: Env, after: str) -> str:
    tli = int(after[:8], 16)
    seg = 1024 * 1024
    segno = int(after[8:16], 16) * (0x100000000 // seg) + int(after[16:], 16)
    return segment_name(tli, segno + 1, seg)


def test_a_truncated_segment_is_a_gap_for_check_and_planning(e2e_env: Any) -> None:
    """Issue 19: a truncated copy under the next segment's name passed `check` and
    planning, then PostgreSQL stopped on it ('archive file has wrong size') after the
    point of no return with the server down. PostgreSQL reads ahead of a target (seen
    here: a target two segments before the damaged one fetched it), so every target
    is refused until the file is replaced or moved away."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    target = env.current_lsn()
    env.switch_wal()
    env.write(3)
    last = env.switch_wal()
    truncated = _next_segment(env, last)
    damaged = env.archive_dir / truncated
    damaged.write_bytes((env.archive_dir / last).read_bytes()[:8192])
    report = env.cluster.check()
    assert not report.ok
    found = [f for f in report.findings if f.code == "recovery"]
    assert found and truncated in found[0].message and "8192 bytes" in found[0].message
    env.crash()
    env.lose_data()
    at = segment_start(int(truncated[16:], 16), 1024 * 1024)
    for request in (RecoveryTarget.latest(), RecoveryTarget.lsn(target)):
        with pytest.raises(WalGapError, match=truncated) as info:
            env.cluster.plan_recovery(request)
        assert info.value.reachable_lsn == at
        assert info.value.details["damaged"] == {
            truncated: "8192 bytes, not a 1048576-byte segment (a truncated or partial copy)"
        }
    # Moved out of the archive (it never was a complete segment), the WAL ends there.
    damaged.rename(env.server.base_dir / truncated)
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.lsn(target)))
    assert env.batches() == env.expect(1, 2)


def test_a_segment_damaged_after_planning_stops_the_plan_at_its_first_step(
    e2e_env: Any,
) -> None:
    """The plan's first step verifies every segment the recovery replays; a segment
    damaged between planning and execution stops it with nothing changed (here the
    freshness check is skipped, as a caller's own executor might)."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    middle = env.switch_wal()
    env.write(3)
    env.switch_wal()
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery()
    assert plan.steps[0].action == "archive.verify_wal"
    path = env.archive_dir / middle
    good = path.read_bytes()
    foreign = bytearray(good)
    foreign[24:32] = (12345).to_bytes(8, "little")  # another cluster's system identifier
    path.write_bytes(bytes(foreign))
    executor = env.cluster.executor()
    executor.check_fresh = None
    before = volume_digest(env)
    with pytest.raises(ExecutionError) as info:
        executor.run(plan)
    assert isinstance(info.value.cause, DamagedSegmentError)
    assert info.value.step_id == "verify-wal" and middle in str(info.value)
    assert "another cluster" in str(info.value)
    assert volume_digest(env) == before
    path.write_bytes(good)
    env.cluster.execute(env.cluster.plan_recovery())
    assert env.batches() == env.expect(1, 2, 3)


# --------------------------------------------------------------------------- the wait


def test_a_server_that_promotes_but_refuses_pgsnap_fails_the_wait_at_once(
    e2e_env: Any,
) -> None:
    """Issue 19: with a restored pg_hba.conf that asks for a password pgsnap does not
    have, the wait lasted its whole timeout and said recovery 'may just be slow', and
    the recovery settings stayed behind."""
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    env.server.sql("ALTER ROLE postgres PASSWORD 'e2e-secret'")
    hba = env.server.data_dir / "pg_hba.conf"
    hba.write_text("local all all scram-sha-256\n")  # not reloaded: trust goes on for now
    env.cluster.backup("asks for a password when restored")
    env.write(2)
    env.switch_wal()
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(recovery_timeout=300)
    started = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        env.cluster.execute(plan)
    assert time.monotonic() - started < 60  # not the 300 s timeout
    err = info.value
    assert err.past_point_of_no_return and err.step_id == "wait-recovery"
    assert isinstance(err.cause, ServerRefusedError)
    assert err.cause.details["recovery_ended"] is True
    assert "promoted" in str(err) and "refuses pgsnap" in str(err)
    assert "password" in str(err) and "e2e-secret" not in str(err)
    assert "cleaned up: clear-recovery-settings" in str(err)
    data = env.server.data_dir
    assert not (data / "recovery.signal").exists()
    assert "recovery_target" not in (data / "postgresql.auto.conf").read_text()
    assert "restore_command" not in (data / "postgresql.auto.conf").read_text()
    with psycopg.connect(env.server.conninfo(), password="e2e-secret") as conn:
        rows = conn.execute("SELECT batch, count(*) FROM t GROUP BY 1 ORDER BY 1").fetchall()
        assert not conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]  # type: ignore[index]
    assert rows == [(1, 3), (2, 3)]


class _SlowArchive(DirectoryWalArchive):
    """The archive, with a restore_command that takes a while for each file."""

    def restore_command(self, *, gzip: bool | None = None) -> str:
        return "sleep 0.4; " + super().restore_command(gzip=gzip)


def test_the_recovery_wait_reports_progress(e2e_env: Any) -> None:
    """The wait is not silent: each WAL file restored and the replay position are
    progress events of the wait step (plain data for products, text for people)."""
    env: Env = e2e_env()
    backed_up(env)
    for batch in (2, 3, 4, 5):
        env.write(batch)
        env.switch_wal()
    env.crash()
    env.lose_data()
    env.cluster.archive = _SlowArchive(env.archive_dir)
    events: list[Event] = []
    env.cluster.execute(env.cluster.plan_recovery(), on_event=events.append)
    assert env.batches() == env.expect(1, 2, 3, 4, 5)
    progress = [e for e in events if e.kind is EventKind.PROGRESS and e.step_id == "wait-recovery"]
    assert progress, [str(e) for e in events]
    restored = [e.data["segments_restored"] for e in progress]
    assert restored == sorted(restored) and restored[-1] >= 3
    assert "WAL files restored from the archive" in str(progress[-1])
    assert all(
        isinstance(LSN.parse(e.data["replay_lsn"]), LSN)
        for e in progress
        if e.data.get("replay_lsn")
    )


def test_check_names_the_damaged_segment_and_the_server_that_refuses(
    e2e_env: Any,
) -> None:
    """`check` runs the recovery planner's analysis: a foreign segment after the newest
    backup is an error finding naming it, and a wrong password is not 'not running'."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    last = env.switch_wal()
    path = env.archive_dir / last
    data = bytearray(path.read_bytes())
    data[8:16] = (0).to_bytes(8, "little")  # the page address of another segment
    path.write_bytes(bytes(data))
    report = env.cluster.check()
    codes = {f.code: f for f in report.findings}
    assert "recovery" in codes and last in codes["recovery"].message
    assert "not that of its name" in codes["recovery"].message
    with pytest.raises(PgsnapError):
        env.cluster.plan_recovery()


def test_check_fails_where_a_backup_would_fail_on_the_storage(e2e_env: Any) -> None:
    """Issue 19: a PowerFlex password or certificate that does not work left `check` at
    exit 0 (a warning); the storage's refusal is an error, as a backup would fail."""
    from pgsnap.errors import AuthenticationError

    env: Env = e2e_env()
    backed_up(env)
    assert env.cluster.check().ok
    env.backend.inject_fault(
        "list_volumes",
        error=AuthenticationError("the gateway refused user admin", hint="check the password"),
        times=100,
    )
    report = env.cluster.check()
    assert not report.ok
    (finding,) = [f for f in report.findings if f.code == "storage"]
    assert finding.severity.value == "error"
    assert "refused user admin" in finding.message and "a backup would fail" in finding.message
    assert "check the password" in finding.message
    env.backend.clear_faults()
    assert env.cluster.check().ok


def test_every_command_has_its_call_recover_delete_and_resume(e2e_env: Any) -> None:
    """Issue 20: `pgsnap recover --yes`, `delete` and `resume --yes` are
    Cluster.recover, Cluster.delete and Cluster.resume, on a real server."""
    env: Env = e2e_env()
    first, _second = two_backups_then_lose_data(env)
    assert env.cluster.resume() == ()  # nothing interrupted
    events: list[Event] = []
    result = env.cluster.recover(on_event=events.append)
    assert result.plan.kind == "recovery" and not result.dry_run
    assert env.batches() == env.expect(1, 2, 3)
    assert any(e.kind is EventKind.FINISHED and e.step_id == "verify" for e in events)
    dry = env.cluster.delete(first.id, dry_run=True)
    assert dry.kind == "delete" and env.cluster.catalog.get(first.id).id == first.id
    env.cluster.delete(first.id)
    assert first.id not in [b.id for b in env.cluster.backups()]
