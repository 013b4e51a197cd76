"""pgsnap reads what the real pgBackRest writes, and refuses what it refuses.

The real ``pgbackrest archive-push`` (2.45) stores WAL files into a stanza for a
PostgreSQL 15 data directory (initdb'd once, never started; its archive.info
written as ``stanza-create`` writes it) with each ``compress-type``: pgsnap lists
them under PostgreSQL's names, reads them back (the WAL reader too), and gets the
bytes the real ``archive-get`` gets. A segment stored twice with different content
makes both refuse it.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest

from pgsnap.archives.config import ERRORS
from pgsnap.archives.pgbackrest import PgBackRestArchive
from pgsnap.errors import ArchiveError
from pgsnap.model import LSN
from pgsnap.stores import DirectoryStore
from pgsnap.testing.pgbackrest import RepoBuilder, pgbackrest_config, pgbackrest_unavailable
from pgsnap.testing.pgserver import PgServer
from pgsnap.testing.wal_conformance import SEGMENT_SIZE, segment_bytes
from pgsnap.wal import TimelineSpan, read_wal, segment_name
from pgsnap.wal.reader import ScanEnd, SegmentRead, StopReason

pytestmark = pytest.mark.postgres

CODECS = ("none", "gz", "bz2", "lz4", "zst")


@attrs.frozen
class Stanza:
    """A stanza ``main`` for a real (stopped) PostgreSQL 15 data directory."""

    repo: RepoBuilder
    config: Path
    system_identifier: int
    work: Path

    def pgbackrest(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pgbackrest", f"--config={self.config}", "--stanza=main", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def push(self, name: str, data: bytes, compress_type: str = "gz") -> None:
        """``archive-push`` of a file of that name and content, as PostgreSQL's
        archive_command would run it."""
        source = self.work / "pg_wal" / name
        source.parent.mkdir(exist_ok=True)
        source.write_bytes(data)
        done = self.pgbackrest(f"--compress-type={compress_type}", "archive-push", str(source))
        assert done.returncode == 0, done.stderr + done.stdout

    def get(self, name: str) -> bytes | None:
        """``archive-get``'s copy of ``name`` (None: exit 1, not in the archive)."""
        target = self.work / "restored"
        target.unlink(missing_ok=True)
        done = self.pgbackrest("archive-get", name, str(target))
        if done.returncode == 1:
            return None
        assert done.returncode == 0, done.stderr + done.stdout
        return target.read_bytes()

    def archive(self) -> PgBackRestArchive:
        return PgBackRestArchive(
            DirectoryStore(self.repo.root, ERRORS), "main", tool_config=str(self.config)
        )

    def segment(self, tli: int, segno: int) -> bytes:
        return segment_bytes(tli, segno, system_identifier=self.system_identifier, major=15)


@pytest.fixture(scope="module")
def pg15_data(pg_bindir_for: Callable[[int], Path]) -> Iterator[tuple[Path, int]]:
    reason = pgbackrest_unavailable()
    if reason is not None:
        pytest.fail(reason, pytrace=False)  # CI installs it: not a skip
    server = PgServer.create(pg_bindir_for(15), archive=False)
    try:
        control = (server.data_dir / "global" / "pg_control").read_bytes()
        yield server.data_dir, struct.unpack_from("<Q", control)[0]
    finally:
        server.cleanup()


@pytest.fixture
def stanza(tmp_path: Path, pg15_data: tuple[Path, int]) -> Stanza:
    data_dir, system_identifier = pg15_data
    repo = RepoBuilder(tmp_path / "repo")
    repo.create([(1, "15", system_identifier)])
    config = pgbackrest_config(
        tmp_path / "pgbackrest.conf",
        stanza="main",
        repo={"repo1-path": str(repo.root)},
        pg1_path=data_dir,
        work=tmp_path / "pgbackrest",
    )
    return Stanza(repo, config, system_identifier, tmp_path)


