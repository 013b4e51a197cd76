"""Read-only views of WAL archives other tools keep in an object store.

barman-cloud (:mod:`pgsnap.archives.barman`) and WAL-G (:mod:`pgsnap.archives.walg`)
each keep one object per WAL file, under a key of their own layout, compressed by
the tool and named with the compression's suffix. :class:`ToolWalArchive` is the
:class:`~pgsnap.protocols.WalArchive` over such an archive: the layout (where the
WAL is, how a key names a file) is its subclass's, the rest is here. It never
writes: no method puts or deletes an object, and it is no
:class:`~pgsnap.protocols.WalArchiveDeletion` (each tool expires its own archive).

**Names.** :meth:`~ToolWalArchive.list_names` gives PostgreSQL's own names
(``000000010000000000000003``, ``00000002.history``, ``....backup``,
``....partial``): the compression is the object's, as in pgsnap's own archive.
When one file is stored twice (under two compressions, or compressed and plain),
the object the tool's own restore command would fetch is the one read: the
subclass's :attr:`~ToolWalArchive.preference`. Keys that name no WAL file (a
tool's metadata, temporary files of a write under way) are left out.

**Sizes.** :meth:`~ToolWalArchive.stat` gives the content's length, as a plain
segment's, so that the WAL reader and the segment checks judge it as they judge a
plain file. It costs at most the listing of the file's own keys and, for a
compressed object, one small ranged read where the format records the length:

- plain: the object's size;
- gzip: its ISIZE trailer (the last 4 bytes; the length modulo 2**32, exact for
  a WAL file);
- lz4 and zstd frames whose header records the content's size (barman-cloud's lz4
  does: ``lz4.frame.compress`` stores it);
- an object of at most :data:`SMALL_OBJECT` bytes: read whole and decompressed.

Otherwise (WAL-G's lz4 and zstd, barman-cloud's zstd, bzip2, xz, snappy: streamed
formats that do not record it) the length is *claimed*: the object's first bytes
are decompressed (one ranged read, more only for a first block larger than it)
and its first page's long header gives the segment size it says it has;
``content_size`` is then None (not known without reading everything), and a
copy that turns out shorter when read is reported by the reader as truncated. An
object whose first page is not a segment's is read whole and counted. Lengths
are remembered by key and ETag. ``list_names(segment_size)`` with
``check_sizes`` judges what is known at that cost without claiming (one ranged
read per compressed segment at most; a length not recorded is not judged).

**Reading.** :meth:`~ToolWalArchive.open` streams the object in ranged reads
(:data:`SMALL_OBJECT` bytes first, then :data:`READ_CHUNK`) through the codec of
its suffix (gzip, bzip2, xz and lzma with the standard library; lz4, zstd,
brotli and snappy with the ``lz4``, ``zstandard``, ``brotli`` and
``python-snappy`` modules when installed: without one, reading such an object is
refused, saying which module to install).
Damaged data is an :class:`~pgsnap.errors.ArchiveError` from ``read``.
"""

from __future__ import annotations

import bz2
import collections
import importlib
import io
import logging
import lzma
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Final, Protocol

import attrs

from pgsnap._attrs import frozen
from pgsnap.archives.store import etag_version
from pgsnap.errors import ArchiveError, ArchiveUnavailable
from pgsnap.stores import DirectoryStore, ObjectStore, StoredObject
from pgsnap.wal.archive import read_histories
from pgsnap.wal.continuity import ArchiveIndex
from pgsnap.wal.files import ArchivedFile, ReadStream, check_file_name
from pgsnap.wal.names import VALID_SEGMENT_SIZES, WalFileKind, parse_archive_name
from pgsnap.wal.reader import PAGE_MAGIC
from pgsnap.wal.timelines import TimelineGraph

__all__ = [
    "CODEC_MODULES",
    "MAX_TEXT_SIZE",
    "READ_CHUNK",
    "SMALL_OBJECT",
    "StoredFile",
    "ToolWalArchive",
    "decompress_bytes",
    "recorded_length",
]

log = logging.getLogger(__name__)

