"""Fleets: many clusters in one configuration, and runs over all of them that a
scheduler can start at any time.

A fleet configuration is either one TOML file::

    [fleet]                        # how --all runs (each may be overridden by a flag)
    parallel = 4                   # clusters at once
    per_storage = 2                # at most this many at once on one storage system
    cluster_timeout = "30min"      # a cluster's run is stopped (SIGTERM) after this

    [defaults.catalog]             # sections every cluster shares; "{cluster}" in a text
    conninfo = "host=catalog dbname=pgsnap"   # is the cluster's name
    path = "/var/lib/pgsnap/{cluster}"

    [clusters.db1.database]        # each cluster: a whole configuration (docs/cli.md),
    conninfo = "host=db1 user=pgsnap dbname=postgres"   # merged over the defaults
    [[clusters.db1.volume]]
    ...

or a directory of cluster files: ``NAME.toml`` for each cluster, and an optional
``defaults.toml`` (the shared sections at its top level, and ``[fleet]``).

Defaults merge under each cluster table by table (a cluster's key wins; a list such as
``[[volume]]`` is replaced whole). With a catalog in PostgreSQL (``conninfo``), a
cluster's ``[catalog] cluster`` defaults to its name.

:func:`run_fleet` runs one command for every cluster (``pgsnap ... --all``), each in a
process of its own (``pgsnap ... --cluster NAME``), at most ``parallel`` at once and
``per_storage`` per storage system, each stopped after ``cluster_timeout``; a cluster
another run holds is skipped and said so; the result is one line per cluster.
"""

from __future__ import annotations

import concurrent.futures
import copy
import datetime as dt
import difflib
import enum
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.config import SECTIONS, is_fleet, parse_duration
from pgsnap.errors import ConfigurationError, check_keys

__all__ = [
    "FLEET_KEYS",
    "Fleet",
    "FleetMember",
    "FleetResult",
    "RunStatus",
    "is_fleet",
    "load_fleet",
    "own_command",
    "run_fleet",
]

log = logging.getLogger(__name__)

FLEET_KEYS: Final = ("parallel", "per_storage", "cluster_timeout")
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DEFAULTS_FILE: Final = "defaults.toml"
_EXIT_LOCKED: Final = 6
_GRACE: Final = 60.0
"""Seconds a stopped run has to leave (a backup leaves backup mode) before SIGKILL."""


@frozen
class FleetMember:
    """One cluster of a fleet: its name, its configuration (the defaults merged under
    its own tables), what its relative paths are relative to, and the storage system
    it uses (runs are limited per storage system)."""

    name: str
    conf: Mapping[str, Any] = attrs.field(repr=False)
    base: Path
    storage: str


@frozen
class Fleet:
    """A fleet configuration: its clusters by name, and how ``--all`` runs them."""

    source: str
    members: Mapping[str, FleetMember]
    parallel: int = 1
    per_storage: int = 0
    """0: no limit per storage system."""
    cluster_timeout: float | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The clusters' names, sorted."""
        return tuple(sorted(self.members))

    def member(self, name: str) -> FleetMember:
        """The cluster ``name``; a ConfigurationError naming the nearest when absent."""
        found = self.members.get(name)
        if found is None:
            near = difflib.get_close_matches(name, list(self.members), n=1)
            raise ConfigurationError(
                f"the fleet {self.source} has no cluster {name!r}",
                hint=(f"did you mean {near[0]!r}? " if near else "")
                + f"its clusters: {', '.join(self.names) or 'none'}",
            )
        return found


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not valid TOML: {exc}") from None


def _substitute(value: Any, name: str) -> Any:
    if isinstance(value, str):
        return value.replace("{cluster}", name)
    if isinstance(value, dict):
        return {k: _substitute(v, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, name) for v in value]
    return value


