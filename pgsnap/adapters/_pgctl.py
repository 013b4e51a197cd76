"""Host-side helpers of the PostgreSQL adapter: processes and files of a data directory.

Everything here runs on the database host: finding the server binaries,
running ``pg_ctl`` as the data directory's owner (``runuser`` when pgsnap
runs as root; the server itself never runs as root), checking the
postmaster, writing files atomically with the owner's uid/gid, and cleaning
a restored data directory. No psycopg here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import attrs

from pgsnap.errors import ConfigurationError, DatabaseError

__all__ = [
    "Owner",
    "atomic_write",
    "clean_data_directory",
    "find_bindir",
    "owner_of",
    "postmaster_pid",
    "read_pg_version",
    "run_as",
]

_log = logging.getLogger(__name__)

# Directories whose contents a restore removes (the directories stay), per
# "Backup Manifest / low-level base backup" in the PostgreSQL documentation.
_TRANSIENT_DIRS = (
    "pg_dynshmem",
    "pg_notify",
    "pg_serial",
    "pg_snapshots",
    "pg_stat_tmp",
    "pg_subtrans",
)


@attrs.frozen
class Owner:
    """The OS user owning a data directory (and running its server)."""

    uid: int
    gid: int
    name: str


def owner_of(path: str, os_user: str | None = None) -> Owner:
    """The owner of ``path``; ``ConfigurationError`` if it is root or differs from ``os_user``."""
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise ConfigurationError(
            f"data directory {path} does not exist",
            hint="restore the data volume first, or pass the right data_directory",
            path=path,
        ) from exc
    try:
        name = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        name = str(st.st_uid)
    if os_user is not None and os_user != name:
        raise ConfigurationError(
            f"data directory {path} belongs to {name!r}, not to os_user {os_user!r}",
            hint="PostgreSQL runs as the data directory's owner: chown the directory "
            "or pass that user as os_user",
            path=path,
        )
    if st.st_uid == 0:
        raise ConfigurationError(
            f"data directory {path} belongs to root; PostgreSQL refuses to run as root",
            hint="chown -R the data directory (and pg_wal, tablespaces) to the "
            "server's OS user, e.g. postgres",
            path=path,
        )
    return Owner(st.st_uid, st.st_gid, name)


def _as_owner_prefix(owner: Owner) -> list[str]:
    euid = os.geteuid()
    if euid == owner.uid:
        return []
    if euid != 0:
        raise ConfigurationError(
            f"cannot run server commands as {owner.name!r} from uid {euid}",
            hint="run pgsnap as the data directory's owner, or as root",
        )
    if shutil.which("runuser"):
        return ["runuser", "-u", owner.name, "--"]
    return ["setpriv", f"--reuid={owner.uid}", f"--regid={owner.gid}", "--init-groups", "--"]


def run_as(
    owner: Owner | None, argv: Sequence[str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (as ``owner`` unless None) and return the finished process.

    ``DatabaseError`` when it cannot be run or does not finish in ``timeout``.
    """
    full = [*(_as_owner_prefix(owner) if owner is not None else []), *argv]
    _log.debug("running %s", shlex.join(full))
    try:
        return subprocess.run(
            full,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise ConfigurationError(
            f"cannot run {full[0]}: not found", hint="check bindir / PATH"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise DatabaseError(
            f"{shlex.join(argv)} did not finish within {timeout:.0f} s", sqlstate=None
        ) from exc


def read_pg_version(data_dir: str) -> int | None:
    """The major version in ``PG_VERSION`` (e.g. 15), or None if unreadable."""
    try:
        with open(os.path.join(data_dir, "PG_VERSION"), encoding="ascii") as f:
            return int(f.read().strip().split(".")[0])
    except (OSError, ValueError):
        return None


def find_bindir(major: int | None) -> str:
    """A directory holding ``pg_ctl`` for ``major`` (Debian, RHEL layouts, then PATH)."""
    candidates: list[str] = []
    if major is not None:
        candidates += [
            f"/usr/lib/postgresql/{major}/bin",
            f"/usr/pgsql-{major}/bin",
            f"/opt/postgresql/{major}/bin",
        ]
    found = shutil.which("pg_ctl")
    if found:
        candidates.append(os.path.dirname(os.path.realpath(found)))
    for cand in candidates:
        if os.access(os.path.join(cand, "pg_ctl"), os.X_OK):
            return cand
    raise ConfigurationError(
        f"cannot find pg_ctl for PostgreSQL {major or '(unknown version)'}",
        hint="pass bindir= (the directory holding pg_ctl and postgres)",
    )


def postmaster_pid(data_dir: str) -> int | None:
    """The pid of a live postmaster on ``data_dir`` (from ``postmaster.pid``), else None.

    ``ConfigurationError`` when ``postmaster.pid`` exists but cannot be read.
    """
    path = os.path.join(data_dir, "postmaster.pid")
    try:
        with open(path, encoding="ascii") as f:
            first = f.readline().strip()
        pid = int(first)
    except PermissionError as exc:
        raise ConfigurationError(
            f"cannot read {path}: permission denied",
            hint="run pgsnap as root or as the data directory's owner",
            path=path,
        ) from exc
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid if _is_postmaster_of(pid, data_dir) else None


def _is_postmaster_of(pid: int, data_dir: str) -> bool:
    """Whether process ``pid`` is a postmaster working in ``data_dir``.

    A ``postmaster.pid`` restored from a snapshot names the process that ran
    when the snapshot was taken; that pid may since belong to anything. The
    postmaster's working directory is its data directory, so compare that
    (Linux ``/proc``); where it cannot be read, fall back to the command name,
    and where nothing can be read, assume it is alive (the safe answer).
    """
    proc = f"/proc/{pid}"
    try:
        with open(f"{proc}/stat", encoding="ascii", errors="replace") as fh:
            if fh.read().rsplit(")", 1)[-1].split()[:1] == ["Z"]:
                return False  # a zombie: dead, its parent just has not reaped it
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        return os.path.realpath(os.readlink(f"{proc}/cwd")) == os.path.realpath(data_dir)
    except FileNotFoundError:
        return False  # the process is gone
    except OSError:
        pass
    try:
        with open(f"{proc}/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0]
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return os.path.basename(argv0).startswith((b"postgres", b"postmaster"))


def atomic_write(path: str, data: bytes, *, owner: Owner, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, chown/chmod, rename, fsync dir."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".pgsnap-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)
            if os.geteuid() == 0:
                os.fchown(f.fileno(), owner.uid, owner.gid)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _remove(path: str, removed: list[str]) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)
    removed.append(path)


def _empty_dir(path: str, removed: list[str], *, keep: Sequence[str] = ()) -> None:
    if not os.path.isdir(path):
        return
    for name in sorted(os.listdir(path)):
        if name in keep:
            continue
        _remove(os.path.join(path, name), removed)


def clean_data_directory(data_dir: str, *, clear_wal: bool, major: int | None) -> tuple[str, ...]:
    """Remove what must not survive into a restored cluster; return the removed paths.

    The server must be stopped (the caller checks). See
    :meth:`pgsnap.adapters.postgres.PostgresAdapter.prepare_data_directory`.
    """
    removed: list[str] = []
    for name in ("postmaster.pid", "postmaster.opts"):
        path = os.path.join(data_dir, name)
        if os.path.lexists(path):
            _remove(path, removed)
    _empty_dir(os.path.join(data_dir, "pg_replslot"), removed)
    for name in _TRANSIENT_DIRS:
        _empty_dir(os.path.join(data_dir, name), removed)
    if clear_wal:
        wal = os.path.join(data_dir, "pg_wal")
        if not os.path.isdir(wal):  # missing, or a dangling symlink
            raise ConfigurationError(
                f"{wal} is missing or points nowhere (is the WAL volume mounted?)",
                hint="restore or mount the WAL volume before preparing the data directory",
                path=wal,
            )
        real = os.path.realpath(wal)
        keep_dirs = {"archive_status"} | ({"summaries"} if (major or 0) >= 17 else set())
        for name in sorted(os.listdir(real)):
            path = os.path.join(real, name)
            if name in keep_dirs and os.path.isdir(path) and not os.path.islink(path):
                _empty_dir(path, removed)
            elif os.path.isdir(path) and not os.path.islink(path):
                _log.warning("leaving unknown directory %s in pg_wal", path)
            else:
                _remove(path, removed)
    return tuple(removed)
