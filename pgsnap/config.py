"""The configuration of a cluster: one schema, validated in one place.

A configuration is a TOML file (``pgsnap -c pgsnap.toml``) or a mapping of
the same shape (a notebook's dict). Its sections: ``[database]`` (how to
reach PostgreSQL; a password only by ``password_env`` or ``password_file``),
``[storage]`` (the backend and its options), ``[host]`` (the database host:
this machine or one over ssh), ``[archive]``, ``[catalog]``, ``[timeouts]``,
``[retention]``, ``[copies]``, ``[clone_hosts.NAME]`` (other hosts where clones
may run) and one ``[[volume]]`` table per volume. docs/cli.md has a
complete example and every key.

:meth:`pgsnap.Cluster.from_config <pgsnap.cluster.Cluster.from_config>` is the
way in; :func:`cluster_arguments` gives what it builds with,
:func:`load_timeouts` and :func:`load_retention` the other sections.
"""

from __future__ import annotations

import datetime as dt
import difflib
import math
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pgsnap._attrs import frozen
from pgsnap.errors import CatalogError, ConfigurationError, check_keys

# What loading a configuration builds is imported when it is built: a command that
# does not load one (``pgsnap --help``) does not pay for the catalog, the hosts,
# the archives and the planners (issue 27: start-up).
if TYPE_CHECKING:
    from pgsnap.adapters.postgres import PostgresAdapter
    from pgsnap.host import Host
    from pgsnap.model import Layout
    from pgsnap.planner.copy_expiry import CopyRetentionPolicy
    from pgsnap.protocols import Catalog

__all__ = [
    "COPY_RETENTION_KEYS",
    "RETENTION_KEYS",
    "SECTIONS",
    "TIMEOUT_KEYS",
    "Source",
    "Timeouts",
    "cluster_arguments",
    "is_fleet",
    "load_catalog",
    "load_copy_retention",
    "load_retention",
    "load_timeouts",
    "parse_duration",
]


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


def _conninfo_without_password(conninfo: str, where: str = "[database]") -> str:
    if not _may_hold_password(conninfo):
        return conninfo  # parsed (psycopg imported) only when the server is asked
    import psycopg  # noqa: PLC0415 - only the CLI's configuration loading needs it here

    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        # The driver's message quotes the string (and a password in it): never chain it.
        raise ConfigurationError(
            f"cannot parse {where} conninfo",
            hint="use 'host=... port=... user=... dbname=...' or a postgresql:// URI",
        ) from None
    if "password" in params:
        raise ConfigurationError(
            f"{where} conninfo must not hold a password",
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


SECTIONS: Final = (
    "database",
    "storage",
    "host",
    "archive",
    "catalog",
    "timeouts",
    "retention",
    "copies",
    "clone_hosts",
    "primary",
    "volume",
)
RETENTION_KEYS: Final = (
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
_PRIMARY_KEYS = ("conninfo", "password_env", "password_file")
_STORAGE_KEYS = ("backend", "options")
_HOST_KEYS = ("ssh", "user", "port", "identity_file", "known_hosts_file", "name")
_CATALOG_KEYS = (
    "path",
    "journal",
    "wal_index",
    "conninfo",
    "cluster",
    "schema",
    "password_env",
    "password_file",
)
_COPIES_KEYS = (
    "path",
    "endpoint_url",
    "region",
    "access_key_env",
    "secret_key_env",
    "ca_bundle",
    "key_file",
    "credentials_file",
)
_COPY_TARGET_KEYS = (
    "endpoint_url",
    "region",
    "access_key_env",
    "secret_key_env",
    "credentials_file",
    "ca_bundle",
)
_COPIES_HOST_KEYS = ("host", "mount_root")
"""``[copies]`` keys of where snapshots are exposed and mounted (not target options)."""
COPY_RETENTION_KEYS: Final = (
    "redundancy",
    "window",
    "hourly",
    "daily",
    "weekly",
    "monthly",
    "yearly",
    "max_age",
)
"""The keys of ``[copies.retention]``: the snapshots' ``[retention]`` keys that apply to
copies, plus ``yearly`` and ``max_age`` (copies are kept longer)."""
_COPIES_SETTINGS = ("parallel", "bandwidth_limit")
"""``[copies]`` keys of how a copy runs (the others say where it goes)."""
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


@frozen
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
    check_keys(section, allowed, where)


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


Source = str | os.PathLike[str] | Mapping[str, Any]
"""A configuration: the path of a TOML file, or its content as a mapping (a dict
shaped like the file: ``{"database": {...}, "volume": [{...}, ...]}``)."""


def _describe(source: Source) -> str:
    return "mapping" if isinstance(source, Mapping) else str(source)


def _read(source: Source) -> dict[str, Any]:
    """The configuration (a TOML file, or a mapping), its sections checked against the
    known ones."""
    where = _describe(source)
    if isinstance(source, Mapping):
        conf = {str(k): v for k, v in source.items()}
    else:
        try:
            conf = tomllib.loads(Path(source).read_text())
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read configuration {source}: {exc.strerror}"
            ) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"configuration {source} is not valid TOML: {exc}") from None
    for name in conf:
        if name in SECTIONS:
            continue
        shown = [f"[[{s}]]" if s == "volume" else f"[{s}]" for s in SECTIONS]
        near = difflib.get_close_matches(name, SECTIONS, n=1)
        suggestion = f"did you mean {shown[SECTIONS.index(near[0])]}? " if near else ""
        raise ConfigurationError(
            f"configuration {where} has an unknown section [{name}]",
            hint=f"{suggestion}the sections are: {', '.join(shown)}",
            key=name,
        )
    return conf


