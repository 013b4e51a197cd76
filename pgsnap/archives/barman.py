"""barman-cloud's WAL archive, read only (``[archive] format = "barman"``).

``barman-cloud-wal-archive [options] DESTINATION SERVER %p`` (an
``archive_command``) keeps each WAL file as one object. What pgsnap relies on,
read in barman's source (EnterpriseDB/barman, 3.19):

- **Keys** (``barman/clients/cloud_walarchive.py``, ``CloudWalUploader.upload_wal``):
  ``<path>/<server>/wals/<hash_dir>/<name>[<suffix>]``, where ``<path>`` is
  DESTINATION's path without its leading ``/``
  (``barman/cloud_providers/aws_s3.py``, ``S3CloudInterface.__init__``) and
  ``hash_dir`` (``barman/xlog.py``) is the name's timeline and log,
  ``"%08X%08X"``, for a segment, ``.partial`` or ``.backup`` file, and nothing for
  a ``.history`` file (``<path>/<server>/wals/00000002.history``).
- **Suffixes** (``CloudWalUploader.retrieve_wal_name``; ``ALLOWED_COMPRESSIONS``
  in ``barman/cloud.py``): none, ``.gz`` (``--gzip``), ``.bz2``, ``.xz``,
  ``.snappy`` (python-snappy's framing format), ``.zst``, ``.lz4``, written by
  ``barman/compression.py``: gzip one member, lz4 one frame that records the
  content's length (``lz4.frame.compress``), zstd one frame that does not
  (``copy_stream``). Every file PostgreSQL archives gets the suffix, histories
  included.
- **Encryption**: on the server side only (``-e AES256|aws:kms``,
  ``--sse-kms-key-id``: ``ServerSideEncryption`` and ``SSEKMSKeyId`` on the upload,
  ``S3CloudInterface._extra_upload_args``), which S3 undoes for any reader allowed
  to use the key: pgsnap reads such objects as any other. barman-cloud has no
  client-side encryption of WAL.
- **Restore** (``barman/clients/cloud_walrestore.py``,
  ``CloudWalDownloader.download_wal``): ``barman-cloud-wal-restore [options]
  SOURCE SERVER %f %p`` lists the keys that begin with the file's key and takes
  the first (in key order) that has a compression suffix or is ``.partial``, else
  the plain one: ``.bz2`` before ``.gz``, ``.lz4``, ``.snappy``, ``.xz``, ``.zst``,
  then plain (:attr:`BarmanCloudWalArchive.preference`). It exits 1 when the file
  is not there (``OperationErrorExit``), 2 for a network error, 3 for bad
  arguments, 4 for any other error (``barman/clients/cloud_cli.py``). Its
  credentials come from boto3's chain: ``AWS_ACCESS_KEY_ID`` and
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SHARED_CREDENTIALS_FILE`` or
  ``~/.aws/credentials`` of PostgreSQL's OS user (``--aws-profile``), an instance
  role; never on its command line.

pgsnap reads the WAL of one server (``[archive] server``) through
:class:`BarmanCloudWalArchive` (:class:`~pgsnap.archives.toolarchive.ToolWalArchive`):
names as PostgreSQL gave them, content decompressed. pgsnap's ``stat`` is exact
(it does not, as ``barman-cloud-wal-restore`` does, answer a segment's name with
its ``.partial`` file). The base backups barman-cloud keeps (``<server>/base/``)
are not read: pgsnap's backups are snapshots.
"""

from __future__ import annotations

import logging
import shlex
from typing import TYPE_CHECKING, ClassVar, Final

from pgsnap.archives.config import fatal_unless_missing
from pgsnap.archives.toolarchive import ToolWalArchive
from pgsnap.errors import ConfigurationError
from pgsnap.stores import ObjectStore, check_key
from pgsnap.wal.names import WalFileKind, parse_archive_name

if TYPE_CHECKING:
    from pgsnap.archives.config import ArchiveSettings

__all__ = ["RESTORE_PROGRAM", "BarmanCloudWalArchive", "open_archive", "restore_command"]

log = logging.getLogger(__name__)

RESTORE_PROGRAM: Final = "barman-cloud-wal-restore"
"""The program of the restore command pgsnap writes (found on PostgreSQL's ``PATH``)."""


