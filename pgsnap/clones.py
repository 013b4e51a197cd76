"""Clones, restore drills and seeded standbys, around the pure planners
(:mod:`pgsnap.planner.clone`, :mod:`pgsnap.planner.standby`).

:class:`~pgsnap.cluster.Cluster` calls these: the I/O a clone request needs (a free
port, the recorded clones) and a drill's run (clone, check, measure, destroy,
record). A drill never raises for what it found: its
:class:`~pgsnap.model.DrillRecord` says what passed and what failed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap.errors import ConfigurationError, PgsnapError
from pgsnap.model import (
    LSN,
    BackupRecord,
    CloneRecord,
    DrillCheck,
    DrillPhase,
    DrillRecord,
    RecoveryAction,
    RecoveryTarget,
    Severity,
    TargetKind,
    from_dict,
)
from pgsnap.operations.clone import clone_server
from pgsnap.planner.backup import Finding
from pgsnap.planner.clone import CloneRequest, plan_clone
from pgsnap.planner.standby import StandbyRequest, plan_seed_standby
from pgsnap.protocols import PrimaryServer, ServerInstances

if TYPE_CHECKING:
    from pgsnap.cluster import Cluster
    from pgsnap.executor import Event
    from pgsnap.host import Host
    from pgsnap.plan import Plan
    from pgsnap.protocols import CloneServer

__all__ = [
    "FIRST_CLONE_PORT",
    "clone_request",
    "drill_findings",
    "drill_html",
    "drill_table",
    "listening_ports",
    "plan_clone_for",
    "plan_standby_for",
    "replan_clone",
    "replan_standby",
    "run_drill",
    "standby_request",
]

log = logging.getLogger(__name__)

FIRST_CLONE_PORT: Final = 55432
"""Clones get the first port from here that no recorded clone uses."""

_STARTUP_NOISE: Final = (
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "the database system is shutting down",
    "terminating connection due to administrator command",
    # pgsnap's own look at the pause state (pg_get_wal_replay_pause_state()) racing the
    # promotion it waits for: PostgreSQL logs the refusal, pgsnap asks again.
    "recovery is not in progress",
)


def _free_port(cluster: Cluster, host: Host) -> int:
    """The first port from :data:`FIRST_CLONE_PORT` that no recorded clone, nor the
    cluster, nor anything listening on ``host`` (its ``/proc/net/tcp*``) uses."""
    used = {c.port for c in cluster.catalog.list_clones()} | listening_ports(host)
    try:
        own = cluster.adapter.listening_port()  # type: ignore[attr-defined]
    except (AttributeError, PgsnapError):
        own = None
    port = FIRST_CLONE_PORT
    while port in used or port == own:
        port += 1
    return port


def listening_ports(host: Host) -> set[int]:
    """The TCP ports something listens on at ``host`` (empty when it cannot be read)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = host.read_text(table)
        except PgsnapError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                local = fields[1].rpartition(":")[2]
                with contextlib.suppress(ValueError):
                    ports.add(int(local, 16))
    return ports


def clone_request(
    cluster: Cluster,
    *,
    name: str | None,
    host: str | None,
    port: int | None,
    purpose: str = "clone",
    **fields: Any,
) -> CloneRequest:
    """The :class:`CloneRequest` of :meth:`Cluster.plan_clone`'s arguments, with the
    defaults that need I/O (the name from the clock, the first free port)."""
    on = "" if host is None or host == cluster.host.name else host
    if on and on not in cluster.clone_hosts:
        known = ", ".join(sorted(cluster.clone_hosts)) or "none"
        raise ConfigurationError(
            f"a clone on host {host!r}: pgsnap reaches no such host (the database host is "
            f"{cluster.host.name!r}; other hosts for clones: {known})",
            hint=f"add a [clone_hosts.{host}] section (ssh = ...) to the configuration, "
            "or leave host unset for the database host",
        )
    if name is None:
        name = _default_name(cluster, purpose)
    if fields.get("listen_addresses") is None:
        fields["listen_addresses"] = _listen_addresses(cluster, on)
    return CloneRequest(
        name=name,
        port=_free_port(cluster, cluster.clone_hosts.get(on) or cluster.host)
        if port is None
        else port,
        purpose=purpose,
        host=on,
        **fields,
    )


