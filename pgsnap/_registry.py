"""Plugin registries: names of classes, found in order and imported only when asked.

One mechanism serves storage backends (:mod:`pgsnap.backends`) and plan
operations (:mod:`pgsnap.operations`). A name is looked up in this order:

1. names registered at run time with :meth:`PluginRegistry.register`;
2. the built-in names, kept as ``"module:Class"`` strings so that importing a
   registry imports none of its plugins;
3. third-party plugins declared in an entry-point group (``pgsnap.backends``,
   ``pgsnap.operations``), read only when a name is looked up or listed, never
   at import time; ``PGSNAP_NO_PLUGINS=1`` turns them off.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Generic, TypeVar

from pgsnap.errors import ConfigurationError

__all__ = ["NO_PLUGINS_ENV", "PluginRegistry", "describe_target"]

log = logging.getLogger(__name__)

NO_PLUGINS_ENV: Final = "PGSNAP_NO_PLUGINS"
"""Environment variable that, set to ``1`` (or ``true``/``yes``), disables entry points."""

_NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

T = TypeVar("T")


def _plugins_disabled() -> bool:
    value = os.environ.get(NO_PLUGINS_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def describe_target(target: str | type) -> str:
    """``"module:Class"`` for a class, the string itself otherwise."""
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


class PluginRegistry(Generic[T]):
    """Names of plugin classes and where they live; classes are imported on first use.

    ``kind`` names what is registered in messages (``"backend"``); ``group``
    is the entry-point group; ``builtins`` maps names to ``"module:Class"``;
    ``check(name, cls)`` rejects a class that is not a proper plugin (raising
    :class:`~pgsnap.errors.ConfigurationError`); ``not_found`` builds the error
    for an unknown name (its keyword arguments: ``name``, ``available``,
    ``hint``). ``plugins=False`` ignores the entry points whatever the
    environment says. Thread-safe.
    """

    def __init__(
        self,
        *,
        kind: str,
        group: str,
        builtins: Mapping[str, str],
        check: Callable[[str, type], None],
        not_found: Callable[..., ConfigurationError],
        plugins: bool = True,
    ) -> None:
        self._kind = kind
        self._group = group
        self._builtins: dict[str, str] = dict(builtins)
        self._check = check
        self._not_found = not_found
        self._plugins = plugins
        self._registered: dict[str, str | type] = {}
        self._loaded: dict[str, type[T]] = {}
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        with self._lock:
            registered = sorted(self._registered)
        return (
            f"<{type(self).__name__} builtins={sorted(self._builtins)} registered={registered} "
            f"group={self._group!r} plugins={'on' if self._plugins_enabled() else 'off'}>"
        )

    # ------------------------------------------------------------------ registration

    def check_name(self, name: object) -> str:
        """``name`` if it is a valid plugin name, else ConfigurationError."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ConfigurationError(
                f"invalid {self._kind} name {name!r}",
                hint=f"a {self._kind} name is lower case: letters, digits, '_', '-' or '.', "
                "starting with a letter",
                name=name if isinstance(name, str) else repr(name),
            )
        return name

    def register(self, name: str, target: str | type, *, replace: bool = False) -> None:
        """Register ``target`` (a class, or ``"module:Class"``, imported lazily) as ``name``.

        A name already known (registered, built-in or from an entry point) is
        refused with :class:`~pgsnap.errors.ConfigurationError` unless
        ``replace=True``; the replacement then wins over the built-in or plugin.
        """
        self.check_name(name)
        if isinstance(target, str):
            if not _TARGET_RE.match(target):
                raise ConfigurationError(
                    f"invalid {self._kind} target {target!r} for {name!r}",
                    hint="give a class or a string 'package.module:ClassName'",
                    name=name,
                    target=target,
                )
        elif not isinstance(target, type):
            raise ConfigurationError(
                f"{self._kind} {name!r} must be a class or 'module:Class', "
                f"not {type(target).__name__}",
                hint=f"pass the {self._kind} class itself, not an instance",
                name=name,
            )
        with self._lock:
            if not replace and name in self._all_targets():
                raise ConfigurationError(
                    f"a {self._kind} named {name!r} is already registered",
                    hint="pass replace=True to override it, or choose another name",
                    name=name,
                )
            self._registered[name] = target
            self._loaded.pop(name, None)
        log.debug("registered %s %r -> %s", self._kind, name, describe_target(target))

    def unregister(self, name: str) -> None:
        """Forget a name registered with :meth:`register` (built-ins and plugins stay)."""
        with self._lock:
            if name not in self._registered:
                raise self._not_found(
                    f"no {self._kind} {name!r} was registered at run time",
                    hint="only names added with register() can be unregistered",
                    name=name,
                    available=tuple(sorted(self._registered)),
                )
            del self._registered[name]
            self._loaded.pop(name, None)

    # ------------------------------------------------------------------ lookup

    def names(self) -> tuple[str, ...]:
        """Every known name, sorted."""
        with self._lock:
            return tuple(sorted(self._all_targets()))

    def targets(self) -> Mapping[str, str]:
        """Read-only name → ``"module:Class"`` of every known plugin, sorted by name."""
        with self._lock:
            found = self._all_targets()
        return MappingProxyType({n: describe_target(found[n]) for n in sorted(found)})

    def load(self, name: str) -> type[T]:
        """The class registered as ``name``, imported now if needed.

        The ``not_found`` error (listing the available names) for an unknown
        name; :class:`~pgsnap.errors.ConfigurationError` when the module cannot
        be imported or the object is not a proper plugin class.
        """
        with self._lock:
            cached = self._loaded.get(name)
            if cached is not None:
                return cached
            target = self._target(name)
            cls = target if isinstance(target, type) else self._import(name, target)
            self._check(name, cls)
            self._loaded[name] = cls
            log.debug("loaded %s %r: %s", self._kind, name, describe_target(cls))
            return cls

    def target(self, name: str) -> str:
        """What ``name`` is registered as (``"module:Class"``), nothing imported: a
        name checked without loading its plugin. The ``not_found`` error, listing the
        available names, for an unknown name."""
        with self._lock:
            cached = self._loaded.get(name)
            return describe_target(cached if cached is not None else self._target(name))

    # ------------------------------------------------------------------ internals

    def _target(self, name: str) -> str | type:
        """The target of ``name`` (the caller holds the lock), or the ``not_found``
        error. Run-time registrations and built-ins override entry points: a name
        found there needs no scan of the installed distributions (which costs
        milliseconds each time)."""
        if name in self._registered:
            found: Mapping[str, str | type] = self._registered
        elif name in self._builtins:
            found = self._builtins
        else:
            found = self._all_targets()
        if name not in found:
            available = tuple(sorted(found))
            listed = ", ".join(available) or "(none)"
            raise self._not_found(
                f"no {self._kind} named {name!r}; available: {listed}",
                hint=self._not_found_hint(),
                name=name,
                available=available,
            )
        return found[name]

    def _plugins_enabled(self) -> bool:
        return self._plugins and not _plugins_disabled()

    def _not_found_hint(self) -> str:
        if self._plugins_enabled():
            return (
                "install the package that provides it (it declares an entry point in the "
                f"{self._group!r} group) or register it at run time"
            )
        return (
            f"entry points are disabled ({NO_PLUGINS_ENV} or plugins=False); "
            f"register the {self._kind} at run time"
        )

    def _entry_points(self) -> dict[str, str]:
        """Entry-point name → target, read now (never imported here)."""
        if not self._plugins_enabled():
            return {}
        import importlib.metadata  # noqa: PLC0415 - only when a name is asked for

        found: dict[str, str] = {}
        for ep in importlib.metadata.entry_points(group=self._group):
            if ep.name in found and found[ep.name] != ep.value:
                log.warning(
                    "entry point %r in group %r is declared twice (%s, %s); using the first",
                    ep.name,
                    self._group,
                    found[ep.name],
                    ep.value,
                )
                continue
            found[ep.name] = ep.value
        return found

    def _all_targets(self) -> dict[str, str | type]:
        """Every name → target, later sources overridden by earlier ones (caller locks)."""
        merged: dict[str, str | type] = {}
        merged.update(self._entry_points())
        merged.update(self._builtins)
        merged.update(self._registered)
        return merged

    def _import(self, name: str, target: str) -> type:
        module_name, _, attr_path = target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigurationError(
                f"{self._kind} {name!r} could not be loaded: {exc}",
                hint=f"install the package that provides {module_name!r} "
                "(and its optional dependencies)",
                name=name,
                target=target,
            ) from exc
        try:
            for part in attr_path.split("."):
                obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigurationError(
                f"{self._kind} {name!r}: {module_name!r} has no attribute {attr_path!r}",
                hint="check the entry point or the registered 'module:Class' string",
                name=name,
                target=target,
            ) from exc
        if not isinstance(obj, type):
            raise ConfigurationError(
                f"{self._kind} {name!r}: {target!r} is a {type(obj).__name__}, not a class",
                hint=f"point the registration at the {self._kind} class",
                name=name,
                target=target,
            )
        return obj
