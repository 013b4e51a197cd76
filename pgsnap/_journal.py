"""The executor's journal: what happened to one plan's run, kept on disk as it happens.

One file per plan identity, ``<kind>-<plan id>.journal`` in the journal
directory: JSON lines, appended one record at a time (a step started,
finished, failed, was undone; the run ended). Appending costs the same at
every step, a crash can only tear the last line (which is then ignored), and
the history of the run stays readable. Each record is fsynced before the run
goes on, except a step's end, which is fsynced with the record after it (the
next step's start, or the run's end): one fsync a step instead of two, and
still every record on disk before the next step acts. A machine that fails in
between loses that end, as if it had failed just before the step ended: the
step is found started and is resumed as such.

- The first line is the header: the plan (whole) and its identity. A journal
  only ever belongs to that plan: it is found by the identity and checked
  against it when opened.
- The run's state is :class:`RunState`: ``running`` until it ends ``done``,
  ``compensated`` (failed, and everything done was undone) or ``failed``
  (failed, and something could not be undone, or the failure came after the
  point of no return). Only a ``running`` journal whose process is gone is
  *interrupted* and resumed; an ended run is never run again.
- While a process runs the plan it holds a write lock on the file (an
  open-file-description lock, released by the kernel when the process dies).
  :func:`is_locked` asks the kernel whether someone holds it *without taking
  it*, so listing interrupted plans never disturbs a run.
"""

from __future__ import annotations

import datetime as dt
import enum
import errno
import fcntl
import json
import logging
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from pgsnap._attrs import frozen
from pgsnap.errors import ExecutionError, PlanLockedError

__all__ = [
    "JOURNAL_SUFFIX",
    "JOURNAL_VERSION",
    "Journal",
    "JournalView",
    "RunState",
    "StepRecord",
    "StepState",
    "is_locked",
    "journal_path",
    "open_journal",
    "prune_journals",
    "read_journal",
]

log = logging.getLogger(__name__)

JOURNAL_VERSION: Final = 2
"""Version of the journal file format (1: one JSON document rewritten per step)."""

JOURNAL_SUFFIX: Final = ".journal"

KEEP_JOURNALS: Final = 100
""":func:`prune_journals` keeps at least this many ended journals (the newest)."""

KEEP_JOURNAL_DAYS: Final = 30
"""... and every ended journal younger than this many days."""


class RunState(enum.Enum):
    """How a plan's run stands."""

    RUNNING = "running"
    """Under way, or interrupted (no process holds the journal's lock)."""
    DONE = "done"
    COMPENSATED = "compensated"
    """Failed; every compensation ran."""
    FAILED = "failed"
    """Failed; a compensation failed too, or the failure came after the point of no return."""


class StepState(enum.Enum):
    """What happened to a step."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


@frozen
class StepRecord:
    """A step's latest state in the journal, with its outputs once done."""

    state: StepState
    outputs: Mapping[str, Any] | None = None
    seconds: float | None = None
    error: str | None = None
    adopted: bool = False
    """Done by an interrupted process, found by probing after the interruption."""
    started: bool = False
    """The step has started at some point (it may have ended since)."""


@frozen
class JournalView:
    """A journal as read from disk (no lock taken)."""

    path: Path | None
    plan: Mapping[str, Any]
    plan_id: str
    started_at: dt.datetime
    state: RunState
    reason: str | None
    steps: Mapping[str, StepRecord]

    @property
    def has_progress(self) -> bool:
        """True when at least one step started."""
        return bool(self.steps)


def journal_path(directory: Path, kind: str, plan_id: str) -> Path:
    """Where the journal of the plan with ``plan_id`` lives in ``directory``."""
    return directory / f"{kind}-{plan_id[:32]}{JOURNAL_SUFFIX}"


# --------------------------------------------------------------------------- locks

# struct flock on Linux (x86-64 and arm64): short l_type, short l_whence,
# off_t l_start, off_t l_len, pid_t l_pid, padded to 32 bytes.
_FLOCK = struct.Struct("hhqqi4x")


def _lock_request(kind: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0)


def _try_lock(fd: int) -> bool:
    """Take the journal's write lock (an OFD lock); False when someone holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _lock_request(fcntl.F_WRLCK))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def is_locked(path: Path) -> bool:
    """True when a process holds the journal's lock; asks the kernel, takes nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock_request(fcntl.F_WRLCK))
    finally:
        os.close(fd)
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)


# --------------------------------------------------------------------------- reading


