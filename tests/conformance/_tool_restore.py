"""A restore command for the conformance suite over another tool's archive in a
directory: ``python _tool_restore.py FORMAT ROOT SERVER %f %p``.

It is pgsnap's own reading of the archive (``pgsnap.archives.<format>``), not the
tool's: barman-cloud-wal-restore reads cloud storage only (its real run is in
``TestBarmanCloudS3WalArchive`` and the barman e2e test), and no WAL-G binary is
installable here. It writes ``%p`` whole or not at all and exits 1 when the
archive does not hold ``%f``, as a restore command must.
"""

from __future__ import annotations

import os
import sys

from pgsnap.archives.config import archive_settings, open_archive
from pgsnap.errors import PgsnapError


def main(argv: list[str]) -> int:
    """Copy ``name`` from the archive to ``target``; 1 when it is not there, 2 on
    failure."""
    fmt, root, server, name, target = argv
    section = {"format": fmt, "path": root, "restore_command": "unused"}
    if fmt == "barman":
        section["server"] = server
    try:
        archive = open_archive(archive_settings(section, str))
        if not archive.exists(name):
            sys.stderr.write(f"{name} is not in {archive.location}\n")
            return 1
        stream = archive.open(name)
        partial = f"{target}.part"
        try:
            with open(partial, "wb") as out:
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
        finally:
            stream.close()
        os.replace(partial, target)
    except PgsnapError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
