"""The PowerFlex client and backend against the gateway simulator.

Authentication per version, token reuse and renewal, retries only where
safe, the error body mapped to typed errors, request bodies as the gateway
expects them, snapshot names, faults (503 on reads, connections dropped
around ``snapshotVolumes``, tokens expiring mid-backup, a V-Tree at its
snapshot limit), request counts that do not grow with the number of volumes,
and secrets in no log line, repr or exception.
"""

from __future__ import annotations

import base64
import logging
import pickle
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from pgsnap.backends.powerflex import (
    NAME_MAX,
    PowerFlexAPIError,
    PowerFlexBackend,
    PowerFlexClient,
    PowerFlexNameInUse,
    PowerFlexNotFound,
    PowerFlexSecureSnapshot,
    PowerFlexSnapshotLimit,
    PowerFlexTLSError,
    PowerFlexUncertainError,
    PowerFlexVolumeMapped,
    snapshot_names,
)
from pgsnap.errors import (
    AuthenticationError,
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    PgsnapError,
)
from pgsnap.testing.powerflex_sim import (
    Fault,
    GatewayCertificate,
    PowerFlexSimulator,
    TlsFront,
    make_certificate,
)

VERSIONS = ["3.6", "4.5", "5.0"]
LISTING = "/api/types/Volume/instances"


