"""Clones and drills without a server: settings, tablespace maps, records, requests,
findings, and the mock's clone deletion (issue 22)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.adapters import _pgconf
from pgsnap.backends.mock import MockBackend
from pgsnap.catalog import DirectoryCatalog, MemoryCatalog
from pgsnap.clones import drill_findings, drill_html, drill_table
from pgsnap.errors import BackendError, CatalogError, ConfigurationError, ExecutionError
from pgsnap.model import (
    LSN,
    BackupRecord,
    BackupState,
    CloneRecord,
    CloneState,
    CloneVolume,
    DrillCheck,
    DrillPhase,
    DrillRecord,
    Layout,
    RecoveryAction,
    RecoveryTarget,
    Volume,
    VolumeRole,
)
from pgsnap.operations.clone import clone_parameters, rewrite_tablespace_map
from pgsnap.planner.clone import CloneRequest
from pgsnap.protocols import Capability

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def clone_record(name: str = "c1") -> CloneRecord:
    return CloneRecord(
        name=name, backup_id="b1", target=RecoveryTarget.latest(), host="db1", at="/c",
        data_directory="/c/data", port=55432, socket_directory="/c",
        action=RecoveryAction.PROMOTE, state=CloneState.CREATING, created_at=T0,
        created_by="me", plan_id="p",
        volumes=[CloneVolume("vol-1", VolumeRole.DATA, "snap-1", "/c/data")],
    )  # fmt: skip


def drill_record(ok: bool, backup: str = "b1", at: dt.datetime = T0) -> DrillRecord:
    return DrillRecord(
        id=f"d{backup}{at:%H%M%S}", backup_id=backup, target=RecoveryTarget.latest(), clone="d1",
        started_at=at, finished_at=at + dt.timedelta(seconds=9), ok=ok,
        checks=[DrillCheck("amcheck", ok, "3 indexes")], phases=[DrillPhase("storage", 0.5)],
        rto_seconds=2.5, rpo_seconds=1.0,
    )  # fmt: skip


def test_instance_settings_win_and_apply_once() -> None:
    text = "port = '5432'\nshared_buffers = '1GB'\n"
    params = clone_parameters(name="c1", port=55432, socket_directory="/c", listen_addresses="")
    once = _pgconf.set_instance_parameters(text, params)
    assert "port = '5432'" not in once
    assert once.rstrip().endswith("# END pgsnap instance settings")
    assert "archive_mode = 'off'" in once and "cluster_name = 'pgsnap-clone-c1'" in once
    assert "shared_buffers = '1GB'" in once
    assert _pgconf.set_instance_parameters(once, params) == once
    with pytest.raises(ValueError, match="line break"):
        _pgconf.set_instance_parameters("", {"port": "1\n2"})


def test_the_tablespace_map_moves_to_the_clone_or_is_refused() -> None:
    text, where = rewrite_tablespace_map(
        "16390 /pg/ts/sub\n16391 /pg/ts2\n", {"/pg/ts": "/c/ts-a", "/pg/ts2": "/c/ts-b"}
    )
    assert text == "16390 /c/ts-a/sub\n16391 /c/ts-b\n"
    assert where == {"16390": "/c/ts-a/sub", "16391": "/c/ts-b"}
    assert rewrite_tablespace_map("", {}) == ("", {})
    with pytest.raises(ExecutionError, match="the cluster's own tablespace"):
        rewrite_tablespace_map("16390 /elsewhere/ts\n", {"/pg/ts": "/c/ts"})


@pytest.mark.parametrize("kind", ["directory", "memory"])
def test_catalogs_keep_clones_and_drills(tmp_path: Path, kind: str) -> None:
    catalog = DirectoryCatalog(tmp_path) if kind == "directory" else MemoryCatalog()
    record = clone_record()
    catalog.put_clone(record)
    assert catalog.get_clone("c1") == record
    assert catalog.list_clones() == (record,)
    catalog.delete_clone("c1")
    assert catalog.list_clones() == ()
    with pytest.raises(CatalogError, match="no clone 'c1'"):
        catalog.get_clone("c1")
    with pytest.raises(CatalogError, match="no clone 'c1'"):
        catalog.delete_clone("c1")
    later = drill_record(True, at=T0 + dt.timedelta(hours=1))
    first = drill_record(False)
    catalog.put_drill(later)
    catalog.put_drill(first)
    catalog.put_drill(drill_record(True, backup="b2"))
    assert catalog.list_drills("b1") == (first, later)
    assert len(catalog.list_drills()) == 3


def test_an_unreadable_clone_record_is_left_out(tmp_path: Path) -> None:
    catalog = DirectoryCatalog(tmp_path)
    catalog.put_clone(clone_record("good"))
    (tmp_path / "clones" / "bad.json").write_text("{not json")
    assert [c.name for c in catalog.list_clones()] == ["good"]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": "Bad Name", "port": 55432}, "invalid clone name"),
        ({"name": "a" * 21, "port": 55432}, "invalid clone name"),
        ({"name": "ok", "port": 80}, "invalid clone port"),
        ({"name": "ok", "port": 55432, "at": "relative/dir"}, "invalid clone directory"),
        ({"name": "ok", "port": 55432, "action": RecoveryAction.SHUTDOWN}, "cannot shutdown"),
    ],
)
def test_bad_clone_requests_get_a_typed_error(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        CloneRequest(**fields)  # type: ignore[arg-type]


def backup(bid: str, hours: int = 0) -> BackupRecord:
    layout = Layout([Volume("vol-1", "data", VolumeRole.DATA, "/pg/data")])
    at = T0 + dt.timedelta(hours=hours)
    return BackupRecord(
        id=bid, label=bid, state=BackupState.DONE, system_identifier="1",
        server_version=150018, wal_segment_size=1 << 24, layout=layout,
        start_lsn=LSN(0x2000028), start_timeline=1, start_time=at, stop_lsn=LSN(0x3000100),
        stop_timeline=1, stop_time=at, labelfile="START WAL LOCATION: 0/2000028\n",
        snapshots={"vol-1": f"{bid}-snap"},
    )  # fmt: skip


def test_check_warns_of_an_undrilled_or_failed_newest_backup() -> None:
    newest = backup("b2", hours=1)
    older = backup("b1")
    assert [f.code for f in drill_findings([older, newest], [])] == ["backup_not_drilled"]
    assert drill_findings([older, newest], [drill_record(True, "b2")]) == []
    failed = drill_findings(
        [older, newest], [drill_record(True, "b2"), drill_record(False, "b2", T0 + dt.timedelta(1))]
    )
    assert [f.code for f in failed] == ["drill_failed"]
    assert drill_findings([], []) == []
    # A drill's clone left by an interrupted drill is warned about; one a failed drill
    # kept on purpose, or a user's clone, is not.
    left = attrs.evolve(clone_record("d1"), purpose="drill")
    user = clone_record("c1")
    fine = [drill_record(True, "b2")]
    found = drill_findings([older, newest], fine, [left, user])
    assert [f.code for f in found] == ["drill_clone_left"]
    assert "pgsnap clone destroy d1" in found[0].message
    kept = [*fine, attrs.evolve(drill_record(False, "b1"), clone="d1", kept=True)]
    assert drill_findings([older, newest], kept, [left, user]) == []


def test_drills_render_as_a_table_and_html() -> None:
    rows = drill_table([drill_record(True), drill_record(False)])
    assert rows[0][0] == "drill" and rows[1][3] == "ok" and rows[2][3] == "FAILED"
    assert rows[2][7] == "amcheck"
    html = drill_html(drill_record(False))
    assert "FAILED" in html and "<table>" in html
    # The replay rate: WAL bytes over the replay phase.
    replayed = attrs.evolve(
        drill_record(True), wal_bytes=8 * 2**20, phases=[DrillPhase("replay", 2.0)]
    )
    assert replayed.replay_rate == 4 * 2**20
    assert "4.0 MiB/s" in drill_table([replayed])[1][6] and "4.0 MiB/s" in drill_html(replayed)
    assert drill_record(True).replay_rate is None  # no replay phase measured


def test_the_mock_deletes_its_clones_and_never_an_origin(tmp_path: Path) -> None:
    source = tmp_path / "vol"
    source.mkdir()
    (source / "f").write_text("x")
    backend = MockBackend(root=tmp_path / "root", capabilities=set(Capability))
    vol = backend.add_volume("data", path=source)
    group = backend.create_snapshot_group([vol.id], "g")
    (snap,) = [s.id for s in group.snapshots]
    clone = backend.clone_snapshot(snap, "pgc-c1-x", path=tmp_path / "clone")
    assert (tmp_path / "clone" / "f").read_text() == "x"
    with pytest.raises(BackendError, match="not a clone"):
        backend.delete_clone(vol.id)
    backend.delete_clone(clone.id)
    backend.delete_clone(clone.id)  # idempotent
    assert not (tmp_path / "clone").exists()
    assert [v.id for v in backend.list_volumes()] == [vol.id]
    assert (source / "f").read_text() == "x"


def test_listening_ports_are_read_from_the_hosts_proc() -> None:
    """A clone's default port skips what listens on its host (``/proc/net/tcp*``)."""
    import socket

    from pgsnap.clones import listening_ports
    from pgsnap.host import Host

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port in listening_ports(Host())
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening
        assert closed.getsockname()[1] not in listening_ports(Host())


