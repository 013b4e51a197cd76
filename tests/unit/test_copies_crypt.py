"""Copies encrypted with a key the user holds: the key file, keyed chunk ids, sealed
chunks and manifests, and copy, restore, verify and garbage collection with and
without the key (on the in-memory target)."""

from __future__ import annotations

import base64
import logging
import os
import pickle
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from pgsnap.copies import (
    CopyKey,
    Manifest,
    chunk_id,
    collect_garbage,
    copy_trees,
    decode_chunk,
    decode_manifest,
    encode_chunk,
    restore_trees,
    verify_copy,
)
from pgsnap.copies.keys import hkdf_sha256
from pgsnap.copies.manifest import is_sealed, sealed_fingerprint
from pgsnap.errors import (
    ConfigurationError,
    CopyError,
    CopyKeyError,
    DamagedChunkError,
    FormatError,
)
from pgsnap.testing.memory_copies import MemoryCopyTarget

from .test_copies import CHUNK, T0, make_tree, snapshot

SECRET = bytes(range(32))


@pytest.fixture
def key() -> CopyKey:
    return CopyKey(SECRET)


@pytest.fixture
def other() -> CopyKey:
    return CopyKey(bytes(range(1, 33)))


def copy(tree: Path, target: MemoryCopyTarget, copy_id: str, key: CopyKey | None) -> Manifest:
    manifest, _ = copy_trees(
        {"pgdata": tree},
        target,
        copy_id=copy_id,
        backup_id="b1",
        chunk_size=CHUNK,
        codec="zlib",
        files={"backup_label": "START WAL LOCATION: 0/2000028"},
        clock=lambda: T0,
        key=key,
    )
    return manifest


# ---------------------------------------------------------------------- the key


def test_hkdf_is_rfc_5869_as_cryptography_computes_it() -> None:
    for info, length in ((b"", 32), (b"pgsnap", 8), (b"x" * 40, 100)):
        ref = HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info)
        assert hkdf_sha256(SECRET, info, length) == ref.derive(SECRET)


