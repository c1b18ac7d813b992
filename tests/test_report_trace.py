"""A hand-built 2-rank GPU trace with hostile names, shared by the report, gate and perfetto
tests, and the numbers an analysis must find on it (derived by hand below).

Per rank r (0, 1) and step s (0, 1), S = s x 1 ms, times in ns (rank 1's clock may be shifted
by ``shift_ns``: every rank-1 time + shift):

* ``ProfilerStep#s`` [S, S + 1_000_000) on the host;
* compute kernel ``EVIL`` (an HTML payload as name) [S + 100_000, + C_r) with C_0 = 300_000,
  C_1 = 500_000, launched by ``cudaLaunchKernel`` at S + 20_000 from the op ``<script>...``;
* NCCL all-reduce kernel from S + 400_000 (rank 0) / S + 600_000 (rank 1) to S + 800_000
  (completion simultaneous: the last arriver, rank 1, waits for nobody).

Hand-derived facts:

* step time 1 ms everywhere;
* compute per step: 300 us (rank 0), 500 us (rank 1) -> median 400 us;
* exposed comm per step: compute and comm never overlap -> 400 us (rank 0), 200 us (rank 1)
  -> median 300 us;
* GPU step windows (tiling): step 0 [100 us, 1100 us) holds 700 us of work on both ranks ->
  idle 300 us; step 1 [1100 us, 1800 us) is all busy -> idle 0; median over the four
  (rank, step) samples = 150 us;
* whole-trace GPU idle fraction: span 1.7 ms, busy 1.4 ms per rank -> 0.6 / 3.4 = 0.17647;
* collective waits: rank 0 waits 200 us at both instances -> 400 us / 4 rank-steps = 100 us;
* rank 1 arrives last at both instances, 200 us after rank 0 -> imposed wait 400 us over 2
  steps = 200 us per step (not flagged: fewer than 3 instances);
* one GPU idle gap per rank and device: [800 us, 1100 us), 300 us, cause ``between_steps``.
"""

from __future__ import annotations

import polars as pl

from traceview.schema import events_frame

EVIL = "<img src=x onerror=alert(1)>"
EVIL_OP = "<script>alert(2)</script>"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def two_rank_rows(shift_ns: int = 0) -> list[dict]:
    rows: list[dict] = []
    for r in (0, 1):
        off = shift_ns if r == 1 else 0
        compute = 300_000 if r == 0 else 500_000
        arrive = 400_000 if r == 0 else 600_000
        host = {"rank": r, "file_id": r, "source": "kineto", "pid": 100 + r, "tid": 1}
        gpu = {"rank": r, "file_id": r, "source": "kineto", "kind": "kernel", "device": 0,
               "pid": 0}
        for s in (0, 1):
            base = s * 1_000_000 + off
            c1, c2 = 10 * s + 1, 10 * s + 2
            rows += [
                {**host, "kind": "user_annotation", "name": f"ProfilerStep#{s}", "ts_ns": base,
                 "dur_ns": 1_000_000, "step": s},
                {**host, "kind": "cpu_op", "name": EVIL_OP, "ts_ns": base + 10_000,
                 "dur_ns": 50_000, "step": s, "external_id": c1},
                {**host, "kind": "cuda_runtime", "name": "cudaLaunchKernel",
                 "ts_ns": base + 20_000, "dur_ns": 10_000, "correlation": c1, "step": s,
                 "external_id": c1},
                {**host, "kind": "cuda_runtime", "name": "cudaLaunchKernel",
                 "ts_ns": base + 40_000, "dur_ns": 10_000, "correlation": c2, "step": s},
                {**gpu, "name": EVIL, "stream": 7, "tid": 7, "ts_ns": base + 100_000,
                 "dur_ns": compute, "correlation": c1, "step": s},
                {**gpu, "name": NCCL, "stream": 20, "tid": 20, "ts_ns": base + arrive,
                 "dur_ns": 800_000 - arrive, "correlation": c2, "step": s,
                 "collective": "all_reduce", "pg_name": "0", "seq": s, "group_size": 2,
                 "bytes": 4096},
            ]
    return rows


def two_rank_trace(shift_ns: int = 0) -> pl.DataFrame:
    return events_frame(two_rank_rows(shift_ns))


# ------------------------------------------------------------------------- the trace itself

def test_trace_gives_the_hand_derived_numbers() -> None:
    from traceview.analyses.collective_match import comm_events, match_collectives
    from traceview.analyses.collectives import collective_ranks
    from traceview.analyses.gaps import gaps
    from traceview.analyses.host import host_events
    from traceview.analyses.overlap import prepared_gpu

    ev = two_rank_trace()
    per = collective_ranks(match_collectives(comm_events(ev))).sort("instance", "rank")
    assert per["wait_ns"].to_list() == [200_000, 0, 200_000, 0]
    assert per["last_rank"].to_list() == [1, 1, 1, 1]
    g = gaps(prepared_gpu(ev), host_events(ev))
    assert g.select("rank", "gap_start_ns", "gap_ns", "cause").rows() == [
        (0, 800_000, 300_000, "between_steps"), (1, 800_000, 300_000, "between_steps")]
