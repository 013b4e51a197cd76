"""A :class:`~pgsnap.session.Cluster` over a throwaway server, on mock volumes.

Used by ``pgsnap demo``, the end-to-end tests and the benchmarks: the data
directory, ``pg_wal`` and the archive of a :class:`~pgsnap.testing.pgserver.PgServer`
become directory-backed :class:`~pgsnap.backends.mock.MockBackend` volumes
(roles data, wal and archive), with a directory catalog and a journal under
the server's base directory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgsnap.model import Layout, Volume, VolumeRole

if TYPE_CHECKING:
    from pgsnap.executor import Event
    from pgsnap.session import Cluster
    from pgsnap.testing.pgserver import PgServer

__all__ = ["mock_cluster"]


def mock_cluster(
    server: PgServer,
    *,
    on_event: Callable[[Event], None] | None = None,
    **cluster_options: Any,
) -> Cluster:
    """A Cluster for ``server`` (separate WAL directory required) on mock volumes.

    ``cluster.backend`` is the :class:`~pgsnap.backends.mock.MockBackend`;
    ``cluster.layout`` names the volumes (``pgdata``, ``pgwal``, ``archive``).
    Extra keyword arguments go to :class:`~pgsnap.session.Cluster`.
    """
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.archive import DirectoryWalArchive  # noqa: PLC0415
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.session import Cluster  # noqa: PLC0415

    backend = MockBackend(root=server.base_dir / "snapshots")
    volumes = []
    for name, role, path in (
        ("pgdata", VolumeRole.DATA, server.data_dir),
        ("pgwal", VolumeRole.WAL, server.wal_dir),
        ("archive", VolumeRole.ARCHIVE, server.archive_dir),
    ):
        vol = backend.add_volume(name, path=path)
        volumes.append(Volume(vol.id, name, role, str(path)))
    adapter = PostgresAdapter(
        server.conninfo(),
        data_directory=str(server.data_dir),
        bindir=str(server.bindir),
        os_user=server.os_user,
        log_file=str(server.log_file),
    )
    options: dict[str, Any] = {"journal_dir": server.base_dir / "journal", **cluster_options}
    return Cluster(
        adapter=adapter,
        backend=backend,
        archive=DirectoryWalArchive(server.archive_dir),
        catalog=DirectoryCatalog(server.base_dir / "catalog"),
        layout=Layout(tuple(volumes)),
        on_event=on_event,
        **options,
    )
