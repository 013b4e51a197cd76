"""Fleets without a server (issue 25): the fleet configuration (a file or a directory,
defaults merged, names checked), the command line of each cluster's run, and the
runner's limits (parallel, per storage system, timeout, a locked cluster skipped),
with real child processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pgsnap.cli import _cluster_argv
from pgsnap.errors import ConfigurationError
from pgsnap.fleet import RunStatus, is_fleet, load_fleet, run_fleet

FLEET = """\
[fleet]
parallel = 3
per_storage = 1
cluster_timeout = "10min"

[defaults.catalog]
conninfo = "host=catalog dbname=pgsnap"
path = "/var/lib/pgsnap/{cluster}"

[defaults.storage]
backend = "powerflex"
[defaults.storage.options]
gateway = "https://pf1"

[defaults.timeouts]
wal = 120

[clusters.db1.database]
conninfo = "host=db1"
[[clusters.db1.volume]]
id = "v1"
name = "data"
role = "data"
mount_point = "/pg/db1"

[clusters.db2.database]
conninfo = "host=db2"
[clusters.db2.storage.options]
gateway = "https://pf2"
[clusters.db2.timeouts]
server = 30
"""


def test_a_fleet_file_merges_its_defaults_under_each_cluster(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    assert is_fleet(path)
    fleet = load_fleet(path)
    assert fleet.names == ("db1", "db2")
    assert (fleet.parallel, fleet.per_storage, fleet.cluster_timeout) == (3, 1, 600.0)
    db1, db2 = fleet.member("db1"), fleet.member("db2")
    assert db1.conf["catalog"] == {
        "conninfo": "host=catalog dbname=pgsnap",
        "path": "/var/lib/pgsnap/db1",  # {cluster} is the cluster's name
        "cluster": "db1",  # a shared catalog's cluster defaults to it too
    }
    assert db2.conf["catalog"]["path"] == "/var/lib/pgsnap/db2"
    assert db1.conf["timeouts"] == {"wal": 120}
    assert db2.conf["timeouts"] == {"wal": 120, "server": 30}  # merged table by table
    assert db2.conf["storage"] == {"backend": "powerflex", "options": {"gateway": "https://pf2"}}
    assert (db1.storage, db2.storage) == ("powerflex:https://pf1", "powerflex:https://pf2")
    assert db1.base == tmp_path
    with pytest.raises(ConfigurationError, match=r"did you mean 'db\d'\? its clusters: db1, db2"):
        fleet.member("dbl")


def test_a_directory_is_a_fleet_of_its_files(tmp_path: Path) -> None:
    (tmp_path / "defaults.toml").write_text(
        '[fleet]\nparallel = 2\n\n[archive]\npath = "/wal/{cluster}"\n'
    )
    (tmp_path / "alpha.toml").write_text('[database]\nconninfo = "host=a"\n')
    (tmp_path / "beta.toml").write_text('[database]\nconninfo = "host=b"\n[archive]\ngzip = true\n')
    fleet = load_fleet(tmp_path)
    assert fleet.names == ("alpha", "beta") and fleet.parallel == 2
    assert fleet.member("alpha").conf["archive"] == {"path": "/wal/alpha"}
    assert fleet.member("beta").conf["archive"] == {"path": "/wal/beta", "gzip": True}
    assert not is_fleet(tmp_path / "alpha.toml")  # one cluster's configuration


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[clusters]\n", "has no cluster"),
        ("[defaults.databse]\n[clusters.a.database]\n", "did you mean [database]?"),
        ("[clusters.a.databse]\n", "cluster a has an unknown section [databse]"),
        ('[clusters."a b".database]\n', "is not a name"),
        ("[fleet]\nparallel = -1\n[clusters.a.database]\n", "whole number"),
        ("[fleet]\nparalel = 2\n[clusters.a.database]\n", "parallel"),
        ('[fleet]\ncluster_timeout = "soon"\n[clusters.a.database]\n', "cluster_timeout"),
        ("[clusterz.a]\n", "clusters"),
    ],
)
def test_a_wrong_fleet_is_refused_saying_what_is_wrong(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as info:
        load_fleet(path)
    assert message in str(info.value)


def test_each_cluster_runs_its_own_command_line() -> None:
    argv = ["backup", "-c", "f.toml", "--all", "--parallel", "4", "--per-storage=2", "--json"]
    assert _cluster_argv(argv, "db1", "backup") == [
        "backup", "-c", "f.toml", "--json", "--cluster", "db1", "--alone",
    ]  # fmt: skip
    argv = ["list", "--all", "-c", "f.toml", "--cluster-timeout", "5min"]
    assert _cluster_argv(argv, "db2", "list") == ["list", "-c", "f.toml", "--cluster", "db2"]


def _fleet_of(tmp_path: Path, names: list[str], storage: dict[str, str]) -> Path:
    text = ""
    for name in names:
        text += (
            f'[clusters.{name}.storage]\nbackend = "mock"\n'
            f'[clusters.{name}.storage.options]\nroot = "{storage[name]}"\n'
        )
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def _child(script: str) -> list[str]:
    return [sys.executable, "-c", script]


def test_the_runner_keeps_its_limits_and_says_how_each_ended(tmp_path: Path) -> None:
    """Five clusters, two storage systems: never more than ``parallel`` at once, never
    two at once on one system; exit 6 is a skip, other codes a failure, a run past its
    timeout is stopped (SIGTERM) and said so."""
    names = ["a", "b", "c", "d", "e"]
    storage = {"a": "s1", "b": "s1", "c": "s1", "d": "s2", "e": "s2"}
    fleet = load_fleet(_fleet_of(tmp_path, names, storage))
    log = tmp_path / "log"
    codes = {"a": 0, "b": 6, "c": 1, "d": 0, "e": "sleep"}

    def argv_for(name: str) -> list[str]:
        code = codes[name]
        body = "time.sleep(30)" if code == "sleep" else f"time.sleep(0.4); sys.exit({code})"
        return _child(
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as pgsnap does\n"
            f"open({str(log)!r}, 'a').write('start {name} ' + repr(time.monotonic()) + chr(10))\n"
            "try:\n"
            f"    {body}\n"
            "finally:\n"
            f"    open({str(log)!r}, 'a').write('end {name} ' + repr(time.monotonic()) + chr(10))\n"
            "print('said by ' + sys.argv[0])\n"
        )

    results = run_fleet(fleet, argv_for, parallel=3, per_storage=1, cluster_timeout=3.0)
    got = {r.cluster: r.status for r in results}
    assert got == {
        "a": RunStatus.OK,
        "b": RunStatus.SKIPPED,
        "c": RunStatus.FAILED,
        "d": RunStatus.OK,
        "e": RunStatus.TIMED_OUT,
    }
    assert [r.cluster for r in results] == names
    assert next(r for r in results if r.cluster == "e").error.startswith("stopped after 0:00:03")
    events = [line.split() for line in log.read_text().splitlines()]
    spans: dict[str, list[float]] = {}
    for _kind, name, at in events:
        spans.setdefault(name, []).append(float(at))
    assert sorted(spans) == names and all(len(v) == 2 for v in spans.values())  # all ended

    def overlapping(group: list[str]) -> int:
        marks = sorted((t, +1 if i == 0 else -1) for n in group for i, t in enumerate(spans[n]))
        now = peak = 0
        for _t, step in marks:
            now += step
            peak = max(peak, now)
        return peak

    assert overlapping(["a", "b", "c"]) == 1  # one storage system: one at a time
    assert overlapping(["d", "e"]) == 1
    assert overlapping(names) <= 2  # two systems: at most two at once here


def test_the_runner_runs_clusters_side_by_side(tmp_path: Path) -> None:
    """Four clusters on four systems, parallel 4: all four are running at one moment
    (each waits until it sees the others' start marks, or gives up after 20 s)."""
    names = [f"c{i}" for i in range(4)]
    fleet = load_fleet(_fleet_of(tmp_path, names, {n: n for n in names}))
    marks = tmp_path / "marks"
    marks.mkdir()
    script = (
        "import pathlib, sys, time\n"
        f"d = pathlib.Path({str(marks)!r})\n"
        "(d / sys.argv[1]).touch()\n"
        "deadline = time.monotonic() + 20\n"
        "while len(list(d.iterdir())) < 4 and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "sys.exit(0 if len(list(d.iterdir())) == 4 else 1)\n"
    )
    results = run_fleet(fleet, lambda n: [*_child(script), n], parallel=4)
    assert [r.status for r in results] == [RunStatus.OK] * 4
