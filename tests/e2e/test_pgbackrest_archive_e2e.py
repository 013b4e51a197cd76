"""Recoveries over a WAL archive pgBackRest wrote, with the real pgBackRest (2.45).

Each server archives with ``archive_command = 'pgbackrest ... archive-push %p'``
into a repository, after a real ``stanza-create``: a posix repository (on the
archive volume, never snapshotted), or SeaweedFS over HTTPS (pgBackRest's S3
needs TLS; a self-signed certificate is both sides' CA). pgsnap backs the server
up with snapshots (mock volumes), more rows are written, and pgsnap plans a
point-in-time recovery over pgBackRest's archive (its planner lists the segments,
reads the timelines' history files and reads the WAL through
:class:`~pgsnap.archives.pgbackrest.PgBackRestArchive`), then runs it: PostgreSQL
fetches with pgBackRest's own ``archive-get``. The rows say what was recovered.

PostgreSQL 15 and 12: pgBackRest 2.45 (Debian 12's) knows no later version
(:data:`~pgsnap.testing.pgbackrest.PGBACKREST_MAX_MAJOR`).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.archives.pgbackrest import PgBackRestArchive
from pgsnap.errors import ArchiveError
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.testing.pgbackrest import pgbackrest_config, pgbackrest_unavailable
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable, self_signed_cert

from .conftest import Env, make_env, pitr_setup

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("pgbackrest")]

BUCKET = "pgbackrest"
STANZA = "main"


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A directory PostgreSQL's OS user can reach (pgBackRest's configuration, logs,
    the S3 certificate): not under pytest's 0700 directories."""
    reason = pgbackrest_unavailable()
    if reason is not None:
        pytest.fail(reason, pytrace=False)  # CI installs it: not a skip
    where = Path(tempfile.mkdtemp(prefix="pgsnap-pgbr-", dir="/tmp"))
    where.chmod(0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="module")
def s3(scratch: Path) -> Iterator[tuple[SeaweedS3, Path]]:
    """SeaweedFS serving HTTPS with a self-signed certificate (and the certificate)."""
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.fail(f"no SeaweedFS S3 server on this machine: {reason}", pytrace=False)
    cert, key = self_signed_cert(scratch / "tls")
    (scratch / "tls").chmod(0o755)
    server = SeaweedS3.start(scratch / "weed", tls=(cert, key))
    server.create_bucket(BUCKET)
    yield server, cert
    server.stop()


@attrs.define
class Repo:
    """pgBackRest's configuration of one server's stanza, and the tool run with it."""

    config: Path
    os_user: str = "postgres"

    def pgbackrest(self, *args: str) -> str:
        done = subprocess.run(
            [
                "runuser",
                "-u",
                self.os_user,
                "--",
                "pgbackrest",
                f"--config={self.config}",
                f"--stanza={STANZA}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"pgbackrest {' '.join(args)}: {done.stderr}{done.stdout}"
        return done.stdout


def posix_repo(work: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(pgBackRest's repo1 options, pgsnap's [archive] keys): a directory."""
    (work / "repo").mkdir()
    return {"repo1-path": str(work / "repo")}, {"path": str(work / "repo")}


def s3_repo(s3: tuple[SeaweedS3, Path], work: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The same, a prefix of the bucket (pgBackRest's repo1-path without its ``/``)."""
    server, cert = s3
    assert server.https_endpoint is not None
    prefix = f"pgbr-{uuid.uuid4().hex[:10]}"
    port = server.https_endpoint.rpartition(":")[2]
    credentials = work / "s3.credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {server.admin.access_key}\n"
        f"aws_secret_access_key = {server.admin.secret_key}\n"
    )
    credentials.chmod(0o600)
    options = {
        "repo1-type": "s3",
        "repo1-path": f"/{prefix}",
        "repo1-s3-endpoint": "localhost",
        "repo1-storage-port": port,
        "repo1-s3-bucket": BUCKET,
        "repo1-s3-region": "us-east-1",
        "repo1-s3-key": server.admin.access_key,
        "repo1-s3-key-secret": server.admin.secret_key,
        "repo1-s3-uri-style": "path",
        "repo1-storage-ca-file": str(cert),
    }
    section = {
        "path": f"s3://{BUCKET}/{prefix}",
        "endpoint_url": server.https_endpoint,
        "ca_bundle": str(cert),
        "credentials_file": str(credentials),
    }
    return options, section


def pgbackrest_env(
    pg_server: Any,
    bindir: Path | None,
    scratch: Path,
    repository: Callable[[Path], tuple[dict[str, str], dict[str, str]]],
    *,
    compress_type: str,
) -> tuple[Env, PgBackRestArchive, Repo]:
    """A running server archiving with ``pgbackrest archive-push`` into a stanza made
    by ``stanza-create`` in ``repository(work)``, and its pgsnap Cluster reading
    that archive (``[archive] format = "pgbackrest"``)."""
    work = Path(tempfile.mkdtemp(prefix="stanza-", dir=scratch))
    work.chmod(0o755)
    options, section = repository(work)
    config = work / "pgbackrest.conf"
    settings = archive_settings(
        {"format": "pgbackrest", "stanza": STANZA, "tool_config": str(config), **section}, str
    )
    archive = open_archive(settings)
    assert isinstance(archive, PgBackRestArchive)
    push = f"pgbackrest --config={config} --stanza={STANZA} archive-push %p"
    env = make_env(pg_server, bindir, archive=archive, archive_command=push)
    server = env.server
    pgbackrest_config(
        config,
        stanza=STANZA,
        repo=options,
        pg1_path=server.data_dir,
        work=work,
        extra={"compress-type": compress_type, "archive-timeout": "30"},
        stanza_options={
            "pg1-socket-path": str(server.socket_dir),
            "pg1-port": str(server.port),
            "pg1-user": "postgres",
        },
        # archive-get says on stdout what it found where: PostgreSQL's log shows it.
        sections={"global:archive-get": {"log-level-console": "info"}},
    )
    owner = pwd.getpwnam(server.os_user)
    for directory, dirs, files in os.walk(work):
        for entry in (directory, *(os.path.join(directory, n) for n in (*dirs, *files))):
            if not entry.endswith(".credentials"):  # pgsnap's: read by this process
                os.chown(entry, owner.pw_uid, owner.pw_gid)
    repo = Repo(config, server.os_user)
    repo.pgbackrest("stanza-create")

    def archived(name: str, timeout: float = 60) -> Path:
        status = server.wal_dir / "archive_status"
        deadline = time.monotonic() + timeout
        while not (status / f"{name}.done").exists() or (status / f"{name}.ready").exists():
            if time.monotonic() > deadline:
                raise ArchiveError(
                    f"{name} was not pushed within {timeout} s: {server.log_text()[-3000:]}",
                    hint="",
                )
            time.sleep(0.05)
        assert archive.exists(name), name
        return server.wal_dir / name

    server.wait_for_archived = archived  # type: ignore[method-assign]
    return env, archive, repo


def recover(env: Env, archive: PgBackRestArchive, target: RecoveryTarget) -> Any:
    """Crash, lose data and WAL, plan over pgBackRest's archive and run the plan:
    PostgreSQL fetches the WAL with pgBackRest's archive-get (its log says so)."""
    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA, VolumeRole.WAL])
    log_before = len(env.server.log_file.read_text(errors="replace"))
    env.cluster.execute(plan)
    log = env.server.log_file.read_text(errors="replace")[log_before:]
    restored = re.findall(r'restored log file "([0-9A-F]{24})" from archive', log)
    assert restored, log[-3000:]  # pg_wal was lost: everything came from the archive
    (archive_id,) = archive.archive_ids()
    for name in restored:
        assert f"found {name} in the repo1: {archive_id} archive" in log, log[-3000:]
    return plan


