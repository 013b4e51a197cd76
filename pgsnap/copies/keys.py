"""The key that encrypts copies: 32 secret bytes the user holds, in a key file.

A :class:`CopyKey` is read from a file of 64 hex digits (what
:meth:`CopyKey.generate` writes, mode 0600; ``pgsnap copy-key generate
PATH``). A file that group or others may read, or that does not hold exactly
32 bytes of hex, is refused with a :class:`~pgsnap.errors.ConfigurationError`
that says how to fix it. The secret never leaves the object: its ``repr``
and ``str`` show only the key's :attr:`~CopyKey.fingerprint`, it cannot be
pickled, and pgsnap's plans carry the key file's path, never its content.

Three values are derived from the secret by HKDF-SHA256 (RFC 5869, no salt,
one ``info`` each), so none of them tells anything about another:

- the **chunk id key**: with a key a chunk's id is HMAC-SHA256(id key,
  content) instead of its SHA-256, so the names of the objects in a target
  tell nothing about their content (nobody without the key can check whether
  a target holds a given file), and copies made with the same key still
  share their chunks;
- the **AES-256-GCM key** that seals chunks and manifests
  (:meth:`CopyKey.encrypt`: a random 96-bit nonce per object, the object's
  name as associated data, so a sealed object moved under another name does
  not open);
- the **fingerprint**: 16 hex digits that name the key in manifests,
  catalog records and messages ("copy X is encrypted with key <fingerprint>").

AES-GCM comes from the ``cryptography`` package (``pip install
'pgsnap[encrypt]'``), imported when a key is made, not when pgsnap is.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib
import os
import stat
from pathlib import Path
from typing import Any, Final, NoReturn

from pgsnap.errors import ConfigurationError

__all__ = ["KEY_BYTES", "NONCE_BYTES", "TAG_BYTES", "CopyKey", "hkdf_sha256"]

KEY_BYTES: Final = 32
"""The length of a copy key's secret: 256 bits."""
NONCE_BYTES: Final = 12
"""The AES-GCM nonce stored before each sealed object (random, 96 bits)."""
TAG_BYTES: Final = 16
"""The AES-GCM authentication tag at the end of each sealed object."""

_INFO_CHUNK_ID: Final = b"pgsnap copy key 1: chunk id"
_INFO_AEAD: Final = b"pgsnap copy key 1: aes-256-gcm"
_INFO_FINGERPRINT: Final = b"pgsnap copy key 1: fingerprint"
_FINGERPRINT_BYTES: Final = 8
_FILE_HINT: Final = (
    "create one with `pgsnap copy-key generate PATH` and name it in [copies] key_file"
)


