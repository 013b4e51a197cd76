"""The ``pgsnap`` command against a real PostgreSQL, configured by a TOML file.

Each test creates a throwaway cluster (1 MB WAL segments, ``pg_wal`` in its own
directory, archiving into ``archive/``) and a configuration that uses the mock
backend with a ``state_file`` and directory volumes for the data, WAL and
archive directories. Every ``main([...])`` call builds its Cluster and its
MockBackend anew from the file, as separate ``pgsnap`` processes would, so
what one command did reaches the next only through the catalog and the mock's
state file. One command is also run in a real separate process.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pgsnap

from .conftest import CliEnv, backed_up, finding_codes, write_config

pytestmark = pytest.mark.postgres

# --------------------------------------------------------------------------- tests


def test_check(cli_env: CliEnv) -> None:
    env = cli_env
    # A fresh cluster: nothing archived yet, no checksums; warnings only, so exit 0.
    report = env.run_json("check")
    assert report["ok"] is True
    assert report["archiver_healthy"] is True
    assert finding_codes(report) == {"archiving": "warning", "data_checksums": "warning"}
    assert report["wal"] == ["no WAL archived yet"]
    assert report["backups"] == []
    code, out, _ = env.run("check")
    assert code == 0
    assert out.startswith("pgsnap check: OK")

    env.server.switch_wal_and_wait_archived()
    report = env.run_json("check")
    assert finding_codes(report) == {"data_checksums": "warning"}
    assert report["wal"][0].startswith("timeline 1: ") and report["wal"][0].endswith("no gaps")

    # A layout that forgets the WAL volume: pg_wal is covered by no volume -> exit 4,
    # and a backup with it is refused (3) before anything is snapshotted.
    broken = write_config(env.server, env.work, name="broken.toml", wal=False)
    code, out, _ = env.run("check", config=broken)
    assert code == 4
    assert out.startswith("pgsnap check: PROBLEMS FOUND")
    code, out, _ = env.run("check", "--json", config=broken)
    report = json.loads(out)
    assert code == 4
    assert report["ok"] is False
    assert finding_codes(report) == {"coverage": "error", "data_checksums": "warning"}
    assert any("no WAL volume" in f for f in report["findings"])
    code, _, err = env.run("backup", config=broken)
    assert code == 3
    assert "pgsnap: refused: the cluster cannot be backed up" in err
    assert "[coverage]" in err
    assert env.snapshot_ids() == set()
    assert env.run_json("list") == []


def test_backup_plan_and_recover_to_a_time(cli_env: CliEnv) -> None:
    env = cli_env
    env.write(0)
    before_backup = env.now()
    record = backed_up(env)
    assert set(record["snapshots"]) == {"vol-data", "vol-wal"}  # the archive is not snapshotted
    # The snapshots live in the mock's state file: a new backend (another process) sees them.
    assert env.snapshot_ids() == set(record["snapshots"].values())
    src = str(Path(pgsnap.__file__).resolve().parent.parent)
    proc = subprocess.run(
        [sys.executable, "-m", "pgsnap.cli", "list", "-c", str(env.config), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [b["id"] for b in json.loads(proc.stdout)] == [record["id"]]

    env.write(2)
    target = env.now()
    env.write(3)
    env.server.switch_wal_and_wait_archived()

    # wal --json: one timeline, one range from (at most) the backup's start segment, no gap.
    report = env.run_json("wal")
    assert report["archive"] == str(env.server.archive_dir)
    assert report["segment_size"] == 1024 * 1024
    (tli,) = report["timelines"]
    assert (tli["timeline"], tli["parent"], tli["gaps"]) == (1, None, [])
    ((first, last),) = tli["ranges"]
    start_segment = record["labelfile"].split("(file ", 1)[1].split(")", 1)[0]
    assert first <= start_segment < last

    # wal --index: the WAL a recovery from the backup reads, indexed once.
    indexed = env.run_json("wal", "--index")
    assert indexed["backup_id"] == record["id"] and indexed["added"] >= 1, indexed
    code, out, err = env.run("wal", "--index")
    assert code == 0 and out.startswith("WAL index: 0 segment(s) indexed now"), (out, err)
    assert "WAL indexed to" in err  # progress on stderr

    # A time after the backup: a plan (exit 0) that restores the data volume only.
    plan = env.run_json("plan-recovery", "--time", target.isoformat())
    assert plan["kind"] == "recovery"
    step_ids = [s["id"] for s in plan["steps"]]
    assert "restore-vol-data" in step_ids
    assert "restore-vol-wal" not in step_ids
    assert step_ids[-1] == "clear-recovery-settings"
    assert plan["request"]["target"]["kind"] == "time"
    code, out, _ = env.run("plan-recovery", "--time", target.isoformat())
    assert code == 0
    assert out.startswith("Recovery plan ")

    # A time before the backup: refused (3), naming the earliest reachable point.
    code, out, err = env.run("plan-recovery", "--time", before_backup.isoformat())
    assert code == 3
    assert out == ""
    assert err.startswith("pgsnap: refused: no backup can reach target time")
    assert f"the earliest reachable point is {record['stop_lsn']} / " in err
    assert record["id"] in err

    # The server crashes and the data volume is lost.
    env.crash_and_lose(env.server.data_dir)
    state_before = env.state_file.read_bytes()
    snaps_before = env.snapshot_ids()
    journals_before = env.journals()

    # recover without --yes and without a terminal: refused (2), nothing touched -
    # even with "yes" waiting on stdin.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdin", io.StringIO("yes\n"))
        code, out, err = env.run("recover", "--time", target.isoformat())
    assert code == 2
    assert out.startswith("Recovery plan ")  # the plan is shown first
    assert "refusing to recover without confirmation: pass --yes" in err
    assert list(env.server.data_dir.iterdir()) == []
    assert not env.server.is_running()
    assert env.state_file.read_bytes() == state_before
    assert env.snapshot_ids() == snaps_before
    assert env.journals() == journals_before  # only the backup's

    # recover --yes: batches 1 and 2 come back, batch 3 (after the target) does not.
    code, out, err = env.run("recover", "--yes", "--time", target.isoformat())
    assert code == 0, err
    assert "recovery finished in " in out
    assert "[12/12] finished" in err
    # Issue 19: where it got to, the last transaction, and where the server log is.
    assert "server promoted on timeline 2, replayed to " in out
    assert "last transaction replayed: transaction " in out  # stopped at the time target
    assert f"server log: {env.server.log_file}" in out
    assert not env.server.sql("SELECT pg_is_in_recovery()")[0][0]
    assert env.batches() == {0: 3, 1: 3, 2: 3}
    assert env.timeline() == 2
    # The safety snapshot of the (empty) data volume was kept, in the state file too.
    assert len(env.snapshot_ids() - snaps_before) == 1
    # The recovered cluster is checked clean and can be backed up again.
    code, _, err = env.run("check")
    assert code == 0, err
    code, _, err = env.run("backup")
    assert code == 0, err
    assert [b["state"] for b in env.run_json("list")] == ["done", "done"]


def test_recover_to_an_lsn_with_the_wal_volume_lost_too(cli_env: CliEnv) -> None:
    env = cli_env
    record = backed_up(env)
    env.write(2)
    lsn = str(env.server.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    env.write(3)
    env.server.switch_wal_and_wait_archived()
    env.crash_and_lose(env.server.data_dir, env.server.wal_dir)

    code, out, err = env.run("recover", "--yes", "--lsn", lsn, "--wal-lost")
    assert code == 0, err
    assert f"from snapshot {record['snapshots']['vol-wal']}" in out  # WAL volume restored too
    assert env.batches() == {1: 3, 2: 3}
    assert env.timeline() == 2
    assert any(name.startswith("recovery-") for name in env.journals())


# --------------------------------------------------------------------------- issue 7
#
# check must not say OK when a recovery is at risk (item 11), and every finding has
# the documented exit code, 4; the waits are options (item 10); extreme targets end
# with a message and an exit code (item 8).


def variant(env: CliEnv, name: str, **replace: str) -> Path:
    """A copy of the configuration with some ``key = "value"`` lines' values replaced."""
    lines = []
    section = ""
    for line in env.config.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        key = line.split(" = ", 1)[0]
        new = replace.get(f"{section}.{key}")
        lines.append(line if new is None else f'{key} = "{new}"')
    path = env.work / name
    path.write_text("\n".join(lines) + "\n")
    return path


