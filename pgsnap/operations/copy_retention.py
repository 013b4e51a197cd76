"""``copy.expire_manifest``, ``catalog.forget_copy`` and ``copy.collect_garbage``: copies
removed by copy retention, and the chunks no copy needs any more.

A copy planned to go (:func:`pgsnap.planner.copy_expiry.plan_copy_expiry`) loses
its manifest in the target first (:class:`ExpireCopyManifest`), then its record
on the backup (:class:`ForgetCopy`): a run cut short between the two leaves a
record whose manifest is gone, which the recovery planner already passes over
("not found in their targets") and the run resumed finishes; never a manifest
no record names, which nothing would ever remove and whose chunks garbage
collection would keep for ever. :class:`CollectCopyGarbage` then removes the
chunks no manifest names (:func:`pgsnap.copies.collect_garbage`); it is also
the one step of a ``copy-gc`` plan (``pgsnap copy-gc``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies import GcProgress, GcReport, collect_garbage, open_target
from pgsnap.copies.keys import CopyKey
from pgsnap.copies.manifest import decode_manifest
from pgsnap.copies.markers import DEFAULT_STALE_AFTER
from pgsnap.errors import BackupNotFound, CopyBusy, CopyError, CopyNotFound, FormatError
from pgsnap.operations.base import Operation, OperationContext, Outputs, PlanView
from pgsnap.operations.base import Target as _Target

__all__ = ["CollectCopyGarbage", "ExpireCopyManifest", "ForgetCopy", "gc_outputs", "gc_report"]

log = logging.getLogger(__name__)


def _key(key_file: str) -> CopyKey | None:
    return CopyKey.from_file(key_file) if key_file else None


@frozen
class ExpireCopyManifest(Operation):
    """Remove the manifest of copy ``copy_id`` of backup ``backup_id`` from the copy
    target ``target_dir`` (with ``target_options``), if it is the one the catalog
    records (``manifest_digest``); one already gone is fine. Its chunks stay for
    :class:`CollectCopyGarbage`. Not undone: a removed manifest cannot come back."""

    name = "copy.expire_manifest"
    target = _Target.COPY

    backup_id: str
    copy_id: str
    target_dir: str
    manifest_digest: str
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    key_file: str = ""
    """The copy key's file, to read an encrypted copy's manifest ("" : none)."""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        if ctx.step_id in plan.started:
            return  # a resumed run: the record may be forgotten already
        try:
            record = ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            raise self.mismatch(
                ctx,
                f"backup {self.backup_id} is not in the catalog",
                "make a new plan (pgsnap expire-copies)",
            ) from None
        copy = next((c for c in record.copies if c.copy_id == self.copy_id), None)
        if (
            copy is None
            or copy.target != self.target_dir
            or copy.manifest_digest != self.manifest_digest
        ):
            raise self.mismatch(
                ctx,
                f"the catalog does not record copy {self.copy_id} of backup "
                f"{self.backup_id} in {self.target_dir} with the manifest the plan names",
                "the plan was edited or the copies changed: make a new plan (pgsnap expire-copies)",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        store = open_target(self.target_dir, self.target_options)
        try:
            text = store.get_manifest(self.copy_id)
        except CopyNotFound:
            log.info(
                "copy %s: its manifest was already gone from %s", self.copy_id, self.target_dir
            )
            return {"deleted": False}
        try:
            digest = decode_manifest(text, self.copy_id, _key(self.key_file)).digest()
        except FormatError as exc:
            digest = f"unreadable ({exc.message})"
        if digest != self.manifest_digest:
            raise CopyError(
                f"the manifest of copy {self.copy_id} in {self.target_dir} is not the one the "
                f"catalog records for backup {self.backup_id} ({digest}): it is not removed",
                hint="the copy was replaced or edited: verify it (pgsnap verify-copy), "
                "then make a new plan",
                target=self.target_dir,
                copy_id=self.copy_id,
            )
        store.delete_manifest(self.copy_id)
        return {"deleted": True}


@frozen
class ForgetCopy(Operation):
    """Remove copy ``copy_id`` from backup ``backup_id``'s record (a record or copy
    already gone is fine). Planned after :class:`ExpireCopyManifest`."""

    name = "catalog.forget_copy"
    target = _Target.CATALOG

    backup_id: str
    copy_id: str

    def run(self, ctx: OperationContext) -> Outputs:
        try:
            record = ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            return {"forgotten": False}
        kept = tuple(c for c in record.copies if c.copy_id != self.copy_id)
        if len(kept) == len(record.copies):
            return {"forgotten": False}
        ctx.catalog.put(attrs.evolve(record, copies=kept))
        return {"forgotten": True, "copies_left": len(kept)}


def gc_outputs(report: GcReport) -> Outputs:
    """A :class:`~pgsnap.copies.GcReport` as a step's outputs (plain JSON)."""
    return {
        "chunks_total": report.chunks_total,
        "chunks_live": report.chunks_live,
        "chunks_deleted": report.chunks_deleted,
        "chunks_missing": report.chunks_missing,
        "manifests": report.manifests,
        "pending": list(report.pending),
        "seconds": round(report.seconds, 3),
        "dry_run": report.dry_run,
    }


