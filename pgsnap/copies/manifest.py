"""The manifest of a copy: every file of a backup's trees, and the chunks that hold them.

A copy is a manifest plus content-addressed chunks in a copy target. The
manifest names the backup, the trees copied (a name each: ``pgdata``, a
tablespace, the WAL from the backup's start to its stop), and for every
entry of every tree its kind, mode, owner, time and, for a file, its size,
its SHA-256 and the ids of its chunks in order. A chunk's id is the SHA-256
of its content, so a chunk already in the target is never sent again and
every copy is restorable on its own.

The JSON is versioned (``{"format": "pgsnap-copy-manifest", "version": 1}``);
a reader refuses another major format with :class:`~pgsnap.errors.FormatError`.
:meth:`Manifest.digest` is the SHA-256 of the exact JSON text, recorded
with the copy so a changed manifest is noticed.

A copy encrypted with a :class:`~pgsnap.copies.keys.CopyKey` names its key
(``key``: the fingerprint) and its chunks by their keyed ids, and its manifest
is stored sealed (file names, sizes and the backup label are worth
hiding): ``pgsnap-sealed-manifest:1:<fingerprint>:<base64>``, the base64 of
the AES-256-GCM sealing of the JSON with ``pgsnap manifest <copy id>`` as
associated data (a sealed manifest put under another copy's name does not
open). :meth:`Manifest.digest` stays the SHA-256 of the JSON, so the
catalog's records mean the same with or without a key. Manifests are written
and read through one pair of functions, :func:`encode_manifest` and
:func:`decode_manifest`, which know both forms.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import ConfigurationError, CopyKeyError, FormatError

if TYPE_CHECKING:
    from pgsnap.copies.keys import CopyKey

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "SEALED_PREFIX",
    "WAL_TREE",
    "EntryKind",
    "FileEntry",
    "Manifest",
    "check_chunk_id",
    "check_copy_id",
    "check_marker_name",
    "decode_manifest",
    "encode_manifest",
    "is_chunk_id",
    "is_copy_id",
    "is_marker_name",
    "is_sealed",
    "sealed_fingerprint",
]

MANIFEST_FORMAT: Final = "pgsnap-copy-manifest"
MANIFEST_VERSION: Final = 1
SEALED_PREFIX: Final = "pgsnap-sealed-manifest:"
"""How the stored text of a manifest sealed with a copy key begins."""
_SEALED_VERSION: Final = "1"
_FINGERPRINT: Final = re.compile(r"[0-9a-f]{16}")
WAL_TREE: Final = "pg_wal"
"""The tree of a copy that holds the backup's WAL files (from the archive, each under
its segment or history file name, decompressed): written into the restored data
directory's ``pg_wal``."""

_CHUNK_ID: Final = re.compile(r"[0-9a-f]{64}")
_COPY_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MARKER_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,159}")

MARKER_GONE_HINT: Final = (
    "the marker is gone: the copy or garbage collection it stood for has ended"
)
"""The hint of :class:`~pgsnap.errors.CopyNotFound` for a marker that is absent."""


def is_chunk_id(value: object) -> bool:
    """True for a chunk id: 64 lower-case hex digits (a SHA-256)."""
    return isinstance(value, str) and _CHUNK_ID.fullmatch(value) is not None


def is_copy_id(value: object) -> bool:
    """True for a copy id: letters, digits, ``.``, ``_`` and ``-``, at most 128, not
    starting with punctuation (it names a file or an object key)."""
    return isinstance(value, str) and _COPY_ID.fullmatch(value) is not None


def check_chunk_id(chunk: str) -> str:
    """``chunk``, or a ConfigurationError when it is not a chunk id (before it names a file)."""
    if not is_chunk_id(chunk):
        raise ConfigurationError(
            f"{chunk!r} is not a chunk id", hint="a chunk id is 64 lower-case hex digits"
        )
    return chunk


def check_copy_id(copy_id: str) -> str:
    """``copy_id``, or a ConfigurationError when it is not a copy id."""
    if not is_copy_id(copy_id):
        raise ConfigurationError(
            f"{copy_id!r} is not a copy id",
            hint="letters, digits, '.', '_' and '-' only, at most 128",
        )
    return copy_id


