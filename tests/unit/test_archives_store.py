"""pgsnap's own WAL archive without a server: the object format, pushes that are
atomic and never overwrite, reads frame by frame, encryption, and the directory store
it runs on here (tests/integration/test_wal_store_s3.py runs it on S3)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap.archives.format import (
    HEADER_SIZE,
    decode_frame,
    encode,
    frames,
    parse_header,
)
from pgsnap.archives.store import StoreWalArchive, etag_version, wal_key
from pgsnap.copies.keys import CopyKey
from pgsnap.errors import ArchiveError, WalNameError
from pgsnap.stores import DirectoryStore, StoreErrors
from pgsnap.testing.wal_conformance import SEGMENT_SIZE, segment_bytes
from pgsnap.wal import segment_name

ERRORS = StoreErrors(failed=ArchiveError, missing=ArchiveError, refused=ArchiveError)
SEG = segment_name(1, 3, SEGMENT_SIZE)


def read_all(stored: bytes, name: str, key: CopyKey | None = None) -> bytes:
    header = parse_header(stored, name=name, where="test")
    return b"".join(
        frames(header, lambda o, n: stored[o : o + n], name=name, where="test", key=key)
    )


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=5000),
    frame=st.integers(min_value=1, max_value=4096),
    compress=st.booleans(),
)
def test_any_content_round_trips_through_frames(data: bytes, frame: int, compress: bool) -> None:
    stored = encode(SEG, data, frame=frame, compress=compress)
    header = parse_header(stored, name=SEG, where="test")
    assert header.size == len(data) and len(header.lengths) == -(-len(data) // frame)
    assert read_all(stored, SEG) == data


def test_a_large_empty_content_round_trips() -> None:
    data = b"\0" * 70000
    assert read_all(encode(SEG, data, frame=4096), SEG) == data


def test_a_segment_compresses_and_its_page_header_costs_one_frame() -> None:
    data = segment_bytes(1, 3)
    stored = encode(SEG, data, frame=64 * 1024)
    assert len(stored) < len(data) // 4  # mostly zeros: it compresses
    header = parse_header(stored[:4096], name=SEG, where="test")
    offset, length = header.frame_range(0)
    first = decode_frame(header, 0, stored[offset : offset + length], name=SEG, where="t", key=None)
    assert first[:40] == data[:40]


def test_damage_is_found_and_named(tmp_path: Path) -> None:
    data = segment_bytes(1, 3)
    stored = bytearray(encode(SEG, data, frame=64 * 1024, compress=False))
    stored[-10] ^= 0xFF  # a byte of the last frame
    with pytest.raises(ArchiveError, match="not what was archived"):
        read_all(bytes(stored), SEG)
    with pytest.raises(ArchiveError, match="no header"):
        parse_header(b"garbage" * 20, name=SEG, where="test")
    good = encode(SEG, data)
    with pytest.raises(ArchiveError, match="cut short"):
        parse_header(good[: HEADER_SIZE + 2], name=SEG, where="test")


@pytest.fixture
def key(tmp_path: Path) -> CopyKey:
    return CopyKey.generate(tmp_path / "wal.key")


def test_encrypted_frames_open_only_with_the_key_and_under_their_name(
    key: CopyKey, tmp_path: Path
) -> None:
    data = segment_bytes(1, 3)
    stored = encode(SEG, data, key=key, frame=256 * 1024)
    assert read_all(stored, SEG, key) == data
    assert data[:40] not in stored  # nothing of the content in clear
    assert parse_header(stored, name=SEG, where="t").digest.hex() == key.chunk_id(data)
    with pytest.raises(ArchiveError, match="no key"):
        read_all(stored, SEG)
    other = CopyKey.generate(tmp_path / "other.key")
    with pytest.raises(ArchiveError, match="does not decrypt"):
        read_all(stored, SEG, other)
    moved = segment_name(1, 4, SEGMENT_SIZE)  # the same object under another name
    with pytest.raises(ArchiveError, match="does not decrypt"):
        read_all(stored, moved, key)


def test_keys_place_files_by_timeline_and_log() -> None:
    assert wal_key("000000020000000A000000FF") == "wal/000000020000000A/000000020000000A000000FF"
    assert wal_key("00000002.history") == "wal/history/00000002.history"
    assert wal_key(f"{SEG}.00000028.backup") == f"wal/{SEG[:16]}/{SEG}.00000028.backup"
    assert wal_key(f"{SEG}.partial") == f"wal/{SEG[:16]}/{SEG}.partial"
    for bad in ("../x", f"{SEG}.gz", "RECOVERYXLOG", "", "000000000000000000000001"):
        with pytest.raises(WalNameError):
            wal_key(bad)


@pytest.fixture
def archive(tmp_path: Path) -> StoreWalArchive:
    (tmp_path / "store").mkdir()
    return StoreWalArchive(
        DirectoryStore(tmp_path / "store", ERRORS), frame=64 * 1024, restore_command="x"
    )


def test_a_push_is_written_once_and_the_same_content_again_succeeds(
    archive: StoreWalArchive,
) -> None:
    data = segment_bytes(1, 3)
    assert archive.push(SEG, data) is True
    assert archive.push(SEG, data) is False  # again, the same: success, nothing written
    with pytest.raises(ArchiveError, match="with other content: it is never overwritten") as info:
        archive.push(SEG, segment_bytes(1, 3, system_identifier=42))
    assert "second cluster" in (info.value.hint or "")
    assert archive.fetch(SEG) == data  # the first stays
    assert archive.list_names() == (SEG,)


def test_racing_pushes_of_one_file_leave_one_object(archive: StoreWalArchive) -> None:
    data = segment_bytes(1, 3)
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(archive.push(SEG, data))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert archive.fetch(SEG) == data


def test_the_archive_reads_as_a_wal_archive(archive: StoreWalArchive, tmp_path: Path) -> None:
    names = [segment_name(1, n, SEGMENT_SIZE) for n in (1, 2, 3)]
    for n, name in enumerate(names, 1):
        archive.push(name, segment_bytes(1, n))
    archive.push("00000002.history", b"1\t0/3000000\tno recovery target specified\n")
    assert archive.list_names() == (*names, "00000002.history")
    found = archive.stat(names[0])
    assert found is not None and found.size == found.content_size == SEGMENT_SIZE
    assert found.identity == archive.stat(names[0]).identity  # type: ignore[union-attr]
    assert archive.stat(segment_name(1, 9, SEGMENT_SIZE)) is None
    stream = archive.open(names[1])
    assert stream.read(40) == segment_bytes(1, 2)[:40]
    rest = stream.read()
    stream.close()
    assert len(rest) == SEGMENT_SIZE - 40
    index = archive.index(SEGMENT_SIZE)
    assert index.history_names == ("00000002.history",)
    assert archive.histories().path(2)
    assert archive.delete([names[0], "000000010000000000000099"]) == 1
    assert not archive.exists(names[0]) and archive.exists(names[1])


def test_a_damaged_object_is_refused_when_read(archive: StoreWalArchive, tmp_path: Path) -> None:
    archive.push(SEG, segment_bytes(1, 3))
    path = tmp_path / "store" / wal_key(SEG)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x55
    path.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError):
        archive.fetch(SEG)
    with pytest.raises(ArchiveError):
        archive.open(SEG).read()


def test_etag_versions_are_stable_numbers() -> None:
    assert etag_version('"abc"') == etag_version('"abc"') != etag_version('"abd"')
    assert 0 <= etag_version("x") < 2**60


def test_the_directory_store_writes_atomically_and_lists_in_order(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "s", ERRORS)
    with pytest.raises(ArchiveError, match="does not exist"):
        store.put("a", b"1")  # a missing mount is not filled in its place
    (tmp_path / "s").mkdir()
    assert store.put("a/b/c", b"1") is True
    assert store.put("a/b/c", b"2", if_absent=True) is False
    assert store.get("a/b/c") == b"1"
    assert store.put("a/b/c", b"22") is True and store.get("a/b/c") == b"22"
    assert store.get_range("a/b/c", 1, 10) == b"2"
    store.put("a/a", b"x")
    (tmp_path / "s" / "a" / ".tmp-left").write_bytes(b"half")  # a write cut short
    assert [o.key for o in store.list("a/")] == ["a/a", "a/b/c"]
    before = store.head("a/a")
    assert before is not None and before.size == 1
    os.utime(tmp_path / "s" / "a" / "a", ns=(1, 1))
    assert store.head("a/a") != before  # the tag follows the file
    with pytest.raises(ArchiveError):
        store.get("nope")
    with pytest.raises(ArchiveError):
        store.put("../escape", b"x")
    store.delete("a/a")
    store.delete("a/a")
    assert store.head("a/a") is None


# --------------------------------------------------------------------------- push and get


def test_push_ahead_sends_the_ready_files_and_notes_them(
    archive: StoreWalArchive, tmp_path: Path
) -> None:
    from pgsnap.archives.transfer import push_wal

    wal = tmp_path / "pg_wal"
    (wal / "archive_status").mkdir(parents=True)
    names = [segment_name(1, n, SEGMENT_SIZE) for n in (1, 2, 3, 4)]
    for n, name in enumerate(names, 1):
        (wal / name).write_bytes(segment_bytes(1, n))
        (wal / "archive_status" / f"{name}.ready").touch()
    spool = tmp_path / "spool"
    assert push_wal(archive, wal / names[0], spool=spool, ahead=2, parallel=2) is True
    assert archive.list_names() == tuple(names[:3])  # the asked one and two ahead
    assert sorted(p.name for p in (spool / "pushed").iterdir()) == names[1:3]
    (wal / "archive_status" / f"{names[0]}.ready").rename(wal / "archive_status" / "x.done")
    # PostgreSQL asks for the next: answered from the note, no request.
    assert push_wal(archive, wal / names[1], spool=spool, ahead=0) is False
    assert not (spool / "pushed" / names[1]).exists()
    # A file rewritten since it was noted is pushed, and refused: never overwritten.
    (wal / names[2]).write_bytes(segment_bytes(1, 3, system_identifier=99))
    with pytest.raises(ArchiveError, match="other content"):
        push_wal(archive, wal / names[2], spool=spool, ahead=0)


def test_get_serves_from_the_spool_and_the_prefetcher_keeps_it_ahead(
    archive: StoreWalArchive, tmp_path: Path
) -> None:
    from pgsnap.archives.transfer import get_wal, prefetch

    names = [segment_name(1, n, SEGMENT_SIZE) for n in range(1, 8)]
    for n, name in enumerate(names, 1):
        archive.push(name, segment_bytes(1, n))
    spool = tmp_path / "spool"
    dest = tmp_path / "RECOVERYXLOG"
    started: list[threading.Thread] = []

    def start() -> None:
        t = threading.Thread(
            target=prefetch, args=(archive, spool), kwargs={"ahead": 3, "idle": 1.0}
        )
        t.start()
        started.append(t)

    assert get_wal(archive, names[0], dest, spool=spool, ahead=3, start_prefetcher=start)
    assert dest.read_bytes() == segment_bytes(1, 1)
    deadline = time.monotonic() + 10
    while not all((spool / n).exists() for n in names[1:4]):
        assert time.monotonic() < deadline, list(spool.iterdir())
        time.sleep(0.02)
    for n, name in enumerate(names[1:6], 2):
        assert get_wal(archive, name, dest, spool=spool, ahead=3, start_prefetcher=start)
        assert dest.read_bytes() == segment_bytes(1, n)
    assert len(started) == 1  # one prefetcher the whole time
    # The end of the archive: nothing written, False; the spool stays bounded.
    missing = segment_name(1, 9, SEGMENT_SIZE)
    dest.unlink()
    assert not get_wal(archive, missing, dest, spool=spool, ahead=3, start_prefetcher=start)
    assert not dest.exists()
    assert len([p for p in spool.iterdir() if len(p.name) == 24]) <= 3
    for t in started:
        t.join(timeout=10)
    assert not [p for p in spool.iterdir() if len(p.name) == 24]  # emptied when idle


def test_get_waits_for_an_archive_it_cannot_reach_and_never_says_missing(
    tmp_path: Path,
) -> None:
    from pgsnap.archives.transfer import get_wal
    from pgsnap.errors import ArchiveUnavailable

    class Flaky(StoreWalArchive):
        fails = 3

        def exists(self, name: str) -> bool:
            if Flaky.fails:
                Flaky.fails -= 1
                raise ArchiveUnavailable("down", hint="")
            return super().exists(name)

    (tmp_path / "s").mkdir()
    flaky = Flaky(DirectoryStore(tmp_path / "s", ERRORS))
    flaky.push(SEG, segment_bytes(1, 3))
    waits: list[float] = []
    assert get_wal(flaky, SEG, tmp_path / "x", timeout=60, sleep=waits.append)
    assert waits == [0.5, 1.0, 2.0]
    Flaky.fails = 100
    with pytest.raises(ArchiveUnavailable):
        get_wal(flaky, SEG, tmp_path / "y", timeout=5, sleep=lambda _s: None)
    assert not (tmp_path / "y").exists()


def test_wal_get_exits_255_for_what_is_not_the_end_of_the_archive(tmp_path: Path) -> None:
    """PostgreSQL takes an exit status above 125 as fatal: a restore_command that cannot
    read its configuration must stop a recovery, not end it (1 would end it)."""
    from pgsnap.archives.commands import FATAL, main

    assert FATAL > 125
    assert main(["-c", str(tmp_path / "missing.toml"), "wal-get", SEG, "x"]) == FATAL
    assert main(["-c", str(tmp_path / "missing.toml"), "wal-get", SEG]) == FATAL  # usage
    assert main(["-c", str(tmp_path / "missing.toml"), "wal-push", "x"]) == 2
    (tmp_path / "store").mkdir()
    config = tmp_path / "c.toml"
    config.write_text(f'[archive]\nformat = "pgsnap"\npath = "{tmp_path / "store"}"\nahead = 0\n')
    assert main(["-c", str(config), "wal-get", SEG, str(tmp_path / "x")]) == 1  # not there
    seg = tmp_path / "pg_wal" / SEG
    seg.parent.mkdir()
    seg.write_bytes(segment_bytes(1, 3))
    assert main(["-c", str(config), "wal-push", str(seg)]) == 0
    assert main(["-c", str(config), "wal-get", SEG, str(tmp_path / "x")]) == 0
    assert (tmp_path / "x").read_bytes() == segment_bytes(1, 3)


def test_the_restore_command_takes_a_spooled_segment_without_starting_python(
    tmp_path: Path,
) -> None:
    """The shell fast path: a segment in the spool is moved to %p by sh alone; else the
    command runs pgsnap (here ``false``, which exits 1, so a miss shows)."""
    import subprocess

    from pgsnap.archives.config import archive_settings, wal_get_command

    settings = archive_settings({"format": "pgsnap", "path": str(tmp_path), "ahead": 4}, str)
    command = wal_get_command(settings, pgsnap="false")
    data = tmp_path / "data"
    spool = data / "pg_wal" / "pgsnap-spool"
    spool.mkdir(parents=True)
    (spool / SEG).write_bytes(b"segment")

    def run(name: str) -> int:
        line = command.replace("%f", name).replace("%p", "pg_wal/RECOVERYXLOG")
        return subprocess.run(["sh", "-c", line], cwd=data, check=False).returncode

    assert run(SEG) == 0
    assert (data / "pg_wal" / "RECOVERYXLOG").read_bytes() == b"segment"
    assert not (spool / SEG).exists()
    assert run(SEG) == 1  # not spooled any more: pgsnap is asked (false)
    assert run("00000002.history") == 1
    no_prefetch = archive_settings({"format": "pgsnap", "path": str(tmp_path), "ahead": 0}, str)
    assert wal_get_command(no_prefetch, pgsnap="p") == "p wal-get '%f' '%p'"


def test_the_prefetcher_follows_segments_taken_by_the_shell(
    archive: StoreWalArchive, tmp_path: Path
) -> None:
    from pgsnap.archives.transfer import note_wanted, prefetch

    names = [segment_name(1, n, SEGMENT_SIZE) for n in range(1, 10)]
    for n, name in enumerate(names, 1):
        archive.push(name, segment_bytes(1, n))
    spool = tmp_path / "spool"
    note_wanted(spool, names[0])  # the first wal-get
    worker = threading.Thread(
        target=prefetch, args=(archive, spool), kwargs={"ahead": 2, "idle": 1.0}
    )
    worker.start()
    for n, name in enumerate(names[1:7], 2):  # then sh takes each from the spool (a mv)
        deadline = time.monotonic() + 10
        while not (spool / name).exists():
            assert time.monotonic() < deadline, (name, sorted(p.name for p in spool.iterdir()))
            time.sleep(0.01)
        os.replace(spool / name, tmp_path / "RECOVERYXLOG")
        assert (tmp_path / "RECOVERYXLOG").read_bytes() == segment_bytes(1, n)
    worker.join(timeout=15)
    assert not worker.is_alive()
    assert not [p for p in spool.iterdir() if len(p.name) == 24]
