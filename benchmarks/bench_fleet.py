"""Benchmark: planning over a fleet-sized archive (issue 9).

Run (as root, like the tests: the backup-planning server runs as the ``postgres`` OS user)::

    python benchmarks/bench_fleet.py                          # 1,000,000 segments, 10,000 backups
    python benchmarks/bench_fleet.py --keep                   # keep the data for the next run
    python benchmarks/bench_fleet.py --segments 20000 --backups 200 --runs 1   # smoke run
    python benchmarks/bench_fleet.py --catalog postgres       # the catalog in PostgreSQL

With ``--catalog postgres`` (issue 25) the same records are imported (``copy_records``,
one write per record, as ``pgsnap catalog import`` does) into a ``PostgresCatalog`` on
a throwaway PostgreSQL 15 server (fsync on, below ``--dir``), and every measurement that
reads the catalog (planning, expiry, listing) reads it there; the WAL index stays in
``catalog/wal-index``, as a backup server keeps it in its ``[catalog] path``. The
measurements that read no catalog are left out. The targets are the same.

Targets (issue 9): recovery planning over 1,000,000 archived segments on 3
timelines with 10,000 backups under 1 s warm and under 200 MB, for ``latest``
and for a time target (WAL index warm); backup planning under 0.3 s on the same
archive; listing 10,000 catalog records under 0.3 s. Prints every run (min,
median, max), the peak RSS of each and "met" / "NOT met"; never asserts.

The data (``--dir``, default ``/var/tmp/pgsnap-fleet``): generated when missing
(about 2 minutes at full scale: 1,000,000 files, 10,000 catalog writes with
fsync), reused while its shape matches, removed at the end unless ``--keep``.
It needs about 200 MB and one inode per file; the script checks
``shutil.disk_usage`` and ``statvfs().f_favail`` first and refuses when short:

- ``archive/``: ``--segments`` 16 MiB segment files on timelines 1 -> 2 -> 3
  (timeline 2 begins 40 % and timeline 3 70 % of the way along; the old
  timelines run on a few segments past each fork, as an archive of a promoted
  standby does), ``00000002.history`` and ``00000003.history`` whose
  switchpoints are where the files of timelines 2 and 3 begin, and one
  ``.backup`` file per backup. Every segment is a sparse file (truncated to
  16 MiB, no data), except the newest ones of timeline 3 (at least 300, and
  every segment from the newest backup on): those are valid WAL of the
  cluster's system identifier, written by the synthetic writer of the unit
  tests (``tests.unit.test_walreader.WalWriter``, PostgreSQL 15 format): per
  segment three commits and an ``XLOG_SWITCH``, one 8 KiB page of data, the
  rest a hole;
- ``catalog/``: a :class:`~pgsnap.catalog.DirectoryCatalog` of ``--backups``
  DONE records spread evenly over the archive (the newest about one
  hundredth of the way from the end with the defaults), each with its two
  snapshots (the ids the in-memory ``MockBackend`` gives, see below).

Time runs with the WAL: segment ``n`` covers 36 s from 2020-01-01 00:00 UTC +
``36 n`` s (from earlier for an archive that would end after 2026: 10,000,000
segments span 11 years); its commits are at +2 s, +8 s and +20 s. A backup starts at the
first record of its segment at that segment's time, and stops 5 s later at the
second record. The time target is the newest backup's stop time + 10 minutes
(about 17 segments after the backup's start, inside the real WAL).

Each measurement runs in a fresh Python process, ``--runs`` rounds, the order of
the methods rotated from round to round. The child reports
``getrusage(RUSAGE_SELF).ru_maxrss``; it is forked (not vforked: after a vfork
and exec Linux carries the parent's peak RSS into the child's) from this
launcher, which imports no pgsnap and holds no data (its own peak is printed).
Each row gives the wall time of the timed call and the CPU time of the process
during it (``time.process_time``: the machine's other load inflates the wall
time, not the CPU time):

1. ``Cluster.plan_recovery(latest, lost=data+wal)``, cold (``<catalog>/wal-index``
   removed first) and warm (after an unmeasured plan of the same target in
   another process); the Cluster is what a user builds: ``PostgresAdapter``
   (no server running), an in-memory ``MockBackend`` holding the 10,000
   snapshot groups, ``DirectoryWalArchive``, ``DirectoryCatalog``;
2. the same for the time target;
3. ``Cluster.plan_backup()`` against a real, throwaway PostgreSQL 15 server
   (``PgServer.create``, wrapped by ``mock_cluster``) whose Cluster has the
   fleet archive and the fleet catalog. So that the server *is* the fleet's
   cluster, the server is made one before it starts: its ``pg_control`` gets
   the fleet's system identifier (CRC recomputed) and ``pg_resetwal -l``
   puts it on timeline 3, at the segment after the archive's newest; before
   the timed call it archives one segment (``pg_switch_wal``), which is
   copied into the fleet's archive for the run, as a server in service has
   archived (planning reads the archive's system identifier from it; a
   server that has archived nothing costs a listing of the archive);
4. ``DirectoryCatalog.list()`` of the records;
5. the pieces: ``os.listdir`` of the archive (the floor),
   ``ArchiveIndex.build`` over those names (the listing not timed),
   ``DirectoryWalArchive.index(seg, check_sizes=False)`` (list + build), and
   the reader alone: ``pgsnap.wal.contents.read_events`` over the newest 4
   segments with no WAL index (what a cold ``latest`` plan reads);
6. a baseline process: the imports and the recovery Cluster, no plan (the
   memory planning starts from);
7. ``Cluster.plan_expiry`` (issue 13; target under 2 s) with the clock an hour
   after the newest backup: a steady-state policy (redundancy of all but ten
   backups: ten go) and a first expiry (redundancy 100 and a 30-day window:
   most of the catalog and of the archive go). Like the warm plans, each runs
   after an unmeasured plan on the machine (an expiry timer runs where backups
   are planned), so the archive's state is known and probed by name.

The planning rows also show, from the DEBUG log of ``pgsnap.observe``
("N segments read, M from the index"), how many segments each plan read and
took from the WAL index. The page cache is warm in every run (the files were
just written or listed); "cold" is about the WAL index only. A target is met
when the median is under it, every run succeeded and, for memory, the largest
peak RSS is under 200 MiB (MB read as MiB, as ``bench_wal_index.py`` does).

Caveat: the real segments hold four records each, so reading one costs far less
than reading a real, full 16 MiB segment (``bench_walreader.py`` and
``bench_plan_recovery.py`` measure that). The counts of segments read say what
a real archive would cost.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SEG = 16 * 1024 * 1024
PAGE = 8192
SYSID = 7_000_000_000_000_000_001
T0 = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
LATEST_END = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
"""An archive whose segments, 36 s each from :data:`T0`, would end after this starts
earlier (:attr:`Shape.t0`): its time target must be in the past."""
SEGMENT_SECONDS = 36
FIRST_BACKUP_SEGNO = 20
MIN_REAL = 300
MAX_REAL = 20_000
TARGET_AFTER = dt.timedelta(minutes=10)
GENERATOR_VERSION = 1
MANIFEST = "fleet.json"
MARKER = "bench_fleet.generating"

TARGET_RECOVERY_SECONDS = 1.0
TARGET_RECOVERY_MIB = 200.0
TARGET_BACKUP_SECONDS = 0.3
TARGET_CATALOG_SECONDS = 0.3
TARGET_EXPIRY_SECONDS = 2.0

MiB = 1024 * 1024

METHODS: dict[str, str] = {
    "rec-latest-cold": "plan_recovery(latest), index cold",
    "rec-latest-warm": "plan_recovery(latest), index warm",
    "rec-time-cold": "plan_recovery(time), index cold",
    "rec-time-warm": "plan_recovery(time), index warm",
    "backup-plan": "plan_backup() (real server)",
    "catalog-list": "Catalog.list() (the --catalog)",
    "expiry-steady": "plan_expiry(redundancy backups-10), archive known",
    "expiry-first": "plan_expiry(redundancy 100, window 30d), archive known",
    "archive-index": "DirectoryWalArchive.index(names)",
    "index-build": "ArchiveIndex.build(names)",
    "listdir": "os.listdir(archive) (floor)",
    "read-tail": "read_events(newest 4 segments)",
    "baseline": "baseline: imports + Cluster",
}


CATALOG_NAMES = {"directory": "DirectoryCatalog", "postgres": "PostgresCatalog"}
DIRECTORY_ONLY = frozenset({"archive-index", "index-build", "listdir", "read-tail"})
"""Measurements that read no catalog: not repeated with ``--catalog postgres``."""

# --------------------------------------------------------------------------- the fleet's shape


@dataclasses.dataclass(frozen=True)
class Shape:
    """Where everything lies, from ``--segments`` and ``--backups`` alone (no I/O)."""

    segments: int
    backups: int

    @property
    def t0(self) -> dt.datetime:
        """When segment 0 begins: :data:`T0`, or earlier for an archive so large
        (10,000,000 segments are 11 years) that it would end after :data:`LATEST_END`."""
        span = dt.timedelta(seconds=SEGMENT_SECONDS * self.segments)
        return min(T0, LATEST_END - span)

    @property
    def fork1(self) -> int:
        """The segment where timeline 2 begins."""
        return self.segments * 4 // 10

    @property
    def fork2(self) -> int:
        """The segment where timeline 3 begins."""
        return self.segments * 7 // 10

    @property
    def last(self) -> int:
        """The newest segment (timeline 3); the file count is exactly ``segments``."""
        return self.segments - 15

    @property
    def switch1(self) -> int:
        return self.fork1 * SEG + 0x28

    @property
    def switch2(self) -> int:
        return self.fork2 * SEG + 0x1000

    def ranges(self) -> list[tuple[int, int, int]]:
        """(timeline, first segno, last segno + 1) of the archived segment files."""
        return [
            (1, 1, self.fork1 + 10),
            (2, self.fork1, self.fork2 + 5),
            (3, self.fork2, self.last + 1),
        ]

    def backup_segno(self, i: int) -> int:
        return FIRST_BACKUP_SEGNO + (self.last - FIRST_BACKUP_SEGNO) * i // self.backups

    def timeline_of(self, lsn: int) -> int:
        return 1 if lsn < self.switch1 else 2 if lsn < self.switch2 else 3

    @property
    def real_first(self) -> int:
        """The first segment written as real WAL (timeline 3)."""
        return min(self.last - MIN_REAL + 1, self.backup_segno(self.backups - 1))

    def problem(self) -> str | None:
        """Why this shape cannot be generated (None: it can)."""
        if self.segments < 1000 or self.backups < 3:
            return "--segments must be at least 1,000 and --backups at least 3"
        if self.last - FIRST_BACKUP_SEGNO < 2 * self.backups:
            return "--backups must be at most about --segments / 2"
        if self.real_first <= self.fork2:
            return "the newest backup must lie on timeline 3: use more backups or segments"
        if self.last - self.real_first + 1 > MAX_REAL:
            return (
                f"the newest backup is {self.last - self.real_first + 1} segments from the end "
                f"(more than {MAX_REAL} to write as real WAL): use more backups"
            )
        return None


def segment_time(shape: Shape, segno: int) -> dt.datetime:
    return shape.t0 + dt.timedelta(seconds=SEGMENT_SECONDS * segno)


def backup_times(shape: Shape, i: int) -> tuple[dt.datetime, dt.datetime]:
    start = segment_time(shape, shape.backup_segno(i))
    return start, start + dt.timedelta(seconds=5)


def target_time(shape: Shape) -> dt.datetime:
    """The newest backup's stop + :data:`TARGET_AFTER`, or the newest segment's start
    when backups lie closer together than that (then the target is still before the
    last commit)."""
    after = backup_times(shape, shape.backups - 1)[1] + TARGET_AFTER
    return min(after, segment_time(shape, shape.last))


def seg_name(tli: int, segno: int) -> str:
    return f"{tli:08X}{segno // 256:08X}{segno % 256:08X}"


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# --------------------------------------------------------------------------- generation (worker)


def generate(root: Path, shape: Shape) -> None:
    """Write the archive and the catalog under ``root``, then the manifest (last)."""
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.model import (  # noqa: PLC0415
        BackupRecord,
        BackupState,
        Layout,
        Volume,
        VolumeRole,
    )
    from tests.unit.test_walreader import WalWriter  # noqa: PLC0415

    t_all = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the backup-planning server's OS user makes its directory here
    (root / MARKER).write_text("generation under way or interrupted\n")
    arch = root / "archive"
    arch.mkdir()

    # 1. sparse segments (all but the real WAL)
    t = time.perf_counter()
    sparse = 0
    for tli, lo, hi in shape.ranges():
        for segno in range(lo, hi):
            if tli == 3 and segno >= shape.real_first:
                continue
            fd = os.open(arch / seg_name(tli, segno), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, SEG)
            finally:
                os.close(fd)
            sparse += 1
            if sparse % 100_000 == 0:
                print(f"  {sparse:,} sparse segments ({time.perf_counter() - t:.0f} s)", flush=True)
    t_sparse = time.perf_counter() - t
    print(f"  {sparse:,} sparse segments: {t_sparse:.1f} s", flush=True)

    # 2. real WAL: three commits and a switch per segment, one page each, written sparse
    t = time.perf_counter()

    class Writer(WalWriter):
        def _seg(self, segno: int) -> bytearray:
            # WalWriter's own allocates a 16 MiB buffer on every write (setdefault's
            # default is built before the lookup): allocate once per segment.
            seg = self.files.get((self.tli, segno))
            if seg is None:
                seg = self.files[(self.tli, segno)] = bytearray(self.segsz)
            return seg

    writer = Writer(major=15, segsz=SEG, tli=3, sysid=SYSID, segno=shape.real_first)
    stop_offset: dict[int, int] = {}
    xid = 1000
    real_bytes = 0
    for segno in range(shape.real_first, shape.last + 1):
        when = segment_time(shape, segno)
        writer.commit(xid, when + dt.timedelta(seconds=2))
        second, _ = writer.commit(xid + 1, when + dt.timedelta(seconds=8))
        writer.commit(xid + 2, when + dt.timedelta(seconds=20))
        xid += 3
        switch, _ = writer.switch()
        stop_offset[segno] = second - segno * SEG
        data = writer.files.pop((3, segno))  # finished: written and dropped
        used = (switch - segno * SEG + 24 + PAGE - 1) // PAGE * PAGE  # the switch: 24 bytes
        assert data[used : used + PAGE] == bytes(PAGE)
        fd = os.open(arch / seg_name(3, segno), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(data[:used]))
            os.ftruncate(fd, SEG)
        finally:
            os.close(fd)
        real_bytes += used
    assert not writer.files
    t_real = time.perf_counter() - t
    n_real = shape.last - shape.real_first + 1
    print(f"  {n_real:,} segments of real WAL: {t_real:.1f} s", flush=True)

    # 3. timeline histories, where the files of timelines 2 and 3 begin
    (arch / "00000002.history").write_text(
        f"1\t{lsn_text(shape.switch1)}\tno recovery target specified\n"
    )
    (arch / "00000003.history").write_text(
        f"1\t{lsn_text(shape.switch1)}\tno recovery target specified\n\n"
        f"2\t{lsn_text(shape.switch2)}\tno recovery target specified\n"
    )

    # 4. catalog records and the archive's .backup files
    t = time.perf_counter()
    catalog = DirectoryCatalog(root / "catalog")
    layout = Layout(
        (
            Volume("vol-0001", "pgdata", VolumeRole.DATA, "/pgdata"),
            Volume("vol-0002", "pgwal", VolumeRole.WAL, "/pgwal"),
        )
    )
    default_stop = stop_offset[shape.real_first]
    for i in range(shape.backups):
        segno = shape.backup_segno(i)
        start = segno * SEG + 0x28
        stop = segno * SEG + stop_offset.get(segno, default_stop)
        tli = shape.timeline_of(start)
        t_start, t_stop = backup_times(shape, i)
        start_text = f"{lsn_text(start)} (file {seg_name(tli, segno)})"
        label = (
            f"START WAL LOCATION: {start_text}\n"
            f"CHECKPOINT LOCATION: {lsn_text(start)}\n"
            "BACKUP METHOD: streamed\nBACKUP FROM: primary\n"
            f"START TIME: {t_start:%Y-%m-%d %H:%M:%S} UTC\nLABEL: nightly {i}\n"
            f"START TIMELINE: {tli}\n"
        )
        (arch / f"{seg_name(tli, segno)}.00000028.backup").write_text(
            f"START WAL LOCATION: {start_text}\n"
            f"STOP WAL LOCATION: {lsn_text(stop)} (file {seg_name(tli, segno)})\n"
            + label.split("\n", 1)[1]
            + f"STOP TIME: {t_stop:%Y-%m-%d %H:%M:%S} UTC\nSTOP TIMELINE: {tli}\n"
        )
        catalog.put(
            BackupRecord(
                id=t_start.strftime("%Y%m%dT%H%M%S000Z"),
                label=f"nightly {i}",
                state=BackupState.DONE,
                system_identifier=str(SYSID),
                server_version=150010,
                wal_segment_size=SEG,
                layout=layout,
                start_lsn=lsn_text(start),
                start_timeline=tli,
                start_time=t_start,
                stop_lsn=lsn_text(stop),
                stop_timeline=tli,
                stop_time=t_stop,
                labelfile=label,
                snapshot_group_id=f"cg-{i + 1:04d}",
                snapshots={
                    "vol-0001": f"snap-{2 * i + 1:04d}",
                    "vol-0002": f"snap-{2 * i + 2:04d}",
                },
                backup_mode_seconds=5.0,
                total_seconds=5.2,
                pgsnap_version="0.1.0",
                wal_directory="/pgwal/pg_wal",
            )
        )
        if (i + 1) % 2000 == 0:
            print(f"  {i + 1:,} records ({time.perf_counter() - t:.0f} s)", flush=True)
    t_catalog = time.perf_counter() - t
    print(f"  {shape.backups:,} catalog records and .backup files: {t_catalog:.1f} s", flush=True)

    # 5. what it takes on disk
    disk = {"archive": _disk_bytes(arch), "catalog": _disk_bytes(root / "catalog")}
    newest = shape.backups - 1
    manifest = {
        "generator": GENERATOR_VERSION,
        "segments": shape.segments,
        "backups": shape.backups,
        "system_identifier": str(SYSID),
        "real_first": shape.real_first,
        "last": shape.last,
        "real_wal_bytes": real_bytes,
        "sparse_segments": sparse,
        "newest_backup": {
            "start_lsn": lsn_text(shape.backup_segno(newest) * SEG + 0x28),
            "start_time": backup_times(shape, newest)[0].isoformat(),
            "stop_time": backup_times(shape, newest)[1].isoformat(),
        },
        "target_time": target_time(shape).isoformat(),
        "disk_bytes": disk,
        "seconds": {
            "sparse": t_sparse,
            "real": t_real,
            "catalog": t_catalog,
            "total": time.perf_counter() - t_all,
        },
        "generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1))
    (root / MARKER).unlink()


def _disk_bytes(path: Path) -> int:
    """Blocks allocated to the files of ``path`` and to the directory itself."""
    total = os.stat(path).st_blocks * 512
    with os.scandir(path) as it:
        for entry in it:
            total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


# --------------------------------------------------------------------------- measurements (worker)


class _Counts:
    """Counts from pgsnap's log: segments read / from the index / added, and warnings."""

    def __init__(self) -> None:
        import logging  # noqa: PLC0415

        self.read = self.indexed = self.added = self.scans = 0
        self.warnings: list[str] = []
        counts = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                msg = record.getMessage()
                m = re.search(r"(\d+) segments read, (\d+) from the index \((\d+) indexed", msg)
                if m:
                    counts.scans += 1
                    counts.read += int(m.group(1))
                    counts.indexed += int(m.group(2))
                    counts.added += int(m.group(3))
                elif record.levelno >= logging.WARNING:
                    counts.warnings.append(f"{record.name}: {msg}")

        logging.getLogger("pgsnap").addHandler(Handler(logging.DEBUG))
        logging.getLogger("pgsnap").setLevel(logging.WARNING)
        logging.getLogger("pgsnap.observe").setLevel(logging.DEBUG)


