"""Benchmark: index 1,000,000 archived WAL names and check continuity.

Run: ``python benchmarks/bench_wal_index.py``. Targets: under 1 s and under
200 MB for ``ArchiveIndex.build`` + ``check`` on 1,000,000 names (16 MiB
segments, 3 timelines, a few gaps). Reports pass/fail as text; never asserts.

Two measurements, because tracing allocations slows Python down several times:

* wall time: ``time.perf_counter`` around build + check, without tracemalloc
  (best of 3 runs);
* peak memory: ``tracemalloc`` peak of the Python allocations made by build +
  check in a separate, traced run. The input list of names is created before
  tracing starts, so it is not counted (it is the caller's memory).

The names are listed in a shuffled order (a directory listing is not sorted),
and the strings are created in that order, as ``os.scandir`` would.
"""

from __future__ import annotations

import gc
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgsnap.model import LSN
from pgsnap.wal import (
    ArchiveIndex,
    TimelineGraph,
    check,
    parse_history,
    segment_name,
)

SEGSZ = 16 * 1024 * 1024
N = 1_000_000
TARGET_SECONDS = 1.0
TARGET_BYTES = 200 * 1024 * 1024


def make_names() -> tuple[list[str], TimelineGraph, set[tuple[int, int]]]:
    """1M segment names on timelines 1 → 2 → 3, a few gaps, plus history/backup/partial."""
    sw1, sw2 = 400_000, 700_000  # segment numbers where timelines 2 and 3 begin
    keys = [(1, s) for s in range(sw1 + 10)]  # the old timeline ran on a bit past the fork
    keys += [(2, s) for s in range(sw1, sw2 + 5)]
    keys += [(3, s) for s in range(sw2, N - 15)]
    removed = {(1, 1_000), (1, 123_456), (2, 500_000), (3, 900_000), (3, 900_001)}
    keys = [k for k in keys if k not in removed]
    rnd = random.Random(42)
    rnd.shuffle(keys)
    names = [segment_name(t, s, SEGSZ) for t, s in keys]
    names += [
        "00000002.history",
        "00000003.history",
        "000000010000000000000010.00000028.backup",
        segment_name(1, sw1, SEGSZ) + ".partial",
    ]
    sp1 = LSN(sw1 * SEGSZ + 0x28)
    sp2 = LSN(sw2 * SEGSZ + 0x1000)
    h3 = parse_history(f"1\t{sp1}\tno recovery target specified\n\n2\t{sp2}\tx\n", 3)
    return names, TimelineGraph.from_histories([h3]), removed


def run(names: list[str], graph: TimelineGraph) -> tuple[ArchiveIndex, object]:
    index = ArchiveIndex.build(names, SEGSZ)
    result = check(index, (1, LSN(16 * SEGSZ + 0x28)), None, 3, graph)
    return index, result


def main() -> None:
    names, graph, removed = make_names()
    print(f"{len(names):,} names, {SEGSZ // (1024 * 1024)} MiB segments, {len(removed)} gaps")

    times = []
    index, result = run(names, graph)
    for _ in range(3):
        gc.collect()
        t0 = time.perf_counter()
        index, result = run(names, graph)
        times.append(time.perf_counter() - t0)
    wall = min(times)

    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    traced_index, _ = run(names, graph)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del traced_index

    print(f"index: {index!r}")
    print(f"check: {result.summary()}")  # type: ignore[attr-defined]
    print(f"missing: {result.missing}")  # type: ignore[attr-defined]
    ok_t = wall < TARGET_SECONDS
    ok_m = peak < TARGET_BYTES
    runs = ", ".join(f"{t:.3f}" for t in times)
    print(
        f"wall time (build + check, best of 3 untraced runs: {runs} s): {wall:.3f} s "
        f"- target < {TARGET_SECONDS:.0f} s: {'PASS' if ok_t else 'FAIL'}"
    )
    print(
        f"peak memory (tracemalloc peak of build + check): {peak / 2**20:.1f} MiB "
        f"- target < {TARGET_BYTES // 2**20} MB: {'PASS' if ok_m else 'FAIL'}"
    )
    print("overall:", "PASS" if ok_t and ok_m else "FAIL")


if __name__ == "__main__":
    main()
