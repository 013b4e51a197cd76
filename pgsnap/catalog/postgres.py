"""The catalog in a PostgreSQL database: one catalog shared by several backup servers.

:class:`PostgresCatalog` keeps the records of :class:`~pgsnap.protocols.Catalog`
(backups, with their pins; safety snapshots, clones, drills) for one cluster,
named by ``cluster``, in tables that many clusters share. It also keeps their
cluster lock (:class:`PostgresClusterLock`): an advisory lock held by a
session of its own for the length of a plan, so that two backup servers cannot
run conflicting plans on one cluster, and a server that dies releases its
locks with its session.

The schema is created and upgraded only by :func:`migrate` (``pgsnap catalog
migrate``), never implicitly: a catalog whose database has no schema, or a
newer one than this pgsnap knows, is refused with the reason.

Records are stored as the JSON documents a directory catalog writes
(:func:`~pgsnap.model.to_dict`), with the columns a fleet queries beside them
(state, timeline, start time). A row that does not decode is an
:class:`~pgsnap.catalog.UnreadableEntry` of :meth:`PostgresCatalog.scan`, as a
damaged file is in a directory catalog.

What is not kept here: the executor's journals stay in each backup server's
journal directory (the lock's holder row says which plan and which step a
server was running, and where its journal is); the WAL index stays local too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar

from pgsnap._attrs import frozen
from pgsnap.catalog import CatalogScan, UnreadableEntry, is_valid_backup_id
from pgsnap.errors import (
    BackupNotFound,
    CatalogError,
    ClusterLockedError,
    ExecutionError,
    LockLostError,
)
from pgsnap.locks import Lease, LockHolder, LockMode
from pgsnap.model import (
    BackupRecord,
    BackupState,
    CloneRecord,
    DrillRecord,
    SafetySnapshot,
    from_dict,
    to_dict,
)

if TYPE_CHECKING:
    import psycopg

    from pgsnap.planner.expiry import RetentionPolicy

__all__ = [
    "SCHEMA_VERSION",
    "ExpiryForecast",
    "FleetBackup",
    "PostgresCatalog",
    "PostgresClusterLock",
    "migrate",
    "schema_version",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 2
"""The version of the catalog's tables this pgsnap reads and writes."""

_R = TypeVar("_R")
_SCHEMA_RE_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")

_MIGRATIONS: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    (
        1,
        "clusters, backups, named records (safety snapshots, clones, drills), lock holders",
        (
            "CREATE TABLE clusters ("
            " id serial PRIMARY KEY,"
            " name text NOT NULL UNIQUE,"
            " created_at timestamptz NOT NULL DEFAULT now())",
            "CREATE TABLE backups ("
            " cluster_id integer NOT NULL REFERENCES clusters (id),"
            " id text NOT NULL,"
            " system_identifier text NOT NULL,"
            " state text NOT NULL,"
            " timeline integer,"
            " start_time timestamptz NOT NULL,"
            " record jsonb NOT NULL,"
            " written_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (cluster_id, id))",
            "CREATE INDEX backups_by_start ON backups (cluster_id, start_time, id)",
            "CREATE INDEX backups_newest_done ON backups"
            " (cluster_id, timeline, start_time DESC) WHERE state = 'done'",
            "CREATE TABLE named_records ("
            " cluster_id integer NOT NULL REFERENCES clusters (id),"
            " kind text NOT NULL CHECK (kind IN ('safety', 'clone', 'drill')),"
            " name text NOT NULL,"
            " sort_time timestamptz NOT NULL,"
            " backup_id text,"
            " record jsonb NOT NULL,"
            " PRIMARY KEY (cluster_id, kind, name))",
            "CREATE INDEX named_records_drills ON named_records"
            " (cluster_id, sort_time) WHERE kind = 'drill'",
            "CREATE TABLE lock_holders ("
            " token text PRIMARY KEY,"
            " cluster_id integer NOT NULL REFERENCES clusters (id),"
            " backend_pid integer NOT NULL,"
            " holder jsonb NOT NULL,"
            " step text NOT NULL DEFAULT '',"
            " updated_at timestamptz NOT NULL DEFAULT now())",
        ),
    ),
    (
        2,
        "what retention asks of a backup, as columns: when it is consistent, its pin, "
        "its copies (fleet-wide expiry forecasts without decoding records)",
        (
            "ALTER TABLE backups ADD COLUMN consistent_at timestamptz,"
            " ADD COLUMN pinned boolean NOT NULL DEFAULT false,"
            " ADD COLUMN pinned_until timestamptz,"
            " ADD COLUMN copies integer NOT NULL DEFAULT 0",
            # From the records pgsnap wrote: the stop time, or the start time where the
            # record has none (not finished) or one that does not read as a time.
            "UPDATE backups SET"
            " consistent_at = CASE WHEN record->>'stop_time' ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T'"
            " THEN (record->>'stop_time')::timestamptz ELSE start_time END,"
            " pinned = jsonb_typeof(record->'pin') = 'object',"
            " pinned_until = CASE WHEN record->'pin'->>'until' ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T'"
            " THEN (record->'pin'->>'until')::timestamptz END,"
            " copies = CASE WHEN jsonb_typeof(record->'copies') = 'array'"
            " THEN jsonb_array_length(record->'copies') ELSE 0 END",
            "ALTER TABLE backups ALTER COLUMN consistent_at SET NOT NULL",
            "CREATE INDEX backups_by_consistency ON backups"
            ' (cluster_id, state, consistent_at DESC, id COLLATE "C" DESC)'
            " INCLUDE (pinned, pinned_until, copies)",
        ),
    ),
)
"""Each migration: its version, what it does, its statements (run with the schema as
the search path, in one transaction with its version row)."""

