"""WAL-G's WAL archive, read only (``[archive] format = "walg"``).

``wal-g wal-push %p`` (an ``archive_command``) keeps each WAL file as one object.
No WAL-G binary is in any package registry pgsnap's tests reach: this module is
written and tested from WAL-G's documentation and source (wal-g/wal-g), never
against WAL-G itself. What it relies on, with where each was read:

- **Keys**: ``<prefix>/wal_005/<name>[.<extension>]``. ``utility/utility.go``:
  ``WalPath = "wal_" + VersionStr + "/"`` with ``VersionStr = "005"``;
  ``internal/databases/postgres/wal_uploader.go`` moves the uploader into
  ``WalPath``; ``internal/uploader.go`` (``RegularUploader.uploadFile``) names the
  object ``utility.AddFileExtension(base name, compressor extension)``, which adds
  nothing for no compression (``utility/utility.go``). ``<prefix>`` is
  ``WALG_S3_PREFIX`` (``s3://bucket/path``) or ``WALG_FILE_PREFIX`` (a directory;
  ``pkg/storages/fs/folder.go`` writes a file under a temporary name and renames
  it), plus ``WALG_STORAGE_PREFIX`` when set (``internal/configure.go``,
  ``ConfigureStoragePrefix``). Every file PostgreSQL archives goes there, histories
  and ``.backup`` files included. Other objects there (``<name>.json`` metadata
  with ``WALG_UPLOAD_WAL_METADATA``, ``*_delta`` files with
  ``WALG_USE_WAL_DELTA``) name no WAL file and are left out.
- **Compression** (``internal/compression/``; ``WALG_COMPRESSION_METHOD``, default
  ``lz4``, ``internal/config/config.go``): ``lz4`` (``.lz4``,
  ``github.com/pierrec/lz4/v4``'s writer with its defaults: 4 MiB blocks, a content
  checksum, no content size), ``lzma`` (``.lzma``, ``github.com/ulikunitz/xz/lzma``:
  the classic ``.lzma`` format), ``zstd`` (``.zst``, ``klauspost/compress/zstd``'s
  streaming writer), ``brotli`` (``.br``, only in builds with the ``brotli`` tag),
  ``none`` (no extension). WAL-G also reads ``.gz`` and, built with the ``lzo``
  tag, WAL-E's ``.lzo``. ``wal-fetch`` (``internal/fetch_helper.go``,
  ``findDecompressorAndDownload``) tries the extensions in the order of
  ``compression.Decompressors`` (``compression_default.go``, then the
  ``*_enabled.go`` files' ``init``: lz4, lzma, gzip, brotli, lzo, zstd), the plain
  name last (:attr:`WalgWalArchive.preference`), the extension it last used first
  (``~/.walg_decompressor_cache``, which pgsnap does not read).
- **Encryption** (``internal/configure.go``, ``ConfigureCrypterForSpecificConfig``;
  ``internal/compress_and_encrypt.go``): with ``WALG_PGP_KEY``/``WALG_PGP_KEY_PATH``
  or the legacy ``WALE_GPG_KEY_ID`` (OpenPGP), ``WALG_ENVELOPE_PGP_KEY``/``_PATH``
  (OpenPGP with a KMS envelope), ``WALG_CSE_KMS_ID`` (AWS KMS), ``YC_CSE_KMS_KEY_ID``
  (Yandex Cloud KMS), ``WALG_LIBSODIUM_KEY``/``_PATH`` (libsodium's secretstream;
  ``internal/crypto/libsodium/writer.go``), the compressed stream is encrypted,
  and the key's name does not change. pgsnap cannot decrypt any of these: such an
  object does not decompress, and reading it is refused saying so (the archive is
  still listed, and recoveries fetch with ``wal-g wal-fetch``, which decrypts). S3
  server-side encryption (``WALG_S3_SSE``, ``WALG_S3_SSE_KMS_ID``) is undone by S3; SSE-C
  (``WALG_S3_SSE_C``) needs the key on every request, which pgsnap's S3 client
  does not send.
- **Restore**: ``wal-g wal-fetch %f %p`` (``cmd/pg/wal_fetch.go``); it exits 74
  (``EX_IOERR``, ``internal/databases/postgres/constants``) when the file is not in
  the archive (``docs/PostgreSQL.md``). It is configured by environment variables
  or ``--config FILE`` (default ``~/.walg.json``; ``cmd/common/common.go``):
  ``WALG_S3_PREFIX`` or ``WALG_FILE_PREFIX``, ``AWS_ENDPOINT``,
  ``AWS_S3_FORCE_PATH_STYLE``, ``AWS_REGION``, ``WALG_S3_CA_CERT_FILE``
  (``pkg/storages/s3/configure.go``, ``internal/config/config.go``), credentials
  by ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_SHARED_CREDENTIALS_FILE``
  or ``AWS_PROFILE`` (``docs/STORAGES.md``), decryption keys by the variables above.
  When several storages are configured, the first of OSS, S3, FILE... wins
  (``internal/storage_adapter.go``, ``StorageAdapters``).
"""

from __future__ import annotations

import logging
import shlex
from typing import TYPE_CHECKING, ClassVar, Final

from pgsnap.archives.config import fatal_unless_missing
from pgsnap.archives.toolarchive import StoredFile, ToolWalArchive
from pgsnap.errors import ArchiveError
from pgsnap.stores import ObjectStore

if TYPE_CHECKING:
    from pgsnap.archives.config import ArchiveSettings

