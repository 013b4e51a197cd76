"""pgsnap's own WAL archive in real object storage, with real PostgreSQL (issue 23 §3).

A SeaweedFS S3 server holds the archive. Each server archives with
``archive_command = 'pgsnap -c CONFIG wal-push %p'`` (this checkout's pgsnap, run by
the server's OS user), pgsnap backs it up with snapshots (mock volumes), and the
recovery fetches with ``pgsnap wal-get %f %p`` and its prefetcher. The rows say
what was recovered. The S3 server is also stopped while the server archives
(nothing is lost: the archiver tries again; no object is half-written) and while
a recovery replays (``wal-get`` fails cleanly, PostgreSQL waits, the replay
resumes when the server is back).
"""

from __future__ import annotations

import os
import pwd
import shlex
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.archives.config import archive_settings, open_archive, wal_get_command
from pgsnap.archives.store import StoreWalArchive
from pgsnap.errors import ArchiveError
from pgsnap.executor import Event, EventKind
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable
from pgsnap.testing.tcpgate import TcpGate

from .conftest import Env, make_env, pitr_setup

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("wal-store")]

MAJORS = (12, 15, 18)
REPO = Path(__file__).resolve().parents[2]
BUCKET = "wal"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.skip(f"no SeaweedFS S3 server on this machine: {reason}")
    server = SeaweedS3.start(tmp_path_factory.mktemp("weed"))
    server.create_bucket(BUCKET)  # one bucket: each of SeaweedFS's takes volumes of its own
    yield server
    server.stop()


@attrs.define
class WalStore:
    """pgsnap's archive in a bucket, and the commands PostgreSQL runs for it."""

    config: Path
    archive: StoreWalArchive
    push: str
    get: str


def wal_store(s3: SeaweedS3, *, ahead: int = 4, endpoint: str | None = None) -> WalStore:
    """A prefix of the bucket, a configuration (readable by the server's OS user, its S3
    keys in a credentials file only that user reads) and the archive there."""
    where = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    owner = pwd.getpwnam("postgres")
    work = Path(tempfile.mkdtemp(prefix="pgsnap-walstore-", dir="/tmp"))
    work.chmod(0o755)
    credentials = work / "s3.credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {s3.admin.access_key}\n"
        f"aws_secret_access_key = {s3.admin.secret_key}\n"
    )
    credentials.chmod(0o600)
    os.chown(credentials, owner.pw_uid, owner.pw_gid)
    config = work / "pgsnap.toml"
    config.write_text(
        "[archive]\n"
        'format = "pgsnap"\n'
        f'path = "{where}"\n'
        f'endpoint_url = "{endpoint or s3.endpoint}"\n'
        f'credentials_file = "{credentials}"\n'
        f"ahead = {ahead}\n"
        "parallel = 2\n"
    )
    prefix = (
        f"env PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m pgsnap "
        f"-c {shlex.quote(str(config))}"
    )
    options = {
        "format": "pgsnap",
        "path": where,
        "endpoint_url": endpoint or s3.endpoint,
        "credentials_file": str(credentials),
        "ahead": ahead,
        "parallel": 2,
    }
    push = f"{prefix} wal-push %p"
    # The restore command pgsnap writes (the spool's shell fast path first), with this
    # checkout's pgsnap.
    get = wal_get_command(archive_settings(options, str), pgsnap=prefix)
    settings = archive_settings({**options, "restore_command": get}, str, config=str(config))
    archive = open_archive(settings)
    assert isinstance(archive, StoreWalArchive)
    return WalStore(config, archive, push, get)


def store_env(pg_server: Any, bindir: Path | None, store: WalStore) -> Env:
    """A running cluster archiving into ``store``, and its pgsnap Cluster reading it; the
    server's ``wait_for_archived`` waits for the archiver's ``.done``."""
    env = make_env(pg_server, bindir, archive=store.archive, archive_command=store.push)
    server = env.server

    def archived(name: str, timeout: float = 60) -> Path:
        status = server.wal_dir / "archive_status"
        deadline = time.monotonic() + timeout
        while not (status / f"{name}.done").exists() or (status / f"{name}.ready").exists():
            if time.monotonic() > deadline:
                raise ArchiveError(f"{name} was not pushed within {timeout} s", hint="")
            time.sleep(0.05)
        assert store.archive.exists(name), name
        return server.wal_dir / name

    server.wait_for_archived = archived  # type: ignore[method-assign]
    return env


