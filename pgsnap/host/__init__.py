"""The database host as pgsnap reaches it: commands, files, processes, mounts.

A :class:`Host` is built on a :class:`~pgsnap.protocols.Runner`, which runs
argument lists on the machine: :class:`LocalRunner` (this machine,
``subprocess``) or :class:`SshRunner` (another machine, through the ``ssh``
binary). Everything pgsnap does on the database host goes through it: the
PostgreSQL adapter's ``pg_ctl`` and file work, and the plan's host steps
(unmount, mount, wait for a device). The same code therefore runs locally or
against a remote database host, as Barman drives its hosts over ssh::

    from pgsnap.host import Host, LocalRunner, SshRunner

    local = Host()                                   # this machine
    remote = Host(SshRunner("db1.example.com", user="root",
                            identity_file="/etc/pgsnap/id_ed25519"))
    remote.mounts()                                  # findmnt --json, parsed
    remote.write_atomic("/pgdata/backup_label", label, owner="postgres")

Commands are argument lists, never shell strings built from data. Where one
round trip must do several things atomically (write a file: temporary file,
fsync, rename), a fixed script runs under ``sh -c`` with the data passed as
positional arguments and on standard input, never pasted into the script.

The host needs a POSIX shell, GNU coreutils, util-linux (``findmnt``,
``mount``, ``umount``) and ``/proc``: any Linux distribution has them.
"""

from __future__ import annotations

from pgsnap.host.host import FileInfo, FileKind, Host, ProcessInfo, mount_holding
from pgsnap.host.runners import CommandResult, LocalRunner
from pgsnap.host.ssh import SshRunner

__all__ = [
    "CommandResult",
    "FileInfo",
    "FileKind",
    "Host",
    "LocalRunner",
    "ProcessInfo",
    "SshRunner",
    "mount_holding",
]
