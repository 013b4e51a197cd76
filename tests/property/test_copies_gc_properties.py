"""Garbage collection, by property: whatever the interleaving of copies, collections,
expiries (a manifest removed) and crashes, no collection removes a chunk that a
complete copy needs.

Real code, not a model: each actor is a thread running :func:`copy_trees`,
:func:`collect_garbage` or ``delete_manifest`` against one
:class:`~pgsnap.testing.memory_copies.MemoryCopyTarget` seen through
:class:`Scheduled`, whose every call first waits for the scheduler's
permission. The test's thread is the scheduler: from hypothesis-drawn data it
picks which waiting actor makes its next call, how far the clock moves, and
whether that call crashes the actor's process (:class:`Crash`, raised before
the call reaches the target or after: nothing the process does afterwards
reaches it). A crashed actor goes on with its next operation, as a new
process would (a copy run again after a crash resumes it); when an operation
begins is the scheduler's choice too.

Time: a process may be made to wait, but (the protocol's assumption, see
:mod:`pgsnap.copies.gc`) never longer than :data:`PAUSE` between two of its
requests. In half the runs copies alone may pause for any time (a suspended
machine), and a second test forces such a pause in the middle of a copy: then
a copy may fail (it finds that a collection took it for dead), a copy that
returns must still be complete, and a manifest that is not can only be one
whose copy died after writing it and before checking it again (the residue
the protocol documents: a copy that paused longer than the staleness limit
and died right after its manifest).
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
from hypothesis import event, given, settings
from hypothesis import strategies as st

import pgsnap.copies.copier as copier
from pgsnap.copies import GcReport, Manifest, collect_garbage, copy_trees, restore_trees
from pgsnap.copies.markers import GC_MARKER, MIN_STALE_AFTER, Marker, pending_marker
from pgsnap.errors import CopyBusy, CopyError
from pgsnap.testing.memory_copies import MemoryCopyTarget

CHUNK = 4096
T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
STALE = MIN_STALE_AFTER
PAUSE = dt.timedelta(minutes=20)
"""The longest a process waits between two requests (bounded runs): with the
minute of refresh, far less than :data:`STALE`."""
WAIT = 10.0
"""Seconds the scheduler waits for an actor to reach its next call (a hang fails)."""

BLOCKS = [bytes([n]) * CHUNK for n in range(4)] + [bytes(range(256)) * (CHUNK // 256)]
FILES = st.lists(st.integers(0, len(BLOCKS) - 1), min_size=1, max_size=3).map(tuple)
TREES = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), FILES, min_size=1, max_size=3)
STEPS = st.sampled_from(
    [dt.timedelta(0)] * 6
    + [dt.timedelta(seconds=1), dt.timedelta(seconds=61), dt.timedelta(minutes=10), PAUSE]
    + [dt.timedelta(hours=3)]
)

BURSTS = st.sampled_from([1, 1, 2, 4, 16, 64])


class Crash(BaseException):
    """The process making the call died (not an Exception: nothing catches it)."""


@attrs.define(eq=False)
class Actor:
    """A thread running ``ops`` one after the other (each a new process)."""

    name: str
    kind: str  # "copy", "gc" or "expire"
    ops: list[tuple[str, Callable[[], Any]]]
    free: bool = False  # may pause for any time
    state: str = "starting"  # starting, waiting, running, done
    decision: str = ""
    dead: bool = False
    at_start: bool = True  # waiting to begin its next operation: not a process yet
    last_grant: dt.datetime = T0
    outcomes: list[tuple[str, str, Any, int | None]] = attrs.field(factory=list)
    """(label, "ok" | "crash" | "busy" | "failed" | "error", value, the step at which
    the operation's put_manifest took effect)."""
    manifest_step: int | None = None  # this op's put_manifest took effect at this step
    thread: threading.Thread | None = None


class World:
    """The scheduler's side: the target, the clock, the actors, whose turn it is."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.inner = MemoryCopyTarget("gc-property")
        self.now = T0
        self.step = 0
        self.actors: list[Actor] = []
        self.by_thread: dict[int, Actor] = {}
        self.deleted_manifest_at: dict[str, list[int]] = {}
        self.stopping = False

    def clock(self) -> dt.datetime:
        """The fake time (moved only while every actor waits)."""
        return self.now

    def me(self) -> Actor:
        return self.by_thread[threading.get_ident()]

    def gate(self) -> str:
        """Wait for this actor's turn; the scheduler's decision for the call."""
        actor = self.me()
        if actor.dead:
            raise Crash
        with self.cond:
            actor.state = "waiting"
            self.cond.notify_all()
            while actor.state == "waiting":
                self.cond.wait()
            decision = actor.decision
        if decision != "go" and decision != "crash-after":
            actor.dead = True
            raise Crash
        return decision

    def call(self, method: str, *args: Any) -> Any:
        decision = self.gate()
        actor = self.me()
        self.step += 1
        try:
            result = getattr(self.inner, method)(*args)
        finally:
            if method == "put_manifest":
                actor.manifest_step = self.step
            if method == "delete_manifest" and actor.kind == "expire":
                self.deleted_manifest_at.setdefault(args[0], []).append(self.step)
        if decision == "crash-after":
            actor.dead = True
            raise Crash
        return result

    # ---------------------------------------------------------------- the actors' threads

    def run(self, actor: Actor) -> None:
        self.by_thread[threading.get_ident()] = actor
        for label, op in actor.ops:
            actor.dead = False
            actor.manifest_step = None
            actor.at_start = True
            try:
                self.gate()  # the scheduler says when the operation begins
            except Crash:
                break  # the run is being stopped
            actor.at_start = False
            try:
                outcome: tuple[str, Any] = ("ok", op())
            except Crash:
                outcome = ("crash", None)
            except CopyBusy as exc:
                outcome = ("busy", exc)
            except CopyError as exc:
                outcome = ("failed", exc)
            except BaseException as exc:  # a bug: reported by the scheduler
                outcome = ("error", exc)
            actor.outcomes.append((label, *outcome, actor.manifest_step))
            if self.stopping:
                break
        with self.cond:
            actor.state = "done"
            self.cond.notify_all()

    def start(self) -> None:
        for actor in self.actors:
            actor.thread = threading.Thread(
                target=self.run, args=(actor,), name=actor.name, daemon=True
            )
            actor.thread.start()

    # ---------------------------------------------------------------- the scheduler

    def settle(self) -> list[Actor]:
        """Wait until every actor waits for its turn or is done; those waiting."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: all(a.state in ("waiting", "done") for a in self.actors), WAIT
            )
            assert ok, f"an actor hangs: {[(a.name, a.state) for a in self.actors]}"
            return [a for a in self.actors if a.state == "waiting"]

    def grant(self, actor: Actor, decision: str) -> None:
        with self.cond:
            actor.decision = decision
            actor.last_grant = self.now
            actor.state = "running"
            self.cond.notify_all()

    def advance(self, step: dt.timedelta, waiting: list[Actor]) -> None:
        """Move the clock by ``step``, or less: no bounded process waits past PAUSE."""
        bounded = [a.last_grant for a in waiting if not a.free and not a.at_start]
        if bounded:
            step = min(step, min(bounded) + PAUSE - self.now)
        self.now += max(step, dt.timedelta(0))

    def stop(self) -> None:
        """Crash every actor still waiting, to the end of its operations."""
        self.stopping = True
        while waiting := self.settle():
            for actor in waiting:
                self.grant(actor, "crash-before")
        for actor in self.actors:
            assert actor.thread is not None
            actor.thread.join(WAIT)
            assert not actor.thread.is_alive(), f"{actor.name} did not end"


