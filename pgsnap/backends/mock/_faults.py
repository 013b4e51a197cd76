"""Fault injection for the mock: failures, latencies and holds, before a call changes anything."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from pgsnap._attrs import define
from pgsnap.backends.mock._state import _NAME
from pgsnap.errors import (
    BackendUnavailable,
    ConfigurationError,
)
from pgsnap.protocols import STORAGE_BACKEND_METHODS

log = logging.getLogger(__name__)

FAULT_POINTS: Final = frozenset(
    (
        *STORAGE_BACKEND_METHODS,
        "storage_problems",
        "snapshot_access",
        "ex_run_policy",
        "ex_expire_secure",
        "snapshot_volume",
    )
)
"""Names :meth:`MockBackend.inject_fault` and :meth:`MockBackend.add_latency` accept.

The protocol, ``storage_problems`` and ``ex_*`` methods, plus ``snapshot_volume``: the copy of one
volume inside :meth:`~MockBackend.create_snapshot_group` (and
:meth:`~MockBackend.ex_run_policy`), called once per volume, to fail a group
half-way through.
"""

HOLD_TIMEOUT: Final = 600.0
"""Seconds a held call (:meth:`MockBackend.add_hold`) waits before it fails."""


@define
class _Fault:
    method: str
    skip: int
    times: int
    error: BaseException | None


class Faults:
    """The faults, latencies and holds injected into one mock, and the wait before a call.

    Thread-safe (its own lock). ``sleep`` is what latencies wait with.
    """

    def __init__(self, sleep: Callable[[float], None]) -> None:
        self._sleep = sleep
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._latency: dict[str, float] = {}
        self._holds: dict[str, Path] = {}
        self._hold_timeout = HOLD_TIMEOUT

    @staticmethod
    def check_point(method: str) -> None:
        """A :class:`~pgsnap.errors.ConfigurationError` unless ``method`` can fail."""
        if method not in FAULT_POINTS:
            raise ConfigurationError(
                f"{method!r} is not a mock method that can fail",
                hint=f"choose one of: {', '.join(sorted(FAULT_POINTS))}",
                method=method,
            )

    def inject(self, method: str, *, on_call: int, times: int, error: BaseException | None) -> None:
        """The ``on_call``-th call of ``method`` from now fails, and the ``times - 1`` after it."""
        self.check_point(method)
        if on_call < 1 or times < 1:
            raise ConfigurationError(
                f"inject_fault({method!r}): on_call and times must be >= 1 "
                f"(got on_call={on_call}, times={times})",
                hint="on_call=1 fails the next call",
            )
        with self._lock:
            self._faults.append(_Fault(method, on_call - 1, times, error))

    def add_latency(self, method: str, seconds: float) -> None:
        """Every call of ``method`` waits ``seconds`` first."""
        self.check_point(method)
        if seconds < 0:
            raise ConfigurationError(f"latency must be >= 0 seconds, got {seconds}")
        with self._lock:
            self._latency[method] = float(seconds)

    def add_hold(self, method: str, release: str | os.PathLike[str], *, timeout: float) -> None:
        """Every call of ``method`` waits until the file ``release`` exists."""
        self.check_point(method)
        if timeout <= 0:
            raise ConfigurationError(f"hold timeout must be > 0 seconds, got {timeout}")
        with self._lock:
            self._holds[method] = Path(release)
            self._hold_timeout = float(timeout)

    def clear(self) -> None:
        """No fault, latency or hold any more."""
        with self._lock:
            self._faults.clear()
            self._latency.clear()
            self._holds.clear()

    def enter(self, method: str) -> None:
        """Wait ``method``'s latency and hold, then raise its fault if one is due."""
        with self._lock:
            delay = self._latency.get(method, 0.0)
            release = self._holds.get(method)
        if delay:
            self._sleep(delay)
        if release is not None:
            self._wait_for_release(method, release)
        with self._lock:
            for fault in self._faults:
                if fault.method != method:
                    continue
                if fault.skip:
                    fault.skip -= 1
                    continue
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
                error = fault.error
                if error is None:
                    error = BackendUnavailable(
                        f"injected fault in mock.{method}",
                        hint="the mock was told to fail this call (inject_fault)",
                        backend=_NAME,
                        method=method,
                    )
                log.debug("mock.%s: injected fault %r", method, error)
                raise error

    def _wait_for_release(self, method: str, release: Path) -> None:
        deadline = time.monotonic() + self._hold_timeout
        while not release.exists():
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"mock.{method} was held for {self._hold_timeout:g} s and never released",
                    hint=f"create {release} to release it (hold / add_hold)",
                    backend=_NAME,
                    method=method,
                )
            time.sleep(0.02)
