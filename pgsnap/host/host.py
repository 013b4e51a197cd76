"""The :class:`Host`: files, processes and mounts on one machine, over a Runner."""

from __future__ import annotations

import enum
import json
import logging
import os
import posixpath
import pwd
import re
import socket
import stat as _stat
import time
from collections.abc import Sequence
from typing import Final

from pgsnap._attrs import frozen
from pgsnap.errors import (
    DeviceNotFound,
    HostError,
    HostFileNotFound,
    InputError,
    MountBusyError,
    MountError,
)
from pgsnap.host.runners import CommandResult, LocalRunner, Runner
from pgsnap.model import Mount

__all__ = ["FileInfo", "FileKind", "Host", "ProcessInfo", "mount_holding"]

_log = logging.getLogger(__name__)


class FileKind(enum.Enum):
    """What a path on the host is."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    """Only from ``stat(path, follow=False)`` on a symbolic link."""
    OTHER = "other"
    """A device node, socket or pipe."""


@frozen
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


@frozen
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

    Every method runs its commands through :meth:`run` (argument lists, or a
    fixed ``sh -c`` script with the data as its arguments and standard input;
    GNU coreutils, util-linux and ``/proc`` on the host) and never touches
    files from Python (but :meth:`mounts` on this machine): it works the same
    through any runner, and a subclass that overrides :meth:`run` sees every
    command. Paths should be absolute
    (relative ones are taken from ``/``).
    """

    def __init__(self, runner: Runner | None = None, *, name: str | None = None) -> None:
        if runner is None:
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
        result = self._runner.run(argv, user=user, stdin=stdin, timeout=timeout)
        if check:
            result.check(host=self.description)
        return result

    def _script(
        self,
        script: str,
        args: Sequence[str],
        *,
        stdin: bytes | None = None,
        user: str | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run a fixed ``sh -c`` script with data only in ``args`` and ``stdin``."""
        return self.run(
            ["sh", "-c", script, "sh", *args], user=user, stdin=stdin, timeout=timeout, check=False
        )

    def _file_error(
        self, result: CommandResult, path: str, *, what: str | None = None
    ) -> HostError:
        """The error for a failed file command: missing path, permission, or else."""
        err = result.error_text
        if any(reason in err for reason in _MISSING):
            return self._missing(path)
        if "Permission denied" in err:
            return result.error(
                what=what,
                host=self.description,
                hint=f"the user running the command may not access {path}: "
                "run it as the file's owner (user=...) or run pgsnap as root",
            )
        return result.error(what=what, host=self.description)

    def _missing(self, path: str) -> HostFileNotFound:
        return HostFileNotFound(
            f"{path} does not exist on {self.description}",
            path=path,
            host=self.description,
        )

    @property
    def local(self) -> bool:
        """Whether the runner is this machine's own (a :class:`LocalRunner`, not a
        subclass, not a test's): then the file methods that read ask the kernel in
        this process, for what a command there would print (a process each costs
        3-6 ms; a recovery asked about 50 such questions), and a backend may read
        its own files so too. A failure other than a missing file runs the command
        after all, so errors read the same on every host."""
        return type(self._runner) is LocalRunner

    # ------------------------------------------------------------------ files

    def read_bytes(
        self, path: str, *, offset: int = 0, limit: int | None = None, user: str | None = None
    ) -> bytes:
        """The file's bytes from ``offset`` (at most ``limit`` of them).

        :class:`~pgsnap.errors.HostFileNotFound` when it does not exist; a
        :class:`~pgsnap.errors.CommandError` with a hint when it may not be read.
        """
        _check_path(path)
        if offset < 0 or (limit is not None and limit < 0):
            raise InputError(f"offset and limit must not be negative (got {offset}, {limit})")
        if limit == 0:
            return b""
        if user is None and self.local:
            try:
                with open(_from_root(path), "rb") as fh:
                    fh.seek(offset)
                    return fh.read() if limit is None else fh.read(limit)
            except FileNotFoundError:
                raise self._missing(path) from None
            except OSError:
                pass  # the command's error says why, as on any host
        argv = ["dd", f"if={path}", "iflag=skip_bytes,count_bytes", "bs=65536", f"skip={offset}"]
        if limit is not None:
            argv.append(f"count={limit}")
        argv.append("status=none")
        result = self.run(argv, user=user, timeout=300.0, check=False)
        if not result.ok:
            raise self._file_error(result, path, what=f"reading {path}")
        return result.stdout

    def read_text(self, path: str, *, user: str | None = None) -> str:
        """The whole file as text (UTF-8, undecodable bytes kept as surrogates)."""
        return self.read_bytes(path, user=user).decode("utf-8", "surrogateescape")

    def stat(self, path: str, *, follow: bool = True) -> FileInfo | None:
        """What the path is (None when it does not exist).

        With ``follow`` a symbolic link is described by what it points to (a
        dangling one does not exist); without it, the link itself
        (:attr:`FileKind.SYMLINK`).
        """
        _check_path(path)
        if self.local:
            try:
                st = os.stat(_from_root(path), follow_symlinks=follow)
            except FileNotFoundError:
                return None
            except OSError:
                pass  # the command's error says why, as on any host
            else:
                try:
                    owner = pwd.getpwuid(st.st_uid).pw_name
                except KeyError:
                    owner = str(st.st_uid)
                return FileInfo(
                    path=path,
                    kind=_kind(st.st_mode),
                    size=st.st_size,
                    mode=_stat.S_IMODE(st.st_mode),
                    uid=st.st_uid,
                    gid=st.st_gid,
                    owner=owner,
                )
        argv = [
            "stat",
            *(["-L"] if follow else []),
            "--printf",
            r"%f\0%s\0%u\0%g\0%U\0",
            "--",
            path,
        ]
        result = self.run(argv, check=False)
        if not result.ok:
            error = self._file_error(result, path, what=f"stat {path}")
            if isinstance(error, HostFileNotFound):
                return None
            raise error
        fields = result.stdout.split(b"\0")
        if len(fields) < 5:
            raise HostError(
                f"unexpected output of stat for {path}: {result.stdout[:200]!r}",
                host=self.description,
            )
        raw_mode = int(fields[0], 16)
        uid = int(fields[2])
        owner = fields[4].decode("utf-8", "surrogateescape")
        return FileInfo(
            path=path,
            kind=_kind(raw_mode),
            size=int(fields[1]),
            mode=_stat.S_IMODE(raw_mode),
            uid=uid,
            gid=int(fields[3]),
            owner=str(uid) if owner == "UNKNOWN" else owner,
        )

    def exists(self, path: str) -> bool:
        """True when the path exists (a dangling symlink does not)."""
        _check_path(path)
        if self.local:
            return os.path.exists(_from_root(path))  # as test -e: False on any failure
        result = self.run(["test", "-e", path], check=False)
        if result.returncode in (0, 1):
            return result.ok
        raise result.error(what=f"checking whether {path} exists", host=self.description)

    def realpath(self, path: str) -> str:
        """The path with every symlink resolved (missing components allowed)."""
        _check_path(path)
        if self.local:
            here = _realpath_here(path)
            if here is not None:
                return here
        result = self.run(["realpath", "-m", "-z", "--", path], check=False)
        if not result.ok:
            raise self._file_error(result, path, what=f"resolving {path}")
        return result.stdout.rstrip(b"\0").decode("utf-8", "surrogateescape")

    def realpaths(self, paths: Sequence[str]) -> tuple[str, ...]:
        """:meth:`realpath` of several paths in one command, in their order (a
        subclass that overrides :meth:`realpath` gets it called per path)."""
        items = list(paths)
        if type(self).realpath is not Host.realpath:
            return tuple(self.realpath(p) for p in items)
        return self._realpaths(items)

    def _realpaths(self, items: Sequence[str]) -> tuple[str, ...]:
        """:meth:`realpaths` in one ``realpath`` command, whatever a subclass does."""
        for path in items:
            _check_path(path)
        if not items:
            return ()
        if self.local:
            resolved = [_realpath_here(p) for p in items]
            if all(r is not None for r in resolved):
                return tuple(r for r in resolved if r is not None)
        result = self.run(["realpath", "-m", "-z", "--", *items], check=False)
        if not result.ok:
            raise self._file_error(result, items[0], what=f"resolving {', '.join(items)}")
        out = result.stdout.split(b"\0")
        if out and out[-1] == b"":
            out.pop()
        if len(out) != len(items):
            raise HostError(
                f"realpath gave {len(out)} paths for {len(items)} on {self.description}",
                host=self.description,
            )
        return tuple(o.decode("utf-8", "surrogateescape") for o in out)

    def list_dir(self, path: str) -> tuple[str, ...]:
        """The names in a directory, sorted (``.`` and ``..`` left out).

        Names may hold any character but ``/`` and NUL (spaces, newlines).
        :class:`~pgsnap.errors.HostFileNotFound` when the directory does not
        exist; a :class:`~pgsnap.errors.HostError` when ``path`` is not a
        directory. A symbolic link to a directory is listed.
        """
        _check_path(path)
        if self.local:
            try:
                return tuple(sorted(os.listdir(_from_root(path))))
            except FileNotFoundError:
                raise self._missing(path) from None
            except OSError:
                pass  # not a directory, not readable...: the command's error says why
        argv = ["find", "-H", _operand(path), "-maxdepth", "1", "-printf", r"%d %y %f\0"]
        result = self.run(argv, timeout=300.0, check=False)
        if not result.ok:
            raise self._file_error(result, path, what=f"listing {path}")
        records = result.stdout.split(b"\0")[:-1]
        if not records or not records[0].startswith(b"0 "):
            raise HostError(
                f"unexpected output listing {path}: {result.stdout[:200]!r}",
                host=self.description,
            )
        if records[0][2:3] != b"d":
            raise HostError(
                f"{path} is not a directory on {self.description}",
                host=self.description,
                path=path,
            )
        names = (r[4:].decode("utf-8", "surrogateescape") for r in records[1:])
        return tuple(sorted(names))

    def list_dirs(self, paths: Sequence[str]) -> dict[str, tuple[str, ...] | None]:
        """:meth:`list_dir` of several directories in one command: each path's names,
        sorted, or None for a path that does not exist. A path that is not a
        directory, or cannot be read, raises as :meth:`list_dir` does."""
        for path in paths:
            _check_path(path)
        wanted = list(dict.fromkeys(paths))
        if self.local or len(wanted) < 2:
            return {path: self._listed_or_none(path) for path in wanted}
        operands = {_operand(path): path for path in wanted}
        argv = ["find", "-H", *operands, "-maxdepth", "1", "-printf", r"%H\0%d %y %f\0"]
        result = self.run(argv, timeout=300.0, check=False)
        if not result.ok:  # one is missing, or not readable: each asked alone says which
            return {path: self._listed_or_none(path) for path in wanted}
        names: dict[str, list[str]] = {path: [] for path in wanted}
        kinds: dict[str, bytes] = {}
        fields = result.stdout.split(b"\0")[:-1]
        for start, record in zip(fields[::2], fields[1::2], strict=True):
            listed = operands.get(start.decode("utf-8", "surrogateescape"))
            if listed is None:
                raise HostError(
                    f"unexpected output listing {', '.join(wanted)}: {result.stdout[:200]!r}",
                    host=self.description,
                )
            if record.startswith(b"0 "):
                kinds[listed] = record[2:3]
            else:
                names[listed].append(record[4:].decode("utf-8", "surrogateescape"))
        for path in wanted:
            if kinds.get(path) != b"d":
                return {path: self._listed_or_none(path) for path in wanted}
        return {path: tuple(sorted(names[path])) for path in wanted}

    def _listed_or_none(self, path: str) -> tuple[str, ...] | None:
        try:
            return self.list_dir(path)
        except HostFileNotFound:
            return None

    def read_heads(self, directory: str, size: int) -> dict[str, bytes]:
        """The first ``size`` bytes of every regular file in ``directory``, by name.

        One round trip for the whole directory (a ``pg_wal`` of hundreds of
        segments), symbolic links not followed. :class:`~pgsnap.errors.HostFileNotFound`
        when the directory does not exist.
        """
        _check_path(directory)
        if not 0 < size <= 65536:
            raise InputError(f"read_heads reads 1 to 65536 bytes per file, not {size}")
        if self.local:
            return self._read_heads_here(directory, size)
        args = [_operand(directory), str(size)]
        result = self._script(_HEADS_SCRIPT, args, timeout=300.0)
        if not result.ok:
            raise self._file_error(result, directory, what=f"reading the files of {directory}")
        heads = _parse_heads(result.stdout, size)
        if heads is not None:
            return heads
        # The files changed between the listing and the reading, or head is not GNU
        # head: read them again one by one (a process per file).
        _log.debug("%s: reading the files of %s one by one", self.description, directory)
        result = self._script(_HEADS_EACH_SCRIPT, args, timeout=300.0)
        if not result.ok:
            raise self._file_error(result, directory, what=f"reading the files of {directory}")
        fields = result.stdout.split(b"\0")[:-1]
        heads = {}
        for name, hexed in zip(fields[::2], fields[1::2], strict=True):
            heads[name.decode("utf-8", "surrogateescape")] = bytes.fromhex(hexed.decode())
        return heads

    def _read_heads_here(self, directory: str, size: int) -> dict[str, bytes]:
        """:meth:`read_heads` on this machine, in-process (a process per file costs
        more than reading it: a pg_wal of 257 segments took 0.65 s through the script)."""
        heads: dict[str, bytes] = {}
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        with open(entry.path, "rb") as f:
                            heads[entry.name] = f.read(size)
                    except OSError:
                        continue  # vanished or unreadable: as the script's head 2>/dev/null
        except FileNotFoundError:
            raise HostFileNotFound(
                f"{directory} does not exist on {self.description}",
                path=directory,
                host=self.description,
            ) from None
        except OSError as exc:
            raise HostError(
                f"reading the files of {directory} on {self.description} failed: "
                f"{exc.strerror or exc}",
                hint="check the path and its permissions",
                host=self.description,
            ) from None
        return heads

    def write_atomic(
        self, path: str, data: bytes, *, mode: int = 0o600, owner: str | None = None
    ) -> None:
        """Replace ``path`` with ``data``: readers see the old file or the new one.

        A temporary file in the same directory, fsynced, given ``mode`` and
        ``owner`` (``"postgres"``: that user and its login group, or
        ``"uid:gid"``; another owner than oneself needs root), renamed over
        ``path`` (a symbolic link there is replaced, not followed), and the
        directory fsynced. :class:`~pgsnap.errors.HostFileNotFound` when the
        directory does not exist; the temporary file never stays behind.
        """
        _check_path(path)
        if not 0 <= mode <= 0o7777:
            raise InputError(f"invalid file mode {mode:o}")
        chown = ""
        if owner is not None:
            _check_owner(owner)
            chown = owner if ":" in owner else f"{owner}:"
        directory = posixpath.dirname(path.rstrip("/")) or ("/" if path.startswith("/") else ".")
        result = self._script(
            _WRITE_SCRIPT,
            [_operand(path), _operand(directory), format(mode, "o"), chown],
            stdin=bytes(data),
            timeout=300.0,
        )
        if not result.ok:
            raise self._file_error(result, path, what=f"writing {path}")

    def remove(self, paths: Sequence[str], *, recursive: bool = False) -> None:
        """Remove the paths (a symlink itself, never what it points to); missing ones are fine.

        ``recursive`` removes directories with their contents and stays on
        their file system (``rm --one-file-system``): a file system mounted
        below is never emptied. Trailing slashes are dropped (``link/`` would
        otherwise name the linked directory); ``/`` is refused.
        """
        if isinstance(paths, str):
            raise InputError("remove() takes a sequence of paths, not a string")
        operands: list[str] = []
        for path in paths:
            _check_path(path)
            stripped = path.rstrip("/")
            if not stripped:
                raise InputError(f"refusing to remove {path!r}")
            operands.append(_operand(stripped))
        if not operands:
            return
        flags = ["-rf", "--one-file-system"] if recursive else ["-f"]
        result = self.run(["rm", *flags, "--", *operands], timeout=600.0, check=False)
        if not result.ok:
            raise result.error(what=f"removing {', '.join(paths)}", host=self.description)

    def make_dirs(self, path: str, *, mode: int = 0o700, owner: str | None = None) -> None:
        """Create the directory and its parents; an existing one is fine.

        ``mode`` and ``owner`` (as for :meth:`write_atomic`) are given to the
        directory when this call creates it; missing parents get the usual
        mode (``mkdir -p``); an existing directory is left as it is.
        """
        _check_path(path)
        if not 0 <= mode <= 0o7777:
            raise InputError(f"invalid directory mode {mode:o}")
        chown = ""
        if owner is not None:
            _check_owner(owner)
            chown = owner if ":" in owner else f"{owner}:"
        result = self._script(_MKDIR_SCRIPT, [_operand(path), format(mode, "o"), chown])
        if not result.ok:
            raise result.error(what=f"creating directory {path}", host=self.description)

    # ------------------------------------------------------------------ processes

    def process(self, pid: int) -> ProcessInfo | None:
        """The process with ``pid`` (None when there is none)."""
        found = self._processes([pid])
        return found[0] if found else None

    def _processes(self, pids: Sequence[int]) -> tuple[ProcessInfo, ...]:
        """The processes among ``pids`` that exist, in the order given."""
        for pid in pids:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                raise InputError(f"invalid process id {pid!r}")
        if not pids:
            return ()
        result = self._script(_PROCESSES_SCRIPT, [str(pid) for pid in pids])
        if not result.ok:
            raise result.error(what="reading processes from /proc", host=self.description)
        fields = result.stdout.split(b"\0")
        found: list[ProcessInfo] = []
        for i in range(0, len(fields) - 3, 4):
            pid_text, user, stat_line, cwd = fields[i : i + 4]
            found.append(
                _process_info(
                    int(pid_text),
                    user.decode("utf-8", "surrogateescape"),
                    stat_line.decode("utf-8", "surrogateescape"),
                    cwd.decode("utf-8", "surrogateescape"),
                )
            )
        return tuple(found)

    def processes_using(self, path: str) -> tuple[ProcessInfo, ...]:
        """Processes whose working directory, root, open files or mapped files lie
        under ``path``, by pid.

        A scan of ``/proc`` on the host (no ``lsof`` or ``fuser`` needed),
        leaving out the scan itself. Processes of other users are seen only
        when pgsnap runs as root there.
        """
        real = self.realpath(path)
        base = real.rstrip("/")
        patterns = [_glob_escape(real), _glob_escape(base) + "/*", _glob_escape(real) + _DELETED]
        result = self._script(_USING_SCRIPT, patterns, timeout=300.0)
        if not result.ok:
            raise result.error(what=f"finding processes using {path}", host=self.description)
        links, _, maps = result.stdout.partition(b"\0" + _MAPS_MARKER + b"\0")
        records = links.split(b"\0")
        own = int(records[0])
        pids: set[int] = set()
        for record in records[1:]:
            parts = record.split(b"/")
            if len(parts) > 2 and parts[2].isdigit():
                pids.add(int(parts[2]))
        pids.update(_pids_mapping(maps.decode("utf-8", "surrogateescape"), real))
        pids.discard(own)
        return self._processes(sorted(pids))

    # ------------------------------------------------------------------ mounts

    def mounts(self) -> tuple[Mount, ...]:
        """Every mounted file system (``findmnt --json``; ``/proc/self/mountinfo``
        where findmnt is missing), in the kernel's order (the last of several
        mounts on one target is the visible one).

        ``source`` is as findmnt shows it: a bind mount or a btrfs subvolume
        carries the mounted directory in brackets (``/dev/sdb[/snap]``).

        On this machine, through the default runner and :meth:`run` as it is,
        the table is read from ``/proc/self/mountinfo`` without a command (the
        kernel's table findmnt reads: about 7 ms less, for every look a backup
        takes at its volumes); a subclass that overrides :meth:`run` still sees
        the command.
        """
        if type(self._runner) is LocalRunner and type(self).run is Host.run:
            try:
                with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
                    return _parse_mountinfo(f.read())
            except OSError as exc:  # no /proc: as a remote host is asked
                _log.debug("mounts: /proc/self/mountinfo unreadable (%s); asking findmnt", exc)
        result = self.run(["findmnt", "--json", "--list", "-o", _FINDMNT_COLUMNS], check=False)
        if result.returncode == 127:
            fallback = self.run(["cat", "/proc/self/mountinfo"], check=False)
            if not fallback.ok:
                raise fallback.error(what="reading /proc/self/mountinfo", host=self.description)
            return _parse_mountinfo(fallback.text)
        if not result.ok:
            raise result.error(what="listing mounts (findmnt)", host=self.description)
        return _parse_findmnt(result.text, self.description)

    def mount_of(self, path: str) -> Mount | None:
        """The mount that holds ``path`` (the longest mount point above its real path)."""
        return mount_holding(self.realpath(path), self.mounts())

    def mount(
        self, source: str, target: str, *, fstype: str | None = None, options: Sequence[str] = ()
    ) -> None:
        """Mount ``source`` on ``target``; a no-op when exactly that is mounted already.

        "Exactly that": the same device (symlinks such as ``/dev/disk/by-id/...``
        and ``UUID=...`` resolved), the same subvolume (``subvol=``), the same
        directory for a bind mount, and not read-only when ``rw`` is asked or
        the reverse. :class:`~pgsnap.errors.MountError` when something else
        is mounted there or mount fails (its message in the error).
        """
        _check_path(source)
        _check_path(target)
        if isinstance(options, str):
            raise InputError("mount options are a sequence, e.g. ('noatime', 'ro')")
        opts = tuple(options)
        for option in opts:
            if not option or "," in option or any(c in option for c in "\0\n"):
                raise InputError(f"invalid mount option {option!r}")
        real_target = self.realpath(target)
        on_target = [m for m in self.mounts() if m.target == real_target]
        if on_target:
            top = on_target[-1]
            reason = self._mount_difference(top, source, fstype, opts, real_target)
            if reason is None:
                _log.debug("%s: %s already mounted on %s", self.description, source, target)
                return
            raise MountError(
                f"cannot mount {source} on {target} ({self.description}): {reason}",
                target=target,
                host=self.description,
                hint=f"unmount {target} first if it should be replaced",
                mounted=top.source,
            )
        argv = ["mount"]
        if fstype:
            argv += ["-t", fstype]
        if opts:
            argv += ["-o", ",".join(opts)]
        argv += ["--", source, real_target]
        result = self.run(argv, timeout=300.0, check=False)
        if not result.ok:
            hint = None
            if "does not exist" in result.error_text and "mount point" in result.error_text:
                hint = f"create the mount point first (make_dirs({target!r}))"
            raise MountError(
                f"mounting {source} on {target} failed ({self.description}): "
                f"{result.error_text or f'exit status {result.returncode}'}",
                target=target,
                host=self.description,
                hint=hint,
                returncode=result.returncode,
            )
        _log.debug("%s: mounted %s on %s", self.description, source, target)

    def _mount_difference(
        self,
        existing: Mount,
        source: str,
        fstype: str | None,
        options: tuple[str, ...],
        real_target: str,
    ) -> str | None:
        """Why ``existing`` is not what mounting ``source`` with ``options`` would give."""
        there = f"{existing.source} ({existing.fstype}) is mounted there"
        if "ro" in options and "ro" not in existing.options:
            return f"{there} read-write, not read-only"
        if "rw" in options and "ro" in existing.options:
            return f"{there} read-only, not read-write"
        if "bind" in options or "rbind" in options:
            result = self.run(
                ["stat", "-L", "--printf", r"%d:%i\0", "--", source, real_target], check=False
            )
            fields = result.stdout.split(b"\0")
            if result.ok and len(fields) >= 2 and fields[0] == fields[1]:
                return None
            return there
        if fstype and fstype != "auto" and existing.fstype and fstype != existing.fstype:
            return there
        device, fsroot = _split_fsroot(existing.source)
        subvolid = next((o for o in options if o.startswith("subvolid=")), None)
        if subvolid is not None:
            if subvolid not in existing.options:
                return there
        else:
            wanted = next((o[len("subvol=") :] for o in options if o.startswith("subvol=")), "/")
            if _norm_root(wanted) != _norm_root(fsroot):
                return there
        if self._resolve_source(source) != self._resolve_source(device):
            return there
        return None

    def _resolve_source(self, source: str) -> str:
        """A mount source as a real device path (tags resolved with findfs)."""
        if _TAG.match(source):
            result = self.run(["findfs", source], check=False)
            if result.ok and result.text.strip():
                source = result.text.strip()
        if source.startswith("/"):
            return self.realpath(source)
        return source

    def unmount(self, target: str) -> None:
        """Unmount ``target``; a no-op when nothing is mounted there.

        :class:`~pgsnap.errors.MountBusyError` naming the processes that hold
        the file system when the kernel refuses (EBUSY);
        :class:`~pgsnap.errors.MountError` when umount fails otherwise.
        """
        _check_path(target)
        real = self.realpath(target)
        mounts = self.mounts()
        if not any(m.target == real for m in mounts):
            _log.debug("%s: nothing mounted on %s", self.description, target)
            return
        result = self.run(["umount", "--", real], timeout=300.0, check=False)
        if result.ok:
            _log.debug("%s: unmounted %s", self.description, target)
            return
        err = result.error_text
        if "busy" in err:
            holders = tuple(str(p) for p in self.processes_using(real))
            nested = [m.target for m in mounts if m.target != real and _is_under(m.target, real)]
            held = "; ".join(holders) if holders else "no process found holding it"
            hint = "stop those processes (a PostgreSQL server: stop it first), then unmount again"
            if nested:
                hint += f"; file systems mounted below it: {', '.join(nested)}"
            elif not holders:
                hint = (
                    "something other than a process holds it (a mount below it, a loop "
                    "device, swap, an NFS export): release it, then unmount again"
                )
            raise MountBusyError(
                f"cannot unmount {target} on {self.description}: it is busy ({held})",
                target=target,
                holders=holders,
                host=self.description,
                hint=hint,
            )
        raise MountError(
            f"unmounting {target} failed ({self.description}): "
            f"{err or f'exit status {result.returncode}'}",
            target=target,
            host=self.description,
            returncode=result.returncode,
        )

    def wait_for_device(self, path: str, *, timeout: float = 60.0) -> str:
        """Wait until the device node ``path`` exists; return its resolved path.

        Polls ``test -e`` every 0.05 s at first, the pause growing to 0.5 s.
        :class:`~pgsnap.errors.DeviceNotFound` after ``timeout`` seconds.
        """
        _check_path(path)
        deadline = time.monotonic() + timeout
        pause = _POLL_FIRST
        while True:
            if self.exists(path):
                return self.realpath(path)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeviceNotFound(
                    f"device {path} did not appear on {self.description} within {timeout:g} s",
                    device=path,
                    host=self.description,
                    hint="check that the volume is attached (mapped) to this host and "
                    "that the device path is right (lsblk, ls -l /dev/disk/by-id)",
                    timeout=timeout,
                )
            time.sleep(min(pause, remaining))
            pause = min(pause * 1.5, _POLL_MAX)


# --------------------------------------------------------------------------- helpers

_MISSING: Final = ("No such file or directory", "Not a directory")
_DELETED: Final = " (deleted)"
_MAPS_MARKER: Final = b"pgsnap-maps"
_FINDMNT_COLUMNS: Final = "SOURCE,TARGET,FSTYPE,OPTIONS"
_POLL_FIRST: Final = 0.05
_POLL_MAX: Final = 0.5
_TAG = re.compile(r"(?:UUID|LABEL|PARTUUID|PARTLABEL)=")
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")

# write_atomic: $1 target, $2 its directory, $3 mode (octal), $4 chown spec or "";
# the data on stdin. The temporary file is removed if anything fails.
_WRITE_SCRIPT: Final = """set -eu
target=$1 dir=$2 mode=$3 owner=$4
tmp=$(mktemp -- "$dir/.pgsnap-write.XXXXXXXX")
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp"
chmod -- "$mode" "$tmp"
if [ -n "$owner" ]; then chown -- "$owner" "$tmp"; fi
sync -- "$tmp"
mv -f -T -- "$tmp" "$target"
trap - EXIT
sync -- "$dir"
"""

# read_heads: $1 directory, $2 byte count. Every regular file (links not followed)
# as "name NUL size NUL", an empty field, then what GNU ``head -v -c`` prints of them
# all (each file's first bytes after a "==> ./name <==" line), in hex (od's lines,
# whose spaces and newlines bytes.fromhex skips). Four processes, however many files
# (a pg_wal holds hundreds): :func:`_parse_heads` takes it apart with the sizes, and
# finds it does not add up when a file changed meanwhile, when find split the files
# over two head runs (thousands of files), or when head is another head: then the
# files are read one by one (:data:`_HEADS_EACH_SCRIPT`).
_HEADS_SCRIPT: Final = r"""set -e
[ -d "$1" ] || { ls -d -- "$1" >/dev/null; exit 2; }
cd -- "$1"
find . -mindepth 1 -maxdepth 1 -type f -printf '%f\0%s\0'
printf '\0'
find . -mindepth 1 -maxdepth 1 -type f -exec head -v -c "$2" -- {} + 2>/dev/null | od -An -v -tx1
"""

# read_heads, file by file (when the above does not add up): for each regular
# file, its name NUL, its first bytes in hex NUL. A process (od) per file.
_HEADS_EACH_SCRIPT: Final = r"""set -e
[ -d "$1" ] || { ls -d -- "$1" >/dev/null; exit 2; }
find -H "$1" -mindepth 1 -maxdepth 1 -type f -exec sh -c '
  n=$1; shift
  for f do
    printf "%s\0" "${f##*/}"
    od -An -v -tx1 -N "$n" -- "$f" 2>/dev/null || :
    printf "\0"
  done' sh "$2" {} +
