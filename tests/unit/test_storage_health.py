"""Storage problems before they fail a backup or a restore (issues 11 and 13).

The optional :class:`~pgsnap.protocols.StorageHealth` hook, the
:class:`~pgsnap.model.StorageProblem` record, how ``check`` turns problems
(and a backend that cannot be asked) into findings, the mock's snapshot
limit, and PowerFlex V-Trees near their limit on the simulator. LVM's
problems are tested with its fake runner in ``test_lvm_backend.py``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.backends.lvm import LvmBackend
from pgsnap.backends.mock import MockBackend
from pgsnap.backends.powerflex import PowerFlexBackend, PowerFlexSnapshotLimit
from pgsnap.catalog import MemoryCatalog
from pgsnap.errors import (
    BackendUnavailable,
    ConfigurationError,
    InputError,
    SnapshotLimitError,
)
from pgsnap.model import Severity, StorageProblem, from_dict, to_dict
from pgsnap.observe import gather_check_facts, gather_storage_problems
from pgsnap.planner.checks import check_findings
from pgsnap.protocols import Capability, StorageHealth
from pgsnap.testing.powerflex_sim import PowerFlexSimulator
from tests.unit.test_checks import facts

# --------------------------------------------------------------------------- the record


def test_a_problem_is_data_that_round_trips_and_reads_as_a_sentence() -> None:
    problem = StorageProblem(
        code="snapshot_limit",
        severity=Severity.WARNING,
        message="volume v has 4 of 5 snapshots",
        hint="delete old backups",
        volume_id="v",
        percent_used=80,
    )
    assert problem.percent_used == 80.0 and isinstance(problem.percent_used, float)
    assert str(problem) == "warning: volume v has 4 of 5 snapshots; delete old backups"
    assert str(attrs.evolve(problem, hint="")) == "warning: volume v has 4 of 5 snapshots"
    assert from_dict(StorageProblem, to_dict(problem)) == problem
    with pytest.raises(InputError, match="snake_case"):
        StorageProblem(code="Snapshot Limit", severity=Severity.ERROR, message="x")


def test_the_finding_severity_is_the_models() -> None:
    from pgsnap.planner.backup import Severity as PlannerSeverity

    assert PlannerSeverity is Severity  # one enum: findings and problems compare


# --------------------------------------------------------------------------- the hook


class _Plain:
    """A backend without the hook (its other methods do not matter here)."""

    name = "plain"


class _Raising:
    name = "raising"

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.asked: list[Any] = []

    def storage_problems(self, volume_ids: Sequence[str] | None = None) -> tuple[Any, ...]:
        self.asked.append(volume_ids)
        raise self.error


class _Sloppy:
    name = "sloppy"

    def storage_problems(self, volume_ids: Sequence[str] | None = None) -> tuple[Any, ...]:
        return ("not a problem record",)


def test_which_backends_report_their_health(tmp_path: Path) -> None:
    with MockBackend() as mock:
        assert isinstance(mock, StorageHealth)
    assert isinstance(LvmBackend("vg0"), StorageHealth)
    assert hasattr(PowerFlexBackend, "storage_problems")
    assert not isinstance(_Plain(), StorageHealth)


def test_gathering_never_raises_and_says_why_it_could_not_ask() -> None:
    assert gather_storage_problems(_Plain(), ["v"]) == ((), None)  # type: ignore[arg-type]
    down = _Raising(BackendUnavailable("array down", backend="x", hint="retry"))
    problems, error = gather_storage_problems(down, ["v1", "v2"])  # type: ignore[arg-type]
    assert problems == () and error is not None and "array down" in error
    assert down.asked == [("v1", "v2")]
    problems, error = gather_storage_problems(_Raising(RuntimeError("boom")))  # type: ignore[arg-type]
    assert problems == () and error == "RuntimeError: boom"
    problems, error = gather_storage_problems(_Sloppy())  # type: ignore[arg-type]
    assert problems == () and error is not None and "not StorageProblem" in error


def test_problems_become_findings_errors_first_with_their_hint() -> None:
    warn = StorageProblem("snapshot_filling", Severity.WARNING, "snap s is 85% full", "grow it")
    err = StorageProblem("snapshot_invalid", Severity.ERROR, "snap t is invalid")
    found = check_findings(facts(storage_problems=(warn, err)))
    assert [(f.code, f.severity) for f in found] == [
        ("snapshot_invalid", Severity.ERROR),
        ("snapshot_filling", Severity.WARNING),
    ]
    assert found[1].message == "snap s is 85% full; grow it"
    (unasked,) = check_findings(facts(storage_error="array down"))
    assert (unasked.code, unasked.severity) == ("storage", Severity.WARNING)
    assert "array down" in unasked.message and "not checked" in unasked.message


def test_check_facts_ask_the_backend_for_the_clusters_volumes(tmp_path: Path) -> None:
    from pgsnap.host import Host
    from pgsnap.wal.archive import DirectoryWalArchive

    class Adapter:
        host = Host()

        def is_running(self) -> bool:
            return False

    (tmp_path / "archive").mkdir()
    with MockBackend(snapshot_limit=2) as backend:
        a = backend.add_volume("a").id
        b = backend.add_volume("b").id
        backend.create_snapshot_group([a, b], "one")
        backend.create_snapshot_group([a, b], "two")
        data = gather_check_facts(
            adapter=Adapter(),  # type: ignore[arg-type]
            archive=DirectoryWalArchive(tmp_path / "archive"),
            catalog=MemoryCatalog(),
            server_error="stopped",
            backend=backend,
            volume_ids=[a],
        )
        assert [p.volume_id for p in data.storage_problems] == [a]  # b is not ours
        assert data.storage_error is None
        backend.inject_fault("storage_problems")
        data = gather_check_facts(
            adapter=Adapter(),  # type: ignore[arg-type]
            archive=DirectoryWalArchive(tmp_path / "archive"),
            catalog=MemoryCatalog(),
            server_error="stopped",
            backend=backend,
            volume_ids=[a],
        )
        assert data.storage_problems == () and "injected fault" in (data.storage_error or "")
        assert "storage" in {f.code for f in check_findings(data)}


# --------------------------------------------------------------------------- the mock's limit


def test_the_mock_warns_near_its_snapshot_limit_then_refuses_beyond_it() -> None:
    with MockBackend(snapshot_limit=5) as backend:
        assert backend.snapshot_limit == 5
        v = backend.add_volume("data").id
        w = backend.add_volume("wal").id
        for n in range(3):
            backend.create_snapshot_group([v, w], f"g{n}")
        assert backend.storage_problems() == ()  # 3 of 5: 60 %
        backend.create_snapshot_group([v], "g3")  # v: 4 of 5 = 80 %
        (warning,) = backend.storage_problems()
        assert (warning.code, warning.severity, warning.volume_id) == (
            "snapshot_limit",
            Severity.WARNING,
            v,
        )
        assert warning.percent_used == 80.0
        assert "4 of the 5" in warning.message and warning.hint
        backend.create_snapshot_group([v, w], "g4")  # v: 5 of 5, w: 4 of 5
        error, warning = backend.storage_problems()
        assert (error.severity, error.volume_id) == (Severity.ERROR, v)
        assert (warning.severity, warning.volume_id) == (Severity.WARNING, w)
        assert backend.storage_problems([w, "no-such-volume"]) == (warning,)
        before = backend.list_snapshots()
        with pytest.raises(SnapshotLimitError) as info:
            backend.create_snapshot_group([w, v], "g5")
        assert info.value.details["volume_id"] == v and info.value.details["limit"] == 5
        assert "nothing was taken" in info.value.message and info.value.hint
        assert backend.list_snapshots() == before  # all or nothing
        # Deleting old backups makes room again.
        (oldest,) = {s.group_id for s in before if s.name == "g0"}
        assert oldest is not None
        backend.delete_snapshot_group(oldest)
        backend.create_snapshot_group([v], "g5")


def test_the_warning_threshold_is_a_parameter_and_policies_obey_the_limit() -> None:
    with MockBackend(snapshot_limit=10, limit_warn_percent=20) as backend:
        v = backend.add_volume("data").id
        backend.create_snapshot_group([v], "one")
        assert backend.storage_problems() == ()
        backend.create_snapshot_group([v], "two")
        assert [p.severity for p in backend.storage_problems()] == [Severity.WARNING]
    with MockBackend(snapshot_limit=1) as backend:
        v = backend.add_volume("data").id
        policy = backend.add_policy("hourly", [v])
        backend.ex_run_policy(policy.id)
        with pytest.raises(SnapshotLimitError):
            backend.ex_run_policy(policy.id)
    with MockBackend() as backend:  # no limit: nothing to say
        v = backend.add_volume("data").id
        for n in range(30):
            backend.create_snapshot_group([v], f"g{n}")
        assert backend.storage_problems() == ()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"snapshot_limit": 0}, "snapshot_limit"),
        ({"snapshot_limit": True}, "snapshot_limit"),
        ({"snapshot_limit": "126"}, "snapshot_limit"),
        ({"limit_warn_percent": 0}, "limit_warn_percent"),
        ({"limit_warn_percent": 120}, "limit_warn_percent"),
    ],
)
def test_bad_limit_options_are_refused(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        MockBackend(**options)


def test_the_limit_applies_to_a_shared_state_file(tmp_path: Path) -> None:
    state = tmp_path / "mock.json"
    with MockBackend(state_file=state) as first:
        v = first.add_volume("data").id
        first.create_snapshot_group([v], "one")
        first.create_snapshot_group([v], "two")
    # Another process configured with a limit sees the snapshots the first one took.
    with MockBackend(state_file=state, snapshot_limit=2) as second:
        (problem,) = second.storage_problems([v])
        assert problem.severity is Severity.ERROR
        with pytest.raises(SnapshotLimitError):
            second.create_snapshot_group([v], "three")


def test_every_limit_error_is_one_family() -> None:
    assert issubclass(PowerFlexSnapshotLimit, SnapshotLimitError)
    with MockBackend(snapshot_limit=2) as limited:  # the limit is an option, not a capability:
        assert limited.capabilities == frozenset(Capability)  # nothing is taken away


# --------------------------------------------------------------------------- PowerFlex


@pytest.fixture(params=["3.6", "5.0"])
def sim(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PowerFlexSimulator]:
    with PowerFlexSimulator(version=request.param, root=tmp_path / "array") as sim:
        yield sim


def _backend(sim: PowerFlexSimulator, **options: Any) -> PowerFlexBackend:
    user, password = sim.credentials
    return PowerFlexBackend(sim.url, user, password, sleep=lambda _s: None, **options)


def _fill(backend: PowerFlexBackend, sim: PowerFlexSimulator, volume_id: str, n: int) -> None:
    """``n`` old snapshots of ``volume_id`` in one raw call, as old backups would be."""
    token = secrets.token_hex(4)
    body = {
        "snapshotDefs": [
            {"volumeId": volume_id, "snapshotName": f"old.{token}.{i}"} for i in range(n)
        ],
        "accessModeLimit": "ReadOnly",
    }
    backend.client.post(
        f"/instances/System::{sim.system_id}/action/"
        + ("createSnapshot" if sim.major >= 5 else "snapshotVolumes"),
        body,
    )


def test_a_vtree_near_its_limit_is_a_warning_and_at_it_an_error(sim: PowerFlexSimulator) -> None:
    backend = _backend(sim)
    limit = 1022 if sim.major >= 5 else 126
    assert backend.vtree_snapshot_limit == limit
    data, wal, other = sim.add_volume("data"), sim.add_volume("wal"), sim.add_volume("other")
    assert backend.storage_problems([data, wal]) == ()
    warn_at = -(-limit * 8 // 10)  # 80 %, rounded up
    _fill(backend, sim, data, warn_at - 1)
    assert backend.storage_problems([data, wal]) == ()  # just below 80 %
    backend.create_snapshot_group([data, wal], "b1")  # pgsnap's own count too
    (warning,) = backend.storage_problems([data, wal])
    assert (warning.code, warning.severity, warning.volume_id) == (
        "snapshot_limit",
        Severity.WARNING,
        data,
    )
    assert f"{warn_at} of the {limit}" in warning.message and "data" in warning.message
    assert warning.percent_used is not None and warning.percent_used >= 80
    # By name too; another cluster's volume is not ours.
    assert backend.storage_problems(["data"]) == (warning,)
    assert backend.storage_problems([other, "no-such-volume"]) == ()
    _fill(backend, sim, data, limit - warn_at)
    (error,) = backend.storage_problems([data, wal])
    assert error.severity is Severity.ERROR and f"limit of {limit}" in error.message
    with pytest.raises(PowerFlexSnapshotLimit):  # what the error announced
        backend.create_snapshot_group([data, wal], "b2")
    assert [p.volume_id for p in backend.storage_problems()] == [data]  # None: every volume


def test_the_powerflex_threshold_is_a_parameter(sim: PowerFlexSimulator) -> None:
    backend = _backend(sim, limit_warn_percent=1)
    data = sim.add_volume("data")
    backend.create_snapshot_group([data], "b1")
    assert backend.storage_problems([data]) == ()  # < 1 %
    _fill(backend, sim, data, 10)
    assert [p.severity for p in backend.storage_problems([data])] == [Severity.WARNING]
    with pytest.raises(ConfigurationError, match="limit_warn_percent"):
        _backend(sim, limit_warn_percent=0)
