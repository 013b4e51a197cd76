"""The ``pgsnap`` command without a server: usage errors, configuration errors, help.

Every test runs ``main(argv)`` in-process and checks the exit code, that the
message goes to stderr, and that nothing secret is printed. The commands that
need PostgreSQL are in tests/integration/test_cli.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

import pgsnap
from pgsnap.cli import EXIT_CODES, main
from pgsnap.errors import PgsnapError
from pgsnap.operations import Operation, OperationContext, Outputs, Target, default_operations

SECRET = "s3cr3t-Pa55w0rd-do-not-print"

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """``run(*argv) -> (exit code, stdout, stderr)``; argparse's SystemExit counts as a return."""

    def call(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse exits instead of returning (see the report)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        out, err = capsys.readouterr()
        return code, out, err

    return call


def write_config(
    tmp_path: Path,
    *,
    database: Sequence[str] = (),
    storage: str = 'backend = "mock"',
    options: Sequence[str] = (),
    volumes: str | None = None,
    drop: str | None = None,
) -> Path:
    """A valid configuration (mock backend, no server behind it), with changes."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (tmp_path / "archive").mkdir(exist_ok=True)
    sections = {
        "database": [
            f'conninfo = "host={tmp_path / "nosock"} port=5999 user=postgres"',
            f'data_directory = "{data}"',
            *database,
        ],
        "storage": [storage],
        "storage.options": [f'state_file = "{tmp_path / "mock.json"}"', *options],
        "archive": [f'path = "{tmp_path / "archive"}"'],
        "catalog": [f'path = "{tmp_path / "catalog"}"'],
    }
    text = "".join(
        f"[{name}]\n" + "\n".join(lines) + "\n\n"
        for name, lines in sections.items()
        if name != drop
    )
    text += (
        volumes
        if volumes is not None
        else f'[[volume]]\nid = "vol-data"\nrole = "data"\nmount_point = "{data}"\n'
    )
    path = tmp_path / "pgsnap.toml"
    path.write_text(text)
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path)


# --------------------------------------------------------------------------- help


def test_help_lists_every_exit_code(run: Run) -> None:
    code, out, err = run("--help")
    assert code == 0
    assert err == ""
    assert "exit codes:" in out
    for number, meaning in EXIT_CODES.items():
        assert f"{number:>3}  {meaning}" in out
    for command in ("demo", "check", "backup", "list", "plan-recovery", "recover", "wal"):
        assert command in out


def test_no_help_shows_docstring_markup(run: Run) -> None:
    """Help is read in a terminal: no reStructuredText roles or literals, in the
    command's help nor in any subcommand's (a newcomer saw "The ``pgsnap`` command.")."""
    from pgsnap.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = [parser.format_help()]
    for name, command in sub.choices.items():
        helps.append(command.format_help())
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        helps += [c.format_help() for a in nested for c in a.choices.values()]
        assert name in helps[0]
    assert len(helps) > 30
    for text in helps:
        for markup in ("``", ":data:", ":class:", ":func:", ":meth:", ":mod:"):
            assert markup not in text, (markup, text[:400])
    code, out, _ = run("--help")
    assert code == 0 and out.split("\n\n")[1].startswith("Storage-snapshot backups")


def test_recover_help_shows_targets_and_yes(run: Run) -> None:
    code, out, _ = run("recover", "--help")
    assert code == 0
    for option in ("--time", "--lsn", "--xid", "--name", "--immediate", "--yes", "--wal-lost"):
        assert option in out


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "required: COMMAND"),
        (("check",), "-c/--config"),
        (("teleport", "-c", "x.toml"), "invalid choice"),
        (("recover", "-c", "x.toml", "--action", "explode"), "invalid choice"),
        (("plan-recovery", "-c", "x.toml", "--xid", "seven"), "invalid int value"),
        (("backup", "-c", "x.toml", "--password", "x"), "unrecognized arguments"),
    ],
)
def test_argument_errors_exit_2_on_stderr(run: Run, argv: tuple[str, ...], message: str) -> None:
    code, out, err = run(*argv)
    assert code == 2
    assert out == ""
    assert message in err


@pytest.mark.parametrize("command", ["plan-recovery", "recover"])
def test_two_targets_are_refused(run: Run, config: Path, command: str) -> None:
    code, _, err = run(command, "-c", str(config), "--lsn", "0/3000060", "--xid", "735")
    assert code == 2
    assert "give one recovery target, not 2 (lsn, xid)" in err
    assert "exactly one target" in err  # the hint
    code, _, err = run(command, "-c", str(config), "--immediate", "--name", "p", "--time", "x")
    assert code == 2
    assert "not 3 (time, name, immediate)" in err


def test_naive_time_is_refused(run: Run, config: Path) -> None:
    code, out, err = run("plan-recovery", "-c", str(config), "--time", "2026-11-30 12:00:00")
    assert code == 2
    assert out == ""
    assert "has no time zone" in err


def test_malformed_time_and_lsn_are_refused(run: Run, config: Path) -> None:
    code, _, err = run("plan-recovery", "-c", str(config), "--time", "yesterday")
    assert code == 2
    assert "malformed time 'yesterday'" in err
    assert "+00:00" in err  # the hint shows the format
    code, _, err = run("plan-recovery", "-c", str(config), "--lsn", "not-an-lsn")
    assert code == 2
    assert "not-an-lsn" in err


def test_bad_timeline_is_refused(run: Run, config: Path) -> None:
    code, _, err = run("plan-recovery", "-c", str(config), "--timeline", "newest")
    assert code == 2
    assert "invalid recovery timeline 'newest'" in err


# --------------------------------------------------------------------------- configuration errors


def test_missing_config(run: Run, tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    for command in ("check", "backup", "list", "wal", "plan-recovery", "recover"):
        code, out, err = run(command, "-c", str(missing))
        assert code == 2, command
        assert out == ""
        assert f"cannot read configuration {missing}" in err
        assert "Traceback" not in err


def test_config_that_is_not_toml(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "pgsnap.toml"
    path.write_text("[database\nconninfo = ")
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "is not valid TOML" in err


@pytest.mark.parametrize("section", ["database", "storage", "archive", "catalog"])
def test_config_missing_a_section(run: Run, tmp_path: Path, section: str) -> None:
    path = write_config(tmp_path, drop=section)
    if section == "storage":  # [storage.options] alone would recreate [storage]
        text = path.read_text()
        start = text.index("[storage.options]")
        path.write_text(text[:start] + text[text.index("\n\n", start) + 2 :])
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert f"lacks the [{section}] section" in err
    assert "docs/cli.md" in err


def test_config_without_volumes(run: Run, tmp_path: Path) -> None:
    code, _, err = run("list", "-c", str(write_config(tmp_path, volumes="")))
    assert code == 2
    assert "lacks the [volume] section" in err


@pytest.mark.parametrize(
    "command",
    [
        ("check",),
        ("list", "--json"),
        ("backup",),
        ("wal",),
        ("plan-recovery", "--immediate"),
        ("recover", "--yes"),
    ],
)
def test_password_in_config_is_refused_and_never_printed(
    run: Run, tmp_path: Path, command: tuple[str, ...]
) -> None:
    path = write_config(tmp_path, database=[f'password = "{SECRET}"'])
    code, out, err = run(command[0], "-c", str(path), *command[1:])
    assert code == 2
    assert "must not hold a password" in err
    assert "password_env" in err  # the hint says what to do instead
    assert SECRET not in out + err
    assert not (tmp_path / "catalog").exists()  # refused before anything was made


def test_a_storage_password_in_config_is_refused_and_never_printed(
    run: Run, tmp_path: Path
) -> None:
    """[storage.options] password (which create_backend would pass to the backend's
    constructor) is refused before any backend is built; the password never shows."""
    path = write_config(
        tmp_path,
        storage='backend = "powerflex"',
        options=['gateway = "https://pfgw.example"', f'password = "{SECRET}"'],
    )
    code, out, err = run("check", "-c", str(path))
    assert code == 2
    assert "must not hold a password" in err
    assert "[storage.options] password" in err
    assert "password_env" in err  # the hint says what to do instead
    assert SECRET not in out + err
    assert not (tmp_path / "catalog").exists()


def test_password_file_that_cannot_be_read(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path, database=[f'password_file = "{tmp_path / "missing"}"'])
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "cannot read password_file" in err


def test_password_from_the_environment_is_not_printed_on_failure(tmp_path: Path) -> None:
    # A real process, so that -vv really logs to stderr (pytest owns logging in-process).
    path = write_config(tmp_path, database=['password_env = "PGSNAP_TEST_PASSWORD"'])
    src = str(Path(pgsnap.__file__).resolve().parent.parent)
    env = {
        **os.environ,
        "PGSNAP_TEST_PASSWORD": SECRET,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pgsnap.cli", "-vv", "check", "-c", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 4  # no server: a blocking finding
    assert "error: the server is not running" in proc.stdout
    assert "[server]" in proc.stdout
    assert "cannot connect to PostgreSQL" in proc.stderr  # -vv: the connection was tried
    assert "DEBUG" in proc.stderr  # the log level did rise
    assert SECRET not in proc.stdout + proc.stderr


def test_unknown_backend_lists_the_available_ones(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path, storage='backend = "teleport"')
    code, out, err = run("list", "-c", str(path))
    assert code == 2
    assert out == ""
    assert "no storage backend named 'teleport'" in err
    assert "available: " in err
    assert "mock" in err.split("available: ", 1)[1]


def test_backend_option_it_does_not_take(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path, options=["colour = 'blue'"])
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "does not accept option(s) 'colour'" in err
    assert "it takes: capabilities, clock, root" in err
    # Issue 19: the hint names the options, not the constructor's ~900-character signature.
    assert "Callable" not in err and "None =" not in err and len(err) < 400
    path = write_config(tmp_path, options=["state_fil = 'x'"])
    code, _, err = run("list", "-c", str(path))
    assert "did you mean 'state_file'?" in err


def test_mock_volume_misconfigured(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path, options=['volumes = [{ id = "vol-data", pth = "/x" }]'])
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "unknown key(s): pth" in err


def test_corrupt_mock_state_is_reported_with_its_hint(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    (tmp_path / "mock.json").write_text("{garbage")
    code, _, err = run("list", "-c", str(path))
    assert code == 1  # a BackendError: the storage failed, the configuration is fine
    assert "mock.json' is corrupt" in err
    assert "move it away" in err


# --------------------------------------------------------------------------- no server needed


def test_list_with_an_empty_catalog(run: Run, config: Path) -> None:
    assert run("list", "-c", str(config))[:2] == (0, "no backups\n")
    code, out, _ = run("list", "-c", str(config), "--json")
    assert code == 0
    assert json.loads(out) == []


def test_plan_recovery_without_backups_is_refused(run: Run, config: Path) -> None:
    code, out, err = run("plan-recovery", "-c", str(config))
    assert code == 3
    assert out == ""
    assert err.startswith("pgsnap: refused: ")
    assert "backup" in err


def test_recover_without_backups_is_refused_before_asking(run: Run, config: Path) -> None:
    code, _, err = run("recover", "-c", str(config), "--immediate")
    assert code == 3
    assert "refusing to recover without confirmation" not in err
    assert not (config.parent / "catalog" / "journal").exists()


class _FailingCluster:
    """Plans fine; a step of its execution fails with an error of any pgsnap class."""

    def __init__(self, error: PgsnapError) -> None:
        from pgsnap.catalog import MemoryCatalog

        self.error = error
        self.catalog = MemoryCatalog()

    def check_not_busy(self, kind: str = "recovery") -> None:
        """Nobody holds the cluster."""

    def plan_recovery(self, *_args: object, **_kwargs: object) -> object:
        class _Plan:
            def explain(self) -> str:
                return "Recovery plan (stub)"

        return _Plan()

    def execute(self, *_args: object, **_kwargs: object) -> object:
        from pgsnap.errors import ExecutionError

        raise ExecutionError(
            f"step restore failed: {self.error}", step_id="restore", cause=self.error
        )


@pytest.mark.parametrize(
    "error",
    [
        pytest.param("configuration", id="ConfigurationError-in-a-step"),
        pytest.param("capability", id="UnsupportedCapability-in-a-step"),
    ],
)
def test_a_failed_execution_exits_1(
    run: Run, config: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    # The executor runs compensations and raises an ExecutionError whose cause is the step's
    # own error: whatever its class (ConfigurationError would mean 2, a PlanningError 3),
    # execution failed: 1.
    from pgsnap import cli
    from pgsnap.errors import ConfigurationError, UnsupportedCapability

    exc = (
        ConfigurationError("the server on /data is running")
        if error == "configuration"
        else UnsupportedCapability("no clones")
    )
    monkeypatch.setattr(cli, "load_cluster", lambda _path, **_kw: _FailingCluster(exc))
    code, _, err = run("recover", "-c", str(config), "--yes")
    assert code == 1
    assert err.startswith("pgsnap: failed: step restore failed: ")


# --------------------------------------------------------------------------- cli.py bugs
#
# Configuration mistakes are usage errors (exit 2), never tracebacks.


def test_storage_without_backend_name_is_a_usage_error(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path, storage="")
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "backend" in err


def test_unknown_volume_role_is_a_usage_error(run: Run, tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = write_config(
        tmp_path, volumes=f'[[volume]]\nid = "v"\nrole = "dta"\nmount_point = "{data}"\n'
    )
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "dta" in err


def test_password_in_conninfo_is_refused(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    text = path.read_text().replace("user=postgres", f"user=postgres password={SECRET}")
    path.write_text(text)
    code, out, err = run("list", "-c", str(path))
    assert code == 2
    assert SECRET not in out + err


def test_unset_password_env_is_a_usage_error(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGSNAP_TEST_PASSWORD", raising=False)
    path = write_config(tmp_path, database=['password_env = "PGSNAP_TEST_PASSWORD"'])
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "PGSNAP_TEST_PASSWORD" in err


def test_main_returns_2_for_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 2


def test_resume_with_nothing_interrupted(run: Run, config: Path) -> None:
    code, out, _ = run("resume", "-c", str(config))
    assert code == 0
    assert "nothing to resume" in out


def test_resume_shows_an_interrupted_plan_and_waits_for_yes(run: Run, config: Path) -> None:
    from pgsnap.cli import load_cluster
    from pgsnap.plan import Plan, Step

    cluster = load_cluster(config)
    default_operations().register(Interrupt.name, Interrupt, replace=True)
    try:
        plan = Plan(
            "recovery",
            (Step.of("custom", Interrupt(), description="a custom step", reason="test"),),
            "fp-x",
        )
        with pytest.raises(KeyboardInterrupt):
            cluster.executor().run(plan)
        code, out, _err = run("resume", "-c", str(config))
    finally:
        default_operations().unregister(Interrupt.name)
    assert code == 0  # issue 19: showing what would be resumed is not a usage error
    assert "a custom step" in out
    assert "nothing was done: pass --yes" in out


@attrs.frozen
class Interrupt(Operation):
    """A step interrupted by Ctrl-C: its run stays resumable."""

    name: ClassVar[str] = "test.interrupt"
    target: ClassVar[Target] = Target.HOST

    def run(self, ctx: OperationContext) -> Outputs:
        raise KeyboardInterrupt


def test_the_database_host_can_be_reached_over_ssh(tmp_path: Path) -> None:
    from pgsnap.cli import load_cluster
    from pgsnap.host import SshRunner

    path = write_config(tmp_path)
    path.write_text(
        path.read_text() + '\n[host]\nssh = "db1.example.com"\nuser = "root"\n'
        'port = 2222\nidentity_file = "keys/id"\nname = "sdc-db1"\n'
    )
    cluster = load_cluster(path)
    assert isinstance(cluster.host.runner, SshRunner)
    assert cluster.host.description == "ssh root@db1.example.com:2222"
    assert cluster.host.name == "sdc-db1"
    assert cluster.adapter.host is cluster.host


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ('ssh = "db1"\nidentityfile = "x"', "identityfile"),
        ('user = "root"', "no ssh destination"),
        ('ssh = "db1"\nport = "22"', "port must be a number"),
    ],
)
def test_bad_host_sections_are_usage_errors(
    run: Run, tmp_path: Path, section: str, match: str
) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text() + f"\n[host]\n{section}\n")
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert match in err


# --------------------------------------------------------------------------- issue 7, item 8:
# untyped errors: every bad argument is a typed pgsnap error with a hint, never a traceback.


@pytest.mark.parametrize(
    ("kwargs", "message", "hint"),
    [
        ({"lost": ["bogus"]}, "'bogus' is not a volume role", "data, wal, tablespace"),
        ({"lost": [7]}, "7 is not a volume role", "data, wal, tablespace"),
        ({"action": "explode"}, "'explode' is not a recovery action", "promote, pause, shutdown"),
        ({"action": None}, "None is not a recovery action", "promote, pause, shutdown"),
        ({"timeline": "newest"}, "invalid recovery timeline 'newest'", "'latest', 'current'"),
        ({"timeline": 0}, "invalid recovery timeline 0", "'latest', 'current'"),
        ({"timeline": True}, "invalid recovery timeline True", "'latest', 'current'"),
        ({"timeline": 2**32}, "invalid recovery timeline 4294967296", "1 to 4294967295"),
        ({"target": "latest"}, "target must be a RecoveryTarget", "RecoveryTarget.latest()"),
        ({"backup_id": 42}, "backup_id must be a backup id", "pgsnap list"),
        ({"backup_id": "../x"}, "invalid backup id '../x'", "letters, digits"),
        ({"safety_snapshot": "no"}, "safety_snapshot must be True or False", "True or False"),
        ({"recovery_timeout": -1}, "recovery_timeout must be a positive number of seconds", ""),
        ({"server_timeout": float("nan")}, "server_timeout must be a positive number", ""),
        ({"server_timeout": "300"}, "server_timeout must be a positive number", "seconds"),
        ({"restore_timeout": 0}, "restore_timeout must be a positive number", ""),
        ({"device_timeout": True}, "device_timeout must be a positive number", ""),
    ],
)
def test_plan_recovery_arguments_are_typed_errors(
    config: Path, kwargs: dict[str, object], message: str, hint: str
) -> None:
    from pgsnap.cli import load_cluster
    from pgsnap.errors import ConfigurationError, InputError

    cluster = load_cluster(config)
    with pytest.raises((InputError, ConfigurationError)) as info:
        cluster.plan_recovery(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)  # callers catching ValueError keep working
    assert message in info.value.message
    assert info.value.hint and hint in info.value.hint


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wal_timeout": -5}, "wal_timeout must be a positive number of seconds"),
        ({"wal_timeout": float("inf")}, "wal_timeout must be a positive number of seconds"),
        ({"backup_id": "a/b"}, "invalid backup id 'a/b'"),
        ({"label": 5}, "label must be text"),
        ({"fast": "yes"}, "fast must be True or False"),
        ({"secure_snapshots": 1}, "secure_snapshots must be True or False"),
    ],
)
def test_plan_backup_arguments_are_typed_errors(
    config: Path, kwargs: dict[str, object], message: str
) -> None:
    from pgsnap.cli import load_cluster
    from pgsnap.errors import InputError

    cluster = load_cluster(config)
    label = kwargs.pop("label", None)
    with pytest.raises(InputError, match=message) as info:
        cluster.plan_backup(label, **kwargs)  # type: ignore[arg-type]
    assert info.value.hint
    with pytest.raises(InputError, match=message):
        cluster.backup(label, **kwargs)  # type: ignore[arg-type]


def test_volume_without_role_is_a_usage_error(run: Run, tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = write_config(tmp_path, volumes=f'[[volume]]\nid = "v"\nmount_point = "{data}"\n')
    code, out, err = run("list", "-c", str(path))
    assert (code, out) == (2, "")
    assert "[[volume]] #1 lacks 'role'" in err
    assert "data, wal, tablespace, archive" in err  # the hint lists the roles
    assert "Traceback" not in err and "KeyError" not in err


@pytest.mark.parametrize(
    ("volume", "message"),
    [
        ('role = "data"\nmount_point = "DATA"', "[[volume]] #1 lacks 'id'"),
        ('id = "v"\nrole = "data"', "[[volume]] #1 lacks 'mount_point'"),
        ('id = "v"\nrole = 3\nmount_point = "DATA"', "[[volume]] #1 has role 3"),
        ('id = "v"\nrole = "tablespace"\nmount_point = "DATA"', "tablespace_oid"),
        ('id = "v"\nrole = "data"\nmount_point = "DATA"\ntablespace_oid = "x"', "tablespace_oid"),
    ],
)
def test_bad_volumes_are_usage_errors(run: Run, tmp_path: Path, volume: str, message: str) -> None:
    volume = volume.replace("DATA", str(tmp_path / "data"))
    path = write_config(tmp_path, volumes=f"[[volume]]\n{volume}\n")
    code, _, err = run("list", "-c", str(path))
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('database = "x"', id="section-not-a-table"),
        pytest.param('[volume]\nid = "v"', id="volume-not-an-array"),
        pytest.param('volume = ["x"]', id="volume-of-strings"),
    ],
)
def test_sections_of_the_wrong_type_are_usage_errors(run: Run, tmp_path: Path, text: str) -> None:
    path = write_config(tmp_path, volumes="")
    body = path.read_text()
    if text.startswith("database"):
        body = body.replace("[database]", "[unused]", 1)
        body = text + "\n" + body
        body += f'[[volume]]\nid = "v"\nrole = "data"\nmount_point = "{tmp_path / "data"}"\n'
    elif text.startswith("volume"):
        body = text + "\n" + body
    else:
        body += text + "\n"
    path.write_text(body)
    code, _, err = run("list", "-c", str(path))
    assert code == 2, err
    assert "Traceback" not in err
    assert "pgsnap: " in err


class _ClosedPipe:
    """A stdout whose reader has gone (``pgsnap list | head -0``)."""

    def write(self, _text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("no file descriptor")


def test_closed_stdout_exits_141_quietly(
    config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgsnap.cli import EXIT_BROKEN_PIPE

    assert EXIT_BROKEN_PIPE == 141 and 141 in EXIT_CODES
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["list", "-c", str(config)]) == 141
    assert capsys.readouterr().err == ""


def test_closed_stdout_in_a_real_pipe_exits_141_without_a_traceback(tmp_path: Path) -> None:
    """``pgsnap list | head -0``: the reader exits before pgsnap writes."""
    path = write_config(tmp_path)
    src = str(Path(pgsnap.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    read_end, write_end = os.pipe()
    os.close(read_end)  # head -0 has already exited
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pgsnap.cli", "list", "-c", str(path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (("--time", "9999-12-31 23:59:59.999999-12:00"), 2, "out of range"),
        (("--time", "0001-01-01 00:00:00+14:00"), 2, "out of range"),
        (("--lsn", "FFFFFFFF/FFFFFFFF"), 3, "pgsnap: refused: "),
        (("--lsn", "1FFFFFFFF/0"), 2, "malformed LSN"),
        (("--xid", "99999999999999999999"), 2, "out of range"),
        (("--xid", "-1"), 2, "out of range"),
    ],
)
def test_extreme_targets_end_with_a_message_and_an_exit_code(
    run: Run, config: Path, argv: tuple[str, ...], code: int, message: str
) -> None:
    got, out, err = run("plan-recovery", "-c", str(config), *argv)
    assert got == code, err
    assert out == ""
    assert message in err
    assert "Traceback" not in err
    assert "18446744073709551616" not in err  # never a number pgsnap computed


# --------------------------------------------------------------------------- issue 7, item 12:
# unknown configuration keys are refused with the nearest valid name.


@pytest.mark.parametrize(
    ("section", "line", "where", "suggestion"),
    [
        ("database", 'connifo = "host=/tmp"', "[database]", "conninfo"),
        ("database", 'bindirr = "/usr/lib/postgresql/15/bin"', "[database]", "bindir"),
        ("database", 'os-user = "postgres"', "[database]", "os_user"),
        ("storage", 'backnd = "mock"', "[storage]", "backend"),
        ("archive", 'pth = "/srv/wal"', "[archive]", "path"),
        ("catalog", 'jornal = "j"', "[catalog]", "journal"),
    ],
)
def test_unknown_keys_are_refused_with_the_nearest_name(
    run: Run, tmp_path: Path, section: str, line: str, where: str, suggestion: str
) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1))
    code, out, err = run("list", "-c", str(path))
    assert (code, out) == (2, "")
    key = line.split(" =", 1)[0]
    assert f"{where} has an unknown key {key!r}" in err
    assert f"did you mean {suggestion!r}?" in err
    assert not (tmp_path / "catalog").exists()  # refused before anything was made


def test_unknown_keys_in_volume_host_and_timeouts(run: Run, tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = write_config(
        tmp_path,
        volumes=f'[[volume]]\nid = "v"\nrole = "data"\nmountpoint = "{data}"\n',
    )
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "[[volume]] #1 has an unknown key 'mountpoint'" in err
    assert "did you mean 'mount_point'?" in err

    path = write_config(tmp_path)
    path.write_text(path.read_text() + '\n[host]\nssh = "db1"\nidentityfile = "x"\n')
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "[host] has an unknown key 'identityfile'" in err
    assert "did you mean 'identity_file'?" in err

    path = write_config(tmp_path)
    path.write_text(path.read_text() + "\n[timeouts]\nsever = 300\n")
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "[timeouts] has an unknown key 'sever'" in err
    assert "did you mean 'server'?" in err


def test_unknown_sections_are_refused_with_the_nearest_name(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text() + "\n[timeout]\nserver = 300\n")
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "unknown section [timeout]" in err
    assert "did you mean [timeouts]?" in err


def test_a_key_with_no_near_name_lists_the_valid_ones(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("[archive]\n", "[archive]\nzzz = 1\n", 1))
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "[archive] has an unknown key 'zzz'" in err
    assert "[archive] takes: path, format, gzip" in err


def test_archive_gzip_reads_compressed_segments(config: Path, tmp_path: Path) -> None:
    import gzip as gz

    from pgsnap.cli import load_cluster
    from pgsnap.wal import DirectoryWalArchive

    def load_archive() -> DirectoryWalArchive:
        archive = load_cluster(config).archive
        assert isinstance(archive, DirectoryWalArchive)
        return archive

    name = "000000010000000000000001"
    archive = Path(load_archive().path)
    archive.mkdir(parents=True, exist_ok=True)
    (archive / f"{name}.gz").write_bytes(gz.compress(b"\0" * 16))
    plain = load_archive()
    assert plain.unusable(16)  # a .gz it will not decompress is reported, not ignored
    assert "gzip -dc" not in plain.restore_command()
    config.write_text(config.read_text().replace("[archive]\n", "[archive]\ngzip = true\n", 1))
    zipped = load_archive()
    assert zipped.unusable(16) == ()
    assert zipped.list_names(16) == (f"{name}.gz",)
    assert "gzip -dc" in zipped.restore_command()


def test_archive_gzip_must_be_a_boolean(run: Run, config: Path) -> None:
    config.write_text(config.read_text().replace("[archive]\n", '[archive]\ngzip = "yes"\n', 1))
    code, _, err = run("list", "-c", str(config))
    assert code == 2
    assert "[archive] gzip must be true or false, not 'yes'" in err


# --------------------------------------------------------------------------- issue 7, item 10:
# every wait has an option, in the configuration ([timeouts]) and on the command line.


class _Recorder:
    """Stands in for a Cluster: records what the CLI asks of it, then refuses to plan."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []

    def check_not_busy(self, kind: str = "recovery") -> None:
        """Nobody holds the cluster."""

    def plan_recovery(self, *_args: object, **kwargs: object) -> object:
        from pgsnap.errors import NoBackupForTarget

        self.calls.append(("plan_recovery", kwargs))
        raise NoBackupForTarget("recorded", hint="test")

    def plan_backup(self, *_args: object, **kwargs: object) -> object:
        from pgsnap.errors import PreflightError

        self.calls.append(("plan_backup", kwargs))
        raise PreflightError("recorded", hint="test")


def _recorded(
    run: Run, monkeypatch: pytest.MonkeyPatch, path: Path, *argv: str
) -> dict[str, object]:
    from pgsnap import cli

    real = cli.load_cluster
    recorder = _Recorder()

    def load(config: str, **kwargs: Any) -> object:
        cluster = real(config, **kwargs)
        recorder.catalog = cluster.catalog  # type: ignore[attr-defined]
        return recorder

    monkeypatch.setattr(cli, "load_cluster", load)
    code, _, err = run(argv[0], "-c", str(path), *argv[1:])
    assert code == 3, err
    ((_name, kwargs),) = recorder.calls
    return kwargs


def test_timeouts_default_to_the_built_in_values(
    run: Run, config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kwargs = _recorded(run, monkeypatch, config, "plan-recovery")
    assert {k: v for k, v in kwargs.items() if k.endswith("_timeout")} == {
        "server_timeout": 120.0,
        "recovery_timeout": 600.0,
        "restore_timeout": 3600.0,
        "device_timeout": 120.0,
    }
    assert _recorded(run, monkeypatch, config, "backup")["wal_timeout"] == 60.0


def test_timeouts_come_from_the_config_and_flags_win(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path)
    path.write_text(
        path.read_text() + "\n[timeouts]\nconnect = 3\nwal = 90\nserver = 300\nrecovery = 1200\n"
        "restore = 7200\ndevice = 30\ncatalog_lock = 20\n"
    )
    for command in ("plan-recovery", "recover"):
        kwargs = (
            _recorded(run, monkeypatch, path, command, "--yes")
            if command == "recover"
            else _recorded(run, monkeypatch, path, command)
        )
        assert kwargs["server_timeout"] == 300
        assert kwargs["recovery_timeout"] == 1200
        assert kwargs["restore_timeout"] == 7200
        assert kwargs["device_timeout"] == 30
    kwargs = _recorded(
        run,
        monkeypatch,
        path,
        "plan-recovery",
        "--server-timeout",
        "900",
        "--recovery-timeout",
        "5",
        "--restore-timeout",
        "60",
        "--device-timeout",
        "7.5",
    )
    assert (kwargs["server_timeout"], kwargs["recovery_timeout"]) == (900, 5)
    assert (kwargs["restore_timeout"], kwargs["device_timeout"]) == (60, 7.5)
    assert _recorded(run, monkeypatch, path, "backup")["wal_timeout"] == 90
    assert _recorded(run, monkeypatch, path, "backup", "--wal-timeout", "15")["wal_timeout"] == 15

    monkeypatch.undo()  # the real load_cluster again
    from pgsnap.cli import Timeouts, load_cluster, load_timeouts

    assert load_timeouts(path) == Timeouts(
        connect=3, wal=90, server=300, recovery=1200, restore=7200, device=30, catalog_lock=20
    )
    from pgsnap.adapters.postgres import PostgresAdapter
    from pgsnap.catalog import DirectoryCatalog

    cluster = load_cluster(path)
    assert isinstance(cluster.adapter, PostgresAdapter)
    assert isinstance(cluster.catalog, DirectoryCatalog)
    assert cluster.adapter._connect_timeout == 3
    assert cluster.catalog.lock_timeout == 20
    cluster = load_cluster(path, timeouts=attrs.evolve(load_timeouts(path), connect=8))
    assert isinstance(cluster.adapter, PostgresAdapter)
    assert cluster.adapter._connect_timeout == 8


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
@pytest.mark.parametrize(
    "flag",
    [
        "--server-timeout",
        "--recovery-timeout",
        "--restore-timeout",
        "--device-timeout",
        "--connect-timeout",
        "--catalog-lock-timeout",
    ],
)
def test_bad_timeout_flags_are_usage_errors(run: Run, config: Path, flag: str, value: str) -> None:
    code, out, err = run("plan-recovery", "-c", str(config), f"{flag}={value}")
    assert (code, out) == (2, "")
    assert "positive number of seconds" in err


@pytest.mark.parametrize("value", ['"300"', "0", "-2", "true", "nan"])
def test_bad_timeouts_in_the_config_are_usage_errors(run: Run, tmp_path: Path, value: str) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text() + f"\n[timeouts]\nserver = {value}\n")
    code, _, err = run("list", "-c", str(path))
    assert code == 2
    assert "[timeouts] server must be a positive number of seconds" in err


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("backup", ["--wal-timeout", "--connect-timeout"]),
        (
            "plan-recovery",
            [
                "--server-timeout",
                "--recovery-timeout",
                "--restore-timeout",
                "--device-timeout",
                "--connect-timeout",
            ],
        ),
        (
            "recover",
            [
                "--server-timeout",
                "--recovery-timeout",
                "--restore-timeout",
                "--device-timeout",
                "--connect-timeout",
            ],
        ),
        ("resume", ["--connect-timeout"]),
        ("check", ["--connect-timeout"]),
    ],
)
def test_every_wait_has_a_flag(run: Run, command: str, flags: list[str]) -> None:
    code, out, _ = run(command, "--help")
    assert code == 0
    for flag in flags:
        assert flag in out


