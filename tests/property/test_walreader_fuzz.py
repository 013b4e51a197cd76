"""Fuzzing the WAL reader (hypothesis) with damaged copies of real segments.

A PostgreSQL 15 server writes a few real 1 MB segments once per session
(commits, aborts, prepared transactions, restore points, a record spanning
segments, checkpoints, a WAL switch). Each example damages a copy of them -
random bytes, truncations, bit flips, overwritten stretches, segments swapped
or another cluster's segment - and reads it. Whatever the damage:

- the reader raises nothing but pgsnap errors (:class:`~pgsnap.errors.PgsnapError`);
- every record it reports is a record of the undamaged WAL, at the same
  place and with the same content (it never reports a record that is not
  there), and none lies after the end of valid WAL it reports;
- a record whose header a flipped bit damaged is not reported; under
  ``Verify.ALL`` nothing after it is either (its checksum fails: the valid WAL
  ends before it). The default, ``Verify.TAIL``, checks only the decoded
  records and the tail, so a record damaged into one it skips is skipped, as
  documented.
"""

from __future__ import annotations

import gzip
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgsnap.errors import PgsnapError
from pgsnap.model import LSN
from pgsnap.testing.pgserver import PgServer
from pgsnap.wal import TimelineSpan, segment_name
from pgsnap.wal.reader import (
    EndOfWal,
    RestorePointRecord,
    ScanEnd,
    SegmentRead,
    StopReason,
    TimelineSwitch,
    Verify,
    XactRecord,
    read_wal,
)

pytestmark = pytest.mark.postgres

MB = 1024 * 1024
ONE = [TimelineSpan(1, None, None)]
LSN_MAX = LSN(2**64 - 1)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Real:
    """Real segments: ``names`` in order, their ``data``, and the undamaged scan."""

    def __init__(self, names: list[str], data: dict[str, bytes], start: LSN) -> None:
        self.names = names
        self.data = data
        self.start = start
        self.baseline = self.read(data)
        end = self.baseline[-1]
        assert isinstance(end, ScanEnd) and end.reason is StopReason.END_OF_WAL
        self.records = {i for i in self.baseline if self._is_record(i)}
        assert len([i for i in self.baseline if isinstance(i, XactRecord)]) >= 20
        assert any(isinstance(i, RestorePointRecord) for i in self.baseline)

    @staticmethod
    def _is_record(item: object) -> bool:
        return not isinstance(item, SegmentRead | EndOfWal | ScanEnd | TimelineSwitch)

    def read(self, files: dict[str, bytes], **kw: object) -> list[object]:
        with tempfile.TemporaryDirectory(prefix="pgsnap-fuzz-") as d:
            for name, data in files.items():
                Path(d, name).write_bytes(data)
            return list(read_wal([d], ONE, self.start, LSN_MAX, **kw))  # type: ignore[arg-type]

    def lsn_of(self, name: str, offset: int) -> int:
        return self.start.value + self.names.index(name) * MB + offset

    def header_hit(self, lsn: int) -> int | None:
        """The start of the reported record whose header (before xl_crc) holds ``lsn``."""
        for r in self.records:
            start = r.lsn.value  # type: ignore[attr-defined]
            if start <= lsn < start + 20 and start % 8192 <= 8192 - 24:
                return int(start)
        return None

    def check(self, items: list[object]) -> EndOfWal | None:
        end = items[-1]
        assert isinstance(end, ScanEnd)
        reported = [i for i in items if self._is_record(i)]
        strangers = [i for i in reported if i not in self.records]
        assert not strangers, f"records that are not in the WAL: {strangers[:3]}"
        eow = end.end_of_wal
        if eow is not None:
            assert all(i.lsn < eow.lsn for i in reported)  # type: ignore[attr-defined]
        return eow


