"""End-to-end fixtures: a whole :class:`~pgsnap.cluster.Cluster` over a real PostgreSQL.

``e2e_env(bindir=None)`` builds a :class:`PgServer` (1 MB WAL segments,
``pg_wal`` in its own directory, archiving into ``archive/``), starts it, and
wires pgsnap to it exactly as a user would:

- a :class:`~pgsnap.backends.mock.MockBackend` whose directory-backed volumes
  are the server's data directory (DATA), its WAL directory (WAL) and the
  archive directory (ARCHIVE, never snapshotted);
- a :class:`~pgsnap.wal.archive.DirectoryWalArchive` on the archive directory;
- a :class:`~pgsnap.catalog.DirectoryCatalog` and the executor journal under
  the server's base directory;
- a :class:`~pgsnap.adapters.postgres.PostgresAdapter` with the data
  directory, binaries, OS user and server log of the cluster.

The :class:`Env` it returns also writes numbered batches of rows and reads
back which batches exist, which is what every recovery test checks.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest

from pgsnap.backends.mock import MockBackend
from pgsnap.cluster import Cluster
from pgsnap.model import LSN, BackupRecord, BackupState, RecoveryTarget, VolumeRole
from pgsnap.testing.pgserver import PgServer
from pgsnap.testing.sandbox import mock_cluster

ROWS_PER_BATCH = 3

# --------------------------------------------------------------------------- ordering


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_lvm_e2e's tests grouped by VM set-up (stable: file order within each), so
    that each VM boots once and only one runs at a time."""
    spots = [n for n, item in enumerate(items) if item.path.name == "test_lvm_e2e.py"]

    def setup_of(item: pytest.Item) -> str:
        callspec = getattr(item, "callspec", None)
        which = None if callspec is None else callspec.params.get("which")
        if isinstance(which, str):
            return which
        names = getattr(item, "fixturenames", ())
        return next((n for n in ("thin_ext4", "classic_xfs") if n in names), "")

    ordered = sorted((items[n] for n in spots), key=setup_of)
    for n, item in zip(spots, ordered, strict=True):
        items[n] = item


# --------------------------------------------------------------------------- the env


@attrs.define
class Env:
    """A running PostgreSQL cluster and the pgsnap Cluster wired to it."""

    server: PgServer
    backend: MockBackend
    cluster: Cluster
    data_vol: str
    wal_vol: str
    archive_vol: str

    @property
    def journal_dir(self) -> Path:
        return self.server.base_dir / "journal"

    @property
    def archive_dir(self) -> Path:
        return self.server.archive_dir

    # -------------------------------------------------------------- data

    def create_table(self) -> None:
        self.server.sql("CREATE TABLE t (batch int NOT NULL, n int NOT NULL, at timestamptz)")

    def write(self, batch: int, n: int = ROWS_PER_BATCH) -> None:
        """Insert ``n`` rows of ``batch``, each in its own transaction."""
        with self.server.connect() as conn:
            for i in range(n):
                conn.execute(
                    "INSERT INTO t (batch, n, at) VALUES (%s, %s, clock_timestamp())", (batch, i)
                )

    def write_in_one_xact(self, batch: int, n: int = ROWS_PER_BATCH) -> int:
        """Insert ``n`` rows of ``batch`` in one transaction; return its xid."""
        with self.server.connect(autocommit=False) as conn, conn.transaction():
            for i in range(n):
                conn.execute(
                    "INSERT INTO t (batch, n, at) VALUES (%s, %s, clock_timestamp())",
                    (batch, i),
                )
            row = conn.execute("SELECT txid_current()").fetchone()
        assert row is not None
        return int(row[0])

    def batches(self) -> dict[int, int]:
        """``{batch: row count}`` in the (recovered) server."""
        return {
            int(b): int(c)
            for b, c in self.server.sql("SELECT batch, count(*) FROM t GROUP BY batch ORDER BY 1")
        }

    def expect(self, *batches: int) -> dict[int, int]:
        """The ``batches()`` a recovery keeping exactly ``batches`` gives."""
        return dict.fromkeys(batches, ROWS_PER_BATCH)

    def now(self) -> dt.datetime:
        """The server's clock, pausing a little on either side so commits are apart."""
        time.sleep(0.05)
        value = self.server.sql("SELECT clock_timestamp()")[0][0]
        time.sleep(0.05)
        assert isinstance(value, dt.datetime)
        return value

    def current_lsn(self) -> LSN:
        return LSN.parse(str(self.server.sql("SELECT pg_current_wal_lsn()::text")[0][0]))

    def timeline(self) -> int:
        name = str(self.server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0])
        return int(name[:8], 16)

    def switch_wal(self) -> str:
        """Finish the current segment and wait until it is archived; return its name."""
        return self.server.switch_wal_and_wait_archived()

    # -------------------------------------------------------------- failures

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: the server dies without a checkpoint."""
        self.server.pg_ctl("stop", "-m", "immediate")

    def lose(self, directory: Path) -> None:
        """Empty ``directory`` (the volume's content is gone, the mount point stays)."""
        for entry in os.scandir(directory):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)

    def lose_data(self) -> None:
        self.lose(self.server.data_dir)

    def lose_wal(self) -> None:
        self.lose(self.server.wal_dir)

    def snapshot_ids(self) -> set[str]:
        return {s.id for s in self.backend.list_snapshots()}

    def journals(self) -> list[str]:
        """The journal files."""
        d = self.journal_dir
        return sorted(p.name for p in d.glob("*.journal")) if d.exists() else []

    def data_state(self) -> dict[str, Any]:
        """What a refused plan must leave as it was: the postmaster and the recovery files."""
        dd = self.server.data_dir

        def read(name: str) -> str | None:
            try:
                return (dd / name).read_text()
            except FileNotFoundError:
                return None

        return {
            "postmaster.pid": read("postmaster.pid"),
            "postgresql.auto.conf": read("postgresql.auto.conf"),
            "postgresql.conf": read("postgresql.conf"),
            "backup_label": read("backup_label"),
            "recovery.signal": read("recovery.signal"),
            "running": self.server.is_running(),
        }


