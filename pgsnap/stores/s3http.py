"""A lean S3 client for the few requests an object store makes.

:class:`~pgsnap.stores.s3.S3Store` makes small, many requests: a copy sends
one PUT per new chunk and a restore one GET per chunk, a WAL archive one PUT
per segment. boto3's client spends about 2.5 ms
of CPU on each (endpoint rules evaluated per key, the user agent, event
hooks, response parsing), as much as compressing the chunk; on a backup
host that is copying, CPU is what the copy's speed follows. :class:`S3Http`
keeps what botocore does well and drops the rest: botocore finds the
credentials (the environment, a profile, an instance role, refreshed as
they expire) and signs each request (Signature Version 4, its
``S3SigV4Auth``); urllib3 carries it over a pool of kept-alive connections.
A request costs about a fifth of boto3's CPU.

It offers exactly the methods of a boto3 S3 client that the store calls,
with the same arguments and the same shapes of answers
(``put_object``, ``get_object``, ``head_object``, ``delete_object``,
``list_objects_v2``, ``create_multipart_upload``, ``upload_part``,
``complete_multipart_upload``, ``abort_multipart_upload``), so that a boto3
client can still be given instead (``S3Store(client=...)``). An error
answer raises :class:`S3HttpError`, whose ``response`` holds the code and
status as botocore's ``ClientError`` does; a connection that fails raises
urllib3's exception (``NewConnectionError``, ``ProtocolError``,
``ReadTimeoutError``, ``SSLError``...). It never retries: the target does.

Addressing: with an ``endpoint_url`` (MinIO, Ceph RGW, SeaweedFS) path style,
``<endpoint>/<bucket>/<key>``; on AWS virtual-hosted style,
``https://<bucket>.s3.<region>.amazonaws.com/<key>`` (path style for a bucket
whose name has dots, which no certificate covers). ``HTTPS_PROXY`` /
``HTTP_PROXY`` / ``NO_PROXY`` are honoured. Payloads are signed (their
SHA-256 is part of the signature, and the server checks the body against it).
"""

from __future__ import annotations

import datetime
import email.utils
import importlib
import io
import os
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any, Final

from pgsnap.errors import ConfigurationError

__all__ = ["S3Http", "S3HttpError", "load_botocore"]

_NS: Final = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_SAFE_KEY: Final = "/~"
"""Characters a key keeps unencoded in a URL path (botocore's rule for S3)."""
_SAFE_QUERY: Final = "-_.~"


def load_botocore() -> tuple[Any, Any, Any, Any, Any]:
    """botocore's ``session``, ``credentials``, ``auth`` and ``awsrequest`` modules
    and ``urllib3``, or a :class:`~pgsnap.errors.ConfigurationError` naming the
    extra to install (``pgsnap[s3]``)."""
    try:
        return (
            importlib.import_module("botocore.session"),
            importlib.import_module("botocore.credentials"),
            importlib.import_module("botocore.auth"),
            importlib.import_module("botocore.awsrequest"),
            importlib.import_module("urllib3"),
        )
    except ImportError:
        raise ConfigurationError(
            "S3 object storage needs botocore and urllib3", hint="pip install 'pgsnap[s3]'"
        ) from None


