"""pgBackRest's archive, read by pgsnap: names, archive.info, and the archive's choices.

The archive.info bytes below were written by the real pgBackRest 2.45 (Debian 12):
``stanza-create`` for a PostgreSQL 15 cluster; ``stanza-create`` for a 12 cluster
then ``stanza-upgrade`` for a 15 one; ``stanza-create`` with
``repo1-cipher-type=aes-256-cbc``. The repositories the archive reads here are
built by :class:`~pgsnap.testing.pgbackrest.RepoBuilder`, whose archive.info is
checked to be those bytes exactly; the real tool reads them in the conformance
and integration tests.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import logging
import pickle
import shutil
from pathlib import Path

import pytest

from pgsnap.archives import pgbackrest as pgbr
from pgsnap.archives.config import ERRORS, archive_settings
from pgsnap.archives.config import open_archive as open_configured
from pgsnap.archives.pgbackrest import (
    PgBackRestArchive,
    StoredName,
    archive_get_command,
    info_checksum,
    parse_archive_info,
    parse_stored_name,
)
from pgsnap.errors import (
    ArchiveError,
    ArchiveRefused,
    ConfigurationError,
    DamagedSegmentError,
    PgsnapError,
)
from pgsnap.protocols import WalArchiveDeletion
from pgsnap.stores import DirectoryStore
from pgsnap.testing.pgbackrest import RepoBuilder, archive_info_bytes, compress
from pgsnap.testing.wal_conformance import SEGMENT_SIZE, segment_bytes
from pgsnap.wal import segment_name

REAL_15 = b"""[backrest]
backrest-format=5
backrest-version="2.45"

[db]
db-id=1
db-system-id=7716236051128847408
db-version="15"

[db:history]
1={"db-id":7716236051128847408,"db-version":"15"}

[backrest]
backrest-checksum="37b8266ecf0465044ac2a49d0fb067ab4d78657c"
"""
"""``stanza-create`` of a PostgreSQL 15 cluster."""

REAL_UPGRADED = b"""[backrest]
backrest-format=5
backrest-version="2.45"

[db]
db-id=2
db-system-id=7716236389860876758
db-version="15"

[db:history]
1={"db-id":7716236383534100900,"db-version":"12"}
2={"db-id":7716236389860876758,"db-version":"15"}

[backrest]
backrest-checksum="84ede3491c131bff2dc9d09d5d88448acfadbbd6"
"""
"""``stanza-create`` with PostgreSQL 12, then ``stanza-upgrade`` with a 15 cluster."""

REAL_ENCRYPTED = base64.b64decode(
    "U2FsdGVkX18Hb2IxdDvCfSnc7P6sO15bCcGsOX03FbJ2X4jmbx5ffWEXvyjMv8ICgbP5dJJD8i2n"
    "86uq1dI0tjNQc1SqwbUNpnn3Na6u6TvSzrgvI5tAyAVq47y0onaV1mXuaXzTnVrnl+x7LIZTWlvH"
    "l9/8a+7VcGAPTs8YfFRGROj9g5gcQhCBf3kbODVMyQqs4MfkTlYJtgSvf3gKAOdvN8+XCW/Cogi4"
    "7PFyac9iomw1nB+CpadeWIzWUnNM9foDN2CcXk0R2jNMSY2njkqC+0OSITdPBKPoBesGtbFgVJC9"
    "8oz0sou3QzZdjemrn2U21Zwyj/RlRsinuF49yrc/TW1rYdlQhw6bdsKdSqcDklWVXSLHK35aD3Nr"
    "q5oMnXLJTKHGKPcRMtqOWL2o2xfRmJmZgivhTSKqONuqG69apzzuP6+5iSv68ViZYnnDVVl9Bb7J"
    "9LsMZHQlzXR7Crk+LsaUVyE/yQFXoaleXho="
)
"""``stanza-create`` with ``repo1-cipher-type=aes-256-cbc`` (passphrase: a test's)."""

SID_12, SID_15 = 7716236383534100900, 7716236389860876758
SHA1_A = "cf923e729ee06befa5f36db98f019ed5d8322df2"


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("stored", "in_dir", "expected"),
    [
        (f"000000010000000000000006-{SHA1_A}.gz", True, ("000000010000000000000006", "gz")),
        (f"000000010000000000000006-{SHA1_A}", True, ("000000010000000000000006", None)),
        (f"000000010000000000000006-{SHA1_A}.zst", True, ("000000010000000000000006", "zst")),
        (f"000000010000000000000006-{SHA1_A}.lz4", True, ("000000010000000000000006", "lz4")),
        (f"000000010000000000000006-{SHA1_A}.bz2", True, ("000000010000000000000006", "bz2")),
        (
            f"00000001000000000000000A.partial-{SHA1_A}.gz",
            True,
            ("00000001000000000000000A.partial", "gz"),
        ),
        ("000000010000000000000007.00000028.backup", True, ("", None)),
        ("00000002.history", False, ("", None)),
    ],
)
def test_stored_names_say_postgresqls_name(
    stored: str, in_dir: bool, expected: tuple[str, str | None]
) -> None:
    parsed = parse_stored_name(stored, in_segment_directory=in_dir)
    assert parsed is not None
    name, compression = expected
    if name:  # a segment: its SHA-1 is in the stored name
        assert parsed == StoredName(name, SHA1_A, compression)
    else:
        assert parsed == StoredName(stored)


