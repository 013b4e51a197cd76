"""Copies of backups off the array: manifests and content-addressed chunks in a copy target.

A backup is first a snapshot group on the array that holds the database;
lose the array and the snapshots go with it. A copy puts the backup's trees
(read from its read-only snapshot, never from the live database) into a
:class:`CopyTarget` as a :class:`Manifest` and chunks named by their
SHA-256, compressed (zstd, or zlib without the ``zstandard`` module) and,
with a :class:`CopyKey` the user holds, encrypted (:mod:`pgsnap.copies.keys`), so a
chunk already there is never sent again: the first copy sends everything,
later ones only what changed, and each is restorable on its own.

This package is the copy format and its I/O, a leaf below the planner:
:func:`copy_trees`, :func:`restore_trees`, :func:`verify_copy`,
:func:`collect_garbage` (remove the chunks no copy needs, safely beside
running copies: :mod:`pgsnap.copies.gc`) and :class:`DirectoryCopyTarget`.
The plans that make the snapshot readable on a host, copy it, record it
in the catalog and restore from it come with the rest of issue 21 (see docs/reference/copies.md).
"""

from __future__ import annotations

from pgsnap.copies.chunks import (
    CODECS,
    chunk_id,
    decode_chunk,
    decode_chunk_into,
    default_codec,
    encode_chunk,
)
from pgsnap.copies.copier import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_PARALLEL,
    CopyProgress,
    CopyStats,
    RestoreProgress,
    VerifyReport,
    copy_trees,
    restore_trees,
    verify_copy,
)
from pgsnap.copies.gc import GcProgress, GcReport, collect_garbage
from pgsnap.copies.keys import CopyKey
from pgsnap.copies.manifest import (
    EntryKind,
    FileEntry,
    Manifest,
    decode_manifest,
    encode_manifest,
    is_chunk_id,
    is_copy_id,
)
from pgsnap.copies.target import TARGET_OPTIONS, CopyTarget, DirectoryCopyTarget, open_target

__all__ = [
    "CODECS",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_PARALLEL",
    "TARGET_OPTIONS",
    "CopyKey",
    "CopyProgress",
    "CopyStats",
    "CopyTarget",
    "DirectoryCopyTarget",
    "EntryKind",
    "FileEntry",
    "GcProgress",
    "GcReport",
    "Manifest",
    "RestoreProgress",
    "VerifyReport",
    "chunk_id",
    "collect_garbage",
    "copy_trees",
    "decode_chunk",
    "decode_chunk_into",
    "decode_manifest",
    "default_codec",
    "encode_chunk",
    "encode_manifest",
    "is_chunk_id",
    "is_copy_id",
    "open_target",
    "restore_trees",
    "verify_copy",
]
