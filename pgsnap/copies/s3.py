"""A copy target in S3-compatible object storage (AWS S3, MinIO, Ceph RGW, SeaweedFS).

:class:`S3CopyTarget` keeps a copy target's objects in a bucket, under a
prefix, with the same layout as the directory target::

    <prefix>chunks/<first two hex digits>/<chunk id>
    <prefix>manifests/<copy id>.json
    <prefix>markers/<marker name>

The bucket is an :class:`~pgsnap.stores.s3.S3Store`, which says how S3 is
reached (the lean client :class:`~pgsnap.stores.s3http.S3Http`, or a boto3
client given as ``client``), where credentials come from (never part of a
repr, a plan, a log line or an error), what is tried again and what fails at
once (:class:`~pgsnap.errors.CopyTargetRefused`), and how large objects go up
in parts. A chunk and a marker that must not be replaced are written with one
conditional request (``If-None-Match: *``): of two such writes of one key
exactly one succeeds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from pgsnap.copies.manifest import (
    MARKER_GONE_HINT,
    check_chunk_id,
    check_copy_id,
    check_marker_name,
    is_chunk_id,
    is_marker_name,
)
from pgsnap.errors import CopyError, CopyNotFound, CopyTargetRefused
from pgsnap.stores import StoreErrors
from pgsnap.stores.s3 import (
    DEFAULT_ATTEMPTS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    MIN_PART_SIZE,
    S3Store,
)

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "S3CopyTarget",
]

ERRORS: Final = StoreErrors(failed=CopyError, missing=CopyNotFound, refused=CopyTargetRefused)
"""The errors of a copy target's store."""
_CHUNK_GONE: Final = "list the target's copies; a chunk missing from a copy is damage"


class S3CopyTarget:
    """A copy target in ``bucket`` under ``prefix`` (see the module docstring). The
    options are :class:`~pgsnap.stores.s3.S3Store`'s."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_env: str | None = None,
        secret_key_env: str | None = None,
        credentials_file: str | os.PathLike[str] | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
        client: Any = None,
        attempts: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = S3Store(
            bucket,
            prefix,
            errors=ERRORS,
            name="the copy target",
            settings="[copies]",
            endpoint_url=endpoint_url,
            region=region,
            access_key_env=access_key_env,
            secret_key_env=secret_key_env,
            credentials_file=credentials_file,
            ca_bundle=ca_bundle,
            client=client,
            attempts=attempts,
            max_connections=max_connections,
            multipart_threshold=multipart_threshold,
            part_size=part_size,
            sleep=sleep,
        )

    def __repr__(self) -> str:
        return f"S3CopyTarget({self.location!r})"

    @property
    def location(self) -> str:
        """``s3://bucket/prefix`` (and the endpoint when it is not AWS's)."""
        return self._store.location

    @property
    def store(self) -> S3Store:
        """The bucket it keeps its objects in."""
        return self._store

    @staticmethod
    def _chunk_key(chunk: str) -> str:
        check_chunk_id(chunk)
        return f"chunks/{chunk[:2]}/{chunk}"

    @staticmethod
    def _manifest_key(copy_id: str) -> str:
        return f"manifests/{check_copy_id(copy_id)}.json"

    @staticmethod
    def _marker_key(name: str) -> str:
        return f"markers/{check_marker_name(name)}"

    # ------------------------------------------------------------------ the protocol

    def has_chunk(self, chunk: str) -> bool:
        """True when the chunk's object exists."""
        return self._store.head(self._chunk_key(chunk)) is not None

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        """PUT the chunk's object unless it exists: one conditional request
        (``If-None-Match: *``; a 412 means it was there)."""
        return self._store.put(
            self._chunk_key(chunk), data, if_absent=True, what=f"writing chunk {chunk}"
        )

    def get_chunk(self, chunk: str) -> bytes:
        """The chunk object's bytes."""
        return self._store.get(
            self._chunk_key(chunk), what=f"chunk {chunk}", missing_hint=_CHUNK_GONE
        )

    def chunk_ids(self) -> Iterator[str]:
        """The chunk objects' names."""
        for found in self._store.list("chunks/"):
            name = found.key.rpartition("/")[2]
            if is_chunk_id(name):
                yield name

    def delete_chunk(self, chunk: str) -> None:
        """DELETE the chunk's object (S3 deletes of absent keys succeed)."""
        self._store.delete(self._chunk_key(chunk), what=f"deleting chunk {chunk}")

    def put_manifest(self, copy_id: str, text: str) -> None:
        """PUT ``manifests/<copy id>.json`` (in parts when it is large)."""
        self._store.put(
            self._manifest_key(copy_id),
            text.encode(),
            what=f"writing the manifest of copy {copy_id}",
        )

    def get_manifest(self, copy_id: str) -> str:
        """The text of ``manifests/<copy id>.json``."""
        return self._store.get(
            self._manifest_key(copy_id), what=f"copy {copy_id}", missing_hint=_CHUNK_GONE
        ).decode()

    def manifest_ids(self) -> tuple[str, ...]:
        """The copy ids with a manifest object."""
        names = (o.key.rpartition("/")[2] for o in self._store.list("manifests/"))
        return tuple(sorted(n[: -len(".json")] for n in names if n.endswith(".json")))

    def delete_manifest(self, copy_id: str) -> None:
        """DELETE ``manifests/<copy id>.json``."""
        self._store.delete(
            self._manifest_key(copy_id), what=f"deleting the manifest of copy {copy_id}"
        )

    def put_marker(self, name: str, text: str) -> None:
        """PUT ``markers/<name>``."""
        self._store.put(self._marker_key(name), text.encode(), what=f"writing the marker {name}")

    def create_marker(self, name: str, text: str) -> bool:
        """PUT ``markers/<name>`` with ``If-None-Match: *``: False when it exists."""
        return self._store.put(
            self._marker_key(name),
            text.encode(),
            if_absent=True,
            what=f"creating the marker {name}",
        )

    def get_marker(self, name: str) -> str:
        """The text of ``markers/<name>``."""
        return self._store.get(
            self._marker_key(name), what=f"marker {name}", missing_hint=MARKER_GONE_HINT
        ).decode()

    def marker_names(self) -> tuple[str, ...]:
        """The names of the objects under ``markers/``."""
        names = (o.key.rpartition("/")[2] for o in self._store.list("markers/"))
        return tuple(sorted(n for n in names if is_marker_name(n)))

    def delete_marker(self, name: str) -> None:
        """DELETE ``markers/<name>``."""
        self._store.delete(self._marker_key(name), what=f"deleting the marker {name}")