def _base(source: Source, base: str | os.PathLike[str] | None) -> Path:
    """What relative paths are relative to: ``base``; else the file's directory (the
    working directory for a mapping)."""
    if base is not None:
        return Path(base).resolve()
    if isinstance(source, Mapping):
        return Path.cwd()
    return Path(source).resolve().parent


def _timeouts(conf: dict[str, Any]) -> Timeouts:
    section = _table(conf, "timeouts") or {}
    _check_keys(section, tuple(TIMEOUT_KEYS), "[timeouts]")
    return Timeouts(
        **{key: _seconds_value(value, f"[timeouts] {key}") for key, value in section.items()}
    )


def load_timeouts(source: Source) -> Timeouts:
    """The ``[timeouts]`` section of a configuration (defaults for what it omits)."""
    return _timeouts(_read(source))


def _host(
    section: dict[str, Any],
    rel: Callable[[Any], str],
    where: str = "[host]",
    default_name: str | None = None,
) -> Host:
    """The host of a ``[host]`` section (the database host) or of a
    ``[clone_hosts.NAME]`` one: this machine, or one over ssh."""
    from pgsnap.host import Host, SshRunner  # noqa: PLC0415 - on use

    _check_keys(section, _HOST_KEYS, where)
    name = _text(section, "name", where) or default_name
    if "ssh" not in section:
        extra = sorted(set(section) - {"name"})
        if extra:
            raise ConfigurationError(
                f"{where} sets {', '.join(extra)} but no ssh destination",
                hint='add ssh = "db1.example.com", or remove them to use this machine',
            )
        return Host(name=name)
    port = section.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ConfigurationError(f"{where} port must be a number, not {port!r}")
    identity_file = _text(section, "identity_file", where)
    known_hosts_file = _text(section, "known_hosts_file", where)
    runner = SshRunner(
        str(_text(section, "ssh", where)),
        user=_text(section, "user", where),
        port=port,
        identity_file=None if identity_file is None else rel(identity_file),
        known_hosts_file=None if known_hosts_file is None else rel(known_hosts_file),
    )
    return Host(runner, name=name)


def _clone_hosts(section: dict[str, Any], rel: Callable[[Any], str]) -> dict[str, Host]:
    """The ``[clone_hosts.NAME]`` tables: hosts other than the database host where clones
    may run, by the storage's name for them (``NAME``; ``name`` overrides it)."""
    hosts: dict[str, Host] = {}
    for key, table in section.items():
        where = f"[clone_hosts.{key}]"
        if not isinstance(table, dict):
            raise ConfigurationError(
                f"{where} must be a table, not {table!r}",
                hint=f'write [clone_hosts.{key}] with ssh = "..." below it',
            )
        host = _host(table, rel, where, default_name=str(key))
        hosts[host.name] = host
    return hosts