def _parse(path: Path | None, raw: bytes) -> JournalView | None:
    """The journal in ``raw`` (None when it has no header yet)."""
    lines = raw.split(b"\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            last = number == len(lines) or all(not rest.strip() for rest in lines[number:])
            if last:
                log.warning("journal %s: ignoring a torn last line", path)
                break
            raise ExecutionError(
                f"the journal {path} is damaged at line {number}: {exc}",
                step_id="",
                hint="inspect it; move it away only once you know what its run did",
            ) from exc
        records.append(record)
    if not records:
        return None
    header = records[0]
    if header.get("journal") != JOURNAL_VERSION or "plan" not in header:
        raise ExecutionError(
            f"{path} is not a pgsnap journal of version {JOURNAL_VERSION}",
            step_id="",
            hint="journals of pgsnap 0.1 (*.json) are not resumed: finish or discard that run "
            "with the version that started it",
        )
    steps: dict[str, StepRecord] = {}
    state, reason = RunState.RUNNING, None
    for record in records[1:]:
        if "run" in record:
            state = RunState(record["run"])
            reason = record.get("reason")
            continue
        step_id = str(record["step"])
        previous = steps.get(step_id)
        new_state = StepState(record["state"])
        outputs = record.get("outputs")
        if outputs is None and previous is not None:
            outputs = previous.outputs
        steps[step_id] = StepRecord(
            state=new_state,
            outputs=outputs,
            seconds=record.get("seconds", previous.seconds if previous else None),
            error=record.get("error"),
            adopted=bool(record.get("adopted", previous.adopted if previous else False)),
            started=True,
        )
    return JournalView(
        path=path,
        plan=header["plan"],
        plan_id=str(header["plan_id"]),
        started_at=dt.datetime.fromisoformat(str(header["started_at"])),
        state=state,
        reason=reason,
        steps=steps,
    )


def read_journal(path: Path) -> JournalView | None:
    """Read a journal without locking it (None when it is empty)."""
    return _parse(path, path.read_bytes())


# --------------------------------------------------------------------------- writing


class Journal:
    """The journal of one run, open for writing (see the module docstring).

    ``path`` None keeps it in memory only (no resume, no lock). The header is
    written with the first record, so a run refused before its first step
    (a stale plan) leaves no journal behind.
    """

    def __init__(
        self,
        path: Path | None,
        fd: int | None,
        plan: Mapping[str, Any],
        plan_id: str,
        view: JournalView | None,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.path = path
        self._fd = fd
        self._plan = plan
        self._plan_id = plan_id
        self._clock = clock
        self._header_written = view is not None
        self._unsynced = False
        self._written = b"" if fd is None else os.pread(fd, os.fstat(fd).st_size, 0)
        """Every line of the journal (to write it again if it is removed during the run)."""
        self.started_at = view.started_at if view is not None else clock()
        self.state = view.state if view is not None else RunState.RUNNING
        self.reason = view.reason if view is not None else None
        self.steps: dict[str, StepRecord] = dict(view.steps) if view is not None else {}

    @property
    def fd(self) -> int:
        """The open, locked journal file (only for a journal on disk)."""
        assert self._fd is not None
        return self._fd

    @property
    def resumed(self) -> bool:
        """True when an earlier process had started this run."""
        return bool(self.steps)

    def _append(self, record: Mapping[str, Any], *, sync: bool = True) -> None:
        """Write ``record``; fsync it and what was written before it unless ``sync`` is
        False (a step's end: the next record's fsync covers it)."""
        if self._fd is None:
            return
        lines = b""
        if not self._header_written:
            header = {
                "journal": JOURNAL_VERSION,
                "plan_id": self._plan_id,
                "started_at": self.started_at.isoformat(),
                "plan": self._plan,
            }
            lines += json.dumps(header, default=str).encode() + b"\n"
            self._header_written = True
        lines += json.dumps(record, default=str).encode() + b"\n"
        self._restore_if_removed()
        os.write(self._fd, lines)
        self._written += lines
        self._unsynced = not sync
        if sync:
            os.fsync(self._fd)

    def sync(self) -> None:
        """fsync what was written and not yet synced (a step's end)."""
        if self._fd is not None and self._unsynced:
            try:
                os.fsync(self._fd)
            except OSError as exc:  # at the end of a run that is already ending
                log.warning("the journal %s could not be synced: %s", self.path, exc)
            self._unsynced = False

    def _restore_if_removed(self) -> None:
        """A journal removed while its run goes on (its directory deleted, the file moved
        away) is written again where it belongs, from what this run wrote, and the
        loss is reported: a run whose journal is gone could not be resumed."""
        assert self._fd is not None and self.path is not None
        try:
            same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return
        log.error(
            "the journal %s was removed while its run goes on; writing it again (an "
            "interrupted run is resumed only from its journal)",
            self.path,
        )
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        if not _try_lock(fd):
            os.close(fd)
            raise PlanLockedError(
                f"the journal {self.path} was removed during the run and another process "
                "has created it since",
                hint="only one process runs a plan: stop the other one",
                path=str(self.path),
            )
        os.write(fd, self._written)
        os.fsync(fd)
        os.close(self._fd)
        self._fd = fd

    def record_step(
        self,
        step_id: str,
        state: StepState,
        *,
        outputs: Mapping[str, Any] | None = None,
        seconds: float | None = None,
        error: str | None = None,
        adopted: bool = False,
    ) -> None:
        """Append what happened to a step."""
        previous = self.steps.get(step_id)
        self.steps[step_id] = StepRecord(
            state=state,
            outputs=outputs if outputs is not None else (previous.outputs if previous else None),
            seconds=seconds if seconds is not None else (previous.seconds if previous else None),
            error=error,
            adopted=adopted or (previous.adopted if previous else False),
            started=True,
        )
        record: dict[str, Any] = {
            "at": self._clock().isoformat(),
            "step": step_id,
            "state": state.value,
        }
        if outputs is not None:
            record["outputs"] = dict(outputs)
        if seconds is not None:
            record["seconds"] = round(seconds, 6)
        if error is not None:
            record["error"] = error
        if adopted:
            record["adopted"] = True
        self._append(record, sync=state is not StepState.DONE)

    def finish(self, state: RunState, reason: str | None = None) -> None:
        """Append the end of the run."""
        self.state = state
        self.reason = reason
        record: dict[str, Any] = {"at": self._clock().isoformat(), "run": state.value}
        if reason is not None:
            record["reason"] = reason
        self._append(record)


@contextmanager
def open_journal(
    directory: Path | None,
    kind: str,
    plan: Mapping[str, Any],
    plan_id: str,
    clock: Callable[[], dt.datetime],
) -> Iterator[Journal]:
    """The plan's journal, locked for this process while the block runs.

    :class:`~pgsnap.errors.PlanLockedError` when another process holds it.
    With ``directory`` None the journal lives in memory only.
    """
    if directory is None:
        yield Journal(None, None, plan, plan_id, None, clock)
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = journal_path(directory, kind, plan_id)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    journal: Journal | None = None
    try:
        if not _try_lock(fd):
            raise PlanLockedError(
                f"another process is executing this plan (journal {path})",
                hint="wait for it to finish; run the plan again only once it has stopped",
                path=str(path),
            )
        size = os.fstat(fd).st_size
        raw = os.pread(fd, size, 0) if size else b""
        view = _parse(path, raw)
        if view is not None and view.plan_id != plan_id:
            raise ExecutionError(
                f"the journal {path} belongs to plan {view.plan_id[:12]}, not to {plan_id[:12]}",
                step_id="",
                hint="two plans share a journal name: move this journal away after checking "
                "its run",
            )
        journal = Journal(path, fd, plan, plan_id, view, clock)
        try:
            yield journal
        finally:
            # A journal that never got a header (the run was refused before its
            # first step, e.g. as stale) is not a run: leave nothing behind. Done
            # while the lock is held, so no other process is writing to it.
            if os.fstat(journal.fd).st_size == 0:
                path.unlink(missing_ok=True)
            else:
                journal.sync()  # a run stopped after a step's end (an interruption)
    finally:
        # The journal's descriptor: a journal written again after its removal has a new one.
        os.close(fd if journal is None else journal.fd)


# --------------------------------------------------------------------------- pruning


def _ended_state(path: Path) -> RunState | None:
    """The state a journal ended in (from its last line), None while it runs."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - 4096))
        tail = f.read()
    for line in reversed(tail.split(b"\n")):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            return None  # a torn last line: the run did not end cleanly
        if isinstance(record, dict) and "run" in record:
            try:
                return RunState(record["run"])
            except ValueError:
                return None
        return None
    return None


def prune_journals(
    directory: str | os.PathLike[str],
    *,
    keep: int = KEEP_JOURNALS,
    max_age: dt.timedelta = dt.timedelta(days=KEEP_JOURNAL_DAYS),
    now: dt.datetime | None = None,
) -> tuple[Path, ...]:
    """Remove the journals of runs that ended well long ago; return what was removed.

    The rule: a journal is removed only when its run ended ``done`` or
    ``compensated`` (nothing left to resume or to look into), it is not among
    the ``keep`` newest such journals, and it was last written more than
    ``max_age`` ago. A running, interrupted or locked journal, and one whose
    run ended ``failed`` (something was left for a person to see to), is never
    removed. The executor applies the defaults after each run.
    """
    base = Path(directory)
    if not base.is_dir():
        return ()
    when = (now or dt.datetime.now(dt.UTC)).timestamp()
    ended: list[tuple[float, Path]] = []
    for path in base.glob(f"*{JOURNAL_SUFFIX}"):
        try:
            mtime = path.stat().st_mtime
            state = _ended_state(path)
        except OSError:
            continue
        if state in (RunState.DONE, RunState.COMPENSATED):
            ended.append((mtime, path))
    ended.sort(reverse=True)
    removed: list[Path] = []
    for mtime, path in ended[keep:]:
        if when - mtime <= max_age.total_seconds() or is_locked(path):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    if removed:
        log.info("removed %d journals of runs that ended over %s ago", len(removed), max_age)
    return tuple(removed)
