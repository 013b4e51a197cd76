"""The "what is recoverable" picture (pgsnap.timeline.svg): well-formed SVG, one lane per
timeline, gaps, backups, windows and the target findable by their data attributes,
user text escaped, and a bounded output at 10,000 backups."""

import datetime as dt
import xml.etree.ElementTree as ET

import attrs
import pytest

from pgsnap.model import LSN, BackupState, Pin
from pgsnap.testing.catalog_conformance import backup_record, drill_record
from pgsnap.timeline import TargetMark, TimelineView, build_timeline
from pgsnap.timeline.svg import render_html, render_svg
from pgsnap.wal import ArchiveIndex, TimelineGraph, parse_history, segment_name

SEG = 16 << 20
SVG = "{http://www.w3.org/2000/svg}"
T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)

# Timeline 1: segments 1..0x1F; timeline 2 forks at 0/1F800000 and holds 0x1F..0x3F
# without 0x28; timeline 3 forks from 2 at 0/3A400000 and holds 0x3A..0x50.
HISTORY_2 = "1\t0/1F800000\tno recovery target specified\n"
HISTORY_3 = HISTORY_2 + "2\t0/3A400000\tbefore 2026-11-30 12:00:00+00\n"
MISSING = (2, 0x28)


def archive(missing=(MISSING,)):
    names = [segment_name(1, n, SEG) for n in range(1, 0x20)]
    names += [segment_name(2, n, SEG) for n in range(0x1F, 0x40)]
    names += [segment_name(3, n, SEG) for n in range(0x3A, 0x51)]
    gone = {segment_name(t, n, SEG) for t, n in missing}
    return ArchiveIndex.build([n for n in names if n not in gone], SEG)


def graph():
    return TimelineGraph.from_histories([parse_history(HISTORY_2, 2), parse_history(HISTORY_3, 3)])


def lsn(segno, offset=0x28):
    return str(LSN(segno * SEG + offset))


def backup(backup_id, tli, segno, offset=0x28, minutes=0.0, **changes):
    start = LSN(segno * SEG + offset)
    fields = dict(
        start_lsn=str(start),
        start_timeline=tli,
        stop_lsn=str(start + 0x100000),
        stop_timeline=tli,
    )
    fields.update(changes)
    return backup_record(backup_id, minutes, **fields)


def hundred_backups():
    """About 100 backups over the three timelines, a few failed, one in progress,
    some pinned; ``b-2-2a`` starts after timeline 2's gap (the chosen one)."""
    out = []
    for n in range(2, 0x1F):
        out.append(backup(f"b-1-{n:02x}", 1, n, minutes=n))
    for n in range(0x20, 0x3A):
        out.append(backup(f"b-2-{n:02x}", 2, n, minutes=n))
        out.append(backup(f"b-2-{n:02x}x", 2, n, offset=0x800000, minutes=n + 0.5))
    for n in range(0x3B, 0x50):
        out.append(backup(f"b-3-{n:02x}", 3, n, minutes=n))
    out[3] = attrs.evolve(out[3], state=BackupState.FAILED, stop_lsn=None, stop_timeline=None)
    out[20] = attrs.evolve(out[20], state=BackupState.FAILED, failure_reason="snapshot failed")
    out[-1] = attrs.evolve(out[-1], state=BackupState.STARTED, stop_lsn=None, stop_timeline=None)
    out[5] = attrs.evolve(out[5], pin=Pin("legal hold"))
    return out


def drills():
    ok = drill_record("d1", "b-1-05", minutes=100)
    bad = attrs.evolve(drill_record("d2", "b-3-40", minutes=101), ok=False)
    return [ok, bad]


CHOSEN = "b-2-2a"
TARGET = TargetMark("lsn 0/35000000", CHOSEN, 2, LSN.parse("0/35000000"))


def view_of(backups=None, **kwargs):
    return build_timeline(
        hundred_backups() if backups is None else backups,
        archive(),
        graph(),
        restore_points=[(LSN.parse("0/30000100"), "before-migration", 2)],
        drills=drills(),
        now=T0,
        **kwargs,
    )


def parse(svg):
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def by_class(root, name):
    return [e for e in root.iter() if name in (e.get("class") or "").split()]


def title_of(element):
    t = element.find(f"{SVG}title")
    return "" if t is None else t.text or ""


# --------------------------------------------------------------------------- tests