def _volumes(conf: dict[str, Any], rel: Callable[[Any], str]) -> Layout:
    """The layout of the ``[[volume]]`` tables."""
    from pgsnap.model import Layout, Volume, VolumeRole  # noqa: PLC0415 - on use

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


def _takes(name: str, parameter: str) -> bool:
    """True when the backend ``name``'s constructor takes ``parameter``: ``host`` (it
    runs commands on the database host, as btrfs does: it is given the ``[host]``
    section's host) or ``volumes`` (it is told its volumes, as the mock is: it is
    given the ``[[volume]]`` tables)."""
    import inspect  # noqa: PLC0415

    from pgsnap.backends import backend_class  # noqa: PLC0415

    try:
        return parameter in inspect.signature(backend_class(name)).parameters
    except (TypeError, ValueError):  # pragma: no cover - a class without a signature
        return False


def _declared_volumes(layout: Layout) -> list[dict[str, str]]:
    """The ``[[volume]]`` tables as a backend's ``volumes`` option: each volume is the
    directory at its mount point (declared once, for the layout and the storage)."""
    return [{"id": v.id, "name": v.name, "path": v.mount_point} for v in layout.volumes]


def cluster_arguments(
    source: Source,
    *,
    timeouts: Timeouts | None = None,
    base: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of :class:`~pgsnap.cluster.Cluster` that a configuration
    describes (what :meth:`Cluster.from_config <pgsnap.cluster.Cluster.from_config>`
    builds with): the adapter, backend, archive, catalog, layout, journal
    directory and WAL index.

    ``source`` is a TOML file or a mapping of the same shape. Relative paths
    are relative to ``base``, else to the file's directory (the working
    directory for a mapping). Unknown sections and keys are refused, naming
    the nearest valid one. ``timeouts`` replaces the configuration's
    ``[timeouts]`` (the connection and catalog lock waits are the cluster's;
    :func:`load_timeouts` gives the others, for
    :meth:`~pgsnap.cluster.Cluster.plan_recovery` and
    :meth:`~pgsnap.cluster.Cluster.plan_backup`). Raises
    :class:`~pgsnap.errors.ConfigurationError` saying what is wrong and what
    to write instead; a password is never read from the configuration itself.
    """
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415 - psycopg on use
    from pgsnap.archives.config import archive_settings, open_archive  # noqa: PLC0415
    from pgsnap.backends import create_backend  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415

    conf = _read(source)
    base_dir = _base(source, base)

    def rel(value: Any) -> str:
        return str(base_dir / str(value))

    def opt_rel(value: Any) -> str | None:
        return None if value is None else rel(value)

    db, storage, archive, catalog = _sections(conf, _describe(source), base_dir)
    archive_conf = archive_settings(
        archive, rel, config="" if isinstance(source, Mapping) else str(Path(source).resolve())
    )
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
        password=_read_password(db, base_dir),
        data_directory=opt_rel(_text(db, "data_directory", "[database]")),
        bindir=opt_rel(_text(db, "bindir", "[database]")),
        os_user=_text(db, "os_user", "[database]"),
        log_file=opt_rel(_text(db, "log_file", "[database]")),
        control="systemd" if control == "systemd" else "pg_ctl",
        systemd_unit=_text(db, "systemd_unit", "[database]"),
        connect_timeout=timeouts.connect,
        host=host,
    )
    backend_name = _backend_name(storage)
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
    if "volumes" not in options and not options.get("block") and _takes(backend_name, "volumes"):
        options["volumes"] = _declared_volumes(layout)
    if "host" not in options and _takes(backend_name, "host"):
        options["host"] = host  # a backend that works on the database host (btrfs)
    backend = create_backend(backend_name, **options)
    catalog_path = rel(_need(catalog, "path", "[catalog]"))
    journal = catalog.get("journal", Path(catalog_path) / "journal")
    wal_index = catalog.get("wal_index", True)
    if not isinstance(wal_index, bool | str) or wal_index == "":
        raise ConfigurationError(
            f"[catalog] wal_index is {wal_index!r}",
            hint="give a directory for the WAL index, or false for none "
            "(default: wal-index in the catalog directory)",
        )
    records = _catalog(catalog, catalog_path, base_dir, timeouts)
    if wal_index is True and not isinstance(records, DirectoryCatalog):
        wal_index = str(Path(catalog_path) / "wal-index")  # this backup server's own
    return {
        "adapter": adapter,
        "backend": backend,
        "archive": open_archive(archive_conf),
        "catalog": records,
        "layout": layout,
        "journal_dir": rel(journal),
        "wal_index": rel(wal_index) if isinstance(wal_index, str) else wal_index,
        "copy_target": _copy_target(_table(conf, "copies") or {}, rel),
        "copy_target_options": _copy_options(_table(conf, "copies") or {}, rel),
        "copy_key_file": _copy_key_file(_table(conf, "copies") or {}, rel),
        **_copy_host(_table(conf, "copies") or {}),
        "copy_retention": _copy_retention(_table(conf, "copies") or {}),
        **_copy_settings(_table(conf, "copies") or {}),
        "clone_hosts": _clone_hosts(_table(conf, "clone_hosts") or {}, rel),
        "primary": _primary(_table(conf, "primary"), base_dir, timeouts.connect),
    }


def is_fleet(source: str | os.PathLike[str]) -> bool:
    """True for a directory, or a TOML file with ``[clusters]`` (or ``[defaults]`` or
    ``[fleet]``) at its top level; False for a single cluster's configuration or a file
    that cannot be read (its reader says what is wrong with it)."""
    path = Path(source)
    if path.is_dir():
        return True
    try:
        conf = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False
    return any(k in conf for k in ("clusters", "defaults", "fleet"))


def load_catalog(
    source: Source,
    *,
    timeouts: Timeouts | None = None,
    base: str | os.PathLike[str] | None = None,
) -> Catalog:
    """The catalog a configuration names, and nothing else built: what a command that
    only reads the catalog (``pgsnap list``) opens, without importing the database
    driver or the storage backend's client.

    What :func:`cluster_arguments` checks is checked here too (a misspelt key or
    section, an unknown backend, a bad ``[archive]`` or ``[[volume]]`` is refused),
    except what needs the parts left unbuilt: the storage backend's options, and the
    ``[host]``, ``[copies]``, ``[clone_hosts]`` and ``[primary]`` sections, checked
    by the commands that use them. ``timeouts`` and ``base`` are as for
    :func:`cluster_arguments`.
    """
    from pgsnap.archives.config import archive_settings  # noqa: PLC0415
    from pgsnap.backends import default_registry  # noqa: PLC0415

    conf = _read(source)
    base_dir = _base(source, base)

    def rel(value: Any) -> str:
        return str(base_dir / str(value))

    _db, storage, archive, catalog = _sections(conf, _describe(source), base_dir)
    archive_settings(
        archive, rel, config="" if isinstance(source, Mapping) else str(Path(source).resolve())
    )
    _volumes(conf, rel)
    default_registry().target(_backend_name(storage))  # known, not imported
    path = rel(_need(catalog, "path", "[catalog]"))
    return _catalog(catalog, path, base_dir, timeouts or _timeouts(conf))


def _backend_name(storage: dict[str, Any]) -> str:
    if "backend" not in storage:
        from pgsnap.backends import registered_backends  # noqa: PLC0415

        raise ConfigurationError(
            "[storage] lacks 'backend'",
            hint=f"name one of: {', '.join(sorted(registered_backends()))}",
        )
    return str(storage["backend"])


def _sections(
    conf: dict[str, Any], path: str, base_dir: Path
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``[database]``, ``[storage]``, ``[archive]`` and ``[catalog]``, each present (and
    ``[[volume]]``), the keys of the first two and the last checked."""
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
    if "password" in db:  # refused with its own message: never a "did you mean"
        _read_password(db, base_dir)
    _check_keys(db, _DATABASE_KEYS, "[database]")
    _check_keys(storage, _STORAGE_KEYS, "[storage]")
    _check_keys(sections["catalog"], _CATALOG_KEYS, "[catalog]")
    return db, storage, sections["archive"], sections["catalog"]


