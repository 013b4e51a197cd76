"""Retention: which backups and which WAL to keep, planned as data (pure).

A :class:`RetentionPolicy` says what must stay recoverable; :func:`plan_expiry`
turns it, with the catalog, the storage's snapshots, the archive's index and
timeline histories and the time (:class:`ExpiryFacts`), into a
:class:`~pgsnap.plan.Plan` whose every step deletes one thing for a stated
reason, and whose ``kept`` list says why each kept backup stays.

What is kept:

- **redundancy N**: the newest N DONE backups;
- **window D**: every point in time within the last D stays recoverable: the
  newest DONE backup consistent at or before ``now - D`` (the window's
  anchor) and every DONE backup after it; until such a backup exists,
  every DONE backup is kept (and a warning says the window is not yet
  covered);
- **levels** (grandfather-father-son): the newest DONE backup of each of the
  last ``hourly`` hours, ``daily`` days, ``weekly`` ISO weeks and
  ``monthly`` months (UTC);
- whatever any of the above keeps is kept (they combine);
- a **pinned** backup (:class:`~pgsnap.model.Pin`) while its pin holds;
- a backup with a **secure** snapshot until the snapshot's retention ends
  (``extra["secure_until"]``; without it, always: the storage refuses
  deletion, so the plan never tries);
- a backup not finished yet (STARTED, WAITING_FOR_WAL): never touched.

A FAILED backup goes (its record, any snapshots it still names and the
leftovers it recorded) once a newer DONE backup exists. A DONE backup whose
snapshots vanished from the storage counts for no rule: it is marked FAILED
("cannot be restored", reported in the plan's warnings) and a later expiry
removes it.

**Copies** (issue 21): a backup with copies off the array never loses its
record here. When the policy does not keep it, only its snapshots are
deleted; a DONE backup whose snapshots are gone but that has copies stays
DONE (the recovery planner restores it from a copy) and is kept, with the
WAL from its start, until copy retention (:mod:`pgsnap.planner.copy_expiry`)
has removed its last copy; only then is it marked and removed as above.
Copies count for no rule of this policy (the snapshots' rules are about
snapshots). WAL: on each timeline, everything from the oldest
position a kept backup's recovery can start from on that timeline onward is
kept (a kept backup's own timeline from its start segment, every timeline
descending from its position from where that timeline begins); segments
before that, and whole timelines no kept backup reaches, go, with the
``.backup`` files of deleted backups. ``.history`` files are always kept.
A retention plan deletes nothing a kept backup needs: a property test checks
every kept backup against the recovery planner.

**Orphans** (:mod:`pgsnap.planner.reconcile`): snapshots pgsnap made of the
cluster's volumes that no record names (a killed backup run, a failed
backup's unrecorded leftovers, a recovery's safety snapshot). Every expiry
plan lists them with their age (a warning). With ``orphans_after`` set,
those older than it are deleted (one step per group, with the reason); the
younger ones are kept (a backup in flight has not recorded its snapshots
yet), and so is any orphan an unfinished plan's journal needs
(:class:`~pgsnap.planner.reconcile.SnapshotHold`), one of a backup not
finished, and a secure one until its retention ends. A backup whose
snapshots such a journal needs (a recovery restoring from it) is kept too.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, TypeVar

from pgsnap._attrs import frozen
from pgsnap.errors import BackupNotFound, ConfigurationError, PgsnapError, PlanningError
from pgsnap.model import BackupRecord, BackupState, Pin, SafetySnapshot, Snapshot, encode_value
from pgsnap.operations.catalog import (
    DeleteBackupRecord,
    DeleteSafetyRecord,
    DeleteWal,
    MarkUnusable,
    SetPin,
)
from pgsnap.operations.storage import DeleteSnapshotGroup, DeleteSnapshots
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import fingerprint
from pgsnap.planner.reconcile import Orphan, SnapshotHold, find_orphans, fmt_age
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph, segment_name

__all__ = [
    "MIN_ORPHANS_AFTER",
    "PERIODS",
    "ExpiryFacts",
    "RetentionPolicy",
    "keep_by_rules",
    "kept_backups",
    "plan_delete",
    "plan_delete_safety",
    "plan_expiry",
    "plan_pin",
    "safety_delete_steps",
    "safety_hold",
]


@frozen
class RetentionPolicy:
    """What retention keeps (see the module docstring). Combine freely.

    ``redundancy``: the newest N DONE backups (None: no such rule; 0 is
    refused). ``window``: a duration every point of which stays recoverable.
    ``hourly``/``daily``/``weekly``/``monthly``: grandfather-father-son levels
    (0: level unused). A policy that keeps nothing by any rule is refused.
    ``orphans_after``: delete orphan snapshots (pgsnap's, named by no record)
    older than this (None, the default: list them, delete none; at least
    :data:`MIN_ORPHANS_AFTER`). ``safety_after``: delete the safety snapshots
    recoveries recorded (:class:`~pgsnap.model.SafetySnapshot`) older than this
    (None, the default: keep them until deleted by name; at least
    :data:`MIN_ORPHANS_AFTER`); never one an unfinished run still needs.
    """

    redundancy: int | None = None
    window: dt.timedelta | None = None
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    orphans_after: dt.timedelta | None = None
    safety_after: dt.timedelta | None = None

    def __attrs_post_init__(self) -> None:
        if self.safety_after is not None and (
            not isinstance(self.safety_after, dt.timedelta) or self.safety_after < MIN_ORPHANS_AFTER
        ):
            raise ConfigurationError(
                f"retention safety_after must be at least {_fmt_delta(MIN_ORPHANS_AFTER)}, "
                f"not {self.safety_after}",
                hint="a safety snapshot may hold the only copy of what a recovery replaced: "
                "e.g. safety_after=timedelta(days=14) (pgsnap expire --safety-after 14d)",
            )
        counts = {
            "redundancy": self.redundancy,
            "hourly": self.hourly,
            "daily": self.daily,
            "weekly": self.weekly,
            "monthly": self.monthly,
        }
        for name, value in counts.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(
                    f"retention {name} must be a whole number, not {value!r}",
                    hint=f"e.g. {name}=7",
                )
            if value is not None and value < 0:
                raise ConfigurationError(
                    f"retention {name} cannot be negative ({value})", hint=f"e.g. {name}=7"
                )
        if self.redundancy == 0:
            raise ConfigurationError(
                "retention redundancy 0 would delete every backup",
                hint="keep at least one backup (redundancy=1 or more), or leave it unset",
            )
        if self.window is not None and self.window <= dt.timedelta(0):
            raise ConfigurationError(
                f"retention window must be positive, not {self.window}",
                hint="e.g. window=timedelta(days=7) (pgsnap expire --window 7d)",
            )
        if self.orphans_after is not None and (
            not isinstance(self.orphans_after, dt.timedelta)
            or self.orphans_after < MIN_ORPHANS_AFTER
        ):
            raise ConfigurationError(
                f"retention orphans_after must be at least {_fmt_delta(MIN_ORPHANS_AFTER)}, "
                f"not {self.orphans_after}",
                hint="a backup in flight records its snapshots only once backup mode ends: "
                "give orphans some time, e.g. orphans_after=timedelta(days=1) "
                "(pgsnap expire --orphans-after 1d)",
            )
        if (
            self.redundancy is None
            and self.window is None
            and not (self.hourly or self.daily or self.weekly or self.monthly)
        ):
            raise ConfigurationError(
                "the retention policy keeps nothing: it would delete every backup",
                hint="set a redundancy, a window or grandfather-father-son levels",
            )

    def to_request(self) -> dict[str, int | None]:
        """The policy as a plan's ``request`` (plain JSON)."""
        orphans = self.orphans_after
        safety = self.safety_after
        return {
            "orphans_after_seconds": None if orphans is None else int(orphans.total_seconds()),
            "safety_after_seconds": None if safety is None else int(safety.total_seconds()),
            "redundancy": self.redundancy,
            "window_seconds": None if self.window is None else int(self.window.total_seconds()),
            "hourly": self.hourly,
            "daily": self.daily,
            "weekly": self.weekly,
            "monthly": self.monthly,
        }

    @classmethod
    def from_request(cls, request: Mapping[str, object]) -> RetentionPolicy:
        """The policy a plan's ``request`` holds (:meth:`to_request`)."""

        def count(key: str) -> int:
            value = request.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        redundancy = request.get("redundancy")
        window = request.get("window_seconds")
        orphans = request.get("orphans_after_seconds")
        safety = request.get("safety_after_seconds")
        return cls(
            orphans_after=dt.timedelta(seconds=orphans)
            if isinstance(orphans, int) and not isinstance(orphans, bool)
            else None,
            safety_after=dt.timedelta(seconds=safety)
            if isinstance(safety, int) and not isinstance(safety, bool)
            else None,
            redundancy=redundancy if isinstance(redundancy, int) else None,
            window=dt.timedelta(seconds=window) if isinstance(window, int) else None,
            hourly=count("hourly"),
            daily=count("daily"),
            weekly=count("weekly"),
            monthly=count("monthly"),
        )

    def describe(self) -> str:
        """The policy in words (for plans and listings)."""
        parts = []
        if self.redundancy is not None:
            parts.append(f"redundancy {self.redundancy}")
        if self.window is not None:
            parts.append(f"window {_fmt_delta(self.window)}")
        levels = [
            f"{n} {unit}"
            for n, unit in (
                (self.hourly, "hourly"),
                (self.daily, "daily"),
                (self.weekly, "weekly"),
                (self.monthly, "monthly"),
            )
            if n
        ]
        if levels:
            parts.append("levels " + ", ".join(levels))
        if self.orphans_after is not None:
            parts.append(f"orphans after {_fmt_delta(self.orphans_after)}")
        if self.safety_after is not None:
            parts.append(f"safety snapshots after {_fmt_delta(self.safety_after)}")
        return "; ".join(parts)


@frozen
class ExpiryFacts:
    """Everything the expiry planner looks at.

    ``volume_ids``: the cluster's volumes (the layout's); only snapshots of
    them can be orphans (empty: no snapshot is judged an orphan).
    ``holds``: what the journals of plans whose run has not ended still
    need (:class:`~pgsnap.planner.reconcile.SnapshotHold`): never deleted.
    """

    backups: tuple[BackupRecord, ...]
    snapshots: tuple[Snapshot, ...]
    archive: ArchiveIndex
    timelines: TimelineGraph
    now: dt.datetime
    capabilities: frozenset[Capability] = frozenset()
    archive_location: str = ""
    volume_ids: frozenset[str] = frozenset()
    holds: tuple[SnapshotHold, ...] = ()
    unreadable: tuple[str, ...] = ()
    """Ids of catalog entries that cannot be read (no orphan is deleted while one is)."""
    safety: tuple[SafetySnapshot, ...] = ()
    """The safety snapshots recoveries recorded in the catalog."""

    def orphans(self) -> tuple[Orphan, ...]:
        """The orphan snapshot groups (:func:`~pgsnap.planner.reconcile.find_orphans`)."""
        return find_orphans(
            self.backups,
            self.snapshots,
            volume_ids=self.volume_ids,
            holds=self.holds,
            unreadable=self.unreadable,
            safety=self.safety,
        )


MIN_ORPHANS_AFTER: Final = dt.timedelta(hours=1)
"""The shortest ``orphans_after``: a backup in flight records its snapshots only when
backup mode ends, seconds after they are taken; an hour leaves room for any."""


def _fmt_delta(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _when(b: BackupRecord) -> dt.datetime:
    """When a backup is consistent (its stop), or its start if it has no stop."""
    return b.stop_time or b.start_time


def _secure_until(b: BackupRecord, snapshots: Mapping[str, Snapshot]) -> tuple[bool, str]:
    """Whether a secure snapshot of ``b`` still holds, and until when (text)."""
    holds, until = False, ""
    for snap_id in b.snapshots.values():
        snap = snapshots.get(snap_id)
        if snap is None or not snap.secure:
            continue
        text = snap.extra.get("secure_until")
        if text is None:
            return True, "no expiry known"
        holds, until = True, text
    return holds, until


_T = TypeVar("_T")


def keep_by_rules(
    items: Sequence[_T],
    when: Callable[[_T], dt.datetime],
    *,
    now: dt.datetime,
    redundancy: int | None = None,
    window: dt.timedelta | None = None,
    levels: Iterable[tuple[int, str]] = (),
    noun: str = "backup",
) -> tuple[list[tuple[_T, str]], list[str]]:
    """The grandfather-father-son selection both retentions share (pure).

    ``items`` are the restore points that count, **newest first**; ``when``
    gives each one's time. Returns ``(item, why)`` for every reason an item is
    kept (an item may come several times) and the warnings: ``redundancy``
    keeps the newest N; ``window`` the newest item at or before ``now -
    window`` (the anchor) and every newer one (all, with a warning, while no
    item is that old); ``levels`` are ``(count, unit)`` with unit ``hour``,
    ``day``, ``week`` (ISO), ``month`` or ``year`` (UTC): the newest item of
    each of the last ``count`` such periods that have one. ``noun`` names the
    items in the warnings. Used by :func:`kept_backups` (snapshots) and
    :mod:`pgsnap.planner.copy_expiry` (copies).
    """
    held: list[tuple[_T, str]] = []
    warnings: list[str] = []
    if redundancy is not None:
        held += [(b, f"within redundancy {redundancy}") for b in items[:redundancy]]
    if window is not None:
        start = now - window
        anchor = next((b for b in items if when(b) <= start), None)
        if anchor is None:
            held += [(b, f"the window {_fmt_delta(window)} is not yet covered") for b in items]
            if items:
                warnings.append(
                    f"no {noun} is older than the window's start ({start.isoformat()}): "
                    f"every {noun} is kept until one is"
                )
        else:
            held.append((anchor, f"anchor of the window {_fmt_delta(window)}"))
            # As new as the anchor counts too: two copies of the anchor backup.
            held += [
                (b, f"within the window {_fmt_delta(window)}")
                for b in items
                if b is not anchor and when(b) >= when(anchor)
            ]
        if len(items) >= 2:
            gaps = [when(a) - when(b) for a, b in itertools.pairwise(items)]
            if max(gaps) > window:
                warnings.append(
                    f"the window {_fmt_delta(window)} is shorter than the time between "
                    f"some {noun}s ({_fmt_delta(max(gaps))}): it keeps more than it says"
                )
    for count, unit in levels:
        if not count:
            continue
        key = PERIODS[unit]
        periods: list[tuple[int, ...]] = []
        for b in items:  # newest first: the first of a period is its newest
            period = key(when(b))
            if period in periods:
                continue
            if len(periods) == count:
                break
            periods.append(period)
            held.append((b, f"newest of its {unit} ({count} {unit}s kept)"))
    return held, warnings


def kept_backups(
    facts: ExpiryFacts, policy: RetentionPolicy
) -> tuple[dict[str, list[str]], list[str]]:
    """Why each kept backup is kept (id → reasons), and the policy's warnings."""
    now = facts.now
    present = {s.id for s in facts.snapshots}
    # Only backups that can still be restored count: one whose snapshots vanished
    # holds no place in a redundancy or a window (plan_expiry marks it unusable).
    done = sorted(
        (
            b
            for b in facts.backups
            if b.state is BackupState.DONE and all(s in present for s in b.snapshots.values())
        ),
        key=lambda b: (_when(b), b.id),
        reverse=True,
    )
    keep: dict[str, list[str]] = {}
    warnings: list[str] = []

    def hold(b: BackupRecord, why: str) -> None:
        keep.setdefault(b.id, []).append(why)

    held, notes = keep_by_rules(
        done,
        _when,
        now=now,
        redundancy=policy.redundancy,
        window=policy.window,
        levels=(
            (policy.hourly, "hour"),
            (policy.daily, "day"),
            (policy.weekly, "week"),
            (policy.monthly, "month"),
        ),
    )
    for b, why in held:
        hold(b, why)
    warnings += notes
    snapshots = {s.id: s for s in facts.snapshots}
    for b in facts.backups:
        if b.pin is not None and b.pin.holds(now):
            until = "forever" if b.pin.until is None else f"until {b.pin.until.isoformat()}"
            hold(b, f"pinned {until}: {b.pin.reason}")
        secure, until = _secure_until(b, snapshots)
        if secure:
            hold(b, f"secure snapshot ({until})")
        if b.state in (BackupState.STARTED, BackupState.WAITING_FOR_WAL):
            hold(b, f"not finished ({b.state.value})")
        for h in facts.holds:
            if (b.snapshot_group_id is not None and b.snapshot_group_id in h.group_ids) or (
                set(b.snapshots.values()) & h.snapshot_ids
            ):
                hold(b, f"the {h.plan} has not ended and needs its snapshots")
                break
    return keep, warnings


def _hour(t: dt.datetime) -> tuple[int, ...]:
    u = t.astimezone(dt.UTC)
    return (u.year, u.month, u.day, u.hour)


def _day(t: dt.datetime) -> tuple[int, ...]:
    u = t.astimezone(dt.UTC)
    return (u.year, u.month, u.day)


def _week(t: dt.datetime) -> tuple[int, ...]:
    iso = t.astimezone(dt.UTC).isocalendar()
    return (iso.year, iso.week)


def _month(t: dt.datetime) -> tuple[int, ...]:
    u = t.astimezone(dt.UTC)
    return (u.year, u.month)


def _year(t: dt.datetime) -> tuple[int, ...]:
    return (t.astimezone(dt.UTC).year,)


PERIODS: Final[Mapping[str, Callable[[dt.datetime], tuple[int, ...]]]] = {
    "hour": _hour,
    "day": _day,
    "week": _week,
    "month": _month,
    "year": _year,
}
"""The grandfather-father-son periods (UTC; weeks are ISO weeks): unit → the key
that names the period a time falls in."""


def _wal_floor(facts: ExpiryFacts, kept: list[BackupRecord]) -> tuple[dict[int, int], list[str]]:
    """Per timeline, the first segment a kept backup's recovery can need there."""
    seg = facts.archive.segment_size
    graph = facts.timelines
    timelines = sorted({1, *graph.timelines(), *facts.archive.timelines()})
    floor: dict[int, int] = {}
    notes: list[str] = []
    for b in kept:
        start_seg = b.start_lsn.value // seg
        # Whatever the histories say, the WAL from the backup's start on its own
        # timeline stays (a backup the histories do not place keeps it too).
        floor[b.start_timeline] = min(floor.get(b.start_timeline, start_seg), start_seg)
        for tli in timelines:
            try:
                if not graph.contains(b.start_timeline, b.start_lsn, tli):
                    continue
                path = graph.path(tli, from_timeline=b.start_timeline)
            except PgsnapError as exc:  # a history that does not add up: keep its WAL
                notes.append(f"timeline {tli}: {exc}; its WAL is kept")
                floor[tli] = 0
                continue
            for i, span in enumerate(path):
                begin = span.start.value // seg if span.start is not None else 0
                first = start_seg if i == 0 else begin
                floor[span.timeline] = min(floor.get(span.timeline, first), first)
    return floor, notes


def plan_expiry(facts: ExpiryFacts, policy: RetentionPolicy) -> Plan:
    """The plan that applies ``policy``: delete what it does not keep, say why.

    Steps, in order: for each backup that goes (oldest first), its snapshot
    group (when the storage still has it) then its record; then the WAL no
    kept backup needs, one step per timeline and run of segments.
    """
    keep, warnings = kept_backups(facts, policy)
    present = {s.id for s in facts.snapshots}
    newest_done = max(
        (_when(b) for b in facts.backups if b.state is BackupState.DONE), default=None
    )
    steps: list[Step] = []
    gone: list[BackupRecord] = []
    snapshots_lost: list[str] = []
    for b in sorted(facts.backups, key=lambda r: (_when(r), r.id)):
        vanished = sorted(f"{v}: {s}" for v, s in b.snapshots.items() if s not in present)
        if b.state is BackupState.DONE and vanished and b.copies:
            # The array lost them (or an expiry deleted them): the copies off the
            # array still restore the backup, so its record stays, DONE.
            keep.setdefault(b.id, []).append(
                f"its snapshots are gone, its copies ({_copy_ids(b)}) restore it: its "
                "record (and the WAL from its start) stay while it has a copy "
                "(pgsnap expire-copies decides how long)"
            )
            continue
        if b.state is BackupState.DONE and vanished:
            keep.setdefault(b.id, []).append("marked unusable now; removed by a later expiry")
            why = f"its snapshots vanished from the storage ({'; '.join(vanished)})"
            warnings.append(f"backup {b.id} cannot be restored: {why}")
            steps.append(
                Step.of(
                    f"mark-unusable-{b.id}",
                    MarkUnusable(backup_id=b.id, reason=why),
                    description=f"record backup {b.id} FAILED: it cannot be restored",
                    reason=why + "; it is never offered for a recovery, and the next "
                    "expiry removes it once a newer backup is DONE",
                )
            )
    for b in sorted(facts.backups, key=lambda r: (_when(r), r.id)):
        if b.id in keep:
            continue
        if b.state is BackupState.FAILED and (newest_done is None or newest_done <= _when(b)):
            keep.setdefault(b.id, []).append("failed, and no newer DONE backup yet")
            continue
        why = (
            "failed; a newer backup is DONE"
            if b.state is BackupState.FAILED
            else _why_not_kept(b, policy)
        )
        if b.copies:
            # Never orphan a copy: the snapshots go, the record (and what the copies
            # need to be restored: the WAL from its start) stays.
            snap_steps = _delete_snapshot_steps(b, present, why)
            steps += snap_steps
            keep.setdefault(b.id, []).append(
                ("its snapshots go now (" + why + "); " if snap_steps else "")
                + f"its record stays for its copies ({_copy_ids(b)}): "
                "pgsnap expire-copies decides how long"
            )
            if snap_steps:
                snapshots_lost.append(
                    f"snapshots of backup {b.id} ({b.label}, {_when(b).isoformat()}); "
                    "its copies remain"
                )
            continue
        gone.append(b)
        steps += _delete_backup_steps(b, present, why)
    orphans = facts.orphans()
    orphan_steps, orphan_kept, orphan_lost, orphan_notes = _orphan_steps(orphans, policy, facts.now)
    steps += orphan_steps
    warnings += orphan_notes
    safety_steps, safety_kept, safety_lost = _safety_steps(facts, policy, present)
    steps += safety_steps
    kept_done = [b for b in facts.backups if b.id in keep and b.state is BackupState.DONE]
    unfinished = [b for b in facts.backups if b.id in keep and b.state is not BackupState.DONE]
    wal_steps, wal_lost = _wal_steps(facts, kept_done + unfinished, gone)
    steps += wal_steps
    seg = facts.archive.segment_size
    parts = {
        "backups": sorted((b.id, b.state.value, str(_when(b))) for b in facts.backups),
        # A copy recorded or removed since changes whether a record may go.
        "copies": sorted((b.id, c.copy_id) for b in facts.backups for c in b.copies),
        "snapshots": sorted(present),
        # Where each run of segments starts, not where it ends: the archiver keeps
        # appending while the plan waits, and new WAL changes nothing it deletes.
        "ranges": [(r.timeline, r.first) for r in facts.archive.segment_ranges],
        # Not the archive's .backup files: another tool's backup adds one at any
        # time, and the plan deletes only those it names.
        "segment_size": seg,
        "policy": policy.describe(),
        "orphans": sorted(sid for o in orphans for sid in o.snapshot_ids),
        "holds": sorted(h.key() for h in facts.holds),
        "unreadable": sorted(facts.unreadable),
        "safety": sorted((r.name, r.group_id) for r in facts.safety),
    }
    return Plan(
        kind="expiry",
        steps=tuple(steps),
        fingerprint=fingerprint(parts),
        summary={
            "policy": policy.describe(),
            "now": facts.now.isoformat(),
            "backups kept": str(len(keep)),
            "backups deleted": str(len(gone)),
            "orphan snapshot groups": f"{len(orphans)} ({len(orphan_lost)} deleted)",
        },
        request=policy.to_request(),
        kept=tuple(f"backup {bid}: {'; '.join(why)}" for bid, why in sorted(keep.items()))
        + tuple(orphan_kept)
        + tuple(safety_kept),
        lost=tuple(f"backup {b.id} ({b.label}, {_when(b).isoformat()})" for b in gone)
        + tuple(snapshots_lost)
        + tuple(orphan_lost)
        + tuple(safety_lost)
        + tuple(wal_lost),
        warnings=tuple(warnings),
    )


def _copy_ids(b: BackupRecord) -> str:
    return ", ".join(f"{c.copy_id} in {c.target}" for c in b.copies)


def _delete_backup_steps(b: BackupRecord, present: set[str], why: str) -> list[Step]:
    """The steps that delete backup ``b``: the leftovers a failed run recorded, its
    snapshot group (while the storage has it), then its record (snapshots first: a
    run cut short leaves a record the recovery planner passes over, never
    snapshots no record names). A backup with copies keeps its record: the
    callers plan only :func:`_delete_snapshot_steps` for it."""
    if b.copies:
        raise PlanningError(  # never reached through the planners: they check first
            f"backup {b.id} has copies ({_copy_ids(b)}): its record is not deleted",
            hint="remove its copies first (pgsnap expire-copies)",
            backup_id=b.id,
        )
    steps = _delete_snapshot_steps(b, present, why)
    steps.append(
        Step.of(
            f"delete-record-{b.id}",
            DeleteBackupRecord(backup_id=b.id),
            description=f"delete backup {b.id} ({b.label}) from the catalog",
            reason=why,
        )
    )
    return steps


def _delete_snapshot_steps(b: BackupRecord, present: set[str], why: str) -> list[Step]:
    """The steps that delete backup ``b``'s snapshots: the leftovers a failed run
    recorded, then its snapshot group (while the storage has it)."""
    steps: list[Step] = []
    leftovers = tuple(s for s in b.orphaned_snapshots if s in present)
    if leftovers:
        steps.append(
            Step.of(
                f"delete-leftovers-{b.id}",
                DeleteSnapshots(snapshot_ids=leftovers),
                description=f"delete {len(leftovers)} snapshot(s) failed backup {b.id} "
                f"left behind ({', '.join(leftovers)})",
                reason=why,
            )
        )
    if b.snapshot_group_id and any(s in present for s in b.snapshots.values()):
        steps.append(
            Step.of(
                f"delete-snapshots-{b.id}",
                DeleteSnapshotGroup(group_id=b.snapshot_group_id),
                description=f"delete snapshot group {b.snapshot_group_id} of backup {b.id}",
                reason=why,
            )
        )
    return steps


def safety_delete_steps(record: SafetySnapshot, present: set[str], why: str) -> list[Step]:
    """The steps that delete a recorded safety snapshot: its group (while the storage
    has it), then its record."""
    steps: list[Step] = []
    if any(s in present for s in record.snapshots.values()):
        steps.append(
            Step.of(
                f"delete-safety-{record.name}",
                DeleteSnapshotGroup(group_id=record.group_id),
                description=f"delete safety snapshot group {record.name} ({record.group_id})",
                reason=why,
            )
        )
    steps.append(
        Step.of(
            f"delete-safety-record-{record.name}",
            DeleteSafetyRecord(safety_name=record.name),
            description=f"delete the record of safety snapshot {record.name} from the catalog",
            reason=why,
        )
    )
    return steps


def safety_hold(record: SafetySnapshot, holds: Iterable[SnapshotHold]) -> str | None:
    """Why ``record`` may not be deleted now (an unfinished run needs it), or None."""
    for h in holds:
        if (
            record.group_id in h.group_ids
            or record.name in h.group_names
            or not h.snapshot_ids.isdisjoint(record.snapshots.values())
        ):
            return f"the {h.plan} has not ended"
    return None


def _safety_steps(
    facts: ExpiryFacts, policy: RetentionPolicy, present: set[str]
) -> tuple[list[Step], list[str], list[str]]:
    """The steps that delete the safety snapshots ``policy`` lets go: (steps, kept, lost)."""
    steps: list[Step] = []
    kept: list[str] = []
    lost: list[str] = []
    limit = policy.safety_after
    for r in facts.safety:
        age = facts.now - r.created_at
        what = f"safety snapshot {r.name} (recovery to {r.target}, {fmt_age(age)} old)"
        held = safety_hold(r, facts.holds)
        if held is not None:
            kept.append(f"{what}: {held}")
            continue
        if limit is None or age < limit:
            kept.append(
                f"{what}: kept until deleted (pgsnap safety delete {r.name})"
                if limit is None
                else f"{what}: younger than safety_after ({_fmt_delta(limit)})"
            )
            continue
        why = f"older than safety_after ({_fmt_delta(limit)})"
        steps += safety_delete_steps(r, present, why)
        lost.append(what)
    return steps, kept, lost


def _orphan_steps(
    orphans: tuple[Orphan, ...], policy: RetentionPolicy, now: dt.datetime
) -> tuple[list[Step], list[str], list[str], list[str]]:
    """The steps that delete the orphans ``policy`` lets go, and the lines for the
    plan: (steps, kept, lost, warnings)."""
    steps: list[Step] = []
    kept: list[str] = []
    lost: list[str] = []
    notes: list[str] = []
    limit = policy.orphans_after
    for o in orphans:
        line = o.describe(now)
        notes.append(f"orphan: {line}")
        if o.held is not None:
            kept.append(f"orphan {o.group_name}: {o.held}")
            continue
        if o.secure_until is not None:
            kept.append(f"orphan {o.group_name}: secure snapshot ({o.secure_until})")
            continue
        if limit is None:
            kept.append(
                f"orphan {o.group_name}: no orphans_after in the policy (set one, e.g. "
                "--orphans-after 7d, to delete orphans)"
            )
            continue
        age = o.age(now)
        if age < limit:
            kept.append(
                f"orphan {o.group_name}: {fmt_age(age)} old, younger than orphans_after "
                f"{_fmt_delta(limit)} (a backup in flight records its snapshots late)"
            )
            continue
        why = (
            f"{'a recovery safety snapshot' if o.kind == 'safety' else 'an orphan snapshot group'}"
            f" no backup record names, {fmt_age(age)} old: older than orphans_after "
            f"{_fmt_delta(limit)} ({o.ours})"
        )
        op = (
            DeleteSnapshotGroup(group_id=o.group_id)
            if o.whole_group
            else DeleteSnapshots(snapshot_ids=o.snapshot_ids)
        )
        steps.append(
            Step.of(
                f"delete-orphan-{o.group_id}",
                op,
                description=f"delete orphan snapshot group {o.group_name} ({o.group_id}: "
                f"{', '.join(o.snapshot_ids)})",
                reason=why,
            )
        )
        lost.append(f"orphan {line}")
    return steps, kept, lost, notes


def _why_not_kept(b: BackupRecord, policy: RetentionPolicy) -> str:
    parts = []
    if policy.redundancy is not None:
        parts.append(f"beyond redundancy {policy.redundancy}")
    if policy.window is not None:
        parts.append(f"older than the anchor of the window {_fmt_delta(policy.window)}")
    if policy.hourly or policy.daily or policy.weekly or policy.monthly:
        parts.append("not the newest of a period the levels keep")
    return "; ".join(parts)


def _wal_steps(
    facts: ExpiryFacts, kept: list[BackupRecord], gone: list[BackupRecord]
) -> tuple[list[Step], list[str]]:
    seg = facts.archive.segment_size
    floor, _notes = _wal_floor(facts, kept)
    gone_starts = {_start_segment(b, seg) for b in gone}
    gone_backup_files = {n for n in facts.archive.backup_names if n[:24] in gone_starts}
    steps: list[Step] = []
    lost: list[str] = []
    for r in facts.archive.segment_ranges:
        limit = floor.get(r.timeline)
        last = r.last if limit is None else min(r.last, limit - 1)
        if last < r.first:
            continue
        extra = tuple(
            sorted(
                n
                for n in gone_backup_files
                if r.first <= _backup_file_segno(n, seg) <= last and int(n[:8], 16) == r.timeline
            )
        )
        why = (
            f"no kept backup's recovery reaches timeline {r.timeline}"
            if limit is None
            else f"before segment {segment_name(r.timeline, limit, seg)}, where the oldest "
            f"kept backup's recovery starts on timeline {r.timeline}"
        )
        first_name = segment_name(r.timeline, r.first, seg)
        last_name = segment_name(r.timeline, last, seg)
        steps.append(
            Step.of(
                f"delete-wal-{r.timeline}-{r.first}",
                DeleteWal(
                    timeline=r.timeline,
                    first=r.first,
                    last=last,
                    segment_size=seg,
                    extra_names=extra,
                ),
                description=f"delete WAL {first_name}..{last_name} "
                f"({last - r.first + 1} segments) from the archive",
                reason=why,
            )
        )
        lost.append(f"WAL {first_name}..{last_name}")
    return steps, lost


def _start_segment(b: BackupRecord, segment_size: int) -> str:
    return segment_name(b.start_timeline, b.start_lsn.value // segment_size, segment_size)


def _backup_file_segno(name: str, segment_size: int) -> int:
    per_id = 0x100000000 // segment_size
    return int(name[8:16], 16) * per_id + int(name[16:24], 16)


def plan_delete(facts: ExpiryFacts, backup_id: str) -> Plan:
    """The plan that deletes one backup (its snapshot group, then its record).

    Refused (:class:`~pgsnap.errors.PlanningError`) while the backup is pinned,
    has a secure snapshot whose retention holds, or is not finished. WAL is
    left to :func:`plan_expiry`, which knows what the other backups need.
    """
    found = [b for b in facts.backups if b.id == backup_id]
    if not found:
        raise BackupNotFound(
            f"no backup {backup_id!r} in the catalog",
            hint="list the backups with `pgsnap list`",
            backup_id=backup_id,
        )
    b = found[0]
    if b.pin is not None and b.pin.holds(facts.now):
        raise PlanningError(
            f"backup {b.id} is pinned ({b.pin.reason}): it is not deleted",
            hint=f"unpin it first (pgsnap unpin {b.id}) if it really should go",
            backup_id=b.id,
        )
    secure, until = _secure_until(b, {s.id: s for s in facts.snapshots})
    if secure:
        raise PlanningError(
            f"backup {b.id} has a secure snapshot ({until}): the storage refuses to delete it",
            hint="wait until its retention ends",
            backup_id=b.id,
        )
    if b.state in (BackupState.STARTED, BackupState.WAITING_FOR_WAL):
        raise PlanningError(
            f"backup {b.id} is not finished ({b.state.value}): it is not deleted",
            hint="let it finish or fail first (pgsnap resume cleans up interrupted ones)",
            backup_id=b.id,
        )
    present = {s.id for s in facts.snapshots}
    why = "asked for (pgsnap delete)"
    warnings: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    if b.copies:
        # Its copies stay restorable: the snapshots go, the record stays.
        steps = _delete_snapshot_steps(b, present, why)
        if not steps:
            raise PlanningError(
                f"backup {b.id}'s snapshots are gone already and its record stays for its "
                f"copies ({_copy_ids(b)}): nothing to delete",
                hint="its copies go with copy retention (pgsnap expire-copies, e.g. "
                "--max-age); its record goes with the last of them",
                backup_id=b.id,
            )
        lost = (f"snapshots of backup {b.id} ({b.label}, {_when(b).isoformat()})",)
        kept = (f"backup {b.id}: its record stays for its copies ({_copy_ids(b)})",)
        warnings = (
            f"backup {b.id} has copies off the array ({_copy_ids(b)}): only its snapshots "
            "are deleted; its record stays so that a recovery can restore it from a copy "
            "(copy retention removes the copies: pgsnap expire-copies)",
        )
    else:
        steps = _delete_backup_steps(b, present, why)
        lost = (f"backup {b.id} ({b.label}, {_when(b).isoformat()})",)
    return Plan(
        kind="delete",
        steps=tuple(steps),
        fingerprint=fingerprint(
            {
                "backup": (b.id, b.state.value),
                "snapshots": sorted(present & set(b.snapshots.values())),
                "copies": sorted(c.copy_id for c in b.copies),
            }
        ),
        summary={"backup": b.id, "label": b.label},
        request={"backup_id": b.id},
        kept=kept,
        lost=lost,
        warnings=warnings,
    )


def _shown_pin(pin: Pin | None) -> str:
    if pin is None:
        return "no pin"
    until = "forever" if pin.until is None else f"until {pin.until.isoformat()}"
    return f"pinned {until} ({pin.reason})"


def plan_pin(record: BackupRecord, pin: Pin | None) -> Plan:
    """The plan that pins ``record`` (retention keeps it, ``pin``'s way) or, with
    ``pin`` None, unpins it: one catalog step, undone by setting the pin it found.
    Its fingerprint is the record's pin now, so a plan made before someone else
    changed the pin is stale."""
    step = Step.of(
        "set-pin",
        SetPin(backup_id=record.id, pin=pin),
        description=f"backup {record.id}: {_shown_pin(record.pin)} -> {_shown_pin(pin)}",
        reason="asked for (pgsnap pin)" if pin is not None else "asked for (pgsnap unpin)",
        undo=SetPin(backup_id=record.id, pin=record.pin),
    )
    return Plan(
        kind="pin" if pin is not None else "unpin",
        steps=(step,),
        fingerprint=fingerprint({"backup": record.id, "pin": encode_value(record.pin)}),
        summary={"backup": record.id, "label": record.label},
        request={"backup_id": record.id, "pin": encode_value(pin)},
    )


def plan_delete_safety(facts: ExpiryFacts, name: str) -> Plan:
    """The plan that deletes one recorded safety snapshot (its group, then its record).

    Refused (:class:`~pgsnap.errors.PlanningError`) when the catalog has no safety
    snapshot of that name, or while the run that took it has not ended.
    """
    found = [r for r in facts.safety if r.name == name]
    if not found:
        known = ", ".join(r.name for r in facts.safety[-5:]) or "none"
        raise PlanningError(
            f"no safety snapshot {name!r} in the catalog (recorded: {known})",
            hint="list them with `pgsnap safety list`",
            name=name,
        )
    record = found[0]
    held = safety_hold(record, facts.holds)
    if held is not None:
        raise PlanningError(
            f"safety snapshot {name} is still needed: {held}",
            hint="finish that run first (pgsnap resume --yes); its undo may need the snapshot",
            name=name,
        )
    present = {s.id for s in facts.snapshots}
    steps = safety_delete_steps(record, present, "asked for (pgsnap safety delete)")
    age = facts.now - record.created_at
    return Plan(
        kind="delete-safety",
        steps=tuple(steps),
        fingerprint=fingerprint(
            {
                "safety": (record.name, record.group_id),
                "snapshots": sorted(present & set(record.snapshots.values())),
                "holds": sorted(h.key() for h in facts.holds),
            }
        ),
        summary={
            "safety snapshot": record.name,
            "taken by": f"recovery plan {record.plan_id[:12]} (backup {record.backup_id}, "
            f"target {record.target})",
            "age": fmt_age(age),
        },
        request={"safety_name": record.name},
        lost=(
            f"safety snapshot {record.name}: the state of "
            f"{', '.join(sorted(record.snapshots))} before that recovery",
        ),
    )