def test_svg_is_well_formed_and_self_contained():
    svg = render_svg(view_of())
    root = parse(svg)
    assert root.get("viewBox", "").startswith("0 0 1000 ")
    assert root.get("width") == "1000"
    assert root.find(f"{SVG}style") is not None
    assert "<script" not in svg.lower()
    assert "href" not in svg  # no external resource, no link
    assert "http://" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_one_lane_per_timeline_stacked_in_order():
    root = parse(render_svg(view_of()))
    lanes = by_class(root, "lane")
    assert [lane.get("data-timeline") for lane in lanes] == ["1", "2", "3"]
    tops = [float(by_class(lane, "lane-row")[0].get("y")) for lane in lanes]
    assert tops == sorted(tops) and len(set(tops)) == 3
    assert lanes[1].get("data-parent") == "1" and lanes[1].get("data-switchpoint") == "0/1F800000"
    assert lanes[2].get("data-parent") == "2" and lanes[2].get("data-switchpoint") == "0/3A400000"
    texts = ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]
    assert {"timeline 1", "timeline 2", "timeline 3"} <= set(texts)
    forks = by_class(root, "fork")
    assert sorted((g.get("data-parent"), g.get("data-timeline")) for g in forks) == [
        ("1", "2"),
        ("2", "3"),
    ]


def test_gap_names_the_missing_segment_between_its_runs():
    root = parse(render_svg(view_of()))
    (gap,) = by_class(root, "gap")
    assert gap.get("data-timeline") == "2"
    assert gap.get("data-first-missing") == "000000020000000000000028"
    assert gap.get("data-start") == "0/28000000" and gap.get("data-end") == "0/29000000"
    assert gap.get("data-segments") == "1"
    assert "000000020000000000000028" in title_of(gap) and "1 segment" in title_of(gap)
    lane2 = next(g for g in by_class(root, "lane") if g.get("data-timeline") == "2")
    assert gap in list(lane2.iter())
    runs = sorted(by_class(lane2, "run"), key=lambda r: float(r.get("x")))
    assert [(r.get("data-start"), r.get("data-end")) for r in runs] == [
        ("0/1F000000", "0/28000000"),
        ("0/29000000", "0/40000000"),
    ]
    before_end = float(runs[0].get("x")) + float(runs[0].get("width"))
    x0, x1 = float(gap.get("x")), float(gap.get("x")) + float(gap.get("width"))
    assert before_end == pytest.approx(x0, abs=0.2)
    assert x1 == pytest.approx(float(runs[1].get("x")), abs=0.2)
    assert float(gap.get("height")) > float(runs[0].get("height"))  # stands out of the bar


def test_tiny_gap_is_still_visible():
    names = [segment_name(1, n, SEG) for n in range(1, 20000) if n != 9000]
    view = build_timeline([], ArchiveIndex.build(names, SEG), TimelineGraph())
    root = parse(render_svg(view))
    (gap,) = by_class(root, "gap")
    assert float(gap.get("width")) >= 3
    assert gap.get("data-first-missing") == segment_name(1, 9000, SEG)


def test_backups_windows_and_states():
    view = view_of()
    root = parse(render_svg(view))
    marks = {b.get("data-id"): b for b in by_class(root, "backup")}
    assert len(marks) == len(view.backups)
    b = marks["b-1-02"]
    assert b.get("data-state") == "done" and "done" in b.get("class").split()
    assert b.get("data-start") == lsn(2)
    assert b.get("data-window-start") == str(LSN(2 * SEG + 0x28 + 0x100000))
    assert b.get("data-window-end") == "0/20000000"
    assert "recoverable from" in title_of(b)
    failed = [m for m in marks.values() if m.get("data-state") == "failed"]
    assert len(failed) == 2 and all("failed" in m.get("class").split() for m in failed)
    assert all(m.get("data-window-end") is None for m in failed)
    (started,) = (m for m in marks.values() if m.get("data-state") == "started")
    assert "in-progress" in started.get("class").split()
    (pinned,) = (m for m in marks.values() if m.get("data-pinned") == "true")
    assert by_class(pinned, "pin") and "pinned" in title_of(pinned)
    windows = {w.get("data-backup"): w for w in by_class(root, "window")}
    done_with_window = {
        b.id for b in view.backups if b.state is BackupState.DONE and b.recoverable_to
    }
    assert set(windows) == done_with_window
    w = windows["b-1-02"]
    assert (w.get("data-start"), w.get("data-end")) == (
        b.get("data-window-start"),
        b.get("data-window-end"),
    )
    # the backups before the gap on timeline 2 cannot get past it
    assert windows["b-2-20"].get("data-end") == "0/28000000"
    assert windows[CHOSEN].get("data-end") == "0/40000000"


def test_drills_and_restore_points():
    root = parse(render_svg(view_of()))
    drills = {d.get("data-backup"): d for d in by_class(root, "drill")}
    assert drills["b-1-05"].get("data-ok") == "true" and "ok" in drills["b-1-05"].get("class")
    assert drills["b-3-40"].get("data-ok") == "false" and "FAILED" in title_of(drills["b-3-40"])
    (rp,) = by_class(root, "restore-point")
    assert rp.get("data-name") == "before-migration" and rp.get("data-lsn") == "0/30000100"
    assert "before-migration" in "".join(rp.itertext())


