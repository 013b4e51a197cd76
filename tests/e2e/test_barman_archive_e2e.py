"""Recovery over barman-cloud's WAL archive, with the real barman-cloud and PostgreSQL 15.

barman 3.19.1 (``barman[cloud,lz4,snappy,zstandard]``) is installed once into a
virtual environment PostgreSQL's OS user can run
(:func:`pgsnap.testing.barmancloud.barman_cloud_bin`, under
``/var/cache/pgsnap-test``); a SeaweedFS S3 server holds the archive.

- The server archives with ``barman-cloud-wal-archive --gzip`` (its credentials in
  an AWS credentials file only the ``postgres`` user reads). pgsnap backs it up with
  snapshots (mock volumes), more rows are written, and pgsnap plans a
  point-in-time recovery over barman-cloud's archive (``[archive] format =
  "barman"``) and executes it: the restore command pgsnap writes runs the real
  ``barman-cloud-wal-restore``, and the rows say what was recovered.
- pgsnap reads what the real ``barman-cloud-wal-archive`` wrote in each of its
  compressions (none, gzip, bzip2, xz, snappy, zstd, lz4): names, sizes, content,
  histories.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.archives import barman
from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.errors import ArchiveError
from pgsnap.model import VolumeRole
from pgsnap.testing.barmancloud import barman_cloud_bin, barman_cloud_env
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable
from pgsnap.testing.wal_conformance import segment_bytes
from pgsnap.wal import segment_name

from .conftest import Env, make_env, pitr_setup

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("barman-s3")]

BUCKET = "barman"
SERVER = "pg-main"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.skip(f"no SeaweedFS S3 server on this machine: {reason}")
    server = SeaweedS3.start(tmp_path_factory.mktemp("weed"))
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def barman_bin() -> Path:
    return barman_cloud_bin()


def credentials_for_postgres(s3: SeaweedS3) -> Path:
    """An AWS credentials file with the server's keys, mode 0600, owned by ``postgres``
    (PostgreSQL runs barman-cloud as that user), in a directory it can reach."""
    owner = pwd.getpwnam("postgres")
    work = Path(tempfile.mkdtemp(prefix="pgsnap-barman-", dir="/tmp"))
    work.chmod(0o755)
    path = work / "s3.credentials"
    path.write_text(
        f"[default]\naws_access_key_id = {s3.admin.access_key}\n"
        f"aws_secret_access_key = {s3.admin.secret_key}\n"
    )
    path.chmod(0o600)
    os.chown(path, owner.pw_uid, owner.pw_gid)
    return path


def test_recover_to_a_time_over_barman_clouds_archive(
    pg_server: Any, s3: SeaweedS3, barman_bin: Path
) -> None:
    """PostgreSQL 15 archives with barman-cloud-wal-archive; pgsnap backs up, plans a
    recovery to a time over barman-cloud's archive and runs it with the restore
    command it writes (barman-cloud-wal-restore): the rows before the target are
    back, those after it are not."""
    location = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}"
    credentials = credentials_for_postgres(s3)
    section = {
        "format": "barman",
        "path": location,
        "server": SERVER,
        "endpoint_url": s3.endpoint,
        "region": "us-east-1",
        "credentials_file": str(credentials),
    }
    command = barman.restore_command(
        archive_settings(section, str), program=str(barman_bin / "barman-cloud-wal-restore")
    )
    archive = open_archive(archive_settings({**section, "restore_command": command}, str))
    assert isinstance(archive, barman.BarmanCloudWalArchive)
    assert s3.admin.secret_key not in command and s3.admin.access_key not in command
    push = " ".join(
        shlex.quote(w)
        for w in (
            "env",
            f"AWS_SHARED_CREDENTIALS_FILE={credentials}",
            "AWS_DEFAULT_REGION=us-east-1",
            str(barman_bin / "barman-cloud-wal-archive"),
            "--endpoint-url",
            s3.endpoint,
            "--gzip",
            location,
            SERVER,
        )
    )
    env = make_env(pg_server, None, archive=archive, archive_command=f"{push} %p")
    archived_by_barman(env, archive)

    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, target, batch 3
    names = archive.list_names()
    assert any(n.endswith(".backup") for n in names), names  # pg_backup_stop's file
    segment = next(n for n in names if len(n) == 24)
    found = archive.stat(segment)
    assert found is not None and found.size == found.content_size == 1024 * 1024  # ISIZE

    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA, VolumeRole.WAL])
    env.cluster.execute(plan)
    log = env.server.log_file.read_text(errors="replace")
    assert "restored log file" in log, log[-3000:]  # fetched by barman-cloud-wal-restore
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2
    # barman-cloud-wal-restore's own words at the end of the archive: it did the fetching
    assert f"for server {SERVER} does not exist" in log, log[-3000:]


def archived_by_barman(env: Env, archive: barman.BarmanCloudWalArchive) -> None:
    """The server's ``wait_for_archived`` waits for the archiver, then finds the file
    in barman-cloud's archive through pgsnap."""
    server = env.server

    def archived(name: str, timeout: float = 60) -> Path:
        status = server.wal_dir / "archive_status"
        deadline = time.monotonic() + timeout
        while not (status / f"{name}.done").exists() or (status / f"{name}.ready").exists():
            if time.monotonic() > deadline:
                raise ArchiveError(f"{name} was not archived within {timeout} s", hint="")
            time.sleep(0.05)
        assert archive.exists(name), name
        return server.wal_dir / name

    server.wait_for_archived = archived  # type: ignore[method-assign]


