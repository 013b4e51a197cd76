"""The ``pgsnap`` command.

    pgsnap demo                      the whole job on a throwaway cluster
    pgsnap check      -c pgsnap.toml preflight findings, archiver, WAL, backups
    pgsnap backup     -c pgsnap.toml take a snapshot backup
    pgsnap list       -c pgsnap.toml the backups in the catalog
    pgsnap plan-recovery -c ... [--time T | --lsn L | --xid X | --name N | --immediate]
    pgsnap recover    -c ... [target options] [--yes]
    pgsnap resume     -c pgsnap.toml [--yes]  resume interrupted plans
    pgsnap wal        -c pgsnap.toml the WAL archive, per timeline

Exit codes: 0 success; 1 execution failed (compensations ran); 2 bad usage or
configuration; 3 the plan was refused (PlanningError: the message says why
and what would work); 4 ``check`` found blocking problems; 5 the plan is
stale; 130 interrupted; 141 standard output was closed by its reader.

Every wait has a ``[timeouts]`` key and a ``--<key>-timeout`` flag
(:data:`TIMEOUT_KEYS`); a flag wins over the file.

Passwords come from the environment variable named by ``password_env`` or
from ``password_file`` in the configuration, never from a flag.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import difflib
import json
import logging
import math
import os
import signal
import sys
import threading
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from pgsnap.errors import (
    ClusterLockedError,
    ConfigurationError,
    ExecutionError,
    InputError,
    PgsnapError,
    PlanningError,
    StalePlanError,
)

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
    4: "check found blocking problems (a backup cannot be taken, or a recovery is at risk)",
    5: "the plan is stale, or has already run: plan again",
    6: "another pgsnap run holds the cluster, or an interrupted run must be resumed first "
    "(nothing was changed)",
    129: "hung up (SIGHUP): handled as an interrupt",
    130: "interrupted (SIGINT): what could not resume was undone",
    143: "terminated (SIGTERM): handled as an interrupt",
    141: "standard output was closed by its reader (e.g. | head); what was done stands",
}


def _out(text: str) -> None:
    print(text, flush=True)


def _err(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except BrokenPipeError:
        # Diagnostics for a reader who has gone: drop them; the exit code still tells.
        _to_devnull(sys.stderr)


# --------------------------------------------------------------------------- configuration


def _read_password(db: dict[str, Any], base: Path) -> str | None:
    if "password" in db:
        raise ConfigurationError(
            "the configuration file must not hold a password",
            hint="use password_env = 'NAME' (an environment variable) or password_file = 'PATH'",
        )
    if db.get("password_env"):
        name = str(db["password_env"])
        if name not in os.environ:
            raise ConfigurationError(
                f"password_env names the environment variable {name}, which is not set",
                hint=f"export {name}, or use password_file",
            )
        return os.environ[name]
    if db.get("password_file"):
        path = base / str(db["password_file"])
        try:
            mode = path.stat().st_mode
            text = path.read_text().strip()
        except OSError as exc:
            raise ConfigurationError(f"cannot read password_file {path}: {exc.strerror}") from None
        if mode & 0o077:
            raise ConfigurationError(
                f"password_file {path} can be read by other users (mode {mode & 0o777:04o})",
                hint=f"chmod 600 {path} (as libpq requires of .pgpass), then run again",
                path=str(path),
            )
        return text
    return None


def _conninfo_without_password(conninfo: str) -> str:
    if not _may_hold_password(conninfo):
        return conninfo  # parsed (psycopg imported) only when the server is asked
    import psycopg  # noqa: PLC0415 - only the CLI's configuration loading needs it here

    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        # The driver's message quotes the string (and a password in it): never chain it.
        raise ConfigurationError(
            "cannot parse [database] conninfo",
            hint="use 'host=... port=... user=... dbname=...' or a postgresql:// URI",
        ) from None
    if "password" in params:
        raise ConfigurationError(
            "[database] conninfo must not hold a password",
            hint="use password_env = 'NAME' or password_file = 'PATH'",
        )
    return conninfo


def _may_hold_password(conninfo: str) -> bool:
    """False only when ``conninfo`` cannot hold a password: no ``password``
    keyword (in any case), no percent-escape, and no user information in a
    URI. Otherwise it is parsed to know."""
    text = conninfo.lower()
    if "password" in text or "%" in text:
        return True
    return text.startswith(("postgresql://", "postgres://")) and "@" in text


def _need(section: dict[str, Any], key: str, where: str, hint: str | None = None) -> Any:
    if key not in section:
        raise ConfigurationError(
            f"{where} lacks {key!r}", hint=hint or "see docs/cli.md for an example"
        )
    return section[key]


def _text(section: dict[str, Any], key: str, where: str) -> str | None:
    """An optional text value (None when absent); anything else is a ConfigurationError."""
    value = section.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ConfigurationError(
        f"{where} {key} must be text, not {value!r}",
        hint=f'write it in quotes: {key} = "..."',
    )


_SECTIONS = (
    "database",
    "storage",
    "host",
    "archive",
    "catalog",
    "timeouts",
    "retention",
    "volume",
)
_RETENTION_KEYS: Final = (
    "redundancy",
    "window",
    "hourly",
    "daily",
    "weekly",
    "monthly",
    "orphans_after",
    "safety_after",
)
_DATABASE_KEYS = (
    "conninfo",
    "password_env",
    "password_file",
    "data_directory",
    "bindir",
    "os_user",
    "log_file",
    "control",
    "systemd_unit",
)
_STORAGE_KEYS = ("backend", "options")
_HOST_KEYS = ("ssh", "user", "port", "identity_file", "known_hosts_file", "name")
_ARCHIVE_KEYS = ("path", "gzip")
_CATALOG_KEYS = ("path", "journal", "wal_index")
_VOLUME_KEYS = ("id", "name", "role", "mount_point", "tablespace_oid")

TIMEOUT_KEYS: dict[str, str] = {
    "connect": "to connect to PostgreSQL",
    "wal": "for a backup's WAL to reach the archive",
    "server": "for the server to stop (a shutdown waits for the archiver: a slow "
    "archive_command needs more) and to start",
    "recovery": "for replay to reach the target",
    "restore": "for a restore the storage completes in the background",
    "device": "for a re-attached volume's device to appear on the host",
    "catalog_lock": "for another pgsnap process to finish writing the catalog",
}
"""The keys of the ``[timeouts]`` section (seconds) and the wait each one bounds.

