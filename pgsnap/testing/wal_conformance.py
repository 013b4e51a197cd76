"""The WAL archive conformance suite: what "implements :class:`~pgsnap.protocols.WalArchive`" means.

Every archive, pgsnap's and third parties' (an object store, say), runs it.
Subclass :class:`WalArchiveConformance` in a test module (the name must start
with ``Test``), and provide three fixtures:

- ``archive``: a fresh, empty archive for each test (clean up after it: a
  fixture can ``yield`` it);
- ``put_file``: a function ``(name, data) -> None`` that stores ``data`` as
  the file ``name`` in that archive, as its ``archive_command`` would (the
  protocol is read-only: this is the test's way in). ``data`` is the stored
  bytes: for ``name.gz`` they are gzip-compressed;
- ``unreadable_archive``: an archive of the same kind that cannot be listed or
  read (a directory that does not exist, a bucket that refuses the caller).

Class attributes say what the archive does: ``compressions``, the suffixes
:meth:`~pgsnap.protocols.WalArchive.open` decompresses (default gzip, bzip2
and xz); ``restorable_compressions``, the compressed segments its
``restore_command`` fetches, which ``list_names(segment_size)`` counts as WAL
a recovery can use; ``deletes``, whether it is a
:class:`~pgsnap.protocols.WalArchiveDeletion`.

Example::

    import pytest
    from pgsnap.testing.wal_conformance import WalArchiveConformance
    from acme_pgsnap import BucketWalArchive

    class TestBucketArchive(WalArchiveConformance):
        restorable_compressions = frozenset({"gz"})

        @pytest.fixture
        def archive(self, bucket):
            return BucketWalArchive(bucket, prefix="wal/")

        @pytest.fixture
        def put_file(self, bucket):
            return lambda name, data: bucket.put_object(f"wal/{name}", data)

        @pytest.fixture
        def unreadable_archive(self):
            return BucketWalArchive("no-such-bucket", prefix="wal/")

The suite checks the listing (sorted, without names starting with ``.`` or
ending in ``.tmp``), ``exists``/``stat``/``open`` of plain and compressed
segments, ``.history`` and ``.backup`` files, ``index`` and ``histories``,
that the ``restore_command`` really copies a file when run with ``sh -c``
(``%f`` and ``%p`` substituted as PostgreSQL does), missing files, names with
a directory part, damaged compressed data, an unreadable archive, and that
pgsnap's WAL reader, header checks and segment-size helper work through the
archive. Every failure is checked to be a :class:`~pgsnap.errors.PgsnapError`
of the right class that survives pickling.

This module imports pytest; nothing in :mod:`pgsnap` imports it.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import pickle
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Final, NoReturn, TypeVar

import pytest

from pgsnap.errors import ArchiveError, PgsnapError, WalNameError
from pgsnap.model import LSN
from pgsnap.protocols import WalArchive, WalArchiveDeletion
from pgsnap.wal import (
    PAGE_MAGIC,
    ArchivedFile,
    TimelineSpan,
    archived_segment_problem,
    archived_segment_size,
    find_segment,
    read_archived_segment_header,
    segment_name,
)
from pgsnap.wal.reader import EndOfWal, ScanEnd, SegmentRead, StopReason, read_wal

__all__ = [
    "COMPRESSORS",
    "SEGMENT_SIZE",
    "SYSTEM_IDENTIFIER",
    "WAL_ARCHIVE_METHODS",
    "PutFile",
    "WalArchiveConformance",
    "segment_bytes",
]

PutFile = Callable[[str, bytes], None]
"""``put_file(name, data)``: store ``data`` (the bytes as stored) as the file ``name``."""

WAL_ARCHIVE_METHODS: Final = (
    "list_names",
    "exists",
    "stat",
    "open",
    "read_text",
    "index",
    "histories",
    "restore_command",
)
"""The methods every :class:`~pgsnap.protocols.WalArchive` defines (and ``location``)."""

SEGMENT_SIZE: Final = 1024 * 1024
"""The segment size of the suite's segments (1 MiB, ``initdb --wal-segsize=1``)."""

SYSTEM_IDENTIFIER: Final = 7_300_000_000_000_000_001
"""The system identifier in the suite's segment headers."""

COMPRESSORS: Final[dict[str, Callable[[bytes], bytes]]] = {
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
}
"""How the suite compresses a file it stores as ``name.<suffix>``."""

