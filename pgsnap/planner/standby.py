"""The standby planner (pure): a new streaming standby seeded from a backup's snapshots.

``plan_seed_standby(facts, request, primary, primary_oldest_wal)`` returns the plan
that makes writable copies of a backup's snapshots (the clone machinery), starts
them as a standby of ``primary`` with a replication slot made on the primary first,
and waits until it streams and has caught up; or raises
:class:`~pgsnap.errors.PlanningError` saying why it cannot succeed and what to do
instead, before anything is touched.

What is checked first (CloudNativePG's failure modes become refusals):

- the primary is a primary of the backup's cluster (same system identifier);
- the backup lies on the history of the primary's current timeline (a backup of a
  timeline the primary forked away from never catches up);
- the archive and the primary's ``pg_wal`` together hold every segment from the
  backup's start to the primary's position: the archive reaches the oldest segment
  the primary still keeps (a standby built from a backup whose WAL is gone never
  attaches);
- the backup's snapshots are there (not only a copy: a standby is made from
  snapshots), and the storage can clone them.
"""

from __future__ import annotations

import hashlib
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import (
    LSN,
    CloneRecord,
    RecoveryAction,
    RecoveryTarget,
    ServerFacts,
    VolumeRole,
    to_dict,
)
from pgsnap.operations.clone import CLONE_NAME_RE, MarkCloneReady, StartClone, StopClone
from pgsnap.operations.standby import (
    SLOT_NAME_RE,
    ConfigureStandby,
    CreateSlot,
    DropSlot,
    WaitStandby,
)
from pgsnap.plan import Plan, Step
from pgsnap.planner.clone import _made, plan_clone_destroy
from pgsnap.planner.facts import RecoveryFacts
from pgsnap.planner.recovery import RecoveryRequest, resolve_recovery
from pgsnap.wal.names import parse_segment_name

__all__ = [
    "StandbyRequest",
    "default_slot",
    "plan_seed_standby",
    "plan_standby_destroy",
]

_PASSWORD_WORDS: Final = ("password", "passwd")


def default_slot(name: str) -> str:
    """The replication slot of standby ``name``: ``pgsnap_<name>`` (dashes become
    underscores, as slot names allow)."""
    return "pgsnap_" + name.replace("-", "_")


def _check_name(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str) or not CLONE_NAME_RE.match(value):
        raise ConfigurationError(
            f"invalid standby name {value!r}",
            hint="1 to 20 lower-case letters, digits and dashes, starting with a letter or "
            "digit (e.g. 'replica-2')",
        )


def _check_slot(_inst: object, _attr: object, value: str) -> None:
    if value and not SLOT_NAME_RE.match(value):
        raise ConfigurationError(
            f"invalid replication slot name {value!r}",
            hint="lower-case letters, digits and underscores, at most 63",
        )


def _check_conninfo(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            "a standby needs primary_conninfo: how it connects to the primary",
            hint="e.g. 'host=db1 port=5432 user=replicator' (the standby's OS user keeps "
            "the password in its ~/.pgpass)",
        )
    if any(word in value.lower() for word in _PASSWORD_WORDS):
        raise ConfigurationError(
            "primary_conninfo must not hold a password: it would be written into plans, "
            "the catalog and the standby's postgresql.auto.conf",
            hint="put the password in the standby OS user's ~/.pgpass (or name a passfile= "
            "in the conninfo)",
        )


