"""The facade for scripts and notebooks: one object for one cluster.

:class:`Cluster` holds the database adapter, the storage backend, the WAL
archive, the catalog and the layout, and offers the whole job in a few calls::

    cluster = Cluster.from_config("pgsnap.toml")   # or Cluster(adapter=..., backend=..., ...)
    cluster.check()                      # preflight + archive report
    plan = cluster.plan_backup()         # a Plan: look at it, then
    cluster.execute(plan)                # run it
    plan = cluster.plan_recovery(RecoveryTarget.time(when))
    print(plan.explain()); cluster.execute(plan)

Observation (gathering facts) happens here; planning is pure
(:mod:`pgsnap.planner`); execution is the :class:`~pgsnap.executor.Executor`.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from pgsnap._attrs import frozen
from pgsnap.catalog import (
    CatalogScan,
    DirectoryCatalog,
    UnreadableEntry,
    is_valid_backup_id,
    scan_catalog,
)
from pgsnap.config import Timeouts, cluster_arguments
from pgsnap.copies import (
    DEFAULT_PARALLEL,
    CopyKey,
    GcReport,
    VerifyReport,
    collect_garbage,
    is_copy_id,
    open_target,
    verify_copy,
)
from pgsnap.copies.markers import DEFAULT_STALE_AFTER
from pgsnap.errors import (
    ArchiveError,
    BackendError,
    BackupNotDue,
    BackupNotFound,
    ConfigurationError,
    CopyBusy,
    DatabaseError,
    ExecutionError,
    HostError,
    InputError,
    PgsnapError,
    PlanningError,
    ServerRefusedError,
    StalePlanError,
    TargetError,
)
from pgsnap.executor import Event, ExecutionResult, Executor
from pgsnap.host import LocalRunner
from pgsnap.locks import LockHolder
from pgsnap.model import (
    BackupRecord,
    CloneRecord,
    CopyRecord,
    DrillRecord,
    Layout,
    Pin,
    RecoveryAction,
    RecoveryTarget,
    SafetySnapshot,
    StorageProblem,
    VolumeRole,
    decode_value,
    from_dict,
)
from pgsnap.observe import EmptyArchive, Observer, WalIndexRun
from pgsnap.operations.copy_retention import gc_report
from pgsnap.operations.db import WriteBackupLabel
from pgsnap.plan import Plan
from pgsnap.planner.backup import (
    DEFAULT_MAX_STANDBY_LAG,
    BackupRequest,
    Finding,
    Severity,
    archiving_status,
    plan_backup,
    preflight,
)
from pgsnap.planner.checks import CheckFacts, check_findings
from pgsnap.planner.copy import DEFAULT_MOUNT_ROOT, CopyRequest, plan_copy
from pgsnap.planner.copy_expiry import (
    CopyRetentionPolicy,
    plan_collect_garbage,
    plan_copy_expiry,
)
from pgsnap.planner.expiry import (
    RetentionPolicy,
    plan_delete,
    plan_delete_safety,
    plan_expiry,
    plan_pin,
)
from pgsnap.planner.facts import (
    BackupFacts,
    RecoveryFacts,
)
from pgsnap.planner.forecast import BackupList, expiry_forecast
from pgsnap.planner.reconcile import (
    Orphan,
    RebuildReport,
    find_orphans,
    plan_rebuild,
    rebuild_plan,
)
from pgsnap.planner.recovery import RecoveryRequest, plan_recovery
from pgsnap.protocols import Catalog, DatabaseAdapter, PrimaryServer, StorageBackend, WalArchive
from pgsnap.timeline import TimelineView, plan_target
from pgsnap.wal import (
    ArchiveReport,
    ArchiverHealth,
    archive_report,
    archived_segment_size,
    archiver_health,
    switch_gaps,
)
from pgsnap.wal.contents import WalIndex

if TYPE_CHECKING:
    from pgsnap.host import Host

__all__ = ["BackupList", "CheckReport", "Cluster"]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024


@frozen
class CheckReport:
    """What ``Cluster.check()`` found.

    ``findings``: the backup preflight's and the check's own (a server that
    cannot be asked, an unreadable archive or catalog record, WAL missing after
    a backup, an archive that is not where ``archive_command`` writes, a wrong
    OS user, the storage's own problems such as a snapshot limit near; see
    :mod:`pgsnap.planner.checks`); ``archiver``: archiving health (None
    when the server could not be asked); ``wal``: the archive per timeline;
    ``backups``: the readable catalog records; ``unreadable``: the catalog
    entries that cannot be read (also findings); ``storage_problems``: what
    the storage backend reported (also findings; see
    :class:`~pgsnap.protocols.StorageHealth`), as data for scripts.
    """

    findings: tuple[Finding, ...]
    archiver: ArchiverHealth | None
    wal: tuple[str, ...]
    backups: tuple[str, ...]
    unreadable: tuple[UnreadableEntry, ...] = ()
    storage_problems: tuple[StorageProblem, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no finding is an error: nothing blocks a backup or puts a recovery at risk."""
        return not any(f.severity is Severity.ERROR for f in self.findings)

    def explain(self) -> str:
        """The report as text."""
        lines = [f"pgsnap check: {'OK' if self.ok else 'PROBLEMS FOUND'}"]
        lines.append("Findings:" if self.findings else "Findings: none")
        lines += [f"  {f}" for f in self.findings]
        lines.append("WAL archive:")
        lines += [f"  {w}" for w in self.wal]
        if self.backups or self.unreadable:
            lines.append("Backups:")
        else:
            lines.append("Backups: none")
        lines += [f"  {b}" for b in self.backups]
        lines += [f"  UNREADABLE {u}" for u in self.unreadable]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        return "<pre>" + e(self.explain()) + "</pre>"


# --------------------------------------------------------------------------- arguments


_ROLES_HINT = (
    "lost takes volume roles among: data, wal, tablespace (the data volume is always "
    "restored; add 'wal' when the WAL volume is lost too)"
)
_MAX_TIMELINE = 0xFFFFFFFF


