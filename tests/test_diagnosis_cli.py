"""``critical-path`` and ``diagnose`` at the edges: the CLI (text and --json contracts), the
Python API giving the same answer, the Perfetto overlay and the report section."""

from __future__ import annotations

import io
import json
from pathlib import Path

import orjson
import pytest

import traceview
from tests.test_perfetto import check_structure
from traceview.cli import main
from traceview.outputs.perfetto import export

SLOW = str(Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gloo_ddp_2r_slow1")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_critical_path_json_contract_and_api(capsys, cache) -> None:
    doc = _json(capsys, ["critical-path", SLOW, "--cache-dir", cache])
    assert {"ranks", "steps", "categories", "top_ops", "warnings"} <= set(doc)
    assert {"rank", "share"} <= set(doc["ranks"][0])
    assert {"step", "path_ns", "step_ns"} <= set(doc["steps"][0])
    assert set(doc["categories"]) == {"compute", "communication_wait",
                                      "communication_transfer", "launch_host",
                                      "data_loading", "idle"}
    assert doc["ranks"][0]["rank"] == 1
    api = traceview.open(SLOW, cache_dir=cache).critical_path().to_dict()
    assert api == doc


def test_critical_path_text(capsys, cache) -> None:
    assert main(["critical-path", SLOW, "--cache-dir", cache, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("critical path over 4 step(s)")
    assert "fixture::extra_compute" in out
    assert "communication_transfer" in out


def test_diagnose_text_is_a_to_do_list(capsys, cache) -> None:
    assert main(["diagnose", SLOW, "--cache-dir", cache]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("to do, biggest gain first")
    assert lines[1].startswith("1. [high] save ~") and "Rank 1 holds the others back" in lines[1]
    assert lines[2].strip().startswith("fix: Investigate rank 1")
    assert any(line.startswith("note: Run bound: host-bound (no GPU work); path: ")
               for line in lines)


def test_diagnose_json_with_the_model_size(capsys, cache) -> None:
    doc = _json(capsys, ["diagnose", SLOW, "--cache-dir", cache, "--params", "6800",
                         "--tokens-per-step", "8", "--peak-tflops", "1.0"])
    first = doc["findings"][0]
    assert {"id", "title", "severity", "rank", "evidence", "gain_ns_per_step",
            "recommendation"} <= set(first)
    assert (first["id"], first["rank"]) == ("straggler", 1)
    mfu = doc["mfu"]
    assert mfu["flops_per_step"] == 6 * 6800 * 8 and mfu["peak_source"] == "user"
    assert mfu["mfu"] == pytest.approx(6 * 6800 * 8 / (doc["step_ns"] / 1e9) / 2 / 1e12)
    assert doc["bound"]["bound"] == "host-bound"  # a CPU-only (gloo) run, as summary says
    assert doc["bound"]["path"] == "host"  # its ops are the host's time on the path
    assert main(["diagnose", SLOW, "--cache-dir", cache, "--csv"]) == 0
    assert capsys.readouterr().out.startswith("id,title,severity,rank,gain_ns_per_step")


def test_perfetto_overlay_is_the_same_path(cache) -> None:
    run = traceview.open(SLOW, cache_dir=cache)
    buf = io.StringIO()
    info = export(run, buf, critical_path=True)
    doc = orjson.loads(buf.getvalue())
    check_structure(doc)
    path = [e for e in doc["traceEvents"] if e.get("cat") == "traceview.path"]
    assert len(path) == info["path_pieces"] > 0
    per_rank: dict[int, float] = {}
    for e in path:
        per_rank[e["pid"]] = per_rank.get(e["pid"], 0.0) + e["dur"]
    ranks = run.critical_path()["ranks"]  # the overlay draws the measured path
    for rank, path_ns in ranks.select("rank", "measured_path_ns").rows():
        assert per_rank.get(rank, 0.0) == pytest.approx(path_ns / 1000, abs=1e-3 * 1000)


def test_report_has_the_critical_path_section(cache) -> None:
    from traceview.outputs.report import gather, write_html

    buf = io.StringIO()
    write_html(gather(traceview.open(SLOW, cache_dir=cache)), buf)
    page = buf.getvalue()
    section = page[page.index('<section id="critical-path">'):]
    section = section[:section.index("</section>")]
    assert "Rank 1 holds the others back" in section
    assert "fixture::extra_compute" in section


def test_bare_steps_lists_every_step_and_a_range_is_the_window(capsys, cache) -> None:
    every = _json(capsys, ["critical-path", SLOW, "--cache-dir", cache, "--steps"])
    assert [s["step"] for s in every["steps"]] == [2, 3, 4, 5]
    window = _json(capsys, ["critical-path", SLOW, "--cache-dir", cache, "--steps", "3:5"])
    assert [s["step"] for s in window["steps"]] == [3, 4]
