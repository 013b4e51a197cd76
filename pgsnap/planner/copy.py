"""The copy planner: a backup's snapshots sent off the array, as a plan (pure).

:func:`plan_copy` turns a DONE backup, where its snapshots can be read
(:class:`~pgsnap.model.SnapshotAccess`, one per volume) and a directory
target into two steps: ``copy.send`` (the data and tablespace trees, with the
backup label and tablespace map; undone by removing the manifest) and
``catalog.record_copy``. It refuses, with the reason and what to do, a
backup that is not DONE, one whose snapshots of the data or a tablespace
are gone, and a target that is not an absolute directory path.

The WAL volume's snapshot is not copied: a consistent restore needs the WAL
from the backup's start to its stop, which the WAL archive holds (a copy
that also carries those segments comes with the rest of issue 21).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from pgsnap.copies.copier import DEFAULT_CHUNK_SIZE, DEFAULT_PARALLEL
from pgsnap.copies.manifest import is_copy_id
from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import BackupRecord, SnapshotAccess, Volume, VolumeRole
from pgsnap.operations.base import Ref
from pgsnap.operations.copies import DeleteCopyManifest, RecordCopy, SendCopy
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import fingerprint

__all__ = ["CopyRequest", "copied_roles", "copy_tree_name", "plan_copy"]

copied_roles = (VolumeRole.DATA, VolumeRole.TABLESPACE)
"""The roles whose snapshots a copy carries (the WAL comes from the archive)."""


@attrs.frozen
class CopyRequest:
    """What to copy where: ``backup_id`` to ``target_dir`` (an absolute directory
    path or ``s3://bucket/prefix``); ``copy_id``
    (default ``<backup id>.<n>``, the backup's next), ``chunk_size`` and ``codec`` ("" : zstd
    when installed, else zlib)."""

    backup_id: str
    target_dir: str
    copy_id: str | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    codec: str = ""
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    """The S3 target's options (:data:`pgsnap.copies.TARGET_OPTIONS`): no secret."""
    parallel: int = DEFAULT_PARALLEL
    """Upload threads of the copy."""
    bandwidth_limit: int | None = None
    """Bytes a second the copy may send (None: no limit)."""


def copy_tree_name(vol: Volume) -> str:
    """The name of volume ``vol``'s tree in a copy: ``pgdata`` for the data
    directory's volume, ``tablespace-<oid>`` for a tablespace's."""
    if vol.role is VolumeRole.DATA:
        return "pgdata"
    return f"tablespace-{vol.tablespace_oid}" if vol.tablespace_oid else f"volume-{vol.name}"


def _next_copy_id(record: BackupRecord) -> str:
    """``<backup id>.<n>``: the first number no copy of the backup has."""
    taken = {c.copy_id for c in record.copies}
    n = len(taken) + 1
    while f"{record.id}.{n}" in taken:
        n += 1
    return f"{record.id}.{n}"


def plan_copy(
    record: BackupRecord,
    access: Mapping[str, SnapshotAccess],
    request: CopyRequest,
) -> Plan:
    """The plan that copies ``record``'s data and tablespace snapshots (``access``:
    volume id → where its snapshot is read) to ``request.target_dir``."""
    if not record.is_usable:
        raise PlanningError(
            f"backup {record.id} is {record.state.value}, not done: it cannot be copied",
            hint="copy a DONE backup (pgsnap list shows them)",
            backup_id=record.id,
        )
    if not (request.target_dir.startswith("s3://") or os.path.isabs(request.target_dir)):
        raise ConfigurationError(
            f"the copy target {request.target_dir!r} is neither an absolute path nor s3://",
            hint="e.g. [copies] path = '/mnt/backups/pgsnap' or 's3://backups/pgsnap'",
        )
    copy_id = request.copy_id or _next_copy_id(record)
    if not is_copy_id(copy_id):
        raise ConfigurationError(
            f"{copy_id!r} is not a copy id",
            hint="letters, digits, '.', '_' and '-' only, at most 128",
        )
    if any(c.copy_id == copy_id for c in record.copies):
        raise PlanningError(
            f"backup {record.id} already has a copy {copy_id}",
            hint="give another copy id, or leave it out",
            backup_id=record.id,
        )
    wanted = [v for v in record.layout.volumes if v.role in copied_roles]
    trees: dict[str, str] = {}
    for vol in wanted:
        snap = record.snapshots.get(vol.id)
        where = access.get(vol.id)
        if snap is None or where is None:
            raise PlanningError(
                f"backup {record.id} has no readable snapshot of volume {vol.id} "
                f"({vol.role.value}): it cannot be copied",
                hint="a backup whose snapshots are gone cannot be copied; copy another one",
                backup_id=record.id,
                volume_id=vol.id,
            )
        trees[copy_tree_name(vol)] = where.path
    sent = SendCopy(
        copy_id=copy_id,
        backup_id=record.id,
        trees=trees,
        target_dir=request.target_dir,
        labelfile=record.labelfile or "",
        spcmapfile=record.spcmapfile or "",
        chunk_size=request.chunk_size,
        codec=request.codec,
        target_options=request.target_options,
        parallel=request.parallel,
        bandwidth_limit=request.bandwidth_limit,
    )
    steps = (
        Step.of(
            "send",
            sent,
            description=f"copy {', '.join(trees)} of backup {record.id} to {request.target_dir}",
            reason="off the array: a backup that outlives the storage that holds the database",
            undo=DeleteCopyManifest(
                copy_id=copy_id,
                target_dir=request.target_dir,
                target_options=request.target_options,
            ),
        ),
        Step.of(
            "record",
            RecordCopy(
                backup_id=record.id,
                copy_id=copy_id,
                target_dir=request.target_dir,
                sent=Ref("send"),
            ),
            description=f"record copy {copy_id} on backup {record.id}",
            reason="the catalog says where each backup's copies are",
        ),
    )
    return Plan(
        kind="copy",
        steps=steps,
        fingerprint=fingerprint(
            {"backup": record.id, "copies": [c.copy_id for c in record.copies], "trees": trees}
        ),
        summary={"backup": record.id, "label": record.label, "copy": copy_id},
        request={"backup_id": record.id, "target": request.target_dir, "copy_id": copy_id},
    )
