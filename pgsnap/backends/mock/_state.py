"""The mock's state: its records and the versioned state-file codec."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from pgsnap._attrs import define
from pgsnap.errors import (
    BackendError,
    ConfigurationError,
)
from pgsnap.host.simulated import SimulatedMount
from pgsnap.model import (
    Snapshot,
    SnapshotPolicy,
    StorageVolume,
    from_dict,
    to_dict,
)

log = logging.getLogger(__name__)

_NAME: Final = "mock"

_STATE_FORMAT: Final = "pgsnap-mock-state"
_STATE_VERSION: Final = 3
"""Version 2 added the mode (block, async_restore), restoring volumes and the mount table;
version 3 the copies under way (``copying``)."""
_WRITE_HINT: Final = "check the permissions and free space of the state file's directory"
_CORRUPT_HINT: Final = (
    "restore the file from a copy, or move it away to start with an empty mock "
    "(the snapshot copies under the mock's root are then forgotten: remove them too)"
)


# --------------------------------------------------------------------------- internal state


@define
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


@define
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


@define
class _Group:
    id: str
    name: str
    created_at: dt.datetime
    snapshot_ids: list[str]
    policy_id: str | None = None


@define
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


@define
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


@define
class _State:
    """Everything a state file holds."""

    mode: tuple[bool, bool]
    """``(block, async_restore)``."""
    volumes: dict[str, _Volume]
    snaps: dict[str, _Snap]
    groups: dict[str, _Group]
    policies: dict[str, _Policy]
    counters: dict[str, int]
    mounts: list[SimulatedMount]
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
    mounts: list[SimulatedMount] = []
    for i, raw in enumerate(_list(top["mounts"], "mounts")):
        m = _dict(raw, f"mounts[{i}]")
        mount = SimulatedMount(
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


def encode_state(state: _State, root: Path | None) -> dict[str, Any]:
    """The JSON document of a state file (the current version) for ``state``; ``root``
    is the mock's root directory (None: not created yet)."""
    return {
        "format": _STATE_FORMAT,
        "version": _STATE_VERSION,
        "mode": {"block": state.mode[0], "async_restore": state.mode[1]},
        "root": None if root is None else str(root),
        "counters": dict(sorted(state.counters.items())),
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
            for v in state.volumes.values()
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
            for m in state.mounts
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
            for c in state.copying
        ],
        "snapshots": [
            {
                "record": to_dict(s.record),
                "seq": s.seq,
                "home": None if s.home is None else str(s.home),
                "policy_id": s.policy_id,
                "blobs": None if s.blobs is None else _encode_blobs(s.blobs),
            }
            for s in state.snaps.values()
        ],
        "groups": [
            {
                "id": g.id,
                "name": g.name,
                "created_at": g.created_at.isoformat(),
                "snapshot_ids": list(g.snapshot_ids),
                "policy_id": g.policy_id,
            }
            for g in state.groups.values()
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
            for p in state.policies.values()
        ],
    }