def _catalog(section: dict[str, Any], path: str, base: Path, timeouts: Timeouts) -> Catalog:
    """``[catalog]``: a directory catalog at ``path``, or with ``conninfo`` a catalog in
    PostgreSQL shared by backup servers (records and the cluster lock there; ``path``
    keeps this server's journals and WAL index)."""
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415 - on use

    conninfo = _text(section, "conninfo", "[catalog]")
    if conninfo is None:
        for key in ("cluster", "schema", "password_env", "password_file"):
            if key in section:
                raise ConfigurationError(
                    f"[catalog] sets {key} but no conninfo",
                    hint="conninfo = 'host=... dbname=...' keeps the catalog in PostgreSQL; "
                    f"without it the catalog is the directory {path} and {key} means nothing",
                )
        return DirectoryCatalog(path, lock_timeout=timeouts.catalog_lock)
    from pgsnap.catalog.postgres import PostgresCatalog  # noqa: PLC0415 - psycopg on use

    cluster = _text(section, "cluster", "[catalog]")
    if not cluster:
        raise ConfigurationError(
            "[catalog] conninfo needs cluster = 'NAME'",
            hint="the name this cluster's records go under in the shared catalog (unique "
            "among the clusters that share it), e.g. the database host's name",
        )
    try:
        return PostgresCatalog(
            _conninfo_without_password(conninfo, "[catalog]"),
            cluster,
            password=_read_password(section, base),
            schema=_text(section, "schema", "[catalog]") or "pgsnap",
            connect_timeout=timeouts.connect,
        )
    except CatalogError as exc:
        raise ConfigurationError(f"[catalog]: {exc.message}", hint=exc.hint) from None