_HISTORY: Final = "1\t0/3000000\tno recovery target specified\n"
_BACKUP: Final = (
    "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\n"
    "STOP WAL LOCATION: 0/2000100 (file 000000010000000000000002)\n"
    "CHECKPOINT LOCATION: 0/2000060\n"
    "BACKUP METHOD: streamed\n"
    "BACKUP FROM: primary\n"
    "START TIME: 2026-01-01 00:00:00 UTC\n"
    "LABEL: conformance\n"
    "START TIMELINE: 1\n"
    "STOP TIME: 2026-01-01 00:00:01 UTC\n"
    "STOP TIMELINE: 1\n"
)
_E = TypeVar("_E", bound=PgsnapError)


def segment_bytes(
    timeline: int,
    segno: int,
    *,
    segment_size: int = SEGMENT_SIZE,
    system_identifier: int = SYSTEM_IDENTIFIER,
    major: int = 16,
) -> bytes:
    """A segment of ``segment_size`` bytes that begins with a valid long page header
    (of PostgreSQL ``major``, for segment ``segno`` of ``timeline``) and holds no
    record: a reader opens it, checks its header, and finds the end of the WAL
    right after it."""
    head = struct.pack(
        "<HHIQI4xQII",
        PAGE_MAGIC[major],
        0x0002,  # XLP_LONG_HEADER
        timeline,
        segno * segment_size,
        0,
        system_identifier,
        segment_size,
        8192,
    )
    return head + bytes(segment_size - len(head))


def _fail_missing(fixture: str) -> NoReturn:
    pytest.fail(
        f"the WAL archive conformance test class must define the {fixture!r} fixture "
        "(see pgsnap.testing.wal_conformance)",
        pytrace=False,
    )


def _raises(expected: type[_E], call: Callable[..., object], *args: Any) -> _E:
    """Call and return the error, failing unless it is an ``expected`` pgsnap error."""
    label = f"{getattr(call, '__name__', call)}{args!r}"
    try:
        result = call(*args)
    except PgsnapError as exc:
        if not isinstance(exc, expected):
            pytest.fail(
                f"{label} raised {type(exc).__name__} ({exc}), expected {expected.__name__}"
            )
        _check_pickles(exc, label)
        return exc
    except Exception as exc:
        pytest.fail(
            f"{label} leaked {type(exc).__module__}.{type(exc).__name__}: {exc} "
            f"(an archive raises pgsnap errors only; expected {expected.__name__})"
        )
    pytest.fail(f"{label} did not raise (returned {result!r}); expected {expected.__name__}")


def _check_pickles(err: PgsnapError, label: str) -> None:
    copy = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes
    if type(copy) is not type(err) or str(copy) != str(err) or copy.details != err.details:
        pytest.fail(f"{label}: {type(err).__name__} does not survive pickling")


def _read_all(archive: WalArchive, name: str) -> bytes:
    """The whole content of ``name`` through ``open``, read in chunks."""
    stream = archive.open(name)
    try:
        parts = []
        while chunk := stream.read(65536):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        stream.close()


