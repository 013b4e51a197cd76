"""pgsnap._journal.prune_journals: the documented rule, and nothing else, is removed."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from pgsnap._journal import JOURNAL_VERSION, RunState, _ended_state, open_journal, prune_journals

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def journal(directory: Path, name: str, ended: RunState | None, age_days: float) -> Path:
    """A journal whose run ended in ``ended`` (None: still running), last written
    ``age_days`` before NOW."""
    path = directory / f"recovery-{name}.journal"
    lines = [
        {"journal": JOURNAL_VERSION, "plan": {}, "plan_id": name, "started_at": NOW.isoformat()},
        {"step": "a", "state": "done"},
    ]
    if ended is not None:
        lines.append({"at": NOW.isoformat(), "run": ended.value})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    when = (NOW - dt.timedelta(days=age_days)).timestamp()
    os.utime(path, (when, when))
    return path


def test_only_old_runs_that_ended_well_beyond_the_newest_are_removed(tmp_path: Path) -> None:
    old_done = [journal(tmp_path, f"d{i}", RunState.DONE, 40 + i) for i in range(5)]
    old_undone = journal(tmp_path, "c", RunState.COMPENSATED, 100)
    failed = journal(tmp_path, "f", RunState.FAILED, 400)
    running = journal(tmp_path, "r", None, 400)
    young = journal(tmp_path, "y", RunState.DONE, 1)
    removed = prune_journals(tmp_path, keep=2, now=NOW)
    # the two newest ended ones are kept (young and d0); the rest of the old ones go
    assert set(removed) == {*old_done[1:], old_undone}
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {young.name, old_done[0].name, failed.name, running.name}
    assert prune_journals(tmp_path, keep=2, now=NOW) == ()


def test_a_locked_journal_is_never_removed(tmp_path: Path) -> None:
    journal(tmp_path, "x", RunState.DONE, 1)
    with open_journal(tmp_path, "recovery", {}, "held", lambda: NOW) as j:
        j.finish(RunState.DONE)
        held = tmp_path / "recovery-held.journal"
        os.utime(held, (0, 0))
        assert _ended_state(held) is RunState.DONE  # removable, but for its lock
        assert prune_journals(tmp_path, keep=0, now=NOW) == ()
    assert held.exists()


def test_a_torn_or_missing_directory_is_left_alone(tmp_path: Path) -> None:
    assert prune_journals(tmp_path / "none", now=NOW) == ()
    torn = journal(tmp_path, "t", RunState.DONE, 90)
    torn.write_text(torn.read_text()[:-5])
    os.utime(torn, (0, 0))
    assert prune_journals(tmp_path, keep=0, now=NOW) == ()
