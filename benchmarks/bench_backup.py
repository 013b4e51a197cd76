"""Benchmark: pgsnap backup vs the same backup by hand vs ``pg_basebackup`` vs ``pg_dump``.

Run (as root, like the tests: the server runs as the ``postgres`` OS user)::

    python benchmarks/bench_backup.py                  # pgbench scale 100 (1.5 GB), 3 runs
    python benchmarks/bench_backup.py --scale 20       # a smaller database
    python benchmarks/bench_backup.py --smoke          # scale 1, 1 run: checks the script
    python benchmarks/bench_backup.py --no-fsync       # server with fsync=off: NOT real figures

Target: everything pgsnap's ``Cluster.backup()`` does except the storage
snapshot call itself takes under 0.3 s. Prints the figures and "met" /
"NOT met"; never asserts.

What it does:

1. creates a throwaway PostgreSQL cluster (:class:`~pgsnap.testing.pgserver.PgServer`,
   16 MB WAL segments, WAL in its own directory, archiving by ``cp`` into its own
   archive directory, ``fsync = on`` unless ``--no-fsync``), fills it with
   ``pgbench -i -s SCALE`` and wires pgsnap to it with
   :func:`~pgsnap.testing.sandbox.mock_cluster` (``MockBackend`` directory volumes
   for the data and WAL directories, the archive never snapshotted);
2. measures ``--runs`` rounds; in each round every method once, the order of the
   methods rotated from round to round. Before *every* method alike: a
   ``CHECKPOINT``, then the same pgbench load (``--load`` transactions, so that
   each backup's own checkpoint has about the same dirty data to flush, as on a
   server at work), then a wait until the archiver has nothing left to archive.
   The methods:

   - **pgsnap**: ``Cluster.backup()`` (plan + execute) in a fresh Python process
     that builds the Cluster as the README's example does (``PostgresAdapter``,
     ``MockBackend`` over the mock's state file, ``DirectoryWalArchive``,
     ``DirectoryCatalog``, ``Layout``). The figure is the wall time of the
     ``backup()`` call; the process's wall time (interpreter, imports, the
     Cluster, the backup) and peak RSS (``VmHWM``) are reported too. The
     storage backend's methods are wrapped on the backend object (pgsnap is not
     modified) so that the snapshot call, ``create_snapshot_group``, is timed on
     its own: "without the snapshot call" subtracts that call and nothing else
     (the catalog writes around it stay counted). The adapter, archive and
     catalog are wrapped in a timing proxy too, for the per-step breakdown. The
     mock's snapshot is a copy of the data and WAL directories in Python,
     without fsync; the copies are deleted after the run (not timed);
   - **by hand**: what a user scripting the same backup does, in one ``psql``
     session (non-exclusive backup mode lives in the session):
     ``pg_backup_start(label, fast => true)``, ``\\!`` a shell that copies the data
     and WAL directories with ``cp -a`` (no fsync; the "snapshot" of this method,
     timed by the shell), then ``pg_backup_stop(wait_for_archive => true)`` (on
     PostgreSQL 12-14: ``pg_start_backup(label, true, false)`` and
     ``pg_stop_backup(false, true)``) and its ``labelfile`` written to a file;
   - **pg_basebackup** ``-D DIR -c fast -X stream`` (plain format): a copy of the
     data directory plus the WAL streamed during it, fsynced at the end (its
     default), and the same with ``--no-sync``;
   - **pg_dump -Fc** (a logical dump; fsynced, its default).

   The client programs run through GNU time (``/usr/bin/time -f %M``) for their
   peak RSS (the largest of the process tree);
3. prints every run, then per method the median, min and max of the wall time,
   of the wall time without the snapshot / copy, of the process wall time and of
   the peak RSS, with what each method writes, whether it fsyncs and whether it
   waits until its WAL is archived; then pgsnap's breakdown (plan, steps,
   executor bookkeeping, storage calls, calls inside each step), how long after
   the backup session's stop the stop segment and the ``.backup`` file reached
   the archive, and the target line.

Everything it creates is removed at the end, also on failure. It refuses to start
when ``--dir`` has less free space than the run needs (8 GB at scale 100,
proportionally less for smaller scales, at least 1 GB).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import table

from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

TARGET_OVERHEAD_SECONDS = 0.3
"""Cluster.backup() without the storage snapshot call should stay under this."""

GB = 1000**3
MB = 1000**2
FREE_BYTES_AT_SCALE_100 = 8 * GB
"""Free space demanded at scale 100: database, its WAL and archive, a snapshot copy or
a base backup, with a margin. Scaled linearly for other scales (at least 1 GB)."""

SNAPSHOT_CALL = "backend.create_snapshot_group"
TIMING_RE = re.compile(r"^Time: ([0-9.]+) ms", re.MULTILINE)

METHODS: dict[str, tuple[str, str, str]] = {
    # name: (what it writes, fsync of what it writes, waits until its WAL is archived)
    "pgsnap": (
        "mock snapshot: Python copy of the data + WAL dirs; catalog record, journal",
        "copy: no; catalog and journal: yes",
        "yes (polls the archive)",
    ),
    "by hand": (
        "cp -a of the data + WAL dirs; the backup label",
        "no",
        "yes (pg_backup_stop waits)",
    ),
    "pg_basebackup": (
        "copy of the data dir + the WAL streamed during it",
        "yes (at the end)",
        "no (WAL streamed into the backup)",
    ),
    "pg_basebackup --no-sync": (
        "copy of the data dir + the WAL streamed during it",
        "no",
        "no (WAL streamed into the backup)",
    ),
    "pg_dump -Fc": ("a compressed logical dump", "yes (at the end)", "no WAL"),
}


# --------------------------------------------------------------------------- call timing


class CallLog:
    """The calls made while pgsnap works, by step (the step comes from the events)."""

    def __init__(self) -> None:
        self.step = "plan"
        self.calls: list[tuple[str, str, float]] = []
        self.steps: dict[str, float] = {}
        self.returned_at: dict[str, float] = {}
        """Wall-clock time (``time.time()``) at which each call name last returned."""
        self.echo = False

    def add(self, name: str, seconds: float) -> None:
        self.calls.append((self.step, name, seconds))
        self.returned_at[name] = time.time()

    def on_event(self, event: Any) -> None:
        from pgsnap.executor import EventKind  # noqa: PLC0415

        if self.echo:
            print(f"  {event}", file=sys.stderr, flush=True)
        if event.kind is EventKind.STARTED:
            self.step = event.step_id
        elif event.kind is EventKind.FINISHED:
            self.step = f"after {event.step_id}"
            if event.seconds is not None:
                self.steps[event.step_id] = float(event.seconds)


class Timed:
    """A transparent proxy that times every method call of ``target`` into ``log``.

    ``wrap`` names methods whose result is itself proxied (the backup session).
    """

    def __init__(
        self, target: object, prefix: str, log: CallLog, wrap: dict[str, str] | None = None
    ) -> None:
        self._target = target
        self._prefix = prefix
        self._log = log
        self._wrap = wrap or {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = attr(*args, **kwargs)
            finally:
                self._log.add(f"{self._prefix}.{name}", time.perf_counter() - t0)
            if name in self._wrap:
                return Timed(result, self._wrap[name], self._log)
            return result

        return timed


def time_methods(obj: object, names: Sequence[str], prefix: str, log: CallLog) -> None:
    """Replace each method ``names`` of ``obj`` by a timed wrapper, on the object itself."""
    for name in names:
        method = getattr(obj, name, None)
        if not callable(method):
            continue

        def timed(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _m(*args, **kwargs)
            finally:
                log.add(f"{prefix}.{_n}", time.perf_counter() - t0)

        setattr(obj, name, timed)


# --------------------------------------------------------------------------- child: pgsnap


def _vm_hwm_kb() -> int | None:
    """This process image's peak RSS (``VmHWM``); an exec does not inherit it."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One pgsnap backup in this fresh process, the Cluster built as in the README."""
    t0 = time.perf_counter()
    from pgsnap import Cluster, Layout, Volume, VolumeRole  # noqa: PLC0415
    from pgsnap.adapters.postgres import PostgresAdapter  # noqa: PLC0415
    from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
    from pgsnap.catalog import DirectoryCatalog  # noqa: PLC0415
    from pgsnap.operations.catalog import required_wal_files  # noqa: PLC0415
    from pgsnap.protocols import (  # noqa: PLC0415
        STORAGE_BACKEND_METHODS,
        Catalog,
        DatabaseAdapter,
        WalArchive,
    )
    from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

    import_seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    c = spec["cluster"]
    cluster = Cluster(
        adapter=PostgresAdapter(
            c["conninfo"],
            data_directory=c["data_directory"],
            bindir=c["bindir"],
            os_user=c["os_user"],
            log_file=c["log_file"],
        ),
        backend=MockBackend(
            root=c["snapshots"],
            state_file=c["state_file"],
            volumes=[{"id": v[0], "name": v[1], "path": v[3]} for v in c["volumes"]],
        ),
        archive=DirectoryWalArchive(c["archive"]),
        catalog=DirectoryCatalog(c["catalog"]),
        layout=Layout(tuple(Volume(v[0], v[1], VolumeRole(v[2]), v[3]) for v in c["volumes"])),
        journal_dir=c["journal"],
    )
    build_seconds = time.perf_counter() - t1

    log = CallLog()
    log.echo = bool(spec.get("verbose"))
    backend = cluster.backend
    time_methods(backend, STORAGE_BACKEND_METHODS, "backend", log)
    cluster.adapter = cast(
        DatabaseAdapter, Timed(cluster.adapter, "adapter", log, {"backup_session": "session"})
    )
    cluster.archive = cast(WalArchive, Timed(cluster.archive, "archive", log))
    cluster.catalog = cast(Catalog, Timed(cluster.catalog, "catalog", log))
    split: dict[str, float] = {}

    def timed_call(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                split[name] = time.perf_counter() - start

        return call

    # Cluster.backup() calls self.plan_backup and self.execute: instance attributes win.
    cluster.plan_backup = timed_call("plan_backup", cluster.plan_backup)  # type: ignore[method-assign]
    cluster.execute = timed_call("execute", cluster.execute)  # type: ignore[method-assign]
    cluster.on_event = log.on_event

    psycopg_import = time_psycopg_import()
    t2 = time.perf_counter()
    record = cluster.backup(spec["label"])
    backup_seconds = time.perf_counter() - t2

    log.step = "after"
    lag: dict[str, float] = {}
    stopped_at = log.returned_at.get("session.stop")
    if stopped_at is not None and record.stop_lsn is not None:
        for name in filter(None, required_wal_files(record)):
            with contextlib.suppress(FileNotFoundError):
                lag[name] = (Path(c["archive"]) / name).stat().st_mtime - stopped_at
    return {
        "backup_seconds": backup_seconds,
        "import_seconds": import_seconds,
        "build_seconds": build_seconds,
        "plan_seconds": split.get("plan_backup"),
        "execute_seconds": split.get("execute"),
        "steps": log.steps,
        "calls": log.calls,
        "backup_mode_seconds": record.backup_mode_seconds,
        "record_total_seconds": record.total_seconds,
        "group_id": record.snapshot_group_id,
        "archive_lag": lag,
        "psycopg_import": sum(psycopg_import) if psycopg_import else None,
        "hwm_kb": _vm_hwm_kb(),
    }


# --------------------------------------------------------------------------- helpers


def tree_bytes(path: Path) -> int:
    """Apparent size of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def gnu_time() -> str | None:
    return "/usr/bin/time" if Path("/usr/bin/time").is_file() else shutil.which("time")


def run_measured(
    argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 7200
) -> tuple[float, float | None, str]:
    """Run ``argv`` (through GNU time when present): wall seconds, peak RSS (MB), stdout.

    Raises with the output on failure.
    """
    timer = gnu_time()
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss_file:
        full = [timer, "-f", "%M", "-o", rss_file.name, *argv] if timer else list(argv)
        t0 = time.perf_counter()
        proc = subprocess.run(
            full, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
        took = time.perf_counter() - t0
        lines = rss_file.read().strip().splitlines()
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    rss = int(lines[-1]) * 1024 / MB if lines and lines[-1].isdigit() else None
    return took, rss, proc.stdout


def time_psycopg_import() -> list[float]:
    """Time the import of psycopg, which pgsnap makes at its first connection.

    ``pgsnap.adapters._lazy`` imports it with ``importlib.import_module``: that
    function is wrapped (in this process only); the list fills when it happens.
    """
    import importlib  # noqa: PLC0415

    spent: list[float] = []
    original = importlib.import_module

    def import_module(name: str, package: str | None = None) -> Any:
        if not name.startswith("psycopg") or "psycopg" in sys.modules:
            return original(name, package)
        t0 = time.perf_counter()
        try:
            return original(name, package)
        finally:
            spent.append(time.perf_counter() - t0)

    importlib.import_module = import_module
    return spent


def client_args(server: PgServer) -> list[str]:
    return ["-h", str(server.socket_dir), "-p", str(server.port), "-U", "postgres"]


def pg_env(server: PgServer) -> dict[str, str]:
    return {
        **os.environ,
        "PGHOST": str(server.socket_dir),
        "PGPORT": str(server.port),
        "PGUSER": "postgres",
        "PGDATABASE": "postgres",
    }


def stats(values: Sequence[float | None], digits: int = 3) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    med = f"{statistics.median(vals):.{digits}f}"
    if len(vals) == 1:
        return med
    return f"{med} ({min(vals):.{digits}f} .. {max(vals):.{digits}f})"


# --------------------------------------------------------------------------- methods


class Bench:
    """The server, the pgsnap wiring and the scratch directory; runs each method."""

    def __init__(self, server: PgServer, out: Path, args: argparse.Namespace) -> None:
        from pgsnap.backends.mock import MockBackend  # noqa: PLC0415
        from pgsnap.testing.sandbox import mock_cluster  # noqa: PLC0415

        self.server = server
        self.out = out
        self.args = args
        cluster = mock_cluster(server)  # adds the volumes to the mock's state file
        self.backend = cast(MockBackend, cluster.backend)
        self.spec = {
            "conninfo": server.conninfo(),
            "data_directory": str(server.data_dir),
            "bindir": str(server.bindir),
            "os_user": server.os_user,
            "log_file": str(server.log_file),
            "snapshots": str(server.base_dir / "snapshots"),
            "state_file": str(server.base_dir / "mock.json"),
            "volumes": [
                [v.id, v.name, v.role.value, v.mount_point] for v in cluster.layout.volumes
            ],
            "archive": str(server.archive_dir),
            "catalog": str(server.base_dir / "catalog"),
            "journal": str(server.base_dir / "journal"),
        }
        check = cluster.check()
        self.check_text = "" if check.ok else check.explain()

    def prepare(self) -> float:
        """Before every method alike: CHECKPOINT, the pgbench load, the archiver idle."""
        t0 = time.perf_counter()
        self.server.sql("CHECKPOINT")
        if self.args.load:
            per_client = max(1, self.args.load // 2)
            run_measured(
                [
                    str(self.server.bindir / "pgbench"),
                    "-n",
                    "-c",
                    "2",
                    "-j",
                    "2",
                    "-t",
                    str(per_client),
                ],
                env=pg_env(self.server),
            )
        self.server.wait_for_archive_idle(timeout=900)
        return time.perf_counter() - t0

    def measure(self, method: str, n: int) -> dict[str, Any]:
        return {
            "pgsnap": self.pgsnap,
            "by hand": self.by_hand,
            "pg_basebackup": lambda n: self.basebackup(n, sync=True),
            "pg_basebackup --no-sync": lambda n: self.basebackup(n, sync=False),
            "pg_dump -Fc": self.dump,
        }[method](n)

    def pgsnap(self, n: int) -> dict[str, Any]:
        spec = {"cluster": self.spec, "label": f"bench {n}", "verbose": self.args.verbose}
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        process_wall = time.perf_counter() - t0
        if self.args.verbose or proc.returncode != 0:
            print(proc.stderr, file=sys.stderr, end="", flush=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the pgsnap process failed ({proc.returncode})")
        rep = json.loads(proc.stdout.strip().splitlines()[-1])
        snap_calls = [s for _step, name, s in rep["calls"] if name == SNAPSHOT_CALL]
        size = 0
        if rep["group_id"]:
            for snap in self.backend.get_snapshot_group(rep["group_id"]).snapshots:
                if snap.extra.get("path"):
                    size += tree_bytes(Path(str(snap.extra["path"])))
            self.backend.delete_snapshot_group(rep["group_id"])  # frees the disk; not timed
        return {
            "wall": rep["backup_seconds"],
            "snapshot": sum(snap_calls),
            "process_wall": process_wall,
            "rss_mb": rep["hwm_kb"] * 1024 / MB if rep["hwm_kb"] else None,
            "bytes": size,
            "report": rep,
        }

    def by_hand(self, n: int) -> dict[str, Any]:
        server = self.server
        target = self.out / f"by-hand-{n}"
        target.mkdir()
        stamps = target / "stamps"
        script = target / "copy.sh"
        script.write_text(
            "set -e\n"
            f"date +%s.%N > {stamps}\n"
            f"cp -a {server.data_dir} {target / 'data'}\n"
            f"cp -a {server.wal_dir} {target / 'wal'}\n"
            f"date +%s.%N >> {stamps}\n"
        )
        label = f"bench by hand {n}"
        if server.major >= 15:
            start = f"SELECT pg_backup_start('{label}', fast => true);"
            stop = "SELECT labelfile FROM pg_backup_stop(wait_for_archive => true)"
        else:
            start = f"SELECT pg_start_backup('{label}', true, false);"
            stop = "SELECT labelfile FROM pg_stop_backup(false, true)"
        sql = (
            "\\set ON_ERROR_STOP on\n"
            "\\timing on\n"
            f"{start}\n"
            f"\\! sh {script}\n"
            f"{stop} \\g (format=unaligned tuples_only=on) {target / 'backup_label'}\n"
        )
        (target / "backup.sql").write_text(sql)
        try:
            took, rss, stdout = run_measured(
                [str(server.bindir / "psql"), "-X", "-q", "-f", str(target / "backup.sql")],
                env=pg_env(server),
            )
            t_copy_start, t_copy_end = (float(x) for x in stamps.read_text().split())
            timings = [float(m) / 1000 for m in TIMING_RE.findall(stdout)]
            size = tree_bytes(target / "data") + tree_bytes(target / "wal")
            label_ok = "START WAL LOCATION" in (target / "backup_label").read_text()
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return {
            "wall": took,
            "snapshot": t_copy_end - t_copy_start,
            "process_wall": took,
            "rss_mb": rss,
            "bytes": size,
            "start_seconds": timings[0] if timings else None,
            "stop_seconds": timings[1] if len(timings) > 1 else None,
            "label_ok": label_ok,
        }

    def basebackup(self, n: int, *, sync: bool) -> dict[str, Any]:
        target = self.out / f"basebackup-{n}"
        argv = [
            str(self.server.bindir / "pg_basebackup"),
            *client_args(self.server),
            "-D",
            str(target),
            "-c",
            "fast",
            "-X",
            "stream",
        ]
        if not sync:
            argv.append("--no-sync")
        try:
            took, rss, _ = run_measured(argv)
            size = tree_bytes(target)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return {"wall": took, "process_wall": took, "rss_mb": rss, "bytes": size}

    def dump(self, n: int) -> dict[str, Any]:
        target = self.out / f"dump-{n}.pgdump"
        argv = [str(self.server.bindir / "pg_dump"), *client_args(self.server), "-Fc"]
        try:
            took, rss, _ = run_measured([*argv, "-f", str(target), "postgres"])
            size = target.stat().st_size
        finally:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
        return {"wall": took, "process_wall": took, "rss_mb": rss, "bytes": size}


# --------------------------------------------------------------------------- report


def one_line(method: str, r: dict[str, Any]) -> str:
    text = f"{method} {r['wall']:.3f} s"
    if method == "pgsnap":
        rep = r["report"]
        steps = ", ".join(f"{s} {v:.3f}" for s, v in rep["steps"].items())
        text += (
            f" (plan {rep['plan_seconds']:.3f} incl. psycopg import "
            f"{rep['psycopg_import'] or 0:.3f}; {steps}; snapshot call {r['snapshot']:.3f}; "
            f"process {r['process_wall']:.2f} s, {r['rss_mb']:.0f} MB)"
        )
    elif method == "by hand":
        text += (
            f" (start {r['start_seconds']:.3f}, cp {r['snapshot']:.3f}, "
            f"stop+wait {r['stop_seconds']:.3f}; {r['rss_mb'] or 0:.0f} MB)"
        )
    else:
        text += f" ({r['rss_mb'] or 0:.0f} MB)"
    return text


def report(
    say: Callable[[str], None], results: dict[str, list[dict[str, Any]]], fsync: bool
) -> None:
    runs = max(len(v) for v in results.values())
    say("")
    say(f"== Results: {runs} run(s) of each method; median (min .. max) ==")
    say("")
    say(
        table(
            [[m, *METHODS[m]] for m in results],
            ["method", "what it writes", "fsync of what it writes", "waits for its WAL archived"],
        )
    )
    say("")
    rows = []
    for method, rs in results.items():
        has_snap = all("snapshot" in r for r in rs)
        rows.append(
            [
                method,
                stats([r["wall"] for r in rs]),
                stats([r["wall"] - r["snapshot"] for r in rs]) if has_snap else "-",
                stats([r["snapshot"] for r in rs]) if has_snap else "-",
                stats([r["process_wall"] for r in rs]),
                stats([r["rss_mb"] for r in rs], 0),
                f"{statistics.median([r['bytes'] for r in rs]) / MB:.0f}",
            ]
        )
    say(
        table(
            rows,
            [
                "method",
                "wall (s)",
                "wall without the snapshot/copy (s)",
                "snapshot/copy (s)",
                "process wall (s)",
                "peak RSS (MB)",
                "output (MB)",
            ],
        )
    )
    say("")
    say(
        "wall: pgsnap = the Cluster.backup() call (plan + execute); the others = the process. "
        "snapshot/copy: pgsnap = the backend's create_snapshot_group call alone; by hand = "
        "the cp -a of the data and WAL dirs. process wall: launch to exit (pgsnap: Python "
        "start, imports, the Cluster, the backup). peak RSS: pgsnap = VmHWM of its process; "
        "the others = GNU time's maximum RSS of the process tree."
    )
    if not fsync:
        say("")
        say("!!! fsync=off on the server: these are NOT the figures of a real server !!!")

    pg = results.get("pgsnap")
    if pg:
        report_pgsnap(say, pg)
    hand = results.get("by hand")
    if hand:
        say("")
        say(
            "by hand, inside psql (\\timing): pg_backup_start "
            f"{stats([r['start_seconds'] for r in hand])} s, pg_backup_stop with the wait for "
            f"the archive {stats([r['stop_seconds'] for r in hand])} s; backup label written: "
            f"{all(r['label_ok'] for r in hand)}"
        )
    if pg:
        over = [r["wall"] - r["snapshot"] for r in pg]
        worst = max(over)
        verdict = "met" if worst < TARGET_OVERHEAD_SECONDS else "NOT met"
        n_over = sum(1 for v in over if v >= TARGET_OVERHEAD_SECONDS)
        say("")
        say(
            "pgsnap overhead = Cluster.backup() minus the storage snapshot call = "
            f"{stats(over)} s (target < {TARGET_OVERHEAD_SECONDS} s): {verdict}"
            + (f" ({n_over} of {len(over)} runs over)" if n_over else f" (all {len(over)} runs)")
        )
        warm = [r["wall"] - r["snapshot"] - (r["report"]["psycopg_import"] or 0.0) for r in pg]
        say(
            "  the same without importing psycopg (as in a process that has connected before): "
            f"{stats(warm)} s"
        )


def report_pgsnap(say: Callable[[str], None], pg: list[dict[str, Any]]) -> None:
    reps = [r["report"] for r in pg]
    say("")
    say("pgsnap breakdown (median (min .. max) over the runs):")
    rows = [
        ["Cluster.backup()", stats([r["wall"] for r in pg], 4)],
        ["  plan_backup (observe + preflight)", stats([p["plan_seconds"] for p in reps], 4)],
        [
            "    of which importing psycopg (at the first connection)",
            stats([p["psycopg_import"] for p in reps], 4),
        ],
        ["  execute", stats([p["execute_seconds"] for p in reps], 4)],
    ]
    for step in reps[0]["steps"]:
        rows.append([f"    step {step}", stats([p["steps"].get(step) for p in reps], 4)])
    rows.append(
        [
            "    executor outside the steps (journal, freshness, events)",
            stats([p["execute_seconds"] - sum(p["steps"].values()) for p in reps], 4),
        ]
    )
    rows.append(
        [
            "  after execute (catalog.get of the record)",
            stats(
                [
                    r["wall"] - r["report"]["plan_seconds"] - r["report"]["execute_seconds"]
                    for r in pg
                ],
                4,
            ),
        ]
    )
    rows.append(
        ["storage snapshot call (create_snapshot_group)", stats([r["snapshot"] for r in pg], 4)]
    )
    rows.append(
        [
            "snapshot step minus the snapshot call (catalog writes, locate)",
            stats(
                [
                    p["steps"].get("snapshot", 0.0) - r["snapshot"]
                    for p, r in zip(reps, pg, strict=True)
                ],
                4,
            ),
        ]
    )
    rows.append(
        [
            "time in backup mode (record.backup_mode_seconds)",
            stats([p["backup_mode_seconds"] for p in reps], 4),
        ]
    )
    rows.append(["process: imports", stats([p["import_seconds"] for p in reps], 4)])
    rows.append(["process: building the Cluster", stats([p["build_seconds"] for p in reps], 4)])
    say(table(rows, ["part", "seconds"]))

    say("")
    say("calls inside each step (run 1; every storage call, adapter/archive/catalog proxied):")
    totals: dict[tuple[str, str], list[float]] = {}
    for step, name, secs in reps[0]["calls"]:
        totals.setdefault((step, name), []).append(secs)
    say(
        table(
            [[s, n, str(len(v)), f"{sum(v):.4f}"] for (s, n), v in totals.items()],
            ["step", "call", "count", "seconds"],
        )
    )
    rates = [r["bytes"] / MB / r["snapshot"] for r in pg if r["snapshot"] > 0]
    if rates:
        say("")
        say(
            f"mock snapshot = Python copy of {pg[0]['bytes'] / MB:.0f} MB without fsync: "
            f"{stats(rates, 0)} MB/s (linear in size; a storage snapshot is not)"
        )
    lags = [p["archive_lag"] for p in reps if p["archive_lag"]]
    if lags:
        names = list(lags[0])
        say("")
        say(
            "after the backup session's stop returned: "
            + "; ".join(
                f"{name} in the archive {stats([lag.get(name) for lag in lags])} s later"
                for name in names
            )
            + f"; wait-wal step {stats([p['steps'].get('wait-wal') for p in reps])} s"
        )


# --------------------------------------------------------------------------- main


@contextlib.contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgsnap-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def required_bytes(scale: int) -> int:
    return max(GB, FREE_BYTES_AT_SCALE_100 * scale // 100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=100, help="pgbench scale (default 100)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each method (default 3)")
    parser.add_argument(
        "--load",
        type=int,
        default=2000,
        help="pgbench transactions before every method, after a CHECKPOINT (default 2000; 0: none)",
    )
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated subset of: {', '.join(METHODS)}",
    )
    parser.add_argument("--bindir", help="PostgreSQL bin directory (default: found)")
    parser.add_argument("--dir", default="/tmp", help="parent of the scratch directories")
    parser.add_argument(
        "--no-fsync", action="store_true", help="run the server with fsync=off (not real figures)"
    )
    parser.add_argument("--smoke", action="store_true", help="scale 1, 1 run, load 200")
    parser.add_argument("-v", "--verbose", action="store_true", help="print pgsnap's events")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.smoke:
        args.scale, args.runs, args.load = 1, 1, 200
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if args.scale < 1 or args.runs < 1 or args.load < 0:
        parser.error("--scale and --runs must be >= 1, --load >= 0")
    fsync = not args.no_fsync

    def say(msg: str) -> None:
        print(msg, flush=True)

    parent = Path(args.dir)
    free = shutil.disk_usage(parent).free
    need = required_bytes(args.scale)
    if free < need:
        say(
            f"refusing to run: {free / GB:.1f} GB free on {parent}, the run needs "
            f"{need / GB:.1f} GB (database + WAL + archive + a snapshot copy or base backup); "
            "free some space or pass --dir on a larger file system"
        )
        return 2
    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir()
    for tool in ("pgbench", "pg_basebackup", "pg_dump", "psql"):
        if not (bindir / tool).is_file():
            say(f"{bindir / tool} not found: install the PostgreSQL client programs")
            return 2
    say(
        f"bench_backup: {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
        f"{os.getloadavg()[0]:.2f}; {free / GB:.0f} GB free on {parent}"
    )
    if not fsync:
        say("!!! --no-fsync: the server runs with fsync=off; the figures are NOT real ones !!!")
    server = PgServer.create(
        bindir,
        wal_segsize_mb=16,
        separate_wal_dir=True,
        archive=True,
        settings={"fsync": fsync},
        parent_dir=parent,
    )
    try:
        with scratch_dir(parent) as out:
            server.start()
            say(
                f"PostgreSQL {server.major} ({server.version_num}) in {server.base_dir}, "
                f"16 MB WAL segments, archive by cp, fsync={'on' if fsync else 'OFF'}"
            )
            t_init, _, _ = run_measured(
                [str(bindir / "pgbench"), "-i", "-q", "-s", str(args.scale)], env=pg_env(server)
            )
            server.switch_wal_and_wait_archived(timeout=900)
            server.wait_for_archive_idle(timeout=900)
            db_size = int(server.sql("SELECT pg_database_size('postgres')")[0][0])
            say(
                f"pgbench -i -s {args.scale}: {t_init:.1f} s; database {db_size / MB:.0f} MB, "
                f"data dir {tree_bytes(server.data_dir) / MB:.0f} MB, "
                f"pg_wal {tree_bytes(server.wal_dir) / MB:.0f} MB, "
                f"archive {tree_bytes(server.archive_dir) / MB:.0f} MB"
            )
            bench = Bench(server, out, args)
            if bench.check_text:
                say(bench.check_text)
                return 1
            say(
                f"before every method: CHECKPOINT, pgbench -n -c 2 -t {max(1, args.load // 2)} "
                f"({args.load} transactions), archiver idle"
                if args.load
                else "before every method: CHECKPOINT, archiver idle (no load)"
            )
            results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            for n in range(args.runs):
                order = methods[n % len(methods) :] + methods[: n % len(methods)]
                say(f"run {n + 1}: order {', '.join(order)}")
                for method in order:
                    prep = bench.prepare()
                    r = bench.measure(method, n + 1)
                    results[method].append(r)
                    say(f"  {one_line(method, r)}  [prepared in {prep:.1f} s]")
            report(say, results, fsync)
            say(
                f"(this harness process, which does not run pgsnap's backups: peak RSS "
                f"{(_vm_hwm_kb() or 0) * 1024 / MB:.0f} MB)"
            )
    finally:
        server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