def _primary(
    section: dict[str, Any] | None, base: Path, connect_timeout: float
) -> PostgresAdapter | None:
    """``[primary]``: how pgsnap reaches the primary of the standby this configuration
    describes (a backup taken on the standby checks it and switches WAL there)."""
    if section is None:
        return None
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415 - psycopg on use

    if "password" in section:
        _read_password(section, base)  # refused with its own message
    _check_keys(section, _PRIMARY_KEYS, "[primary]")
    conninfo = _text(section, "conninfo", "[primary]")
    if not conninfo:
        raise ConfigurationError(
            "[primary] lacks 'conninfo'",
            hint="e.g. conninfo = 'host=db1 port=5432 user=pgsnap dbname=postgres' (the "
            "primary the standby streams from)",
        )
    return PostgresAdapter(
        _conninfo_without_password(conninfo, "[primary]"),
        password=_read_password(section, base),
        connect_timeout=connect_timeout,
    )


def _copy_host(section: dict[str, Any]) -> dict[str, str]:
    """``[copies] host`` (where snapshots that must be exposed are exposed, mounted
    and read: default the database host) and ``mount_root`` (where they are
    mounted), as Cluster arguments; absent keys are left out."""
    out: dict[str, str] = {}
    host = _text(section, "host", "[copies]")
    if host is not None:
        out["copy_host"] = host
    root = _text(section, "mount_root", "[copies]")
    if root is not None:
        if not root.startswith("/"):
            raise ConfigurationError(
                f"[copies] mount_root must be an absolute directory, not {root!r}",
                hint="e.g. mount_root = '/run/pgsnap/copies'",
            )
        out["copy_mount_root"] = root
    return out


def _copy_target(section: dict[str, Any], rel: Callable[[Any], str]) -> str | None:
    """``[copies] path``: where ``pgsnap copy`` puts copies (None: not configured)."""
    _check_keys(
        section, (*_COPIES_KEYS, *_COPIES_HOST_KEYS, *_COPIES_SETTINGS, "retention"), "[copies]"
    )
    where = _text(section, "path", "[copies]")
    if where is None or where.startswith("s3://"):
        return where
    return rel(where)


def _copy_options(section: dict[str, Any], rel: Callable[[Any], str]) -> dict[str, str]:
    """An S3 copy target's options under ``[copies]`` (names of environment variables
    for the keys, never the keys)."""
    out: dict[str, str] = {}
    for key in _COPY_TARGET_KEYS:
        value = _text(section, key, "[copies]")
        if value is not None:
            out[key] = rel(value) if key in ("ca_bundle", "credentials_file") else value
    return out


