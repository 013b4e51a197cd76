"""A throwaway OpenSSH server for tests of :class:`~pgsnap.host.SshRunner`.

:class:`SshServer` starts ``sshd -D -e`` on a free port of 127.0.0.1 with a
configuration, a host key and a client key of its own, all in a fresh
private temporary directory, and removes everything on :meth:`SshServer.stop`
(or at the end of a ``with`` block)::

    from pgsnap.host import Host
    from pgsnap.testing.sshd import SshServer

    with SshServer.start() as server:
        host = Host(server.runner())
        print(host.run(["id", "-un"]).text)       # root, over ssh

Logins are by key only (``PasswordAuthentication no``, ``UsePAM no``); root
may log in with a key (``PermitRootLogin prohibit-password``). The keys are
generated with ``ssh-keygen`` for this server alone and have no passphrase:
they protect nothing but the throwaway server. :meth:`SshServer.runner`
gives an :class:`~pgsnap.host.SshRunner` that trusts exactly this server's
host key (a ``known_hosts`` file with ``[127.0.0.1]:PORT``).

sshd must be run with its absolute path (``/usr/sbin/sshd`` from Debian's
``openssh-server``) and needs its privilege separation directory
``/run/sshd``, which is created when missing. Starting the server does not
touch the system's sshd or its configuration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from pgsnap.errors import ConfigurationError
from pgsnap.host.ssh import SshRunner

__all__ = ["DEFAULT_SSHD", "SshServer"]

_log = logging.getLogger(__name__)

DEFAULT_SSHD: Final = Path("/usr/sbin/sshd")
"""Where Debian's ``openssh-server`` installs sshd (it must be run by absolute path)."""

_PRIVSEP_DIR: Final = Path("/run/sshd")
_ADDRESS: Final = "127.0.0.1"
_START_TIMEOUT: Final = 15.0
_START_ATTEMPTS: Final = 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_ADDRESS, 0))
        return int(s.getsockname()[1])