def _catalog(root: Path, conninfo: str | None) -> Any:
    """The fleet's catalog: the directory, or (``--catalog postgres``) the same records
    in a PostgreSQL catalog database."""
    if conninfo is None:
        from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415

        return DirectoryCatalog(root / "catalog")
    from pgsnap.catalog.postgres import PostgresCatalog  # noqa: PLC0415

    return PostgresCatalog(conninfo, PG_CLUSTER)


def _recovery_cluster(root: Path, shape: Shape, conninfo: str | None) -> Any:
    """The Cluster a user builds for this fleet (no server running)."""
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
    from pgsnap.cluster import Cluster  # noqa: PLC0415
    from pgsnap.model import Layout, Volume, VolumeRole  # noqa: PLC0415
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    now = [shape.t0]
    backend = MockBackend(clock=lambda: now[0])
    backend.add_volume("pgdata", volume_id="vol-0001")
    backend.add_volume("pgwal", volume_id="vol-0002")
    for i in range(shape.backups):  # ids cg-NNNN, snap-NNNN as the records name them
        now[0] = backup_times(shape, i)[0] + dt.timedelta(seconds=2)
        backend.create_snapshot_group(["vol-0001", "vol-0002"], f"nightly {i}")
    layout = Layout(
        (
            Volume("vol-0001", "pgdata", VolumeRole.DATA, "/pgdata"),
            Volume("vol-0002", "pgwal", VolumeRole.WAL, "/pgwal"),
        )
    )
    adapter = PostgresAdapter(
        f"host={root / 'nosock'} port=1 user=postgres", data_directory=str(root / "nodata")
    )
    return Cluster(
        adapter=adapter,
        backend=backend,
        archive=DirectoryWalArchive(root / "archive"),
        catalog=_catalog(root, conninfo),
        layout=layout,
        wal_index=root / "catalog" / "wal-index",
    )


