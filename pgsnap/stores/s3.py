"""An object store in an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, SeaweedFS).

:class:`S3Store` keeps objects under a prefix of a bucket. It talks S3 through
:class:`~pgsnap.stores.s3http.S3Http`: botocore's credentials and request
signing, urllib3's connections, about a fifth of a boto3 client's CPU per
request (``pip install 'pgsnap[s3]'``); a boto3 client given as ``client`` is
used instead. Credentials are read from the environment variables it is told
to read (``access_key_env``, ``secret_key_env``), or from a credentials file
(``credentials_file``: ``access_key_id`` and ``secret_access_key`` lines, as
in an AWS shared credentials file's ``[default]`` section, readable by its
owner only), else from botocore's usual chain (``AWS_ACCESS_KEY_ID``, a
profile, an instance role); they are never part of its repr, a plan, a log
line or an error.

Retries are pgsnap's, not boto3's: a 5xx answer, a throttling code, a timeout
or a dropped connection is tried again (``attempts`` in all, with exponential
backoff and jitter); an answer that asking again cannot change (access
denied, a bucket that does not exist, a TLS certificate that cannot be
verified) is the store's ``refused`` error at once. One client is shared by
the threads of its user, with a pool of ``max_connections`` kept-alive
connections.

A PUT is atomic, so a reader sees a whole object or none; an object larger
than ``multipart_threshold`` is sent as a multipart upload of ``part_size``
parts (aborted on failure, so no part is left behind), atomic as well at its
completion. A write ``if_absent`` is one conditional request
(``If-None-Match: *`` on the PUT or on the completion of the upload): S3 is
strongly consistent (read after write, list after write), and of two such
writes of one key exactly one succeeds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import random
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

from pgsnap.errors import ConfigurationError, PgsnapError
from pgsnap.stores.base import StoredObject, StoreErrors, check_key
from pgsnap.stores.s3http import S3Http

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "MIN_PART_SIZE",
    "S3Store",
    "error_code",
    "read_credentials_file",
]

log = logging.getLogger(__name__)

_MISSING = ("404", "NoSuchKey", "NotFound")
_EXISTS = ("PreconditionFailed", "412")
_CONFLICT = ("ConditionalRequestConflict", "409")
"""AWS: another conditional write of the key is under way (its outcome decides)."""
_DENIED = (
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
)
_TRANSIENT = (
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestThrottled",
    "OperationAborted",
)
_TRANSIENT_EXCEPTIONS: Final = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ConnectionClosedError",
    "ResponseStreamingError",
    "IncompleteReadError",
    "ProxyConnectionError",
    "SSLError",  # a handshake cut short; a certificate that fails to verify is not retried
    "ConnectionError",
    "HTTPClientError",
    "ProtocolError",  # urllib3 (S3Http): a connection reset or closed mid-answer
    "NewConnectionError",  # urllib3: refused, unreachable
    "TimeoutError",  # urllib3's base of its timeouts, and the built-in one
)
"""Exceptions (by class name: botocore's, and urllib3's under
:class:`~pgsnap.stores.s3http.S3Http`) worth trying again."""

DEFAULT_ATTEMPTS: Final = 5
"""Tries of one request (the first and four retries) on a transient failure."""
DEFAULT_MAX_CONNECTIONS: Final = 16
"""Kept-alive connections of a store's pool: its user's threads."""
DEFAULT_MULTIPART_THRESHOLD: Final = 32 * 1024 * 1024
"""Objects larger than this go up in parts."""
DEFAULT_PART_SIZE: Final = 16 * 1024 * 1024
"""The size of an upload's parts (S3 wants at least 5 MiB, the last one aside)."""
MIN_PART_SIZE: Final = 5 * 1024 * 1024
_BACKOFF_BASE: Final = 0.2
_BACKOFF_CAP: Final = 10.0

T = TypeVar("T")


def error_code(exc: BaseException) -> str:
    """The S3 error code of a failure (botocore's ``ClientError``, S3Http's error, or
    an error a store raised from one); "" when it has none."""
    while exc is not None:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code", ""))
        if exc.__cause__ is None:
            return ""
        exc = exc.__cause__
    return ""


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status if isinstance(status, int) else 0
    return 0


def _untrusted(exc: BaseException) -> bool:
    """A TLS certificate that does not verify (no retry changes that)."""
    text = str(exc).lower()
    return "certificate verify failed" in text or "certificate_verify_failed" in text


def _transient(exc: BaseException) -> bool:
    """Whether asking again may give another answer."""
    if _untrusted(exc):
        return False
    if error_code(exc) or _status(exc):
        return _status(exc) >= 500 or error_code(exc) in _TRANSIENT
    names = {k.__name__ for k in type(exc).__mro__}
    return bool(names & set(_TRANSIENT_EXCEPTIONS))


