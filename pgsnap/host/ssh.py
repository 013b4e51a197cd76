"""Running commands on another machine through the ``ssh`` binary.

:class:`SshRunner` never builds a shell string from data it did not quote:
the remote command is the argument list quoted with :func:`shlex.join`, which
the remote login shell splits back into the same arguments. ssh runs with
``BatchMode=yes`` (no prompt, so never a password on a terminal or a command
line) and ``StrictHostKeyChecking=yes`` (an unknown or changed host key is an
error, never accepted silently). Connections are multiplexed (one TCP and
key exchange for many commands) unless ``multiplex=False``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal, Self

from pgsnap.errors import CommandTimeout, ConfigurationError, HostError, HostUnreachable
from pgsnap.host.runners import CommandResult, _check_argv, _execute, _TimedOut

if TYPE_CHECKING:
    import tenacity

__all__ = ["SshRunner"]

_log = logging.getLogger(__name__)

_CONTROL_PERSIST: Final = 60
"""Seconds an idle shared connection stays open."""

_SSH_FAILED: Final = 255
"""ssh's own exit status (also what a remote command exiting 255 gives)."""

# What ssh itself logs (-E: never mixed with the remote command's stderr) when a
# connection could not be made: the command did not start, so retrying is safe.
_UNREACHABLE = re.compile(
    r"^(?:ssh: connect to host |ssh: Could not resolve hostname |kex_exchange_identification: "
    r"|ssh_exchange_identification: |Connection closed by |Connection reset by "
    r"|Connection timed out during banner exchange|banner exchange: )",
    re.MULTILINE,
)
_HOST_KEY = re.compile(
    r"Host key verification failed|REMOTE HOST IDENTIFICATION HAS CHANGED"
    r"|host key is known for|Host key for \S+ has changed"
)
_LOGIN_REFUSED = re.compile(
    r"^\S*: Permission denied \(|^Permission denied \(|^Too many authentication failures",
    re.MULTILINE,
)

# Options the runner sets itself: a caller sets them through the parameters.
_MANAGED_OPTIONS: Final = {
    "batchmode": "BatchMode is always yes (never a prompt)",
    "stricthostkeychecking": "StrictHostKeyChecking is always yes: add the key to known_hosts_file",
    "connecttimeout": "use connect_timeout=",
    "controlmaster": "use multiplex=",
    "controlpath": "use multiplex=",
    "controlpersist": "use multiplex=",
    "port": "use port=",
    "user": "use user=",
    "identityfile": "use identity_file=",
    "identitiesonly": "use identity_file=",
    "userknownhostsfile": "use known_hosts_file=",
}
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")


class _ConnectionFailed(Exception):
    """Internal: ssh could not connect (retryable); carries ssh's diagnostic."""

    def __init__(self, diagnostic: str) -> None:
        super().__init__(diagnostic)
        self.diagnostic = diagnostic


def _ssh_value(value: str) -> str:
    """``value`` as ssh reads an option value: ``%`` doubled, quoted when it has spaces."""
    value = value.replace("%", "%%")
    if any(c.isspace() for c in value) or '"' in value or "\\" in value:
        value = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def _check_text(what: str, value: str) -> str:
    if not value or any(c in value for c in "\0\n\r"):
        raise ConfigurationError(f"invalid {what}: {value!r}")
    return value


def _short_temp_root() -> str:
    """A temp directory short enough for Unix socket paths (about 100 bytes at most)."""
    root = tempfile.gettempdir()
    return root if len(root) <= 40 else "/tmp"  # noqa: S108 - the socket dir itself is private


def _has_socket(private_dir: str) -> bool:
    """Whether a control socket (a shared connection) is in the private directory."""
    try:
        with os.scandir(private_dir) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                        return True
    except OSError:
        pass
    return False


def _shutdown(exit_argv: Sequence[str] | None, private_dir: str) -> None:
    """End the shared connection (``ssh -O exit``) and remove the private directory."""
    if exit_argv is not None and _has_socket(private_dir):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                list(exit_argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
                check=False,
            )
    shutil.rmtree(private_dir, ignore_errors=True)


