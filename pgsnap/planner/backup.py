"""The backup planner (pure): preflight findings and the backup plan.

``preflight(facts)`` names every finding, errors blocking and warnings not;
``plan_backup(facts, request)`` returns the ordered :class:`~pgsnap.plan.Plan`
or raises :class:`~pgsnap.errors.PreflightError` listing the blocking findings.
"""

from __future__ import annotations

import os.path
from collections.abc import Sequence
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import PreflightError
from pgsnap.model import ArchiverStatus, LocationKind, Severity, Volume, VolumeRole
from pgsnap.operations import Ref
from pgsnap.operations.catalog import (
    FailBackup,
    MarkBackupDone,
    RecordBackupStart,
    RecordBackupStop,
    WaitForWal,
)
from pgsnap.operations.db import (
    AbortBackup,
    StartBackup,
    StopBackup,
    SwitchPrimaryWal,
    WaitForCheckpoint,
)
from pgsnap.operations.storage import DeleteSnapshotGroup, TakeSnapshotGroup
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import BackupFacts, PathFacts, fingerprint
from pgsnap.protocols import Capability
from pgsnap.wal import archiver_health

__all__ = [
    "DEFAULT_MAX_STANDBY_LAG",
    "BackupRequest",
    "Finding",
    "Severity",
    "archiving_status",
    "plan_backup",
    "preflight",
]


DEFAULT_MAX_STANDBY_LAG: Final = 256 * 1024 * 1024
"""A standby more than this many bytes of WAL behind is not backed up (256 MiB)."""


@frozen
class Finding:
    """One named preflight finding (``code`` is stable, for scripts)."""

    code: str
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.severity.value}: {self.message} [{self.code}]"


@frozen
class BackupRequest:
    """What the caller asks for: the id and label (made by the caller: no clock here)."""

    backup_id: str
    label: str
    fast_checkpoint: bool = True
    wait_for_checkpoint: bool = False
    """Wait for PostgreSQL's checkpoint schedule before backup mode (a gentle backup).
    With ``fast_checkpoint``, until its next checkpoint is over (the backup's own, fast,
    checkpoint then has little to write); without, until its next timed checkpoint is
    due (the backup's spread checkpoint takes its place)."""
    wal_timeout: float = 60.0
    """Seconds to wait for the stop segment and ``.backup`` file in the archive."""
    secure_snapshots: bool = False
    max_standby_lag: int = DEFAULT_MAX_STANDBY_LAG
    """On a standby: how many bytes of WAL its replay may be behind (its primary's
    position when pgsnap reaches the primary, else what it received) for a backup."""
    due_after: float | None = None
    """Seconds: take the backup only if no DONE backup started within this long before
    the run (checked when planning and again once the run holds the cluster lock)."""


def _under(path: str, mount_point: str) -> bool:
    p = os.path.normpath(path)
    m = os.path.normpath(mount_point)
    return p == m or p.startswith(m.rstrip("/") + "/")


def _holder(facts: BackupFacts, what: str) -> Volume:
    """The layout volume that must hold one of the cluster's directories."""
    layout = facts.layout
    if what == "pg_wal" and layout.wal is not None:
        return layout.wal
    if what.startswith("tablespace "):
        oid = int(what.rsplit("oid ", 1)[1].rstrip(")"))
        for vol in layout.by_role(VolumeRole.TABLESPACE):
            if vol.tablespace_oid == oid:
                return vol
    return layout.data


def _where(path: PathFacts) -> str:
    if path.mount is None:
        return path.real
    return f"{path.real}, on {path.mount.source} mounted at {path.mount.target}"


