"""Garbage collection of a copy target: remove the chunks no copy needs.

Chunks are shared between copies, so removing a copy removes only its
manifest (:meth:`~pgsnap.copies.target.CopyTarget.delete_manifest`); the
chunks that no manifest names any more, and those a copy that died left
behind, stay until :func:`collect_garbage` removes them: a mark and sweep.

**Mark**: the union of the chunk ids of every manifest in the target. A
manifest that cannot be read or parsed stops the collection before anything
is removed: a chunk is never removed on doubt. **Sweep**: every stored chunk
not marked is removed (``dry_run``: counted only).

A chunk may be removed only when no manifest names it *and no copy is in
progress*: a running copy has sent chunks (or found them in the target and
counted on them) that no manifest names yet. The two meet through markers
in the target (:mod:`pgsnap.copies.markers`):

- a copy writes ``pending.<copy id>`` before its first chunk, *then* reads
  ``gc``: a fresh ``gc`` marker and it removes its own marker and refuses to
  start (:class:`~pgsnap.errors.CopyBusy`);
- a collection creates ``gc`` (only if absent, atomically), *then* lists the
  ``pending.*`` markers: a fresh one and it removes ``gc`` and refuses to
  sweep (:class:`~pgsnap.errors.CopyBusy`, naming the copies and since when).

**Why this is safe.** Each side writes its own marker and then reads the
other's. In a store where every request takes effect at one instant between
its call and its answer, and a read or a listing sees every write that took
effect before it (S3 is strongly consistent for reads and listings after
writes; a local or NFS directory is), take the instants ``Wc`` (the copy's
write), ``Rc`` (its read of ``gc``), ``Wg`` (the collection's write) and
``Rg`` (its listing): ``Wc < Rc`` and ``Wg < Rg``. If ``Rg`` is before ``Wc``
then ``Wg < Rg < Wc < Rc``: the copy sees ``gc`` and does not start. Else
``Wc < Rg``: the collection sees the copy's marker and does not sweep. So a
copy and a sweep never overlap, and a copy that found a chunk in the target
(and did not send it) keeps it: no collection sweeps until the copy has
written its manifest and removed its marker, and a collection that starts
after the manifest was written marks its chunks.

**Stale markers.** A process that dies leaves its marker. A marker not
refreshed for ``stale_after`` (24 hours by default) is taken for a dead
process's: a collection ignores a stale ``pending`` marker (and says so in
its report), replaces a stale ``gc`` marker with a warning, and a copy starts
despite a stale ``gc`` marker. A living copy or collection rewrites its
marker every minute (at its next request to the target), so its marker is
never stale — unless the process stops for longer than that (a suspended
machine, a stopped process) and then goes on. Both sides guard against that:

- a collection, before it removes a chunk, re-reads its marker whenever its
  last refresh is a minute old: it must still be its own (its ``token``),
  then it writes it again and lists the ``pending`` markers again (a fresh one
  stops it) and reads any new manifest (marking its chunks). A collection that
  stopped for a long time therefore finds, before its next removal, that
  another took over or that a copy started, and stops;
- a copy remembers the longest time its marker went unrefreshed. If that
  exceeded :data:`~pgsnap.copies.markers.TRUSTED_GAP` (half the shortest
  ``stale_after`` a collection accepts), a collection may have swept without
  it: after writing its manifest it waits for a running collection to end
  (up to half a minute, else it removes the manifest and raises
  :class:`~pgsnap.errors.CopyBusy`), then checks every chunk the manifest
  names again, and removes the manifest and raises if one is missing. Every
  copy checks its chunks after writing its manifest in any case.

What remains: a collection that stops for longer than ``stale_after``
*between* its last check and the removal request itself (a request stalled
that long in the network) could remove a chunk that a copy started in the
meantime counted on. The limit is meant to be far above any such stall;
clocks of the hosts must agree to well within :data:`TRUSTED_GAP`. Copies
of one copy id must not run at the same time (the plans never do: the copy
id is new and the cluster lock is held).

Clearing a marker by hand: ``pending.<copy id>`` of a copy that died is
cleared by running that copy again (it finishes, or fails and can be run
again), or by removing the marker once no process is writing that copy;
``gc`` of a collection that died is replaced by the next collection once
stale, or can be removed when no collection runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pgsnap._attrs import frozen
from pgsnap.copies.manifest import decode_manifest
from pgsnap.copies.markers import (
    DEFAULT_STALE_AFTER,
    GC_MARKER,
    MIN_STALE_AFTER,
    PENDING_PREFIX,
    REFRESH_INTERVAL,
    Marker,
    read_marker,
    utc_now,
)
from pgsnap.copies.target import CopyTarget
from pgsnap.errors import (
    ConfigurationError,
    CopyBusy,
    CopyError,
    CopyKeyError,
    CopyNotFound,
    FormatError,
)

if TYPE_CHECKING:
    from pgsnap.copies.keys import CopyKey

__all__ = ["GcProgress", "GcReport", "collect_garbage"]

log = logging.getLogger(__name__)


@frozen
class GcProgress:
    """A progress report of :func:`collect_garbage` (after each chunk removed)."""

    chunks_deleted: int
    chunks_to_delete: int


@frozen
class GcReport:
    """What a garbage collection found and did.

    ``chunks_total`` chunks were stored, ``chunks_live`` of them named by one
    of the ``manifests`` read, ``chunks_deleted`` removed (in a dry run: would
    have been). ``chunks_missing`` counts chunks a manifest names that are not
    stored (damage: ``pgsnap verify-copy`` names the files it breaks).
    ``pending`` names the markers of copies taken for dead (stale) and
    ignored.
    """

    chunks_total: int
    chunks_live: int
    chunks_deleted: int
    chunks_missing: int
    manifests: int
    pending: tuple[str, ...]
    seconds: float
    dry_run: bool

    def explain(self) -> str:
        """A line or two for a person."""
        verb = "would remove" if self.dry_run else "removed"
        out = (
            f"{self.manifests} copies name {self.chunks_live} of {self.chunks_total} stored "
            f"chunks; {verb} {self.chunks_deleted} ({self.seconds:.1f} s)"
        )
        if self.chunks_missing:
            out += f"\n{self.chunks_missing} chunks named by a copy are missing: verify the copies"
        if self.pending:
            out += "\nignored as stale (their copies are taken for dead): " + ", ".join(
                self.pending
            )
        return out


def _busy(target: CopyTarget, message: str, hint: str, holders: Iterable[Marker]) -> CopyBusy:
    return CopyBusy(
        message,
        hint=hint,
        target=target.location,
        holders=tuple(m.summary() for m in holders),
    )


class _Collection:
    """One run of :func:`collect_garbage`: its marker, the marks, the checks."""

    def __init__(
        self,
        target: CopyTarget,
        clock: Callable[[], dt.datetime],
        stale_after: dt.timedelta,
        dry_run: bool,
        key: CopyKey | None = None,
    ) -> None:
        self.target = target
        self.key = key
        self.clock = clock
        self.stale_after = stale_after
        self.dry_run = dry_run
        self.marker = Marker.new(GC_MARKER, clock(), stale_after=stale_after)
        self.held = False
        self.marked: set[str] = set()
        self.read: set[str] = set()
        self.ignored: dict[str, Marker] = {}

    # ---------------------------------------------------------------- the gc marker

    def acquire(self) -> None:
        """Create the ``gc`` marker (a stale one is replaced); CopyBusy if another
        collection's fresh marker is there. A dry run only looks."""
        for _ in range(3):
            if not self.dry_run and self.target.create_marker(GC_MARKER, self.marker.to_json()):
                self.held = True
                return
            other = self._read_gc()
            if other is None:
                if self.dry_run:
                    return
                continue  # removed between the two requests: try again
            limit = other.stale_after or self.stale_after
            if not other.is_stale(self.clock(), limit):
                raise _busy(
                    self.target,
                    f"another garbage collection is running on {self.target.location}: "
                    f"{other.describe()}",
                    "wait for it to end; if it died, its marker is stale "
                    f"{limit} after its last refresh and the next collection replaces it "
                    "(or remove the marker 'gc' once no collection runs)",
                    (other,),
                )
            log.warning(
                "garbage collection on %s: replacing a stale gc marker (%s)",
                self.target.location,
                other.describe(),
            )
            if self.dry_run:
                return
            # A write, not a removal and a create: the target is never without a
            # gc marker, so no copy starts in between.
            self.target.put_marker(GC_MARKER, self.marker.to_json())
            self.held = True
            self._check_ours()  # another collection replacing it at the same moment
            return
        raise _busy(
            self.target,
            f"the gc marker on {self.target.location} keeps appearing and disappearing",
            "another garbage collection is starting and stopping: wait, and try again",
            (),
        )

    def _read_gc(self) -> Marker | None:
        try:
            return read_marker(self.target, GC_MARKER)
        except FormatError as exc:
            raise CopyError(
                f"the gc marker on {self.target.location} is not pgsnap's: {exc.message}",
                hint="remove the marker 'gc' (markers/gc in the target) once no garbage "
                "collection runs; nothing was removed",
                target=self.target.location,
            ) from exc

    def _check_ours(self) -> None:
        current = self._read_gc()
        if current is None or current.token != self.marker.token:
            self.held = False  # not ours to remove any more
            raise _busy(
                self.target,
                f"another garbage collection took over {self.target.location} "
                f"({current.describe() if current else 'its marker is gone'}); this one stops",
                "let the other one finish; nothing more is removed by this one",
                (current,) if current else (),
            )

    def release(self) -> None:
        """Remove the ``gc`` marker if it is still this collection's."""
        if not self.held:
            return
        try:
            current = read_marker(self.target, GC_MARKER)
            if current is not None and current.token == self.marker.token:
                self.target.delete_marker(GC_MARKER)
        except (CopyError, FormatError) as exc:
            log.warning(
                "garbage collection on %s: could not remove its gc marker (%s): copies "
                "refuse to start until it is stale (%s) or removed",
                self.target.location,
                exc,
                self.stale_after,
            )
        self.held = False

    # ---------------------------------------------------------------- checks

    def check_pending(self) -> None:
        """CopyBusy when a copy is in progress (a fresh pending marker); stale ones
        are noted as ignored."""
        now = self.clock()
        fresh: list[Marker] = []
        for name in self.target.marker_names():
            if not name.startswith(PENDING_PREFIX):
                continue
            try:
                text = self.target.get_marker(name)
            except CopyNotFound:
                continue  # that copy ended in between
            try:
                marker = Marker.from_json(name, text)
            except FormatError as exc:
                raise CopyError(
                    f"the marker {name} on {self.target.location} is not pgsnap's: "
                    f"{exc.message}; cannot tell whether a copy is in progress",
                    hint=f"remove the marker {name} once no copy runs; nothing was removed",
                    target=self.target.location,
                ) from exc
            if marker.is_stale(now, self.stale_after):
                if name not in self.ignored:
                    log.warning(
                        "garbage collection on %s: ignoring the stale marker of %s",
                        self.target.location,
                        marker.describe(),
                    )
                self.ignored[name] = marker
            else:
                fresh.append(marker)
        if fresh:
            raise _busy(
                self.target,
                f"{len(fresh)} copies are in progress on {self.target.location}: "
                + "; ".join(m.describe() for m in fresh)
                + "; garbage collection did not sweep",
                "wait for the copies to end and collect again; if a copy died, run it "
                "again (it finishes and removes its marker) or remove its marker "
                f"'pending.<copy id>' once it is not running; a marker not refreshed for "
                f"{self.stale_after} is ignored",
                fresh,
            )

    def mark(self) -> None:
        """Add the chunks of every manifest not read yet to the marks."""
        for copy_id in self.target.manifest_ids():
            if copy_id in self.read:
                continue
            self.tick()
            try:
                text = self.target.get_manifest(copy_id)
            except CopyNotFound:
                continue  # removed in between (a copy expired): its chunks are not needed
            try:
                manifest = decode_manifest(text, copy_id, self.key)
            except CopyKeyError as exc:
                raise CopyKeyError(
                    f"{exc.message}; garbage collection stopped, nothing removed",
                    hint="a chunk is never removed on doubt: collect with the key every "
                    f"copy in the target was made with ({exc.hint})",
                    copy_id=copy_id,
                    fingerprint=exc.fingerprint,
                    given=exc.given,
                    target=self.target.location,
                ) from exc
            except FormatError as exc:
                raise CopyError(
                    f"the manifest of copy {copy_id} on {self.target.location} cannot be "
                    f"read ({exc.message}): garbage collection stopped, nothing removed",
                    hint="a chunk is never removed on doubt: repair or remove that manifest "
                    f"(manifests/{copy_id}.json), then collect again",
                    target=self.target.location,
                    copy_id=copy_id,
                ) from exc
            self.marked |= manifest.chunk_ids()
            self.read.add(copy_id)

    def tick(self, *, force: bool = False) -> None:
        """Before a request: when the marker's last refresh is a minute old, check it
        is still ours, write it again, look for copies and new manifests again."""
        now = self.clock()
        if not force and now - self.marker.refreshed_at < REFRESH_INTERVAL:
            return
        if self.held:
            self._check_ours()
            self.marker = self.marker.refreshed(now)
            self.target.put_marker(GC_MARKER, self.marker.to_json())
        else:
            self.marker = self.marker.refreshed(now)
        self.check_pending()
        self.mark()


