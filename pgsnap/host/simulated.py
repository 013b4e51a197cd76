"""A simulated host: a kernel mount table for the block devices of a simulated storage.

One :class:`SimulatedHost` serves every simulator of pgsnap: the mock
backend's block mode (:meth:`MockBackend.simulated_host()
<pgsnap.backends.mock.MockBackend.simulated_host>`) and the PowerFlex
simulator's SDCs (:meth:`PowerFlexSimulator.simulated_host()
<pgsnap.testing.powerflex_sim.PowerFlexSimulator.simulated_host>`). It is
the real machine (commands, files, processes go to the base host's runner,
unchanged) except for the devices of its :class:`SimulatedDevices`, which it
mounts, unmounts and waits for itself. Plans whose restore profile says
"detach" (unmount → detach → restore → attach → wait for the device →
mount) so run end to end, with a real PostgreSQL server on the volumes, on a
machine without a storage array, loop devices or privileges.

A storage simulator provides the :class:`SimulatedDevices` side: which paths
are its devices, which volume's directory (the "LUN") a host sees through a
device, and where the mount table is kept (the mock keeps it in its state
file, under its lock, so successive ``pgsnap`` processes share it; the
PowerFlex simulator in memory). This module holds what a kernel does:

- a device exists (:meth:`SimulatedHost.exists`, :meth:`~SimulatedHost.realpath`)
  while its volume is attached to *this* host's name;
  :meth:`SimulatedHost.wait_for_device` polls for it and returns its
  resolved path (the LUN), or raises :class:`~pgsnap.errors.DeviceNotFound`;
- :meth:`SimulatedHost.mount` needs the device (else
  :class:`~pgsnap.errors.MountError` "no such device") and an existing, empty
  directory as the mount point (else "mount point does not exist" / "not a
  directory" / "not empty"). The mount replaces that directory by a symlink
  to the LUN, so every path under the mount point shows the volume's
  content. Mounting the same device there again is a no-op; anything else
  mounted there, or the device mounted elsewhere, is a MountError. The
  device may also be given as its LUN;
- :meth:`SimulatedHost.unmount` refuses with
  :class:`~pgsnap.errors.MountBusyError` naming the processes whose working
  directory, root, open or mapped files lie in the volume (found by
  :meth:`~pgsnap.host.Host.processes_using`, which scans ``/proc``), or when
  another simulated mount lies under it; else the symlink becomes the empty
  directory it replaced again (its mode and owner kept), as the kernel
  uncovers the mount point. Nothing simulated mounted there: the real
  ``umount``;
- :meth:`SimulatedHost.mounts` is the real mount table plus one
  ``Mount(<device>, <mount point>, <fstype>, ("rw",))`` per simulated mount,
  and :meth:`SimulatedHost.mount_of` finds a simulated mount for a path at or
  under its mount point (by path components, the symlink not resolved) or
  under the LUN (a resolved path).

What it does not model: the kernel knows nothing of these mounts
(``findmnt``, ``/proc/self/mountinfo`` and :func:`os.path.ismount` do not list
them; ``lstat`` of a mount point shows a symlink); mount options and file
system types are not applied (no read-only mounts); a non-empty mount point
cannot be hidden, so it is refused; a device is mounted at one place at a
time; busy detection is a ``/proc`` scan, not the kernel's reference counts;
nothing stops a process from using the LUN directly; host names are only
names: every simulated host shares this machine's file system, so the base
host must be this machine (its runner local).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Final, Protocol

from pgsnap._attrs import define
from pgsnap.errors import DeviceNotFound, MountBusyError, MountError
from pgsnap.host.host import Host
from pgsnap.model import Mount

__all__ = ["SimulatedDevices", "SimulatedHost", "SimulatedMount"]

log = logging.getLogger(__name__)

_POLL_SECONDS: Final = 0.05


@define
class SimulatedMount:
    """A simulated volume mounted on a simulated host: one line of the mount table.

    The mount point ``target`` (absolute, symlinks not resolved) is a symlink
    to the volume's directory while mounted; ``mode``, ``uid`` and ``gid`` are
    those of the empty directory it replaced, given back on unmount.
    """

    host: str
    volume_id: str
    target: str
    mode: int
    uid: int
    gid: int


class SimulatedDevices(Protocol):
    """The storage side of a :class:`SimulatedHost`: what a simulator provides."""

    @property
    def fstype(self) -> str:
        """The file system type its mounts show in :meth:`SimulatedHost.mounts`."""
        ...

    @property
    def attached_to(self) -> str:
        """How a device reaches a host, for messages: ``"attached to host"``."""
        ...

    @property
    def attach_hint(self) -> str:
        """What to do when a device is missing: ``"attach the volume to this host"``."""
        ...

    def device_volume(self, path: str) -> str | None:
        """The volume id a device path names (attached or not); None: not a device of ours."""
        ...

    def claims(self, path: str) -> str | None:
        """As :meth:`device_volume`, and a volume's directory (its LUN) counts too."""
        ...

    def lun(self, host: str, volume_id: str) -> Path | None:
        """The volume's directory when ``host`` sees its device now; else None."""
        ...

    def volume_path(self, volume_id: str) -> Path | None:
        """The volume's directory, seen or not (None: it has none)."""
        ...

    def device_path(self, volume_id: str) -> str:
        """The device path of a volume, as the storage's ``locate`` gives it."""
        ...

    def mount_table(self, *, write: bool) -> AbstractContextManager[list[SimulatedMount]]:
        """The mount table, under the storage's lock (saved on leaving when ``write``)."""
        ...