READ_CHUNK: Final = 1024 * 1024
"""Bytes of an object read per request while it is streamed."""
SMALL_OBJECT: Final = 64 * 1024
"""An object of at most this many bytes is read whole to tell its content's length."""
MAX_TEXT_SIZE: Final = 1024 * 1024
"""The largest ``.history`` or ``.backup`` file :meth:`ToolWalArchive.read_text` reads."""
_LENGTH_CACHE: Final = 65536
"""Content lengths remembered (by key and ETag)."""
_LONG_HEADER: Final = struct.Struct("<HHIQI4xQII")
"""XLogLongPageHeaderData: magic, info, timeline, pageaddr, rem_len, (pad), system
identifier, segment size, block size (40 bytes)."""
_XLP_LONG_HEADER: Final = 0x0002
_MAGICS: Final = frozenset(PAGE_MAGIC.values())

CODEC_MODULES: Final = {
    "lz4": "lz4",
    "zst": "zstandard",
    "br": "brotli",
    "snappy": "python-snappy",
}
"""The PyPI package each codec outside the standard library needs (suffix: package)."""
_NO_CODEC: Final = {
    "lzo": "pgsnap has no lzo decompressor (WAL-E's format, read by WAL-G builds with lzo)",
}


class _Decoder(Protocol):
    """A streaming decompressor: ``feed`` compressed bytes, get what they decode to;
    ``finish`` checks that the data ended where the format ends (else ValueError)."""

    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class _Identity:
    """No compression."""

    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


class _Framed:
    """A decompressor object with ``decompress``, ``eof`` and ``unused_data`` (zlib,
    bz2, lzma, lz4.frame, zstandard), one after another for concatenated members or
    frames (as their command-line tools read them)."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._d = factory()
        self._started = False

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._d.eof:
                self._d = self._factory()
            self._started = True
            out.append(self._d.decompress(data))
            data = self._d.unused_data if self._d.eof else b""
        return b"".join(out)

    def finish(self) -> bytes:
        if not self._d.eof:
            raise ValueError("the compressed data ends before its end mark (truncated)")
        return b""


class _Brotli:
    """brotli (``brotli.Decompressor``: no end-of-stream attribute but ``is_finished``)."""

    def __init__(self, module: Any) -> None:
        self._d = module.Decompressor()

    def feed(self, data: bytes) -> bytes:
        return bytes(self._d.process(data))

    def finish(self) -> bytes:
        if not self._d.is_finished():
            raise ValueError("the brotli stream ends before its end (truncated)")
        return b""


class _Snappy:
    """snappy's framing format (python-snappy's ``stream_compress``, as barman-cloud
    writes it)."""

    def __init__(self, module: Any) -> None:
        self._d = module.StreamDecompressor()

    def feed(self, data: bytes) -> bytes:
        return bytes(self._d.decompress(data))

    def finish(self) -> bytes:
        self._d.flush()  # raises when a chunk is incomplete
        return b""


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _decoder(compression: str, name: str, where: str) -> _Decoder:
    """The decoder of ``compression`` (a key's suffix, "" for none); ``ArchiveError``
    when pgsnap cannot decompress it here."""
    if compression == "":
        return _Identity()
    if compression == "gz":
        return _Framed(lambda: zlib.decompressobj(16 + zlib.MAX_WBITS))
    if compression == "bz2":
        return _Framed(bz2.BZ2Decompressor)
    if compression == "xz":
        return _Framed(lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ))
    if compression == "lzma":
        return _Framed(lambda: lzma.LZMADecompressor(lzma.FORMAT_ALONE))
    module = {"lz4": "lz4.frame", "zst": "zstandard", "br": "brotli", "snappy": "snappy"}.get(
        compression
    )
    loaded = _module(module) if module else None
    if loaded is not None:
        if compression == "lz4":
            return _Framed(loaded.LZ4FrameDecompressor)
        if compression == "zst":
            return _Framed(lambda: loaded.ZstdDecompressor().decompressobj())
        if compression == "br":
            return _Brotli(loaded)
        return _Snappy(loaded)
    if compression in CODEC_MODULES:
        package = CODEC_MODULES[compression]
        raise ArchiveError(
            f"cannot decompress {name} in {where}: it is {compression}-compressed and the "
            f"{package} Python module is not installed",
            hint=f"pip install {package} (into pgsnap's Python); the tool's own restore "
            "command reads it during recoveries",
            name=name,
            path=where,
            compression=compression,
        )
    raise ArchiveError(
        f"cannot decompress {name} in {where}: "
        + _NO_CODEC.get(compression, f"pgsnap does not know the compression {compression!r}"),
        hint="listing the archive needs no codec; the tool's own restore command reads the "
        "file during recoveries",
        name=name,
        path=where,
        compression=compression,
    )


def decompress_bytes(compression: str, data: bytes, *, name: str, where: str) -> bytes:
    """``data`` (a whole object) decompressed by its key's suffix; ``ArchiveError`` for
    a codec pgsnap lacks or damaged data."""
    decoder = _decoder(compression, name, where)
    try:
        return decoder.feed(data) + decoder.finish()
    except Exception as exc:
        raise _damaged(name, where, compression, exc) from exc


def _damaged(name: str, where: str, compression: str, exc: BaseException) -> ArchiveError:
    return ArchiveError(
        f"{name} in {where} is not valid {compression} data: {exc}",
        hint="the object is damaged, or not what its suffix says (an archive encrypted by "
        "the tool is read by the tool only)",
        name=name,
        path=where,
        reason=str(exc),
    )


def recorded_length(compression: str, head: bytes) -> int | None:
    """The content's length an lz4 or zstd frame header records (``head``: the object's
    first bytes), None when it records none (or the data is not such a frame).

    lz4 frame format (lz4's ``doc/lz4_Frame_format.md``): magic ``04 22 4D 18``, FLG
    (bit 3: a content size follows BD), BD, then the size (8 bytes, little-endian).
    zstd (RFC 8878 §3.1.1.1): the frame header's Frame_Content_Size, when present."""
    if compression == "lz4":
        if len(head) >= 14 and head[:4] == b"\x04\x22\x4d\x18" and head[4] & 0x08:
            return int.from_bytes(head[6:14], "little")
        return None
    if compression == "zst":
        if len(head) < 6 or head[:4] != b"\x28\xb5\x2f\xfd":
            return None
        fhd = head[4]
        single = bool(fhd & 0x20)
        pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 0x03]
        size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        if size == 0 or len(head) < pos + size:
            return None
        value = int.from_bytes(head[pos : pos + size], "little")
        return value + 256 if size == 2 else value
    return None


