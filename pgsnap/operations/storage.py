"""Operations on the storage (through the :class:`~pgsnap.protocols.StorageBackend`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import attrs

from pgsnap.errors import SnapshotNotFound
from pgsnap.model import SnapshotGroup as SnapshotGroupRecord
from pgsnap.operations.base import JSONValue, Operation, OperationContext, Outputs, Ref, Resume
from pgsnap.operations.base import Target as _Target

__all__ = [
    "Attach",
    "DeleteSnapshotGroup",
    "DeleteSnapshots",
    "Detach",
    "PausePolicies",
    "RestoreVolume",
    "ResumePolicies",
    "SnapshotGroup",
    "WaitForRestore",
]

log = logging.getLogger(__name__)


def _ids(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _group_outputs(group: SnapshotGroupRecord) -> Outputs:
    return {
        "group_id": group.id,
        "snapshots": {s.volume_id: s.id for s in group.snapshots},
        "snapshot_ids": [s.id for s in group.snapshots],
    }


@attrs.frozen
class SnapshotGroup(Operation):
    """Snapshot volumes together (one consistency group where the storage can).

    After an interruption the group is looked for by its name (taken since
    the run started), so snapshots the storage made but the journal never
    heard of are adopted (and undone) rather than left behind.
    """

    name = "storage.snapshot_group"
    target = _Target.STORAGE
    compensation = "storage.delete_snapshot_group"
    resume = Resume.CHECK

    volume_ids: tuple[str, ...] = attrs.field(converter=_ids)
    group_name: str
    secure: bool = False

    def run(self, ctx: OperationContext) -> Outputs:
        group = ctx.backend.create_snapshot_group(
            list(self.volume_ids), self.group_name, secure=self.secure
        )
        return _group_outputs(group)

    def probe(self, ctx: OperationContext) -> Outputs | None:
        ids = {s.group_id for s in ctx.backend.list_snapshots() if s.group_id}
        for group_id in sorted(ids):
            group = ctx.backend.get_snapshot_group(group_id)
            if group.name == self.group_name and group.created_at >= ctx.run_started:
                log.warning("found snapshot group %s of the interrupted run", group.id)
                return _group_outputs(group)
        return None

    def created(self, outputs: Mapping[str, JSONValue]) -> tuple[str, ...]:
        return tuple(str(s) for s in outputs.get("snapshot_ids", ()))


@attrs.frozen
class DeleteSnapshotGroup(Operation):
    """Delete a snapshot group; one already gone is fine."""

    name = "storage.delete_snapshot_group"
    target = _Target.STORAGE

    group_id: str | Ref

    def run(self, ctx: OperationContext) -> Outputs:
        group_id = str(ctx.resolve(self.group_id))
        try:
            ctx.backend.delete_snapshot_group(group_id)
        except SnapshotNotFound:
            log.info("snapshot group %s was already gone", group_id)
            return {"deleted": False}
        return {"deleted": True}


@attrs.frozen
class DeleteSnapshots(Operation):
    """Delete snapshots one by one (a failed backup's leftovers); ones already gone
    are fine."""

    name = "storage.delete_snapshots"
    target = _Target.STORAGE

    snapshot_ids: tuple[str, ...] = attrs.field(converter=_ids)

    def run(self, ctx: OperationContext) -> Outputs:
        deleted = []
        for snapshot_id in self.snapshot_ids:
            try:
                ctx.backend.delete_snapshot(snapshot_id)
            except SnapshotNotFound:
                log.info("snapshot %s was already gone", snapshot_id)
                continue
            deleted.append(snapshot_id)
        return {"deleted": deleted}


@attrs.frozen
class RestoreVolume(Operation):
    """Replace a volume's content with a snapshot's."""

    name = "storage.restore_volume"
    target = _Target.STORAGE
    compensation = "storage.restore_volume"

    volume_id: str
    snapshot_id: str | Ref

    def run(self, ctx: OperationContext) -> Outputs:
        snapshot_id = str(ctx.resolve(self.snapshot_id))
        ctx.backend.restore_volume(self.volume_id, snapshot_id)
        return {"volume_id": self.volume_id, "snapshot_id": snapshot_id}


@attrs.frozen
class WaitForRestore(Operation):
    """Wait until a restore the storage completes later has completed."""

    name = "storage.wait_for_restore"
    target = _Target.STORAGE

    volume_id: str
    timeout: float = 3600.0

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.backend.wait_for_restore(self.volume_id, timeout=self.timeout)
        return {}


@attrs.frozen
class Attach(Operation):
    """Attach (map) a volume to the database host."""

    name = "storage.attach"
    target = _Target.STORAGE
    compensation = "storage.detach"

    volume_id: str
    host: str

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.backend.attach(self.volume_id, self.host)
        return {}


@attrs.frozen
class Detach(Operation):
    """Detach (unmap) a volume from the database host."""

    name = "storage.detach"
    target = _Target.STORAGE
    compensation = "storage.attach"

    volume_id: str
    host: str

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.backend.detach(self.volume_id, self.host)
        return {}


@attrs.frozen
class PausePolicies(Operation):
    """Pause snapshot policies, so they do not rotate good snapshots out."""

    name = "storage.pause_policies"
    target = _Target.STORAGE
    compensation = "storage.resume_policies"

    policy_ids: tuple[str, ...] = attrs.field(converter=_ids)

    def run(self, ctx: OperationContext) -> Outputs:
        for pid in self.policy_ids:
            ctx.backend.pause_policy(pid)
        return {}


@attrs.frozen
class ResumePolicies(Operation):
    """Let paused snapshot policies run again."""

    name = "storage.resume_policies"
    target = _Target.STORAGE

    policy_ids: tuple[str, ...] = attrs.field(converter=_ids)

    def run(self, ctx: OperationContext) -> Outputs:
        for pid in self.policy_ids:
            ctx.backend.resume_policy(pid)
        return {}