_TRY_LOCK: Final[Mapping[LockMode, str]] = {
    LockMode.SHARED: "SELECT pg_try_advisory_lock_shared(hashtext(%s), %s)",
    LockMode.EXCLUSIVE: "SELECT pg_try_advisory_lock(hashtext(%s), %s)",
}
"""The lock's key is two integers: the schema's name hashed, and the cluster's id."""

_KIND_OF: Final[Mapping[type[Any], str]] = {
    SafetySnapshot: "safety",
    CloneRecord: "clone",
    DrillRecord: "drill",
}
_KIND_NAMES: Final = {"safety": "safety snapshot", "clone": "clone", "drill": "drill"}
_KIND_HINTS: Final = {
    "safety": "list them with `pgsnap safety list`",
    "clone": "list them with `pgsnap clone list`",
    "drill": "list them with `pgsnap drill list`",
}


def _check_schema_name(schema: str) -> str:
    if (
        not isinstance(schema, str)
        or not schema
        or len(schema) > 63
        or not set(schema) <= _SCHEMA_RE_CHARS
        or schema[0].isdigit()
    ):
        raise CatalogError(
            f"the catalog schema name {schema!r} is not a plain lower-case identifier",
            hint="use letters a-z, digits and '_' (default: pgsnap)",
        )
    return schema


def _check_cluster_name(cluster: str) -> str:
    if not is_valid_backup_id(cluster):
        raise CatalogError(
            f"the catalog's cluster name {cluster!r} is not a name",
            hint="1-128 letters, digits, '.', '_' or '-', e.g. the cluster's host name",
        )
    return cluster


def _where(conninfo: str) -> str:
    """Where the catalog database is, for messages: host, port and database, never a
    password (``conninfo`` is parsed by libpq's rules)."""
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - psycopg on use

    try:
        parts = conninfo_to_dict(conninfo)
    except Exception:  # a malformed conninfo is reported when connecting
        return "the catalog database"
    host = str(parts.get("host") or "local socket")
    port = f":{parts['port']}" if parts.get("port") else ""
    dbname = str(parts.get("dbname") or parts.get("user") or "")
    return f"{host}{port}/{dbname}"


def _connect(
    conninfo: str, password: str | None, timeout: float, what: str, schema: str
) -> psycopg.Connection[Any]:
    """A connection in autocommit whose search path is the catalog's schema (every
    statement names its tables unqualified: no SQL is built from text)."""
    import psycopg  # noqa: PLC0415 - psycopg on use

    extra: dict[str, Any] = {"connect_timeout": max(1, round(timeout))}
    if password is not None:
        extra["password"] = password
    try:
        conn = psycopg.connect(
            conninfo, autocommit=True, application_name=f"pgsnap {what}", **extra
        )
        conn.execute("SELECT set_config('search_path', %s, false)", (f'"{schema}"',))
        return conn
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if password:
            reason = reason.replace(password, "***")
        raise CatalogError(
            f"cannot connect to the catalog database {_where(conninfo)}: {reason}",
            hint="check [catalog] conninfo and the password (password_env or password_file), "
            "and that the server accepts connections from this host",
        ) from None


def schema_version(conn: psycopg.Connection[Any], schema: str = "pgsnap") -> int:
    """The catalog schema's version in the database of ``conn`` (0: none yet)."""
    from psycopg import sql  # noqa: PLC0415 - psycopg on use

    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", ("schema_version",))
    exists = row.fetchone()
    if not exists or not exists[0]:
        return 0
    found = conn.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_version").format(
            sql.Identifier(schema)
        )
    )
    value = found.fetchone()
    return int(value[0]) if value else 0


def migrate(
    conninfo: str,
    *,
    password: str | None = None,
    schema: str = "pgsnap",
    connect_timeout: float = 10.0,
    dry_run: bool = False,
) -> tuple[tuple[int, str], ...]:
    """Bring the catalog schema in the database to :data:`SCHEMA_VERSION`.

    Each missing migration runs in one transaction with its version row, under an
    advisory transaction lock (two migrators wait for each other, and the second
    finds nothing to do). Returns the migrations applied (or, with ``dry_run``,
    the ones that would be). A schema newer than this pgsnap's is refused.
    """
    schema = _check_schema_name(schema)
    conn = _connect(conninfo, password, connect_timeout, "catalog migrate", schema)
    try:
        return _migrate(conn, schema, dry_run=dry_run)
    finally:
        conn.close()