def _default_name(cluster: Cluster, purpose: str) -> str:
    """``c`` (a clone) or ``d`` (a drill) and the time to the second, then ``-2``,
    ``-3``... while a clone or a drill already has that name: two drills in one second
    (a script drilling each backup) must not share a name, whose record the second
    would overwrite and whose clone plan, made again the same, would have "already
    run"."""
    now = cluster._now().astimezone(dt.UTC)
    stem = f"{'d' if purpose == 'drill' else 'c'}{now:%Y%m%d%H%M%S}"
    taken = {c.name for c in cluster.catalog.list_clones()}
    taken |= {d.id for d in cluster.catalog.list_drills()}
    if stem not in taken:
        return stem
    return next(f"{stem}-{n}" for n in itertools.count(2) if f"{stem}-{n}" not in taken)


def _listen_addresses(cluster: Cluster, on: str) -> str:
    """Where a clone listens by default: on its Unix socket only when pgsnap is on its
    machine and reaches it through the socket; else where the cluster listens (on the
    database host: pgsnap reaches the clone at the cluster's address, on the clone's
    port), or everywhere on another host."""
    adapter = cluster.adapter
    if not isinstance(adapter, ServerInstances):
        return ""
    try:
        return adapter.instance_listen_addresses(cluster.clone_hosts.get(on))
    except PgsnapError as exc:
        raise ConfigurationError(
            f"pgsnap reaches the cluster over TCP, and cannot ask it where it listens "
            f"({exc.message}): a clone must listen where pgsnap can reach it",
            hint="give the clone's listen_addresses (--listen-addresses), e.g. '*'",
        ) from exc


def plan_clone_for(cluster: Cluster, request: CloneRequest) -> Plan:
    """Observe and plan ``request``."""
    facts = cluster.recovery_facts(request.recovery_request())
    return plan_clone(attrs.evolve(facts, clone_hosts=frozenset(cluster.clone_hosts)), request)


def replan_clone(cluster: Cluster, plan: Plan) -> Plan:
    """The clone plan made again now, for the executor's freshness check (with the
    plan's backup pinned: a newer backup since does not make it stale)."""
    request = from_dict(CloneRequest, plan.request)
    record = next((s for s in plan.steps if s.action == "catalog.record_clone"), None)
    if record is not None and request.backup_id is None:
        request = attrs.evolve(request, backup_id=str(record.params.get("backup_id")))
    return plan_clone_for(cluster, request)


# --------------------------------------------------------------------------- standbys


def standby_request(
    cluster: Cluster, *, host: str | None, port: int | None, **fields: Any
) -> StandbyRequest:
    """The :class:`StandbyRequest` of :meth:`Cluster.plan_seed_standby`'s arguments, with
    the defaults that need I/O (the first free port, where it listens)."""
    on = "" if host is None or host == cluster.host.name else host
    if on and on not in cluster.clone_hosts:
        known = ", ".join(sorted(cluster.clone_hosts)) or "none"
        raise ConfigurationError(
            f"a standby on host {host!r}: pgsnap reaches no such host (the database host "
            f"is {cluster.host.name!r}; other hosts: {known})",
            hint=f"add a [clone_hosts.{host}] section (ssh = ...) to the configuration, "
            "or leave host unset for the database host",
        )
    if fields.get("listen_addresses") is None:
        fields["listen_addresses"] = _listen_addresses(cluster, on)
    return StandbyRequest(
        port=_free_port(cluster, cluster.clone_hosts.get(on) or cluster.host)
        if port is None
        else port,
        host=on,
        **fields,
    )


