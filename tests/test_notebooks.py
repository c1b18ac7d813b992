"""Execute the notebooks the way people do, so they never rot: ``jupyter nbconvert --to notebook
--execute`` in a subprocess, once from the notebooks' folder and once from another folder with
the notebooks' paths given (Jupyter starts the kernel in the notebook's folder either way, so the
notebooks must find their data from there). Check that TraceSet and result objects render as
HTML tables, and that the walkthrough is stored with outputs a viewer without a kernel shows."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import REPO

FOLDER = REPO / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
#: Stored with their outputs (a figure-heavy read on GitHub); the others are stored empty.
WITH_OUTPUTS = {"gpu_walkthrough"}
PLOTLY, PNG = "application/vnd.plotly.v1+json", "image/png"

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the dev extra (nbformat)")
pytest.importorskip("nbconvert", reason="notebook tests need the dev extra (nbconvert)")
pytest.importorskip("ipykernel", reason="notebook tests need the dev extra (ipykernel)")
pytest.importorskip("matplotlib", reason="notebook tests need the dev extra (matplotlib)")


def _nbconvert(cwd: Path, notebooks: list[str], out: Path, cache: Path) -> None:
    """``jupyter nbconvert --to notebook --execute`` on ``notebooks``, started in ``cwd``."""
    env = {**os.environ, "TRACEVIEW_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.timeout=300", "--output-dir", str(out), *notebooks],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"nbconvert in {cwd} failed:\n{done.stderr[-6000:]}"


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], object]:
    """Every notebook executed from the notebooks' folder ("here") and from an unrelated folder
    ("elsewhere"); the two runs go side by side. Keys: (how, notebook stem)."""
    tmp = tmp_path_factory.mktemp("notebooks")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    runs = {"here": (FOLDER, [p.name for p in NOTEBOOKS]),
            "elsewhere": (elsewhere, [str(p) for p in NOTEBOOKS])}
    with ThreadPoolExecutor(len(runs)) as pool:
        for job in [pool.submit(_nbconvert, cwd, names, tmp / how, tmp / f"cache-{how}")
                    for how, (cwd, names) in runs.items()]:
            job.result()
    return {(how, p.stem): nbformat.read(tmp / how / p.name, as_version=4)
            for how in runs for p in NOTEBOOKS}


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _html_outputs(nb) -> list[str]:
    return [o["data"]["text/html"] for o in _outputs(nb) if "text/html" in o.get("data", {})]


def test_the_notebooks_and_how_they_are_stored() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "explore_multirank.ipynb", "gpu_walkthrough.ipynb", "nsys_export.ipynb"]
    for p in NOTEBOOKS:
        nb = nbformat.read(p, as_version=4)
        if p.stem not in WITH_OUTPUTS:
            assert _outputs(nb) == [] and p.stat().st_size < 20_000
            continue
        assert p.stat().st_size < 400_000  # small enough to read on GitHub
        text = p.read_text()
        assert str(REPO) not in text and "/home/" not in text  # no machine's folders saved
        assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
        assert not [o for o in _outputs(nb) if o["output_type"] == "error"]
        figures = [o["data"] for o in _outputs(nb) if PLOTLY in o.get("data", {})]
        assert len(figures) >= 3 and all(PNG in f for f in figures)  # static beside each


@pytest.mark.parametrize("how", ["here", "elsewhere"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, how: str, executed: dict[tuple[str, str], object]) -> None:
    nb = executed[how, path.stem]
    assert [o for o in _outputs(nb) if o.get("output_type") == "error"] == []
    html = _html_outputs(nb)
    assert any("<TraceSet" in h for h in html)  # TraceSet renders as a table
    assert sum("<table" in h for h in html) >= 3
    figures = [o["data"] for o in _outputs(nb) if PLOTLY in o.get("data", {})]
    assert figures, "the plotly figures rendered as plotly outputs"
    if path.stem == "explore_multirank":
        assert any("Run comparison" in h and "Mann" in h for h in html)  # DiffResult
    if path.stem in WITH_OUTPUTS:
        assert all(PNG in f for f in figures)
        text = "".join(o.get("text", "") for o in _outputs(nb) if o["output_type"] == "stream")
        assert "save ~" in text  # the diagnosis' findings were printed


def _pointed_at(source: Path, dest: Path, **params: str) -> None:
    """The notebook copied to ``dest`` with its parameters cell set, as a user edits it."""
    nb = nbformat.read(source, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    for name, value in params.items():
        assert f"{name} = None" in cell.source
        cell.source = cell.source.replace(f"{name} = None", f"{name} = {value!r}")
    nbformat.write(nb, dest)


def test_notebooks_copied_out_of_the_checkout_read_the_trace_they_are_given(tmp_path: Path):
    """The notebooks alone, copied to a folder outside any checkout, each pointed at a trace
    by its parameters cell: they run with the traceview the tests run (no checkout above to
    find, no fixtures/ to import), and render their tables."""
    import traceview
    from fixtures.nsys_synthetic import write_export

    data = REPO / "fixtures" / "data"
    export = tmp_path / "traces" / "trace_rank0.sqlite"
    export.parent.mkdir()
    write_export(export, ranks=1, steps=3)
    given = {"gpu_walkthrough": {"TRACE": str(data / "gpu_real")},
             "explore_multirank": {"TRACE": str(data / "gloo_ddp_2r_slow1"),
                                   "BASELINE": str(data / "gloo_ddp_2r")},
             "nsys_export": {"TRACE": str(export)}}
    folder = tmp_path / "my-notebooks"
    folder.mkdir()
    for path in NOTEBOOKS:
        _pointed_at(path, folder / path.name, **given[path.stem])
    # the kernel imports traceview from where this test does (installed, or the sources)
    # and nothing else of the checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.update(PYTHONPATH=str(Path(traceview.__file__).resolve().parents[1]),
               PYTHONSAFEPATH="1", TRACEVIEW_CACHE_DIR=str(tmp_path / "cache"))
    if (Path(env["PYTHONPATH"]) / "fixtures").is_dir():
        # traceview is the checkout's sources: give the kernel a folder holding them alone
        alone = tmp_path / "site"
        alone.mkdir()
        (alone / "traceview").symlink_to(Path(traceview.__file__).resolve().parent)
        env["PYTHONPATH"] = str(alone)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.timeout=300", "--output-dir", str(out),
         *[p.name for p in NOTEBOOKS]],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-6000:]
    for path in NOTEBOOKS:
        nb = nbformat.read(out / path.name, as_version=4)
        assert [o for o in _outputs(nb) if o.get("output_type") == "error"] == []
        html = _html_outputs(nb)
        assert any("<TraceSet" in h for h in html) and sum("<table" in h for h in html) >= 3
        text = "".join(o.get("text", "") for o in _outputs(nb) if o["output_type"] == "stream")
        assert "set BASELINE" not in text
