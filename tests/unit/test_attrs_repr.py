"""pgsnap's ``frozen`` and ``define`` (pgsnap._attrs): attrs' classes, with a ``__repr__``
that is not compiled per class and writes what attrs' would, character for character.

The oracle is attrs itself: each class is made twice, by attrs and by pgsnap, and the
two reprs compared. Then every attrs class pgsnap defines is checked the same way
against a twin attrs makes from its fields, so a secret field (``repr=False``) stays
out of every repr.
"""

from __future__ import annotations

import inspect
from typing import Any

import attrs

from pgsnap._attrs import define, frozen
from tests.unit.test_package import _modules as every_module


def _made_both_ways(body: dict[str, Any], **options: Any) -> tuple[type, type]:
    """The same class, made by attrs and by pgsnap (same name, same fields)."""
    made = []
    for decorator in (attrs.frozen, frozen):
        cls = type("Sample", (), dict(body))
        cls.__qualname__ = "Sample"
        made.append(decorator(**options)(cls) if options else decorator(cls))
    return made[0], made[1]


def test_fields_hidden_shown_and_custom_as_attrs_writes_them() -> None:
    body = {
        "__annotations__": {"name": "str", "secret": "str", "level": "int", "later": "int"},
        "secret": attrs.field(repr=False),
        "level": attrs.field(default=3, repr=lambda v: f"<level {v}>"),
        "later": attrs.field(init=False, default=7),
    }
    theirs, ours = _made_both_ways(body)
    assert repr(ours("pg", "hunter2")) == repr(theirs("pg", "hunter2"))
    assert repr(ours("pg", "hunter2")) == "Sample(name='pg', level=<level 3>, later=7)"
    assert "hunter2" not in repr(ours("pg", "hunter2"))


def test_an_unset_field_that_init_does_not_set_reads_as_attrs_nothing() -> None:
    body = {"__annotations__": {"a": "int", "memo": "int"}, "memo": attrs.field(init=False)}
    theirs, ours = _made_both_ways(body)
    assert repr(ours(1)) == repr(theirs(1)) == "Sample(a=1, memo=NOTHING)"


def test_options_pass_through_and_a_subclass_shows_every_field() -> None:
    @frozen(order=True, kw_only=True)
    class Base:
        a: int

    @attrs.frozen(order=True, kw_only=True)
    class TheirBase:
        a: int

    @frozen
    class Child(Base):
        b: str = "x"

    @attrs.frozen
    class TheirChild(TheirBase):
        b: str = "x"

    assert Base(a=1) < Base(a=2)
    assert repr(Base(a=1)) == repr(TheirBase(a=1)).replace("TheirBase", "Base")
    assert repr(Child(a=1)) == repr(TheirChild(a=1)).replace("TheirChild", "Child")
    assert repr(Child(a=1)) == "Child(a=1, b='x')"


def test_a_repr_of_its_own_or_none_asked_for_is_kept() -> None:
    @frozen
    class Own:
        a: int

        def __repr__(self) -> str:
            return "mine"

    @frozen(repr=False)
    class NoRepr:
        a: int

    assert repr(Own(1)) == "mine"
    assert repr(NoRepr(1)).startswith("<")
    assert NoRepr.__repr__ is object.__repr__


def test_an_object_met_inside_itself_is_written_as_dots() -> None:
    @define
    class Node:
        label: str
        next: Any = None

    @attrs.define
    class TheirNode:
        label: str
        next: Any = None

    ours, theirs = Node("a"), TheirNode("a")
    ours.next, theirs.next = Node("b", ours), TheirNode("b", theirs)
    assert repr(ours) == repr(theirs).replace("TheirNode", "Node")
    assert repr(ours) == "Node(label='a', next=Node(label='b', next=...))"
    assert repr(ours) == repr(ours)  # the guard let go after the first


def _pgsnap_classes() -> list[type]:
    found: dict[str, type] = {}
    for module in every_module():  # (not the moved modules' aliases: they warn)
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if attrs.has(cls) and cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[key] for key in sorted(found)]


def _ours(cls: type) -> bool:
    """Whether the class's repr is pgsnap's shared one (not its own, not object's)."""
    return getattr(cls.__repr__, "__module__", None) == "pgsnap._attrs"


def _twin_repr(cls: type, values: dict[str, Any]) -> str:
    """What attrs writes for an object of ``cls`` holding ``values``: a class attrs
    makes (repr compiled) from the same fields, under the same name."""
    fields = attrs.fields(cls)
    twin = attrs.make_class(
        cls.__name__,
        {f.name: attrs.field(repr=f.repr, init=f.init, default=None) for f in fields},
        slots=False,
    )
    twin.__qualname__ = cls.__qualname__
    obj: Any = object.__new__(twin)
    for name, value in values.items():
        object.__setattr__(obj, name, value)
    return repr(obj)


def test_every_pgsnap_class_writes_what_attrs_would() -> None:
    classes = _pgsnap_classes()
    assert len(classes) > 150  # the sweep found pgsnap's classes
    checked = 0
    for cls in classes:
        if not _ours(cls):
            continue  # a repr of its own (or none)
        values = {f.name: f"<{f.name}>" for f in attrs.fields(cls)}
        obj: Any = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(obj, name, value)
        assert repr(obj) == _twin_repr(cls, values), cls
        checked += 1
    assert checked > 150


def test_secret_fields_stay_out_of_every_repr() -> None:
    hidden = 0
    for cls in _pgsnap_classes():
        secret = [f.name for f in attrs.fields(cls) if f.repr is False]
        if not secret or not _ours(cls):
            continue
        obj: Any = object.__new__(cls)
        for f in attrs.fields(cls):
            object.__setattr__(obj, f.name, f"<{f.name}>")
        text = repr(obj)
        for name in secret:
            assert f"<{name}>" not in text, (cls, name)
        hidden += 1
    assert hidden > 0
