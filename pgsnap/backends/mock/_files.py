"""File trees as the mock copies them: owners, modes, symlinks and times kept."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

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


def copy_entry(src: Path, dst: Path) -> None:
    """Copy one entry (recursively for directories), keeping owner, mode, times, links.

    An entry that vanishes while it is copied (a running server deletes
    temporary files and recycles WAL) is left out, as if the copy had been
    taken just after the deletion.
    """
    try:
        st = os.lstat(src)
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(mode):
            os.mkdir(dst, 0o700)
            copy_into(src, dst)
        elif stat.S_ISREG(mode):
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


def copy_into(src: Path, dst: Path) -> None:
    """Copy every entry of directory ``src`` into the existing directory ``dst``."""
    with os.scandir(src) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        copy_entry(src / name, dst / name)


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
