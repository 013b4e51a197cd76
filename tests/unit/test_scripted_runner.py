"""pgsnap.testing.ScriptedRunner: the runner backend authors test command lines with."""

from __future__ import annotations

import pytest

from pgsnap.errors import CommandError
from pgsnap.host import Host
from pgsnap.testing.runners import ScriptedRunner, UnscriptedCommand


def test_answers_from_the_script_newest_first_and_records_every_call() -> None:
    runner = ScriptedRunner()
    runner.answer(["lvs"], stdout=b"old")
    runner.answer(["lvs", "--reportformat"], stdout=b"json")
    runner.on(lambda argv, stdin: runner.failed(argv, 5, b"exists") if stdin == b"x" else None)
    assert runner.run(["lvs", "--reportformat", "json"]).stdout == b"json"
    assert runner.run(["lvs", "-o", "name"], user="postgres").stdout == b"old"
    refused = runner.run(["lvcreate", "-n", "a"], stdin=b"x")
    assert (refused.returncode, refused.stderr) == (5, b"exists")
    assert runner.calls == [
        ["lvs", "--reportformat", "json"],
        ["lvs", "-o", "name"],
        ["lvcreate", "-n", "a"],
    ]
    assert runner.run_as == [None, "postgres", None]
    assert runner.stdin == {2: b"x"}
    assert runner.commands("lvs") == runner.calls[:2]
    assert runner.commands() == runner.calls


def test_an_unexpected_command_fails_the_test_naming_it() -> None:
    runner = ScriptedRunner()
    with pytest.raises(UnscriptedCommand, match=r"unexpected command \['rm', '-rf', '/'\]"):
        runner.run(["rm", "-rf", "/"])
    with pytest.raises(UnscriptedCommand, match="not text"):
        runner.run(["ls", 3])  # type: ignore[list-item]


def test_a_host_over_it_sees_what_the_script_says() -> None:
    runner = ScriptedRunner()
    runner.answer(["realpath", "-m"], stdout=b"/srv/pg/data\0")
    runner.answer(["mount"], returncode=32, stderr=b"mount: /srv: wrong fs type")
    host = Host(runner, name="db1")
    assert host.realpath("/srv/pg/./data") == "/srv/pg/data"
    assert runner.commands("realpath")[0][-1] == "/srv/pg/./data"
    with pytest.raises(CommandError):
        runner.run(["mount", "/dev/x", "/srv"]).check(host="db1")
