"""Reading PostgreSQL's server log for the end of a recovery (pure, no I/O).

The server says how a recovery ended only in its log: whether it stopped at
the target (``recovery stopping ...``), on which timeline it went on
(``selected new timeline ID``), and why it gave up (``FATAL: ...``). These
functions read log *text*; the adapter decides where the text comes from.

Messages are matched in English (``lc_messages`` C or en); the line prefix
(``log_line_prefix``) may be anything, as a severity tag such as
``LOG:  `` follows it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

from pgsnap._attrs import frozen

__all__ = [
    "KNOWN_FATALS",
    "LogSummary",
    "fatal_hint",
    "parse_line",
    "summarize",
]

_SEVERITY_RE = re.compile(
    r"(?:^|\s)(DEBUG[1-5]?|LOG|INFO|NOTICE|WARNING|ERROR|FATAL|PANIC|DETAIL|HINT|CONTEXT|STATEMENT):\s+(.*)$"
)

RELEVANT: Final = (
    "starting point-in-time recovery",
    "starting archive recovery",
    "starting backup recovery",
    "redo starts at",
    "completed backup recovery",
    "consistent recovery state reached",
    "recovery stopping ",
    "redo done at",
    "last completed transaction was at log time",
    "selected new timeline ID",
    "archive recovery complete",
    "pausing at the end of recovery",
    "recovery has paused",
    "shutdown at recovery target",
    "database system is ready to accept",
    "database system is shut down",
)
"""Message starts that make a line part of the recovery report."""

KNOWN_FATALS: Final[tuple[tuple[str, str], ...]] = (
    (
        "recovery ended before configured recovery target was reached",
        "the WAL available to restore_command ends before the target: choose an earlier "
        "target, or archive the missing WAL and start again (the data directory must be "
        "restored again first)",
    ),
    (
        "requested recovery stop point is before consistent recovery point",
        "the target lies before the end of the backup (its consistency point): choose a "
        "backup that ended before the target, or a later target",
    ),
    (
        "is not a child of this server's history",
        "the target timeline forked off before the backup's checkpoint: set "
        "recovery_target_timeline to the backup's timeline ('current'), or restore a "
        "backup taken on the target timeline's history",
    ),
    (
        "does not contain minimum recovery point",
        "the target timeline does not contain the backup's end: choose the backup's "
        "timeline or a backup on the target timeline's history",
    ),
    (
        "recovery target timeline",
        "no history file for that timeline in the archive: check the timeline number and "
        "that restore_command can fetch NNNNNNNN.history files",
    ),
    (
        "could not locate required checkpoint record",
        "the checkpoint named in backup_label is neither in pg_wal nor fetched by "
        "restore_command: check restore_command and that the WAL from the backup's start "
        "is archived; never delete backup_label to 'fix' this (it corrupts the restore)",
    ),
    (
        "WAL ends before end of online backup",
        "WAL between the backup's start and stop is missing: the backup cannot become "
        "consistent; check that every segment up to the backup's stop LSN is archived",
    ),
    (
        "multiple recovery targets specified",
        "more than one recovery_target* is set: remove stale targets from "
        "postgresql.conf, its include files and postgresql.auto.conf",
    ),
    (
        "must specify restore_command when standby mode is not enabled",
        "set restore_command (write_recovery_settings does)",
    ),
    (
        'using recovery command file "recovery.conf" is not supported',
        "PostgreSQL 12+ does not read recovery.conf: move its settings into "
        "postgresql.auto.conf and delete it",
    ),
    (
        "this is an incremental backup, not a data directory",
        "the backup_label describes an incremental backup: combine it with pg_combinebackup first",
    ),
    (
        "hot standby is not possible because of insufficient parameter settings",
        "max_connections, max_worker_processes, max_wal_senders, max_prepared_transactions "
        "and max_locks_per_transaction must be at least the values of the backed-up server",
    ),
    (
        "configuration file",
        "the server's configuration has an error: see the lines before it in the log",
    ),
)
"""(message fragment, advice) for FATAL lines that end a recovery."""


def fatal_hint(message: str) -> str | None:
    """Advice for a known FATAL recovery message, or None."""
    for fragment, hint in KNOWN_FATALS:
        if fragment in message:
            return hint
    return None


def parse_line(line: str) -> tuple[str, str] | None:
    """(severity, message) of one log line, or None when it has no severity tag."""
    m = _SEVERITY_RE.search(line)
    if m is None:
        return None
    return m.group(1), m.group(2).strip()


@frozen
class LogSummary:
    """What the log says about a recovery.

    ``fatal`` holds each FATAL/PANIC line that ends recovery, with the DETAIL
    and HINT lines that follow it; ``known_fatal`` is True when at least one
    of them is a known recovery failure (:data:`KNOWN_FATALS`).
    """

    relevant: tuple[str, ...] = ()
    stop_line: str | None = None
    has_target: bool | None = None
    """True: 'starting point-in-time recovery'; False: 'starting archive recovery'."""
    new_timeline: int | None = None
    redo_done_lsn: str | None = None
    stopped_lsn: str | None = None
    archive_recovery_complete: bool = False
    shutdown_at_target: bool = False
    shut_down: bool = False
    paused_at_end: bool = False
    start_timeline: int | None = None
    fatal: tuple[str, ...] = ()
    known_fatal: bool = False
    hints: tuple[str, ...] = ()
    last_transaction: str | None = None
    """The last transaction replayed: from ``recovery stopping ... transaction N,
    time T`` (``transaction N, time T``), else from ``last completed transaction
    was at log time T`` (``at T``)."""
    ready: bool = False
    """The server said it is ready to accept (read-write) connections."""

    @property
    def ended(self) -> bool:
        """True when the log shows the recovery over: promoted (archive recovery
        complete, ready for read-write connections) or shut down at its target."""
        return self.shutdown_at_target or (self.ready and self.archive_recovery_complete)


_NEW_TLI_RE = re.compile(r"selected new timeline ID: (\d+)")
_REDO_DONE_RE = re.compile(r"redo done at ([0-9A-Fa-f]+/[0-9A-Fa-f]+)")
_STOP_LSN_RE = re.compile(r'WAL location \(LSN\) "([0-9A-Fa-f]+/[0-9A-Fa-f]+)"')
_STOP_XACT_RE = re.compile(r"(transaction \d+, time .+)$")
_LAST_XACT_RE = re.compile(r"last completed transaction was at log time (.+)$")
_START_TLI_RE = re.compile(r"on timeline ID (\d+)|redo starts at .* on timeline (\d+)")

# FATAL lines our own polling causes (or a normal stop): never a recovery failure.
_BENIGN_FATALS: Final = (
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "the database system is not accepting connections",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "terminating connection due to administrator command",
    "terminating connection due to unexpected postmaster exit",
    "role ",
    "database ",
    "password authentication failed",
    "no pg_hba.conf entry",
    "canceling authentication due to timeout",
)


def _is_benign(message: str) -> bool:
    return any(message.startswith(b) for b in _BENIGN_FATALS)


def summarize(lines: Iterable[str]) -> LogSummary:
    """Summarize log lines written since the server was started."""
    relevant: list[str] = []
    stop_line = None
    has_target: bool | None = None
    new_tli = None
    redo_done = None
    stopped_lsn = None
    complete = shutdown_at_target = shut_down = paused = False
    start_tli = None
    last_xact: str | None = None
    ready = False
    fatal: list[str] = []
    hints: list[str] = []
    known = False
    in_fatal = False
    for raw in lines:
        line = raw.rstrip("\r\n")
        parsed = parse_line(line)
        if parsed is None:
            continue
        severity, message = parsed
        if severity in ("DETAIL", "HINT") and in_fatal:
            fatal.append(line)
            continue
        in_fatal = False
        if severity in ("FATAL", "PANIC"):
            if _is_benign(message):
                continue
            in_fatal = True
            fatal.append(line)
            hint = fatal_hint(message)
            if hint is not None:
                known = True
                if hint not in hints:
                    hints.append(hint)
            relevant.append(line)
            continue
        if severity != "LOG" or not message.startswith(RELEVANT):
            continue
        relevant.append(line)
        if message.startswith("starting point-in-time recovery"):
            has_target = True
        elif message.startswith("starting archive recovery") and has_target is None:
            has_target = False
        elif message.startswith("recovery stopping "):
            stop_line = line
            m = _STOP_LSN_RE.search(message)
            stopped_lsn = m.group(1) if m else None
            x = _STOP_XACT_RE.search(message)
            if x:
                last_xact = x.group(1)
        elif message.startswith("last completed transaction was at log time"):
            x = _LAST_XACT_RE.search(message)
            if x and last_xact is None:
                last_xact = f"at {x.group(1)}"
        elif message.startswith("database system is ready to accept connections"):
            ready = True
        elif message.startswith("selected new timeline ID"):
            m = _NEW_TLI_RE.search(message)
            new_tli = int(m.group(1)) if m else None
        elif message.startswith("redo done at"):
            m = _REDO_DONE_RE.search(message)
            redo_done = m.group(1) if m else None
        elif message.startswith("archive recovery complete"):
            complete = True
        elif message.startswith("shutdown at recovery target"):
            shutdown_at_target = True
        elif message.startswith("database system is shut down"):
            shut_down = True
        elif message.startswith(("pausing at the end of recovery", "recovery has paused")):
            paused = True
        elif message.startswith("starting backup recovery"):
            m = _START_TLI_RE.search(message)
            if m:
                start_tli = int(m.group(1) or m.group(2))
    return LogSummary(
        relevant=tuple(relevant),
        stop_line=stop_line,
        has_target=has_target,
        new_timeline=new_tli,
        redo_done_lsn=redo_done,
        stopped_lsn=stopped_lsn,
        archive_recovery_complete=complete,
        shutdown_at_target=shutdown_at_target,
        shut_down=shut_down,
        paused_at_end=paused,
        start_timeline=start_tli,
        fatal=tuple(fatal),
        known_fatal=known,
        hints=tuple(hints),
        last_transaction=last_xact,
        ready=ready,
    )


def tail(lines: Sequence[str], count: int = 20) -> tuple[str, ...]:
    """The last ``count`` lines, without line ends."""
    return tuple(line.rstrip("\r\n") for line in lines[-count:])
