"""The command line's words for people: warnings in plain words once (details with
--verbose), grouped validate problems, a short reason for unflagged stragglers, steps as
people write them, an alpha-beta fit only when it fits, per-step summary headers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import traceview
from traceview.cli import main
from traceview.run.run import Run
from traceview.schema import events_frame

from tests.conftest import FIXTURES

PAIR = Path("/work/shared/corpus/hta-tests-data/tests/data/trace_filter")
GLOO = str(FIXTURES / "data" / "gloo_ddp_2r")


def _unpaired_run() -> Run:
    """Rank 1 saw one all-reduce fewer than rank 0, rank 2 none (a rank on its own clock)."""
    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    rows = [dict(rank=r, file_id=r, source="kineto", kind="kernel", name=kernel, stream=7,
                 device=r, ts_ns=1_000_000 * k + 10 * r, dur_ns=50_000)
            for r, n in ((0, 4), (1, 3)) for k in range(n)]
    rows.append(dict(rank=2, file_id=2, source="kineto", kind="kernel", name="gemm", stream=7,
                     device=2, ts_ns=0, dur_ns=10))
    return Run.from_events(events_frame(rows))


def test_plain_warnings_say_what_the_answer_leaves_out() -> None:
    res = _unpaired_run().stragglers()
    plain = res.plain_warnings
    assert len(plain) < len(res.warnings) or plain != list(res.warnings)
    assert any(w.startswith("collectives on stream") or w.startswith("collectives in group")
               for w in plain), plain
    assert any("rank(s) 2 could not be aligned" in w for w in plain), plain
    assert not any("ns (robust sd)" in w for w in plain)
    doc = res.to_dict()
    assert doc["warnings"] == list(res.warnings)  # complete, as before
    assert doc["warnings_plain"] == plain


@pytest.mark.skipif(not PAIR.is_dir(), reason="HTA test corpus not present")
def test_nccl_pair_warns_once_in_plain_words(capsys) -> None:
    files = [str(PAIR / f"sampled_rank-{r}.json.gz") for r in (0, 1)]
    assert main(["summary", *files]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "traceview: warning: collectives on stream 84 could not be paired across ranks by "
        "call order (their completions scatter by 56.8 ms); 10 of 16 calls stay unpaired: "
        "cross-rank waits, skew and stragglers there leave them out",
        "traceview: warning: the clock of rank(s) 1 is aligned only roughly: cross-rank "
        "times with it can be off by up to 465 µs"]
    for argv in (["--verbose", "stragglers", *files], ["stragglers", *files, "--verbose"]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "order_timing_mismatch" in err and "56826575 ns (robust sd)" in err
    assert main(["collectives", *files, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["warnings"]) == 4 and len(doc["warnings_plain"]) == 2


def test_summary_headers_say_per_step(capsys) -> None:
    from fixtures import synthetic
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        synthetic.main(["--out", out, "--world-size", "2", "--steps", "3", "--seed", "2"])
        assert main(["summary", out]) == 0
        text = capsys.readouterr().out
        assert "compute_ms/step" in text and "exposed_comm_ms/step" in text
        assert "*/step: window totals / steps" in text
        row = traceview.open(out).summary().ranks.row(0, named=True)
        assert row["compute_ns_per_step"] == round(row["compute_ns"] / row["steps"])


def test_unflagged_ranks_get_one_short_reason(capsys) -> None:
    slow = str(FIXTURES / "data" / "gloo_ddp_2r_slow1")
    ranks = traceview.open(slow).stragglers().ranks
    by_rank = {r["rank"]: r for r in ranks.iter_rows(named=True)}
    assert by_rank[1]["flagged"] and by_rank[1]["reason"].startswith("its own time caused")
    assert by_rank[0]["reason"].startswith("too few clear instances")  # the real reason
    assert main(["stragglers", slow]) == 0
    out = capsys.readouterr().out.splitlines()
    rank0 = next(line for line in out if line.startswith("rank 0:"))
    assert rank0.endswith("not flagged: too few clear instances: its own time caused 1 clear "
                          "lead, 3 needed") and len(rank0.split()) < 30
    assert main(["stragglers", slow, "--verbose"]) == 0
    assert "arrived last at" in next(line for line in capsys.readouterr().out.splitlines()
                                     if line.startswith("rank 0:"))


def test_steps_past_the_trace_are_said_in_inclusive_ranges(capsys) -> None:
    slow = str(FIXTURES / "data" / "gloo_ddp_2r_slow1")
    whole = traceview.open(slow).steps
    first, last = int(whole["step"].min()), int(whole["step"].max())
    res = traceview.open(slow, steps=f"{last - 1}:{last + 50}").summary()
    assert (f"steps: asked for steps {last - 1}–{last + 49}, the trace has {first}–{last}: "
            f"analysing 2 steps ({last - 1}–{last})") in res.warnings
    assert traceview.open(slow, steps=f"{first}:{last + 1}").summary().warnings == ()
    assert main(["summary", slow, "--steps", f"{last + 5}:{last + 9}"]) == 2
    assert f"steps present: {first}–{last}," in capsys.readouterr().err


def test_alpha_beta_fit_is_offered_only_when_it_fits(capsys) -> None:
    import polars as pl

    from traceview.analyses.collectives import MAX_FIT_REL_RMS, alpha_beta

    sizes = [1_000, 10_000, 100_000, 1_000_000] * 2
    line = [5_000 + b / 10 for b in sizes]  # alpha 5 us, beta 10 GB/s
    noisy = [t * f for t, f in zip(line, [1, 3, 0.3, 2.5, 0.4, 1, 3, 0.2])]
    fits = alpha_beta(pl.DataFrame({"name": ["clean"] * 8 + ["noisy"] * 8,
                                    "bytes": sizes * 2, "comm_ns": line + noisy}))
    clean, bad = fits.row(0, named=True), fits.row(1, named=True)
    assert clean["meaningful"] and clean["rel_rms_error"] < 1e-9
    assert clean["beta_gbps"] == pytest.approx(10.0)
    assert bad["rel_rms_error"] > MAX_FIT_REL_RMS and bad["meaningful"] is False
    assert "not a meaningful fit" in bad["note"]
    assert main(["collectives", GLOO]) == 0  # gloo's all-reduce times scatter (44% RMS)
    out = capsys.readouterr().out
    assert "alpha-beta all_reduce: no meaningful fit" in out and " GB/s," not in out
