"""How a copy goes fast and stays in bounds: threads, one listing instead of a question
per chunk, a bandwidth limit, progress with a rate, and the S3 target's retries (a
fake client: which failures are tried again and which fail at once)."""

from __future__ import annotations

import datetime as dt
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from pgsnap.copies import CopyProgress, copy_trees, restore_trees
from pgsnap.copies.bandwidth import TokenBucket, parse_size
from pgsnap.copies.s3 import S3CopyTarget
from pgsnap.errors import ConfigurationError, CopyError, CopyNotFound, CopyTargetRefused
from pgsnap.testing.memory_copies import MemoryCopyTarget

from .test_copies import CHUNK, snapshot

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def make_files(root: Path, n: int, blocks: int = 3) -> Path:
    """``n`` files of ``blocks`` distinct chunks each."""
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"f{i}").write_bytes(os.urandom(CHUNK * blocks))
    return root


class Counting(MemoryCopyTarget):
    """Counts the requests, and the most chunk writes under way at once."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}
        self.in_flight = self.most_in_flight = 0
        self.gate = threading.Lock()
        self.barrier: threading.Barrier | None = None

    def _count(self, method: str) -> None:
        with self.gate:
            self.calls[method] = self.calls.get(method, 0) + 1

    def has_chunk(self, chunk: str) -> bool:
        self._count("has_chunk")
        return super().has_chunk(chunk)

    def put_chunk(self, chunk: str, data: bytes) -> bool:
        self._count("put_chunk")
        with self.gate:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=10)  # only if that many writes can be under way
            return super().put_chunk(chunk, data)
        finally:
            with self.gate:
                self.in_flight -= 1

    def chunk_ids(self) -> Any:
        self._count("chunk_ids")
        return super().chunk_ids()


def copy(tree: Path, target: Any, copy_id: str = "c1", **kwargs: Any) -> Any:
    return copy_trees(
        {"pgdata": tree},
        target,
        copy_id=copy_id,
        backup_id="b1",
        chunk_size=CHUNK,
        codec="zlib",
        clock=lambda: T0,
        **kwargs,
    )


def test_a_copy_lists_a_small_target_once_and_asks_about_no_chunk(tmp_path: Path) -> None:
    tree = make_files(tmp_path / "data", 4)
    target = Counting()
    manifest, stats = copy(tree, target)
    assert stats.chunks_new == 12 == len(manifest.chunk_ids())
    # One listing before and one after the manifest; no HEAD at all.
    assert target.calls == {"chunk_ids": 2, "put_chunk": 12}
    (tree / "f0").write_bytes(os.urandom(CHUNK) + (tree / "f0").read_bytes()[CHUNK:])
    target.calls.clear()
    _, again = copy(tree, target, "c2")
    assert (again.chunks_new, again.chunks_reused) == (1, 11)
    assert target.calls == {"chunk_ids": 2, "put_chunk": 1}


def test_a_target_too_large_to_list_is_asked_chunk_by_chunk(tmp_path: Path) -> None:
    """Listing 1000 keys costs a request: a target that holds far more chunks than a
    quarter of the copy's times 1000 is not listed through, and the chunks the part
    listed did not name are asked about."""
    tree = make_files(tmp_path / "data", 1)
    target = Counting()
    for n in range(1001):  # unrelated chunks, more than the copy's budget (1000 ids)
        target.put_chunk(f"{n:064x}", b"other")
    target.calls.clear()
    manifest, stats = copy(tree, target)
    assert stats.chunks_new == 3
    assert target.calls["has_chunk"] == 3 + 3  # before sending, then after the manifest
    restore_trees(manifest, target, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_uploads_run_in_parallel_and_no_more_than_asked(tmp_path: Path) -> None:
    tree = make_files(tmp_path / "data", 6)
    target = Counting()
    target.barrier = threading.Barrier(3)  # three writes must be under way together
    manifest, stats = copy(tree, target, parallel=3)
    assert target.most_in_flight == 3 and stats.chunks_new == 18
    target.barrier = None
    one = Counting()
    copy(tree, one, parallel=1)
    assert one.most_in_flight == 1
    restore_trees(manifest, target, {"pgdata": tmp_path / "restored"})
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_a_copy_holds_at_most_twice_parallel_chunks_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader waits while 2 * parallel chunks are read and not yet sent."""
    import pgsnap.copies.copier as copier

    tree = make_files(tmp_path / "data", 8)
    release = threading.Event()
    held = {"now": 0, "most": 0}
    lock = threading.Lock()
    real_send = copier._Sender.send
    real_work = copier._Sender._work

    def send(self: Any, block: bytes) -> Any:
        with lock:
            held["now"] += 1
            held["most"] = max(held["most"], held["now"])
            if held["now"] >= 5:  # the reader would now wait for a slot
                release.set()
        return real_send(self, block)

    def work(self: Any, block: bytes, check: bool) -> str:
        release.wait(10)  # no upload ends before the reader ran as far ahead as it may
        try:
            return real_work(self, block, check)
        finally:
            with lock:
                held["now"] -= 1

    monkeypatch.setattr(copier._Sender, "send", send)
    monkeypatch.setattr(copier._Sender, "_work", work)
    copy(tree, MemoryCopyTarget(), parallel=2)
    # 4 slots (2 * parallel) and the one the reader holds while it waits for a slot
    assert held["most"] == 5


