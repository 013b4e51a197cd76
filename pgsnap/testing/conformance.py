"""The conformance suite: what "implements :class:`~pgsnap.protocols.StorageBackend`" means.

Every backend, pgsnap's and third parties', runs it. Subclass
:class:`StorageBackendConformance` in a test module (the name must start with
``Test`` for pytest to collect it) and provide four fixtures:

- ``backend``: a fresh backend for each test (clean up after it: a fixture can
  ``yield`` it);
- ``make_volume``: a function ``name -> volume_id`` creating a volume to test
  with (the protocol has no "create volume");
- ``write_marker`` / ``read_marker``: ``(volume_id, data)`` and
  ``volume_id -> bytes``, putting a marker into a volume's content and reading
  it back, so snapshot/restore/clone round trips are checked for real;
- optionally ``make_policy``: ``(name, volume_ids) -> policy_id`` for backends
  with ``Capability.POLICIES`` (without it the policy tests skip).

Example::

    import pytest
    from pgsnap.testing.conformance import StorageBackendConformance
    from acme_pgsnap import AcmeBackend

    class TestAcmeConformance(StorageBackendConformance):
        @pytest.fixture
        def backend(self):
            backend = AcmeBackend(url="https://lab.example")
            yield backend
            backend.ex_delete_everything_created_by_tests()

        @pytest.fixture
        def make_volume(self, backend):
            return lambda name: backend.ex_create_volume(name, size_gb=1).id

        @pytest.fixture
        def write_marker(self, backend):
            return lambda volume_id, data: acme_lab.write_first_block(volume_id, data)

        @pytest.fixture
        def read_marker(self, backend):
            return lambda volume_id: acme_lab.read_first_block(volume_id)

Tests of a capability the backend does not declare are skipped, and
:meth:`~StorageBackendConformance.test_undeclared_capability_is_refused` checks
that using it raises :class:`~pgsnap.errors.UnsupportedCapability` instead.
Every failure is checked to be a :class:`~pgsnap.errors.PgsnapError` of the
right class that survives pickling.

This module imports pytest; nothing in :mod:`pgsnap` imports it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn, TypeVar

import pytest

from pgsnap.errors import (
    BackendError,
    PgsnapError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.model import Snapshot, SnapshotGroup, SnapshotPolicy, StorageVolume
from pgsnap.protocols import Capability, StorageBackend

__all__ = [
    "NONSENSE_ID",
    "MakePolicy",
    "MakeVolume",
    "ReadMarker",
    "StorageBackendConformance",
    "WriteMarker",
]

MakeVolume = Callable[[str], str]
"""``make_volume(name) -> volume_id``."""
WriteMarker = Callable[[str, bytes], None]
"""``write_marker(volume_id, data)``: replace the volume's marker with ``data``."""
ReadMarker = Callable[[str], bytes]
"""``read_marker(volume_id) -> bytes``: the volume's current marker."""
MakePolicy = Callable[[str, Sequence[str]], str]
"""``make_policy(name, volume_ids) -> policy_id``."""

NONSENSE_ID: Final = "pgsnap-conformance-no-such-id"
"""An id no backend should know."""

_HOST: Final = "pgsnap-conformance-host"
_E = TypeVar("_E", bound=PgsnapError)


def _fail_missing(fixture: str) -> NoReturn:
    pytest.fail(
        f"the conformance test class must define the {fixture!r} fixture "
        "(see pgsnap.testing.conformance)",
        pytrace=False,
    )


def _need(backend: StorageBackend, capability: Capability) -> None:
    if capability not in backend.capabilities:
        pytest.skip(f"backend {backend.name!r} does not declare {capability.name}")


