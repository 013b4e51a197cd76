"""pgsnap.copies: the copy format, the directory target, copy, restore and verify."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.copies import (
    CODECS,
    CopyStats,
    CopyTarget,
    DirectoryCopyTarget,
    EntryKind,
    Manifest,
    RestoreProgress,
    chunk_id,
    copy_trees,
    decode_chunk,
    decode_chunk_into,
    encode_chunk,
    restore_trees,
    verify_copy,
)
from pgsnap.errors import (
    ConfigurationError,
    CopyError,
    CopyNotFound,
    DamagedChunkError,
    FormatError,
)

CHUNK = 4096
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def make_tree(root: Path) -> Path:
    """A small data directory: nested directories, files of 0, 1, CHUNK and 3.5
    CHUNK bytes, a symbolic link, modes and times of their own."""
    (root / "base" / "1").mkdir(parents=True)
    (root / "global").mkdir()
    (root / "empty").write_bytes(b"")
    (root / "PG_VERSION").write_bytes(b"15\n")
    (root / "base" / "1" / "1259").write_bytes(os.urandom(CHUNK))
    (root / "global" / "pg_control").write_bytes(os.urandom(CHUNK * 3 + CHUNK // 2))
    (root / "pg_wal").symlink_to("/elsewhere/pg_wal")
    os.chmod(root / "PG_VERSION", 0o600)
    os.chmod(root / "base", 0o750)
    os.utime(root / "PG_VERSION", ns=(1_700_000_000_000_000_000, 1_700_000_000_123_456_789))
    return root


def snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """What a restore must reproduce: kind, mode, mtime and content (or link) of each
    entry, the top directory's time aside (its children's restore touches it last)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir", st.st_mode & 0o7777, st.st_mtime_ns)
            else:
                out[rel] = ("file", st.st_mode & 0o7777, st.st_mtime_ns, path.read_bytes())
    return out


@pytest.fixture
def target(tmp_path: Path) -> DirectoryCopyTarget:
    return DirectoryCopyTarget(tmp_path / "target")


def copy(
    tree: Path,
    target: CopyTarget,
    copy_id: str = "c1",
    *,
    codec: str = "zlib",
    files: dict[str, str] | None = None,
    parallel: int = 4,
) -> tuple[Manifest, CopyStats]:
    return copy_trees(
        {"pgdata": tree},
        target,
        copy_id=copy_id,
        backup_id="b1",
        chunk_size=CHUNK,
        codec=codec,
        files=files,
        clock=lambda: T0,
        parallel=parallel,
    )


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_a_copy_restores_to_the_same_tree(
    tmp_path: Path, target: DirectoryCopyTarget, codec: str
) -> None:
    tree = make_tree(tmp_path / "data")
    manifest, stats = copy(tree, target, codec=codec, files={"backup_label": "START WAL..."})
    assert target.manifest_ids() == ("c1",)
    assert Manifest.from_json(target.get_manifest("c1")) == manifest
    assert manifest.codec == codec and manifest.files == {"backup_label": "START WAL..."}
    assert stats.files == 4 and stats.bytes_read == manifest.size == 3 + CHUNK * 4 + CHUNK // 2
    assert stats.chunks_new == len(manifest.chunk_ids())
    pg_control = next(e for e in manifest.entries if e.path == "global/pg_control")
    assert pg_control.kind is EntryKind.FILE and len(pg_control.chunks) == 4
    written = restore_trees(manifest, target, {"pgdata": tmp_path / "restored"})
    assert written == manifest.size
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_a_second_copy_sends_only_the_chunks_that_changed(
    tmp_path: Path, target: DirectoryCopyTarget
) -> None:
    tree = make_tree(tmp_path / "data")
    first, s1 = copy(tree, target, "c1")
    control = tree / "global" / "pg_control"
    data = bytearray(control.read_bytes())
    data[CHUNK + 10] ^= 0xFF  # one byte of the second chunk
    control.write_bytes(bytes(data))
    second, s2 = copy(tree, target, "c2")
    assert s2.chunks_new == 1 and s2.chunks_reused == len(second.chunk_ids()) - 1
    assert s2.bytes_sent <= CHUNK + 16 and s2.bytes_sent < s1.bytes_sent
    assert target.manifest_ids() == ("c1", "c2")
    restore_trees(first, target, {"pgdata": tmp_path / "r1"})
    restore_trees(second, target, {"pgdata": tmp_path / "r2"})
    assert (tmp_path / "r2" / "global" / "pg_control").read_bytes() == bytes(data)
    assert (tmp_path / "r1" / "global" / "pg_control").read_bytes() != bytes(data)