def test_a_key_file_is_read_generated_and_refused_when_unsafe(tmp_path: Path) -> None:
    path = tmp_path / "copy.key"
    made = CopyKey.generate(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    text = path.read_text()
    assert len(text.strip()) == 64 and text.endswith("\n")
    read = CopyKey.from_file(path)
    assert read == made and read.fingerprint == made.fingerprint
    assert len(made.fingerprint) == 16 and made.fingerprint not in text
    with pytest.raises(ConfigurationError, match="never overwritten"):
        CopyKey.generate(path)
    assert CopyKey.from_file(path) == made  # not touched

    os.chmod(path, 0o640)
    with pytest.raises(ConfigurationError, match="may be read by others") as err:
        CopyKey.from_file(path)
    assert err.value.hint == f"chmod 600 {path}: a key that others can read protects nothing"
    os.chmod(path, 0o600)
    short = tmp_path / "short.key"
    short.write_text("ab" * 16 + "\n")
    os.chmod(short, 0o600)
    with pytest.raises(ConfigurationError, match="does not hold a copy key"):
        CopyKey.from_file(short)
    junk = tmp_path / "junk.key"
    junk.write_bytes(b"\xff" * 64)
    os.chmod(junk, 0o600)
    with pytest.raises(ConfigurationError, match="does not hold a copy key"):
        CopyKey.from_file(junk)
    with pytest.raises(ConfigurationError, match="does not exist"):
        CopyKey.from_file(tmp_path / "absent.key")
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(ConfigurationError, match="cannot be opened"):
        CopyKey.from_file(link)
    with pytest.raises(ConfigurationError, match="32 bytes"):
        CopyKey(b"short")


def test_a_key_never_shows_its_secret(key: CopyKey, tmp_path: Path) -> None:
    shown = f"{key!r} {key}"
    assert key.fingerprint in shown
    assert SECRET.hex() not in shown and "\\x00\\x01" not in shown
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(key)
    assert CopyKey(bytes(range(32))) == key and hash(CopyKey(SECRET)) == hash(key)


# ---------------------------------------------------------------------- chunks


def test_keyed_chunk_ids_and_sealed_chunks(key: CopyKey, other: CopyKey) -> None:
    data = b"relation page " * 300
    cid = chunk_id(data, key)
    assert cid != chunk_id(data) and cid != chunk_id(data, other)
    assert cid == key.chunk_id(data) and len(cid) == 64
    stored = encode_chunk(data, "zlib", key=key)
    assert stored[:5] == b"PGSE\x01" and data[:14] not in stored
    assert len(stored) < len(data)  # compressed before it was encrypted
    assert decode_chunk(stored, cid, key) == data
    # Another random nonce each time: the same chunk never looks the same twice.
    assert encode_chunk(data, "zlib", key=key) != stored

    with pytest.raises(DamagedChunkError, match="does not authenticate"):
        decode_chunk(stored, cid, other)
    flipped = bytearray(stored)
    flipped[20] ^= 1
    with pytest.raises(DamagedChunkError, match="does not authenticate"):
        decode_chunk(bytes(flipped), cid, key)
    # Sealed for another name (the associated data): does not open under this one.
    elsewhere = encode_chunk(data, "zlib", key=key, chunk="0" * 64)
    with pytest.raises(DamagedChunkError, match="does not authenticate"):
        decode_chunk(elsewhere, cid, key)
    # Plain where an encrypted chunk belongs, encrypted where no key is given.
    with pytest.raises(DamagedChunkError, match="is not encrypted"):
        decode_chunk(encode_chunk(data, "zlib"), cid, key)
    with pytest.raises(CopyKeyError, match="encrypted and no copy key"):
        decode_chunk(stored, cid)
    with pytest.raises(DamagedChunkError, match="encryption version"):
        decode_chunk(b"PGSE\x07" + stored[5:], cid, key)


# ---------------------------------------------------------------------- copies


def test_an_encrypted_copy_restores_and_hides_what_it_holds(tmp_path: Path, key: CopyKey) -> None:
    tree = make_tree(tmp_path / "data")
    target = MemoryCopyTarget()
    manifest = copy(tree, target, "c1", key)
    assert manifest.key_fingerprint == key.fingerprint
    text = target.get_manifest("c1")
    assert is_sealed(text) and sealed_fingerprint(text) == key.fingerprint
    for secret in ("pg_control", "PG_VERSION", "START WAL", '"backup_id"'):  # not base64
        assert secret not in text
    assert decode_manifest(text, "c1", key) == manifest
    # The catalog's digest is the plaintext JSON's, with or without a key.
    assert manifest.digest() == Manifest.from_json(manifest.to_json()).digest()
    # No object's name is the SHA-256 of its content.
    contents = [(tree / "global" / "pg_control").read_bytes()[i : i + CHUNK] for i in (0, CHUNK)]
    assert not {chunk_id(c) for c in contents} & set(target.chunk_ids())
    assert {chunk_id(c, key) for c in contents} <= set(target.chunk_ids())
    for cid in target.chunk_ids():
        assert target.get_chunk(cid)[:4] == b"PGSE"

    restore_trees(manifest, target, {"pgdata": tmp_path / "restored"}, key=key)
    assert snapshot(tmp_path / "restored") == snapshot(tree)
    assert verify_copy(target, "c1", key=key).ok


def test_copies_with_the_same_key_share_chunks_and_plain_ones_do_not(
    tmp_path: Path, key: CopyKey, other: CopyKey
) -> None:
    tree = make_tree(tmp_path / "data")
    target = MemoryCopyTarget()
    first = copy(tree, target, "c1", key)
    n = len(set(target.chunk_ids()))
    again, stats = copy_trees(
        {"pgdata": tree}, target, copy_id="c2", backup_id="b1", chunk_size=CHUNK, key=key
    )
    assert stats.chunks_new == 0 and again.chunk_ids() == first.chunk_ids()
    plain = copy(tree, target, "c3", None)
    mine = copy(tree, target, "c4", other)
    assert not plain.chunk_ids() & first.chunk_ids()
    assert not mine.chunk_ids() & first.chunk_ids()
    assert len(set(target.chunk_ids())) == n + len(plain.chunk_ids()) + len(mine.chunk_ids())
    # A plain copy reads with or without a key configured.
    assert decode_manifest(target.get_manifest("c3"), "c3", key) == plain
    restore_trees(plain, target, {"pgdata": tmp_path / "r3"}, key=key)
    assert snapshot(tmp_path / "r3") == snapshot(tree)


def test_an_encrypted_copy_refuses_no_key_and_the_wrong_key(
    tmp_path: Path, key: CopyKey, other: CopyKey
) -> None:
    tree = make_tree(tmp_path / "data")
    target = MemoryCopyTarget()
    manifest = copy(tree, target, "c1", key)
    text = target.get_manifest("c1")
    with pytest.raises(CopyKeyError) as err:
        decode_manifest(text, "c1")
    assert err.value.message == (
        f"copy c1 is encrypted with key {key.fingerprint}: give [copies] key_file"
    )
    assert err.value.fingerprint == key.fingerprint and err.value.copy_id == "c1"
    with pytest.raises(CopyKeyError, match=f"not with the key given \\({other.fingerprint}"):
        decode_manifest(text, "c1", other)
    with pytest.raises(CopyKeyError, match="give \\[copies\\] key_file"):
        verify_copy(target, "c1")
    for wrong in (None, other):
        with pytest.raises(CopyKeyError, match=f"encrypted with key {key.fingerprint}"):
            restore_trees(manifest, target, {"pgdata": tmp_path / "r"}, key=wrong)
        assert not (tmp_path / "r").exists()  # refused before anything was written


def test_a_tampered_manifest_or_chunk_is_found(tmp_path: Path, key: CopyKey) -> None:
    tree = make_tree(tmp_path / "data")
    target = MemoryCopyTarget()
    manifest = copy(tree, target, "c1", key)
    copy(tree, target, "c2", key)
    text = target.get_manifest("c1")
    prefix, body = text.rsplit(":", 1)
    raw = bytearray(base64.b64decode(body))
    raw[40] ^= 1
    with pytest.raises(FormatError, match="does not authenticate"):
        decode_manifest(f"{prefix}:{base64.b64encode(bytes(raw)).decode()}", "c1", key)
    # Copy c2's sealed manifest put under c1's name does not open.
    with pytest.raises(FormatError, match="does not authenticate"):
        decode_manifest(target.get_manifest("c2"), "c1", key)
    # A plain manifest that claims a key (a downgrade): refused.
    with pytest.raises(FormatError, match="not sealed"):
        decode_manifest(manifest.to_json(), "c1", key)
    with pytest.raises(FormatError, match="version"):
        decode_manifest(text.replace("manifest:1:", "manifest:9:"), "c1", key)

    victim = sorted(manifest.chunk_ids())[0]
    stored = bytearray(target.get_chunk(victim))
    stored[-1] ^= 1
    target.delete_chunk(victim)
    target.put_chunk(victim, bytes(stored))
    report = verify_copy(target, "c1", key=key)
    assert list(report.damaged) == [victim] and not report.missing
    with pytest.raises(DamagedChunkError, match="does not authenticate"):
        restore_trees(manifest, target, {"pgdata": tmp_path / "r"}, key=key)


def test_garbage_collection_needs_the_key_of_sealed_manifests(
    tmp_path: Path, key: CopyKey, other: CopyKey
) -> None:
    tree = make_tree(tmp_path / "data")
    target = MemoryCopyTarget()
    kept = copy(tree, target, "c1", key)
    (tree / "global" / "pg_control").write_bytes(os.urandom(CHUNK * 2))
    gone = copy(tree, target, "c2", key)
    target.delete_manifest("c2")
    before = set(target.chunk_ids())
    for wrong in (None, other):
        with pytest.raises(CopyKeyError, match="nothing removed") as err:
            collect_garbage(target, now=T0, key=wrong)
        assert isinstance(err.value, CopyError) and err.value.copy_id == "c1"
        assert set(target.chunk_ids()) == before
        assert target.marker_names() == ()  # its gc marker removed
    report = collect_garbage(target, now=T0, key=key)
    assert report.chunks_deleted == len(gone.chunk_ids() - kept.chunk_ids()) > 0
    restore_trees(kept, target, {"pgdata": tmp_path / "r"}, key=key)


def test_no_secret_in_errors_reprs_or_logs(
    tmp_path: Path, key: CopyKey, other: CopyKey, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "k"
    made = CopyKey.generate(path)
    secret = path.read_text().strip()
    target = MemoryCopyTarget()
    tree = make_tree(tmp_path / "data")
    copy(tree, target, "c1", made)
    texts = [repr(made), str(made), repr(target)]
    for wrong in (None, other):
        with pytest.raises(CopyError) as err:
            verify_copy(target, "c1", key=wrong)
        texts += [str(err.value), repr(err.value), repr(err.value.details)]
        with pytest.raises(CopyError) as err:
            collect_garbage(target, now=T0, key=wrong)
        texts += [str(err.value), repr(err.value.details)]
    texts += [r.getMessage() for r in caplog.records]
    joined = "\n".join(texts)
    assert made.fingerprint in joined
    assert secret not in joined and secret[:16] not in joined


# ---------------------------------------------------------------------- plumbing


def test_a_copy_plan_carries_the_key_files_path_and_never_the_key(tmp_path: Path) -> None:
    from pgsnap.plan import Plan
    from pgsnap.planner.copy import CopyRequest, plan_copy

    from .test_planner_copy import ACCESS, record

    path = tmp_path / "copy.key"
    CopyKey.generate(path)
    secret = path.read_text().strip()
    plan = plan_copy(record(), ACCESS, CopyRequest("b1", "/copies", key_file=str(path)))
    assert plan.steps[0].params["key_file"] == str(path)
    assert plan.summary["encrypted"] == f"with the copy key in {path}"
    assert Plan.from_json(plan.to_json()) == plan
    assert secret not in plan.to_json() and secret not in plan.explain()
    plain = plan_copy(record(), ACCESS, CopyRequest("b1", "/copies"))
    assert plain.steps[0].params["key_file"] == "" and "encrypted" not in plain.summary


def test_copies_key_file_is_a_path_relative_to_the_configuration(tmp_path: Path) -> None:
    import tomllib

    import pgsnap
    from pgsnap.config import cluster_arguments

    from .test_cli_unit import write_config

    conf = tomllib.loads(write_config(tmp_path).read_text())
    conf["copies"] = {"path": "copies", "key_file": "keys/copy.key"}
    args = cluster_arguments(conf, base=tmp_path)
    assert args["copy_key_file"] == str(tmp_path / "keys" / "copy.key")
    assert args["copy_target_options"] == {}  # not a target option
    cluster = pgsnap.Cluster.from_config(conf, base=tmp_path)
    assert cluster.copy_key_file == str(tmp_path / "keys" / "copy.key")
    del conf["copies"]["key_file"]
    assert cluster_arguments(conf, base=tmp_path)["copy_key_file"] is None


def test_pgsnap_copy_key_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pgsnap.cli import main

    path = tmp_path / "copy.key"
    assert main(["copy-key", "generate", str(path)]) == 0
    out, _ = capsys.readouterr()
    key = CopyKey.from_file(path)
    assert f"fingerprint {key.fingerprint}" in out and path.read_text().strip() not in out
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert main(["copy-key", "generate", str(path)]) == 2
    _, err = capsys.readouterr()
    assert "never overwritten" in err and CopyKey.from_file(path) == key