def _coverage(facts: BackupFacts) -> list[Finding]:
    """Every directory of the cluster lies on the volume of the layout that must hold it.

    Judged from the host's real mounts and resolved paths: a directory volume
    holds what lies under its directory; a block device holds what lies on the
    file system mounted from it.
    """
    out: list[Finding] = []
    err, warn = Severity.ERROR, Severity.WARNING
    on_storage = {v.id for v in facts.volumes}
    for vol in facts.layout.snapshotted:
        vf = facts.volume(vol.id)
        if vf is None and vol.id not in on_storage:
            continue  # the "volume_missing" finding says so
        if vf is None:
            out.append(
                Finding(
                    "coverage",
                    err,
                    f"nothing is known of how volume {vol.id} ({vol.role.value}) is reached "
                    "on the host; gather the facts with Cluster.backup_facts()",
                )
            )
        elif vf.location.kind is LocationKind.BLOCK_DEVICE and (
            vf.mount is None or vf.resolved is None
        ):
            out.append(
                Finding(
                    "coverage",
                    err,
                    f"volume {vol.id} ({vol.role.value}, device {vf.location.path}) is not "
                    f"mounted at its mount point {vol.mount_point}: fix the layout or mount it",
                )
            )
    for path in facts.paths:
        vol = _holder(facts, path.what)
        vf = facts.volume(vol.id)
        if vf is not None and path.on(vf):
            continue
        others = [
            v
            for v in facts.layout.snapshotted
            if (f := facts.volume(v.id)) is not None and path.on(f)
        ]
        if path.what.startswith("tablespace ") and vol is facts.layout.data and not others:
            out.append(
                Finding(
                    "coverage",
                    err,
                    f"{path.what} at {_where(path)} is on no volume of the layout: add a "
                    "volume with role 'tablespace' and its oid",
                )
            )
            continue
        if path.what == "pg_wal" and facts.layout.wal is None and not others:
            out.append(
                Finding(
                    "coverage",
                    err,
                    f"pg_wal lives at {_where(path)}, outside the data volume, and the "
                    "layout has no WAL volume: add the volume that holds it (role 'wal')",
                )
            )
            continue
        found = f" (it is on volume {others[0].id})" if others else ""
        out.append(
            Finding(
                "coverage",
                err,
                f"the {path.what} ({_where(path)}) is not on volume {vol.id} "
                f"({vol.role.value}, {vol.mount_point}){found}: fix the layout",
            )
        )
    server_oids = {t.oid for t in facts.server.tablespaces}
    for vol in facts.layout.by_role(VolumeRole.TABLESPACE):
        if vol.tablespace_oid not in server_oids:
            out.append(
                Finding(
                    "coverage",
                    warn,
                    f"the layout has a tablespace volume {vol.id} for oid "
                    f"{vol.tablespace_oid}, but the server has no such tablespace",
                )
            )
    return out