def test_every_compress_type_archive_push_writes_is_read(stanza: Stanza) -> None:
    segments = {}
    for n, codec in enumerate(CODECS, start=1):
        name = segment_name(1, n, SEGMENT_SIZE)
        segments[name] = (codec, stanza.segment(1, n))
        stanza.push(name, segments[name][1], codec)
    partial = f"{segment_name(1, 6, SEGMENT_SIZE)}.partial"
    stanza.push(partial, stanza.segment(1, 6), "zst")
    history = b"1\t0/6080000\tno recovery target specified\n"
    stanza.push("00000002.history", history)
    backup = "000000010000000000000002.00000028.backup"
    stanza.push(backup, b"START WAL LOCATION: 0/200028 (file 000000010000000000000002)\n")

    archive = stanza.archive()
    assert archive.list_names() == tuple(sorted([*segments, partial, "00000002.history", backup]))
    assert archive.list_names(SEGMENT_SIZE) == archive.list_names()
    assert archive.read_text("00000002.history") == history.decode()
    assert archive.histories().timelines() == (1, 2)
    for name, (codec, data) in segments.items():
        stored = archive.locate(name)
        assert stored is not None
        suffix = "" if codec == "none" else rf"\.{codec}"
        assert re.fullmatch(
            rf"archive/main/15-1/0000000100000000/{name}-[0-9a-f]{{40}}{suffix}", stored
        )
        found = archive.stat(name)
        assert found is not None and found.size == SEGMENT_SIZE, codec
        assert found.content_size == (SEGMENT_SIZE if codec in ("none", "gz") else None)
        stream = archive.open(name)
        try:
            assert stream.read(-1) == data, codec  # and its SHA-1 matched its name
        finally:
            stream.close()
        assert stanza.get(name) == data, codec  # what archive-get restores
    assert stanza.get("00000002.history") == history
    assert stanza.get(segment_name(1, 9, SEGMENT_SIZE)) is None
    assert archive.stat(segment_name(1, 9, SEGMENT_SIZE)) is None

    # The WAL reader reads the five segments through the archive, whatever the codec.
    items = list(
        read_wal(
            [archive],
            [TimelineSpan(1, None, None)],
            LSN(SEGMENT_SIZE),
            LSN(7 * SEGMENT_SIZE),
            segment_size=SEGMENT_SIZE,
        )
    )
    reads = [i.name for i in items if isinstance(i, SegmentRead)]
    assert reads[0] == segment_name(1, 1, SEGMENT_SIZE)
    end = items[-1]
    assert isinstance(end, ScanEnd) and end.reason is StopReason.END_OF_WAL


def test_a_segment_stored_twice_is_refused_as_archive_get_refuses_it(stanza: Stanza) -> None:
    name = segment_name(1, 3, SEGMENT_SIZE)
    stanza.push(name, stanza.segment(1, 3))
    stanza.push(segment_name(1, 4, SEGMENT_SIZE), stanza.segment(1, 4))
    # Another cluster's segment of that name (archive-push itself refuses it: placed by
    # hand, as a second stanza writing into the same directory would).
    other = bytearray(stanza.segment(1, 3))
    other[100] = 7
    stanza.repo.push(name, bytes(other), compression="lz4")
    refused = stanza.pgbackrest("archive-get", name, str(stanza.work / "x"))
    assert refused.returncode not in (0, 1), refused
    assert "duplicates found" in refused.stderr + refused.stdout
    archive = stanza.archive()
    assert name in archive.list_names()
    assert name not in archive.list_names(SEGMENT_SIZE, check_sizes=False)
    with pytest.raises(ArchiveError, match="stored twice"):
        archive.stat(name)
    pushed_again = stanza.pgbackrest("archive-push", str(stanza.work / "pg_wal" / name))
    assert pushed_again.returncode != 0  # pgBackRest never overwrites either


def test_the_restore_command_works_in_a_clone_in_another_directory(
    stanza: Stanza, pg15_data: tuple[Path, int], tmp_path: Path
) -> None:
    """pgsnap writes its restore_command into clones too: run there (another data
    directory, the same cluster's pg_control, %p relative as PostgreSQL passes it) it
    fetches, where the configuration's pg1-path (the source's) makes archive-get
    refuse."""
    name = segment_name(1, 2, SEGMENT_SIZE)
    stanza.push(name, stanza.segment(1, 2))
    clone = tmp_path / "clone"
    (clone / "global").mkdir(parents=True)
    (clone / "pg_wal").mkdir()
    shutil.copy(pg15_data[0] / "global" / "pg_control", clone / "global" / "pg_control")
    command = stanza.archive().restore_command()  # what pgsnap writes into the clone
    assert f"--config={stanza.config}" in command

    def run(restore_command: str) -> subprocess.CompletedProcess[str]:
        line = restore_command.replace("%f", name).replace("%p", "pg_wal/RECOVERYXLOG")
        return subprocess.run(
            ["sh", "-c", line.replace("%%", "%")],
            cwd=clone,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = run(command)
    assert done.returncode == 0, done.stderr
    assert (clone / "pg_wal" / "RECOVERYXLOG").read_bytes() == stanza.segment(1, 2)
    refused = run(command.replace(' --pg1-path="$PWD"', ""))
    assert refused.returncode != 0
    assert "is not the same as option pg1-path" in refused.stderr + refused.stdout
