"""barman-cloud's and WAL-G's archive layouts, name parsing, codecs, lengths and
restore commands (pgsnap.archives.barman, .walg, .toolarchive), in directory stores.

The layouts are those the tools' sources give (cited in the modules): what the real
barman-cloud writes is checked in tests/e2e/test_barman_archive_e2e.py; WAL-G's
cannot be (no WAL-G binary is installable here), so its objects are made here as
its writers make them (pierrec/lz4 defaults, the classic .lzma format, a zstd
stream without a content size, brotli).
"""

from __future__ import annotations

import bz2
import gzip
import importlib
import io
import lzma
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.archives import barman, toolarchive, walg
from pgsnap.archives.config import ERRORS, archive_settings, open_archive
from pgsnap.errors import ArchiveError, ConfigurationError, PgsnapError
from pgsnap.protocols import WalArchiveDeletion
from pgsnap.stores import DirectoryStore
from pgsnap.testing.wal_conformance import segment_bytes
from pgsnap.wal import archived_segment_problem, find_segment, segment_name

lz4frame: Any = importlib.import_module("lz4.frame")
zstandard: Any = importlib.import_module("zstandard")
brotli: Any = importlib.import_module("brotli")
snappy: Any = importlib.import_module("snappy")

SEG = 1024 * 1024
NAME = segment_name(1, 3, SEG)


def pierrec_lz4(data: bytes) -> bytes:
    """WAL-G's lz4 (pierrec/lz4/v4 defaults): 4 MiB blocks, content checksum, no size."""
    return bytes(
        lz4frame.compress(
            data, block_size=lz4frame.BLOCKSIZE_MAX4MB, content_checksum=True, store_size=False
        )
    )


def zstd_stream(data: bytes) -> bytes:
    """A zstd frame written as a stream (no content size), as klauspost's writer and
    barman's ``copy_stream`` write it."""
    out = io.BytesIO()
    zstandard.ZstdCompressor().copy_stream(io.BytesIO(data), out)
    return out.getvalue()


def snappy_stream(data: bytes) -> bytes:
    out = io.BytesIO()
    snappy.stream_compress(io.BytesIO(data), out)
    return out.getvalue()


def noisy_segment(segno: int = 3) -> bytes:
    """A segment whose middle does not compress (its objects exceed SMALL_OBJECT)."""
    plain = segment_bytes(1, segno)
    return plain[:8192] + os.urandom(256 * 1024) + plain[8192 + 256 * 1024 :]