class RecordingSession(requests.Session):
    """A requests session that keeps every prepared request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[requests.PreparedRequest] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.sent.append(request)
        return super().send(request, **kwargs)


@pytest.fixture(params=VERSIONS)
def sim(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PowerFlexSimulator]:
    with PowerFlexSimulator(version=request.param, root=tmp_path / "array") as sim:
        yield sim


def make_backend(sim: PowerFlexSimulator, **options: Any) -> PowerFlexBackend:
    user, password = sim.credentials
    options.setdefault("sleep", lambda _s: None)
    return PowerFlexBackend(sim.url, user, password, **options)


def paths(sim: PowerFlexSimulator) -> list[str]:
    return [f"{r.method} {r.path}" for r in sim.requests]


# --------------------------------------------------------------------------- authentication


def test_login_follows_the_version_and_the_token_is_reused(sim: PowerFlexSimulator) -> None:
    session = RecordingSession()
    backend = make_backend(sim, session=session)
    vid = sim.add_volume("data")
    for _ in range(5):
        backend.get_volume(vid)
    assert sim.logins == 1
    first = paths(sim)[:3]
    if sim.major == 3:
        assert first[:2] == ["GET /api/version", "GET /api/login"]
        last = session.sent[-1].headers["Authorization"]
        assert last.startswith("Basic ")
        user, _, token = base64.b64decode(last[6:]).decode().partition(":")
        assert user == "admin"
        assert token in sim.issued_tokens()
        assert token != sim.credentials[1]
    else:
        assert first[:2] == ["GET /api/version", "POST /rest/auth/login"]
        last = session.sent[-1].headers["Authorization"]
        assert last.startswith("Bearer ")
        assert last[7:] in sim.issued_tokens()
    assert backend.client.version == sim.version
    backend.close()
    assert paths(sim)[-1] == ("GET /api/logout" if sim.major == 3 else "POST /rest/auth/logout")
    assert sim.requests[-1].status == (200 if sim.major == 3 else 204)
    assert not sim._tokens  # logged out: no token left on the gateway


def test_an_expired_token_is_renewed_once(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim, listing_ttl=0)
    vid = sim.add_volume("data")
    backend.get_volume(vid)
    sim.expire_tokens()
    assert backend.get_volume(vid).id == vid
    assert sim.logins == 2
    statuses = [r.status for r in sim.requests if r.path == LISTING]
    assert statuses == [200, 401, 200]


def test_wrong_password_is_an_authentication_error_without_the_password(
    sim: PowerFlexSimulator,
) -> None:
    backend = PowerFlexBackend(sim.url, "admin", "not-the-Password-42", sleep=lambda _s: None)
    with pytest.raises(AuthenticationError) as info:
        backend.list_volumes()
    err = info.value
    assert "not-the-Password-42" not in str(err)
    assert "not-the-Password-42" not in repr(err.details)
    assert "not-the-Password-42" not in repr(backend)
    assert pickle.loads(pickle.dumps(err)).details == err.details


@pytest.mark.parametrize("version", ["3.6", "4.5"])
def test_a_version_endpoint_needing_a_session_is_handled(version: str, tmp_path: Path) -> None:
    with PowerFlexSimulator(version=version, root=tmp_path, version_needs_auth=True) as sim:
        backend = make_backend(sim)
        vid = sim.add_volume("data")
        assert backend.get_volume(vid).name == "data"
        assert backend.client.version == version


def test_disabling_tls_verification_warns(sim: PowerFlexSimulator) -> None:
    with pytest.warns(UserWarning, match="TLS verification"):
        make_backend(sim, verify=False)


def test_the_password_may_come_from_the_environment(
    sim: PowerFlexSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGSNAP_POWERFLEX_PASSWORD", sim.credentials[1])
    backend = PowerFlexBackend(sim.url, "admin", sleep=lambda _s: None)
    assert backend.list_volumes() == ()
    monkeypatch.delenv("PGSNAP_POWERFLEX_PASSWORD")
    with pytest.raises(ConfigurationError, match="needs the password of user 'admin'") as info:
        PowerFlexBackend(sim.url, "admin")
    assert "export PGSNAP_POWERFLEX_PASSWORD" in str(info.value.hint)
    assert info.value.details["password_env"] == "PGSNAP_POWERFLEX_PASSWORD"


# --------------------------------------------------------------------------- retries


def test_a_503_on_a_read_is_retried(sim: PowerFlexSimulator) -> None:
    sleeps: list[float] = []
    backend = make_backend(sim, sleep=sleeps.append)
    vid = sim.add_volume("data")
    fault = sim.inject(Fault("status", method="GET", path_contains=LISTING, times=2, status=503))
    assert backend.get_volume(vid).id == vid
    assert fault.fired == 2
    assert [r.status for r in sim.requests if r.path == LISTING] == [503, 503, 200]
    assert len(sleeps) == 2
    assert all(0 <= s <= 10 for s in sleeps)


def test_a_read_that_keeps_failing_is_backend_unavailable(sim: PowerFlexSimulator) -> None:
    sleeps: list[float] = []
    backend = make_backend(sim, sleep=sleeps.append, retry_attempts=4)
    sim.inject(Fault("drop", method="GET", path_contains=LISTING, times=None))
    with pytest.raises(BackendUnavailable) as info:
        backend.list_volumes()
    assert info.value.retryable
    assert len(sleeps) == 3
    assert [r.status for r in sim.requests if r.path == LISTING] == [0, 0, 0, 0]  # 4 attempts


def test_the_total_deadline_stops_retries(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim, sleep=lambda _s: None, retry_attempts=100, retry_deadline=0.3)
    sim.inject(Fault("status", path_contains=LISTING, times=None, status=504, seconds=0.12))
    with pytest.raises(BackendUnavailable, match=r"within 0\.3 s"):
        backend.list_volumes()
    attempts = [r.status for r in sim.requests if r.path == LISTING]
    assert 1 <= len(attempts) <= 4  # the deadline, not the 100 attempts, stopped it
    assert set(attempts) == {504}


def map_action(sim: PowerFlexSimulator) -> str:
    """The mapping action pgsnap sends: through Host objects on 5.x (PyPowerFlex gen2)."""
    return "addMappedHost" if sim.major >= 5 else "addMappedSdc"


def test_a_write_is_not_retried_blindly(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    sim.add_sdc("db1")
    vid = sim.add_volume("data")
    sim.inject(Fault("status", path_contains=map_action(sim), times=None, status=503))
    with pytest.raises(PowerFlexUncertainError):
        backend.attach(vid, "db1")
    assert sim.count(action=map_action(sim)) == 1


def test_an_unreachable_gateway_is_backend_unavailable_not_a_requests_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = PowerFlexBackend(
        f"http://127.0.0.1:{port}", "admin", "pw-secret", sleep=lambda _s: None, timeout=2
    )
    with pytest.raises(BackendUnavailable) as info:
        backend.list_volumes()
    assert not isinstance(info.value, requests.RequestException)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


# --------------------------------------------------------------------------- errors


ERROR_BODIES = [
    (
        {"errorCode": 0, "message": "Error with details", "details": [{"rc": 182}]},
        PowerFlexSnapshotLimit,
        "rc 182",
    ),
    (
        {"message": "Could not find the volume", "httpStatusCode": 500, "errorCode": 79},
        PowerFlexNotFound,
        "Could not find the volume",
    ),
    (
        {
            "message": "Invalid id: must be a hexadecimal number",
            "httpStatusCode": 500,
            "errorCode": 0,
        },
        PowerFlexNotFound,
        "hexadecimal",
    ),
    (
        {
            "message": "Volume name already in use. Please use a different name.",
            "httpStatusCode": 500,
            "errorCode": 99,
        },
        PowerFlexNameInUse,
        "already in use",
    ),
    (
        {
            "message": "Error with details",
            "httpStatusCode": 500,
            "errorCode": 104,
            "details": [{"error": "VOL_MAPPED", "rc": 0, "errorMessage": "Volume is mapped"}],
        },
        PowerFlexVolumeMapped,
        "Volume is mapped",
    ),
    (
        {
            "message": "Error with details",
            "httpStatusCode": 500,
            "errorCode": 0,
            "details": [{"error": "SECURE_SNAPSHOT_NOT_EXPIRED"}],
        },
        PowerFlexSecureSnapshot,
        "SECURE_SNAPSHOT_NOT_EXPIRED",
    ),
    (
        {
            "message": "Requested volume size exceeds the volume allocation limit",
            "httpStatusCode": 500,
            "errorCode": 133,
        },
        PowerFlexAPIError,
        "allocation limit",
    ),
    (b"<html><body>Internal error</body></html>", PowerFlexAPIError, "not JSON"),
]


@pytest.mark.parametrize(("body", "expected", "text"), ERROR_BODIES)
def test_error_bodies_become_typed_errors(
    sim: PowerFlexSimulator, body: Any, expected: type[PgsnapError], text: str
) -> None:
    backend = make_backend(sim)
    backend.list_volumes()  # logged in
    sim.inject(Fault("status", path_contains="/types/Volume/instances", status=500, body=body))
    with pytest.raises(PowerFlexAPIError) as info:
        backend.client.get("/types/Volume/instances")
    err = info.value
    assert type(err) is expected
    assert text in str(err)
    assert err.hint
    assert err.details["status"] == 500
    if isinstance(body, dict):
        assert err.details["error_code"] == body["errorCode"]
        assert err.details["rc"] == (body.get("details") or [{}])[0].get("rc")
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.details) == (type(err), str(err), err.details)


def test_a_non_json_401_is_handled(tmp_path: Path) -> None:
    with PowerFlexSimulator(version="4.5", root=tmp_path) as sim:
        backend = PowerFlexBackend(sim.url, "admin", "wrong-pw", sleep=lambda _s: None)
        with pytest.raises(AuthenticationError):
            backend.list_volumes()
        assert sim.requests[-1].status == 401


# --------------------------------------------------------------------------- bodies and names


def test_bodies_carry_numbers_and_booleans_as_strings(sim: PowerFlexSimulator) -> None:
    import json

    session = RecordingSession()
    backend = make_backend(sim, session=session, secure_retention_minutes=90)
    sdc = sim.add_sdc("db1")
    vid = sim.add_volume("data")
    backend.create_snapshot_group([vid], "b1", secure=True)
    backend.attach(vid, "db1")
    bodies = {
        str(r.url).rsplit("/", 1)[-1]: json.loads(r.body or b"{}") for r in session.sent if r.body
    }
    snap = bodies["createSnapshot" if sim.major >= 5 else "snapshotVolumes"]
    assert snap["retentionPeriodInMin"] == "90"
    assert snap["accessModeLimit"] == "ReadOnly"
    assert snap["snapshotDefs"] == [{"volumeId": vid, "snapshotName": "b1.data"}]
    mapping = bodies[map_action(sim)]
    assert mapping["allowMultipleMappings"] == "FALSE"
    assert mapping["accessMode"] == "ReadWrite"
    key = "hostId" if sim.major >= 5 else "sdcId"
    assert mapping[key] == sdc
    for request in session.sent:
        assert str(request.url).startswith(sim.url)


def test_snapshot_names_fit_and_are_deterministic() -> None:
    names = snapshot_names("20261201T060000123Z", ["pgdata", "pgwal", "tablespace.one"])
    assert names == (
        "20261201T060000123Z.pgdata",
        "20261201T060000123Z.pgwal",
        "20261201T060000123Z.tablespace_",
    )
    long = snapshot_names("pgsnap-safety-20261201T060000123456Z", ["a-very-long-volume-name"])
    assert long == snapshot_names(
        "pgsnap-safety-20261201T060000123456Z", ["a-very-long-volume-name"]
    )
    assert all(len(n) <= NAME_MAX for n in long)
    assert long[0].startswith("pgsnap-safety-2~")
    other = snapshot_names("pgsnap-safety-20261201T060000123457Z", ["a-very-long-volume-name"])
    assert other != long
    same = snapshot_names(
        "b", ["pgdata-volume-one-xxxxxxxxxxxxxxxxxx", "pgdata-volume-one-xxxxxxxxxxxxxxxxxy"]
    )
    assert len(set(same)) == 2 and all(len(n) <= NAME_MAX for n in same)
    spaced = snapshot_names("my backup", ["d"])
    assert " " not in spaced[0] and re.match(r"^[!-~]+$", spaced[0])


def test_volumes_resolve_by_id_or_name(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    vid = sim.add_volume("pgdata")
    assert backend.ex_volume_id("pgdata") == vid
    assert backend.get_volume("pgdata").id == vid
    group = backend.create_snapshot_group(["pgdata"], "byname")
    assert group.snapshots[0].volume_id == vid
    assert [s.id for s in backend.list_snapshots("pgdata")] == [group.snapshots[0].id]


def test_snapshots_carry_group_creation_access_and_secure_expiry(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    vid = sim.add_volume("pgdata")
    group = backend.create_snapshot_group([vid], "20261201T0600Z", secure=True)
    (snap,) = backend.list_snapshots(vid)
    assert snap.group_id == group.id
    assert snap.secure
    assert snap.extra["access_mode"] == "ReadOnly"
    assert snap.extra["group_name"] == "20261201T0600Z" == group.name
    assert "secure_until" in snap.extra
    with pytest.raises(PowerFlexSecureSnapshot) as info:
        backend.delete_snapshot(snap.id)
    assert info.value.details["expires_at"] == snap.extra["secure_until"]
    assert snap.extra["secure_until"] in str(info.value)
    sim.set_secure_expiry(snap.id, 1)  # expired long ago
    backend.delete_snapshot(snap.id)
    assert backend.list_snapshots(vid) == ()


def test_restore_refuses_a_mapped_volume_and_uses_the_versions_call(
    sim: PowerFlexSimulator,
) -> None:
    backend = make_backend(sim)
    sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    snap = backend.create_snapshot_group([vid], "r1").snapshots[0]
    backend.attach(vid, "db1")
    with pytest.raises(PowerFlexVolumeMapped, match="detach"):
        backend.restore_volume(vid, snap.id)
    backend.detach(vid, "db1")
    backend.restore_volume(vid, snap.id)
    action = "restore" if sim.major >= 5 else "overwriteVolumeContent"
    assert sim.count(action=action) == 1
    assert backend.locate(vid).path == f"/dev/disk/by-id/emc-vol-{sim.system_id}-{vid}"


def test_sdcs_are_found_by_id_guid_ip_or_name(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    sdc = sim.add_sdc("db1", guid="ABCDEF01-0000-4000-8000-000000000001", ip="10.9.8.7")
    vid = sim.add_volume("pgdata")
    for ref in (sdc, "abcdef01-0000-4000-8000-000000000001", "10.9.8.7", "db1"):
        backend.attach(vid, ref)
        assert backend.get_volume(vid).mapped_hosts == ("db1",)
        backend.detach(vid, ref)
        assert backend.get_volume(vid).mapped_hosts == ()
    with pytest.raises(PowerFlexNotFound, match="db1"):
        backend.attach(vid, "db9")


def test_one_sdc_at_a_time_unless_allowed(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    sim.add_sdc("db1")
    sim.add_sdc("db2")
    vid = sim.add_volume("pgdata")
    backend.attach(vid, "db1")
    with pytest.raises(PowerFlexAPIError, match="single SDC"):
        backend.attach(vid, "db2")
    many = make_backend(sim, allow_multiple_mappings=True)
    many.attach(vid, "db2")
    assert sorted(many.get_volume(vid).mapped_hosts) == ["db1", "db2"]


def test_clone_to_another_host_is_a_writable_descendant(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    sim.add_sdc("dev1")
    vid = sim.add_volume("pgdata")
    snap = backend.create_snapshot_group([vid], "c1").snapshots[0]
    clone = backend.ex_clone_to_host(snap.id, "pgdata-dev", "dev1")
    assert clone.mapped_hosts == ("dev1",)
    assert clone.extra["ancestor_volume_id"] == snap.id
    assert clone.extra["access_mode"] == "ReadWrite"
    assert clone.extra["vtree_id"] == backend.get_volume(vid).extra["vtree_id"]
    if sim.major >= 5:
        assert clone.extra["volume_type"] == "ThinClone"
    assert clone.id not in {s.id for s in backend.list_snapshots()}


def test_policy_actions_follow_the_version(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    vid = sim.add_volume("pgdata")
    pid = backend.ex_create_policy("hourly", [vid])
    action = "assignSnapshotPolicy" if sim.major >= 5 else "addSourceVolumeToSnapshotPolicy"
    assert sim.count(action=action) == 1
    (policy,) = backend.list_policies()
    assert (policy.id, policy.volume_ids, policy.paused) == (pid, (vid,), False)
    backend.pause_policy(pid)
    backend.pause_policy(pid)
    assert sim.count(action="pauseSnapshotPolicy") == 1  # idempotent without a second call
    assert backend.list_policies()[0].paused


# --------------------------------------------------------------------------- faults


def test_a_dropped_connection_after_snapshot_volumes_makes_exactly_one_group(
    sim: PowerFlexSimulator,
) -> None:
    backend = make_backend(sim)
    vids = [sim.add_volume(f"v{n}") for n in range(3)]
    action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
    sim.inject(Fault("drop_after", path_contains=action))
    group = backend.create_snapshot_group(vids, "dropped")
    assert sim.count(action=action) == 1  # the snapshots were found: never sent again
    groups = {v["consistencyGroupId"] for v in map(sim.volume, sim.volume_ids())} - {None}
    assert groups == {group.id}
    assert sorted(s.volume_id for s in group.snapshots) == sorted(vids)


def test_a_connection_dropped_before_snapshot_volumes_is_retried_once(
    sim: PowerFlexSimulator,
) -> None:
    backend = make_backend(sim)
    vids = [sim.add_volume(f"v{n}") for n in range(3)]
    action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
    sim.inject(Fault("drop", path_contains=action))
    group = backend.create_snapshot_group(vids, "dropped-before")
    assert sim.count(action=action) == 2
    groups = {v["consistencyGroupId"] for v in map(sim.volume, sim.volume_ids())} - {None}
    assert groups == {group.id}


def test_a_partly_taken_group_is_removed_and_taken_again(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    vids = [sim.add_volume(f"v{n}") for n in range(3)]
    action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
    sim.inject(Fault("drop_partial", path_contains=action))
    group = backend.create_snapshot_group(vids, "partial")
    assert sim.count(action=action) == 2
    assert sim.count(action="removeVolume") == 1  # the lone snapshot of the first attempt
    groups = {v["consistencyGroupId"] for v in map(sim.volume, sim.volume_ids())} - {None}
    assert groups == {group.id}
    assert sorted(s.volume_id for s in group.snapshots) == sorted(vids)


def test_a_group_that_never_gets_through_leaves_nothing(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim, retry_attempts=3)
    vids = [sim.add_volume(f"v{n}") for n in range(2)]
    action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
    sim.inject(Fault("status", path_contains=action, times=None, status=502))
    with pytest.raises(PowerFlexUncertainError, match="no snapshot of it is left"):
        backend.create_snapshot_group(vids, "never")
    assert sim.count(action=action) == 3
    assert backend.list_snapshots() == ()


def test_a_token_expiring_mid_backup_is_renewed(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    vids = [sim.add_volume(f"v{n}") for n in range(2)]
    action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
    sim.inject(Fault("expire_tokens", path_contains=action))
    group = backend.create_snapshot_group(vids, "renewed")
    assert len(group.snapshots) == 2
    assert sim.logins == 2
    assert [r.status for r in sim.requests if r.action == action] == [401, 200]


def test_a_vtree_at_its_limit_fails_the_group_clearly(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    full, other = sim.add_volume("full"), sim.add_volume("other")
    limit = 1022 if sim.major >= 5 else 126
    # Fill the V-Tree in one raw call (the simulator's own API), as old backups would.
    body = {
        "snapshotDefs": [{"volumeId": full, "snapshotName": f"old{n}"} for n in range(limit)],
        "accessModeLimit": "ReadOnly",
    }
    backend.client.post(
        f"/instances/System::{sim.system_id}/action/"
        + ("createSnapshot" if sim.major >= 5 else "snapshotVolumes"),
        body,
    )
    before = len(backend.list_snapshots())
    with pytest.raises(PowerFlexSnapshotLimit) as info:
        backend.create_snapshot_group([other, full], "too-many")
    err = info.value
    assert err.details["rc"] == 182
    assert "full" in str(err) and f"{limit} snapshots" in str(err)
    assert "nothing was taken" in str(err)
    assert len(backend.list_snapshots()) == before


# --------------------------------------------------------------------------- efficiency


def test_requests_per_backup_do_not_grow_with_the_volumes(sim: PowerFlexSimulator) -> None:
    counts = {}
    for k in (2, 8):
        backend = make_backend(sim, listing_ttl=0)
        vids = [sim.add_volume(f"k{k}-{n}") for n in range(k)]
        backend.list_volumes()  # logged in, system known after the first group
        backend.system_id  # noqa: B018
        start = len(sim.requests)
        backend.create_snapshot_group(vids, f"eff{k}")
        counts[k] = len(sim.requests) - start
        action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
        assert sim.count(action=action) == len(counts)
        backend.close()
    assert counts[2] == counts[8] == 3  # list, snapshot, list


# --------------------------------------------------------------------------- secrets


def test_secrets_appear_in_no_log_repr_or_error(
    sim: PowerFlexSimulator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    backend = make_backend(sim)
    sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    errors: list[BaseException] = []
    group = backend.create_snapshot_group([vid], "s1", secure=True)
    sim.expire_tokens()
    backend.attach(vid, "db1")
    for call in (
        lambda: backend.restore_volume(vid, group.snapshots[0].id),
        lambda: backend.delete_snapshot_group(group.id),
        lambda: backend.get_volume("nope"),
    ):
        try:
            call()
        except BackendError as exc:
            errors.append(exc)
    bad = PowerFlexBackend(sim.url, "admin", "Wr0ng-Secret", sleep=lambda _s: None)
    try:
        bad.list_volumes()
    except AuthenticationError as exc:
        errors.append(exc)
    backend.close()
    assert len(errors) == 4
    secrets = [sim.credentials[1], "Wr0ng-Secret", *sim.issued_tokens()]
    assert len(secrets) > 3
    texts = [
        caplog.text,
        repr(backend),
        repr(backend.client),
        repr(bad),
        *(str(e) for e in errors),
        *(repr(e.__dict__) for e in errors),
    ]
    for secret in secrets:
        for text in texts:
            assert secret not in text
        b64 = base64.b64encode(secret.encode()).decode()
        assert b64 not in caplog.text


def test_a_client_needs_a_clean_https_url() -> None:
    with pytest.raises(ConfigurationError, match="https://"):
        PowerFlexClient("pfgw.example", "admin", "x")
    with pytest.raises(ConfigurationError, match="credentials") as info:
        PowerFlexClient("https://admin:S3cret-in-url@pfgw.example", "admin", "x")
    assert "S3cret-in-url" not in str(info.value)
    with pytest.warns(UserWarning, match="plain http"):
        PowerFlexClient("http://pfgw.example", "admin", "x")


def test_observing_k_volumes_costs_one_listing(sim: PowerFlexSimulator) -> None:
    """What a backup's observation asks (locate and restore_profile of every volume, the
    snapshots) comes from one volume listing, whatever the number of volumes."""
    for k in (2, 16):
        backend = make_backend(sim)
        vids = [sim.add_volume(f"o{k}-{n}") for n in range(k)]
        backend.system_id  # noqa: B018 - asked once per backend
        start = len(sim.requests)
        for vid in vids:
            backend.locate(vid)
            backend.restore_profile(vid)
        backend.list_snapshots()
        assert [r.path for r in sim.requests[start:]] == ["/api/types/Volume/instances"]
        # A write forgets the listing: the next lookup reads the array again.
        sim.add_sdc(f"h{k}")
        backend.attach(vids[0], f"h{k}")
        assert backend.get_volume(vids[0]).mapped_hosts == (f"h{k}",)
        backend.close()


def test_an_unreachable_gateway_at_login_or_logout_raises_only_pgsnap_errors(
    tmp_path: Path,
) -> None:
    with PowerFlexSimulator(version="4.5", root=tmp_path) as sim:
        backend = make_backend(sim)
        sim.inject(Fault("drop", path_contains="/api/version", times=None))
        with pytest.raises(BackendUnavailable):
            backend.client.version  # noqa: B018
        sim.clear_faults()
        assert backend.client.major == 4
        sim.inject(Fault("drop", path_contains="/rest/auth/logout", times=None))
        backend.close()  # best effort: a warning, no exception
        backend.close()


def test_the_backend_is_built_by_name_from_configuration_options(
    sim: PowerFlexSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgsnap.backends import BackendRegistry

    monkeypatch.setenv("PF_TEST_PASSWORD", sim.credentials[1])
    backend = BackendRegistry(plugins=False).create(
        "powerflex",
        gateway=sim.url,
        username="admin",
        password_env="PF_TEST_PASSWORD",
        timeout=5,
        retry_attempts=2,
        verify=True,
    )
    assert isinstance(backend, PowerFlexBackend)
    assert backend.name == "powerflex"
    vid = sim.add_volume("pgdata")
    assert backend.get_volume(vid).name == "pgdata"
    with pytest.raises(ConfigurationError, match="does not accept"):
        BackendRegistry(plugins=False).create("powerflex", gateway=sim.url, pasword="typo")


# --------------------------------------------------------------------------- a wrong password


WRONG = "not-the-Password-42"


def every_call(vid: str, snap: str, group: str, policy: str) -> dict[str, Any]:
    """One call of each kind the backend makes, reads and writes alike."""
    return {
        "list_volumes": lambda b: b.list_volumes(),
        "list_snapshots": lambda b: b.list_snapshots(),
        "get_volume": lambda b: b.get_volume(vid),
        "ex_volume_id": lambda b: b.ex_volume_id("pgdata"),
        "locate": lambda b: b.locate(vid),
        "restore_profile": lambda b: b.restore_profile(vid),
        "get_snapshot_group": lambda b: b.get_snapshot_group(group),
        "storage_problems": lambda b: b.storage_problems([vid]),
        "list_policies": lambda b: b.list_policies(),
        "system_id": lambda b: b.system_id,
        "create_snapshot_group": lambda b: b.create_snapshot_group([vid], "wrongpw"),
        "delete_snapshot": lambda b: b.delete_snapshot(snap),
        "delete_snapshot_group": lambda b: b.delete_snapshot_group(group),
        "restore_volume": lambda b: b.restore_volume(vid, snap),
        "attach": lambda b: b.attach(vid, "db1"),
        "detach": lambda b: b.detach(vid, "db1"),
        "clone_snapshot": lambda b: b.clone_snapshot(snap, "wrongpw-clone"),
        "pause_policy": lambda b: b.pause_policy(policy),
    }


def wrong_password_case(sim: PowerFlexSimulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call of a backend whose password is wrong raises AuthenticationError naming
    the user and where the password came from, and nothing reaches the array."""
    good = make_backend(sim)
    sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    group = good.create_snapshot_group([vid], "kept")
    policy = good.ex_create_policy("hourly", [vid])
    good.close()
    before = [sim.volume(v) for v in sim.volume_ids()]
    start = len(sim.requests)
    monkeypatch.setenv("PF_TEST_PASSWORD", WRONG)
    bad = PowerFlexBackend(sim.url, "admin", password_env="PF_TEST_PASSWORD", sleep=lambda _s: None)
    calls = every_call(vid, group.snapshots[0].id, group.id, policy)
    for name, call in calls.items():
        with pytest.raises(AuthenticationError) as info:
            call(bad)
        err = info.value
        assert "user 'admin'" in str(err), name
        assert "$PF_TEST_PASSWORD" in str(err.hint), name  # where the password came from
        assert "pgsnap check" in str(err.hint), name
        assert err.details["username"] == "admin"
        for text in (str(err), repr(err.details), repr(bad), repr(bad.client)):
            assert WRONG not in text, name
            assert base64.b64encode(f"admin:{WRONG}".encode()).decode() not in text
        assert pickle.loads(pickle.dumps(err)).details == err.details
        assert not err.retryable
    # Nothing but login attempts reached the gateway, each refused; the array is as it was.
    logins = {"/api/login", "/rest/auth/login"}
    sent = sim.requests[start:]
    assert {r.path for r in sent} <= {*logins, "/api/version"}
    attempts = [r for r in sent if r.path in logins]
    assert len(attempts) == len(calls)  # every call tried to log in, once
    assert {r.status for r in attempts} == {401}
    assert [sim.volume(v) for v in sim.volume_ids()] == before
    assert bad.client.logins == 0