Each is also a flag, ``--<key>-timeout`` (``_`` written ``-``)."""


@attrs.frozen
class Timeouts:
    """Every wait of the ``pgsnap`` command, in seconds (the ``[timeouts]`` section).

    ``connect``: PostgresAdapter ``connect_timeout``; ``wal``: a backup's
    ``wal_timeout``; ``server``, ``recovery``, ``restore``, ``device``: a
    recovery's ``server_timeout``, ``recovery_timeout``, ``restore_timeout``,
    ``device_timeout``; ``catalog_lock``: DirectoryCatalog ``lock_timeout``.
    """

    connect: float = 10.0
    wal: float = 60.0
    server: float = 120.0
    recovery: float = 600.0
    restore: float = 3600.0
    device: float = 120.0
    catalog_lock: float = 10.0


def _seconds_value(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(
            f"{where} must be a positive number of seconds, not {value!r}",
            hint="write a number greater than 0, without quotes, e.g. 300",
        )
    return float(value)


def _check_keys(section: dict[str, Any], allowed: Sequence[str], where: str) -> None:
    """Refuse a key that is not in ``allowed``, naming the nearest valid one."""
    for key in section:
        if key in allowed:
            continue
        near = difflib.get_close_matches(str(key), allowed, n=1)
        takes = f"{where} takes: {', '.join(allowed)}"
        raise ConfigurationError(
            f"{where} has an unknown key {key!r}",
            hint=f"did you mean {near[0]!r}? {takes}" if near else takes,
            key=key,
        )


def _table(conf: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The section ``[name]`` (None when absent); a value that is not a table is refused."""
    if name not in conf:
        return None
    value = conf[name]
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{name} must be a section ([{name}]), not {value!r}",
            hint="see docs/cli.md for a complete example",
        )
    return dict(value)


