"""The "what is recoverable" picture as SVG and as a standalone HTML page (pure).

:func:`render_svg` draws a :class:`~pgsnap.timeline.TimelineView` (see
:mod:`pgsnap.timeline`): the x axis is the WAL position (LSN, linear, with a small
margin), each timeline is a horizontal lane (stacked by timeline number, a child
joined to its parent by a connector at its switchpoint), archived WAL is a bar with
a red mark wherever segments are missing, each backup is a mark at its start
(DONE solid, FAILED a red cross, in progress grey; pinned ones carry a pin) with the
window it can be recovered to as a translucent band, restore points are flags,
drills ticks, and a recovery target a vertical line with its chosen backup
highlighted. :func:`render_html` puts the picture on a page with a short summary.

The output is self-contained (inline style, no script, no external resource) and
every element that means something carries a ``<title>`` (a tooltip) and ``data-*``
attributes, so tests and products can find it::

    <rect class="gap" data-timeline="2" data-start="0/5000000" data-end="0/6000000"
          data-first-missing="000000020000000000000005" data-segments="1" ...>

Classes: ``lane`` (``data-timeline``), ``run``, ``gap`` (``gap-bin`` when many),
``backup`` (``data-id``, ``data-state``, ``data-start``, ``data-window-start``,
``data-window-end``), ``window`` (``data-backup``), ``backup-bin`` (``data-count``),
``window-union``, ``drill`` (``drill-bin``), ``restore-point``
(``restore-point-bin``), ``fork``, ``target`` (``data-backup``, ``data-lsn``) and
``tick`` (``data-lsn``) on the axis.

The size stays bounded whatever the catalog holds: on a lane with more than one
backup per 3 pixels the backups are drawn as counts in bins 4 pixels wide
(``backup-bin``, ``data-count``; the target's chosen backup always individually),
their windows as their union; dense gaps and restore points are binned the same
way. 10,000 backups make well under a megabyte, in a fraction of a second.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from pgsnap._attrs import frozen
from pgsnap.model import LSN, BackupState

if TYPE_CHECKING:  # the view's types: pgsnap.timeline imports this module to draw itself
    from pgsnap.timeline import (
        BackupMark,
        DrillMark,
        GapMark,
        Lane,
        RestorePointMark,
        TimelineView,
        WalRun,
    )

__all__ = ["MIN_WIDTH", "render_html", "render_svg"]

_T = TypeVar("_T")

MIN_WIDTH: Final = 320
"""The narrowest picture :func:`render_svg` draws (pixels)."""

_LEFT: Final = 118.0  # the lanes' labels
_RIGHT: Final = 24.0
_HEADER_H: Final = 30.0
_ROW_H: Final = 84.0
_AXIS_H: Final = 34.0
_LEGEND_ROW_H: Final = 18.0
_LEGEND_PAD: Final = 8.0

# Within a lane's row (offsets from its top).
_RP_TOP: Final = 4.0
_MARK_Y: Final = 25.0
_BAR_Y: Final = 36.0  # archived WAL: a bar, and under it ...
_BAR_H: Final = 8.0
_WINDOW_Y: Final = 44.0  # ... the strip of the recoverable windows
_WINDOW_H: Final = 8.0
_GAP_Y: Final = 30.0  # a gap stands out of both
_GAP_H: Final = 26.0
_DRILL_Y: Final = 58.0
_DRILL_H: Final = 8.0
_BIN_BASE: Final = 34.0
_BIN_MAX_H: Final = 20.0

_PX_PER_BACKUP: Final = 3.0
"""Backups are aggregated on a lane with more than one backup per this many pixels."""
_PX_PER_GAP: Final = 4.0
_PX_PER_RESTORE_POINT: Final = 6.0
_BIN_PX: Final = 4.0
"""The width of an aggregation bin (pixels)."""
_MIN_GAP_PX: Final = 3.0
_CHAR_PX: Final = 6.2  # an estimate of a character's width at 11px
_MAX_NAME: Final = 24
_MAX_TARGET_TEXT: Final = 70
_MAX_TABLE_GAPS: Final = 10

_MAX_LSN: Final = (1 << 64) - 1
_NOT_XML: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")

_STYLE: Final = """
.pgsnap-timeline{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;font-size:11px}
.pgsnap-timeline text{fill:#222}
.pgsnap-timeline .bg{fill:#fff}
.pgsnap-timeline .header-title{font-size:13px;font-weight:700}
.pgsnap-timeline .header-summary,.pgsnap-timeline .note{fill:#555}
.pgsnap-timeline .lane-bg{fill:#f4f6f8}
.pgsnap-timeline .lane-bg.alt{fill:#fbfbfc}
.pgsnap-timeline .lane-row{fill:none}
.pgsnap-timeline .lane-label{font-size:12px;font-weight:600}
.pgsnap-timeline .lane-sub{font-size:10px;fill:#666}
.pgsnap-timeline .lane-extent{stroke:#b0b0b0;stroke-width:1;stroke-dasharray:3 2}
.pgsnap-timeline .run,.pgsnap-timeline .lg-run{fill:#8fb3d3}
.pgsnap-timeline .gap,.pgsnap-timeline .gap-bin,.pgsnap-timeline .lg-gap{
 fill:#e02424;stroke:#7a0000;stroke-width:1}
.pgsnap-timeline .window,.pgsnap-timeline .window-union,.pgsnap-timeline .lg-window{fill:#2a9d8f}
.pgsnap-timeline .window-union,.pgsnap-timeline .lg-window{fill-opacity:.28}
.pgsnap-timeline .window.chosen{fill:#e8590c;fill-opacity:.32;stroke:#e8590c;stroke-width:1.5}
.pgsnap-timeline .mark{stroke-linejoin:round}
.pgsnap-timeline .done .mark,.pgsnap-timeline .lg-done{fill:#1f4e9c;stroke:#fff;stroke-width:.8}
.pgsnap-timeline .failed .mark,.pgsnap-timeline .lg-failed{fill:none;stroke:#d62728;stroke-width:2}
.pgsnap-timeline .in-progress .mark,.pgsnap-timeline .lg-in-progress{
 fill:#fff;stroke:#8a8a8a;stroke-width:1.5}
.pgsnap-timeline .pin,.pgsnap-timeline .lg-pin{fill:#fff;stroke:#333;stroke-width:1.2}
.pgsnap-timeline .chosen-ring,.pgsnap-timeline .lg-chosen{fill:none;stroke:#e8590c;stroke-width:2}
.pgsnap-timeline .bin-bar,.pgsnap-timeline .lg-bin{fill:#1f4e9c;fill-opacity:.7}
.pgsnap-timeline .bin-failed{fill:#d62728}
.pgsnap-timeline .bin-busy{fill:#8a8a8a}
.pgsnap-timeline .drill,.pgsnap-timeline .drill-bin,.pgsnap-timeline .lg-drill{stroke-width:2.5}
.pgsnap-timeline .ok{stroke:#2ca02c}
.pgsnap-timeline .bad{stroke:#d62728}
.pgsnap-timeline .rp-pole{stroke:#6a3d9a;stroke-width:1}
.pgsnap-timeline .rp-flag,.pgsnap-timeline .lg-rp{fill:#6a3d9a}
.pgsnap-timeline text.rp-name{fill:#6a3d9a;font-size:10px}
.pgsnap-timeline .fork-line{stroke:#555;stroke-width:1.5;fill:none}
.pgsnap-timeline .fork-dot{fill:#555}
.pgsnap-timeline .target,.pgsnap-timeline .lg-target{stroke:#e8590c;stroke-width:2.5}
.pgsnap-timeline text.target-label{fill:#b34100;font-weight:600}
.pgsnap-timeline .axis-line{stroke:#888}
.pgsnap-timeline .tick line{stroke:#888}
.pgsnap-timeline .grid{stroke:#000;stroke-opacity:.07}
.pgsnap-timeline .tick text{fill:#444;font-size:10px}
.pgsnap-timeline .legend text{font-size:10.5px;fill:#333}
"""


# --------------------------------------------------------------------------- text


def _clean(text: str) -> str:
    """``text`` with what XML cannot hold (control characters, lone surrogates)
    replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


def _esc(text: str) -> str:
    """``text`` escaped for XML/HTML content and quoted attribute values."""
    return html.escape(_clean(text), quote=True)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _num(value: float) -> str:
    text = f"{value:.1f}"
    if text.endswith(".0"):
        text = text[:-2]
    return "0" if text == "-0" else text


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, BackupState):
        return value.value
    return str(value)


def _attrs(pairs: Iterable[tuple[str, object]]) -> str:
    return "".join(f' {k}="{_esc(_fmt(v))}"' for k, v in pairs if v is not None)


def _el(
    tag: str, pairs: Iterable[tuple[str, object]], *, title: str | None = None, inner: str = ""
) -> str:
    """An element: ``pairs`` its attributes (None values left out), ``title`` its
    tooltip, ``inner`` its (already escaped) content."""
    body = (f"<title>{_esc(title)}</title>" if title else "") + inner
    if body:
        return f"<{tag}{_attrs(pairs)}>{body}</{tag}>"
    return f"<{tag}{_attrs(pairs)}/>"


def _time(value: dt.datetime | None) -> str:
    if value is None:
        return "?"
    if value.tzinfo is not None:
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _state_class(state: BackupState) -> str:
    if state is BackupState.DONE:
        return "done"
    if state is BackupState.FAILED:
        return "failed"
    return "in-progress"


# --------------------------------------------------------------------------- geometry


@frozen
class _Scale:
    """LSN → x: ``lo`` at ``left``, ``hi`` at ``right``."""

    lo: int
    hi: int
    left: float
    right: float

    def x(self, lsn: LSN) -> float:
        return self.left + (lsn.value - self.lo) * (self.right - self.left) / (self.hi - self.lo)


@frozen
class _Row:
    """A lane's row: its timeline, its lane (None when only marks name the timeline)
    and where it is drawn."""

    timeline: int
    lane: Lane | None
    top: float

    @property
    def bar_mid(self) -> float:
        return self.top + _BAR_Y + _BAR_H / 2


def _placed(lane: Lane) -> bool:
    """True when the lane has a position on the axis (WAL or a switchpoint)."""
    return bool(lane.runs) or lane.switchpoint is not None


def _scale(view: TimelineView, width: int) -> _Scale:
    points: list[int] = []
    for lane in view.lanes:
        if _placed(lane):
            points += (lane.start.value, lane.end.value)
    for b in view.backups:
        points.append(b.start.value)
        if b.stop is not None:
            points.append(b.stop.value)
        if b.recoverable_to is not None:
            points.append(b.recoverable_to.value)
    points += (rp.lsn.value for rp in view.restore_points)
    if view.target is not None and view.target.lsn is not None:
        points.append(view.target.lsn.value)
    step = max(1, view.segment_size)
    lo, hi = (min(points), max(points)) if points else (0, step)
    if hi <= lo:
        lo, hi = max(0, lo - step // 2), lo + step // 2 + 1
    margin = max(1, (hi - lo) // 50)
    return _Scale(max(0, lo - margin), min(_MAX_LSN, hi + margin), _LEFT, width - _RIGHT)


def _rows(view: TimelineView) -> list[_Row]:
    lanes = {lane.timeline: lane for lane in view.lanes}
    timelines = set(lanes) | {b.timeline for b in view.backups}
    timelines |= {rp.timeline for rp in view.restore_points}
    return [
        _Row(tli, lanes.get(tli), _HEADER_H + i * _ROW_H) for i, tli in enumerate(sorted(timelines))
    ]


def _ticks(scale: _Scale) -> list[int]:
    """LSNs for the axis: multiples of a power of two (round in hex)."""
    wanted = max(2, int((scale.right - scale.left) // 110))
    span = scale.hi - scale.lo
    step = 1 << max(0, math.ceil(math.log2(max(1, span / wanted))))
    first = -(-scale.lo // step) * step
    return list(range(first, scale.hi + 1, step))


# --------------------------------------------------------------------------- pieces


def _merged_runs(runs: Sequence[WalRun], scale: _Scale) -> list[list[WalRun]]:
    """Runs grouped where they touch within a pixel (one bar each)."""
    groups: list[list[WalRun]] = []
    last_x = -math.inf
    for run in sorted(runs, key=lambda r: r.start.value):
        if groups and scale.x(run.start) - last_x < 1.0:
            groups[-1].append(run)
        else:
            groups.append([run])
        last_x = scale.x(run.end)
    return groups


def _run_elements(row: _Row, runs: Sequence[WalRun], scale: _Scale) -> list[str]:
    out = []
    y = row.top + _BAR_Y
    for group in _merged_runs(runs, scale):
        start, end = group[0].start, group[-1].end
        x0, x1 = scale.x(start), scale.x(end)
        segments = sum(r.segments for r in group)
        title = f"archived WAL on timeline {row.timeline}: {start} to {end}, " + _plural(
            segments, "segment"
        )
        if len(group) > 1:
            title += f" ({len(group)} runs with small gaps between them)"
        out.append(
            _el(
                "rect",
                [
                    ("class", "run"),
                    ("data-timeline", row.timeline),
                    ("data-start", start),
                    ("data-end", end),
                    ("data-segments", segments),
                    ("data-runs", len(group) if len(group) > 1 else None),
                    ("x", x0),
                    ("y", y),
                    ("width", max(1.0, x1 - x0)),
                    ("height", _BAR_H),
                ],
                title=title,
            )
        )
    return out


def _gap_title(gap: GapMark) -> str:
    return (
        f"MISSING WAL on timeline {gap.timeline}: "
        + _plural(gap.segments, "segment")
        + f" from {gap.first_missing} ({gap.start} to {gap.end}); "
        "nothing can be recovered across it"
    )


def _gap_elements(row: _Row, gaps: Sequence[GapMark], scale: _Scale) -> list[str]:
    y = row.top + _GAP_Y
    plot = scale.right - scale.left
    ordered = sorted(gaps, key=lambda g: g.start.value)
    if len(ordered) <= plot / _PX_PER_GAP:
        out = []
        for gap in ordered:
            x0, x1 = scale.x(gap.start), scale.x(gap.end)
            if x1 - x0 < _MIN_GAP_PX:
                mid = (x0 + x1) / 2
                x0, x1 = mid - _MIN_GAP_PX / 2, mid + _MIN_GAP_PX / 2
            out.append(
                _el(
                    "rect",
                    [
                        ("class", "gap"),
                        ("data-timeline", gap.timeline),
                        ("data-start", gap.start),
                        ("data-end", gap.end),
                        ("data-first-missing", gap.first_missing),
                        ("data-segments", gap.segments),
                        ("x", x0),
                        ("y", y),
                        ("width", x1 - x0),
                        ("height", _GAP_H),
                    ],
                    title=_gap_title(gap),
                )
            )
        return out
    out = []
    for members in _bins(ordered, lambda g: scale.x(g.start), scale):
        first, last = members[0], members[-1]
        x0 = scale.x(first.start)
        x1 = max(scale.x(last.end), x0 + _MIN_GAP_PX)
        segments = sum(g.segments for g in members)
        out.append(
            _el(
                "rect",
                [
                    ("class", "gap-bin"),
                    ("data-timeline", first.timeline),
                    ("data-count", len(members)),
                    ("data-start", first.start),
                    ("data-end", last.end),
                    ("data-first-missing", first.first_missing),
                    ("data-segments", segments),
                    ("x", x0),
                    ("y", y),
                    ("width", x1 - x0),
                    ("height", _GAP_H),
                ],
                title=f"MISSING WAL on timeline {first.timeline}: {len(members)} gaps, "
                + _plural(segments, "segment")
                + f" missing between {first.start} and {last.end}, "
                f"the first {first.first_missing}",
            )
        )
    return out


def _bins(items: Sequence[_T], x_of: Callable[[_T], float], scale: _Scale) -> list[list[_T]]:
    """``items`` (in x order) grouped into bins of :data:`_BIN_PX` pixels."""
    out: list[list[_T]] = []
    current = -1
    for item in items:
        key = int((x_of(item) - scale.left) // _BIN_PX)
        if out and key == current:
            out[-1].append(item)
        else:
            out.append([item])
            current = key
    return out


def _window_element(b: BackupMark, row: _Row, scale: _Scale, opacity: float | None) -> str:
    assert b.stop is not None and b.recoverable_to is not None
    x0, x1 = scale.x(b.stop), scale.x(b.recoverable_to)
    chosen = opacity is None
    return _el(
        "rect",
        [
            ("class", "window chosen" if chosen else "window"),
            ("data-backup", b.id),
            ("data-timeline", row.timeline),
            ("data-start", b.stop),
            ("data-end", b.recoverable_to),
            ("x", x0),
            ("y", row.top + _WINDOW_Y),
            ("width", max(1.0, x1 - x0)),
            ("height", _WINDOW_H),
            ("fill-opacity", None if opacity is None else f"{opacity:.3f}"),
        ],
        title=f"backup {b.id} can be recovered to any point from {b.stop} to "
        f"{b.recoverable_to}" + (" (the recovery's chosen backup)" if chosen else ""),
    )


def _backup_title(b: BackupMark, drills: Sequence[DrillMark], chosen: bool) -> str:
    lines = [f"backup {b.id}" + (f" ({b.label})" if b.label else ""), f"state: {b.state.value}"]
    lines.append(f"starts at {b.start} on timeline {b.timeline}, {_time(b.start_time)}")
    if b.stop is not None:
        lines.append(f"consistent at {b.stop}, {_time(b.stop_time)}")
    if b.recoverable_to is not None:
        lines.append(f"recoverable from {b.stop} to {b.recoverable_to}")
    elif b.state is BackupState.DONE:
        lines.append("NOT recoverable: the WAL from its start is not archived")
    if b.pinned:
        lines.append("pinned (kept whatever the retention policy says)")
    if b.copies:
        lines.append(_plural(b.copies, "copy", "copies") + " off the array")
    if drills:
        last = drills[-1]
        failed = sum(not d.ok for d in drills)
        lines.append(
            f"last drill {'passed' if last.ok else 'FAILED'} ({_time(last.started_at)}); "
            + _plural(len(drills), "drill")
            + (f", {failed} failed" if failed else "")
        )
    if chosen:
        lines.append("chosen for the recovery target")
    return "\n".join(lines)


def _backup_element(
    b: BackupMark, row: _Row, scale: _Scale, drills: Sequence[DrillMark], chosen: bool
) -> str:
    x = scale.x(b.start)
    y = row.top + _MARK_Y
    kind = _state_class(b.state)
    if b.state is BackupState.FAILED:
        d = f"M{_num(x - 4)} {_num(y - 4)}L{_num(x + 4)} {_num(y + 4)}"
        d += f"M{_num(x - 4)} {_num(y + 4)}L{_num(x + 4)} {_num(y - 4)}"
    else:
        d = f"M{_num(x)} {_num(y - 6)}L{_num(x + 4.5)} {_num(y)}"
        d += f"L{_num(x)} {_num(y + 6)}L{_num(x - 4.5)} {_num(y)}Z"
    inner = [_el("path", [("class", "mark"), ("d", d)])]
    if b.pinned:
        inner.append(_pin(x, y - 6))
    if chosen:
        inner.append(_el("circle", [("class", "chosen-ring"), ("cx", x), ("cy", y), ("r", 9.0)]))
    classes = ["backup", kind] + (["pinned"] if b.pinned else []) + (["chosen"] if chosen else [])
    window = b.recoverable_to is not None
    return _el(
        "g",
        [
            ("class", " ".join(classes)),
            ("data-id", b.id),
            ("data-label", b.label),
            ("data-state", b.state),
            ("data-timeline", b.timeline),
            ("data-start", b.start),
            ("data-stop", b.stop),
            ("data-window-start", b.stop if window else None),
            ("data-window-end", b.recoverable_to),
            ("data-pinned", b.pinned),
            ("data-copies", b.copies),
            ("data-x", x),
        ],
        title=_backup_title(b, drills, chosen),
        inner="".join(inner),
    )


def _pin(x: float, y_bottom: float) -> str:
    """A pin glyph standing on ``(x, y_bottom)``."""
    return _el(
        "path",
        [
            ("class", "pin"),
            (
                "d",
                f"M{_num(x)} {_num(y_bottom)}L{_num(x)} {_num(y_bottom - 5)}"
                f"M{_num(x - 2.5)} {_num(y_bottom - 7.5)}a2.5 2.5 0 1 0 5 0a2.5 2.5 0 1 0 -5 0",
            ),
        ],
    )


def _drill_element(b: BackupMark, row: _Row, scale: _Scale, drills: Sequence[DrillMark]) -> str:
    x = scale.x(b.start)
    last = drills[-1]
    failed = sum(not d.ok for d in drills)
    return _el(
        "path",
        [
            ("class", f"drill {'ok' if last.ok else 'bad failed'}"),
            ("data-backup", b.id),
            ("data-ok", last.ok),
            ("data-count", len(drills)),
            ("data-failed", failed),
            ("data-started-at", last.started_at),
            ("d", f"M{_num(x)} {_num(row.top + _DRILL_Y)}v{_num(_DRILL_H)}"),
        ],
        title=f"drill of backup {b.id}: {'passed' if last.ok else 'FAILED'} "
        f"({_time(last.started_at)})"
        + (f"; {_plural(len(drills), 'drill')}, {failed} failed" if len(drills) > 1 else ""),
    )


@frozen
class _BinStats:
    count: int
    done: int
    failed: int
    busy: int
    pinned: int
    drilled: int
    drill_failed: int


def _bin_stats(members: Sequence[BackupMark], drills: dict[str, list[DrillMark]]) -> _BinStats:
    done = failed = pinned = drilled = drill_failed = 0
    for b in members:
        done += b.state is BackupState.DONE
        failed += b.state is BackupState.FAILED
        pinned += b.pinned
        ds = drills.get(b.id)
        if ds:
            drilled += 1
            drill_failed += not ds[-1].ok
    return _BinStats(
        len(members), done, failed, len(members) - done - failed, pinned, drilled, drill_failed
    )


def _backup_bin_elements(
    row: _Row,
    members: Sequence[BackupMark],
    scale: _Scale,
    drills: dict[str, list[DrillMark]],
    biggest: int,
) -> list[str]:
    s = _bin_stats(members, drills)
    first, last = members[0], members[-1]
    x = scale.left + ((scale.x(first.start) - scale.left) // _BIN_PX) * _BIN_PX
    w = _BIN_PX - 1
    h = 4 + (_BIN_MAX_H - 4) * math.log1p(s.count) / math.log1p(max(biggest, 1))
    base = row.top + _BIN_BASE
    inner = [
        _el(
            "rect",
            [("class", "bin-bar"), ("x", x), ("y", base - h), ("width", w), ("height", h)],
        )
    ]
    # The failed (red) and in-progress (grey) share at the bar's bottom.
    bottom = base
    for cls, n in (("bin-failed", s.failed), ("bin-busy", s.busy)):
        if n:
            part = max(1.5, h * n / s.count)
            bottom -= part
            inner.append(
                _el(
                    "rect",
                    [("class", cls), ("x", x), ("y", bottom), ("width", w), ("height", part)],
                )
            )
    if s.pinned:
        inner.append(_pin(x + w / 2, base - h - 1))
    title = [f"{s.count} backups, ids {first.id} .. {last.id}"]
    title.append(f"starting {first.start} to {last.start} on timeline {row.timeline}")
    states = f"{s.done} done, {s.failed} failed, {s.busy} in progress"
    title.append(states + (f", {s.pinned} pinned" if s.pinned else ""))
    out = [
        _el(
            "g",
            [
                ("class", "backup-bin"),
                ("data-timeline", row.timeline),
                ("data-count", s.count),
                ("data-first", first.id),
                ("data-last", last.id),
                ("data-start", first.start),
                ("data-end", last.start),
                ("data-failed", s.failed or None),
                ("data-pinned", s.pinned or None),
            ],
            title="\n".join(title),
            inner="".join(inner),
        )
    ]
    if s.drilled:
        ok = s.drill_failed == 0
        out.append(
            _el(
                "path",
                [
                    ("class", f"drill-bin {'ok' if ok else 'bad'}"),
                    ("data-timeline", row.timeline),
                    ("data-count", s.drilled),
                    ("data-failed", s.drill_failed),
                    ("d", f"M{_num(x + w / 2)} {_num(row.top + _DRILL_Y)}v{_num(_DRILL_H)}"),
                ],
                title=f"{_plural(s.drilled, 'drilled backup')} among ids {first.id} .. "
                f"{last.id}: {s.drill_failed} whose last drill failed",
            )
        )
    return out


def _window_unions(row: _Row, marks: Sequence[BackupMark], scale: _Scale) -> list[str]:
    spans = sorted(
        (b.stop.value, b.recoverable_to.value)
        for b in marks
        if b.stop is not None and b.recoverable_to is not None
    )
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
            merged[-1][2] += 1
        else:
            merged.append([lo, hi, 1])
    out = []
    for lo, hi, n in merged:
        x0, x1 = scale.x(LSN(lo)), scale.x(LSN(hi))
        out.append(
            _el(
                "rect",
                [
                    ("class", "window-union"),
                    ("data-timeline", row.timeline),
                    ("data-start", LSN(lo)),
                    ("data-end", LSN(hi)),
                    ("data-backups", n),
                    ("x", x0),
                    ("y", row.top + _WINDOW_Y),
                    ("width", max(1.0, x1 - x0)),
                    ("height", _WINDOW_H),
                ],
                title=f"recoverable from {LSN(lo)} to {LSN(hi)} with one of "
                + _plural(n, "backup"),
            )
        )
    return out


def _restore_point_elements(
    row: _Row, points: Sequence[RestorePointMark], scale: _Scale
) -> list[str]:
    ordered = sorted(points, key=lambda p: p.lsn.value)
    top = row.top + _RP_TOP
    bar = row.top + _BAR_Y
    out = []
    if len(ordered) > (scale.right - scale.left) / _PX_PER_RESTORE_POINT:
        for members in _bins(ordered, lambda p: scale.x(p.lsn), scale):
            x = scale.x(members[0].lsn)
            names = ", ".join(_short(p.name, _MAX_NAME) for p in members[:5])
            more = f" and {len(members) - 5} more" if len(members) > 5 else ""
            out.append(
                _el(
                    "g",
                    [
                        ("class", "restore-point-bin"),
                        ("data-timeline", row.timeline),
                        ("data-count", len(members)),
                        ("data-start", members[0].lsn),
                        ("data-end", members[-1].lsn),
                    ],
                    title=f"{len(members)} restore points from {members[0].lsn} to "
                    f"{members[-1].lsn}: {names}{more}",
                    inner=_flag(x, top, bar),
                )
            )
        return out
    label_end = -math.inf
    for p in ordered:
        x = scale.x(p.lsn)
        name = _short(p.name, _MAX_NAME)
        text = ""
        if x > label_end + 4 and x + 9 + len(name) * _CHAR_PX <= scale.right + _RIGHT:
            text = (
                f'<text class="rp-name" x="{_num(x + 9)}" y="{_num(top + 8)}">{_esc(name)}</text>'
            )
            label_end = x + 9 + len(name) * _CHAR_PX
        out.append(
            _el(
                "g",
                [
                    ("class", "restore-point"),
                    ("data-name", p.name),
                    ("data-lsn", p.lsn),
                    ("data-timeline", p.timeline),
                ],
                title=f"restore point {p.name!r} at {p.lsn} on timeline {p.timeline}",
                inner=_flag(x, top, bar) + text,
            )
        )
    return out


def _flag(x: float, top: float, bottom: float) -> str:
    return _el(
        "path", [("class", "rp-pole"), ("d", f"M{_num(x)} {_num(top)}V{_num(bottom)}")]
    ) + _el(
        "path",
        [
            ("class", "rp-flag"),
            ("d", f"M{_num(x)} {_num(top)}l7 3.5l-7 3.5Z"),
        ],
    )


# --------------------------------------------------------------------------- lanes


def _lane_element(
    row: _Row,
    index: int,
    marks: Sequence[BackupMark],
    gaps: Sequence[GapMark],
    points: Sequence[RestorePointMark],
    scale: _Scale,
    width: int,
    drills: dict[str, list[DrillMark]],
    chosen_id: str | None,
    biggest_bin: int,
) -> str:
    lane = row.lane
    parts = [
        _el(
            "rect",
            [
                ("class", "lane-row"),
                ("x", 0.0),
                ("y", row.top),
                ("width", width),
                ("height", _ROW_H),
            ],
        ),
        f'<text class="lane-label" x="8" y="{_num(row.top + _ROW_H / 2 - 2)}">'
        f"timeline {row.timeline}</text>",
    ]
    if lane is None:
        sub = "no WAL, no history"
    elif lane.parent is not None and lane.switchpoint is not None:
        sub = f"from {lane.parent} at {lane.switchpoint}"
    elif not lane.runs:
        sub = "no WAL archived"
    else:
        sub = _plural(sum(r.segments for r in lane.runs), "segment")
    parts.append(
        f'<text class="lane-sub" x="8" y="{_num(row.top + _ROW_H / 2 + 11)}">{_esc(sub)}</text>'
    )
    if lane is not None and _placed(lane):
        parts.append(
            _el(
                "line",
                [
                    ("class", "lane-extent"),
                    ("x1", scale.x(lane.start)),
                    ("x2", scale.x(lane.end)),
                    ("y1", row.bar_mid),
                    ("y2", row.bar_mid),
                ],
            )
        )
    aggregate = len(marks) > (scale.right - scale.left) / _PX_PER_BACKUP
    chosen = next((b for b in marks if b.id == chosen_id), None)
    windowed = [b for b in marks if b.recoverable_to is not None and b.stop is not None]
    parts += _window_unions(row, windowed, scale)
    if not aggregate:  # each window over their union: darker where more backups reach
        others = [b for b in windowed if b is not chosen]
        opacity = min(0.15, max(0.015, 1 - 0.7 ** (1 / max(1, len(others)))))
        parts += (_window_element(b, row, scale, opacity) for b in others)
    if chosen is not None and chosen.recoverable_to is not None and chosen.stop is not None:
        parts.append(_window_element(chosen, row, scale, None))
    if lane is not None:
        parts += _run_elements(row, lane.runs, scale)
    parts += _gap_elements(row, gaps, scale)
    parts += _restore_point_elements(row, points, scale)
    if aggregate:
        rest = [b for b in marks if b is not chosen]
        for members in _bins(rest, lambda b: scale.x(b.start), scale):
            parts += _backup_bin_elements(row, members, scale, drills, biggest_bin)
    else:
        for b in marks:
            if b is chosen:
                continue
            ds = drills.get(b.id, ())
            parts.append(_backup_element(b, row, scale, ds, chosen=False))
            if ds:
                parts.append(_drill_element(b, row, scale, ds))
    if chosen is not None:
        ds = drills.get(chosen.id, ())
        parts.append(_backup_element(chosen, row, scale, ds, chosen=True))
        if ds:
            parts.append(_drill_element(chosen, row, scale, ds))
    return _el(
        "g",
        [
            ("class", "lane alt" if index % 2 else "lane"),
            ("data-timeline", row.timeline),
            ("data-parent", None if lane is None else lane.parent),
            ("data-switchpoint", None if lane is None else lane.switchpoint),
            ("data-start", lane.start if lane is not None and _placed(lane) else None),
            ("data-end", lane.end if lane is not None and _placed(lane) else None),
            ("data-backups", len(marks)),
            ("data-gaps", len(gaps)),
            ("data-aggregated", aggregate or None),
        ],
        inner="".join(parts),
    )


def _fork_elements(rows: Sequence[_Row], scale: _Scale) -> list[str]:
    by_tli = {r.timeline: r for r in rows}
    out = []
    for row in rows:
        lane = row.lane
        if lane is None or lane.parent is None or lane.switchpoint is None:
            continue
        parent = by_tli.get(lane.parent)
        if parent is None:
            continue
        x = scale.x(lane.switchpoint)
        out.append(
            _el(
                "g",
                [
                    ("class", "fork"),
                    ("data-timeline", row.timeline),
                    ("data-parent", lane.parent),
                    ("data-switchpoint", lane.switchpoint),
                ],
                title=f"timeline {row.timeline} forks from timeline {lane.parent} "
                f"at {lane.switchpoint}",
                inner=_el(
                    "path",
                    [
                        ("class", "fork-line"),
                        ("d", f"M{_num(x)} {_num(parent.bar_mid)}V{_num(row.bar_mid)}"),
                    ],
                )
                + _el(
                    "circle",
                    [("class", "fork-dot"), ("cx", x), ("cy", parent.bar_mid), ("r", 3.0)],
                ),
            )
        )
    return out


def _target_elements(view: TimelineView, rows: Sequence[_Row], scale: _Scale) -> list[str]:
    target = view.target
    if target is None:
        return []
    chosen = view.backup(target.backup_id)
    by_tli = {r.timeline: r for r in rows}
    # On its timeline's lane; when the view has none (the timeline is not known), on the
    # chosen backup's.
    row = by_tli.get(target.timeline) or (by_tli.get(chosen.timeline) if chosen else None)
    about = f"recovery target: {target.description}, from backup {target.backup_id}"
    if chosen is None:
        about += " (not in the picture)"
    label = target.description
    if not label.lower().startswith("target"):
        label = f"target: {label}"
    text = _esc(_short(label, _MAX_TARGET_TEXT))
    if target.lsn is None or row is None:
        y = _HEADER_H - 4 + len(rows) * _ROW_H + _AXIS_H - 2
        return [
            _el(
                "text",
                [
                    ("class", "target-label target-note"),
                    ("data-backup", target.backup_id),
                    ("data-timeline", target.timeline),
                    ("x", scale.left),
                    ("y", y),
                ],
                title=about + " (its position in the WAL is not known: a time target)",
                inner=text + " (a time: not placed on the WAL axis)",
            )
        ]
    x = scale.x(target.lsn)
    right = x > (scale.left + scale.right) / 2
    return [
        _el(
            "line",
            [
                ("class", "target"),
                ("data-backup", target.backup_id),
                ("data-lsn", target.lsn),
                ("data-timeline", target.timeline),
                ("data-description", target.description),
                ("x1", x),
                ("x2", x),
                ("y1", row.top + 2),
                ("y2", row.top + _ROW_H - 2),
            ],
            title=f"{about}, at {target.lsn}"
            + (f" on timeline {target.timeline}" if target.timeline in by_tli else ""),
        ),
        _el(
            "text",
            [
                ("class", "target-label"),
                ("x", x - 5 if right else x + 5),
                ("y", row.top + _ROW_H - 5),
                ("text-anchor", "end" if right else None),
            ],
            inner=text,
        ),
    ]


def _background(rows: Sequence[_Row], scale: _Scale, width: int) -> str:
    """The lanes' rows shaded in turn, and the axis's grid lines over them (under
    everything else)."""
    parts = [
        _el(
            "rect",
            [
                ("class", "lane-bg alt" if i % 2 else "lane-bg"),
                ("x", 0.0),
                ("y", row.top),
                ("width", width),
                ("height", _ROW_H),
            ],
        )
        for i, row in enumerate(rows)
    ]
    bottom = _HEADER_H + len(rows) * _ROW_H + 6
    for value in _ticks(scale):
        x = scale.x(LSN(value))
        parts.append(
            _el(
                "line", [("class", "grid"), ("x1", x), ("x2", x), ("y1", _HEADER_H), ("y2", bottom)]
            )
        )
    return f'<g class="background">{"".join(parts)}</g>'


def _axis_elements(scale: _Scale, top: float) -> list[str]:
    out = [
        _el(
            "line",
            [
                ("class", "axis-line"),
                ("x1", scale.left),
                ("x2", scale.right),
                ("y1", top),
                ("y2", top),
            ],
        )
    ]
    for value in _ticks(scale):
        lsn = LSN(value)
        x = scale.x(lsn)
        out.append(
            _el(
                "g",
                [("class", "tick"), ("data-lsn", lsn), ("data-x", x)],
                title=f"WAL position {lsn}",
                inner=_el("line", [("x1", x), ("x2", x), ("y1", top), ("y2", top + 5)])
                + f'<text x="{_num(x)}" y="{_num(top + 17)}" text-anchor="middle">{lsn}</text>',
            )
        )
    out.append(
        f'<text class="note" x="{_num(scale.right)}" y="{_num(top + 30)}" '
        'text-anchor="end">WAL position (LSN)</text>'
    )
    return out


def _legend_items() -> list[tuple[str, str]]:
    """(label, swatch drawn at the origin, 14 px wide) for the legend."""
    diamond = "M7 -6L11.5 0L7 6L2.5 0Z"
    return [
        (
            "archived WAL",
            _el(
                "rect",
                [("class", "lg-run"), ("x", 0.0), ("y", -4.0), ("width", 14.0), ("height", 8.0)],
            ),
        ),
        (
            "missing WAL",
            _el(
                "rect",
                [("class", "lg-gap"), ("x", 3.0), ("y", -7.0), ("width", 8.0), ("height", 14.0)],
            ),
        ),
        ("backup (done)", _el("path", [("class", "lg-done"), ("d", diamond)])),
        ("failed", _el("path", [("class", "lg-failed"), ("d", "M3 -4L11 4M3 4L11 -4")])),
        ("in progress", _el("path", [("class", "lg-in-progress"), ("d", diamond)])),
        ("pinned", _pin(7.0, 6.0).replace('class="pin"', 'class="lg-pin"')),
        (
            "recoverable window",
            _el(
                "rect",
                [
                    ("class", "lg-window"),
                    ("x", 0.0),
                    ("y", -6.0),
                    ("width", 14.0),
                    ("height", 12.0),
                ],
            ),
        ),
        (
            "backups (count)",
            _el(
                "rect",
                [("class", "lg-bin"), ("x", 5.0), ("y", -7.0), ("width", 4.0), ("height", 14.0)],
            ),
        ),
        (
            "restore point",
            _el("path", [("class", "lg-rp"), ("d", "M4 -7l7 3.5l-7 3.5Z")])
            + _el("path", [("class", "rp-pole"), ("d", "M4 -7V7")]),
        ),
        ("drill ok", _el("path", [("class", "lg-drill ok"), ("d", "M7 -5v10")])),
        ("drill failed", _el("path", [("class", "lg-drill bad"), ("d", "M7 -5v10")])),
        ("target", _el("path", [("class", "lg-target"), ("d", "M7 -7v14")])),
        (
            "chosen backup",
            _el("circle", [("class", "lg-chosen"), ("cx", 7.0), ("cy", 0.0), ("r", 6.0)]),
        ),
    ]


def _legend(top: float, width: int) -> tuple[str, float]:
    """The legend's markup from ``top`` and its height."""
    x, y = _LEFT, top + _LEGEND_ROW_H / 2
    parts = []
    for label, swatch in _legend_items():
        w = 14 + 5 + len(label) * _CHAR_PX + 14
        if x + w > width - 8 and x > _LEFT:
            x, y = _LEFT, y + _LEGEND_ROW_H
        parts.append(
            f'<g transform="translate({_num(x)} {_num(y)})">{swatch}'
            f'<text x="19" y="4">{_esc(label)}</text></g>'
        )
        x += w
    height = y - top + _LEGEND_ROW_H / 2 + _LEGEND_PAD
    return f'<g class="legend">{"".join(parts)}</g>', height


# --------------------------------------------------------------------------- summary


def _summary(view: TimelineView) -> str:
    counts = _state_counts(view.backups)
    parts = [
        _plural(len(view.lanes), "timeline"),
        _plural(len(view.backups), "backup")
        + (
            " (" + ", ".join(f"{n} {state.value}" for state, n in counts.items() if n) + ")"
            if view.backups
            else ""
        ),
        _plural(len(view.gaps), "gap") + (" in the WAL" if view.gaps else ""),
    ]
    if view.generated_at is not None:
        parts.append(f"as of {_time(view.generated_at)}")
    return " \u00b7 ".join(parts)


def _state_counts(backups: Iterable[BackupMark]) -> dict[BackupState, int]:
    counts = dict.fromkeys(BackupState, 0)
    for b in backups:
        counts[b.state] += 1
    return counts


def _drills_by_backup(drills: Iterable[DrillMark]) -> dict[str, list[DrillMark]]:
    out: dict[str, list[DrillMark]] = {}
    for d in sorted(drills, key=lambda d: d.started_at):
        out.setdefault(d.backup_id, []).append(d)
    return out


# --------------------------------------------------------------------------- public


def render_svg(view: TimelineView, *, width: int = 1000) -> str:
    """The picture of ``view`` as one self-contained ``<svg>`` element, ``width``
    pixels wide (at least :data:`MIN_WIDTH`; the height follows from the number of
    timelines). See the module docstring for what is drawn and how to find it.

    Raises :class:`ValueError` for a width that is not an int of at least
    :data:`MIN_WIDTH`.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < MIN_WIDTH:
        raise ValueError(f"the width of the picture must be an int >= {MIN_WIDTH}, not {width!r}")
    rows = _rows(view)
    scale = _scale(view, width)
    drills = _drills_by_backup(view.drills)
    chosen_id = view.target.backup_id if view.target is not None else None
    by_tli: dict[int, list[BackupMark]] = {}
    for b in sorted(view.backups, key=lambda b: (b.start.value, b.id)):
        by_tli.setdefault(b.timeline, []).append(b)
    gaps: dict[int, list[GapMark]] = {}
    for g in view.gaps:
        gaps.setdefault(g.timeline, []).append(g)
    points: dict[int, list[RestorePointMark]] = {}
    for p in view.restore_points:
        points.setdefault(p.timeline, []).append(p)

    plot = scale.right - scale.left
    biggest = 1
    for marks in by_tli.values():
        if len(marks) > plot / _PX_PER_BACKUP:
            rest = [b for b in marks if b.id != chosen_id]
            sizes = map(len, _bins(rest, lambda b: scale.x(b.start), scale))
            biggest = max(biggest, *sizes, 1)

    lanes_bottom = _HEADER_H + len(rows) * _ROW_H
    axis_top = lanes_bottom + 6
    legend, legend_h = _legend(lanes_bottom + _AXIS_H + 4, width)
    height = lanes_bottom + _AXIS_H + 4 + legend_h
    summary = _summary(view)

    body = [f"<style>{_STYLE}</style>"]
    body.append(
        _el("rect", [("class", "bg"), ("x", 0.0), ("y", 0.0), ("width", width), ("height", height)])
    )
    body.append('<text class="header-title" x="8" y="19">What is recoverable</text>')
    body.append(
        f'<text class="header-summary" x="{width - 8}" y="19" text-anchor="end">'
        f"{_esc(summary)}</text>"
    )
    body.append(_background(rows, scale, width))
    for i, row in enumerate(rows):
        body.append(
            _lane_element(
                row,
                i,
                by_tli.get(row.timeline, []),
                gaps.get(row.timeline, []),
                points.get(row.timeline, []),
                scale,
                width,
                drills,
                chosen_id,
                biggest,
            )
        )
    if not rows:
        body.append(
            f'<text class="note" x="{_num(scale.left)}" y="{_num(_HEADER_H + 20)}">'
            "nothing to draw: no timeline, no WAL, no backup</text>"
        )
    body.append(f'<g class="forks">{"".join(_fork_elements(rows, scale))}</g>')
    body.append(f'<g class="axis">{"".join(_axis_elements(scale, axis_top))}</g>')
    body += _target_elements(view, rows, scale)
    body.append(legend)
    return _el(
        "svg",
        [
            ("xmlns", "http://www.w3.org/2000/svg"),
            ("class", "pgsnap-timeline"),
            ("width", width),
            ("height", height),
            ("viewBox", f"0 0 {width} {_num(height)}"),
            ("role", "img"),
            ("aria-label", f"what is recoverable: {summary}"),
            ("data-lsn-min", LSN(scale.lo)),
            ("data-lsn-max", LSN(scale.hi)),
            ("data-plot-left", scale.left),
            ("data-plot-right", scale.right),
            ("data-segment-size", view.segment_size),
        ],
        title=f"what is recoverable: {summary}",
        inner="".join(body),
    )


_PAGE_STYLE: Final = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#222}
h1{font-size:18px;margin:0 0 8px}
h2{font-size:14px;margin:20px 0 6px}
figure{margin:0;overflow-x:auto}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f6f8}
td.num{text-align:right}
.missing{color:#b00000;font-weight:600}
.muted{color:#666}
"""


def _lane_table(view: TimelineView) -> str:
    gaps: dict[int, list[GapMark]] = {}
    for g in view.gaps:
        gaps.setdefault(g.timeline, []).append(g)
    rows = []
    for lane in view.lanes:
        fork = f"{lane.parent} at {lane.switchpoint}" if lane.parent is not None else ""
        wal = f"{lane.runs[0].start} \u2013 {lane.end}" if lane.runs else "none"
        lane_gaps = sorted(gaps.get(lane.timeline, []), key=lambda g: g.start.value)
        cells = [
            f"{g.first_missing} ({_plural(g.segments, 'segment')}, {g.start} \u2013 {g.end})"
            for g in lane_gaps[:_MAX_TABLE_GAPS]
        ]
        if len(lane_gaps) > _MAX_TABLE_GAPS:
            cells.append(f"\u2026 and {len(lane_gaps) - _MAX_TABLE_GAPS} more")
        gap_cell = (
            '<span class="missing">' + "<br>".join(map(_esc, cells)) + "</span>"
            if cells
            else '<span class="muted">none</span>'
        )
        rows.append(
            f'<tr data-timeline="{lane.timeline}"><td>{lane.timeline}</td><td>{_esc(fork)}</td>'
            f"<td>{_esc(wal)}</td>"
            f'<td class="num">{sum(r.segments for r in lane.runs)}</td><td>{gap_cell}</td></tr>'
        )
    return (
        '<table class="lanes"><thead><tr><th>Timeline</th><th>Forks from</th>'
        "<th>WAL archived</th><th>Segments</th><th>Missing WAL</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _backup_table(view: TimelineView) -> str:
    counts = _state_counts(view.backups)
    rows = [
        f'<tr data-state="{state.value}"><td>{state.value}</td><td class="num">{n}</td></tr>'
        for state, n in counts.items()
    ]
    recoverable = sum(b.recoverable_to is not None for b in view.backups)
    pinned = sum(b.pinned for b in view.backups)
    rows.append(f'<tr><td>recoverable (with a window)</td><td class="num">{recoverable}</td></tr>')
    rows.append(f'<tr><td>pinned</td><td class="num">{pinned}</td></tr>')
    rows.append(f'<tr><th>total</th><th class="num">{len(view.backups)}</th></tr>')
    return (
        '<table class="backups"><thead><tr><th>Backups</th><th>Count</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def render_html(view: TimelineView, *, title: str = "pgsnap: what is recoverable") -> str:
    """A complete standalone HTML5 page: ``title``, the picture of ``view``
    (:func:`render_svg`) and under it a summary of the timelines (their archived WAL
    and its gaps) and of the backups (counts by state). No script, no external
    resource."""
    extra = []
    if view.target is not None:
        t = view.target
        where = f" at {t.lsn}" if t.lsn is not None else ""
        extra.append(
            f'<p class="target">Recovery target: <b>{_esc(t.description)}</b>{_esc(where)} '
            f"on timeline {t.timeline}, from backup <code>{_esc(t.backup_id)}</code>.</p>"
        )
    if view.restore_points or view.drills:
        failed = sum(not d.ok for d in view.drills)
        extra.append(
            f"<p>{_plural(len(view.restore_points), 'restore point')}, "
            f"{_plural(len(view.drills), 'drill')} ({failed} failed).</p>"
        )
    generated = (
        f'<p class="muted">As of {_esc(_time(view.generated_at))}.</p>'
        if view.generated_at is not None
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_esc(title)}</title>\n<style>{_PAGE_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{_esc(title)}</h1>\n{generated}\n"
        f"<figure>{render_svg(view)}</figure>\n"
        f"{''.join(extra)}\n"
        f"<h2>Timelines</h2>\n{_lane_table(view)}\n"
        f"<h2>Backups</h2>\n{_backup_table(view)}\n"
        "</body>\n</html>\n"
    )