class Scheduled:
    """The target as the actors see it: every call waits for the scheduler."""

    def __init__(self, world: World) -> None:
        self._world = world

    @property
    def location(self) -> str:
        """The inner target's."""
        return self._world.inner.location

    def has_chunk(self, chunk: str) -> bool:
        return bool(self._world.call("has_chunk", chunk))

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        return bool(self._world.call("put_chunk", chunk, data))

    def get_chunk(self, chunk: str) -> bytes:
        return bytes(self._world.call("get_chunk", chunk))

    def chunk_ids(self) -> Iterator[str]:
        return iter(list(self._world.call("chunk_ids")))

    def delete_chunk(self, chunk: str) -> None:
        self._world.call("delete_chunk", chunk)

    def put_manifest(self, copy_id: str, text: str) -> None:
        self._world.call("put_manifest", copy_id, text)

    def get_manifest(self, copy_id: str) -> str:
        return str(self._world.call("get_manifest", copy_id))

    def manifest_ids(self) -> tuple[str, ...]:
        return tuple(self._world.call("manifest_ids"))

    def delete_manifest(self, copy_id: str) -> None:
        self._world.call("delete_manifest", copy_id)

    def put_marker(self, name: str, text: str) -> None:
        self._world.call("put_marker", name, text)

    def create_marker(self, name: str, text: str) -> bool:
        return bool(self._world.call("create_marker", name, text))

    def get_marker(self, name: str) -> str:
        return str(self._world.call("get_marker", name))

    def marker_names(self) -> tuple[str, ...]:
        return tuple(self._world.call("marker_names"))

    def delete_marker(self, name: str) -> None:
        self._world.call("delete_marker", name)


