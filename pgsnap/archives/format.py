"""How pgsnap's own WAL archive stores one file: a header, a frame table, frames.

A WAL file (a segment, a ``.partial`` segment, a ``.history`` or ``.backup``
file) is stored as one object::

    magic      8 bytes   b"PGSNAPW1"
    flags      1 byte    1: frames are zstd-compressed; 2: frames are encrypted
    reserved   3 bytes   zero
    size       8 bytes   the file's length (big-endian)
    frame      4 bytes   the length of a frame's content (the last one may be shorter)
    frames     4 bytes   how many frames
    digest    32 bytes   SHA-256 of the content (HMAC-SHA256 with the key's id key
                         when encrypted, so the digest tells nothing of the content)
    table      4 bytes a frame: each stored frame's length
    frames...

The content is cut into frames of ``frame`` bytes (1 MiB by default), each
compressed by itself (zstd, kept as is when that does not pay: the frame's
stored length then equals its content's), and, with a key, sealed with AES-GCM
with the file's name, the frame's index and the header's digest as associated
data (a frame moved to another file or place does not open). So a reader gets
the header and table with one ranged read, and any frame with one more: the
first 40 bytes of a segment (its page header) cost two small reads, and a
whole segment is read one frame at a time, memory bounded.

A stored object is never rewritten: the digest in its header tells whether a
file pushed again is the same (:func:`same_content`).
"""

from __future__ import annotations

import hashlib
import importlib
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from pgsnap._attrs import frozen
from pgsnap.errors import ArchiveError

if TYPE_CHECKING:
    from pgsnap.copies.keys import CopyKey

__all__ = [
    "DEFAULT_FRAME",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_FRAMES",
    "Header",
    "decode_frame",
    "digest_of",
    "encode",
    "frames",
    "parse_header",
]

MAGIC: Final = b"PGSNAPW1"
HEADER_SIZE: Final = 60
"""Bytes before the frame table."""
DEFAULT_FRAME: Final = 1 << 20
"""A frame's content: 1 MiB."""
MAX_FRAMES: Final = 1 << 16
"""More frames than this is a damaged header (a 64 MiB segment has 64)."""
ZSTD: Final = 1
ENCRYPTED: Final = 2
_HEAD: Final = struct.Struct(">8sB3xQII32s")
_ZSTD_LEVEL: Final = 3


def _zstd() -> Any | None:
    try:
        return importlib.import_module("zstandard")
    except ImportError:
        return None


@frozen
class Header:
    """An object's header and frame table (see the module docstring)."""

    flags: int
    size: int
    frame: int
    lengths: tuple[int, ...]
    digest: bytes

    @property
    def compressed(self) -> bool:
        """Frames are zstd-compressed (where that paid)."""
        return bool(self.flags & ZSTD)

    @property
    def encrypted(self) -> bool:
        """Frames are sealed with AES-GCM."""
        return bool(self.flags & ENCRYPTED)

    @property
    def table_end(self) -> int:
        """Where the first frame starts."""
        return HEADER_SIZE + 4 * len(self.lengths)

    def frame_range(self, index: int) -> tuple[int, int]:
        """``(offset, stored length)`` of frame ``index`` in the object."""
        return self.table_end + sum(self.lengths[:index]), self.lengths[index]

    def content_length(self, index: int) -> int:
        """How many bytes of content frame ``index`` holds."""
        return min(self.frame, self.size - index * self.frame)


def digest_of(data: bytes, key: CopyKey | None) -> bytes:
    """SHA-256 of ``data``; with ``key``, its keyed HMAC."""
    if key is not None:
        return bytes.fromhex(key.chunk_id(data))
    return hashlib.sha256(data).digest()


def _associated(name: str, index: int, digest: bytes) -> bytes:
    return name.encode() + b"\0" + index.to_bytes(4, "big") + digest


def encode(
    name: str,
    data: bytes,
    *,
    key: CopyKey | None = None,
    frame: int = DEFAULT_FRAME,
    compress: bool = True,
) -> bytes:
    """The object that stores file ``name`` with content ``data``."""
    module = _zstd() if compress else None
    flags = (ZSTD if module is not None else 0) | (ENCRYPTED if key is not None else 0)
    digest = digest_of(data, key)
    compressor = module.ZstdCompressor(level=_ZSTD_LEVEL) if module is not None else None
    stored: list[bytes] = []
    view = memoryview(data)
    for index, start in enumerate(range(0, len(data), frame) or [0]):
        piece = bytes(view[start : start + frame])
        out = piece
        if compressor is not None and piece:
            packed = bytes(compressor.compress(piece))
            if len(packed) < len(piece):
                out = packed
        if key is not None:
            out = key.encrypt(out, _associated(name, index, digest))
        stored.append(out)
    if not data:
        stored = []
    head = _HEAD.pack(MAGIC, flags, len(data), frame, len(stored), digest)
    table = b"".join(struct.pack(">I", len(s)) for s in stored)
    return head + table + b"".join(stored)


