"""Operations on the database host's mounts and devices (through :class:`~pgsnap.host.Host`).

Besides the volume mounts of a recovery, a copy plan mounts a backup's
snapshots read-only (:class:`MountSnapshot`, undone by :class:`UnmountSnapshot`)
on the host that reads them: the database host, or the backup host pgsnap
runs on (``[copies] host``; :func:`reading_host`).
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Iterable
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import DeviceNotFound
from pgsnap.host import Host, LocalRunner
from pgsnap.host.readonly import mount_read_only
from pgsnap.operations.base import (
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Ref,
    Target,
    renamed_operations,
)

__all__ = [
    "MountSnapshot",
    "MountVolume",
    "UnmountSnapshot",
    "UnmountVolume",
    "WaitForDevice",
    "check_apart_from_layout",
    "check_reading_host",
    "reading_host",
]

log = logging.getLogger(__name__)


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


@frozen
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


@frozen
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


_SLICE: Final = 3.0
"""Seconds a device wait goes between two progress reports."""


@frozen
class WaitForDevice(Operation):
    """Wait until a volume's device node appears on the host after it was attached."""

    name = "host.wait_for_device"
    target = Target.HOST

    device: str
    timeout: float = 120.0

    def run(self, ctx: OperationContext) -> Outputs:
        # In slices of a few seconds, saying between them what it waits for (a SAN
        # rescan can take a while); the last slice raises DeviceNotFound as one wait would.
        started = time.monotonic()
        deadline = started + self.timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                found = ctx.host.wait_for_device(self.device, timeout=min(remaining, _SLICE))
            except DeviceNotFound:
                if time.monotonic() + 0.05 >= deadline:
                    raise DeviceNotFound(
                        f"device {self.device} did not appear on {ctx.host.description} "
                        f"within {self.timeout:g} s",
                        device=self.device,
                        host=ctx.host.description,
                        hint="check that the volume is attached (mapped) to this host and "
                        "that the device path is right (lsblk, ls -l /dev/disk/by-id)",
                        timeout=self.timeout,
                    ) from None
                waited = time.monotonic() - started
                ctx.progress(
                    f"waiting for device {self.device} on {ctx.host.description} "
                    f"({waited:.0f} of {self.timeout:g} s)",
                    {"device": self.device, "waited_seconds": round(waited, 1)},
                )
                continue
            return {"resolved": found}


# --------------------------------------------------------------------------- copies


def reading_host(ctx: OperationContext, name: str) -> Host:
    """The host named ``name`` on which a copy plan exposes, mounts and reads
    snapshots: the database host when ``name`` is its name, else this machine
    (pgsnap runs on the backup host it names; :func:`check_reading_host`)."""
    if name == ctx.host.name:
        return ctx.host
    return Host(LocalRunner(), name=name)


def check_reading_host(op: Operation, ctx: OperationContext, name: str) -> None:
    """The :meth:`~Operation.mismatch` raised unless host ``name`` is one a copy reads
    on: the database host (locally, or through the Host seam: a tar stream), or
    another host (``[copies] host``) while the database host is reached remotely
    (pgsnap runs on that backup host)."""
    local = isinstance(ctx.host.runner, LocalRunner)
    if name != ctx.host.name and local:
        raise op.mismatch(
            ctx,
            f"it exposes and reads the snapshots on host {name!r}, but pgsnap runs on the "
            f"database host {ctx.host.name!r}",
            f"run pgsnap copy on {name} (with [copies] host = {name!r}), or leave "
            "[copies] host unset to copy on the database host; then make a new plan",
        )


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def check_apart_from_layout(op: Operation, ctx: OperationContext, path: str, what: str) -> None:
    """The :meth:`~Operation.mismatch` raised unless ``path`` is an absolute, normal
    path that is neither at, inside nor above the mount point of any volume of the
    cluster's layout (the live data directory, ``pg_wal``, a tablespace, the
    archive): a snapshot is never mounted over, nor a copy read from, an origin."""
    norm = posixpath.normpath(path) if path else ""
    if not path.startswith("/") or norm != path.rstrip("/") or norm == "/":
        raise op.mismatch(
            ctx,
            f"{what} {path!r}, which is not an absolute, normal path below /",
            "the plan was edited: make a new plan",
        )
    for vol in ctx.layout.volumes:
        point = posixpath.normpath(vol.mount_point)
        if _within(norm, point) or _within(point, norm):
            raise op.mismatch(
                ctx,
                f"{what} {path}, which is "
                + ("the mount point of" if norm == point else "inside or around")
                + f" volume {vol.id} ({vol.role.value}, {vol.mount_point}): an origin "
                "volume, possibly the live data directory",
                "the plan was edited: make a new plan",
            )