def test_axis_ticks_are_lsns_in_order():
    root = parse(render_svg(view_of()))
    ticks = by_class(root, "tick")
    assert 3 <= len(ticks) <= 12
    values = [LSN.parse(t.get("data-lsn")).value for t in ticks]
    xs = [float(t.get("data-x")) for t in ticks]
    assert values == sorted(values) and xs == sorted(xs)
    assert [t.find(f"{SVG}text").text for t in ticks] == [t.get("data-lsn") for t in ticks]
    assert by_class(root, "legend")


def test_target_line_and_chosen_backup():
    view = view_of().with_target(TARGET)
    root = parse(render_svg(view))
    (line,) = by_class(root, "target")
    assert line.get("data-backup") == CHOSEN and line.get("data-lsn") == "0/35000000"
    assert line.get("data-timeline") == "2"
    (chosen,) = (b for b in by_class(root, "backup") if "chosen" in b.get("class").split())
    assert chosen.get("data-id") == CHOSEN and by_class(chosen, "chosen-ring")
    (window,) = (w for w in by_class(root, "window") if "chosen" in w.get("class").split())
    assert window.get("data-backup") == CHOSEN
    x = float(line.get("x1"))
    assert float(window.get("x")) < x < float(window.get("x")) + float(window.get("width"))
    texts = "".join(root.itertext())
    assert "target: lsn 0/35000000" in texts
    # no target: no line, no highlight
    plain = parse(render_svg(view_of()))
    assert not by_class(plain, "target") and not by_class(plain, "chosen")


def test_time_target_is_noted_without_a_line():
    view = view_of().with_target(TargetMark("time 2026-11-30 12:00", CHOSEN, 2, None))
    root = parse(render_svg(view))
    assert not by_class(root, "target")
    (note,) = by_class(root, "target-note")
    assert note.get("data-backup") == CHOSEN
    assert by_class(root, "chosen")


def test_target_on_an_unknown_timeline_is_drawn_on_its_backups_lane():
    # a plan that does not say its timeline (plan_target gives 0)
    view = view_of().with_target(TargetMark("target lsn 0/35000000", CHOSEN, 0, TARGET.lsn))
    root = parse(render_svg(view))
    assert [g.get("data-timeline") for g in by_class(root, "lane")] == ["1", "2", "3"]
    (line,) = by_class(root, "target")
    lane2 = next(g for g in by_class(root, "lane") if g.get("data-timeline") == "2")
    row = by_class(lane2, "lane-row")[0]
    assert float(row.get("y")) <= float(line.get("y1")) < float(line.get("y2"))
    assert float(line.get("y2")) <= float(row.get("y")) + float(row.get("height"))
    (label,) = by_class(root, "target-label")
    assert label.text == "target lsn 0/35000000"
    assert "timeline 0" not in title_of(line)
    # neither its timeline nor its backup in the view: a note, no line
    lost = view_of().with_target(TargetMark("latest", "", 0, TARGET.lsn))
    root = parse(render_svg(lost))
    assert not by_class(root, "target") and by_class(root, "target-note")


HOSTILE = "<script>alert('x')</script> \"quoted\" & more \x00\x1b"


def test_hostile_text_is_escaped():
    backups = [backup("b-evil", 1, 3, label=HOSTILE), backup("b-ok", 1, 5)]
    view = build_timeline(
        backups,
        archive(),
        graph(),
        restore_points=[(LSN.parse("0/5000000"), HOSTILE, 1)],
    ).with_target(TargetMark(HOSTILE, "b-evil", 1, LSN.parse("0/6000000")))
    for svg in (render_svg(view), render_html(view, title=HOSTILE)):
        assert "<script" not in svg
        assert "\x00" not in svg and "\x1b" not in svg
    root = parse(render_svg(view))
    (evil,) = (b for b in by_class(root, "backup") if b.get("data-id") == "b-evil")
    assert evil.get("data-label") == HOSTILE.replace("\x00", "\ufffd").replace("\x1b", "\ufffd")
    assert "<script>alert('x')</script>" in title_of(evil)
    (rp,) = by_class(root, "restore-point")
    assert rp.get("data-name").startswith("<script>")
    assert by_class(root, "target")[0].get("data-description").startswith("<script>")


