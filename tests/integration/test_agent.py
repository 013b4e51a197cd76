"""The pgsnap agent (pgsnap.agent): real processes over a real Unix socket.

A probe agent (tests/integration/_agent_probe.py) runs a command that reports what its
process looks like, so each test can check one promise: the command runs as the
caller would have (streams, directory, environment, umask, terminal), signals reach
it, its exit or death is the client's, refusals fall back to running in the client's
own process. The last test runs real pgsnap commands (backup, list, recover) on a
real PostgreSQL through a real ``pgsnap agent``.
"""

from __future__ import annotations

import json
import os
import pty
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.agent import _bind
from pgsnap.cli import main
from pgsnap.errors import ConfigurationError

from .conftest import CliEnv, write_config

ROOT = Path(__file__).resolve().parents[2]
CLIENT = (
    "import sys; from pgsnap.agent import request; "
    "code = request(sys.argv[1], sys.argv[2:]); sys.exit(99 if code is None else code)"
)
"""A client that says 99 when the agent did not take the command (the real ``pgsnap``
command then runs it itself)."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PGSNAP_AGENT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


class Agent:
    """An agent process serving ``socket``; stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, argv: list[str], path: Path, log: Path, **popen: Any) -> None:
        self.path = path
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **popen)
        deadline = time.monotonic() + 60
        while not self.accepts():
            assert self.proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    def accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.path))
            except OSError:
                return False
            return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def probe_agent(work: Path, *, pythonpath: str | None = None) -> Agent:
    """A probe agent; with ``pythonpath``, its pgsnap is the one found there (it runs in
    ``work``: ``python -m`` puts its directory first on the path)."""
    env = _env()
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return Agent(
        [sys.executable, "-m", "tests.integration._agent_probe", str(work / "agent.sock")],
        work / "agent.sock",
        work / "agent.log",
        cwd=ROOT if pythonpath is None else work,
        env=env,
    )


@pytest.fixture(scope="module")
def probe() -> Iterator[Agent]:
    work = Path(tempfile.mkdtemp(prefix="pgsnap-agent-"))
    agent = probe_agent(work)
    yield agent
    agent.stop()
    shutil.rmtree(work, ignore_errors=True)


def client(agent: Agent, *argv: str, **popen: Any) -> subprocess.Popen[bytes]:
    popen.setdefault("env", _env())
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(agent.path), *argv], **popen)


def ask(agent: Agent, *argv: str, stdin: bytes = b"", **popen: Any) -> tuple[int, str, str]:
    proc = client(agent, *argv, stdin=subprocess.PIPE, **popen)
    out, err = proc.communicate(stdin, timeout=60)
    return proc.returncode, out.decode(), err.decode()


def wait_for_line(proc: subprocess.Popen[bytes], line: bytes) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == line


# --------------------------------------------------------------------------- the process


def test_the_command_has_the_callers_streams_directory_environment_and_umask(
    probe: Agent, tmp_path: Path
) -> None:
    code, out, err = ask(
        probe,
        "report",
        "3",
        stdin=b"from the caller",
        cwd=tmp_path,
        env=_env(PROBE="the caller's", TZ="Asia/Tokyo", TMPDIR=str(tmp_path)),
        preexec_fn=lambda: os.umask(0o027),
    )
    assert code == 3, err  # the command's exit code
    assert err == "said on stderr\n"  # nothing of the agent's own
    report = json.loads(out)
    assert report["cwd"] == str(tmp_path)
    assert report["probe"] == "the caller's"
    assert report["tz"] == "JST"  # the caller's time zone, not the agent's
    assert report["tmp"] == str(tmp_path)  # and temporary directory
    assert report["umask"] == 0o027
    assert report["stdin"] == "from the caller"
    assert not report["stdin_tty"] and not report["stdout_tty"]
    assert report["argv0"] == "-c"  # the client's program name (here python -c)
    assert report["sid"] == report["pid"]  # a session of its own: no terminal of the agent's
    assert report["pid"] != probe.proc.pid


