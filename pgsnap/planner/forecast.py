"""What the next expiry would do to each backup, for listings (pure).

``pgsnap list`` and :meth:`Cluster.backups(policy=...) <pgsnap.cluster.Cluster.backups>`
show, next to each backup, whether the next ``pgsnap expire`` with the
policy removes it and why, or marks it unusable, and until when a secure
snapshot or a pin holds it. The answer is the expiry plan itself
(:func:`~pgsnap.planner.expiry.plan_expiry` on the same facts), read back
per backup: a listing never disagrees with the expiry it announces.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import attrs

from pgsnap.model import BackupRecord, Snapshot
from pgsnap.operations.catalog import DeleteBackupRecord, MarkUnusable
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_expiry

__all__ = ["BackupOutlook", "ExpiryForecast", "expiry_forecast", "retention_notes"]


@attrs.frozen
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


@attrs.frozen
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