def _copy_key_file(section: dict[str, Any], rel: Callable[[Any], str]) -> str | None:
    """``[copies] key_file``: the copy key file that encrypts copies (its path; the
    key is read where it is used), relative to the configuration's directory."""
    where = _text(section, "key_file", "[copies]")
    return None if not where else rel(where)


_DURATION_UNITS: Final = {
    "min": 60,
    "s": 1,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
    "y": 365 * 86400,
}


def parse_duration(value: Any, where: str) -> dt.timedelta:
    """A duration of the configuration: ``"400d"``, ``"52w"``, ``"12h"``, ``"90min"``,
    ``"30s"``, ``"1y"`` (365 days), or a number of seconds; a ``timedelta``."""
    hint = 'write a number with a unit in quotes: "12h", "30d", "52w", "1y"'
    if isinstance(value, bool):
        raise ConfigurationError(f"{where} must be a duration, not {value!r}", hint=hint)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        raw = value.strip().lower()
        unit = next(
            (u for u in sorted(_DURATION_UNITS, key=len, reverse=True) if raw.endswith(u)), ""
        )
        number = raw[: -len(unit)] if unit else raw
        try:
            seconds = float(number) * _DURATION_UNITS.get(unit, 1)
        except ValueError:
            raise ConfigurationError(f"{where} is not a duration: {value!r}", hint=hint) from None
    else:
        raise ConfigurationError(f"{where} must be a duration, not {value!r}", hint=hint)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{where} must be a positive duration, not {value!r}", hint=hint)
    return dt.timedelta(seconds=seconds)


def _copy_retention(section: dict[str, Any]) -> CopyRetentionPolicy | None:
    """``[copies.retention]``: the copies' own retention policy (None: not configured,
    and then copy retention deletes nothing)."""
    if "retention" not in section:
        return None
    from pgsnap.planner.copy_expiry import CopyRetentionPolicy  # noqa: PLC0415 - on use

    table = section["retention"]
    if not isinstance(table, dict):
        raise ConfigurationError(
            f"[copies] retention must be a section ([copies.retention]), not {table!r}",
            hint='write [copies.retention] with keys such as monthly = 12, max_age = "3y"',
        )
    _check_keys(table, COPY_RETENTION_KEYS, "[copies.retention]")
    spans: dict[str, Any] = {
        key: parse_duration(table[key], f"[copies.retention] {key}")
        for key in ("window", "max_age")
        if key in table
    }
    counts = {k: v for k, v in table.items() if k not in spans}
    return CopyRetentionPolicy(**counts, **spans)


def load_copy_retention(source: Source) -> CopyRetentionPolicy | None:
    """The ``[copies.retention]`` section of a configuration as a policy (None when
    absent: then copy retention deletes nothing)."""
    return _copy_retention(_table(_read(source), "copies") or {})


def _copy_settings(section: dict[str, Any]) -> dict[str, Any]:
    """``[copies] parallel`` (upload threads, a whole number) and ``bandwidth_limit``
    (bytes a second: a number, or text with a unit such as ``"50MiB"``)."""
    out: dict[str, Any] = {}
    parallel = section.get("parallel")
    if parallel is not None:
        if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= 64:
            raise ConfigurationError(
                f"[copies] parallel must be a whole number from 1 to 64, not {parallel!r}",
                hint="the number of upload threads of a copy, without quotes, e.g. parallel = 4",
            )
        out["copy_parallel"] = parallel
    limit = section.get("bandwidth_limit")
    if limit is not None:
        from pgsnap.copies.bandwidth import parse_size  # noqa: PLC0415 - on use

        out["copy_bandwidth_limit"] = parse_size(limit, "[copies] bandwidth_limit")
    return out


def load_retention(source: Source) -> dict[str, Any]:
    """The ``[retention]`` section of a configuration (empty when absent)."""
    if isinstance(source, Mapping):
        conf: dict[str, Any] = dict(source)
    else:
        try:
            conf = tomllib.loads(Path(source).read_text())
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            return {}  # cluster_arguments reports what is wrong with the file
    section = conf.get("retention", {})
    if not isinstance(section, dict):
        return {}
    _check_keys(section, RETENTION_KEYS, "[retention]")
    return section
