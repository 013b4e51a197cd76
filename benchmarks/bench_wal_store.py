"""Benchmark: pgsnap's own WAL archive in S3 (``wal-push``, ``wal-get``) vs pgBackRest's.

Run (as root: PostgreSQL and pgBackRest run as the ``postgres`` OS user)::

    python3 benchmarks/bench_wal_store.py              # 1 GB of WAL, 3 runs
    python3 benchmarks/bench_wal_store.py --smoke      # 64 MB of WAL, 1 run: checks the script
    python3 benchmarks/bench_wal_store.py --wal-mb 4096 --runs 5 --dir /big
    python3 benchmarks/bench_wal_store.py --methods cp,pgsnap,pgbackrest-async
    python3 benchmarks/bench_wal_store.py --cache cold # page cache dropped before every replay

Targets (issue 23 §3): the replay of the WAL through ``pgsnap wal-get`` with prefetch
within 1.3x of the same replay from a local directory (``cp``), and no slower than
through pgBackRest's asynchronous ``archive-get``. Prints the figures, the ratios and
"met" / "NOT met"; never asserts.

The methods (``--methods``; each is measured pushing and fetching):

- ``cp``: a local directory (``test ! -f DIR/%f && cp %p DIR/%f``; ``cp DIR/%f %p``),
  the reference (no fsync, no network, no compression);
- ``pgsnap``: ``pgsnap -c CONFIG wal-push %p`` / ``wal-get %f %p`` (``env
  PYTHONPATH=<copy> <python> -m pgsnap``: a copy of this checkout's ``pgsnap/`` with
  its bytecode compiled, as an installed pgsnap has it; the checkout is not written
  to), ``[archive] ahead = 8``, ``parallel = 4``: pushes the next ``.ready`` files
  ahead, prefetches the next segments into its spool;
- ``pgsnap-ahead0``: the same with ``ahead = 0`` (one file per call, no prefetch);
- ``pgbackrest``: pgBackRest 2.45 ``archive-push`` / ``archive-get``, synchronous;
- ``pgbackrest-async``: the same with ``archive-async=y``, ``process-max=4``, a spool
  path, ``archive-get-queue-max`` = 8 segments (pgsnap's ``ahead``).

What it does:

1. a SeaweedFS S3 server on local ports serving HTTPS with a self-signed certificate
   for ``localhost`` (pgBackRest speaks only HTTPS to S3); pgsnap and pgBackRest both
   verify it; one bucket, a prefix per method and run; pgsnap zstd level 3 (its own),
   pgBackRest ``compress-type=zst``, ``compress-level=3``;
2. one PostgreSQL 15 server (16 MB segments, **fsync on**, ``max_wal_size = 1GB``,
   ``checkpoint_timeout = 1d``, autovacuum off), ``pgbench -i -s SCALE`` (its WAL
   archived nowhere), then ``archive_command = ''``: from here the WAL accumulates in
   ``pg_wal``, every finished segment marked ``.ready``; a base backup
   (``pg_basebackup -X stream -c fast``, which does not wait for the archive); pgbench
   (``-c 4 -j 2``) until ``--wal-mb`` of WAL were written after the backup's start;
   ``pg_switch_wal()``; a ``CHECKPOINT`` (none runs later: the backlog stays in
   ``pg_wal``). The backlog: every ``.ready`` file (the segments and the ``.backup``
   file), the rows of ``pgbench_history`` and ``sum(abalance)`` noted;
3. **push**: for each run, each method (the order rotated from run to run): the
   backlog's ``.done`` files renamed back to ``.ready`` (while ``archive_command`` is
   empty), the method's ``archive_command`` set (a fresh prefix, directory, spool,
   pgBackRest repository path and stanza), ``pg_ctl reload``, and the time until
   PostgreSQL's archiver has archived every file of the backlog (no ``.ready`` left):
   segments/s and MB/s; the files in the archive counted afterwards; CPU of the
   machine (``/proc/stat``) and of SeaweedFS meanwhile;
4. **archiving under load**: for each run and method, a ``CHECKPOINT`` then
   ``--lag-seconds`` of pgbench with the method's ``archive_command`` (a fresh
   prefix): the ``.ready`` count sampled every 0.25 s (its maximum and mean: the
   archiver's lag), pgbench's tps, and the time the archiver took to catch up after
   pgbench ended;
5. the source server stopped; **replay**: for each run and method (rotated), a fresh
   copy of the base backup (its ``pg_wal`` empty: every segment comes through the
   ``restore_command``), ``recovery.signal``, the method's ``restore_command`` on the
   archive its push of run 1 filled (``pgsnap-ahead0`` reads what ``pgsnap-ahead0``
   pushed; the content is the same), no recovery target (the archive ends with the
   backlog), started and timed from the server log's own timestamps (``log_line_prefix
   = '%n [%p] '``): "starting PostgreSQL" to "ready to accept connections" after the
   promotion (the headline), and "redo starts" to "redo done"; the segments restored
   (its "restored log file" lines) and the rows checked against the source's;
6. **single calls**: each command run by hand (as ``postgres``, in a directory of its
   own) on one segment, ``--calls`` times: what one call of ``restore_command`` /
   ``archive_command`` costs (the interpreter's start-up, pgsnap's imports, and
   ``wal-get`` from a copy without bytecode shown apart).

Everything is removed at the end (servers stopped, S3 server stopped, processes our
servers left behind ended by their id, scratch directory deleted), also on failure,
Ctrl-C or SIGTERM. It refuses to start when ``--dir`` has less free space than the
run needs.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime as dt
import json
import os
import platform
import pwd
import re
import shlex
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
from bench_backup import pg_env
from bench_recovery import log_lines

from pgsnap.archives.config import archive_settings, wal_get_command
from pgsnap.errors import ConfigurationError
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable, self_signed_cert

REPO = Path(__file__).resolve().parent.parent
"""This checkout: the commands PostgreSQL runs import its pgsnap (PYTHONPATH)."""
TARGET_DIRECTORY = 1.3
"""pgsnap wal-get with prefetch: replay time / replay time from a directory, at most."""
TARGET_PGBACKREST = 1.0
"""pgsnap wal-get with prefetch: replay time / pgBackRest async archive-get's, at most."""

