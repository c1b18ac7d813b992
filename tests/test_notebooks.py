"""Execute the notebooks against the fixtures (nbclient), so they never rot; check that
TraceSet and result objects render as HTML tables."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the dev extra (nbformat)")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need the dev extra (nbclient)")
pytest.importorskip("ipykernel", reason="notebook tests need the dev extra (ipykernel)")


@pytest.fixture(scope="module")
def executed() -> dict[str, object]:
    """Every notebook executed, concurrently (one kernel each), from the repository root."""
    import asyncio

    async def run_all() -> dict[str, object]:
        books = {p.stem: nbformat.read(p, as_version=4) for p in NOTEBOOKS}
        clients = [nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                           resources={"metadata": {"path": str(REPO)}})
                   for nb in books.values()]
        await asyncio.gather(*(c.async_execute() for c in clients))
        return books

    return asyncio.run(run_all())


def _html_outputs(nb) -> list[str]:
    return [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "text/html" in o.get("data", {})]


def test_two_small_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == ["explore_multirank.ipynb", "nsys_export.ipynb"]
    for p in NOTEBOOKS:
        assert p.stat().st_size < 20_000  # stored without outputs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, executed: dict[str, object]) -> None:
    nb = executed[path.stem]
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert errors == []
    html = _html_outputs(nb)
    assert any("<TraceSet" in h for h in html)  # TraceSet renders as a table
    assert sum("<table" in h for h in html) >= 3
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures, "the plotly figures rendered as plotly outputs"
    if path.stem == "explore_multirank":
        assert any("Run comparison" in h and "Mann" in h for h in html)  # DiffResult
