"""Chunks as a copy target stores them: compressed, self-describing, checked on read.

A stored chunk is ``b"PGSC"``, one byte naming its codec, then the payload.
The codec is ``zstd`` when the ``zstandard`` module is installed
(``pip install 'pgsnap[copies]'``), else ``zlib`` (the standard library);
``none`` stores a chunk as it is (data that does not compress). A reader
decodes any of them whatever the writer's setting, and checks that the
content hashes to the chunk's id (:class:`~pgsnap.errors.DamagedChunkError`
otherwise).
"""

from __future__ import annotations

import hashlib
import importlib
import zlib
from typing import Any, Final

from pgsnap.errors import ConfigurationError, DamagedChunkError

__all__ = ["CODECS", "MAGIC", "chunk_id", "decode_chunk", "default_codec", "encode_chunk"]

MAGIC: Final = b"PGSC"
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


def chunk_id(data: bytes) -> str:
    """The id of a chunk: the SHA-256 of its content, in hex."""
    return hashlib.sha256(data).hexdigest()


def encode_chunk(data: bytes, codec: str) -> bytes:
    """``data`` as stored with ``codec``; a compression that does not pay is stored as is."""
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


def decode_chunk(stored: bytes, expected_id: str) -> bytes:
    """The content of a stored chunk, checked against ``expected_id``."""
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
    if chunk_id(data) != expected_id:
        raise DamagedChunkError(
            f"chunk {expected_id} does not hash to its name",
            hint="the object was damaged or replaced; copy the backup again",
            chunk=expected_id,
        )
    return data
