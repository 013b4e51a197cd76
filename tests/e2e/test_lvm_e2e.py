"""PostgreSQL 15 on logical volumes inside the lvm2 test VM: backup, restore by merge, PITR.

The VM (:mod:`pgsnap.testing.lvmvm`, with a forwarded port) carries this
machine's PostgreSQL 15 server binaries. In it, a thin pool holds two thin
volumes with ext4, ``pgvg/data`` (the data directory) and ``pgvg/wal``
(``pg_wal``); the WAL archive is a directory outside them. psycopg on this
machine talks to the server through the forwarded port. Each test writes
numbered batches of rows, takes a backup with
:class:`~pgsnap.backends.lvm.LvmBackend` in backup mode, breaks the cluster,
restores by merging the snapshots back, and checks WHICH ROWS EXIST after
PostgreSQL's recovery.

What is not here yet: these tests drive backup mode and the recovery steps
themselves (as the design's procedure lists them), not through
:class:`~pgsnap.session.Cluster`'s planner and executor, whose archive and
catalog live on this machine while the server's archive lives in the VM.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.backends.lvm import LvmBackend
from pgsnap.errors import MountBusyError
from pgsnap.host import Host
from pgsnap.testing.lvmvm import LvmVm, lvmvm_unavailable

pytestmark = pytest.mark.postgres

PG = Path("/usr/lib/postgresql/15")
SHARE = Path("/usr/share/postgresql/15")
VG = "pgvg"
DATA_MNT, WAL_MNT, ARCHIVE = "/pg/data", "/pg/wal", "/pg/archive"
PGDATA, PGWAL = f"{DATA_MNT}/pgdata", f"{WAL_MNT}/pg_wal"
LOG = "/pg/server.log"
SETTINGS = f"""
listen_addresses = '*'
port = 5432
unix_socket_directories = '/tmp'
wal_level = replica
archive_mode = on
archive_command = 'test ! -f {ARCHIVE}/%f && cp %p {ARCHIVE}/%f'
jit = off
shared_buffers = 32MB
autovacuum = off
"""


@pytest.fixture(scope="module")
def vm() -> Iterator[LvmVm]:
    reason = lvmvm_unavailable()
    if reason is not None:
        pytest.skip(f"no lvm2 test VM on this machine: {reason}")
    if not (PG / "bin" / "postgres").exists():
        pytest.skip(f"no PostgreSQL 15 server at {PG} (apt-get install postgresql-15)")
    machine = LvmVm.boot(
        forward_port=True,
        memory_mb=1536,
        extra_paths=[str(PG / "bin"), str(PG / "lib"), str(SHARE), "/usr/share/zoneinfo/UTC"],
        boot_timeout=300,
    )
    try:
        yield machine
    finally:
        machine.close()


def pg(host: Host, *args: str, timeout: float = 120) -> str:
    """A PostgreSQL program in the VM, as the postgres user."""
    return host.run([str(PG / "bin" / args[0]), *args[1:]], user="postgres", timeout=timeout).text


@pytest.fixture(scope="module")
def cluster(vm: LvmVm) -> Host:
    """The volume group, two ext4 thin volumes mounted, an initialised cluster (stopped)."""
    host = vm.host
    host.run(["pvcreate", "-q", "/dev/vda"])
    host.run(["vgcreate", "-q", VG, "/dev/vda"])
    host.run(["lvcreate", "-q", "-T", "-L", "2G", f"{VG}/pool"])
    for lv, mnt in (("data", DATA_MNT), ("wal", WAL_MNT)):
        host.run(["lvcreate", "-q", "-y", "-V", "512M", "-T", f"{VG}/pool", "-n", lv])
        host.run(["mkfs.ext4", "-q", f"/dev/{VG}/{lv}"])
        host.make_dirs(mnt, mode=0o755)
        host.run(["mount", f"/dev/{VG}/{lv}", mnt])
        host.run(["chown", "postgres:postgres", mnt])
    host.make_dirs(ARCHIVE, mode=0o700, owner="postgres")
    host.run(["chown", "postgres:postgres", "/pg"])
    pg(
        host,
        "initdb",
        "-D",
        PGDATA,
        "-X",
        PGWAL,
        "--no-locale",
        "-E",
        "UTF8",
        "-A",
        "trust",
        "--wal-segsize=1",
        "-U",
        "postgres",
        timeout=300,
    )
    conf = host.read_text(f"{PGDATA}/postgresql.conf") + SETTINGS
    host.write_atomic(f"{PGDATA}/postgresql.conf", conf.encode(), owner="postgres")
    hba = host.read_text(f"{PGDATA}/pg_hba.conf") + "\nhost all all 0.0.0.0/0 trust\n"
    host.write_atomic(f"{PGDATA}/pg_hba.conf", hba.encode(), owner="postgres")
    return host


def start(host: Host) -> None:
    pg(host, "pg_ctl", "-D", PGDATA, "-l", LOG, "-w", "-t", "120", "start", timeout=180)


def connect(vm: LvmVm, *, timeout: float = 120) -> Any:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            return psycopg.connect(
                host="127.0.0.1",
                port=vm.port,
                user="postgres",
                dbname="postgres",
                autocommit=True,
                connect_timeout=10,
            )
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def write(conn: Any, batch: int) -> None:
    conn.execute("INSERT INTO rows SELECT %s, g FROM generate_series(1, 3) g", (batch,))


def batches(conn: Any) -> list[int]:
    return [r[0] for r in conn.execute("SELECT DISTINCT batch FROM rows ORDER BY 1").fetchall()]


def wait_archived(conn: Any) -> None:
    """Switch WAL and wait until the finished segment is in the archive."""
    (name,) = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (last,) = conn.execute("SELECT last_archived_wal FROM pg_stat_archiver").fetchone()
        if last is not None and last >= name:
            return
        time.sleep(0.3)
    raise AssertionError(f"{name} was not archived within 60 s")


def test_backup_merge_restore_and_point_in_time_recovery(vm: LvmVm, cluster: Host) -> None:
    host = cluster
    backend = LvmBackend(VG, host=host)
    start(host)
    conn = connect(vm)
    conn.execute("CREATE TABLE rows (batch int, n int)")
    write(conn, 1)

    # Backup: backup mode on a dedicated session, both volumes snapshotted, stop.
    with connect(vm) as session:
        session.execute("SELECT pg_backup_start('lvm-e2e', true)")
        group = backend.create_snapshot_group([f"{VG}/data", f"{VG}/wal"], "lvm-e2e")
        label, spcmap = session.execute(
            "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
        ).fetchone()
    assert "START WAL LOCATION" in label
    assert sorted(s.volume_id for s in group.snapshots) == [f"{VG}/data", f"{VG}/wal"]
    assert all(s.extra["kind"] == "thin" for s in group.snapshots)

    write(conn, 2)
    conn.execute("SELECT pg_create_restore_point('after-2')")
    write(conn, 3)
    wait_archived(conn)
    assert batches(conn) == [1, 2, 3]
    conn.close()

    # Lose the cluster: the server dies, both volumes are wrong.
    pg(host, "pg_ctl", "-D", PGDATA, "-m", "immediate", "-w", "stop")
    host.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={PGDATA}/global/pg_control",
            "bs=512",
            "count=1",
            "conv=notrunc,fsync",
        ]
    )

    # Restore both volumes by merging: unmount, merge (the thin backup survives), mount.
    for lv, mnt in (("data", DATA_MNT), ("wal", WAL_MNT)):
        host.unmount(mnt)
        profile = backend.restore_profile(f"{VG}/{lv}")
        assert profile.unmounts and not profile.consumes_snapshot
        backend.restore_volume(f"{VG}/{lv}", group.for_volume(f"{VG}/{lv}").id)
        host.mount(f"/dev/{VG}/{lv}", mnt)
    assert {s.id for s in backend.list_snapshots()} == {s.id for s in group.snapshots}

    # Recovery settings, as the design's restore steps list them.
    host.remove([f"{PGDATA}/postmaster.pid"])
    wal_files = [n for n in host.list_dir(PGWAL) if n != "archive_status"]
    host.remove([f"{PGWAL}/{n}" for n in wal_files])
    host.write_atomic(f"{PGDATA}/backup_label", label.encode(), owner="postgres")
    if spcmap:
        host.write_atomic(f"{PGDATA}/tablespace_map", spcmap.encode(), owner="postgres")
    auto = (
        f"restore_command = 'cp {ARCHIVE}/%f %p'\n"
        "recovery_target_name = 'after-2'\n"
        "recovery_target_action = 'promote'\n"
    )
    host.write_atomic(f"{PGDATA}/postgresql.auto.conf", auto.encode(), owner="postgres")
    host.write_atomic(f"{PGDATA}/recovery.signal", b"", owner="postgres")
    start(host)
    conn = connect(vm)
    deadline = time.monotonic() + 120
    while conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
        assert time.monotonic() < deadline, host.read_text(LOG)[-3000:]
        time.sleep(0.5)
    assert batches(conn) == [1, 2], host.read_text(LOG)[-3000:]
    assert conn.execute("SELECT timeline_id FROM pg_control_checkpoint()").fetchone()[0] == 2
    write(conn, 4)
    assert batches(conn) == [1, 2, 4]
    conn.close()
    log = host.read_text(LOG)
    assert 'recovery stopping at restore point "after-2"' in log


def test_busy_unmount_then_complete_recovery_keeps_the_wal_volume(vm: LvmVm, cluster: Host) -> None:
    """Runs after the PITR test, on its cluster (timeline 2, batches 1, 2, 4)."""
    host = cluster
    backend = LvmBackend(VG, host=host)
    conn = connect(vm)
    assert batches(conn) == [1, 2, 4]

    # The running server holds the data volume: the unmount is refused, naming it,
    # and everything stays mounted.
    with pytest.raises(MountBusyError) as busy:
        host.unmount(DATA_MNT)
    assert any("postgres" in h for h in busy.value.holders), busy.value.holders
    assert host.mount_of(DATA_MNT) is not None and host.mount_of(WAL_MNT) is not None
    assert batches(conn) == [1, 2, 4]

    with connect(vm) as session:
        session.execute("SELECT pg_backup_start('lvm-e2e-2', true)")
        group = backend.create_snapshot_group([f"{VG}/data", f"{VG}/wal"], "lvm-e2e-2")
        label, _spcmap = session.execute(
            "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
        ).fetchone()
    write(conn, 5)
    wait_archived(conn)
    write(conn, 6)  # only in pg_wal, on the WAL volume: never archived
    (current,) = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
    conn.close()
    pg(host, "pg_ctl", "-D", PGDATA, "-m", "immediate", "-w", "stop")
    assert not host.exists(f"{ARCHIVE}/{current}")
    host.run(
        [
            "dd",
            "if=/dev/zero",
            f"of={PGDATA}/global/pg_control",
            "bs=512",
            "count=1",
            "conv=notrunc,fsync",
        ]
    )

    # Only the data volume is restored; the WAL volume with batch 6 is kept.
    wal_snapshot = group.for_volume(f"{VG}/wal").id
    host.unmount(DATA_MNT)
    backend.restore_volume(f"{VG}/data", group.for_volume(f"{VG}/data").id)
    host.mount(f"/dev/{VG}/data", DATA_MNT)
    host.remove([f"{PGDATA}/postmaster.pid"])
    host.write_atomic(f"{PGDATA}/backup_label", label.encode(), owner="postgres")
    host.write_atomic(
        f"{PGDATA}/postgresql.auto.conf",
        f"restore_command = 'cp {ARCHIVE}/%f %p'\n".encode(),
        owner="postgres",
    )
    host.write_atomic(f"{PGDATA}/recovery.signal", b"", owner="postgres")
    start(host)
    conn = connect(vm)
    deadline = time.monotonic() + 120
    while conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
        assert time.monotonic() < deadline, host.read_text(LOG)[-3000:]
        time.sleep(0.5)
    assert batches(conn) == [1, 2, 4, 5, 6], host.read_text(LOG)[-3000:]
    conn.close()
    # Both snapshots of the backup are still there (thin: a copy was merged).
    assert wal_snapshot in {s.id for s in backend.list_snapshots(f"{VG}/wal")}
    assert group.for_volume(f"{VG}/data").id in {s.id for s in backend.list_snapshots(f"{VG}/data")}
