"""Garbage collection of a copy target: markers in both targets, what a collection
removes and keeps, and when it (or a copy) refuses."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.copies import (
    CopyTarget,
    DirectoryCopyTarget,
    Manifest,
    collect_garbage,
    copy_trees,
    restore_trees,
)
from pgsnap.copies.markers import GC_MARKER, TRUSTED_GAP, Marker, read_marker
from pgsnap.errors import ConfigurationError, CopyBusy, CopyError, CopyNotFound
from pgsnap.testing.memory_copies import MemoryCopyTarget

from .test_copies import CHUNK, T0, make_tree, snapshot

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(hours=24)


@pytest.fixture(params=["directory", "memory"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> CopyTarget:
    if request.param == "directory":
        return DirectoryCopyTarget(tmp_path / "target")
    return MemoryCopyTarget()


def copy(tree: Path, target: CopyTarget, copy_id: str, clock: Any = None) -> Manifest:
    manifest, _ = copy_trees(
        {"pgdata": tree},
        target,
        copy_id=copy_id,
        backup_id="b1",
        chunk_size=CHUNK,
        codec="zlib",
        clock=clock or (lambda: T0),
    )
    return manifest


def marker(name: str, when: dt.datetime, **kw: Any) -> str:
    return Marker.new(name, when, **kw).to_json()


def test_markers_follow_the_contract(target: CopyTarget) -> None:
    assert isinstance(target, CopyTarget)
    assert target.marker_names() == ()
    with pytest.raises(CopyNotFound, match="marker gc"):
        target.get_marker("gc")
    assert target.create_marker("gc", "one") is True
    assert target.create_marker("gc", "two") is False  # there already: left alone
    assert target.get_marker("gc") == "one"
    target.put_marker("gc", "three")  # replaced whole
    target.put_marker("pending.c1", "p")
    assert target.get_marker("gc") == "three"
    assert target.marker_names() == ("gc", "pending.c1")
    target.delete_marker("gc")
    target.delete_marker("gc")  # absent: nothing to do
    assert target.marker_names() == ("pending.c1",)
    assert target.create_marker("gc", "again") is True
    for bad in ("../x", "a/b", "", ".hidden", "x" * 161):
        with pytest.raises(ConfigurationError):
            target.put_marker(bad, "{}")
        with pytest.raises(ConfigurationError):
            target.create_marker(bad, "{}")
    assert target.manifest_ids() == () and list(target.chunk_ids()) == []  # apart


def test_of_many_creating_one_marker_at_once_exactly_one_creates_it(target: CopyTarget) -> None:
    results: list[tuple[bool, int]] = []
    start = threading.Barrier(8)

    def create(n: int) -> None:
        start.wait()
        results.append((target.create_marker("gc", f"writer {n}"), n))

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for created, n in results if created]
    assert len(results) == 8 and len(winners) == 1
    assert target.get_marker("gc") == f"writer {winners[0]}"
    assert target.marker_names() == ("gc",)  # no temporary file left behind


def test_the_directory_target_keeps_markers_under_markers(tmp_path: Path) -> None:
    target = DirectoryCopyTarget(tmp_path / "t")
    target.create_marker("pending.c1", "x")
    assert (tmp_path / "t" / "markers" / "pending.c1").read_text() == "x"
    (tmp_path / "t" / "markers" / ".tmp-left").write_text("junk")  # a writer that died
    assert target.marker_names() == ("pending.c1",)


class Watching(MemoryCopyTarget):
    """Calls ``hook(method)`` before each call of the protocol."""

    def __init__(self, hook: Callable[[str], None]) -> None:
        super().__init__()
        self.hook = hook

    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if callable(value) and not name.startswith("_") and name != "hook":
            hook = super().__getattribute__("hook")

            def called(*args: Any, **kwargs: Any) -> Any:
                hook(name)
                return value(*args, **kwargs)

            return called
        return value


def test_a_copy_holds_its_pending_marker_while_it_runs(tmp_path: Path) -> None:
    seen: list[tuple[str, ...]] = []
    target = Watching(lambda method: None)
    target.hook = lambda method: (
        seen.append(target.marker_names()) if method == "put_chunk" else None
    )
    manifest = copy(make_tree(tmp_path / "data"), target, "c1")
    assert seen and all(names == ("pending.c1",) for names in seen)
    assert target.marker_names() == ()  # removed once the manifest is written and checked
    assert target.manifest_ids() == ("c1",) and manifest.copy_id == "c1"


def test_a_long_copy_refreshes_its_marker_and_a_failed_one_leaves_it(tmp_path: Path) -> None:
    ticks = iter(range(10_000))
    written: list[dt.datetime] = []

    def clock() -> dt.datetime:
        return T0 + dt.timedelta(seconds=30 * next(ticks))  # half a minute a request

    class Failing(MemoryCopyTarget):
        puts = 0

        def put_marker(self, name: str, text: str) -> None:
            written.append(Marker.from_json(name, text).refreshed_at)
            super().put_marker(name, text)

        def put_chunk(self, chunk: str, data: bytes) -> bool:
            Failing.puts += 1
            if Failing.puts == 4:
                raise CopyError("the target went away")
            return super().put_chunk(chunk, data)

    target = Failing()
    tree = make_tree(tmp_path / "data")
    with pytest.raises(CopyError, match="went away"):
        copy(tree, target, "c1", clock)
    assert len(written) >= 2  # written, then refreshed
    assert all(b - a >= dt.timedelta(seconds=60) for a, b in itertools.pairwise(written))
    left = read_marker(target, "pending.c1")
    assert left is not None and left.copy_id == "c1"  # the chunks sent stay protected
    copy(tree, target, "c1", clock)  # run again: it finishes and removes the marker
    assert target.marker_names() == () and target.manifest_ids() == ("c1",)


def test_a_copy_does_not_start_while_a_collection_runs(tmp_path: Path) -> None:
    target = MemoryCopyTarget()
    target.put_marker(GC_MARKER, marker(GC_MARKER, T0 - HOUR, stale_after=DAY))
    with pytest.raises(CopyBusy, match="garbage collection is running on memory://") as info:
        copy(make_tree(tmp_path / "data"), target, "c1")
    assert info.value.holders[0]["marker"] == "gc" and info.value.hint
    assert "did not start" in str(info.value)
    assert target.marker_names() == ("gc",)  # its own marker removed, the collection's kept
    assert list(target.chunk_ids()) == [] and target.manifest_ids() == ()
    assert CopyBusy.retryable


def test_a_copy_starts_despite_the_stale_marker_of_a_dead_collection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = MemoryCopyTarget()
    target.put_marker(GC_MARKER, marker(GC_MARKER, T0 - 2 * HOUR, stale_after=HOUR))
    with caplog.at_level(logging.WARNING):
        copy(make_tree(tmp_path / "data"), target, "c1")
    assert target.manifest_ids() == ("c1",)
    assert "stale" in caplog.text


def test_an_unreadable_gc_marker_stops_copies_and_collections(tmp_path: Path) -> None:
    target = MemoryCopyTarget()
    target.put_marker(GC_MARKER, "not json")
    with pytest.raises(CopyBusy, match="cannot read"):
        copy(make_tree(tmp_path / "data"), target, "c1")
    with pytest.raises(CopyError, match="not pgsnap's") as info:
        collect_garbage(target, now=T0)
    assert "markers/gc" in (info.value.hint or "")


def two_copies(tmp_path: Path, target: CopyTarget) -> tuple[Manifest, Manifest, Path]:
    """Two copies that share most chunks; the second one's tree is returned."""
    tree = make_tree(tmp_path / "data")
    first = copy(tree, target, "c1")
    control = tree / "global" / "pg_control"
    data = bytearray(control.read_bytes())
    data[10] ^= 0xFF
    control.write_bytes(bytes(data))
    (tree / "new").write_bytes(b"n" * CHUNK)
    second = copy(tree, target, "c2")
    return first, second, tree


