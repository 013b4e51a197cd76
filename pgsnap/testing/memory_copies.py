"""A copy target held in memory: a third :class:`~pgsnap.copies.target.CopyTarget`.

:class:`MemoryCopyTarget` keeps chunks, manifests and markers in dictionaries
behind one lock, so every call takes effect at one instant (a linearizable
store, as S3 and a local directory are) and threads may share it. It has no
path: its ``location`` is ``memory://<name>``. It serves tests that want a
target without a directory, and tests that put a scheduler between the
callers and the target (the garbage collection's property test does: every
call waits for its turn, and may be made to fail as a crash would).

Example::

    target = MemoryCopyTarget()
    manifest, _ = copy_trees({"pgdata": tree}, target, copy_id="c1", backup_id="b1")
    target.delete_manifest("c1")
    assert collect_garbage(target).chunks_deleted == len(manifest.chunk_ids())
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from pgsnap.copies.manifest import (
    MARKER_GONE_HINT,
    check_chunk_id,
    check_copy_id,
    check_marker_name,
)
from pgsnap.errors import CopyNotFound

__all__ = ["MemoryCopyTarget"]

log = logging.getLogger(__name__)


class MemoryCopyTarget:
    """A copy target in dictionaries, read and written in this process (see the
    module docstring). Ids and names are checked as the other targets check them."""

    def __init__(self, name: str = "copies") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._chunks: dict[str, bytes] = {}
        self._manifests: dict[str, str] = {}
        self._markers: dict[str, str] = {}

    def __repr__(self) -> str:
        return (
            f"MemoryCopyTarget({self.location!r}, {len(self._chunks)} chunks, "
            f"{len(self._manifests)} manifests, {len(self._markers)} markers)"
        )

    @property
    def location(self) -> str:
        """``memory://<name>``."""
        return f"memory://{self._name}"

    def _missing(self, what: str, hint: str | None = None) -> CopyNotFound:
        return CopyNotFound(
            f"{what} is not in the copy target {self.location}",
            hint=hint or "list the target's copies; a chunk missing from a copy is damage",
        )

    # ------------------------------------------------------------------ chunks

    def has_chunk(self, chunk: str) -> bool:
        """True when the chunk is stored."""
        with self._lock:
            return check_chunk_id(chunk) in self._chunks

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        """Store the chunk unless it is there."""
        with self._lock:
            if check_chunk_id(chunk) in self._chunks:
                return False
            self._chunks[chunk] = bytes(data)
            return True

    def get_chunk(self, chunk: str) -> bytes:
        """The stored chunk's bytes."""
        with self._lock:
            try:
                return self._chunks[check_chunk_id(chunk)]
            except KeyError:
                raise self._missing(f"chunk {chunk}") from None

    def chunk_ids(self) -> Iterator[str]:
        """The stored chunks' ids, sorted (taken at one instant)."""
        with self._lock:
            ids = sorted(self._chunks)
        return iter(ids)

    def delete_chunk(self, chunk: str) -> None:
        """Remove the chunk."""
        with self._lock:
            self._chunks.pop(check_chunk_id(chunk), None)

    # ------------------------------------------------------------------ manifests

    def put_manifest(self, copy_id: str, text: str) -> None:
        """Store (or replace) the manifest."""
        with self._lock:
            self._manifests[check_copy_id(copy_id)] = text

    def get_manifest(self, copy_id: str) -> str:
        """The manifest's text."""
        with self._lock:
            try:
                return self._manifests[check_copy_id(copy_id)]
            except KeyError:
                raise self._missing(f"copy {copy_id}") from None

    def manifest_ids(self) -> tuple[str, ...]:
        """The ids of the stored manifests, sorted."""
        with self._lock:
            return tuple(sorted(self._manifests))

    def delete_manifest(self, copy_id: str) -> None:
        """Remove the manifest."""
        with self._lock:
            self._manifests.pop(check_copy_id(copy_id), None)

    # ------------------------------------------------------------------ markers

    def put_marker(self, name: str, text: str) -> None:
        """Store (or replace) the marker."""
        with self._lock:
            self._markers[check_marker_name(name)] = text

    def create_marker(self, name: str, text: str) -> bool:
        """Store the marker unless it is there."""
        with self._lock:
            if check_marker_name(name) in self._markers:
                return False
            self._markers[name] = text
            return True

    def get_marker(self, name: str) -> str:
        """The marker's text."""
        with self._lock:
            try:
                return self._markers[check_marker_name(name)]
            except KeyError:
                raise self._missing(f"marker {name}", MARKER_GONE_HINT) from None

    def marker_names(self) -> tuple[str, ...]:
        """The names of the stored markers, sorted."""
        with self._lock:
            return tuple(sorted(self._markers))

    def delete_marker(self, name: str) -> None:
        """Remove the marker."""
        with self._lock:
            self._markers.pop(check_marker_name(name), None)
