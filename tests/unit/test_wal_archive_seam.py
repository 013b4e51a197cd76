"""The WAL archive is used only through its protocol (issue 20).

No module outside :mod:`pgsnap.wal.archive` (and the archives of
:mod:`pgsnap.testing`) builds a path from an archive's ``location``, and what
the observer, the WAL reader and the executor's checks do through the
protocol is the same for a directory and for an archive that is not one.
"""

from __future__ import annotations

import ast
import gzip
import logging
import pathlib

import attrs
import pytest

import pgsnap
from pgsnap.errors import UnsupportedCapability
from pgsnap.operations.catalog import DeleteWal
from pgsnap.protocols import LocalWalArchive, WalArchiveDeletion
from pgsnap.testing.memory_wal import MemoryWalArchive
from pgsnap.testing.wal_conformance import SEGMENT_SIZE, segment_bytes
from pgsnap.wal import (
    DirectoryWalArchive,
    TimelineSpan,
    WalDirectory,
    archived_segment_problem,
    find_segment,
    read_wal,
    segment_name,
    segment_problem,
)
from pgsnap.wal.reader import EndOfWal, ScanEnd, SegmentRead

PACKAGE = pathlib.Path(pgsnap.__file__).parent
ALLOWED = {"wal/archive.py", "testing/memory_wal.py", "testing/wal_conformance.py"}
PATH_CALLS = {
    "join",
    "Path",
    "PurePath",
    "stat",
    "lstat",
    "open",
    "scandir",
    "listdir",
    "exists",
    "isfile",
    "isdir",
    "getsize",
    "unlink",
    "remove",
    "find_segment_file",
    "stat_segment_file",
    "segment_problem",
    "read_segment_header",
    "read_archive_system_identifier",
}


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def test_no_path_is_built_from_an_archive_location() -> None:
    """``location`` is for messages: no call that takes a path is given one built
    from it (``os.path.join(archive.location, name)``, ``Path(archive.location)``)."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in ALLOWED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or _callee(node) not in PATH_CALLS:
                continue
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if any(
                    isinstance(n, ast.Attribute) and n.attr == "location" for n in ast.walk(arg)
                ):
                    wrong.append(f"{rel}:{node.lineno} {ast.unparse(node)[:80]}")
    assert wrong == []


def test_a_memory_archive_is_neither_local_nor_a_directory() -> None:
    """The second implementation has no path: pg_waldump cannot read it, but it deletes."""
    archive = MemoryWalArchive()
    assert not isinstance(archive, LocalWalArchive)
    assert isinstance(archive, WalArchiveDeletion)
    assert isinstance(DirectoryWalArchive("/nonexistent"), LocalWalArchive)
    assert archive.location.startswith("memory://")


def test_delete_wal_needs_an_archive_that_deletes() -> None:
    """DeleteWal refuses an archive without ``delete`` (UnsupportedCapability)."""

    class ReadOnly:
        location = "memory://read-only"

    class Ctx:
        archive = ReadOnly()

    step = DeleteWal(timeline=1, first=1, last=2, segment_size=SEGMENT_SIZE)
    with pytest.raises(UnsupportedCapability, match="cannot delete"):
        step.run(Ctx())  # type: ignore[arg-type]
    archive = MemoryWalArchive()
    for n in (1, 2, 3):
        archive.put(segment_name(1, n, SEGMENT_SIZE), segment_bytes(1, n))

    class Ctx2:
        pass

    ctx = Ctx2()
    ctx.archive = archive  # type: ignore[attr-defined]
    assert step.run(ctx) == {"deleted": 2}  # type: ignore[arg-type]
    assert archive.list_names() == (segment_name(1, 3, SEGMENT_SIZE),)


@pytest.mark.parametrize("compress", [False, True])
def test_segment_problem_is_the_same_through_the_archive(
    tmp_path: pathlib.Path, compress: bool
) -> None:
    """``archived_segment_problem`` says what ``segment_problem`` of the path says, for a
    directory archive and for the same files in memory (gzip judged by its trailer)."""
    directory = DirectoryWalArchive(tmp_path)
    memory = MemoryWalArchive()
    cases = {
        1: segment_bytes(1, 1),
        2: segment_bytes(1, 2)[:4096],
        3: segment_bytes(1, 7),  # another segment's WAL under this name
        4: segment_bytes(1, 4, system_identifier=1),
        5: b"\0" * SEGMENT_SIZE,
    }
    for segno, data in cases.items():
        name = segment_name(1, segno, SEGMENT_SIZE) + (".gz" if compress else "")
        stored = gzip.compress(data, 1) if compress else data
        (tmp_path / name).write_bytes(stored)
        memory.put(name, stored)
    options = {"segment_size": SEGMENT_SIZE, "system_identifier": 7300000000000000001, "major": 16}
    for segno in cases:
        name = segment_name(1, segno, SEGMENT_SIZE)
        expected = segment_problem(str(find_segment(directory, name).location), **options)  # type: ignore[union-attr]
        for archive in (directory, memory):
            found = find_segment(archive, name)
            assert found is not None
            got = archived_segment_problem(archive, found, **options)
            if archive is memory and expected is not None:
                # The message names the file where the archive keeps it.
                expected_here = expected.replace(str(tmp_path), memory.location)
                assert got == expected_here, (segno, got)
            else:
                assert got == expected, (segno, got)
        assert (expected is None) is (segno == 1)


def test_reader_gives_the_same_items_from_a_directory_and_from_memory(
    tmp_path: pathlib.Path,
) -> None:
    """The same files read as a path, as a WalDirectory, as a DirectoryWalArchive and
    as a MemoryWalArchive give the same items (but for where each segment was)."""
    memory = MemoryWalArchive()
    for segno in (1, 2):
        data = segment_bytes(1, segno)
        name = segment_name(1, segno, SEGMENT_SIZE)
        if segno == 2:
            name, data = f"{name}.gz", gzip.compress(data, 1)
        (tmp_path / name).write_bytes(data)
        memory.put(name, data)

    def items(source: object) -> list[object]:
        out: list[object] = []
        for segno in (1, 2):  # each segment holds no record: the WAL ends in it
            for item in read_wal(
                [source],  # type: ignore[list-item]
                [TimelineSpan(1, None, None)],
                pgsnap.LSN(segno * SEGMENT_SIZE),
                pgsnap.LSN(3 * SEGMENT_SIZE),
            ):
                if isinstance(item, SegmentRead):
                    assert item.file is not None and item.path == item.file.location
                    out.append((item.name, item.file.name, item.lsn))
                elif isinstance(item, ScanEnd) and item.end_of_wal is not None:
                    eow = attrs.evolve(item.end_of_wal, path=None)
                    out.append(attrs.evolve(item, end_of_wal=eow))
                elif isinstance(item, EndOfWal):
                    out.append(attrs.evolve(item, path=None))
                else:
                    out.append(item)
        return out

    expected = items(str(tmp_path))
    assert [i[1] for i in expected if isinstance(i, tuple)] == [
        segment_name(1, 1, SEGMENT_SIZE),
        segment_name(1, 2, SEGMENT_SIZE) + ".gz",
    ]
    for source in (WalDirectory(tmp_path), DirectoryWalArchive(tmp_path), memory):
        assert items(source) == expected


def test_pg_waldump_is_not_used_for_an_archive_that_is_not_a_directory(
    caplog: pytest.LogCaptureFixture, tmp_path: pathlib.Path
) -> None:
    """With ``waldump`` set, an archive that is no LocalWalArchive is read with
    pgsnap's own reader (and a warning says so)."""
    from pgsnap.observe import Observer

    observer = Observer.__new__(Observer)
    object.__setattr__(observer, "archive", MemoryWalArchive())
    object.__setattr__(observer, "waldump", tmp_path / "pg_waldump")
    object.__setattr__(observer, "wal_index", None)
    with caplog.at_level(logging.WARNING, logger="pgsnap.observe"):
        scanner = observer._scanner(16, "7300000000000000001", SEGMENT_SIZE)
    assert scanner is not None
    assert "pgsnap's own reader" in caplog.text