def check_report(env: CliEnv, config: Path | None = None) -> tuple[int, dict[str, Any], str]:
    """``check --json`` and ``check``: (exit code of both, the JSON report, the text)."""
    code, out, err = env.run("check", "--json", config=config)
    report = json.loads(out)
    text_code, text, _ = env.run("check", config=config)
    assert text_code == code
    assert "Traceback" not in err
    return code, report, text


def test_check_finds_an_archive_that_is_not_where_archive_command_writes(
    cli_env: CliEnv,
) -> None:
    env = cli_env
    record = backed_up(env)
    elsewhere = env.work / "elsewhere"
    elsewhere.mkdir()
    config = variant(env, "elsewhere.toml", **{"archive.path": str(elsewhere)})
    code, report, text = check_report(env, config)
    assert code == 4
    assert text.startswith("pgsnap check: PROBLEMS FOUND")
    codes = finding_codes(report)
    assert codes["archive_mismatch"] == "error"
    assert codes["backup_wal"] == "error"  # the DONE backup's WAL is not there
    (mismatch,) = [f for f in report["findings"] if f.endswith("[archive_mismatch]")]
    assert f"the archive {elsewhere} lacks it" in mismatch
    assert str(env.server.archive_dir) in mismatch  # archive_command names where it writes
    assert any(record["id"] in f for f in report["findings"] if f.endswith("[backup_wal]"))
    # The real archive: all is well.
    code, report, _ = check_report(env)
    assert code == 0, report
    assert "archive_mismatch" not in finding_codes(report)


