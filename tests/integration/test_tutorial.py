"""docs/tutorial.ipynb runs top to bottom in a real Jupyter kernel (issue 26).

The notebook makes its own throwaway PostgreSQL cluster, takes backups, draws the
timeline, plans and runs a recovery and checks the rows itself (its last cells
assert). Here it is executed with nbclient; any cell that raises fails the test,
and the pictures and the progress display must be in the outputs. The executed
notebook is kept as a test artefact (``test-artifacts/tutorial.ipynb``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_tutorial_notebook_runs_top_to_bottom(
    pg_bindir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat", reason="nbformat comes with the test extras")
    nbclient = pytest.importorskip("nbclient", reason="nbclient comes with the test extras")
    notebook = nbformat.read(ROOT / "docs" / "tutorial.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
    )
    # The kernel (a child process) finds the PostgreSQL the tests use.
    monkeypatch.setenv("PGSNAP_PG_BINDIR", str(pg_bindir))
    client.execute()  # raises CellExecutionError, with the cell and its traceback
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    html = [o["data"].get("text/html", "") for o in outputs if "data" in o]
    assert sum("<svg" in h for h in html) >= 2  # the timeline, then with the plan's target
    assert any('class="target' in h for h in html)  # the plan's target: a line or a note
    assert any("Recovery plan" in h for h in html)  # the plan's table
    shown = [o for o in outputs if o.get("output_type") in ("display_data", "update_display_data")]
    assert any("running:" in str(o) or "finished" in str(o) for o in shown)  # progress
    artifacts = Path(os.environ.get("PGSNAP_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, artifacts / "tutorial.ipynb")