def _claimed_segment_size(first: bytes) -> int | None:
    """The segment size a WAL segment's first page says (its long header), None when
    ``first`` does not begin with one."""
    if len(first) < _LONG_HEADER.size:
        return None
    magic, info, _tli, _addr, _rem, _sysid, seg_size, _blck = _LONG_HEADER.unpack_from(first)
    if magic in _MAGICS and info & _XLP_LONG_HEADER and seg_size in VALID_SEGMENT_SIZES:
        return int(seg_size)
    return None


class _DecodedStream(io.RawIOBase):
    """An object's content: compressed chunks in, decompressed bytes out (memory: one
    chunk and what it decodes to)."""

    def __init__(
        self, chunks: Iterator[bytes], decoder: _Decoder, fail: Callable[[BaseException], Exception]
    ) -> None:
        self._chunks = chunks
        self._decoder = decoder
        self._fail = fail
        self._buffer = b""
        self._pos = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def _more(self) -> bool:
        """Decode the next chunk into the buffer; False at the end."""
        while not self._done:
            try:
                chunk = next(self._chunks, None)
                if chunk is None:
                    self._done = True
                    data = self._decoder.finish()
                else:
                    data = self._decoder.feed(chunk)
            except ArchiveError:
                self._done = True
                raise
            except Exception as exc:
                self._done = True
                raise self._fail(exc) from exc
            if data:
                self._buffer, self._pos = data, 0
                return True
        return False

    def read(self, size: int | None = -1, /) -> bytes:
        want = -1 if size is None else size
        out: list[bytes] = []
        have = 0
        while want < 0 or have < want:
            if self._pos >= len(self._buffer) and not self._more():
                break
            end = len(self._buffer) if want < 0 else min(len(self._buffer), self._pos + want - have)
            piece = self._buffer[self._pos : end]
            self._pos = end
            out.append(piece)
            have += len(piece)
        return b"".join(out)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._chunks = iter(())
        self._buffer = b""
        super().close()


