"""The S3 copy target against a real S3 server (SeaweedFS on local ports), and the
directory target beside it: one contract, two targets."""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.copies import (
    CopyTarget,
    DirectoryCopyTarget,
    GcReport,
    chunk_id,
    collect_garbage,
    copy_trees,
    decode_chunk,
    encode_chunk,
    open_target,
    restore_trees,
    verify_copy,
)
from pgsnap.copies.markers import GC_MARKER, MIN_STALE_AFTER, Marker
from pgsnap.copies.s3 import S3CopyTarget
from pgsnap.errors import ConfigurationError, CopyBusy, CopyError, CopyNotFound, CopyTargetRefused
from pgsnap.stores.s3http import S3Http
from pgsnap.testing.seaweed import SeaweedS3, seaweed_unavailable, self_signed_cert

from ..unit.test_copies import CHUNK, make_tree, snapshot
from .test_copies_real import recovered_from_copy

STALE = MIN_STALE_AFTER


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.skip(f"no SeaweedFS S3 server on this machine: {reason}")
    base = tmp_path_factory.mktemp("seaweed")
    # HTTPS beside HTTP, with a private CA: the TLS test shares this server.
    with SeaweedS3.start(base, tls=self_signed_cert(base / "tls")) as server:
        server.create_bucket("pgsnap-copies")
        yield server


