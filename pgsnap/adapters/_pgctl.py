"""Host-side helpers of the PostgreSQL adapter: processes and files of a data directory.

Everything here acts on the database host through a :class:`~pgsnap.host.Host`
(this machine, or another over ssh): finding the server binaries, running
``pg_ctl`` as the data directory's owner (the server itself never runs as
root), checking the postmaster, writing files atomically with the owner's
uid/gid, and cleaning a restored data directory. No psycopg here.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Sequence

from pgsnap._attrs import frozen
from pgsnap.errors import CommandError, ConfigurationError, HostError, HostFileNotFound
from pgsnap.host import CommandResult, FileKind, Host

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


@frozen
class Owner:
    """The OS user owning a data directory (and running its server)."""

    uid: int
    gid: int
    name: str

    @property
    def chown(self) -> str:
        """``uid:gid``, as :meth:`Host.write_atomic` takes an owner."""
        return f"{self.uid}:{self.gid}"


def owner_of(host: Host, path: str, os_user: str | None = None) -> Owner:
    """The owner of ``path``; ``ConfigurationError`` if it is root or differs from ``os_user``."""
    info = host.stat(path)
    if info is None:
        raise ConfigurationError(
            f"data directory {path} does not exist on {host.description}",
            hint="restore the data volume first, or pass the right data_directory",
            path=path,
        )
    name = info.owner
    if os_user is not None and os_user != name:
        raise ConfigurationError(
            f"data directory {path} belongs to {name!r}, not to os_user {os_user!r}",
            hint="PostgreSQL runs as the data directory's owner: chown the directory "
            "or pass that user as os_user",
            path=path,
        )
    if info.uid == 0:
        raise ConfigurationError(
            f"data directory {path} belongs to root; PostgreSQL refuses to run as root",
            hint="chown -R the data directory (and pg_wal, tablespaces) to the "
            "server's OS user, e.g. postgres",
            path=path,
        )
    return Owner(info.uid, info.gid, name)


def run_as(
    host: Host, owner: Owner | None, argv: Sequence[str], *, timeout: float
) -> CommandResult:
    """Run ``argv`` on the host (as ``owner`` unless None) and return the finished command.

    A non-zero exit is the caller's to judge; a program that cannot be
    started is exit status 127; :class:`~pgsnap.errors.CommandTimeout` when it
    does not finish in ``timeout``.
    """
    return host.run(
        list(argv), user=None if owner is None else owner.name, timeout=timeout, check=False
    )


def read_pg_version(host: Host, data_dir: str) -> int | None:
    """The major version in ``PG_VERSION`` (e.g. 15), or None if unreadable."""
    try:
        return int(host.read_text(posixpath.join(data_dir, "PG_VERSION")).strip().split(".")[0])
    except (HostError, ValueError):
        return None


_FIND_BINDIR = r"""
for d in "$@"; do
    if [ -x "$d/pg_ctl" ]; then printf '%s' "$d"; exit 0; fi
