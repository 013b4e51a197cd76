"""Benchmark: a restore drill's RTO is flat in database size (btrfs), vs a pgBackRest restore.

Run (as root: loop devices, mount; PostgreSQL and pgBackRest run as the ``postgres`` OS user)::

    python benchmarks/bench_drill.py                        # scales 100 and 1000, 3 runs each
    python benchmarks/bench_drill.py --scales 100 --runs 5
    python benchmarks/bench_drill.py --smoke                # scale 1, 1 run: checks the script
    python benchmarks/bench_drill.py --dir /big             # the scratch area (default /var/tmp)
    python benchmarks/bench_drill.py --cache cold           # page cache dropped before each method

Target (issue 22): the RTO of a drill (``DrillRecord.rto_seconds``) at pgbench scale
1000 within 1.5x of its RTO at scale 100: flat in database size, as backups are.
Measured against a pgBackRest restore of the same database to a new directory, in
the same run. Prints the figures and "met" / "NOT met"; never asserts.

For each scale (one data set each, made once):

1. a throwaway btrfs on a loop device (:class:`~pgsnap.testing.btrfs.LoopBtrfs`, a
   sparse image in ``--dir``, 64 MB per pgbench scale unit, at least 16 GiB) and
   PostgreSQL 15 on it (:func:`~pgsnap.testing.btrfs.btrfs_server`: data directory
   and ``pg_wal`` on two subvolumes, 16 MB WAL segments, **fsync on**, checked,
   ``max_wal_size = 4GB``); ``pgbench -i -q -s SCALE`` with ``archive_command =
   true`` during the load only (as benchmarks/bench_btrfs.py); then
   ``archive_command`` copies each segment into pgsnap's archive directory (on the
   btrfs, outside the subvolumes) *and* pushes it with ``pgbackrest archive-push``
   into pgBackRest's repository (a POSIX directory in ``--dir``, outside the btrfs),
   both must succeed; ``stanza-create``; a segment switch archived;
2. one pgsnap backup (``Cluster.backup()``: btrfs read-only snapshots) and one
   pgBackRest ``backup --type=full`` (``compress-type=lz4``, the fastest to restore,
   ``process-max=2``, ``start-fast=y``); then ``--load`` pgbench transactions (2
   clients) and a segment switch archived (WAL after both backups, that an
   ``immediate`` recovery must not replay);
3. ``--runs`` times each, the order alternating run to run, ``sync`` before each:

   - **pgsnap**: ``Cluster.drill(RecoveryTarget.immediate(), backup_id=<the
     backup>, checks=["SELECT count(*) = <scale * 100000> FROM pgbench_accounts"])``
     on a free port: a writable btrfs snapshot of the backup's read-only snapshot, a
     separate server on it (own port and socket, ``archive_mode`` off) recovered from
     pgsnap's archive to the backup's consistency point and promoted, then the
     drill's checks (``amcheck`` on every database, data checksums, the server log,
     the count), then the clone destroyed. Reported: ``rto_seconds`` (the clone
     plan's first step to the clone accepting connections after recovery) and its
     phases ``storage`` and ``replay``; the ``checks`` phase (amcheck reads every
     table and index: it grows with the database; it is not part of the RTO, and
     is shown apart); ``cleanup``; the wall time of the ``drill()`` call; the rest
     (planning, the catalog records) = the wall time minus the phases; each step's
     seconds from the executor's events;
   - **pgBackRest**: ``pgbackrest restore --type=immediate --target-action=promote
     --pg1-path=NEW`` (``restore_command`` = ``archive-get`` with the same
     ``--pg1-path``) into a fresh directory in ``--dir`` (outside the btrfs, the
     same disk), then a server started there on a free port with its own socket
     directory (``archive_mode`` off, as pgsnap's clone), until it accepts
     connections and has left recovery: the wall time from the ``restore`` command
     to that is pgBackRest's RTO; then the same count SQL; the server stopped and
     the directory deleted (timed apart, not in the RTO).
4. per scale, median (min .. max) of each figure, the ratio pgBackRest / pgsnap of
   the RTO medians; across scales, pgsnap's RTO at the largest over the smallest
   scale (the target) and pgBackRest's own growth.

It prints the machine (CPUs, memory, kernel, btrfs-progs, PostgreSQL, pgBackRest,
Python, the commit and the uncommitted files under ``pgsnap/``, the scratch file
system, the load average) at the start and at the end, every run, then the tables
and the target. Without the ``pgbackrest`` program (``apt-get install -y
pgbackrest``) it says so and measures pgsnap's drills alone.

Everything is removed at the end (the drill's clone if one is left, the restored
and the benchmark's servers stopped, the file system unmounted, the loop device
detached, the image and pgBackRest's repository deleted), also on failure, Ctrl-C
or SIGTERM. It refuses to start when ``--dir`` has less free space than the largest
scale needs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import pwd
import shutil
import signal
import socket
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
from bench_backup import CallLog, pg_env, run_measured, stats, tree_bytes
from bench_btrfs import image_bytes, met, sh

from pgsnap.cluster import Cluster
from pgsnap.executor import Event, EventKind
from pgsnap.model import DrillRecord, RecoveryTarget
from pgsnap.testing.btrfs import LoopBtrfs, btrfs_cluster, btrfs_server, btrfs_unavailable
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

TARGET_FLAT_RATIO = 1.5
GB = 1000**3
MB = 1000**2
STANZA = "bench"
PGBACKREST_OPTIONS = {
    "compress-type": "lz4",
    "process-max": "2",
    "start-fast": "y",
    "repo1-retention-full": "100",
}
"""pgBackRest's options (``[global]``): lz4 is its fastest codec to restore."""
PHASES = ("storage", "replay", "checks", "cleanup")