class SshRunner:
    """Runs commands on ``destination`` over ssh (implements :class:`~pgsnap.protocols.Runner`).

    - ``destination``: the host name or address; ``user``: the login user
      (default: ssh's own default); ``port``: the ssh port (default 22).
    - ``identity_file``: the private key (without a passphrase, or loaded in
      an agent: nothing ever prompts); ``known_hosts_file``: the host keys
      to trust (default: ssh's own ``~/.ssh/known_hosts``).
    - ``options``: extra ``-o`` options (``{"ServerAliveInterval": "15"}``);
      the options the parameters control (``Port``, ``User``,
      ``StrictHostKeyChecking``...) are refused here.
    - ``connect_timeout``: seconds for the TCP connection and key exchange.
    - ``multiplex``: share one connection between commands (``ControlMaster``,
      the socket in a private temporary directory); :meth:`close` ends it
      (also at the end of a ``with`` block, and when the runner is
      garbage-collected or the interpreter exits).
    - ``become``: how a command runs as another OS user on the remote host:
      ``"runuser"`` (the login user is root), ``"sudo"`` (``sudo -n -u``) or
      ``"auto"`` (runuser when the login user is root, else sudo; the login
      user is asked once with ``id -un`` when ``user`` is not given).
    - ``retries``: how many times a connection failure (ssh's own exit status
      255 with a connection error) is retried, with a short growing pause
      (``sleep`` is injectable for tests) before
      :class:`~pgsnap.errors.HostUnreachable` is raised. A rejected host key or
      a refused login is not retried: it is a :class:`~pgsnap.errors.HostError`
      whose hint says what to fix.
    - ``ssh``: the ssh program.

    The remote command is ``env -C / LC_ALL=C [runuser -u USER --] ARGV...``
    quoted with :func:`shlex.join`: it runs in ``/`` with the C locale, as a
    :class:`~pgsnap.host.LocalRunner` command does. A command that outlives
    ``timeout`` raises :class:`~pgsnap.errors.CommandTimeout`; the local ssh
    is killed, and the remote command ends when it next writes to its closed
    output. ssh's own diagnostics go to a log file of each call (``-E``), so
    a result's ``stderr`` is the remote command's alone and a remote command
    is never mistaken for a connection failure (nor run twice). Commands are
    logged at DEBUG (never their standard input). No password parameter
    exists: authentication is by key only.
    """

    def __init__(
        self,
        destination: str,
        *,
        user: str | None = None,
        port: int | None = None,
        identity_file: str | None = None,
        known_hosts_file: str | None = None,
        options: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        multiplex: bool = True,
        become: Literal["auto", "runuser", "sudo"] = "auto",
        retries: int = 2,
        ssh: str = "ssh",
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        _check_text("ssh destination", destination)
        if destination.startswith("-") or any(c.isspace() for c in destination):
            raise ConfigurationError(f"invalid ssh destination {destination!r}")
        if user is not None:
            _check_text("ssh user", user)
            if user.startswith("-") or any(c.isspace() for c in user):
                raise ConfigurationError(f"invalid ssh user {user!r}")
        if port is not None and not 0 < port < 65536:
            raise ConfigurationError(f"invalid ssh port {port}")
        if identity_file is not None:
            _check_text("identity_file", identity_file)
        if known_hosts_file is not None:
            _check_text("known_hosts_file", known_hosts_file)
        if not connect_timeout > 0:
            raise ConfigurationError(f"connect_timeout must be positive, got {connect_timeout}")
        if become not in ("auto", "runuser", "sudo"):
            raise ConfigurationError(f"become must be 'auto', 'runuser' or 'sudo', got {become!r}")
        if retries < 0:
            raise ConfigurationError(f"retries must be 0 or more, got {retries}")
        extra: dict[str, str] = {}
        for key, value in (options or {}).items():
            if not _OPTION_NAME.fullmatch(key):
                raise ConfigurationError(f"invalid ssh option name {key!r}")
            if key.lower() in _MANAGED_OPTIONS:
                raise ConfigurationError(
                    f"ssh option {key} is set by SshRunner itself",
                    hint=_MANAGED_OPTIONS[key.lower()],
                )
            extra[key] = _check_text(f"value of ssh option {key}", str(value))
        self._destination = destination
        self._user = user
        self._port = port
        self._identity_file = identity_file
        self._known_hosts_file = known_hosts_file
        self._options = extra
        self._connect_timeout = connect_timeout
        self._multiplex = multiplex
        self._become: Literal["auto", "runuser", "sudo"] = become
        self._retries = retries
        self._ssh = ssh
        self._sleep: Callable[[float], None] = sleep if sleep is not None else time.sleep
        self._lock = threading.Lock()
        self._private_dir: str | None = None
        self._finalizer: weakref.finalize[[Sequence[str], str], SshRunner] | None = None
        self._login_user: str | None = user

    # ------------------------------------------------------------------ public

    def __repr__(self) -> str:
        key = f" identity_file={self._identity_file!r}" if self._identity_file else ""
        return f"<SshRunner {self.description}{key}>"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def description(self) -> str:
        """``"ssh [user@]destination[:port]"`` (never a secret)."""
        host = self._destination
        if self._port is not None:
            host = f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"
        login = f"{self._user}@" if self._user else ""
        return f"ssh {login}{host}"

    @property
    def destination(self) -> str:
        """The host name or address commands run on."""
        return self._destination

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run ``argv`` on the remote host (see the class docstring)."""
        args = _check_argv(argv)
        prefix = self._become_prefix(user)
        _log.debug(
            "%s: running %s%s",
            self.description,
            shlex.join(args),
            f" as {user}" if user is not None else "",
        )
        result = self._remote(args, [*prefix, *args], stdin=stdin, timeout=timeout)
        _log.debug("%s: %s exited with status %d", self.description, args[0], result.returncode)
        return result

    def process_argv(
        self, argv: Sequence[str], *, user: str | None = None
    ) -> tuple[list[str], Mapping[str, str]]:
        """The local ``ssh`` process that runs ``argv`` on the remote host as ``user``:
        what a stream to or from the command starts (:mod:`pgsnap.host.streams`).
        Not retried: a stream cannot be replayed (ssh's exit status 255 is the
        failure to connect)."""
        args = _check_argv(argv)
        command = shlex.join(["env", "-C", "/", "LC_ALL=C", *self._become_prefix(user), *args])
        private_dir = self._ensure_private_dir()
        base = self._base_argv(private_dir if self._multiplex else None)
        return [*base, "--", self._destination, command], dict(os.environ, LC_ALL="C")

    def close(self) -> None:
        """End the shared connection, if one was opened, and remove the private
        directory; idempotent.

        The runner stays usable: a later command opens a new connection.
        """
        with self._lock:
            finalizer, self._finalizer, self._private_dir = self._finalizer, None, None
        if finalizer is not None:
            finalizer()

    # ------------------------------------------------------------------ internals

    def _become_prefix(self, user: str | None) -> list[str]:
        if user is None:
            return []
        _check_text("OS user", user)
        if user.startswith("-"):
            raise ConfigurationError(f"invalid OS user name {user!r}")
        login = self._remote_login_user()
        if user == login:
            return []
        method = self._become
        if method == "auto":
            method = "runuser" if login == "root" else "sudo"
        if method == "runuser":
            return ["runuser", "-u", user, "--"]
        return ["sudo", "-n", "-u", user, "--"]

    def _remote_login_user(self) -> str:
        with self._lock:
            known = self._login_user
        if known is not None:
            return known
        _log.debug("%s: asking the login user's name (id -un)", self.description)
        result = self._remote(("id", "-un"), ["id", "-un"], stdin=None, timeout=30.0)
        name = result.text.strip()
        if not result.ok or not name:
            raise result.error(what="asking the login user's name (id -un)", host=self.description)
        with self._lock:
            self._login_user = name
        return name

    def _base_argv(self, control_dir: str | None) -> list[str]:
        argv = [
            self._ssh,
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={max(1, math.ceil(self._connect_timeout))}",
        ]
        if self._port is not None:
            argv += ["-p", str(self._port)]
        if self._user is not None:
            argv += ["-l", self._user]
        if self._identity_file is not None:
            argv += ["-i", self._identity_file.replace("%", "%%"), "-o", "IdentitiesOnly=yes"]
        if self._known_hosts_file is not None:
            argv += ["-o", f"UserKnownHostsFile={_ssh_value(self._known_hosts_file)}"]
        for key, value in self._options.items():
            argv += ["-o", f"{key}={value}"]
        if control_dir is not None:
            argv += [
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={_ssh_value(control_dir)}/%C",
                "-o",
                f"ControlPersist={_CONTROL_PERSIST}",
            ]
        return argv

    def _ensure_private_dir(self) -> str:
        """The private directory (mode 0700) of the control socket and ssh's logs."""
        with self._lock:
            if self._private_dir is None:
                path = tempfile.mkdtemp(prefix="pgsnap-ssh-", dir=_short_temp_root())
                exit_argv = None
                if self._multiplex:
                    exit_argv = [*self._base_argv(path), "-O", "exit", "--", self._destination]
                self._finalizer = weakref.finalize(self, _shutdown, exit_argv, path)
                self._private_dir = path
            return self._private_dir

    def _remote(
        self,
        args: tuple[str, ...],
        remote_argv: Sequence[str],
        *,
        stdin: bytes | None,
        timeout: float,
    ) -> CommandResult:
        """Run ``remote_argv`` through ssh, retrying connection failures.

        ssh writes its own diagnostics to a log file of this call (``-E``),
        so the command's standard error stays its own and a remote command
        can never be mistaken for a connection failure (and run twice).
        """
        command = shlex.join(["env", "-C", "/", "LC_ALL=C", *remote_argv])
        private_dir = self._ensure_private_dir()
        base = self._base_argv(private_dir if self._multiplex else None)
        env = dict(os.environ, LC_ALL="C")
        attempts = 0

        def once() -> CommandResult:
            nonlocal attempts
            attempts += 1
            fd, log_path = tempfile.mkstemp(prefix="log-", dir=private_dir)
            os.close(fd)
            ssh_argv = [base[0], "-E", log_path, *base[1:], "--", self._destination, command]
            try:
                returncode, stdout, stderr = _execute(
                    ssh_argv, stdin=stdin, timeout=timeout, env=env
                )
            except _TimedOut as exc:
                raise CommandTimeout(
                    f"{shlex.join(args)} did not finish within {timeout:g} s on "
                    f"{self.description}; ssh was killed",
                    argv=args,
                    returncode=-1,
                    stderr=exc.stderr.decode("utf-8", "replace").strip()[-2000:],
                    host=self.description,
                    hint="raise the timeout if the command is just slow",
                    timeout=timeout,
                ) from None
            except OSError as exc:
                raise HostError(
                    f"cannot run {self._ssh}: {exc.strerror or exc}",
                    host=self.description,
                    hint="install the OpenSSH client (apt-get install openssh-client)",
                ) from exc
            finally:
                log = _read_and_remove(log_path)
            if log:
                _log.debug("%s: ssh said: %s", self.description, log.strip()[-1000:])
            if returncode == _SSH_FAILED and log.strip():
                self._raise_for_ssh_failure(log)
                # Something else ssh complained about: the caller sees it in stderr.
                stderr = stderr + log.encode()
            return CommandResult(args, returncode, stdout, stderr)

        import tenacity  # noqa: PLC0415 - only a remote host pays for it (and tornado's)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            pause = state.next_action.sleep if state.next_action else 0.0
            _log.debug(
                "%s: connection failed (attempt %d), retrying in %.2f s",
                self.description,
                state.attempt_number,
                pause,
            )

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._retries + 1),
            wait=tenacity.wait_exponential(multiplier=0.5, max=8),
            retry=tenacity.retry_if_exception_type(_ConnectionFailed),
            sleep=self._sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(once)
        except _ConnectionFailed as exc:
            raise HostUnreachable(
                f"cannot reach {self.description} "
                f"({attempts} attempt{'s' if attempts != 1 else ''}): {exc.diagnostic}",
                host=self.description,
                hint="check that the host is up, that sshd listens on that port "
                "and that no firewall is in the way",
                attempts=attempts,
            ) from None

    def _raise_for_ssh_failure(self, log: str) -> None:
        """Raise for what ssh itself logged when it failed (exit status 255).

        Returns when the log names no failure it knows (the caller reports it).
        """
        tail = log.strip()[-1000:]
        if _HOST_KEY.search(log):
            known = self._known_hosts_file or "~/.ssh/known_hosts"
            port = f" -p {self._port}" if self._port is not None else ""
            raise HostError(
                f"{self.description}: the host key was rejected: {tail}",
                host=self.description,
                hint=f"add the host's key to {known} after checking its fingerprint "
                f"(ssh-keyscan{port} {self._destination}); if the host was reinstalled, "
                f"remove its old key first (ssh-keygen -R {self._destination} -f {known})",
            )
        if _LOGIN_REFUSED.search(log):
            key = self._identity_file or "ssh's default keys"
            login = self._user or "the default user"
            raise HostError(
                f"{self.description}: the login was refused: {tail}",
                host=self.description,
                hint=f"check that the public half of {key} is in the authorized_keys of "
                f"{login} on {self._destination}, that the private key file is readable "
                "only by its owner and has no passphrase (nothing ever prompts)",
            )
        match = _UNREACHABLE.search(log)
        if match:
            line = log[match.start() :].splitlines()[0].strip()
            raise _ConnectionFailed(line)


def _read_and_remove(path: str) -> str:
    """The text of ssh's log file of one call ("" if none), removing the file."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