def _read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The configuration file as TOML, its sections checked against the known ones."""
    try:
        conf = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigurationError(f"cannot read configuration {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"configuration {path} is not valid TOML: {exc}") from None
    for name in conf:
        if name in _SECTIONS:
            continue
        shown = [f"[[{s}]]" if s == "volume" else f"[{s}]" for s in _SECTIONS]
        near = difflib.get_close_matches(name, _SECTIONS, n=1)
        suggestion = f"did you mean {shown[_SECTIONS.index(near[0])]}? " if near else ""
        raise ConfigurationError(
            f"configuration {path} has an unknown section [{name}]",
            hint=f"{suggestion}the sections are: {', '.join(shown)}",
            key=name,
        )
    return conf


def _timeouts(conf: dict[str, Any]) -> Timeouts:
    section = _table(conf, "timeouts") or {}
    _check_keys(section, tuple(TIMEOUT_KEYS), "[timeouts]")
    return Timeouts(
        **{key: _seconds_value(value, f"[timeouts] {key}") for key, value in section.items()}
    )


def load_timeouts(path: str | os.PathLike[str]) -> Timeouts:
    """The ``[timeouts]`` section of a configuration file (defaults for what it omits)."""
    return _timeouts(_read(path))


def _host(section: dict[str, Any], rel: Any) -> Any:
    """The database host of the ``[host]`` section: this machine, or one over ssh."""
    from pgsnap.host import Host, SshRunner  # noqa: PLC0415

    _check_keys(section, _HOST_KEYS, "[host]")
    name = _text(section, "name", "[host]")
    if "ssh" not in section:
        extra = sorted(set(section) - {"name"})
        if extra:
            raise ConfigurationError(
                f"[host] sets {', '.join(extra)} but no ssh destination",
                hint='add ssh = "db1.example.com", or remove them to use this machine',
            )
        return Host(name=name)
    port = section.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ConfigurationError(f"[host] port must be a number, not {port!r}")
    identity_file = _text(section, "identity_file", "[host]")
    known_hosts_file = _text(section, "known_hosts_file", "[host]")
    runner = SshRunner(
        str(_text(section, "ssh", "[host]")),
        user=_text(section, "user", "[host]"),
        port=port,
        identity_file=None if identity_file is None else rel(identity_file),
        known_hosts_file=None if known_hosts_file is None else rel(known_hosts_file),
    )
    return Host(runner, name=name)


def _volumes(conf: dict[str, Any], rel: Any) -> Any:
    """The layout of the ``[[volume]]`` tables."""
    from pgsnap.model import Layout, Volume, VolumeRole  # noqa: PLC0415

    volumes = conf["volume"]
    if isinstance(volumes, dict):
        raise ConfigurationError(
            "write each volume as a [[volume]] table (double brackets), not [volume]",
            hint="see docs/cli.md for a complete example",
        )
    if not isinstance(volumes, list):
        raise ConfigurationError(
            f"volume must be [[volume]] tables, not {volumes!r}",
            hint="see docs/cli.md for a complete example",
        )
    roles = ", ".join(r.value for r in VolumeRole)
    vols = []
    for n, v in enumerate(volumes, 1):
        where = f"[[volume]] #{n}"
        if not isinstance(v, dict):
            raise ConfigurationError(
                f"{where} must be a table (id, role, mount_point), not {v!r}",
                hint="see docs/cli.md for a complete example",
            )
        _check_keys(v, _VOLUME_KEYS, where)
        role_name = _need(v, "role", where, hint=f"give role = one of: {roles}")
        try:
            role = VolumeRole(role_name)
        except ValueError:
            raise ConfigurationError(
                f"{where} has role {role_name!r}", hint=f"use one of: {roles}"
            ) from None
        vid = _need(v, "id", where)
        mount_point = _need(v, "mount_point", where)
        name = v.get("name", vid)
        oid = v.get("tablespace_oid")
        if oid is not None and (isinstance(oid, bool) or not isinstance(oid, int)):
            raise ConfigurationError(
                f"{where} tablespace_oid must be a number (the tablespace's oid), not {oid!r}",
                hint="SELECT oid, spcname FROM pg_tablespace gives it",
            )
        for key, value in (("id", vid), ("name", name), ("mount_point", mount_point)):
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise ConfigurationError(
                    f"{where} {key} must be text, not {value!r}",
                    hint=f'write it in quotes: {key} = "..."',
                )
        vols.append(
            Volume(
                id=str(vid),
                name=str(name),
                role=role,
                mount_point=rel(mount_point),
                tablespace_oid=oid,
            )
        )
    return Layout(tuple(vols))


def _flag(section: dict[str, Any], key: str, where: str) -> bool:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise ConfigurationError(f"{where} {key} must be true or false, not {value!r}")
    return value


def _takes_host(name: str) -> bool:
    """True when the backend ``name`` takes a ``host`` (it runs commands on the database
    host, as btrfs does): it is then given the ``[host]`` section's host."""
    import inspect  # noqa: PLC0415

    from pgsnap.backends import backend_class  # noqa: PLC0415

    try:
        return "host" in inspect.signature(backend_class(name)).parameters
    except (TypeError, ValueError):  # pragma: no cover - a class without a signature
        return False


