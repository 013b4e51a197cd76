"""Storage and catalog compared (pure): orphan snapshots, and records rebuilt.

**Orphans.** A snapshot pgsnap made that no catalog record names: a backup
run killed before its record got the snapshot ids, a failed backup's
leftovers that were never recorded, the safety snapshot a recovery takes
before it restores over a volume. :func:`find_orphans` finds them;
the expiry planner lists them (with their age, and their size when the
backend gives ``extra["size_bytes"]``) and deletes those older than the
policy's ``orphans_after``; ``pgsnap check`` reports them.

A snapshot counts as pgsnap's only when pgsnap can prove it made it, from
what every backend reports (:class:`~pgsnap.model.Snapshot`):

- it is a snapshot of one of *this cluster's* volumes (the layout's): a
  storage shared by several clusters holds other clusters' snapshots, which
  their own catalogs name;
- it was taken in a snapshot group (``group_id``): pgsnap never takes one
  alone; and not by a storage snapshot policy (``extra["policy_id"]``);
- its group's name (``Snapshot.name``; PowerFlex: ``extra["group_name"]``,
  the snapshot name without its volume part) is one pgsnap gives:
  the id of a backup in the catalog (pgsnap records a backup STARTED
  before it snapshots, under the group's name), a backup id of pgsnap's
  own form (``20261130T120000123Z``) or a recovery's safety snapshot name
  (``s-20261130T120000123Z``).

Anything else (a snapshot an administrator or another tool took) is never
listed and never touched. A snapshot an interrupted (or running) plan's
journal still needs (:class:`SnapshotHold`: a safety snapshot a recovery
compensates with, the group a backup run resumes with) is listed but kept
whatever its age; so is one of a backup that is not finished (its run may
still record it) and a secure snapshot until its retention ends.

**Catalog rebuild.** :func:`plan_rebuild` turns snapshot groups no record
names, and the archive's ``.backup`` history files, back into
:class:`~pgsnap.model.BackupRecord` s: the group's name is the backup id,
the ``.backup`` file (matched by the label ``pgsnap <id>``, else by the
snapshot's time between the backup's START TIME and STOP TIME) gives the
start and stop positions, times, timelines, the label and, line for line,
the ``backup_label`` PostgreSQL wrote (:func:`labelfile_from_history`).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pgsnap._attrs import frozen
from pgsnap.errors import PgsnapError
from pgsnap.model import (
    BackupRecord,
    BackupState,
    Layout,
    SafetySnapshot,
    Snapshot,
    VolumeRole,
)
from pgsnap.operations.catalog import PutRebuiltRecord
from pgsnap.plan import Plan, Step
from pgsnap.planner.facts import fingerprint
from pgsnap.wal import ArchiveIndex, BackupHistoryFile, TimelineGraph, check

__all__ = [
    "BACKUP_ID_RE",
    "SAFETY_NAME_RE",
    "Orphan",
    "RebuildFacts",
    "RebuildReport",
    "RebuildSource",
    "SnapshotHold",
    "find_orphans",
    "group_name_of",
    "hold_of_journal",
    "labelfile_from_history",
    "plan_rebuild",
    "rebuild_plan",
]

BACKUP_ID_RE: Final = re.compile(r"\d{8}T\d{9}Z")
"""The form of the backup ids pgsnap gives (the time to the millisecond, UTC)."""

SAFETY_NAME_RE: Final = re.compile(r"s-\d{8}T\d{9}Z")
"""The form of a recovery's safety snapshot group name."""

TIME_SLACK: Final = dt.timedelta(seconds=2)
"""How far a snapshot's time may lie outside a ``.backup`` file's START/STOP TIME
(whole seconds in the file; the storage's clock) and still be matched to it."""


def group_name_of(snapshot: Snapshot) -> str:
    """The name of the snapshot group ``snapshot`` was taken in, as pgsnap gave it.

    ``extra["group_name"]`` where the backend reports it apart from the
    snapshot's own name (PowerFlex), else ``Snapshot.name``.
    """
    return snapshot.extra.get("group_name") or snapshot.name


# --------------------------------------------------------------------------- holds


