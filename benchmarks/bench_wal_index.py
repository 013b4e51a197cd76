"""Benchmark: list a real archive directory of 1,000,000 WAL files, index it and check it.

Run::

    python benchmarks/bench_wal_index.py                        # 1,000,000 files, 5 runs
    python benchmarks/bench_wal_index.py --dir /big/x --keep    # keep the files for next time
    python benchmarks/bench_wal_index.py --smoke                # 10,000 files, 2 runs (seconds)

Target: what planning does with the archive of 1,000,000 segments (16 MiB
segments, 3 timelines, 5 gaps) takes under 1 s and under 200 MB. It prints the
figures and "met" / "NOT met"; it never asserts.

The archive is a real directory: ``--names`` files (default 1,000,000) are created
in ``--dir`` (default: a new directory under ``/tmp``, removed at the end unless
``--keep``): the segments as sparse 16 MiB files (no data blocks, one inode each,
so that a size check sees the right size), two ``.history`` files and a ``.backup``
file with real content, and a ``.partial`` segment. The names are created in a
shuffled order. With ``--keep`` the directory is left, with a manifest next to it,
and reused by the next run that asks for the same ``--dir`` and ``--names``.

Each row is one whole operation on that directory, measured ``--runs`` times, each
time in a fresh Python process (``pgsnap`` imported before the clock starts), the
order of the rows rotated from run to run:

- ``os.listdir`` alone: the floor (reading the directory);
- planning's archive pass, as :meth:`pgsnap.observe.Observer.recovery_facts` makes
  it: ``DirectoryWalArchive(dir).index(seg, check_sizes=False)`` (one listing, no
  stat), ``archive.histories(index.history_names)`` (the history files found in
  that listing, read), and ``pgsnap.wal.check`` from a backup on timeline 1 to the
  end of timeline 3 (as the recovery planner checks a candidate backup);
- ``pgsnap wal``'s archive pass, as ``pgsnap.cli.cmd_wal`` makes it:
  ``archive.index(seg)`` (the default ``check_sizes=True``: every file is
  stat'ed), ``archive.histories()`` (which lists the directory a second time) and
  the ranges and gaps of each timeline;
- the same with the histories taken from the index's names (no second listing),
  to show what the second listing costs;
- ``ArchiveIndex.build`` + ``check`` on the names already in memory (the listing
  done before the clock starts): the part that the earlier version of this
  benchmark timed alone.

For each run: the wall time of the operation (``time.perf_counter``), the peak
RSS of the process (``VmHWM``: interpreter, imports and the operation; its RSS
just before the operation is printed too), and, in a second fresh process, the
``tracemalloc`` peak of the operation (Python allocations only, which tracing
slows down several times, hence its own process). Every run is reported; the
summary gives min, median and max. The page cache is warm (the directory was
just created or listed): a cold listing of a million entries costs more.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import table

from pgsnap.model import LSN
from pgsnap.wal import ArchiveIndex, TimelineGraph, WalCheck, check, segment_name
from pgsnap.wal.archive import DirectoryWalArchive

SEGSZ = 16 * 1024 * 1024
MB = 1000 * 1000
TARGET_SECONDS = 1.0
TARGET_BYTES = 200 * 1000 * 1000
MANIFEST_VERSION = 1
SEED = 42

METHODS: dict[str, str] = {
    "listdir": "os.listdir alone (the floor)",
    "plan": "planning: index(check_sizes=False) + histories(index names) + check",
    "wal": "pgsnap wal: index() [stat each] + histories() [2nd listing] + ranges/gaps",
    "wal-one-listing": "index() [stat each] + histories(index names) + ranges/gaps",
    "build-check": "(part) ArchiveIndex.build + check, names in memory",
}
TARGET_METHOD = "plan"


# --------------------------------------------------------------------------- the archive


def layout(n: int) -> tuple[list[tuple[int, int]], set[tuple[int, int]], int, int]:
    """The segments (timeline, segno) of an archive of about ``n`` files on timelines
    1 -> 2 -> 3 with five gaps, the gaps, and the two switch segments."""
    sw1, sw2 = n * 2 // 5, n * 7 // 10  # segment numbers where timelines 2 and 3 begin
    keys = [(1, s) for s in range(sw1 + 10)]  # the old timeline ran on a bit past the fork
    keys += [(2, s) for s in range(sw1, sw2 + 5)]
    keys += [(3, s) for s in range(sw2, n - 15)]
    removed = {
        (1, n // 1000),
        (1, n // 8),
        (2, n // 2),
        (3, n * 9 // 10),
        (3, n * 9 // 10 + 1),
    }
    return [k for k in keys if k not in removed], removed, sw1, sw2


def history_texts(sw1: int, sw2: int) -> dict[str, str]:
    sp1 = LSN(sw1 * SEGSZ + 0x28)
    sp2 = LSN(sw2 * SEGSZ + 0x1000)
    return {
        "00000002.history": f"1\t{sp1}\tno recovery target specified\n",
        "00000003.history": (
            f"1\t{sp1}\tno recovery target specified\n\n2\t{sp2}\tno recovery target specified\n"
        ),
    }


BACKUP_NAME = "000000010000000000000010.00000028.backup"
BACKUP_TEXT = (
    "START WAL LOCATION: 0/10000028 (file 000000010000000000000010)\n"
    "STOP WAL LOCATION: 0/10000100 (file 000000010000000000000010)\n"
    "CHECKPOINT LOCATION: 0/10000060\n"
    "BACKUP METHOD: streamed\n"
    "BACKUP FROM: primary\n"
    "START TIME: 2026-11-30 12:00:00 UTC\n"
    "LABEL: bench\n"
    "START TIMELINE: 1\n"
    "STOP TIME: 2026-11-30 12:00:01 UTC\n"
    "STOP TIMELINE: 1\n"
)


def manifest_for(n: int) -> dict[str, Any]:
    return {"version": MANIFEST_VERSION, "names": n, "seed": SEED, "segment_size": SEGSZ}


def create_archive(path: Path, n: int, say: Callable[[str], None]) -> float:
    """Create the archive's files in the empty directory ``path``; return the seconds taken."""
    keys, _removed, sw1, sw2 = layout(n)
    random.Random(SEED).shuffle(keys)
    t0 = time.perf_counter()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    base = str(path)
    step = max(1, len(keys) // 10)
    for i, (tli, seg) in enumerate(keys, 1):
        fd = os.open(os.path.join(base, segment_name(tli, seg, SEGSZ)), flags, 0o600)
        try:
            os.ftruncate(fd, SEGSZ)  # sparse: the right size, no data blocks
        finally:
            os.close(fd)
        if i % step == 0:
            say(
                f"  created {i:,} of {len(keys):,} segment files ({time.perf_counter() - t0:.0f} s)"
            )
    for name, text in history_texts(sw1, sw2).items():
        (path / name).write_text(text)
    (path / BACKUP_NAME).write_text(BACKUP_TEXT)
    with open(path / (segment_name(1, sw1, SEGSZ) + ".partial"), "wb") as fh:
        fh.truncate(SEGSZ)
    return time.perf_counter() - t0


def prepare(
    args: argparse.Namespace, say: Callable[[str], None]
) -> tuple[Path, Path, Callable[[], None]]:
    """The archive directory (made or reused), its manifest, and how to clean up."""
    made_root = False
    if args.dir:
        root = Path(args.dir).resolve()
        if not root.exists():
            root.mkdir(parents=True)
            made_root = True
    else:
        root = Path(tempfile.mkdtemp(prefix="pgsnap-bench-wal-index-", dir="/tmp"))
        made_root = True
    archive = root / "archive"
    manifest = root / "manifest.json"
    wanted = manifest_for(args.names)

    def cleanup() -> None:
        if args.keep:
            say(f"kept {archive} (--names {args.names:,}) and {manifest} for the next run")
            return
        shutil.rmtree(archive, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            manifest.unlink()
        if made_root:
            with contextlib.suppress(OSError):
                root.rmdir()

    current = None
    with contextlib.suppress(FileNotFoundError, ValueError):
        current = json.loads(manifest.read_text())
    if current == wanted and archive.is_dir():
        say(f"reusing {archive} (--names {args.names:,}, manifest {manifest})")
        return archive, manifest, cleanup
    if archive.exists():
        say(f"{archive} does not match {manifest_for(args.names)}: made again")
        shutil.rmtree(archive)
    with contextlib.suppress(FileNotFoundError):
        manifest.unlink()
    free = os.statvfs(root).f_favail
    if free < args.names + 1000:
        raise SystemExit(
            f"refusing to run: {free:,} free inodes on {root}, {args.names:,} files needed"
        )
    archive.mkdir()
    say(f"creating {args.names:,} files in {archive} (sparse segments, shuffled order) ...")
    took = create_archive(archive, args.names, say)
    manifest.write_text(json.dumps(wanted) + "\n")
    say(f"created in {took:.1f} s")
    return archive, manifest, cleanup


# --------------------------------------------------------------------------- child


def check_start() -> tuple[int, LSN]:
    """A backup's start on timeline 1, checked to the end of timeline 3."""
    return 1, LSN(16 * SEGSZ + 0x28)


def _status_kb(field: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def _ranges_and_gaps(index: ArchiveIndex, graph: TimelineGraph) -> int:
    """What ``pgsnap wal`` computes per timeline; returns the number of gaps."""
    gaps = 0
    for tli in sorted(set(index.timelines()) | set(graph.timelines())):
        [list(r.names(SEGSZ)) for r in index.ranges(tli)]
        gaps += len([list(g.names(SEGSZ)) for g in index.gaps(tli)])
    return gaps


def child(method: str, path: str, trace: bool) -> dict[str, Any]:
    """One measured operation in this fresh process; returns its figures."""
    names: list[str] | None = None
    graph: TimelineGraph | None = None
    if method == "build-check":
        names = os.listdir(path)  # not timed: the caller's list
        graph = DirectoryWalArchive(path).histories([n for n in names if n.endswith(".history")])
    rss_before = _status_kb("VmRSS")
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    outcome: WalCheck | int | None = None
    index: ArchiveIndex | None = None
    if method == "listdir":
        outcome = len(os.listdir(path))
    elif method == "plan":
        archive = DirectoryWalArchive(path)
        index = archive.index(SEGSZ, check_sizes=False)
        outcome = check(index, check_start(), None, 3, archive.histories(index.history_names))
    elif method in ("wal", "wal-one-listing"):
        archive = DirectoryWalArchive(path)
        index = archive.index(SEGSZ)
        graph = archive.histories() if method == "wal" else archive.histories(index.history_names)
        outcome = _ranges_and_gaps(index, graph)
    elif method == "build-check":
        assert names is not None
        assert graph is not None
        index = ArchiveIndex.build(names, SEGSZ)
        outcome = check(index, check_start(), None, 3, graph)
    else:
        raise SystemExit(f"unknown method {method!r}")
    seconds = time.perf_counter() - t0
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out: dict[str, Any] = {
        "seconds": seconds,
        "rss_before_kb": rss_before,
        "hwm_kb": _status_kb("VmHWM"),
        "traced_peak": peak,
    }
    if index is not None:
        out["index"] = repr(index)
        out["segments"] = sum(r.count for t in index.timelines() for r in index.ranges(t))
    if isinstance(outcome, WalCheck):
        out["check"] = outcome.summary()
        out["missing"] = list(outcome.missing)
    elif isinstance(outcome, int):
        out["count"] = outcome
    return out


# --------------------------------------------------------------------------- parent


def run_child(method: str, path: Path, trace: bool) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", method, "--dir", str(path)]
    if trace:
        argv.append("--trace")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{method} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_wall"] = wall
    return out


def stats(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "-"
    med = fmt.format(statistics.median(values))
    if len(values) == 1:
        return med
    return f"{med} ({fmt.format(min(values))} .. {fmt.format(max(values))})"


def verdict(values: Sequence[float], limit: float) -> str:
    """'met' when every run is under ``limit``, else 'NOT met' with how many were not."""
    over = sum(1 for v in values if v >= limit)
    if not over:
        return f"met (all {len(values)} runs)"
    return f"NOT met ({over} of {len(values)} runs over)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=1_000_000, help="files in the archive")
    parser.add_argument("--runs", type=int, default=5, help="runs of each row (default 5)")
    parser.add_argument("--dir", help="scratch directory (default: a new one under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the files for the next run")
    parser.add_argument("--smoke", action="store_true", help="10,000 files, 2 runs")
    parser.add_argument("--child", choices=sorted(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.dir, args.trace)))
        return 0
    if args.smoke:
        args.names, args.runs = 10_000, 2
    if args.names < 1000 or args.runs < 1:
        parser.error("--names must be >= 1000 and --runs >= 1")

    def say(msg: str) -> None:
        print(msg, flush=True)

    say(
        f"bench_wal_index: {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, "
        f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    archive, _manifest, cleanup = prepare(args, say)
    try:
        keys, removed, _sw1, _sw2 = layout(args.names)
        say(
            f"archive: {len(keys) + 4:,} files ({len(keys):,} segments of 16 MiB, sparse; "
            f"timelines 1 -> 2 -> 3, {len(removed)} gaps; 2 .history, 1 .backup, 1 .partial)"
        )
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        traced: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        order = list(METHODS)
        for n in range(args.runs):
            rotated = order[n % len(order) :] + order[: n % len(order)]
            parts = []
            for method in rotated:
                r = run_child(method, archive, trace=False)
                results[method].append(r)
                traced[method].append(run_child(method, archive, trace=True))
                parts.append(f"{method} {r['seconds']:.3f} s / {r['hwm_kb'] * 1024 / MB:.0f} MB")
            say(f"run {n + 1}: " + "; ".join(parts))

        first = results[TARGET_METHOD][0]
        say("")
        say(f"index: {first['index']}")
        say(f"check: {first['check']}")
        say(f"missing: {first['missing']}")
        for m in ("wal", "wal-one-listing", "build-check"):
            if results[m][0].get("segments") != first.get("segments"):
                say(f"MISMATCH: {m} indexed {results[m][0].get('segments')} segments")

        say("")
        say(f"== {args.runs} run(s) of each, each in a fresh process: median (min .. max) ==")
        rows = []
        for m, label in METHODS.items():
            rs = results[m]
            rows.append(
                [
                    label,
                    stats([r["seconds"] for r in rs]),
                    stats([r["hwm_kb"] * 1024 / MB for r in rs], "{:.0f}"),
                    stats([r["rss_before_kb"] * 1024 / MB for r in rs], "{:.0f}"),
                    stats([t["traced_peak"] / MB for t in traced[m]], "{:.1f}"),
                ]
            )
        say(
            table(
                rows,
                [
                    "operation",
                    "wall (s)",
                    "peak RSS (MB)",
                    "RSS before (MB)",
                    "tracemalloc peak (MB)",
                ],
            )
        )
        say("")
        say(
            "peak RSS: VmHWM of the measuring process (interpreter + imports + the operation); "
            "RSS before: its VmRSS just before the operation; tracemalloc peak: Python "
            "allocations of the operation alone, in a separate traced process"
        )
        plan = results[TARGET_METHOD]
        walls = [r["seconds"] for r in plan]
        rsses = [r["hwm_kb"] * 1024 for r in plan]
        say("")
        say(
            f"planning's archive pass over {len(keys) + 4:,} files: "
            f"{statistics.median(walls):.3f} s median, {max(walls):.3f} s slowest "
            f"(target < {TARGET_SECONDS:.0f} s): {verdict(walls, TARGET_SECONDS)}"
        )
        say(
            f"its process peak RSS: {statistics.median(rsses) / MB:.0f} MB median, "
            f"{max(rsses) / MB:.0f} MB largest (target < {TARGET_BYTES // 1000**2} MB): "
            f"{verdict(rsses, TARGET_BYTES)}"
        )
    finally:
        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
