"""What the next expiry does to each backup, as listings show it (issue 13 §4)."""

from __future__ import annotations

import datetime as dt

import attrs

from pgsnap.cluster import BackupList
from pgsnap.model import BackupState, Pin
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_expiry
from pgsnap.planner.forecast import BackupOutlook, expiry_forecast, retention_notes
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph
from tests.property.test_expiry_properties import END1, MB, T0, _backup, _names, _snapshots

NOW = T0 + dt.timedelta(days=10)
DONE = BackupState.DONE


def _facts(backups, snapshots=None) -> ExpiryFacts:
    return ExpiryFacts(
        backups=tuple(backups),
        snapshots=_snapshots(backups, set()) if snapshots is None else snapshots,
        archive=ArchiveIndex.build(_names([(1, 0, END1)]), MB),
        timelines=TimelineGraph.from_histories([]),
        now=NOW,
        capabilities=frozenset(Capability),
    )


def test_the_forecast_is_the_expiry_plan_read_per_backup() -> None:
    a, b, c, d = (_backup(i, seg, DONE, False) for i, seg in enumerate((5, 10, 20, 40)))
    a = attrs.evolve(a, pin=Pin("audit", until=NOW + dt.timedelta(days=30)))
    facts = _facts([a, b, c, d])
    policy = RetentionPolicy(redundancy=2)
    forecast = expiry_forecast(facts, policy)
    plan = plan_expiry(facts, policy)
    deleted = {s.params["backup_id"] for s in plan.steps if s.action == "catalog.delete_backup"}
    assert set(forecast.removed) == deleted == {b.id}
    assert forecast.removed == (b.id,)
    assert forecast.policy == "redundancy 2" and forecast.now == NOW
    gone = forecast.backups[b.id]
    assert gone.removed and gone.reasons == ("beyond redundancy 2",)
    kept = forecast.backups[a.id]
    assert not kept.removed and kept.reasons[0].startswith("pinned until")
    assert forecast.backups[d.id].reasons == ("within redundancy 2",)
    # Nothing is secure here.
    assert not any(o.secure for o in forecast.backups.values())


def test_secure_snapshots_and_vanished_ones_are_told() -> None:
    a, b, c = (_backup(i, seg, DONE, False) for i, seg in enumerate((5, 20, 40)))
    until = NOW + dt.timedelta(days=3)
    snaps = tuple(
        attrs.evolve(s, extra={"secure_until": until.isoformat()}) if s.secure else s
        for s in _snapshots([a, b, c], {a.id})
        if not s.id.startswith(c.id)  # c's snapshots vanished
    )
    forecast = expiry_forecast(_facts([a, b, c], snaps), RetentionPolicy(redundancy=1))
    secure = forecast.backups[a.id]
    assert secure.secure and secure.secure_until == until and not secure.removed
    vanished = forecast.backups[c.id]
    assert vanished.marked_unusable is not None and "vanished" in vanished.marked_unusable
    assert not vanished.removed  # a later expiry removes it
    notes = retention_notes(a, secure, NOW)
    assert notes == (f"secure until {until.astimezone(dt.UTC).isoformat(timespec='seconds')}",)
    assert retention_notes(c, vanished, NOW)[0].startswith("next expire marks it unusable: ")
    # A secure snapshot without a known expiry.
    unknown = attrs.evolve(secure, secure_until=None)
    assert retention_notes(a, unknown, NOW) == ("secure (no expiry known)",)


def test_pin_notes_say_until_when_and_when_a_pin_expired() -> None:
    b = _backup(0, 5, DONE, False)
    assert retention_notes(b, None, NOW) == ()
    forever = attrs.evolve(b, pin=Pin("legal hold"))
    assert retention_notes(forever, None, NOW) == ("pinned forever: legal hold",)
    later = NOW + dt.timedelta(days=1)
    held = attrs.evolve(b, pin=Pin("audit", until=later))
    assert retention_notes(held, None, NOW) == (
        f"pinned until {later.isoformat(timespec='seconds')}: audit",
    )
    assert retention_notes(held, None, later + dt.timedelta(seconds=1)) == (
        f"pin expired {later.isoformat(timespec='seconds')}: audit",
    )
    going = BackupOutlook(b.id, removed=True, reasons=("beyond redundancy 1",))
    assert retention_notes(b, going, NOW) == ("next expire removes it: beyond redundancy 1",)


def test_the_backup_list_shows_retention_in_a_column() -> None:
    a, b = (_backup(i, seg, DONE, False) for i, seg in enumerate((5, 20)))
    a = attrs.evolve(a, pin=Pin("audit"))
    plain = BackupList([a, b], now=NOW)
    assert plain.forecast is None and repr(plain) == "<BackupList 2 backups>"
    assert [r[-1] for r in plain.rows()] == ["pinned forever: audit", "-"]
    c = _backup(2, 40, DONE, False)
    forecast = expiry_forecast(_facts([a, b, c]), RetentionPolicy(redundancy=1))
    listed = BackupList([a, b, c], forecast=forecast)
    assert listed.now == NOW  # judged when the forecast was
    assert repr(listed) == "<BackupList 3 backups, next expire removes 1>"
    assert [r[-1] for r in listed.rows()] == [
        "pinned forever: audit",
        "next expire removes it: beyond redundancy 1",
        "-",
    ]
    html = listed._repr_html_()
    assert "<th>retention</th>" in html and "next expire removes it" in html
