"""Showing a run's progress: on a terminal, in a log, as JSON, in a notebook.

The executor tells what happens through :class:`~pgsnap.executor.Event` objects:
each step starting and finishing, and, during a long step, ``PROGRESS`` events with
what moved (the WAL segment awaited, bytes copied, the replay position). These
reporters are callables taking those events (``on_event=``):

- :class:`LineReporter`: one line per step's start and end, and a progress line per
  step at most every ``every`` seconds (a log file, a pipe, CI);
- :class:`LiveReporter`: the same permanent lines, and the latest progress of the
  running step on one status line that is rewritten in place (a terminal);
- :class:`JsonEventReporter`: one JSON object per event, for products that run the
  ``pgsnap`` command and read its stderr (``--json-events``);
- :class:`NotebookReporter`: an updating display in a Jupyter notebook
  (:meth:`pgsnap.cluster.Cluster.execute` shows one by default there).

:func:`terminal_reporter` picks the live one when the stream is a terminal.
No dependency: a status line needs only a carriage return and an erase.
"""

from __future__ import annotations

import html
import json
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from pgsnap.executor import Event, EventKind

__all__ = [
    "JsonEventReporter",
    "LineReporter",
    "LiveReporter",
    "NotebookReporter",
    "event_json",
    "in_notebook",
    "notebook_reporter",
    "terminal_reporter",
]

_ERASE = "\r\x1b[K"


def event_json(event: Event) -> dict[str, Any]:
    """An event as plain JSON data (what ``--json-events`` writes, one per line)."""
    return {
        "kind": event.kind.value,
        "step": event.step_id,
        "description": event.description,
        "index": event.index,
        "total": event.total,
        "seconds": None if event.seconds is None else round(event.seconds, 3),
        "error": event.error,
        "detail": event.detail,
        "data": dict(event.data),
        "at": round(time.time(), 3),
    }


class _Writer:
    """Writes to a stream; a closed or broken stream drops what it is told (progress
    never stops the run it reports on)."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream: IO[str] | _Null | None = stream

    def write(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            self.stream = _Null()


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        return None


class LineReporter:
    """One line per step's start and end; progress at most every ``every`` seconds per
    step (``every=0``: each one), and the step's last progress, if it was held back,
    just before its end (the final figures: bytes, rate). ``stream`` defaults to
    standard error."""

    def __init__(self, stream: IO[str] | None = None, *, every: float = 10.0) -> None:
        self._out = _Writer(stream)
        self.every = every
        self._told: dict[str, float] = {}
        self._held: dict[str, Event] = {}

    def __call__(self, event: Event) -> None:
        if event.kind is EventKind.PROGRESS:
            now = time.monotonic()
            last = self._told.get(event.step_id)
            if last is not None and now - last < self.every:
                self._held[event.step_id] = event
                return
            self._told[event.step_id] = now
            self._held.pop(event.step_id, None)
        else:
            held = self._held.pop(event.step_id, None)
            if held is not None:
                self._out.write(f"{held}\n")
        self._out.write(f"{event}\n")


class LiveReporter:
    """For a terminal: every event but progress on a line of its own, and the running
    step's latest progress on a status line rewritten in place (at most ``fps`` times
    a second), erased before the next permanent line."""

    def __init__(self, stream: IO[str] | None = None, *, fps: float = 5.0) -> None:
        self._out = _Writer(stream)
        self._gap = 1.0 / fps if fps > 0 else 0.0
        self._shown = False
        self._last = 0.0
        self._started: dict[str, float] = {}

    def __call__(self, event: Event) -> None:
        if event.kind is EventKind.STARTED:
            self._started[event.step_id] = time.monotonic()
        if event.kind is EventKind.PROGRESS:
            now = time.monotonic()
            if self._shown and now - self._last < self._gap:
                return
            self._last = now
            since = now - self._started.get(event.step_id, now)
            line = f"  [{event.index}/{event.total}] {since:5.0f} s  {event.detail or ''}"
            self._out.write(_ERASE + line[: _width()])
            self._shown = True
            return
        prefix = _ERASE if self._shown else ""
        self._shown = False
        self._out.write(f"{prefix}{event}\n")

    def close(self) -> None:
        """Erase a status line left on the terminal."""
        if self._shown:
            self._out.write(_ERASE)
            self._shown = False


def _width() -> int:
    import shutil  # noqa: PLC0415

    return max(20, shutil.get_terminal_size((100, 20)).columns - 1)


class JsonEventReporter:
    """One JSON object per event and line (:func:`event_json`); ``stream`` defaults to
    standard error."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._out = _Writer(stream)

    def __call__(self, event: Event) -> None:
        self._out.write(json.dumps(event_json(event), default=str) + "\n")


def terminal_reporter(stream: IO[str] | None = None) -> Callable[[Event], None]:
    """:class:`LiveReporter` when ``stream`` (default standard error) is a terminal,
    else :class:`LineReporter`."""
    target = stream if stream is not None else sys.stderr
    try:
        tty = target.isatty()
    except (AttributeError, ValueError):
        tty = False
    return LiveReporter(stream) if tty else LineReporter(stream)


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too old or broken to ask
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


class NotebookReporter:
    """An updating display in a notebook: the plan's steps done out of all, the step
    running and its latest progress, and each step's time once it ends (IPython's
    ``display(..., display_id=True)``, updated in place)."""

    def __init__(self) -> None:
        import importlib  # noqa: PLC0415

        # IPython is the notebook's, not a dependency: looked up when one runs.
        shown: Any = importlib.import_module("IPython.display")
        self._html: Any = shown.HTML
        self._handle: Any = shown.display(shown.HTML("<i>starting…</i>"), display_id=True)
        self._rows: list[str] = []
        self._current = ""
        self._detail = ""
        self._last = 0.0

    def __call__(self, event: Event) -> None:
        e = html.escape
        if event.kind is EventKind.STARTED:
            self._current, self._detail = event.description, ""
        elif event.kind is EventKind.PROGRESS:
            self._detail = event.detail or ""
            now = time.monotonic()
            if now - self._last < 0.2:
                return
            self._last = now
        else:
            took = "" if event.seconds is None else f"{event.seconds:.2f} s"
            error = f" <b>{e(event.error)}</b>" if event.error else ""
            self._rows.append(
                f"<tr><td>{event.index}/{event.total}</td><td>{e(event.kind.value)}</td>"
                f"<td>{e(event.description)}{error}</td><td>{took}</td></tr>"
            )
            self._current, self._detail = "", ""
        running = (
            f"<p>running: {e(self._current)}<br><small>{e(self._detail)}</small></p>"
            if self._current
            else ""
        )
        body = f"{running}<table>{''.join(self._rows[-30:])}</table>"
        if self._handle is not None:
            self._handle.update(self._html(body))


def notebook_reporter() -> NotebookReporter | None:
    """A :class:`NotebookReporter` when this runs in a notebook, else None."""
    if not in_notebook():
        return None
    try:
        return NotebookReporter()
    except ImportError:
        return None
