"""Benchmark: pgsnap's copies off the array vs pgBackRest and barman-cloud-backup, one S3 bucket.

Run (as root: loop devices, mount; PostgreSQL and pgBackRest run as the ``postgres`` OS user)::

    python benchmarks/bench_copy.py                    # pgbench scale 100 (1.5 GB), 3 rounds
    python benchmarks/bench_copy.py --smoke            # scale 1, 1 round: checks the script
    python benchmarks/bench_copy.py --scale 1000 --rounds 1 --dir /big
    python benchmarks/bench_copy.py --methods pgsnap,pgbackrest   # leave barman-cloud out
    python benchmarks/bench_copy.py --cache cold       # page cache dropped before every method

Target (issue 21): an incremental copy sends at most 1.2x the bytes that changed
(``bytes_sent`` of the incremental copy / the changed 8 KiB pages). Prints the
figures, the ratios pgsnap / pgBackRest and "met" / "NOT met"; never asserts.

What it does:

1. a SeaweedFS S3 server on local ports (:class:`~pgsnap.testing.seaweed.SeaweedS3`)
   serving HTTPS with a self-signed certificate for ``localhost`` (pgBackRest speaks
   only HTTPS to S3, and 2.45 matches a certificate's DNS names, not its IP
   addresses); every tool writes to the same bucket over that HTTPS port and
   verifies the certificate (pgBackRest ``repo1-storage-ca-file``, boto3
   ``ca_bundle`` / ``AWS_CA_BUNDLE``);
2. PostgreSQL 15 on a loop-mounted btrfs (:func:`~pgsnap.testing.btrfs.btrfs_server`:
   data directory and ``pg_wal`` on two subvolumes, 16 MB segments, **fsync on**,
   ``max_wal_size = 4GB``, autovacuum off so that nothing but the measured change
   writes between the methods), ``pgbench -i -q -s SCALE``; ``archive_command``
   copies each segment into pgsnap's archive directory *and* pushes it with
   ``pgbackrest archive-push`` (pgBackRest's backups need their WAL in its repository);
3. ``--rounds`` rounds, each into fresh prefixes of the bucket (so each round's first
   copy is a first copy), the order of the methods rotated from round to round; before
   every method a ``CHECKPOINT`` and a wait until the archiver is idle:

   - **full**: pgsnap ``Cluster.backup()`` (btrfs snapshots) then ``Cluster.copy()``
     to ``s3://bench/pgsnap-rN`` (4 MiB chunks, zstd level 3); pgBackRest
     ``backup --type=full`` (``compress-type=zst``, ``compress-level=3``: pgsnap's
     level, ``process-max=2``, ``start-fast=y``); ``barman-cloud-backup -z``
     (gzip: barman-cloud has no zstd; ``-J 2``, ``--immediate-checkpoint``);
   - **the change**: 1 % of ``pgbench_accounts`` rows updated (``TABLESAMPLE
     BERNOULLI (1) REPEATABLE``: random rows, as pgbench's own updates), the expected
     ``sum(abalance)`` read, a ``CHECKPOINT``, the archiver drained;
   - **incremental**: a new pgsnap backup and its copy to the same prefix (only new
     chunks are sent); pgBackRest ``backup --type=incr`` (file level: 2.45 has no
     block incremental). Barman-cloud has no incremental to S3 (3.x: block-level
     incremental backups need PostgreSQL 17 and a Barman server, not barman-cloud);
   - **changed bytes**: the two pgsnap data snapshots compared file by file at 8 KiB
     pages (the true change) and at chunk sizes from 8 KiB to 4 MiB (what a copy with
     that chunk size reads as changed, before compression); in round 1, one more
     first + incremental copy of the same two snapshots with ``--trial-chunk-size``
     through :func:`pgsnap.copies.copy_trees` directly, to see what a smaller chunk
     sends once compressed;
   - **restore** of the latest backup into an empty directory (ext4 under ``--dir``),
     started with ``recovery_target = 'immediate'`` and promoted, then
     ``sum(abalance)`` checked: pgsnap :func:`pgsnap.copies.restore_trees` from S3 +
     the manifest's ``backup_label`` + recovery settings (the WAL from pgsnap's archive
     directory), the steps of ``recovered_from_copy`` in
     tests/integration/test_copies_real.py; pgBackRest ``restore --type=immediate``
     (its WAL through ``archive-get`` from S3).

Per measurement: wall time; CPU time (user + system) of the method's own processes
(pgsnap's work runs in a forked child, pgBackRest and barman-cloud as child processes:
``os.wait4``'s rusage, which includes every process they waited for: pgBackRest's
``process-max`` workers, barman's upload jobs); CPU time of the PostgreSQL server's
processes meanwhile (``/proc``: the postmaster, its children and what they waited for,
``archive_command`` among them); bytes sent (the bucket listed with boto3 before and
after, per prefix; pgsnap's ``bytes_sent`` too); MB/s = the data directory's size /
wall time.

Everything is removed at the end (servers stopped, S3 server stopped, file system
unmounted, image and scratch directory deleted), also on failure, Ctrl-C or SIGTERM.
It refuses to start when ``--dir`` has less free space than the run needs.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import json
import os
import platform
import pwd
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
from bench_backup import pg_env, run_measured, tree_bytes

from pgsnap.copies import DEFAULT_CHUNK_SIZE, Manifest, copy_trees, restore_trees
from pgsnap.copies.s3 import S3CopyTarget
from pgsnap.model import VolumeRole
from pgsnap.testing.btrfs import LoopBtrfs, btrfs_cluster, btrfs_server, btrfs_unavailable
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable, self_signed_cert

TARGET_RATIO = 1.2
"""Incremental copy: bytes sent / bytes changed (8 KiB pages) at most this."""

GB = 1000**3
MB = 1000**2
MiB = 1 << 20
PAGE = 8192
BUCKET = "bench"
DIFF_CHUNKS = tuple(PAGE << k for k in range(10))  # 8 KiB .. 4 MiB
KEY_ENV, SECRET_ENV = "PGSNAP_BENCH_S3_KEY", "PGSNAP_BENCH_S3_SECRET"
ZSTD_LEVEL = 3
"""pgsnap's zstd level (pgsnap/copies/chunks.py ``_ZSTD_LEVEL``), given to pgBackRest too."""
METHODS = ("pgsnap", "pgbackrest", "barman")
LABEL = {"pgsnap": "pgsnap", "pgbackrest": "pgBackRest", "barman": "barman-cloud-backup"}


def need_bytes(scale: int) -> int:
    """Free space ``--dir`` needs: the btrfs image's content (database, pg_wal up to
    max_wal_size, the archive, what the snapshots keep), the S3 server's data (every
    method's copies and pgBackRest's WAL) and one restored data directory at a time."""
    return 6 * GB + scale * 55 * MB


def image_bytes(scale: int) -> int:
    return max(24 << 30, scale * 80 * MB)


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


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def spread(values: Sequence[float | None], digits: int = 1) -> str:
    """Median (min .. max) of the values, ``-`` when there is none."""
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


