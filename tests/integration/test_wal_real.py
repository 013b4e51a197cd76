"""pgsnap.wal agrees with PostgreSQL itself.

Every test here runs real servers (system PostgreSQL 15, and the npm builds for
the other majors): WAL file names against ``pg_walfile_name[_offset]`` with both
boundary rules, real ``.backup`` and ``.history`` files, and a real archive
with a hole in it.
"""

from __future__ import annotations

import random
import re
from typing import Any

import psycopg
import pytest

from pgsnap import wal
from pgsnap.errors import TimelineError
from pgsnap.model import LSN
from pgsnap.testing.pgserver import PgServer, ServerCommandError

pytestmark = pytest.mark.postgres

MB = 1024 * 1024
U64 = 0xFFFFFFFFFFFFFFFF


# --------------------------------------------------------------------------- helpers


def lsn_samples(segsz: int, *, seed: int, n_random: int = 1000) -> list[int]:
    """Boundary cases plus ``n_random`` seeded random LSNs (as integers)."""
    per_id = 0x100000000 // segsz
    values = {0, 1, 0x28, segsz - 1, 0xFFFFFFFF, 0x100000000, U64, U64 - 1, U64 - segsz}
    for seg in (*range(1, 9), per_id - 1, per_id, per_id + 1, 2 * per_id):
        start = seg * segsz
        values.update({start - 1, start, start + 1})
    for xlogid in (1, 2, 0x16, 0xFF, 0x100, 0xFFFF, 0xFFFFFFFE, 0xFFFFFFFF):
        start = xlogid << 32
        values.update({start - 1, start, start + 1, start + 0xFFFFFFFF})
    rng = random.Random(seed)
    for i in range(n_random):
        kind = i % 4
        if kind == 0:
            values.add(rng.getrandbits(64))
        elif kind == 1:
            values.add(rng.getrandbits(36))  # realistic: small log ids
        else:  # segment starts and their neighbours
            start = rng.randrange(1, (U64 + 1) // segsz) * segsz
            values.add(start + (kind - 2) * rng.choice((-1, 0, 1)))
    return sorted(v for v in values if 0 <= v <= U64)


def compare_walfile_names(server: PgServer, segsz: int, seed: int) -> int:
    """Compare pgsnap.wal with pg_walfile_name[_offset] for many LSNs; return how many."""
    previous = server.major <= 16
    values = lsn_samples(segsz, seed=seed)
    texts = [str(LSN(v)) for v in values]
    rows = server.sql(
        "SELECT x, pg_walfile_name(x::pg_lsn), o.file_name, o.file_offset "
        "FROM unnest(%s::text[]) AS x, pg_walfile_name_offset(x::pg_lsn) AS o",
        (texts,),
    )
    assert len(rows) == len(values)
    by_text = {str(LSN(v)): v for v in values}
    bad: list[tuple[object, ...]] = []
    for text, name, off_name, offset in rows:
        v = by_text[text]
        ours = wal.walfile_name(LSN(v), 1, segsz, previous_at_boundary=previous)
        ours_name, ours_offset = wal.walfile_name_offset(
            LSN(v), 1, segsz, previous_at_boundary=previous
        )
        if (ours, ours_name, ours_offset) != (name, off_name, offset):
            bad.append((text, (name, off_name, offset), (ours, ours_name, ours_offset)))
        tli, segno = wal.parse_segment_name(name, segsz)
        if tli != 1 or wal.segment_name(tli, segno, segsz) != name:
            bad.append((text, name, "round trip", tli, segno))
    assert not bad, f"{len(bad)} mismatches (server, pgsnap), first: {bad[:5]}"
    return len(rows)


def backup_start(conn: psycopg.Connection[Any], major: int, label: str) -> LSN:
    if major >= 15:
        row = conn.execute("SELECT pg_backup_start(%s, true)::text", (label,)).fetchone()
    else:
        row = conn.execute("SELECT pg_start_backup(%s, true, false)::text", (label,)).fetchone()
    assert row is not None
    return LSN.parse(row[0])


def backup_stop(conn: psycopg.Connection[Any], major: int) -> tuple[LSN, str, str]:
    if major >= 15:
        sql = "SELECT lsn::text, labelfile, spcmapfile FROM pg_backup_stop(false)"
    else:
        sql = "SELECT lsn::text, labelfile, spcmapfile FROM pg_stop_backup(false, false)"
    row = conn.execute(sql).fetchone()
    assert row is not None
    lsn, labelfile, spcmapfile = row
    return LSN.parse(lsn), labelfile, spcmapfile


def current_timeline(server: PgServer) -> int:
    """The timeline in pg_control after a checkpoint (what the server reports)."""
    server.sql("CHECKPOINT")
    return int(server.sql("SELECT timeline_id FROM pg_control_checkpoint()")[0][0])


def restore_point(server: PgServer, name: str) -> LSN:
    return LSN.parse(server.sql("SELECT pg_create_restore_point(%s)::text", (name,))[0][0])


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("segsz_mb", [1, 16, 64])
def test_walfile_name_matches_pg15(pg_server, segsz_mb):
    server = pg_server(wal_segsize_mb=segsz_mb, archive=False, separate_wal_dir=False)
    server.start()
    assert server.wal_segment_size() == segsz_mb * MB
    assert compare_walfile_names(server, segsz_mb * MB, seed=segsz_mb) >= 1000


@pytest.mark.parametrize(
    ("major", "segsz_mb"),
    [(17, 1), (17, 16), (17, 64), (18, 16), (12, 16), (16, 1)],
)
def test_walfile_name_matches_other_versions(pg_bindir_for, pg_server, major, segsz_mb):
    """PG 17+ take the LSN at face value; 12 and 16 use the previous-file rule."""
    server = pg_server(
        pg_bindir_for(major), wal_segsize_mb=segsz_mb, archive=False, separate_wal_dir=False
    )
    server.start()
    assert server.major == major
    assert compare_walfile_names(server, segsz_mb * MB, seed=1000 + major) >= 1000


def test_boundary_rules_differ_on_real_servers(pg_bindir_for, pg_server):
    """The same boundary LSN names different files on 15 and 17, as pgsnap.wal says."""
    names = {}
    for major in (15, 17):
        server = pg_server(pg_bindir_for(major), archive=False, separate_wal_dir=False)
        server.start()
        names[major] = server.sql("SELECT pg_walfile_name('0/300000')")[0][0]
    assert names[15] == wal.walfile_name(LSN(3 * MB), 1, MB, previous_at_boundary=True)
    assert names[17] == wal.walfile_name(LSN(3 * MB), 1, MB)
    assert names == {15: "000000010000000000000002", 17: "000000010000000000000003"}


# --------------------------------------------------------------------------- .backup


@pytest.mark.parametrize("major", [15, 12, 17])
def test_real_backup_history_file(pg_bindir_for, pg_server, major):
    server = pg_server(pg_bindir_for(major))
    server.start()
    segsz = server.wal_segment_size()
    server.sql("CREATE TABLE t AS SELECT generate_series(1, 1000) AS x")
    label = "pgsnap: real .backup test"
    with server.connect() as conn:
        start = backup_start(conn, server.major, label)
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
        stop, labelfile, spcmapfile = backup_stop(conn, server.major)
    assert spcmapfile == ""

    name = wal.backup_file_name(start, 1, segsz)
    entry = wal.parse_archive_name(name)
    assert entry.kind is wal.WalFileKind.BACKUP
    assert entry.backup_offset == start.value % segsz
    server.switch_wal_and_wait_archived()
    server.wait_for_archived(name)
    text = (server.archive_dir / name).read_text()
    assert [n for n in server.archive_dir.iterdir() if n.name.endswith(".backup")] == [
        server.archive_dir / name
    ]

    bf = wal.parse_backup_file(text)
    assert bf.start_lsn == start
    assert bf.stop_lsn == stop
    assert bf.label == label
    assert bf.start_timeline == bf.stop_timeline == 1
    assert bf.start_wal_file == wal.walfile_name(start, 1, segsz)
    assert bf.stop_wal_file == wal.walfile_name(stop, 1, segsz)
    assert bf.backup_method == "streamed"
    assert bf.backup_from == ("master" if major <= 12 else "primary")
    assert bf.start_time is not None
    assert bf.stop_time is not None
    assert bf.start_time <= bf.stop_time
    assert not bf.is_incremental

    # The label file returned by the stop function says the same (no STOP lines).
    lb = wal.parse_backup_label(labelfile)
    assert (lb.start_lsn, lb.checkpoint_lsn, lb.label, lb.start_timeline) == (
        bf.start_lsn,
        bf.checkpoint_lsn,
        bf.label,
        bf.start_timeline,
    )
    assert lb.stop_lsn is None
    # The .backup file is the label plus STOP lines.
    assert set(labelfile.splitlines()) <= set(text.splitlines())
    # The checkpoint is the one the server made for the backup.
    redo = server.sql("SELECT redo_lsn::text FROM pg_control_checkpoint()")[0][0]
    assert LSN.parse(redo) >= bf.start_lsn


# --------------------------------------------------------------------------- .history


def _history_lines(text: str) -> list[tuple[int, LSN, str]]:
    """Independent reading of a history file: the non-blank lines' three fields."""
    out = []
    for line in text.splitlines():
        if line.strip():
            parent, switchpoint, reason = line.split("\t")
            out.append((int(parent), LSN.parse(switchpoint), reason))
    return out


@pytest.mark.parametrize("major", [15, 12, 18])
def test_real_timeline_histories(pg_bindir_for, pg_server, major):
    """Three PITRs from one base backup: timelines 1→2→3 and a fork 1→4.

    Then a backup taken on timeline 2 cannot be recovered into timeline 4:
    PostgreSQL refuses exactly when TimelineGraph.contains says no.
    """
    from pgsnap.wal.archive import DirectoryWalArchive

    bindir = pg_bindir_for(major)
    primary = pg_server(bindir)
    primary.start()
    segsz = primary.wal_segment_size()
    archive = primary.archive_dir
    primary.sql("CREATE TABLE t (id serial, phase text)")
    primary.sql("INSERT INTO t (phase) VALUES ('base')")

    # Base backup: backup mode + file copies into three clusters-to-be.
    restores = [pg_server.prepare(bindir, archive_dir=archive) for _ in range(3)]
    with primary.connect() as conn:
        start = backup_start(conn, primary.major, "history test")
        for r in restores:
            r.copy_data_from(primary.data_dir)
        _stop, labelfile, spcmapfile = backup_stop(conn, primary.major)
    for r in restores:
        r.write_backup_label(labelfile, spcmapfile)

    # History on timeline 1 after the backup: two restore points.
    primary.sql("INSERT INTO t (phase) VALUES ('after backup')")
    rp1 = restore_point(primary, "rp1")
    primary.sql("INSERT INTO t (phase) VALUES ('after rp1')")
    rp2 = restore_point(primary, "rp2")
    primary.sql("INSERT INTO t (phase) VALUES ('after rp2')")
    primary.switch_wal_and_wait_archived()
    primary.wait_for_archive_idle()

    def pitr(server: PgServer, **targets: Any) -> int:
        server.enable_recovery(recovery_target_action="promote", **targets)
        server.start()
        server.wait_for_promotion()
        tli = current_timeline(server)
        server.wait_for_archived(wal.history_file_name(tli))
        return tli

    # 1 → 2 at rp1.
    b, c, d = restores
    assert pitr(b, recovery_target_name="rp1") == 2
    assert b.sql("SELECT phase FROM t ORDER BY id") == [("base",), ("after backup",)]
    # A second base backup, on timeline 2 (before rp3), into a fourth cluster.
    e = pg_server.prepare(bindir, archive_dir=archive)
    with b.connect() as conn:
        start_tl2 = backup_start(conn, b.major, "on timeline 2")
        e.copy_data_from(b.data_dir)
        _stop, labelfile2, spcmapfile2 = backup_stop(conn, b.major)
    e.write_backup_label(labelfile2, spcmapfile2)
    checkpoint_tl2 = wal.parse_backup_label(labelfile2).checkpoint_lsn
    assert wal.parse_backup_label(labelfile2).start_timeline == 2
    b.sql("INSERT INTO t (phase) VALUES ('tl2')")
    rp3 = restore_point(b, "rp3")
    b.sql("INSERT INTO t (phase) VALUES ('tl2 after rp3')")
    b.switch_wal_and_wait_archived()
    b.wait_for_archive_idle()
    b.stop()

    # 1 → 2 → 3 at rp3 (following timeline 2 from the same backup).
    assert pitr(c, recovery_target_name="rp3", recovery_target_timeline="2") == 3
    assert c.sql("SELECT phase FROM t ORDER BY id") == [
        ("base",),
        ("after backup",),
        ("tl2",),
    ]
    c.stop()

    # A fork of timeline 1 at rp2: the next free timeline is 4.
    # (This one restores with pgsnap.wal.archive's restore_command.)
    restore_command = DirectoryWalArchive(archive).restore_command()
    assert (
        pitr(
            d,
            recovery_target_name="rp2",
            recovery_target_timeline="1",
            restore_command=restore_command,
        )
        == 4
    )
    assert d.sql("SHOW restore_command") == [(restore_command,)]
    assert [p for (p,) in d.sql("SELECT phase FROM t ORDER BY id")] == [
        "base",
        "after backup",
        "after rp1",
    ]
    assert "selected new timeline ID: 4" in d.log_text()
    d.stop()

    # The real history files, read independently and by pgsnap.wal.
    texts = {t: (archive / wal.history_file_name(t)).read_text() for t in (2, 3, 4)}
    expected = {
        2: [(1, rp1, 'at restore point "rp1"')],
        3: [(1, rp1, 'at restore point "rp1"'), (2, rp3, 'at restore point "rp3"')],
        4: [(1, rp2, 'at restore point "rp2"')],
    }
    for tli, text in texts.items():
        assert _history_lines(text) == expected[tli], text
        h = wal.parse_history(text, tli)
        assert [(e.parent, e.switchpoint, e.reason) for e in h.entries] == expected[tli]

    graph = wal.TimelineGraph.from_histories(wal.parse_history(t, n) for n, t in texts.items())
    arch = DirectoryWalArchive(archive)
    assert arch.histories() == graph
    assert graph.latest() == 4
    assert graph.children_of(1) == (2, 4)
    assert graph.path(3) == (
        wal.TimelineSpan(1, None, rp1),
        wal.TimelineSpan(2, rp1, rp3),
        wal.TimelineSpan(3, rp3, None),
    )
    assert graph.path(4) == (wal.TimelineSpan(1, None, rp2), wal.TimelineSpan(4, rp2, None))

    # The switchpoint belongs to the child (PostgreSQL's tliOfPointInHistory).
    assert graph.contains(1, rp1 - 1, 3)
    assert not graph.contains(1, rp1, 3)
    assert graph.contains(2, rp1, 3)
    assert graph.contains(2, rp3 - 1, 3)
    assert graph.contains(3, rp3, 3)
    assert graph.contains(1, rp2 - 1, 4)
    assert not graph.contains(1, rp2 - 1, 2)
    assert not graph.contains(2, rp3, 4)
    # The backup (taken on timeline 1 before both forks) is on every path.
    for target in (1, 2, 3, 4):
        assert graph.contains(1, start, target)

    assert graph.contains(2, start_tl2, 3)
    assert graph.contains(2, checkpoint_tl2, 2)

    # PostgreSQL refuses to recover the timeline-2 backup into timeline 4, as the graph says.
    assert not graph.contains(2, checkpoint_tl2, 4)
    e.enable_recovery(recovery_target_timeline="4")
    with pytest.raises(ServerCommandError):
        e.start(timeout=30)
    # Timeline 4's history (1, then 4) never passes through timeline 2, so recovery
    # cannot even read the backup's checkpoint; with the checkpoint on a reachable
    # timeline but past the fork it would say "... is not a child of this server's history".
    refusal = re.search(
        r"FATAL: +(could not locate required checkpoint record"
        r"|requested timeline 4 is not a child of this server's history)",
        e.log_text(),
    )
    assert refusal is not None, e.log_text()[-3000:]
    with pytest.raises(TimelineError):
        wal.check(arch.index(segsz), (2, start_tl2), None, 4, graph)

    # The archive holds everything recovery to rp3 on timeline 3 needed (it just ran).
    index = arch.index(segsz)
    assert [t for t in (2, 3, 4) if not index.has_history(t)] == []
    result = wal.check(index, (1, start), rp3, 3, graph)
    assert result.complete, result.summary()
    assert [s.timeline for s in result.path] == [1, 2, 3]


# --------------------------------------------------------------------------- gaps


def test_real_archive_gap(pg_server):
    from pgsnap.wal.archive import DirectoryWalArchive

    server = pg_server()
    server.start()
    segsz = server.wal_segment_size()
    server.sql("CREATE TABLE t (x int)")
    archived = []
    for i in range(7):
        server.sql("INSERT INTO t SELECT generate_series(1, %s)", (100 * (i + 1),))
        archived.append(server.switch_wal_and_wait_archived())
    server.wait_for_archive_idle()
    segments = sorted(p.name for p in server.archive_dir.iterdir() if len(p.name) == 24)
    assert set(archived) <= set(segments)
    first_tli, first_seg = wal.parse_segment_name(segments[0], segsz)
    last_seg = wal.parse_segment_name(segments[-1], segsz)[1]
    assert first_tli == 1
    assert last_seg - first_seg + 1 == len(segments) >= 6

    arch = DirectoryWalArchive(server.archive_dir)
    index = arch.index(segsz)
    assert index.gaps(1) == ()
    assert index.ranges(1) == (wal.SegmentRange(1, first_seg, last_seg),)

    victim = segments[len(segments) // 2]
    victim_seg = wal.parse_segment_name(victim, segsz)[1]
    (server.archive_dir / victim).unlink()

    index = arch.index(segsz)
    assert index.gaps(1) == (wal.SegmentRange(1, victim_seg, victim_seg),)
    graph = arch.histories()
    start = wal.segment_start(first_seg, segsz)
    result = wal.check(index, (1, start), None, 1, graph)
    assert not result.complete
    assert result.missing == (victim,)
    assert result.missing_count == 1
    assert result.reachable_lsn == wal.segment_start(victim_seg, segsz)

    # With an end inside the gap-free part, the check passes.
    ok = wal.check(index, (1, start), wal.segment_start(victim_seg, segsz), 1, graph)
    assert ok.complete, ok.summary()
