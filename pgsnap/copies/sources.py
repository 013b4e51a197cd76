"""Where a copy reads a tree from: a directory of this machine, or a
:class:`StreamedTree`: a directory of a host pgsnap reaches through the Host
seam, read as a tar stream (``tar -c --format=posix --numeric-owner`` there,
its standard output over ssh; :class:`pgsnap.operations.copies.HostTree`).

:func:`tar_entries` reads such a stream: each entry with its kind, mode,
owner, time (to the nanosecond, from the pax header) and, for a file, its
content, in stream order; anything but directories, files and symbolic links
is a :class:`~pgsnap.errors.CopyError` (a data directory holds none).
"""

from __future__ import annotations

import contextlib
import posixpath
import tarfile
from collections.abc import Iterator
from typing import IO, Final, Protocol, runtime_checkable

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies.manifest import EntryKind
from pgsnap.errors import CopyError

__all__ = ["TAR_CREATE", "StreamedTree", "TarEntry", "tar_entries"]

TAR_CREATE: Final = ("tar", "--format=posix", "--numeric-owner", "-cf", "-")
"""``tar`` creating the stream :func:`tar_entries` reads (then ``-C DIR .``)."""


@frozen
class TarEntry:
    """One entry of a tar stream: ``rel`` is its path in the tree (``""`` the top);
    a file's content is read from ``content`` before the next entry is asked for."""

    kind: EntryKind
    rel: str
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    link: str | None = None
    content: IO[bytes] | None = attrs.field(default=None, eq=False, repr=False)


def _rel(name: str) -> str:
    path = posixpath.normpath(name)
    if path in (".", ""):
        return ""
    if path.startswith("./"):
        path = path[2:]
    if path.startswith(("/", "../")) or path == "..":
        raise CopyError(f"the tree's stream holds {name!r}, outside the tree", path=name)
    return path


def _mtime_ns(m: tarfile.TarInfo) -> int:
    """The entry's time to the nanosecond: from its pax header's decimal text when it
    has one (a float would lose the last digits)."""
    text = m.pax_headers.get("mtime")
    if text:
        whole, _dot, frac = text.partition(".")
        try:
            return int(whole) * 1_000_000_000 + int((frac + "000000000")[:9] or 0)
        except ValueError:
            pass
    return round(float(m.mtime) * 1e9)


def tar_entries(stream: IO[bytes], where: str) -> Iterator[TarEntry]:
    """The entries of the tar ``stream`` (the tree at ``where``, for messages)."""
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tf:
            for m in tf:
                rel = _rel(m.name)
                mtime_ns = _mtime_ns(m)

                base = TarEntry(EntryKind.DIRECTORY, rel, m.mode, m.uid, m.gid, mtime_ns)
                if m.isdir():
                    yield base
                elif m.issym():
                    yield attrs.evolve(base, kind=EntryKind.SYMLINK, link=m.linkname)
                elif m.isreg() and not m.issparse():
                    content = tf.extractfile(m)
                    yield attrs.evolve(base, kind=EntryKind.FILE, size=m.size, content=content)
                else:
                    raise CopyError(
                        f"{where}/{rel} is neither a file, a directory nor a symbolic link "
                        f"(tar type {m.type!r})",
                        hint="a PostgreSQL data directory holds none: is this the right tree?",
                        path=f"{where}/{rel}",
                    )
    except tarfile.TarError as exc:
        raise CopyError(
            f"the tree at {where} did not come through as a tar stream: {exc}",
            hint="check that GNU tar is installed on the host and that the tree is readable",
            path=where,
        ) from exc


@runtime_checkable
class StreamedTree(Protocol):
    """A tree a copy reads as a stream of entries rather than as a directory of this
    machine (:class:`pgsnap.operations.copies.HostTree`: ``tar`` on a host reached
    through the Host seam)."""

    def file_sizes(self) -> list[int]:
        """The sizes of the tree's regular files: what a copy's progress counts."""
        ...

    def entries(self) -> contextlib.AbstractContextManager[Iterator[TarEntry]]:
        """The tree's entries, parents before children, files with their content."""
        ...