def _primary(cluster: Cluster) -> PrimaryServer:
    """The primary a standby follows: ``[primary]`` when the cluster is a standby,
    else the cluster's own server."""
    if cluster.primary is not None:
        return cluster.primary
    adapter = cluster.adapter
    if not isinstance(adapter, PrimaryServer):
        raise ConfigurationError(
            "the database adapter cannot be asked as a primary (no query())",
            hint="standbys need pgsnap's PostgreSQL adapter",
        )
    return adapter


_OLDEST_WAL: Final = (
    "SELECT min(name) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{24}$' AND substr(name, 1, 8) = %s"
)


def plan_standby_for(cluster: Cluster, request: StandbyRequest) -> Plan:
    """Observe (the primary, the archive, the backups) and plan ``request``."""
    primary = _primary(cluster)
    facts_of_primary = primary.describe()
    oldest: str | None = None
    try:
        rows = primary.query(_OLDEST_WAL, (f"{facts_of_primary.timeline:08X}",))
        oldest = None if not rows or rows[0][0] is None else str(rows[0][0])
    except PgsnapError as exc:  # pg_ls_waldir() needs pg_monitor: count the current only
        log.info("the primary's pg_wal cannot be listed (%s): counting its current segment", exc)
    facts = cluster.recovery_facts(request.recovery_request(facts_of_primary.timeline))
    facts = attrs.evolve(facts, clone_hosts=frozenset(cluster.clone_hosts))
    return plan_seed_standby(facts, request, facts_of_primary, oldest)


def replan_standby(cluster: Cluster, plan: Plan) -> Plan:
    """The standby plan made again now (the executor's freshness check), its backup
    pinned."""
    request = from_dict(StandbyRequest, plan.request)
    record = next((s for s in plan.steps if s.action == "catalog.record_clone"), None)
    if record is not None and request.backup_id is None:
        request = attrs.evolve(request, backup_id=str(record.params.get("backup_id")))
    return plan_standby_for(cluster, request)


# --------------------------------------------------------------------------- drills


def _check_sql(server: CloneServer, number: int, sql: str) -> DrillCheck:
    name = f"sql {number}"
    try:
        rows = server.query(sql)
    except PgsnapError as exc:
        return DrillCheck(name, False, f"{sql}: {exc.message}")
    if not rows:
        return DrillCheck(name, False, f"{sql}: no rows")
    first = rows[0][0] if rows[0] else None
    ok = bool(first) if isinstance(first, bool) or first is None else True
    return DrillCheck(name, ok, f"{sql}: {first!r}")


_AMCHECK_FUNCTION: Final = """
CREATE EXTENSION IF NOT EXISTS amcheck;
CREATE SCHEMA IF NOT EXISTS pgsnap_drill;
CREATE OR REPLACE FUNCTION pgsnap_drill.amcheck(heap boolean)
RETURNS TABLE (obj text, problem text) LANGUAGE plpgsql AS $body$
DECLARE
    r record;
    m record;
BEGIN
    FOR r IN SELECT c.oid AS id, c.oid::regclass::text AS name
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             JOIN pg_am a ON a.oid = c.relam
             WHERE a.amname = 'btree' AND i.indisvalid AND c.relpersistence <> 't' LOOP
        BEGIN
            PERFORM bt_index_check(r.id, true);
            obj := r.name; problem := NULL; RETURN NEXT;
        EXCEPTION WHEN OTHERS THEN
            obj := r.name; problem := SQLERRM; RETURN NEXT;
        END;
    END LOOP;
    IF heap THEN
        FOR r IN SELECT c.oid AS id, c.oid::regclass::text AS name
                 FROM pg_class c JOIN pg_am a ON a.oid = c.relam
                 WHERE c.relkind IN ('r', 'm', 't') AND a.amname = 'heap'
                 AND c.relpersistence <> 't' LOOP
            obj := r.name; problem := NULL; RETURN NEXT;
            FOR m IN SELECT blkno, msg FROM verify_heapam(r.id) LIMIT 5 LOOP
                obj := r.name; problem := 'block ' || m.blkno || ': ' || m.msg; RETURN NEXT;
            END LOOP;
        END LOOP;
    END IF;
END
$body$
"""
"""A function in the clone that checks every B-tree index (and on 14 and later every
table) in its database in one call, a failing object reported without stopping the
rest: two connections a database instead of one per index and table."""


