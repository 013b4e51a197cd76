"""Trees as tar streams (pgsnap.copies.tarstream) through the host's streams
(pgsnap.host.streams): what a copy reads and a restore writes on a host pgsnap
reaches through the Host seam. GNU tar on this machine plays the host's."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from pgsnap.copies import EntryKind, copy_trees
from pgsnap.copies.sources import TAR_CREATE, tar_entries
from pgsnap.copies.tarstream import TAR_EXTRACT, write_tree_tar
from pgsnap.errors import CommandError, CopyError, DamagedChunkError
from pgsnap.host import CommandResult, LocalRunner
from pgsnap.host.streams import StreamingRunner, reading, writing
from pgsnap.testing.memory_copies import MemoryCopyTarget

from .test_copies import CHUNK, make_tree, snapshot


class BufferedRunner:
    """A runner that cannot stream (as a test VM's console): output read whole."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self._local = LocalRunner()

    @property
    def description(self) -> str:
        return "buffered"

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        self.calls.append(tuple(argv))
        return self._local.run(argv, user=user, stdin=stdin, timeout=timeout)


@pytest.mark.parametrize("runner", [LocalRunner(), BufferedRunner()], ids=["stream", "buffered"])
def test_a_tree_read_as_tar_is_the_tree_and_written_back_is_the_same(
    tmp_path: Path, runner: object
) -> None:
    tree = make_tree(tmp_path / "tree")
    assert isinstance(runner, LocalRunner) == isinstance(runner, StreamingRunner)
    seen: dict[str, tuple[EntryKind, int, str]] = {}
    with reading(runner, [*TAR_CREATE, "-C", str(tree), "."]) as stream:  # type: ignore[arg-type]
        for e in tar_entries(stream, str(tree)):
            body = e.content.read() if e.content is not None else b""
            seen[e.rel] = (e.kind, e.size, hashlib.sha256(body).hexdigest())
    assert seen[""][0] is EntryKind.DIRECTORY
    assert seen["pg_wal"][0] is EntryKind.SYMLINK
    assert seen["global/pg_control"][1] == CHUNK * 3 + CHUNK // 2
    digest = hashlib.sha256((tree / "global" / "pg_control").read_bytes()).hexdigest()
    assert seen["global/pg_control"][2] == digest
    assert set(seen) == {str(p.relative_to(tree)) for p in tree.rglob("*")} | {""}

    target = MemoryCopyTarget()
    manifest, _stats = copy_trees(
        {"pgdata": tree}, target, copy_id="c1", backup_id="b1", chunk_size=CHUNK
    )
    dest = tmp_path / "restored"
    dest.mkdir()
    with writing(runner, [*TAR_EXTRACT, "-C", str(dest)]) as pipe:  # type: ignore[arg-type]
        written = write_tree_tar(manifest, target, "pgdata", pipe, parallel=2)
    assert written == sum(e.size for e in manifest.entries if e.kind is EntryKind.FILE)
    assert snapshot(dest) == snapshot(tree)


def test_a_damaged_chunk_stops_the_stream_and_the_tar_reading_it(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree")
    target = MemoryCopyTarget()
    manifest, _ = copy_trees(
        {"pgdata": tree}, target, copy_id="c1", backup_id="b1", chunk_size=CHUNK
    )
    big = next(e for e in manifest.entries if e.path == "global/pg_control")
    other = target.get_chunk(big.chunks[0])
    target.delete_chunk(big.chunks[1])
    target.put_chunk(big.chunks[1], other)  # the wrong content under its name
    dest = tmp_path / "restored"
    dest.mkdir()
    with (
        pytest.raises(DamagedChunkError),
        writing(LocalRunner(), [*TAR_EXTRACT, "-C", str(dest)]) as pipe,
    ):
        write_tree_tar(manifest, target, "pgdata", pipe)
    assert not (dest / "global" / "pg_control").exists() or (
        (dest / "global" / "pg_control").read_bytes()
        != (tree / "global" / "pg_control").read_bytes()
    )


def test_a_command_that_fails_is_a_command_error_with_its_stderr(tmp_path: Path) -> None:
    with (
        pytest.raises(CommandError, match="No such file"),
        reading(LocalRunner(), [*TAR_CREATE, "-C", str(tmp_path / "nope"), "."]) as stream,
    ):
        stream.read()
    with (
        pytest.raises(CommandError, match="No such file"),
        writing(LocalRunner(), [*TAR_EXTRACT, "-C", str(tmp_path / "nope")]) as pipe,
        tarfile.open(fileobj=pipe, mode="w|") as tf,
    ):
        tf.addfile(tarfile.TarInfo("f"), io.BytesIO(b""))


def test_a_stream_that_is_not_a_tar_is_a_copy_error(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"not a tar" * 100)
    with (
        pytest.raises(CopyError, match="did not come through as a tar"),
        reading(LocalRunner(), ["cat", str(tmp_path / "x")]) as stream,
    ):
        list(tar_entries(stream, "/x"))
