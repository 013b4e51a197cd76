"""Benchmark: what pgsnap adds to a recovery, at pgbench scale 20 and 50.

Run (as root, like the tests: the server runs as the ``postgres`` OS user)::

    python benchmarks/bench_recovery.py                     # scales 20 and 50, 3 runs each
    python benchmarks/bench_recovery.py --scales 20 --runs 5
    python benchmarks/bench_recovery.py --smoke             # scale 1, 1 run: checks the script
    python benchmarks/bench_recovery.py --no-fsync          # fsync=off: NOT real figures

Targets: pgsnap's overhead on a recovery (everything it adds to the storage restore
calls and to PostgreSQL's own start and replay) under 1 s; ``execute`` returns
within 0.2 s of PostgreSQL logging the end of recovery. Prints the figures and
"met" / "NOT met"; never asserts.

For each scale:

1. a throwaway PostgreSQL cluster (:class:`~pgsnap.testing.pgserver.PgServer`,
   PostgreSQL 15 by default, 16 MB WAL segments, WAL in its own directory,
   archiving by ``cp``, ``fsync = on`` unless ``--no-fsync``, ``log_line_prefix =
   '%n [%p] '`` so that the server log's times are Unix times with milliseconds)
   under pgsnap (:func:`~pgsnap.testing.sandbox.mock_cluster`: ``MockBackend``
   directory volumes, ``DirectoryWalArchive``, ``DirectoryCatalog``);
   ``pgbench -i -s SCALE``; a pgsnap backup (``Cluster.backup``);
2. ``--load-seconds`` of pgbench after the backup (2 clients), so that there is WAL
   to replay; the time target is read from the server's clock half-way through;
3. a crash (``pg_ctl stop -m immediate``); the WAL directory, the archive, the
   catalog (with its WAL index), the journal and the mock's state are put aside
   as they are then (the "crashed state");
4. ``--runs`` rounds; in each, for each target (``latest``, then a time target;
   the order rotated from round to round): the crashed state is put back, the
   data directory's content is deleted (lost), a new ``Cluster`` is built as the
   README's example does, and ``cluster.plan_recovery(target)`` then
   ``cluster.execute(plan)`` are timed. The WAL index starts cold each time (as for
   the first plan after a crash) unless ``--warm-index``.

Each recovery is broken down:

- **planning**: ``plan_recovery`` (observing the storage, catalog, archive and
  WAL, and planning);
- **storage calls that copy** (the mock's ``create_snapshot_group`` of the safety
  snapshot, ``restore_volume``, ``wait_for_restore``, ``clone_snapshot``): timed
  by wrapping those methods on the backend object (pgsnap is not modified);
- **PostgreSQL**: from its first log line of the start (``starting PostgreSQL``)
  to ``database system is ready to accept connections``, from the server log's
  own timestamps; split into the phases the log shows;
- **pgsnap overhead**: the rest of ``execute``: the journal, the freshness check
  (``execute`` observes the facts again), the other storage calls, the steps'
  own work, ``pg_ctl`` until PostgreSQL logs its first line, the polls and waits,
  the steps after the recovery. Broken down per step from the events'
  timestamps.

It also reports how long after PostgreSQL logged "ready to accept connections"
the wait step ended and ``execute`` returned (the end-of-recovery detection lag),
and checks that ``pgbench_history`` holds the rows committed before the target.

Everything it creates is removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import table

from pgsnap import Cluster, Layout, RecoveryTarget, Volume, VolumeRole
from pgsnap.adapters.postgres import PostgresAdapter
from pgsnap.backends.mock import MockBackend
from pgsnap.catalog import DirectoryCatalog
from pgsnap.executor import Event, EventKind
from pgsnap.protocols import STORAGE_BACKEND_METHODS
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir
from pgsnap.testing.sandbox import mock_cluster
from pgsnap.wal.archive import DirectoryWalArchive

TARGET_OVERHEAD_SECONDS = 1.0
TARGET_LAG_SECONDS = 0.2
GB = 1000**3
MB = 1000**2
COPY_CALLS = ("create_snapshot_group", "restore_volume", "wait_for_restore", "clone_snapshot")
"""The storage calls that copy data (the mock's snapshot, restore and clone)."""

LOG_RE = re.compile(r"^(\d+\.\d+) \[(\d+)\] ([A-Z0-9]+):\s+(.*)$")
READY = "database system is ready to accept connections"
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("postmaster started", ("starting PostgreSQL",)),
    ("startup process began", ("database system was interrupted",)),
    ("recovery started (after the data directory sync)", ("starting ",)),
    ("redo started", ("redo starts at",)),
    ("redo done", ("redo done at",)),
    ("archive recovery complete", ("archive recovery complete",)),
    ("end-of-recovery checkpoint done", ("checkpoint complete",)),
    ("ready to accept connections", (READY,)),
)
"""The log lines that mark PostgreSQL's phases (the first match after the previous one)."""