"""

# make_dirs: $1 path, $2 mode (octal), $3 chown spec or "".
_MKDIR_SCRIPT: Final = """set -eu
if [ -d "$1" ]; then exit 0; fi
mkdir -p -m "$2" -- "$1"
if [ -n "$3" ]; then chown -- "$3" "$1"; fi
"""

# process info: for each pid argument, "pid NUL user NUL stat-line NUL cwd+'x' NUL"
# (cwd empty when it cannot be read); vanished processes are left out.
_PROCESSES_SCRIPT: Final = r"""for pid do
  p=/proc/$pid
  st=$(cat -- "$p/stat" 2>/dev/null) || continue
  euid=
  while read -r key real eff rest; do
    if [ "$key" = Uid: ]; then euid=$eff; break; fi
  done 2>/dev/null < "$p/status"
  user=$euid
  if [ -n "$euid" ]; then user=$(id -nu -- "$euid" 2>/dev/null) || user=$euid; fi
  cwd=$(readlink -n -- "$p/cwd" 2>/dev/null && printf x) || cwd=
  printf '%s\0%s\0%s\0%s\0' "$pid" "$user" "$st" "$cwd"
done
"""

# processes_using: $1..$3 glob patterns of the path (itself, below it, deleted).
# Prints the scanning shell's pid, then each matching /proc/PID/{cwd,root,fd/N,
# map_files/R} link. map_files can only be read by root: other users also get
# the text of every readable /proc/PID/maps after a marker.
_USING_SCRIPT: Final = r"""printf '%s\0' "$$"
find /proc/[0-9]*/cwd /proc/[0-9]*/root /proc/[0-9]*/fd /proc/[0-9]*/map_files \
  -maxdepth 1 -type l \( -lname "$1" -o -lname "$2" -o -lname "$3" \) -printf '%p\0' 2>/dev/null