def _current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _keygen(ssh_keygen: str, path: Path) -> None:
    proc = subprocess.run(
        [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", "pgsnap-test", "-f", str(path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise ConfigurationError(
            f"ssh-keygen failed for {path}: {(proc.stdout + proc.stderr).strip()[-500:]}",
            hint="install openssh-client",
        )


class SshServer:
    """A running throwaway sshd on 127.0.0.1 (build it with :meth:`start`).

    Files, in :attr:`base_dir` (mode 0700)::

        sshd_config      the configuration (sshd -f)
        host_ed25519     the host key (and .pub)
        client_ed25519   the key clients log in with (and .pub)
        authorized_keys  client_ed25519.pub, for every login user
        known_hosts      [127.0.0.1]:PORT and the host key
        sshd.pid         sshd's PidFile
        sshd.log         sshd's log (-e: everything on stderr)
    """

    def __init__(
        self,
        *,
        base_dir: Path,
        port: int,
        login_user: str,
        process: subprocess.Popen[bytes],
    ) -> None:
        self.base_dir: Path = base_dir
        """The private temporary directory holding everything (removed by :meth:`stop`)."""
        self.port: int = port
        """The TCP port sshd listens on (on 127.0.0.1)."""
        self.login_user: str = login_user
        """The user :meth:`runner` logs in as (root when the server runs as root)."""
        self.process: subprocess.Popen[bytes] = process
        """The ``sshd -D`` process."""
        self._runners: list[SshRunner] = []
        self._stopped = False

    def __repr__(self) -> str:
        return f"<SshServer {_ADDRESS}:{self.port} base={self.base_dir}>"

    # ------------------------------------------------------------------ paths

    @property
    def address(self) -> str:
        """Where sshd listens: ``127.0.0.1``."""
        return _ADDRESS

    @property
    def identity_file(self) -> Path:
        """The client's private key (no passphrase; good for this server only)."""
        return self.base_dir / "client_ed25519"

    @property
    def known_hosts_file(self) -> Path:
        """A known_hosts file that trusts this server's host key alone."""
        return self.base_dir / "known_hosts"

    @property
    def host_public_key(self) -> str:
        """The server's host key as ``"ssh-ed25519 AAAA..."``."""
        text = (self.base_dir / "host_ed25519.pub").read_text()
        return " ".join(text.split()[:2])

    @property
    def log_file(self) -> Path:
        """sshd's log."""
        return self.base_dir / "sshd.log"

    def log_text(self) -> str:
        """The text of sshd's log ("" when there is none yet)."""
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(
        cls,
        *,
        sshd: Path = DEFAULT_SSHD,
        ssh_keygen: str = "ssh-keygen",
        login_user: str | None = None,
        parent_dir: Path | None = None,
    ) -> Self:
        """Generate keys and a configuration, start sshd and wait until it accepts.

        ``login_user`` defaults to the current user (root when run as root).
        Raises :class:`~pgsnap.errors.ConfigurationError` (with sshd's log)
        when sshd is missing or does not come up.
        """
        sshd = Path(sshd)
        if not sshd.is_absolute() or not os.access(sshd, os.X_OK):
            raise ConfigurationError(
                f"no sshd at {sshd} (it must be an absolute path)",
                hint="apt-get install -y openssh-server",
            )
        if shutil.which(ssh_keygen) is None or shutil.which("ssh") is None:
            raise ConfigurationError(
                "ssh and ssh-keygen are needed", hint="apt-get install -y openssh-client"
            )
        if os.geteuid() == 0 and not _PRIVSEP_DIR.is_dir():
            _PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        user = login_user or _current_user()
        base = Path(tempfile.mkdtemp(prefix="pgsnap-sshd-", dir=parent_dir)).resolve()
        try:
            _keygen(ssh_keygen, base / "host_ed25519")
            _keygen(ssh_keygen, base / "client_ed25519")
            authorized = base / "authorized_keys"
            authorized.write_text((base / "client_ed25519.pub").read_text())
            authorized.chmod(0o600)
            last_log = ""
            for _attempt in range(_START_ATTEMPTS):
                port = _free_port()  # another process may take it first: retried below
                server = cls._launch(sshd, base, port, user)
                if server is not None:
                    return server
                last_log = (base / "sshd.log").read_text(errors="replace")
                _log.debug("sshd did not start on port %d: %s", port, last_log[-500:])
            raise ConfigurationError(
                f"sshd did not start: {last_log.strip()[-2000:]}",
                hint=f"run {sshd} -t -f {base / 'sshd_config'} to check the configuration",
            )
        except BaseException:
            shutil.rmtree(base, ignore_errors=True)
            raise

    @classmethod
    def _launch(cls, sshd: Path, base: Path, port: int, user: str) -> Self | None:
        """Start sshd on ``port``; the server once it accepts, None if sshd exited."""
        config = base / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {port}",
                    f"ListenAddress {_ADDRESS}",
                    f"HostKey {base / 'host_ed25519'}",
                    f"PidFile {base / 'sshd.pid'}",
                    f"AuthorizedKeysFile {base / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",  # the keys live in our private temp dir
                    f"AllowUsers {user}",
                    "MaxSessions 100",
                    "MaxStartups 100",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        pub = (base / "host_ed25519.pub").read_text().split()
        (base / "known_hosts").write_text(f"[{_ADDRESS}]:{port} {pub[0]} {pub[1]}\n")
        with open(base / "sshd.log", "wb") as log:
            process = subprocess.Popen(
                [str(sshd), "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd="/",
                start_new_session=True,
            )
        server = cls(base_dir=base, port=port, login_user=user, process=process)
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return None
            try:
                with socket.create_connection((_ADDRESS, port), timeout=0.5):
                    _log.debug("sshd listening on %s:%d (pid %d)", _ADDRESS, port, process.pid)
                    return server
            except OSError:
                time.sleep(0.05)
        server._kill()
        return None

    def runner(self, **options: Any) -> SshRunner:
        """An :class:`~pgsnap.host.SshRunner` logged in as :attr:`login_user` with the
        client key, trusting this server's host key alone; ``options`` override
        :class:`~pgsnap.host.SshRunner`'s parameters (``retries=0``...).

        The server closes every runner it made when it stops.
        """
        params: dict[str, Any] = {
            "user": self.login_user,
            "port": self.port,
            "identity_file": str(self.identity_file),
            "known_hosts_file": str(self.known_hosts_file),
            "connect_timeout": 5.0,
        }
        params.update(options)
        runner = SshRunner(_ADDRESS, **params)
        self._runners.append(runner)
        return runner

    def stop(self) -> None:
        """Close the runners it made, stop sshd (and its sessions), remove the files.

        Idempotent.
        """
        if self._stopped:
            return
        self._stopped = True
        for runner in self._runners:
            with contextlib.suppress(Exception):
                runner.close()
        self._runners.clear()
        self._kill()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def _kill(self) -> None:
        """End sshd: SIGTERM to its process group, SIGKILL if it lingers."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