# --------------------------------------------------------------------------- helpers


def pg_env(server: PgServer) -> dict[str, str]:
    return {
        **os.environ,
        "PGHOST": str(server.socket_dir),
        "PGPORT": str(server.port),
        "PGUSER": "postgres",
        "PGDATABASE": "postgres",
    }


def run(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - t0


def empty_dir(path: Path) -> None:
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def copy_contents(src: Path, dst: Path) -> None:
    """Make ``dst``'s content that of ``src`` (owners, modes, times kept; ``dst`` stays)."""
    empty_dir(dst)
    subprocess.run(["cp", "-a", f"{src}/.", str(dst)], check=True)


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def stats(values: Sequence[float | None], digits: int = 3) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    med = f"{statistics.median(vals):.{digits}f}"
    if len(vals) == 1:
        return med
    return f"{med} ({min(vals):.{digits}f} .. {max(vals):.{digits}f})"


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def verdict(values: Sequence[float], limit: float) -> str:
    over = sum(1 for v in values if v >= limit)
    if not over:
        return f"met (all {len(values)} runs)"
    return f"NOT met ({over} of {len(values)} runs over)"


# --------------------------------------------------------------------------- the server log


def log_lines(path: Path, offset: int) -> list[tuple[float, str, str]]:
    """(Unix time, severity, message) of the log lines written after ``offset``."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        text = fh.read().decode(errors="replace")
    out = []
    for line in text.splitlines():
        m = LOG_RE.match(line)
        if m:
            out.append((float(m.group(1)), m.group(3), m.group(4)))
    return out


def phases(lines: list[tuple[float, str, str]]) -> list[tuple[str, float]]:
    """The phases found, in order, each with the time of its first line."""
    found: list[tuple[str, float]] = []
    i = 0
    for label, starts in PHASES:
        for j in range(i, len(lines)):
            t, severity, message = lines[j]
            if severity == "LOG" and message.startswith(starts):
                if label.startswith("recovery started") and "recovery" not in message:
                    continue
                found.append((label, t))
                i = j + 1
                break
    return found


# --------------------------------------------------------------------------- one recovery


class Calls:
    """Storage calls (name, start, end in Unix time) and events (Unix time, event)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float]] = []
        self.events: list[tuple[float, Event]] = []
        self.fresh: list[tuple[float, float]] = []
        """When ``Cluster._check_fresh`` (execute's freshness check) ran."""

    def on_event(self, event: Event) -> None:
        self.events.append((time.time(), event))

    def wrap_fresh(self, cluster: Cluster) -> None:
        """Time the freshness check ``execute`` makes (an instance attribute wins)."""
        original = cluster._check_fresh

        def check_fresh(plan: Any) -> None:
            t0 = time.time()
            try:
                original(plan)
            finally:
                self.fresh.append((t0, time.time()))

        cluster._check_fresh = check_fresh  # type: ignore[method-assign]

    def wrap(self, backend: object) -> None:
        for name in STORAGE_BACKEND_METHODS:
            method = getattr(backend, name, None)
            if not callable(method):
                continue

            def timed(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
                t0 = time.time()
                try:
                    return _m(*args, **kwargs)
                finally:
                    self.calls.append((_n, t0, time.time()))

            setattr(backend, name, timed)


def build_cluster(spec: dict[str, Any], calls: Calls) -> Cluster:
    """A Cluster built as in the README, its backend's methods timed."""
    backend = MockBackend(
        root=spec["snapshots"],
        state_file=spec["state_file"],
        volumes=[{"id": v[0], "name": v[1], "path": v[3]} for v in spec["volumes"]],
    )
    calls.wrap(backend)
    cluster = Cluster(
        adapter=PostgresAdapter(
            spec["conninfo"],
            data_directory=spec["data_directory"],
            bindir=spec["bindir"],
            os_user=spec["os_user"],
            log_file=spec["log_file"],
        ),
        backend=backend,
        archive=DirectoryWalArchive(spec["archive"]),
        catalog=DirectoryCatalog(spec["catalog"]),
        layout=Layout(tuple(Volume(v[0], v[1], VolumeRole(v[2]), v[3]) for v in spec["volumes"])),
        journal_dir=spec["journal"],
    )
    calls.wrap_fresh(cluster)
    return cluster


def attribute(
    t_plan: tuple[float, float],
    t_exec: tuple[float, float],
    calls: Calls,
    lines: list[tuple[float, str, str]],
) -> dict[str, Any]:
    """Break one recovery down (see the module docstring)."""
    found = dict(phases(lines))
    pg = (found.get("postmaster started"), found.get("ready to accept connections"))
    pg_window = (pg[0], pg[1]) if pg[0] is not None and pg[1] is not None else None
    copy = [(n, a, b) for n, a, b in calls.calls if n in COPY_CALLS and a >= t_exec[0]]
    exec_wall = t_exec[1] - t_exec[0]
    copy_total = sum(b - a for _n, a, b in copy)
    pg_total = pg_window[1] - pg_window[0] if pg_window else 0.0

    # Step intervals from the events.
    started: dict[str, float] = {}
    steps: list[tuple[str, float, float]] = []
    for t, ev in calls.events:
        if ev.kind is EventKind.STARTED:
            started[ev.step_id] = t
        elif ev.kind in (EventKind.FINISHED, EventKind.FAILED) and ev.step_id in started:
            steps.append((ev.step_id, started[ev.step_id], t))
    parts: list[tuple[str, float]] = []
    if steps:
        parts.append(("before the first step (journal, freshness check)", steps[0][1] - t_exec[0]))
    previous_end = None
    between = 0.0
    for sid, a, b in steps:
        if previous_end is not None:
            between += a - previous_end
        previous_end = b
        in_copy = sum(overlap((a, b), (ca, cb)) for _n, ca, cb in copy)
        in_pg = overlap((a, b), pg_window) if pg_window else 0.0
        parts.append((f"step {sid}", (b - a) - in_copy - in_pg))
    parts.append(("between the steps (journal)", between))
    if steps:
        parts.append(("after the last step (journal, pruning)", t_exec[1] - steps[-1][2]))
    first_pg_step = next((s for s in steps if pg_window and s[1] <= pg_window[0] <= s[2]), None)
    before_log = pg_window[0] - first_pg_step[1] if first_pg_step and pg_window else None
    wait_end = next((b for sid, _a, b in steps if sid == "wait-recovery"), None)
    return {
        "plan": t_plan[1] - t_plan[0],
        "execute": exec_wall,
        "copy": copy_total,
        "copy_calls": {n: sum(b - a for m, a, b in copy if m == n) for n in COPY_CALLS},
        "postgres": pg_total,
        "overhead": exec_wall - copy_total - pg_total,
        "parts": parts,
        "before_first_log_line": before_log,
        "fresh": sum(b - a for a, b in calls.fresh) if calls.fresh else None,
        "phases": phases(lines),
        "lag_wait": (wait_end - pg_window[1]) if wait_end and pg_window else None,
        "lag_execute": (t_exec[1] - pg_window[1]) if pg_window else None,
        "found_ready": pg_window is not None,
        "connection_refusals": sum(
            1 for _t, sev, msg in lines if sev == "FATAL" and "starting up" in msg
        )
        + sum(1 for _t, sev, msg in lines if sev == "FATAL" and "not yet accepting" in msg),
    }


# --------------------------------------------------------------------------- one scale


class Scale:
    """One scale: the server, the backup, the load, the crashed state, the recoveries."""

    def __init__(self, scale: int, args: argparse.Namespace, say: Callable[[str], None]) -> None:
        self.scale = scale
        self.args = args
        self.say = say
        bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
        self.server = PgServer.create(
            bindir,
            wal_segsize_mb=16,
            separate_wal_dir=True,
            archive=True,
            settings={
                "fsync": not args.no_fsync,
                "log_line_prefix": "%n [%p] ",
                "log_checkpoints": True,
            },
            parent_dir=Path(args.dir),
        )
        self.golden = Path(tempfile.mkdtemp(prefix="pgsnap-bench-crashed-", dir=args.dir))
        self.spec: dict[str, Any] = {}
        self.archive_names: set[str] = set()
        self.snapshot_ids: set[str] = set()
        self.time_target: dt.datetime | None = None
        self.expected_rows: dict[str, tuple[int, int]] = {}
        self.wal_bytes: dict[str, int] = {}

    def cleanup(self) -> None:
        try:
            self.server.cleanup()
        finally:
            shutil.rmtree(self.golden, ignore_errors=True)

    def sql1(self, query: str) -> Any:
        return self.server.sql(query)[0][0]

    def setup(self) -> None:
        server, say, args = self.server, self.say, self.args
        server.start()
        say(
            f"PostgreSQL {server.major} ({server.version_num}) in {server.base_dir}, 16 MB WAL "
            f"segments, archive by cp, fsync={'OFF' if args.no_fsync else 'on'}"
        )
        env = pg_env(server)
        took = run([str(server.bindir / "pgbench"), "-i", "-q", "-s", str(self.scale)], env)
        server.switch_wal_and_wait_archived(timeout=900)
        size = int(self.sql1("SELECT pg_database_size('postgres')"))
        say(f"pgbench -i -s {self.scale}: {took:.1f} s, database {size / MB:.0f} MB")
        cluster = mock_cluster(server)
        t0 = time.perf_counter()
        record = cluster.backup("bench")
        say(
            f"pgsnap backup {record.id}: {time.perf_counter() - t0:.1f} s, start {record.start_lsn}"
        )
        self.spec = {
            "conninfo": server.conninfo(),
            "data_directory": str(server.data_dir),
            "bindir": str(server.bindir),
            "os_user": server.os_user,
            "log_file": str(server.log_file),
            "snapshots": str(server.base_dir / "snapshots"),
            "state_file": str(server.base_dir / "mock.json"),
            "volumes": [
                [v.id, v.name, v.role.value, v.mount_point] for v in cluster.layout.volumes
            ],
            "archive": str(server.archive_dir),
            "catalog": str(server.base_dir / "catalog"),
            "journal": str(server.base_dir / "journal"),
        }

        # The load, and the time target half-way through it.
        start_lsn = record.start_lsn.value
        load = subprocess.Popen(
            [
                str(server.bindir / "pgbench"),
                "-n",
                "-c",
                "2",
                "-j",
                "2",
                "-T",
                str(args.load_seconds),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        time.sleep(args.load_seconds / 2)
        row = server.sql(
            "SELECT clock_timestamp(), (SELECT count(*) FROM pgbench_history), "
            "pg_current_wal_lsn() - '0/0'::pg_lsn"
        )[0]
        self.time_target = row[0]
        at_target = int(row[1])
        target_lsn = int(row[2])
        out, _ = load.communicate(timeout=args.load_seconds * 10 + 120)
        if load.returncode != 0:
            raise RuntimeError(f"pgbench failed:\n{out[-3000:]}")
        # Rows a recovery to the time target keeps: at least those visible just before
        # it was read, at most those whose transaction had started by then (mtime).
        row = server.sql(
            "SELECT count(*) FILTER (WHERE mtime <= %s), count(*), "
            "pg_current_wal_lsn() - '0/0'::pg_lsn FROM pgbench_history",
            (self.time_target,),
        )[0]
        self.expected_rows = {
            "time": (at_target, int(row[0])),
            "latest": (int(row[1]), int(row[1])),
        }
        self.wal_bytes = {"time": target_lsn - start_lsn, "latest": int(row[2]) - start_lsn}
        tps = re.search(r"tps = ([0-9.]+)", out)
        say(
            f"load: pgbench -c 2 -T {args.load_seconds} after the backup "
            f"({tps.group(1) if tps else '?'} tps): {row[1]} rows in pgbench_history, "
            f"WAL from the backup's start: {self.wal_bytes['latest'] / MB:.0f} MB "
            f"(to the time target {self.time_target:%H:%M:%S.%f}: "
            f"{self.wal_bytes['time'] / MB:.0f} MB, {at_target} to {row[0]} rows)"
        )
        if args.warm_index:
            for target in self.targets().values():
                build_cluster(self.spec, Calls()).plan_recovery(target)
            say("WAL index warmed by one plan of each target before the crash")
        server.pg_ctl("stop", "-m", "immediate")
        say("crash: pg_ctl stop -m immediate")
        self.save_crashed_state()

    def targets(self) -> dict[str, RecoveryTarget]:
        assert self.time_target is not None
        return {
            "latest": RecoveryTarget.latest(),
            "time": RecoveryTarget.time(self.time_target),
        }

    def save_crashed_state(self) -> None:
        server = self.server
        for name, path in self.state_paths().items():
            if path.is_dir():
                subprocess.run(["cp", "-a", str(path), str(self.golden / name)], check=True)
            elif path.exists():
                shutil.copy2(path, self.golden / name)
        self.archive_names = set(os.listdir(server.archive_dir))
        backend = MockBackend(root=self.spec["snapshots"], state_file=self.spec["state_file"])
        self.snapshot_ids = {s.id for s in backend.list_snapshots()}
        self.say(
            f"crashed state saved in {self.golden}: pg_wal {tree_bytes(server.wal_dir) / MB:.0f} "
            f"MB, archive {tree_bytes(server.archive_dir) / MB:.0f} MB "
            f"({len(self.archive_names)} files)"
        )

    def state_paths(self) -> dict[str, Path]:
        base = self.server.base_dir
        return {
            "wal": self.server.wal_dir,
            "catalog": base / "catalog",
            "journal": base / "journal",
            "mock.json": base / "mock.json",
        }

    def restore_crashed_state(self) -> None:
        """Back to the moment of the crash, with the data directory's content lost."""
        server = self.server
        if server.is_running():
            server.pg_ctl("stop", "-m", "immediate")
        backend = MockBackend(root=self.spec["snapshots"], state_file=self.spec["state_file"])
        for snap in backend.list_snapshots():  # the safety snapshots of the last run
            if snap.id not in self.snapshot_ids:
                backend.delete_snapshot(snap.id)
        backend.close()
        for name in set(os.listdir(server.archive_dir)) - self.archive_names:
            (server.archive_dir / name).unlink()
        for name, path in self.state_paths().items():
            saved = self.golden / name
            if saved.is_dir():
                if not path.exists():
                    path.mkdir()
                copy_contents(saved, path)
            elif saved.exists():
                shutil.copy2(saved, path)
            elif path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        empty_dir(server.data_dir)

    def recover(self, kind: str) -> dict[str, Any]:
        self.restore_crashed_state()
        target = self.targets()[kind]
        calls = Calls()
        cluster = build_cluster(self.spec, calls)
        offset = self.server.log_file.stat().st_size
        t0 = time.time()
        plan = cluster.plan_recovery(target)
        t1 = time.time()
        cluster.execute(plan, on_event=calls.on_event)
        t2 = time.time()
        lines = log_lines(self.server.log_file, offset)
        out = attribute((t0, t1), (t1, t2), calls, lines)
        rows = int(self.sql1("SELECT count(*) FROM pgbench_history"))
        out["rows"] = rows
        low, high = self.expected_rows[kind]
        out["rows_ok"] = low <= rows <= high
        out["timeline"] = int(str(self.sql1("SELECT timeline_id FROM pg_control_checkpoint()")))
        if self.args.verbose:
            for _t, sev, msg in lines:
                self.say(f"    | {sev}: {msg[:140]}")
        return out


# --------------------------------------------------------------------------- report


def report_scale(
    say: Callable[[str], None], scale: int, results: dict[str, list[dict[str, Any]]], sc: Scale
) -> list[str]:
    """Print one scale's tables; return its target lines."""
    lines = []
    for kind, rs in results.items():
        say("")
        say(
            f"== scale {scale}, target {kind}: {len(rs)} run(s), median (min .. max); "
            f"WAL to replay from the backup's start: about {sc.wal_bytes[kind] / MB:.0f} MB =="
        )
        rows = [
            ["planning (plan_recovery)", stats([r["plan"] for r in rs])],
            ["execute", stats([r["execute"] for r in rs])],
            ["  storage calls that copy", stats([r["copy"] for r in rs])],
        ]
        for name in COPY_CALLS:
            vals = [r["copy_calls"][name] for r in rs]
            if any(vals):
                rows.append([f"    {name}", stats(vals)])
        rows.append(
            [
                "  PostgreSQL: first log line to ready (server log)",
                stats([r["postgres"] for r in rs]),
            ]
        )
        rows.append(["  pgsnap overhead (the rest of execute)", stats([r["overhead"] for r in rs])])
        labels = [label for label, _v in rs[0]["parts"]]
        for label in labels:
            vals = [dict(r["parts"]).get(label) for r in rs]
            rows.append([f"    {label}", stats(vals)])
            if label.startswith("before the first step"):
                rows.append(
                    [
                        "      of which the freshness check (Cluster._check_fresh)",
                        stats([r["fresh"] for r in rs]),
                    ]
                )
            elif label == "step start-server":
                rows.append(
                    [
                        "      of which until PostgreSQL's first log line (runuser, pg_ctl)",
                        stats([r["before_first_log_line"] for r in rs]),
                    ]
                )
        rows.append(["planning + pgsnap overhead", stats([r["plan"] + r["overhead"] for r in rs])])
        say(table(rows, ["part", "seconds"]))

        low, high = sc.expected_rows[kind]
        expected = str(low) if low == high else f"{low} to {high}"
        # PostgreSQL's phases, from the log.
        say("")
        phase_rows = []
        names = [label for label, _t in rs[0]["phases"]]
        for a, b in itertools.pairwise(names):
            vals = []
            for r in rs:
                found = dict(r["phases"])
                if a in found and b in found:
                    vals.append(found[b] - found[a])
            phase_rows.append([f"{a} -> {b}", stats(vals)])
        say(table(phase_rows, ["PostgreSQL (server log timestamps)", "seconds"]))
        say(
            f"pgsnap's connection attempts refused while the server started: "
            f"{stats([r['connection_refusals'] for r in rs], 0)}; rows in pgbench_history as "
            f"committed by the target: {all(r['rows_ok'] for r in rs)} "
            f"({rs[0]['rows']} rows, expected {expected}); new timeline "
            f"{', '.join(str(r['timeline']) for r in rs)}"
        )
        over = [r["overhead"] for r in rs]
        with_plan = [r["overhead"] + r["plan"] for r in rs]
        lag = [r["lag_execute"] for r in rs if r["lag_execute"] is not None]
        lag_wait = [r["lag_wait"] for r in rs if r["lag_wait"] is not None]
        say("")
        lines += [
            f"scale {scale}, {kind}: pgsnap overhead {stats(over)} s "
            f"(target < {TARGET_OVERHEAD_SECONDS:.0f} s): {verdict(over, TARGET_OVERHEAD_SECONDS)}",
            f"scale {scale}, {kind}: with planning {stats(with_plan)} s "
            f"(target < {TARGET_OVERHEAD_SECONDS:.0f} s): "
            f"{verdict(with_plan, TARGET_OVERHEAD_SECONDS)}",
            f"scale {scale}, {kind}: execute returned {stats(lag)} s after PostgreSQL logged "
            f"'ready to accept connections' (target within {TARGET_LAG_SECONDS} s): "
            f"{verdict(lag, TARGET_LAG_SECONDS)}; its wait step ended {stats(lag_wait)} s after "
            f"it: {verdict(lag_wait, TARGET_LAG_SECONDS)}",
        ]
        for line in lines[-3:]:
            say(line)
    return lines


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="20,50", help="pgbench scales (default 20,50)")
    parser.add_argument("--runs", type=int, default=3, help="recoveries of each target (3)")
    parser.add_argument(
        "--load-seconds", type=int, default=20, help="pgbench load after the backup (20)"
    )
    parser.add_argument("--targets", default="latest,time", help="latest, time or both")
    parser.add_argument(
        "--warm-index", action="store_true", help="plan once before the crash (warm WAL index)"
    )
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    parser.add_argument("--dir", default="/tmp", help="parent of the scratch directories")
    parser.add_argument(
        "--no-fsync", action="store_true", help="run the server with fsync=off (not real figures)"
    )
    parser.add_argument("--smoke", action="store_true", help="scale 1, 1 run, 4 s of load")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the server log")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scales, args.runs, args.load_seconds = "1", 1, 4
    scales = [int(s) for s in args.scales.split(",") if s.strip()]
    kinds = [k.strip() for k in args.targets.split(",") if k.strip()]
    if not scales or min(scales) < 1 or args.runs < 1 or args.load_seconds < 2:
        parser.error("--scales >= 1, --runs >= 1, --load-seconds >= 2")
    if any(k not in ("latest", "time") for k in kinds):
        parser.error("--targets: latest, time")

    def say(msg: str) -> None:
        print(msg, flush=True)

    free = shutil.disk_usage(args.dir).free
    need = max(2 * GB, max(scales) * 120 * MB)
    if free < need:
        say(f"refusing to run: {free / GB:.1f} GB free on {args.dir}, {need / GB:.1f} GB needed")
        return 2
    say(
        f"bench_recovery: {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.2f}; {free / GB:.0f} GB free on {args.dir}"
    )
    if args.no_fsync:
        say("!!! --no-fsync: the server runs with fsync=off; the figures are NOT real ones !!!")
    say(
        f"WAL index {'warm (planned once before the crash)' if args.warm_index else 'cold'} "
        "for every plan"
    )
    verdicts: list[str] = []
    for scale in scales:
        say("")
        say(f"=== pgbench scale {scale} ===")
        sc = Scale(scale, args, say)
        try:
            sc.setup()
            results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            for n in range(args.runs):
                order = kinds[n % len(kinds) :] + kinds[: n % len(kinds)]
                for kind in order:
                    r = sc.recover(kind)
                    results[kind].append(r)
                    say(
                        f"run {n + 1} {kind}: plan {r['plan']:.3f} s, execute {r['execute']:.3f} s "
                        f"= storage copies {r['copy']:.3f} + PostgreSQL {r['postgres']:.3f} + "
                        f"pgsnap {r['overhead']:.3f}; execute returned "
                        f"{stats([r['lag_execute']])} s after 'ready'"
                    )
            verdicts += report_scale(say, scale, results, sc)
        finally:
            sc.cleanup()
    say("")
    say("== targets ==")
    for line in verdicts:
        say(line)
    hwm = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        status = Path("/proc/self/status").read_text()
        hwm = int(status.split("VmHWM:")[1].split()[0]) * 1024
    if hwm is not None:
        say(f"peak RSS of this process, which made every plan and execute: {hwm / MB:.0f} MB")
    if args.no_fsync:
        say("!!! fsync=off: NOT real figures !!!")
    return 0


if __name__ == "__main__":
    sys.exit(main())
