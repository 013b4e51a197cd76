"""What the next expiry would do to each backup, for listings (pure).

``pgsnap list`` and :meth:`Cluster.backups(policy=...) <pgsnap.cluster.Cluster.backups>`
show, next to each backup, whether the next ``pgsnap expire`` with the
policy removes it and why, or marks it unusable, and until when a secure
snapshot or a pin holds it. The answer is the expiry plan itself
(:func:`~pgsnap.planner.expiry.plan_expiry` on the same facts), read back
per backup: a listing never disagrees with the expiry it announces.

:class:`BackupList` is what such a listing returns. Without a policy nothing
here needs the expiry planner, which is imported only to forecast: ``pgsnap
list`` shows a catalog without importing the planners.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pgsnap._attrs import frozen
from pgsnap.model import BackupRecord, DrillRecord, Snapshot

if TYPE_CHECKING:
    from pgsnap.catalog import UnreadableEntry
    from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy

__all__ = ["BackupList", "BackupOutlook", "ExpiryForecast", "expiry_forecast", "retention_notes"]


@frozen
class BackupOutlook:
    """What the next expiry does to one backup.

    ``removed``: the next expiry deletes it (its snapshots and record);
    ``reasons``: why it goes (when ``removed``) or why it stays;
    ``marked_unusable``: why the next expiry records it FAILED (its snapshots
    vanished), None otherwise; ``secure``: a secure snapshot of it still
    holds, until ``secure_until`` (None: no expiry known).
    """

    backup_id: str
    removed: bool
    reasons: tuple[str, ...] = ()
    marked_unusable: str | None = None
    secure: bool = False
    secure_until: dt.datetime | None = None


@frozen
class ExpiryForecast:
    """What the next expiry with ``policy`` (described) does, backup by backup.

    ``now`` is the time it was judged at; ``backups`` maps each backup id to
    its :class:`BackupOutlook`; ``warnings`` are the policy's (a window not
    yet covered...).
    """

    policy: str
    now: dt.datetime
    backups: Mapping[str, BackupOutlook]
    warnings: tuple[str, ...] = ()

    @property
    def removed(self) -> tuple[str, ...]:
        """The ids of the backups the next expiry removes, in listing order."""
        return tuple(bid for bid, o in self.backups.items() if o.removed)


def _secure(
    record: BackupRecord, snapshots: Mapping[str, Snapshot]
) -> tuple[bool, dt.datetime | None]:
    holds, latest = False, None
    for snap_id in record.snapshots.values():
        snap = snapshots.get(snap_id)
        if snap is None or not snap.secure:
            continue
        holds = True
        text = snap.extra.get("secure_until")
        try:
            until = dt.datetime.fromisoformat(text) if text else None
        except ValueError:
            until = None
        if until is not None and until.tzinfo is not None:
            latest = until if latest is None else max(latest, until)
    return holds, latest


def expiry_forecast(facts: ExpiryFacts, policy: RetentionPolicy) -> ExpiryForecast:
    """What :func:`~pgsnap.planner.expiry.plan_expiry` with ``policy`` would do to
    each backup of ``facts`` (pure: the plan is made and read, nothing runs)."""
    from pgsnap.operations.catalog import DeleteBackupRecord, MarkUnusable  # noqa: PLC0415
    from pgsnap.planner.expiry import plan_expiry  # noqa: PLC0415 - only to forecast

    plan = plan_expiry(facts, policy)
    removed: dict[str, str] = {}
    unusable: dict[str, str] = {}
    for step in plan.steps:
        bid = step.params.get("backup_id")
        if not isinstance(bid, str):
            continue
        if step.action == DeleteBackupRecord.name:
            removed[bid] = step.reason
        elif step.action == MarkUnusable.name:
            reason = step.params.get("reason")
            unusable[bid] = reason if isinstance(reason, str) else step.reason
    outlooks: dict[str, BackupOutlook] = {}
    snapshots = {s.id: s for s in facts.snapshots}
    kept_why: dict[str, str] = {}
    for line in plan.kept:  # "backup <id>: <reasons>"; ids never hold ": "
        bid, sep, why = line.removeprefix("backup ").partition(": ")
        if sep:
            kept_why[bid] = why
    for record in facts.backups:
        bid = record.id
        if bid in removed:
            reasons: tuple[str, ...] = tuple(r for r in removed[bid].split("; ") if r)
        else:
            reasons = tuple(r for r in kept_why.get(bid, "").split("; ") if r)
        secure, until = _secure(record, snapshots)
        outlooks[bid] = BackupOutlook(
            backup_id=bid,
            removed=bid in removed,
            reasons=reasons,
            marked_unusable=unusable.get(bid),
            secure=secure,
            secure_until=until,
        )
    return ExpiryForecast(
        policy=policy.describe(),
        now=facts.now,
        backups=outlooks,
        warnings=plan.warnings,
    )


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat(timespec="seconds")


def retention_notes(
    record: BackupRecord, outlook: BackupOutlook | None, now: dt.datetime
) -> tuple[str, ...]:
    """Short notes on what keeps or removes ``record``, for listings.

    ``pinned forever: <reason>`` / ``pinned until <time>: <reason>`` (``pin
    expired <time>: <reason>`` once it no longer holds), ``secure until
    <time>``, and with an ``outlook``: ``next expire removes it: <why>`` or
    ``next expire marks it unusable: <why>``.
    """
    notes: list[str] = []
    pin = record.pin
    if pin is not None:
        if pin.until is None:
            notes.append(f"pinned forever: {pin.reason}")
        elif pin.holds(now):
            notes.append(f"pinned until {_iso(pin.until)}: {pin.reason}")
        else:
            notes.append(f"pin expired {_iso(pin.until)}: {pin.reason}")
    if outlook is None:
        return tuple(notes)
    if outlook.secure:
        until = "no expiry known" if outlook.secure_until is None else _iso(outlook.secure_until)
        notes.append(f"secure until {until}" if outlook.secure_until else f"secure ({until})")
    if outlook.marked_unusable is not None:
        notes.append(f"next expire marks it unusable: {outlook.marked_unusable}")
    if outlook.removed:
        notes.append(f"next expire removes it: {'; '.join(outlook.reasons) or 'not kept'}")
    return tuple(notes)


class BackupList(tuple[BackupRecord, ...]):
    """Backup records, oldest first: a plain tuple that displays as a table.

    ``unreadable`` are the catalog entries that could not be read (each with
    its path and the error); they are not in the tuple. ``forecast`` is what
    the next expiry with a retention policy does to each backup
    (:class:`~pgsnap.planner.forecast.ExpiryForecast`; None: no policy was
    given); ``now`` the time the list was made (pins are judged at it).
    """

    unreadable: tuple[UnreadableEntry, ...]
    forecast: ExpiryForecast | None
    now: dt.datetime
    last_drill: dict[str, DrillRecord]
    """The newest drill of each backup that was drilled (by backup id)."""

    def __new__(
        cls,
        records: Iterable[BackupRecord] = (),
        unreadable: Iterable[UnreadableEntry] = (),
        *,
        forecast: ExpiryForecast | None = None,
        now: dt.datetime | None = None,
        drills: Iterable[DrillRecord] = (),
    ) -> BackupList:
        obj = super().__new__(cls, records)
        obj.unreadable = tuple(unreadable)
        obj.forecast = forecast
        obj.last_drill = {d.backup_id: d for d in sorted(drills, key=lambda d: d.started_at)}
        obj.now = now or (forecast.now if forecast else dt.datetime.now(dt.UTC))
        return obj

    def notes(self, record: BackupRecord) -> tuple[str, ...]:
        """What keeps or removes ``record``: its pin, a secure snapshot's expiry and,
        with a ``forecast``, what the next expiry does to it
        (:func:`~pgsnap.planner.forecast.retention_notes`)."""
        outlook = None if self.forecast is None else self.forecast.backups.get(record.id)
        notes = retention_notes(record, outlook, self.now)
        drill = self.last_drill.get(record.id)
        if drill is not None:
            when = drill.started_at.isoformat(timespec="seconds")
            notes += (
                f"proven restorable {when} (drill {drill.id})"
                if drill.ok
                else f"last drill FAILED {when} (drill {drill.id})",
            )
        return notes

    def rows(self) -> list[tuple[str, ...]]:
        """One row of text per backup: id, state, timeline, start, stop, time, label,
        retention (:meth:`notes`, ``-`` when none)."""
        return [
            (
                b.id,
                b.state.value + (f" ({b.failure_reason})" if b.failure_reason else ""),
                str(b.start_timeline),
                str(b.start_lsn),
                str(b.stop_lsn or "-"),
                b.stop_time.isoformat(timespec="seconds") if b.stop_time else "-",
                b.label,
                "; ".join(self.notes(b)) or "-",
            )
            for b in self
        ]

    def __repr__(self) -> str:
        more = f", {len(self.unreadable)} unreadable" if self.unreadable else ""
        if self.forecast is not None:
            more += f", next expire removes {len(self.forecast.removed)}"
        return f"<BackupList {len(self)} backups{more}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        lines = ["  ".join(r) for r in self.rows()]
        lines += [f"UNREADABLE {u}" for u in self.unreadable]
        p.text("\n".join(lines) or "no backups")

    def _repr_html_(self) -> str:
        head = (
            "id",
            "state",
            "timeline",
            "start LSN",
            "stop LSN",
            "consistent at",
            "label",
            "retention",
        )
        e = html.escape
        body = "".join(
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in self.rows()
        )
        body += "".join(
            f'<tr><td colspan="{len(head)}">unreadable: {e(str(u))}</td></tr>'
            for u in self.unreadable
        )
        return "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{body}</table>"
