"""The backup planner (pure): preflight findings and the backup plan.

``preflight(facts)`` names every finding, errors blocking and warnings not;
``plan_backup(facts, request)`` returns the ordered :class:`~pgsnap.plan.Plan`
or raises :class:`~pgsnap.errors.PreflightError` listing the blocking findings.
"""

from __future__ import annotations

import os.path
from collections.abc import Sequence

import attrs

from pgsnap.errors import PreflightError
from pgsnap.model import LocationKind, Severity, Volume, VolumeRole
from pgsnap.operations import Ref
from pgsnap.operations.catalog import (
    FailBackup,
    MarkBackupDone,
    RecordBackupStart,
    RecordBackupStop,
    WaitForWal,
)
from pgsnap.operations.db import AbortBackup, StartBackup, StopBackup
from pgsnap.operations.storage import DeleteSnapshotGroup, TakeSnapshotGroup
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import BackupFacts, PathFacts, fingerprint
from pgsnap.protocols import Capability
from pgsnap.wal import archiver_health

__all__ = ["BackupRequest", "Finding", "Severity", "plan_backup", "preflight"]


@attrs.frozen
class Finding:
    """One named preflight finding (``code`` is stable, for scripts)."""

    code: str
    severity: Severity
    message: str

    def __str__(self) -> str:
        return f"{self.severity.value}: {self.message} [{self.code}]"


@attrs.frozen
class BackupRequest:
    """What the caller asks for: the id and label (made by the caller: no clock here)."""

    backup_id: str
    label: str
    fast_checkpoint: bool = True
    wal_timeout: float = 60.0
    """Seconds to wait for the stop segment and ``.backup`` file in the archive."""
    secure_snapshots: bool = False


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


def preflight(facts: BackupFacts) -> tuple[Finding, ...]:
    """Every finding about the cluster's readiness for a snapshot backup."""
    out: list[Finding] = []
    err, warn = Severity.ERROR, Severity.WARNING
    s = facts.server
    layout = facts.layout

    if s.in_recovery:
        out.append(
            Finding(
                "standby",
                err,
                "the server is in recovery (a standby); "
                "pgsnap backs up primaries only for now: run it against the primary",
            )
        )
    health = archiver_health(facts.archiver)
    for reason in health.reasons:
        out.append(Finding("archiving", err, reason))
    for w in health.warnings:
        out.append(Finding("archiving", warn, w))
    out += _archive_mismatch(facts)
    if s.settings.get("full_page_writes", "on") != "on":
        out.append(
            Finding(
                "full_page_writes",
                warn,
                "full_page_writes is off; PostgreSQL forces it on during the backup, "
                "but torn pages are not protected the rest of the time",
            )
        )
    if s.settings.get("archive_timeout", "0") in ("0", "0s", ""):
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
    ahead = [t for t in facts.archive_timelines if t > s.timeline]
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
    findings = preflight(facts)
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
    vol_ids: Sequence[str] = [v.id for v in facts.layout.snapshotted]
    s = facts.server
    bid = request.backup_id
    steps = (
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
                if Capability.CONSISTENCY_GROUPS in facts.capabilities
                else f"snapshot {', '.join(vol_ids)} one after another"
            ),
            reason=(
                "one snapshot of every data, WAL and tablespace volume, taken together"
                if Capability.CONSISTENCY_GROUPS in facts.capabilities
                else "one snapshot of every data, WAL and tablespace volume; the storage "
                "takes them one at a time, and backup mode makes the set consistent "
                "(replay from the backup label past the stop point)"
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
        Step.of(
            "wait-wal",
            WaitForWal(backup_id=bid, timeout=request.wal_timeout),
            description=f"wait (at most {request.wal_timeout:g} s) for the stop segment and "
            "the .backup file in the archive",
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
        }
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
            "volumes": ", ".join(f"{v.id} ({v.role.value})" for v in facts.layout.snapshotted),
            "archive": facts.archive_location,
        },
        kept=("the running server is not stopped; writes continue during the backup",),
        warnings=warnings,
    )