rc=$?
[ "$rc" -le 1 ] || exit "$rc"
if [ "$(id -u)" != 0 ]; then
  printf '\0pgsnap-maps\0'
  tail -n +1 -- /proc/[0-9]*/maps 2>/dev/null
fi
exit 0
"""


def _check_path(path: str) -> None:
    if not isinstance(path, str) or not path:
        raise InputError(f"invalid path {path!r}")
    if "\0" in path:
        raise InputError("a path cannot contain a NUL byte")


def _check_owner(owner: str) -> None:
    if not owner or owner.startswith("-") or any(c.isspace() or c == "\0" for c in owner):
        raise InputError(f"invalid owner {owner!r} (a user name, or uid:gid)")


def _operand(path: str) -> str:
    """``path`` safe as an operand of commands that read options (``-x`` → ``./-x``)."""
    return path if path.startswith(("/", "./", "../")) else f"./{path}"


def _parse_heads(out: bytes, size: int) -> dict[str, bytes] | None:
    """The files' first ``size`` bytes from :data:`_HEADS_SCRIPT`'s output, by name; None
    when it does not add up (a file added, removed or resized between the listing and
    head, a file head could not read, the files split over two head runs, or a head
    that writes otherwise)."""
    if out.startswith(b"\0"):
        listing, rest = b"", out[1:]
    else:
        listing, sep, rest = out.partition(b"\0\0")
        if not sep:
            return None
    fields = listing.split(b"\0") if listing else []
    if len(fields) % 2:
        return None
    try:
        data = bytes.fromhex(rest.decode("ascii"))
    except ValueError:
        return None
    heads: dict[str, bytes] = {}
    at = 0
    for name, length in zip(fields[::2], fields[1::2], strict=True):
        if not length.isdigit():
            return None
        # Between two files a newline, always: where find split the files over two
        # head runs there is none, and where a file shrank by a byte it was read as
        # the file's: both are refused.
        header = (b"\n" if heads else b"") + b"==> ./" + name + b" <==\n"
        if not data.startswith(header, at):
            return None
        at += len(header)
        end = at + min(size, int(length))
        heads[name.decode("utf-8", "surrogateescape")] = data[at:end]
        at = end
    return heads if at == len(data) else None  # (past the end: a file shrank)


def _from_root(path: str) -> str:
    """``path`` as a command run with ``cwd="/"`` (as the runners do) sees it."""
    return path if path.startswith("/") else "/" + path


def _realpath_here(path: str) -> str | None:
    """``realpath -m`` of ``path`` in this process, for a path that exists; None
    for one that does not or cannot be resolved (then the command answers: it
    resolves missing components its own way, and says why a path cannot be)."""
    try:
        return os.path.realpath(_from_root(path), strict=True)
    except OSError:
        return None


def _kind(raw_mode: int) -> FileKind:
    if _stat.S_ISREG(raw_mode):
        return FileKind.FILE
    if _stat.S_ISDIR(raw_mode):
        return FileKind.DIRECTORY
    if _stat.S_ISLNK(raw_mode):
        return FileKind.SYMLINK
    return FileKind.OTHER


def _process_info(pid: int, user: str, stat_line: str, cwd: str) -> ProcessInfo:
    """A :class:`ProcessInfo` from ``/proc/PID/stat`` (``pid (comm) S ...``)."""
    open_paren, close_paren = stat_line.find("("), stat_line.rfind(")")
    command = stat_line[open_paren + 1 : close_paren] if 0 <= open_paren < close_paren else ""
    state = stat_line[close_paren + 1 :].strip()[:1] if close_paren >= 0 else ""
    return ProcessInfo(
        pid=pid,
        user=user,
        command=command,
        cwd=cwd[:-1] if cwd.endswith("x") else None,
        zombie=state in ("Z", "X"),
    )


def _glob_escape(text: str) -> str:
    """``text`` as a find ``-lname`` pattern matching only itself."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def mount_holding(real_path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount among ``mounts`` (:meth:`Host.mounts`) that holds ``real_path`` (a
    path with its symlinks resolved): the longest mount point above it, the last
    of several on one target."""
    best: Mount | None = None
    for mount in mounts:
        if _is_under(real_path, mount.target) and (
            best is None or len(mount.target) >= len(best.target)
        ):
            best = mount
    return best


def _is_under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it, by whole path components."""
    if directory == "/":
        return path.startswith("/")
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _pids_mapping(maps: str, real: str) -> set[int]:
    """Pids whose ``/proc/PID/maps`` (``tail`` output with headers) map a file under ``real``."""
    pids: set[int] = set()
    current: int | None = None
    for line in maps.splitlines():
        if line.startswith("==> /proc/") and line.endswith("/maps <=="):
            part = line[len("==> /proc/") : -len("/maps <==")]
            current = int(part) if part.isdigit() else None
            continue
        fields = line.split(maxsplit=5)
        if current is None or len(fields) < 6:
            continue
        mapped = fields[5].replace("\\012", "\n")
        mapped = mapped.removesuffix(_DELETED)
        if _is_under(mapped, real):
            pids.add(current)
    return pids


