"""pgsnap.wal.reader agrees with PostgreSQL itself, on every major version 12-18.

Each test runs real servers (system PostgreSQL 15, npm builds of the others)
with 1 MB WAL segments, ``track_commit_timestamp = on`` and prepared
transactions enabled, drives a seeded random workload (commits, aborts,
subtransactions, prepared transactions committed and rolled back, DDL that
drops relations and their statistics, restore points, logical messages of up
to 2.5 MB that span pages and segments, WAL switches, checkpoints), then reads
the WAL with the reader and checks what it found against the servers:

- every transaction end it reports has the status the server gives its xid
  (``pg_xact_status``, ``txid_status`` on 12) and, for a commit, exactly the
  time of ``pg_xact_commit_timestamp``; every transaction the workload ended
  is reported, of the right kind, between the insert positions seen before
  and after it;
- the restore points are the ones created, in order, and each ends exactly
  where ``pg_create_restore_point`` said;
- across a point-in-time recovery to a restore point that promotes (timeline
  2: a shutdown checkpoint starts it) and a standby promoted with ``pg_ctl
  promote`` (timeline 3: an end-of-recovery record starts it), each path holds
  timeline 1's records up to the switchpoint, the switch, the record that
  starts the new timeline, and the new timeline's records;
- on a crashed primary's pg_wal (recycled and zero-filled segments after the
  last record) the end of valid WAL is where crash recovery ends: the last
  record is the one replay logs as "redo done at", and the server goes on
  writing exactly at the reported end;
- on 15, everything agrees with ``pg_waldump`` record for record, and the
  number of records read equals the number of records it prints;
- a record whose continuation was lost and overwritten
  (``XLOG_OVERWRITE_CONTRECORD``) is skipped as replay skips it.
"""

from __future__ import annotations

import datetime as dt
import gzip
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgsnap.model import LSN
from pgsnap.testing.pgserver import PgServer
from pgsnap.wal import TimelineSpan, segment_name
from pgsnap.wal import reader as walreader
from pgsnap.wal.archive import DirectoryWalArchive
from pgsnap.wal.reader import (
    CheckpointRecord,
    EndOfRecoveryRecord,
    EndOfWal,
    OverwriteContrecordRecord,
    RestorePointRecord,
    ScanEnd,
    SegmentRead,
    StopReason,
    SwitchRecord,
    TimelineSwitch,
    XactKind,
    XactRecord,
)

pytestmark = pytest.mark.postgres

MB = 1024 * 1024
MAJORS = (12, 13, 14, 15, 16, 17, 18)
WALDUMP_15 = Path("/usr/lib/postgresql/15/bin/pg_waldump")
LSN_MAX = LSN(2**64 - 1)
SETTINGS = {
    "max_prepared_transactions": 10,
    "track_commit_timestamp": True,
    "autovacuum": False,
}


# --------------------------------------------------------------------------- workload


@dataclass
class Ended:
    """A transaction the workload ended, and the WAL insert positions around its end."""

    kind: XactKind
    xid: int
    before: LSN
    after: LSN