def test_a_collection_removes_the_orphans_and_keeps_what_copies_need(
    tmp_path: Path, target: CopyTarget
) -> None:
    first, second, tree = two_copies(tmp_path, target)
    target.put_chunk("ab" * 32, b"left by a copy that died")
    report = collect_garbage(target, now=T0 + HOUR)
    assert report.chunks_deleted == 1 and report.manifests == 2 and not report.dry_run
    assert (
        report.chunks_live == report.chunks_total - 1 == len(first.chunk_ids() | second.chunk_ids())
    )
    assert report.chunks_missing == 0 and report.pending == ()
    target.delete_manifest("c1")  # the first copy expires
    progress: list[Any] = []
    report = collect_garbage(target, now=T0 + HOUR, on_progress=progress.append)
    only_first = first.chunk_ids() - second.chunk_ids()
    assert report.chunks_deleted == len(only_first) >= 1
    assert set(target.chunk_ids()) == set(second.chunk_ids())
    assert progress[-1].chunks_deleted == progress[-1].chunks_to_delete == len(only_first)
    assert target.marker_names() == ()  # the gc marker is gone at the end
    restore_trees(second, target, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)
    assert "removed" in report.explain()


def test_a_dry_run_removes_and_writes_nothing(tmp_path: Path, target: CopyTarget) -> None:
    first, second, _ = two_copies(tmp_path, target)
    target.delete_manifest("c1")
    before = sorted(target.chunk_ids())
    report = collect_garbage(target, now=T0 + HOUR, dry_run=True)
    assert report.dry_run and report.chunks_deleted == len(first.chunk_ids() - second.chunk_ids())
    assert sorted(target.chunk_ids()) == before and target.marker_names() == ()
    assert "would remove" in report.explain()


