"""What the benchmarks share: printing their results as Markdown tables."""

from __future__ import annotations

from collections.abc import Sequence


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
