"""The PostgreSQL adapter: :class:`PostgresAdapter` (psycopg 3, PostgreSQL 12 to 18).

It implements :class:`~pgsnap.protocols.DatabaseAdapter` and runs on the
database host: besides SQL, it stops and starts the server (``pg_ctl`` as the
data directory's owner, or systemd), reads the server log to learn how a
recovery ended, and writes the recovery files into the data directory.

Secrets: a password given in the connection string (``password=...`` or a
URI) or as ``password=`` is kept apart and never appears in ``repr``, logs,
exceptions or files. Driver errors are turned into
:class:`~pgsnap.errors.DatabaseError` (``sqlstate`` set when the server gave
one) with passwords redacted.

This is the only module of pgsnap that imports psycopg.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import posixpath
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import attrs

from pgsnap._attrs import frozen
from pgsnap.adapters import _pgconf, _pgctl, _pglog
from pgsnap.adapters._lazy import psycopg
from pgsnap.errors import (
    BackupFileError,
    BackupModeError,
    ConfigurationError,
    DatabaseError,
    HostError,
    HostFileNotFound,
    ServerRefusedError,
)
from pgsnap.host import FileKind, Host, LocalRunner
from pgsnap.model import (
    LSN,
    ArchiverStatus,
    BackupStart,
    BackupStop,
    CheckpointState,
    RecoverySettings,
    ServerFacts,
    StandbyStatus,
    Tablespace,
    TargetKind,
)

if TYPE_CHECKING:
    from pgsnap.protocols import BackupSession, DatabaseAdapter, PrimaryServer, RecoveryOutcome

__all__ = ["PostgresAdapter", "PostgresBackupSession", "RecoveryResult", "RecoveryState"]

_log = logging.getLogger(__name__)

RecoveryState = Literal["promoted", "paused", "shutdown"]
"""How a recovery ended: promoted (read-write), paused (hot standby), or shut down."""

_POLL: Final = 0.15
_MAX_POLL: Final = 0.2
_UNREACHABLE_AFTER_READY: Final = 30.0
"""Seconds :meth:`PostgresAdapter.wait_recovery` keeps trying to connect to a server
whose log says it ended its recovery and accepts connections, before it says so."""
"""The longest wait between two looks at a recovering server: its end is noticed
within this (a connection and two queries each time)."""
_LOST_HINT: Final = (
    "the backup is void: take a new backup; keep the backup session's connection "
    "direct (no transaction pooler), and check network timeouts and "
    "idle_session_timeout / tcp keepalives between pgsnap and the server"
)
_RECOVERY_NOT_IN_PROGRESS: Final = "55000"
"""SQLSTATE of the pause-state functions once recovery has ended (object not in
prerequisite state: "recovery is not in progress")."""
_DEFAULT_LOG_DIR: Final = "/var/tmp/pgsnap-{owner}"  # noqa: S108 - private to the owner, checked
"""Where the server's log goes by default (a private directory of the server's OS user):
outside every directory of the cluster, so a restore (which rewrites the data volume)
never erases the lines that explain a failure."""


def _mentions(*wanted: str) -> Callable[[_pglog.LogSummary], bool]:
    """A log summary settled once a relevant line mentions one of ``wanted``."""

    def settled(summary: _pglog.LogSummary) -> bool:
        return any(w in line for line in summary.relevant for w in wanted)

    return settled


def _str_tuple(lines: Iterable[str]) -> tuple[str, ...]:
    return tuple(lines)


def _tablespaces(rows: Iterable[tuple[Any, ...]]) -> Any:
    # ServerFacts converts with tuple(); typed Any because of attrs' converter typing.
    return tuple(Tablespace(int(o), str(n), str(loc)) for o, n, loc in rows)


@frozen
class RecoveryResult:
    """What the server did at the end of a recovery (implements ``RecoveryOutcome``).

    ``replay_lsn`` is the last replayed WAL location when known (None after
    a shutdown whose stop point has no LSN and when ``pg_controldata`` is not
    available). ``log_lines`` are the server log's recovery lines (``recovery
    stopping ...``, ``redo done at ...``, ``selected new timeline ID ...``...).
    """

    state: RecoveryState
    reached_target: bool
    timeline: int
    replay_lsn: LSN | None = None
    log_lines: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    last_transaction: str | None = None
    """The last transaction replayed, as the log says it (``transaction 740, time
    2026-11-30 12:00:00.123+00``), or its commit time alone; None: not known."""
    log_path: str | None = None
    """Where the server log is (None: not known)."""


# --------------------------------------------------------------------------- errors


_REFUSALS: Final = (
    ("password authentication failed", "the password is wrong", "password"),
    ("no password supplied", "the server asks for a password and none is configured", "password"),
    ("no pg_hba.conf entry", "no pg_hba.conf line lets this user connect from here", "hba"),
    ("peer authentication failed", "peer authentication failed (OS user and role differ)", "hba"),
    ("ident authentication failed", "ident authentication failed", "hba"),
    ("is not permitted to log in", "the role may not log in", "role"),
    ("does not exist", "the role or database named in conninfo does not exist", "role"),
    ("too many clients already", "every connection slot is taken", "slots"),
    ("connection slots are reserved", "every connection slot is taken", "slots"),
)
"""(fragment of libpq's message, what it means, which advice): a server that answered
this way is up and refuses the connection; waiting does not change that."""

_REFUSAL_HINTS: Final = {
    "password": "give the role's password (password_env or password_file in [database], "
    "or a .pgpass file), or allow the connection without one in pg_hba.conf",
    "hba": "add a pg_hba.conf line for this user from this host, then reload the server",
    "role": "check user= and dbname= in the connection string",
    "slots": "free a connection slot, raise max_connections, or reserve slots "
    "(superuser_reserved_connections / reserved_connections)",
}


def _refusal(text: str) -> tuple[str, str] | None:
    """(what it means, advice key) when libpq's ``text`` says the server refused us."""
    lower = text.lower()
    if "fatal:" not in lower and "fe_sendauth" not in lower:
        return None  # the server never answered (no socket, connection refused, timeout)
    for fragment, meaning, advice in _REFUSALS:
        if fragment in lower:
            return meaning, advice
    return None


def _lost(conn: psycopg.Connection[Any], exc: psycopg.Error) -> bool:
    return (
        conn.broken
        or conn.closed
        or (exc.sqlstate or "").startswith(("08", "57P"))
        or (isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None)
    )


def _message(exc: psycopg.Error, secrets: Sequence[str | None]) -> tuple[str, str | None]:
    """The error's first line and the server's hint, passwords redacted."""
    primary = exc.diag.message_primary
    if not primary:
        lines = str(exc).strip().splitlines()
        primary = lines[0] if lines else type(exc).__name__
    hint = exc.diag.message_hint
    return _pgconf.redact(primary, secrets), (_pgconf.redact(hint, secrets) if hint else None)


_E = TypeVar("_E", bound=DatabaseError)


def _db_error(
    exc: psycopg.Error,
    what: str,
    secrets: Sequence[str | None],
    cls: type[_E] = DatabaseError,  # type: ignore[assignment]
    hint: str | None = None,
) -> _E:
    text, server_hint = _message(exc, secrets)
    return cls(f"{what}: {text}", hint=hint or server_hint, sqlstate=exc.sqlstate)


# --------------------------------------------------------------------------- backup session


class PostgresBackupSession:
    """Backup mode on one dedicated connection; runs one backup, then is done.

    Obtained from :meth:`PostgresAdapter.backup_session`. Use it as a context
    manager: leaving the block closes the connection, and if the backup is
    still running the server aborts it, so the cluster is never left in
    backup mode.
    """

    def __init__(
        self, conn: psycopg.Connection[Any], *, secrets: Sequence[str | None] = ()
    ) -> None:
        self._conn = conn
        self._secrets = tuple(secrets)
        self._version = conn.info.server_version
        self._pid = conn.info.backend_pid
        self._state: Literal["ready", "in_backup", "stopped", "failed", "lost", "closed"] = "ready"

    def __repr__(self) -> str:
        return (
            f"<PostgresBackupSession state={self._state} "
            f"server={self._version} backend_pid={self._pid}>"
        )

    @property
    def state(self) -> str:
        """``ready``, ``in_backup``, ``stopped``, ``failed``, ``lost`` or ``closed``."""
        return self._state

    @property
    def in_backup(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop` (as far as we know)."""
        return self._state == "in_backup"

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        _log.debug("backup session %s: %s %r", self._pid, sql, params)
        row = self._conn.execute(sql, params).fetchone()
        assert row is not None
        return tuple(row)

    def _raise_from(self, exc: psycopg.Error, what: str) -> BackupModeError:
        if _lost(self._conn, exc):
            self._state = "lost"
            self._quiet_close()
            return BackupModeError(
                "backup session lost; the server has aborted the backup",
                hint=_LOST_HINT,
                sqlstate=exc.sqlstate,
            )
        return _db_error(exc, what, self._secrets, BackupModeError)

    def start(self, label: str, *, fast: bool = True) -> BackupStart:
        """Enter backup mode: ``pg_backup_start`` (15+) / ``pg_start_backup(.., false)``.

        ``fast`` requests an immediate checkpoint. Raises ``BackupModeError``
        if this session already ran a backup, if the server refuses
        (``wal_level`` too low, label too long...) or if the session is lost.
        """
        if self._state != "ready":
            raise BackupModeError(
                f"this backup session cannot start a backup (state: {self._state})",
                hint="use a new session from adapter.backup_session() for each backup",
                sqlstate=None,
            )
        try:
            (lsn,) = self._one(_pgconf.backup_start_sql(self._version), (label, fast))
        except psycopg.Error as exc:
            raise self._raise_from(exc, "cannot enter backup mode") from exc
        self._state = "in_backup"
        try:
            timeline, now = self._one("SELECT timeline_id, now() FROM pg_control_checkpoint()")
        except psycopg.Error as exc:
            err = self._raise_from(exc, "backup started but its timeline cannot be read")
            self.close()  # aborts the backup: never leave the server in backup mode
            raise err from exc
        _log.info("backup mode on at %s (timeline %s), label %r", lsn, timeline, label)
        return BackupStart(lsn=LSN.parse(lsn), timeline=int(timeline), time=now)

    def stop(self) -> BackupStop:
        """Leave backup mode without waiting for the archive; return label and map.

        ``BackupModeError`` if no backup runs in this session or the session
        was lost (the server has then aborted the backup).
        """
        if self._state == "lost":
            raise BackupModeError(
                "backup session lost; the server has aborted the backup",
                hint=_LOST_HINT,
                sqlstate=None,
            )
        if self._state != "in_backup":
            raise BackupModeError(
                f"no backup is running in this session (state: {self._state})",
                hint="call start() first",
                sqlstate=None,
            )
        # One statement: the label must never be lost to a failing follow-up query.
        sql = _pgconf.backup_stop_sql(self._version)
        try:
            lsn, labelfile, spcmapfile, now, timeline = self._one(sql)
        except psycopg.Error as exc:
            err = self._raise_from(exc, "cannot leave backup mode")
            if not self._conn.closed:  # not lost: still connected
                # The backup is void either way; closing makes the server abort it
                # now, so it is never left in backup mode.
                self._state = "failed"
                self._quiet_close()
            raise err from exc
        self._state = "stopped"
        _log.info("backup mode off at %s", lsn)
        return BackupStop(
            lsn=LSN.parse(lsn),
            labelfile=labelfile,
            spcmapfile=spcmapfile or "",
            time=now,
            timeline=int(timeline),
        )

    def _quiet_close(self) -> None:
        try:
            self._conn.close()
        except psycopg.Error:  # pragma: no cover - close does not normally fail
            _log.debug("error closing backup session", exc_info=True)

    def close(self) -> None:
        """Close the connection; a running backup is aborted by the server. Idempotent."""
        if self._state == "in_backup":
            _log.warning(
                "closing backup session %s while in backup mode: the server aborts the backup",
                self._pid,
            )
        self._quiet_close()
        if self._state in ("ready", "in_backup", "stopped", "failed"):
            self._state = "closed"

    def __enter__(self) -> PostgresBackupSession:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --------------------------------------------------------------------------- log following


class _LogFollower:
    """Reads a server log on the host from an offset onwards, following the logging collector."""

    def __init__(self, host: Host, path: str, offset: int, data_dir: str | None) -> None:
        self.host = host
        self.path = path
        self.offset = offset
        self.data_dir = data_dir
        self.lines: list[str] = []
        """The lines a recovery summary reads (:func:`_pglog.summarize`): FATAL and
        PANIC lines with their DETAIL and HINT, and the recovery's LOG lines; the
        rest (a line per restored segment...) is not kept, so each poll costs what
        is new, not the whole log again."""
        self.tail: collections.deque[str] = collections.deque(maxlen=200)
        """The last lines of every kind (for error messages)."""
        self.restored = 0
        """How many WAL files ``restore_command`` brought back (``restored log file``)."""
        self.last_restored: str | None = None
        self._in_fatal = False
        self._partial = b""
        self._collector_start: dict[str, int] = {}
        self._switched = False
        if data_dir is not None:
            current = self._collector_file()
            if current is not None:
                self._collector_start[current] = _size(host, current)

    def _collector_file(self) -> str | None:
        if self.data_dir is None:
            return None
        try:
            text = self.host.read_text(posixpath.join(self.data_dir, "current_logfiles"))
        except HostError:
            return None
        for line in text.splitlines():
            kind, _, name = line.strip().partition(" ")
            if kind == "stderr" and name:
                return name if posixpath.isabs(name) else posixpath.join(self.data_dir, name)
        return None

    def read_new(self) -> list[str]:
        """New complete lines since the last call (also kept in :attr:`lines`)."""
        new = self._read()
        if not self._switched and any(
            "redirecting log output to logging collector process" in ln for ln in new
        ):
            target = self._collector_file()
            if target is not None:
                _log.debug("server log redirected to %s", target)
                self._switched = True
                self.path = target
                self.offset = self._collector_start.get(target, 0)
                self._partial = b""
                new += self._read()
        self._keep(new)
        return new

    def _keep(self, new: list[str]) -> None:
        for raw in new:
            self.tail.append(raw)
            parsed = _pglog.parse_line(raw.rstrip("\r\n"))
            if parsed is None:
                continue
            severity, message = parsed
            if severity in ("DETAIL", "HINT"):
                if self._in_fatal:
                    self.lines.append(raw)
                continue
            if message.startswith('restored log file "'):
                self.restored += 1
                self.last_restored = message.split('"')[1]
            self._in_fatal = severity in ("FATAL", "PANIC")
            if self._in_fatal or (severity == "LOG" and message.startswith(_pglog.RELEVANT)):
                self.lines.append(raw)

    def _read(self) -> list[str]:
        try:
            data = self.host.read_bytes(self.path, offset=self.offset)
        except HostError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        return [c.decode("utf-8", "replace") for c in complete]


def _size(host: Host, path: str) -> int:
    try:
        info = host.stat(path)
    except HostError:
        return 0
    return 0 if info is None else info.size


_STARTUP_MARK = "starting PostgreSQL "


def last_startup_offset(host: Host, path: str) -> int:
    """Offset of the line where the server last started (``starting PostgreSQL ...``).

    Lets a new process (resuming an interrupted recovery) read the log of the
    server start an earlier process made. 0 when the log has no such line.
    """
    result = host.run(["grep", "-a", "-b", "-F", "--", _STARTUP_MARK, path], check=False)
    if not result.ok:
        return 0  # no such line (1), or no such file (2)
    last = result.stdout.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    offset, _, _ = last.partition(b":")
    return int(offset) if offset.isdigit() else 0


# --------------------------------------------------------------------------- adapter


_CHECKPOINT_SETTINGS: Final = [
    "checkpoint_timeout",
    "checkpoint_completion_target",
    "max_wal_size",
    "wal_segment_size",
]


def _wal_checkpoint_bytes(settings: Mapping[str, str], target: float) -> int | None:
    """WAL past the redo point at which PostgreSQL begins a checkpoint: its
    ``CheckPointSegments`` (``max_wal_size`` in segments / (1 + the completion
    target), at least 1), less one segment, as ``XLogCheckpointNeeded`` counts."""
    try:
        max_wal_mb = int(settings["max_wal_size"])
        segment = int(settings["wal_segment_size"])
    except (KeyError, ValueError):
        return None
    if segment <= 0:
        return None
    segments = max(1, int(max_wal_mb * 1024 * 1024 // segment / (1.0 + target)))
    return (segments - 1) * segment


class PostgresAdapter:
    """One PostgreSQL 12 to 18 cluster on this host (implements ``DatabaseAdapter``).

    ``conninfo`` is a libpq connection string or URI. ``data_directory`` is
    needed for server control and file operations; :meth:`describe` learns it
    from a running server. ``bindir`` holds ``pg_ctl`` (default: found from
    the data directory's ``PG_VERSION``). ``os_user`` is the data directory's
    owner, who runs the server (default: the owner). ``log_file`` is where
    the server's stderr goes (``pg_ctl -l``; default
    ``/var/tmp/pgsnap-<owner>/server-<data directory>.log``, outside the
    cluster's volumes); with ``control="systemd"``
    it is the log to read (if any). ``host`` is the database host the server
    runs on (default: this machine): every command, file and process of the
    server goes through it, so the same adapter drives a remote host over ssh
    (``Host(SshRunner(...))``) while SQL goes over libpq.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        password: str | None = None,
        data_directory: str | None = None,
        bindir: str | None = None,
        os_user: str | None = None,
        log_file: str | None = None,
        control: Literal["pg_ctl", "systemd"] = "pg_ctl",
        systemd_unit: str | None = None,
        connect_timeout: float = 10,
        host: Host | None = None,
    ) -> None:
        # Parsed on first use (psycopg is imported only then: commands that never
        # talk to the server do not pay for it).
        self._unparsed: str | None = conninfo
        self._given_password = password
        self._password: str | None = password
        self._conninfo = ""
        self._display = ""
        if control not in ("pg_ctl", "systemd"):
            raise ConfigurationError(f"unknown control {control!r}", hint="use pg_ctl or systemd")
        if control == "systemd" and not systemd_unit:
            raise ConfigurationError(
                "control='systemd' needs systemd_unit",
                hint="e.g. systemd_unit='postgresql@15-main'",
            )
        self._host = host or Host()
        self._data_directory = posixpath.normpath(data_directory) if data_directory else None
        if self._data_directory is not None and not posixpath.isabs(self._data_directory):
            raise ConfigurationError(
                f"data_directory {data_directory!r} is not an absolute path",
                hint="give the data directory's absolute path on the database host",
            )
        self._learnt_data_directory: str | None = None
        self._config_file: str | None = None
        self._version_num: int | None = None
        self._bindir = bindir
        self._os_user = os_user
        self._log_file = log_file
        self._control: Literal["pg_ctl", "systemd"] = control
        self._unit = systemd_unit
        self._connect_timeout = connect_timeout
        self._follower: _LogFollower | None = None
        self._settings: RecoverySettings | None = None
        self._replayed: tuple[str | None, str | None] = (None, None)
        self._connect_error: str | None = None

    def _parse_conninfo(self) -> None:
        """Parse the connection string (once); ``ConfigurationError`` if it cannot be."""
        if self._unparsed is None:
            return
        params, parse_failed = self._parse(self._unparsed)
        if parse_failed:
            raise ConfigurationError(
                "cannot parse the connection string",
                hint="use 'host=... port=... user=... dbname=...' or a postgresql:// URI",
            )
        conn_password = params.pop("password", None)
        if self._given_password is None:
            self._password = conn_password
        self._conninfo = psycopg.conninfo.make_conninfo("", **params)
        self._display = " ".join(
            f"{k}={params[k]}"
            for k in ("host", "hostaddr", "port", "user", "dbname")
            if k in params
        )
        self._unparsed = None  # it may hold the password: not kept

    @staticmethod
    def _parse(conninfo: str) -> tuple[dict[str, Any], bool]:
        # The driver's parse error may quote the string (and its password):
        # never chain it.
        try:
            return dict(psycopg.conninfo.conninfo_to_dict(conninfo)), False
        except psycopg.Error:
            pass
        return {}, True

    def __repr__(self) -> str:
        data = self.data_directory or "?"
        shown = "(not parsed yet)" if self._unparsed is not None else self._display or "default"
        return (
            f"<PostgresAdapter {shown} data={data} control={self._control} "
            f"host={self._host.description}>"
        )

    @property
    def host(self) -> Host:
        """The database host: where the server's files, processes and mounts are."""
        return self._host

    @property
    def os_user(self) -> str | None:
        """The OS user configured to run the server (None: the data directory's owner)."""
        return self._os_user

    @property
    def data_directory(self) -> str | None:
        """The data directory (given, or learnt by :meth:`describe`), or None."""
        return self._data_directory or self._learnt_data_directory

    @property
    def bindir(self) -> str | None:
        """Directory of the server binaries (given, or found for ``PG_VERSION``), or None."""
        if self._bindir:
            return self._bindir
        dd = self.data_directory
        major = _pgctl.read_pg_version(self._host, dd) if dd else None
        if major is None and self._version_num is not None:
            major = self._version_num // 10000
        if major is None:
            return None
        try:
            return _pgctl.find_bindir(self._host, major)
        except ConfigurationError:
            return None

    @property
    def _secrets(self) -> tuple[str | None, ...]:
        self._parse_conninfo()
        return (self._password,)

    # ------------------------------------------------------------------ SQL plumbing

    def _connect(
        self, *, timeout: float | None = None, application_name: str = "pgsnap", **extra: Any
    ) -> psycopg.Connection[Any]:
        self._parse_conninfo()
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(2, math.ceil(timeout or self._connect_timeout)),
            "application_name": application_name,
            **extra,
        }
        if self._password is not None:
            kwargs["password"] = self._password
        _log.debug("connecting to %s", self._display or "(libpq defaults)")
        try:
            return psycopg.connect(self._conninfo, **kwargs)
        except psycopg.Error as exc:
            refused = _refusal(str(exc))
            if refused is not None:
                text, _hint = _message(exc, self._secrets)
                raise ServerRefusedError(
                    f"the server is up but refuses pgsnap's connection "
                    f"({self._display or 'libpq defaults'}): {refused[0]} ({text})",
                    hint=_REFUSAL_HINTS[refused[1]],
                    sqlstate=exc.sqlstate,
                    cause=refused[1],
                ) from exc
            raise _db_error(
                exc,
                "cannot connect to PostgreSQL",
                self._secrets,
                hint="check that the server runs and the connection string",
            ) from exc

    def _rows(
        self, conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()
    ) -> list[tuple[Any, ...]]:
        _log.debug("SQL: %s %r", sql, params)
        try:
            # No parameters: the text is sent as it is (a '%' in a user's check is no
            # placeholder).
            cur = conn.execute(sql, params or None)
            return cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            hint = (
                "grant the role pg_monitor (describe, archiver_status) and EXECUTE on "
                "the backup functions, or use a superuser"
                if exc.sqlstate == "42501"
                else None
            )
            raise _db_error(exc, "query failed", self._secrets, hint=hint) from exc

    def _one(
        self, conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()
    ) -> tuple[Any, ...]:
        rows = self._rows(conn, sql, params)
        return rows[0]

    # ------------------------------------------------------------------ observe

    def describe(self) -> ServerFacts:
        """Version, system identifier, directories, settings, timeline, checkpoint.

        ``timeline`` is the server's current WAL timeline (on a standby: the
        last restartpoint's). ``settings`` values are ``pg_settings.setting``
        (numbers in the setting's base unit: ``archive_timeout`` in seconds).
        Remembers the data directory and ``config_file`` for later calls.
        """
        with self._connect() as conn:
            version = conn.info.server_version
            data_dir, config_file, in_recovery, sysid, replay_lsn = self._one(
                conn,
                "SELECT current_setting('data_directory'), current_setting('config_file'), "
                "pg_is_in_recovery(), (SELECT system_identifier::text FROM pg_control_system()), "
                "pg_last_wal_replay_lsn()::text",
            )
            ckpt_tli, ckpt_lsn, redo_lsn = self._one(
                conn,
                "SELECT timeline_id, checkpoint_lsn::text, redo_lsn::text "
                "FROM pg_control_checkpoint()",
            )
            seg_setting, seg_unit = self._one(
                conn, "SELECT setting, unit FROM pg_settings WHERE name = 'wal_segment_size'"
            )
            settings = dict(
                self._rows(
                    conn,
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                    (list(_pgconf.server_settings(version)),),
                )
            )
            spaces = self._rows(
                conn,
                "SELECT oid::bigint, spcname::text, pg_tablespace_location(oid) FROM pg_tablespace "
                "WHERE spcname NOT IN ('pg_default', 'pg_global') ORDER BY oid",
            )
            current_lsn = None
            timeline = int(ckpt_tli)
            standby = None
            if not in_recovery:
                current_lsn, walfile = self._one(
                    conn,
                    "SELECT pg_current_wal_lsn()::text, pg_walfile_name(pg_current_wal_lsn())",
                )
                timeline = int(walfile[:8], 16)
            else:
                standby = self._standby_status(conn)
        self._check_data_directory(data_dir)
        self._learnt_data_directory = data_dir
        self._config_file = config_file
        self._version_num = version
        return ServerFacts(
            version_num=version,
            system_identifier=sysid,
            data_directory=data_dir,
            wal_directory=self._host.realpath(posixpath.join(data_dir, "pg_wal")),
            wal_segment_size=_pgconf.bytes_from_setting(seg_setting, seg_unit),
            timeline=timeline,
            checkpoint_lsn=LSN.parse(ckpt_lsn),
            redo_lsn=LSN.parse(redo_lsn),
            current_lsn=None if current_lsn is None else LSN.parse(current_lsn),
            in_recovery=bool(in_recovery),
            tablespaces=_tablespaces(spaces),
            settings={k: "" if v is None else str(v) for k, v in settings.items()},
            replay_lsn=None if replay_lsn is None else LSN.parse(replay_lsn),
            standby=standby,
        )

    def _standby_status(self, conn: psycopg.Connection[Any]) -> StandbyStatus:
        """A standby's replication, from ``pg_stat_wal_receiver`` and the control file."""
        pid, receiver, sender_host, sender_port, slot, received, replayed, when, fpw = self._one(
            conn,
            "SELECT r.pid, r.status, r.sender_host, r.sender_port, r.slot_name, "
            "pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text, "
            "pg_last_xact_replay_timestamp(), "
            "(SELECT full_page_writes FROM pg_control_checkpoint()) "
            "FROM (SELECT 1) one LEFT JOIN pg_stat_wal_receiver r ON true",
        )
        sender = "" if not sender_host else f"{sender_host}:{sender_port}"
        if pid is not None and receiver is None:
            receiver = ""  # it runs, but this role may not see its state
        return StandbyStatus(
            receiver=None if receiver is None else str(receiver),
            sender=sender,
            receive_lsn=None if received is None else LSN.parse(received),
            replay_lsn=None if replayed is None else LSN.parse(replayed),
            replay_time=when,
            full_page_writes=fpw is not False,
            slot_name=str(slot or ""),
        )

    def _check_data_directory(self, reported: str) -> None:
        if self._data_directory is None:
            return
        if reported == self._data_directory:
            return
        if self._host.realpath(reported) != self._host.realpath(self._data_directory):
            raise ConfigurationError(
                f"the server runs on data directory {reported}, "
                f"not on {self._data_directory} as configured",
                hint="fix data_directory= or the connection string: they name different clusters",
            )

    def archiver_status(self) -> ArchiverStatus:
        """The ``pg_stat_archiver`` row, archiving settings and the oldest ``.ready`` age.

        ``oldest_ready_age_seconds`` is None when no file waits, or when the
        role may not call ``pg_ls_archive_statusdir()`` (superuser or
        ``pg_monitor`` needed).
        """
        with self._connect() as conn:
            version = conn.info.server_version
            row = self._one(
                conn,
                "SELECT archived_count, last_archived_wal, last_archived_time, failed_count, "
                "last_failed_wal, last_failed_time FROM pg_stat_archiver",
            )
            settings = dict(
                self._rows(
                    conn,
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                    (list(_pgconf.archiver_settings(version)),),
                )
            )
            age: float | None = None
            sql = (
                "SELECT extract(epoch FROM now() - min(modification))::float8 "
                "FROM pg_ls_archive_statusdir() WHERE name LIKE '%%.ready'"
            )
            _log.debug("SQL: %s", sql)
            try:
                found = conn.execute(sql).fetchone()
                age = None if found is None or found[0] is None else max(0.0, float(found[0]))
            except psycopg.errors.InsufficientPrivilege:
                _log.debug("no privilege for pg_ls_archive_statusdir(); ready age unknown")
            except psycopg.Error as exc:
                raise _db_error(exc, "cannot list archive_status", self._secrets) from exc
        archived_count, last_wal, last_time, failed_count, failed_wal, failed_time = row
        return ArchiverStatus(
            archived_count=int(archived_count),
            last_archived_wal=last_wal,
            last_archived_time=last_time,
            failed_count=int(failed_count),
            last_failed_wal=failed_wal,
            last_failed_time=failed_time,
            wal_level=settings.get("wal_level", ""),
            archive_mode=settings.get("archive_mode", ""),
            archive_command=settings.get("archive_command") or "",
            archive_library=settings.get("archive_library") or "",
            oldest_ready_age_seconds=age,
        )

    def checkpoint_state(self) -> CheckpointState:
        """The last checkpoint (or restartpoint) and what schedules the next one."""
        with self._connect() as conn:
            redo, when, now, insert = self._one(
                conn,
                "SELECT redo_lsn::text, checkpoint_time, clock_timestamp(), CASE WHEN "
                "pg_is_in_recovery() THEN NULL ELSE pg_current_wal_insert_lsn()::text END "
                "FROM pg_control_checkpoint()",
            )
            settings = dict(
                self._rows(
                    conn,
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                    (_CHECKPOINT_SETTINGS,),
                )
            )
        target = float(settings.get("checkpoint_completion_target", 0.9))
        return CheckpointState(
            redo_lsn=LSN.parse(redo),
            time=when,
            timeout_seconds=float(settings.get("checkpoint_timeout", 300)),
            completion_target=target,
            read_at=now,
            insert_lsn=None if insert is None else LSN.parse(insert),
            wal_checkpoint_bytes=_wal_checkpoint_bytes(settings, target),
        )

    # ------------------------------------------------------------------ backup mode

    def backup_session(self) -> PostgresBackupSession:
        """A new dedicated connection for backup mode (not yet in backup mode).

        TCP keepalives on, ``statement_timeout`` and (14+) ``idle_session_timeout``
        off, ``application_name`` 'pgsnap backup'. Never shared; close it
        (or use ``with``).
        """
        conn = self._connect(
            application_name="pgsnap backup",
            keepalives=1,
            keepalives_idle=10,
            keepalives_interval=5,
            keepalives_count=3,
        )
        try:
            if conn.info.server_version >= 140000:
                self._rows(conn, "SET idle_session_timeout = 0")
            self._rows(conn, "SET statement_timeout = 0")
            self._rows(conn, "SET idle_in_transaction_session_timeout = 0")
        except BaseException:
            conn.close()
            raise
        return PostgresBackupSession(conn, secrets=self._secrets)

    # ------------------------------------------------------------------ server control

    def _require_data_directory(self) -> str:
        dd = self.data_directory
        if dd is None:
            raise ConfigurationError(
                "the data directory is unknown",
                hint="pass data_directory= to PostgresAdapter, or call describe() "
                "while the server runs",
            )
        return dd

    def _owner(self, dd: str) -> _pgctl.Owner:
        return _pgctl.owner_of(self._host, dd, self._os_user)

    def _pg_bin(self, dd: str, program: str) -> str:
        bindir = self._bindir or _pgctl.find_bindir(
            self._host, _pgctl.read_pg_version(self._host, dd)
        )
        return posixpath.join(bindir, program)

    def _postmaster_alive(self, dd: str) -> bool:
        return _pgctl.postmaster_pid(self._host, dd) is not None

    def is_running(self) -> bool:
        """True when the server runs.

        With a known data directory this is whether its postmaster lives (no
        connection is made: a server that refuses pgsnap, or listens on
        another port than ``conninfo`` says, still runs). Otherwise a
        connection is tried; a server that answers and refuses it runs.
        """
        dd = self.data_directory
        if dd is not None:
            try:
                return self._postmaster_alive(dd)
            except ConfigurationError:
                pass  # cannot read postmaster.pid: ask the server
        try:
            conn = self._connect(timeout=2)
        except ServerRefusedError:
            return True
        except DatabaseError:
            return False
        conn.close()
        return True

    def listening_port(self) -> int | None:
        """The port the running server listens on, from ``postmaster.pid`` (None:
        not known). Lets a check tell a wrong ``port=`` from a stopped server."""
        dd = self.data_directory
        if dd is None:
            return None
        try:
            text = self._host.read_text(posixpath.join(dd, "postmaster.pid"))
        except HostError:
            return None
        lines = text.splitlines()
        return int(lines[3]) if len(lines) > 3 and lines[3].strip().isdigit() else None

    def _systemctl(self, *args: str, timeout: float) -> None:
        assert self._unit is not None
        proc = _pgctl.run_as(self._host, None, ["systemctl", *args, self._unit], timeout=timeout)
        if proc.returncode != 0:
            raise DatabaseError(
                f"systemctl {' '.join(args)} {self._unit} failed ({proc.returncode}): "
                f"{proc.error_text[-1000:]}",
                hint=f"see journalctl -u {self._unit}",
                sqlstate=None,
            )

    def stop_server(self, *, timeout: float = 120.0) -> None:
        """Stop the server (fast shutdown) and wait; no-op when already stopped.

        ``pg_ctl -m fast -w stop`` as the data directory's owner (``runuser``
        when pgsnap runs as root), or ``systemctl stop``.
        """
        dd = self._require_data_directory()
        if not self._postmaster_alive(dd):
            _log.info("server on %s already stopped", dd)
            return
        if self._control == "systemd":
            self._systemctl("stop", timeout=timeout + 15)
            self._wait_postmaster_gone(dd, timeout)
            return
        owner = self._owner(dd)
        argv = [
            self._pg_bin(dd, "pg_ctl"),
            "-D",
            dd,
            "-m",
            "fast",
            "-w",
            "-t",
            str(max(1, int(timeout))),
            "stop",
        ]
        _log.info("stopping server on %s", dd)
        proc = _pgctl.run_as(self._host, owner, argv, timeout=timeout + 15)
        if proc.returncode != 0 and self._postmaster_alive(dd):
            raise DatabaseError(
                f"pg_ctl stop failed ({proc.returncode}): {proc.error_text or proc.text.strip()}",
                hint="a server that does not stop in time may be finishing a checkpoint; "
                "retry with a longer timeout",
                sqlstate=None,
            )

    def _wait_postmaster_gone(self, dd: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._postmaster_alive(dd):
            if time.monotonic() > deadline:
                raise DatabaseError(
                    f"server on {dd} still running after {timeout} s", sqlstate=None
                )
            time.sleep(_POLL)

    def _log_path(self, dd: str) -> str:
        if self._log_file:
            return self._log_file
        slug = dd.strip("/").replace("/", "_") or "root"
        directory = _DEFAULT_LOG_DIR.format(owner=self._owner(dd).name)
        return posixpath.join(directory, f"server-{slug}.log")

    def start_server(self, *, timeout: float = 120.0) -> None:
        """Start the server; return once the postmaster is up (it may still recover).

        ``pg_ctl -W -l <log_file> start`` as the owner (or ``systemctl start
        --no-block``), then waits for ``postmaster.pid`` of a live process.
        Also returns when the server already ran and exited by itself (a
        ``shutdown`` recovery target): :meth:`wait_recovery` says what
        happened. The log position is remembered so :meth:`wait_recovery`
        reads only this run's lines. Raises ``DatabaseError`` (with the log's
        FATAL lines) if the server fails to start. No-op when running.
        """
        dd = self._require_data_directory()
        if self._postmaster_alive(dd):
            _log.info("server on %s already running", dd)
            return
        log_path = self._log_path(dd)
        if self._control == "systemd":
            self._follower = (
                _LogFollower(self._host, log_path, _size(self._host, log_path), dd)
                if self._log_file
                else None
            )
            self._systemctl("start", "--no-block", timeout=60)
        else:
            owner = self._owner(dd)
            self._ensure_log_dir(log_path, owner)
            self._follower = _LogFollower(self._host, log_path, _size(self._host, log_path), dd)
            argv = [self._pg_bin(dd, "pg_ctl"), "-D", dd, "-l", log_path, "-W", "start"]
            _log.info("starting server on %s (log %s)", dd, log_path)
            proc = _pgctl.run_as(self._host, owner, argv, timeout=60)
            if proc.returncode != 0:
                raise DatabaseError(
                    f"pg_ctl start failed ({proc.returncode}): "
                    f"{proc.error_text or proc.text.strip()}",
                    hint=f"see the server log {log_path}",
                    sqlstate=None,
                    log_lines=self._log_tail(),
                )
        deadline = time.monotonic() + timeout
        while True:
            if self._postmaster_alive(dd):
                return
            summary = self._summary()
            if summary.shutdown_at_target or summary.shut_down or summary.has_target is not None:
                # It ran (recovery began) and already exited: wait_recovery says how.
                return
            if summary.fatal:
                # FATAL before recovery began and no postmaster: it cannot start.
                raise self._recovery_failed(summary, "the server failed to start")
            if time.monotonic() > deadline:
                raise DatabaseError(
                    f"the server on {dd} did not start within {timeout} s",
                    hint=f"see the server log {log_path}",
                    sqlstate=None,
                    log_lines=self._log_tail(),
                )
            time.sleep(_POLL / 2)

    def _ensure_log_dir(self, log_path: str, owner: _pgctl.Owner) -> None:
        directory = posixpath.dirname(log_path)
        info = self._host.stat(directory, follow=False)
        if info is None:
            self._host.make_dirs(directory, mode=0o700, owner=owner.chown)
        elif self._log_file is None and (
            info.kind is not FileKind.DIRECTORY or info.uid != owner.uid or info.mode & 0o022
        ):
            # Our default directory, made by someone else: never log into it.
            raise ConfigurationError(
                f"the server log directory {directory} exists but is not a directory of "
                f"{owner.name!r} that only it can write to",
                hint="remove it, or pass log_file= (a file outside the cluster's volumes)",
                path=directory,
            )

    def _summary(self) -> _pglog.LogSummary:
        if self._follower is None:
            return _pglog.LogSummary()
        self._follower.read_new()
        return _pglog.summarize(self._follower.lines)

    def _log_tail(self, count: int = 30) -> tuple[str, ...]:
        if self._follower is None:
            return ()
        self._follower.read_new()
        return _pglog.tail(list(self._follower.tail), count)

    def _recovery_failed(self, summary: _pglog.LogSummary, what: str) -> DatabaseError:
        fatal = " | ".join(line.strip() for line in summary.fatal) or "(no FATAL line in the log)"
        dd = self.data_directory
        stopped = dd is not None and not self._postmaster_alive(dd)
        state = "; the server has stopped" if stopped else "; the server is still running"
        log_path = self._follower.path if self._follower else None
        where = f" (its log: {log_path})" if log_path else ""
        hint = "; ".join(summary.hints) or (f"see the server log {log_path}" if log_path else None)
        what = what + state + where
        return DatabaseError(
            f"{what}: {fatal}",
            hint=hint,
            sqlstate=None,
            log_lines=summary.relevant + tuple(summary.fatal),
        )

    # ------------------------------------------------------------------ recovery

    def _follow_log(self) -> None:
        """Read the log from the server's last start when this process did not start it
        (a resumed recovery)."""
        dd = self.data_directory
        if self._follower is None and dd is not None and self._control == "pg_ctl":
            path = self._log_path(dd)
            self._follower = _LogFollower(
                self._host, path, last_startup_offset(self._host, path), dd
            )

    def wait_recovery(
        self,
        *,
        timeout: float = 600.0,
        on_progress: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> RecoveryResult:
        """Wait until recovery ends (promoted, paused or shut down) and say how.

        Polls the server (``pg_is_in_recovery()``, the replay pause state)
        and reads the server log written since :meth:`start_server`. Raises
        ``DatabaseError`` when the log shows a known recovery failure (the
        FATAL lines in the message, advice in the hint), when the server
        exits without reaching its target, or after ``timeout`` seconds;
        :class:`~pgsnap.errors.ServerRefusedError` at once when the server is
        up but refuses the connection (its ``recovery_ended`` says whether
        the log shows the recovery over). ``on_progress`` hears of each WAL
        file restored and of the replay position as it moves.
        """
        dd = self.data_directory
        self._follow_log()
        deadline = time.monotonic() + timeout
        interval = _POLL
        reported: tuple[object, ...] = ()
        self._replayed = (None, None)
        unreachable_since: float | None = None
        while True:
            summary = self._summary()
            if summary.known_fatal:
                raise self._recovery_failed(summary, "recovery failed")
            alive = True
            if dd is not None:
                try:
                    alive = self._postmaster_alive(dd)
                except ConfigurationError:
                    alive = True
            if not alive:
                time.sleep(_POLL)  # let the last lines reach the log
                summary = self._summary()
                if summary.shutdown_at_target:
                    return self._shutdown_result(dd, summary)
                raise self._recovery_failed(summary, "the server exited before recovery ended")
            try:
                outcome = self._poll_server(summary)
            except ServerRefusedError as exc:
                raise self._refused(exc) from exc
            if outcome is not None:
                return outcome
            if summary.ended and self._connect_error is not None:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > _UNREACHABLE_AFTER_READY:
                    raise DatabaseError(
                        "the server's log says its recovery ended and it accepts "
                        f"connections, but pgsnap cannot connect to it ({self._display}): "
                        f"{self._connect_error}",
                        hint="check that it listens where pgsnap connects (port, "
                        "listen_addresses, a firewall or port forward between pgsnap and "
                        "its host)",
                        sqlstate=None,
                        log_lines=summary.relevant,
                    )
            else:
                unreachable_since = None
            if on_progress is not None:
                reported = self._report_progress(on_progress, reported)
            if time.monotonic() > deadline:
                follower = self._follower
                restored = 0 if follower is None else follower.restored
                replay, _when = self._replayed
                where = f"; replayed to {replay}" if replay else ""
                raise DatabaseError(
                    f"recovery did not end within {timeout} s ({restored} WAL files "
                    f"restored from the archive{where})",
                    hint="recovery may just be slow (WAL to replay, restore_command speed): "
                    "wait longer, or read the server log"
                    + (f" {follower.path}" if follower is not None else ""),
                    sqlstate=None,
                    log_lines=summary.relevant,
                )
            time.sleep(interval)
            interval = min(_MAX_POLL, interval * 1.2)  # long recoveries: fewer connections

    def _report_progress(
        self,
        on_progress: Callable[[str, Mapping[str, object]], None],
        reported: tuple[object, ...],
    ) -> tuple[object, ...]:
        """Tell ``on_progress`` what moved since ``reported``; return what was told."""
        follower = self._follower
        restored = 0 if follower is None else follower.restored
        last = None if follower is None else follower.last_restored
        replay, when = self._replayed
        now = (restored, replay)
        if now == reported:
            return reported
        parts = []
        if restored:
            parts.append(f"{restored} WAL files restored from the archive (last {last})")
        if replay:
            parts.append(f"replayed to {replay}" + (f" (a transaction of {when})" if when else ""))
        if parts:
            on_progress(
                "; ".join(parts),
                {
                    "segments_restored": restored,
                    "last_restored": last,
                    "replay_lsn": replay,
                    "last_replayed_transaction_time": when,
                },
            )
        return now

    def _refused(self, exc: ServerRefusedError) -> ServerRefusedError:
        """The error of a recovery the server went through but pgsnap cannot look at."""
        # "ready to accept connections", not "... read-only connections": a hot standby
        # says that first, while its recovery goes on (and the refusal may come then).
        # Both lines are needed (``LogSummary.ended``), and the first comes ~10 ms before
        # the second: waiting for either one read the log between them (a CI failure).
        summary = self._settle_log(lambda s: s.ended, wait=5.0)
        ended = summary.ended
        log_path = None if self._follower is None else self._follower.path
        if ended:
            state = (
                "recovery ended: the server promoted"
                + (f" to timeline {summary.new_timeline}" if summary.new_timeline else "")
                + " and accepts connections"
            )
        else:
            state = "the server accepts connections (its log does not show the recovery over)"
        return ServerRefusedError(
            f"{state}, but refuses pgsnap's: {exc.message}",
            hint=(exc.hint or "")
            + "; then check the recovered server yourself"
            + (f" (its log: {log_path})" if log_path else ""),
            sqlstate=exc.sqlstate,
            cause=getattr(exc, "cause", None),
            recovery_ended=ended,
            log_lines=summary.relevant,
        )

    def recovery_ended(self) -> bool | None:
        """Whether the log shows the recovery started last over (promoted, or shut
        down at its target); None when there is no log to read."""
        self._follow_log()
        if self._follower is None:
            return None
        return self._summary().ended

    def stored_system_identifier(self) -> str | None:
        """The system identifier in ``global/pg_control`` (its first 8 bytes, in the
        byte order of the machine that wrote it: little-endian on x86 and ARM)."""
        dd = self._require_data_directory()
        try:
            head = self._host.read_bytes(posixpath.join(dd, "global", "pg_control"), limit=8)
        except HostFileNotFound:
            return None
        if len(head) < 8:
            return None
        return str(int.from_bytes(head, "little"))

    def _poll_server(self, summary: _pglog.LogSummary) -> RecoveryResult | None:
        self._connect_error = None
        try:
            conn = self._connect(timeout=2)
        except ServerRefusedError:
            raise
        except DatabaseError as exc:
            self._connect_error = exc.message
            return None  # not accepting connections yet (or any more)
        try:
            found = None
            for _attempt in range(3):
                try:
                    found = self._server_state(conn)
                    break
                except DatabaseError as exc:
                    if exc.sqlstate and exc.sqlstate.startswith(("08", "57P")):
                        return None  # the server went away between two queries
                    if exc.sqlstate != _RECOVERY_NOT_IN_PROGRESS:
                        raise
                    # Recovery ended between pg_is_in_recovery() and the question about
                    # the pause: the server has just promoted. Ask again: a promotion
                    # is success, never a failure to undo.
                    _log.debug("recovery ended while its state was read; reading again")
        finally:
            conn.close()
        if found is None:
            return None
        state, replay, timeline = found
        if state == "promoted":
            summary = self._settle_log(_mentions("archive recovery complete", "ready to accept"))
        elif state == "paused" and summary.stop_line is None:
            # The server logs "recovery stopping ..." before it pauses, but the line
            # may reach the file after the pause is seen (a loaded machine): wait for it.
            summary = self._settle_log(_mentions("recovery stopping "), wait=5.0)
        lsn = (
            LSN.parse(replay)
            if replay
            else (LSN.parse(summary.redo_done_lsn) if summary.redo_done_lsn else None)
        )
        _when = self._replayed[1]
        return RecoveryResult(
            state=state,
            reached_target=self._reached(state, summary),
            timeline=int(timeline),
            replay_lsn=lsn,
            log_lines=summary.relevant,
            last_transaction=summary.last_transaction or (f"at {_when}" if _when else None),
            log_path=None if self._follower is None else self._follower.path,
        )

    def _server_state(
        self, conn: psycopg.Connection[Any]
    ) -> tuple[RecoveryState, str | None, int] | None:
        """(state, last replayed LSN, timeline) of a server that ended recovery, or None
        (the replay position is then remembered for progress reports).

        ``DatabaseError`` with SQLSTATE 55000 when recovery ends between the
        queries (the caller asks again).
        """
        version = conn.info.server_version
        in_recovery, replayed, when = self._one(
            conn,
            "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, "
            "pg_last_xact_replay_timestamp()::text",
        )
        self._replayed = (replayed, when)
        if not in_recovery:
            replay, walfile = self._one(
                conn,
                "SELECT pg_last_wal_replay_lsn()::text, pg_walfile_name(pg_current_wal_lsn())",
            )
            return "promoted", replay, int(walfile[:8], 16)
        (paused,) = self._one(conn, _pgconf.replay_pause_sql(version))
        if not paused:
            return None
        replay, timeline = self._one(
            conn,
            "SELECT pg_last_wal_replay_lsn()::text, greatest("
            "(SELECT min_recovery_end_timeline FROM pg_control_recovery()), "
            "(SELECT timeline_id FROM pg_control_checkpoint()))",
        )
        return "paused", replay, int(timeline)

    def _settle_log(
        self, settled: Callable[[_pglog.LogSummary], bool], wait: float = 2.0
    ) -> _pglog.LogSummary:
        """Re-read the log briefly until its summary is ``settled``."""
        deadline = time.monotonic() + wait
        summary = self._summary()
        while self._follower is not None and time.monotonic() < deadline:
            if settled(summary):
                break
            time.sleep(0.05)
            summary = self._summary()
        return summary

    def _reached(self, state: RecoveryState, summary: _pglog.LogSummary) -> bool:
        if summary.stop_line is not None:
            return True
        if state != "promoted":
            return False
        if summary.has_target is not None:
            return not summary.has_target  # no target: the end of WAL was the goal
        # No log to read: trust what we wrote.
        if self._settings is not None:
            return self._settings.target.kind is TargetKind.LATEST
        _log.warning("cannot tell whether the recovery target was reached (no server log)")
        return False

    def _shutdown_result(self, dd: str | None, summary: _pglog.LogSummary) -> RecoveryResult:
        control = self._controldata(dd) if dd is not None else {}
        timeline = 0
        for key in ("Min recovery ending loc's timeline", "Latest checkpoint's TimeLineID"):
            value = control.get(key, "0")
            if value.isdigit() and int(value) > 0:
                timeline = int(value)
                break
        if timeline == 0 and summary.start_timeline is not None:
            timeline = summary.start_timeline
        replay = summary.stopped_lsn
        min_rec = control.get("Minimum recovery ending location")
        if replay is None and min_rec and min_rec != "0/0":
            replay = min_rec
        return RecoveryResult(
            state="shutdown",
            reached_target=True,
            timeline=timeline,
            replay_lsn=LSN.parse(replay) if replay else None,
            log_lines=summary.relevant,
            last_transaction=summary.last_transaction,
            log_path=None if self._follower is None else self._follower.path,
        )

    def _controldata(self, dd: str) -> dict[str, str]:
        try:
            program = self._pg_bin(dd, "pg_controldata")
            proc = _pgctl.run_as(self._host, self._owner(dd), [program, "-D", dd], timeout=30)
        except (ConfigurationError, DatabaseError, HostError):
            _log.debug("pg_controldata unavailable", exc_info=True)
            return {}
        if not proc.ok:  # not installed (the npm builds have none), or it failed
            _log.debug("pg_controldata: %s", proc.error_text)
            return {}
        out: dict[str, str] = {}
        for line in proc.text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                out[key.strip()] = value.strip()
        return out

    # ------------------------------------------------------------------ files

    def _refuse_running(self, dd: str, what: str) -> None:
        if self._postmaster_alive(dd):
            raise ConfigurationError(
                f"cannot {what}: the server on {dd} is running",
                hint="stop the server first (stop_server())",
            )

    def write_recovery_settings(self, settings: RecoverySettings) -> None:
        """Write the settings and ``recovery.signal``, replacing stale targets.

        In ``postgresql.auto.conf``: removes ``restore_command`` and every
        ``recovery_target*`` line, and an earlier pgsnap block, then appends a
        marked block with ``settings.lines()``. In ``postgresql.conf`` (the
        server's ``config_file`` when :meth:`describe` learnt it): comments
        out active ``recovery_target*`` lines with ``#pgsnap-disabled# ``.
        Creates ``recovery.signal``. Files are written atomically as the data
        directory's owner (new files mode 0600). ``ConfigurationError`` if the
        server runs, or ``standby.signal`` / ``recovery.conf`` exists.
        """
        dd = self._require_data_directory()
        self._refuse_running(dd, "write recovery settings")
        if self._host.exists(posixpath.join(dd, "standby.signal")):
            raise ConfigurationError(
                f"{dd}/standby.signal exists: the server would start as a standby, "
                "ignoring the recovery target",
                hint="remove standby.signal for a point-in-time recovery "
                "(keep it only to build a standby)",
            )
        if self._host.exists(posixpath.join(dd, "recovery.conf")):
            raise ConfigurationError(
                f"{dd}/recovery.conf exists; PostgreSQL 12+ refuses to start with it",
                hint="move its settings to postgresql.auto.conf and delete it",
            )
        owner = self._owner(dd)
        auto = posixpath.join(dd, "postgresql.auto.conf")
        try:
            new = _pgconf.rewrite_auto_conf(_read_text(self._host, auto), settings.lines())
        except ValueError as exc:
            raise ConfigurationError(
                str(exc), hint="recovery settings cannot contain line breaks"
            ) from exc
        _write_text(self._host, auto, new, owner)
        conf = self._config_file or posixpath.join(dd, "postgresql.conf")
        if self._host.exists(conf):
            text = _read_text(self._host, conf)
            disabled = _pgconf.disable_recovery_targets(text)
            if disabled != text:
                _log.warning("disabling stale recovery_target* lines in %s", conf)
                _write_text(self._host, conf, disabled, _file_owner(self._host, conf))
        _pgctl.atomic_write(self._host, posixpath.join(dd, "recovery.signal"), b"", owner=owner)
        self._settings = settings
        _log.info("recovery settings written to %s: %s", dd, settings.target)

    def clear_recovery_settings(self) -> None:
        """Remove pgsnap's block (and any ``recovery_target*``) from ``postgresql.auto.conf``
        and ``recovery.signal``; idempotent.

        Lines of ``postgresql.conf`` disabled by :meth:`write_recovery_settings`
        stay disabled (stale targets are never wanted back).
        """
        dd = self._require_data_directory()
        auto = posixpath.join(dd, "postgresql.auto.conf")
        if self._host.exists(auto):
            text = _read_text(self._host, auto)
            cleared = _pgconf.clear_auto_conf(text)
            if cleared != text:
                _write_text(self._host, auto, cleared, self._owner(dd))
        self._host.remove([posixpath.join(dd, "recovery.signal")])
        _log.info("recovery settings cleared in %s", dd)

    def prepare_data_directory(self, *, clear_wal: bool) -> tuple[str, ...]:
        """Clean a restored data directory before recovery; return the removed paths.

        Removes ``postmaster.pid``, ``postmaster.opts``, ``standby.signal`` (a
        backup taken on a standby holds it), ``pg_replslot/*`` and
        the contents of ``pg_dynshmem``, ``pg_notify``, ``pg_serial``,
        ``pg_snapshots``, ``pg_stat_tmp``, ``pg_subtrans``. With ``clear_wal``
        also the files in ``pg_wal`` (the symlink followed), emptying
        ``archive_status/`` (and ``summaries/`` on 17+) but keeping them.
        ``ConfigurationError`` if the server runs.
        """
        dd = self._require_data_directory()
        self._refuse_running(dd, "prepare the data directory")
        major = _pgctl.read_pg_version(self._host, dd)
        removed = _pgctl.clean_data_directory(self._host, dd, clear_wal=clear_wal, major=major)
        _log.info("prepared %s: removed %d entries", dd, len(removed))
        return removed

    def write_backup_label(self, labelfile: str, spcmapfile: str) -> None:
        """Write ``backup_label`` (and ``tablespace_map`` when non-empty) byte for byte.

        As the data directory's owner, mode 0600, atomically. A stale
        ``tablespace_map`` is removed when ``spcmapfile`` is empty.
        ``BackupFileError`` for a label that is not a ``backup_label``;
        ``ConfigurationError`` if the server runs.
        """
        if not labelfile.startswith("START WAL LOCATION:"):
            raise BackupFileError(
                "the label text is not a backup_label (it must start with 'START WAL LOCATION:')",
                hint="pass the labelfile returned at backup stop, unchanged",
            )
        dd = self._require_data_directory()
        self._refuse_running(dd, "write backup_label")
        owner = self._owner(dd)
        _pgctl.atomic_write(
            self._host, posixpath.join(dd, "backup_label"), labelfile.encode("utf-8"), owner=owner
        )
        spcmap = posixpath.join(dd, "tablespace_map")
        if spcmapfile:
            _pgctl.atomic_write(self._host, spcmap, spcmapfile.encode("utf-8"), owner=owner)
        elif self._host.stat(spcmap, follow=False) is not None:
            _log.warning("removing stale %s", spcmap)
            self._host.remove([spcmap])

    # ------------------------------------------------------------------ other instances (clones)

    def instance(
        self,
        *,
        data_directory: str,
        port: int,
        socket_directory: str,
        log_file: str | None = None,
        host: Host | None = None,
    ) -> PostgresAdapter:
        """An adapter for another PostgreSQL instance run with the same binaries (at the
        same paths) by the same OS user, as the same role (and password): a clone's
        server on ``data_directory``, on ``host`` (default: this adapter's).
        Nothing is checked or started.

        It is reached on ``port``: through the Unix socket in ``socket_directory`` when
        pgsnap is on its machine (this adapter reaches its own server through a
        socket, or ``host`` is another machine pgsnap runs on); else over TCP, at this
        adapter's address on its own host, at the ssh destination on another host."""
        params = dict(psycopg.conninfo.conninfo_to_dict(self._conninfo_text()))
        address = self._instance_address(params, host)
        for key in ("host", "hostaddr", "port", "service"):
            params.pop(key, None)
        if address is None:
            params["host"] = socket_directory
        else:
            params.update(address)
        params["port"] = str(port)
        conninfo = psycopg.conninfo.make_conninfo("", **params)
        bindir = self._bindir
        if bindir is None and self.data_directory is not None:
            bindir = _pgctl.find_bindir(
                self._host, _pgctl.read_pg_version(self._host, self.data_directory)
            )
        os_user = self._os_user
        if os_user is None and self.data_directory is not None:
            os_user = self._owner(self.data_directory).name
        return PostgresAdapter(
            conninfo,
            password=self._password,
            data_directory=data_directory,
            bindir=bindir,
            os_user=os_user,
            log_file=log_file,
            connect_timeout=self._connect_timeout,
            host=self._host if host is None else host,
        )

    def _instance_address(
        self, params: Mapping[str, Any], host: Host | None
    ) -> dict[str, str] | None:
        """The TCP address parameters another instance is reached at (None: its socket)."""
        if host is None or host is self._host or host.name == self._host.name:
            if self._tcp_address(params) is None:
                return None
            return {k: str(params[k]) for k in ("host", "hostaddr") if params.get(k)} or {
                "host": str(self._tcp_address(params))
            }
        if isinstance(host.runner, LocalRunner):
            return None
        destination = str(getattr(host.runner, "destination", "") or host.name)
        return {"host": destination.rpartition("@")[2]}

    def _conninfo_text(self) -> str:
        self._parse_conninfo()
        return self._conninfo

    @staticmethod
    def _tcp_address(params: Mapping[str, Any]) -> str | None:
        """The TCP host a connection's parameters reach (the first of a list), or None
        for a Unix socket (libpq's default when no host is given)."""
        for key in ("hostaddr", "host"):
            value = str(params.get(key) or os.environ.get(f"PG{key.upper()}", "")).split(",")[0]
            if value and not value.startswith(("/", "@")):
                return value
        return None

    def instance_listen_addresses(self, host: Host | None = None) -> str:
        """Where another instance (on ``host``, default: this adapter's) must listen for
        :meth:`instance` to reach it: ``""`` (its Unix socket only) when it is reached
        through its socket; on this adapter's host, the server's own
        ``listen_addresses`` (it is reached at the same address, on its own port;
        ``DatabaseError`` when the server does not answer: give the clone's
        ``listen_addresses`` yourself then); on another host, ``*``."""
        params = psycopg.conninfo.conninfo_to_dict(self._conninfo_text())
        if self._instance_address(params, host) is None:
            return ""
        if host is not None and host is not self._host and host.name != self._host.name:
            return "*"
        (value,) = self.query("SHOW listen_addresses")[0]
        return str(value)

    def query(
        self, sql: str, params: Sequence[Any] = (), *, dbname: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` (autocommit, with ``params`` for its ``%s``) in database ``dbname``
        (default: the connection's) and return its rows; ``DatabaseError`` if it fails."""
        extra: dict[str, Any] = {} if dbname is None else {"dbname": dbname}
        with self._connect(**extra) as conn:
            return self._rows(conn, sql, params)

    def prepare_clone_directory(self, tablespaces: Mapping[str, str]) -> tuple[str, ...]:
        """Make a cloned data directory its own, before its server first starts.

        A ``pg_wal`` that is a symbolic link (to the origin's WAL volume) is replaced
        by an empty directory, never followed; a ``pg_wal`` directory is emptied (the
        clone reads its WAL from the archive). Every ``pg_tblspc`` link is pointed at
        ``tablespaces[oid]`` (the clone's copy of that tablespace) or, when the
        clone has none, removed. Then the data directory is cleaned as
        :meth:`prepare_data_directory` (postmaster.pid, temporary state). Returns
        what was replaced or removed. ``ConfigurationError`` if its server runs, or
        if it holds no ``postgresql.conf`` (the origin's configuration lives
        elsewhere: not supported for clones).
        """
        dd = self._require_data_directory()
        self._refuse_running(dd, "prepare a clone's data directory")
        owner = self._owner(dd)
        if not self._host.exists(posixpath.join(dd, "postgresql.conf")):
            raise ConfigurationError(
                f"the cloned data directory {dd} holds no postgresql.conf: the cluster's "
                "configuration lives outside its data directory",
                hint="clones need postgresql.conf inside the data directory (as initdb "
                "makes it); Debian's /etc/postgresql layout is not supported for clones yet",
                path=dd,
            )
        changed: list[str] = []
        wal = posixpath.join(dd, "pg_wal")
        info = self._host.stat(wal, follow=False)
        if info is not None and info.kind is FileKind.SYMLINK:
            self._host.remove([wal])
            changed.append(wal)
        major = _pgctl.read_pg_version(self._host, dd)
        if info is None or info.kind is FileKind.SYMLINK:
            subdirs = ("archive_status", "summaries") if (major or 0) >= 17 else ("archive_status",)
            for path in (wal, *(posixpath.join(wal, d) for d in subdirs)):
                self._host.make_dirs(path, owner=owner.chown)
        spc = posixpath.join(dd, "pg_tblspc")
        for oid in self._host.list_dir(spc) if self._host.exists(spc) else ():
            link = posixpath.join(spc, oid)
            self._host.remove([link])
            changed.append(link)
            if oid in tablespaces:
                self._host.run(
                    ["ln", "-s", "--", tablespaces[oid], link], check=True, user=owner.name
                )
        changed += _pgctl.clean_data_directory(self._host, dd, clear_wal=True, major=major)
        _log.info("prepared the clone's data directory %s (%d entries)", dd, len(changed))
        return tuple(changed)

    def write_instance_settings(self, parameters: Mapping[str, str]) -> None:
        """Set ``parameters`` in ``postgresql.auto.conf`` (a marked block after every
        other line, so they win; earlier lines of the same names are removed).
        ``ConfigurationError`` if the server runs."""
        dd = self._require_data_directory()
        self._refuse_running(dd, "write settings")
        auto = posixpath.join(dd, "postgresql.auto.conf")
        try:
            new = _pgconf.set_instance_parameters(_read_text(self._host, auto), parameters)
        except ValueError as exc:
            raise ConfigurationError(str(exc), hint="settings cannot contain line breaks") from exc
        _write_text(self._host, auto, new, self._owner(dd))

    def write_standby_settings(self, parameters: Mapping[str, str]) -> None:
        """Make the data directory start as a standby: ``parameters`` (``primary_conninfo``,
        ``primary_slot_name``, ``restore_command``...) as :meth:`write_instance_settings`
        sets them, ``standby.signal`` created and ``recovery.signal`` removed.
        ``ConfigurationError`` if the server runs."""
        dd = self._require_data_directory()
        self._refuse_running(dd, "write standby settings")
        self.write_instance_settings(parameters)
        owner = self._owner(dd)
        self._host.remove([posixpath.join(dd, "recovery.signal")])
        _pgctl.atomic_write(self._host, posixpath.join(dd, "standby.signal"), b"", owner=owner)
        _log.info("standby settings written to %s", dd)


def _read_text(host: Host, path: str) -> str:
    try:
        return host.read_text(path)
    except HostFileNotFound:
        return ""


def _file_owner(host: Host, path: str) -> _pgctl.Owner:
    info = host.stat(path)
    if info is None:
        raise HostFileNotFound(f"{path} does not exist on {host.description}", path=path)
    return _pgctl.Owner(info.uid, info.gid, info.owner)


def _write_text(host: Host, path: str, text: str, owner: _pgctl.Owner) -> None:
    info = host.stat(path)
    mode = 0o600 if info is None else info.mode & 0o777
    _pgctl.atomic_write(host, path, text.encode("utf-8", "surrogateescape"), owner=owner, mode=mode)


if TYPE_CHECKING:  # static proof that the classes fit the protocols

    def _is_adapter(a: PostgresAdapter) -> DatabaseAdapter:
        return a

    def _is_session(s: PostgresBackupSession) -> BackupSession:
        return s

    def _is_primary(a: PostgresAdapter) -> PrimaryServer:
        return a

    def _is_outcome(r: RecoveryResult) -> RecoveryOutcome:
        return r