def need_bytes(scale: int) -> int:
    """Free space a scale needs in ``--dir``: the btrfs image's content (the database,
    pg_wal up to max_wal_size, the archive, what the clone writes), pgBackRest's
    repository (lz4) and one restored data directory, with a margin."""
    return 6 * GB + scale * 40 * MB


def free_port() -> int:
    """A TCP port nothing listens on now (the clone's: pgsnap's default, 55432 and up,
    may be taken by another cluster's clone on a shared machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sync_caches(cold: bool) -> None:
    """``sync`` (the previous method's writes and deletions flushed), and with ``--cache
    cold`` the kernel's page cache dropped."""
    os.sync()
    if cold:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


# --------------------------------------------------------------------------- one scale


class Scale:
    """One data set on its own loop-mounted btrfs: the server, the backups, the runs."""

    def __init__(
        self,
        scale: int,
        args: argparse.Namespace,
        bindir: Path,
        say: Callable[[str], None],
        pgbackrest: bool,
    ) -> None:
        self.scale = scale
        self.args = args
        self.bindir = bindir
        self.say = say
        self.use_pgbr = pgbackrest
        self.fs: LoopBtrfs | None = None
        self.server: PgServer | None = None
        self.cluster: Cluster | None = None
        self.out: Path | None = None
        self.pgbr_conf: Path | None = None
        self.restored: list[PgServer] = []
        self.backup_id = ""
        self.facts: dict[str, Any] = {}

    @property
    def srv(self) -> PgServer:
        assert self.server is not None
        return self.server

    @property
    def rows(self) -> int:
        return self.scale * 100_000

    @property
    def count_sql(self) -> str:
        return f"SELECT count(*) = {self.rows} FROM pgbench_accounts"

    # ----------------------------------------------------------------- setup, cleanup

    def setup(self) -> None:
        args, say = self.args, self.say
        t0 = time.perf_counter()
        self.out = Path(tempfile.mkdtemp(prefix="pgsnap-bench-drill-", dir=args.dir))
        self.out.chmod(0o755)  # the postgres OS user reaches the repository below it
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
        fsync = server.sql("SHOW fsync")[0][0]
        if fsync != "on":
            raise RuntimeError(f"the server runs with fsync={fsync}: not real figures")
        say(
            f"scale {self.scale}: btrfs on {self.fs.device} ({image_bytes(self.scale) / GB:.0f} GB "
            f"sparse image in {self.fs.base}), PostgreSQL {server.major} ({server.version_num}), "
            "data and pg_wal on two subvolumes, 16 MB WAL segments, fsync=on"
        )
        server.configure({"archive_command": "true"})  # the load's WAL archived nowhere
        server.reload()
        took = run_measured(
            [str(self.bindir / "pgbench"), "-i", "-q", "-s", str(self.scale)],
            env=pg_env(server),
        )[0]
        if self.use_pgbr:
            self.pgbackrest_config()
            self.pgbackrest("stanza-create")
        server.configure({"archive_command": self.archive_command()})
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
            f"subvolume {self.facts['data_bytes'] / MB:.0f} MB; archive_command: "
            f"{self.archive_command()}; set up in {time.perf_counter() - t0:.1f} s"
        )
        self.cluster = btrfs_cluster(server, self.fs)
        check = self.cluster.check()
        if not check.ok:
            raise RuntimeError(f"pgsnap check failed:\n{check.explain()}")

    def archive_command(self) -> str:
        """pgsnap's archive (a copy into a directory), then pgBackRest's push: both must
        succeed for the segment to count as archived."""
        a = self.srv.archive_dir
        cmd = f"(test -f {a}/%f || cp %p {a}/%f)"
        if self.use_pgbr:
            cmd += f" && pgbackrest --config={self.pgbr_conf} --stanza={STANZA} archive-push %p"
        return cmd

    def cleanup(self) -> None:
        """Every step tried, whatever failed: the restored servers, a drill's clone left
        by an interruption, the server, the file system, the repository."""
        for restored in self.restored:
            with contextlib.suppress(Exception):
                restored.cleanup()
        self.restored = []
        if self.cluster is not None:
            try:  # a drill's plan interrupted half way: finished (or undone) first
                self.cluster.resume()
            except Exception as exc:
                self.say(f"  cleanup: an interrupted plan not finished: {exc}")
            with contextlib.suppress(Exception):
                for clone in self.cluster.clones():
                    try:
                        self.cluster.destroy_clone(clone.name)
                    except Exception as exc:
                        self.say(f"  cleanup: clone {clone.name} not destroyed: {exc}")
            self.cluster = None
        if self.server is not None:
            # A clone the catalog does not know (interrupted before its record): its
            # server would keep the file system busy.
            for pid_file in self.server.base_dir.glob("pgsnap-clone-*/**/postmaster.pid"):
                with contextlib.suppress(Exception):
                    subprocess.run(
                        [
                            "runuser",
                            "-u",
                            self.server.os_user,
                            "--",
                            str(self.bindir / "pg_ctl"),
                            "stop",
                            "-D",
                            str(pid_file.parent),
                            "-m",
                            "immediate",
                            "-w",
                            "-t",
                            "60",
                        ],
                        capture_output=True,
                        check=False,
                        timeout=90,
                    )
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

    # ----------------------------------------------------------------- pgBackRest

    def pgbackrest_config(self) -> None:
        assert self.out is not None
        base = self.out / "pgbackrest"
        subs = ("repo", "log", "lock", "spool")
        for sub in subs:
            (base / sub).mkdir(parents=True, exist_ok=True)
        options = "\n".join(f"{k}={v}" for k, v in PGBACKREST_OPTIONS.items())
        text = f"""[global]
repo1-type=posix
repo1-path={base / "repo"}
{options}
log-level-console=warn
log-level-file=info
log-path={base / "log"}
lock-path={base / "lock"}
spool-path={base / "spool"}

[{STANZA}]
pg1-path={self.srv.data_dir}
pg1-port={self.srv.port}
pg1-socket-path={self.srv.socket_dir}
pg1-user=postgres
"""
        self.pgbr_conf = base / "pgbackrest.conf"
        self.pgbr_conf.write_text(text)
        self.pgbr_conf.chmod(0o600)
        entry = pwd.getpwnam(self.srv.os_user)
        for path in (base, *(base / s for s in subs), self.pgbr_conf):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def pgbackrest(self, *args: str) -> tuple[float, str]:
        """``pgbackrest --config ... --stanza=bench ARGS`` as the server's OS user, in
        its own process group (killed with its workers if this process is interrupted):
        (wall seconds, output). Raises with the output on failure."""
        entry = pwd.getpwnam(self.srv.os_user)
        argv = ["pgbackrest", f"--config={self.pgbr_conf}", f"--stanza={STANZA}", *args]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": entry.pw_dir}
        with tempfile.TemporaryFile("w+") as out:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd="/",
                user=entry.pw_uid,
                group=entry.pw_gid,
                extra_groups=[],
                start_new_session=True,
            )
            try:
                code = proc.wait()
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            wall = time.perf_counter() - t0
            out.seek(0)
            text = out.read()
        if code != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({code}):\n{text[-3000:]}")
        return wall, text

    # ----------------------------------------------------------------- backups

    def backups(self) -> None:
        assert self.cluster is not None and self.out is not None
        say = self.say
        t0 = time.perf_counter()
        record = self.cluster.backup("bench-drill")
        self.backup_id = record.id
        self.facts["pgsnap_backup"] = time.perf_counter() - t0
        say(
            f"  pgsnap backup {record.id}: {self.facts['pgsnap_backup']:.2f} s "
            f"(start {record.start_lsn}, stop {record.stop_lsn})"
        )
        if self.use_pgbr:
            wall, _ = self.pgbackrest("--type=full", "backup")
            repo = self.out / "pgbackrest" / "repo"
            self.facts["pgbr_backup"] = wall
            self.facts["pgbr_backup_bytes"] = tree_bytes(repo / "backup")
            self.facts["pgbr_archive_bytes"] = tree_bytes(repo / "archive")
            say(
                f"  pgBackRest backup --type=full: {wall:.1f} s, "
                f"{self.facts['pgbr_backup_bytes'] / MB:.0f} MB in the repository's backup/ "
                f"({', '.join(f'{k}={v}' for k, v in PGBACKREST_OPTIONS.items())})"
            )
        t1 = time.perf_counter()
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
        self.srv.switch_wal_and_wait_archived(timeout=900)
        self.srv.wait_for_archive_idle(timeout=900)
        say(
            f"  then {self.args.load} pgbench transactions and a segment switch archived: "
            f"{time.perf_counter() - t1:.1f} s"
        )

    # ----------------------------------------------------------------- the two methods

    def drill(self, n: int) -> dict[str, Any]:
        assert self.cluster is not None
        log = CallLog()
        log.echo = self.args.verbose
        marks: dict[str, float] = {}

        def on_event(event: Event) -> None:
            log.on_event(event)
            if event.kind is EventKind.STARTED:
                marks.setdefault("first_step", time.perf_counter())
            elif event.kind is EventKind.FINISHED and event.step_id == "wait-clone":
                marks["ready"] = time.perf_counter()

        t0 = time.perf_counter()
        rec: DrillRecord = self.cluster.drill(
            RecoveryTarget.immediate(),
            backup_id=self.backup_id,
            checks=[self.count_sql],
            on_event=on_event,
            name=f"bench-{self.scale}-{n}"[:20],
            port=free_port(),
        )
        wall = time.perf_counter() - t0
        phases = {p.name: p.seconds for p in rec.phases}
        data = str(self.srv.data_dir)  # the volume's id, in the clone steps' ids
        return {
            "rto": rec.rto_seconds,
            **{name: phases.get(name) for name in PHASES},
            "planning": marks["first_step"] - t0 if "first_step" in marks else None,
            "call_to_ready": marks["ready"] - t0 if "ready" in marks else None,
            "wall": wall,
            "rest": wall - sum(phases.values()),
            "ok": rec.ok,
            "error": rec.error,
            "results": [(c.name, c.ok, c.detail) for c in rec.checks],
            "wal_bytes": rec.wal_bytes,
            "wal_segments": rec.wal_segments,
            "steps": {k.replace(data, "pgdata"): v for k, v in log.steps.items()},
            "id": rec.id,
        }

    def pgbackrest_restore(self, n: int) -> dict[str, Any]:
        assert self.out is not None
        restored = PgServer.prepare(
            self.bindir,
            archive=False,
            parent_dir=self.out,
            settings={"fsync": True, "max_wal_size": "4GB"},
        )
        self.restored.append(restored)
        restore_command = (  # archive-get checks that --pg1-path is the server's directory
            f"pgbackrest --config={self.pgbr_conf} --stanza={STANZA} "
            f'--pg1-path={restored.data_dir} archive-get %f "%p"'
        )
        t0 = time.perf_counter()
        files, _ = self.pgbackrest(
            f"--pg1-path={restored.data_dir}",
            "--type=immediate",
            "--target-action=promote",
            f"--recovery-option=restore_command={restore_command}",
            "restore",
        )
        wal_link = restored.data_dir / "pg_wal"
        link_note = "pg_wal restored as a directory"
        if wal_link.is_symlink():  # never let it point at the live server's WAL
            link_note = f"pg_wal restored as a link to {os.readlink(wal_link)}: relinked"
            wal_link.unlink()
            wal_link.symlink_to(restored.wal_dir)
        restored.configure()  # its port, socket, archive_mode off (pgsnap.conf came along)
        restored.start(timeout=3600)
        ready = time.perf_counter() - t0
        restored.wait_for_promotion(timeout=3600)
        rto = time.perf_counter() - t0
        ok = restored.sql(self.count_sql)[0][0] is True
        size = tree_bytes(restored.data_dir)
        t1 = time.perf_counter()
        restored.cleanup()
        self.restored.remove(restored)
        return {
            "rto": rto,
            "files": files,
            "start": rto - files,
            "ready": ready,
            "ok": ok,
            "bytes": size,
            "cleanup": time.perf_counter() - t1,
            "note": link_note,
            "n": n,
        }

    # ----------------------------------------------------------------- the runs

    def run(self) -> dict[str, Any]:
        say, args = self.say, self.args
        self.backups()
        drills: list[dict[str, Any]] = []
        restores: list[dict[str, Any]] = []
        methods = ["pgsnap", "pgbackrest"] if self.use_pgbr else ["pgsnap"]
        for n in range(1, args.runs + 1):
            order = methods if n % 2 else methods[::-1]
            for method in order:
                sync_caches(args.cache == "cold")
                if method == "pgsnap":
                    d = self.drill(n)
                    drills.append(d)
                    say(f"  run {n}: {drill_line(d)}")
                    if not d["ok"]:
                        failed = [c for c in d["results"] if not c[1]]
                        say(f"    drill FAILED: error {d['error']!r}; failed checks {failed}")
                else:
                    r = self.pgbackrest_restore(n)
                    restores.append(r)
                    say(
                        f"  run {n}: pgBackRest restore + start: RTO {r['rto']:.3f} s (restore "
                        f"{r['files']:.3f} s, accepting connections at {r['ready']:.3f} s, "
                        f"promoted at {r['rto']:.3f} s); data directory "
                        f"{r['bytes'] / MB:.0f} MB after recovery, WAL included "
                        f"({r['note']}); count {'ok' if r['ok'] else 'WRONG'}; stopped and "
                        f"deleted in {r['cleanup']:.2f} s"
                    )
        return {"drills": drills, "restores": restores}


