"""``pgsnap clone`` and ``pgsnap drill`` against a real PostgreSQL (issue 22)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import CliEnv, backed_up, finding_codes

pytestmark = pytest.mark.postgres


def test_clone_create_list_destroy_and_drill(cli_env: CliEnv, tmp_path: Path) -> None:
    env = cli_env
    record = backed_up(env)
    env.write(2)
    env.server.switch_wal_and_wait_archived()
    assert finding_codes(env.run_json("check")).get("backup_not_drilled") == "warning"

    code, out, err = env.run("clone create", "dev", "--immediate")
    assert code == 0, err
    assert "clone dev is ready: psql -h " in out
    (listed,) = env.run_json("clone list")
    assert listed["name"] == "dev"
    assert listed["state"] == "ready"
    assert listed["backup_id"] == record["id"]
    assert listed["size_bytes"] is not None and listed["size_bytes"] > 0
    # A second clone of the same name is refused before anything is made.
    code, _out, err = env.run("clone create", "dev")
    assert code != 0
    assert "a clone named dev exists already" in err

    code, out, err = env.run("clone destroy", "dev")
    assert code == 0, err
    assert env.run_json("clone list") == []
    assert not os.path.exists(listed["at"])

    report = tmp_path / "drill.html"
    code, out, err = env.run(
        "drill", "--newest", "--check", "SELECT count(*) = 6 FROM t", "--html", str(report)
    )
    assert code == 0, out + err
    assert " ok " in out.splitlines()[1]
    assert "restorable" in report.read_text()
    (doc,) = json.loads(env.run("drill", "--backup", record["id"], "--json")[1])
    assert doc["ok"] is True and doc["rto_seconds"] > 0
    code, out, _ = env.run("list")
    assert "proven restorable" in out
    assert "backup_not_drilled" not in finding_codes(env.run_json("check"))

    # A failing check: exit 1, the record says which, and check warns.
    code, out, _ = env.run("drill", "--newest", "--check", "SELECT false")
    assert code == 1
    assert "FAILED" in out
    assert finding_codes(env.run_json("check")).get("drill_failed") == "warning"