def _archive_mismatch(facts: BackupFacts) -> list[Finding]:
    """The archiver says it archived a file the archive does not hold: the backup's WAL
    would never arrive (the backup would wait, undo itself and be recorded FAILED)."""
    status = facts.archiver
    name = (status.last_archived_wal or "").strip()
    if not name or facts.last_archived_present is not False:
        return []
    when = (
        f" at {status.last_archived_time.isoformat(timespec='seconds')}"
        if status.last_archived_time
        else ""
    )
    command = (status.archive_command or "").strip()
    how = f"archive_command ({command})" if command else "the archiver"
    return [
        Finding(
            "archive_mismatch",
            Severity.ERROR,
            f"PostgreSQL archived {name}{when} ({status.archived_count} files archived "
            f"since its statistics were reset), but the archive {facts.archive_location} "
            f"lacks it: {how} writes somewhere else, copies nothing, or the files were "
            "removed; point [archive] path at the directory archive_command writes to "
            "(a backup would wait for its WAL in vain)",
        )
    ]


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def _standby(facts: BackupFacts, max_lag: int) -> list[Finding]:
    """A standby's own findings: it streams, keeps up, its primary writes full pages,
    and the primary pgsnap is told of is this standby's."""
    out: list[Finding] = []
    err, warn = Severity.ERROR, Severity.WARNING
    s = facts.server
    st = s.standby
    if st is None:  # an adapter that does not report replication
        return [
            Finding(
                "standby_streaming",
                err,
                "the server is in recovery but reports nothing of its replication: it "
                "cannot be judged a healthy standby",
            )
        ]
    if st.receiver == "":
        out.append(
            Finding(
                "standby_streaming",
                err,
                "the standby's WAL receiver runs, but this role may not see its state: "
                "GRANT pg_read_all_stats TO the role pgsnap connects as",
            )
        )
    elif not st.streaming:
        what = (
            "no WAL receiver runs" if st.receiver is None else f"its WAL receiver is {st.receiver}"
        )
        out.append(
            Finding(
                "standby_streaming",
                err,
                f"the standby is not streaming from its primary ({what}): its data may be "
                "far behind; fix replication (primary_conninfo, the primary's pg_hba.conf), "
                "or back up the primary",
            )
        )
    if not st.full_page_writes:
        out.append(
            Finding(
                "full_page_writes",
                err,
                "the primary wrote its last checkpoint with full_page_writes off: "
                "PostgreSQL refuses a backup on its standby; turn full_page_writes on "
                "on the primary",
            )
        )
    primary = facts.primary
    if facts.primary_error:
        out.append(
            Finding(
                "primary",
                warn,
                f"the configured primary cannot be reached ({facts.primary_error}): the "
                "backup cannot switch WAL there, and waits until the primary completes "
                "the segment holding its stop point",
            )
        )
    if primary is not None:
        if primary.system_identifier != s.system_identifier:
            out.append(
                Finding(
                    "primary",
                    err,
                    f"the configured primary is another cluster (system identifier "
                    f"{primary.system_identifier}; this standby is {s.system_identifier}): "
                    "point [primary] at the server this standby replicates",
                )
            )
        elif primary.in_recovery:
            out.append(
                Finding(
                    "primary",
                    err,
                    "the configured primary is itself in recovery (another standby, or "
                    "demoted): point [primary] at the read-write server, which can switch WAL",
                )
            )
        elif primary.settings.get("full_page_writes", "on") != "on":
            out.append(
                Finding(
                    "full_page_writes",
                    err,
                    "the primary runs with full_page_writes off: PostgreSQL refuses a "
                    "backup on its standby; turn it on on the primary",
                )
            )
    replayed = st.replay_lsn
    ahead, of = (
        (primary.current_lsn, "the primary's position")
        if primary is not None and primary.current_lsn is not None
        else (st.receive_lsn, "the WAL it received")
    )
    if replayed is not None and ahead is not None and ahead.value - replayed.value > max_lag:
        out.append(
            Finding(
                "standby_lag",
                err,
                f"the standby's replay ({replayed}) is {_mib(ahead.value - replayed.value)} "
                f"behind {of} ({ahead}), more than the {_mib(max_lag)} allowed: the backup "
                "would hold old data; wait for it to catch up, or allow more "
                "(--max-standby-lag)",
            )
        )
    mode = s.settings.get("archive_mode", "")
    if primary is None and mode != "always":
        out.append(
            Finding(
                "standby_wal",
                warn,
                "a standby cannot switch WAL, and pgsnap has no connection to the primary: "
                "the backup waits until the primary completes the segment holding its stop "
                "point (its archive_timeout, or its own writes), at most the WAL timeout; "
                "configure [primary] to switch it at once",
            )
        )
    return out


def archiving_status(facts: BackupFacts) -> ArchiverStatus | None:
    """The archiver that archives this server's WAL: its own, or on a standby (unless it
    archives itself, ``archive_mode = always``) its primary's; None when that is a
    primary pgsnap does not reach."""
    s = facts.server
    if s.in_recovery and s.settings.get("archive_mode", "") != "always":
        return facts.primary_archiver if facts.primary is not None else None
    return facts.archiver


