"""What an operation is: typed parameters, a target, a compensation, a resume policy.

An operation is an attrs class whose fields are its parameters (as Alembic's
ops are plain data). It says which collaborator it touches (:class:`Target`),
which operation undoes it (``compensation``), what a resumed run does with it
after an interruption (:class:`Resume`), and whether it is a barrier: once a
barrier step has started, nothing before it is undone (PostgreSQL replaying on
restored volumes cannot be taken back). Its :meth:`Operation.run` does the
I/O, given an :class:`OperationContext`; the executor is what sequences runs.

A parameter may be a :class:`Ref`: a value an earlier step produced (the
snapshot id a safety snapshot got), resolved by :meth:`OperationContext.resolve`
when the operation runs.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import types
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from pgsnap._attrs import define, frozen
from pgsnap.errors import (
    BackupNotFound,
    CatalogError,
    ExecutionError,
    FormatError,
    InputError,
    InvalidPlanError,
    InvariantError,
)
from pgsnap.model import decode_value, encode_value

if TYPE_CHECKING:
    from pgsnap.host import Host
    from pgsnap.model import BackupRecord, Layout
    from pgsnap.protocols import (
        Catalog,
        DatabaseAdapter,
        PrimaryServer,
        StorageBackend,
        WalArchive,
    )

__all__ = [
    "JSONValue",
    "Operation",
    "OperationContext",
    "Outputs",
    "PlanView",
    "Ref",
    "Resume",
    "RunFailure",
    "Target",
    "decode_params",
    "encode_params",
]

JSONValue = Any
"""A value that ``json.dumps`` accepts (str, int, float, bool, None, lists, dicts)."""

Outputs = dict[str, JSONValue]
"""What a step produced (plain JSON data: it is journalled)."""

_T = TypeVar("_T")
_O = TypeVar("_O", bound="Operation")


class Target(enum.Enum):
    """Which collaborator an operation touches."""

    DATABASE = "db"
    STORAGE = "storage"
    HOST = "host"
    ARCHIVE = "archive"
    CATALOG = "catalog"
    COPY = "copy"


class Resume(enum.Enum):
    """What a resumed run does with a step that an interruption left unfinished."""

    RERUN = "rerun"
    """Idempotent: run it again."""
    CHECK = "check"
    """Ask the operation whether it already took effect (:meth:`Operation.probe`);
    skip it if so, run it otherwise."""
    ABORT = "abort"
    """It needs what only the interrupted process had (the backup session): a run
    that still has such a step to do cannot resume and is undone instead."""


@frozen(init=False)
class Ref:
    """A value produced by an earlier step: ``outputs[path[0]][path[1]][path[2]]...``.

    ``Ref("backup-start")`` is that step's whole outputs; ``Ref("snapshot",
    "snapshots", "vol-0001")`` the snapshot id it took of ``vol-0001``. In plan
    JSON a reference is ``{"$ref": ["snapshot", "snapshots", "vol-0001"]}``.
    """

    path: tuple[str, ...]

    def __init__(self, step: str, *keys: str) -> None:
        self.__attrs_init__((step, *keys))

    def __attrs_post_init__(self) -> None:
        if not self.path or not all(isinstance(p, str) and p for p in self.path):
            raise FormatError(f"a reference names a step and keys (non-empty text): {self.path!r}")

    @property
    def step(self) -> str:
        """The step whose outputs are referred to."""
        return self.path[0]

    def to_json(self) -> dict[str, list[str]]:
        """``{"$ref": [step, key...]}``."""
        return {"$ref": list(self.path)}

    def __str__(self) -> str:
        keys = "".join(f"[{k}]" for k in self.path[1:])
        return f"output{keys or 's'} of step {self.step}"


def _is_ref_json(data: object) -> bool:
    return isinstance(data, dict) and set(data) == {"$ref"}


@frozen
class RunFailure:
    """Why a run is being undone, and what could not be undone so far.

    Compensations read it: a failed backup is recorded FAILED with ``reason``
    and its ``leftovers`` (snapshots that could not be deleted) as orphans.
    """

    reason: str
    step_id: str
    leftovers: tuple[str, ...] = ()


@frozen
class PlanView:
    """The operations of the plan being run, as :meth:`Operation.precheck` sees them.

    ``steps`` are ``(step id, operation, compensation or None)`` in plan order;
    ``barrier`` is the index of the first barrier step (None: no barrier).
    """

    steps: tuple[tuple[str, Operation, Operation | None], ...]
    started: frozenset[str] = frozenset()
    """Steps an earlier, interrupted process started (a resumed run): what they did
    may already have taken effect."""
    undo: bool = False
    """True while a step's compensation is checked: rules about the steps after it
    (a detached volume is attached again) are the forward step's, not its undo's."""

    def for_undo(self) -> PlanView:
        """This view, for checking compensations."""
        return attrs.evolve(self, undo=True)

    @property
    def barrier(self) -> int | None:
        """The index of the point of no return in :attr:`steps` (None: there is none)."""
        return next((n for n, (_s, op, _u) in enumerate(self.steps) if op.barrier), None)

    def index(self, step_id: str) -> int:
        """The position of ``step_id`` (``KeyError`` if absent)."""
        for n, (sid, _op, _undo) in enumerate(self.steps):
            if sid == step_id:
                return n
        raise KeyError(step_id)

    def of(self, cls: type[_O]) -> list[tuple[str, _O]]:
        """The steps whose operation is a ``cls``, in order, with their ids."""
        return [(sid, op) for sid, op, _undo in self.steps if isinstance(op, cls)]

    def operation(self, step_id: str) -> Operation:
        """The operation of ``step_id`` (``KeyError`` if absent)."""
        return self.steps[self.index(step_id)][1]


@define
class OperationContext:
    """What an operation works with when it runs.

    The collaborators, the outputs of the steps done so far (read-only),
    ``resources`` that live only in this process (the open backup session),
    the injected ``sleep`` and ``clock``, when the run started, and while
    compensating, the :class:`RunFailure` being undone.
    """

    adapter: DatabaseAdapter
    backend: StorageBackend
    catalog: Catalog
    archive: WalArchive
    host: Host
    layout: Layout
    outputs: Mapping[str, Mapping[str, JSONValue]]
    resources: dict[str, Any]
    sleep: Callable[[float], None]
    clock: Callable[[], dt.datetime]
    run_started: dt.datetime
    plan_id: str = ""
    """The identity of the plan being run."""
    step_id: str = ""
    failure: RunFailure | None = None
    progress: Callable[[str, Mapping[str, JSONValue]], None] = lambda _m, _d: None
    """Report how a long step is getting on (``message``, plain data): the
    executor turns each call into a ``progress`` event of the running step."""
    hosts: Mapping[str, Host] = attrs.field(factory=dict)
    """Other hosts pgsnap reaches, by the storage's name for them (clones made on
    a host other than the database host); :meth:`host_named` finds one."""

    primary: PrimaryServer | None = None
    """The primary of the standby pgsnap backs up (``[primary]``), when configured."""

    def host_named(self, name: str) -> Host | None:
        """The database host when ``name`` is its name (or empty), else the other host
        of that name, or None when pgsnap reaches no host of that name."""
        if not name or name == self.host.name:
            return self.host
        return self.hosts.get(name)

    def resolve(self, value: _T | Ref) -> Any:
        """``value`` itself, or what the :class:`Ref` points to.

        :class:`~pgsnap.errors.ExecutionError` when the referred step has not
        produced it (it did not run, or produced something else).
        """
        if not isinstance(value, Ref):
            return value
        found: Any = self.outputs.get(value.step)
        if found is None:
            raise ExecutionError(
                f"step {self.step_id} needs the {value}, but that step has not run",
                step_id=self.step_id,
                hint="the plan's steps are out of order, or the journal lost the outputs",
            )
        for key in value.path[1:]:
            if not isinstance(found, Mapping) or key not in found:
                raise ExecutionError(
                    f"step {self.step_id} needs the {value}, which that step did not produce",
                    step_id=self.step_id,
                    hint="the plan and the operation that ran disagree; make a new plan",
                )
            found = found[key]
        return found

    def elapsed(self) -> float:
        """Seconds since the run started (across interruptions)."""
        return max(0.0, (self.clock() - self.run_started).total_seconds())


class Operation:
    """Base class of operations. Subclasses are ``@attrs.frozen`` with typed fields.

    Class attributes a subclass sets:

    - ``name``: the registered name, ``"<target>.<verb>"`` (``"db.stop_server"``);
    - ``target``: the :class:`Target` it touches;
    - ``compensation``: the name of the operation that undoes it, or None
      (nothing to undo, or it cannot be undone: the step's reason says so);
    - ``resume``: the :class:`Resume` policy (default ``RERUN``);
    - ``barrier``: True when starting it is a point of no return;
    - ``cleanup``: True when it still runs after a failure past the point of
      no return (it then finds the failure in ``ctx.failure`` and decides
      whether it is safe to do: removing recovery settings once the server has
      left recovery).
    """

    name: ClassVar[str] = ""
    target: ClassVar[Target]
    compensation: ClassVar[str | None] = None
    resume: ClassVar[Resume] = Resume.RERUN
    barrier: ClassVar[bool] = False
    cleanup: ClassVar[bool] = False

    def run(self, ctx: OperationContext) -> Outputs:
        """Do it; return what later steps (and the journal) need to know."""
        raise NotImplementedError(f"operation {self.name} does not define run()")

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        """Before the run changes anything: check, against what the collaborators
        say now and the rest of the plan, the invariants this step depends on.

        Raise :class:`~pgsnap.errors.InvariantError` (via :meth:`mismatch`) when
        the plan says something that is not so (a snapshot that is not the
        backup's): the run is refused before its first step. Read-only. The
        default checks nothing.
        """
        del ctx, plan

    def mismatch(self, ctx: OperationContext, message: str, hint: str) -> InvariantError:
        """The error a failed invariant raises (names this step)."""
        return InvariantError(
            f"step {ctx.step_id} ({self.name}): {message}",
            step_id=ctx.step_id,
            hint=hint,
            action=self.name,
        )

    def backup_record(self, ctx: OperationContext, backup_id: str) -> BackupRecord:
        """The catalog's record of ``backup_id``, or the :meth:`mismatch` that says it is
        missing, cannot be read, or is not a backup to restore."""
        try:
            record = ctx.catalog.get(backup_id)
        except BackupNotFound:
            raise self.mismatch(
                ctx,
                f"backup {backup_id} is not in the catalog",
                "list the backups (pgsnap list) and make a new plan",
            ) from None
        except CatalogError as exc:
            raise self.mismatch(
                ctx,
                f"backup {backup_id}'s record cannot be read: {exc.message}",
                "repair the catalog record, then make a new plan",
            ) from exc
        if not record.is_usable:
            raise self.mismatch(
                ctx,
                f"backup {backup_id} is {record.state.value}, not a backup to restore",
                "list the backups (pgsnap list) and make a new plan",
            )
        return record

    def check_writes_label(self, ctx: OperationContext, plan: PlanView, backup_id: str) -> None:
        """The :meth:`mismatch` raised when ``plan`` does not write ``backup_id``'s
        backup label: a volume restored from that backup would be replayed from
        another checkpoint (a corrupt cluster)."""
        # By action name: db.py builds on the restore steps' modules, not the reverse.
        labels = [
            str(getattr(op, "backup_id", ""))
            for _sid, op, _undo in plan.steps
            if op.name == "db.write_backup_label"
        ]
        if backup_id not in labels:
            written = ", ".join(sorted(set(labels))) or "no backup's"
            raise self.mismatch(
                ctx,
                f"it restores backup {backup_id}'s data, but the plan writes {written} "
                "label: PostgreSQL would replay from the wrong checkpoint",
                "the plan was edited: make a new plan",
            )

    def restores(self) -> tuple[str, str | None] | None:
        """``(volume id, backup id or None)`` when this step replaces a volume's content
        with a backup's (a snapshot restore, a restore from a copy) or, without a
        backup, with a state this run saved; None for any other step. The steps
        that must follow a restore (cleaning the data directory, writing the
        backup label, starting the server) find the restores by this."""
        return None

    def probe(self, ctx: OperationContext) -> Outputs | None:
        """After an interruption: its outputs if it already took effect, else None.

        Used by the ``CHECK`` and ``ABORT`` policies (to find what an
        interrupted step created, so it can be undone).
        """
        return None

    def created(self, outputs: Mapping[str, JSONValue]) -> tuple[str, ...]:
        """Resources the step created (snapshot ids): leftovers if they cannot be removed."""
        return ()


# --------------------------------------------------------------------------- parameters


@functools.cache
def _field_types(cls: Any) -> dict[str, Any]:
    return dict(typing.get_type_hints(cls))


def _fields(cls: type) -> tuple[attrs.Attribute[Any], ...]:
    return tuple(attrs.fields(typing.cast(Any, cls)))


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _allows_ref(tp: Any) -> bool:
    return tp is Ref or (_is_union(tp) and Ref in typing.get_args(tp))


def _without_ref(tp: Any) -> Any:
    if not _is_union(tp):
        return tp
    args = tuple(a for a in typing.get_args(tp) if a is not Ref)
    return args[0] if len(args) == 1 else typing.Union[args]  # noqa: UP007 - built at run time


def encode_params(op: Operation) -> dict[str, JSONValue]:
    """An operation's parameters as plain JSON data (references as ``{"$ref": [...]}``)."""
    out: dict[str, JSONValue] = {}
    for f in _fields(type(op)):
        value = getattr(op, f.name)
        out[f.name] = value.to_json() if isinstance(value, Ref) else encode_value(value)
    return out


def decode_params(cls: type[_T], params: Mapping[str, JSONValue], *, step_id: str) -> _T:
    """Build operation ``cls`` from plain parameters; :class:`InvalidPlanError` if they are wrong.

    Unknown and missing parameters are refused (a misspelled parameter of a
    newer or broken plan must not be silently dropped); values are checked
    against the field types; ``{"$ref": [...]}`` is accepted where the field
    takes a :class:`Ref`.
    """
    name = getattr(cls, "name", cls.__name__)
    hints = _field_types(typing.cast(type, cls))
    fields = {f.name: f for f in _fields(cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise InvalidPlanError(
            f"step {step_id}: operation {name} has no parameter(s) {', '.join(unknown)}",
            hint=f"it takes: {', '.join(fields) or 'no parameters'}",
            step_id=step_id,
            action=name,
        )
    kwargs: dict[str, Any] = {}
    for fname, f in fields.items():
        if fname not in params:
            if f.default is attrs.NOTHING:
                raise InvalidPlanError(
                    f"step {step_id}: operation {name} needs parameter {fname!r}",
                    step_id=step_id,
                    action=name,
                )
            continue
        data = params[fname]
        tp = hints[fname]
        if _is_ref_json(data):
            if not _allows_ref(tp):
                raise InvalidPlanError(
                    f"step {step_id}: parameter {fname!r} of {name} cannot be a reference",
                    step_id=step_id,
                    action=name,
                )
            path = data["$ref"]
            if not isinstance(path, list) or not path:
                raise InvalidPlanError(
                    f"step {step_id}: malformed reference in {fname!r}: {data!r}",
                    step_id=step_id,
                    action=name,
                )
            try:
                kwargs[fname] = Ref(*(str(p) for p in path))
            except FormatError as exc:
                raise InvalidPlanError(
                    f"step {step_id}: {exc.message}", step_id=step_id, action=name
                ) from exc
            continue
        try:
            kwargs[fname] = decode_value(_without_ref(tp), data, f"{step_id}.{fname}")
        except InputError as exc:
            raise InvalidPlanError(
                f"step {step_id}: parameter {fname!r} of {name}: {exc.message}",
                step_id=step_id,
                action=name,
            ) from exc
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidPlanError(
            f"step {step_id}: invalid parameters for {name}: {exc}", step_id=step_id, action=name
        ) from exc


def refs_in(op: Operation) -> Sequence[Ref]:
    """The references among an operation's parameters."""
    return [v for f in _fields(type(op)) if isinstance(v := getattr(op, f.name), Ref)]


def renamed_operations(
    module: str, renamed: Mapping[str, str], namespace: Mapping[str, Any]
) -> Callable[[str], type[Operation]]:
    """A module ``__getattr__`` that still gives an operation class under its old name
    (``renamed``: old → new, looked up in ``namespace``), with a DeprecationWarning."""

    def __getattr__(name: str) -> type[Operation]:  # noqa: N807 - a module's __getattr__
        new = renamed.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is now {new} (operations are named as operations); "
            "the old name is removed after the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        cls: type[Operation] = namespace[new]
        return cls

    return __getattr__
