"""Benchmark: pgsnap's WAL reader against pg_waldump on the same segments.

Run: ``python benchmarks/bench_walreader.py`` (see benchmarks/README.md). Target:
the commit/restore-point extraction (:func:`pgsnap.wal.reader.scan_events`)
within 3x of ``pg_waldump`` on one core, in MB of WAL per second. Prints the
figures and the ratios; never asserts.

What it does:

1. creates a throwaway cluster (PostgreSQL 15 by default) with 16 MB WAL
   segments, ``fsync = on`` (and no checkpoint while it runs: ``max_wal_size``
   4 GB, ``checkpoint_timeout`` 1 h), archiving into its own directory;
2. ``pgbench -i`` (scale 10) and a checkpoint; then pgbench's TPC-B-like
   transactions (8 clients, one-second runs, a restore point after each run)
   until ``--segments`` whole segments are written, twice:

   - "after a checkpoint", at once: the first touch of a page after a
     checkpoint writes a full-page image, so most of this WAL is images in
     large records;
   - "steady state", after ``--warmup`` seconds more of pgbench (by then
     nearly every page has had its image): small records, a commit every
     few hundred bytes (the hard case for a reader that walks each record in
     Python);

3. measures each stretch, ``--runs`` times each method, in turns (the order rotated per run), every
   process pinned to the same CPU:

   - ``pgsnap``: :func:`~pgsnap.wal.reader.scan_events` in a fresh Python process
     (``Verify.TAIL``, the default; also ``Verify.RECORDS`` and ``Verify.ALL``),
     timed inside the process (the scan, without the interpreter's start);
   - ``pg_waldump`` printing every record (to /dev/null), wall time;
   - ``pg_waldump -r Transaction -r XLOG``: printing only the resource
     managers of commits and restore points (to /dev/null), wall time;
   - ``pgsnap.wal.dump.scan_wal``: today's pipeline (pg_waldump's whole text
     read and parsed in Python), timed inside its process;

4. prints the times (median, min, max), MB/s (1 MB = 2**20 bytes of the
   stretch scanned), the ratios of the medians to both pg_waldump runs, each
   method's peak resident memory (one more run under GNU time, ``%M``), and
   checks that the reader and scan_wal found the same commits and restore
   points.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgsnap.model import LSN
from pgsnap.testing.pgserver import PgServer, SettingValue, find_postgres_bindir
from pgsnap.wal import TimelineSpan

MB = 1024 * 1024
SEGSZ = 16 * MB
TARGET_RATIO = 3.0


# --------------------------------------------------------------------------- child mode


def child(args: argparse.Namespace) -> None:
    """Run one extraction in this (fresh) process and print JSON with its figures."""
    from pgsnap.wal import dump as waldump  # noqa: PLC0415 - after the baseline
    from pgsnap.wal import reader as walreader  # noqa: PLC0415 - after the baseline

    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spans = [TimelineSpan(1, None, None)]
    start, end = LSN.parse(args.start), LSN.parse(args.end)
    t0 = time.perf_counter()
    if args.child == "reader":
        events = walreader.scan_events(
            [args.dir], spans, start, end, verify=walreader.Verify(args.verify)
        )
    else:
        events = waldump.scan_wal(Path(args.waldump), [args.dir], spans, start, end, timeout=3600)
    seconds = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    commits = hashlib.sha256(
        repr([(str(c[0]), c[1].isoformat(), c[2]) for c in events.commits]).encode()
    ).hexdigest()
    points = hashlib.sha256(repr([(str(p[0]), p[1]) for p in events.restore_points]).encode())
    print(
        json.dumps(
            {
                "seconds": seconds,
                "commits": len(events.commits),
                "commits_sha256": commits,
                "restore_points": len(events.restore_points),
                "restore_points_sha256": points.hexdigest(),
                "complete": events.complete,
                "base_kb": base_kb,
                "peak_kb": peak_kb,
            }
        )
    )


# --------------------------------------------------------------------------- measuring


def run_measured(argv: list[str], *, capture: bool) -> dict[str, Any]:
    """Run ``argv``: wall time, exit code, and its stdout when captured."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    return {
        "wall": time.perf_counter() - t0,
        "stdout": proc.stdout.decode() if capture else "",
        "stderr": proc.stderr.decode(errors="replace"),
        "rc": proc.returncode,
    }


def peak_rss_mb(argv: list[str]) -> tuple[float | None, str]:
    """Peak resident memory of ``argv`` run under GNU time (None without it), and its output.

    Through GNU time, not from ``wait4`` here: a child's ``ru_maxrss`` starts at
    the RSS of the process it was forked from, and this one is larger than
    pg_waldump.
    """
    gnu_time = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if gnu_time is None:
        return None, ""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as out:
        proc = subprocess.run(
            [gnu_time, "-f", "%M", "-o", out.name, *argv],
            capture_output=True,
            check=False,
        )
        text = out.read().strip().splitlines()
    stdout = proc.stdout.decode() if "--child" in argv else ""
    if proc.returncode != 0 or not text or not text[-1].isdigit():
        return None, stdout
    return int(text[-1]) / 1024, stdout


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


