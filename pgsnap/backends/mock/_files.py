"""File trees as the mock copies them: owners, modes, symlinks and times kept."""

from __future__ import annotations

import errno
import fcntl
import filecmp
import logging
import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Final

from pgsnap.errors import (
    ConfigurationError,
)

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- file trees


def copy_meta(st: os.stat_result, dst: Path) -> None:
    """Give ``dst`` the owner, mode and times recorded in ``st`` (never following links)."""
    link = stat.S_ISLNK(st.st_mode)
    current = os.lstat(dst)
    if (current.st_uid, current.st_gid) != (st.st_uid, st.st_gid):
        os.lchown(dst, st.st_uid, st.st_gid)  # before chmod: chown clears set-id bits
    if not link:
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


_FICLONE: Final = 0x40049409
"""ioctl(2) FICLONE: ``dst`` shares ``src``'s blocks, copy-on-write (btrfs, XFS)."""
_NO_REFLINK: Final = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF}
)


def reflink(src: Path, dst: Path) -> bool:
    """Make ``dst`` (new) a copy-on-write clone of the regular file ``src``: no block is
    copied. False (and no ``dst``) where the file system cannot."""
    with open(src, "rb") as source:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.ioctl(fd, _FICLONE, source.fileno())
        except OSError as exc:
            os.close(fd)
            os.unlink(dst)
            if exc.errno in _NO_REFLINK:
                return False
            raise
        os.close(fd)
    return True


def _unchanged(st: os.stat_result, src: Path, previous: Path) -> bool:
    """Whether ``previous`` (a file of an earlier, immutable snapshot) is ``src`` as it
    is now: the same owner, mode, size and modification time, and the same bytes (file
    times are coarse: a write in the same tick keeps the time, so the bytes decide)."""
    try:
        old = os.lstat(previous)
    except OSError:
        return False
    if not stat.S_ISREG(old.st_mode) or (
        old.st_size,
        old.st_mtime_ns,
        old.st_uid,
        old.st_gid,
        old.st_mode,
    ) != (st.st_size, st.st_mtime_ns, st.st_uid, st.st_gid, st.st_mode):
        return False
    return filecmp.cmp(src, previous, shallow=False)


class TreeCopy:
    """One copy of a tree, keeping owners, modes, times and links (:func:`copy_into`).

    A regular file is cloned copy-on-write where the file system can (reflinks: tried
    once per copy, then remembered); otherwise, when ``previous`` (the same entry in an
    earlier snapshot, which nothing writes to) holds the same file, the new copy is a
    hard link to it; otherwise the bytes are copied. An entry that vanishes while it is
    copied (a running server deletes temporary files and recycles WAL) is left out, as
    if the copy had been taken just after the deletion.
    """

    def __init__(self) -> None:
        self.reflinks: bool | None = None  # unknown until the first regular file

    def entry(self, src: Path, dst: Path, previous: Path | None = None) -> None:
        """Copy ``src`` (recursively for a directory) to the new ``dst``."""
        try:
            st = os.lstat(src)
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISDIR(mode):
                os.mkdir(dst, 0o700)
                self.into(src, dst, previous)
            elif stat.S_ISREG(mode):
                if self.reflinks is not False:
                    self.reflinks = reflink(src, dst)
                if not self.reflinks:
                    if previous is not None and _unchanged(st, src, previous):
                        os.link(previous, dst)
                        return  # the same inode: its owner, mode and times are right
                    shutil.copyfile(src, dst, follow_symlinks=False)
            elif stat.S_ISFIFO(mode):
                os.mkfifo(dst, 0o600)
            else:  # sockets and device nodes are not content
                log.debug("mock: not copying special file %s", src)
                return
        except FileNotFoundError as exc:
            if exc.filename is None or os.fspath(exc.filename) != os.fspath(src):
                raise
            log.debug("mock: %s vanished while copying; left out", src)
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)
            elif os.path.lexists(dst):
                dst.unlink()
            return
        copy_meta(st, dst)

    def into(self, src: Path, dst: Path, previous: Path | None = None) -> None:
        """Copy every entry of directory ``src`` into the existing directory ``dst``."""
        with os.scandir(src) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            self.entry(src / name, dst / name, None if previous is None else previous / name)


def copy_into(src: Path, dst: Path, previous: Path | None = None) -> None:
    """Copy every entry of directory ``src`` into the existing directory ``dst``
    (``previous``: the same directory in an earlier snapshot, see :class:`TreeCopy`)."""
    TreeCopy().into(src, dst, previous)


def disk_usage(path: Path) -> tuple[int, int]:
    """``(bytes on disk, bytes of files)`` below ``path``: blocks allocated, each inode
    counted once (hard links share theirs), and the files' sizes as copies would take.
    Blocks a reflink shares are counted in every file that shares them."""
    seen: set[tuple[int, int]] = set()
    on_disk = apparent = 0
    for dirpath, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                apparent += st.st_size
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                on_disk += st.st_blocks * 512
    return on_disk, apparent


def empty_dir(path: Path) -> None:
    """Remove everything inside ``path``; a symlink is removed, never followed."""
    with os.scandir(path) as entries:
        found = [(Path(e.path), e.is_dir(follow_symlinks=False)) for e in entries]
    for entry, is_dir in found:
        if is_dir:
            shutil.rmtree(entry)  # does not follow symlinks inside the tree
        else:
            entry.unlink()


def overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def mount_point(path: str, mode: int, uid: int, gid: int) -> None:
    """Create the empty directory a simulated mount replaced, with its mode and owner."""
    os.mkdir(path, 0o700)
    if (uid, gid) != (os.geteuid(), os.getegid()):
        os.chown(path, uid, gid)  # before chmod: chown clears set-id bits
    os.chmod(path, mode)


def blob_path(root: Path, key: str) -> Path:
    rel = PurePosixPath(key)
    if not key or rel.is_absolute() or ".." in rel.parts or rel == PurePosixPath("."):
        raise ConfigurationError(
            f"invalid blob key {key!r} for a directory volume",
            hint="use a relative path inside the volume, without '..'",
            key=key,
        )
    return root.joinpath(*rel.parts)
