"""SshRunner against a real sshd (pgsnap.testing.sshd), and the Host checks over ssh.

The sshd runs on 127.0.0.1 of this machine, so the remote host is this
machine: the file and process checks of tests/unit/test_host_local.py run
unchanged through an SshRunner (``TestHostFilesOverSsh``...), plus what only
ssh has: quoting across the remote shell, host keys, logins, connection
failures and retries, the shared connection, and no secret anywhere.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgsnap.errors import (
    CommandTimeout,
    ConfigurationError,
    HostError,
    HostUnreachable,
)
from pgsnap.host import Host, LocalRunner, SshRunner

from ..unit.test_host_local import TestHostFiles as _HostFiles
from ..unit.test_host_local import TestHostProcesses as _HostProcesses
from ..unit.test_host_local import public_directory, require_root


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A fresh directory under /tmp that every user may enter, removed afterwards."""
    with public_directory() as path:
        yield path


@pytest.fixture
def ssh_host(sshd_server) -> Host:
    return Host(sshd_server.runner())


class TestHostFilesOverSsh(_HostFiles):
    """Every file check of test_host_local.py, through an SshRunner."""

    @pytest.fixture
    def host(self, ssh_host: Host) -> Host:
        return ssh_host


class TestHostProcessesOverSsh(_HostProcesses):
    """Every process check of test_host_local.py, through an SshRunner."""

    @pytest.fixture
    def host(self, ssh_host: Host) -> Host:
        return ssh_host


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- commands


def test_commands_run_on_the_remote_host(ssh_host, sshd_server):
    assert ssh_host.name == "127.0.0.1"
    assert ssh_host.description == f"ssh {sshd_server.login_user}@127.0.0.1:{sshd_server.port}"
    assert ssh_host.run(["pwd"]).stdout == b"/\n"  # as LocalRunner: cwd /
    assert ssh_host.run(["sh", "-c", 'printf %s "$LC_ALL"']).stdout == b"C"
    result = ssh_host.run(["sh", "-c", "echo out; echo err >&2; exit 7"], check=False)
    assert (result.returncode, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
    assert ssh_host.run(["pgsnap-no-such-program"], check=False).returncode == 127


def test_run_as_postgres_through_runuser(ssh_host):
    require_root()
    assert ssh_host.run(["id", "-un"], user="postgres").stdout == b"postgres\n"
    assert ssh_host.run(["id", "-un"], user="root").stdout == b"root\n"
    assert ssh_host.run(["cat"], user="postgres", stdin=b"\xff\x00").stdout == b"\xff\x00"


def test_become_auto_asks_the_login_user_once(sshd_server, caplog):
    require_root()
    runner = sshd_server.runner(user=None)  # ssh's default user: root, found with id -un
    caplog.set_level(logging.DEBUG, logger="pgsnap.host.ssh")
    assert runner.run(["id", "-un"], user="postgres").stdout == b"postgres\n"
    assert runner.run(["id", "-un"], user="postgres").stdout == b"postgres\n"
    assert runner.run(["id", "-un"], user="root").stdout == b"root\n"
    asked = [r for r in caplog.records if "asking the login user" in r.getMessage()]
    assert len(asked) == 1


def test_become_sudo_runs_sudo_non_interactively(sshd_server):
    require_root()
    runner = sshd_server.runner(become="sudo")
    result = runner.run(["sh", "-c", 'printf %s "${SUDO_USER-none}"'], user="postgres")
    if result.returncode == 127:  # sudo is not installed on this host
        assert b"sudo" in result.stderr
    else:  # sudo ran it (runuser would leave SUDO_USER unset)
        assert result.stdout == b"root"


def test_hostile_arguments_arrive_verbatim(ssh_host, public_dir):
    marker = public_dir / "touched"
    victim = public_dir / "victim"
    victim.mkdir()
    hostile = [
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"; rm -rf {victim}",
        f"&& rm -rf {victim} #",
        "'single' \"double\" \\back\\slash",
        "new\nline",
        "tab\tand  spaces ",
        "*",
        "",
        "-n",
        "$HOME ${PATH} %s %%",
        "non-utf8 \udcff\udcfe",
        "ünïcode ✓",
        "!history",
    ]
    result = ssh_host.run(["printf", r"%s\0", *hostile])
    assert result.stdout.split(b"\0")[:-1] == [os.fsencode(a) for a in hostile]
    assert not marker.exists()
    assert victim.is_dir()


def test_stdin_arrives_verbatim(ssh_host):
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    assert ssh_host.run(["cat"], stdin=data).stdout == data
    assert ssh_host.run(["cat"], timeout=20).stdout == b""  # no stdin: closed, not waiting


def test_a_remote_255_is_the_commands_own(sshd_server):
    # The command says what a connection failure says, and exits 255 like ssh:
    # it ran once, and is not retried (ssh's own diagnostics go to -E, not stderr).
    sleeps: list[float] = []
    host = Host(sshd_server.runner(sleep=sleeps.append))
    with tempfile.NamedTemporaryFile(dir="/tmp") as counter:
        script = (
            'echo run >> "$1"; '
            'echo "ssh: connect to host db1 port 22: Connection refused" >&2; exit 255'
        )
        result = host.run(["sh", "-c", script, "sh", counter.name], check=False)
        assert Path(counter.name).read_text() == "run\n"
    assert result.returncode == 255
    assert b"Connection refused" in result.stderr
    assert sleeps == []


def test_timeout_raises_command_timeout(ssh_host):
    started = time.monotonic()
    with pytest.raises(CommandTimeout) as info:
        ssh_host.run(["sleep", "30"], timeout=1)
    assert time.monotonic() - started < 10
    assert (info.value.returncode, info.value.host) == (-1, ssh_host.description)


def test_mounts_listing_is_the_local_one(ssh_host):
    assert ssh_host.mounts() == Host(LocalRunner()).mounts()
    assert ssh_host.mount_of("/tmp") == Host().mount_of("/tmp")


def test_write_atomic_owner_over_ssh(ssh_host, public_dir):
    require_root()
    path = public_dir / "backup_label"
    ssh_host.write_atomic(
        str(path), b"START WAL LOCATION: 0/2000028\n", mode=0o600, owner="postgres"
    )
    st = path.stat()
    assert st.st_mode & 0o7777 == 0o600
    assert ssh_host.stat(str(path)).owner == "postgres"
    assert ssh_host.read_bytes(str(path), user="postgres") == b"START WAL LOCATION: 0/2000028\n"


# --------------------------------------------------------------------------- failures


def test_unknown_host_key_is_not_unreachable(sshd_server, public_dir):
    sleeps: list[float] = []
    empty = public_dir / "known_hosts"
    empty.write_text("")
    runner = sshd_server.runner(known_hosts_file=str(empty), sleep=sleeps.append)
    with pytest.raises(HostError) as info:
        runner.run(["true"])
    err = info.value
    assert not isinstance(err, HostUnreachable)
    assert not err.retryable
    assert "Host key verification failed" in err.message
    assert err.hint is not None
    assert str(empty) in err.hint and "ssh-keyscan" in err.hint
    assert sleeps == []  # not retried


def test_changed_host_key_is_refused_with_a_hint(sshd_server, public_dir):
    other = public_dir / "other_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
        check=True,
        capture_output=True,
    )
    impostor = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    known = public_dir / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd_server.port} {impostor}\n")
    with pytest.raises(HostError) as info:
        sshd_server.runner(known_hosts_file=str(known)).run(["true"])
    assert not isinstance(info.value, HostUnreachable)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in info.value.message
    assert info.value.hint is not None
    assert "ssh-keygen -R" in info.value.hint


