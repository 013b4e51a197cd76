"""A fleet through the command (issue 25): three real PostgreSQL clusters in a
directory fleet, `backup --all` (each in a process of its own, side by side), a
second run inside the interval that takes nothing, a cluster another run holds
skipped, a broken cluster failed with the exit code saying so, one cluster by
name, and a fleet without a name refused."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import pgsnap
from pgsnap.cli import main
from pgsnap.fleet import load_fleet
from pgsnap.locks import LockHolder
from pgsnap.testing.pgserver import PgServer

from .conftest import write_config

pytestmark = pytest.mark.postgres

NAMES = ("db1", "db2", "db3")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def fleet_dir(pg_server: Any, tmp_path: Path) -> tuple[Path, dict[str, PgServer]]:
    servers: dict[str, PgServer] = {}
    directory = tmp_path / "fleet"
    directory.mkdir()
    for name in NAMES:
        server: PgServer = pg_server(
            wal_segsize_mb=1,
            separate_wal_dir=True,
            archive=True,
            settings={"archive_timeout": "60s", "autovacuum": False},
        )
        server.start()
        server.sql("CREATE TABLE t (n int)")
        server.sql("INSERT INTO t VALUES (1)")
        work = tmp_path / name
        work.mkdir()
        write_config(server, work, name="pgsnap.toml").rename(directory / f"{name}.toml")
        servers[name] = server
    (directory / "defaults.toml").write_text("[fleet]\nparallel = 2\n\n[timeouts]\nwal = 60\n")
    return directory, servers


def test_backup_all_runs_each_cluster_once_skips_what_is_busy_and_fails_loudly(
    fleet_dir: tuple[Path, dict[str, PgServer]], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, servers = fleet_dir
    config = str(directory)

    code, out, err = run(capsys, "list", "-c", config)
    assert code == 2 and "is a fleet of 3 clusters" in err and "--cluster NAME" in err

    code, out, err = run(capsys, "backup", "-c", config, "--all", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["ok"] is True
    assert [c["cluster"] for c in summary["clusters"]] == list(NAMES)
    assert {c["status"] for c in summary["clusters"]} == {"ok"}
    ids = {c["cluster"]: c["output"]["id"] for c in summary["clusters"]}
    for name in NAMES:
        code, out, err = run(capsys, "list", "-c", config, "--cluster", name, "--json")
        assert code == 0, err
        assert [b["id"] for b in json.loads(out)] == [ids[name]]

    # The scheduler comes again within the interval: nothing is taken.
    code, out, err = run(capsys, "backup", "-c", config, "--all", "--if-older-than", "1h")
    assert code == 0, err
    assert out.count("no backup taken: backup ") == 3
    assert out.rstrip().endswith("3 clusters: 3 ok")

    # The cron recipe's command, as cron runs it (the installed `pgsnap`, a process).
    from tests.unit.test_recipes import cron_command

    command = cron_command()
    command[0] = shutil.which("pgsnap") or command[0]
    command[command.index("-c") + 1] = config
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("3 clusters: 3 ok")

    # db2 is held by another run (a recovery, say): skipped and said so, not a failure.
    member = load_fleet(directory).member("db2")
    held = pgsnap.Cluster.from_config(member.conf, base=member.base)
    lock = held.executor().lock
    assert lock is not None
    with lock.acquire(LockHolder.for_run("recovery", "r" * 64)):
        code, out, err = run(capsys, "backup", "-c", config, "--all")
    assert code == 0, err
    lines = dict(line.split(None, 1) for line in out.splitlines()[:3])
    assert lines["db1"].startswith("ok") and lines["db3"].startswith("ok")
    assert lines["db2"].startswith("skipped") and "recovery plan rrrrrrrrrrrr" in lines["db2"]
    assert "db2: skipped" in err  # as each ends

    # Retention over the fleet, twice (two schedulers, or one that ran again): the
    # first deletes all but the newest backup of each cluster, the second nothing.
    code, out, err = run(capsys, "expire", "-c", config, "--all", "--redundancy", "1", "--json")
    assert code == 0, err
    deleted = {
        c["cluster"]: c["output"]["summary"]["backups deleted"] for c in json.loads(out)["clusters"]
    }
    assert deleted == {"db1": "1", "db2": "0", "db3": "1"}
    code, out, err = run(capsys, "expire", "-c", config, "--all", "--redundancy", "1", "--json")
    assert code == 0, err
    again = {c["cluster"]: c["output"] for c in json.loads(out)["clusters"]}
    assert {name: plan["steps"] for name, plan in again.items()} == {n: [] for n in NAMES}
    for name in NAMES:
        code, out, _ = run(capsys, "list", "-c", config, "--cluster", name, "--json")
        assert len(json.loads(out)) == 1

    # db3's server is down: that cluster fails, the others are backed up, exit 1.
    servers["db3"].stop()
    code, out, err = run(capsys, "backup", "-c", config, "--all", "--json")
    assert code == 1
    statuses = {c["cluster"]: c["status"] for c in json.loads(out)["clusters"]}
    assert statuses == {"db1": "ok", "db2": "ok", "db3": "failed"}
    for name, count in (("db1", 2), ("db2", 2)):
        code, out, _ = run(capsys, "list", "-c", config, "--cluster", name, "--json")
        assert len(json.loads(out)) == count
