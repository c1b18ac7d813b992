"""One answer everywhere: ``traceview.open(P, **window).NAME(**options).to_dict()`` equals
``traceview NAME P --json`` with the same options, for every analysis command, on real gloo
traces and on synthetic GPU ranks whose clocks are seconds apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.cli import main
from traceview.run.run import ANALYSES

from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def shifted(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three GPU ranks, rank 2 slowed by 3 ms a step, clocks +2.5 s and -1.75 s apart."""
    from fixtures import clock_shift, synthetic

    root = tmp_path_factory.mktemp("shifted")
    synthetic.main(["--out", str(root / "raw"), "--world-size", "3", "--steps", "6",
                    "--seed", "3", "--slow-rank", "2"])
    clock_shift.inject_clock_offsets(root / "raw", root / "run",
                                     {1: 2_500_000_123, 2: -1_750_000_077})
    return str(root / "run")


GLOO = str(FIXTURES / "data" / "gloo_ddp_2r_slow1")

#: (command, Run keywords, the same as CLI options, method keywords, the same as CLI options)
CASES = [
    *((name, {}, [], {}, []) for name in ANALYSES),
    ("summary", {"steps": "2:4"}, ["--steps", "2:4"], {}, []),
    ("stragglers", {"skip_warmup": 1}, ["--skip-warmup", "1"], {}, []),
    ("collectives", {"ranks": [0, 2]}, ["--ranks", "0,2"], {}, []),
    ("align", {"align": "none"}, ["--align", "none"], {}, []),
    ("gaps", {"time": "1ms:40ms"}, ["--time", "1ms:40ms"],
     {"per_stream": True, "top": 3}, ["--per-stream", "--top", "3"]),
    ("overlap", {}, [], {"per_step": True}, ["--per-step"]),
    ("breakdown", {"ranks": "1-2"}, ["--ranks", "1-2"], {"top": 2}, ["--top", "2"]),
]


def _cli_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("which", ["shifted", "gloo"])
@pytest.mark.parametrize(("command", "run_kw", "run_argv", "kw", "argv"), CASES,
                         ids=[f"{c[0]}-{'-'.join(c[2] + c[4]) or 'plain'}" for c in CASES])
def test_python_answers_as_the_cli(which, shifted, capsys, command, run_kw, run_argv, kw,
                                   argv) -> None:
    path = shifted if which == "shifted" else GLOO
    if which == "gloo" and "ranks" in run_kw:
        pytest.skip("the gloo fixture has two ranks")
    from_python = getattr(traceview.open(path, **run_kw), command)(**kw).to_dict()
    cli_name = command.replace("_", "-")  # critical_path -> critical-path
    assert from_python == _cli_json(capsys, [cli_name, path, *run_argv, *argv])


def test_python_aligns_clocks_by_default(shifted) -> None:
    """The issue's first complaint: from Python, stragglers named the wrong rank on ranks
    whose clocks disagree. The Run aligns by default, so rank 2 (slowed) is named."""
    run = traceview.open(shifted)
    ranks = run.stragglers().to_polars()
    assert ranks.filter(pl.col("flagged"))["rank"].to_list() == [2]
    assert run.summary()["worst_straggler"]["rank"] == 2
    raw = run.select(align="none").offsets
    assert raw["offset_ns"].to_list() == [0, 0, 0]
    unshifted = traceview.open(Path(shifted).parent / "raw").offsets
    moved = run.offsets["offset_ns"] - unshifted["offset_ns"]
    assert (moved - pl.Series([0, 2_500_000_123, -1_750_000_077])).abs().max() < 50_000


def test_shared_tables_are_computed_once(shifted, monkeypatch) -> None:
    from traceview.analyses import overlap
    from traceview.run import run as run_module

    calls = []
    real = overlap.prepared_gpu
    counted = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    for module in (overlap, run_module):  # where it is defined, and where the Run calls it
        monkeypatch.setattr(module, "prepared_gpu", counted)
    run = traceview.open(shifted, cache=False)  # nothing kept from another test
    run.gaps(), run.overlap(), run.summary(), run.breakdown()
    assert calls == [1]