def is_marker_name(value: object) -> bool:
    """True for a marker name: spelled like a copy id, at most 160 characters (room
    for ``pending.<copy id>``)."""
    return isinstance(value, str) and _MARKER_NAME.fullmatch(value) is not None


def check_marker_name(name: str) -> str:
    """``name``, or a ConfigurationError when it is not a marker name."""
    if not is_marker_name(name):
        raise ConfigurationError(
            f"{name!r} is not a marker name",
            hint="letters, digits, '.', '_' and '-' only, at most 160, not starting "
            "with punctuation",
        )
    return name


class EntryKind(enum.Enum):
    """What an entry of a tree is."""

    DIRECTORY = "dir"
    FILE = "file"
    SYMLINK = "symlink"


def _relative(value: str) -> str:
    """A tree-relative POSIX path: ``""`` (the tree's top) or components without ``..``."""
    if value == "":
        return value
    parts = value.split("/")
    if value.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in value:
        raise FormatError(
            f"manifest path {value!r} is not a relative path inside its tree",
            hint="the manifest is damaged or was not written by pgsnap",
        )
    return value


@frozen
class FileEntry:
    """One entry of a copied tree.

    ``path`` is relative to the tree (``""`` is the tree's top directory);
    ``mode`` holds the permission bits (with set-id and sticky bits);
    ``mtime_ns`` the modification time. A file has ``size``, ``sha256`` and
    its ``chunks`` in order; a symbolic link its ``link`` target.
    """

    tree: str
    path: str = attrs.field(converter=_relative)
    kind: EntryKind
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    sha256: str | None = None
    chunks: tuple[str, ...] = ()
    link: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON values (keys that do not apply left out)."""
        out: dict[str, Any] = {
            "tree": self.tree,
            "path": self.path,
            "kind": self.kind.value,
            "mode": self.mode,
            "uid": self.uid,
            "gid": self.gid,
            "mtime_ns": self.mtime_ns,
        }
        if self.kind is EntryKind.FILE:
            out.update(size=self.size, sha256=self.sha256, chunks=list(self.chunks))
        if self.kind is EntryKind.SYMLINK:
            out["link"] = self.link
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str) -> FileEntry:
        """An entry from :meth:`to_dict`'s shape; :class:`FormatError` naming ``where``."""
        try:
            kind = EntryKind(data["kind"])
            entry = cls(
                tree=_text(data["tree"], f"{where}.tree"),
                path=_text(data["path"], f"{where}.path"),
                kind=kind,
                mode=_int(data["mode"], f"{where}.mode"),
                uid=_int(data["uid"], f"{where}.uid"),
                gid=_int(data["gid"], f"{where}.gid"),
                mtime_ns=_int(data["mtime_ns"], f"{where}.mtime_ns"),
                size=_int(data.get("size", 0), f"{where}.size"),
                sha256=data.get("sha256"),
                chunks=tuple(data.get("chunks", ())),
                link=data.get("link"),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise FormatError(
                f"manifest {where} is malformed: {exc}",
                hint="the manifest is damaged or was not written by pgsnap",
            ) from exc
        if kind is EntryKind.FILE and (
            not is_chunk_id(entry.sha256) or not all(map(is_chunk_id, entry.chunks))
        ):
            raise FormatError(
                f"manifest {where} has a malformed checksum or chunk id",
                hint="the manifest is damaged or was not written by pgsnap",
            )
        if kind is EntryKind.SYMLINK and not isinstance(entry.link, str):
            raise FormatError(f"manifest {where} is a symbolic link without a target")
        return entry


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where} is not text")
    return value


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} is not a whole number")
    return value


