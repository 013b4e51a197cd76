"""The ``pgsnap`` command.

    pgsnap demo                      the whole job on a throwaway cluster
    pgsnap check      -c pgsnap.toml preflight findings, archiver, WAL, backups
    pgsnap backup     -c pgsnap.toml take a snapshot backup
    pgsnap list       -c pgsnap.toml the backups in the catalog
    pgsnap plan-recovery -c ... [--time T | --lsn L | --xid X | --name N | --immediate]
    pgsnap recover    -c ... [target options] [--yes]
    pgsnap resume     -c pgsnap.toml [--yes]  resume interrupted plans
    pgsnap expire-copies -c ... [--to T] [--dry-run]  copy retention
    pgsnap copy-gc    -c ... [--to T] [--dry-run]  remove chunks no copy needs
    pgsnap wal        -c pgsnap.toml the WAL archive, per timeline
    pgsnap copy-key generate PATH    a new key file that encrypts copies

Exit codes: 0 success; 1 execution failed (compensations ran); 2 bad usage or
configuration; 3 the plan was refused (PlanningError: the message says why
and what would work); 4 ``check`` found blocking problems; 5 the plan is
stale; 6 another run holds the cluster, or a copy or garbage collection holds
the copy target; 130 interrupted; 141 standard output was closed by its reader.

Every wait has a ``[timeouts]`` key and a ``--<key>-timeout`` flag
(:data:`TIMEOUT_KEYS`); a flag wins over the file.

Passwords come from the environment variable named by ``password_env`` or
from ``password_file`` in the configuration, never from a flag.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap.config import (
    RETENTION_KEYS,
    TIMEOUT_KEYS,
    Source,
    Timeouts,
    load_retention,
    load_timeouts,
)
from pgsnap.errors import (
    BackupNotDue,
    ClusterLockedError,
    ConfigurationError,
    CopyBusy,
    ExecutionError,
    InputError,
    PgsnapError,
    PlanningError,
    StalePlanError,
)

if TYPE_CHECKING:
    from pgsnap.cluster import Cluster

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_CODES",
    "TIMEOUT_KEYS",
    "Timeouts",
    "load_cluster",
    "load_timeouts",
    "main",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_CHECK, EXIT_STALE = 0, 1, 2, 3, 4, 5
EXIT_LOCKED = 6
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: standard output was closed by its reader (``pgsnap list | head -1``)."""
EXIT_CODES = {
    0: "success",
    1: "execution failed (compensations ran; see the message)",
    2: "bad usage or configuration",
    3: "plan refused: the request cannot succeed (the message says why and the alternative)",
    4: "check found blocking problems (a backup cannot be taken, or a recovery is at risk), "
    "or verify-copy found a copy missing or damaged chunks",
    5: "the plan is stale, or has already run: plan again",
    6: "another pgsnap run holds the cluster, a copy or garbage collection holds the copy "
    "target, or an interrupted run must be resumed first (nothing was changed)",
    129: "hung up (SIGHUP): handled as an interrupt",
    130: "interrupted (SIGINT): what could not resume was undone",
    143: "terminated (SIGTERM): handled as an interrupt",
    141: "standard output was closed by its reader (e.g. | head); what was done stands",
}


def _out(text: str) -> None:
    print(text, flush=True)


def _json_out(value: Any) -> str:
    """``--json`` output: indented for a person at a terminal; one line otherwise, for
    the program that reads it (the C encoder: ten times faster at ten thousand backups)."""
    if sys.stdout.isatty():
        return json.dumps(value, indent=2)
    return json.dumps(value, check_circular=False)  # plain data: a third faster


