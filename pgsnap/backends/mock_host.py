"""A simulated database host for the mock's block mode: a kernel mount table made of symlinks.

:meth:`MockBackend.simulated_host() <pgsnap.backends.mock.MockBackend.simulated_host>`
gives a :class:`MockHost`: a :class:`~pgsnap.host.Host` that is the real
machine (commands, files, processes go to the base host's runner, unchanged)
except for the devices of a block-mode :class:`~pgsnap.backends.mock.MockBackend`,
which it mounts, unmounts and waits for itself. Plans whose restore profile
says "detach" (unmount → detach → restore → attach → wait for the device →
mount) can so run end to end, with a real PostgreSQL server on the volumes,
on a machine without a storage array, loop devices or privileges.

What it simulates, following what a kernel does:

- a device (``<mock root>/dev/<volume id>``, what
  :meth:`~pgsnap.backends.mock.MockBackend.locate` gives) exists while the
  volume is attached; this host sees it only when the volume is attached to
  *its* name (:attr:`~pgsnap.host.Host.name`). :meth:`MockHost.wait_for_device`
  polls for it and returns its resolved path (the volume's directory, the
  "LUN"), or raises :class:`~pgsnap.errors.DeviceNotFound`;
- :meth:`MockHost.mount` needs the device (else :class:`~pgsnap.errors.MountError`
  "no such device") and an existing, empty directory as the mount point (else
  "mount point does not exist" / "not a directory" / "not empty"). The mount
  replaces that directory by a symlink to the volume's directory, so every
  path under the mount point shows the volume's content. Mounting the same
  device there again is a no-op; anything else mounted there is a MountError.
  The device may also be given as its resolved path;
- :meth:`MockHost.unmount` refuses with :class:`~pgsnap.errors.MountBusyError`
  naming the processes whose working directory, root, open or mapped files
  lie in the volume (found by :meth:`~pgsnap.host.Host.processes_using`,
  which scans ``/proc``), or when another simulated mount lies under it; else
  the symlink becomes the empty directory it replaced again (its mode and
  owner kept), as the kernel uncovers the mount point. Nothing mounted there:
  a no-op (or the real ``umount`` for a real mount);
- :meth:`MockHost.mounts` is the real mount table plus one
  ``Mount(<device>, <mount point>, "mockfs", ("rw",))`` per simulated mount,
  and :meth:`MockHost.mount_of` finds a simulated mount for a path at or
  under its mount point (by path components, the symlink not resolved) or
  under the volume's directory (a resolved path);
- the storage side refuses to detach a mounted volume (a
  :class:`~pgsnap.errors.BackendError`, as an array refuses to unmap a volume
  in use), and to restore an attached one.

The mount table is part of the mock's state: with a ``state_file`` it is
persisted with it, under its lock, so several processes (successive
``pgsnap`` commands) share it.

What it does not model: the kernel knows nothing of these mounts (``findmnt``,
``/proc/self/mountinfo`` and :func:`os.path.ismount` do not list them; ``lstat``
of a mount point shows a symlink; a process's working directory under it
reads as the volume's directory); mount options and file system types are
not applied (``fstype`` and ``options`` are ignored: no read-only mounts); a
non-empty mount point cannot be hidden, so it is refused; a device is
mounted at one place at a time; busy detection is a ``/proc`` scan, not the
kernel's reference counts, so a process that starts using the volume while
it is unmounted is not stopped; nothing stops a process from using the
volume's directory (the LUN) directly; host names are only names: every
simulated host shares this machine's file system, so the base host must be
this machine (its runner local), where the mock's directories are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from pgsnap.errors import DeviceNotFound
from pgsnap.host import Host
from pgsnap.model import Mount

if TYPE_CHECKING:
    from pgsnap.backends.mock import MockBackend

__all__ = ["MockHost"]

log = logging.getLogger(__name__)

_POLL_SECONDS: Final = 0.05


class MockHost(Host):
    """This machine as ``base`` reaches it, with ``backend``'s block devices mounted in simulation.

    Made by :meth:`~pgsnap.backends.mock.MockBackend.simulated_host`. Only
    :meth:`mounts`, :meth:`mount_of`, :meth:`mount`, :meth:`unmount` and
    :meth:`wait_for_device` differ from :class:`~pgsnap.host.Host`, and only
    for the mock's devices and simulated mounts (see the module docstring);
    the name and the runner are ``base``'s (default: ``Host()``).
    """

    def __init__(self, backend: MockBackend, base: Host | None = None) -> None:
        base = Host() if base is None else base
        super().__init__(base.runner, name=base.name)
        self._backend = backend

    def __repr__(self) -> str:
        return f"<MockHost {self.name} via {self.description}, simulating {self._backend!r}>"

    @property
    def backend(self) -> MockBackend:
        """The mock whose devices this host mounts."""
        return self._backend

    # ------------------------------------------------------------------ mounts

    def mounts(self) -> tuple[Mount, ...]:
        """The real mounts, then one ``mockfs`` mount per simulated mount on this host."""
        return (*super().mounts(), *self._backend._sim_mounts(self.name))

    def mount_of(self, path: str) -> Mount | None:
        """The simulated mount holding ``path`` if there is one, else the real one."""
        found = self._backend._sim_mount_of(self.name, path)
        return found if found is not None else super().mount_of(path)

    def mount(
        self, source: str, target: str, *, fstype: str | None = None, options: Sequence[str] = ()
    ) -> None:
        """Mount ``source``: simulated for a mock device (``fstype`` and ``options`` ignored)."""
        if self._backend._sim_claims(source) is None:
            super().mount(source, target, fstype=fstype, options=options)
            return
        self._backend._sim_mount(self.name, self.description, source, target)

    def unmount(self, target: str) -> None:
        """Unmount ``target``: simulated for a simulated mount, else the real ``umount``."""
        if not self._backend._sim_unmount(self.name, self.description, target, self._holders):
            super().unmount(target)

    def wait_for_device(self, path: str, *, timeout: float = 60.0) -> str:
        """Wait until the mock device ``path`` is attached to this host; return it resolved.

        Other paths are waited for as :class:`~pgsnap.host.Host` does.
        :class:`~pgsnap.errors.DeviceNotFound` after ``timeout`` seconds (an
        in-memory volume's device never appears).
        """
        if self._backend._sim_claims(path) is None:
            return super().wait_for_device(path, timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            found = self._backend._sim_device(self.name, path)
            if found is not None:
                log.debug("mock host %s: device %s is %s", self.name, path, found)
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeviceNotFound(
                    f"device {path} did not appear on host {self.name!r} within {timeout:g} s",
                    hint="attach the volume to this host (its name is the host name the "
                    "storage knows); an in-memory mock volume has no device",
                    device=path,
                    host=self.description,
                )
            time.sleep(min(_POLL_SECONDS, remaining))

    def _holders(self, path: str) -> tuple[str, ...]:
        """The processes using ``path``, as MountBusyError names them."""
        return tuple(str(p) for p in self.processes_using(path))
