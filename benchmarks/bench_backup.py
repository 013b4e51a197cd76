"""Benchmark: pgsnap backup vs ``pg_basebackup`` vs ``pg_dump -Fc`` on one pgbench database.

Run (as root, like the tests: the server runs as the ``postgres`` OS user)::

    python benchmarks/bench_backup.py               # scale 100 (about 1.5 GB), 1 run
    python benchmarks/bench_backup.py --scale 1     # smoke run, a few seconds
    python benchmarks/bench_backup.py --runs 3      # each method 3 times, medians

What it does, in one run:

1. creates a throwaway PostgreSQL cluster (:class:`~pgsnap.testing.pgserver.PgServer`,
   16 MB WAL segments, a separate WAL directory, archiving by ``cp`` into its own
   archive directory) and fills it with ``pgbench -i -s SCALE``;
2. measures, after a ``CHECKPOINT`` and with the archiver idle before each one:

   * a pgsnap backup through :class:`~pgsnap.session.Cluster` (``plan_backup`` +
     ``execute``) over :class:`~pgsnap.backends.mock.MockBackend` directory volumes
     (data and WAL; the archive volume is never snapshotted), with the per-step
     seconds of the :class:`~pgsnap.executor.ExecutionResult`, the catalog record's
     ``backup_mode_seconds`` and the time of each adapter / archive / catalog call
     inside each step;
   * ``pg_basebackup -D DIR -c fast -X stream``;
   * ``pg_dump -Fc -f FILE postgres``;

3. prints the wall times, their ratios to pgsnap's total and to pgsnap without the
   snapshot call, the time in backup mode, pgsnap's step breakdown, the overhead
   target (start + stop + WAL confirmation under 0.3 s) as met / not met, and the
   mock's snapshot copy throughput (the mock's snapshot is a full directory copy,
   so that step is linear in size and says nothing about real storage).

It never asserts: it reports. Everything it creates is removed at the end
(server, archive, snapshot copies, base backups, dumps). It refuses to start
when the file system of ``--dir`` has less free space than the run needs
(8 GB at scale 100, proportionally less for smaller scales).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgsnap.backends.mock import MockBackend
from pgsnap.executor import Event, EventKind
from pgsnap.operations.catalog import required_wal_files
from pgsnap.protocols import Catalog, DatabaseAdapter, WalArchive
from pgsnap.session import Cluster
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir
from pgsnap.testing.sandbox import mock_cluster

TARGET_OVERHEAD_SECONDS = 0.3
"""start + stop + WAL confirmation (everything but the snapshot call) should stay under this."""

GB = 1000**3
MB = 1000**2
FREE_BYTES_AT_SCALE_100 = 8 * GB
"""Free space demanded at scale 100: database, its WAL and archive, a snapshot copy and
a base backup, with a margin. Scaled linearly for other scales (at least 1 GB)."""

STEP_ORDER = ("backup-start", "snapshot", "backup-stop", "wait-wal", "done")
OVERHEAD_STEPS = ("backup-start", "backup-stop", "wait-wal")


# --------------------------------------------------------------------------- call timing


@attrs.define
class CallLog:
    """The adapter / archive / catalog calls made while pgsnap works, by step."""

    step: str = "plan"
    calls: list[tuple[str, str, float]] = attrs.field(factory=list)
    event_times: list[tuple[float, Event]] = attrs.field(factory=list)
    echo: Callable[[str], None] | None = None
    returned_at: dict[str, float] = attrs.field(factory=dict)
    """Wall-clock time (``time.time()``) at which each call name last returned."""

    def add(self, name: str, seconds: float) -> None:
        self.calls.append((self.step, name, seconds))
        self.returned_at[name] = time.time()

    def on_event(self, event: Event) -> None:
        self.event_times.append((time.perf_counter(), event))
        if self.echo is not None:
            self.echo(f"  {event}")
        if event.kind is EventKind.STARTED:
            self.step = event.step_id
        elif event.kind is EventKind.FINISHED:
            self.step = f"after {event.step_id}"

    def by_step(self, step: str) -> list[tuple[str, int, float]]:
        """(call name, count, total seconds) for one step, in first-call order."""
        totals: dict[str, list[float]] = {}
        for s, name, sec in self.calls:
            if s == step:
                totals.setdefault(name, []).append(sec)
        return [(n, len(v), sum(v)) for n, v in totals.items()]


class Timed:
    """A transparent proxy that times every method call of ``target`` into ``log``.

    ``wrap`` names methods whose result is itself proxied (the backup session).
    """

    def __init__(
        self, target: object, prefix: str, log: CallLog, wrap: dict[str, str] | None = None
    ) -> None:
        self._target = target
        self._prefix = prefix
        self._log = log
        self._wrap = wrap or {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = attr(*args, **kwargs)
            finally:
                self._log.add(f"{self._prefix}.{name}", time.perf_counter() - t0)
            if name in self._wrap:
                return Timed(result, self._wrap[name], self._log)
            return result

        return timed


# --------------------------------------------------------------------------- helpers


def tree_bytes(path: Path) -> int:
    """Apparent size of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(root, name))
                total += st.st_size
    return total