def _err(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except BrokenPipeError:
        # Diagnostics for a reader who has gone: drop them; the exit code still tells.
        _to_devnull(sys.stderr)


# --------------------------------------------------------------------------- configuration


def load_cluster(
    source: Source,
    *,
    timeouts: Timeouts | None = None,
    base: str | os.PathLike[str] | None = None,
) -> Cluster:
    """The :class:`~pgsnap.cluster.Cluster` of a configuration: the same as
    :meth:`pgsnap.Cluster.from_config <pgsnap.cluster.Cluster.from_config>`
    (kept for scripts that import it from here)."""
    from pgsnap.cluster import Cluster  # noqa: PLC0415 - psycopg and the backends on use

    return Cluster.from_config(source, timeouts=timeouts, base=base)


# --------------------------------------------------------------------------- commands


def _target(args: argparse.Namespace) -> Any:
    from pgsnap.model import RecoveryTarget  # noqa: PLC0415

    inclusive = not args.exclusive
    chosen = [n for n in ("time", "lsn", "xid", "name") if getattr(args, n) is not None]
    if args.immediate:
        chosen.append("immediate")
    if len(chosen) > 1:
        raise InputError(
            f"give one recovery target, not {len(chosen)} ({', '.join(chosen)})",
            hint="PostgreSQL accepts exactly one target",
        )
    if args.time is not None:
        return RecoveryTarget.time(args.time, inclusive=inclusive)
    if args.lsn is not None:
        return RecoveryTarget.lsn(args.lsn, inclusive=inclusive)
    if args.xid is not None:
        return RecoveryTarget.xid(args.xid, inclusive=inclusive)
    if args.name is not None:
        return RecoveryTarget.name(args.name)
    if args.immediate:
        return RecoveryTarget.immediate()
    return RecoveryTarget.latest()


def _reporter(args: argparse.Namespace) -> Callable[[Any], None]:
    """How the command shows a run's progress on stderr (:mod:`pgsnap.progress`):
    ``--json-events``, one JSON object per event; ``--quiet``, nothing; else a live
    status line on a terminal, or a line per step (and per ten seconds of a long one)."""
    from pgsnap.progress import JsonEventReporter, terminal_reporter  # noqa: PLC0415

    if getattr(args, "json_events", False):
        return JsonEventReporter()
    if getattr(args, "quiet", False):
        return lambda _event: None
    return terminal_reporter()


def _execute(cluster: Any, plan: Any, args: argparse.Namespace) -> Any:
    return cluster.execute(plan, on_event=_reporter(args))


def _load(args: argparse.Namespace) -> tuple[Any, Timeouts]:
    """The cluster of ``--config`` and the waits: the file's ``[timeouts]``, flags winning."""
    source = _source(args)
    timeouts = load_timeouts(source)
    flags = {
        key: value
        for key in TIMEOUT_KEYS
        if (value := getattr(args, f"{key}_timeout", None)) is not None
    }
    timeouts = attrs.evolve(timeouts, **flags)
    base = getattr(args, "base", None)
    cluster = load_cluster(source, timeouts=timeouts, base=base)
    if hasattr(cluster.catalog, "on_unreadable"):  # said as the command's own warnings,
        cluster.catalog.on_unreadable = _warn_unreadable_entry  # as the catalog is read
    return cluster, timeouts


def _cluster_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """What a Cluster of ``--config`` is built from (its catalog, backend...), the whole
    configuration checked as :func:`_load` checks it, without building the cluster."""
    from pgsnap.config import cluster_arguments  # noqa: PLC0415

    source = _source(args)
    timeouts = load_timeouts(source)
    return cluster_arguments(source, timeouts=timeouts, base=getattr(args, "base", None))


def _catalog_alone(args: argparse.Namespace) -> Any:
    """The catalog of ``--config``, nothing else built (no database driver, no storage
    client imported); the configuration's sections and keys checked."""
    from pgsnap.config import load_catalog  # noqa: PLC0415

    source = _source(args)
    return load_catalog(source, timeouts=load_timeouts(source), base=getattr(args, "base", None))


def _on_mock_storage(args: argparse.Namespace) -> bool:
    """Whether the configuration's storage is the mock backend (read from the file as it
    is; a damaged file has been refused before this is asked)."""
    import tomllib  # noqa: PLC0415

    source = _source(args)
    try:
        conf = source if isinstance(source, Mapping) else tomllib.loads(Path(source).read_text())
    except (OSError, ValueError):
        return False
    storage = conf.get("storage")
    return isinstance(storage, dict) and storage.get("backend") == "mock"


def _source(args: argparse.Namespace) -> Any:
    """The configuration of the command's cluster: the file, or with ``--cluster`` that
    cluster's configuration in the fleet (resolved by :func:`_dispatch`)."""
    return getattr(args, "source", None) or args.config


def _warn_unreadable_entries(entries: Sequence[Any]) -> None:
    """Name every catalog file that cannot be read (their backups are not used)."""
    for entry in entries:
        _warn_unreadable_entry(entry)


def _warn_unreadable_entry(entry: Any) -> None:
    _err(
        f"pgsnap: warning: catalog file {entry.path} is unreadable: {entry.error}; "
        "the backup it records is not used (hint: restore the file from a copy, or "
        "move it out of the catalog)"
    )


def _plan_recovery(args: argparse.Namespace, cluster: Any, timeouts: Timeouts, target: Any) -> Any:
    lost = ["data"] + (["wal"] if args.wal_lost else [])
    return cluster.plan_recovery(
        target,
        timeline=args.timeline,
        action=args.action,
        lost=lost,
        backup_id=args.backup,
        safety_snapshot=not args.no_safety_snapshot,
        from_copy=args.from_copy,
        server_timeout=timeouts.server,
        recovery_timeout=timeouts.recovery,
        restore_timeout=timeouts.restore,
        device_timeout=timeouts.device,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo."""
    from pgsnap._demo import run_demo  # noqa: PLC0415

    result = run_demo(
        say=_out, on_event=_reporter(args), bindir=args.bindir, keep=args.keep, backend=args.backend
    )
    _out("")
    _out("Summary")
    v = result.postgres_version
    _out(f"  PostgreSQL {v // 10000}.{v % 10000}, recovered to {result.target}")
    for step, secs in result.timings.items():
        _out(f"  {step:<10} {secs:7.2f} s")
    _out(f"  verification: {'PASSED' if result.ok else 'FAILED'}")
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    """Preflight + archive report (+ the storage's problems, when it reports them)."""
    from pgsnap.model import encode_value  # noqa: PLC0415

    report = _load(args)[0].check()
    if args.json:
        _out(
            _json_out(
                {
                    "ok": report.ok,
                    "findings": [str(f) for f in report.findings],
                    "archiver_healthy": None
                    if report.archiver is None
                    else report.archiver.healthy,
                    "wal": list(report.wal),
                    "backups": list(report.backups),
                    "unreadable": [
                        {"path": u.path, "backup_id": u.backup_id, "error": u.error}
                        for u in report.unreadable
                    ],
                    "storage_problems": [encode_value(p) for p in report.storage_problems],
                },
            )
        )
    else:
        _out(report.explain())
    return EXIT_OK if report.ok else EXIT_CHECK


def _alone(args: argparse.Namespace) -> dict[str, bool]:
    """``alone=True`` for a backup run with ``--alone`` (nothing otherwise)."""
    return {"alone": True} if args.alone else {}


def cmd_backup(args: argparse.Namespace) -> int:
    """Take a backup."""
    cluster, timeouts = _load(args)
    due: dict[str, float] = {}
    if args.if_older_than is not None:
        due["due_after"] = _duration(args.if_older_than).total_seconds()
    if not args.dry_run:
        # A recovery or an expiry runs (with --alone: any run): fail at once.
        cluster.check_not_busy("backup", **_alone(args))
    lag: dict[str, int] = {}
    if args.max_standby_lag is not None:
        from pgsnap.copies.bandwidth import parse_size  # noqa: PLC0415

        lag["max_standby_lag"] = parse_size(args.max_standby_lag, "--max-standby-lag")
    try:
        plan = cluster.plan_backup(
            args.label,
            checkpoint=args.checkpoint or ("spread" if args.spread else "fast"),
            wal_timeout=timeouts.wal,
            **lag,
            **due,
        )
        if args.dry_run:
            _out(plan.to_json() if args.json else plan.explain())
            return EXIT_OK
        cluster.execute(plan, on_event=_reporter(args), **_alone(args))
    except BackupNotDue as exc:
        _out(json.dumps({"taken": False, "reason": exc.message}) if args.json else exc.message)
        return EXIT_OK
    record = cluster.backup_of(plan)
    if args.json:
        from pgsnap.model import to_json  # noqa: PLC0415

        _out(to_json(record))
    else:
        _out(
            f"backup {record.id} {record.state.value}: {record.start_lsn} .. {record.stop_lsn}, "
            f"{record.backup_mode_seconds:.3f} s in backup mode"
        )
    return EXIT_OK


def _listed_backups(args: argparse.Namespace, cluster: Any) -> Any:
    """The backups, with the next expiry's forecast when a retention policy is set
    (flags, else ``[retention]``); without the forecast (and a warning) when the
    storage or the archive cannot be observed."""
    policy = _policy(args) if _has_policy(args) else None
    if policy is None:
        return cluster.backups()
    try:
        return cluster.backups(policy)
    except (ConfigurationError, InputError):
        raise
    except PgsnapError as exc:
        _err(f"pgsnap: warning: what the next expire removes is not shown: {exc}")
        return cluster.backups()


def _retention_json(backups: Any, b: Any) -> dict[str, Any]:
    forecast = backups.forecast
    outlook = forecast.backups.get(b.id)
    return {
        "policy": forecast.policy,
        "removed_by_next_expire": bool(outlook and outlook.removed),
        "reasons": list(outlook.reasons) if outlook else [],
        "marked_unusable": outlook.marked_unusable if outlook else None,
        "secure": bool(outlook and outlook.secure),
        "secure_until": outlook.secure_until.isoformat()
        if outlook and outlook.secure_until
        else None,
        "notes": list(backups.notes(b)),
    }


def cmd_list(args: argparse.Namespace) -> int:
    """List backups (and, with a retention policy, what the next expire removes)."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    if not _has_policy(args):  # the catalog alone: no Cluster, no planner imported
        from pgsnap.catalog import scan_catalog  # noqa: PLC0415
        from pgsnap.planner.forecast import BackupList  # noqa: PLC0415

        catalog = _catalog_alone(args)
        documents = getattr(catalog, "documents_text", None)
        if args.json and callable(documents):  # without building the records
            text, unreadable = documents()
            _warn_unreadable_entries(unreadable)
            _out(json.dumps(json.loads(text), indent=2) if sys.stdout.isatty() else text)
            return EXIT_OK
        scan = scan_catalog(catalog)
        backups = BackupList(scan.records, scan.unreadable, drills=catalog.list_drills())
        backend = _cluster_arguments(args)["backend"] if _on_mock_storage(args) else None
    else:
        cluster = _load(args)[0]
        backups = _listed_backups(args, cluster)
        catalog, backend = cluster.catalog, cluster.backend
    if args.json:
        _warn_unreadable_entries(backups.unreadable)
        document = getattr(catalog, "document", to_dict)  # from what it read
        docs = []
        for b in backups:
            doc = document(b)
            if backups.forecast is not None:
                doc["retention"] = _retention_json(backups, b)
            docs.append(doc)
        _out(_json_out(docs))
        return EXIT_OK
    if backups.forecast is not None:
        gone = backups.forecast.removed
        _out(
            f"retention policy: {backups.forecast.policy}; the next `pgsnap expire` removes "
            + (f"{len(gone)} backup(s): {', '.join(gone)}" if gone else "none")
        )
        for warning in backups.forecast.warnings:
            _out(f"  note: {warning}")
    if not backups and not backups.unreadable:
        _out("no backups")
    for b in backups:
        stop = b.stop_time.isoformat(timespec="seconds") if b.stop_time else "-"
        _out(
            f"{b.id:<22} {b.state.value:<16} tli {b.start_timeline} {b.start_lsn!s:>12} .. "
            f"{b.stop_lsn or '-'!s:>12}  {stop}  {b.label}"
            + (f"  ({b.failure_reason})" if b.failure_reason else "")
            + "".join(f"  [{note}]" for note in backups.notes(b))
        )
    for entry in backups.unreadable:
        _out(f"UNREADABLE {entry}")
    _mock_space(backend)
    return EXIT_OK


def _mock_space(backend: Any) -> None:
    """On the mock storage, say how much room its snapshots take (it copies files where
    an array would share blocks: a test machine's disk fills with them)."""
    if backend is None:
        return
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415

    if not isinstance(backend, MockBackend):
        return
    on_disk, files = backend.disk_usage()
    if files:
        _out(
            f"mock storage: its snapshots take {_size(on_disk)} on disk for {_size(files)} of "
            "files (unchanged files are shared between snapshots)"
        )


def _size(n: int) -> str:
    """Bytes for a reader: ``512 B``, ``3.4 MiB``, ``1.2 GiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


_DURATION_UNITS: Final = {
    "min": 60,
    "s": 1,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "y": 365 * 86400,
}


def _duration(text: str) -> dt.timedelta:
    """``7d``, ``12h``, ``90min``, ``2w``, ``1y`` (365 days) or seconds as a number."""
    raw = text.strip().lower()
    for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
        if raw.endswith(unit):
            number = raw[: -len(unit)]
            break
    else:
        unit, number = "s", raw
    try:
        value = float(number)
    except ValueError:
        raise InputError(
            f"not a duration: {text!r}",
            hint="write a number with a unit: 30min, 12h, 7d, 2w",
        ) from None
    return dt.timedelta(seconds=value * _DURATION_UNITS[unit])


def _policy(args: argparse.Namespace) -> Any:
    """The retention policy: the flags, else the configuration's ``[retention]``."""
    from pgsnap.planner.expiry import RetentionPolicy  # noqa: PLC0415

    conf = load_retention(_source(args))
    redundancy = args.redundancy if args.redundancy is not None else conf.get("redundancy")
    window = args.window if args.window is not None else conf.get("window")
    levels = {
        key: (getattr(args, key) if getattr(args, key) is not None else conf.get(key, 0))
        for key in ("hourly", "daily", "weekly", "monthly")
    }
    orphans = getattr(args, "orphans_after", None)
    orphans = orphans if orphans is not None else conf.get("orphans_after")
    safety = getattr(args, "safety_after", None)
    safety = safety if safety is not None else conf.get("safety_after")
    return RetentionPolicy(
        redundancy=redundancy,
        window=None if window is None else _duration(str(window)),
        orphans_after=None if orphans is None else _duration(str(orphans)),
        safety_after=None if safety is None else _duration(str(safety)),
        **levels,
    )


def _has_policy(args: argparse.Namespace) -> bool:
    """True when the flags or the configuration's ``[retention]`` set any rule
    (``orphans_after`` alone keeps no backup: it is no policy)."""
    conf = load_retention(_source(args))
    return any(
        getattr(args, k, None) is not None or conf.get(k)
        for k in RETENTION_KEYS
        if k not in ("orphans_after", "safety_after")
    )


def cmd_expire(args: argparse.Namespace) -> int:
    """Apply a retention policy (or show what it would delete)."""
    cluster = _load(args)[0]
    if not args.dry_run:
        # Before planning, as recover: an expiry never runs beside a backup or a
        # recovery, even one that would find nothing to delete (what it plans from
        # is changing under it).
        cluster.check_not_busy("expiry")
    plan = cluster.plan_expiry(_policy(args))
    if args.json:
        _out(plan.to_json())
    else:
        _out(plan.explain())
    # With --json, stdout holds the plan's JSON alone (a fleet run parses it).
    say = _err if args.json else _out
    if args.dry_run or not plan.steps:
        if not plan.steps:
            say("nothing to delete")
        return EXIT_OK
    _execute(cluster, plan, args)
    say(f"deleted: {len(plan.lost)} item(s)")
    return EXIT_OK


def cmd_rebuild_catalog(args: argparse.Namespace) -> int:
    """Recreate missing catalog records from the storage and the archive."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    report = _load(args)[0].rebuild_catalog(dry_run=args.dry_run, log_timezone=args.log_timezone)
    if args.json:
        _out(
            _json_out(
                {
                    "dry_run": report.dry_run,
                    "rebuilt": [to_dict(r) for r in report.rebuilt],
                    "skipped": [{"what": w, "why": why} for w, why in report.skipped],
                    "existing": list(report.existing),
                },
            )
        )
    else:
        _out(report.explain())
    return EXIT_OK


def cmd_delete(args: argparse.Namespace) -> int:
    """Delete one backup (refused while it is pinned, secure or unfinished)."""
    cluster = _load(args)[0]
    plan = cluster.plan_delete(args.backup)
    _out(plan.explain())
    if args.dry_run:
        return EXIT_OK
    _execute(cluster, plan, args)
    if any(step.action == "catalog.delete_backup" for step in plan.steps):
        _out(f"backup {args.backup} deleted")
    else:
        _out(f"the snapshots of backup {args.backup} deleted; its record stays for its copies")
    return EXIT_OK


def cmd_safety_list(args: argparse.Namespace) -> int:
    """List the safety snapshots recoveries recorded."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    records = _load(args)[0].safety_snapshots()
    if args.json:
        _out(_json_out([to_dict(r) for r in records]))
        return EXIT_OK
    if not records:
        _out("no safety snapshots")
    now = dt.datetime.now(dt.UTC)
    for r in records:
        days = (now - r.created_at).total_seconds() / 86400
        _out(
            f"{r.name:<22} {r.created_at.isoformat(timespec='seconds')} ({days:.1f} d)  "
            f"recovery {r.plan_id[:12]} from backup {r.backup_id} to {r.target}  "
            f"volumes {', '.join(sorted(r.snapshots))}"
        )
    return EXIT_OK


def cmd_safety_delete(args: argparse.Namespace) -> int:
    """Delete one safety snapshot (its snapshot group and record)."""
    cluster = _load(args)[0]
    plan = cluster.plan_delete_safety(args.name)
    _out(plan.to_json() if args.json else plan.explain())
    if args.dry_run:
        return EXIT_OK
    _execute(cluster, plan, args)
    _out(f"safety snapshot {args.name} deleted")
    return EXIT_OK


def cmd_pin(args: argparse.Namespace) -> int:
    """Pin a backup: retention keeps it (forever, or until a time)."""
    until = None if not args.until else _until(args.until)
    record = _load(args)[0].pin(args.backup, args.reason, until=until)
    _out(f"backup {record.id} pinned {'forever' if until is None else f'until {until}'}")
    return EXIT_OK


def _until(text: str) -> dt.datetime:
    """``--until``: a time with a zone (``2027-01-01T00:00:00+00:00``), or a duration
    from now (``30d``, ``12h``, ``2w``)."""
    shown = text if len(text) <= 60 else text[:57] + "..."
    hint = "give a time with a zone, e.g. 2027-01-01T00:00:00+00:00, or a duration from now: 30d"
    try:
        until = dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            span = _duration(text)
        except InputError:
            raise InputError(
                f"--until {shown!r} is neither a time nor a duration", hint=hint
            ) from None
        if span.total_seconds() <= 0:
            raise InputError(f"--until {shown!r} is not in the future", hint=hint) from None
        return dt.datetime.now(dt.UTC) + span
    if until.tzinfo is None:
        raise InputError(f"--until {shown!r} has no time zone", hint=hint)
    return until


def cmd_copy(args: argparse.Namespace) -> int:
    """Copy a backup off the array: its snapshots' trees to a copy target."""
    cluster = _load(args)[0]
    if args.dry_run:
        _out(cluster.plan_copy(args.backup, args.to, copy_id=args.copy_id).explain())
        return EXIT_OK
    copy = cluster.copy(args.backup, args.to, copy_id=args.copy_id, on_event=_reporter(args))
    _out(
        f"copy {copy.copy_id} of backup {args.backup} in {copy.target}: {copy.files} files, "
        f"{copy.bytes_read / 2**20:.1f} MiB read, {copy.bytes_sent / 2**20:.1f} MiB sent "
        f"({copy.chunks_new} chunks new, {copy.chunks_reused} already there) "
        f"in {copy.seconds:.1f} s; "
        + (
            f"it carries the backup's WAL ({len(copy.wal)} files)"
            if copy.wal
            else "it carries no WAL (the archive no longer had it all): restoring it "
            "needs the WAL archive"
        )
        + (f"; encrypted with key {copy.key_fingerprint}" if copy.key_fingerprint else "")
    )
    return EXIT_OK


def cmd_copy_key_generate(args: argparse.Namespace) -> int:
    """Write a new copy key file (mode 0600, never over an existing file)."""
    from pgsnap.copies.keys import CopyKey  # noqa: PLC0415 - the copies package only when asked

    key = CopyKey.generate(args.path)
    _out(
        f"wrote a new copy key to {args.path} (mode 0600): fingerprint {key.fingerprint}\n"
        "keep a copy of this file somewhere safe, away from the copies: without it, "
        "the copies made with it cannot be read"
    )
    return EXIT_OK


def cmd_verify_copy(args: argparse.Namespace) -> int:
    """Check a copy's chunks: all of them, or a sample."""
    report = _load(args)[0].verify_copy(args.copy, args.to, sample=args.sample)
    _out(report.explain())
    return EXIT_OK if report.ok else EXIT_CHECK


def _copy_policy(args: argparse.Namespace, cluster: Any) -> Any:
    """The copy retention policy: the configuration's ``[copies.retention]``, each flag
    given replacing its key."""
    from pgsnap.planner.copy_expiry import COPY_LEVELS, CopyRetentionPolicy  # noqa: PLC0415

    base = cluster.copy_retention or CopyRetentionPolicy()
    changes: dict[str, Any] = {
        key: getattr(args, key)
        for key in ("redundancy", *COPY_LEVELS)
        if getattr(args, key) is not None
    }
    for key in ("window", "max_age"):
        value = getattr(args, key)
        if value is not None:
            changes[key] = _duration(value)
    return attrs.evolve(base, **changes)


def cmd_expire_copies(args: argparse.Namespace) -> int:
    """Apply copy retention to one copy target (or show what it would delete)."""
    from pgsnap.operations.copy_retention import gc_report  # noqa: PLC0415

    cluster = _load(args)[0]
    plan = cluster.plan_copy_expiry(_copy_policy(args, cluster), args.to)
    _out(plan.to_json() if args.json else plan.explain())
    if args.dry_run or not plan.steps:
        if not plan.steps and not args.json:
            _out("nothing to delete")
        return EXIT_OK
    result = _execute(cluster, plan, args)
    gc = result.outputs.get("collect-garbage", {})
    if gc.get("busy"):
        _err(
            f"pgsnap: warning: garbage collection deferred: {gc.get('why')} (hint: run "
            "`pgsnap copy-gc` once the copies have ended)"
        )
    if not args.json:
        _out(f"deleted: {len(plan.lost)} copies")
        report = gc_report(gc)
        if report is not None:
            _out(report.explain())
    return EXIT_OK


def cmd_copy_gc(args: argparse.Namespace) -> int:
    """Remove the chunks no copy needs from a copy target (mark and sweep)."""
    from pgsnap.operations.copy_retention import gc_outputs  # noqa: PLC0415

    cluster = _load(args)[0]
    report = cluster.collect_copy_garbage(
        args.to,
        dry_run=args.dry_run,
        stale_after=_duration(args.stale_after),
        on_event=_reporter(args),
    )
    _out(_json_out(gc_outputs(report)) if args.json else report.explain())
    return EXIT_OK


def cmd_unpin(args: argparse.Namespace) -> int:
    """Remove a backup's pin."""
    record = _load(args)[0].unpin(args.backup)
    _out(f"backup {record.id} unpinned")
    return EXIT_OK


def cmd_plan_recovery(args: argparse.Namespace) -> int:
    """Print a recovery plan."""
    target = _target(args)  # report a bad target before touching the configuration
    cluster, timeouts = _load(args)
    plan = _plan_recovery(args, cluster, timeouts, target)
    _out(plan.to_json() if args.json else plan.explain())
    if args.html:
        _write_file(args.html, cluster.plan_html(plan))
        _err(f"pgsnap: wrote {args.html}")
    return EXIT_OK


def _write_file(path: str, text: str) -> None:
    """Write a page or a picture the user asked for (replaced atomically)."""
    target = Path(path)
    try:
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(target)
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="name a file in a directory you can write to",
        ) from None


def cmd_timeline(args: argparse.Namespace) -> int:
    """What is recoverable: timelines, WAL coverage and gaps, backups and their windows."""
    from pgsnap.timeline.svg import render_html, render_svg  # noqa: PLC0415

    cluster = _load(args)[0]
    view = cluster.timeline()
    if args.svg:
        _write_file(args.svg, render_svg(view))
        _err(f"pgsnap: wrote {args.svg}")
    if args.html:
        _write_file(args.html, render_html(view))
        _err(f"pgsnap: wrote {args.html}")
    if args.json:
        from pgsnap.model import encode_value  # noqa: PLC0415

        _out(_json_out(encode_value(view)))
        return EXIT_OK
    for lane in view.lanes:
        parent = (
            f", forked from timeline {lane.parent} at {lane.switchpoint}"
            if lane.parent is not None
            else ""
        )
        runs = ", ".join(f"{r.start}..{r.end}" for r in lane.runs) or "no WAL archived"
        _out(f"timeline {lane.timeline}{parent}: {runs}")
    for gap in view.gaps:
        _out(
            f"  GAP on timeline {gap.timeline}: {gap.segments} segment(s) missing from "
            f"{gap.first_missing} ({gap.start}..{gap.end})"
        )
    done = [b for b in view.backups if b.recoverable_to is not None]
    _out(f"{len(view.backups)} backups, {len(done)} recoverable:")
    for b in done[-10:]:
        _out(
            f"  {b.id:<22} timeline {b.timeline}  recoverable from {b.stop} to "
            f"{b.recoverable_to}" + ("  [pinned]" if b.pinned else "")
        )
    if len(done) > 10:
        _out(f"  (and {len(done) - 10} older; --html FILE draws them all)")
    for rp in view.restore_points:
        _out(f"restore point {rp.name!r} at {rp.lsn} on timeline {rp.timeline}")
    return EXIT_OK


def cmd_recover(args: argparse.Namespace) -> int:
    """Plan and execute a recovery."""
    target = _target(args)
    cluster, timeouts = _load(args)
    cluster.check_not_busy("recovery")  # before planning: a second recover fails at once
    plan = _plan_recovery(args, cluster, timeouts, target)
    _out(plan.explain())
    if not args.yes:
        if not sys.stdin.isatty():
            _err("refusing to recover without confirmation: pass --yes (stdin is not a terminal)")
            return EXIT_USAGE
        answer = input("Execute this plan? Type 'yes' to continue: ")
        if answer.strip() != "yes":
            _err("not confirmed; nothing was changed")
            return EXIT_USAGE
    result = _execute(cluster, plan, args)
    _out(_recovered(result))
    return EXIT_OK


def _recovered(result: Any) -> str:
    """What a finished recovery reached: timeline, LSN, the last transaction, the log."""
    waited = result.outputs.get("wait-recovery", {})
    verified = result.outputs.get("verify", {})
    timeline = verified.get("timeline") or waited.get("timeline")
    lsn = verified.get("replay_lsn") or waited.get("replay_lsn")
    lines = [f"recovery finished in {result.total_seconds:.2f} s"]
    state = waited.get("state")
    if state:
        lines.append(
            f"  server {state}"
            + (f" on timeline {timeline}" if timeline else "")
            + (f", replayed to {lsn}" if lsn else "")
        )
    last = waited.get("last_transaction")
    lines.append(f"  last transaction replayed: {last or 'not known (the log does not say)'}")
    if waited.get("log_path"):
        lines.append(f"  server log: {waited['log_path']}")
    return "\n".join(lines)


def cmd_resume(args: argparse.Namespace) -> int:
    """Resume (or clean up) plans whose execution stopped half way."""
    cluster = _load(args)[0]
    pending = cluster.interrupted()
    if not pending:
        _out("nothing to resume")
        return EXIT_OK
    for plan in pending:
        _out(plan.explain())
    if not args.yes:
        _out("nothing was done: pass --yes to resume the plan(s) above")
        return EXIT_OK
    for plan in pending:
        _execute(cluster, plan, args)
        _out(f"{plan.kind} plan {plan.id[:12]} finished")
    return EXIT_OK


def cmd_clone_create(args: argparse.Namespace) -> int:
    """Plan and make a clone."""
    target = _target(args)
    cluster, timeouts = _load(args)
    plan = cluster.plan_clone(
        target,
        name=args.clone,
        host=args.host,
        at=args.at,
        port=args.port,
        action="pause" if args.pause else "promote",
        backup_id=args.backup,
        timeline=args.timeline,
        listen_addresses=args.listen,
        mask_sql=args.mask_sql,
        mask_dbname=args.mask_db,
        mask_script=args.mask_script,
        server_timeout=timeouts.server,
        recovery_timeout=timeouts.recovery,
    )
    _out(plan.to_json() if args.json else plan.explain())
    if args.dry_run:
        return EXIT_OK
    _execute(cluster, plan, args)
    record = cluster.catalog.get_clone(str(plan.summary["clone"]))
    _out(
        f"clone {record.name} is ready: psql -h {record.at} -p {record.port} "
        f"(data directory {record.data_directory}); destroy it with "
        f"pgsnap clone destroy {record.name}"
    )
    return EXIT_OK


def cmd_clone_list(args: argparse.Namespace) -> int:
    """List the recorded clones (with their size where the storage reports it)."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    cluster = _load(args)[0]
    records = cluster.clones()
    sizes: dict[str, int | None] = {}
    for r in records:
        total: int | None = 0
        for v in r.volumes:
            try:
                size = cluster.backend.get_volume(v.volume_id).size_bytes if v.volume_id else None
            except PgsnapError:
                size = None
            total = None if size is None or total is None else total + size
        sizes[r.name] = total
    if args.json:
        _out(_json_out([{**to_dict(r), "size_bytes": sizes[r.name]} for r in records]))
        return EXIT_OK
    if not records:
        _out("no clones")
    for r in records:
        size = sizes[r.name]
        _out(
            f"{r.name:<20} {r.state.value:<9} {r.purpose:<6} backup {r.backup_id} to {r.target}  "
            f"{r.data_directory} port {r.port}  since "
            f"{r.created_at.isoformat(timespec='seconds')} by {r.created_by}"
            + ("" if size is None else f"  {size / 2**20:.0f} MiB")
        )
    return EXIT_OK


def cmd_clone_destroy(args: argparse.Namespace) -> int:
    """Destroy a clone."""
    cluster = _load(args)[0]
    plan = cluster.plan_clone_destroy(args.clone)
    _out(plan.to_json() if args.json else plan.explain())
    if args.dry_run:
        return EXIT_OK
    _execute(cluster, plan, args)
    _out(f"clone {args.clone} destroyed")
    return EXIT_OK


def _shared_catalog(args: argparse.Namespace) -> Any:
    """The configuration's catalog, which must be in PostgreSQL."""
    from pgsnap.catalog.postgres import PostgresCatalog  # noqa: PLC0415

    catalog = _load(args)[0].catalog
    if not isinstance(catalog, PostgresCatalog):
        raise ConfigurationError(
            f"the catalog of {args.config} is {catalog!r}, not a catalog in PostgreSQL",
            hint="set [catalog] conninfo and cluster to keep the catalog in PostgreSQL "
            "(docs/cli.md, 'A catalog shared by backup servers')",
        )
    return catalog


def cmd_catalog_migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the catalog's schema in PostgreSQL."""
    from pgsnap.catalog.postgres import SCHEMA_VERSION  # noqa: PLC0415

    catalog = _shared_catalog(args)
    applied = catalog.migrate(dry_run=args.dry_run)
    verb = "to apply" if args.dry_run else "applied"
    for version, what in applied:
        _out(f"migration {version} {verb}: {what}")
    if not applied:
        _out(f"the catalog schema {catalog.schema} is at version {SCHEMA_VERSION}: nothing to do")
    return EXIT_OK


def cmd_catalog_import(args: argparse.Namespace) -> int:
    """Copy a directory catalog's records into the configuration's catalog."""
    from pgsnap.catalog import DirectoryCatalog, copy_records  # noqa: PLC0415

    source_dir = Path(args.directory)
    if not source_dir.is_dir():
        raise ConfigurationError(
            f"{source_dir} is not a directory",
            hint="name the [catalog] path of the configuration whose records to import",
        )
    catalog = _shared_catalog(args)
    counts = copy_records(DirectoryCatalog(source_dir), catalog)
    _out(
        f"imported into {catalog.where}: {counts['backups']} backups, {counts['safety']} "
        f"safety snapshots, {counts['clones']} clones, {counts['drills']} drills"
        + (f"; {counts['unreadable']} unreadable, not imported" if counts["unreadable"] else "")
    )
    return EXIT_FAILED if counts["unreadable"] else EXIT_OK


def cmd_catalog_fleet(args: argparse.Namespace) -> int:
    """Every cluster in the shared catalog: its newest backup and last drill."""
    catalog = _shared_catalog(args)
    if args.older_than is not None:
        rows = catalog.stale(_duration(args.older_than), drills=args.drills, timeline=args.timeline)
    else:
        rows = catalog.fleet(args.timeline)
    if args.json:
        _out(
            _json_out(
                [
                    {
                        "cluster": r.cluster,
                        "newest_backup": None if r.newest is None else r.newest.id,
                        "newest_backup_start": None
                        if r.newest is None
                        else r.newest.start_time.isoformat(),
                        "last_drill": None if r.last_drill is None else r.last_drill.isoformat(),
                    }
                    for r in rows
                ],
            )
        )
        return EXIT_OK
    if not rows:
        _out("no clusters" if args.older_than is None else "every cluster is recent enough")
    for r in rows:
        newest = (
            "no backup"
            if r.newest is None
            else (f"{r.newest.id} ({r.newest.start_time.isoformat(timespec='seconds')})")
        )
        drill = "never" if r.last_drill is None else r.last_drill.isoformat(timespec="seconds")
        _out(f"{r.cluster:<24} newest {newest:<45} last drill {drill}")
    return EXIT_OK


def cmd_catalog_expirable(args: argparse.Namespace) -> int:
    """What a retention policy would expire in every cluster of the shared catalog."""
    catalog = _shared_catalog(args)
    policy = _policy(args)
    rows = catalog.expirable(policy, every_cluster=not args.this_cluster)
    if args.json:
        _out(
            _json_out(
                [
                    {
                        "cluster": r.cluster,
                        "backup": r.backup_id,
                        "state": r.state.value,
                        "consistent_at": r.consistent_at.isoformat(),
                        "action": r.action,
                        "reason": r.reason,
                    }
                    for r in rows
                ],
            )
        )
        return EXIT_OK
    for r in rows:
        what = "snapshots only (its copies keep it)" if r.action == "snapshots" else "backup"
        _out(
            f"{r.cluster:<24} {r.backup_id:<24} {r.state.value:<7} "
            f"{r.consistent_at.isoformat(timespec='seconds'):<26} {what}"
        )
    clusters = len({r.cluster for r in rows})
    snapshots = sum(r.action == "snapshots" for r in rows)
    _out(
        f"{policy.describe()}: {len(rows) - snapshots} backups and the snapshots of "
        f"{snapshots} more would go, in {clusters} clusters"
        if rows
        else f"{policy.describe()}: nothing would go"
    )
    return EXIT_OK


def cmd_standby_create(args: argparse.Namespace) -> int:
    """Plan and seed a standby."""
    cluster, timeouts = _load(args)
    plan = cluster.plan_seed_standby(
        args.name,
        primary_conninfo=args.primary_conninfo,
        slot=args.slot or "",
        backup_id=args.backup,
        host=args.host,
        at=args.at,
        port=args.port,
        listen_addresses=args.listen,
        server_timeout=timeouts.server,
        catch_up_timeout=timeouts.recovery,
    )
    _out(plan.to_json() if args.json else plan.explain())
    if args.dry_run:
        return EXIT_OK
    _execute(cluster, plan, args)
    record = cluster.catalog.get_clone(args.name)
    _out(
        f"standby {record.name} streams from the primary through slot {record.slot}: "
        f"port {record.port}, data directory {record.data_directory}; destroy it with "
        f"pgsnap standby destroy {record.name}"
    )
    return EXIT_OK


def cmd_standby_list(args: argparse.Namespace) -> int:
    """List the standbys pgsnap seeded."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    records = _load(args)[0].standbys()
    if args.json:
        _out(_json_out([to_dict(r) for r in records]))
        return EXIT_OK
    if not records:
        _out("no standbys")
    for r in records:
        _out(
            f"{r.name:<20} {r.state.value:<9} from backup {r.backup_id}  slot {r.slot}  "
            f"{r.data_directory} port {r.port}  since "
            f"{r.created_at.isoformat(timespec='seconds')} by {r.created_by}"
        )
    return EXIT_OK


def cmd_standby_destroy(args: argparse.Namespace) -> int:
    """Destroy a seeded standby and its slot."""
    cluster = _load(args)[0]
    plan = cluster.plan_standby_destroy(args.name)
    _out(plan.to_json() if args.json else plan.explain())
    if args.dry_run:
        return EXIT_OK
    _execute(cluster, plan, args)
    _out(f"standby {args.name} destroyed, its slot dropped")
    return EXIT_OK


def cmd_drill(args: argparse.Namespace) -> int:
    """Run restore drills."""
    from pgsnap.clones import drill_html, drill_table  # noqa: PLC0415
    from pgsnap.model import to_dict  # noqa: PLC0415

    target = _target(args)
    cluster, timeouts = _load(args)
    backups: list[str | None] = [args.backup]
    if args.newest or args.all_since:
        usable = [b for b in cluster.backups() if b.is_usable]
        if args.all_since:
            since = _until(args.all_since)
            usable = [b for b in usable if b.start_time >= since]
        else:
            usable = usable[-1:]
        if not usable:
            _err("pgsnap: no usable backup to drill")
            return EXIT_FAILED
        backups = [b.id for b in usable]
    drills = [
        cluster.drill(
            target,
            backup_id=backup,
            checks=args.check,
            keep_on_failure=args.keep_on_failure,
            on_event=_reporter(args),
            server_timeout=timeouts.server,
            recovery_timeout=timeouts.recovery,
        )
        for backup in backups
    ]
    if args.json:
        _out(_json_out([to_dict(d) for d in drills]))
    else:
        _out(_table(drill_table(drills)))
        for d in drills:
            for c in d.checks:
                _out(f"  {d.id} {c.name}: {'ok' if c.ok else 'FAILED'} {c.detail}")
            if d.error:
                _out(f"  {d.id}: {d.error}")
            if d.kept:
                _out(f"  {d.id}: clone {d.clone} kept (pgsnap clone destroy {d.clone})")
    if args.html:
        Path(args.html).write_text("\n".join(drill_html(d) for d in drills), encoding="utf-8")
    return EXIT_OK if all(d.ok for d in drills) else EXIT_FAILED


def cmd_agent(args: argparse.Namespace) -> int:
    """Serve commands from forks of this process until SIGTERM (docs/reference/agent.md)."""
    from pgsnap.agent import ENV, serve  # noqa: PLC0415

    path = args.socket or os.environ.get(ENV)
    if not path:
        raise ConfigurationError(
            "the agent needs a socket to listen on",
            hint=f"pass --socket PATH, or set {ENV}=PATH (the same the commands are given)",
        )
    quiet = args.quiet

    def ready() -> None:
        if not quiet:
            _err(f"pgsnap agent: serving on {path} (process {os.getpid()}); SIGTERM ends it")

    parser = _parser()  # built once here, not in every fork (20 ms of a command)

    def forked(argv: list[str]) -> int:
        """What the agent's forks run: the ``pgsnap`` command, routed as its entry
        point routes it (``wal-push``, ``wal-get``, ``wal-prefetch`` to their own
        module)."""
        from pgsnap._argv import WAL_COMMANDS, set_collector, subcommand  # noqa: PLC0415

        if subcommand(argv) in WAL_COMMANDS:
            from pgsnap.archives.commands import main as wal_main  # noqa: PLC0415

            return wal_main(argv)
        set_collector(argv)  # the fork is a process of its own, as the command's is
        return _guarded(argv, parser)

    serve(os.path.abspath(path), command=forked, on_ready=ready)
    return EXIT_OK


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _index_run_json(run: Any) -> dict[str, Any]:
    """``pgsnap wal --index --json``: what the run read, as plain data."""
    return {
        "backup_id": run.backup_id,
        "timeline": run.timeline,
        "start": None if run.start is None else str(run.start),
        "end": None if run.end is None else str(run.end),
        "read": run.read,
        "indexed": run.indexed,
        "added": run.added,
    }


def cmd_wal(args: argparse.Namespace) -> int:
    """Report the WAL archive per timeline."""
    cluster = _load(args)[0]  # an unreadable catalog file is named as it is read
    if args.index:
        quiet = getattr(args, "quiet", False)
        run = cluster.index_wal(None if quiet else lambda message, _data: _err(message))
        _out(_json_out(_index_run_json(run)) if args.json else run.explain())
        return EXIT_OK
    report = cluster.wal_report()
    _out(_json_out(report.to_dict()) if args.json else report.explain())
    return EXIT_OK


# --------------------------------------------------------------------------- parser


_DESCRIPTION: Final = """\
Storage-snapshot backups and point-in-time recovery of PostgreSQL.

  pgsnap demo                          the whole job on a throwaway cluster
  pgsnap check         -c pgsnap.toml  preflight findings, archiver, WAL, backups
  pgsnap backup        -c pgsnap.toml  take a snapshot backup
  pgsnap list          -c pgsnap.toml  the backups in the catalog
  pgsnap plan-recovery -c pgsnap.toml  [--time T | --lsn L | --xid X | --name N]
  pgsnap recover       -c pgsnap.toml  [the same target] [--yes]
  pgsnap COMMAND --help                one command's options

Docs: docs/cli.md (every command and the configuration file)."""
"""What ``pgsnap --help`` says above the commands (plain text: no markup)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pgsnap",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n" + "\n".join(f"  {k:>3}  {v}" for k, v in EXIT_CODES.items()),
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # -v also after the subcommand (pgsnap check -c x -vv); SUPPRESS keeps a -v
    # given before it when none is given after.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="more log output (-vv: debug)",
    )
    shown = common.add_mutually_exclusive_group()
    shown.add_argument(
        "-q", "--quiet", action="store_true", help="no progress on stderr (results still print)"
    )
    shown.add_argument(
        "--json-events",
        action="store_true",
        help="progress as one JSON object per event and line on stderr (for programs)",
    )

    d = sub.add_parser(
        "demo", parents=[common], help="back up and recover a throwaway cluster, end to end"
    )
    d.add_argument("--bindir", help="PostgreSQL server binaries (default: found automatically)")
    d.add_argument("--keep", action="store_true", help="keep the temporary cluster")
    d.add_argument(
        "--backend",
        choices=("mock", "btrfs"),
        default="mock",
        help="mock: directory-backed mock volumes (default); btrfs: subvolumes of a "
        "loop-mounted btrfs made for the demo (root, btrfs and loop devices needed)",
    )
    d.set_defaults(func=cmd_demo)

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "-c", "--config", required=True, help="TOML configuration file (or a fleet's)"
        )
        sp.add_argument("--json", action="store_true", help="JSON output for scripts")
        fleet = sp.add_argument_group("fleets (a configuration of many clusters)")
        fleet.add_argument("--cluster", metavar="NAME", help="the fleet's cluster to act on")
        fleet.add_argument(
            "--all",
            action="store_true",
            help="every cluster of the fleet, each in a process of its own; a summary line "
            "each; exit 1 if any failed (a cluster another run holds is skipped)",
        )
        fleet.add_argument(
            "--parallel", type=int, metavar="N", help="with --all: clusters at once ([fleet])"
        )
        fleet.add_argument(
            "--per-storage",
            type=int,
            metavar="K",
            help="with --all: at most K at once on one storage system ([fleet])",
        )
        fleet.add_argument(
            "--cluster-timeout",
            metavar="DURATION",
            help="with --all: stop a cluster's run after this (e.g. 30min)",
        )
        waits = sp.add_argument_group("waits (seconds; default: the [timeouts] section)")
        timeout(waits, "connect", 10)
        timeout(waits, "catalog_lock", 10)

    def target_flags(sp: argparse.ArgumentParser) -> None:
        g = sp.add_argument_group("target (one; default: latest)")
        g.add_argument("--time", help="ISO time with a zone, e.g. '2026-11-30 12:00:00+00:00'")
        g.add_argument("--lsn", help="WAL location, e.g. 0/3000060")
        g.add_argument("--xid", type=int, help="transaction id")
        g.add_argument("--name", help="restore point name")
        g.add_argument("--immediate", action="store_true", help="stop at consistency")
        sp.add_argument("--exclusive", action="store_true", help="stop just before the target")
        sp.add_argument("--timeline", default="latest", help="latest (default), current or N")

    def retention_rules(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--redundancy", type=int, help="keep the newest N DONE backups")
        sp.add_argument("--window", help="keep every point of the last D recoverable: 7d, 12h")
        for level in ("hourly", "daily", "weekly", "monthly"):
            sp.add_argument(
                f"--{level}", type=int, help=f"keep the newest backup of each of N {level} periods"
            )

    def retention_flags(sp: argparse.ArgumentParser) -> None:
        retention_rules(sp)
        sp.add_argument(
            "--orphans-after",
            metavar="D",
            help="delete orphan snapshots (pgsnap's, named by no backup record) older than "
            "D: 1d, 12h (default: list them, delete none)",
        )
        sp.add_argument(
            "--safety-after",
            metavar="D",
            help="delete the safety snapshots recoveries recorded older than D: 14d "
            "(default: keep them until deleted by name, pgsnap safety delete)",
        )

    def timeout(group: Any, key: str, default: float) -> None:
        group.add_argument(
            f"--{key.replace('_', '-')}-timeout",
            dest=f"{key}_timeout",
            type=_seconds_arg,
            default=None,
            metavar="S",
            help=f"{TIMEOUT_KEYS[key]} (default {default:g})",
        )

    c = sub.add_parser(
        "check", parents=[common], help="preflight findings, archiver health, WAL and backups"
    )
    with_config(c)
    c.set_defaults(func=cmd_check)

    b = sub.add_parser("backup", parents=[common], help="take a snapshot backup")
    with_config(b)
    b.add_argument("--label", help="backup label (default: pgsnap <id>)")
    b.add_argument(
        "--checkpoint",
        choices=("fast", "scheduled", "next", "spread"),
        help="how backup mode starts: fast (the default: an immediate checkpoint), "
        "scheduled (wait until PostgreSQL's next timed checkpoint is due and take its "
        "place with a spread one: the gentlest), next (wait for PostgreSQL's next "
        "checkpoint to end, then a fast one) or spread (a spread checkpoint begun now)",
    )
    b.add_argument("--spread", action="store_true", help="the same as --checkpoint spread")
    timeout(b, "wal", 60)
    b.add_argument(
        "--max-standby-lag",
        metavar="SIZE",
        help="on a standby: how far (WAL bytes, e.g. 64MB) its replay may be behind for a "
        "backup (default 256MiB)",
    )
    b.add_argument(
        "--if-older-than",
        metavar="DURATION",
        help="take a backup only if the newest DONE one started longer ago than this "
        "(e.g. 23h): a scheduled run that comes twice takes one backup",
    )
    b.add_argument(
        "--alone",
        action="store_true",
        help="refuse at once if any run holds the cluster, another backup included, and "
        "hold it alone (scheduled runs: no pile-up; implied by --all)",
    )
    b.add_argument("--dry-run", action="store_true", help="print the plan only")
    b.set_defaults(func=cmd_backup)

    ls = sub.add_parser(
        "list",
        parents=[common],
        help="list backups, their pins and what the next expire removes",
        description="List the backups with their pins. With a retention policy (flags, "
        "else the configuration's [retention] section), also which backups the next "
        "`pgsnap expire` removes and why, and until when secure snapshots hold.",
    )
    with_config(ls)
    retention_flags(ls)
    ls.set_defaults(func=cmd_list)

    ex = sub.add_parser(
        "expire",
        parents=[common],
        help="apply a retention policy: delete backups and WAL it does not keep",
        description="Apply a retention policy (flags, else the configuration's [retention] "
        "section). Every deletion is planned with its reason; --dry-run shows the plan.",
    )
    with_config(ex)
    retention_flags(ex)
    ex.add_argument("--dry-run", action="store_true", help="print the plan only")
    ex.set_defaults(func=cmd_expire)

    rc = sub.add_parser(
        "rebuild-catalog",
        parents=[common],
        help="recreate missing backup records from the snapshots and the archive",
        description="Recreate the catalog records that are missing, from the storage's "
        "snapshot groups (named by backup id) and the archive's .backup files. Existing "
        "records are never overwritten; what cannot be rebuilt is listed with the reason.",
    )
    with_config(rc)
    rc.add_argument("--dry-run", action="store_true", help="show what would be rebuilt")
    rc.add_argument(
        "--log-timezone",
        metavar="ZONE",
        help="the server's log_timezone (e.g. Europe/Berlin), to read START/STOP TIME "
        "written with a zone abbreviation such as CET",
    )
    rc.set_defaults(func=cmd_rebuild_catalog)

    de = sub.add_parser("delete", parents=[common], help="delete one backup")
    with_config(de)
    de.add_argument("backup", help="the backup id")
    de.add_argument("--dry-run", action="store_true", help="print the plan only")
    de.set_defaults(func=cmd_delete)

    pn = sub.add_parser("pin", parents=[common], help="keep a backup whatever retention says")
    with_config(pn)
    pn.add_argument("backup", help="the backup id")
    pn.add_argument("--reason", required=True, help="why it is kept")
    pn.add_argument("--until", help="ISO time with a zone (default: forever)")
    pn.set_defaults(func=cmd_pin)

    cp = sub.add_parser(
        "copy",
        parents=[common],
        help="copy a backup off the array (its snapshots' files, chunked and compressed)",
        description="Copy a backup's data and tablespace snapshots, read in place, to a copy "
        "target: chunks named by their SHA-256 (only those the target lacks are sent) and, "
        "last, a manifest. The copy is recorded on the backup.",
    )
    with_config(cp)
    cp.add_argument("backup", help="the backup id")
    cp.add_argument("--to", help="the copy target directory (default: [copies] path)")
    cp.add_argument("--copy-id", help="the copy's id (default: <backup id>.<n>)")
    cp.add_argument("--dry-run", action="store_true", help="print the plan only")
    cp.set_defaults(func=cmd_copy)

    vc = sub.add_parser(
        "verify-copy",
        parents=[common],
        help="check that a copy's chunks are all there and whole",
    )
    with_config(vc)
    vc.add_argument("copy", help="the copy id")
    vc.add_argument("--to", help="the copy target directory (default: [copies] path)")
    vc.add_argument("--sample", type=float, help="check this share of the chunks (0 < SAMPLE <= 1)")
    vc.set_defaults(func=cmd_verify_copy)

    ck = sub.add_parser(
        "copy-key",
        parents=[common],
        help="keys that encrypt copies: generate",
        description="A copy key encrypts copies off the array ([copies] key_file): chunk "
        "names, chunks and manifests. Whoever holds the key file can read the copies; "
        "without it nobody can, you included.",
    )
    ck_sub = ck.add_subparsers(dest="copy_key_command", metavar="generate", required=True)
    ckg = ck_sub.add_parser(
        "generate", parents=[common], help="write a new key file (mode 0600) and its fingerprint"
    )
    ckg.add_argument("path", help="the new key file (refused if it exists)")
    ckg.set_defaults(func=cmd_copy_key_generate)
    to_help = "the copy target: a directory or s3://bucket/prefix (default: [copies] path)"
    xc = sub.add_parser(
        "expire-copies",
        parents=[common],
        help="apply copy retention: delete the copies off the array it does not keep",
        description="Apply the copies' own retention policy ([copies.retention], each flag "
        "replacing its key) to one copy target: each copy's manifest, then its record, "
        "then a garbage collection of the chunks no copy needs. With no policy nothing is "
        "deleted. The last copy of a backup whose snapshots are gone is kept unless older "
        "than max_age. --dry-run shows the plan: why each copy stays or goes.",
    )
    with_config(xc)
    xc.add_argument("--to", help=to_help)
    xc.add_argument("--redundancy", type=int, help="keep the newest N copies")
    xc.add_argument("--window", help="keep every point of the last D restorable: 30d, 8w")
    for level in ("hourly", "daily", "weekly", "monthly", "yearly"):
        xc.add_argument(
            f"--{level}", type=int, help=f"keep the newest copy of each of N {level} periods"
        )
    xc.add_argument(
        "--max-age",
        metavar="D",
        help="delete copies of backups older than D whatever the rules keep (a pinned "
        "backup's aside): 400d, 3y",
    )
    xc.add_argument("--dry-run", action="store_true", help="print the plan only")
    xc.set_defaults(func=cmd_expire_copies)

    gc = sub.add_parser(
        "copy-gc",
        parents=[common],
        help="remove from a copy target the chunks no copy needs (garbage collection)",
        description="Mark and sweep: remove every chunk no manifest in the target names. "
        "Refused (exit 6) while a copy or another collection is in progress on the target, "
        "or another run holds the cluster. --dry-run counts and writes nothing.",
    )
    with_config(gc)
    gc.add_argument("--to", help=to_help)
    gc.add_argument(
        "--stale-after",
        metavar="D",
        default="24h",
        help="take a copy's or collection's marker not refreshed for D for a dead "
        "process's (default 24h, at least 1h)",
    )
    gc.add_argument("--dry-run", action="store_true", help="count only; remove nothing")
    gc.set_defaults(func=cmd_copy_gc)

    up = sub.add_parser("unpin", parents=[common], help="remove a backup's pin")
    with_config(up)
    up.add_argument("backup", help="the backup id")
    up.set_defaults(func=cmd_unpin)

    for name, func, helptext in (
        ("plan-recovery", cmd_plan_recovery, "print the recovery plan (touches nothing)"),
        ("recover", cmd_recover, "plan and execute a recovery"),
    ):
        r = sub.add_parser(name, parents=[common], help=helptext)
        with_config(r)
        target_flags(r)
        r.add_argument("--action", default="promote", choices=["promote", "pause", "shutdown"])
        r.add_argument(
            "--wal-lost",
            action="store_true",
            help="the WAL volume is lost too (restore it from the snapshot)",
        )
        r.add_argument("--backup", help="use this backup id")
        r.add_argument(
            "--from-copy",
            nargs="?",
            const=True,
            default=False,
            metavar="COPY",
            help="restore from a copy off the array ([copies] in the configuration), "
            "the chosen backup's newest or COPY, even when the snapshots are there "
            "(without it, a copy is used only for a backup whose snapshots are gone)",
        )
        r.add_argument(
            "--no-safety-snapshot",
            action="store_true",
            help="do not snapshot the volumes' current state before restoring",
        )
        waits = r.add_argument_group("recovery waits (seconds; default: the [timeouts] section)")
        timeout(waits, "server", 120)
        timeout(waits, "recovery", 600)
        timeout(waits, "restore", 3600)
        timeout(waits, "device", 120)
        if name == "recover":
            r.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        else:
            r.add_argument(
                "--html",
                metavar="FILE",
                help="also write the plan as an HTML page, with the picture of what is "
                "recoverable and the plan's target and backup marked",
            )
        r.set_defaults(func=func)

    rs = sub.add_parser(
        "resume",
        parents=[common],
        help="resume plans whose execution stopped half way",
        description="Resume plans whose execution stopped half way. A plan's own waits "
        "(server, recovery, restore, device, WAL) are part of the plan and run as planned; "
        "make a new plan to change them.",
    )
    with_config(rs)
    rs.add_argument("--yes", action="store_true", help="do not stop at showing the plans")
    rs.set_defaults(func=cmd_resume)

    sf = sub.add_parser(
        "safety",
        parents=[common],
        help="the safety snapshots recoveries took: list, delete",
        description="Each recovery first snapshots the volumes it overwrites (unless "
        "--no-safety-snapshot): the state before it, kept until you delete it.",
    )
    sf_sub = sf.add_subparsers(dest="safety_command", metavar="list|delete", required=True)
    sfl = sf_sub.add_parser("list", parents=[common], help="the recorded safety snapshots")
    with_config(sfl)
    sfl.set_defaults(func=cmd_safety_list)
    sfd = sf_sub.add_parser("delete", parents=[common], help="delete one safety snapshot")
    with_config(sfd)
    sfd.add_argument("name", help="its name (s-<time>, as `pgsnap safety list` shows)")
    sfd.add_argument("--dry-run", action="store_true", help="print the plan only")
    sfd.set_defaults(func=cmd_safety_delete)

    cl = sub.add_parser(
        "clone",
        parents=[common],
        help="writable copies of a backup beside production: create, list, destroy",
        description="A clone is a separate PostgreSQL instance on new writable copies of a "
        "backup's snapshots, recovered to a target, with its own port, socket and "
        "cluster_name, archiving off. It never writes to the cluster, its volumes or its "
        "archive.",
    )
    cl_sub = cl.add_subparsers(dest="clone_command", metavar="create|list|destroy", required=True)
    clc = cl_sub.add_parser("create", parents=[common], help="make a clone")
    with_config(clc)
    clc.add_argument("clone", nargs="?", help="its name (default: c<time>)")
    target_flags(clc)
    clc.add_argument("--backup", help="clone this backup (default: the one the target needs)")
    clc.add_argument(
        "--host",
        help="the host it runs on, by the storage's name for it (default: the database "
        "host; another one needs a [clone_hosts.NAME] section and storage that maps volumes)",
    )
    clc.add_argument("--at", help="its directory (default: beside the data volume)")
    clc.add_argument("--port", type=int, help="its port (default: the first free from 55432)")
    clc.add_argument(
        "--listen",
        default=None,
        help="listen_addresses (default: only its Unix socket when pgsnap reaches the "
        "cluster through one, else the cluster's own listen_addresses)",
    )
    clc.add_argument(
        "--pause", action="store_true", help="pause at the target (read-only) instead of promoting"
    )
    clc.add_argument("--mask-sql", default="", help="SQL run in the clone before hand-over")
    clc.add_argument("--mask-db", default="postgres", help="database of --mask-sql")
    clc.add_argument("--mask-script", default="", help="script run before hand-over")
    clc.add_argument("--dry-run", action="store_true", help="print the plan only")
    clc.set_defaults(func=cmd_clone_create)
    cll = cl_sub.add_parser("list", parents=[common], help="the recorded clones")
    with_config(cll)
    cll.set_defaults(func=cmd_clone_list)
    cld = cl_sub.add_parser("destroy", parents=[common], help="destroy a clone, leaving nothing")
    with_config(cld)
    cld.add_argument("clone", help="its name (as `pgsnap clone list` shows)")
    cld.add_argument("--dry-run", action="store_true", help="print the plan only")
    cld.set_defaults(func=cmd_clone_destroy)

    cat = sub.add_parser(
        "catalog",
        parents=[common],
        help="a catalog in PostgreSQL shared by backup servers: migrate, import, fleet, expirable",
        description="With [catalog] conninfo and cluster, the records and the cluster lock "
        "live in PostgreSQL, shared by every backup server and cluster that uses the same "
        "database. `migrate` creates or upgrades its schema (never done implicitly); "
        "`import` copies a directory catalog's records into it; `fleet` lists every "
        "cluster with its newest backup and last drill; `expirable` what a retention "
        "policy would expire in every cluster.",
    )
    cat_sub = cat.add_subparsers(
        dest="catalog_command", metavar="migrate|import|fleet|expirable", required=True
    )
    cm = cat_sub.add_parser("migrate", parents=[common], help="create or upgrade the schema")
    with_config(cm)
    cm.add_argument("--dry-run", action="store_true", help="say what would be applied")
    cm.set_defaults(func=cmd_catalog_migrate)
    ci = cat_sub.add_parser(
        "import", parents=[common], help="copy a directory catalog's records into it"
    )
    with_config(ci)
    ci.add_argument("directory", help="the directory catalog (its [catalog] path)")
    ci.set_defaults(func=cmd_catalog_import)
    cf = cat_sub.add_parser(
        "fleet", parents=[common], help="every cluster: newest backup, last drill"
    )
    with_config(cf)
    cf.add_argument(
        "--older-than",
        metavar="DURATION",
        help="only the clusters whose newest backup (or with --drills, last drill) is older "
        "than this (e.g. 26h, 7d), or missing",
    )
    cf.add_argument("--drills", action="store_true", help="judge --older-than on drills")
    cf.add_argument("--timeline", type=int, help="the newest backup on this timeline only")
    cf.set_defaults(func=cmd_catalog_fleet)
    cx = cat_sub.add_parser(
        "expirable",
        parents=[common],
        help="what a retention policy would expire, in every cluster",
        description="The backups a retention policy (the flags, else [retention]) would "
        "expire in every cluster of the shared catalog, oldest first by cluster: the "
        "catalog's half of each cluster's expiry plan, in one query. Each cluster's "
        "`pgsnap expire` decides, with what its storage and journals say: it may keep "
        "more, never less.",
    )
    with_config(cx)
    retention_rules(cx)
    cx.add_argument(
        "--this-cluster", action="store_true", help="only the configuration's own cluster"
    )
    cx.set_defaults(func=cmd_catalog_expirable)

    sb = sub.add_parser(
        "standby",
        parents=[common],
        help="streaming standbys seeded from a backup's snapshots: create, list, destroy",
        description="A seeded standby is made of writable copies of a backup's snapshots, "
        "started as a standby of the primary with a replication slot made there first and "
        "the archive's restore_command; it is ready once it streams and has caught up. "
        "Backups are taken on a standby by `pgsnap backup` with the standby's "
        "configuration (and [primary]).",
    )
    sb_sub = sb.add_subparsers(dest="standby_command", metavar="create|list|destroy", required=True)
    sbc = sb_sub.add_parser("create", parents=[common], help="seed a standby")
    with_config(sbc)
    sbc.add_argument("name", help="its name (1-20 of a-z, 0-9 and -)")
    sbc.add_argument(
        "--primary-conninfo",
        required=True,
        help="how the standby connects to the primary, e.g. 'host=db1 user=replicator' "
        "(no password: the standby's OS user keeps it in ~/.pgpass)",
    )
    sbc.add_argument("--slot", help="its replication slot on the primary (default pgsnap_NAME)")
    sbc.add_argument("--backup", help="seed from this backup (default: the newest that can)")
    sbc.add_argument("--host", help="the host it runs on (as for clone create --host)")
    sbc.add_argument("--at", help="its directory (default: beside the data volume)")
    sbc.add_argument("--port", type=int, help="its port (default: the first free from 55432)")
    sbc.add_argument("--listen", default=None, help="listen_addresses (as for clone create)")
    sbc.add_argument("--dry-run", action="store_true", help="print the plan only")
    sbc.set_defaults(func=cmd_standby_create)
    sbl = sb_sub.add_parser("list", parents=[common], help="the standbys pgsnap seeded")
    with_config(sbl)
    sbl.set_defaults(func=cmd_standby_list)
    sbd = sb_sub.add_parser(
        "destroy", parents=[common], help="destroy a seeded standby and drop its slot"
    )
    with_config(sbd)
    sbd.add_argument("name", help="its name (as `pgsnap standby list` shows)")
    sbd.add_argument("--dry-run", action="store_true", help="print the plan only")
    sbd.set_defaults(func=cmd_standby_destroy)

    dr = sub.add_parser(
        "drill",
        parents=[common],
        help="prove backups restorable: clone, recover, check, measure, destroy",
        description="A restore drill clones a backup beside production, recovers it, "
        "checks it (the target reached, amcheck, data checksums, the server log, your SQL), "
        "measures RTO and RPO, destroys the clone and records the result. Exit 0 when every "
        "drill passed, 1 when one failed.",
    )
    with_config(dr)
    which = dr.add_mutually_exclusive_group()
    which.add_argument("--backup", help="drill this backup")
    which.add_argument("--newest", action="store_true", help="drill the newest backup")
    which.add_argument(
        "--all-since", metavar="TIME", help="drill every usable backup started since TIME"
    )
    target_flags(dr)
    dr.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="SQL",
        help="a check: SQL whose first value must be true (or return a row); repeatable",
    )
    dr.add_argument(
        "--keep-on-failure", action="store_true", help="keep a failed drill's clone to inspect"
    )
    dr.add_argument("--html", metavar="FILE", help="also write the result as HTML")
    dr.set_defaults(func=cmd_drill)

    w = sub.add_parser(
        "wal", parents=[common], help="the WAL archive per timeline: ranges and gaps"
    )
    with_config(w)
    w.add_argument(
        "--index",
        action="store_true",
        help="read the WAL a recovery from the newest backup reads into the WAL index "
        "(after backups, or from a timer), so that a later recovery plan to a time, xid "
        "or restore point reads only the segment of its target",
    )
    w.set_defaults(func=cmd_wal)
    tl = sub.add_parser(
        "timeline",
        parents=[common],
        help="what is recoverable: timelines, WAL and its gaps, backups, as text or a picture",
    )
    with_config(tl)
    tl.add_argument("--svg", metavar="FILE", help="write the picture as an SVG file")
    tl.add_argument("--html", metavar="FILE", help="write a page with the picture")
    tl.set_defaults(func=cmd_timeline)
    ag = sub.add_parser(
        "agent",
        parents=[common],
        help="serve pgsnap commands without their start-up: with PGSNAP_AGENT=SOCKET set, "
        "the pgsnap command asks this process to run it (docs/reference/agent.md)",
    )
    ag.add_argument(
        "--socket",
        metavar="PATH",
        help="the Unix socket to listen on (made mode 0600; default: $PGSNAP_AGENT)",
    )
    ag.set_defaults(func=cmd_agent)
    return p


def _seconds_arg(text: str) -> float:
    """argparse type of the ``--*-timeout`` flags: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return value


def _to_devnull(stream: Any) -> None:
    """Point ``stream``'s file descriptor at /dev/null (its reader has gone)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return  # not a real file (a test's capture): nothing will be flushed to it
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C is: a backup leaves
    backup mode and is undone, a recovery keeps its journal to resume."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """While the command runs, SIGTERM and SIGHUP interrupt it as SIGINT does."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def raise_signalled(signum: int, _frame: object) -> None:
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, raise_signalled) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pgsnap`` command; returns the exit code.

    When the reader of standard output goes away (``pgsnap list | head -1``),
    pgsnap stops writing, prints no traceback and returns
    :data:`EXIT_BROKEN_PIPE` (141, as a command killed by SIGPIPE); what
    the command had done by then stands.
    """
    return _guarded(argv, _parser())


def _guarded(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    """:func:`main` with its parser given (the agent builds it once for all its forks)."""
    try:
        return _main(argv, parser)
    except BrokenPipeError:
        # Python's advice (signal module docs, "Note on SIGPIPE"): point stdout at
        # devnull so that the interpreter's final flush does not fail again.
        _to_devnull(sys.stdout)
        return EXIT_BROKEN_PIPE


def _dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the command: for one cluster, for the cluster ``--cluster`` names in a fleet,
    or (``--all``) for every cluster of the fleet, each in a process of its own."""
    config = getattr(args, "config", None)
    if config is None:
        return int(args.func(args))
    from pgsnap.config import is_fleet  # noqa: PLC0415 - pgsnap.fleet only for a fleet

    if is_fleet(config):
        from pgsnap.fleet import load_fleet  # noqa: PLC0415

        fleet = load_fleet(config)
        if args.all:
            return _run_all(args, fleet, argv)
        if not args.cluster:
            raise ConfigurationError(
                f"{config} is a fleet of {len(fleet.members)} clusters: name one",
                hint=f"pass --cluster NAME (one of {', '.join(fleet.names)}) or --all",
            )
        member = fleet.member(args.cluster)
        args.source, args.base = member.conf, member.base
    elif args.all or args.cluster:
        raise ConfigurationError(
            f"--all and --cluster need a fleet configuration; {config} is one cluster's",
            hint="a fleet is a file with [clusters.NAME] tables, or a directory of NAME.toml "
            "files (docs/reference/fleets.md)",
        )
    return int(args.func(args))


