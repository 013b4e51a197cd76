"""Operations: the typed, registered kinds of step that plans are made of.

Every step of a :class:`~pgsnap.plan.Plan` names an operation (its
``action``) and gives it parameters. The operation class says what those
parameters are (an attrs class, validated when the plan is built or loaded),
which collaborator it touches, what undoes it, what a resumed run does with
it, and whether it is a point of no return (see :mod:`pgsnap.operations.base`).
The executor knows operations, not plan kinds or step ids.

Built-in operations (``db.*``, ``storage.*``, ``host.*``, ``catalog.*``,
``archive.*``) are listed in :data:`BUILTIN_OPERATIONS` and imported on first
use. Third parties add their own (a product's notification step) through the
same mechanism as backends: at run time with :func:`register_operation`, or
from an installed package through the entry-point group ``pgsnap.operations``::

    [project.entry-points."pgsnap.operations"]
    "acme.notify" = "acme_pgsnap.ops:Notify"
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from pgsnap._registry import PluginRegistry, describe_target
from pgsnap.errors import ConfigurationError, InvalidPlanError, OperationNotFound
from pgsnap.operations.base import (
    JSONValue,
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Ref,
    Resume,
    RunFailure,
    Target,
    decode_params,
    encode_params,
    refs_in,
)

__all__ = [
    "BUILTIN_OPERATIONS",
    "ENTRY_POINT_GROUP",
    "JSONValue",
    "Operation",
    "OperationContext",
    "OperationRegistry",
    "Outputs",
    "PlanView",
    "Ref",
    "Resume",
    "RunFailure",
    "Target",
    "decode_params",
    "default_operations",
    "encode_params",
    "refs_in",
    "register_operation",
]

ENTRY_POINT_GROUP: Final = "pgsnap.operations"
"""The entry-point group third-party packages declare their operations in."""

_OPS = "pgsnap.operations"
BUILTIN_OPERATIONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "db.backup_start": f"{_OPS}.db:StartBackup",
        "db.wait_checkpoint": f"{_OPS}.db:WaitForCheckpoint",
        "db.backup_abort": f"{_OPS}.db:AbortBackup",
        "db.backup_stop": f"{_OPS}.db:StopBackup",
        "db.primary_switch_wal": f"{_OPS}.db:SwitchPrimaryWal",
        "db.stop_server": f"{_OPS}.db:StopServer",
        "db.start_server": f"{_OPS}.db:StartServer",
        "db.prepare_data_directory": f"{_OPS}.db:PrepareDataDirectory",
        "db.write_backup_label": f"{_OPS}.db:WriteBackupLabel",
        "db.write_recovery_settings": f"{_OPS}.db:WriteRecoverySettings",
        "db.clear_recovery_settings": f"{_OPS}.db:ClearRecoverySettings",
        "db.wait_recovery": f"{_OPS}.db:WaitRecovery",
        "db.verify": f"{_OPS}.db:VerifyRecovery",
        "storage.snapshot_group": f"{_OPS}.storage:TakeSnapshotGroup",
        "storage.delete_snapshot_group": f"{_OPS}.storage:DeleteSnapshotGroup",
        "storage.delete_snapshots": f"{_OPS}.storage:DeleteSnapshots",
        "storage.restore_volume": f"{_OPS}.storage:RestoreVolume",
        "storage.wait_for_restore": f"{_OPS}.storage:WaitForRestore",
        "storage.attach": f"{_OPS}.storage:AttachVolume",
        "storage.detach": f"{_OPS}.storage:DetachVolume",
        "storage.pause_policies": f"{_OPS}.storage:PausePolicies",
        "storage.resume_policies": f"{_OPS}.storage:ResumePolicies",
        "storage.expose_snapshot": f"{_OPS}.storage:ExposeSnapshot",
        "storage.conceal_snapshot": f"{_OPS}.storage:ConcealSnapshot",
        "host.unmount": f"{_OPS}.host:UnmountVolume",
        "host.mount": f"{_OPS}.host:MountVolume",
        "host.wait_for_device": f"{_OPS}.host:WaitForDevice",
        "host.mount_snapshot": f"{_OPS}.host:MountSnapshot",
        "host.unmount_snapshot": f"{_OPS}.host:UnmountSnapshot",
        "catalog.record_backup_start": f"{_OPS}.catalog:RecordBackupStart",
        "catalog.record_backup_stop": f"{_OPS}.catalog:RecordBackupStop",
        "catalog.mark_done": f"{_OPS}.catalog:MarkBackupDone",
        "catalog.fail_backup": f"{_OPS}.catalog:FailBackup",
        "catalog.delete_backup": f"{_OPS}.catalog:DeleteBackupRecord",
        "catalog.mark_unusable": f"{_OPS}.catalog:MarkUnusable",
        "catalog.record_safety_snapshot": f"{_OPS}.catalog:RecordSafetySnapshot",
        "catalog.delete_safety": f"{_OPS}.catalog:DeleteSafetyRecord",
        "catalog.set_pin": f"{_OPS}.catalog:SetPin",
        "catalog.put_rebuilt_record": f"{_OPS}.catalog:PutRebuiltRecord",
        "archive.wait_for_wal": f"{_OPS}.catalog:WaitForWal",
        "archive.verify_wal": f"{_OPS}.catalog:VerifyWal",
        "archive.delete_wal": f"{_OPS}.catalog:DeleteWal",
        "copy.send": f"{_OPS}.copies:SendCopy",
        "copy.delete_manifest": f"{_OPS}.copies:DeleteCopyManifest",
        "copy.restore": f"{_OPS}.copies:RestoreFromCopy",
        "copy.restore_wal": f"{_OPS}.copies:RestoreWalFromCopy",
        "catalog.record_copy": f"{_OPS}.copies:RecordCopy",
        "copy.expire_manifest": f"{_OPS}.copy_retention:ExpireCopyManifest",
        "catalog.forget_copy": f"{_OPS}.copy_retention:ForgetCopy",
        "copy.collect_garbage": f"{_OPS}.copy_retention:CollectCopyGarbage",
        "catalog.record_clone": f"{_OPS}.clone:RecordClone",
        "catalog.mark_clone_ready": f"{_OPS}.clone:MarkCloneReady",
        "catalog.forget_clone": f"{_OPS}.clone:ForgetClone",
        "host.make_clone_directory": f"{_OPS}.clone:MakeCloneDirectory",
        "host.remove_clone_directory": f"{_OPS}.clone:RemoveCloneDirectory",
        "storage.clone_snapshot": f"{_OPS}.clone:CloneSnapshot",
        "storage.delete_clone": f"{_OPS}.clone:DeleteClone",
        "storage.attach_clone": f"{_OPS}.clone:AttachClone",
        "storage.detach_clone": f"{_OPS}.clone:DetachClone",
        "host.mount_clone": f"{_OPS}.clone:MountClone",
        "host.unmount_clone": f"{_OPS}.clone:UnmountClone",
        "db.prepare_clone": f"{_OPS}.clone:PrepareClone",
        "db.write_clone_label": f"{_OPS}.clone:WriteCloneLabel",
        "db.configure_clone": f"{_OPS}.clone:ConfigureClone",
        "db.start_clone": f"{_OPS}.clone:StartClone",
        "db.stop_clone": f"{_OPS}.clone:StopClone",
        "db.wait_clone": f"{_OPS}.clone:WaitClone",
        "db.clear_clone_recovery": f"{_OPS}.clone:ClearCloneRecovery",
        "db.mask_clone": f"{_OPS}.clone:MaskClone",
        "db.create_slot": f"{_OPS}.standby:CreateSlot",
        "db.drop_slot": f"{_OPS}.standby:DropSlot",
        "db.configure_standby": f"{_OPS}.standby:ConfigureStandby",
        "db.wait_standby": f"{_OPS}.standby:WaitStandby",
    }
)
"""Operations shipped with pgsnap: name → ``"module:Class"`` (imported on first use)."""


def _check_operation_class(name: str, cls: type) -> None:
    import attrs  # noqa: PLC0415

    problems: list[str] = []
    if not (isinstance(cls, type) and issubclass(cls, Operation)):
        problems.append("it does not subclass pgsnap.operations.Operation")
    else:
        op: type[Operation] = cls
        if not attrs.has(op):
            problems.append("it is not an attrs class (decorate it with @attrs.frozen)")
        if op.name != name:
            problems.append(f"its name attribute is {op.name!r}")
        if not isinstance(getattr(op, "target", None), Target):
            problems.append("it has no target (a pgsnap.operations.Target)")
        if not isinstance(op.resume, Resume):
            problems.append("its resume policy is not a pgsnap.operations.Resume")
    if problems:
        raise ConfigurationError(
            f"operation {name!r} ({describe_target(cls)}) cannot be used: {'; '.join(problems)}",
            hint="see pgsnap.operations.base.Operation for what an operation declares",
            name=name,
        )


class OperationRegistry(PluginRegistry[Operation]):
    """Operation names and their classes, imported on first use.

    ``builtins`` defaults to :data:`BUILTIN_OPERATIONS`. See
    :class:`~pgsnap._registry.PluginRegistry` for registration and lookup.
    """

    def __init__(
        self,
        *,
        builtins: Mapping[str, str] | None = None,
        plugins: bool = True,
        group: str = ENTRY_POINT_GROUP,
    ) -> None:
        super().__init__(
            kind="operation",
            group=group,
            builtins=BUILTIN_OPERATIONS if builtins is None else builtins,
            check=_check_operation_class,
            not_found=OperationNotFound,
            plugins=plugins,
        )

    def add(self, cls: type[Operation], *, replace: bool = False) -> type[Operation]:
        """Register ``cls`` under its own ``name`` (usable as a class decorator)."""
        self.register(cls.name, cls, replace=replace)
        return cls

    def build(self, action: str, params: Mapping[str, JSONValue], *, step_id: str) -> Operation:
        """The operation ``action`` with ``params``; InvalidPlanError if either is wrong."""
        try:
            cls = self.load(action)
        except ConfigurationError as exc:
            raise InvalidPlanError(
                f"step {step_id}: {exc.message}",
                hint=exc.hint,
                step_id=step_id,
                action=action,
            ) from exc
        return decode_params(cls, params, step_id=step_id)


@functools.cache
def default_operations() -> OperationRegistry:
    """The registry plans and the executor use unless given another, created on first call."""
    return OperationRegistry()


def register_operation(cls: type[Operation], *, replace: bool = False) -> type[Operation]:
    """Register an operation class in the default registry (usable as a decorator)."""
    return default_operations().add(cls, replace=replace)
