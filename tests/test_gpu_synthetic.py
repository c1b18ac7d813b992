"""Overlap, idle and gaps against the exact ground truth of fixtures/synthetic.py.

Synthetic multi-rank NCCL traces (4 ranks, per-rank clock offsets, a slow rank, an injected
idle gap) are parsed by traceview.open; per (rank, step) compute/comm/overlap/busy/idle inside
the host ProfilerStep range must equal the generator's ground truth to the nanosecond.
"""

from __future__ import annotations

import polars as pl
import pytest

traceview = pytest.importorskip("traceview")
synthetic = pytest.importorskip("fixtures.synthetic")

from traceview.analyses.overlap import overlap  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    spec = synthetic.SyntheticSpec(
        world_size=4, steps=3, kernels_per_step=8,
        clock_offsets_ns=(0, 1_500_000, -700_000, 2_345_678),
        idle_gaps=(synthetic.IdleGap(rank=2, step=1, duration_ns=4_000_000),))
    truth = synthetic.generate(spec, out)
    return truth, traceview.open([out], cache=False)


def test_per_step_overlap_and_idle_match_ground_truth(run) -> None:
    truth, tv = run
    # host step windows: the pure analysis on the Run's tables (the CLI tiles by GPU work)
    got = overlap(tv.gpu, tv.ranks_table, steps=tv.steps, per_step=True, step_windows="host")
    assert got.height == len(truth.step_stats)
    for st in truth.step_stats:
        r = got.filter((pl.col("rank") == st.rank) & (pl.col("step") == st.step)).row(0, named=True)
        assert (r["compute_ns"], r["comm_ns"], r["overlap_ns"], r["busy_ns"], r["idle_ns"]) == (
            st.compute_busy_ns, st.comm_busy_ns, st.overlap_ns, st.busy_ns, st.idle_ns), st
        assert r["memcpy_ns"] + r["memset_ns"] >= st.memory_busy_ns


def test_gpu_tiled_steps_keep_the_busy_numbers(run) -> None:
    truth, tv = run
    got = tv.overlap(per_step=True)["rows"]  # GPU-tiled windows: same work, different idle
    for st in truth.step_stats:
        r = got.filter((pl.col("rank") == st.rank) & (pl.col("step") == st.step)).row(0, named=True)
        assert (r["compute_ns"], r["comm_ns"], r["overlap_ns"], r["busy_ns"]) == (
            st.compute_busy_ns, st.comm_busy_ns, st.overlap_ns, st.busy_ns)


def test_injected_gap_is_found_exactly(run) -> None:
    truth, tv = run
    g = tv.gap_rows()
    for gt in truth.gaps:
        offset = truth.clock_offset_ns[gt.rank]
        base = truth.base_time_ns
        hit = g.filter((pl.col("rank") == gt.rank)
                       & (pl.col("gap_start_ns") == gt.start_true_ns + offset)
                       & (pl.col("gap_end_ns") == gt.end_true_ns + offset))
        if hit.height == 0:  # ground truth may be relative to the base time
            hit = g.filter((pl.col("rank") == gt.rank)
                           & (pl.col("gap_start_ns") == base + gt.start_true_ns + offset))
        assert hit.height == 1, (gt, g.filter(pl.col("rank") == gt.rank).sort("gap_ns").tail(3))
        assert hit["cause"].item() in ("sync", "host")


def test_summary_names_the_slow_rank_despite_clock_offsets(tmp_path):
    """Ranks' clocks differ by seconds: the worst straggler must come from aligned arrivals."""
    import json

    from fixtures.synthetic import SyntheticSpec, generate
    from traceview.cli import main

    truth = generate(SyntheticSpec(world_size=4, steps=5, seed=0), tmp_path)
    assert max(abs(o) for o in truth.clock_offset_ns) > 10**8
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["summary", str(tmp_path), "--json", "--no-cache"]) == 0
    assert json.loads(out.getvalue())["worst_straggler"]["rank"] == truth.slow_rank
