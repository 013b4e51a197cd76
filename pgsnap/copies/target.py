"""Where copies go: the :class:`CopyTarget` protocol and a directory target.

A copy target holds manifests (one per copy, by copy id), chunks (by chunk
id) and markers (small texts by name: a copy in progress, a garbage
collection running; see :mod:`pgsnap.copies.gc`). Writes are atomic: a
reader sees a whole object or none. A chunk is immutable once written (its
name is its content's hash), so writing one that exists is skipped.
:meth:`CopyTarget.create_marker` creates a marker only if it is absent, in
one atomic step, so two writers cannot both believe they created it.
:class:`DirectoryCopyTarget` keeps them in a local directory (an NFS or
backup-appliance mount)::

    <root>/chunks/<first two hex digits>/<chunk id>
    <root>/manifests/<copy id>.json
    <root>/markers/<marker name>
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

from pgsnap.copies.manifest import (
    MARKER_GONE_HINT,
    check_chunk_id,
    check_copy_id,
    check_marker_name,
    is_chunk_id,
    is_copy_id,
    is_marker_name,
)
from pgsnap.errors import ConfigurationError, CopyError, CopyNotFound

__all__ = ["TARGET_OPTIONS", "CopyTarget", "DirectoryCopyTarget", "open_target"]

log = logging.getLogger(__name__)

_NOT_FOUND_HINT = (
    "list the target's copies; a chunk missing from a copy is damage "
    "(pgsnap verify-copy names the files it breaks)"
)


@runtime_checkable
class CopyTarget(Protocol):
    """Where off-array copies of backups are kept (see the module docstring)."""

    @property
    def location(self) -> str:
        """Where the target is, for messages (a path or URL, never a secret)."""
        ...

    def has_chunk(self, chunk: str) -> bool:
        """True when the chunk is stored (whole)."""
        ...

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        """Store a chunk (as :func:`~pgsnap.copies.chunks.encode_chunk` made it) unless
        it is there; True when it was written, False when it was there already."""
        ...

    def get_chunk(self, chunk: str) -> bytes:
        """A stored chunk's bytes; :class:`~pgsnap.errors.CopyNotFound` if absent."""
        ...

    def chunk_ids(self) -> Iterator[str]:
        """Every stored chunk's id (in no particular order)."""
        ...

    def delete_chunk(self, chunk: str) -> None:
        """Remove a chunk (absent: nothing to do)."""
        ...

    def put_manifest(self, copy_id: str, text: str) -> None:
        """Store (or replace) a copy's manifest, atomically."""
        ...

    def get_manifest(self, copy_id: str) -> str:
        """A copy's manifest text; :class:`~pgsnap.errors.CopyNotFound` if absent."""
        ...

    def manifest_ids(self) -> tuple[str, ...]:
        """The ids of the copies whose manifests are stored, sorted."""
        ...

    def delete_manifest(self, copy_id: str) -> None:
        """Remove a copy's manifest (absent: nothing to do)."""
        ...

    def put_marker(self, name: str, text: str) -> None:
        """Store (or replace) the marker ``name``, atomically."""
        ...

    def create_marker(self, name: str, text: str) -> bool:
        """Store the marker ``name`` only if it is absent, in one atomic step: True
        when this call created it, False when it was there already."""
        ...

    def get_marker(self, name: str) -> str:
        """A marker's text; :class:`~pgsnap.errors.CopyNotFound` if absent."""
        ...

    def marker_names(self) -> tuple[str, ...]:
        """The names of the stored markers, sorted."""
        ...

    def delete_marker(self, name: str) -> None:
        """Remove a marker (absent: nothing to do)."""
        ...