def _plan_summary(plan: Any) -> dict[str, Any]:
    summary = dict(plan.summary)
    return {
        "backup": summary.get("backup"),
        "summary": {k: str(v) for k, v in summary.items()},
        "warnings": list(plan.warnings),
    }


class Stopwatch:
    """The wall and CPU time of this process from its creation to :meth:`stop`."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def stop(self) -> dict[str, float]:
        return {
            "seconds": time.perf_counter() - self.wall,
            "cpu_seconds": time.process_time() - self.cpu,
        }


def _measure_recovery(root: Path, shape: Shape, which: str, conninfo: str | None) -> dict[str, Any]:
    from pgsnap.model import RecoveryTarget  # noqa: PLC0415

    counts = _Counts()
    cluster = _recovery_cluster(root, shape, conninfo)
    target = (
        RecoveryTarget.latest() if which == "latest" else RecoveryTarget.time(target_time(shape))
    )
    sw = Stopwatch()
    plan = cluster.plan_recovery(target, lost=("data", "wal"))
    times = sw.stop()
    return {
        **times,
        "read": counts.read,
        "indexed": counts.indexed,
        "added": counts.added,
        "scans": counts.scans,
        "log_warnings": counts.warnings,
        **_plan_summary(plan),
    }


def _become_the_fleets_cluster(server: Any, shape: Shape) -> None:
    """Give the stopped server the fleet's system identifier and put it on timeline 3 after
    the archive's newest segment (``pg_control`` patched, then ``pg_resetwal -l``)."""
    from pgsnap.wal._crc32c import crc32c  # noqa: PLC0415

    control = server.data_dir / "global" / "pg_control"
    data = bytearray(control.read_bytes())
    for end in range(16, 1024, 4):  # ControlFileData ends with the CRC-32C of what precedes it
        if crc32c(bytes(data[:end])) == int.from_bytes(data[end : end + 4], "little"):
            break
    else:
        raise RuntimeError(f"no CRC found in {control}")
    data[0:8] = SYSID.to_bytes(8, "little")
    data[end : end + 4] = crc32c(bytes(data[:end])).to_bytes(4, "little")
    control.write_bytes(bytes(data))
    server.run_as_owner(
        [
            str(server.bindir / "pg_resetwal"),
            "-l",
            seg_name(3, shape.last + 1),
            "-D",
            str(server.data_dir),
        ]
    )


