"""WAL archives beyond a directory (docs/reference/wal-archives.md).

- :mod:`pgsnap.archives.store`: pgsnap's own archive in an object store, and
  :mod:`~pgsnap.archives.format` (how it stores a file),
  :mod:`~pgsnap.archives.transfer` (push, get, prefetch) and
  :mod:`~pgsnap.archives.commands` (``pgsnap wal-push``, ``wal-get``);
- read-only views of other tools' archives: :mod:`~pgsnap.archives.pgbackrest`,
  :mod:`~pgsnap.archives.barman`, :mod:`~pgsnap.archives.walg` (over
  :mod:`~pgsnap.archives.toolarchive`);
- :mod:`~pgsnap.archives.config`: the ``[archive]`` section.

Nothing is imported here: ``wal-get`` and ``wal-push`` start lean.
"""
