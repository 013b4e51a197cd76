"""pgsnap's own S3 client, without a server: addressing, errors, credentials,
proxies. Against a real S3 server it runs in tests/integration/test_copies_s3.py."""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import pytest

from pgsnap.copies.s3 import S3CopyTarget
from pgsnap.errors import ConfigurationError, CopyError, CopyNotFound
from pgsnap.stores.s3http import S3Http, S3HttpError

KEYS = ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")


@pytest.fixture(autouse=True)
def no_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No credentials, profile, proxy or instance role from this machine."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def client(endpoint: str | None = "https://s3.example.com:9000", **kw: Any) -> S3Http:
    return S3Http(endpoint_url=endpoint, region="eu-west-1", credentials=KEYS, **kw)


def test_a_custom_endpoint_is_addressed_by_path_and_aws_by_virtual_host() -> None:
    own = client()
    assert own._url("backups", "pg/chunks/ab/ab12", None) == (
        "https://s3.example.com:9000/backups/pg/chunks/ab/ab12"
    )
    assert own._url("backups", "", {"prefix": "pg/a b+c", "list-type": "2"}) == (
        "https://s3.example.com:9000/backups?list-type=2&prefix=pg%2Fa%20b%2Bc"
    )
    aws = client(None)
    assert aws._url("backups", "pg 15/ünï", None) == (
        "https://backups.s3.eu-west-1.amazonaws.com/pg%2015/%C3%BCn%C3%AF"
    )
    assert aws._url("my.backups", "k", None) == (  # no certificate covers a dotted host
        "https://s3.eu-west-1.amazonaws.com/my.backups/k"
    )
    with pytest.raises(ConfigurationError, match="not an http"):
        client("s3.example.com")


@attrs.define
class Answer:
    status: int
    data: bytes = b""
    headers: dict[str, str] = attrs.field(factory=dict)


class Scripted:
    """A connection pool that answers from a script and keeps the requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, str, dict[str, str]]] = []

    def request(self, method: str, url: str, **kw: Any) -> Answer:
        self.sent.append((method, url, kw["headers"]))
        return self.answers.pop(0)


def test_requests_are_signed_and_errors_carry_the_code_and_status() -> None:
    own = client()
    pool = Scripted(
        Answer(200, headers={"ETag": '"e1"'}),
        Answer(404, b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"),
        Answer(404),  # a HEAD has no body
        Answer(503, b"not xml"),
    )
    own._pool = pool
    assert own.put_object(Bucket="b", Key="k", Body=b"x", IfNoneMatch="*") == {"ETag": '"e1"'}
    method, url, headers = pool.sent[0]
    assert (method, url) == ("PUT", "https://s3.example.com:9000/b/k")
    assert headers["If-None-Match"] == "*"
    assert (
        headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEYS[0]}/")
        and "/eu-west-1/s3/aws4_request" in headers["Authorization"]
    )
    # the payload is signed: the server checks the body against its SHA-256
    assert headers["X-Amz-Content-SHA256"] == hashlib.sha256(b"x").hexdigest()
    with pytest.raises(S3HttpError) as missing:
        own.get_object(Bucket="b", Key="k")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(S3HttpError) as head:
        own.head_object(Bucket="b", Key="k")
    assert head.value.response["Error"]["Code"] == "404"
    with pytest.raises(S3HttpError) as busy:
        own.delete_object(Bucket="b", Key="k")
    assert busy.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    for err in (missing.value, head.value, busy.value):
        assert KEYS[1] not in str(err)
    assert KEYS[1] not in repr(own)


def test_a_listing_is_read_with_or_without_the_namespace() -> None:
    own = client()
    ns = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    own._pool = Scripted(
        Answer(
            200,
            f"<ListBucketResult {ns}><IsTruncated>true</IsTruncated>"
            "<NextContinuationToken>t2</NextContinuationToken>"
            "<Contents><Key>p/a</Key><Size>3</Size></Contents>"
            "<Contents><Key>p/b</Key><Size>4</Size></Contents></ListBucketResult>".encode(),
        ),
        Answer(
            200,
            b"<ListBucketResult><IsTruncated>false</IsTruncated>"
            b"<Contents><Key>p/c</Key><Size>5</Size></Contents></ListBucketResult>",
        ),
    )
    first = own.list_objects_v2(Bucket="b", Prefix="p/")
    assert [c["Key"] for c in first["Contents"]] == ["p/a", "p/b"]
    assert first["IsTruncated"] and first["NextContinuationToken"] == "t2"
    second = own.list_objects_v2(Bucket="b", Prefix="p/", ContinuationToken="t2")
    assert second == {
        "Contents": [{"Key": "p/c", "Size": 5, "ETag": "", "LastModified": ""}],
        "IsTruncated": False,
    }
    assert "continuation-token=t2" in own._pool.sent[1][1]


def test_a_completion_that_answers_200_with_an_error_is_an_error_and_tried_again() -> None:
    """S3 may answer CompleteMultipartUpload with 200 and an error in the body."""
    own = client()
    own._pool = Scripted(
        Answer(200, b"<Error><Code>InternalError</Code><Message>try again</Message></Error>"),
        Answer(200, b"<CompleteMultipartUploadResult/>"),
    )
    target = S3CopyTarget("b", client=own, attempts=2, sleep=lambda _s: None)
    target.store.call(
        "completing",
        "complete_multipart_upload",
        Key="k",
        UploadId="u1",
        MultipartUpload={"Parts": [{"ETag": '"e&1"', "PartNumber": 1}]},
    )
    assert len(own._pool.sent) == 2  # the first answer was taken for the error it is


def test_what_the_target_makes_of_the_clients_errors() -> None:
    own = client()
    own._pool = Scripted(
        Answer(404, b"<Error><Code>NoSuchKey</Code></Error>"),
        Answer(404, b"<Error><Code>NoSuchBucket</Code></Error>"),
    )
    target = S3CopyTarget("b", client=own)
    with pytest.raises(CopyNotFound):
        target.get_manifest("c1")
    with pytest.raises(CopyError, match="does not exist"):
        target.get_manifest("c1")


def test_credentials_come_from_the_keys_or_botocores_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigurationError, match="no S3 credentials"):
        S3Http(endpoint_url="http://127.0.0.1:1", region="us-east-1", credentials=None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    chained = S3Http(endpoint_url="http://127.0.0.1:1", region="us-east-1", credentials=None)
    assert chained._credentials.get_frozen_credentials().access_key == "AKIDFROMENV"
    monkeypatch.setenv("PGSNAP_ONLY_KEY", "AKID")
    with pytest.raises(ConfigurationError, match="both an access key and its secret"):
        S3CopyTarget("b", endpoint_url="http://127.0.0.1:1", access_key_env="PGSNAP_ONLY_KEY")


def test_a_proxy_in_the_environment_is_used_unless_the_host_is_excluded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import urllib3

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example.com:3128")
    assert isinstance(client()._pool, urllib3.ProxyManager)
    monkeypatch.setenv("NO_PROXY", "s3.example.com")
    assert not isinstance(client()._pool, urllib3.ProxyManager)