def test_a_fresh_gc_marker_refuses_and_a_stale_one_is_replaced(
    tmp_path: Path, target: CopyTarget, caplog: pytest.LogCaptureFixture
) -> None:
    two_copies(tmp_path, target)
    target.delete_manifest("c1")
    other = marker(GC_MARKER, T0, stale_after=DAY)
    target.put_marker(GC_MARKER, other)
    with pytest.raises(CopyBusy, match="another garbage collection is running") as info:
        collect_garbage(target, now=T0 + HOUR)
    assert info.value.holders[0]["marker"] == "gc"
    assert target.get_marker(GC_MARKER) == other  # not ours: left alone
    before = len(list(target.chunk_ids()))
    with caplog.at_level(logging.WARNING):
        report = collect_garbage(target, now=T0 + DAY + HOUR)  # the other one died
    assert "replacing a stale gc marker" in caplog.text
    assert report.chunks_deleted >= 1 and len(list(target.chunk_ids())) < before
    assert target.marker_names() == ()


def test_a_copy_in_progress_stops_a_collection_and_a_dead_one_does_not(
    tmp_path: Path, target: CopyTarget, caplog: pytest.LogCaptureFixture
) -> None:
    two_copies(tmp_path, target)
    target.delete_manifest("c1")
    before = sorted(target.chunk_ids())
    target.put_marker("pending.c3", marker("pending.c3", T0, copy_id="c3"))
    with pytest.raises(CopyBusy, match="copies are in progress") as info:
        collect_garbage(target, now=T0 + HOUR)
    assert "copy c3" in str(info.value) and "pending.<copy id>" in (info.value.hint or "")
    assert info.value.holders[0]["marker"] == "pending.c3"
    assert target.marker_names() == ("pending.c3",)  # the gc marker removed
    assert sorted(target.chunk_ids()) == before  # nothing removed
    with caplog.at_level(logging.WARNING):
        report = collect_garbage(target, now=T0 + DAY + HOUR)  # c3 died a day ago
    assert report.pending == ("pending.c3",) and report.chunks_deleted >= 1
    assert "ignoring the stale marker of copy c3" in caplog.text
    assert "pending.c3" in report.explain()
    assert target.marker_names() == ("pending.c3",)  # left: it is the copy's to remove


def test_a_manifest_that_cannot_be_read_stops_the_sweep(tmp_path: Path, target: CopyTarget) -> None:
    two_copies(tmp_path, target)
    target.delete_manifest("c1")
    before = sorted(target.chunk_ids())
    target.put_manifest("c9", '{"format": "pgsnap-copy-manifest", "version": 1}')
    with pytest.raises(CopyError, match=r"manifest of copy c9 .* nothing removed") as info:
        collect_garbage(target, now=T0 + HOUR)
    assert info.value.details["copy_id"] == "c9" and "never removed on doubt" in (
        info.value.hint or ""
    )
    assert sorted(target.chunk_ids()) == before and target.marker_names() == ()
    target.put_manifest("c9", "{not json")
    with pytest.raises(CopyError, match="c9"):
        collect_garbage(target, now=T0 + HOUR, dry_run=True)


def test_an_unreadable_pending_marker_stops_the_sweep(target: CopyTarget) -> None:
    target.put_chunk("cd" * 32, b"orphan")
    target.put_marker("pending.c1", "{}")
    with pytest.raises(CopyError, match="cannot tell whether a copy is in progress"):
        collect_garbage(target, now=T0)
    assert list(target.chunk_ids()) == ["cd" * 32]


def test_a_staleness_limit_below_the_minimum_is_refused(target: CopyTarget) -> None:
    with pytest.raises(ConfigurationError, match="stale_after"):
        collect_garbage(target, stale_after=dt.timedelta(minutes=5))