def run_timed(argv: Sequence[str], *, timeout: float = 3600) -> float:
    """Run ``argv`` (output captured); return its wall time; raise with its output on failure."""
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return took


def quiesce(server: PgServer) -> None:
    """CHECKPOINT and wait until the archiver has nothing left, so each method starts alike."""
    server.sql("CHECKPOINT")
    server.wait_for_archive_idle(timeout=900)


def med(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float], digits: int = 3) -> str:
    if len(values) < 2:
        return ""
    return f" (min {min(values):.{digits}f}, max {max(values):.{digits}f})"


# --------------------------------------------------------------------------- measurements


@attrs.define
class PgsnapRun:
    """One pgsnap backup: wall times, step seconds, record figures, snapshot bytes."""

    plan_seconds: float
    execute_seconds: float
    steps: dict[str, float]
    backup_mode_seconds: float | None
    record_total_seconds: float | None
    snapshot_bytes: int
    log: CallLog
    archive_lag: dict[str, float] = attrs.field(factory=dict)
    """For the stop segment and the .backup file: seconds from pg_backup_stop's return
    to the file's mtime in the archive (when cp finished writing it)."""

    @property
    def wall(self) -> float:
        return self.plan_seconds + self.execute_seconds

    @property
    def overhead(self) -> float:
        """start + stop + WAL confirmation (the step seconds)."""
        return sum(self.steps.get(s, 0.0) for s in OVERHEAD_STEPS)

    @property
    def bookkeeping(self) -> float:
        """Executor time outside the handlers (journal writes with fsync, events)."""
        return self.execute_seconds - sum(self.steps.values())

    @property
    def wall_without_snapshot(self) -> float:
        return self.wall - self.steps.get("snapshot", 0.0)


def make_cluster(server: PgServer, log: CallLog) -> tuple[Cluster, MockBackend]:
    cluster = mock_cluster(server)
    # Time every adapter, archive and catalog call inside each step.
    cluster.adapter = cast(
        DatabaseAdapter, Timed(cluster.adapter, "adapter", log, {"backup_session": "session"})
    )
    cluster.archive = cast(WalArchive, Timed(cluster.archive, "archive", log))
    cluster.catalog = cast(Catalog, Timed(cluster.catalog, "catalog", log))
    return cluster, cast(MockBackend, cluster.backend)