def test_refused_login_names_the_key_to_fix(sshd_server, public_dir):
    stranger = public_dir / "stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
        check=True,
        capture_output=True,
    )
    sleeps: list[float] = []
    runner = sshd_server.runner(identity_file=str(stranger), sleep=sleeps.append)
    with pytest.raises(HostError) as info:
        runner.run(["true"])
    assert not isinstance(info.value, HostUnreachable)
    assert "Permission denied" in info.value.message
    assert info.value.hint is not None
    assert str(stranger) in info.value.hint and "authorized_keys" in info.value.hint
    assert sleeps == []


def test_closed_port_is_unreachable_after_the_retries(sshd_server):
    sleeps: list[float] = []
    runner = SshRunner(
        "127.0.0.1",
        port=free_port(),
        identity_file=str(sshd_server.identity_file),
        known_hosts_file=str(sshd_server.known_hosts_file),
        retries=3,
        sleep=sleeps.append,
    )
    with runner, pytest.raises(HostUnreachable) as info:
        Host(runner).exists("/")
    err = info.value
    assert err.retryable and err.details["attempts"] == 4
    assert "Connection refused" in err.message
    assert err.host == runner.description
    assert len(sleeps) == 3 and sleeps == sorted(sleeps) and sleeps[0] < sleeps[-1]


def test_no_retries_means_one_attempt(sshd_server):
    sleeps: list[float] = []
    runner = SshRunner("127.0.0.1", port=free_port(), retries=0, sleep=sleeps.append)
    with runner, pytest.raises(HostUnreachable) as info:
        runner.run(["true"])
    assert info.value.details["attempts"] == 1 and sleeps == []