def _within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def _mount_point(path: str, mode: int, uid: int, gid: int) -> None:
    """The empty directory a mount point was before it was mounted over."""
    os.mkdir(path, mode)
    with suppress(PermissionError):  # owner kept where this process may set it
        os.chown(path, uid, gid)
    os.chmod(path, mode)


class SimulatedHost(Host):
    """This machine as ``base`` reaches it, with ``devices``' block devices mounted in simulation.

    Only :meth:`exists`, :meth:`realpath`, :meth:`mounts`, :meth:`mount_of`,
    :meth:`mount`, :meth:`unmount` and :meth:`wait_for_device` differ from
    :class:`~pgsnap.host.Host`, and only for the simulated devices and mounts
    (see the module docstring). The runner is ``base``'s (default:
    ``Host()``); the name is ``name``, else ``base``'s: the host name the
    simulated storage attaches volumes to.
    """

    def __init__(
        self, devices: SimulatedDevices, base: Host | None = None, *, name: str | None = None
    ) -> None:
        base = Host() if base is None else base
        super().__init__(base.runner, name=base.name if name is None else name)
        self._devices = devices

    def __repr__(self) -> str:
        return f"<SimulatedHost {self.name} via {self.description}, devices of {self._devices!r}>"

    @property
    def devices(self) -> SimulatedDevices:
        """The simulated storage whose devices this host mounts."""
        return self._devices

    # ------------------------------------------------------------------ devices

    def _seen(self, path: str) -> Path | None:
        """The LUN a device path (or LUN) of ours shows on this host now, else None."""
        vid = self._devices.claims(path)
        return None if vid is None else self._devices.lun(self.name, vid)

    def exists(self, path: str) -> bool:
        """A simulated device exists while its volume is attached to this host."""
        if self._devices.device_volume(path) is not None:
            return self._seen(path) is not None
        return super().exists(path)

    def realpath(self, path: str) -> str:
        """A simulated device resolves to its volume's directory while attached here."""
        if self._devices.device_volume(path) is not None:
            lun = self._seen(path)
            return path if lun is None else super().realpath(str(lun))
        return super().realpath(path)

    def realpaths(self, paths: Sequence[str]) -> tuple[str, ...]:
        """:meth:`realpath` of several paths: the simulated devices here, the others in
        one command."""
        items = list(paths)
        ours = {
            i: self.realpath(p)
            for i, p in enumerate(items)
            if self._devices.device_volume(p) is not None
        }
        others = iter(self._realpaths([p for i, p in enumerate(items) if i not in ours]))
        return tuple(ours[i] if i in ours else next(others) for i in range(len(items)))

    def wait_for_device(self, path: str, *, timeout: float = 60.0) -> str:
        """Wait until the device ``path`` is attached to this host; return it resolved.

        Other paths are waited for as :class:`~pgsnap.host.Host` does.
        :class:`~pgsnap.errors.DeviceNotFound` after ``timeout`` seconds (an
        in-memory volume's device never appears).
        """
        if self._devices.claims(path) is None:
            return super().wait_for_device(path, timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            lun = self._seen(path)
            if lun is not None:
                found = os.path.realpath(lun)
                log.debug("simulated host %s: device %s is %s", self.name, path, found)
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeviceNotFound(
                    f"device {path} did not appear on host {self.name!r} within {timeout:g} s",
                    hint=f"{self._devices.attach_hint} (its name is the host name the storage "
                    "knows); an in-memory volume has no device",
                    device=path,
                    host=self.description,
                )
            time.sleep(min(_POLL_SECONDS, remaining))

    # ------------------------------------------------------------------ mounts

    def _record(self, mount: SimulatedMount) -> Mount:
        return Mount(
            source=self._devices.device_path(mount.volume_id),
            target=mount.target,
            fstype=self._devices.fstype,
            options=("rw",),
        )

    def mounts(self) -> tuple[Mount, ...]:
        """The real mounts, then one simulated mount per line of this host's table."""
        with self._devices.mount_table(write=False) as table:
            ours = tuple(self._record(m) for m in table if m.host == self.name)
        return (*super().mounts(), *ours)

    def mount_of(self, path: str) -> Mount | None:
        """The simulated mount holding ``path`` (at or under its mount point, symlinks
        not resolved, or under its LUN), if there is one; else the real one."""
        where = Path(os.path.abspath(path))
        best: tuple[int, SimulatedMount] | None = None
        with self._devices.mount_table(write=False) as table:
            for mount in table:
                if mount.host != self.name:
                    continue
                bases = {Path(mount.target)}
                lun = self._devices.volume_path(mount.volume_id)
                if lun is not None:
                    bases |= {lun, Path(os.path.realpath(lun))}
                for base in bases:
                    if _within(where, base) and (best is None or len(base.parts) > best[0]):
                        best = (len(base.parts), mount)
        return super().mount_of(path) if best is None else self._record(best[1])

    def mount(
        self, source: str, target: str, *, fstype: str | None = None, options: Sequence[str] = ()
    ) -> None:
        """Mount ``source``: simulated for a device of ours (``fstype``, ``options`` ignored)."""
        if self._devices.claims(source) is None:
            super().mount(source, target, fstype=fstype, options=options)
            return
        where = self.description
        point = os.path.abspath(target)
        with self._devices.mount_table(write=True) as table:
            vid = self._devices.claims(source)
            lun = self._seen(source)
            if vid is None or lun is None:
                raise MountError(
                    f"cannot mount {source} on {target}: no such device "
                    f"(the volume is not {self._devices.attached_to} {self.name!r})",
                    hint=f"{self._devices.attach_hint} and wait for its device first",
                    target=target,
                    host=where,
                    device=source,
                )
            for mount in table:
                if mount.target == point:
                    if mount.volume_id == vid and mount.host == self.name:
                        log.debug("simulated host: %s already mounted on %s", source, point)
                        return
                    raise MountError(
                        f"cannot mount {source} on {point}: "
                        f"{self._devices.device_path(mount.volume_id)} is already mounted there",
                        hint="unmount it first",
                        target=point,
                        host=where,
                        device=source,
                    )
                if mount.volume_id == vid:
                    raise MountError(
                        f"cannot mount {source} on {point}: it is already mounted on "
                        f"{mount.target} (the simulation mounts a device once)",
                        hint=f"unmount {mount.target} first",
                        target=point,
                        host=where,
                        device=source,
                    )
            st = self._empty_mount_point(source, point, lun)
            try:
                os.symlink(lun, point)
            except OSError as exc:
                with suppress(OSError):
                    _mount_point(point, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
                raise MountError(
                    f"cannot mount {source} on {point}: {exc.strerror or exc}",
                    target=point,
                    host=where,
                ) from exc
            table.append(
                SimulatedMount(
                    self.name, vid, point, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
                )
            )
            log.debug("simulated host %s: mounted %s on %s", self.name, source, point)

    def _empty_mount_point(self, source: str, point: str, lun: Path) -> os.stat_result:
        """Check ``point`` is an empty directory and remove it (the symlink takes its place)."""
        where = self.description
        try:
            st = os.lstat(point)
        except FileNotFoundError:
            raise MountError(
                f"cannot mount {source} on {point}: mount point does not exist",
                hint="create the mount point directory first",
                target=point,
                host=where,
            ) from None
        except OSError as exc:
            raise MountError(
                f"cannot mount {source} on {point}: {exc.strerror or exc}",
                target=point,
                host=where,
            ) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise MountError(
                f"cannot mount {source} on {point}: mount point is not a directory",
                hint="mount on an empty directory",
                target=point,
                host=where,
            )
        if not lun.is_dir():
            raise MountError(
                f"cannot mount {source} on {point}: wrong fs type, bad superblock "
                f"(the volume's directory {lun} is missing)",
                hint="restore the volume from a snapshot",
                target=point,
                host=where,
            )
        try:
            os.rmdir(point)  # only an empty directory: the simulation cannot hide content
        except OSError as exc:
            raise MountError(
                f"cannot mount {source} on {point}: mount point is not empty "
                f"({exc.strerror or exc}; the simulation replaces it by a symlink)",
                hint="mount on an empty directory",
                target=point,
                host=where,
            ) from exc
        return st

    def unmount(self, target: str) -> None:
        """Unmount ``target``: simulated for a simulated mount, else the real ``umount``."""
        where = self.description
        point = os.path.abspath(target)
        with self._devices.mount_table(write=True) as table:
            found = [m for m in table if m.target == point and m.host == self.name]
            if not found:
                mount = None
            else:
                mount = found[0]
                self._refuse_busy(mount, table)
                try:
                    if os.path.islink(point):
                        os.unlink(point)
                    if not os.path.lexists(point):
                        _mount_point(point, mount.mode, mount.uid, mount.gid)
                    else:
                        log.warning("simulated host: %s was replaced behind its back", point)
                except OSError as exc:
                    raise MountError(
                        f"cannot unmount {point}: {exc.strerror or exc}",
                        target=point,
                        host=where,
                    ) from exc
                table.remove(mount)
                log.debug("simulated host %s: unmounted %s", self.name, point)
        if mount is None:
            super().unmount(target)

    def _refuse_busy(self, mount: SimulatedMount, table: Sequence[SimulatedMount]) -> None:
        point = mount.target
        nested = [
            m.target for m in table if m is not mount and _within(Path(m.target), Path(point))
        ]
        if nested:
            raise MountBusyError(
                f"cannot unmount {point}: target is busy (mounted under it: {', '.join(nested)})",
                hint="unmount those first",
                target=point,
                host=self.description,
            )
        lun = self._devices.volume_path(mount.volume_id)
        users = (
            ()
            if lun is None
            else tuple(str(p) for p in self.processes_using(os.path.realpath(lun)))
        )
        if users:
            raise MountBusyError(
                f"cannot unmount {point}: target is busy; used by {'; '.join(users)}",
                hint="stop those processes (the PostgreSQL server first), then unmount",
                target=point,
                holders=users,
                host=self.description,
            )
