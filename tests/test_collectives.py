"""Collective matching and metrics: hand-derived numbers, synthetic ground truth, real corpus."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceview.analyses.align import estimate_offsets
from traceview.analyses.collective_match import MatchResult, comm_events, match_collectives
from traceview.analyses.collectives import (
    alpha_beta,
    collective_ranks,
    collective_summary,
    collectives,
)
from traceview.analyses.window import ranks_present
from traceview.schema import events_frame

from tests.conftest import CORPUS, absent

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
AG = "ncclDevKernel_AllGather_RING_LL"
REPO = Path(__file__).resolve().parents[1]


def match_of(ev: pl.DataFrame) -> MatchResult:
    """The collective calls of ``ev`` paired across ranks."""
    return match_collectives(comm_events(ev))


def k(rank: int, ts: int, dur: int, name: str = AR, **kw) -> dict:
    return dict(rank=rank, file_id=rank, source="kineto", kind="kernel", name=name,
                device=rank, stream=7, ts_ns=ts, dur_ns=dur, **kw)


def test_instance_metrics_by_hand() -> None:
    # One all-reduce of 3000 bytes on 3 ranks (same clock). Arrivals 100, 400, 1000; ends
    # 1500, 1520, 1510.
    ev = events_frame([
        k(0, 100, 1400, bytes=3000, group_size=3),
        k(1, 400, 1120, bytes=3000, group_size=3),
        k(2, 1000, 510, bytes=3000, group_size=3),
    ])
    per = collective_ranks(match_of(ev)).sort("rank")
    # wait = last arrival (1000) - own arrival
    assert per.get_column("wait_ns").to_list() == [900, 600, 0]
    # transfer = own end - last arrival
    assert per.get_column("transfer_ns").to_list() == [500, 520, 510]
    inst = collectives(match_of(ev)).row(0, named=True)
    assert inst["skew_ns"] == 900            # 1000 - 100
    assert inst["end_spread_ns"] == 20       # 1520 - 1500
    assert inst["last_rank"] == 2 and inst["first_rank"] == 0
    assert inst["comm_ns"] == 510            # min duration = the last arriver's
    assert inst["n_ranks"] == 3 and inst["bytes"] == 3000
    # algbw = 3000 B / 510 ns = 5.882 GB/s; busbw = algbw * 2(3-1)/3
    assert inst["algbw_gbps"] == pytest.approx(3000 / 510)
    assert inst["busbw_gbps"] == pytest.approx(3000 / 510 * 4 / 3)
    assert inst["transfer_ns"] == 510        # median of 500, 520, 510


@pytest.mark.parametrize("name,factor", [
    ("ncclDevKernel_AllGather_RING_LL", 3 / 4), ("ncclDevKernel_ReduceScatter_Sum_f32", 3 / 4),
    ("ncclDevKernel_Broadcast_RING_LL", 1.0), ("ncclDevKernel_AllReduce_Sum_f32", 6 / 4),
])
def test_busbw_factors(name: str, factor: float) -> None:
    ev = events_frame([k(r, 0, 1000, name=name, bytes=8000, group_size=4) for r in range(4)])
    inst = collectives(match_of(ev)).row(0, named=True)
    assert inst["busbw_gbps"] == pytest.approx(8.0 * factor)


def test_match_by_seq_and_problems() -> None:
    # seq present: rank 1 wrote its calls in a different order, seq still pairs them.
    ev = events_frame([
        k(0, 0, 100, seq=1, pg_name="0", group_size=2), k(0, 500, 100, seq=2, pg_name="0",
                                                          group_size=2),
        k(1, 510, 90, seq=2, pg_name="0", group_size=2), k(1, 10, 90, seq=1, pg_name="0",
                                                           group_size=2),
    ])
    m = match_of(ev)
    assert set(m.instances.get_column("match")) == {"seq"}
    assert m.instances.filter(pl.col("instance") == "0#2").get_column("ts_ns").sort().to_list() \
        == [500, 510]
    assert m.problems.height == 0


def test_order_mismatch_reported_then_time_matched() -> None:
    # No seq. Rank 1 missed the first all-gather (profiled later): counts differ, so order
    # matching is refused, and time matching pairs the rest; nothing is silently mis-paired.
    r0 = [k(0, 0, 100, name=AG), k(0, 1000, 100), k(0, 2000, 100, name=AG), k(0, 3000, 100)]
    r1 = [k(1, 1050, 50), k(1, 2020, 80, name=AG), k(1, 3010, 90)]
    m = match_of(events_frame(r0 + r1))
    probs = m.problems
    assert "count_mismatch" in probs.get_column("problem").to_list()
    assert set(m.instances.get_column("match")) == {"time"}
    pairs = (m.instances.group_by("instance").agg(pl.col("ts_ns").sort())
             .get_column("ts_ns").to_list())
    assert sorted(pairs) == [[1000, 1050], [2000, 2020], [3000, 3010]]


def test_name_mismatch_reported() -> None:
    ev = events_frame([k(0, 0, 100), k(0, 1000, 100, name=AG), k(1, 0, 100, name=AG),
                       k(1, 1000, 100)])
    m = match_of(ev)
    assert "name_mismatch" in m.problems.get_column("problem").to_list()
    # time matching then pairs same-named calls only; the crossed pairs are not "matched"
    for names in m.instances.group_by("instance").agg(pl.col("collective").n_unique()) \
            .get_column("collective").to_list():
        assert names == 1


def test_summary_percentiles_and_tail_ratio() -> None:
    # 5 all-reduce instances of 1 KiB on 2 ranks; per-rank durations 100..1000 ns.
    rows = []
    durs = [(100, 200), (300, 400), (500, 600), (700, 800), (900, 1000)]
    for i, (a, b) in enumerate(durs):
        t = 10_000 * i
        rows += [k(0, t, a, bytes=1024, group_size=2), k(1, t + a - b, b, bytes=1024,
                                                         group_size=2)]
    s = collective_summary(collective_ranks(match_of(events_frame(rows)))).row(0, named=True)
    assert s["size_bucket"] == "[1 KiB, 2 KiB)" and s["instances"] == 5 and s["samples"] == 10
    vals = sorted(x for p in durs for x in p)   # 100..1000 step 100
    assert s["p50_ns"] == pytest.approx(550.0)  # linear interpolation at index 4.5
    assert s["p90_ns"] == pytest.approx(910.0)  # index 8.1 -> 900 + 0.1*100
    assert s["p99_ns"] == pytest.approx(991.0)  # index 8.91
    assert s["tail_ratio"] == pytest.approx(991.0 / 550.0)
    assert vals[0] == 100


def test_alpha_beta_exact_and_relative() -> None:
    # t = 10 us + bytes / 20 GB/s exactly, sizes 1 KiB .. 64 MiB: the fit recovers both.
    sizes = [1 << s for s in range(10, 27, 2)]
    inst = pl.DataFrame({"name": ["all_reduce"] * len(sizes), "bytes": sizes,
                         "comm_ns": [10_000 + b / 20 for b in sizes]})
    fit = alpha_beta(inst).row(0, named=True)
    assert fit["alpha_ns"] == pytest.approx(10_000, rel=1e-9)
    assert fit["beta_gbps"] == pytest.approx(20.0, rel=1e-9)
    assert fit["rel_rms_error"] == pytest.approx(0.0, abs=1e-9)
    # Relative fitting: a 10% error on every small message is not drowned by large ones.
    noisy = inst.with_columns(comm_ns=pl.when(pl.col("bytes") < 1 << 16)
                              .then(pl.col("comm_ns") * 1.1).otherwise(pl.col("comm_ns")))
    fit = alpha_beta(noisy).row(0, named=True)
    assert fit["alpha_ns"] > 10_000  # the latency term absorbs the small-message slowdown
    assert alpha_beta(inst.head(2)).row(0, named=True)["alpha_ns"] is None


# --- (c) synthetic GPU generator ground truth ----------------------------------------------

def test_synthetic_ground_truth(tmp_path: Path) -> None:
    import traceview
    from fixtures.synthetic import SyntheticSpec, generate

    gt = generate(SyntheticSpec(world_size=4, steps=3, seed=5), tmp_path)
    run = traceview.open(tmp_path, cache=False)
    off = run.offsets
    assert dict(off.select("rank", "offset_ns").rows()) == dict(enumerate(gt.clock_offset_ns))
    inst = run.collectives()["instances"]
    assert set(inst.get_column("match")) == {"seq"}
    truth = {f"{c.process_group}#{c.seq}": c for c in gt.collectives}
    assert set(inst.get_column("instance")) == set(truth)
    for row in inst.iter_rows(named=True):
        c = truth[row["instance"]]
        assert row["bytes"] == c.bytes
        assert row["comm_ns"] == c.transfer_ns
        assert row["last_rank"] == c.last_arrival_rank
        assert row["skew_ns"] == max(c.arrival_true_ns) - min(c.arrival_true_ns)
        # bandwidth from the truth: bytes / transfer time
        assert row["algbw_gbps"] == pytest.approx(c.bytes / c.transfer_ns)
    # alpha-beta per type recovers the generator's link model (latency 12 us; all-reduce
    # transfer = 12 us + ceil(1.5 * bytes / 50 GB/s) on 4 ranks -> algbw slope 50/1.5 GB/s).
    fits = {r["name"]: r for r in alpha_beta(inst).iter_rows(named=True)}
    # (ceil() in the generator adds < 1 ns per instance)
    assert fits["all_reduce"]["alpha_ns"] == pytest.approx(12_000, abs=5)
    assert fits["all_reduce"]["beta_gbps"] == pytest.approx(50 / 1.5, rel=1e-4)
    # one all-gather size only: no fit, and it says why
    assert fits["all_gather"]["alpha_ns"] is None


# --- (d) the sampled two-rank NCCL pair in the corpus ---------------------------------------

def test_corpus_sampled_pair_matches_collectives() -> None:
    """Two ranks of a 128-rank job, sampled: each rank kept a different subset of its NCCL
    kernels. Both have 8 SendRecv kernels on stream 84 and 2 on stream 203, so counting alone
    would pair them by order; the completion times contradict that on stream 84 (completions
    tens of ms apart), so those are matched by time, and only the pairs whose completions
    coincide are kept. Stream 203's two pairs agree in order and in time."""
    import traceview

    d = CORPUS / "hta-tests-data" / "tests" / "data" / "trace_filter"
    paths = [d / "sampled_rank-0.json.gz", d / "sampled_rank-1.json.gz"]
    if not all(p.exists() for p in paths):
        pytest.skip(absent(d))
    ts = traceview.open(paths, cache=False)
    ev = ts.events.collect()
    m = match_of(ev)
    probs = m.problems
    assert probs.filter(pl.col("problem") == "order_timing_mismatch").get_column("group") \
        .to_list() == ["stream 84"]
    inst = collectives(m)
    by_group = dict(inst.group_by("group").len().rows())
    assert by_group == {"stream 84": 3, "stream 203": 2}
    # matched completions coincide within 0.5 ms; every instance has both ranks
    assert inst.get_column("end_spread_ns").max() < 500_000
    assert set(inst.get_column("n_ranks")) == {2}
    # group size comes from nothing in the trace here, so busbw needs a factor for send_recv:
    assert inst.get_column("name").unique().to_list() == ["send_recv"]
    # Alignment from these 5 anchors: same host pair, offset within its uncertainty of 0.
    off = estimate_offsets(m, ranks_present(ev))
    r1 = off.filter(pl.col("rank") == 1).row(0, named=True)
    assert abs(r1["offset_ns"]) <= max(r1["uncertainty_ns"], 1)
    assert r1["anchors"] == 5