def read_credentials_file(
    path: str | os.PathLike[str], setting: str = "credentials_file"
) -> dict[str, str]:
    """The keys in an S3 credentials file: ``aws_access_key_id`` and
    ``aws_secret_access_key`` (or without the ``aws_`` prefix), ``key = value``
    lines, in a ``[default]`` section or none. Refused
    (:class:`~pgsnap.errors.ConfigurationError`, never with a key in the message):
    a file that group or others can read, a symbolic link, one without both keys.
    ``setting`` names the configuration key that gave the path, for hints."""
    where = os.fspath(path)
    try:
        st = os.lstat(where)
    except OSError as exc:
        raise ConfigurationError(
            f"the S3 credentials file {where} cannot be read: {exc.strerror or exc}",
            hint=f"check {setting}",
        ) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise ConfigurationError(
            f"the S3 credentials file {where} is not a regular file",
            hint=f"point {setting} at the file itself",
        )
    if st.st_mode & 0o077:
        raise ConfigurationError(
            f"the S3 credentials file {where} can be read by others "
            f"(mode {stat.S_IMODE(st.st_mode):04o})",
            hint=f"chmod 600 {where}",
        )
    section = "default"
    found: dict[str, str] = {}
    with open(where, encoding="utf-8") as f:
        for line in f:
            text = line.strip()
            if not text or text.startswith(("#", ";")):
                continue
            if text.startswith("[") and text.endswith("]"):
                section = text[1:-1].strip()
                continue
            name, eq, value = text.partition("=")
            if eq and section == "default":
                found[name.strip().lower().removeprefix("aws_")] = value.strip()
    keys = {
        arg: found[name]
        for name, arg in (
            ("access_key_id", "aws_access_key_id"),
            ("secret_access_key", "aws_secret_access_key"),
        )
        if found.get(name)
    }
    if len(keys) != 2:
        raise ConfigurationError(
            f"the S3 credentials file {where} does not hold both access_key_id and "
            "secret_access_key (in [default] or no section)",
            hint="write aws_access_key_id = ... and aws_secret_access_key = ... lines",
        )
    return keys


def _modified(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str) and value:
        with contextlib.suppress(ValueError):
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return None