# --------------------------------------------------------------------------- scenarios


def backed_up(env: Env) -> BackupRecord:
    """Table + batch 1, then a DONE backup."""
    env.create_table()
    env.write(1)
    record = env.cluster.backup("e2e")
    assert record.state is BackupState.DONE
    return record


def pitr_setup(env: Env, kind: str) -> RecoveryTarget:
    """Batch 1, backup, batch 2, <target>, batch 3 (all archived); return the target."""
    backed_up(env)
    if kind == "xid":
        xid = env.write_in_one_xact(2)
        target = RecoveryTarget.xid(xid)
    else:
        env.write(2)
        if kind == "time":
            target = RecoveryTarget.time(env.now())
        elif kind == "lsn":
            target = RecoveryTarget.lsn(env.current_lsn())
        elif kind == "name":
            env.server.sql("SELECT pg_create_restore_point('e2e_rp')")
            target = RecoveryTarget.name("e2e_rp")
        else:
            raise AssertionError(kind)
    env.write(3)
    env.switch_wal()
    return target


def count_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, the directory archives listed (``DirectoryWalArchive.index``), one
    entry per listing: what a plan that probes the archive by name must not do."""
    from pgsnap.wal.archive import DirectoryWalArchive

    listings: list[str] = []
    listed = DirectoryWalArchive.index

    def counted(self: DirectoryWalArchive, *args: Any, **kwargs: Any) -> Any:
        listings.append(self.path)
        return listed(self, *args, **kwargs)

    monkeypatch.setattr(DirectoryWalArchive, "index", counted)
    return listings


def assert_not_in_backup_mode(env: Env) -> None:
    """No pgsnap backup session is left, and a new backup can start and stop."""
    assert_server_not_in_backup_mode(env.server)


def assert_server_not_in_backup_mode(server: PgServer) -> None:
    """:func:`assert_not_in_backup_mode` of any server (a primary or a standby)."""
    deadline = time.monotonic() + 10
    while server.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsnap backup'"
    )[0][0]:
        assert time.monotonic() < deadline, "the backup session is still open"
        time.sleep(0.05)
    with server.connect() as conn:
        if server.major >= 15:
            conn.execute("SELECT pg_backup_start('e2e check', true)")
            conn.execute("SELECT pg_backup_stop(false)")
        else:
            # An exclusive backup cannot start while any backup is in progress... only
            # another exclusive one; the non-exclusive pair checks the server accepts one.
            conn.execute("SELECT pg_start_backup('e2e check', true, false)")
            conn.execute("SELECT pg_stop_backup(false)")


def make_env(
    factory: Any,
    bindir: Path | None = None,
    *,
    block: bool = False,
    host: Any = None,
    deep_wal: bool = False,
    copy_target: Path | None = None,
    archive: Any = None,
    **settings: Any,
) -> Env:
    """``deep_wal``: pg_wal lives in a subdirectory of the WAL volume (``initdb --waldir
    /walvol/cluster1/wal``), not at its root nor in ``<root>/pg_wal``. ``copy_target``:
    where ``cluster.copy`` puts copies off the array."""
    server: PgServer = factory(
        bindir,
        wal_segsize_mb=1,
        separate_wal_dir=True,
        archive=True,
        settings={"archive_timeout": "60s", "autovacuum": False, **settings},
    )
    if deep_wal:
        _move_pg_wal_deeper(server)
    server.start()
    options: dict[str, Any] = {} if copy_target is None else {"copy_target": copy_target}
    if archive is not None:
        options["archive"] = archive
    cluster = mock_cluster(server, block=block, host=host, **options)
    layout = cluster.layout
    archive = layout.by_role(VolumeRole.ARCHIVE)[0]
    assert layout.wal is not None
    backend = cast(MockBackend, cluster.backend)
    return Env(server, backend, cluster, layout.data.id, layout.wal.id, archive.id)


def _move_pg_wal_deeper(server: PgServer) -> None:
    """Put the WAL volume's content in ``cluster1/wal`` below it; repoint the link."""
    volume = server.wal_dir
    deep = volume / "cluster1" / "wal"
    deep.mkdir(parents=True)
    for entry in list(volume.iterdir()):
        if entry.name != "cluster1":
            entry.rename(deep / entry.name)
    st = volume.stat()
    for path in (volume / "cluster1", deep):
        os.chown(path, st.st_uid, st.st_gid)
        path.chmod(0o700)
    link = server.data_dir / "pg_wal"
    link.unlink()
    link.symlink_to(deep)


@pytest.fixture
def volume_mode() -> str:
    """How the mock holds the volumes: ``directories``, or ``block`` (simulated devices,
    mounted; a recovery unmounts, detaches, restores, attaches and mounts). A test
    module parametrizes this fixture to run in both."""
    return "directories"


@pytest.fixture
def e2e_env(pg_server: Any, volume_mode: str) -> Iterator[Callable[..., Env]]:
    """``e2e_env(bindir=None, **settings)``: a running cluster under pgsnap (see the module)."""
    made: list[Env] = []

    def build(bindir: Path | None = None, **settings: Any) -> Env:
        env = make_env(pg_server, bindir, block=volume_mode == "block", **settings)
        made.append(env)
        return env

    yield build
    for env in made:
        env.backend.close()
