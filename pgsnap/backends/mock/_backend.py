"""The mock backend's class (see :mod:`pgsnap.backends.mock`)."""

from __future__ import annotations

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
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.backends._common import group_failure
from pgsnap.backends.mock._devices import MEMORY_DEVICE_DIR, MockDevices
from pgsnap.backends.mock._faults import HOLD_TIMEOUT, Faults
from pgsnap.backends.mock._files import (
    blob_path,
    copy_into,
    copy_meta,
    disk_usage,
    empty_dir,
    overlaps,
)
from pgsnap.backends.mock._state import (
    _NAME,
    _WRITE_HINT,
    _Copy,
    _decode_state,
    _Group,
    _mode_text,
    _option_bool,
    _Policy,
    _safe_volume_id,
    _Snap,
    _State,
    _state_error,
    _Volume,
    encode_state,
)
from pgsnap.errors import (
    BackendError,
    ConfigurationError,
    PgsnapError,
    SnapshotLimitError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.host.simulated import SimulatedHost, SimulatedMount
from pgsnap.model import (
    Location,
    RestorePreparation,
    RestoreProfile,
    Severity,
    Snapshot,
    SnapshotAccess,
    SnapshotGroup,
    SnapshotPolicy,
    StorageProblem,
    StorageVolume,
)
from pgsnap.protocols import Capability

if TYPE_CHECKING:
    from pgsnap.host import Host

__all__ = ["MockBackend"]

log = logging.getLogger(__name__)

DEFAULT_VOLUME_SIZE: Final = 1 << 30
"""Size reported for a volume added without ``size_bytes`` (1 GiB)."""


_ONE_TICK: Final = dt.timedelta(microseconds=1)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --------------------------------------------------------------------------- configuration

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


@frozen
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
        self._mounts: list[SimulatedMount] = []
        self._copying: list[_Copy] = []
        self._injected = Faults(self._sleep)
        self._devices = MockDevices(self)
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
        self._injected.inject(method, on_call=on_call, times=times, error=error)

    def add_latency(self, method: str, seconds: float) -> None:
        """Make every call of ``method`` wait ``seconds`` (with ``sleep``) before it runs."""
        self._injected.add_latency(method, seconds)

    def add_hold(
        self, method: str, release: str | os.PathLike[str], *, timeout: float = HOLD_TIMEOUT
    ) -> None:
        """Make every call of ``method`` wait until the file ``release`` exists.

        A call still waiting after ``timeout`` seconds fails with
        :class:`~pgsnap.errors.BackendUnavailable` (a test that forgot to
        release it fails instead of hanging).
        """
        self._injected.add_hold(method, release, timeout=timeout)

    def clear_faults(self) -> None:
        """Remove every injected fault, latency and hold (the call log stays)."""
        self._injected.clear()

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
            target = blob_path(vol.path, key)
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
            target = blob_path(vol.path, key)
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

    def disk_usage(self) -> tuple[int, int]:
        """``(bytes on disk, bytes of files)`` of the directory snapshots under ``root``:
        what they take (each file counted once however many snapshots share it) and
        what full copies would (``pgsnap list`` says both for the mock)."""
        with self._reading():
            home = self._root_dir() / "snapshots"
            return disk_usage(home) if home.is_dir() else (0, 0)

    def snapshot_access(self, snapshot_id: str) -> SnapshotAccess:
        """The directory holding a directory snapshot's copy (``root/snapshots/<id>/tree``),
        readable in place; an in-memory snapshot cannot be read so
        (:class:`~pgsnap.errors.UnsupportedCapability`)."""
        self._enter("snapshot_access", snapshot_id)
        with self._reading():
            snap = self._snap(snapshot_id)
            if snap.home is None:
                raise UnsupportedCapability(
                    f"snapshot {snapshot_id} of the mock is in memory: it has no tree to read",
                    hint="give the mock's volumes directories (path=) to copy their snapshots",
                    backend=_NAME,
                    snapshot_id=snapshot_id,
                )
            return SnapshotAccess(path=str(snap.tree))

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
                        empty_dir(vol.path)
                        copy_into(snap.tree, vol.path)
                    else:
                        os.mkdir(vol.path, 0o700)
                        copy_into(snap.tree, vol.path)
                        copy_meta(os.lstat(snap.tree), vol.path)
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

    @property
    def devices(self) -> MockDevices:
        """This mock's block devices and mount table, as a simulated host uses them."""
        return self._devices

    def simulated_host(self, base: Host | None = None) -> SimulatedHost:
        """A :class:`~pgsnap.host.simulated.SimulatedHost` that mounts this mock's block devices.

        It behaves as ``base`` (default: this machine, ``Host()``) except for
        mounts and devices of this mock, which it simulates (see
        :mod:`pgsnap.host.simulated`). Its name (``base.name``) is the host
        name to :meth:`attach` volumes to.
        """
        return SimulatedHost(self._devices, base)

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
            origin = self._volumes.get(snap.record.volume_id)
            if path is None and self._block and origin is not None and origin.path is not None:
                # A simulated LUN beside its origin's, where the host's users reach it.
                path = origin.path.parent / f".clone-{name}"
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
                        copy_into(snap.tree, target)
                        copy_meta(os.lstat(snap.tree), target)
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

    def delete_clone(self, volume_id: str) -> None:
        """Delete a volume made by :meth:`clone_snapshot` (its directory too);
        idempotent. A volume that is not a clone, or one still attached to a host,
        is refused (:class:`~pgsnap.errors.BackendError`)."""
        self._enter("delete_clone", volume_id)
        with self._writing():
            vol = self._volumes.get(volume_id) if isinstance(volume_id, str) else None
            if vol is None:
                return
            if "clone_of" not in vol.extra:
                raise BackendError(
                    f"volume {volume_id!r} is not a clone: it is never deleted",
                    hint="only volumes made by clone_snapshot are deleted",
                    backend=_NAME,
                    volume_id=volume_id,
                )
            if vol.hosts:
                raise BackendError(
                    f"clone {volume_id!r} is attached to {', '.join(sorted(vol.hosts))}",
                    hint="detach it first",
                    backend=_NAME,
                    volume_id=volume_id,
                )
            if vol.path is not None:
                with self._os_errors(f"deleting clone {volume_id!r}", volume_id=volume_id):
                    if vol.path.exists():
                        shutil.rmtree(vol.path)
            del self._volumes[volume_id]
            log.debug("mock: deleted clone %s", volume_id)

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
        state = _State(
            (self._block, self._async),
            self._volumes,
            self._snaps,
            self._groups,
            self._policies,
            self._counters,
            self._mounts,
            self._copying,
        )
        return encode_state(state, root)

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

    def _enter(self, method: str, *args: Any) -> None:
        """Log and record a call, wait its latency and hold, and fire its fault if one is due."""
        with self._lock:
            self.calls.append((method, args))
        log.debug("mock.%s%r", method, args)
        self._injected.enter(method)

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
            if other.path is not None and overlaps(directory, other.path):
                raise ConfigurationError(
                    f"directory {str(directory)!r} overlaps volume {other.id!r} "
                    f"({str(other.path)!r})",
                    hint="give each volume its own directory, not nested in another",
                    path=str(directory),
                    volume_id=other.id,
                )
        root = self._root or self._root_arg
        if root is not None and overlaps(directory, root):
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
        """Copy a directory volume into ``root/snapshots/<snap_id>`` (0700); return that.

        Files are cloned copy-on-write where the file system can; otherwise a file the
        volume's newest snapshot holds unchanged is hard-linked to it (a snapshot's
        tree is never written to: restores and clones copy out of it)."""
        assert vol.path is not None
        newest = max(
            (s for s in self._snaps.values() if s.record.volume_id == vol.id and s.home),
            key=lambda s: (s.record.created_at, s.seq),
            default=None,
        )
        previous = None if newest is None or not newest.tree.is_dir() else newest.tree
        root = self._root_dir()
        if overlaps(vol.path, root):
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
                copy_into(vol.path, tree, previous)
                copy_meta(os.lstat(vol.path), tree)
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
                raise group_failure(
                    exc,
                    name,
                    vol.id,
                    index,
                    len(vols),
                    error=BackendError,
                    backend=_NAME,
                    hint="fix the volume and take the group again",
                ) from exc
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
