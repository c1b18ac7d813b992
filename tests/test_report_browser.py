"""The HTML report in headless Chromium: loads without errors, every plot renders, names from
traces show as text and run no script, nothing is fetched from the network.

The page is opened through ``tests/page_probe.py``: a status script injected first in
``<head>`` records errors, alerts and requests and, at the load event, the page's height and
each figure's height and drawn marks. Nothing here times anything (the load time is
``benchmarks/report_scale.py``'s).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tests.page_probe import chromium, instrumented, launch, probe, status
from tests.test_report_trace import EVIL, EVIL_OP, two_rank_trace
from traceview.outputs.report import gather, write_html

pytest.importorskip("plotly")

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"

def _chromium() -> str:
    path = chromium()
    if path is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    return path


def _report(events, **kw) -> str:
    buf = io.StringIO()
    write_html(gather(events, **kw), buf)
    return buf.getvalue()


def test_reports_render_in_headless_chromium(tmp_path: Path) -> None:
    import traceview

    browser = _chromium()
    gpu = tmp_path / "gpu.html"
    gpu.write_text(instrumented(_report(two_rank_trace()), EVIL), encoding="utf-8")
    ts = traceview.open(FIX / "gloo_ddp_2r_slow1", cache=False)
    cpu = tmp_path / "cpu.html"
    cpu.write_text(instrumented(_report(ts), "rank 1"), encoding="utf-8")
    procs = [launch(browser, gpu, tmp_path / "p1"), launch(browser, cpu, tmp_path / "p2")]
    gpu_status, cpu_status = (status(p) for p in procs)

    # the CPU-only report says in a sentence what it cannot draw (breakdown, gaps)
    for st, figures in ((gpu_status, 6), (cpu_status, 4)):
        assert st["errors"] == []
        assert st["plots"] == figures and st["rendered"] == figures
        assert all(f["marks"] > 0 for f in st["figures"]), st["figures"]
        assert st["alerts"] == 0 and st["imgs"] == 0
        assert st["remote"] == []
        assert st["scripts"] == 2 + figures  # status + plotly.js + one per figure
    # the hostile kernel name is text: in the kernel table, and in the bar chart's labels
    assert gpu_status["cells"] >= 1
    assert gpu_status["svg_texts"] >= 1
    # the CPU-only report still names the straggler, in the text a reader sees
    assert cpu_status["text_has"]


def test_hostile_op_name_in_cpu_table_is_text(tmp_path: Path) -> None:
    """The host-op table (shown when there are no kernels) escapes names too."""
    import polars as pl

    ev = two_rank_trace().filter(pl.col("kind").cast(pl.String) != "kernel")
    page = _report(ev)
    assert EVIL_OP not in page and "&lt;script&gt;alert(2)&lt;/script&gt;" in page


# ----------------------------------------------------------------------------- at scale
#: The bounds of issue 11 (docs/report.md) a page must keep at any scale.
MAX_PAGE_PX = 12_000
MAX_FIGURE_PX = 1_600
MAX_HTML_BYTES = 10_000_000


def _scale_page(tmp_path: Path, ranks: int, steps: int) -> tuple[str, object, object]:
    """A generated run's report (through the CLI, as a user writes it) and its truth."""
    from fixtures.cluster_runs import many_ranks
    from traceview.cli import main

    truth = many_ranks(tmp_path / "run", ranks=ranks, steps=steps)
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(out), "--cache-dir",
                 str(tmp_path / "cache")]) == 0
    return out.read_text(encoding="utf-8"), truth, out


def _check_bounds(st: dict, page: str) -> None:
    assert st["errors"] == [] and st["alerts"] == 0 and st["remote"] == []
    assert st["plots"] == st["rendered"] > 0
    assert st["height"] <= MAX_PAGE_PX, st["height"]
    assert max(f["height"] for f in st["figures"]) <= MAX_FIGURE_PX, st["figures"]
    assert all(f["marks"] > 0 for f in st["figures"]), st["figures"]  # no empty figure
    assert len(page.encode()) <= MAX_HTML_BYTES


def test_report_of_256_ranks_stays_readable(tmp_path: Path) -> None:
    """256 ranks x 12 steps: within the page bounds, and the slow rank is named in the text
    a reader sees (not only in a collapsed table)."""
    browser = _chromium()
    page, truth, _ = _scale_page(tmp_path, 256, 12)
    needle = f"Worst straggler: rank {truth.slow_rank}"
    st = probe(browser, page, tmp_path / "probe", needle=needle)
    _check_bounds(st, page)
    assert st["text_has"], needle
    # a distribution, not a bar per rank: the tables show their top rows, the rest collapsed
    assert page.count("<details>") >= 4
    assert "Across 256 ranks" in page


def test_report_of_a_long_run_bins_its_steps(tmp_path: Path) -> None:
    """8 ranks x 600 steps: past 300 steps the heatmap and the series are binned, the
    slowest steps named one by one."""
    browser = _chromium()
    page, truth, _ = _scale_page(tmp_path, 8, 600)
    st = probe(browser, page, tmp_path / "probe",
               needle=f"Worst straggler: rank {truth.slow_rank}")
    _check_bounds(st, page)
    assert st["text_has"]
    assert "each column: 2 steps, the slowest shown" in page
    assert "Slowest steps: step " in page


# ------------------------------------------------------------------- verdict first, any width
@pytest.mark.parametrize("width", [1280, 1920])
def test_the_first_screen_is_the_verdict_and_nothing_is_wider_than_the_page(
        tmp_path: Path, width: int) -> None:
    """A CPU multi-rank run and a synthetic GPU run: the verdict opens the page in the words
    of the CLI (``diagnose``'s first finding, ``summary``'s worst straggler), the CPU-only run
    says "no GPU events" once, and no section makes the page scroll sideways."""
    import polars as pl

    import traceview
    from fixtures.synthetic import SyntheticSpec, generate
    from traceview.outputs.words import finding_headline, straggler_sentence

    browser = _chromium()
    generate(SyntheticSpec(world_size=2, steps=3), tmp_path / "gpu")
    runs = {"cpu": traceview.open(FIX / "gloo_ddp_4r_noisy_slow2", cache=False),
            "gpu": traceview.open(tmp_path / "gpu", cache=False)}
    procs = {}
    for name, run in runs.items():
        page = tmp_path / f"{name}.html"
        page.write_text(instrumented(_report(run)), encoding="utf-8")
        procs[name] = launch(browser, page, tmp_path / f"profile-{name}", width=width)
    seen = {name: status(proc) for name, proc in procs.items()}
    for name, st in seen.items():
        run = runs[name]
        assert st["errors"] == []
        assert st["width"] <= st["viewport"], (name, st["width"], st["viewport"])
        assert st["verdict_top"] is not None and st["verdict_top"] < 200
        first = run.diagnose()["findings"].filter(pl.col("severity") != "info").row(
            0, named=True)
        assert finding_headline(first) in st["verdict_text"]
        worst = straggler_sentence(run.summary()["worst_straggler"])
        assert worst[:1].upper() + worst[1:] in st["verdict_text"]
    assert "Worst straggler: rank 2" in seen["cpu"]["verdict_text"]
    assert seen["cpu"]["no_gpu_mentions"] == 1
    assert seen["gpu"]["no_gpu_mentions"] == 0
