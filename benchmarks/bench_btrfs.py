"""Benchmark: a snapshot backup costs the same at 1.5 GB and at 15 GB (real btrfs).

Run (as root: loop devices, mount, and the server runs as the ``postgres`` OS user)::

    python benchmarks/bench_btrfs.py                        # scales 100 and 1000, 5 backups each
    python benchmarks/bench_btrfs.py --scales 100 --runs 5
    python benchmarks/bench_btrfs.py --smoke                # scale 1: checks the script (< 1 min)
    python benchmarks/bench_btrfs.py --dir /big             # the scratch area (default /var/tmp)

Targets (issue 10): pgsnap's median backup wall time under 0.5 s at both sizes;
at the largest scale within 1.2x of its time at the smallest; ``pg_basebackup -X
stream -c fast`` at the largest scale at least 30x pgsnap's time there; pgsnap's
overhead on a recovery (everything ``execute`` adds to the storage calls and to
PostgreSQL's own start and replay) under 1 s. Prints the figures and "met" /
"NOT met"; never asserts.

For each scale (one data set each, made once):

1. a throwaway btrfs on a loop device (:class:`~pgsnap.testing.btrfs.LoopBtrfs`,
   a sparse image in ``--dir``, 64 MB per pgbench scale unit, at least 16 GiB) and
   PostgreSQL 15 on it (:func:`~pgsnap.testing.btrfs.btrfs_server`: the data
   directory and ``pg_wal`` are two subvolumes; 16 MB WAL segments; archiving by
   ``cp`` into a plain directory on the same file system; **fsync on**, checked;
   ``max_wal_size = 4GB``; ``log_checkpoints``; ``log_line_prefix = '%n [%p] '``
   for the server log's Unix times);
   ``pgbench -i -q -s SCALE`` (default init steps ``dtgvp``). While pgbench
   loads, ``archive_command`` is ``true`` (the load's WAL is not copied into the
   archive: it saves 15 GB of writes at scale 1000 and no backup needs it); the
   ``cp`` command is put back and a segment switch archived before any backup;
2. ``--runs`` pgsnap backups: before each, a ``CHECKPOINT``, ``--load`` pgbench
   transactions (2 clients) and a wait until the archiver is idle, the same before
   every method; then ``Cluster.backup()`` (plan + execute) of a Cluster built by
   :func:`~pgsnap.testing.btrfs.btrfs_cluster` (``BtrfsBackend``), in this process
   (the first run imports psycopg). The breakdown comes from the executor's events
   (each step's seconds, as benchmarks/bench_backup.py reads them); the backend's
   methods are wrapped on the object (pgsnap is not modified) to time the snapshot
   call ``create_snapshot_group`` alone; time in backup mode is the record's
   ``backup_mode_seconds``; the backup's own checkpoint (buffers written, files
   synced, seconds) is read from its ``checkpoint complete`` line in the server log;
3. once each, after the same preparation: ``pg_basebackup -D DIR -X stream -c
   fast`` (plain format, fsynced at the end, into ``--dir`` outside the btrfs)
   and ``pg_dump -Fc`` (fsynced), wall time of the process;
4. ``--recovery-runs`` recoveries: a pgsnap backup, ``--load-seconds`` of pgbench
   (2 clients), a crash (``pg_ctl stop -m immediate``), the data directory's
   content deleted (lost), then ``plan_recovery(latest)`` and ``execute`` of a new
   Cluster, timed, and the rows of ``pgbench_history`` checked. Each recovery is
   split as benchmarks/bench_recovery.py splits it (its functions are reused):
   planning; the storage calls (btrfs: the safety snapshot, the subvolume swap);
   PostgreSQL, from its first log line to "ready to accept connections" (its own
   timestamps); and pgsnap's overhead, the rest of ``execute``.

It prints the machine (CPUs, memory, kernel, btrfs-progs, PostgreSQL, Python, the
commit and the uncommitted files under ``pgsnap/``, the scratch file system, the
load average) at the start and again at the end, every run, then the tables and
the targets.

Everything is removed at the end (server stopped, file system unmounted, loop
device detached, image deleted), also on failure, Ctrl-C or SIGTERM. It refuses
to start when ``--dir`` has less free space than the largest scale needs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import cpu_model, git_commit, memory_bytes, table, uncommitted
from bench_backup import CallLog, client_args, pg_env, run_measured, stats, time_methods, tree_bytes
from bench_recovery import Calls, attribute, log_lines, verdict

from pgsnap.model import RecoveryTarget
from pgsnap.protocols import STORAGE_BACKEND_METHODS
from pgsnap.testing.btrfs import LoopBtrfs, btrfs_cluster, btrfs_server, btrfs_unavailable
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

TARGET_BACKUP_SECONDS = 0.5
TARGET_FLAT_RATIO = 1.2
TARGET_BASEBACKUP_RATIO = 30.0
TARGET_RECOVERY_OVERHEAD_SECONDS = 1.0

GB = 1000**3
MB = 1000**2
IMAGE_BYTES_PER_SCALE = 64 * MB
"""Sparse image size per pgbench scale unit (scale 1000: 64 GB, the database 15 GB; pg_wal
grows to max_wal_size, 4 GB, and the WAL subvolume's snapshots keep recycled segments)."""
MIN_IMAGE_BYTES = 16 << 30
SNAPSHOT_CALL = "backend.create_snapshot_group"
CHECKPOINT_RE = re.compile(
    r"wrote (?P<buffers>\d+) buffers.*write=(?P<write>[0-9.]+) s, sync=(?P<sync>[0-9.]+) s, "
    r"total=(?P<total>[0-9.]+) s; sync files=(?P<files>\d+)"
)
"""PostgreSQL's ``checkpoint complete`` log line (log_checkpoints): the backup's checkpoint."""


def need_bytes(scale: int) -> int:
    """Free space a scale needs in ``--dir``: the database, pg_wal (up to max_wal_size
    and more), the archive since the first backup, what the snapshots keep, the base
    backup (outside the btrfs) and the dump, with a margin."""
    return 4 * GB + scale * 40 * MB


def image_bytes(scale: int) -> int:
    return max(MIN_IMAGE_BYTES, scale * IMAGE_BYTES_PER_SCALE)


def sh(argv: Sequence[str]) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    return (proc.stdout or proc.stderr).strip()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# --------------------------------------------------------------------------- one scale


class Scale:
    """One data set on its own loop-mounted btrfs: the server, the measurements."""

    def __init__(
        self, scale: int, args: argparse.Namespace, bindir: Path, say: Callable[[str], None]
    ) -> None:
        self.scale = scale
        self.args = args
        self.bindir = bindir
        self.say = say
        self.fs: LoopBtrfs | None = None
        self.server: PgServer | None = None
        self.out: Path | None = None
        self.facts: dict[str, Any] = {}

    # ----------------------------------------------------------------- setup, cleanup

    def setup(self) -> None:
        args, say = self.args, self.say
        t0 = time.perf_counter()
        self.out = Path(tempfile.mkdtemp(prefix="pgsnap-bench-btrfs-out-", dir=args.dir))
        self.fs = LoopBtrfs.create(size=image_bytes(self.scale), parent=args.dir)
        self.server = server = btrfs_server(
            self.bindir,
            self.fs,
            wal_segsize_mb=16,
            archive=True,
            settings={
                "fsync": True,
                "log_line_prefix": "%n [%p] ",
                "log_checkpoints": True,
                "max_wal_size": "4GB",
            },
        )
        server.start()
        say(
            f"scale {self.scale}: btrfs on {self.fs.device} ({image_bytes(self.scale) / GB:.0f} GB "
            f"sparse image in {self.fs.base}), PostgreSQL {server.major} ({server.version_num}), "
            "data and pg_wal on two subvolumes, 16 MB WAL segments, fsync=on, archive by cp"
        )
        fsync = server.sql("SHOW fsync")[0][0]
        if fsync != "on":
            raise RuntimeError(f"the server runs with fsync={fsync}: not real figures")
        server.configure({"archive_command": "true"})
        server.reload()
        took = run_measured(
            [str(self.bindir / "pgbench"), "-i", "-q", "-s", str(self.scale)],
            env=pg_env(server),
        )[0]
        server.configure({"archive_command": server.archive_command()})
        server.reload()
        server.sql("CHECKPOINT")
        server.switch_wal_and_wait_archived(timeout=900)
        server.wait_for_archive_idle(timeout=900)
        db = int(server.sql("SELECT pg_database_size('postgres')")[0][0])
        self.facts = {
            "init_seconds": took,
            "db_bytes": db,
            "data_bytes": tree_bytes(server.data_dir),
        }
        say(
            f"  pgbench -i -q -s {self.scale}: {took:.1f} s; database {db / MB:.0f} MB, data "
            f"subvolume {self.facts['data_bytes'] / MB:.0f} MB, pg_wal "
            f"{tree_bytes(server.wal_dir) / MB:.0f} MB; set up in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        check = btrfs_cluster(server, self.fs).check()
        if not check.ok:
            raise RuntimeError(f"pgsnap check failed:\n{check.explain()}")

    def cleanup(self) -> None:
        """Stop the server, unmount, detach, delete: every step tried, whatever failed."""
        if self.server is not None:
            with contextlib.suppress(Exception):
                if self.server.is_running():
                    self.server.stop(mode="immediate", timeout=60)
            # The server's directories live on the btrfs: the image goes with them.
            self.server._cleaned = True
            self.server = None
        if self.fs is not None:
            self.fs.close()
            self.fs = None
        if self.out is not None:
            shutil.rmtree(self.out, ignore_errors=True)
            self.out = None

    # ----------------------------------------------------------------- measurements

    @property
    def srv(self) -> PgServer:
        assert self.server is not None
        return self.server

    def prepare(self) -> float:
        """Before every backup method alike: CHECKPOINT, the pgbench load, archiver idle."""
        t0 = time.perf_counter()
        self.srv.sql("CHECKPOINT")
        if self.args.load:
            run_measured(
                [
                    str(self.bindir / "pgbench"),
                    "-n",
                    "-c",
                    "2",
                    "-j",
                    "2",
                    "-t",
                    str(max(1, self.args.load // 2)),
                ],
                env=pg_env(self.srv),
            )
        self.srv.wait_for_archive_idle(timeout=900)
        return time.perf_counter() - t0

    def pgsnap_backup(self, n: int) -> dict[str, Any]:
        assert self.fs is not None
        log = CallLog()
        log.echo = self.args.verbose
        cluster = btrfs_cluster(self.srv, self.fs, on_event=log.on_event)
        time_methods(cluster.backend, STORAGE_BACKEND_METHODS, "backend", log)
        split: dict[str, float] = {}

        def timed_call(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
            def call(*a: Any, **kw: Any) -> Any:
                start = time.perf_counter()
                try:
                    return method(*a, **kw)
                finally:
                    split[name] = time.perf_counter() - start

            return call

        # Cluster.backup() calls self.plan_backup and self.execute: instance attributes win.
        cluster.plan_backup = timed_call("plan", cluster.plan_backup)  # type: ignore[method-assign]
        cluster.execute = timed_call("execute", cluster.execute)  # type: ignore[method-assign]
        offset = self.srv.log_file.stat().st_size
        t0 = time.perf_counter()
        record = cluster.backup(f"bench-{n}")
        wall = time.perf_counter() - t0
        checkpoint = next(
            (
                CHECKPOINT_RE.search(msg)
                for _t, _sev, msg in log_lines(self.srv.log_file, offset)
                if msg.startswith("checkpoint complete")
            ),
            None,
        )
        snap = sum(s for _step, name, s in log.calls if name == SNAPSHOT_CALL)
        return {
            "wall": wall,
            "plan": split.get("plan"),
            "execute": split.get("execute"),
            "steps": dict(log.steps),
            "snapshot": snap,
            "backup_mode": record.backup_mode_seconds,
            "id": record.id,
            "calls": log.calls,
            "checkpoint": checkpoint.groupdict() if checkpoint else None,
        }

    def basebackup(self) -> dict[str, Any]:
        assert self.out is not None
        target = self.out / "basebackup"
        argv = [
            str(self.bindir / "pg_basebackup"),
            *client_args(self.srv),
            "-D",
            str(target),
            "-X",
            "stream",
            "-c",
            "fast",
        ]
        try:
            took, rss, _ = run_measured(argv)
            size = tree_bytes(target)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return {"wall": took, "bytes": size, "rss_mb": rss}

    def dump(self) -> dict[str, Any]:
        assert self.out is not None
        target = self.out / "dump.pgdump"
        argv = [str(self.bindir / "pg_dump"), *client_args(self.srv), "-Fc"]
        try:
            took, rss, _ = run_measured([*argv, "-f", str(target), "postgres"])
            size = target.stat().st_size
        finally:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
        return {"wall": took, "bytes": size, "rss_mb": rss}

    def recovery(self, n: int) -> dict[str, Any]:
        """A backup, load, a crash, the data lost, then plan + execute of ``latest``."""
        assert self.fs is not None
        server = self.srv
        btrfs_cluster(server, self.fs).backup(f"bench-recovery-{n}")
        run_measured(
            [
                str(self.bindir / "pgbench"),
                "-n",
                "-c",
                "2",
                "-j",
                "2",
                "-T",
                str(self.args.load_seconds),
            ],
            env=pg_env(server),
        )
        rows, wal_end = server.sql(
            "SELECT count(*), pg_current_wal_lsn() - '0/0'::pg_lsn FROM pgbench_history"
        )[0]
        server.pg_ctl("stop", "-m", "immediate")
        for entry in os.scandir(server.data_dir):  # the data volume's content is lost
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        calls = Calls()
        cluster = btrfs_cluster(server, self.fs)
        calls.wrap(cluster.backend)
        calls.wrap_fresh(cluster)
        offset = server.log_file.stat().st_size
        t0 = time.time()
        plan = cluster.plan_recovery(RecoveryTarget.latest())
        t1 = time.time()
        cluster.execute(plan, on_event=calls.on_event)
        t2 = time.time()
        lines = log_lines(server.log_file, offset)
        out = attribute((t0, t1), (t1, t2), calls, lines)
        # attribute() names the copying calls of the mock; on btrfs every storage call counts
        storage = [(name, a, b) for name, a, b in calls.calls if a >= t1]
        out["storage_calls"] = {}
        for name, a, b in storage:
            out["storage_calls"][name] = out["storage_calls"].get(name, 0.0) + (b - a)
        out["storage"] = sum(b - a for _n, a, b in storage)
        out["overhead_all_storage"] = out["execute"] - out["storage"] - out["postgres"]
        out["wall"] = t2 - t0
        got = int(server.sql("SELECT count(*) FROM pgbench_history")[0][0])
        out["rows_ok"] = got == int(rows)
        out["rows"] = (got, int(rows))
        start_lsn = next(
            (b.start_lsn.value for b in cluster.backups() if b.label == f"bench-recovery-{n}"),
            None,
        )
        out["wal_mb"] = (int(wal_end) - start_lsn) / MB if start_lsn is not None else None
        if self.args.verbose:
            for _t, sev, msg in lines:
                self.say(f"    | {sev}: {msg[:140]}")
        return out

    def run(self) -> dict[str, Any]:
        say, args = self.say, self.args
        backups: list[dict[str, Any]] = []
        for n in range(1, args.runs + 1):
            prep = self.prepare()
            r = self.pgsnap_backup(n)
            backups.append(r)
            steps = ", ".join(f"{s} {v:.3f}" for s, v in r["steps"].items())
            ckpt = r["checkpoint"] or {}
            say(
                f"  pgsnap backup {n}: {r['wall']:.3f} s (plan {r['plan']:.3f}, execute "
                f"{r['execute']:.3f}: {steps}; snapshot call {r['snapshot']:.3f}; backup mode "
                f"{r['backup_mode'] or 0:.3f}; its checkpoint: {ckpt.get('buffers', '?')} buffers, "
                f"{ckpt.get('files', '?')} files synced, total {ckpt.get('total', '?')} s)  "
                f"[prepared in {prep:.1f} s]"
            )
        prep = self.prepare()
        base = self.basebackup()
        say(
            f"  pg_basebackup -X stream -c fast: {base['wall']:.1f} s, "
            f"{base['bytes'] / MB:.0f} MB  [prepared in {prep:.1f} s]"
        )
        prep = self.prepare()
        dump = self.dump()
        say(
            f"  pg_dump -Fc: {dump['wall']:.1f} s, {dump['bytes'] / MB:.0f} MB  "
            f"[prepared in {prep:.1f} s]"
        )
        recoveries: list[dict[str, Any]] = []
        for n in range(1, args.recovery_runs + 1):
            r = self.recovery(n)
            recoveries.append(r)
            say(
                f"  recovery {n} (latest): {r['wall']:.3f} s = plan {r['plan']:.3f} + execute "
                f"{r['execute']:.3f} (storage calls {r['storage']:.3f}, PostgreSQL "
                f"{r['postgres']:.3f}, pgsnap overhead {r['overhead_all_storage']:.3f}); "
                f"{r['wal_mb'] or 0:.0f} MB of WAL since the backup; rows "
                f"{'ok' if r['rows_ok'] else 'WRONG'} {r['rows'][0]}/{r['rows'][1]}"
            )
        return {"backups": backups, "basebackup": base, "dump": dump, "recoveries": recoveries}


# --------------------------------------------------------------------------- report


COUNTS = "(count)"


def ckpt_field(r: dict[str, Any], name: str) -> float | None:
    c = r.get("checkpoint")
    return float(c[name]) if c else None


def report(
    say: Callable[[str], None], results: dict[int, dict[str, Any]], facts: dict[int, Any]
) -> None:
    scales = list(results)
    say("")
    say("== Backup, per scale: median (min .. max) of the pgsnap runs; one run of the others ==")
    say("")
    rows = []
    for s in scales:
        r = results[s]
        b = r["backups"]
        rows.append(
            [
                str(s),
                f"{facts[s]['db_bytes'] / GB:.2f}",
                stats([x["wall"] for x in b]),
                stats([x["snapshot"] for x in b]),
                stats([x["backup_mode"] for x in b]),
                f"{r['basebackup']['wall']:.1f}",
                f"{r['dump']['wall']:.1f}",
                f"{r['basebackup']['wall'] / median([x['wall'] for x in b]):.0f}x",
                f"{facts[s]['init_seconds']:.0f}",
            ]
        )
    say(
        table(
            rows,
            [
                "scale",
                "database GB",
                "pgsnap backup s",
                "snapshot call s",
                "backup mode s",
                "pg_basebackup s",
                "pg_dump -Fc s",
                "pg_basebackup / pgsnap",
                "pgbench -i s",
            ],
        )
    )
    say("")
    say("pgsnap backup breakdown (median (min .. max), seconds):")
    parts: list[tuple[str, Callable[[dict[str, Any]], float | None]]] = [
        ("Cluster.backup()", lambda x: x["wall"]),
        ("  plan_backup (observe + preflight)", lambda x: x["plan"]),
        ("  execute", lambda x: x["execute"]),
    ]
    steps: list[str] = []
    for s in scales:
        for b in results[s]["backups"]:
            steps += [k for k in b["steps"] if k not in steps]

    def step_seconds(step: str) -> Callable[[dict[str, Any]], float | None]:
        return lambda x: x["steps"].get(step)

    for step in steps:
        parts.append((f"    step {step}", step_seconds(step)))
    parts += [
        (
            "    executor outside the steps (journal, freshness, events)",
            lambda x: x["execute"] - sum(x["steps"].values()),
        ),
        ("  after execute (catalog.get)", lambda x: x["wall"] - x["plan"] - x["execute"]),
        ("storage snapshot call (create_snapshot_group)", lambda x: x["snapshot"]),
        ("time in backup mode (record.backup_mode_seconds)", lambda x: x["backup_mode"]),
        ("the backup's checkpoint (server log): total s", lambda x: ckpt_field(x, "total")),
        ("  of which sync s", lambda x: ckpt_field(x, "sync")),
        (f"  buffers written {COUNTS}", lambda x: ckpt_field(x, "buffers")),
        (f"  files synced {COUNTS}", lambda x: ckpt_field(x, "files")),
    ]
    say(
        table(
            [
                [
                    name,
                    *(
                        stats([f(x) for x in results[s]["backups"]], 0 if COUNTS in name else 4)
                        for s in scales
                    ),
                ]
                for name, f in parts
            ],
            ["part", *(f"scale {s}" for s in scales)],
        )
    )
    say("")
    say("storage calls of run 1 (seconds):")
    say(
        table(
            [
                [str(s), step, name, f"{secs:.4f}"]
                for s in scales
                for step, name, secs in results[s]["backups"][0]["calls"]
                if name.startswith("backend.")
            ],
            ["scale", "step", "call", "seconds"],
        )
    )

    recs = {s: results[s]["recoveries"] for s in scales if results[s]["recoveries"]}
    if recs:
        say("")
        say("== Recovery (latest, after a crash, data lost): median (min .. max), seconds ==")
        say("")
        say(
            table(
                [
                    [
                        str(s),
                        stats([x["wall"] for x in rs]),
                        stats([x["plan"] for x in rs]),
                        stats([x["execute"] for x in rs]),
                        stats([x["storage"] for x in rs]),
                        stats([x["postgres"] for x in rs]),
                        stats([x["overhead_all_storage"] for x in rs]),
                        stats([x["lag_execute"] for x in rs]),
                        stats([x["wal_mb"] for x in rs], 0),
                        "yes" if all(x["rows_ok"] for x in rs) else "NO",
                    ]
                    for s, rs in recs.items()
                ],
                [
                    "scale",
                    "plan + execute",
                    "planning",
                    "execute",
                    "storage calls",
                    "PostgreSQL (log)",
                    "pgsnap overhead",
                    "returned after ready",
                    "WAL MB replayed",
                    "rows ok",
                ],
            )
        )
        say("")
        say(
            "storage calls: every backend call during execute (the safety snapshot, the "
            "subvolume swap); PostgreSQL: its first log line to 'ready to accept connections'; "
            "pgsnap overhead: execute minus both."
        )
        for s, rs in recs.items():
            names: list[str] = []
            for x in rs:
                names += [k for k in x["storage_calls"] if k not in names]
            calls = "; ".join(
                f"{k} {stats([x['storage_calls'].get(k) for x in rs])}" for k in names
            )
            pg = dict(rs[0]["phases"])
            t_first = min(pg.values()) if pg else 0.0
            say(f"scale {s}: storage calls: {calls}")
            say(
                f"scale {s}: PostgreSQL phases (run 1, seconds after its first log line): "
                + ", ".join(f"{k} +{v - t_first:.2f}" for k, v in pg.items())
            )
            say(
                f"scale {s}: pgsnap overhead by part (run 1): "
                + ", ".join(f"{k} {v:.3f}" for k, v in rs[0]["parts"] if abs(v) >= 0.0005)
            )

    # ----------------------------------------------------------------- the targets
    say("")
    say("== Targets ==")
    meds = {s: median([x["wall"] for x in results[s]["backups"]]) for s in scales}
    for s in scales:
        walls = [x["wall"] for x in results[s]["backups"]]
        say(
            f"median pgsnap backup wall time at scale {s}: {meds[s]:.3f} s "
            f"(min {min(walls):.3f}, max {max(walls):.3f}) (target < {TARGET_BACKUP_SECONDS} s): "
            f"{met(meds[s] < TARGET_BACKUP_SECONDS)}"
        )
    small, large = scales[0], scales[-1]
    if large != small:
        ratio = meds[large] / meds[small]
        say(
            f"pgsnap backup at scale {large} / at scale {small}: {ratio:.2f}x "
            f"(target <= {TARGET_FLAT_RATIO}x): {met(ratio <= TARGET_FLAT_RATIO)}"
        )
    else:
        say(f"pgsnap at the largest vs the smallest scale: not measured (one scale only, {small})")
    bb = results[large]["basebackup"]["wall"] / meds[large]
    say(
        f"pg_basebackup / pgsnap at scale {large}: {bb:.0f}x "
        f"({results[large]['basebackup']['wall']:.1f} s / {meds[large]:.3f} s) "
        f"(target >= {TARGET_BASEBACKUP_RATIO:.0f}x): {met(bb >= TARGET_BASEBACKUP_RATIO)}"
    )
    for s, rs in recs.items():
        over = [x["overhead_all_storage"] for x in rs]
        say(
            f"pgsnap overhead on a recovery at scale {s}: {stats(over)} s "
            f"(target < {TARGET_RECOVERY_OVERHEAD_SECONDS} s): "
            f"{verdict(over, TARGET_RECOVERY_OVERHEAD_SECONDS)}"
        )
    if not recs:
        say("recovery: not measured (--recovery-runs 0)")


# --------------------------------------------------------------------------- main


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def machine(parent: Path, bindir: Path) -> str:
    changed = uncommitted("pgsnap")
    disk = sh(["df", "--output=source,fstype", str(parent)]).splitlines()[-1].split()
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GB:.0f} GB RAM, "
        f"Linux {platform.release()}, {sh(['btrfs', '--version'])}, "
        f"Python {platform.python_version()}, "
        f"{sh([str(bindir / 'postgres'), '--version'])}, commit {git_commit()}"
        f"{' + uncommitted changes' if uncommitted('.') else ''}"
        f" (in pgsnap/: {', '.join(changed) or 'none'}); "
        f"--dir {parent} on {' '.join(disk)} "
        f"({shutil.disk_usage(parent).free / GB:.0f} GB free); load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default="100,1000", help="pgbench scales (default 100,1000)")
    parser.add_argument("--runs", type=int, default=5, help="pgsnap backups per scale (default 5)")
    parser.add_argument(
        "--recovery-runs", type=int, default=3, help="recoveries per scale (default 3; 0: none)"
    )
    parser.add_argument(
        "--load",
        type=int,
        default=1000,
        help="pgbench transactions before every backup method, after a CHECKPOINT (default 1000)",
    )
    parser.add_argument(
        "--load-seconds",
        type=int,
        default=10,
        help="seconds of pgbench between the backup and the crash of each recovery (default 10)",
    )
    parser.add_argument("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    parser.add_argument(
        "--smoke", action="store_true", help="scale 1, 3 backups, 1 recovery, 3 s of load"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="pgsnap's events, the logs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scales, args.runs, args.recovery_runs, args.load, args.load_seconds = "1", 3, 1, 200, 3
    try:
        scales = [int(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        parser.error("--scales: comma-separated integers")
    if not scales or min(scales) < 1 or args.runs < 1 or args.recovery_runs < 0:
        parser.error("--scales and --runs must be >= 1, --recovery-runs >= 0")

    def say(msg: str) -> None:
        print(msg, flush=True)

    reason = btrfs_unavailable()
    if reason is not None:
        say(f"cannot run: {reason}")
        return 2
    parent = Path(args.dir)
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    need = max(need_bytes(s) for s in scales)
    if free < need:
        say(
            f"refusing to run: {free / GB:.1f} GB free on {parent}, scale {max(scales)} needs "
            f"{need / GB:.1f} GB (the btrfs image's content, a pg_basebackup copy, a dump); "
            "free some space, pass --dir on a larger file system or smaller --scales"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    for tool in ("pgbench", "pg_basebackup", "pg_dump", "postgres"):
        if not (bindir / tool).is_file():
            say(f"{bindir / tool} not found: install the PostgreSQL client programs")
            return 2
    say(f"bench_btrfs: {machine(parent, bindir)}")
    words = sys.argv[1:] if argv is None else list(argv)
    say(f"command: python benchmarks/bench_btrfs.py {' '.join(words)}")
    signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.perf_counter()
    results: dict[int, dict[str, Any]] = {}
    facts: dict[int, Any] = {}
    interrupted = False
    failed: list[int] = []
    for s in scales:
        sc = Scale(s, args, bindir, say)
        t0 = time.perf_counter()
        try:
            sc.setup()
            results[s] = sc.run()
            facts[s] = sc.facts
        except KeyboardInterrupt:
            say(f"interrupted at scale {s}: cleaning up")
            interrupted = True
        except Exception:  # reported; the other scales still run
            say(f"scale {s} FAILED (not in the report):\n{traceback.format_exc()}")
            failed.append(s)
        finally:
            t1 = time.perf_counter()
            sc.cleanup()
            say(
                f"scale {s}: {t1 - t0:.0f} s, cleanup {time.perf_counter() - t1:.1f} s; "
                f"{time.perf_counter() - t_start:.0f} s so far"
            )
        if interrupted:
            break
    if results:
        report(say, results, facts)
    say("")
    say(
        f"total run time {time.perf_counter() - t_start:.0f} s "
        f"(target < 1800 s including data generation): "
        f"{met(time.perf_counter() - t_start < 1800)}"
        + (" (interrupted: not every scale ran)" if interrupted else "")
        + (f" (FAILED at scale {', '.join(map(str, failed))})" if failed else "")
    )
    say(f"at the end: {machine(parent, bindir)}")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