class S3Store:
    """Objects in ``bucket`` under ``prefix`` (see the module docstring), raising
    ``errors``' kinds; ``name`` says what the store is in messages ("the copy
    target", "the WAL archive").

    ``endpoint_url`` names a server other than AWS (``http://127.0.0.1:8333``);
    ``ca_bundle`` a file of CA certificates to verify its TLS certificate with.
    ``attempts``: tries of a request on a transient failure (default
    :data:`DEFAULT_ATTEMPTS`; 1 with a ``client`` of your own, which retries as
    it was made to); ``max_connections``: the connection pool (as many as the
    threads that share the store); objects above ``multipart_threshold`` bytes
    go up in parts of ``part_size``. ``sleep`` waits between two tries (tests
    replace it). ``settings`` names where the options came from, for hints
    (``[copies]``).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        errors: StoreErrors,
        name: str = "the object store",
        settings: str = "the configuration",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_env: str | None = None,
        secret_key_env: str | None = None,
        credentials_file: str | os.PathLike[str] | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
        client: Any = None,
        attempts: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ConfigurationError(
                f"{bucket!r} is not a bucket name", hint="name the bucket alone, e.g. 'backups'"
            )
        if part_size < MIN_PART_SIZE or multipart_threshold < part_size:
            raise ConfigurationError(
                f"part_size {part_size} must be at least {MIN_PART_SIZE} (5 MiB) and "
                f"multipart_threshold {multipart_threshold} at least part_size",
                hint="leave them out for 16 MiB parts above 32 MiB",
            )
        self._bucket = bucket
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._endpoint = endpoint_url
        self._errors = errors
        self._name = name
        self._settings = settings
        self._attempts = max(
            1, attempts if attempts is not None else 1 if client else DEFAULT_ATTEMPTS
        )
        self._multipart_threshold = multipart_threshold
        self._part_size = part_size
        self._sleep = sleep
        self._client = (
            client
            if client is not None
            else self._connect(
                endpoint_url,
                region,
                access_key_env,
                secret_key_env,
                ca_bundle,
                max_connections,
                credentials_file,
            )
        )

    def _connect(
        self,
        endpoint_url: str | None,
        region: str | None,
        access_key_env: str | None,
        secret_key_env: str | None,
        ca_bundle: str | os.PathLike[str] | None,
        max_connections: int,
        credentials_file: str | os.PathLike[str] | None = None,
    ) -> Any:
        keys: dict[str, str] = (
            read_credentials_file(credentials_file, f"{self._settings} credentials_file")
            if credentials_file is not None
            else {}
        )
        for env, arg in (
            (access_key_env, "aws_access_key_id"),
            (secret_key_env, "aws_secret_access_key"),
        ):
            if env is None:
                continue
            value = os.environ.get(env)
            if not value:
                raise ConfigurationError(
                    f"the environment variable {env} is not set",
                    hint="export it before running pgsnap (its value is never written anywhere)",
                )
            keys[arg] = value
        if keys and len(keys) != 2:
            raise ConfigurationError(
                f"{self._name} in S3 needs both an access key and its secret, or neither "
                "(then the environment, a profile or an instance role gives them)",
                hint="set both access_key_env and secret_key_env",
            )
        return S3Http(
            endpoint_url=endpoint_url,
            region=region or "us-east-1",
            credentials=(
                (keys["aws_access_key_id"], keys["aws_secret_access_key"]) if keys else None
            ),
            ca_bundle=ca_bundle,
            max_connections=max_connections,
            settings=self._settings,
        )

    def __repr__(self) -> str:
        return f"S3Store({self.location!r})"

    @property
    def location(self) -> str:
        """``s3://bucket/prefix`` (and the endpoint when it is not AWS's)."""
        where = f"s3://{self._bucket}/{self._prefix}"
        return where if self._endpoint is None else f"{where} at {self._endpoint}"

    @property
    def bucket(self) -> str:
        """The bucket."""
        return self._bucket

    @property
    def prefix(self) -> str:
        """The prefix of every key (``""`` or ending in ``/``)."""
        return self._prefix

    # ------------------------------------------------------------------ errors

    def error(
        self, exc: BaseException, what: str, missing_hint: str | None = None, tries: int = 1
    ) -> PgsnapError:
        """The store's error for a failed request ``what``."""
        code = error_code(exc)
        if code in _MISSING:
            return self._errors.missing(
                f"{what} is not in {self._name} {self.location}",
                hint=missing_hint or f"list what {self._name} holds",
            )
        if code == "NoSuchBucket":
            return self._errors.refused(
                f"the bucket {self._bucket} does not exist ({self.location})",
                hint="create the bucket, or name another one",
            )
        if code in _DENIED:
            return self._errors.refused(
                f"{self._name} {self.location} refused {what}: {code}",
                hint="check the access key and its permissions on the bucket "
                "(pgsnap needs to list, read and write)",
            )
        if _untrusted(exc):
            return self._errors.refused(
                f"the TLS certificate of {self._name} {self.location} cannot be verified "
                f"({type(exc).__name__}: certificate verify failed)",
                hint=f"give the CA certificate that signed it as ca_bundle ({self._settings} "
                "ca_bundle), or check that the endpoint's name is the certificate's",
            )
        again = f" ({tries} tries)" if tries > 1 else ""
        return self._errors.failed(
            f"{what} failed on {self._name} {self.location}{again}: "
            f"{type(exc).__name__}: {code or exc}",
            hint="check that the object store answers; timeouts, dropped connections and "
            "5xx answers were tried again",
        )

    def retrying(
        self, what: str, request: Callable[[], T], *, missing_hint: str | None = None
    ) -> T:
        """``request()``, tried again on a transient failure (see the module docstring);
        any failure left is the store's error."""
        for attempt in range(1, self._attempts + 1):
            try:
                return request()
            except Exception as exc:  # botocore's ClientError, EndpointConnectionError...
                if attempt == self._attempts or not _transient(exc):
                    raise self.error(exc, what, missing_hint, attempt) from exc
                pause = random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt))  # noqa: S311 - jitter
                log.info(
                    "%s on %s: %s (try %d of %d), again in %.1f s",
                    what,
                    self.location,
                    type(exc).__name__,
                    attempt,
                    self._attempts,
                    pause,
                )
                self._sleep(pause)
        raise AssertionError("unreachable")  # pragma: no cover

    def call(
        self, what: str, method: str, *, missing_hint: str | None = None, **kwargs: Any
    ) -> Any:
        """A client method on the bucket, tried again as :meth:`retrying` does."""
        return self.retrying(
            what,
            lambda: getattr(self._client, method)(Bucket=self._bucket, **kwargs),
            missing_hint=missing_hint,
        )

    def _key(self, key: str) -> str:
        try:
            return self._prefix + check_key(key)
        except ValueError as exc:
            raise self._errors.failed(str(exc), hint="name an object by a relative key") from None

    # ------------------------------------------------------------------ the protocol

    def get(self, key: str, *, what: str | None = None, missing_hint: str | None = None) -> bytes:
        """The object's bytes (its body read inside the retried request)."""
        full = self._key(key)

        def request() -> bytes:
            got = self._client.get_object(Bucket=self._bucket, Key=full)
            return bytes(got["Body"].read())

        return self.retrying(what or key, request, missing_hint=missing_hint)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of the object from ``start`` (a ranged GET)."""
        full = self._key(key)
        if length <= 0:
            return b""

        def request() -> bytes:
            got = self._client.get_object(
                Bucket=self._bucket, Key=full, Range=f"bytes={start}-{start + length - 1}"
            )
            return bytes(got["Body"].read())

        try:
            return self.retrying(key, request)
        except PgsnapError as exc:
            if error_code(exc) == "InvalidRange":  # start at or past the end
                return b""
            raise

    def head(self, key: str) -> StoredObject | None:
        """The object's size and ETag (HEAD), or None when it is not there."""
        full = self._key(key)
        try:
            got = self.call(key, "head_object", Key=full)
        except PgsnapError as exc:
            if error_code(exc) in _MISSING:
                return None
            raise
        return StoredObject(
            key,
            int(got.get("ContentLength", 0) or 0),
            str(got.get("ETag", "")).strip('"'),
            _modified(got.get("LastModified")),
        )

    def put(
        self, key: str, data: bytes, *, if_absent: bool = False, what: str | None = None
    ) -> bool:
        """Write ``key`` (in parts above the threshold). With ``if_absent``, one
        conditional write: True when it wrote ``key``, False when the key existed
        (412), or when another conditional write of it was under way (409: that one
        decides; a caller that needs the key written reads it back)."""
        full = self._key(key)
        what = what or f"writing {key}"
        if len(data) > self._multipart_threshold:
            return self._put_parts(full, data, what, if_absent=if_absent)
        condition = {"IfNoneMatch": "*"} if if_absent else {}
        try:
            self.retrying(
                what,
                lambda: self._client.put_object(
                    Bucket=self._bucket, Key=full, Body=data, **condition
                ),
            )
        except PgsnapError as exc:
            if if_absent and error_code(exc) in (*_EXISTS, *_CONFLICT):
                return False
            raise
        return True

    def _put_parts(self, key: str, body: bytes, what: str, *, if_absent: bool) -> bool:
        """A multipart upload of ``body``; aborted when it does not complete."""
        started = self.call(f"{what} (starting its upload)", "create_multipart_upload", Key=key)
        upload_id = str(started["UploadId"])
        view = memoryview(body)
        parts: list[dict[str, Any]] = []
        try:
            for number, offset in enumerate(range(0, len(body), self._part_size), 1):
                part = bytes(view[offset : offset + self._part_size])
                sent = self.call(
                    f"{what} (part {number})",
                    "upload_part",
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=part,
                )
                parts.append({"ETag": sent["ETag"], "PartNumber": number})
            condition = {"IfNoneMatch": "*"} if if_absent else {}
            self.call(
                f"{what} (completing its upload)",
                "complete_multipart_upload",
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                **condition,
            )
        except BaseException as exc:
            self._abort(key, upload_id)
            if (
                if_absent
                and isinstance(exc, PgsnapError)
                and error_code(exc) in (*_EXISTS, *_CONFLICT)
            ):
                return False
            raise
        log.debug("%s: %d bytes in %d parts", what, len(body), len(parts))
        return True

    def _abort(self, key: str, upload_id: str) -> None:
        """Abort an upload (its parts go), best effort: a failure is logged."""
        with contextlib.suppress(PgsnapError):
            self.call(
                f"aborting the upload of {key}",
                "abort_multipart_upload",
                Key=key,
                UploadId=upload_id,
            )
            return
        log.warning(
            "could not abort the upload of %s on %s: its parts stay until the bucket's "
            "lifecycle rule for incomplete uploads removes them",
            key,
            self.location,
        )

    def list(self, prefix: str = "") -> Iterator[StoredObject]:
        """The objects whose keys start with ``prefix`` (``list_objects_v2``, page by
        page), in key order, with their keys relative to the store's prefix."""
        token: str | None = None
        full = self._prefix + prefix
        while True:
            kwargs: dict[str, Any] = {"Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.call(f"listing {full or 'the bucket'}", "list_objects_v2", **kwargs)
            for item in page.get("Contents", ()):
                key = str(item["Key"])
                yield StoredObject(
                    key[len(self._prefix) :],
                    int(item.get("Size", 0) or 0),
                    str(item.get("ETag", "")).strip('"'),
                    _modified(item.get("LastModified")),
                )
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def delete(self, key: str, *, what: str | None = None) -> None:
        """DELETE the object (S3 deletes of absent keys succeed)."""
        self.call(what or f"deleting {key}", "delete_object", Key=self._key(key))
