"""Read commit times and restore points out of archived WAL with ``pg_waldump``.

This is observation (I/O): the result, a
:class:`~pgsnap.planner.facts.WalEvents`, is a fact the pure recovery planner
uses to state the recoverable window as times as well as LSNs ("recovery can
be done up to time ...") and to refuse a time target after the last commit,
or a restore point that is not in the WAL.

``pg_waldump`` must be of the server's major version (the WAL format
changes); :func:`find_waldump` looks next to the server binaries.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pgsnap.model import LSN
from pgsnap.wal.events import WalEvents
from pgsnap.wal.timelines import TimelineSpan

__all__ = ["find_waldump", "parse_waldump", "scan_wal"]

log = logging.getLogger(__name__)

_COMMIT_RE = re.compile(
    r"tx:\s+(\d+), lsn: ([0-9A-F]+/[0-9A-F]+),.*desc: COMMIT "
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) (UTC|GMT|[+-]\d\d(?::?\d\d)?)"
)
_RESTORE_RE = re.compile(r"lsn: ([0-9A-F]+/[0-9A-F]+),.*desc: RESTORE_POINT (.*)$")


def find_waldump(
    bindir: str | os.PathLike[str] | None = None, *, major: int | None = None
) -> Path | None:
    """``pg_waldump`` in ``bindir``; without one, for ``major`` in the usual places; None if absent.

    With ``bindir`` only that directory is looked at. Otherwise, for a
    ``major``, the Debian (``/usr/lib/postgresql/<major>/bin``) and RHEL
    (``/usr/pgsql-<major>/bin``) locations, then ``PATH`` (the caller checks the
    version of what is found there).
    """
    if bindir is not None:
        cand = Path(bindir) / "pg_waldump"
        return cand if cand.exists() else None
    if major is not None:
        for directory in (f"/usr/lib/postgresql/{major}/bin", f"/usr/pgsql-{major}/bin"):
            cand = Path(directory) / "pg_waldump"
            if cand.exists():
                return cand
    found = shutil.which("pg_waldump")
    return Path(found) if found else None


def _parse_time(text: str, zone: str) -> dt.datetime:
    base = dt.datetime.fromisoformat(text)
    if zone in ("UTC", "GMT"):
        return base.replace(tzinfo=dt.UTC)
    sign = 1 if zone[0] == "+" else -1
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
    return base.replace(tzinfo=dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes)))


def parse_waldump(
    output: str,
) -> tuple[list[tuple[LSN, dt.datetime, int]], list[tuple[LSN, str]]]:
    """Commits ``(lsn, time, xid)`` and restore points ``(lsn, name)`` from pg_waldump text."""
    commits: list[tuple[LSN, dt.datetime, int]] = []
    points: list[tuple[LSN, str]] = []
    for line in output.splitlines():
        if "desc: COMMIT" in line:
            m = _COMMIT_RE.search(line)
            if m:
                commits.append(
                    (LSN.parse(m.group(2)), _parse_time(m.group(3), m.group(4)), int(m.group(1)))
                )
        elif "RESTORE_POINT" in line:
            r = _RESTORE_RE.search(line)
            if r:
                points.append((LSN.parse(r.group(1)), r.group(2).strip()))
    return commits, points


def scan_wal(
    waldump: Path,
    wal_dirs: Sequence[str | os.PathLike[str]],
    spans: Sequence[TimelineSpan],
    start: LSN,
    end: LSN,
    *,
    timeout: float = 120.0,
) -> WalEvents:
    """Scan the WAL from ``start`` to ``end`` along ``spans`` (a timeline path).

    ``wal_dirs`` are directories holding plain (uncompressed) segments; when a
    segment is in several, the first directory wins (the archive, then a
    surviving pg_wal), as PostgreSQL's recovery prefers ``restore_command``.
    They are merged into one temporary directory of links, and ``--end`` is
    bounded by the segments present, so ``pg_waldump`` never waits for a
    missing file (it retries a missing segment for 5 seconds). The part of a
    timeline before its switchpoint that lives in the next timeline's first
    segment (or in a ``.partial`` file) is found there too. Segments
    ``pg_waldump`` cannot read end the scan early; the result says how far it
    got (``scanned_to``), whether it covered the whole range (``complete``) and,
    when it stopped at an invalid record, where the valid WAL ends
    (``end_of_wal``): the point where PostgreSQL's replay ends too.
    """
    commits: list[tuple[LSN, dt.datetime, int]] = []
    points: list[tuple[LSN, str]] = []
    scanned_to = start
    complete = True
    end_of_wal: LSN | None = None
    env = {**os.environ, "TZ": "UTC", "LC_ALL": "C"}
    files = _segment_files(wal_dirs)
    seg = _segment_size_of(files)
    with tempfile.TemporaryDirectory(prefix="pgsnap-waldump-") as tmp:
        for i, span in enumerate(spans):
            lo = max(start, span.start) if span.start is not None else start
            hi = min(end, span.end) if span.end is not None else end
            if hi <= lo:
                continue
            if seg is None:
                complete = False
                break
            nxt = spans[i + 1].timeline if i + 1 < len(spans) else None
            view = Path(tmp) / f"tli-{span.timeline}"
            view.mkdir()
            present_end = _link_span(files, view, span.timeline, nxt, lo, hi, seg)
            if present_end <= lo:
                complete = False
                break
            bounded = min(hi, present_end)
            argv = [
                str(waldump),
                "--path",
                str(view),
                "--timeline",
                str(span.timeline),
                "--start",
                str(lo),
                "--end",
                str(bounded),
            ]
            try:
                proc = subprocess.run(
                    argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("pg_waldump failed: %s", exc)
                complete = False
                break
            c, p = parse_waldump(proc.stdout)
            commits += c
            points += p
            if proc.returncode == 0:
                scanned_to = bounded
                if bounded < hi:  # the next segment is missing
                    complete = False
                    break
                continue
            log.debug(
                "pg_waldump stopped early (%s): %s", proc.returncode, proc.stderr.strip()[:300]
            )
            last = _last_lsn(proc.stdout)
            if last is not None and last > scanned_to:
                scanned_to = last
            stop = _end_of_valid_wal(proc.stderr, seg)
            if stop is not None and stop >= scanned_to:
                # An invalid record: the end of the WAL, where replay ends too.
                end_of_wal = stop
                scanned_to = stop
            complete = False
            break
    commits.sort(key=lambda c: c[0])
    points.sort(key=lambda p: p[0])
    return WalEvents(
        commits=tuple(dict.fromkeys(commits)),
        restore_points=tuple(dict.fromkeys(points)),
        scanned_from=start,
        scanned_to=scanned_to,
        complete=complete or end_of_wal is not None,
        end_of_wal=end_of_wal,
    )


_SEGMENT_RE = re.compile(r"^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})(\.partial)?$")


def _segment_files(
    wal_dirs: Sequence[str | os.PathLike[str]],
) -> dict[tuple[int, int, int, bool], str]:
    """``{(timeline, log id, seg, partial): path}`` of plain segments; first directory wins."""
    found: dict[tuple[int, int, int, bool], str] = {}
    for d in wal_dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            m = _SEGMENT_RE.match(e.name)
            if m is None:
                continue
            try:
                if not e.is_file():
                    continue
            except OSError:
                continue
            key = (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), bool(m.group(4)))
            found.setdefault(key, e.path)
    return found


def _segment_size_of(files: dict[tuple[int, int, int, bool], str]) -> int | None:
    """The segment size: the size of a complete (non-partial) segment file."""
    for key, path in files.items():
        if key[3]:
            continue
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if size >= 1024 * 1024 and size & (size - 1) == 0:
            return size
    return None


def _link_span(
    files: dict[tuple[int, int, int, bool], str],
    view: Path,
    tli: int,
    next_tli: int | None,
    lo: LSN,
    hi: LSN,
    seg: int,
) -> LSN:
    """Link the segments of ``tli`` covering ``lo``..``hi`` into ``view``; return where they end.

    The segment holding the switchpoint ``hi`` may be missing on ``tli`` (the
    server archived it as ``.partial``, or not at all): its bytes before ``hi``
    are also at the start of ``next_tli``'s segment of the same number.
    """
    per_id = 0x100000000 // seg
    first = lo.value // seg
    last = (hi.value - 1) // seg
    segno = first
    while segno <= last:
        log_id, low = divmod(segno, per_id)
        path = files.get((tli, log_id, low, False))
        if path is None and segno == last and next_tli is not None:
            path = files.get((tli, log_id, low, True)) or files.get((next_tli, log_id, low, False))
        if path is None:
            break
        os.symlink(path, view / f"{tli:08X}{log_id:08X}{low:08X}")
        segno += 1
    return LSN(segno * seg)


_RECORD_ERROR_RE = re.compile(
    r"error in WAL record at ([0-9A-F]+/[0-9A-F]+): .*?\bat ([0-9A-F]+/[0-9A-F]+)"
)
_PAGE_ERROR_RE = re.compile(r"segment ([0-9A-F]{24}),(?: LSN [0-9A-F]+/[0-9A-F]+,)? offset (\d+)")
_LAST_RECORD_RE = re.compile(r"error in WAL record at ([0-9A-F]+/[0-9A-F]+)")


def _end_of_valid_wal(stderr: str, seg: int) -> LSN | None:
    """Where pg_waldump found the first invalid record (None: it stopped for another reason)."""
    if "could not find file" in stderr or "could not open" in stderr:
        return None
    m = _RECORD_ERROR_RE.search(stderr)
    if m:
        return LSN.parse(m.group(2))
    p = _PAGE_ERROR_RE.search(stderr)
    if p:
        name = p.group(1)
        per_id = 0x100000000 // seg
        segno = int(name[8:16], 16) * per_id + int(name[16:], 16)
        return LSN(segno * seg + int(p.group(2)))
    r = _LAST_RECORD_RE.search(stderr)
    return LSN.parse(r.group(1)) if r else None


_LSN_FIELD_RE = re.compile(r"lsn: ([0-9A-F]+/[0-9A-F]+)")


def _last_lsn(output: str) -> LSN | None:
    for line in reversed(output.splitlines()):
        m = _LSN_FIELD_RE.search(line)
        if m:
            return LSN.parse(m.group(1))
    return None