def build(root: Path, tree: dict[str, tuple[int, ...]]) -> dict[str, bytes]:
    root.mkdir(parents=True)
    out = {}
    for name, blocks in tree.items():
        data = b"".join(BLOCKS[b] for b in blocks) + name.encode()  # a short last chunk
        (root / name).write_bytes(data)
        out[name] = data
    return out


def contents(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir()}


@attrs.frozen
class Case:
    trees: list[dict[str, tuple[int, ...]]]
    reruns: list[int]
    gcs: list[int]
    expire: list[int]
    leftovers: bool
    free_copies: bool


CASES = st.builds(
    Case,
    trees=st.lists(TREES, min_size=1, max_size=3),
    reruns=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    gcs=st.lists(st.integers(1, 2), min_size=1, max_size=2),
    expire=st.lists(st.integers(0, 2), max_size=2, unique=True),
    leftovers=st.booleans(),
    free_copies=st.booleans(),
)


def make_world(case: Case, work: Path, reports: list[GcReport]) -> tuple[World, dict[str, Path]]:
    world = World()
    target = Scheduled(world)
    sources: dict[str, Path] = {}
    if case.leftovers:  # a copy that died long ago, and a collection that did
        long_ago = T0 - 3 * STALE
        world.inner.put_chunk("ee" * 32, b"left by a dead copy")
        world.inner.put_marker("pending.dead", Marker.new("pending.dead", long_ago).to_json())
        world.inner.put_marker(
            GC_MARKER, Marker.new(GC_MARKER, long_ago, stale_after=STALE).to_json()
        )
        old = work / "old"
        build(old, {"x": (0, 1), "y": (4,)})
        copy_trees(
            {"t": old}, world.inner, copy_id="old", backup_id="b", chunk_size=CHUNK, parallel=1
        )
        world.inner.delete_manifest("old")  # expired: its chunks are orphans
        world.inner.delete_marker("pending.old")

    def copy_op(copy_id: str, source: Path) -> Callable[[], Any]:
        def op() -> Any:
            manifest, _ = copy_trees(
                {"t": source},
                target,
                copy_id=copy_id,
                backup_id="b",
                chunk_size=CHUNK,
                codec="zlib",
                clock=world.clock,
                # One request at a time, from the actor's own thread: the scheduler
                # knows an actor by its thread. What threads change (who sends the
                # chunks between the marker and the manifest) is not the protocol's.
                parallel=1,
            )
            return manifest

        return op

    def gc_op() -> Any:
        report = collect_garbage(target, clock=world.clock, stale_after=STALE)
        reports.append(report)
        return report

    for n, tree in enumerate(case.trees):
        copy_id = f"c{n}"
        sources[copy_id] = work / copy_id
        build(sources[copy_id], tree)
        ops = [(copy_id, copy_op(copy_id, sources[copy_id]))] * case.reruns[n]
        world.actors.append(Actor(f"copy-{copy_id}", "copy", ops, free=case.free_copies))
    for n, count in enumerate(case.gcs):
        world.actors.append(Actor(f"gc-{n}", "gc", [("gc", gc_op)] * count))
    expired = [f"c{n}" for n in case.expire if n < len(case.trees)]

    def expire_op(copy_id: str) -> Callable[[], Any]:
        return lambda: target.delete_manifest(copy_id)

    if expired:
        ops = [(c, expire_op(c)) for c in expired]
        world.actors.append(Actor("expire", "expire", ops, free=True))
    return world, sources