def test_ten_thousand_backups_are_aggregated_and_bounded():
    backups = [
        backup(f"b-{i:05d}", 2, 0x2A + i * 0x14 // 10000, offset=(i * 7919) % SEG, minutes=i)
        for i in range(10000)
    ]
    chosen = backups[4321].id
    target = TargetMark("latest", chosen, 2, LSN.parse("0/3F000000"))
    view = view_of(backups).with_target(target)
    svg = render_svg(view)
    assert len(svg.encode()) < 1_000_000, len(svg)
    root = parse(svg)
    bins = by_class(root, "backup-bin")
    assert bins
    singles = by_class(root, "backup")
    assert [b.get("data-id") for b in singles] == [chosen]
    assert sum(int(b.get("data-count")) for b in bins) + len(singles) == 10000
    assert len(bins) <= 1000 // 4 + 1
    assert max(int(b.get("data-count")) for b in bins) > 1
    first = bins[0]
    assert title_of(first).startswith(f"{first.get('data-count')} backups, ids b-00000 .. ")
    assert by_class(root, "window-union")
    (window,) = by_class(root, "window")
    assert window.get("data-backup") == chosen
    (lane2,) = (g for g in by_class(root, "lane") if g.get("data-timeline") == "2")
    assert lane2.get("data-aggregated") == "true" and lane2.get("data-backups") == "10000"


def test_few_backups_are_not_aggregated():
    root = parse(render_svg(view_of()))
    assert not by_class(root, "backup-bin")
    lane = next(g for g in by_class(root, "lane") if g.get("data-timeline") == "1")
    assert lane.get("data-aggregated") is None
    # the union of the windows on timeline 1, and each window over it
    (union,) = by_class(lane, "window-union")
    assert (union.get("data-start"), union.get("data-end")) == (lsn(2, 0x100028), "0/20000000")
    assert len(by_class(lane, "window")) == int(union.get("data-backups"))


def test_many_gaps_are_binned():
    names = [segment_name(1, n, SEG) for n in range(1, 20001) if n % 2]
    view = build_timeline([], ArchiveIndex.build(names, SEG), TimelineGraph())
    assert len(view.gaps) == 9999
    svg = render_svg(view)
    assert len(svg.encode()) < 1_000_000
    root = parse(svg)
    assert not by_class(root, "gap")
    bins = by_class(root, "gap-bin")
    assert bins and sum(int(b.get("data-count")) for b in bins) == 9999
    assert bins[0].get("data-first-missing") == segment_name(1, 2, SEG)


def test_empty_and_degenerate_views():
    empty = TimelineView(segment_size=SEG, lanes=(), gaps=(), backups=())
    root = parse(render_svg(empty))
    assert not by_class(root, "lane")
    # timeline 1 is always in the graph, even with no WAL: a lane without a bar
    one = build_timeline([], ArchiveIndex.build([], SEG), TimelineGraph())
    root = parse(render_svg(one))
    assert [g.get("data-timeline") for g in by_class(root, "lane")] == ["1"]
    assert not by_class(root, "run")
    # a backup on a timeline the archive and the histories do not know still gets a row
    stray = build_timeline([backup("b-9", 9, 3)], archive(), graph())
    root = parse(render_svg(stray))
    assert [g.get("data-timeline") for g in by_class(root, "lane")] == ["1", "2", "3", "9"]


@pytest.mark.parametrize("width", [320, 640, 2400])
def test_widths(width):
    root = parse(render_svg(view_of().with_target(TARGET), width=width))
    assert root.get("width") == str(width)
    assert float(root.get("data-plot-right")) <= width


@pytest.mark.parametrize("width", [0, 100, 319, True, 1000.0])
def test_bad_width(width):
    with pytest.raises(ValueError, match="width"):
        render_svg(view_of(), width=width)


def test_repr_html_is_the_svg():
    view = view_of().with_target(TARGET)
    assert view._repr_html_() == render_svg(view)


def test_render_html_page():
    view = view_of().with_target(TARGET)
    page = render_html(view)
    assert page.startswith("<!DOCTYPE html>")
    assert "<title>pgsnap: what is recoverable</title>" in page
    assert render_svg(view) in page
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert "000000020000000000000028" in page.split("</svg>", 1)[1]  # in the table too
    # the page's tables are well-formed too (XHTML-like enough for ElementTree)
    body = page.split("</figure>", 1)[1].split("</body>", 1)[0]
    tables = ET.fromstring(f"<div>{body.replace('<br>', '<br/>')}</div>")
    lanes = tables.find("table[@class='lanes']")
    assert lanes is not None
    assert [tr.get("data-timeline") for tr in lanes.iter("tr") if tr.get("data-timeline")] == [
        "1",
        "2",
        "3",
    ]
    states = {
        tr.get("data-state"): "".join(tr.itertext())
        for tr in tables.iter("tr")
        if tr.get("data-state")
    }
    assert states["failed"] == "failed2" and states["started"] == "started1"


def test_output_is_deterministic():
    assert render_svg(view_of().with_target(TARGET)) == render_svg(view_of().with_target(TARGET))