def _measure_backup_plan(
    root: Path, shape: Shape, bindir: str | None, conninfo: str | None
) -> dict[str, Any]:
    from pgsnap.cluster import Cluster  # noqa: PLC0415
    from pgsnap.testing.pgserver import PgServer, find_postgres_bindir  # noqa: PLC0415
    from pgsnap.testing.sandbox import mock_cluster  # noqa: PLC0415
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    counts = _Counts()
    copied: Path | None = None
    server = PgServer.create(
        Path(bindir) if bindir else find_postgres_bindir(15),
        wal_segsize_mb=16,
        separate_wal_dir=True,
        archive=True,
        parent_dir=root,
    )
    try:
        _become_the_fleets_cluster(server, shape)
        server.start()
        row = server.sql(
            "SELECT system_identifier::text, timeline_id FROM pg_control_system(), "
            "pg_control_checkpoint()"
        )[0]
        # A server in service has archived: its last segment is in the fleet's
        # archive (copied there for this run, removed after), and planning reads
        # the archive's system identifier from it instead of listing the archive.
        last = server.sql("SELECT pg_walfile_name(pg_switch_wal())")[0][0]
        deadline = time.monotonic() + 60
        while server.sql("SELECT last_archived_wal FROM pg_stat_archiver")[0][0] != last:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{last} was not archived within 60 s")
            time.sleep(0.05)
        copied = root / "archive" / last
        shutil.copyfile(server.archive_dir / last, copied)
        sandbox = mock_cluster(server)
        cluster = Cluster(
            adapter=sandbox.adapter,
            backend=sandbox.backend,
            archive=DirectoryWalArchive(root / "archive"),
            catalog=_catalog(root, conninfo),
            layout=sandbox.layout,
            wal_index=root / "catalog" / "wal-index",
            journal_dir=server.base_dir / "journal",
        )
        server.sql("SELECT 1")  # a first connection has been made before the timed one
        sw = Stopwatch()
        try:
            plan = cluster.plan_backup("fleet bench")
        except Exception as exc:
            times = sw.stop()
            return {
                **times,
                "error": f"{type(exc).__name__}: {exc}",
                "server": f"system identifier {row[0]}, timeline {row[1]}",
            }
        times = sw.stop()
        return {
            **times,
            "backup": plan.summary.get("cluster"),
            "warnings": list(plan.warnings),
            "log_warnings": counts.warnings,
            "server": f"system identifier {row[0]}, timeline {row[1]}",
        }
    finally:
        if copied is not None:
            copied.unlink(missing_ok=True)
        server.cleanup()