def test_check_finds_a_missing_archive_directory(cli_env: CliEnv) -> None:
    env = cli_env
    backed_up(env)
    config = variant(env, "gone.toml", **{"archive.path": str(env.work / "gone")})
    code, report, _ = check_report(env, config)
    assert code == 4  # a blocking finding, not "failed" (1)
    codes = finding_codes(report)
    assert codes["archive"] == "error"
    assert codes["data_checksums"] == "warning"  # the preflight still ran
    assert any(f"{env.work / 'gone'} does not exist" in f for f in report["findings"])
    assert report["backups"] and report["archiver_healthy"] is True


def test_check_finds_a_segment_missing_after_the_only_backup(cli_env: CliEnv) -> None:
    env = cli_env
    backed_up(env)
    env.write(2)
    missing = env.server.switch_wal_and_wait_archived()
    env.write(3)
    env.server.switch_wal_and_wait_archived()
    (env.server.archive_dir / missing).unlink()
    code, report, text = check_report(env)
    assert code == 4, report
    assert finding_codes(report)["wal_gap"] == "error"
    (gap,) = [f for f in report["findings"] if f.endswith("[wal_gap]")]
    assert missing in gap
    assert "every later transaction is lost" in gap
    assert f"gaps: {missing}" in text


def test_check_list_and_plan_recovery_name_an_unreadable_catalog_record(
    cli_env: CliEnv,
) -> None:
    env = cli_env
    record = backed_up(env)
    path = env.work / "catalog" / f"{record['id']}.json"
    doc = json.loads(path.read_text())
    doc["start_lsn"] = "garbage"
    path.write_text(json.dumps(doc))

    code, report, text = check_report(env)
    assert code == 4
    assert finding_codes(report)["catalog"] == "error"
    assert any(str(path) in f and "malformed LSN 'garbage'" in f for f in report["findings"])
    assert report["unreadable"] == [
        {"path": str(path), "backup_id": record["id"], "error": "malformed LSN 'garbage'"}
    ]
    assert "Backups: none" not in text
    assert f"UNREADABLE {path}: malformed LSN 'garbage'" in text

    code, out, err = env.run("list")
    assert code == 0
    assert f"UNREADABLE {path}: malformed LSN 'garbage'" in out

    code, out, err = env.run("plan-recovery")
    assert code == 3  # refused: no readable backup; not "malformed LSN" (2) without a file
    assert f"pgsnap: warning: catalog file {path} is unreadable: malformed LSN 'garbage'" in err
    assert "pgsnap: refused: " in err


def test_check_finds_an_os_user_that_does_not_exist(cli_env: CliEnv) -> None:
    env = cli_env
    config = variant(env, "nouser.toml", **{"database.os_user": "nosuchuser"})
    code, report, _ = check_report(env, config)
    assert code == 4
    assert finding_codes(report)["os_user"] == "error"
    (finding,) = [f for f in report["findings"] if f.endswith("[os_user]")]
    assert "'nosuchuser' does not exist" in finding
    assert repr(env.server.os_user) in finding  # the owner, to set instead