class FailingTarget(DirectoryCopyTarget):
    """Fails the ``fail_at``-th chunk write, as a target that went away does."""

    def __init__(self, root: Path, fail_at: int) -> None:
        super().__init__(root)
        self.writes = 0
        self.fail_at = fail_at
        self._lock = threading.Lock()

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        with self._lock:  # called by the copy's upload threads
            self.writes += 1
            failing = self.writes == self.fail_at
        if failing:
            raise CopyError("the target went away")
        return super().put_chunk(chunk, data)


@pytest.mark.parametrize("parallel", [1, 4])
def test_an_interrupted_copy_leaves_no_manifest_and_the_next_run_sends_the_rest(
    tmp_path: Path, parallel: int
) -> None:
    tree = make_tree(tmp_path / "data")
    for n in range(4):  # more chunks than threads, so that the failure stops some
        (tree / f"more-{n}").write_bytes(bytes([n]) * CHUNK + os.urandom(CHUNK))
    failing = FailingTarget(tmp_path / "target", fail_at=4)
    with pytest.raises(CopyError, match="went away"):
        copy(tree, failing, parallel=parallel)
    assert failing.manifest_ids() == ()  # never a manifest for a partial copy
    assert failing.marker_names() == ("pending.c1",)  # kept: no collection takes the chunks
    sent_before = len(list(failing.chunk_ids()))
    # The three before the failure; with threads, at most the writes already under
    # way beside the failing one finish too, and nothing is begun after it.
    assert 3 <= sent_before <= 3 + parallel - 1
    assert failing.writes <= 4 + parallel - 1
    failing.fail_at = 0
    manifest, stats = copy(tree, failing, parallel=parallel)
    assert stats.chunks_reused >= sent_before
    assert stats.chunks_new == len(manifest.chunk_ids()) - sent_before
    restore_trees(manifest, failing, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_a_restore_never_writes_over_data(tmp_path: Path, target: DirectoryCopyTarget) -> None:
    tree = make_tree(tmp_path / "data")
    manifest, _ = copy(tree, target)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("precious")
    with pytest.raises(CopyError, match="not an empty directory"):
        restore_trees(manifest, target, {"pgdata": busy})
    assert [p.name for p in busy.iterdir()] == ["keep"]
    with pytest.raises(ConfigurationError, match="has no tree"):
        restore_trees(manifest, target, {"other": tmp_path / "x"})
    with pytest.raises(ConfigurationError, match="has no tree"):
        restore_trees(manifest, target, {})


def test_a_restore_fills_a_fresh_file_system_and_reports_its_progress(
    tmp_path: Path, target: DirectoryCopyTarget
) -> None:
    """A fresh file system's lost+found is not data; one chunk at a time or several
    ahead, the files come back the same, and progress ends at the whole."""
    tree = make_tree(tmp_path / "data")
    manifest, _ = copy(tree, target)
    fresh = tmp_path / "fresh"
    (fresh / "lost+found").mkdir(parents=True)
    seen: list[RestoreProgress] = []
    written = restore_trees(manifest, target, {"pgdata": fresh}, on_progress=seen.append)
    serial = restore_trees(manifest, target, {"pgdata": tmp_path / "serial"}, parallel=1)
    assert written == serial == sum(e.size for e in manifest.entries)
    assert snapshot(tmp_path / "serial") == snapshot(tree)
    assert {k: v for k, v in snapshot(fresh).items() if not k.startswith("lost+found")} == (
        snapshot(tree)
    )
    assert seen[-1].files_done == seen[-1].files_total
    assert [p.bytes_written for p in seen] == sorted(p.bytes_written for p in seen)
    assert [p.files_done for p in seen] == sorted(p.files_done for p in seen)
    assert seen[-1].bytes_written == seen[-1].bytes_total == written
    with pytest.raises(ConfigurationError, match="parallel"):
        restore_trees(manifest, target, {"pgdata": tmp_path / "p0"}, parallel=0)


def test_a_restore_refuses_a_manifest_whose_chunks_do_not_fit_the_file(
    tmp_path: Path, target: DirectoryCopyTarget
) -> None:
    """Each chunk is written at its index times the chunk size: a manifest whose
    sizes and chunks disagree is damage, found before a byte is written or as the
    chunk arrives, never a file silently the wrong length."""
    tree = make_tree(tmp_path / "data")
    manifest, _ = copy(tree, target)
    control = next(e for e in manifest.entries if e.path == "global/pg_control")

    def doctored(size: int) -> Manifest:
        entries = tuple(attrs.evolve(e, size=size) if e is control else e for e in manifest.entries)
        return attrs.evolve(manifest, entries=entries)

    with pytest.raises(DamagedChunkError, match="cannot hold"):
        restore_trees(doctored(size=control.size * 2), target, {"pgdata": tmp_path / "a"})
    assert not (tmp_path / "a").exists()
    with pytest.raises(DamagedChunkError, match="holds"):
        restore_trees(doctored(size=control.size - 1), target, {"pgdata": tmp_path / "b"})


@pytest.mark.parametrize("refuses", ["open", "write"])
def test_a_restore_writes_buffered_where_the_file_system_refuses_o_direct(
    tmp_path: Path, target: DirectoryCopyTarget, monkeypatch: pytest.MonkeyPatch, refuses: str
) -> None:
    """Aligned chunks are written with O_DIRECT; a file system that refuses it
    (EINVAL at open or at the write) gets buffered writes, and the same files."""
    import errno

    import pgsnap.copies.copier as copier

    tree = make_tree(tmp_path / "data")
    manifest, _ = copy(tree, target)
    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()
    tried: list[str] = []

    def fake_open(path: Any, flags: int, *args: Any) -> int:
        if flags & copier._O_DIRECT:
            tried.append(str(path))
            if refuses == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *args)
        if flags & copier._O_DIRECT:
            direct_fds.add(fd)
        return fd

    def fake_pwrite(fd: int, data: Any, offset: int) -> int:
        if fd in direct_fds:
            direct_fds.discard(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "pwrite", fake_pwrite)
    restore_trees(manifest, target, {"pgdata": tmp_path / "restored"}, parallel=1)
    monkeypatch.undo()
    assert tried  # O_DIRECT was asked for, once, then given up
    assert len(tried) == 1
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_verify_names_the_files_a_missing_or_damaged_chunk_breaks(
    tmp_path: Path, target: DirectoryCopyTarget
) -> None:
    tree = make_tree(tmp_path / "data")
    manifest, _ = copy(tree, target)
    copy(tree, target, "c2")  # a later copy of the same data shares its chunks
    assert verify_copy(target, "c1").ok
    control = next(e for e in manifest.entries if e.path == "global/pg_control")
    gone, bad = control.chunks[0], control.chunks[2]
    target.delete_chunk(gone)
    path = target.root / "chunks" / bad[:2] / bad
    stored = bytearray(path.read_bytes())
    stored[-1] ^= 0x01
    path.write_bytes(bytes(stored))
    report = verify_copy(target, "c1")
    assert not report.ok
    assert report.missing == {gone: ("pgdata/global/pg_control",)}
    assert report.damaged == {bad: ("pgdata/global/pg_control",)}
    assert report.chunks_checked == report.chunks_total == len(manifest.chunk_ids())
    assert "breaks pgdata/global/pg_control" in report.explain()
    # What else the chunks break: the other copy that names them.
    assert report.breaks == {gone: ("c2 (backup b1)",), bad: ("c2 (backup b1)",)}
    assert "and copies c2 (backup b1)" in report.explain() and report.backup_id == "b1"
    assert verify_copy(target, "c1", parallel=1).damaged == report.damaged
    with pytest.raises((CopyNotFound, DamagedChunkError)):
        restore_trees(manifest, target, {"pgdata": tmp_path / "restored"})
    sampled = verify_copy(target, "c1", sample=0.5, rng=random.Random(7))
    assert sampled.chunks_checked == round(sampled.chunks_total * 0.5)
    with pytest.raises(ConfigurationError):
        verify_copy(target, "c1", sample=0)
    with pytest.raises(CopyNotFound):
        verify_copy(target, "nosuch")