def test_cli_collectives_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    import orjson

    from traceview.cli import main

    src = REPO / "fixtures" / "data" / "gloo_ddp_2r"
    if not src.is_dir():
        pytest.skip("fixture data missing")
    assert main(["collectives", str(src), "--json", "--no-cache"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert set(out) >= {"instances", "summary"}
    first = out["instances"][0]
    for field in ("group", "seq", "name", "n_ranks", "bytes", "skew_ns", "last_rank"):
        assert field in first
    assert len(out["instances"]) == 12 and {i["n_ranks"] for i in out["instances"]} == {2}
    assert {s["name"] for s in out["summary"]} == {"all_reduce", "barrier"}
    assert main(["align", str(src), "--json", "--no-cache"]) == 0
    al = orjson.loads(capsys.readouterr().out)
    assert al["reference_rank"] == 0
    assert [set(r) >= {"rank", "offset_ns", "drift_ppm", "uncertainty_ns", "anchors", "method"}
            for r in al["ranks"]] == [True, True]
    with pytest.raises(SystemExit) as exc:  # argparse rejects an unknown method, exit code 2
        main(["align", str(src), "--align", "bogus"])
    assert exc.value.code == 2


SR = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"


def _a2a_rank(rank: int, *, with_op: bool = True) -> list[dict]:
    """One rank: ``c10d::alltoall_base_`` [0, 50) on thread 1 (collective all_to_all) around
    ``cudaLaunchKernel`` [10, 15) (correlation 7), whose NCCL SendRecv kernel runs
    [100, 200); then an all-reduce kernel [300, 350)."""
    base = dict(rank=rank, file_id=rank, source="kineto", pid=1, tid=1)
    rows = [dict(base, kind="cuda_runtime", name="cudaLaunchKernel", ts_ns=10, dur_ns=5,
                 correlation=7),
            k(rank, 100, 100, name=SR, correlation=7, collective="send_recv"),
            k(rank, 300, 50, collective="all_reduce")]
    if with_op:
        rows.append(dict(base, kind="cpu_op", name="c10d::alltoall_base_", ts_ns=0, dur_ns=50,
                         collective="all_to_all"))
    return rows


def test_an_all_to_all_run_as_sendrecv_kernels_is_an_all_to_all() -> None:
    # NCCL runs an all-to-all as grouped sends and receives: the kernel says SendRecv, the op
    # around its launch says all_to_all (param's DLRM: alltoall found none before)
    calls = comm_events(events_frame(_a2a_rank(0) + _a2a_rank(1)))
    assert calls.sort("rank", "ts_ns").get_column("collective").to_list() == [
        "all_to_all", "all_reduce", "all_to_all", "all_reduce"]
    inst = collectives(match_collectives(calls))
    assert sorted(inst.get_column("name").to_list()) == ["all_reduce", "all_to_all"]


def test_sendrecv_kernels_keep_their_name_where_a_rank_lacks_the_op() -> None:
    # rank 1's trace lost the op (a sampled trace): naming rank 0's call all_to_all alone
    # would make the ranks differ at the same position; both stay send_recv
    calls = comm_events(events_frame(_a2a_rank(0) + _a2a_rank(1, with_op=False)))
    assert calls.filter(pl.col("name") == SR).get_column("collective").to_list() == [
        "send_recv", "send_recv"]
