"""Benchmark: the catalog in PostgreSQL at fleet scale (issue 25).

Run (as root, like the tests: the catalog's server runs as the ``postgres`` OS user)::

    python benchmarks/bench_catalog.py                     # 1,000 clusters x 1,000 backups
    python benchmarks/bench_catalog.py --clusters 100 --backups 100 --runs 3   # smoke, ~30 s

Targets (issue 25): the fleet's queries at 1,000 clusters and 1,000,000 backup records
fast enough for a monitoring check (under 1 s each): every cluster's newest DONE backup
and last drill (``PostgresCatalog.fleet()``), the clusters whose newest backup is older
than a limit (``stale()``), one cluster's newest backup (``newest()``, what backup
planning asks), the backups a retention policy would expire in every cluster
(``expirable()``: a steady state where 10 of each cluster's go, and a first expiry
where most go); and reading one cluster's whole catalog of 10,000 records
(``list()``, what recovery and expiry planning read) within the directory catalog's
figure for the same records (``DirectoryCatalog.list()``, whose target is 0.3 s).
Prints every run, the median, and "met" / "NOT met"; never asserts.

The data: a throwaway PostgreSQL 15 server (``PgServer``, fsync on), the schema made by
``migrate``, ``--clusters`` clusters of ``--backups`` DONE backup records each (the
records as pgsnap writes them, loaded with ``COPY``), a drill record for every other
cluster, and one more cluster ("big") with ``--big`` records, also written to a
``DirectoryCatalog`` in a scratch directory (fsynced writes, as ``Cluster.backup``
makes them). Each measurement is a fresh ``PostgresCatalog`` (its first query opens
the connection: included) in this process, the order rotated from run to run.
Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import git_commit, table, uncommitted

from pgsnap.catalog import DirectoryCatalog
from pgsnap.catalog.postgres import PostgresCatalog, migrate
from pgsnap.model import to_dict
from pgsnap.planner.expiry import RetentionPolicy
from pgsnap.testing.catalog_conformance import backup_record, drill_record
from pgsnap.testing.pgserver import PgServer, find_postgres_bindir

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _load(server: PgServer, clusters: int, backups: int, say: Callable[[str], None]) -> None:
    """COPY ``clusters`` x ``backups`` records (and drills) into the migrated schema."""
    started = time.perf_counter()
    template = to_dict(backup_record("template"))
    with server.connect() as conn:
        with conn.cursor().copy("COPY pgsnap.clusters (name) FROM STDIN") as copy:
            for c in range(clusters):
                copy.write_row((f"db{c:05d}",))
        ids = dict(conn.execute("SELECT name, id FROM pgsnap.clusters").fetchall())
        sql = (
            "COPY pgsnap.backups (cluster_id, id, system_identifier, state, timeline,"
            " start_time, consistent_at, record) FROM STDIN"
        )
        with conn.cursor().copy(sql) as copy:
            for c in range(clusters):
                cid = ids[f"db{c:05d}"]
                sysid = f"73{c:017d}"
                for b in range(backups):
                    start = T0 + dt.timedelta(hours=b, minutes=c % 60)
                    bid = f"{start:%Y%m%dT%H%M%S}000Z"
                    stop = start + dt.timedelta(seconds=2)
                    times = {"start_time": start.isoformat(), "stop_time": stop.isoformat()}
                    doc = dict(template, id=bid, system_identifier=sysid, **times)
                    copy.write_row((cid, bid, sysid, "done", 1, start, stop, json.dumps(doc)))
        with conn.cursor().copy(
            "COPY pgsnap.named_records (cluster_id, kind, name, sort_time, backup_id, record)"
            " FROM STDIN"
        ) as copy:
            for c in range(0, clusters, 2):
                d = drill_record(f"d{c}", "b-1", minutes=c)
                copy.write_row((ids[f"db{c:05d}"], "drill", d.id, d.started_at, d.backup_id,
                                json.dumps(to_dict(d))))  # fmt: skip
        conn.execute("VACUUM ANALYZE")
    size = server.sql("SELECT pg_size_pretty(pg_database_size(current_database()))")[0][0]
    say(
        f"loaded {clusters} clusters x {backups} backups = {clusters * backups:,} records "
        f"(+ {(clusters + 1) // 2} drills) in {time.perf_counter() - started:.0f} s; "
        f"database {size}"
    )


def _big(server: PgServer, scratch: Path, n: int, say: Callable[[str], None]) -> None:
    """One cluster of ``n`` records, in the PostgreSQL catalog and a directory catalog."""
    started = time.perf_counter()
    pg = PostgresCatalog(server.conninfo(), "big")
    directory = DirectoryCatalog(scratch / "big")
    for b in range(n):
        start = T0 + dt.timedelta(hours=b)
        record = backup_record(f"{start:%Y%m%dT%H%M%S}000Z", start_time=start,
                               stop_time=start + dt.timedelta(seconds=2))  # fmt: skip
        pg.put(record)
        directory.put(record)
    pg.close()
    say(f"cluster 'big': {n:,} records in both catalogs in {time.perf_counter() - started:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--backups", type=int, default=1000, help="per cluster (default 1000)")
    parser.add_argument("--big", type=int, default=10_000, help="records of cluster 'big'")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default="/var/tmp", help="scratch area (default /var/tmp)")
    parser.add_argument("--bindir", help="PostgreSQL 15 binaries (default: as the tests find)")
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, flush=True)

    bindir = Path(args.bindir) if args.bindir else find_postgres_bindir(15)
    need = args.clusters * args.backups * 3000 + 2 * 10**9
    if shutil.disk_usage(args.dir).free < need:
        say(f"refusing to run: {args.dir} has less than {need / 1e9:.1f} GB free")
        return 2
    changed = uncommitted("pgsnap")
    say(
        f"bench_catalog: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
        f"commit {git_commit()} (uncommitted in pgsnap/: {', '.join(changed) or 'none'}); "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    scratch = Path(tempfile.mkdtemp(prefix="pgsnap-bench-catalog-", dir=args.dir))
    scratch.chmod(0o711)  # the server's OS user goes through it to its own directory
    server = PgServer.create(bindir, archive=False, parent_dir=scratch,
                             settings={"fsync": True, "shared_buffers": "256MB"})  # fmt: skip
    try:
        server.start()
        say(f"catalog server: PostgreSQL {server.version_num}, fsync on, in {scratch}")
        migrate(server.conninfo())
        _load(server, args.clusters, args.backups, say)
        _big(server, scratch, args.big, say)
        conninfo = server.conninfo()
        some = f"db{args.clusters // 2:05d}"
        limit = dt.timedelta(minutes=30)  # about half the clusters are staler than that
        now = T0 + dt.timedelta(hours=args.backups)
        methods: dict[str, Callable[[], Any]] = {
            "fleet(): newest backup and last drill of every cluster": lambda: PostgresCatalog(
                conninfo, some
            ).fleet(),
            "stale(): clusters whose newest backup is older than a limit": lambda: PostgresCatalog(
                conninfo, some
            ).stale(limit, now=now),
            "newest(): one cluster's newest DONE backup": lambda: PostgresCatalog(
                conninfo, some
            ).newest(),
            f"list(): one cluster's {args.backups:,} records": lambda: PostgresCatalog(
                conninfo, some
            ).list(),
            f"list(): cluster 'big', {args.big:,} records, PostgresCatalog": lambda: (
                PostgresCatalog(conninfo, "big").list()
            ),
            f"list(): cluster 'big', {args.big:,} records, DirectoryCatalog": lambda: (
                DirectoryCatalog(scratch / "big").list()
            ),
            "expirable(): steady state, 10 of each cluster's backups go": lambda: PostgresCatalog(
                conninfo, some
            ).expirable(RetentionPolicy(redundancy=max(1, args.backups - 10)), now=now),
            "expirable(): a first expiry, redundancy 100 and a 30-day window": lambda: (
                PostgresCatalog(conninfo, some).expirable(
                    RetentionPolicy(redundancy=100, window=dt.timedelta(days=30)), now=now
                )
            ),
        }
        counts: dict[str, int] = {}
        times: dict[str, list[float]] = {m: [] for m in methods}
        names = list(methods)
        for r in range(args.runs):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                t0 = time.perf_counter()
                result = methods[name]()
                times[name].append(time.perf_counter() - t0)
                counts[name] = 1 if result is None or hasattr(result, "id") else len(result)
            say(f"run {r + 1}: " + ", ".join(f"{times[n][-1]:.3f}" for n in names))
        rows = []
        for name in names:
            v = times[name]
            rows.append([name, f"{counts[name]:,}", f"{statistics.median(v):.3f}",
                         f"{min(v):.3f} .. {max(v):.3f}"])  # fmt: skip
        say("\n" + table(rows, ["query", "rows", "median s", "min .. max s"]))
        med = {n: statistics.median(v) for n, v in times.items()}
        for name in names[:3]:
            say(
                f"{name}: {med[name]:.3f} s (target < 1 s): {'met' if med[name] < 1 else 'NOT met'}"
            )
        for name in names[6:]:
            say(
                f"{name}: {med[name]:.3f} s (target < 1 s): {'met' if med[name] < 1 else 'NOT met'}"
            )
        pg_big, dir_big = med[names[4]], med[names[5]]
        say(
            f"list() of {args.big:,} records: PostgresCatalog {pg_big:.3f} s, DirectoryCatalog "
            f"{dir_big:.3f} s ({pg_big / dir_big:.2f}x; target: within the directory "
            f"catalog's 0.3 s): {'met' if pg_big < 0.3 else 'NOT met'}"
        )
    finally:
        server.cleanup()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