@frozen
class StoredFile:
    """One WAL file as a tool stores it: PostgreSQL's ``name``, the object's ``key``
    (relative to the store), its ``compression`` (the key's suffix, "" for none)
    and the object as listed."""

    name: str
    key: str
    compression: str
    object: StoredObject


class ToolWalArchive:
    """A read-only :class:`~pgsnap.protocols.WalArchive` over another tool's archive
    in ``store`` (see the module docstring). Subclasses give the layout:
    :attr:`tool`, :attr:`preference`, :meth:`wal_prefix`, :meth:`file_key` and
    :meth:`parse_key`.

    ``restore_command``: the ``restore_command`` recoveries are given (None:
    :meth:`restore_command` refuses, with ``restore_hint`` as its hint).
    """

    tool: ClassVar[str] = ""
    """The tool's name, for messages."""
    preference: ClassVar[tuple[str, ...]] = ("",)
    """Compression suffixes ("" for none) in the order the tool's restore command
    prefers them when a file is stored more than once; a suffix not here is not the
    tool's (its key names no WAL file)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        restore_command: str | None = None,
        restore_hint: str = "",
    ) -> None:
        self._store = store
        self._restore_command = restore_command
        self._restore_hint = restore_hint
        self._lengths: collections.OrderedDict[tuple[str, str], tuple[int, bool]] = (
            collections.OrderedDict()
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    # ------------------------------------------------------------------ layout

    def wal_prefix(self) -> str:
        """The key prefix below which the tool keeps WAL (ending in ``/``)."""
        raise NotImplementedError

    def file_key(self, name: str) -> str:
        """The key of WAL file ``name`` stored plain (a suffix is appended as
        ``.<suffix>``)."""
        raise NotImplementedError

    def parse_key(self, key: str) -> tuple[str, str] | None:
        """``(name, compression)`` of the WAL file stored at ``key``, None when the key
        names none in this layout."""
        raise NotImplementedError

    def split_suffix(self, filename: str) -> tuple[str, str] | None:
        """``(name, compression)`` of an object's file name, None unless it is a WAL
        file's name (segment, ``.partial``, ``.backup``, ``.history``) as PostgreSQL
        gives it, plain or with one of the tool's suffixes."""
        for suffix in self.preference:
            if suffix and filename.endswith(f".{suffix}"):
                base = filename[: -len(suffix) - 1]
                break
        else:
            base, suffix = filename, ""
        entry = parse_archive_name(base)
        if entry.kind is WalFileKind.UNKNOWN or entry.compression is not None:
            return None
        return base, suffix

    # ------------------------------------------------------------------ the protocol

    @property
    def location(self) -> str:
        """Where the tool's WAL is (the store's location and the WAL prefix)."""
        return f"{self._store.location.rstrip('/')}/{self.wal_prefix().rstrip('/')}"

    @property
    def store(self) -> ObjectStore:
        """The object store (read only)."""
        return self._store

    def _rank(self, compression: str) -> int:
        return self.preference.index(compression)

    def _listing(self) -> dict[str, StoredFile]:
        """Every WAL file (one listing), each the object the tool would fetch."""
        found: dict[str, StoredFile] = {}
        for obj in self._store.list(self.wal_prefix()):
            parsed = self.parse_key(obj.key)
            if parsed is None:
                continue
            name, compression = parsed
            mine = StoredFile(name, obj.key, compression, obj)
            other = found.get(name)
            if other is None or self._rank(compression) < self._rank(other.compression):
                found[name] = mine
            if other is not None:
                log.debug("%s is stored twice: %s and %s", name, other.key, obj.key)
        return found

    def find(self, name: str) -> StoredFile | None:
        """The object the tool would fetch for ``name`` (one listing of that file's
        keys), None when there is none; ``WalNameError`` for a name with ``/``."""
        check_file_name(name)
        entry = parse_archive_name(name)
        if entry.kind is WalFileKind.UNKNOWN or entry.compression is not None:
            return None
        base = self.file_key(name)
        if isinstance(self._store, DirectoryStore):
            # A file's keys asked for one by one: a stat each (a listing by prefix
            # would read the whole directory the keys are in).
            for compression in self.preference:
                key = f"{base}.{compression}" if compression else base
                obj = self._store.head(key)
                if obj is not None:
                    return StoredFile(name, key, compression, obj)
            return None
        best: StoredFile | None = None
        for obj in self._store.list(base):  # one request for every key of the file
            rest = obj.key[len(base) :]
            if rest and (not rest.startswith(".") or rest[1:] not in self.preference):
                continue
            compression = rest[1:]
            if best is None or self._rank(compression) < self._rank(best.compression):
                best = StoredFile(name, obj.key, compression, obj)
        return best

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """Every WAL file's name, sorted (one listing). With ``segment_size`` and
        ``check_sizes``, a segment whose length is known (see the module docstring)
        and is not that size is left out."""
        files = self._listing()
        names = sorted(files)
        if segment_size is not None and check_sizes:
            names = [n for n in names if self._fits(files[n], segment_size)]
        return tuple(names)

    def _fits(self, found: StoredFile, segment_size: int) -> bool:
        if parse_archive_name(found.name).kind is not WalFileKind.SEGMENT:
            return True
        try:
            length, _exact = self._length(found, claim=False)
        except ArchiveUnavailable:
            raise
        except ArchiveError as exc:
            if "reason" in exc.details:  # damaged: no recovery can use it
                log.info("%s is not counted as WAL: %s", found.name, exc.message)
                return False
            if "compression" in exc.details:  # no codec here: not judged
                return True
            raise  # the archive cannot be read
        return length is None or length == segment_size

    def exists(self, name: str) -> bool:
        """Whether the archive holds ``name`` (in any of the tool's compressions)."""
        return self.find(name) is not None

    def stat(self, name: str) -> ArchivedFile | None:
        """The file ``name`` as a plain file: ``size`` its content's length (exact or
        claimed, see the module docstring), ``content_size`` that length when it is
        exact (None when claimed), ``mtime_ns`` the object's version
        (:func:`~pgsnap.archives.store.etag_version` of its ETag); None when it is
        not there."""
        found = self.find(name)
        if found is None:
            return None
        length, exact = self._length(found, claim=True)
        assert length is not None
        where = self._where(found)
        return ArchivedFile(
            name, length, etag_version(found.object.etag), where, length if exact else None
        )

    def _where(self, found: StoredFile) -> str:
        return f"{self._store.location.rstrip('/')}/{found.key}"

    def _length(self, found: StoredFile, *, claim: bool) -> tuple[int | None, bool]:
        """``(length, exact)`` of the content of ``found``: exact where known at the
        cost the module docstring gives; with ``claim``, else the length the first
        page says (``exact`` False), else counted by reading it all."""
        cache_key = (found.key, found.object.etag)
        cached = self._lengths.get(cache_key)
        if cached is not None and (cached[1] or claim):
            self._lengths.move_to_end(cache_key)
            return cached
        size = found.object.size
        length: int | None = None
        exact = True
        head = b""
        if found.compression == "":
            length = size
        elif found.compression == "gz" and size > SMALL_OBJECT:
            tail = self._store.get_range(found.key, size - 4, 4)
            length = int.from_bytes(tail, "little") if len(tail) == 4 else None
        else:
            head = self._store.get_range(found.key, 0, min(size, SMALL_OBJECT))
            if len(head) >= size:
                length = len(self._decode_whole(found, head))
            else:
                length = recorded_length(found.compression, head)
        if length is None and claim:
            length, exact = self._claim(found, head)
        if length is not None:
            self._lengths[cache_key] = (length, exact)
            if len(self._lengths) > _LENGTH_CACHE:
                self._lengths.popitem(last=False)
        return length, exact

    def _decode_whole(self, found: StoredFile, data: bytes) -> bytes:
        """``data``, the whole object, decompressed (errors: :meth:`undecodable`)."""
        decoder = _decoder(found.compression, found.name, self._where(found))
        try:
            return decoder.feed(data) + decoder.finish()
        except Exception as exc:
            raise self.undecodable(found, exc) from exc

    def _claim(self, found: StoredFile, head: bytes) -> tuple[int, bool]:
        """The segment size the first page says, else the length counted (``head``:
        the object's first bytes, read already)."""
        stream = self._open(found, head)
        try:
            first = stream.read(_LONG_HEADER.size)
            if parse_archive_name(found.name).kind in (WalFileKind.SEGMENT, WalFileKind.PARTIAL):
                claimed = _claimed_segment_size(first)
                if claimed is not None:
                    return claimed, False
            total = len(first)
            while chunk := stream.read(READ_CHUNK):
                total += len(chunk)
            return total, True
        finally:
            stream.close()

    def open(self, name: str) -> ReadStream:
        """The content of ``name``, decompressed as its object's suffix says, streamed
        (ranged reads of :data:`READ_CHUNK` bytes). ``ArchiveError`` when it is not
        there or its codec is not available; ``read`` raises ``ArchiveError`` for
        damaged data."""
        found = self.find(name)
        if found is None:
            raise self._missing(name)
        return self._open(found)

    def _missing(self, name: str) -> ArchiveError:
        return ArchiveError(
            f"{name} is not in the {self.tool} archive {self.location}",
            hint="list the archive to see which files it holds",
            name=name,
            path=self.location,
        )

    def _open(self, found: StoredFile, head: bytes = b"") -> _DecodedStream:
        """The decoded stream of ``found`` (``head``: its first bytes, read already)."""
        where = self._where(found)
        decoder = _decoder(found.compression, found.name, where)

        def chunks() -> Iterator[bytes]:
            # A small first read: a header check needs the first bytes only.
            offset, size, chunk = len(head), found.object.size, SMALL_OBJECT
            if head:
                yield head
                chunk = READ_CHUNK
            while offset < size:
                data = self._store.get_range(found.key, offset, min(chunk, size - offset))
                chunk = READ_CHUNK
                if not data:
                    raise ArchiveError(
                        f"{found.name} in {where} ended at {offset} of its {size} bytes "
                        "while it was read",
                        hint="was it rewritten while pgsnap read it? Read it again",
                        name=found.name,
                        path=where,
                    )
                offset += len(data)
                yield data

        return _DecodedStream(
            chunks(),
            decoder,
            lambda exc: self.undecodable(found, exc),
        )

    def undecodable(self, found: StoredFile, exc: BaseException) -> ArchiveError:
        """The error for an object whose data does not decompress (a subclass says
        what its tool may have done to it)."""
        return _damaged(found.name, self._where(found), found.compression or "plain", exc)

    def read_text(self, name: str) -> str:
        """The text of a ``.history`` or ``.backup`` file (at most
        :data:`MAX_TEXT_SIZE` bytes)."""
        found = self.find(name)
        if found is None:
            raise self._missing(name)
        where = self._where(found)
        too_big = ArchiveError(
            f"{name} in {where} is larger than {MAX_TEXT_SIZE} bytes",
            hint="read_text is for .history and .backup files, not WAL segments",
            name=name,
            path=where,
        )
        if found.object.size > MAX_TEXT_SIZE:
            raise too_big
        stream = self._open(found)
        try:
            data = stream.read(MAX_TEXT_SIZE + 1)
        finally:
            stream.close()
        if len(data) > MAX_TEXT_SIZE:
            raise too_big
        return data.decode("utf-8", errors="replace")

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """An index of the archive (one listing; with ``check_sizes``, a segment whose
        length is known and wrong is among its ``unknown_names``)."""
        files = self._listing()
        every = sorted(files)
        usable = [n for n in every if self._fits(files[n], segment_size)] if check_sizes else every
        index = ArchiveIndex.build(list(usable), segment_size)
        kept = set(usable)
        rejected = tuple(n for n in every if n not in kept)
        if rejected:
            index = attrs.evolve(index, unknown_names=(*index.unknown_names, *rejected))
        return index

    def histories(self, names: Sequence[str] | None = None) -> TimelineGraph:
        """The timeline graph of the ``.history`` files among ``names`` (None: all)."""
        return TimelineGraph.from_histories(
            read_histories(self, None if names is None else tuple(names))
        )

    def restore_command(self) -> str:
        """The tool's own restore command for this archive (see the subclass)."""
        if not self._restore_command:
            raise ArchiveError(
                f"no restore_command is known for the {self.tool} archive {self.location}",
                hint=self._restore_hint or "give [archive] restore_command",
                path=self.location,
            )
        return self._restore_command
