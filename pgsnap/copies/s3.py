"""A copy target in S3-compatible object storage (AWS S3, MinIO, Ceph RGW, SeaweedFS).

:class:`S3CopyTarget` keeps a copy target's objects in a bucket, under a
prefix, with the same layout as the directory target::

    <prefix>chunks/<first two hex digits>/<chunk id>
    <prefix>manifests/<copy id>.json
    <prefix>markers/<marker name>

It talks S3 through ``boto3`` (``pip install 'pgsnap[s3]'``). Credentials
are read from the environment variables it is told to read
(``access_key_env``, ``secret_key_env``), else from boto3's usual chain
(``AWS_ACCESS_KEY_ID``, a profile, an instance role); they are never part of
its repr, a plan, a log line or an error. Retries with backoff on 5xx and
timeouts are boto3's (``retries={"mode": "standard"}``); a PUT is atomic,
so a reader sees a whole object or none. A chunk and a marker that must not
be replaced are written with one conditional PUT (``If-None-Match: *``):
S3 is strongly consistent (read after write, list after write), and of two
such PUTs of one key exactly one succeeds.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from pgsnap.copies.manifest import (
    MARKER_GONE_HINT,
    check_chunk_id,
    check_copy_id,
    check_marker_name,
    is_chunk_id,
    is_marker_name,
)
from pgsnap.errors import ConfigurationError, CopyError, CopyNotFound

__all__ = ["S3CopyTarget"]

log = logging.getLogger(__name__)

_MISSING = ("404", "NoSuchKey", "NotFound")
_EXISTS = ("PreconditionFailed", "412")
_CONFLICT = ("ConditionalRequestConflict", "409")
"""AWS: another conditional write of the key is under way (its outcome decides)."""


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


class S3CopyTarget:
    """A copy target in ``bucket`` under ``prefix`` (see the module docstring).

    ``endpoint_url`` names a server other than AWS (``http://127.0.0.1:8333``);
    ``ca_bundle`` a file of CA certificates to verify its TLS certificate with.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_env: str | None = None,
        secret_key_env: str | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
        client: Any = None,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ConfigurationError(
                f"{bucket!r} is not a bucket name", hint="name the bucket alone, e.g. 'backups'"
            )
        self._bucket = bucket
        self._prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._endpoint = endpoint_url
        self._client = (
            client
            if client is not None
            else self._connect(endpoint_url, region, access_key_env, secret_key_env, ca_bundle)
        )

    @staticmethod
    def _connect(
        endpoint_url: str | None,
        region: str | None,
        access_key_env: str | None,
        secret_key_env: str | None,
        ca_bundle: str | os.PathLike[str] | None,
    ) -> Any:
        try:
            boto3 = importlib.import_module("boto3")
            config = importlib.import_module("botocore.config")
        except ImportError:
            raise ConfigurationError(
                "an S3 copy target needs boto3", hint="pip install 'pgsnap[s3]'"
            ) from None
        keys: dict[str, str] = {}
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
        return boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region or "us-east-1",
            verify=os.fspath(ca_bundle) if ca_bundle is not None else None,
            config=config.Config(retries={"max_attempts": 5, "mode": "standard"}),
            **keys,
        )

    def __repr__(self) -> str:
        return f"S3CopyTarget({self.location!r})"

    @property
    def location(self) -> str:
        """``s3://bucket/prefix`` (and the endpoint when it is not AWS's)."""
        where = f"s3://{self._bucket}/{self._prefix}"
        return where if self._endpoint is None else f"{where} at {self._endpoint}"

    # ------------------------------------------------------------------ errors

    def _error(self, exc: Exception, what: str, missing_hint: str | None = None) -> Exception:
        code = _code(exc)
        if code in _MISSING:
            return CopyNotFound(
                f"{what} is not in the copy target {self.location}",
                hint=missing_hint
                or "list the target's copies; a chunk missing from a copy is damage",
            )
        if code == "NoSuchBucket":
            return CopyError(
                f"the bucket {self._bucket} does not exist ({self.location})",
                hint="create the bucket, or name another one",
            )
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return CopyError(
                f"the copy target {self.location} refused {what}: {code}",
                hint="check the access key and its permissions on the bucket "
                "(a copy needs to list, read and write)",
            )
        return CopyError(
            f"{what} failed on the copy target {self.location}: {type(exc).__name__}: "
            f"{code or exc}",
            hint="check that the object store answers; boto3 retried timeouts and 5xx",
        )

    def _call(
        self, what: str, method: str, *, missing_hint: str | None = None, **kwargs: Any
    ) -> Any:
        try:
            return getattr(self._client, method)(Bucket=self._bucket, **kwargs)
        except Exception as exc:  # botocore's ClientError, EndpointConnectionError...
            raise self._error(exc, what, missing_hint) from exc

    def _put_if_absent(self, key: str, body: bytes, what: str) -> bool:
        """One conditional PUT: True when it wrote ``key``, False when the key existed
        (412), or when another conditional write of it was under way (409: that one
        decides; a caller that needs the key written reads it back)."""
        try:
            self._client.put_object(Bucket=self._bucket, Key=key, Body=body, IfNoneMatch="*")
        except Exception as exc:
            code = _code(exc)
            if code in _EXISTS or code in _CONFLICT:
                return False
            raise self._error(exc, what) from exc
        return True

    def _chunk_key(self, chunk: str) -> str:
        check_chunk_id(chunk)
        return f"{self._prefix}chunks/{chunk[:2]}/{chunk}"

    def _manifest_key(self, copy_id: str) -> str:
        return f"{self._prefix}manifests/{check_copy_id(copy_id)}.json"

    def _marker_key(self, name: str) -> str:
        return f"{self._prefix}markers/{check_marker_name(name)}"

    def _keys(self, prefix: str) -> Iterator[str]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(f"listing {prefix}", "list_objects_v2", **kwargs)
            for item in page.get("Contents", ()):
                yield str(item["Key"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    # ------------------------------------------------------------------ the protocol

    def has_chunk(self, chunk: str) -> bool:
        """True when the chunk's object exists."""
        try:
            self._call(f"chunk {chunk}", "head_object", Key=self._chunk_key(chunk))
        except CopyNotFound:
            return False
        return True

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        """PUT the chunk's object unless it exists: one conditional request
        (``If-None-Match: *``; a 412 means it was there)."""
        return self._put_if_absent(self._chunk_key(chunk), data, f"writing chunk {chunk}")

    def get_chunk(self, chunk: str) -> bytes:
        """The chunk object's bytes."""
        got = self._call(f"chunk {chunk}", "get_object", Key=self._chunk_key(chunk))
        return bytes(got["Body"].read())

    def chunk_ids(self) -> Iterator[str]:
        """The chunk objects' names."""
        for key in self._keys(f"{self._prefix}chunks/"):
            name = key.rpartition("/")[2]
            if is_chunk_id(name):
                yield name

    def delete_chunk(self, chunk: str) -> None:
        """DELETE the chunk's object (S3 deletes of absent keys succeed)."""
        self._call(f"deleting chunk {chunk}", "delete_object", Key=self._chunk_key(chunk))

    def put_manifest(self, copy_id: str, text: str) -> None:
        """PUT ``manifests/<copy id>.json``."""
        self._call(
            f"writing the manifest of copy {copy_id}",
            "put_object",
            Key=self._manifest_key(copy_id),
            Body=text.encode(),
        )

    def get_manifest(self, copy_id: str) -> str:
        """The text of ``manifests/<copy id>.json``."""
        got = self._call(f"copy {copy_id}", "get_object", Key=self._manifest_key(copy_id))
        return bytes(got["Body"].read()).decode()

    def manifest_ids(self) -> tuple[str, ...]:
        """The copy ids with a manifest object."""
        names = (k.rpartition("/")[2] for k in self._keys(f"{self._prefix}manifests/"))
        return tuple(sorted(n[: -len(".json")] for n in names if n.endswith(".json")))

    def delete_manifest(self, copy_id: str) -> None:
        """DELETE ``manifests/<copy id>.json``."""
        self._call(
            f"deleting the manifest of copy {copy_id}",
            "delete_object",
            Key=self._manifest_key(copy_id),
        )

    def put_marker(self, name: str, text: str) -> None:
        """PUT ``markers/<name>``."""
        self._call(
            f"writing the marker {name}",
            "put_object",
            Key=self._marker_key(name),
            Body=text.encode(),
        )

    def create_marker(self, name: str, text: str) -> bool:
        """PUT ``markers/<name>`` with ``If-None-Match: *``: False when it exists."""
        return self._put_if_absent(
            self._marker_key(name), text.encode(), f"creating the marker {name}"
        )

    def get_marker(self, name: str) -> str:
        """The text of ``markers/<name>``."""
        got = self._call(
            f"marker {name}",
            "get_object",
            missing_hint=MARKER_GONE_HINT,
            Key=self._marker_key(name),
        )
        return bytes(got["Body"].read()).decode()

    def marker_names(self) -> tuple[str, ...]:
        """The names of the objects under ``markers/``."""
        names = (k.rpartition("/")[2] for k in self._keys(f"{self._prefix}markers/"))
        return tuple(sorted(n for n in names if is_marker_name(n)))

    def delete_marker(self, name: str) -> None:
        """DELETE ``markers/<name>``."""
        self._call(f"deleting the marker {name}", "delete_object", Key=self._marker_key(name))
