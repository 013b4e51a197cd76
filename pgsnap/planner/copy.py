"""The copy planner: a backup's snapshots sent off the array, as a plan (pure).

:func:`plan_copy` turns a DONE backup, where its snapshots can be read
(:class:`~pgsnap.model.SnapshotAccess`, one per volume) and a directory
target into two steps: ``copy.send`` (the data and tablespace trees, with the
backup label and tablespace map; undone by removing the manifest) and
``catalog.record_copy``. It refuses, with the reason and what to do, a
backup that is not DONE, one whose snapshots of the data or a tablespace
are gone, and a target that is not an absolute directory path.

Snapshots read in place (btrfs, the mock) are sent as they are. Snapshots
that must be exposed on a host first (LVM, PowerFlex:
:class:`~pgsnap.protocols.ExposableSnapshots`) get, per volume and before
``send``, ``expose-<volume>`` (``storage.expose_snapshot``, undone by
concealing it) and ``mount-<volume>`` (``host.mount_snapshot``: read-only at
``<mount root>/<copy id>/<tree>``, undone by unmounting); ``send`` reads
those mount points; then ``unmount-<volume>`` and ``conceal-<volume>``, and
``record``. No backend is named: the steps come from the access alone. The
host the snapshots are exposed on must be where pgsnap runs
(``CopyRequest.runs_on``), since the copy reads them locally.

The WAL volume's snapshot is not copied (at snapshot time it does not yet
hold the end of the backup). What a consistent restore needs is the WAL from
the backup's start to its stop (:func:`backup_wal_names`), and the copy
carries those segments, as the archive holds them once the backup is DONE,
in a tree of their own (``pg_wal``): a copy restores to the backup's
consistency point even when the WAL archive is lost with the array. When the
archive no longer has them all, the copy is made without them, with a
warning: it then needs the archive to restore.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies.copier import DEFAULT_CHUNK_SIZE, DEFAULT_PARALLEL
from pgsnap.copies.manifest import WAL_TREE, is_copy_id
from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import LSN, BackupRecord, SnapshotAccess, Volume, VolumeRole
from pgsnap.operations.base import Ref
from pgsnap.operations.copies import DeleteCopyManifest, RecordCopy, SendCopy, copy_tree_name
from pgsnap.operations.host import MountSnapshot, UnmountSnapshot
from pgsnap.operations.storage import ConcealSnapshot, ExposeSnapshot
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import fingerprint
from pgsnap.wal.names import history_file_name, segment_name, segment_number

__all__ = [
    "DEFAULT_MOUNT_ROOT",
    "CopyRequest",
    "backup_wal_names",
    "copied_roles",
    "copy_tree_name",
    "plan_copy",
]

DEFAULT_MOUNT_ROOT: Final = "/run/pgsnap/copies"
"""Where a copy mounts the snapshots it must expose first (``[copies] mount_root``):
``<root>/<copy id>/<tree>``."""

copied_roles = (VolumeRole.DATA, VolumeRole.TABLESPACE)
"""The roles whose snapshots a copy carries (the WAL comes from the archive)."""


@frozen
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
    key_file: str = ""
    """Encrypt the copy with the copy key in this file (its path travels in the
    plan, never the key); "" : not encrypted."""
    mount_root: str = DEFAULT_MOUNT_ROOT
    """Where snapshots that must be exposed are mounted read-only (a directory
    pgsnap owns: ``<mount_root>/<copy id>/<tree>`` is made and removed)."""
    runs_on: str | None = None
    """The name of the host pgsnap runs on (the copy reads there); a snapshot to be
    exposed on any other host is refused. None: not checked; "": neither the
    database host nor a backup host of the configuration (every exposure refused)."""
    parallel: int = DEFAULT_PARALLEL
    """Upload threads of the copy."""
    bandwidth_limit: int | None = None
    """Bytes a second the copy may send (None: no limit)."""


def backup_wal_names(record: BackupRecord) -> tuple[str, ...]:
    """The WAL files a copy of ``record`` carries: the segments from the one holding
    its start LSN to the one holding the last byte before its stop LSN, on its
    timeline, and that timeline's history file when it is not the first (the
    history is not needed to reach consistency; it lets a later recovery follow
    the timeline). Empty for a backup that never stopped."""
    if record.stop_lsn is None:
        return ()
    seg = record.wal_segment_size
    first = segment_number(record.start_lsn, seg)
    last = max(first, segment_number(LSN(max(record.stop_lsn.value - 1, 0)), seg))
    tli = record.stop_timeline or record.start_timeline
    names = [segment_name(tli, n, seg) for n in range(first, last + 1)]
    if tli > 1:
        names.append(history_file_name(tli))
    return tuple(names)


def _next_copy_id(record: BackupRecord) -> str:
    """``<backup id>.<n>``: the first number no copy of the backup has."""
    taken = {c.copy_id for c in record.copies}
    n = len(taken) + 1
    while f"{record.id}.{n}" in taken:
        n += 1
    return f"{record.id}.{n}"


def _mount_root(root: str) -> str:
    norm = posixpath.normpath(root) if root else ""
    if not posixpath.isabs(norm) or norm == "/":
        raise ConfigurationError(
            f"the copies' mount root {root!r} is not an absolute directory below /",
            hint="e.g. [copies] mount_root = '/run/pgsnap/copies'",
        )
    return norm


def _check_reading_host(backup_id: str, host: str, runs_on: str | None) -> None:
    if runs_on is None or host == runs_on:
        return
    here = f"on {runs_on}" if runs_on else "on neither the database host nor a backup host"
    raise PlanningError(
        f"backup {backup_id}'s snapshots would be exposed and mounted on host {host!r}, but "
        f"pgsnap runs {here}: a copy reads the snapshots where pgsnap runs",
        hint=f"run pgsnap copy on {host} with a configuration whose [copies] host = "
        f"{host!r}, or set [copies] host to the host pgsnap runs on",
        backup_id=backup_id,
        host=host,
    )


def plan_copy(
    record: BackupRecord,
    access: Mapping[str, SnapshotAccess],
    request: CopyRequest,
    wal: Mapping[str, str] | None = None,
) -> Plan:
    """The plan that copies ``record``'s data and tablespace snapshots (``access``:
    volume id → where its snapshot is read) to ``request.target_dir``, with the
    backup's WAL (``wal``: each of :func:`backup_wal_names` the archive holds → the
    name it is stored under there, compressed or not; None: not looked for)."""
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
    exposed: list[tuple[Volume, str, str, str]] = []  # volume, snapshot, host, mount point
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
        if not where.must_expose:
            trees[copy_tree_name(vol)] = where.path
            continue
        _check_reading_host(record.id, where.host, request.runs_on)
        point = posixpath.join(_mount_root(request.mount_root), copy_id, copy_tree_name(vol))
        trees[copy_tree_name(vol)] = point
        exposed.append((vol, snap, where.host, point))
    needed = backup_wal_names(record)
    found = dict(wal or {})
    segments = [n for n in needed if not n.endswith(".history")]
    warnings: list[str] = []
    if all(n in found for n in segments):
        carried = tuple(found[n] for n in needed if n in found)
    else:
        carried = ()
        absent = [n for n in segments if n not in found]
        warnings.append(
            f"the WAL archive no longer holds all of backup {record.id}'s WAL "
            f"({', '.join(absent[:3])}{' and more' if len(absent) > 3 else ''} missing): "
            "the copy is made without it and needs the archive to be restored"
        )
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
        wal=carried,
        key_file=request.key_file,
        parallel=request.parallel,
        bandwidth_limit=request.bandwidth_limit,
        host=next((h for _v, _s, h, _p in exposed), ""),
    )
    what = ", ".join([*trees, *([f"{WAL_TREE} ({len(carried)} WAL files)"] if carried else [])])
    before: list[Step] = []
    after: list[Step] = []
    for vol, snap, host, point in exposed:
        ids = (record.id, vol.id, snap, host)
        expose = ExposeSnapshot(*ids)
        conceal = ConcealSnapshot(*ids)
        mount = MountSnapshot(
            backup_id=record.id,
            volume_id=vol.id,
            snapshot_id=snap,
            device=Ref(f"expose-{vol.step_key}", "device"),
            mount_point=point,
            host=host,
        )
        unmount = UnmountSnapshot(mount_point=point, host=host)
        before += [
            Step.of(
                f"expose-{vol.step_key}",
                expose,
                description=f"expose snapshot {snap} of {vol.id} on {host}",
                reason="the snapshot is a block device: it is made visible on the host that "
                "reads it, its origin untouched",
                undo=conceal,
            ),
            Step.of(
                f"mount-{vol.step_key}",
                mount,
                description=f"mount snapshot {snap} read-only on {point} ({host})",
                reason="read-only, without replaying its journal: the snapshot is never written",
                undo=unmount,
            ),
        ]
        after += [
            Step.of(
                f"unmount-{vol.step_key}",
                unmount,
                description=f"unmount snapshot {snap} from {point} ({host})",
                reason="the copy has read it",
            ),
            Step.of(
                f"conceal-{vol.step_key}",
                conceal,
                description=f"conceal snapshot {snap} of {vol.id} from {host} again",
                reason="leave the storage as the copy found it",
            ),
        ]
    steps = (
        *before,
        Step.of(
            "send",
            sent,
            description=f"copy {what} of backup {record.id} to {request.target_dir}",
            reason="off the array: a backup that outlives the storage that holds the database",
            undo=DeleteCopyManifest(
                copy_id=copy_id,
                target_dir=request.target_dir,
                target_options=request.target_options,
            ),
        ),
        *after,
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
            {
                "backup": record.id,
                "copies": [c.copy_id for c in record.copies],
                "trees": trees,
                "wal": list(carried),
                "exposed": sorted((vol.id, snap, host) for vol, snap, host, _p in exposed),
            }
        ),
        summary={
            "backup": record.id,
            "label": record.label,
            "copy": copy_id,
            "wal": (
                f"{len(carried)} files from the archive ({carried[0]} to "
                f"{[n for n in carried if not n.endswith('.history')][-1]}): the "
                "copy restores to the backup's consistency point with no archive"
                if carried
                else "none: restoring the copy needs the WAL archive"
            ),
            **(
                {"encrypted": f"with the copy key in {request.key_file}"}
                if request.key_file
                else {}
            ),
        },
        request={"backup_id": record.id, "target": request.target_dir, "copy_id": copy_id},
        warnings=tuple(warnings),
    )
