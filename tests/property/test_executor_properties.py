"""The executor's rules under random interleavings of plan, kill, resume and re-plan.

A hypothesis state machine makes backup plans (and plans of test operations,
some with a point of no return or a step that cannot resume), runs them to
the end, or in a forked child process that SIGKILLs itself at a random step
(a real kill: nothing of the child runs after it), resumes what is
interrupted, runs ended plans again, lets the archive lag and the storage
lose snapshots of unfinished backups. The storage (the mock with a state
file), the catalog and the journals are on disk, so the parent sees what
the killed child left. Invariants, checked after every step:

- a backup is DONE only with every one of its snapshots on the storage, and a
  FAILED backup never becomes DONE;
- a journal belongs to one plan: its header, its name and its steps are that
  plan's; a run of a plan skips only steps that plan itself finished;
- an ended run (done, failed, compensated) never changes again, and running
  its plan again is refused with PlanAlreadyRunError.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, ClassVar, cast

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from pgsnap import errors
from pgsnap._journal import JOURNAL_SUFFIX, RunState, read_journal
from pgsnap.backends.mock import MockBackend
from pgsnap.catalog import DirectoryCatalog
from pgsnap.executor import Event, EventKind, Executor
from pgsnap.model import BackupState, Layout, Volume, VolumeRole
from pgsnap.operations import (
    Operation,
    OperationContext,
    Outputs,
    Ref,
    Resume,
    Target,
    default_operations,
)
from pgsnap.plan import Plan, Step
from pgsnap.planner.backup import BackupRequest, plan_backup
from pgsnap.planner.facts import BackupFacts
from pgsnap.protocols import DatabaseAdapter
from tests.unit.test_executor import MB, FakeArchive, FakeDb
from tests.unit.test_planner_backup import ARCHIVER, directory_volumes, paths_of

LOG_NAME = "events.jsonl"


def _append(path: Path, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


@attrs.frozen
class PropStep(Operation):
    name: ClassVar[str] = "prop.step"
    target: ClassVar[Target] = Target.HOST
    compensation: ClassVar[str | None] = "prop.undo"

    log: str
    tag: str

    def run(self, ctx: OperationContext) -> Outputs:
        _append(Path(self.log), {"ran": self.tag, "plan": ctx.plan_id})
        return {"tag": self.tag}


@attrs.frozen
class PropUndo(Operation):
    name: ClassVar[str] = "prop.undo"
    target: ClassVar[Target] = Target.HOST

    log: str
    tag: str | Ref

    def run(self, ctx: OperationContext) -> Outputs:
        _append(Path(self.log), {"undid": ctx.resolve(self.tag), "plan": ctx.plan_id})
        return {}


@attrs.frozen
class PropBarrier(PropStep):
    name: ClassVar[str] = "prop.barrier"
    compensation: ClassVar[str | None] = None
    barrier: ClassVar[bool] = True


@attrs.frozen
class PropNeedsProcess(PropStep):
    name: ClassVar[str] = "prop.needs_process"
    compensation: ClassVar[str | None] = None
    resume: ClassVar[Resume] = Resume.ABORT


def _register() -> None:
    for cls in (PropStep, PropUndo, PropBarrier, PropNeedsProcess):
        default_operations().register(cls.name, cls, replace=True)


class ExecutorMachine(RuleBasedStateMachine):
    plans = Bundle("plans")

    @initialize()
    def setup(self) -> None:
        _register()
        self.root = Path(tempfile.mkdtemp(prefix="pgsnap-exec-prop-"))
        self.state_file = self.root / "mock.json"
        backend = MockBackend(state_file=self.state_file, root=self.root / "snaps")
        data, wal = backend.add_volume("data"), backend.add_volume("wal")
        self.layout = Layout(
            [
                Volume(data.id, "data", VolumeRole.DATA, "/pg/data"),
                Volume(wal.id, "wal", VolumeRole.WAL, "/pg/wal"),
            ]
        )
        self.catalog = DirectoryCatalog(self.root / "catalog")
        self.journals = self.root / "journal"
        self.log = self.root / LOG_NAME
        self.db = FakeDb()
        self.archive = FakeArchive()
        self.lagging = False
        self.counter = 0
        self.ended: dict[Path, bytes] = {}
        self.failed_backups: set[str] = set()

    def teardown(self) -> None:
        shutil.rmtree(getattr(self, "root", "/nonexistent"), ignore_errors=True)

    # ------------------------------------------------------------------ plumbing

    def executor(self, plan_id: str, kill: tuple[int, str] | None = None) -> Executor:
        backend = MockBackend(state_file=self.state_file)
        archive = FakeArchive()
        if not self.lagging:
            archive.arrive = lambda: archive.names.update(self._backup_wal())
        log = self.log

        def on_event(event: Event) -> None:
            _append(log, {"event": event.kind.value, "step": event.step_id, "plan": plan_id})
            if kill is not None and event.index - 1 == kill[0] and event.kind.value == kill[1]:
                os.kill(os.getpid(), signal.SIGKILL)

        return Executor(
            adapter=cast(DatabaseAdapter, self.db),
            backend=backend,
            catalog=self.catalog,
            archive=archive,
            layout=self.layout,
            journal_dir=self.journals,
            on_event=on_event,
            sleep=lambda s: None,
        )

    def _backup_wal(self) -> set[str]:
        from pgsnap.operations.catalog import required_wal_files
        from pgsnap.wal import segment_name

        names: set[str] = {segment_name(1, 3, MB), segment_name(1, 4, MB)}
        for record in self.catalog.list():
            if record.stop_lsn is not None:
                names |= {n for n in required_wal_files(record) if n is not None}
        return names

    def events(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def journal_of(self, plan: Plan) -> Path:
        return self.journals / f"{plan.kind}-{plan.id[:32]}{JOURNAL_SUFFIX}"

    def run_here(self, plan: Plan) -> None:
        ended_before = self.journal_of(plan) in self.ended
        try:
            self.executor(plan.id).run(plan)
        except errors.PlanAlreadyRunError:
            assert ended_before, "refused as already run, but its run had not ended"
            return
        except errors.PgsnapError:
            pass
        assert not ended_before, "an ended run was run again"

    # ------------------------------------------------------------------ rules

    @rule(target=plans)
    def plan_a_backup(self) -> Plan:
        self.counter += 1
        facts = BackupFacts(
            server=self.db.describe(),
            archiver=ARCHIVER,
            layout=self.layout,
            volumes=MockBackend(state_file=self.state_file).list_volumes(),
            capabilities=MockBackend(state_file=self.state_file).capabilities,
            catalog=(),
            archive_location="/archive",
            archive_timelines=(1,),
            host="db1",
            volume_facts=directory_volumes(self.layout),
            paths=paths_of(self.db.describe()),
        )
        return plan_backup(facts, BackupRequest(f"b-{self.counter}", "p", wal_timeout=0.0))

    @rule(
        target=plans,
        n=st.integers(1, 5),
        special=st.integers(0, 6),
        kind=st.sampled_from(["barrier", "needs_process", "plain"]),
    )
    def plan_test_steps(self, n: int, special: int, kind: str) -> Plan:
        self.counter += 1
        log = str(self.log)
        steps = []
        for i in range(n):
            tag = f"p{self.counter}-s{i}"
            if i == special and kind == "barrier":
                op: Operation = PropBarrier(log, tag)
                steps.append(Step.of(tag, op, description=tag, reason="t"))
            elif i == special and kind == "needs_process":
                steps.append(Step.of(tag, PropNeedsProcess(log, tag), description=tag, reason="t"))
            else:
                steps.append(
                    Step.of(
                        tag,
                        PropStep(log, tag),
                        description=tag,
                        reason="t",
                        undo=PropUndo(log, Ref(tag, "tag")),
                    )
                )
        return Plan("test", tuple(steps), f"fp-{self.counter}")

    @rule(plan=plans)
    def run_to_the_end(self, plan: Plan) -> None:
        self.run_here(plan)

    @rule(
        plan=plans,
        data=st.data(),
        when=st.sampled_from(["started", "finished"]),
        lose=st.booleans(),
    )
    def run_and_kill(self, plan: Plan, data: st.DataObject, when: str, lose: bool) -> None:
        at = data.draw(st.integers(0, len(plan.steps) - 1), label="kill at step")
        ended_before = self.journal_of(plan) in self.ended
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child is killed or exits
            code = 0
            try:
                self.executor(plan.id, kill=(at, when)).run(plan)
            except errors.PlanAlreadyRunError:
                code = 3
            except BaseException:  # the child reports by exit status only
                code = 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if ended_before:
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, status
        if lose:
            self.storage_loses_a_snapshot_of_an_unfinished_backup(data)

    @rule()
    def resume_what_is_interrupted(self) -> None:
        for plan in self.executor("?").interrupted():
            self.run_here(plan)

    @rule()
    def archive_lags_or_catches_up(self) -> None:
        self.lagging = not self.lagging

    @rule(data=st.data())
    def storage_loses_a_snapshot_of_an_unfinished_backup(self, data: st.DataObject) -> None:
        """As a snapshot policy rotating a snapshot out, or an administrator."""
        backend = MockBackend(state_file=self.state_file)
        done = {
            s
            for r in self.catalog.list()
            if r.state is BackupState.DONE
            for s in r.snapshots.values()
        }
        candidates = sorted(s.id for s in backend.list_snapshots() if s.id not in done)
        if candidates:
            backend.delete_snapshot(data.draw(st.sampled_from(candidates)))

    # ------------------------------------------------------------------ invariants

    @invariant()
    def done_backups_have_their_snapshots_and_failed_ones_stay_failed(self) -> None:
        if not hasattr(self, "catalog"):
            return
        present = {s.id for s in MockBackend(state_file=self.state_file).list_snapshots()}
        for record in self.catalog.list():
            if record.state is BackupState.DONE:
                assert record.snapshots, f"{record.id} DONE without snapshots"
                assert set(record.snapshots.values()) <= present, record.id
                assert record.id not in self.failed_backups, f"{record.id} FAILED, then DONE"
            elif record.state is BackupState.FAILED:
                self.failed_backups.add(record.id)

    @invariant()
    def journals_belong_to_their_plan_and_ended_runs_never_change(self) -> None:
        if not hasattr(self, "journals") or not self.journals.exists():
            return
        for path in sorted(self.journals.glob(f"*{JOURNAL_SUFFIX}")):
            view = read_journal(path)
            if view is None:
                continue
            plan = Plan.from_dict(view.plan)
            assert plan.id == view.plan_id and path == self.journal_of(plan)
            assert set(view.steps) <= {s.id for s in plan.steps}
            if path in self.ended:
                assert path.read_bytes() == self.ended[path], f"{path.name} changed after it ended"
            elif view.state is not RunState.RUNNING:
                self.ended[path] = path.read_bytes()

    @invariant()
    def a_run_skips_only_what_its_own_plan_finished(self) -> None:
        if not hasattr(self, "log"):
            return
        finished: dict[str, set[str]] = {}
        for record in self.events():
            if "event" not in record:
                continue
            mine = finished.setdefault(record["plan"], set())
            if record["event"] in (EventKind.FINISHED.value, EventKind.ADOPTED.value):
                mine.add(record["step"])
            elif record["event"] == EventKind.SKIPPED.value:
                assert record["step"] in mine, (
                    f"plan {record['plan'][:12]} skipped {record['step']}, which it never finished"
                )


ExecutorMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=14,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestExecutorInterleavings = ExecutorMachine.TestCase
