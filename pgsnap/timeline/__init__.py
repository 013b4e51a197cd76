"""What is recoverable, as one picture: timelines, WAL coverage, backups (pure).

:func:`build_timeline` turns what the observer knows (the catalog's backups, the
archive's segments and timeline histories, the restore points the WAL index has
seen, the drills) into a :class:`TimelineView`: plain data that
:mod:`pgsnap.timeline.svg` draws as SVG, and that products can draw their own way.

The x axis of the picture is the WAL position (LSN): timelines are lanes, a child
timeline forks from its parent at its switchpoint, archived WAL is a bar with a gap
wherever a segment is missing, and each DONE backup is a mark at its start with the
window it can be recovered to: from its consistency point (its stop) to the end of
the archived WAL that follows its start without a gap, on its timeline (a later
timeline forked from there continues it; the lanes show where).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

import attrs

from pgsnap._attrs import frozen
from pgsnap.model import LSN, BackupRecord, BackupState, DrillRecord
from pgsnap.plan import Plan
from pgsnap.wal import ArchiveIndex, TimelineGraph, segment_name

__all__ = [
    "BackupMark",
    "DrillMark",
    "GapMark",
    "Lane",
    "RestorePointMark",
    "TargetMark",
    "TimelineView",
    "WalRun",
    "build_timeline",
    "plan_target",
]


@frozen
class WalRun:
    """Archived WAL without a gap on ``timeline``: ``start`` (the first byte of its
    first segment) to ``end`` (the end of its last)."""

    timeline: int
    start: LSN
    end: LSN
    segments: int


@frozen
class GapMark:
    """Missing WAL on ``timeline`` between two runs: ``start`` to ``end``, the first
    missing segment named (``first_missing``) and how many are missing."""

    timeline: int
    start: LSN
    end: LSN
    first_missing: str
    segments: int


@frozen
class Lane:
    """One timeline: where it forks from its parent (None for a first timeline) and
    the WAL archived on it."""

    timeline: int
    parent: int | None
    switchpoint: LSN | None
    runs: tuple[WalRun, ...]

    @property
    def start(self) -> LSN:
        """Where the lane begins: its switchpoint, or its first archived WAL."""
        if self.switchpoint is not None:
            return self.switchpoint
        return self.runs[0].start if self.runs else LSN(0)

    @property
    def end(self) -> LSN:
        """Where its archived WAL ends (its start when none is archived)."""
        return max((r.end for r in self.runs), default=self.start)


@frozen
class BackupMark:
    """A backup: where it starts and becomes consistent, and the window it can be
    recovered to (``recoverable_to``: the end of the gapless WAL from its start on its
    timeline; None when it cannot be recovered, e.g. not DONE, or its WAL is missing)."""

    id: str
    label: str
    state: BackupState
    timeline: int
    start: LSN
    stop: LSN | None
    start_time: dt.datetime
    stop_time: dt.datetime | None
    pinned: bool
    copies: int
    recoverable_to: LSN | None


@frozen
class RestorePointMark:
    """A restore point (``pg_create_restore_point``) the WAL index has seen."""

    name: str
    lsn: LSN
    timeline: int


@frozen
class DrillMark:
    """A restore drill of a backup: when it started and whether it passed."""

    backup_id: str
    started_at: dt.datetime
    ok: bool


@frozen
class TargetMark:
    """A recovery plan's target and chosen backup, drawn over the picture."""

    description: str
    backup_id: str
    timeline: int
    lsn: LSN | None
    """Where the target falls (an LSN target, the end of the WAL for latest, a restore
    point's position); None when only a time is known."""


@frozen
class TimelineView:
    """Everything :mod:`pgsnap.timeline.svg` draws (see the module docstring)."""

    segment_size: int
    lanes: tuple[Lane, ...]
    gaps: tuple[GapMark, ...]
    backups: tuple[BackupMark, ...]
    restore_points: tuple[RestorePointMark, ...] = ()
    drills: tuple[DrillMark, ...] = ()
    target: TargetMark | None = None
    generated_at: dt.datetime | None = None

    def lane(self, timeline: int) -> Lane | None:
        """The lane of ``timeline``, if it has one."""
        return next((lane for lane in self.lanes if lane.timeline == timeline), None)

    def backup(self, backup_id: str) -> BackupMark | None:
        """The mark of backup ``backup_id``, if it is in the view."""
        return next((b for b in self.backups if b.id == backup_id), None)

    def with_target(self, target: TargetMark | None) -> TimelineView:
        """The same view with ``target`` drawn over it."""
        return attrs.evolve(self, target=target)

    def _repr_html_(self) -> str:
        """Jupyter shows the view as its SVG."""
        from pgsnap.timeline.svg import render_svg  # noqa: PLC0415

        svg: str = render_svg(self)
        return svg