def test_a_terminal_stays_a_terminal(probe: Agent) -> None:
    """A command on a terminal sees one and reads what is typed there (``pgsnap
    recover`` asks before it acts)."""
    leader, follower = pty.openpty()
    try:
        proc = client(probe, "report", "0", stdin=follower, stdout=follower)
        os.close(follower)
        follower = -1
        os.write(leader, b"typed\n")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        out = b""
        while not out.rstrip().endswith(b"}"):
            out += os.read(leader, 65536)
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["stdin_tty"] and report["stdout_tty"]
    assert report["stdin"] == "typed"


# --------------------------------------------------------------------------- signals, ends


def test_ctrl_c_to_the_client_interrupts_the_command(probe: Agent, tmp_path: Path) -> None:
    proc = client(probe, "sleep", str(tmp_path / "terminated"))
    wait_for_line(proc, b"ready")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert out == b"interrupted\n"


def test_sigterm_to_the_client_reaches_the_command(probe: Agent, tmp_path: Path) -> None:
    flag = tmp_path / "terminated"
    proc = client(probe, "sleep", str(flag))
    wait_for_line(proc, b"ready")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 143  # the command's own exit, passed on
    assert flag.read_text() == "terminated"


def test_a_client_that_dies_interrupts_its_command(probe: Agent, tmp_path: Path) -> None:
    """SIGKILL cannot be passed on; the client's end of the socket closing can."""
    flag = tmp_path / "terminated"
    proc = client(probe, "sleep", str(flag))
    wait_for_line(proc, b"ready")
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert time.monotonic() < deadline, "the command ran on after its client died"
        time.sleep(0.05)
    assert flag.read_text() == "terminated"


def test_a_command_killed_by_a_signal_kills_its_client_with_it(probe: Agent) -> None:
    code, _, err = ask(probe, "die")
    assert code == -signal.SIGKILL, err


def test_a_command_that_raises_says_so_and_exits_70(probe: Agent) -> None:
    code, _, err = ask(probe, "raise")
    assert code == 70
    assert "RuntimeError: boom" in err


def test_two_commands_at_once_each_get_their_own(probe: Agent) -> None:
    first = client(probe, "nap", "1")
    wait_for_line(first, b"ready")
    code, out, _ = ask(probe, "report", "5")
    assert code == 5 and json.loads(out)["probe"] is None
    out_first, _ = first.communicate(timeout=30)
    assert first.returncode == 0 and out_first == b"rested\n"


# --------------------------------------------------------------------------- refusals