# --------------------------------------------------------------------------- workload


def insert_lsn(server: PgServer) -> LSN:
    return LSN.parse(server.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0])


def pgbench_until(server: PgServer, pgbench: list[str], env: dict[str, str], end: LSN) -> int:
    """One-second pgbench runs (a restore point after each) until the WAL reaches ``end``."""
    runs = 0
    while insert_lsn(server) < end:
        pgbench_for(pgbench, env, 1)
        runs += 1
        server.sql("SELECT pg_create_restore_point(%s)", (f"bench-{runs}",))
    return runs


def pgbench_for(pgbench: list[str], env: dict[str, str], seconds: int) -> str:
    proc = subprocess.run(
        [*pgbench, "-T", str(seconds), "postgres"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return next((ln for ln in proc.stdout.splitlines() if ln.startswith("tps")), "").strip()


def next_segment(server: PgServer) -> LSN:
    """Switch WAL; the start of the segment where the next record goes."""
    server.sql("SELECT pg_switch_wal()")
    at = insert_lsn(server)
    return LSN(at.value - at.value % SEGSZ)


def make_wal(
    server: PgServer, bindir: Path, args: argparse.Namespace
) -> list[tuple[str, LSN, LSN]]:
    """The two stretches of WAL: (label, start, end), whole segments each."""
    env = {
        **os.environ,
        "PGHOST": str(server.socket_dir),
        "PGPORT": str(server.port),
        "PGUSER": "postgres",
    }
    pgbench = [str(bindir / "pgbench"), "-n", "-c", str(args.clients), "-j", "2"]
    t0 = time.perf_counter()
    subprocess.run(
        [str(bindir / "pgbench"), "-i", "-q", "-s", str(args.scale), "postgres"],
        env=env,
        check=True,
        capture_output=True,
    )
    server.sql("CHECKPOINT")
    print(f"pgbench -i -s {args.scale}: {time.perf_counter() - t0:.1f} s, then CHECKPOINT")
    stretches = []
    for label in ("after a checkpoint", "steady state"):
        if label == "steady state":
            t1 = time.perf_counter()
            tps = pgbench_for(pgbench, env, args.warmup)
            print(f"warm-up (every page gets its image): {time.perf_counter() - t1:.0f} s, {tps}")
        start = next_segment(server)
        end = LSN(start.value + args.segments * SEGSZ)
        t1 = time.perf_counter()
        runs = pgbench_until(server, pgbench, env, end)
        took = time.perf_counter() - t1
        print(f"{label}: WAL from {start} to {end}: {runs} runs of 1 s, {took:.0f} s")
        stretches.append((label, start, end))
    next_segment(server)
    server.wait_for_archive_idle(timeout=600)
    return stretches


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=6, help="16 MB segments per stretch")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument(
        "--warmup", type=int, default=60, help="seconds of pgbench before the steady stretch"
    )
    parser.add_argument("--bindir", type=Path, help="PostgreSQL binaries (default: 15)")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU the measured processes run on")
    parser.add_argument("--child", choices=["reader", "scan_wal"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    parser.add_argument("--end", help=argparse.SUPPRESS)
    parser.add_argument("--verify", default="tail", help=argparse.SUPPRESS)
    parser.add_argument("--waldump", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    bindir = args.bindir or find_postgres_bindir(15)
    waldump = bindir / "pg_waldump"
    if not waldump.exists() or not (bindir / "pgbench").exists():
        sys.exit(
            f"no pg_waldump or pgbench in {bindir}: pass --bindir (apt-get install postgresql-15)"
        )
    print(
        f"bench_walreader: {time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; measured processes pinned to CPU {args.cpu}"
    )
    settings: dict[str, SettingValue] = {
        "fsync": True,
        "max_wal_size": "4GB",
        "checkpoint_timeout": "1h",
    }
    server = PgServer.create(bindir, wal_segsize_mb=16, settings=settings)
    scratch = Path(tempfile.mkdtemp(prefix="pgsnap-bench-wal-"))
    try:
        server.start()
        print(f"PostgreSQL {server.version_num} in {server.base_dir}, 16 MB segments, fsync=on")
        stretches = make_wal(server, bindir, args)
        server.stop()
        for label, start, end in stretches:
            # The stretch's segments only, in a directory of their own.
            wal = scratch / label.replace(" ", "-")
            wal.mkdir()
            for segno in range(start.value // SEGSZ, end.value // SEGSZ):
                name = f"{1:08X}{segno // 256:08X}{segno % 256:08X}"
                shutil.copy(server.archive_dir / name, wal / name)
            measure(args, label, waldump, wal, start, end)
    finally:
        server.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)


def measure(
    args: argparse.Namespace, label: str, waldump: Path, wal: Path, start: LSN, end: LSN
) -> None:
    span_mb = (end.value - start.value) / MB
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--dir", str(wal), "--start", str(start), "--end", str(end)]
    dump = [str(waldump), "-p", str(wal), "-s", str(start), "-e", str(end)]
    reader = [*me, "--child", "reader", *common]
    methods: dict[str, list[str]] = {
        "pgsnap scan_events (Verify.TAIL)": reader,
        "pgsnap scan_events (Verify.RECORDS)": [*reader, "--verify", "records"],
        "pgsnap scan_events (Verify.ALL)": [*reader, "--verify", "all"],
        "pg_waldump (every record printed)": dump,
        "pg_waldump -r Transaction -r XLOG": [*dump, "-r", "Transaction", "-r", "XLOG"],
        "scan_wal (pg_waldump + parsing, today)": [
            *me,
            "--child",
            "scan_wal",
            "--waldump",
            str(waldump),
            *common,
        ],
    }
    stats = subprocess.run([*dump, "--stats"], capture_output=True, text=True, check=False).stdout
    print()
    print(f"== {label}: {span_mb:.0f} MB of WAL, {start} to {end} ==")
    for line in stats.splitlines():
        if line.startswith(("Transaction", "Heap ", "Btree", "Total")):
            print("  " + " ".join(line.split()))
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    os.sched_setaffinity(0, {args.cpu})  # the measured processes inherit it
    try:
        for argv in methods.values():  # warm the page cache and the interpreter
            run_measured(argv, capture=True)
        for r in range(args.runs):
            order = list(methods.items())
            order = order[r % len(order) :] + order[: r % len(order)]  # rotated per run
            for name, argv in order:
                in_python = "--child" in argv
                res = run_measured(argv, capture=in_python)
                if res["rc"] != 0:
                    sys.exit(f"{name} failed ({res['rc']}): {res['stderr'][-2000:]}")
                if in_python:
                    res["report"] = json.loads(res["stdout"])
                    res["seconds"] = res["report"]["seconds"]
                else:
                    res["seconds"] = res["wall"]
                results[name].append(res)
            times = ", ".join(f"{results[n][-1]['seconds']:.3f}" for n in methods)
            print(f"run {r + 1} (s, in the order below): {times}")
        rss = {name: peak_rss_mb(argv) for name, argv in methods.items()}
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))

    def secs(name: str) -> list[float]:
        return [r["seconds"] for r in results[name]]

    full = statistics.median(secs("pg_waldump (every record printed)"))
    filtered = statistics.median(secs("pg_waldump -r Transaction -r XLOG"))
    print()
    print("| method | seconds | MB/s | x pg_waldump | x pg_waldump -r | peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for name in methods:
        med = statistics.median(secs(name))
        mem = rss[name][0]
        print(
            f"| {name} | {fmt(secs(name))} | {span_mb / med:.1f} | {med / full:.2f} | "
            f"{med / filtered:.2f} | {'n/a' if mem is None else f'{mem:.1f}'} |"
        )
    reader = results["pgsnap scan_events (Verify.TAIL)"][0]["report"]
    today = results["scan_wal (pg_waldump + parsing, today)"][0]["report"]
    timed = rss["pgsnap scan_events (Verify.TAIL)"][1]
    if timed:
        base = json.loads(timed)["base_kb"] / 1024
        print(
            f"pgsnap's peak RSS includes the interpreter and its imports ({base:.1f} MB before "
            "the scan) and the commits the WalEvents holds (about 300 bytes each)"
        )
    same = (reader["commits_sha256"], reader["restore_points_sha256"]) == (
        today["commits_sha256"],
        today["restore_points_sha256"],
    )
    print(
        f"found: {reader['commits']} commits, {reader['restore_points']} restore points "
        f"(scan_wal: {today['commits']}, {today['restore_points']}); the same (lsn, time, xid) "
        f"and restore points: {same}"
    )
    ours = statistics.median(secs("pgsnap scan_events (Verify.TAIL)"))
    print(
        f"pgsnap / pg_waldump = {ours / full:.2f} (target <= {TARGET_RATIO:.0f}): "
        f"{'met' if ours / full <= TARGET_RATIO else 'NOT met'}; pgsnap / "
        f"pg_waldump -r Transaction -r XLOG = {ours / filtered:.2f}: "
        f"{'met' if ours / filtered <= TARGET_RATIO else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