class DirectoryCopyTarget:
    """A copy target in a local directory (created, mode 0700, on first write)."""

    __slots__ = ("_root",)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(os.path.abspath(os.fspath(root)))

    def __repr__(self) -> str:
        return f"DirectoryCopyTarget({str(self._root)!r})"

    @property
    def location(self) -> str:
        """The target's directory."""
        return str(self._root)

    @property
    def root(self) -> Path:
        """The target's directory."""
        return self._root

    def _chunk_path(self, chunk: str) -> Path:
        check_chunk_id(chunk)
        return self._root / "chunks" / chunk[:2] / chunk

    def _manifest_path(self, copy_id: str) -> Path:
        return self._root / "manifests" / f"{check_copy_id(copy_id)}.json"

    def _marker_path(self, name: str) -> Path:
        return self._root / "markers" / check_marker_name(name)

    def _fsync_dir(self, directory: Path) -> None:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _write_error(self, path: Path, exc: OSError) -> CopyError:
        return CopyError(
            f"cannot write {path} in the copy target {self._root}: {exc.strerror or exc}",
            hint="check the target directory's permissions and free space",
            path=str(path),
        )

    def _write(self, path: Path, data: bytes) -> None:
        """Write ``path`` atomically: a temporary file beside it, fsync, rename, fsync."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._fsync_dir(path.parent)
        except OSError as exc:
            raise self._write_error(path, exc) from exc

    def _create(self, path: Path, data: bytes) -> bool:
        """Write ``path`` only if it is absent: a whole temporary file beside it, then
        ``os.link`` (which fails when the name exists, atomically, NFS included)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)
                    created = True
                except FileExistsError:
                    # Over NFS a retransmitted LINK can fail although the first one
                    # worked: then the temporary file has two names.
                    created = os.stat(tmp).st_nlink == 2
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            self._fsync_dir(path.parent)
        except OSError as exc:
            raise self._write_error(path, exc) from exc
        return created

    def _read(self, path: Path, what: str, hint: str = _NOT_FOUND_HINT) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise CopyNotFound(
                f"{what} is not in the copy target {self._root}", hint=hint, path=str(path)
            ) from None
        except OSError as exc:
            raise CopyError(
                f"cannot read {path} in the copy target {self._root}: {exc.strerror or exc}",
                hint="check the target directory's permissions",
                path=str(path),
            ) from exc

    def has_chunk(self, chunk: str) -> bool:
        """True when the chunk's file exists."""
        return self._chunk_path(chunk).is_file()

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        """Write the chunk's file unless it exists."""
        path = self._chunk_path(chunk)
        if path.is_file():
            return False
        self._write(path, data)
        return True

    def get_chunk(self, chunk: str) -> bytes:
        """The chunk file's bytes."""
        return self._read(self._chunk_path(chunk), f"chunk {chunk}")

    def chunk_ids(self) -> Iterator[str]:
        """The chunk files' names (temporary files left out)."""
        base = self._root / "chunks"
        if not base.is_dir():
            return
        for sub in sorted(base.iterdir()):
            if sub.is_dir():
                for f in sorted(sub.iterdir()):
                    if is_chunk_id(f.name):
                        yield f.name

    def delete_chunk(self, chunk: str) -> None:
        """Remove the chunk's file."""
        with contextlib.suppress(FileNotFoundError):
            self._chunk_path(chunk).unlink()

    def put_manifest(self, copy_id: str, text: str) -> None:
        """Write ``manifests/<copy id>.json`` atomically."""
        self._write(self._manifest_path(copy_id), text.encode())

    def get_manifest(self, copy_id: str) -> str:
        """The text of ``manifests/<copy id>.json``."""
        return self._read(self._manifest_path(copy_id), f"copy {copy_id}").decode()

    def manifest_ids(self) -> tuple[str, ...]:
        """The copy ids with a manifest file."""
        base = self._root / "manifests"
        if not base.is_dir():
            return ()
        return tuple(
            sorted(p.name[: -len(".json")] for p in base.glob("*.json") if is_copy_id(p.stem))
        )

    def delete_manifest(self, copy_id: str) -> None:
        """Remove ``manifests/<copy id>.json``."""
        with contextlib.suppress(FileNotFoundError):
            self._manifest_path(copy_id).unlink()

    def put_marker(self, name: str, text: str) -> None:
        """Write ``markers/<name>`` atomically."""
        self._write(self._marker_path(name), text.encode())

    def create_marker(self, name: str, text: str) -> bool:
        """Create ``markers/<name>`` unless it exists (a temporary file, ``os.link``)."""
        return self._create(self._marker_path(name), text.encode())

    def get_marker(self, name: str) -> str:
        """The text of ``markers/<name>``."""
        return self._read(self._marker_path(name), f"marker {name}", MARKER_GONE_HINT).decode()

    def marker_names(self) -> tuple[str, ...]:
        """The marker files' names (temporary files left out)."""
        base = self._root / "markers"
        if not base.is_dir():
            return ()
        return tuple(sorted(p.name for p in base.iterdir() if is_marker_name(p.name)))

    def delete_marker(self, name: str) -> None:
        """Remove ``markers/<name>``."""
        path = self._marker_path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._write_error(path, exc) from exc


TARGET_OPTIONS = (
    "endpoint_url",
    "region",
    "access_key_env",
    "secret_key_env",
    "credentials_file",
    "ca_bundle",
)
"""The options of an S3 target (``[copies]`` in the configuration): none is a secret."""


def open_target(
    location: str, options: Mapping[str, str] | None = None, *, connections: int | None = None
) -> CopyTarget:
    """The copy target at ``location``: ``s3://bucket/prefix`` (an
    :class:`~pgsnap.copies.s3.S3CopyTarget` with ``options``, see
    :data:`TARGET_OPTIONS`, and a pool of ``connections`` kept-alive connections:
    as many as the threads that will share it) or an absolute directory path."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(TARGET_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown copy target option(s) {', '.join(unknown)}",
            hint=f"use {', '.join(TARGET_OPTIONS)}",
        )
    if location.startswith("s3://"):
        from pgsnap.copies.s3 import (  # noqa: PLC0415 - boto3 only when used
            DEFAULT_MAX_CONNECTIONS,
            S3CopyTarget,
        )

        bucket, _, prefix = location[len("s3://") :].partition("/")
        return S3CopyTarget(
            bucket,
            prefix,
            endpoint_url=opts.get("endpoint_url"),
            region=opts.get("region"),
            access_key_env=opts.get("access_key_env"),
            secret_key_env=opts.get("secret_key_env"),
            credentials_file=opts.get("credentials_file"),
            ca_bundle=opts.get("ca_bundle"),
            max_connections=connections or DEFAULT_MAX_CONNECTIONS,
        )
    if not os.path.isabs(location):
        raise ConfigurationError(
            f"the copy target {location!r} is neither s3://bucket/prefix nor an absolute path",
            hint="e.g. [copies] path = '/mnt/backups/pgsnap' or 's3://backups/pgsnap'",
        )
    if opts:
        raise ConfigurationError(
            f"options {', '.join(sorted(opts))} are for an S3 target, not a directory",
            hint="leave them out, or give an s3:// target",
        )
    return DirectoryCopyTarget(location)