def _amcheck(server: CloneServer, major: int) -> DrillCheck:
    """``amcheck`` on every database: ``bt_index_check`` (with ``heapallindexed``) of
    every B-tree index, and on 14 and later ``verify_heapam`` of every table (what
    ``pg_amcheck`` runs), by a function made in the clone for it
    (:data:`_AMCHECK_FUNCTION`, in schema ``pgsnap_drill``: the clone is thrown away)."""
    checked = 0
    problems: list[str] = []
    try:
        dbs = [r[0] for r in server.query("SELECT datname FROM pg_database WHERE datallowconn")]
        for db in dbs:
            server.query(_AMCHECK_FUNCTION, dbname=db)
            rows = server.query(
                "SELECT obj, problem FROM pgsnap_drill.amcheck(%s)", (major >= 14,), dbname=db
            )
            for obj, problem in rows:
                if problem is None:
                    checked += 1
                else:
                    problems.append(f"{db}.{obj}: {problem}")
    except PgsnapError as exc:
        return DrillCheck("amcheck", False, exc.message)
    if problems:
        return DrillCheck("amcheck", False, "; ".join(problems[:5]))
    what = "indexes and tables" if major >= 14 else "indexes"
    return DrillCheck("amcheck", True, f"{checked} {what} in {len(dbs)} databases")


def _checksums(server: CloneServer) -> DrillCheck:
    try:
        (on,) = server.query("SHOW data_checksums")[0]
        if on != "on":
            return DrillCheck("checksums", True, "data checksums are off in this cluster")
        (failures,) = server.query(
            "SELECT coalesce(sum(checksum_failures), 0) FROM pg_stat_database"
        )[0]
    except PgsnapError as exc:
        return DrillCheck("checksums", False, exc.message)
    return DrillCheck(
        "checksums",
        int(failures) == 0,
        f"{failures} checksum failures while every page was read",
    )


def _server_log(host: Host, at: str) -> DrillCheck:
    try:
        text = host.read_text(f"{at}/server.log")
    except PgsnapError as exc:
        return DrillCheck("server log", False, f"cannot read it: {exc.message}")
    bad = [
        line.strip()
        for line in text.splitlines()
        if any(f"{level}:" in line for level in ("PANIC", "FATAL", "ERROR"))
        and not any(noise in line for noise in _STARTUP_NOISE)
    ]
    return DrillCheck("server log", not bad, "; ".join(bad[:3]) or "no errors")


def _phases(plan: Plan, seconds: Mapping[str, float]) -> tuple[list[DrillPhase], float]:
    ids = [s.id for s in plan.steps]
    start = ids.index("start-clone")
    wait = ids.index("wait-clone")
    storage = sum(seconds.get(i, 0.0) for i in ids[:start])
    replay = sum(seconds.get(i, 0.0) for i in ids[start : wait + 1])
    return [DrillPhase("storage", storage), DrillPhase("replay", replay)], storage + replay


