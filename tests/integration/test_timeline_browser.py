"""The "what is recoverable" page in a real browser (headless Chromium): the geometry the
browser renders puts the missing WAL where the archive lacks it and the recovery target
inside its chosen backup's window; a screenshot is kept as a test artefact
(``$PGSNAP_TEST_ARTIFACTS``, else ``test-artifacts/`` at the repository's root)."""

import html
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pgsnap.model import LSN, BackupState, Pin
from pgsnap.testing.catalog_conformance import backup_record, drill_record
from pgsnap.timeline import TargetMark, build_timeline
from pgsnap.timeline.svg import render_html
from pgsnap.wal import ArchiveIndex, TimelineGraph, parse_history, segment_name

pytestmark = pytest.mark.xdist_group("browser")

SEG = 16 << 20
CHOSEN = "b-2-2c"
TARGET_LSN = LSN.parse("0/35000000")
GAP_START, GAP_END = LSN.parse("0/28000000"), LSN.parse("0/29000000")
TIMEOUT = 60  # seconds for one Chromium run (a second or two when the machine is idle)
REPO = Path(__file__).resolve().parents[2]

# Measures, once the page is laid out, what the browser drew; the JSON goes into
# <pre id="result"> (only in the test's copy of the page: the library writes no script).
CHECK_SCRIPT = """
<script>
(function () {
  function box(el) {
    if (!el) { return null; }
    var r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
            width: r.width, height: r.height};
  }
  var out;
  try {
    var all = function (s) { return Array.prototype.slice.call(document.querySelectorAll(s)); };
    var gap = document.querySelector('.gap[data-timeline="2"]');
    var target = document.querySelector('.target');
    var chosen = document.querySelector('.window.chosen');
    out = {
      gap: box(gap),
      gap_data: gap && {start: gap.dataset.start, end: gap.dataset.end,
                        first_missing: gap.dataset.firstMissing},
      lane: box(document.querySelector('.lane[data-timeline="2"]')),
      runs: all('.run[data-timeline="2"]').map(function (e) {
        var b = box(e); b.start = e.dataset.start; b.end = e.dataset.end; return b;
      }),
      window: box(chosen),
      window_data: chosen && {backup: chosen.dataset.backup, start: chosen.dataset.start,
                              end: chosen.dataset.end},
      target: box(target),
      target_data: target && {backup: target.dataset.backup, lsn: target.dataset.lsn},
      ticks: all('.tick').map(function (e) {
        return {lsn: e.dataset.lsn, x: box(e.querySelector('line')).left};
      })
    };
  } catch (e) {
    out = {error: String(e && e.stack || e)};
  }
  var pre = document.createElement('pre');
  pre.id = 'result';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def chromium():
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("no chromium on this machine: apt-get install chromium")
    return path


def run_chromium(binary, profile, *args):
    """Chromium headless on ``args``: its completed process (stderr is noise unless
    something went wrong)."""
    argv = [
        binary,
        "--headless=new",
        "--no-sandbox",  # required as root
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        pytest.fail(f"chromium did not finish in {TIMEOUT} s: {argv}\n{tail!r}")


def backup(backup_id, tli, segno, offset=0x28, **changes):
    start = LSN(segno * SEG + offset)
    fields = dict(
        start_lsn=str(start), start_timeline=tli, stop_lsn=str(start + 0x100000), stop_timeline=tli
    )
    fields.update(changes)
    return backup_record(backup_id, segno, **fields)


def the_view():
    """Three timelines (2 forks from 1, 3 from 2), ~100 backups, segment 0x28 missing
    on timeline 2, a target at 0/35000000 on timeline 2 recovered from ``b-2-2c``."""
    names = [segment_name(1, n, SEG) for n in range(1, 0x20)]
    names += [segment_name(2, n, SEG) for n in range(0x1F, 0x40) if n != GAP_START.value // SEG]
    names += [segment_name(3, n, SEG) for n in range(0x3A, 0x51)]
    h2 = "1\t0/1F800000\tno recovery target specified\n"
    h3 = h2 + "2\t0/3A400000\tbefore 2026-11-30 12:00:00+00\n"
    graph = TimelineGraph.from_histories([parse_history(h2, 2), parse_history(h3, 3)])
    backups = [backup(f"b-1-{n:02x}", 1, n) for n in range(2, 0x1F)]
    for n in range(0x20, 0x3A):
        backups += [backup(f"b-2-{n:02x}", 2, n), backup(f"b-2-{n:02x}x", 2, n, 0x800000)]
    backups += [backup(f"b-3-{n:02x}", 3, n) for n in range(0x3B, 0x50)]
    backups[4] = backup("b-1-06", 1, 6, state=BackupState.FAILED, failure_reason="x")
    backups[9] = backup("b-1-0b", 1, 0xB, pin=Pin("audit"))
    drills = [drill_record("d1", "b-1-05"), drill_record("d2", CHOSEN, minutes=1)]
    view = build_timeline(
        backups,
        ArchiveIndex.build(names, SEG),
        graph,
        restore_points=[(LSN.parse("0/30000100"), "before-migration", 2)],
        drills=drills,
    )
    assert 90 <= len(view.backups) <= 110
    return view.with_target(TargetMark(f"lsn {TARGET_LSN}", CHOSEN, 2, TARGET_LSN))


def artifacts_dir():
    where = os.environ.get("PGSNAP_TEST_ARTIFACTS")
    path = Path(where) if where else REPO / "test-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def x_on_axis(ticks, lsn):
    """Where the axis's rendered ticks put ``lsn`` (linear between the two around it)."""
    points = sorted((LSN.parse(t["lsn"]).value, t["x"]) for t in ticks)
    assert len(points) >= 2, ticks
    (v0, x0), (v1, x1) = points[0], points[-1]
    for (a, xa), (b, xb) in itertools.pairwise(points):
        if a <= lsn.value <= b:
            (v0, x0), (v1, x1) = (a, xa), (b, xb)
            break
    return x0 + (lsn.value - v0) * (x1 - x0) / (v1 - v0)


