"""The fleet's expiry forecast agrees with the expiry planner (issue 25).

``PostgresCatalog.expirable(policy)`` answers in one SQL query what retention would
delete in every cluster of a shared catalog. The truth is the planner's
(``plan_expiry``), so each example writes random histories of two or three clusters
into a real catalog database, with random pins (forever, lapsed, holding), copies,
FAILED and unfinished backups and ties in time, and checks, cluster by cluster, that
the query names exactly the backups the plan deletes (``action="backup"``) and those
whose snapshots alone it deletes because copies keep the record
(``action="snapshots"``), given that the storage holds every snapshot the records name.
"""

from __future__ import annotations

import datetime as dt
import itertools

import attrs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgsnap.catalog.postgres import PostgresCatalog, migrate
from pgsnap.model import BackupRecord, BackupState, CopyRecord, Pin
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_expiry
from pgsnap.protocols import Capability
from pgsnap.testing.pgserver import PgServer
from pgsnap.wal import ArchiveIndex, TimelineGraph
from tests.property.test_expiry_properties import (
    END1,
    END2,
    FORK,
    HISTORY,
    MB,
    T0,
    _backup,
    _names,
    _snapshots,
)

pytestmark = pytest.mark.postgres

_schemas = itertools.count()

PINS = st.sampled_from(["none", "none", "forever", "lapsed", "holds"])

backups = st.lists(
    st.tuples(
        st.integers(1, END2 - 2),  # segment the backup starts in
        st.sampled_from(
            [BackupState.DONE] * 5
            + [BackupState.FAILED, BackupState.STARTED, BackupState.WAITING_FOR_WAL]
        ),
        PINS,
        st.booleans(),  # has a copy
        st.integers(0, 20),  # its time slot (7 h each): equal slots make ties in time
    ),
    min_size=0,
    max_size=10,
    unique_by=lambda t: t[0],
)


@st.composite
def policies(draw: st.DrawFn) -> RetentionPolicy:
    redundancy = draw(st.none() | st.integers(1, 4))
    window = draw(st.none() | st.integers(1, 120).map(lambda h: dt.timedelta(hours=h)))
    levels = [draw(st.integers(0, n)) for n in (3, 3, 2, 2)]
    if redundancy is None and window is None and not any(levels):
        redundancy = 1  # a policy that keeps nothing is refused
    hourly, daily, weekly, monthly = levels
    return RetentionPolicy(
        redundancy=redundancy,
        window=window,
        hourly=hourly,
        daily=daily,
        weekly=weekly,
        monthly=monthly,
    )


def _record(cluster: int, i: int, entry: tuple[int, BackupState, str, bool, int], now: dt.datetime):
    seg, state, pin, copied, slot = entry
    b = _backup(i, seg, state, pinned=False)
    # Spread over days and weeks so that the levels pick among many periods, with
    # ties in time (equal slots): the window's anchor, the newest DONE backup against
    # a FAILED one and the order of the newest N are then decided by the id.
    when = T0 + dt.timedelta(hours=slot * 7)
    pins = {
        "none": None,
        "forever": Pin("audit"),
        "lapsed": Pin("was kept", until=now - dt.timedelta(hours=1)),
        "holds": Pin("kept a while", until=now + dt.timedelta(hours=1)),
    }
    copies = (CopyRecord(f"{b.id}.1", "/copies", "ab" * 32, when),) if copied else ()
    return attrs.evolve(
        b,
        id=f"c{cluster}-{b.id}",
        start_time=when,
        stop_time=when + dt.timedelta(seconds=1),
        pin=pins[pin],
        copies=copies,
    )


def _planned(records: tuple[BackupRecord, ...], policy: RetentionPolicy, now: dt.datetime):
    """What the expiry planner deletes: {id: "backup" | "snapshots"}."""
    facts = ExpiryFacts(
        backups=records,
        snapshots=_snapshots(records, set()),
        archive=ArchiveIndex.build([*_names([(1, 0, END1), (2, FORK, END2)])], MB),
        timelines=TimelineGraph.from_histories([HISTORY]),
        now=now,
        capabilities=frozenset(Capability),
    )
    plan = plan_expiry(facts, policy)
    ids = {s.id for s in plan.steps}
    out: dict[str, str] = {}
    for b in records:
        if f"delete-record-{b.id}" in ids:
            out[b.id] = "backup"
        elif f"delete-snapshots-{b.id}" in ids:
            out[b.id] = "snapshots"
    return out, plan


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@example(  # ties in time: the window's anchor and its equal, a FAILED and a DONE backup
    fleet=[
        [
            (10, BackupState.DONE, "none", False, 5),
            (11, BackupState.DONE, "none", False, 5),
            (12, BackupState.DONE, "none", False, 10),
            (13, BackupState.FAILED, "none", False, 10),
            (14, BackupState.DONE, "none", True, 1),
        ]
    ],
    policy=RetentionPolicy(window=dt.timedelta(hours=10)),
    now_hours=45,
)
@given(
    fleet=st.lists(backups, min_size=1, max_size=3),
    policy=policies(),
    now_hours=st.integers(0, 20 * 7 + 300),
)
def test_the_forecast_names_what_the_planner_deletes(
    catalog_server: PgServer, fleet, policy, now_hours
) -> None:
    now = T0 + dt.timedelta(hours=now_hours)
    schema = f"fx{next(_schemas)}"
    migrate(catalog_server.conninfo(), schema=schema)
    catalogs = []
    expected: dict[tuple[str, str], str] = {}
    plans = []
    for c, entries in enumerate(fleet):
        records = tuple(_record(c, i, e, now) for i, e in enumerate(entries))
        catalog = PostgresCatalog(catalog_server.conninfo(), f"db{c}", schema=schema)
        catalog.cluster_id()  # a cluster with no backups is still in the fleet
        for r in records:
            catalog.put(r)
        catalogs.append(catalog)
        planned, plan = _planned(records, policy, now)
        plans.append(plan)
        expected |= {(f"db{c}", bid): action for bid, action in planned.items()}
    try:
        got = catalogs[0].expirable(policy, now=now)
        found = {(f.cluster, f.backup_id): f.action for f in got}
        assert found == expected, "\n\n".join(p.explain() for p in plans)
        # One cluster's own forecast is its part of the fleet's.
        own = catalogs[0].expirable(policy, now=now, every_cluster=False)
        assert {(f.cluster, f.backup_id): f.action for f in own} == {
            k: v for k, v in expected.items() if k[0] == "db0"
        }
        # Oldest first within a cluster, and every row says why.
        for _cluster, rows in itertools.groupby(got, key=lambda f: f.cluster):
            times = [(f.consistent_at, f.backup_id) for f in rows]
            assert times == sorted(times)
        assert all(f.reason for f in got)
    finally:
        for catalog in catalogs:
            catalog.close()
