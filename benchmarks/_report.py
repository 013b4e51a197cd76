"""What the benchmarks share: Markdown tables, the description of the machine, a
program's one-line answer and SIGTERM as Ctrl-C (so a killed run cleans up)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

_HERE = Path(__file__).resolve().parent


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """``rows`` under ``header`` as a Markdown table, columns padded to their width."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
        for r in rows
    ]
    return "\n".join([line, sep, *body])


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``?``."""
    return next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )


def memory_bytes() -> int:
    """Total memory (``/proc/meminfo``), 0 if unknown."""
    return next(
        (
            int(line.split()[1]) * 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )


def _git(*args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(_HERE.parent), *args], capture_output=True, text=True, check=False
    )
    return proc.stdout


def git_commit() -> str:
    """The checkout's short commit id; in a tree exported by ``git archive`` (as the
    figures are best taken: compiled, no uncommitted change), the commit it was exported
    from, which git writes into ``_commit.txt`` (``export-subst``); else empty."""
    found = _git("rev-parse", "--short", "HEAD").strip()
    if found:
        return found
    try:
        exported = (_HERE / "_commit.txt").read_text().strip()
    except OSError:
        return ""
    return "" if exported.startswith("$") else exported


def uncommitted(path: str = "pgsnap") -> list[str]:
    """The paths under ``path`` (of the checkout) with uncommitted changes."""
    return [line[3:] for line in _git("status", "--porcelain", path).splitlines() if line.strip()]


def sh(argv: Sequence[str]) -> str:
    """What a program prints (its error output if it prints nothing else), or why it
    could not run: for the description of the machine."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"({exc})"
    return (proc.stdout or proc.stderr).strip()


def raise_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    """A SIGTERM handler: raise KeyboardInterrupt, so the run's cleanup runs as on Ctrl-C."""
    raise KeyboardInterrupt("SIGTERM")