def test_recover_to_a_time_then_to_the_latest_across_timelines_from_a_posix_repository(
    pg_server: Any, pg_bindir: Path, scratch: Path
) -> None:
    env, archive, repo = pgbackrest_env(
        pg_server, pg_bindir, scratch, posix_repo, compress_type="gz"
    )
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, target, batch 3
    names = archive.list_names()
    assert any(n.endswith(".backup") for n in names), names  # pgsnap's backup's label
    stored = archive.locate(names[-1])
    assert stored is not None and stored.startswith(f"archive/{STANZA}/15-1/"), stored
    info = json.loads(repo.pgbackrest("info", "--output=json"))
    assert info[0]["archive"][0]["id"] == "15-1"
    assert info[0]["archive"][0]["max"] in names  # pgBackRest sees what pgsnap lists

    recover(env, archive, target)
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2
    env.write(5)
    env.switch_wal()  # timeline 2's segments and 00000002.history through archive-push
    assert archive.exists("00000002.history")
    assert archive.histories().timelines() == (1, 2)
    report = env.cluster.wal_report()  # pgsnap wal, over pgBackRest's archive
    assert [t.timeline for t in report.timelines] == [1, 2], report.explain()
    assert report.complete, report.explain()

    # Latest on timeline 2, the WAL volume lost again: the planner follows the history
    # file it read from pgBackRest's archive, PostgreSQL fetches it with archive-get.
    plan = recover(env, archive, RecoveryTarget.latest())
    assert plan.summary["timeline path"].startswith("1 (until"), plan.summary
    assert env.batches() == env.expect(1, 2, 5)
    assert env.timeline() == 3


def test_recover_to_an_lsn_from_an_s3_repository(
    pg_server: Any, pg_bindir: Path, scratch: Path, s3: tuple[SeaweedS3, Path]
) -> None:
    """zstd, which records no content size: the planner and the WAL reader go by each
    segment's header, the SHA-1 in its name checks what is read."""
    env, archive, _repo = pgbackrest_env(
        pg_server, pg_bindir, scratch, lambda work: s3_repo(s3, work), compress_type="zst"
    )
    target = pitr_setup(env, "lsn")
    segments = [n for n in archive.list_names() if len(n) == 24]
    stored = archive.locate(segments[-1])
    assert stored is not None and stored.endswith(".zst"), stored
    found = archive.stat(segments[-1])
    assert found is not None and found.size == 1024 * 1024 and found.content_size is None
    recover(env, archive, target)
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2


def test_recover_postgresql_12_by_xid(
    pg_server: Any, pg_bindir_for: Callable[[int], Path], scratch: Path
) -> None:
    env, archive, _repo = pgbackrest_env(
        pg_server, pg_bindir_for(12), scratch, posix_repo, compress_type="lz4"
    )
    target = pitr_setup(env, "xid")
    assert archive.archive_ids() == ("12-1",)
    recover(env, archive, target)
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2
