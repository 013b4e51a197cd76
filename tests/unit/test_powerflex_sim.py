"""The gateway simulator answers as the documented examples in powerflex.md say.

These tests speak raw HTTP with ``requests`` and the request bodies of the
reference (PyPowerFlex, goscaleio, cinder, ansible-powerflex samples), never
through pgsnap's client: the simulator must hold for a client no one here
wrote. Each check names the documented fact it follows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from pgsnap.errors import ConfigurationError
from pgsnap.testing.powerflex_sim import Fault, PowerFlexSimulator, TlsFront, make_certificate

HEX16 = re.compile(r"^[0-9a-f]{16}$")
# The snapshot volume sample of ansible-powerflex (snapshot.py RETURN), its keys.
ANS_SNAPSHOT_KEYS = {
    "id",
    "name",
    "volumeType",
    "ancestorVolumeId",
    "vtreeId",
    "consistencyGroupId",
    "storagePoolId",
    "sizeInKb",
    "creationTime",
    "accessModeLimit",
    "secureSnapshotExpTime",
    "lockedAutoSnapshot",
    "autoSnapshotGroupId",
    "snplIdOfAutoSnapshot",
    "snplIdOfSourceVolume",
    "mappedSdcInfo",
    "notGenuineSnapshot",
    "managedBy",
    "dataLayout",
    "volumeReplicationState",
    "links",
}


class Gw:
    """A raw session on the simulator, logged in as the version says (PyPowerFlex style)."""

    def __init__(self, sim: PowerFlexSimulator) -> None:
        self.sim = sim
        self.s = requests.Session()
        user, password = sim.credentials
        token = self.s.get(sim.url + "/api/login", auth=(user, password), timeout=5).json()
        if sim.major < 4:
            self.s.auth = ("", token)  # "the user part is ignored and can be empty"
        else:
            r = self.s.post(
                sim.url + "/rest/auth/login",
                json={"username": user, "password": password},
                timeout=5,
            )
            self.s.headers["Authorization"] = "Bearer " + r.json()["access_token"]

    def get(self, path: str) -> requests.Response:
        return self.s.get(self.sim.url + "/api" + path, timeout=5)

    def post(self, path: str, body: Any) -> requests.Response:
        return self.s.post(self.sim.url + "/api" + path, json=body, timeout=5)

    def snap_action(self) -> str:
        return "createSnapshot" if self.sim.major >= 5 else "snapshotVolumes"


@pytest.fixture(params=["3.6", "4.5", "5.0"])
def sim(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PowerFlexSimulator]:
    with PowerFlexSimulator(version=request.param, root=tmp_path) as sim:
        yield sim


def test_version_is_a_json_string(sim: PowerFlexSimulator) -> None:
    r = requests.get(sim.url + "/api/version", timeout=5)
    assert r.status_code == 200
    assert re.match(r"^\d+(\.\d+)*$", r.json())  # PPF's check
    assert r.json() == sim.version


def test_login_schemes(sim: PowerFlexSimulator) -> None:
    user, password = sim.credentials
    r = requests.get(sim.url + "/api/login", auth=(user, password), timeout=5)
    assert r.status_code == 200 and isinstance(r.json(), str)  # a JSON string token
    bad = requests.get(sim.url + "/api/login", auth=(user, "nope"), timeout=5)
    assert bad.status_code == 401
    if sim.major < 4:
        # CSI fixture authorization_failure.json
        assert bad.json() == {"message": "Unauthorized", "httpStatusCode": 401, "errorCode": 0}
        assert requests.post(sim.url + "/rest/auth/login", json={}, timeout=5).status_code == 404
        s = requests.Session()
        s.auth = (user, r.json())
        assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 200
        assert s.get(sim.url + "/api/logout", timeout=5).status_code == 200
        assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 401
    else:
        assert bad.headers["Content-Type"] == "text/html"  # 4.x 401 bodies may be HTML
        assert bad.text.lstrip().startswith("<html>")
        login = requests.post(
            sim.url + "/rest/auth/login", json={"username": user, "password": password}, timeout=5
        ).json()
        assert {"access_token", "refresh_token"} <= set(login)
        # goscaleio uses the /api/login token as Bearer on 4.x
        s = requests.Session()
        s.headers["Authorization"] = "Bearer " + r.json()
        assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 200
        s.headers["Authorization"] = "Bearer " + login["access_token"]
        out = s.post(
            sim.url + "/rest/auth/logout", json={"refresh_token": login["refresh_token"]}, timeout=5
        )
        assert out.status_code == 204  # PPF requires 204
        assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 401


def test_pypowerflex_flow_around_every_call(tmp_path: Path) -> None:
    """PPF on 4.x: /api/login, /api/version, /rest/auth/login, the call, /rest/auth/logout."""
    with PowerFlexSimulator(version="4.5", root=tmp_path) as sim:
        user, password = sim.credentials
        for _ in range(2):
            s = requests.Session()
            t = s.get(sim.url + "/api/login", auth=(user, password), timeout=5).json()
            assert s.get(sim.url + "/api/version", auth=(user, t), timeout=5).json() == "4.5"
            login = s.post(
                sim.url + "/rest/auth/login",
                json={"username": user, "password": password},
                timeout=5,
            ).json()
            s.headers["Authorization"] = "Bearer " + login["access_token"]
            assert s.get(sim.url + "/api/types/Volume/instances", timeout=5).json() == []
            assert (
                s.post(
                    sim.url + "/rest/auth/logout",
                    json={"refresh_token": login["refresh_token"]},
                    timeout=5,
                ).status_code
                == 204
            )


def test_snapshot_volumes_as_documented(sim: PowerFlexSimulator) -> None:
    gw = Gw(sim)
    a, b = sim.add_volume("vol-a"), sim.add_volume("vol-b")
    body = {
        "snapshotDefs": [
            {"volumeId": a, "snapshotName": "snap1"},
            {"volumeId": b, "snapshotName": "snap2"},
        ],
        "accessModeLimit": "ReadOnly",
        "retentionPeriodInMin": "60",
        "allowOnExtManagedVol": "TRUE",
    }
    r = gw.post(f"/instances/System::{sim.system_id}/action/{gw.snap_action()}", body)
    assert r.status_code == 200
    answer = r.json()
    assert set(answer) == {"snapshotGroupId", "volumeIdList"}
    assert HEX16.match(answer["snapshotGroupId"])
    snaps = [gw.get(f"/instances/Volume::{i}").json() for i in answer["volumeIdList"]]
    assert [s["ancestorVolumeId"] for s in snaps] == [a, b]  # volumeIdList[i] is snapshotDefs[i]
    assert [s["name"] for s in snaps] == ["snap1", "snap2"]
    for s in snaps:
        assert set(s) >= ANS_SNAPSHOT_KEYS
        assert s["consistencyGroupId"] == answer["snapshotGroupId"]
        assert s["accessModeLimit"] == "ReadOnly"
        assert s["mappedSdcInfo"] is None
        assert isinstance(s["sizeInKb"], int) and isinstance(s["creationTime"], int)
        assert s["secureSnapshotExpTime"] >= s["creationTime"] + 3600
        assert (
            s["vtreeId"] == gw.get(f"/instances/Volume::{s['ancestorVolumeId']}").json()["vtreeId"]
        )
        assert s["volumeType"] == ("ReadOnlySnapshot" if sim.major >= 5 else "Snapshot")
        assert {"rel": "self", "href": f"/api/instances/Volume::{s['id']}"} in s["links"]
    base = gw.get(f"/instances/Volume::{a}").json()
    assert base["ancestorVolumeId"] is None and base["consistencyGroupId"] is None
    # The call without ::id (CIN, CS) works too; one volume still gets a group id.
    r = gw.post(f"/instances/System/action/{gw.snap_action()}", {"snapshotDefs": [{"volumeId": a}]})
    single = gw.get(f"/instances/Volume::{r.json()['volumeIdList'][0]}").json()
    assert single["consistencyGroupId"] == r.json()["snapshotGroupId"]
    if sim.major >= 5:
        # PyPowerFlex gen2 sends no accessModeLimit: a 5.x snapshot is read-only
        # (ansible-powerflex's 5.x sample: ReadOnlySnapshot, ReadOnly).
        assert (single["accessModeLimit"], single["volumeType"]) == ("ReadOnly", "ReadOnlySnapshot")
    else:
        assert single["accessModeLimit"] == "ReadWrite"  # omitted: ReadWrite (csm#1302)
    # The other version's call is not routed.
    other = "snapshotVolumes" if sim.major >= 5 else "createSnapshot"
    assert gw.post(f"/instances/System::{sim.system_id}/action/{other}", body).status_code == 404


def test_errors_as_documented(sim: PowerFlexSimulator) -> None:
    gw = Gw(sim)
    a = sim.add_volume("vol-a")
    r = gw.post("/types/Volume/instances/action/queryIdByKey", {"name": "vol-a"})
    assert r.status_code == 200 and r.json() == a  # a JSON string body
    r = gw.post("/types/Volume/instances/action/queryIdByKey", {"name": "missing"})
    assert (r.status_code, r.json()["errorCode"]) == (500, 79)  # LXD
    r = gw.get("/instances/Volume::not-hex")
    assert r.status_code == 500 and "must be a hexadecimal number" in r.json()["message"]
    r = gw.post(
        "/types/Volume/instances",
        {
            "name": "x" * 32,
            "volumeSizeInGb": "8",
            "storagePoolId": sim.pool_id,
            "volumeType": "ThinProvisioned",
        },
    )
    assert r.status_code == 500
    assert r.json()["errorCode"] == 226
    assert r.json()["message"] == "The given name exceeds the allowed length of 31 characters."
    r = gw.post(
        "/types/Volume/instances",
        {"name": "vol-a", "volumeSizeInKb": "8388608", "storagePoolId": sim.pool_id},
    )
    assert r.json()["message"] == "Volume name already in use. Please use a different name."
    r = gw.post(
        "/types/Volume/instances",
        {"name": "has space", "volumeSizeInGb": 8, "storagePoolId": sim.pool_id},
    )
    assert "Spaces are not allowed" in r.json()["message"]
    body = r.json()
    assert set(body) >= {"message", "httpStatusCode", "errorCode"}
    assert body["httpStatusCode"] == r.status_code == 500
    assert gw.get("/types/Nothing/instances").status_code == 404
    assert gw.post("/types/Volume/instances", "not an object").status_code == 400


def test_vtree_limit_is_rc_182(sim: PowerFlexSimulator) -> None:
    gw = Gw(sim)
    a = sim.add_volume("vol-a")
    limit = 1022 if sim.major >= 5 else 126
    path = f"/instances/System::{sim.system_id}/action/{gw.snap_action()}"
    ok = gw.post(
        path, {"snapshotDefs": [{"volumeId": a, "snapshotName": f"s{n}"} for n in range(limit)]}
    )
    assert ok.status_code == 200 and len(ok.json()["volumeIdList"]) == limit
    r = gw.post(path, {"snapshotDefs": [{"volumeId": a, "snapshotName": "one-more"}]})
    assert r.status_code == 500
    body = r.json()
    assert body["message"] == "Error with details"
    assert body["details"][0]["rc"] == 182
    tree = gw.get(f"/instances/Volume::{a}").json()["vtreeId"]
    members = gw.get(f"/instances/VTree::{tree}/relationships/Volume").json()
    assert len(members) == limit + 1
    vt = gw.get(f"/instances/VTree::{tree}").json()
    assert vt["name"] == "vol-a" and vt["baseVolumeId"] == a  # GS inttest


def test_overwrite_restore_remove_and_map(sim: PowerFlexSimulator) -> None:
    gw = Gw(sim)
    a, b = sim.add_volume("vol-a"), sim.add_volume("vol-b")
    sdc = sim.add_sdc("db1", guid="0A0B0C0D-1111-4222-8333-444455556666")
    (sim.volume_path(a) / "f").write_text("one")
    path = f"/instances/System::{sim.system_id}/action/{gw.snap_action()}"
    g = gw.post(
        path,
        {
            "snapshotDefs": [
                {"volumeId": a, "snapshotName": "a1"},
                {"volumeId": b, "snapshotName": "b1"},
            ],
            "accessModeLimit": "ReadOnly",
        },
    ).json()
    sa, sb = g["volumeIdList"]
    (sim.volume_path(a) / "f").write_text("two")
    restore = "restore" if sim.major >= 5 else "overwriteVolumeContent"
    wrong = "overwriteVolumeContent" if sim.major >= 5 else "restore"
    assert gw.post(f"/instances/Volume::{a}/action/{wrong}", {"srcVolumeId": sa}).status_code == 404
    r = gw.post(f"/instances/Volume::{a}/action/{restore}", {"srcVolumeId": sb})
    assert r.status_code == 500 and "same V-Tree" in r.json()["details"][0]["errorMessage"]
    r = gw.post(f"/instances/Volume::{a}/action/{restore}", {"srcVolumeId": a})
    assert r.status_code == 500
    # Map by GUID with the documented body (on 5.x through the Host, as PyPowerFlex gen2);
    # mappedSdcInfo becomes a list.
    add = "addMappedHost" if sim.major >= 5 else "addMappedSdc"
    r = gw.post(
        f"/instances/Volume::{a}/action/{add}",
        {
            "guid": "0a0b0c0d-1111-4222-8333-444455556666",
            "allowMultipleMappings": "TRUE",
            "accessMode": "ReadWrite",
        },
    )
    assert r.status_code == 200 and r.json() == {}
    info = gw.get(f"/instances/Volume::{a}").json()["mappedSdcInfo"]
    assert [(m["sdcId"], m["sdcName"], m["accessMode"]) for m in info] == [
        (sdc, "db1", "ReadWrite")
    ]
    assert {"sdcIp", "limitIops", "limitBwInMbps", "isDirectBufferMapping"} <= set(info[0])
    r = gw.post(f"/instances/Volume::{a}/action/{restore}", {"srcVolumeId": sa})
    assert r.status_code == 500  # the simulator refuses a mapped target (the strict side)
    r = gw.post(f"/instances/Volume::{a}/action/removeVolume", {"removeMode": "ONLY_ME"})
    assert (r.status_code, r.json()["errorCode"]) == (500, 104)
    if sim.major >= 5:
        r = gw.post(f"/instances/Volume::{a}/action/removeMappedHost", {"allHosts": "True"})
    else:
        r = gw.post(f"/instances/Volume::{a}/action/removeMappedSdc", {"allSdcs": ""})
    assert r.status_code == 200
    assert gw.get(f"/instances/Volume::{a}").json()["mappedSdcInfo"] is None
    r = gw.post(f"/instances/Volume::{a}/action/{restore}", {"srcVolumeId": sa})
    assert r.status_code == 200 and (sim.volume_path(a) / "f").read_text() == "one"
    r = gw.post(
        f"/instances/System::{sim.system_id}/action/removeConsistencyGroupSnapshots",
        {"snapGroupId": g["snapshotGroupId"]},
    )
    assert r.json() == {"numberOfVolumes": 2}
    r = gw.post(f"/instances/Volume::{b}/action/removeVolume", {"removeMode": "ONLY_ME"})
    assert r.status_code == 200 and r.json() == {}
    again = gw.post(f"/instances/Volume::{b}/action/removeVolume", {"removeMode": "ONLY_ME"})
    assert again.status_code == 500 and again.json()["errorCode"] == 79  # deleting twice fails


def test_sdcs_and_policies_as_documented(sim: PowerFlexSimulator) -> None:
    gw = Gw(sim)
    sim.add_sdc("db1", ip="10.1.2.3")
    sdcs = gw.get("/types/Sdc/instances").json()
    assert {
        "id",
        "name",
        "sdcGuid",
        "sdcIp",
        "sdcApproved",
        "mdmConnectionState",
        "systemId",
    } <= set(sdcs[0])
    r = gw.post("/types/Sdc/instances/action/queryIdByKey", {"ip": "10.1.2.3"})
    assert r.json() == sdcs[0]["id"]
    a = sim.add_volume("vol-a")
    created = gw.post(
        "/types/SnapshotPolicy/instances",
        {
            "name": "sp1",
            "autoSnapshotCreationCadenceInMin": "120",
            "numOfRetainedSnapshotsPerLevel": ["40"],
            "paused": "false",
            "snapshotAccessMode": "ReadOnly",
            "secureSnapshots": "false",
        },
    ).json()
    pid = created["id"]
    add = "assignSnapshotPolicy" if sim.major >= 5 else "addSourceVolumeToSnapshotPolicy"
    assert (
        gw.post(f"/instances/SnapshotPolicy::{pid}/action/{add}", {"sourceVolumeId": a}).status_code
        == 200
    )
    assert gw.get(f"/instances/Volume::{a}").json()["snplIdOfSourceVolume"] == pid
    policy = gw.get(f"/instances/SnapshotPolicy::{pid}").json()
    assert policy["snapshotPolicyState"] == "Active"
    assert policy["autoSnapshotCreationCadenceInMin"] == 120
    assert policy["numOfRetainedSnapshotsPerLevel"] == [40]
    assert gw.post(f"/instances/SnapshotPolicy::{pid}/action/pauseSnapshotPolicy", {}).json() == {}
    assert gw.get(f"/instances/SnapshotPolicy::{pid}").json()["snapshotPolicyState"] == "Paused"
    sources = gw.get(f"/instances/SnapshotPolicy::{pid}/relationships/SourceVolume").json()
    assert [v["id"] for v in sources] == [a]


def test_faults(sim: PowerFlexSimulator) -> None:
    gw = Gw(sim)
    sim.inject(Fault("status", method="GET", path_contains="/System/", status=503))
    assert gw.get("/types/System/instances").status_code == 503
    assert gw.get("/types/System/instances").status_code == 200
    sim.inject(Fault("drop", path_contains="/System/"))
    with pytest.raises(requests.ConnectionError):
        gw.get("/types/System/instances")
    sim.inject(Fault("expire_tokens", path_contains="/System/"))
    assert gw.get("/types/System/instances").status_code == 401


# --------------------------------------------------------------------------- Host objects


def test_hosts_are_sdcs_and_nvme_hosts_under_one_id(sim: PowerFlexSimulator) -> None:
    """4.x and 5.x: ``/api/types/Host/instances`` lists the SDCs (``hostType``
    ``SdcHost``, the SDC's id) and NVMe hosts, which ``POST`` creates with an ``nqn``
    (PyPowerFlex ``host.create``; the ansible-powerflex NVMe host sample's fields).
    3.x has no Host type."""
    gw = Gw(sim)
    sdc = sim.add_sdc("db1", ip="10.1.2.3")
    if sim.major < 4:
        assert gw.get("/types/Host/instances").status_code == 404
        assert gw.post("/types/Host/instances", {"nqn": "nqn.x"}).status_code == 404
        assert gw.get(f"/instances/Host::{sdc}").status_code == 404
        return
    (host,) = gw.get("/types/Host/instances").json()
    as_sdc = gw.get(f"/instances/Sdc::{sdc}").json()
    assert (host["id"], host["name"], host["hostType"]) == (sdc, "db1", "SdcHost")
    assert (host["sdcGuid"], host["sdcIp"]) == (as_sdc["sdcGuid"], "10.1.2.3")
    assert {"nqn", "maxNumPaths", "maxNumSysPorts", "systemId", "links"} <= set(host)
    assert {"rel": "self", "href": f"/api/instances/Host::{sdc}"} in host["links"]
    nqn = "nqn.2014-08.org.nvmexpress:uuid:79e90a42-47c9-a0f6-d9d3-51c47c72c7c1"
    created = gw.post(
        "/types/Host/instances",
        {"nqn": nqn, "name": "nvme1", "maxNumPaths": "6", "maxNumSysPorts": "10"},
    )
    assert created.status_code == 200 and HEX16.match(created.json()["id"])
    hid = created.json()["id"]
    nvme = gw.get(f"/instances/Host::{hid}").json()
    assert (nvme["hostType"], nvme["nqn"], nvme["maxNumPaths"], nvme["maxNumSysPorts"]) == (
        "NVMeHost",
        nqn,
        6,
        10,
    )
    assert nvme["sdcGuid"] is None and nvme["sdcIp"] is None
    # The Sdc listing holds the NVMe hosts too (ansible-powerflex filters them out).
    assert {s["hostType"] for s in gw.get("/types/Sdc/instances").json()} == {"SdcHost", "NVMeHost"}
    assert gw.post("/types/Host/instances", {"name": "no-nqn"}).status_code == 400
    assert (
        gw.post(
            f"/instances/Host::{hid}/action/modifyMaxNumPaths", {"newMaxNumPaths": "4"}
        ).status_code
        == 200
    )
    assert gw.get(f"/instances/Host::{hid}").json()["maxNumPaths"] == 4
    # Removed as an SDC is (goscaleio DeleteNvmeHost, LXD): Sdc::<id>/action/removeSdc.
    assert gw.post(f"/instances/Sdc::{hid}/action/removeSdc", {}).status_code == 200
    assert gw.get(f"/instances/Host::{hid}").status_code == 500


def test_mapping_through_hosts_follows_the_version(sim: PowerFlexSimulator) -> None:
    """addMappedHost/removeMappedHost (``hostId``, ``guid`` or ``nqn``) on 4.x (LXD) and
    5.x (PyPowerFlex gen2, which has no addMappedSdc); addMappedSdc on 3.x and 4.x."""
    gw = Gw(sim)
    sdc = sim.add_sdc("db1")
    a = sim.add_volume("vol-a")
    host_add = gw.post(
        f"/instances/Volume::{a}/action/addMappedHost",
        {"hostId": sdc, "accessMode": "ReadWrite", "volumeClass": "defaultclass"},
    )
    sdc_add = f"/instances/Volume::{a}/action/addMappedSdc"
    if sim.major < 4:
        assert host_add.status_code == 404  # no Host objects on 3.x
        assert gw.post(sdc_add, {"sdcId": sdc}).status_code == 200
        return
    assert host_add.status_code == 200 and host_add.json() == {}
    (info,) = gw.get(f"/instances/Volume::{a}").json()["mappedSdcInfo"]
    assert (info["sdcId"], info["hostType"], info["accessMode"]) == (sdc, "SdcHost", "ReadWrite")
    assert [v["id"] for v in gw.get(f"/instances/Host::{sdc}/relationships/Volume").json()] == [a]
    assert [v["id"] for v in gw.get(f"/instances/Sdc::{sdc}/relationships/Volume").json()] == [a]
    again = gw.post(f"/instances/Volume::{a}/action/addMappedHost", {"hostId": sdc})
    assert (again.status_code, again.json()["errorCode"]) == (500, 81)
    assert gw.post(f"/instances/Sdc::{sdc}/action/removeSdc", {}).status_code == 500  # mapped
    remove = f"/instances/Volume::{a}/action/removeMappedHost"
    assert gw.post(remove, {"hostId": sdc}).status_code == 200
    gone = gw.post(remove, {"hostId": sdc})
    assert (gone.status_code, gone.json()["errorCode"]) == (500, 4039)  # LXD's invalid mapping
    assert gw.get(f"/instances/Volume::{a}").json()["mappedSdcInfo"] is None
    nqn = "nqn.2014-08.org.nvmexpress:uuid:abc"
    nvme = sim.add_nvme_host("nvme1", nqn=nqn)
    assert gw.post(f"/instances/Volume::{a}/action/addMappedHost", {"nqn": nqn}).status_code == 200
    (info,) = gw.get(f"/instances/Volume::{a}").json()["mappedSdcInfo"]
    assert (info["sdcId"], info["hostType"], info["nqn"]) == (nvme, "NVMeHost", nqn)
    r = gw.post(f"/instances/Volume::{a}/action/removeMappedHost", {"allHosts": "True"})
    assert r.status_code == 200
    if sim.major >= 5:
        assert gw.post(sdc_add, {"sdcId": sdc}).status_code == 404  # gen2: Hosts only
        assert (
            gw.post(f"/instances/Volume::{a}/action/removeMappedSdc", {"allSdcs": ""}).status_code
            == 404
        )
    else:
        assert gw.post(sdc_add, {"sdcId": nvme}).status_code == 500  # not an SDC
        assert gw.post(sdc_add, {"sdcId": sdc}).status_code == 200


def test_nvme_hosts_need_4x() -> None:
    with PowerFlexSimulator(version="3.6") as sim, pytest.raises(ConfigurationError):
        sim.add_nvme_host("nvme1")


def test_basic_token_authentication_on_every_version(sim: PowerFlexSimulator) -> None:
    """PyPowerFlex sends Basic (user, token) to /api/version on every version, and the
    gateway accepts it: on 4.x and 5.x a token of either login works as Basic too."""
    user, password = sim.credentials
    token = requests.get(sim.url + "/api/login", auth=(user, password), timeout=5).json()
    s = requests.Session()
    s.auth = (user, token)
    assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 200
    s.auth = (user, "not-a-token")
    assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 401
    if sim.major >= 4:
        login = requests.post(
            sim.url + "/rest/auth/login", json={"username": user, "password": password}, timeout=5
        ).json()
        s.auth = ("", login["access_token"])
        assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 200
    else:  # 3.x knows no Bearer
        s.auth = None
        s.headers["Authorization"] = "Bearer " + token
        assert s.get(sim.url + "/api/types/System/instances", timeout=5).status_code == 401


@pytest.mark.parametrize("version", ["3.6", "4.5"])
def test_a_version_needing_a_session_takes_the_basic_token(version: str, tmp_path: Path) -> None:
    """PyPowerFlex's get_api_version: GET /api/login, then /api/version with Basic
    (user, token), on 4.x too."""
    with PowerFlexSimulator(version=version, root=tmp_path, version_needs_auth=True) as sim:
        user, password = sim.credentials
        assert requests.get(sim.url + "/api/version", timeout=5).status_code == 401
        token = requests.get(sim.url + "/api/login", auth=(user, password), timeout=5).json()
        r = requests.get(sim.url + "/api/version", auth=(user, token), timeout=5)
        assert (r.status_code, r.json()) == (200, version)


# --------------------------------------------------------------------------- the TLS front


def test_the_tls_front_serves_the_simulator_over_https(
    sim: PowerFlexSimulator, tmp_path: Path
) -> None:
    cert = make_certificate(tmp_path / "certs")
    with TlsFront(sim.url, cert) as front:
        url = front.url
        assert url.startswith("https://127.0.0.1:")
        r = requests.get(front.url + "/api/version", verify=str(cert.ca), timeout=5)
        assert (r.status_code, r.json()) == (200, sim.version)
        s = requests.Session()  # keep-alive: several requests on one TLS connection
        for _ in range(3):
            assert s.get(front.url + "/api/version", verify=str(cert.ca), timeout=5).ok
        assert front.connections == 2
        with pytest.raises(requests.exceptions.SSLError, match="certificate verify failed"):
            requests.get(front.url + "/api/version", timeout=5)  # the system's CAs only
        sim.inject(Fault("drop", path_contains="/api/version"))
        with pytest.raises(requests.ConnectionError) as info:
            requests.get(front.url + "/api/version", verify=str(cert.ca), timeout=5)
        assert not isinstance(info.value, requests.exceptions.SSLError)  # a cut, not TLS
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/api/version", verify=str(cert.ca), timeout=5)  # stopped