class CountingStore(DirectoryStore):
    """A directory store that counts the reads of object content."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, ERRORS)
        self.reads: list[tuple[str, int, int]] = []

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self.reads.append((key, start, length))
        return super().get_range(key, start, length)

    def get(self, key: str) -> bytes:
        self.reads.append((key, 0, -1))
        return super().get(key)


def put(root: Path, key: str, data: bytes) -> None:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def walg_archive(root: Path, **kw: Any) -> walg.WalgWalArchive:
    return walg.WalgWalArchive(CountingStore(root), **kw)


def barman_archive(root: Path, server: str = "main") -> barman.BarmanCloudWalArchive:
    return barman.BarmanCloudWalArchive(CountingStore(root), server)


# --------------------------------------------------------------------------- layouts


def test_barman_keys() -> None:
    """``<server>/wals/<timeline and log>/<name>[suffix]``; histories in ``wals/``."""
    a = barman.BarmanCloudWalArchive(DirectoryStore("/nowhere", ERRORS), "pg")
    assert a.file_key(NAME) == f"pg/wals/0000000100000000/{NAME}"
    assert a.file_key("00000002.history") == "pg/wals/00000002.history"
    backup = f"{NAME}.00000028.backup"
    assert a.file_key(backup) == f"pg/wals/0000000100000000/{backup}"
    lower = "0000000a000000ff00000001"
    assert a.file_key(lower) == f"pg/wals/0000000A000000FF/{lower}"  # hash_dir's %08X
    good = {
        f"pg/wals/0000000100000000/{NAME}": (NAME, ""),
        f"pg/wals/0000000100000000/{NAME}.gz": (NAME, "gz"),
        f"pg/wals/0000000100000000/{NAME}.snappy": (NAME, "snappy"),
        f"pg/wals/0000000100000000/{NAME}.partial.zst": (f"{NAME}.partial", "zst"),
        f"pg/wals/0000000100000000/{backup}.bz2": (backup, "bz2"),
        "pg/wals/00000002.history.xz": ("00000002.history", "xz"),
        "pg/wals/00000002.history": ("00000002.history", ""),
    }
    for key, parsed in good.items():
        assert a.parse_key(key) == parsed, key
    bad = [
        f"pg/wals/0000000100000001/{NAME}",  # the wrong folder: barman never finds it
        f"pg/wals/{NAME}",
        "pg/wals/0000000100000000/00000002.history",
        f"pg/wals/0000000100000000/{NAME}.lzma",  # not a barman suffix
        f"pg/wals/0000000100000000/{NAME}.tmp",
        f"pg/base/20260101T000000/{NAME}",
        f"other/wals/0000000100000000/{NAME}",
        f"pg/wals/x/0000000100000000/{NAME}",
        "pg/wals/0000000100000000/backup.info",
    ]
    for key in bad:
        assert a.parse_key(key) is None, key


def test_walg_keys() -> None:
    """``wal_005/<name>[.<extension>]``; WAL-G's other objects there name no WAL file."""
    a = walg.WalgWalArchive(DirectoryStore("/nowhere", ERRORS))
    assert a.file_key(NAME) == f"wal_005/{NAME}"
    assert a.file_key("00000002.history") == "wal_005/00000002.history"
    for ext in ("lz4", "lzma", "zst", "br", "gz", "lzo"):
        assert a.parse_key(f"wal_005/{NAME}.{ext}") == (NAME, ext)
    assert a.parse_key(f"wal_005/{NAME}") == (NAME, "")  # WALG_COMPRESSION_METHOD=none
    assert a.parse_key("wal_005/00000002.history.lz4") == ("00000002.history", "lz4")
    assert a.parse_key(f"wal_005/{NAME}.00000028.backup.lz4") == (f"{NAME}.00000028.backup", "lz4")
    for key in (
        f"wal_005/{NAME}.json",  # WALG_UPLOAD_WAL_METADATA
        f"wal_005/{NAME}_delta.lz4",  # WALG_USE_WAL_DELTA
        f"wal_005/{NAME}.lz4_20260101T000000Z_ab12",  # a file storage write under way
        f"wal_005/sub/{NAME}.lz4",
        f"basebackups_005/base_{NAME}_backup_stop_sentinel.json",
        f"wal_005/{NAME}.bz2",  # no WAL-G suffix
    ):
        assert a.parse_key(key) is None, key


def test_listing_gives_postgresql_names_and_the_object_the_tool_fetches(tmp_path: Path) -> None:
    """Each file once, by PostgreSQL's name; stored twice, the object the tool's own
    restore picks: barman-cloud-wal-restore the first compressed key in key order,
    wal-fetch lz4 before zstd and plain last."""
    one, two = segment_name(1, 1, SEG), segment_name(1, 2, SEG)
    b = tmp_path / "b"
    put(b, f"main/wals/0000000100000000/{one}", segment_bytes(1, 1))
    put(b, f"main/wals/0000000100000000/{one}.gz", gzip.compress(segment_bytes(1, 1)))
    put(b, f"main/wals/0000000100000000/{two}.xz", lzma.compress(segment_bytes(1, 2)))
    put(b, f"main/wals/0000000100000000/{two}.bz2", bz2.compress(segment_bytes(1, 2)))
    put(b, "main/wals/00000002.history.gz", gzip.compress(b"1\t0/3000000\tx\n"))
    put(b, "main/base/20260101T000000/backup.info", b"x")
    archive = barman_archive(b)
    assert archive.list_names() == (one, two, "00000002.history")
    found = archive.find(one)
    assert found is not None and found.compression == "gz"
    found = archive.find(two)
    assert found is not None and found.compression == "bz2"
    assert archive.read_text("00000002.history") == "1\t0/3000000\tx\n"
    assert archive.histories().timelines() == (1, 2)
    assert not isinstance(archive, WalArchiveDeletion)

    w = tmp_path / "w"
    put(w, f"wal_005/{one}", segment_bytes(1, 1))
    put(w, f"wal_005/{one}.zst", zstd_stream(segment_bytes(1, 1)))
    put(w, f"wal_005/{one}.lz4", pierrec_lz4(segment_bytes(1, 1)))
    put(w, f"wal_005/{one}.json", b"{}")
    archive2 = walg_archive(w)
    assert archive2.list_names() == (one,)
    found = archive2.find(one)
    assert found is not None and found.compression == "lz4"
    assert archive2.stat(f"{one}.lz4") is None  # names are PostgreSQL's
    assert archive2.exists(one) and not archive2.exists(two)


# --------------------------------------------------------------------------- codecs


