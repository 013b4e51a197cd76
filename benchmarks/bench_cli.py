"""Benchmark: the whole ``pgsnap`` command at fleet scale, on its own and through
``pgsnap agent`` (issue 27).

Run (as root, after ``python benchmarks/bench_fleet.py --keep`` has made the fleet's
data; nothing else running)::

    python benchmarks/bench_cli.py                 # 7 runs of each
    python benchmarks/bench_cli.py --runs 3 --keep-snapshots 100

What it times, each as a new process started from here (the ``pgsnap`` program beside
this interpreter, not a shell shim), alternating the two ways run by run:

- ``pgsnap plan-recovery -c fleet.toml`` (latest) and with ``--time T`` (the fleet's
  time target: the newest backup's stop + 10 minutes), over bench_fleet's archive of
  1,000,000 segments on 3 timelines and catalog of 10,000 backups, the WAL index warm
  (one untimed plan of each first);
- ``pgsnap list --json -c fleet.toml``;
- ``pgsnap backup -c backup.toml --json --json-events`` (unless ``--no-backup``): a
  backup of a real, throwaway PostgreSQL 15 server made the fleet's cluster as
  bench_fleet makes it (its ``pg_control`` given the fleet's system identifier,
  ``pg_resetwal -l`` putting it on timeline 3 after the archive's newest segment),
  archiving into the fleet's archive, its backups recorded in the fleet's catalog, its
  data and ``pg_wal`` directories two volumes of a mock backend in another state file
  (fsync on).
  The backups are timed after the other commands (each leaves segments in the archive,
  which a ``latest`` plan would read); each new backup is deleted untimed
  (``pgsnap delete``), so every run sees 10,000 backups; at the end the segments the
  server archived are removed. The
  figures beside it are the backup's two steps that are not pgsnap's (``backup-start``,
  which waits for PostgreSQL's checkpoint, and ``snapshot``, the mock's copy of the
  server's files, where an array would take its snapshot) and the rest of the command,
  which the backup's verdict is on;

each **on its own** (a fresh interpreter importing everything) and **with
``PGSNAP_AGENT`` set** (an agent started here once, untimed, from the same
interpreter and code).

The configuration is a user's: the fleet's catalog and archive, a mock storage backend
in a state file (``--dir``/cli) holding the snapshots of the newest
``--keep-snapshots`` backups (30 by default: an array keeps tens of snapshots, while a
catalog keeps years of backups whose snapshots expired), the database not running.
Every plan is checked to choose the newest backup.

Targets (issue 27): ``plan-recovery`` (latest and a time target) and ``backup`` at
most 0.5 s and 150 MB, ``list --json`` of 10,000 backups at most 0.3 s, as the whole
command. Peak
RSS is the command's process (GNU time's ``%M``); with the agent that is the client:
the fork that plans is a process of the agent's, and the agent's own peak (what
every fork starts from) is printed beside. Prints figures and "met" / "NOT met";
never asserts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_fleet as fleet
from _report import git_commit, raise_on_sigterm, table, uncommitted

TARGET_PLAN_SECONDS = 0.5
TARGET_PLAN_MB = 150.0
TARGET_LIST_SECONDS = 0.3
MB = 1000**2
BACKUP = "backup"


def pgsnap_program() -> str:
    beside = Path(sys.executable).with_name("pgsnap")
    found = str(beside) if beside.is_file() else shutil.which("pgsnap")
    if found is None:
        raise SystemExit("no pgsnap program: pip install -e . in the checkout")
    return found


def prepare(root: Path, work: Path, shape: fleet.Shape, keep: int) -> Path:
    """The mock's state (every backup's group made as bench_fleet's in-memory mock
    makes them, all but the newest ``keep`` deleted) and the configuration."""
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415

    shutil.rmtree(work, ignore_errors=True)
    for name in ("pgdata", "pgwal", "snapshots"):
        (work / name).mkdir(parents=True)
    now = [shape.t0]
    backend = MockBackend(clock=lambda: now[0], root=work / "snapshots")
    backend.add_volume("pgdata", volume_id="vol-0001", path=work / "pgdata")
    backend.add_volume("pgwal", volume_id="vol-0002", path=work / "pgwal")
    groups = []
    for i in range(shape.backups):  # ids cg-NNNN, snap-NNNN as the records name them
        now[0] = fleet.backup_times(shape, i)[0] + dt.timedelta(seconds=2)
        groups.append(backend.create_snapshot_group(["vol-0001", "vol-0002"], f"nightly {i}"))
    for group in groups[:-keep]:
        backend.delete_snapshot_group(group.id)
    state = work / "mock-state.json"
    backend._save_state(state)
    config = work / "pgsnap.toml"
    config.write_text(
        f"""[database]
