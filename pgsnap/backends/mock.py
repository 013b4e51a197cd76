"""``mock``: a stateful in-memory :class:`~pgsnap.protocols.StorageBackend`.

It follows the protocol's contract exactly (it passes
:mod:`pgsnap.testing.conformance`) and is what unit tests, executor tests, the
demo and the end-to-end tests with a real PostgreSQL server run against.

Volumes come in two kinds:

- **in memory** (:meth:`MockBackend.add_volume` without ``path``): the content
  is a dict of blobs (:meth:`~MockBackend.write_blob` / :meth:`~MockBackend.read_blob`).
  :meth:`~MockBackend.locate` gives a device ``/dev/pgsnap-mock/<id>`` that
  never exists on any host: in-memory volumes are for unit tests;
- **directory-backed** (``path=``): the volume is a host directory. A snapshot
  is a full copy of the tree (owners, modes, symlinks and times kept) under
  ``root/snapshots/<id>`` (mode 0700); restoring empties the directory (never
  following a symlink out of it) and copies the snapshot back, keeping the
  directory itself, its owner and mode.

Two modes decide how a host reaches a directory-backed volume and what a
restore asks of it (:meth:`~MockBackend.locate`,
:meth:`~MockBackend.restore_profile`):

- **directories** (the default): the host uses the directory itself
  (:meth:`~pgsnap.model.Location.directory`); nothing is done on the host
  before a restore, which copies the snapshot back in place and keeps it;
- **block** (``block=True``, needs ``MAPPING``): each directory-backed volume
  is a simulated block device whose content lives in its directory (the
  "LUN": the host must not use it directly; :attr:`StorageVolume.path
  <pgsnap.model.StorageVolume.path>` is then None and ``extra["lun"]`` names
  it). :meth:`~MockBackend.locate` gives the device ``root/dev/<id>``, which
  exists only while the volume is attached to at least one host
  (:meth:`~MockBackend.attach` makes it a symlink to the LUN,
  :meth:`~MockBackend.detach` of the last host removes it). A restore needs
  the volume detached first (``RestoreProfile(before=DETACH)``): restoring an
  attached volume fails. :meth:`~MockBackend.simulated_host` gives a
  :class:`~pgsnap.host.Host` that mounts these devices (see
  :mod:`pgsnap.backends.mock_host`); detaching a mounted volume fails, as a
  storage array refuses to unmap a volume in use.

With ``async_restore=True`` a restore completes later
(``RestoreProfile.completes_later``): :meth:`~MockBackend.restore_volume`
leaves the volume *restoring* (its content is already copied) and
:meth:`~MockBackend.attach`, :meth:`~MockBackend.create_snapshot_group` and
another restore of it are refused until :meth:`~MockBackend.wait_for_restore`
completes it. Without it, ``wait_for_restore`` returns at once.

With ``state_file=``, the state (the mode, volumes and whether they are
restoring, snapshots and where their copies live, groups, policies, id
counters, the simulated host's mount table) is kept in a JSON file: read at
construction and before every call, written atomically (mode 0600) after
every change, under an ``fcntl`` lock, so successive ``pgsnap`` commands (and
concurrent processes) share one mock. The mode is fixed when the file is
created; a backend constructed with another mode over it is refused. The
file format is versioned (``{"format": "pgsnap-mock-state", "version": 3}``);
older files are migrated when read and written back as version 3 with the
next change: version 1 (before block mode) gets directories mode, nothing
restoring, nothing mounted; version 2 (before copies were recorded) no copy
under way. ``volumes=`` declares volumes (added once, by id), e.g. from a
TOML configuration.

A process killed in the middle of a copy (a directory volume into
``root/snapshots/<id>``, a snapshot into a clone) leaves a half copy; it
never wedges the mock. Every copy runs inside one call, holding the state
file's exclusive lock from start to end. Once its directory is created and
before anything is copied into it, the copy is recorded in the state
(``copying``: the snapshot or clone id, the directory with its device and
inode, the process id and start time) and the state is saved: the id (its
counter) is thus allocated durably and never handed out twice (a call that
fails cleanly removes its copies and takes its ids back, as no caller saw
them). The save that ends the call drops the record, with the snapshot or
clone recorded in the same write. A record that is
still there when a process next takes the exclusive lock (a backend being
constructed, or any call that changes the state) therefore belongs to a
process that died copying: the kernel released its lock, and no live process
can be copying while the lock is held. Its directory is removed (if it is
still the directory the copy created) with a warning naming it, and the
record dropped. No half copy is ever listed: a snapshot enters the state
only complete. A directory under ``root/snapshots`` or ``root/clones`` that
the state does not know (left by a copy killed before state version 3, or
by another mock sharing the root) is not the state's to remove: its id is
skipped, with a warning, and it stays.

Ids are deterministic: ``vol-0001``, ``snap-0001``, ``cg-0001``, ``pol-0001``
(clones are volumes). Capabilities can be reduced to imitate a simpler storage:
a method needing one that was not granted raises
:class:`~pgsnap.errors.UnsupportedCapability`; without ``CONSISTENCY_GROUPS``,
:meth:`~MockBackend.create_snapshot_group` snapshots the volumes one after the
other, so their ``created_at`` differ, as a storage without consistency groups does.

With ``snapshot_limit=N`` the mock imitates a storage that allows N
snapshots per volume (a PowerFlex V-Tree: 126, 1022 on 5.x; one tree per
volume here): a group that would give a volume more than N snapshots is
refused before anything is taken with
:class:`~pgsnap.errors.SnapshotLimitError` (as PowerFlex's
``PowerFlexSnapshotLimit``), and :meth:`~MockBackend.storage_problems` (the
optional :class:`~pgsnap.protocols.StorageHealth`, read by ``pgsnap check``)
warns once a volume has ``limit_warn_percent`` (80 %) of N and reports an
error at N. Like the capabilities, the limit belongs to the backend object,
not to the state file.

Test hooks: :meth:`~MockBackend.inject_fault`, :meth:`~MockBackend.add_latency`,
:meth:`~MockBackend.clear_faults` and the call log :attr:`~MockBackend.calls`.
Faults fire before any state change, so a failed call changes nothing.
Vendor-only operations are named ``ex_*`` (:meth:`~MockBackend.ex_run_policy`,
:meth:`~MockBackend.ex_expire_secure`).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    MountBusyError,
    MountError,
    PgsnapError,
    SnapshotLimitError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.model import (
    Location,
    Mount,
    RestorePreparation,
    RestoreProfile,
    Severity,
    Snapshot,
    SnapshotGroup,
    SnapshotPolicy,
    StorageProblem,
    StorageVolume,
    from_dict,
    to_dict,
)
from pgsnap.protocols import STORAGE_BACKEND_METHODS, Capability

if TYPE_CHECKING:
    from pgsnap.host import Host

__all__ = ["DEFAULT_VOLUME_SIZE", "FAULT_POINTS", "MEMORY_DEVICE_DIR", "MockBackend"]

log = logging.getLogger(__name__)

DEFAULT_VOLUME_SIZE: Final = 1 << 30
"""Size reported for a volume added without ``size_bytes`` (1 GiB)."""

FAULT_POINTS: Final = frozenset(
    (
        *STORAGE_BACKEND_METHODS,
        "storage_problems",
        "ex_run_policy",
        "ex_expire_secure",
        "snapshot_volume",
    )
)
"""Names :meth:`MockBackend.inject_fault` and :meth:`MockBackend.add_latency` accept.

The protocol, ``storage_problems`` and ``ex_*`` methods, plus ``snapshot_volume``: the copy of one
volume inside :meth:`~MockBackend.create_snapshot_group` (and
:meth:`~MockBackend.ex_run_policy`), called once per volume, to fail a group
half-way through.
"""

MEMORY_DEVICE_DIR: Final = "/dev/pgsnap-mock"
"""Where :meth:`MockBackend.locate` puts in-memory volumes' devices (they never exist)."""

_NAME: Final = "mock"

HOLD_TIMEOUT: Final = 600.0
"""Seconds a held call (:meth:`MockBackend.add_hold`) waits before it fails."""
_ONE_TICK: Final = dt.timedelta(microseconds=1)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------------- internal state


@attrs.define
class _Volume:
    id: str
    name: str
    size_bytes: int
    path: Path | None
    blobs: dict[str, bytes] = attrs.Factory(dict)
    hosts: set[str] = attrs.Factory(set)
    extra: dict[str, str] = attrs.Factory(dict)
    restoring: str | None = None
    """The snapshot a restore that completes later is copying from (``async_restore``)."""

    def record(self, *, block: bool) -> StorageVolume:
        extra = dict(self.extra)
        path = None if self.path is None else str(self.path)
        if block and self.path is not None:
            extra.update(kind="block", lun=str(self.path))
            path = None  # the LUN is not for the host: it mounts the device
        if self.restoring is not None:
            extra["restoring"] = self.restoring
        return StorageVolume(
            id=self.id,
            name=self.name,
            size_bytes=self.size_bytes,
            path=path,
            mapped_hosts=tuple(sorted(self.hosts)),
            extra=extra,
        )


@attrs.define
class _Snap:
    record: Snapshot
    seq: int
    blobs: dict[str, bytes] | None = None
    home: Path | None = None
    """``root/snapshots/<id>`` (mode 0700); the copy of the volume is ``home/tree``."""
    policy_id: str | None = None

    @property
    def tree(self) -> Path:
        assert self.home is not None
        return self.home / "tree"


@attrs.define
class _Group:
    id: str
    name: str
    created_at: dt.datetime
    snapshot_ids: list[str]
    policy_id: str | None = None


@attrs.define
class _Policy:
    id: str
    name: str
    volume_ids: tuple[str, ...]
    retain: int | None
    paused: bool = False
    runs: int = 0

    def record(self) -> SnapshotPolicy:
        return SnapshotPolicy(
            id=self.id, name=self.name, volume_ids=self.volume_ids, paused=self.paused
        )


@attrs.define
class _SimMount:
    """A block volume mounted on a simulated host (:mod:`pgsnap.backends.mock_host`).

    The mount point ``target`` (absolute, symlinks not resolved) is a symlink
    to the volume's directory while mounted; ``mode``, ``uid`` and ``gid`` are
    those of the empty directory it replaced, given back on unmount.
    """

    host: str
    volume_id: str
    target: str
    mode: int
    uid: int
    gid: int


@attrs.define
class _Copy:
    """A copy into a new directory under way: recorded (and saved) before it starts.

    ``id`` is the snapshot (or clone volume) the copy is for, ``path`` the
    directory it fills (``root/snapshots/<id>``, or the clone's directory),
    created just before the record; ``dev`` and ``ino`` identify that very
    directory, so a path someone else created later is never taken for it.
    ``pid`` and ``started`` say who copied and since when (for the warning).
    The record is dropped when the call ends; one found by a process holding
    the state file's exclusive lock is the leftover of a process that died
    copying (see :meth:`MockBackend._reap_copies`).
    """

    id: str
    path: Path
    pid: int
    started: dt.datetime
    dev: int
    ino: int


@attrs.define
class _Fault:
    method: str
    skip: int
    times: int
    error: BaseException | None


# --------------------------------------------------------------------------- file trees