WALG_CODECS: dict[str, Callable[[bytes], bytes]] = {
    "lz4": pierrec_lz4,
    "lzma": lambda d: lzma.compress(d, format=lzma.FORMAT_ALONE),
    "zst": zstd_stream,
    "br": lambda d: brotli.compress(d, quality=3),
    "gz": gzip.compress,
    "": lambda d: d,
}
BARMAN_CODECS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "snappy": snappy_stream,
    "zst": zstd_stream,
    "lz4": lambda d: bytes(lz4frame.compress(d)),  # barman's: the content size recorded
    "": lambda d: d,
}


@pytest.mark.parametrize("ext", sorted(WALG_CODECS))
def test_walg_codecs(tmp_path: Path, ext: str) -> None:
    """Every compression WAL-G writes is read back, a small and a large segment, with
    the length the module docstring promises."""
    small, large = segment_bytes(1, 1), noisy_segment(2)
    for segno, data in ((1, small), (2, large)):
        name = segment_name(1, segno, SEG)
        put(tmp_path, f"wal_005/{name}{'.' + ext if ext else ''}", WALG_CODECS[ext](data))
    archive = walg_archive(tmp_path)
    for segno, data in ((1, small), (2, large)):
        name = segment_name(1, segno, SEG)
        found = archive.stat(name)
        assert found is not None and found.name == name and found.size == SEG
        exact = segno == 1 or ext in ("", "gz")
        assert found.content_size == (SEG if exact else None), (name, ext)
        assert found.compression is None
        stream = archive.open(name)
        try:
            assert stream.read(SEG + 1) == data
        finally:
            stream.close()


@pytest.mark.parametrize("ext", sorted(BARMAN_CODECS))
def test_barman_codecs(tmp_path: Path, ext: str) -> None:
    """Every compression barman-cloud writes is read back (lz4 with its recorded size)."""
    data = noisy_segment()
    put(
        tmp_path,
        f"main/wals/0000000100000000/{NAME}{'.' + ext if ext else ''}",
        BARMAN_CODECS[ext](data),
    )
    archive = barman_archive(tmp_path)
    found = archive.stat(NAME)
    assert found is not None and found.size == SEG
    assert found.content_size == (SEG if ext in ("", "gz", "lz4") else None)
    stream = archive.open(NAME)
    try:
        assert stream.read(SEG + 1) == data
    finally:
        stream.close()


def test_recorded_lengths() -> None:
    """lz4 and zstd frame headers, with and without the content's size."""
    data = b"x" * 5000
    assert toolarchive.recorded_length("lz4", bytes(lz4frame.compress(data))) == 5000
    assert toolarchive.recorded_length("lz4", pierrec_lz4(data)) is None
    assert toolarchive.recorded_length("zst", zstandard.ZstdCompressor().compress(data)) == 5000
    assert toolarchive.recorded_length("zst", zstd_stream(data)) is None
    sized = zstandard.ZstdCompressor(write_content_size=True)
    for n in (0, 1, 255, 256, 300, 70000, 200000):  # Frame_Content_Size of each width
        assert toolarchive.recorded_length("zst", sized.compress(b"a" * n)) == n
    assert toolarchive.recorded_length("gz", gzip.compress(data)) is None
    assert toolarchive.recorded_length("lz4", b"garbage garbage") is None


# --------------------------------------------------------------------------- lengths and costs


def test_stat_costs_at_most_one_small_read_and_is_remembered(tmp_path: Path) -> None:
    """A segment of unrecorded length: one ranged read of the object's first bytes (more
    only for its first block) and a claim; asked again, nothing is read."""
    put(tmp_path, f"wal_005/{NAME}.zst", zstd_stream(noisy_segment()))
    archive = walg_archive(tmp_path)
    store = archive.store
    assert isinstance(store, CountingStore)
    assert archive.list_names(SEG) == (NAME,)  # not judged: its length is not recorded
    assert len(store.reads) == 1 and store.reads[0][1:] == (0, toolarchive.SMALL_OBJECT)
    store.reads.clear()
    found = archive.stat(NAME)
    assert found is not None and found.size == SEG and found.content_size is None
    assert 1 <= len(store.reads) <= 2 and all(r[2] <= toolarchive.READ_CHUNK for r in store.reads)
    store.reads.clear()
    assert archive.stat(NAME) == found
    assert store.reads == []


def test_gzip_length_from_its_trailer(tmp_path: Path) -> None:
    put(tmp_path, f"main/wals/0000000100000000/{NAME}.gz", gzip.compress(noisy_segment()))
    archive = barman_archive(tmp_path)
    store = archive.store
    assert isinstance(store, CountingStore)
    found = archive.stat(NAME)
    assert found is not None and found.content_size == SEG
    assert [r[2] for r in store.reads] == [4]


