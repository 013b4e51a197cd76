"""Benchmark: pgsnap on real lvm2 (thin and classic snapshots), inside the qemu test VM.

Run (as root, like the lvm tests: the VM image cache and virtiofsd need it)::

    python benchmarks/bench_lvm.py                  # scales 2 and 10, thin and classic (~15 min)
    python benchmarks/bench_lvm.py --smoke          # scale 1, 1 backup: checks the script (~5 min)
    python benchmarks/bench_lvm.py --modes thin --scales 5 --runs 5
    python benchmarks/bench_lvm.py -v               # pgsnap's events, every console command

No targets (issue 11, section 4: numbers, printed, not asserted). This machine's
kernel has no device-mapper, so everything runs in the lvm2 test VM of
:mod:`pgsnap.testing.lvmvm`: qemu **TCG** (no KVM: every guest instruction is
emulated), 2 vCPUs, 1.5 GB, a sparse raw disk image on this machine
(``cache=unsafe``). **Absolute figures are slow**: every command pgsnap runs on the
database host is typed on the VM's serial console (a round trip of 0.25-0.4 s for
``true``, measured and printed), an lvm command takes 0.3-1 s; compare the ratios
and how the figures change with size, not the seconds with a real server.

Per snapshot kind (``--modes``, default ``thin,classic``), one VM
(:class:`~pgsnap.testing.lvmpg.LvmPostgres`, PostgreSQL 15 on ext4, data and
``pg_wal`` on two logical volumes ``pgvg/data`` and ``pgvg/wal``, 1 MB WAL
segments, archiving by ``cp`` into a directory shared with this machine, where
pgsnap reads it; ``thin``: thin volumes in a pool, thin snapshots; ``classic``:
linear volumes, copy-on-write snapshots sized 25 % of the origin, the backend's
default). A third, linear LV ``pgvg/bb`` (ext4, ``/bb``) receives
``pg_basebackup``. ``max_wal_size`` is lowered to 256 MB so that ``pg_wal`` fits
its volume. Then for each scale (``--scales``, the same VM, smallest first):

1. ``pgbench -i -q -s SCALE`` in the VM (``archive_command = true`` meanwhile: no
   backup needs that WAL), ``CHECKPOINT``, a segment switch archived;
2. ``--runs`` pgsnap backups; before each a ``CHECKPOINT``, ``--load`` pgbench
   transactions (2 clients, in the VM) and a wait until ``archive_status`` holds no
   ``.ready`` file, the same before ``pg_basebackup``. Each is ``Cluster.backup()``
   (plan + execute) of a Cluster built as
   :meth:`~pgsnap.testing.lvmpg.LvmPostgres.make_cluster` builds it, on a fresh
   ``LvmBackend`` whose methods are wrapped on the object (pgsnap is not modified):
   the snapshot call ``create_snapshot_group`` is timed alone; time in backup mode
   is the record's ``backup_mode_seconds``; the steps' seconds come from the
   executor's events; every command sent to the VM's console is counted and timed
   (the runner's ``run`` wrapped on the object). Each backup is then deleted with
   pgsnap (``plan_delete`` + ``execute``, timed apart), so that every run sees the
   volumes without snapshots (a classic snapshot slows every write to its origin);
3. once: ``pg_basebackup -D /bb/base -X stream -c fast`` in the VM (plain format,
   fsynced), wall time seen from here (one console command), and its size;
4. ``--recovery-runs`` recoveries: a pgsnap backup, ``--load-seconds`` of pgbench
   (2 clients), then the first ``--churn`` percent of ``pgbench_accounts`` updated
   (so that the blocks changed since the backup grow with the database: pgbench's
   random updates alone touch about the same few MB at every scale) and a
   ``CHECKPOINT`` (the changed pages reach the data volume, as on a server that has
   run a while); the rows of ``pgbench_history`` counted; a crash (``pg_ctl stop -m
   immediate``), the data directory's content deleted; for a classic snapshot, how
   full its copy-on-write store is then (the blocks changed since the backup, what
   the merge copies back); then ``plan_recovery(RecoveryTarget.latest(), lost=[DATA])``
   and ``execute``, timed; the restore step's own seconds from
   ``ExecutionResult.seconds`` (thin: a thin snapshot of the backup's snapshot
   swapped in, constant; classic: ``lvconvert --merge``, proportional to the changed
   blocks), the safety snapshot step and the rest; the rows checked
   (``pgbench_history`` as at the crash, ``pgbench_accounts`` = scale x 100,000).
   The backup and the safety snapshot are deleted after.

It prints this machine (CPUs, memory, kernel, qemu, Python, the commit and the
uncommitted files under ``pgsnap/``, the load average) at the start and at the
end, the VM (kernel, lvm2, PostgreSQL) once booted, every run, then the tables.
The machine is shared: other qemu VMs may run at the same time, and TCG is
CPU-bound, so expect noise (the load average is printed at both ends).

Everything is removed at the end (the VM powered off or killed, its disk image and
the shared directory deleted), also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import cpu_model, git_commit, memory_bytes, table, uncommitted
from bench_backup import CallLog, stats, time_methods

from pgsnap.backends.lvm import LvmBackend
from pgsnap.errors import PgsnapError
from pgsnap.host import CommandResult
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.protocols import STORAGE_BACKEND_METHODS
from pgsnap.testing.lvmpg import PGDATA, PGWAL, VG, LvmPostgres, VmPgSetup
from pgsnap.testing.lvmvm import lvmvm_unavailable

MB = 1000**2
MIB = 1 << 20
GIB = 1 << 30
SNAPSHOT_CALL = "backend.create_snapshot_group"
SAFETY_STEP = "safety-snapshot"
BB_LV = "bb"
BB_MNT = "/bb"
CAVEAT = (
    "qemu TCG emulation (no KVM) is slow in absolute terms: an lvm command takes 0.3-1 s in "
    "the VM; read the ratios and how the figures move with size, not the seconds"
)


def sh(argv: Sequence[str]) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"({argv[0]}: {exc.strerror})"
    return (proc.stdout or proc.stderr).strip()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def volume_mib(scale: int) -> int:
    """Each volume's size for the largest scale: the database (about 16 MB per scale
    unit), pg_wal (max_wal_size 256 MB and what a checkpoint leaves), with room; a
    multiple of 128 MiB, at least 512 MiB."""
    want = 320 + 40 * scale
    return max(512, -(-want // 128) * 128)


# --------------------------------------------------------------------------- console


class Console:
    """Counts and times every command sent to the VM's console (wraps ``run`` on the
    runner object; the Host calls it for every command)."""

    def __init__(self, env: LvmPostgres, *, echo: bool = False) -> None:
        self.calls: list[tuple[str, float]] = []
        runner = env.vm.runner
        inner = runner.run
        self.echo = echo

        def run(argv: Sequence[str], **kwargs: Any) -> CommandResult:
            t0 = time.perf_counter()
            try:
                result: CommandResult = inner(argv, **kwargs)
                return result
            finally:
                took = time.perf_counter() - t0
                # lvm commands come as ``env LC_ALL=C ... lvs ...``
                first = next((a for a in argv if a != "env" and "=" not in a), "?")
                name = Path(first).name
                self.calls.append((name, took))
                if self.echo:
                    print(f"    vm$ {' '.join(argv)[:150]}  [{took:.3f} s]", flush=True)

        runner.run = run  # type: ignore[method-assign]

    def mark(self) -> int:
        return len(self.calls)

    def since(self, mark: int) -> dict[str, float]:
        """Commands since ``mark``: how many, their seconds, and the lvm ones apart."""
        calls = self.calls[mark:]
        lvm = [s for n, s in calls if n in LVM_COMMANDS]
        return {
            "commands": float(len(calls)),
            "seconds": sum(s for _n, s in calls),
            "lvm_commands": float(len(lvm)),
            "lvm_seconds": sum(lvm),
        }

    def names(self, mark: int) -> str:
        """The commands since ``mark``, by program: ``lvs 4, cat 3, ...``."""
        counts = Counter(n for n, _s in self.calls[mark:])
        return ", ".join(f"{n} {c}" for n, c in counts.most_common())


LVM_COMMANDS = frozenset(
    {"lvm", "lvs", "vgs", "pvs", "lvcreate", "lvchange", "lvconvert", "lvremove", "lvrename"}
)


# --------------------------------------------------------------------------- one mode


class Mode:
    """One VM: thin or classic volumes, every scale measured in turn."""

    def __init__(
        self,
        thin: bool,
        args: argparse.Namespace,
        scales: Sequence[int],
        say: Callable[[str], None],
    ) -> None:
        self.thin = thin
        self.name = "thin" if thin else "classic"
        self.args = args
        self.scales = list(scales)
        self.say = say
        self.env: LvmPostgres | None = None
        self.console: Console | None = None
        self.facts: dict[str, Any] = {}

    # ----------------------------------------------------------------- VM

    def boot(self) -> None:
        vol = volume_mib(max(self.scales))
        pool = 2 * vol + 512
        disk = (4 * vol + (pool if self.thin else 0) + 1024) * MIB
        setup = VmPgSetup(
            major=15,
            fs="ext4",
            thin=self.thin,
            volume_size=f"{vol}M",
            pool_size=f"{pool}M",
            disk_size=disk,
        )
        t0 = time.perf_counter()
        self.env = env = LvmPostgres.boot(setup)
        booted = time.perf_counter() - t0
        self.console = Console(env, echo=self.args.verbose)
        host = env.host
        host.run(["lvcreate", "-q", "-y", "-L", f"{vol}M", "-n", BB_LV, VG], timeout=300)
        host.run(["mkfs.ext4", "-q", f"/dev/{VG}/{BB_LV}"], timeout=600)
        host.make_dirs(BB_MNT, mode=0o755)
        host.run(["mount", f"/dev/{VG}/{BB_LV}", BB_MNT])
        host.run(["chown", "postgres:postgres", BB_MNT])
        env.sql("ALTER SYSTEM SET max_wal_size = '256MB'")
        env.sql("SELECT pg_reload_conf()")
        trips = []
        for _ in range(5):
            t = time.perf_counter()
            host.run(["true"])
            trips.append(time.perf_counter() - t)
        self.facts = {
            "boot": booted,
            "round_trip": median(trips),
            "kernel": host.run(["uname", "-r"]).text.strip(),
            "lvm": host.run(["lvm", "version"]).text.splitlines()[0].split(":", 1)[-1].strip(),
            "postgres": str(env.sql("SHOW server_version")[0][0]),
            "volume": f"{vol} MiB",
        }
        self.say(
            f"{self.name}: VM booted in {booted:.0f} s ({setup.id}; kernel {self.facts['kernel']}, "
            f"lvm {self.facts['lvm']}, PostgreSQL {self.facts['postgres']}; volumes data, wal "
            f"and bb {vol} MiB each"
            + (f", thin pool {pool} MiB" if self.thin else ", linear; classic snapshots 25%ORIGIN")
            + f"; {disk / GIB:.1f} GiB sparse disk); console round trip "
            f"{self.facts['round_trip'] * 1000:.0f} ms (median of 5 `true`)"
        )

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None

    @property
    def pg(self) -> LvmPostgres:
        assert self.env is not None
        return self.env

    @property
    def con(self) -> Console:
        assert self.console is not None
        return self.console

    def cluster(self, log: CallLog | None = None) -> tuple[Any, LvmBackend]:
        """A Cluster as the harness builds it, on a fresh backend (its methods timed)."""
        backend = LvmBackend(VG, host=self.pg.host)
        if log is not None:
            time_methods(backend, STORAGE_BACKEND_METHODS, "backend", log)
            log.echo = self.args.verbose
            return self.pg.make_cluster(backend, on_event=log.on_event), backend
        return self.pg.make_cluster(backend), backend

    # ----------------------------------------------------------------- helpers

    def pgbench(self, *args: str) -> float:
        t0 = time.perf_counter()
        self.pg.pg("pgbench", "-h", "/tmp", *args, "postgres", timeout=3600)
        return time.perf_counter() - t0

    def archiver_idle(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ready = self.pg.host.run(
                ["find", f"{PGWAL}/archive_status", "-name", "*.ready"]
            ).text.strip()
            if not ready:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the archiver did not catch up within {timeout:g} s")
            time.sleep(0.5)

    def prepare(self) -> float:
        """Before every backup method alike: CHECKPOINT, the pgbench load, archiver idle."""
        t0 = time.perf_counter()
        self.pg.sql("CHECKPOINT")
        if self.args.load:
            self.pgbench("-n", "-c", "2", "-j", "2", "-t", str(max(1, self.args.load // 2)))
        self.archiver_idle()
        return time.perf_counter() - t0

    def purge(self) -> float:
        """Delete every backup with pgsnap, then any snapshot left (a safety group)."""
        t0 = time.perf_counter()
        cluster, backend = self.cluster()
        for b in cluster.backups():
            cluster.execute(cluster.plan_delete(b.id))
        for snap in backend.list_snapshots():
            backend.delete_snapshot(snap.id)
        return time.perf_counter() - t0

    # ----------------------------------------------------------------- per scale

    def load(self, scale: int) -> dict[str, Any]:
        pg = self.pg
        t0 = time.perf_counter()
        pg.sql("ALTER SYSTEM SET archive_command = 'true'")
        pg.sql("SELECT pg_reload_conf()")
        took = self.pgbench("-i", "-q", "-s", str(scale))
        pg.sql("ALTER SYSTEM RESET archive_command")
        pg.sql("SELECT pg_reload_conf()")
        pg.sql("CHECKPOINT")
        pg.switch_wal(timeout=600)
        self.archiver_idle()
        db = int(pg.sql("SELECT pg_database_size('postgres')")[0][0])
        df = pg.host.run(["df", "-B1", "--output=used", "/pg/data", "/pg/wal"]).text.split()
        used = [int(x) for x in df if x.isdigit()]
        facts = {"init": took, "db_bytes": db, "data_used": used[0], "wal_used": used[1]}
        self.say(
            f"  {self.name} scale {scale}: pgbench -i -q -s {scale}: {took:.1f} s; database "
            f"{db / MB:.0f} MB; file systems used: data {used[0] / MB:.0f} MB, wal "
            f"{used[1] / MB:.0f} MB; ready in {time.perf_counter() - t0:.1f} s"
        )
        return facts

    def backup(self, n: int) -> dict[str, Any]:
        log = CallLog()
        cluster, _backend = self.cluster(log)
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
        cluster.plan_backup = timed_call("plan", cluster.plan_backup)
        cluster.execute = timed_call("execute", cluster.execute)
        mark = self.con.mark()
        t0 = time.perf_counter()
        record = cluster.backup(f"bench-{n}")
        wall = time.perf_counter() - t0
        console = self.con.since(mark)
        commands = self.con.names(mark)
        t1 = time.perf_counter()
        plain, _ = self.cluster()
        plain.execute(plain.plan_delete(record.id))
        deleted = time.perf_counter() - t1
        return {
            "wall": wall,
            "plan": split.get("plan"),
            "execute": split.get("execute"),
            "steps": dict(log.steps),
            "snapshot": sum(s for _step, name, s in log.calls if name == SNAPSHOT_CALL),
            "backup_mode": record.backup_mode_seconds,
            "console": console,
            "commands": commands,
            "delete": deleted,
        }

    def basebackup(self) -> dict[str, Any]:
        host = self.pg.host
        target = f"{BB_MNT}/base"
        mark = self.con.mark()
        t0 = time.perf_counter()
        self.pg.pg(
            "pg_basebackup",
            "-h",
            "/tmp",
            "-D",
            target,
            "-X",
            "stream",
            "-c",
            "fast",
            timeout=3600,
        )
        wall = time.perf_counter() - t0
        assert self.con.since(mark)["commands"] == 1
        size = int(host.run(["du", "-sb", target]).text.split()[0])
        host.run(["rm", "-rf", target], timeout=600)
        return {"wall": wall, "bytes": size}

    def recovery(self, scale: int, n: int) -> dict[str, Any]:
        pg = self.pg
        cluster, backend = self.cluster()
        record = cluster.backup(f"bench-recovery-{n}")
        self.pgbench("-n", "-c", "2", "-j", "2", "-T", str(self.args.load_seconds))
        churn = 0.0
        if self.args.churn:
            t = time.perf_counter()
            pg.sql(
                "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid <= %s",
                (scale * 100_000 * self.args.churn // 100,),
            )
            churn = time.perf_counter() - t
        # The load's pages reach the data volume (as on a server that has run a while):
        # without it they are only in the WAL and a classic merge has next to nothing to do.
        pg.sql("CHECKPOINT")
        rows = int(pg.sql("SELECT count(*) FROM pgbench_history")[0][0])
        pg.crash()
        pg.lose(PGDATA)
        changed: float | None = None
        if not self.thin:
            snap = record.snapshots[f"{VG}/data"]
            lv = next(x for x in backend.ex_logical_volumes() if x.id == snap)
            changed = (lv.snap_percent or 0.0) / 100 * lv.size
        log = CallLog()
        cluster, _ = self.cluster(log)
        mark = self.con.mark()
        t0 = time.perf_counter()
        plan = cluster.plan_recovery(RecoveryTarget.latest(), lost=[VolumeRole.DATA])
        t1 = time.perf_counter()
        try:
            result = cluster.execute(plan)
        except Exception:
            self.say(plan.explain())
            self.say(pg.server_log())
            raise
        t2 = time.perf_counter()
        console = self.con.since(mark)
        commands = self.con.names(mark)
        got = int(pg.sql("SELECT count(*) FROM pgbench_history")[0][0])
        accounts = int(pg.sql("SELECT count(*) FROM pgbench_accounts")[0][0])
        seconds = dict(result.seconds)
        out = {
            "plan": t1 - t0,
            "execute": t2 - t1,
            "wall": t2 - t0,
            # The step that restores the data volume (its id names the volume by the
            # layout's name for it: restore-pgdata).
            "restore": next(
                (seconds.get(st.id) for st in plan.steps if st.action == "storage.restore_volume"),
                None,
            ),
            "safety": seconds.get(SAFETY_STEP),
            "steps": seconds,
            "restore_calls": [s for _st, name, s in log.calls if name == "backend.restore_volume"],
            "changed": changed,
            "churn": churn,
            "rows": (got, rows),
            "accounts": (accounts, scale * 100_000),
            "rows_ok": got == rows and accounts == scale * 100_000,
            "console": console,
            "commands": commands,
        }
        out["purge"] = self.purge()
        return out

    def run_scale(self, scale: int) -> dict[str, Any]:
        say, args = self.say, self.args
        facts = self.load(scale)
        backups: list[dict[str, Any]] = []
        for n in range(1, args.runs + 1):
            prep = self.prepare()
            r = self.backup(n)
            backups.append(r)
            steps = ", ".join(f"{s} {v:.2f}" for s, v in r["steps"].items())
            c = r["console"]
            say(
                f"    pgsnap backup {n}: {r['wall']:.2f} s (plan {r['plan']:.2f}, execute "
                f"{r['execute']:.2f}: {steps}); snapshot call {r['snapshot']:.2f}; backup mode "
                f"{r['backup_mode'] or 0:.2f}; console: {c['commands']:.0f} commands "
                f"{c['seconds']:.2f} s, of which lvm {c['lvm_commands']:.0f} "
                f"{c['lvm_seconds']:.2f} s  [prepared in {prep:.1f} s; deleted in "
                f"{r['delete']:.1f} s]"
            )
            if n == 1:
                say(f"      its console commands: {r['commands']}")
        prep = self.prepare()
        base = self.basebackup()
        say(
            f"    pg_basebackup -X stream -c fast (to /bb, in the VM): {base['wall']:.2f} s, "
            f"{base['bytes'] / MB:.0f} MB  [prepared in {prep:.1f} s]"
        )
        recoveries: list[dict[str, Any]] = []
        for n in range(1, args.recovery_runs + 1):
            r = self.recovery(scale, n)
            recoveries.append(r)
            rest = ", ".join(f"{k} {v:.2f}" for k, v in r["steps"].items())
            changed = (
                f"; {r['changed'] / MB:.1f} MB changed since the backup (its COW store)"
                if r["changed"] is not None
                else ""
            )
            say(
                f"    recovery {n} (latest, data lost; the churn UPDATE took {r['churn']:.1f} s): "
                f"{r['wall']:.2f} s = plan {r['plan']:.2f} "
                f"+ execute {r['execute']:.2f} (steps: {rest}){changed}; console "
                f"{r['console']['commands']:.0f} commands; rows "
                f"{'ok' if r['rows_ok'] else 'WRONG'}: pgbench_history {r['rows'][0]}/"
                f"{r['rows'][1]}, pgbench_accounts {r['accounts'][0]}/{r['accounts'][1]}  "
                f"[cleaned up in {r['purge']:.1f} s]"
            )
            say(f"      its console commands: {r['commands']}")
        return {"facts": facts, "backups": backups, "basebackup": base, "recoveries": recoveries}


# --------------------------------------------------------------------------- report


def report(say: Callable[[str], None], results: dict[tuple[str, int], dict[str, Any]]) -> None:
    say("")
    say("== Backup: median (min .. max) of the pgsnap runs, seconds; one pg_basebackup per row ==")
    say("")
    rows = []
    for (mode, scale), r in results.items():
        b = r["backups"]
        med = median([x["wall"] for x in b])
        rows.append(
            [
                mode,
                f"{scale} ({r['facts']['db_bytes'] / MB:.0f} MB)",
                stats([x["wall"] for x in b], 2),
                stats([x["snapshot"] for x in b], 2),
                stats([x["backup_mode"] for x in b], 2),
                stats([x["console"]["commands"] for x in b], 0),
                f"{r['basebackup']['wall']:.2f}",
                f"{r['basebackup']['wall'] / med:.2f}x",
            ]
        )
    say(
        table(
            rows,
            [
                "snapshots",
                "scale (database)",
                "pgsnap backup",
                "snapshot call",
                "backup mode",
                "console commands",
                "pg_basebackup",
                "pg_basebackup / pgsnap",
            ],
        )
    )
    say("")
    say("pgsnap backup breakdown (median, seconds):")
    keys = list(results)
    steps: list[str] = []
    for k in keys:
        for b in results[k]["backups"]:
            steps += [s for s in b["steps"] if s not in steps]
    parts: list[tuple[str, Callable[[dict[str, Any]], float | None]]] = [
        ("Cluster.backup()", lambda x: x["wall"]),
        ("  plan_backup (observe + preflight)", lambda x: x["plan"]),
        ("  execute", lambda x: x["execute"]),
    ]
    for step in steps:
        parts.append((f"    step {step}", step_seconds(step)))
    parts += [
        ("storage snapshot call (create_snapshot_group)", lambda x: x["snapshot"]),
        ("time in backup mode", lambda x: x["backup_mode"]),
        ("console commands (count)", lambda x: x["console"]["commands"]),
        ("  their seconds", lambda x: x["console"]["seconds"]),
        ("  lvm commands (count)", lambda x: x["console"]["lvm_commands"]),
        ("  their seconds", lambda x: x["console"]["lvm_seconds"]),
        ("deleting the backup after (plan_delete + execute)", lambda x: x["delete"]),
    ]
    say(
        table(
            [
                [
                    name,
                    *(
                        stats(
                            [f(x) for x in results[k]["backups"]], 0 if "(count)" in name else 2
                        ).split(" (")[0]
                        for k in keys
                    ),
                ]
                for name, f in parts
            ],
            ["part", *(f"{m} s{s}" for m, s in keys)],
        )
    )
    recs = {k: r["recoveries"] for k, r in results.items() if r["recoveries"]}
    if recs:
        say("")
        say("== Recovery (latest, after a crash, data volume lost; WAL volume kept), seconds ==")
        say("")
        say(
            table(
                [
                    [
                        mode,
                        f"{scale} ({results[(mode, scale)]['facts']['db_bytes'] / MB:.0f} MB)",
                        stats(
                            [x["changed"] / MB if x["changed"] is not None else None for x in rs], 1
                        ),
                        stats([x["safety"] for x in rs], 2),
                        stats([x["restore"] for x in rs], 2),
                        stats([x["plan"] for x in rs], 2),
                        stats([x["execute"] for x in rs], 2),
                        stats([x["wall"] for x in rs], 2),
                        "yes" if all(x["rows_ok"] for x in rs) else "NO",
                    ]
                    for (mode, scale), rs in recs.items()
                ],
                [
                    "snapshots",
                    "scale (database)",
                    "MB changed (classic COW)",
                    "safety snapshot step",
                    "restore step (data volume)",
                    "planning",
                    "execute",
                    "plan + execute",
                    "rows ok",
                ],
            )
        )
        say("")
        say(
            "thin: the restore swaps in a thin snapshot of the backup's snapshot (a few lvm "
            "commands, independent of size); classic: lvconvert --merge copies the changed "
            "blocks back (the COW store's content) and consumes the snapshot."
        )
    say("")
    say("Ratios:")
    for mode in dict.fromkeys(m for m, _s in keys):
        sc = [s for m, s in keys if m == mode]
        if len(sc) < 2:
            continue
        lo, hi = results[(mode, sc[0])], results[(mode, sc[-1])]
        b_lo = median([x["wall"] for x in lo["backups"]])
        b_hi = median([x["wall"] for x in hi["backups"]])
        bb = hi["basebackup"]["wall"] / lo["basebackup"]["wall"]
        say(
            f"  {mode}: database x{hi['facts']['db_bytes'] / lo['facts']['db_bytes']:.1f} "
            f"(scale {sc[0]} -> {sc[-1]}): pgsnap backup x{b_hi / b_lo:.2f}, pg_basebackup "
            f"x{bb:.2f}"
            + (
                f", restore step x{restore_ratio(lo, hi):.2f}"
                if restore_ratio(lo, hi) is not None
                else ""
            )
        )
    scales = sorted({s for _m, s in keys})
    for s in scales:
        if ("thin", s) in results and ("classic", s) in results:
            t, c = results[("thin", s)], results[("classic", s)]
            say(
                f"  scale {s}: classic / thin: backup x"
                f"{median([x['wall'] for x in c['backups']]) / median([x['wall'] for x in t['backups']]):.2f}"  # noqa: E501
                + (
                    f", restore step x{restore_ratio(t, c):.2f}"
                    if restore_ratio(t, c) is not None
                    else ""
                )
            )
    say("")
    say(f"Caveat: {CAVEAT}. The machine is shared (2 CPUs; other VMs run tests): expect noise.")


def step_seconds(step: str) -> Callable[[dict[str, Any]], float | None]:
    def get(x: dict[str, Any]) -> float | None:
        value = x["steps"].get(step)
        return None if value is None else float(value)

    return get


def restore_ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    ra = [x["restore"] for x in a["recoveries"] if x["restore"] is not None]
    rb = [x["restore"] for x in b["recoveries"] if x["restore"] is not None]
    if not ra or not rb or median(ra) <= 0:
        return None
    return median(rb) / median(ra)


# --------------------------------------------------------------------------- main


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def machine() -> str:
    qemu = sh(["qemu-system-x86_64", "--version"]).splitlines()[0]
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GIB:.0f} GiB RAM, "
        f"Linux {platform.release()}, {qemu}, Python {platform.python_version()}, "
        f"commit {git_commit()} (uncommitted in pgsnap/: {', '.join(uncommitted()) or 'none'}"
        f"); load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scales", default="2,10", help="pgbench scales (default 2,10)")
    parser.add_argument(
        "--modes", default="thin,classic", help="thin, classic or both (default thin,classic)"
    )
    parser.add_argument("--runs", type=int, default=3, help="pgsnap backups per scale (default 3)")
    parser.add_argument(
        "--recovery-runs", type=int, default=1, help="recoveries per scale (default 1; 0: none)"
    )
    parser.add_argument(
        "--load",
        type=int,
        default=200,
        help="pgbench transactions before every backup method, after a CHECKPOINT (default 200)",
    )
    parser.add_argument(
        "--load-seconds",
        type=int,
        default=10,
        help="seconds of pgbench between a recovery's backup and its crash (default 10)",
    )
    parser.add_argument(
        "--churn",
        type=int,
        default=20,
        help="before a recovery's crash, update the first PERCENT of pgbench_accounts, so the "
        "blocks a classic merge copies back grow with the database (default 20; 0: none)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="scale 1, 1 backup, 1 recovery, little load"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="events, console commands")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scales, args.runs, args.recovery_runs, args.load, args.load_seconds = "1", 1, 1, 50, 3
    try:
        scales = sorted({int(s) for s in args.scales.split(",") if s.strip()})
    except ValueError:
        parser.error("--scales: comma-separated integers")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"thin", "classic"}:
        parser.error("--modes: thin, classic or both")
    if not 0 <= args.churn <= 50:
        parser.error("--churn: 0 to 50 (a classic snapshot's store is 25% of its volume)")
    if not scales or min(scales) < 1 or args.runs < 1 or args.recovery_runs < 0:
        parser.error("--scales and --runs must be >= 1, --recovery-runs >= 0")

    def say(msg: str) -> None:
        print(msg, flush=True)

    reason = lvmvm_unavailable()
    if reason is not None:
        say(f"cannot run: {reason}")
        return 2
    say(f"bench_lvm: {machine()}")
    words = sys.argv[1:] if argv is None else list(argv)
    say(f"command: python benchmarks/bench_lvm.py {' '.join(words)}")
    say(f"caveat: {CAVEAT}")
    signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.perf_counter()
    results: dict[tuple[str, int], dict[str, Any]] = {}
    interrupted = False
    failed: list[str] = []
    vm_facts: dict[str, dict[str, Any]] = {}
    for mode_name in modes:
        mode = Mode(mode_name == "thin", args, scales, say)
        t0 = time.perf_counter()
        try:
            mode.boot()
            vm_facts[mode_name] = mode.facts
            for s in scales:
                try:
                    results[(mode_name, s)] = mode.run_scale(s)
                except (PgsnapError, RuntimeError, AssertionError, StopIteration):
                    say(
                        f"{mode_name} scale {s} FAILED (not in the report):\n"
                        f"{traceback.format_exc()}"
                    )
                    failed.append(f"{mode_name} {s}")
                    try:
                        mode.purge()
                    except Exception:
                        say(f"  and cleaning up its backups failed: {traceback.format_exc()}")
                        break
        except KeyboardInterrupt:
            say(f"interrupted ({mode_name}): cleaning up")
            interrupted = True
        except Exception:  # reported; the other mode still runs
            say(f"{mode_name} FAILED:\n{traceback.format_exc()}")
            failed.append(mode_name)
        finally:
            t1 = time.perf_counter()
            mode.close()
            say(
                f"{mode_name}: {t1 - t0:.0f} s, VM closed in {time.perf_counter() - t1:.1f} s; "
                f"{time.perf_counter() - t_start:.0f} s so far"
            )
        if interrupted:
            break
    if results:
        report(say, results)
        for m, f in vm_facts.items():
            say(
                f"VM ({m}): kernel {f['kernel']}, lvm {f['lvm']}, PostgreSQL {f['postgres']}, "
                f"volumes {f['volume']}, booted in {f['boot']:.0f} s, console round trip "
                f"{f['round_trip'] * 1000:.0f} ms"
            )
    say("")
    say(
        f"total run time {time.perf_counter() - t_start:.0f} s"
        + (" (interrupted)" if interrupted else "")
        + (f" (FAILED: {', '.join(failed)})" if failed else "")
    )
    say(f"at the end: {machine()}")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
