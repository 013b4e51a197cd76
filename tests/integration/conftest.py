"""Fixtures of the ``pgsnap`` command's tests: a real PostgreSQL and the configuration
a user would write for it (the mock backend in a state file, directory volumes)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.backends.mock import MockBackend
from pgsnap.cli import main
from pgsnap.testing.pgserver import PgServer

# --------------------------------------------------------------------------- set-up


@attrs.define
class CliEnv:
    server: PgServer
    work: Path
    config: Path
    capsys: pytest.CaptureFixture[str]

    @property
    def state_file(self) -> Path:
        return self.work / "mock.json"

    def run(self, *argv: str, config: Path | None = None) -> tuple[int, str, str]:
        """``pgsnap <command> -c <config> <args>`` in-process: (exit code, stdout, stderr).
        A command of two words (``"safety list"``) takes ``-c`` after both."""
        self.capsys.readouterr()
        code = main([*argv[0].split(), "-c", str(config or self.config), *argv[1:]])
        out, err = self.capsys.readouterr()
        return code, out, err

    def run_json(self, *argv: str) -> Any:
        code, out, err = self.run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    def write(self, batch: int, n: int = 3) -> None:
        with self.server.connect() as conn:
            for i in range(n):
                conn.execute("INSERT INTO t (batch, n) VALUES (%s, %s)", (batch, i))

    def batches(self) -> dict[int, int]:
        rows = self.server.sql("SELECT batch, count(*) FROM t GROUP BY batch ORDER BY 1")
        return {int(b): int(c) for b, c in rows}

    def now(self) -> dt.datetime:
        time.sleep(0.05)
        value = self.server.sql("SELECT clock_timestamp()")[0][0]
        time.sleep(0.05)
        assert isinstance(value, dt.datetime)
        return value

    def timeline(self) -> int:
        name = str(self.server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0])
        return int(name[:8], 16)

    def crash_and_lose(self, *directories: Path) -> None:
        self.server.pg_ctl("stop", "-m", "immediate")
        for directory in directories:
            for entry in os.scandir(directory):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)

    def journals(self) -> list[str]:
        directory = self.work / "journal"
        return sorted(p.name for p in directory.glob("*.journal")) if directory.exists() else []

    def snapshot_ids(self) -> set[str]:
        with MockBackend(state_file=self.state_file, root=self.work / "snapshots") as backend:
            return {s.id for s in backend.list_snapshots()}


def write_config(
    server: PgServer, work: Path, *, name: str = "pgsnap.toml", wal: bool = True
) -> Path:
    """The configuration a user would write for this cluster (``wal=False`` forgets pg_wal)."""
    volumes = [("vol-data", "pgdata", "data", server.data_dir)]
    if wal:
        volumes.append(("vol-wal", "pgwal", "wal", server.wal_dir))
    volumes.append(("vol-archive", "archive", "archive", server.archive_dir))
    layout = "".join(
        f'[[volume]]\nid = "{vid}"\nname = "{vname}"\nrole = "{role}"\nmount_point = "{path}"\n\n'
        for vid, vname, role, path in volumes
    )
    text = f"""\
[database]
conninfo = "{server.conninfo()}"
data_directory = "{server.data_dir}"
bindir = "{server.bindir}"
os_user = "{server.os_user}"
log_file = "{server.log_file}"

[storage]
backend = "mock"

[storage.options]
state_file = "{work / "mock.json"}"
root = "{work / "snapshots"}"

[archive]
path = "{server.archive_dir}"

[catalog]
path = "{work / "catalog"}"
journal = "{work / "journal"}"

{layout}"""
    path = work / name
    path.write_text(text)
    return path


@pytest.fixture
def cli_env(pg_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> CliEnv:
    server: PgServer = pg_server(
        wal_segsize_mb=1,
        separate_wal_dir=True,
        archive=True,
        settings={"archive_timeout": "60s", "autovacuum": False},
    )
    server.start()
    server.sql("CREATE TABLE t (batch int NOT NULL, n int NOT NULL)")
    return CliEnv(server, tmp_path, write_config(server, tmp_path), capsys)


def finding_codes(report: dict[str, Any]) -> dict[str, str]:
    """``{code: severity}`` from ``check --json`` findings (``"warning: ... [code]"``)."""
    codes: dict[str, str] = {}
    for text in report["findings"]:
        severity = text.split(":", 1)[0]
        code = text.rsplit("[", 1)[1].rstrip("]")
        codes[code] = "error" if "error" in (severity, codes.get(code)) else severity
    return codes


def backed_up(env: CliEnv) -> dict[str, Any]:
    """Batch 1, then ``pgsnap backup``; return the DONE record from ``list --json``."""
    env.write(1)
    code, out, err = env.run("backup", "--label", "cli test")
    assert code == 0, err
    assert out.startswith("backup ") and " done: " in out
    assert "[1/7] started" in err  # progress on stderr
    (record,) = env.run_json("list")
    assert record["state"] == "done"
    assert record["label"] == "cli test"
    return dict(record)