def _unescape(field: bytes) -> str:
    """A ``/proc/self/mountinfo`` field with its octal escapes (``\\040``) decoded."""
    raw = _OCTAL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field)
    return raw.decode("utf-8", "surrogateescape")


def _parse_mountinfo(text: str) -> tuple[Mount, ...]:
    """Mounts from ``/proc/self/mountinfo``, shaped as findmnt shows them."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.encode("utf-8", "surrogateescape").split(b" ")
        if b"-" not in fields:
            continue
        sep = fields.index(b"-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        root, target, vfs_options = fields[3], fields[4], fields[5]
        fstype, source = fields[sep + 1], fields[sep + 2]
        super_options = fields[sep + 3] if len(fields) > sep + 3 else b""
        options = [o for o in _unescape(vfs_options).split(",") if o]
        options += [o for o in _unescape(super_options).split(",") if o and o not in ("rw", "ro")]
        src = _unescape(source)
        fsroot = _unescape(root)
        if fsroot != "/":
            src = f"{src}[{fsroot}]"
        mounts.append(
            Mount(source=src, target=_unescape(target), fstype=_unescape(fstype), options=options)
        )
    return tuple(mounts)


def _parse_findmnt(text: str, host: str) -> tuple[Mount, ...]:
    """Mounts from ``findmnt --json --list -o SOURCE,TARGET,FSTYPE,OPTIONS``."""
    try:
        data = json.loads(text)
        rows = data["filesystems"]
        return tuple(
            Mount(
                source=str(row.get("source") or ""),
                target=str(row.get("target") or ""),
                fstype=str(row.get("fstype") or ""),
                options=[o for o in str(row.get("options") or "").split(",") if o],
            )
            for row in rows
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HostError(f"cannot parse the output of findmnt --json: {exc}", host=host) from exc


def _split_fsroot(source: str) -> tuple[str, str]:
    """``("/dev/sdb", "/snap")`` from findmnt's ``/dev/sdb[/snap]``; root ``/`` when none."""
    if source.endswith("]") and "[" in source:
        cut = source.rfind("[")
        return source[:cut], source[cut + 1 : -1]
    return source, "/"


def _norm_root(root: str) -> str:
    return "/" + root.strip("/")
