"""Chunks as a copy target stores them: compressed, self-describing, checked on read.

A stored chunk is ``b"PGSC"``, one byte naming its codec, then the payload.
The codec is ``zstd`` when the ``zstandard`` module is installed
(``pip install 'pgsnap[copies]'``), else ``zlib`` (the standard library);
``none`` stores a chunk as it is (data that does not compress). A reader
decodes any of them whatever the writer's setting, and checks that the
content hashes to the chunk's id (:class:`~pgsnap.errors.DamagedChunkError`
otherwise).

With a :class:`~pgsnap.copies.keys.CopyKey` (an encrypted copy) a chunk's id
is the HMAC-SHA256 of its content with the key's chunk id key
(:meth:`~pgsnap.copies.keys.CopyKey.chunk_id`), and the stored chunk is
``b"PGSE"``, a version byte (1), then the AES-256-GCM sealing of the
compressed chunk (``PGSC`` as above) with the chunk id as associated data: a
random 12-byte nonce, the ciphertext, a 16-byte tag. A reader checks the tag
(another key, or altered bytes: :class:`~pgsnap.errors.DamagedChunkError`),
decompresses, and checks the keyed id. Without a key nothing changes.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import zlib
from typing import TYPE_CHECKING, Any, Final

from pgsnap.errors import ConfigurationError, CopyKeyError, DamagedChunkError

if TYPE_CHECKING:
    from pgsnap.copies.keys import CopyKey

__all__ = [
    "CODECS",
    "ENCRYPTED_MAGIC",
    "MAGIC",
    "chunk_id",
    "decode_chunk",
    "decode_chunk_into",
    "default_codec",
    "encode_chunk",
]

MAGIC: Final = b"PGSC"
ENCRYPTED_MAGIC: Final = b"PGSE"
"""The first bytes of a chunk encrypted with a copy key."""
_ENCRYPTED_VERSION: Final = 1
CODECS: Final = {"none": 0, "zlib": 1, "zstd": 2}
"""Codec names and the byte that names each in a stored chunk."""
_BY_BYTE: Final = {v: k for k, v in CODECS.items()}
_ZLIB_LEVEL: Final = 6
_ZSTD_LEVEL: Final = 3


def _zstd() -> Any | None:
    try:
        return importlib.import_module("zstandard")
    except ImportError:
        return None


def default_codec() -> str:
    """``"zstd"`` when the ``zstandard`` module is importable, else ``"zlib"``."""
    return "zstd" if _zstd() is not None else "zlib"


def chunk_id(data: bytes | memoryview, key: CopyKey | None = None) -> str:
    """The id of a chunk: the SHA-256 of its content, in hex; with ``key``, the
    keyed HMAC-SHA256 of it (:meth:`~pgsnap.copies.keys.CopyKey.chunk_id`)."""
    if key is not None:
        return key.chunk_id(data)
    return hashlib.sha256(data).hexdigest()


def encode_chunk(
    data: bytes, codec: str, *, key: CopyKey | None = None, chunk: str | None = None
) -> bytes:
    """``data`` as stored with ``codec``; a compression that does not pay is stored as
    is. With ``key``, encrypted, with the chunk's id ``chunk`` (computed when not
    given) as associated data."""
    plain = _compress(data, codec)
    if key is None:
        return plain
    cid = chunk if chunk is not None else key.chunk_id(data)
    return ENCRYPTED_MAGIC + bytes([_ENCRYPTED_VERSION]) + key.encrypt(plain, cid.encode())


def _compress(data: bytes, codec: str) -> bytes:
    if codec not in CODECS:
        raise ConfigurationError(
            f"unknown chunk codec {codec!r}", hint=f"use one of: {', '.join(CODECS)}"
        )
    if codec == "zstd":
        module = _zstd()
        if module is None:
            raise ConfigurationError(
                "the zstd codec needs the zstandard module",
                hint="pip install 'pgsnap[copies]', or use codec 'zlib'",
            )
        payload = bytes(module.ZstdCompressor(level=_ZSTD_LEVEL).compress(data))
    elif codec == "zlib":
        payload = zlib.compress(data, _ZLIB_LEVEL)
    else:
        payload = data
    if codec != "none" and len(payload) >= len(data):
        codec, payload = "none", data
    return MAGIC + bytes([CODECS[codec]]) + payload


def decode_chunk_into(
    stored: bytes, expected_id: str, into: memoryview, key: CopyKey | None = None
) -> int:
    """:func:`decode_chunk` into the writable buffer ``into``: the number of bytes
    of content now at its start. A zstd chunk decompresses straight into it (no
    memory of its own: a restore uses one buffer a thread, page-aligned for
    ``O_DIRECT`` writes); a chunk larger than the buffer is damage."""
    if key is None and stored[len(MAGIC) : len(MAGIC) + 1] == bytes([CODECS["zstd"]]):
        module = _zstd()
        if module is not None and stored.startswith(MAGIC):
            try:
                reader = module.ZstdDecompressor().stream_reader(stored[len(MAGIC) + 1 :])
                size = 0
                while size < len(into) and (n := reader.readinto(into[size:])):
                    size += n
                over = size == len(into) and bool(reader.read(1))
            except Exception as exc:  # zstandard.ZstdError: not a zstd frame
                raise DamagedChunkError(
                    f"chunk {expected_id} does not decompress: {exc}",
                    hint="the object was damaged; copy the backup again",
                    chunk=expected_id,
                ) from exc
            if over:
                raise DamagedChunkError(
                    f"chunk {expected_id} decompresses to more than {len(into)} bytes, "
                    "the copy's chunk size",
                    hint="the object was damaged or replaced; copy the backup again",
                    chunk=expected_id,
                )
            if chunk_id(into[:size]) != expected_id:
                raise DamagedChunkError(
                    f"chunk {expected_id} does not hash to its name",
                    hint="the object was damaged or replaced; copy the backup again",
                    chunk=expected_id,
                )
            return size
    data = decode_chunk(stored, expected_id, key)
    if len(data) > len(into):
        raise DamagedChunkError(
            f"chunk {expected_id} holds more than {len(into)} bytes, the copy's chunk size",
            hint="the object was damaged or replaced; copy the backup again",
            chunk=expected_id,
        )
    into[: len(data)] = data
    return len(data)


def decode_chunk(stored: bytes, expected_id: str, key: CopyKey | None = None) -> bytes:
    """The content of a stored chunk, checked against ``expected_id`` (with ``key``:
    an encrypted chunk, its tag and its keyed id checked)."""
    if key is None:
        if stored.startswith(ENCRYPTED_MAGIC):
            raise CopyKeyError(
                f"chunk {expected_id} is encrypted and no copy key was given",
                hint="give the key the copy was made with ([copies] key_file)",
                chunk=expected_id,
            )
        data = _decompress(stored, expected_id)
        good = chunk_id(data) == expected_id
    else:
        data = _decompress(_unseal(stored, expected_id, key), expected_id)
        good = hmac.compare_digest(key.chunk_id(data), expected_id)
    if not good:
        raise DamagedChunkError(
            f"chunk {expected_id} does not hash to its name",
            hint="the object was damaged or replaced; copy the backup again",
            chunk=expected_id,
        )
    return data


def _unseal(stored: bytes, expected_id: str, key: CopyKey) -> bytes:
    """The compressed chunk inside an encrypted one, its tag checked."""
    head = len(ENCRYPTED_MAGIC) + 1
    if not stored.startswith(ENCRYPTED_MAGIC) or len(stored) < head:
        raise DamagedChunkError(
            f"chunk {expected_id} is not encrypted, and its copy is",
            hint="the object was damaged or replaced; copy the backup again",
            chunk=expected_id,
        )
    if stored[len(ENCRYPTED_MAGIC)] != _ENCRYPTED_VERSION:
        raise DamagedChunkError(
            f"chunk {expected_id} names an unknown encryption version",
            hint="the object was damaged, or written by a newer pgsnap",
            chunk=expected_id,
        )
    plain = key.decrypt(stored[head:], expected_id.encode())
    if plain is None:
        raise DamagedChunkError(
            f"chunk {expected_id} does not authenticate with key {key.fingerprint}: it was "
            "damaged or altered (or written with another key)",
            hint="verify the copy (pgsnap verify-copy); restore from another copy",
            chunk=expected_id,
        )
    return plain


def _decompress(stored: bytes, expected_id: str) -> bytes:
    """The content of a ``PGSC`` chunk (not yet checked against its id)."""
    if len(stored) < len(MAGIC) + 1 or not stored.startswith(MAGIC):
        raise DamagedChunkError(
            f"chunk {expected_id} is not a pgsnap chunk",
            hint="the object was damaged or replaced; copy the backup again",
            chunk=expected_id,
        )
    codec = _BY_BYTE.get(stored[len(MAGIC)])
    payload = stored[len(MAGIC) + 1 :]
    if codec is None:
        raise DamagedChunkError(
            f"chunk {expected_id} names an unknown codec",
            hint="the object was damaged, or written by a newer pgsnap",
            chunk=expected_id,
        )
    module = _zstd() if codec == "zstd" else None
    if codec == "zstd" and module is None:
        raise ConfigurationError(
            f"chunk {expected_id} is zstd-compressed and the zstandard module is missing",
            hint="pip install 'pgsnap[copies]'",
        )
    try:
        if codec == "zlib":
            data = zlib.decompress(payload)
        elif module is not None:
            data = bytes(module.ZstdDecompressor().decompress(payload))
        else:
            data = payload
    except Exception as exc:  # zlib.error, zstandard.ZstdError: the bytes are not the codec's
        raise DamagedChunkError(
            f"chunk {expected_id} does not decompress: {exc}",
            hint="the object was damaged; copy the backup again",
            chunk=expected_id,
        ) from exc
    return data