def test_a_collection_that_lost_its_marker_stops_before_the_next_removal(
    tmp_path: Path,
) -> None:
    """A collection that stopped long enough for another to take its stale marker
    over finds out at its next check, and removes nothing more."""
    now = [T0]
    deletes = 0

    def hook(method: str) -> None:
        nonlocal deletes
        if method == "delete_chunk":
            deletes += 1
            if deletes == 1:
                now[0] += DAY + HOUR  # this collection stops for a day...
                store.put_marker(GC_MARKER, marker(GC_MARKER, now[0], stale_after=DAY))

    store = Watching(hook)
    for n in range(5):
        store.put_chunk(f"{n:02x}" * 32, b"orphan")
    with pytest.raises(CopyBusy, match="took over"):
        collect_garbage(store, clock=lambda: now[0])
    assert deletes == 1 and len(list(store.chunk_ids())) == 4
    assert store.marker_names() == ("gc",)  # the other one's: left alone


def test_a_copy_that_starts_during_a_sweep_stops_it_at_the_next_check(tmp_path: Path) -> None:
    now = [T0]
    deletes = 0

    def hook(method: str) -> None:
        nonlocal deletes
        if method == "delete_chunk":
            deletes += 1
            if deletes == 2:
                now[0] += dt.timedelta(minutes=2)
                store.put_marker("pending.c1", marker("pending.c1", now[0], copy_id="c1"))

    store = Watching(hook)
    for n in range(5):
        store.put_chunk(f"{n:02x}" * 32, b"orphan")
    with pytest.raises(CopyBusy, match="in progress"):
        collect_garbage(store, clock=lambda: now[0])
    assert deletes == 2 and len(list(store.chunk_ids())) == 3
    assert store.marker_names() == ("pending.c1",)


def test_a_copy_that_paused_past_staleness_is_not_called_complete_on_a_swept_chunk(
    tmp_path: Path,
) -> None:
    """A copy stops for a day just before it writes its manifest; a collection takes
    its marker for a dead copy's and removes the chunks no manifest names yet; the
    copy goes on and writes its manifest. It knows it paused, checks again, and
    removes the manifest rather than leave a broken copy."""
    tree = make_tree(tmp_path / "data")
    now = [T0]

    def hook(method: str) -> None:
        if method == "put_manifest" and not store.manifest_ids():
            now[0] += DAY + HOUR
            report = collect_garbage(store, clock=lambda: now[0])
            assert report.pending == ("pending.c1",) and report.chunks_deleted > 0

    store = Watching(hook)
    with pytest.raises(CopyError, match="left the target while the manifest was written"):
        copy(tree, store, "c1", lambda: now[0])
    assert store.manifest_ids() == ()  # never a manifest that names a missing chunk
    assert now[0] - T0 > TRUSTED_GAP
    store.hook = lambda method: None
    manifest = copy(tree, store, "c1", lambda: now[0])  # run again: complete
    assert set(store.chunk_ids()) == manifest.chunk_ids() and store.marker_names() == ()


def test_marker_texts_name_who_wrote_them_and_no_more() -> None:
    m = Marker.new("pending.c1", T0, copy_id="c1")
    doc = json.loads(m.to_json())
    assert set(doc) == {"started_at", "refreshed_at", "host", "pid", "token", "copy_id"}
    assert Marker.from_json("pending.c1", m.to_json()) == m
    assert not m.is_stale(T0 + HOUR, DAY) and m.is_stale(T0 + DAY + HOUR, DAY)


def test_a_paused_copy_that_meets_a_running_collection_gives_up_its_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a long pause a copy cannot tell whether the collection it finds running
    swept without it: it waits for it to end, and when it does not, removes its
    manifest (the copy run again sends only what is missing) rather than risk it."""
    import pgsnap.copies.copier as copier

    waits: list[float] = []
    monkeypatch.setattr(copier, "_sleep", waits.append)
    now = [T0]

    def hook(method: str) -> None:
        if method == "put_manifest" and GC_MARKER not in store.marker_names():
            now[0] += DAY + HOUR
            store.put_marker(GC_MARKER, marker(GC_MARKER, now[0], stale_after=DAY))

    store = Watching(hook)
    with pytest.raises(CopyBusy, match="is not complete: its manifest was removed"):
        copy(make_tree(tmp_path / "data"), store, "c1", lambda: now[0])
    assert store.manifest_ids() == () and store.marker_names() == ("gc",)
    assert len(waits) >= 10  # it waited before giving up