class S3HttpError(Exception):
    """An error answer: ``response`` as botocore's ``ClientError`` has it
    (``response["Error"]["Code"]``, ``response["ResponseMetadata"]["HTTPStatusCode"]``)."""

    def __init__(self, operation: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{operation}: HTTP {status} {code}" + (f": {message}" if message else ""))
        self.response: dict[str, Any] = {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }


def _error_of(operation: str, status: int, body: bytes) -> S3HttpError:
    """The error an answer's XML body names (an answer with none, as to a HEAD:
    its status as the code, as botocore does)."""
    code, message = str(status), ""
    if body:
        try:
            root = ET.fromstring(body)  # noqa: S314 - the configured server's answer
        except ET.ParseError:
            message = body[:200].decode("utf-8", "replace")
        else:
            code = root.findtext("Code") or code
            message = root.findtext("Message") or ""
    return S3HttpError(operation, status, code, message)


def _text(root: ET.Element, name: str) -> str | None:
    """A child's text, with or without the S3 namespace (servers differ)."""
    found = root.find(_NS + name)
    if found is None:
        found = root.find(name)
    return found.text if found is not None else None


def _all(root: ET.Element, name: str) -> list[ET.Element]:
    return root.findall(_NS + name) or root.findall(name)


class S3Http:
    """A client for ``bucket`` operations (see the module docstring).

    ``credentials``: an ``(access key, secret key)`` pair, or None for
    botocore's chain. ``ca_bundle``: CA certificates to verify the server's
    with (else the system's). ``max_connections`` kept-alive connections are
    shared by the threads.
    """

    def __init__(
        self,
        *,
        endpoint_url: str | None,
        region: str,
        credentials: tuple[str, str] | None,
        ca_bundle: str | os.PathLike[str] | None = None,
        max_connections: int = 16,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        settings: str = "[copies]",
    ) -> None:
        session, creds, auth, awsrequest, urllib3 = load_botocore()
        self._signer = auth.S3SigV4Auth
        self._request_type = awsrequest.AWSRequest
        if credentials is not None:
            self._credentials = creds.Credentials(*credentials)
        else:
            found = session.get_session().get_credentials()
            if found is None:
                raise ConfigurationError(
                    "no S3 credentials: no keys configured and none in the environment, "
                    "a profile or an instance role",
                    hint=f"set {settings} access_key_env and secret_key_env (or credentials_file)",
                )
            self._credentials = found
        self._region = region
        if endpoint_url:
            parts = urllib.parse.urlsplit(endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigurationError(
                    f"{endpoint_url!r} is not an http(s) URL",
                    hint="give the S3 server as https://host:port",
                )
            self._base = endpoint_url.rstrip("/")
            self._virtual = False
        else:
            self._base = f"https://s3.{region}.amazonaws.com"
            self._virtual = True
        pool_args: dict[str, Any] = {
            "maxsize": max(1, max_connections),
            "block": False,
            "timeout": urllib3.Timeout(connect=connect_timeout, read=read_timeout),
            "retries": False,
        }
        if self._base.startswith("https:"):
            pool_args["cert_reqs"] = "CERT_REQUIRED"
            if ca_bundle is not None:
                pool_args["ca_certs"] = os.fspath(ca_bundle)
        host = urllib.parse.urlsplit(self._base).hostname or ""
        scheme = urllib.parse.urlsplit(self._base).scheme
        proxy = urllib.request.getproxies().get(scheme)
        if proxy and not urllib.request.proxy_bypass(host):
            self._pool: Any = urllib3.ProxyManager(proxy, **pool_args)
        else:
            self._pool = urllib3.PoolManager(**pool_args)

    def __repr__(self) -> str:
        return f"S3Http({self._base!r})"

    # ------------------------------------------------------------------ requests

    def _url(self, bucket: str, key: str, query: Mapping[str, str] | None) -> str:
        path = urllib.parse.quote(key, safe=_SAFE_KEY)
        if self._virtual and "." not in bucket:
            scheme, _, host = self._base.partition("://")
            url = f"{scheme}://{bucket}.{host}/{path}"
        else:
            url = f"{self._base}/{bucket}" + (f"/{path}" if key else "")
        if query:
            url += "?" + "&".join(
                f"{urllib.parse.quote(k, safe=_SAFE_QUERY)}="
                f"{urllib.parse.quote(v, safe=_SAFE_QUERY)}"
                for k, v in sorted(query.items())
            )
        return url

    def _request(
        self,
        operation: str,
        method: str,
        bucket: str,
        key: str = "",
        *,
        query: Mapping[str, str] | None = None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one signed request; its answer (an error answer raises)."""
        url = self._url(bucket, key, query)
        request = self._request_type(method=method, url=url, data=body, headers=dict(headers or {}))
        self._signer(self._credentials.get_frozen_credentials(), "s3", self._region).add_auth(
            request
        )
        answer = self._pool.request(
            method,
            url,
            body=body if method in ("PUT", "POST") else None,
            headers=dict(request.headers.items()),
            redirect=False,
            preload_content=True,
        )
        if answer.status >= 300:
            raise _error_of(operation, answer.status, answer.data if method != "HEAD" else b"")
        return answer

    # ------------------------------------------------------------------ boto3's methods

    def put_object(
        self, *, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str | None = None
    ) -> dict[str, Any]:
        """PUT an object (``IfNoneMatch="*"``: only when absent, else a 412)."""
        headers = {"If-None-Match": IfNoneMatch} if IfNoneMatch else {}
        answer = self._request("PutObject", "PUT", Bucket, Key, body=Body, headers=headers)
        return {"ETag": answer.headers.get("ETag", "")}

    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        """GET an object (``Range="bytes=A-B"``: part of it): ``{"Body": a file object of
        its bytes}``."""
        headers = {"Range": Range} if Range else {}
        answer = self._request("GetObject", "GET", Bucket, Key, headers=headers)
        return {
            "Body": io.BytesIO(answer.data),
            "ContentLength": len(answer.data),
            "ETag": answer.headers.get("ETag", ""),
        }

    def head_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        """HEAD an object (absent: a 404 error): its size, ETag and modification time."""
        answer = self._request("HeadObject", "HEAD", Bucket, Key)
        return {
            "ContentLength": int(answer.headers.get("Content-Length", 0) or 0),
            "ETag": answer.headers.get("ETag", ""),
            "LastModified": _http_date(answer.headers.get("Last-Modified", "")),
        }

    def delete_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        """DELETE an object (absent: S3 answers success)."""
        self._request("DeleteObject", "DELETE", Bucket, Key)
        return {}

    def list_objects_v2(
        self, *, Bucket: str, Prefix: str = "", ContinuationToken: str | None = None
    ) -> dict[str, Any]:
        """One page of keys under ``Prefix``: ``Contents`` (``Key``, ``Size``, ``ETag``,
        ``LastModified``), ``IsTruncated``, ``NextContinuationToken``."""
        query = {"list-type": "2", "prefix": Prefix}
        if ContinuationToken:
            query["continuation-token"] = ContinuationToken
        answer = self._request("ListObjectsV2", "GET", Bucket, query=query)
        root = ET.fromstring(answer.data)  # noqa: S314 - the configured server's answer
        contents = [
            {
                "Key": _text(item, "Key") or "",
                "Size": int(_text(item, "Size") or 0),
                "ETag": _text(item, "ETag") or "",
                "LastModified": _text(item, "LastModified") or "",
            }
            for item in _all(root, "Contents")
        ]
        page: dict[str, Any] = {
            "Contents": contents,
            "IsTruncated": (_text(root, "IsTruncated") or "").lower() == "true",
        }
        token = _text(root, "NextContinuationToken")
        if token:
            page["NextContinuationToken"] = token
        return page

    def create_multipart_upload(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        """Start a multipart upload: ``{"UploadId": ...}``."""
        answer = self._request("CreateMultipartUpload", "POST", Bucket, Key, query={"uploads": ""})
        upload = _text(ET.fromstring(answer.data), "UploadId")  # noqa: S314
        if not upload:
            raise S3HttpError("CreateMultipartUpload", answer.status, "NoUploadId", "")
        return {"UploadId": upload}

    def upload_part(
        self, *, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: bytes
    ) -> dict[str, Any]:
        """Send one part: ``{"ETag": ...}``."""
        answer = self._request(
            "UploadPart",
            "PUT",
            Bucket,
            Key,
            query={"partNumber": str(PartNumber), "uploadId": UploadId},
            body=Body,
        )
        return {"ETag": answer.headers.get("ETag", "")}

    def complete_multipart_upload(
        self,
        *,
        Bucket: str,
        Key: str,
        UploadId: str,
        MultipartUpload: Mapping[str, Any],
        IfNoneMatch: str | None = None,
    ) -> dict[str, Any]:
        """Complete an upload from its parts (``{"Parts": [{"ETag", "PartNumber"}]}``).
        S3 may answer 200 with an error in the body: that is an error too."""
        parts = "".join(
            f"<Part><PartNumber>{int(p['PartNumber'])}</PartNumber>"
            f"<ETag>{_xml_escape(str(p['ETag']))}</ETag></Part>"
            for p in MultipartUpload["Parts"]
        )
        body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        headers = {"If-None-Match": IfNoneMatch} if IfNoneMatch else {}
        answer = self._request(
            "CompleteMultipartUpload",
            "POST",
            Bucket,
            Key,
            query={"uploadId": UploadId},
            body=body,
            headers=headers,
        )
        if b"<Error>" in answer.data:
            raise _error_of("CompleteMultipartUpload", answer.status, answer.data)
        return {}

    def abort_multipart_upload(self, *, Bucket: str, Key: str, UploadId: str) -> dict[str, Any]:
        """Abort an upload; its parts go."""
        self._request("AbortMultipartUpload", "DELETE", Bucket, Key, query={"uploadId": UploadId})
        return {}


def _http_date(text: str) -> datetime.datetime | None:
    """An HTTP date (``Last-Modified``), aware; None when absent or malformed."""
    try:
        return email.utils.parsedate_to_datetime(text) if text else None
    except (TypeError, ValueError):
        return None


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