def load_cluster(path: str | os.PathLike[str], *, timeouts: Timeouts | None = None) -> Any:
    """Build a :class:`~pgsnap.cluster.Cluster` from a TOML configuration file.

    Relative paths in the file are relative to the file's directory. Unknown
    sections and keys are refused, naming the nearest valid one.
    ``timeouts`` replaces the file's ``[timeouts]`` (the connection and
    catalog lock waits are the cluster's; :func:`load_timeouts` gives the
    others, for :meth:`~pgsnap.cluster.Cluster.plan_recovery` and
    :meth:`~pgsnap.cluster.Cluster.plan_backup`).
    """
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.backends import create_backend, registered_backends  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.cluster import Cluster  # noqa: PLC0415
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    conf = _read(path)
    base = Path(path).resolve().parent

    def rel(value: Any) -> str:
        return str(base / str(value))

    def opt_rel(value: Any) -> str | None:
        return None if value is None else rel(value)

    sections = {}
    for name in ("database", "storage", "archive", "catalog", "volume"):
        if name not in conf:
            raise ConfigurationError(
                f"configuration {path} lacks the [{name}] section",
                hint="see docs/cli.md for a complete example",
            )
        if name != "volume":
            sections[name] = _table(conf, name) or {}
    db, storage = sections["database"], sections["storage"]
    archive, catalog = sections["archive"], sections["catalog"]
    if "password" in db:  # refused with its own message: never a "did you mean"
        _read_password(db, base)
    _check_keys(db, _DATABASE_KEYS, "[database]")
    _check_keys(storage, _STORAGE_KEYS, "[storage]")
    _check_keys(archive, _ARCHIVE_KEYS, "[archive]")
    _check_keys(catalog, _CATALOG_KEYS, "[catalog]")
    file_timeouts = _timeouts(conf)
    timeouts = timeouts or file_timeouts
    layout = _volumes(conf, rel)
    host = _host(_table(conf, "host") or {}, rel)
    control = _text(db, "control", "[database]") or "pg_ctl"
    if control not in ("pg_ctl", "systemd"):
        raise ConfigurationError(
            f"[database] control is {control!r}", hint="use control = 'pg_ctl' or 'systemd'"
        )
    adapter = PostgresAdapter(
        _conninfo_without_password(_text(db, "conninfo", "[database]") or ""),
        password=_read_password(db, base),
        data_directory=opt_rel(_text(db, "data_directory", "[database]")),
        bindir=opt_rel(_text(db, "bindir", "[database]")),
        os_user=_text(db, "os_user", "[database]"),
        log_file=opt_rel(_text(db, "log_file", "[database]")),
        control="systemd" if control == "systemd" else "pg_ctl",
        systemd_unit=_text(db, "systemd_unit", "[database]"),
        connect_timeout=timeouts.connect,
        host=host,
    )
    if "backend" not in storage:
        raise ConfigurationError(
            "[storage] lacks 'backend'",
            hint=f"name one of: {', '.join(sorted(registered_backends()))}",
        )
    options = _table(storage, "options") or {}
    if "password" in options:  # refused with its own message, as [database] password is
        raise ConfigurationError(
            "the configuration file must not hold a password ([storage.options] password)",
            hint="put it in an environment variable and name that with password_env = 'NAME' "
            "(the powerflex backend reads $PGSNAP_POWERFLEX_PASSWORD when none is named)",
        )
    for key in ("state_file", "root", "snapshot_dir"):
        if key in options:
            options[key] = rel(options[key])
    if isinstance(options.get("verify"), str):  # a CA bundle (PowerFlex): relative to the file
        options["verify"] = rel(options["verify"])
    if isinstance(options.get("volumes"), list):
        options["volumes"] = [
            {**v, "path": rel(v["path"])} if isinstance(v, dict) and "path" in v else v
            for v in options["volumes"]
        ]
    if "host" not in options and _takes_host(str(storage["backend"])):
        options["host"] = host  # a backend that works on the database host (btrfs)
    backend = create_backend(str(storage["backend"]), **options)
    catalog_path = rel(_need(catalog, "path", "[catalog]"))
    journal = catalog.get("journal", Path(catalog_path) / "journal")
    wal_index = catalog.get("wal_index", True)
    if not isinstance(wal_index, bool | str) or wal_index == "":
        raise ConfigurationError(
            f"[catalog] wal_index is {wal_index!r}",
            hint="give a directory for the WAL index, or false for none "
            "(default: wal-index in the catalog directory)",
        )
    return Cluster(
        adapter=adapter,
        backend=backend,
        archive=DirectoryWalArchive(
            rel(_need(archive, "path", "[archive]")), gzip=_flag(archive, "gzip", "[archive]")
        ),
        catalog=DirectoryCatalog(catalog_path, lock_timeout=timeouts.catalog_lock),
        layout=layout,
        journal_dir=rel(journal),
        wal_index=rel(wal_index) if isinstance(wal_index, str) else wal_index,
    )


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


