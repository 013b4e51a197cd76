"""Operations on the database host's mounts and devices (through :class:`~pgsnap.host.Host`)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Final

import attrs

from pgsnap.operations.base import (
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Target,
    renamed_operations,
)

__all__ = ["MountVolume", "UnmountVolume", "WaitForDevice"]


def _options(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _check_mount_point(
    op: Operation, ctx: OperationContext, mount_point: str, volume_id: str | None
) -> None:
    """``mount_point`` must be the layout's mount point of ``volume_id`` (or, for a
    step that names no volume, of one of the layout's volumes)."""
    wanted = posixpath.normpath(mount_point)
    volumes = {v.id: v for v in ctx.layout.snapshotted}
    if volume_id is not None:
        vol = volumes.get(volume_id)
        if vol is None:
            raise op.mismatch(
                ctx,
                f"volume {volume_id} is not in the cluster's layout",
                "the plan was edited or made for another cluster: make a new plan",
            )
        if posixpath.normpath(vol.mount_point) != wanted:
            raise op.mismatch(
                ctx,
                f"it names mount point {mount_point} for volume {volume_id}, whose mount "
                f"point is {vol.mount_point}",
                "the plan was edited or the layout changed: make a new plan",
            )
        return
    points = sorted(posixpath.normpath(v.mount_point) for v in volumes.values())
    if wanted not in points:
        raise op.mismatch(
            ctx,
            f"{mount_point} is not the mount point of any of the cluster's volumes "
            f"({', '.join(points)})",
            "the plan was edited or the layout changed: make a new plan",
        )


@attrs.frozen
class UnmountVolume(Operation):
    """Unmount a volume's file system; a busy file system names the processes holding it."""

    name = "host.unmount"
    target = Target.HOST
    compensation = "host.mount"

    mount_point: str
    volume_id: str | None = None

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_mount_point(self, ctx, self.mount_point, self.volume_id)
        if plan.undo:
            return
        here = plan.index(ctx.step_id) if ctx.step_id else -1
        wanted = posixpath.normpath(self.mount_point)
        again = [
            sid
            for sid, op in plan.of(MountVolume)
            if posixpath.normpath(op.mount_point) == wanted and plan.index(sid) > here
        ]
        if not again:
            raise self.mismatch(
                ctx,
                f"it unmounts {self.mount_point}, and no later step mounts it again: "
                "PostgreSQL would find an empty directory there",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.host.unmount(self.mount_point)
        return {}


@attrs.frozen
class MountVolume(Operation):
    """Mount a device on a mount point (no-op when exactly that is mounted)."""

    name = "host.mount"
    target = Target.HOST
    compensation = "host.unmount"

    device: str
    mount_point: str
    fstype: str | None = None
    options: tuple[str, ...] = attrs.field(default=(), converter=_options)
    volume_id: str | None = None

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_mount_point(self, ctx, self.mount_point, self.volume_id)

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.host.mount(self.device, self.mount_point, fstype=self.fstype, options=self.options)
        return {}


@attrs.frozen
class WaitForDevice(Operation):
    """Wait until a volume's device node appears on the host after it was attached."""

    name = "host.wait_for_device"
    target = Target.HOST

    device: str
    timeout: float = 120.0

    def run(self, ctx: OperationContext) -> Outputs:
        return {"resolved": ctx.host.wait_for_device(self.device, timeout=self.timeout)}


_RENAMED: Final = {
    "Unmount": "UnmountVolume",
    "Mount": "MountVolume",
}
"""Old names of operations (they were named like the records they make), kept for one
release with a DeprecationWarning."""

__getattr__ = renamed_operations(__name__, _RENAMED, globals())