def _migrate(
    conn: psycopg.Connection[Any], schema: str, *, dry_run: bool
) -> tuple[tuple[int, str], ...]:
    import psycopg  # noqa: PLC0415 - psycopg on use
    from psycopg import sql  # noqa: PLC0415

    applied: list[tuple[int, str]] = []
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{schema} migrate",))
            current = schema_version(conn, schema)
            if current > SCHEMA_VERSION:
                raise CatalogError(
                    f"the catalog schema {schema} is at version {current}, newer than this "
                    f"pgsnap knows ({SCHEMA_VERSION})",
                    hint="upgrade pgsnap on this backup server to the version that migrated it",
                )
            todo = [m for m in _MIGRATIONS if m[0] > current]
            if dry_run:
                return tuple((v, what) for v, what, _sql in todo)
            if current == 0:
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
                conn.execute(
                    "CREATE TABLE schema_version ("
                    " version integer PRIMARY KEY,"
                    " description text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now(),"
                    " applied_by text NOT NULL)"
                )
            for version, what, statements in todo:
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, description, applied_by)"
                    " VALUES (%s, %s, %s)",
                    (version, what, f"pgsnap on {os.uname().nodename}"),
                )
                applied.append((version, what))
                log.info("catalog schema %s: migration %d applied (%s)", schema, version, what)
    except psycopg.Error as exc:
        raise CatalogError(
            f"the catalog migration failed, nothing was changed: {str(exc).strip()}",
            hint="the catalog's role needs CREATE on the database (or on the schema)",
        ) from None
    return tuple(applied)


@frozen
class FleetBackup:
    """One cluster's row of a fleet query: its name, its newest DONE backup (None:
    none) and when its last drill finished (None: never drilled)."""

    cluster: str
    newest: BackupRecord | None
    last_drill: dt.datetime | None