def _read_tail(root: Path, shape: Shape) -> dict[str, Any]:
    """The reader alone: ``read_events`` over the newest 4 segments (what a ``latest`` plan
    reads cold), no WAL index."""
    from pgsnap.model import LSN  # noqa: PLC0415
    from pgsnap.wal import TimelineSpan  # noqa: PLC0415
    from pgsnap.wal.contents import read_events  # noqa: PLC0415

    spans = (TimelineSpan(3, LSN(shape.switch2), None),)
    sw = Stopwatch()
    found = read_events(
        [str(root / "archive")],
        spans,
        LSN((shape.last - 3) * SEG),
        LSN((shape.last + 1) * SEG),
        segment_size=SEG,
        system_identifier=str(SYSID),
        major=15,
    )
    times = sw.stop()
    return {**times, "items": found.read, "commits": len(found.events.commits)}


def _measure(
    method: str, root: Path, shape: Shape, bindir: str | None, conninfo: str | None
) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    if method.startswith(("rec-", "prime-")):
        which = "latest" if "latest" in method else "time"
        return _measure_recovery(root, shape, which, conninfo)
    if method == "backup-plan":
        return _measure_backup_plan(root, shape, bindir, conninfo)
    if method == "catalog-list":
        catalog = _catalog(root, conninfo)
        sw = Stopwatch()
        records = catalog.list()
        return {**sw.stop(), "items": len(records)}
    if method.startswith("expiry-"):
        from pgsnap.planner.expiry import RetentionPolicy  # noqa: PLC0415

        cluster = _recovery_cluster(root, shape, conninfo)
        last_stop = backup_times(shape, shape.backups - 1)[1]
        cluster.clock = lambda: last_stop + dt.timedelta(hours=1)
        policy = (
            RetentionPolicy(redundancy=shape.backups - 10)
            if method == "expiry-steady"
            else RetentionPolicy(redundancy=100, window=dt.timedelta(days=30))
        )
        sw = Stopwatch()
        plan = cluster.plan_expiry(policy)
        return {**sw.stop(), "items": len(plan.steps), "deleted": plan.summary["backups deleted"]}
    if method == "listdir":
        sw = Stopwatch()
        names = os.listdir(root / "archive")
        return {**sw.stop(), "items": len(names)}
    if method == "index-build":
        from pgsnap.wal import ArchiveIndex  # noqa: PLC0415

        names = os.listdir(root / "archive")
        sw = Stopwatch()
        index = ArchiveIndex.build(names, SEG)
        return {**sw.stop(), "items": len(names), "index": repr(index)}
    if method == "archive-index":
        from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

        archive = DirectoryWalArchive(root / "archive")
        sw = Stopwatch()
        index = archive.index(SEG, check_sizes=False)
        return {**sw.stop(), "index": repr(index)}
    if method == "read-tail":
        return _read_tail(root, shape)
    if method == "baseline":
        sw = Stopwatch()
        _recovery_cluster(root, shape, conninfo)
        return sw.stop()
    raise ValueError(method)


PG_CLUSTER = "fleet"
"""The cluster's name in the PostgreSQL catalog (``--catalog postgres``)."""


def _start_catalog_db(root: Path, bindir: str | None) -> dict[str, Any]:
    """A throwaway PostgreSQL 15 server (fsync on) below ``root``, left running, with the
    catalog schema migrated and the directory catalog's records imported as a user
    would (``copy_records``: one write per record)."""
    from pgsnap.catalog import DirectoryCatalog, copy_records  # noqa: PLC0415
    from pgsnap.catalog.postgres import PostgresCatalog, migrate  # noqa: PLC0415
    from pgsnap.testing.pgserver import PgServer, find_postgres_bindir  # noqa: PLC0415

    root.chmod(root.stat().st_mode | 0o001)  # the server's OS user goes through it
    t0 = time.perf_counter()
    server = PgServer.create(
        Path(bindir) if bindir else find_postgres_bindir(15),
        archive=False,
        parent_dir=root,
        settings={"fsync": True, "shared_buffers": "256MB"},
    )
    try:
        server.start()
        conninfo = server.conninfo()
        migrate(conninfo)
        target = PostgresCatalog(conninfo, PG_CLUSTER)
        counts = copy_records(DirectoryCatalog(root / "catalog"), target)
        target.close()
        server.sql("VACUUM ANALYZE")
    except BaseException:
        server.cleanup()
        raise
    return {
        "conninfo": conninfo,
        "bindir": str(server.bindir),
        "data_dir": str(server.data_dir),
        "base_dir": str(server.base_dir),
        "os_user": server.os_user,
        "version": server.version_num,
        "imported": counts["backups"],
        "seconds": time.perf_counter() - t0,
    }


