"""Benchmark: planning a point-in-time recovery over 1,000 real 16 MB WAL segments, cold and warm.

Run (as root, like the tests: the server runs as the ``postgres`` OS user)::

    python benchmarks/bench_plan_recovery.py                 # 1,000 segments (16 GB of WAL), 3 runs
    python benchmarks/bench_plan_recovery.py --segments 20   # smoke run, about 20 s

Targets (issue 8, section 4): planning a time target with the WAL index present
("warm") under 1 s; peak memory under 100 MB at any archive size. Prints the
figures and "met" / "NOT met"; never asserts.

What it does:

1. creates a throwaway cluster (:class:`~pgsnap.testing.pgserver.PgServer`,
   PostgreSQL 15 by default, 16 MB segments, WAL in its own directory,
   archiving by ``cp`` into its own archive, ``fsync = on``) wrapped in
   :func:`pgsnap.testing.sandbox.mock_cluster` (directory volumes, a
   ``DirectoryCatalog`` whose ``wal-index`` directory is the default WAL index);
   ``pgbench -i`` and one pgsnap backup (``Cluster.backup``);
2. generates about ``--segments`` archived segments of WAL after the backup's
   start with pgbench (TPC-B-like transactions mixed with transactions that
   insert 500 rows each, several clients, ``synchronous_commit = off`` for the
   load only), a restore point every tenth of the way, an xid recorded (a
   marker transaction) half-way and a target time read from the server clock
   during the load at about 65 %; then ``pg_switch_wal()``, waits until all is
   archived, and stops the server (planning works on a stopped server; it
   keeps the measurements undisturbed);
3. measures each method ``--runs`` times, each run in a fresh Python process
   (launched through GNU time when present, so that the process's
   ``ru_maxrss`` is its own and not inherited from this one), the order of the
   methods rotated from round to round. The process builds the Cluster as a
   user's program does (README, "In Python": ``PostgresAdapter``,
   ``MockBackend`` over the mock's state file and volumes,
   ``DirectoryWalArchive``, ``DirectoryCatalog``, ``Layout``) and calls
   ``Cluster.plan_recovery``:

   - cold: the WAL index directory removed, then ``plan_recovery(time)``;
   - warm: the index left by an earlier run, ``plan_recovery(time)``, and the
     ``latest`` and xid targets (other questions, other index paths);
   - no index: ``Cluster(wal_index=False)``, time target;
   - cold with pgsnap's default scan budget (``max_scan_segments``, 256): what
     a default ``Cluster`` reads of a longer archive (every other row raises
     the budget to the whole stretch so that "cold" reads it all);
   - ``pg_waldump -t 1 -r Transaction -r XLOG`` from the backup's start to the
     end of the archive, to /dev/null: what a user would run to find the last
     commit before a time by hand;
   - a baseline process that only imports pgsnap and builds the Cluster;

   Each pgsnap run reports the time of the ``plan_recovery`` call itself, the
   process's wall time, its peak RSS, and, from ``pgsnap.observe``'s debug log,
   how many segments were read and how many answered from the index;
4. checks that the cold, warm and no-index plans of the time target agree
   (``plan.summary`` and ``plan.warnings``) and prints "MISMATCH" if not; prints
   the table and the target lines. ``--profile`` adds a cProfile of one more
   warm plan.

Everything (server, archive, snapshot copies, index) is removed at the end,
also on failure. It refuses to start without enough free space on ``--dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SOURCE_ENV = "PGSNAP_BENCH_SOURCE"
"""The copy of pgsnap the measured processes import (taken when the run starts)."""
sys.path.insert(0, os.environ.get(SOURCE_ENV) or str(REPO))

from _report import table  # noqa: E402 - the benchmarks' shared helpers, beside this file

MiB = 1024 * 1024
GB = 1000**3
SEGSZ = 16 * MiB
TARGET_WARM_SECONDS = 1.0
TARGET_RSS_MB = 100.0
BULK_SQL = "INSERT INTO bulk SELECT g, repeat('x', 200) FROM generate_series(1, 500) g;\n"
SCANNED = re.compile(r"(\d+) segments read, (\d+) from the index \((\d+) indexed now\)")


# --------------------------------------------------------------------------- child mode


def _vm_hwm_kb() -> int | None:
    """This process image's peak RSS (``VmHWM``), which an exec does not inherit."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measured run in this fresh process: build the Cluster, plan, report.

    The Cluster is built as a user's program builds it (README: "In Python"),
    over the mock's existing volumes (its state file), the server's archive,
    catalog and journal.
    """
    import logging  # noqa: PLC0415 - the import cost is part of what is measured

    t0 = time.perf_counter()
    from pgsnap import (  # noqa: PLC0415
        Cluster,
        Layout,
        PgsnapError,
        RecoveryTarget,
        Volume,
        VolumeRole,
    )
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    t_import = time.perf_counter() - t0

    messages: list[tuple[str, int, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append((record.name, record.levelno, record.getMessage()))

    root = logging.getLogger("pgsnap")
    root.addHandler(Keep(logging.DEBUG))
    root.setLevel(logging.WARNING)
    logging.getLogger("pgsnap.observe").setLevel(logging.DEBUG)

    c = spec["cluster"]
    t1 = time.perf_counter()
    options: dict[str, Any] = {"wal_index": spec["wal_index"]}
    if spec["max_scan_segments"] is not None:
        options["max_scan_segments"] = spec["max_scan_segments"]
    cluster = Cluster(
        adapter=PostgresAdapter(
            c["conninfo"],
            data_directory=c["data_directory"],
            bindir=c["bindir"],
            os_user=c["os_user"],
            log_file=c["log_file"],
        ),
        backend=MockBackend(
            root=c["snapshots"],
            state_file=c["state_file"],
            volumes=[{"id": v[0], "name": v[1], "path": v[3]} for v in c["volumes"]],
        ),
        archive=DirectoryWalArchive(c["archive"]),
        catalog=DirectoryCatalog(c["catalog"]),
        layout=Layout(tuple(Volume(v[0], v[1], VolumeRole(v[2]), v[3]) for v in c["volumes"])),
        journal_dir=c["journal"],
        **options,
    )
    out: dict[str, Any] = {"import_seconds": t_import, "build_seconds": time.perf_counter() - t1}
    if spec["target"] is not None:
        kind, value = spec["target"]
        target = {
            "time": lambda: RecoveryTarget.time(value),
            "xid": lambda: RecoveryTarget.xid(int(value)),
            "latest": RecoveryTarget.latest,
        }[kind]()
        profiler = None
        if spec.get("profile"):
            import cProfile  # noqa: PLC0415

            profiler = cProfile.Profile()
            profiler.enable()
        t2 = time.perf_counter()
        try:
            plan = cluster.plan_recovery(target)
        except PgsnapError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        else:
            out["summary"] = dict(plan.summary)
            out["warnings"] = list(plan.warnings)
            out["fingerprint"] = plan.fingerprint
        out["seconds"] = time.perf_counter() - t2
        if profiler is not None:
            import io  # noqa: PLC0415
            import pstats  # noqa: PLC0415

            profiler.disable()
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(30)
            out["profile"] = buf.getvalue()
    read = indexed = added = 0
    for name, _level, text in messages:
        m = SCANNED.search(text)
        if name == "pgsnap.observe" and m:
            read += int(m.group(1))
            indexed += int(m.group(2))
            added += int(m.group(3))
    out.update(
        read=read,
        indexed=indexed,
        added=added,
        scans=sum(1 for n, _, t in messages if n == "pgsnap.observe" and SCANNED.search(t)),
        logged_warnings=[f"{n}: {t}" for n, lv, t in messages if lv >= logging.WARNING],
        pgsnap=sys.modules["pgsnap"].__file__,
        maxrss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        hwm_kb=_vm_hwm_kb(),
    )
    return out


# --------------------------------------------------------------------------- measuring


def gnu_time() -> str | None:
    found = shutil.which("time")
    if found and Path(found).is_file():
        return found
    return "/usr/bin/time" if Path("/usr/bin/time").is_file() else None


def run_process(argv: list[str], *, capture: bool) -> dict[str, Any]:
    """Run ``argv`` (through GNU time when present): wall time, peak RSS, its stdout."""
    timer = gnu_time()
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        full = [timer, "-f", "%M", "-o", rss_file.name, *argv] if timer else argv
        t0 = time.perf_counter()
        proc = subprocess.run(
            full,
            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        wall = time.perf_counter() - t0
        rss_lines = rss_file.read().strip().splitlines()
    rss_mb = int(rss_lines[-1]) / 1024 if rss_lines and rss_lines[-1].isdigit() else None
    return {
        "wall": wall,
        "rss_mb": rss_mb,
        "rc": proc.returncode,
        "stdout": proc.stdout.decode() if capture else "",
        "stderr": proc.stderr.decode(errors="replace"),
    }


class Method:
    """One row of the table: how to run it, what to do before each run."""

    def __init__(
        self,
        name: str,
        *,
        spec: dict[str, Any] | None = None,
        argv: list[str] | None = None,
        before: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.argv = argv
        self.before = before
        self.runs: list[dict[str, Any]] = []

    def run(self) -> dict[str, Any]:
        if self.before is not None:
            self.before()
        if self.spec is not None:
            me = [sys.executable, str(Path(__file__).resolve())]
            res = run_process([*me, "--child", json.dumps(self.spec)], capture=True)
            if res["rc"] != 0:
                raise RuntimeError(f"{self.name}: child failed ({res['rc']}):\n{res['stderr']}")
            res["report"] = json.loads(res["stdout"].strip().splitlines()[-1])
            res["seconds"] = res["report"].get("seconds")
            # The process's own ru_maxrss when GNU time launched it (%M says the same);
            # forked from this process, ru_maxrss starts at this process's peak: VmHWM then.
            rep = res["report"]
            source = os.environ.get(SOURCE_ENV)
            if source and not str(rep["pgsnap"]).startswith(source):
                raise RuntimeError(f"{self.name}: imported {rep['pgsnap']}, not the copy")
            kb = rep["maxrss_kb"] if gnu_time() or rep["hwm_kb"] is None else rep["hwm_kb"]
            res["peak_mb"] = kb / 1024
        else:
            assert self.argv is not None
            res = run_process(self.argv, capture=False)
            if res["rc"] != 0:
                raise RuntimeError(f"{self.name} failed ({res['rc']}): {res['stderr'][-2000:]}")
            res["seconds"] = res["wall"]
            res["peak_mb"] = res["rss_mb"]
        self.runs.append(res)
        return res


def spread(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}, {max(values):.{digits}f})"


# --------------------------------------------------------------------------- workload


def pg_env(server: Any) -> dict[str, str]:
    return {
        **os.environ,
        "PGHOST": str(server.socket_dir),
        "PGPORT": str(server.port),
        "PGUSER": "postgres",
    }


def insert_lsn(server: Any) -> int:
    return int(server.sql("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")[0][0])


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def checkpoints(server: Any) -> int:
    if server.major >= 17:
        row = server.sql("SELECT num_timed + num_requested FROM pg_stat_checkpointer")
    else:
        row = server.sql("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
    return int(row[0][0])


def commits(server: Any) -> int:
    row = server.sql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
    return int(row[0][0])


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the generation left: the backup, the targets, the WAL and how it was made."""

    backup_id: str
    start_lsn: int
    end_lsn: int
    xid: int
    target_time: str
    restore_points: int
    seconds: float
    commits: int
    checkpoints: int
    cluster: dict[str, Any]
    """How a child process builds the same Cluster (:func:`cluster_spec`)."""

    @property
    def segments(self) -> int:
        return (self.end_lsn - self.start_lsn + SEGSZ - 1) // SEGSZ


