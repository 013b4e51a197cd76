"""The WAL archive conformance suite run against pgsnap's archives.

- :class:`~pgsnap.wal.archive.DirectoryWalArchive`, plain (its restore_command
  fetches no compressed segment) and with ``gzip=True``;
- :class:`~pgsnap.testing.memory_wal.MemoryWalArchive`, which holds its files in
  a dictionary and has no path: the second implementation that proves the
  observer, the reader and the checks use only the protocol.

The last test runs the suite against deliberately broken archives (with
pytester) to prove that it fails them.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.archives.store import StoreWalArchive
from pgsnap.testing.memory_wal import MemoryWalArchive
from pgsnap.testing.wal_conformance import PutFile, WalArchiveConformance
from pgsnap.wal.archive import DirectoryWalArchive

pytest_plugins = ("pytester",)


def _put_into(directory: Path) -> PutFile:
    def put(name: str, data: bytes) -> None:
        # As an archive_command: written aside, then renamed into place.
        tmp = directory / f".{name}.part"
        tmp.write_bytes(data)
        os.replace(tmp, directory / name)

    return put


class TestDirectoryWalArchive(WalArchiveConformance):
    """A directory whose restore_command fetches plain files only."""

    restorable_compressions = frozenset()

    @pytest.fixture
    def archive(self, tmp_path: Path) -> DirectoryWalArchive:
        (tmp_path / "archive").mkdir()
        return DirectoryWalArchive(tmp_path / "archive")

    @pytest.fixture
    def put_file(self, tmp_path: Path) -> PutFile:
        return _put_into(tmp_path / "archive")

    @pytest.fixture
    def unreadable_archive(self, tmp_path: Path) -> DirectoryWalArchive:
        return DirectoryWalArchive(tmp_path / "no-such-archive")


class TestDirectoryWalArchiveGzip(TestDirectoryWalArchive):
    """``gzip=True``: ``%f.gz`` is fetched and decompressed too."""

    restorable_compressions = frozenset({"gz"})

    @pytest.fixture
    def archive(self, tmp_path: Path) -> DirectoryWalArchive:
        (tmp_path / "archive").mkdir()
        return DirectoryWalArchive(tmp_path / "archive", gzip=True)

    @pytest.fixture
    def unreadable_archive(self, tmp_path: Path) -> DirectoryWalArchive:
        (tmp_path / "a-file").write_text("not a directory")
        return DirectoryWalArchive(tmp_path / "a-file", gzip=True)


class TestMemoryWalArchive(WalArchiveConformance):
    """Files in a dictionary; no path anywhere."""

    @pytest.fixture
    def archive(self) -> Iterator[MemoryWalArchive]:
        with MemoryWalArchive(name="conformance") as archive:
            assert not hasattr(archive, "path")
            yield archive

    @pytest.fixture
    def put_file(self, archive: MemoryWalArchive) -> PutFile:
        return archive.put

    @pytest.fixture
    def unreadable_archive(self) -> MemoryWalArchive:
        return MemoryWalArchive(unreadable="connection refused")


class TestStoreWalArchive(WalArchiveConformance):
    """pgsnap's own archive (``wal-push``/``wal-get``) in a directory store: plain names
    only, its restore_command is ``pgsnap wal-get`` (this checkout's, run as
    PostgreSQL would run it)."""

    compressions = frozenset()
    restorable_compressions = frozenset()
    plain_names_only = True

    @pytest.fixture
    def archive(self, tmp_path: Path) -> StoreWalArchive:
        return store_archive(tmp_path / "store")

    @pytest.fixture
    def put_file(self, archive: StoreWalArchive) -> PutFile:
        def put(name: str, data: bytes) -> None:
            archive.delete([name])  # the test rewrites a file; wal-push never does
            archive.push(name, data)

        return put

    @pytest.fixture
    def unreadable_archive(self, tmp_path: Path) -> StoreWalArchive:
        return store_archive(tmp_path / "no-such-store", make=False)


def store_archive(root: Path, *, make: bool = True) -> StoreWalArchive:
    """pgsnap's archive in the directory ``root``, with a configuration beside it whose
    ``wal-get`` is this checkout's pgsnap."""
    if make:
        root.mkdir()
    config = root.parent / f"{root.name}.toml"
    config.write_text(f'[archive]\nformat = "pgsnap"\npath = "{root}"\nahead = 0\n')
    repo = Path(__file__).resolve().parents[2]
    command = (
        f"env PYTHONPATH={shlex.quote(str(repo))} {shlex.quote(sys.executable)} -m pgsnap "
        f"-c {shlex.quote(str(config))} wal-get '%f' '%p'"
    )
    settings = archive_settings(
        {"format": "pgsnap", "path": str(root), "restore_command": command},
        str,
        config=str(config),
    )
    archive = open_archive(settings)
    assert isinstance(archive, StoreWalArchive)
    return archive