def _archiving(facts: BackupFacts) -> tuple[list[Finding], bool]:
    """The findings on WAL archiving, judged on :func:`archiving_status`; and whether
    the server's own archiver was the one judged."""
    status = archiving_status(facts)
    if status is None:
        return [], False
    out: list[Finding] = []
    health = archiver_health(status)
    where = "the primary: " if status is not facts.archiver else ""
    for reason in health.reasons:
        out.append(Finding("archiving", Severity.ERROR, where + reason))
    for w in health.warnings:
        out.append(Finding("archiving", Severity.WARNING, where + w))
    return out, True


def preflight(
    facts: BackupFacts, *, max_standby_lag: int = DEFAULT_MAX_STANDBY_LAG
) -> tuple[Finding, ...]:
    """Every finding about the cluster's readiness for a snapshot backup.

    On a standby (a server in recovery), also whether it can be backed up there:
    streaming, at most ``max_standby_lag`` bytes behind, its primary writing full
    pages; the archiving judged on the primary when pgsnap reaches it.
    """
    out: list[Finding] = []
    err, warn = Severity.ERROR, Severity.WARNING
    s = facts.server
    layout = facts.layout

    if s.in_recovery:
        out += _standby(facts, max_standby_lag)
    archiving, own = _archiving(facts)
    out += archiving
    if own:
        out += _archive_mismatch(facts)
    if not s.in_recovery and s.settings.get("full_page_writes", "on") != "on":
        out.append(
            Finding(
                "full_page_writes",
                warn,
                "full_page_writes is off; PostgreSQL forces it on during the backup, "
                "but torn pages are not protected the rest of the time",
            )
        )
    archives = facts.primary if s.in_recovery else s  # whose archive_timeout counts
    if archives is not None and archives.settings.get("archive_timeout", "0") in ("0", "0s", ""):
        out.append(
            Finding(
                "archive_timeout",
                warn,
                "archive_timeout is 0: on a quiet server the newest WAL may stay "
                "unarchived for a long time (set it to bound the data you can lose)",
            )
        )
    if s.settings.get("data_checksums", "off") != "on":
        out.append(
            Finding(
                "data_checksums",
                warn,
                "data checksums are off: corruption in restored data will not be "
                "detected (initdb --data-checksums)",
            )
        )

    out += _coverage(facts)

    # The archive must not be on a snapshotted volume (a restore would roll it back).
    for vol in layout.snapshotted:
        if _under(facts.archive_location, vol.mount_point):
            out.append(
                Finding(
                    "archive_location",
                    err,
                    f"the WAL archive {facts.archive_location} is on volume {vol.id} "
                    f"({vol.role.value}), which backups snapshot and recoveries "
                    "restore: move the archive to separate storage",
                )
            )

    # Same cluster as the catalog and the archive.
    known = {b.system_identifier for b in facts.catalog} | facts.catalog_system_identifiers
    foreign = sorted(known - {s.system_identifier})
    if foreign:
        out.append(
            Finding(
                "system_identifier",
                err,
                f"the catalog holds backups of another cluster (system identifier "
                f"{', '.join(foreign)}; this server is {s.system_identifier}): use a "
                "separate catalog per cluster",
            )
        )
    if facts.archive_system_identifier not in (None, s.system_identifier):
        out.append(
            Finding(
                "system_identifier",
                err,
                f"the WAL archive holds WAL of another cluster (system identifier "
                f"{facts.archive_system_identifier}; this server is "
                f"{s.system_identifier}): use a separate archive per cluster",
            )
        )
    # A standby's own timeline is its last restartpoint's: just after a failover its
    # primary's (when known) is the one the archive is compared with.
    current = facts.primary.timeline if s.in_recovery and facts.primary is not None else s.timeline
    ahead = [t for t in facts.archive_timelines if t > current]
    if ahead:
        out.append(
            Finding(
                "split_brain",
                err,
                f"the archive has WAL on timeline {max(ahead)}, ahead of this "
                f"server's timeline {s.timeline}: another server (a promoted "
                "standby or a test restore) archives here; stop it and separate "
                "the archives before backing up",
            )
        )

    known = {v.id for v in facts.volumes}
    for vol in layout.snapshotted:
        if vol.id not in known:
            out.append(
                Finding(
                    "volume_missing",
                    err,
                    f"volume {vol.id} ({vol.name}, {vol.role.value}) does not exist "
                    "on the storage backend: fix the layout",
                )
            )
    if Capability.CONSISTENCY_GROUPS not in facts.capabilities and len(layout.snapshotted) > 1:
        out.append(
            Finding(
                "consistency_group",
                warn,
                "the backend cannot snapshot volumes at one instant; backup mode "
                "and the archived WAL still make the backup consistent",
            )
        )
    return tuple(out)


