"""What a collective's time is (``analyses/time_is.py``) and where its ranks ran
(``analyses/nodes.py``): hand-drawn instances with answers derived by hand, then the real gloo
runs of ``fixtures/data/gloo_collectives`` against their ``truth.json``."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.analyses.collective_match import comm_events, match_collectives
from traceview.analyses.collectives import alpha_beta, collective_ranks, collective_summary, instances
from traceview.analyses.nodes import late_nodes, rank_nodes, shared_nodes
from traceview.analyses.time_is import time_is
from traceview.cli import main
from traceview.schema import events_frame

REPO = Path(__file__).resolve().parents[1]
SETS = REPO / "fixtures" / "data" / "gloo_collectives"
TRUTH = json.loads((SETS / "truth.json").read_text())["sets"]
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def label(spread: int, transfer: int | None, unc: int = 0) -> str:
    return pl.select(time_is(pl.lit(spread), pl.lit(transfer, pl.Int64), pl.lit(unc))).item()


def test_thresholds_by_hand() -> None:
    # T = 1000: skew from S = 2000 (waiting 2/3 of the first arriver's 3000), transfer up to
    # S = 500 (transfer 2/3 of 1500), mixed between
    assert [label(s, 1000) for s in (0, 500, 501, 1999, 2000, 10_000)] == [
        "transfer", "transfer", "mixed", "mixed", "skew", "skew"]
    # clocks uncertain by U = 100: S in [S - 300, S + 300]; 400 -> [100, 700] crosses 500
    assert label(400, 1000, 100) == "inconclusive"
    assert label(150, 1000, 100) == "transfer"        # [0, 450]: transfer either way
    assert label(5000, 1000, 100) == "skew"           # [4700, 5300]
    # a spread the clocks cannot resolve, against a transfer that dwarfs any of it
    assert label(300, 100_000, 200) == "transfer"
    assert label(10, None) == "inconclusive" and label(0, 0) == "inconclusive"


def k(rank: int, ts: int, dur: int, *, stream: int = 7, size: int = 4000) -> dict:
    return dict(rank=rank, file_id=rank, source="kineto", kind="kernel", name=AR,
                device=rank, stream=stream, ts_ns=ts, dur_ns=dur, bytes=size, group_size=4)


def hand_rows(hosts: list[str] | None = None, gpus_per_node: int | None = None) -> pl.DataFrame:
    # 4 ranks, 4 all-reduces on one clock, in units of 100 ns. #0: arrivals 0/0/0/100,
    # transfer 1000 (the last arriver's call): S 100 -> transfer. #1: ranks 2 and 3 arrive
    # 5000 late, T 1000 -> skew. #2: S 1200, T 1000 -> mixed. #3: ranks 2, 3 late by 4000.
    rows = []
    for t0, late, dur in [(0, 100, 1000), (10_000, 5000, 1000), (30_000, 1200, 1000),
                          (50_000, 4000, 1000)]:
        t0, late, dur = 100 * t0, 100 * late, 100 * dur
        end = t0 + late + dur
        for r in range(4):
            arrive = t0 + (late if (r == 3 or (late >= 400_000 and r == 2)) else 0)
            rows.append(k(r, arrive, end - arrive))
    ev = events_frame(rows)
    ranks = pl.DataFrame({"rank": [0, 1, 2, 3], "host": hosts or [None] * 4},
                         schema={"rank": pl.Int32, "host": pl.String})
    return collective_ranks(match_collectives(comm_events(ev)),
                            nodes=rank_nodes(ranks, gpus_per_node=gpus_per_node))


def test_instances_and_summary_by_hand() -> None:
    per = hand_rows(["a", "a", "b", "b"])
    inst = instances(per).sort("first_arrival_ns")
    assert inst.get_column("skew_ns").to_list() == [10_000, 500_000, 120_000, 400_000]
    assert inst.get_column("comm_ns").to_list() == [100_000] * 4
    assert inst.get_column("time_is").to_list() == ["transfer", "skew", "mixed", "skew"]
    assert inst.get_column("node_span").to_list() == [2] * 4
    assert set(inst.get_column("locality")) == {"inter-node"}
    row = collective_summary(per).row(0, named=True)
    # medians: S (100, 1200, 4000, 5000) x 100 -> 260 us, T 100 us: skew; counts per label
    assert row["skew_p50_ns"] == 260_000 and row["comm_p50_ns"] == 100_000
    assert row["time_is"] == "skew" and row["node_span"] == 2
    assert (row["time_is_transfer"], row["time_is_skew"], row["time_is_mixed"],
            row["time_is_inconclusive"]) == (1, 2, 1, 0)
    assert row["wait_share"] == pytest.approx(2600 / 3600)


def test_nodes_from_hosts_and_gpus_per_node() -> None:
    one = instances(hand_rows(["h", "h", "h", "h"]))
    assert set(one.get_column("node_span")) == {1} and set(one.get_column("locality")) == {
        "intra-node"}
    unknown = instances(hand_rows())
    assert unknown.get_column("node_span").is_null().all()
    assert set(unknown.get_column("locality")) == {"unknown"}
    # --gpus-per-node wins over the host names: 1 rank a node -> 4 nodes
    split = instances(hand_rows(["h"] * 4, gpus_per_node=1))
    assert set(split.get_column("node_span")) == {4}
    # the fit is per locality: intra and inter never share a line
    per = pl.concat([hand_rows(["h"] * 4), hand_rows(["a", "a", "b", "b"]).with_columns(
        instance=pl.col("instance") + "x")])
    assert sorted(alpha_beta(instances(per)).get_column("locality")) == ["inter-node",
                                                                        "intra-node"]


def test_late_node_by_hand() -> None:
    # ranks 2 and 3 (host b) arrive together 500 and 400 us after every rank of host a at
    # #1 and #3: late at 2 instances, not the 3 a flag needs; rank 3 alone at #0 and #2 is
    # one rank late: host b's first rank (2) is not late there
    late = late_nodes(hand_rows(["a", "a", "b", "b"]))
    row = late.row(0, named=True)
    assert row["node"] == "host b" and row["ranks"] == [2, 3]
    assert row["late_instances"] == 2 and row["lead_p50_ns"] == 450_000
    assert not row["flagged"]
    shared = shared_nodes([2, 3], rank_nodes(pl.DataFrame({"rank": [0, 1, 2, 3],
                                                           "host": ["a", "a", "b", "b"]})))
    assert [d["sentence"] for d in shared] == [
        "host b: ranks 2–3 all late: a host problem, not a rank problem"]


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_real_gloo_runs_against_truth(name: str) -> None:
    truth = TRUTH[name]
    res = traceview.open(SETS / name, cache=False).collectives()
    rows = res["summary"].filter(pl.col("name") == "all_reduce")
    got = dict(rows.select("size_bucket", "time_is").iter_rows())
    assert set(got) == set(truth["all_reduce_time_is"])
    for size, allowed in truth["all_reduce_time_is"].items():
        assert got[size] in allowed, (name, size, got[size])
    hosts = truth.get("hosts")
    spans = set(res["instances"].get_column("node_span"))
    assert spans == ({len(set(hosts))} if hosts else {1})
    doc = res.to_dict()
    assert all("time_is" in r and "node_span" in r for r in doc["summary"] + doc["instances"])


def test_nodes_set_names_the_late_host(capsys) -> None:
    truth = TRUTH["nodes"]["late_nodes"][0]
    res = traceview.open(SETS / "nodes", cache=False).stragglers()
    flagged = res["late_nodes"].filter(pl.col("flagged"))
    assert flagged.select("node", "ranks").rows() == [(truth["node"], truth["ranks"])]
    assert res["node_findings"][0].startswith("host node1: ranks 2–3 all late")
    # the skewed single rank is a rank problem: no node is named, even with 2 ranks a node
    skew = traceview.open(SETS / "skew", cache=False, gpus_per_node=2).stragglers()
    assert skew["node_findings"] == []
    assert main(["diagnose", str(SETS / "nodes"), "--no-cache"]) == 0
    assert "node: host node1: ranks 2–3 all late" in capsys.readouterr().out


def test_node_from_the_nsys_target_host(tmp_path) -> None:
    from fixtures.nsys_synthetic import write_export

    path = tmp_path / "run.sqlite"
    write_export(path, ranks=2)  # its TARGET_INFO_SYSTEM_ENV names Hostname node0
    run = traceview.open(path, cache=False)
    assert run.nodes.select("node", "node_from").unique().rows() == [("host node0", "host")]
    inst = run.collectives()["instances"]
    assert inst.height and set(inst.get_column("node_span")) == {1}
    assert set(traceview.open(path, cache=False, gpus_per_node=1).collectives()["instances"]
               .get_column("node_span")) == {2}


def test_gpus_per_node_option(capsys) -> None:
    assert main(["collectives", str(SETS / "skew"), "--gpus-per-node", "2", "--json",
                 "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {i["node_span"] for i in doc["instances"]} == {2}
    assert {r["locality"] for r in doc["summary"]} == {"inter-node"}
    assert {f["locality"] for f in doc["alpha_beta"]} == {"inter-node"}
    assert main(["collectives", str(SETS / "skew"), "--gpus-per-node", "0"]) == 2
    assert "--gpus-per-node" in capsys.readouterr().err


def test_a_staggered_release_is_not_skew() -> None:
    # two all-reduces back to back on 2 ranks (one clock, us x 1000). #0: both arrive at 0;
    # rank 0 is let go at 100, rank 1 at 900 (the ring's staggered release). #1: rank 0
    # arrives at 150, rank 1 at 950, 50 after its release; both end at 1150.
    # Spread 800, but the last arriver was held in #0 until 900: its own time made 50 of it.
    # T (rank 1's call) = 200: own spread 50 <= T/2 -> transfer (the raw spread would say skew)
    us = 1000
    ev = events_frame([k(0, 0, 100 * us), k(1, 0, 900 * us),
                       k(0, 150 * us, 1000 * us), k(1, 950 * us, 200 * us)])
    inst = instances(collective_ranks(match_collectives(comm_events(ev)))).sort(
        "first_arrival_ns")
    second = inst.row(1, named=True)
    assert second["skew_ns"] == 800 * us and second["own_spread_ns"] == 50 * us
    assert second["comm_ns"] == 200 * us and second["time_is"] == "transfer"
    # the first has no earlier release: its whole spread (0) is its own
    assert inst.row(0, named=True)["own_spread_ns"] == 0
