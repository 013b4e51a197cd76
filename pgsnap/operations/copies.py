"""``copy.*`` and ``catalog.record_copy``: a backup copied off the array, recorded, and
restored from there.

:class:`SendCopy` reads the trees of a backup's snapshots in place (where
:meth:`~pgsnap.protocols.ReadableSnapshots.snapshot_access` says they are)
and writes them to a copy target as chunks and, last, a manifest
(:func:`pgsnap.copies.copy_trees`). It is idempotent: a resumed or repeated
run sends only the chunks still missing. Its undo removes the manifest, so a
copy the catalog does not record is not left looking complete.
:class:`RecordCopy` adds the copy to the backup's record.
:class:`RestoreFromCopy` puts one volume's tree of a copy back where the
layout mounts that volume, in a recovery plan (the step a snapshot restore
is when the snapshots are gone).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import time
from collections.abc import Mapping

import attrs

from pgsnap.copies import (
    CopyProgress,
    Manifest,
    RestoreProgress,
    copy_trees,
    default_codec,
    open_target,
    restore_trees,
)
from pgsnap.copies.copier import DEFAULT_CHUNK_SIZE, DEFAULT_PARALLEL
from pgsnap.errors import BackupNotFound, CopyError, CopyNotFound, PgsnapError
from pgsnap.host.runners import LocalRunner
from pgsnap.model import CopyRecord, VolumeRole
from pgsnap.operations.base import Operation, OperationContext, Outputs, PlanView, Ref
from pgsnap.operations.base import Target as _Target

__all__ = ["DeleteCopyManifest", "RecordCopy", "RestoreFromCopy", "SendCopy"]

log = logging.getLogger(__name__)


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``: a time left, for a progress line."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


@attrs.frozen
class SendCopy(Operation):
    """Copy ``trees`` (name → a snapshot's directory) to the copy target
    ``target_dir`` (a directory or ``s3://bucket/prefix``, with ``target_options``)
    as copy ``copy_id`` of backup ``backup_id``, with the backup label and
    tablespace map in the manifest; ``parallel`` upload threads, at most
    ``bandwidth_limit`` bytes a second (None: no limit)."""

    name = "copy.send"
    target = _Target.COPY
    compensation = "copy.delete_manifest"

    copy_id: str
    backup_id: str
    trees: Mapping[str, str]
    target_dir: str
    labelfile: str
    spcmapfile: str = ""
    chunk_size: int = DEFAULT_CHUNK_SIZE
    codec: str = ""
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    parallel: int = DEFAULT_PARALLEL
    bandwidth_limit: int | None = None

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        if not isinstance(ctx.host.runner, LocalRunner):
            raise self.mismatch(
                ctx,
                f"a copy reads the snapshots on this machine, and the database host is "
                f"{ctx.host.description}",
                "run pgsnap copy on the database host (copies from a backup host come later)",
            )
        try:
            record = ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            raise self.mismatch(
                ctx,
                f"backup {self.backup_id} is not in the catalog",
                "list the backups with `pgsnap list`, then make a new plan",
            ) from None
        if record.labelfile != self.labelfile:
            raise self.mismatch(
                ctx,
                f"the plan's backup label is not backup {self.backup_id}'s",
                "make a new plan (pgsnap copy)",
            )
        for name, path in self.trees.items():
            if not os.path.isdir(path):
                raise self.mismatch(
                    ctx,
                    f"the snapshot tree {name} ({path}) of backup {self.backup_id} is gone",
                    "list the backup's snapshots (pgsnap list); a backup without them "
                    "cannot be copied",
                )

    def run(self, ctx: OperationContext) -> Outputs:
        def progress(p: CopyProgress) -> None:
            left = p.seconds_left
            ctx.progress(
                f"{p.files_done}/{p.files_total} files, "
                f"{p.bytes_read / 2**20:.0f} of {p.bytes_total / 2**20:.0f} MiB read, "
                f"{p.bytes_sent / 2**20:.0f} MiB sent, {p.rate / 2**20:.1f} MiB/s"
                + ("" if left is None else f", {_duration(left)} left"),
                {
                    "files_done": p.files_done,
                    "files_total": p.files_total,
                    "bytes_read": p.bytes_read,
                    "bytes_total": p.bytes_total,
                    "bytes_sent": p.bytes_sent,
                    "rate": round(p.rate, 1),
                    "seconds_left": None if left is None else round(left, 1),
                },
            )

        files = {"backup_label": self.labelfile}
        if self.spcmapfile:
            files["tablespace_map"] = self.spcmapfile
        manifest, stats = copy_trees(
            self.trees,
            open_target(self.target_dir, self.target_options, connections=2 * self.parallel),
            copy_id=self.copy_id,
            backup_id=self.backup_id,
            files=files,
            chunk_size=self.chunk_size,
            codec=self.codec or default_codec(),
            clock=ctx.clock,
            on_progress=progress,
            parallel=self.parallel,
            bandwidth_limit=self.bandwidth_limit,
        )
        return {
            "manifest_digest": manifest.digest(),
            "created_at": manifest.created_at.isoformat(),
            "files": stats.files,
            "bytes_read": stats.bytes_read,
            "bytes_sent": stats.bytes_sent,
            "chunks_new": stats.chunks_new,
            "chunks_reused": stats.chunks_reused,
            "seconds": stats.seconds,
        }


@attrs.frozen
class DeleteCopyManifest(Operation):
    """Remove a copy's manifest (its chunks stay: they are reused by the next copy)."""

    name = "copy.delete_manifest"
    target = _Target.COPY

    copy_id: str
    target_dir: str
    target_options: Mapping[str, str] = attrs.field(factory=dict)

    def run(self, ctx: OperationContext) -> Outputs:
        open_target(self.target_dir, self.target_options).delete_manifest(self.copy_id)
        return {}


@attrs.frozen
class RecordCopy(Operation):
    """Add copy ``copy_id`` (what the ``sent`` step reported) to its backup's record."""

    name = "catalog.record_copy"
    target = _Target.CATALOG

    backup_id: str
    copy_id: str
    target_dir: str
    sent: Ref

    def run(self, ctx: OperationContext) -> Outputs:
        out = ctx.resolve(self.sent)
        if not isinstance(out, Mapping):
            raise PgsnapError(f"step {ctx.step_id}: the copy step reported nothing")
        record = ctx.catalog.get(self.backup_id)
        copy = CopyRecord(
            copy_id=self.copy_id,
            target=self.target_dir,
            manifest_digest=str(out["manifest_digest"]),
            created_at=dt.datetime.fromisoformat(str(out["created_at"])),
            files=int(str(out["files"])),
            bytes_read=int(str(out["bytes_read"])),
            bytes_sent=int(str(out["bytes_sent"])),
            chunks_new=int(str(out["chunks_new"])),
            chunks_reused=int(str(out["chunks_reused"])),
            seconds=float(str(out["seconds"])),
        )
        kept = tuple(c for c in record.copies if c.copy_id != self.copy_id)
        ctx.catalog.put(attrs.evolve(record, copies=(*kept, copy)))
        return {}


def _clear(directory: str) -> int:
    """Remove everything in ``directory`` (a fresh file system's ``lost+found`` aside),
    keeping the directory itself (a mount point); return the entries removed."""
    removed = 0
    with os.scandir(directory) as it:
        entries = list(it)
    for e in entries:
        if e.name == "lost+found":
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path)
        else:
            os.unlink(e.path)
        removed += 1
    return removed


@attrs.frozen
class RestoreFromCopy(Operation):
    """Replace volume ``volume_id``'s content (the directory the layout mounts it at)
    with tree ``tree`` of copy ``copy_id`` of backup ``backup_id``, in the copy target
    ``target_dir`` (with ``target_options``).

    What it depends on is checked before the run changes anything: that
    ``directory`` is where the layout has the volume; that the catalog records
    the copy on that backup with the manifest digest the plan was made with
    (``manifest_digest``), and the target holds that very manifest with the
    tree; that the plan writes that backup's label. When it runs, the
    volume's content is removed (the plan's safety snapshot, taken first,
    keeps it) and the tree is written, every chunk and file checked. Run
    again after an interruption, it starts over.
    """

    name = "copy.restore"
    target = _Target.COPY
    compensation = "storage.restore_volume"

    volume_id: str
    backup_id: str
    copy_id: str
    target_dir: str
    tree: str
    directory: str
    manifest_digest: str
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    parallel: int = 4

    def restores(self) -> tuple[str, str | None]:
        """The volume, and the backup whose copy it gets."""
        return (self.volume_id, self.backup_id)

    def _manifest(self, ctx: OperationContext) -> Manifest:
        try:
            text = open_target(self.target_dir, self.target_options).get_manifest(self.copy_id)
        except CopyNotFound:
            raise self.mismatch(
                ctx,
                f"copy {self.copy_id} is not in the copy target {self.target_dir}",
                "list the backup's copies (pgsnap list --json) and make a new plan",
            ) from None
        manifest = Manifest.from_json(text)
        if manifest.digest() != self.manifest_digest or manifest.backup_id != self.backup_id:
            raise self.mismatch(
                ctx,
                f"the manifest of copy {self.copy_id} in {self.target_dir} is not the one the "
                f"catalog records for backup {self.backup_id}",
                "the copy was replaced or the plan edited: verify the copy "
                "(pgsnap verify-copy) and make a new plan",
            )
        if self.tree not in manifest.trees:
            raise self.mismatch(
                ctx,
                f"copy {self.copy_id} has no tree {self.tree!r} "
                f"(its trees: {', '.join(manifest.trees)})",
                "the plan was edited or made for another layout: make a new plan",
            )
        return manifest

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        vol = next((v for v in ctx.layout.volumes if v.id == self.volume_id), None)
        if vol is None or vol.role not in (VolumeRole.DATA, VolumeRole.TABLESPACE):
            raise self.mismatch(
                ctx,
                f"it restores volume {self.volume_id}, which is not a data or tablespace "
                "volume of the cluster's layout",
                "the plan was edited or made for another cluster: make a new plan",
            )
        if os.path.normpath(self.directory) != os.path.normpath(vol.mount_point):
            raise self.mismatch(
                ctx,
                f"it writes into {self.directory}, but the layout has volume "
                f"{self.volume_id} at {vol.mount_point}",
                "the plan was edited: make a new plan",
            )
        if not isinstance(ctx.host.runner, LocalRunner):
            raise self.mismatch(
                ctx,
                f"a restore from a copy writes on this machine, and the database host is "
                f"{ctx.host.description}",
                "run the recovery on the database host",
            )
        record = self.backup_record(ctx, self.backup_id)
        copy = next((c for c in record.copies if c.copy_id == self.copy_id), None)
        if copy is None or copy.manifest_digest != self.manifest_digest:
            raise self.mismatch(
                ctx,
                f"the catalog does not record copy {self.copy_id} of backup {self.backup_id}"
                + ("" if copy is None else " with the manifest the plan was made with"),
                "list the backup's copies (pgsnap list --json) and make a new plan",
            )
        self.check_writes_label(ctx, plan, self.backup_id)
        if ctx.step_id not in plan.started:
            self._manifest(ctx)
            if not os.path.isdir(self.directory):
                raise self.mismatch(
                    ctx,
                    f"{self.directory}, where volume {self.volume_id} is mounted, is not a "
                    "directory",
                    f"mount the (new, empty) volume at {self.directory}, then make a new plan",
                )

    def run(self, ctx: OperationContext) -> Outputs:
        manifest = self._manifest(ctx)
        started = time.monotonic()
        removed = _clear(self.directory)
        if removed:
            log.info("removed %d entries of %s before the restore", removed, self.directory)

        def progress(p: RestoreProgress) -> None:
            left = p.seconds_left
            ctx.progress(
                f"{p.files_done}/{p.files_total} files, {p.bytes_written / 2**20:.0f} of "
                f"{p.bytes_total / 2**20:.0f} MiB, {p.rate / 2**20:.1f} MiB/s"
                + ("" if left is None else f", {_duration(left)} left"),
                {
                    "files_done": p.files_done,
                    "files_total": p.files_total,
                    "bytes_done": p.bytes_written,
                    "bytes_total": p.bytes_total,
                    "rate": round(p.rate, 1),
                    "seconds_left": None if left is None else round(left, 1),
                },
            )

        try:
            written = restore_trees(
                manifest,
                open_target(self.target_dir, self.target_options),
                {self.tree: self.directory},
                parallel=self.parallel,
                on_progress=progress,
            )
        except OSError as exc:
            raise CopyError(
                f"cannot write copy {self.copy_id}'s tree {self.tree} into "
                f"{self.directory}: {exc.strerror or exc}",
                hint="check the volume's free space and permissions, then resume",
                path=str(getattr(exc, "filename", "") or self.directory),
            ) from exc
        return {
            "bytes_written": written,
            "removed": removed,
            "seconds": round(time.monotonic() - started, 3),
        }