def test_without_an_agent_the_command_runs_in_its_own_process(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pgsnap", "list", "-c", str(tmp_path / "none.toml")],
        env=_env(PGSNAP_AGENT=str(tmp_path / "no.sock")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert f"pgsnap: no agent at {tmp_path / 'no.sock'} (No such file or directory)" in proc.stderr
    assert "cannot read configuration" in proc.stderr  # then the command, run here


def test_another_user_is_refused_and_runs_the_command_itself() -> None:
    """The socket is its user's (0600); even opened to all, the agent serves only its
    own user's commands: a command as another user runs in that user's own process."""
    work = Path(tempfile.mkdtemp(prefix="pgsnap-agent-users-"))
    work.chmod(0o755)
    agent = probe_agent(work)
    try:
        assert (agent.path.stat().st_mode & 0o777) == 0o600
        as_postgres = ["runuser", "-u", "postgres", "--", sys.executable, "-m", "pgsnap"]
        argv = [*as_postgres, "list", "-c", "/nonexistent/pgsnap.toml"]
        run: dict[str, Any] = {"env": _env(PGSNAP_AGENT=str(agent.path)), "cwd": "/", "timeout": 60}
        denied = subprocess.run(argv, capture_output=True, text=True, check=False, **run)
        assert "(Permission denied); running in this process" in denied.stderr, denied.stderr
        assert denied.returncode == 2 and "cannot read configuration" in denied.stderr
        agent.path.chmod(0o666)
        refused = subprocess.run(argv, capture_output=True, text=True, check=False, **run)
        assert f"it serves user id {os.getuid()} only, not " in refused.stderr, refused.stderr
        assert refused.returncode == 2 and "cannot read configuration" in refused.stderr
        assert "runs 'list'" not in agent.log.read_text()
    finally:
        agent.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_changed_code_is_refused_and_ends_the_agent(tmp_path: Path) -> None:
    """An agent whose pgsnap changed on disk (an upgrade, an edit) runs no more commands
    with the old code: it refuses, and ends; the client runs the command itself."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pgsnap", tree / "pgsnap", ignore=shutil.ignore_patterns("__pycache__"))
    path = os.pathsep.join([str(tree), str(ROOT)])
    agent = probe_agent(tmp_path, pythonpath=path)
    try:
        theirs: dict[str, Any] = {"env": {**_env(), "PYTHONPATH": path}, "cwd": tmp_path}
        code, _, err = ask(agent, "report", "0", **theirs)
        assert code == 0, err
        model = tree / "pgsnap" / "model.py"
        model.write_text(model.read_text() + "\n# edited\n")
        code, _, err = ask(agent, "report", "0", **theirs)
        assert code == 99  # not taken: the real command would run it itself
        assert f"its code changed on disk ({model}); it ends, restart it" in err
        assert agent.proc.wait(30) == 0
        assert not agent.path.exists()
    finally:
        agent.stop()


def test_another_installation_is_refused(probe: Agent, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "pgsnap", tree / "pgsnap", ignore=shutil.ignore_patterns("__pycache__"))
    theirs: dict[str, Any] = {"env": {**_env(), "PYTHONPATH": str(tree)}, "cwd": tmp_path}
    code, _, err = ask(probe, "report", "0", **theirs)
    assert code == 99
    assert "it runs another pgsnap: package" in err, err


def test_sigterm_ends_the_agent_after_the_running_commands(tmp_path: Path) -> None:
    agent = probe_agent(tmp_path)
    try:
        running = client(agent, "nap", "2")
        wait_for_line(running, b"ready")
        agent.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while agent.path.exists():  # no new commands from now on
            assert time.monotonic() < deadline
            time.sleep(0.02)
        code, _, err = ask(agent, "report", "0")
        assert code == 99 and "no agent at" in err
        assert agent.proc.poll() is None  # still there for the running command
        out, _ = running.communicate(timeout=30)
        assert running.returncode == 0 and out == b"rested\n"  # its status still came
        assert agent.proc.wait(30) == 0
    finally:
        agent.stop()


# --------------------------------------------------------------------------- the socket


def test_the_socket_is_never_made_over_something_else(tmp_path: Path, probe: Agent) -> None:
    regular = tmp_path / "file"
    regular.write_text("keep me")
    with pytest.raises(ConfigurationError, match="exists and is not a socket"):
        _bind(str(regular))
    assert regular.read_text() == "keep me"
    with pytest.raises(ConfigurationError, match="an agent already listens at"):
        _bind(str(probe.path))
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.bind(str(dead))  # bound, never listening: what an agent that died leaves
    listener = _bind(str(dead))
    try:
        assert (dead.stat().st_mode & 0o777) == 0o600
    finally:
        listener.close()
    with pytest.raises(ConfigurationError, match="cannot make the agent's socket"):
        _bind(str(tmp_path / "missing" / "agent.sock"))


def test_the_agent_command_needs_a_socket(monkeypatch, capsys) -> None:
    monkeypatch.delenv("PGSNAP_AGENT", raising=False)
    assert main(["agent"]) == 2
    assert "needs a socket to listen on" in capsys.readouterr().err


# --------------------------------------------------------------------------- pgsnap itself


@pytest.mark.postgres
def test_backup_list_and_recovery_through_a_real_agent(cli_env: CliEnv, tmp_path: Path) -> None:
    """``pgsnap agent`` serves the real commands: a backup, a listing and a recovery run
    in its forks give what they give in a process of their own."""
    env = cli_env
    sock = tmp_path / "agent.sock"
    agent = Agent(
        [sys.executable, "-m", "pgsnap", "agent", "-v", "--socket", str(sock)],
        sock,
        tmp_path / "agent.log",
        env=_env(),
        cwd=tmp_path,
    )

    def pgsnap(*argv: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "pgsnap", *argv, "-c", str(env.config)],
            env=_env(PGSNAP_AGENT=str(sock)),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert "running in this process" not in done.stderr
        assert "running here" not in done.stderr
        return done.returncode, done.stdout, done.stderr

    try:
        env.write(1)
        code, out, err = pgsnap("backup", "--label", "through the agent")
        assert code == 0, err
        assert out.startswith("backup ") and " done: " in out
        assert "[1/7] started" in err  # progress on the caller's stderr
        code, out, err = pgsnap("list", "--json")
        assert code == 0, err
        (record,) = json.loads(out)
        assert (record["state"], record["label"]) == ("done", "through the agent")
        env.write(2)
        env.server.switch_wal_and_wait_archived()
        env.crash_and_lose(env.server.data_dir)
        code, out, err = pgsnap("recover", "--yes")
        assert code == 0, err
        assert env.batches() == {1: 3, 2: 3}
        code, out, err = pgsnap("recover", "--yes", "--xid", "x")
        assert code == 2 and "usage" in err  # a usage error: argparse's exit, passed on
        # wal-push, as PostgreSQL runs it, goes to its own module in the fork too.
        done = subprocess.run(
            [sys.executable, "-m", "pgsnap", "-c", str(tmp_path / "no.toml"), "wal-push", "x"],
            env=_env(PGSNAP_AGENT=str(sock)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr == (
            f"pgsnap ERROR: wal-push: cannot read configuration {tmp_path / 'no.toml'}: "
            "No such file or directory\n"
        )
        log = agent.log.read_text()
        for command in ("backup", "list", "recover", "wal-push"):
            assert f"runs '{command}'" in log, log
        assert "through the agent" not in log  # names commands, never their arguments
    finally:
        agent.stop()
    assert agent.proc.returncode == 0, agent.log.read_text()


@pytest.mark.postgres
def test_postgres_archives_through_an_agent_of_its_own_user(pg_server: Any) -> None:
    """``archive_command`` runs ``wal-push`` as the postgres user: an agent of that user
    serves it (docs/reference/agent.md, "WAL archiving"), and every segment is archived."""
    owner = pwd.getpwnam("postgres")
    shared = Path(tempfile.mkdtemp(prefix="pgsnap-agent-wal-", dir="/tmp"))
    try:
        shared.chmod(0o755)
        store, run = shared / "wal", shared / "run"
        for directory in (store, run):
            directory.mkdir(mode=0o700)
            os.chown(directory, owner.pw_uid, owner.pw_gid)
        sock, config = run / "agent.sock", shared / "pgsnap.toml"
        prefix = (
            f"env PGSNAP_AGENT={shlex.quote(str(sock))} PYTHONPATH={shlex.quote(str(ROOT))} "
            f"{shlex.quote(sys.executable)} -m pgsnap -c {shlex.quote(str(config))}"
        )
        server = pg_server(
            wal_segsize_mb=1,
            archive=True,
            settings={"archive_command": f"{prefix} wal-push %p", "autovacuum": False},
        )
        text = write_config(server, shared).read_text()
        old = f'[archive]\npath = "{server.archive_dir}"\n'
        assert old in text
        config.write_text(text.replace(old, f'[archive]\nformat = "pgsnap"\npath = "{store}"\n'))
        as_postgres = ["runuser", "-u", "postgres", "--", sys.executable, "-m", "pgsnap"]
        agent = Agent(
            [*as_postgres, "agent", "-v", "--socket", str(sock)],
            sock,
            shared / "agent.log",
            env=_env(),
            cwd="/",
        )
        try:
            server.start()
            server.sql("CREATE TABLE t (n int)")
            for n in range(3):
                server.sql("INSERT INTO t VALUES (%s)", (n,))
                server.sql("SELECT pg_switch_wal()")
                server.wait_for_archive_idle(timeout=60)
            status = server.sql("SELECT archived_count, failed_count FROM pg_stat_archiver")[0]
        finally:
            agent.stop()
        archived, failed = int(status[0]), int(status[1])
        log = agent.log.read_text()
        assert archived >= 3 and failed == 0, (status, server.log_file.read_text()[-3000:], log)
        assert log.count("runs 'wal-push'") >= archived, log
        assert "running in this process" not in server.log_file.read_text()
        assert len([p for p in store.rglob("*") if p.is_file()]) >= archived
    finally:
        shutil.rmtree(shared, ignore_errors=True)
