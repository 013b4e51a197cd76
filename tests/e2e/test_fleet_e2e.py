"""Issue 25's proof: ten real PostgreSQL clusters, two backup servers (two fleet
configurations, separate journal directories, one catalog database), each running
`pgsnap backup --all` at the same time: every cluster is backed up exactly once, and
no run of one server overlaps a run of the other on one cluster (their journals'
times). Then one server is killed with SIGKILL mid-run (every process of it): its
sessions end, so its locks go with them, and the other server backs every cluster
up, reporting the dead holders; the killed server's interrupted runs are undone by
`resume`. Last, two clusters are recovered to a time through the second server, rows
checked."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pgsnap.catalog.postgres import migrate
from pgsnap.testing.pgserver import PgServer

from .conftest import assert_server_not_in_backup_mode

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

N = 10


def _pgsnap(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgsnap", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        **kw,
    )


def _cluster_file(server: PgServer, name: str, work: Path, catalog: str, state: Path) -> str:
    return f"""\
[database]
conninfo = "{server.conninfo()}"
data_directory = "{server.data_dir}"
bindir = "{server.bindir}"
os_user = "{server.os_user}"
log_file = "{server.log_file}"

[storage]
backend = "mock"
[storage.options]
state_file = "{work / name / "mock.json"}"
root = "{work / name / "snapshots"}"

[archive]
path = "{server.archive_dir}"

[catalog]
path = "{state / name}"
conninfo = "{catalog}"

[[volume]]
id = "vol-data"
name = "pgdata"
role = "data"
mount_point = "{server.data_dir}"

[[volume]]
id = "vol-wal"
name = "pgwal"
role = "wal"
mount_point = "{server.wal_dir}"

[[volume]]
id = "vol-archive"
name = "archive"
role = "archive"
mount_point = "{server.archive_dir}"
"""


def _intervals(state: Path) -> dict[str, list[tuple[dt.datetime, dt.datetime]]]:
    """Each cluster's runs on one backup server: (journal opened, last record)."""
    out: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {}
    for journal in state.glob("*/journal/*.journal"):
        lines = [json.loads(x) for x in journal.read_text().splitlines() if x.strip()]
        start = dt.datetime.fromisoformat(lines[0]["started_at"])
        end = dt.datetime.fromisoformat(lines[-1].get("at", lines[0]["started_at"]))
        out.setdefault(journal.parent.parent.name, []).append((start, end))
    return out