def drill_line(d: dict[str, Any]) -> str:
    def f(v: float | None, digits: int = 3) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    amcheck = next((detail for name, _ok, detail in d["results"] if name == "amcheck"), "-")
    steps = ", ".join(f"{k} {v:.3f}" for k, v in d["steps"].items() if v >= 0.01)
    return (
        f"pgsnap drill {d['id']}: RTO {f(d['rto'])} s (storage {f(d['storage'])}, replay "
        f"{f(d['replay'])}; from the drill() call, planning included: "
        f"{f(d['call_to_ready'])}); checks {f(d['checks'], 2)} s (amcheck: {amcheck}); cleanup "
        f"{f(d['cleanup'])} s; drill() {d['wall']:.3f} s (rest: planning, records "
        f"{d['rest']:.3f}); WAL replayed {d['wal_segments']} segment(s), "
        f"{d['wal_bytes'] / MB:.1f} MB; {'ok' if d['ok'] else 'FAILED'}; steps >= 10 ms: {steps}"
    )


# --------------------------------------------------------------------------- report


def _spread(values: Sequence[float | None], digits: int = 3) -> list[str]:
    vals = [v for v in values if v is not None]
    if not vals:
        return ["-", "-", "-"]
    return [
        f"{statistics.median(vals):.{digits}f}",
        f"{min(vals):.{digits}f}",
        f"{max(vals):.{digits}f}",
    ]


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def report(
    say: Callable[[str], None],
    results: dict[int, dict[str, Any]],
    facts: dict[int, dict[str, Any]],
) -> None:
    scales = list(results)
    for s in scales:
        ds, rs = results[s]["drills"], results[s]["restores"]
        say("")
        say(
            f"== scale {s} ({facts[s]['db_bytes'] / GB:.2f} GB database): seconds, "
            f"{len(ds)} drill(s), {len(rs)} pgBackRest restore(s) =="
        )
        say("")
        rows: list[tuple[str, Sequence[float | None]]] = [
            ("pgsnap drill RTO (rto_seconds)", [d["rto"] for d in ds]),
            ("  storage phase", [d["storage"] for d in ds]),
            ("  replay phase", [d["replay"] for d in ds]),
            ("pgsnap checks phase (amcheck, checksums, log, SQL)", [d["checks"] for d in ds]),
            ("pgsnap cleanup phase (clone destroyed)", [d["cleanup"] for d in ds]),
            ("pgsnap rest (planning, catalog records)", [d["rest"] for d in ds]),
            ("  of which planning (before the first step)", [d["planning"] for d in ds]),
            (
                "pgsnap drill() call to clone ready (planning + RTO)",
                [d["call_to_ready"] for d in ds],
            ),
            ("pgsnap drill() total wall time", [d["wall"] for d in ds]),
        ]
        if rs:
            rows += [
                ("pgBackRest RTO (restore + start, promoted)", [r["rto"] for r in rs]),
                ("  pgbackrest restore (files)", [r["files"] for r in rs]),
                ("  start, recovery, promotion", [r["start"] for r in rs]),
                ("  accepting connections (from restore)", [r["ready"] for r in rs]),
                ("pgBackRest cleanup (stop, delete; not in RTO)", [r["cleanup"] for r in rs]),
            ]
        say(table([[name, *_spread(vals)] for name, vals in rows], ["", "median", "min", "max"]))
        say("")
        pg_rto = _median([d["rto"] for d in ds])
        br_rto = _median([r["rto"] for r in rs])
        if pg_rto and br_rto:
            say(
                f"scale {s}: pgBackRest RTO / pgsnap RTO (medians) = {br_rto:.3f} / "
                f"{pg_rto:.3f} = {br_rto / pg_rto:.1f}x"
            )
        pg_call = _median([d["call_to_ready"] for d in ds])
        if pg_call and br_rto:
            say(
                f"scale {s}: pgBackRest RTO / pgsnap's drill() call to clone ready (planning "
                f"included, as pgBackRest's is) = {br_rto:.3f} / {pg_call:.3f} = "
                f"{br_rto / pg_call:.1f}x"
            )
        say(
            f"scale {s}: drills ok: {sum(1 for d in ds if d['ok'])} of {len(ds)}; pgBackRest "
            f"counts ok: {sum(1 for r in rs if r['ok'])} of {len(rs)}; WAL a drill replayed: "
            f"{stats([d['wal_bytes'] / MB for d in ds], 1)} MB; pgbench -i "
            f"{facts[s]['init_seconds']:.0f} s; pgsnap backup "
            f"{facts[s].get('pgsnap_backup', 0):.2f} s"
            + (
                f"; pgBackRest full backup {facts[s]['pgbr_backup']:.1f} s, "
                f"{facts[s]['pgbr_backup_bytes'] / MB:.0f} MB"
                if "pgbr_backup" in facts[s]
                else ""
            )
        )
        steps: list[str] = []
        for d in ds:
            steps += [k for k in d["steps"] if k not in steps]
        say(
            f"scale {s}: drill steps (median s): "
            + ", ".join(f"{k} {stats([d['steps'].get(k) for d in ds]).split()[0]}" for k in steps)
        )

    say("")
    say("== Across scales: medians, seconds ==")
    say("")
    rows2 = []
    for s in scales:
        ds, rs = results[s]["drills"], results[s]["restores"]
        pg = _median([d["rto"] for d in ds])
        br = _median([r["rto"] for r in rs])
        rows2.append(
            [
                str(s),
                f"{facts[s]['db_bytes'] / GB:.2f}",
                "-" if pg is None else f"{pg:.3f}",
                stats([d["call_to_ready"] for d in ds]).split()[0],
                stats([d["checks"] for d in ds], 2).split()[0],
                stats([d["wall"] for d in ds], 2).split()[0],
                "-" if br is None else f"{br:.3f}",
                "-" if not (pg and br) else f"{br / pg:.1f}x",
            ]
        )
    say(
        table(
            rows2,
            [
                "scale",
                "database GB",
                "pgsnap RTO",
                "pgsnap call to ready",
                "pgsnap checks",
                "pgsnap drill() wall",
                "pgBackRest RTO",
                "pgBackRest / pgsnap",
            ],
        )
    )
    say("")
    say("== Target ==")
    small, large = scales[0], scales[-1]
    pg_small = _median([d["rto"] for d in results[small]["drills"]])
    pg_large = _median([d["rto"] for d in results[large]["drills"]])
    if large == small:
        say(
            "pgsnap RTO at the largest vs the smallest scale: not measured (one scale only, "
            f"{small})"
        )
    elif pg_small and pg_large:
        ratio = pg_large / pg_small
        say(
            f"pgsnap drill RTO at scale {large} / at scale {small}: {pg_large:.3f} / "
            f"{pg_small:.3f} = {ratio:.2f}x (target <= {TARGET_FLAT_RATIO}x, flat in database "
            f"size): {met(ratio <= TARGET_FLAT_RATIO)}"
        )
        br_small = _median([r["rto"] for r in results[small]["restores"]])
        br_large = _median([r["rto"] for r in results[large]["restores"]])
        if br_small and br_large:
            say(
                f"pgBackRest RTO at scale {large} / at scale {small}: {br_large:.3f} / "
                f"{br_small:.3f} = {br_large / br_small:.1f}x (its own growth; the database "
                f"grew {facts[large]['db_bytes'] / facts[small]['db_bytes']:.1f}x)"
            )
        ck_small = _median([d["checks"] for d in results[small]["drills"]])
        ck_large = _median([d["checks"] for d in results[large]["drills"]])
        if ck_small and ck_large:
            say(
                f"pgsnap checks phase at scale {large} / at scale {small}: {ck_large:.2f} / "
                f"{ck_small:.2f} = {ck_large / ck_small:.1f}x (amcheck reads every table and "
                "index: not in the RTO)"
            )
    else:
        say("pgsnap RTO: not measured (a drill did not get as far as its RTO)")