def _stop_catalog_db(db: dict[str, Any]) -> None:
    """Stop the catalog server and remove its directories (no pgsnap import here)."""
    subprocess.run(
        ["runuser", "-u", db["os_user"], "--", str(Path(db["bindir"]) / "pg_ctl"), "stop",
         "-D", db["data_dir"], "-m", "fast", "-w"],
        capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    shutil.rmtree(db["base_dir"], ignore_errors=True)


def worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT))
    shape = Shape(args.segments, args.backups)
    root = Path(args.dir)
    if args.worker == "generate":
        generate(root, shape)
        return 0
    if args.worker == "catalog-db":
        print("RESULT " + json.dumps(_start_catalog_db(root, args.bindir)), flush=True)
        return 0
    t0 = time.perf_counter()
    try:
        result = _measure(args.worker, root, shape, args.bindir, args.catalog_conninfo)
    except Exception as exc:  # reported by the launcher, with the traceback on stderr
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["process_seconds"] = time.perf_counter() - t0
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --------------------------------------------------------------------------- the launcher


def _fork_not_vfork() -> None:
    """Passed as ``preexec_fn`` so that the child is forked, not vforked: after a vfork
    + exec, Linux carries the parent's peak RSS into the child's ``ru_maxrss``."""


def run_child(argv: list[str], *, capture: bool = True, timeout: float = 1800) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        cwd=ROOT,
        capture_output=capture,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=_fork_not_vfork,  # this launcher runs no threads
    )
    out = (proc.stdout or "") + (proc.stderr or "") if capture else ""
    return proc.returncode, out


def measure(method: str, common: list[str]) -> dict[str, Any]:
    code, out = run_child(["--worker", method, *common])
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            if "error" in result:
                result["stderr"] = out[-3000:]
            return result
    return {"error": f"worker exited {code}", "stderr": out[-3000:]}


def remove_index(root: Path) -> None:
    shutil.rmtree(root / "catalog" / "wal-index", ignore_errors=True)


def index_size(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _dirs, names in os.walk(root / "catalog" / "wal-index"):
        for n in names:
            files += 1
            size += os.path.getsize(os.path.join(dirpath, n))
    return files, size


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.0f} GiB RAM"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{dt.date.today().isoformat()}, {platform.node()}, {os.cpu_count()} CPUs ({cpu}), "
        f"{mem}, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}; load average {load}"
    )


def source_state() -> str:
    """The commit measured, and the files of pgsnap/ changed in the work tree."""

    def git(*a: str) -> str:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=False
        )
        return proc.stdout

    head = git("log", "-1", "--format=%h %s").strip() or "?"
    status = git("status", "--porcelain=v1", "-z", "--", "pgsnap")
    dirty = [entry[3:] for entry in status.split("\0") if len(entry) > 3]
    return f"pgsnap at {head}" + (f"; uncommitted changes in {', '.join(dirty)}" if dirty else "")


def filesystem(path: Path) -> str:
    best = ("?", "?")
    with contextlib.suppress(OSError):
        real = os.path.realpath(path)
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mnt = parts[1]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, parts[2])
    return f"{best[1]} on {best[0]}"


def check_space(root: Path, shape: Shape, reuse: bool) -> str | None:
    """Why there is not enough room (None: there is)."""
    probe = root
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    free = shutil.disk_usage(probe).free
    real = shape.last - shape.real_first + 1
    need_bytes = 512 * MiB if reuse else 1024 * MiB + real * 64 * 1024 + shape.backups * 16 * 1024
    need_inodes = 20_000 if reuse else shape.segments + 2 * shape.backups + 20_000
    if free < need_bytes:
        return (
            f"{free / MiB:,.0f} MiB free on {probe}, {need_bytes / MiB:,.0f} MiB needed "
            "(directories, catalog, real WAL, a throwaway server): use --dir elsewhere"
        )
    if st.f_favail < need_inodes:
        return (
            f"{st.f_favail:,} free inodes on {probe}, {need_inodes:,} needed (one per segment "
            "file, two per backup): use --dir on another file system"
        )
    return None


def load_manifest(root: Path, shape: Shape) -> dict[str, Any] | None:
    try:
        manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if (manifest.get("generator"), manifest.get("segments"), manifest.get("backups")) != (
        GENERATOR_VERSION,
        shape.segments,
        shape.backups,
    ):
        return None
    if (root / MARKER).exists():
        return None
    return manifest


def ours(root: Path) -> bool:
    """True when ``root`` is missing, empty or made by this script (safe to remove)."""
    if not root.exists():
        return True
    if (root / MANIFEST).exists() or (root / MARKER).exists():
        return True
    return not any(root.iterdir())


def fmt_range(values: list[float], digits: int = 3) -> tuple[str, str, str]:
    if not values:
        return "-", "-", "-"
    return (
        f"{min(values):.{digits}f}",
        f"{statistics.median(values):.{digits}f}",
        f"{max(values):.{digits}f}",
    )


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


@contextlib.contextmanager
def timed(say: Callable[[str], None], what: str) -> Iterator[None]:
    t = time.perf_counter()
    yield
    say(f"{what}: {time.perf_counter() - t:.1f} s")