conninfo = "host={work / "nosock"} port=1 user=postgres"
data_directory = "{work / "nodata"}"

[storage]
backend = "mock"

[storage.options]
state_file = "{state}"
root = "{work / "snapshots"}"

[archive]
path = "{root / "archive"}"

[catalog]
path = "{root / "catalog"}"

[[volume]]
id = "vol-0001"
name = "pgdata"
role = "data"
mount_point = "{work / "pgdata"}"

[[volume]]
id = "vol-0002"
name = "pgwal"
role = "wal"
mount_point = "{work / "pgwal"}"
"""
    )
    return config


class BackupServer:
    """The fleet's cluster as a real server (see the module docstring), and the
    configuration that backs it up into the fleet's catalog."""

    def __init__(self, root: Path, work: Path, shape: fleet.Shape) -> None:
        from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
        from pgsnap.testing.pgserver import PgServer, find_postgres_bindir  # noqa: PLC0415

        self.root = root
        self.archive = root / "archive"
        self.archive_stat = self.archive.stat()
        self.before = set(os.listdir(self.archive))
        base = work / "backup"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        self.server = PgServer.create(
            find_postgres_bindir(15),
            wal_segsize_mb=16,
            separate_wal_dir=True,
            archive=True,
            archive_dir=self.archive,
            parent_dir=base,
            settings={"fsync": True},  # the test servers' default is off: a benchmark's is on
        )
        owner = self.server.os_user
        import pwd  # noqa: PLC0415

        entry = pwd.getpwnam(owner)
        os.chown(self.archive, entry.pw_uid, entry.pw_gid)  # the server archives into it
        fleet._become_the_fleets_cluster(self.server, shape)
        self.server.start()
        last = self.server.sql("SELECT pg_walfile_name(pg_switch_wal())")[0][0]
        deadline = time.monotonic() + 60
        while self.server.sql("SELECT last_archived_wal FROM pg_stat_archiver")[0][0] != last:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{last} was not archived within 60 s")
            time.sleep(0.05)
        backend = MockBackend(root=base / "snapshots")
        backend.add_volume("pgdata", volume_id="vol-0001", path=self.server.data_dir)
        backend.add_volume("pgwal", volume_id="vol-0002", path=self.server.wal_dir)
        state = base / "mock-state.json"
        backend._save_state(state)
        srv = self.server
        self.config = self.config_path(work)
        self.config.write_text(
            f"""[database]
conninfo = "{srv.conninfo()}"
data_directory = "{srv.data_dir}"
bindir = "{srv.bindir}"
os_user = "{owner}"
log_file = "{srv.log_file}"

[storage]
backend = "mock"

[storage.options]
state_file = "{state}"
root = "{base / "snapshots"}"

[archive]
path = "{self.archive}"

[catalog]
path = "{root / "catalog"}"
journal = "{base / "journal"}"

[[volume]]
id = "vol-0001"
name = "pgdata"
role = "data"
mount_point = "{srv.data_dir}"

[[volume]]
id = "vol-0002"
name = "pgwal"
role = "wal"
mount_point = "{srv.wal_dir}"
"""
        )

    @staticmethod
    def config_path(work: Path) -> Path:
        """Where the server's configuration is written (known before it is made)."""
        return work / "backup" / "backup.toml"

    def forget(self, program: str, env: dict[str, str], backup_id: str) -> None:
        """Delete a backup this bench took (its record and its snapshots)."""
        done = subprocess.run(
            [program, "delete", backup_id, "-c", str(self.config)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pgsnap delete {backup_id} failed:\n{done.stderr[-3000:]}")

    def close(self) -> None:
        """Stop the server; leave the fleet's archive as it was."""
        try:
            self.server.cleanup()
        finally:
            for name in set(os.listdir(self.archive)) - self.before:
                (self.archive / name).unlink(missing_ok=True)
            os.chown(self.archive, self.archive_stat.st_uid, self.archive_stat.st_gid)


def backup_parts(r: dict[str, Any]) -> None:
    """The steps that wait for others (PostgreSQL's checkpoint, the storage's snapshot)
    from ``--json-events`` on standard error, and the rest of the command."""
    steps: dict[str, float] = {}
    for line in r["err"].splitlines():
        if line.startswith("{"):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("kind") in ("finished", "failed") and ev.get("seconds") is not None:
                steps[str(ev.get("step"))] = float(ev["seconds"])
    waits = steps.get("backup-start", 0.0) + steps.get("snapshot", 0.0)
    r["waits"] = waits if steps else None
    r["rest"] = r["seconds"] - waits if steps else None


def parts(rs: list[dict[str, Any]]) -> str:
    waits = [r["waits"] for r in rs if r.get("waits") is not None]
    rest = [r["rest"] for r in rs if r.get("rest") is not None]
    if not waits:
        return "? (no step events)"
    return f"{statistics.median(waits):.3f} / {statistics.median(rest):.3f} s"


def timed(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One run under GNU time: wall seconds, peak RSS, exit code, output."""
    rss = Path(f"/tmp/bench-cli-{os.getpid()}.rss")
    t0 = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%M", "-o", str(rss), *argv],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    wall = time.perf_counter() - t0
    text = rss.read_text().strip().splitlines()
    rss.unlink(missing_ok=True)
    return {
        "seconds": wall,
        "mb": int(text[-1]) * 1024 / MB if text and text[-1].isdigit() else None,
        "code": done.returncode,
        "out": done.stdout,
        "err": done.stderr,
    }


def start_agent(program: str, work: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    sock = work / "agent.sock"
    log = (work / "agent.log").open("wb")
    agent = subprocess.Popen(
        [program, "agent", "--socket", str(sock)], stdout=log, stderr=log, env=env
    )
    log.close()
    deadline = time.monotonic() + 60
    while not sock.exists():
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"pgsnap agent did not start: {(work / 'agent.log').read_text()}")
        time.sleep(0.05)
    return agent


def peak_mb(pid: int) -> float | None:
    """A running process's peak RSS (``VmHWM``)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / MB
    except OSError:
        return None
    return None


def median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f} .. {max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/var/tmp/pgsnap-fleet", help="bench_fleet's data")
    parser.add_argument("--segments", type=int, default=1_000_000)
    parser.add_argument("--backups", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep-snapshots", type=int, default=30)
    parser.add_argument(
        "--no-backup", action="store_true", help="leave `pgsnap backup` (and its server) out"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    root = Path(args.dir)
    shape = fleet.Shape(args.segments, args.backups)
    if fleet.load_manifest(root, shape) is None:
        print(
            f"no fleet data for {args.segments:,} segments and {args.backups:,} backups in "
            f"{root}: run python benchmarks/bench_fleet.py --segments {args.segments} "
            f"--backups {args.backups} --keep first"
        )
        return 2
    work = root.parent / (root.name + "-cli")
    program = pgsnap_program()
    t0 = time.perf_counter()
    config = prepare(root, work, shape, args.keep_snapshots)
    print(
        f"bench_cli: {program}, {config}: {args.keep_snapshots} of {args.backups:,} backups "
        f"with snapshots (prepared in {time.perf_counter() - t0:.1f} s); "
        f"commit {git_commit() or '? (not a git checkout)'}"
        f"{' + uncommitted ' + ', '.join(uncommitted()) if uncommitted() else ''}; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    plain = {k: v for k, v in os.environ.items() if k != "PGSNAP_AGENT"}
    target = fleet.target_time(shape).isoformat()
    commands = {
        "plan-recovery (latest)": [program, "plan-recovery", "-c", str(config), "--json"],
        "plan-recovery --time": [
            *[program, "plan-recovery", "-c", str(config), "--json"],
            *["--time", target],
        ],
        "list --json": [program, "list", "--json", "-c", str(config)],
    }
    newest = fleet.backup_times(shape, shape.backups - 1)[0]
    if not args.no_backup:
        config_of_server = BackupServer.config_path(work)  # written when the server is made
        commands[BACKUP] = [
            *[program, "backup", "-c", str(config_of_server), "--json", "--json-events"]
        ]
    servers: list[BackupServer] = []

    def make_server() -> BackupServer:
        servers.append(BackupServer(root, work, shape))
        return servers[-1]

    try:
        return run(program, work, commands, plain, newest, args.runs, make_server)
    finally:
        for server in servers:
            server.close()


def run(
    program: str,
    work: Path,
    commands: dict[str, list[str]],
    plain: dict[str, str],
    newest: dt.datetime,
    runs: int,
    make_server: Callable[[], BackupServer],
) -> int:
    """Time each command ``runs`` times each way; print the table and the verdicts. The
    backup's server is made (``make_server``) when the backups' phase begins."""
    server: BackupServer | None = None

    def ok(name: str, mode: str, r: dict[str, Any]) -> bool:
        if r["code"] != 0 or "running in this process" in r["err"]:
            print(f"{name} ({mode}) failed ({r['code']}):\n{r['err'][-3000:]}")
            return False
        if name == BACKUP and server is not None:
            record = json.loads(r["out"])
            server.forget(program, plain, record["id"])
            backup_parts(r)
        return True

    # The backups come last, in a phase of their own, their server made only then: it
    # archives into the fleet's archive (each backup switches WAL), and a `latest` plan
    # after that would read those segments too.
    phases = [[n for n in commands if n != BACKUP], [n for n in commands if n == BACKUP]]
    agent = start_agent(program, work, plain)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        via = {**plain, "PGSNAP_AGENT": str(work / "agent.sock")}
        for names in phases:
            if BACKUP in names:
                server = make_server()
            for name in names:  # untimed: the WAL index warm, as a timer keeps it
                if not ok(name, "untimed", timed(commands[name], plain)):
                    return 1
            for n in range(runs):
                for mode in ("on its own", "agent") if n % 2 == 0 else ("agent", "on its own"):
                    for name in names:
                        r = timed(commands[name], via if mode == "agent" else plain)
                        if not ok(name, mode, r):
                            return 1
                        if name.startswith("plan"):
                            chosen = json.loads(r["out"])["summary"]["backup"]
                            stamp = newest.strftime("%Y%m%dT%H%M%S000Z ")
                            r["newest"] = chosen.startswith(stamp)
                        results.setdefault((name, mode), []).append(r)
        agent_mb = peak_mb(agent.pid)
    finally:
        agent.terminate()
        agent.wait(timeout=60)
    rows = []
    verdicts = []
    for (name, mode), rs in results.items():
        secs = [r["seconds"] for r in rs]
        mbs = [r["mb"] for r in rs if r["mb"] is not None]
        newest_ok = all(r.get("newest", True) for r in rs)
        planned = name.startswith("plan")
        rows.append(
            [
                name,
                mode,
                median_range(secs),
                f"{max(mbs):.0f}" if mbs else "?",
                ("yes" if newest_ok else "NO") if planned else "-",
                parts(rs) if name == BACKUP else "-",
            ]
        )
        limit = TARGET_LIST_SECONDS if name.startswith("list") else TARGET_PLAN_SECONDS
        m = statistics.median(secs)
        if name == BACKUP:  # PostgreSQL's checkpoint and the storage's copy are not pgsnap's
            rest = [r["rest"] for r in rs if r.get("rest") is not None]
            m = statistics.median(rest) if len(rest) == len(rs) else math.inf
            verdicts.append(
                f"{name}, {mode}: median {m:.3f} s beyond its backup-start and snapshot "
                f"steps (target <= {limit} s): {'met' if m <= limit else 'NOT met'}"
            )
            continue
        verdicts.append(
            f"{name}, {mode}: median {m:.3f} s (target <= {limit} s): "
            f"{'met' if m <= limit and newest_ok else 'NOT met'}"
        )
    header = [
        "command",
        "how",
        "seconds, median (min .. max)",
        "peak RSS MB",
        "plans the newest",
        "backup-start + snapshot steps / the rest, medians",
    ]
    print(table(rows, header))
    print(
        f"the agent's own peak RSS (every fork starts from it): {agent_mb:.0f} MB"
        if agent_mb is not None
        else "the agent's peak RSS: unknown"
    )
    print("\n".join(verdicts))
    print(
        f"memory target ({TARGET_PLAN_MB:.0f} MB) for a plan or a backup on its own: "
        + (
            "met"
            if all(
                r["mb"] is not None and r["mb"] <= TARGET_PLAN_MB
                for (name, mode), rs in results.items()
                if name != "list --json" and mode == "on its own"
                for r in rs
            )
            else "NOT met"
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