def test_a_wrong_password_fails_every_call_with_the_user_and_what_to_do(
    sim: PowerFlexSimulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong_password_case(sim, monkeypatch)


@pytest.mark.parametrize("version", ["3.6", "4.5"])
def test_a_wrong_password_fails_every_call_when_the_version_needs_a_session(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PowerFlexSimulator(version=version, root=tmp_path, version_needs_auth=True) as sim:
        wrong_password_case(sim, monkeypatch)


def test_a_wrong_password_given_in_python_says_so(sim: PowerFlexSimulator) -> None:
    bad = PowerFlexBackend(sim.url, "pgsnap-op", WRONG, sleep=lambda _s: None)
    with pytest.raises(AuthenticationError) as info:
        bad.list_volumes()
    assert "user 'pgsnap-op'" in str(info.value)
    assert "the password= argument" in str(info.value.hint)
    assert WRONG not in str(info.value)


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GatewayCertificate]:
    """A CA-signed certificate for 127.0.0.1, a self-signed one, one for another host."""
    base = tmp_path_factory.mktemp("certs")
    return {
        "ca-signed": make_certificate(base / "ca-signed"),
        "self-signed": make_certificate(base / "self-signed", self_signed=True),
        "other-host": make_certificate(base / "other-host", hosts=("pfgw.example",)),
    }


@pytest.fixture
def sim45(tmp_path: Path) -> Iterator[PowerFlexSimulator]:
    with PowerFlexSimulator(version="4.5", root=tmp_path / "array") as sim:
        yield sim


def tls_failure(
    front: TlsFront, sim: PowerFlexSimulator, verify: bool | str, gateway: str | None = None
) -> PowerFlexTLSError:
    """What list_volumes raises through ``front``; checks it was not retried."""
    sleeps: list[float] = []
    user, password = sim.credentials
    backend = PowerFlexBackend(
        gateway or front.url, user, password, verify=verify, sleep=sleeps.append, retry_attempts=5
    )
    with pytest.raises(PowerFlexTLSError) as info:
        backend.list_volumes()
    err = info.value
    assert sleeps == []  # never retried: a certificate does not get better by waiting
    assert front.connections == 1  # one TCP connection, one handshake
    assert sim.requests == []  # nothing reached the gateway behind the front
    assert isinstance(err, BackendError) and not isinstance(err, BackendUnavailable)
    assert not err.retryable
    assert "retrying later" not in str(err)
    assert "is not retried" in str(err)
    assert err.__cause__ is None and err.__suppress_context__
    assert password not in str(err) and password not in repr(err.details)
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.details) == (type(err), str(err), err.details)
    return err


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("ca-signed", "certificate verify failed: unable to get local issuer certificate"),
        ("self-signed", "certificate verify failed: self-signed certificate"),
    ],
)
def test_a_certificate_the_client_does_not_trust_fails_at_once_with_the_reason(
    sim45: PowerFlexSimulator, certs: dict[str, GatewayCertificate], kind: str, reason: str
) -> None:
    with TlsFront(sim45.url, certs[kind]) as front:
        err = tls_failure(front, sim45, verify=True)  # the system's CAs: ours is not there
        assert reason in str(err)
        assert err.details["reason"] == "CERTIFICATE_VERIFY_FAILED"
        assert err.details["tls_error"] == reason
        assert "verify = the path of a CA bundle" in str(err.hint)
        assert front.url in str(err)
    # Given the CA bundle, the same certificate is trusted: the backend works over TLS.
    with TlsFront(sim45.url, certs[kind]) as front:
        user, password = sim45.credentials
        backend = PowerFlexBackend(front.url, user, password, verify=str(certs[kind].ca))
        vid = sim45.add_volume("pgdata")
        assert backend.get_volume(vid).name == "pgdata"
        backend.close()


