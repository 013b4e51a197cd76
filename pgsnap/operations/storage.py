"""Operations on the storage (through the :class:`~pgsnap.protocols.StorageBackend`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import SnapshotNotFound
from pgsnap.model import SnapshotGroup as SnapshotGroupRecord
from pgsnap.model import VolumeRole
from pgsnap.operations.base import (
    JSONValue,
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Ref,
    Resume,
    renamed_operations,
)
from pgsnap.operations.base import Target as _Target
from pgsnap.operations.host import check_reading_host
from pgsnap.protocols import ExposableSnapshots

__all__ = [
    "AttachVolume",
    "ConcealSnapshot",
    "DeleteSnapshotGroup",
    "DeleteSnapshots",
    "DetachVolume",
    "ExposeSnapshot",
    "PausePolicies",
    "RestoreVolume",
    "ResumePolicies",
    "TakeSnapshotGroup",
    "WaitForRestore",
]

log = logging.getLogger(__name__)


def _ids(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _check_volumes(
    op: Operation, ctx: OperationContext, volume_ids: Iterable[str], what: str
) -> None:
    """Every volume id must be one of the layout's snapshotted volumes."""
    known = {v.id for v in ctx.layout.snapshotted}
    unknown = sorted(set(volume_ids) - known)
    if unknown:
        raise op.mismatch(
            ctx,
            f"{what} volume(s) {', '.join(unknown)}, which the cluster's layout does not "
            f"hold (its volumes: {', '.join(sorted(known)) or 'none'})",
            "the plan was edited or made for another cluster: make a new plan",
        )


def _group_outputs(group: SnapshotGroupRecord) -> Outputs:
    return {
        "group_id": group.id,
        "snapshots": {s.volume_id: s.id for s in group.snapshots},
        "snapshot_ids": [s.id for s in group.snapshots],
    }


@frozen
class TakeSnapshotGroup(Operation):
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

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_volumes(self, ctx, self.volume_ids, "it snapshots")

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


@frozen
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


@frozen
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