def hkdf_sha256(secret: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``secret`` with no salt (a string of zeros) and
    ``info``: ``length`` bytes, 1 to 8160 (255 blocks)."""
    if not 0 < length <= 255 * 32:
        raise ConfigurationError(f"HKDF-SHA256 gives 1 to {255 * 32} bytes, not {length}")
    prk = hmac.new(b"\0" * 32, secret, hashlib.sha256).digest()
    out = b""
    block = b""
    counter = 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def _aesgcm_class() -> Any:
    try:
        module = importlib.import_module("cryptography.hazmat.primitives.ciphers.aead")
    except ImportError:
        raise ConfigurationError(
            "encrypted copies need the cryptography package",
            hint="pip install 'pgsnap[encrypt]'",
        ) from None
    return module.AESGCM


def _invalid_tag() -> type[Exception]:
    module = importlib.import_module("cryptography.exceptions")
    cls: type[Exception] = module.InvalidTag
    return cls


class CopyKey:
    """A key that encrypts copies (see the module docstring).

    Make one with :meth:`from_file` (a key file the user holds), or
    :meth:`generate` (a new key file). ``CopyKey(secret)`` takes the 32 bytes
    themselves. Two keys are equal when their secrets are.
    """

    __slots__ = ("_aead", "_fingerprint", "_id_key", "_source")

    def __init__(self, secret: bytes, *, source: str = "") -> None:
        if not isinstance(secret, bytes) or len(secret) != KEY_BYTES:
            raise ConfigurationError(
                f"a copy key is {KEY_BYTES} bytes"
                + (f" ({source} does not hold that)" if source else ""),
                hint=_FILE_HINT,
            )
        self._id_key = hkdf_sha256(secret, _INFO_CHUNK_ID)
        self._aead = _aesgcm_class()(hkdf_sha256(secret, _INFO_AEAD))
        self._fingerprint = hkdf_sha256(secret, _INFO_FINGERPRINT, _FINGERPRINT_BYTES).hex()
        self._source = source

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> CopyKey:
        """The key in the key file ``path``: 64 hex digits (blank space around them
        ignored). Refused (:class:`~pgsnap.errors.ConfigurationError`) when the file
        is missing, is not a regular file, may be read by group or others, or does
        not hold a key."""
        where = os.fspath(path)
        try:
            fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ConfigurationError(
                f"the copy key file {where} does not exist", hint=_FILE_HINT
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"the copy key file {where} cannot be opened: {exc.strerror or exc}",
                hint="give pgsnap read access to it (mode 0600, owned by the user pgsnap "
                "runs as); a key file must not be a symbolic link",
            ) from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ConfigurationError(
                    f"the copy key file {where} is not a regular file", hint=_FILE_HINT
                )
            if st.st_mode & 0o077:
                raise ConfigurationError(
                    f"the copy key file {where} may be read by others "
                    f"(mode {stat.S_IMODE(st.st_mode):04o})",
                    hint=f"chmod 600 {where}: a key that others can read protects nothing",
                )
            raw = f.read(4 * KEY_BYTES + 1)
        try:
            secret = bytes.fromhex(raw.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            secret = b""
        if len(secret) != KEY_BYTES:
            raise ConfigurationError(
                f"the copy key file {where} does not hold a copy key ({2 * KEY_BYTES} hex digits)",
                hint=_FILE_HINT,
            )
        return cls(secret, source=where)

    @classmethod
    def generate(cls, path: str | os.PathLike[str]) -> CopyKey:
        """A new random key, written to the new file ``path`` (mode 0600; refused,
        :class:`~pgsnap.errors.ConfigurationError`, when ``path`` exists)."""
        where = os.fspath(path)
        secret = os.urandom(KEY_BYTES)
        key = cls(secret, source=where)  # cryptography missing: fails before any file
        try:
            fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise ConfigurationError(
                f"{where} exists: a key file is never overwritten",
                hint="choose another path (overwriting a key loses every copy made with it)",
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"cannot create the copy key file {where}: {exc.strerror or exc}",
                hint="choose a directory you may write to",
            ) from None
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)  # whatever the umask
                f.write(secret.hex().encode("ascii") + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(where)
            raise
        with contextlib.suppress(OSError):
            dfd = os.open(Path(where).parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return key

    @property
    def fingerprint(self) -> str:
        """16 hex digits that name the key (derived from it; they do not reveal it)."""
        return self._fingerprint

    @property
    def source(self) -> str:
        """The key file it was read from ("" when made from bytes)."""
        return self._source

    def chunk_id(self, data: bytes | memoryview) -> str:
        """The id of a chunk of ``data`` in a copy encrypted with this key: the
        HMAC-SHA256 of the content with the chunk id key, in hex."""
        return hmac.new(self._id_key, data, hashlib.sha256).hexdigest()

    def hasher(self) -> hmac.HMAC:
        """An HMAC-SHA256 with the chunk id key to feed a content piece by piece: its
        ``hexdigest()`` is :meth:`chunk_id` of the whole."""
        return hmac.new(self._id_key, digestmod=hashlib.sha256)

    def encrypt(self, plaintext: bytes, associated: bytes) -> bytes:
        """``plaintext`` sealed with AES-256-GCM: a random nonce, then the ciphertext
        and its tag; ``associated`` (the object's name) is authenticated, not stored."""
        nonce = os.urandom(NONCE_BYTES)
        sealed: bytes = self._aead.encrypt(nonce, plaintext, associated)
        return nonce + sealed

    def decrypt(self, sealed: bytes, associated: bytes) -> bytes | None:
        """What :meth:`encrypt` sealed, or None when ``sealed`` does not authenticate
        with this key and ``associated`` (another key, another name, or altered)."""
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            return None
        try:
            plain: bytes = self._aead.decrypt(
                sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated
            )
        except _invalid_tag():
            return None
        return plain

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CopyKey):
            return NotImplemented
        return hmac.compare_digest(self._id_key, other._id_key)

    def __hash__(self) -> int:
        return hash(self._fingerprint)

    def __repr__(self) -> str:
        return f"CopyKey(fingerprint={self._fingerprint!r})"

    def __str__(self) -> str:
        return f"copy key {self._fingerprint}"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a CopyKey is not pickled (it would write the key out): load it from its "
            "key file where it is needed"
        )