def gc_report(outputs: Mapping[str, object]) -> GcReport | None:
    """The :class:`~pgsnap.copies.GcReport` a :class:`CollectCopyGarbage` step produced
    (None when it did not collect: a copy was in progress)."""
    if outputs.get("busy") or "chunks_total" not in outputs:
        return None

    def count(key: str) -> int:
        return int(str(outputs.get(key, 0)))

    pending = outputs.get("pending", [])
    return GcReport(
        chunks_total=count("chunks_total"),
        chunks_live=count("chunks_live"),
        chunks_deleted=count("chunks_deleted"),
        chunks_missing=count("chunks_missing"),
        manifests=count("manifests"),
        pending=tuple(str(p) for p in pending) if isinstance(pending, list) else (),
        seconds=float(str(outputs.get("seconds", 0.0))),
        dry_run=bool(outputs.get("dry_run", False)),
    )


@frozen
class CollectCopyGarbage(Operation):
    """Remove from the copy target ``target_dir`` the chunks no manifest names
    (:func:`pgsnap.copies.collect_garbage`, with markers judged stale after
    ``stale_after_seconds``). With ``busy_ok`` a copy or another collection in
    progress (:class:`~pgsnap.errors.CopyBusy`) ends the step with ``busy`` in its
    outputs instead of failing it (the expiry's deletions stand; the next
    collection removes the chunks). Idempotent: a resumed run collects again."""

    name = "copy.collect_garbage"
    target = _Target.COPY

    target_dir: str
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    stale_after_seconds: int = int(DEFAULT_STALE_AFTER.total_seconds())
    busy_ok: bool = False
    key_file: str = ""
    """The copy key's file, to read encrypted copies' manifests ("" : none; a target
    with one then refuses the collection, removing nothing)."""

    def run(self, ctx: OperationContext) -> Outputs:
        def progress(p: GcProgress) -> None:
            ctx.progress(
                f"{p.chunks_deleted}/{p.chunks_to_delete} chunks removed",
                {"chunks_deleted": p.chunks_deleted, "chunks_to_delete": p.chunks_to_delete},
            )

        try:
            report = collect_garbage(
                open_target(self.target_dir, self.target_options),
                clock=ctx.clock,
                stale_after=dt.timedelta(seconds=self.stale_after_seconds),
                on_progress=progress,
                key=_key(self.key_file),
            )
        except CopyBusy as exc:
            if not self.busy_ok:
                raise
            log.warning("garbage collection of %s skipped: %s", self.target_dir, exc.message)
            return {
                "busy": True,
                "why": exc.message,
                "holders": [dict(h) for h in exc.holders],
            }
        return gc_outputs(report)
