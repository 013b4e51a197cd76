"""Benchmark: pgsnap against the tools a user would pick instead (pgBackRest, pg_basebackup).

Run (as root: loop devices, mount; PostgreSQL and pgBackRest run as the ``postgres`` OS user)::

    python benchmarks/bench_vs_peers.py                       # pgbench scale 100 (1.5 GB), 3 rounds
    python benchmarks/bench_vs_peers.py --scales 100,1000     # and 15 GB (needs about 70 GB free)
    python benchmarks/bench_vs_peers.py --scales 100 --rounds 1
    python benchmarks/bench_vs_peers.py --smoke               # scale 2, 1 round: about 3 min
    python benchmarks/bench_vs_peers.py --rows 1,3            # leave the TPS runs out
    python benchmarks/bench_vs_peers.py --dir /big            # the scratch area (default /var/tmp)

Every figure is the **whole command as a user runs it**: the wall time of a fresh
process (``pgsnap`` with a configuration file, ``pgbackrest``, ``pg_basebackup``),
through GNU time (``/usr/bin/time -f %M``) for its peak RSS (the largest process of
its tree: pgBackRest's ``process-max`` workers included).

Targets (the issue's): pgsnap's ``backup`` at most 0.3 s beyond PostgreSQL's
checkpoint and the snapshot call, and at least 20x faster than a pgBackRest full
backup and than ``pg_basebackup`` at 15 GB; TPS during a gentle (spread-checkpoint)
pgsnap backup within 5 % of a run with no backup; ``pgsnap recover`` to a server
accepting connections at most 1 s beyond PostgreSQL's own start and replay, and at
least 10x faster than pgBackRest ``restore --delta`` (+ start) at 15 GB. Prints the
figures and "met" / "NOT met"; never asserts. A target "at 15 GB" measured at a
smaller scale is reported as not measured there, with the ratio at the scale run.

Set-up, per scale (one data set each, made once):

- a throwaway btrfs on a loop device (:class:`~pgsnap.testing.btrfs.LoopBtrfs`, a
  sparse image in ``--dir``) and PostgreSQL 15 on it
  (:func:`~pgsnap.testing.btrfs.btrfs_server`: the data directory and ``pg_wal``
  are two subvolumes; 16 MB WAL segments; **fsync on**, checked; ``max_wal_size =
  4GB``; ``log_checkpoints``; ``log_line_prefix = '%n [%p] '`` for the server log's
  Unix times); ``pgbench -i -q -s SCALE`` (archiving off meanwhile: ``true``);
- one ``archive_command`` feeds both archives, so every method pays the same
  archiving: ``(test -f A/%f || cp %p A/%f) && pgbackrest ... archive-push %p``
  (``A``: pgsnap's archive directory, on the same btrfs outside the subvolumes);
- pgsnap's configuration file (``pgsnap.toml``: the database, ``[storage] backend
  = "btrfs"`` with its snapshot directory, the archive, the catalog, the two volumes);
  ``pgsnap check`` is run once;
- pgBackRest 2.45: a repository (``repo1-type=posix``) in a directory of the same
  btrfs, ``compress-type=lz4``, ``process-max=2``, ``start-fast=y``, stanza
  ``bench`` (``stanza-create``, ``check``); ``repo1-retention-full`` high, so that
  no backup expires another inside the timed command (older backups are expired
  between measurements, untimed).

Each round (``--rounds``; the order of the methods rotated from round to round) runs
the three rows:

1. **Backup, whole command**: before every method alike a ``CHECKPOINT``, ``--load``
   pgbench transactions and a wait until the archiver is idle; then
   ``pgsnap backup -c pgsnap.toml --json-events``; ``pgbackrest --stanza=bench
   --type=full backup``; ``pg_basebackup -D DIR -c fast -X stream`` (plain, into a
   directory on the same btrfs, fsynced: its default; deleted afterwards). For each,
   the backup's own checkpoint from the server log (``checkpoint starting: ...
   force wait`` and its ``checkpoint complete`` line: buffers, seconds). For pgsnap,
   the breakdown from its ``--json-events`` (each step's seconds; the time from the
   process start to its first event: the interpreter, imports, the configuration,
   connecting, observing and planning; and from its last event to its exit) and
   "beyond checkpoint + snapshot" = wall - the checkpoint's ``total`` - the snapshot
   step. ``pgsnap --help`` is timed too (the interpreter and the CLI's imports).
2. **TPS during the backup**: ``pgbench -n -c CLIENTS -j JOBS -T LENGTH -P 1
   --progress-timestamp`` (per-second TPS with Unix times), the backup started at
   second ``--at``; TPS during the backup (each second weighted by its overlap with
   the backup's window) as a share of TPS in the ``--baseline`` seconds before it,
   the slowest second overlapping the window, and the window's length. Two modes:
   *fast* (``pgsnap backup``, pgBackRest ``start-fast=y``, ``pg_basebackup -c
   fast``) and *gentle* (``pgsnap backup --checkpoint scheduled``: it waits until
   PostgreSQL's next checkpoint is due and starts with a spread one in its place;
   pgBackRest ``--no-start-fast``, ``pg_basebackup -c spread``), plus pgsnap's
   ``--checkpoint next`` (PostgreSQL's next checkpoint, then a fast one) and
   ``--spread`` (a spread checkpoint begun at once), and a **no backup** control run.
   During this row ``checkpoint_timeout`` is ``--checkpoint-timeout`` (default 60s) so that a spread
   checkpoint ends within the run, and ``checkpoint_completion_target`` is
   ``--completion-target`` (default 0.9, PostgreSQL's; ``--smoke`` 0.1); both are put
   back afterwards. Each run's LENGTH is at least
   ``--duration`` and long enough for its backup: ``--at`` + (gentle: twice the
   spread checkpoint, since a backup's checkpoint may wait for a timed one in
   progress; pgsnap's gentle backup: ``checkpoint_timeout`` x (1 + the completion
   target), the longest it waits) + 1.5x the method's slowest backup in row 1 +
   ``--tail``; the control runs as long as the longest. A backup that still outlasts
   its pgbench run is said so ("OUTLASTED"), its TPS then covers only the seconds
   under load. "vs no backup" compares TPS during the window with the control run's
   TPS over the same seconds of its run (same offsets from the run's start).
3. **PITR to a server accepting connections**: a pgsnap backup and a pgBackRest full
   backup (untimed here, rotated order, nothing written between them), then
   ``--pitr-load`` seconds of pgbench (2 clients) during which marker rows are
   inserted (``bench_marker``: 5 rows, the time T read from the server's clock, 5
   more rows); the WAL switched and archived (with ``--warm-index``, then ``pgsnap wal
   --index``, untimed, as a timer would have run it); then for each method, rotated: a crash
   (``pg_ctl stop -m immediate``), then, timed:

   - ``pgsnap recover -c pgsnap.toml --time T --timeline current --yes
     --json-events``, until it returns (it starts the server and waits until it is
     promoted and accepts writes);
   - with ``--agent``, the same ``pgsnap recover`` once more with ``PGSNAP_AGENT`` set,
     asked of the agent (it raises if the command ran in its own process instead);
   - ``pgbackrest --stanza=bench restore --delta --link-all --type=time --target=T
     --target-action=promote --target-timeline=current``, then ``pg_ctl start -w``,
     then polling until ``pg_is_in_recovery()`` is false (with hot standby,
     ``pg_ctl -w`` returns at consistency, before the target is reached).
     ``--link-all`` because ``pg_wal`` is a link to the WAL subvolume: without it
     pgBackRest restores ``pg_wal`` as a directory inside the data directory (seen
     here), which would move the WAL off its volume.

   ``--timeline current`` for both: the second restore of a round must replay the
   same timeline as the first, not the one the first created. After each restore the
   rows are checked: the 5 marker rows before T exist, the 5 after it do not, and
   every method restored the same logical point (``count(*)`` and ``sum(delta)`` of
   ``pgbench_history`` equal). PostgreSQL's own part is read from the server log
   (its first line of the start to ``database system is ready to accept
   connections``); pgsnap's overhead is its wall time minus that. Each recovery's
   safety snapshot is deleted afterwards (``pgsnap safety delete``, untimed).

Between measurements (untimed): ``pgsnap expire --redundancy 1``, pgBackRest
``expire --repo1-retention-full=1``, the base backup deleted, ``btrfs subvolume
sync`` (the cleaner done), ``sync``. The load average is read at the start and the
end of every measurement.

It prints the machine (CPUs, memory, kernel, btrfs-progs, PostgreSQL, pgBackRest,
Python, the commit and the uncommitted files under ``pgsnap/``, the scratch file
system, the load average) at the start and at the end, every run as it happens, the
tables, the targets, and a Markdown table for the README (date, machine, commit).

Everything is removed at the end (the processes it started killed, the server
stopped, the file system unmounted, the loop device detached, the image deleted),
also on failure, Ctrl-C or SIGTERM. It refuses to start when ``--dir`` has less free
space than the largest scale needs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import pwd
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
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import (
    cpu_model,
    git_commit,
    memory_bytes,
    raise_on_sigterm,
    sh,
    table,
    uncommitted,
)
from bench_backup import client_args, pg_env
from bench_recovery import READY, log_lines, phases

from pgsnap.testing.btrfs import LoopBtrfs, btrfs_server, btrfs_unavailable
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

TARGET_BACKUP_OVERHEAD_SECONDS = 0.3
TARGET_BACKUP_RATIO = 20.0
TARGET_GENTLE_TPS_SHARE = 0.95
TARGET_RECOVER_OVERHEAD_SECONDS = 1.0
TARGET_RESTORE_RATIO = 10.0
TARGET_SCALE = 1000
"""The ratio targets are stated at 15 GB: pgbench scale 1000."""

GB = 1000**3
MB = 1000**2
STANZA = "bench"
GNU_TIME = "/usr/bin/time"
METHODS = ("pgsnap", "pgbackrest", "pg_basebackup")
AGENT = "pgsnap-agent"
"""With ``--agent``: ``pgsnap backup`` (row 1) and ``pgsnap recover`` (row 3) asked of
a running ``pgsnap agent``."""
PGSNAP_WAYS = ("pgsnap", AGENT)
LABEL = {
    "pgsnap": "pgsnap",
    AGENT: "pgsnap (agent)",
    "pgbackrest": "pgBackRest",
    "pg_basebackup": "pg_basebackup",
}
COMMAND = {
    ("pgsnap", "fast"): "pgsnap backup",
    (AGENT, "fast"): "pgsnap backup, PGSNAP_AGENT set",
    ("pgsnap", "gentle"): "pgsnap backup --checkpoint scheduled",
    ("pgsnap", "next"): "pgsnap backup --checkpoint next",
    ("pgsnap", "spread"): "pgsnap backup --spread",
    ("pgbackrest", "fast"): "pgbackrest backup --type=full (start-fast=y)",
    ("pgbackrest", "gentle"): "pgbackrest backup --type=full --no-start-fast",
    ("pg_basebackup", "fast"): "pg_basebackup -c fast -X stream",
    ("pg_basebackup", "gentle"): "pg_basebackup -c spread -X stream",
}
TPS_RUNS = (
    *((m, mode) for mode in ("fast", "gentle") for m in METHODS),
    ("pgsnap", "next"),  # PostgreSQL's checkpoint, then a fast one
    ("pgsnap", "spread"),  # a spread checkpoint begun at once, for comparison
)
PITR_METHODS = ("pgsnap", "pgbackrest")
RECOVER_COMMAND = {
    "pgsnap": "pgsnap recover --time T",
    AGENT: "pgsnap recover --time T, PGSNAP_AGENT set",
    "pgbackrest": "pgbackrest restore --delta --link-all --type=time + pg_ctl start",
}


def tps_runs(spec: str | None) -> list[tuple[str, str]]:
    """Row 2's backups: all of :data:`TPS_RUNS`, or those ``--tps-runs`` names
    (``method:mode``, comma-separated); the control run is always made."""
    if not spec:
        return list(TPS_RUNS)
    chosen = [tuple(item.strip().split(":", 1)) for item in spec.split(",") if item.strip()]
    unknown = [":".join(c) for c in chosen if c not in TPS_RUNS]
    if unknown:
        known = ", ".join(f"{m}:{mode}" for m, mode in TPS_RUNS)
        raise SystemExit(f"--tps-runs: unknown {', '.join(unknown)} (known: {known})")
    return [(c[0], c[1]) for c in chosen]


MARKER_ROWS = 5
PGBACKREST_OPTIONS = {
    "repo1-retention-full": "9999999",
    "compress-type": "lz4",
    "process-max": "2",
    "start-fast": "y",
}
"""pgBackRest's options (besides paths): lz4 and two processes; no expiry
inside a timed backup (older backups are expired between measurements, untimed)."""

PROGRESS_RE = re.compile(r"^progress: (?P<t>[0-9.]+) s, (?P<tps>[0-9.]+) tps")
CHECKPOINT_START = "checkpoint starting: "
CHECKPOINT_RE = re.compile(
    r"wrote (?P<buffers>\d+) buffers.*write=(?P<write>[0-9.]+) s, sync=(?P<sync>[0-9.]+) s, "
    r"total=(?P<total>[0-9.]+) s; sync files=(?P<files>\d+)"
)
"""PostgreSQL's ``checkpoint complete`` log line (log_checkpoints)."""
STORAGE_STEPS = ("safety-snapshot", "restore-pgdata")
"""The recovery steps that are btrfs calls (the safety snapshot, the subvolume swap)."""


