"""Unit tests of pgsnap.wal.reader and its CRC-32C, on synthetic WAL.

:class:`WalWriter` lays records out as PostgreSQL does (page headers, long
headers at segment starts, records aligned to 8 bytes, record headers split
across pages, continuations with ``XLP_FIRST_IS_CONTRECORD`` and
``xlp_rem_len``, CRC-32C), so that every edge case is built on purpose. The
real-server tests (tests/integration/test_walreader_real.py) check the format
itself against PostgreSQL 12-18.
"""

from __future__ import annotations

import bz2
import datetime as dt
import gzip
import importlib.machinery
import importlib.util
import lzma
import os
import random
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.errors import ArchiveError, InputError
from pgsnap.model import LSN
from pgsnap.planner.facts import WalEvents
from pgsnap.wal import TimelineSpan, segment_name
from pgsnap.wal import reader as walreader
from pgsnap.wal._crc32c import crc32c, crc32c_python
from pgsnap.wal.reader import (
    PAGE_MAGIC,
    BackupEndRecord,
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
    Verify,
    XactKind,
    XactRecord,
    read_segment_header,
    read_wal,
    scan_events,
)

MB = 1024 * 1024
B = 8192
MAGIC = {12: 0xD101, 13: 0xD106, 14: 0xD10D, 15: 0xD110, 16: 0xD113, 17: 0xD116, 18: 0xD118}
"""XLOG_PAGE_MAGIC of each release (xlog_internal.h), written here independently of the reader."""
SYSID = 7_300_000_000_000_000_001
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
LSN_MAX = LSN(2**64 - 1)
ONE = [TimelineSpan(1, None, None)]


def us(t: dt.datetime) -> int:
    return (t - PG_EPOCH) // dt.timedelta(microseconds=1)


# =========================================================================== writer