@frozen
class SnapshotHold:
    """Snapshots a plan whose run has not ended still needs: its journal names them.

    ``plan`` describes the plan (kind and id); ``snapshot_ids`` and
    ``group_ids`` are snapshots and groups its finished steps took or its
    steps restore from; ``group_names`` the names of the groups its
    snapshot steps take (a run killed before its journal heard of the group
    finds it again by that name).
    """

    plan: str
    snapshot_ids: frozenset[str] = frozenset()
    group_ids: frozenset[str] = frozenset()
    group_names: frozenset[str] = frozenset()

    def holds(self, snapshot: Snapshot) -> bool:
        """True when the plan needs ``snapshot``."""
        return (
            snapshot.id in self.snapshot_ids
            or (snapshot.group_id is not None and snapshot.group_id in self.group_ids)
            or group_name_of(snapshot) in self.group_names
        )

    def key(self) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """A sortable, JSON-friendly form (for fingerprints)."""
        return (
            self.plan,
            tuple(sorted(self.snapshot_ids)),
            tuple(sorted(self.group_ids)),
            tuple(sorted(self.group_names)),
        )


_SNAPSHOT_GROUP_OP: Final = "storage.snapshot_group"
_RESTORE_OP: Final = "storage.restore_volume"


def hold_of_journal(
    plan: Mapping[str, Any], outputs: Mapping[str, Mapping[str, Any] | None]
) -> SnapshotHold | None:
    """What the journal of a run that has not ended holds (None: nothing).

    ``plan`` is the journal's plan (as JSON data), ``outputs`` each journalled
    step's outputs. Held: the groups its snapshot steps take (by name, and by
    id and snapshot ids once taken) and the snapshots its restores read.
    Delete steps hold nothing: what they delete is going anyway.
    """
    names: set[str] = set()
    snaps: set[str] = set()
    groups: set[str] = set()
    steps = plan.get("steps")
    for step in steps if isinstance(steps, list) else ():
        if not isinstance(step, Mapping):
            continue
        action = step.get("action")
        params = step.get("params")
        params = params if isinstance(params, Mapping) else {}
        if action == _SNAPSHOT_GROUP_OP:
            name = params.get("group_name")
            if isinstance(name, str) and name:
                names.add(name)
            out = outputs.get(str(step.get("id")))
            if isinstance(out, Mapping):
                if isinstance(out.get("group_id"), str):
                    groups.add(out["group_id"])
                ids = out.get("snapshot_ids")
                if isinstance(ids, list):
                    snaps.update(s for s in ids if isinstance(s, str))
        for p in (params, step.get("compensation_params")):
            if action == _RESTORE_OP or step.get("compensation") == _RESTORE_OP:
                value = p.get("snapshot_id") if isinstance(p, Mapping) else None
                if isinstance(value, str):
                    snaps.add(value)
    if not (names or snaps or groups):
        return None
    kind = str(plan.get("kind", "plan"))
    plan_id = str(plan.get("id", ""))[:12]
    return SnapshotHold(
        plan=f"{kind} plan {plan_id}".strip(),
        snapshot_ids=frozenset(snaps),
        group_ids=frozenset(groups),
        group_names=frozenset(names),
    )


# --------------------------------------------------------------------------- orphans


@frozen
class Orphan:
    """A snapshot group (or the part of one) pgsnap made that no record names.

    ``group_id``/``group_name`` name the group, ``snapshot_ids`` the
    orphaned snapshots of it (``volume_ids`` their volumes), ``whole_group``
    whether they are all the storage still has of the group.
    ``created_at`` is the oldest snapshot's time, ``size_bytes`` their size
    when the backend gives ``extra["size_bytes"]`` (None: unknown).
    ``kind`` is ``safety`` (a recovery's safety snapshot) or ``backup``;
    ``ours`` says how pgsnap knows it made it. ``held`` is why it must stay
    whatever its age (None: nothing holds it but the policy's
    ``orphans_after``); ``secure_until`` the end of a secure snapshot's
    retention (``"no expiry known"`` when the storage does not say).
    """

    group_id: str
    group_name: str
    snapshot_ids: tuple[str, ...]
    volume_ids: tuple[str, ...]
    whole_group: bool
    created_at: dt.datetime
    size_bytes: int | None
    kind: str
    ours: str
    held: str | None = None
    secure_until: str | None = None

    def age(self, now: dt.datetime) -> dt.timedelta:
        """How old the orphan is at ``now`` (never negative)."""
        return max(now - self.created_at, dt.timedelta(0))

    def describe(self, now: dt.datetime) -> str:
        """One line: the group, its snapshots, age and size, and why it is pgsnap's."""
        size = "" if self.size_bytes is None else f", {_fmt_size(self.size_bytes)}"
        what = "safety snapshot group" if self.kind == "safety" else "snapshot group"
        return (
            f"{what} {self.group_name} ({self.group_id}: {', '.join(self.snapshot_ids)}), "
            f"age {fmt_age(self.age(now))}{size}; pgsnap's: {self.ours}"
        )


