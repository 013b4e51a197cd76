"""The WAL archive conformance suite over the archives of barman-cloud and WAL-G.

Each class's ``put_file`` writes a file as the tool writes it: its key in the
tool's layout, compressed as the tool compresses (the suite gives plain names and
plain bytes: the compression is the object's, as in pgsnap's own archive), and a
file written again replaces every stored form of it.

- :class:`TestBarmanCloudWalArchive`: barman-cloud's layout with ``--gzip`` in a
  directory store. barman-cloud-wal-restore reads cloud storage only, so its
  restore command here is pgsnap's own reading (``_tool_restore.py``), honestly
  named; :class:`TestBarmanCloudS3WalArchive` runs the suite in a real S3 server
  (SeaweedFS) with ``--lz4`` objects and the restore command pgsnap writes, which
  runs the real ``barman-cloud-wal-restore`` (barman 3.19.1 in a virtual
  environment, :mod:`pgsnap.testing.barmancloud`).
- :class:`TestWalgWalArchive`: WAL-G's layout (``wal_005/``, its default lz4 as
  ``github.com/pierrec/lz4/v4`` writes it) in a directory store, as
  ``WALG_FILE_PREFIX`` keeps it. No WAL-G binary can be installed here (WAL-G is in
  no package registry this project reaches): the layout follows WAL-G's source
  (see :mod:`pgsnap.archives.walg`), and the suite's restore command is pgsnap's
  own reading (``_tool_restore.py``), not ``wal-g wal-fetch``.
"""

from __future__ import annotations

import gzip
import importlib
import shlex
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.archives import barman, walg
from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.protocols import WalArchive
from pgsnap.testing.barmancloud import barman_cloud_bin
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable
from pgsnap.testing.wal_conformance import PutFile, WalArchiveConformance
from pgsnap.wal.names import WalFileKind, parse_archive_name

REPO = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).with_name("_tool_restore.py")
lz4frame: Any = importlib.import_module("lz4.frame")  # untyped


def pierrec_lz4(data: bytes) -> bytes:
    """lz4 as WAL-G's lz4 writer (``pierrec/lz4/v4`` with its defaults) writes it: one
    frame, 4 MiB blocks, a content checksum, no content size."""
    return bytes(
        lz4frame.compress(
            data,
            block_size=lz4frame.BLOCKSIZE_MAX4MB,
            content_checksum=True,
            store_size=False,
        )
    )


def barman_key(server: str, name: str) -> str:
    """barman-cloud's key of ``name`` (without a suffix): ``barman/xlog.py`` hash_dir."""
    if parse_archive_name(name).kind is WalFileKind.HISTORY:
        return f"{server}/wals/{name}"
    return f"{server}/wals/{name[:16]}/{name}"


def helper_command(fmt: str, root: Path, server: str = "-") -> str:
    """The suite's restore command for a directory: pgsnap's reading of the archive."""
    words = [
        "env",
        f"PYTHONPATH={REPO}",
        sys.executable,
        str(HELPER),
        fmt,
        str(root),
        server,
    ]
    return " ".join(shlex.quote(w) for w in words).replace("%", "%%") + " '%f' '%p'"


