"""``mock``: a stateful in-memory :class:`~pgsnap.protocols.StorageBackend`.

It follows the protocol's contract exactly (it passes
:mod:`pgsnap.testing.conformance`) and is what unit tests, executor tests, the
demo and the end-to-end tests with a real PostgreSQL server run against.

Volumes come in two kinds:

- **in memory** (:meth:`MockBackend.add_volume` without ``path``): the content
  is a dict of blobs (:meth:`~MockBackend.write_blob` / :meth:`~MockBackend.read_blob`);
- **directory-backed** (``path=``, needs ``Capability.DIRECTORY_VOLUMES``): the
  volume is a host directory. A snapshot is a full copy of the tree (owners,
  modes, symlinks and times kept) under ``root/snapshots/<id>`` (mode 0700);
  restoring empties the directory (never following a symlink out of it) and
  copies the snapshot back, keeping the directory itself, its owner and mode.

Ids are deterministic: ``vol-0001``, ``snap-0001``, ``cg-0001``, ``pol-0001``
(clones are volumes). Capabilities can be reduced to imitate a simpler storage:
a method needing one that was not granted raises
:class:`~pgsnap.errors.UnsupportedCapability`; without ``CONSISTENCY_GROUPS``,
:meth:`~MockBackend.create_snapshot_group` snapshots the volumes one after the
other, so their ``created_at`` differ, as a storage without consistency groups does.

Test hooks: :meth:`~MockBackend.inject_fault`, :meth:`~MockBackend.add_latency`,
:meth:`~MockBackend.clear_faults` and the call log :attr:`~MockBackend.calls`.
Faults fire before any state change, so a failed call changes nothing.
Vendor-only operations are named ``ex_*`` (:meth:`~MockBackend.ex_run_policy`,
:meth:`~MockBackend.ex_expire_secure`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Final

import attrs

from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    PgsnapError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.model import Snapshot, SnapshotGroup, SnapshotPolicy, StorageVolume
from pgsnap.protocols import Capability

__all__ = ["DEFAULT_VOLUME_SIZE", "FAULT_POINTS", "MockBackend"]

log = logging.getLogger(__name__)

DEFAULT_VOLUME_SIZE: Final = 1 << 30
"""Size reported for a volume added without ``size_bytes`` (1 GiB)."""

FAULT_POINTS: Final = frozenset(
    {
        "list_volumes",
        "get_volume",
        "list_snapshots",
        "create_snapshot_group",
        "get_snapshot_group",
        "delete_snapshot",
        "delete_snapshot_group",
        "restore_volume",
        "map_volume",
        "unmap_volume",
        "clone_snapshot",
        "list_policies",
        "pause_policy",
        "resume_policy",
        "ex_run_policy",
        "ex_expire_secure",
        "snapshot_volume",
    }
)
"""Names :meth:`MockBackend.inject_fault` and :meth:`MockBackend.add_latency` accept.

