"""pgsnap.Cluster.from_config: one typed way from a configuration to a Cluster.

A TOML file and a mapping of the same shape build the same cluster; relative
paths follow the file (or ``base``); what is wrong is a ConfigurationError that
says what to write instead. (The command's own use of it is tested with the
CLI; a real server behind it in tests/integration/test_cli.py.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import pgsnap
from pgsnap.catalog import DirectoryCatalog
from pgsnap.config import cluster_arguments, load_catalog, load_retention, load_timeouts
from pgsnap.errors import ConfigurationError

from .test_cli_unit import write_config


def _mapping(config: Path) -> dict[str, object]:
    return tomllib.loads(config.read_text())


def test_a_file_and_a_mapping_build_the_same_cluster(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    from_file = pgsnap.Cluster.from_config(config)
    from_mapping = pgsnap.Cluster.from_config(_mapping(config))
    assert isinstance(from_file, pgsnap.Cluster)
    assert repr(from_file).startswith("<pgsnap.Cluster backend=mock ")
    assert from_file.layout == from_mapping.layout
    assert from_file.archive.location == from_mapping.archive.location == str(tmp_path / "archive")
    assert from_file.backend.name == from_mapping.backend.name == "mock"
    assert tuple(from_file.backups()) == tuple(from_mapping.backups()) == ()


def test_relative_paths_follow_the_file_or_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "site" / "archive").mkdir(parents=True)
    conf = _mapping(write_config(tmp_path))
    conf["archive"] = {"path": "archive"}
    conf["catalog"] = {"path": "catalog"}
    file = tmp_path / "site" / "pgsnap.toml"
    file.write_text(
        (tmp_path / "pgsnap.toml")
        .read_text()
        .replace(f'path = "{tmp_path / "archive"}"', 'path = "archive"')
        .replace(f'path = "{tmp_path / "catalog"}"', 'path = "catalog"')
    )
    assert pgsnap.Cluster.from_config(file).archive.location == str(tmp_path / "site" / "archive")
    based = pgsnap.Cluster.from_config(conf, base=tmp_path / "site")
    assert based.archive.location == str(tmp_path / "site" / "archive")
    monkeypatch.chdir(tmp_path / "site")
    assert pgsnap.Cluster.from_config(conf).archive.location == str(tmp_path / "site" / "archive")


@pytest.mark.parametrize(
    ("edit", "message", "hint"),
    [
        (
            lambda c: c.update(databse={}),
            "configuration mapping has an unknown section [databse]",
            "did you mean [database]?",
        ),
        (
            lambda c: c["archive"].update(gzipped=True),
            "[archive] has an unknown key 'gzipped'",
            "did you mean 'gzip'?",
        ),
        (
            lambda c: c["database"].update(password="hunter2"),
            "the configuration file must not hold a password",
            "password_env",
        ),
        (
            lambda c: c.pop("catalog"),
            "configuration mapping lacks the [catalog] section",
            "docs/cli.md",
        ),
        (
            lambda c: c.update(volume={"id": "v"}),
            "[[volume]] table (double brackets)",
            "docs/cli.md",
        ),
        (
            lambda c: c.update(copies={"parallel": "4"}),
            "[copies] parallel must be a whole number from 1 to 64, not '4'",
            "without quotes",
        ),
        (
            lambda c: c.update(copies={"bandwidth_limit": "50 MiBs"}),
            "[copies] bandwidth_limit has an unknown unit 'mibs'",
            "MiB",
        ),
        (
            lambda c: c.update(copies={"bandwidth_limit": 0}),
            "[copies] bandwidth_limit must be above 0 bytes",
            '"50MiB"',
        ),
    ],
)
def test_what_is_wrong_is_said_with_what_to_write(
    tmp_path: Path, edit, message: str, hint: str
) -> None:
    conf = _mapping(write_config(tmp_path))
    edit(conf)
    with pytest.raises(ConfigurationError) as info:
        pgsnap.Cluster.from_config(conf)
    assert message in info.value.message
    assert hint in (info.value.hint or "")
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value)


def test_the_catalog_alone_is_the_clusters_catalog(tmp_path: Path) -> None:
    """``load_catalog`` opens what ``cluster_arguments`` would give as the catalog, from
    a file, a mapping or relative to ``base``."""
    config = write_config(tmp_path)
    alone = load_catalog(config)
    assert isinstance(alone, DirectoryCatalog)
    assert alone.path == cluster_arguments(config)["catalog"].path == tmp_path / "catalog"
    conf = _mapping(config)
    conf["catalog"] = {"path": "catalog"}
    based = load_catalog(conf, base=tmp_path)
    assert isinstance(based, DirectoryCatalog)
    assert based.path == tmp_path / "catalog"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(databse={}), "unknown section [databse]"),
        (lambda c: c.pop("archive"), "lacks the [archive] section"),
        (lambda c: c["storage"].update(backnd="mock"), "[storage] has an unknown key 'backnd'"),
        (lambda c: c["database"].update(conninf="x"), "[database] has an unknown key 'conninf'"),
        (lambda c: c["catalog"].update(wal_idx=False), "[catalog] has an unknown key 'wal_idx'"),
        (lambda c: c["catalog"].pop("path"), "[catalog] lacks 'path'"),
        (lambda c: c["database"].update(password="hunter2"), "must not hold a password"),
    ],
)
def test_the_catalog_alone_still_refuses_a_misspelt_configuration(
    tmp_path: Path, edit, message: str
) -> None:
    conf = _mapping(write_config(tmp_path))
    edit(conf)
    with pytest.raises(ConfigurationError) as info:
        load_catalog(conf)
    assert message in info.value.message
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value)


def test_the_other_sections_read_from_a_mapping_too(tmp_path: Path) -> None:
    conf = _mapping(write_config(tmp_path))
    conf["timeouts"] = {"recovery": 42}
    conf["retention"] = {"redundancy": 3}
    conf["copies"] = {"path": str(tmp_path / "copies"), "parallel": 8, "bandwidth_limit": "50MiB"}
    assert load_timeouts(conf).recovery == 42.0
    assert load_retention(conf) == {"redundancy": 3}
    assert pgsnap.Cluster.from_config(conf).adapter is not None
    args = cluster_arguments(conf)
    assert sorted(args) == [
        "adapter",
        "archive",
        "backend",
        "catalog",
        "clone_hosts",
        "copy_bandwidth_limit",
        "copy_key_file",
        "copy_parallel",
        "copy_retention",
        "copy_target",
        "copy_target_options",
        "journal_dir",
        "layout",
        "primary",
        "wal_index",
    ]
    assert (args["copy_parallel"], args["copy_bandwidth_limit"]) == (8, 50 * 2**20)
    cluster = pgsnap.Cluster.from_config(conf)
    assert (cluster.copy_parallel, cluster.copy_bandwidth_limit) == (8, 50 * 2**20)
    assert cluster.clone_hosts == {}


def test_clone_hosts_are_hosts_by_their_storage_name(tmp_path: Path) -> None:
    """``[clone_hosts.NAME]``: other hosts where clones may run, this machine or over
    ssh, named as the storage names them (``name`` overrides the table's name)."""
    conf = _mapping(write_config(tmp_path))
    conf["clone_hosts"] = {
        "dev1": {"ssh": "dev1.example.com", "user": "root", "port": 2222},
        "here": {"name": "sdc-7"},
    }
    hosts = pgsnap.Cluster.from_config(conf).clone_hosts
    assert sorted(hosts) == ["dev1", "sdc-7"]
    assert hosts["dev1"].runner.description.startswith("ssh root@dev1.example.com:2222")
    assert hosts["sdc-7"].runner.description == "local"
    for bad, message in [
        ({"dev1": "dev1.example.com"}, "[clone_hosts.dev1] must be a table"),
        ({"dev1": {"user": "root"}}, "[clone_hosts.dev1] sets user but no ssh destination"),
        ({"dev1": {"ssh": "x", "sudo": True}}, "sudo"),
    ]:
        conf["clone_hosts"] = bad
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            pgsnap.Cluster.from_config(conf)


def test_the_primary_section_reaches_the_standbys_primary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: ``[primary]`` names the primary a standby streams from; its password
    comes from the environment or a file, never from the configuration."""
    conf = _mapping(write_config(tmp_path))
    assert pgsnap.Cluster.from_config(conf).primary is None
    monkeypatch.setenv("PG1", "hunter2")
    conf["primary"] = {"conninfo": "host=db1 port=5432 user=pgsnap", "password_env": "PG1"}
    primary = pgsnap.Cluster.from_config(conf).primary
    assert primary is not None
    assert "hunter2" not in repr(primary)
    for bad, message in [
        ({"password_env": "PG1"}, "[primary] lacks 'conninfo'"),
        ({"conninfo": "host=db1", "password": "hunter2"}, "must not hold a password"),
        ({"conninfo": "host=db1 password=hunter2"}, "password"),
        ({"conninfo": "host=db1", "slot": "x"}, "[primary] has an unknown key 'slot'"),
    ]:
        conf["primary"] = bad
        with pytest.raises(ConfigurationError, match=re.escape(message)) as info:
            pgsnap.Cluster.from_config(conf)
        assert "hunter2" not in str(info.value) + str(info.value.hint)


def test_the_mocks_volumes_are_the_volume_tables(tmp_path: Path) -> None:
    """Issue 20: volumes are declared once. The mock's volumes are the ``[[volume]]``
    tables (directories at their mount points) unless ``[storage.options]`` names
    them itself, as before (kept: a state file's paths must still match)."""
    wal = tmp_path / "wal"
    wal.mkdir()
    data = tmp_path / "data"
    tables = (
        f'[[volume]]\nid = "vol-data"\nname = "pgdata"\nrole = "data"\nmount_point = "{data}"\n\n'
        f'[[volume]]\nid = "vol-wal"\nname = "pgwal"\nrole = "wal"\nmount_point = "{wal}"\n'
    )
    cluster = pgsnap.Cluster.from_config(write_config(tmp_path, volumes=tables))
    found = {v.id: (v.name, v.path) for v in cluster.backend.list_volumes()}
    assert found == {"vol-data": ("pgdata", str(data)), "vol-wal": ("pgwal", str(wal))}

    explicit = tmp_path / "explicit"
    explicit.mkdir()
    given = f'volumes = [{{ id = "vol-data", name = "pgdata", path = "{data}" }}]'
    config = write_config(explicit, options=[given], volumes=tables)
    cluster = pgsnap.Cluster.from_config(config)
    assert [v.id for v in cluster.backend.list_volumes()] == ["vol-data"]


def test_a_block_mode_mock_is_not_given_mount_points_as_its_volumes(tmp_path: Path) -> None:
    """In block mode a mock volume's directory is its LUN, never the mount point
    where the host sees it: the tables are not passed."""
    config = write_config(tmp_path, options=["block = true", 'capabilities = ["mapping"]'])
    assert pgsnap.Cluster.from_config(config).backend.list_volumes() == ()


def test_copies_have_their_own_retention_section(tmp_path: Path) -> None:
    """``[copies.retention]``: the snapshots' keys plus yearly and max_age, durations
    written as text; absent, copy retention deletes nothing (None)."""
    import datetime as dt

    from pgsnap.config import load_copy_retention
    from pgsnap.planner.copy_expiry import CopyRetentionPolicy

    conf = _mapping(write_config(tmp_path))
    assert load_copy_retention(conf) is None
    assert pgsnap.Cluster.from_config(conf).copy_retention is None
    conf["retention"] = {"redundancy": 3}  # the snapshots' policy is not the copies'
    conf["copies"] = {
        "path": str(tmp_path / "copies"),
        "retention": {"daily": 7, "monthly": 12, "yearly": 3, "max_age": "3y", "window": "2w"},
    }
    expected = CopyRetentionPolicy(
        daily=7,
        monthly=12,
        yearly=3,
        max_age=dt.timedelta(days=3 * 365),
        window=dt.timedelta(weeks=2),
    )
    assert load_copy_retention(conf) == expected
    assert pgsnap.Cluster.from_config(conf).copy_retention == expected
    for retention, message in (
        ({"keep_daily": 7}, "did you mean 'daily'?"),
        ({"max_age": "soon"}, "is not a duration"),
        ({"max_age": "-3d"}, "positive duration"),
        ({"daily": True}, "whole number"),
    ):
        conf["copies"] = {"retention": retention}
        with pytest.raises(ConfigurationError) as info:
            pgsnap.Cluster.from_config(conf)
        assert message in str(info.value), (retention, str(info.value))
    conf["copies"] = {"retention": 7}
    with pytest.raises(ConfigurationError, match=r"\[copies.retention\]"):
        load_copy_retention(conf)
