"""Command results and the local runner.

:class:`CommandResult` is what every :class:`~pgsnap.protocols.Runner`
returns. :class:`LocalRunner` runs commands on this machine with
``subprocess``, as another OS user through ``runuser`` (or ``setpriv``) when
pgsnap runs as root.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import CommandError, CommandTimeout, ConfigurationError, HostError

__all__ = ["CommandResult", "LocalRunner", "Runner"]

_log = logging.getLogger(__name__)

_KILL_GRACE = 5.0
"""Seconds to wait for the output of a killed process group before giving up on it."""


def _argv(values: Sequence[str]) -> tuple[str, ...]:
    return tuple(values)


@frozen
class CommandResult:
    """A finished command: its arguments, exit status and output (bytes)."""

    argv: tuple[str, ...] = attrs.field(converter=_argv)
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.returncode == 0

    @property
    def text(self) -> str:
        """Standard output as text (UTF-8; undecodable bytes kept as surrogates)."""
        return self.stdout.decode("utf-8", "surrogateescape")

    @property
    def error_text(self) -> str:
        """The end of standard error as text (at most 2000 characters), stripped."""
        return self.stderr.decode("utf-8", "replace").strip()[-2000:]

    def check(self, *, what: str | None = None, host: str | None = None) -> CommandResult:
        """Return self when the command succeeded, else raise
        :class:`~pgsnap.errors.CommandError` naming ``what`` failed (default:
        the command line) with the end of its standard error.

        The message reads ``"<what> failed with exit status N: <end of stderr>"``
        (its last 500 characters; the error's ``stderr`` keeps 2000); exit
        statuses 126 and 127 (the program cannot run / does not exist) come
        with a hint.
        """
        if self.ok:
            return self
        raise self.error(what=what, host=host)

    def error(
        self, *, what: str | None = None, host: str | None = None, hint: str | None = None
    ) -> CommandError:
        """The :class:`~pgsnap.errors.CommandError` :meth:`check` raises (not raised here)."""
        label = what or shlex.join(self.argv)
        stderr = self.error_text
        message = f"{label} failed with exit status {self.returncode}"
        if stderr:
            message += f": {stderr if len(stderr) <= 500 else '...' + stderr[-500:]}"
        if hint is None and self.returncode == 127:
            hint = f"is {self.argv[0] if self.argv else 'the program'} installed on the host?"
        elif hint is None and self.returncode == 126:
            hint = f"{self.argv[0] if self.argv else 'the program'} cannot be executed there"
        return CommandError(
            message,
            argv=self.argv,
            returncode=self.returncode,
            stderr=stderr,
            host=host,
            hint=hint,
        )


# --------------------------------------------------------------------------- processes


class _TimedOut(Exception):
    """Internal: the process group outlived its timeout and was killed."""

    def __init__(self, stdout: bytes, stderr: bytes) -> None:
        super().__init__("timed out")
        self.stdout = stdout
        self.stderr = stderr


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _execute(
    argv: Sequence[str],
    *,
    stdin: bytes | None,
    timeout: float,
    env: Mapping[str, str],
    cwd: str = "/",
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` in a new session and return ``(returncode, stdout, stderr)``.

    Internal to :mod:`pgsnap.host` (shared by the local and ssh runners).
    Standard input is closed unless ``stdin`` is given. When the command
    outlives ``timeout``, its whole process group is killed and
    ``_TimedOut`` is raised with whatever output was read. ``OSError`` from
    starting the program propagates (``FileNotFoundError``...).
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=_KILL_GRACE)
        except subprocess.TimeoutExpired:
            # A descendant left the process group and keeps the pipes open.
            proc.kill()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            proc.wait()
            stdout, stderr = b"", b""
        raise _TimedOut(stdout or b"", stderr or b"") from None
    except BaseException:
        _kill_group(proc.pid)
        proc.kill()
        proc.wait()
        raise
    return proc.returncode, stdout, stderr


def _current_user() -> str:
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _check_argv(argv: Sequence[str]) -> tuple[str, ...]:
    if isinstance(argv, str | bytes):
        raise ConfigurationError(
            "a command is an argument list, not a string",
            hint='pass ["ls", "-l", path], never "ls -l " + path',
        )
    values = tuple(argv)
    if not values or not values[0]:
        raise ConfigurationError("cannot run an empty command")
    for value in values:
        if not isinstance(value, str):
            raise ConfigurationError(
                f"command arguments must be str, got {type(value).__name__}",
                argv=tuple(str(v) for v in values),
            )
        if "\0" in value:
            raise ConfigurationError("a command argument contains a NUL byte")
    return values


class LocalRunner:
    """Runs commands on this machine (implements :class:`~pgsnap.protocols.Runner`).

    Commands run with ``cwd="/"``, standard input closed unless ``stdin`` is
    given, and ``LC_ALL=C`` so their output parses the same everywhere. With
    ``user``: directly when pgsnap already runs as that user; through
    ``runuser -u USER --`` (or ``setpriv``) when it runs as root;
    :class:`~pgsnap.errors.ConfigurationError` otherwise (and for a user the
    machine does not know). A program that does not exist gives exit status
    127, as a shell would (126 when it cannot be executed). A command that
    outlives ``timeout`` is killed (its whole process group) and raises
    :class:`~pgsnap.errors.CommandTimeout`.
    """

    def __repr__(self) -> str:
        return "<LocalRunner>"

    @property
    def description(self) -> str:
        """Always ``"local"``."""
        return "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run ``argv`` (see the class docstring)."""
        args = _check_argv(argv)
        prefix = self._user_prefix(user)
        env = dict(os.environ, LC_ALL="C")
        _log.debug(
            "local: running %s%s", shlex.join(args), f" as {user}" if user is not None else ""
        )
        if not _findable(args[0], env.get("PATH")):
            return CommandResult(args, 127, b"", f"{args[0]}: command not found\n".encode())
        started = time.monotonic()
        try:
            returncode, stdout, stderr = _execute(
                [*prefix, *args], stdin=stdin, timeout=timeout, env=env
            )
        except _TimedOut as exc:
            err = exc.stderr.decode("utf-8", "replace").strip()[-2000:]
            raise CommandTimeout(
                f"{shlex.join(args)} did not finish within {timeout:g} s and was killed",
                argv=args,
                returncode=-1,
                stderr=err,
                host=self.description,
                hint="raise the timeout if the command is just slow",
                timeout=timeout,
            ) from None
        except FileNotFoundError as exc:
            return CommandResult(
                args, 127, b"", f"{exc.filename or args[0]}: {exc.strerror}\n".encode()
            )
        except PermissionError as exc:
            return CommandResult(
                args, 126, b"", f"{exc.filename or args[0]}: {exc.strerror}\n".encode()
            )
        except OSError as exc:
            raise HostError(
                f"cannot run {shlex.join(args)}: {exc.strerror or exc}",
                host=self.description,
            ) from exc
        _log.debug(
            "local: %s exited with status %d in %.3f s",
            args[0],
            returncode,
            time.monotonic() - started,
        )
        return CommandResult(args, returncode, stdout, stderr)

    def process_argv(
        self, argv: Sequence[str], *, user: str | None = None
    ) -> tuple[list[str], Mapping[str, str]]:
        """The process that runs ``argv`` here as ``user``: what a stream to or from
        the command starts (:mod:`pgsnap.host.streams`)."""
        args = _check_argv(argv)
        return [*self._user_prefix(user), *args], dict(os.environ, LC_ALL="C")

    @staticmethod
    def _user_prefix(user: str | None) -> list[str]:
        """The argv prefix that runs a command as ``user`` (empty: as ourselves)."""
        if user is None or user == _current_user():
            return []
        if not user or user.startswith("-") or any(c.isspace() for c in user):
            raise ConfigurationError(f"invalid OS user name {user!r}")
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ConfigurationError(
                f"OS user {user!r} does not exist on this machine",
                hint="create it (useradd --system) or run the command as an existing user",
                user=user,
            ) from None
        if os.geteuid() != 0:
            raise ConfigurationError(
                f"cannot run commands as {user!r}: pgsnap runs as {_current_user()!r}, not root",
                hint=f"run pgsnap as root or as {user}",
                user=user,
            )
        if shutil.which("runuser"):
            return ["runuser", "-u", user, "--"]
        if shutil.which("setpriv"):
            return [
                "setpriv",
                f"--reuid={entry.pw_uid}",
                f"--regid={entry.pw_gid}",
                "--init-groups",
                "--",
            ]
        raise ConfigurationError(
            f"cannot run commands as {user!r}: neither runuser nor setpriv is installed",
            hint="install util-linux",
            user=user,
        )


def _findable(program: str, path: str | None) -> bool:
    """Whether ``program`` can be found as the kernel (or runuser) would look for it."""
    if "/" in program:
        return os.path.exists(program)
    return shutil.which(program, path=path) is not None


class Runner(Protocol):
    """Runs commands on one machine: argument lists, never a shell string.

    Implementations: :class:`pgsnap.host.LocalRunner` (subprocess) and
    :class:`pgsnap.host.SshRunner` (the ``ssh`` binary). A runner returns a
    :class:`CommandResult` whatever the exit status; it raises
    :class:`~pgsnap.errors.CommandTimeout` when the command outlives
    ``timeout``, :class:`~pgsnap.errors.HostUnreachable` when the machine
    cannot be reached, and :class:`~pgsnap.errors.HostError` when the command
    cannot be started at all. ``user`` runs the command as that OS user (the
    PostgreSQL server's owner); ``stdin`` is fed to its standard input.
    """

    @property
    def description(self) -> str:
        """Where commands run, for messages: ``"local"``, ``"ssh postgres@db1:22"``.

        Never holds a secret.
        """
        ...

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run ``argv`` and return its exit status and output."""
        ...