COMPRESSIONS = ("", "--gzip", "--bzip2", "--xz", "--snappy", "--zstd", "--lz4")


def test_pgsnap_reads_what_barman_cloud_wal_archive_wrote(
    s3: SeaweedS3, barman_bin: Path, tmp_path: Path
) -> None:
    """The real barman-cloud-wal-archive writes a segment, a history file and a
    backup file in each of its compressions; pgsnap lists PostgreSQL's names, tells
    each file's size and gives back the content."""
    size = 1024 * 1024
    segment = segment_name(1, 3, size)
    # 256 KiB that do not compress: too big to read whole to tell its length
    plain = segment_bytes(1, 3, segment_size=size)
    noisy = plain[:8192] + os.urandom(256 * 1024) + plain[8192 + 256 * 1024 :]
    files = {
        segment: noisy,
        "00000002.history": b"1\t0/3000000\tno recovery target specified\n",
        f"{segment_name(1, 2, size)}.00000028.backup": b"START WAL LOCATION: 0/2000028\n",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    env = barman_cloud_env(s3.admin.access_key, s3.admin.secret_key)
    credentials = tmp_path / "s3.credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {s3.admin.access_key}\n"
        f"aws_secret_access_key = {s3.admin.secret_key}\n"
    )
    credentials.chmod(0o600)
    run = uuid.uuid4().hex[:8]
    running = []
    for option in COMPRESSIONS:
        for name in files:
            argv = [str(barman_bin / "barman-cloud-wal-archive"), "--endpoint-url", s3.endpoint]
            argv += [option] if option else []
            argv += [f"s3://{BUCKET}/{run}{option or '-plain'}", SERVER, str(tmp_path / name)]
            running.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
    for proc in running:
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{run}--xz/")["Contents"]
    assert {o["Key"].removeprefix(f"{run}--xz/") for o in listed} == {
        f"{SERVER}/wals/0000000100000000/{segment}.xz",
        f"{SERVER}/wals/00000002.history.xz",
        f"{SERVER}/wals/0000000100000000/{segment_name(1, 2, size)}.00000028.backup.xz",
    }
    for option in COMPRESSIONS:
        location = f"s3://{BUCKET}/{run}{option or '-plain'}"
        archive = open_archive(
            archive_settings(
                {
                    "format": "barman",
                    "path": location,
                    "server": SERVER,
                    "endpoint_url": s3.endpoint,
                    "region": "us-east-1",
                    "credentials_file": str(credentials),
                },
                str,
            )
        )
        assert archive.list_names() == tuple(sorted(files)), option
        assert archive.list_names(size) == tuple(sorted(files)), option
        found = archive.stat(segment)
        assert found is not None and found.size == size, option
        # The length is recorded by none, gzip (ISIZE) and barman's lz4 (its frame's
        # content size), claimed from the first page for the others.
        exact = option in ("", "--gzip", "--lz4")
        assert found.content_size == (size if exact else None), option
        stream = archive.open(segment)
        try:
            assert stream.read(size + 1) == files[segment], option
        finally:
            stream.close()
        assert archive.read_text("00000002.history") == files["00000002.history"].decode()
        assert archive.histories().timelines() == (1, 2)
        backup = f"{segment_name(1, 2, size)}.00000028.backup"
        assert archive.read_text(backup) == files[backup].decode()
