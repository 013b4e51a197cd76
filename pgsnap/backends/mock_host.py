"""Deprecated: the simulated host moved to :mod:`pgsnap.host.simulated`.

:meth:`MockBackend.simulated_host() <pgsnap.backends.mock.MockBackend.simulated_host>`
gives one; ``SimulatedHost(backend.devices, base)`` builds one. This alias
warns when imported and is removed after the next release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgsnap._moved import warn_moved
from pgsnap.host.simulated import SimulatedHost

if TYPE_CHECKING:
    from pgsnap.backends.mock import MockBackend
    from pgsnap.host import Host

__all__ = ["MockHost"]


class MockHost(SimulatedHost):
    """``SimulatedHost(backend.devices, base)``, under its old name and signature."""

    def __init__(self, backend: MockBackend, base: Host | None = None) -> None:
        super().__init__(backend.devices, base)


warn_moved(__name__, "pgsnap.host.simulated", " (use MockBackend.simulated_host())")