@frozen
class Manifest:
    """What one copy holds (see the module docstring).

    ``trees`` names the trees in the order they were copied; ``files`` maps
    names of small whole files kept beside them (``backup_label``,
    ``tablespace_map``) to their text. ``chunk_size`` is the size of every
    chunk but a file's last; ``codec`` how chunks were compressed when written
    (each stored chunk also says so itself). ``key_fingerprint`` names the copy
    key the copy is encrypted with ("" : not encrypted).
    """

    copy_id: str
    backup_id: str
    created_at: dt.datetime
    chunk_size: int
    codec: str
    trees: tuple[str, ...]
    entries: tuple[FileEntry, ...]
    files: Mapping[str, str] = attrs.field(factory=dict)
    key_fingerprint: str = ""

    def chunk_ids(self) -> frozenset[str]:
        """Every chunk the copy needs."""
        return frozenset(c for e in self.entries for c in e.chunks)

    def entries_of(self, tree: str) -> Iterator[FileEntry]:
        """The entries of one tree, in manifest order (parents before children)."""
        return (e for e in self.entries if e.tree == tree)

    @property
    def size(self) -> int:
        """Bytes of file content the copy holds (before compression)."""
        return sum(e.size for e in self.entries if e.kind is EntryKind.FILE)

    def to_json(self) -> str:
        """The manifest as JSON text (keys sorted: the same manifest, the same text)."""
        doc = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "copy_id": self.copy_id,
            "backup_id": self.backup_id,
            "created_at": self.created_at.isoformat(),
            "chunk_size": self.chunk_size,
            "codec": self.codec,
            "trees": list(self.trees),
            "files": dict(sorted(self.files.items())),
            "entries": [e.to_dict() for e in self.entries],
        }
        if self.key_fingerprint:  # left out unencrypted: the JSON of older copies stays
            doc["key"] = self.key_fingerprint
        return json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n"

    def digest(self) -> str:
        """The SHA-256 of :meth:`to_json`."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """A manifest from :meth:`to_json`; :class:`FormatError` when it is not one."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise FormatError(
                f"a copy manifest is not JSON: {exc}",
                hint="the manifest is damaged; copy the backup again",
            ) from exc
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise FormatError(
                "not a pgsnap copy manifest",
                hint="the target holds something else under that name",
            )
        if doc.get("version") != MANIFEST_VERSION:
            raise FormatError(
                f"copy manifest version {doc.get('version')!r} is not supported "
                f"(this pgsnap reads version {MANIFEST_VERSION})",
                hint="read it with the pgsnap release that wrote it, or a newer one",
            )
        try:
            created = dt.datetime.fromisoformat(_text(doc["created_at"], "created_at"))
            files = doc.get("files", {})
            if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
                raise TypeError("files is not a mapping of names to text")
            entries = doc["entries"]
            if not isinstance(entries, list):
                raise TypeError("entries is not a list")
            manifest = cls(
                copy_id=_text(doc["copy_id"], "copy_id"),
                backup_id=_text(doc["backup_id"], "backup_id"),
                created_at=created,
                chunk_size=_int(doc["chunk_size"], "chunk_size"),
                codec=_text(doc["codec"], "codec"),
                trees=tuple(_text(t, "trees[]") for t in doc["trees"]),
                entries=tuple(
                    FileEntry.from_dict(e, f"entries[{i}]") for i, e in enumerate(entries)
                ),
                files=dict(files),
                key_fingerprint=_text(doc.get("key", ""), "key"),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise FormatError(
                f"a copy manifest is malformed: {exc}",
                hint="the manifest is damaged or was not written by pgsnap",
            ) from exc
        unknown = {e.tree for e in manifest.entries} - set(manifest.trees)
        if unknown:
            raise FormatError(f"a copy manifest names trees it does not list: {sorted(unknown)}")
        return manifest


def is_sealed(text: str) -> bool:
    """True when ``text`` (a manifest as stored) is sealed with a copy key."""
    return text.startswith(SEALED_PREFIX)


def _associated(copy_id: str) -> bytes:
    return f"pgsnap manifest {copy_id}".encode()


def encode_manifest(manifest: Manifest, key: CopyKey | None = None) -> str:
    """The text to store for ``manifest``: its JSON, or sealed with ``key`` (which
    must be the key the manifest names)."""
    fingerprint = key.fingerprint if key is not None else ""
    if manifest.key_fingerprint != fingerprint:
        raise ConfigurationError(
            f"the manifest of copy {manifest.copy_id} names key "
            f"{manifest.key_fingerprint or '(none)'} and is written with "
            f"{fingerprint or 'no key'}",
            hint="write a manifest with the key its chunks were encrypted with",
        )
    text = manifest.to_json()
    if key is None:
        return text
    sealed = key.encrypt(text.encode(), _associated(manifest.copy_id))
    return (
        f"{SEALED_PREFIX}{_SEALED_VERSION}:{fingerprint}:"
        f"{base64.b64encode(sealed).decode('ascii')}\n"
    )


def sealed_fingerprint(text: str) -> str:
    """The fingerprint of the key a sealed manifest's text names ("" : not sealed)."""
    if not is_sealed(text):
        return ""
    parts = text[len(SEALED_PREFIX) :].split(":", 2)
    return parts[1] if len(parts) == 3 and _FINGERPRINT.fullmatch(parts[1]) else ""


def decode_manifest(text: str, copy_id: str, key: CopyKey | None = None) -> Manifest:
    """The manifest of copy ``copy_id`` from its stored ``text``, plain or sealed.

    A sealed manifest needs ``key``: without one, or with another key,
    :class:`~pgsnap.errors.CopyKeyError` names the key it needs (by its
    fingerprint); one that does not authenticate (altered, or moved from another
    copy's name) is a :class:`~pgsnap.errors.FormatError`. A plain manifest reads
    with or without a key.
    """
    if not is_sealed(text):
        manifest = Manifest.from_json(text)
        if manifest.key_fingerprint:
            raise FormatError(
                f"the manifest of copy {copy_id} names key {manifest.key_fingerprint} "
                "but is not sealed: it was altered",
                hint="verify the copy (pgsnap verify-copy); restore from another copy",
            )
        return manifest
    parts = text[len(SEALED_PREFIX) :].strip().split(":", 2)
    if len(parts) != 3 or not _FINGERPRINT.fullmatch(parts[1]):
        raise FormatError(
            f"the sealed manifest of copy {copy_id} is malformed",
            hint="the manifest is damaged; copy the backup again",
        )
    version, fingerprint, body = parts
    if version != _SEALED_VERSION:
        raise FormatError(
            f"the sealed manifest of copy {copy_id} has version {version!r} "
            f"(this pgsnap reads version {_SEALED_VERSION})",
            hint="read it with the pgsnap release that wrote it, or a newer one",
        )
    if key is None:
        raise CopyKeyError(
            f"copy {copy_id} is encrypted with key {fingerprint}: give [copies] key_file",
            hint=f"set [copies] key_file to the key file of fingerprint {fingerprint} "
            "(the key the copy was made with); without it the copy cannot be read",
            copy_id=copy_id,
            fingerprint=fingerprint,
        )
    if key.fingerprint != fingerprint:
        raise CopyKeyError(
            f"copy {copy_id} is encrypted with key {fingerprint}, not with the key given "
            f"({key.fingerprint}{', ' + key.source if key.source else ''})",
            hint=f"set [copies] key_file to the key file of fingerprint {fingerprint}",
            copy_id=copy_id,
            fingerprint=fingerprint,
            given=key.fingerprint,
        )
    try:
        sealed = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        sealed = b""
    plain = key.decrypt(sealed, _associated(copy_id))
    if plain is None:
        raise FormatError(
            f"the manifest of copy {copy_id} does not authenticate with key {fingerprint}: "
            "it was damaged or altered, or is another copy's",
            hint="verify the copy (pgsnap verify-copy); restore from another copy",
        )
    try:
        json_text = plain.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"the manifest of copy {copy_id} is not text: {exc}") from None
    manifest = Manifest.from_json(json_text)
    if manifest.key_fingerprint != fingerprint or manifest.copy_id != copy_id:
        raise FormatError(
            f"the sealed manifest of copy {copy_id} names another copy or key",
            hint="the manifest was altered; restore from another copy",
        )
    return manifest
