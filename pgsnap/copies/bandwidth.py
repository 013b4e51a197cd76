"""A bandwidth limit shared by a copy's upload threads: a token bucket.

:class:`TokenBucket` lets ``rate`` bytes a second through on average, with
bursts of at most ``burst`` bytes (default: one second's worth). A caller
takes the bytes it is about to send (:meth:`TokenBucket.take`) and sleeps as
long as the bucket says; a request larger than the bucket still goes, and
the bucket's debt makes the next callers wait for it, so the average holds
for any request size. Threads share one bucket; the clock and the sleep are
injectable, so a test runs it on a fake clock.

:func:`parse_size` reads a byte count as a configuration writes it: a
number of bytes (``52428800``) or a number with a unit (``"50MiB"``,
``"1.5 GB"``, ``"800k"``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Final

from pgsnap.errors import ConfigurationError

__all__ = ["TokenBucket", "parse_size"]

log = logging.getLogger(__name__)

_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*(?:/s)?\s*")


def parse_size(value: object, what: str = "the size") -> int:
    """``value`` (a positive number of bytes, or text such as ``"50MiB"``, ``"2 GB"``,
    ``"800k"``, optionally ending in ``/s``) as a whole number of bytes."""
    hint = 'write a number of bytes (52428800) or one with a unit in quotes ("50MiB", "1GB")'
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a number of bytes, not {value!r}", hint=hint)
    if isinstance(value, int | float):
        number, unit = float(value), ""
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        number, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise ConfigurationError(f"{what} must be a number of bytes, not {value!r}", hint=hint)
    if unit not in _UNITS:
        raise ConfigurationError(
            f"{what} has an unknown unit {unit!r} ({value!r})",
            hint='use B, k/kB, KiB, M/MB, MiB, G/GB, GiB, T/TB or TiB, e.g. "50MiB"',
        )
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ConfigurationError(f"{what} must be above 0 bytes, not {value!r}", hint=hint)
    return size


class TokenBucket:
    """At most ``rate`` bytes a second on average, in bursts of at most ``burst``
    bytes (see the module docstring). Thread-safe."""

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ConfigurationError(
                f"a bandwidth limit must be above 0 bytes a second, not {rate!r}",
                hint="give bytes a second, e.g. 52428800 or '50MiB'; leave it out for none",
            )
        self._rate = float(rate)
        self._burst = float(burst) if burst is not None else self._rate
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = self._burst
        self._at = clock()

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self._rate:g} B/s, burst={self._burst:g} B)"

    @property
    def rate(self) -> float:
        """Bytes a second."""
        return self._rate

    def take(self, size: int) -> float:
        """Take ``size`` bytes: sleep until the bucket allows them; return the seconds
        slept (0 when it had them)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            self._tokens -= size
            wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait
