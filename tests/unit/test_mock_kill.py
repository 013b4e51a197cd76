"""A process killed inside a mock copy must not wedge the mock (issue 7).

With a ``state_file``, a process SIGKILLed while it copies a directory volume
into ``root/snapshots/<id>`` (or a snapshot into a clone) leaves a half copy
that the state never recorded. The next process must still snapshot (and
clone): the half copy is removed (or at least never served and never in the
way), no id is handed out twice, and content round trips still work.

The kill is deterministic: a forked child replaces the mock's per-entry copy
helper by one that SIGKILLs the child after a given number of entries.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgsnap.backends.mock import MockBackend
from pgsnap.backends.mock import _files as mock_files

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _fill(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def _content(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A state file, a root, and two directory volumes of three files each."""
    data = _fill(tmp_path / "pgdata", {"PG_VERSION": "15\n", "base/1": "one", "base/2": "two"})
    wal = _fill(tmp_path / "pgwal", {"a": "wal-a", "b": "wal-b", "c": "wal-c"})
    return tmp_path / "state" / "mock.json", tmp_path / "root", data, wal


@contextmanager
def _forking() -> Iterator[None]:
    # The child only runs the mock and dies: no other thread's lock is needed there.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        yield


def _die_after(entries: int) -> None:
    """In this (child) process: SIGKILL self when about to copy entry number ``entries + 1``."""
    original = mock_files.TreeCopy.entry
    copied = 0

    def dying(
        self: mock_files.TreeCopy, src: Path, dst: Path, previous: Path | None = None
    ) -> None:
        nonlocal copied
        if copied == entries:
            os.kill(os.getpid(), signal.SIGKILL)
        copied += 1
        original(self, src, dst, previous)

    mock_files.TreeCopy.entry = dying  # type: ignore[method-assign]  # the child never restores it


def _killed(entries: int, action: Callable[[], object]) -> None:
    """Run ``action`` in a forked child killed after copying ``entries`` entries."""
    with _forking():
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            _die_after(entries)
            action()
            code = 4  # the copy ended without the kill: the test is wrong
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"the child was not killed (exit status {status})"
    assert os.WTERMSIG(status) == signal.SIGKILL


def _homes(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "snapshots").iterdir())


# --------------------------------------------------------------------------- snapshots


@pytest.mark.parametrize(
    ("both", "entries", "half"),
    [
        (False, 0, "snap-0002"),  # killed before the first file: home and empty tree
        (False, 3, "snap-0002"),  # PG_VERSION, base/, base/1 copied: killed inside base/
        (True, 6, "snap-0004"),  # the first volume copied, then two files of the second
    ],
    ids=["first-entry", "one-volume", "second-volume"],
)
def test_a_kill_during_a_snapshot_copy_does_not_wedge_the_mock(
    setup: tuple[Path, Path, Path, Path],
    caplog: pytest.LogCaptureFixture,
    both: bool,
    entries: int,
    half: str,
) -> None:
    state, root, data, wal = setup
    first = MockBackend(state_file=state, root=root)
    d = first.add_volume("data", path=data).id
    w = first.add_volume("wal", path=wal).id
    vols = [d, w] if both else [d]
    good = first.create_snapshot_group(vols, "good")
    kept = first.list_snapshots()
    good_homes = _homes(root)
    before = {v: _content(Path(first.locate(v).path)) for v in vols}

    (data / "PG_VERSION").write_text("16\n")
    _killed(
        entries,
        lambda: MockBackend(state_file=state, root=root).create_snapshot_group(vols, "killed"),
    )

    # The scene: a half copy the state never recorded.
    assert half in _homes(root)
    assert MockBackend(state_file=state, root=root).list_snapshots() == kept

    caplog.set_level(logging.WARNING, logger="pgsnap.backends.mock")
    again = MockBackend(state_file=state, root=root)
    assert again.list_snapshots() == kept
    assert _homes(root) == good_homes  # the leftovers are gone...
    assert any(half in r.getMessage() for r in caplog.records), caplog.text  # ...and said so
    assert all(r.levelno == logging.WARNING for r in caplog.records)

    # A new group works, with ids never handed out before (cg-0002 and the
    # killed snapshot ids were allocated to the killed copy).
    group = again.create_snapshot_group(vols, "after")
    assert group.id == "cg-0003"
    n = len(vols)
    assert [s.id for s in group.snapshots] == [f"snap-{2 * n + 1 + i:04d}" for i in range(n)]
    assert [s.id for s in again.list_snapshots()] == [s.id for s in kept] + [
        s.id for s in group.snapshots
    ]
    assert _homes(root) == sorted(good_homes + [s.id for s in group.snapshots])

    # Round trips: the new snapshot and the one taken before the kill restore.
    after = {v: _content(Path(again.locate(v).path)) for v in vols}
    assert after[d]["PG_VERSION"] == "16\n"
    (data / "PG_VERSION").write_text("17\n")
    (data / "base" / "3").write_text("three")
    for s in group.snapshots:
        again.restore_volume(s.volume_id, s.id)
    assert {v: _content(Path(again.locate(v).path)) for v in vols} == after
    for s in good.snapshots:
        again.restore_volume(s.volume_id, s.id)
    assert {v: _content(Path(again.locate(v).path)) for v in vols} == before

    # The instance that lived through the kill sees the same, and goes on.
    assert first.list_snapshots() == again.list_snapshots()
    assert first.create_snapshot_group(vols, "later").id == "cg-0004"


def test_the_instance_that_lived_through_the_kill_cleans_up_too(
    setup: tuple[Path, Path, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    state, root, data, _ = setup
    first = MockBackend(state_file=state, root=root)
    d = first.add_volume("data", path=data).id
    _killed(
        2, lambda: MockBackend(state_file=state, root=root).create_snapshot_group([d], "killed")
    )
    assert _homes(root) == ["snap-0001"]
    caplog.set_level(logging.WARNING, logger="pgsnap.backends.mock")
    group = first.create_snapshot_group([d], "after")  # no new instance
    assert (group.id, group.snapshots[0].id) == ("cg-0002", "snap-0002")
    assert "snap-0001" in caplog.text
    assert _homes(root) == ["snap-0002"]
    assert _content(Path(group.snapshots[0].extra["path"])) == _content(data)


def test_a_policy_run_killed_in_its_copy_does_not_wedge_the_mock(
    setup: tuple[Path, Path, Path, Path],
) -> None:
    state, root, data, wal = setup
    first = MockBackend(state_file=state, root=root)
    vols = [first.add_volume("data", path=data).id, first.add_volume("wal", path=wal).id]
    pid = first.add_policy("hourly", vols, retain=2).id
    _killed(4, lambda: MockBackend(state_file=state, root=root).ex_run_policy(pid))
    again = MockBackend(state_file=state, root=root)
    assert again.list_snapshots() == ()
    assert not (root / "snapshots").exists() or _homes(root) == []
    group = again.ex_run_policy(pid)
    assert (group.id, group.name) == ("cg-0002", "hourly-1")
    assert [s.id for s in group.snapshots] == ["snap-0003", "snap-0004"]


def test_state_records_the_copy_before_it_starts(setup: tuple[Path, Path, Path, Path]) -> None:
    state, root, data, wal = setup
    first = MockBackend(state_file=state, root=root)
    vols = [first.add_volume("data", path=data).id, first.add_volume("wal", path=wal).id]
    _killed(
        4, lambda: MockBackend(state_file=state, root=root).create_snapshot_group(vols, "killed")
    )
    saved = json.loads(state.read_text())
    assert saved["snapshots"] == []
    assert saved["counters"]["cg"] == 1
    assert saved["counters"]["snap"] == 2  # both ids were allocated durably
    copying = saved["copying"]
    assert [c["id"] for c in copying] == ["snap-0001", "snap-0002"]
    assert [Path(c["path"]).name for c in copying] == ["snap-0001", "snap-0002"]
    assert all(c["pid"] != os.getpid() for c in copying)
    MockBackend(state_file=state, root=root)  # reaps them
    saved = json.loads(state.read_text())
    assert saved["copying"] == []
    assert saved["counters"]["snap"] == 2


def test_a_home_the_state_never_recorded_is_skipped_and_kept(
    setup: tuple[Path, Path, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """As left by a kill before this fix, or by another mock sharing the root."""
    state, root, data, _ = setup
    backend = MockBackend(state_file=state, root=root)
    d = backend.add_volume("data", path=data).id
    stray = root / "snapshots" / "snap-0001" / "tree"
    stray.mkdir(parents=True)
    (stray / "not-ours").write_text("x")
    caplog.set_level(logging.WARNING, logger="pgsnap.backends.mock")
    group = backend.create_snapshot_group([d], "b1")
    assert group.snapshots[0].id == "snap-0002"
    assert "snap-0001" in caplog.text
    assert (stray / "not-ours").read_text() == "x"  # not ours to remove
    assert [s.id for s in backend.list_snapshots()] == ["snap-0002"]
    assert MockBackend(state_file=state, root=root).create_snapshot_group([d], "b2").snapshots[
        0
    ].id == ("snap-0003")


# --------------------------------------------------------------------------- clones


def test_a_kill_during_a_clone_copy_does_not_wedge_the_mock(
    setup: tuple[Path, Path, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    state, root, data, _ = setup
    first = MockBackend(state_file=state, root=root)
    d = first.add_volume("data", path=data).id
    sid = first.create_snapshot_group([d], "b1").snapshots[0].id
    _killed(2, lambda: MockBackend(state_file=state, root=root).clone_snapshot(sid, "dev"))
    assert (root / "clones" / "vol-0002").exists()
    caplog.set_level(logging.WARNING, logger="pgsnap.backends.mock")
    again = MockBackend(state_file=state, root=root)
    assert "vol-0002" in caplog.text
    assert not (root / "clones" / "vol-0002").exists()
    assert [v.id for v in again.list_volumes()] == [d]
    clone = again.clone_snapshot(sid, "dev")
    assert clone.id == "vol-0003"
    assert clone.path is not None
    assert _content(Path(clone.path)) == _content(data)


# --------------------------------------------------------------------------- live copies


def test_a_copy_in_progress_in_a_live_process_is_never_removed(
    setup: tuple[Path, Path, Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    state, root, data, wal = setup
    first = MockBackend(state_file=state, root=root)
    d = first.add_volume("data", path=data).id
    w = first.add_volume("wal", path=wal).id
    started_r, started_w = os.pipe()
    go_r, go_w = os.pipe()
    with _forking():
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 3
        try:
            os.close(started_r)
            os.close(go_w)
            original = mock_files.TreeCopy.entry

            def slow(
                self: mock_files.TreeCopy, src: Path, dst: Path, previous: Path | None = None
            ) -> None:
                if src.name == "PG_VERSION":  # the copy is under way: wait for the parent
                    os.write(started_w, b"x")
                    os.read(go_r, 1)
                original(self, src, dst, previous)

            mock_files.TreeCopy.entry = slow  # type: ignore[method-assign]
            MockBackend(state_file=state, root=root).create_snapshot_group([d], "live")
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(started_w)
    os.close(go_r)
    try:
        assert os.read(started_r, 1) == b"x"
        caplog.set_level(logging.WARNING, logger="pgsnap.backends.mock")
        results: dict[str, object] = {}

        def other() -> None:  # another process would do the same: it waits for the lock
            try:
                late = MockBackend(state_file=state, root=root)
                results["group"] = late.create_snapshot_group([d, w], "other")
            except BaseException as exc:  # pragma: no cover - reported below
                results["error"] = exc

        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.3)  # let it block on the state lock while the child copies
        assert "group" not in results
        os.write(go_w, b"x")
    finally:
        os.close(go_w)
        os.close(started_r)
    _, status = os.waitpid(pid, 0)
    thread.join(timeout=60)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert "error" not in results, results.get("error")
    assert caplog.records == []
    again = MockBackend(state_file=state, root=root)
    snaps = again.list_snapshots()
    assert [(s.id, s.name) for s in snaps] == [
        ("snap-0001", "live"),
        ("snap-0002", "other"),
        ("snap-0003", "other"),
    ]
    assert _content(Path(snaps[0].extra["path"])) == _content(data)
    assert _homes(root) == ["snap-0001", "snap-0002", "snap-0003"]