def drive(world: World, data: st.DataObject, crashes: int) -> None:
    """Schedule the actors from ``data`` until every one is done: an actor, how far
    the clock moves, and how many calls in a row it makes (a burst: so that one
    actor may get far ahead of the others as well as step in lockstep with them)."""
    while waiting := world.settle():
        if world.step > 3000:
            break  # a copy waiting on a collection forever would be a bug
        actor = data.draw(st.sampled_from(waiting), label="turn")
        world.advance(data.draw(STEPS, label="time"), waiting)
        for _ in range(data.draw(BURSTS, label="burst")):
            decision = "go"
            # 13, not 0: hypothesis favours small numbers, and crashes should be rare
            if crashes and not actor.at_start and data.draw(st.integers(0, 24)) == 13:
                decision = data.draw(st.sampled_from(["crash-before", "crash-after"]))
                crashes -= 1
            world.grant(actor, decision)
            if actor not in world.settle():
                break
    world.stop()


def report_events(world: World, reports: list[GcReport]) -> None:
    for actor in world.actors:
        for _, outcome, value, _ in actor.outcomes:
            detail = type(value).__name__ if outcome in ("busy", "failed") else ""
            event(f"{actor.kind} {outcome} {detail}".strip())
    if any(r.chunks_deleted for r in reports):
        event("a collection removed chunks")
    if any(p != "pending.dead" for r in reports for p in r.pending):
        event("a collection took a copy of this run for dead")


@settings(max_examples=120, deadline=None)
@given(case=CASES, data=st.data())
def test_no_collection_removes_a_chunk_a_complete_copy_needs(
    case: Case, data: st.DataObject
) -> None:
    work = Path(tempfile.mkdtemp(prefix="pgsnap-gc-"))
    reports: list[GcReport] = []
    world, sources = make_world(case, work, reports)
    try:
        with mock.patch.object(copier, "_sleep", return_value=None):
            world.start()
            drive(world, data, data.draw(st.integers(0, 2), label="crashes"))
        check(world, sources, case, work)
        report_events(world, reports)
    finally:
        world.stopping = True
        shutil.rmtree(work)


@settings(max_examples=80, deadline=None)
@given(
    tree=TREES,
    expire=st.booleans(),
    pause_at=st.integers(0, 60),
    gc_alone=st.integers(0, 40),
    crash=st.booleans(),
    data=st.data(),
)
def test_a_copy_that_pauses_past_staleness_is_never_left_broken_by_a_collection(
    tree: dict[str, tuple[int, ...]],
    expire: bool,
    pause_at: int,
    gc_alone: int,
    crash: bool,
    data: st.DataObject,
) -> None:
    """The protocol's hard case, forced: a copy stops for twice the staleness limit
    after ``pause_at`` requests, the collection that starts meanwhile makes
    ``gc_alone`` requests (it takes the copy for dead and sweeps); then all go on,
    interleaved from ``data``."""
    case = Case([tree], [2, 1, 1], [2], [0] if expire else [], True, True)
    work = Path(tempfile.mkdtemp(prefix="pgsnap-gc-"))
    reports: list[GcReport] = []
    world, sources = make_world(case, work, reports)
    copier_actor = world.actors[0]
    try:
        with mock.patch.object(copier, "_sleep", return_value=None):
            world.start()
            for _ in range(pause_at + 1):  # the copy alone (its start, then requests)
                if copier_actor not in world.settle():
                    break
                world.grant(copier_actor, "go")
            world.settle()
            world.now += 2 * STALE
            collector = world.actors[1]
            for _ in range(gc_alone):  # then the collection alone: it takes the copy for dead
                if collector not in world.settle():
                    break
                world.grant(collector, "go")
            drive(world, data, int(crash))
        check(world, sources, case, work)
        report_events(world, reports)
    finally:
        world.stopping = True
        shutil.rmtree(work)


