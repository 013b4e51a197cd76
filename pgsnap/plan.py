"""Plans as data: ordered steps, each with its reason and its compensation.

A :class:`Plan` is what the pure planners (:mod:`pgsnap.planner`) return and
what the :class:`~pgsnap.executor.Executor` runs. It is plain data: it
round-trips through JSON (``format_version``), explains itself in text
(:meth:`Plan.explain`), renders as a table in a notebook (``_repr_html_``), and
holds no secret. A caller may run it with pgsnap's executor or with its own:
each step's ``action`` names one operation and ``params`` are its arguments.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from pgsnap.errors import FormatError
from pgsnap.model import FORMAT_VERSION, check_format_version

__all__ = ["Plan", "Step"]

JSONValue = Any
"""A value that ``json.dumps`` accepts (str, int, float, bool, None, lists, dicts)."""


def _frozen_params(value: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
    try:
        # Normalise through JSON: proves the params are plain data, copies them,
        # and makes equality and fingerprints independent of key order.
        return dict(json.loads(json.dumps(dict(value), sort_keys=True)))
    except (TypeError, ValueError) as exc:
        raise FormatError(f"step parameters must be plain JSON data: {exc}") from exc


@attrs.frozen
class Step:
    """One step of a plan.

    ``id`` is stable (the journal and events refer to it); ``action`` is the
    operation (``"db.stop_server"``, ``"storage.restore_volume"``...);
    ``reason`` says why the step is there; ``compensation`` is the action that
    undoes it on failure (``None``: nothing to undo, or it cannot be undone
    and ``reason`` says so), run with ``compensation_params``.
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


def _unique_ids(inst: Plan, _attr: object, steps: tuple[Step, ...]) -> None:
    seen: set[str] = set()
    for step in steps:
        if step.id in seen:
            raise FormatError(f"plan {inst.kind}: step id {step.id!r} appears twice")
        seen.add(step.id)


@attrs.frozen
class Plan:
    """An ordered, explained plan (a backup or a recovery).

    ``fingerprint`` is a digest of the facts the plan was made from; the
    executor re-observes and refuses the plan when they changed.
    ``summary`` holds the headline facts (backup chosen, target, window...),
    ``kept`` and ``lost`` say in words what survives and what is given up,
    ``warnings`` are findings that do not block.
    """

    kind: str
    steps: tuple[Step, ...] = attrs.field(converter=_steps, validator=_unique_ids)
    fingerprint: str
    summary: Mapping[str, str] = attrs.field(factory=dict, converter=_text_map)
    request: Mapping[str, JSONValue] = attrs.field(factory=dict, converter=_frozen_params)
    """The request the plan was made for (plain data), so it can be re-planned."""
    kept: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    lost: tuple[str, ...] = attrs.field(default=(), converter=_texts)
    warnings: tuple[str, ...] = attrs.field(default=(), converter=_texts)

    def step(self, step_id: str) -> Step:
        """The step with ``step_id`` (``KeyError`` if absent)."""
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    # ------------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, JSONValue]:
        """Plain data with ``format_version``."""
        return {
            "format_version": FORMAT_VERSION,
            "type": "Plan",
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "summary": dict(self.summary),
            "request": dict(self.request),
            "kept": list(self.kept),
            "lost": list(self.lost),
            "warnings": list(self.warnings),
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """The plan as a JSON document."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, JSONValue]) -> Plan:
        """Rebuild from :meth:`to_dict`; refuses another major format version."""
        check_format_version(data, "plan")
        try:
            return cls(
                kind=str(data["kind"]),
                steps=tuple(Step.from_dict(s) for s in data["steps"]),
                fingerprint=str(data["fingerprint"]),
                summary={str(k): str(v) for k, v in (data.get("summary") or {}).items()},
                request=data.get("request") or {},
                kept=tuple(data.get("kept") or ()),
                lost=tuple(data.get("lost") or ()),
                warnings=tuple(data.get("warnings") or ()),
            )
        except (KeyError, TypeError) as exc:
            raise FormatError(f"malformed plan document: {exc}") from exc

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
        head = f"{self.kind.capitalize()} plan ({len(self.steps)} steps"
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
        for n, s in enumerate(self.steps, 1):
            out.append(f"  {n:2}. {s.description}  [{s.id}]")
            out.append(f"      why: {s.reason}")
            if s.compensation:
                out.append(f"      undo: {s.compensation}")
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<Plan {self.kind} steps={len(self.steps)} fp={self.fingerprint[:12]}>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        p.text(repr(self) if cycle else self.explain())

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>{n}</td><td><code>{e(s.id)}</code></td><td>{e(s.description)}</td>"
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
            f"<div><p><b>{e(self.kind.capitalize())} plan</b> "
            f"({len(self.steps)} steps, facts <code>{e(self.fingerprint[:12])}</code>)</p>"
            f"<table>{summary}</table>{lists}"
            "<table><tr><th>#</th><th>id</th><th>step</th><th>why</th><th>undo</th></tr>"
            f"{rows}</table></div>"
        )