@frozen
class MountSnapshot(Operation):
    """Mount the exposed snapshot ``snapshot_id`` (backup ``backup_id``'s snapshot of
    ``volume_id``) read-only at ``mount_point`` of host ``host``.

    ``device`` is the output of the plan's ``storage.expose_snapshot`` step of
    that snapshot. The options come from the file system on the device
    (:func:`pgsnap.host.readonly.read_only_mount_options`: the snapshot's log or
    journal is not replayed, XFS mounts beside its origin). A no-op when
    exactly that is mounted there already (a resumed run).

    Checked before the run changes anything: the device is that expose step's;
    the mount point is not at, in or above any volume of the layout, no other
    step mounts there, and (before it first runs) nothing is mounted there.
    """

    name = "host.mount_snapshot"
    target = Target.HOST
    compensation = "host.unmount_snapshot"

    backup_id: str
    volume_id: str
    snapshot_id: str
    device: str | Ref
    mount_point: str
    host: str
    timeout: float = 120.0

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        check_reading_host(self, ctx, self.host)
        check_apart_from_layout(self, ctx, self.mount_point, "it mounts a snapshot on")
        self._check_device(ctx, plan)
        others = [
            sid
            for sid, op in plan.of(MountSnapshot)
            if sid != ctx.step_id and posixpath.normpath(op.mount_point) == self.mount_point
        ]
        if others:
            raise self.mismatch(
                ctx,
                f"step {others[0]} mounts another snapshot on {self.mount_point} too",
                "the plan was edited: make a new plan",
            )
        if plan.undo or ctx.step_id in plan.started:
            return
        here = reading_host(ctx, self.host)
        taken = [m for m in here.mounts() if posixpath.normpath(m.target) == self.mount_point]
        if taken:
            raise self.mismatch(
                ctx,
                f"{taken[-1].source} is mounted on {self.mount_point} already",
                f"unmount it (or remove {self.mount_point}), then make a new plan",
            )

    def _check_device(self, ctx: OperationContext, plan: PlanView) -> None:
        ref = self.device
        exposed = None
        if isinstance(ref, Ref) and ref.path[1:] == ("device",):
            try:
                exposed = plan.operation(ref.step)
            except KeyError:
                exposed = None
        # By action name: the storage operations build on this module, not the reverse.
        fields = ("backup_id", "volume_id", "snapshot_id", "host")
        if not (
            exposed is not None
            and exposed.name == "storage.expose_snapshot"
            and tuple(getattr(exposed, f, None) for f in fields)
            == (self.backup_id, self.volume_id, self.snapshot_id, self.host)
        ):
            raise self.mismatch(
                ctx,
                f"it mounts {ref}, which is not the device a step of this plan exposes "
                f"for snapshot {self.snapshot_id} of volume {self.volume_id} on {self.host}",
                "a snapshot is mounted from the device its expose step gives: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        here = reading_host(ctx, self.host)
        device = str(ctx.resolve(self.device))
        here.wait_for_device(device, timeout=self.timeout)
        options = mount_read_only(here, device, self.mount_point)
        log.info("snapshot %s mounted on %s (%s)", self.snapshot_id, self.mount_point, options)
        return {"device": device, "options": list(options), "mount_point": self.mount_point}


@frozen
class UnmountSnapshot(Operation):
    """Unmount a snapshot that a ``host.mount_snapshot`` step of this plan mounted at
    ``mount_point`` of host ``host``, and remove the (empty) mount point; a no-op
    when nothing is mounted there. It unmounts nothing the plan did not mount."""

    name = "host.unmount_snapshot"
    target = Target.HOST

    mount_point: str
    host: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        check_reading_host(self, ctx, self.host)
        check_apart_from_layout(self, ctx, self.mount_point, "it unmounts")
        mounted = [
            sid
            for sid, op in plan.of(MountSnapshot)
            if posixpath.normpath(op.mount_point) == self.mount_point and op.host == self.host
        ]
        if not mounted:
            raise self.mismatch(
                ctx,
                f"it unmounts {self.mount_point} on {self.host}, where no step of this plan "
                "mounts a snapshot",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        here = reading_host(ctx, self.host)
        here.unmount(self.mount_point)
        removed = here.run(["rmdir", "--", self.mount_point], check=False).ok
        return {"removed_mount_point": removed}


_RENAMED: Final = {
    "Unmount": "UnmountVolume",
    "Mount": "MountVolume",
}
"""Old names of operations (they were named like the records they make), kept for one
release with a DeprecationWarning."""

__getattr__ = renamed_operations(__name__, _RENAMED, globals())
