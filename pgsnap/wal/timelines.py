"""Timelines: ``.history`` files and the graph they make (pure).

:func:`parse_history` reads one history file; :class:`TimelineGraph` answers
which timeline holds an LSN on the way to a target timeline, and where each
timeline hands over to the next.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import (
    HistoryFileError,
    LSNError,
    TimelineError,
)
from pgsnap.model import LSN, MAX_TIMELINE

__all__ = [
    "HistoryEntry",
    "TimelineGraph",
    "TimelineHistory",
    "TimelineSpan",
    "parse_history",
]


_U32: Final = 0xFFFFFFFF


@frozen
class HistoryEntry:
    """One line of a history file: ``parent`` ran until ``switchpoint``.

    The switchpoint is the first LSN *not* on ``parent`` for the descendants of
    this line: WAL on ``parent`` is part of their history up to, not including,
    ``switchpoint``.
    """

    parent: int
    switchpoint: LSN
    reason: str = ""


@frozen
class TimelineSpan:
    """A stretch of one timeline on the way to a target timeline.

    ``start`` is where the timeline begins (None: from the very beginning, a
    root timeline); ``end`` is the switchpoint where the next timeline on the
    path starts (None: open end, the target timeline). The span covers LSNs
    ``start <= lsn < end``; it may be empty when a timeline was left at the LSN
    where it began.
    """

    timeline: int
    start: LSN | None
    end: LSN | None

    def contains(self, lsn: LSN) -> bool:
        """True when ``start <= lsn < end`` (open bounds when None)."""
        return (self.start is None or self.start <= lsn) and (self.end is None or lsn < self.end)


def _validate_history(timeline: int, entries: tuple[HistoryEntry, ...]) -> None:
    if isinstance(timeline, bool) or not isinstance(timeline, int) or not 1 <= timeline <= _U32:
        raise HistoryFileError(
            f"invalid timeline {timeline!r} for a history",
            hint=f"a timeline id is an integer from 1 to {MAX_TIMELINE}",
            timeline=timeline,
        )
    prev: HistoryEntry | None = None
    for i, e in enumerate(entries, 1):
        _check_history_entry(timeline, e, prev, f"entry {i}")
        prev = e


def _check_history_entry(
    timeline: int, e: HistoryEntry, prev: HistoryEntry | None, where: str
) -> None:

    if not 1 <= e.parent < timeline:
        raise HistoryFileError(
            f"history of timeline {timeline}, {where}: parent timeline {e.parent} must be "
            f"between 1 and {timeline - 1}",
            hint="a timeline's ancestors have smaller ids; the file may be damaged or belong "
            "to another cluster",
            timeline=timeline,
            parent=e.parent,
        )
    if prev is not None and e.parent <= prev.parent:
        raise HistoryFileError(
            f"history of timeline {timeline}, {where}: parent timeline {e.parent} does not "
            f"follow {prev.parent} (timeline ids must increase)",
            hint="the file may be damaged or edited; restore it from the archive",
            timeline=timeline,
            parent=e.parent,
        )
    if prev is not None and e.switchpoint < prev.switchpoint:
        raise HistoryFileError(
            f"history of timeline {timeline}, {where}: switchpoint {e.switchpoint} is before "
            f"the previous switchpoint {prev.switchpoint}",
            hint="switchpoints never go back; the file may be damaged",
            timeline=timeline,
            switchpoint=str(e.switchpoint),
        )


def _entries_converter(value: Iterable[HistoryEntry]) -> tuple[HistoryEntry, ...]:
    return tuple(value)


@frozen
class TimelineHistory:
    """The content of ``<timeline>.history``: the ancestry of ``timeline``.

    ``entries`` lists the ancestors oldest first, each with the switchpoint at
    which the line towards ``timeline`` left it. Timeline 1 (and any timeline
    without a history file) has no entries.
    """

    timeline: int
    entries: tuple[HistoryEntry, ...] = attrs.field(default=(), converter=_entries_converter)

    def __attrs_post_init__(self) -> None:
        _validate_history(self.timeline, self.entries)

    @property
    def parents(self) -> tuple[int, ...]:
        """The ancestor timelines, oldest first."""
        return tuple(e.parent for e in self.entries)

    @property
    def ancestry(self) -> tuple[int, ...]:
        """The ancestors and the timeline itself, oldest first."""
        return (*self.parents, self.timeline)

    @property
    def parent(self) -> int | None:
        """The timeline this one branched from (None for a root timeline)."""
        return self.entries[-1].parent if self.entries else None

    @property
    def begin(self) -> LSN | None:
        """The LSN where this timeline begins (None for a root timeline)."""
        return self.entries[-1].switchpoint if self.entries else None

    def spans(self) -> tuple[TimelineSpan, ...]:
        """The spans of the ancestry, oldest first; the last one is this timeline."""
        out: list[TimelineSpan] = []
        start: LSN | None = None
        for e in self.entries:
            out.append(TimelineSpan(e.parent, start, e.switchpoint))
            start = e.switchpoint
        out.append(TimelineSpan(self.timeline, start, None))
        return tuple(out)

    def timeline_at(self, lsn: LSN) -> int:
        """The timeline that holds ``lsn`` on this history (PostgreSQL's
        ``tliOfPointInHistory``): a switchpoint belongs to the child."""
        for e in self.entries:
            if lsn < e.switchpoint:
                return e.parent
        return self.timeline

    def to_text(self) -> str:
        """The history file text PostgreSQL would write (``parent<TAB>X/Y<TAB>reason``)."""
        return "".join(f"{e.parent}\t{e.switchpoint}\t{e.reason}\n" for e in self.entries)


def parse_history(text: str, timeline: int) -> TimelineHistory:
    """Parse the text of ``<timeline>.history``.

    Lines are ``parentTLI<TAB>switchpoint<TAB>reason``; blank lines and ``#``
    lines are ignored (expect blank lines: reasons of time targets end in a
    newline). The reason may contain anything, tabs included; trailing
    whitespace is stripped and a missing reason is allowed (PostgreSQL does not
    require it). Parents must increase and be below ``timeline``, switchpoints
    must not decrease. Anything else raises :class:`HistoryFileError` naming the
    line.
    """
    if not isinstance(text, str):
        raise HistoryFileError(
            f"a history file must be text, not {type(text).__name__}",
            hint="decode the file (it is ASCII) before parsing",
        )
    _check_history_timeline(timeline)
    entries: list[HistoryEntry] = []
    prev: HistoryEntry | None = None
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip()
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split("\t", 2)
        where = f"line {lineno}"
        if len(parts) < 2 or not parts[0].isascii() or not parts[0].isdigit():
            raise HistoryFileError(
                f"history of timeline {timeline}, {where}: expected "
                f"'parentTLI<TAB>switchpoint<TAB>reason', got {raw!r}",
                hint="the file may be damaged or not a timeline history file",
                timeline=timeline,
                line=lineno,
            )
        try:
            switchpoint = LSN.parse(parts[1])
        except LSNError:
            raise HistoryFileError(
                f"history of timeline {timeline}, {where}: malformed switchpoint {parts[1]!r}",
                hint="a switchpoint is an LSN like 0/5000EC0",
                timeline=timeline,
                line=lineno,
            ) from None
        entry = HistoryEntry(int(parts[0]), switchpoint, parts[2] if len(parts) > 2 else "")
        _check_history_entry(timeline, entry, prev, where)
        entries.append(entry)
        prev = entry
    return TimelineHistory(timeline, tuple(entries))


def _check_history_timeline(timeline: int) -> None:
    if isinstance(timeline, bool) or not isinstance(timeline, int) or not 1 <= timeline <= _U32:
        raise HistoryFileError(
            f"invalid timeline {timeline!r} for a history file",
            hint="pass the timeline from the file name (00000003.history → 3)",
            timeline=timeline,
        )


def _same_line(a: tuple[HistoryEntry, ...], b: tuple[HistoryEntry, ...]) -> bool:
    return len(a) == len(b) and all(
        x.parent == y.parent and x.switchpoint == y.switchpoint for x, y in zip(a, b, strict=True)
    )


class TimelineGraph:
    """All known timelines and how they branch, built from history files.

    Timeline 1 is always known. A history file holds the whole ancestry of its
    timeline, so ancestors whose own ``.history`` is missing are derived from
    their descendants. Histories that disagree about a shared ancestry raise
    :class:`HistoryFileError`; asking about a timeline that is not known (its
    history file is missing) raises :class:`TimelineError`.
    """

    __slots__ = ("_histories",)

    def __init__(self, histories: Iterable[TimelineHistory] = ()) -> None:
        """Build from histories (any order); see :meth:`from_histories`."""
        known: dict[int, TimelineHistory] = {1: TimelineHistory(1)}
        given = sorted(histories, key=lambda h: (h.timeline, len(h.entries)))
        for h in given:
            old = known.get(h.timeline)
            if old is not None and not _same_line(old.entries, h.entries):
                raise _conflict(h.timeline, old, h)
            known[h.timeline] = h
        # Derive missing ancestors and cross-check shared ancestry.
        for h in sorted(known.values(), key=lambda h: -h.timeline):
            for i, e in enumerate(h.entries):
                prefix = h.entries[:i]
                anc = known.get(e.parent)
                if anc is None:
                    known[e.parent] = TimelineHistory(e.parent, prefix)
                elif not _same_line(anc.entries, prefix):
                    raise _conflict(e.parent, anc, TimelineHistory(e.parent, prefix), h.timeline)
        self._histories: dict[int, TimelineHistory] = dict(sorted(known.items()))

    @classmethod
    def from_histories(cls, histories: Iterable[TimelineHistory]) -> TimelineGraph:
        """Build the graph from parsed history files (timeline 1 is implicit)."""
        return cls(histories)

    @property
    def histories(self) -> tuple[TimelineHistory, ...]:
        """Every known timeline's history (given or derived), by timeline."""
        return tuple(self._histories.values())

    def timelines(self) -> tuple[int, ...]:
        """Every known timeline id, ascending."""
        return tuple(self._histories)

    def latest(self) -> int:
        """The highest known timeline id (what ``recovery_target_timeline='latest'`` picks)."""
        return max(self._histories)

    def __contains__(self, timeline: object) -> bool:
        return timeline in self._histories

    def history(self, timeline: int) -> TimelineHistory:
        """The history of ``timeline``; :class:`TimelineError` if it is not known."""
        h = self._histories.get(timeline)
        if h is None:
            name = f"{timeline:08X}.history" if isinstance(timeline, int) and timeline > 0 else "?"
            raise TimelineError(
                f"timeline {timeline} is not known: no history file {name} was found",
                hint=f"copy {name} into the archive, or pick one of the known timelines "
                f"{', '.join(map(str, self._histories))}",
                timeline=timeline,
                missing_history=name,
            )
        return h

    def parent_of(self, timeline: int) -> int | None:
        """The timeline ``timeline`` branched from (None for timeline 1 / a root)."""
        return self.history(timeline).parent

    def switchpoint_of(self, timeline: int) -> LSN | None:
        """The LSN where ``timeline`` begins, i.e. its parent's switchpoint (None for a root)."""
        return self.history(timeline).begin

    def children_of(self, timeline: int) -> tuple[int, ...]:
        """Timelines that branched directly from ``timeline``, ascending."""
        return tuple(t for t, h in self._histories.items() if h.parent == timeline)

    def ancestry(self, timeline: int) -> tuple[int, ...]:
        """``timeline``'s ancestors and itself, oldest first."""
        return self.history(timeline).ancestry

    def path(
        self, target_timeline: int, from_timeline: int | None = None
    ) -> tuple[TimelineSpan, ...]:
        """The spans from ``from_timeline`` (default: the root) to ``target_timeline``.

        Raises :class:`TimelineError` when ``from_timeline`` is not an ancestor
        of (or equal to) the target.
        """
        spans = self.history(target_timeline).spans()
        if from_timeline is None:
            return spans
        for i, s in enumerate(spans):
            if s.timeline == from_timeline:
                return spans[i:]
        raise TimelineError(
            f"timeline {from_timeline} is not in the history of timeline {target_timeline} "
            f"(its ancestry is {' → '.join(str(s.timeline) for s in spans)})",
            hint="PostgreSQL would refuse with 'requested timeline is not a child of this "
            "server's history'; choose a target timeline that descends from the backup's "
            "timeline (recovery_target_timeline='current' stays on it)",
            timeline=from_timeline,
            target_timeline=target_timeline,
        )

    def timeline_at(self, lsn: LSN, target_timeline: int) -> int:
        """The timeline that holds ``lsn`` in the history of ``target_timeline``.

        Like PostgreSQL's ``tliOfPointInHistory``: a timeline holds
        ``begin <= lsn < switchpoint``; the switchpoint itself is the first byte
        of the child.
        """
        return self.history(target_timeline).timeline_at(LSN.parse(lsn))

    def contains(self, timeline: int, lsn: LSN, target_timeline: int) -> bool:
        """Whether WAL position ``lsn`` on ``timeline`` is part of ``target_timeline``'s history.

        True when ``timeline`` is on the target's ancestry and ``lsn`` lies in
        its span (``begin <= lsn < switchpoint``). This is PostgreSQL's check
        of the backup's checkpoint against the requested timeline.
        """
        return self.timeline_at(lsn, target_timeline) == timeline

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimelineGraph):
            return NotImplemented
        return self._histories == other._histories

    def __hash__(self) -> int:
        return hash(tuple(self._histories.values()))

    def __repr__(self) -> str:
        parts = [
            f"{t}<-{h.parent}@{h.begin}" if h.parent is not None else str(t)
            for t, h in self._histories.items()
        ]
        return f"TimelineGraph({', '.join(parts)})"


def _conflict(
    timeline: int, a: TimelineHistory, b: TimelineHistory, via: int | None = None
) -> HistoryFileError:
    src = f" (as recorded in {via:08X}.history)" if via is not None else ""
    return HistoryFileError(
        f"conflicting histories for timeline {timeline}: {_describe(a)} vs {_describe(b)}{src}",
        hint="the archive holds history files of different clusters or damaged files; "
        "keep one cluster per archive and restore the files from a good copy",
        timeline=timeline,
    )


def _describe(h: TimelineHistory) -> str:
    return " → ".join(f"{e.parent}@{e.switchpoint}" for e in h.entries) or "(root)"


# =========================================================================== backup files
