"""The conformance suite: what "implements :class:`~pgsnap.protocols.StorageBackend`" means.

Every backend, pgsnap's and third parties', runs it. Subclass
:class:`StorageBackendConformance` in a test module (the name must start with
``Test`` for pytest to collect it), say which capabilities the backend
declares in ``declared_capabilities``, and provide four fixtures:

- ``backend``: a fresh backend for each test (clean up after it: a fixture can
  ``yield`` it);
- ``make_volume``: a function ``name -> volume_id`` creating a volume to test
  with (the protocol has no "create volume"); leave it detached: a restore
  may need that;
- ``write_marker`` / ``read_marker``: ``(volume_id, data)`` and
  ``volume_id -> bytes``, putting a marker into a volume's content and reading
  it back, so snapshot/restore/clone round trips are checked for real;
- ``make_policy``: ``(name, volume_ids) -> policy_id``, for a backend that
  declares ``Capability.POLICIES``.

Example::

    import pytest
    from pgsnap.protocols import Capability
    from pgsnap.testing.conformance import StorageBackendConformance
    from acme_pgsnap import AcmeBackend

    class TestAcmeConformance(StorageBackendConformance):
        declared_capabilities = frozenset({Capability.CONSISTENCY_GROUPS, Capability.MAPPING})

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

Only the tests that apply are generated, never skipped: for each
:class:`~pgsnap.protocols.Capability` in ``declared_capabilities`` the class
gets the tests of what it does (attach and detach for ``MAPPING``, clones for
``CLONES``...), and for each one not declared the tests that using it is
refused with :class:`~pgsnap.errors.UnsupportedCapability` (or, without
``CONSISTENCY_GROUPS``, that a group is still taken). They are added when the
class is defined (:meth:`StorageBackendConformance.__init_subclass__`);
:meth:`~StorageBackendConformance.test_declared_capabilities_match_the_backend`
fails unless ``declared_capabilities`` is exactly what the backend declares,
so a capability cannot escape its tests. A test the class defines itself is
kept as it is.

Restores follow the backend's :class:`~pgsnap.model.RestoreProfile`: after
``restore_volume`` the suite calls ``wait_for_restore`` when the profile says
the restore completes later, and its round trip detaches the volume first and
attaches it again when the profile says ``DETACH``. Every failure is checked
to be a :class:`~pgsnap.errors.PgsnapError` of the right class that survives
pickling.

This module imports pytest; nothing in :mod:`pgsnap` imports it.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Final, NoReturn, TypeVar

import pytest

from pgsnap.errors import (
    BackendError,
    PgsnapError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.model import (
    Location,
    LocationKind,
    RestoreProfile,
    Snapshot,
    SnapshotGroup,
    SnapshotPolicy,
    StorageVolume,
)
from pgsnap.protocols import Capability, DeletableClones, StorageBackend

__all__ = [
    "CAPABILITY_TESTS",
    "NONSENSE_ID",
    "NONSENSE_IDS",
    "RESTORE_TIMEOUT",
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
NONSENSE_IDS: Final = (NONSENSE_ID, "", "../../etc/passwd", "vol-\x00")
"""Ids no backend knows: unknown, empty, a path outside, a NUL byte."""
"""An id no backend should know."""

RESTORE_TIMEOUT: Final = 600.0
"""Seconds the suite gives ``wait_for_restore``."""

_HOST: Final = "pgsnap-conformance-host"
_E = TypeVar("_E", bound=PgsnapError)


def _fail_missing(fixture: str) -> NoReturn:
    pytest.fail(
        f"the conformance test class must define the {fixture!r} fixture "
        "(see pgsnap.testing.conformance)",
        pytrace=False,
    )


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


def _restore(backend: StorageBackend, volume_id: str, snapshot_id: str) -> None:
    """Restore a detached volume and wait when its profile says the restore completes later."""
    profile = backend.restore_profile(volume_id)
    backend.restore_volume(volume_id, snapshot_id)
    if profile.completes_later:
        backend.wait_for_restore(volume_id, timeout=RESTORE_TIMEOUT)


def _snapshot_ids(backend: StorageBackend, volume_id: str | None = None) -> set[str]:
    return {s.id for s in backend.list_snapshots(volume_id)}


def _nonsense_call(
    backend: StorageBackend, make_volume: MakeVolume, operation: str, bad_id: str
) -> Callable[[], object]:
    """The call of ``operation`` with ``bad_id`` (test_nonsense_ids_raise_pgsnap_errors)."""
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
        "restore_profile": lambda: backend.restore_profile(bad_id),
        "wait_for_restore": lambda: backend.wait_for_restore(bad_id, timeout=1.0),
        "locate": lambda: backend.locate(bad_id),
        "create_snapshot_group": lambda: backend.create_snapshot_group(
            [bad_id], "conformance-nonsense"
        ),
        "create_snapshot_group_empty": lambda: backend.create_snapshot_group(
            [], "conformance-nonsense"
        ),
        "attach": lambda: backend.attach(bad_id, _HOST),
        "detach": lambda: backend.detach(bad_id, _HOST),
        "clone_snapshot": lambda: backend.clone_snapshot(bad_id, "conformance-nonsense"),
        "pause_policy": lambda: backend.pause_policy(bad_id),
        "resume_policy": lambda: backend.resume_policy(bad_id),
    }
    return calls[operation]


# --------------------------------------------------------------------------- capability tests
#
# These classes are never collected themselves (their names do not start with
# "Test"): StorageBackendConformance.__init_subclass__ copies their test_*
# functions into a test class, the first class of a pair when the capability
# is declared, the second when it is not.


class _ConsistencyGroupsTests:
    def test_consistency_group_shares_one_instant(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """With CONSISTENCY_GROUPS every snapshot of a group has the same ``created_at``."""
        vids = [make_volume("conformance-cg1"), make_volume("conformance-cg2")]
        group = backend.create_snapshot_group(vids, "conformance-cg")
        assert len({s.created_at for s in group.snapshots}) == 1


class _NoConsistencyGroupsTests:
    def test_group_without_consistency_groups_has_every_volume(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Without CONSISTENCY_GROUPS a group is not refused: one snapshot per volume."""
        vids = [make_volume("conformance-no-cg-1"), make_volume("conformance-no-cg-2")]
        group = backend.create_snapshot_group(vids, "conformance-no-cg")
        assert sorted(s.volume_id for s in group.snapshots) == sorted(vids)
        assert all(s.group_id == group.id for s in group.snapshots)


