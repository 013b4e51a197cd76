"""The usable backups in a recovery's order are sorted once per facts (issue 27)."""

from __future__ import annotations

import attrs

from pgsnap.model import BackupState

from .test_planner_recovery import backup
from .test_planner_recovery import facts as make_facts


def test_the_order_is_sorted_once_and_evolved_facts_sort_again() -> None:
    # Listed oldest start first, as a catalog lists them; one failed, never a candidate.
    backups = (backup("b1", 2, 3, 1), backup("b2", 5, 6, 5), backup("b3", 9, 10, 9))
    failed = backup("b4", 12, 13, 12, state=BackupState.FAILED)
    facts = make_facts((*backups, failed))
    first = facts.usable_newest_first()
    assert first is facts.usable_newest_first()  # kept, not sorted again
    expected = sorted(
        (b for b in facts.backups if b.is_usable and b.stop_lsn is not None),
        key=lambda b: (b.stop_time or b.start_time, b.stop_lsn or b.start_lsn),
        reverse=True,
    )
    assert list(first) == expected
    assert [b.id for b in first] == ["b3", "b2", "b1"]
    # New facts (evolved: another catalog) are sorted anew, never the kept order.
    gone = first[0]
    fewer = attrs.evolve(
        facts,
        backups=tuple(
            attrs.evolve(b, state=BackupState.FAILED) if b.id == gone.id else b
            for b in facts.backups
        ),
    )
    assert fewer.usable_newest_first() == first[1:]
    assert fewer == attrs.evolve(fewer)  # the kept order is no part of the facts' value
    assert "newest_first" not in repr(facts)


def test_facts_evolve_keeps_the_order_unless_the_backups_change() -> None:
    backups = (backup("b1", 2, 3, 1), backup("b2", 5, 6, 5), backup("b3", 9, 10, 9))
    facts = make_facts(backups)
    unsorted = facts.evolve(host="elsewhere")
    assert unsorted == attrs.evolve(facts, host="elsewhere")
    first = facts.usable_newest_first()
    added = facts.evolve(host="elsewhere", data_directory="/srv/pg")
    assert added == attrs.evolve(facts, host="elsewhere", data_directory="/srv/pg")
    assert added.usable_newest_first() is first  # passed on, not sorted again
    assert unsorted.usable_newest_first() == first  # made before the sort: sorts itself
    # Other backups: sorted anew, never the kept order (even the same backups anew).
    fewer = facts.evolve(backups=backups[:2])
    assert [b.id for b in fewer.usable_newest_first()] == ["b2", "b1"]
    same = facts.evolve(backups=backups)
    assert same.usable_newest_first() == first
    assert same.usable_newest_first() is not first