def test_check_of_a_stopped_server_is_a_finding(cli_env: CliEnv) -> None:
    env = cli_env
    record = backed_up(env)
    env.server.stop()
    code, report, _ = check_report(env)
    assert code == 4  # the docs promise 4 for a blocking finding, not 1
    assert finding_codes(report) == {"server": "error", "backup_not_drilled": "warning"}
    assert "the server is not running" in report["findings"][0]
    assert report["archiver_healthy"] is None
    assert report["backups"][0].startswith(record["id"])  # the rest is still reported
    assert report["wal"][0].startswith("timeline 1: ")


def test_waits_are_options_of_the_config_and_the_command_line(cli_env: CliEnv) -> None:
    env = cli_env
    backed_up(env)
    config = env.work / "timeouts.toml"
    config.write_text(
        env.config.read_text()
        + "\n[timeouts]\nserver = 300\nrecovery = 900\nwal = 45\nconnect = 5\n"
    )

    def params(plan: dict[str, Any]) -> dict[str, Any]:
        return {s["id"]: s["params"] for s in plan["steps"]}

    code, out, err = env.run("plan-recovery", "--json", config=config)
    assert code == 0, err
    steps = params(json.loads(out))
    assert steps["stop-server"]["timeout"] == 300
    assert steps["start-server"]["timeout"] == 300
    assert steps["wait-recovery"]["timeout"] == 900
    code, out, err = env.run(
        "plan-recovery",
        "--json",
        "--server-timeout",
        "450",
        "--recovery-timeout",
        "30",
        config=config,
    )
    assert code == 0, err
    steps = params(json.loads(out))
    assert (steps["stop-server"]["timeout"], steps["wait-recovery"]["timeout"]) == (450, 30)

    code, out, err = env.run("backup", "--dry-run", "--json", config=config)
    assert code == 0, err
    assert params(json.loads(out))["wait-wal"]["timeout"] == 45
    code, out, err = env.run("backup", "--dry-run", "--json", "--wal-timeout", "7", config=config)
    assert params(json.loads(out))["wait-wal"]["timeout"] == 7


def test_extreme_targets_are_refused_with_a_message(cli_env: CliEnv) -> None:
    env = cli_env
    backed_up(env)
    for argv, expected in (
        (("--lsn", "FFFFFFFF/FFFFFFFF"), 3),
        (("--time", "9999-12-31 23:59:59.999999-12:00"), 2),
        (("--time", "9999-12-31 23:59:59.999999+00:00"), 3),
        (("--xid", "4294967295"), 3),
    ):
        code, out, err = env.run("plan-recovery", *argv)
        assert code == expected, (argv, err)
        assert out == ""
        assert err.startswith("pgsnap: ")
        assert "Traceback" not in err
        assert "18446744073709551616" not in err


