"""The WAL archive conformance suite run against a pgBackRest repository.

:class:`~pgsnap.archives.pgbackrest.PgBackRestArchive` over a directory store (a
posix repository): ``put_file`` stores each file as ``archive-push`` does
(:class:`~pgsnap.testing.pgbackrest.RepoBuilder`: a segment under the SHA-1 of
its content, compressed; ``.history`` and ``.backup`` files as they are), into a
stanza whose ``archive.info`` is the one ``stanza-create`` writes for a real
PostgreSQL 15 data directory (initdb'd once for the module). The restore_command
is the one pgsnap writes, ``pgbackrest --stanza=main --config=... --pg1-path="$PWD"
archive-get %f "%p"``, run where PostgreSQL runs it, in that data directory: the
real pgBackRest reads the files ``put_file`` wrote (and the data directory's
``pg_control``, to choose the archive id).

Two classes: segments gzip-compressed (pgBackRest's default ``compress-type``) and
not compressed. lz4, zstd and bzip2, which do not record their content's size,
are read in ``tests/integration/test_pgbackrest_archive_real.py`` from files the
real ``archive-push`` wrote.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.archives.pgbackrest import PgBackRestArchive
from pgsnap.testing.pgbackrest import RepoBuilder, pgbackrest_config, pgbackrest_unavailable
from pgsnap.testing.pgserver import PgServer
from pgsnap.testing.wal_conformance import PutFile, WalArchiveConformance

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg15_data(pg_bindir_for: Callable[[int], Path]) -> Iterator[tuple[Path, int]]:
    """A PostgreSQL 15 data directory (never started) and its system identifier: the
    cluster ``archive-get`` restores into, as far as it can tell (its pg_control)."""
    reason = pgbackrest_unavailable()
    if reason is not None:
        pytest.fail(reason, pytrace=False)  # CI installs it: not a skip
    server = PgServer.create(pg_bindir_for(15), archive=False)
    try:
        control = (server.data_dir / "global" / "pg_control").read_bytes()
        yield server.data_dir, struct.unpack_from("<Q", control)[0]
    finally:
        server.cleanup()


def pgbackrest_archive(
    tmp_path: Path, data_dir: Path, system_identifier: int, *, make: bool = True
) -> PgBackRestArchive:
    """A stanza ``main`` at ``tmp_path/repo`` (archive.info of that cluster, unless not
    ``make``), pgBackRest's configuration beside it, and the archive pgsnap opens from
    ``[archive]``."""
    repo = tmp_path / "repo"
    if make:
        RepoBuilder(repo).create([(1, "15", system_identifier)])
    config = pgbackrest_config(
        tmp_path / "pgbackrest.conf",
        stanza="main",
        repo={"repo1-path": str(repo)},
        pg1_path=data_dir,
        work=tmp_path / "pgbackrest",
    )
    settings = archive_settings(
        {
            "format": "pgbackrest",
            "path": str(repo),
            "stanza": "main",
            "tool_config": str(config),
        },
        str,
    )
    archive = open_archive(settings)
    assert isinstance(archive, PgBackRestArchive)
    return archive


class TestPgBackRestArchiveGzip(WalArchiveConformance):
    """Segments stored as ``archive-push`` stores them with ``compress-type=gz``."""

    compressions = frozenset()
    restorable_compressions = frozenset()
    plain_names_only = True
    deletes = False
    codec: ClassVar[str | None] = "gz"

    @pytest.fixture
    def archive(
        self, tmp_path: Path, pg15_data: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
    ) -> PgBackRestArchive:
        assert shutil.which("pgbackrest")
        monkeypatch.chdir(pg15_data[0])  # PostgreSQL runs restore_command in its data directory
        return pgbackrest_archive(tmp_path, *pg15_data)

    @pytest.fixture
    def put_file(self, tmp_path: Path) -> PutFile:
        builder = RepoBuilder(tmp_path / "repo")

        def put(name: str, data: bytes) -> None:
            builder.push(name, data, compression=self.codec, replace=True)

        return put

    @pytest.fixture
    def unreadable_archive(self, tmp_path: Path, pg15_data: tuple[Path, int]) -> PgBackRestArchive:
        return pgbackrest_archive(tmp_path / "nothing", *pg15_data, make=False)


class TestPgBackRestArchivePlain(TestPgBackRestArchiveGzip):
    """Segments stored with ``compress-type=none``: ``<segment>-<sha1>``."""

    codec: ClassVar[str | None] = None