__all__ = ["RESTORE_PROGRAM", "WAL_FOLDER", "WalgWalArchive", "open_archive", "restore_command"]

log = logging.getLogger(__name__)

WAL_FOLDER: Final = "wal_005/"
"""The folder of WAL below WAL-G's prefix (``utility.WalPath``)."""
RESTORE_PROGRAM: Final = "wal-g"
"""The program of the restore command pgsnap writes (found on PostgreSQL's ``PATH``)."""
ENCRYPTION_SETTINGS: Final = (
    "WALG_PGP_KEY",
    "WALG_PGP_KEY_PATH",
    "WALG_ENVELOPE_PGP_KEY",
    "WALG_ENVELOPE_PGP_KEY_PATH",
    "WALG_CSE_KMS_ID",
    "YC_CSE_KMS_KEY_ID",
    "WALE_GPG_KEY_ID",
    "WALG_LIBSODIUM_KEY",
    "WALG_LIBSODIUM_KEY_PATH",
)
"""The settings that make WAL-G encrypt what it pushes (named in messages)."""


class WalgWalArchive(ToolWalArchive):
    """The WAL WAL-G keeps in ``store`` (whose root is WAL-G's prefix, the folder that
    holds ``wal_005/``), read only (see the module docstring)."""

    tool: ClassVar[str] = "WAL-G"
    preference: ClassVar[tuple[str, ...]] = ("lz4", "lzma", "gz", "br", "lzo", "zst", "")

    def wal_prefix(self) -> str:
        """``wal_005/``."""
        return WAL_FOLDER

    def file_key(self, name: str) -> str:
        """``wal_005/<name>``."""
        return f"{WAL_FOLDER}{name}"

    def parse_key(self, key: str) -> tuple[str, str] | None:
        """``(name, compression)`` of a key ``wal_005/<name>[.<extension>]``, None for
        any other."""
        if not key.startswith(WAL_FOLDER) or "/" in key[len(WAL_FOLDER) :]:
            return None
        return self.split_suffix(key[len(WAL_FOLDER) :])

    def undecodable(self, found: StoredFile, exc: BaseException) -> ArchiveError:
        """An object that does not decompress: damaged, or encrypted by WAL-G (which
        keeps the name)."""
        where = self._where(found)
        return ArchiveError(
            f"{found.name} in {where} is not {found.compression or 'plain'} data as its "
            f"name says ({exc}): WAL-G encrypts what it pushes, keeping the name, when "
            f"one of {', '.join(ENCRYPTION_SETTINGS)} is set, and pgsnap cannot decrypt "
            "it (else the object is damaged)",
            hint="pgsnap lists an encrypted archive but cannot read its files (timeline "
            "histories, segment checks); recoveries fetch with wal-g wal-fetch, which "
            "decrypts. If it is not encrypted, restore the object from another copy",
            name=found.name,
            path=where,
            reason=str(exc),
        )


def _quoted(words: list[str]) -> str:
    """Shell words, quoted, with ``%`` doubled (PostgreSQL substitutes ``%`` escapes)."""
    return " ".join(shlex.quote(w) for w in words).replace("%", "%%")


def restore_command(settings: ArchiveSettings, *, program: str = RESTORE_PROGRAM) -> str:
    """The ``restore_command`` for WAL-G's archive ``settings`` describe:
    ``[archive] restore_command`` when given; else ``env WALG_S3_PREFIX=s3://...
    [AWS_ENDPOINT=... AWS_S3_FORCE_PATH_STYLE=true] [AWS_REGION=...]
    [WALG_S3_CA_CERT_FILE=...] [AWS_SHARED_CREDENTIALS_FILE=...] wal-g [--config
    TOOL_CONFIG] wal-fetch '%f' '%p'`` (``WALG_FILE_PREFIX=<directory>`` for a
    directory): the archive pgsnap read is the one ``wal-fetch`` reads, with the
    options set in ``[archive]`` (paths and names, no key). Keys and decryption
    settings come from PostgreSQL's environment or ``tool_config``."""
    if settings.restore_command:
        return settings.restore_command
    options = settings.options
    s3 = settings.location.startswith("s3://")
    env = [f"{'WALG_S3_PREFIX' if s3 else 'WALG_FILE_PREFIX'}={settings.location}"]
    if options.get("endpoint_url"):
        # pgsnap's S3 client addresses a bucket by path at an endpoint of its own.
        env += [f"AWS_ENDPOINT={options['endpoint_url']}", "AWS_S3_FORCE_PATH_STYLE=true"]
    for key, var in (
        ("region", "AWS_REGION"),
        ("ca_bundle", "WALG_S3_CA_CERT_FILE"),
        ("credentials_file", "AWS_SHARED_CREDENTIALS_FILE"),
    ):
        if options.get(key):
            env.append(f"{var}={options[key]}")
    words = ["env", *env, program]
    if settings.tool_config:
        words += ["--config", settings.tool_config]
    # Exit 74: not in the archive; any other failure is fatal (fatal_unless_missing).
    return fatal_unless_missing(_quoted([*words, "wal-fetch"]) + " '%f' '%p'", 74)


def open_archive(store: ObjectStore, settings: ArchiveSettings) -> WalgWalArchive:
    """WAL-G's archive in ``store`` (``[archive] path`` is WAL-G's prefix: the folder
    holding ``wal_005/``), with the restore command :func:`restore_command` writes."""
    return WalgWalArchive(store, restore_command=restore_command(settings))
