"""What the shipped backends share: the error of a failed group, and a base for
backends that drive their storage with commands on the database host.

:class:`CommandBackend` is the base of the btrfs and LVM backends: a command
run through the :class:`~pgsnap.host.Host` whose runner fails (a timeout, an
unreachable host, a command that cannot start) becomes the backend's error,
and what such a storage cannot do (attach, detach, policies) is refused with
:class:`~pgsnap.errors.UnsupportedCapability`. Private: a backend author
writes against :class:`~pgsnap.protocols.StorageBackend`, not this.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    CommandTimeout,
    HostError,
    HostUnreachable,
    PgsnapError,
    UnsupportedCapability,
)
from pgsnap.protocols import Capability

if TYPE_CHECKING:
    from pgsnap.host import CommandResult, Host

__all__ = ["CommandBackend", "group_failure"]

log = logging.getLogger(__name__)


def group_failure(
    exc: Exception,
    name: str,
    volume_id: str | None,
    index: int,
    count: int,
    *,
    error: type[BackendError],
    backend: str,
    afterwards: str = "afterwards",
    hint: str = "fix the cause and take the group again",
) -> Exception:
    """The error a failed snapshot group raises: says which volume (``index`` of
    ``count``; None: ``afterwards``, e.g. "writing its metadata") and keeps a pgsnap
    error's type; anything else becomes ``error``."""
    cause = exc.message if isinstance(exc, PgsnapError) else str(exc) or type(exc).__name__
    where = f"at volume {volume_id!r} ({index} of {count})" if volume_id is not None else afterwards
    message = f"snapshot group {name!r} failed {where}: {cause}; no snapshot of the group was kept"
    extra: Mapping[str, Any] = {} if volume_id is None else {"volume_id": volume_id}
    if isinstance(exc, PgsnapError):
        details = {**exc.details, **extra}
        try:
            return type(exc)(message, hint=exc.hint, **details)
        except TypeError:  # a subclass with another constructor
            pass
    return error(message, hint=hint, backend=backend, **extra)


class CommandBackend:
    """The base of a backend that runs commands on its host (see the module docstring).

    A subclass sets ``_host`` and ``_timeout`` (seconds a command may take) and the
    class attributes: its name, its error class, the hint of a command that
    timed out, the hint of a refusal, and a prefix of every command (``env`` settings).
    """

    _NAME: ClassVar[str]
    _ERROR: ClassVar[type[BackendError]]
    _TIMEOUT_HINT: ClassVar[str]
    _UNSUPPORTED_HINT: ClassVar[str]
    _COMMAND_PREFIX: ClassVar[tuple[str, ...]] = ()

    _host: Host
    _timeout: float
    _seen: threading.local
    """This thread's answers within an :meth:`observation` (made by the subclass)."""

    @contextmanager
    def observation(self) -> Iterator[None]:
        """Within this block, this thread's calls that only read share what the storage
        was seen to hold (:meth:`_observed`) instead of asking again per call; any
        command that changes something drops it (:meth:`_forget_observed`). Observing a
        cluster asks for its volumes, their locations, restore profiles and snapshots:
        one look instead of one per question. A new block looks again, so a plan's
        freshness check sees what another process changed since."""
        depth = getattr(self._seen, "depth", 0)
        if depth == 0:
            self._seen.memo = {}
        self._seen.depth = depth + 1
        try:
            yield
        finally:
            self._seen.depth = depth
            if depth == 0:
                self._seen.memo = {}

    def _observed(self) -> dict[str, Any] | None:
        """What this thread's observation has seen so far (None outside one)."""
        if not getattr(self._seen, "depth", 0):
            return None
        memo: dict[str, Any] = self._seen.memo
        return memo

    def _forget_observed(self) -> None:
        """Drop what the observation has seen: something changed."""
        getattr(self._seen, "memo", {}).clear()

    def _run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        """Run a command on the host; the runner's failures become backend errors."""
        limit = timeout or self._timeout
        try:
            return self._host.run([*self._COMMAND_PREFIX, *argv], timeout=limit, check=False)
        except CommandTimeout as exc:
            raise BackendUnavailable(
                f"{' '.join(argv[:3])} did not finish within {limit:g} s "
                f"on {self._host.description}",
                hint=self._TIMEOUT_HINT,
                backend=self._NAME,
                argv=tuple(argv),
            ) from exc
        except HostUnreachable as exc:
            raise BackendUnavailable(
                f"the database host cannot be reached: {exc.message}",
                hint=exc.hint,
                backend=self._NAME,
            ) from exc
        except HostError as exc:
            raise self._ERROR(
                f"cannot run {argv[0]} on {self._host.description}: {exc.message}",
                hint=exc.hint,
                backend=self._NAME,
            ) from exc

    def _unsupported(self, what: str, capability: Capability) -> UnsupportedCapability:
        return UnsupportedCapability(
            f"the {self._NAME} backend does not support {what} (no {capability.name})",
            hint=self._UNSUPPORTED_HINT,
            backend=self._NAME,
            capability=capability.value,
        )

    def attach(self, volume_id: str, host: str) -> None:
        """Refused: the volume is on its host already (no ``MAPPING``)."""
        raise self._unsupported("attaching volumes to hosts", Capability.MAPPING)

    def detach(self, volume_id: str, host: str) -> None:
        """Refused: the volume is on its host already (no ``MAPPING``)."""
        raise self._unsupported("detaching volumes from hosts", Capability.MAPPING)

    def pause_policy(self, policy_id: str) -> None:
        """Refused: no ``POLICIES``."""
        raise self._unsupported("snapshot policies", Capability.POLICIES)

    def resume_policy(self, policy_id: str) -> None:
        """Refused: no ``POLICIES``."""
        raise self._unsupported("snapshot policies", Capability.POLICIES)
