"""Storage backends, found by name and loaded only when asked for.

A backend is looked up in this order:

1. names registered at run time with :func:`register_backend` (notebooks, tests);
2. the built-in backends (:data:`BUILTIN_BACKENDS`: ``"mock"``, ``"btrfs"``...), kept as
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
import inspect
import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from pgsnap._registry import NO_PLUGINS_ENV, PluginRegistry, describe_target
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

BUILTIN_BACKENDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "btrfs": "pgsnap.backends.btrfs:BtrfsBackend",
        "lvm": "pgsnap.backends.lvm:LvmBackend",
        "mock": "pgsnap.backends.mock:MockBackend",
        "powerflex": "pgsnap.backends.powerflex:PowerFlexBackend",
    }
)
"""Backends shipped with pgsnap: name → ``"module:Class"`` (imported on first use)."""


def _check_backend_class(name: str, cls: type) -> None:
    missing = [m for m in STORAGE_BACKEND_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigurationError(
            f"backend {name!r} ({describe_target(cls)}) does not implement StorageBackend: "
            f"missing {', '.join(missing)}",
            hint="run pgsnap.testing.conformance against it to see what is expected",
            name=name,
            missing=tuple(missing),
        )


class BackendRegistry(PluginRegistry["StorageBackend"]):
    """Backend names and where their classes live; classes are imported on first use.

    ``builtins`` defaults to :data:`BUILTIN_BACKENDS`; ``plugins=False`` ignores
    the entry-point group whatever the environment says (with ``plugins=True``,
    ``PGSNAP_NO_PLUGINS=1`` still turns them off). Thread-safe. See
    :class:`~pgsnap._registry.PluginRegistry` for registration and lookup.
    """

    def __init__(
        self,
        *,
        builtins: Mapping[str, str] | None = None,
        plugins: bool = True,
        group: str = ENTRY_POINT_GROUP,
    ) -> None:
        super().__init__(
            kind="storage backend",
            group=group,
            builtins=BUILTIN_BACKENDS if builtins is None else builtins,
            check=_check_backend_class,
            not_found=BackendNotFound,
            plugins=plugins,
        )

    def backend_class(self, name: str) -> type[StorageBackend]:
        """The class registered as ``name``, imported now if needed.

        :class:`~pgsnap.errors.BackendNotFound` (listing the available names)
        for an unknown name; :class:`~pgsnap.errors.ConfigurationError` when
        the module cannot be imported or the object is not a backend class.
        """
        return self.load(name)

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
                raise _option_error(name, signature, options, exc) from exc
        backend: StorageBackend = cls(**options)
        return backend


def _option_error(
    name: str, signature: inspect.Signature, options: Mapping[str, Any], exc: TypeError
) -> ConfigurationError:
    """The error for options a backend's constructor does not take: the unknown or
    missing names, the nearest valid one, and the names it takes (never its whole
    signature, which carries types and defaults)."""
    import difflib  # noqa: PLC0415

    params = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    unknown = sorted(set(options) - set(params))
    takes = f"it takes: {', '.join(params)}"
    if unknown:
        near = difflib.get_close_matches(unknown[0], params, n=1)
        message = f"backend {name!r} does not accept option(s) {', '.join(map(repr, unknown))}"
        hint = (f"did you mean {near[0]!r}? " if near else "") + takes
    else:
        missing = [
            p.name
            for p in signature.parameters.values()
            if p.default is p.empty and p.name not in options and p.kind is not p.VAR_KEYWORD
        ]
        message = (
            f"backend {name!r} needs option(s) {', '.join(map(repr, missing))}"
            if (missing)
            else f"backend {name!r} does not accept these options ({exc})"
        )
        hint = takes
    return ConfigurationError(message, hint=hint, name=name, options=tuple(sorted(options)))


@functools.cache
def default_registry() -> BackendRegistry:
    """The registry the module functions use, created on first call."""
    return BackendRegistry()


def register_backend(name: str, target: str | type, *, replace: bool = False) -> None:
    """Register a backend in the default registry (see :meth:`PluginRegistry.register`)."""
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