@pytest.fixture(params=["directory", "s3", "s3-boto3"])
def target(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> CopyTarget:
    """The directory target; the S3 target with its own client (S3Http), and with a
    boto3 client given to it (both must keep the contract)."""
    if request.param == "directory":
        return DirectoryCopyTarget(tmp_path / "target")
    server: SeaweedS3 = request.getfixturevalue("s3")
    prefix = f"t-{request.node.name.replace('[', '-').rstrip(']')}"
    if request.param == "s3-boto3":
        return S3CopyTarget(
            "pgsnap-copies", prefix, endpoint_url=server.endpoint, client=server.client()
        )
    monkeypatch.setenv("PGSNAP_TEST_S3_ADMIN_KEY", server.admin.access_key)
    monkeypatch.setenv("PGSNAP_TEST_S3_ADMIN_SECRET", server.admin.secret_key)
    return S3CopyTarget(
        "pgsnap-copies",
        prefix,
        endpoint_url=server.endpoint,
        access_key_env="PGSNAP_TEST_S3_ADMIN_KEY",
        secret_key_env="PGSNAP_TEST_S3_ADMIN_SECRET",
    )


def test_chunks_and_manifests_follow_the_contract(target: CopyTarget) -> None:
    data = b"chunk " * 100
    cid = chunk_id(data)
    assert not target.has_chunk(cid)
    assert target.put_chunk(cid, encode_chunk(data, "zlib")) is True
    assert target.put_chunk(cid, b"ignored") is False  # immutable once written
    assert decode_chunk(target.get_chunk(cid), cid) == data
    assert list(target.chunk_ids()) == [cid]
    target.put_manifest("c1", "{}")
    target.put_manifest("c1", '{"again": 1}')  # replaced whole
    assert target.get_manifest("c1") == '{"again": 1}'
    assert target.manifest_ids() == ("c1",)
    target.delete_manifest("c1")
    target.delete_chunk(cid)
    target.delete_chunk(cid)  # absent: nothing to do
    assert target.manifest_ids() == () and list(target.chunk_ids()) == []
    with pytest.raises(CopyNotFound):
        target.get_chunk(cid)
    with pytest.raises(CopyNotFound):
        target.get_manifest("c1")
    with pytest.raises(ConfigurationError):
        target.put_manifest("../escape", "{}")


def test_a_copy_round_trips_through_the_target(target: CopyTarget, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "data")
    manifest, stats = copy_trees(
        {"pgdata": tree}, target, copy_id="c1", backup_id="b1", chunk_size=CHUNK
    )
    assert stats.chunks_new == len(manifest.chunk_ids())
    _again, second = copy_trees(
        {"pgdata": tree}, target, copy_id="c2", backup_id="b1", chunk_size=CHUNK
    )
    assert second.chunks_new == 0 and second.bytes_sent == 0  # nothing changed
    assert verify_copy(target, "c1").ok
    restore_trees(manifest, target, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_what_the_s3_server_refuses_is_said_and_no_secret_is(
    s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = S3CopyTarget("no-such-bucket", endpoint_url=s3.endpoint, client=s3.client())
    with pytest.raises(CopyTargetRefused, match="does not exist"):
        missing.get_manifest("c1")
    monkeypatch.setenv("PGSNAP_TEST_S3_KEY", s3.reader.access_key)
    monkeypatch.setenv("PGSNAP_TEST_S3_SECRET", s3.reader.secret_key)
    reader = S3CopyTarget(
        "pgsnap-copies",
        "read-only",
        endpoint_url=s3.endpoint,
        access_key_env="PGSNAP_TEST_S3_KEY",
        secret_key_env="PGSNAP_TEST_S3_SECRET",
    )
    with pytest.raises(CopyTargetRefused, match="refused") as refused:
        copy_trees({"pgdata": make_tree(tmp_path / "d")}, reader, copy_id="c1", backup_id="b1")
    assert reader.manifest_ids() == ()  # it may list, not write
    for text in (repr(reader), reader.location, str(refused.value), refused.value.hint or ""):
        assert s3.reader.secret_key not in text and s3.admin.secret_key not in text
    monkeypatch.delenv("PGSNAP_TEST_S3_SECRET")
    with pytest.raises(ConfigurationError, match="PGSNAP_TEST_S3_SECRET is not set"):
        S3CopyTarget(
            "pgsnap-copies",
            endpoint_url=s3.endpoint,
            access_key_env="PGSNAP_TEST_S3_KEY",
            secret_key_env="PGSNAP_TEST_S3_SECRET",
        )
    with pytest.raises(ConfigurationError, match="bucket name"):
        S3CopyTarget("a/b", client=object())


def test_credentials_from_a_file_the_owner_alone_reads(s3: SeaweedS3, tmp_path: Path) -> None:
    """``credentials_file``: the keys from a file (AWS shared-credentials lines); one
    others can read, or without both keys, is refused without showing a key."""
    creds = tmp_path / "s3.credentials"
    creds.write_text(
        "# pgsnap's copy target\n[default]\n"
        f"aws_access_key_id = {s3.admin.access_key}\n"
        f"aws_secret_access_key = {s3.admin.secret_key}\n"
        "[other]\naws_access_key_id = nope\n"
    )
    creds.chmod(0o600)
    options = {"endpoint_url": s3.endpoint, "credentials_file": str(creds)}
    store = open_target("s3://pgsnap-copies/from-file", options)
    copy_trees({"pgdata": make_tree(tmp_path / "d")}, store, copy_id="c1", backup_id="b1")
    assert store.manifest_ids() == ("c1",)
    creds.chmod(0o644)
    with pytest.raises(ConfigurationError, match="can be read by others") as loose:
        open_target("s3://pgsnap-copies/from-file", options)
    creds.chmod(0o600)
    creds.write_text(f"aws_access_key_id = {s3.admin.access_key}\n")
    with pytest.raises(ConfigurationError, match="does not hold both") as half:
        open_target("s3://pgsnap-copies/from-file", options)
    for err in (loose.value, half.value):
        assert s3.admin.secret_key not in str(err) and s3.admin.access_key not in str(err)


@pytest.mark.parametrize("kind", ["s3http", "boto3"])
def test_a_server_that_is_gone_is_a_copy_error_naming_it(tmp_path: Path, kind: str) -> None:
    """A server that went away: tried again (a refused connection is transient),
    then a CopyError that names the endpoint and the tries."""
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.skip(reason)
    waits: list[float] = []
    with SeaweedS3.start(tmp_path / "s3") as server:
        server.create_bucket("gone-later")
        target: Any = S3CopyTarget(
            "gone-later",
            endpoint_url=server.endpoint,
            client=own_client(server) if kind == "s3http" else server.client(attempts=1),
            attempts=3,
            sleep=waits.append,
        )
        target.put_manifest("c1", "{}")
    with pytest.raises(CopyError, match="failed on the copy target") as info:
        target.get_manifest("c1")
    assert server.endpoint in str(info.value) and "(3 tries)" in str(info.value)
    assert len(waits) == 2


def test_the_s3_target_speaks_https_with_a_private_ca(s3: SeaweedS3, tmp_path: Path) -> None:
    """Over HTTPS with a self-signed certificate: ``ca_bundle`` names it and the copy
    round trips; without it the certificate is refused, with a CopyError."""
    cert = s3.base / "tls" / "cert.pem"  # the fixture's private CA
    assert s3.https_endpoint is not None
    s3.create_bucket("tls")
    env = {
        "PGSNAP_TLS_KEY": s3.admin.access_key,
        "PGSNAP_TLS_SECRET": s3.admin.secret_key,
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        keys: dict[str, Any] = {
            "access_key_env": "PGSNAP_TLS_KEY",
            "secret_key_env": "PGSNAP_TLS_SECRET",
        }
        trusted = S3CopyTarget("tls", "c", endpoint_url=s3.https_endpoint, ca_bundle=cert, **keys)
        tree = make_tree(tmp_path / "data")
        manifest, _stats = copy_trees(
            {"pgdata": tree}, trusted, copy_id="c1", backup_id="b1", chunk_size=CHUNK
        )
        restore_trees(manifest, trusted, {"pgdata": tmp_path / "restored"})
        assert snapshot(tmp_path / "restored") == snapshot(tree)
        untrusted = S3CopyTarget("tls", "c", endpoint_url=s3.https_endpoint, **keys)
        sent: list[str] = []
        real = untrusted.store._client._request

        def counted(operation: str, *args: Any, **kwargs: Any) -> Any:
            sent.append(operation)
            return real(operation, *args, **kwargs)

        mp.setattr(untrusted.store._client, "_request", counted)
        with pytest.raises(CopyTargetRefused, match="SSL") as refused:  # certificate verify failed
            untrusted.get_manifest("c1")
        assert len(sent) == 1  # at once: no retry changes a certificate
        assert "ca_bundle" in (refused.value.hint or "")


@pytest.mark.postgres
def test_a_cluster_copied_to_s3_recovers_from_there_alone(
    s3: SeaweedS3, pg_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 end to end over S3: a backup of real PostgreSQL copied to the bucket
    with keys read from the environment, every snapshot deleted, the copy restored
    from S3 into an empty data directory and replayed to a restore point."""
    from pgsnap.testing.sandbox import mock_cluster

    monkeypatch.setenv("PGSNAP_S3_KEY", s3.admin.access_key)
    monkeypatch.setenv("PGSNAP_S3_SECRET", s3.admin.secret_key)
    options: dict[str, Any] = {
        "endpoint_url": s3.endpoint,
        "access_key_env": "PGSNAP_S3_KEY",
        "secret_key_env": "PGSNAP_S3_SECRET",
    }
    server = pg_server()
    server.start()
    cluster = mock_cluster(
        server, copy_target="s3://pgsnap-copies/cluster", copy_target_options=options
    )
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t SELECT 1 FROM generate_series(1, 500)")
    record = cluster.backup("to-s3")
    server.sql("INSERT INTO t VALUES (2)")
    server.sql("SELECT pg_create_restore_point('after2')")
    server.sql("INSERT INTO t VALUES (3)")
    server.switch_wal_and_wait_archived()
    copy = cluster.copy(record.id)
    assert copy.target == "s3://pgsnap-copies/cluster" and copy.chunks_new > 0
    plan_text = cluster.plan_copy(record.id).explain()
    assert s3.admin.secret_key not in plan_text  # only the variables' names travel
    assert cluster.verify_copy(copy.copy_id).ok
    assert record.snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    server.stop(mode="immediate")

    store = S3CopyTarget("pgsnap-copies", "cluster", **options)
    restored = recovered_from_copy(pg_server, store, copy.copy_id, server.archive_dir, "after2")
    assert [r[0] for r in restored.sql("SELECT DISTINCT batch FROM t ORDER BY 1")] == [1, 2]


def test_a_copy_cut_short_by_the_server_dying_resumes_and_reuses_what_was_sent(
    tmp_path: Path,
) -> None:
    """The S3 server dies in the middle of a copy: the copy fails with a CopyError and
    leaves no manifest; with the server back (same data, new ports) the same copy runs
    again, sends only what is missing, and restores."""
    reason = seaweed_unavailable()
    if reason is not None:
        pytest.skip(reason)
    tree = make_tree(tmp_path / "data")
    for n in range(6):  # more chunks, so that some are sent before the server dies
        (tree / f"extra-{n}").write_bytes(bytes([n]) * CHUNK * 2)
    store = tmp_path / "s3"

    class DyingServer(S3CopyTarget):
        """Kills the server once two chunks are written (the copy's threads may
        have more under way: those fail, or land before it dies)."""

        puts = 0
        lock = threading.Lock()

        def put_chunk(self, chunk: str, data: bytes) -> bool:
            written = super().put_chunk(chunk, data)
            with DyingServer.lock:
                DyingServer.puts += 1
                if DyingServer.puts == 2:
                    first.stop()
            return written

    first = SeaweedS3.start(store)
    first.create_bucket("resumed")
    dying = DyingServer("resumed", "c", endpoint_url=first.endpoint, client=own_client(first))
    with pytest.raises(CopyError, match="failed on the copy target"):
        copy_trees({"pgdata": tree}, dying, copy_id="c1", backup_id="b1", chunk_size=CHUNK)

    with SeaweedS3.start(store) as again:
        target = S3CopyTarget("resumed", "c", endpoint_url=again.endpoint, client=own_client(again))
        assert target.manifest_ids() == ()  # never a manifest for a cut-short copy
        sent_before = len(list(target.chunk_ids()))
        assert sent_before >= 2, again.log_tail()
        manifest, stats = copy_trees(
            {"pgdata": tree}, target, copy_id="c1", backup_id="b1", chunk_size=CHUNK
        )
        # Only what the dead server had not stored is sent (chunk references that
        # repeat within the copy count as reused too).
        assert stats.chunks_new == len(manifest.chunk_ids()) - sent_before
        restore_trees(manifest, target, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_markers_follow_the_contract_and_one_of_racing_creators_wins(target: CopyTarget) -> None:
    """create_marker is one conditional PUT in S3, os.link in a directory: of eight
    writers racing for one marker, exactly one creates it."""
    assert target.marker_names() == ()
    with pytest.raises(CopyNotFound):
        target.get_marker("gc")
    assert target.create_marker("pending.c1", "one") is True
    assert target.create_marker("pending.c1", "two") is False
    assert target.get_marker("pending.c1") == "one"
    target.put_marker("pending.c1", "three")
    assert target.get_marker("pending.c1") == "three"
    results: list[tuple[bool, int]] = []
    start = threading.Barrier(8)

    def create(n: int) -> None:
        start.wait()
        results.append((target.create_marker("gc", f"writer {n}"), n))

    threads = [threading.Thread(target=create, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for created, n in results if created]
    assert len(results) == 8 and len(winners) == 1
    assert target.get_marker("gc") == f"writer {winners[0]}"
    assert target.marker_names() == ("gc", "pending.c1")
    target.delete_marker("gc")
    target.delete_marker("gc")  # absent: nothing to do
    assert target.marker_names() == ("pending.c1",)
    with pytest.raises(ConfigurationError):
        target.put_marker("../escape", "{}")


def test_garbage_collection_removes_only_what_no_copy_needs(
    target: CopyTarget, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "data")
    first, _ = copy_trees({"pgdata": tree}, target, copy_id="c1", backup_id="b1", chunk_size=CHUNK)
    (tree / "PG_VERSION").write_bytes(b"16\n")
    second, _ = copy_trees({"pgdata": tree}, target, copy_id="c2", backup_id="b1", chunk_size=CHUNK)
    assert target.marker_names() == ()  # the copies removed their markers
    target.delete_manifest("c1")
    dry = collect_garbage(target, dry_run=True)
    assert dry.chunks_deleted == len(first.chunk_ids() - second.chunk_ids()) == 1
    report = collect_garbage(target)
    assert report.chunks_deleted == 1 and set(target.chunk_ids()) == second.chunk_ids()
    assert target.marker_names() == ()
    restore_trees(second, target, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_a_copy_in_progress_and_a_running_collection_keep_each_other_out(
    target: CopyTarget, tmp_path: Path
) -> None:
    tree = make_tree(tmp_path / "data")
    now = dt.datetime.now(dt.UTC)
    target.put_marker(GC_MARKER, Marker.new(GC_MARKER, now, stale_after=STALE).to_json())
    with pytest.raises(CopyBusy, match="garbage collection is running"):
        copy_trees({"pgdata": tree}, target, copy_id="c1", backup_id="b1", chunk_size=CHUNK)
    assert target.marker_names() == ("gc",) and target.manifest_ids() == ()
    with pytest.raises(CopyBusy, match="another garbage collection is running"):
        collect_garbage(target)
    target.delete_marker(GC_MARKER)
    target.put_chunk("ab" * 32, b"orphan")
    target.put_marker("pending.c9", Marker.new("pending.c9", now, copy_id="c9").to_json())
    with pytest.raises(CopyBusy, match="copy c9"):
        collect_garbage(target)
    assert target.marker_names() == ("pending.c9",) and list(target.chunk_ids()) == ["ab" * 32]
    later = now + 2 * STALE  # c9 died
    report = collect_garbage(target, now=later, stale_after=STALE)
    assert report.pending == ("pending.c9",) and report.chunks_deleted == 1


def test_two_collections_at_once_one_runs_and_the_other_refuses(target: CopyTarget) -> None:
    for n in range(20):
        target.put_chunk(f"{n:02x}" * 32, b"orphan")
    start = threading.Barrier(2)
    outcomes: list[object] = []

    def collect() -> None:
        start.wait()
        try:
            outcomes.append(collect_garbage(target))
        except CopyBusy as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=collect) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reports = [o for o in outcomes if isinstance(o, GcReport)]
    # Both may run one after the other (the first ended before the second began);
    # never both at once: then one is refused.
    assert len(reports) >= 1 and sum(r.chunks_deleted for r in reports) == 20
    for o in outcomes:
        if isinstance(o, CopyBusy):
            assert "another garbage collection is running" in str(o)
    assert list(target.chunk_ids()) == [] and target.marker_names() == ()


def test_copy_retention_expires_a_copy_in_s3_and_collects_its_chunks(
    s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 §2 on the real S3 server: ``[copies.retention]`` keeps the newest copy;
    the older one's manifest goes, then its record, then the chunks only it named;
    the copy kept still verifies. Keys come from the environment, and no plan holds
    them."""
    import pgsnap

    from ..unit.test_cli_unit import write_config
    from .test_copy_retention_cli import backed_up

    monkeypatch.setenv("PGSNAP_S3_KEY", s3.admin.access_key)
    monkeypatch.setenv("PGSNAP_S3_SECRET", s3.admin.secret_key)
    config = write_config(tmp_path)
    with config.open("a") as f:
        f.write(
            '\n[copies]\npath = "s3://pgsnap-copies/retention"\n'
            f'endpoint_url = "{s3.endpoint}"\n'
            'access_key_env = "PGSNAP_S3_KEY"\nsecret_key_env = "PGSNAP_S3_SECRET"\n'
            "\n[copies.retention]\nredundancy = 1\n"
        )
    cluster = pgsnap.Cluster.from_config(config)
    old, new = (backed_up(cluster, tmp_path / "data", n, days_ago=2 - n) for n in range(2))
    first, second = cluster.copy(old.id), cluster.copy(new.id)
    store = S3CopyTarget("pgsnap-copies", "retention", endpoint_url=s3.endpoint, client=s3.client())
    from pgsnap.copies import Manifest

    own = Manifest.from_json(store.get_manifest(first.copy_id)).chunk_ids() - set(
        Manifest.from_json(store.get_manifest(second.copy_id)).chunk_ids()
    )
    plan = cluster.plan_copy_expiry()
    assert s3.admin.secret_key not in plan.to_json()
    assert [s.id for s in plan.steps] == [
        f"expire-manifest-{first.copy_id}",
        f"forget-copy-{first.copy_id}",
        "collect-garbage",
    ]
    cluster.execute(plan)
    assert store.manifest_ids() == (second.copy_id,)
    assert own and not own & set(store.chunk_ids())
    assert cluster.catalog.get(old.id).copies == ()
    assert cluster.verify_copy(second.copy_id).ok
    assert cluster.collect_copy_garbage(dry_run=True).chunks_deleted == 0


def own_client(server: SeaweedS3) -> S3Http:
    """pgsnap's own S3 client on ``server``, with the admin's keys."""
    return S3Http(
        endpoint_url=server.endpoint,
        region="us-east-1",
        credentials=(server.admin.access_key, server.admin.secret_key),
    )


@pytest.mark.parametrize("kind", ["s3http", "boto3"])
def test_large_objects_go_up_in_parts_and_a_failed_upload_is_aborted(
    s3: SeaweedS3, kind: str
) -> None:
    """Above ``multipart_threshold`` a chunk or manifest is a multipart upload (here
    5 MiB parts): it reads back whole, a chunk that exists is not written twice, and
    an upload that fails half-way is aborted (no parts left in the bucket); with
    pgsnap's own client and with a boto3 one."""
    from pgsnap.copies.s3 import MIN_PART_SIZE

    def inner() -> Any:
        return own_client(s3) if kind == "s3http" else s3.client()

    def parts_target(client: Any) -> S3CopyTarget:
        return S3CopyTarget(
            "pgsnap-copies",
            f"multipart-{kind}",
            endpoint_url=s3.endpoint,
            client=client,
            multipart_threshold=MIN_PART_SIZE,
            part_size=MIN_PART_SIZE,
        )

    class Counting:
        """The server's client, counting calls (and failing a part when told)."""

        def __init__(self, inner: Any, fail_part: int | None = None) -> None:
            self.inner, self.fail_part = inner, fail_part
            self.calls: list[str] = []

        def __getattr__(self, name: str) -> Any:
            def call(**kwargs: Any) -> Any:
                self.calls.append(name)
                if name == "upload_part" and kwargs["PartNumber"] == self.fail_part:
                    raise OSError("the network went away")
                return getattr(self.inner, name)(**kwargs)

            return call

    data = os.urandom(2 * MIN_PART_SIZE + 1000)
    cid = chunk_id(data)
    client = Counting(inner())
    target = parts_target(client)
    assert target.put_chunk(cid, encode_chunk(data, "none")) is True
    assert client.calls.count("upload_part") == 3 and "put_object" not in client.calls
    assert decode_chunk(target.get_chunk(cid), cid) == data
    assert target.put_chunk(cid, encode_chunk(data, "none")) is False  # If-None-Match on completion
    text = '{"entries": "' + "x" * (MIN_PART_SIZE + 10) + '"}'
    target.put_manifest("big", text)
    assert target.get_manifest("big") == text
    failing = Counting(inner(), fail_part=2)
    with pytest.raises(CopyError, match=r"part 2\) failed"):
        parts_target(failing).put_manifest("broken", text + " ")
    assert "abort_multipart_upload" in failing.calls
    uploads = s3.client().list_multipart_uploads(
        Bucket="pgsnap-copies", Prefix=f"multipart-{kind}/"
    )
    assert uploads.get("Uploads", []) == []
    with pytest.raises(CopyNotFound):
        target.get_manifest("broken")


def test_a_port_taken_before_weed_binds_it_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test servers' ports are found free, then bound by ``weed``: another server
    can take one in between (a CI run lost a whole module of tests to "bind: address
    already in use"). Such a start is tried again on other ports."""
    import socket

    from pgsnap.testing import seaweed

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    drawn: list[int] = []
    free = seaweed._free_port

    def first_one_taken() -> int:
        drawn.append(held.getsockname()[1] if not drawn else free())
        return drawn[-1]

    monkeypatch.setattr(seaweed, "_free_port", first_one_taken)
    try:
        with SeaweedS3.start(tmp_path / "weed") as server:
            assert server.client().list_buckets()["Buckets"] == []
    finally:
        held.close()
    # Eight ports, then eight others; on a busy machine (the other xdist workers start
    # servers of their own) the second eight may lose a race too, and a third are drawn
    # (a CI run met that).
    assert len(drawn) in (16, 24)
    held_port = drawn[0]
    assert held_port not in drawn[8:]  # the taken port is never drawn again
    assert "bind: address already in use" in (tmp_path / "weed" / "weed.log").read_text()