class WalWriter:
    """Synthetic WAL of one timeline, as PostgreSQL writes it."""

    def __init__(
        self,
        *,
        major: int = 15,
        segsz: int = MB,
        tli: int = 1,
        sysid: int = SYSID,
        segno: int = 1,
        files: dict[tuple[int, int], bytearray] | None = None,
    ) -> None:
        self.major = major
        self.magic = MAGIC[major]
        self.segsz = segsz
        self.tli = tli
        self.sysid = sysid
        self.files = files if files is not None else {}
        self.pos = segno * segsz
        self.prev = 0
        self.flags = 0  # extra xlp_info bits for the next page header written
        self.removable = 0x0004  # XLP_BKP_REMOVABLE: PostgreSQL sets it outside backups

    # ----------------------------------------------------------------- layout

    def _seg(self, segno: int) -> bytearray:
        return self.files.setdefault((self.tli, segno), bytearray(self.segsz))

    def _put(self, lsn: int, data: bytes) -> None:
        seg = self._seg(lsn // self.segsz)
        off = lsn % self.segsz
        seg[off : off + len(data)] = data

    def _page_header(self, page: int, rem: int) -> int:
        info = self.flags | self.removable | (0x0001 if rem else 0)
        self.flags = 0
        long = page % self.segsz == 0
        if long:
            info |= 0x0002
        hdr = struct.pack("<HHIQI4x", self.magic, info, self.tli, page, rem)
        if long:
            hdr += struct.pack("<QII", self.sysid, self.segsz, B)
        self._put(page, hdr)
        return len(hdr)

    def raw(self, rec: bytes) -> tuple[int, int]:
        """Write whole record bytes at the insert position; (start, end)."""
        pos = self.pos
        if pos % B == 0:
            pos += self._page_header(pos, 0)
        start = pos
        rest = rec
        while rest:
            room = B - pos % B
            self._put(pos, rest[:room])
            pos += min(room, len(rest))
            rest = rest[room:]
            if rest:
                pos += self._page_header(pos, len(rest))
        end = (pos + 7) & ~7
        self.prev, self.pos = start, end
        return start, end

    def record(
        self,
        rmid: int,
        info: int,
        main: bytes = b"",
        *,
        xid: int = 0,
        blocks: bytes = b"",
        block_data: bytes = b"",
        prev: int | None = None,
        bad_crc: bool = False,
    ) -> tuple[int, int]:
        """A record: block headers, the main data header, block data, main data."""
        body = blocks
        if main:
            body += (b"\xff" + bytes([len(main)])) if len(main) < 256 else b"\xfe"
            body += b"" if len(main) < 256 else struct.pack("<I", len(main))
        body += block_data + main
        head = struct.pack(
            "<IIQBB2x", 24 + len(body), xid, self.prev if prev is None else prev, info, rmid
        )
        crc = crc32c(head, crc32c(body)) ^ (1 if bad_crc else 0)
        return self.raw(head + struct.pack("<I", crc) + body)

    # ----------------------------------------------------------------- records

    def filler(self, size: int) -> tuple[int, int]:
        """A heap record (skipped by the reader) whose whole record is ``size`` bytes."""
        main = size - 24 - (2 if size - 26 < 256 else 5)
        return self.record(10, 0x00, bytes(random.Random(size).randbytes(main)), xid=3)

    def to_page_offset(self, offset: int) -> None:
        """Fill so that the next record starts at ``offset`` (a multiple of 8) in a page."""
        if self.pos % B == offset:
            return
        start = self.pos
        if start % B == 0:
            start += 40 if start % self.segsz == 0 else 24
        room = B - start % B
        if offset > start % B and offset - start % B >= 48:
            size = offset - start % B  # within this page
        else:  # into the next page, after its header
            nxt = start - start % B + B
            size = room + offset - (40 if nxt % self.segsz == 0 else 24)
        self.filler(size)
        assert self.pos % B == offset, (self.pos % B, offset)

    def commit(
        self, xid: int, when: dt.datetime = T0, *, kind: str = "commit", **parts
    ) -> tuple[int, int]:
        op = {"commit": 0x00, "abort": 0x20, "commit_prepared": 0x30, "abort_prepared": 0x40}[kind]
        xinfo = 0
        tail = b""
        if parts.get("dbinfo"):
            xinfo |= 1
            tail += struct.pack("<II", 5, 1663)
        if "subxacts" in parts:
            xinfo |= 2
            tail += struct.pack("<i", len(parts["subxacts"])) + b"".join(
                struct.pack("<I", s) for s in parts["subxacts"]
            )
        if "rels" in parts:
            xinfo |= 4
            tail += struct.pack("<i", parts["rels"]) + bytes(12 * parts["rels"])
        if "stats" in parts:
            xinfo |= 1 << 8
            size = 16 if self.major >= 18 else 12
            tail += struct.pack("<i", parts["stats"]) + bytes(size * parts["stats"])
        if "invals" in parts:
            xinfo |= 8
            tail += struct.pack("<i", parts["invals"]) + bytes(16 * parts["invals"])
        if "twophase" in parts:
            xinfo |= 16
            tail += struct.pack("<I", parts["twophase"])
            if "gid" in parts:
                xinfo |= 128
                tail += parts["gid"].encode() + b"\0"
        if parts.get("origin"):
            xinfo |= 32
            tail += struct.pack("<Qq", 0x1234, 99)
        main = struct.pack("<q", us(when))
        if xinfo:
            op |= 0x80
            main += struct.pack("<I", xinfo) + tail
        return self.record(
            1,
            op,
            main,
            xid=xid,
            blocks=parts.get("blocks", b""),
            block_data=parts.get("data", b""),
            prev=parts.get("prev"),
            bad_crc=parts.get("bad_crc", False),
        )

    def restore_point(self, name: str, when: dt.datetime = T0) -> tuple[int, int]:
        raw = name.encode()
        return self.record(0, 0x70, struct.pack("<q", us(when)) + raw + bytes(64 - len(raw)))

    def checkpoint(
        self, *, shutdown: bool = False, this: int = 1, prev: int = 1, redo: int | None = None
    ) -> tuple[int, int]:
        data = bytearray(88)
        struct.pack_into("<QII", data, 0, self.pos if redo is None else redo, this, prev)
        struct.pack_into(
            "<q", data, 64, int((T0 - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)).total_seconds())
        )
        return self.record(0, 0x00 if shutdown else 0x10, bytes(data))

    def end_of_recovery(self, this: int, prev: int, when: dt.datetime = T0) -> tuple[int, int]:
        return self.record(0, 0x90, struct.pack("<qIIi4x", us(when), this, prev, 1))

    def switch(self) -> tuple[int, int]:
        start, _end = self.record(0, 0x40)
        self.pos = (self.pos + self.segsz - 1) // self.segsz * self.segsz
        return start, self.pos

    def backup_end(self, start: int) -> tuple[int, int]:
        return self.record(0, 0x50, struct.pack("<Q", start))

    def overwrite_contrecord(self, overwritten: int, when: dt.datetime = T0) -> tuple[int, int]:
        return self.record(0, 0xD0, struct.pack("<Qq", overwritten, us(when)))

    # ----------------------------------------------------------------- timelines and files

    def fork(self, tli: int) -> WalWriter:
        """A writer of timeline ``tli`` going on from here; the current segment is
        copied into the new timeline's file up to here (as a promotion does)."""
        child = WalWriter(
            major=self.major, segsz=self.segsz, tli=tli, sysid=self.sysid, files=self.files
        )
        child.pos, child.prev = self.pos, self.prev
        segno = self.pos // self.segsz
        data = self.files.get((self.tli, segno), bytearray(self.segsz))
        copy = bytearray(self.segsz)
        copy[: self.pos % self.segsz] = data[: self.pos % self.segsz]
        self.files[(tli, segno)] = copy
        return child

    def write(self, directory: Path, *, only_tli: int | None = None) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        for (tli, segno), data in sorted(self.files.items()):
            if only_tli is None or tli == only_tli:
                (directory / segment_name(tli, segno, self.segsz)).write_bytes(bytes(data))
        return directory


def scan(dirs, spans=ONE, start=MB, end=LSN_MAX, **kw):
    items = list(read_wal([str(d) for d in dirs], spans, LSN(start), end, **kw))
    assert isinstance(items[-1], ScanEnd)
    return items


def of(items, kind):
    return [i for i in items if isinstance(i, kind)]


# =========================================================================== CRC-32C