@pytest.mark.parametrize(
    ("host", "text"),
    [
        ("127.0.0.1", "IP address mismatch, certificate is not valid for '127.0.0.1'"),
        ("localhost", "Hostname mismatch, certificate is not valid for 'localhost'"),
    ],
)
def test_a_certificate_for_another_host_names_the_mismatch(
    sim45: PowerFlexSimulator, certs: dict[str, GatewayCertificate], host: str, text: str
) -> None:
    cert = certs["other-host"]  # issued for pfgw.example, by a CA the client trusts
    with TlsFront(sim45.url, cert) as front:
        err = tls_failure(front, sim45, verify=str(cert.ca), gateway=f"https://{host}:{front.port}")
    assert f"certificate verify failed: {text}" in str(err)
    assert f"not issued for {host}" in str(err.hint)
    assert "subjectAltName" in str(err.hint)


def test_https_to_a_plain_http_port_is_a_tls_error_not_a_retry(sim45: PowerFlexSimulator) -> None:
    sleeps: list[float] = []
    user, password = sim45.credentials
    backend = PowerFlexBackend(
        sim45.url.replace("http://", "https://"), user, password, sleep=sleeps.append
    )
    with pytest.raises(PowerFlexTLSError, match="WRONG_VERSION_NUMBER") as info:
        backend.list_volumes()
    assert sleeps == []
    assert "refused the TLS handshake" in str(info.value)
    assert "HTTPS address" in str(info.value.hint)