def _copy_meta(st: os.stat_result, dst: Path) -> None:
    """Give ``dst`` the owner, mode and times recorded in ``st`` (never following links)."""
    link = stat.S_ISLNK(st.st_mode)
    current = os.lstat(dst)
    if (current.st_uid, current.st_gid) != (st.st_uid, st.st_gid):
        os.lchown(dst, st.st_uid, st.st_gid)  # before chmod: chown clears set-id bits
    if not link:
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def _copy_entry(src: Path, dst: Path) -> None:
    """Copy one entry (recursively for directories), keeping owner, mode, times, links.

    An entry that vanishes while it is copied (a running server deletes
    temporary files and recycles WAL) is left out, as if the copy had been
    taken just after the deletion.
    """
    try:
        st = os.lstat(src)
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISDIR(mode):
            os.mkdir(dst, 0o700)
            _copy_into(src, dst)
        elif stat.S_ISREG(mode):
            shutil.copyfile(src, dst, follow_symlinks=False)
        elif stat.S_ISFIFO(mode):
            os.mkfifo(dst, 0o600)
        else:  # sockets and device nodes are not content
            log.debug("mock: not copying special file %s", src)
            return
    except FileNotFoundError as exc:
        if exc.filename is None or os.fspath(exc.filename) != os.fspath(src):
            raise
        log.debug("mock: %s vanished while copying; left out", src)
        if dst.is_dir() and not dst.is_symlink():
            shutil.rmtree(dst)
        elif os.path.lexists(dst):
            dst.unlink()
        return
    _copy_meta(st, dst)


def _copy_into(src: Path, dst: Path) -> None:
    """Copy every entry of directory ``src`` into the existing directory ``dst``."""
    with os.scandir(src) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        _copy_entry(src / name, dst / name)


def _empty_dir(path: Path) -> None:
    """Remove everything inside ``path``; a symlink is removed, never followed."""
    with os.scandir(path) as entries:
        found = [(Path(e.path), e.is_dir(follow_symlinks=False)) for e in entries]
    for entry, is_dir in found:
        if is_dir:
            shutil.rmtree(entry)  # does not follow symlinks inside the tree
        else:
            entry.unlink()


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def _mount_point(path: str, mode: int, uid: int, gid: int) -> None:
    """Create the empty directory a simulated mount replaced, with its mode and owner."""
    os.mkdir(path, 0o700)
    if (uid, gid) != (os.geteuid(), os.getegid()):
        os.chown(path, uid, gid)  # before chmod: chown clears set-id bits
    os.chmod(path, mode)


def _blob_path(root: Path, key: str) -> Path:
    rel = PurePosixPath(key)
    if not key or rel.is_absolute() or ".." in rel.parts or rel == PurePosixPath("."):
        raise ConfigurationError(
            f"invalid blob key {key!r} for a directory volume",
            hint="use a relative path inside the volume, without '..'",
            key=key,
        )
    return root.joinpath(*rel.parts)


# --------------------------------------------------------------------------- configuration

_STATE_FORMAT: Final = "pgsnap-mock-state"
_STATE_VERSION: Final = 3
"""Version 2 added the mode (block, async_restore), restoring volumes and the mount table;
version 3 the copies under way (``copying``)."""
_WRITE_HINT: Final = "check the permissions and free space of the state file's directory"
_CORRUPT_HINT: Final = (
    "restore the file from a copy, or move it away to start with an empty mock "
    "(the snapshot copies under the mock's root are then forgotten: remove them too)"
)
_SPEC_KEYS: Final = frozenset({"id", "name", "path", "size_bytes"})


def _capabilities(values: Iterable[Capability | str] | None) -> frozenset[Capability]:
    """Capabilities given as members or their values (``"clones"``: from a TOML file)."""
    if values is None:
        return frozenset(Capability)
    if isinstance(values, str):
        values = [values]
    caps: set[Capability] = set()
    bad: list[str] = []
    for value in values:
        if isinstance(value, Capability):
            caps.add(value)
        elif isinstance(value, str) and value in Capability._value2member_map_:
            caps.add(Capability(value))
        else:
            bad.append(repr(value))
    if bad:
        raise ConfigurationError(
            f"not capabilities: {', '.join(bad)}",
            hint="pass members of pgsnap.protocols.Capability or their values: "
            + ", ".join(c.value for c in Capability),
        )
    return frozenset(caps)


@attrs.frozen
class _VolumeSpec:
    """A volume declared in the constructor's ``volumes`` (a configuration file)."""

    id: str
    name: str
    path: Path | None
    size_bytes: int


def _volume_spec(value: Mapping[str, Any], index: int) -> _VolumeSpec:
    where = f"volumes[{index}]"
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{where} must be a table with id, name and path, not {type(value).__name__}",
            hint='e.g. {id = "vol-data", name = "pgdata", path = "/pgdata"}',
        )
    unknown = sorted(set(value) - _SPEC_KEYS)
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s): {', '.join(unknown)}",
            hint=f"a volume takes {', '.join(sorted(_SPEC_KEYS))}",
        )
    vid = value.get("id")
    if not isinstance(vid, str) or not vid.strip():
        raise ConfigurationError(f"{where} needs an id (a non-empty string)")
    name = value.get("name", vid)
    path = value.get("path")
    size = value.get("size_bytes", DEFAULT_VOLUME_SIZE)
    if not isinstance(name, str):
        raise ConfigurationError(f"{where} ({vid}): name must be a string, not {name!r}")
    if path is not None and not isinstance(path, str | os.PathLike):
        raise ConfigurationError(f"{where} ({vid}): path must be a string, not {path!r}")
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigurationError(f"{where} ({vid}): size_bytes must be an integer")
    return _VolumeSpec(vid, name, None if path is None else Path(path), size)


# --------------------------------------------------------------------------- the state file


def _state_error(path: Path, what: str, *, hint: str = _CORRUPT_HINT) -> BackendError:
    return BackendError(
        f"the mock's state file {str(path)!r} {what}",
        hint=hint,
        backend=_NAME,
        state_file=str(path),
    )


def _encode_blobs(blobs: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in sorted(blobs.items())}