def need_bytes(scale: int) -> int:
    """Free space a scale needs in ``--dir``: the database, pg_wal (up to max_wal_size),
    both archives (the TPS runs write WAL for minutes), a pgBackRest full backup or two
    (lz4), a ``pg_basebackup`` copy at a time, what the snapshots keep, with a margin."""
    return 10 * GB + scale * 55 * MB


def image_bytes(scale: int) -> int:
    """The sparse image: only what is written takes space."""
    return max(40 << 30, scale * 80 * MB)


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ratio(num: float | None, den: float | None) -> str:
    """``num / den`` as ``12x`` (``1.5x`` below 10), empty when either is missing."""
    if not num or not den:
        return ""
    r = num / den
    return f"{r:.0f}x" if r >= 10 else f"{r:.1f}x"


def gb_text(size: int) -> str:
    gb = size / GB
    return f"{gb:.1f} GB" if gb >= 1 else f"{gb:.2f} GB"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def spread(values: Sequence[float | None], digits: int = 2, unit: str = "") -> str:
    """``median (min .. max)`` of the values, ``-`` without any."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    m = f"{statistics.median(vals):.{digits}f}{unit}"
    if len(vals) == 1:
        return m
    return f"{m} ({min(vals):.{digits}f} .. {max(vals):.{digits}f})"


def pct(values: Sequence[float | None]) -> str:
    """Shares as percentages, ``median (min .. max)``."""
    return spread([None if v is None else 100 * v for v in values], 0, " %")


def rotated(items: Sequence[str], n: int) -> list[str]:
    k = n % len(items) if items else 0
    return [*items[k:], *items[:k]]


def loadavg() -> float:
    return os.getloadavg()[0]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


# --------------------------------------------------------------------------- processes


@dataclasses.dataclass
class Done:
    """A finished process: its times (Unix), wall seconds, exit code, peak RSS, output."""

    argv: list[str]
    t0: float
    t1: float
    wall: float
    code: int
    rss_mb: float | None
    out: str
    err: str

    def check(self) -> Done:
        if self.code != 0:
            raise RuntimeError(
                f"{' '.join(self.argv)} failed ({self.code}):\n{(self.out + self.err)[-3000:]}"
            )
        return self


class Child:
    """A process under GNU time (``-f %M``: its peak RSS), in a session of its own so
    that it can be killed with its whole tree; every live one is killed at cleanup."""

    live: ClassVar[set[Child]] = set()
    _n: ClassVar[int] = 0

    def __init__(
        self,
        argv: Sequence[object],
        scratch: Path,
        *,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> None:
        Child._n += 1
        self.argv = [str(a) for a in argv]
        stem = scratch / f"p{Child._n:04d}"
        self.files = [stem.with_suffix(s) for s in (".out", ".err", ".rss")]
        for f in self.files:
            f.write_bytes(b"")
        kwargs: dict[str, Any] = {}
        if user is not None:
            entry = pwd.getpwnam(user)
            for f in self.files:
                os.chown(f, entry.pw_uid, entry.pw_gid)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": entry.pw_dir,
                "LC_ALL": "C",
                **(env or {}),
            }
            kwargs["cwd"] = "/"
        out, err, rss = self.files
        with open(out, "wb") as fo, open(err, "wb") as fe:
            self.t0 = time.time()
            self.p0 = time.perf_counter()
            self.proc = subprocess.Popen(
                [GNU_TIME, "-f", "%M", "-o", str(rss), *self.argv],
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                **kwargs,
            )
        Child.live.add(self)

    def wait(self, timeout: float) -> Done:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{' '.join(self.argv)} still ran after {timeout:.0f} s") from None
        except BaseException:
            self.kill()
            raise
        wall = time.perf_counter() - self.p0
        t1 = time.time()
        Child.live.discard(self)
        out, err, rss = (f.read_text(errors="replace") for f in self.files)
        for f in self.files:
            f.unlink(missing_ok=True)
        lines = rss.strip().splitlines()
        rss_mb = int(lines[-1]) * 1024 / MB if lines and lines[-1].isdigit() else None
        return Done(self.argv, self.t0, t1, wall, code, rss_mb, out, err)

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGTERM to the process group (pgsnap leaves backup mode on it), then SIGKILL."""
        Child.live.discard(self)
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @classmethod
    def kill_all(cls) -> None:
        for child in list(cls.live):
            child.kill()


# --------------------------------------------------------------------------- parsing


def pgsnap_events(stderr: str) -> list[dict[str, Any]]:
    """The ``--json-events`` objects of a pgsnap run's standard error."""
    events = []
    for line in stderr.splitlines():
        text = line.strip()
        if not text.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            ev = json.loads(text)
            if isinstance(ev, dict) and "kind" in ev and "at" in ev:
                events.append(ev)
    return events