@pytest.mark.parametrize(
    ("stored", "in_dir"),
    [
        (f"000000010000000000000006-{SHA1_A}.gz.pgbackrest.tmp", True),  # being written
        ("000000010000000000000006", True),  # no SHA-1: not archive-push's
        (f"000000010000000000000006-{SHA1_A.upper()}", True),  # pgBackRest's SHA-1 is lower
        (f"000000010000000000000006-{SHA1_A}.gzip", True),
        (f"0000000100000000000000zz-{SHA1_A}", True),
        ("00000002.history", True),  # a history file is beside the directories
        (f"000000010000000000000006-{SHA1_A}", False),  # a segment is in one
        ("archive.info", False),
        ("00000002.history.pgbackrest.tmp", False),
    ],
)
def test_other_names_are_not_wal(stored: str, in_dir: bool) -> None:
    assert parse_stored_name(stored, in_segment_directory=in_dir) is None


# --------------------------------------------------------------------------- archive.info


def test_archive_info_of_a_stanza() -> None:
    info = parse_archive_info(REAL_15)
    assert info.current_id == 1
    assert info.backrest_version == "2.45"
    assert info.current.version == "15"
    assert info.current.system_identifier == 7716236051128847408
    assert info.archive_ids() == ("15-1",)


def test_archive_info_after_an_upgrade_reads_the_current_cluster() -> None:
    info = parse_archive_info(REAL_UPGRADED)
    assert [e.archive_id for e in info.history] == ["12-1", "15-2"]
    assert info.current.archive_id == "15-2"
    assert info.current.system_identifier == SID_15
    assert info.archive_ids() == ("15-2",)  # not 12-1: another cluster's WAL
    old = info.entry("12-1")
    assert old is not None and old.system_identifier == SID_12
    assert info.archive_ids(old) == ("12-1",)
    assert info.entry("16-3") is None


def test_the_repository_builder_writes_what_pgbackrest_writes() -> None:
    """The test repositories' archive.info is byte for byte pgBackRest's."""
    assert archive_info_bytes([(1, "15", 7716236051128847408)]) == REAL_15
    assert archive_info_bytes([(1, "12", SID_12), (2, "15", SID_15)]) == REAL_UPGRADED


def test_the_checksum_is_pgbackrests() -> None:
    values = [
        ("backrest", "backrest-format", "5"),
        ("backrest", "backrest-version", '"2.45"'),
        ("db", "db-id", "1"),
        ("db", "db-system-id", "7716236051128847408"),
        ("db", "db-version", '"15"'),
        ("db:history", "1", '{"db-id":7716236051128847408,"db-version":"15"}'),
    ]
    assert info_checksum(values) == "37b8266ecf0465044ac2a49d0fb067ab4d78657c"
    text = (
        '{"backrest":{"backrest-format":5,"backrest-version":"2.45"},"db":{"db-id":1,'
        '"db-system-id":7716236051128847408,"db-version":"15"},"db:history":{"1":'
        '{"db-id":7716236051128847408,"db-version":"15"}}}'
    )
    assert info_checksum(values) == hashlib.sha1(text.encode()).hexdigest()