def test_retention_commands(cli_env: CliEnv) -> None:
    """Issue 13: pin, expire --dry-run, expire, delete and unpin through the command."""
    env = cli_env
    ids = []
    for batch in (1, 2, 3):
        env.write(batch)
        code, out, err = env.run("backup", "--label", f"b{batch}")
        assert code == 0, err
        ids.append(out.split()[1])
    code, out, err = env.run("pin", ids[0], "--reason", "audit 2026")
    assert code == 0, err
    code, out, _ = env.run("list")
    assert "[pinned forever: audit 2026]" in out
    # The mock says what its snapshots take: several backups of a small cluster share
    # their unchanged files, so they take less than the copies they hold.
    m = re.search(
        r"mock storage: its snapshots take ([\d.]+) (\w+) on disk for ([\d.]+) (\w+)", out
    )
    assert m, out
    units = {"B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}
    on_disk, files = (float(m[1]) * units[m[2]], float(m[3]) * units[m[4]])
    assert 0 < on_disk < files

    code, out, err = env.run("expire", "--redundancy", "1", "--dry-run")
    assert code == 0, err
    assert f"backup {ids[1]}" in out and "Steps:" in out  # b2 would go; b1 is pinned
    assert [b["id"] for b in env.run_json("list")] == ids  # dry run: nothing deleted

    code, out, err = env.run("expire", "--redundancy", "1")
    assert code == 0, err
    assert [b["id"] for b in env.run_json("list")] == [ids[0], ids[2]]

    code, _out, err = env.run("delete", ids[0])
    assert code != 0 and "pinned" in err  # refused, with the reason
    code, out, err = env.run("unpin", ids[0])
    assert code == 0, err
    code, out, err = env.run("delete", ids[0])
    assert code == 0, err
    assert [b["id"] for b in env.run_json("list")] == [ids[2]]

    code, _out, err = env.run("expire")
    assert code != 0 and "keeps nothing" in err  # no policy anywhere: refused
    code, _out, err = env.run("expire", "--window", "soon")
    assert code != 0 and "not a duration" in err


def test_check_warns_of_a_snapshot_limit_and_list_shows_what_expire_removes(
    cli_env: CliEnv,
) -> None:
    """Issue 13: a V-Tree-like limit (the mock's snapshot_limit) in ``check``, and
    ``list`` with a ``[retention]`` policy showing which backups go next and why."""
    env = cli_env
    text = env.config.read_text().replace(
        "[storage.options]\n", "[storage.options]\nsnapshot_limit = 3\nlimit_warn_percent = 60\n"
    )
    config = env.work / "limited.toml"
    config.write_text(text + "\n[retention]\nredundancy = 2\n")
    ids = []
    for batch in (1, 2):
        env.write(batch)
        code, out, err = env.run("backup", config=config)
        assert code == 0, err
        ids.append(out.split()[1])
    code, report, text = check_report(env, config)
    assert code == 0 and report["ok"] is True  # a warning: backups still work
    assert finding_codes(report)["snapshot_limit"] == "warning"
    assert {p["volume_id"] for p in report["storage_problems"]} == {"vol-data", "vol-wal"}
    assert {p["severity"] for p in report["storage_problems"]} == {"warning"}
    assert "2 of the 3 snapshots" in text and "[snapshot_limit]" in text
    env.write(3)
    code, out, err = env.run("backup", config=config)
    assert code == 0, err
    ids.append(out.split()[1])
    code, report, _ = check_report(env, config)
    assert code == 4 and finding_codes(report)["snapshot_limit"] == "error"
    code, _, err = env.run("backup", config=config)  # what check announced
    assert code == 1 and "limit" in err and "Traceback" not in err

    # list: the configured policy says what the next expire removes, and why.
    code, out, err = env.run(
        "pin", ids[1], "--reason", "old audit", "--until", "2000-01-01T00:00:00+00:00"
    )
    assert code == 0, err
    code, out, err = env.run("list", config=config)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        f"retention policy: redundancy 2; the next `pgsnap expire` removes 1 backup(s): {ids[0]}"
    )
    (first,) = [line for line in lines if line.startswith(ids[0])]
    assert first.endswith("[next expire removes it: beyond redundancy 2]")
    (second,) = [line for line in lines if line.startswith(ids[1])]
    assert "[pin expired 2000-01-01T00:00:00+00:00: old audit]" in second
    assert "next expire" not in second
    # Flags win over the configuration; JSON carries the same, per record.
    docs = env.run_json("list", "-c", str(config), "--redundancy", "1")
    retention = {d["id"]: d["retention"] for d in docs if d["state"] == "done"}
    assert [bid for bid, r in retention.items() if r["removed_by_next_expire"]] == ids[:2]
    assert retention[ids[0]]["reasons"] == ["beyond redundancy 1"]
    assert retention[ids[2]]["reasons"] == ["within redundancy 1"]
    assert retention[ids[2]]["policy"] == "redundancy 1"
    # Without a policy, list reads only the catalog, as before.
    assert "retention" not in env.run_json("list")[0]
    code, out, _ = env.run("list")
    assert code == 0 and "retention policy" not in out and "next expire" not in out

    # Expiring with the configured policy makes room: 2 of 3 left, a warning again.
    code, out, err = env.run("expire", config=config)
    assert code == 0, err
    code, report, _ = check_report(env, config)
    assert code == 0 and finding_codes(report)["snapshot_limit"] == "warning"
    code, out, err = env.run("backup", config=config)  # the third of 3: taken
    assert code == 0, err
    assert check_report(env, config)[0] == 4  # at the limit now
    code, out, err = env.run("expire", "--redundancy", "1", config=config)
    assert code == 0, err
    code, report, _ = check_report(env, config)
    assert "snapshot_limit" not in finding_codes(report), report["findings"]


