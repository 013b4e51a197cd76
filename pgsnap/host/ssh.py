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

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from pgsnap.host.runners import CommandResult

__all__ = ["SshRunner"]


class SshRunner:
    """Runs commands on ``destination`` over ssh (implements :class:`~pgsnap.protocols.Runner`).

    - ``destination``: the host name or address; ``user``: the login user
      (default: ssh's own default); ``port``: the ssh port (default 22).
    - ``identity_file``: the private key; ``known_hosts_file``: the host keys
      to trust (default: ssh's own ``~/.ssh/known_hosts``).
    - ``options``: extra ``-o`` options (``{"ServerAliveInterval": "15"}``).
    - ``connect_timeout``: seconds for the TCP connection and key exchange.
    - ``multiplex``: share one connection between commands (``ControlMaster``,
      the socket in a private temporary directory); :meth:`close` ends it.
    - ``become``: how a command runs as another OS user on the remote host:
      ``"runuser"`` (the login user is root), ``"sudo"`` (``sudo -n -u``) or
      ``"auto"`` (runuser when the login user is root, else sudo).
    - ``retries``: how many times a connection failure (ssh's own exit status
      255 with a connection error) is retried, with a short growing pause
      (``sleep`` is injectable for tests) before
      :class:`~pgsnap.errors.HostUnreachable` is raised. A rejected host key or
      a refused login is not retried: it is a :class:`~pgsnap.errors.HostError`
      whose hint says what to fix.
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
        raise NotImplementedError

    @property
    def description(self) -> str:
        """``"ssh [user@]destination[:port]"`` (never a secret)."""
        raise NotImplementedError

    @property
    def destination(self) -> str:
        """The host name or address commands run on."""
        raise NotImplementedError

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        """Run ``argv`` on the remote host (see the class docstring)."""
        raise NotImplementedError

    def close(self) -> None:
        """End the shared connection, if one was opened; idempotent."""
        raise NotImplementedError