@pytest.fixture(scope="session")
def real(pg_bindir: Path) -> Iterator[Real]:
    server = PgServer.create(
        pg_bindir,
        wal_segsize_mb=1,
        settings={"max_prepared_transactions": 5, "track_commit_timestamp": True},
    )
    try:
        server.start()
        server.sql("CREATE TABLE t (v text)")
        server.sql("SELECT pg_switch_wal()")
        lsn = LSN.parse(server.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0])
        with server.connect() as conn:
            for i in range(60):
                conn.execute("BEGIN")
                conn.execute("INSERT INTO t SELECT repeat('x', %s)", (i * 37 % 3000,))
                conn.execute("COMMIT" if i % 4 else "ROLLBACK")
                if i % 10 == 3:
                    conn.execute("BEGIN")
                    conn.execute("INSERT INTO t VALUES ('p')")
                    conn.execute(f"PREPARE TRANSACTION 'g{i}'")
                    conn.execute(f"{'COMMIT' if i % 20 == 3 else 'ROLLBACK'} PREPARED 'g{i}'")
                if i % 15 == 7:
                    conn.execute("SELECT pg_create_restore_point(%s)", (f"rp{i}",))
                if i == 30:
                    conn.execute("SELECT pg_logical_emit_message(true, 'x', repeat('y', 1500000))")
                if i == 40:
                    conn.execute("CHECKPOINT")
        server.wait_for_archive_idle()
        server.stop()
        # The archived segments from the first one, and the current one from pg_wal
        # (the shutdown checkpoint, then zeros: a real end of WAL).
        names = sorted(p.name for p in server.archive_dir.iterdir() if len(p.name) == 24)
        names = names[names.index(segment_name(1, lsn.value // MB, MB)) :]
        current = segment_name(1, int(names[-1][8:], 16) + 1, MB)
        data = {n: (server.archive_dir / n).read_bytes() for n in names}
        data[current] = (server.wal_dir / current).read_bytes()
        yield Real([*names, current], data, LSN(lsn.value - lsn.value % MB))
    finally:
        server.cleanup()


def read_damaged(real: Real, files: dict[str, bytes], **kw: object) -> EndOfWal | None:
    try:
        items = real.read(files, **kw)
    except PgsnapError:
        return None
    return real.check(items)


# --------------------------------------------------------------------------- properties


@FUZZ
@given(data=st.data())
def test_random_bytes(real, data):
    """Random bytes in place of segments (a valid first page or not)."""
    files = dict(real.data)
    victims = data.draw(st.lists(st.sampled_from(real.names), min_size=1, max_size=3, unique=True))
    for name in victims:
        size = data.draw(st.sampled_from([MB, MB, 0, 100, 8192, MB - 1, MB + 1]))
        noise = data.draw(st.binary(min_size=0, max_size=4096)) * (size // 4096 + 1)
        keep = data.draw(st.sampled_from([0, 40, 8192]))
        files[name] = (real.data[name][:keep] + noise)[:size].ljust(size, b"\0")
    read_damaged(real, files)


@FUZZ
@given(data=st.data())
def test_truncations(real, data):
    """Segments cut short, plain or gzip-compressed."""
    files = dict(real.data)
    name = data.draw(st.sampled_from(real.names))
    cut = data.draw(st.integers(0, MB - 1))
    if data.draw(st.booleans()):
        files[name] = real.data[name][:cut]
    else:
        del files[name]
        packed = gzip.compress(real.data[name], 1)
        files[f"{name}.gz"] = packed[: cut % len(packed)]
    read_damaged(real, files)


@FUZZ
@given(data=st.data())
def test_bit_flips(real, data):
    """Bits flipped anywhere: only records of the undamaged WAL are reported, never
    one whose header was hit, and under Verify.ALL nothing after it either."""
    files = dict(real.data)
    flips = data.draw(
        st.lists(
            st.tuples(st.sampled_from(real.names), st.integers(0, MB - 1), st.integers(0, 7)),
            min_size=1,
            max_size=6,
        )
    )
    for name, offset, bit in flips:
        buf = bytearray(files[name])
        buf[offset] ^= 1 << bit
        files[name] = bytes(buf)
    damaged = {(n, o) for n, o, _b in flips if files[n][o] != real.data[n][o]}  # not undone
    hits = {real.header_hit(real.lsn_of(n, o)) for n, o in damaged} - {None}
    for verify in (Verify.TAIL, Verify.ALL):
        try:
            items = real.read(files, verify=verify)
        except PgsnapError:
            continue
        real.check(items)
        reported = [i for i in items if real._is_record(i)]
        # A record whose header was hit is never reported (its checksum fails, or
        # it is no longer a record the reader decodes) ...
        assert not [i for i in reported if i.lsn.value in hits]
        # ... and checking every record, nothing after it either: replay stops there.
        if verify is Verify.ALL and hits:
            late = [i for i in reported if i.lsn.value >= min(hits)]
            assert not late, (LSN(min(hits)), late[:2])


@FUZZ
@given(data=st.data())
def test_overwritten_stretches(real, data):
    """Stretches overwritten with zeros, ones or another part of the WAL."""
    files = dict(real.data)
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(real.names))
        offset = data.draw(st.integers(0, MB - 1))
        length = data.draw(st.integers(1, 20000))
        kind = data.draw(st.sampled_from(["zeros", "ones", "copy"]))
        buf = bytearray(files[name])
        end = min(MB, offset + length)
        if kind == "copy":
            src = data.draw(st.sampled_from(real.names))
            at = data.draw(st.integers(0, MB - (end - offset)))
            buf[offset:end] = real.data[src][at : at + end - offset]
        else:
            buf[offset:end] = (b"\0" if kind == "zeros" else b"\xff") * (end - offset)
        files[name] = bytes(buf)
    read_damaged(real, files)


@FUZZ
@given(data=st.data())
def test_segments_swapped_or_from_another_cluster(real, data):
    """A segment's content in another's place, or another cluster's segment."""
    files = dict(real.data)
    a, b = data.draw(st.lists(st.sampled_from(real.names), min_size=2, max_size=2, unique=True))
    if data.draw(st.booleans()):
        files[a], files[b] = real.data[b], real.data[a]
    else:
        buf = bytearray(real.data[a])
        buf[24:32] = bytes(8)  # system identifier of the long header
        files[a] = bytes(buf)
    read_damaged(real, files)


def test_the_fixture_is_real_wal(real):
    """The undamaged copy reads whole; a missing segment stops the scan, not an error."""
    assert real.baseline[-1].reason is StopReason.END_OF_WAL
    assert len(real.names) >= 3
    files = dict(real.data)
    del files[real.names[1]]
    items = real.read(files)
    assert items[-1].reason is StopReason.MISSING_SEGMENT
    assert items[-1].missing == real.names[1]
    real.check(items)
