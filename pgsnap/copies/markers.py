"""The markers a copy and a garbage collection leave in a copy target.

A marker is a small JSON text stored by name beside the manifests
(:meth:`~pgsnap.copies.target.CopyTarget.put_marker`). Two kinds:

- ``pending.<copy id>``: a copy is in progress. :func:`~pgsnap.copies.copy_trees`
  writes it before it sends a chunk, rewrites it (a new ``refreshed_at``)
  at most every :data:`REFRESH_INTERVAL` while it runs, and removes it once
  the manifest is written and checked. A copy that died leaves it.
- ``gc``: a garbage collection runs (:func:`~pgsnap.copies.gc.collect_garbage`),
  created only if absent, refreshed the same way, removed at its end. It
  says for how long it may go unrefreshed before it is taken for the marker
  of a dead collection (``stale_after_seconds``).

Each names the host and process that wrote it (never a secret), when it
started and when it was last refreshed, and a random ``token`` that tells
its writer's marker from another's. A marker is *stale* when it was last
refreshed longer ago than the staleness limit: its writer is taken for dead.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import socket
from typing import Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies.manifest import check_copy_id, check_marker_name
from pgsnap.copies.target import CopyTarget
from pgsnap.errors import CopyNotFound, FormatError

__all__ = [
    "DEFAULT_STALE_AFTER",
    "GC_MARKER",
    "MIN_STALE_AFTER",
    "PENDING_PREFIX",
    "REFRESH_INTERVAL",
    "TRUSTED_GAP",
    "Marker",
    "pending_marker",
    "read_marker",
    "utc_now",
]

GC_MARKER: Final = "gc"
"""The name of the garbage collection's marker."""

PENDING_PREFIX: Final = "pending."
"""Names of the markers of copies in progress start with this (then the copy id)."""

REFRESH_INTERVAL: Final = dt.timedelta(seconds=60)
"""A copy or a collection rewrites its marker when it is this old (at its next
request to the target)."""

DEFAULT_STALE_AFTER: Final = dt.timedelta(hours=24)
"""A marker not refreshed for this long is taken for the marker of a dead process."""

MIN_STALE_AFTER: Final = dt.timedelta(hours=1)
"""The shortest staleness limit a collection accepts: far above :data:`REFRESH_INTERVAL`
and any clock skew between hosts."""

TRUSTED_GAP: Final = MIN_STALE_AFTER / 2
"""A copy whose signs of life (its marker's writes, its last check) were never this
far apart cannot have looked stale to any collection; one that paused longer waits
for a running collection and checks its chunks again before it calls itself done."""


def utc_now() -> dt.datetime:
    """The time now, in UTC."""
    return dt.datetime.now(dt.UTC)


def pending_marker(copy_id: str) -> str:
    """The name of the marker of copy ``copy_id`` in progress."""
    return PENDING_PREFIX + check_copy_id(copy_id)


def _when(doc: dict[str, Any], key: str, name: str) -> dt.datetime:
    value = doc.get(key)
    if not isinstance(value, str):
        raise FormatError(f"the marker {name} has no {key}")
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise FormatError(f"the marker {name} has a malformed {key}: {value!r}") from None
    if when.tzinfo is None:
        raise FormatError(f"the marker {name} has a {key} without a time zone")
    return when.astimezone(dt.UTC)


@frozen
class Marker:
    """One marker: who wrote it, when it started and was last refreshed.

    ``copy_id`` is set on a pending copy's marker; ``stale_after`` on the
    collection's (the limit it promises to refresh within).
    """

    name: str = attrs.field(converter=check_marker_name)
    started_at: dt.datetime
    refreshed_at: dt.datetime
    host: str
    pid: int
    token: str
    copy_id: str | None = None
    stale_after: dt.timedelta | None = None

    @classmethod
    def new(
        cls,
        name: str,
        now: dt.datetime,
        *,
        copy_id: str | None = None,
        stale_after: dt.timedelta | None = None,
    ) -> Marker:
        """A marker of this process, started and refreshed ``now``."""
        return cls(
            name=name,
            started_at=now,
            refreshed_at=now,
            host=socket.gethostname(),
            pid=os.getpid(),
            token=secrets.token_hex(8),
            copy_id=copy_id,
            stale_after=stale_after,
        )

    def refreshed(self, now: dt.datetime) -> Marker:
        """This marker, refreshed ``now``."""
        return attrs.evolve(self, refreshed_at=now)

    def to_json(self) -> str:
        """The marker's text."""
        doc: dict[str, Any] = {
            "started_at": self.started_at.astimezone(dt.UTC).isoformat(),
            "refreshed_at": self.refreshed_at.astimezone(dt.UTC).isoformat(),
            "host": self.host,
            "pid": self.pid,
            "token": self.token,
        }
        if self.copy_id is not None:
            doc["copy_id"] = self.copy_id
        if self.stale_after is not None:
            doc["stale_after_seconds"] = self.stale_after.total_seconds()
        return json.dumps(doc, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, name: str, text: str) -> Marker:
        """The marker ``name`` from its text; :class:`~pgsnap.errors.FormatError` when
        it is not a pgsnap marker."""
        try:
            doc = json.loads(text)
        except ValueError:
            raise FormatError(
                f"the marker {name} is not JSON",
                hint=f"it was not written by pgsnap; remove markers/{name} if nothing uses it",
            ) from None
        if not isinstance(doc, dict):
            raise FormatError(f"the marker {name} is not a JSON object")
        started = _when(doc, "started_at", name)
        refreshed = _when(doc, "refreshed_at", name) if "refreshed_at" in doc else started
        host, pid, token = doc.get("host", "?"), doc.get("pid", 0), doc.get("token", "")
        copy_id, stale = doc.get("copy_id"), doc.get("stale_after_seconds")
        if (
            not isinstance(host, str)
            or isinstance(pid, bool)
            or not isinstance(pid, int)
            or not isinstance(token, str)
            or (copy_id is not None and not isinstance(copy_id, str))
            or (stale is not None and not isinstance(stale, int | float))
        ):
            raise FormatError(f"the marker {name} is malformed")
        return cls(
            name=name,
            started_at=started,
            refreshed_at=refreshed,
            host=host,
            pid=pid,
            token=token,
            copy_id=copy_id,
            stale_after=dt.timedelta(seconds=stale) if stale is not None else None,
        )

    def age(self, now: dt.datetime) -> dt.timedelta:
        """How long ago the marker was last refreshed."""
        return now - self.refreshed_at

    def is_stale(self, now: dt.datetime, stale_after: dt.timedelta) -> bool:
        """True when the marker was last refreshed longer than ``stale_after`` ago."""
        return self.age(now) > stale_after

    def describe(self) -> str:
        """Who holds the marker, for messages: host, pid, since, last seen."""
        what = f"copy {self.copy_id}" if self.copy_id is not None else self.name
        return (
            f"{what} (host {self.host}, pid {self.pid}, started "
            f"{self.started_at.isoformat(timespec='seconds')}, last refreshed "
            f"{self.refreshed_at.isoformat(timespec='seconds')})"
        )

    def summary(self) -> dict[str, str | int]:
        """The marker as plain values (an error's ``holders``)."""
        return {
            "marker": self.name,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at.isoformat(),
            "refreshed_at": self.refreshed_at.isoformat(),
        }


def read_marker(target: CopyTarget, name: str) -> Marker | None:
    """The marker ``name`` in ``target``, None when there is none;
    :class:`~pgsnap.errors.FormatError` when it is not a pgsnap marker."""
    try:
        text = target.get_marker(name)
    except CopyNotFound:
        return None
    return Marker.from_json(name, text)