GB = 1000**3
MB = 1000**2
MiB = 1 << 20
SEGMENT = 16 * MiB
BUCKET = "wal"
AHEAD = 8
PARALLEL = 4
ZSTD_LEVEL = 3
"""pgsnap's zstd level (pgsnap/archives/format.py ``_ZSTD_LEVEL``), given to pgBackRest too."""
STANZA = "bench"
METHODS = ("cp", "pgsnap", "pgsnap-ahead0", "pgbackrest", "pgbackrest-async")
PUSH_LABEL = {
    "cp": "cp to a local directory",
    "pgsnap": f"pgsnap wal-push (ahead {AHEAD}, parallel {PARALLEL})",
    "pgsnap-ahead0": "pgsnap wal-push (ahead 0)",
    "pgbackrest": "pgBackRest archive-push",
    "pgbackrest-async": f"pgBackRest archive-push async (process-max {PARALLEL})",
}
GET_LABEL = {
    "cp": "cp from a local directory",
    "pgsnap": f"pgsnap wal-get, prefetch (ahead {AHEAD}, parallel {PARALLEL})",
    "pgsnap-ahead0": "pgsnap wal-get, no prefetch (ahead 0)",
    "pgbackrest": "pgBackRest archive-get",
    "pgbackrest-async": f"pgBackRest archive-get async (queue {AHEAD} segments, "
    f"process-max {PARALLEL})",
}
FAMILY = {
    "cp": ("cp",),
    "pgsnap": ("pgsnap", "pgsnap-ahead0"),
    "pgsnap-ahead0": ("pgsnap-ahead0", "pgsnap"),
    "pgbackrest": ("pgbackrest", "pgbackrest-async"),
    "pgbackrest-async": ("pgbackrest-async", "pgbackrest"),
}
"""Whose archive a replay reads: its own push of run 1, else its family's."""
SERVER_SETTINGS: dict[str, str | int | bool] = {
    "fsync": True,
    "log_line_prefix": "%n [%p] ",
    "log_checkpoints": True,
    "autovacuum": False,
    "max_wal_size": "1GB",
}
WAL_NAME = re.compile(r"^([0-9A-F]{24}(?:\.[0-9A-F]{8}\.backup)?)")
READY = "database system is ready to accept connections"
_TICK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- helpers