class PostgresCatalog:
    """The :class:`~pgsnap.protocols.Catalog` of the cluster ``cluster`` in the
    PostgreSQL database ``conninfo`` (tables in ``schema``), shared with every backup
    server and every cluster that uses the same database.

    ``password`` is given apart from ``conninfo`` (never put one in ``conninfo``:
    it would be shown where the conninfo is). Nothing connects until the first
    call; the connection is kept and opened again when it was lost. The schema
    must have been created by :func:`migrate` (``pgsnap catalog migrate``).
    """

    def __init__(
        self,
        conninfo: str,
        cluster: str,
        *,
        password: str | None = None,
        schema: str = "pgsnap",
        connect_timeout: float = 10.0,
    ) -> None:
        self.conninfo = conninfo
        self.cluster = _check_cluster_name(cluster)
        self.schema = _check_schema_name(schema)
        self.connect_timeout = connect_timeout
        self._password = password
        self._conn: psycopg.Connection[Any] | None = None
        self._mutex = threading.RLock()
        self._cluster_id: int | None = None
        self._checked = False
        self._lock = PostgresClusterLock(self)
        self.on_unreadable: Callable[[UnreadableEntry], None] | None = None
        """What :meth:`list` does with an unreadable row it leaves out: None (the
        default) logs a warning (as :attr:`DirectoryCatalog.on_unreadable
        <pgsnap.catalog.DirectoryCatalog.on_unreadable>`)."""

    def __repr__(self) -> str:
        return f"PostgresCatalog({_where(self.conninfo)!r}, cluster={self.cluster!r})"

    @property
    def where(self) -> str:
        """The catalog for messages: database and cluster, never a password."""
        return f"{_where(self.conninfo)} schema {self.schema}, cluster {self.cluster}"

    def connect(self, what: str) -> psycopg.Connection[Any]:
        """A new connection to the catalog database (the caller closes it)."""
        return _connect(self.conninfo, self._password, self.connect_timeout, what, self.schema)

    def migrate(self, *, dry_run: bool = False) -> tuple[tuple[int, str], ...]:
        """:func:`migrate` this catalog's database and schema (``pgsnap catalog
        migrate``): the migrations applied, or with ``dry_run`` to apply."""
        applied = migrate(
            self.conninfo,
            password=self._password,
            schema=self.schema,
            connect_timeout=self.connect_timeout,
            dry_run=dry_run,
        )
        self._checked = False
        return applied

    def close(self) -> None:
        """Close the kept connection (a later call opens another)."""
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def cluster_lock(self) -> PostgresClusterLock:
        """The lock of this catalog's cluster, shared by every backup server that
        uses this catalog database (:class:`PostgresClusterLock`)."""
        return self._lock

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection[Any]]:
        """The kept connection, checked once for the schema's version; a database
        error becomes a CatalogError (and a lost connection is dropped, to be opened
        again by the next call)."""
        import psycopg  # noqa: PLC0415 - psycopg on use

        with self._mutex:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = self.connect("catalog")
                # Closed with this object at the latest (a caller that never calls close()).
                weakref.finalize(self, self._conn.close)
            conn = self._conn
            try:
                if not self._checked:
                    self._check_version(conn)
                yield conn
            except psycopg.OperationalError as exc:
                self._conn = None
                conn.close()
                raise CatalogError(
                    f"lost the catalog database {_where(self.conninfo)}: "
                    f"{str(exc).strip() or type(exc).__name__}",
                    hint="check that the catalog's PostgreSQL server is up; run again",
                ) from None
            except psycopg.Error as exc:
                raise CatalogError(
                    f"the catalog database {_where(self.conninfo)} refused: {str(exc).strip()}",
                    hint="check the catalog role's privileges on the schema "
                    f"{self.schema} (`pgsnap catalog migrate` creates it)",
                ) from None

    def _check_version(self, conn: psycopg.Connection[Any]) -> None:
        version = schema_version(conn, self.schema)
        if version == 0:
            raise CatalogError(
                f"the catalog database {_where(self.conninfo)} has no pgsnap schema {self.schema}",
                hint="create it once with `pgsnap catalog migrate` (it never happens implicitly)",
            )
        if version > SCHEMA_VERSION:
            raise CatalogError(
                f"the catalog schema {self.schema} is at version {version}, newer than this "
                f"pgsnap knows ({SCHEMA_VERSION})",
                hint="upgrade pgsnap on this backup server",
            )
        if version < SCHEMA_VERSION:
            raise CatalogError(
                f"the catalog schema {self.schema} is at version {version}; this pgsnap "
                f"needs {SCHEMA_VERSION}",
                hint="run `pgsnap catalog migrate` (once, from any backup server)",
            )
        self._checked = True

    def _id(self, conn: psycopg.Connection[Any], *, create: bool) -> int | None:
        """This cluster's id in the catalog (registered on its first write)."""
        if self._cluster_id is not None:
            return self._cluster_id
        row = conn.execute("SELECT id FROM clusters WHERE name = %s", (self.cluster,))
        found = row.fetchone()
        if found is None and create:
            conn.execute(
                "INSERT INTO clusters (name) VALUES (%s) ON CONFLICT (name) DO NOTHING",
                (self.cluster,),
            )
            found = conn.execute(
                "SELECT id FROM clusters WHERE name = %s", (self.cluster,)
            ).fetchone()
        if found is not None:
            self._cluster_id = int(found[0])
        return self._cluster_id

    def cluster_id(self, *, create: bool = True) -> int | None:
        """This cluster's number in the catalog (its lock's key)."""
        with self._session() as conn:
            return self._id(conn, create=create)

    # ------------------------------------------------------------------ backups

    def check_writable(self) -> None:
        """Raise CatalogError when a record could not be written now (the database
        unreachable, the schema missing, or the role without privileges)."""
        with self._session() as conn:
            self._id(conn, create=True)
            conn.execute("SELECT 1 FROM backups WHERE false FOR UPDATE")

    def put(self, record: BackupRecord) -> None:
        """Insert or replace the record (one statement: atomic)."""
        _check_id(record.id)
        document = json.dumps(to_dict(record))
        with self._session() as conn:
            cid = self._id(conn, create=True)
            conn.execute(
                "INSERT INTO backups AS b (cluster_id, id, system_identifier,"
                " state, timeline, start_time, consistent_at, pinned, pinned_until, copies,"
                " record) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (cluster_id, id) DO UPDATE SET"
                " system_identifier = excluded.system_identifier, state = excluded.state,"
                " timeline = excluded.timeline, start_time = excluded.start_time,"
                " consistent_at = excluded.consistent_at, pinned = excluded.pinned,"
                " pinned_until = excluded.pinned_until, copies = excluded.copies,"
                " record = excluded.record, written_at = now()",
                (
                    cid,
                    record.id,
                    record.system_identifier,
                    record.state.value,
                    record.stop_timeline or record.start_timeline,
                    record.start_time,
                    record.stop_time or record.start_time,
                    record.pin is not None,
                    None if record.pin is None else record.pin.until,
                    len(record.copies),
                    document,
                ),
            )
        log.debug("catalog %s: wrote %s (%s)", self.where, record.id, record.state.value)

    def _decode_backup(self, backup_id: str, data: Any) -> BackupRecord:
        try:
            return from_dict(BackupRecord, _document(data))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            reason = getattr(exc, "message", None) or str(exc)
            raise CatalogError(
                f"the catalog row of backup {backup_id} ({self.where}) is unreadable: {reason}",
                hint="restore the row from a copy of the catalog database, or delete it "
                "(the backup it records is not used until then)",
                backup_id=backup_id,
                path=self._path(backup_id),
                reason=reason,
            ) from exc

    def _path(self, backup_id: str) -> str:
        return f"{self.schema}.backups[{self.cluster}/{backup_id}]"

    def get(self, backup_id: str) -> BackupRecord:
        """One record; ``BackupNotFound`` if absent, CatalogError if unreadable."""
        _check_id(backup_id)
        with self._session() as conn:
            cid = self._id(conn, create=False)
            row = (
                None
                if cid is None
                else conn.execute(
                    "SELECT record::text FROM backups WHERE cluster_id = %s AND id = %s",
                    (cid, backup_id),
                ).fetchone()
            )
        if row is None:
            raise BackupNotFound(
                f"no backup {backup_id!r} in the catalog ({self.where})",
                hint="list the backups with `pgsnap list`",
                backup_id=backup_id,
            )
        return self._decode_backup(backup_id, row[0])

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with self._session() as conn:
            cid = self._id(conn, create=False)
            if cid is None:
                return []
            return list(conn.execute(sql, (cid, *params)).fetchall())

    def scan(self) -> CatalogScan:
        """Every readable record (oldest start time first) and every unreadable row."""
        rows = self._rows(
            "SELECT id, record::text FROM backups WHERE cluster_id = %s ORDER BY start_time, id",
            (),
        )
        records: list[BackupRecord] = []
        unreadable: list[UnreadableEntry] = []
        for backup_id, data in rows:
            try:
                records.append(self._decode_backup(backup_id, data))
            except CatalogError as exc:
                unreadable.append(
                    UnreadableEntry(self._path(backup_id), backup_id, str(exc.details["reason"]))
                )
        records.sort(key=lambda r: (r.start_time, r.id))
        return CatalogScan(tuple(records), tuple(unreadable))

    def list(self) -> tuple[BackupRecord, ...]:
        """Every readable record, oldest start time first (an unreadable row is
        logged and left out; :meth:`scan` returns it)."""
        scan = self.scan()
        for bad in scan.unreadable:
            if self.on_unreadable is not None:
                self.on_unreadable(bad)
            else:
                log.warning("unreadable catalog row %s: %s", bad.path, bad.error)
        return scan.records

    def newest(self, timeline: int | None = None) -> BackupRecord | None:
        """The newest DONE backup (on ``timeline``, or any): one indexed row."""
        rows = self._rows(
            "SELECT id, record::text FROM backups WHERE cluster_id = %s AND state = 'done'"
            " AND (%s::integer IS NULL OR timeline = %s)"
            " ORDER BY start_time DESC, id DESC LIMIT 1",
            (timeline, timeline),
        )
        return self._decode_backup(rows[0][0], rows[0][1]) if rows else None

    def system_identifiers(self) -> frozenset[str]:
        """The system identifiers of this cluster's backups (one query)."""
        rows = self._rows(
            "SELECT DISTINCT system_identifier FROM backups WHERE cluster_id = %s",
            (),
        )
        return frozenset(str(r[0]) for r in rows)

    def delete(self, backup_id: str) -> None:
        """Remove a record; ``BackupNotFound`` if absent."""
        _check_id(backup_id)
        with self._session() as conn:
            cid = self._id(conn, create=False)
            gone = (
                0
                if cid is None
                else conn.execute(
                    "DELETE FROM backups WHERE cluster_id = %s AND id = %s",
                    (cid, backup_id),
                ).rowcount
            )
        if not gone:
            raise BackupNotFound(
                f"no backup {backup_id!r} in the catalog ({self.where})", backup_id=backup_id
            )

    # ------------------------------------------------------------------ named records

    def _put_named(self, record: Any, name: str, sort_time: dt.datetime, backup: str) -> None:
        _check_id(name)
        kind = _KIND_OF[type(record)]
        with self._session() as conn:
            cid = self._id(conn, create=True)
            conn.execute(
                "INSERT INTO named_records (cluster_id, kind, name, sort_time,"
                " backup_id, record) VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (cluster_id, kind, name) DO UPDATE SET"
                " sort_time = excluded.sort_time, backup_id = excluded.backup_id,"
                " record = excluded.record",
                (cid, kind, name, sort_time, backup, json.dumps(to_dict(record))),
            )

    def _list_named(self, cls: type[_R], backup_id: str | None = None) -> tuple[_R, ...]:
        kind = _KIND_OF[cls]
        rows = self._rows(
            "SELECT name, record::text FROM named_records WHERE cluster_id = %s AND kind = %s"
            " AND (%s::text IS NULL OR backup_id = %s) ORDER BY sort_time, name",
            (kind, backup_id, backup_id),
        )
        out: list[_R] = []
        for name, data in rows:
            try:
                out.append(from_dict(cls, _document(data)))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                what = _KIND_NAMES[kind]
                log.warning("unreadable %s record %s in %s: %s", what, name, self.where, exc)
        return tuple(out)

    def _delete_named(self, cls: type[Any], name: str) -> None:
        kind = _KIND_OF[cls]
        with self._session() as conn:
            cid = self._id(conn, create=False)
            gone = (
                0
                if cid is None
                else conn.execute(
                    "DELETE FROM named_records WHERE cluster_id = %s AND kind = %s AND name = %s",
                    (cid, kind, name),
                ).rowcount
            )
        if not gone:
            raise CatalogError(
                f"no {_KIND_NAMES[kind]} {name!r} in the catalog ({self.where})",
                hint=_KIND_HINTS[kind],
                name=name,
            )

    def put_safety(self, record: SafetySnapshot) -> None:
        """Record (or replace) a recovery's safety snapshot."""
        self._put_named(record, record.name, record.created_at, record.backup_id)

    def list_safety(self) -> tuple[SafetySnapshot, ...]:
        """Every recorded safety snapshot, oldest first."""
        return self._list_named(SafetySnapshot)

    def delete_safety(self, name: str) -> None:
        """Remove a safety snapshot's record; CatalogError if absent."""
        self._delete_named(SafetySnapshot, name)

    def put_clone(self, record: CloneRecord) -> None:
        """Record (or replace) a clone."""
        self._put_named(record, record.name, record.created_at, record.backup_id)

    def get_clone(self, name: str) -> CloneRecord:
        """One clone's record; CatalogError if absent."""
        for clone in self.list_clones():
            if clone.name == name:
                return clone
        raise CatalogError(
            f"no clone {name!r} in the catalog ({self.where})", hint=_KIND_HINTS["clone"], name=name
        )

    def list_clones(self) -> tuple[CloneRecord, ...]:
        """Every recorded clone, oldest first."""
        return self._list_named(CloneRecord)

    def delete_clone(self, name: str) -> None:
        """Remove a clone's record; CatalogError if absent."""
        self._delete_named(CloneRecord, name)

    def put_drill(self, record: DrillRecord) -> None:
        """Record a drill's result."""
        self._put_named(record, record.id, record.started_at, record.backup_id)

    def list_drills(self, backup_id: str | None = None) -> tuple[DrillRecord, ...]:
        """The drills (of one backup, or all), oldest first."""
        return self._list_named(DrillRecord, backup_id)

    # ------------------------------------------------------------------ the fleet

    def fleet(self, timeline: int | None = None) -> tuple[FleetBackup, ...]:
        """Every cluster in this catalog database: its newest DONE backup (on
        ``timeline``, or any) and when its last drill started, by name (two indexed
        queries, whatever the number of backups)."""
        with self._session() as conn:
            newest = conn.execute(
                "SELECT c.name, b.id, b.record::text FROM clusters c LEFT JOIN LATERAL"
                " (SELECT id, record FROM backups WHERE cluster_id = c.id AND state = 'done'"
                " AND (%s::integer IS NULL OR timeline = %s)"
                " ORDER BY start_time DESC, id DESC LIMIT 1) b ON true ORDER BY c.name",
                (timeline, timeline),
            ).fetchall()
            drills = dict(
                conn.execute(
                    "SELECT c.name, (SELECT max(sort_time) FROM named_records"
                    " WHERE cluster_id = c.id AND kind = 'drill') FROM "
                    "clusters c"
                ).fetchall()
            )
        out = []
        for name, backup_id, data in newest:
            record = None
            if backup_id is not None:
                try:
                    record = from_dict(BackupRecord, _document(data))
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    log.warning("unreadable catalog row %s/%s: %s", name, backup_id, exc)
            out.append(FleetBackup(str(name), record, drills.get(name)))
        return tuple(out)

    def stale(
        self,
        max_age: dt.timedelta,
        *,
        now: dt.datetime | None = None,
        drills: bool = False,
        timeline: int | None = None,
    ) -> tuple[FleetBackup, ...]:
        """The clusters whose newest DONE backup (on ``timeline``, or any; with
        ``drills``, last drill) is older than ``max_age`` or missing, by name."""
        moment = now or dt.datetime.now(dt.UTC)
        out = []
        for row in self.fleet(timeline):
            when = row.last_drill if drills else (row.newest.start_time if row.newest else None)
            if when is None or moment - when > max_age:
                out.append(row)
        return tuple(out)

    def expirable(
        self,
        policy: RetentionPolicy,
        *,
        now: dt.datetime | None = None,
        every_cluster: bool = True,
    ) -> tuple[ExpiryForecast, ...]:
        """The backups ``policy`` would expire, in every cluster of this catalog database
        (or, with ``every_cluster=False``, in this one), oldest first by cluster: one
        query over indexed columns, whatever the number of backups.

        This is the catalog's half of an expiry plan (``Cluster.plan_expiry``), for a
        fleet's view of what its next expiry runs would delete: the same rules
        (redundancy, window, grandfather-father-son levels, pins, a FAILED backup once a
        newer one is DONE, a backup with copies losing only its snapshots), assuming the
        storage still holds every snapshot the records name. What only the storage and
        the journals know (a vanished or secure snapshot, a snapshot an unfinished run
        needs) is for the plan of each cluster to add: it may keep more, never less.
        A row that does not decode as a record (a hand-edited one) is forecast by its
        columns; its cluster's plan reports it unreadable and deletes nothing of it.
        """
        moment = now or dt.datetime.now(dt.UTC)
        window = policy.window
        levels = {
            "hour": policy.hourly,
            "day": policy.daily,
            "week": policy.weekly,
            "month": policy.monthly,
        }
        params: dict[str, Any] = {
            "now": moment,
            "redundancy": policy.redundancy,
            "has_window": window is not None,
            "has_levels": any(levels.values()),
            "start": moment - (window or dt.timedelta(0)),
            **{f"n_{unit}": count for unit, count in levels.items()},
        }
        with self._session() as conn:
            params["cluster"] = None if every_cluster else self._id(conn, create=False)
            if not every_cluster and params["cluster"] is None:
                return ()
            # Small per-cluster probes the planner costs high: compiling them (JIT)
            # took longer than running them.
            conn.execute("SET jit = off")
            rows = conn.execute(_EXPIRABLE_SQL, params).fetchall()
        why = f"not kept by the policy ({policy.describe()})"
        return tuple(
            ExpiryForecast(
                cluster=str(name),
                backup_id=str(backup_id),
                state=BackupState(state),
                consistent_at=at,
                action="snapshots" if copies else "backup",
                reason="failed; a newer backup is DONE" if state == "failed" else why,
            )
            for name, backup_id, state, at, copies in rows
        )


