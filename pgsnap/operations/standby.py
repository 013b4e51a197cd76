"""Operations of standby plans: a streaming standby seeded from a backup's snapshots.

A seeded standby is a clone (:mod:`pgsnap.operations.clone` makes its volumes,
directory and label, with the same guarantees: nothing of production is written)
that starts as a standby instead of recovering to a target. What it adds:

- a physical replication slot on the primary, created before the standby starts,
  so the primary keeps the WAL the standby will stream (dropped by the undo, and
  when the standby is destroyed);
- the standby's settings: ``primary_conninfo`` (no password: the standby's OS user
  finds it in its ``.pgpass``), ``primary_slot_name``, the archive's
  ``restore_command`` for the WAL the primary no longer has, ``standby.signal``;
- a wait until the standby streams from the primary and has replayed up to where
  the primary was when streaming began (caught up).

The primary is the cluster's own server, or its ``[primary]`` when the cluster is
a standby itself (:attr:`OperationContext.primary`).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Final

from pgsnap._attrs import frozen
from pgsnap.errors import DatabaseError, ExecutionError
from pgsnap.model import LSN
from pgsnap.operations.base import (
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Resume,
    Target,
)
from pgsnap.operations.clone import _CloneServerStep
from pgsnap.protocols import PrimaryServer

__all__ = [
    "SLOT_NAME_RE",
    "ConfigureStandby",
    "CreateSlot",
    "DropSlot",
    "WaitStandby",
    "primary_of",
    "standby_parameters",
]

log = logging.getLogger(__name__)

SLOT_NAME_RE: Final = re.compile(r"^[a-z0-9_]{1,63}$")
"""A replication slot's name, as PostgreSQL allows it (lower-case letters, digits and
underscores, at most 63)."""

_POLL: Final = 0.2


def primary_of(ctx: OperationContext) -> PrimaryServer:
    """The primary a standby plan works with: the configured ``[primary]``, else the
    cluster's own server (which the plan checked is a primary)."""
    if ctx.primary is not None:
        return ctx.primary
    adapter = ctx.adapter
    if not isinstance(adapter, PrimaryServer):
        raise ExecutionError(
            "the database adapter cannot run queries on the primary",
            step_id=ctx.step_id,
            hint="standbys need pgsnap's PostgreSQL adapter (or one implementing PrimaryServer)",
        )
    return adapter


def standby_parameters(
    *,
    name: str,
    port: int,
    socket_directory: str,
    listen_addresses: str,
    primary_conninfo: str,
    slot: str,
    restore_command: str,
) -> dict[str, str]:
    """The settings a seeded standby runs with: its own port, socket directory and
    ``cluster_name``; where its primary is and which slot it uses; the archive's
    ``restore_command`` (for the WAL its primary no longer keeps); the newest timeline
    followed. Archiving stays as the backup had it: a standby archives nothing unless
    ``archive_mode = always``, and archives as its primary did once promoted."""
    return {
        "port": str(port),
        "unix_socket_directories": socket_directory,
        "listen_addresses": listen_addresses,
        "cluster_name": f"pgsnap-standby-{name}",
        "primary_conninfo": primary_conninfo,
        "primary_slot_name": slot,
        "restore_command": restore_command,
        "recovery_target_timeline": "latest",
        "hot_standby": "on",
        "external_pid_file": "",
    }


def _check_slot(op: Operation, ctx: OperationContext, slot: str) -> None:
    if not SLOT_NAME_RE.match(slot):
        raise op.mismatch(ctx, f"invalid replication slot name {slot!r}", "make a new plan")


