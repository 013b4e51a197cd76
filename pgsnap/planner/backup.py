"""The backup planner (pure): preflight findings and the backup plan.

``preflight(facts)`` names every finding, errors blocking and warnings not;
``plan_backup(facts, request)`` returns the ordered :class:`~pgsnap.plan.Plan`
or raises :class:`~pgsnap.errors.PreflightError` listing the blocking findings.
"""

from __future__ import annotations

import enum
import os.path
from collections.abc import Sequence

import attrs

from pgsnap.errors import PreflightError
from pgsnap.model import VolumeRole
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import BackupFacts, fingerprint
from pgsnap.protocols import Capability
from pgsnap.wal import archiver_health

__all__ = ["BackupRequest", "Finding", "Severity", "plan_backup", "preflight"]


class Severity(enum.Enum):
    """How much a finding matters."""

    ERROR = "error"
    """Blocks the backup."""
    WARNING = "warning"
    """Worth knowing; does not block."""


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

    # Every file system of the cluster is covered by a volume of the layout.
    data_vol = layout.data
    if not _under(s.data_directory, data_vol.mount_point):
        out.append(
            Finding(
                "coverage",
                err,
                f"the data directory {s.data_directory} is not on the data volume "
                f"{data_vol.id} (mounted at {data_vol.mount_point}); fix the layout",
            )
        )
    wal_vol = layout.wal
    if wal_vol is not None:
        if not _under(s.wal_directory, wal_vol.mount_point):
            out.append(
                Finding(
                    "coverage",
                    err,
                    f"pg_wal ({s.wal_directory}) is not on the WAL volume {wal_vol.id} "
                    f"(mounted at {wal_vol.mount_point}); fix the layout",
                )
            )
    elif not _under(s.wal_directory, data_vol.mount_point):
        out.append(
            Finding(
                "coverage",
                err,
                f"pg_wal lives at {s.wal_directory}, outside the data volume, and the "
                "layout has no WAL volume: add the volume that holds it (role 'wal')",
            )
        )
    ts_vols = {v.tablespace_oid: v for v in layout.by_role(VolumeRole.TABLESPACE)}
    for ts in s.tablespaces:
        vol = ts_vols.get(ts.oid)
        if vol is not None and _under(ts.location, vol.mount_point):
            continue
        if vol is None and _under(ts.location, data_vol.mount_point):
            continue
        out.append(
            Finding(
                "coverage",
                err,
                f"tablespace {ts.name} (oid {ts.oid}) at {ts.location} is on no volume "
                "of the layout: add a volume with role 'tablespace' and its oid",
            )
        )
    for oid, vol in ts_vols.items():
        if oid not in {t.oid for t in s.tablespaces}:
            out.append(
                Finding(
                    "coverage",
                    warn,
                    f"the layout has a tablespace volume {vol.id} for oid {oid}, "
                    "but the server has no such tablespace",
                )
            )

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
    foreign = sorted({b.system_identifier for b in facts.catalog} - {s.system_identifier})
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
    steps = (
        Step(
            id="backup-start",
            action="db.backup_start",
            description=f"enter backup mode (label {request.label!r}, "
            f"{'fast' if request.fast_checkpoint else 'spread'} checkpoint)",
            reason="backup mode makes a snapshot of a running server restorable "
            "(immune to changes during the snapshot)",
            params={
                "backup_id": request.backup_id,
                "label": request.label,
                "fast": request.fast_checkpoint,
            },
            compensation="db.backup_abort",
        ),
        Step(
            id="snapshot",
            action="storage.snapshot_group",
            description=f"snapshot {', '.join(vol_ids)} as one consistency group",
            reason="one snapshot of every data, WAL and tablespace volume, taken together",
            params={
                "backup_id": request.backup_id,
                "volume_ids": list(vol_ids),
                "name": request.backup_id,
                "secure": request.secure_snapshots,
            },
            compensation="storage.delete_snapshot_group",
        ),
        Step(
            id="backup-stop",
            action="db.backup_stop",
            description="leave backup mode without waiting for the archive; keep the "
            "backup label and tablespace map in the catalog",
            reason="the server leaves backup mode as soon as the snapshot exists; the label "
            "is stored at once (it is not on the volumes and is needed to restore)",
            params={"backup_id": request.backup_id},
        ),
        Step(
            id="wait-wal",
            action="archive.wait_for_wal",
            description=f"wait (at most {request.wal_timeout:g} s) for the stop segment and "
            "the .backup file in the archive",
            reason="a backup is usable only once all WAL from its start to its stop is archived",
            params={"backup_id": request.backup_id, "timeout": request.wal_timeout},
        ),
        Step(
            id="done",
            action="catalog.mark_done",
            description="mark the backup DONE in the catalog",
            reason="only DONE backups are chosen for recovery",
            params={"backup_id": request.backup_id},
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