def test_configuration_is_checked():
    with pytest.raises(ConfigurationError):
        SshRunner("-oProxyCommand=touch /tmp/pwned")
    with pytest.raises(ConfigurationError):
        SshRunner("db1", user="-oProxyCommand=x")
    with pytest.raises(ConfigurationError, match="known_hosts_file"):
        SshRunner("db1", options={"StrictHostKeyChecking": "no"})
    with pytest.raises(ConfigurationError):
        SshRunner("db1", options={"Bad Name": "x"})
    with pytest.raises(ConfigurationError):
        SshRunner("db1", options={"ServerAliveInterval": "15\nProxyCommand x"})
    with pytest.raises(ConfigurationError):
        SshRunner("db1", port=0)
    with pytest.raises(ConfigurationError):
        SshRunner("db1", become="su")  # type: ignore[arg-type]
    assert SshRunner("db1", options={"ServerAliveInterval": "15"}).description == "ssh db1"
    assert SshRunner("::1", port=2222, user="pg").description == "ssh pg@[::1]:2222"


# --------------------------------------------------------------------------- connection


def _masters(private_dir: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], check=False, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if private_dir in line and "[mux]" in line]


def test_shared_connection_is_ended_by_close(sshd_server):
    runner = sshd_server.runner()
    runner.run(["true"])
    private_dir = runner._private_dir
    assert private_dir is not None and os.stat(private_dir).st_mode & 0o777 == 0o700
    sockets = os.listdir(private_dir)
    assert len(sockets) == 1 and len(f"{private_dir}/{sockets[0]}") < 100
    assert _masters(private_dir)
    started = time.monotonic()
    for _ in range(5):
        runner.run(["true"])
    assert os.listdir(private_dir) == sockets  # one shared connection, no leftover logs
    runner.close()
    assert not os.path.exists(private_dir)
    deadline = time.monotonic() + 5
    while _masters(private_dir):
        assert time.monotonic() < deadline, "the shared connection survived close()"
        time.sleep(0.1)
    runner.close()  # idempotent
    assert runner.run(["true"]).ok  # usable again: a new connection
    runner.close()
    assert time.monotonic() - started < 30


def test_context_manager_and_garbage_collection_clean_up(sshd_server):
    with sshd_server.runner() as runner:
        runner.run(["true"])
        private_dir = runner._private_dir
    assert not os.path.exists(private_dir)

    lost = SshRunner(
        "127.0.0.1",
        user=sshd_server.login_user,
        port=sshd_server.port,
        identity_file=str(sshd_server.identity_file),
        known_hosts_file=str(sshd_server.known_hosts_file),
    )
    lost.run(["true"])
    private_dir = lost._private_dir
    assert private_dir is not None
    ref = weakref.ref(lost)
    del lost
    gc.collect()
    assert ref() is None
    assert not os.path.exists(private_dir)


def test_without_multiplexing(sshd_server):
    runner = sshd_server.runner(multiplex=False)
    assert runner.run(["echo", "x"]).stdout == b"x\n"
    assert os.listdir(runner._private_dir) == []  # no socket, no leftover logs
    runner.close()


# --------------------------------------------------------------------------- secrets


def test_no_secret_in_reprs_errors_or_logs(sshd_server, public_dir, caplog):
    caplog.set_level(logging.DEBUG)
    private_key = sshd_server.identity_file.read_text()
    key_body = "".join(private_key.splitlines()[1:-1])
    token = "s3cr3t-t0ken-on-stdin"
    runner = sshd_server.runner()
    host = Host(runner)
    host.run(["cat"], stdin=token.encode())
    host.write_atomic(str(public_dir / "f"), token.encode())
    texts = [repr(runner), runner.description, repr(host), caplog.text]
    empty = public_dir / "known_hosts"
    empty.write_text("")
    for bad in (
        sshd_server.runner(known_hosts_file=str(empty)),
        SshRunner(
            "127.0.0.1", port=free_port(), retries=0, identity_file=str(sshd_server.identity_file)
        ),
    ):
        with pytest.raises(HostError) as info:
            bad.run(["cat"], stdin=token.encode())
        texts += [str(info.value), repr(info.value), repr(info.value.details), repr(bad)]
        bad.close()
    texts.append(caplog.text)
    assert str(sshd_server.identity_file) in repr(runner)  # the path is fine to show
    for text in texts:
        assert token not in text
        assert "PRIVATE KEY" not in text
        assert key_body[:40] not in text
        assert "password" not in text.lower()
