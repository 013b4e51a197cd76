"""``powerflex``: Dell PowerFlex (ScaleIO, VxFlex OS) over its REST gateway.

Volumes, snapshots and restores
-------------------------------

- **A volume is a PowerFlex volume**, named by its 16-hex-digit id; methods
  also accept its name (:meth:`PowerFlexBackend.ex_volume_id` resolves one),
  but records always carry ids, so layouts should name volumes by id.
- **A snapshot is a read-only PowerFlex snapshot** (a volume of the source's
  V-Tree whose ``accessModeLimit`` is ``ReadOnly``). A group is one
  ``snapshotVolumes`` call (``createSnapshot`` on 5.x) for every volume at
  once: PowerFlex takes them at one instant and gives them one
  ``consistencyGroupId``, the group's id. Backup snapshots are always
  read-only (a writable snapshot could be mapped and written, and the backup
  would silently change); ``secure=True`` adds ``retentionPeriodInMin``
  (``secure_retention_minutes``, default one day).
- **Names** (31 characters at most, printable ASCII without spaces) come from
  the group name (pgsnap's backup id) and the volume's name:
  ``<backup id>.<volume name>``, e.g. ``20261201T060000123Z.pgdata``, so the
  array's UI shows which backup a snapshot belongs to and the catalog can be
  rebuilt from the array (:func:`snapshot_names`). A group name longer than
  22 characters is shortened to 15 characters, ``~`` and 6 hex digits of its
  SHA-256; the group's ``name`` as the backend reports it is then that token.
- **Clones** (``CLONES``) are writable snapshots of a backup's snapshot
  (``createThinClone`` on 5.x): V-Tree descendants, listed as volumes, that
  can be mapped to another SDC for dev/test copies
  (:meth:`PowerFlexBackend.ex_clone_to_host`).
- **A restore** overwrites the volume from the snapshot, which stays:
  ``overwriteVolumeContent`` on 3.x and 4.x, the ``restore`` action on 5.x
  (decided by ``/api/version``). The profile is
  ``RestoreProfile(before=DETACH)``: the plan unmounts the file system,
  unmaps the volume from the SDC (``removeMappedSdc``), overwrites, maps it
  again (``addMappedSdc``), waits for ``/dev/disk/by-id/emc-vol-<system
  id>-<volume id>`` (:meth:`~PowerFlexBackend.locate`) and mounts. A restore
  of a volume still mapped is refused by the backend itself.
- **Mapping** (``MAPPING``): ``attach``/``detach`` take the SDC's id, GUID,
  IP address or name; both are idempotent. A volume is mapped to one SDC at
  a time unless ``allow_multiple_mappings=True``. As Dell's PyPowerFlex does
  it: on 3.x and 4.x through the SDC (``GET /api/types/Sdc/instances``,
  ``addMappedSdc``/``removeMappedSdc`` with ``sdcId``), on 5.x through the
  SDC's Host object, of the same id (``GET /api/types/Host/instances``,
  ``addMappedHost``/``removeMappedHost`` with ``hostId``). NVMe/TCP hosts
  are refused: their devices are not ``emc-vol-`` paths.
- **Policies** (``POLICIES``): snapshot policies are listed with their
  source volumes and paused or resumed (recovery plans pause the policies of
  the volumes they restore).
- **Deletes**: a group with ``removeConsistencyGroupSnapshots``, a snapshot
  with ``removeVolume`` (``ONLY_ME``). A secure snapshot before its expiry,
  or a mapped one, is refused before anything is sent, with the expiry time.

The client
----------

:class:`PowerFlexClient` speaks to the gateway with a ``requests.Session``
(injected or created), a timeout on every request and TLS verification on
(``verify`` may be a CA bundle path; ``verify=False`` warns). A certificate
that does not verify (untrusted, or issued for another host) or a failed TLS
handshake is :class:`PowerFlexTLSError`, with OpenSSL's reason and what to
give as ``verify``, and is never retried: it is not transient. ``/api/version``
decides how to log in: 3.x ``GET /api/login`` with Basic credentials, the
token then used as the Basic password; 4.x and 5.x ``POST /rest/auth/login``
and ``Bearer``. The token is reused by every call; a 401 logs in again once
and repeats the request; :meth:`~PowerFlexClient.close` logs out. Request
bodies carry numbers and booleans as strings (``"60"``, ``"TRUE"``).

Reads (GET and read-only queries) are retried with tenacity on connection
errors, timeouts and 502/503/504, with jittered exponential backoff, within
``retry_attempts`` and a total ``retry_deadline``. Writes are sent once:
their outcome after such a failure is unknown
(:class:`PowerFlexUncertainError`). ``snapshotVolumes`` is the exception that
is retried, never blindly: after an uncertain failure the snapshots are
looked for by their names; found, they are the group (one group, never two);
partly found, those are removed; not found, the call is made again.

Errors are :mod:`pgsnap.errors`: the PowerFlex error body (``message``,
``httpStatusCode``, ``errorCode``, ``details[].rc/error/errorMessage``)
becomes a :class:`PowerFlexAPIError` carrying those fields, or one of its
subclasses (:class:`PowerFlexNotFound`, :class:`PowerFlexNameInUse`,
:class:`PowerFlexSnapshotLimit` for ``rc`` 182, :class:`PowerFlexVolumeMapped`,
:class:`PowerFlexSecureSnapshot`); a 401 that a new login does not cure is
:class:`~pgsnap.errors.AuthenticationError`, naming the user and where the
password came from (``$PGSNAP_POWERFLEX_PASSWORD`` or ``password_env``; a
wrong password fails every call so, before anything reaches the array); an
unreachable gateway is :class:`~pgsnap.errors.BackendUnavailable`. No
``requests`` exception escapes. The password and tokens are never logged,
shown in a ``repr`` or put in an error.

The password: ``password=`` is for Python callers; configuration files give
``password_env`` (the name of an environment variable, default
``PGSNAP_POWERFLEX_PASSWORD``), never the password.

Where the reference (``powerflex.md``) is silent, the safe side is taken;
docs/reference/powerflex.md lists each choice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import random
import re
import ssl
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote, urlsplit

import tenacity

from pgsnap.errors import (
    AuthenticationError,
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    SnapshotLimitError,
    SnapshotNotFound,
    VolumeNotFound,
)
from pgsnap.model import (
    Location,
    RestorePreparation,
    RestoreProfile,
    Severity,
    Snapshot,
    SnapshotGroup,
    SnapshotPolicy,
    StorageProblem,
    StorageVolume,
)
from pgsnap.protocols import Capability

if TYPE_CHECKING:
    import requests

__all__ = [
    "DEFAULT_PASSWORD_ENV",
    "NAME_MAX",
    "VTREE_SNAPSHOT_LIMIT",
    "PowerFlexAPIError",
    "PowerFlexBackend",
    "PowerFlexClient",
    "PowerFlexNameInUse",
    "PowerFlexNotFound",
    "PowerFlexSecureSnapshot",
    "PowerFlexSnapshotLimit",
    "PowerFlexTLSError",
    "PowerFlexUncertainError",
    "PowerFlexVolumeMapped",
    "snapshot_names",
]

log = logging.getLogger(__name__)

_NAME: Final = "powerflex"
NAME_MAX: Final = 31
"""The longest name PowerFlex accepts for a volume or snapshot."""
DEFAULT_PASSWORD_ENV: Final = "PGSNAP_POWERFLEX_PASSWORD"  # noqa: S105 - a variable name
"""The environment variable read for the password when none is given."""

_GROUP_MAX: Final = 22
_HEX_ID = re.compile(r"^[0-9a-fA-F]{16}$")
_BAD_NAME_CHARS = re.compile(r"[^!-~]")
_TRANSIENT_STATUS: Final = frozenset({502, 503, 504})
VTREE_SNAPSHOT_LIMIT: Final = {3: 126, 4: 126, 5: 1022}
"""Snapshots one V-Tree may hold, by PowerFlex major version (newer: the 5.x figure)."""
_SNAPSHOT_TYPES: Final = frozenset({"Snapshot", "ReadOnlySnapshot"})


# --------------------------------------------------------------------------- errors


class PowerFlexAPIError(BackendError):
    """The gateway refused a request: ``status``, ``error_code``, ``rc``, ``error``
    (the symbolic code of ``details[0]``) and ``api_message`` as it answered."""


class PowerFlexNotFound(PowerFlexAPIError, LookupError):
    """The object does not exist (errorCode 3, 78, 79; a non-hexadecimal id)."""


class PowerFlexNameInUse(PowerFlexAPIError):
    """The name is already used by a volume or snapshot (names share one namespace)."""


class PowerFlexSnapshotLimit(PowerFlexAPIError, SnapshotLimitError):
    """Too many snapshots in the V-Tree (``rc`` 182; 126 per V-Tree, 1022 on 5.x).

    Also a :class:`~pgsnap.errors.SnapshotLimitError`, as every backend's.
    """


class PowerFlexVolumeMapped(PowerFlexAPIError):
    """The volume is mapped to an SDC and the operation needs it unmapped (errorCode 104)."""


class PowerFlexSecureSnapshot(PowerFlexAPIError):
    """A secure snapshot cannot be removed or changed before its expiry (``expires_at``)."""


class PowerFlexUncertainError(BackendUnavailable):
    """A write failed in a way that leaves its outcome unknown (connection lost,
    timeout, 502/503/504): the gateway may or may not have carried it out."""


class PowerFlexTLSError(BackendError):
    """The TLS connection to the gateway failed for a reason a retry cannot cure: its
    certificate does not verify (``reason`` ``CERTIFICATE_VERIFY_FAILED`` and
    ``verify_message``, e.g. "self-signed certificate" or a hostname mismatch), or
    the handshake itself failed (e.g. ``WRONG_VERSION_NUMBER``: not a TLS port).
    Never retried."""


class _Transient(Exception):
    """One attempt failed in a way a retry may cure (internal)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