# --------------------------------------------------------------------------- processes


def in_child(
    fn: Callable[[], dict[str, Any]], profile: str | None = None
) -> tuple[dict[str, Any], float, float]:
    """Run ``fn`` in a forked child: (its result, wall seconds, CPU seconds of the child
    and of whatever it waited for). The result must be JSON. With ``profile`` (a
    directory), the child's main thread runs under :mod:`cProfile` and its statistics
    are written there (``child-<pid>.prof``): the figures then include the
    profiler's cost."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                if profile:
                    prof = cProfile.Profile()
                    prof.enable()
                result: dict[str, Any] = {"ok": fn()}
                if profile:
                    prof.disable()
                    prof.dump_stats(os.path.join(profile, f"child-{os.getpid()}.prof"))
            except BaseException:
                result, code = {"error": traceback.format_exc()}, 1
            try:
                with open(out.name, "w", encoding="utf-8") as fh:
                    json.dump(result, fh, default=str)
            finally:
                os._exit(code)
        _pid, _status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - t0
        data = json.loads(out.read() or "{}")
    if "ok" not in data:
        raise RuntimeError(f"the child process failed:\n{data.get('error', '(no result)')}")
    return data["ok"], wall, usage.ru_utime + usage.ru_stime


def run_tree(argv: Sequence[str], *, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Run ``argv``: (wall seconds, CPU seconds of it and of the processes it waited
    for, its output). Raises with the output on failure."""
    wall, cpu, text, _rss = run_rusage(argv, env=env)
    return wall, cpu, text


