"""Trees as tar streams: how a copy reads a snapshot mounted on another host, and how a
restore from a copy writes into one, through the Host seam (``tar`` on that host,
its standard streams over ssh: :mod:`pgsnap.host.streams`).

:func:`tar_entries` reads a stream ``tar -c --format=posix --numeric-owner``
wrote: each entry with its kind, mode, owner, time and (for a file) its content,
in stream order; anything but directories, files and symbolic links is a
:class:`~pgsnap.errors.CopyError` (a data directory holds none).

:func:`write_tree_tar` writes a manifest's tree as such a stream, every chunk
fetched ahead (``parallel``), checked against its name and every file against its
SHA-256, for ``tar -x --numeric-owner`` on the host to write; the owners, modes
and times are the manifest's.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import tarfile
from collections.abc import Callable, Iterator
from typing import IO, Final

from pgsnap.copies.copier import RestoreProgress, _chunk_key, _fetched
from pgsnap.copies.keys import CopyKey
from pgsnap.copies.manifest import EntryKind, FileEntry, Manifest
from pgsnap.copies.target import CopyTarget
from pgsnap.errors import ConfigurationError, DamagedChunkError

__all__ = ["TAR_EXTRACT", "write_tree_tar"]

TAR_EXTRACT: Final = ("tar", "--numeric-owner", "-xpf", "-")
"""``tar`` writing the stream :func:`write_tree_tar` makes (then ``-C DIR``)."""


class _Checked:
    """A file's content from its chunks, as ``tarfile`` reads it (a few KiB at a
    time), hashed on the way."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._block = memoryview(b"")
        self._pos = 0
        self.sha256 = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        parts: list[bytes] = []
        want = n
        while want != 0:
            if self._pos >= len(self._block):
                block = next(self._chunks, None)
                if block is None:
                    break
                self.sha256.update(block)
                self._block, self._pos = memoryview(block), 0
            take = (
                len(self._block) - self._pos
                if want < 0
                else min(want, len(self._block) - self._pos)
            )
            parts.append(bytes(self._block[self._pos : self._pos + take]))
            self._pos += take
            if want > 0:
                want -= take
        return b"".join(parts)


def _info(entry: FileEntry) -> tarfile.TarInfo:
    info = tarfile.TarInfo("./" + entry.path if entry.path else ".")
    info.mode = entry.mode
    info.uid, info.gid = entry.uid, entry.gid
    info.uname = info.gname = ""
    seconds, ns = divmod(entry.mtime_ns, 1_000_000_000)
    info.mtime = seconds
    info.pax_headers = {"mtime": f"{seconds}.{ns:09d}"}  # to the nanosecond, as stat has it
    if entry.kind is EntryKind.DIRECTORY:
        info.type = tarfile.DIRTYPE
    elif entry.kind is EntryKind.SYMLINK:
        info.type = tarfile.SYMTYPE
        info.linkname = entry.link or ""
    else:
        info.type = tarfile.REGTYPE
        info.size = entry.size
    return info


def write_tree_tar(
    manifest: Manifest,
    target: CopyTarget,
    tree: str,
    out: IO[bytes],
    *,
    key: CopyKey | None = None,
    parallel: int = 4,
    on_progress: Callable[[RestoreProgress], None] | None = None,
    top: bool = True,
) -> int:
    """Write tree ``tree`` of ``manifest`` to ``out`` as a tar stream; return the bytes
    of file content written. ``top=False`` leaves the tree's top directory out (its
    owner, mode and time are then the destination's own). A chunk or file that does
    not match its checksum is a :class:`~pgsnap.errors.DamagedChunkError` (the stream
    is then incomplete: the caller stops the ``tar`` reading it)."""
    if tree not in manifest.trees:
        raise ConfigurationError(
            f"copy {manifest.copy_id} has no tree {tree!r} (its trees: "
            f"{', '.join(manifest.trees)})",
            hint="name a tree the manifest lists",
        )
    if parallel < 1:
        raise ConfigurationError(f"parallel must be at least 1, not {parallel}")
    chunk_key = _chunk_key(manifest, key)
    # Each directory's whole subtree together, parents first: GNU tar sets a
    # directory's time once the stream leaves it, and would see it change after.
    entries = sorted(
        (e for e in manifest.entries_of(tree) if top or e.path),
        key=lambda e: e.path.split("/") if e.path else [],
    )
    files_total = sum(1 for e in entries if e.kind is EntryKind.FILE)
    bytes_total = sum(e.size for e in entries if e.kind is EntryKind.FILE)
    written = files_done = 0
    with (
        concurrent.futures.ThreadPoolExecutor(
            max_workers=parallel, thread_name_prefix="pgsnap-restore"
        ) as pool,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf,
    ):
        for e in entries:
            info = _info(e)
            if e.kind is not EntryKind.FILE:
                tf.addfile(info)
                continue
            content = _Checked(_fetched(target, list(e.chunks), pool, parallel, chunk_key))
            try:
                tf.addfile(info, content)
            except OSError as exc:  # fewer bytes than the manifest says: "unexpected end"
                if not str(exc).startswith("unexpected end"):
                    raise
                raise DamagedChunkError(
                    f"{e.tree}/{e.path} of copy {manifest.copy_id} is shorter than its "
                    "manifest says",
                    hint="the copy is damaged; restore from another copy",
                    path=f"{e.tree}/{e.path}",
                ) from exc
            if content.sha256.hexdigest() != e.sha256:
                raise DamagedChunkError(
                    f"{e.tree}/{e.path} of copy {manifest.copy_id} does not match its checksum",
                    hint="the copy is damaged; restore from another copy",
                    path=f"{e.tree}/{e.path}",
                )
            written += e.size
            files_done += 1
            if on_progress is not None:
                on_progress(RestoreProgress(files_done, files_total, written, bytes_total))
    return written