def test_the_same_cluster_in_two_archive_ids_is_read_newest_first() -> None:
    info = parse_archive_info(archive_info_bytes([(1, "15", SID_15), (2, "15", SID_15)]))
    assert info.archive_ids() == ("15-2", "15-1")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (REAL_15.replace(b'db-version="15"\n\n', b'db-version="14"\n\n'), "checksum"),
        (REAL_15.replace(b"backrest-checksum", b"backrest-checksun"), "no backrest-checksum"),
        (REAL_15[:60], "line 6"),
        (b"\xff\xfe" + REAL_15, "not text"),
        (REAL_15.replace(b"db-id=1\n", b"db-id=1\nno value here\n"), "line"),
        (b"[db]\nkey=not json\n", "JSON"),
    ],
)
def test_a_damaged_archive_info_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(ArchiveError, match=says) as caught:
        parse_archive_info(data, where="/repo/archive/main/archive.info")
    assert caught.value.hint and "/repo/archive/main/archive.info" in caught.value.message
    assert pickle.loads(pickle.dumps(caught.value)).message == caught.value.message


def test_another_repository_format_is_refused() -> None:
    values = [("backrest", "backrest-format", "4"), ("db", "db-id", "1")]
    data = (
        f'[backrest]\nbackrest-format=4\n\n[db]\ndb-id=1\n\n[backrest]\nbackrest-checksum="'
        f'{info_checksum(values)}"\n'
    ).encode()
    with pytest.raises(ArchiveError, match="repository format 4"):
        parse_archive_info(data)


def test_a_current_id_not_in_the_history_is_refused() -> None:
    values = [
        ("backrest", "backrest-format", "5"),
        ("backrest", "backrest-version", '"2.45"'),
        ("db", "db-id", "2"),
        ("db:history", "1", f'{{"db-id":{SID_15},"db-version":"15"}}'),
    ]
    data = (
        '[backrest]\nbackrest-format=5\nbackrest-version="2.45"\n\n[db]\ndb-id=2\n\n'
        f'[db:history]\n1={{"db-id":{SID_15},"db-version":"15"}}\n\n'
        f'[backrest]\nbackrest-checksum="{info_checksum(values)}"\n'
    ).encode()
    with pytest.raises(ArchiveError, match="current db-id 2 is not in"):
        parse_archive_info(data)


def test_an_encrypted_repository_is_refused_with_what_to_do() -> None:
    with pytest.raises(ArchiveRefused) as caught:
        parse_archive_info(REAL_ENCRYPTED, where="s3://bucket/pgbackrest/archive/main")
    err = caught.value
    assert "encrypted" in err.message and "repo1-cipher-type" in err.message
    assert err.hint and "wal-push" in err.hint
    assert "test-passphrase" not in str(err)


# --------------------------------------------------------------------------- configuration


def test_restore_command_is_pgbackrests_archive_get_quoted_for_postgresql() -> None:
    assert archive_get_command("main") == (
        'pgbackrest --stanza=main --pg1-path="$PWD" archive-get %f "%p"'
    )
    assert archive_get_command("main", "/etc/pg br/100%.conf") == (
        "pgbackrest --stanza=main --config='/etc/pg br/100%%.conf' --pg1-path=\"$PWD\" "
        'archive-get %f "%p"'
    )
    with pytest.raises(ConfigurationError):
        archive_get_command("main", "/etc/a\nb.conf")


def test_configured_archive(tmp_path: Path) -> None:
    settings = archive_settings(
        {
            "format": "pgbackrest",
            "path": str(tmp_path),
            "stanza": "db1",
            "tool_config": "/etc/pgbackrest/pgbackrest.conf",
        },
        str,
    )
    archive = open_configured(settings)
    assert isinstance(archive, PgBackRestArchive)
    assert not isinstance(archive, WalArchiveDeletion)  # pgsnap never writes into it
    assert archive.restore_command() == (
        "pgbackrest --stanza=db1 --config=/etc/pgbackrest/pgbackrest.conf "
        '--pg1-path="$PWD" archive-get %f "%p"'
        # archive-get's 1 is "not found"; its other failures stop the recovery
        "; rc=$?; [ $rc -eq 0 ] && exit 0; [ $rc -eq 1 ] && exit 1; exit 255"
    )
    assert archive.location == f"{tmp_path}/archive/db1"
    given = archive_settings(
        {
            "format": "pgbackrest",
            "path": str(tmp_path),
            "stanza": "db1",
            "restore_command": "my-fetch %f %p",
        },
        str,
    )
    assert open_configured(given).restore_command() == "my-fetch %f %p"