def _progress(event: Any) -> None:
    _err(str(event))  # a closed stderr drops progress; the plan goes on


def _execute(cluster: Any, plan: Any) -> Any:
    return cluster.execute(plan, on_event=_progress)


def _load(args: argparse.Namespace) -> tuple[Any, Timeouts]:
    """The cluster of ``--config`` and the waits: the file's ``[timeouts]``, flags winning."""
    timeouts = load_timeouts(args.config)
    flags = {
        key: value
        for key in TIMEOUT_KEYS
        if (value := getattr(args, f"{key}_timeout", None)) is not None
    }
    timeouts = attrs.evolve(timeouts, **flags)
    return load_cluster(args.config, timeouts=timeouts), timeouts


def _warn_unreadable(cluster: Any) -> None:
    """Name every catalog file that cannot be read (their backups are not used)."""
    from pgsnap.catalog import scan_catalog  # noqa: PLC0415

    _warn_unreadable_entries(scan_catalog(cluster.catalog).unreadable)


def _warn_unreadable_entries(entries: Sequence[Any]) -> None:
    for entry in entries:
        _err(
            f"pgsnap: warning: catalog file {entry.path} is unreadable: {entry.error}; "
            "the backup it records is not used (hint: restore the file from a copy, or "
            "move it out of the catalog)"
        )


