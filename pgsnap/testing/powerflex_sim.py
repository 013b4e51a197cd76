"""A stateful Dell PowerFlex gateway simulator, and a simulated SDC host.

:class:`PowerFlexSimulator` is an HTTP server on ``127.0.0.1`` (an ephemeral
port, a thread of its own) that answers as ``../shared/reference/powerflex.md``
documents a PowerFlex REST gateway, for versions 3.x, 4.x and 5.x (chosen
with ``version=``). Products embedding pgsnap can test against it too; it
knows nothing of pgsnap's client.

What it models:

- **objects**: one System, a StoragePool, Volumes (base volumes and
  snapshots, which are volumes), V-Trees, SDCs, Hosts, SnapshotPolicies; ids
  are 16 hex characters, increasing (a non-hex id is ``"must be a hexadecimal
  number"``);
- **hosts** (4.x, 5.x): an SDC is also a ``Host`` of the same id
  (``hostType`` ``SdcHost``; ``Sdc::<id>`` and ``Host::<id>`` are one
  object), and NVMe/TCP hosts (``NVMeHost``, an ``nqn``) are created with
  ``POST /api/types/Host/instances``; both types' listings hold both kinds
  (ansible-powerflex filters the Sdc listing on ``hostType``). 3.x has SDCs
  only;
- **the URL scheme**: ``/api/types/<T>/instances``, ``/api/instances/<T>::<id>``,
  ``.../action/<action>``, ``.../relationships/<Rel>``, type-level actions;
- **authentication**: ``GET /api/version`` (a JSON string; open by default,
  or needing authentication with ``version_needs_auth=True``); 3.x
  ``GET /api/login`` with Basic ``user:password`` gives a JSON string token
  used as the Basic password (user ignored), ``GET /api/logout``; 4.x and 5.x
  ``POST /rest/auth/login`` gives ``access_token``/``refresh_token`` used as
  ``Bearer``, ``POST /rest/auth/logout`` answers 204 (and ``/api/login``
  still works: its token is accepted as Bearer, as goscaleio uses it, and
  any token as the Basic password, as PyPowerFlex sends it to
  ``/api/version``). A
  token lives 8 hours, or until 10 minutes without use; :meth:`~PowerFlexSimulator.expire_tokens`
  ends every token now. 401 bodies are JSON on 3.x and HTML on 4.x/5.x
  (which the reference says clients must survive);
- **values**: numbers and booleans in request bodies are accepted as strings
  in any case (``"8"``, ``"TRUE"``, ``"True"``) or as JSON values;
  responses use JSON numbers, ``null`` for an unmapped volume's
  ``mappedSdcInfo``;
- **snapshots**: ``snapshotVolumes`` (3.x, 4.x) or ``createSnapshot`` (5.x;
  ``createThinClone`` makes ``ThinClone`` volumes) on ``System::<id>`` (or
  ``System`` without an id), one ``snapshotGroupId`` shared by every
  snapshot's ``consistencyGroupId``, ``volumeIdList`` in ``snapshotDefs``
  order, ``accessModeLimit`` defaulting to ``ReadWrite`` (``ReadOnly`` for
  5.x ``createSnapshot``: PyPowerFlex gen2 sends none, and 5.x snapshots are
  ``ReadOnlySnapshot``), ``retentionPeriodInMin`` making secure snapshots;
  all or nothing (the reference does not say; the simulator checks every
  definition first);
- **mapping**: ``addMappedSdc``/``removeMappedSdc`` (``sdcId`` or ``guid``;
  ``allSdcs``) on 3.x and 4.x; ``addMappedHost``/``removeMappedHost``
  (``hostId``, ``guid`` or ``nqn``; ``allHosts``; a mapping that does not
  exist is errorCode 4039) on 4.x (LXD) and 5.x, where they are the only
  mapping calls (PyPowerFlex gen2 has no ``addMappedSdc``: the simulator
  answers it 404, as it does ``snapshotVolumes``). Either way the volume's
  ``mappedSdcInfo`` lists the host (``sdcId`` is the host's id);
- **limits and rules**: 126 snapshots per V-Tree (1022 on 5.x) as
  ``details[0].rc == 182``; names of at most 31 characters without spaces
  (errorCode 226 / invalid characters) shared by volumes and snapshots
  (name in use); ``overwriteVolumeContent`` (3.x, 4.x) / ``restore`` (5.x)
  only within a V-Tree, never a volume with itself, never onto a mapped
  volume (the reference infers this; the simulator takes the strict side);
  removing a mapped volume is ``VOL_MAPPED`` (104); a secure snapshot cannot
  be removed or overwritten before ``secureSnapshotExpTime``; one SDC per
  volume unless ``allowMultipleMappings`` (errorCode 306);
- **errors** in the documented shape ``{"message", "httpStatusCode",
  "errorCode", "details"?}``: business errors are HTTP 500, malformed
  requests 400, authentication 401, an unknown route 404.

Volume content: every volume is a directory under ``root/luns/<id>`` (the
"LUN"; :meth:`~PowerFlexSimulator.volume_path`), and a snapshot is a full copy
of its source's tree (owners, modes, links kept). A restore empties the
target and copies the snapshot back. :meth:`~PowerFlexSimulator.simulated_host`
gives a :class:`~pgsnap.host.simulated.SimulatedHost` (the one the mock's
block mode uses too) over :class:`SdcDevices`: its devices
``/dev/disk/by-id/emc-vol-<system id>-<volume id>`` exist while the volume is
mapped to the SDC of its name, and its mounts are recorded, not performed:
mounting replaces the (empty) mount point by a symlink to the LUN. A real PostgreSQL server
so runs on simulated volumes through the same plan steps as on a real SDC.

Fault injection (:meth:`~PowerFlexSimulator.inject`): latency, an HTTP
status (5xx), a connection dropped before or after the request is carried
out, tokens expiring; each fault matches a method and a path fragment and
fires a number of times. :attr:`~PowerFlexSimulator.requests` records every
request (method, path, status) for counting.

HTTPS: the simulator speaks plain HTTP; :class:`TlsFront` is a
TLS-terminating front for it (clients that speak only HTTPS, such as Dell's
PyPowerFlex, and TLS tests), with a certificate from
:func:`make_certificate` (``openssl``: a throwaway CA, self-signed, or
issued for another host).

The simulator is checked against Dell's PyPowerFlex 2.0.1 driven as a user
would, over the TLS front (``tests/integration/test_powerflex_sdk.py``).

What it does not model: statistics, protection domains beyond one pool,
NVMe devices (NVMe hosts are objects that can be mapped, not devices a
simulated host sees), replication, auto-snapshot creation by policies
(policies are objects that can be paused and resumed), sizes beyond
bookkeeping.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import secrets
import select
import shutil
import socket
import ssl
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote, urlsplit

import attrs

from pgsnap._attrs import define, frozen
from pgsnap.errors import ConfigurationError
from pgsnap.host.simulated import SimulatedHost, SimulatedMount

if TYPE_CHECKING:
    from pgsnap.cluster import Cluster
    from pgsnap.testing.pgserver import PgServer

__all__ = [
    "DEVICE_DIR",
    "Fault",
    "GatewayCertificate",
    "PowerFlexSimulator",
    "SdcDevices",
    "SimRequest",
    "SimulatedSdcHost",
    "TlsFront",
    "make_certificate",
    "powerflex_cluster",
]

log = logging.getLogger(__name__)

DEVICE_DIR: Final = "/dev/disk/by-id"
"""Where an SDC shows PowerFlex volumes (``emc-vol-<system id>-<volume id>``)."""

_SNAP_LIMIT: Final = {3: 126, 4: 126, 5: 1022}
_NAME_MAX: Final = 31
_TOKEN_LIFETIME: Final = 8 * 3600.0
_TOKEN_IDLE: Final = 600.0
_HEX_ID = re.compile(r"^[0-9a-fA-F]{1,16}$")
_NAME_OK = re.compile(r"^[!-~]+$")  # printable ASCII, no space
_POLL_SECONDS: Final = 0.02


class _ApiError(Exception):
    """An error answer: HTTP status and the PowerFlex error body."""

    def __init__(
        self,
        status: int,
        message: str,
        error_code: int = 0,
        details: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {
            "message": message,
            "httpStatusCode": status,
            "errorCode": error_code,
        }
        if details is not None:
            self.body["details"] = [dict(d) for d in details]


def _business(
    message: str, code: int = 0, symbol: str | None = None, rc: int | None = None
) -> _ApiError:
    if symbol is None and rc is None:
        return _ApiError(500, message, code)
    detail: dict[str, Any] = {"errorMessage": message}
    if symbol is not None:
        detail["error"] = symbol
    if rc is not None:
        detail["rc"] = rc
    return _ApiError(500, "Error with details", code, [detail])


def _volume_not_found() -> _ApiError:
    return _ApiError(500, "Could not find the volume", 79)


def _flag(value: object, what: str) -> bool:
    """A boolean as the gateway accepts it: JSON bool or a string in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise _ApiError(400, f"Invalid value for {what}: {value!r}")