def describe_run(method: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{method}: FAILED ({r['error'][:300]})"
    text = f"{method}: {r['seconds']:.3f} s (CPU {r['cpu_seconds']:.3f} s), {r['rss_mib']:.0f} MiB"
    if "scans" in r:
        text += f", {r['read']} segments read, {r['indexed']} from the index (+{r['added']})"
    return text + f" (process {r['process_seconds']:.2f} s)"


def target_line(
    what: str,
    results: list[dict[str, Any]],
    seconds: float,
    mib: float | None,
    *,
    verdict: bool = True,
) -> str:
    """The figures of one target, and whether it is met (``verdict``)."""
    ok_runs = [r for r in results if "error" not in r]
    if not ok_runs:
        return f"{what}: no successful run" + (" - target NOT met" if verdict else "")
    times = [r["seconds"] for r in ok_runs]
    med = statistics.median(times)
    rss = max(r["rss_mib"] for r in ok_runs)
    met = med < seconds and len(ok_runs) == len(results)
    text = (
        f"{what}: median {med:.3f} s (min {min(times):.3f}, max {max(times):.3f}; "
        f"{sum(t < seconds for t in times)}/{len(results)} runs under {seconds:g} s)"
    )
    if mib is not None:
        met = met and rss < mib
        text += f", peak RSS {rss:.0f} MiB"
        goal = f"< {seconds:g} s and < {mib:.0f} MB"
    else:
        goal = f"< {seconds:g} s"
    if not verdict:
        return text
    return f"{text} - target {goal}: {'met' if met else 'NOT met'}"


def launcher(args: argparse.Namespace) -> int:
    def say(msg: str) -> None:
        print(msg, flush=True)

    shape = Shape(args.segments, args.backups)
    problem = shape.problem()
    if problem:
        say(f"refusing to run: {problem}")
        return 2
    root = Path(args.dir).resolve()
    manifest = load_manifest(root, shape)
    reason = check_space(root, shape, reuse=manifest is not None)
    if reason:
        say(f"refusing to run: {reason}")
        return 2
    if manifest is None and not ours(root):
        say(
            f"refusing to run: {root} exists and was not made by this script "
            f"(no {MANIFEST}); choose another --dir"
        )
        return 2

    say(f"bench_fleet: {machine()}")
    say(f"{source_state()}; data in {root} ({filesystem(root)})")
    common = ["--dir", str(root), "--segments", str(args.segments), "--backups", str(args.backups)]
    if args.bindir:
        common += ["--bindir", args.bindir]

    if manifest is None:
        if root.exists():
            with timed(say, f"removing the old data in {root}"):
                shutil.rmtree(root)
        say(f"generating {args.segments:,} segments and {args.backups:,} backups in {root} ...")
        t = time.perf_counter()
        code, _ = run_child(["--worker", "generate", *common], capture=False, timeout=7200)
        if code != 0:
            say(f"generation failed (exit {code})")
            return 1
        manifest = load_manifest(root, shape)
        assert manifest is not None
        say(f"generation: {time.perf_counter() - t:.1f} s")
    else:
        say(f"reusing the data generated {manifest['generated']}")
    s = manifest["seconds"]
    say(
        f"  (generation took {s['total']:.1f} s: sparse segments {s['sparse']:.1f} s, "
        f"real WAL {s['real']:.1f} s, catalog and .backup files {s['catalog']:.1f} s)"
    )
    real = manifest["last"] - manifest["real_first"] + 1
    disk = manifest["disk_bytes"]
    say(
        f"archive: {args.segments:,} segment files of 16 MiB ({args.segments * SEG / 1e12:.1f} TB "
        f"apparent) on timelines 1, 2, 3 (forks at segments {shape.fork1:,} and "
        f"{shape.fork2:,}), 2 .history files, {args.backups:,} .backup files; "
        f"{disk['archive'] / MiB:,.0f} MiB on disk"
    )
    say(
        f"  real WAL: {real} segments {seg_name(3, manifest['real_first'])}.."
        f"{seg_name(3, manifest['last'])} (system identifier {manifest['system_identifier']}, "
        f"{manifest['real_wal_bytes'] / 1024:,.0f} KiB of records), the rest sparse"
    )
    nb = manifest["newest_backup"]
    say(
        f"catalog: {args.backups:,} DONE records, {disk['catalog'] / MiB:,.1f} MiB on disk; "
        f"newest backup starts at {nb['start_lsn']} ({nb['start_time']}), stops {nb['stop_time']}"
    )
    say(
        f"time target: {target_time(shape).isoformat()} (newest backup's stop + 10 min, or "
        "the newest segment's start if sooner)"
    )
    say(
        f"runs: {args.runs} of each, order rotated; launcher's own peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    say("")

    methods = list(METHODS)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    index_after_cold: dict[str, tuple[int, int]] = {}
    catalog_db: dict[str, Any] | None = None
    if args.catalog == "postgres":
        methods = [m for m in methods if m not in DIRECTORY_ONLY]
        t = time.perf_counter()
        db = measure("catalog-db", common)
        if "error" in db or "conninfo" not in db:
            say(f"the catalog database did not start: {db.get('error')}\n{db.get('stderr', '')}")
            return 1
        catalog_db = db
        common += ["--catalog-conninfo", db["conninfo"]]
        say(
            f"catalog: PostgresCatalog, PostgreSQL {db['version']} (fsync on) in "
            f"{db['base_dir']}; {db['imported']:,} records imported in "
            f"{time.perf_counter() - t:.1f} s"
        )
    else:
        say("catalog: DirectoryCatalog")
    try:
        for n in range(args.runs):
            k = n % len(methods)
            order = methods[k:] + methods[:k]
            for method in order:
                if method.endswith("-cold"):
                    remove_index(root)
                elif method.endswith("-warm") or method.startswith("expiry-"):
                    which = "latest" if method.startswith("expiry-") else method.split("-")[1]
                    prime = measure("prime-" + which, common)
                    if "error" in prime:
                        say(f"round {n + 1}: priming for {method} FAILED: {prime['error'][:300]}")
                r = measure(method, common)
                results[method].append(r)
                if method.endswith("-cold") and "error" not in r:
                    index_after_cold[method] = index_size(root)
                say(f"round {n + 1}: {describe_run(method, r)}")
    finally:
        if not args.keep:
            remove_index(root)
        if catalog_db is not None:
            _stop_catalog_db(catalog_db)
    say("")
    say(report(results, index_after_cold, args))
    if not args.keep:
        with timed(say, f"removed {root} (--keep keeps it for the next run)"):
            shutil.rmtree(root, ignore_errors=True)
    return 0


def report(
    results: dict[str, list[dict[str, Any]]],
    index_after_cold: dict[str, tuple[int, int]],
    args: argparse.Namespace,
) -> str:
    out: list[str] = []
    rows = [
        [
            "measurement",
            "runs",
            "min s",
            "median s",
            "max s",
            "median CPU s",
            "peak RSS MiB (med, max)",
            "segments read / from index",
        ]
    ]
    for method, label in METHODS.items():
        rs = results[method]
        if not rs:  # not measured with this --catalog
            continue
        ok = [r for r in rs if "error" not in r]
        lo, med, hi = fmt_range([r["seconds"] for r in ok])
        cpu = fmt_range([r["cpu_seconds"] for r in ok])[1]
        rss = [r["rss_mib"] for r in ok]
        rss_text = f"{statistics.median(rss):.0f}, {max(rss):.0f}" if rss else "-"
        segs = "-"
        if ok and "scans" in ok[0]:
            segs = ", ".join(f"{r['read']}/{r['indexed']}" for r in ok)
        failed = len(rs) - len(ok)
        out_runs = f"{len(ok)}" + (f" ({failed} FAILED)" if failed else "")
        rows.append([label, out_runs, lo, med, hi, cpu, rss_text, segs])
    out.append(table(rows))
    out.append("")

    for which in ("latest", "time"):
        runs = [r for m in (f"rec-{which}-cold", f"rec-{which}-warm") for r in results[m]]
        ok = [r for r in runs if "error" not in r]
        if ok:
            first = ok[0]
            same = all(
                (r["summary"], r["warnings"]) == (first["summary"], first["warnings"]) for r in ok
            )
            out.append(
                f"plan ({which}): backup {first['backup']}; "
                + (
                    "every run gave the same plan summary and warnings"
                    if same
                    else "MISMATCH "
                    "between runs: " + "; ".join(f"{r['backup']} {r['warnings']}" for r in ok)
                )
            )
            out.append(
                f"  target {first['summary'].get('target')}; consistent from "
                f"{first['summary'].get('consistent from')}; recoverable to "
                f"{first['summary'].get('recoverable to')}"
            )
            out.append(f"  warnings: {first['warnings'] or 'none'}")
            logged = sorted({w for r in ok for w in r.get("log_warnings", [])})
            if logged:
                out.append(f"  logged warnings: {logged[:5]}")
        for r in runs:
            if "error" in r:
                out.append(f"plan ({which}) FAILED: {r['error'][:600]}")
        cold = index_after_cold.get(f"rec-{which}-cold")
        if cold:
            out.append(f"  WAL index after a cold plan: {cold[0]} files, {cold[1] / 1024:,.0f} KiB")
    bp = results["backup-plan"]
    for r in bp:
        if "error" in r:
            out.append(
                f"backup planning FAILED: {r['error'][:800]}"
                + (f" (server: {r['server']})" if "server" in r else "")
            )
    ok_bp = [r for r in bp if "error" not in r]
    if ok_bp:
        out.append(
            f"backup plan: {ok_bp[0]['backup']} ({ok_bp[0]['server']}); "
            f"warnings: {ok_bp[0]['warnings'] or 'none'}"
        )
    for m in ("catalog-list", "listdir", "index-build", "expiry-steady", "expiry-first"):
        ok = [r for r in results[m] if "error" not in r]
        if ok:
            out.append(f"{METHODS[m]}: {ok[0].get('items', '?'):,} items")
    ok = [r for r in results["read-tail"] if "error" not in r]
    if ok:
        out.append(
            f"{METHODS['read-tail']}: {ok[0]['items']} segments read, "
            f"{ok[0]['commits']} commits kept"
        )
    out.append("")

    n = f"{args.segments:,} segments, {args.backups:,} backups, {CATALOG_NAMES[args.catalog]}"
    out.append(
        target_line(
            f"recovery planning, latest, index warm ({n})",
            results["rec-latest-warm"],
            TARGET_RECOVERY_SECONDS,
            TARGET_RECOVERY_MIB,
        )
    )
    out.append(
        target_line(
            f"recovery planning, time target, index warm ({n})",
            results["rec-time-warm"],
            TARGET_RECOVERY_SECONDS,
            TARGET_RECOVERY_MIB,
        )
    )
    out.append(
        target_line(
            "(no target) recovery planning, latest, index cold",
            results["rec-latest-cold"],
            TARGET_RECOVERY_SECONDS,
            TARGET_RECOVERY_MIB,
            verdict=False,
        )
    )
    out.append(
        target_line(
            "(no target) recovery planning, time target, index cold",
            results["rec-time-cold"],
            TARGET_RECOVERY_SECONDS,
            TARGET_RECOVERY_MIB,
            verdict=False,
        )
    )
    out.append(
        target_line(
            f"backup planning, Cluster.plan_backup() ({n})",
            results["backup-plan"],
            TARGET_BACKUP_SECONDS,
            None,
        )
    )
    out.append(
        target_line(
            f"catalog, {CATALOG_NAMES[args.catalog]}.list() of {args.backups:,} records",
            results["catalog-list"],
            TARGET_CATALOG_SECONDS,
            None,
        )
    )
    for method, what in (
        ("expiry-steady", "10 backups deleted"),
        ("expiry-first", "a first expiry deleting most"),
    ):
        out.append(
            target_line(
                f"expiry planning, {what} ({n})",
                results[method],
                TARGET_EXPIRY_SECONDS,
                None,
            )
        )
    out.append(
        "(a target is met when the median is under it, every run succeeded and, for "
        "memory, the largest peak RSS is under 200 MiB)"
    )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/var/tmp/pgsnap-fleet", help="where the data lives")
    parser.add_argument("--segments", type=int, default=1_000_000)
    parser.add_argument("--backups", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the data for the next run")
    parser.add_argument("--bindir", help="PostgreSQL 15 binaries (default: as the tests find them)")
    parser.add_argument(
        "--catalog",
        choices=("directory", "postgres"),
        default="directory",
        help="the catalog planning reads: the directory catalog (default), or the same "
        "records imported into a PostgresCatalog on a throwaway PostgreSQL 15 server",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--catalog-conninfo", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.worker:
        return worker(args)
    return launcher(args)


if __name__ == "__main__":
    sys.exit(main())