_EXPIRABLE_SQL: Final = """
WITH c AS (
    SELECT id AS cluster_id, name FROM clusters
    WHERE %(cluster)s::integer IS NULL OR id = %(cluster)s::integer
), t AS (
    -- Each cluster's thresholds, each one indexed probe: its newest DONE backup, the
    -- N-th newest (redundancy N keeps it and every newer one; none when it has fewer),
    -- and the window's anchor (the newest at or before its start; every backup at least
    -- as new is kept; with no anchor every one is).
    SELECT c.cluster_id, c.name, newest.at AS newest_at, red.at AS red_at, red.id AS red_id,
           anchor.at AS anchor_at
    FROM c
    LEFT JOIN LATERAL (
        SELECT consistent_at AS at FROM backups b
        WHERE b.cluster_id = c.cluster_id AND b.state = 'done'
        ORDER BY consistent_at DESC, id COLLATE "C" DESC LIMIT 1
    ) newest ON true
    LEFT JOIN LATERAL (
        SELECT consistent_at AS at, id FROM backups b
        WHERE b.cluster_id = c.cluster_id AND b.state = 'done'
        ORDER BY consistent_at DESC, id COLLATE "C" DESC
        OFFSET greatest(coalesce(%(redundancy)s::integer, 1) - 1, 0) LIMIT 1
    ) red ON %(redundancy)s::integer IS NOT NULL
    LEFT JOIN LATERAL (
        SELECT consistent_at AS at FROM backups b
        WHERE b.cluster_id = c.cluster_id AND b.state = 'done'
          AND consistent_at <= %(start)s
        ORDER BY consistent_at DESC, id COLLATE "C" DESC LIMIT 1
    ) anchor ON %(has_window)s
), levels AS (
    -- Grandfather-father-son: the newest of each of the last N periods with a backup.
    -- Only when levels are asked for (it reads every DONE backup).
    SELECT cluster_id, id FROM (
        SELECT cluster_id, id, wanted,
               row_number() OVER (PARTITION BY cluster_id, unit, period
                                  ORDER BY at DESC, id COLLATE "C" DESC) AS newest_of_period,
               dense_rank() OVER (PARTITION BY cluster_id, unit ORDER BY period DESC) AS nth
        FROM (
            SELECT b.cluster_id, b.id, b.consistent_at AS at,
                   l.unit, l.wanted,
                   date_trunc(l.unit, b.consistent_at
                              AT TIME ZONE 'UTC') AS period
            FROM backups b JOIN c ON c.cluster_id = b.cluster_id
            CROSS JOIN (VALUES ('hour', %(n_hour)s::integer), ('day', %(n_day)s::integer),
                               ('week', %(n_week)s::integer), ('month', %(n_month)s::integer))
                       AS l (unit, wanted)
            WHERE %(has_levels)s AND b.state = 'done' AND l.wanted > 0
        ) p
    ) ranked
    WHERE newest_of_period = 1 AND nth <= wanted
), candidates AS (
    -- DONE backups older than every threshold: a range of the index in each cluster.
    SELECT t.name, b.cluster_id, b.id, b.state, b.consistent_at AS at,
           b.pinned, b.pinned_until, b.copies
    FROM t CROSS JOIN LATERAL (
        SELECT * FROM backups b WHERE b.cluster_id = t.cluster_id AND b.state = 'done'
    ) b
    WHERE (%(redundancy)s::integer IS NULL
           OR (t.red_at IS NOT NULL
               AND b.consistent_at <= t.red_at  -- a range of the index
               AND (b.consistent_at < t.red_at
                    OR (b.consistent_at = t.red_at
                        AND b.id COLLATE "C" < t.red_id COLLATE "C"))))
      AND (NOT %(has_window)s
           OR (t.anchor_at IS NOT NULL AND b.consistent_at < t.anchor_at))
    UNION ALL
    -- FAILED backups once a newer one is DONE.
    SELECT t.name, b.cluster_id, b.id, b.state, b.consistent_at,
           b.pinned, b.pinned_until, b.copies
    FROM t JOIN backups b ON b.cluster_id = t.cluster_id AND b.state = 'failed'
    WHERE t.newest_at > b.consistent_at
)
SELECT name, id, state, at, copies FROM candidates x
WHERE NOT (pinned AND (pinned_until IS NULL OR %(now)s < pinned_until))
  AND (state <> 'done' OR NOT %(has_levels)s
       OR NOT EXISTS (SELECT 1 FROM levels l WHERE l.cluster_id = x.cluster_id AND l.id = x.id))
ORDER BY name, at, id COLLATE "C"
"""
"""The backups a retention policy expires (``PostgresCatalog.expirable``): the rules of
:func:`pgsnap.planner.expiry.kept_backups` and ``plan_expiry`` over the columns of
migration 2 (ties broken by id in code point order, as Python sorts)."""