# --------------------------------------------------------------------------- helpers


def _encode(value: Any) -> Any:
    """A request body as the gateway expects it: numbers and booleans as strings."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The :class:`ssl.SSLError` under a requests/urllib3 exception, if any."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLError):
            return e
        todo.extend(a for a in e.args if isinstance(a, BaseException))
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
        todo.extend(n for n in (e.__cause__, e.__context__) if n is not None)
    return None


def _ssl_text(err: ssl.SSLError) -> str:
    """The SSL error as OpenSSL words it, without CPython's source location."""
    if isinstance(err, ssl.SSLCertVerificationError) and err.verify_message:
        return f"certificate verify failed: {str(err.verify_message).rstrip('.')}"
    text = str(err.args[1]) if len(err.args) > 1 else str(err)
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", text).strip() or type(err).__name__


def _clean_name(text: str) -> str:
    return _BAD_NAME_CHARS.sub("_", text)


def _group_token(name: str) -> str:
    clean = _clean_name(name)
    if len(clean) <= _GROUP_MAX and clean == name:
        return clean
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{clean[:15]}~{digest}"


def snapshot_names(group_name: str, volume_names: Sequence[str]) -> tuple[str, ...]:
    """The snapshot names of a group: ``<group token>.<volume token>``, at most 31 characters.

    Deterministic: the same group and volume names give the same snapshot
    names. The group token is ``group_name`` when it is at most 22 printable
    characters without spaces, else its first 15 (cleaned) characters, ``~``
    and 6 hex digits of its SHA-256. The volume token is the volume's name
    (``.`` and spaces made ``_``) cut to fit; volumes whose tokens collide get
    ``~<n>`` instead of their last characters.
    """
    token = _group_token(group_name)
    room = NAME_MAX - len(token) - 1
    tokens = [_clean_name(v).replace(".", "_")[:room] or "v" for v in volume_names]
    seen: dict[str, int] = {}
    for t in tokens:
        seen[t] = seen.get(t, 0) + 1
    out = []
    for n, t in enumerate(tokens):
        if seen[t] > 1:
            suffix = f"~{n}"
            t = t[: room - len(suffix)] + suffix  # noqa: PLW2901
        out.append(f"{token}.{t}")
    return tuple(out)


def _group_name_of(snapshot_name: str) -> str:
    head, dot, _ = snapshot_name.rpartition(".")
    return head if dot and head else snapshot_name


def _when(epoch: object) -> dt.datetime:
    try:
        seconds = float(str(epoch))
    except ValueError:
        seconds = 0.0
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _text(value: object) -> str:
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- the client