def check(world: World, sources: dict[str, Path], case: Case, work: Path) -> None:
    target = world.inner
    outcomes = [(a, *o) for a in world.actors for o in a.outcomes]
    errors = [(a.name, value) for a, _, outcome, value, _ in outcomes if outcome == "error"]
    assert errors == [], errors
    for actor, _, outcome, value, _ in outcomes:
        if outcome == "failed":
            # A copy fails only when it finds that a collection swept without it,
            # which a copy that never pauses for long gives no collection cause to do.
            assert actor.kind == "copy" and case.free_copies, (actor.name, value)
            event("a paused copy found its chunks swept and gave up")
    # A copy whose last run returned is complete, unless an expiry removed it since.
    for actor in world.actors:
        if actor.kind == "copy" and actor.outcomes and actor.outcomes[-1][1] == "ok":
            copy_id, _, _, written = actor.outcomes[-1]
            assert written is not None
            expired = [s for s in world.deleted_manifest_at.get(copy_id, ()) if s > written]
            if not expired:
                assert copy_id in target.manifest_ids(), f"copy {copy_id} returned, is gone"
            assert pending_marker(copy_id) not in target.marker_names()
    # Every manifest there is complete, and restores its tree byte for byte.
    died_after_manifest = {
        label
        for _, label, outcome, _, written in outcomes
        if outcome == "crash" and written is not None
    }
    for copy_id in target.manifest_ids():
        manifest = Manifest.from_json(target.get_manifest(copy_id))
        missing = {c for c in manifest.chunk_ids() if not target.has_chunk(c)}
        if missing and case.free_copies and copy_id in died_after_manifest:
            event("residue: a copy paused for long died right after writing its manifest")
            continue
        assert missing == set(), f"copy {copy_id} lost {len(missing)} chunks"
        dest = work / f"restored-{copy_id}"
        restore_trees(manifest, target, {"t": dest})
        assert contents(dest) == contents(sources[copy_id])
    # A collection that ended (well or refused) took its marker away.
    gc_ops = [o for a, _, o, _, _ in outcomes if a.kind == "gc"]
    if gc_ops and "crash" not in gc_ops:
        assert GC_MARKER not in target.marker_names(), "a collection left its marker"


def test_a_collection_with_no_copy_in_progress_removes_exactly_the_orphans(tmp_path: Path) -> None:
    """Deterministic: three copies sharing blocks, one expired and one that died
    half-way (its marker long stale); the collection removes exactly the chunks
    no remaining manifest names, and both remaining copies restore."""
    target = MemoryCopyTarget()
    trees: dict[str, dict[str, tuple[int, ...]]] = {
        "c0": {"a": (0, 1)},
        "c1": {"a": (1, 2)},
        "c2": {"a": (2, 3), "b": (4,)},
    }
    manifests: dict[str, Manifest] = {}
    for copy_id, tree in trees.items():
        build(tmp_path / copy_id, tree)
        manifests[copy_id], _ = copy_trees(
            {"t": tmp_path / copy_id}, target, copy_id=copy_id, backup_id="b", chunk_size=CHUNK
        )
    target.delete_manifest("c0")
    target.put_chunk("ab" * 32, b"sent by a copy that died")
    target.put_marker(
        "pending.c9", Marker.new("pending.c9", T0 - 2 * STALE, copy_id="c9").to_json()
    )
    live = manifests["c1"].chunk_ids() | manifests["c2"].chunk_ids()
    orphans = set(target.chunk_ids()) - live
    assert len(orphans) == 2  # block 0 (c0's alone), the dead copy's chunk
    report = collect_garbage(target, now=T0, stale_after=STALE)
    assert report.chunks_deleted == len(orphans) and report.pending == ("pending.c9",)
    assert set(target.chunk_ids()) == live
    for copy_id in ("c1", "c2"):
        restore_trees(manifests[copy_id], target, {"t": tmp_path / f"r-{copy_id}"})
        assert contents(tmp_path / f"r-{copy_id}") == contents(tmp_path / copy_id)
    again = collect_garbage(target, now=T0, stale_after=STALE)
    assert again.chunks_deleted == 0 and again.chunks_live == len(live)
    target.delete_chunk(sorted(live)[0])  # damage: reported, not hidden
    assert collect_garbage(target, now=T0, stale_after=STALE).chunks_missing == 1