def run_drill(
    cluster: Cluster,
    target: RecoveryTarget | None,
    *,
    backup_id: str | None,
    checks: Sequence[str],
    keep_on_failure: bool,
    on_event: Callable[[Event], None] | None,
    options: Mapping[str, Any],
) -> DrillRecord:
    """See :meth:`Cluster.drill` (``target`` already checked; None: latest)."""
    target = target or RecoveryTarget.latest()
    started = cluster._now()
    wall = time.monotonic()
    request = clone_request(
        cluster,
        name=options.get("name"),
        host=options.get("host"),
        port=options.get("port"),
        purpose="drill",
        target=target,
        action=RecoveryAction.PROMOTE,
        backup_id=backup_id,
        at=options.get("at"),
        listen_addresses=options.get("listen_addresses"),
        recovery_timeout=float(options.get("recovery_timeout", 600.0)),
        server_timeout=float(options.get("server_timeout", 120.0)),
    )
    drill_id = request.name
    results: list[DrillCheck] = []
    phases: list[DrillPhase] = []
    rto: float | None = None
    error = ""
    plan: Plan | None = None
    outputs: Mapping[str, Any] = {}
    chosen = backup_id or ""
    try:
        plan = plan_clone_for(cluster, request)
        chosen = str(
            next(s for s in plan.steps if s.action == "catalog.record_clone").params["backup_id"]
        )
        result = cluster.execute(plan, on_event=on_event)
        outputs = result.outputs.get("wait-clone", {})
        phases, rto = _phases(plan, result.seconds)
        results.append(
            DrillCheck(
                "reached target",
                bool(outputs.get("replay_lsn")),
                f"{outputs.get('state')} on timeline {outputs.get('timeline')} at "
                f"{outputs.get('replay_lsn')} (the plan: {outputs.get('planned_lsn')} at least)",
            )
        )
    except PgsnapError as exc:
        error = exc.message
        log.warning("drill %s: the clone could not be made: %s", drill_id, exc.message)
    kept = False
    if plan is not None and not error:
        checked_at = time.monotonic()
        record = cluster.catalog.get_clone(request.name)
        where = cluster.clone_hosts.get(record.host)
        server = clone_server(
            cluster.adapter, record.data_directory, record.port, record.at, host=where
        )
        backup = cluster.catalog.get(chosen)
        major = backup.server_version // 10000
        results.append(_amcheck(server, major))
        results.append(_checksums(server))
        results += [_check_sql(server, n, sql) for n, sql in enumerate(checks, 1)]
        results.append(_server_log(where or cluster.host, record.at))
        phases.append(DrillPhase("checks", time.monotonic() - checked_at))
        ok = all(c.ok for c in results)
        if ok or not keep_on_failure:
            cleaned_at = time.monotonic()
            try:
                cluster.destroy_clone(request.name, on_event=on_event)
            except PgsnapError as exc:
                results.append(DrillCheck("cleanup", False, exc.message))
            phases.append(DrillPhase("cleanup", time.monotonic() - cleaned_at))
        else:
            kept = True
    replay = outputs.get("replay_lsn")
    last = outputs.get("last_transaction")
    last_time = _parse_time(last)
    reference = target.value if target.kind is TargetKind.TIME else started
    rpo = None
    if last_time is not None and isinstance(reference, dt.datetime):
        rpo = max(0.0, (reference - last_time).total_seconds())
    segments = wal_bytes = 0
    if replay and chosen:
        try:
            backup = cluster.catalog.get(chosen)
            wal_bytes = max(0, LSN.parse(str(replay)).value - backup.start_lsn.value)
            segments = wal_bytes // backup.wal_segment_size + 1
        except PgsnapError:
            pass
    finished = started + dt.timedelta(seconds=time.monotonic() - wall)
    drill = DrillRecord(
        id=drill_id,
        backup_id=chosen,
        target=target,
        clone=request.name,
        started_at=started,
        finished_at=finished,
        ok=not error and all(c.ok for c in results),
        checks=tuple(results),
        phases=tuple(phases),
        rto_seconds=rto,
        rpo_seconds=rpo,
        replay_lsn=LSN.parse(str(replay)) if replay else None,
        last_transaction=last_time,
        wal_segments=segments,
        wal_bytes=wal_bytes,
        error=error,
        kept=kept,
    )
    if chosen:
        cluster.catalog.put_drill(drill)
    return drill