class BarmanCloudWalArchive(ToolWalArchive):
    """The WAL barman-cloud keeps for ``server`` in ``store`` (whose root is
    barman-cloud's destination URL), read only (see the module docstring)."""

    tool: ClassVar[str] = "barman-cloud"
    preference: ClassVar[tuple[str, ...]] = ("bz2", "gz", "lz4", "snappy", "xz", "zst", "")

    def __init__(
        self,
        store: ObjectStore,
        server: str,
        *,
        restore_command: str | None = None,
        restore_hint: str = "",
    ) -> None:
        check_server(server)
        super().__init__(store, restore_command=restore_command, restore_hint=restore_hint)
        self._server = server

    @property
    def server(self) -> str:
        """barman's server name: the folder below the destination."""
        return self._server

    def wal_prefix(self) -> str:
        """``<server>/wals/``."""
        return f"{self._server}/wals/"

    def file_key(self, name: str) -> str:
        """``<server>/wals/<timeline and log>/<name>``; a history file's
        ``<server>/wals/<name>``."""
        if parse_archive_name(name).kind is WalFileKind.HISTORY:
            return f"{self.wal_prefix()}{name}"
        return f"{self.wal_prefix()}{name[:16].upper()}/{name}"

    def parse_key(self, key: str) -> tuple[str, str] | None:
        """``(name, compression)`` of a key in barman-cloud's layout, None for any other
        key (a file in the wrong folder is one ``barman-cloud-wal-restore`` does not
        find)."""
        prefix = self.wal_prefix()
        if not key.startswith(prefix):
            return None
        rest = key[len(prefix) :]
        folder, _, filename = rest.rpartition("/")
        parsed = self.split_suffix(filename)
        if parsed is None:
            return None
        name = parsed[0]
        is_history = parse_archive_name(name).kind is WalFileKind.HISTORY
        if is_history != (folder == "") or (folder and folder != name[:16].upper()):
            return None
        return parsed


def check_server(server: str) -> str:
    """``server`` when it can be barman's server name (one folder's name); else
    :class:`~pgsnap.errors.ConfigurationError`."""
    try:
        check_key(server)
    except ValueError:
        ok = False
    else:
        ok = "/" not in server
    if not ok:
        raise ConfigurationError(
            f"[archive] server {server!r} is not a barman server name",
            hint='the SERVER_NAME given to barman-cloud-wal-archive: one folder name, without "/"',
        )
    return server


def _quoted(words: list[str]) -> str:
    """Shell words, quoted, with ``%`` doubled (PostgreSQL substitutes ``%`` escapes)."""
    return " ".join(shlex.quote(w) for w in words).replace("%", "%%")


def restore_command(settings: ArchiveSettings, *, program: str = RESTORE_PROGRAM) -> str:
    """The ``restore_command`` for barman-cloud's archive ``settings`` describe:
    ``[archive] restore_command`` when given; else, for an ``s3://`` location,
    ``[env AWS_SHARED_CREDENTIALS_FILE=... AWS_DEFAULT_REGION=... AWS_CA_BUNDLE=...]
    barman-cloud-wal-restore [--endpoint-url URL] s3://bucket/path SERVER '%f' '%p'``
    (the variables for the ``[archive]`` options that are set: paths and names, no
    key); "" for a directory (barman-cloud reads cloud storage only)."""
    if settings.restore_command:
        return settings.restore_command
    if not settings.location.startswith("s3://"):
        return ""
    options = settings.options
    env = [
        f"{var}={options[key]}"
        for key, var in (
            ("credentials_file", "AWS_SHARED_CREDENTIALS_FILE"),
            ("region", "AWS_DEFAULT_REGION"),
            ("ca_bundle", "AWS_CA_BUNDLE"),
        )
        if options.get(key)
    ]
    words = (["env", *env] if env else []) + [program]
    if options.get("endpoint_url"):
        words += ["--endpoint-url", options["endpoint_url"]]
    words += [settings.location, settings.server]
    # Exit 1: not in the archive; 2 for a network error, which PostgreSQL would take
    # for the end of the archive: fatal instead (fatal_unless_missing).
    return fatal_unless_missing(_quoted(words) + " '%f' '%p'", 1)


def open_archive(store: ObjectStore, settings: ArchiveSettings) -> BarmanCloudWalArchive:
    """barman-cloud's archive of ``[archive] server`` in ``store`` (the destination
    ``[archive] path`` names), with the restore command :func:`restore_command`
    writes. ``tool_config`` is refused: barman-cloud has no configuration file."""
    if settings.tool_config:
        raise ConfigurationError(
            "[archive] tool_config is not used with format = 'barman': barman-cloud has "
            "no configuration file",
            hint="remove it; barman-cloud-wal-restore takes its credentials from "
            "PostgreSQL's environment (AWS_* variables, ~/.aws of its OS user), or "
            "give credentials_file",
        )
    command = restore_command(settings)
    return BarmanCloudWalArchive(
        store,
        check_server(settings.server),
        restore_command=command or None,
        restore_hint="barman-cloud-wal-restore reads cloud storage only: for an archive "
        "read from a directory, give [archive] restore_command",
    )
