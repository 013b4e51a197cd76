"""What an object store is to pgsnap: keys, whole objects, atomic writes.

An :class:`ObjectStore` holds objects by key below its root (a bucket and a
prefix, or a directory). Writes are atomic: a reader sees a whole object or
none. :meth:`ObjectStore.put` with ``if_absent`` writes only when the key is
free, in one step, so that of two such writers exactly one succeeds. Keys are
relative, ``/``-separated, without ``.``, ``..`` or empty parts.

Errors are the kinds a store is given (:class:`StoreErrors`): its user's own
exception classes (a copy target raises copy errors, a WAL archive archive
errors), so that nothing above a store translates them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from pgsnap._attrs import frozen
from pgsnap.errors import PgsnapError

__all__ = ["ObjectStore", "StoreErrors", "StoredObject", "check_key"]


@frozen
class StoredObject:
    """One object as the store lists it: its ``key``, stored ``size`` in bytes, and
    ``etag``, an opaque tag that changes whenever the object is written again (S3's
    ETag; a directory's file identity), which with ``size`` tells one version from
    another. ``modified`` when it was written, where the store says."""

    key: str
    size: int
    etag: str
    modified: dt.datetime | None = None


@frozen
class StoreErrors:
    """The exception classes a store raises: ``failed`` for any failure, ``missing``
    for a key that is not there, ``refused`` for a store that refuses (no such bucket,
    access denied, a certificate that cannot be verified): asking again cannot help."""

    failed: type[PgsnapError]
    missing: type[PgsnapError]
    refused: type[PgsnapError]


def check_key(key: str) -> str:
    """``key`` when it is a relative, normal, ``/``-separated key; else ValueError."""
    parts = key.split("/") if isinstance(key, str) else [""]
    if not key or any(p in ("", ".", "..") for p in parts) or "\0" in key or "\\" in key:
        raise ValueError(f"{key!r} is not an object key")
    return key


@runtime_checkable
class ObjectStore(Protocol):
    """Objects by key (see the module docstring)."""

    @property
    def location(self) -> str:
        """Where the store is, for messages (a path or URL, never a secret)."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; the store's ``missing`` error when it is not there."""
        ...

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of the object from ``start`` (fewer at its end)."""
        ...

    def head(self, key: str) -> StoredObject | None:
        """The object's size and tag, or None when it is not there."""
        ...

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write the object, atomically. With ``if_absent``, only when the key is free:
        True when it was written, False when an object was there."""
        ...

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        """The objects whose keys start with ``prefix``, in key order."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object (absent: nothing to do)."""
        ...