def parse_header(prefix: bytes, *, name: str, where: str) -> Header:
    """The header and table at the start of a stored object (``prefix`` holds at least
    :data:`HEADER_SIZE` bytes and the table, or the whole object); ``ArchiveError``
    naming ``name`` when it is not one, or is cut short."""
    if len(prefix) < HEADER_SIZE or not prefix.startswith(MAGIC):
        raise ArchiveError(
            f"{name} in {where} is not an object of pgsnap's WAL archive (no header)",
            hint="the archive holds files pgsnap wal-push did not write: move them away",
            name=name,
        )
    _magic, flags, size, frame, count, digest = _HEAD.unpack_from(prefix)
    if flags & ~(ZSTD | ENCRYPTED) or count > MAX_FRAMES or frame <= 0:
        raise ArchiveError(
            f"{name} in {where} has a damaged header (flags {flags}, {count} frames)",
            hint="the object is damaged: archive the file again from its server, if it has it",
            name=name,
        )
    if count != (size + frame - 1) // frame:
        raise ArchiveError(
            f"{name} in {where} has a damaged header ({count} frames for {size} bytes)",
            hint="the object is damaged: archive the file again from its server, if it has it",
            name=name,
        )
    end = HEADER_SIZE + 4 * count
    if len(prefix) < end:
        raise ArchiveError(
            f"{name} in {where} is cut short in its frame table",
            hint="the object is damaged: archive the file again from its server, if it has it",
            name=name,
        )
    lengths = struct.unpack_from(f">{count}I", prefix, HEADER_SIZE) if count else ()
    return Header(flags, size, frame, tuple(lengths), digest)


def decode_frame(
    header: Header, index: int, stored: bytes, *, name: str, where: str, key: CopyKey | None
) -> bytes:
    """Frame ``index``'s content from its stored bytes; ``ArchiveError`` when it does
    not decrypt (another key, another file's frame) or decompress, or has the wrong
    length."""

    def damaged(why: str) -> ArchiveError:
        return ArchiveError(
            f"{name} in {where}: frame {index} {why}",
            hint="the object is damaged, or sealed with another key ([archive] key_file)",
            name=name,
        )

    data = stored
    if header.encrypted:
        if key is None:
            raise ArchiveError(
                f"{name} in {where} is encrypted, and no key was given",
                hint="give the archive's key file ([archive] key_file)",
                name=name,
            )
        opened = key.decrypt(data, _associated(name, index, header.digest))
        if opened is None:
            raise damaged("does not decrypt with this key")
        data = opened
    want = header.content_length(index)
    if header.compressed and len(data) != want:
        module = _zstd()
        if module is None:
            raise ArchiveError(
                f"{name} in {where} is zstd-compressed, and the zstandard module is missing",
                hint="pip install zstandard",
                name=name,
            )
        try:
            data = bytes(module.ZstdDecompressor().decompress(data, max_output_size=want))
        except module.ZstdError as exc:
            raise damaged(f"does not decompress ({exc})") from None
    if len(data) != want:
        raise damaged(f"holds {len(data)} bytes, not {want}")
    return data


def frames(
    header: Header,
    read: Callable[[int, int], bytes],
    *,
    name: str,
    where: str,
    key: CopyKey | None,
) -> Iterator[bytes]:
    """Each frame's content in order, from ``read(offset, length)`` (the stored
    object's bytes), and at the end the digest checked: ``ArchiveError`` when the
    content is not what was pushed."""
    digest = hashlib.sha256() if key is None else key.hasher()
    for index in range(len(header.lengths)):
        offset, length = header.frame_range(index)
        content = decode_frame(header, index, read(offset, length), name=name, where=where, key=key)
        digest.update(content)
        yield content
    if digest.digest() != header.digest:
        raise ArchiveError(
            f"{name} in {where} is not what was archived (its digest differs)",
            hint="the object is damaged: archive the file again from its server, if it has it",
            name=name,
        )