def plan_backup(facts: BackupFacts, request: BackupRequest) -> Plan:
    """The backup plan, or ``PreflightError`` listing every blocking finding."""
    findings = preflight(facts, max_standby_lag=request.max_standby_lag)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if errors:
        raise PreflightError(
            "the cluster cannot be backed up:\n" + "\n".join(f"  - {f}" for f in errors),
            hint="fix the findings above and run the backup again",
            findings=tuple(str(f) for f in errors),
        )
    if request.secure_snapshots and Capability.SECURE_SNAPSHOTS not in facts.capabilities:
        from pgsnap.errors import UnsupportedCapability  # noqa: PLC0415

        raise UnsupportedCapability(
            "secure snapshots were requested but the backend cannot make them",
            hint="drop secure_snapshots or use a backend that supports them",
        )
    s = facts.server
    standby = s.in_recovery
    together = Capability.CONSISTENCY_GROUPS in facts.capabilities
    vol_ids: Sequence[str] = [v.id for v in facts.layout.snapshotted]
    if standby and not together:
        # A standby's backup ends where its pg_control's minimum recovery point says,
        # as the snapshot of the data volume holds it: taken last, it covers every page
        # the other volumes' snapshots hold.
        data = facts.layout.data.id
        vol_ids = [v for v in vol_ids if v != data] + [data]
    bid = request.backup_id
    switch = standby and facts.primary is not None and not facts.primary.in_recovery
    waits: tuple[Step, ...] = ()
    if request.wait_for_checkpoint and request.fast_checkpoint:
        waits = (
            Step.of(
                "wait-checkpoint",
                WaitForCheckpoint(),
                description="wait for the next checkpoint PostgreSQL schedules itself",
                reason="a gentle backup: the backup's own checkpoint then writes only what "
                "changed since, in a burst the workload does not notice",
            ),
        )
    elif request.wait_for_checkpoint:
        waits = (
            Step.of(
                "wait-checkpoint",
                WaitForCheckpoint(until="due"),
                description="wait until PostgreSQL's next timed checkpoint is due",
                reason="the gentlest backup: its spread checkpoint then takes the place of "
                "the one PostgreSQL was about to begin, so the workload sees no "
                "checkpoint it would not have had",
            ),
        )
    steps = (
        *waits,
        Step.of(
            "backup-start",
            StartBackup(label=request.label, fast=request.fast_checkpoint),
            description=f"enter backup mode (label {request.label!r}, "
            f"{'fast' if request.fast_checkpoint else 'spread'} checkpoint)",
            reason="backup mode makes a snapshot of a running server restorable "
            "(immune to changes during the snapshot)",
            undo=AbortBackup(),
        ),
        Step.of(
            "record-start",
            RecordBackupStart(backup_id=bid, label=request.label, start=Ref("backup-start")),
            description=f"record backup {bid} STARTED in the catalog",
            reason="a backup in progress is known, so a failure or a kill is recorded, "
            "never forgotten",
            undo=FailBackup(backup_id=bid),
        ),
        Step.of(
            "snapshot",
            TakeSnapshotGroup(
                volume_ids=tuple(vol_ids), group_name=bid, secure=request.secure_snapshots
            ),
            description=(
                f"snapshot {', '.join(vol_ids)} as one consistency group"
                if together
                else f"snapshot {', '.join(vol_ids)} one after another"
                + (" (the data volume, which holds pg_control, last)" if standby else "")
            ),
            reason=(
                "one snapshot of every data, WAL and tablespace volume, taken together"
                if together
                else "one snapshot of every data, WAL and tablespace volume; the storage "
                "takes them one at a time, and backup mode makes the set consistent "
                "(replay from the backup label past the stop point"
                + (
                    ", which on a standby is pg_control's minimum recovery point: taken "
                    "last, it is past every page the other snapshots hold)"
                    if standby
                    else ")"
                )
            ),
            undo=DeleteSnapshotGroup(group_id=Ref("snapshot", "group_id")),
        ),
        Step.of(
            "backup-stop",
            StopBackup(),
            description="leave backup mode without waiting for the archive",
            reason="the server leaves backup mode as soon as the snapshot exists",
        ),
        Step.of(
            "record-stop",
            RecordBackupStop(backup_id=bid, stop=Ref("backup-stop"), snapshot=Ref("snapshot")),
            description="keep the backup label, tablespace map and snapshots in the catalog "
            "(WAITING_FOR_WAL)",
            reason="the label is not on the volumes and is needed to restore: it is stored "
            "the moment backup mode ends",
        ),
        *(
            (
                Step.of(
                    "primary-switch-wal",
                    SwitchPrimaryWal(stop=Ref("backup-stop")),
                    description="switch WAL on the primary, so the segment holding the "
                    "stop point is completed and archived now",
                    reason="a standby cannot switch WAL; without the switch the segment "
                    "is archived only when the primary fills it or its archive_timeout ends",
                ),
            )
            if switch
            else ()
        ),
        Step.of(
            "wait-wal",
            WaitForWal(backup_id=bid, timeout=request.wal_timeout),
            description=(
                f"wait (at most {request.wal_timeout:g} s) for the stop segment in the "
                "archive (a standby writes no .backup file)"
                + (
                    ""
                    if switch
                    else "; the primary completes that segment in its own time: its "
                    "archive_timeout, or its writes"
                )
                if standby
                else f"wait (at most {request.wal_timeout:g} s) for the stop segment and "
                "the .backup file in the archive"
            ),
            reason="a backup is usable only once all WAL from its start to its stop is archived",
        ),
        Step.of(
            "done",
            MarkBackupDone(backup_id=bid),
            description="confirm the snapshots exist and mark the backup DONE",
            reason="only DONE backups are chosen for recovery",
        ),
    )
    warnings = tuple(str(f) for f in findings if f.severity is Severity.WARNING)
    fp = fingerprint(
        {
            "kind": "backup",
            "system_identifier": s.system_identifier,
            "timeline": s.timeline,
            "layout": facts.layout,
            "volumes": sorted(v.id for v in facts.volumes),
            "settings": {k: s.settings.get(k) for k in ("wal_level", "archive_mode")},
            "request": attrs.asdict(request),
            "standby": standby,
            "switch": switch,
        }
    )
    where = f"{'a standby' if standby else 'the primary'}" + (
        f" on {facts.host}" if facts.host else ""
    )
    if standby and facts.primary is not None:
        where += (
            f" (its primary: PostgreSQL {facts.primary.major}, timeline {facts.primary.timeline})"
        )
    return Plan(
        kind="backup",
        steps=steps,
        fingerprint=fp,
        request=attrs.asdict(request),
        summary={
            "backup id": request.backup_id,
            "cluster": f"PostgreSQL {s.version_num // 10000} (system id {s.system_identifier})",
            "timeline": str(s.timeline),
            "taken on": where,
            "volumes": ", ".join(f"{v.id} ({v.role.value})" for v in facts.layout.snapshotted),
            "archive": facts.archive_location,
        },
        kept=(
            "the running server is not stopped; writes continue during the backup",
            *(
                (
                    "the primary is not touched but for a WAL switch: the backup's I/O is "
                    "on the standby",
                )
                if switch
                else ("the primary is not touched: the backup's I/O is on the standby",)
                if standby
                else ()
            ),
        ),
        warnings=warnings,
    )