# --------------------------------------------------------------------------- the suite has teeth

_BROKEN = """
import io
import pytest
from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.archives.store import StoreWalArchive
from pgsnap.testing.memory_wal import MemoryWalArchive
from pgsnap.testing.wal_conformance import WalArchiveConformance

class Fixtures:
    @pytest.fixture
    def put_file(self, archive):
        return archive.put
    @pytest.fixture
    def unreadable_archive(self):
        return MemoryWalArchive(unreadable="down")

class ListsEverything(MemoryWalArchive):
    "Shows files being written, unsorted."
    def list_names(self, segment_size=None, *, check_sizes=True):
        return tuple(reversed(list(self._files)))

class TestListsEverything(Fixtures, WalArchiveConformance):
    @pytest.fixture
    def archive(self):
        return ListsEverything()

class Resolves(MemoryWalArchive):
    "stat finds compressed copies: not exact."
    def stat(self, name):
        return super().stat(name) or super().stat(name + ".gz")

class TestResolves(Fixtures, WalArchiveConformance):
    @pytest.fixture
    def archive(self):
        return Resolves()

class RawOpen(MemoryWalArchive):
    "open returns the stored bytes, not decompressed."
    def open(self, name):
        self._content(name)
        return io.BytesIO(self.stored(name))

class TestRawOpen(Fixtures, WalArchiveConformance):
    @pytest.fixture
    def archive(self):
        return RawOpen()

class Leaky(MemoryWalArchive):
    "A missing file leaks a KeyError."
    def open(self, name):
        return io.BytesIO(self.stored(name))

class TestLeaky(Fixtures, WalArchiveConformance):
    @pytest.fixture
    def archive(self):
        return Leaky()

class TestNoFixtures(WalArchiveConformance):
    pass
"""


def test_suite_fails_broken_archives(pytester: pytest.Pytester) -> None:
    """A suite that never fails proves nothing: broken archives must fail it."""
    pytester.makepyfile(test_broken=_BROKEN)
    result = pytester.runpytest_inprocess(
        "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark"
    )
    outcome: dict[str, str] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        if report.when == "call" or report.outcome != "passed":
            outcome["::".join(report.nodeid.split("::")[1:])] = report.outcome
    assert "skipped" not in outcome.values()
    assert (
        outcome["TestListsEverything::test_listing_is_sorted_and_leaves_out_files_being_written"]
        == "failed"
    )
    assert outcome["TestResolves::test_compressed_segments"] == "failed"
    assert outcome["TestRawOpen::test_compressed_segments"] == "failed"
    assert outcome["TestRawOpen::test_stat_and_open_a_plain_segment"] == "passed"
    assert outcome["TestLeaky::test_missing_files"] == "failed"
    assert outcome["TestNoFixtures::test_empty_archive"] == "failed"
    result.stdout.fnmatch_lines(["*must define the 'archive' fixture*"])
