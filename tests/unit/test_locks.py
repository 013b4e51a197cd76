"""pgsnap.locks: one mutating plan at a time per cluster (issue 19).

The lock is held by real processes here (forked children): the kernel's
open-file-description locks are what is tested, with a child that holds the
lock, one that dies holding it, and the documented table of which plan
kinds may overlap.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgsnap.catalog import DirectoryCatalog, MemoryCatalog
from pgsnap.errors import ClusterLockedError, ExecutionError
from pgsnap.locks import (
    LOCK_MODES,
    FileClusterLock,
    LockHolder,
    LockMode,
    MemoryClusterLock,
    lock_mode,
)

KINDS = ("backup", "recovery", "expiry", "delete", "delete-safety", "acme.custom")

ALLOWED = {("backup", "backup")}
"""The documented table (docs/reference/plans.md): which (running, new) pairs overlap."""


def holder(kind: str, plan_id: str = "p" * 64) -> LockHolder:
    return LockHolder.for_run(kind, plan_id, journal=f"/j/{kind}.journal")


@contextmanager
def held_in_child(directory: Path, kind: str, *, die: bool = False) -> Iterator[int]:
    """A forked child takes the lock for a ``kind`` plan, says so, and holds it until
    told to go (or SIGKILLs itself while holding it, with ``die``)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child
        try:
            lease = FileClusterLock(directory).acquire(holder(kind, "c" * 64))
            os.write(ready_w, b"1")
            if die:
                os.kill(os.getpid(), signal.SIGKILL)
            os.read(go_r, 1)
            lease.release()
        except BaseException as exc:  # reported through the pipe
            os.write(ready_w, f"0{exc}".encode()[:500])
        os._exit(0)
    try:
        answer = os.read(ready_r, 500)
        assert answer == b"1", answer
        if die:
            os.waitpid(pid, 0)
        yield pid
    finally:
        if not die:
            os.write(go_w, b"1")
            os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)


@pytest.mark.parametrize("running", KINDS)
@pytest.mark.parametrize("new", KINDS)
def test_the_lock_table_across_processes(tmp_path: Path, running: str, new: str) -> None:
    with held_in_child(tmp_path, running) as pid:
        if (running, new) in ALLOWED:
            with FileClusterLock(tmp_path).acquire(holder(new)):
                kinds = sorted(h.kind for h in FileClusterLock(tmp_path).holders())
                assert kinds == sorted([running, new])
        else:
            with pytest.raises(ClusterLockedError) as info:
                FileClusterLock(tmp_path).acquire(holder(new))
            (named,) = info.value.holders
            assert f"{running} plan cccccccccccc (pid {pid} on " in named
            assert "since" in named and info.value.retryable
            assert info.value.step_id == ""
    with FileClusterLock(tmp_path).acquire(holder(new)):  # free again once it is gone
        pass


def test_modes_come_from_the_plan_kind() -> None:
    shared = {"backup", "pin", "unpin", "copy"}  # pins: one record each; copies read snapshots
    assert dict(LOCK_MODES) == dict.fromkeys(shared, LockMode.SHARED)
    assert lock_mode("backup") is LockMode.SHARED
    assert all(lock_mode(k) is LockMode.EXCLUSIVE for k in KINDS if k not in shared)


def test_a_holder_that_died_is_reported_and_its_record_removed(tmp_path: Path) -> None:
    with held_in_child(tmp_path, "recovery", die=True) as pid:
        records = list(tmp_path.glob("holder-*.json"))
        assert len(records) == 1  # the dead process's record is still there
        assert FileClusterLock(tmp_path).holders() == ()  # but it holds nothing
        with FileClusterLock(tmp_path).acquire(holder("backup")) as lease:
            (dead,) = lease.broken
            assert (dead.pid, dead.kind, dead.journal) == (pid, "recovery", "/j/recovery.journal")
            assert not records[0].exists()
        assert list(tmp_path.glob("holder-*.json")) == []


def test_looking_takes_nothing(tmp_path: Path) -> None:
    lock = FileClusterLock(tmp_path)
    with lock.acquire(holder("recovery")) as lease:
        assert [h.kind for h in lock.holders()] == ["recovery"]
        assert lease.held
        with pytest.raises(ClusterLockedError):
            lock.acquire(holder("recovery", "q" * 64))  # another run in this process too
    assert not lease.held
    assert lock.holders() == ()
    record = json.loads(json.dumps(holder("backup").to_dict()))
    assert LockHolder.from_dict(record) == LockHolder.from_dict(record)


def test_an_unwritable_lock_directory_is_a_typed_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = Path("/proc/self/cannot-lock-here")  # even root cannot create files here
    else:
        tmp_path.chmod(0o500)
        target = tmp_path / "locks"
    with pytest.raises(ExecutionError, match="cluster lock") as info:
        FileClusterLock(target).acquire(holder("recovery"))
    assert not isinstance(info.value, ClusterLockedError)
    assert "writable" in str(info.value)


def test_catalogs_give_their_lock() -> None:
    memory = MemoryCatalog()
    assert memory.cluster_lock() is memory.cluster_lock()
    lock = memory.cluster_lock()
    assert isinstance(lock, MemoryClusterLock)
    with (
        lock.acquire(holder("backup")),
        lock.acquire(holder("backup")),
        pytest.raises(ClusterLockedError, match="backup plan"),
    ):
        lock.acquire(holder("expiry"))
    with lock.acquire(holder("expiry")), pytest.raises(ClusterLockedError):
        lock.acquire(holder("backup"))


def test_a_directory_catalog_keeps_the_lock_beside_its_records(tmp_path: Path) -> None:
    catalog = DirectoryCatalog(tmp_path / "catalog")
    lock = catalog.cluster_lock()
    assert isinstance(lock, FileClusterLock)
    assert lock.directory == tmp_path / "catalog" / ".cluster-lock"
    with lock.acquire(holder("recovery")):
        assert catalog.list() == ()  # the lock directory is no record
        with pytest.raises(ClusterLockedError):
            DirectoryCatalog(tmp_path / "catalog").cluster_lock().acquire(holder("backup"))


def test_a_holder_says_who_and_since_when() -> None:
    h = LockHolder("recovery", "a" * 64, 42, "db1", dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC))
    assert str(h) == "recovery plan aaaaaaaaaaaa (pid 42 on db1, since 2026-12-01T12:00:00+00:00)"
    assert h.mode is LockMode.EXCLUSIVE


def test_waiting_is_never_needed_to_find_out(tmp_path: Path) -> None:
    """A refused run is refused at once, however long the holder keeps the lock."""
    with held_in_child(tmp_path, "recovery"):
        started = time.monotonic()
        with pytest.raises(ClusterLockedError):
            FileClusterLock(tmp_path).acquire(holder("recovery"))
        assert time.monotonic() - started < 5
    assert sys.platform.startswith("linux")  # OFD locks: the platform this is for