def fmt_age(delta: dt.timedelta) -> str:
    """A duration for people: ``3d 4h``, ``2h 5min``, ``40s``."""
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}min" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}min"
    return f"{secs}s"


def _fmt_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop always returns


def _ours(snapshot: Snapshot, record_ids: frozenset[str]) -> tuple[str, str] | None:
    """(kind, why pgsnap knows it made ``snapshot``), or None when it cannot prove it."""
    if snapshot.group_id is None or "policy_id" in snapshot.extra:
        return None
    name = group_name_of(snapshot)
    if SAFETY_NAME_RE.fullmatch(name):
        return "safety", "named as a recovery's safety snapshot"
    if name in record_ids:
        return "backup", f"taken for backup {name} of the catalog"
    if BACKUP_ID_RE.fullmatch(name):
        return "backup", "named as a pgsnap backup id"
    return None


def _size(snapshot: Snapshot) -> int | None:
    text = snapshot.extra.get("size_bytes")
    return int(text) if text is not None and text.isdigit() else None


def find_orphans(
    backups: Iterable[BackupRecord],
    snapshots: Sequence[Snapshot],
    *,
    volume_ids: Iterable[str],
    holds: Iterable[SnapshotHold] = (),
    unreadable: Iterable[str] = (),
    safety: Iterable[SafetySnapshot] = (),
) -> tuple[Orphan, ...]:
    """The snapshots pgsnap made of ``volume_ids`` that no record in ``backups``
    names (see the module docstring), one :class:`Orphan` per group, oldest first.

    A record names its ``snapshots`` and its recorded leftovers
    (``orphaned_snapshots``: expiry removes those with the failed backup); a
    recorded ``safety`` snapshot (:class:`~pgsnap.model.SafetySnapshot`)
    names its own.
    ``unreadable`` are the ids of catalog entries that cannot be read: while
    there is one, every orphan is held (it may be that record's).
    """
    records = tuple(backups)
    named: set[str] = set()
    for b in records:
        named.update(b.snapshots.values())
        named.update(b.orphaned_snapshots)
    for r in safety:
        named.update(r.snapshots.values())
    unfinished = {
        b.id: b.state
        for b in records
        if b.state in (BackupState.STARTED, BackupState.WAITING_FOR_WAL)
    }
    record_ids = frozenset(b.id for b in records)
    volumes = frozenset(volume_ids)
    hold_list = tuple(holds)
    broken = sorted(unreadable)
    by_group: dict[str, list[Snapshot]] = {}
    for s in snapshots:
        if s.group_id is not None:
            by_group.setdefault(s.group_id, []).append(s)
    found: list[Orphan] = []
    for gid, members in by_group.items():
        orphans = []
        kind_why: tuple[str, str] | None = None
        for s in members:
            if s.id in named or s.volume_id not in volumes:
                continue
            ours = _ours(s, record_ids)
            if ours is None:
                continue
            kind_why = ours
            orphans.append(s)
        if not orphans or kind_why is None:
            continue
        orphans.sort(key=lambda s: (s.volume_id, s.id))
        name = group_name_of(orphans[0])
        held = next(
            (f"the {h.plan} has not ended" for h in hold_list for s in orphans if h.holds(s)), None
        )
        if held is None and name in unfinished:
            held = f"backup {name} is not finished ({unfinished[name].value})"
        if held is None and broken:
            held = (
                f"the catalog has {len(broken)} unreadable entr{'y' if len(broken) == 1 else 'ies'}"
                f" ({', '.join(broken[:3])}): it may be theirs; fix or remove them first"
            )
        secure = [s for s in orphans if s.secure]
        secure_until = None
        if secure:
            untils = [s.extra.get("secure_until") for s in secure]
            secure_until = (
                "no expiry known" if any(u is None for u in untils) else max(u for u in untils if u)
            )
        sizes = [_size(s) for s in orphans]
        found.append(
            Orphan(
                group_id=gid,
                group_name=name,
                snapshot_ids=tuple(s.id for s in orphans),
                volume_ids=tuple(s.volume_id for s in orphans),
                whole_group=len(orphans) == len(members),
                created_at=min(s.created_at for s in orphans),
                size_bytes=None if any(x is None for x in sizes) else sum(x or 0 for x in sizes),
                kind=kind_why[0],
                ours=kind_why[1],
                held=held,
                secure_until=secure_until,
            )
        )
    found.sort(key=lambda o: (o.created_at, o.group_id))
    return tuple(found)