def _parse_time(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def drill_findings(
    backups: Sequence[BackupRecord],
    drills: Sequence[DrillRecord],
    clones: Sequence[CloneRecord] = (),
) -> list[Finding]:
    """``pgsnap check``'s warnings about drills: the newest usable backup was never
    drilled, or its last drill failed; a drill's clone is left over (its drill was
    interrupted: it holds storage until destroyed). A clone a failed drill kept on
    purpose (``--keep-on-failure``) is not warned about."""
    kept = {d.clone for d in drills if d.kept}
    found = [
        Finding(
            "drill_clone_left",
            Severity.WARNING,
            f"clone {c.name} of backup {c.backup_id} was left by an interrupted drill "
            f"({c.state.value} since {c.created_at:%Y-%m-%d %H:%M} UTC): pgsnap clone destroy "
            f"{c.name}",
        )
        for c in clones
        if c.purpose == "drill" and c.name not in kept
    ]
    usable = [b for b in backups if b.is_usable]
    if not usable:
        return found
    newest = max(usable, key=lambda b: (b.start_time, b.id))
    mine = sorted((d for d in drills if d.backup_id == newest.id), key=lambda d: d.started_at)
    if not mine:
        return [
            *found,
            Finding(
                "backup_not_drilled",
                Severity.WARNING,
                f"the newest backup {newest.id} was never proven restorable: run pgsnap drill "
                "--newest",
            ),
        ]
    if not mine[-1].ok:
        failed = ", ".join(c.name for c in mine[-1].checks if not c.ok) or mine[-1].error
        return [
            *found,
            Finding(
                "drill_failed",
                Severity.WARNING,
                f"the last drill of the newest backup {newest.id} ({mine[-1].id}) failed: {failed}",
            ),
        ]
    return found


# --------------------------------------------------------------------------- rendering


def drill_table(drills: Sequence[DrillRecord]) -> list[tuple[str, ...]]:
    """Rows (with a header row) of drills for a text table."""
    rows: list[tuple[str, ...]] = [
        ("drill", "backup", "target", "result", "RTO", "RPO", "WAL", "failed checks")
    ]
    for d in drills:
        rows.append(
            (
                d.id,
                d.backup_id,
                str(d.target),
                "ok" if d.ok else "FAILED",
                "-" if d.rto_seconds is None else f"{d.rto_seconds:.1f} s",
                "-" if d.rpo_seconds is None else f"{d.rpo_seconds:.1f} s",
                f"{d.wal_segments} seg"
                + ("" if d.replay_rate is None else f", {d.replay_rate / 2**20:.1f} MiB/s"),
                ", ".join(c.name for c in d.checks if not c.ok)
                or (d.error[:60] if d.error else ""),
            )
        )
    return rows


def drill_html(drill: DrillRecord) -> str:
    """A drill as an HTML fragment (a notebook, a report)."""
    e = html.escape
    checks = "".join(
        f"<tr><td>{e(c.name)}</td><td>{'ok' if c.ok else '<b>FAILED</b>'}</td>"
        f"<td>{e(c.detail)}</td></tr>"
        for c in drill.checks
    )
    phases = ", ".join(f"{e(p.name)} {p.seconds:.1f} s" for p in drill.phases)
    rto = "-" if drill.rto_seconds is None else f"{drill.rto_seconds:.1f} s"
    rpo = "-" if drill.rpo_seconds is None else f"{drill.rpo_seconds:.1f} s"
    return (
        f"<div><b>drill {e(drill.id)} of backup {e(drill.backup_id)}: "
        f"{'restorable' if drill.ok else 'FAILED'}</b><br>target {e(str(drill.target))}; "
        f"RTO {rto} ({phases}); RPO {rpo}; WAL replayed {drill.wal_segments} segments "
        f"({drill.wal_bytes} bytes"
        + ("" if drill.replay_rate is None else f", {drill.replay_rate / 2**20:.1f} MiB/s")
        + ")"
        + (f"<br>error: {e(drill.error)}" if drill.error else "")
        + f"<table><tr><th>check</th><th>result</th><th>detail</th></tr>{checks}</table></div>"
    )