def _restore(command: str, name: str, target: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as PostgreSQL runs a ``restore_command``: ``%f``, ``%p`` and
    ``%%`` substituted, through ``sh -c``."""
    out, i = [], 0
    while i < len(command):
        c = command[i]
        if c == "%" and i + 1 < len(command):
            nxt = command[i + 1]
            out.append({"f": name, "p": str(target), "%": "%"}.get(nxt, c + nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return subprocess.run(
        ["sh", "-c", "".join(out)], capture_output=True, text=True, timeout=60, check=False
    )


class WalArchiveConformance:
    """Tests every :class:`~pgsnap.protocols.WalArchive` must pass.

    Subclass it as ``Test...`` and override the fixtures :meth:`archive`,
    :meth:`put_file` and :meth:`unreadable_archive`; set the class attributes
    when the archive differs from the defaults.
    """

    compressions: ClassVar[frozenset[str]] = frozenset({"gz", "bz2", "xz"})
    """The compression suffixes ``open`` decompresses."""
    restorable_compressions: ClassVar[frozenset[str]] = frozenset({"gz", "bz2", "xz"})
    """The compressed segments the ``restore_command`` fetches (and ``list_names``
    with a segment size counts)."""
    deletes: ClassVar[bool] = True
    """Whether the archive is a :class:`~pgsnap.protocols.WalArchiveDeletion`."""
    plain_names_only: ClassVar[bool] = False
    """The archive keeps each file under its own name only: it compresses inside its
    objects (no ``.gz`` copies to list or find), and its writes are atomic (no
    ``.tmp`` or ``.*`` files to leave out). Its ``put_file`` is given plain names
    only, and replaces a file that is there (the test's way to rewrite one);
    ``compressions`` and ``restorable_compressions`` are then empty."""

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture
    def archive(self) -> WalArchive:
        """A fresh, empty archive for one test (override this)."""
        _fail_missing("archive")

    @pytest.fixture
    def put_file(self, archive: WalArchive) -> PutFile:
        """A function storing a file in ``archive`` (override this)."""
        _fail_missing("put_file")

    @pytest.fixture
    def unreadable_archive(self) -> WalArchive:
        """An archive of the same kind that cannot be listed or read (override this)."""
        _fail_missing("unreadable_archive")

    # ------------------------------------------------------------------ shape

    def test_has_every_method(self, archive: WalArchive) -> None:
        """The protocol's methods are there, ``location`` is a non-empty string, and
        ``deletes`` says whether it can delete."""
        for method in WAL_ARCHIVE_METHODS:
            assert callable(getattr(archive, method, None)), f"no {method}()"
        assert isinstance(archive.location, str) and archive.location
        assert isinstance(archive, WalArchiveDeletion) is self.deletes, (
            f"{type(self).__name__}.deletes is {self.deletes}, but the archive "
            f"{'is' if not self.deletes else 'is not'} a WalArchiveDeletion"
        )

    def test_empty_archive(self, archive: WalArchive) -> None:
        """A new archive holds nothing: no names, no file, an empty index, timeline 1."""
        name = segment_name(1, 1, SEGMENT_SIZE)
        assert archive.list_names() == ()
        assert archive.list_names(SEGMENT_SIZE) == ()
        assert archive.exists(name) is False
        assert archive.stat(name) is None
        index = archive.index(SEGMENT_SIZE)
        assert index.segment_ranges == () and index.history_names == ()
        assert archive.histories().timelines() == (1,)

    # ------------------------------------------------------------------ listing

    def test_listing_is_sorted_and_leaves_out_files_being_written(
        self, archive: WalArchive, put_file: PutFile
    ) -> None:
        """``list_names`` is sorted and leaves out ``.*`` and ``*.tmp`` (copies being
        written, renamed into place when complete)."""
        visible = [
            segment_name(1, 3, SEGMENT_SIZE),
            "00000002.history",
            segment_name(1, 1, SEGMENT_SIZE),
            f"{segment_name(1, 2, SEGMENT_SIZE)}" + ("" if self.plain_names_only else ".gz"),
        ]
        hidden = (
            []
            if self.plain_names_only
            else [
                f".{segment_name(1, 4, SEGMENT_SIZE)}",
                f"{segment_name(1, 5, SEGMENT_SIZE)}.tmp",
                ".00000003.history.tmp",
            ]
        )
        for name in [*visible, *hidden]:
            put_file(name, b"x")
        names = archive.list_names()
        assert isinstance(names, tuple)
        assert names == tuple(sorted(visible))

    def test_listing_for_recovery_keeps_what_a_recovery_can_use(
        self, archive: WalArchive, put_file: PutFile
    ) -> None:
        """With a segment size, a plain segment of another size is left out (unless
        ``check_sizes=False``), and a compressed one unless the restore_command
        fetches it; history and backup files stay."""
        good = segment_name(1, 1, SEGMENT_SIZE)
        short = segment_name(1, 2, SEGMENT_SIZE)
        put_file(good, segment_bytes(1, 1))
        put_file(short, segment_bytes(1, 2)[:8192])
        packed = {}
        for n, comp in enumerate(sorted(self.compressions), start=3):
            packed[comp] = f"{segment_name(1, n, SEGMENT_SIZE)}.{comp}"
            put_file(packed[comp], COMPRESSORS[comp](segment_bytes(1, n)))
        put_file("00000002.history", _HISTORY.encode())
        listed = set(archive.list_names(SEGMENT_SIZE))
        assert {good, "00000002.history"} <= listed
        assert short not in listed
        assert short in archive.list_names(SEGMENT_SIZE, check_sizes=False)
        for comp, name in packed.items():
            assert (name in listed) is (comp in self.restorable_compressions), name
        index = archive.index(SEGMENT_SIZE)
        assert short in index.unknown_names
        assert index.ranges(1)[0].first == 1

    # ------------------------------------------------------------------ files

    def test_stat_and_open_a_plain_segment(self, archive: WalArchive, put_file: PutFile) -> None:
        """``stat`` gives the stored file (name, size, mtime_ns, compression None,
        content_size = size, a location); ``open`` gives its bytes; a rewrite of
        another size has another identity."""
        name = segment_name(1, 7, SEGMENT_SIZE)
        data = segment_bytes(1, 7)
        put_file(name, data)
        found = archive.stat(name)
        assert isinstance(found, ArchivedFile)
        assert found.name == name and found.size == len(data)
        assert isinstance(found.mtime_ns, int) and found.mtime_ns > 0
        assert found.compression is None and found.content_size == len(data)
        assert isinstance(found.location, str) and found.location
        assert archive.exists(name)
        assert _read_all(archive, name) == data
        stream = archive.open(name)
        try:
            assert stream.read(40) == data[:40]
        finally:
            stream.close()
        put_file(name, data[:4096])
        again = archive.stat(name)
        assert again is not None and again.identity != found.identity

    def test_compressed_segments(self, archive: WalArchive, put_file: PutFile) -> None:
        """A compressed copy is stored under its own name: ``stat`` is exact (the plain
        name finds nothing), ``exists`` and ``find_segment`` find it, ``open``
        decompresses it, and gzip's ``content_size`` (when given) is the content's."""
        for n, comp in enumerate(sorted(self.compressions), start=1):
            plain = segment_name(1, n, SEGMENT_SIZE)
            data = segment_bytes(1, n)
            put_file(f"{plain}.{comp}", COMPRESSORS[comp](data))
            assert archive.stat(plain) is None
            assert archive.exists(plain)
            found = archive.stat(f"{plain}.{comp}")
            assert found is not None and found.compression == comp
            assert found.content_size in (None, len(data))
            located = find_segment(archive, plain)
            assert located is not None and located.name == f"{plain}.{comp}"
            assert _read_all(archive, f"{plain}.{comp}") == data
        # A plain copy wins over a compressed one (an archive of plain names only
        # has the plain one alone).
        both = segment_name(2, 1, SEGMENT_SIZE)
        if not self.plain_names_only:
            put_file(f"{both}.gz", gzip.compress(segment_bytes(2, 1)))
        put_file(both, segment_bytes(2, 1))
        located = find_segment(archive, both)
        assert located is not None and located.name == both
        assert _read_all(archive, both) == segment_bytes(2, 1)

    def test_damaged_compressed_data(self, archive: WalArchive, put_file: PutFile) -> None:
        """A compressed file that does not decompress is an ArchiveError (from ``open``
        or from reading the stream), never a codec's own exception. (An archive of
        plain names only checks its own objects: its tests damage them.)"""
        if self.plain_names_only:
            assert not self.compressions and not self.restorable_compressions
            return
        name = f"{segment_name(1, 1, SEGMENT_SIZE)}.gz"
        put_file(name, gzip.compress(segment_bytes(1, 1))[:2000] + b"\0garbage" * 100)
        _raises(ArchiveError, _read_all, archive, name)

    def test_history_and_backup_files(self, archive: WalArchive, put_file: PutFile) -> None:
        """``.history`` and ``.backup`` files are read as text (a gzip-compressed history
        too), and ``histories`` parses them."""
        backup = "000000010000000000000002.00000028.backup"
        third = "00000003.history" + ("" if self.plain_names_only else ".gz")
        put_file("00000002.history", _HISTORY.encode())
        text3 = f"{_HISTORY}2\t0/5000000\tbefore x\n".encode()
        put_file(third, text3 if self.plain_names_only else gzip.compress(text3))
        put_file(backup, _BACKUP.encode())
        assert archive.read_text("00000002.history") == _HISTORY
        assert archive.read_text(backup) == _BACKUP
        assert archive.read_text(third).startswith(_HISTORY)
        assert archive.exists("00000003.history")
        assert _read_all(archive, backup) == _BACKUP.encode()
        graph = archive.histories()
        assert graph.timelines() == (1, 2, 3)
        assert graph.history(3).parents == (1, 2)
        index = archive.index(SEGMENT_SIZE)
        assert index.history_names == ("00000002.history", third)
        assert index.backup_names == (backup,)
        assert archive.histories(index.history_names).timelines() == graph.timelines()

    def test_index_of_segments(self, archive: WalArchive, put_file: PutFile) -> None:
        """``index`` finds the runs of segments per timeline (names only with
        ``check_sizes=False``)."""
        for segno in (1, 2, 3, 5):
            put_file(segment_name(1, segno, SEGMENT_SIZE), segment_bytes(1, segno))
        put_file(segment_name(2, 5, SEGMENT_SIZE), segment_bytes(2, 5))
        for check_sizes in (True, False):
            index = archive.index(SEGMENT_SIZE, check_sizes=check_sizes)
            assert index.timelines() == (1, 2)
            assert [(r.first, r.last) for r in index.ranges(1)] == [(1, 3), (5, 5)]
            assert [(r.first, r.last) for r in index.ranges(2)] == [(5, 5)]

    def test_missing_files(self, archive: WalArchive, put_file: PutFile) -> None:
        """A missing file: ``stat`` None, ``exists`` False, ``open`` and ``read_text``
        an ArchiveError with a hint."""
        put_file(segment_name(1, 1, SEGMENT_SIZE), segment_bytes(1, 1))
        missing = segment_name(1, 9, SEGMENT_SIZE)
        assert archive.stat(missing) is None
        assert archive.exists(missing) is False
        assert find_segment(archive, missing) is None
        for call in (archive.open, archive.read_text):
            err = _raises(ArchiveError, call, missing)
            assert err.hint, f"{call.__name__}({missing!r}) gave no hint"
        _raises(ArchiveError, archive.read_text, "00000009.history")
        _raises(ArchiveError, read_archived_segment_header, archive, missing)

    def test_names_with_a_directory_part_are_refused(self, archive: WalArchive) -> None:
        """A name that is not a plain file name is a WalNameError, whatever the call."""
        for bad in ("../00000002.history", "a/b", "", ".."):
            for call in (archive.stat, archive.open, archive.read_text, archive.exists):
                _raises(WalNameError, call, bad)

    def test_unreadable_archive(self, unreadable_archive: WalArchive) -> None:
        """An archive that cannot be read says so with an ArchiveError and a hint when
        listed, indexed or read; ``stat`` and ``exists`` answer "nothing" or raise
        ArchiveError."""
        name = segment_name(1, 1, SEGMENT_SIZE)
        for call, args in (
            (unreadable_archive.list_names, ()),
            (unreadable_archive.index, (SEGMENT_SIZE,)),
            (unreadable_archive.histories, ()),
        ):
            err = _raises(ArchiveError, call, *args)
            assert err.hint, f"{call.__name__} gave no hint"
        _raises(ArchiveError, unreadable_archive.open, name)
        _raises(ArchiveError, unreadable_archive.read_text, "00000002.history")
        with contextlib.suppress(ArchiveError):
            assert unreadable_archive.stat(name) is None
        with contextlib.suppress(ArchiveError):
            assert unreadable_archive.exists(name) is False

    # ------------------------------------------------------------------ recovery

    def test_restore_command_copies_files(
        self, archive: WalArchive, put_file: PutFile, tmp_path: Path
    ) -> None:
        """The restore_command, run by ``sh -c`` with ``%f``/``%p`` substituted, writes
        the file's content to ``%p`` (a compressed segment it fetches decompressed),
        and exits non-zero for a file the archive does not hold."""
        files = {
            segment_name(1, 1, SEGMENT_SIZE): segment_bytes(1, 1),
            "00000002.history": _HISTORY.encode(),
        }
        for name, data in files.items():
            put_file(name, data)
        for n, comp in enumerate(sorted(self.restorable_compressions), start=2):
            data = segment_bytes(1, n)
            put_file(f"{segment_name(1, n, SEGMENT_SIZE)}.{comp}", COMPRESSORS[comp](data))
            files[segment_name(1, n, SEGMENT_SIZE)] = data
        command = archive.restore_command()
        assert isinstance(command, str) and "\n" not in command
        target_dir = tmp_path / "restored pg_wal %x"  # a space and a % in %p
        target_dir.mkdir()
        for name, data in files.items():
            target = target_dir / "RECOVERYXLOG"
            done = _restore(command, name, target)
            assert done.returncode == 0, f"{name}: {done.stderr}"
            assert target.read_bytes() == data, name
            target.unlink()
        gone = _restore(command, segment_name(1, 99, SEGMENT_SIZE), target_dir / "RECOVERYXLOG")
        assert gone.returncode != 0
        assert not (target_dir / "RECOVERYXLOG").exists() or not os.path.getsize(
            target_dir / "RECOVERYXLOG"
        )

    # ------------------------------------------------------------------ pgsnap through it

    def test_wal_reader_reads_through_the_archive(
        self, archive: WalArchive, put_file: PutFile
    ) -> None:
        """pgsnap's WAL reader opens segments through ``stat``/``open`` (a compressed
        one too), and finds where the WAL ends."""
        put_file(segment_name(1, 1, SEGMENT_SIZE), segment_bytes(1, 1))
        start = LSN(SEGMENT_SIZE)
        items = list(
            read_wal([archive], [TimelineSpan(1, None, None)], start, LSN(3 * SEGMENT_SIZE))
        )
        reads = [i for i in items if isinstance(i, SegmentRead)]
        assert [r.name for r in reads] == [segment_name(1, 1, SEGMENT_SIZE)]
        assert reads[0].system_identifier == SYSTEM_IDENTIFIER
        assert reads[0].file is not None and reads[0].file.name == reads[0].name
        assert reads[0].source == 0
        end = items[-1]
        assert isinstance(end, ScanEnd) and end.reason is StopReason.END_OF_WAL
        assert isinstance(end.end_of_wal, EndOfWal)
        if "gz" in self.compressions:
            other = segment_name(3, 4, SEGMENT_SIZE)
            put_file(f"{other}.gz", gzip.compress(segment_bytes(3, 4)))
            items = list(
                read_wal(
                    [archive],
                    [TimelineSpan(3, None, None)],
                    LSN(4 * SEGMENT_SIZE),
                    LSN(5 * SEGMENT_SIZE),
                    segment_size=SEGMENT_SIZE,
                )
            )
            reads = [i for i in items if isinstance(i, SegmentRead)]
            assert [r.file.name for r in reads if r.file] == [f"{other}.gz"]

    def test_segment_checks_through_the_archive(
        self, archive: WalArchive, put_file: PutFile
    ) -> None:
        """Headers, damaged-segment checks and the segment size work through the
        archive: a good segment passes, a truncated copy and another cluster's do
        not."""
        good, short, foreign = (segment_name(1, n, SEGMENT_SIZE) for n in (1, 2, 3))
        put_file(good, segment_bytes(1, 1))
        put_file(short, segment_bytes(1, 2)[: SEGMENT_SIZE // 2])
        put_file(foreign, segment_bytes(1, 3, system_identifier=SYSTEM_IDENTIFIER + 1))
        assert archived_segment_size(archive) == SEGMENT_SIZE
        header = read_archived_segment_header(archive, good)
        assert header.system_identifier == SYSTEM_IDENTIFIER
        assert header.segment_size == SEGMENT_SIZE

        def problem(name: str) -> str | None:
            found = find_segment(archive, name)
            assert found is not None, name
            return archived_segment_problem(
                archive,
                found,
                segment_size=SEGMENT_SIZE,
                system_identifier=SYSTEM_IDENTIFIER,
                major=16,
            )

        assert problem(good) is None
        assert "bytes" in (problem(short) or "")
        assert "another cluster" in (problem(foreign) or "")

    def test_delete(self, archive: WalArchive, put_file: PutFile) -> None:
        """An archive that deletes removes the files and their compressed copies, and
        skips names it does not hold."""
        if not self.deletes:
            assert not isinstance(archive, WalArchiveDeletion)
            return
        assert isinstance(archive, WalArchiveDeletion)
        one, two = segment_name(1, 1, SEGMENT_SIZE), segment_name(1, 2, SEGMENT_SIZE)
        put_file(one, segment_bytes(1, 1))
        if not self.plain_names_only:
            put_file(f"{one}.gz", gzip.compress(segment_bytes(1, 1)))
        put_file(two, segment_bytes(1, 2))
        removed = archive.delete([one, segment_name(1, 9, SEGMENT_SIZE)])
        assert removed == (1 if self.plain_names_only else 2)
        assert archive.list_names() == (two,)