# --------------------------------------------------------------------------- rebuild

_STOP_KEYS: Final = ("STOP WAL LOCATION:", "STOP TIME:", "STOP TIMELINE:")
_ROUND_UP: Final = dt.timedelta(seconds=1)
"""STOP TIME has whole seconds, cut: the backup was consistent within the second after.
A rebuilt record says the end of that second, so a time target never picks a backup
before it is consistent (one in that second picks an older backup instead)."""


def labelfile_from_history(text: str) -> str:
    """The ``backup_label`` PostgreSQL returned at backup stop, from its ``.backup`` file.

    PostgreSQL writes the history file as the label's lines with ``STOP WAL
    LOCATION`` after the first and ``STOP TIME``/``STOP TIMELINE`` added:
    dropping those three gives the label back, byte for byte.
    """
    lines = text.splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith(_STOP_KEYS))


@frozen
class RebuildSource:
    """One ``.backup`` history file, read and parsed (``error``: why it could not be)."""

    name: str
    text: str
    parsed: BackupHistoryFile | None
    error: str | None = None


@frozen
class RebuildFacts:
    """What :func:`plan_rebuild` looks at.

    ``backups``: the catalog's records (never overwritten), ``unreadable``
    the ids of entries that cannot be read (never overwritten either); ``snapshots``:
    the storage's; ``volume_ids``: this cluster's volumes; ``layout``: the
    cluster's layout (a rebuilt record's); ``sources``: the archive's
    ``.backup`` files; ``archive`` and ``timelines``: its index and histories (a
    rebuilt backup must have its WAL); ``system_identifier``/``server_version``: the cluster's, from
    the archive's WAL or the server (None: unknown); ``pgsnap_version``
    goes into the records.
    """

    backups: tuple[BackupRecord, ...]
    snapshots: tuple[Snapshot, ...]
    volume_ids: frozenset[str]
    layout: Layout
    sources: tuple[RebuildSource, ...]
    archive: ArchiveIndex
    timelines: TimelineGraph
    system_identifier: str | None
    server_version: int | None
    pgsnap_version: str = ""
    unreadable: tuple[str, ...] = ()