def recover(env: Env, target: RecoveryTarget) -> Any:
    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA, VolumeRole.WAL])
    env.cluster.execute(plan)
    log = env.server.log_file.read_text(errors="replace")
    assert "restored log file" in log, log[-3000:]  # fetched by wal-get: pg_wal was lost
    return plan


@pytest.fixture(params=MAJORS, ids=[f"pg{m}" for m in MAJORS])
def bindir(
    request: pytest.FixtureRequest, pg_bindir: Path, pg_bindir_for: Callable[[int], Path]
) -> Path:
    major: int = request.param
    return pg_bindir if major == 15 else pg_bindir_for(major)


def test_push_backup_and_recover_to_a_time_through_object_storage(
    pg_server: Any, s3: SeaweedS3, bindir: Path
) -> None:
    store = wal_store(s3)
    env = store_env(pg_server, bindir, store)
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, target, batch 3
    names = store.archive.list_names()
    assert names and all(store.archive.stat(n) is not None for n in names[:3])
    recover(env, target)
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2
    env.write(4)
    env.switch_wal()  # the new timeline archives through wal-push too
    assert any(n.startswith("00000002") for n in store.archive.list_names())
    assert "00000002.history" in store.archive.list_names()


def test_the_archive_survives_the_store_going_away_while_archiving_and_replaying(
    pg_server: Any, s3: SeaweedS3
) -> None:
    """S3 stopped while segments are pushed: the archiver retries, nothing is lost and
    nothing half-written; stopped while a recovery replays: wal-get fails, PostgreSQL
    waits and tries again, and the replay finishes once S3 is back."""
    port = int(s3.endpoint.rpartition(":")[2])
    gate = TcpGate(("127.0.0.1", port))  # S3 reached through it: closed, it is gone
    store = wal_store(s3, ahead=2, endpoint=f"http://127.0.0.1:{gate.port}")
    env = store_env(pg_server, None, store)
    target = pitr_setup(env, "lsn")
    gate.close()
    try:
        env.write(4)
        with env.server.connect() as conn:
            conn.execute("SELECT pg_switch_wal()")
        deadline = time.monotonic() + 60
        while not env.server.sql("SELECT failed_count FROM pg_stat_archiver")[0][0]:
            assert time.monotonic() < deadline, "the archiver never failed"
            time.sleep(0.2)  # wal-push fails (after its own tries): PostgreSQL keeps it
    finally:
        gate.open()
    env.switch_wal()  # everything, the segments written during the outage included
    env.server.wait_for_archive_idle(timeout=60)
    for name in store.archive.list_names():
        if len(name) == 24:
            assert store.archive.fetch(name)  # whole, and the digest checks
    # Replay with the store gone for a while: wal-get fails, PostgreSQL retries.
    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA, VolumeRole.WAL])
    (start,) = [s.id for s in plan.steps if s.action == "db.start_server"]
    revived = threading.Timer(3.0, gate.open)

    def outage(event: Event) -> None:  # S3 goes as PostgreSQL starts replaying
        if event.kind is EventKind.STARTED and event.step_id == start:
            gate.close()
            revived.start()

    try:
        env.cluster.execute(plan, on_event=outage)
    finally:
        if revived.is_alive():
            revived.join()
        gate.close()
    assert env.batches() == env.expect(1, 2)
    log = env.server.log_file.read_text(errors="replace")
    assert "the archive cannot be reached" in log, log[-3000:]  # wal-get waited for it
    last_start = log.rpartition("starting PostgreSQL")[2]
    for line in last_start.splitlines():  # no fatal restore, no recovery ended early
        assert not ("FATAL" in line and ("restore" in line or "recovery ended" in line)), line