def test_rendered_geometry_and_screenshot(tmp_path):
    binary = chromium()
    page = render_html(the_view())
    checked = tmp_path / "checked.html"
    checked.write_text(page.replace("</body>", CHECK_SCRIPT + "</body>"), encoding="utf-8")
    plain = tmp_path / "timeline.html"
    plain.write_text(page, encoding="utf-8")

    done = run_chromium(binary, tmp_path / "profile-dom", "--dump-dom", checked.as_uri())
    found = re.search(r'<pre id="result">(.*?)</pre>', done.stdout, re.DOTALL)
    if found is None:
        pytest.fail(
            f"chromium (exit {done.returncode}) dumped no result; its stderr ends:\n"
            + done.stderr[-3000:]
        )
    result = json.loads(html.unescape(found.group(1)))
    assert "error" not in result, result["error"]

    # The missing segment: between the runs before and after it, standing out of them,
    # on timeline 2's lane, where the axis says 0/28000000..0/29000000 is.
    gap, lane, runs = result["gap"], result["lane"], result["runs"]
    assert gap is not None and lane is not None, result
    assert result["gap_data"] == {
        "start": str(GAP_START),
        "end": str(GAP_END),
        "first_missing": segment_name(2, GAP_START.value // SEG, SEG),
    }
    before = next(r for r in runs if r["end"] == str(GAP_START))
    after = next(r for r in runs if r["start"] == str(GAP_END))
    assert before["right"] <= after["left"]
    assert gap["left"] == pytest.approx(before["right"], abs=1.0)
    assert gap["right"] == pytest.approx(after["left"], abs=1.0)
    assert gap["width"] >= 3
    assert lane["top"] <= gap["top"] < gap["bottom"] <= lane["bottom"]
    for run in (before, after):
        assert lane["top"] <= run["top"] < run["bottom"] <= lane["bottom"]
        assert gap["top"] < run["top"] and run["bottom"] < gap["bottom"]  # visible around it
    assert gap["left"] == pytest.approx(x_on_axis(result["ticks"], GAP_START), abs=1.5)
    assert gap["right"] == pytest.approx(x_on_axis(result["ticks"], GAP_END), abs=1.5)

    # The target: a line on timeline 2's lane, inside the chosen backup's window band.
    window, target = result["window"], result["target"]
    assert result["window_data"]["backup"] == CHOSEN
    assert result["target_data"] == {"backup": CHOSEN, "lsn": str(TARGET_LSN)}
    x = (target["left"] + target["right"]) / 2
    assert window["left"] < x < window["right"], (window, target)
    assert x == pytest.approx(x_on_axis(result["ticks"], TARGET_LSN), abs=1.5)
    assert lane["top"] <= target["top"] < target["bottom"] <= lane["bottom"]
    assert target["height"] > lane["height"] / 2
    start = LSN.parse(result["window_data"]["start"])
    end = LSN.parse(result["window_data"]["end"])
    assert window["left"] == pytest.approx(x_on_axis(result["ticks"], start), abs=1.5)
    assert window["right"] == pytest.approx(x_on_axis(result["ticks"], end), abs=1.5)
    assert end == LSN.parse("0/40000000")  # the chosen backup reaches the end of timeline 2

    # A screenshot of the page as the library writes it, kept for people to look at.
    png = artifacts_dir() / "timeline.png"
    png.unlink(missing_ok=True)
    shot = run_chromium(
        binary,
        tmp_path / "profile-shot",
        f"--screenshot={png}",
        "--window-size=1200,700",
        plain.as_uri(),
    )
    if not png.exists():
        pytest.fail(
            f"chromium (exit {shot.returncode}) wrote no screenshot; its stderr ends:\n"
            + shot.stderr[-3000:]
        )
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 5000, len(data)