@frozen
class ExpiryForecast:
    """One backup a retention policy would expire (:meth:`PostgresCatalog.expirable`):
    its cluster, id, state and when it is consistent; ``action`` is ``"backup"`` (its
    snapshots and its record go) or ``"snapshots"`` (its copies keep the record);
    ``reason`` says why the policy does not keep it."""

    cluster: str
    backup_id: str
    state: BackupState
    consistent_at: dt.datetime
    action: str
    reason: str


def _document(data: Any) -> Any:
    """A record's JSON document from its row: records are selected as text
    (``record::text``) and parsed here, several times faster than psycopg's loader of
    ``jsonb`` over a catalog's thousands of rows."""
    if not isinstance(data, str):
        raise TypeError(f"expected the record as text, got {type(data).__name__}")
    return json.loads(data)


def _check_id(name: str) -> str:
    if not is_valid_backup_id(name):
        raise CatalogError(
            f"invalid backup id {name!r}",
            hint="backup ids are 1-128 letters, digits, '.', '_' or '-'",
            backup_id=name,
        )
    return name


class PostgresClusterLock:
    """The cluster lock of a :class:`PostgresCatalog`'s cluster: a session-level
    advisory lock (shared for the plan kinds that share it, exclusive for the rest)
    taken by a connection of its own, held for the length of the run and released
    with that session, also when the process dies or the network drops it.

    Beside the lock, a row in ``lock_holders`` says who holds it (plan, process,
    host, journal) and, as the run goes, which step it is at; a row whose session
    no longer holds the lock is a run that died, reported and removed by the next
    run that takes the lock. Advisory locks need session pooling: a catalog
    behind a transaction-pooling proxy (PgBouncer's ``pool_mode=transaction``) is
    not safe.
    """

    def __init__(self, catalog: PostgresCatalog) -> None:
        self.catalog = catalog

    def __repr__(self) -> str:
        return f"<PostgresClusterLock {self.catalog.where}>"

    def _key(self) -> tuple[str, int]:
        cid = self.catalog.cluster_id(create=True)
        assert cid is not None
        return f"pgsnap {self.catalog.schema}", cid

    def _records(
        self, conn: psycopg.Connection[Any], cid: int
    ) -> list[tuple[str, LockHolder | None, bool]]:
        s = self.catalog.schema
        rows = conn.execute(
            "SELECT h.token, h.holder, h.step, EXISTS (SELECT 1 FROM pg_locks l"
            " WHERE l.locktype = 'advisory' AND l.pid = h.backend_pid AND l.granted"
            " AND l.classid = hashtext(%s)::oid AND l.objid = %s::oid AND l.objsubid = 2)"
            " FROM lock_holders h WHERE h.cluster_id = %s ORDER BY h.updated_at",
            (f"pgsnap {s}", cid, cid),
        ).fetchall()
        out: list[tuple[str, LockHolder | None, bool]] = []
        for token, data, _step, alive in rows:
            try:
                holder: LockHolder | None = LockHolder.from_dict(data)
            except (ValueError, KeyError, TypeError):
                holder = None
            out.append((str(token), holder, bool(alive)))
        return out

    def holders(self) -> tuple[LockHolder, ...]:
        """See :meth:`~pgsnap.locks.ClusterLock.holders` (living holders only)."""
        with self.catalog._session() as conn:
            cid = self.catalog._id(conn, create=False)
            if cid is None:
                return ()
            return tuple(h for _t, h, alive in self._records(conn, cid) if alive and h)

    def steps(self) -> dict[str, str]:
        """The step each living holder's run is at, by plan id ('' before its first)."""
        with self.catalog._session() as conn:
            cid = self.catalog._id(conn, create=False)
            if cid is None:
                return {}
            rows = conn.execute(
                "SELECT holder->>'plan_id', step FROM lock_holders WHERE cluster_id = %s",
                (cid,),
            ).fetchall()
        return {str(p): str(step) for p, step in rows}

    def acquire(self, holder: LockHolder) -> Lease:
        """See :meth:`~pgsnap.locks.ClusterLock.acquire`: refused at once, naming
        the holders, when a conflicting run holds the cluster."""
        import psycopg  # noqa: PLC0415 - psycopg on use

        name, cid = self._key()
        conn = self.catalog.connect("cluster lock")
        token = uuid.uuid4().hex
        try:
            row = conn.execute(_TRY_LOCK[holder.mode], (name, cid)).fetchone()
            if not row or not row[0]:
                conn.close()
                raise _refused(holder, self.holders(), self.catalog.where)
            broken: list[LockHolder] = []
            with conn.transaction():
                for tok, found, alive in self._records(conn, cid):
                    if alive:
                        continue
                    conn.execute("DELETE FROM lock_holders WHERE token = %s", (tok,))
                    if found is not None:
                        broken.append(found)
                conn.execute(
                    "INSERT INTO lock_holders (token, cluster_id, backend_pid, holder)"
                    " VALUES (%s, %s, pg_backend_pid(), %s)",
                    (token, cid, json.dumps(holder.to_dict())),
                )
        except psycopg.Error as exc:
            conn.close()
            raise ExecutionError(
                f"cannot take the cluster lock in the catalog ({self.catalog.where}): "
                f"{str(exc).strip()}",
                step_id="",
                hint="check that the catalog database is up and migrated "
                "(`pgsnap catalog migrate`)",
            ) from None
        for dead in broken:
            log.warning(
                "the cluster lock's holder %s died without releasing it%s",
                dead,
                f"; its journal: {dead.journal} on {dead.host}" if dead.journal else "",
            )
        mutex = threading.Lock()

        def release() -> None:
            with mutex:
                try:
                    if not conn.broken and not conn.closed:
                        conn.execute("DELETE FROM lock_holders WHERE token = %s", (token,))
                except psycopg.Error as exc:  # the next holder finds the row dead and removes it
                    log.warning("cannot remove the cluster lock's holder row: %s", exc)
                finally:
                    conn.close()  # the session ends: the advisory lock goes with it

        def check(step: str) -> None:
            with mutex:
                try:
                    found = conn.execute(
                        "UPDATE lock_holders SET step = %s, updated_at = now() WHERE token = %s",
                        (step, token),
                    ).rowcount
                except psycopg.Error as exc:
                    reason = str(exc).strip() or type(exc).__name__
                    found = -1
                else:
                    reason = "its holder row is gone"
            if found != 1:
                raise LockLostError(
                    f"lost the cluster lock in the catalog ({self.catalog.where}): {reason}; "
                    "another backup server may take the cluster now, so this run stops here",
                    step_id=step,
                    hint="the journal records where it stopped: run `pgsnap resume` once the "
                    "catalog database is reachable",
                )

        return Lease(holder, release, tuple(broken), check=check)


def _refused(holder: LockHolder, holders: tuple[LockHolder, ...], where: str) -> ClusterLockedError:
    who = "; ".join(str(h) for h in holders) or "a run whose holder row is not written yet"
    return ClusterLockedError(
        f"cannot run this {holder.kind} plan: another pgsnap run holds the cluster ({who})",
        hint="wait for it to finish and run again; only backups may run side by side "
        f"(the lock: {where})",
        holders=tuple(str(h) for h in holders),
    )
