"""One bound everywhere (issue 48, item 8): ``summary``, ``overlap``, ``diagnose`` and the
report name the same run bound with the same share (``Run.bound``, ``analyses.run_bound``).

Before: on ``fixtures/data/gpu_real`` summary said "bound: idle 55.2%" (the GPU's window) and
diagnose "The run is host-bound: the critical path is ... 1% idle" (the critical path). Now
both say "idle 55.2% of the GPU time", and diagnose gives the path's make-up beside it as
"path: ... 54% host ...". The sweep covers every fixture run and every GPU trace of the
shared corpus (skipped when it is absent).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from gpu_trace_helpers import frame, kernel, launch, step

import traceview
from traceview.analyses.run_bound import bound_phrase, run_bound
from traceview.cli import main
from traceview.outputs.report import gather

from tests.conftest import CORPUS, absent
from tests.test_gpu_corpus_sweep import CPU_TRACES, TRACES

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
#: Folders of unrelated single traces (each file its own run; together they are no run).
COLLECTIONS = {"gpu_beyond", "graph_capture_real"}
#: Every fixture run: each folder holding trace files (truth.json files are not traces), and
#: each file of a collection.
FIXTURE_RUNS = sorted({str(p.relative_to(DATA) if p.parent.name in COLLECTIONS
                           else p.parent.relative_to(DATA))
                       for p in [*DATA.rglob("*.json.gz"), *DATA.rglob("*.sqlite")]})


def _two_ranks() -> traceview.Run:
    """Rank 0: kernels [0,300) and [700,1000): compute 600 of its 1000 ns window, idle 400.
    Rank 1: kernels [0,100) and [900,1000): compute 200, idle 800."""
    rows = []
    for rank, kernels in ((0, [(0, 300), (700, 300)]), (1, [(0, 100), (900, 100)])):
        rows.append(step(1, -50, 1100, rank=rank))
        for corr, (ts, dur) in enumerate(kernels, start=1):
            rows += [launch(ts - 20, 10, corr, rank=rank),
                     kernel(f"k{corr}", ts, dur, corr=corr, rank=rank)]
    return traceview.Run.from_events(frame(rows))


def test_the_run_bound_pools_the_gpu_time_of_every_rank_by_hand() -> None:
    """Per rank: compute-bound 60% (600 vs 400: 600 >= 1.2 x 400) and idle 80%. The run:
    compute 800 and idle 1200 of 2000 ns: idle 60% (1200 >= 1.2 x 800), whatever its path."""
    run = _two_ranks()
    ranks = run.summary()["ranks"]
    assert ranks.select("rank", "bound", "bound_share").rows() == [
        (0, "compute-bound", pytest.approx(0.6)), (1, "idle", pytest.approx(0.8))]
    expected = {"bound": "idle", "bound_share": pytest.approx(0.6), "gpu_ranks": 2,
                "window_ns": 2000, "shares": {"compute": pytest.approx(0.4),
                                              "communication": 0.0, "copy": 0.0,
                                              "idle": pytest.approx(0.6)}}
    assert run.bound == expected
    assert run.summary()["bound"] == run.overlap()["bound"] == expected
    res = run.diagnose()
    assert {k: res["bound"][k] for k in expected} == expected
    assert set(res["bound"]["path_shares"]) == {"compute", "communication", "input", "host",
                                                "idle"}
    title = res["findings"].filter(res["findings"]["id"] == "bound")["title"].item()
    assert title.startswith("Run bound: idle 60.0% of the GPU time; path: ")


def test_the_run_bound_of_no_gpu_work_and_of_nothing() -> None:
    no_rows = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, "window_ns": pl.Int64})
    assert run_bound(no_rows)["bound"] is None
    assert bound_phrase(run_bound(no_rows)) == "unknown"
    cpu = pl.DataFrame({"rank": [0], "step": [None], "window_ns": [None]},
                       schema={"rank": pl.Int32, "step": pl.Int64, "window_ns": pl.Int64})
    assert run_bound(cpu) == {"bound": "host-bound", "bound_share": None, "shares": {},
                              "gpu_ranks": 0, "window_ns": None}
    assert bound_phrase(run_bound(cpu)) == "host-bound (no GPU work)"


def test_the_phrases() -> None:
    shares = {"compute": 0.45, "communication": 0.0, "copy": 0.15, "idle": 0.4}
    assert bound_phrase({"bound": "balanced", "bound_share": 0.45, "shares": shares}) == (
        "balanced between compute (45.0%) and idle (40.0%) of the GPU time")
    assert bound_phrase({"bound": "comm-bound", "bound_share": 0.6123, "shares": {}}) == (
        "comm-bound 61.2% of the GPU time")


def _same_bound_everywhere(run: traceview.Run) -> None:
    """The bound, its share and its shares are one answer in summary, overlap (whole trace
    and per step), diagnose and the report's data; a one-rank run's row in summary is it."""
    bound = run.bound
    keys = ("bound", "bound_share", "shares")
    want = {k: bound[k] for k in keys}
    for answer in (run.summary()["bound"], run.overlap()["bound"],
                   run.overlap(per_step=True)["bound"], run.diagnose()["bound"]):
        assert {k: answer[k] for k in keys} == want
    data = gather(run)
    assert {k: data.bound[k] for k in keys} == want
    assert data.meta["run bound"] == bound_phrase(bound)
    verdict = data.diagnose["findings"].filter(data.diagnose["findings"]["id"] == "bound")
    assert verdict["title"].item().startswith(f"Run bound: {bound_phrase(bound)}")
    ranks = run.summary()["ranks"]
    if ranks.height == 1:
        assert ranks.select("bound", "bound_share").row(0) == (bound["bound"],
                                                               bound["bound_share"])


@pytest.mark.parametrize("rel", FIXTURE_RUNS)
def test_every_fixture_names_one_bound(rel: str, tmp_path: Path) -> None:
    _same_bound_everywhere(traceview.open(DATA / rel, cache_dir=tmp_path))


@pytest.mark.parametrize("rel", [*TRACES, *CPU_TRACES] or ["(corpus absent)"])
def test_every_corpus_trace_names_one_bound(rel: str, tmp_path: Path) -> None:
    if not (CORPUS / rel).exists():
        pytest.skip(absent(CORPUS / rel))
    _same_bound_everywhere(traceview.open(CORPUS / rel, cache_dir=tmp_path))


def test_the_text_outputs_print_the_same_words(capsys, tmp_path: Path) -> None:
    """The run that showed the contradiction: its GPU idle 55.2% of its window, its path
    54% the host's."""
    gpu_real, cache = str(DATA / "gpu_real"), ["--cache-dir", str(tmp_path)]
    lines = {}
    for command in ("summary", "overlap", "diagnose"):
        assert main([command, gpu_real, *cache]) == 0
        out = capsys.readouterr().out
        lines[command] = [ln for ln in out.splitlines() if "bound: " in ln.lower()]
    assert "run bound: idle 55.2% of the GPU time" in lines["summary"]
    assert "run bound: idle 55.2% of the GPU time" in lines["overlap"]
    said = [ln for ln in lines["diagnose"] if "Run bound: " in ln]
    assert len(said) == 1 and "Run bound: idle 55.2% of the GPU time; path: " in said[0]
    assert "% host" in said[0] and "host-bound" not in said[0]