def step_seconds(events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each step's seconds (its ``finished`` or ``failed`` event), in plan order."""
    return {
        str(ev["step"]): float(ev["seconds"])
        for ev in events
        if ev["kind"] in ("finished", "failed") and ev.get("seconds") is not None
    }


def pgsnap_split(done: Done) -> dict[str, Any]:
    """The parts of a pgsnap run from its events: start-up (process start to the first
    event), the steps, and the end (the last event to the process's exit)."""
    events = pgsnap_events(done.err)
    if not events:
        return {"steps": {}, "startup": None, "end": None, "events": 0}
    first = min(float(ev["at"]) for ev in events)
    last = max(float(ev["at"]) for ev in events)
    return {
        "steps": step_seconds(events),
        "startup": first - done.t0,
        "end": done.t1 - last,
        "events": len(events),
    }


def backup_checkpoint(lines: Sequence[tuple[float, str, str]]) -> dict[str, Any] | None:
    """The last checkpoint a backup requested (``force wait`` among its flags) in
    ``lines``: its flags, buffers written, files synced, write / sync / total seconds."""
    found = None
    flags: str | None = None
    for _t, _sev, msg in lines:
        if msg.startswith(CHECKPOINT_START):
            flags = msg[len(CHECKPOINT_START) :]
        elif msg.startswith("checkpoint complete") and flags is not None:
            m = CHECKPOINT_RE.search(msg)
            if m and "force" in flags and "wait" in flags:
                found = {"flags": flags, **{k: float(v) for k, v in m.groupdict().items()}}
            flags = None
    return found


def progress(stderr: str) -> list[tuple[float, float, float]]:
    """pgbench's per-second progress (``--progress-timestamp``): ``(start, end, tps)``
    per interval, in Unix time; the first interval is taken to be 1 s long."""
    out: list[tuple[float, float, float]] = []
    previous: float | None = None
    for line in stderr.splitlines():
        m = PROGRESS_RE.match(line.strip())
        if not m:
            continue
        end = float(m["t"])
        out.append((previous if previous is not None else end - 1.0, end, float(m["tps"])))
        previous = end
    return out


def window_tps(buckets: Sequence[tuple[float, float, float]], a: float, b: float) -> float | None:
    """TPS over ``[a, b]``: each interval weighted by its overlap with the window."""
    num = den = 0.0
    for s, e, tps in buckets:
        ov = overlap((s, e), (a, b))
        num += tps * ov
        den += ov
    return num / den if den > 0 else None


def slowest(buckets: Sequence[tuple[float, float, float]], a: float, b: float) -> float | None:
    vals = [tps for s, e, tps in buckets if overlap((s, e), (a, b)) > 0]
    return min(vals) if vals else None


# --------------------------------------------------------------------------- one scale


class Scale:
    """One data set on its own loop-mounted btrfs: the server, the tools, the rows."""

    def __init__(
        self, scale: int, args: argparse.Namespace, bindir: Path, say: Callable[[str], None]
    ) -> None:
        self.scale = scale
        self.args = args
        self.bindir = bindir
        self.say = say
        self.fs: LoopBtrfs | None = None
        self.server: PgServer | None = None
        self.scratch: Path | None = None
        self.config: Path | None = None
        self.pgbr_conf: Path | None = None
        self.pgsnap = pgsnap_program()
        self.facts: dict[str, Any] = {}
        self.backups: list[dict[str, Any]] = []
        self.tps_runs: list[dict[str, Any]] = []
        self.pitr: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.slowest_backup: dict[str, float] = {}
        self.agent: subprocess.Popen[bytes] | None = None

    # ----------------------------------------------------------------- setup, cleanup

    @property
    def srv(self) -> PgServer:
        assert self.server is not None
        return self.server

    @property
    def mount(self) -> Path:
        assert self.fs is not None
        return self.fs.mount_point

    @property
    def tmp(self) -> Path:
        assert self.scratch is not None
        return self.scratch

    def setup(self) -> None:
        args, say = self.args, self.say
        t0 = time.perf_counter()
        self.scratch = Path(tempfile.mkdtemp(prefix="pgsnap-bench-vs-peers-", dir=args.dir))
        self.scratch.chmod(0o755)  # the postgres OS user writes its processes' output here
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
        if server.sql("SHOW fsync")[0][0] != "on":
            raise RuntimeError("the server runs with fsync off: not real figures")
        say(
            f"scale {self.scale}: btrfs on {self.fs.device} ({image_bytes(self.scale) / GB:.0f} GB "
            f"sparse image in {self.fs.base}), PostgreSQL {server.version_num}, data and "
            "pg_wal on two subvolumes, 16 MB WAL segments, fsync=on, max_wal_size 4GB"
        )
        server.configure({"archive_command": "true"})  # the load's WAL is archived nowhere
        server.reload()
        init = Child(
            [self.bindir / "pgbench", "-i", "-q", "-s", self.scale], self.tmp, env=pg_env(server)
        ).wait(timeout=7200)
        init.check()
        server.sql(
            "CREATE TABLE bench_marker (round int, phase text, n int, "
            "at timestamptz DEFAULT clock_timestamp())"
        )
        self.pgbackrest_config()
        self.pgbackrest("stanza-create").check()
        server.configure({"archive_command": self.archive_command()})
        server.reload()
        server.sql("CHECKPOINT")
        server.switch_wal_and_wait_archived(timeout=900)
        server.wait_for_archive_idle(timeout=900)
        self.pgbackrest("check").check()
        self.config = write_pgsnap_config(server, self.mount / "snapshots")
        check = Child([self.pgsnap, "check", "-c", self.config], self.tmp).wait(timeout=600)
        verdict = next((ln for ln in check.out.splitlines() if "OK" in ln or "PROBLEMS" in ln), "?")
        if check.code not in (0,):
            raise RuntimeError(f"pgsnap check failed ({check.code}):\n{check.out}{check.err}")
        db = int(server.sql("SELECT pg_database_size('postgres')")[0][0])
        help_walls = [
            Child([self.pgsnap, "--help"], self.tmp).wait(timeout=60).wall for _ in range(3)
        ]
        floors = {  # what any process pays before pgsnap's own work (best of 3)
            what: min(
                Child([sys.executable, "-c", code], self.tmp).wait(timeout=60).wall
                for _ in range(3)
            )
            for what, code in (
                ("python_seconds", "pass"),
                ("psycopg_seconds", "import psycopg"),
                ("imports_seconds", "import psycopg, pgsnap.cli, pgsnap.cluster"),
            )
        }
        pgbr_options = ", ".join(f"{k}={v}" for k, v in PGBACKREST_OPTIONS.items())
        self.facts = {
            "init_seconds": init.wall,
            "db_bytes": db,
            "help_seconds": min(help_walls),
            **floors,
        }
        say(
            f"  pgbench -i -q -s {self.scale}: {init.wall:.1f} s; database {db / MB:.0f} MB; "
            f"pgBackRest stanza {STANZA} ({pgbr_options}, "
            f"repository {self.mount / 'pgbackrest' / 'repo'}); pgsnap {self.pgsnap} with "
            f"{self.config}; {verdict.strip()}; `pgsnap --help` "
            f"{min(help_walls):.3f} s (the interpreter and the CLI's imports); "
            f"set up in {time.perf_counter() - t0:.0f} s"
        )
        say(f"  archive_command: {self.archive_command()}")

    def archive_command(self) -> str:
        """pgsnap's archive (a copy into a directory), then pgBackRest's push."""
        a = self.srv.archive_dir
        return (
            f"(test -f {a}/%f || cp %p {a}/%f) && "
            f"pgbackrest --config={self.pgbr_conf} --stanza={STANZA} archive-push %p"
        )

    def pgbackrest_config(self) -> None:
        base = self.mount / "pgbackrest"
        subs = ("repo", "log", "lock", "spool")
        for sub in subs:
            (base / sub).mkdir(parents=True, exist_ok=True)
        options = "".join(f"{k}={v}\n" for k, v in PGBACKREST_OPTIONS.items())
        text = (
            f"[global]\nrepo1-type=posix\nrepo1-path={base / 'repo'}\n{options}"
            "log-level-console=warn\nlog-level-stderr=warn\nlog-level-file=info\n"
            f"log-path={base / 'log'}\nlock-path={base / 'lock'}\nspool-path={base / 'spool'}\n"
            f"\n[{STANZA}]\npg1-path={self.srv.data_dir}\npg1-port={self.srv.port}\n"
            f"pg1-socket-path={self.srv.socket_dir}\npg1-user=postgres\n"
        )
        self.pgbr_conf = base / "pgbackrest.conf"
        self.pgbr_conf.write_text(text)
        self.pgbr_conf.chmod(0o640)
        entry = pwd.getpwnam(self.srv.os_user)
        for path in (base, *(base / s for s in subs), self.pgbr_conf):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def pgbackrest_argv(self, *args: str) -> list[str]:
        return ["pgbackrest", f"--config={self.pgbr_conf}", f"--stanza={STANZA}", *args]

    def pgbackrest(self, *args: str, timeout: float = 7200) -> Done:
        """``pgbackrest --config ... --stanza=bench ARGS`` as the server's OS user."""
        return Child(self.pgbackrest_argv(*args), self.tmp, user=self.srv.os_user).wait(timeout)

    @property
    def agent_socket(self) -> Path:
        return self.tmp / "agent.sock"

    def start_agent(self) -> None:
        """``--agent``: a ``pgsnap agent`` for the agent runs of rows 1 and 3 (its start
        untimed)."""
        log = open(self.tmp / "agent.log", "wb")  # noqa: SIM115 - the agent's, closed with it
        self.agent = subprocess.Popen(
            [self.pgsnap, "agent", "--socket", str(self.agent_socket)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + 60
        while not self.agent_socket.exists():
            if self.agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"pgsnap agent did not start: {(self.tmp / 'agent.log').read_text()}"
                )
            time.sleep(0.05)

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        self.agent = None

    def cleanup(self) -> None:
        """Kill what runs, stop the server, unmount, detach, delete: every step tried."""
        Child.kill_all()
        self.stop_agent()
        if self.server is not None:
            with contextlib.suppress(Exception):
                if self.server.is_running():
                    self.server.stop(mode="immediate", timeout=60)
            self.server._cleaned = True  # its directories live on the btrfs
            self.server = None
        if self.fs is not None:
            self.fs.close()
            self.fs = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    # ----------------------------------------------------------------- between measurements

    def tidy(self) -> None:
        """Untimed: older backups expired (pgsnap, pgBackRest), the base backup gone, the
        btrfs cleaner done, dirty pages written."""
        assert self.config is not None
        notes = []
        done = Child(
            [self.pgsnap, "expire", "-c", self.config, "--redundancy", "1", "-q"], self.tmp
        ).wait(timeout=3600)
        if done.code != 0:
            notes.append(f"pgsnap expire failed ({done.code}): {(done.out + done.err)[-300:]}")
        done = self.pgbackrest("--repo1-retention-full=1", "expire", timeout=3600)
        if done.code != 0:
            notes.append(f"pgbackrest expire failed ({done.code}): {(done.out + done.err)[-300:]}")
        shutil.rmtree(self.mount / "basebackup", ignore_errors=True)
        subprocess.run(
            ["btrfs", "subvolume", "sync", str(self.mount)], capture_output=True, check=False
        )
        os.sync()
        for note in notes:
            self.say(f"  (housekeeping) {note}")

    def prepare(self, load: int) -> float:
        """Before every measurement alike: CHECKPOINT, ``load`` pgbench transactions,
        the archiver idle. Returns the seconds it took."""
        t0 = time.perf_counter()
        self.srv.sql("CHECKPOINT")
        if load:
            Child(
                [self.bindir / "pgbench", "-n", "-c", "2", "-j", "2", "-t", max(1, load // 2)],
                self.tmp,
                env=pg_env(self.srv),
            ).wait(timeout=3600).check()
        self.srv.wait_for_archive_idle(timeout=1800)
        return time.perf_counter() - t0

    # ----------------------------------------------------------------- backups

    def start_backup(self, method: str, mode: str) -> Child:
        """Start a backup: ``mode`` is fast, gentle, or (pgsnap only) next or spread."""
        gentle = mode != "fast"
        assert self.config is not None
        if method == AGENT:
            env = {**os.environ, "PGSNAP_AGENT": str(self.agent_socket)}
            asked = [self.pgsnap, "backup", "-c", self.config, "--json-events"]
            return Child(asked, self.tmp, env=env)
        if method == "pgsnap":
            argv: list[Any] = [self.pgsnap, "backup", "-c", self.config, "--json-events"]
            # Gentle: wait for PostgreSQL's next scheduled checkpoint, then a fast one
            # (docs/concepts.md, "Fast or gentle"); --spread is PostgreSQL's spread.
            extra = {
                "gentle": ["--checkpoint", "scheduled"],
                "next": ["--checkpoint", "next"],
                "spread": ["--spread"],
            }.get(mode, [])
            return Child([*argv, *extra], self.tmp)
        if method == "pgbackrest":
            extra = ["--no-start-fast"] if gentle else []
            return Child(
                self.pgbackrest_argv(*extra, "--type=full", "backup"),
                self.tmp,
                user=self.srv.os_user,
            )
        target = self.mount / "basebackup"
        shutil.rmtree(target, ignore_errors=True)
        argv = [
            self.bindir / "pg_basebackup",
            *client_args(self.srv),
            "-D",
            target,
            "-c",
            "spread" if gentle else "fast",
            "-X",
            "stream",
        ]
        return Child(argv, self.tmp, env=pg_env(self.srv))

    def finish_backup(self, method: str, child: Child, offset: int) -> dict[str, Any]:
        """Wait for a backup; its figures (and pgsnap's breakdown)."""
        done = child.wait(timeout=7200)
        lines = log_lines(self.srv.log_file, offset)
        r: dict[str, Any] = {
            "method": method,
            "ok": done.code == 0,
            "wall": done.wall,
            "t0": done.t0,
            "t1": done.t1,
            "rss": done.rss_mb,
            "checkpoint": backup_checkpoint(lines),
            "error": None if done.code == 0 else (done.out + done.err)[-1500:],
        }
        if method in ("pgsnap", AGENT):
            r.update(pgsnap_split(done))
            ckpt = (r["checkpoint"] or {}).get("total")
            snap = r["steps"].get("snapshot")
            r["beyond"] = done.wall - ckpt - snap if ckpt is not None and snap is not None else None
        return r

    def backup_line(self, r: dict[str, Any]) -> str:
        ckpt = r["checkpoint"] or {}
        text = (
            f"{r['wall']:.3f} s, peak RSS {r['rss'] or 0:.0f} MB; its checkpoint "
            f"{ckpt.get('total', '?')} s ({ckpt.get('buffers', '?'):.0f} buffers, "
            f"{ckpt.get('files', '?'):.0f} files synced)"
            if ckpt
            else f"{r['wall']:.3f} s, peak RSS {r['rss'] or 0:.0f} MB; its checkpoint: not found"
        )
        if r["method"] in ("pgsnap", AGENT) and r.get("steps"):
            steps = ", ".join(f"{k} {v:.3f}" for k, v in r["steps"].items())
            text += (
                f"; start-up {r['startup']:.3f}, steps: {steps}; end {r['end']:.3f}; beyond "
                f"checkpoint + snapshot {fmt(r['beyond'], 3)} s"
            )
        if not r["ok"]:
            text += f"; FAILED:\n{r['error']}"
        return text

    # ----------------------------------------------------------------- row 1

    def row_backup(self, n: int) -> None:
        methods = (*METHODS, AGENT) if self.args.agent else METHODS
        if self.args.agent and self.agent is None:
            self.start_agent()
        for method in rotated(methods, n):
            prep = self.prepare(self.args.load)
            load0 = loadavg()
            offset = self.srv.log_file.stat().st_size
            child = self.start_backup(method, "fast")
            r = self.finish_backup(method, child, offset)
            r.update(round=n, load=(load0, loadavg()))
            self.backups.append(r)
            if r["ok"]:
                self.slowest_backup[method] = max(self.slowest_backup.get(method, 0.0), r["wall"])
            self.say(
                f"  round {n + 1} backup {LABEL[method]}: {self.backup_line(r)}  [load "
                f"{r['load'][0]:.2f} -> {r['load'][1]:.2f}; prepared in {prep:.1f} s]"
            )
            self.tidy()

    # ----------------------------------------------------------------- row 2

    def spread_seconds(self) -> float:
        return float(self.args.checkpoint_timeout * self.args.completion_target)

    def estimate(self, method: str) -> float:
        """The slowest backup of ``method`` in row 1, or a guess from the database size."""
        if method in self.slowest_backup:
            return self.slowest_backup[method]
        return 3.0 if method == "pgsnap" else 5.0 + self.facts["db_bytes"] / (80 * MB)

    def planned_length(self, method: str, mode: str) -> int:
        args = self.args
        gentle = mode != "fast"
        need = args.at + (2 * self.spread_seconds() if gentle else 0.0)
        if method == "pgsnap" and mode in ("gentle", "next"):  # waits for PostgreSQL's
            need = args.at + args.checkpoint_timeout * (1 + args.completion_target)
        need += 1.5 * self.estimate(method) + args.tail
        return max(int(args.duration), math.ceil(float(need)))

    def row_tps(self, n: int) -> None:
        args = self.args
        runs = tps_runs(args.tps_runs)
        lengths = {(m, mode): self.planned_length(m, mode) for m, mode in runs}
        control_len = max(lengths.values())
        order: list[tuple[str, str]] = [*runs, ("none", "control")]
        order = [order[(i + n) % len(order)] for i in range(len(order))]
        self.srv.configure(
            {
                "checkpoint_timeout": f"{args.checkpoint_timeout}s",
                "checkpoint_completion_target": args.completion_target,
            }
        )
        self.srv.reload()
        try:
            for method, mode in order:
                length = control_len if method == "none" else lengths[(method, mode)]
                r = self.tps_run(method, mode, length)
                r["round"] = n
                self.tps_runs.append(r)
                self.say(f"  round {n + 1} TPS {tps_line(r)}")
                self.tidy()
        finally:
            self.srv.configure({"checkpoint_timeout": None, "checkpoint_completion_target": None})
            self.srv.reload()

    def tps_run(self, method: str, mode: str, length: int) -> dict[str, Any]:
        args = self.args
        self.prepare(0)
        time.sleep(1)
        load0 = loadavg()
        bench = Child(
            [
                self.bindir / "pgbench",
                "-n",
                "-c",
                args.clients,
                "-j",
                args.jobs,
                "-T",
                length,
                "-P",
                "1",
                "--progress-timestamp",
            ],
            self.tmp,
            env=pg_env(self.srv),
        )
        r: dict[str, Any] = {"method": method, "mode": mode, "length": length}
        backup: dict[str, Any] | None = None
        try:
            if method != "none":
                time.sleep(max(0.0, bench.t0 + args.at - time.time()))
                if not bench.running():
                    raise RuntimeError("pgbench ended before the backup started")
                offset = self.srv.log_file.stat().st_size
                child = self.start_backup(method, mode)
                backup = self.finish_backup(method, child, offset)
            done = bench.wait(timeout=length + 3600)
        except BaseException:
            bench.kill()
            raise
        buckets = progress(done.err)
        r.update(
            load=(load0, loadavg()),
            buckets=buckets,
            pgbench_ok=done.code == 0,
            pgbench_error=None if done.code == 0 else done.err[-1000:],
        )
        if not buckets:
            r["error"] = f"no pgbench progress lines: {done.err[-500:]}"
            return r
        run_start, run_end = buckets[0][0], buckets[-1][1]
        r.update(run_start=run_start, run_end=run_end, tps_run=window_tps(buckets, 0, math.inf))
        if backup is None:
            return r
        b0, b1 = backup["t0"], backup["t1"]
        before = window_tps(buckets, b0 - args.baseline, b0)
        during = window_tps(buckets, b0, max(b1, b0 + 0.001))
        low = slowest(buckets, b0, b1)
        r.update(
            backup=backup,
            window=b1 - b0,
            offset=b0 - run_start,
            before=before,
            during=during,
            share=during / before if during is not None and before else None,
            slowest_share=low / before if low is not None and before else None,
            outlasted=max(0.0, b1 - run_end),
        )
        return r

    def compare_with_control(self) -> None:
        """For each backup run, the control run's TPS over the same seconds of its run
        (same round; else any round's control)."""
        controls = {
            r["round"]: r for r in self.tps_runs if r["method"] == "none" and r.get("buckets")
        }
        for r in self.tps_runs:
            if r["method"] == "none" or "offset" not in r:
                continue
            c = controls.get(r["round"]) or next(iter(controls.values()), None)
            if c is None:
                continue
            a = c["run_start"] + r["offset"]
            b = a + max(r["window"], 0.001)
            during = window_tps(c["buckets"], a, b)
            before = window_tps(c["buckets"], a - self.args.baseline, a)
            r["control_during"] = during
            r["vs_control"] = r["during"] / during if during and r["during"] is not None else None
            r["control_share"] = during / before if during is not None and before else None
            # Each run's own share over the control's share over the same seconds: the
            # level of the two runs (one slower throughout) cancels out.
            r["vs_control_share"] = (
                r["share"] / r["control_share"]
                if r.get("share") is not None and r["control_share"]
                else None
            )
            r["control_short"] = b > c["run_end"]

    # ----------------------------------------------------------------- row 3

    def row_pitr(self, n: int) -> None:
        args, srv, say = self.args, self.srv, self.say
        assert self.config is not None
        self.prepare(0)
        lsn0 = srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]
        for method in rotated(PITR_METHODS, n):
            offset = srv.log_file.stat().st_size
            r = self.finish_backup(method, self.start_backup(method, "fast"), offset)
            if not r["ok"]:
                raise RuntimeError(
                    f"the {LABEL[method]} backup for the recovery failed:\n{r['error']}"
                )
            say(f"  round {n + 1} PITR: {LABEL[method]} backup {r['wall']:.2f} s")
        load = Child(
            [self.bindir / "pgbench", "-n", "-c", "2", "-j", "2", "-T", args.pitr_load],
            self.tmp,
            env=pg_env(srv),
        )
        try:
            time.sleep(args.pitr_load / 2)
            for i in range(MARKER_ROWS):
                srv.sql(
                    "INSERT INTO bench_marker (round, phase, n) VALUES (%s, 'before', %s)", (n, i)
                )
            time.sleep(0.2)
            target, lsn_t = srv.sql(
                "SELECT clock_timestamp(), pg_current_wal_lsn() - '0/0'::pg_lsn"
            )[0]
            time.sleep(0.2)
            for i in range(MARKER_ROWS):
                srv.sql(
                    "INSERT INTO bench_marker (round, phase, n) VALUES (%s, 'after', %s)", (n, i)
                )
            load.wait(timeout=args.pitr_load + 3600).check()
        except BaseException:
            load.kill()
            raise
        srv.switch_wal_and_wait_archived(timeout=900)
        srv.wait_for_archive_idle(timeout=1800)
        lsn_end = srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]
        t_text = target.isoformat(sep=" ")
        if args.warm_index:  # untimed: what a timer running `pgsnap wal --index` did
            done = Child([self.pgsnap, "wal", "-c", self.config, "--index", "-q"], self.tmp).wait(
                timeout=3600
            )
            say(f"  round {n + 1} PITR: pgsnap wal --index {done.wall:.2f} s: {done.out.strip()}")
        say(
            f"  round {n + 1} PITR: target {t_text}; WAL from before the backups to the "
            f"target {(int(lsn_t) - int(lsn0)) / MB:.0f} MB (to the end "
            f"{(int(lsn_end) - int(lsn0)) / MB:.0f} MB)"
        )
        recoveries = (*PITR_METHODS, AGENT) if args.agent else PITR_METHODS
        if args.agent and self.agent is None:
            self.start_agent()
        for method in rotated(recoveries, n):
            if srv.is_running():
                srv.pg_ctl("stop", "-m", "immediate")
            offset = srv.log_file.stat().st_size
            load0 = loadavg()
            if method in PGSNAP_WAYS:
                r = self.pgsnap_recover(t_text, agent=method == AGENT)
            else:
                r = self.pgbackrest_restore(t_text)
            r.update(round=n, method=method, load=(load0, loadavg()))
            lines = wait_for_log(srv.log_file, offset, READY, timeout=30)
            if self.args.verbose:
                with open(srv.log_file, "rb") as fh:
                    fh.seek(offset)
                    for raw in fh.read().decode(errors="replace").splitlines()[-60:]:
                        say(f"    | {raw[:200]}")
            found = dict(phases(lines))
            first, ready = found.get("postmaster started"), found.get("ready to accept connections")
            r["postgres"] = ready - first if first is not None and ready is not None else None
            r["phases"] = found
            r["overhead"] = r["wall"] - r["postgres"] if r["postgres"] is not None else None
            r["wal_mb"] = (int(lsn_t) - int(lsn0)) / MB
            if r["ok"]:
                r.update(self.check_rows(n))
            self.pitr.append(r)
            say(f"  round {n + 1} PITR {pitr_line(r)}")
            if method in PGSNAP_WAYS:
                self.delete_safety_snapshots()
        points = {r["point"] for r in self.pitr if r["round"] == n and r.get("point")}
        for r in self.pitr:
            if r["round"] == n:
                r["same_point"] = len(points) == 1
        if len(points) > 1:
            say(f"  round {n + 1} PITR: the methods restored DIFFERENT points: {sorted(points)}")
        if not srv.is_running():
            srv.start(timeout=3600)
        self.tidy()

    def pgsnap_recover(self, target: str, *, agent: bool = False) -> dict[str, Any]:
        """``pgsnap recover --time T`` on its own, or (``agent``) asked of the agent."""
        assert self.config is not None
        argv = [self.pgsnap, "recover", "-c", self.config, "--time", target]
        argv += ["--timeline", "current", "--yes", "--json-events"]
        env = {**os.environ, "PGSNAP_AGENT": str(self.agent_socket)} if agent else None
        done = Child(argv, self.tmp, env=env).wait(timeout=7200)
        if agent and "running in this process" in done.err:
            raise RuntimeError(f"the agent did not run pgsnap recover:\n{done.err[-2000:]}")
        r: dict[str, Any] = {
            "ok": done.code == 0,
            "wall": done.wall,
            "rss": done.rss_mb,
            "error": None if done.code == 0 else (done.out + done.err)[-3000:],
        }
        r.update(pgsnap_split(done))
        r["storage"] = sum(r["steps"].get(s, 0.0) for s in STORAGE_STEPS)
        return r

    def pgbackrest_restore(self, target: str) -> dict[str, Any]:
        srv = self.srv
        done = self.pgbackrest(
            "--delta",
            "--link-all",
            "--type=time",
            f"--target={target}",
            "--target-action=promote",
            "--target-timeline=current",
            "restore",
        )
        r: dict[str, Any] = {
            "ok": done.code == 0,
            "files": done.wall,
            "rss": done.rss_mb,
            "error": None if done.code == 0 else (done.out + done.err)[-3000:],
        }
        if not r["ok"]:
            r["wall"] = done.wall
            return r
        wal = srv.data_dir / "pg_wal"
        if not (wal.is_symlink() and Path(os.readlink(wal)) == srv.wal_dir):
            r["note"] = "pg_wal restored as " + (
                f"a link to {os.readlink(wal)}" if wal.is_symlink() else "a directory"
            )
        t0 = time.perf_counter()
        try:
            srv.start(timeout=3600)
            r["ready"] = done.wall + time.perf_counter() - t0
            deadline = time.monotonic() + 3600
            while True:
                with contextlib.suppress(Exception):
                    if srv.sql("SELECT pg_is_in_recovery()")[0][0] is False:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("the server was not promoted within 3600 s")
                time.sleep(0.02)
        except Exception as exc:
            r.update(ok=False, error=str(exc)[-3000:], wall=done.wall + time.perf_counter() - t0)
            return r
        r["wall"] = done.wall + time.perf_counter() - t0
        r["start"] = r["wall"] - done.wall
        return r

    def check_rows(self, n: int) -> dict[str, Any]:
        rows = self.srv.sql(
            "SELECT count(*) FILTER (WHERE phase = 'before'), count(*) FILTER (WHERE phase = "
            "'after') FROM bench_marker WHERE round = %s",
            (n,),
        )[0]
        hist = self.srv.sql("SELECT count(*), coalesce(sum(delta), 0) FROM pgbench_history")[0]
        tl = self.srv.sql("SELECT timeline_id FROM pg_control_checkpoint()")[0][0]
        return {
            "before_rows": int(rows[0]),
            "after_rows": int(rows[1]),
            "rows_ok": int(rows[0]) == MARKER_ROWS and int(rows[1]) == 0,
            "point": f"{int(hist[0])} rows, sum {int(hist[1])}",
            "timeline": int(tl),
        }

    def delete_safety_snapshots(self) -> None:
        assert self.config is not None
        done = Child([self.pgsnap, "safety", "list", "-c", self.config, "--json"], self.tmp).wait(
            600
        )
        try:
            names = [s["name"] for s in json.loads(done.out or "[]")]
        except (ValueError, KeyError, TypeError):
            names = []
        for name in names:
            d = Child([self.pgsnap, "safety", "delete", name, "-c", self.config], self.tmp).wait(
                600
            )
            if d.code != 0:
                self.say(f"  (housekeeping) pgsnap safety delete {name} failed: {d.err[-300:]}")

    # ----------------------------------------------------------------- a round

    def run_round(self, n: int) -> None:
        rows = self.args.row_set
        t0 = time.perf_counter()
        if 1 in rows:
            self.row_backup(n)
        if 2 in rows:
            self.row_tps(n)
        if 3 in rows:
            self.row_pitr(n)
        self.say(f"  round {n + 1} done in {time.perf_counter() - t0:.0f} s")


def wait_for_log(
    path: Path, offset: int, message: str, timeout: float
) -> list[tuple[float, str, str]]:
    """The log lines after ``offset`` once one starts with ``message`` (or after
    ``timeout``): the postmaster logs "ready to accept connections" just after the
    server leaves recovery, so a poll of ``pg_is_in_recovery()`` can win the race."""
    deadline = time.monotonic() + timeout
    while True:
        lines = log_lines(path, offset)
        if any(msg.startswith(message) for _t, _sev, msg in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def pgsnap_program() -> str:
    """The ``pgsnap`` entry point beside this interpreter (not a pyenv shim, which
    adds its own start-up), else the one on PATH."""
    beside = Path(sys.executable).with_name("pgsnap")
    if beside.is_file():
        return str(beside)
    found = shutil.which("pgsnap")
    if found is None:
        raise RuntimeError("no pgsnap program: pip install -e . in the checkout")
    return found


def write_pgsnap_config(server: PgServer, snapshot_dir: Path) -> Path:
    """``pgsnap.toml`` for the server, as a user writes it (docs/reference/btrfs.md)."""

    def q(value: object) -> str:  # a TOML basic string (JSON's escapes are TOML's)
        return json.dumps(str(value))

    base = server.base_dir
    volumes = "".join(
        f'\n[[volume]]\nid = {q(path)}\nname = "{name}"\nrole = "{role}"\nmount_point = {q(path)}\n'
        for path, name, role in (
            (server.data_dir, "pgdata", "data"),
            (server.wal_dir, "pgwal", "wal"),
        )
    )
    text = (
        "# pgsnap's configuration for benchmarks/bench_vs_peers.py's cluster.\n"
        f"[database]\nconninfo = {q(server.conninfo())}\n"
        f"data_directory = {q(server.data_dir)}\nbindir = {q(server.bindir)}\n"
        f"os_user = {q(server.os_user)}\nlog_file = {q(server.log_file)}\n\n"
        f'[storage]\nbackend = "btrfs"\n\n[storage.options]\nsnapshot_dir = {q(snapshot_dir)}\n\n'
        f"[archive]\npath = {q(server.archive_dir)}\n\n"
        f"[catalog]\npath = {q(base / 'catalog')}\njournal = {q(base / 'journal')}\n"
        f"{volumes}"
    )
    path = base / "pgsnap.toml"
    path.write_text(text)
    return path


def tps_line(r: dict[str, Any]) -> str:
    name = "no backup (control)" if r["method"] == "none" else COMMAND[(r["method"], r["mode"])]
    head = f"{name}: pgbench -T {r['length']}"
    if r.get("error"):
        return f"{head}: {r['error']}"
    if r["method"] == "none":
        return (
            f"{head}: {r['tps_run'] or 0:.0f} tps over the run  "
            f"[load {r['load'][0]:.2f} -> {r['load'][1]:.2f}]"
        )
    b = r["backup"]
    text = (
        f"{head}, backup at +{r['offset']:.1f} s for {r['window']:.2f} s: TPS before "
        f"{r['before'] or 0:.0f}, during {r['during'] or 0:.0f} ({(r['share'] or 0) * 100:.0f} %), "
        f"slowest second {(r['slowest_share'] or 0) * 100:.0f} %; peak RSS {b['rss'] or 0:.0f} MB"
    )
    ckpt = b["checkpoint"]
    if ckpt:
        text += f"; its checkpoint {ckpt['total']:.1f} s ({ckpt['flags']})"
    if r["outlasted"] > 0:
        text += f"; OUTLASTED the pgbench run by {r['outlasted']:.1f} s (TPS only while under load)"
    if not b["ok"]:
        text += f"; backup FAILED:\n{b['error']}"
    if not r["pgbench_ok"]:
        text += f"; pgbench FAILED: {r['pgbench_error']}"
    return text + f"  [load {r['load'][0]:.2f} -> {r['load'][1]:.2f}]"


def pitr_line(r: dict[str, Any]) -> str:
    name = LABEL[r["method"]]
    if not r["ok"]:
        return f"{name}: FAILED after {r['wall']:.1f} s:\n{r['error']}"
    text = f"{name}: {r['wall']:.2f} s to a promoted server"
    if r["method"] == "pgbackrest":
        text += (
            f" (restore --delta {r['files']:.2f} s, then pg_ctl start -w returned at "
            f"{r['ready']:.2f} s, promoted at {r['wall']:.2f} s)"
        )
    else:
        text += f" (start-up {r['startup'] or 0:.3f} s; btrfs steps {r['storage']:.3f} s)"
    text += (
        f"; PostgreSQL (log) {r['postgres'] or 0:.2f} s; beyond it {r['overhead'] or 0:.2f} s; "
        f"peak RSS {r['rss'] or 0:.0f} MB; rows {'ok' if r.get('rows_ok') else 'WRONG'} "
        f"(before T {r.get('before_rows')}/{MARKER_ROWS}, after T {r.get('after_rows')}/0); "
        f"{r.get('point')}; timeline {r.get('timeline')}"
    )
    if r.get("note"):
        text += f"; {r['note']}"
    return text + f"  [load {r['load'][0]:.2f} -> {r['load'][1]:.2f}]"


# --------------------------------------------------------------------------- report


def ok_backups(sc: Scale, method: str) -> list[dict[str, Any]]:
    return [r for r in sc.backups if r["method"] == method and r["ok"]]


def ckpt_total(r: dict[str, Any]) -> float | None:
    c = r.get("checkpoint")
    return float(c["total"]) if c else None


def report_backups(say: Callable[[str], None], scales: Sequence[Scale]) -> None:
    say("")
    say("== 1. Backup, whole command: seconds, median (min .. max) over the rounds ==")
    say("")
    rows = []
    for sc in scales:
        ref = median([r["wall"] for r in ok_backups(sc, "pgsnap")])
        for m in (*METHODS, AGENT):
            rs = ok_backups(sc, m)
            if not rs:
                continue
            wall = median([r["wall"] for r in rs])
            rows.append(
                [
                    str(sc.scale),
                    f"{sc.facts['db_bytes'] / GB:.2f}",
                    COMMAND[(m, "fast")],
                    spread([r["wall"] for r in rs], 3 if m in ("pgsnap", AGENT) else 1),
                    spread([ckpt_total(r) for r in rs], 3),
                    spread([r["rss"] for r in rs], 0),
                    spread([r["load"][0] for r in rs], 2)
                    + " -> "
                    + spread([r["load"][1] for r in rs], 2),
                    ratio(wall, ref) if m not in ("pgsnap", AGENT) else "",
                    f"{len(rs)}/{len([r for r in sc.backups if r['method'] == m])}",
                ]
            )
    say(
        table(
            rows,
            [
                "scale",
                "DB GB",
                "command",
                "wall s",
                "its checkpoint s",
                "peak RSS MB",
                "load avg start -> end",
                "/ pgsnap",
                "ok runs",
            ],
        )
    )
    say("")
    say("pgsnap backup, where the time goes (seconds, median (min .. max)):")
    parts: list[tuple[str, Callable[[dict[str, Any]], float | None]]] = [
        ("whole command (wall)", lambda r: r["wall"]),
        (
            "  process start -> first event (interpreter, imports, config, connect, plan)",
            lambda r: r["startup"],
        ),
    ]
    columns = [(sc, m) for sc in scales for m in ("pgsnap", AGENT) if ok_backups(sc, m)]
    steps: list[str] = []
    for sc, m in columns:
        for r in ok_backups(sc, m):
            steps += [k for k in r["steps"] if k not in steps]

    def step(name: str) -> Callable[[dict[str, Any]], float | None]:
        return lambda r: r["steps"].get(name)

    parts += [(f"  step {s}", step(s)) for s in steps]
    parts += [
        (
            "  between the steps (events' bookkeeping)",
            lambda r: (
                r["wall"] - r["startup"] - r["end"] - sum(r["steps"].values())
                if r["startup"] is not None
                else None
            ),
        ),
        ("  last event -> process exit (result, output)", lambda r: r["end"]),
        ("the backup's checkpoint (server log: total)", ckpt_total),
        ("beyond checkpoint + snapshot step", lambda r: r["beyond"]),
    ]
    say(
        table(
            [
                [name, *(spread([f(r) for r in ok_backups(sc, m)], 3) for sc, m in columns)]
                for name, f in parts
            ]
            + [
                [
                    "reference: `pgsnap --help` (best of 3)",
                    *(f"{sc.facts['help_seconds']:.3f}" for sc, _m in columns),
                ],
                [
                    "reference: `python -c pass` (best of 3)",
                    *(f"{sc.facts['python_seconds']:.3f}" for sc, _m in columns),
                ],
                [
                    "reference: `python -c 'import psycopg'` (best of 3)",
                    *(f"{sc.facts['psycopg_seconds']:.3f}" for sc, _m in columns),
                ],
                [
                    "reference: psycopg and the backup's pgsnap modules imported (best of 3)",
                    *(f"{sc.facts['imports_seconds']:.3f}" for sc, _m in columns),
                ],
            ],
            ["part", *(f"scale {sc.scale}, {LABEL[m]}" for sc, m in columns)],
        )
    )
    for sc in scales:
        failed = [r for r in sc.backups if not r["ok"]]
        for r in failed:
            say(f"scale {sc.scale}: {LABEL[r['method']]} backup FAILED in round {r['round'] + 1}")


def report_tps(
    say: Callable[[str], None], scales: Sequence[Scale], args: argparse.Namespace
) -> None:
    say("")
    say(
        f"== 2. TPS during the backup: pgbench -c {args.clients} -j {args.jobs} -P 1, backup at "
        f"second {args.at}, checkpoint_timeout {args.checkpoint_timeout}s, "
        f"checkpoint_completion_target {args.completion_target} =="
    )
    say("")
    say(
        f"share = TPS during the backup / TPS in the {args.baseline} s before it; slowest = the "
        "slowest second overlapping it / before; vs no backup = TPS during it / the control "
        "run's TPS over the same seconds of its run; share / control's share = the share "
        "over the control run's own share for the same seconds (each run's level cancels "
        "out: the target's measure); median (min .. max) over the rounds."
    )
    rows = []
    for sc in scales:
        for mode in ("fast", "gentle", "next", "spread"):
            for m in METHODS:
                rs = [
                    r
                    for r in sc.tps_runs
                    if r["method"] == m and r["mode"] == mode and "share" in r
                ]
                if not rs:
                    continue
                out = sum(1 for r in rs if r["outlasted"] > 0)
                rows.append(
                    [
                        str(sc.scale),
                        COMMAND[(m, mode)],
                        spread([r["window"] for r in rs], 2),
                        pct([r["share"] for r in rs]),
                        pct([r["slowest_share"] for r in rs]),
                        pct([r.get("vs_control") for r in rs]),
                        pct([r.get("vs_control_share") for r in rs]),
                        spread([ckpt_total(r["backup"]) for r in rs], 1),
                        f"{out} of {len(rs)}" if out else "no",
                        "yes" if all(r["backup"]["ok"] for r in rs) else "NO",
                    ]
                )
        controls = [r for r in sc.tps_runs if r["method"] == "none" and r.get("tps_run")]
        if controls:
            shares = [r.get("control_share") for r in sc.tps_runs if r.get("control_share")]
            rows.append(
                [
                    str(sc.scale),
                    "no backup (control)",
                    "-",
                    pct(shares) + " *",
                    "-",
                    "100 %",
                    "100 %",
                    "-",
                    "-",
                    "-",
                ]
            )
    say(
        table(
            rows,
            [
                "scale",
                "command",
                "window s",
                "share",
                "slowest",
                "vs no backup",
                "share / control's share",
                "its checkpoint s",
                "outlasted the run",
                "backup ok",
            ],
        )
    )
    say(
        "* the control run's own TPS over each backup's seconds / its seconds before them: "
        "how much TPS moves with no backup at all (timed checkpoints included)."
    )
    for sc in scales:
        for r in sc.tps_runs:
            if r.get("control_short"):
                say(
                    f"scale {sc.scale}: the control run ended before the window of "
                    f"{COMMAND[(r['method'], r['mode'])]} (round {r['round'] + 1}) did"
                )


def report_pitr(say: Callable[[str], None], scales: Sequence[Scale]) -> None:
    say("")
    say("== 3. PITR to a promoted server accepting connections, after a crash: seconds ==")
    say("")
    rows = []
    for sc in scales:
        ref = median([r["wall"] for r in sc.pitr if r["method"] == "pgsnap" and r["ok"]])
        for m in (*PITR_METHODS, AGENT):
            rs = [r for r in sc.pitr if r["method"] == m and r["ok"]]
            if not rs:
                continue
            wall = median([r["wall"] for r in rs])
            rows.append(
                [
                    str(sc.scale),
                    RECOVER_COMMAND[m],
                    spread([r["wall"] for r in rs], 2),
                    spread([r["storage"] if m in PGSNAP_WAYS else r["files"] for r in rs], 2),
                    spread([r["postgres"] for r in rs], 2),
                    spread([r["overhead"] for r in rs], 2),
                    spread([r["wal_mb"] for r in rs], 0),
                    spread([r["rss"] for r in rs], 0),
                    "yes" if all(r.get("rows_ok") for r in rs) else "NO",
                    "yes" if all(r.get("same_point") for r in rs) else "NO",
                    ratio(wall, ref) if m == "pgbackrest" else "",
                ]
            )
    say(
        table(
            rows,
            [
                "scale",
                "command",
                "wall s",
                "storage / files s",
                "PostgreSQL (log) s",
                "beyond PostgreSQL s",
                "WAL to T MB",
                "peak RSS MB",
                "rows ok",
                "same point",
                "/ pgsnap",
            ],
        )
    )
    say(
        "storage / files: pgsnap's btrfs steps (safety snapshot, subvolume swap); pgBackRest's "
        "restore command. PostgreSQL (log): its first line of the start to 'ready to accept "
        "connections'. beyond PostgreSQL: the wall time minus that."
    )
    for sc in scales:
        for way in PGSNAP_WAYS:
            rs = [r for r in sc.pitr if r["method"] == way and r["ok"]]
            if not rs:
                continue
            steps: list[str] = []
            for r in rs:
                steps += [k for k in r["steps"] if k not in steps]
            say(
                f"scale {sc.scale}: {RECOVER_COMMAND[way]}: its parts (median s): start-up "
                f"{median([r['startup'] for r in rs]) or 0:.3f}, "
                + ", ".join(
                    f"{s} {median([r['steps'].get(s) for r in rs]) or 0:.3f}" for s in steps
                )
                + f", end {median([r['end'] for r in rs]) or 0:.3f}"
            )
        for m in PITR_METHODS:
            first = next((r for r in sc.pitr if r["method"] == m and r["ok"] and r["phases"]), None)
            if first is not None:
                t0 = min(first["phases"].values())
                say(
                    f"scale {sc.scale}: PostgreSQL's phases after the {LABEL[m]} restore (round "
                    f"{first['round'] + 1}, seconds after its first log line): "
                    + ", ".join(f"{k} +{v - t0:.2f}" for k, v in first["phases"].items())
                )
        notes = {r["note"] for r in sc.pitr if r.get("note")}
        for note in notes:
            say(f"scale {sc.scale}: pgBackRest: {note}")
        for r in sc.pitr:
            if not r["ok"]:
                say(f"scale {sc.scale}: {LABEL[r['method']]} FAILED in round {r['round'] + 1}")


def report_targets(say: Callable[[str], None], scales: Sequence[Scale]) -> None:
    say("")
    say("== Targets ==")
    for sc in scales:
        s = sc.scale
        for method in ("pgsnap", AGENT):
            beyond = [r["beyond"] for r in ok_backups(sc, method) if r.get("beyond") is not None]
            if beyond:
                m = median(beyond) or 0.0
                target = TARGET_BACKUP_OVERHEAD_SECONDS
                say(
                    f"scale {s}: {COMMAND[(method, 'fast')]}: beyond checkpoint + snapshot: "
                    f"median {m:.3f} s ({spread(beyond, 3)}) (target <= {target} s): "
                    f"{met(m <= target)}"
                )
        ref = median([r["wall"] for r in ok_backups(sc, "pgsnap")])
        for peer in ("pgbackrest", "pg_basebackup"):
            w = median([r["wall"] for r in ok_backups(sc, peer)])
            if ref and w:
                times = w / ref
                verdict = (
                    met(times >= TARGET_BACKUP_RATIO)
                    if s >= TARGET_SCALE
                    else f"(the target is at 15 GB, scale {TARGET_SCALE}: not measured here; "
                    f"{'would be met' if times >= TARGET_BACKUP_RATIO else 'short'} at this scale)"
                )
                say(
                    f"scale {s}: {LABEL[peer]} / pgsnap backup: {times:.1f}x ({w:.1f} s / "
                    f"{ref:.2f} s) (target >= {TARGET_BACKUP_RATIO:.0f}x at 15 GB): {verdict}"
                )
        gentle_runs = [
            r
            for r in sc.tps_runs
            if r["method"] == "pgsnap" and r["mode"] == "gentle" and r.get("vs_control_share")
        ]
        if gentle_runs:
            gentle = [r["vs_control_share"] for r in gentle_runs]
            plain = [r.get("vs_control") for r in gentle_runs]
            g = median(gentle) or 0.0
            say(
                f"scale {s}: TPS during a gentle pgsnap backup against a run with no backup "
                f"(its share of its TPS before / the control's share over the same seconds): "
                f"median {g * 100:.1f} % ({pct(gentle)}; TPS against the control's TPS: "
                f"{pct(plain)}) (target >= {TARGET_GENTLE_TPS_SHARE * 100:.0f} %): "
                f"{met(g >= TARGET_GENTLE_TPS_SHARE)}"
            )
        for way in PGSNAP_WAYS:
            over = [
                r["overhead"]
                for r in sc.pitr
                if r["method"] == way and r["ok"] and r["overhead"] is not None
            ]
            if over:
                o = median(over) or 0.0
                limit = TARGET_RECOVER_OVERHEAD_SECONDS
                say(
                    f"scale {s}: {RECOVER_COMMAND[way]} beyond PostgreSQL's start and replay: "
                    f"median {o:.2f} s ({spread(over, 2)}) (target <= {limit} s): "
                    f"{met(o <= limit)}"
                )
        mine = median([r["wall"] for r in sc.pitr if r["method"] == "pgsnap" and r["ok"]])
        theirs = median([r["wall"] for r in sc.pitr if r["method"] == "pgbackrest" and r["ok"]])
        if mine and theirs:
            times = theirs / mine
            verdict = (
                met(times >= TARGET_RESTORE_RATIO)
                if s >= TARGET_SCALE
                else f"(the target is at 15 GB, scale {TARGET_SCALE}: not measured here; "
                f"{'would be met' if times >= TARGET_RESTORE_RATIO else 'short'} at this scale)"
            )
            say(
                f"scale {s}: pgBackRest restore --delta + start / pgsnap recover: {times:.1f}x "
                f"({theirs:.1f} s / {mine:.2f} s) (target >= {TARGET_RESTORE_RATIO:.0f}x "
                "at 15 GB): "
                f"{verdict}"
            )
    if not any(sc.scale >= TARGET_SCALE for sc in scales):
        say(f"(no scale >= {TARGET_SCALE} in this run: the 15 GB ratio targets are not measured)")


def readme_table(
    say: Callable[[str], None], scales: Sequence[Scale], machine_short: str
) -> list[str]:
    out = [
        f"Measured {dt.date.today().isoformat()} on {machine_short}, commit {git_commit()}"
        f"{' + uncommitted changes' if uncommitted('.') else ''} "
        "(`python benchmarks/bench_vs_peers.py`; median over the rounds):",
        "",
    ]
    rows = []
    for sc in scales:
        for m in METHODS:
            b = median([r["wall"] for r in ok_backups(sc, m)])

            def share(mode: str, m: str = m, sc: Scale = sc) -> str:
                rs = [
                    r
                    for r in sc.tps_runs
                    if r["method"] == m and r["mode"] == mode and "share" in r
                ]
                v = median([r.get("vs_control_share") for r in rs])
                w = median([r["window"] for r in rs])
                if v is None or w is None:
                    return "-"
                return f"{v * 100:.0f} % for {w:.1f} s"

            p = median([r["wall"] for r in sc.pitr if r["method"] == m and r["ok"]])
            rows.append(
                [
                    f"{sc.scale} ({gb_text(sc.facts['db_bytes'])})",
                    LABEL[m],
                    "-" if b is None else f"{b:.2f}" if b < 10 else f"{b:.0f}",
                    share("fast"),
                    share("gentle"),
                    "-" if p is None else f"{p:.1f}",
                ]
            )
    out.append(
        table(
            rows,
            [
                "scale",
                "tool",
                "backup s",
                "TPS during fast backup",
                "TPS during gentle backup",
                "PITR to promoted s",
            ],
        )
    )
    out += [
        "",
        "TPS: pgbench TPS while the backup runs as a share of its TPS before, over the same "
        "share in a run with no backup (same seconds), and how long the backup ran. "
        "Backup: the whole command. PITR: crash, "
        "then `pgsnap recover --time T` / `pgbackrest restore --delta --link-all --type=time` + "
        "`pg_ctl start` until the server is promoted (pg_basebackup has no PITR of its own).",
    ]
    for line in out:
        say(line)
    return out


# --------------------------------------------------------------------------- main


def machine(parent: Path, bindir: Path) -> str:
    changed = uncommitted("pgsnap")
    disk = sh(["df", "--output=source,fstype", str(parent)]).splitlines()[-1].split()
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GB:.0f} GB RAM, "
        f"Linux {platform.release()}, {sh(['btrfs', '--version'])}, "
        f"{sh([str(bindir / 'postgres'), '--version'])}, {sh(['pgbackrest', 'version'])}, "
        f"Python {platform.python_version()}, commit {git_commit()}"
        f"{' + uncommitted changes' if uncommitted('.') else ''}"
        f" (in pgsnap/: {', '.join(changed) or 'none'}); --dir {parent} on {' '.join(disk)} "
        f"({shutil.disk_usage(parent).free / GB:.0f} GB free); load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


def machine_short(bindir: Path) -> str:
    pg = sh([str(bindir / "postgres"), "--version"]).replace("postgres (PostgreSQL) ", "")
    return (
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GB:.0f} GB RAM, "
        f"Linux {platform.release()}, PostgreSQL {pg}, {sh(['pgbackrest', 'version'])}, "
        "btrfs on a loop device, fsync on"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add(
        "--warm-index",
        action="store_true",
        help="row 3: run `pgsnap wal --index` (untimed) after the WAL is archived and "
        "before the crash, as a timer would: pgsnap's plan then reads only its target's "
        "segment, not all the WAL since the backup",
    )
    add(
        "--scales",
        default="100",
        help="pgbench scales, comma-separated (default 100; 1000 = 15 GB)",
    )
    add("--rounds", type=int, default=3, help="rounds, the order rotated (default 3)")
    add(
        "--agent",
        action="store_true",
        help="rows 1 and 3: also `pgsnap backup` and `pgsnap recover` with PGSNAP_AGENT set, "
        "asked of a `pgsnap agent` started (untimed) for the scale: the command without its "
        "start-up",
    )
    add("--rows", default="1,2,3", help="which rows: 1 backup, 2 TPS, 3 PITR (default 1,2,3)")
    add(
        "--load",
        type=int,
        default=1000,
        help="pgbench transactions before every backup of row 1, after a CHECKPOINT (default 1000)",
    )
    add(
        "--duration", type=int, default=60, help="row 2: shortest pgbench run, seconds (default 60)"
    )
    add(
        "--at",
        type=float,
        default=20.0,
        help="row 2: the backup starts at this second (default 20)",
    )
    add(
        "--baseline",
        type=float,
        default=15.0,
        help="row 2: TPS before the backup over these seconds (default 15)",
    )
    add(
        "--tail",
        type=float,
        default=10.0,
        help="row 2: seconds of load planned after the backup's expected end (default 10)",
    )
    add(
        "--tps-runs",
        help="row 2: which backups, as method:mode, comma-separated (default all: "
        + ", ".join(f"{m}:{mode}" for m, mode in TPS_RUNS)
        + "); the control run with no backup is always made",
    )
    add("--clients", type=int, default=4, help="row 2: pgbench -c (default 4)")
    add("--jobs", type=int, default=2, help="row 2: pgbench -j (default 2)")
    add(
        "--checkpoint-timeout",
        type=int,
        default=60,
        help="row 2: checkpoint_timeout in seconds (default 60; PostgreSQL's minimum is 30)",
    )
    add(
        "--completion-target",
        type=float,
        default=0.9,
        help="row 2: checkpoint_completion_target (default 0.9, PostgreSQL's default)",
    )
    add(
        "--pitr-load",
        type=int,
        default=20,
        help="row 3: seconds of pgbench between the backups and the crash (default 20)",
    )
    add("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    add("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    add(
        "--smoke",
        action="store_true",
        help="scale 2, 1 round, 8 s runs (backup at 4 s), checkpoint_timeout 30s and "
        "completion target 0.1, 3 s of PITR load: checks the script (about 3 min)",
    )
    add("-v", "--verbose", action="store_true", help="the server log of each recovery")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scales, args.rounds, args.load = "2", 1, 100
        args.duration, args.at, args.baseline, args.tail = 8, 4.0, 3.0, 2.0
        args.checkpoint_timeout, args.completion_target, args.pitr_load = 30, 0.1, 3
    try:
        scales = [int(s) for s in args.scales.split(",") if s.strip()]
        args.row_set = {int(r) for r in args.rows.split(",") if r.strip()}
    except ValueError:
        parser.error("--scales and --rows: comma-separated integers")
    if not scales or min(scales) < 1 or args.rounds < 1 or not args.row_set <= {1, 2, 3}:
        parser.error("--scales and --rounds must be >= 1, --rows among 1, 2, 3")
    if args.checkpoint_timeout < 30 or args.at <= args.baseline:
        parser.error("--checkpoint-timeout >= 30; --at must be greater than --baseline")
    tps_runs(args.tps_runs)  # a misspelt run is said now, not after row 1

    def say(msg: str) -> None:
        print(msg, flush=True)

    reason = btrfs_unavailable()
    for tool, hint in (
        ("pgbackrest", "apt-get install -y pgbackrest"),
        (GNU_TIME, "apt-get install -y time"),
    ):
        if reason is None and shutil.which(tool) is None:
            reason = f"no {tool} ({hint})"
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
            f"{need / GB:.1f} GB (the database, its WAL in two archives, a pgBackRest backup, "
            "a pg_basebackup copy); free some space, pass --dir on a larger file system or "
            "smaller --scales"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    for tool in ("pgbench", "pg_basebackup", "postgres"):
        if not (bindir / tool).is_file():
            say(f"{bindir / tool} not found: install the PostgreSQL client programs")
            return 2
    say(f"bench_vs_peers: {machine(parent, bindir)}")
    words = sys.argv[1:] if argv is None else list(argv)
    say(f"command: python benchmarks/bench_vs_peers.py {' '.join(words)}")
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    t_start = time.perf_counter()
    done: list[Scale] = []
    interrupted = False
    failed: list[int] = []
    for s in scales:
        sc = Scale(s, args, bindir, say)
        t0 = time.perf_counter()
        try:
            sc.setup()
            for n in range(args.rounds):
                sc.run_round(n)
        except KeyboardInterrupt:
            say(f"interrupted at scale {s}: cleaning up")
            interrupted = True
        except Exception:  # reported; what was measured is still shown, the other scales run
            say(f"scale {s} FAILED:\n{traceback.format_exc()}")
            failed.append(s)
        finally:
            t1 = time.perf_counter()
            sc.cleanup()
            say(
                f"scale {s}: {t1 - t0:.0f} s, cleanup {time.perf_counter() - t1:.1f} s; "
                f"{time.perf_counter() - t_start:.0f} s so far"
            )
        sc.compare_with_control()
        if sc.backups or sc.tps_runs or sc.pitr:
            done.append(sc)
        if interrupted:
            break
    if done:
        if any(sc.backups for sc in done):
            report_backups(say, done)
        if any(sc.tps_runs for sc in done):
            report_tps(say, done, args)
        if any(sc.pitr for sc in done):
            report_pitr(say, done)
        report_targets(say, done)
        say("")
        say("== Markdown for the README ==")
        say("")
        readme_table(say, done, machine_short(bindir))
    say("")
    say(
        f"total run time {time.perf_counter() - t_start:.0f} s"
        + (" (interrupted: not everything ran)" if interrupted else "")
        + (f" (FAILED at scale {', '.join(map(str, failed))})" if failed else "")
    )
    say(f"at the end: {machine(parent, bindir)}")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