def test_the_docs_name_every_timeout_key_and_flag() -> None:
    docs = (Path(pgsnap.__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    from pgsnap.cli import TIMEOUT_KEYS

    assert "[timeouts]" in docs
    for key in TIMEOUT_KEYS:
        assert f"\n{key} = " in docs, key
        assert f"--{key.replace('_', '-')}-timeout" in docs, key


# --------------------------------------------------------------------------- issue 7, item 11
# (the parts that need no server): unreadable catalog records are named everywhere.


def _corrupt_record(config: Path, backup_id: str = "20261130T000000000Z") -> Path:
    from pgsnap.model import to_dict
    from tests.unit.test_model import _record

    doc = to_dict(_record(id=backup_id))
    doc["start_lsn"] = "garbage"
    catalog = config.parent / "catalog"
    catalog.mkdir(exist_ok=True)
    path = catalog / f"{backup_id}.json"
    path.write_text(json.dumps(doc))
    return path


def test_list_names_an_unreadable_record(run: Run, config: Path) -> None:
    bad = _corrupt_record(config)
    code, out, err = run("list", "-c", str(config))
    assert code == 0, err
    assert "no backups" not in out
    assert f"UNREADABLE {bad}: " in out
    assert "malformed LSN 'garbage'" in out
    code, out, err = run("list", "-c", str(config), "--json")
    assert code == 0
    assert json.loads(out) == []  # stdout stays a list of records
    assert f"pgsnap: warning: catalog file {bad} is unreadable" in err


def test_plan_recovery_names_an_unreadable_record(run: Run, config: Path) -> None:
    bad = _corrupt_record(config)
    code, out, err = run("plan-recovery", "-c", str(config))
    assert code == 3  # no readable backup: refused, not "malformed LSN" (2)
    assert out == ""
    assert f"pgsnap: warning: catalog file {bad} is unreadable" in err
    assert "malformed LSN 'garbage'" in err
    assert err.count(str(bad)) == 1  # said once, not again by the catalog's log warning


@pytest.mark.parametrize(
    "argv",
    [["plan-recovery"], ["plan-recovery", "--time", "2026-11-30 12:00:00+00"], ["check"], ["wal"]],
    ids=["plan-recovery", "plan-recovery-time", "check", "wal"],
)
def test_a_command_reads_the_catalog_once(
    run: Run, config: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """Issue 27: one read of the catalog per command (at ten thousand records each read
    costs tens of milliseconds), and an unreadable file named once, as it is read."""
    from pgsnap.catalog import DirectoryCatalog

    bad = _corrupt_record(config)
    loads: list[int] = []
    real = DirectoryCatalog._load

    def counted(self: DirectoryCatalog) -> Any:
        loads.append(1)
        return real(self)

    monkeypatch.setattr(DirectoryCatalog, "_load", counted)
    _code, out, err = run(*argv, "-c", str(config))
    assert len(loads) == 1
    warned = err.count(f"pgsnap: warning: catalog file {bad} is unreadable")
    if argv == ["check"]:  # a finding of the report instead
        assert warned == 0 and f"UNREADABLE {bad}: malformed LSN" in out
    else:
        assert warned == 1


def test_catalog_wal_index_setting(config: Path, tmp_path: Path, run: Run) -> None:
    """The WAL index lives in the catalog directory unless [catalog] wal_index says
    where, or false for none; anything else is a usage error naming the key."""
    from pgsnap.cli import load_cluster

    index = load_cluster(config).wal_index
    assert index is not None and Path(index.path) == tmp_path / "catalog" / "wal-index"
    text = config.read_text()
    config.write_text(text.replace("[catalog]\n", '[catalog]\nwal_index = "idx"\n', 1))
    index = load_cluster(config).wal_index
    assert index is not None and Path(index.path) == config.parent / "idx"
    config.write_text(text.replace("[catalog]\n", "[catalog]\nwal_index = false\n", 1))
    assert load_cluster(config).wal_index is None
    config.write_text(text.replace("[catalog]\n", "[catalog]\nwal_index = 3\n", 1))
    code, _out, err = run("list", "-c", str(config))
    assert code == 2 and "[catalog] wal_index is 3" in err, err


@pytest.mark.parametrize(
    "conninfo",
    [
        "host=/x port=1 user=u PassWord=" + SECRET,
        "postgresql://u:" + SECRET + "@localhost:1/d",
        "postgres://u:" + SECRET + "@localhost:1/d?sslmode=disable",
        "postgresql://u@localhost:1/d?password=" + SECRET,
    ],
)
def test_every_form_of_a_password_in_conninfo_is_refused(
    run: Run, tmp_path: Path, conninfo: str
) -> None:
    """The check that spares `list` the psycopg import still parses any conninfo that
    could hold a password."""
    path = write_config(tmp_path)
    text = path.read_text()
    start = text.index("conninfo = ")
    end = text.index("\n", start)
    path.write_text(text[:start] + f"conninfo = {json.dumps(conninfo)}" + text[end:])
    code, out, err = run("list", "-c", str(path))
    assert code == 2, (out, err)
    assert SECRET not in out + err


def test_list_does_not_import_the_database_driver(config: Path) -> None:
    """Commands that do not talk to the server do not pay for importing psycopg; a
    listing without a retention policy reads the catalog without importing the Cluster,
    the observer or the planners (issue 27: `pgsnap list` 0.27 -> 0.16 s on its own);
    with ``--json`` it builds nothing but the catalog: no database adapter, no storage
    backend (text output on the mock storage adds a line on its snapshots' room), and a
    command on one cluster does not import the fleet runner."""
    heavy = {"pgsnap.cluster", "pgsnap.observe", "pgsnap.planner.expiry"}
    unbuilt = {"pgsnap.adapters.postgres", "pgsnap.backends.mock", "pgsnap.fleet", "pgsnap.wal"}
    for flags, absent in (([], heavy), (["--json"], heavy | unbuilt)):
        code = (
            "import sys\n"
            "from pgsnap.cli import main\n"
            f"assert main(['list', '-c', {str(config)!r}, *{flags!r}]) == 0\n"
            "assert 'psycopg' not in sys.modules\n"
            f"absent = {sorted(absent)!r}\n"
            "assert not set(absent) & set(sys.modules), set(absent) & set(sys.modules)\n"
            "print('ok')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert out.stdout.strip().endswith("ok"), (flags, out.stdout + out.stderr)


def test_list_needs_no_storage_credentials(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing the backups reads the catalog only: on a backup server without the
    array's password in its environment it still works, where a command that uses the
    storage says what is missing."""
    monkeypatch.delenv("PGSNAP_POWERFLEX_PASSWORD", raising=False)
    path = write_config(tmp_path, storage='backend = "powerflex"', drop="storage.options")
    path.write_text(path.read_text() + '\n[storage.options]\ngateway = "https://pfgw.invalid"\n')
    for flags in ([], ["--json"]):
        code, out, err = run("list", "-c", str(path), *flags)
        assert (code, err) == (0, ""), err
        assert out.strip() in ("no backups", "[]")
    code, _, err = run("plan-recovery", "-c", str(path))
    assert code == 2
    assert "needs the password of user" in err


def test_list_with_a_policy_and_no_backups(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text() + "\n[retention]\nredundancy = 3\n")
    code, out, err = run("list", "-c", str(path))
    assert (code, err) == (0, "")
    assert out == (
        "retention policy: redundancy 3; the next `pgsnap expire` removes none\nno backups\n"
    )
    code, out, _ = run("list", "-c", str(path), "--window", "7d")  # flags win per key
    assert code == 0 and out.startswith("retention policy: redundancy 3; window 7d;")


def test_a_misspelt_retention_key_is_refused(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text() + "\n[retention]\nredundnacy = 3\n")
    for command in ("list", "expire"):
        code, _, err = run(command, "-c", str(path))
        assert code == 2, command
        assert "[retention] has an unknown key 'redundnacy'" in err
        assert "did you mean 'redundancy'?" in err


def test_list_shows_the_backups_when_the_forecast_cannot_be_made(run: Run, tmp_path: Path) -> None:
    path = write_config(tmp_path)
    (tmp_path / "archive").rmdir()  # the expiry facts need the archive
    code, out, err = run("list", "-c", str(path), "--redundancy", "1")
    assert code == 0 and out == "no backups\n"
    assert "warning: what the next expire removes is not shown" in err