def _slot_state(primary: PrimaryServer, slot: str) -> tuple[bool, bool] | None:
    """(active, physical) of ``slot`` on the primary; None when it does not exist."""
    rows = primary.query(
        "SELECT active, slot_type = 'physical' FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    return None if not rows else (bool(rows[0][0]), bool(rows[0][1]))


@frozen
class CreateSlot(Operation):
    """Create the standby's physical replication slot on the primary, reserving WAL
    from now on (``pg_create_physical_replication_slot(slot, true)``), before the
    standby starts: the primary then keeps every segment the standby has not
    received. A slot of that name that this plan did not create is refused."""

    name = "db.create_slot"
    target = Target.DATABASE
    compensation = "db.drop_slot"
    resume = Resume.CHECK

    slot: str

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_slot(self, ctx, self.slot)
        if plan.undo or ctx.step_id in plan.started:
            return
        if _slot_state(primary_of(ctx), self.slot) is not None:
            raise self.mismatch(
                ctx,
                f"the primary has a replication slot {self.slot} already",
                "choose another standby name or slot (--slot), or drop the slot if it is "
                "left over: SELECT pg_drop_replication_slot('...')",
            )

    def probe(self, ctx: OperationContext) -> Outputs | None:
        return {"slot": self.slot} if _slot_state(primary_of(ctx), self.slot) else None

    def run(self, ctx: OperationContext) -> Outputs:
        primary = primary_of(ctx)
        if _slot_state(primary, self.slot) is not None:
            return {"slot": self.slot}  # made by this plan's interrupted run
        rows = primary.query(
            "SELECT lsn::text FROM pg_create_physical_replication_slot(%s, true)",
            (self.slot,),
        )
        return {"slot": self.slot, "restart_lsn": str(rows[0][0]) if rows else ""}


@frozen
class DropSlot(Operation):
    """Drop the standby's replication slot on the primary (a no-op when it is gone).
    The standby must be down: an active slot is waited for a little (its walsender
    ends after the standby stops), then refused."""

    name = "db.drop_slot"
    target = Target.DATABASE

    slot: str
    timeout: float = 30.0

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        _check_slot(self, ctx, self.slot)

    def run(self, ctx: OperationContext) -> Outputs:
        primary = primary_of(ctx)
        deadline = time.monotonic() + self.timeout
        while True:
            state = _slot_state(primary, self.slot)
            if state is None:
                return {"dropped": False}
            active, _physical = state
            if not active:
                primary.query("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                return {"dropped": True}
            if time.monotonic() >= deadline:
                raise ExecutionError(
                    f"replication slot {self.slot} is still in use on the primary",
                    step_id=ctx.step_id,
                    hint="stop the server that streams through it, then run again",
                )
            ctx.sleep(_POLL)


@frozen
class ConfigureStandby(_CloneServerStep):
    """Write the standby's settings (:func:`standby_parameters`) and ``standby.signal``."""

    name = "db.configure_standby"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    primary_conninfo: str
    slot: str
    listen_addresses: str = ""
    on: str = ""

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        super().precheck(ctx, plan)
        _check_slot(self, ctx, self.slot)

    def run(self, ctx: OperationContext) -> Outputs:
        self.server(ctx).write_standby_settings(
            standby_parameters(
                name=self.clone,
                port=self.port,
                socket_directory=self.at,
                listen_addresses=self.listen_addresses,
                primary_conninfo=self.primary_conninfo,
                slot=self.slot,
                restore_command=ctx.archive.restore_command(),
            )
        )
        return {}


@frozen
class WaitStandby(_CloneServerStep):
    """Wait until the standby accepts connections, streams from the primary, and has
    replayed up to where the primary was when streaming began (its lag then 0 bytes
    behind that point). Progress is reported as it catches up."""

    name = "db.wait_standby"
    target = Target.DATABASE

    clone: str
    at: str
    data_directory: str
    port: int
    timeout: float = 600.0
    on: str = ""

    def run(self, ctx: OperationContext) -> Outputs:
        server = self.server(ctx)
        primary = primary_of(ctx)
        deadline = time.monotonic() + self.timeout
        goal: LSN | None = None
        state = "starting"
        replayed: LSN | None = None
        while True:
            if not server.is_running():
                raise ExecutionError(
                    "the standby's server stopped while catching up",
                    step_id=ctx.step_id,
                    hint=f"see its server log {self.at}/server.log",
                )
            try:
                in_recovery, status, lsn = server.query(
                    "SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver), "
                    "pg_last_wal_replay_lsn()::text"
                )[0]
            except DatabaseError as exc:  # not accepting connections yet (replaying)
                log.debug("standby %s not ready: %s", self.clone, exc)
                in_recovery, status, lsn = True, None, None
            if not in_recovery:
                raise ExecutionError(
                    "the standby left recovery: it is no standby (was it promoted?)",
                    step_id=ctx.step_id,
                    hint=f"see its server log {self.at}/server.log",
                )
            replayed = None if lsn is None else LSN.parse(str(lsn))
            state = str(status or "starting")
            if status == "streaming" and goal is None:
                goal = LSN.parse(str(primary.query("SELECT pg_current_wal_lsn()::text")[0][0]))
            if goal is not None and replayed is not None and replayed >= goal:
                break
            ctx.progress(
                f"standby {self.clone}: {state}, replayed to {replayed or '-'}"
                + (f", catching up to {goal}" if goal is not None else ""),
                {
                    "state": state,
                    "replayed": None if replayed is None else str(replayed),
                    "goal": None if goal is None else str(goal),
                },
            )
            if time.monotonic() >= deadline:
                raise ExecutionError(
                    f"the standby did not catch up within {self.timeout:g} s (WAL receiver: "
                    f"{state}, replayed to {replayed or 'nothing yet'})",
                    step_id=ctx.step_id,
                    hint="check primary_conninfo (and the standby's .pgpass), the primary's "
                    f"pg_hba.conf for replication, and the server log {self.at}/server.log; "
                    "or allow longer (--timeout)",
                )
            ctx.sleep(_POLL)
        now = LSN.parse(str(primary.query("SELECT pg_current_wal_lsn()::text")[0][0]))
        return {
            "streaming": True,
            "caught_up_to": str(goal),
            "replayed": str(replayed),
            "lag_bytes": max(0, now.value - replayed.value) if replayed is not None else None,
        }
