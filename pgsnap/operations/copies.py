"""``copy.*`` and ``catalog.record_copy``: a backup copied off the array, and recorded.

:class:`SendCopy` reads the trees of a backup's snapshots in place (where
:meth:`~pgsnap.protocols.ReadableSnapshots.snapshot_access` says they are)
and writes them to a copy target as chunks and, last, a manifest
(:func:`pgsnap.copies.copy_trees`). It is idempotent: a resumed or repeated
run sends only the chunks still missing. Its undo removes the manifest, so a
copy the catalog does not record is not left looking complete.
:class:`RecordCopy` adds the copy to the backup's record.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Mapping

import attrs

from pgsnap.copies import CopyProgress, copy_trees, default_codec, open_target
from pgsnap.copies.copier import DEFAULT_CHUNK_SIZE
from pgsnap.errors import BackupNotFound, PgsnapError
from pgsnap.host.runners import LocalRunner
from pgsnap.model import CopyRecord
from pgsnap.operations.base import Operation, OperationContext, Outputs, PlanView, Ref
from pgsnap.operations.base import Target as _Target

__all__ = ["DeleteCopyManifest", "RecordCopy", "SendCopy"]

log = logging.getLogger(__name__)


@attrs.frozen
class SendCopy(Operation):
    """Copy ``trees`` (name → a snapshot's directory) to the copy target
    ``target_dir`` (a directory or ``s3://bucket/prefix``, with ``target_options``)
    as copy ``copy_id`` of backup ``backup_id``, with the backup label and
    tablespace map in the manifest."""

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
            ctx.progress(
                f"{p.files_done}/{p.files_total} files, "
                f"{p.bytes_read / 2**20:.0f} of {p.bytes_total / 2**20:.0f} MiB read, "
                f"{p.bytes_sent / 2**20:.0f} MiB sent",
                {
                    "files_done": p.files_done,
                    "files_total": p.files_total,
                    "bytes_read": p.bytes_read,
                    "bytes_total": p.bytes_total,
                    "bytes_sent": p.bytes_sent,
                },
            )

        files = {"backup_label": self.labelfile}
        if self.spcmapfile:
            files["tablespace_map"] = self.spcmapfile
        manifest, stats = copy_trees(
            self.trees,
            open_target(self.target_dir, self.target_options),
            copy_id=self.copy_id,
            backup_id=self.backup_id,
            files=files,
            chunk_size=self.chunk_size,
            codec=self.codec or default_codec(),
            clock=ctx.clock,
            on_progress=progress,
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