def _check_port(_inst: object, _attr: object, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1024 <= value <= 65535:
        raise ConfigurationError(
            f"invalid standby port {value!r}", hint="give a port from 1024 to 65535"
        )


@frozen
class StandbyRequest:
    """What standby to seed, where.

    - ``name``: the standby's name (it names its volumes, its catalog record and, by
      default, its replication slot ``pgsnap_<name>``);
    - ``port``, ``at``, ``host``, ``listen_addresses``: where it runs, as for a clone;
    - ``primary_conninfo``: how the standby connects to the primary (no password);
    - ``slot``: its physical replication slot on the primary (default from the name);
    - ``backup_id``: the backup to seed from (default: the newest that qualifies);
    - ``server_timeout`` and ``catch_up_timeout``: how long its server may take to
      start, and to stream and catch up.
    """

    name: str = attrs.field(validator=_check_name)
    port: int = attrs.field(validator=_check_port)
    primary_conninfo: str = attrs.field(validator=_check_conninfo)
    slot: str = attrs.field(default="", validator=_check_slot)
    backup_id: str | None = None
    at: str | None = None
    host: str = ""
    listen_addresses: str = ""
    server_timeout: float = 120.0
    catch_up_timeout: float = 600.0

    @property
    def slot_name(self) -> str:
        """The slot: ``slot``, or :func:`default_slot` of the name."""
        return self.slot or default_slot(self.name)

    def recovery_request(self, timeline: int) -> RecoveryRequest:
        """The recovery request that chooses the backup and checks the WAL: everything
        archived on the primary's ``timeline``."""
        return RecoveryRequest(
            target=RecoveryTarget.latest(),
            timeline=str(timeline),
            lost=frozenset({VolumeRole.DATA, VolumeRole.WAL}),
            backup_id=self.backup_id,
            safety_snapshot=False,
            server_timeout=self.server_timeout,
        )


def _segment_start(name: str, segment_size: int) -> LSN:
    _timeline, segno = parse_segment_name(name, segment_size)
    return LSN(segno * segment_size)


def plan_seed_standby(
    facts: RecoveryFacts,
    request: StandbyRequest,
    primary: ServerFacts,
    primary_oldest_wal: str | None = None,
) -> Plan:
    """The plan that seeds standby ``request`` of ``primary`` from a backup, or a
    PlanningError saying why it cannot succeed (see the module docstring).

    ``primary_oldest_wal``: the oldest segment in the primary's ``pg_wal`` (None when
    it cannot be listed: the archive must then reach the primary's current segment).
    """
    if primary.in_recovery or primary.current_lsn is None:
        raise PlanningError(
            "the server to follow is in recovery: a standby is seeded for a primary",
            hint="run it with the primary's configuration, or configure [primary] to reach it",
        )
    tli = primary.timeline
    resolved = resolve_recovery(facts, request.recovery_request(tli))
    backup = resolved.backup
    if backup.system_identifier != primary.system_identifier:
        raise PlanningError(
            f"backup {backup.id} is of another cluster (system identifier "
            f"{backup.system_identifier}; the primary is {primary.system_identifier})",
            hint="seed the standby from a backup of the primary's cluster",
            backup_id=backup.id,
        )
    seg = backup.wal_segment_size
    current_start = LSN(primary.current_lsn.value - primary.current_lsn.value % seg)
    if primary_oldest_wal is not None:
        kept_from = min(_segment_start(primary_oldest_wal, seg), current_start)
        where = f"the primary keeps WAL from {primary_oldest_wal} in its pg_wal"
    else:
        kept_from = current_start
        where = "the primary's pg_wal could not be listed, so only its current segment counts"
    reached = resolved.wal.reachable_lsn
    if reached < kept_from:
        raise PlanningError(
            f"from backup {backup.id} the archive reaches {reached} on timeline {tli}, but "
            f"{where} (from {kept_from}): the WAL between is in neither, and the standby "
            "would never catch up",
            hint="take a new backup and seed from it, or find the missing segments "
            "(pgsnap wal shows the archive's gaps)",
            backup_id=backup.id,
            reached=str(reached),
        )
    slot = request.slot_name
    made = _made(
        facts,
        resolved,
        name=request.name,
        port=request.port,
        at=request.at,
        host=request.host,
        target=RecoveryTarget.latest(),
        action=RecoveryAction.PAUSE,
        purpose="standby",
        slot=slot,
    )
    server = made.server
    steps = [
        *made.steps,
        Step.of(
            "create-slot",
            CreateSlot(slot=slot),
            description=f"create the physical replication slot {slot} on the primary",
            reason="made before the standby starts, it keeps on the primary every segment "
            "the standby has not received",
            undo=DropSlot(slot=slot),
        ),
        Step.of(
            "configure-standby",
            ConfigureStandby(
                **server,
                primary_conninfo=request.primary_conninfo,
                slot=slot,
                listen_addresses=request.listen_addresses,
            ),
            description=f"write the standby's settings (port {request.port}, socket in "
            f"{made.at}, cluster_name pgsnap-standby-{request.name}, primary_conninfo, slot "
            f"{slot}, the archive's restore_command) and standby.signal",
            reason="it streams from the primary, and fetches from the archive the WAL the "
            "primary no longer keeps",
        ),
        Step.of(
            "start-clone",
            StartClone(**server, timeout=request.server_timeout),
            description="start the standby's server: it replays from the backup's start",
            reason="the primary is not touched but for the slot",
            undo=StopClone(**server),
        ),
        Step.of(
            "wait-standby",
            WaitStandby(**server, timeout=request.catch_up_timeout),
            description=f"wait (at most {request.catch_up_timeout:g} s) until the standby "
            "streams from the primary and has replayed up to where the primary was then",
            reason="the standby is handed over streaming and caught up, not merely started",
        ),
        Step.of(
            "mark-clone-ready",
            MarkCloneReady(clone=request.name),
            description=f"mark standby {request.name} ready in the catalog",
            reason="listed as ready only once it streams",
        ),
    ]
    summary = {
        "standby": request.name,
        "primary": f"PostgreSQL {primary.major}, timeline {tli}, at {primary.current_lsn}",
        "backup": f"{backup.id} (label {backup.label!r}, taken on the {backup.taken_on.value})",
        "where": f"{made.data_directory} on {made.on or 'the database host'}, port "
        f"{request.port}, socket in {made.at}",
        "slot": slot,
        "WAL": f"from the archive up to {reached}, then streamed ({where})",
        "volumes": ", ".join(f"{v.origin} ({v.role.value}) -> {v.path}" for v in made.volumes),
    }
    kept = (
        "the primary: not touched but for the replication slot",
        "the WAL archive: only read",
        f"backup {backup.id}'s snapshots: only read; the standby's volumes are copies that "
        "outlive them (the backup may expire)",
    )
    digest = hashlib.sha256(
        repr(
            (
                backup.id,
                backup.labelfile,
                to_dict(attrs.evolve(request, backup_id=None)),
                sorted(backup.snapshots.items()),
                primary.system_identifier,
                tli,
            )
        ).encode()
    ).hexdigest()
    return Plan(
        kind="standby",
        steps=tuple(steps),
        fingerprint=digest,
        request=to_dict(request),
        summary=summary,
        kept=kept,
        lost=(),
        warnings=resolved.warnings,
    )


def plan_standby_destroy(record: CloneRecord) -> Plan:
    """The plan that destroys seeded standby ``record``: its clone's destroy plan (stop,
    delete its volumes, remove its directory, forget it), with its replication slot
    dropped on the primary once its server is down."""
    base = plan_clone_destroy(record)
    if not record.slot:
        return attrs.evolve(base, kind="standby-destroy")
    steps = list(base.steps)
    at = next(i for i, s in enumerate(steps) if s.id == "stop-clone") + 1
    steps.insert(
        at,
        Step.of(
            "drop-slot",
            DropSlot(slot=record.slot),
            description=f"drop the replication slot {record.slot} on the primary",
            reason="a slot nobody streams from would keep WAL on the primary forever",
        ),
    )
    return attrs.evolve(
        base,
        kind="standby-destroy",
        steps=tuple(steps),
        summary={**base.summary, "slot": record.slot},
        kept=("the primary (but for the slot), the archive and the backup's snapshots",),
        lost=(f"standby {record.name} and its slot {record.slot}",),
    )