_FLEET_FLAGS: Final = {"--all": 0, "--parallel": 1, "--per-storage": 1, "--cluster-timeout": 1}
"""The fleet run's own flags (and how many values each takes): not passed to a cluster's."""


def _cluster_argv(argv: Sequence[str], name: str, command: str) -> list[str]:
    """The command line of one cluster's run: ``argv`` without the fleet's flags, with
    ``--cluster NAME`` (and ``--alone`` for a backup: scheduled runs never overlap)."""
    out: list[str] = []
    skip = 0
    for token in argv:
        if skip:
            skip -= 1
            continue
        flag = token.split("=", 1)[0]
        if flag in _FLEET_FLAGS:
            skip = 0 if "=" in token else _FLEET_FLAGS[flag]
            continue
        out.append(token)
    out += ["--cluster", name]
    if command == "backup" and "--alone" not in out:
        out.append("--alone")
    return out


def _run_all(args: argparse.Namespace, fleet: Any, argv: list[str]) -> int:
    """``--all``: the command for every cluster of the fleet; one line each, a summary."""
    from pgsnap.fleet import RunStatus, own_command, run_fleet  # noqa: PLC0415

    def report(result: Any) -> None:
        _err(
            f"{result.cluster}: {result.status.value} in {result.seconds:.1f} s"
            + (f": {result.error}" if result.error else "")
        )

    timeout = None
    if args.cluster_timeout is not None:
        timeout = _duration(args.cluster_timeout).total_seconds()
    results = run_fleet(
        fleet,
        lambda name: [*own_command(), *_cluster_argv(argv, name, args.command)],
        parallel=args.parallel,
        per_storage=args.per_storage,
        cluster_timeout=timeout,
        on_result=None if args.json else report,
    )
    failed = [r for r in results if r.status in (RunStatus.FAILED, RunStatus.TIMED_OUT)]
    if args.json:
        lines = []
        for r in results:
            line = r.to_dict()
            with contextlib.suppress(ValueError):  # text output stays text
                line["output"] = json.loads(r.output) if r.output else None
            lines.append(line)
        _out(_json_out({"ok": not failed, "clusters": lines}))
    else:
        width = max(len(r.cluster) for r in results)
        for r in results:
            said = r.error or (r.output.splitlines() or [""])[-1]
            _out(f"{r.cluster:<{width}}  {r.status.value:<9} {r.seconds:7.1f} s  {said}")
        counts = {s: sum(r.status is s for r in results) for s in RunStatus}
        _out(
            f"{len(results)} clusters: "
            + ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
        )
    return EXIT_FAILED if failed else EXIT_OK


def _main(argv: Sequence[str] | None, parser: argparse.ArgumentParser) -> int:
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already reported
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        with _signals_interrupt():
            code: int = _dispatch(args, list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, _Signalled) else signal.SIGINT
        _err(f"interrupted ({signal.Signals(signum).name})")
        return 128 + int(signum)
    except (ClusterLockedError, CopyBusy) as exc:
        _err(f"pgsnap: busy: {exc}")
        return EXIT_LOCKED
    except ExecutionError as exc:
        _err(f"pgsnap: failed: {exc}")
        return EXIT_FAILED
    except StalePlanError as exc:
        _err(f"pgsnap: stale plan: {exc}")
        return EXIT_STALE
    except PlanningError as exc:
        _err(f"pgsnap: refused: {exc}")
        return EXIT_REFUSED
    except (ConfigurationError, InputError) as exc:
        _err(f"pgsnap: {exc}")
        return EXIT_USAGE
    except PgsnapError as exc:
        _err(f"pgsnap: failed: {exc}")
        return EXIT_FAILED
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