# --------------------------------------------------------------------------- main


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def machine(parent: Path, bindir: Path) -> str:
    changed = uncommitted("pgsnap")
    disk = sh(["df", "--output=source,fstype", str(parent)]).splitlines()[-1].split()
    pgbr = sh(["pgbackrest", "version"]) if shutil.which("pgbackrest") else "no pgBackRest"
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GB:.0f} GB RAM, "
        f"Linux {platform.release()}, {sh(['btrfs', '--version'])}, "
        f"Python {platform.python_version()}, "
        f"{sh([str(bindir / 'postgres'), '--version'])}, {pgbr}, commit {git_commit()}"
        f"{' + uncommitted changes' if uncommitted('.') else ''}"
        f" (in pgsnap/: {', '.join(changed) or 'none'}); "
        f"--dir {parent} on {' '.join(disk)} "
        f"({shutil.disk_usage(parent).free / GB:.0f} GB free); load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scales", default="100,1000", help="pgbench scales (default 100,1000)")
    parser.add_argument(
        "--runs", type=int, default=3, help="drills and pgBackRest restores per scale (default 3)"
    )
    parser.add_argument(
        "--load",
        type=int,
        default=1000,
        help="pgbench transactions after the backups (default 1000)",
    )
    parser.add_argument("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    parser.add_argument(
        "--cache",
        choices=("warm", "cold"),
        default="warm",
        help="warm (default): sync before every method; cold: also drop the page cache",
    )
    parser.add_argument("--smoke", action="store_true", help="scale 1, 1 run, 200 transactions")
    parser.add_argument("-v", "--verbose", action="store_true", help="pgsnap's events")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scales, args.runs, args.load = "1", 1, 200
    try:
        scales = [int(s) for s in args.scales.split(",") if s.strip()]
    except ValueError:
        parser.error("--scales: comma-separated integers")
    if not scales or min(scales) < 1 or args.runs < 1 or args.load < 0:
        parser.error("--scales and --runs must be >= 1, --load >= 0")

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
            f"{need / GB:.1f} GB (the btrfs image's content, pgBackRest's repository, a restored "
            "data directory); free some space, pass --dir on a larger file system or smaller "
            "--scales"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    for tool in ("pgbench", "pg_ctl", "postgres"):
        if not (bindir / tool).is_file():
            say(f"{bindir / tool} not found: install PostgreSQL 15 and its client programs")
            return 2
    pgbackrest = shutil.which("pgbackrest") is not None
    say(f"bench_drill: {machine(parent, bindir)}")
    words = sys.argv[1:] if argv is None else list(argv)
    say(f"command: python benchmarks/bench_drill.py {' '.join(words)}")
    if pgbackrest:
        say(
            "pgBackRest options: "
            + ", ".join(f"{k}={v}" for k, v in PGBACKREST_OPTIONS.items())
            + "; POSIX repository in --dir (outside the btrfs); restore --type=immediate "
            "--target-action=promote into a new directory in --dir"
        )
    else:
        say(
            "pgBackRest: NOT measured: no pgbackrest program (apt-get install -y pgbackrest); "
            "pgsnap's drills only"
        )
    say(f"page cache: {args.cache} (sync before every method)")
    signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.perf_counter()
    results: dict[int, dict[str, Any]] = {}
    facts: dict[int, dict[str, Any]] = {}
    interrupted = False
    failed: list[int] = []
    for s in scales:
        sc = Scale(s, args, bindir, say, pgbackrest)
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
        f"total run time {time.perf_counter() - t_start:.0f} s"
        + (" (interrupted: not every scale ran)" if interrupted else "")
        + (f" (FAILED at scale {', '.join(map(str, failed))})" if failed else "")
    )
    say(f"at the end: {machine(parent, bindir)}")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