@frozen
class RebuildReport:
    """What a catalog rebuild did (or, ``dry_run``, would do).

    ``rebuilt``: the records made (written unless ``dry_run``); ``skipped``:
    ``(what, why)`` for every snapshot group or ``.backup`` file that could
    not become a record; ``existing``: ids of records already in the catalog
    (never overwritten).
    """

    rebuilt: tuple[BackupRecord, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()
    existing: tuple[str, ...] = ()
    dry_run: bool = False

    def explain(self) -> str:
        """The report as text."""
        verb = "would rebuild" if self.dry_run else "rebuilt"
        lines = [f"catalog rebuild: {verb} {len(self.rebuilt)} record(s)"]
        for r in self.rebuilt:
            lines.append(
                f"  + {r.id} ({r.label!r}, timeline {r.start_timeline}, {r.start_lsn} .. "
                f"{r.stop_lsn}, consistent at {r.stop_time.isoformat() if r.stop_time else '-'})"
            )
        if self.skipped:
            lines.append("not rebuilt:")
            lines += [f"  - {what}: {why}" for what, why in self.skipped]
        if self.existing:
            lines.append(f"already in the catalog (kept as they are): {', '.join(self.existing)}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html  # noqa: PLC0415

        return "<pre>" + html.escape(self.explain()) + "</pre>"


def _match(
    name: str,
    created: dt.datetime,
    sources: Sequence[RebuildSource],
    taken: set[tuple[int, int]],
) -> tuple[RebuildSource | None, str]:
    """The ``.backup`` file of the backup ``name`` whose snapshots were taken at ``created``.

    By the label ``pgsnap <name>`` first; else by time, among the files no
    record has (``taken``: their start positions) and whose label does not
    name another pgsnap backup. Several files in time is no match: which one
    is not known (backups less than a few seconds apart need their labels).
    """
    parsed = [
        s
        for s in sources
        if s.parsed is not None and (s.parsed.start_timeline, s.parsed.start_lsn.value) not in taken
    ]
    by_label = [s for s in parsed if s.parsed is not None and s.parsed.label == f"pgsnap {name}"]
    if len(by_label) == 1:
        return by_label[0], ""
    if len(by_label) > 1:
        return None, f"{len(by_label)} .backup files carry the label 'pgsnap {name}'"
    by_time = []
    for s in parsed:
        h = s.parsed
        assert h is not None
        label = h.label or ""
        if label.startswith("pgsnap ") and label != f"pgsnap {name}":
            continue  # another pgsnap backup's
        if h.start_time is None or h.stop_time is None:
            continue
        if h.start_time - TIME_SLACK <= created <= h.stop_time + TIME_SLACK:
            by_time.append(s)
    if len(by_time) == 1:
        return by_time[0], ""
    if len(by_time) > 1:
        return None, (
            f"the snapshots' time {created.isoformat()} lies within {len(by_time)} backups "
            f"({', '.join(s.name for s in by_time)}): which one is not known"
        )
    unresolved = [s.name for s in parsed if s.parsed and s.parsed.stop_time is None]
    note = (
        f" ({len(unresolved)} .backup file(s) have times whose zone is not known: pass "
        "log_timezone)"
        if unresolved
        else ""
    )
    return None, (
        f"no .backup file in the archive has the label 'pgsnap {name}' or a backup in progress "
        f"at {created.isoformat()}{note}"
    )


def plan_rebuild(facts: RebuildFacts) -> RebuildReport:
    """The records a catalog rebuild makes, and what it cannot rebuild and why.

    Candidates are the snapshot groups of this cluster's volumes that no
    record names, whose name is a backup id (not a safety snapshot's), taken
    by pgsnap (not a storage policy). Each must snapshot exactly the
    layout's snapshotted volumes, have no tablespace volume (the tablespace
    map is not in the archive), match one ``.backup`` file, and have its WAL
    from start to stop in the archive. Records already in the catalog are
    never touched, nor is their id reused.
    """
    from pgsnap.catalog import is_valid_backup_id  # noqa: PLC0415

    existing = {b.id for b in facts.backups} | set(facts.unreadable)
    named: set[str] = set()
    used_starts = {(b.start_timeline, b.start_lsn.value) for b in facts.backups}
    for b in facts.backups:
        named.update(b.snapshots.values())
        named.update(b.orphaned_snapshots)
    groups: dict[str, list[Snapshot]] = {}
    for s in facts.snapshots:
        if s.group_id is None or "policy_id" in s.extra or s.volume_id not in facts.volume_ids:
            continue
        groups.setdefault(s.group_id, []).append(s)
    wanted = sorted(v.id for v in facts.layout.snapshotted)
    rebuilt: list[BackupRecord] = []
    skipped: list[tuple[str, str]] = []
    seen_ids: set[str] = set()
    for gid, members in sorted(
        groups.items(), key=lambda kv: (min(s.created_at for s in kv[1]), kv[0])
    ):
        if any(s.id in named for s in members):
            continue
        name = group_name_of(members[0])
        what = f"snapshot group {name} ({gid})"
        if SAFETY_NAME_RE.fullmatch(name):
            continue  # a recovery's safety snapshot: not a backup
        if name in facts.unreadable:
            skipped.append((what, f"the catalog's entry of backup {name} cannot be read: fix it"))
            continue
        if name in existing:
            skipped.append((what, f"the catalog already has a backup {name}; it is kept as it is"))
            continue
        if not is_valid_backup_id(name):
            skipped.append((what, "its name is not a backup id (a shortened name?)"))
            continue
        if name in seen_ids:
            skipped.append((what, f"another snapshot group is named {name} too"))
            continue
        vols = sorted(s.volume_id for s in members)
        if vols != wanted:
            skipped.append(
                (
                    what,
                    f"it snapshots {', '.join(vols)}, not the layout's volumes "
                    f"({', '.join(wanted)}): the layout changed since",
                )
            )
            continue
        if facts.layout.by_role(VolumeRole.TABLESPACE):
            skipped.append(
                (
                    what,
                    "the cluster has tablespace volumes and the tablespace map is not in the "
                    "archive: restore the catalog record from a copy",
                )
            )
            continue
        created = min(s.created_at for s in members)
        source, why = _match(name, created, facts.sources, used_starts)
        if source is None:
            skipped.append((what, why))
            continue
        h = source.parsed
        assert h is not None
        if (h.start_timeline, h.start_lsn.value) in used_starts:
            skipped.append((what, f"{source.name} is another record's backup"))
            continue
        if h.stop_lsn is None or h.stop_time is None or h.start_time is None:
            skipped.append(
                (
                    what,
                    f"{source.name}: START/STOP TIME in a zone that is not known "
                    f"({h.start_time_text!r}): pass log_timezone",
                )
            )
            continue
        if facts.system_identifier is None or facts.server_version is None:
            skipped.append(
                (
                    what,
                    "the cluster's system identifier and version are not known (no archived "
                    "WAL to read them from, and the server cannot be asked)",
                )
            )
            continue
        try:
            result = check(
                facts.archive,
                (h.start_timeline, h.start_lsn),
                h.stop_lsn,
                h.stop_timeline or h.start_timeline,
                facts.timelines,
            )
            missing = result.missing + result.missing_histories
        except PgsnapError as exc:
            missing = (str(exc),)
        if missing:
            skipped.append(
                (what, f"its WAL is not all archived (missing {', '.join(missing[:5])})")
            )
            continue
        record = BackupRecord(
            id=name,
            label=h.label or "",
            state=BackupState.DONE,
            system_identifier=facts.system_identifier,
            server_version=facts.server_version,
            wal_segment_size=facts.archive.segment_size,
            layout=facts.layout,
            start_lsn=h.start_lsn,
            start_timeline=h.start_timeline,
            start_time=h.start_time,
            stop_lsn=h.stop_lsn,
            stop_timeline=h.stop_timeline or h.start_timeline,
            stop_time=h.stop_time + _ROUND_UP,
            labelfile=labelfile_from_history(source.text),
            spcmapfile="",
            snapshot_group_id=gid,
            snapshots={s.volume_id: s.id for s in members},
            pgsnap_version=facts.pgsnap_version,
        )
        rebuilt.append(record)
        seen_ids.add(name)
        used_starts.add((h.start_timeline, h.start_lsn.value))
    matched = {(r.start_timeline, r.start_lsn) for r in rebuilt} | {
        (b.start_timeline, b.start_lsn) for b in facts.backups
    }
    for src in facts.sources:
        if src.parsed is None:
            skipped.append((src.name, f"unreadable: {src.error}"))
        elif (src.parsed.start_timeline, src.parsed.start_lsn) not in matched:
            skipped.append(
                (src.name, "no snapshot group of this cluster's volumes belongs to this backup")
            )
    return RebuildReport(
        rebuilt=tuple(rebuilt),
        skipped=tuple(skipped),
        existing=tuple(sorted(existing)),
    )


def rebuild_plan(report: RebuildReport) -> Plan:
    """The plan that writes the records a rebuild made (:func:`plan_rebuild`): one
    ``catalog.put_rebuilt_record`` step per record, which never overwrites a record
    the catalog has by the time it runs. Nothing to undo: each record stands alone."""
    steps = tuple(
        Step.of(
            f"record-{r.id}",
            PutRebuiltRecord(record=r),
            description=f"record backup {r.id} ({r.label!r}, timeline {r.start_timeline}, "
            f"{r.start_lsn} .. {r.stop_lsn}) in the catalog",
            reason="its snapshot group and .backup file are there, its record is not",
        )
        for r in report.rebuilt
    )
    return Plan(
        kind="rebuild",
        steps=steps,
        fingerprint=fingerprint({"records": [r.id for r in report.rebuilt]}),
        summary={"records": str(len(steps))},
    )
