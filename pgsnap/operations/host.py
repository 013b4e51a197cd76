"""Operations on the database host's mounts and devices (through :class:`~pgsnap.host.Host`)."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from pgsnap.operations.base import Operation, OperationContext, Outputs, Target

__all__ = ["Mount", "Unmount", "WaitForDevice"]


def _options(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class Unmount(Operation):
    """Unmount a volume's file system; a busy file system names the processes holding it."""

    name = "host.unmount"
    target = Target.HOST
    compensation = "host.mount"

    mount_point: str

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.host.unmount(self.mount_point)
        return {}


@attrs.frozen
class Mount(Operation):
    """Mount a device on a mount point (no-op when exactly that is mounted)."""

    name = "host.mount"
    target = Target.HOST
    compensation = "host.unmount"

    device: str
    mount_point: str
    fstype: str | None = None
    options: tuple[str, ...] = attrs.field(default=(), converter=_options)

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