def plan_target(plan: Plan) -> TargetMark | None:
    """Where a recovery plan's target falls and which backup it restores (None for a
    plan of another kind): the backup its label step writes, the timeline of its
    summary, and how far its recovery replays (the target's LSN, or the end of the
    reachable WAL; a time target is not placed by LSN)."""
    if plan.kind != "recovery":
        return None
    backup_id = ""
    until: LSN | None = None
    stops: LSN | None = None
    for step in plan.steps:
        if step.action == "db.write_backup_label":
            backup_id = str(step.params.get("backup_id", ""))
        if step.action == "db.wait_recovery":
            raw, at = step.params.get("until_lsn"), step.params.get("target_lsn")
            until = LSN.parse(raw) if isinstance(raw, str) else None
            stops = LSN.parse(at) if isinstance(at, str) else None
    target = str(plan.summary.get("target", ""))
    timeline_text = str(plan.summary.get("target timeline", "")).split(" ", 1)[0]
    timeline = int(timeline_text) if timeline_text.isdigit() else 0
    # Where replay stops: the target's position when the plan knows it; for latest,
    # the end of the reachable WAL; else (a time never read in the WAL) not placed.
    placed = stops if stops is not None else until if target == "latest" else None
    return TargetMark(f"target {target}", backup_id, timeline, placed)


def _runs(index: ArchiveIndex) -> tuple[list[WalRun], list[GapMark]]:
    seg = index.segment_size
    runs: list[WalRun] = []
    gaps: list[GapMark] = []
    by_tli: dict[int, list[WalRun]] = {}
    for r in sorted(index.segment_ranges, key=lambda r: (r.timeline, r.first)):
        run = WalRun(r.timeline, LSN(r.first * seg), LSN((r.last + 1) * seg), r.count)
        previous = by_tli.get(r.timeline, [])
        if previous:
            last = previous[-1]
            gaps.append(
                GapMark(
                    r.timeline,
                    last.end,
                    run.start,
                    segment_name(r.timeline, last.end.value // seg, seg),
                    (run.start.value - last.end.value) // seg,
                )
            )
        by_tli.setdefault(r.timeline, []).append(run)
        runs.append(run)
    return runs, gaps


def build_timeline(
    backups: Iterable[BackupRecord],
    index: ArchiveIndex,
    graph: TimelineGraph,
    *,
    restore_points: Sequence[tuple[LSN, str, int]] = (),
    drills: Iterable[DrillRecord] = (),
    now: dt.datetime | None = None,
) -> TimelineView:
    """The view of ``backups`` over the archive ``index`` (its ``graph`` of timelines);
    ``restore_points`` are ``(lsn, name, timeline)``."""
    runs, gaps = _runs(index)
    timelines = sorted({r.timeline for r in runs} | set(graph.timelines()))
    lanes = []
    for tli in timelines:
        parent = graph.parent_of(tli) if tli in graph else None
        switch = graph.switchpoint_of(tli) if tli in graph else None
        lanes.append(Lane(tli, parent, switch, tuple(r for r in runs if r.timeline == tli)))
    marks = []
    for b in sorted(backups, key=lambda r: (r.start_lsn, r.id)):
        tli = b.stop_timeline or b.start_timeline
        reach = None
        if b.state is BackupState.DONE and b.stop_lsn is not None:
            run = next(
                (r for r in runs if r.timeline == tli and r.start <= b.start_lsn < r.end), None
            )
            if run is not None and run.end > b.stop_lsn:
                reach = run.end
        marks.append(
            BackupMark(
                id=b.id,
                label=b.label,
                state=b.state,
                timeline=tli,
                start=b.start_lsn,
                stop=b.stop_lsn,
                start_time=b.start_time,
                stop_time=b.stop_time,
                pinned=b.pin is not None,
                copies=len(b.copies),
                recoverable_to=reach,
            )
        )
    return TimelineView(
        segment_size=index.segment_size,
        lanes=tuple(lanes),
        gaps=tuple(gaps),
        backups=tuple(marks),
        restore_points=tuple(
            RestorePointMark(name, lsn, tli) for lsn, name, tli in sorted(restore_points)
        ),
        drills=tuple(
            DrillMark(d.backup_id, d.started_at, bool(d.ok))
            for d in sorted(drills, key=lambda d: d.started_at)
        ),
        generated_at=now,
    )