def test_a_default_name_in_use_by_a_clone_or_a_drill_gets_a_suffix() -> None:
    """Two drills in one second (a script drilling each backup) got one name: the second
    overwrote the first's record, and its clone plan, made again the same, had "already
    run" (a CI failure). A default name in use takes the next free ``-N``."""
    from types import SimpleNamespace

    from pgsnap.clones import clone_request

    catalog = MemoryCatalog()
    cluster: Any = SimpleNamespace(catalog=catalog, clone_hosts={}, _now=lambda: T0)

    def name(purpose: str) -> str:
        return clone_request(
            cluster, name=None, host=None, port=5999, purpose=purpose, listen_addresses=""
        ).name

    assert name("drill") == "d20261201000000"
    catalog.put_drill(attrs.evolve(drill_record(True), id="d20261201000000"))
    assert name("drill") == "d20261201000000-2"
    catalog.put_clone(clone_record("d20261201000000-2"))
    catalog.put_drill(attrs.evolve(drill_record(True), id="d20261201000000-3"))
    assert name("drill") == "d20261201000000-4"
    assert name("clone") == "c20261201000000"
    catalog.put_clone(clone_record("c20261201000000"))
    assert name("clone") == "c20261201000000-2"
    assert (
        clone_request(
            cluster, name="mine", host=None, port=5999, purpose="drill", listen_addresses=""
        ).name
        == "mine"
    )  # a name given is the caller's: never changed
