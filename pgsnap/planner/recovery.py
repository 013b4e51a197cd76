"""The recovery planner (pure): which backup, which volumes, which WAL, which timeline.

``plan_recovery(facts, request)`` returns an ordered, explained
:class:`~pgsnap.plan.Plan`, or refuses with a
:class:`~pgsnap.errors.PlanningError` subclass that says why and what can be
reached instead. Nothing here reads a clock, a file or the network: the same
facts and request always give the same plan.

Rules (see docs/concepts.md):

- the backup is the newest DONE backup whose start and stop lie on the
  history of the target timeline, whose snapshots still exist, and whose
  consistency point (stop LSN / stop time) is strictly before the target;
- the WAL from the backup's start to the target is checked along the
  timeline path; a gap before the target refuses the plan and names the
  missing segments;
- only lost volumes are restored: when the WAL volume survived it is kept,
  so WAL that never reached the archive is replayed too.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from collections.abc import Iterable, Iterator

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import (
    ConfigurationError,
    NoBackupForTarget,
    PlanningError,
    TargetOutOfRange,
    TimelineError,
    WalGapError,
)
from pgsnap.model import (
    LSN,
    BackupRecord,
    CopyRecord,
    LocationKind,
    RecoveryAction,
    RecoveryTarget,
    ServerRole,
    TargetKind,
    Volume,
    VolumeRole,
    to_dict,
)
from pgsnap.operations import Ref
from pgsnap.operations.catalog import RecordSafetySnapshot, VerifyWal
from pgsnap.operations.copies import RestoreFromCopy, RestoreWalFromCopy
from pgsnap.operations.db import (
    ClearRecoverySettings,
    PrepareDataDirectory,
    StartServer,
    StopServer,
    VerifyRecovery,
    WaitRecovery,
    WriteBackupLabel,
    WriteRecoverySettings,
)
from pgsnap.operations.host import MountVolume, UnmountVolume, WaitForDevice
from pgsnap.operations.storage import (
    AttachVolume,
    DetachVolume,
    PausePolicies,
    RestoreVolume,
    ResumePolicies,
    TakeSnapshotGroup,
    WaitForRestore,
)
from pgsnap.plan import Plan, Step
from pgsnap.planner.copy import copy_tree_name
from pgsnap.planner.facts import RecoveryFacts, fingerprint
from pgsnap.protocols import Capability
from pgsnap.wal import (
    ArchiveIndex,
    WalCheck,
    check,
    parse_segment_name,
    segment_start,
    segments_to_replay,
    walfile_name,
)

__all__ = [
    "Candidate",
    "RecoveryRequest",
    "candidate_backups",
    "choose_backup",
    "choose_candidate",
    "iter_candidates",
    "plan_recovery",
]


def _roles(value: Iterable[VolumeRole | str]) -> frozenset[VolumeRole]:
    return frozenset(VolumeRole(v) for v in value)


@frozen
class RecoveryRequest:
    """What to recover, and how.

    - ``target``: where replay stops (default: the end of the WAL).
    - ``timeline``: ``"latest"``, ``"current"`` (the backup's timeline) or a number.
    - ``action``: what the server does at the target (promote, pause, shutdown).
    - ``lost``: the roles whose volumes are lost. ``{DATA}`` (the default) keeps
      the WAL volume and its unarchived WAL; ``{DATA, WAL}`` restores both.
      Tablespace volumes always go with the data.
    - ``backup_id``: use this backup instead of choosing one.
    - ``safety_snapshot``: snapshot the volumes about to be overwritten first,
      so their current (broken) state is never lost.
    - ``from_copy`` / ``copy_id``: restore the data and tablespaces from a copy
      off the array (:mod:`pgsnap.copies`) rather than from snapshots.
    """

    target: RecoveryTarget = attrs.field(factory=RecoveryTarget.latest)
    timeline: str = "latest"
    action: RecoveryAction = RecoveryAction.PROMOTE
    lost: frozenset[VolumeRole] = attrs.field(
        default=frozenset({VolumeRole.DATA}), converter=_roles
    )
    backup_id: str | None = None
    safety_snapshot: bool = True
    from_copy: bool = False
    """Restore from a copy off the array even when the backup's snapshots are there
    (without it, a copy is used only for a backup whose snapshots are gone)."""
    copy_id: str | None = None
    """Restore from this copy (and so from its backup)."""
    recovery_timeout: float = 600.0
    restore_timeout: float = 3600.0
    """Seconds to wait for a restore the storage completes in the background."""
    device_timeout: float = 120.0
    """Seconds to wait for a re-attached volume's device to appear on the host."""
    server_timeout: float = 120.0
    """Seconds to wait for the server to stop (a shutdown waits for the archiver, so a
    slow archive_command needs more) and to start."""

    def __attrs_post_init__(self) -> None:
        t = self.timeline
        if t not in ("latest", "current") and not (t.isdigit() and int(t) >= 1):
            raise ConfigurationError(
                f"invalid recovery timeline {t!r}",
                hint="use 'latest', 'current' or a timeline number",
            )
        if VolumeRole.ARCHIVE in self.lost:
            raise ConfigurationError(
                "the archive is not restored from snapshots",
                hint="recover the archive first; pgsnap reads WAL from it",
            )


# --------------------------------------------------------------------------- helpers


def _fmt_time(t: dt.datetime | None) -> str:
    return (
        "unknown time" if t is None else t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    )


def _target_timeline(facts: RecoveryFacts, request: RecoveryRequest, backup: BackupRecord) -> int:
    if request.timeline == "latest":
        return max(facts.timelines.latest(), backup.stop_timeline or backup.start_timeline)
    if request.timeline == "current":
        return backup.start_timeline
    return int(request.timeline)


def _resolve_target_lsn(facts: RecoveryFacts, target: RecoveryTarget) -> LSN | None:
    """The LSN where replay stops, when the facts can tell (None: not known)."""
    ev = facts.events
    if target.kind is TargetKind.LSN:
        assert isinstance(target.value, LSN)
        return target.value
    if ev is None:
        return None
    if target.kind is TargetKind.NAME:
        assert isinstance(target.value, str)
        return ev.restore_point(target.value)
    if target.kind is TargetKind.XID:
        assert isinstance(target.value, int)
        return ev.commit_of(target.value)
    if target.kind is TargetKind.TIME:
        assert isinstance(target.value, dt.datetime)
        return ev.first_commit_after(target.value)
    return None


def _consistent_before(
    backup: BackupRecord, target: RecoveryTarget, target_lsn: LSN | None
) -> bool:
    assert backup.stop_lsn is not None
    if target.kind in (TargetKind.LATEST, TargetKind.IMMEDIATE):
        return True
    if target.kind is TargetKind.TIME:
        assert isinstance(target.value, dt.datetime) and backup.stop_time is not None
        return backup.stop_time < target.value
    if target_lsn is not None:
        return backup.stop_lsn < target_lsn
    # An xid or a name we could not locate: we cannot prove it is after the
    # backup; the newest backup is chosen and the plan warns.
    return True


def _snapshots_present(
    present: frozenset[str], backup: BackupRecord, volumes: Iterable[Volume]
) -> list[str]:
    missing = []
    for v in volumes:
        snap = backup.snapshots.get(v.id)
        if snap is None or snap not in present:
            missing.append(f"{v.id}: {snap or 'no snapshot recorded'}")
    return missing


def _snapshots_invalid(
    invalid: frozenset[str], backup: BackupRecord, volumes: Iterable[Volume]
) -> list[str]:
    return [f"{v.id}: {s}" for v in volumes if (s := backup.snapshots.get(v.id)) in invalid]


def _volumes_to_restore(facts: RecoveryFacts, request: RecoveryRequest) -> tuple[Volume, ...]:
    layout = facts.layout
    chosen = [layout.data, *layout.by_role(VolumeRole.TABLESPACE)]
    if VolumeRole.WAL in request.lost and layout.wal is not None:
        chosen.append(layout.wal)
    return tuple(chosen)


def _merged_index(facts: RecoveryFacts, keep_wal: bool) -> ArchiveIndex:
    if keep_wal and facts.archive_with_local_wal is not None:
        return facts.archive_with_local_wal
    return facts.archive


def _usable_copy(
    facts: RecoveryFacts, request: RecoveryRequest, backup: BackupRecord
) -> CopyRecord | None:
    """The newest copy of ``backup`` (or the requested one) whose manifest the observer
    found in its target."""
    found = [
        c
        for c in backup.copies
        if (c.target, c.copy_id) in facts.copies
        and (request.copy_id is None or c.copy_id == request.copy_id)
    ]
    return max(found, key=lambda c: c.created_at, default=None)


def _no_copy(facts: RecoveryFacts, request: RecoveryRequest, backup: BackupRecord) -> str:
    wanted = [c for c in backup.copies if request.copy_id in (None, c.copy_id)]
    if not wanted:
        return "no copy off the array"
    names = ", ".join(f"{c.copy_id} ({c.target})" for c in wanted)
    return f"copies {names} not found in their targets"


@frozen
class Candidate:
    """A backup that can serve a request, with the timeline it recovers to."""

    backup: BackupRecord
    timeline: int
    copy: CopyRecord | None = None
    """The copy to restore from; None: the backup's snapshots."""


def candidate_backups(
    facts: RecoveryFacts, request: RecoveryRequest
) -> tuple[tuple[Candidate, ...], list[str]]:
    """The backups that can serve ``request``, best first, and why others were passed over.

    Best first is newest first, by time (never by name or timeline). A backup
    qualifies when it is DONE, lies on the history of the target timeline, is
    consistent strictly before the target (when the facts can tell: an xid or
    restore point not located in the WAL cannot rule any backup out) and still
    has its snapshots. :func:`iter_candidates` gives the same lazily.
    """
    passed: list[str] = []
    return tuple(iter_candidates(facts, request, passed)), passed


def iter_candidates(
    facts: RecoveryFacts, request: RecoveryRequest, passed: list[str]
) -> Iterator[Candidate]:
    """:func:`candidate_backups` one at a time, best first; each backup passed over on
    the way is explained in ``passed`` as it is met.

    A plan needs the first candidate (and observation the first few): over ten
    thousand backups, judging only the newest ones keeps planning from growing
    with the catalog. Errors in the request (an unknown backup id, a target
    timeline the archive does not have) are raised at the first ``next()``.
    """
    volumes = _volumes_to_restore(facts, request)
    target = request.target
    target_lsn = _resolve_target_lsn(facts, target)
    done = list(facts.usable_newest_first())
    if request.backup_id is not None:
        done = [b for b in done if b.id == request.backup_id]
        if not done:
            states = {b.id: b.state.value for b in facts.backups}
            why = (
                f"it is {states[request.backup_id]}"
                if request.backup_id in states
                else "it is not in the catalog"
            )
            raise NoBackupForTarget(
                f"backup {request.backup_id!r} cannot be used: {why}",
                hint="list the backups with `pgsnap list` and pick a DONE one",
                backup_id=request.backup_id,
            )
    if request.copy_id is not None:
        done = [b for b in done if any(c.copy_id == request.copy_id for c in b.copies)]
        if not done:
            raise NoBackupForTarget(
                f"no DONE backup{'' if request.backup_id is None else ' ' + request.backup_id}"
                f" has a copy {request.copy_id!r}",
                hint="list the backups and their copies with `pgsnap list --json`",
                copy_id=request.copy_id,
            )
    want_copy = request.from_copy or request.copy_id is not None
    present = frozenset(s.id for s in facts.snapshots)
    # A snapshot the storage reports invalid (an overflowed classic LVM snapshot)
    # restores nothing: the backup is passed over like one whose snapshot is gone.
    invalid = frozenset(s.id for s in facts.snapshots if s.extra.get("state") == "invalid")
    for b in done:
        tli = _target_timeline(facts, request, b)
        assert b.stop_lsn is not None
        if tli != 1 and tli not in facts.timelines.timelines():
            raise TimelineError(
                f"recovery target timeline {tli} does not exist in the archive "
                f"(known: {', '.join(map(str, sorted(facts.timelines.timelines())))})",
                hint="use timeline 'latest', 'current' or one of the known timelines",
                timeline=tli,
            )
        # The backup's WAL ends just before its stop LSN: a timeline that forks exactly
        # there (a recovery to that backup's consistency point) still holds all of it,
        # as PostgreSQL's own check allows (the switchpoint not before minRecoveryPoint).
        last_byte = LSN(max(b.stop_lsn.value - 1, b.start_lsn.value))
        if not (
            facts.timelines.contains(b.start_timeline, b.start_lsn, tli)
            and facts.timelines.contains(b.stop_timeline or b.start_timeline, last_byte, tli)
        ):
            passed.append(
                f"{b.id}: timeline {b.start_timeline} at {b.stop_lsn} is not on the "
                f"history of timeline {tli} (it forked off earlier)"
            )
            continue
        if not _consistent_before(b, target, target_lsn):
            passed.append(
                f"{b.id}: consistent only at {b.stop_lsn} / {_fmt_time(b.stop_time)}, "
                "not before the target"
            )
            continue
        copy = _usable_copy(facts, request, b)
        if want_copy:
            if copy is None:
                passed.append(f"{b.id}: {_no_copy(facts, request, b)}")
                continue
            yield Candidate(b, tli, copy)
            continue
        missing = _snapshots_present(present, b, volumes)
        if missing and not any(v.id in b.snapshots for v in volumes):
            # Another server's backup in a shared catalog (its standby's, say): snapshots
            # restore only the volumes they were taken of; a copy off the array restores
            # any volume of the same role.
            if copy is not None:
                yield Candidate(b, tli, copy)
                continue
            where = f"a {b.taken_on.value}" + (f" ({b.taken_host})" if b.taken_host else "")
            passed.append(
                f"{b.id}: taken on {where} whose volumes are not this layout's "
                f"({', '.join(sorted(b.snapshots))}): its snapshots restore those volumes "
                "only; recover there, clone it, or copy it off the array (a copy restores "
                "here)"
            )
            continue
        if missing:
            if copy is not None:
                yield Candidate(b, tli, copy)  # the array lost it: the copy off it has it
                continue
            passed.append(
                f"{b.id}: snapshots gone from storage ({'; '.join(missing)})"
                + (f"; {_no_copy(facts, request, b)}" if b.copies else "")
            )
            continue
        broken = _snapshots_invalid(invalid, b, volumes) if invalid else []
        if broken:
            if copy is not None:
                yield Candidate(b, tli, copy)
                continue
            passed.append(
                f"{b.id}: snapshots invalid, their copy-on-write store overflowed "
                f"({'; '.join(broken)})"
            )
            continue
        yield Candidate(b, tli)


def choose_backup(
    facts: RecoveryFacts, request: RecoveryRequest
) -> tuple[BackupRecord, int, list[str]]:
    """The backup to restore, the target timeline, and why others were passed over.

    Raises :class:`~pgsnap.errors.NoBackupForTarget` when none qualifies,
    naming the earliest and latest points that can be reached.
    :func:`choose_candidate` also says whether it is restored from a copy.
    """
    first, passed = choose_candidate(facts, request)
    return first.backup, first.timeline, passed


def choose_candidate(facts: RecoveryFacts, request: RecoveryRequest) -> tuple[Candidate, list[str]]:
    """The :class:`Candidate` to restore (backup, timeline, copy or snapshots) and why
    the backups newer than it were passed over; as :func:`choose_backup`."""
    target = request.target
    passed: list[str] = []
    first = next(iter_candidates(facts, request, passed), None)
    if first is not None:  # the backups newer than it, and why each was passed over
        return first, passed
    usable = [b for b in facts.backups if b.is_usable and b.stop_lsn is not None]
    detail = "\n".join(f"  - {p}" for p in passed)
    passed_text = f"\nbackups passed over:\n{detail}" if detail else ""
    if request.from_copy or request.copy_id is not None:
        raise NoBackupForTarget(
            f"no copy off the array can reach target {target}" + passed_text,
            hint="copy a backup first (pgsnap copy BACKUP), check that the copy target is "
            "reachable ([copies] in the configuration), or recover from snapshots",
            earliest=None,
            passed_over=tuple(passed),
        )
    if not usable:
        raise NoBackupForTarget(
            f"no backup can reach target {target}: the catalog has no DONE backup" + passed_text,
            hint="take a backup first (pgsnap backup)",
            earliest=None,
            passed_over=tuple(passed),
        )
    oldest = min(usable, key=lambda b: b.stop_time or b.start_time)
    newest = max(usable, key=lambda b: b.stop_time or b.start_time)
    earliest = f"{oldest.stop_lsn} / {_fmt_time(oldest.stop_time)} (backup {oldest.id})"
    raise NoBackupForTarget(
        f"no backup can reach target {target}: the earliest reachable point is {earliest}; "
        f"the newest backup {newest.id} is consistent at {newest.stop_lsn} / "
        f"{_fmt_time(newest.stop_time)}" + passed_text,
        hint="choose a target after a backup's consistency point, or take a backup first",
        earliest=earliest,
        passed_over=tuple(passed),
    )


def _check_wal(
    facts: RecoveryFacts,
    request: RecoveryRequest,
    backup: BackupRecord,
    tli: int,
    target_lsn: LSN | None,
    index: ArchiveIndex,
) -> WalCheck:
    """Check the WAL the plan needs; refuse with the exact reason when it is not there."""
    target = request.target
    assert backup.stop_lsn is not None
    start = (backup.start_timeline, backup.start_lsn)
    if target.kind is TargetKind.IMMEDIATE:
        end: LSN | None = backup.stop_lsn
    elif target_lsn is not None:
        # The record at the target must be readable (and no LSN lies past the last one).
        end = target_lsn + 1 if target_lsn.value < _LAST_LSN else target_lsn
    else:
        end = None
    result = check(index, start, end, tli, facts.timelines)
    full = check(index, start, None, tli, facts.timelines) if end is not None else result
    reach = full.reachable_lsn
    if not result.complete:
        missing_text = ", ".join(result.missing[:10]) + (
            f" and {result.missing_count - 10} more" if result.missing_count > 10 else ""
        )
        if not result.missing:
            result.raise_for_gap()  # only the target timeline's .history file is missing
        # The end of the archive, or a hole? The check up to the end of the archive
        # (end=None) reports only segments missing before the last one present along
        # the whole timeline path: when it finds none, the WAL simply ends here.
        if end is not None and full.missing_count == 0 and result.reachable_lsn >= backup.stop_lsn:
            raise TargetOutOfRange(
                f"target {target} is past the end of the archived WAL on timeline {tli}: "
                f"recoverable up to {result.reachable_lsn}"
                + _time_suffix(facts, result.reachable_lsn),
                hint="choose an earlier target, or wait for the archiver to catch up",
                reachable_lsn=result.reachable_lsn,
                missing=result.missing,
            )
        raise WalGapError(
            f"WAL needed to reach {target} is missing from the archive: {missing_text}; "
            f"recoverable up to {result.reachable_lsn}" + _time_suffix(facts, result.reachable_lsn),
            hint="restore the missing segments into the archive, or choose a target before "
            f"{result.reachable_lsn}",
            missing=result.missing,
            reachable_lsn=result.reachable_lsn,
        )
    if reach < backup.stop_lsn:
        raise WalGapError(
            f"the WAL of backup {backup.id} itself is incomplete: recoverable only to {reach}, "
            f"before its consistency point {backup.stop_lsn} (missing: "
            f"{', '.join(full.missing[:5])})",
            hint="choose another backup or restore the missing segments",
            missing=full.missing,
            reachable_lsn=reach,
        )
    return full


def _check_damaged(
    facts: RecoveryFacts, backup: BackupRecord, wal: WalCheck, index: ArchiveIndex
) -> None:
    """Refuse a recovery while a damaged segment lies on its path in the archive.

    PostgreSQL stops on a truncated copy (``archive file has wrong size``, FATAL)
    after the point of no return, and takes another cluster's WAL for the end of
    the WAL. It also reads ahead of its target (the next record, and recovery
    prefetching, which crosses the nearly empty segments ``archive_timeout``
    leaves in a few records): a damaged segment anywhere after the backup's start
    can stop a recovery to an earlier target, so every target is refused until
    the file is replaced or moved away (PostgreSQL then sees the WAL end there).
    """
    if not facts.damaged:
        return
    for name in segments_to_replay(index, wal):
        why = facts.damaged.get(name)
        if why is None:
            continue
        seg = index.segment_size
        at = max(backup.start_lsn, segment_start(parse_segment_name(name, seg)[1], seg))
        raise WalGapError(
            f"archived segment {name} cannot be replayed: {why}; PostgreSQL would stop on "
            f"it in the middle of the recovery, after the point of no return (it reads "
            f"ahead of any target); the WAL before it reaches {at}" + _time_suffix(facts, at),
            hint="put a good copy of the segment in the archive (a surviving pg_wal may "
            "still hold it); or, if it never was a complete segment, move the file out of "
            f"the archive: targets before {at} can then be reached",
            missing=(name,),
            damaged={name: why},
            reachable_lsn=at,
        )


def _time_suffix(facts: RecoveryFacts, lsn: LSN) -> str:
    if facts.events is None:
        return ""
    last = facts.events.known_last_commit(before=lsn)
    if last is None:
        return ""
    return f" (last commit before it at {_fmt_time(last[1])})"


def _holes(
    facts: RecoveryFacts, request: RecoveryRequest
) -> tuple[tuple[str, ...], tuple[BackupRecord, LSN] | None]:
    """Segments missing inside the WAL any candidate backup reaches (in order, once),
    and the first candidate stopped by one with where its WAL stops."""
    keep_wal = VolumeRole.WAL not in request.lost and facts.layout.wal is not None
    index = _merged_index(facts, keep_wal)
    found: list[str] = []
    stopped: tuple[BackupRecord, LSN] | None = None
    candidates, _passed = candidate_backups(facts, request)
    for cand in candidates:
        b = cand.backup
        result = check(index, (b.start_timeline, b.start_lsn), None, cand.timeline, facts.timelines)
        found += [m for m in result.missing if m not in found]
        if result.missing and stopped is None:
            stopped = (b, result.reachable_lsn)
    return tuple(found), stopped


def _other_timelines_hint(facts: RecoveryFacts, timeline: int) -> str:
    others = sorted(t for t in {1, *facts.timelines.timelines()} if t != timeline)
    if not others:
        return ""
    return (
        f"; or the target is on another timeline ({', '.join(map(str, others))}): choose it "
        "with timeline=N (pgsnap: --timeline N)"
    )


def _forked_timeline_warnings(
    facts: RecoveryFacts, request: RecoveryRequest, wal: WalCheck
) -> list[str]:
    """Warn when a target time lies after the plan's timeline forked from its parent while
    the parent went on: the same time then names two different states."""
    target = request.target
    ev = facts.events
    assert isinstance(target.value, dt.datetime)
    if ev is None:
        return []
    out: list[str] = []
    spans = wal.path
    for parent, child in itertools.pairwise(spans):
        switch = parent.end
        if switch is None:
            continue
        before = ev.last_commit(before=switch)
        if before is None or target.value <= before[1]:
            continue  # the target is before the fork: both timelines agree there
        parent_end = max((r.last for r in facts.archive.ranges(parent.timeline)), default=None)
        seg = facts.archive.segment_size
        if parent_end is None or (parent_end + 1) * seg <= switch.value:
            continue  # the parent has no WAL after the fork: nothing else to recover
        out.append(
            f"target time {_fmt_time(target.value)} is after timeline {child.timeline} forked "
            f"from timeline {parent.timeline} at {switch} (last commit before the fork at "
            f"{_fmt_time(before[1])}), and timeline {parent.timeline} has WAL after that fork: "
            f"this plan recovers timeline {child.timeline}'s state at that time; for timeline "
            f"{parent.timeline}'s, plan with timeline={parent.timeline} "
            f"(pgsnap: --timeline {parent.timeline})"
        )
    return out


def _check_target_reachable(
    facts: RecoveryFacts, request: RecoveryRequest, backup: BackupRecord, wal: WalCheck
) -> list[str]:
    """Refuse targets the WAL cannot reach; return warnings for what cannot be proven."""
    target = request.target
    warnings: list[str] = []
    ev = facts.events
    reach = wal.reachable_lsn
    if target.kind is TargetKind.TIME:
        assert isinstance(target.value, dt.datetime)
        if target.value > facts.now:
            raise TargetOutOfRange(
                f"target time {_fmt_time(target.value)} is in the future "
                f"(now {_fmt_time(facts.now)})",
                hint="choose a time in the past; for the newest state use the 'latest' target",
            )
        assert backup.stop_lsn is not None
        after = None if ev is None else ev.first_commit_after(target.value)
        if (
            ev is not None
            and after is not None
            and after < reach
            and not ev.uncovered(backup.start_lsn, after)
        ):
            # Read from the backup on up to a commit after the time: replay stops
            # there, whatever the WAL holds after it.
            warnings += _forked_timeline_warnings(facts, request, wal)
        elif ev is not None and not ev.uncovered(backup.start_lsn, reach):
            last = ev.last_commit(before=reach)
            beyond = last is None or (
                target.value >= last[1] if target.inclusive else target.value > last[1]
            )
            if beyond:
                when = _fmt_time(last[1]) if last else "no commit at all"
                raise TargetOutOfRange(
                    f"target time {_fmt_time(target.value)} is after the last commit in the "
                    f"WAL reachable on timeline {wal.reachable_timeline} ({when}, up to "
                    f"{reach}); PostgreSQL would end recovery before reaching it",
                    hint="choose an earlier time, or 'latest' to replay everything"
                    + _other_timelines_hint(facts, wal.reachable_timeline),
                    reachable_lsn=reach,
                )
            warnings += _forked_timeline_warnings(facts, request, wal)
        elif ev is None:
            warnings.append(
                "commit times in the WAL were not read (the log says why): the "
                "target time is not checked against the last commit"
            )
        else:
            warnings.append(
                f"commit times were read only up to {ev.scanned_to} (the WAL reaches "
                f"{reach}): the target time is not checked against the last commit"
            )
    elif target.kind in (TargetKind.NAME, TargetKind.XID):
        found = _resolve_target_lsn(facts, target)
        what = "restore point" if target.kind is TargetKind.NAME else "commit of transaction"
        if found is None:
            if ev is not None and ev.complete:
                holes, stopped = _holes(facts, request)
                scanned = ", ".join(f"{lo} to {hi}" for lo, hi in ev.spans) or "nothing"
                if holes:
                    gap_at = reach if stopped is None else stopped[1]
                    where = (
                        f"recoverable up to {reach}"
                        if stopped is None
                        else f"recoverable from backup {stopped[0].id} up to {gap_at}, and "
                        f"from backup {backup.id} from {backup.stop_lsn} to {reach}"
                    )
                    raise WalGapError(
                        f"{what} {target.value!r} is not in the WAL that can be read "
                        f"(scanned {scanned}), and segments are missing from the archive "
                        f"where it may lie: {', '.join(holes[:10])}"
                        + (f" and {len(holes) - 10} more" if len(holes) > 10 else "")
                        + f"; {where}"
                        + _time_suffix(facts, gap_at),
                        hint="restore the missing segments into the archive, or choose a "
                        f"time or LSN target before {gap_at}",
                        missing=holes,
                        reachable_lsn=gap_at,
                    )
                raise TargetOutOfRange(
                    f"{what} {target.value!r} is not in the reachable WAL (scanned {scanned})",
                    hint="check the name/xid, or choose a time or LSN target"
                    + _other_timelines_hint(facts, wal.reachable_timeline),
                )
            warnings.append(
                f"{what} {target.value!r} could not be located in the WAL: the plan "
                "cannot prove it lies after the backup and before the end of the WAL"
            )
        elif found > reach:
            raise TargetOutOfRange(
                f"{what} {target.value!r} is at {found}, after the end of the reachable "
                f"WAL {reach}",
                hint="restore the missing WAL or choose an earlier target",
            )
    elif target.kind is TargetKind.LSN:
        assert isinstance(target.value, LSN) and backup.stop_lsn is not None
        if ev is not None and ev.end_of_wal is not None and target.value >= reach:
            raise TargetOutOfRange(
                f"target {target} is past the end of the valid WAL on timeline "
                f"{wal.reachable_timeline}: recoverable up to {reach}" + _time_suffix(facts, reach),
                hint="choose an earlier target, or 'latest' to replay everything",
                reachable_lsn=reach,
            )
    return warnings


_LAST_LSN = 0xFFFFFFFFFFFFFFFF

SAFETY_STEP = "safety-snapshot"
"""The id of the step that snapshots the volumes about to be restored."""


def _expected_state(action: RecoveryAction) -> str:
    return {
        RecoveryAction.PROMOTE: "promoted and accepting writes",
        RecoveryAction.PAUSE: "paused in recovery at the target",
        RecoveryAction.SHUTDOWN: "shut down at the target",
    }[action]


def _restore_reason(request: RecoveryRequest, vol: Volume, backup: BackupRecord) -> str:
    """Why a volume is restored: it is lost (a complete recovery), or replay must start
    from the backup to stop at an earlier point (a point-in-time recovery)."""
    role = vol.role.value
    if request.target.kind is TargetKind.LATEST:
        return (
            f"the {role} volume is lost; backup {backup.id}'s snapshot brings back its state "
            "at the backup, and replay brings it forward to the end of the WAL"
        )
    what = "the data" if vol.role is VolumeRole.DATA else f"the {role} volume"
    return (
        f"replay must start from backup {backup.id} to stop at {request.target}: "
        f"{what} goes back to its state at the backup"
    )


def _restore_steps(
    facts: RecoveryFacts,
    request: RecoveryRequest,
    backup: BackupRecord,
    vol: Volume,
    safety: bool,
) -> list[Step]:
    """Unmount, detach, restore, wait, attach, wait for the device, mount: what the
    volume's restore profile asks for, each with what undoes it."""
    vf = facts.volume(vol.id)
    profile = vf.profile
    device = vf.location.path
    mounted = vf.mount
    fstype = mounted.fstype if mounted is not None and mounted.fstype else None
    options = mounted.options if mounted is not None else ()
    where = f"{vol.id} ({vol.role.value}, {vol.mount_point})"
    steps: list[Step] = []
    if profile.unmounts and mounted is not None:
        steps.append(
            Step.of(
                f"unmount-{vol.step_key}",
                UnmountVolume(mount_point=vol.mount_point, volume_id=vol.id),
                description=f"unmount {vol.mount_point} ({mounted.source})",
                reason=f"the storage restores volume {vol.id} only once its file system is "
                "unmounted; a busy file system names the processes holding it",
                undo=MountVolume(
                    device=mounted.source,
                    mount_point=vol.mount_point,
                    fstype=fstype,
                    options=options,
                    volume_id=vol.id,
                ),
            )
        )
    if profile.detaches:
        steps.append(
            Step.of(
                f"detach-{vol.step_key}",
                DetachVolume(volume_id=vol.id, host=facts.host),
                description=f"detach volume {vol.id} from host {facts.host}",
                reason="the storage refuses to overwrite a volume a host still sees",
                undo=AttachVolume(volume_id=vol.id, host=facts.host),
            )
        )
    snap = backup.snapshots[vol.id]
    undo_restore = (
        RestoreVolume(volume_id=vol.id, snapshot_id=Ref(SAFETY_STEP, "snapshots", vol.id))
        if safety
        else None
    )
    steps.append(
        Step.of(
            f"restore-{vol.step_key}",
            RestoreVolume(volume_id=vol.id, snapshot_id=snap, backup_id=backup.id),
            description=f"restore volume {where} from snapshot {snap}",
            reason=_restore_reason(request, vol, backup)
            + (" (the restore consumes that snapshot)" if profile.consumes_snapshot else ""),
            undo=undo_restore,
        )
    )
    if profile.completes_later:
        steps.append(
            Step.of(
                f"wait-restore-{vol.step_key}",
                WaitForRestore(volume_id=vol.id, timeout=request.restore_timeout),
                description=f"wait until the storage has restored volume {vol.id}",
                reason="the storage completes this restore in the background",
            )
        )
    if profile.detaches:
        steps.append(
            Step.of(
                f"attach-{vol.step_key}",
                AttachVolume(volume_id=vol.id, host=facts.host),
                description=f"attach volume {vol.id} to host {facts.host} again",
                reason="the host needs the restored volume back",
                undo=DetachVolume(volume_id=vol.id, host=facts.host),
            )
        )
    if profile.unmounts:
        if vf.location.kind is LocationKind.BLOCK_DEVICE:
            steps.append(
                Step.of(
                    f"wait-device-{vol.step_key}",
                    WaitForDevice(device=device, timeout=request.device_timeout),
                    description=f"wait for device {device} to appear on the host",
                    reason="an attached volume's device node appears only after the host "
                    "has rescanned its storage",
                )
            )
        steps.append(
            Step.of(
                f"mount-{vol.step_key}",
                MountVolume(
                    device=device,
                    mount_point=vol.mount_point,
                    fstype=fstype,
                    options=options,
                    volume_id=vol.id,
                ),
                description=f"mount {device} on {vol.mount_point}",
                reason="PostgreSQL finds its files where they were",
                undo=UnmountVolume(mount_point=vol.mount_point, volume_id=vol.id),
            )
        )
    return steps


def _copy_restore_step(
    facts: RecoveryFacts,
    request: RecoveryRequest,
    backup: BackupRecord,
    copy: CopyRecord,
    vol: Volume,
    safety: bool,
) -> Step:
    """Write the volume's tree of ``copy`` where the layout mounts it; undone by the
    safety snapshot."""
    vf = facts.volume(vol.id)
    if vf.location.kind is LocationKind.BLOCK_DEVICE and vf.mount is None:
        raise PlanningError(
            f"volume {vol.id} ({vol.role.value}) is not mounted at {vol.mount_point}: a "
            f"restore from copy {copy.copy_id} writes into its file system",
            hint=f"make a file system on the (new) volume and mount it at {vol.mount_point}, "
            "then plan again",
            volume_id=vol.id,
        )
    undo = (
        RestoreVolume(volume_id=vol.id, snapshot_id=Ref(SAFETY_STEP, "snapshots", vol.id))
        if safety
        else None
    )
    where = f"{vol.id} ({vol.role.value}, {vol.mount_point})"
    return Step.of(
        f"restore-{vol.step_key}",
        RestoreFromCopy(
            volume_id=vol.id,
            backup_id=backup.id,
            copy_id=copy.copy_id,
            target_dir=copy.target,
            tree=copy_tree_name(vol),
            directory=vol.mount_point,
            manifest_digest=copy.manifest_digest,
            target_options=facts.copy_options if copy.target.startswith("s3://") else {},
            key_file=_key_file(facts, copy),
        ),
        description=f"restore volume {where} from copy {copy.copy_id} in {copy.target}",
        reason=_restore_reason(request, vol, backup)
        + "; the copy off the array has it"
        + ("" if safety else " (what the volume holds now is removed first)"),
        undo=undo,
    )


def _key_file(facts: RecoveryFacts, copy: CopyRecord) -> str:
    """The key file the steps restoring ``copy`` read it with: the configured one for
    an encrypted copy, "" for a plain one (its plan does not name a key)."""
    return facts.copy_key_file if copy.key_fingerprint else ""


def _fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


# --------------------------------------------------------------------------- the plan


@frozen
class Resolved:
    """What the recovery planner decided for a request, before any step: the
    ``backup`` (and the ``copy`` restored instead of its snapshots, if any), the
    timeline ``tli`` and its ``timeline_setting``, the WAL it replays
    (``wal``), and the ``warnings``. Clones and drills build on it."""

    backup: BackupRecord
    tli: int
    copy: CopyRecord | None
    wal: WalCheck
    warnings: tuple[str, ...]
    timeline_setting: str
    copy_wal: tuple[str, ...]


def resolve_recovery(facts: RecoveryFacts, request: RecoveryRequest) -> Resolved:
    """Choose the backup and check the WAL reaches the target (PlanningError if not)."""
    keep_wal = VolumeRole.WAL not in request.lost and facts.layout.wal is not None
    target = request.target
    chosen, passed = choose_candidate(facts, request)
    backup, tli, copy = chosen.backup, chosen.timeline, chosen.copy
    if copy is not None and copy.key_fingerprint and not facts.copy_key_file:
        raise PlanningError(
            f"copy {copy.copy_id} of backup {backup.id} is encrypted with key "
            f"{copy.key_fingerprint}: give [copies] key_file",
            hint=f"set [copies] key_file to the key file of fingerprint {copy.key_fingerprint} "
            "(the key the copy was made with); without it the copy cannot be read",
            backup_id=backup.id,
            copy_id=copy.copy_id,
        )
    seg = backup.wal_segment_size
    index = _merged_index(facts, keep_wal)
    copy_wal = tuple(n for n in copy.wal if not n.endswith(".history")) if copy else ()
    if copy_wal:
        # The copy carries the backup's own WAL, written into pg_wal: the archive need
        # not have it (PostgreSQL reads pg_wal when restore_command finds nothing).
        index = index.merged(ArchiveIndex.build(list(copy_wal), seg))
    target_lsn = _resolve_target_lsn(facts, target)
    wal = _check_wal(facts, request, backup, tli, target_lsn, index)
    ev = facts.events
    if ev is not None and ev.end_of_wal is not None and ev.end_of_wal < wal.reachable_lsn:
        # The segments go further (a surviving pg_wal keeps recycled, zero-filled or
        # half-written space after the last record), but replay ends at the last
        # valid record.
        assert backup.stop_lsn is not None
        wal = attrs.evolve(wal, reachable_lsn=max(ev.end_of_wal, backup.stop_lsn))
    _check_damaged(facts, backup, wal, index)
    warnings = _check_target_reachable(facts, request, backup, wal)
    warnings += [f"passed over backup {p}" for p in passed]
    timeline_setting = str(tli) if request.timeline != "latest" else "latest"
    if target.kind is TargetKind.IMMEDIATE and request.timeline == "latest":
        timeline_setting = str(backup.start_timeline)  # as pgBackRest: immediate stays put
    return Resolved(backup, tli, copy, wal, tuple(warnings), timeline_setting, copy_wal)


def plan_recovery(facts: RecoveryFacts, request: RecoveryRequest) -> Plan:
    """The recovery plan for ``request``, or a PlanningError saying why not."""
    keep_wal = VolumeRole.WAL not in request.lost and facts.layout.wal is not None
    target = request.target
    resolved = resolve_recovery(facts, request)
    backup, tli, copy, wal = resolved.backup, resolved.tli, resolved.copy, resolved.wal
    warnings = list(resolved.warnings)
    copy_wal = resolved.copy_wal
    timeline_setting = resolved.timeline_setting
    seg = backup.wal_segment_size
    assert backup.stop_lsn is not None and backup.labelfile is not None

    if backup.taken_on is ServerRole.STANDBY:
        warnings.append(
            f"backup {backup.id} was taken on a standby"
            + (f" ({backup.taken_host})" if backup.taken_host else "")
            + ": the recovered server leaves recovery as a primary of its own, on a new "
            "timeline it archives beside its former primary's; if that primary still "
            "runs, keep only one of them (its next backup is refused while the archive "
            "holds a newer timeline). To rebuild a standby instead, use `pgsnap standby "
            "create` on the primary"
        )
    restore = _volumes_to_restore(facts, request)
    restore_ids = {v.id for v in restore}
    observed = {v.volume_id for v in facts.volume_facts}
    absent = [f"{v.id} ({v.role.value})" for v in restore if v.id not in observed]
    if absent:
        raise PlanningError(
            f"volume(s) {', '.join(absent)} of the layout are not on the storage backend: "
            "nothing to restore them into",
            hint="fix the layout's volume ids (pgsnap check lists what the storage has)",
            volumes=tuple(absent),
        )
    policies = [
        p for p in facts.policies if not p.paused and restore_ids.intersection(p.volume_ids)
    ]
    steps: list[Step] = []
    steps.append(
        Step.of(
            "verify-wal",
            VerifyWal(
                start_timeline=backup.start_timeline,
                start_lsn=backup.start_lsn,
                timeline=tli,
                segment_size=seg,
                system_identifier=backup.system_identifier,
                major=backup.server_version // 10000,
            ),
            description="verify the archived WAL segments the recovery may fetch, from the "
            "backup's start to the end of the archive (size, header, system identifier, "
            "address)",
            reason="PostgreSQL checks a segment only when it fetches it, after the point of "
            "no return; a truncated or foreign one found now stops the plan with nothing "
            "changed",
        )
    )
    if policies and Capability.POLICIES in facts.capabilities:
        ids = tuple(sorted(p.id for p in policies))
        steps.append(
            Step.of(
                "pause-policies",
                PausePolicies(policy_ids=ids),
                description=f"pause snapshot policies {', '.join(ids)}",
                reason="so the schedule does not rotate good snapshots out while the "
                "database is down",
                undo=ResumePolicies(policy_ids=ids),
            )
        )
    steps.append(
        Step.of(
            "stop-server",
            StopServer(timeout=request.server_timeout),
            description="stop the PostgreSQL server",
            reason="volumes cannot be restored under a running server (no-op if it is down)",
        )
    )
    safety = request.safety_snapshot
    # Short (21 characters): storage with short names (PowerFlex: 31 for a snapshot,
    # the volume's name included) keeps it whole, so an interrupted run finds the
    # group again by this name. "s-" and the time to the millisecond, as backup ids.
    now = facts.now.astimezone(dt.UTC)
    safety_name = f"s-{now:%Y%m%dT%H%M%S}{now.microsecond // 1000:03d}Z"
    if safety:
        steps.append(
            Step.of(
                SAFETY_STEP,
                TakeSnapshotGroup(volume_ids=tuple(sorted(restore_ids)), group_name=safety_name),
                description=f"snapshot the current state of {', '.join(sorted(restore_ids))} "
                f"first (group {safety_name})",
                reason="nothing is lost: the state being replaced stays available until "
                "you delete it",
            )
        )
        steps.append(
            Step.of(
                "record-safety-snapshot",
                RecordSafetySnapshot(
                    group_name=safety_name,
                    backup_id=backup.id,
                    recovery_target=str(target),
                    taken=Ref(SAFETY_STEP),
                ),
                description=f"record the safety snapshot group {safety_name} in the catalog",
                reason="so it is listed (pgsnap safety list), kept until you delete it "
                "(pgsnap safety delete), and never taken for an orphan",
            )
        )
    lost_backup: list[str] = []
    for v in restore:
        if copy is not None:
            if v.role is not VolumeRole.WAL:  # a lost WAL volume is emptied: prepare-datadir
                steps.append(_copy_restore_step(facts, request, backup, copy, v, safety))
            continue
        steps += _restore_steps(facts, request, backup, v, safety)
        if facts.volume(v.id).profile.consumes_snapshot:
            lost_backup.append(v.id)
    clear_wal = not keep_wal
    steps.append(
        Step.of(
            "prepare-datadir",
            PrepareDataDirectory(clear_wal=clear_wal),
            description="clean the restored data directory (postmaster.pid, postmaster.opts, "
            "pg_replslot, temporary state" + (", stale pg_wal" if clear_wal else "") + ")",
            reason="files from the running server at snapshot time confuse pg_ctl and recovery"
            + (
                "; WAL restored from the snapshot is obsolete, the archive has it"
                if clear_wal
                else "; pg_wal is on the surviving WAL volume and is kept"
            ),
        )
    )
    if copy is not None and copy.wal:
        steps.append(
            Step.of(
                "restore-copy-wal",
                RestoreWalFromCopy(
                    backup_id=backup.id,
                    copy_id=copy.copy_id,
                    target_dir=copy.target,
                    directory=facts.layout.data.mount_point,
                    manifest_digest=copy.manifest_digest,
                    names=copy.wal,
                    data_tree=copy_tree_name(facts.layout.data),
                    target_options=facts.copy_options if copy.target.startswith("s3://") else {},
                    key_file=_key_file(facts, copy),
                ),
                description=f"write the {len(copy_wal)} WAL segments copy {copy.copy_id} "
                "carries (the backup's start to its stop) into pg_wal, keeping any there",
                reason="with them the backup reaches consistency even without the WAL "
                "archive; the archive is still read first and for everything after",
            )
        )
    steps.append(
        Step.of(
            "write-label",
            WriteBackupLabel(
                backup_id=backup.id,
                label_sha256=hashlib.sha256(backup.labelfile.encode()).hexdigest(),
            ),
            description=f"write backup_label{' and tablespace_map' if backup.spcmapfile else ''} "
            f"of backup {backup.id} from the catalog",
            reason="without the label, replay would start at the wrong checkpoint and corrupt the "
            "cluster; it is written byte for byte as PostgreSQL returned it",
        )
    )
    write_settings = WriteRecoverySettings(
        recovery_target=target, timeline=timeline_setting, action=request.action
    )
    shown = ", ".join(write_settings.settings("").lines()[1:])
    steps.append(
        Step.of(
            "write-recovery-settings",
            write_settings,
            description=f"write recovery settings ({shown}, restore_command from the archive "
            f"{facts.archive_location or 'configured'}) and recovery.signal",
            reason="tells PostgreSQL where the WAL is, where to stop and what to do there; stale "
            "recovery_target lines from the snapshot are disabled",
            undo=ClearRecoverySettings(),
        )
    )
    steps.append(
        Step.of(
            "start-server",
            StartServer(timeout=request.server_timeout),
            description="start PostgreSQL: it replays WAL from the backup's start to the target",
            reason="this is the recovery itself; from here on PostgreSQL writes to the restored "
            "volumes (and a new timeline to the archive), so nothing before it can be undone",
        )
    )
    stops = _resolve_target_lsn(facts, target)
    if stops is not None and stops > wal.reachable_lsn:
        stops = None
    steps.append(
        Step.of(
            "wait-recovery",
            WaitRecovery(
                action=request.action,
                target_kind=target.kind,
                timeout=request.recovery_timeout,
                until_lsn=stops if stops is not None else wal.reachable_lsn,
                target_lsn=stops,
            ),
            description=f"wait for recovery to reach {target} and {request.action.value}",
            reason="the plan is done only when the server says where it stopped",
        )
    )
    min_tli = (
        max(facts.timelines.latest(), tli) + 1 if request.action is RecoveryAction.PROMOTE else None
    )
    steps.append(
        Step.of(
            "verify",
            VerifyRecovery(
                action=request.action, min_replay_lsn=backup.stop_lsn, min_timeline=min_tli
            ),
            description=f"verify: {_expected_state(request.action)}"
            + (f", on a new timeline (>= {min_tli})" if min_tli is not None else "")
            + f", replayed at least to the backup's consistency point {backup.stop_lsn}",
            reason="a recovery is trusted only once the server confirms it",
        )
    )
    if request.action is RecoveryAction.PROMOTE:
        steps.append(
            Step.of(
                "clear-recovery-settings",
                ClearRecoverySettings(),
                description="remove the recovery settings again",
                reason="a later restart must not recover to the same target again",
            )
        )
    if policies and Capability.POLICIES in facts.capabilities:
        ids = tuple(sorted(p.id for p in policies))
        steps.append(
            Step.of(
                "resume-policies",
                ResumePolicies(policy_ids=ids),
                description=f"resume snapshot policies {', '.join(ids)}",
                reason="the database is healthy again; scheduled snapshots resume",
            )
        )

    # ------------------------------------------------------------ explanation
    kept: list[str] = []
    lost: list[str] = []
    if keep_wal:
        assert facts.layout.wal is not None
        kept.append(
            f"WAL volume {facts.layout.wal.id} ({facts.layout.wal.mount_point}) is not "
            "restored: WAL written after the last archived segment is replayed too"
        )
    kept.append("the WAL archive: it is only read")
    if request.safety_snapshot:
        kept.append(
            f"the current state of the restored volumes, in the safety snapshot group "
            f"{safety_name} taken first (kept until you delete it: pgsnap safety delete "
            f"{safety_name})"
        )
    for vid in lost_backup:
        lost.append(
            f"backup {backup.id} itself: restoring volume {vid} consumes its snapshot "
            f"{backup.snapshots[vid]}, so this backup cannot be restored again"
        )
    if target.kind is not TargetKind.LATEST:
        lost.append(f"every transaction after the target ({target}) on the recovered cluster")
    elif not keep_wal:
        lost.append("WAL that was never archived (the WAL volume is restored from the snapshot)")
    if copy is not None:
        kept.append(
            f"backup {backup.id}'s snapshots"
            + (
                " (they are gone: the copy off the array is used)"
                if not request.from_copy and request.copy_id is None
                else " and copy " + copy.copy_id + ": both are only read"
            )
        )
    window_end = f"{wal.reachable_lsn} on timeline {tli}" + _time_suffix(facts, wal.reachable_lsn)
    summary = {
        "target": str(target),
        "backup": f"{backup.id} (label {backup.label!r}, timeline {backup.start_timeline})",
        "consistent from": f"{backup.stop_lsn} / {_fmt_time(backup.stop_time)}",
        "recoverable to": window_end,
        "target timeline": f"{tli} (recovery_target_timeline = {timeline_setting})",
        "timeline path": " -> ".join(
            f"{sp.timeline}" + (f" (until {sp.end})" if sp.end is not None else "")
            for sp in wal.path
        ),
        "WAL segments": f"{wal.segments_needed} needed from "
        f"{walfile_name(backup.start_lsn, backup.start_timeline, seg)}",
        "restore": ", ".join(f"{v.id} ({v.role.value})" for v in restore),
        "action at target": request.action.value,
    }
    if copy is not None:
        rate = copy.bytes_read / copy.seconds if copy.seconds > 0 else 0.0
        estimate = (
            f", about {max(1.0, copy.bytes_read / rate):.0f} s at the rate the copy was made"
            if rate > 0
            else ""
        )
        summary["from copy"] = (
            f"{copy.copy_id} in {copy.target} (made {_fmt_time(copy.created_at)}): "
            f"{_fmt_bytes(copy.bytes_read)} in {copy.files} files to read{estimate}"
            + (
                f"; it carries the backup's WAL ({len(copy_wal)} segments)"
                if copy_wal
                else "; it carries no WAL: the archive must have the backup's"
            )
            + (
                f"; encrypted with key {copy.key_fingerprint} ({facts.copy_key_file})"
                if copy.key_fingerprint
                else ""
            )
        )
    fp = recovery_fingerprint(facts, request, backup, wal, copy)
    return Plan(
        kind="recovery",
        steps=tuple(steps),
        fingerprint=fp,
        request=to_dict(request),
        summary=summary,
        kept=tuple(kept),
        lost=tuple(lost),
        warnings=tuple(warnings),
    )


def recovery_fingerprint(
    facts: RecoveryFacts,
    request: RecoveryRequest,
    backup: BackupRecord,
    wal: WalCheck,
    copy: CopyRecord | None = None,
) -> str:
    """Digest of the facts a recovery plan depends on.

    The backup record, its snapshots (or the copy restored from), the
    timelines and the WAL check's verdict; not the server's state (it is what
    is broken) and not WAL archived since (more WAL does not invalidate a plan).
    """
    wanted = set(backup.snapshots.values())
    return fingerprint(
        {
            "kind": "recovery",
            "request": to_dict(request.target),
            "layout": facts.layout,
            "backup": backup,
            "snapshots": sorted(s.id for s in facts.snapshots if s.id in wanted),
            "timelines": sorted(facts.timelines.timelines()),
            "volumes": [
                {
                    "id": v.id,
                    "location": facts.volume(v.id).location,
                    "profile": facts.volume(v.id).profile,
                    "mounted": facts.volume(v.id).mount is not None,
                }
                for v in _volumes_to_restore(facts, request)
            ],
            "wal_missing": list(wal.missing)
            if request.target.kind is not TargetKind.LATEST
            else [],
            "damaged": sorted(facts.damaged),
            "copy": None if copy is None else [copy.target, copy.copy_id, copy.manifest_digest],
        }
    )