def test_a_connection_cut_behind_the_tls_front_is_still_retried(
    sim45: PowerFlexSimulator, certs: dict[str, GatewayCertificate]
) -> None:
    """Only what a retry cannot cure skips the retries: a dropped connection over TLS
    is retried as over plain HTTP."""
    cert = certs["ca-signed"]
    with TlsFront(sim45.url, cert) as front:
        sleeps: list[float] = []
        user, password = sim45.credentials
        backend = PowerFlexBackend(
            front.url, user, password, verify=str(cert.ca), sleep=sleeps.append
        )
        fault = sim45.inject(Fault("drop", method="GET", path_contains=LISTING, times=2))
        assert backend.list_volumes() == ()
        assert fault.fired == 2
        assert len(sleeps) == 2


def test_a_missing_ca_bundle_is_a_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.pem"
    with pytest.raises(ConfigurationError, match="does not exist") as info:
        PowerFlexBackend("https://pfgw.example", "admin", "x", verify=str(missing))
    assert str(missing) in str(info.value)
    assert "PEM" in str(info.value.hint)


# --------------------------------------------------------------------------- mapping per version


def test_mapping_speaks_the_versions_dialect(sim: PowerFlexSimulator) -> None:
    """As PyPowerFlex: SDCs (addMappedSdc, sdcId) on 3.x/4.x; Host objects on 5.x
    (GET /api/types/Host/instances, addMappedHost/removeMappedHost with hostId)."""
    import json

    session = RecordingSession()
    backend = make_backend(sim, session=session)
    sdc = sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    backend.attach(vid, "db1")
    assert backend.get_volume(vid).mapped_hosts == ("db1",)
    backend.attach(vid, "db1")  # idempotent: nothing sent
    backend.detach(vid, "db1")
    backend.detach(vid, "db1")
    assert backend.get_volume(vid).mapped_hosts == ()
    sent = {str(r.url).split("/api", 1)[1]: r for r in session.sent if "/api/" in str(r.url)}
    if sim.major >= 5:
        add, remove, key, listing = "addMappedHost", "removeMappedHost", "hostId", "Host"
    else:
        add, remove, key, listing = "addMappedSdc", "removeMappedSdc", "sdcId", "Sdc"
    assert (sim.count(action=add), sim.count(action=remove)) == (1, 1)
    others = {"addMappedSdc", "removeMappedSdc", "addMappedHost", "removeMappedHost"} - {
        add,
        remove,
    }
    assert all(sim.count(action=a) == 0 for a in others)
    assert f"/types/{listing}/instances" in sent
    assert json.loads(sent[f"/instances/Volume::{vid}/action/{add}"].body or b"")[key] == sdc
    assert json.loads(sent[f"/instances/Volume::{vid}/action/{remove}"].body or b"") == {key: sdc}


