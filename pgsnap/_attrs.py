"""``frozen`` and ``define``: attrs' class decorators, with a ``__repr__`` that is not
compiled.

attrs writes each class's ``__init__``, ``__eq__``, ``__hash__`` and ``__repr__`` as
Python source and compiles it when the class is made. pgsnap makes about two hundred
classes on import, and compiling their ``__repr__`` alone took about 25 ms of every
command's start (a fifth of pgsnap's import time). These decorators make the class
with ``repr=False`` and give it a ``__repr__`` made from one function already
compiled, which writes what attrs' would, character for character:
``Name(field=value, ...)``, the fields with ``repr=False`` left out (secrets), a
field's own ``repr`` callable used, ``...`` for an object met again inside itself.
Everything else is attrs': type checkers see attrs' own decorators.

A class that writes its own ``__repr__``, or asks for ``repr=False``, keeps that.
"""

from __future__ import annotations

import _thread
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

__all__ = ["define", "frozen"]


def _make_repr(fields: Sequence[attrs.Attribute[Any]]) -> Callable[[object], str]:
    """The ``__repr__`` attrs would write for a class with these fields."""
    shown = tuple(
        (f.name, repr if f.repr is True else f.repr, f.init) for f in fields if f.repr is not False
    )
    running: set[tuple[int, int]] = set()  # (object, thread) being written: a cycle
    nothing = attrs.NOTHING

    def written(self: object) -> str:
        key = (id(self), _thread.get_ident())
        if key in running:
            return "..."
        running.add(key)
        try:
            values = ", ".join(
                f"{name}={show(getattr(self, name) if init else getattr(self, name, nothing))}"
                for name, show, init in shown
            )
            return f"{self.__class__.__qualname__.rsplit('>.', 1)[-1]}({values})"
        finally:
            running.discard(key)

    written.__name__ = written.__qualname__ = "__repr__"
    return written


def _decorate(make: Callable[..., Any], maybe_cls: type | None, options: dict[str, Any]) -> Any:
    wanted = options.get("repr")

    def wrap(cls: type) -> type:
        own = "__repr__" in cls.__dict__  # attrs would keep it (auto_detect)
        made: type = make(cls, **{**options, "repr": False})
        if wanted is not False and not (own and wanted is None):
            made.__repr__ = _make_repr(attrs.fields(made))  # type: ignore[method-assign,assignment]
        return made

    return wrap if maybe_cls is None else wrap(maybe_cls)


if TYPE_CHECKING:  # type checkers know attrs' own decorators (and their plugins)
    from attrs import define, frozen
else:

    def frozen(maybe_cls=None, **options):
        """``attrs.frozen``, its ``__repr__`` not compiled (see the module)."""
        return _decorate(attrs.frozen, maybe_cls, options)

    def define(maybe_cls=None, **options):
        """``attrs.define``, its ``__repr__`` not compiled (see the module)."""
        return _decorate(attrs.define, maybe_cls, options)