def test_stored_chunks_say_their_codec_and_are_checked_on_read() -> None:
    data = b"pgsnap " * 1000
    cid = chunk_id(data)
    for codec in CODECS:
        stored = encode_chunk(data, codec)
        assert stored[:4] == b"PGSC" and decode_chunk(stored, cid) == data
    noise = os.urandom(4096)
    assert encode_chunk(noise, "zlib")[4] == CODECS["none"]  # compression that does not pay
    with pytest.raises(DamagedChunkError, match="not a pgsnap chunk"):
        decode_chunk(b"junk", cid)
    with pytest.raises(DamagedChunkError, match="hash"):
        decode_chunk(encode_chunk(b"other", "zlib"), cid)
    with pytest.raises(DamagedChunkError, match="decompress"):
        decode_chunk(encode_chunk(data, "zlib")[:-5], cid)
    with pytest.raises(DamagedChunkError, match="codec"):
        decode_chunk(b"PGSC\x09" + data, cid)
    with pytest.raises(ConfigurationError, match="unknown chunk codec"):
        encode_chunk(data, "lz77")


def test_a_chunk_decodes_into_a_buffer_of_the_chunk_size() -> None:
    """What a restore does: one buffer a thread, used again for every chunk; a
    chunk that grows past it (beyond the copy's chunk size) is damage."""
    data = b"pgsnap " * 1000
    cid = chunk_id(data)
    buffer = memoryview(bytearray(len(data)))
    for codec in CODECS:
        assert decode_chunk_into(encode_chunk(data, codec), cid, buffer) == len(data)
        assert bytes(buffer) == data
    short = data[:7]
    assert decode_chunk_into(encode_chunk(short, "zstd"), chunk_id(short), buffer) == 7
    for codec in CODECS:
        with pytest.raises(DamagedChunkError, match="more than"):
            decode_chunk_into(encode_chunk(data, codec), cid, buffer[:-1])
        with pytest.raises(DamagedChunkError, match="hash"):
            decode_chunk_into(encode_chunk(b"other", codec), cid, buffer)
    with pytest.raises(DamagedChunkError, match=r"decompress|hash"):  # a cut frame: either
        decode_chunk_into(encode_chunk(data, "zstd")[:-5], cid, buffer)