def _raises(expected: type[_E], call: Callable[..., object], *args: Any, **kwargs: Any) -> _E:
    """Call and return the error, failing unless it is an ``expected`` pgsnap error."""
    label = f"{getattr(call, '__name__', call)}{args!r}"
    try:
        call(*args, **kwargs)
    except PgsnapError as exc:
        if not isinstance(exc, expected):
            pytest.fail(
                f"{label} raised {type(exc).__name__} ({exc}), expected {expected.__name__}"
            )
        return exc
    except Exception as exc:
        pytest.fail(
            f"{label} leaked {type(exc).__module__}.{type(exc).__name__}: {exc} "
            f"(a backend raises pgsnap errors only; expected {expected.__name__})"
        )
    pytest.fail(f"{label} did not raise; expected {expected.__name__}")


def _roundtrip(err: PgsnapError) -> None:
    copy = pickle.loads(pickle.dumps(err))  # noqa: S301 - our own bytes
    assert type(copy) is type(err), f"{type(err).__name__} unpickled as {type(copy).__name__}"
    assert str(copy) == str(err)
    assert copy.hint == err.hint
    assert copy.details == err.details


class StorageBackendConformance:
    """Tests every :class:`~pgsnap.protocols.StorageBackend` must pass.

    Subclass it as ``Test...`` and override the fixtures :meth:`backend`,
    :meth:`make_volume`, :meth:`write_marker`, :meth:`read_marker` (and
    :meth:`make_policy` for backends with policies).
    """

    # ------------------------------------------------------------------ fixtures to provide

    @pytest.fixture
    def backend(self) -> StorageBackend:
        """A fresh backend for one test (override this)."""
        _fail_missing("backend")

    @pytest.fixture
    def make_volume(self, backend: StorageBackend) -> MakeVolume:
        """A function creating a volume on ``backend`` and returning its id (override this)."""
        _fail_missing("make_volume")

    @pytest.fixture
    def write_marker(self, backend: StorageBackend) -> WriteMarker:
        """A function writing a marker into a volume's content (override this)."""
        _fail_missing("write_marker")

    @pytest.fixture
    def read_marker(self, backend: StorageBackend) -> ReadMarker:
        """A function reading a volume's marker back (override this)."""
        _fail_missing("read_marker")

    @pytest.fixture
    def make_policy(self, backend: StorageBackend) -> MakePolicy:
        """A function creating a snapshot policy (override it for backends with POLICIES)."""
        pytest.skip("the test class has no make_policy fixture")

    # ------------------------------------------------------------------ identity and volumes

    def test_name_and_capabilities(self, backend: StorageBackend) -> None:
        """``name`` is a non-empty string; ``capabilities`` a frozenset of Capability."""
        assert isinstance(backend.name, str)
        assert backend.name
        assert isinstance(backend.capabilities, frozenset)
        assert all(isinstance(c, Capability) for c in backend.capabilities)

    def test_list_volumes_sorted_and_complete(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Every volume made is listed, as StorageVolume records sorted by id."""
        made = {make_volume("conformance-a"), make_volume("conformance-b")}
        listed = backend.list_volumes()
        assert isinstance(listed, tuple)
        assert all(isinstance(v, StorageVolume) for v in listed)
        ids = [v.id for v in listed]
        assert ids == sorted(ids), "list_volumes() must be sorted by id"
        assert made <= set(ids)
        assert len(made) == 2, "make_volume must return a new id each time"

    def test_get_volume_matches_list(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """``get_volume`` returns the volume ``list_volumes`` has (same id and name)."""
        vid = make_volume("conformance-get")
        got = backend.get_volume(vid)
        assert isinstance(got, StorageVolume)
        assert got.id == vid
        listed = {v.id: v for v in backend.list_volumes()}
        assert listed[vid].name == got.name

    def test_unknown_volume_raises_volume_not_found(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Unknown volume ids raise VolumeNotFound (a LookupError) carrying ``volume_id``."""
        known = make_volume("conformance-known")
        err = _raises(VolumeNotFound, backend.get_volume, NONSENSE_ID)
        assert isinstance(err, LookupError)
        assert isinstance(err, BackendError)
        assert getattr(err, "volume_id", None) == NONSENSE_ID
        _raises(VolumeNotFound, backend.list_snapshots, NONSENSE_ID)
        group = backend.create_snapshot_group([known], "conformance-unknown-volume")
        _raises(VolumeNotFound, backend.restore_volume, NONSENSE_ID, group.snapshots[0].id)

    def test_unknown_snapshot_raises_snapshot_not_found(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Unknown snapshot and group ids raise SnapshotNotFound carrying ``snapshot_id``."""
        vid = make_volume("conformance-unknown-snap")
        for call, args in (
            (backend.get_snapshot_group, (NONSENSE_ID,)),
            (backend.delete_snapshot, (NONSENSE_ID,)),
            (backend.delete_snapshot_group, (NONSENSE_ID,)),
            (backend.restore_volume, (vid, NONSENSE_ID)),
        ):
            err = _raises(SnapshotNotFound, call, *args)
            assert isinstance(err, LookupError)
            assert getattr(err, "snapshot_id", None) == NONSENSE_ID

    # ------------------------------------------------------------------ snapshot groups

    def test_group_snapshots_every_volume(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """A group has one snapshot per volume, each with ``group_id`` set; all listed."""
        vids = [make_volume("conformance-g1"), make_volume("conformance-g2")]
        group = backend.create_snapshot_group(vids, "conformance-group")
        assert isinstance(group, SnapshotGroup)
        assert sorted(s.volume_id for s in group.snapshots) == sorted(vids)
        assert all(isinstance(s, Snapshot) for s in group.snapshots)
        assert all(s.group_id == group.id for s in group.snapshots)
        assert len({s.id for s in group.snapshots}) == len(vids)
        again = backend.get_snapshot_group(group.id)
        assert (again.id, again.name) == (group.id, group.name)
        assert {s.id for s in again.snapshots} == {s.id for s in group.snapshots}
        listed = {s.id for s in backend.list_snapshots()}
        assert {s.id for s in group.snapshots} <= listed
        for vid in vids:
            assert group.for_volume(vid).id in {s.id for s in backend.list_snapshots(vid)}

    def test_consistency_group_shares_one_instant(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """With CONSISTENCY_GROUPS every snapshot of a group has the same ``created_at``."""
        _need(backend, Capability.CONSISTENCY_GROUPS)
        vids = [make_volume("conformance-cg1"), make_volume("conformance-cg2")]
        group = backend.create_snapshot_group(vids, "conformance-cg")
        assert len({s.created_at for s in group.snapshots}) == 1

    def test_failed_group_leaves_nothing(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """A group naming an unknown volume fails with VolumeNotFound and takes no snapshot."""
        vid = make_volume("conformance-all-or-nothing")
        err = _raises(
            VolumeNotFound, backend.create_snapshot_group, [vid, NONSENSE_ID], "conformance-bad"
        )
        assert getattr(err, "volume_id", None) == NONSENSE_ID
        assert backend.list_snapshots(vid) == ()

    def test_group_content_is_content_at_snapshot_time(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """Write, snapshot, overwrite, restore: each volume reads what it had at snapshot time."""
        vids = [make_volume("conformance-c1"), make_volume("conformance-c2")]
        for n, vid in enumerate(vids):
            write_marker(vid, f"before-{n}".encode())
        group = backend.create_snapshot_group(vids, "conformance-content")
        for vid in vids:
            write_marker(vid, b"after")
        for vid in vids:
            assert read_marker(vid) == b"after"
            backend.restore_volume(vid, group.for_volume(vid).id)
        for n, vid in enumerate(vids):
            assert read_marker(vid) == f"before-{n}".encode()

    def test_restore_keeps_snapshot(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """The snapshot survives a restore and can be restored from again."""
        vid = make_volume("conformance-twice")
        write_marker(vid, b"one")
        snap = backend.create_snapshot_group([vid], "conformance-twice").snapshots[0]
        for data in (b"two", b"three"):
            write_marker(vid, data)
            backend.restore_volume(vid, snap.id)
            assert read_marker(vid) == b"one"
        assert snap.id in {s.id for s in backend.list_snapshots(vid)}

    def test_restore_refuses_snapshot_of_other_volume(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """Restoring a volume from another volume's snapshot is a BackendError; nothing changes."""
        source, other = make_volume("conformance-src"), make_volume("conformance-other")
        write_marker(source, b"source")
        write_marker(other, b"other")
        snap = backend.create_snapshot_group([source], "conformance-wrong").snapshots[0]
        err = _raises(BackendError, backend.restore_volume, other, snap.id)
        assert not isinstance(err, LookupError), "both ids exist: not a 'not found' error"
        assert read_marker(other) == b"other"

    def test_delete_snapshot(self, backend: StorageBackend, make_volume: MakeVolume) -> None:
        """A deleted snapshot is gone from every listing; deleting it again is SnapshotNotFound."""
        vids = [make_volume("conformance-d1"), make_volume("conformance-d2")]
        group = backend.create_snapshot_group(vids, "conformance-delete")
        gone, kept = group.snapshots
        backend.delete_snapshot(gone.id)
        assert gone.id not in {s.id for s in backend.list_snapshots()}
        assert kept.id in {s.id for s in backend.list_snapshots()}
        _raises(SnapshotNotFound, backend.delete_snapshot, gone.id)
        _raises(SnapshotNotFound, backend.restore_volume, gone.volume_id, gone.id)

    def test_delete_snapshot_group(self, backend: StorageBackend, make_volume: MakeVolume) -> None:
        """Deleting a group deletes its snapshots; the group is then SnapshotNotFound."""
        vids = [make_volume("conformance-dg1"), make_volume("conformance-dg2")]
        group = backend.create_snapshot_group(vids, "conformance-delete-group")
        backend.delete_snapshot_group(group.id)
        listed = {s.id for s in backend.list_snapshots()}
        assert not listed & {s.id for s in group.snapshots}
        _raises(SnapshotNotFound, backend.get_snapshot_group, group.id)
        _raises(SnapshotNotFound, backend.delete_snapshot_group, group.id)

    def test_list_snapshots_oldest_first_and_filtered(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """``list_snapshots()`` is oldest first; ``list_snapshots(v)`` only has v's snapshots."""
        v1, v2 = make_volume("conformance-o1"), make_volume("conformance-o2")
        first = backend.create_snapshot_group([v1], "conformance-first")
        second = backend.create_snapshot_group([v1, v2], "conformance-second")
        ours = {s.id for s in (*first.snapshots, *second.snapshots)}
        listed = [s for s in backend.list_snapshots() if s.id in ours]
        assert len(listed) == 3
        times = [s.created_at for s in listed]
        assert times == sorted(times), "list_snapshots() must be oldest first"
        assert listed[0].id == first.snapshots[0].id
        only_v2 = backend.list_snapshots(v2)
        assert [s.id for s in only_v2] == [second.for_volume(v2).id]
        assert [s.id for s in backend.list_snapshots(v1)] == [
            first.for_volume(v1).id,
            second.for_volume(v1).id,
        ]

    # ------------------------------------------------------------------ capabilities

    def test_map_unmap_idempotent(self, backend: StorageBackend, make_volume: MakeVolume) -> None:
        """Mapping twice maps once; unmapping twice unmaps; ``mapped_hosts`` follows."""
        _need(backend, Capability.MAPPING)
        vid = make_volume("conformance-map")
        backend.map_volume(vid, _HOST)
        backend.map_volume(vid, _HOST)
        assert backend.get_volume(vid).mapped_hosts.count(_HOST) == 1
        backend.unmap_volume(vid, _HOST)
        backend.unmap_volume(vid, _HOST)
        assert _HOST not in backend.get_volume(vid).mapped_hosts
        _raises(VolumeNotFound, backend.map_volume, NONSENSE_ID, _HOST)

    def test_policies_are_listed(self, backend: StorageBackend) -> None:
        """With POLICIES, ``list_policies`` returns SnapshotPolicy records."""
        _need(backend, Capability.POLICIES)
        policies = backend.list_policies()
        assert isinstance(policies, tuple)
        assert all(isinstance(p, SnapshotPolicy) for p in policies)

    def test_pause_resume_idempotent(
        self, backend: StorageBackend, make_volume: MakeVolume, make_policy: MakePolicy
    ) -> None:
        """Pausing twice pauses; resuming twice resumes; ``paused`` follows."""
        _need(backend, Capability.POLICIES)
        vid = make_volume("conformance-policy")
        pid = make_policy("conformance-policy", [vid])

        def paused() -> bool:
            (policy,) = [p for p in backend.list_policies() if p.id == pid]
            return policy.paused

        backend.pause_policy(pid)
        backend.pause_policy(pid)
        assert paused()
        backend.resume_policy(pid)
        backend.resume_policy(pid)
        assert not paused()
        _raises(BackendError, backend.pause_policy, NONSENSE_ID)

    def test_clone_is_independent(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """A clone is a new volume with the snapshot's content; writes do not cross over."""
        _need(backend, Capability.CLONES)
        origin = make_volume("conformance-origin")
        write_marker(origin, b"snapshotted")
        snap = backend.create_snapshot_group([origin], "conformance-clone").snapshots[0]
        write_marker(origin, b"origin-later")
        clone = backend.clone_snapshot(snap.id, "conformance-clone")
        assert isinstance(clone, StorageVolume)
        assert clone.id != origin
        assert clone.id in {v.id for v in backend.list_volumes()}
        assert read_marker(clone.id) == b"snapshotted"
        write_marker(clone.id, b"clone-write")
        assert read_marker(origin) == b"origin-later"
        write_marker(origin, b"origin-write")
        assert read_marker(clone.id) == b"clone-write"
        backend.restore_volume(origin, snap.id)
        assert read_marker(origin) == b"snapshotted"
        assert read_marker(clone.id) == b"clone-write"
        _raises(SnapshotNotFound, backend.clone_snapshot, NONSENSE_ID, "conformance-none")

    def test_secure_snapshot_cannot_be_deleted(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """A secure snapshot (and its group) cannot be deleted: BackendError, still listed."""
        _need(backend, Capability.SECURE_SNAPSHOTS)
        vid = make_volume("conformance-secure")
        group = backend.create_snapshot_group([vid], "conformance-secure", secure=True)
        snap = group.snapshots[0]
        assert snap.secure
        err = _raises(BackendError, backend.delete_snapshot, snap.id)
        assert not isinstance(err, LookupError)
        _raises(BackendError, backend.delete_snapshot_group, group.id)
        assert snap.id in {s.id for s in backend.list_snapshots(vid)}

    @pytest.mark.parametrize("capability", list(Capability), ids=lambda c: c.value)
    def test_undeclared_capability_is_refused(
        self, backend: StorageBackend, make_volume: MakeVolume, capability: Capability
    ) -> None:
        """Using a capability the backend does not declare raises UnsupportedCapability."""
        if capability in backend.capabilities:
            pytest.skip(f"backend {backend.name!r} declares {capability.name}")
        if capability is Capability.DIRECTORY_VOLUMES:
            pytest.skip("no protocol method needs DIRECTORY_VOLUMES")
        vid = make_volume(f"conformance-no-{capability.value}")
        if capability is Capability.CONSISTENCY_GROUPS:
            # Not refused: the volumes are snapshotted one after the other.
            other = make_volume("conformance-no-cg-2")
            group = backend.create_snapshot_group([vid, other], "conformance-no-cg")
            assert sorted(s.volume_id for s in group.snapshots) == sorted([vid, other])
            assert all(s.group_id == group.id for s in group.snapshots)
        elif capability is Capability.MAPPING:
            _raises(UnsupportedCapability, backend.map_volume, vid, _HOST)
            _raises(UnsupportedCapability, backend.unmap_volume, vid, _HOST)
        elif capability is Capability.POLICIES:
            assert backend.list_policies() == ()
            _raises(UnsupportedCapability, backend.pause_policy, NONSENSE_ID)
            _raises(UnsupportedCapability, backend.resume_policy, NONSENSE_ID)
        elif capability is Capability.CLONES:
            snap = backend.create_snapshot_group([vid], "conformance-no-clone").snapshots[0]
            _raises(UnsupportedCapability, backend.clone_snapshot, snap.id, "conformance-clone")
        elif capability is Capability.SECURE_SNAPSHOTS:
            before = backend.list_snapshots(vid)
            _raises(
                UnsupportedCapability,
                backend.create_snapshot_group,
                [vid],
                "conformance-no-secure",
                secure=True,
            )
            assert backend.list_snapshots(vid) == before
        else:  # pragma: no cover - a Capability added without a check here
            pytest.fail(f"the conformance suite has no check for {capability.name}")

    # ------------------------------------------------------------------ errors

    @pytest.mark.parametrize(
        "operation",
        [
            "get_volume",
            "list_snapshots",
            "get_snapshot_group",
            "delete_snapshot",
            "delete_snapshot_group",
            "restore_volume",
            "restore_volume_known",
            "create_snapshot_group",
            "create_snapshot_group_empty",
            "map_volume",
            "unmap_volume",
            "clone_snapshot",
            "pause_policy",
            "resume_policy",
        ],
    )
    @pytest.mark.parametrize("bad_id", [NONSENSE_ID, "", "../../etc/passwd", "vol-\x00"])
    def test_nonsense_ids_raise_pgsnap_errors(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        operation: str,
        bad_id: str,
    ) -> None:
        """Whatever the id, a backend raises a pgsnap error, never a library's exception."""
        calls: dict[str, Callable[[], object]] = {
            "get_volume": lambda: backend.get_volume(bad_id),
            "list_snapshots": lambda: backend.list_snapshots(bad_id),
            "get_snapshot_group": lambda: backend.get_snapshot_group(bad_id),
            "delete_snapshot": lambda: backend.delete_snapshot(bad_id),
            "delete_snapshot_group": lambda: backend.delete_snapshot_group(bad_id),
            "restore_volume": lambda: backend.restore_volume(bad_id, bad_id),
            "restore_volume_known": lambda: backend.restore_volume(
                make_volume("conformance-nonsense"), bad_id
            ),
            "create_snapshot_group": lambda: backend.create_snapshot_group(
                [bad_id], "conformance-nonsense"
            ),
            "create_snapshot_group_empty": lambda: backend.create_snapshot_group(
                [], "conformance-nonsense"
            ),
            "map_volume": lambda: backend.map_volume(bad_id, _HOST),
            "unmap_volume": lambda: backend.unmap_volume(bad_id, _HOST),
            "clone_snapshot": lambda: backend.clone_snapshot(bad_id, "conformance-nonsense"),
            "pause_policy": lambda: backend.pause_policy(bad_id),
            "resume_policy": lambda: backend.resume_policy(bad_id),
        }
        err = _raises(PgsnapError, calls[operation])
        _roundtrip(err)

    def test_errors_pickle(self, backend: StorageBackend, make_volume: MakeVolume) -> None:
        """The errors a backend raises survive pickling with their message, hint and details."""
        v1, v2 = make_volume("conformance-p1"), make_volume("conformance-p2")
        snap = backend.create_snapshot_group([v1], "conformance-pickle").snapshots[0]
        errors: list[PgsnapError] = [
            _raises(VolumeNotFound, backend.get_volume, NONSENSE_ID),
            _raises(SnapshotNotFound, backend.get_snapshot_group, NONSENSE_ID),
            _raises(BackendError, backend.restore_volume, v2, snap.id),
        ]
        if Capability.MAPPING not in backend.capabilities:
            errors.append(_raises(UnsupportedCapability, backend.map_volume, v1, _HOST))
        for err in errors:
            _roundtrip(err)
