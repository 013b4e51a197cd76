"""The ``pgsnap`` command over pgsnap's own WAL archive (``[archive] format = "pgsnap"``),
here in a directory: the server archives with ``pgsnap wal-push``; ``check``, ``backup``,
``wal`` and ``recover`` read the archive through it, and the recovery fetches with the
restore command pgsnap writes (its spool fast path and ``wal-get``). Rows checked."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.archives.config import archive_settings, wal_get_command

from .conftest import CliEnv, backed_up, write_config

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store_cli(
    pg_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[CliEnv]:
    owner = pwd.getpwnam("postgres")
    shared = Path(tempfile.mkdtemp(prefix="pgsnap-cli-store-", dir="/tmp"))
    shared.chmod(0o755)
    store = shared / "wal"
    store.mkdir()
    os.chown(store, owner.pw_uid, owner.pw_gid)
    config = shared / "pgsnap.toml"
    prefix = (
        f"env PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m pgsnap "
        f"-c {shlex.quote(str(config))}"
    )
    options = {"format": "pgsnap", "path": str(store), "ahead": 2, "parallel": 2}
    get = wal_get_command(archive_settings(options, str), pgsnap=prefix)
    server = pg_server(
        wal_segsize_mb=1,
        separate_wal_dir=True,
        archive=True,
        settings={
            "archive_timeout": "60s",
            "autovacuum": False,
            "archive_command": f"{prefix} wal-push %p",
        },
    )
    server.start()
    server.sql("CREATE TABLE t (batch int NOT NULL, n int NOT NULL)")
    text = write_config(server, tmp_path).read_text()
    text = text.replace(
        f'[archive]\npath = "{server.archive_dir}"\n',
        f'[archive]\nformat = "pgsnap"\npath = "{store}"\nahead = 2\nparallel = 2\n'
        f"restore_command = {json.dumps(get)}\n",
    )
    assert 'format = "pgsnap"' in text
    config.write_text(text)
    yield CliEnv(server, tmp_path, config, capsys)
    shutil.rmtree(shared, ignore_errors=True)


def test_check_backup_wal_and_recover_over_pgsnaps_own_archive(store_cli: CliEnv) -> None:
    env = store_cli
    code, out, err = env.run("check")
    assert code == 0, out + err
    record = backed_up(env)
    env.write(2)
    target = env.now()
    env.write(3)
    env.server.sql("SELECT pg_switch_wal()")
    env.server.wait_for_archive_idle(timeout=60)
    report = env.run_json("wal")
    (tli,) = report["timelines"]
    assert (tli["timeline"], tli["gaps"]) == (1, [])
    start_segment = record["labelfile"].split("(file ", 1)[1].split(")", 1)[0]
    ((first, last),) = tli["ranges"]
    assert first <= start_segment < last
    env.crash_and_lose(env.server.data_dir, env.server.wal_dir)
    code, out, err = env.run("recover", "--yes", "--wal-lost", "--time", target.isoformat())
    assert code == 0, out + err
    assert record["id"] in out
    assert env.batches() == {1: 3, 2: 3}
    log = env.server.log_file.read_text(errors="replace")
    assert "restored log file" in log  # fetched from pgsnap's archive: pg_wal was lost
    code, _, err = env.run("check")
    assert code == 0, err