@pytest.mark.parametrize("stanza", ["", "a/b", "../x", "main stanza"])
def test_a_stanza_that_cannot_be_is_refused(tmp_path: Path, stanza: str) -> None:
    with pytest.raises(ConfigurationError, match="stanza"):
        PgBackRestArchive(DirectoryStore(tmp_path, ERRORS), stanza)


def test_an_archive_id_that_cannot_be_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="archive id"):
        PgBackRestArchive(DirectoryStore(tmp_path, ERRORS), "main", archive_id="15")


# --------------------------------------------------------------------------- reading


def seg(n: int, tli: int = 1) -> str:
    return segment_name(tli, n, SEGMENT_SIZE)


def repo_archive(
    tmp_path: Path, history: list[tuple[int, str, int]] | None = None, **options: str
) -> tuple[RepoBuilder, PgBackRestArchive]:
    builder = RepoBuilder(tmp_path / "repo")
    builder.create(history or [(1, "15", SID_15)])
    archive = PgBackRestArchive(DirectoryStore(builder.root, ERRORS), "main", **options)
    return builder, archive


def test_a_segment_stored_twice_with_different_content_cannot_be_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As archive-get ("duplicates found"): listed, not WAL a recovery can use, and
    stat/open say why."""
    builder, archive = repo_archive(tmp_path)
    builder.push(seg(1), segment_bytes(1, 1))
    builder.push(seg(2), segment_bytes(1, 2))
    builder.push(seg(2), segment_bytes(1, 2, system_identifier=42), compression=None)
    assert archive.list_names() == (seg(1), seg(2))
    with caplog.at_level(logging.WARNING, logger="pgsnap.archives.pgbackrest"):
        assert archive.list_names(SEGMENT_SIZE) == (seg(1),)
    assert "stored twice" in caplog.text
    index = archive.index(SEGMENT_SIZE, check_sizes=False)
    assert seg(2) in index.unknown_names
    assert [(r.first, r.last) for r in index.ranges(1)] == [(1, 1)]
    assert archive.exists(seg(2))
    for call in (archive.stat, archive.open):
        with pytest.raises(ArchiveError, match="stored twice") as caught:
            call(seg(2))
        assert caught.value.hint and "archive-get" in caught.value.hint
        assert len(caught.value.details["duplicates"]) == 2


def test_the_same_content_in_two_archive_ids_is_one_file(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path, [(1, "15", SID_15), (2, "15", SID_15)])
    old = builder.push(seg(3), segment_bytes(1, 3), archive_id="15-1")
    new = builder.push(seg(3), segment_bytes(1, 3), archive_id="15-2", compression=None)
    builder.push(seg(4), segment_bytes(1, 4), archive_id="15-1")
    assert archive.list_names(SEGMENT_SIZE) == (seg(3), seg(4))
    assert archive.locate(seg(3)) == new.relative_to(builder.root).as_posix()
    assert archive.locate(seg(3)) != old.relative_to(builder.root).as_posix()
    found = archive.stat(seg(3))
    assert found is not None and found.content_size == SEGMENT_SIZE


def test_after_an_upgrade_the_current_clusters_wal_is_read(tmp_path: Path) -> None:
    """12-1 holds the old cluster's segments, of the same names as the new one's: never
    merged. archive_id= reads the old one."""
    builder, archive = repo_archive(tmp_path, [(1, "12", SID_12), (2, "15", SID_15)])
    builder.push(seg(1), segment_bytes(1, 1, system_identifier=SID_12), archive_id="12-1")
    builder.push(seg(2), segment_bytes(1, 2, system_identifier=SID_12), archive_id="12-1")
    builder.push(
        "00000002.history", b"1\t0/2000000\tno recovery target specified\n", archive_id="12-1"
    )
    builder.push(seg(1), segment_bytes(1, 1, system_identifier=SID_15), archive_id="15-2")
    assert archive.list_names() == (seg(1),)
    assert archive.archive_ids() == ("15-2",)
    assert archive.histories().timelines() == (1,)
    old = PgBackRestArchive(archive.store, "main", archive_id="12-1")
    assert old.list_names() == (seg(1), seg(2), "00000002.history")
    assert old.histories().timelines() == (1, 2)
    stream = old.open(seg(1))
    try:
        assert stream.read(-1) == segment_bytes(1, 1, system_identifier=SID_12)
    finally:
        stream.close()
    with pytest.raises(ArchiveError, match="not in"):
        PgBackRestArchive(archive.store, "main", archive_id="16-3").list_names()


def test_stray_files_are_not_listed(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    path = builder.push(seg(5), segment_bytes(1, 5))
    (path.parent / (path.name + ".pgbackrest.tmp")).write_bytes(b"half")
    (path.parent / "README").write_text("x")
    (builder.archive_dir / "15-1" / "notes.txt").write_text("x")
    (builder.archive_dir / "15-1" / "0000000100000001").mkdir()
    wrong_place = builder.archive_dir / "15-1" / "0000000100000001" / path.name
    shutil.copy(path, wrong_place)  # a segment in another's directory: not where it is read
    assert archive.list_names() == (seg(5),)


def test_a_segment_whose_content_is_not_its_sha1_is_damaged(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    good = segment_bytes(1, 6)
    path = builder.push(seg(6), good)
    other = bytearray(good)
    other[-1] = 1
    path.write_bytes(gzip.compress(bytes(other)))  # same name, other content
    stream = archive.open(seg(6))
    try:
        assert stream.read(40) == good[:40]  # a header check reads no further
    finally:
        stream.close()
    stream = archive.open(seg(6))
    try:
        with pytest.raises(DamagedSegmentError, match="SHA-1") as caught:
            stream.read(-1)
    finally:
        stream.close()
    assert caught.value.hint


def test_damaged_compressed_data_is_an_archive_error(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    path = builder.push(seg(7), segment_bytes(1, 7))
    path.write_bytes(path.read_bytes()[:300] + b"\0garbage" * 50)
    stream = archive.open(seg(7))
    try:
        with pytest.raises(DamagedSegmentError, match="does not decompress"):
            stream.read(-1)
    finally:
        stream.close()


def test_an_encrypted_segment_is_refused(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    path = builder.push(seg(8), segment_bytes(1, 8))
    path.write_bytes(b"Salted__" + bytes(200))
    with pytest.raises(ArchiveRefused, match="encrypted"):
        archive.open(seg(8)).read(40)


def test_an_encrypted_repository_is_refused_when_listed(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    (builder.archive_dir / "archive.info").write_bytes(REAL_ENCRYPTED)
    (builder.archive_dir / "archive.info.copy").write_bytes(REAL_ENCRYPTED)
    with pytest.raises(ArchiveRefused, match="encrypted") as caught:
        archive.list_names()
    assert isinstance(caught.value, PgsnapError)


def test_archive_info_copy_is_read_when_archive_info_is_damaged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    builder, archive = repo_archive(tmp_path)
    builder.push(seg(1), segment_bytes(1, 1))
    (builder.archive_dir / "archive.info").write_bytes(REAL_15[:100])
    with caplog.at_level(logging.WARNING):
        assert archive.list_names() == (seg(1),)
    assert "checksum" in caplog.text
    (builder.archive_dir / "archive.info.copy").unlink()
    with pytest.raises(ArchiveError, match="checksum"):
        archive.list_names()
    (builder.archive_dir / "archive.info").unlink()
    with pytest.raises(ArchiveError, match=r"no archive\.info") as caught:
        archive.list_names()
    assert caught.value.hint and "stanza-create" in caught.value.hint


def test_names_are_postgresqls_upper_case(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    builder.push("00000001000000000000000A", segment_bytes(1, 10))
    assert archive.stat("00000001000000000000000A") is not None
    assert archive.stat("00000001000000000000000a") is None
    assert archive.stat("00000001000000000000000A.gz") is None


def test_history_backup_and_partial_files(tmp_path: Path) -> None:
    builder, archive = repo_archive(tmp_path)
    history = b"1\t0/3000000\tno recovery target specified\n"
    builder.push("00000002.history", history)
    backup = "000000010000000000000002.00000028.backup"
    builder.push(backup, b"START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n")
    partial = f"{seg(3)}.partial"
    builder.push(partial, segment_bytes(1, 3), compression="zst")
    builder.push(seg(3, tli=2), segment_bytes(2, 3))
    assert archive.list_names() == (backup, partial, "00000002.history", seg(3, tli=2))
    assert archive.read_text("00000002.history") == history.decode()
    assert archive.locate(backup) == f"archive/main/15-1/0000000100000000/{backup}"
    assert archive.locate("00000002.history") == "archive/main/15-1/00000002.history"
    found = archive.stat(partial)
    assert found is not None and found.size == SEGMENT_SIZE and found.content_size is None
    assert archive.stat(seg(3)) is None  # the partial file is not the segment
    index = archive.index(SEGMENT_SIZE)
    assert index.partial_names == (partial,)
    assert index.backup_names == (backup,)
    big = builder.push(f"{seg(9)}.00000028.backup", b"x")
    big.write_bytes(b"x" * (1024 * 1024 + 1))
    with pytest.raises(ArchiveError, match="larger than"):
        archive.read_text(f"{seg(9)}.00000028.backup")


@pytest.mark.parametrize(
    ("codec", "through"),
    [("zst", "module"), ("zst", "program"), ("lz4", "module"), ("lz4", "program"), ("bz2", "")],
)
def test_codecs_without_a_content_size(
    tmp_path: Path, codec: str, through: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lz4, zstd, bzip2: the size is the header's (content_size None), the content
    decompresses (by the Python module or the program: zstd, lz4) and its SHA-1 is
    checked."""
    if through == "program":
        monkeypatch.setattr(pgbr, "_modules", lambda name: None)
    builder, archive = repo_archive(tmp_path)
    data = segment_bytes(1, 4)
    builder.push(seg(4), data, compression=codec)
    found = archive.stat(seg(4))
    assert found is not None
    assert found.size == SEGMENT_SIZE and found.content_size is None
    assert found.location.endswith(f".{codec}")
    stream = archive.open(seg(4))
    try:
        assert stream.read(100) + stream.read(-1) == data
    finally:
        stream.close()
    truncated = builder.push(seg(5), data[: SEGMENT_SIZE // 2], compression=codec)
    truncated.rename(
        truncated.with_name(
            truncated.name.replace(
                hashlib.sha1(data[: SEGMENT_SIZE // 2]).hexdigest(),
                hashlib.sha1(segment_bytes(1, 5)).hexdigest(),
            )
        )
    )
    assert archive.list_names(SEGMENT_SIZE) == (seg(4), seg(5))  # its header says 1 MiB
    stream = archive.open(seg(5))
    try:
        with pytest.raises(DamagedSegmentError, match="SHA-1"):
            stream.read(-1)  # read whole, it is found out
    finally:
        stream.close()


def test_a_codec_that_is_not_here_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder, archive = repo_archive(tmp_path)
    builder.push(seg(4), segment_bytes(1, 4), compression="lz4")
    monkeypatch.setattr(pgbr, "_modules", lambda name: None)
    monkeypatch.setattr(pgbr, "_which", lambda name: None)
    with pytest.raises(ArchiveError, match="lz4") as caught:
        archive.open(seg(4))
    assert caught.value.hint and "pip install lz4" in caught.value.hint


def test_compress_writes_pgbackrests_frames() -> None:
    """lz4 and zstd frames without a content size, as pgBackRest writes them."""
    import zstandard

    data = segment_bytes(1, 1)
    params = zstandard.get_frame_parameters(compress(data, "zst"))
    assert params.content_size in (0, zstandard.CONTENTSIZE_UNKNOWN)
    assert compress(data, "lz4")[:4] == b"\x04\x22\x4d\x18"  # an lz4 frame's magic
