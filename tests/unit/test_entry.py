"""The ``pgsnap`` console script's own process settings (pgsnap._entry.script)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from pgsnap import _argv, _entry


@pytest.fixture
def collector():
    """The collector's state, thresholds and frozen objects put back after the test."""
    before = gc.get_threshold()
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)
    if enabled:
        gc.enable()


def test_the_script_collects_less_often_and_freezes_what_is_alive_at_the_end(
    monkeypatch, collector
):
    seen: list[tuple[int, ...]] = []

    def command(argv) -> int:
        seen.append(gc.get_threshold())
        assert gc.get_freeze_count() == 0  # nothing frozen while the command runs
        return 3

    gc.set_threshold(700, 10, 10)
    monkeypatch.setattr(_entry, "main", command)
    monkeypatch.setattr(sys, "argv", ["pgsnap", "recover", "-c", "x.toml"])
    assert _entry.script() == 3  # the command's exit code
    assert seen == [(_argv.FIRST_THRESHOLD, 10, 10)]
    assert gc.get_freeze_count() > 0
    assert gc.isenabled()


@pytest.mark.parametrize("command", ["plan-recovery", "list", "timeline", "backup"])
def test_a_command_of_bounded_memory_runs_without_the_collector(monkeypatch, collector, command):
    seen: list[bool] = []

    def main(argv) -> int:
        seen.append(gc.isenabled())
        return 0

    monkeypatch.setattr(_entry, "main", main)
    monkeypatch.setattr(sys, "argv", ["pgsnap", "-v", command, "-c", "x.toml"])
    assert _entry.script() == 0
    assert seen == [False]
    gc.enable()
    monkeypatch.setattr(sys, "argv", ["pgsnap", "clone", "list", "-c", "x.toml"])
    assert _entry.script() == 0
    assert seen == [False, True]  # `clone list` is not `list`


def test_a_higher_threshold_of_the_callers_is_kept(monkeypatch, collector):
    monkeypatch.setattr(_entry, "main", lambda argv: 0)
    monkeypatch.setattr(sys, "argv", ["pgsnap", "recover"])
    gc.set_threshold(10 * _argv.FIRST_THRESHOLD, 5, 5)
    _entry.script()
    assert gc.get_threshold() == (10 * _argv.FIRST_THRESHOLD, 5, 5)


def test_the_console_script_and_python_m_pgsnap_are_the_script():
    """Both ways of running the command go through script(), and its exit code and
    output are the command's."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["pgsnap"] == "pgsnap._entry:script"
    main_module = (Path(_entry.__file__).parent / "__main__.py").read_text()
    assert "sys.exit(script())" in main_module
    done = subprocess.run(
        [sys.executable, "-m", "pgsnap", "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: pgsnap")


def test_with_pgsnap_agent_set_the_agent_runs_the_command(monkeypatch, collector):
    """The agent's exit code is the command's; when it does not take the command (None),
    this process runs it; ``pgsnap agent`` itself never asks an agent."""
    from pgsnap import agent

    asked: list[tuple[str, list[str]]] = []
    answer: list[int | None] = [4]

    def request(path, argv):
        asked.append((path, list(argv)))
        return answer[0]

    ran: list[list[str]] = []
    monkeypatch.setattr(agent, "request", request)

    def main(argv):
        ran.append(list(argv))
        return 0

    monkeypatch.setattr(_entry, "main", main)
    monkeypatch.setenv("PGSNAP_AGENT", "/run/pgsnap.sock")
    monkeypatch.setattr(sys, "argv", ["pgsnap", "list", "-c", "x.toml"])
    assert _entry.script() == 4
    assert asked == [("/run/pgsnap.sock", ["list", "-c", "x.toml"])] and ran == []
    answer[0] = None
    assert _entry.script() == 0
    assert ran == [["list", "-c", "x.toml"]]
    monkeypatch.setattr(sys, "argv", ["pgsnap", "agent", "--socket", "/run/pgsnap.sock"])
    asked.clear()
    _entry.script()
    assert asked == [] and ran[-1] == ["agent", "--socket", "/run/pgsnap.sock"]
    monkeypatch.delenv("PGSNAP_AGENT")
    monkeypatch.setattr(sys, "argv", ["pgsnap", "list"])
    _entry.script()
    assert asked == [] and ran[-1] == ["list"]