def sh(argv: Sequence[str]) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"({exc})"
    return (proc.stdout or proc.stderr).strip()


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def spread(values: Sequence[float | None], digits: int = 2) -> str:
    """Median (min .. max), ``-`` when there is none."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    m = f"{statistics.median(vals):.{digits}f}"
    if len(vals) == 1:
        return m
    return f"{m} ({min(vals):.{digits}f} .. {max(vals):.{digits}f})"


def rotated(items: Sequence[str], n: int) -> list[str]:
    k = n % len(items) if items else 0
    return [*items[k:], *items[:k]]


def parse_lsn(text: str) -> int:
    high, _, low = text.strip().partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def machine_cpu() -> float:
    """Busy CPU seconds of the machine so far (``/proc/stat``: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / _TICK


def process_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` and of the children it waited for (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / _TICK


def postgres_owned(path: Path) -> Path:
    """``path`` made (parents too) and given to the ``postgres`` OS user."""
    path.mkdir(parents=True, exist_ok=True)
    entry = pwd.getpwnam("postgres")
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def end_processes_under(marker: str) -> list[str]:
    """End the processes whose command line names ``marker`` (a path under this run's
    scratch directory: what our servers started and left running, e.g. a prefetcher or
    pgBackRest's asynchronous process), each by its id; what they were."""
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(marker.encode() in a for a in argv):
            words = [a.decode(errors="replace") for a in argv if a]
            found[int(entry.name)] = " ".join(
                w.rpartition("/")[2] for w in words if not w.startswith("-")
            )[:80]
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for pid in found:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
    return [f"{pid} ({what})" for pid, what in found.items()]


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 7200,
    cwd: Path | None = None,
) -> str:
    """Run ``argv``; its output. Raises with the output on failure."""
    proc = subprocess.run(
        list(argv), capture_output=True, text=True, env=env, timeout=timeout, check=False, cwd=cwd
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc.stdout + proc.stderr


def as_postgres(argv: Sequence[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv]


def q(text: str | Path) -> str:
    """A TOML basic string (a JSON string is one)."""
    return json.dumps(str(text))


# --------------------------------------------------------------------------- the bench


class Bench:
    """The S3 server, the source server and its backlog, the measurements."""

    def __init__(self, args: argparse.Namespace, bindir: Path, say: Callable[[str], None]) -> None:
        self.args = args
        self.bindir = bindir
        self.say = say
        self.methods: list[str] = list(args.methods)
        self.scratch: Path | None = None
        self.s3: SeaweedS3 | None = None
        self.cert: Path | None = None
        self.credentials: Path | None = None
        self.lister: Any = None
        self.server: PgServer | None = None
        self.restored: list[PgServer] = []
        self.base: Path | None = None
        self.backlog: list[str] = []
        self.facts: dict[str, Any] = {}
        self.archives: dict[str, str] = {}
        """Method -> where its push of run 1 put the backlog (directory, prefix, repo)."""
        self.push_rows: list[dict[str, Any]] = []
        self.lag_rows: list[dict[str, Any]] = []
        self.replay_rows: list[dict[str, Any]] = []
        self.call_rows: list[dict[str, Any]] = []
        self.left_over: list[str] = []
        self.phases: dict[str, float] = {}
        """Seconds each phase took (setup, push, lag, replay, calls)."""
        self.code: Path | None = None
        """Where the commands PostgreSQL runs import pgsnap from: a compiled copy of this
        checkout's ``pgsnap/``."""

    # ----------------------------------------------------------------- set-up, clean-up

    @property
    def srv(self) -> PgServer:
        if self.server is None:
            raise RuntimeError("no source server")
        return self.server

    @property
    def work(self) -> Path:
        if self.scratch is None:
            raise RuntimeError("no scratch directory")
        return self.scratch

    @property
    def https(self) -> str:
        if self.s3 is None or self.s3.https_endpoint is None:
            raise RuntimeError("no HTTPS S3 endpoint")
        return self.s3.https_endpoint

    def setup(self) -> None:
        args, say = self.args, self.say
        t0 = time.perf_counter()
        self.scratch = Path(tempfile.mkdtemp(prefix="pgsnap-bench-walstore-", dir=args.dir))
        self.scratch.chmod(0o755)  # the postgres OS user reads the CA file and the configs
        self.code = self.scratch / "code"
        shutil.copytree(
            REPO / "pgsnap", self.code / "pgsnap", ignore=shutil.ignore_patterns("__pycache__")
        )
        if not compileall.compile_dir(self.code / "pgsnap", quiet=1):
            raise RuntimeError(f"compileall failed in {self.code}")
        where = run(  # what PostgreSQL's commands will import (an editable install, a .pth?)
            as_postgres(
                [
                    "env",
                    f"PYTHONPATH={self.code}",
                    sys.executable,
                    "-c",
                    "import pgsnap.archives.commands as c; print(c.__cached__)",
                ]
            ),
            cwd=self.scratch,
        ).strip()
        if not where.startswith(f"{self.code}/"):
            raise RuntimeError(f"PostgreSQL's commands would import pgsnap from {where}")
        say(
            f"pgsnap for PostgreSQL's commands: a copy of {REPO / 'pgsnap'} (commit "
            f"{git_commit()}) with its bytecode compiled, as an installed pgsnap has it "
            f"(PYTHONPATH={self.code}; the checkout is not written to)"
        )
        self.cert, key = self_signed_cert(self.scratch / "tls")
        for attempt in range(1, 4):
            try:
                self.s3 = SeaweedS3.start(
                    self.scratch / f"s3-{attempt}",
                    tls=(self.cert, key),
                    max_volumes=s3_volumes(args),
                )
                break
            except ConfigurationError as exc:  # a port taken between its probe and weed's bind
                if "address already in use" not in str(exc) or attempt == 3:
                    raise
                say(f"SeaweedFS did not start (a port was taken meanwhile): again ({attempt})")
        if self.s3 is None:
            raise RuntimeError("no S3 server")
        self.s3.create_bucket(BUCKET)
        self.lister = self.s3.client()
        self.credentials = self.scratch / "s3.credentials"
        self.credentials.write_text(
            f"[default]\naws_access_key_id = {self.s3.admin.access_key}\n"
            f"aws_secret_access_key = {self.s3.admin.secret_key}\n"
        )
        self.credentials.chmod(0o600)
        entry = pwd.getpwnam("postgres")
        os.chown(self.credentials, entry.pw_uid, entry.pw_gid)
        say(
            f"SeaweedFS S3: {sh(['weed', 'version']).splitlines()[0]}; HTTPS {self.https} "
            "(self-signed certificate for localhost, verified by pgsnap and pgBackRest); "
            f"bucket {BUCKET}"
        )
        self.server = server = PgServer.create(
            self.bindir,
            wal_segsize_mb=16,
            separate_wal_dir=True,
            archive=True,
            settings={
                **SERVER_SETTINGS,
                "checkpoint_timeout": "1d",
                "archive_command": "true",  # pgbench -i's WAL archived nowhere
            },
            parent_dir=self.scratch,
        )
        server.start()
        if server.sql("SHOW fsync")[0][0] != "on":
            raise RuntimeError("the server runs with fsync off: not real figures")
        env = pg_env(server)
        t1 = time.perf_counter()
        run([str(self.bindir / "pgbench"), "-i", "-q", "-s", str(args.scale)], env=env)
        init = time.perf_counter() - t1
        server.sql("CHECKPOINT")
        server.sql("SELECT pg_switch_wal()")
        server.wait_for_archive_idle(timeout=600)
        server.configure({"archive_command": ""})  # the WAL accumulates, .ready
        server.reload()
        self.base = self.scratch / "base"
        t1 = time.perf_counter()
        run(
            [
                str(self.bindir / "pg_basebackup"),
                "-D",
                str(self.base),
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
                "-h",
                str(server.socket_dir),
                "-p",
                str(server.port),
                "-U",
                "postgres",
            ]
        )
        backup = time.perf_counter() - t1
        label = (self.base / "backup_label").read_text()
        found = re.search(r"START WAL LOCATION: (\S+)", label)
        if found is None:
            raise RuntimeError(f"no START WAL LOCATION in the backup's label:\n{label}")
        start_lsn = parse_lsn(found.group(1))
        load = self.make_wal(start_lsn, args.wal_mb * MB)
        # Read before the switch: the scan prunes pages (WAL, full-page images), and that
        # WAL belongs in the backlog, not after it.
        rows = server.sql(
            "SELECT (SELECT count(*) FROM pgbench_history), "
            "(SELECT sum(abalance) FROM pgbench_accounts)"
        )[0]
        # pg_switch_wal(): the end of the switched segment's WAL, + 1 (whatever the
        # bgwriter writes after it goes to the next segment)
        end_lsn = int(server.sql("SELECT pg_switch_wal() - '0/0'::pg_lsn")[0][0])
        status = server.wal_dir / "archive_status"
        last = f"{1:08X}{(end_lsn - 1) // SEGMENT >> 8:08X}{(end_lsn - 1) // SEGMENT & 0xFF:08X}"
        deadline = time.monotonic() + 60
        while not (status / f"{last}.ready").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{last} was never marked .ready")
            time.sleep(0.05)
        server.sql("CHECKPOINT")  # none in flight later: nothing removes the backlog
        self.backlog = sorted(p.name.removesuffix(".ready") for p in status.glob("*.ready"))
        segments = [n for n in self.backlog if len(n) == 24]
        self.facts = {
            "init_seconds": init,
            "backup_seconds": backup,
            "db_bytes": int(server.sql("SELECT pg_database_size('postgres')")[0][0]),
            "wal_bytes": end_lsn - start_lsn,
            "segments": len(segments),
            "files": len(self.backlog),
            "history": int(rows[0]),
            "abalance": int(rows[1]),
            **load,
        }
        say(
            f"PostgreSQL {server.version_num}: 16 MB segments, fsync=on, max_wal_size 1GB, "
            f"checkpoint_timeout 1d, autovacuum off; pgbench -i -q -s {args.scale}: "
            f"{init:.1f} s, database {self.facts['db_bytes'] / MB:.0f} MB; pg_basebackup "
            f"-X stream -c fast: {backup:.1f} s (start {found.group(1)})"
        )
        say(
            f"load: pgbench -n -c 4 -j 2 for {load['load_seconds']:.0f} s "
            f"({load['tps']:.0f} tps, {load['wal_rate'] / MB:.1f} MB/s of WAL); backlog "
            f"{len(segments)} segments ({segments[0]} .. {segments[-1]}) + "
            f"{len(self.backlog) - len(segments)} other file(s), "
            f"{self.facts['wal_bytes'] / MB:.0f} MB of WAL from the backup's start; "
            f"{self.facts['history']} rows in pgbench_history; set up in "
            f"{time.perf_counter() - t0:.0f} s"
        )

    def make_wal(self, start_lsn: int, target: int) -> dict[str, Any]:
        """pgbench until ``target`` bytes of WAL were written after ``start_lsn``."""
        srv = self.srv
        argv = [str(self.bindir / "pgbench"), "-n", "-c", "4", "-j", "2"]
        env = pg_env(srv)
        t0 = time.perf_counter()
        done = 0
        seconds = 0.0
        transactions = 0
        while True:
            done = int(srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]) - start_lsn
            if done >= target:
                break
            rate = done / (time.perf_counter() - t0) if done > 0 else 0.0
            chunk = 2 if rate <= 0 else max(1, min(30, round((target - done) / rate)))
            out = run([*argv, "-T", str(chunk)], env=env)
            seconds += chunk
            got = re.search(r"number of transactions actually processed: (\d+)", out)
            transactions += int(got.group(1)) if got else 0
        wall = time.perf_counter() - t0
        return {
            "load_seconds": wall,
            "tps": transactions / seconds if seconds else 0.0,
            "wal_rate": done / wall if wall else 0.0,
        }

    def cleanup(self) -> None:
        """Stop everything and delete the scratch directory, every step tried."""
        for r in self.restored:
            with contextlib.suppress(Exception):
                r.cleanup()
        self.restored = []
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.cleanup()
            self.server = None
        if self.s3 is not None:
            with contextlib.suppress(Exception):
                self.s3.stop()
            self.s3 = None
        if self.scratch is not None:
            with contextlib.suppress(Exception):
                self.left_over += end_processes_under(f"{self.scratch}/")
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    # ----------------------------------------------------------------- configurations

    def pgsnap_config(self, tag: str, prefix: str, *, ahead: int, spool: Path | None) -> Path:
        """A pgsnap configuration with pgsnap's archive at ``s3://BUCKET/prefix``."""
        lines = [
            "[archive]",
            'format = "pgsnap"',
            f"path = {q(f's3://{BUCKET}/{prefix}')}",
            f"endpoint_url = {q(self.https)}",
            'region = "us-east-1"',
            f"credentials_file = {q(str(self.credentials))}",
            f"ca_bundle = {q(str(self.cert))}",
            f"ahead = {ahead}",
            f"parallel = {PARALLEL}",
        ]
        if spool is not None:
            lines.append(f"spool = {q(str(postgres_owned(spool)))}")
        path = postgres_owned(self.work / "conf") / f"pgsnap-{tag}.toml"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o644)
        return path

    def pgsnap_command(self, config: Path, what: str) -> str:
        """The command PostgreSQL runs: this checkout's pgsnap, by this Python."""
        code = self.code or REPO
        return (
            f"env PYTHONPATH={shlex.quote(str(code))} {shlex.quote(sys.executable)} -m pgsnap "
            f"-c {shlex.quote(str(config))} {what}"
        )

    def pgbackrest_config(
        self, tag: str, repo: str, *, asynchronous: bool, pg_path: Path | None = None
    ) -> Path:
        """A pgBackRest configuration with its repository at ``s3://BUCKET/repo``; its
        log, lock and spool directories of its own (fresh for each tag)."""
        if self.s3 is None:
            raise RuntimeError("no S3 server")
        base = self.work / "pgbackrest" / tag
        for sub in ("log", "lock", "spool"):
            postgres_owned(base / sub)
        postgres_owned(base)
        srv = self.server
        port = self.https.rpartition(":")[2]
        text = f"""[global]
repo1-type=s3
repo1-path=/{repo}
repo1-s3-endpoint=localhost
repo1-storage-port={port}
repo1-s3-bucket={BUCKET}
repo1-s3-region=us-east-1
repo1-s3-key={self.s3.admin.access_key}
repo1-s3-key-secret={self.s3.admin.secret_key}
repo1-s3-uri-style=path
repo1-storage-ca-file={self.cert}
compress-type=zst
compress-level={ZSTD_LEVEL}
log-level-console=warn
log-level-file=info
log-path={base / "log"}
lock-path={base / "lock"}
spool-path={base / "spool"}
"""
        if asynchronous:
            text += (
                f"archive-async=y\nprocess-max={PARALLEL}\n"
                f"archive-get-queue-max={AHEAD * SEGMENT}\n"
            )
        text += f"\n[{STANZA}]\npg1-path={pg_path or (srv.data_dir if srv else '')}\n"
        if srv is not None and pg_path is None:
            text += f"pg1-port={srv.port}\npg1-socket-path={srv.socket_dir}\npg1-user=postgres\n"
        path = base / "pgbackrest.conf"
        path.write_text(text)
        path.chmod(0o600)
        entry = pwd.getpwnam("postgres")
        os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    def pgbackrest(self, config: Path, *args: str) -> str:
        return run(
            as_postgres(["pgbackrest", f"--config={config}", f"--stanza={STANZA}", *args]),
            timeout=600,
        )

    def push_command(self, method: str, tag: str) -> tuple[str, str]:
        """(``archive_command``, where it archives) for ``method``, into a fresh place
        named ``tag``."""
        if method == "cp":
            where = postgres_owned(self.work / "dirs" / tag)
            a = shlex.quote(str(where))
            return f"test ! -f {a}/%f && cp %p {a}/%f", str(where)
        if method.startswith("pgsnap"):
            ahead = 0 if method == "pgsnap-ahead0" else AHEAD
            config = self.pgsnap_config(tag, tag, ahead=ahead, spool=self.work / "spool" / tag)
            return self.pgsnap_command(config, "wal-push %p"), tag
        config = self.pgbackrest_config(tag, tag, asynchronous=method == "pgbackrest-async")
        self.pgbackrest(config, "stanza-create")
        return (
            f"pgbackrest --config={shlex.quote(str(config))} --stanza={STANZA} archive-push %p",
            tag,
        )

    def archived(self, method: str, where: str) -> tuple[set[str], int]:
        """(the WAL file names, their bytes) in the archive ``where`` of ``method``."""
        names: set[str] = set()
        size = 0
        if method == "cp":
            for entry in os.scandir(where):
                m = WAL_NAME.match(entry.name)
                if m:
                    names.add(m.group(1))
                    size += entry.stat().st_size
            return names, size
        sub = "wal/" if method.startswith("pgsnap") else f"archive/{STANZA}/"
        for page in self.lister.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=f"{where}/{sub}"
        ):
            for item in page.get("Contents", ()):
                m = WAL_NAME.match(str(item["Key"]).rpartition("/")[2])
                if m:
                    names.add(m.group(1))
                    size += int(item["Size"])
        return names, size

    def set_archive_command(self, command: str) -> None:
        self.srv.configure({"archive_command": command})
        self.srv.reload()

    def ready(self) -> set[str]:
        status = self.srv.wal_dir / "archive_status"
        return {n[: -len(".ready")] for n in os.listdir(status) if n.endswith(".ready")}

    def archiver(self) -> tuple[int, int]:
        row = self.srv.sql("SELECT archived_count, failed_count FROM pg_stat_archiver")[0]
        return int(row[0]), int(row[1])

    def log_size(self, server: PgServer) -> int:
        try:
            return server.log_file.stat().st_size
        except OSError:
            return 0

    def log_messages(self, server: PgServer, offset: int) -> list[str]:
        """Lines the commands wrote to the server log after ``offset`` (pgsnap's,
        pgBackRest's, the archiver's and the startup process's complaints)."""
        with open(server.log_file, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        keep = ("pgsnap ", "ERROR", "WARN", "FATAL", "failed", "P00")
        return [
            line
            for line in text.splitlines()
            if any(k in line for k in keep)
            and "yet archiving is not configured" not in line
            and "LOG:  parameter " not in line
        ]

    # ----------------------------------------------------------------- push

    def push(self, method: str, run_no: int) -> None:
        say, srv = self.say, self.srv
        tag = f"push-{method}-r{run_no}"
        self.set_archive_command("")
        status = srv.wal_dir / "archive_status"
        for name in self.backlog:  # the same files again, for every method
            if not (srv.wal_dir / name).exists():
                raise RuntimeError(f"{name} left pg_wal: the backlog cannot be pushed again")
            done = status / f"{name}.done"
            if done.exists():
                done.rename(status / f"{name}.ready")
            elif not (status / f"{name}.ready").exists():
                raise RuntimeError(f"{name} has neither .ready nor .done in {status}")
        if self.ready() - set(self.backlog):
            raise RuntimeError(f"unexpected .ready files: {sorted(self.ready())}")
        command, where = self.push_command(method, tag)
        offset = self.log_size(srv)
        archived0, failed0 = self.archiver()
        cpu0, weed0 = machine_cpu(), self.weed_cpu()
        t0 = time.perf_counter()
        self.set_archive_command(command)
        pending = len(self.backlog)
        progress_at = time.monotonic()
        while pending:
            time.sleep(0.02)
            now = len(self.ready() & set(self.backlog))
            if now < pending:
                pending, progress_at = now, time.monotonic()
            elif time.monotonic() - progress_at > self.args.stall:
                raise RuntimeError(
                    f"{PUSH_LABEL[method]}: no file archived for {self.args.stall} s, "
                    f"{pending} left; pg_stat_archiver {self.archiver()}; server log:\n"
                    + "\n".join(self.log_messages(srv, offset)[-30:])
                )
        wall = time.perf_counter() - t0
        cpu, weed = machine_cpu() - cpu0, self.weed_cpu() - weed0
        self.set_archive_command("")
        archived1, failed1 = self.archiver()
        names, stored = self.archived(method, where)
        missing = sorted(set(self.backlog) - names)
        if not missing:  # replays read the first complete archive of each method
            self.archives.setdefault(method, where)
        segments = self.facts["segments"]
        messages = self.log_messages(srv, offset)
        row = {
            "run": run_no,
            "method": method,
            "wall": wall,
            "seg_s": segments / wall,
            "mb_s": segments * SEGMENT / MB / wall,
            "cpu": cpu,
            "weed": weed,
            "stored": stored,
            "missing": missing,
            "archived": archived1 - archived0,
            "failed": failed1 - failed0,
            "messages": messages,
        }
        self.push_rows.append(row)
        say(
            f"  run {run_no} push: {PUSH_LABEL[method]}: {len(self.backlog)} files in "
            f"{wall:.2f} s = {row['seg_s']:.1f} segments/s, {row['mb_s']:.0f} MB/s; machine "
            f"CPU {cpu:.1f} s (SeaweedFS {weed:.1f} s); stored {stored / MB:.0f} MB "
            f"({100 * stored / (segments * SEGMENT):.0f} %); archiver: "
            f"{row['archived']} archived, {row['failed']} failed"
            + (f"; MISSING from the archive: {', '.join(missing[:5])}" if missing else "")
            + (f"; {len(messages)} log line(s), first: {messages[0][:200]}" if messages else "")
        )

    def weed_cpu(self) -> float:
        return process_cpu(self.s3.process.pid) if self.s3 is not None else 0.0

    # ----------------------------------------------------------------- archiving under load

    def lag(self, method: str, run_no: int) -> None:
        srv = self.srv
        command, _where = self.push_command(method, f"lag-{method}-r{run_no}")
        self.set_archive_command(command)
        srv.sql("CHECKPOINT")  # each method starts after one: alike full-page writes
        srv.wait_for_archive_idle(timeout=self.args.stall)
        _archived0, failed0 = self.archiver()
        offset = self.log_size(srv)
        lsn0 = int(srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        seconds = self.args.lag_seconds
        samples: list[int] = []
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(
                [str(self.bindir / "pgbench"), "-n", "-c", "4", "-j", "2", "-T", str(seconds)],
                env=pg_env(srv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            try:
                while proc.poll() is None:
                    samples.append(len(self.ready()))
                    time.sleep(0.25)
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
            t_end = time.perf_counter()
            out.seek(0)
            text = out.read()
        if proc.returncode != 0:
            raise RuntimeError(f"pgbench failed:\n{text[-3000:]}")
        lsn1 = int(srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        left = len(self.ready())
        progress_at = time.monotonic()
        while left:
            time.sleep(0.05)
            now = len(self.ready())
            if now < left:
                left, progress_at = now, time.monotonic()
            elif time.monotonic() - progress_at > self.args.stall:
                raise RuntimeError(
                    f"{PUSH_LABEL[method]} under load: no file archived for "
                    f"{self.args.stall} s, {left} left"
                )
        catch_up = time.perf_counter() - t_end
        _archived1, failed1 = self.archiver()
        self.set_archive_command("")
        tps = re.search(r"tps = ([0-9.]+)", text)
        row = {
            "run": run_no,
            "method": method,
            "tps": float(tps.group(1)) if tps else None,
            "wal_mb_s": (lsn1 - lsn0) / MB / seconds,
            "max": max(samples, default=0),
            "mean": statistics.mean(samples) if samples else 0.0,
            "catch_up": catch_up,
            "failed": failed1 - failed0,
            "messages": self.log_messages(srv, offset),
        }
        self.lag_rows.append(row)
        self.say(
            f"  run {run_no} under load: {PUSH_LABEL[method]}: pgbench {row['tps'] or 0:.0f} tps, "
            f"{row['wal_mb_s']:.1f} MB/s of WAL; .ready max {row['max']}, mean "
            f"{row['mean']:.1f}; caught up {catch_up:.2f} s after pgbench ended; "
            f"{row['failed']} failed"
        )

    # ----------------------------------------------------------------- replay

    def restore_command(self, method: str, restored: PgServer, tag: str) -> str:
        source = next((m for m in FAMILY[method] if m in self.archives), None)
        if source is None:
            raise RuntimeError(f"no complete archive to replay {GET_LABEL[method]} from")
        where = self.archives[source]
        if method == "cp":
            return f"cp {shlex.quote(where)}/%f %p"
        if method.startswith("pgsnap"):
            ahead = 0 if method == "pgsnap-ahead0" else AHEAD
            config = self.pgsnap_config(tag, where, ahead=ahead, spool=None)
            # The command pgsnap writes into a recovery (a spooled segment taken by the
            # shell first), with this checkout's pgsnap.
            settings = archive_settings({"format": "pgsnap", "path": where, "ahead": ahead}, str)
            return wal_get_command(settings, pgsnap=self.pgsnap_command(config, "").rstrip())
        config = self.pgbackrest_config(
            tag, where, asynchronous=method == "pgbackrest-async", pg_path=restored.data_dir
        )
        return (
            f"pgbackrest --config={shlex.quote(str(config))} --stanza={STANZA} "
            f'--pg1-path={restored.data_dir} archive-get %f "%p"'
        )

    def replay(self, method: str, run_no: int) -> None:
        if self.base is None:
            raise RuntimeError("no base backup")
        restored = PgServer.prepare(
            self.bindir, archive=False, parent_dir=self.work, settings=SERVER_SETTINGS
        )
        self.restored.append(restored)
        try:
            restored.copy_data_from(self.base)  # pg_wal left empty: all from the archive
            restored.configure()
            restored.enable_recovery()
            command = self.restore_command(method, restored, f"replay-{method}-r{run_no}")
            restored.configure({"restore_command": command})
            self.drop_caches()
            t0 = time.perf_counter()
            restored.start(timeout=self.args.stall * 4)
            restored.wait_for_promotion(timeout=self.args.stall * 4)
            wall = time.perf_counter() - t0
            rows = restored.sql(
                "SELECT (SELECT count(*) FROM pgbench_history), "
                "(SELECT sum(abalance) FROM pgbench_accounts)"
            )[0]
            lines = log_lines(restored.log_file, 0)
            messages = self.log_messages(restored, 0)
        finally:
            with contextlib.suppress(Exception):
                restored.cleanup()
            self.restored.remove(restored)
            self.left_over += end_processes_under(f"{restored.base_dir}/")

        def first(prefix: str, last: bool = False) -> float | None:
            found = [t for t, sev, msg in lines if sev == "LOG" and msg.startswith(prefix)]
            return (found[-1] if last else found[0]) if found else None

        start, ready = first("starting PostgreSQL"), first(READY, last=True)
        redo0, redo1 = first("redo starts at"), first("redo done at")
        restored_files = sum(1 for _t, _s, m in lines if m.startswith("restored log file"))
        ok = int(rows[0]) == self.facts["history"] and int(rows[1]) == self.facts["abalance"]
        total = ready - start if start is not None and ready is not None else None
        redo = redo1 - redo0 if redo0 is not None and redo1 is not None else None
        row = {
            "run": run_no,
            "method": method,
            "total": total,
            "redo": redo,
            "wall": wall,
            "restored": restored_files,
            "ok": ok,
            "rows": int(rows[0]),
            "messages": [m for m in messages if "restored log file" not in m],
        }
        self.replay_rows.append(row)
        rate = f", {self.facts['wal_bytes'] / MB / redo:.0f} MB/s of WAL" if redo else ""
        self.say(
            f"  run {run_no} replay: {GET_LABEL[method]}: start to promoted "
            f"{total if total is not None else float('nan'):.2f} s (server log), redo "
            f"{redo if redo is not None else float('nan'):.2f} s{rate}, pg_ctl start to "
            f"promoted {wall:.2f} s; {restored_files} files restored; rows "
            f"{'as on the source' if ok else 'WRONG: ' + str(rows)}"
            + (f"; {len(row['messages'])} log line(s) of note" if row["messages"] else "")
        )

    def drop_caches(self) -> None:
        if self.args.cache == "cold":
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")

    # ----------------------------------------------------------------- single calls

    def calls(self) -> None:
        """One segment fetched (and pushed) by each command, by hand, ``--calls`` times."""
        if self.base is None:
            raise RuntimeError("no base backup")
        segment = next(n for n in self.backlog if len(n) == 24)
        work = postgres_owned(self.work / "calls")
        dest = work / "RECOVERYXLOG"
        entry = pwd.getpwnam("postgres")
        for top, dirs, files in os.walk(self.base):  # pgBackRest reads its pg_control
            for name in (*dirs, *files):
                os.lchown(os.path.join(top, name), entry.pw_uid, entry.pw_gid)
        os.lchown(self.base, entry.pw_uid, entry.pw_gid)
        code = str(self.code or REPO)
        commands: list[tuple[str, list[str], bool]] = [
            ("runuser -u postgres -- true (in every row)", ["true"], False),
            ("python -c pass (the interpreter's start-up)", [sys.executable, "-c", "pass"], False),
            (
                "python: import pgsnap.archives.commands (what wal-get and wal-push import)",
                [
                    "env",
                    f"PYTHONPATH={code}",
                    sys.executable,
                    "-c",
                    "import pgsnap.archives.commands",
                ],
                False,
            ),
        ]
        for family in ("cp", "pgsnap-ahead0", "pgbackrest"):  # a single call: no prefetch
            source = next((m for m in FAMILY[family] if m in self.archives), None)
            if source is None or not set(FAMILY[family]) & set(self.methods):
                continue
            where = self.archives[source]
            if family == "cp":
                commands.append(("cp from the directory", ["cp", f"{where}/{segment}"], True))
            elif family == "pgsnap-ahead0":
                config = self.pgsnap_config("calls-get", where, ahead=0, spool=None)
                argv = shlex.split(self.pgsnap_command(config, f"wal-get {segment}"))
                commands.append(("pgsnap wal-get (ahead 0)", argv, True))
                # the same from a copy without bytecode, as from a checkout PostgreSQL's user
                # cannot write (or PYTHONDONTWRITEBYTECODE): pgsnap compiled at every call
                plain = self.work / "code-source"
                if not plain.exists():
                    shutil.copytree(
                        REPO / "pgsnap",
                        plain / "pgsnap",
                        ignore=shutil.ignore_patterns("__pycache__"),
                    )
                raw = ["env", "PYTHONDONTWRITEBYTECODE=1", f"PYTHONPATH={plain}", *argv[2:]]
                commands.append(("pgsnap wal-get (ahead 0), source not compiled", raw, True))
            else:
                config = self.pgbackrest_config(
                    "calls-get", where, asynchronous=False, pg_path=self.base
                )
                argv = [
                    "pgbackrest",
                    f"--config={config}",
                    f"--stanza={STANZA}",
                    f"--pg1-path={self.base}",
                    "archive-get",
                    segment,
                ]
                commands.append(("pgBackRest archive-get", argv, True))
        fetched = False
        for label, argv, get in commands:
            times = []
            for _ in range(self.args.calls):
                with contextlib.suppress(FileNotFoundError):
                    dest.unlink()
                t0 = time.perf_counter()
                # in a directory of its own: python -m and -c put the current directory
                # first on sys.path, before PYTHONPATH (a checkout there would shadow it)
                run(as_postgres([*argv, str(dest)] if get else argv), timeout=120, cwd=work)
                times.append(time.perf_counter() - t0)
                if get and dest.stat().st_size != SEGMENT:
                    raise RuntimeError(f"{label}: {dest} is not a whole segment")
                fetched = fetched or get
            self.call_rows.append({"label": label, "times": times})
        if fetched and any(m.startswith("pgsnap") for m in self.methods):
            source_file = work / segment  # wal-push takes the name from the path
            shutil.copyfile(dest, source_file)
            os.chown(source_file, entry.pw_uid, entry.pw_gid)
            times = []
            for i in range(self.args.calls):
                tag = f"calls-push-{i}"  # a fresh prefix each time: a real write
                config = self.pgsnap_config(tag, tag, ahead=0, spool=None)
                argv = shlex.split(self.pgsnap_command(config, f"wal-push {source_file}"))
                t0 = time.perf_counter()
                run(as_postgres(argv), timeout=120, cwd=work)
                times.append(time.perf_counter() - t0)
            self.call_rows.append({"label": "pgsnap wal-push (ahead 0)", "times": times})
        for r in self.call_rows:
            self.say(f"  single call: {r['label']}: {spread(r['times'], 3)} s")

    # ----------------------------------------------------------------- everything

    def main(self) -> None:
        say, args = self.say, self.args
        t0 = time.perf_counter()
        self.setup()
        self.phases["setup"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for n in range(args.runs):
            order = rotated(self.methods, n)
            say(f"run {n + 1}: push, in the order {', '.join(order)}")
            for m in order:
                self.push(m, n + 1)
        self.phases["push"] = time.perf_counter() - t0
        if args.lag_seconds > 0:
            t0 = time.perf_counter()
            for n in range(args.runs):
                order = rotated(self.methods, n)
                say(f"run {n + 1}: archiving under load, in the order {', '.join(order)}")
                for m in order:
                    self.lag(m, n + 1)
            self.phases["lag"] = time.perf_counter() - t0
        self.srv.stop(mode="fast", timeout=300)
        say("source server stopped")
        t0 = time.perf_counter()
        for n in range(args.runs):
            order = rotated(self.methods, n)
            say(f"run {n + 1}: replay, in the order {', '.join(order)}")
            for m in order:
                self.replay(m, n + 1)
        self.phases["replay"] = time.perf_counter() - t0
        if args.calls > 0:
            t0 = time.perf_counter()
            say(f"single calls, {args.calls} each (as postgres, one segment)")
            self.calls()
            self.phases["calls"] = time.perf_counter() - t0

    def estimate(self, wal_mb: int, runs: int, lag_seconds: int, calls: int) -> float | None:
        """A rough run time for these settings, from this run's phases: loading and the
        push and replay phases linear in the WAL and the runs, the runs under load in
        their seconds, the single calls in their count."""
        ph, a = self.phases, self.args
        if not {"setup", "push", "replay"} <= ph.keys() or not self.facts.get("wal_rate"):
            return None
        load = float(self.facts["load_seconds"])
        setup = ph["setup"] - load + wal_mb * MB / float(self.facts["wal_rate"])
        done_mb, done_runs, done_lag = int(a.wal_mb), int(a.runs), int(a.lag_seconds)
        scale = wal_mb / done_mb * runs / done_runs
        lag = 0.0
        if "lag" in ph and done_lag:
            lag = ph["lag"] / done_runs * runs * (lag_seconds + 10) / (done_lag + 10)
        return (
            setup
            + ph["push"] * scale
            + ph["replay"] * scale
            + lag
            + ph.get("calls", 0.0) * calls / max(1, int(a.calls))
        )


# --------------------------------------------------------------------------- report


def report(say: Callable[[str], None], bench: Bench) -> None:
    facts, methods = bench.facts, bench.methods
    runs = bench.args.runs
    say("")
    say(
        f"== Results: median (min .. max) of {runs} run(s); {facts.get('segments', 0)} segments "
        f"of 16 MB ({facts.get('wal_bytes', 0) / MB:.0f} MB of WAL from pgbench at scale "
        f"{bench.args.scale}) =="
    )

    def of(rows: list[dict[str, Any]], method: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["method"] == method]

    if bench.push_rows:
        say("")
        say(
            "Push: the backlog archived by PostgreSQL's archiver through each "
            "archive_command (seconds from the reload to no .ready left):"
        )
        rows = []
        for m in methods:
            rs = of(bench.push_rows, m)
            if not rs:
                continue
            rows.append(
                [
                    PUSH_LABEL[m],
                    spread([r["wall"] for r in rs]),
                    spread([r["seg_s"] for r in rs], 1),
                    spread([r["mb_s"] for r in rs], 0),
                    spread([r["cpu"] for r in rs], 1),
                    spread([r["weed"] for r in rs], 1),
                    f"{(med([r['stored'] for r in rs]) or 0) / MB:.0f}",
                    str(sum(r["failed"] for r in rs)),
                    "all" if not any(r["missing"] for r in rs) else "MISSING",
                ]
            )
        say(
            table(
                rows,
                [
                    "archive_command",
                    "s",
                    "segments/s",
                    "MB/s",
                    "machine CPU s",
                    "of it SeaweedFS",
                    "stored MB",
                    "failed",
                    "in the archive",
                ],
            )
        )
    if bench.lag_rows:
        say("")
        say(
            f"Archiving under load: {bench.args.lag_seconds} s of pgbench -c 4 -j 2 after a "
            "CHECKPOINT, the .ready count sampled every 0.25 s:"
        )
        rows = []
        for m in methods:
            rs = of(bench.lag_rows, m)
            if not rs:
                continue
            rows.append(
                [
                    PUSH_LABEL[m],
                    spread([r["tps"] for r in rs], 0),
                    spread([r["wal_mb_s"] for r in rs], 1),
                    spread([r["max"] for r in rs], 0),
                    spread([r["mean"] for r in rs], 1),
                    spread([r["catch_up"] for r in rs]),
                    str(sum(r["failed"] for r in rs)),
                ]
            )
        say(
            table(
                rows,
                [
                    "archive_command",
                    "pgbench tps",
                    "WAL MB/s",
                    ".ready max",
                    ".ready mean",
                    "catch-up s",
                    "failed",
                ],
            )
        )
    verdicts: list[str] = []
    if bench.replay_rows:
        say("")
        say(
            "Replay of the backlog into a copy of the base backup (server log: 'starting "
            "PostgreSQL' to 'ready to accept connections' after the promotion; redo: 'redo "
            "starts' to 'redo done'):"
        )
        rows = []
        for m in methods:
            rs = of(bench.replay_rows, m)
            if not rs:
                continue
            redo = med([r["redo"] for r in rs])
            rows.append(
                [
                    GET_LABEL[m],
                    spread([r["total"] for r in rs]),
                    spread([r["redo"] for r in rs]),
                    f"{facts['wal_bytes'] / MB / redo:.0f}" if redo else "-",
                    spread([r["wall"] for r in rs]),
                    spread([r["restored"] for r in rs], 0),
                    spread(
                        [r["redo"] / r["restored"] for r in rs if r["redo"] and r["restored"]], 3
                    ),
                    "yes" if all(r["ok"] for r in rs) else "WRONG",
                ]
            )
        say(
            table(
                rows,
                [
                    "restore_command",
                    "start to promoted s",
                    "redo s",
                    "WAL MB/s",
                    "pg_ctl start to promoted s",
                    "files restored",
                    "redo s per file",
                    "rows as the source",
                ],
            )
        )

        def total(m: str) -> float | None:
            return med([r["total"] for r in of(bench.replay_rows, m)])

        def redo_of(m: str) -> float | None:
            return med([r["redo"] for r in of(bench.replay_rows, m)])

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:.2f}x" if a is not None and b else "-"

        pairs = [
            ("pgsnap wal-get (prefetch) / cp from a directory", "pgsnap", "cp"),
            ("pgsnap wal-get (prefetch) / pgBackRest async", "pgsnap", "pgbackrest-async"),
            ("pgsnap wal-get (prefetch) / pgBackRest sync", "pgsnap", "pgbackrest"),
            ("pgsnap wal-get (prefetch) / pgsnap wal-get (ahead 0)", "pgsnap", "pgsnap-ahead0"),
            ("pgBackRest async / cp from a directory", "pgbackrest-async", "cp"),
        ]
        ratio_rows = [
            [name, ratio(total(a), total(b)), ratio(redo_of(a), redo_of(b))]
            for name, a, b in pairs
            if a in methods and b in methods
        ]
        if ratio_rows:
            say("")
            say(table(ratio_rows, ["replay (medians)", "start to promoted", "redo"]))
        if "pgsnap" in methods and "cp" in methods:
            r = (total("pgsnap") or float("inf")) / (total("cp") or float("nan"))
            verdicts.append(
                f"replay with pgsnap wal-get and prefetch / from a local directory = {r:.2f}x "
                f"(target <= {TARGET_DIRECTORY}x): {met(r <= TARGET_DIRECTORY)}"
            )
        if "pgsnap" in methods and "pgbackrest-async" in methods:
            r = (total("pgsnap") or float("inf")) / (total("pgbackrest-async") or float("nan"))
            verdicts.append(
                f"replay with pgsnap wal-get and prefetch / pgBackRest async archive-get = "
                f"{r:.2f}x (target <= {TARGET_PGBACKREST}x): {met(r <= TARGET_PGBACKREST)}"
            )
    if bench.push_rows:

        def rate(m: str) -> float | None:
            return med([r["seg_s"] for r in of(bench.push_rows, m)])

        push_pairs = [
            ("pgsnap wal-push (ahead) / pgBackRest async", "pgsnap", "pgbackrest-async"),
            ("pgsnap wal-push (ahead) / pgBackRest sync", "pgsnap", "pgbackrest"),
            ("pgsnap wal-push (ahead) / pgsnap wal-push (ahead 0)", "pgsnap", "pgsnap-ahead0"),
            ("pgsnap wal-push (ahead) / cp", "pgsnap", "cp"),
        ]
        rows = []
        for name, a, b in push_pairs:
            x, y = rate(a), rate(b)
            if x is not None and y:
                rows.append([name, f"{x / y:.2f}x"])
        if rows:
            say("")
            say(table(rows, ["push throughput (segments/s, medians; above 1: pgsnap faster)", ""]))
    if bench.call_rows:
        say("")
        say("Single calls (as postgres, one segment; wall time of the process):")
        say(
            table(
                [[r["label"], spread(r["times"], 3)] for r in bench.call_rows],
                ["command", "s"],
            )
        )
    notes = [
        (phase, r["method"], r["run"], line)
        for phase, rows_ in (("push", bench.push_rows), ("under load", bench.lag_rows))
        for r in rows_
        for line in r["messages"]
    ] + [
        ("replay", r["method"], r["run"], line) for r in bench.replay_rows for line in r["messages"]
    ]
    if notes:
        say("")
        say(f"Server log lines of note ({len(notes)}; the first 12):")
        for phase, m, n, line in notes[:12]:
            say(f"  {phase} {m} run {n}: {line[:240]}")
    if verdicts:
        say("")
        say("== Targets ==")
        for v in verdicts:
            say(v)
    bad = [r for r in bench.replay_rows if not r["ok"]]
    if bench.replay_rows:
        say(
            "recovered servers: "
            + ("every one had the source's rows" if not bad else f"{len(bad)} WRONG")
        )


# --------------------------------------------------------------------------- main


def need_bytes(args: argparse.Namespace) -> int:
    """Free space ``--dir`` needs: the backlog in pg_wal (and up to max_wal_size more),
    the directory archives, the S3 server's objects (uncompressed, at worst), the WAL
    of the runs under load (at most 30 MB/s), a base backup and a restored copy."""
    wal, runs, methods = int(args.wal_mb) * MB, int(args.runs), len(args.methods)
    lag = 30 * MB * int(args.lag_seconds) * methods * runs
    return 2 * GB + wal * (2 + methods * runs) + lag + 2 * int(args.scale) * 16 * MB


def s3_volumes(args: argparse.Namespace) -> int:
    """SeaweedFS volumes (64 MB each) for every S3 method's objects, with room."""
    s3_methods = sum(1 for m in args.methods if m != "cp")
    wal = int(args.wal_mb) * MB * s3_methods * int(args.runs)
    lag = 30 * MB * int(args.lag_seconds) * s3_methods * int(args.runs)
    return 64 + 2 * (wal + lag) // (64 * MB)


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def machine(parent: Path, bindir: Path) -> str:
    changed = uncommitted("pgsnap")
    disk = sh(["df", "--output=source,fstype", str(parent)]).splitlines()[-1].split()
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GB:.0f} GB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"{sh([str(bindir / 'postgres'), '--version'])}, {sh(['pgbackrest', 'version'])}, "
        f"commit {git_commit()}{' + uncommitted changes' if uncommitted('.') else ''}"
        f" (in pgsnap/: {', '.join(changed) or 'none'}); --dir {parent} on {' '.join(disk)} "
        f"({shutil.disk_usage(parent).free / GB:.0f} GB free); load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--wal-mb", type=int, default=1024, help="MB of WAL pushed and replayed (default 1024)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of every method (default 3)")
    parser.add_argument("--scale", type=int, default=20, help="pgbench scale (default 20)")
    parser.add_argument(
        "--lag-seconds",
        type=int,
        default=30,
        help="seconds of pgbench while archiving, per method and run (default 30; 0: none)",
    )
    parser.add_argument(
        "--calls", type=int, default=5, help="single calls of each command (default 5; 0: none)"
    )
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, of {', '.join(METHODS)} (default all)",
    )
    parser.add_argument(
        "--cache",
        choices=("warm", "cold"),
        default="warm",
        help="warm (default): the archives as the page cache holds them; cold: the page "
        "cache dropped before every replay",
    )
    parser.add_argument(
        "--stall",
        type=int,
        default=600,
        help="seconds without progress before a method is reported failed (default 600)",
    )
    parser.add_argument("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="64 MB of WAL, scale 2, 1 run, 5 s under load, 2 single calls",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.wal_mb, args.scale, args.runs, args.lag_seconds, args.calls = 64, 2, 1, 5, 2
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    if not methods or set(methods) - set(METHODS) or len(set(methods)) != len(methods):
        parser.error(f"--methods: any of {', '.join(METHODS)}")
    if args.wal_mb < 32 or args.runs < 1 or args.scale < 1 or args.lag_seconds < 0:
        parser.error("--wal-mb >= 32, --runs >= 1, --scale >= 1, --lag-seconds >= 0")

    def say(msg: str) -> None:
        print(msg, flush=True)

    if os.geteuid() != 0:
        say("cannot run: needs root (the servers and pgBackRest run as the postgres OS user)")
        return 2
    why = seaweed_unavailable()
    if why is not None:
        say(f"cannot run: {why}")
        return 2
    if shutil.which("pgbackrest") is None:
        say("pgBackRest: not measured: no pgbackrest program (apt-get install pgbackrest)")
        methods = [m for m in methods if not m.startswith("pgbackrest")]
    args.methods = methods
    parent = Path(args.dir)
    parent.mkdir(parents=True, exist_ok=True)
    free, need = shutil.disk_usage(parent).free, need_bytes(args)
    if free < need:
        say(
            f"refusing to run: {free / GB:.1f} GB free on {parent}, this run needs about "
            f"{need / GB:.1f} GB; pass --dir on a larger file system, or less --wal-mb or --runs"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    for tool in ("pgbench", "pg_basebackup", "postgres"):
        if not (bindir / tool).is_file():
            say(f"{bindir / tool} not found: install the PostgreSQL server and client programs")
            return 2
    say(f"bench_wal_store: {machine(parent, bindir)}")
    words = sys.argv[1:] if argv is None else list(argv)
    say(f"command: python3 benchmarks/bench_wal_store.py {' '.join(words)}")
    say(
        f"methods: {', '.join(methods)}; {args.wal_mb} MB of WAL, {args.runs} run(s), "
        f"pgbench scale {args.scale}, {args.lag_seconds} s under load; page cache "
        + ("cold before every replay" if args.cache == "cold" else "warm")
        + f"; needs about {need / GB:.1f} GB on --dir"
    )
    signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.perf_counter()
    bench = Bench(args, bindir, say)
    interrupted = failed = False
    try:
        bench.main()
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
        interrupted = True
    except Exception:
        say(f"FAILED:\n{traceback.format_exc()}")
        failed = True
    finally:
        t1 = time.perf_counter()
        bench.cleanup()
        say(
            f"cleanup {time.perf_counter() - t1:.1f} s"
            + (
                f" (ended {len(bench.left_over)} process(es) our servers left running: "
                f"{'; '.join(bench.left_over)})"
                if bench.left_over
                else ""
            )
        )
    if bench.push_rows or bench.replay_rows:
        report(say, bench)
    total = time.perf_counter() - t_start
    say("")
    if bench.phases:
        say("phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in bench.phases.items()))
    guess = bench.estimate(1024, 3, 30, 5)
    if guess is not None and not (interrupted or failed):
        say(
            f"the defaults (1024 MB of WAL, 3 runs, 30 s under load, 5 calls), estimated "
            f"from this run's phases: about {guess / 60:.0f} min (rough: the setup's load "
            "from its WAL rate, push and replay linear in the WAL)"
        )
    say(
        f"total run time {total:.0f} s"
        + (" (interrupted)" if interrupted else "")
        + (" (FAILED)" if failed else "")
    )
    say(f"at the end: {machine(parent, bindir)}")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