def crc32c_bitwise(data: bytes) -> int:
    """CRC-32C one bit at a time, straight from the polynomial (a second opinion)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"123456789", 0xE3069283),  # the CRC catalogue's check value
        (bytes(32), 0x8A9136AA),  # RFC 3720 (iSCSI) B.4 test vectors
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
@pytest.mark.parametrize("crc", [crc32c, crc32c_python], ids=["in use", "pure Python"])
def test_crc32c_known_vectors(data, expected, crc):
    assert crc(data) == expected
    assert crc(bytearray(data)) == expected
    assert crc(memoryview(data)) == expected
    assert crc32c_bitwise(data) == expected


@pytest.mark.parametrize("crc", [crc32c, crc32c_python], ids=["in use", "pure Python"])
def test_crc32c_agrees_with_the_bitwise_one_and_continues(crc):
    rng = random.Random(32)
    for n in [*range(70), 255, 256, 257, 1000, 4099]:
        data = rng.randbytes(n)
        assert crc(data) == crc32c_bitwise(data), n
        cut = rng.randrange(n + 1)
        assert crc(data[cut:], crc(data[:cut])) == crc(data), (n, cut)
        assert crc(memoryview(data)[cut:], crc(data[:cut])) == crc(data), (n, cut)


def test_the_c_crc32c_is_used_when_installed():
    """The test extra installs the optional ``crc32c`` package (pgsnap[fast]): the
    WAL reader must then use it, and it must agree with the pure-Python one."""
    from pgsnap.wal import _crc32c

    assert _crc32c.accelerated(), "crc32c (pip install 'pgsnap[fast]') is not installed"
    data = random.Random(5).randbytes(1 << 16)
    assert crc32c(data) == crc32c_python(data)


def _crc_in_a_new_process(code: str, warnings: str = "error", **env: str) -> list[str]:
    """Run ``code`` after importing pgsnap's CRC in a fresh interpreter (``-W
    warnings``); what it printed."""
    done = subprocess.run(
        [sys.executable, "-W", warnings, "-c", "from pgsnap.wal import _crc32c\n" + code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_c_crc32c_is_loaded_without_its_packages_import():
    """The package's ``__init__`` looks up its version through importlib.metadata
    (about 20 ms of every command that reads WAL): only its extension is loaded."""
    out = _crc_in_a_new_process(
        "import sys\n"
        "print(_crc32c.accelerated(), hex(_crc32c.crc32c(b'123456789')))\n"
        "print('crc32c' in sys.modules, 'importlib.metadata' in sys.modules)"
    )
    assert out == ["True", "0xe3069283", "False", "False"]


def test_a_crc32c_package_laid_out_otherwise_is_imported_whole(monkeypatch, tmp_path):
    """No extension where pgsnap looks for it (the package found in an empty folder):
    the package is imported, and used."""
    from pgsnap.wal import _crc32c

    elsewhere = importlib.machinery.ModuleSpec("crc32c", None, is_package=True)
    elsewhere.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(_crc32c, "_fast", [])
    monkeypatch.delitem(sys.modules, "crc32c", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: elsewhere)
    assert _crc32c.accelerated()
    assert "crc32c" in sys.modules
    data = random.Random(6).randbytes(999)
    assert _crc32c.crc32c(data) == crc32c_python(data)


@pytest.mark.parametrize("warnings", ["error", "ignore"])
def test_a_crc32c_package_that_refuses_every_call_is_not_used(warnings):
    """CRC32C_SW_MODE=none on a processor without a CRC instruction (probing skipped
    here): the package warns when loaded and raises on every call. The pure-Python
    CRC is used instead, whether the warning is made an error or not."""
    out = _crc_in_a_new_process(
        "print(_crc32c.accelerated(), hex(_crc32c.crc32c(b'123456789')))",
        warnings,
        CRC32C_SW_MODE="none",
        CRC32C_SKIP_HW_PROBE="1",
    )
    assert out == ["False", "0xe3069283"]


REAL_COMMIT = bytes.fromhex(
    "42000000d202000078046000000000008001000088e7581bff2887462e818404030009000080010000007f06"
    "0000010000001500000000000000cd530dcc00000000"
)
"""A commit record (xid 722, at 0/6004F0) as PostgreSQL 15 wrote it, xl_crc 0x1B58E788."""


def test_crc32c_of_a_real_record_header_order():
    """PostgreSQL's record CRC: the data after the header, then the header up to xl_crc."""
    rec = REAL_COMMIT
    assert struct.unpack_from("<I", rec, 20)[0] == 0x1B58E788
    assert crc32c(rec[:20], crc32c(rec[24:])) == 0x1B58E788
    assert walreader._record_crc(rec) == 0x1B58E788
    assert crc32c(rec[:24]) != 0x1B58E788


# =========================================================================== records


def test_decodes_every_kind_it_extracts(tmp_path):
    w = WalWriter()
    later = T0 + dt.timedelta(seconds=1, microseconds=7)
    c1 = w.commit(700, T0)
    a1 = w.commit(701, later, kind="abort")
    w.filler(300)
    cp = w.commit(702, later, kind="commit_prepared", twophase=650, gid="g1", dbinfo=True, invals=3)
    ap = w.commit(
        0, later, kind="abort_prepared", twophase=651, rels=2, stats=1, subxacts=[652, 653]
    )
    rp = w.restore_point("before upgrade é")
    ck = w.checkpoint(redo=MB + 40)
    sd = w.checkpoint(shutdown=True)
    eor = w.end_of_recovery(2, 1)
    be = w.backup_end(MB + 40)
    sw = w.switch()
    c2 = w.commit(703)
    w.write(tmp_path)
    items = scan([tmp_path])
    got = [i for i in items if not isinstance(i, SegmentRead | EndOfWal | ScanEnd)]
    assert got == [
        XactRecord(XactKind.COMMIT, LSN(c1[0]), LSN(c1[1]), 700, T0, 1),
        XactRecord(XactKind.ABORT, LSN(a1[0]), LSN(a1[1]), 701, later, 1),
        XactRecord(XactKind.COMMIT_PREPARED, LSN(cp[0]), LSN(cp[1]), 650, later, 1),
        XactRecord(XactKind.ABORT_PREPARED, LSN(ap[0]), LSN(ap[1]), 651, later, 1),
        RestorePointRecord(LSN(rp[0]), LSN(rp[1]), "before upgrade é", T0, 1),
        CheckpointRecord(LSN(ck[0]), LSN(ck[1]), False, LSN(MB + 40), 1, 1, T0, 1),
        CheckpointRecord(LSN(sd[0]), LSN(sd[1]), True, LSN(sd[0]), 1, 1, T0, 1),
        EndOfRecoveryRecord(LSN(eor[0]), LSN(eor[1]), T0, 2, 1, 1),
        BackupEndRecord(LSN(be[0]), LSN(be[1]), LSN(MB + 40), 1),
        SwitchRecord(LSN(sw[0]), LSN(2 * MB), 1),
        XactRecord(XactKind.COMMIT, LSN(c2[0]), LSN(c2[1]), 703, T0, 1),
    ]
    assert c2[0] == 2 * MB + 40  # after the switch, the next segment
    assert [r.segno for r in of(items, SegmentRead)] == [1, 2]
    end = items[-1]
    assert end.reason is StopReason.END_OF_WAL
    assert end.end_of_wal == items[-2]
    assert end.end_of_wal.lsn == LSN(c2[1])
    assert end.end_of_wal.last_lsn == LSN(c2[0])
    assert end.end_of_wal.reason.startswith("invalid record length")
    assert end.scanned_to == LSN(c2[1])
    assert end.records == 12


