"""An object store in a local directory (an NFS or backup-appliance mount).

Each object is a file at its key below the root. A write goes to a temporary
file beside it, is fsynced, and is renamed over the key (atomic); a write
``if_absent`` is linked to the key instead (``link`` fails when the key
exists: of two such writers one wins), and the directory is fsynced. A file's
tag is its inode, modification time and size.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pgsnap.stores.base import StoredObject, StoreErrors, check_key

__all__ = ["DirectoryStore"]


class DirectoryStore:
    """Objects as files below ``root`` (see the module docstring); errors of the kinds
    ``errors`` names."""

    def __init__(self, root: str | os.PathLike[str], errors: StoreErrors) -> None:
        self._root = Path(root)
        self._errors = errors

    def __repr__(self) -> str:
        return f"DirectoryStore({str(self._root)!r})"

    @property
    def location(self) -> str:
        """The root directory."""
        return str(self._root)

    @property
    def root(self) -> Path:
        """The root directory."""
        return self._root

    def _check_root(self) -> None:
        if not self._root.is_dir():
            raise self._errors.refused(
                f"the store's directory {self._root} does not exist (or is not a directory)",
                hint="create it (mkdir), or fix the path; pgsnap does not create it, so "
                "that a mount that is missing is not filled in its place",
            )

    def _path(self, key: str) -> Path:
        try:
            return self._root / check_key(key)
        except ValueError as exc:
            raise self._errors.failed(str(exc), hint="name an object by a relative key") from None

    def _failed(self, what: str, exc: OSError) -> Exception:
        return self._errors.failed(
            f"{what} in {self._root}: {exc.strerror or exc}",
            hint="check the directory: it is there, writable and not full",
        )

    def get(self, key: str) -> bytes:
        """The file's bytes."""
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise self._errors.missing(
                f"{key} is not in {self._root}", hint="list what the store holds"
            ) from None
        except OSError as exc:
            raise self._failed(f"reading {key}", exc) from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of the file from ``start``."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(length)
        except FileNotFoundError:
            raise self._errors.missing(
                f"{key} is not in {self._root}", hint="list what the store holds"
            ) from None
        except OSError as exc:
            raise self._failed(f"reading {key}", exc) from exc

    @staticmethod
    def _object(key: str, st: os.stat_result) -> StoredObject:
        return StoredObject(
            key,
            st.st_size,
            f"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}",
            dt.datetime.fromtimestamp(st.st_mtime_ns / 1e9, dt.UTC),
        )

    def head(self, key: str) -> StoredObject | None:
        """The file's size and tag, or None."""
        path = self._path(key)
        try:
            return self._object(key, path.stat())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._failed(f"looking at {key}", exc) from exc

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        """Write the file atomically (``if_absent``: only when it is not there)."""
        path = self._path(key)
        self._check_root()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                if if_absent:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        return False
                else:
                    os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            dirfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        except OSError as exc:
            raise self._failed(f"writing {key}", exc) from exc
        return True

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        """The files whose keys start with ``prefix``, in key order (temporary files of
        writes in progress left out)."""
        self._check_root()
        base = self._root / prefix.rpartition("/")[0] if "/" in prefix else self._root
        if not base.is_dir():
            return
        found: list[tuple[str, Path]] = []
        try:
            for directory, dirs, files in os.walk(base):
                dirs.sort()
                for name in files:
                    if name.startswith(".tmp-"):
                        continue
                    full = Path(directory) / name
                    key = full.relative_to(self._root).as_posix()
                    if key.startswith(prefix):
                        found.append((key, full))
        except OSError as exc:
            raise self._failed(f"listing {prefix or 'the store'}", exc) from exc
        for key, full in sorted(found):
            try:
                yield self._object(key, full.stat())
            except FileNotFoundError:
                continue  # deleted while listed

    def delete(self, key: str) -> None:
        """Remove the file (absent: nothing to do)."""
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._failed(f"deleting {key}", exc) from exc