def test_parallel_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="parallel must be a whole number"):
        copy_trees({}, MemoryCopyTarget(), copy_id="c1", backup_id="b1", parallel=0)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_token_bucket_lets_rate_bytes_a_second_through() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000, clock=clock, sleep=clock.sleep)
    assert bucket.take(1000) == 0  # the first second's worth: a burst
    assert bucket.take(500) == 0.5  # then the bytes wait for their time
    assert bucket.take(3000) == 3.0  # larger than the bucket: it goes, and waits
    clock.now += 10  # idle: the bucket refills, to one burst only
    assert bucket.take(1000) == 0 and bucket.take(1) == pytest.approx(0.001)
    assert sum(clock.slept) == pytest.approx(3.501)


def test_a_copy_with_a_bandwidth_limit_sends_at_that_rate(tmp_path: Path) -> None:
    """Threads share one bucket: the time slept is what the bytes sent need at the
    rate, whatever their order (on a fake clock: no time is measured)."""
    tree = make_files(tmp_path / "data", 4)
    clock = FakeClock()
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            clock.sleep(seconds)

    bucket = TokenBucket(10_000, burst=CHUNK, clock=clock, sleep=sleep)
    _, stats = copy(tree, MemoryCopyTarget(), parallel=3, limiter=bucket)
    assert stats.bytes_sent > 12 * CHUNK  # random data is stored as it is
    assert sum(clock.slept) == pytest.approx((stats.bytes_sent - CHUNK) / 10_000, rel=1e-6)
    with pytest.raises(ConfigurationError, match="above 0 bytes a second"):
        TokenBucket(0)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (52428800, 52428800),
        ("50MiB", 50 * 2**20),
        ("50 MiB/s", 50 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("800k", 800_000),
        ("64KiB", 65536),
        (2.5e6, 2_500_000),
    ],
)
def test_sizes_read_as_a_configuration_writes_them(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["fast", "10 parsecs", -1, 0, True, "", None])
def test_a_size_that_is_not_one_is_refused_with_what_to_write(bad: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_size(bad, "[copies] bandwidth_limit")
    assert "[copies] bandwidth_limit" in info.value.message and "50MiB" in (info.value.hint or "")


def test_progress_says_the_rate_and_the_time_left(tmp_path: Path) -> None:
    tree = make_files(tmp_path / "data", 3)
    seen: list[CopyProgress] = []
    copy(tree, MemoryCopyTarget(), on_progress=seen.append)
    assert [p.files_done for p in seen] == [1, 2, 3]
    last = seen[-1]
    assert last.bytes_read == last.bytes_total == 9 * CHUNK and last.seconds > 0
    assert last.rate == last.bytes_read / last.seconds and last.seconds_left == 0
    early = CopyProgress(1, 4, 100, 400, 10, 2.0)
    assert early.rate == 50 and early.seconds_left == 6
    assert CopyProgress(0, 4, 0, 400, 0, 0.0).seconds_left is None


# ---------------------------------------------------------------- the S3 target's retries


class ClientError(Exception):
    """As botocore's: a response with an error code and an HTTP status."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class SSLError(Exception):
    """Named as botocore's (the target tells transient exceptions by class name)."""


class EndpointConnectionError(Exception):
    pass


class Scripted:
    """A fake boto3 client: each call raises the next scripted failure, then answers."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def get_object(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)

        class Body:
            def read(self) -> bytes:
                return b"{}"

        return {"Body": Body()}


def scripted(*failures: Exception) -> tuple[S3CopyTarget, Scripted, list[float]]:
    client = Scripted(*failures)
    waits: list[float] = []
    target = S3CopyTarget("bucket", "p", client=client, attempts=5, sleep=waits.append)
    return target, client, waits


def test_transient_failures_are_tried_again_with_backoff() -> None:
    target, client, waits = scripted(
        ClientError("SlowDown", 503),
        ClientError("InternalError", 500),
        EndpointConnectionError("Could not connect to the endpoint URL"),
        SSLError("EOF occurred in violation of protocol"),
    )
    assert target.get_manifest("c1") == "{}"
    assert client.calls == 5 and len(waits) == 4
    target, client, waits = scripted(*[ClientError("ServiceUnavailable", 503)] * 5)
    with pytest.raises(CopyError, match=r"\(5 tries\)") as info:
        target.get_manifest("c1")
    assert not isinstance(info.value, CopyTargetRefused) and client.calls == 5


@pytest.mark.parametrize(
    ("failure", "kind", "message"),
    [
        (
            SSLError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
            CopyTargetRefused,
            "TLS certificate",
        ),
        (ClientError("AccessDenied", 403), CopyTargetRefused, "refused copy c1: AccessDenied"),
        (ClientError("NoSuchBucket", 404), CopyTargetRefused, "bucket bucket does not exist"),
        (ClientError("NoSuchKey", 404), CopyNotFound, "is not in the copy target"),
    ],
)
def test_what_no_retry_changes_fails_at_the_first_answer(
    failure: Exception, kind: type[CopyError], message: str
) -> None:
    target, client, waits = scripted(failure)
    with pytest.raises(kind, match=message) as info:
        target.get_manifest("c1")
    assert client.calls == 1 and waits == []
    assert info.value.hint


def test_a_restore_fetches_a_repeated_chunk_once(tmp_path: Path) -> None:
    """Runs of zero pages name one chunk many times: it is fetched once and kept until
    its last use (in a window of a few such chunks)."""
    tree = tmp_path / "data"
    tree.mkdir()
    zeros = bytes(CHUNK)
    (tree / "a").write_bytes(zeros * 5 + os.urandom(CHUNK))
    (tree / "b").write_bytes(os.urandom(CHUNK) + zeros * 3)
    target = Counting()
    manifest, stats = copy(tree, target)
    assert stats.chunks_new == 3 and stats.chunks_reused == 7  # zeros, two others
    fetched: list[str] = []
    real_get = target.get_chunk

    def get_chunk(chunk: str) -> bytes:
        fetched.append(chunk)
        return real_get(chunk)

    target.get_chunk = get_chunk  # type: ignore[method-assign]
    restore_trees(manifest, target, {"pgdata": tmp_path / "restored"}, parallel=2)
    assert sorted(fetched) == sorted(manifest.chunk_ids())  # each once
    assert snapshot(tmp_path / "restored") == snapshot(tree)


def test_a_copy_leaves_no_page_cache_behind_for_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every byte a copy reads from a local file is given back to the kernel
    (POSIX_FADV_DONTNEED) as it goes: the copy does not evict the host's cache."""
    tree = make_files(tmp_path / "data", 3)
    (tree / "tail").write_bytes(os.urandom(CHUNK + 100))
    told: dict[str, list[tuple[int, int]]] = {}
    real = os.posix_fadvise

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            told.setdefault(os.readlink(f"/proc/self/fd/{fd}"), []).append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    copy(tree, MemoryCopyTarget(), parallel=2)
    files = {str(p): p.stat().st_size for p in tree.iterdir()}
    assert set(told) == set(files)
    for path, ranges in told.items():
        ends = [0] + [o + n for o, n in ranges]
        assert [o for o, _n in ranges] == ends[:-1]  # in order, none left out
        assert ends[-1] == files[path]
