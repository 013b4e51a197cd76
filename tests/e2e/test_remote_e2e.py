"""Backup and point-in-time recovery of a database host reached only over ssh.

The tests start their own sshd on 127.0.0.1 (throwaway host and user keys).
pgsnap's Host is an SshRunner to it: every command, file and process of the
database host (pg_ctl, the server log, postmaster checks, backup_label,
recovery settings, cleaning the restored data directory, the surviving
pg_wal) goes through ssh, and a LocalRunner used for any of it fails the
test. SQL goes over libpq; the storage (the mock, as an array would) and the
catalog and archive are pgsnap's side. Rows are checked in the recovered server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pgsnap.host import CommandResult, Host, LocalRunner
from pgsnap.model import RecoveryTarget, VolumeRole

from .conftest import Env, make_env, pitr_setup

pytestmark = pytest.mark.postgres


class CountingRunner:
    """A Runner that passes everything to another and counts the programs it ran."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.programs: list[str] = []

    @property
    def description(self) -> str:
        return str(self.inner.description)

    @property
    def destination(self) -> str:
        return str(self.inner.destination)

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        self.programs.append(argv[0])
        result: CommandResult = self.inner.run(argv, user=user, stdin=stdin, timeout=timeout)
        return result

    def process_argv(
        self, argv: Sequence[str], *, user: str | None = None
    ) -> tuple[list[str], Mapping[str, str]]:
        """Streams (a copy's tar) go through the inner runner's ssh process too."""
        self.programs.append(argv[0])
        result: tuple[list[str], Mapping[str, str]] = self.inner.process_argv(argv, user=user)
        return result


@pytest.fixture
def remote_env(
    pg_server: Any, sshd_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Any:
    runner = CountingRunner(sshd_server.runner())
    env = make_env(pg_server, host=Host(runner), copy_target=tmp_path / "copies")

    def no_local_commands(self: LocalRunner, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        raise AssertionError(f"the database host was reached locally: {list(argv)}")

    monkeypatch.setattr(LocalRunner, "run", no_local_commands)
    yield env, runner
    env.backend.close()


def test_backup_and_point_in_time_recovery_over_ssh(remote_env: Any) -> None:
    env, runner = remote_env
    assert isinstance(env, Env)
    assert env.cluster.host.description.startswith("ssh ")
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, <target>, batch 3
    backup_commands = len(runner.programs)
    assert backup_commands > 0  # coverage was checked on the host's mounts, over ssh
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA])
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2
    ran = set(runner.programs[backup_commands:])
    pg_ctl = {p for p in ran if p.endswith("/pg_ctl")}
    assert pg_ctl, ran  # the server was stopped and started over ssh
    assert {"sh", "rm", "dd"} <= ran  # files written, removed and read over ssh


def test_complete_recovery_over_ssh_replays_the_surviving_wal(remote_env: Any) -> None:
    env, _ = remote_env
    env.create_table()
    env.write(1)
    env.cluster.backup("remote")
    env.write(2)
    env.switch_wal()
    env.write(3)  # only in pg_wal on the database host
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[VolumeRole.DATA]))
    assert env.batches() == env.expect(1, 2, 3)


def test_a_copy_made_and_restored_over_ssh_recovers_once_the_snapshots_are_gone(
    remote_env: Any,
) -> None:
    """Issue 21: the copy reads the backup's snapshot on the database host through the
    Host seam (tar there, its stream over ssh), and the recovery writes the copy's
    trees and WAL back there the same way."""
    env, runner = remote_env
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, <target>, batch 3
    (record,) = env.cluster.catalog.list()
    runner.programs.clear()
    copy = env.cluster.copy(record.id)
    assert "tar" in runner.programs and copy.wal
    assert record.snapshot_group_id is not None
    env.backend.delete_snapshot_group(record.snapshot_group_id)
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA])
    assert "copy.restore" in [s.action for s in plan.steps]
    runner.programs.clear()
    env.cluster.execute(plan)
    assert runner.programs.count("tar") == 2  # the data tree, then the copy's WAL
    assert env.batches() == env.expect(1, 2)