def directory_put(root: Path, key_of: Callable[[str], str], suffix: str, compress: Any) -> PutFile:
    """``put_file`` writing ``key_of(name) + suffix`` below ``root``, compressed, in
    place of any other stored form of the file."""

    def put(name: str, data: bytes) -> None:
        path = root / key_of(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        for form in ("", ".gz", ".lz4", ".zst", ".bz2", ".xz", ".snappy", ".lzma", ".br"):
            path.with_name(path.name + form).unlink(missing_ok=True)
        target = path.with_name(path.name + suffix)
        tmp = target.with_name(target.name + ".writing-tmp")  # as a tool writes: aside
        tmp.write_bytes(compress(data))
        tmp.rename(target)

    return put


class TestBarmanCloudWalArchive(WalArchiveConformance):
    """barman-cloud's layout (``--gzip``) in a directory store; restore command:
    pgsnap's reading (``_tool_restore.py``), since barman-cloud-wal-restore needs
    cloud storage."""

    compressions = frozenset()
    restorable_compressions = frozenset()
    plain_names_only = True
    deletes = False

    @pytest.fixture
    def archive(self, tmp_path: Path) -> WalArchive:
        root = tmp_path / "destination"
        root.mkdir()
        settings = archive_settings(
            {
                "format": "barman",
                "path": str(root),
                "server": "main",
                "restore_command": helper_command("barman", root, "main"),
            },
            str,
        )
        archive = open_archive(settings)
        assert isinstance(archive, barman.BarmanCloudWalArchive)
        return archive

    @pytest.fixture
    def put_file(self, tmp_path: Path) -> PutFile:
        return directory_put(
            tmp_path / "destination", lambda n: barman_key("main", n), ".gz", gzip.compress
        )

    @pytest.fixture
    def unreadable_archive(self, tmp_path: Path) -> WalArchive:
        settings = archive_settings(
            {"format": "barman", "path": str(tmp_path / "gone"), "server": "main"}, str
        )
        return open_archive(settings)


class TestWalgWalArchive(WalArchiveConformance):
    """WAL-G's layout (``wal_005/<name>.lz4``, its default compression) in a directory
    store, as with ``WALG_FILE_PREFIX``. There is no WAL-G binary here: the restore
    command is pgsnap's reading (``_tool_restore.py``), not ``wal-g wal-fetch``."""

    compressions = frozenset()
    restorable_compressions = frozenset()
    plain_names_only = True
    deletes = False

    @pytest.fixture
    def archive(self, tmp_path: Path) -> WalArchive:
        root = tmp_path / "walg"
        root.mkdir()
        settings = archive_settings(
            {"format": "walg", "path": str(root), "restore_command": helper_command("walg", root)},
            str,
        )
        archive = open_archive(settings)
        assert isinstance(archive, walg.WalgWalArchive)
        return archive

    @pytest.fixture
    def put_file(self, tmp_path: Path) -> PutFile:
        return directory_put(tmp_path / "walg", lambda n: f"wal_005/{n}", ".lz4", pierrec_lz4)

    @pytest.fixture
    def unreadable_archive(self, tmp_path: Path) -> WalArchive:
        return open_archive(archive_settings({"format": "walg", "path": str(tmp_path / "x")}, str))


# --------------------------------------------------------------------------- in real S3


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.skip(f"no SeaweedFS S3 server on this machine: {reason}")
    server = SeaweedS3.start(tmp_path_factory.mktemp("weed"))
    server.create_bucket("barman")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def barman_bin() -> Path:
    return barman_cloud_bin()


@pytest.fixture(scope="module")
def credentials(s3: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AWS shared credentials file (mode 0600) with the server's keys."""
    path = tmp_path_factory.mktemp("creds") / "s3.credentials"
    path.write_text(
        f"[default]\naws_access_key_id = {s3.admin.access_key}\n"
        f"aws_secret_access_key = {s3.admin.secret_key}\n"
    )
    path.chmod(0o600)
    return path


@pytest.mark.slow
@pytest.mark.xdist_group("barman-s3")
class TestBarmanCloudS3WalArchive(WalArchiveConformance):
    """barman-cloud's layout with ``--lz4`` (``lz4frame.compress``, as barman's
    ``LZ4Compressor.compress_in_mem``) in a SeaweedFS bucket; the restore command is
    the one pgsnap writes, running the real ``barman-cloud-wal-restore``."""

    compressions = frozenset()
    restorable_compressions = frozenset()
    plain_names_only = True
    deletes = False

    @pytest.fixture
    def location(self) -> str:
        return f"s3://barman/{uuid.uuid4().hex[:10]}"

    @pytest.fixture
    def archive(
        self, s3: SeaweedS3, barman_bin: Path, credentials: Path, location: str
    ) -> WalArchive:
        section = {
            "format": "barman",
            "path": location,
            "server": "pg-main",
            "endpoint_url": s3.endpoint,
            "region": "us-east-1",
            "credentials_file": str(credentials),
        }
        settings = archive_settings(section, str)
        command = barman.restore_command(
            settings, program=str(barman_bin / "barman-cloud-wal-restore")
        )
        assert str(barman_bin) in command and "%f" in command
        archive = open_archive(archive_settings({**section, "restore_command": command}, str))
        assert isinstance(archive, barman.BarmanCloudWalArchive)
        return archive

    @pytest.fixture
    def put_file(self, s3: SeaweedS3, location: str) -> PutFile:
        client = s3.client()
        prefix = location.removeprefix("s3://barman/")

        def put(name: str, data: bytes) -> None:
            key = f"{prefix}/{barman_key('pg-main', name)}"
            for old in client.list_objects_v2(Bucket="barman", Prefix=key).get("Contents", []):
                client.delete_object(Bucket="barman", Key=old["Key"])
            client.put_object(Bucket="barman", Key=key + ".lz4", Body=lz4frame.compress(data))

        return put

    @pytest.fixture
    def unreadable_archive(self, s3: SeaweedS3, credentials: Path) -> WalArchive:
        section = {
            "format": "barman",
            "path": "s3://no-such-bucket/x",
            "server": "pg-main",
            "endpoint_url": s3.endpoint,
            "region": "us-east-1",
            "credentials_file": str(credentials),
        }
        return open_archive(archive_settings(section, str))