class _MappingTests:
    def test_attach_detach_idempotent(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Attaching twice attaches once; detaching twice detaches; ``mapped_hosts`` follows."""
        vid = make_volume("conformance-attach")
        backend.attach(vid, _HOST)
        backend.attach(vid, _HOST)
        assert backend.get_volume(vid).mapped_hosts.count(_HOST) == 1
        backend.detach(vid, _HOST)
        backend.detach(vid, _HOST)
        assert _HOST not in backend.get_volume(vid).mapped_hosts

    def test_attach_detach_unknown_volume(self, backend: StorageBackend) -> None:
        """Attaching or detaching an unknown volume raises VolumeNotFound."""
        for call in (backend.attach, backend.detach):
            err = _raises(VolumeNotFound, call, NONSENSE_ID, _HOST)
            assert getattr(err, "volume_id", None) == NONSENSE_ID


class _NoMappingTests:
    def test_attach_detach_refused_without_mapping(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Without MAPPING, attach and detach raise UnsupportedCapability."""
        vid = make_volume("conformance-no-mapping")
        _raises(UnsupportedCapability, backend.attach, vid, _HOST)
        _raises(UnsupportedCapability, backend.detach, vid, _HOST)
        assert _HOST not in backend.get_volume(vid).mapped_hosts


class _PoliciesTests:
    def test_policies_are_listed(
        self, backend: StorageBackend, make_volume: MakeVolume, make_policy: MakePolicy
    ) -> None:
        """With POLICIES, ``list_policies`` returns SnapshotPolicy records, the new one too."""
        vid = make_volume("conformance-policy-list")
        pid = make_policy("conformance-policy-list", [vid])
        policies = backend.list_policies()
        assert isinstance(policies, tuple)
        assert all(isinstance(p, SnapshotPolicy) for p in policies)
        assert pid in {p.id for p in policies}

    def test_pause_resume_idempotent(
        self, backend: StorageBackend, make_volume: MakeVolume, make_policy: MakePolicy
    ) -> None:
        """Pausing twice pauses; resuming twice resumes; ``paused`` follows."""
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


class _NoPoliciesTests:
    def test_policies_refused_without_capability(self, backend: StorageBackend) -> None:
        """Without POLICIES there are none, and pausing or resuming is UnsupportedCapability."""
        assert backend.list_policies() == ()
        _raises(UnsupportedCapability, backend.pause_policy, NONSENSE_ID)
        _raises(UnsupportedCapability, backend.resume_policy, NONSENSE_ID)


class _SecureSnapshotsTests:
    def test_secure_snapshot_cannot_be_deleted(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """A secure snapshot (and its group) cannot be deleted: BackendError, still listed."""
        vid = make_volume("conformance-secure")
        group = backend.create_snapshot_group([vid], "conformance-secure", secure=True)
        snap = group.snapshots[0]
        assert snap.secure
        err = _raises(BackendError, backend.delete_snapshot, snap.id)
        assert not isinstance(err, LookupError)
        _raises(BackendError, backend.delete_snapshot_group, group.id)
        assert snap.id in _snapshot_ids(backend, vid)


class _NoSecureSnapshotsTests:
    def test_secure_snapshot_refused_without_capability(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Without SECURE_SNAPSHOTS a secure group is UnsupportedCapability and takes nothing."""
        vid = make_volume("conformance-no-secure")
        before = backend.list_snapshots(vid)
        _raises(
            UnsupportedCapability,
            backend.create_snapshot_group,
            [vid],
            "conformance-no-secure",
            secure=True,
        )
        assert backend.list_snapshots(vid) == before


class _ClonesTests:
    def test_clone_is_independent(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """A clone is a new volume with the snapshot's content; writes do not cross over;
        it outlives the snapshot (deleted after the clone is made); a backend that can
        delete clones (``DeletableClones``) deletes it and only it.
        A volume whose restore profile gives a ``clone_refusal`` has its clones refused
        with UnsupportedCapability instead, and no volume is added."""
        origin = make_volume("conformance-origin")
        write_marker(origin, b"snapshotted")
        snap = backend.create_snapshot_group([origin], "conformance-clone").snapshots[0]
        write_marker(origin, b"origin-later")
        refusal = backend.restore_profile(origin).clone_refusal
        if refusal:
            before = backend.list_volumes()
            _raises(UnsupportedCapability, backend.clone_snapshot, snap.id, "conformance-clone")
            assert backend.list_volumes() == before
            assert read_marker(origin) == b"origin-later"
            return
        clone = backend.clone_snapshot(snap.id, "conformance-clone")
        assert isinstance(clone, StorageVolume)
        assert clone.id != origin
        assert clone.id in {v.id for v in backend.list_volumes()}
        assert read_marker(clone.id) == b"snapshotted"
        write_marker(clone.id, b"clone-write")
        assert read_marker(origin) == b"origin-later"
        write_marker(origin, b"origin-write")
        assert read_marker(clone.id) == b"clone-write"
        _restore(backend, origin, snap.id)
        assert read_marker(origin) == b"snapshotted"
        assert read_marker(clone.id) == b"clone-write"
        _raises(SnapshotNotFound, backend.clone_snapshot, NONSENSE_ID, "conformance-none")
        if isinstance(backend, DeletableClones):
            _raises(BackendError, backend.delete_clone, origin)
            assert read_marker(origin) == b"snapshotted"
            backend.delete_clone(clone.id)
            assert clone.id not in {v.id for v in backend.list_volumes()}
            assert origin in {v.id for v in backend.list_volumes()}
            assert snap.id in _snapshot_ids(backend, origin)
            backend.delete_clone(clone.id)  # idempotent
            clone = backend.clone_snapshot(snap.id, "conformance-clone-2")
            write_marker(clone.id, b"clone-write")
        # The clone outlives its snapshot (a standby seeded from a backup that expires).
        backend.delete_snapshot(snap.id)
        assert snap.id not in _snapshot_ids(backend, origin)
        assert read_marker(clone.id) == b"clone-write"
        if isinstance(backend, DeletableClones):
            backend.delete_clone(clone.id)


class _NoClonesTests:
    def test_clone_refused_without_capability(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """Without CLONES, cloning a snapshot is UnsupportedCapability and adds no volume."""
        vid = make_volume("conformance-no-clone")
        snap = backend.create_snapshot_group([vid], "conformance-no-clone").snapshots[0]
        before = backend.list_volumes()
        _raises(UnsupportedCapability, backend.clone_snapshot, snap.id, "conformance-clone")
        assert backend.list_volumes() == before


CAPABILITY_TESTS: Final[Mapping[Capability, tuple[type, type]]] = {
    Capability.CONSISTENCY_GROUPS: (_ConsistencyGroupsTests, _NoConsistencyGroupsTests),
    Capability.POLICIES: (_PoliciesTests, _NoPoliciesTests),
    Capability.MAPPING: (_MappingTests, _NoMappingTests),
    Capability.SECURE_SNAPSHOTS: (_SecureSnapshotsTests, _NoSecureSnapshotsTests),
    Capability.CLONES: (_ClonesTests, _NoClonesTests),
}
"""For each capability, the tests added when it is declared and those added when it is not."""


def _test_functions(holder: type) -> dict[str, Callable[..., None]]:
    return {k: v for k, v in vars(holder).items() if k.startswith("test_") and callable(v)}


def _capability_set(cls: type, value: object) -> frozenset[Capability] | None:
    if value is None:
        return None
    if isinstance(value, Capability) or not isinstance(value, Iterable):
        raise TypeError(
            f"{cls.__qualname__}.declared_capabilities must be a set of Capability, not {value!r}"
        )
    found = frozenset(value)
    bad = [repr(c) for c in found if not isinstance(c, Capability)]
    if bad:
        raise TypeError(
            f"{cls.__qualname__}.declared_capabilities holds non-capabilities: {', '.join(bad)}"
        )
    return found


def _add_capability_tests(cls: type) -> None:
    """Give ``cls`` the capability tests that apply to ``declared_capabilities``."""
    missing = [c.name for c in Capability if c not in CAPABILITY_TESTS]
    if missing:  # a Capability added to the protocol without tests here
        raise TypeError(f"the conformance suite has no tests for {', '.join(missing)}")
    declared = _capability_set(cls, getattr(cls, "declared_capabilities", None))
    ours: dict[str, Callable[..., None]] = {}
    wanted: dict[str, Callable[..., None]] = {}
    for capability, (with_it, without_it) in CAPABILITY_TESTS.items():
        for holder in (with_it, without_it):
            ours.update(_test_functions(holder))
        if declared is not None:
            chosen = with_it if capability in declared else without_it
            wanted.update(_test_functions(chosen))
    for name in ours:
        if name in vars(cls):
            continue  # the class's own definition wins
        inherited = getattr(cls, name, None)
        if inherited is not None and inherited not in ours.values():
            continue  # a base test class overrides it
        # An inherited test that no longer applies is hidden (None is not collected).
        setattr(cls, name, wanted.get(name))


class StorageBackendConformance:
    """Tests every :class:`~pgsnap.protocols.StorageBackend` must pass.

    Subclass it as ``Test...``, set :attr:`declared_capabilities` and override
    the fixtures :meth:`backend`, :meth:`make_volume`, :meth:`write_marker`,
    :meth:`read_marker` (and :meth:`make_policy` for backends with policies).
    """

    declared_capabilities: ClassVar[frozenset[Capability] | None] = None
    """The capabilities the backend under test declares (its ``capabilities``).

    Decides which capability tests the class gets (see the module docstring).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Add the capability tests that apply to the subclass's ``declared_capabilities``."""
        super().__init_subclass__(**kwargs)
        _add_capability_tests(cls)

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
        _fail_missing("make_policy")

    # ------------------------------------------------------------------ identity and volumes

    def test_name_and_capabilities(self, backend: StorageBackend) -> None:
        """``name`` is a non-empty string; ``capabilities`` a frozenset of Capability."""
        assert isinstance(backend.name, str)
        assert backend.name
        assert isinstance(backend.capabilities, frozenset)
        assert all(isinstance(c, Capability) for c in backend.capabilities)

    def test_declared_capabilities_match_the_backend(self, backend: StorageBackend) -> None:
        """The test class's ``declared_capabilities`` are the backend's ``capabilities``."""
        declared = type(self).declared_capabilities
        actual = ", ".join(sorted(f"Capability.{c.name}" for c in backend.capabilities))
        if declared is None:
            pytest.fail(
                f"{type(self).__name__} must set declared_capabilities to what the backend "
                f"declares: frozenset({{{actual}}}) (it decides which tests run)",
                pytrace=False,
            )
        if frozenset(declared) != backend.capabilities:
            pytest.fail(
                f"{type(self).__name__}.declared_capabilities is not what backend "
                f"{backend.name!r} declares ({{{actual}}}): the wrong capability tests ran",
                pytrace=False,
            )

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
        for call in (backend.locate, backend.restore_profile):
            err = _raises(VolumeNotFound, call, NONSENSE_ID)
            assert getattr(err, "volume_id", None) == NONSENSE_ID
        err = _raises(VolumeNotFound, backend.wait_for_restore, NONSENSE_ID, timeout=1.0)
        assert getattr(err, "volume_id", None) == NONSENSE_ID

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

    # ------------------------------------------------------------------ where hosts find volumes

    def test_locate_returns_a_location(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """``locate`` says how a host finds a volume: a directory or a device, by absolute path.

        A pure lookup: the same answer twice, whether or not the volume is attached.
        """
        vid = make_volume("conformance-locate")
        location = backend.locate(vid)
        assert isinstance(location, Location)
        assert isinstance(location.kind, LocationKind)
        assert isinstance(location.path, str)
        assert location.path.startswith("/"), f"not an absolute path: {location.path!r}"
        assert backend.locate(vid) == location
        if Capability.MAPPING in backend.capabilities:
            backend.attach(vid, _HOST)
            assert backend.locate(vid) == location
            backend.detach(vid, _HOST)

    def test_restore_profile_is_consistent(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """``restore_profile`` is a RestoreProfile; one that detaches needs MAPPING."""
        vid = make_volume("conformance-profile")
        profile = backend.restore_profile(vid)
        assert isinstance(profile, RestoreProfile)
        if profile.detaches:
            assert Capability.MAPPING in backend.capabilities, (
                f"the restore profile of {vid!r} says DETACH, but the backend does not "
                "declare MAPPING: the plan could not detach it"
            )
        assert backend.restore_profile(vid) == profile

    def test_restore_round_trip_follows_the_profile(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """Restore as a plan does: detach first if the profile says so, wait if it
        completes later, attach again; the volume then has the snapshot's content."""
        vid = make_volume("conformance-round-trip")
        write_marker(vid, b"snapshotted")
        snap = backend.create_snapshot_group([vid], "conformance-round-trip").snapshots[0]
        write_marker(vid, b"later")
        profile = backend.restore_profile(vid)
        if profile.detaches:
            backend.attach(vid, _HOST)  # in use on the database host, as in production
            backend.detach(vid, _HOST)
        backend.restore_volume(vid, snap.id)
        if profile.completes_later:
            backend.wait_for_restore(vid, timeout=RESTORE_TIMEOUT)
        if profile.detaches:
            backend.attach(vid, _HOST)
            assert _HOST in backend.get_volume(vid).mapped_hosts
        assert read_marker(vid) == b"snapshotted"
        backend.wait_for_restore(vid, timeout=RESTORE_TIMEOUT)  # complete: returns at once
        if not profile.consumes_snapshot:
            assert snap.id in _snapshot_ids(backend, vid)
        if profile.detaches:
            backend.detach(vid, _HOST)

    def test_wait_for_restore_returns_after_a_completed_restore(
        self, backend: StorageBackend, make_volume: MakeVolume
    ) -> None:
        """After a restore, ``wait_for_restore`` returns (again and again); the volume can
        be snapshotted again."""
        vid = make_volume("conformance-wait")
        snap = backend.create_snapshot_group([vid], "conformance-wait").snapshots[0]
        backend.restore_volume(vid, snap.id)
        backend.wait_for_restore(vid, timeout=RESTORE_TIMEOUT)
        backend.wait_for_restore(vid, timeout=RESTORE_TIMEOUT)
        again = backend.create_snapshot_group([vid], "conformance-wait-again")
        assert again.for_volume(vid).id in _snapshot_ids(backend, vid)

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
        listed = _snapshot_ids(backend)
        assert {s.id for s in group.snapshots} <= listed
        for vid in vids:
            assert group.for_volume(vid).id in _snapshot_ids(backend, vid)

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
            _restore(backend, vid, group.for_volume(vid).id)
        for n, vid in enumerate(vids):
            assert read_marker(vid) == f"before-{n}".encode()

    def test_restore_keeps_snapshot(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        write_marker: WriteMarker,
        read_marker: ReadMarker,
    ) -> None:
        """The snapshot survives a restore and can be restored from again (unless the
        profile says the restore consumes it)."""
        vid = make_volume("conformance-twice")
        write_marker(vid, b"one")
        snap = backend.create_snapshot_group([vid], "conformance-twice").snapshots[0]
        consumed = backend.restore_profile(vid).consumes_snapshot
        for data in (b"two",) if consumed else (b"two", b"three"):
            write_marker(vid, data)
            _restore(backend, vid, snap.id)
            assert read_marker(vid) == b"one"
        if not consumed:
            assert snap.id in _snapshot_ids(backend, vid)

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
        assert gone.id not in _snapshot_ids(backend)
        assert kept.id in _snapshot_ids(backend)
        _raises(SnapshotNotFound, backend.delete_snapshot, gone.id)
        _raises(SnapshotNotFound, backend.restore_volume, gone.volume_id, gone.id)

    def test_delete_snapshot_group(self, backend: StorageBackend, make_volume: MakeVolume) -> None:
        """Deleting a group deletes its snapshots; the group is then SnapshotNotFound."""
        vids = [make_volume("conformance-dg1"), make_volume("conformance-dg2")]
        group = backend.create_snapshot_group(vids, "conformance-delete-group")
        backend.delete_snapshot_group(group.id)
        assert not _snapshot_ids(backend) & {s.id for s in group.snapshots}
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
            "restore_profile",
            "wait_for_restore",
            "locate",
            "create_snapshot_group",
            "create_snapshot_group_empty",
            "attach",
            "detach",
            "clone_snapshot",
            "pause_policy",
            "resume_policy",
        ],
    )
    def test_nonsense_ids_raise_pgsnap_errors(
        self,
        backend: StorageBackend,
        make_volume: MakeVolume,
        operation: str,
    ) -> None:
        """Whatever the id (:data:`NONSENSE_IDS`), a backend raises a pgsnap error,
        never a library's exception."""
        for bad_id in NONSENSE_IDS:
            call = _nonsense_call(backend, make_volume, operation, bad_id)
            try:
                err = _raises(PgsnapError, call)
            except pytest.fail.Exception as failed:
                pytest.fail(f"{operation} with the id {bad_id!r}: {failed}")
            _roundtrip(err)

    def test_errors_pickle(self, backend: StorageBackend, make_volume: MakeVolume) -> None:
        """The errors a backend raises survive pickling with their message, hint and details."""
        v1, v2 = make_volume("conformance-p1"), make_volume("conformance-p2")
        snap = backend.create_snapshot_group([v1], "conformance-pickle").snapshots[0]
        errors: list[PgsnapError] = [
            _raises(VolumeNotFound, backend.get_volume, NONSENSE_ID),
            _raises(VolumeNotFound, backend.locate, NONSENSE_ID),
            _raises(SnapshotNotFound, backend.get_snapshot_group, NONSENSE_ID),
            _raises(BackendError, backend.restore_volume, v2, snap.id),
        ]
        if Capability.MAPPING not in backend.capabilities:
            errors.append(_raises(UnsupportedCapability, backend.attach, v1, _HOST))
        for err in errors:
            _roundtrip(err)
