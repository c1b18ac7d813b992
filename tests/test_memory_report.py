"""The report's memory section: a timeline per rank with the peak marked, from ``run.memory``."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import polars as pl
import pytest

import traceview
from test_memory_traces import gpu_totals_trace
from traceview.outputs.report import gather, render_body, write_html

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def test_memory_section_marks_each_peak(tmp_path: Path) -> None:
    run = traceview.open(gpu_totals_trace(tmp_path / "gpu.json"), cache=False)
    data = gather(run)
    peaks = data.memory_peaks.sort("device")
    assert peaks.select("device", "peak_allocated_bytes").rows() == [("cpu", 64),
                                                                      ("cuda:0", 800_000)]
    # the first allocator event is at 20 µs: the cuda:0 peak (120 µs) is drawn at 0.1 ms
    assert peaks.filter(pl.col("device") == "cuda:0")["peak_ms"].item() == pytest.approx(0.1)
    assert data.memory_points["allocated_bytes"].max() == 800_000  # the peak survives thinning
    body, _ = render_body(data)
    section = body[body.index('<section id="memory">'):]
    assert "peak r0 cuda:0" in section and "aten::cat" in section
    assert any("near the limit" in w for w in data.warnings)  # every warning reaches it
    out = io.StringIO()
    write_html(data, out)
    assert '<a href="#memory">Memory</a>' in out.getvalue()


def test_no_memory_section_without_allocator_events() -> None:
    data = gather(traceview.open(FIXTURES / "gloo_ddp_2r", cache=False))
    assert data.memory_peaks.height == 0 and "memory" not in data.notes
    body, figures = render_body(data)
    assert 'id="memory"' not in body and 'href="#memory"' not in body
    # the page without allocator events draws exactly the figures of its other sections
    assert figures == render_body(dataclasses.replace(data, memory_points=pl.DataFrame()))[1]


def test_real_cpu_fixture_report_shows_the_leak() -> None:
    data = gather(traceview.open(FIXTURES / "cpu_memory", cache=False))
    row = data.memory_peaks.row(0, named=True)
    assert row["leak_suspected"] and row["device"] == "cpu"
    assert any("a leak?" in w for w in data.warnings)


def test_memory_section_renders_in_headless_chromium_and_escapes_names(tmp_path: Path) -> None:
    """The memory figure renders (one plot more than the page without it), with no script
    error, and an op named like markup at the peak shows as text, in the table and the
    figure."""
    from page_probe import probe
    from test_memory_traces import mem, op, steps
    from tests.test_report_browser import _chromium

    from helpers import write_trace

    evil = "<img src=x onerror=alert(1)>"
    browser = _chromium()
    trace = write_trace(tmp_path / "evil.json", [
        *steps(0, 100, 200), op(evil, 40, 20), mem(10, 100, 100, 200), mem(50, 400, 500, 600),
        mem(150, -300, 200, 600)], distributedInfo={"rank": 0, "world_size": 1})
    data = gather(traceview.open(trace, cache=False))
    assert data.memory_peaks["peak_op"].to_list() == [evil]
    buf = io.StringIO()
    figures = write_html(data, buf)
    without = render_body(dataclasses.replace(data, memory_peaks=pl.DataFrame()))[1]
    assert figures == without + 1
    assert evil not in buf.getvalue()
    status = probe(browser, buf.getvalue(), tmp_path / "page", needle=evil)
    assert status["errors"] == [] and status["alerts"] == 0 and status["imgs"] == 0
    assert status["plots"] == figures and status["rendered"] == figures
    assert status["cells"] >= 1  # the peaks table shows the name as text
