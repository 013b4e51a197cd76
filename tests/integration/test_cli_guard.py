"""Issue 19 through the ``pgsnap`` command: runs that cannot be raced or stopped half way.

Real PostgreSQL, the mock backend in a state file, each command a real
process where what is tested is two processes at once. The mock's
``hold`` option keeps one step waiting until the test releases it, so the
second command starts while the first holds the cluster, however loaded
the machine; nothing else is faked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgsnap.locks import FileClusterLock, LockHolder

from .conftest import CliEnv, backed_up

pytestmark = pytest.mark.postgres

_SPAWNED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _reap_spawned() -> Iterator[None]:
    """Every process a test spawned is ended and its pipes closed, even when the test
    failed half way (an unread pipe found by the garbage collector later would fail
    whichever test is running then with a ResourceWarning)."""
    yield
    while _SPAWNED:
        proc = _SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def slow(env: CliEnv, **latency: float) -> Path:
    """A configuration whose mock takes ``latency[method]`` seconds per call."""
    text = env.config.read_text()
    table = ", ".join(f"{k} = {v}" for k, v in latency.items())
    text = text.replace("[storage.options]\n", f"[storage.options]\nlatency = {{ {table} }}\n")
    path = env.work / "slow.toml"
    path.write_text(text)
    return path


def held(env: CliEnv, method: str) -> tuple[Path, Path]:
    """A configuration whose mock holds every ``method`` call until the second
    path exists (the test creates it to let the step finish)."""
    release = env.work / f"release-{method}"
    release.unlink(missing_ok=True)
    text = env.config.read_text()
    text = text.replace(
        "[storage.options]\n", f'[storage.options]\nhold = {{ {method} = "{release}" }}\n'
    )
    path = env.work / f"held-{method}.toml"
    path.write_text(text)
    return path, release


def spawn(config: Path, *argv: str) -> subprocess.Popen[str]:
    """``pgsnap <argv> -c <config>`` in its own process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgsnap.cli", argv[0], "-c", str(config), *argv[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    _SPAWNED.append(proc)
    return proc


def lock_dir(env: CliEnv) -> Path:
    return env.work / "catalog" / ".cluster-lock"


