"""The mock's side of a simulated host: its block devices and its mount table.

:class:`MockDevices` is the :class:`~pgsnap.host.simulated.SimulatedDevices`
of a block-mode :class:`~pgsnap.backends.mock.MockBackend`: the
:class:`~pgsnap.host.simulated.SimulatedHost` that
:meth:`~pgsnap.backends.mock.MockBackend.simulated_host` gives mounts through
it. The mount table is part of the mock's state (persisted with it, in the
state file), and a mount changes it under the same lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pgsnap.host.simulated import SimulatedMount

if TYPE_CHECKING:
    from pgsnap.backends.mock._backend import MockBackend

__all__ = ["MEMORY_DEVICE_DIR", "MockDevices"]

MEMORY_DEVICE_DIR: Final = "/dev/pgsnap-mock"
"""Where :meth:`MockBackend.locate` puts in-memory volumes' devices (they never exist)."""


class MockDevices:
    """The block devices of ``backend`` as a simulated host sees them (see the module)."""

    fstype: Final = "mockfs"
    attached_to: Final = "attached to host"
    attach_hint: Final = "attach the volume to this host"

    def __init__(self, backend: MockBackend) -> None:
        self._backend = backend

    def __repr__(self) -> str:
        return repr(self._backend)

    def device_volume(self, path: str) -> str | None:
        """The volume a mock device names: ``root/dev/<id>`` or ``/dev/pgsnap-mock/<id>``."""
        b = self._backend
        with b._reading():
            where = Path(os.path.abspath(path))
            root = b._root or b._root_arg
            if where.parent == Path(MEMORY_DEVICE_DIR) or (
                root is not None and where.parent == root / "dev"
            ):
                return where.name
            return None

    def claims(self, path: str) -> str | None:
        """A mock device's volume, or in block mode the volume whose LUN ``path`` is."""
        found = self.device_volume(path)
        if found is not None:
            return found
        b = self._backend
        with b._reading():
            if b._block:
                where = Path(os.path.abspath(path))
                for vol in b._volumes.values():
                    if vol.path == where:
                        return vol.id
            return None

    def lun(self, host: str, volume_id: str) -> Path | None:
        """The volume's directory while it is attached to ``host`` in block mode."""
        b = self._backend
        with b._reading():
            vol = b._volumes.get(volume_id)
            if not b._block or vol is None or vol.path is None or host not in vol.hosts:
                return None
            return vol.path if os.path.lexists(b._device_path(vol.id)) else None

    def volume_path(self, volume_id: str) -> Path | None:
        """The volume's directory (None: in memory, or no such volume)."""
        b = self._backend
        with b._reading():
            vol = b._volumes.get(volume_id)
            return None if vol is None else vol.path

    def device_path(self, volume_id: str) -> str:
        """``root/dev/<id>``: what :meth:`MockBackend.locate` gives in block mode."""
        with self._backend._reading():
            return str(self._backend._device_path(volume_id))

    @contextmanager
    def mount_table(self, *, write: bool) -> Iterator[list[SimulatedMount]]:
        """The mock's mount table, in its state (saved with it when ``write``)."""
        b = self._backend
        with b._writing() if write else b._reading():
            yield b._mounts