def test_result_tables_for_pandas_and_notebooks(shifted) -> None:
    res = traceview.open(shifted).summary()
    frame = res.to_pandas()
    assert str(frame["rank"].dtype) == "Int32" and str(frame["step_time_ns_p50"].dtype) == "Int64"
    assert res.to_polars().equals(res["ranks"])
    assert "<table" in res._repr_html_() and "summary" in repr(res)
    csv = res.to_csv().splitlines()
    assert csv[0].startswith("rank,steps,step_time_ns_p50") and len(csv) == 4


def test_csv_is_the_main_table(shifted, capsys) -> None:
    assert main(["stragglers", shifted, "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("rank,flagged,imposed_wait_ns") and len(lines) >= 4
    assert main(["gaps", shifted, "--csv", "--per-stream"]) == 0
    assert capsys.readouterr().out.startswith("rank,device,stream,cause")


def test_a_bad_option_fails_before_reading(tmp_path) -> None:
    with pytest.raises(traceview.UsageError, match="--steps"):
        traceview.open(tmp_path / "missing.json", steps="a:b")
    with pytest.raises(traceview.UsageError, match="--align"):
        traceview.open(tmp_path / "missing.json", align="sideways")


def test_warnings_reach_the_result_and_stderr(tmp_path, capsys) -> None:
    from tests.helpers import copy_with_rank_cut

    damaged = copy_with_rank_cut(FIXTURES / "data" / "gloo_ddp_2r", tmp_path / "damaged",
                                 keep=2 / 3)
    res = traceview.open(damaged).summary()
    assert res.warnings and any("truncated" in w or "cut" in w or "incomplete" in w
                                for w in res.warnings), res.warnings
    assert res.to_dict()["warnings"] == list(res.warnings)
    assert main(["summary", str(damaged)]) == 0
    assert "warning:" in capsys.readouterr().err


def test_python_m_traceview_and_tab_completion() -> None:
    out = subprocess.run([sys.executable, "-m", "traceview", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip().startswith(f"traceview {traceview.__version__} (Kineto parser: ")
    assert {"open", "Run", "Result", "TraceSet", "UsageError"} <= set(dir(traceview))
    assert set(ANALYSES) <= set(dir(traceview.run.run.Run))


def test_unpaired_collectives_and_unaligned_clocks_are_warnings() -> None:
    """Rank 1 saw one all-reduce fewer than rank 0, and rank 2 none: the match's problems and
    the rank left on its raw clock reach the warnings of every answer that used them."""
    from traceview.run.run import Run
    from traceview.schema import events_frame

    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    rows = [dict(rank=r, file_id=r, source="kineto", kind="kernel", name=kernel, stream=7,
                 device=r, ts_ns=1_000_000 * k + 10 * r, dur_ns=50_000)
            for r, n in ((0, 4), (1, 3)) for k in range(n)]
    rows.append(dict(rank=2, file_id=2, source="kineto", kind="kernel", name="gemm", stream=7,
                     device=2, ts_ns=0, dur_ns=10))
    run = Run.from_events(events_frame(rows))
    stragglers = run.stragglers()
    assert any(w.startswith("collectives: ") for w in stragglers.warnings), stragglers.warnings
    assert any(w.startswith("alignment: rank 2") for w in stragglers.warnings)
    assert stragglers.to_dict()["warnings"] == list(stragglers.warnings)
    assert run.gaps().warnings == ()  # the GPU timeline used neither table


def test_damaged_events_dropped_are_a_warning(tmp_path) -> None:
    """Two events without a time are dropped by the parser: every answer says so, once."""
    import json as _json

    events = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0,
               "dur": 100, "pid": 1, "tid": 1},
              {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "dur": 5, "pid": 1, "tid": 1},
              {"ph": "X", "name": "aten::add", "cat": "cpu_op", "dur": 5, "pid": 1, "tid": 1}]
    path = tmp_path / "rank-0.json"
    path.write_text(_json.dumps({"traceEvents": events,
                                 "distributedInfo": {"rank": 0, "world_size": 1}}))
    warnings = traceview.open(path, cache=False).summary().warnings
    dropped = [w for w in warnings if "input events dropped" in w]
    assert len(dropped) == 1 and "2 missing_ts" in dropped[0] and str(path) in dropped[0]
