"""Showing progress (issue 26): the reporters, and the figures long steps report."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from pgsnap import progress
from pgsnap.executor import Event, EventKind
from pgsnap.model import LSN


def ev(kind: EventKind, step: str = "s", detail: str | None = None, **data: Any) -> Event:
    return Event(kind, step, f"do {step}", 1, 2, None, None, detail, data)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr("pgsnap.progress.time.monotonic", c)
    return c


def test_lines_give_each_step_and_a_long_step_every_ten_seconds(clock: Clock) -> None:
    out = io.StringIO()
    tell = progress.LineReporter(out)
    tell(ev(EventKind.STARTED))
    for second in range(25):
        clock.now = 100.0 + second
        tell(ev(EventKind.PROGRESS, detail=f"{second} segments"))
    tell(ev(EventKind.FINISHED))
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["started", *["progress"] * 4, "finished"]
    assert [line.rsplit(": ", 1)[1] for line in lines[1:5]] == [
        "0 segments",
        "10 segments",
        "20 segments",
        "24 segments",  # the last figures, held back, told before the end
    ]


def test_a_terminal_gets_one_status_line_rewritten_in_place(clock: Clock) -> None:
    out = io.StringIO()
    tell = progress.LiveReporter(out, fps=5)
    tell(ev(EventKind.STARTED))
    clock.now += 1
    tell(ev(EventKind.PROGRESS, detail="replayed to 0/3000000"))
    clock.now += 0.01
    tell(ev(EventKind.PROGRESS, detail="too soon: not shown"))
    clock.now += 1
    tell(ev(EventKind.PROGRESS, detail="replayed to 0/5000000"))
    tell(ev(EventKind.FINISHED))
    text = out.getvalue()
    assert "too soon" not in text
    assert text.count("\r\x1b[K") == 3  # two status lines, erased before "finished"
    last = text.rsplit("\r\x1b[K", 1)[1]
    assert last.startswith("[1/2] finished") and last.endswith("\n")
    assert "replayed to 0/5000000" in text


def test_json_events_are_one_object_a_line() -> None:
    out = io.StringIO()
    tell = progress.JsonEventReporter(out)
    tell(ev(EventKind.STARTED))
    tell(ev(EventKind.PROGRESS, detail="3 of 9 segments verified", verified=3, segments=9))
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["kind"] for r in rows] == ["started", "progress"]
    assert rows[1]["data"] == {"verified": 3, "segments": 9}
    assert rows[1]["step"] == "s" and rows[1]["total"] == 2


def test_a_closed_stream_never_stops_the_run() -> None:
    out = io.StringIO()
    tell = progress.LineReporter(out)
    out.close()
    tell(ev(EventKind.STARTED))  # dropped, no error
    tell(ev(EventKind.FINISHED))


def test_the_terminal_reporter_is_live_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(progress.terminal_reporter(Tty()), progress.LiveReporter)
    assert isinstance(progress.terminal_reporter(io.StringIO()), progress.LineReporter)


def test_outside_a_notebook_nothing_is_displayed() -> None:
    assert not progress.in_notebook()
    assert progress.notebook_reporter() is None


def test_the_notebook_display_is_updated_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    display = pytest.importorskip("IPython.display", reason="IPython comes with the test extras")
    shown: list[str] = []

    class Handle:
        def update(self, obj: Any) -> None:
            shown.append(obj.data)

    monkeypatch.setattr(display, "display", lambda obj, display_id=False: Handle())
    tell = progress.NotebookReporter()
    tell(ev(EventKind.STARTED, "restore"))
    tell(ev(EventKind.PROGRESS, "restore", detail="40 % <done>"))
    tell(ev(EventKind.FINISHED, "restore"))
    assert "running: do restore" in shown[0]
    assert "40 % &lt;done&gt;" in shown[1]  # escaped
    assert "finished" in shown[-1] and "running" not in shown[-1]


def test_replay_progress_adds_rate_and_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    from pgsnap.operations import db

    now = [10.0]
    monkeypatch.setattr("pgsnap.operations.db.time.monotonic", lambda: now[0])
    told: list[tuple[str, dict[str, Any]]] = []
    replay = db._ReplayProgress(lambda m, d: told.append((m, dict(d))), LSN(0x4000000))
    replay("replayed to 0/1000000", {"replay_lsn": "0/1000000", "segments_restored": 1})
    now[0] = 12.0  # two seconds later, 32 MiB further
    replay("replayed to 0/3000000", {"replay_lsn": "0/3000000", "segments_restored": 3})
    assert "rate_bytes_per_second" not in told[0][1]
    data = told[1][1]
    assert data["rate_bytes_per_second"] == 16 << 20
    assert data["bytes_left"] == 16 << 20 and data["eta_seconds"] == 1.0
    assert "16.0 MiB/s" in told[1][0] and "about 1 s" in told[1][0]