def measure_pgsnap(cluster: Cluster, backend: MockBackend, log: CallLog, n: int) -> PgsnapRun:
    log.step = "plan"
    log.calls.clear()
    log.event_times.clear()
    t0 = time.perf_counter()
    plan = cluster.plan_backup(f"bench {n}")
    t1 = time.perf_counter()
    result = cluster.execute(plan, on_event=log.on_event)
    t2 = time.perf_counter()
    log.step = "after"
    backup_id = str(plan.steps[0].params["backup_id"])
    record = cluster.catalog.get(backup_id)
    group_id = str(result.outputs["snapshot"]["group_id"])
    snap_bytes = 0
    for snap in backend.get_snapshot_group(group_id).snapshots:
        if snap.extra.get("path"):
            snap_bytes += tree_bytes(Path(str(snap.extra["path"])))
    backend.delete_snapshot_group(group_id)  # frees the disk before the next method
    lag: dict[str, float] = {}
    stopped_at = log.returned_at.get("session.stop")
    if stopped_at is not None and record.stop_lsn is not None:
        for name in required_wal_files(record):
            with contextlib.suppress(FileNotFoundError):
                mtime = (Path(cluster.archive.location) / name).stat().st_mtime
                lag[name] = mtime - stopped_at
    return PgsnapRun(
        plan_seconds=t1 - t0,
        execute_seconds=t2 - t1,
        steps={k: float(v) for k, v in result.seconds.items() if not k.startswith("_")},
        backup_mode_seconds=record.backup_mode_seconds,
        record_total_seconds=record.total_seconds,
        snapshot_bytes=snap_bytes,
        log=CallLog(calls=list(log.calls), event_times=list(log.event_times)),
        archive_lag=lag,
    )


def client_args(server: PgServer) -> list[str]:
    return ["-h", str(server.socket_dir), "-p", str(server.port), "-U", "postgres"]


def measure_basebackup(server: PgServer, out_parent: Path, n: int) -> tuple[float, int]:
    target = out_parent / f"basebackup-{n}"
    argv = [
        str(server.bindir / "pg_basebackup"),
        *client_args(server),
        "-D",
        str(target),
        "-c",
        "fast",
        "-X",
        "stream",
    ]
    try:
        took = run_timed(argv)
        size = tree_bytes(target)
    finally:
        shutil.rmtree(target, ignore_errors=True)
    return took, size


def measure_dump(server: PgServer, out_parent: Path, n: int) -> tuple[float, int]:
    target = out_parent / f"dump-{n}.pgdump"
    argv = [str(server.bindir / "pg_dump"), *client_args(server), "-Fc", "-f", str(target)]
    try:
        took = run_timed([*argv, "postgres"])
        size = target.stat().st_size
    finally:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
    return took, size


# --------------------------------------------------------------------------- report


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
        for r in rows
    ]
    return "\n".join([line, sep, *body])