def wait_for_holder(env: CliEnv, proc: subprocess.Popen[str], kind: str) -> LockHolder:
    """Until ``proc`` holds the cluster lock for a ``kind`` plan (it may share it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        held = [h for h in FileClusterLock(lock_dir(env)).holders() if h.pid == proc.pid]
        if held and held[0].kind == kind:
            return held[0]
        if proc.poll() is not None:
            _out, err = proc.communicate()
            raise AssertionError(f"{kind} ended ({proc.returncode}) before holding: {err}")
        time.sleep(0.02)
    raise AssertionError("the first run never took the cluster lock")


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def lost_after_two_batches(env: CliEnv) -> None:
    """Batch 1, a backup, batch 2 archived; the server crashes and its data is gone."""
    backed_up(env)
    env.write(2)
    env.server.switch_wal_and_wait_archived()
    env.crash_and_lose(env.server.data_dir)


def test_a_second_recovery_fails_at_once_naming_the_first(cli_env: CliEnv) -> None:
    """Issue 19: `pgsnap recover --yes & sleep 0.5; pgsnap recover --yes` left one run
    PANICking after the point of no return and the data directory empty."""
    env = cli_env
    lost_after_two_batches(env)
    config, release = held(env, "restore_volume")
    first = spawn(config, "recover", "--yes")
    holder = wait_for_holder(env, first, "recovery")
    code, out, err = env.run("recover", "--yes", config=config)
    assert first.poll() is None  # at once: it never waits for the first
    assert code == 6, err
    assert "busy" in err and f"pid {holder.pid}" in err and "recovery plan" in err
    assert "Recovery plan" not in out  # refused before planning: nothing shown, nothing run
    release.touch()
    code, out, err = finish(first)
    assert code == 0, err
    assert env.batches() == {1: 3, 2: 3}
    assert env.timeline() == 2
    assert FileClusterLock(lock_dir(env)).holders() == ()


def test_two_processes_racing_to_recover_never_both_run(cli_env: CliEnv) -> None:
    """Started together: one recovers, the other is refused (exit 6) or, if it came
    second, recovers the recovered cluster; never a failure, never an empty cluster."""
    env = cli_env
    lost_after_two_batches(env)
    procs = [spawn(env.config, "recover", "--yes") for _ in range(2)]
    results = [finish(p) for p in procs]
    codes = sorted(code for code, _out, _err in results)
    assert codes in ([0, 6], [0, 0]), results
    assert env.batches() == {1: 3, 2: 3}


def test_backups_run_side_by_side_but_not_beside_a_recovery(cli_env: CliEnv) -> None:
    """The lock table: two backups may share the cluster (PostgreSQL allows concurrent
    non-exclusive backups); a recovery may not run beside a backup, nor a backup beside
    a recovery, nor an expiry beside either."""
    env = cli_env
    env.write(1)
    config, release = held(env, "create_snapshot_group")
    first = spawn(config, "backup", "--label", "one")
    wait_for_holder(env, first, "backup")
    code, _out, err = env.run("recover", "--yes")
    assert code == 6 and "backup plan" in err, err
    code, _out, err = env.run("expire", "--redundancy", "1")
    assert code == 6, err
    code, _out, err = env.run("backup", "--label", "two")  # beside the first one
    assert code == 0, err
    assert first.poll() is None  # the first one was still running all along
    release.touch()
    assert finish(first)[0] == 0
    done = [b for b in env.run_json("list") if b["state"] == "done"]
    assert sorted(b["label"] for b in done) == ["one", "two"]

    env.crash_and_lose(env.server.data_dir)
    config, release = held(env, "restore_volume")
    recovery = spawn(config, "recover", "--yes")
    wait_for_holder(env, recovery, "recovery")
    code, _out, err = env.run("backup", config=config)
    assert code == 6 and "recovery plan" in err, err
    assert recovery.poll() is None
    release.touch()
    assert finish(recovery)[0] == 0
    assert env.batches() == {1: 3}


def test_a_killed_recovery_is_resumed_before_anything_else_runs(cli_env: CliEnv) -> None:
    """A recovery SIGKILLed while it holds the cluster: the kernel frees the lock; the
    next recovery is refused (a new run over an interrupted one could undo it or be
    undone by it) naming the journal; `pgsnap resume --yes` finishes it and reports the
    dead holder."""
    env = cli_env
    lost_after_two_batches(env)
    config = slow(env, restore_volume=3)
    first = spawn(config, "recover", "--yes")
    holder = wait_for_holder(env, first, "recovery")
    time.sleep(0.5)  # inside the restore
    first.send_signal(signal.SIGKILL)
    finish(first)
    code, _out, err = env.run("recover", "--yes")
    assert code == 6, err
    assert "was interrupted" in err and holder.journal is not None and holder.journal in err
    assert "pgsnap resume --yes" in err
    code, out, err = finish(spawn(env.config, "resume", "--yes"))  # its own process: logs
    assert code == 0, err
    assert f"pid {holder.pid}" in err and "died without releasing" in err
    assert "recovery plan" in out and "finished" in out
    assert env.batches() == {1: 3, 2: 3}


def test_sigterm_during_a_backup_undoes_it_as_ctrl_c_does(cli_env: CliEnv) -> None:
    """Issue 19: SIGTERM (and SIGHUP) during a backup exited 143 with no undo and left
    the record STARTED until `pgsnap resume`."""
    env = cli_env
    env.write(1)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        config = slow(env, create_snapshot_group=5)
        proc = spawn(config, "backup", "--label", sig.name)
        wait_for_holder(env, proc, "backup")
        time.sleep(0.5)  # backup mode began; the snapshot is being taken
        proc.send_signal(sig)
        code, _out, err = finish(proc)
        assert code == 128 + sig, err
        assert f"interrupted ({sig.name})" in err
    records = env.run_json("list")
    assert [r["state"] for r in records] == ["failed", "failed"]
    assert all("interrupted" in (r["failure_reason"] or "") for r in records)
    assert not env.server.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsnap backup'"
    )[0][0]
    assert env.run("resume")[0] == 0  # nothing left to resume
    assert env.snapshot_ids() == set()


def test_a_label_is_one_printable_line_and_pin_until_takes_durations(
    cli_env: CliEnv,
) -> None:
    """Issue 19: a label with a newline was accepted and printed raw, a 2,000-character
    one echoed whole; `pgsnap pin --until tomorrow` printed a traceback."""
    env = cli_env
    code, _out, err = env.run("backup", "--label", "two\nlines")
    assert code == 2 and "line break" in err and "two\\nlines" in err, err
    code, _out, err = env.run("backup", "--label", "x" * 2000)
    assert code == 2 and "2000 bytes" in err and len(err) < 500, err
    record = backed_up(env)
    code, _out, err = env.run("pin", record["id"], "--reason", "r", "--until", "tomorrow")
    assert code == 2 and "neither a time nor a duration" in err, err
    assert "Traceback" not in err
    code, _out, err = env.run("pin", record["id"], "--reason", "audit", "--until", "30d")
    assert code == 0, err
    (listed,) = env.run_json("list")
    assert listed["pin"]["reason"] == "audit" and listed["pin"]["until"] is not None


def test_a_password_file_others_can_read_is_refused(cli_env: CliEnv) -> None:
    env = cli_env
    secret = env.work / "pw"
    secret.write_text("not-a-real-password\n")
    secret.chmod(0o644)
    text = env.config.read_text().replace(
        "[database]\n", f'[database]\npassword_file = "{secret}"\n'
    )
    config = env.work / "pw.toml"
    config.write_text(text)
    code, out, err = env.run("check", config=config)
    assert code == 2 and "can be read by other users (mode 0644)" in err and "chmod 600" in err
    assert "not-a-real-password" not in out + err
    secret.chmod(0o600)
    assert env.run("check", config=config)[0] == 0


def test_safety_snapshots_are_listed_kept_and_deleted_by_name(cli_env: CliEnv) -> None:
    """Issue 19: every recovery left a safety snapshot group that `check` then warned
    about as an orphan, with no documented way to remove it."""
    env = cli_env
    lost_after_two_batches(env)
    assert env.run("recover", "--yes")[0] == 0
    (safety,) = env.run_json("safety list")
    assert safety["name"].startswith("s-") and safety["target"] == "latest"
    assert set(safety["snapshots"]) == {"vol-data"}
    code, _out, err = env.run("check")
    assert code == 0, err
    report = json.loads(env.run("check", "--json")[1])
    assert not [f for f in report["findings"] if f.endswith("[orphan_snapshots]")]
    code, _out, err = env.run("safety delete", safety["name"])
    assert code == 0, err
    assert env.run_json("safety list") == []
    assert set(safety["snapshots"].values()).isdisjoint(env.snapshot_ids())
    code, _out, err = env.run("safety delete", safety["name"])
    assert code == 3 and "no safety snapshot" in err and "pgsnap safety list" in err


def test_check_tells_the_truth(cli_env: CliEnv, tmp_path: Path) -> None:
    """Issue 19: `check` said OK where a backup would fail (a read-only catalog), and
    'the server is not running' for a wrong port or a wrong password."""
    env = cli_env
    backed_up(env)
    assert env.run("check")[0] == 0
    # A wrong port: the server runs, pgsnap cannot reach it.
    port = env.server.port
    wrong = env.work / "port.toml"
    wrong.write_text(env.config.read_text().replace(f"port={port}", f"port={port + 1}"))
    code, out, _err = env.run("check", config=wrong)
    assert code == 4
    assert "not running" not in out
    assert f"listens on port {port}" in out and "check [database] conninfo" in out
    # A wrong password: the server runs and refuses pgsnap.
    env.server.sql("ALTER ROLE postgres PASSWORD 'check-secret'")
    hba = env.server.data_dir / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text("local all all scram-sha-256\n")
    env.server.sql("SELECT pg_reload_conf()")
    try:
        code, out, _err = env.run("check")
    finally:
        hba.write_text(original)
        with env.server.connect(password="check-secret") as conn:
            conn.execute("SELECT pg_reload_conf()")
    assert code == 4
    assert "not running" not in out and "refuses pgsnap" in out and "password" in out
    # A catalog that cannot be written (a read-only bind of it): a backup would fail.
    catalog = env.work / "catalog"
    subprocess.run(["mount", "--bind", str(catalog), str(catalog)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(catalog)], check=True)
        code, out, _err = env.run("check")
    finally:
        subprocess.run(["umount", str(catalog)], check=True)
    assert code == 4 and "[not_writable]" in out and "Read-only file system" in out
    assert env.run("check")[0] == 0


def test_check_and_backup_agree_on_an_archive_command_that_copies_nothing(
    cli_env: CliEnv,
) -> None:
    """Issue 19: `check` found archive_mismatch (archive_command `true`), but `pgsnap
    backup` snapshotted, waited, undid and recorded FAILED."""
    env = cli_env
    env.server.sql("ALTER SYSTEM SET archive_command = 'true'")
    env.server.sql("SELECT pg_reload_conf()")
    env.write(1)
    name = env.server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
    env.server.sql("SELECT pg_switch_wal()")
    deadline = time.monotonic() + 30
    while env.server.sql("SELECT last_archived_wal FROM pg_stat_archiver")[0][0] != name:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    code, out, _err = env.run("check")
    assert code == 4 and "[archive_mismatch]" in out
    code, _out, err = env.run("backup")
    assert code == 3 and "[archive_mismatch]" in err, err
    assert env.run_json("list") == []  # refused before anything was taken
    assert env.snapshot_ids() == set()