@pytest.mark.parametrize("version", ["4.5", "5.0"])
def test_nvme_hosts_are_refused(version: str, tmp_path: Path) -> None:
    with PowerFlexSimulator(version=version, root=tmp_path) as sim:
        backend = make_backend(sim)
        sim.add_nvme_host("nvme1")
        vid = sim.add_volume("pgdata")
        with pytest.raises(BackendError, match="NVMe/TCP host") as info:
            backend.attach(vid, "nvme1")
        assert "SDC" in str(info.value.hint)
        assert sim.count(method="POST") == (1 if sim.major >= 4 else 0)  # the login only
        with pytest.raises(PowerFlexNotFound) as missing:
            backend.attach(vid, "db9")
        assert "nvme1" not in str(missing.value.hint)  # not offered as an SDC


def test_a_mapping_gone_meanwhile_counts_as_detached(sim: PowerFlexSimulator) -> None:
    backend = make_backend(sim)
    sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    backend.attach(vid, "db1")
    remove, code = ("removeMappedHost", 4039) if sim.major >= 5 else ("removeMappedSdc", 84)
    body = {"message": "The mapping does not exist", "httpStatusCode": 500, "errorCode": code}
    fault = sim.inject(Fault("status", path_contains=remove, status=500, body=body))
    backend.detach(vid, "db1")  # the gateway says it is not mapped: what was asked
    assert fault.fired == 1