def test_rebuild_catalog_and_orphans_after_through_the_command(cli_env: CliEnv) -> None:
    """Issue 13 §3: `pgsnap rebuild-catalog` and `pgsnap expire --orphans-after`."""
    env = cli_env
    env.write(1)
    code, out, err = env.run("backup")
    assert code == 0, err
    bid = out.split()[1]
    code, out, err = env.run("rebuild-catalog", "--dry-run")
    assert code == 0, err
    assert "would rebuild 0 record(s)" in out and bid in out  # already in the catalog
    code, out, err = env.run("expire", "--redundancy", "1", "--orphans-after", "10min")
    assert code != 0 and "orphans_after must be at least 1h" in err
    code, out, err = env.run("expire", "--redundancy", "1", "--orphans-after", "1d", "--dry-run")
    assert code == 0, err
    assert "orphans after 1d" in out
    code, out, err = env.run("rebuild-catalog", "--log-timezone", "Not/AZone")
    assert code != 0 and "log_timezone" in err


def test_a_cluster_from_a_mapping_backs_up_what_the_command_then_lists(cli_env: CliEnv) -> None:
    """Issue 20: ``pgsnap.Cluster.from_config`` takes the file's content as a mapping
    (a notebook's dict) and builds the same cluster the command does, on a real server."""
    import tomllib

    conf = tomllib.loads(cli_env.config.read_text())
    cluster = pgsnap.Cluster.from_config(conf, base=cli_env.config.parent)
    cli_env.write(1)
    events: list[Any] = []
    record = cluster.backup(label="from a mapping", on_event=events.append)
    assert [e.index for e in events if e.kind.value == "finished"] == list(range(1, 8))
    with pytest.raises(pgsnap.InputError, match="is a delete plan, not a backup"):
        cluster.backup_of(cluster.plan_delete(record.id))
    code, out, err = cli_env.run("list", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert [b["id"] for b in listed] == [record.id]
    assert listed[0]["label"] == "from a mapping"


def test_progress_goes_to_stderr_as_lines_as_json_events_or_not_at_all(cli_env: CliEnv) -> None:
    """Issue 26: a backup's progress, as a product embedding the command reads it
    (``--json-events``: one object per line), as a log reads it (a line per step), or
    silenced (``--quiet``); the result on stdout is the same each time."""
    env = cli_env
    env.write(1)
    code, out, err = env.run("backup", "--json-events", "--label", "j")
    assert code == 0, err
    events = [json.loads(line) for line in err.splitlines()]
    assert events and {"started", "finished"} <= {e["kind"] for e in events}
    assert all(e["total"] == events[0]["total"] and e["step"] for e in events)
    starts = [e["step"] for e in events if e["kind"] == "started"]
    assert starts == [e["step"] for e in events if e["kind"] == "finished"]
    assert out.startswith("backup ")

    code, out, err = env.run("backup", "--quiet", "--label", "q")
    assert code == 0 and err == "" and out.startswith("backup ")

    code, out, err = env.run("backup", "--label", "l")  # not a terminal: lines
    assert code == 0 and out.startswith("backup ")
    assert all(re.match(r"\[\d+/\d+\] \w+", line) for line in err.splitlines()), err


def test_the_timeline_command_and_a_plans_page(cli_env: CliEnv) -> None:
    """Issue 26: `pgsnap timeline` says what is recoverable as text, JSON, SVG and a page,
    and `plan-recovery --html` writes the plan with the picture and its target marked."""
    env = cli_env
    first = backed_up(env)
    env.write(2)
    env.server.switch_wal_and_wait_archived()
    code, out, err = env.run("timeline")
    assert code == 0, err
    assert out.startswith("timeline 1: ") and f"{first['id']}" in out
    view = env.run_json("timeline")
    assert [lane["timeline"] for lane in view["lanes"]] == [1]
    (mark,) = view["backups"]
    assert mark["id"] == first["id"] and mark["recoverable_to"] is not None
    svg, page = env.work / "t.svg", env.work / "t.html"
    code, _out, err = env.run("timeline", "--svg", str(svg), "--html", str(page))
    assert code == 0 and f"wrote {svg}" in err
    assert svg.read_text().startswith("<svg") and "<svg" in page.read_text()
    plan_page = env.work / "plan.html"
    code, out, err = env.run("plan-recovery", "--html", str(plan_page))
    assert code == 0, err
    text = plan_page.read_text()
    assert "Recovery plan" in text and "<svg" in text and 'class="target' in text
    assert f'data-id="{first["id"]}"' in text
    code, _out, err = env.run("timeline", "--svg", "/nonexistent/dir/t.svg")
    assert code == 2 and "cannot write /nonexistent/dir/t.svg" in err