def _merge(under: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(under)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_sections(conf: Mapping[str, Any], where: str) -> None:
    for key in conf:
        if key not in SECTIONS:
            near = difflib.get_close_matches(key, SECTIONS, n=1)
            raise ConfigurationError(
                f"{where} has an unknown section [{key}]",
                hint=(f"did you mean [{near[0]}]? " if near else "")
                + f"the sections are: {', '.join(SECTIONS)}",
            )


def _storage_key(conf: Mapping[str, Any]) -> str:
    """The storage system a cluster uses: its backend and the first of the options that
    name a system (a gateway, an endpoint, a host...), or the backend alone."""
    storage = conf.get("storage")
    if not isinstance(storage, dict):
        return "?"
    options = storage.get("options") if isinstance(storage.get("options"), dict) else {}
    assert isinstance(options, dict)
    for key in ("gateway", "url", "endpoint", "host", "volume_group", "root", "state_file"):
        if options.get(key):
            return f"{storage.get('backend')}:{options[key]}"
    return str(storage.get("backend"))


def _member(name: str, own: Mapping[str, Any], defaults: Mapping[str, Any], base: Path,
            where: str) -> FleetMember:  # fmt: skip
    if not _NAME_RE.match(name):
        raise ConfigurationError(
            f"{where}: the cluster name {name!r} is not a name",
            hint="1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    if not isinstance(own, dict):
        raise ConfigurationError(f"{where}: cluster {name} must be a table, not {own!r}")
    conf = _merge(_substitute(dict(defaults), name), own)
    _check_sections(conf, f"{where}, cluster {name}")
    catalog = conf.get("catalog")
    if isinstance(catalog, dict) and catalog.get("conninfo") and "cluster" not in catalog:
        catalog["cluster"] = name
    return FleetMember(name, conf, base, _storage_key(conf))


def _settings(section: Any, where: str) -> dict[str, Any]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigurationError(f"{where} [fleet] must be a table")
    check_keys(section, FLEET_KEYS, f"{where} [fleet]")
    out: dict[str, Any] = {}
    for key in ("parallel", "per_storage"):
        if key in section:
            value = section[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(
                    f"{where} [fleet] {key} must be a whole number >= 0, not {value!r}"
                )
            out[key] = max(1, value) if key == "parallel" else value
    if "cluster_timeout" in section:
        span = parse_duration(section["cluster_timeout"], f"{where} [fleet] cluster_timeout")
        out["cluster_timeout"] = span.total_seconds()
    return out


def load_fleet(source: str | os.PathLike[str]) -> Fleet:
    """The fleet of a TOML file or a directory (see the module docstring)."""
    path = Path(source)
    where = str(path)
    members: dict[str, FleetMember] = {}
    if path.is_dir():
        defaults_path = path / _DEFAULTS_FILE
        defaults = _read_toml(defaults_path) if defaults_path.exists() else {}
        settings = _settings(defaults.pop("fleet", None), str(defaults_path))
        _check_sections(defaults, str(defaults_path))
        for file in sorted(path.glob("*.toml")):
            if file.name == _DEFAULTS_FILE or file.name.startswith("."):
                continue
            members[file.stem] = _member(
                file.stem, _read_toml(file), defaults, path.resolve(), str(file)
            )
    else:
        conf = _read_toml(path)
        check_keys(conf, ("fleet", "defaults", "clusters"), where)
        settings = _settings(conf.get("fleet"), where)
        defaults = conf.get("defaults", {})
        if not isinstance(defaults, dict):
            raise ConfigurationError(f"{where} [defaults] must be a table of sections")
        _check_sections(defaults, f"{where} [defaults]")
        clusters = conf.get("clusters", {})
        if not isinstance(clusters, dict):
            raise ConfigurationError(f"{where} [clusters] must be a table of clusters")
        for name, own in clusters.items():
            members[name] = _member(name, own, defaults, path.resolve().parent, where)
    if not members:
        raise ConfigurationError(
            f"the fleet {where} has no cluster",
            hint="add [clusters.NAME] tables (a file) or NAME.toml files (a directory)",
        )
    return Fleet(where, dict(sorted(members.items())), **settings)


# --------------------------------------------------------------------------- runs


class RunStatus(enum.Enum):
    """How one cluster's run ended."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Another run held the cluster (exit 6): nothing was done, nothing is wrong."""
    TIMED_OUT = "timed out"


@frozen
class FleetResult:
    """One cluster's run: how it ended, its exit code, how long it took, what it said
    (its standard output) and its last error line."""

    cluster: str
    status: RunStatus
    exit_code: int
    seconds: float
    output: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the JSON summary's line)."""
        return {
            "cluster": self.cluster,
            "status": self.status.value,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "output": self.output,
            "error": self.error,
        }


def _last_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("pgsnap:")]
    return lines[-1] if lines else (stderr.strip().splitlines() or [""])[-1]


def run_fleet(
    fleet: Fleet,
    argv_for: Callable[[str], Sequence[str]],
    *,
    parallel: int | None = None,
    per_storage: int | None = None,
    cluster_timeout: float | None = None,
    on_result: Callable[[FleetResult], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[FleetResult, ...]:
    """Run ``argv_for(name)`` (a pgsnap command line for one cluster) for every cluster,
    each in a process of its own: at most ``parallel`` at once, at most ``per_storage``
    at once per storage system (0: no limit), each stopped after ``cluster_timeout``
    seconds (SIGTERM, then SIGKILL a minute later). The arguments default to the
    fleet's ``[fleet]`` settings. ``on_result`` is called as each ends. Returns the
    results in the fleet's order."""
    workers = max(1, parallel if parallel is not None else fleet.parallel)
    limit = per_storage if per_storage is not None else fleet.per_storage
    timeout = cluster_timeout if cluster_timeout is not None else fleet.cluster_timeout
    gates: dict[str, threading.BoundedSemaphore] = {}
    running: set[subprocess.Popen[str]] = set()
    guard = threading.Lock()
    if limit:
        for member in fleet.members.values():
            gates.setdefault(member.storage, threading.BoundedSemaphore(limit))

    def one(name: str) -> FleetResult:
        gate = gates.get(fleet.members[name].storage)
        if gate is not None:
            gate.acquire()
        try:
            result = _run_one(name, argv_for(name), timeout, env, running, guard)
        finally:
            if gate is not None:
                gate.release()
        log.info("fleet %s: %s %s in %.1f s", fleet.source, name, result.status.value,
                 result.seconds)  # fmt: skip
        if on_result is not None:
            on_result(result)
        return result

    pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pgsnap-fleet")
    futures = {name: pool.submit(one, name) for name in fleet.names}
    try:
        return tuple(futures[name].result() for name in fleet.names)
    except BaseException:
        # Interrupted (Ctrl-C reaches the children too: they share the process group;
        # a SIGTERM sent to this process alone does not): no new cluster starts, and a
        # run still going a moment later is stopped as a timeout stops it.
        for future in futures.values():
            future.cancel()
        time.sleep(2)
        with guard:
            for proc in running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        raise
    finally:
        pool.shutdown(wait=True)


def _run_one(
    name: str,
    argv: Sequence[str],
    timeout: float | None,
    env: Mapping[str, str] | None,
    running: set[subprocess.Popen[str]],
    guard: threading.Lock,
) -> FleetResult:
    started = time.monotonic()
    with guard:
        proc = subprocess.Popen(  # pgsnap's own command line, in this process group
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=dict(env) if env is not None else None,
        )
        running.add(proc)
    try:
        return _wait(name, proc, started, timeout)
    finally:
        with guard:
            running.discard(proc)


def _wait(
    name: str, proc: subprocess.Popen[str], started: float, timeout: float | None
) -> FleetResult:
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)  # a backup leaves backup mode, a run its journal
        try:
            out, err = proc.communicate(timeout=_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    seconds = time.monotonic() - started
    code = proc.returncode
    if timed_out:
        status = RunStatus.TIMED_OUT
        error = f"stopped after {dt.timedelta(seconds=round(timeout or 0))}: " + _last_error(err)
    elif code == 0:
        status, error = RunStatus.OK, ""
    elif code == _EXIT_LOCKED:
        status, error = RunStatus.SKIPPED, _last_error(err)
    else:
        status, error = RunStatus.FAILED, _last_error(err)
    return FleetResult(name, status, code, seconds, out.strip(), error)


def own_command() -> list[str]:
    """How to start pgsnap's command in a child process: this interpreter, ``-m pgsnap``."""
    return [sys.executable, "-m", "pgsnap"]