def test_two_backup_servers_one_catalog_ten_clusters(pg_server: Any, tmp_path: Path) -> None:
    catalog_server: PgServer = pg_server(archive=False)
    catalog_server.start()
    catalog = catalog_server.conninfo()
    migrate(catalog)
    servers: dict[str, PgServer] = {}
    for i in range(N):
        server: PgServer = pg_server(
            wal_segsize_mb=1,
            separate_wal_dir=True,
            archive=True,
            settings={"archive_timeout": "60s", "autovacuum": False},
        )
        server.start()
        server.sql("CREATE TABLE t (batch int, n int)")
        server.sql("INSERT INTO t VALUES (1, 1)")
        servers[f"c{i:02d}"] = server
    work = tmp_path / "storage"
    fleets = {}
    for who in ("a", "b"):
        directory = tmp_path / f"fleet-{who}"
        directory.mkdir()
        state = tmp_path / f"server-{who}"
        (directory / "defaults.toml").write_text("[fleet]\nparallel = 3\n")
        for name, server in servers.items():
            (work / name).mkdir(parents=True, exist_ok=True)
            (directory / f"{name}.toml").write_text(
                _cluster_file(server, name, work, catalog, state)
            )
        fleets[who] = directory

    def backups() -> dict[str, list[str]]:
        rows = catalog_server.sql(
            "SELECT c.name, b.state FROM pgsnap.backups b JOIN pgsnap.clusters c"
            " ON c.id = b.cluster_id ORDER BY c.name, b.start_time"
        )
        out: dict[str, list[str]] = {name: [] for name in servers}
        for name, state in rows:
            out[name].append(state)
        return out

    # Both servers at once, as two schedulers would start them.
    command = ["--all", "--if-older-than", "1h", "--json"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pgsnap", "backup", "-c", str(fleets[w]), *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in ("a", "b")
    ]
    results = []
    try:
        for proc in procs:
            results.append((proc.communicate(timeout=600), proc.returncode))
    finally:
        for proc in procs:  # a failure here leaves no process or pipe behind
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    summaries = []
    for (out, err), code in results:
        assert code == 0, (out, err)
        summaries.append(json.loads(out))
    assert backups() == {name: ["done"] for name in servers}  # exactly once each
    for name in servers:
        took = [
            s["clusters"][i]["output"]
            for s in summaries
            for i, c in enumerate(s["clusters"])
            if c["cluster"] == name and isinstance(c["output"], dict) and "id" in c["output"]
        ]
        assert len(took) == 1, (name, summaries)
    a_runs, b_runs = _intervals(tmp_path / "server-a"), _intervals(tmp_path / "server-b")
    for name in servers:
        for a_start, a_end in a_runs.get(name, []):
            for b_start, b_end in b_runs.get(name, []):
                assert a_end < b_start or b_end < a_start, f"{name}: runs overlap"

    # Server a is killed (every process of it) while its runs hold clusters.
    killed = subprocess.Popen(
        [sys.executable, "-m", "pgsnap", "backup", "-c", str(fleets["a"]), "--all",
         "--parallel", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not catalog_server.sql("SELECT count(*) FROM pgsnap.lock_holders")[0][0]:
        assert time.monotonic() < deadline and killed.poll() is None, "server a never locked"
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate(timeout=60)
    before = backups()
    # Its sessions are gone with its processes: server b takes every cluster.
    deadline = time.monotonic() + 30
    while catalog_server.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsnap cluster lock'"
    )[0][0]:
        assert time.monotonic() < deadline, "server a's lock sessions outlived it"
        time.sleep(0.1)
    second = _pgsnap("backup", "-c", str(fleets["b"]), "--all", "--json")
    assert second.returncode == 0, second.stderr
    assert {c["status"] for c in json.loads(second.stdout)["clusters"]} == {"ok"}
    assert catalog_server.sql("SELECT count(*) FROM pgsnap.lock_holders") == [(0,)]
    after = backups()
    for name in servers:  # one more DONE backup of every cluster, by server b
        assert after[name].count("done") == before[name].count("done") + 1, (name, after)
    # Server a, back, finishes what it left: its interrupted backups are undone.
    resumed = _pgsnap("resume", "-c", str(fleets["a"]), "--all", "--yes")
    assert resumed.returncode in (0, 1), resumed.stderr
    for name, states in backups().items():
        assert "running" not in states, (name, states)
        assert states.count("done") == after[name].count("done"), (name, states)
    for server in servers.values():  # nobody is left in backup mode anywhere
        assert_server_not_in_backup_mode(server)

    # Two clusters recovered to a time through server b, rows checked.
    for name in ("c03", "c07"):
        server = servers[name]
        server.sql("INSERT INTO t VALUES (2, 1)")
        time.sleep(0.05)
        target = server.sql("SELECT clock_timestamp()")[0][0]
        time.sleep(0.05)
        server.sql("INSERT INTO t VALUES (3, 1)")
        server.switch_wal_and_wait_archived()
        server.pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(server.data_dir)
        server.data_dir.mkdir(mode=0o700)
        shutil.chown(server.data_dir, server.os_user, server.os_user)
        done = _pgsnap(
            "recover", "-c", str(fleets["b"]), "--cluster", name, "--yes",
            "--time", target.isoformat(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert server.sql("SELECT batch FROM t ORDER BY 1") == [(1,), (2,)]
