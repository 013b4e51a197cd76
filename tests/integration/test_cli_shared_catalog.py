"""A catalog in PostgreSQL through the command (issue 25): migrated (never implicitly),
a directory catalog imported with nothing lost, backups and a recovery to a time
recorded there (rows checked), the fleet listed; and a run whose lock's session is
lost stops at the next step, undoing nothing, and resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pgsnap
from pgsnap.catalog.postgres import PostgresCatalog
from pgsnap.errors import ExecutionError, LockLostError
from pgsnap.executor import EventKind
from pgsnap.model import BackupState
from pgsnap.testing.pgserver import PgServer

from .conftest import CliEnv, backed_up

pytestmark = pytest.mark.postgres


def shared(env: CliEnv, catalog_server: PgServer, cluster: str = "db1") -> Path:
    """The configuration with its records in the catalog server's database."""
    text = env.config.read_text().replace(
        f'[catalog]\npath = "{env.work / "catalog"}"\njournal = "{env.work / "journal"}"\n',
        f'[catalog]\npath = "{env.work / "state"}"\n'
        f'conninfo = "{catalog_server.conninfo()}"\ncluster = "{cluster}"\n',
    )
    assert "conninfo" in text.split("[catalog]", 1)[1]
    path = env.work / "shared.toml"
    path.write_text(text)
    return path


@pytest.fixture
def catalog_server(pg_server: Any) -> PgServer:
    server: PgServer = pg_server(archive=False)
    server.start()
    return server


def test_a_shared_catalog_is_migrated_imported_and_recovered_from(
    cli_env: CliEnv, catalog_server: PgServer
) -> None:
    env = cli_env
    first = backed_up(env)  # batch 1, in the directory catalog
    config = shared(env, catalog_server)

    code, _out, err = env.run("catalog fleet", config=config)
    assert code == 1 and "has no pgsnap schema" in err and "pgsnap catalog migrate" in err
    code, out, err = env.run("catalog migrate", "--dry-run", config=config)
    assert code == 0, err
    assert out.startswith("migration 1 to apply: ")
    assert catalog_server.sql("SELECT to_regnamespace('pgsnap')") == [(None,)]  # dry run
    code, out, err = env.run("catalog migrate", config=config)
    assert code == 0 and out.startswith("migration 1 applied: "), err
    code, out, _ = env.run("catalog migrate", config=config)
    assert "nothing to do" in out

    code, out, err = env.run("catalog import", str(env.work / "catalog"), config=config)
    assert code == 0, err
    assert "1 backups, 0 safety snapshots, 0 clones, 0 drills" in out
    listed = json.loads(env.run("list", "--json", config=config)[1])
    assert listed == json.loads(env.run("list", "--json")[1])  # nothing lost

    env.write(2)
    code, _out, err = env.run("backup", config=config)
    assert code == 0, err
    second = json.loads(env.run("list", "--json", config=config)[1])[-1]
    assert second["state"] == "done" and second["id"] != first["id"]
    (row,) = json.loads(env.run("catalog fleet", "--json", config=config)[1])
    assert (row["cluster"], row["newest_backup"], row["last_drill"]) == ("db1", second["id"], None)
    code, out, _ = env.run("catalog fleet", "--older-than", "1h", config=config)
    assert out.strip() == "every cluster is recent enough"
    # What a retention policy would expire, fleet-wide (one cluster here).
    code, out, err = env.run("catalog expirable", "--json", "--redundancy", "1", config=config)
    assert code == 0, err
    (gone,) = json.loads(out)
    assert (gone["cluster"], gone["backup"], gone["action"]) == ("db1", first["id"], "backup")
    code, out, _ = env.run("catalog expirable", "--redundancy", "2", config=config)
    assert out.strip() == "redundancy 2: nothing would go"
    code, _out, err = env.run("catalog expirable", config=config)
    assert code == 2 and "keeps nothing" in err

    env.write(3)
    target = env.now()
    env.write(4)
    env.server.switch_wal_and_wait_archived()
    env.crash_and_lose(env.server.data_dir)
    code, out, err = env.run("recover", "--yes", "--time", target.isoformat(), config=config)
    assert code == 0, err
    assert env.batches() == {1: 3, 2: 3, 3: 3}
    # The recovery's safety snapshot is recorded in the shared catalog.
    safety = catalog_server.sql("SELECT count(*) FROM pgsnap.named_records WHERE kind = 'safety'")
    assert safety == [(1,)]
    assert catalog_server.sql("SELECT count(*) FROM pgsnap.lock_holders") == [(0,)]


def test_a_run_that_loses_its_lock_stops_at_the_next_step_and_resumes(
    cli_env: CliEnv, catalog_server: PgServer
) -> None:
    env = cli_env
    env.write(1)
    config = shared(env, catalog_server)
    assert env.run("catalog migrate", config=config)[0] == 0
    cluster = pgsnap.Cluster.from_config(config)
    assert isinstance(cluster.catalog, PostgresCatalog)
    plan = cluster.plan_backup("lock lost")
    seen: list[str] = []

    def lose_the_lock(event: Any) -> None:
        seen.append(f"{event.kind.value} {event.step_id}")
        if event.kind is EventKind.FINISHED and event.step_id == "snapshot":
            killed = catalog_server.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'pgsnap cluster lock'"
            )
            assert killed == [(True,)]

    with pytest.raises(LockLostError) as info:
        cluster.execute(plan, on_event=lose_the_lock)
    assert "lost the cluster lock" in str(info.value) and "pgsnap resume" in str(info.value)
    stopped_at = info.value.step_id
    assert "finished snapshot" in seen and f"started {stopped_at}" not in seen
    assert not any(s.startswith("compensating") for s in seen)  # nothing undone
    assert [p.id for p in cluster.interrupted()] == [plan.id]  # resumable
    # A backup stopped between its snapshot and backup-stop cannot go on in another
    # run (backup mode belongs to the session that began it): resuming undoes it, and
    # the dead session's holder row is found and removed by the run that locks next.
    with pytest.raises(ExecutionError, match="undone: snapshot, record-start, backup-start"):
        cluster.execute(plan)
    assert cluster.backup_of(plan).state is BackupState.FAILED
    assert cluster.interrupted() == ()
    record = cluster.backup("after the lock came back")
    assert record.state is BackupState.DONE
    assert catalog_server.sql("SELECT count(*) FROM pgsnap.lock_holders") == [(0,)]