def _seconds(name: str, value: object) -> float:
    """A timeout argument: a positive, finite number of seconds."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InputError(
            f"{name} must be a positive number of seconds, not {value!r}",
            hint=f"give the seconds as a number greater than 0, e.g. {name}=300",
            argument=name,
        )
    return float(value)


def _bytes(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(
            f"{name} must be a number of bytes (an int, 0 or more), not {value!r}",
            hint=f"e.g. {name}=256 * 1024 * 1024",
            argument=name,
        )
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InputError(
            f"{name} must be True or False, not {value!r}",
            hint=f"pass True or False, e.g. {name}=True",
            argument=name,
        )
    return value


CHECKPOINTS: tuple[str, ...] = ("fast", "scheduled", "next", "spread")
"""How a backup may start (:meth:`Cluster.plan_backup`'s ``checkpoint``)."""


def _checkpoint(value: object) -> tuple[bool, bool]:
    """``checkpoint``: (a fast checkpoint?, wait for the next scheduled one first?)."""
    if value == "fast":
        return True, False
    if value == "spread":
        return False, False
    if value == "next":
        return True, True
    if value == "scheduled":
        return False, True
    raise InputError(
        f"checkpoint must be one of {', '.join(CHECKPOINTS)}, not {value!r}",
        hint='"fast" for the shortest time to a backup, "scheduled" for one the workload '
        'does not notice (its checkpoint is PostgreSQL\'s next timed one), "next" to '
        'wait for that checkpoint and then take a fast one, "spread" for a spread '
        "checkpoint begun now",
        argument="checkpoint",
    )


def _copy_id(value: object) -> str | None:
    """``from_copy``: False or True (no copy named), or a copy id."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, str) or not is_copy_id(value):
        raise InputError(
            f"from_copy must be True, False or a copy id, not {value!r}",
            hint="see a backup's copies with `pgsnap list --json`; copy ids are 1-128 "
            "letters, digits, '.', '_' or '-'",
            argument="from_copy",
        )
    return value


def _backup_id(value: object, name: str = "backup_id") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(
            f"{name} must be a backup id (text), not {value!r}",
            hint="see the backup ids with `pgsnap list` or Cluster.backups()",
            argument=name,
        )
    if not is_valid_backup_id(value):
        raise InputError(
            f"invalid backup id {value!r}",
            hint="backup ids are 1-128 letters, digits, '.', '_' or '-' "
            "(see them with `pgsnap list`)",
            argument=name,
        )
    return value


_LABEL_MAX_BYTES = 1024
"""PostgreSQL's limit for a backup label (MAXPGPATH bytes)."""


def _shown(text: str, limit: int = 40) -> str:
    """``text`` for an error message: at most ``limit`` characters, control characters
    escaped (a label is never echoed whole or raw)."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut) + (f" ({len(text)} characters)" if len(text) > limit else "")


def _label(value: object) -> str | None:
    """A backup label: text PostgreSQL writes into one line of ``backup_label``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(
            f"label must be text, not {type(value).__name__}",
            hint="pass a label such as 'nightly', or None for 'pgsnap <id>'",
            argument="label",
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InputError(
            f"label {_shown(value)} holds a line break or another control character",
            hint="PostgreSQL writes the label into one line of backup_label: use printable "
            "text, e.g. 'nightly 2026-12-01'",
            argument="label",
        )
    size = len(value.encode("utf-8"))
    if size > _LABEL_MAX_BYTES:
        raise InputError(
            f"label {_shown(value)} is {size} bytes long; PostgreSQL takes at most "
            f"{_LABEL_MAX_BYTES}",
            hint="use a shorter label",
            argument="label",
        )
    if not value.strip():
        raise InputError(
            "label is empty", hint="pass a label such as 'nightly', or none", argument="label"
        )
    return value


def _zone(value: object) -> dt.tzinfo | None:
    """A time zone argument: None, a ``tzinfo`` or an IANA name (``Europe/Berlin``)."""
    if value is None or isinstance(value, dt.tzinfo):
        return value
    if isinstance(value, str):
        import zoneinfo  # noqa: PLC0415

        try:
            return zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            pass
    raise InputError(
        f"log_timezone must be a time zone, not {value!r}",
        hint="give the server's log_timezone (SHOW log_timezone), e.g. 'Europe/Berlin'",
        argument="log_timezone",
    )


def _target(value: object) -> RecoveryTarget:
    if value is None:
        return RecoveryTarget.latest()
    if not isinstance(value, RecoveryTarget):
        raise TargetError(
            f"target must be a RecoveryTarget, not {value!r}",
            hint="e.g. RecoveryTarget.latest(), RecoveryTarget.time('2026-11-30 12:00:00+00:00'),"
            " RecoveryTarget.lsn('0/3000060'), RecoveryTarget.xid(735), "
            "RecoveryTarget.name('before_upgrade'), RecoveryTarget.immediate()",
        )
    return value


def _timeline(value: object) -> str:
    """``latest``, ``current`` or a timeline number (1 to 4294967295), as text."""
    if isinstance(value, str) and value in ("latest", "current"):
        return value
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    if number is None or not 1 <= number <= _MAX_TIMELINE:
        raise ConfigurationError(
            f"invalid recovery timeline {value!r}",
            hint="use 'latest', 'current' or a timeline number (1 to 4294967295)",
            argument="timeline",
        )
    return str(number)


def _action(value: object) -> RecoveryAction:
    if isinstance(value, RecoveryAction):
        return value
    if isinstance(value, str):
        try:
            return RecoveryAction(value)
        except ValueError:
            pass
    raise InputError(
        f"{value!r} is not a recovery action",
        hint=f"use one of: {', '.join(a.value for a in RecoveryAction)}",
        argument="action",
    )


def _role(value: object) -> VolumeRole:
    if isinstance(value, VolumeRole):
        return value
    if isinstance(value, str):
        try:
            return VolumeRole(value)
        except ValueError:
            pass
    raise InputError(f"{value!r} is not a volume role", hint=_ROLES_HINT, argument="lost")


def _lost(value: object) -> frozenset[VolumeRole]:
    if isinstance(value, VolumeRole | str):
        return frozenset({_role(value)})
    if not isinstance(value, Iterable):
        raise InputError(
            f"lost must be volume roles, not {value!r}", hint=_ROLES_HINT, argument="lost"
        )
    return frozenset(_role(v) for v in value)


def _wal_index(value: object, catalog: Catalog) -> WalIndex | None:
    if isinstance(value, WalIndex):
        return value
    if value is False:
        return None
    if value is None or value is True:
        if isinstance(catalog, DirectoryCatalog):
            return WalIndex(catalog.path / "wal-index")
        if value is True:
            raise ConfigurationError(
                f"wal_index=True needs a directory catalog, not {catalog!r}",
                hint="pass the directory to keep the WAL index in: wal_index='/path'",
            )
        return None
    if isinstance(value, str | os.PathLike):
        return WalIndex(value)
    raise ConfigurationError(
        f"wal_index must be a directory, a WalIndex, True or False, not {value!r}",
        hint="pass wal_index='/path/to/index', or False for no index",
    )


def _same_plan(plan: Plan, replan: Callable[[], Plan], changed: str) -> None:
    """Refuse ``plan`` (:class:`~pgsnap.errors.StalePlanError`) unless planning again
    now gives the same fingerprint; ``changed`` says what changed if not."""
    try:
        now = replan()
    except (PlanningError, BackupNotFound) as exc:
        raise StalePlanError(
            f"the plan no longer holds: {exc.message}", hint="make a new plan"
        ) from exc
    if now.fingerprint != plan.fingerprint:
        raise StalePlanError(
            f"{changed} since the plan was made",
            hint="make a new plan and review it",
            planned=plan.fingerprint,
            current=now.fingerprint,
        )


def _target_location(where: str | os.PathLike[str]) -> str:
    """A copy target's location: ``s3://...`` as it is, a path made absolute."""
    text = os.fspath(where)
    return text if text.startswith("s3://") else os.path.abspath(text)


def _both(
    first: Callable[[Event], None], second: Callable[[Event], None] | None
) -> Callable[[Event], None]:
    """Tell each event to ``first``, then to ``second`` (when there is one)."""

    def tell(event: Event) -> None:
        first(event)
        if second is not None:
            second(event)

    return tell


class Cluster:
    """One PostgreSQL cluster under pgsnap's care. See the module docstring.

    ``wal_index``: where to keep what planning learnt from each archived WAL
    segment (:class:`~pgsnap.wal.contents.WalIndex`), so each is read once: a
    directory or an index; True or None (the default) for ``wal-index`` in
    a :class:`~pgsnap.catalog.DirectoryCatalog`'s directory (no index with
    another catalog); False for none.
    """

    def __init__(
        self,
        *,
        adapter: DatabaseAdapter,
        backend: StorageBackend,
        archive: WalArchive,
        catalog: Catalog,
        layout: Layout,
        journal_dir: str | os.PathLike[str] | None = None,
        waldump: str | os.PathLike[str] | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        on_event: Callable[[Event], None] | None = None,
        max_scan_segments: int = 256,
        wal_index: WalIndex | str | os.PathLike[str] | bool | None = None,
        copy_target: str | os.PathLike[str] | None = None,
        copy_target_options: Mapping[str, str] | None = None,
        copy_key_file: str | os.PathLike[str] | None = None,
        copy_host: str | None = None,
        copy_mount_root: str | None = None,
        copy_retention: CopyRetentionPolicy | None = None,
        copy_parallel: int = DEFAULT_PARALLEL,
        copy_bandwidth_limit: int | None = None,
        clone_hosts: Mapping[str, Host] | None = None,
        primary: PrimaryServer | None = None,
    ) -> None:
        self.adapter = adapter
        self.backend = backend
        self.archive = archive
        self.catalog = catalog
        self.layout = layout
        self.journal_dir = journal_dir
        self._waldump = Path(waldump) if waldump is not None else None
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.on_event = on_event
        self.progress: bool | None = None
        """Show runs' progress in a notebook: None (the default) when this runs in a
        Jupyter kernel, True always there, False never (``on_event`` receives the
        events either way; :mod:`pgsnap.progress`)."""
        self.max_scan_segments = max_scan_segments
        self.wal_index = _wal_index(wal_index, catalog)
        self.copy_target = None if copy_target is None else _target_location(copy_target)
        """Where :meth:`copy` puts copies when it is not told (``[copies] path``)."""
        self.copy_target_options: dict[str, str] = dict(copy_target_options or {})
        """An S3 target's options (``[copies]`` ``endpoint_url``, ``access_key_env``...)."""
        self.copy_key_file: str | None = (
            None if copy_key_file is None else os.path.abspath(os.fspath(copy_key_file))
        )
        """The copy key file (``[copies] key_file``): copies are encrypted with its key,
        and encrypted copies read with it. Its path goes into plans, never the key."""
        self.copy_host = copy_host
        """Where a copy exposes, mounts and reads snapshots that are block devices
        (``[copies] host``; None: the database host). Another host means that
        pgsnap runs there (``pgsnap copy`` on the backup host)."""
        self.copy_mount_root = copy_mount_root or DEFAULT_MOUNT_ROOT
        """Where those snapshots are mounted read-only (``[copies] mount_root``)."""
        if copy_retention is not None and not isinstance(copy_retention, CopyRetentionPolicy):
            raise InputError(
                f"copy_retention must be a CopyRetentionPolicy, not {copy_retention!r}",
                hint="e.g. CopyRetentionPolicy(monthly=12, max_age=timedelta(days=800))",
                argument="copy_retention",
            )
        self.copy_retention = copy_retention
        """The copies' own retention policy (``[copies.retention]``; None: copy
        retention deletes nothing): :meth:`plan_copy_expiry` applies it."""
        self.copy_parallel = copy_parallel
        """Upload threads of a copy (``[copies] parallel``)."""
        self.copy_bandwidth_limit = copy_bandwidth_limit
        """Bytes a second a copy may send, or None (``[copies] bandwidth_limit``)."""
        self.clone_hosts: dict[str, Host] = dict(clone_hosts or {})
        """Hosts other than the database host where clones may run (``[clone_hosts.NAME]``),
        by the storage's name for them: the clone's volumes are attached there, its
        server runs there with the cluster's binaries (at the same paths)."""
        self.primary = primary
        """When this cluster's server is a standby: its primary (``[primary]``), which a
        backup taken on the standby checks and asks to switch WAL
        (:class:`~pgsnap.protocols.PrimaryServer`; None: not reached)."""

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        timeouts: Timeouts | None = None,
        base: str | os.PathLike[str] | None = None,
    ) -> Cluster:
        """The cluster a configuration describes: a TOML file (what ``pgsnap -c``
        reads) or a mapping of the same shape.

        ::

            cluster = pgsnap.Cluster.from_config("/etc/pgsnap/main.toml")
            cluster = pgsnap.Cluster.from_config({"database": {...}, "volume": [...], ...})

        Relative paths are relative to ``base``, else to the file's directory
        (the working directory for a mapping). The schema and its checks are
        :mod:`pgsnap.config` (every key in docs/cli.md); a configuration that is
        wrong raises :class:`~pgsnap.errors.ConfigurationError` saying what to
        write instead. ``timeouts`` replaces the ``[timeouts]`` section.
        """
        return cls(**cluster_arguments(source, timeouts=timeouts, base=base))

    def __repr__(self) -> str:
        return (
            f"<pgsnap.Cluster backend={self.backend.name} archive={self.archive.location} "
            f"volumes={len(self.layout.volumes)}>"
        )

    # ------------------------------------------------------------------ observe

    @property
    def host(self) -> Host:
        """The database host (the adapter's)."""
        return self.adapter.host

    @property
    def observer(self) -> Observer:
        """What gathers this cluster's facts (:class:`~pgsnap.observe.Observer`)."""
        return Observer(
            adapter=self.adapter,
            backend=self.backend,
            archive=self.archive,
            catalog=self.catalog,
            layout=self.layout,
            clock=self._now,
            waldump=self._waldump,
            max_scan_segments=self.max_scan_segments,
            wal_index=self.wal_index,
            journal_dir=None if self.journal_dir is None else Path(self.journal_dir),
            copy_options=self.copy_target_options,
            copy_key_file=self.copy_key_file or "",
            primary=self.primary,
        )

    def backup_facts(self) -> BackupFacts:
        """Observe what the backup planner needs (server, archiver, volumes, catalog)."""
        return self.observer.backup_facts()

    def recovery_facts(self, request: RecoveryRequest | None = None) -> RecoveryFacts:
        """Observe what the recovery planner needs; scans WAL commit times when it can."""
        return self.observer.recovery_facts(request)

    # ------------------------------------------------------------------ report

    def check(self) -> CheckReport:
        """Findings (preflight and recovery risks), archiver health, the archive, the backups.

        Nothing is changed. A server that cannot be asked, an archive that
        cannot be read, unreadable catalog records and a storage backend
        that cannot report its health are findings, not exceptions, so the
        rest is still reported. A backend with ``storage_problems``
        (:class:`~pgsnap.protocols.StorageHealth`) is asked about the
        layout's snapshotted volumes: each problem is a finding.
        """
        scan = scan_catalog(self.catalog)  # first: a later list() does not warn again
        findings: list[Finding] = []
        refused = storage_down = False
        facts: BackupFacts | None = None
        server_error: str | None = None
        try:
            try:
                facts = self.backup_facts()
            except ArchiveError:
                # The check's own finding names the archive; observe the rest without it.
                facts = attrs.evolve(
                    self.observer, archive=EmptyArchive(self.archive.location)
                ).backup_facts()
        except (DatabaseError, HostError) as exc:
            server_error = str(exc)
            refused = isinstance(exc, ServerRefusedError)
            log.debug("check: the server or its host cannot be asked: %s", exc)
        except BackendError as exc:  # the storage is down: say so, report the rest
            storage_down = True
            log.debug("check: the storage cannot be asked: %s", exc)
            findings.append(
                Finding(
                    "storage",
                    Severity.ERROR,
                    f"the storage cannot be asked for the cluster's volumes: {exc.message}; "
                    "a backup would fail: "
                    + (exc.hint or "fix the storage connection ([storage] options)"),
                )
            )
        archiver = None if facts is None else archiving_status(facts)
        if facts is not None:
            findings += preflight(facts)
        data = self.observer.check_facts(
            scan=scan,
            server_error=server_error,
            archiver=archiver,
            segment_size=None if facts is None else facts.server.wal_segment_size,
            server_refused=refused,
        )
        if storage_down:  # the error finding says it; the health query's warning would not
            data = attrs.evolve(data, storage_error=None)
        data = attrs.evolve(
            data,
            orphans=self._orphans(data.backups, [u.backup_id for u in data.unreadable]),
            now=self._now(),
            safety=self.catalog.list_safety(),
        )
        data = attrs.evolve(data, recovery_refusal=self._recovery_refusal(findings, data))
        findings += check_findings(data)
        from pgsnap.clones import drill_findings  # noqa: PLC0415

        findings += drill_findings(
            data.backups, self.catalog.list_drills(), self.catalog.list_clones()
        )
        seg = data.segment_size
        index = data.index
        wal_lines = []
        if data.archive_error is not None:
            wal_lines.append(f"cannot be read: {data.archive_error}")
        for tli in index.timelines():
            ranges = index.ranges(tli)
            gaps = index.gaps(tli)
            wal_lines.append(
                f"timeline {tli}: {sum(r.count for r in ranges)} segments in {len(ranges)} "
                f"range(s)"
                + (
                    f"; gaps: {', '.join(g.names(seg)[0] for g in gaps[:5])}"
                    if gaps
                    else "; no gaps"
                )
            )
        for g in switch_gaps(index, data.timelines):
            wal_lines.append(
                f"timeline {g.parent}: missing {g.first} .. {g.last} before timeline "
                f"{g.child} forks at {g.switchpoint} (replay along timeline {g.child} needs them)"
            )
        if not wal_lines:
            wal_lines.append("no WAL archived yet")
        backups = tuple(
            f"{b.id} {b.state.value} start {b.start_lsn} stop {b.stop_lsn} "
            f"({b.stop_time.isoformat() if b.stop_time else '-'})"
            for b in data.backups
        )
        return CheckReport(
            findings=tuple(findings),
            archiver=None if archiver is None else archiver_health(archiver),
            wal=tuple(wal_lines),
            backups=backups,
            unreadable=data.unreadable,
            storage_problems=data.storage_problems,
        )

    def _recovery_refusal(
        self, findings: Sequence[Finding], data: CheckFacts
    ) -> tuple[str, str] | None:
        """Why the recovery planner refuses to recover the newest backup to the end of
        the archive (the archive alone: the WAL volume counted lost), unless another
        finding already says it. The same continuity analysis a recovery runs."""
        if data.archive_error is not None or not any(b.is_usable for b in data.backups):
            return None
        request = RecoveryRequest(lost=frozenset({VolumeRole.DATA, VolumeRole.WAL}))
        try:
            facts = self.observer.recovery_facts(request, read_wal=False, backups=data.backups)
            plan_recovery(facts, request)
        except PlanningError as exc:
            named = [f for f in findings if f.severity is Severity.ERROR]
            missing = tuple(getattr(exc, "missing", ()) or ())
            if missing and any(missing[0] in f.message for f in named):
                return None  # a wal_gap / backup_wal finding names it already
            return type(exc).__name__, f"{exc.message} (hint: {exc.hint})" if exc.hint else (
                exc.message
            )
        except PgsnapError as exc:  # the facts cannot be gathered: other findings say why
            log.debug("check: no recovery analysis: %s", exc)
        return None

    def timeline(self, plan: Plan | None = None) -> TimelineView:
        """What is recoverable, as a picture (:mod:`pgsnap.timeline`): timelines with
        their fork points, the archived WAL and its gaps, the backups by state with the
        window each can be recovered to, pins, restore points, drills. It renders as
        SVG in a notebook; ``pgsnap timeline --svg/--html`` writes it. With a recovery
        ``plan`` its target and chosen backup are marked."""
        view = self.observer.timeline_view()
        return view if plan is None else view.with_target(plan_target(plan))

    def plan_html(self, plan: Plan) -> str:
        """A standalone HTML page of ``plan``: its table, and for a recovery the picture
        of what is recoverable with the plan's target and backup marked."""
        from pgsnap.timeline.svg import render_svg  # noqa: PLC0415

        picture = render_svg(self.timeline(plan)) if plan.kind == "recovery" else ""
        title = html.escape(f"pgsnap: {plan.kind} plan {plan.id[:12]}")
        return (
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:.2em .5em;vertical-align:top}</style>"
            f"</head><body>{picture}{plan._repr_html_()}</body></html>"
        )

    def backups(self, policy: RetentionPolicy | None = None) -> BackupList:
        """The catalog's backups, oldest first (a tuple that renders as a table).

        Catalog entries that cannot be read are in its ``unreadable``, each
        with its path and the error. With a retention ``policy``, the list's
        ``forecast`` says which backups the next :meth:`expire` with it
        removes (and why), marks unusable, or keeps, and until when secure
        snapshots hold (the storage and the archive are observed, as for
        :meth:`plan_expiry`; nothing changes). Without one only the catalog
        is read.
        """
        if policy is not None and not isinstance(policy, RetentionPolicy):
            raise InputError(
                f"policy must be a RetentionPolicy or None, not {policy!r}",
                hint="e.g. RetentionPolicy(redundancy=7, window=timedelta(days=14))",
                argument="policy",
            )
        now = self._now()
        if policy is None:
            scan: CatalogScan = scan_catalog(self.catalog)
            drills = self.catalog.list_drills()
            return BackupList(scan.records, scan.unreadable, now=now, drills=drills)
        facts = self.observer.expiry_facts()
        scan = scan_catalog(self.catalog)
        forecast = expiry_forecast(facts, policy)
        return BackupList(
            scan.records,
            scan.unreadable,
            forecast=forecast,
            now=now,
            drills=self.catalog.list_drills(),
        )

    def index_wal(
        self, on_progress: Callable[[str, Mapping[str, Any]], None] | None = None
    ) -> WalIndexRun:
        """Read the archived WAL a recovery from the newest backup reads into the WAL
        index (``pgsnap wal --index``), so that a later plan of a time, xid or
        restore-point target reads only the segment that holds its target instead of
        all the WAL since the backup: run it after backups, or from a timer. Segments
        already indexed are not read again. Returns what it read
        (:class:`~pgsnap.observe.WalIndexRun`); ``on_progress`` is told as it goes."""
        return self.observer.index_wal(on_progress)

    def wal_report(self, segment_size: int | None = None) -> ArchiveReport:
        """The WAL archive per timeline (``pgsnap wal``): present runs of segments,
        gaps, and segments missing before a timeline switch.

        ``segment_size`` (None: the newest backup's, else the server's, else
        the size of a plain segment file in the archive; a
        :class:`~pgsnap.errors.ConfigurationError` when none says) tells
        segment numbers from names. The archive is listed once.
        """
        seg = segment_size if segment_size is not None else self._archive_segment_size()
        index = self.archive.index(seg)
        graph = self.archive.histories(index.history_names)  # no second listing
        return archive_report(self.archive.location, index, graph, seg)

    def _archive_segment_size(self) -> int:
        backups = self.catalog.list()
        if backups:
            return backups[-1].wal_segment_size
        try:
            return self.adapter.describe().wal_segment_size
        except PgsnapError as exc:
            log.debug("segment size: the server cannot say (%s)", exc)
        # A plain segment's size, as the archive's stat gives it.
        size = archived_segment_size(self.archive)
        if size is not None:
            return size
        raise ConfigurationError(
            "cannot tell the WAL segment size: no backup, the server is down and the archive "
            "holds no plain segment",
            hint="start the server or take a backup first",
        )

    # ------------------------------------------------------------------ plan

    def plan_backup(
        self,
        label: str | None = None,
        *,
        backup_id: str | None = None,
        fast: bool = True,
        wal_timeout: float = 60.0,
        secure_snapshots: bool = False,
        max_standby_lag: int = DEFAULT_MAX_STANDBY_LAG,
        due_after: float | None = None,
        checkpoint: str | None = None,
    ) -> Plan:
        """Observe, run the preflight, and return the backup plan.

        ``label`` (default ``pgsnap <id>``) and ``backup_id`` (default: the
        time, e.g. ``20261130T120000123Z``) name the backup; ``fast`` asks for
        an immediate checkpoint; ``wal_timeout`` is how long (seconds) the
        backup waits for its WAL to reach the archive. On a standby the backup
        is taken there (see docs/reference/standbys.md); ``max_standby_lag`` is
        how many bytes of WAL its replay may be behind. ``due_after`` (seconds):
        raise :class:`~pgsnap.errors.BackupNotDue` instead when a DONE backup started
        within that long, now and again when the run holds the cluster lock (a
        scheduled run that comes twice takes one backup). ``checkpoint`` chooses how
        the backup starts (docs/concepts.md, "Fast or gentle"): ``"fast"``
        (an immediate checkpoint: the shortest time to a backup; the default),
        ``"scheduled"`` (wait until PostgreSQL's next timed checkpoint is due and
        take its place with the backup's spread checkpoint: no checkpoint is added,
        the gentlest), ``"next"`` (wait for PostgreSQL's next checkpoint to end, then
        a fast one with little left to write) or ``"spread"`` (a checkpoint spread as
        PostgreSQL spreads its own, begun now); it overrides ``fast``. A bad argument is an
        :class:`~pgsnap.errors.InputError` (a ``ValueError``) with a hint,
        before anything is observed.
        """
        label = _label(label)
        backup_id = _backup_id(backup_id)
        fast = _flag("fast", fast)
        wait = False
        if checkpoint is not None:
            fast, wait = _checkpoint(checkpoint)
        wal_timeout = _seconds("wal_timeout", wal_timeout)
        secure_snapshots = _flag("secure_snapshots", secure_snapshots)
        max_standby_lag = _bytes("max_standby_lag", max_standby_lag)
        if due_after is not None:
            due_after = _seconds("due_after", due_after)
            self._refuse_if_not_due(due_after)
        now = self._now()
        backup_id = backup_id or now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
        request = BackupRequest(
            backup_id=backup_id,
            label=label or f"pgsnap {backup_id}",
            fast_checkpoint=fast,
            wait_for_checkpoint=wait,
            wal_timeout=wal_timeout,
            secure_snapshots=secure_snapshots,
            max_standby_lag=max_standby_lag,
            due_after=due_after,
        )
        return plan_backup(self.backup_facts(), request)

    def _refuse_if_not_due(self, due_after: float) -> None:
        """Raise BackupNotDue when a DONE backup started within ``due_after`` seconds."""
        newest = getattr(self.catalog, "newest", None)
        if callable(newest):
            record = newest()
        else:
            done = [b for b in self.catalog.list() if b.is_usable]
            record = done[-1] if done else None
        if record is None:
            return
        age = (self._now() - record.start_time).total_seconds()
        if age < due_after:
            raise BackupNotDue(
                f"no backup taken: backup {record.id} started {age:.0f} s ago, within "
                f"{due_after:g} s",
                hint="a scheduled run that comes again within its interval takes no backup",
                backup_id=record.id,
            )

    def plan_recovery(
        self,
        target: RecoveryTarget | None = None,
        *,
        timeline: str | int = "latest",
        action: RecoveryAction | str = RecoveryAction.PROMOTE,
        lost: Iterable[VolumeRole | str] | VolumeRole | str = (VolumeRole.DATA,),
        backup_id: str | None = None,
        safety_snapshot: bool = True,
        from_copy: bool | str = False,
        recovery_timeout: float = 600.0,
        server_timeout: float = 120.0,
        restore_timeout: float = 3600.0,
        device_timeout: float = 120.0,
    ) -> Plan:
        """Observe and return the recovery plan (or raise a PlanningError saying why not).

        ``target`` (default: latest); ``timeline``: ``"latest"``, ``"current"``
        or a number; ``action``: promote, pause or shutdown; ``lost``: the
        volume roles lost (``"data"``, ``"wal"``); ``backup_id``: use this
        backup; ``safety_snapshot``: snapshot what is overwritten first;
        ``from_copy``: restore from a copy off the array (True: the chosen
        backup's newest copy; a copy id: that copy) even when the snapshots are
        there (without it a copy is used for a backup whose snapshots are gone). The
        waits, in seconds: ``server_timeout`` for the server to stop (a
        shutdown waits for the archiver, so a slow ``archive_command`` needs
        more) and to start, ``recovery_timeout`` for replay to reach the
        target, ``restore_timeout`` for a restore the storage completes in the
        background, ``device_timeout`` for a re-attached volume's device.

        A bad argument is an :class:`~pgsnap.errors.InputError` or
        :class:`~pgsnap.errors.ConfigurationError` (both ``ValueError``) whose
        hint lists the valid values, raised before anything is observed.
        """
        request = RecoveryRequest(
            target=_target(target),
            timeline=_timeline(timeline),
            action=_action(action),
            lost=_lost(lost),
            backup_id=_backup_id(backup_id),
            safety_snapshot=_flag("safety_snapshot", safety_snapshot),
            from_copy=from_copy is True,
            copy_id=_copy_id(from_copy),
            recovery_timeout=_seconds("recovery_timeout", recovery_timeout),
            server_timeout=_seconds("server_timeout", server_timeout),
            restore_timeout=_seconds("restore_timeout", restore_timeout),
            device_timeout=_seconds("device_timeout", device_timeout),
        )
        return self._plan_recovery(request)

    def recover(
        self,
        target: RecoveryTarget | None = None,
        *,
        on_event: Callable[[Event], None] | None = None,
        **options: Any,
    ) -> ExecutionResult:
        """Plan and execute a recovery (``pgsnap recover --yes``): ``target`` and
        ``options`` as :meth:`plan_recovery`, ``on_event`` as :meth:`execute`.

        Asks first whether another run holds the cluster (a second recovery
        fails at once, before anything is observed). To look at the plan
        before it runs, call :meth:`plan_recovery` and :meth:`execute`.
        """
        self.check_not_busy("recovery")
        return self.execute(self.plan_recovery(target, **options), on_event=on_event)

    def _plan_recovery(self, request: RecoveryRequest, *, read_wal: bool = True) -> Plan:
        """Plan from what is known of the archive, probed by name; confirm what the plan
        rests on; on any doubt (a refusal, a segment gone, a gap) list the archive and
        plan again, as before (:mod:`pgsnap.wal.known`)."""
        facts = self.observer.recovery_facts(request, read_wal=read_wal, by_name=True)
        if facts.archive_by_name:
            try:
                plan = plan_recovery(facts, request)
            except PlanningError as exc:
                why: str | None = f"the plan was refused ({exc.message})"
            else:
                backup_id = plan.summary.get("backup", "").split(" ", 1)[0]
                why = self.observer.confirm_archive(facts, backup_id)
                if why is None:
                    return plan
            log.info("the WAL archive is listed to plan again: %s", why)
            facts = self.observer.recovery_facts(request, read_wal=read_wal, backups=facts.backups)
        return plan_recovery(facts, request)

    # ------------------------------------------------------------------ clones

    def plan_clone(
        self,
        target: RecoveryTarget | None = None,
        *,
        name: str | None = None,
        host: str | None = None,
        at: str | None = None,
        port: int | None = None,
        action: RecoveryAction | str = RecoveryAction.PROMOTE,
        backup_id: str | None = None,
        timeline: str | int = "latest",
        listen_addresses: str | None = None,
        mask_sql: str = "",
        mask_dbname: str = "postgres",
        mask_script: str = "",
        recovery_timeout: float = 600.0,
        server_timeout: float = 120.0,
    ) -> Plan:
        """Observe and return the plan of a clone (or raise a PlanningError saying why not).

        A clone is a separate PostgreSQL instance on new writable copies of the snapshots
        of the backup a recovery to ``target`` would use (default: latest), recovered
        there and promoted (``action="promote"``) or paused at the target for read-only
        reporting (``"pause"``). ``name`` (default ``c<time>``) names it; it runs on
        ``host`` (the database host: the only one supported yet), below ``at``
        (default: beside the data volume), on ``port`` (default: the first free one
        from 55432), listening on its Unix socket in ``at`` and on
        ``listen_addresses`` (default: none when pgsnap reaches the cluster through a
        Unix socket; the cluster's own ``listen_addresses`` when it reaches it over TCP,
        as it then reaches the clone). ``mask_sql`` (run in ``mask_dbname``) and
        ``mask_script`` are the masking hook. It never writes to the cluster, its
        volumes or its archive (see :mod:`pgsnap.planner.clone`).
        """
        from pgsnap.clones import clone_request, plan_clone_for  # noqa: PLC0415 - on use

        request = clone_request(
            self,
            name=name,
            host=host,
            at=at,
            port=port,
            target=_target(target),
            action=_action(action),
            backup_id=_backup_id(backup_id),
            timeline=_timeline(timeline),
            listen_addresses=listen_addresses,
            mask_sql=mask_sql,
            mask_dbname=mask_dbname,
            mask_script=mask_script,
            recovery_timeout=_seconds("recovery_timeout", recovery_timeout),
            server_timeout=_seconds("server_timeout", server_timeout),
        )
        return plan_clone_for(self, request)

    def clone(
        self,
        target: RecoveryTarget | None = None,
        *,
        on_event: Callable[[Event], None] | None = None,
        **options: Any,
    ) -> CloneRecord:
        """Plan and execute a clone (``pgsnap clone create``); return its record, ready.
        ``target`` and ``options`` as :meth:`plan_clone`. A clone that fails is undone
        (its volumes deleted, its record forgotten) before the error is raised."""
        plan = self.plan_clone(target, **options)
        self.execute(plan, on_event=on_event)
        return self.catalog.get_clone(str(plan.summary["clone"]))

    def clones(self) -> tuple[CloneRecord, ...]:
        """The recorded clones, oldest first (``pgsnap clone list``)."""
        return self.catalog.list_clones()

    def plan_clone_destroy(self, name: str) -> Plan:
        """The plan that destroys clone ``name`` (stop, delete its volumes, remove its
        directory, forget it), whatever state it was left in."""
        from pgsnap.planner.clone import plan_clone_destroy  # noqa: PLC0415
        from pgsnap.planner.standby import plan_standby_destroy  # noqa: PLC0415

        record = self.catalog.get_clone(name)
        if record.purpose == "standby":
            return plan_standby_destroy(record)  # its slot is dropped too
        return plan_clone_destroy(record)

    def destroy_clone(
        self, name: str, *, on_event: Callable[[Event], None] | None = None
    ) -> ExecutionResult:
        """Destroy clone ``name`` (``pgsnap clone destroy``); nothing of it is left."""
        return self.execute(self.plan_clone_destroy(name), on_event=on_event)

    def plan_seed_standby(
        self,
        name: str,
        *,
        primary_conninfo: str,
        slot: str = "",
        backup_id: str | None = None,
        host: str | None = None,
        at: str | None = None,
        port: int | None = None,
        listen_addresses: str | None = None,
        server_timeout: float = 120.0,
        catch_up_timeout: float = 600.0,
    ) -> Plan:
        """Observe and return the plan that seeds a new streaming standby ``name`` from a
        backup's snapshots (``pgsnap standby create``), or raise a PlanningError saying
        why it cannot succeed.

        The backup is the newest whose WAL, with the primary's ``pg_wal``, reaches the
        primary's position on its timeline (or ``backup_id``). Writable copies of its
        snapshots are made and mounted on ``host`` below ``at`` (as for a clone), a
        physical replication slot (``slot``, default ``pgsnap_<name>``) is created on the
        primary, and the copy starts as a standby on ``port`` with ``primary_conninfo``
        (how it connects to the primary: no password, it belongs in the standby OS
        user's ``~/.pgpass``) and the archive's ``restore_command``. The plan is done
        once it streams and has caught up. The primary is this cluster's server, or its
        ``[primary]`` when this cluster is a standby (see docs/reference/standbys.md).
        """
        from pgsnap.clones import plan_standby_for, standby_request  # noqa: PLC0415

        request = standby_request(
            self,
            name=name,
            primary_conninfo=primary_conninfo,
            slot=slot,
            backup_id=_backup_id(backup_id),
            host=host,
            at=at,
            port=port,
            listen_addresses=listen_addresses,
            server_timeout=_seconds("server_timeout", server_timeout),
            catch_up_timeout=_seconds("catch_up_timeout", catch_up_timeout),
        )
        return plan_standby_for(self, request)

    def seed_standby(
        self,
        name: str,
        *,
        primary_conninfo: str,
        on_event: Callable[[Event], None] | None = None,
        **options: Any,
    ) -> CloneRecord:
        """Plan and execute a new standby (arguments as :meth:`plan_seed_standby`);
        return its record, ready: streaming and caught up. A standby that fails is
        undone (its volumes deleted, its slot dropped) before the error is raised."""
        plan = self.plan_seed_standby(name, primary_conninfo=primary_conninfo, **options)
        self.execute(plan, on_event=on_event)
        return self.catalog.get_clone(name)

    def standbys(self) -> tuple[CloneRecord, ...]:
        """The standbys pgsnap seeded (``pgsnap standby list``), oldest first."""
        return tuple(c for c in self.catalog.list_clones() if c.purpose == "standby")

    def plan_standby_destroy(self, name: str) -> Plan:
        """The plan that destroys seeded standby ``name``: stop it, drop its slot on the
        primary, delete its volumes, remove its directory, forget it."""
        from pgsnap.planner.standby import plan_standby_destroy  # noqa: PLC0415

        record = self.catalog.get_clone(name)
        if record.purpose != "standby":
            raise InputError(
                f"{name} is a {record.purpose}, not a standby pgsnap seeded",
                hint=f"destroy it with pgsnap clone destroy {name}",
                argument="name",
            )
        return plan_standby_destroy(record)

    def destroy_standby(
        self, name: str, *, on_event: Callable[[Event], None] | None = None
    ) -> ExecutionResult:
        """Destroy seeded standby ``name`` (``pgsnap standby destroy``): nothing of it is
        left, its slot included."""
        return self.execute(self.plan_standby_destroy(name), on_event=on_event)

    def drill(
        self,
        target: RecoveryTarget | None = None,
        *,
        backup_id: str | None = None,
        checks: Sequence[str] = (),
        keep_on_failure: bool = False,
        on_event: Callable[[Event], None] | None = None,
        **options: Any,
    ) -> DrillRecord:
        """A restore drill (``pgsnap drill``): clone backup ``backup_id`` (default: the one
        a recovery to ``target`` would use), recover it to ``target`` (default: latest,
        all the archived WAL), check it (the target reached, ``amcheck`` on every
        database, data checksums, the server log, and each SQL of ``checks``, which
        must return a true first value or a non-empty result), measure RTO and RPO,
        destroy the clone (kept on failure when ``keep_on_failure``), and record the
        result in the catalog. Never raises for a failed check: the record says what
        failed. ``options`` as :meth:`plan_clone`."""
        from pgsnap.clones import run_drill  # noqa: PLC0415

        return run_drill(
            self,
            _target(target),
            backup_id=backup_id,
            checks=tuple(checks),
            keep_on_failure=keep_on_failure,
            on_event=on_event,
            options=options,
        )

    def drills(self, backup_id: str | None = None) -> tuple[DrillRecord, ...]:
        """The recorded drills (of one backup, or all), oldest first."""
        return self.catalog.list_drills(backup_id)

    # ------------------------------------------------------------------ execute

    def _check_fresh_retention(self, plan: Plan) -> None:
        """Refuse an expiry or delete plan whose facts changed since it was made."""

        def replan() -> Plan:
            facts = self.observer.expiry_facts()
            if plan.kind == "delete":
                return plan_delete(facts, str(plan.request.get("backup_id")))
            if plan.kind == "delete-safety":
                return plan_delete_safety(facts, str(plan.request.get("safety_name")))
            return plan_expiry(facts, RetentionPolicy.from_request(plan.request))

        _same_plan(plan, replan, "the catalog, the snapshots or the archive changed")

    def _check_fresh_pin(self, plan: Plan) -> None:
        """Refuse a pin plan made before the backup's pin changed (or it went)."""
        backup_id = str(plan.request.get("backup_id"))
        wanted = decode_value(Pin | None, plan.request.get("pin"), "the plan's pin")
        _same_plan(
            plan,
            lambda: plan_pin(self.catalog.get(backup_id), wanted),
            f"the pin of backup {backup_id} changed",
        )

    def _check_fresh_copy(self, plan: Plan) -> None:
        """Refuse a copy plan made before its backup's snapshots or copies changed."""
        backup_id = str(plan.request.get("backup_id"))
        _same_plan(
            plan,
            lambda: self.plan_copy(
                backup_id,
                str(plan.request.get("target")),
                copy_id=str(plan.request.get("copy_id")),
            ),
            f"backup {backup_id}'s snapshots or copies changed",
        )

    def _check_fresh_copy_expiry(self, plan: Plan) -> None:
        """Refuse a copy expiry plan made before the copies, their manifests, the
        snapshots or what the policy decides changed."""
        target = str(plan.request.get("target"))
        stale = plan.request.get("stale_after_seconds")
        _same_plan(
            plan,
            lambda: plan_copy_expiry(
                self.observer.copy_expiry_facts(target),
                CopyRetentionPolicy.from_request(plan.request),
                stale_after=dt.timedelta(seconds=stale)
                if isinstance(stale, int)
                else DEFAULT_STALE_AFTER,
                key_file=self.copy_key_file or "",
            ),
            f"the copies in {target} (or their backups' snapshots) changed",
        )

    def _check_fresh(self, plan: Plan) -> None:
        """Refuse a recovery plan whose facts changed since it was made.

        Not a full re-plan: the facts its fingerprint covers are observed
        again with the plan's backup pinned and without reading the WAL (the
        target was verified when planning), and the digest compared. Only
        when that does not confirm the plan (a target the planner can place
        only with the WAL, such as a time just before a gap) is the WAL read
        too (from the index) before the plan is refused.
        """
        if plan.kind in ("expiry", "delete", "delete-safety"):
            self._check_fresh_retention(plan)
            return
        if plan.kind in ("pin", "unpin"):
            self._check_fresh_pin(plan)
            return
        if plan.kind == "copy":
            self._check_fresh_copy(plan)
            return
        if plan.kind == "backup":
            due = plan.request.get("due_after")
            if isinstance(due, int | float):
                self._refuse_if_not_due(float(due))  # another server's run may have ended
            return
        if plan.kind == "copy-expiry":
            self._check_fresh_copy_expiry(plan)
            return
        if plan.kind == "clone":
            from pgsnap.clones import replan_clone  # noqa: PLC0415

            _same_plan(plan, lambda: replan_clone(self, plan), "the backups changed")
            return
        if plan.kind == "standby":
            from pgsnap.clones import replan_standby  # noqa: PLC0415

            _same_plan(
                plan, lambda: replan_standby(self, plan), "the backups or the primary changed"
            )
            return
        if plan.kind != "recovery" or not plan.request:
            return
        request = from_dict(RecoveryRequest, plan.request)
        label = WriteBackupLabel.name
        planned = [s.params.get("backup_id") for s in plan.steps if s.action == label]
        if len(planned) == 1 and isinstance(planned[0], str) and request.backup_id is None:
            request = attrs.evolve(request, backup_id=planned[0])

        def replan() -> Plan:
            try:
                now = self._plan_recovery(request, read_wal=False)
                if now.fingerprint == plan.fingerprint:
                    return now
            except PlanningError:
                pass
            # Without the WAL the planner cannot place every target (a time just
            # before a gap needs the commit after it): ask again with the WAL.
            return self._plan_recovery(request)

        _same_plan(plan, replan, "the facts changed (backups, snapshots, timelines or WAL)")

    # ------------------------------------------------------------------ retention

    def plan_expiry(self, policy: RetentionPolicy) -> Plan:
        """Observe and return the plan that applies the retention ``policy``: what
        it deletes (each step with its reason), what it keeps and why (``kept``).
        See :mod:`pgsnap.planner.expiry`."""
        if not isinstance(policy, RetentionPolicy):
            raise InputError(
                f"policy must be a RetentionPolicy, not {policy!r}",
                hint="e.g. RetentionPolicy(redundancy=7, window=timedelta(days=14))",
                argument="policy",
            )
        return plan_expiry(self.observer.expiry_facts(), policy)

    def expire(self, policy: RetentionPolicy, *, dry_run: bool = False) -> Plan:
        """Apply the retention ``policy``: plan, then execute (journalled and
        resumable like every plan). With ``dry_run`` nothing is deleted.
        Returns the plan (its ``lost`` says what went, ``kept`` what stayed)."""
        plan = self.plan_expiry(policy)
        if not dry_run and plan.steps:
            self.execute(plan)
        return plan

    def plan_delete(self, backup_id: str) -> Plan:
        """The plan that deletes one backup: refused while it is pinned, secure or
        unfinished (:func:`~pgsnap.planner.expiry.plan_delete`)."""
        return plan_delete(self.observer.expiry_facts(), backup_id)

    def safety_snapshots(self) -> tuple[SafetySnapshot, ...]:
        """The safety snapshots recoveries took and recorded, oldest first: each holds
        the state of the volumes a recovery overwrote, kept until deleted
        (:meth:`delete_safety_snapshot`, or an expiry with ``safety_after``)."""
        return self.catalog.list_safety()

    def plan_delete_safety(self, name: str) -> Plan:
        """The plan that deletes the safety snapshot ``name`` (its snapshot group, then
        its record); refused while the run that took it has not ended."""
        if not isinstance(name, str) or not name:
            raise InputError(
                f"a safety snapshot is named by text, not {name!r}",
                hint="see the names with `pgsnap safety list`",
                argument="name",
            )
        return plan_delete_safety(self.observer.expiry_facts(), name)

    def delete(
        self,
        backup_id: str,
        *,
        dry_run: bool = False,
        on_event: Callable[[Event], None] | None = None,
    ) -> Plan:
        """Delete one backup (``pgsnap delete``): :meth:`plan_delete`, then execute it
        (with ``dry_run`` nothing is deleted). Returns the plan."""
        plan = self.plan_delete(backup_id)
        if not dry_run:
            self.execute(plan, on_event=on_event)
        return plan

    def delete_safety_snapshot(self, name: str, *, dry_run: bool = False) -> Plan:
        """Delete the safety snapshot ``name`` (plan, then execute; with ``dry_run``
        nothing is deleted). Returns the plan."""
        plan = self.plan_delete_safety(name)
        if not dry_run:
            self.execute(plan)
        return plan

    def plan_pin(self, backup_id: str, reason: str, *, until: dt.datetime | None = None) -> Plan:
        """The plan that keeps ``backup_id`` whatever retention says, forever or
        ``until`` a time, for ``reason`` (required: the next person needs to know
        why). See :func:`~pgsnap.planner.expiry.plan_pin`."""
        if not isinstance(reason, str) or not reason.strip():
            raise InputError(
                "a pin needs a reason",
                hint="say why the backup is kept, e.g. --reason 'audit 2026'",
                argument="reason",
            )
        if until is not None and (not isinstance(until, dt.datetime) or until.tzinfo is None):
            raise InputError(
                f"until must be an aware datetime, not {until!r}",
                hint="give a time zone, e.g. 2027-01-01T00:00:00+00:00",
                argument="until",
            )
        return plan_pin(self.catalog.get(backup_id), Pin(reason.strip(), until))

    def plan_unpin(self, backup_id: str) -> Plan:
        """The plan that removes ``backup_id``'s pin (retention decides again)."""
        return plan_pin(self.catalog.get(backup_id), None)

    def pin(self, backup_id: str, reason: str, *, until: dt.datetime | None = None) -> BackupRecord:
        """Plan and execute a pin (:meth:`plan_pin`); return the pinned record."""
        self.execute(self.plan_pin(backup_id, reason, until=until))
        return self.catalog.get(backup_id)

    def unpin(self, backup_id: str) -> BackupRecord:
        """Plan and execute an unpin (:meth:`plan_unpin`); return the record."""
        self.execute(self.plan_unpin(backup_id))
        return self.catalog.get(backup_id)

    def plan_copy(
        self,
        backup_id: str,
        target: str | os.PathLike[str] | None = None,
        *,
        copy_id: str | None = None,
    ) -> Plan:
        """The plan that copies backup ``backup_id`` off the array to the directory
        ``target`` (default :attr:`copy_target`): see :func:`pgsnap.planner.copy.plan_copy`."""
        where = target if target is not None else self.copy_target
        if where is None:
            raise ConfigurationError(
                "no copy target: say where copies go",
                hint="pgsnap copy BACKUP --to DIR, or [copies] path = DIR in the configuration",
            )
        record = self.catalog.get(backup_id)
        location = _target_location(where)
        request = CopyRequest(
            backup_id=record.id,
            target_dir=location,
            copy_id=copy_id,
            target_options=self.copy_target_options if location.startswith("s3://") else {},
            key_file=self.copy_key_file or "",
            mount_root=self.copy_mount_root,
            runs_on=self._copy_runs_on(),
            parallel=self.copy_parallel,
            bandwidth_limit=self.copy_bandwidth_limit,
        )
        observer = self.observer
        access = observer.snapshot_access(record, host=self.copy_host or self.host.name)
        return plan_copy(record, access, request, observer.backup_wal(record))

    def _copy_runs_on(self) -> str:
        """The host a copy reads the snapshots on, by the storage's name for it: the
        database host when pgsnap reaches it locally; else the backup host
        ``[copies] host`` names (pgsnap runs there); else the database host, read
        through the Host seam (``tar`` there, its stream over ssh)."""
        if isinstance(self.host.runner, LocalRunner):
            return self.host.name
        if self.copy_host and self.copy_host != self.host.name:
            return self.copy_host
        return self.host.name

    def copy(
        self,
        backup_id: str,
        target: str | os.PathLike[str] | None = None,
        *,
        copy_id: str | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> CopyRecord:
        """Plan and execute a copy of backup ``backup_id`` off the array
        (:meth:`plan_copy`); return the copy as the catalog now records it."""
        plan = self.plan_copy(backup_id, target, copy_id=copy_id)
        self.execute(plan, on_event=on_event)
        wanted = str(plan.request["copy_id"])
        record = self.catalog.get(backup_id)
        return next(c for c in record.copies if c.copy_id == wanted)

    def verify_copy(
        self,
        copy_id: str,
        target: str | os.PathLike[str] | None = None,
        *,
        sample: float | None = None,
    ) -> VerifyReport:
        """Check that every chunk of copy ``copy_id`` in the directory ``target``
        (default :attr:`copy_target`) is there and whole, or a ``sample`` of them
        (``0 < sample <= 1``): :func:`pgsnap.copies.verify_copy`. Reads only. An
        encrypted copy is read with the key of :attr:`copy_key_file`."""
        where = target if target is not None else self.copy_target
        if where is None:
            raise ConfigurationError(
                "no copy target: say where the copy is",
                hint="pgsnap verify-copy COPY --to DIR, or [copies] path = DIR",
            )
        location = _target_location(where)
        options = self.copy_target_options if location.startswith("s3://") else {}
        key = CopyKey.from_file(self.copy_key_file) if self.copy_key_file else None
        return verify_copy(open_target(location, options), copy_id, sample=sample, key=key)

    # ------------------------------------------------------------------ copy retention

    def _copy_location(self, target: str | os.PathLike[str] | None, command: str) -> str:
        where = target if target is not None else self.copy_target
        if where is None:
            raise ConfigurationError(
                "no copy target: say which one",
                hint=f"pgsnap {command} --to DIR (or s3://bucket/prefix), or [copies] path "
                "in the configuration",
            )
        return _target_location(where)

    def plan_copy_expiry(
        self,
        policy: CopyRetentionPolicy | None = None,
        target: str | os.PathLike[str] | None = None,
        *,
        stale_after: dt.timedelta = DEFAULT_STALE_AFTER,
    ) -> Plan:
        """Observe and return the plan that applies copy retention to the copies in
        ``target`` (default :attr:`copy_target`): ``policy``, default
        :attr:`copy_retention` (``[copies.retention]``; with neither, nothing is
        deleted). Its ``kept`` says why each copy stays, each step why a copy goes
        (see :mod:`pgsnap.planner.copy_expiry`); the plan ends with a garbage
        collection (``stale_after`` as :func:`~pgsnap.copies.collect_garbage`)."""
        chosen = policy if policy is not None else self.copy_retention
        if chosen is None:
            chosen = CopyRetentionPolicy()
        if not isinstance(chosen, CopyRetentionPolicy):
            raise InputError(
                f"policy must be a CopyRetentionPolicy, not {chosen!r}",
                hint="e.g. CopyRetentionPolicy(monthly=12, max_age=timedelta(days=800))",
                argument="policy",
            )
        location = self._copy_location(target, "expire-copies")
        return plan_copy_expiry(
            self.observer.copy_expiry_facts(location),
            chosen,
            stale_after=stale_after,
            key_file=self.copy_key_file or "",
        )

    def expire_copies(
        self,
        policy: CopyRetentionPolicy | None = None,
        target: str | os.PathLike[str] | None = None,
        *,
        dry_run: bool = False,
        on_event: Callable[[Event], None] | None = None,
    ) -> Plan:
        """Apply copy retention (``pgsnap expire-copies``): :meth:`plan_copy_expiry`,
        then execute it (journalled, under the cluster lock held exclusively, as an
        expiry). With ``dry_run`` nothing is deleted. Returns the plan."""
        plan = self.plan_copy_expiry(policy, target)
        if not _flag("dry_run", dry_run) and plan.steps:
            self.execute(plan, on_event=on_event)
        return plan

    def collect_copy_garbage(
        self,
        target: str | os.PathLike[str] | None = None,
        *,
        dry_run: bool = False,
        stale_after: dt.timedelta = DEFAULT_STALE_AFTER,
        on_event: Callable[[Event], None] | None = None,
    ) -> GcReport:
        """Remove from ``target`` (default :attr:`copy_target`) the chunks no manifest
        names (``pgsnap copy-gc``): :func:`pgsnap.copies.collect_garbage`, run as a
        one-step plan under the cluster lock held exclusively (no copy of this
        cluster runs meanwhile; the target's markers keep other clusters' copies
        safe). ``dry_run`` counts only (no lock, nothing written).

        Raises :class:`~pgsnap.errors.CopyBusy` (with ``holders``) while a copy or
        another collection is in progress on the target, and
        :class:`~pgsnap.errors.ClusterLockedError` while another run holds the cluster.
        """
        location = self._copy_location(target, "copy-gc")
        options = self.copy_target_options if location.startswith("s3://") else {}
        if _flag("dry_run", dry_run):
            return collect_garbage(
                open_target(location, options),
                clock=self._now,
                stale_after=stale_after,
                dry_run=True,
                key=CopyKey.from_file(self.copy_key_file) if self.copy_key_file else None,
            )
        plan = plan_collect_garbage(
            location,
            options,
            now=self._now(),
            stale_after=stale_after,
            key_file=self.copy_key_file or "",
        )
        try:
            result = self.execute(plan, on_event=on_event)
        except ExecutionError as exc:
            if isinstance(exc.cause, CopyBusy):
                raise exc.cause from exc  # nothing needs undoing: say who is in the way
            raise
        report = gc_report(result.outputs.get("collect-garbage", {}))
        if report is None:  # pragma: no cover - the step raises CopyBusy instead
            raise ExecutionError(
                "the garbage collection step reported nothing", step_id="collect-garbage"
            )
        return report

    def executor(
        self, on_event: Callable[[Event], None] | None = None, *, alone: bool = False
    ) -> Executor:
        """An :class:`~pgsnap.executor.Executor` wired to this cluster (``alone``: its
        runs hold the cluster lock exclusively, whatever their kind). In a notebook its
        events are also shown as an updating display (:attr:`progress`)."""
        events = on_event or self.on_event
        if self.progress is not False:
            from pgsnap.progress import notebook_reporter  # noqa: PLC0415

            shown = notebook_reporter()
            if shown is not None:
                events = _both(shown, events)
        return Executor(
            adapter=self.adapter,
            backend=self.backend,
            catalog=self.catalog,
            archive=self.archive,
            layout=self.layout,
            host=self.host,
            journal_dir=self.journal_dir,
            on_event=events,
            check_fresh=self._check_fresh,
            clock=self._now,
            hosts=self.clone_hosts,
            primary=self.primary,
            alone=alone,
        )

    def execute(
        self,
        plan: Plan,
        *,
        dry_run: bool = False,
        on_event: Callable[[Event], None] | None = None,
        alone: bool = False,
    ) -> ExecutionResult:
        """Run a plan (checking first that its facts still hold). ``alone``: hold the
        cluster lock exclusively, so that no other run overlaps this one, not even a
        backup beside a backup (what a scheduled run wants: no pile-up).

        Work a backend left running behind a step (btrfs deletes the subvolume a
        restore replaced while the server starts) has ended when this returns."""
        try:
            return self.executor(on_event, alone=alone).run(plan, dry_run=dry_run)
        finally:
            settle = getattr(self.backend, "settle", None)
            if callable(settle):
                settle()

    def resume(
        self, *, on_event: Callable[[Event], None] | None = None
    ) -> tuple[ExecutionResult, ...]:
        """Finish every interrupted plan (``pgsnap resume --yes``), oldest first:
        each resumes where it stopped, or is undone as its steps say. Returns
        their results (empty: nothing was interrupted)."""
        return tuple(self.execute(plan, on_event=on_event) for plan in self.interrupted())

    def interrupted(self) -> tuple[Plan, ...]:
        """Plans whose execution stopped half way; :meth:`execute` one to resume it."""
        return self.executor().interrupted()

    def lock_holders(self) -> tuple[LockHolder, ...]:
        """Who holds this cluster's lock now (plan kind and id, pid, host, since);
        empty when nobody does (:mod:`pgsnap.locks`)."""
        lock = self.executor().lock
        return () if lock is None else lock.holders()

    def check_not_busy(self, kind: str = "recovery", *, alone: bool = False) -> None:
        """Raise :class:`~pgsnap.errors.ClusterLockedError` now when a new ``kind`` plan
        would be refused: another run holds the cluster, or an interrupted run must
        be finished first (``alone``: any other run at all). Ask before planning (the
        CLI does), to fail at once."""
        self.executor(alone=alone).check_not_busy(kind)

    # ------------------------------------------------------------------ reconciliation

    def _orphans(
        self, backups: Iterable[BackupRecord], unreadable: Iterable[str]
    ) -> tuple[Orphan, ...]:
        """The orphan snapshot groups of this cluster's volumes (empty, and logged,
        when the storage cannot be listed: the check reports the storage apart)."""
        try:
            snapshots = self.backend.list_snapshots()
        except PgsnapError as exc:
            log.debug("check: the snapshots cannot be listed: %s", exc)
            return ()
        return find_orphans(
            backups,
            snapshots,
            volume_ids=[v.id for v in self.layout.volumes],
            holds=self.observer.snapshot_holds(),
            unreadable=unreadable,
            safety=self.catalog.list_safety(),
        )

    def orphans(self) -> tuple[Orphan, ...]:
        """Snapshots pgsnap made of this cluster's volumes that no catalog record
        names, one :class:`~pgsnap.planner.reconcile.Orphan` per group, oldest first
        (see :mod:`pgsnap.planner.reconcile`). Nothing is changed."""
        facts = self.observer.expiry_facts()
        return facts.orphans()

    def rebuild_catalog(
        self, *, dry_run: bool = False, log_timezone: dt.tzinfo | str | None = None
    ) -> RebuildReport:
        """Recreate the catalog records that are missing, from the storage's snapshot
        groups (named by backup id) and the archive's ``.backup`` files.

        A record already in the catalog is never overwritten (nor one whose
        file cannot be read). The report says what was rebuilt and, for each
        snapshot group or ``.backup`` file that could not become a record, why
        (:func:`~pgsnap.planner.reconcile.plan_rebuild`). With ``dry_run``
        nothing is written. ``log_timezone`` (a zone or its name, e.g.
        ``"Europe/Berlin"``: the server's ``log_timezone``) resolves the zone
        abbreviations PostgreSQL wrote in START/STOP TIME, such as ``CET``.
        """
        dry_run = _flag("dry_run", dry_run)
        zone = _zone(log_timezone)
        planned = plan_rebuild(self.observer.rebuild_facts(zone))
        if dry_run:
            return attrs.evolve(planned, dry_run=True)
        if not planned.rebuilt:
            return planned
        result = self.execute(rebuild_plan(planned))
        written: list[BackupRecord] = []
        skipped = list(planned.skipped)
        for record in planned.rebuilt:
            out = result.outputs.get(f"record-{record.id}", {})
            if out.get("written"):
                written.append(record)
            else:
                skipped.append((f"backup {record.id}", str(out.get("why", "not written"))))
        return attrs.evolve(planned, rebuilt=tuple(written), skipped=tuple(skipped))

    def backup(
        self,
        label: str | None = None,
        *,
        backup_id: str | None = None,
        fast: bool = True,
        wal_timeout: float = 60.0,
        secure_snapshots: bool = False,
        max_standby_lag: int = DEFAULT_MAX_STANDBY_LAG,
        due_after: float | None = None,
        checkpoint: str | None = None,
        alone: bool = False,
        on_event: Callable[[Event], None] | None = None,
    ) -> BackupRecord:
        """Plan and execute a backup; return its DONE record (arguments as
        :meth:`plan_backup`; ``alone`` and ``on_event`` as for :meth:`execute`)."""
        plan = self.plan_backup(
            label,
            backup_id=backup_id,
            fast=fast,
            wal_timeout=wal_timeout,
            secure_snapshots=secure_snapshots,
            max_standby_lag=max_standby_lag,
            due_after=due_after,
            checkpoint=checkpoint,
        )
        self.execute(plan, on_event=on_event, alone=alone)
        return self.backup_of(plan)

    def backup_of(self, plan: Plan) -> BackupRecord:
        """The catalog's record of the backup a backup ``plan`` takes (or took)."""
        if plan.kind != "backup":
            raise InputError(
                f"plan {plan.id} is a {plan.kind} plan, not a backup",
                hint="pass the plan plan_backup() returned",
                argument="plan",
            )
        backup_id = plan.request.get("backup_id")
        if not isinstance(backup_id, str):
            raise InputError(
                f"backup plan {plan.id} names no backup (request {sorted(plan.request)})",
                hint="pass the plan plan_backup() returned",
                argument="plan",
            )
        return self.catalog.get(backup_id)

    def _now(self) -> dt.datetime:
        """The clock's time, in UTC; a naive clock is a ConfigurationError, not a TypeError."""
        now = self.clock()
        if not isinstance(now, dt.datetime) or now.tzinfo is None or now.utcoffset() is None:
            raise ConfigurationError(
                f"the Cluster's clock returned {now!r}, not an aware datetime",
                hint="return aware times, e.g. datetime.now(timezone.utc)",
            )
        return now.astimezone(dt.UTC)