def test_a_short_segment_is_left_out_and_a_truncated_big_one_found_when_read(
    tmp_path: Path,
) -> None:
    """A small object is read whole: a short segment is judged (left out, a problem);
    a big one whose length is not recorded is claimed at its first page's size, and
    the read finds it shorter."""
    short, big = segment_name(1, 1, SEG), segment_name(1, 2, SEG)
    put(tmp_path, f"wal_005/{short}.lz4", pierrec_lz4(segment_bytes(1, 1)[:8192]))
    truncated = noisy_segment(2)[: SEG // 2]
    put(tmp_path, f"wal_005/{big}.lz4", pierrec_lz4(truncated))
    archive = walg_archive(tmp_path)
    assert archive.list_names(SEG) == (big,)
    assert short in archive.index(SEG).unknown_names
    found = find_segment(archive, short)
    assert found is not None
    problem = archived_segment_problem(archive, found, segment_size=SEG)
    assert problem is not None and "8192 bytes" in problem
    claimed = archive.stat(big)
    assert claimed is not None and claimed.size == SEG and claimed.content_size is None
    stream = archive.open(big)
    try:
        assert stream.read(SEG) == truncated
    finally:
        stream.close()


# --------------------------------------------------------------------------- refusals


def test_encrypted_walg_objects_are_refused_with_the_reason(tmp_path: Path) -> None:
    """WAL-G encrypts keeping the name: the object is no lz4; pgsnap says it may be
    encrypted, which it cannot read, and never leaks the codec's own error."""
    put(tmp_path, f"wal_005/{NAME}.lz4", os.urandom(3000))  # as libsodium's stream looks
    put(tmp_path, "wal_005/00000002.history.lz4", os.urandom(200))
    archive = walg_archive(tmp_path)
    assert archive.list_names() == (NAME, "00000002.history")  # names are still planned over
    for call in (
        lambda: archive.stat(NAME),
        lambda: archive.open(NAME).read(),
        lambda: archive.read_text("00000002.history"),
        archive.histories,
    ):
        with pytest.raises(ArchiveError) as caught:
            call()
        err = caught.value
        assert "WALG_LIBSODIUM_KEY" in err.message and "cannot decrypt" in err.message
        assert err.hint and "wal-fetch" in err.hint
        copy = pickle.loads(pickle.dumps(err))
        assert str(copy) == str(err)
    assert archive.list_names(SEG) == ("00000002.history",)  # a damaged segment is no WAL


def test_a_codec_that_is_not_installed_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    put(tmp_path, f"wal_005/{NAME}.br", brotli.compress(segment_bytes(1, 3)))
    put(tmp_path, f"wal_005/{segment_name(1, 4, SEG)}.lzo", b"\x89LZO\x00")
    monkeypatch.setattr(toolarchive, "_module", lambda name: None)
    archive = walg_archive(tmp_path)
    assert archive.list_names(SEG) == (NAME, segment_name(1, 4, SEG))  # not judged
    with pytest.raises(ArchiveError) as caught:
        archive.open(NAME)
    assert "brotli" in caught.value.message and "pip install brotli" in (caught.value.hint or "")
    with pytest.raises(ArchiveError) as caught:
        archive.open(segment_name(1, 4, SEG))
    assert "lzo" in caught.value.message


def test_damaged_data_and_missing_files(tmp_path: Path) -> None:
    good = gzip.compress(noisy_segment())
    put(tmp_path, f"main/wals/0000000100000000/{NAME}.gz", good[:100000] + b"\0" * 50)
    archive = barman_archive(tmp_path)
    stream = archive.open(NAME)

    def read_all() -> None:
        while stream.read(65536):
            pass

    with pytest.raises(ArchiveError) as caught:
        read_all()
    assert caught.value.hint
    missing = segment_name(1, 9, SEG)
    assert archive.stat(missing) is None and not archive.exists(missing)
    for call in (archive.open, archive.read_text):
        with pytest.raises(ArchiveError, match="not in the barman-cloud archive"):
            call(missing)
    with pytest.raises(PgsnapError):
        archive.stat("../x")


# --------------------------------------------------------------------------- restore commands


S3 = {
    "path": "s3://wal-bucket/pg 100%",
    "endpoint_url": "http://127.0.0.1:8333",
    "region": "eu-west-1",
    "credentials_file": "/etc/pgsnap/s3.credentials",
    "ca_bundle": "/etc/ssl/ca.pem",
}


GUARD_1 = "; rc=$?; [ $rc -eq 0 ] && exit 0; [ $rc -eq 1 ] && exit 1; exit 255"
GUARD_74 = "; rc=$?; [ $rc -eq 0 ] && exit 0; [ $rc -eq 74 ] && exit 1; exit 255"
"""What follows each tool's restore command: its "missing" is PostgreSQL's, any other
failure fatal (pgsnap.archives.config.fatal_unless_missing)."""


@pytest.mark.parametrize(("exits", "postgresql_sees"), [(0, 0), (74, 1), (1, 255), (2, 255)])
def test_only_the_tools_missing_ends_a_recovery(exits: int, postgresql_sees: int) -> None:
    """Run by sh as PostgreSQL runs it: WAL-G's 74 ("not in the archive") becomes 1, the
    end of the archive; its other failures 255, which stop the recovery instead."""
    import subprocess

    from pgsnap.archives.config import fatal_unless_missing

    command = fatal_unless_missing(f"(exit {exits})", 74)
    assert subprocess.run(["sh", "-c", command], check=False).returncode == postgresql_sees


def test_barman_restore_command() -> None:
    """barman-cloud-wal-restore with the archive's URL and server, options as
    environment variables (paths, no keys), ``%`` doubled."""
    settings = archive_settings({"format": "barman", "server": "pg-main", **S3}, str)
    command = barman.restore_command(settings)
    assert command == (
        "env AWS_SHARED_CREDENTIALS_FILE=/etc/pgsnap/s3.credentials "
        "AWS_DEFAULT_REGION=eu-west-1 AWS_CA_BUNDLE=/etc/ssl/ca.pem "
        "barman-cloud-wal-restore --endpoint-url http://127.0.0.1:8333 "
        "'s3://wal-bucket/pg 100%%' pg-main '%f' '%p'" + GUARD_1
    )
    plain = archive_settings({"format": "barman", "server": "pg", "path": "s3://b/p"}, str)
    assert barman.restore_command(plain) == (
        "barman-cloud-wal-restore s3://b/p pg '%f' '%p'" + GUARD_1
    )
    mine = archive_settings(
        {"format": "barman", "server": "pg", "path": "s3://b", "restore_command": "x %f %p"}, str
    )
    assert barman.restore_command(mine) == "x %f %p"


def test_barman_in_a_directory_has_no_restore_command_of_its_own(tmp_path: Path) -> None:
    archive = open_archive(
        archive_settings({"format": "barman", "server": "pg", "path": str(tmp_path)}, str)
    )
    with pytest.raises(ArchiveError) as caught:
        archive.restore_command()
    assert "restore_command" in (caught.value.hint or "")


def test_barman_settings_that_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no configuration file"):
        open_archive(
            archive_settings(
                {
                    "format": "barman",
                    "server": "pg",
                    "path": str(tmp_path),
                    "tool_config": "/etc/barman.conf",
                },
                str,
            )
        )
    for server in ("a/b", "..", "."):
        with pytest.raises(ConfigurationError, match="not a barman server name"):
            barman.BarmanCloudWalArchive(DirectoryStore(tmp_path, ERRORS), server)


def test_walg_restore_command(tmp_path: Path) -> None:
    """wal-g wal-fetch reading the archive pgsnap read: its prefix and the [archive]
    options as environment variables, --config with tool_config, no key."""
    settings = archive_settings({"format": "walg", "tool_config": "/etc/walg.json", **S3}, str)
    assert walg.restore_command(settings) == (
        "env 'WALG_S3_PREFIX=s3://wal-bucket/pg 100%%' AWS_ENDPOINT=http://127.0.0.1:8333 "
        "AWS_S3_FORCE_PATH_STYLE=true AWS_REGION=eu-west-1 "
        "WALG_S3_CA_CERT_FILE=/etc/ssl/ca.pem "
        "AWS_SHARED_CREDENTIALS_FILE=/etc/pgsnap/s3.credentials "
        "wal-g --config /etc/walg.json wal-fetch '%f' '%p'" + GUARD_74
    )
    local = archive_settings({"format": "walg", "path": str(tmp_path)}, str)
    assert walg.restore_command(local) == (
        f"env WALG_FILE_PREFIX={tmp_path} wal-g wal-fetch '%f' '%p'" + GUARD_74
    )
    archive = open_archive(local)
    assert archive.restore_command() == walg.restore_command(local)
    assert archive.location == f"{tmp_path}/wal_005"
