"""Storage backends, found by name and loaded only when asked for.

A backend is looked up in this order:

1. names registered at run time with :func:`register_backend` (notebooks, tests);
2. the built-in backends (:data:`BUILTIN_BACKENDS`: ``"mock"``...), kept as
   ``"module:Class"`` strings so that importing :mod:`pgsnap.backends` imports
   no backend module;
3. third-party backends declared in the entry-point group ``pgsnap.backends``
   (:data:`ENTRY_POINT_GROUP`). Entry points are read only when a name is looked
   up or listed, never at import time; set ``PGSNAP_NO_PLUGINS=1`` to ignore them.

A third-party package declares its backend in its ``pyproject.toml``::

    [project.entry-points."pgsnap.backends"]
    acme = "acme_pgsnap.backend:AcmeBackend"

and then ``create_backend("acme", url=...)`` works. The module functions use a
default :class:`BackendRegistry` created on first use; tests make their own
``BackendRegistry()`` and leave the default alone.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import re
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from pgsnap.errors import BackendNotFound, ConfigurationError
from pgsnap.protocols import STORAGE_BACKEND_METHODS

if TYPE_CHECKING:
    from pgsnap.protocols import StorageBackend

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "NO_PLUGINS_ENV",
    "BackendRegistry",
    "backend_class",
    "create_backend",
    "default_registry",
    "register_backend",
    "registered_backends",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP: Final = "pgsnap.backends"
"""The entry-point group third-party packages declare their backends in."""

NO_PLUGINS_ENV: Final = "PGSNAP_NO_PLUGINS"
"""Environment variable that, set to ``1`` (or ``true``/``yes``), disables entry points."""

BUILTIN_BACKENDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "mock": "pgsnap.backends.mock:MockBackend",
        # "powerflex" and "lvm" join here when their modules land.
    }
)
"""Backends shipped with pgsnap: name → ``"module:Class"`` (imported on first use)."""

_NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
_TARGET_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# The protocol methods a backend class must define (properties may be set per instance).
_REQUIRED_METHODS: Final = STORAGE_BACKEND_METHODS


def _plugins_disabled() -> bool:
    value = os.environ.get(NO_PLUGINS_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def _describe(target: str | type) -> str:
    """``"module:Class"`` for a class, the string itself otherwise."""
    if isinstance(target, str):
        return target
    return f"{target.__module__}:{target.__qualname__}"


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigurationError(
            f"invalid backend name {name!r}",
            hint="a backend name is lower case: letters, digits, '_', '-' or '.', "
            "starting with a letter (e.g. 'powerflex')",
            name=name if isinstance(name, str) else repr(name),
        )
    return name


class BackendRegistry:
    """Backend names and where their classes live; classes are imported on first use.

    ``builtins`` defaults to :data:`BUILTIN_BACKENDS`; ``plugins=False`` ignores
    the entry-point group whatever the environment says (with ``plugins=True``,
    ``PGSNAP_NO_PLUGINS=1`` still turns them off). Thread-safe.
    """

    def __init__(
        self,
        *,
        builtins: Mapping[str, str] | None = None,
        plugins: bool = True,
        group: str = ENTRY_POINT_GROUP,
    ) -> None:
        self._builtins: dict[str, str] = dict(BUILTIN_BACKENDS if builtins is None else builtins)
        self._plugins = plugins
        self._group = group
        self._registered: dict[str, str | type] = {}
        self._loaded: dict[str, type] = {}
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        with self._lock:
            registered = sorted(self._registered)
        return (
            f"<BackendRegistry builtins={sorted(self._builtins)} registered={registered} "
            f"group={self._group!r} plugins={'on' if self._plugins_enabled() else 'off'}>"
        )

    # ------------------------------------------------------------------ registration

    def register(self, name: str, target: str | type, *, replace: bool = False) -> None:
        """Register ``target`` (a class, or ``"module:Class"``, imported lazily) as ``name``.

        A name already known (registered, built-in or from an entry point) is
        refused with :class:`~pgsnap.errors.ConfigurationError` unless
        ``replace=True``; the replacement then wins over the built-in or plugin.
        """
        _check_name(name)
        if isinstance(target, str):
            if not _TARGET_RE.match(target):
                raise ConfigurationError(
                    f"invalid backend target {target!r} for {name!r}",
                    hint="give a class or a string 'package.module:ClassName'",
                    name=name,
                    target=target,
                )
        elif not isinstance(target, type):
            raise ConfigurationError(
                f"backend {name!r} must be a class or 'module:Class', not {type(target).__name__}",
                hint="pass the backend class itself, not an instance",
                name=name,
            )
        with self._lock:
            if not replace and name in self._all_targets():
                raise ConfigurationError(
                    f"a backend named {name!r} is already registered",
                    hint="pass replace=True to override it, or choose another name",
                    name=name,
                )
            self._registered[name] = target
            self._loaded.pop(name, None)
        log.debug("registered backend %r -> %s", name, _describe(target))

    def unregister(self, name: str) -> None:
        """Forget a name registered with :meth:`register` (built-ins and plugins stay)."""
        with self._lock:
            if name not in self._registered:
                raise BackendNotFound(
                    f"no backend {name!r} was registered at run time",
                    hint="only names added with register() can be unregistered",
                    name=name,
                    available=tuple(sorted(self._registered)),
                )
            del self._registered[name]
            self._loaded.pop(name, None)

    # ------------------------------------------------------------------ lookup

    def names(self) -> tuple[str, ...]:
        """Every known backend name, sorted."""
        with self._lock:
            return tuple(sorted(self._all_targets()))

    def targets(self) -> Mapping[str, str]:
        """Read-only name → ``"module:Class"`` of every known backend, sorted by name."""
        with self._lock:
            found = self._all_targets()
        return MappingProxyType({n: _describe(found[n]) for n in sorted(found)})

    def backend_class(self, name: str) -> type[StorageBackend]:
        """The class registered as ``name``, imported now if needed.

        :class:`~pgsnap.errors.BackendNotFound` (listing the available names)
        for an unknown name; :class:`~pgsnap.errors.ConfigurationError` when
        the module cannot be imported or the object is not a backend class.
        """
        with self._lock:
            cached = self._loaded.get(name)
            if cached is not None:
                return cached
            found = self._all_targets()
            if name not in found:
                available = tuple(sorted(found))
                raise BackendNotFound(
                    f"no storage backend named {name!r}; "
                    f"available: {', '.join(available) or '(none)'}",
                    hint=self._not_found_hint(),
                    name=name,
                    available=available,
                )
            target = found[name]
            cls = target if isinstance(target, type) else self._import(name, target)
            _check_backend_class(name, cls)
            self._loaded[name] = cls
            log.debug("loaded backend %r: %s", name, _describe(cls))
            return cls

    def create(self, name: str, **options: Any) -> StorageBackend:
        """A new backend instance: ``backend_class(name)(**options)``.

        Options the class does not accept raise
        :class:`~pgsnap.errors.ConfigurationError` naming them.
        """
        cls = self.backend_class(name)
        try:
            signature = inspect.signature(cls)
        except (TypeError, ValueError):  # pragma: no cover - C classes without a signature
            signature = None
        if signature is not None:
            try:
                signature.bind(**options)
            except TypeError as exc:
                raise ConfigurationError(
                    f"backend {name!r} does not accept these options: {exc}",
                    hint=f"{cls.__name__}{signature} lists what it takes",
                    name=name,
                    options=tuple(sorted(options)),
                ) from exc
        backend: StorageBackend = cls(**options)
        return backend

    # ------------------------------------------------------------------ internals

    def _plugins_enabled(self) -> bool:
        return self._plugins and not _plugins_disabled()

    def _not_found_hint(self) -> str:
        if self._plugins_enabled():
            return (
                "install the package that provides it (it declares an entry point in the "
                f"{self._group!r} group) or call register_backend()"
            )
        return (
            f"entry points are disabled ({NO_PLUGINS_ENV} or plugins=False); "
            "register the backend with register_backend()"
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
                f"backend {name!r} could not be loaded: {exc}",
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
                f"backend {name!r}: {module_name!r} has no attribute {attr_path!r}",
                hint="check the entry point or the registered 'module:Class' string",
                name=name,
                target=target,
            ) from exc
        if not isinstance(obj, type):
            raise ConfigurationError(
                f"backend {name!r}: {target!r} is a {type(obj).__name__}, not a class",
                hint="point the registration at the backend class",
                name=name,
                target=target,
            )
        return obj


def _check_backend_class(name: str, cls: type) -> None:
    missing = [m for m in _REQUIRED_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigurationError(
            f"backend {name!r} ({_describe(cls)}) does not implement StorageBackend: "
            f"missing {', '.join(missing)}",
            hint="run pgsnap.testing.conformance against it to see what is expected",
            name=name,
            missing=tuple(missing),
        )


@functools.cache
def default_registry() -> BackendRegistry:
    """The registry the module functions use, created on first call."""
    return BackendRegistry()


def register_backend(name: str, target: str | type, *, replace: bool = False) -> None:
    """Register a backend in the default registry (see :meth:`BackendRegistry.register`)."""
    default_registry().register(name, target, replace=replace)


def backend_class(name: str) -> type[StorageBackend]:
    """The backend class registered as ``name`` (see :meth:`BackendRegistry.backend_class`)."""
    return default_registry().backend_class(name)


def create_backend(name: str, **options: Any) -> StorageBackend:
    """A new instance of the backend ``name`` built with ``options``."""
    return default_registry().create(name, **options)


def registered_backends() -> Mapping[str, str]:
    """Read-only name → ``"module:Class"`` of every backend the default registry knows."""
    return default_registry().targets()
