"""Benchmark: HTTP requests and wall time of a PowerFlex backup, for K = 2, 8, 32 volumes.

Run::

    python benchmarks/bench_powerflex.py                  # 3.6, 4.5 and 5.0; K = 2, 8, 32; 5 runs
    python benchmarks/bench_powerflex.py --versions 4.5 --volumes 2 8 32 128 --runs 10

Against :class:`~pgsnap.testing.powerflex_sim.PowerFlexSimulator` (HTTP on
127.0.0.1, empty volumes: the copy of a volume's directory is the simulator's
cost, not the array's). For each version and K, a fresh simulator and a fresh
:class:`~pgsnap.backends.powerflex.PowerFlexBackend`; then ``--runs`` times the
storage calls a ``Cluster.backup()`` makes (no PostgreSQL here), each run
with a new backend over the same client (the session is reused; no volume
listing is carried over from one backup to the next): the
observation (``list_volumes``, ``list_snapshots``, ``locate`` and
``restore_profile`` of every volume, ``list_policies``), the snapshot group
(``create_snapshot_group`` of the K volumes) and the catalog's check
(``list_snapshots``). Counted on the simulator's side: every HTTP request by
kind, the snapshot calls (``snapshotVolumes`` / ``createSnapshot``) and the
logins. The first run logs in (and asks the version and the system id); the
others reuse the session.

The issue's expectations, printed as "yes"/"NO", never asserted: one snapshot
call per backup; the other requests the same for every K; one login for all
runs. For comparison, the request count PyPowerFlex's pattern would give (it
logs in and out around every single call: ``/api/login``, ``/api/version``,
``/rest/auth/login``, the call, ``/rest/auth/logout`` on 4.x; powerflex.md) is
derived from the measured calls, not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pgsnap.backends.powerflex import PowerFlexBackend
from pgsnap.testing.powerflex_sim import PowerFlexSimulator


def backup_calls(backend: PowerFlexBackend, vids: list[str], name: str) -> None:
    """The storage calls of one Cluster.backup() (observation, snapshot, catalog check)."""
    backend.list_volumes()
    backend.list_snapshots()
    for vid in vids:
        backend.locate(vid)
        backend.restore_profile(vid)
    backend.list_policies()
    backend.create_snapshot_group(vids, name)
    backend.list_snapshots()


@dataclasses.dataclass
class Result:
    """What one version and K measured."""

    first: int
    later: list[int]
    snap_calls: list[int]
    logins: int
    median_ms: float
    first_ms: float
    kinds: Counter[str]


def measure(version: str, k: int, runs: int) -> Result:
    with PowerFlexSimulator(version=version) as sim:
        vids = [sim.add_volume(f"vol{n:03d}") for n in range(k)]
        user, password = sim.credentials
        first = PowerFlexBackend(sim.url, user, password)
        client = first.client
        per_run: list[int] = []
        kinds: list[Counter[str]] = []
        times: list[float] = []
        snap_calls: list[int] = []
        action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
        for run in range(runs):
            # A backend per backup over the one client (one session): nothing cached from
            # the previous backup but the session and the system id, as hours apart.
            backend = (
                first if run == 0 else PowerFlexBackend(client=client, system_id=first.system_id)
            )
            start = len(sim.requests)
            before = sim.count(action=action)
            t0 = time.perf_counter()
            backup_calls(backend, vids, f"b{run:03d}")
            times.append(time.perf_counter() - t0)
            done = sim.requests[start:]
            per_run.append(len(done))
            snap_calls.append(sim.count(action=action) - before)
            kinds.append(Counter(f"{r.method} {_kind(r.path)}" for r in done))
        client.close()
        return Result(
            first=per_run[0],
            later=per_run[1:],
            snap_calls=snap_calls,
            logins=sim.logins,
            median_ms=statistics.median(times[1:]) * 1000,
            first_ms=times[0] * 1000,
            kinds=kinds[-1],
        )


def _kind(path: str) -> str:
    if "/action/" in path:
        return "action/" + path.rsplit("/action/", 1)[1]
    if "::" in path:
        head, _, tail = path.partition("::")
        rest = tail.split("/", 1)
        return head + "::<id>" + ("/" + rest[1] if len(rest) > 1 else "")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--versions", nargs="+", default=["3.6", "4.5", "5.0"])
    parser.add_argument("--volumes", nargs="+", type=int, default=[2, 8, 32])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2 (the first run logs in)")
    print(f"python {sys.version.split()[0]}; simulator on 127.0.0.1; {args.runs} runs each")
    print()
    header = (
        f"{'version':>7} {'K':>4} {'requests 1st':>12} {'requests later':>15} "
        f"{'snapshot calls':>14} {'logins':>6} {'1st ms':>8} {'median ms':>9} "
        f"{'PPF-style requests':>18}"
    )
    print(header)
    print("-" * len(header))
    verdicts = []
    for version in args.versions:
        rows: dict[int, Result] = {}
        for k in args.volumes:
            m = measure(version, k, args.runs)
            rows[k] = m
            # PyPowerFlex wraps every call: 3.x two extra requests, 4.x/5.x four (derived).
            ppf = m.later[-1] * (5 if version.startswith(("4", "5")) else 3)
            later = "/".join(str(n) for n in sorted(set(m.later)))
            snaps = ",".join(str(n) for n in sorted(set(m.snap_calls)))
            print(
                f"{version:>7} {k:>4} {m.first:>12} {later:>15} {snaps:>14} {m.logins:>6} "
                f"{m.first_ms:>8.1f} {m.median_ms:>9.1f} {ppf:>18}"
            )
        same = len({tuple(r.later) for r in rows.values()}) == 1
        one_snap = all(set(r.snap_calls) == {1} for r in rows.values())
        one_login = all(r.logins == 1 for r in rows.values())
        verdicts.append((version, one_snap, same, one_login))
        kinds = rows[max(rows)].kinds
        print(
            f"        requests of one later backup (K={max(rows)}): "
            + ", ".join(f"{n} x {kind}" for kind, n in sorted(kinds.items()))
        )
    print()
    for version, one_snap, same, one_login in verdicts:
        print(
            f"{version}: one snapshot call per backup: {'yes' if one_snap else 'NO'}; "
            f"other requests independent of K: {'yes' if same else 'NO'}; "
            f"one login reused: {'yes' if one_login else 'NO'}"
        )
    print(
        "(PPF-style: every request wrapped in a login and logout as PyPowerFlex does; "
        "3.x: /api/login and /api/logout around each, 4.x/5.x: four extra; derived)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
