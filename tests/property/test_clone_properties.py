"""Property: no step of any clone plan writes to production (issue 22 §1).

For random histories (the recovery planner's scenarios: timelines, gaps, backups,
lost snapshots, volumes as directories or devices) and random clone requests, the
clone planner either refuses with a PlanningError or returns a plan in which:

- every step is a clone operation or the read-only WAL check (never a stop, restore,
  label or settings step of the cluster itself);
- every path a step writes (the clone's directory, its data directory, each clone
  volume) is apart from every volume of the layout and from the archive;
- every volume it copies is the chosen backup's snapshot of that volume, and every
  storage volume it makes is named after the clone, never a volume of the layout;
- the destroy plan of the clone it records touches only what the clone made.
"""

from __future__ import annotations

import posixpath
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from pgsnap import errors
from pgsnap.model import (
    CloneRecord,
    CloneState,
    CloneVolume,
    Location,
    RecoveryAction,
    RestoreProfile,
    decode_value,
)
from pgsnap.operations import default_operations
from pgsnap.planner.clone import CloneRequest, plan_clone, plan_clone_destroy
from pgsnap.planner.facts import VolumeFacts

from .test_planner_properties import PROPS, T0, scenarios

CLONE_OPS = {
    "archive.verify_wal",
    "catalog.record_clone",
    "catalog.mark_clone_ready",
    "catalog.forget_clone",
    "host.make_clone_directory",
    "host.remove_clone_directory",
    "storage.clone_snapshot",
    "storage.delete_clone",
    "storage.attach_clone",
    "storage.detach_clone",
    "host.mount_clone",
    "host.unmount_clone",
    "db.prepare_clone",
    "db.write_clone_label",
    "db.configure_clone",
    "db.start_clone",
    "db.stop_clone",
    "db.wait_clone",
    "db.clear_clone_recovery",
    "db.mask_clone",
}

PATH_KEYS = ("at", "data_directory")


def _apart(path: str, point: str) -> bool:
    a, b = posixpath.normpath(path), posixpath.normpath(point)
    return a != b and not a.startswith(b + "/") and not b.startswith(a + "/")


def _paths(params: dict[str, Any]) -> list[str]:
    out = [str(params[k]) for k in PATH_KEYS if k in params]
    vols = list(params.get("volumes", []))
    if "volume" in params:
        vols.append(params["volume"])
    out += [str(v["path"]) for v in vols]
    return out


def _check_plan(facts: Any, plan: Any, request: CloneRequest) -> None:
    places = [v.mount_point for v in facts.layout.volumes] + [facts.archive_location]
    layout_ids = {v.id for v in facts.layout.volumes}
    ops = default_operations()
    for step in plan.steps:
        assert step.action in CLONE_OPS, step.action
        assert step.compensation is None or step.compensation in CLONE_OPS
        ops.build(step.action, step.params, step_id=step.id)  # valid parameters
        for params in (step.params, step.compensation_params):
            for path in _paths(dict(params)):
                for point in places:
                    assert _apart(path, point), (step.id, path, point)
    (record,) = [s for s in plan.steps if s.action == "catalog.record_clone"]
    backup = next(b for b in facts.backups if b.id == record.params["backup_id"])
    for step in plan.steps:
        if step.action == "storage.clone_snapshot":
            vol = step.params["volume"]
            assert backup.snapshots[vol["origin"]] == vol["snapshot_id"]
            assert vol["snapshot_id"] not in layout_ids
            assert posixpath.normpath(vol["path"]).startswith(record.params["at"] + "/")
    # The destroy plan of what was recorded.
    volumes = decode_value(tuple[CloneVolume, ...], record.params["volumes"], "volumes")
    made = CloneRecord(
        name=request.name, backup_id=backup.id, target=request.target, host="db1",
        at=str(record.params["at"]), data_directory=str(record.params["data_directory"]),
        port=request.port, socket_directory=str(record.params["at"]),
        action=request.action, state=CloneState.CREATING, created_at=T0, created_by="t",
        plan_id="p", volumes=volumes,
    )  # fmt: skip
    for step in plan_clone_destroy(made).steps:
        assert step.action in CLONE_OPS
        for path in _paths(dict(step.params)):
            for point in places:
                assert _apart(path, point), (step.id, path, point)


@PROPS
@given(
    sc=scenarios(),
    name=st.sampled_from(["c1", "dev-2", "reporting"]),
    at=st.none() | st.sampled_from(["/clones/a", "/pg/clone", "/pg", "/pg/data/x", "/archive/c"]),
    action=st.sampled_from([RecoveryAction.PROMOTE, RecoveryAction.PAUSE]),
    directories=st.sampled_from([1, 1, 1, 0]),
)
def test_no_clone_plan_writes_to_production(
    sc: Any, name: str, at: str | None, action: RecoveryAction, directories: int
) -> None:
    facts = sc.facts
    if directories:  # mostly directory volumes (block devices are refused, so far)
        facts = attrs.evolve(
            facts,
            volume_facts=tuple(
                VolumeFacts(v.id, Location.directory(v.mount_point), RestoreProfile())
                for v in facts.layout.snapshotted
            ),
        )
    request = CloneRequest(
        name=name,
        port=55432,
        target=sc.request.target,
        timeline=sc.request.timeline,
        backup_id=sc.request.backup_id,
        action=action,
        at=at,
    )
    try:
        plan = plan_clone(facts, request)
    except errors.PlanningError:
        return
    _check_plan(facts, plan, request)