def generate(
    server: Any, bindir: Path, scratch: Path, args: argparse.Namespace, say: Callable[[str], None]
) -> Workload:
    from pgsnap.testing.sandbox import mock_cluster  # noqa: PLC0415

    env = pg_env(server)
    t0 = time.perf_counter()
    subprocess.run(
        [str(bindir / "pgbench"), "-i", "-q", "-s", str(args.scale), "postgres"],
        env=env,
        check=True,
        capture_output=True,
    )
    server.sql("CREATE TABLE bulk (id int, v text)")
    server.sql("CREATE TABLE marks (at timestamptz, note text)")
    say(f"pgbench -i -s {args.scale}: {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    cluster = mock_cluster(server)
    record = cluster.backup("bench")
    assert record.stop_lsn is not None
    start_lsn = record.start_lsn.value
    say(
        f"pgsnap backup {record.id}: {time.perf_counter() - t0:.1f} s, WAL from "
        f"{record.start_lsn} (stop {record.stop_lsn})"
    )

    bulk = scratch / "bulk.sql"
    bulk.write_text(BULK_SQL)
    scripts = ["-b", f"tpcb-like@{10 - args.bulk_weight}"]
    if args.bulk_weight:
        scripts += ["-f", f"{bulk}@{args.bulk_weight}"]
    load_env = {**env, "PGOPTIONS": "-c synchronous_commit=off"}
    argv = [
        str(bindir / "pgbench"),
        "-n",
        "-c",
        str(args.clients),
        "-j",
        str(min(args.clients, os.cpu_count() or 1)),
        "-T",
        "86400",
        *scripts,
        "postgres",
    ]
    goal = start_lsn + args.segments * SEGSZ
    span = goal - start_lsn
    commits0, checkpoints0 = commits(server), checkpoints(server)
    marks: dict[str, Any] = {}
    points = 0
    truncates = 0
    say(
        f"load: pgbench -c {args.clients}, "
        + (
            f"TPC-B-like @{10 - args.bulk_weight} + 500-row inserts @{args.bulk_weight}"
            if args.bulk_weight
            else "TPC-B-like only"
        )
        + f", synchronous_commit=off for the load (fsync=on), until {args.segments} segments "
        "past the backup's start"
    )
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=load_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        reported = 0
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise RuntimeError(f"pgbench ended early ({proc.returncode}):\n{out[-3000:]}")
            done = (insert_lsn(server) - start_lsn) / span
            if done >= 1:
                break
            if "xid" not in marks and done >= 0.5:
                row = server.sql(
                    "INSERT INTO marks VALUES (clock_timestamp(), 'xid target') "
                    "RETURNING txid_current() % 4294967296, clock_timestamp()::text"
                )
                marks["xid"] = int(row[0][0])
                say(f"  {done:4.0%}: xid target {marks['xid']} committed (at {row[0][1]})")
            if "time" not in marks and done >= 0.65:
                when = server.sql("SELECT clock_timestamp()")[0][0]
                marks["time"] = when.astimezone(dt.UTC).isoformat()
                say(f"  {done:4.0%}: time target {marks['time']} (server clock, under load)")
            if int(done * 10) > points:
                points = int(done * 10)
                server.sql("SELECT pg_create_restore_point(%s)", (f"bench-{points}",))
            if int(done * 10) > reported:
                reported = int(done * 10)
                took = time.perf_counter() - t0
                say(
                    f"  {done:4.0%}: {done * span / GB:.1f} GB of WAL in {took:.0f} s "
                    f"({done * span / MiB / took:.0f} MB/s)"
                )
            size = int(server.sql("SELECT pg_total_relation_size('bulk')")[0][0])
            if size > 512 * MiB:  # keep the disk bounded: the WAL is what matters
                server.sql("TRUNCATE bulk")
                truncates += 1
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    seconds = time.perf_counter() - t0
    server.sql("SELECT pg_create_restore_point('bench-end')")
    last = server.switch_wal_and_wait_archived(timeout=1800)
    server.wait_for_archive_idle(timeout=1800)
    segno = int(last[8:16], 16) * (0x100000000 // SEGSZ) + int(last[16:], 16)
    work = Workload(
        backup_id=record.id,
        start_lsn=start_lsn,
        end_lsn=(segno + 1) * SEGSZ,
        xid=marks["xid"],
        target_time=marks["time"],
        restore_points=points + 1,
        seconds=seconds,
        commits=commits(server) - commits0,
        checkpoints=checkpoints(server) - checkpoints0,
        cluster=cluster_spec(server, cluster),
    )
    wal_bytes = work.end_lsn - work.start_lsn
    rate = wal_bytes / MiB / work.seconds
    per_commit = wal_bytes / max(1, work.commits)
    say(
        f"load: {work.seconds:.0f} s, {wal_bytes / GB:.1f} GB of WAL ({rate:.0f} MB/s), "
        f"{work.commits} commits ({per_commit:.0f} bytes of WAL per commit), "
        f"{work.checkpoints} checkpoints, {work.restore_points} restore points, "
        f"bulk table truncated {truncates} times; archived up to {last}"
    )
    return work


# --------------------------------------------------------------------------- main


def required_bytes(segments: int, max_wal_size_gb: float) -> int:
    """The archive, pg_wal (max_wal_size and some), the database, a snapshot copy."""
    return int(segments * SEGSZ + 1.5 * max_wal_size_gb * 1024**3 + 3 * GB)


def cluster_spec(server: Any, cluster: Any) -> dict[str, Any]:
    """What a child needs to build the same Cluster as ``mock_cluster`` made."""
    return {
        "conninfo": server.conninfo(),
        "data_directory": str(server.data_dir),
        "bindir": str(server.bindir),
        "os_user": server.os_user,
        "log_file": str(server.log_file),
        "snapshots": str(server.base_dir / "snapshots"),
        "state_file": str(server.base_dir / "mock.json"),
        "archive": str(server.archive_dir),
        "catalog": str(server.base_dir / "catalog"),
        "journal": str(server.base_dir / "journal"),
        "volumes": [[v.id, v.name, v.role.value, v.mount_point] for v in cluster.layout.volumes],
    }


def snapshot_source(into: Path, *, worktree: bool) -> tuple[Path, str]:
    """Copy the pgsnap package into ``into``: the last commit's (``git archive HEAD``), or
    the work tree's; return the directory to import it from, and what was copied."""
    into.mkdir(parents=True)
    if not worktree:
        try:
            head = subprocess.run(
                ["git", "-C", str(REPO), "log", "-1", "--format=%h %cI"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            tar = subprocess.run(
                ["git", "-C", str(REPO), "archive", "HEAD", "pgsnap"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
        except (OSError, subprocess.CalledProcessError):
            pass  # not a git checkout: the work tree
        else:
            dirty = subprocess.run(
                ["git", "-C", str(REPO), "status", "--porcelain", "--", "pgsnap"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip()
            note = " (uncommitted changes in the work tree not measured)" if dirty else ""
            return into, f"commit {head}{note}"
    shutil.copytree(REPO / "pgsnap", into / "pgsnap", ignore=shutil.ignore_patterns("__pycache__"))
    return into, f"the work tree ({revision()})"


def source_digest(package: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def revision() -> str:
    """The pgsnap commit measured, and whether pgsnap/ has uncommitted changes."""
    repo = REPO
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "log", "-1", "--format=%h %cI"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "pgsnap"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"commit {head}" + (" with uncommitted changes in pgsnap/" if dirty else "")


def parse_size_gb(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(MB|GB)", text.strip(), re.IGNORECASE)
    if m is None:
        raise argparse.ArgumentTypeError(f"a size like 4GB or 512MB, not {text!r}")
    value = float(m.group(1))
    return value / 1024 if m.group(2).upper() == "MB" else value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=1000, help="16 MB segments of WAL")
    parser.add_argument("--runs", type=int, default=3, help="runs of each method (default 3)")
    parser.add_argument("--bindir", help="PostgreSQL binaries (default: 15, found as the tests do)")
    parser.add_argument("--dir", default="/tmp", help="parent of the scratch directories")
    parser.add_argument("--scale", type=int, default=10, help="pgbench scale (default 10)")
    parser.add_argument("--clients", type=int, default=4, help="pgbench clients (default 4)")
    parser.add_argument(
        "--bulk-weight",
        type=int,
        default=1,
        choices=range(10),
        help="in 10 transactions, how many insert 500 rows (default 1; 0: TPC-B-like only)",
    )
    parser.add_argument(
        "--max-wal-size", type=parse_size_gb, default=4.0, help="server max_wal_size (4GB)"
    )
    parser.add_argument(
        "--budget-row",
        type=int,
        help="the scan budget of the 'default budget' row (default: pgsnap's max_scan_segments)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="at the end, print a cProfile of one more warm time-target plan (not measured)",
    )
    parser.add_argument(
        "--worktree",
        action="store_true",
        help="measure the work tree's pgsnap (default: the last commit's, git archive HEAD)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.segments < 4 or args.runs < 1:
        parser.error("--segments must be >= 4 and --runs >= 1")

    def say(msg: str = "") -> None:
        print(msg, flush=True)

    parent = Path(args.dir)
    free = shutil.disk_usage(parent).free
    need = required_bytes(args.segments, args.max_wal_size)
    if free < need:
        say(
            f"refusing to run: {free / GB:.1f} GB free on {parent}, {args.segments} segments need "
            f"about {need / GB:.1f} GB (archive {args.segments * SEGSZ / GB:.1f} GB, pg_wal up to "
            f"~{1.5 * args.max_wal_size:.1f} GiB, database and a snapshot copy); free some space, "
            "pass --dir on a larger file system or fewer --segments"
        )
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="pgsnap-bench-plan-", dir=parent))
    server: Any = None
    try:
        # Measure one version of pgsnap from start to end, whatever happens to the work tree.
        source, what = snapshot_source(scratch / "src", worktree=args.worktree)
        os.environ[SOURCE_ENV] = str(source)
        sys.path.insert(0, str(source))
        from pgsnap.testing.pgserver import PgServer, find_postgres_bindir  # noqa: PLC0415

        bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
        for tool in ("pgbench", "pg_waldump"):
            if not (bindir / tool).is_file():
                say(f"{bindir / tool} not found: pass --bindir (apt-get install postgresql-15)")
                return 2
        load = os.getloadavg()
        say(
            f"bench_plan_recovery: {dt.date.today().isoformat()}, {platform.node()}, "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
            f"{load[0]:.2f}; {free / GB:.0f} GB free on {parent} (need {need / GB:.0f} GB)"
        )
        say(
            f"pgsnap: {what}, copied at the start and measured throughout (source digest "
            f"{source_digest(source / 'pgsnap')})"
        )
        if gnu_time() is None:
            say(
                "no GNU time: a child's ru_maxrss then includes this process's peak (inherited "
                "through fork); VmHWM is reported instead"
            )
        settings: dict[str, str | bool] = {
            "fsync": True,
            "max_wal_size": f"{int(args.max_wal_size * 1024)}MB",
            "checkpoint_timeout": "1h",
        }
        server = PgServer.create(
            bindir,
            wal_segsize_mb=16,
            separate_wal_dir=True,
            archive=True,
            settings=settings,
            parent_dir=parent,
        )
        server.start()
        say(
            f"PostgreSQL {server.major} ({server.version_num}) in {server.base_dir}: 16 MB "
            f"segments, WAL in its own directory, archive by cp, fsync=on, max_wal_size "
            f"{settings['max_wal_size']}, checkpoint_timeout 1h"
        )
        work = generate(server, bindir, scratch, args, say)
        server.stop()
        say("server stopped for the measurements")
        measure(server, bindir, scratch, work, args, say)
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def measure(
    server: Any,
    bindir: Path,
    scratch: Path,
    work: Workload,
    args: argparse.Namespace,
    say: Callable[[str], None],
) -> None:
    import inspect  # noqa: PLC0415

    from pgsnap.cluster import Cluster  # noqa: PLC0415

    default_budget = inspect.signature(Cluster.__init__).parameters["max_scan_segments"].default
    limited = args.budget_row if args.budget_row is not None else default_budget
    # Every row but the limited one may read the whole stretch: backup start to the end
    # of the archive, plus what is left in the stopped server's pg_wal.
    budget = max(default_budget, work.segments + 64)
    index = server.base_dir / "catalog" / "wal-index"
    other_index = scratch / "wal-index-limited"
    base = {"cluster": work.cluster, "max_scan_segments": budget, "wal_index": None}
    time_target = ["time", work.target_time]

    def drop(path: Path) -> Callable[[], None]:
        return lambda: shutil.rmtree(path, ignore_errors=True)

    methods = [
        Method("cold, time target", spec={**base, "target": time_target}, before=drop(index)),
        Method("warm, time target", spec={**base, "target": time_target}),
        Method("warm, latest", spec={**base, "target": ["latest", None]}),
        Method("warm, xid target", spec={**base, "target": ["xid", work.xid]}),
        Method(
            "no index (wal_index=False), time",
            spec={**base, "wal_index": False, "target": time_target},
        ),
    ]
    if work.segments > limited:
        methods.append(
            Method(
                f"cold, max_scan_segments={limited}, time",
                spec={
                    **base,
                    "wal_index": str(other_index),
                    "max_scan_segments": None if args.budget_row is None else limited,
                    "target": time_target,
                },
                before=drop(other_index),
            )
        )
    waldump_argv = [
        str(bindir / "pg_waldump"),
        "-p",
        str(server.archive_dir),
        "-s",
        lsn_text(work.start_lsn),
        "-e",
        lsn_text(work.end_lsn),
        "-t",
        "1",
        "-r",
        "Transaction",
        "-r",
        "XLOG",
    ]
    methods.append(Method("pg_waldump -r Transaction -r XLOG", argv=waldump_argv))
    methods.append(Method("baseline: import + build Cluster", spec={**base, "target": None}))

    wal_gb = (work.end_lsn - work.start_lsn) / GB
    say("")
    say(
        f"== measuring: {work.segments} segments ({wal_gb:.1f} GB of WAL) from the backup's "
        f"start {lsn_text(work.start_lsn)} to {lsn_text(work.end_lsn)}; time target "
        f"{work.target_time}, xid target {work.xid} =="
    )
    say(
        f"scan budget: max_scan_segments={budget} (the whole stretch) for every row"
        + (
            f" but 'cold, max_scan_segments={limited}'"
            + ("" if args.budget_row is not None else " (pgsnap's default budget)")
            if work.segments > limited
            else f" (the stretch fits pgsnap's default budget of {limited} too)"
        )
    )
    say(f"pg_waldump: {' '.join(waldump_argv)} > /dev/null")
    in_pg_wal = [p for p in server.wal_dir.iterdir() if p.is_file()]
    say(
        f"the stopped server's pg_wal (kept: planning reads it too): {len(in_pg_wal)} files, "
        f"{sum(p.stat().st_size for p in in_pg_wal) / GB:.1f} GB"
    )
    stats = subprocess.run(
        [*waldump_argv[:-4], "--stats"], capture_output=True, text=True, check=False
    ).stdout
    say("the WAL (pg_waldump --stats: records, record bytes, full-page-image bytes, total bytes):")
    for line in stats.splitlines():
        if line.startswith(("Transaction", "Heap ", "Heap2", "Btree", "Total")):
            f = line.split()
            say(f"  {' '.join(f)}")
    for r in range(args.runs):
        order = methods[r % len(methods) :] + methods[: r % len(methods)]
        for m in order:
            res = m.run()
            rep = res.get("report", {})
            detail = ""
            if m.spec is not None and m.spec["target"] is not None:
                detail = (
                    f", {rep['read']} segments read, {rep['indexed']} from the index, "
                    f"{rep['added']} added"
                )
                if "error" in rep:
                    detail += f", ERROR {rep['error']}"
            secs = "-" if res["seconds"] is None else f"{res['seconds']:.3f} s"
            peak = "-" if res["peak_mb"] is None else f"{res['peak_mb']:.1f} MB"
            say(
                f"round {r + 1}: {m.name}: {secs} (process {res['wall']:.3f} s, "
                f"peak RSS {peak}{detail})"
            )
    load = os.getloadavg()
    say(f"load average after the measurements: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    report(methods, work, budget, say)
    if args.profile:
        res = Method("profile", spec={**base, "target": time_target, "profile": True}).run()
        say("")
        say(f"cProfile of one more warm time-target plan ({res['seconds']:.3f} s profiled):")
        say(res["report"]["profile"].strip())


def report(methods: list[Method], work: Workload, budget: int, say: Callable[[str], None]) -> None:
    by = {m.name: m for m in methods}
    rows = []
    for m in methods:
        secs = [r["seconds"] for r in m.runs if r["seconds"] is not None]
        walls = [r["wall"] for r in m.runs]
        peaks = [r["peak_mb"] for r in m.runs if r["peak_mb"] is not None]
        if m.spec is not None and m.spec["target"] is not None:
            counts = sorted({f"{r['report']['read']}/{r['report']['indexed']}" for r in m.runs})
            segs = ", ".join(counts)
        else:
            segs = "-"
        rows.append(
            [
                m.name,
                spread(secs) if m.spec is None or m.spec["target"] is not None else "-",
                spread(walls),
                f"{max(peaks):.1f}" if peaks else "n/a",
                segs,
            ]
        )
    say("")
    say(
        f"== Results: {len(methods[0].runs)} runs of each, median (min, max); "
        f"{work.segments} segments, {(work.end_lsn - work.start_lsn) / GB:.1f} GB of WAL =="
    )
    say("")
    say(
        table(
            rows,
            [
                "method",
                "plan_recovery() s",
                "process wall s",
                "peak RSS MB (max)",
                "segments read/from index",
            ],
        )
    )
    say("")
    say(
        "plan_recovery() s: the call alone, in the child process (observation: catalog, "
        "archive listing, histories, WAL read; and planning); process wall: interpreter "
        "start, imports, Cluster built, the call, exit. pg_waldump: its wall time in both."
    )

    # The plans must agree.
    def plans(name: str) -> list[tuple[str, str]]:
        m = by.get(name)
        if m is None:
            return []
        return [
            (
                json.dumps(r["report"].get("summary"), sort_keys=True),
                json.dumps(r["report"].get("warnings")),
            )
            for r in m.runs
        ]

    cold = plans("cold, time target")
    compared = ["cold, time target", "warm, time target", "no index (wal_index=False), time"]
    say("")
    for m in methods:
        for r in m.runs:
            if "error" in r.get("report", {}):
                say(f"PLANNING FAILED: {m.name}: {r['report']['error']}")
    distinct = {p for name in compared for p in plans(name)}
    if len(distinct) > 1:
        say(f"MISMATCH: the time target's plans differ ({len(distinct)} distinct):")
        for name in compared:
            for i, (summary, warnings) in enumerate(plans(name)):
                say(f"  {name}, run {i + 1}: summary {summary}; warnings {warnings}")
    elif cold:
        say(
            "plans agree: the cold, warm and no-index plans of the time target have the "
            "same summary and warnings in every run:"
        )
        first = by["cold, time target"].runs[0]["report"]
        for key, value in first.get("summary", {}).items():
            say(f"  {key}: {value}")
        for w in first.get("warnings", []):
            say(f"  warning: {w}")
    for m in methods:
        if m.spec is None or "max_scan_segments=" not in m.name:
            continue
        differs = set(plans(m.name)) != set(cold)
        rep = m.runs[0]["report"]
        say(
            f"{m.name}: read {rep['read']} segments; its plan "
            + ("DIFFERS from the full read's:" if differs else "is the full read's")
        )
        if differs:
            say(f"  summary {json.dumps(rep.get('summary'), sort_keys=True)}")
            for w in rep.get("warnings", []):
                say(f"  warning: {w}")
    logged = sorted(
        {w for m in methods for r in m.runs for w in r.get("report", {}).get("logged_warnings", [])}
    )
    for w in logged:
        say(f"logged: {w}")

    say("")
    warm = [r["seconds"] for r in by["warm, time target"].runs if r["seconds"] is not None]
    med = statistics.median(warm)
    say(
        f"warm planning of a time target: {med:.3f} s (median of {len(warm)}; max "
        f"{max(warm):.3f} s) (target < {TARGET_WARM_SECONDS:.0f} s): "
        f"{'met' if med < TARGET_WARM_SECONDS else 'NOT met'}"
        + (
            ""
            if max(warm) < TARGET_WARM_SECONDS or med >= TARGET_WARM_SECONDS
            else " (but not in every run)"
        )
    )
    pgsnap_rows = [m for m in methods if m.spec is not None and m.spec["target"] is not None]
    peak, peak_name = max(
        (r["peak_mb"], m.name) for m in pgsnap_rows for r in m.runs if r["peak_mb"] is not None
    )
    base_rss = max(r["peak_mb"] for r in by["baseline: import + build Cluster"].runs)
    say(
        f"peak RSS: {peak:.1f} MB ({peak_name}; the largest of every pgsnap run) "
        f"(target < {TARGET_RSS_MB:.0f} MB): {'met' if peak < TARGET_RSS_MB else 'NOT met'}"
    )
    say(
        f"  the RSS is the whole process's: interpreter, imported modules (pgsnap and "
        f"what it imports) and the planning. A process that only imports pgsnap and builds the "
        f"Cluster peaks at {base_rss:.1f} MB; planning adds at most {peak - base_rss:.1f} MB"
    )
    hwm = [
        (r["report"].get("hwm_kb") or 0) / 1024 - r["peak_mb"] for m in pgsnap_rows for r in m.runs
    ]
    if hwm and max(abs(x) for x in hwm) > 1:
        say(f"  (VmHWM and ru_maxrss differ by up to {max(abs(x) for x in hwm):.1f} MB)")
    say(f"  scan budget of the measured rows: max_scan_segments={budget}")


if __name__ == "__main__":
    sys.exit(main())