class PowerFlexClient:
    """A PowerFlex REST gateway session (see the module docstring).

    ``gateway`` is ``https://host[:port]``; ``verify`` is True (the system's
    CAs), a CA bundle path, or False (warned: anyone on the path could read
    the credentials). ``sleep`` is how retries wait (tests pass a no-op).
    """

    def __init__(
        self,
        gateway: str,
        username: str,
        password: str,
        *,
        session: requests.Session | None = None,
        verify: bool | str = True,
        timeout: float = 30.0,
        retry_attempts: int = 5,
        retry_deadline: float = 60.0,
        backoff: float = 0.5,
        sleep: Callable[[float], None] | None = None,
        password_source: str = "the password given to pgsnap",  # noqa: S107 - a description
    ) -> None:
        try:
            import requests  # noqa: PLC0415 - an optional dependency (pgsnap[powerflex])
        except ImportError:
            raise ConfigurationError(
                "the powerflex backend needs the requests library",
                hint="pip install 'pgsnap[powerflex]'",
            ) from None

        self._requests = requests
        parts = urlsplit(gateway)
        if parts.scheme not in {"https", "http"} or not parts.hostname:
            raise ConfigurationError(
                "the PowerFlex gateway must be an https:// URL",
                hint="e.g. gateway='https://pfgw.example:443'",
            )
        if parts.username is not None or parts.password is not None:
            raise ConfigurationError(
                "the PowerFlex gateway URL must not hold credentials",
                hint="give username= and the password (or its environment variable) instead",
            )
        if parts.scheme == "http" and parts.hostname not in {"127.0.0.1", "::1", "localhost"}:
            warnings.warn(
                f"the PowerFlex gateway {gateway} is plain http: the credentials cross the "
                "network in clear",
                UserWarning,
                stacklevel=3,
            )
            log.warning("the PowerFlex gateway %s is plain http", gateway)
        if timeout <= 0 or retry_attempts < 1 or retry_deadline <= 0:
            raise ConfigurationError(
                "timeout and retry_deadline must be positive, retry_attempts at least 1",
                hint="the defaults are timeout=30, retry_attempts=5, retry_deadline=60",
            )
        self.gateway = gateway.rstrip("/")
        self.username = username
        self.__password = password
        if verify is False:
            warnings.warn(
                f"TLS verification of the PowerFlex gateway {self.gateway} is turned off: "
                "the credentials can be read by anyone on the path",
                UserWarning,
                stacklevel=3,
            )
            log.warning("TLS verification of %s is turned off (verify=False)", self.gateway)
        if isinstance(verify, str) and not os.path.exists(verify):
            raise ConfigurationError(
                f"verify names the CA bundle {verify}, which does not exist",
                hint="give verify = the path of a PEM file (or a c_rehash directory) holding "
                "the gateway's CA certificate, or true for the system's CAs",
                verify=verify,
            )
        self._verify = verify
        self._password_source = password_source
        self._timeout = timeout
        self._own_session = session is None
        self._session = session if session is not None else requests.Session()
        self._attempts = retry_attempts
        self._deadline = retry_deadline
        self._backoff = backoff
        self._sleep = sleep if sleep is not None else time.sleep
        self.__token: str | None = None
        self.__refresh: str | None = None
        self._scheme: str | None = None  # "basic" (3.x) or "bearer" (4.x, 5.x)
        self._version: str | None = None
        self.requests_sent = 0
        """HTTP requests sent so far (every attempt counts)."""
        self.logins = 0
        """Logins made so far."""

    def __repr__(self) -> str:
        state = f"v{self._version}" if self._version else "not connected"
        return f"<PowerFlexClient {self.username}@{self.gateway} {state}>"

    # ------------------------------------------------------------------ session

    @property
    def version(self) -> str:
        """The gateway's version (``/api/version``), asked once."""
        if self._version is None:
            self._retried("login", self._login)
        assert self._version is not None
        return self._version

    @property
    def major(self) -> int:
        """The major version: 3, 4 or 5."""
        return int(self.version.split(".", 1)[0])

    def close(self) -> None:
        """Log out (best effort) and close a session this client created; idempotent."""
        token = self.__token
        if token is not None:
            try:
                if self._scheme == "basic":
                    self._raw("GET", "/api/logout", auth=(self.username, token))
                else:
                    self._raw(
                        "POST",
                        "/rest/auth/logout",
                        json={"refresh_token": self.__refresh},
                        headers={"Authorization": f"Bearer {token}"},
                    )
            except (_Transient, BackendError) as exc:
                log.warning("logging out of %s failed: %s", self.gateway, type(exc).__name__)
            self.__token = self.__refresh = None
        if self._own_session:
            self._session.close()

    def _raw(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One HTTP request (no authentication added, no retry); transport errors are _Transient."""
        url = self.gateway + path
        self.requests_sent += 1
        started = time.monotonic()
        try:
            response = self._session.request(
                method, url, timeout=self._timeout, verify=self._verify, **kwargs
            )
        except self._requests.exceptions.SSLError as exc:
            raise self._tls_failed(exc, method, path) from None
        except (self._requests.ConnectionError, self._requests.Timeout) as exc:
            log.debug("%s %s: %s", method, path, type(exc).__name__)
            raise _Transient(f"{method} {path}: {type(exc).__name__}") from None
        except (self._requests.RequestException, OSError) as exc:
            raise BackendError(
                f"PowerFlex request {method} {path} could not be made: {type(exc).__name__}",
                hint="check the gateway URL and TLS settings (verify=, a CA bundle path)",
                backend=_NAME,
            ) from None
        log.debug(
            "%s %s -> %d in %.0f ms",
            method,
            path,
            response.status_code,
            (time.monotonic() - started) * 1000,
        )
        return response

    def _tls_failed(self, exc: BaseException, method: str, path: str) -> Exception:
        """What a failed TLS connection is: :class:`PowerFlexTLSError` (never retried)
        unless the connection was merely cut during the handshake (transient)."""
        err = _ssl_error(exc)
        if err is None or isinstance(err, ssl.SSLEOFError | ssl.SSLZeroReturnError):
            log.debug("%s %s: TLS connection lost (%s)", method, path, type(exc).__name__)
            return _Transient(f"{method} {path}: TLS connection lost")
        text = _ssl_text(err)
        host = urlsplit(self.gateway).hostname
        if isinstance(err, ssl.SSLCertVerificationError):
            if "hostname mismatch" in text.lower() or "ip address mismatch" in text.lower():
                hint = (
                    f"the certificate was not issued for {host}: give the gateway by a name "
                    "the certificate holds (its subjectAltName), e.g. gateway = "
                    "'https://<that name>', or have the certificate reissued for this one"
                )
            else:
                hint = (
                    "give verify = the path of a CA bundle (PEM) holding the certificate of "
                    "the CA that signed the gateway's (or the gateway's own, if it is "
                    "self-signed), in [storage.options] or as verify= in Python; "
                    "verify = false turns the check off and lets anyone on the path read "
                    "the credentials"
                )
            reason = "CERTIFICATE_VERIFY_FAILED"
            what = "presented a certificate that does not verify"
        else:
            hint = (
                "check that the gateway URL is the gateway's HTTPS address "
                "(https://host, port 443 unless it listens elsewhere) and that it speaks TLS "
                "1.2 or newer"
            )
            reason = str(getattr(err, "reason", None) or type(err).__name__)
            what = "refused the TLS handshake"
        log.warning("TLS to %s failed: %s", self.gateway, text)
        return PowerFlexTLSError(
            f"the PowerFlex gateway {self.gateway} {what}: {text}; {method} {path} was not "
            "sent and is not retried",
            hint=hint,
            backend=_NAME,
            gateway=self.gateway,
            reason=reason,
            tls_error=text,
        )

    def _login(self) -> None:
        """Find the version and log in with the scheme it needs."""
        basic_token: str | None = None
        if self._version is None:
            response = self._raw("GET", "/api/version")
            if response.status_code == 401:
                # Some gateways want a session for /api/version: the 3.x login works on
                # 3.x and 4.x (as PyPowerFlex does it), then ask with that token.
                basic_token = self._api_login()
                response = self._raw("GET", "/api/version", auth=(self.username, basic_token))
                if response.status_code == 401:
                    response = self._raw(
                        "GET", "/api/version", headers={"Authorization": f"Bearer {basic_token}"}
                    )
            version = self._json(response, "GET /api/version")
            if not isinstance(version, str) or not re.match(r"^\d+(\.\d+)*$", version):
                raise PowerFlexAPIError(
                    f"the PowerFlex gateway answered /api/version with {version!r}, not a version",
                    hint="check that the URL is a PowerFlex gateway",
                    backend=_NAME,
                )
            major = int(version.split(".", 1)[0])
            if major < 3:
                raise ConfigurationError(
                    f"PowerFlex {version} is not supported (3.x, 4.x and 5.x are)",
                    hint="upgrade the array, or use another tool",
                )
            self._version = version
        major = int(self._version.split(".", 1)[0])
        if major < 4:
            self.__token = basic_token or self._api_login()
            self._scheme = "basic"
        else:
            response = self._raw(
                "POST",
                "/rest/auth/login",
                json={"username": self.username, "password": self.__password},
            )
            if response.status_code in {400, 401, 403}:
                raise self._auth_failed(response.status_code)
            data = self._json(response, "POST /rest/auth/login")
            token = data.get("access_token") if isinstance(data, dict) else None
            if not isinstance(token, str) or not token:
                raise AuthenticationError(
                    "the PowerFlex gateway's login answer holds no access_token",
                    hint="check that the URL is the PowerFlex Manager (PFMP) address",
                    backend=_NAME,
                )
            refresh = data.get("refresh_token")
            self.__token = token
            self.__refresh = refresh if isinstance(refresh, str) else None
            self._scheme = "bearer"
        self.logins += 1
        log.debug(
            "logged in to %s (PowerFlex %s) as %s", self.gateway, self._version, self.username
        )

    def _api_login(self) -> str:
        response = self._raw("GET", "/api/login", auth=(self.username, self.__password))
        if response.status_code in {401, 403}:
            raise self._auth_failed(response.status_code)
        token = self._json(response, "GET /api/login")
        if not isinstance(token, str) or not token:
            raise AuthenticationError(
                "the PowerFlex gateway's login answer is not a token",
                hint="check that the URL is a PowerFlex gateway",
                backend=_NAME,
            )
        return token

    def _auth_failed(self, status: int) -> AuthenticationError:
        major = int(self._version.split(".", 1)[0]) if self._version else 3
        where = "PowerFlex Manager" if major >= 4 else "gateway"
        return AuthenticationError(
            f"the PowerFlex {where} {self.gateway} refused the credentials of user "
            f"{self.username!r} (HTTP {status}); nothing was done on the array",
            hint=f"check that the user {self.username!r} exists there and that "
            f"{self._password_source} holds its current password (username = '...' in "
            "[storage.options]), then run pgsnap check again",
            backend=_NAME,
            status=status,
            username=self.username,
        )

    def _auth(self) -> dict[str, Any]:
        if self.__token is None:
            self._login()
        token = self.__token
        assert token is not None
        if self._scheme == "basic":
            return {"auth": (self.username, token)}
        return {"headers": {"Authorization": f"Bearer {token}"}}

    # ------------------------------------------------------------------ requests

    def _json(self, response: requests.Response, what: str) -> Any:
        if response.status_code in _TRANSIENT_STATUS:
            raise _Transient(f"{what}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise _api_error(response, what, user=self.username)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise PowerFlexAPIError(
                f"{what}: the gateway's answer is not JSON (HTTP {response.status_code})",
                hint="check that the URL is a PowerFlex gateway",
                backend=_NAME,
                status=response.status_code,
            ) from None

    def _once(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        """One request, logging in first if needed and once more after a 401."""
        what = f"{method} {path}"
        kwargs: dict[str, Any] = {} if body is None else {"json": _encode(body)}
        response = self._raw(method, path, **kwargs, **self._auth())
        if response.status_code == 401:
            log.info("PowerFlex token refused (expired?); logging in again")
            self.__token = None
            response = self._raw(method, path, **kwargs, **self._auth())
            if response.status_code == 401:
                raise self._auth_failed(401)
        return self._json(response, what)

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        idempotent: bool | None = None,
    ) -> Any:
        """Send a request to ``/api`` + ``path``; the decoded JSON answer.

        ``idempotent`` (default: GET only) allows retries on connection errors
        and 502/503/504; a write that fails so raises
        :class:`PowerFlexUncertainError`. Raises :mod:`pgsnap.errors` only.
        """
        full = "/api" + path
        if idempotent is None:
            idempotent = method == "GET"
        if not idempotent:
            try:
                return self._once(method, full, body)
            except _Transient as exc:
                raise PowerFlexUncertainError(
                    f"PowerFlex request {exc.what} failed; whether the gateway carried it out "
                    "is unknown",
                    hint="check the array's state before repeating it",
                    backend=_NAME,
                ) from None
        return self._retried(f"{method} {path}", self._once, method, full, body)

    def _retried(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` retried on _Transient (jittered backoff, attempts, deadline)."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._attempts)
            | tenacity.stop_after_delay(self._deadline),
            wait=tenacity.wait_random_exponential(multiplier=self._backoff, max=10),
            retry=tenacity.retry_if_exception_type(_Transient),
            sleep=self._sleep,
            before_sleep=lambda state: log.info(
                "PowerFlex request %s failed (attempt %d); retrying", what, state.attempt_number
            ),
            reraise=True,
        )
        try:
            return retrying(call, *args)
        except _Transient as exc:
            raise BackendUnavailable(
                f"the PowerFlex gateway {self.gateway} did not answer {exc.what} "
                f"({self._attempts} attempts within {self._deadline:g} s)",
                hint="check that the gateway is up and reachable; retrying later may succeed",
                backend=_NAME,
            ) from None

    def get(self, path: str) -> Any:
        """``GET /api`` + ``path`` (retried)."""
        return self.request("GET", path)

    def post(self, path: str, body: Mapping[str, Any], *, idempotent: bool = False) -> Any:
        """``POST /api`` + ``path`` (retried only when ``idempotent``)."""
        return self.request("POST", path, body, idempotent=idempotent)

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (jittered exponential)."""
        return random.uniform(0, min(10.0, self._backoff * 2**attempt))  # noqa: S311 - jitter

    @property
    def attempts(self) -> int:
        """How many attempts a retried request gets."""
        return self._attempts

    @property
    def deadline(self) -> float:
        """Seconds a retried request may take in total."""
        return self._deadline

    def sleep(self, seconds: float) -> None:
        """Wait as retries wait (the injected ``sleep``)."""
        self._sleep(seconds)


def _api_error(response: requests.Response, what: str, *, user: str = "") -> BackendError:
    """The typed error for an error answer (any body, JSON or not)."""
    status = response.status_code
    if status in {401, 403}:
        return AuthenticationError(
            f"{what}: the PowerFlex gateway refused the session of user {user!r} (HTTP {status})",
            hint=f"give the user {user!r} the rights pgsnap needs on the array (snapshot, "
            "overwrite, map and unmap the volumes; read and pause snapshot policies)",
            backend=_NAME,
            status=status,
            username=user,
        )
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return PowerFlexAPIError(
            f"{what}: HTTP {status} from the PowerFlex gateway (the body is not JSON)",
            hint="check that the URL is a PowerFlex gateway",
            backend=_NAME,
            status=status,
        )
    message = _text(data.get("message"))
    code = data.get("errorCode")
    error_code = code if isinstance(code, int) else None
    details = data.get("details")
    first: Mapping[str, Any] = {}
    rcs: list[int] = []
    if isinstance(details, list):
        for d in details:
            if isinstance(d, dict):
                first = first or d
                if isinstance(d.get("rc"), int):
                    rcs.append(d["rc"])
    symbol = _text(first.get("error")) or None
    text = message
    if message == "Error with details" or not message:
        text = (
            _text(first.get("errorMessage"))
            or symbol
            or (f"rc {rcs[0]}" if rcs else message or "no message")
        )
    fields: dict[str, Any] = {
        "backend": _NAME,
        "status": status,
        "error_code": error_code,
        "rc": rcs[0] if rcs else None,
        "error": symbol,
        "api_message": text,
    }
    lowered = text.lower()
    full = f"{what}: {text} (HTTP {status}, errorCode {error_code})"
    if 182 in rcs or symbol == "TOO_MANY_SNAPS_IN_VTREE":
        return PowerFlexSnapshotLimit(
            full,
            hint="the V-Tree holds as many snapshots as PowerFlex allows (126; 1022 on 5.x): "
            "delete old backups (pgsnap delete) or auto-snapshots of this volume",
            **fields,
        )
    if (
        error_code in {3, 78, 79}
        or "hexadecimal" in lowered
        or "could not find" in lowered
        or (symbol in {"VOL_NOT_FOUND_FOR_SNAP_GROUP", "INI_NOT_FOUND"})
    ):
        return PowerFlexNotFound(full, hint="check the id (it may have been deleted)", **fields)
    if error_code == 99 or "already in use" in lowered or symbol == "VOL_NAME_IN_USE":
        return PowerFlexNameInUse(
            full,
            hint="volumes and snapshots share one namespace: choose another name, or remove "
            "the object holding it",
            **fields,
        )
    if error_code == 104 or symbol == "VOL_MAPPED":
        return PowerFlexVolumeMapped(
            full, hint="unmap the volume from its SDCs first (pgsnap detaches it)", **fields
        )
    if "secure" in lowered or (symbol or "").startswith("SECURE"):
        return PowerFlexSecureSnapshot(
            full, hint="a secure snapshot stays until its retention period ends", **fields
        )
    return PowerFlexAPIError(full, hint="see the PowerFlex gateway's log", **fields)


# --------------------------------------------------------------------------- the backend


class PowerFlexBackend:
    """The ``powerflex`` storage backend (see the module docstring).

    ``gateway``: ``https://host[:port]`` of the REST gateway (3.x) or
    PowerFlex Manager (4.x, 5.x). ``password`` (for Python callers; a
    configuration file names the variable instead) defaults to the
    environment variable ``password_env``. ``system_id`` is needed only when the gateway
    manages several systems. The volume listing (one request for every
    volume and snapshot) is reused for ``listing_ttl`` seconds by lookups
    (``locate``, ``restore_profile``, ``get_volume``...), so observing K
    volumes costs one request, not K; every write through the backend, and
    every restore, attach and detach, reads the array afresh (0 turns the
    reuse off). ``client`` replaces the client built from the other options
    (tests). ``limit_warn_percent``: :meth:`storage_problems` warns when a
    V-Tree of the cluster's volumes holds that share (80 %) of PowerFlex's
    snapshot limit (:data:`VTREE_SNAPSHOT_LIMIT`).
    """

    def __init__(
        self,
        gateway: str = "",
        username: str = "admin",
        password: str | None = None,
        *,
        password_env: str = DEFAULT_PASSWORD_ENV,
        system_id: str | None = None,
        verify: bool | str = True,
        timeout: float = 30.0,
        retry_attempts: int = 5,
        retry_deadline: float = 60.0,
        secure_retention_minutes: int = 1440,
        allow_multiple_mappings: bool = False,
        listing_ttl: float = 2.0,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] | None = None,
        client: PowerFlexClient | None = None,
        limit_warn_percent: float = 80.0,
    ) -> None:
        if (
            isinstance(limit_warn_percent, bool)
            or not isinstance(limit_warn_percent, int | float)
            or not 0 < limit_warn_percent <= 100
        ):
            raise ConfigurationError(
                f"limit_warn_percent must be a number above 0 and at most 100, "
                f"not {limit_warn_percent!r}",
                hint="e.g. limit_warn_percent = 80 (warn at 80 % of the V-Tree snapshot limit)",
            )
        if client is None:
            if not gateway:
                raise ConfigurationError(
                    "the powerflex backend needs the gateway's URL",
                    hint="e.g. gateway = 'https://pfgw.example' in the [storage] section",
                )
            source = "the password= argument"
            if password is None:
                password = os.environ.get(password_env)
                source = f"${password_env}"
            if not password:
                raise ConfigurationError(
                    f"the powerflex backend needs the password of user {username!r}",
                    hint=f"export {password_env}=... before running pgsnap (password_env = "
                    "'NAME' in [storage.options] names another variable); the password is "
                    "never put in the configuration file",
                    password_env=password_env,
                )
            client = PowerFlexClient(
                gateway,
                username,
                password,
                session=session,
                verify=verify,
                timeout=timeout,
                retry_attempts=retry_attempts,
                retry_deadline=retry_deadline,
                sleep=sleep,
                password_source=source,
            )
        if not 1 <= secure_retention_minutes <= 31 * 24 * 60:
            raise ConfigurationError(
                f"secure_retention_minutes must be 1 to 44640 (31 days), not "
                f"{secure_retention_minutes}",
                hint="the default is 1440 (one day)",
            )
        self._client = client
        self._system_id = system_id
        self._secure_minutes = secure_retention_minutes
        self._multiple = allow_multiple_mappings
        self._ttl = listing_ttl
        self._listing: tuple[float, list[dict[str, Any]]] | None = None
        self._limit_warn = float(limit_warn_percent)

    def __repr__(self) -> str:
        return f"<PowerFlexBackend {self._client!r}>"

    @property
    def name(self) -> str:
        """``"powerflex"``."""
        return _NAME

    @property
    def capabilities(self) -> frozenset[Capability]:
        """Every capability: groups, policies, mapping, secure snapshots, clones."""
        return frozenset(Capability)

    @property
    def client(self) -> PowerFlexClient:
        """The REST client (its ``requests_sent`` and ``logins`` count the traffic)."""
        return self._client

    def close(self) -> None:
        """Log out of the gateway; idempotent."""
        self._client.close()

    def __enter__(self) -> PowerFlexBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ lookups

    @property
    def system_id(self) -> str:
        """The PowerFlex system's id (asked once unless given)."""
        if self._system_id is None:
            systems = self._client.get("/types/System/instances")
            ids = [str(s["id"]) for s in systems if isinstance(s, dict) and "id" in s]
            if len(ids) != 1:
                raise ConfigurationError(
                    f"the PowerFlex gateway manages {len(ids)} systems ({', '.join(ids)})",
                    hint="give system_id= to choose one",
                )
            self._system_id = ids[0]
        return self._system_id

    def _all(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """Every volume and snapshot (one request), reused for ``listing_ttl`` seconds
        unless ``fresh``; any write through this backend forgets it."""
        now = time.monotonic()
        if not fresh and self._listing is not None and now - self._listing[0] < self._ttl:
            return self._listing[1]
        data = self._client.get("/types/Volume/instances")
        if not isinstance(data, list):
            raise PowerFlexAPIError(
                "the volume list is not a list", hint="check the gateway", backend=_NAME
            )
        listing = [v for v in data if isinstance(v, dict)]
        self._listing = (time.monotonic(), listing)
        return listing

    def _write(self, path: str, body: Mapping[str, Any]) -> Any:
        """A write (never retried blindly); the cached listing is forgotten."""
        self._listing = None
        try:
            return self._client.post(path, body)
        finally:
            self._listing = None

    def _get_volume(self, oid: str) -> dict[str, Any] | None:
        """A volume or snapshot by id, or None when it does not exist."""
        if not _HEX_ID.match(oid):
            return None
        try:
            data = self._client.get(f"/instances/Volume::{quote(oid, safe='')}")
        except PowerFlexNotFound:
            return None
        return data if isinstance(data, dict) else None

    def _resolve(self, ref: str, *, fresh: bool = False) -> dict[str, Any]:
        """A base volume or clone (not a snapshot) by id or name; VolumeNotFound otherwise.

        From the cached listing unless ``fresh`` (or not in it): then one GET.
        """
        if not fresh:
            cached = self._find(self._all(), ref)
            if cached is not None and not _is_snapshot(cached):
                return dict(cached)
        found = self._get_volume(ref)
        if found is None and ref and "\x00" not in ref:
            try:
                vid = self._client.post(
                    "/types/Volume/instances/action/queryIdByKey", {"name": ref}, idempotent=True
                )
            except PowerFlexNotFound:
                vid = None
            if isinstance(vid, str):
                found = self._get_volume(vid)
        if found is None or _is_snapshot(found):
            raise VolumeNotFound(
                f"PowerFlex has no volume {ref!r}"
                + (" (that is a snapshot)" if found is not None else ""),
                hint="give a volume's id (16 hex digits) or name; pgsnap snapshots are "
                "listed by list_snapshots",
                volume_id=ref,
                backend=_NAME,
            )
        return found

    def _find(self, listing: Sequence[Mapping[str, Any]], ref: str) -> Mapping[str, Any] | None:
        for v in listing:
            if v.get("id") == ref.lower() and _HEX_ID.match(ref):
                return v
        named = [v for v in listing if v.get("name") == ref]
        return named[0] if len(named) == 1 else None

    def _snapshot(self, snapshot_id: str) -> dict[str, Any]:
        found = self._get_volume(snapshot_id)
        if found is None or not _is_snapshot(found):
            raise SnapshotNotFound(
                f"PowerFlex has no snapshot {snapshot_id!r}",
                hint="list the snapshots with list_snapshots (it may have been deleted)",
                snapshot_id=snapshot_id,
                backend=_NAME,
            )
        return found

    def ex_volume_id(self, name_or_id: str) -> str:
        """The id of the volume named or identified by ``name_or_id``."""
        return str(self._resolve(name_or_id)["id"])

    @property
    def _maps_hosts(self) -> bool:
        """5.x maps through Host objects (``addMappedHost``/``removeMappedHost`` with a
        ``hostId``, ``GET /api/types/Host/instances``), as PyPowerFlex's gen2 does;
        3.x and 4.x through SDCs (``addMappedSdc``/``removeMappedSdc``)."""
        return self._client.major >= 5

    def _sdc(self, host: str) -> Mapping[str, Any]:
        """The SDC (on 5.x: the Host of type ``SdcHost``) that ``host`` names: its id,
        GUID or name, then one of its IP addresses. NVMe hosts are refused."""
        listing = "/types/Host/instances" if self._maps_hosts else "/types/Sdc/instances"
        sdcs = [s for s in self._client.get(listing) if isinstance(s, dict)]
        wanted = host.strip().lower()
        found: Mapping[str, Any] | None = None
        for key in ("id", "sdcGuid", "name"):
            for s in sdcs:
                if found is None and wanted and _text(s.get(key)).lower() == wanted:
                    found = s
        for s in sdcs:
            ips = [_text(s.get("sdcIp")), *(_text(i) for i in s.get("sdcIps") or ())]
            if found is None and wanted and wanted in ips:
                found = s
        if found is not None and found.get("hostType") == "NVMeHost":
            raise BackendError(
                f"PowerFlex host {host!r} is an NVMe/TCP host: pgsnap maps volumes to SDCs "
                "only (the device paths differ)",
                hint="run the PowerFlex SDC on the database host and name its SDC",
                backend=_NAME,
                sdc=host,
            )
        if found is not None:
            return found
        names = ", ".join(
            sorted(
                _text(s.get("name")) or _text(s.get("id"))
                for s in sdcs
                if s.get("hostType") != "NVMeHost"
            )
        )
        raise PowerFlexNotFound(
            f"PowerFlex knows no SDC {host!r} (by id, GUID, IP or name)",
            hint=f"the SDCs are: {names or 'none'}; the host's name must be its SDC's",
            backend=_NAME,
            sdc=host,
        )

    # ------------------------------------------------------------------ records

    def _volume_record(self, v: Mapping[str, Any]) -> StorageVolume:
        hosts = [
            _text(m.get("sdcName")) or _text(m.get("sdcId"))
            for m in v.get("mappedSdcInfo") or ()
            if isinstance(m, dict)
        ]
        extra = {
            "vtree_id": _text(v.get("vtreeId")),
            "volume_type": _text(v.get("volumeType")),
            "storage_pool_id": _text(v.get("storagePoolId")),
            "access_mode": _text(v.get("accessModeLimit")),
        }
        if v.get("ancestorVolumeId"):
            extra["ancestor_volume_id"] = _text(v.get("ancestorVolumeId"))
        return StorageVolume(
            id=_text(v.get("id")),
            name=_text(v.get("name")),
            size_bytes=int(v.get("sizeInKb") or 0) * 1024,
            mapped_hosts=tuple(hosts),
            extra=extra,
        )

    def _snapshot_record(self, v: Mapping[str, Any]) -> Snapshot:
        expiry = int(v.get("secureSnapshotExpTime") or 0)
        name = _text(v.get("name"))
        extra = {
            "vtree_id": _text(v.get("vtreeId")),
            "access_mode": _text(v.get("accessModeLimit")),
            "group_name": _group_name_of(name),
        }
        if expiry:
            extra["secure_until"] = _when(expiry).isoformat()
        return Snapshot(
            id=_text(v.get("id")),
            volume_id=_text(v.get("ancestorVolumeId")),
            name=name,
            created_at=_when(v.get("creationTime")),
            group_id=_text(v.get("consistencyGroupId")) or None,
            secure=expiry > time.time(),
            extra=extra,
        )

    def _group_record(self, gid: str, members: Sequence[Mapping[str, Any]]) -> SnapshotGroup:
        snaps = tuple(self._snapshot_record(m) for m in members)
        names = {s.extra["group_name"] for s in snaps}
        return SnapshotGroup(
            id=gid,
            name=sorted(names)[0] if names else gid,
            created_at=min(s.created_at for s in snaps),
            snapshots=snaps,
        )

    # ------------------------------------------------------------------ volumes

    def list_volumes(self) -> tuple[StorageVolume, ...]:
        """Base volumes and clones (writable snapshots), sorted by id."""
        vols = [self._volume_record(v) for v in self._all() if not _is_snapshot(v)]
        return tuple(sorted(vols, key=lambda v: v.id))

    def get_volume(self, volume_id: str) -> StorageVolume:
        """One volume by id or name."""
        return self._volume_record(self._resolve(volume_id))

    def list_snapshots(self, volume_id: str | None = None) -> tuple[Snapshot, ...]:
        """Read-only snapshots (of one volume's V-Tree base, or all), oldest first.

        PowerFlex times are whole seconds; snapshots of the same second are in
        id order.
        """
        listing = self._all()
        wanted: str | None = None
        if volume_id is not None:
            found = self._find(listing, volume_id)
            if found is None or _is_snapshot(found):
                raise VolumeNotFound(
                    f"PowerFlex has no volume {volume_id!r}",
                    hint="give a volume's id or name",
                    volume_id=volume_id,
                    backend=_NAME,
                )
            wanted = _text(found.get("id"))
        snaps = [
            self._snapshot_record(v)
            for v in listing
            if _is_snapshot(v) and (wanted is None or v.get("ancestorVolumeId") == wanted)
        ]
        return tuple(sorted(snaps, key=lambda s: (s.created_at, s.id)))

    # ------------------------------------------------------------------ health

    @property
    def vtree_snapshot_limit(self) -> int:
        """How many snapshots one V-Tree may hold on this array (126; 1022 on 5.x)."""
        major = self._client.major
        return VTREE_SNAPSHOT_LIMIT.get(major, VTREE_SNAPSHOT_LIMIT[5 if major > 5 else 3])

    def storage_problems(
        self, volume_ids: Sequence[str] | None = None
    ) -> tuple[StorageProblem, ...]:
        """V-Trees near or at the snapshot limit (:class:`~pgsnap.protocols.StorageHealth`).

        For each V-Tree holding one of ``volume_ids`` (ids or names; None:
        every base volume; unknown ones skipped), its descendants (snapshots,
        pgsnap's and others', and clones) are counted from one listing, as
        PowerFlex counts them: from ``limit_warn_percent`` of
        :attr:`vtree_snapshot_limit` a ``snapshot_limit`` warning, at the
        limit an error (the next backup fails with
        :class:`PowerFlexSnapshotLimit`). Errors first. The listing is read
        afresh (one request): old snapshots matter, whoever took them.
        """
        listing = self._all(fresh=True)
        if volume_ids is None:
            vols: list[Mapping[str, Any]] = [
                v for v in listing if not v.get("ancestorVolumeId") and v.get("vtreeId")
            ]
        else:
            vols = []
            for ref in volume_ids:
                found = self._find(listing, ref)
                if found is None or _is_snapshot(found):
                    log.debug("powerflex: no volume %r to check the V-Tree of", ref)
                    continue
                vols.append(found)
        counts: dict[str, int] = {}
        for item in listing:
            if item.get("ancestorVolumeId"):
                tree = _text(item.get("vtreeId"))
                counts[tree] = counts.get(tree, 0) + 1
        limit = self.vtree_snapshot_limit
        seen: set[str] = set()
        problems: list[StorageProblem] = []
        for v in sorted(vols, key=lambda v: _text(v.get("id"))):
            tree = _text(v.get("vtreeId"))
            if not tree or tree in seen:
                continue
            seen.add(tree)
            count = counts.get(tree, 0)
            percent = 100.0 * count / limit
            vid, vname = _text(v.get("id")), _text(v.get("name"))
            if count >= limit:
                problems.append(
                    StorageProblem(
                        code="snapshot_limit",
                        severity=Severity.ERROR,
                        message=f"the V-Tree {tree} of volume {vname} ({vid}) holds {count} "
                        f"snapshots, PowerFlex's limit of {limit}: the next backup will fail",
                        hint="delete old backups now (pgsnap expire, pgsnap delete) or "
                        "auto-snapshots of this volume",
                        volume_id=vid,
                        percent_used=percent,
                    )
                )
            elif percent >= self._limit_warn:
                problems.append(
                    StorageProblem(
                        code="snapshot_limit",
                        severity=Severity.WARNING,
                        message=f"the V-Tree {tree} of volume {vname} ({vid}) holds {count} "
                        f"of the {limit} snapshots PowerFlex allows ({percent:.0f} %): "
                        f"backups fail once it holds {limit}",
                        hint="delete old backups (pgsnap expire with a retention policy) or "
                        "auto-snapshots of this volume before the limit is reached",
                        volume_id=vid,
                        percent_used=percent,
                    )
                )
        problems.sort(key=lambda p: p.severity is not Severity.ERROR)
        return tuple(problems)

    # ------------------------------------------------------------------ snapshots

    def create_snapshot_group(
        self, volume_ids: Sequence[str], name: str, *, secure: bool = False
    ) -> SnapshotGroup:
        """One ``snapshotVolumes`` (``createSnapshot`` on 5.x) call for every volume.

        The volumes are resolved from one listing first: an unknown one is
        :class:`~pgsnap.errors.VolumeNotFound` and nothing is taken. A V-Tree
        at its snapshot limit is :class:`PowerFlexSnapshotLimit`.
        """
        refs = list(volume_ids)
        if not refs:
            raise BackendError(
                "a snapshot group needs at least one volume",
                hint="give the volume ids to snapshot",
                backend=_NAME,
            )
        listing = self._all()
        vols: list[Mapping[str, Any]] = []
        for ref in refs:
            found = self._find(listing, ref)
            if found is None or _is_snapshot(found):
                raise VolumeNotFound(
                    f"cannot snapshot {ref!r}: PowerFlex has no such volume; nothing was taken",
                    hint="give volume ids (16 hex digits) or names",
                    volume_id=ref,
                    backend=_NAME,
                )
            vols.append(found)
        ids = [_text(v.get("id")) for v in vols]
        if len(set(ids)) != len(ids):
            raise BackendError(
                f"volume listed twice in snapshot group {name!r}",
                hint="give each volume once",
                backend=_NAME,
            )
        names = snapshot_names(name, [_text(v.get("name")) for v in vols])
        taken = {_text(v.get("name")) for v in listing}
        clash = [n for n in names if n in taken]
        if clash:
            raise PowerFlexNameInUse(
                f"cannot snapshot as {name!r}: the name {clash[0]!r} is already in use on the "
                "array; nothing was taken",
                hint="a group of that name exists already: use another name (backup id)",
                backend=_NAME,
                api_message="name in use",
            )
        body: dict[str, Any] = {
            "snapshotDefs": [
                {"volumeId": vid, "snapshotName": n} for vid, n in zip(ids, names, strict=True)
            ],
            "accessModeLimit": "ReadOnly",
        }
        if secure:
            body["retentionPeriodInMin"] = self._secure_minutes
        try:
            answer = self._take(body, clone=False)
        except PowerFlexSnapshotLimit as exc:
            listing = self._all(fresh=True)
            counts = {
                t: sum(1 for v in listing if v.get("vtreeId") == t and v.get("ancestorVolumeId"))
                for t in {_text(v.get("vtreeId")) for v in vols}
            }
            full = ", ".join(
                f"{_text(v.get('name'))} ({counts[_text(v.get('vtreeId'))]} snapshots)"
                for v in vols
            )
            raise PowerFlexSnapshotLimit(
                f"cannot snapshot group {name!r}: a V-Tree is at PowerFlex's snapshot limit "
                f"(126 per V-Tree; 1022 on 5.x); volumes: {full}; nothing was taken",
                hint=exc.hint,
                **exc.details,
            ) from None
        gid = _text(answer.get("snapshotGroupId"))
        members = {v["id"]: v for v in self._all(fresh=True) if v.get("consistencyGroupId") == gid}
        snap_ids = [_text(i) for i in answer.get("volumeIdList") or ()]
        if not gid or len(snap_ids) != len(ids) or any(s not in members for s in snap_ids):
            raise PowerFlexAPIError(
                f"snapshot group {name!r}: the gateway's answer does not match the array "
                f"(group {gid!r}, snapshots {snap_ids})",
                hint="look for snapshots named '<backup id>.<volume>' on the array",
                backend=_NAME,
            )
        return self._group_record(gid, [members[s] for s in snap_ids])

    def _take(self, body: Mapping[str, Any], *, clone: bool) -> Mapping[str, Any]:
        """Snapshot the definitions once; after an uncertain failure look by name first."""
        if self._client.major >= 5:
            action = "createThinClone" if clone else "createSnapshot"
        else:
            action = "snapshotVolumes"
        path = f"/instances/System::{self.system_id}/action/{action}"
        defs = list(body["snapshotDefs"])
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                answer = self._write(path, body)
            except PowerFlexUncertainError as exc:
                found = self._find_taken(defs)
                if len(found) == len(defs):
                    gids = {_text(f.get("consistencyGroupId")) for f in found}
                    if len(gids) == 1:
                        log.warning(
                            "%s answered nothing, but its snapshots exist: adopting group %s",
                            action,
                            next(iter(gids)),
                        )
                        return {
                            "snapshotGroupId": next(iter(gids)),
                            "volumeIdList": [f["id"] for f in found],
                        }
                for f in found:
                    log.warning("removing snapshot %s of an uncertain %s", f.get("id"), action)
                    self._write(
                        f"/instances/Volume::{f['id']}/action/removeVolume",
                        {"removeMode": "ONLY_ME"},
                    )
                elapsed = time.monotonic() - started
                if attempt >= self._client.attempts or elapsed >= self._client.deadline:
                    raise PowerFlexUncertainError(
                        f"{action} failed {attempt} times ({exc.message}); no snapshot of it "
                        "is left on the array",
                        hint="check that the gateway is reachable, then take the backup again",
                        backend=_NAME,
                    ) from None
                self._client.sleep(self._client.backoff(attempt))
                continue
            if not isinstance(answer, dict):
                raise PowerFlexAPIError(
                    f"{action}: unexpected answer", hint="check the gateway", backend=_NAME
                )
            return answer

    def _find_taken(self, defs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The snapshots of ``defs`` that exist (by name and source volume)."""
        by_name = {v.get("name"): v for v in self._all(fresh=True)}
        found: list[Mapping[str, Any]] = []
        for d in defs:
            v = by_name.get(d["snapshotName"])
            if v is not None and v.get("ancestorVolumeId") == d["volumeId"]:
                found.append(v)
        return found

    def get_snapshot_group(self, group_id: str) -> SnapshotGroup:
        """The snapshots whose ``consistencyGroupId`` is ``group_id``."""
        members = [
            v for v in self._all() if _is_snapshot(v) and v.get("consistencyGroupId") == group_id
        ]
        if not group_id or not members:
            raise SnapshotNotFound(
                f"PowerFlex has no snapshot group {group_id!r}",
                hint="list the snapshots and their group ids with list_snapshots",
                snapshot_id=group_id,
                backend=_NAME,
            )
        members.sort(key=lambda v: _text(v.get("id")))
        return self._group_record(group_id, members)

    def _refuse_protected(self, snaps: Iterable[Mapping[str, Any]], what: str) -> None:
        now = time.time()
        for v in snaps:
            expiry = int(v.get("secureSnapshotExpTime") or 0)
            if expiry > now:
                raise PowerFlexSecureSnapshot(
                    f"cannot delete {what}: snapshot {v.get('id')} is secure until "
                    f"{_when(expiry).isoformat()}",
                    hint="a secure snapshot can be deleted only after its retention period",
                    backend=_NAME,
                    snapshot_id=_text(v.get("id")),
                    expires_at=_when(expiry).isoformat(),
                )
            if v.get("mappedSdcInfo"):
                raise PowerFlexVolumeMapped(
                    f"cannot delete {what}: snapshot {v.get('id')} is mapped to an SDC",
                    hint="unmap it first (detach)",
                    backend=_NAME,
                    snapshot_id=_text(v.get("id")),
                )

    def delete_snapshot(self, snapshot_id: str) -> None:
        """``removeVolume`` (``ONLY_ME``) of one snapshot; secure or mapped ones are refused."""
        snap = self._snapshot(snapshot_id)
        self._refuse_protected([snap], f"snapshot {snapshot_id}")
        try:
            self._write(
                f"/instances/Volume::{snap['id']}/action/removeVolume", {"removeMode": "ONLY_ME"}
            )
        except PowerFlexNotFound:
            raise SnapshotNotFound(
                f"PowerFlex has no snapshot {snapshot_id!r} (any more)",
                hint="it was deleted meanwhile",
                snapshot_id=snapshot_id,
                backend=_NAME,
            ) from None

    def delete_snapshot_group(self, group_id: str) -> None:
        """``removeConsistencyGroupSnapshots``; a group holding a secure or mapped snapshot
        is refused."""
        group = [
            v for v in self._all() if _is_snapshot(v) and v.get("consistencyGroupId") == group_id
        ]
        if not group_id or not group:
            raise SnapshotNotFound(
                f"PowerFlex has no snapshot group {group_id!r}",
                hint="it may have been deleted",
                snapshot_id=group_id,
                backend=_NAME,
            )
        self._refuse_protected(group, f"snapshot group {group_id}")
        try:
            self._write(
                f"/instances/System::{self.system_id}/action/removeConsistencyGroupSnapshots",
                {"snapGroupId": group_id},
            )
        except PowerFlexNotFound:
            raise SnapshotNotFound(
                f"PowerFlex has no snapshot group {group_id!r} (any more)",
                hint="it was deleted meanwhile",
                snapshot_id=group_id,
                backend=_NAME,
            ) from None

    # ------------------------------------------------------------------ restore

    def restore_volume(self, volume_id: str, snapshot_id: str) -> None:
        """Overwrite the volume from its snapshot (``overwriteVolumeContent``; ``restore``
        on 5.x). The volume must be unmapped; the snapshot stays."""
        vol = self._resolve(volume_id, fresh=True)
        snap = self._snapshot(snapshot_id)
        vid = _text(vol.get("id"))
        if snap.get("ancestorVolumeId") != vid:
            raise BackendError(
                f"snapshot {snapshot_id} is a snapshot of volume "
                f"{snap.get('ancestorVolumeId')}, not of {vid}",
                hint="restore a volume from one of its own snapshots",
                backend=_NAME,
                volume_id=vid,
                snapshot_id=snapshot_id,
            )
        if vol.get("mappedSdcInfo"):
            hosts = ", ".join(self._volume_record(vol).mapped_hosts)
            raise PowerFlexVolumeMapped(
                f"cannot restore volume {vid}: it is mapped to {hosts}",
                hint="unmount it and unmap it (detach) first; a recovery plan does",
                backend=_NAME,
                volume_id=vid,
            )
        action = "restore" if self._client.major >= 5 else "overwriteVolumeContent"
        self._write(f"/instances/Volume::{vid}/action/{action}", {"srcVolumeId": snap["id"]})
        log.info("volume %s overwritten from snapshot %s (%s)", vid, snap["id"], action)

    def restore_profile(self, volume_id: str) -> RestoreProfile:
        """Unmount and unmap first; the snapshot is kept; synchronous."""
        self._resolve(volume_id)
        return RestoreProfile(before=RestorePreparation.DETACH)

    def wait_for_restore(self, volume_id: str, *, timeout: float) -> None:
        """Returns at once: an overwrite is complete when the call returns."""
        self._resolve(volume_id)

    def locate(self, volume_id: str) -> Location:
        """``/dev/disk/by-id/emc-vol-<system id>-<volume id>``, as an SDC shows the volume."""
        vid = _text(self._resolve(volume_id).get("id"))
        return Location.device(f"/dev/disk/by-id/emc-vol-{self.system_id}-{vid}")

    # ------------------------------------------------------------------ mapping

    def attach(self, volume_id: str, host: str) -> None:
        """Map the volume to the SDC ``host`` (id, GUID, IP or name); idempotent.

        ``addMappedSdc`` (``sdcId``) on 3.x and 4.x; ``addMappedHost``
        (``hostId``, the SDC's Host) on 5.x.
        """
        self._map(self._resolve(volume_id, fresh=True), host, "ReadWrite")

    def detach(self, volume_id: str, host: str) -> None:
        """Unmap the volume from the SDC ``host``; idempotent.

        ``removeMappedSdc`` on 3.x and 4.x; ``removeMappedHost`` on 5.x.
        """
        self._unmap(self._resolve(volume_id, fresh=True), host)

    def _map(self, vol: Mapping[str, Any], host: str, mode: str) -> None:
        sdc = self._sdc(host)
        if any(m.get("sdcId") == sdc.get("id") for m in vol.get("mappedSdcInfo") or ()):
            return
        key, action = ("hostId", "addMappedHost") if self._maps_hosts else ("sdcId", "addMappedSdc")
        body = {key: sdc["id"], "allowMultipleMappings": self._multiple, "accessMode": mode}
        try:
            self._write(f"/instances/Volume::{vol['id']}/action/{action}", body)
        except PowerFlexAPIError as exc:
            if exc.details.get("error_code") == 81:
                return  # mapped meanwhile: what was asked
            raise
        log.info(
            "volume %s mapped to SDC %s (%s, %s)",
            vol["id"],
            sdc.get("name") or sdc["id"],
            action,
            mode,
        )

    def _unmap(self, vol: Mapping[str, Any], host: str) -> None:
        sdc = self._sdc(host)
        if not any(m.get("sdcId") == sdc.get("id") for m in vol.get("mappedSdcInfo") or ()):
            return
        if self._maps_hosts:
            key, action, done = "hostId", "removeMappedHost", {84, 4039}
        else:
            key, action, done = "sdcId", "removeMappedSdc", {84}
        try:
            self._write(f"/instances/Volume::{vol['id']}/action/{action}", {key: sdc["id"]})
        except PowerFlexAPIError as exc:
            if exc.details.get("error_code") in done:
                return  # unmapped meanwhile
            raise
        log.info(
            "volume %s unmapped from SDC %s (%s)", vol["id"], sdc.get("name") or sdc["id"], action
        )

    # ------------------------------------------------------------------ ExposableSnapshots

    def expose_snapshot(self, snapshot_id: str, host: str) -> Location:
        """Map the snapshot (a volume of its own) read-only to the SDC ``host``, as
        :meth:`attach` maps a volume, and return the device that SDC shows for it
        (``/dev/disk/by-id/emc-vol-<system id>-<snapshot id>``); idempotent. The
        origin volume and its mappings are not touched."""
        snap = self._snapshot(snapshot_id)
        self._map(snap, host, "ReadOnly")
        return Location.device(f"/dev/disk/by-id/emc-vol-{self.system_id}-{snap['id']}")

    def conceal_snapshot(self, snapshot_id: str, host: str) -> None:
        """Unmap the snapshot from the SDC ``host``; idempotent (a snapshot already
        gone or not mapped is fine)."""
        try:
            snap = self._snapshot(snapshot_id)
        except SnapshotNotFound:
            return
        self._unmap(snap, host)

    # ------------------------------------------------------------------ clones

    def clone_snapshot(self, snapshot_id: str, name: str) -> StorageVolume:
        """A writable snapshot of the snapshot named ``name`` (``createThinClone`` on 5.x)."""
        snap = self._snapshot(snapshot_id)
        if len(name) > NAME_MAX or not name or _BAD_NAME_CHARS.search(name):
            raise BackendError(
                f"invalid PowerFlex volume name {name!r}",
                hint="at most 31 printable characters, no spaces",
                backend=_NAME,
            )
        body = {
            "snapshotDefs": [{"volumeId": snap["id"], "snapshotName": name}],
            "accessModeLimit": "ReadWrite",
        }
        answer = self._take(body, clone=True)
        (cid,) = answer.get("volumeIdList") or [None]
        return self.get_volume(_text(cid))

    def delete_clone(self, volume_id: str) -> None:
        """``removeVolume`` (``ONLY_ME``) of a clone (a writable V-Tree descendant);
        idempotent. An origin (no ancestor), or a clone still mapped to an SDC, is
        refused."""
        try:
            vol = self._resolve(volume_id, fresh=True)
        except VolumeNotFound:
            return
        if not vol.get("ancestorVolumeId"):
            raise BackendError(
                f"PowerFlex volume {volume_id} is not a clone (it has no ancestor): it is "
                "never deleted",
                hint="only volumes made by clone_snapshot are deleted",
                backend=_NAME,
                volume_id=volume_id,
            )
        if vol.get("mappedSdcInfo"):
            raise PowerFlexVolumeMapped(
                f"cannot delete clone {volume_id}: it is mapped to an SDC",
                hint="unmap it first (detach)",
                backend=_NAME,
                volume_id=volume_id,
            )
        try:
            self._write(
                f"/instances/Volume::{vol['id']}/action/removeVolume", {"removeMode": "ONLY_ME"}
            )
        except PowerFlexNotFound:
            return

    def ex_clone_to_host(self, snapshot_id: str, name: str, host: str) -> StorageVolume:
        """A clone of the snapshot, mapped to the SDC ``host`` (dev/test copies)."""
        clone = self.clone_snapshot(snapshot_id, name)
        self.attach(clone.id, host)
        return self.get_volume(clone.id)

    def ex_create_volume(self, name: str, *, size_gb: int = 8) -> StorageVolume:
        """A new thin volume in the system's first storage pool (tests, labs)."""
        pools = self._client.get("/types/StoragePool/instances")
        if not pools:
            raise BackendError("PowerFlex has no storage pool", hint="create one", backend=_NAME)
        answer = self._write(
            "/types/Volume/instances",
            {
                "name": name,
                "volumeSizeInGb": size_gb,
                "storagePoolId": pools[0]["id"],
                "volumeType": "ThinProvisioned",
            },
        )
        return self.get_volume(_text(answer.get("id")))

    # ------------------------------------------------------------------ policies

    def list_policies(self) -> tuple[SnapshotPolicy, ...]:
        """Snapshot policies with their source volumes, sorted by id."""
        out = []
        for p in self._client.get("/types/SnapshotPolicy/instances"):
            if not isinstance(p, dict):
                continue
            pid = _text(p.get("id"))
            sources = self._client.get(
                f"/instances/SnapshotPolicy::{pid}/relationships/SourceVolume"
            )
            out.append(
                SnapshotPolicy(
                    id=pid,
                    name=_text(p.get("name")),
                    volume_ids=tuple(
                        sorted(_text(v.get("id")) for v in sources if isinstance(v, dict))
                    ),
                    paused=p.get("snapshotPolicyState") == "Paused",
                )
            )
        return tuple(sorted(out, key=lambda p: p.id))

    def _policy(self, policy_id: str) -> Mapping[str, Any]:
        if not _HEX_ID.match(policy_id):
            raise PowerFlexNotFound(
                f"PowerFlex has no snapshot policy {policy_id!r}",
                hint="list them with list_policies",
                backend=_NAME,
                policy_id=policy_id,
            )
        data = self._client.get(f"/instances/SnapshotPolicy::{policy_id}")
        if not isinstance(data, dict):
            raise PowerFlexAPIError(
                f"snapshot policy {policy_id}: unexpected answer",
                hint="check the gateway",
                backend=_NAME,
            )
        return data

    def pause_policy(self, policy_id: str) -> None:
        """``pauseSnapshotPolicy`` unless it is paused already."""
        if self._policy(policy_id).get("snapshotPolicyState") != "Paused":
            self._write(f"/instances/SnapshotPolicy::{policy_id}/action/pauseSnapshotPolicy", {})

    def resume_policy(self, policy_id: str) -> None:
        """``resumeSnapshotPolicy`` unless it is active already."""
        if self._policy(policy_id).get("snapshotPolicyState") == "Paused":
            self._write(f"/instances/SnapshotPolicy::{policy_id}/action/resumeSnapshotPolicy", {})

    def ex_create_policy(
        self, name: str, volume_ids: Sequence[str], *, cadence_minutes: int = 60, retained: int = 4
    ) -> str:
        """Create a snapshot policy and add ``volume_ids`` as its sources; its id.

        The source action is ``addSourceVolumeToSnapshotPolicy`` on 3.x/4.x,
        ``assignSnapshotPolicy`` on 5.x.
        """
        answer = self._write(
            "/types/SnapshotPolicy/instances",
            {
                "name": name,
                "autoSnapshotCreationCadenceInMin": cadence_minutes,
                "numOfRetainedSnapshotsPerLevel": [retained],
                "paused": False,
                "snapshotAccessMode": "ReadOnly",
                "secureSnapshots": False,
            },
        )
        pid = _text(answer.get("id"))
        action = (
            "assignSnapshotPolicy" if self._client.major >= 5 else "addSourceVolumeToSnapshotPolicy"
        )
        for ref in volume_ids:
            vid = _text(self._resolve(ref).get("id"))
            self._write(
                f"/instances/SnapshotPolicy::{pid}/action/{action}", {"sourceVolumeId": vid}
            )
        return pid


def _is_snapshot(v: Mapping[str, Any]) -> bool:
    """A backup snapshot: a V-Tree descendant limited to read-only access."""
    return (
        bool(v.get("ancestorVolumeId"))
        and (v.get("accessModeLimit") == "ReadOnly" or v.get("volumeType") == "ReadOnlySnapshot")
        and v.get("volumeType") in _SNAPSHOT_TYPES
    )