done
p=$(command -v pg_ctl) || exit 1
dirname -- "$(readlink -f -- "$p")"
"""


def find_bindir(host: Host, major: int | None) -> str:
    """A directory holding ``pg_ctl`` for ``major`` on the host (Debian, RHEL layouts, PATH)."""
    candidates: list[str] = []
    if major is not None:
        candidates += [
            f"/usr/lib/postgresql/{major}/bin",
            f"/usr/pgsql-{major}/bin",
            f"/opt/postgresql/{major}/bin",
        ]
    result = host.run(["sh", "-c", _FIND_BINDIR, "sh", *candidates], check=False)
    found = result.text.strip()
    if result.ok and found:
        return found
    raise ConfigurationError(
        f"cannot find pg_ctl for PostgreSQL {major or '(unknown version)'} on {host.description}",
        hint="pass bindir= (the directory holding pg_ctl and postgres)",
    )


# Reads postmaster.pid and, if its process lives, prints (NUL-separated) the pid,
# the process state letter, its working directory, its command name and the
# data directory resolved: one round trip per check. Exit 3: no file or no
# such process; exit 4: the file cannot be read or holds no pid.
_POSTMASTER = r"""
f="$1/postmaster.pid"
[ -e "$f" ] || exit 3
IFS= read -r pid < "$f" || exit 4
case "$pid" in ''|*[!0-9]*) exit 4;; esac
[ "$pid" -gt 0 ] && [ -d "/proc/$pid" ] || exit 3
state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)
cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null)
comm=$(cat "/proc/$pid/comm" 2>/dev/null)
[ -n "$cwd$comm" ] || [ -d "/proc/$pid" ] || exit 3
printf '%s\0%s\0%s\0%s\0%s\0' "$pid" "$state" "$cwd" "$comm" "$(readlink -f -- "$1")"
"""


def postmaster_pid(host: Host, data_dir: str) -> int | None:
    """The pid of a live postmaster on ``data_dir`` (from ``postmaster.pid``), else None.

    A ``postmaster.pid`` restored from a snapshot names the process that ran
    when the snapshot was taken; that pid may since belong to anything, or be
    a zombie. The postmaster's working directory is its data directory, so
    that decides (``/proc``); where it cannot be read, the command name does,
    and where nothing can be read the answer is "alive" (the safe one), unless
    the process has gone meanwhile (a short-lived process that had the pid:
    pids wrap at 32768 on a busy machine).
    ``ConfigurationError`` when ``postmaster.pid`` exists but cannot be read.
    """
    result = host.run(["sh", "-c", _POSTMASTER, "sh", data_dir], check=False)
    if result.returncode == 3:
        return None
    if result.returncode == 4 and "Permission denied" in result.error_text:
        raise ConfigurationError(
            f"cannot read {data_dir}/postmaster.pid on {host.description}: permission denied",
            hint="run pgsnap as root or as the data directory's owner",
            path=f"{data_dir}/postmaster.pid",
        )
    if result.returncode == 4:
        return None
    if not result.ok:
        raise result.error(what=f"checking the postmaster of {data_dir}", host=host.description)
    fields = result.stdout.decode("utf-8", "surrogateescape").split("\0")
    pid, state, cwd, comm, real_dir = (fields + [""] * 5)[:5]
    if state == "Z":
        return None  # a zombie: dead, its parent just has not reaped it
    if cwd:
        return int(pid) if cwd == real_dir else None
    if comm:
        return int(pid) if comm.startswith(("postgres", "postmaster")) else None
    return int(pid)


def atomic_write(host: Host, path: str, data: bytes, *, owner: Owner, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` on the host (temp file, fsync, owner, rename, fsync dir)."""
    host.write_atomic(path, data, mode=mode, owner=owner.chown)


def _entries(host: Host, directory: str) -> list[str]:
    """The paths inside ``directory`` (none when it does not exist)."""
    try:
        return [posixpath.join(directory, n) for n in host.list_dir(directory)]
    except HostFileNotFound:
        return []


def _kinds(host: Host, directory: str) -> list[tuple[str, str]]:
    """``(kind letter, name)`` of each entry of ``directory`` in one command
    (``d`` directory, ``f`` file, ``l`` symbolic link...; links are not followed)."""
    result = host.run(
        ["find", directory, "-mindepth", "1", "-maxdepth", "1", "-printf", r"%y %f\0"],
        timeout=300.0,
    )
    records = result.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    return [(r[:1], r[2:]) for r in records]


def clean_data_directory(
    host: Host, data_dir: str, *, clear_wal: bool, major: int | None
) -> tuple[str, ...]:
    """Remove what must not survive into a restored cluster; return the removed paths.

    The server must be stopped (the caller checks). See
    :meth:`pgsnap.adapters.postgres.PostgresAdapter.prepare_data_directory`.
    """
    present = set(host.list_dir(data_dir))
    # standby.signal: a backup taken on a standby holds it; the recovery writes its own
    # signal (a standby built from the backup gets a new one).
    doomed = [
        posixpath.join(data_dir, n) for n in ("postmaster.pid", "postmaster.opts", "standby.signal")
    ]
    doomed = [p for p in doomed if posixpath.basename(p) in present]
    # Emptied, not removed: one listing for them all (a command each was 7 round trips).
    emptied = [
        posixpath.join(data_dir, n) for n in ("pg_replslot", *_TRANSIENT_DIRS) if n in present
    ]
    for directory, names in host.list_dirs(emptied).items():
        doomed += [posixpath.join(directory, n) for n in names or ()]
    if clear_wal:
        wal = posixpath.join(data_dir, "pg_wal")
        info = host.stat(wal)
        if info is None or info.kind is not FileKind.DIRECTORY:  # missing, or dangling link
            raise ConfigurationError(
                f"{wal} is missing or points nowhere (is the WAL volume mounted?)",
                hint="restore or mount the WAL volume before preparing the data directory",
                path=wal,
            )
        real = host.realpath(wal)
        keep_dirs = {"archive_status"} | ({"summaries"} if (major or 0) >= 17 else set())
        for kind, name in _kinds(host, real):
            path = posixpath.join(real, name)
            if kind == "d":
                if name in keep_dirs:
                    doomed += _entries(host, path)
                else:
                    _log.warning("leaving unknown directory %s in pg_wal", path)
            else:
                doomed.append(path)
    if doomed:
        try:
            host.remove(doomed, recursive=True)
        except CommandError:
            _log.exception("could not clean %s", data_dir)
            raise
    return tuple(doomed)
