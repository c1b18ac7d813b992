"""The report as a newcomer reads it (issue 48, item 9): plotly.js shared or from the CDN
instead of 4.9 MB in every file, the verdict's words, readable roofline axes, a gaps table
that fits the page, routine alignment notes out of the warnings box."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from traceview.cli import main

pytest.importorskip("plotly", reason="the report needs the plots extra (plotly)")

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gpu_real"


def _report(capsys, out: Path, *extra: str) -> str:
    assert main(["report", str(GPU), "-o", str(out), *extra]) == 0
    capsys.readouterr()
    return out.read_text()


def test_plotly_inline_cdn_or_one_shared_copy(tmp_path: Path, capsys) -> None:
    inline = _report(capsys, tmp_path / "inline.html")
    assert len(inline) > 3_000_000 and "<script type=\"text/javascript\" src=" not in inline
    cdn = _report(capsys, tmp_path / "cdn.html", "--plotly", "cdn")
    assert re.search(r'src="https://cdn\.plot\.ly/plotly-[\d.]+\.min\.js"', cdn)
    shared = tmp_path / "js" / "plotly.min.js"
    shared.parent.mkdir()
    pages = tmp_path / "reports"
    pages.mkdir()
    first = _report(capsys, pages / "a.html", "--plotly", str(shared))
    written = shared.stat().st_mtime_ns
    _report(capsys, pages / "b.html", "--plotly", str(shared))
    assert shared.stat().st_mtime_ns == written  # the same copy, not written again
    assert 'src="../js/plotly.min.js"' in first  # relative to the report's folder
    assert len(first) < len(inline) // 10 and len(cdn) < len(inline) // 10
    # the figures are the same, only where plotly.js comes from differs
    assert first.count("Plotly.newPlot") == inline.count("Plotly.newPlot") > 0


def test_plotly_copy_never_overwrites_an_input(tmp_path: Path, capsys) -> None:
    trace = next(GPU.glob("*.json.gz"))
    before = trace.read_bytes()
    assert main(["report", str(GPU), "-o", str(tmp_path / "r.html"), "--plotly",
                 str(trace)]) == 2
    assert trace.read_bytes() == before


def test_verdict_words_and_roofline_axes(tmp_path: Path, capsys) -> None:
    from traceview.outputs import plots

    html = _report(capsys, tmp_path / "r.html", "--plotly", "cdn")
    assert re.search(r"\((high|medium|low) impact, (high|medium|low) confidence\)", html)
    assert not re.search(r"\((high|medium|low), confidence ", html)
    import traceview

    res = traceview.open(GPU, cache=False).ops()
    fig = plots.roofline(res["ops"], {"tflops": {"fp32": 19.5}, "tb_per_s": 1.5})
    # powers of ten: plotly's SI prefixes wrote "1µ" on a TFLOP/s axis
    assert fig.layout.yaxis.exponentformat == fig.layout.xaxis.exponentformat == "power"


def test_the_largest_gaps_table_has_narrow_name_columns(tmp_path: Path, capsys) -> None:
    html = _report(capsys, tmp_path / "r.html", "--plotly", "cdn")
    assert ".narrow-names td.name{max-width:11em}" in html
    gaps = html.split("<p>Largest gaps:</p>", 1)[1]
    assert gaps.lstrip().startswith('<div class="narrow-names">')


def test_alignment_notes_of_a_one_host_run_are_routine() -> None:
    """On one host the ranks share a clock: how well offsets were estimated changes no time
    shown, so those notes leave the red warnings box; on several hosts they stay."""
    from types import SimpleNamespace

    import polars as pl

    from traceview.outputs.report_sections import _routine_alignment

    note = "alignment: rank 1: poor clock alignment, offset 3 ns +- 900 ns"
    one = SimpleNamespace(offsets=pl.DataFrame({"rank": [0, 1], "host": ["vm", "vm"]}))
    two = SimpleNamespace(offsets=pl.DataFrame({"rank": [0, 1], "host": ["a", "b"]}))
    assert _routine_alignment(one)(note) and not _routine_alignment(two)(note)
    assert not _routine_alignment(one)("collectives: group 0: unmatched")


def test_a_short_breakdown_table_is_in_step_order(tmp_path: Path, capsys) -> None:
    html = _report(capsys, tmp_path / "r.html", "--plotly", "cdn")
    section = html.split('<section id="breakdown">', 1)[1].split("</section>", 1)[0]
    steps = re.findall(r"<tr><td>0</td><td>0</td><td>(\d+)</td>", section)
    assert steps == sorted(steps) and len(steps) == 2  # gpu_real: steps 551, 552