def _plan_recovery(args: argparse.Namespace, cluster: Any, timeouts: Timeouts, target: Any) -> Any:
    _warn_unreadable(cluster)
    lost = ["data"] + (["wal"] if args.wal_lost else [])
    return cluster.plan_recovery(
        target,
        timeline=args.timeline,
        action=args.action,
        lost=lost,
        backup_id=args.backup,
        safety_snapshot=not args.no_safety_snapshot,
        server_timeout=timeouts.server,
        recovery_timeout=timeouts.recovery,
        restore_timeout=timeouts.restore,
        device_timeout=timeouts.device,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo."""
    from pgsnap.demo import run_demo  # noqa: PLC0415

    result = run_demo(
        say=_out, on_event=_progress, bindir=args.bindir, keep=args.keep, backend=args.backend
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
            json.dumps(
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
                indent=2,
            )
        )
    else:
        _out(report.explain())
    return EXIT_OK if report.ok else EXIT_CHECK


def cmd_backup(args: argparse.Namespace) -> int:
    """Take a backup."""
    cluster, timeouts = _load(args)
    if not args.dry_run:
        cluster.check_not_busy("backup")  # a recovery or an expiry runs: fail at once
    plan = cluster.plan_backup(args.label, fast=not args.spread, wal_timeout=timeouts.wal)
    if args.dry_run:
        _out(plan.to_json() if args.json else plan.explain())
        return EXIT_OK
    _execute(cluster, plan)
    record = cluster.catalog.get(str(plan.request["backup_id"]))
    if args.json:
        from pgsnap.model import to_json  # noqa: PLC0415

        _out(to_json(record))
    else:
        _out(
            f"backup {record.id} {record.state.value}: {record.start_lsn} .. {record.stop_lsn}, "
            f"{record.backup_mode_seconds:.3f} s in backup mode"
        )
    return EXIT_OK


def _listed_backups(args: argparse.Namespace) -> Any:
    """The backups, with the next expiry's forecast when a retention policy is set
    (flags, else ``[retention]``); without the forecast (and a warning) when the
    storage or the archive cannot be observed."""
    cluster = _load(args)[0]
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

    backups = _listed_backups(args)
    if args.json:
        _warn_unreadable_entries(backups.unreadable)
        docs = []
        for b in backups:
            doc = to_dict(b)
            if backups.forecast is not None:
                doc["retention"] = _retention_json(backups, b)
            docs.append(doc)
        _out(json.dumps(docs, indent=2))
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
    return EXIT_OK


_DURATION_UNITS: Final = {"min": 60, "s": 1, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> dt.timedelta:
    """``7d``, ``12h``, ``90min``, ``2w`` or seconds as a number."""
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

    conf = load_retention(args.config)
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
    conf = load_retention(args.config)
    return any(
        getattr(args, k, None) is not None or conf.get(k)
        for k in _RETENTION_KEYS
        if k not in ("orphans_after", "safety_after")
    )


def load_retention(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``[retention]`` section of a configuration file (empty when absent)."""
    try:
        conf = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # load_cluster reports what is wrong with the file
    section = conf.get("retention", {})
    if not isinstance(section, dict):
        return {}
    _check_keys(section, _RETENTION_KEYS, "[retention]")
    return section


def cmd_expire(args: argparse.Namespace) -> int:
    """Apply a retention policy (or show what it would delete)."""
    cluster = _load(args)[0]
    plan = cluster.plan_expiry(_policy(args))
    if args.json:
        _out(plan.to_json())
    else:
        _out(plan.explain())
    if args.dry_run or not plan.steps:
        if not plan.steps:
            _out("nothing to delete")
        return EXIT_OK
    _execute(cluster, plan)
    _out(f"deleted: {len(plan.lost)} item(s)")
    return EXIT_OK


def cmd_rebuild_catalog(args: argparse.Namespace) -> int:
    """Recreate missing catalog records from the storage and the archive."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    report = _load(args)[0].rebuild_catalog(dry_run=args.dry_run, log_timezone=args.log_timezone)
    if args.json:
        _out(
            json.dumps(
                {
                    "dry_run": report.dry_run,
                    "rebuilt": [to_dict(r) for r in report.rebuilt],
                    "skipped": [{"what": w, "why": why} for w, why in report.skipped],
                    "existing": list(report.existing),
                },
                indent=2,
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
    _execute(cluster, plan)
    _out(f"backup {args.backup} deleted")
    return EXIT_OK


def cmd_safety_list(args: argparse.Namespace) -> int:
    """List the safety snapshots recoveries recorded."""
    from pgsnap.model import to_dict  # noqa: PLC0415

    records = _load(args)[0].safety_snapshots()
    if args.json:
        _out(json.dumps([to_dict(r) for r in records], indent=2))
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
    _execute(cluster, plan)
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
    result = _execute(cluster, plan)
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


def _archive_segment_size(cluster: Any) -> int:
    """The segment size: from the server, else from an archived segment's file size."""
    try:
        size: int = cluster.adapter.describe().wal_segment_size
        return size
    except PgsnapError:
        pass
    from pgsnap.wal import VALID_SEGMENT_SIZES, WalFileKind, parse_archive_name  # noqa: PLC0415

    for name in cluster.archive.list_names():
        entry = parse_archive_name(name)
        if entry.kind is WalFileKind.SEGMENT and entry.compression is None:
            try:
                size = (Path(cluster.archive.location) / name).stat().st_size
            except OSError:
                continue
            if size in VALID_SEGMENT_SIZES:
                return size
    raise ConfigurationError(
        "cannot tell the WAL segment size: no backup, the server is down and the archive "
        "holds no plain segment",
        hint="start the server or take a backup first",
    )


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
        _execute(cluster, plan)
        _out(f"{plan.kind} plan {plan.id[:12]} finished")
    return EXIT_OK


def cmd_wal(args: argparse.Namespace) -> int:
    """Report the WAL archive per timeline."""
    cluster = _load(args)[0]
    backups = cluster.backups()
    _warn_unreadable_entries(backups.unreadable)
    seg = backups[-1].wal_segment_size if backups else _archive_segment_size(cluster)
    index = cluster.archive.index(seg)
    graph = cluster.archive.histories(index.history_names)  # no second listing
    report: dict[str, Any] = {
        "archive": cluster.archive.location,
        "segment_size": seg,
        "timelines": [],
    }
    from pgsnap.wal import switch_gaps  # noqa: PLC0415

    before_switch = switch_gaps(index, graph)
    for tli in sorted(set(index.timelines()) | set(graph.timelines())):
        report["timelines"].append(
            {
                "missing_before_switch": [
                    {"child": g.child, "switchpoint": str(g.switchpoint), "first": g.first,
                     "last": g.last, "count": g.count}
                    for g in before_switch
                    if g.parent == tli
                ],
                "timeline": tli,
                "parent": graph.parent_of(tli) if tli in graph else None,
                "switchpoint": str(graph.switchpoint_of(tli))
                if tli in graph and graph.switchpoint_of(tli)
                else None,
                "ranges": [list(r.names(seg)) for r in index.ranges(tli)],
                "gaps": [list(g.names(seg)) for g in index.gaps(tli)],
            }
        )
    if args.json:
        _out(json.dumps(report, indent=2))
        return EXIT_OK
    _out(f"WAL archive {report['archive']} ({seg // (1024 * 1024)} MB segments)")
    for t in report["timelines"]:
        parent = f" (from {t['parent']} at {t['switchpoint']})" if t["parent"] else ""
        _out(f"timeline {t['timeline']}{parent}")
        for first, last in t["ranges"]:
            _out(f"  present  {first} .. {last}")
        for first, last in t["gaps"]:
            _out(f"  MISSING  {first} .. {last}")
        for g in t["missing_before_switch"]:
            _out(
                f"  MISSING  {g['first']} .. {g['last']}  (before timeline {g['child']} "
                f"forks at {g['switchpoint']}: replay along timeline {g['child']} needs them)"
            )
    return EXIT_OK


# --------------------------------------------------------------------------- parser


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pgsnap",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n" + "\n".join(f"  {k:>3}  {v}" for k, v in EXIT_CODES.items()),
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)"
    )
    sub = p.add_subparsers(dest="command", required=True)
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
        sp.add_argument("-c", "--config", required=True, help="TOML configuration file")
        sp.add_argument("--json", action="store_true", help="JSON output for scripts")
        waits = sp.add_argument_group("waits (seconds; default: the [timeouts] section)")
        timeout(waits, "connect", 10)
        timeout(waits, "catalog_lock", 10)

    def retention_flags(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--redundancy", type=int, help="keep the newest N DONE backups")
        sp.add_argument("--window", help="keep every point of the last D recoverable: 7d, 12h")
        for level in ("hourly", "daily", "weekly", "monthly"):
            sp.add_argument(
                f"--{level}", type=int, help=f"keep the newest backup of each of N {level} periods"
            )
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
    b.add_argument("--spread", action="store_true", help="spread checkpoint instead of fast")
    timeout(b, "wal", 60)
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
        g = r.add_argument_group("target (one; default: latest)")
        g.add_argument("--time", help="ISO time with a zone, e.g. '2026-11-30 12:00:00+00:00'")
        g.add_argument("--lsn", help="WAL location, e.g. 0/3000060")
        g.add_argument("--xid", type=int, help="transaction id")
        g.add_argument("--name", help="restore point name")
        g.add_argument("--immediate", action="store_true", help="stop at consistency")
        r.add_argument("--exclusive", action="store_true", help="stop just before the target")
        r.add_argument("--timeline", default="latest", help="latest (default), current or N")
        r.add_argument("--action", default="promote", choices=["promote", "pause", "shutdown"])
        r.add_argument(
            "--wal-lost",
            action="store_true",
            help="the WAL volume is lost too (restore it from the snapshot)",
        )
        r.add_argument("--backup", help="use this backup id")
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

    w = sub.add_parser(
        "wal", parents=[common], help="the WAL archive per timeline: ranges and gaps"
    )
    with_config(w)
    w.set_defaults(func=cmd_wal)
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
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python's advice (signal module docs, "Note on SIGPIPE"): point stdout at
        # devnull so that the interpreter's final flush does not fail again.
        _to_devnull(sys.stdout)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already reported
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        with _signals_interrupt():
            code: int = args.func(args)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, _Signalled) else signal.SIGINT
        _err(f"interrupted ({signal.Signals(signum).name})")
        return 128 + int(signum)
    except ClusterLockedError as exc:
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