def _option_bool(value: object, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ConfigurationError(
        f"{name} must be true or false, not {value!r}",
        hint=f"e.g. {name} = true in the [storage.options] table",
        option=name,
    )


def _safe_volume_id(volume_id: str) -> bool:
    """True when ``volume_id`` can name a device node (one path component)."""
    return volume_id not in ("", ".", "..") and "/" not in volume_id and "\0" not in volume_id


def _within(path: Path, base: Path) -> bool:
    """True when ``path`` is ``base`` or below it, by path components."""
    return path == base or base in path.parents


def _mode_text(block: bool, async_restore: bool) -> str:
    kind = "block mode" if block else "directories mode"
    return f"{kind} with asynchronous restores" if async_restore else kind


def _decode_blobs(value: object, where: str) -> dict[str, bytes]:
    found = _dict(value, where)
    try:
        return {
            str(k): base64.b64decode(_str(v, f"{where}.{k}"), validate=True)
            for k, v in found.items()
        }
    except binascii.Error as exc:
        raise ValueError(f"{where}: bad base64: {exc}") from exc


def _dict(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where}: expected a string, got {value!r}")
    return value


def _opt_str(value: object, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}: expected an integer, got {value!r}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: expected true/false, got {value!r}")
    return value


@attrs.define
class _State:
    """Everything a state file holds."""

    mode: tuple[bool, bool]
    """``(block, async_restore)``."""
    volumes: dict[str, _Volume]
    snaps: dict[str, _Snap]
    groups: dict[str, _Group]
    policies: dict[str, _Policy]
    counters: dict[str, int]
    mounts: list[_SimMount]
    copying: list[_Copy]


def _migrate_v1(top: dict[str, Any]) -> dict[str, Any]:
    """A version 1 state as version 2: directories mode, nothing restoring, nothing mounted."""
    volumes = [
        {**v, "restoring": None} if isinstance(v, dict) else v
        for v in _list(top.get("volumes", []), "volumes")
    ]
    return {
        **top,
        "version": 2,
        "mode": {"block": False, "async_restore": False},
        "volumes": volumes,
        "mounts": [],
    }


def _migrate_v2(top: dict[str, Any]) -> dict[str, Any]:
    """A version 2 state as version 3: no copy under way.

    (A copy killed before version 3 left a directory no state records: it is
    skipped, never reused and never removed; see :meth:`MockBackend._stray`.)
    """
    return {**top, "version": 3, "copying": []}


_MIGRATIONS: Final[Mapping[object, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    1: _migrate_v1,
    2: _migrate_v2,
}


def _decode_state(data: object) -> _State:
    """The state in a state file's JSON; ``ValueError``/``TypeError``/``KeyError`` if malformed.

    Older versions are migrated, one version at a time (see :data:`_MIGRATIONS`).
    """
    top = _dict(data, "state")
    if top.get("format") != _STATE_FORMAT:
        raise ValueError(f"not a mock state file (format {top.get('format')!r})")
    version = top.get("version")
    if version in _MIGRATIONS:
        log.info("mock: migrating a version %s state file to version %d", version, _STATE_VERSION)
        while top.get("version") in _MIGRATIONS:
            top = _MIGRATIONS[top.get("version")](top)
    if top.get("version") != _STATE_VERSION:
        raise ValueError(
            f"state version {top.get('version')!r}; this pgsnap reads versions "
            f"{', '.join(str(v) for v in _MIGRATIONS)} (migrated) and {_STATE_VERSION}"
        )
    mode = _dict(top["mode"], "mode")
    block = _bool(mode["block"], "mode.block")
    async_restore = _bool(mode["async_restore"], "mode.async_restore")
    counters = {
        _str(k, "counters"): _int(v, f"counters.{k}")
        for k, v in _dict(top["counters"], "counters").items()
    }
    volumes: dict[str, _Volume] = {}
    for i, raw in enumerate(_list(top["volumes"], "volumes")):
        v = _dict(raw, f"volumes[{i}]")
        vid = _str(v["id"], f"volumes[{i}].id")
        path = _opt_str(v["path"], f"volumes[{i}].path")
        volumes[vid] = _Volume(
            vid,
            _str(v["name"], f"volumes[{i}].name"),
            _int(v["size_bytes"], f"volumes[{i}].size_bytes"),
            None if path is None else Path(path),
            blobs=_decode_blobs(v["blobs"], f"volumes[{i}].blobs"),
            hosts={_str(h, f"volumes[{i}].hosts") for h in _list(v["hosts"], "hosts")},
            extra={
                str(k): _str(x, f"volumes[{i}].extra")
                for k, x in _dict(v["extra"], "extra").items()
            },
            restoring=_opt_str(v["restoring"], f"volumes[{i}].restoring"),
        )
    snaps: dict[str, _Snap] = {}
    for i, raw in enumerate(_list(top["snapshots"], "snapshots")):
        d = _dict(raw, f"snapshots[{i}]")
        record = from_dict(Snapshot, _dict(d["record"], f"snapshots[{i}].record"))
        home = _opt_str(d["home"], f"snapshots[{i}].home")
        blobs = None if d["blobs"] is None else _decode_blobs(d["blobs"], f"snapshots[{i}].blobs")
        if (home is None) == (blobs is None):
            raise ValueError(f"snapshots[{i}] ({record.id}) needs either a home or blobs")
        snaps[record.id] = _Snap(
            record,
            _int(d["seq"], f"snapshots[{i}].seq"),
            blobs=blobs,
            home=None if home is None else Path(home),
            policy_id=_opt_str(d["policy_id"], f"snapshots[{i}].policy_id"),
        )
    groups: dict[str, _Group] = {}
    for i, raw in enumerate(_list(top["groups"], "groups")):
        g = _dict(raw, f"groups[{i}]")
        gid = _str(g["id"], f"groups[{i}].id")
        ids = [_str(x, f"groups[{i}].snapshot_ids") for x in _list(g["snapshot_ids"], "ids")]
        missing = [x for x in ids if x not in snaps]
        if missing:
            raise ValueError(f"group {gid} names unknown snapshot(s) {', '.join(missing)}")
        created = dt.datetime.fromisoformat(_str(g["created_at"], f"groups[{i}].created_at"))
        if created.tzinfo is None:
            raise ValueError(f"groups[{i}].created_at is a naive time")
        groups[gid] = _Group(
            gid,
            _str(g["name"], f"groups[{i}].name"),
            created,
            ids,
            _opt_str(g["policy_id"], f"groups[{i}].policy_id"),
        )
    policies: dict[str, _Policy] = {}
    for i, raw in enumerate(_list(top["policies"], "policies")):
        p = _dict(raw, f"policies[{i}]")
        pid = _str(p["id"], f"policies[{i}].id")
        retain = p["retain"]
        policies[pid] = _Policy(
            pid,
            _str(p["name"], f"policies[{i}].name"),
            tuple(_str(x, f"policies[{i}].volume_ids") for x in _list(p["volume_ids"], "ids")),
            None if retain is None else _int(retain, f"policies[{i}].retain"),
            paused=_bool(p["paused"], f"policies[{i}].paused"),
            runs=_int(p["runs"], f"policies[{i}].runs"),
        )
    for snap in snaps.values():
        sgid = snap.record.group_id
        if sgid is not None and sgid in groups and snap.record.id not in groups[sgid].snapshot_ids:
            raise ValueError(f"snapshot {snap.record.id} is not listed in its group {sgid}")
    mounts: list[_SimMount] = []
    for i, raw in enumerate(_list(top["mounts"], "mounts")):
        m = _dict(raw, f"mounts[{i}]")
        mount = _SimMount(
            host=_str(m["host"], f"mounts[{i}].host"),
            volume_id=_str(m["volume_id"], f"mounts[{i}].volume_id"),
            target=_str(m["target"], f"mounts[{i}].target"),
            mode=_int(m["mode"], f"mounts[{i}].mode"),
            uid=_int(m["uid"], f"mounts[{i}].uid"),
            gid=_int(m["gid"], f"mounts[{i}].gid"),
        )
        if mount.volume_id not in volumes:
            raise ValueError(f"mounts[{i}] names unknown volume {mount.volume_id}")
        mounts.append(mount)
    copying: list[_Copy] = []
    for i, raw in enumerate(_list(top["copying"], "copying")):
        c = _dict(raw, f"copying[{i}]")
        started = dt.datetime.fromisoformat(_str(c["started"], f"copying[{i}].started"))
        if started.tzinfo is None:
            raise ValueError(f"copying[{i}].started is a naive time")
        where = Path(_str(c["path"], f"copying[{i}].path"))
        if not where.is_absolute():
            raise ValueError(f"copying[{i}].path is not absolute")
        copying.append(
            _Copy(
                id=_str(c["id"], f"copying[{i}].id"),
                path=where,
                pid=_int(c["pid"], f"copying[{i}].pid"),
                started=started,
                dev=_int(c["dev"], f"copying[{i}].dev"),
                ino=_int(c["ino"], f"copying[{i}].ino"),
            )
        )
    return _State(
        (block, async_restore), volumes, snaps, groups, policies, counters, mounts, copying
    )


# --------------------------------------------------------------------------- the backend


class MockBackend:
    """A stateful in-memory storage backend with directory-backed volumes and fault injection.

    ``capabilities`` defaults to every :class:`~pgsnap.protocols.Capability`.
    ``clock`` returns the (aware) time stamped on snapshots; ``sleep`` is what
    :meth:`add_latency` waits with (inject a fake one in tests). ``root`` is
    where directory snapshots and clones live: a private temporary directory
    (mode 0700, removed by :meth:`close`) by default, created on first use;
    a given ``root`` is created with mode 0700 if missing and never removed.
    Thread-safe: one lock guards the state.

    ``state_file`` keeps the state in that JSON file (see the module
    docstring; the default ``root`` is then ``<state_file>.d``, kept);
    a corrupt file is a :class:`~pgsnap.errors.BackendError` with a hint.
    ``volumes`` is a list of mappings ``{"id", "name", "path", "size_bytes"}``
    (only ``id`` required; no ``path``: in memory) added unless their id
    exists, in which case the path must match. ``capabilities`` may also be
    given as values (``"clones"``).

    ``block=True`` makes directory-backed volumes simulated block devices
    (needs ``MAPPING``); ``async_restore=True`` makes restores complete later
    (see the module docstring). Both default to False, or, with a
    ``state_file`` that exists, to the mode it was created with; a different
    explicit value is a :class:`~pgsnap.errors.ConfigurationError`.

    ``snapshot_limit`` (None: no limit) is how many snapshots one volume may
    have; ``limit_warn_percent`` how full (in % of it) a volume's snapshot
    count is when :meth:`storage_problems` starts to warn (see the module
    docstring). ``latency`` maps method names to seconds each call waits
    (:meth:`add_latency`; from a configuration file: ``latency = {
    restore_volume = 2.0 }``), to make a long step for tests of what runs
    beside it. ``hold`` maps method names to file paths: each call of that
    method waits until its file exists (:meth:`add_hold`; ``hold = {
    create_snapshot_group = "/tmp/go" }``), so that a test decides when a
    long step ends rather than guessing how long it takes.
    """

    def __init__(
        self,
        *,
        capabilities: Iterable[Capability | str] | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        root: str | os.PathLike[str] | None = None,
        sleep: Callable[[float], None] | None = None,
        state_file: str | os.PathLike[str] | None = None,
        volumes: Iterable[Mapping[str, Any]] | None = None,
        block: bool | None = None,
        async_restore: bool | None = None,
        snapshot_limit: int | None = None,
        limit_warn_percent: float = 80.0,
        latency: Mapping[str, float] | None = None,
        hold: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> None:
        self._caps = _capabilities(capabilities)
        if snapshot_limit is not None and (
            isinstance(snapshot_limit, bool)
            or not isinstance(snapshot_limit, int)
            or snapshot_limit < 1
        ):
            raise ConfigurationError(
                f"snapshot_limit must be a positive whole number or None, not {snapshot_limit!r}",
                hint="e.g. snapshot_limit = 126 (a PowerFlex V-Tree), or leave it out: no limit",
            )
        if (
            isinstance(limit_warn_percent, bool)
            or not isinstance(limit_warn_percent, int | float)
            or not 0 < limit_warn_percent <= 100
        ):
            raise ConfigurationError(
                f"limit_warn_percent must be a number above 0 and at most 100, "
                f"not {limit_warn_percent!r}",
                hint="e.g. limit_warn_percent = 80 (warn at 80 % of snapshot_limit)",
            )
        self._snapshot_limit = snapshot_limit
        self._limit_warn = float(limit_warn_percent)
        block_arg = _option_bool(block, "block")
        async_arg = _option_bool(async_restore, "async_restore")
        if block_arg:
            self._check_block_capabilities()
        self._block = False
        self._async = False
        self._mode_settled = False
        self._file_mode: tuple[bool, bool] | None = None
        self._clock = clock or _utcnow
        self._sleep = sleep or time.sleep
        self._state_path = None if state_file is None else Path(os.path.abspath(state_file))
        if root is None and self._state_path is not None:
            # Persistent state needs persistent snapshots: never a temporary root.
            root = self._state_path.with_name(self._state_path.name + ".d")
        self._root_arg = None if root is None else Path(os.path.abspath(root))
        self._root: Path | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.RLock()
        self._state_depth = 0
        self._state_writing = False
        self._state_text: str | None = None
        self._volumes: dict[str, _Volume] = {}
        self._snaps: dict[str, _Snap] = {}
        self._groups: dict[str, _Group] = {}
        self._policies: dict[str, _Policy] = {}
        self._counters: dict[str, int] = {}
        self._mounts: list[_SimMount] = []
        self._copying: list[_Copy] = []
        self._faults: list[_Fault] = []
        self._latency: dict[str, float] = {}
        if latency is not None:
            if not isinstance(latency, Mapping):
                raise ConfigurationError(
                    f"latency must map method names to seconds, not {latency!r}",
                    hint="e.g. latency = { restore_volume = 2.0 }",
                )
            for method, seconds in latency.items():
                if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                    raise ConfigurationError(
                        f"latency of {method!r} must be a number of seconds, not {seconds!r}",
                        hint="e.g. latency = { restore_volume = 2.0 }",
                    )
                self.add_latency(str(method), float(seconds))
        self._holds: dict[str, Path] = {}
        self._hold_timeout = HOLD_TIMEOUT
        if hold is not None:
            if not isinstance(hold, Mapping):
                raise ConfigurationError(
                    f"hold must map method names to file paths, not {hold!r}",
                    hint='e.g. hold = { create_snapshot_group = "/tmp/go" }',
                )
            for method, release in hold.items():
                if not isinstance(release, str | os.PathLike):
                    raise ConfigurationError(
                        f"hold of {method!r} must be a file path, not {release!r}",
                        hint='e.g. hold = { create_snapshot_group = "/tmp/go" }',
                    )
                self.add_hold(str(method), release)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        """Every protocol/``ex_*`` call (and ``snapshot_volume`` step): name and arguments.

        Arguments are positional, in signature order, sequences as tuples,
        e.g. ``("create_snapshot_group", (("vol-0001",), "b1", False))``.
        """
        specs = [_volume_spec(v, i) for i, v in enumerate(volumes or ())]
        if self._state_path is not None:
            self._state_path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
            with self._writing():  # loads the state file, if there is one; pins the mode
                self._settle_mode(block_arg, async_arg)
                self._reap_copies()
        else:
            self._settle_mode(block_arg, async_arg)
        if specs:
            with self._writing():
                for spec in specs:
                    self._ensure_volume(spec)

    # ------------------------------------------------------------------ basics

    @property
    def name(self) -> str:
        """Always ``"mock"``."""
        return _NAME

    @property
    def capabilities(self) -> frozenset[Capability]:
        """The capabilities granted at construction."""
        return self._caps

    @property
    def root(self) -> Path:
        """Where directory snapshots and clones live (created now if needed)."""
        with self._lock:
            return self._root_dir()

    @property
    def block(self) -> bool:
        """True in block mode: directory-backed volumes are simulated block devices."""
        return self._block

    @property
    def async_restore(self) -> bool:
        """True when restores complete later (:meth:`wait_for_restore` completes them)."""
        return self._async

    @property
    def snapshot_limit(self) -> int | None:
        """How many snapshots one volume may have (None: no limit)."""
        return self._snapshot_limit

    def __repr__(self) -> str:
        with self._lock:
            caps = (
                "all"
                if self._caps == frozenset(Capability)
                else ",".join(sorted(c.value for c in self._caps)) or "none"
            )
            mode = "block" if self._block else "directories"
            if self._async:
                mode += ",async_restore"
            return (
                f"<MockBackend volumes={len(self._volumes)} snapshots={len(self._snaps)} "
                f"groups={len(self._groups)} policies={len(self._policies)} "
                f"capabilities={caps} mode={mode} root={self._root or self._root_arg}>"
            )

    def close(self) -> None:
        """Remove the temporary ``root`` this backend created (a given root stays); idempotent."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()
                self._finalizer = None
                self._root = None

    def __enter__(self) -> MockBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ test hooks

    def inject_fault(
        self,
        method: str,
        *,
        on_call: int = 1,
        error: BaseException | None = None,
        times: int = 1,
    ) -> None:
        """Make the ``on_call``-th call of ``method`` from now (and the ``times - 1`` next) fail.

        ``error`` is raised as given; by default a fresh
        :class:`~pgsnap.errors.BackendUnavailable`. The fault fires before the
        call changes anything. ``method`` is one of :data:`FAULT_POINTS`.
        """
        self._check_fault_point(method)
        if on_call < 1 or times < 1:
            raise ConfigurationError(
                f"inject_fault({method!r}): on_call and times must be >= 1 "
                f"(got on_call={on_call}, times={times})",
                hint="on_call=1 fails the next call",
            )
        with self._lock:
            self._faults.append(_Fault(method, on_call - 1, times, error))

    def add_latency(self, method: str, seconds: float) -> None:
        """Make every call of ``method`` wait ``seconds`` (with ``sleep``) before it runs."""
        self._check_fault_point(method)
        if seconds < 0:
            raise ConfigurationError(f"latency must be >= 0 seconds, got {seconds}")
        with self._lock:
            self._latency[method] = float(seconds)

    def add_hold(
        self, method: str, release: str | os.PathLike[str], *, timeout: float = HOLD_TIMEOUT
    ) -> None:
        """Make every call of ``method`` wait until the file ``release`` exists.

        A call still waiting after ``timeout`` seconds fails with
        :class:`~pgsnap.errors.BackendUnavailable` (a test that forgot to
        release it fails instead of hanging).
        """
        self._check_fault_point(method)
        if timeout <= 0:
            raise ConfigurationError(f"hold timeout must be > 0 seconds, got {timeout}")
        with self._lock:
            self._holds[method] = Path(release)
            self._hold_timeout = float(timeout)

    def clear_faults(self) -> None:
        """Remove every injected fault, latency and hold (the call log stays)."""
        with self._lock:
            self._faults.clear()
            self._latency.clear()
            self._holds.clear()

    # ------------------------------------------------------------------ mock-only setup

    def add_volume(
        self,
        name: str,
        *,
        size_bytes: int = DEFAULT_VOLUME_SIZE,
        path: Path | None = None,
        volume_id: str | None = None,
    ) -> StorageVolume:
        """Create a volume: in memory, or backed by the existing directory ``path``.

        ``path`` may not overlap another volume's directory or the snapshot
        ``root``; in block mode it is the LUN of a simulated block device.
        ``volume_id`` overrides the generated ``vol-NNNN`` (in block mode it
        names the device node, so it may not contain ``/``).
        """
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
            raise ConfigurationError(f"size_bytes must be an integer >= 0, got {size_bytes!r}")
        with self._writing():
            if volume_id is not None and volume_id in self._volumes:
                raise ConfigurationError(
                    f"volume id {volume_id!r} is already used",
                    hint="leave volume_id out to get a fresh vol-NNNN id",
                    volume_id=volume_id,
                )
            if volume_id is not None and self._block and not _safe_volume_id(volume_id):
                raise ConfigurationError(
                    f"volume id {volume_id!r} cannot name a device node",
                    hint="in block mode a volume id is one path component: no '/', not '.' or '..'",
                    volume_id=volume_id,
                )
            directory: Path | None = None
            if path is not None:
                directory = Path(os.path.abspath(path))
                if not directory.is_dir():
                    raise ConfigurationError(
                        f"volume directory {str(directory)!r} does not exist",
                        hint="create the directory first (with the owner and mode it needs)",
                        path=str(directory),
                    )
                self._check_free_path(directory)
            vid = volume_id or self._next_id("vol", self._volumes)
            vol = _Volume(
                vid,
                name,
                size_bytes,
                directory,
                extra={"kind": "memory" if directory is None else "directory"},
            )
            self._volumes[vid] = vol
            log.debug("mock: added volume %s (%s)", vid, directory or "in memory")
            return vol.record(block=self._block)

    def write_blob(self, volume_id: str, key: str, data: bytes) -> None:
        """Set the content ``key`` of a volume (a file relative to a directory volume)."""
        with self._writing():
            vol = self._volume(volume_id)
            if vol.path is None:
                vol.blobs[key] = bytes(data)
                return
            target = _blob_path(vol.path, key)
        with self._os_errors(f"writing {key!r} to volume {volume_id!r}", volume_id=volume_id):
            target.write_bytes(data)

    def read_blob(self, volume_id: str, key: str) -> bytes:
        """The content ``key`` of a volume; ``BackendError`` if it was never written."""
        with self._reading():
            vol = self._volume(volume_id)
            if vol.path is None:
                if key not in vol.blobs:
                    raise BackendError(
                        f"volume {volume_id!r} has no blob {key!r}",
                        hint="write it first with write_blob()",
                        backend=_NAME,
                        volume_id=volume_id,
                        key=key,
                    )
                return vol.blobs[key]
            target = _blob_path(vol.path, key)
        try:
            return target.read_bytes()
        except OSError as exc:
            raise BackendError(
                f"cannot read {key!r} of volume {volume_id!r}: {exc.strerror or exc}",
                backend=_NAME,
                volume_id=volume_id,
                key=key,
            ) from exc

    def add_policy(
        self, name: str, volume_ids: Sequence[str], *, retain: int | None = None
    ) -> SnapshotPolicy:
        """Create a snapshot policy over ``volume_ids`` (needs ``POLICIES``).

        ``retain`` keeps only that many runs of :meth:`ex_run_policy` (older,
        non-secure ones are deleted, as a storage schedule rotates them).
        """
        ids = tuple(volume_ids)
        if retain is not None and retain < 1:
            raise ConfigurationError(f"retain must be >= 1 or None, got {retain}")
        with self._writing():
            self._require(Capability.POLICIES, "snapshot policies")
            for vid in ids:
                self._volume(vid)
            pid = self._next_id("pol", self._policies)
            policy = _Policy(pid, name, ids, retain)
            self._policies[pid] = policy
            return policy.record()

    # ------------------------------------------------------------------ protocol: read

    def list_volumes(self) -> tuple[StorageVolume, ...]:
        """Every volume, sorted by id."""
        self._enter("list_volumes")
        with self._reading():
            return tuple(self._volumes[v].record(block=self._block) for v in sorted(self._volumes))

    def get_volume(self, volume_id: str) -> StorageVolume:
        """One volume; ``VolumeNotFound`` if it does not exist."""
        self._enter("get_volume", volume_id)
        with self._reading():
            return self._volume(volume_id).record(block=self._block)

    def list_snapshots(self, volume_id: str | None = None) -> tuple[Snapshot, ...]:
        """Snapshots (of one volume, or all), oldest first (ties in creation order)."""
        self._enter("list_snapshots", volume_id)
        with self._reading():
            if volume_id is not None:
                self._volume(volume_id)
            found = [
                s
                for s in self._snaps.values()
                if volume_id is None or s.record.volume_id == volume_id
            ]
            found.sort(key=lambda s: (s.record.created_at, s.seq))
            return tuple(s.record for s in found)

    def get_snapshot_group(self, group_id: str) -> SnapshotGroup:
        """A group (with the snapshots it still has); ``SnapshotNotFound`` if gone."""
        self._enter("get_snapshot_group", group_id)
        with self._reading():
            return self._group_record(self._group(group_id))

    def list_policies(self) -> tuple[SnapshotPolicy, ...]:
        """Snapshot policies sorted by id; an empty tuple without ``POLICIES``."""
        self._enter("list_policies")
        with self._reading():
            if Capability.POLICIES not in self._caps:
                return ()
            return tuple(self._policies[p].record() for p in sorted(self._policies))

    # ------------------------------------------------------------------ protocol: snapshots

    def create_snapshot_group(
        self, volume_ids: Sequence[str], name: str, *, secure: bool = False
    ) -> SnapshotGroup:
        """Snapshot ``volume_ids`` together, all or nothing.

        With ``CONSISTENCY_GROUPS`` every snapshot has the same ``created_at``;
        without it they are taken one by one (each a tick later at least). If
        one volume fails, the snapshots already taken are removed and the
        error names the volume. ``secure`` needs ``SECURE_SNAPSHOTS``.
        """
        ids = tuple(volume_ids)
        self._enter("create_snapshot_group", ids, name, secure)
        with self._writing():
            return self._create_group(ids, name, secure=secure, policy_id=None)

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete one snapshot; refused for a secure one; ``SnapshotNotFound`` if unknown."""
        self._enter("delete_snapshot", snapshot_id)
        with self._writing():
            snap = self._snap(snapshot_id)
            self._refuse_secure([snap])
            self._drop_snapshot(snap)

    def delete_snapshot_group(self, group_id: str) -> None:
        """Delete every snapshot of a group (none if one of them is secure)."""
        self._enter("delete_snapshot_group", group_id)
        with self._writing():
            group = self._group(group_id)
            snaps = [self._snaps[s] for s in group.snapshot_ids]
            self._refuse_secure(snaps)
            for snap in snaps:
                self._drop_snapshot(snap)
            self._groups.pop(group_id, None)

    def restore_volume(self, volume_id: str, snapshot_id: str) -> None:
        """Replace the volume's content with the snapshot's; the snapshot stays.

        A snapshot of another volume is refused with
        :class:`~pgsnap.errors.BackendError`: the storage cannot do it (a
        snapshot only restores onto its own volume), whatever the settings.
        A directory volume that was removed is recreated from the snapshot.
        In block mode a volume still attached to a host is refused
        (:class:`~pgsnap.errors.BackendError` naming the hosts): detach it
        first. With ``async_restore`` the volume is left restoring until
        :meth:`wait_for_restore`; a restore of a volume still restoring is refused.
        """
        self._enter("restore_volume", volume_id, snapshot_id)
        with self._writing():
            vol = self._volume(volume_id)
            snap = self._snap(snapshot_id)
            self._refuse_restoring(vol, "restored again")
            if self._block and vol.hosts:
                hosts = ", ".join(sorted(vol.hosts))
                raise BackendError(
                    f"volume {volume_id!r} is attached to host(s) {hosts}: restoring an "
                    "attached volume fails",
                    hint=f"unmount it and detach it from {hosts} first "
                    "(restore_profile() says so: before=DETACH)",
                    backend=_NAME,
                    volume_id=volume_id,
                    hosts=tuple(sorted(vol.hosts)),
                )
            if snap.record.volume_id != volume_id:
                raise BackendError(
                    f"snapshot {snapshot_id!r} is of volume {snap.record.volume_id!r}, "
                    f"not {volume_id!r}: a snapshot can only restore its own volume",
                    hint=f"restore {volume_id!r} from one of its own snapshots "
                    f"(list_snapshots({volume_id!r})), or clone {snapshot_id!r} instead",
                    backend=_NAME,
                    volume_id=volume_id,
                    snapshot_id=snapshot_id,
                    snapshot_volume_id=snap.record.volume_id,
                )
            if vol.path is None:
                assert snap.blobs is not None
                vol.blobs = dict(snap.blobs)
            else:
                with self._os_errors(f"restore of volume {volume_id!r}", volume_id=volume_id):
                    if vol.path.is_dir():
                        _empty_dir(vol.path)
                        _copy_into(snap.tree, vol.path)
                    else:
                        os.mkdir(vol.path, 0o700)
                        _copy_into(snap.tree, vol.path)
                        _copy_meta(os.lstat(snap.tree), vol.path)
            if self._async:
                vol.restoring = snapshot_id
            log.debug(
                "mock: restored %s from %s%s",
                volume_id,
                snapshot_id,
                " (completes with wait_for_restore)" if self._async else "",
            )

    def restore_profile(self, volume_id: str) -> RestoreProfile:
        """What a restore of the volume needs: nothing (directories mode) or a
        detach (block mode); ``completes_later`` with ``async_restore``. The
        snapshot is never consumed. ``VolumeNotFound`` for an unknown volume."""
        self._enter("restore_profile", volume_id)
        with self._reading():
            self._volume(volume_id)
            before = RestorePreparation.DETACH if self._block else RestorePreparation.NOTHING
            return RestoreProfile(before=before, completes_later=self._async)

    def wait_for_restore(self, volume_id: str, *, timeout: float) -> None:
        """Complete a restore left restoring (``async_restore``); otherwise return at once.

        The mock's restores complete as soon as they are waited for, whatever
        ``timeout``; inject a fault to make one fail. ``VolumeNotFound`` for
        an unknown volume.
        """
        self._enter("wait_for_restore", volume_id, timeout)
        with self._writing():
            vol = self._volume(volume_id)
            if vol.restoring is not None:
                log.debug("mock: restore of %s from %s completed", volume_id, vol.restoring)
                vol.restoring = None

    # ------------------------------------------------------------------ protocol: hosts

    def locate(self, volume_id: str) -> Location:
        """How a host finds the volume (pure lookup; ``VolumeNotFound`` if unknown).

        A directory-backed volume is its directory, or in block mode the
        device ``root/dev/<id>`` (present only while attached); an in-memory
        volume is the device ``/dev/pgsnap-mock/<id>``, which never exists.
        """
        self._enter("locate", volume_id)
        with self._reading():
            vol = self._volume(volume_id)
            if vol.path is None:
                return Location.device(f"{MEMORY_DEVICE_DIR}/{vol.id}")
            if self._block:
                return Location.device(str(self._device_path(vol.id)))
            return Location.directory(str(vol.path))

    def attach(self, volume_id: str, host: str) -> None:
        """Make the volume visible to ``host`` (needs ``MAPPING``); idempotent.

        In block mode the volume's device node appears (a symlink to its
        LUN). A volume still restoring is refused until :meth:`wait_for_restore`.
        """
        self._enter("attach", volume_id, host)
        with self._writing():
            self._require(Capability.MAPPING, "attaching volumes to hosts")
            vol = self._volume(volume_id)
            host = self._check_host(host)
            self._refuse_restoring(vol, "attached")
            vol.hosts.add(host)
            if self._block and vol.path is not None:
                device = self._device_path(vol.id)
                with self._os_errors(f"attach of volume {volume_id!r}", volume_id=volume_id):
                    device.parent.mkdir(mode=0o700, exist_ok=True)
                    if not os.path.lexists(device):
                        os.symlink(vol.path, device)
                log.debug("mock: device %s -> %s", device, vol.path)

    def detach(self, volume_id: str, host: str) -> None:
        """Hide the volume from ``host`` (needs ``MAPPING``); idempotent.

        In block mode the device node goes away with the last host, and a
        volume mounted on ``host`` (by :meth:`simulated_host`) is refused with
        :class:`~pgsnap.errors.BackendError`: unmount it first.
        """
        self._enter("detach", volume_id, host)
        with self._writing():
            self._require(Capability.MAPPING, "detaching volumes from hosts")
            vol = self._volume(volume_id)
            host = self._check_host(host)
            for mount in self._mounts:
                if mount.volume_id == vol.id and mount.host == host:
                    raise BackendError(
                        f"volume {volume_id!r} is in use: mounted on {mount.target} on host "
                        f"{host!r}; the storage refuses to detach it",
                        hint=f"unmount {mount.target} first",
                        backend=_NAME,
                        volume_id=volume_id,
                        host=host,
                        target=mount.target,
                    )
            vol.hosts.discard(host)
            if self._block and vol.path is not None and not vol.hosts:
                device = self._device_path(vol.id)
                with self._os_errors(f"detach of volume {volume_id!r}", volume_id=volume_id):
                    if os.path.lexists(device):
                        os.unlink(device)

    def simulated_host(self, base: Host | None = None) -> Host:
        """A :class:`~pgsnap.host.Host` that mounts this mock's block devices.

        It behaves as ``base`` (default: this machine, ``Host()``) except for
        mounts and devices of this mock, which it simulates (see
        :mod:`pgsnap.backends.mock_host`). Its name (``base.name``) is the
        host name to :meth:`attach` volumes to.
        """
        from pgsnap.backends.mock_host import MockHost  # noqa: PLC0415 - pgsnap.host on demand

        return MockHost(self, base)

    # ------------------------------------------------------------------ protocol: clones

    def clone_snapshot(
        self, snapshot_id: str, name: str, *, path: Path | None = None
    ) -> StorageVolume:
        """A new writable volume with the snapshot's content (needs ``CLONES``).

        A clone of a directory snapshot is a new directory: ``path`` (which
        must not exist; its parent must) or ``root/clones/<volume id>``. Keep
        in mind that the default root is private (0700): give ``path`` when
        another user (a PostgreSQL server) must reach the clone.
        """
        self._enter("clone_snapshot", snapshot_id, name, path)
        with self._writing():
            self._require(Capability.CLONES, "clones")
            snap = self._snap(snapshot_id)
            directory = snap.home is not None and path is None  # root/clones/<vid>
            vid = self._next_id("vol", self._volumes, stray="clones" if directory else None)
            extra = {"clone_of": snapshot_id}
            if snap.home is None:
                assert snap.blobs is not None
                vol = _Volume(vid, name, self._size_of(snap), None, dict(snap.blobs))
                vol.extra = {"kind": "memory", **extra}
            else:
                target = self._clone_target(vid, path)
                with self._os_errors(f"clone of snapshot {snapshot_id!r}", snapshot_id=snapshot_id):
                    self._new_directory(target, vid)
                    try:
                        self._begin_copy(vid, target)
                        _copy_into(snap.tree, target)
                        _copy_meta(os.lstat(snap.tree), target)
                    except BaseException:
                        shutil.rmtree(target, ignore_errors=True)
                        self._end_copies([vid])
                        raise
                    self._end_copies([vid])
                vol = _Volume(vid, name, self._size_of(snap), target)
                vol.extra = {"kind": "directory", **extra}
            self._volumes[vid] = vol
            log.debug("mock: cloned %s into %s", snapshot_id, vid)
            return vol.record(block=self._block)

    # ------------------------------------------------------------------ protocol: policies

    def pause_policy(self, policy_id: str) -> None:
        """Stop a policy from taking or rotating snapshots (needs ``POLICIES``); idempotent."""
        self._enter("pause_policy", policy_id)
        with self._writing():
            self._require(Capability.POLICIES, "snapshot policies")
            self._policy(policy_id).paused = True

    def resume_policy(self, policy_id: str) -> None:
        """Let a paused policy run again (needs ``POLICIES``); idempotent."""
        self._enter("resume_policy", policy_id)
        with self._writing():
            self._require(Capability.POLICIES, "snapshot policies")
            self._policy(policy_id).paused = False

    # ------------------------------------------------------------------ vendor-only (ex_)

    def storage_problems(
        self, volume_ids: Sequence[str] | None = None
    ) -> tuple[StorageProblem, ...]:
        """Volumes near or at ``snapshot_limit`` (:class:`~pgsnap.protocols.StorageHealth`).

        A volume (of ``volume_ids``, or any; unknown ids are skipped) with at
        least ``limit_warn_percent`` of the limit is a ``snapshot_limit``
        warning; one at the limit an error (its next snapshot is refused).
        Without a limit: nothing. Errors first, then by volume id.
        """
        wanted = None if volume_ids is None else tuple(volume_ids)
        self._enter("storage_problems", wanted)
        limit = self._snapshot_limit
        if limit is None:
            return ()
        with self._reading():
            counts = dict.fromkeys(self._volumes, 0)
            for snap in self._snaps.values():
                if snap.record.volume_id in counts:
                    counts[snap.record.volume_id] += 1
        problems: list[StorageProblem] = []
        for vid in sorted(counts if wanted is None else set(wanted) & set(counts)):
            count = counts[vid]
            percent = 100.0 * count / limit
            if count >= limit:
                problems.append(
                    StorageProblem(
                        code="snapshot_limit",
                        severity=Severity.ERROR,
                        message=f"volume {vid} has {count} snapshots, the mock's limit of "
                        f"{limit}: its next backup will fail",
                        hint="delete old backups now (pgsnap expire, pgsnap delete)",
                        volume_id=vid,
                        percent_used=percent,
                    )
                )
            elif percent >= self._limit_warn:
                problems.append(
                    StorageProblem(
                        code="snapshot_limit",
                        severity=Severity.WARNING,
                        message=f"volume {vid} has {count} of the {limit} snapshots the mock "
                        f"allows ({percent:.0f} %): backups fail once it has {limit}",
                        hint="delete old backups (pgsnap expire with a retention policy) "
                        "before the limit is reached",
                        volume_id=vid,
                        percent_used=percent,
                    )
                )
        problems.sort(key=lambda p: p.severity is not Severity.ERROR)
        return tuple(problems)

    def ex_run_policy(self, policy_id: str) -> SnapshotGroup:
        """Run a policy once, as its schedule would: snapshot its volumes, then rotate.

        Refused with :class:`~pgsnap.errors.BackendError` while the policy is
        paused. The group is named ``<policy name>-<run number>``; with
        ``retain``, the oldest non-secure runs beyond it are deleted.
        """
        self._enter("ex_run_policy", policy_id)
        with self._writing():
            self._require(Capability.POLICIES, "snapshot policies")
            policy = self._policy(policy_id)
            if policy.paused:
                raise BackendError(
                    f"policy {policy_id!r} is paused and takes no snapshot",
                    hint="resume_policy() first",
                    backend=_NAME,
                    policy_id=policy_id,
                )
            group = self._create_group(
                policy.volume_ids,
                f"{policy.name}-{policy.runs + 1}",
                secure=False,
                policy_id=policy_id,
            )
            policy.runs += 1
            if policy.retain is not None:
                self._rotate(policy)
            return group

    def ex_expire_secure(self, snapshot_id: str) -> None:
        """End a secure snapshot's retention so it can be deleted; idempotent."""
        self._enter("ex_expire_secure", snapshot_id)
        with self._writing():
            self._require(Capability.SECURE_SNAPSHOTS, "secure snapshots")
            snap = self._snap(snapshot_id)
            snap.record = attrs.evolve(snap.record, secure=False)

    # ------------------------------------------------------------------ internals: state file

    @property
    def state_file(self) -> Path | None:
        """The JSON file the state persists in (``None``: in memory only)."""
        return self._state_path

    def _reading(self) -> AbstractContextManager[None]:
        """Hold the lock to read the state (reloaded from the state file first)."""
        return self._state(write=False)

    def _writing(self) -> AbstractContextManager[None]:
        """Hold the lock to change the state (reloaded first, saved afterwards)."""
        return self._state(write=True)

    @contextmanager
    def _state(self, *, write: bool) -> Iterator[None]:
        """The thread lock; with a state file also its ``fcntl`` lock, reload and save.

        Nested sections (a write section adding volumes through
        :meth:`add_volume`) reuse the outer one.
        """
        with self._lock:
            if self._state_path is None:
                yield
                return
            if self._state_depth:
                if write and not self._state_writing:
                    raise AssertionError("mock: a write section nested in a read section")
                self._state_depth += 1
                try:
                    yield
                finally:
                    self._state_depth -= 1
                return
            path = self._state_path
            lock_path = path.with_name(path.name + ".lock")
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise _state_error(
                    path, f"cannot be locked ({lock_path}): {exc.strerror}", hint=_WRITE_HINT
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if write else fcntl.LOCK_SH)
                self._load_state(path)
                self._state_depth += 1
                self._state_writing = write
                try:
                    if write and self._mode_settled:
                        self._reap_copies()
                    yield
                except BaseException:
                    # A construction refused before its mode was settled writes nothing.
                    if write and self._mode_settled:
                        try:  # the state in memory is what happened: keep it
                            self._save_state(path)
                        except PgsnapError as exc:
                            log.warning("mock: state not saved after a failure: %s", exc)
                    raise
                finally:
                    self._state_depth -= 1
                    self._state_writing = False
                if write:
                    self._save_state(path)
            finally:
                os.close(fd)  # releases the flock

    def _load_state(self, path: Path) -> None:
        """Replace the state in memory with the file's (a missing file changes nothing)."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self._state_text = None
            self._file_mode = None
            return
        except (OSError, UnicodeDecodeError) as exc:
            raise _state_error(path, f"cannot be read: {exc}") from exc
        try:
            data = json.loads(text)
            state = _decode_state(data)
        except (ValueError, KeyError, TypeError, AttributeError, PgsnapError) as exc:
            detail = exc.message if isinstance(exc, PgsnapError) else f"{type(exc).__name__}: {exc}"
            raise _state_error(path, f"is corrupt ({detail})") from exc
        if self._mode_settled and state.mode != (self._block, self._async):
            raise _state_error(
                path,
                f"is now in {_mode_text(*state.mode)}, but this backend was created in "
                f"{_mode_text(self._block, self._async)}",
                hint="another process replaced the state file: create the backend again",
            )
        self._file_mode = state.mode
        self._volumes, self._snaps, self._groups = state.volumes, state.snaps, state.groups
        self._policies, self._counters, self._mounts = state.policies, state.counters, state.mounts
        self._copying = state.copying
        self._state_text = text

    def _save_state(self, path: Path) -> None:
        """Write the state to ``path`` atomically: temporary file, fsync, rename (mode 0600)."""
        text = json.dumps(self._encode_state(), indent=1, sort_keys=True) + "\n"
        if text == self._state_text:
            return  # unchanged (a failed call, an idempotent one): no write, no fsync
        tmp: str | None = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o600)
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            tmp = None
            self._state_text = text
            dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _state_error(
                path, f"cannot be written: {exc.strerror or exc}", hint=_WRITE_HINT
            ) from exc
        finally:
            if tmp is not None:
                with suppress(OSError):
                    os.unlink(tmp)

    def _encode_state(self) -> dict[str, Any]:
        root = self._root or self._root_arg
        return {
            "format": _STATE_FORMAT,
            "version": _STATE_VERSION,
            "mode": {"block": self._block, "async_restore": self._async},
            "root": None if root is None else str(root),
            "counters": dict(sorted(self._counters.items())),
            "volumes": [
                {
                    "id": v.id,
                    "name": v.name,
                    "size_bytes": v.size_bytes,
                    "path": None if v.path is None else str(v.path),
                    "hosts": sorted(v.hosts),
                    "extra": dict(v.extra),
                    "blobs": _encode_blobs(v.blobs),
                    "restoring": v.restoring,
                }
                for v in self._volumes.values()
            ],
            "mounts": [
                {
                    "host": m.host,
                    "volume_id": m.volume_id,
                    "target": m.target,
                    "mode": m.mode,
                    "uid": m.uid,
                    "gid": m.gid,
                }
                for m in self._mounts
            ],
            "copying": [
                {
                    "id": c.id,
                    "path": str(c.path),
                    "pid": c.pid,
                    "started": c.started.isoformat(),
                    "dev": c.dev,
                    "ino": c.ino,
                }
                for c in self._copying
            ],
            "snapshots": [
                {
                    "record": to_dict(s.record),
                    "seq": s.seq,
                    "home": None if s.home is None else str(s.home),
                    "policy_id": s.policy_id,
                    "blobs": None if s.blobs is None else _encode_blobs(s.blobs),
                }
                for s in self._snaps.values()
            ],
            "groups": [
                {
                    "id": g.id,
                    "name": g.name,
                    "created_at": g.created_at.isoformat(),
                    "snapshot_ids": list(g.snapshot_ids),
                    "policy_id": g.policy_id,
                }
                for g in self._groups.values()
            ],
            "policies": [
                {
                    "id": p.id,
                    "name": p.name,
                    "volume_ids": list(p.volume_ids),
                    "retain": p.retain,
                    "paused": p.paused,
                    "runs": p.runs,
                }
                for p in self._policies.values()
            ],
        }

    def _ensure_volume(self, spec: _VolumeSpec) -> None:
        """Add a configured volume unless its id exists (then its path must match)."""
        existing = self._volumes.get(spec.id)
        if existing is None:
            self.add_volume(
                spec.name, size_bytes=spec.size_bytes, path=spec.path, volume_id=spec.id
            )
            return
        wanted = None if spec.path is None else Path(os.path.abspath(spec.path))
        if existing.path != wanted:
            raise ConfigurationError(
                f"volume {spec.id!r} is configured with path "
                f"{None if wanted is None else str(wanted)!r} but the mock's state has "
                f"{None if existing.path is None else str(existing.path)!r}",
                hint="a volume keeps its directory: give it a new id, or start from a new "
                "state_file",
                backend=_NAME,
                volume_id=spec.id,
            )

    # ------------------------------------------------------------------ the simulated host

    # These serve pgsnap.backends.mock_host.MockHost: the mount table is part of the
    # mock's state (persisted with it), and a mount changes it under the same lock.

    def _sim_claims(self, path: str) -> str | None:
        """The volume id a mock device path names (maybe unknown); None: not a mock device.

        Mock devices: ``root/dev/<id>``, ``/dev/pgsnap-mock/<id>``, and in block
        mode a volume's LUN (what a device resolves to).
        """
        with self._reading():
            where = Path(os.path.abspath(path))
            root = self._root or self._root_arg
            if where.parent == Path(MEMORY_DEVICE_DIR) or (
                root is not None and where.parent == root / "dev"
            ):
                return where.name
            if self._block:
                for vol in self._volumes.values():
                    if vol.path == where:
                        return vol.id
            return None

    def _sim_visible(self, volume_id: str, host: str) -> _Volume | None:
        """The block volume whose device ``host`` sees now (caller holds the lock)."""
        vol = self._volumes.get(volume_id)
        if not self._block or vol is None or vol.path is None or host not in vol.hosts:
            return None
        return vol if os.path.lexists(self._device_path(vol.id)) else None

    def _sim_device(self, host: str, path: str) -> str | None:
        """The resolved path of mock device ``path`` when ``host`` sees it, else None."""
        with self._reading():
            vid = self._sim_claims(path)
            vol = None if vid is None else self._sim_visible(vid, host)
            if vol is None:
                return None
            return os.path.realpath(self._device_path(vol.id))

    def _sim_record(self, mount: _SimMount) -> Mount:
        return Mount(
            source=str(self._device_path(mount.volume_id)),
            target=mount.target,
            fstype="mockfs",
            options=("rw",),
        )

    def _sim_mounts(self, host: str) -> tuple[Mount, ...]:
        """The simulated mounts of ``host``, in the order they were mounted."""
        with self._reading():
            return tuple(self._sim_record(m) for m in self._mounts if m.host == host)

    def _sim_mount_of(self, host: str, path: str) -> Mount | None:
        """The simulated mount of ``host`` holding ``path``: at or under its mount point
        (symlinks not resolved), or under its volume's directory (a resolved path)."""
        where = Path(os.path.abspath(path))
        with self._reading():
            best: tuple[int, _SimMount] | None = None
            for mount in self._mounts:
                if mount.host != host:
                    continue
                vol = self._volumes[mount.volume_id]
                assert vol.path is not None
                for base in {Path(mount.target), vol.path, Path(os.path.realpath(vol.path))}:
                    if _within(where, base) and (best is None or len(base.parts) > best[0]):
                        best = (len(base.parts), mount)
            return None if best is None else self._sim_record(best[1])

    def _sim_mount(self, host: str, where: str, source: str, target: str) -> None:
        """Mount mock device ``source`` on ``target`` for ``host`` (``where``: its description)."""
        with self._writing():
            vid = self._sim_claims(source)
            vol = None if vid is None else self._sim_visible(vid, host)
            if vol is None or vid is None:
                raise MountError(
                    f"cannot mount {source} on {target}: no such device "
                    f"(the volume is not attached to host {host!r})",
                    hint="attach the volume to this host and wait for its device first",
                    target=target,
                    host=where,
                    device=source,
                )
            assert vol.path is not None
            point = os.path.abspath(target)
            for mount in self._mounts:
                if mount.target == point:
                    if mount.volume_id == vol.id and mount.host == host:
                        log.debug("mock host: %s already mounted on %s", source, point)
                        return
                    raise MountError(
                        f"cannot mount {source} on {point}: "
                        f"{self._device_path(mount.volume_id)} is already mounted there",
                        hint="unmount it first",
                        target=point,
                        host=where,
                        device=source,
                    )
                if mount.volume_id == vol.id:
                    raise MountError(
                        f"cannot mount {source} on {point}: it is already mounted on "
                        f"{mount.target} (the simulation mounts a device once)",
                        hint=f"unmount {mount.target} first",
                        target=point,
                        host=where,
                        device=source,
                    )
            try:
                st = os.lstat(point)
            except FileNotFoundError:
                raise MountError(
                    f"cannot mount {source} on {point}: mount point does not exist",
                    hint="create the mount point directory first",
                    target=point,
                    host=where,
                ) from None
            except OSError as exc:
                raise MountError(
                    f"cannot mount {source} on {point}: {exc.strerror or exc}",
                    target=point,
                    host=where,
                ) from exc
            if not stat.S_ISDIR(st.st_mode):
                raise MountError(
                    f"cannot mount {source} on {point}: mount point is not a directory",
                    hint="mount on an empty directory",
                    target=point,
                    host=where,
                )
            if not vol.path.is_dir():
                raise MountError(
                    f"cannot mount {source} on {point}: wrong fs type, bad superblock "
                    f"(the volume's directory {vol.path} is missing)",
                    hint="restore the volume from a snapshot",
                    target=point,
                    host=where,
                )
            try:
                os.rmdir(point)  # only an empty directory: the simulation cannot hide content
            except OSError as exc:
                raise MountError(
                    f"cannot mount {source} on {point}: mount point is not empty "
                    f"({exc.strerror or exc}; the simulation replaces it by a symlink)",
                    hint="mount on an empty directory",
                    target=point,
                    host=where,
                ) from exc
            try:
                os.symlink(vol.path, point)
            except OSError as exc:
                with suppress(OSError):
                    _mount_point(point, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
                raise MountError(
                    f"cannot mount {source} on {point}: {exc.strerror or exc}",
                    target=point,
                    host=where,
                ) from exc
            self._mounts.append(
                _SimMount(host, vol.id, point, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            )
            log.debug("mock host %s: mounted %s on %s", host, source, point)

    def _sim_unmount(
        self, host: str, where: str, target: str, holders: Callable[[str], Sequence[str]]
    ) -> bool:
        """Unmount the simulated mount of ``host`` at ``target``; False when there is none.

        ``holders(path)`` names the processes using the volume's directory:
        any of them makes it a :class:`~pgsnap.errors.MountBusyError`.
        """
        point = os.path.abspath(target)
        with self._writing():
            found = [m for m in self._mounts if m.target == point and m.host == host]
            if not found:
                return False
            mount = found[0]
            nested = [
                m.target
                for m in self._mounts
                if m is not mount and _within(Path(m.target), Path(point))
            ]
            if nested:
                raise MountBusyError(
                    f"cannot unmount {point}: target is busy "
                    f"(mounted under it: {', '.join(nested)})",
                    hint="unmount those first",
                    target=point,
                    host=where,
                )
            vol = self._volumes[mount.volume_id]
            assert vol.path is not None
            users = tuple(holders(os.path.realpath(vol.path)))
            if users:
                raise MountBusyError(
                    f"cannot unmount {point}: target is busy; used by {'; '.join(users)}",
                    hint="stop those processes (the PostgreSQL server first), then unmount",
                    target=point,
                    holders=users,
                    host=where,
                )
            try:
                if os.path.islink(point):
                    os.unlink(point)
                if not os.path.lexists(point):
                    _mount_point(point, mount.mode, mount.uid, mount.gid)
                else:
                    log.warning("mock host: %s was replaced behind the simulation's back", point)
            except OSError as exc:
                raise MountError(
                    f"cannot unmount {point}: {exc.strerror or exc}",
                    target=point,
                    host=where,
                ) from exc
            self._mounts.remove(mount)
            log.debug("mock host %s: unmounted %s", host, point)
            return True

    # ------------------------------------------------------------------ internals: mode

    def _check_block_capabilities(self) -> None:
        if Capability.MAPPING not in self._caps:
            raise ConfigurationError(
                "the mock's block mode needs Capability.MAPPING: its devices exist "
                "only while attached to a host",
                hint="grant MAPPING in capabilities, or leave block mode off",
                backend=_NAME,
            )

    def _settle_mode(self, block: bool | None, async_restore: bool | None) -> None:
        """Fix the mode: the state file's if it has one (explicit values must agree)."""
        if self._file_mode is None:
            self._block, self._async = bool(block), bool(async_restore)
        else:
            have = dict(zip(("block", "async_restore"), self._file_mode, strict=True))
            for name, wanted in (("block", block), ("async_restore", async_restore)):
                if wanted is not None and wanted != have[name]:
                    raise ConfigurationError(
                        f"the mock's state file {str(self._state_path)!r} was created with "
                        f"{name} = {str(have[name]).lower()}, not {str(wanted).lower()}",
                        hint=f"leave {name} out (or set it to {str(have[name]).lower()}), "
                        "or start from a new state_file",
                        backend=_NAME,
                        option=name,
                    )
            self._block, self._async = self._file_mode
        if self._block:
            self._check_block_capabilities()
        self._mode_settled = True

    # ------------------------------------------------------------------ internals: calls

    def _check_fault_point(self, method: str) -> None:
        if method not in FAULT_POINTS:
            raise ConfigurationError(
                f"{method!r} is not a mock method that can fail",
                hint=f"choose one of: {', '.join(sorted(FAULT_POINTS))}",
                method=method,
            )

    def _wait_for_release(self, method: str, release: Path) -> None:
        deadline = time.monotonic() + self._hold_timeout
        while not release.exists():
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"mock.{method} was held for {self._hold_timeout:g} s and never released",
                    hint=f"create {release} to release it (hold / add_hold)",
                    backend=_NAME,
                    method=method,
                )
            time.sleep(0.02)

    def _enter(self, method: str, *args: Any) -> None:
        """Log and record a call, wait its latency, and fire its fault if one is due."""
        with self._lock:
            self.calls.append((method, args))
            delay = self._latency.get(method, 0.0)
            release = self._holds.get(method)
        log.debug("mock.%s%r", method, args)
        if delay:
            self._sleep(delay)
        if release is not None:
            self._wait_for_release(method, release)
        with self._lock:
            for fault in self._faults:
                if fault.method != method:
                    continue
                if fault.skip:
                    fault.skip -= 1
                    continue
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
                error = fault.error
                if error is None:
                    error = BackendUnavailable(
                        f"injected fault in mock.{method}",
                        hint="the mock was told to fail this call (inject_fault)",
                        backend=_NAME,
                        method=method,
                    )
                log.debug("mock.%s: injected fault %r", method, error)
                raise error

    @contextmanager
    def _os_errors(self, what: str, **details: Any) -> Iterator[None]:
        """Turn an ``OSError`` into a ``BackendError`` naming ``what`` failed."""
        try:
            yield
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise BackendError(
                f"{what} failed: {exc.strerror or exc}{where}",
                hint="check the directory's permissions and free space",
                backend=_NAME,
                **details,
            ) from exc

    # ------------------------------------------------------------------ internals: lookups

    def _require(self, cap: Capability, what: str) -> None:
        if cap not in self._caps:
            raise UnsupportedCapability(
                f"the mock backend was created without {cap.name}: no {what}",
                hint=f"create it with Capability.{cap.name} in capabilities, "
                "or plan without this feature",
                backend=_NAME,
                capability=cap.value,
            )

    def _volume(self, volume_id: str) -> _Volume:
        vol = self._volumes.get(volume_id) if isinstance(volume_id, str) else None
        if vol is None:
            raise VolumeNotFound(
                f"no volume {volume_id!r} on the mock backend",
                hint="list_volumes() shows the volumes that exist",
                backend=_NAME,
                volume_id=volume_id,
            )
        return vol

    def _snap(self, snapshot_id: str) -> _Snap:
        snap = self._snaps.get(snapshot_id) if isinstance(snapshot_id, str) else None
        if snap is None:
            raise SnapshotNotFound(
                f"no snapshot {snapshot_id!r} on the mock backend",
                hint="list_snapshots() shows the snapshots that exist",
                backend=_NAME,
                snapshot_id=snapshot_id,
            )
        return snap

    def _group(self, group_id: str) -> _Group:
        group = self._groups.get(group_id) if isinstance(group_id, str) else None
        if group is None:
            raise SnapshotNotFound(
                f"no snapshot group {group_id!r} on the mock backend",
                hint="it was deleted, or the id is wrong",
                backend=_NAME,
                snapshot_id=group_id,
            )
        return group

    def _policy(self, policy_id: str) -> _Policy:
        policy = self._policies.get(policy_id) if isinstance(policy_id, str) else None
        if policy is None:
            raise BackendError(
                f"no snapshot policy {policy_id!r} on the mock backend",
                hint="list_policies() shows the policies that exist",
                backend=_NAME,
                policy_id=policy_id,
            )
        return policy

    def _refuse_restoring(self, vol: _Volume, what: str) -> None:
        if vol.restoring is not None:
            raise BackendError(
                f"volume {vol.id!r} is being restored from {vol.restoring!r} and cannot be "
                f"{what} until the restore completes",
                hint=f"wait_for_restore({vol.id!r}) first",
                backend=_NAME,
                volume_id=vol.id,
                snapshot_id=vol.restoring,
            )

    def _device_path(self, volume_id: str) -> Path:
        """The block-mode device node of a volume: ``root/dev/<id>`` (caller holds the lock)."""
        if not _safe_volume_id(volume_id):
            raise ConfigurationError(
                f"volume id {volume_id!r} cannot name a device node",
                hint="in block mode a volume id is one path component",
                volume_id=volume_id,
            )
        return self._root_dir() / "dev" / volume_id

    def _check_host(self, host: str) -> str:
        if not isinstance(host, str) or not host.strip():
            raise ConfigurationError(
                f"invalid host name {host!r}",
                hint="give the host's name as the storage knows it",
                backend=_NAME,
                host=repr(host),
            )
        return host

    def _next_id(self, prefix: str, used: dict[str, Any], *, stray: str | None = None) -> str:
        """The next ``<prefix>-NNNN`` not in ``used`` (the counter moves on to it).

        With ``stray`` (``"snapshots"`` or ``"clones"``), an id whose directory
        ``root/<stray>/<id>`` exists is skipped too (see :meth:`_stray`).
        """
        n = self._counters.get(prefix, 0)
        while True:
            n += 1
            candidate = f"{prefix}-{n:04d}"
            if candidate in used or (stray is not None and self._stray(stray, candidate)):
                continue
            self._counters[prefix] = n
            return candidate

    def _stray(self, kind: str, candidate: str) -> bool:
        """True (with a warning) when ``root/<kind>/<candidate>`` exists, unknown to the state.

        No copy this state recorded left it: every copy is recorded before it
        starts and its leftovers are removed (:meth:`_reap_copies`). It is a
        copy killed by a pgsnap older than state version 3, or belongs to
        another mock using the same root: either way it is not this state's
        to remove, and its id is not reused.
        """
        root = self._root or self._root_arg
        if root is None:
            return False
        where = root / kind / candidate
        if not os.path.lexists(where):
            return False
        log.warning(
            "mock: %s exists but the state has no %s (a copy killed before copies were "
            "recorded, or another mock using this root): skipping the id %s and leaving the "
            "directory alone; remove it by hand if no mock uses it",
            where,
            candidate,
            candidate,
        )
        return True

    def _now(self) -> dt.datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ConfigurationError(
                "the mock's clock returned a naive datetime",
                hint="return aware times, e.g. datetime.now(timezone.utc)",
            )
        return now

    def _group_record(self, group: _Group) -> SnapshotGroup:
        return SnapshotGroup(
            id=group.id,
            name=group.name,
            created_at=group.created_at,
            snapshots=tuple(self._snaps[s].record for s in group.snapshot_ids),
        )

    def _size_of(self, snap: _Snap) -> int:
        origin = self._volumes.get(snap.record.volume_id)
        return DEFAULT_VOLUME_SIZE if origin is None else origin.size_bytes

    # ------------------------------------------------------------------ internals: directories

    def _root_dir(self) -> Path:
        """The snapshot root, created on first use (caller holds the lock)."""
        if self._root is not None:
            return self._root
        if self._root_arg is None:
            root = Path(tempfile.mkdtemp(prefix="pgsnap-mock-"))  # mode 0700
            self._finalizer = weakref.finalize(self, shutil.rmtree, root, ignore_errors=True)
        else:
            root = self._root_arg
            if not root.exists():
                root.mkdir(parents=True, mode=0o700)
                root.chmod(0o700)
        self._root = root
        log.debug("mock: snapshot root %s", root)
        return root

    def _check_free_path(self, directory: Path) -> None:
        for other in self._volumes.values():
            if other.path is not None and _overlaps(directory, other.path):
                raise ConfigurationError(
                    f"directory {str(directory)!r} overlaps volume {other.id!r} "
                    f"({str(other.path)!r})",
                    hint="give each volume its own directory, not nested in another",
                    path=str(directory),
                    volume_id=other.id,
                )
        root = self._root or self._root_arg
        if root is not None and _overlaps(directory, root):
            raise ConfigurationError(
                f"directory {str(directory)!r} overlaps the mock's snapshot root {str(root)!r}",
                hint="keep volume directories outside the root where snapshots are stored",
                path=str(directory),
            )

    def _clone_target(self, vid: str, path: Path | None) -> Path:
        if path is None:
            clones = self._root_dir() / "clones"
            clones.mkdir(mode=0o700, exist_ok=True)
            return clones / vid
        target = Path(os.path.abspath(path))
        if target.exists() or target.is_symlink() or not target.parent.is_dir():
            raise ConfigurationError(
                f"cannot create the clone at {str(target)!r}: it exists or its parent does not",
                hint="give a path that does not exist yet, in an existing directory",
                path=str(target),
            )
        self._check_free_path(target)
        return target

    def _copy_volume(self, vol: _Volume, snap_id: str) -> Path:
        """Copy a directory volume into ``root/snapshots/<snap_id>`` (0700); return that."""
        assert vol.path is not None
        root = self._root_dir()
        if _overlaps(vol.path, root):
            raise BackendError(
                f"volume {vol.id!r} ({str(vol.path)!r}) contains the mock's snapshot root",
                hint="give MockBackend a root outside every volume",
                backend=_NAME,
                volume_id=vol.id,
            )
        snapshots = root / "snapshots"
        home = snapshots / snap_id
        with self._os_errors(f"snapshot of volume {vol.id!r}", volume_id=vol.id):
            snapshots.mkdir(mode=0o700, exist_ok=True)
            self._new_directory(home, snap_id)
            os.chmod(home, 0o700)
            try:
                self._begin_copy(snap_id, home)
                tree = home / "tree"
                os.mkdir(tree, 0o700)
                _copy_into(vol.path, tree)
                _copy_meta(os.lstat(vol.path), tree)
            except BaseException:
                shutil.rmtree(home, ignore_errors=True)
                raise
        return home

    def _new_directory(self, path: Path, owner: str) -> None:
        """``mkdir path`` (0700) for the copy of ``owner``; another's directory is an error.

        The id was checked free (:meth:`_stray`) under the lock: a directory
        there now was made by something that does not share this state file.
        """
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            root = self._root or self._root_arg
            raise BackendError(
                f"cannot copy {owner}: {path} was just created by someone else "
                "(another mock using the same root?)",
                hint=f"give each mock its own root; {root} is this one's",
                backend=_NAME,
                path=str(path),
            ) from None

    # ------------------------------------------------------------------ internals: copies

    # A copy into a new directory (a snapshot's home, a clone) can be cut short by a
    # kill. Each is recorded in the state, and the state saved, once its directory
    # exists and before anything is copied: that also makes its id (the counter)
    # durable. The record goes when the call ends, in the same save that records
    # the snapshot or the clone (or, after a failure, that records nothing).

    def _begin_copy(self, owner: str, path: Path) -> None:
        """Record (and save) the copy for ``owner`` into the new directory ``path``."""
        st = os.lstat(path)
        self._copying.append(_Copy(owner, path, os.getpid(), _utcnow(), st.st_dev, st.st_ino))
        if self._state_path is not None and self._state_writing:
            self._save_state(self._state_path)

    def _end_copies(self, owners: Iterable[str]) -> None:
        """Drop the records of the copies for ``owners`` (saved with the rest of the call)."""
        done = set(owners)
        self._copying = [c for c in self._copying if c.id not in done]

    def _reap_copies(self) -> None:
        """Remove the half copies of processes killed while copying; drop their records.

        Called at the start of every write section, holding the state file's
        exclusive lock. A copy holds that lock from its record to the end of
        its call, and the kernel releases it only when the call ends or the
        process dies: so a record found now is one whose process died copying
        (or whose last save failed), never a copy in progress.
        """
        if not self._copying:
            return
        owned = {s.home for s in self._snaps.values() if s.home is not None}
        owned |= {v.path for v in self._volumes.values() if v.path is not None}
        for copy in self._copying:
            self._remove_half_copy(copy, owned)
        self._copying = []

    def _remove_half_copy(self, copy: _Copy, owned: set[Path]) -> None:
        """Remove the directory of a dead copy, if it is still the one the copy created."""
        what = (
            f"the copy for {copy.id} into {copy.path} by process {copy.pid} "
            f"(started {copy.started.isoformat(timespec='seconds')}) did not end"
        )
        if copy.path in owned:  # cannot happen: the record goes in the same save
            log.warning("mock: %s, but %s is in use by the state: left alone", what, copy.path)
            return
        try:
            st = os.lstat(copy.path)
        except FileNotFoundError:
            log.warning("mock: %s (killed?); nothing of it is left", what)
            return
        except OSError as exc:
            log.warning("mock: %s; cannot check it (%s): left alone", what, exc.strerror or exc)
            return
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (copy.dev, copy.ino):
            log.warning(
                "mock: %s; %s is no longer the directory it created: left alone", what, copy.path
            )
            return
        try:
            shutil.rmtree(copy.path)
        except OSError as exc:
            log.warning(
                "mock: %s; cannot remove its half copy (%s): remove %s by hand",
                what,
                exc.strerror or exc,
                copy.path,
            )
            return
        log.warning("mock: %s (killed?); removed its half copy %s", what, copy.path)

    # ------------------------------------------------------------------ internals: groups

    def _create_group(
        self, ids: tuple[str, ...], name: str, *, secure: bool, policy_id: str | None
    ) -> SnapshotGroup:
        """Take the snapshots of a group, all or nothing (caller holds the lock)."""
        if secure:
            self._require(Capability.SECURE_SNAPSHOTS, "secure snapshots")
        if not ids:
            raise ConfigurationError(
                "a snapshot group needs at least one volume",
                hint="pass the ids of the volumes to snapshot",
            )
        dupes = sorted({v for v in ids if ids.count(v) > 1})
        if dupes:
            raise ConfigurationError(
                f"volume(s) listed more than once: {', '.join(dupes)}",
                hint="list each volume once",
                volume_ids=tuple(dupes),
            )
        vols = [self._volume(v) for v in ids]
        for vol in vols:
            self._refuse_restoring(vol, "snapshotted")
        self._refuse_over_limit(vols, name)
        counters = dict(self._counters)
        consistent = Capability.CONSISTENCY_GROUPS in self._caps
        instant = self._now() if consistent else None
        group_id = self._next_id("cg", self._groups)
        taken: list[_Snap] = []
        sids: list[str] = []
        extra = {} if policy_id is None else {"policy_id": policy_id}
        for index, vol in enumerate(vols, start=1):
            try:
                self._enter("snapshot_volume", vol.id)
                if instant is not None:
                    created = instant
                else:
                    created = self._now()
                    if taken and created <= taken[-1].record.created_at:
                        created = taken[-1].record.created_at + _ONE_TICK
                sid = self._next_id("snap", self._snaps, stray="snapshots")
                sids.append(sid)
                snap = _Snap(
                    Snapshot(
                        id=sid,
                        volume_id=vol.id,
                        name=name,
                        created_at=created,
                        group_id=group_id,
                        secure=secure,
                        extra=extra,
                    ),
                    seq=self._counters["snap"],
                    policy_id=policy_id,
                )
                if vol.path is None:
                    snap.blobs = dict(vol.blobs)
                else:
                    snap.home = self._copy_volume(vol, sid)
                    snap.record = attrs.evolve(snap.record, extra={**extra, "path": str(snap.tree)})
                taken.append(snap)
            except BaseException as exc:
                for done in taken:
                    if done.home is not None:
                        shutil.rmtree(done.home, ignore_errors=True)
                self._end_copies(sids)
                self._counters = counters
                log.debug(
                    "mock: group %r failed at %s; removed %d snapshot(s)", name, vol.id, len(taken)
                )
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt and friends pass through unchanged
                raise _group_failure(exc, name, vol.id, index, len(vols)) from exc
        self._end_copies(sids)
        for snap in taken:
            self._snaps[snap.record.id] = snap
        group = _Group(
            group_id, name, taken[0].record.created_at, [s.record.id for s in taken], policy_id
        )
        self._groups[group_id] = group
        log.debug("mock: group %s %r: %s", group_id, name, [s.record.id for s in taken])
        return self._group_record(group)

    def _refuse_over_limit(self, vols: Sequence[_Volume], name: str) -> None:
        """Refuse a group that would give a volume more than ``snapshot_limit`` snapshots."""
        limit = self._snapshot_limit
        if limit is None:
            return
        for vol in vols:
            count = sum(1 for s in self._snaps.values() if s.record.volume_id == vol.id)
            if count >= limit:
                raise SnapshotLimitError(
                    f"cannot snapshot group {name!r}: volume {vol.id} has {count} snapshots, "
                    f"the mock's limit of {limit}; nothing was taken",
                    hint="delete old backups (pgsnap expire, pgsnap delete) to make room; "
                    "pgsnap check warns before the limit is reached",
                    backend=_NAME,
                    volume_id=vol.id,
                    limit=limit,
                )

    def _refuse_secure(self, snaps: Sequence[_Snap]) -> None:
        for snap in snaps:
            if snap.record.secure:
                raise BackendError(
                    f"snapshot {snap.record.id!r} is secure and cannot be deleted "
                    "before its retention expires",
                    hint="wait for the retention to end (in the mock: ex_expire_secure())",
                    backend=_NAME,
                    snapshot_id=snap.record.id,
                )

    def _drop_snapshot(self, snap: _Snap) -> None:
        sid = snap.record.id
        if snap.home is not None:
            with self._os_errors(f"deletion of snapshot {sid!r}", snapshot_id=sid):
                shutil.rmtree(snap.home)
        del self._snaps[sid]
        gid = snap.record.group_id
        group = self._groups.get(gid) if gid is not None else None
        if group is not None:
            group.snapshot_ids.remove(sid)
            if not group.snapshot_ids:
                del self._groups[group.id]

    def _rotate(self, policy: _Policy) -> None:
        assert policy.retain is not None
        runs = sorted(
            (g for g in self._groups.values() if g.policy_id == policy.id),
            key=lambda g: (g.created_at, g.id),
        )
        for group in runs[: max(0, len(runs) - policy.retain)]:
            snaps = [self._snaps[s] for s in group.snapshot_ids]
            if any(s.record.secure for s in snaps):
                continue
            log.debug("mock: policy %s rotates out group %s", policy.id, group.id)
            for snap in snaps:
                self._drop_snapshot(snap)


def _group_failure(exc: Exception, name: str, volume_id: str, index: int, count: int) -> Exception:
    """The error a failed group raises: says which volume, keeps a pgsnap error's type."""
    cause = exc.message if isinstance(exc, PgsnapError) else str(exc) or type(exc).__name__
    message = (
        f"snapshot group {name!r} failed at volume {volume_id!r} ({index} of {count}): "
        f"{cause}; no snapshot of the group was kept"
    )
    if isinstance(exc, PgsnapError):
        details = {**exc.details, "volume_id": volume_id}
        try:
            return type(exc)(message, hint=exc.hint, **details)
        except TypeError:  # a subclass with another constructor
            pass
    return BackendError(
        message,
        hint="fix the volume and take the group again",
        backend=_NAME,
        volume_id=volume_id,
    )
