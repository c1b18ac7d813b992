"""HTML report: sections, escaping, self-containment, partial sections on CPU-only traces."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tests.test_report_trace import EVIL, EVIL_OP, two_rank_trace
from traceview.cli import main
from traceview.outputs.report import gather, write_html

pytest.importorskip("plotly")

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _html(events, **kw) -> tuple[str, int, object]:
    data = gather(events, **kw)
    buf = io.StringIO()
    n = write_html(data, buf)
    return buf.getvalue(), n, data


@pytest.fixture(scope="module")
def gpu_report() -> tuple[str, int, object]:
    return _html(two_rank_trace(), title="run <b>x</b>")


def _body(page: str) -> str:
    """The page without the inlined plotly.js bundle."""
    return page[page.index("</script></head>"):]


def test_report_sections_numbers_and_escaping(gpu_report: tuple[str, int, object]) -> None:
    page, figures, data = gpu_report
    body = _body(page)
    assert figures == 6
    for section in ("summary", "steps", "breakdown", "collectives", "stragglers", "gaps",
                    "kernels"):
        assert f'<section id="{section}">' in body
    # names from traces never appear as markup, anywhere in the file
    assert EVIL not in page and EVIL_OP not in page and "<b>x</b>" not in page
    # shown as text: in the kernel table and (entity-escaped for plotly's label markup) in
    # the top-kernel bars' labels and hover data
    assert body.count("&lt;img src=x onerror=alert(1)&gt;") >= 3
    assert "run &lt;b&gt;x&lt;/b&gt;" in body
    # numbers come from the analyses (hand-derived in tests/test_report_trace.py)
    assert data.summary["step_time_ns_p50"].to_list() == [1_000_000, 1_000_000]
    assert data.lateness.sort("rank")["lateness_ns"].to_list() == [0, 0, 200_000, 200_000]
    assert data.gap_causes["cause"].to_list() == ["between_steps", "between_steps"]
    assert data.stragglers.row(0, named=True)["imposed_wait_ns"] == 400_000
    assert not data.notes  # nothing partial on a GPU trace with steps and collectives
    assert re.search(r"<td>0\.200</td>", body)  # the 200 us skew, in ms


def test_report_is_self_contained(gpu_report: tuple[str, int, object]) -> None:
    page, _, _ = gpu_report
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)
    assert not re.search(r"""(src|href)=["']?https?:""", _body(page))
    assert page.count("Plotly.newPlot") == 6


def test_report_cpu_only_states_partial_sections() -> None:
    import traceview

    ts = traceview.open(FIX / "gloo_ddp_2r_slow1", cache=False)
    page, figures, data = _html(ts)  # a Run: its ranks table names the hosts
    body = _body(page)
    # no empty figure, and no note per rank per section: the verdict says once that there
    # are no GPU events, and the GPU breakdown and gap causes are left out
    assert figures == 4 and body.count('class="nofig"') == 1
    assert body.lower().count("no gpu events") == 1
    assert 'id="breakdown"' not in body and 'id="gaps"' not in body
    assert 'href="#breakdown"' not in body and 'href="#gaps"' not in body
    assert set(data.notes) == {"breakdown", "gaps", "kernels"}  # the data keeps them
    assert "Top host operators by self time" in body
    assert data.worst_straggler["rank"] == 1  # rank 1 was slowed when the fixture was made


def test_report_single_rank_without_steps() -> None:
    ev = two_rank_trace().filter((__import__("polars").col("rank") == 0)
                                 & ~__import__("polars").col("name").cast(str)
                                 .str.starts_with("ProfilerStep"))
    page, figures, data = _html(ev)
    body = _body(page)
    # steps have nothing to draw: a sentence, never an empty axis; skew and stragglers need
    # two ranks: their sections are left out
    assert figures == 3 and body.count('class="nofig"') == 1
    assert 'id="stragglers"' not in body and 'id="collectives"' not in body
    assert "steps" in data.notes and "collectives" in data.notes
    assert data.worst_straggler["rank"] is None


def test_cli_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert main(["report", str(FIX / "gloo_ddp_2r"), "-o", str(out), "--no-cache",
                 "--json"]) == 0
    import orjson

    info = orjson.loads(capsys.readouterr().out)
    assert info["output"] == str(out) and info["figures"] == 4 and info["ranks"] == 2
    assert "breakdown" in info["partial_sections"]
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "missing"), "-o", str(out), "--no-cache"]) == 2


def test_warnings_come_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rank cut off part-way: the page opens with the warning naming the file, before the
    summary, and `report --json` lists it."""
    import json

    from tests.helpers import copy_with_rank_cut

    run_dir = copy_with_rank_cut(FIX / "gloo_ddp_2r", tmp_path / "run")
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    damaged = [w for w in doc["warnings"] if "rank-1" in w]
    assert damaged, doc["warnings"]
    page = _body(out.read_text(encoding="utf-8"))
    assert page.index('id="warnings"') < page.index('id="summary"')
    assert "rank-1" in page[page.index('id="warnings"'):page.index('id="summary"')]
