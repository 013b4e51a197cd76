"""PostgresAdapter against real PostgreSQL servers (15 from the system, 12 and 17 from npm)."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from pgsnap.adapters.postgres import PostgresAdapter, RecoveryResult
from pgsnap.errors import BackupModeError, ConfigurationError, DatabaseError
from pgsnap.model import LSN, RecoveryAction, RecoverySettings, RecoveryTarget

pytestmark = pytest.mark.postgres


def adapter_for(server, **kwargs) -> PostgresAdapter:
    return PostgresAdapter(
        server.conninfo(),
        data_directory=str(server.data_dir),
        bindir=str(server.bindir),
        **kwargs,
    )


def rows(server, sql: str) -> list[Any]:
    return [r[0] for r in server.sql(sql)]


def test_describe_and_archiver_status(pg_server):
    srv = pg_server()
    srv.start()
    a = adapter_for(srv)
    facts = a.describe()
    assert facts.major == srv.major
    assert facts.system_identifier == str(
        srv.sql("SELECT system_identifier FROM pg_control_system()")[0][0]
    )
    assert os.path.realpath(facts.data_directory) == os.path.realpath(srv.data_dir)
    assert facts.wal_directory == os.path.realpath(srv.wal_dir)
    assert facts.wal_directory != os.path.join(facts.data_directory, "pg_wal")
    assert facts.wal_segment_size == 1024 * 1024
    assert facts.timeline == 1
    assert not facts.in_recovery
    assert facts.current_lsn is not None
    assert facts.current_lsn >= facts.checkpoint_lsn
    assert facts.redo_lsn <= facts.checkpoint_lsn
    assert facts.settings["wal_level"] == "replica"
    assert facts.settings["archive_mode"] == "on"
    assert "archive_library" in facts.settings  # 15+
    assert facts.tablespaces == ()

    name = srv.switch_wal_and_wait_archived()
    status = a.archiver_status()
    assert status.archived_count >= 1
    assert status.last_archived_wal == name
    assert status.last_archived_time is not None
    assert status.last_archived_time.tzinfo
    assert status.failed_count == 0
    assert status.archive_command == srv.archive_command()
    assert status.oldest_ready_age_seconds is None
    assert facts.standby is None and facts.role.value == "primary"

    # A query without parameters is sent as it is: a '%' in a drill's check is no
    # placeholder; with parameters, %s takes them.
    assert a.query("SELECT 'a%' LIKE 'a%%' OR 'b%' LIKE 'b%'") == [(True,)]
    assert a.query("SELECT %s::int + 1", (41,)) == [(42,)]


def test_tablespace_listed(pg_server):
    srv = pg_server()
    loc = srv.base_dir / "ts1"
    loc.mkdir()
    os.chown(loc, srv.data_dir.stat().st_uid, srv.data_dir.stat().st_gid)
    srv.start()
    srv.sql(f"CREATE TABLESPACE ts1 LOCATION '{loc}'")
    facts = adapter_for(srv).describe()
    assert [(t.name, t.location) for t in facts.tablespaces] == [("ts1", str(loc))]


def test_backup_session_start_stop(pg_server):
    srv = pg_server()
    srv.start()
    a = adapter_for(srv)
    with a.backup_session() as session:
        pid, app = srv.sql(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE application_name = 'pgsnap backup'"
        )[0]
        assert app == "pgsnap backup"
        start = session.start("pgsnap-test-1")
        assert start.timeline == 1
        assert start.time.tzinfo is not None
        with pytest.raises(BackupModeError, match="cannot start"):
            session.start("again")
        stop = session.stop()
        assert session.state == "stopped"
    assert session.state == "closed"
    assert stop.labelfile.startswith(f"START WAL LOCATION: {start.lsn} ")
    assert "LABEL: pgsnap-test-1\n" in stop.labelfile
    assert "BACKUP METHOD: streamed" in stop.labelfile
    assert stop.spcmapfile == ""
    assert stop.lsn > start.lsn
    assert stop.timeline == 1
    assert stop.time >= start.time
    # the session is closed
    assert rows(srv, f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}") == [0]


def test_stop_without_start_and_server_errors(pg_server):
    srv = pg_server()
    srv.start()
    a = adapter_for(srv)
    with (
        a.backup_session() as session,
        pytest.raises(BackupModeError, match="no backup is running"),
    ):
        session.stop()
    with a.backup_session() as session:
        with pytest.raises(BackupModeError) as info:
            session.start("x" * 2000)  # backup label too long
        assert info.value.sqlstate is not None


def test_lost_backup_session_is_aborted_by_server(pg_server):
    srv = pg_server()
    srv.start()
    a = adapter_for(srv)
    session = a.backup_session()
    try:
        session.start("doomed")
        assert srv.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'pgsnap backup'"
        ) == [(True,)]
        with pytest.raises(BackupModeError, match="session lost") as info:
            session.stop()
        assert info.value.hint
        assert session.state == "lost"
        with pytest.raises(BackupModeError, match="session lost"):
            session.stop()
    finally:
        session.close()
    # The server aborted the backup when the backend exited (logged while it exits,
    # possibly after the client saw the connection close).
    deadline = time.monotonic() + 10
    aborted = "aborting backup due to backend exiting before pg_backup_stop was called"
    while aborted not in srv.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert aborted in srv.log_text()
    # and a new backup works
    with a.backup_session() as s2:
        s2.start("next")
        assert s2.stop().labelfile.startswith("START WAL LOCATION")


def test_stop_start_server_as_owner(pg_server):
    srv = pg_server()
    srv.start()
    a = adapter_for(srv)
    assert a.is_running()
    with pytest.raises(ConfigurationError, match="running"):
        a.prepare_data_directory(clear_wal=False)
    a.stop_server(timeout=30)
    assert not a.is_running()
    assert not srv.is_running()
    a.stop_server(timeout=30)  # no-op
    a.start_server(timeout=30)
    assert srv.is_running()
    log = Path(a._log_path(str(srv.data_dir)))
    assert log.exists()
    assert log.stat().st_uid == srv.data_dir.stat().st_uid
    a.start_server(timeout=30)  # no-op
    srv.sql("SELECT 1")
    a.stop_server(timeout=30)
    log.unlink()


def test_password_never_in_errors_or_repr(pg_server):
    srv = pg_server()
    a = PostgresAdapter(srv.conninfo() + " password=Sup3rS3cret", data_directory=str(srv.data_dir))
    assert "Sup3rS3cret" not in repr(a)
    with pytest.raises(DatabaseError) as info:  # server not running
        a.describe()
    assert "Sup3rS3cret" not in str(info.value)
    assert not a.is_running()


# --------------------------------------------------------------------------- recovery


def _backup_into(src, targets, label="base"):
    """Online backup of ``src`` copied into each prepared server of ``targets``."""
    a = adapter_for(src)
    with a.backup_session() as session:
        session.start(label)
        for t in targets:
            t.copy_data_from(src.data_dir)
        stop = session.stop()
    for t in targets:
        t.configure()  # its own port, socket and archive
    return stop


def _restore(restored, src, stop, target, action=RecoveryAction.PROMOTE, timeline="latest"):
    a = adapter_for(restored)
    junk = restored.wal_dir / "000000010000000000000042"
    junk.write_bytes(b"x")
    removed = a.prepare_data_directory(clear_wal=True)
    assert str(junk) in removed
    assert (restored.wal_dir / "archive_status").is_dir()
    a.write_backup_label(stop.labelfile, stop.spcmapfile)
    a.write_recovery_settings(
        RecoverySettings(
            restore_command=restored.restore_command(src.archive_dir),
            target=target,
            target_timeline=timeline,
            action=action,
        )
    )
    return a


def test_pitr_to_restore_point(pg_server):
    src = pg_server()
    src.start()
    src.sql("CREATE TABLE t (x int)")
    src.sql("INSERT INTO t VALUES (1), (2)")
    restored = pg_server.prepare()
    stop = _backup_into(src, [restored])
    src.sql("INSERT INTO t VALUES (3)")
    src.sql("SELECT pg_create_restore_point('after3')")
    src.sql("INSERT INTO t VALUES (4)")
    src.switch_wal_and_wait_archived()

    # Stale targets that came back with the "snapshot": two targets are FATAL.
    conf = restored.data_dir / "postgresql.conf"
    conf.write_text(conf.read_text() + "recovery_target_xid = '999999'\n")
    auto = restored.data_dir / "postgresql.auto.conf"
    auto.write_text(auto.read_text() + "recovery_target_time = '2001-01-01 00:00:00+00'\n")

    a = _restore(restored, src, stop, RecoveryTarget.name("after3"))
    assert "#pgsnap-disabled# recovery_target_xid = '999999'" in conf.read_text()
    label = restored.data_dir / "backup_label"
    assert label.read_bytes() == stop.labelfile.encode()
    assert stat.S_IMODE(label.stat().st_mode) == 0o600
    assert label.stat().st_uid == restored.data_dir.stat().st_uid
    assert (restored.data_dir / "recovery.signal").exists()
    assert not (restored.data_dir / "tablespace_map").exists()

    a.start_server(timeout=30)
    result = a.wait_recovery(timeout=60)
    assert isinstance(result, RecoveryResult)
    assert result.state == "promoted"
    assert result.reached_target
    assert result.timeline == 2
    assert result.replay_lsn is not None
    assert result.replay_lsn > stop.lsn
    assert any('recovery stopping at restore point "after3"' in ln for ln in result.log_lines)
    assert any("selected new timeline ID: 2" in ln for ln in result.log_lines)
    assert rows(restored, "SELECT x FROM t ORDER BY x") == [1, 2, 3]
    assert a.describe().timeline == 2

    a.clear_recovery_settings()
    a.clear_recovery_settings()  # idempotent
    text = auto.read_text()
    assert "pgsnap" not in text
    assert "recovery_target" not in text
    assert not (restored.data_dir / "recovery.signal").exists()
    # The original archive was not written to by the restored server.
    assert not (src.archive_dir / "00000002.history").exists()


def test_recovery_shutdown_and_failures(pg_server):
    src = pg_server()
    src.start()
    src.sql("CREATE TABLE t (x int)")
    r_shutdown, r_missing, r_early, r_pause = (pg_server.prepare() for _ in range(4))
    stop = _backup_into(src, [r_shutdown, r_missing, r_early, r_pause])
    src.sql("INSERT INTO t VALUES (1)")
    lsn_mid = LSN.parse(src.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    src.sql("INSERT INTO t VALUES (2)")
    src.switch_wal_and_wait_archived()

    # pause at the target: hot standby, read-only, still in recovery
    a = _restore(r_pause, src, stop, RecoveryTarget.lsn(lsn_mid), RecoveryAction.PAUSE)
    a.start_server(timeout=30)
    result = a.wait_recovery(timeout=60)
    assert (result.state, result.reached_target, result.timeline) == ("paused", True, 1)
    assert result.replay_lsn is not None
    assert result.replay_lsn >= lsn_mid
    assert rows(r_pause, "SELECT x FROM t") == [1]
    assert a.describe().in_recovery
    a.stop_server(timeout=30)

    # shutdown at the target: the server exits by itself
    a = _restore(r_shutdown, src, stop, RecoveryTarget.lsn(lsn_mid), RecoveryAction.SHUTDOWN)
    a.start_server(timeout=30)
    result = a.wait_recovery(timeout=60)
    assert result.state == "shutdown"
    assert result.reached_target
    assert result.timeline == 1
    assert any("recovery stopping" in ln for ln in result.log_lines)
    assert not a.is_running()
    assert (r_shutdown.data_dir / "recovery.signal").exists()  # the server leaves it

    # a target the WAL never reaches
    a = _restore(r_missing, src, stop, RecoveryTarget.name("no_such_point"))
    a.start_server(timeout=30)
    with pytest.raises(DatabaseError, match="recovery ended before configured") as info:
        a.wait_recovery(timeout=60)
    assert info.value.hint
    assert "earlier target" in info.value.hint

    # a target before the backup's consistency point
    start_lsn = stop.labelfile.split()[3]  # START WAL LOCATION: X/Y (file ...)
    a = _restore(r_early, src, stop, RecoveryTarget.lsn(start_lsn))
    a.start_server(timeout=30)
    with pytest.raises(DatabaseError) as info:
        a.wait_recovery(timeout=60)
    assert "before consistent recovery point" in str(info.value)


def test_write_recovery_settings_refuses_standby_signal(pg_server):
    srv = pg_server()
    a = adapter_for(srv)
    (srv.data_dir / "standby.signal").write_text("")
    settings = RecoverySettings(restore_command="true", target=RecoveryTarget.latest())
    with pytest.raises(ConfigurationError, match=r"standby\.signal"):
        a.write_recovery_settings(settings)


# --------------------------------------------------------------------------- other versions


@pytest.mark.parametrize("major", [12, 17])
def test_backup_session_other_versions(pg_server, pg_bindir_for, major):
    srv = pg_server(pg_bindir_for(major))
    srv.start()
    a = adapter_for(srv)
    facts = a.describe()
    assert facts.major == major
    assert ("archive_library" in facts.settings) == (major >= 15)
    with a.backup_session() as session:
        start = session.start(f"v{major}")
        stop = session.stop()
    assert stop.labelfile.startswith(f"START WAL LOCATION: {start.lsn} ")
    assert stop.timeline == start.timeline == 1
    a.stop_server(timeout=30)
    assert not a.is_running()


@pytest.mark.parametrize("major", [12, 17])
def test_complete_recovery_other_versions(pg_server, pg_bindir_for, major):
    """12: old backup API; 17: pg_wal/summaries. Complete recovery (latest)."""
    bindir = pg_bindir_for(major)
    src = pg_server(bindir)
    src.start()
    src.sql("CREATE TABLE t (x int)")
    restored = pg_server.prepare(bindir)
    stop = _backup_into(src, [restored])
    src.sql("INSERT INTO t VALUES (7)")
    src.switch_wal_and_wait_archived()
    a = _restore(restored, src, stop, RecoveryTarget.latest(), RecoveryAction.PROMOTE)
    a.start_server(timeout=30)
    result = a.wait_recovery(timeout=60)
    assert (result.state, result.reached_target, result.timeline) == ("promoted", True, 2)
    assert rows(restored, "SELECT x FROM t") == [7]
    a.clear_recovery_settings()


def test_default_log_file_location(pg_server):
    srv = pg_server()
    a = adapter_for(srv)
    log = Path(a._log_path(str(srv.data_dir)))
    a.start_server(timeout=30)
    try:
        assert log.stat().st_size > 0
        assert not log.is_relative_to(srv.data_dir)
        assert oct(log.parent.stat().st_mode & 0o777) == "0o700"
    finally:
        a.stop_server(timeout=30)
        log.unlink()


def test_a_promotion_between_two_state_queries_is_success(pg_server):
    """Issue 7 #1: the server promotes between pg_is_in_recovery() and the pause-state
    query, which then fails with SQLSTATE 55000 ("recovery is not in progress"). That
    interleaving is injected here; the answer must be "promoted", never a failure."""
    server = pg_server()
    server.start()
    a = adapter_for(server)
    real_one = a._one
    script = ["in recovery", "promotes now"]

    def interleaved(conn, sql, params=()):
        if sql.startswith("SELECT pg_is_in_recovery()") and script and script[0] == "in recovery":
            script.pop(0)
            return (True, None, None)  # as it was a moment ago (state, replayed, when)
        if "pause" in sql and script and script[0] == "promotes now":
            script.pop(0)
            real_one(conn, "SELECT pg_get_wal_replay_pause_state()")  # the real 55000
        return real_one(conn, sql, params)

    a._one = interleaved  # type: ignore[method-assign]
    outcome = a.wait_recovery(timeout=10)
    assert script == []  # the interleaving happened
    assert outcome.state == "promoted"
    assert outcome.timeline == 1


def test_the_default_server_log_survives_a_restore_and_failures_say_the_server_stopped(
    pg_server,
):
    """Issue 7 #9: the default log was in the data directory, so undoing a failed
    recovery erased the lines that explained it; the message did not say the server
    had stopped."""
    server = pg_server()
    a = PostgresAdapter(
        server.conninfo(), data_directory=str(server.data_dir), bindir=str(server.bindir)
    )
    log_path = a._log_path(str(server.data_dir))
    assert not log_path.startswith(str(server.data_dir))
    assert log_path.startswith(f"/var/tmp/pgsnap-{server.os_user}/")
    # A recovery that cannot find its WAL: the server exits, the log stays.
    a.write_backup_label(
        "START WAL LOCATION: 0/9000028 (file 000000010000000000000009)\n"
        "CHECKPOINT LOCATION: 0/9000060\nBACKUP METHOD: streamed\n"
        "BACKUP FROM: primary\nSTART TIME: 2026-11-30 00:00:00 UTC\nLABEL: x\n"
        "START TIMELINE: 1\n",
        "",
    )
    a.write_recovery_settings(
        RecoverySettings(restore_command="false", target=RecoveryTarget.latest())
    )
    try:
        a.start_server()
        with pytest.raises(DatabaseError) as info:
            a.wait_recovery(timeout=30)
        assert "the server has stopped" in str(info.value)
        assert log_path in str(info.value)
        for entry in server.data_dir.iterdir():  # the data volume is rewritten...
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        assert "FATAL" in Path(log_path).read_text()  # ...and the log is still there
    finally:
        Path(log_path).unlink(missing_ok=True)


def test_a_recovered_server_pgsnap_cannot_reach_is_said_not_waited_for(
    pg_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose log says it recovered and accepts connections, but which pgsnap
    cannot connect to (here: the adapter connects to another port), is reported as
    such, naming where pgsnap connects, instead of waiting for the whole timeout."""
    import pgsnap.adapters.postgres as module

    monkeypatch.setattr(module, "_UNREACHABLE_AFTER_READY", 1.0)
    src = pg_server()
    src.start()
    src.sql("CREATE TABLE t (x int)")
    restored = pg_server.prepare()
    stop = _backup_into(src, [restored])
    src.switch_wal_and_wait_archived()
    a = _restore(restored, src, stop, RecoveryTarget.latest(), RecoveryAction.PROMOTE)
    a.start_server(timeout=30)
    wrong = PostgresAdapter(
        f"host={restored.socket_dir} port={restored.port + 1} user=postgres dbname=postgres",
        data_directory=str(restored.data_dir),
        bindir=str(restored.bindir),
    )
    wrong._follower = a._follower  # the log followed since the start
    t0 = time.monotonic()
    with pytest.raises(DatabaseError, match="cannot connect to it") as info:
        wrong.wait_recovery(timeout=120)
    assert time.monotonic() - t0 < 30
    assert f"port={restored.port + 1}" in info.value.message
    assert "listen_addresses" in (info.value.hint or "")
    assert a.wait_recovery(timeout=60).state == "promoted"  # the right port: fine