@dataclass
class Workload:
    """A seeded random workload on one server; remembers what it did."""

    server: PgServer
    rng: random.Random
    tag: str
    ended: list[Ended] = field(default_factory=list)
    points: list[tuple[str, LSN]] = field(default_factory=list)
    prepared: list[tuple[str, int, str | None]] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    messages: list[tuple[LSN, LSN]] = field(default_factory=list)
    n: int = 0

    def run(self, conn: psycopg.Connection[Any], steps: int) -> None:
        conn.execute(f"CREATE TABLE IF NOT EXISTS t_{self.tag} (id serial, v text)")
        ops = [
            (self.commit, 30),
            (self.abort, 10),
            (self.subxacts, 6),
            (self.prepare, 8),
            (self.finish_prepared, 8),
            (self.restore_point, 6),
            (self.big_message, 5),
            (self.ddl, 5),
            (self.switch, 2),
            (self.checkpoint, 2),
        ]
        funcs, weights = zip(*ops, strict=True)
        if not self.ended:  # commit records that span pages, plain and prepared
            conn.execute("BEGIN")
            self._subxact_block(conn, 3000)
            self._end(conn, "COMMIT", XactKind.COMMIT, self._xid(conn))
            self.prepare(conn, "subxacts", 3000)
            gid, xid, _created = self.prepared.pop()
            self._end(conn, f"COMMIT PREPARED '{gid}'", XactKind.COMMIT_PREPARED, xid)
        for _ in range(steps):
            self.rng.choices(funcs, weights)[0](conn)
        while self.prepared:
            self.finish_prepared(conn)

    # ----------------------------------------------------------------- helpers

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.tag}_{self.n}"

    @staticmethod
    def _lsn(conn: psycopg.Connection[Any]) -> LSN:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        return LSN.parse(row[0])

    @staticmethod
    def _xid(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT txid_current() % 4294967296").fetchone()
        assert row is not None
        return int(row[0])

    def _end(self, conn: psycopg.Connection[Any], sql: str, kind: XactKind, xid: int) -> None:
        before = self._lsn(conn)
        conn.execute(sql)
        self.ended.append(Ended(kind, xid, before, self._lsn(conn)))

    def _insert(self, conn: psycopg.Connection[Any]) -> None:
        size = self.rng.choice((1, 10, 100, 3000))
        conn.execute(f"INSERT INTO t_{self.tag} (v) VALUES (repeat('x', %s))", (size,))

    # ----------------------------------------------------------------- operations

    def commit(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("BEGIN")
        self._insert(conn)
        self._end(conn, "COMMIT", XactKind.COMMIT, self._xid(conn))

    def abort(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("BEGIN")
        self._insert(conn)
        self._end(conn, "ROLLBACK", XactKind.ABORT, self._xid(conn))

    def _subxact_block(self, conn: psycopg.Connection[Any], count: int | None = None) -> None:
        # Each BEGIN ... EXCEPTION block is a subtransaction; every third one fails
        # (its own abort record); the others end up in the commit record's list.
        count = count or self.rng.choice((3, 70, 700))
        conn.execute(
            f"""DO $$ BEGIN FOR i IN 1..{count} LOOP
                  BEGIN
                    INSERT INTO t_{self.tag} (v) VALUES ('s');
                    IF i % 3 = 0 THEN RAISE EXCEPTION 'rolled back'; END IF;
                  EXCEPTION WHEN raise_exception THEN NULL;
                  END;
                END LOOP; END $$"""
        )

    def subxacts(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("BEGIN")
        self._subxact_block(conn)
        xid = self._xid(conn)
        if self.rng.random() < 0.7:
            self._end(conn, "COMMIT", XactKind.COMMIT, xid)
        else:
            self._end(conn, "ROLLBACK", XactKind.ABORT, xid)

    def prepare(
        self, conn: psycopg.Connection[Any], what: str | None = None, count: int | None = None
    ) -> None:
        if len(self.prepared) >= 8:
            self.finish_prepared(conn)
            return
        gid = self._name("gid")
        conn.execute("BEGIN")
        what = what or self.rng.choice(("insert", "create", "drop", "subxacts"))
        created = None
        if what == "create" or (what == "drop" and not self.tables):
            created = self._name("p")
            conn.execute(f"CREATE TABLE {created} (x int)")
            conn.execute(f"INSERT INTO {created} VALUES (1)")
        elif what == "drop":
            conn.execute(f"DROP TABLE {self.tables.pop(0)}")
        elif what == "subxacts":
            self._subxact_block(conn, count)
        else:
            self._insert(conn)
        conn.execute(f"PREPARE TRANSACTION '{gid}'")
        row = conn.execute(
            "SELECT transaction::text FROM pg_prepared_xacts WHERE gid = %s", (gid,)
        ).fetchone()
        assert row is not None
        self.prepared.append((gid, int(row[0]), created))

    def finish_prepared(self, conn: psycopg.Connection[Any]) -> None:
        if not self.prepared:
            self.commit(conn)
            return
        gid, xid, created = self.prepared.pop(self.rng.randrange(len(self.prepared)))
        if self.rng.random() < 0.6:
            self._end(conn, f"COMMIT PREPARED '{gid}'", XactKind.COMMIT_PREPARED, xid)
            if created is not None:
                self.tables.append(created)
        else:
            self._end(conn, f"ROLLBACK PREPARED '{gid}'", XactKind.ABORT_PREPARED, xid)

    def restore_point(self, conn: psycopg.Connection[Any]) -> None:
        name = self._name(self.rng.choice(("rp", "point é", "x" * 40)))
        row = conn.execute("SELECT pg_create_restore_point(%s)::text", (name,)).fetchone()
        assert row is not None
        self.points.append((name, LSN.parse(row[0])))

    def big_message(self, conn: psycopg.Connection[Any]) -> None:
        size = self.rng.choice((9000, 200_000, 1_500_000, 2_500_000))
        transactional = self.rng.random() < 0.7
        conn.execute("BEGIN")
        before = self._lsn(conn)
        conn.execute(
            "SELECT pg_logical_emit_message(%s, 'pgsnap', repeat(md5(%s), %s))",
            (transactional, str(self.rng.random()), size // 32),
        )
        self.messages.append((before, self._lsn(conn)))
        if transactional:
            self._end(conn, "COMMIT", XactKind.COMMIT, self._xid(conn))
        else:
            conn.execute("COMMIT")

    def ddl(self, conn: psycopg.Connection[Any]) -> None:
        table = self._name("d")
        conn.execute(f"CREATE TABLE {table} (x int)")
        conn.execute(f"INSERT INTO {table} VALUES (1)")
        if self.rng.random() < 0.5:
            conn.execute(f"DROP TABLE {table}")
        else:
            self.tables.append(table)

    def switch(self, conn: psycopg.Connection[Any]) -> None:
        self._insert(conn)
        conn.execute("SELECT pg_switch_wal()")

    def checkpoint(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute("CHECKPOINT")


# --------------------------------------------------------------------------- checks


def scan(dirs: list[Path], spans: list[TimelineSpan], start: LSN, end: LSN = LSN_MAX, **kw):
    items = list(walreader.read_wal([str(d) for d in dirs], spans, start, end, **kw))
    assert isinstance(items[-1], ScanEnd)
    assert not any(isinstance(i, ScanEnd) for i in items[:-1])
    return items


def of(items: list[Any], kind: type) -> list[Any]:
    return [i for i in items if isinstance(i, kind)]


def check_with_server(server: PgServer, xacts: list[XactRecord]) -> None:
    """Each reported transaction end has the server's status and commit time."""
    assert xacts
    status = "pg_xact_status(x::text::xid8)" if server.major >= 13 else "txid_status(x)"
    rows = server.sql(
        f"SELECT x, {status}, pg_xact_commit_timestamp(x::text::xid) "
        "FROM unnest(%s::bigint[]) AS x",
        ([x.xid for x in xacts],),
    )
    truth = {int(x): (s, t) for x, s, t in rows}
    bad = []
    for x in xacts:
        state, when = truth[x.xid]
        if x.kind.committed:
            if state != "committed" or when != x.time:
                bad.append((x, state, when))
        elif state != "aborted":
            bad.append((x, state, when))
    assert not bad, f"{len(bad)} of {len(xacts)} disagree with the server, first: {bad[:3]}"


def check_workload(work: Workload, items: list[Any]) -> None:
    """Everything the workload ended and every restore point it made is reported, right."""
    xacts = {(x.kind, x.xid): x for x in of(items, XactRecord)}
    missing = []
    for e in work.ended:
        x = xacts.get((e.kind, e.xid))
        if x is None or not (e.before <= x.lsn < x.end_lsn <= e.after):
            missing.append((e, x))
    assert not missing, f"{len(missing)} of {len(work.ended)} not found, first: {missing[:3]}"
    points = [(p.name, p.end_lsn) for p in of(items, RestorePointRecord)]
    assert points == work.points
    for x in of(items, XactRecord):
        assert x.time.tzinfo is dt.UTC
        assert x.xid >= 3


# --------------------------------------------------------------------------- pg_waldump

_WALDUMP_LINE = re.compile(
    r"rmgr: (\w+)\s+len \(rec/tot\):\s+\d+/\s*\d+, tx:\s+(\d+), lsn: ([0-9A-F]+/[0-9A-F]+), "
    r"prev [0-9A-F]+/[0-9A-F]+, desc: (\w+) ?(.*)$"
)
_TIME = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC"


def waldump(
    view: Path, tli: int, start: LSN, end: LSN | None = None
) -> tuple[list[tuple[Any, ...]], int, str]:
    """(the records of the kinds the reader extracts, the number of records, stderr)."""
    argv = [str(WALDUMP_15), "-p", str(view), "-t", str(tli), "-s", str(start)]
    if end is not None:
        argv += ["-e", str(end)]
    proc = subprocess.run(argv, capture_output=True, text=True, env={"TZ": "UTC"}, check=False)
    out: list[tuple[Any, ...]] = []
    count = 0
    for line in proc.stdout.splitlines():
        m = _WALDUMP_LINE.match(line)
        assert m, line
        count += 1
        rmgr, tx, lsn, what, desc = m.groups()
        lsn = LSN.parse(lsn)
        if rmgr == "Transaction" and what in ("COMMIT", "ABORT"):
            when = re.match(_TIME, desc)
            assert when, line
            out.append((what.lower(), lsn, int(tx), _utc(when.group(1))))
        elif rmgr == "Transaction" and what in ("COMMIT_PREPARED", "ABORT_PREPARED"):
            p = re.match(r"(\d+): " + _TIME, desc)
            assert p, line
            out.append((what.lower(), lsn, int(p.group(1)), _utc(p.group(2))))
        elif rmgr == "XLOG" and what == "RESTORE_POINT":
            out.append(("restore_point", lsn, desc))
        elif rmgr == "XLOG" and what in ("CHECKPOINT_SHUTDOWN", "CHECKPOINT_ONLINE"):
            c = re.match(r"redo ([0-9A-F]+/[0-9A-F]+); tli (\d+); prev tli (\d+);", desc)
            assert c, line
            out.append((what.lower(), lsn, LSN.parse(c.group(1)), int(c.group(2)), int(c.group(3))))
        elif rmgr == "XLOG" and what == "END_OF_RECOVERY":
            c = re.match(r"tli (\d+); prev tli (\d+); time " + _TIME, desc)
            assert c, line
            out.append(("end_of_recovery", lsn, int(c.group(1)), int(c.group(2)), _utc(c.group(3))))
        elif rmgr == "XLOG" and what == "SWITCH":
            out.append(("switch", lsn))
        elif rmgr == "XLOG" and what == "OVERWRITE_CONTRECORD":
            c = re.match(r"lsn ([0-9A-F]+/[0-9A-F]+); time " + _TIME, desc)
            assert c, line
            out.append(("overwrite_contrecord", lsn, LSN.parse(c.group(1)), _utc(c.group(2))))
    return out, count, proc.stderr


def _utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def as_waldump(items: list[Any]) -> list[tuple[Any, ...]]:
    """The reader's records in the form :func:`waldump` gives."""
    out: list[tuple[Any, ...]] = []
    for i in items:
        if isinstance(i, XactRecord):
            kind = {XactKind.COMMIT: "commit", XactKind.ABORT: "abort"}.get(i.kind, i.kind.value)
            out.append((kind, i.lsn, i.xid, i.time))
        elif isinstance(i, RestorePointRecord):
            out.append(("restore_point", i.lsn, i.name))
        elif isinstance(i, CheckpointRecord):
            what = "checkpoint_shutdown" if i.shutdown else "checkpoint_online"
            out.append((what, i.lsn, i.redo, i.this_timeline, i.prev_timeline))
        elif isinstance(i, EndOfRecoveryRecord):
            out.append(("end_of_recovery", i.lsn, i.this_timeline, i.prev_timeline, i.time))
        elif isinstance(i, SwitchRecord):
            out.append(("switch", i.lsn))
        elif isinstance(i, OverwriteContrecordRecord):
            out.append(("overwrite_contrecord", i.lsn, i.overwritten_lsn, i.time))
    return out


def segment_view(tmp: Path, dirs: list[Path], tli: int) -> Path:
    """A directory of links to the plain segments of ``tli`` in ``dirs`` (first wins)."""
    view = tmp / f"view-{tli}-{len(list(tmp.iterdir()))}"
    view.mkdir()
    for d in dirs:
        for f in sorted(d.iterdir()):
            if re.fullmatch(f"{tli:08X}[0-9A-F]{{16}}", f.name) and not (view / f.name).exists():
                (view / f.name).symlink_to(f)
    return view


def compare_with_waldump(tmp: Path, dirs: list[Path], tli: int, items: list[Any], start: LSN):
    """The reader and pg_waldump agree on records and the count of records read."""
    view = segment_view(tmp, dirs, tli)
    theirs, count, stderr = waldump(view, tli, start)
    ours = as_waldump(items)
    assert ours == theirs, (len(ours), len(theirs), stderr)
    end = items[-1]
    assert end.records == count
    eow = end.end_of_wal
    if eow is not None:
        m = re.search(r"error in WAL record at ([0-9A-F]+/[0-9A-F]+)", stderr)
        assert m, stderr
        assert eow.last_lsn == LSN.parse(m.group(1)), (eow, stderr)


# --------------------------------------------------------------------------- helpers


def backup_start(conn: psycopg.Connection[Any], major: int) -> LSN:
    sql = (
        "SELECT pg_backup_start('walreader', true)::text"
        if major >= 15
        else "SELECT pg_start_backup('walreader', true, false)::text"
    )
    row = conn.execute(sql).fetchone()
    assert row is not None
    return LSN.parse(row[0])


def backup_stop(conn: psycopg.Connection[Any], major: int) -> tuple[str, str]:
    sql = (
        "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
        if major >= 15
        else "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)"
    )
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0], row[1]


def segment_start_of(lsn: LSN, segsz: int = MB) -> LSN:
    return LSN(lsn.value - lsn.value % segsz)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("major", MAJORS)
def test_reader_agrees_with_the_server(pg_bindir_for, pg_server, tmp_path, major):
    bindir = pg_bindir_for(major)
    a = pg_server(bindir, wal_segsize_mb=1, settings=SETTINGS)
    a.start()
    assert a.major == major
    archive = a.archive_dir
    rng = random.Random(1000 + major)
    a.sql("SELECT pg_switch_wal()")
    first = segment_start_of(LSN.parse(a.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]))
    w1 = Workload(a, rng, "a")
    b = pg_server.prepare(bindir, archive_dir=archive, settings=SETTINGS)
    c = pg_server.prepare(bindir, archive_dir=archive, settings=SETTINGS)
    with a.connect() as conn:
        w1.run(conn, 40)
        # A base backup in the middle of the workload, restored into b and c later.
        start = backup_start(conn, major)
        b.copy_data_from(a.data_dir)
        c.copy_data_from(a.data_dir)
        labelfile, spcmapfile = backup_stop(conn, major)
        w1.run(conn, 40)
        target = w1._lsn(conn)
        conn.execute("SELECT pg_create_restore_point('pitr-target')")
        w1.points.append(("pitr-target", w1._lsn(conn)))
        w1.run(conn, 20)  # timeline 1 only: not on timeline 2's path
        conn.execute("SELECT pg_switch_wal()")
    a.wait_for_archive_idle()
    # The workload's last transactions are in pg_wal only: crash the primary (after
    # a checkpoint recycled old segments into future names), on odd versions right
    # after a WAL switch (the next segment is recycled: a stale page address).
    with a.connect() as conn:
        conn.execute("CHECKPOINT")
        w1.commit(conn)
        w1.restore_point(conn)
        w1.commit(conn)
        if major % 2:
            conn.execute("SELECT pg_switch_wal()")
    a.wait_for_archive_idle()  # no copy into the archive is cut short by the crash
    a.stop(mode="immediate")
    crashed = tmp_path / "crashed-pg_wal"
    shutil.copytree(a.wal_dir, crashed, ignore=shutil.ignore_patterns("archive_status"))
    names = sorted(p.name for p in crashed.iterdir())

    # ---- timeline 1, archive + the crashed pg_wal, to the end of valid WAL
    items1 = scan([archive, crashed], [TimelineSpan(1, None, None)], first)
    end1 = items1[-1]
    assert end1.reason is StopReason.END_OF_WAL, end1
    eow = end1.end_of_wal
    assert isinstance(eow, EndOfWal) and items1[-2] == eow
    assert eow.last_lsn is not None and eow.last_lsn < eow.lsn <= eow.found_at
    # The segments after the one where the WAL ends were recycled or zero-filled.
    last_name = segment_name(1, (eow.lsn.value - 1) // MB, MB)
    assert any(n > last_name for n in names), (" ".join(names), last_name, eow)
    check_workload(w1, items1)
    reads = of(items1, SegmentRead)
    # Every segment up to the end was read (one whose first page is bad is not "read").
    last_read = (eow.found_at.value - (1 if eow.found_at.value % MB == 0 else 0)) // MB
    assert [r.segno for r in reads] == list(range(first.value // MB, last_read + 1))
    assert {r.major for r in reads} == {major}
    assert len({r.system_identifier for r in reads}) == 1
    assert of(items1, SwitchRecord), "the workload switched WAL segments"
    # Records spanning segments (messages) were skipped and records spanning pages
    # (commits of thousands of subtransactions) decoded.
    assert any(lo.value // MB < hi.value // MB for lo, hi in w1.messages)
    spanning = [x for x in of(items1, XactRecord) if x.end_lsn - x.lsn > 8000]
    assert {x.kind for x in spanning} >= {XactKind.COMMIT, XactKind.COMMIT_PREPARED}

    if major == 15:  # before the restarted primary archives more of timeline 1
        compare_with_waldump(tmp_path, [archive, crashed], 1, items1, first)

    # Crash recovery ends where the reader says the valid WAL ends.
    a.start()
    m = re.search(r"redo done at ([0-9A-F]+/[0-9A-F]+)", a.log_text())
    assert m, a.log_text()[-3000:]
    assert LSN.parse(m.group(1)) == eow.last_lsn
    check_with_server(a, of(items1, XactRecord))
    sysid = int(a.sql("SELECT system_identifier FROM pg_control_system()")[0][0])
    assert reads[0].system_identifier == sysid
    a.stop()
    after = scan([archive, a.wal_dir], [TimelineSpan(1, None, None)], eow.lsn)
    first_new = next((i for i in after if isinstance(i, CheckpointRecord | XactRecord)), after)
    header = 40 if eow.lsn.value % MB == 0 else 24 if eow.lsn.value % 8192 == 0 else 0
    assert first_new.lsn == eow.lsn + header, (first_new, eow)

    # ---- the promotion: b recovers to 'pitr-target' and starts timeline 2
    b.write_backup_label(labelfile, spcmapfile)
    b.enable_recovery(recovery_target_name="pitr-target", recovery_target_action="promote")
    b.start()
    b.wait_for_promotion()
    b.wait_for_archived("00000002.history")
    w2 = Workload(b, random.Random(2000 + major), "b")
    with b.connect() as conn:
        w2.run(conn, 30)
    b.stop()
    graph = DirectoryWalArchive(archive).histories()
    path = list(graph.path(2))
    assert [s.timeline for s in path] == [1, 2]
    switch = path[0].end
    assert switch is not None and target < switch
    items2 = scan([archive, b.wal_dir], path, start)
    assert items2[-1].reason is StopReason.END_OF_WAL
    x2 = of(items2, XactRecord)
    # The planner's view: scan_events over the same stretch, read while b is still
    # stopped (a running server writes more WAL into the directory being read).
    events = walreader.scan_events([str(archive), str(b.wal_dir)], path, start, LSN_MAX)
    assert events.complete and events.end_of_wal == items2[-1].end_of_wal.lsn
    assert [e[2] for e in events.commits] == [x.xid for x in x2 if x.kind.committed]
    assert events.restore_point("pitr-target") is not None
    b.start()
    check_with_server(b, x2)
    check_workload(w2, [i for i in items2[:-1] if i.lsn >= switch])
    # Timeline 1's records up to the switchpoint are those read before.
    before = [i for i in as_waldump(items1) if start <= i[1] < switch]
    assert [i for i in as_waldump(items2) if i[1] < switch] == before
    points = [(i.name, i.timeline) for i in of(items2, RestorePointRecord) if i.lsn < switch]
    assert points[-1] == ("pitr-target", 1)
    assert of(items2, TimelineSwitch) == [TimelineSwitch(switch, 1, 2)]
    first2 = next(
        i for i in items2 if not isinstance(i, SegmentRead | TimelineSwitch) and i.lsn >= switch
    )
    if isinstance(first2, EndOfRecoveryRecord):
        assert (first2.this_timeline, first2.prev_timeline) == (2, 1)
    else:
        assert isinstance(first2, CheckpointRecord) and first2.shutdown, first2
        assert (first2.this_timeline, first2.prev_timeline) == (2, 1)
    assert first2.timeline == 2
    assert all(x.timeline == (1 if x.lsn < switch else 2) for x in x2)

    # ---- a standby promoted with pg_ctl promote: an end-of-recovery record starts
    # timeline 3 (2 is taken) after all of timeline 1 the archive holds.
    c.write_backup_label(labelfile, spcmapfile)
    c.enable_recovery(standby=True, recovery_target_timeline="1")
    c.start()
    last_archived = max(
        int(f.name[8:], 16)
        for f in archive.iterdir()
        if re.fullmatch("00000001[0-9A-F]{16}", f.name)
    )
    replayed = None
    while True:  # until the standby has replayed all it can find (in the last segment)
        time.sleep(0.5)
        now = c.sql("SELECT pg_last_wal_replay_lsn()::text")[0][0]
        if now is not None and now == replayed and LSN.parse(now).value // MB >= last_archived:
            break
        replayed = now
    c.pg_ctl("promote", "-w")
    c.wait_for_promotion()
    c.wait_for_archived("00000003.history")
    w3 = Workload(c, random.Random(3000 + major), "c")
    with c.connect() as conn:
        w3.run(conn, 10)
    c.stop()
    path3 = list(DirectoryWalArchive(archive).histories().path(3))
    assert [s.timeline for s in path3] == [1, 3]
    switch3 = path3[0].end
    assert switch3 is not None and switch3 > switch
    items3 = scan([archive, c.wal_dir], path3, start)
    assert items3[-1].reason is StopReason.END_OF_WAL
    assert of(items3, TimelineSwitch) == [TimelineSwitch(switch3, 1, 3)]
    # Timeline 1 as read before, up to where it was read (the restarted primary wrote
    # and archived more of it, which the standby replayed too).
    upto = min(switch3, eow.lsn)
    before3 = [i for i in as_waldump(items1) if start <= i[1] < upto]
    assert [i for i in as_waldump(items3) if i[1] < upto] == before3
    eor = next(i for i in items3 if isinstance(i, EndOfRecoveryRecord))
    gap = 40 if switch3.value % MB == 0 else 24 if switch3.value % 8192 == 0 else 0
    assert (eor.lsn, eor.this_timeline, eor.prev_timeline) == (switch3 + gap, 3, 1)
    assert eor.timeline == 3
    c.start()
    check_with_server(c, [x for x in of(items3, XactRecord) if x.lsn >= switch3])
    check_workload(w3, [i for i in items3[:-1] if i.lsn >= switch3])

    if major == 15:
        s_items = scan([archive, b.wal_dir], [TimelineSpan(2, switch, None)], switch)
        compare_with_waldump(tmp_path, [archive, b.wal_dir], 2, s_items, switch)


@pytest.mark.parametrize("major", [12, 15, 18])
def test_overwritten_contrecord_is_skipped(pg_bindir_for, pg_server, tmp_path, major):
    """A record whose continuation was lost (the segment removed after a crash) is
    skipped as replay skips it: crash recovery writes XLOG_OVERWRITE_CONTRECORD
    where the continuation was, and the reader reports that and goes on."""
    server = pg_server(pg_bindir_for(major), wal_segsize_mb=1, settings=SETTINGS)
    server.start()
    server.sql("CREATE TABLE filler (a int, b text)")
    # Fill the current segment to two pages from its end (as PostgreSQL's own test
    # 026_overwrite_contrecord does), then a message that spans into the next one.
    server.sql(
        """DO $$ DECLARE remain int; BEGIN LOOP
             INSERT INTO filler SELECT g, 'x' FROM generate_series(1, 10) g;
             remain := 1048576 - (pg_current_wal_insert_lsn() - '0/0') % 1048576;
             EXIT WHEN remain < 2 * 8192;
           END LOOP; END $$"""
    )
    lsn0 = LSN.parse(server.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    server.sql("SELECT pg_logical_emit_message(true, 'pgsnap', repeat('xyzxz', 123456))")
    lsn1 = LSN.parse(server.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    assert lsn1.value // MB == lsn0.value // MB + 1
    server.wait_for_archive_idle()  # the first segment, complete, is archived whole
    server.stop(mode="immediate")
    lost = server.wal_dir / segment_name(1, lsn1.value // MB, MB)
    lost.unlink()
    server.start()
    server.sql("CREATE TABLE foo (a text); INSERT INTO foo VALUES ('hello')")
    xid = int(server.sql("SELECT xmin::text FROM foo")[0][0])
    server.stop()
    dirs = [server.archive_dir, server.wal_dir]
    items = scan(dirs, [TimelineSpan(1, None, None)], segment_start_of(lsn0))
    over = of(items, OverwriteContrecordRecord)
    assert len(over) == 1, items
    assert over[0].lsn == LSN(lsn1.value // MB * MB + 40)
    assert lsn0 <= over[0].overwritten_lsn < over[0].lsn
    assert xid in [x.xid for x in of(items, XactRecord) if x.kind is XactKind.COMMIT]
    if major == 15:
        compare_with_waldump(tmp_path, dirs, 1, items, segment_start_of(lsn0))


def test_compressed_archive_reads_the_same(pg_server, tmp_path):
    """gzip, zstd and lz4 copies of an archive give the same records as the plain one."""
    server = pg_server(wal_segsize_mb=1, settings=SETTINGS)
    server.start()
    w = Workload(server, random.Random(7), "c")
    first = segment_start_of(
        LSN.parse(server.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0])
    )
    with server.connect() as conn:
        w.run(conn, 60)
        conn.execute("SELECT pg_switch_wal()")
    server.wait_for_archive_idle()
    server.stop()
    plain = scan([server.archive_dir], [TimelineSpan(1, None, None)], first)
    assert plain[-1].reason is StopReason.MISSING_SEGMENT
    packed = tmp_path / "packed"
    packed.mkdir()
    expected = {}
    for f in sorted(server.archive_dir.iterdir()):
        how = ("gz", "zst", "lz4", "plain")[(int(f.name[16:24], 16) - first.value // MB) % 4]
        target = packed / (f.name if how == "plain" else f"{f.name}.{how}")
        if how == "gz":
            target.write_bytes(gzip.compress(f.read_bytes(), 1))
        elif how == "plain":
            shutil.copy(f, target)
        else:
            tool = {"zst": ["zstd", "-q", "-1", "-o"], "lz4": ["lz4", "-q", "-1"]}[how]
            args = [str(target), str(f)] if how == "zst" else [str(f), str(target)]
            subprocess.run([*tool, *args], check=True)
        expected[f.name] = str(target)
    again = scan([packed], [TimelineSpan(1, None, None)], first)
    strip = [i for i in plain if not isinstance(i, SegmentRead)]
    assert [i for i in again if not isinstance(i, SegmentRead)] == strip
    reads = of(again, SegmentRead)
    assert len(reads) >= 4, reads
    assert [r.path for r in reads] == [expected[r.name] for r in reads]