def run_rusage(
    argv: Sequence[str], *, env: dict[str, str] | None = None
) -> tuple[float, float, str, int]:
    """:func:`run_tree`, and the peak resident memory (bytes) of the process or of the
    largest process it waited for (``os.wait4``'s ``ru_maxrss``)."""
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{text[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, text, usage.ru_maxrss * 1024


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()  # fields from 3 (state) on


def server_cpu(server: PgServer) -> float:
    """CPU seconds of the server's processes so far: the postmaster and its children,
    each with what it waited for (exited backends are in the postmaster's, the
    ``archive_command`` runs in the archiver's)."""
    try:
        postmaster = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or (int(entry.name) != postmaster and int(fields[1]) != postmaster):
            continue
        total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / _TICK


# --------------------------------------------------------------------------- changed bytes


def _files(root: Path) -> dict[str, int]:
    """Relative path -> size of the regular files under ``root`` (links not followed)."""
    found: dict[str, int] = {}
    for top, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                found[os.path.relpath(path, root)] = st.st_size
    return found


def changed_bytes(old: Path, new: Path, chunk_sizes: Sequence[int] = DIFF_CHUNKS) -> dict[str, Any]:
    """Compare two trees: bytes of the 8 KiB pages of ``new`` that differ from ``old``
    (a page or file ``old`` lacks counts whole), and per chunk size the bytes of the
    chunks holding at least one changed page (what a fixed-size-chunk copy reads as new)."""
    old_files, new_files = _files(old), _files(new)
    pages_changed = 0
    page_bytes = 0
    chunk_bytes = dict.fromkeys(chunk_sizes, 0)
    files_changed = 0
    for rel, size in new_files.items():
        changed: list[int] = []
        old_size = old_files.get(rel)
        if old_size is None:
            changed = list(range((size + PAGE - 1) // PAGE))
        else:
            with open(old / rel, "rb") as fo, open(new / rel, "rb") as fn:
                offset = 0
                while True:
                    a, b = fo.read(4 * MiB), fn.read(4 * MiB)
                    if not b:
                        break
                    if a != b:
                        for p in range(0, len(b), PAGE):
                            if a[p : p + PAGE] != b[p : p + PAGE]:
                                changed.append((offset + p) // PAGE)
                    offset += len(b)
        if not changed:
            continue
        files_changed += 1
        pages_changed += len(changed)
        page_bytes += sum(min(PAGE, size - p * PAGE) for p in changed)
        for c in chunk_sizes:
            per = c // PAGE
            chunks = {p // per for p in changed}
            chunk_bytes[c] += sum(min(c, size - k * c) for k in chunks)
    return {
        "files": len(new_files),
        "files_changed": files_changed,
        "bytes": sum(new_files.values()),
        "pages_changed": pages_changed,
        "changed": page_bytes,
        "chunks": {str(c): b for c, b in chunk_bytes.items()},
    }


# --------------------------------------------------------------------------- the bench


class Bench:
    """The S3 server, the database on btrfs, the tools, and the measurements."""

    def __init__(self, args: argparse.Namespace, bindir: Path, say: Callable[[str], None]) -> None:
        self.args = args
        self.bindir = bindir
        self.say = say
        self.scratch: Path | None = None
        self.s3: SeaweedS3 | None = None
        self.fs: LoopBtrfs | None = None
        self.server: PgServer | None = None
        self.restored: list[PgServer] = []
        self.cert: Path | None = None
        self.facts: dict[str, Any] = {}
        self.methods: list[str] = list(args.methods)
        self.barman: str | None = args.barman
        self.pgbr_conf: Path | None = None
        self.rows: list[dict[str, Any]] = []
        self.diffs: list[dict[str, Any]] = []
        self.trials: list[dict[str, Any]] = []
        self.lister: Any = None

    # ----------------------------------------------------------------- setup, cleanup

    @property
    def srv(self) -> PgServer:
        assert self.server is not None
        return self.server

    @property
    def https(self) -> str:
        assert self.s3 is not None and self.s3.https_endpoint is not None
        return self.s3.https_endpoint

    def setup(self) -> None:
        args, say = self.args, self.say
        t0 = time.perf_counter()
        self.scratch = Path(tempfile.mkdtemp(prefix="pgsnap-bench-copy-", dir=args.dir))
        self.scratch.chmod(0o755)  # the postgres OS user reads the CA file and its config
        self.cert, key = self_signed_cert(self.scratch / "tls")
        # weed's default of 8 volumes of 64 MB holds 512 MB: too little for every method
        self.s3 = SeaweedS3.start(
            self.scratch / "s3", tls=(self.cert, key), max_volumes=max(64, 2 * args.scale)
        )
        self.s3.create_bucket(BUCKET)
        self.lister = self.s3.client()
        os.environ[KEY_ENV] = self.s3.admin.access_key
        os.environ[SECRET_ENV] = self.s3.admin.secret_key
        say(
            f"SeaweedFS S3: {sh(['weed', 'version']).splitlines()[0]}; HTTPS {self.https} "
            f"(self-signed certificate for localhost, verified by every client), plain HTTP "
            f"{self.s3.endpoint} (only this script's bucket listings); bucket {BUCKET}"
        )
        self.fs = LoopBtrfs.create(size=image_bytes(args.scale), parent=args.dir)
        self.server = server = btrfs_server(
            self.bindir,
            self.fs,
            wal_segsize_mb=16,
            archive=True,
            settings={
                "fsync": True,
                "max_wal_size": "4GB",
                "autovacuum": False,
                "log_checkpoints": True,
            },
        )
        server.start()
        if server.sql("SHOW fsync")[0][0] != "on":
            raise RuntimeError("the server runs with fsync off: not real figures")
        say(
            f"PostgreSQL {server.version_num} on btrfs ({self.fs.device}, "
            f"{image_bytes(args.scale) / GB:.0f} GB sparse image): data and pg_wal on two "
            "subvolumes, 16 MB segments, fsync=on, max_wal_size 4GB, autovacuum off"
        )
        server.configure({"archive_command": "true"})  # the load's WAL archived nowhere
        server.reload()
        took = run_measured(
            [str(self.bindir / "pgbench"), "-i", "-q", "-s", str(args.scale)], env=pg_env(server)
        )[0]
        if "pgbackrest" in self.methods:
            self.pgbackrest_config(1)
            self.stanza_create()
        server.configure({"archive_command": self.archive_command()})
        server.reload()
        server.sql("CHECKPOINT")
        server.switch_wal_and_wait_archived(timeout=900)
        server.wait_for_archive_idle(timeout=900)
        self.facts = {
            "init_seconds": took,
            "db_bytes": int(server.sql("SELECT pg_database_size('postgres')")[0][0]),
            "data_bytes": tree_bytes(server.data_dir),
            "rows": int(server.sql("SELECT count(*) FROM pgbench_accounts")[0][0]),
        }
        say(
            f"pgbench -i -q -s {args.scale}: {took:.1f} s; database "
            f"{self.facts['db_bytes'] / MB:.0f} MB, data directory "
            f"{self.facts['data_bytes'] / MB:.0f} MB, {self.facts['rows']} accounts; "
            f"archive_command: {self.archive_command()}; set up in "
            f"{time.perf_counter() - t0:.0f} s"
        )

    def archive_command(self) -> str:
        """pgsnap's archive (a copy into a directory); then pgBackRest's push."""
        a = self.srv.archive_dir
        cmd = f"(test -f {a}/%f || cp %p {a}/%f)"
        if "pgbackrest" in self.methods:
            cmd += f" && pgbackrest --config={self.pgbr_conf} --stanza=bench archive-push %p"
        return cmd

    def cleanup(self) -> None:
        """Stop everything, unmount, delete: every step tried, whatever failed."""
        for r in self.restored:
            with contextlib.suppress(Exception):
                r.cleanup()
        self.restored = []
        if self.server is not None:
            with contextlib.suppress(Exception):
                if self.server.is_running():
                    self.server.stop(mode="immediate", timeout=60)
            self.server._cleaned = True  # its directories live on the btrfs
            self.server = None
        if self.fs is not None:
            self.fs.close()
            self.fs = None
        if self.s3 is not None:
            with contextlib.suppress(Exception):
                self.s3.stop()
            self.s3 = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    # ----------------------------------------------------------------- pgBackRest set-up

    def pgbackrest_config(self, round_no: int) -> None:
        assert self.scratch is not None and self.s3 is not None and self.cert is not None
        base = self.scratch / "pgbackrest"
        for sub in ("log", "lock", "spool"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        port = self.https.rpartition(":")[2]
        text = f"""[global]
repo1-type=s3
repo1-path=/pgbackrest-r{round_no}
repo1-s3-endpoint=localhost
repo1-storage-port={port}
repo1-s3-bucket={BUCKET}
repo1-s3-region=us-east-1
repo1-s3-key={self.s3.admin.access_key}
repo1-s3-key-secret={self.s3.admin.secret_key}
repo1-s3-uri-style=path
repo1-storage-ca-file={self.cert}
repo1-retention-full=100
compress-type=zst
compress-level={ZSTD_LEVEL}
process-max=2
start-fast=y
log-level-console=warn
log-level-file=info
log-path={base / "log"}
lock-path={base / "lock"}
spool-path={base / "spool"}

[bench]
pg1-path={self.srv.data_dir}
pg1-port={self.srv.port}
pg1-socket-path={self.srv.socket_dir}
pg1-user=postgres
"""
        self.pgbr_conf = base / "pgbackrest.conf"
        self.pgbr_conf.write_text(text)
        self.pgbr_conf.chmod(0o600)
        entry = pwd.getpwnam(self.srv.os_user)
        for path in (base, *(base / s for s in ("log", "lock", "spool")), self.pgbr_conf):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def pgbackrest(self, *args: str) -> tuple[float, float, str]:
        """``pgbackrest --config ... --stanza=bench ARGS`` as the server's OS user."""
        return run_tree(
            [
                "runuser",
                "-u",
                self.srv.os_user,
                "--",
                "pgbackrest",
                f"--config={self.pgbr_conf}",
                "--stanza=bench",
                *args,
            ]
        )

    def stanza_create(self) -> None:
        self.pgbackrest("stanza-create")

    # ----------------------------------------------------------------- helpers

    def usage(self, prefix: str) -> tuple[int, int]:
        """(objects, bytes) under ``prefix`` in the bucket."""
        n = size = 0
        for page in self.lister.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=prefix
        ):
            for item in page.get("Contents", ()):
                n += 1
                size += int(item["Size"])
        return n, size

    def options(self) -> dict[str, str]:
        assert self.cert is not None
        return {
            "endpoint_url": self.https,
            "region": "us-east-1",
            "access_key_env": KEY_ENV,
            "secret_key_env": SECRET_ENV,
            "ca_bundle": str(self.cert),
        }

    def prepare(self) -> None:
        """Before every method alike: a CHECKPOINT, the archiver idle (and with
        ``--cache cold`` the page cache dropped)."""
        self.srv.sql("CHECKPOINT")
        self.srv.wait_for_archive_idle(timeout=1800)
        self.drop_caches()

    def drop_caches(self) -> None:
        """With ``--cache cold``: ``sync``, then the kernel's page cache dropped, so
        that the next method reads its source (data directory, snapshot, bucket) from
        the disk, as a backup of a database larger than memory does."""
        if self.args.cache == "cold":
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")

    def record(self, **row: Any) -> dict[str, Any]:
        self.rows.append(row)
        data = self.facts["data_bytes"]
        rate = f", {data / MB / row['wall']:.0f} MB/s" if row.get("wall") else ""
        sent = f", sent {row['sent'] / MB:.1f} MB" if row.get("sent") is not None else ""
        extra = f"; {row['note']}" if row.get("note") else ""
        self.say(
            f"  round {row['round']} {row['phase']}: {LABEL[row['method']]} {row['step']}: "
            f"{row['wall']:.2f} s, CPU {row['cpu']:.2f} s"
            + (f", PostgreSQL CPU {row['pg_cpu']:.2f} s" if row["phase"] != "restore" else "")
            + f"{sent}{rate}{extra}"
        )
        return row

    # ----------------------------------------------------------------- pgsnap

    def cluster(self, round_no: int) -> Any:
        assert self.fs is not None
        return btrfs_cluster(
            self.srv,
            self.fs,
            copy_target=f"s3://{BUCKET}/pgsnap-r{round_no}",
            copy_target_options=self.options(),
        )

    def pgsnap(self, round_no: int, phase: str) -> None:
        label = f"bench-r{round_no}-{phase}"

        def backup() -> dict[str, Any]:
            record = self.cluster(round_no).backup(label)
            return {"id": record.id, "mode": record.backup_mode_seconds}

        cpu0 = server_cpu(self.srv)
        made, wall, cpu = in_child(backup, self.args.profile)
        pg_cpu = server_cpu(self.srv) - cpu0
        self.record(
            round=round_no,
            phase=phase,
            method="pgsnap",
            step="backup",
            wall=wall,
            cpu=cpu,
            pg_cpu=pg_cpu,
            sent=None,
            note=f"backup {made['id']}, {made['mode'] or 0:.2f} s in backup mode",
        )

        def copy() -> dict[str, Any]:
            c = self.cluster(round_no).copy(made["id"])
            return {
                k: getattr(c, k)
                for k in ("copy_id", "bytes_read", "bytes_sent", "chunks_new", "chunks_reused")
            }

        before = self.usage(f"pgsnap-r{round_no}/")
        self.drop_caches()
        cpu0 = server_cpu(self.srv)
        got, wall, cpu = in_child(copy, self.args.profile)
        pg_cpu = server_cpu(self.srv) - cpu0
        after = self.usage(f"pgsnap-r{round_no}/")
        self.record(
            round=round_no,
            phase=phase,
            method="pgsnap",
            step="copy",
            wall=wall,
            cpu=cpu,
            pg_cpu=pg_cpu,
            sent=after[1] - before[1],
            bytes_sent=got["bytes_sent"],
            bytes_read=got["bytes_read"],
            chunks_new=got["chunks_new"],
            chunks_reused=got["chunks_reused"],
            objects=after[0] - before[0],
            backup_id=made["id"],
            copy_id=got["copy_id"],
            note=(
                f"copy {got['copy_id']}: read {got['bytes_read'] / MB:.0f} MB, bytes_sent "
                f"{got['bytes_sent'] / MB:.1f} MB, {got['chunks_new']} chunks new, "
                f"{got['chunks_reused']} reused; {after[0] - before[0]} objects"
            ),
        )

    def snapshot_path(self, backup_id: str) -> Path:
        cluster = self.cluster(0)
        record = cluster.catalog.get(backup_id)
        access = cluster.observer.snapshot_access(record)
        (data,) = [v for v in record.layout.volumes if v.role is VolumeRole.DATA]
        return Path(access[data.id].path)

    def cli_config(self, round_no: int) -> Path:
        """A configuration file for the ``pgsnap`` command: the cluster :meth:`cluster`
        builds (btrfs, the same catalog and archive), copies to a prefix of its own."""
        assert self.fs is not None
        srv = self.srv
        q = json.dumps  # a JSON string is a TOML basic string
        data, wal = str(srv.data_dir), str(srv.wal_dir)
        copies = {"path": f"s3://{BUCKET}/pgsnap-cli-r{round_no}", **self.options()}
        text = "\n".join(
            [
                "[database]",
                f"conninfo = {q(srv.conninfo())}",
                f"data_directory = {q(data)}",
                f"bindir = {q(str(srv.bindir))}",
                f"os_user = {q(srv.os_user)}",
                f"log_file = {q(str(srv.log_file))}",
                "[storage]",
                'backend = "btrfs"',
                "[storage.options]",
                f"snapshot_dir = {q(str(self.fs.mount_point / 'snapshots'))}",
                "[archive]",
                f"path = {q(str(srv.archive_dir))}",
                "[catalog]",
                f"path = {q(str(srv.base_dir / 'catalog'))}",
                f"journal = {q(str(srv.base_dir / 'journal'))}",
                "[copies]",
                *(f"{k} = {q(v)}" for k, v in copies.items()),
                "[[volume]]",
                f"id = {q(data)}",
                'name = "pgdata"',
                'role = "data"',
                f"mount_point = {q(data)}",
                "[[volume]]",
                f"id = {q(wal)}",
                'name = "pgwal"',
                'role = "wal"',
                f"mount_point = {q(wal)}",
                "",
            ]
        )
        path = srv.base_dir / f"pgsnap-cli-r{round_no}.toml"
        path.write_text(text)
        return path

    def pgsnap_cli(self, round_no: int, backup_id: str) -> None:
        """The full backup copied again, to a fresh prefix (a first copy), by a new
        ``pgsnap copy`` process: start-up and imports included, and its peak memory."""
        config = self.cli_config(round_no)
        prefix = f"pgsnap-cli-r{round_no}/"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        before = self.usage(prefix)
        argv = [sys.executable, "-m", "pgsnap.cli", "copy", backup_id, "-c", str(config)]
        wall, cpu, _text, rss = run_rusage(argv, env=env)
        after = self.usage(prefix)
        self.record(
            round=round_no,
            phase="cli",
            method="pgsnap",
            step="copy",
            wall=wall,
            cpu=cpu,
            pg_cpu=0.0,
            sent=after[1] - before[1],
            rss=rss,
            note=f"`pgsnap copy` as a new process, peak RSS {rss / MB:.0f} MB",
        )

    # ----------------------------------------------------------------- pgBackRest, barman

    def pgbackrest_backup(self, round_no: int, phase: str) -> None:
        kind = "full" if phase == "full" else "incr"
        backup_before = self.usage(f"pgbackrest-r{round_no}/backup/")
        wal_before = self.usage(f"pgbackrest-r{round_no}/archive/")
        cpu0 = server_cpu(self.srv)
        wall, cpu, _out = self.pgbackrest(f"--type={kind}", "backup")
        pg_cpu = server_cpu(self.srv) - cpu0
        backup_after = self.usage(f"pgbackrest-r{round_no}/backup/")
        wal_after = self.usage(f"pgbackrest-r{round_no}/archive/")
        self.record(
            round=round_no,
            phase=phase,
            method="pgbackrest",
            step=f"backup --type={kind}",
            wall=wall,
            cpu=cpu,
            pg_cpu=pg_cpu,
            sent=backup_after[1] - backup_before[1],
            objects=backup_after[0] - backup_before[0],
            wal_sent=wal_after[1] - wal_before[1],
            note=(
                f"{backup_after[0] - backup_before[0]} objects in backup/; WAL pushed meanwhile "
                f"(archive/, by archive_command: PostgreSQL CPU) "
                f"{(wal_after[1] - wal_before[1]) / MB:.1f} MB"
            ),
        )

    def barman_backup(self, round_no: int) -> None:
        assert self.barman is not None and self.cert is not None and self.s3 is not None
        prefix = f"barman-r{round_no}"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.s3.admin.access_key,
            "AWS_SECRET_ACCESS_KEY": self.s3.admin.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_CA_BUNDLE": str(self.cert),
        }
        argv = [
            self.barman,
            "--cloud-provider",
            "aws-s3",
            "--endpoint-url",
            self.https,
            "-z",
            "-J",
            "2",
            "--immediate-checkpoint",
            "-h",
            str(self.srv.socket_dir),
            "-p",
            str(self.srv.port),
            "-U",
            "postgres",
            f"s3://{BUCKET}/{prefix}",
            "pg",
        ]
        before = self.usage(f"{prefix}/")
        cpu0 = server_cpu(self.srv)
        wall, cpu, _out = run_tree(argv, env=env)
        pg_cpu = server_cpu(self.srv) - cpu0
        after = self.usage(f"{prefix}/")
        self.record(
            round=round_no,
            phase="full",
            method="barman",
            step="backup -z",
            wall=wall,
            cpu=cpu,
            pg_cpu=pg_cpu,
            sent=after[1] - before[1],
            objects=after[0] - before[0],
            note=f"{after[0] - before[0]} objects",
        )

    # ----------------------------------------------------------------- the change

    def change(self, round_no: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        lsn0 = self.srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]
        with self.srv.connect() as conn:
            cur = conn.execute(
                "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid IN "
                "(SELECT aid FROM pgbench_accounts TABLESAMPLE BERNOULLI (1) REPEATABLE (%s))",
                [round_no],
            )
            updated = cur.rowcount
            # Read it all once now (hint bits set), so that the checkpoint writes them
            # and nothing changes between the two methods' incremental backups.
            row = conn.execute("SELECT sum(abalance) FROM pgbench_accounts").fetchone()
            assert row is not None
            expected = int(row[0])
        lsn1 = self.srv.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0]
        self.srv.sql("CHECKPOINT")
        self.srv.wait_for_archive_idle(timeout=3600)
        out = {
            "updated": updated,
            "expected": expected,
            "wal": int(lsn1 - lsn0),
            "seconds": time.perf_counter() - t0,
        }
        self.say(
            f"  round {round_no}: the change: {updated} rows of {self.facts['rows']} updated "
            f"({100 * updated / self.facts['rows']:.2f} %), {out['wal'] / MB:.0f} MB of WAL, "
            f"CHECKPOINT and archive drained in {out['seconds']:.1f} s; sum(abalance) {expected}"
        )
        return out

    # ----------------------------------------------------------------- chunk-size trial

    def trial(self, round_no: int, full_id: str, incr_id: str, chunk: int) -> dict[str, Any]:
        """A first and an incremental copy of the same two snapshots, ``chunk`` bytes a
        chunk, through copy_trees directly, to a prefix of their own."""
        old, new = self.snapshot_path(full_id), self.snapshot_path(incr_id)
        prefix = f"chunks-{chunk // 1024}k-r{round_no}"
        options = self.options()

        def send(copy_id: str, tree: Path) -> Callable[[], dict[str, Any]]:
            def go() -> dict[str, Any]:
                target = S3CopyTarget(
                    BUCKET,
                    prefix,
                    endpoint_url=options["endpoint_url"],
                    access_key_env=KEY_ENV,
                    secret_key_env=SECRET_ENV,
                    ca_bundle=options["ca_bundle"],
                )
                _m, stats = copy_trees(
                    {"pgdata": tree}, target, copy_id=copy_id, backup_id=copy_id, chunk_size=chunk
                )
                return {
                    "bytes_sent": stats.bytes_sent,
                    "chunks_new": stats.chunks_new,
                    "chunks_reused": stats.chunks_reused,
                }

            return go

        first, w1, c1 = in_child(send("first", old))
        second, w2, c2 = in_child(send("incremental", new))
        out = {
            "chunk": chunk,
            "first": {**first, "wall": w1, "cpu": c1},
            "incremental": {**second, "wall": w2, "cpu": c2},
        }
        self.say(
            f"  round {round_no}: chunk size {chunk // 1024} KiB through copy_trees: first copy "
            f"{w1:.1f} s, CPU {c1:.1f} s, sent {first['bytes_sent'] / MB:.1f} MB "
            f"({first['chunks_new']} chunks); incremental {w2:.1f} s, CPU {c2:.1f} s, sent "
            f"{second['bytes_sent'] / MB:.1f} MB ({second['chunks_new']} chunks new, "
            f"{second['chunks_reused']} reused)"
        )
        return out

    # ----------------------------------------------------------------- restores

    def new_restored(self) -> PgServer:
        assert self.scratch is not None
        restored = PgServer.prepare(
            self.bindir,
            archive=False,
            parent_dir=self.scratch,
            settings={"fsync": True, "max_wal_size": "4GB", "autovacuum": False},
        )
        self.restored.append(restored)
        return restored

    def finish_restore(
        self, restored: PgServer, t0: float, expected: int
    ) -> tuple[float, float, bool]:
        """Start the restored server; (seconds to accepting connections, to promoted,
        sum(abalance) as expected), the times from ``t0``."""
        restored.start(timeout=1800)
        ready = time.perf_counter() - t0
        restored.wait_for_promotion(timeout=1800)
        promoted = time.perf_counter() - t0
        got = int(restored.sql("SELECT sum(abalance) FROM pgbench_accounts")[0][0])
        return ready, promoted, got == expected

    def drop_restored(self, restored: PgServer) -> None:
        restored.cleanup()
        self.restored.remove(restored)

    def pgsnap_restore(self, round_no: int, copy_id: str, expected: int) -> None:
        restored = self.new_restored()
        options = self.options()
        t0 = time.perf_counter()

        def restore() -> dict[str, Any]:
            target = S3CopyTarget(
                BUCKET,
                f"pgsnap-r{round_no}",
                endpoint_url=options["endpoint_url"],
                access_key_env=KEY_ENV,
                secret_key_env=SECRET_ENV,
                ca_bundle=options["ca_bundle"],
            )
            manifest = Manifest.from_json(target.get_manifest(copy_id))
            written = restore_trees(manifest, target, {"pgdata": restored.data_dir})
            return {"written": written, "label": manifest.files["backup_label"]}

        got, files_wall, cpu = in_child(restore, self.args.profile)
        # What pgsnap's restore from a copy does to the restored directory (as
        # recovered_from_copy in tests/integration/test_copies_real.py).
        (restored.data_dir / "postmaster.pid").unlink(missing_ok=True)
        wal_link = restored.data_dir / "pg_wal"
        if wal_link.is_symlink():
            wal_link.unlink()
            wal_link.symlink_to(restored.wal_dir)
        restored.write_backup_label(got["label"])
        restored.enable_recovery(
            restore_from=self.srv.archive_dir,
            recovery_target="immediate",
            recovery_target_action="promote",
        )
        ready, promoted, ok = self.finish_restore(restored, t0, expected)
        self.drop_restored(restored)
        self.record(
            round=round_no,
            phase="restore",
            method="pgsnap",
            step="restore_trees + start",
            wall=promoted,
            cpu=cpu,
            pg_cpu=0.0,
            sent=None,
            files_wall=files_wall,
            ready=ready,
            ok=ok,
            note=(
                f"files {files_wall:.1f} s ({got['written'] / MB:.0f} MB written), accepting "
                f"connections at {ready:.1f} s, promoted at {promoted:.1f} s; "
                f"sum(abalance) {'as expected' if ok else 'WRONG'}"
            ),
        )

    def pgbackrest_restore(self, round_no: int, expected: int) -> None:
        restored = self.new_restored()
        t0 = time.perf_counter()
        restore_command = (  # archive-get checks that --pg1-path is the server's directory
            f"pgbackrest --config={self.pgbr_conf} --stanza=bench "
            f'--pg1-path={restored.data_dir} archive-get %f "%p"'
        )
        files_wall, cpu, _out = self.pgbackrest(
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
        restored.configure()  # this server's port and socket (its pgsnap.conf came along)
        ready, promoted, ok = self.finish_restore(restored, t0, expected)
        self.drop_restored(restored)
        self.record(
            round=round_no,
            phase="restore",
            method="pgbackrest",
            step="restore + start",
            wall=promoted,
            cpu=cpu,
            pg_cpu=0.0,
            sent=None,
            files_wall=files_wall,
            ready=ready,
            ok=ok,
            note=(
                f"files {files_wall:.1f} s, accepting connections at {ready:.1f} s, promoted "
                f"at {promoted:.1f} s ({link_note}); sum(abalance) "
                f"{'as expected' if ok else 'WRONG'}"
            ),
        )

    # ----------------------------------------------------------------- one round

    def round(self, n: int) -> None:
        say = self.say
        t0 = time.perf_counter()
        if "pgbackrest" in self.methods and n > 1:
            self.srv.wait_for_archive_idle(timeout=1800)
            self.pgbackrest_config(n)  # a fresh repository path: a fresh full backup
            self.stanza_create()
            self.srv.switch_wal_and_wait_archived(timeout=900)
        full = [m for m in METHODS if m in self.methods]
        say(f"round {n}: full, in the order {', '.join(LABEL[m] for m in rotated(full, n - 1))}")
        ids: dict[str, str] = {}
        for m in rotated(full, n - 1):
            self.prepare()
            if m == "pgsnap":
                self.pgsnap(n, "full")
                ids["full"] = self.rows[-1]["backup_id"]
            elif m == "pgbackrest":
                self.pgbackrest_backup(n, "full")
            else:
                self.barman_backup(n)
        if "pgsnap" in self.methods:
            self.prepare()
            self.pgsnap_cli(n, ids["full"])
        change = self.change(n)
        incr = [m for m in ("pgsnap", "pgbackrest") if m in self.methods]
        say(
            f"round {n}: incremental, in the order "
            f"{', '.join(LABEL[m] for m in rotated(incr, n - 1))}"
        )
        copy_id = ""
        for m in rotated(incr, n - 1):
            self.prepare()
            if m == "pgsnap":
                self.pgsnap(n, "incremental")
                ids["incremental"] = self.rows[-1]["backup_id"]
                copy_id = self.rows[-1]["copy_id"]
            else:
                self.pgbackrest_backup(n, "incremental")
        if "pgsnap" in self.methods:
            t1 = time.perf_counter()
            diff = changed_bytes(
                self.snapshot_path(ids["full"]), self.snapshot_path(ids["incremental"])
            )
            diff.update(round=n, change=change)
            self.diffs.append(diff)
            say(
                f"  round {n}: changed between the two pgsnap snapshots: {diff['files_changed']} "
                f"of {diff['files']} files, {diff['pages_changed']} pages of 8 KiB = "
                f"{diff['changed'] / MB:.1f} MB of {diff['bytes'] / MB:.0f} MB; in 4 MiB "
                f"chunks {diff['chunks'][str(4 * MiB)] / MB:.1f} MB (compared in "
                f"{time.perf_counter() - t1:.1f} s)"
            )
            if n == 1 and self.args.trial_chunk_size:
                self.trials.append(
                    self.trial(n, ids["full"], ids["incremental"], self.args.trial_chunk_size)
                )
        say(f"round {n}: restore, in the order {', '.join(rotated(incr, n - 1))}")
        for m in rotated(incr, n - 1):
            self.drop_caches()
            if m == "pgsnap":
                self.pgsnap_restore(n, copy_id, change["expected"])
            else:
                self.pgbackrest_restore(n, change["expected"])
        say(f"round {n}: {time.perf_counter() - t0:.0f} s")


# --------------------------------------------------------------------------- report


def report(say: Callable[[str], None], bench: Bench) -> None:
    rows, facts = bench.rows, bench.facts
    data = facts["data_bytes"]

    def pick(method: str, phase: str, step: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in rows
            if r["method"] == method and r["phase"] == phase and (step is None or r["step"] == step)
        ]

    def summed(method: str, phase: str) -> list[dict[str, Any]]:
        """pgsnap's backup and copy of each round added up (one row per round)."""
        out = []
        for rnd in sorted({r["round"] for r in pick(method, phase)}):
            parts = [r for r in pick(method, phase) if r["round"] == rnd]
            out.append(
                {
                    "wall": sum(p["wall"] for p in parts),
                    "cpu": sum(p["cpu"] for p in parts),
                    "pg_cpu": sum(p["pg_cpu"] for p in parts),
                    "sent": sum(p["sent"] or 0 for p in parts),
                }
            )
        return out

    lines: list[tuple[str, str, list[dict[str, Any]], str]] = [
        ("pgsnap", "`Cluster.backup()` (btrfs snapshots)", pick("pgsnap", "full", "backup"), "yes"),
        ("pgsnap", "first `Cluster.copy()`", pick("pgsnap", "full", "copy"), "no (1)"),
        ("pgsnap", "backup + first copy", summed("pgsnap", "full"), "-"),
        ("pgsnap", "first copy, `pgsnap copy` process", pick("pgsnap", "cli"), "no (1)"),
        ("pgBackRest", "full backup", pick("pgbackrest", "full"), "yes (2)"),
        ("barman-cloud-backup", "full backup, gzip", pick("barman", "full"), "yes"),
        ("pgsnap", "`Cluster.backup()`", pick("pgsnap", "incremental", "backup"), "yes"),
        ("pgsnap", "incremental `Cluster.copy()`", pick("pgsnap", "incremental", "copy"), "no (1)"),
        ("pgsnap", "backup + incremental copy", summed("pgsnap", "incremental"), "-"),
        ("pgBackRest", "incremental backup", pick("pgbackrest", "incremental"), "yes (2)"),
        ("pgsnap", "restore: `restore_trees` + start", pick("pgsnap", "restore"), "restore host"),
        ("pgBackRest", "restore + start", pick("pgbackrest", "restore"), "restore host"),
    ]
    table_rows = []
    for method, step, rs, db_host in lines:
        if not rs:
            continue
        sent = [r["sent"] / MB if r.get("sent") is not None else None for r in rs]
        table_rows.append(
            [
                method,
                step,
                spread([r["wall"] for r in rs], 2),
                spread([r["cpu"] for r in rs], 2),
                spread([r["pg_cpu"] for r in rs], 2) if "restore" not in step else "-",
                spread(sent, 1),
                fmt(data / MB / (med([r["wall"] for r in rs]) or 1), 0),
                db_host,
            ]
        )
    say("")
    say(
        f"== Results: median (min .. max) of {len({r['round'] for r in rows})} round(s); "
        f"pgbench scale {bench.args.scale}, data directory {data / MB:.0f} MB =="
    )
    say("")
    say(
        table(
            table_rows,
            [
                "method",
                "step",
                "wall s",
                "CPU s (its processes)",
                "PostgreSQL CPU s",
                "sent MB",
                "MB/s",
                "on the database host",
            ],
        )
    )
    say("")
    say(
        "CPU: user + system of the method's own processes (os.wait4); PostgreSQL CPU: the "
        "server's processes meanwhile, archive_command (cp + pgbackrest archive-push) included; "
        "sent: the bucket's bytes under the method's prefix after minus before "
        "(pgBackRest: backup/ only; its WAL is in archive/); MB/s: data directory / wall."
    )
    say(
        "(1) a copy reads a snapshot, never the database: with storage whose snapshots can be "
        "mapped to another host (an array) it runs on a backup host and costs the database "
        "host nothing; on btrfs, as here, the snapshot is on the database host's file system "
        "and so is the copy. (2) pgBackRest reads the data directory: its backup (or its "
        "remote workers, with a repository host) runs on the database host; so does "
        "barman-cloud-backup. Here everything shares one 2-vCPU machine."
    )
    cli = pick("pgsnap", "cli")
    if cli:
        say(
            "`pgsnap copy` as a new process (python -m pgsnap.cli: start-up, imports, "
            "configuration, plan, copy, catalog): peak RSS "
            f"{spread([r['rss'] / MB for r in cli], 0)} MB (os.wait4 ru_maxrss)"
        )

    # ratios
    def ratio(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> str:
        x, y = med([r.get(key) for r in a]), med([r.get(key) for r in b])
        if x is None or y is None or y == 0:
            return "-"
        return f"{x / y:.2f}x"

    pairs = [
        (
            "full: backup + first copy vs full backup",
            summed("pgsnap", "full"),
            pick("pgbackrest", "full"),
        ),
        (
            "full: the first copy alone vs full backup",
            pick("pgsnap", "full", "copy"),
            pick("pgbackrest", "full"),
        ),
        (
            "incremental: backup + copy vs incremental backup",
            summed("pgsnap", "incremental"),
            pick("pgbackrest", "incremental"),
        ),
        ("restore to a promoted server", pick("pgsnap", "restore"), pick("pgbackrest", "restore")),
    ]
    if pick("pgbackrest", "full"):
        say("")
        say("pgsnap / pgBackRest (medians; below 1: pgsnap less):")
        say(
            table(
                [
                    [name, ratio(a, b, "wall"), ratio(a, b, "cpu"), ratio(a, b, "sent")]
                    for name, a, b in pairs
                ],
                ["comparison", "wall", "CPU (own processes)", "bytes sent"],
            )
        )

    # changed bytes and the target
    if bench.diffs:
        say("")
        say("Changed bytes between the full and the incremental snapshot (median of rounds):")
        changed = med([d["changed"] for d in bench.diffs]) or 0
        say(
            f"  1 % of the rows updated: {med([d['change']['updated'] for d in bench.diffs]):.0f} "
            f"rows; {med([d['pages_changed'] for d in bench.diffs]):.0f} pages of 8 KiB changed "
            f"= {changed / MB:.1f} MB of {bench.diffs[0]['bytes'] / MB:.0f} MB "
            f"({100 * changed / bench.diffs[0]['bytes']:.0f} %); WAL written by the change "
            f"{(med([d['change']['wal'] for d in bench.diffs]) or 0) / MB:.0f} MB"
        )
        inc = pick("pgsnap", "incremental", "copy")
        sent_inc = med([r["bytes_sent"] for r in inc]) or 0
        full = pick("pgsnap", "full", "copy")
        comp = (med([r["bytes_sent"] for r in full]) or 0) / max(
            1, med([r["bytes_read"] for r in full]) or 1
        )
        chunk_rows = []
        for c in DIFF_CHUNKS:
            raw = med([d["chunks"][str(c)] for d in bench.diffs]) or 0
            chunk_rows.append(
                [
                    f"{c // 1024} KiB" + (" (pgsnap's default)" if c == DEFAULT_CHUNK_SIZE else ""),
                    f"{raw / MB:.1f}",
                    f"{raw / changed:.2f}x" if changed else "-",
                ]
            )
        say(
            table(
                chunk_rows,
                ["chunk size", "bytes in changed chunks, MB (raw)", "/ changed pages"],
            )
        )
        raw4 = med([d["chunks"][str(DEFAULT_CHUNK_SIZE)] for d in bench.diffs]) or 0
        ok_sizes = [
            c
            for c in DIFF_CHUNKS
            if changed
            and (med([d["chunks"][str(c)] for d in bench.diffs]) or 0) <= TARGET_RATIO * changed
        ]
        say(
            f"  pgsnap's incremental copy sent {sent_inc / MB:.1f} MB (zstd; the first copy "
            f"compressed to {100 * comp:.1f} % of what it read); in raw bytes its 4 MiB chunks "
            f"hold {raw4 / MB:.1f} MB = {raw4 / changed if changed else 0:.2f}x the changed pages"
        )
        pgbr = pick("pgbackrest", "incremental")
        if pgbr:
            sent_br = med([r["sent"] for r in pgbr]) or 0
            say(
                f"  pgBackRest's incremental backup sent {sent_br / MB:.1f} MB "
                f"({sent_br / changed if changed else 0:.2f}x the changed bytes: it re-sends "
                f"every changed file whole, zstd-compressed)"
            )
        for t in bench.trials:
            s = t["incremental"]["bytes_sent"]
            say(
                f"  trial at {t['chunk'] // 1024} KiB chunks (copy_trees): incremental sent "
                f"{s / MB:.1f} MB = {s / changed if changed else 0:.2f}x the changed bytes, "
                f"{t['incremental']['wall']:.1f} s, CPU {t['incremental']['cpu']:.1f} s "
                f"({t['incremental']['chunks_new']} chunks new); its first copy sent "
                f"{t['first']['bytes_sent'] / MB:.1f} MB in {t['first']['wall']:.1f} s"
            )
        say("")
        say("== Target ==")
        r = sent_inc / changed if changed else float("inf")
        say(
            f"incremental copy bytes sent / changed bytes = {sent_inc / MB:.1f} MB / "
            f"{changed / MB:.1f} MB = {r:.2f}x (target <= {TARGET_RATIO}x): "
            f"{met(r <= TARGET_RATIO)}"
        )
        raw_r = raw4 / changed if changed else float("inf")
        say(
            f"  the same before compression (bytes in changed 4 MiB chunks / changed pages): "
            f"{raw_r:.2f}x: {met(raw_r <= TARGET_RATIO)}"
            + (
                ""
                if raw_r <= TARGET_RATIO
                else (
                    f"; chunks of {max(ok_sizes) // 1024} KiB or less would meet it in raw bytes"
                    if ok_sizes
                    else "; no chunk size from 8 KiB up meets it in raw bytes"
                )
            )
        )
        say(
            "  (compression flatters the first figure: pgbench pages compress well; the raw "
            "figure is the chunking's own amplification)"
        )
    bad = [r for r in rows if r["phase"] == "restore" and not r.get("ok")]
    say(
        "restored servers: "
        + ("every one had the expected sum(abalance)" if not bad else f"{len(bad)} WRONG")
    )


# --------------------------------------------------------------------------- main


def _sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt("SIGTERM")


def machine(parent: Path, bindir: Path, barman: str | None) -> str:
    changed = uncommitted("pgsnap")
    disk = sh(["df", "--output=source,fstype", str(parent)]).splitlines()[-1].split()
    return (
        f"{dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {memory_bytes() / GB:.0f} GB RAM, "
        f"Linux {platform.release()}, {sh(['btrfs', '--version'])}, "
        f"Python {platform.python_version()}, {sh([str(bindir / 'postgres'), '--version'])}, "
        f"{sh(['pgbackrest', 'version'])}, "
        f"barman-cloud-backup {sh([barman, '--version']) if barman else '(none)'}, "
        f"commit {git_commit()}{' + uncommitted changes' if uncommitted('.') else ''}"
        f" (in pgsnap/: {', '.join(changed) or 'none'}); --dir {parent} on {' '.join(disk)} "
        f"({shutil.disk_usage(parent).free / GB:.0f} GB free); load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )


def find_barman(given: str | None) -> str | None:
    if given:
        return given
    found = shutil.which("barman-cloud-backup")
    if found:
        return found
    beside = Path(sys.executable).parent / "barman-cloud-backup"
    return str(beside) if beside.exists() else None


def chunk_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1024, "M": MiB}.get(t[-1:], 1)
    return int(t.rstrip("KM")) * mult


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="pgbench scale (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: PostgreSQL 15)")
    parser.add_argument(
        "--methods",
        default="pgsnap,pgbackrest,barman",
        help="comma-separated, of pgsnap, pgbackrest, barman (default all three)",
    )
    parser.add_argument(
        "--barman", help="the barman-cloud-backup program (default: on PATH or beside python)"
    )
    parser.add_argument(
        "--trial-chunk-size",
        type=chunk_size,
        default=256 * 1024,
        help="round 1: also copy the two snapshots with this chunk size through copy_trees "
        "(default 256K; 0: no trial)",
    )
    parser.add_argument(
        "--cache",
        choices=("warm", "cold"),
        default="warm",
        help="warm (default): each method reads what the page cache holds (pgBackRest the "
        "data pgbench just wrote, pgsnap a snapshot's files, which it has not read yet); "
        "cold: the page cache dropped before every method, as with a database larger "
        "than memory",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run pgsnap's steps under cProfile, writing child-<pid>.prof files to DIR "
        "(their figures then include the profiler's cost)",
    )
    parser.add_argument("--smoke", action="store_true", help="scale 1, one round (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.scale, args.rounds = 1, 1
    methods = [m.strip().lower() for m in args.methods.split(",") if m.strip()]
    if not methods or set(methods) - set(METHODS) or "pgsnap" not in methods:
        parser.error(f"--methods: pgsnap and any of {', '.join(METHODS[1:])}")
    if args.scale < 1 or args.rounds < 1:
        parser.error("--scale and --rounds must be >= 1")
    if args.trial_chunk_size and (args.trial_chunk_size < 4096 or args.trial_chunk_size % PAGE):
        parser.error("--trial-chunk-size: a multiple of 8 KiB")

    def say(msg: str) -> None:
        print(msg, flush=True)

    for why in (btrfs_unavailable(), seaweed_unavailable()):
        if why is not None:
            say(f"cannot run: {why}")
            return 2
    if "pgbackrest" in methods and shutil.which("pgbackrest") is None:
        say("pgBackRest: not measured: no pgbackrest program (apt-get install pgbackrest)")
        methods.remove("pgbackrest")
    args.barman = find_barman(args.barman)
    if "barman" in methods and args.barman is None:
        say(
            "barman-cloud-backup: not measured: not found (pip install 'barman[cloud]' in a "
            "venv and pass --barman VENV/bin/barman-cloud-backup)"
        )
        methods.remove("barman")
    args.methods = methods
    parent = Path(args.dir)
    parent.mkdir(parents=True, exist_ok=True)
    free, need = shutil.disk_usage(parent).free, need_bytes(args.scale)
    if free < need:
        say(
            f"refusing to run: {free / GB:.1f} GB free on {parent}, scale {args.scale} needs "
            f"about {need / GB:.1f} GB; pass --dir on a larger file system or a smaller --scale"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    say(f"bench_copy: {machine(parent, bindir, args.barman)}")
    words = sys.argv[1:] if argv is None else list(argv)
    say(f"command: python benchmarks/bench_copy.py {' '.join(words)}")
    say(
        "page cache: "
        + (
            "cold (dropped before every method and every restore)"
            if args.cache == "cold"
            else "warm (as each method finds it; --cache cold drops it before every method)"
        )
    )
    say(
        f"methods: {', '.join(LABEL[m] for m in methods)}; pgsnap chunks "
        f"{DEFAULT_CHUNK_SIZE // MiB} MiB zstd level {ZSTD_LEVEL}; pgBackRest compress-type=zst "
        f"compress-level={ZSTD_LEVEL} process-max=2; barman-cloud-backup -z (gzip) -J 2; "
        "barman-cloud has no incremental backup to S3 (Barman 3.x block-level incremental "
        "backups need PostgreSQL 17 and a Barman server): full only"
    )
    if args.scale < 1000:
        say(
            f"scale 1000 (15 GB): not measured in this run (--scale {args.scale}); it needs "
            f"about {need_bytes(1000) / GB:.0f} GB free on --dir ({free / GB:.0f} GB here) and "
            "about ten times this run's time per round: see the estimate at the end"
        )
    signal.signal(signal.SIGTERM, _sigterm)
    t_start = time.perf_counter()
    bench = Bench(args, bindir, say)
    interrupted = failed = False
    try:
        bench.setup()
        for n in range(1, args.rounds + 1):
            bench.round(n)
    except KeyboardInterrupt:
        say("interrupted: cleaning up")
        interrupted = True
    except Exception:
        say(f"FAILED:\n{traceback.format_exc()}")
        failed = True
    finally:
        t1 = time.perf_counter()
        bench.cleanup()
        say(f"cleanup {time.perf_counter() - t1:.1f} s")
    if bench.rows:
        report(say, bench)
    total = time.perf_counter() - t_start
    say("")
    if args.scale < 1000 and bench.rows and not (interrupted or failed):
        init = float(bench.facts.get("init_seconds", 0.0))
        per_round = (total - init) / args.rounds
        factor = 1000 / args.scale
        say(
            f"scale 1000 estimate, linear from this run (x{factor:.0f}): pgbench -i about "
            f"{factor * init / 60:.0f} min, then about {factor * per_round / 60:.0f} min per round"
        )
    say(
        f"total run time {total:.0f} s"
        + (" (interrupted)" if interrupted else "")
        + (" (FAILED)" if failed else "")
    )
    say(f"at the end: {machine(parent, bindir, args.barman)}")
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
