"""Benchmark: what the primary's workload feels while a backup is taken, on the primary
or on its standby (real btrfs, PostgreSQL 15, fsync on).

Run (as root: loop devices, mount, and the servers run as the ``postgres`` OS user)::

    python benchmarks/bench_standby.py                  # scale 100 (1.5 GB), 2 rounds
    python benchmarks/bench_standby.py --rounds 3 --seconds 90 --at 30
    python benchmarks/bench_standby.py --smoke          # scale 1, 1 round of 18 s runs (2 min)

Target (issue 24): a backup taken on the standby is invisible to the primary's
workload: TPS on the primary while it runs (and the 10 s after it) within 5 % of
TPS before it. Prints the figures and "met" / "NOT met"; never asserts.

Set-up: a throwaway btrfs on a loop device (:class:`~pgsnap.testing.btrfs.LoopBtrfs`)
holds a primary (data directory and ``pg_wal`` on two subvolumes, 16 MB segments,
``cp`` archiving, fsync on, ``max_wal_size = 4GB``, ``log_checkpoints``); a second one
holds its streaming standby (two subvolumes of its own, made from the primary by
:meth:`PgServer.standby_of <pgsnap.testing.pgserver.PgServer.standby_of>`, the
archive shared), as a standby host has its own file system: a btrfs snapshot commits
its whole file system's transaction. Filled by ``pgbench -i -s SCALE``.

Each run is ``pgbench -n -c CLIENTS -j 2 -T SECONDS -P 1`` against the primary; at
second ``--at`` one method runs in this process, timed:

- **no backup** (the reference: what TPS does by itself over the same seconds);
- **pgsnap on the primary**: ``Cluster.backup()`` of the primary (its checkpoint is
  a fast one on the primary, and the full-page images that follow it are the
  primary's);
- **pgsnap on the standby**: ``Cluster.backup()`` of the standby with the primary's
  connection configured (its restartpoint is the standby's; pgsnap switches WAL on the
  primary so that the backup's last segment is archived);
- **pg_basebackup on the primary** and **pg_basebackup on the standby**: ``-c fast -X
  stream`` into a directory outside the btrfs (fsynced), what a user would otherwise run.

Before every run alike: a ``CHECKPOINT`` on the primary, the standby caught up and
its own ``CHECKPOINT`` (a restartpoint), the archiver idle. The order of the methods
rotates from round to round.

From pgbench's per-second progress: TPS **before** (seconds 3 to ``--at``), **during**
(the seconds the method overlaps), **after** (the 10 s after it ended), the slowest
second from the start of the method to 10 s after, each as a share of "before".

Caveat, printed with the figures: both servers share this machine's 2 CPUs and its one
disk, so a standby's work (the restartpoint's writes above all, then the snapshot and
WAL replay) competes with the primary here as it would not on a standby host of its
own; the standby figures are an upper bound on what the primary feels.

Everything is removed at the end (servers stopped, file system unmounted, loop
device detached, image deleted), also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import table
from bench_backup import pg_env, run_measured
from bench_btrfs import machine

from pgsnap.adapters.postgres import PostgresAdapter
from pgsnap.cluster import Cluster
from pgsnap.model import BackupState
from pgsnap.testing.btrfs import (
    LoopBtrfs,
    btrfs_cluster,
    btrfs_server,
    btrfs_unavailable,
    make_subvolumes,
)
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

GB = 1000**3
MB = 1000**2
AFTER = 10
"""Seconds after a method ends that still count as its cost (the full-page images
written after a checkpoint slow the workload after the backup, not only during it)."""
TARGET = 0.95
PROGRESS_RE = re.compile(r"^progress: (?P<s>[0-9.]+) s, (?P<tps>[0-9.]+) tps")
METHODS = (
    "no backup",
    "pgsnap on the primary",
    "pgsnap on the standby",
    "pg_basebackup on the primary",
    "pg_basebackup on the standby",
)


def need_bytes(scale: int) -> int:
    """Free space in ``--dir``: the btrfs image's content (two copies of the database,
    pg_wal of both, the archive, what snapshots keep) and one pg_basebackup copy."""
    return 6 * GB + scale * 60 * MB


class Bench:
    """The two servers on one btrfs, and the runs."""

    def __init__(self, args: argparse.Namespace, bindir: Path, say: Callable[[str], None]):
        self.args = args
        self.bindir = bindir
        self.say = say
        self.fs: LoopBtrfs | None = None
        self.standby_fs: LoopBtrfs | None = None
        self.primary: PgServer | None = None
        self.standby: PgServer | None = None
        self.out: Path | None = None

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        args, say = self.args, self.say
        t0 = time.perf_counter()
        self.out = Path(tempfile.mkdtemp(prefix="pgsnap-bench-standby-out-", dir=args.dir))
        size = max(16 << 30, args.scale * 160 * MB)
        self.fs = fs = LoopBtrfs.create(size=size, parent=args.dir)
        self.primary = primary = btrfs_server(
            self.bindir,
            fs,
            wal_segsize_mb=16,
            archive=True,
            settings={
                "fsync": True,
                "log_checkpoints": True,
                "max_wal_size": "4GB",
                "hot_standby": True,
            },
        )
        primary.start()
        if primary.sql("SHOW fsync")[0][0] != "on":
            raise RuntimeError("the primary runs with fsync off: not real figures")
        primary.configure({"archive_command": "true"})  # the load's WAL is not needed
        primary.reload()
        took = run_measured(
            [str(self.bindir / "pgbench"), "-i", "-q", "-s", str(args.scale)], env=pg_env(primary)
        )[0]
        primary.configure({"archive_command": primary.archive_command()})
        primary.reload()
        primary.sql("CHECKPOINT")
        primary.switch_wal_and_wait_archived(timeout=900)
        db = int(primary.sql("SELECT pg_database_size('postgres')")[0][0])
        t1 = time.perf_counter()
        # The standby on a btrfs of its own, as on a host of its own: a snapshot commits
        # its file system's transaction, which on one shared btrfs would flush the
        # primary's writes too.
        self.standby_fs = LoopBtrfs.create(size=size, parent=args.dir)
        self.standby = standby = PgServer.standby_of(
            primary,
            parent_dir=self.standby_fs.mount_point,
            make_directories=lambda s: make_subvolumes(s.data_dir, s.wal_dir),
        )
        standby.start()
        standby.wait_for_streaming()
        say(
            f"btrfs on {fs.device} (the primary) and {self.standby_fs.device} (the standby), "
            f"{size / GB:.0f} GB sparse images in {args.dir}; PostgreSQL {primary.version_num}: "
            "primary and streaming standby, each with data and pg_wal on two subvolumes, 16 MB "
            "segments, fsync=on, archive by cp (shared, on the primary's btrfs)\n"
            f"pgbench -i -q -s {args.scale}: {took:.1f} s, database {db / MB:.0f} MB; standby "
            f"made in {time.perf_counter() - t1:.1f} s; set up in {time.perf_counter() - t0:.1f} s"
        )
        for name, cluster in (("primary", self.on_primary()), ("standby", self.on_standby())):
            check = cluster.check()
            if not check.ok:
                raise RuntimeError(f"pgsnap check on the {name} failed:\n{check.explain()}")

    def on_primary(self) -> Cluster:
        assert self.primary is not None and self.fs is not None
        return btrfs_cluster(self.primary, self.fs)

    def on_standby(self) -> Cluster:
        assert self.primary is not None and self.standby is not None
        assert self.standby_fs is not None
        return btrfs_cluster(
            self.standby,
            self.standby_fs,
            snapshot_dir=str(self.standby_fs.mount_point / "snapshots"),
            primary=PostgresAdapter(self.primary.conninfo()),
        )

    def cleanup(self) -> None:
        """Stop both servers, unmount, detach, delete: every step tried."""
        for server in (self.standby, self.primary):
            if server is None:
                continue
            with contextlib.suppress(Exception):
                if server.is_running():
                    server.stop(mode="immediate", timeout=60)
            server._cleaned = True  # its directories live on the btrfs: gone with the image
        self.standby = self.primary = None
        for fs in (self.standby_fs, self.fs):
            if fs is not None:
                fs.close()
        self.standby_fs = self.fs = None
        if self.out is not None:
            shutil.rmtree(self.out, ignore_errors=True)
            self.out = None

    # ------------------------------------------------------------------ one run

    def prepare(self) -> None:
        """Before every run alike: checkpoint, restartpoint, standby caught up, archive idle."""
        assert self.primary is not None and self.standby is not None
        self.primary.sql("CHECKPOINT")
        lsn = str(self.primary.sql("SELECT pg_current_wal_lsn()::text")[0][0])
        self.standby.wait_for_replay(lsn)
        self.standby.sql("CHECKPOINT")
        self.primary.wait_for_archive_idle(timeout=900)

    def method(self, name: str) -> str:
        """Run one method; what it made (for the log)."""
        assert self.primary is not None and self.standby is not None and self.out is not None
        if name == "no backup":
            return "-"
        if name.startswith("pgsnap"):
            cluster = self.on_primary() if name.endswith("primary") else self.on_standby()
            record = cluster.backup(name)
            if record.state is not BackupState.DONE:
                raise RuntimeError(f"{name}: backup {record.id} is {record.state.value}")
            cluster.execute(cluster.plan_delete(record.id))  # no pile of snapshots on the btrfs
            return f"backup {record.id} ({record.taken_on.value if record.taken_on else '?'})"
        server = self.primary if name.endswith("primary") else self.standby
        target = self.out / "basebackup"
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run(
            [
                str(self.bindir / "pg_basebackup"),
                "-D",
                str(target),
                "-X",
                "stream",
                "-c",
                "fast",
                "-h",
                str(server.socket_dir),
                "-p",
                str(server.port),
                "-U",
                "postgres",
            ],
            check=True,
            capture_output=True,
            timeout=3600,
        )
        shutil.rmtree(target, ignore_errors=True)
        return "pg_basebackup copy (removed)"

    def run(self, name: str) -> dict[str, Any]:
        """pgbench for ``--seconds`` with the method started at second ``--at``."""
        assert self.primary is not None
        args = self.args
        self.prepare()
        argv = [
            str(self.bindir / "pgbench"),
            "-n",
            "-c",
            str(args.clients),
            "-j",
            "2",
            "-T",
            str(args.seconds),
            "-P",
            "1",
        ]
        proc = subprocess.Popen(
            argv,
            env=pg_env(self.primary),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        t0 = time.monotonic()
        seconds: dict[int, float] = {}

        def read_progress() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                m = PROGRESS_RE.match(line)
                if m:
                    seconds[round(float(m["s"]))] = float(m["tps"])

        reader = threading.Thread(target=read_progress, daemon=True)
        reader.start()
        time.sleep(max(0.0, args.at - (time.monotonic() - t0)))
        start = time.monotonic() - t0
        try:
            made = self.method(name)
        finally:
            end = time.monotonic() - t0
            proc.wait(timeout=args.seconds + 600)
            reader.join(timeout=10)
        if proc.returncode != 0:
            raise RuntimeError(f"pgbench failed ({proc.returncode})")
        return {"method": name, "start": start, "end": end, "tps": seconds, "made": made}


# ---------------------------------------------------------------------- figures


def window(tps: dict[int, float], lo: float, hi: float) -> list[float]:
    """TPS of the whole seconds ``k`` (covering ``(k-1, k]``) that overlap ``(lo, hi]``."""
    return [v for k, v in sorted(tps.items()) if k > lo and k - 1 < hi]


def figures(run: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    tps: dict[int, float] = run["tps"]
    before = statistics.mean(window(tps, 2, args.at)) if window(tps, 2, args.at) else 0.0
    during = window(tps, run["start"], max(run["end"], run["start"] + 1))
    after = window(tps, run["end"] + 1, run["end"] + 1 + AFTER)
    cost = window(tps, run["start"], run["end"] + AFTER)
    share = (lambda v: v / before) if before else (lambda v: 0.0)
    return {
        "seconds": run["end"] - run["start"],
        "before": before,
        "during": share(statistics.mean(during)) if during else float("nan"),
        "after": share(statistics.mean(after)) if after else float("nan"),
        "slowest": share(min(cost)) if cost else float("nan"),
    }


def report(
    runs: list[dict[str, Any]], args: argparse.Namespace, say: Callable[[str], None]
) -> None:
    rows = []
    by: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        by.setdefault(run["method"], []).append(figures(run, args))
    for name in METHODS:
        if name not in by:
            continue
        fs = by[name]

        def med(key: str, fs: list[dict[str, float]] = fs) -> float:
            return statistics.median(f[key] for f in fs)

        rows.append(
            [
                name,
                f"{med('seconds'):.2f}" if name != "no backup" else "-",
                f"{med('before'):.0f}",
                f"{med('during'):.2f}",
                f"{med('after'):.2f}",
                f"{med('slowest'):.2f}",
            ]
        )
    say(
        "\nmedian of the runs (TPS as a share of TPS before the method, same run):\n"
        + table(
            rows,
            [
                "method",
                "method s",
                "TPS before",
                "during",
                f"{AFTER} s after",
                "slowest second",
            ],
        )
    )
    standby = by.get("pgsnap on the standby", [])
    if standby:
        worst = min(min(f["during"], f["after"]) for f in standby)
        say(
            f"pgsnap on the standby: TPS on the primary during and {AFTER} s after the backup, "
            f"worst run {worst:.2f} of before (target >= {TARGET}): "
            f"{'met' if worst >= TARGET else 'NOT met'}"
        )
    say(
        "caveat: both servers share this machine's CPUs and disk; a standby on a host of its "
        "own takes its restartpoint, snapshot and replay off the primary's machine entirely"
    )


# ---------------------------------------------------------------------- main


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="pgbench scale (default 100)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every method (default 2)")
    parser.add_argument("--seconds", type=int, default=60, help="pgbench seconds per run (60)")
    parser.add_argument("--at", type=int, default=20, help="second the method starts at (20)")
    parser.add_argument("--clients", type=int, default=4, help="pgbench clients (default 4)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    parser.add_argument("--smoke", action="store_true", help="scale 1, 1 round of 18 s runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scale, args.rounds, args.seconds, args.at = 1, 1, 18, 4
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    if args.at < 3 or args.seconds < args.at + AFTER + 2:
        parser.error(f"--at must be >= 3 and --seconds >= --at + {AFTER + 2}")

    def say(msg: str) -> None:
        print(msg, flush=True)

    reason = btrfs_unavailable()
    if reason is not None:
        say(f"cannot run: {reason}")
        return 2
    parent = Path(args.dir)
    parent.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(parent).free < need_bytes(args.scale):
        say(
            f"refusing to run: {shutil.disk_usage(parent).free / GB:.1f} GB free on {parent}, "
            f"scale {args.scale} needs {need_bytes(args.scale) / GB:.1f} GB; pass --dir on a "
            "larger file system or a smaller --scale"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    for tool in ("pgbench", "pg_basebackup", "postgres"):
        if not (bindir / tool).exists():
            say(f"cannot run: {bindir / tool} is missing (apt-get install -y postgresql-15)")
            return 2
    signal.signal(signal.SIGTERM, _sigterm)
    say(f"bench_standby: {machine(parent, bindir)}")
    say(
        f"pgbench -n -c {args.clients} -j 2 -T {args.seconds} -P 1 on the primary, the method "
        f"at second {args.at}; {args.rounds} round(s), order rotated"
    )
    bench = Bench(args, bindir, say)
    runs: list[dict[str, Any]] = []
    try:
        bench.setup()
        for r in range(args.rounds):
            order = methods[r % len(methods) :] + methods[: r % len(methods)]
            for name in order:
                run = bench.run(name)
                f = figures(run, args)
                say(
                    f"round {r + 1}, {name}: {run['made']}; second {run['start']:.1f} to "
                    f"{run['end']:.1f}; TPS before {f['before']:.0f}, during {f['during']:.2f}, "
                    f"after {f['after']:.2f}, slowest second {f['slowest']:.2f}"
                )
                runs.append(run)
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
        return 130
    finally:
        bench.cleanup()
    report(runs, args, say)
    say(f"at the end: load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