def _number(value: object, what: str) -> int:
    """A number as the gateway accepts it: JSON number or a decimal string."""
    if isinstance(value, bool):
        raise _ApiError(400, f"Invalid value for {what}: {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise _ApiError(400, f"Invalid value for {what}: {value!r}")


def _text(body: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = body.get(key)
    if value is None:
        if required:
            raise _ApiError(400, f"Missing required field: {key}")
        return None
    if not isinstance(value, str):
        raise _ApiError(400, f"Invalid value for {key}: {value!r}")
    return value


def _check_name(name: str) -> None:
    if len(name) > _NAME_MAX:
        raise _business("The given name exceeds the allowed length of 31 characters.", 226)
    if not _NAME_OK.match(name):
        raise _business(
            "The given name contains invalid characters. Use alphanumeric and punctuation "
            "characters only. Spaces are not allowed.",
            227,
        )


def _copy_tree(src: Path, dst: Path) -> None:
    from pgsnap.backends.mock._files import copy_into  # noqa: PLC0415 - the mock's faithful copy

    copy_into(src, dst)


def _empty(path: Path) -> None:
    from pgsnap.backends.mock._files import empty_dir  # noqa: PLC0415

    empty_dir(path)


# --------------------------------------------------------------------------- state


@define
class _Volume:
    id: str
    name: str
    vtree_id: str
    size_kb: int
    volume_type: str
    created: int
    ancestor: str | None = None
    group_id: str | None = None
    access_mode: str = "ReadWrite"
    secure_until: int = 0
    sdcs: list[tuple[str, str]] = attrs.Factory(list)  # (sdc id, access mode)
    policy_id: str | None = None


@define
class _Host:
    """A host of the system: an SDC (``SdcHost``) or, on 4.x and 5.x, an NVMe host
    (``NVMeHost``). One object under two types: ``Sdc::<id>`` is ``Host::<id>``."""

    id: str
    name: str
    guid: str | None
    ip: str | None
    host_type: str = "SdcHost"
    nqn: str | None = None
    max_num_paths: int | None = None
    max_num_sys_ports: int | None = None


@define
class _Policy:
    id: str
    name: str
    cadence_min: int
    retained: list[int]
    paused: bool
    access_mode: str
    secure: bool
    sources: list[str] = attrs.Factory(list)


@define
class _Token:
    value: str
    scheme: str  # "basic" (3.x /api/login), "bearer"
    created: float
    used: float
    refresh: str | None = None


@frozen
class SimRequest:
    """One request the simulator answered (or dropped: ``status`` 0)."""

    method: str
    path: str
    status: int
    action: str | None = None
    """The ``action/<name>`` of the path, if any."""


@define
class Fault:
    """A fault the simulator injects into matching requests.

    ``kind``: ``"status"`` (answer ``status`` without doing anything),
    ``"drop"`` (close the connection before doing anything), ``"drop_after"``
    (do it, then close the connection without answering: the client cannot
    know whether it happened), ``"drop_partial"`` (for a snapshot call: take
    only the first of its ``snapshotDefs``, then close the connection: the
    reference does not say a failed multi-volume call is all or nothing),
    ``"latency"`` (sleep ``seconds`` first, then
    answer normally) or ``"expire_tokens"`` (every token expires just before
    the request is checked). ``method`` and ``path_contains`` select the
    requests (None: any); ``times`` is how many it fires for (None: always).
    ``seconds`` delays any kind of fault (a slow 504, a slow drop). One fault
    fires per request: the first that matches.
    """

    kind: str
    method: str | None = None
    path_contains: str | None = None
    times: int | None = 1
    status: int = 503
    seconds: float = 0.0
    body: Any = None
    """For ``"status"``: the body to answer (JSON, or bytes sent as HTML); default
    ``{"message": <reason>, "httpStatusCode": status, "errorCode": 0}``."""
    fired: int = 0

    def matches(self, method: str, path: str) -> bool:
        """Whether this fault applies to the request (and has shots left)."""
        if self.times is not None and self.fired >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        return self.path_contains is None or self.path_contains in path


_FAULT_KINDS: Final = frozenset(
    {"status", "drop", "drop_after", "drop_partial", "latency", "expire_tokens"}
)


class _Drop(Exception):
    """Close the connection without an answer."""


# --------------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # one write per answer (flushed by handle_one_request)
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: requests are recorded in :attr:`PowerFlexSimulator.requests`."""

    def do_GET(self) -> None:
        """Answer a GET."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """Answer a POST."""
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        """Answer a DELETE (never routed: 404)."""
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        sim = self.server.sim
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = unquote(urlsplit(self.path).path)
        try:
            status, body, ctype = sim._handle(method, path, dict(self.headers.items()), raw)
        except _Drop:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(2)
            return
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        if status == HTTPStatus.NO_CONTENT:
            payload = b""
        self.send_response(status)
        if payload:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload:
            self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    sim: PowerFlexSimulator


class PowerFlexSimulator:
    """A stateful PowerFlex REST gateway on 127.0.0.1 (see the module docstring).

    ``version`` is what ``/api/version`` answers (``"3.6"``, ``"4.5"``,
    ``"5.0"``...); ``username``/``password`` the only account; ``root`` holds
    the volumes' directories (default: a temporary directory removed by
    :meth:`stop`). Use as a context manager, or :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        *,
        version: str = "3.6",
        username: str = "admin",
        password: str = "Sim-Passw0rd!",  # noqa: S107 - a simulator's fixed test account
        system_id: str = "1a2b3c4d5e6f7081",
        root: Path | str | None = None,
        version_needs_auth: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not re.match(r"^\d+(\.\d+)*$", version):
            raise ConfigurationError(f"invalid PowerFlex version {version!r}", hint="e.g. '3.6'")
        self.version = version
        self.major = int(version.split(".", maxsplit=1)[0])
        if self.major not in _SNAP_LIMIT:
            raise ConfigurationError(
                f"the simulator speaks PowerFlex 3.x, 4.x and 5.x, not {version}",
                hint="use '3.6', '4.5' or '5.0'",
            )
        self._username = username
        self._password = password
        self.system_id = system_id
        self.pool_id = "e0d8f6c900000000"
        self.version_needs_auth = version_needs_auth
        self._clock = clock
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="pgsnap-pfsim-")) if root is None else Path(root)
        (self.root / "luns").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._volumes: dict[str, _Volume] = {}
        self._hosts: dict[str, _Host] = {}
        self._policies: dict[str, _Policy] = {}
        self._tokens: dict[str, _Token] = {}
        self._refresh: dict[str, str] = {}
        self._mounts: list[SimulatedMount] = []
        self._counters: dict[str, int] = {}
        self._faults: list[Fault] = []
        self.requests: list[SimRequest] = []
        """Every request answered, in order (for counting)."""
        self.logins = 0
        """Successful logins (any scheme)."""
        self._issued: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        where = self.url if self._server is not None else "stopped"
        return f"<PowerFlexSimulator {self.version} {where}>"

    # ------------------------------------------------------------------ life cycle

    def start(self) -> PowerFlexSimulator:
        """Listen on 127.0.0.1 (an ephemeral port) in a background thread."""
        if self._server is None:
            server = _Server(("127.0.0.1", 0), _Handler)
            server.sim = self
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="pgsnap-pfsim",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening; remove the temporary root if the simulator made it."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PowerFlexSimulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (the gateway address to give a client)."""
        if self._server is None:
            raise ConfigurationError("the simulator is not started", hint="call start()")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def credentials(self) -> tuple[str, str]:
        """The account ``(username, password)`` (test code only)."""
        return self._username, self._password

    # ------------------------------------------------------------------ test set-up

    def add_volume(self, name: str, *, size_gb: int = 8) -> str:
        """Create a base volume (as ``POST /api/types/Volume/instances`` does); its id."""
        with self._lock:
            return self._create_volume(name, size_gb * 1024 * 1024)

    def add_sdc(self, name: str, *, guid: str | None = None, ip: str | None = None) -> str:
        """Register an SDC (a host running the PowerFlex client); its id.

        On 4.x and 5.x the SDC is also a ``Host`` (``hostType`` ``SdcHost``) of
        the same id, listed by ``GET /api/types/Host/instances``.
        """
        with self._lock:
            sid = self._new_id("sdc")
            n = len(self._hosts) + 1
            self._hosts[sid] = _Host(
                sid,
                name,
                guid or f"{n:08X}-0000-4000-8000-{sid[-12:].upper()}",
                ip or f"10.0.0.{n}",
            )
            return sid

    def add_nvme_host(self, name: str, *, nqn: str | None = None) -> str:
        """Register an NVMe/TCP host (4.x and 5.x, as ``POST /api/types/Host/instances``
        does); its id."""
        if self.major < 4:
            raise ConfigurationError(
                f"PowerFlex {self.version} has no NVMe hosts", hint="use version '4.5' or '5.0'"
            )
        with self._lock:
            nqn = nqn or f"nqn.2014-08.org.nvmexpress:uuid:{name}"
            return self._create_host({"name": name, "nqn": nqn})

    def add_policy(
        self, name: str, volume_ids: Sequence[str] = (), *, cadence_min: int = 60
    ) -> str:
        """Create an active snapshot policy with ``volume_ids`` as source volumes; its id."""
        with self._lock:
            pid = self._create_policy(
                {"name": name, "autoSnapshotCreationCadenceInMin": cadence_min}
            )
            for vid in volume_ids:
                self._policy_add_source(self._policies[pid], vid)
            return pid

    def volume_path(self, volume_id: str) -> Path:
        """The directory holding a volume's (or snapshot's) content."""
        return self.root / "luns" / volume_id

    def volume(self, volume_id: str) -> dict[str, Any]:
        """A volume's JSON as ``GET /api/instances/Volume::<id>`` gives it."""
        with self._lock:
            return self._volume_json(self._volume(volume_id))

    def volume_ids(self) -> tuple[str, ...]:
        """Every volume id (snapshots included), oldest first."""
        with self._lock:
            return tuple(self._volumes)

    def device_path(self, volume_id: str) -> str:
        """The device an SDC shows for the volume."""
        return f"{DEVICE_DIR}/emc-vol-{self.system_id}-{volume_id}"

    def set_secure_expiry(self, volume_id: str, epoch: int) -> None:
        """Move a secure snapshot's expiry (tests: let it expire)."""
        with self._lock:
            self._volume(volume_id).secure_until = epoch

    def inject(self, fault: Fault) -> Fault:
        """Add a fault (see :class:`Fault`); returned so tests can read ``fired``."""
        if fault.kind not in _FAULT_KINDS:
            raise ConfigurationError(
                f"unknown fault kind {fault.kind!r}", hint=f"one of {sorted(_FAULT_KINDS)}"
            )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        """Remove every fault."""
        with self._lock:
            self._faults.clear()

    def expire_tokens(self) -> None:
        """Every token issued so far stops working (as after 10 minutes idle)."""
        with self._lock:
            self._tokens.clear()

    def issued_tokens(self) -> tuple[str, ...]:
        """Every token (access and refresh) ever issued: tests look for leaks of them."""
        with self._lock:
            return tuple(self._issued)

    def count(self, *, method: str | None = None, action: str | None = None) -> int:
        """How many recorded requests match."""
        return sum(
            1
            for r in self.requests
            if (method is None or r.method == method) and (action is None or r.action == action)
        )

    def simulated_host(self, name: str) -> SimulatedHost:
        """A :class:`~pgsnap.host.simulated.SimulatedHost` named ``name`` that sees this
        array's volumes mapped to the SDC of that name (registered now if unknown)."""
        with self._lock:
            if not any(s.name == name and s.host_type == "SdcHost" for s in self._hosts.values()):
                self.add_sdc(name)
        return SimulatedHost(SdcDevices(self), name=name)

    # ------------------------------------------------------------------ HTTP entry

    def _handle(
        self, method: str, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, Any, str]:
        action = path.rsplit("/action/", 1)[1] if "/action/" in path else None
        fault = self._take_fault(method, path)
        if fault is not None and fault.seconds > 0:
            time.sleep(fault.seconds)
        if fault is not None and fault.kind == "latency":
            fault = None
        if fault is not None and fault.kind == "expire_tokens":
            self.expire_tokens()
            fault = None
        if fault is not None and fault.kind == "drop":
            self._record(method, path, 0, action)
            raise _Drop
        if fault is not None and fault.kind == "status":
            self._record(method, path, fault.status, action)
            if isinstance(fault.body, bytes):
                return fault.status, fault.body, "text/html"
            if fault.body is not None:
                return fault.status, fault.body, "application/json"
            err = _ApiError(fault.status, HTTPStatus(fault.status).phrase)
            return fault.status, err.body, "application/json"
        if fault is not None and fault.kind == "drop_partial":
            with suppress(ValueError, TypeError, KeyError):
                data = json.loads(raw)
                data["snapshotDefs"] = data["snapshotDefs"][:1]
                raw = json.dumps(data).encode()
        try:
            with self._lock:
                status, body, ctype = self._route(method, path, headers, raw)
        except _ApiError as exc:
            status, body, ctype = exc.status, exc.body, "application/json"
        except Exception:  # a simulator bug: answer as a gateway's internal error would
            log.exception("simulator: %s %s failed", method, path)
            status, body, ctype = (
                500,
                _ApiError(500, "Internal server error").body,
                "application/json",
            )
        if status == HTTPStatus.UNAUTHORIZED and self.major >= 4:
            body, ctype = b"<html><body><h1>401 Unauthorized</h1></body></html>", "text/html"
        if fault is not None and fault.kind in {"drop_after", "drop_partial"}:
            self._record(method, path, 0, action)
            raise _Drop
        self._record(method, path, status, action)
        return status, body, ctype

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.fired += 1
                    return fault
        return None

    def _record(self, method: str, path: str, status: int, action: str | None) -> None:
        with self._lock:
            self.requests.append(SimRequest(method, path, status, action))

    def _route(
        self, method: str, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, Any, str]:
        js = "application/json"
        if method == "POST" and path == "/rest/auth/login":
            return 200, self._rest_login(self._body(raw)), js
        if method == "POST" and path == "/rest/auth/logout":
            self._rest_logout(headers, self._body(raw))
            return 204, b"", js
        if method == "GET" and path == "/api/login":
            return 200, self._api_login(headers), js
        if method == "GET" and path == "/api/version":
            if self.version_needs_auth:
                self._authenticate(headers)
            return 200, self.version, js
        if not path.startswith("/api/"):
            raise _ApiError(404, "no route handled")
        token = self._authenticate(headers)
        if method == "GET" and path == "/api/logout":
            self._tokens.pop(token.value, None)
            return 200, b"", js
        body = self._body(raw) if method == "POST" else {}
        return 200, self._api(method, path[len("/api") :], body), js

    @staticmethod
    def _body(raw: bytes) -> dict[str, Any]:
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            raise _ApiError(400, "Malformed JSON body") from None
        if not isinstance(data, dict):
            raise _ApiError(400, "The request body must be a JSON object")
        return data

    # ------------------------------------------------------------------ authentication

    def _issue(self, scheme: str, *, refresh: bool = False) -> _Token:
        now = self._clock()
        token = _Token(secrets.token_urlsafe(24), scheme, now, now)
        if refresh:
            token.refresh = secrets.token_urlsafe(24)
            self._refresh[token.refresh] = token.value
        self._tokens[token.value] = token
        self._issued.extend(t for t in (token.value, token.refresh) if t)
        self.logins += 1
        return token

    def _api_login(self, headers: Mapping[str, str]) -> str:
        user, password = self._basic(headers)
        if (user, password) != (self._username, self._password):
            raise _ApiError(401, "Unauthorized")
        return self._issue("basic").value

    def _rest_login(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if self.major < 4:
            raise _ApiError(404, "no route handled")
        if (body.get("username"), body.get("password")) != (self._username, self._password):
            raise _ApiError(401, "Unauthorized")
        token = self._issue("bearer", refresh=True)
        return {"access_token": token.value, "refresh_token": token.refresh, "scope": "openid"}

    def _rest_logout(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> None:
        if self.major < 4:
            raise _ApiError(404, "no route handled")
        token = self._authenticate(headers)
        refresh = body.get("refresh_token")
        if not isinstance(refresh, str) or self._refresh.get(refresh) != token.value:
            raise _ApiError(400, "Invalid refresh token")
        del self._refresh[refresh]
        self._tokens.pop(token.value, None)

    @staticmethod
    def _basic(headers: Mapping[str, str]) -> tuple[str, str]:
        auth = _header(headers, "Authorization")
        if not auth or not auth.lower().startswith("basic "):
            raise _ApiError(401, "Unauthorized")
        try:
            decoded = base64.b64decode(auth[6:].strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise _ApiError(401, "Unauthorized") from None
        user, _, password = decoded.partition(":")
        return user, password

    def _authenticate(self, headers: Mapping[str, str]) -> _Token:
        """The token of a request: 3.x Basic (any user, the token as the password);
        4.x and 5.x Bearer, or Basic as on 3.x (PyPowerFlex asks ``/api/version``
        so, and the gateway accepts it); any live token of either login."""
        auth = _header(headers, "Authorization") or ""
        if self.major >= 4 and auth.lower().startswith("bearer "):
            value = auth[7:].strip()
        else:
            value = self._basic(headers)[1]  # the user part is ignored
        token = self._tokens.get(value)
        now = self._clock()
        if token is None or now - token.created > _TOKEN_LIFETIME or now - token.used > _TOKEN_IDLE:
            self._tokens.pop(value, None)
            raise _ApiError(401, "Unauthorized")
        token.used = now
        return token

    # ------------------------------------------------------------------ the API

    def _api(self, method: str, path: str, body: dict[str, Any]) -> Any:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["types"] and len(parts) >= 3 and parts[2] == "instances":
            kind = parts[1]
            if len(parts) == 3:
                if method == "GET":
                    return self._list(kind)
                if method == "POST":
                    return self._create(kind, body)
            if len(parts) == 5 and parts[3] == "action" and method == "POST":
                return self._type_action(kind, parts[4], body)
        if parts[:1] == ["instances"] and len(parts) >= 2:
            kind, _, oid = parts[1].partition("::")
            if len(parts) == 2 and method == "GET":
                return self._get(kind, oid)
            if len(parts) == 4 and parts[2] == "action" and method == "POST":
                return self._action(kind, oid, parts[3], body)
            if len(parts) == 4 and parts[2] == "relationships" and method == "GET":
                return self._relationship(kind, oid, parts[3])
        raise _ApiError(404, "no route handled")

    def _list(self, kind: str) -> Any:
        if kind == "System":
            return [self._system_json()]
        if kind == "Volume":
            return [self._volume_json(v) for v in self._volumes.values()]
        if kind == "Sdc":
            return [self._sdc_json(s) for s in self._hosts.values()]
        if kind == "Host" and self.major >= 4:
            return [self._host_json(h) for h in self._hosts.values()]
        if kind == "SnapshotPolicy":
            return [self._policy_json(p) for p in self._policies.values()]
        if kind == "StoragePool":
            return [
                {
                    "id": self.pool_id,
                    "name": "pool1",
                    "protectionDomainId": "a1b2c3d400000000",
                    "zeroPaddingEnabled": True,
                }
            ]
        raise _ApiError(404, "no route handled")

    def _get(self, kind: str, oid: str) -> Any:
        if kind == "System":
            if oid != self.system_id:
                self._check_hex(oid)
                raise _business("Not found", 3)
            return self._system_json()
        if kind == "Volume":
            return self._volume_json(self._volume(oid))
        if kind == "VTree":
            return self._vtree_json(self._vtree(oid))
        if kind == "Sdc":
            return self._sdc_json(self._sdc(oid))
        if kind == "Host" and self.major >= 4:
            return self._host_json(self._sdc(oid))
        if kind == "SnapshotPolicy":
            return self._policy_json(self._policy(oid))
        raise _ApiError(404, "no route handled")

    def _relationship(self, kind: str, oid: str, rel: str) -> Any:
        if kind == "VTree" and rel == "Volume":
            vtree = self._vtree(oid)
            return [self._volume_json(v) for v in self._volumes.values() if v.vtree_id == vtree]
        if kind == "SnapshotPolicy" and rel == "SourceVolume":
            policy = self._policy(oid)
            return [self._volume_json(self._volumes[v]) for v in policy.sources]
        if (kind == "Sdc" or (kind == "Host" and self.major >= 4)) and rel == "Volume":
            sdc = self._sdc(oid)
            return [
                self._volume_json(v)
                for v in self._volumes.values()
                if any(s == sdc.id for s, _ in v.sdcs)
            ]
        if kind == "System" and rel == "Sdc":
            self._get("System", oid)
            return [self._sdc_json(s) for s in self._hosts.values()]
        raise _ApiError(404, "no route handled")

    def _create(self, kind: str, body: dict[str, Any]) -> Any:
        if kind == "Volume":
            name = _text(body, "name")
            assert name is not None
            if "volumeSizeInKb" in body:
                size_kb = _number(body["volumeSizeInKb"], "volumeSizeInKb")
            else:
                size_kb = _number(body.get("volumeSizeInGb", "8"), "volumeSizeInGb") * 1024 * 1024
            _text(body, "storagePoolId")
            return {"id": self._create_volume(name, size_kb)}
        if kind == "SnapshotPolicy":
            return {"id": self._create_policy(body)}
        if kind == "Host" and self.major >= 4:
            return {"id": self._create_host(body)}
        raise _ApiError(404, "no route handled")

    def _type_action(self, kind: str, action: str, body: dict[str, Any]) -> Any:
        if action == "queryIdByKey":
            if kind == "Volume":
                name = _text(body, "name")
                for v in self._volumes.values():
                    if v.name == name:
                        return v.id
                raise _volume_not_found()
            if kind == "Sdc":
                ip = _text(body, "ip")
                for s in self._hosts.values():
                    if s.ip == ip:
                        return s.id
                raise _business("Could not find the SDC", 0, "INI_NOT_FOUND")
            if kind == "SnapshotPolicy":
                name = _text(body, "name")
                for p in self._policies.values():
                    if p.name == name:
                        return p.id
                raise _business("Not found", 3)
        if kind == "VTree" and action == "queryBySelectedIds":
            ids = body.get("ids")
            if not isinstance(ids, list):
                raise _ApiError(400, "Missing required field: ids")
            return [self._vtree_json(self._vtree(str(i))) for i in ids]
        if kind == "System" and action in {"snapshotVolumes", "createSnapshot", "createThinClone"}:
            return self._snapshot_volumes(action, body)
        if kind == "System" and action == "removeConsistencyGroupSnapshots":
            return self._remove_group(body)
        raise _ApiError(404, "no route handled")

    def _action(self, kind: str, oid: str, action: str, body: dict[str, Any]) -> Any:
        if kind == "System":
            if oid:  # CIN and CS call System actions without ::<id>
                self._get("System", oid)
            return self._type_action("System", action, body)
        if kind == "Volume":
            vol = self._volume(oid)
            return self._volume_action(vol, action, body)
        if kind == "SnapshotPolicy":
            return self._policy_action(self._policy(oid), action, body)
        if kind == "Sdc" or (kind == "Host" and self.major >= 4):
            return self._host_action(kind, self._sdc(oid), action, body)
        raise _ApiError(404, "no route handled")

    # ------------------------------------------------------------------ volumes

    def _new_id(self, kind: str) -> str:
        prefixes = {
            "vol": "a0b1c2d3",
            "vtree": "6e862550",
            "cg": "5aaf81e8",
            "sdc": "d0e1f2a3",
            "pol": "f1e2d3c4",
        }
        n = self._counters.get(kind, 0) + 1
        self._counters[kind] = n
        return f"{prefixes[kind]}{n:08x}"

    def _check_hex(self, oid: str) -> None:
        if not _HEX_ID.match(oid):
            raise _business(f"Invalid id {oid!r}: id must be a hexadecimal number", 0)

    def _volume(self, oid: str) -> _Volume:
        self._check_hex(oid)
        vol = self._volumes.get(oid.lower())
        if vol is None:
            raise _volume_not_found()
        return vol

    def _vtree(self, oid: str) -> str:
        self._check_hex(oid)
        if not any(v.vtree_id == oid for v in self._volumes.values()):
            raise _business("Not found", 3)
        return oid

    def _name_free(self, name: str) -> None:
        _check_name(name)
        if any(v.name == name for v in self._volumes.values()):
            raise _business("Volume name already in use. Please use a different name.", 99)

    def _create_volume(self, name: str, size_kb: int) -> str:
        self._name_free(name)
        vid = self._new_id("vol")
        self._volumes[vid] = _Volume(
            vid, name, self._new_id("vtree"), size_kb, "ThinProvisioned", int(self._clock())
        )
        self.volume_path(vid).mkdir(mode=0o755)
        return vid

    def _snapshots_in(self, vtree: str) -> int:
        return sum(1 for v in self._volumes.values() if v.vtree_id == vtree and v.ancestor)

    def _snapshot_volumes(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        v5 = self.major >= 5
        if (action == "snapshotVolumes") == v5:
            raise _ApiError(404, "no route handled")  # 5.x: createSnapshot / createThinClone
        defs = body.get("snapshotDefs")
        if not isinstance(defs, list) or not defs:
            raise _ApiError(400, "Missing required field: snapshotDefs")
        # Omitted, the access mode is ReadWrite (csm#1302) up to 4.x. On 5.x a snapshot is
        # read-only (ReadOnlySnapshot): PyPowerFlex gen2 sends no accessModeLimit to
        # createSnapshot (writable copies are createThinClone's), and ansible-powerflex's
        # 5.x samples are ReadOnlySnapshot/ReadOnly.
        default = "ReadOnly" if action == "createSnapshot" else "ReadWrite"
        access = body.get("accessModeLimit", default)
        if access not in {"ReadOnly", "ReadWrite"}:
            raise _ApiError(400, f"Invalid value for accessModeLimit: {access!r}")
        retention = 0
        if body.get("retentionPeriodInMin") is not None:
            retention = _number(body["retentionPeriodInMin"], "retentionPeriodInMin")
        if "allowOnExtManagedVol" in body:
            _flag(body["allowOnExtManagedVol"], "allowOnExtManagedVol")
        # Everything is checked before anything is taken: all or nothing.
        sources: list[tuple[_Volume, str]] = []
        names: set[str] = set()
        per_tree: dict[str, int] = {}
        for n, d in enumerate(defs):
            if not isinstance(d, dict):
                raise _ApiError(400, "Invalid snapshotDefs entry")
            src = self._volume(str(_text(d, "volumeId")))
            name = _text(d, "snapshotName", required=False) or f"snapshot-{src.id}-{n}"
            self._name_free(name)
            if name in names:
                raise _business("Volume name already in use. Please use a different name.", 99)
            names.add(name)
            per_tree[src.vtree_id] = per_tree.get(src.vtree_id, 0) + 1
            if self._snapshots_in(src.vtree_id) + per_tree[src.vtree_id] > _SNAP_LIMIT[self.major]:
                raise _business(
                    "There are too many snapshots in the VTree", 0, "TOO_MANY_SNAPS_IN_VTREE", 182
                )
            sources.append((src, name))
        group = self._new_id("cg")
        now = int(self._clock())
        ids = []
        for src, name in sources:
            sid = self._new_id("vol")
            vtype = "ThinClone" if action == "createThinClone" else "Snapshot"
            if v5 and vtype == "Snapshot" and access == "ReadOnly":
                vtype = "ReadOnlySnapshot"
            snap = _Volume(
                sid,
                name,
                src.vtree_id,
                src.size_kb,
                vtype,
                now,
                ancestor=src.id,
                group_id=group,
                access_mode=access,
                secure_until=now + retention * 60 if retention else 0,
            )
            path = self.volume_path(sid)
            path.mkdir(mode=0o700)
            _copy_tree(self.volume_path(src.id), path)
            st = os.stat(self.volume_path(src.id))
            os.chmod(path, stat.S_IMODE(st.st_mode))
            with suppress(PermissionError):
                os.chown(path, st.st_uid, st.st_gid)
            self._volumes[sid] = snap
            ids.append(sid)
        return {"snapshotGroupId": group, "volumeIdList": ids}

    def _remove_group(self, body: dict[str, Any]) -> dict[str, Any]:
        gid = _text(body, "snapGroupId")
        members = [v for v in self._volumes.values() if v.group_id == gid]
        if not members:
            raise _business(
                "No volumes were found under the given consistency group or the consistency "
                "group ID is not valid",
                0,
                "VOL_NOT_FOUND_FOR_SNAP_GROUP",
            )
        for v in members:
            self._removable(v)
        for v in members:
            self._drop(v)
        return {"numberOfVolumes": len(members)}

    def _removable(self, vol: _Volume) -> None:
        if vol.sdcs:
            raise _business("Volume is mapped", 104, "VOL_MAPPED")
        if vol.secure_until and vol.secure_until > self._clock():
            raise _business(
                f"The snapshot is secure and cannot be removed before its expiry time "
                f"({vol.secure_until})",
                0,
                "SECURE_SNAPSHOT_NOT_EXPIRED",
            )

    def _drop(self, vol: _Volume) -> None:
        for child in self._volumes.values():
            if child.ancestor == vol.id:
                child.ancestor = vol.ancestor
        for policy in self._policies.values():
            if vol.id in policy.sources:
                policy.sources.remove(vol.id)
        del self._volumes[vol.id]
        shutil.rmtree(self.volume_path(vol.id), ignore_errors=True)

    def _volume_action(self, vol: _Volume, action: str, body: dict[str, Any]) -> Any:
        v5 = self.major >= 5
        if action == "removeVolume":
            mode = _text(body, "removeMode")
            if mode not in {"ONLY_ME", "INCLUDING_DESCENDANTS", "DESCENDANTS_ONLY", "WHOLE_VTREE"}:
                raise _ApiError(400, f"Invalid value for removeMode: {mode!r}")
            victims = [vol]
            if mode != "ONLY_ME":
                victims = [v for v in self._volumes.values() if self._descends(v, vol)]
                if mode == "INCLUDING_DESCENDANTS":
                    victims.append(vol)
                if mode == "WHOLE_VTREE":
                    victims = [v for v in self._volumes.values() if v.vtree_id == vol.vtree_id]
            for v in victims:
                self._removable(v)
            for v in victims:
                self._drop(v)
            return {}
        if action in {"overwriteVolumeContent", "restore", "refresh"}:
            if (action == "overwriteVolumeContent") == v5:
                raise _ApiError(404, "no route handled")
            src = self._volume(str(_text(body, "srcVolumeId")))
            if "allowOnExtManagedVol" in body:
                _flag(body["allowOnExtManagedVol"], "allowOnExtManagedVol")
            if src.id == vol.id:
                raise _business(
                    "You cannot overwrite a volume with itself", 0, "VOLUME_AND_SNAPSHOT_MATCH"
                )
            if src.vtree_id != vol.vtree_id:
                raise _business(
                    "To overwrite the content of a volume, the source and target volumes must "
                    "be from the same V-Tree.",
                    0,
                    "VTREE_ID_MISMATCH",
                )
            if vol.sdcs:
                raise _business("Volume is mapped", 104, "VOL_MAPPED")
            if vol.secure_until and vol.secure_until > self._clock():
                raise _business(
                    "A secure snapshot cannot be altered before its expiry time",
                    0,
                    "SECURE_SNAPSHOT_NOT_EXPIRED",
                )
            target = self.volume_path(vol.id)
            _empty(target)
            _copy_tree(self.volume_path(src.id), target)
            return {}
        if action in {"addMappedSdc", "addMappedHost"}:
            by_host = action == "addMappedHost"
            if (by_host and self.major < 4) or (not by_host and v5):
                # 3.x has no Host objects; 5.x (PyPowerFlex gen2) maps through them only.
                raise _ApiError(404, "no route handled")
            host = self._host_from(body) if by_host else self._sdc_from(body)
            multiple = _flag(body.get("allowMultipleMappings", "FALSE"), "allowMultipleMappings")
            mode = body.get("accessMode", "ReadWrite")
            if mode not in {"ReadWrite", "ReadOnly", "NoAccess"}:
                raise _ApiError(400, f"Invalid value for accessMode: {mode!r}")
            if any(s == host.id for s, _ in vol.sdcs):
                raise _business(
                    "The volume is already mapped to this SDC", 81, "VOL_ALREADY_MAPPED_TO_THIS_INI"
                )
            if vol.sdcs and not multiple:
                raise _business(
                    "Only a single SDC may be mapped to this volume at a time",
                    306,
                    "NOT_ALLOWED_MORE_THAN_ONE_MAPPING",
                )
            if vol.access_mode == "ReadOnly" or vol.secure_until:
                mode = "ReadOnly"
            vol.sdcs.append((host.id, str(mode)))
            return {}
        if action in {"removeMappedSdc", "removeMappedHost"}:
            by_host = action == "removeMappedHost"
            if (by_host and self.major < 4) or (not by_host and v5):
                raise _ApiError(404, "no route handled")
            if ("allHosts" if by_host else "allSdcs") in body:
                vol.sdcs.clear()
                return {}
            host = self._host_from(body) if by_host else self._sdc_from(body)
            if not any(s == host.id for s, _ in vol.sdcs):
                if by_host:  # LXD: removeMappedHost of a mapping that does not exist
                    raise _business("The mapping does not exist", 4039)
                raise _business("The volume is not mapped to this SDC", 84, "VOL_NOT_MAPPED_TO_INI")
            if any(m.volume_id == vol.id for m in self._mounts):
                # Not the gateway's business in reality; the SDC's device is in use.
                log.warning("simulator: volume %s unmapped while mounted", vol.id)
            vol.sdcs = [(s, m) for s, m in vol.sdcs if s != host.id]
            return {}
        if action == "setVolumeName":
            name = str(_text(body, "newName"))
            self._name_free(name)
            vol.name = name
            return {}
        if action == "setSnapshotSecurity":
            minutes = _number(body.get("retentionPeriodInMin"), "retentionPeriodInMin")
            until = int(self._clock()) + minutes * 60
            if until < vol.secure_until:
                raise _business("The retention period can be delayed but not advanced", 0)
            vol.secure_until = until
            vol.access_mode = "ReadOnly"
            return {}
        raise _ApiError(404, "no route handled")

    def _descends(self, v: _Volume, root: _Volume) -> bool:
        seen = v.ancestor
        while seen is not None:
            if seen == root.id:
                return True
            seen = self._volumes[seen].ancestor if seen in self._volumes else None
        return False

    # ------------------------------------------------------------------ SDCs

    def _sdc(self, oid: str) -> _Host:
        """A host by id (``Sdc::<id>`` and ``Host::<id>`` name the same object)."""
        self._check_hex(oid)
        sdc = self._hosts.get(oid.lower())
        if sdc is None:
            raise _business("Could not find the SDC", 0, "INI_NOT_FOUND")
        return sdc

    def _sdc_from(self, body: Mapping[str, Any]) -> _Host:
        """The SDC of an ``addMappedSdc``/``removeMappedSdc`` body (``sdcId`` or ``guid``)."""
        if body.get("sdcId") is not None:
            sdc = self._sdc(str(body["sdcId"]))
            if sdc.host_type != "SdcHost":
                raise _business("Could not find the SDC", 0, "INI_NOT_FOUND")
            return sdc
        guid = body.get("guid")
        if isinstance(guid, str):
            for s in self._hosts.values():
                if s.guid is not None and s.guid.lower() == guid.lower():
                    return s
            raise _business("Could not find the SDC", 0, "INI_NOT_FOUND")
        raise _ApiError(400, "Missing required field: sdcId or guid")

    def _host_from(self, body: Mapping[str, Any]) -> _Host:
        """The host of an ``addMappedHost``/``removeMappedHost`` body: ``hostId``, an SDC's
        ``guid`` or an NVMe host's ``nqn`` (PyPowerFlex gen2, LXD)."""
        if body.get("hostId") is not None:
            return self._sdc(str(body["hostId"]))
        for key, attr in (("guid", "guid"), ("nqn", "nqn")):
            value = body.get(key)
            if isinstance(value, str):
                for h in self._hosts.values():
                    known = getattr(h, attr)
                    if known is not None and known.lower() == value.lower():
                        return h
                raise _business("Could not find the host", 0, "INI_NOT_FOUND")
        raise _ApiError(400, "Missing required field: hostId, guid or nqn")

    def _create_host(self, body: Mapping[str, Any]) -> str:
        """``POST /api/types/Host/instances``: an NVMe host (``nqn`` required)."""
        nqn = str(_text(body, "nqn"))
        if any(h.nqn == nqn for h in self._hosts.values()):
            raise _business("A host with this NQN already exists", 0)
        hid = self._new_id("sdc")
        name = _text(body, "name", required=False) or f"NVMeHost:{hid}"
        _check_name(name)
        paths = body.get("maxNumPaths")
        ports = body.get("maxNumSysPorts")
        self._hosts[hid] = _Host(
            hid,
            name,
            None,
            None,
            host_type="NVMeHost",
            nqn=nqn,
            max_num_paths=None if paths is None else _number(paths, "maxNumPaths"),
            max_num_sys_ports=None if ports is None else _number(ports, "maxNumSysPorts"),
        )
        return hid

    def _host_action(self, kind: str, host: _Host, action: str, body: dict[str, Any]) -> Any:
        if kind == "Sdc" and action == "setSdcName":
            name = str(_text(body, "sdcName"))
            _check_name(name)
            host.name = name
            return {}
        if kind == "Sdc" and action == "removeSdc":  # SDCs and NVMe hosts alike (GS, LXD)
            if any(s == host.id for v in self._volumes.values() for s, _ in v.sdcs):
                raise _business("The SDC has mapped volumes", 0)
            del self._hosts[host.id]
            return {}
        if kind == "Host" and action == "modifyMaxNumPaths":
            host.max_num_paths = _number(body.get("newMaxNumPaths"), "newMaxNumPaths")
            return {}
        if kind == "Host" and action == "modifyMaxNumSysPorts":
            host.max_num_sys_ports = _number(body.get("newMaxNumSysPorts"), "newMaxNumSysPorts")
            return {}
        raise _ApiError(404, "no route handled")

    # ------------------------------------------------------------------ policies

    def _create_policy(self, body: Mapping[str, Any]) -> str:
        name = str(_text(body, "name"))
        _check_name(name)
        if any(p.name == name for p in self._policies.values()):
            raise _business("A snapshot policy with this name already exists", 0)
        cadence = _number(body.get("autoSnapshotCreationCadenceInMin", "60"), "cadence")
        retained = body.get("numOfRetainedSnapshotsPerLevel", ["4"])
        if not isinstance(retained, list):
            raise _ApiError(400, "Invalid value for numOfRetainedSnapshotsPerLevel")
        pid = self._new_id("pol")
        self._policies[pid] = _Policy(
            pid,
            name,
            cadence,
            [_number(r, "numOfRetainedSnapshotsPerLevel") for r in retained],
            _flag(body.get("paused", "false"), "paused"),
            str(body.get("snapshotAccessMode", "ReadOnly")),
            _flag(body.get("secureSnapshots", "false"), "secureSnapshots"),
        )
        return pid

    def _policy(self, oid: str) -> _Policy:
        self._check_hex(oid)
        policy = self._policies.get(oid.lower())
        if policy is None:
            raise _business("Not found", 3)
        return policy

    def _policy_add_source(self, policy: _Policy, volume_id: str) -> None:
        vol = self._volume(volume_id)
        if vol.policy_id is not None:
            raise _business(
                "The volume is already a source volume of a snapshot policy",
                0,
                "SOURCE_VOL_ALREADY_IN_SNAP_POLICY",
            )
        vol.policy_id = policy.id
        policy.sources.append(vol.id)

    def _policy_action(self, policy: _Policy, action: str, body: dict[str, Any]) -> Any:
        v5 = self.major >= 5
        add, remove = (
            ("assignSnapshotPolicy", "unassignSnapshotPolicy")
            if v5
            else ("addSourceVolumeToSnapshotPolicy", "removeSourceVolumeFromSnapshotPolicy")
        )
        if action == "pauseSnapshotPolicy":
            policy.paused = True
            return {}
        if action == "resumeSnapshotPolicy":
            policy.paused = False
            return {}
        if action == add:
            self._policy_add_source(policy, str(_text(body, "sourceVolumeId")))
            return {}
        if action == remove:
            vol = self._volume(str(_text(body, "sourceVolumeId")))
            if vol.id not in policy.sources:
                raise _business("The volume is not a source volume of this policy", 0)
            policy.sources.remove(vol.id)
            vol.policy_id = None
            return {}
        if action == "removeSnapshotPolicy":
            if policy.sources:
                raise _business(
                    "The snapshot policy has source volumes", 0, "SNAP_POLICY_HAS_SOURCE_VOLUMES"
                )
            del self._policies[policy.id]
            return {}
        raise _ApiError(404, "no route handled")

    # ------------------------------------------------------------------ JSON

    def _system_json(self) -> dict[str, Any]:
        return {
            "id": self.system_id,
            "name": "pgsnap-sim",
            "systemVersionName": f"DellEMC PowerFlex Version: R{self.version.replace('.', '_')}",
            "links": [{"rel": "self", "href": f"/api/instances/System::{self.system_id}"}],
        }

    def _volume_json(self, v: _Volume) -> dict[str, Any]:
        mapped = None
        if v.sdcs:
            mapped = []
            for sid, mode in v.sdcs:
                sdc = self._hosts[sid]
                info: dict[str, Any] = {
                    "sdcId": sdc.id,  # an NVMe host's id too (LXD compares it with hostId)
                    "sdcIp": sdc.ip,
                    "sdcName": sdc.name,
                    "accessMode": mode,
                    "limitIops": 0,
                    "limitBwInMbps": 0,
                    "isDirectBufferMapping": False,
                }
                if self.major >= 4:
                    info["hostType"] = sdc.host_type
                    info["nqn"] = sdc.nqn
                mapped.append(info)
        links = [{"rel": "self", "href": f"/api/instances/Volume::{v.id}"}]
        if v.ancestor:
            links.append(
                {
                    "rel": "/api/parent/relationship/ancestorVolumeId",
                    "href": f"/api/instances/Volume::{v.ancestor}",
                }
            )
        links.append(
            {
                "rel": "/api/parent/relationship/vtreeId",
                "href": f"/api/instances/VTree::{v.vtree_id}",
            }
        )
        return {
            "id": v.id,
            "name": v.name,
            "volumeType": v.volume_type,
            "ancestorVolumeId": v.ancestor,
            "vtreeId": v.vtree_id,
            "consistencyGroupId": v.group_id,
            "storagePoolId": self.pool_id,
            "sizeInKb": v.size_kb,
            "creationTime": v.created,
            "accessModeLimit": v.access_mode,
            "secureSnapshotExpTime": v.secure_until,
            "lockedAutoSnapshot": False,
            "autoSnapshotGroupId": None,
            "snplIdOfAutoSnapshot": None,
            "snplIdOfSourceVolume": v.policy_id,
            "mappedSdcInfo": mapped,
            "notGenuineSnapshot": False,
            "managedBy": "ScaleIO",
            "dataLayout": "MediumGranularity",
            "volumeReplicationState": "UnmarkedForReplication",
            "links": links,
        }

    def _vtree_json(self, vtree: str) -> dict[str, Any]:
        members = [v for v in self._volumes.values() if v.vtree_id == vtree]
        base = next((v for v in members if v.ancestor is None), members[0])
        return {
            "id": vtree,
            "name": base.name,
            "baseVolumeId": base.id,
            "storagePoolId": self.pool_id,
            "rootVolumes": [base.id],
            "inDeletion": False,
            "vtreeMigrationInfo": {"migrationStatus": "NotInMigration"},
            "links": [{"rel": "self", "href": f"/api/instances/VTree::{vtree}"}],
        }

    def _sdc_json(self, s: _Host) -> dict[str, Any]:
        nvme = s.host_type == "NVMeHost"
        data: dict[str, Any] = {
            "id": s.id,
            "name": s.name,
            "sdcGuid": s.guid,
            "sdcIp": s.ip,
            "sdcIps": None if s.ip is None else [s.ip],
            "sdcApproved": None if nvme else True,
            "mdmConnectionState": None if nvme else "Connected",
            "systemId": self.system_id,
            "osType": None if nvme else "Linux",
            "perfProfile": None if nvme else "HighPerformance",
            "links": [
                {"rel": "self", "href": f"/api/instances/Sdc::{s.id}"},
                {
                    "rel": "/api/Sdc/relationship/Volume",
                    "href": f"/api/instances/Sdc::{s.id}/relationships/Volume",
                },
            ],
        }
        if self.major >= 4:
            data["hostType"] = s.host_type
        return data

    def _host_json(self, h: _Host) -> dict[str, Any]:
        """A Host as ansible-powerflex's samples show one: the SDC's fields, ``hostType``,
        ``nqn``, ``maxNumPaths``, ``maxNumSysPorts`` and ``Host::`` links."""
        data = self._sdc_json(h)
        data.update(
            {
                "hostType": h.host_type,
                "nqn": h.nqn,
                "maxNumPaths": h.max_num_paths,
                "maxNumSysPorts": h.max_num_sys_ports,
                "hostOsFullType": "Generic" if h.host_type == "NVMeHost" else "Linux",
                "links": [
                    {"rel": "self", "href": f"/api/instances/Host::{h.id}"},
                    {
                        "rel": "/api/Host/relationship/Volume",
                        "href": f"/api/instances/Host::{h.id}/relationships/Volume",
                    },
                    {
                        "rel": "/api/parent/relationship/systemId",
                        "href": f"/api/instances/System::{self.system_id}",
                    },
                ],
            }
        )
        return data

    def _policy_json(self, p: _Policy) -> dict[str, Any]:
        return {
            "id": p.id,
            "name": p.name,
            "autoSnapshotCreationCadenceInMin": p.cadence_min,
            "numOfRetainedSnapshotsPerLevel": list(p.retained),
            "maxVTreeAutoSnapshots": sum(p.retained),
            "snapshotPolicyState": "Paused" if p.paused else "Active",
            "snapshotAccessMode": p.access_mode,
            "secureSnapshots": p.secure,
            "numOfSourceVolumes": len(p.sources),
            "numOfAutoSnapshots": 0,
            "numOfLockedSnapshots": 0,
            "numOfExpiredButLockedSnapshots": 0,
            "numOfCreationFailures": 0,
            "lastAutoSnapshotCreationFailureReason": "NR",
            "nextAutoSnapshotCreationTime": 0,
            "timeOfLastAutoSnapshot": 0,
            "systemId": self.system_id,
        }

    # ------------------------------------------------------------------ the simulated host

    def _host_volume(self, host: str, device: str) -> str | None:
        """The volume of ``device`` when the SDC named ``host`` sees it (mapped), else None."""
        prefix = f"{DEVICE_DIR}/emc-vol-{self.system_id}-"
        if not device.startswith(prefix):
            return None
        vid = device[len(prefix) :]
        with self._lock:
            vol = self._volumes.get(vid)
            if vol is None:
                return None
            names = {
                self._hosts[s].name for s, _ in vol.sdcs if self._hosts[s].host_type == "SdcHost"
            }
            return vid if host in names else None

    def _claims(self, device: str) -> bool:
        if device.startswith(f"{DEVICE_DIR}/emc-vol-{self.system_id}-"):
            return True
        with self._lock:
            return any(os.path.abspath(device) == str(self.volume_path(v)) for v in self._volumes)


# --------------------------------------------------------------------------- TLS


@frozen
class GatewayCertificate:
    """A server certificate made for tests by :func:`make_certificate`.

    ``cert`` and ``key`` (PEM) are what the server presents; ``ca`` is the
    bundle a client gives as ``verify=`` (PyPowerFlex: ``certificate_path=``)
    to trust it; ``hosts`` the names and addresses it was issued for.
    """

    cert: Path
    key: Path
    ca: Path
    hosts: tuple[str, ...]


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigurationError(
            "making a test certificate needs the openssl command",
            hint="apt-get install openssl",
        )
    done = subprocess.run([openssl, *args], capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise ConfigurationError(
            f"openssl {args[0]} failed: {done.stderr.strip()}",
            hint="check the openssl installation (OpenSSL 1.1.1 or newer)",
        )


def make_certificate(
    directory: Path | str,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    self_signed: bool = False,
    name: str = "gateway",
) -> GatewayCertificate:
    """A server certificate for ``hosts`` (IP addresses and DNS names), made with
    ``openssl`` in ``directory`` (ECDSA P-256, valid 30 days).

    By default a throwaway CA (``<name>-ca.pem``) signs it, as a company CA
    would; ``self_signed=True`` makes a self-signed certificate, its own CA
    bundle. A client that is not given ``ca`` refuses either ("unable to get
    local issuer certificate", "self-signed certificate"); one connecting by
    an address not in ``hosts`` refuses it as a hostname mismatch.
    """
    if not hosts:
        raise ConfigurationError("a certificate needs at least one host", hint="e.g. 127.0.0.1")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    san = ",".join(
        f"IP:{h}" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:]*", h) else f"DNS:{h}"
        for h in hosts
    )
    key, cert = out / f"{name}.key", out / f"{name}.pem"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    if self_signed:
        _openssl(
            "req", "-x509", *ec, "-keyout", str(key), "-out", str(cert), "-days", "30",
            "-subj", f"/CN={hosts[0]}", "-addext", f"subjectAltName={san}",
            "-addext", "keyUsage=critical,digitalSignature,keyCertSign",
        )  # fmt: skip
        return GatewayCertificate(cert, key, cert, tuple(hosts))
    ca_key, ca = out / f"{name}-ca.key", out / f"{name}-ca.pem"
    _openssl(
        "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "30",
        "-subj", f"/CN=pgsnap test CA {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    csr, ext = out / f"{name}.csr", out / f"{name}.ext"
    ext.write_text(
        f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    _openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={hosts[0]}")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-set_serial", str(secrets.randbits(63)), "-days", "30", "-out", str(cert),
        "-extfile", str(ext),
    )  # fmt: skip
    return GatewayCertificate(cert, key, ca, tuple(hosts))


class TlsFront:
    """A TLS-terminating front on 127.0.0.1 for a plain-HTTP server.

    It accepts TLS connections presenting ``certificate`` and relays each
    one's bytes to a new connection to ``upstream`` (``http://host:port``,
    e.g. :attr:`PowerFlexSimulator.url`), both ways, until either side
    closes: the gateway's HTTPS, as a client that speaks only HTTPS
    (PyPowerFlex) needs it. Several fronts (other certificates) may serve one
    simulator. :attr:`connections` counts the TCP connections accepted and
    :attr:`handshake_failures` records why server-side handshakes failed (with
    TLS 1.3 a client that refuses the certificate does so after the server's
    side of the handshake is done: it shows as a connection closed with
    nothing relayed).
    """

    def __init__(self, upstream: str, certificate: GatewayCertificate) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ConfigurationError(
                f"the TLS front relays to http://host:port, not {upstream!r}",
                hint="give the simulator's url (start it first)",
            )
        self._upstream = (parts.hostname, parts.port)
        self.certificate = certificate
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(str(certificate.cert), str(certificate.key))
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0
        """TCP connections accepted so far."""
        self.handshake_failures: list[str] = []
        """Why each failed TLS handshake failed (the server side's view)."""

    def __repr__(self) -> str:
        where = self.url if self._sock is not None else "stopped"
        return f"<TlsFront {where} -> {self._upstream[0]}:{self._upstream[1]}>"

    @property
    def port(self) -> int:
        """The port the front listens on."""
        if self._sock is None:
            raise ConfigurationError("the TLS front is not started", hint="call start()")
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TlsFront:
        """Listen on 127.0.0.1 (an ephemeral port) in a background thread."""
        if self._sock is None:
            sock = socket.create_server(("127.0.0.1", 0))
            sock.settimeout(0.05)
            self._sock = sock
            self._stopping.clear()
            self._thread = threading.Thread(target=self._serve, name="pgsnap-tlsfront", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every relayed connection."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        with self._lock:
            live = list(self._live)
        for s in live:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> TlsFront:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            tls = self._context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            with self._lock:
                self.handshake_failures.append(str(exc))
            conn.close()
            return
        try:
            up = socket.create_connection(self._upstream, timeout=30)
        except OSError:
            tls.close()
            return
        with self._lock:
            self._live.update((tls, up))
        try:
            self._pump(tls, up)
        finally:
            with self._lock:
                self._live.difference_update((tls, up))
            for s in (up, tls):
                with suppress(OSError):
                    s.close()

    def _pump(self, tls: ssl.SSLSocket, up: socket.socket) -> None:
        while not self._stopping.is_set():
            if tls.pending():
                ready: list[Any] = [tls]
            else:
                ready = select.select([tls, up], [], [], 0.5)[0]
            for src in ready:
                dst = up if src is tls else tls
                try:
                    data = src.recv(1 << 16)
                    if not data:
                        return
                    dst.sendall(data)
                except (OSError, ValueError):
                    return


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


class SdcDevices:
    """The volumes of a :class:`PowerFlexSimulator` as its SDCs see them.

    The :class:`~pgsnap.host.simulated.SimulatedDevices` of the simulator's
    hosts: a device ``/dev/disk/by-id/emc-vol-<system id>-<volume id>`` exists
    on an SDC while the volume is mapped to it, and resolves to the volume's
    directory (its LUN). The mount table is kept in memory, under the
    simulator's lock.
    """

    fstype: Final = "simfs"
    attached_to: Final = "mapped to SDC"
    attach_hint: Final = "map the volume to this SDC (addMappedSdc)"

    def __init__(self, sim: PowerFlexSimulator) -> None:
        self._sim = sim

    def __repr__(self) -> str:
        return repr(self._sim)

    def device_volume(self, path: str) -> str | None:
        """The volume id of a device path of this system (mapped anywhere or not)."""
        prefix = f"{DEVICE_DIR}/emc-vol-{self._sim.system_id}-"
        return path[len(prefix) :] if path.startswith(prefix) else None

    def claims(self, path: str) -> str | None:
        """A device's volume, or the volume whose LUN ``path`` is."""
        found = self.device_volume(path)
        if found is not None:
            return found
        where = os.path.abspath(path)
        with self._sim._lock:
            return next((v for v in self._sim._volumes if where == str(self.volume_path(v))), None)

    def lun(self, host: str, volume_id: str) -> Path | None:
        """The LUN while the volume is mapped to the SDC named ``host``."""
        sim = self._sim
        with sim._lock:
            vol = sim._volumes.get(volume_id)
            if vol is None:
                return None
            names = {
                sim._hosts[s].name for s, _ in vol.sdcs if sim._hosts[s].host_type == "SdcHost"
            }
            return sim.volume_path(volume_id) if host in names else None

    def volume_path(self, volume_id: str) -> Path | None:
        """The volume's directory (its LUN)."""
        return self._sim.volume_path(volume_id)

    def device_path(self, volume_id: str) -> str:
        """The device an SDC shows for the volume."""
        return self._sim.device_path(volume_id)

    @contextmanager
    def mount_table(self, *, write: bool) -> Iterator[list[SimulatedMount]]:
        """The simulated mounts of every SDC, under the simulator's lock."""
        with self._sim._lock:
            yield self._sim._mounts


SimulatedSdcHost = SimulatedHost
"""The host :meth:`PowerFlexSimulator.simulated_host` gives (its old name)."""


def powerflex_cluster(
    server: PgServer,
    sim: PowerFlexSimulator,
    *,
    host_name: str = "db1",
    backend_options: Mapping[str, Any] | None = None,
    **cluster_options: Any,
) -> Cluster:
    """A :class:`~pgsnap.cluster.Cluster` for ``server`` on ``sim``'s volumes.

    As :func:`pgsnap.testing.sandbox.mock_cluster` in block mode: the data
    directory, the WAL directory and the archive each move onto a new
    simulated PowerFlex volume (``pgdata``, ``pgwal``, ``archive``), mapped to
    the SDC ``host_name`` and mounted back where the server expects them
    through :meth:`PowerFlexSimulator.simulated_host`. The backend is a
    :class:`~pgsnap.backends.powerflex.PowerFlexBackend` talking HTTP to
    ``sim`` (``backend_options`` are passed to it). A running server is
    stopped while its directories move, and started again.
    """
    from pgsnap.backends.powerflex import PowerFlexBackend  # noqa: PLC0415
    from pgsnap.model import Volume, VolumeRole  # noqa: PLC0415
    from pgsnap.testing.sandbox import server_cluster  # noqa: PLC0415

    user, password = sim.credentials
    backend = PowerFlexBackend(sim.url, user, password, **dict(backend_options or {}))
    host = sim.simulated_host(host_name)
    was_running = server.is_running()
    if was_running:
        server.stop()
    volumes = []
    for name, role, path in (
        ("pgdata", VolumeRole.DATA, server.data_dir),
        ("pgwal", VolumeRole.WAL, server.wal_dir),
        ("archive", VolumeRole.ARCHIVE, server.archive_dir),
    ):
        vid = sim.add_volume(name)
        lun = sim.volume_path(vid)
        os.rmdir(lun)
        os.rename(path, lun)  # the content (owner, modes) moves as it is
        os.mkdir(path, 0o755)  # the mount point
        backend.attach(vid, host.name)
        device = backend.locate(vid).path
        host.wait_for_device(device, timeout=10)
        host.mount(device, str(path))
        volumes.append(Volume(vid, name, role, str(path)))
    if was_running:
        server.start()
    return server_cluster(server, backend, volumes, host=host, **cluster_options)