@pytest.mark.parametrize("major", sorted(MAGIC))
def test_every_version_and_its_stats_items(tmp_path, major):
    """The magic of each version; 18's dropped-stats items are 16 bytes, 15-17's 12."""
    assert PAGE_MAGIC[major] == MAGIC[major]
    w = WalWriter(major=major)
    parts: dict[str, Any] = {"stats": 2} if major >= 15 else {}
    w.commit(
        0, kind="commit_prepared", twophase=777, rels=1, invals=2, gid="x", origin=True, **parts
    )
    w.write(tmp_path)
    items = scan([tmp_path])
    assert [x.xid for x in of(items, XactRecord)] == [777]
    assert of(items, SegmentRead)[0].major == major
    # Another version's reading of the same bytes is refused at the first page.
    other = 12 if major != 12 else 13
    with pytest.raises(ArchiveError, match=f"not a WAL segment of PostgreSQL {other}"):
        scan([tmp_path], major=other)


def test_records_that_span_pages_and_segments(tmp_path):
    w = WalWriter()
    w.commit(800)
    big = w.commit(801, subxacts=list(range(1000, 4000)))  # 12 kB: three pages
    w.filler(3 * MB // 2)  # skipped, over a segment boundary
    w.to_page_offset(B - 8)  # the next header is split over two pages
    split = w.commit(802)
    w.to_page_offset(B - 16)
    split2 = w.restore_point("split")
    w.write(tmp_path)
    items = scan([tmp_path])
    xacts = of(items, XactRecord)
    assert [(x.xid, x.lsn.value, x.end_lsn.value) for x in xacts][1:] == [
        (801, *big),
        (802, *split),
    ]
    assert xacts[0].xid == 800
    assert big[1] - big[0] > B
    assert split[0] % B == B - 8
    assert of(items, RestorePointRecord)[0].lsn == LSN(split2[0])
    assert [r.segno for r in of(items, SegmentRead)] == [1, 2]


def test_segment_sizes_and_small_chunks_read_the_same(tmp_path):
    for segsz in (MB, 4 * MB):
        w = WalWriter(segsz=segsz)
        w.removable = 0 if segsz == MB else 0x0004  # pages with and without the flag
        for i in range(200):
            w.commit(1000 + i)
            w.filler(random.Random(i).randrange(40, 30000))
        d = w.write(tmp_path / str(segsz))
        whole = scan([d], start=segsz)
        chunked = scan([d], start=segsz, chunk_size=65536)
        assert whole[:-1] == chunked[:-1]
        assert attrs.evolve(whole[-1], bytes=0) == attrs.evolve(chunked[-1], bytes=0)
        assert [x.xid for x in of(whole, XactRecord)] == list(range(1000, 1200))


def test_start_inside_a_record_and_end_before_a_record(tmp_path):
    w = WalWriter()
    a = w.commit(1)
    long = w.filler(20000)  # spans pages
    b = w.commit(2)
    c = w.commit(3)
    w.write(tmp_path)
    # Starting inside a record (even on a page that begins with its continuation)
    # finds the next record, as pg_waldump --start does.
    for start in (a[0] + 8, long[0] + 9000, long[0] + 16400):
        items = scan([tmp_path], start=start)
        assert [x.xid for x in of(items, XactRecord)] == [2, 3], start
    # A record not whole before the end is not reported; the scan is complete.
    for end in (c[0] + 33, c[0] + 20, c[0]):
        items = scan([tmp_path], start=MB, end=LSN(end))
        assert [x.xid for x in of(items, XactRecord)] == [1, 2]
        assert items[-1].reason is StopReason.END and items[-1].scanned_to == LSN(end)
    assert [x.xid for x in of(scan([tmp_path], end=LSN(c[0] + 34)), XactRecord)] == [1, 2, 3]
    items = scan([tmp_path], start=MB, end=LSN(b[1]))
    assert [x.xid for x in of(items, XactRecord)] == [1, 2]
    assert items[-1].records == 3


# =========================================================================== end of WAL


def test_end_of_wal_cases(tmp_path):
    def case(name, build, reason):
        w = WalWriter()
        w.commit(1)
        last = w.commit(2)
        build(w)
        d = w.write(tmp_path / name)
        items = scan([d])
        end = items[-1]
        assert end.reason is StopReason.END_OF_WAL, (name, end)
        assert end.end_of_wal.lsn.value >= last[1] or name == "crc", name
        assert reason in end.end_of_wal.reason, (name, end.end_of_wal.reason)
        # Header, page and decoded-record checks do not need the tail check: reading
        # with Verify.RECORDS (the page walk's own checks) ends at the same place.
        assert scan([d], verify=Verify.RECORDS) == items, name
        return items

    # A bad prev-link: a stale record where the next one should be.
    case("prev", lambda w: w.commit(3, prev=12345), "incorrect prev-link")

    # The same with the record's header split over two pages (checked once whole).
    def split(w):
        w.to_page_offset(B - 8)
        w.commit(3, prev=12345)

    items = case("split", split, "incorrect prev-link")
    assert items[-1].end_of_wal.found_at.value % B == B - 8
    # A record with an unknown resource manager.
    case("rmgr", lambda w: w.record(77, 0, b"xx"), "invalid resource manager ID 77")
    # A bad checksum on a record it decodes: the end is before it.
    items = case(
        "crc", lambda w: w.commit(3, bad_crc=True), "incorrect resource manager data checksum"
    )
    assert [x.xid for x in of(items, XactRecord)] == [1, 2]

    # A recycled segment after a switch: a stale page address.
    def recycled(w):
        w.switch()
        old = WalWriter(segno=0)
        old.commit(99)
        w.files[(1, 2)] = old.files[(1, 0)]

    items = case("recycled", recycled, "unexpected pageaddr 0/0")
    assert items[-1].end_of_wal.found_at == LSN(2 * MB)
    assert items[-1].end_of_wal.offset == 0

    # A continuation page that is not one: the record lost its continuation.
    def lost(w):
        w.filler(B)
        page = w.pos - w.pos % B
        w.files[(1, 1)][page % MB : page % MB + B] = bytes(B)

    items = case("lost", lost, "invalid magic number 0000")
    eow = items[-1].end_of_wal
    assert eow.aborted_lsn is not None and eow.found_at.value % B == 0
    assert eow.lsn == eow.aborted_lsn < eow.found_at  # the end of the record before it

    # A continuation page of a skipped record: another version's magic, or a
    # remaining length that does not add up.
    def continuation(offset, value):
        def build(w):
            start, _end = w.filler(3 * B)
            page = start - start % B + 2 * B
            struct.pack_into(
                "<H" if offset == 0 else "<I", w.files[(1, 1)], page % MB + offset, value
            )

        return build

    case("cmagic", continuation(0, MAGIC[16]), "invalid magic number D113 (PostgreSQL 16's)")
    items = case("clen", continuation(16, 100), "invalid contrecord length 100")
    assert items[-1].end_of_wal.aborted_lsn is not None

    # Another version's page in the middle of the WAL.
    def other(w):
        w.magic = MAGIC[16]
        w.switch()
        w.commit(3)

    case("other", other, "(PostgreSQL 16's)")


def test_torn_tail_is_found_as_replay_finds_it(tmp_path):
    """A skipped record with a bad body in the last segment: replay stops at it.

    With Verify.TAIL (the default) the reader checks every record of the last
    segments before the end and holds back what comes after; with
    Verify.RECORDS it does not notice; with Verify.ALL it stops there too."""
    w = WalWriter()
    w.commit(1)
    torn = w.filler(500)
    w.commit(2)
    w.restore_point("after torn")
    w.write(tmp_path)
    seg = tmp_path / segment_name(1, 1, MB)
    data = bytearray(seg.read_bytes())
    data[torn[0] - MB + 300] ^= 0xFF
    seg.write_bytes(bytes(data))
    tail = scan([tmp_path])
    assert [x.xid for x in of(tail, XactRecord)] == [1]
    assert not of(tail, RestorePointRecord)
    eow = tail[-1].end_of_wal
    assert (eow.lsn, eow.found_at) == (LSN(torn[0]), LSN(torn[0]))
    assert "checksum" in eow.reason
    assert scan([tmp_path], verify=Verify.ALL)[-1].end_of_wal == eow
    loose = scan([tmp_path], verify=Verify.RECORDS)
    assert [x.xid for x in of(loose, XactRecord)] == [1, 2]


def test_the_tail_window_is_the_last_stretch_read(tmp_path):
    """Verify.TAIL checks the last 2 MB here (two 1 MB segments): damage before that
    is not found (records after it are reported, the end is the real one); damage in
    it is (nothing after it is reported). Either way every record reported is before
    the end of valid WAL reported."""
    w = WalWriter()
    early = w.filler(500)
    for i in range(150):
        w.commit(100 + i)
        w.filler(20000)
    late = w.filler(500)
    w.commit(999)
    d = w.write(tmp_path)
    seg = {n: d / segment_name(1, n, MB) for n in (1, 2, 3, 4)}
    clean = scan([d])
    assert clean[-1].end_of_wal.lsn.value > 3 * MB

    def damaged(at):
        path = seg[at // MB]
        data = bytearray(path.read_bytes())
        data[at % MB] ^= 0x10
        path.write_bytes(bytes(data))
        items = scan([d])
        data[at % MB] ^= 0x10
        path.write_bytes(bytes(data))
        eow = items[-1].end_of_wal
        assert all(x.lsn < eow.lsn for x in of(items, XactRecord))
        return items, eow

    items, eow = damaged(early[0] + 300)
    assert eow == clean[-1].end_of_wal
    assert len(of(items, XactRecord)) == 151
    items, eow = damaged(late[0] + 300)
    assert eow.found_at == LSN(late[0]) and "checksum" in eow.reason
    assert len(of(items, XactRecord)) == 150


def test_all_verifies_records_on_every_page_and_across_pages(tmp_path):
    w = WalWriter()
    w.commit(1)
    big = w.filler(3 * B)
    w.commit(2)
    w.write(tmp_path)
    assert [x.xid for x in of(scan([tmp_path], verify=Verify.ALL), XactRecord)] == [1, 2]
    seg = tmp_path / segment_name(1, 1, MB)
    data = bytearray(seg.read_bytes())
    data[big[0] - MB + 2 * B + 100] ^= 1  # inside the record, on its third page
    seg.write_bytes(bytes(data))
    items = scan([tmp_path], verify=Verify.ALL)
    assert [x.xid for x in of(items, XactRecord)] == [1]
    assert items[-1].end_of_wal.found_at == LSN(big[0])


def test_overwritten_contrecord_is_skipped(tmp_path):
    w = WalWriter()
    c1 = w.commit(1)
    aborted = w.filler(3 * B)  # its continuation pages are lost...
    page = aborted[0] - aborted[0] % B + B
    for p in range(page, aborted[1], B):
        w.files[(1, 1)][p % MB : p % MB + B] = bytes(B)
    # ... and crash recovery writes the overwrite record there, linked to record 1.
    w.pos, w.prev, w.flags = page, c1[0], 0x0008
    ow = w.overwrite_contrecord(aborted[0])
    w.commit(2)
    w.write(tmp_path)
    items = scan([tmp_path])
    assert of(items, OverwriteContrecordRecord) == [
        OverwriteContrecordRecord(LSN(ow[0]), LSN(ow[1]), LSN(aborted[0]), T0, 1)
    ]
    assert [x.xid for x in of(items, XactRecord)] == [1, 2]
    assert items[-1].records == 3  # the aborted record is not one
    # An overwrite record naming another record is where replay fails.
    w2 = WalWriter()
    c1 = w2.commit(1)
    a2 = w2.filler(3 * B)
    page = a2[0] - a2[0] % B + B
    w2.pos, w2.prev, w2.flags = page, c1[0], 0x0008
    w2.overwrite_contrecord(a2[0] + 8)
    d = w2.write(tmp_path / "mismatch")
    items = scan([d])
    assert "mismatching overwritten LSN" in items[-1].end_of_wal.reason


# =========================================================================== files


def test_missing_segment_and_first_directory_wins(tmp_path):
    w = WalWriter()
    w.commit(1)
    w.filler(2 * MB)
    w.commit(2)
    w.write(tmp_path / "all")
    (tmp_path / "archive").mkdir()
    (tmp_path / "pg_wal").mkdir()
    for n in (1, 2):
        name = segment_name(1, n, MB)
        (tmp_path / "archive" / name).write_bytes((tmp_path / "all" / name).read_bytes())
    items = scan([tmp_path / "archive"])
    end = items[-1]
    assert end.reason is StopReason.MISSING_SEGMENT and not end.complete
    assert end.missing == segment_name(1, 3, MB)
    assert end.scanned_to == LSN(3 * MB)
    assert [x.xid for x in of(items, XactRecord)] == [1]
    # A surviving pg_wal holds the rest; a wrong copy there loses to the archive's.
    name3 = segment_name(1, 3, MB)
    (tmp_path / "pg_wal" / name3).write_bytes((tmp_path / "all" / name3).read_bytes())
    (tmp_path / "pg_wal" / segment_name(1, 1, MB)).write_bytes(bytes(MB))
    items = scan([tmp_path / "archive", tmp_path / "pg_wal"])
    assert [x.xid for x in of(items, XactRecord)] == [1, 2]
    assert of(items, SegmentRead)[-1].path == str(tmp_path / "pg_wal" / name3)


def test_wrong_size_copies(tmp_path, caplog):
    w = WalWriter()
    w.commit(1)
    d = w.write(tmp_path / "good")
    name = segment_name(1, 1, MB)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / name).write_bytes((d / name).read_bytes()[: MB // 2])
    # Passed over for a good copy in a later directory...
    items = scan([bad, d])
    assert of(items, SegmentRead)[0].path == str(d / name)
    assert "passing over" in caplog.text
    # ... and an error naming it when it is the only copy.
    with pytest.raises(ArchiveError, match=f"{name} is 524288 bytes") as err:
        scan([bad], segment_size=MB)
    assert err.value.details["path"] == str(bad / name)
    with pytest.raises(ArchiveError, match="cannot tell the WAL segment size") as err:
        scan([bad])
    assert err.value.details["path"] == str(bad / name)


def test_compressed_segments(tmp_path):
    w = WalWriter()
    for i in range(30):
        w.commit(i + 10)
        w.filler(50000)
    d = w.write(tmp_path / "plain")
    plain = scan([d])
    packed = tmp_path / "packed"
    packed.mkdir()
    packers: dict[str, Callable[[bytes], bytes]] = {
        "gz": gzip.compress,
        "bz2": bz2.compress,
        "xz": lzma.compress,
    }
    for i, f in enumerate(sorted(d.iterdir())):
        suffix = list(packers)[i % 3]
        (packed / f"{f.name}.{suffix}").write_bytes(packers[suffix](f.read_bytes()))

    def same(items):
        eow = items[-1].end_of_wal
        eow = attrs.evolve(eow, path=None)
        return [i for i in items[:-2] if not isinstance(i, SegmentRead)] + [eow]

    again = scan([packed])
    assert same(again) == same(plain)
    # A truncated or corrupt compressed copy is an error naming it.
    first = sorted(packed.iterdir())[0]
    first.write_bytes(first.read_bytes()[:-200])
    with pytest.raises(ArchiveError) as err:
        scan([packed])
    assert err.value.details["path"] == str(first)
    first.write_bytes(b"\x1f\x8b" + os.urandom(500))
    with pytest.raises(ArchiveError, match=first.name):
        scan([packed])


def test_a_gzip_segment_too_long_is_an_error(tmp_path):
    w = WalWriter()
    w.commit(1)
    d = w.write(tmp_path / "plain")
    name = segment_name(1, 1, MB)
    out = tmp_path / "gz"
    out.mkdir()
    (out / f"{name}.gz").write_bytes(gzip.compress((d / name).read_bytes() + b"x"))
    with pytest.raises(ArchiveError, match="more than a segment"):
        scan([out], segment_size=MB, end=LSN(2 * MB))


@pytest.mark.parametrize("suffix", ["zst", "lz4"])
def test_zstd_and_lz4_need_a_module_or_program(tmp_path, monkeypatch, suffix):
    w = WalWriter()
    w.commit(1)
    d = w.write(tmp_path / "plain")
    name = segment_name(1, 1, MB)
    packed = tmp_path / "packed"
    packed.mkdir()
    target = packed / f"{name}.{suffix}"
    program = {"zst": "zstd", "lz4": "lz4"}[suffix]
    if walreader._which(program) is None:
        pytest.fail(f"{program} is needed for this test (apt-get install {program})")
    import subprocess

    args = (
        ["-q", "-o", str(target), str(d / name)]
        if suffix == "zst"
        else ["-q", str(d / name), str(target)]
    )
    subprocess.run([program, *args], check=True)
    assert [x.xid for x in of(scan([packed], segment_size=MB), XactRecord)] == [1]
    monkeypatch.setattr(walreader, "_which", lambda name: None)
    monkeypatch.setattr(walreader, "_optional_module", lambda name: None)
    with pytest.raises(ArchiveError, match="is available") as err:
        scan([packed], segment_size=MB)
    assert err.value.details["path"] == str(target)
    assert program in str(err.value)


def test_another_cluster_and_not_wal(tmp_path):
    w = WalWriter()
    w.commit(1)
    w.switch()
    w.commit(2)
    d = w.write(tmp_path / "mixed")
    other = WalWriter(sysid=SYSID + 1, segno=2)
    other.commit(3)
    name = segment_name(1, 2, MB)
    (d / name).write_bytes(bytes(other.files[(1, 2)]))
    with pytest.raises(ArchiveError, match="belongs to another cluster") as err:
        scan([d])
    assert err.value.details["path"] == str(d / name)
    # A system identifier given by the caller is checked on the first segment too.
    with pytest.raises(ArchiveError, match="another cluster"):
        scan([d], end=LSN(2 * MB), system_identifier=str(SYSID + 5))
    assert of(scan([d], end=LSN(2 * MB), system_identifier=SYSID), XactRecord)
    # Random bytes where the first segment should be.
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / segment_name(1, 1, MB)).write_bytes(random.Random(1).randbytes(MB))
    with pytest.raises(ArchiveError, match="not a WAL segment of PostgreSQL 12-18") as err:
        scan([junk], segment_size=MB)
    assert err.value.details["offset"] == 0


def test_segment_size_is_detected(tmp_path):
    w = WalWriter(segsz=2 * MB)
    w.commit(1)
    d = w.write(tmp_path)
    (d / "000000010000000000000009").write_bytes(b"short")  # not a segment: ignored
    items = scan([d], start=2 * MB)
    assert [x.xid for x in of(items, XactRecord)] == [1]
    h = read_segment_header(d / segment_name(1, 1, 2 * MB))
    assert (h.major, h.segment_size, h.system_identifier, h.block_size) == (15, 2 * MB, SYSID, B)
    assert h.pageaddr == LSN(2 * MB) and h.timeline == 1
    # No segment at all: nothing is known.
    empty = tmp_path / "empty"
    empty.mkdir()
    end = scan([empty])[-1]
    assert end.reason is StopReason.MISSING_SEGMENT and end.scanned_to == LSN(MB)


# =========================================================================== timelines


def two_timelines(tmp_path):
    """Timeline 1 to a switchpoint S, timeline 2 from S (end-of-recovery record first);
    timeline 1 goes on past S with other records."""
    w1 = WalWriter()
    w1.commit(1)
    w1.filler(MB)
    w1.commit(2)
    switch = w1.pos
    w2 = w1.fork(2)
    w2.end_of_recovery(2, 1)
    w2.commit(20)
    w2.filler(MB)
    w2.commit(21)
    w2.commit(22, kind="abort")
    w1.commit(3)  # timeline 1 only, after S
    w1.filler(MB)
    w1.commit(4)
    w1.write(tmp_path / "all")
    return LSN(switch), [TimelineSpan(1, None, LSN(switch)), TimelineSpan(2, LSN(switch), None)]


def test_a_timeline_path(tmp_path):
    switch, path = two_timelines(tmp_path)
    d = tmp_path / "all"
    items = scan([d], path)
    assert [(x.xid, x.timeline) for x in of(items, XactRecord)] == [
        (1, 1),
        (2, 1),
        (20, 2),
        (21, 2),
        (22, 2),
    ]
    assert of(items, TimelineSwitch) == [TimelineSwitch(switch, 1, 2)]
    eor = of(items, EndOfRecoveryRecord)[0]
    assert (eor.lsn, eor.this_timeline, eor.prev_timeline, eor.timeline) == (switch, 2, 1, 2)
    # The switch segment is read from the child's file.
    seg = switch.value // MB
    assert [(r.segno, r.timeline) for r in of(items, SegmentRead)] == [
        (s, 1) for s in range(1, seg)
    ] + [(s, 2) for s in range(seg, seg + 2)]
    # Timeline 1 alone goes on with its own records.
    assert [x.xid for x in of(scan([d]), XactRecord)] == [1, 2, 3, 4]
    # events over the path, as the planner gets them
    events = scan_events([str(d)], path, LSN(MB), LSN_MAX)
    assert isinstance(events, WalEvents)
    assert [c[2] for c in events.commits] == [1, 2, 20, 21]  # not the abort
    assert events.complete and events.end_of_wal is not None
    assert events.scanned_from == LSN(MB)


def test_a_missing_child_segment_ends_at_the_switchpoint(tmp_path):
    switch, path = two_timelines(tmp_path)
    d = tmp_path / "all"
    seg = switch.value // MB
    (d / segment_name(2, seg, MB)).unlink()
    # The parent's copy serves up to the switchpoint, not beyond.
    items = scan([d], path)
    assert [x.xid for x in of(items, XactRecord)] == [1, 2]
    end = items[-1]
    assert end.reason is StopReason.MISSING_SEGMENT
    assert end.missing == segment_name(2, seg, MB)
    assert end.scanned_to == switch
    # With only the parent's .partial copy of the switch segment, the same.
    parent = d / segment_name(1, seg, MB)
    parent.rename(d / f"{parent.name}.partial")
    items = scan([d], path)
    assert [x.xid for x in of(items, XactRecord)] == [1, 2]
    assert of(items, SegmentRead)[-1].path.endswith(".partial")


def test_a_page_of_a_timeline_off_the_path_ends_the_wal(tmp_path):
    switch, _path = two_timelines(tmp_path)
    d = tmp_path / "all"
    # Timeline 2's file read as if it were on a path 1 -> 3: its pages say 2.
    seg = switch.value // MB
    (d / segment_name(2, seg, MB)).rename(d / segment_name(3, seg, MB))
    (d / segment_name(2, seg + 1, MB)).rename(d / segment_name(3, seg + 1, MB))
    path3 = [TimelineSpan(1, None, switch), TimelineSpan(3, switch, None)]
    items = scan([d], path3)
    assert "unexpected timeline ID 2" in items[-1].end_of_wal.reason


# =========================================================================== arguments and decoding details


def test_arguments(tmp_path):
    w = WalWriter()
    w.commit(1)
    d = w.write(tmp_path)
    with pytest.raises(InputError):
        scan([d], major=11)
    with pytest.raises(InputError):
        scan([d], chunk_size=1000)
    with pytest.raises(InputError):
        scan([d], system_identifier="not a number")
    with pytest.raises(InputError):
        scan([d], segment_size=3 * MB)
    assert scan([d], spans=[])[-1] == ScanEnd(StopReason.END, LSN(MB), LSN(MB))
    assert scan([d], start=2 * MB, end=LSN(MB))[-1].reason is StopReason.END


@pytest.mark.parametrize("major", [13, 14, 15, 18])
def test_main_data_after_block_headers(tmp_path, major):
    """A decoded record with block references: the main data comes after them
    (an image with a hole, compressed as each version flags it, then a block of
    the same relation, a replication origin and a top-level xid)."""
    compressed = 0x02 if major <= 14 else 0x04
    blocks = struct.pack("<BBH", 0, 0x10 | 0x20, 4) + struct.pack(
        "<HHB", 100, 10, 0x01 | compressed
    )
    blocks += struct.pack("<H", 500) + bytes(12) + struct.pack("<I", 7)
    blocks += struct.pack("<BBH", 1, 0x80 | 0x20, 3) + struct.pack("<I", 8)
    blocks += b"\xfd" + struct.pack("<H", 9)
    if major >= 14:
        blocks += b"\xfc" + struct.pack("<I", 1234)
    w = WalWriter(major=major)
    w.commit(42, blocks=blocks, data=bytes(4 + 100 + 3))
    w.commit(43, kind="commit_prepared", twophase=44, blocks=b"\xfd" + struct.pack("<H", 9))
    d = w.write(tmp_path)
    assert [x.xid for x in of(scan([d]), XactRecord)] == [42, 44]
    # A block header that does not add up is a bad record, the end of the WAL.
    w = WalWriter(major=major)
    w.commit(45, blocks=struct.pack("<BBH", 0, 0x20, 0) + bytes(16))
    items = scan([w.write(tmp_path / "bad")])
    assert not of(items, XactRecord)
    assert "invalid record headers" in items[-1].end_of_wal.reason


# =========================================================================== issue 19


def test_segment_problem_says_why_a_file_cannot_be_replayed(tmp_path):
    """What PostgreSQL would stop on after the point of no return, found before it."""
    import gzip as gz

    from pgsnap.wal.reader import find_segment_file, segment_problem

    w = WalWriter(segno=3)
    w.record(1, 0, b"x" * 100)
    good = bytes(w.files[(1, 3)])
    name = segment_name(1, 3, MB)

    def judged(data: bytes, file_name: str = name, **kw) -> str | None:
        path = tmp_path / file_name
        path.write_bytes(data)
        try:
            return segment_problem(
                path, segment_size=MB, system_identifier=str(SYSID), major=15, **kw
            )
        finally:
            path.unlink()

    assert judged(good) is None
    assert judged(good[:8192]) == (
        "8192 bytes, not a 1048576-byte segment (a truncated or partial copy)"
    )
    other = bytearray(good)
    other[24:32] = struct.pack("<Q", 99)
    problem = judged(bytes(other))
    assert problem is not None and "WAL of another cluster (system identifier 99" in problem
    moved = judged(good, segment_name(1, 4, MB))  # a copy under the next segment's name
    assert moved is not None and "not that of its name" in moved
    problem = judged(b"\0" * MB)
    assert problem is not None and "not WAL" in problem
    assert judged(good, segment_name(1, 3, MB)) is None
    problem = segment_problem(_write(tmp_path / name, good), segment_size=MB, major=16)
    assert problem is not None and "PostgreSQL 15, not 16" in problem
    # Compressed copies are judged by what they decompress to (gzip's size trailer).
    (tmp_path / name).unlink()
    assert judged(gz.compress(good), name + ".gz") is None
    problem = judged(gz.compress(good[:8192]), name + ".gz")
    assert problem is not None and "8192 bytes" in problem
    (tmp_path / f"{name}.gz").write_bytes(gz.compress(good))
    assert find_segment_file(tmp_path, name) == str(tmp_path / f"{name}.gz")
    assert find_segment_file(tmp_path, segment_name(1, 9, MB)) is None


def _write(path, data: bytes):
    path.write_bytes(data)
    return path
