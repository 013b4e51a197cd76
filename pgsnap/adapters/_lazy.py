"""psycopg, imported when first used.

The PostgreSQL adapter is built by every command (``pgsnap list`` too), but
only commands that talk to the server need psycopg, whose import costs
0.1-0.2 s. ``psycopg`` here is a stand-in that imports the driver (and its
``conninfo`` and ``errors`` modules) on the first attribute looked up, then
hands out the real attributes.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["psycopg"]


class _Lazy:
    __slots__ = ("_module",)

    def __init__(self) -> None:
        self._module: ModuleType | None = None

    def __getattr__(self, name: str) -> Any:
        module = self._module
        if module is None:
            module = importlib.import_module("psycopg")
            importlib.import_module("psycopg.conninfo")
            importlib.import_module("psycopg.errors")
            self._module = module
        return getattr(module, name)

    def __repr__(self) -> str:
        return f"<psycopg, {'imported' if self._module is not None else 'not imported yet'}>"


if TYPE_CHECKING:
    import psycopg
    import psycopg.conninfo
    import psycopg.errors
else:
    psycopg = _Lazy()
