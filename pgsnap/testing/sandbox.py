"""A :class:`~pgsnap.cluster.Cluster` over a throwaway server, on mock volumes.

Used by ``pgsnap demo``, the end-to-end tests and the benchmarks: the data
directory, ``pg_wal`` and the archive of a :class:`~pgsnap.testing.pgserver.PgServer`
become :class:`~pgsnap.backends.mock.MockBackend` volumes (roles data, wal and
archive), with a directory catalog and a journal under the server's base
directory. Two modes:

- **directories** (the default): each volume *is* the server's directory;
  a restore rewrites it in place under the stopped server;
- **block** (``block=True``): each directory's content moves to a simulated
  block device (the mock's block mode) that is attached to the host and
  mounted back where the server expects it, through the mock's simulated
  host; a recovery then unmounts, detaches, restores, attaches, waits for the
  device and mounts again, as it would on an array.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgsnap.model import Layout, Volume, VolumeRole

if TYPE_CHECKING:
    from pgsnap.cluster import Cluster
    from pgsnap.executor import Event
    from pgsnap.host import Host
    from pgsnap.testing.pgserver import PgServer

__all__ = ["mock_cluster", "server_cluster"]


def server_cluster(
    server: PgServer,
    backend: Any,
    volumes: Sequence[Volume],
    *,
    host: Host | None = None,
    **cluster_options: Any,
) -> Cluster:
    """A :class:`~pgsnap.cluster.Cluster` for ``server`` on ``backend`` with ``volumes``.

    The one assembly behind :func:`mock_cluster`,
    :func:`~pgsnap.testing.btrfs.btrfs_cluster` and
    :func:`~pgsnap.testing.powerflex_sim.powerflex_cluster`: a
    :class:`~pgsnap.adapters.postgres.PostgresAdapter` for the server (through
    ``host``, default this machine), its archive directory (or ``archive=``), a
    directory catalog and a journal under its base directory. Extra keyword arguments
    go to :class:`~pgsnap.cluster.Cluster` (``journal_dir`` among them).
    """
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.cluster import Cluster  # noqa: PLC0415
    from pgsnap.host import Host  # noqa: PLC0415
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    adapter = PostgresAdapter(
        server.conninfo(),
        data_directory=str(server.data_dir),
        bindir=str(server.bindir),
        os_user=server.os_user,
        log_file=str(server.log_file),
        host=host or Host(),
    )
    options: dict[str, Any] = {"journal_dir": server.base_dir / "journal", **cluster_options}
    archive = options.pop("archive", None) or DirectoryWalArchive(server.archive_dir)
    return Cluster(
        adapter=adapter,
        backend=backend,
        archive=archive,
        catalog=DirectoryCatalog(server.base_dir / "catalog"),
        layout=Layout(tuple(volumes)),
        **options,
    )


def mock_cluster(
    server: PgServer,
    *,
    on_event: Callable[[Event], None] | None = None,
    block: bool = False,
    host: Host | None = None,
    **cluster_options: Any,
) -> Cluster:
    """A Cluster for ``server`` (separate WAL directory required) on mock volumes.

    ``cluster.backend`` is the :class:`~pgsnap.backends.mock.MockBackend`;
    ``cluster.layout`` names the volumes (``pgdata``, ``pgwal``, ``archive``).
    ``block=True`` puts them on simulated block devices (see the module
    docstring; a running server is stopped while its directories move, and
    started again). ``host`` is how pgsnap reaches the database host
    (default: this machine; in block mode it must be this machine). Extra
    keyword arguments go to :class:`~pgsnap.cluster.Cluster`.
    """
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
    from pgsnap.host import Host  # noqa: PLC0415

    # A state file, so processes share the storage as they would an array (a run killed
    # in a child process leaves what it did for the next one to see).
    backend = MockBackend(
        root=server.base_dir / "snapshots", state_file=server.base_dir / "mock.json", block=block
    )
    directories = (
        ("pgdata", VolumeRole.DATA, server.data_dir),
        ("pgwal", VolumeRole.WAL, server.wal_dir),
        ("archive", VolumeRole.ARCHIVE, server.archive_dir),
    )
    if block:
        host = backend.simulated_host(host)
        was_running = server.is_running()
        if was_running:
            server.stop()
        volumes = [
            _on_a_device(backend, host, server.base_dir / "luns", name, role, path)
            for name, role, path in directories
        ]
        if was_running:
            server.start()
    else:
        host = host or Host()
        volumes = []
        for name, role, path in directories:
            vol = backend.add_volume(name, path=path)
            volumes.append(Volume(vol.id, name, role, str(path)))
    return server_cluster(server, backend, volumes, host=host, on_event=on_event, **cluster_options)


def _on_a_device(
    backend: Any, host: Host, luns: Path, name: str, role: VolumeRole, path: Path
) -> Volume:
    """Move ``path``'s content onto a new block volume, attached and mounted at ``path``."""
    luns.mkdir(mode=0o755, exist_ok=True)
    lun = luns / name
    os.rename(path, lun)  # the content (owner, modes) moves as it is
    os.mkdir(path, 0o755)  # the mount point, as an empty directory
    vol = backend.add_volume(name, path=lun)
    backend.attach(vol.id, host.name)
    device = backend.locate(vol.id).path
    host.wait_for_device(device, timeout=10)
    host.mount(device, str(path))
    return Volume(vol.id, name, role, str(path))