def report(
    say: Callable[[str], None],
    runs: list[PgsnapRun],
    base: list[tuple[float, int]],
    dumps: list[tuple[float, int]],
) -> None:
    walls = [r.wall for r in runs]
    pg_total = med(walls)
    pg_wo_snap = med([r.wall_without_snapshot for r in runs])
    bb = med([t for t, _ in base])
    dump = med([t for t, _ in dumps])
    mode = [r.backup_mode_seconds for r in runs if r.backup_mode_seconds is not None]
    n = len(runs)
    say("")
    say(f"== Results ({'median of ' + str(n) + ' runs' if n > 1 else '1 run'}) ==")
    say("")
    rows = [
        [
            "pgsnap backup (plan + execute)",
            f"{pg_total:.3f}{spread(walls)}",
            "1.00",
            f"{pg_total / pg_wo_snap:.2f}",
            f"{med(mode):.3f}" if mode else "-",
        ],
        [
            "pgsnap without the snapshot call",
            f"{pg_wo_snap:.3f}",
            f"{pg_wo_snap / pg_total:.2f}",
            "1.00",
            "-",
        ],
        [
            "pg_basebackup -c fast -X stream",
            f"{bb:.3f}{spread([t for t, _ in base])}",
            f"{bb / pg_total:.2f}",
            f"{bb / pg_wo_snap:.2f}",
            f"~{bb:.3f} (the whole copy)",
        ],
        [
            "pg_dump -Fc",
            f"{dump:.3f}{spread([t for t, _ in dumps])}",
            f"{dump / pg_total:.2f}",
            f"{dump / pg_wo_snap:.2f}",
            "- (no backup mode)",
        ],
    ]
    say(
        table(
            rows,
            ["method", "wall (s)", "x pgsnap total", "x pgsnap w/o snapshot", "backup mode (s)"],
        )
    )
    say("")
    say(
        f"output sizes: snapshot copies {runs[0].snapshot_bytes / MB:.0f} MB (data + WAL volumes), "
        f"base backup {base[0][1] / MB:.0f} MB, dump {dumps[0][1] / MB:.1f} MB"
    )
    if mode:
        say(
            f"time in backup mode (pgsnap record backup_mode_seconds): {med(mode):.3f} s"
            f"{spread(mode)}; of which the snapshot call "
            f"{med([r.steps.get('snapshot', 0.0) for r in runs]):.3f} s"
        )

    say("")
    say("pgsnap step breakdown (ExecutionResult.seconds, median):")
    step_rows = []
    for step in STEP_ORDER:
        vals = [r.steps.get(step, 0.0) for r in runs]
        step_rows.append([step, f"{med(vals):.4f}{spread(vals)}"])
    step_rows.append(
        ["(plan_backup, before execute)", f"{med([r.plan_seconds for r in runs]):.4f}"]
    )
    step_rows.append(
        ["(executor bookkeeping: journal, events)", f"{med([r.bookkeeping for r in runs]):.4f}"]
    )
    step_rows.append(["execute total", f"{med([r.execute_seconds for r in runs]):.4f}"])
    say(table(step_rows, ["step", "seconds"]))

    say("")
    say("calls inside each step (first run; adapter/archive/catalog proxied and timed):")
    first = runs[0]
    call_rows = []
    for step in ("plan", *STEP_ORDER):
        for name, count, secs in first.log.by_step(step):
            call_rows.append([step, name, str(count), f"{secs:.4f}"])
    say(table(call_rows, ["step", "call", "count", "seconds"]))

    rates = [
        r.snapshot_bytes / MB / r.steps["snapshot"] for r in runs if r.steps.get("snapshot", 0) > 0
    ]
    if rates:
        say("")
        say(
            f"mock snapshot = directory copy of {first.snapshot_bytes / MB:.0f} MB: "
            f"{med(rates):.0f} MB/s{spread(rates, 0)} "
            "(linear in size; a storage snapshot is not)"
        )

    if first.archive_lag:
        say("")
        say(
            "WAL confirmation (run 1): "
            + "; ".join(
                f"{name} in the archive {lag:+.3f} s after pg_backup_stop returned"
                for name, lag in first.archive_lag.items()
            )
            + f" (wait-wal step {first.steps.get('wait-wal', 0.0):.3f} s, "
            f"{sum(c for n, c, _ in first.log.by_step('wait-wal') if n == 'archive.exists')} "
            "archive.exists calls)"
        )

    overhead = med([r.overhead for r in runs])
    parts = " + ".join(f"{med([r.steps.get(s, 0.0) for r in runs]):.3f}" for s in OVERHEAD_STEPS)
    verdict = "met" if overhead < TARGET_OVERHEAD_SECONDS else "NOT met"
    say("")
    say(
        f"overhead excluding the snapshot call = start + stop + WAL confirmation = "
        f"{parts} = {overhead:.3f} s (target < {TARGET_OVERHEAD_SECONDS} s): {verdict}"
    )
    say(
        f"  (plus done {med([r.steps.get('done', 0.0) for r in runs]):.3f} s, executor "
        f"bookkeeping {med([r.bookkeeping for r in runs]):.3f} s, plan_backup "
        f"{med([r.plan_seconds for r in runs]):.3f} s; for reference, pg_backup_stop(true) "
        "alone took 1.08 s in the manual procedure)"
    )


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgsnap-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def required_bytes(scale: int) -> int:
    return max(GB, FREE_BYTES_AT_SCALE_100 * scale // 100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="pgbench scale (default 100)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each method (default 1)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: found)")
    parser.add_argument("--dir", default="/tmp", help="parent of the scratch directories")
    parser.add_argument(
        "--fsync", action="store_true", help="run the server with fsync=on (default off)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print pgsnap's events")
    args = parser.parse_args(argv)
    if args.scale < 1 or args.runs < 1:
        parser.error("--scale and --runs must be >= 1")

    def say(msg: str) -> None:
        print(msg, flush=True)

    parent = Path(args.dir)
    free = shutil.disk_usage(parent).free
    need = required_bytes(args.scale)
    if free < need:
        say(
            f"refusing to run: {free / GB:.1f} GB free on {parent}, the run needs "
            f"{need / GB:.1f} GB (database + WAL + archive + a snapshot copy + a base backup); "
            "free some space or pass --dir on a larger file system"
        )
        return 2

    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir()
    for tool in ("pgbench", "pg_basebackup", "pg_dump"):
        if not (bindir / tool).is_file():
            say(f"{bindir / tool} not found: install the PostgreSQL client programs")
            return 2
    say(
        f"bench_backup: {dt.date.today().isoformat()}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}; {free / GB:.0f} GB free "
        f"on {parent}"
    )
    server = PgServer.create(
        bindir,
        wal_segsize_mb=16,
        separate_wal_dir=True,
        archive=True,
        settings={"fsync": bool(args.fsync)},
        parent_dir=parent,
    )
    log = CallLog()
    try:
        with scratch_dir(parent) as out:
            server.start()
            say(
                f"PostgreSQL {server.major} ({server.version_num}) in {server.base_dir}, "
                f"16 MB WAL segments, archive by cp, fsync={'on' if args.fsync else 'off'}"
            )
            say(f"pgbench -i -s {args.scale} ...")
            t_init = run_timed(
                [
                    str(bindir / "pgbench"),
                    *client_args(server),
                    "-i",
                    "-q",
                    "-s",
                    str(args.scale),
                    "postgres",
                ]
            )
            server.switch_wal_and_wait_archived(timeout=900)
            quiesce(server)
            db_size = int(server.sql("SELECT pg_database_size('postgres')")[0][0])
            say(
                f"pgbench -i -s {args.scale}: {t_init:.1f} s; database {db_size / MB:.0f} MB, "
                f"data dir {tree_bytes(server.data_dir) / MB:.0f} MB, "
                f"pg_wal {tree_bytes(server.wal_dir) / MB:.0f} MB, "
                f"archive {tree_bytes(server.archive_dir) / MB:.0f} MB"
            )

            cluster, backend = make_cluster(server, log)
            if args.verbose:
                log.echo = say
            report_check = cluster.check()
            if not report_check.ok:
                say(report_check.explain())
                return 1

            runs: list[PgsnapRun] = []
            base: list[tuple[float, int]] = []
            dumps: list[tuple[float, int]] = []
            for n in range(1, args.runs + 1):
                quiesce(server)
                r = measure_pgsnap(cluster, backend, log, n)
                runs.append(r)
                steps = ", ".join(f"{s} {r.steps.get(s, 0.0):.3f}" for s in STEP_ORDER)
                say(f"run {n}: pgsnap {r.wall:.3f} s (plan {r.plan_seconds:.3f}; {steps})")
                quiesce(server)
                base.append(measure_basebackup(server, out, n))
                say(f"run {n}: pg_basebackup {base[-1][0]:.3f} s")
                quiesce(server)
                dumps.append(measure_dump(server, out, n))
                say(f"run {n}: pg_dump -Fc {dumps[-1][0]:.3f} s")
            report(say, runs, base, dumps)
    finally:
        server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