def collect_garbage(
    target: CopyTarget,
    *,
    now: dt.datetime | None = None,
    clock: Callable[[], dt.datetime] | None = None,
    stale_after: dt.timedelta = DEFAULT_STALE_AFTER,
    dry_run: bool = False,
    on_progress: Callable[[GcProgress], None] | None = None,
    key: CopyKey | None = None,
) -> GcReport:
    """Remove from ``target`` the chunks that no manifest names, unless a copy is in
    progress (see the module docstring for the protocol and why it is safe).

    ``now``: the time markers are judged by (given alone, it stands for the whole
    run); ``clock`` gives the time during the run (default: the system's).
    ``stale_after``: a marker not refreshed for that long is a dead process's (at
    least :data:`~pgsnap.copies.markers.MIN_STALE_AFTER`). ``dry_run``: count,
    remove nothing and write nothing (not even the ``gc`` marker). ``key``: the
    copy key that opens the target's encrypted manifests; a manifest sealed with
    no key given, or with another one, stops the collection before anything is
    removed (:class:`~pgsnap.errors.CopyKeyError`): the chunks it names are not
    known.

    Raises :class:`~pgsnap.errors.CopyBusy` when another collection runs or a copy
    is in progress, and :class:`~pgsnap.errors.CopyError` (nothing removed) when a
    manifest or a marker cannot be read.
    """
    if stale_after < MIN_STALE_AFTER:
        raise ConfigurationError(
            f"stale_after must be at least {MIN_STALE_AFTER}, not {stale_after}",
            hint="a marker is refreshed every minute; a shorter limit would take a slow "
            "copy for a dead one",
        )
    if clock is None:
        clock = (lambda: now) if now is not None else utc_now
    started = time.monotonic()
    run = _Collection(target, clock, stale_after, dry_run, key)
    try:
        run.acquire()
        run.check_pending()
        run.mark()
        stored: set[str] = set()
        for chunk in target.chunk_ids():  # a long listing keeps the marker fresh too
            run.tick()
            stored.add(chunk)
        run.tick(force=True)  # the last word before the sweep: ours, no copy, every manifest
        orphans = sorted(stored - run.marked)
        deleted = 0
        for chunk in orphans:
            run.tick()
            if chunk in run.marked:  # named by a manifest read since
                continue
            if not dry_run:
                target.delete_chunk(chunk)
            deleted += 1
            if on_progress is not None:
                on_progress(GcProgress(deleted, len(orphans)))
    finally:
        run.release()
    report = GcReport(
        chunks_total=len(stored),
        chunks_live=len(stored & run.marked),
        chunks_deleted=deleted,
        chunks_missing=len(run.marked - stored),
        manifests=len(run.read),
        pending=tuple(sorted(run.ignored)),
        seconds=time.monotonic() - started,
        dry_run=dry_run,
    )
    log.info("garbage collection on %s: %s", target.location, report.explain())
    return report
