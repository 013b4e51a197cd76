"""A drill's amcheck on a real server: every index and table checked in one call a
database, and a corrupted index reported by name while the rest are still checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgsnap.adapters.postgres import PostgresAdapter
from pgsnap.clones import _amcheck
from pgsnap.testing.pgserver import PgServer

pytestmark = pytest.mark.postgres


def test_amcheck_names_a_corrupted_index_and_checks_the_rest(pg_server: Any) -> None:
    server: PgServer = pg_server(archive=False)
    server.start()
    server.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    server.sql("INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(1, 20000) g")
    server.sql("CREATE INDEX t_v ON t (v, id)")
    server.sql("CHECKPOINT")
    adapter = PostgresAdapter(
        server.conninfo(),
        data_directory=str(server.data_dir),
        bindir=str(server.bindir),
        os_user=server.os_user,
    )
    instance = adapter.instance(
        data_directory=str(server.data_dir),
        port=server.port,
        socket_directory=str(server.socket_dir),
    )
    healthy = _amcheck(instance, server.major)
    assert healthy.ok, healthy.detail
    assert healthy.name == "amcheck" and healthy.detail.endswith(" in 2 databases")  # not template0
    checked = int(healthy.detail.split()[0])
    assert checked > 100  # the system catalogs' indexes and tables too

    path = Path(server.data_dir) / server.sql("SELECT pg_relation_filepath('t_v')")[0][0]
    server.stop()
    with open(path, "r+b") as f:  # block 2 of the index: a leaf page, garbled after its header
        f.seek(2 * 8192 + 64)
        f.write(b"\xde\xad\xbe\xef" * 512)
    server.start()
    broken = _amcheck(instance, server.major)
    assert not broken.ok
    assert "postgres.t_v: " in broken.detail, broken.detail
