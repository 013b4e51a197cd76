"""Plans as data: ordered steps, each an operation with its reason and its compensation.

A :class:`Plan` is what the pure planners (:mod:`pgsnap.planner`) return and
what the :class:`~pgsnap.executor.Executor` runs. It is plain data: it
round-trips through JSON (``format_version``), explains itself in text
(:meth:`Plan.explain`), renders as a table in a notebook (``_repr_html_``), and
holds no secret. Each step names a registered operation (its ``action``,
see :mod:`pgsnap.operations`) with parameters; a plan naming an unknown
operation, or giving one wrong parameters, is refused when it is built or
loaded (:class:`~pgsnap.errors.InvalidPlanError`), never half-way through a run.

A plan has an identity, :attr:`Plan.id`: a digest of its whole content. Its
journal belongs to that identity alone, so two different plans never share a
run. The :attr:`Plan.fingerprint` is something else: a digest of the facts the
plan was made from, which the executor checks are still true before it starts.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import FormatError, InvalidPlanError
from pgsnap.model import check_format_version
from pgsnap.operations import (
    JSONValue,
    Operation,
    OperationRegistry,
    default_operations,
    encode_params,
    refs_in,
)

__all__ = ["PLAN_FORMAT_VERSION", "Plan", "Step"]

PLAN_FORMAT_VERSION: Final = "2.0"
"""Format version of plan documents. 2.0: steps are registered operations, plans
have an identity. Plans of format 1.x (pgsnap 0.1) are refused: make a new plan."""


def _frozen_params(value: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
    try:
        # Normalise through JSON: proves the params are plain data, copies them,
        # and makes equality and digests independent of key order.
        return dict(json.loads(json.dumps(dict(value), sort_keys=True)))
    except (TypeError, ValueError) as exc:
        raise FormatError(f"step parameters must be plain JSON data: {exc}") from exc


@frozen
class Step:
    """One step of a plan: an operation, why it is there, and what undoes it.

    ``id`` is stable (the journal and events refer to it); ``action`` names
    the operation (``"db.stop_server"``...) and ``params`` are its parameters
    as plain data; ``compensation`` names the operation that undoes the step
    on failure (None: nothing to undo, or it cannot be undone and ``reason``
    says so), run with ``compensation_params``. Build steps with :meth:`of`.
    """

    id: str
    action: str
    description: str
    reason: str
    params: Mapping[str, JSONValue] = attrs.field(factory=dict, converter=_frozen_params)
    compensation: str | None = None
    compensation_params: Mapping[str, JSONValue] = attrs.field(
        factory=dict, converter=_frozen_params
    )

    @classmethod
    def of(
        cls,
        step_id: str,
        operation: Operation,
        *,
        description: str,
        reason: str,
        undo: Operation | None = None,
    ) -> Step:
        """A step running ``operation``, undone by ``undo`` (None: nothing to undo)."""
        return cls(
            id=step_id,
            action=operation.name,
            description=description,
            reason=reason,
            params=encode_params(operation),
            compensation=None if undo is None else undo.name,
            compensation_params={} if undo is None else encode_params(undo),
        )

    def operation(self, registry: OperationRegistry | None = None) -> Operation:
        """The step's operation, built from its parameters."""
        return (registry or default_operations()).build(self.action, self.params, step_id=self.id)

    def undo_operation(self, registry: OperationRegistry | None = None) -> Operation | None:
        """The compensation's operation (None when the step has none)."""
        if self.compensation is None:
            return None
        try:
            return (registry or default_operations()).build(
                self.compensation, self.compensation_params, step_id=self.id
            )
        except InvalidPlanError as exc:
            raise InvalidPlanError(
                f"the compensation of {exc.message}",
                hint=exc.hint,
                step_id=self.id,
                action=self.compensation,
            ) from exc

    def to_dict(self) -> dict[str, JSONValue]:
        """Plain data for JSON."""
        return {
            "id": self.id,
            "action": self.action,
            "description": self.description,
            "reason": self.reason,
            "params": dict(self.params),
            "compensation": self.compensation,
            "compensation_params": dict(self.compensation_params),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> Step:
        """Rebuild from :meth:`to_dict` output (unknown keys ignored)."""
        try:
            return cls(
                id=str(data["id"]),
                action=str(data["action"]),
                description=str(data.get("description", "")),
                reason=str(data.get("reason", "")),
                params=data.get("params") or {},
                compensation=data.get("compensation"),
                compensation_params=data.get("compensation_params") or {},
            )
        except KeyError as exc:
            raise FormatError(f"a plan step needs {exc.args[0]!r}") from exc


def _steps(values: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(values)


def _texts(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _text_map(mapping: Mapping[str, str]) -> dict[str, str]:
    return dict(mapping)


def validate_steps(steps: tuple[Step, ...], registry: OperationRegistry) -> None:
    """Refuse steps that cannot run: duplicate ids, unknown operations, bad parameters,
    a compensation the operation does not declare, references to later steps."""
    seen: set[str] = set()
    for step in steps:
        if step.id in seen:
            raise InvalidPlanError(
                f"step id {step.id!r} appears twice", step_id=step.id, action=step.action
            )
        op = step.operation(registry)
        for ref in refs_in(op):
            if ref.step not in seen:
                raise InvalidPlanError(
                    f"step {step.id} refers to the outputs of {ref.step!r}, which is not an "
                    "earlier step",
                    step_id=step.id,
                    action=step.action,
                )
        seen.add(step.id)
        undo = step.undo_operation(registry)
        if undo is None:
            continue
        if undo.name != op.compensation:
            declared = op.compensation or "nothing"
            raise InvalidPlanError(
                f"step {step.id}: {step.action} is undone by {declared}, not by {undo.name}",
                hint="use the compensation the operation declares (or none)",
                step_id=step.id,
                action=step.action,
            )
        for ref in refs_in(undo):
            if ref.step not in seen:
                raise InvalidPlanError(
                    f"the compensation of step {step.id} refers to {ref.step!r}, which is "
                    "neither that step nor an earlier one",
                    step_id=step.id,
                    action=step.action,
                )


@frozen
class Plan:
    """An ordered, explained plan (a backup or a recovery).

    ``fingerprint`` is a digest of the facts the plan was made from; the
    executor re-observes and refuses the plan when they changed.
    ``summary`` holds the headline facts (backup chosen, target, window...),
    ``request`` the request it answers (so it can be made again), ``kept`` and
    ``lost`` say in words what survives and what is given up, ``warnings``
    are findings that do not block. :attr:`id` is the plan's identity.
    """

    kind: str
    steps: tuple[Step, ...] = attrs.field(converter=_steps)
    fingerprint: str
    summary: Mapping[str, str] = attrs.field(factory=dict, converter=_text_map)
    request: Mapping[str, JSONValue] = attrs.field(factory=dict, converter=_frozen_params)
    kept: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    lost: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    warnings: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    id: str = attrs.field(init=False, eq=False)
    """A digest (sha256, hex) of the plan's whole content: its identity."""

    def __attrs_post_init__(self) -> None:
        validate_steps(self.steps, default_operations())
        blob = json.dumps(self._content(), sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "id", hashlib.sha256(blob.encode()).hexdigest())

    def _content(self) -> dict[str, JSONValue]:
        return {
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "summary": dict(self.summary),
            "request": dict(self.request),
            "kept": list(self.kept),
            "lost": list(self.lost),
            "warnings": list(self.warnings),
            "steps": [s.to_dict() for s in self.steps],
        }

    def step(self, step_id: str) -> Step:
        """The step with ``step_id`` (``KeyError`` if absent)."""
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    @property
    def point_of_no_return(self) -> str | None:
        """The id of the first barrier step: once it starts, nothing before it is undone."""
        for s in self.steps:
            if s.operation().barrier:
                return s.id
        return None

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, JSONValue]:
        """Plain data with ``format_version`` and ``id``.

        Each step also says its operation's ``target``; the plan says its
        ``point_of_no_return``. Both are derived, for readers (a caller's own
        executor); they are ignored when the plan is loaded.
        """
        content = self._content()
        for data, step in zip(content["steps"], self.steps, strict=True):
            data["target"] = step.operation().target.value
        return {
            "format_version": PLAN_FORMAT_VERSION,
            "type": "Plan",
            "id": self.id,
            "point_of_no_return": self.point_of_no_return,
            **content,
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """The plan as a JSON document."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> Plan:
        """Rebuild from :meth:`to_dict`; refuses other major format versions and edited plans."""
        version = data.get("format_version")
        if isinstance(version, str) and version.split(".")[0] == "1":
            raise FormatError(
                f"this plan has format {version}, written by an older pgsnap whose plans "
                "this version does not run",
                hint="make a new plan with this version of pgsnap",
            )
        check_format_version(data, "plan", ours=PLAN_FORMAT_VERSION)
        try:
            plan = cls(
                kind=str(data["kind"]),
                steps=tuple(Step.from_dict(s) for s in data["steps"]),
                fingerprint=str(data["fingerprint"]),
                summary={str(k): str(v) for k, v in (data.get("summary") or {}).items()},
                request=data.get("request") or {},
                kept=tuple(data.get("kept") or ()),
                lost=tuple(data.get("lost") or ()),
                warnings=tuple(data.get("warnings") or ()),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"malformed plan document: {exc}") from exc
        claimed = data.get("id")
        if claimed is None:
            raise FormatError(
                'the plan has no "id": a plan runs only as it was made and reviewed',
                hint="make a new plan (pgsnap plan-recovery --json, Cluster.plan_recovery); "
                "to change what it does, change the request (--backup, the target, --wal-lost)",
                actual=plan.id,
            )
        if claimed != plan.id:
            raise FormatError(
                "the plan's content does not match its id: it was changed after it was made",
                hint="make a new plan (a plan runs as it was reviewed); to change what it "
                "does, change the request (--backup, the target, --wal-lost)",
                claimed=str(claimed),
                actual=plan.id,
            )
        return plan

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """Rebuild from :meth:`to_json` output."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FormatError(f"a plan must be JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise FormatError("a plan document is a JSON object")
        return cls.from_dict(data)

    # ------------------------------------------------------------------ display

    def explain(self) -> str:
        """The plan for a human: what will happen, why, what is kept and lost."""
        head = f"{self.kind.capitalize()} plan {self.id[:12]} ({len(self.steps)} steps"
        out = [f"{head}, facts {self.fingerprint[:12]})"]
        if self.summary:
            width = max(len(k) for k in self.summary)
            out += [f"  {k.ljust(width)}  {v}" for k, v in self.summary.items()]
        if self.kept:
            out.append("Kept:")
            out += [f"  + {k}" for k in self.kept]
        if self.lost:
            out.append("Lost:")
            out += [f"  - {k}" for k in self.lost]
        if self.warnings:
            out.append("Warnings:")
            out += [f"  ! {w}" for w in self.warnings]
        out.append("Steps:")
        barrier = self.point_of_no_return
        for n, s in enumerate(self.steps, 1):
            if s.id == barrier:
                out.append(
                    "  -- point of no return: once the next step starts, nothing is undone --"
                )
            out.append(f"  {n:2}. {s.description}  [{s.id}]")
            out.append(f"      why: {s.reason}")
            if s.compensation:
                out.append(f"      undo: {s.compensation}")
        return "\n".join(out)

    def __repr__(self) -> str:
        return (
            f"<Plan {self.kind} {self.id[:12]} steps={len(self.steps)} "
            f"facts={self.fingerprint[:12]}>"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        p.text(repr(self) if cycle else self.explain())

    def _repr_html_(self) -> str:
        e = html.escape
        barrier = self.point_of_no_return
        rows = "".join(
            (
                "<tr><td colspan='5'><i>point of no return: once the next step starts, "
                "nothing is undone</i></td></tr>"
                if s.id == barrier
                else ""
            )
            + f"<tr><td>{n}</td><td><code>{e(s.id)}</code></td><td>{e(s.description)}</td>"
            f"<td>{e(s.reason)}</td><td>{e(s.compensation or '')}</td></tr>"
            for n, s in enumerate(self.steps, 1)
        )
        summary = "".join(
            f"<tr><th style='text-align:left'>{e(k)}</th><td>{e(v)}</td></tr>"
            for k, v in self.summary.items()
        )
        lists = ""
        for title, items in (("Kept", self.kept), ("Lost", self.lost), ("Warnings", self.warnings)):
            if items:
                lists += (
                    f"<p><b>{title}</b></p><ul>"
                    + "".join(f"<li>{e(i)}</li>" for i in items)
                    + "</ul>"
                )
        return (
            f"<div><p><b>{e(self.kind.capitalize())} plan</b> <code>{e(self.id[:12])}</code> "
            f"({len(self.steps)} steps, facts <code>{e(self.fingerprint[:12])}</code>)</p>"
            f"<table>{summary}</table>{lists}"
            "<table><tr><th>#</th><th>id</th><th>step</th><th>why</th><th>undo</th></tr>"
            f"{rows}</table></div>"
        )