def test_a_manifest_is_checked_when_read(tmp_path: Path, target: DirectoryCopyTarget) -> None:
    manifest, _ = copy(make_tree(tmp_path / "data"), target)
    text = manifest.to_json()
    assert Manifest.from_json(text).digest() == manifest.digest()
    doc = json.loads(text)
    for change, match in (
        ({"version": 2}, "version 2"),
        ({"format": "other"}, "not a pgsnap copy manifest"),
        ({"trees": []}, "does not list"),
    ):
        with pytest.raises(FormatError, match=match):
            Manifest.from_json(json.dumps({**doc, **change}))
    evil = {**doc, "entries": [{**doc["entries"][1], "path": "../../etc/passwd"}]}
    with pytest.raises(FormatError, match="not a relative path"):
        Manifest.from_json(json.dumps(evil))
    bad_chunk = [dict(e) for e in doc["entries"]]
    first_file = next(e for e in bad_chunk if e["kind"] == "file")
    first_file["chunks"] = ["not-a-chunk"]
    with pytest.raises(FormatError, match="chunk id"):
        Manifest.from_json(json.dumps({**doc, "entries": bad_chunk}))
    with pytest.raises(FormatError, match="not JSON"):
        Manifest.from_json("{")


def test_the_directory_target_refuses_names_that_are_not_ids(
    target: DirectoryCopyTarget,
) -> None:
    assert isinstance(target, CopyTarget)
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(ConfigurationError):
            target.put_manifest(bad, "{}")
    with pytest.raises(ConfigurationError):
        target.get_chunk("../../secret")
    cid = chunk_id(b"x")
    assert target.put_chunk(cid, encode_chunk(b"x", "zlib")) is True
    assert target.put_chunk(cid, b"ignored") is False  # immutable once written
    assert decode_chunk(target.get_chunk(cid), cid) == b"x"
    assert list(target.chunk_ids()) == [cid]
    target.delete_chunk(cid)
    target.delete_chunk(cid)  # absent: nothing to do
    with pytest.raises(CopyNotFound):
        target.get_chunk(cid)
    assert "target" in repr(target)
