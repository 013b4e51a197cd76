"""The :class:`Host`: files, processes and mounts on one machine, over a Runner."""

from __future__ import annotations

import enum
import socket
from collections.abc import Sequence

import attrs

from pgsnap.host.runners import CommandResult
from pgsnap.model import Mount
from pgsnap.protocols import Runner

__all__ = ["FileInfo", "FileKind", "Host", "ProcessInfo"]


class FileKind(enum.Enum):
    """What a path on the host is."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    """Only from ``stat(path, follow=False)`` on a symbolic link."""
    OTHER = "other"
    """A device node, socket or pipe."""


@attrs.frozen
class FileInfo:
    """What ``stat`` says of a path on the host."""

    path: str
    kind: FileKind
    size: int
    mode: int
    """The permission bits (``0o700``...)."""
    uid: int
    gid: int
    owner: str
    """The owner's user name (its uid as text when the host has no name for it)."""


@attrs.frozen
class ProcessInfo:
    """A process on the host."""

    pid: int
    user: str
    command: str
    """The program's name (``postgres``), from ``/proc/<pid>/comm``."""
    cwd: str | None = None
    """Its working directory, when it can be read."""
    zombie: bool = False
    """Dead, waiting for its parent to reap it."""

    def __str__(self) -> str:
        return f"pid {self.pid} {self.command} (user {self.user})"


class Host:
    """One machine as pgsnap reaches it, through ``runner`` (default: this machine).

    ``name`` is the host's name as the storage knows it (what
    :meth:`~pgsnap.protocols.StorageBackend.attach` is given); it defaults to
    the ssh destination, or this machine's host name.

    Errors: :class:`~pgsnap.errors.HostFileNotFound` for a missing path,
    :class:`~pgsnap.errors.CommandError` (``argv``, ``returncode``, the end of
    ``stderr``) for a command that fails, :class:`~pgsnap.errors.MountError` /
    :class:`~pgsnap.errors.MountBusyError` / :class:`~pgsnap.errors.DeviceNotFound`
    for mounts and devices, and what the runner raises
    (:class:`~pgsnap.errors.HostUnreachable`, :class:`~pgsnap.errors.CommandTimeout`).
    Each carries ``host`` (the runner's description).
    """

    def __init__(self, runner: Runner | None = None, *, name: str | None = None) -> None:
        if runner is None:
            from pgsnap.host.runners import LocalRunner  # noqa: PLC0415

            runner = LocalRunner()
        self._runner = runner
        if name is None:
            destination = getattr(runner, "destination", None)
            name = str(destination) if destination else socket.gethostname()
        self._name = name

    def __repr__(self) -> str:
        return f"<Host {self._name} via {self._runner.description}>"

    @property
    def runner(self) -> Runner:
        """How commands reach this host."""
        return self._runner

    @property
    def name(self) -> str:
        """The host's name as the storage knows it."""
        return self._name

    @property
    def description(self) -> str:
        """Where this host is, for messages (the runner's description)."""
        return self._runner.description

    # ------------------------------------------------------------------ commands

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
        check: bool = True,
    ) -> CommandResult:
        """Run ``argv`` on the host; with ``check``, a non-zero exit raises CommandError."""
        raise NotImplementedError

    # ------------------------------------------------------------------ files

    def read_bytes(
        self, path: str, *, offset: int = 0, limit: int | None = None, user: str | None = None
    ) -> bytes:
        """The file's bytes from ``offset`` (at most ``limit`` of them)."""
        raise NotImplementedError

    def read_text(self, path: str, *, user: str | None = None) -> str:
        """The whole file as text (UTF-8, undecodable bytes kept as surrogates)."""
        raise NotImplementedError

    def stat(self, path: str, *, follow: bool = True) -> FileInfo | None:
        """What the path is (None when it does not exist)."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        """True when the path exists (a dangling symlink does not)."""
        raise NotImplementedError

    def realpath(self, path: str) -> str:
        """The path with every symlink resolved (missing components allowed)."""
        raise NotImplementedError

    def list_dir(self, path: str) -> tuple[str, ...]:
        """The names in a directory, sorted (``.`` and ``..`` left out)."""
        raise NotImplementedError

    def write_atomic(
        self, path: str, data: bytes, *, mode: int = 0o600, owner: str | None = None
    ) -> None:
        """Replace ``path`` with ``data``: readers see the old file or the new one.

        A temporary file in the same directory, fsynced, given ``mode`` and
        ``owner`` (``"postgres"`` or ``"uid:gid"``; only when running as root),
        renamed over ``path``, and the directory fsynced.
        """
        raise NotImplementedError

    def remove(self, paths: Sequence[str], *, recursive: bool = False) -> None:
        """Remove the paths (a symlink itself, never what it points to); missing ones are fine."""
        raise NotImplementedError

    def make_dirs(self, path: str, *, mode: int = 0o700, owner: str | None = None) -> None:
        """Create the directory and its parents; an existing one is fine."""
        raise NotImplementedError

    # ------------------------------------------------------------------ processes

    def process(self, pid: int) -> ProcessInfo | None:
        """The process with ``pid`` (None when there is none)."""
        raise NotImplementedError

    def processes_using(self, path: str) -> tuple[ProcessInfo, ...]:
        """Processes whose working directory, root, open files or mapped files lie
        under ``path``, by pid."""
        raise NotImplementedError

    # ------------------------------------------------------------------ mounts

    def mounts(self) -> tuple[Mount, ...]:
        """Every mounted file system (``findmnt --json``; ``/proc/self/mountinfo``
        where findmnt is missing)."""
        raise NotImplementedError

    def mount_of(self, path: str) -> Mount | None:
        """The mount that holds ``path`` (the longest mount point above its real path)."""
        raise NotImplementedError

    def mount(
        self, source: str, target: str, *, fstype: str | None = None, options: Sequence[str] = ()
    ) -> None:
        """Mount ``source`` on ``target``; a no-op when exactly that is mounted already.

        :class:`~pgsnap.errors.MountError` when something else is mounted there
        or mount fails (its message in the error).
        """
        raise NotImplementedError

    def unmount(self, target: str) -> None:
        """Unmount ``target``; a no-op when nothing is mounted there.

        :class:`~pgsnap.errors.MountBusyError` naming the processes that hold
        the file system when the kernel refuses (EBUSY).
        """
        raise NotImplementedError

    def wait_for_device(self, path: str, *, timeout: float = 60.0) -> str:
        """Wait until the device node ``path`` exists; return its resolved path.

        :class:`~pgsnap.errors.DeviceNotFound` after ``timeout`` seconds.
        """
        raise NotImplementedError
