"""Copy retention: which copies off the array to keep, planned as data (pure).

Copies are usually kept longer than snapshots, so they have their own
policy (:class:`CopyRetentionPolicy`, ``[copies.retention]`` in the
configuration), never the snapshots' ``[retention]``. With no policy
nothing is deleted. :func:`plan_copy_expiry` applies one policy to the
copies of one copy target (:class:`CopyExpiryFacts`) and returns a
:class:`~pgsnap.plan.Plan` whose ``kept`` lines say, per copy, why it stays,
and whose steps remove the others, each with its reason.

A copy's time is its backup's (the restore point it holds: when the
backup was consistent), not when the copy was made. What is kept:

- **redundancy N**: the newest N copies in the target;
- **window D**: the newest copy at or before ``now - D`` (the anchor) and
  every newer one; all of them while none is that old;
- **levels**: the newest copy of each of the last ``hourly`` hours,
  ``daily`` days, ``weekly`` ISO weeks, ``monthly`` months and ``yearly``
  years (UTC) — the same selection as the snapshots' retention
  (:func:`~pgsnap.planner.expiry.keep_by_rules`);
- with none of these rules, every copy (a policy of ``max_age`` alone);
- a copy of a **pinned** backup, while the pin holds, whatever else says;
- the **last copy of a backup whose snapshots are gone** (the array lost
  them, or snapshot retention deleted them): the newest copy of it in the
  target is kept when no other copy of that backup would remain (in this
  target or, as the catalog records, another one), whatever the rules say;
- a copy whose manifest is not in the target: its record is kept (with a
  warning: the recovery planner passes it over; a target named wrongly
  must not empty the catalog), and so are copies of backups that are not
  DONE (recovery does not offer them).

**max_age** is the one rule that removes copies the others keep: a copy
whose backup is older than ``max_age`` goes (a pinned backup's aside), even
when it is the last way back to its backup — the plan says so in a warning,
and records whose manifest is gone are forgotten then too. Without
``max_age`` the last copy of a backup whose snapshots are gone is never
removed (a warning says so).

Execution (:mod:`pgsnap.operations.copy_retention`): per copy, oldest first,
its manifest is removed from the target, *then* its record from the
backup (a run cut short leaves a record whose manifest is gone, which the
recovery planner passes over and the resumed run finishes; never a
manifest no record names, which nothing would remove), then one garbage
collection removes the chunks no manifest names (deferred, with a warning in
its outputs, while a copy is in progress on the target).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies.markers import DEFAULT_STALE_AFTER, MIN_STALE_AFTER
from pgsnap.errors import ConfigurationError
from pgsnap.model import BackupRecord, BackupState, CopyRecord
from pgsnap.operations.copy_retention import CollectCopyGarbage, ExpireCopyManifest, ForgetCopy
from pgsnap.plan import Plan, Step
from pgsnap.planner.expiry import _fmt_delta, keep_by_rules
from pgsnap.planner.facts import fingerprint

__all__ = [
    "COPY_LEVELS",
    "CopyExpiryFacts",
    "CopyRetentionPolicy",
    "kept_copies",
    "plan_collect_garbage",
    "plan_copy_expiry",
]

COPY_LEVELS = ("hourly", "daily", "weekly", "monthly", "yearly")
"""The grandfather-father-son levels of a copy retention policy, finest first."""

_UNITS = dict(zip(COPY_LEVELS, ("hour", "day", "week", "month", "year"), strict=True))


def _count(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigurationError(
            f"copy retention {name} must be a whole number, not {value!r}",
            hint=f"e.g. {name} = 12 in [copies.retention]",
        )
    if isinstance(value, int) and value < 0:
        raise ConfigurationError(
            f"copy retention {name} cannot be negative ({value})",
            hint=f"e.g. {name} = 12 in [copies.retention]",
        )


@frozen
class CopyRetentionPolicy:
    """What copy retention keeps (see the module docstring). Combine freely.

    ``redundancy``: the newest N copies (None: no such rule; 0 is refused).
    ``window``: keep every point of the last D restorable from a copy.
    ``hourly``/``daily``/``weekly``/``monthly``/``yearly``: levels (0: unused).
    ``max_age``: copies of backups older than this go, whatever the rules
    keep (a pinned backup's aside); longer than ``window``. The default
    policy keeps everything (:attr:`keeps_everything`).
    """

    redundancy: int | None = None
    window: dt.timedelta | None = None
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    yearly: int = 0
    max_age: dt.timedelta | None = None

    def __attrs_post_init__(self) -> None:
        _count("redundancy", self.redundancy)
        for name in COPY_LEVELS:
            _count(name, getattr(self, name))
        if self.redundancy == 0:
            raise ConfigurationError(
                "copy retention redundancy 0 would delete every copy",
                hint="keep at least one (redundancy = 1 or more), or leave it unset",
            )
        for name in ("window", "max_age"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, dt.timedelta) or value <= dt.timedelta(0)
            ):
                raise ConfigurationError(
                    f"copy retention {name} must be a positive duration, not {value!r}",
                    hint=f'e.g. {name} = "400d" in [copies.retention]',
                )
        if self.window is not None and self.max_age is not None and self.max_age <= self.window:
            raise ConfigurationError(
                f"copy retention max_age ({_fmt_delta(self.max_age)}) must be longer than "
                f"the window ({_fmt_delta(self.window)}): it would delete copies the window "
                "keeps",
                hint="raise max_age or shorten the window",
            )

    @property
    def has_rules(self) -> bool:
        """True when a redundancy, a window or a level says which copies to keep."""
        return (
            self.redundancy is not None
            or self.window is not None
            or any(getattr(self, n) for n in COPY_LEVELS)
        )

    @property
    def keeps_everything(self) -> bool:
        """True for the empty policy (nothing configured): no copy is deleted."""
        return not self.has_rules and self.max_age is None

    def to_request(self) -> dict[str, int | None]:
        """The policy as a plan's ``request`` (plain JSON)."""

        def seconds(d: dt.timedelta | None) -> int | None:
            return None if d is None else int(d.total_seconds())

        return {
            "redundancy": self.redundancy,
            "window_seconds": seconds(self.window),
            **{name: getattr(self, name) for name in COPY_LEVELS},
            "max_age_seconds": seconds(self.max_age),
        }

    @classmethod
    def from_request(cls, request: Mapping[str, object]) -> CopyRetentionPolicy:
        """The policy a plan's ``request`` holds (:meth:`to_request`)."""

        def whole(key: str) -> int | None:
            value = request.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def span(key: str) -> dt.timedelta | None:
            value = whole(key)
            return None if value is None else dt.timedelta(seconds=value)

        return cls(
            redundancy=whole("redundancy"),
            window=span("window_seconds"),
            max_age=span("max_age_seconds"),
            **{name: whole(name) or 0 for name in COPY_LEVELS},
        )

    def describe(self) -> str:
        """The policy in words (for plans and listings)."""
        parts = []
        if self.redundancy is not None:
            parts.append(f"redundancy {self.redundancy}")
        if self.window is not None:
            parts.append(f"window {_fmt_delta(self.window)}")
        levels = [f"{getattr(self, n)} {n}" for n in COPY_LEVELS if getattr(self, n)]
        if levels:
            parts.append("levels " + ", ".join(levels))
        if self.max_age is not None:
            parts.append(f"max age {_fmt_delta(self.max_age)}")
        return "; ".join(parts) or "none (every copy kept)"


@frozen
class CopyExpiryFacts:
    """Everything the copy expiry planner looks at, for one copy target.

    ``target``: the target's location (``s3://...`` or an absolute directory)
    and ``target_options`` its options (no secret). ``manifests``: the copy
    ids whose manifests the target holds now. ``snapshots``: the ids of the
    snapshots the storage has (None: it could not be listed — every backup is
    then taken for one whose snapshots are gone). ``unreadable``: catalog
    entries that cannot be read (their copies are left alone).
    """

    backups: tuple[BackupRecord, ...]
    target: str
    manifests: frozenset[str]
    now: dt.datetime
    snapshots: frozenset[str] | None = None
    target_options: Mapping[str, str] = attrs.field(factory=dict)
    unreadable: tuple[str, ...] = ()

    def snapshots_gone(self, b: BackupRecord) -> bool:
        """True when some snapshot of ``b`` is not on the storage (or it is unknown)."""
        if self.snapshots is None:
            return True
        return not b.snapshots or any(s not in self.snapshots for s in b.snapshots.values())


@frozen
class _Entry:
    backup: BackupRecord
    copy: CopyRecord

    @property
    def when(self) -> dt.datetime:
        return self.backup.stop_time or self.backup.start_time

    def describe(self) -> str:
        return f"copy {self.copy.copy_id} (backup {self.backup.id}, {self.when.isoformat()})"


def _pinned(b: BackupRecord, now: dt.datetime) -> str | None:
    if b.pin is None or not b.pin.holds(now):
        return None
    until = "forever" if b.pin.until is None else f"until {b.pin.until.isoformat()}"
    return f"backup pinned {until}: {b.pin.reason}"


def kept_copies(
    facts: CopyExpiryFacts, policy: CopyRetentionPolicy
) -> tuple[dict[str, list[str]], dict[str, str], list[str]]:
    """Decide every copy of ``facts.target``: ``(kept, gone, warnings)`` with ``kept``
    copy id → why it stays, ``gone`` copy id → why it goes."""
    now = facts.now
    entries = sorted(
        (_Entry(b, c) for b in facts.backups for c in b.copies if c.target == facts.target),
        key=lambda e: (e.when, e.copy.created_at, e.copy.copy_id),
        reverse=True,
    )
    kept: dict[str, list[str]] = {}
    gone: dict[str, str] = {}
    warnings: list[str] = []
    if policy.keeps_everything:
        for e in entries:
            kept[e.copy.copy_id] = ["no copy retention configured: every copy is kept"]
        return kept, gone, warnings

    def old(e: _Entry) -> bool:
        return policy.max_age is not None and now - e.when > policy.max_age

    age_why = "" if policy.max_age is None else f"older than max_age {_fmt_delta(policy.max_age)}"
    counted = [
        e
        for e in entries
        if e.backup.state is BackupState.DONE and e.copy.copy_id in facts.manifests
    ]
    held: dict[str, list[str]] = {}
    if policy.has_rules:
        pairs, notes = keep_by_rules(
            counted,
            lambda e: e.when,
            now=now,
            redundancy=policy.redundancy,
            window=policy.window,
            levels=[(getattr(policy, n), _UNITS[n]) for n in COPY_LEVELS],
            noun="copy",
        )
        warnings += notes
        for e, why in pairs:
            held.setdefault(e.copy.copy_id, []).append(why)
    else:
        for e in counted:
            held[e.copy.copy_id] = [f"no keep rule: kept until {age_why}"]

    for e in entries:
        cid = e.copy.copy_id
        pin = _pinned(e.backup, now)
        if pin is not None:
            kept[cid] = [pin]
        elif cid not in facts.manifests:
            if old(e):
                gone[cid] = f"{age_why}; its manifest is gone from the target already"
            else:
                kept[cid] = [
                    "its manifest is not in the target: its record is kept (recovery passes "
                    "it over)"
                ]
                warnings.append(
                    f"{e.describe()}: its manifest is not in {facts.target}: is the target "
                    "the right one? (pgsnap verify-copy); its record is kept"
                )
        elif e.backup.state is not BackupState.DONE:
            if old(e):
                gone[cid] = f"{age_why}; backup {e.backup.id} is {e.backup.state.value}"
            else:
                kept[cid] = [
                    f"backup {e.backup.id} is {e.backup.state.value}: counted by no rule, "
                    f"kept until {age_why or 'removed by hand'}"
                ]
                warnings.append(
                    f"{e.describe()}: its backup is {e.backup.state.value}, so recovery does "
                    "not offer it"
                )
        elif old(e):
            gone[cid] = age_why + (
                f" (the rules alone would keep it: {'; '.join(held[cid])})" if cid in held else ""
            )
        elif cid in held:
            kept[cid] = held[cid]
        else:
            gone[cid] = _why_not_kept(policy)

    # The last way back: never the only remaining copy of a backup whose snapshots
    # are gone, unless max_age removes it (and then a warning says what is lost).
    for b in facts.backups:
        if b.state is not BackupState.DONE or not facts.snapshots_gone(b):
            continue
        here = [e for e in entries if e.backup.id == b.id and e.copy.copy_id in facts.manifests]
        elsewhere = [c for c in b.copies if c.target != facts.target]
        if elsewhere or not here or any(e.copy.copy_id in kept for e in here):
            continue
        by_rules = [e for e in here if not old(e)]
        if by_rules:
            saved = by_rules[0]  # newest first
            del gone[saved.copy.copy_id]
            kept[saved.copy.copy_id] = [
                f"the last copy of backup {b.id}, whose snapshots are gone: its only way "
                "back is kept"
                + ("" if policy.max_age is not None else " (set max_age to let it go)")
            ]
        else:
            warnings.append(
                f"backup {b.id}: its snapshots are gone and its last copy "
                f"({', '.join(e.copy.copy_id for e in here)}) goes ({age_why}): the backup "
                "can no longer be restored (its record goes with the next pgsnap expire)"
            )
    if policy.max_age is None and any(
        "whose snapshots are gone" in why for whys in kept.values() for why in whys
    ):
        warnings.append(
            "no max_age: the last copy of a backup whose snapshots are gone is never removed "
            "(set [copies.retention] max_age to bound how long copies are kept)"
        )
    if entries and not kept:
        warnings.append(f"every copy in {facts.target} goes")
    return kept, gone, warnings


def _why_not_kept(policy: CopyRetentionPolicy) -> str:
    parts = []
    if policy.redundancy is not None:
        parts.append(f"beyond redundancy {policy.redundancy}")
    if policy.window is not None:
        parts.append(f"older than the anchor of the window {_fmt_delta(policy.window)}")
    if any(getattr(policy, n) for n in COPY_LEVELS):
        parts.append("not the newest of a period the levels keep")
    return "; ".join(parts)


def plan_collect_garbage(
    target: str,
    target_options: Mapping[str, str] | None = None,
    *,
    now: dt.datetime,
    stale_after: dt.timedelta = DEFAULT_STALE_AFTER,
    key_file: str = "",
) -> Plan:
    """The plan of ``pgsnap copy-gc``: one step that removes from ``target`` the chunks
    no manifest names (refused, :class:`~pgsnap.errors.CopyBusy`, while a copy is in
    progress there). A plan so that it runs under the cluster lock, journalled;
    ``now`` (when it was asked for) makes each collection a plan of its own."""
    _check_stale_after(stale_after)
    options = dict(target_options or {}) if target.startswith("s3://") else {}
    step = _gc_step(
        target,
        options,
        stale_after,
        busy_ok=False,
        why="asked for (pgsnap copy-gc)",
        key_file=key_file,
    )
    return Plan(
        kind="copy-gc",
        steps=(step,),
        fingerprint=fingerprint({"target": target}),
        summary={
            "target": target,
            "stale after": _fmt_delta(stale_after),
            "now": now.isoformat(),
        },
        request={
            "target": target,
            "stale_after_seconds": int(stale_after.total_seconds()),
            "requested_at": now.isoformat(),
        },
    )


def _check_stale_after(stale_after: dt.timedelta) -> None:
    if not isinstance(stale_after, dt.timedelta) or stale_after < MIN_STALE_AFTER:
        raise ConfigurationError(
            f"stale_after must be at least {MIN_STALE_AFTER}, not {stale_after!r}",
            hint="a marker is refreshed every minute; a shorter limit would take a slow "
            "copy for a dead one",
        )


def _gc_step(
    target: str,
    options: Mapping[str, str],
    stale_after: dt.timedelta,
    *,
    busy_ok: bool,
    why: str,
    key_file: str = "",
) -> Step:
    return Step.of(
        "collect-garbage",
        CollectCopyGarbage(
            target_dir=target,
            target_options=dict(options),
            stale_after_seconds=int(stale_after.total_seconds()),
            busy_ok=busy_ok,
            key_file=key_file,
        ),
        description=f"remove the chunks no manifest names from {target} (garbage collection)",
        reason=why,
    )


def plan_copy_expiry(
    facts: CopyExpiryFacts,
    policy: CopyRetentionPolicy,
    *,
    stale_after: dt.timedelta = DEFAULT_STALE_AFTER,
    key_file: str = "",
) -> Plan:
    """The plan that applies ``policy`` to the copies in ``facts.target``: for each
    copy that goes (oldest first) its manifest, then its record; then one garbage
    collection (``stale_after`` as :func:`~pgsnap.copies.collect_garbage`). Each
    copy's fate is explained (``kept``/``lost`` and each step's reason)."""
    _check_stale_after(stale_after)
    kept, gone, warnings = kept_copies(facts, policy)
    options = dict(facts.target_options) if facts.target.startswith("s3://") else {}
    entries = sorted(
        (_Entry(b, c) for b in facts.backups for c in b.copies if c.target == facts.target),
        key=lambda e: (e.when, e.copy.created_at, e.copy.copy_id),
    )
    steps: list[Step] = []
    lost: list[str] = []
    for e in entries:
        cid = e.copy.copy_id
        if cid not in gone:
            continue
        why = gone[cid]
        if cid in facts.manifests:
            steps.append(
                Step.of(
                    f"expire-manifest-{cid}",
                    ExpireCopyManifest(
                        backup_id=e.backup.id,
                        copy_id=cid,
                        target_dir=facts.target,
                        manifest_digest=e.copy.manifest_digest,
                        target_options=options,
                        key_file=key_file,
                    ),
                    description=f"remove the manifest of {e.describe()} from {facts.target}",
                    reason=why,
                )
            )
        steps.append(
            Step.of(
                f"forget-copy-{cid}",
                ForgetCopy(backup_id=e.backup.id, copy_id=cid),
                description=f"remove copy {cid} from backup {e.backup.id}'s record",
                reason=why + " (after its manifest: a record whose manifest is gone is "
                "passed over by recovery, a manifest no record names would stay for ever)",
            )
        )
        lost.append(f"{e.describe()} in {facts.target}")
    if any(s.action == ExpireCopyManifest.name for s in steps):
        steps.append(
            _gc_step(
                facts.target,
                options,
                stale_after,
                busy_ok=True,
                why="the chunks only the removed copies named are garbage now (deferred to "
                "the next pgsnap copy-gc while a copy is in progress)",
                key_file=key_file,
            )
        )
    if facts.unreadable:
        warnings.append(
            f"{len(facts.unreadable)} catalog entries cannot be read "
            f"({', '.join(facts.unreadable)}): their copies are left alone"
        )
    parts = {
        "target": facts.target,
        "policy": policy.describe(),
        "gone": sorted(gone),
        "backups": sorted(
            (
                b.id,
                b.state.value,
                str(b.pin),
                sorted((c.copy_id, c.target, c.manifest_digest) for c in b.copies),
                facts.snapshots_gone(b),
            )
            for b in facts.backups
            if b.copies
        ),
        "manifests": sorted(facts.manifests & {c.copy_id for b in facts.backups for c in b.copies}),
        "unreadable": sorted(facts.unreadable),
    }
    return Plan(
        kind="copy-expiry",
        steps=tuple(steps),
        fingerprint=fingerprint(parts),
        summary={
            "policy": policy.describe(),
            "target": facts.target,
            "now": facts.now.isoformat(),
            "copies kept": str(len(kept)),
            "copies deleted": str(len(gone)),
        },
        request={
            **policy.to_request(),
            "target": facts.target,
            "stale_after_seconds": int(stale_after.total_seconds()),
        },
        kept=tuple(
            f"{e.describe()}: {'; '.join(kept[e.copy.copy_id])}"
            for e in reversed(entries)
            if e.copy.copy_id in kept
        ),
        lost=tuple(lost),
        warnings=tuple(warnings),
    )