The protocol and ``ex_*`` methods, plus ``snapshot_volume``: the copy of one
volume inside :meth:`~MockBackend.create_snapshot_group` (and
:meth:`~MockBackend.ex_run_policy`), called once per volume, to fail a group
half-way through.
"""

_NAME: Final = "mock"
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

    def record(self) -> StorageVolume:
        fields: dict[str, Any] = {  # a dict: the model's converters confuse mypy's attrs plugin
            "id": self.id,
            "name": self.name,
            "size_bytes": self.size_bytes,
            "path": None if self.path is None else str(self.path),
            "mapped_hosts": tuple(sorted(self.hosts)),
            "extra": self.extra,
        }
        return StorageVolume(**fields)


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
        fields: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "volume_ids": self.volume_ids,
            "paused": self.paused,
        }
        return SnapshotPolicy(**fields)


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


def _blob_path(root: Path, key: str) -> Path:
    rel = PurePosixPath(key)
    if not key or rel.is_absolute() or ".." in rel.parts or rel == PurePosixPath("."):
        raise ConfigurationError(
            f"invalid blob key {key!r} for a directory volume",
            hint="use a relative path inside the volume, without '..'",
            key=key,
        )
    return root.joinpath(*rel.parts)


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
    """

    def __init__(
        self,
        *,
        capabilities: Iterable[Capability] | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        root: Path | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        caps = frozenset(Capability) if capabilities is None else frozenset(capabilities)
        bad = [c for c in caps if not isinstance(c, Capability)]
        if bad:
            raise ConfigurationError(
                f"not capabilities: {', '.join(map(repr, bad))}",
                hint="pass members of pgsnap.protocols.Capability",
            )
        self._caps = caps
        self._clock = clock or _utcnow
        self._sleep = sleep or time.sleep
        self._root_arg = None if root is None else Path(os.path.abspath(root))
        self._root: Path | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.RLock()
        self._volumes: dict[str, _Volume] = {}
        self._snaps: dict[str, _Snap] = {}
        self._groups: dict[str, _Group] = {}
        self._policies: dict[str, _Policy] = {}
        self._counters: dict[str, int] = {}
        self._faults: list[_Fault] = []
        self._latency: dict[str, float] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        """Every protocol/``ex_*`` call (and ``snapshot_volume`` step): name and arguments.

        Arguments are positional, in signature order, sequences as tuples,
        e.g. ``("create_snapshot_group", (("vol-0001",), "b1", False))``.
        """

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

    def __repr__(self) -> str:
        with self._lock:
            caps = (
                "all"
                if self._caps == frozenset(Capability)
                else ",".join(sorted(c.value for c in self._caps)) or "none"
            )
            return (
                f"<MockBackend volumes={len(self._volumes)} snapshots={len(self._snaps)} "
                f"groups={len(self._groups)} policies={len(self._policies)} "
                f"capabilities={caps} root={self._root or self._root_arg}>"
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

    def clear_faults(self) -> None:
        """Remove every injected fault and latency (the call log stays)."""
        with self._lock:
            self._faults.clear()
            self._latency.clear()

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

        ``path`` needs ``DIRECTORY_VOLUMES``; it may not overlap another
        volume's directory or the snapshot ``root``. ``volume_id`` overrides
        the generated ``vol-NNNN``.
        """
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
            raise ConfigurationError(f"size_bytes must be an integer >= 0, got {size_bytes!r}")
        with self._lock:
            if volume_id is not None and volume_id in self._volumes:
                raise ConfigurationError(
                    f"volume id {volume_id!r} is already used",
                    hint="leave volume_id out to get a fresh vol-NNNN id",
                    volume_id=volume_id,
                )
            directory: Path | None = None
            if path is not None:
                self._require(Capability.DIRECTORY_VOLUMES, "directory-backed volumes")
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
            return vol.record()

    def write_blob(self, volume_id: str, key: str, data: bytes) -> None:
        """Set the content ``key`` of a volume (a file relative to a directory volume)."""
        with self._lock:
            vol = self._volume(volume_id)
            if vol.path is None:
                vol.blobs[key] = bytes(data)
                return
            target = _blob_path(vol.path, key)
        with self._os_errors(f"writing {key!r} to volume {volume_id!r}", volume_id=volume_id):
            target.write_bytes(data)

    def read_blob(self, volume_id: str, key: str) -> bytes:
        """The content ``key`` of a volume; ``BackendError`` if it was never written."""
        with self._lock:
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
        with self._lock:
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
        with self._lock:
            return tuple(self._volumes[v].record() for v in sorted(self._volumes))

    def get_volume(self, volume_id: str) -> StorageVolume:
        """One volume; ``VolumeNotFound`` if it does not exist."""
        self._enter("get_volume", volume_id)
        with self._lock:
            return self._volume(volume_id).record()

    def list_snapshots(self, volume_id: str | None = None) -> tuple[Snapshot, ...]:
        """Snapshots (of one volume, or all), oldest first (ties in creation order)."""
        self._enter("list_snapshots", volume_id)
        with self._lock:
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
        with self._lock:
            return self._group_record(self._group(group_id))

    def list_policies(self) -> tuple[SnapshotPolicy, ...]:
        """Snapshot policies sorted by id; an empty tuple without ``POLICIES``."""
        self._enter("list_policies")
        with self._lock:
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
        with self._lock:
            return self._create_group(ids, name, secure=secure, policy_id=None)

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete one snapshot; refused for a secure one; ``SnapshotNotFound`` if unknown."""
        self._enter("delete_snapshot", snapshot_id)
        with self._lock:
            snap = self._snap(snapshot_id)
            self._refuse_secure([snap])
            self._drop_snapshot(snap)

    def delete_snapshot_group(self, group_id: str) -> None:
        """Delete every snapshot of a group (none if one of them is secure)."""
        self._enter("delete_snapshot_group", group_id)
        with self._lock:
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
        """
        self._enter("restore_volume", volume_id, snapshot_id)
        with self._lock:
            vol = self._volume(volume_id)
            snap = self._snap(snapshot_id)
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
                return
            with self._os_errors(f"restore of volume {volume_id!r}", volume_id=volume_id):
                if vol.path.is_dir():
                    _empty_dir(vol.path)
                else:
                    os.mkdir(vol.path, 0o700)
                    _copy_into(snap.tree, vol.path)
                    _copy_meta(os.lstat(snap.tree), vol.path)
                    return
                _copy_into(snap.tree, vol.path)
            log.debug("mock: restored %s from %s", volume_id, snapshot_id)

    # ------------------------------------------------------------------ protocol: hosts

    def map_volume(self, volume_id: str, host: str) -> None:
        """Make the volume visible to ``host`` (needs ``MAPPING``); idempotent."""
        self._enter("map_volume", volume_id, host)
        with self._lock:
            self._require(Capability.MAPPING, "mapping volumes to hosts")
            vol = self._volume(volume_id)
            vol.hosts.add(self._check_host(host))

    def unmap_volume(self, volume_id: str, host: str) -> None:
        """Hide the volume from ``host`` (needs ``MAPPING``); idempotent."""
        self._enter("unmap_volume", volume_id, host)
        with self._lock:
            self._require(Capability.MAPPING, "mapping volumes to hosts")
            vol = self._volume(volume_id)
            vol.hosts.discard(self._check_host(host))

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
        with self._lock:
            self._require(Capability.CLONES, "clones")
            snap = self._snap(snapshot_id)
            vid = self._next_id("vol", self._volumes)
            extra = {"clone_of": snapshot_id}
            if snap.home is None:
                assert snap.blobs is not None
                vol = _Volume(vid, name, self._size_of(snap), None, dict(snap.blobs))
                vol.extra = {"kind": "memory", **extra}
            else:
                target = self._clone_target(vid, path)
                with self._os_errors(f"clone of snapshot {snapshot_id!r}", snapshot_id=snapshot_id):
                    try:
                        os.mkdir(target, 0o700)
                        _copy_into(snap.tree, target)
                        _copy_meta(os.lstat(snap.tree), target)
                    except BaseException:
                        shutil.rmtree(target, ignore_errors=True)
                        raise
                vol = _Volume(vid, name, self._size_of(snap), target)
                vol.extra = {"kind": "directory", **extra}
            self._volumes[vid] = vol
            log.debug("mock: cloned %s into %s", snapshot_id, vid)
            return vol.record()

    # ------------------------------------------------------------------ protocol: policies

    def pause_policy(self, policy_id: str) -> None:
        """Stop a policy from taking or rotating snapshots (needs ``POLICIES``); idempotent."""
        self._enter("pause_policy", policy_id)
        with self._lock:
            self._require(Capability.POLICIES, "snapshot policies")
            self._policy(policy_id).paused = True

    def resume_policy(self, policy_id: str) -> None:
        """Let a paused policy run again (needs ``POLICIES``); idempotent."""
        self._enter("resume_policy", policy_id)
        with self._lock:
            self._require(Capability.POLICIES, "snapshot policies")
            self._policy(policy_id).paused = False

    # ------------------------------------------------------------------ vendor-only (ex_)

    def ex_run_policy(self, policy_id: str) -> SnapshotGroup:
        """Run a policy once, as its schedule would: snapshot its volumes, then rotate.

        Refused with :class:`~pgsnap.errors.BackendError` while the policy is
        paused. The group is named ``<policy name>-<run number>``; with
        ``retain``, the oldest non-secure runs beyond it are deleted.
        """
        self._enter("ex_run_policy", policy_id)
        with self._lock:
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
        with self._lock:
            self._require(Capability.SECURE_SNAPSHOTS, "secure snapshots")
            snap = self._snap(snapshot_id)
            snap.record = attrs.evolve(snap.record, secure=False)

    # ------------------------------------------------------------------ internals: calls

    def _check_fault_point(self, method: str) -> None:
        if method not in FAULT_POINTS:
            raise ConfigurationError(
                f"{method!r} is not a mock method that can fail",
                hint=f"choose one of: {', '.join(sorted(FAULT_POINTS))}",
                method=method,
            )

    def _enter(self, method: str, *args: Any) -> None:
        """Log and record a call, wait its latency, and fire its fault if one is due."""
        with self._lock:
            self.calls.append((method, args))
            delay = self._latency.get(method, 0.0)
        log.debug("mock.%s%r", method, args)
        if delay:
            self._sleep(delay)
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

    def _check_host(self, host: str) -> str:
        if not isinstance(host, str) or not host.strip():
            raise ConfigurationError(
                f"invalid host name {host!r}",
                hint="give the host's name as the storage knows it",
                backend=_NAME,
                host=repr(host),
            )
        return host

    def _next_id(self, prefix: str, used: dict[str, Any]) -> str:
        n = self._counters.get(prefix, 0)
        while True:
            n += 1
            candidate = f"{prefix}-{n:04d}"
            if candidate not in used:
                self._counters[prefix] = n
                return candidate

    def _now(self) -> dt.datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ConfigurationError(
                "the mock's clock returned a naive datetime",
                hint="return aware times, e.g. datetime.now(timezone.utc)",
            )
        return now

    def _group_record(self, group: _Group) -> SnapshotGroup:
        fields: dict[str, Any] = {
            "id": group.id,
            "name": group.name,
            "created_at": group.created_at,
            "snapshots": tuple(self._snaps[s].record for s in group.snapshot_ids),
        }
        return SnapshotGroup(**fields)

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
            os.mkdir(home, 0o700)
            os.chmod(home, 0o700)
            try:
                tree = home / "tree"
                os.mkdir(tree, 0o700)
                _copy_into(vol.path, tree)
                _copy_meta(os.lstat(vol.path), tree)
            except BaseException:
                shutil.rmtree(home, ignore_errors=True)
                raise
        return home

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
        counters = dict(self._counters)
        consistent = Capability.CONSISTENCY_GROUPS in self._caps
        instant = self._now() if consistent else None
        group_id = self._next_id("cg", self._groups)
        taken: list[_Snap] = []
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
                sid = self._next_id("snap", self._snaps)
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
                self._counters = counters
                log.debug(
                    "mock: group %r failed at %s; removed %d snapshot(s)", name, vol.id, len(taken)
                )
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt and friends pass through unchanged
                raise _group_failure(exc, name, vol.id, index, len(vols)) from exc
        for snap in taken:
            self._snaps[snap.record.id] = snap
        group = _Group(
            group_id, name, taken[0].record.created_at, [s.record.id for s in taken], policy_id
        )
        self._groups[group_id] = group
        log.debug("mock: group %s %r: %s", group_id, name, [s.record.id for s in taken])
        return self._group_record(group)

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