@frozen
class RestoreVolume(Operation):
    """Replace a volume's content with a snapshot's: a backup's, or the safety snapshot
    this run took (as the compensation that puts the volume back).

    ``backup_id`` names the backup the snapshot belongs to; the step then
    checks, before the run changes anything and again just before it
    restores, that the catalog records ``snapshot_id`` as that backup's
    snapshot of ``volume_id``, that the storage has it as a snapshot of that
    volume, and that the plan writes that backup's label. Without a backup,
    ``snapshot_id`` must be the output of a snapshot step of this run that
    took that volume: a restore from any other snapshot is refused.
    """

    name = "storage.restore_volume"
    target = _Target.STORAGE
    compensation = "storage.restore_volume"

    volume_id: str
    snapshot_id: str | Ref
    backup_id: str | None = None

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_volumes(self, ctx, [self.volume_id], "it restores")
        if self.backup_id is None:
            self._check_own_snapshot(ctx, plan)
            return
        # A restore an interrupted run began may have consumed its snapshot already
        # (an LVM merge): only the catalog is asked then.
        self._check_backup_snapshot(
            ctx, str(self.snapshot_id), on_storage=ctx.step_id not in plan.started
        )
        self.check_writes_label(ctx, plan, self.backup_id)

    def restores(self) -> tuple[str, str | None]:
        """The volume, and the backup whose snapshot it gets (None: a safety snapshot)."""
        return (self.volume_id, self.backup_id)

    def _check_own_snapshot(self, ctx: OperationContext, plan: PlanView) -> None:
        ref = self.snapshot_id
        taken = None
        if isinstance(ref, Ref) and len(ref.path) == 3 and ref.path[1] == "snapshots":
            try:
                taken = plan.operation(ref.step)
            except KeyError:
                taken = None
        if (
            not isinstance(ref, Ref)
            or not isinstance(taken, TakeSnapshotGroup)
            or ref.path[2] != self.volume_id
            or self.volume_id not in taken.volume_ids
        ):
            raise self.mismatch(
                ctx,
                f"it restores volume {self.volume_id} from {ref}, which is neither a "
                "backup's snapshot nor a snapshot this run takes of that volume",
                "a restore names its backup (backup_id) or refers to this run's safety "
                "snapshot of the same volume: make a new plan",
            )

    def _check_backup_snapshot(
        self, ctx: OperationContext, snapshot_id: str, *, on_storage: bool = True
    ) -> None:
        """The catalog records ``snapshot_id`` as the backup's snapshot of the volume
        (and, ``on_storage``, the storage has it as a snapshot of that volume, in the
        backup's group)."""
        assert self.backup_id is not None
        record = self.backup_record(ctx, self.backup_id)
        recorded = record.snapshots.get(self.volume_id)
        if recorded != snapshot_id:
            raise self.mismatch(
                ctx,
                f"snapshot {snapshot_id} is not backup {self.backup_id}'s snapshot of volume "
                f"{self.volume_id} (the catalog records "
                f"{recorded or 'none for that volume'})",
                "the plan was edited or the catalog changed: make a new plan",
            )
        if not on_storage:
            return
        found = [s for s in ctx.backend.list_snapshots(self.volume_id) if s.id == snapshot_id]
        if not found:
            raise self.mismatch(
                ctx,
                f"the storage has no snapshot {snapshot_id} of volume {self.volume_id} "
                f"(backup {self.backup_id}'s)",
                "the snapshot was deleted: make a new plan (another backup will be chosen)",
            )
        group = found[0].group_id
        if record.snapshot_group_id and group and group != record.snapshot_group_id:
            raise self.mismatch(
                ctx,
                f"snapshot {snapshot_id} is in group {group} on the storage, not in backup "
                f"{self.backup_id}'s group {record.snapshot_group_id}",
                "the storage or the catalog changed: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        snapshot_id = str(ctx.resolve(self.snapshot_id))
        if self.backup_id is not None:  # the catalog asked again at the last moment
            self._check_backup_snapshot(ctx, snapshot_id, on_storage=False)
        ctx.backend.restore_volume(self.volume_id, snapshot_id)
        out: Outputs = {"volume_id": self.volume_id, "snapshot_id": snapshot_id}
        if self.backup_id is not None:
            out["backup_id"] = self.backup_id
        return out


@frozen
class WaitForRestore(Operation):
    """Wait until a restore the storage completes later has completed."""

    name = "storage.wait_for_restore"
    target = _Target.STORAGE

    volume_id: str
    timeout: float = 3600.0

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.backend.wait_for_restore(self.volume_id, timeout=self.timeout)
        return {}


def _check_host(op: Operation, ctx: OperationContext, volume_id: str, host: str) -> None:
    _check_volumes(op, ctx, [volume_id], "it maps")
    if host != ctx.host.name:
        raise op.mismatch(
            ctx,
            f"it maps volume {volume_id} to host {host!r}, but the database host is "
            f"{ctx.host.name!r}",
            "the plan was edited or made for another host: make a new plan",
        )


@frozen
class AttachVolume(Operation):
    """Attach (map) a volume to the database host."""

    name = "storage.attach"
    target = _Target.STORAGE
    compensation = "storage.detach"

    volume_id: str
    host: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_host(self, ctx, self.volume_id, self.host)

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.backend.attach(self.volume_id, self.host)
        return {}


@frozen
class DetachVolume(Operation):
    """Detach (unmap) a volume from the database host."""

    name = "storage.detach"
    target = _Target.STORAGE
    compensation = "storage.attach"

    volume_id: str
    host: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_host(self, ctx, self.volume_id, self.host)
        if plan.undo:
            return
        here = plan.index(ctx.step_id) if ctx.step_id else -1
        again = [
            sid
            for sid, op in plan.of(AttachVolume)
            if op.volume_id == self.volume_id and op.host == self.host and plan.index(sid) > here
        ]
        if not again:
            raise self.mismatch(
                ctx,
                f"it detaches volume {self.volume_id} from {self.host}, and no later step "
                "attaches it again: the host would be left without it",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.backend.detach(self.volume_id, self.host)
        return {}


@frozen
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


@frozen
class ResumePolicies(Operation):
    """Let paused snapshot policies run again."""

    name = "storage.resume_policies"
    target = _Target.STORAGE

    policy_ids: tuple[str, ...] = attrs.field(converter=_ids)

    def run(self, ctx: OperationContext) -> Outputs:
        for pid in self.policy_ids:
            ctx.backend.resume_policy(pid)
        return {}


# --------------------------------------------------------------------------- copies


def _check_copied_snapshot(
    op: Operation,
    ctx: OperationContext,
    backup_id: str,
    volume_id: str,
    snapshot_id: str,
    *,
    on_storage: bool,
) -> ExposableSnapshots:
    """``snapshot_id`` is, by the catalog (and, ``on_storage``, the storage), backup
    ``backup_id``'s snapshot of data or tablespace volume ``volume_id``, and no
    volume of the layout: the storage's exposing seam, or the mismatch."""
    vol = next((v for v in ctx.layout.volumes if v.id == volume_id), None)
    if vol is None or vol.role not in (VolumeRole.DATA, VolumeRole.TABLESPACE):
        raise op.mismatch(
            ctx,
            f"volume {volume_id} is not a data or tablespace volume of the cluster's layout",
            "the plan was edited or made for another cluster: make a new plan",
        )
    if snapshot_id in {v.id for v in ctx.layout.volumes}:
        raise op.mismatch(
            ctx,
            f"{snapshot_id} is a volume of the cluster, not a snapshot: an origin is never "
            "exposed, mounted or unmapped for a copy",
            "the plan was edited: make a new plan",
        )
    record = op.backup_record(ctx, backup_id)
    recorded = record.snapshots.get(volume_id)
    if recorded != snapshot_id:
        raise op.mismatch(
            ctx,
            f"{snapshot_id} is not backup {backup_id}'s snapshot of volume {volume_id} "
            f"(the catalog records {recorded or 'none for that volume'})",
            "the plan was edited or the catalog changed: make a new plan",
        )
    backend = ctx.backend
    if not isinstance(backend, ExposableSnapshots):
        raise op.mismatch(
            ctx,
            f"the {backend.name} backend does not expose snapshots on a host",
            "the plan was made for another storage: make a new plan",
        )
    if on_storage and not any(s.id == snapshot_id for s in ctx.backend.list_snapshots(volume_id)):
        raise op.mismatch(
            ctx,
            f"the storage has no snapshot {snapshot_id} of volume {volume_id} "
            f"(backup {backup_id}'s)",
            "the snapshot was deleted: the backup cannot be copied any more",
        )
    return backend


@frozen
class ExposeSnapshot(Operation):
    """Make backup ``backup_id``'s snapshot ``snapshot_id`` of volume ``volume_id``
    readable as a block device on host ``host``
    (:meth:`~pgsnap.protocols.ExposableSnapshots.expose_snapshot`: LVM activates
    it, PowerFlex maps it read-only to the host's SDC); outputs the ``device``.
    Idempotent. Its undo (and the plan's later step) conceals it again.

    Checked before the run: the catalog records that snapshot for that volume
    of that backup, the storage has it, it is not a volume of the layout, and
    ``host`` is where pgsnap runs.
    """

    name = "storage.expose_snapshot"
    target = _Target.STORAGE
    compensation = "storage.conceal_snapshot"

    backup_id: str
    volume_id: str
    snapshot_id: str
    host: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        check_reading_host(self, ctx, self.host)
        _check_copied_snapshot(
            self,
            ctx,
            self.backup_id,
            self.volume_id,
            self.snapshot_id,
            on_storage=not plan.undo and ctx.step_id not in plan.started,
        )

    def run(self, ctx: OperationContext) -> Outputs:
        backend = _check_copied_snapshot(
            self, ctx, self.backup_id, self.volume_id, self.snapshot_id, on_storage=False
        )
        where = backend.expose_snapshot(self.snapshot_id, self.host)
        return {"device": where.path, "kind": where.kind.value}


@frozen
class ConcealSnapshot(Operation):
    """Undo :class:`ExposeSnapshot` (the snapshot's file system is unmounted first);
    idempotent. Only a snapshot that a step of this plan exposes, and the catalog
    records for the backup, is concealed: never an origin volume."""

    name = "storage.conceal_snapshot"
    target = _Target.STORAGE

    backup_id: str
    volume_id: str
    snapshot_id: str
    host: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        check_reading_host(self, ctx, self.host)
        _check_copied_snapshot(
            self, ctx, self.backup_id, self.volume_id, self.snapshot_id, on_storage=False
        )
        same = (self.backup_id, self.volume_id, self.snapshot_id, self.host)
        if not any(
            (op.backup_id, op.volume_id, op.snapshot_id, op.host) == same
            for _sid, op in plan.of(ExposeSnapshot)
        ):
            raise self.mismatch(
                ctx,
                f"it conceals snapshot {self.snapshot_id} on {self.host}, which no step of "
                "this plan exposes there",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        backend = _check_copied_snapshot(
            self, ctx, self.backup_id, self.volume_id, self.snapshot_id, on_storage=False
        )
        backend.conceal_snapshot(self.snapshot_id, self.host)
        return {}


_RENAMED: Final = {
    "SnapshotGroup": "TakeSnapshotGroup",
    "Attach": "AttachVolume",
    "Detach": "DetachVolume",
}
"""Old names of operations (they were named like the records they make), kept for one
release with a DeprecationWarning."""

__getattr__ = renamed_operations(__name__, _RENAMED, globals())
