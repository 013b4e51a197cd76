"""pgBackRest repositories for tests: built by hand in its layout, or by the real tool.

pgsnap reads pgBackRest's archive (:mod:`pgsnap.archives.pgbackrest`) and never
writes into it; tests need repositories to read. :class:`RepoBuilder` writes one
as ``stanza-create`` and ``archive-push`` would (``archive.info`` with its
checksum, each segment under its SHA-1, compressed with one of pgBackRest's
codecs), so that the real ``pgbackrest archive-get`` reads it too;
:func:`pgbackrest_config` writes the configuration the real tool runs with.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import importlib
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from pgsnap.archives.pgbackrest import ARCHIVE_INFO, REPOSITORY_FORMAT, info_checksum
from pgsnap.errors import ConfigurationError

__all__ = [
    "PGBACKREST_MAX_MAJOR",
    "RepoBuilder",
    "archive_info_bytes",
    "compress",
    "pgbackrest_config",
    "pgbackrest_unavailable",
]

PGBACKREST_MAX_MAJOR: Final = 15
"""The newest PostgreSQL pgBackRest 2.45 (Debian 12's) supports (``PG_VERSION_MAX``,
``src/postgres/version.h``): it refuses the ``pg_control`` of 16 and later."""


def pgbackrest_unavailable() -> str | None:
    """Why the real ``pgbackrest`` cannot run here (None: it can)."""
    if shutil.which("pgbackrest") is None:
        return "no pgbackrest program (apt-get install pgbackrest)"
    return None


def archive_info_bytes(
    history: Sequence[tuple[int, str, int]],
    *,
    current: int | None = None,
    backrest_version: str = "2.45",
) -> bytes:
    """``archive.info`` as pgBackRest 2.45 writes it (``infoArchiveSave``): ``history``
    as ``(db id, version, system identifier)``, oldest first; ``current`` the db id
    of ``[db]`` (default: the last). Sections in pgBackRest's order, then the
    checksum (:func:`~pgsnap.archives.pgbackrest.info_checksum`)."""
    if not history:
        raise ValueError("archive.info needs a history")
    now = next(h for h in history if h[0] == (current or history[-1][0]))
    values = [
        ("backrest", "backrest-format", str(REPOSITORY_FORMAT)),
        ("backrest", "backrest-version", f'"{backrest_version}"'),
        ("db", "db-id", str(now[0])),
        ("db", "db-system-id", str(now[2])),
        ("db", "db-version", f'"{now[1]}"'),
    ]
    values += [
        ("db:history", str(db_id), f'{{"db-id":{system_id},"db-version":"{version}"}}')
        for db_id, version, system_id in history
    ]
    lines: list[str] = []
    section = None
    for s, key, value in values:
        if s != section:
            if section is not None:
                lines.append("")
            lines.append(f"[{s}]")
            section = s
        lines.append(f"{key}={value}")
    lines += ["", "[backrest]", f'backrest-checksum="{info_checksum(values)}"', ""]
    return "\n".join(lines).encode()


def compress(data: bytes, compression: str | None) -> bytes:
    """``data`` compressed as pgBackRest's ``archive-push`` does with
    ``compress-type`` ``compression`` (None: ``none``): a gzip stream, a bzip2
    stream, an lz4 frame with a content checksum and no content size (the ``lz4``
    module, else the ``lz4`` program), a zstd frame without a content size."""
    if compression is None:
        return data
    if compression == "gz":
        return gzip.compress(data, mtime=0)
    if compression == "bz2":
        return bz2.compress(data)
    if compression == "zst":
        zstandard = importlib.import_module("zstandard")
        packed: bytes = zstandard.ZstdCompressor(write_content_size=False).compress(data)
        return packed
    if compression == "lz4":
        try:
            frame = importlib.import_module("lz4.frame")
        except ImportError:
            program = shutil.which("lz4")
            if program is None:
                raise ConfigurationError(
                    "no lz4 module or program", hint="pip install lz4"
                ) from None
            return subprocess.run(
                [program, "-c", "-q"],  # a frame with a content checksum, no size
                input=data,
                capture_output=True,
                check=True,
            ).stdout
        out: bytes = frame.compress(data, content_checksum=True, store_size=False)
        return out
    raise ValueError(f"pgBackRest has no compress-type {compression!r}")


class RepoBuilder:
    """A pgBackRest repository at ``root`` (``repo1-path``) built by hand, stanza
    ``stanza``: :meth:`create` writes ``archive.info`` (as ``stanza-create``),
    :meth:`push` a WAL file (as ``archive-push``)."""

    def __init__(self, root: str | os.PathLike[str], stanza: str = "main") -> None:
        self.root = Path(root)
        self.stanza = stanza

    @property
    def archive_dir(self) -> Path:
        """``<root>/archive/<stanza>``."""
        return self.root / "archive" / self.stanza

    def create(
        self, history: Sequence[tuple[int, str, int]], *, current: int | None = None
    ) -> None:
        """Write ``archive.info`` and ``archive.info.copy`` (see
        :func:`archive_info_bytes`)."""
        self.archive_dir.mkdir(parents=True, exist_ok=True)
        data = archive_info_bytes(history, current=current)
        for name in (ARCHIVE_INFO, f"{ARCHIVE_INFO}.copy"):
            (self.archive_dir / name).write_bytes(data)

    def path_of(self, archive_id: str, name: str, data: bytes, compression: str | None) -> Path:
        """Where ``archive-push`` puts WAL file ``name`` with content ``data``."""
        base = self.archive_dir / archive_id
        if len(name) >= 24 and not name.endswith(".history"):
            base = base / name[:16]
        if name.endswith((".history", ".backup")):
            return base / name
        sha1 = hashlib.sha1(data, usedforsecurity=False).hexdigest()
        return base / f"{name}-{sha1}{'.' + compression if compression else ''}"

    def push(
        self,
        name: str,
        data: bytes,
        *,
        archive_id: str = "15-1",
        compression: str | None = "gz",
        replace: bool = False,
    ) -> Path:
        """Store WAL file ``name`` (its content ``data``) as ``archive-push`` does: a
        segment under its SHA-1, compressed; a ``.history`` or ``.backup`` file as
        it is. ``replace``: remove the copies of ``name`` there first (a test's way
        to rewrite a file; ``archive-push`` never does). Written aside and renamed."""
        plain = name.endswith((".history", ".backup"))
        path = self.path_of(archive_id, name, data, None if plain else compression)
        path.parent.mkdir(parents=True, exist_ok=True)
        if replace:
            for old in path.parent.glob(f"{name}-*" if not plain else name):
                old.unlink()
        tmp = path.with_name(path.name + ".pgbackrest.tmp")
        tmp.write_bytes(data if plain else compress(data, compression))
        os.replace(tmp, path)
        return path


def pgbackrest_config(
    path: str | os.PathLike[str],
    *,
    stanza: str,
    repo: Mapping[str, str],
    pg1_path: str | os.PathLike[str],
    work: str | os.PathLike[str],
    extra: Mapping[str, str] | None = None,
    stanza_options: Mapping[str, str] | None = None,
    sections: Mapping[str, Mapping[str, str]] | None = None,
) -> Path:
    """Write pgBackRest's configuration file ``path``: ``[global]`` with ``repo``'s
    ``repo1-*`` options, log and lock paths in ``work``, quiet console, ``extra``;
    ``[<stanza>]`` with ``pg1-path`` and ``stanza_options``; then ``sections``
    (e.g. ``{"global:archive-get": {...}}``: one command's options). Mode 0640 (it
    may hold an S3 key: the tests' own)."""
    work = Path(work)
    for sub in ("log", "lock", "spool"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    options = {
        **repo,
        "log-path": str(work / "log"),
        "lock-path": str(work / "lock"),
        "spool-path": str(work / "spool"),
        "log-level-console": "warn",
        "log-level-stderr": "error",
        "log-level-file": "detail",
        **(extra or {}),
    }
    text = "[global]\n" + "".join(f"{k}={v}\n" for k, v in options.items())
    text += f"\n[{stanza}]\npg1-path={pg1_path}\n"
    text += "".join(f"{k}={v}\n" for k, v in (stanza_options or {}).items())
    for name, values in (sections or {}).items():
        text += f"\n[{name}]\n" + "".join(f"{k}={v}\n" for k, v in values.items())
    out = Path(path)
    out.write_text(text)
    out.chmod(0o640)
    return out
