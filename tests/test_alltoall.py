"""All-to-all volumes, imbalance and cost (analyses/alltoall.py): a hand-drawn MoE run, the
synthetic NCCL generator's all-to-all, the real gloo MoE runs, and the CLI's contract.

The hand-drawn run: 3 CPU ranks (gloo-like: dispatcher op on thread 1, the work item on
thread 9), 2 steps of 2000 us each (times below in us from the step's start T). A token is 4
floats, 16 bytes. Per step:

  dispatch  c10d::alltoall_base_ [0,5), gloo:all_to_all [10,100) on every rank (ends together)
            every rank sends [1, 4, 1] tokens to ranks 0, 1, 2: rank 1 receives 12 tokens
            (192 bytes), ranks 0 and 2 receive 3 (48 bytes). Mean 96 bytes: ratio 2.0.
  expert    aten::mm from 100 for 50 + 100 x tokens received: ends 450 (ranks 0, 2), 1350 (1)
  combine   c10d::alltoall_base_ [end, end+5), gloo:all_to_all [end+5, 1400): the tokens back
  reduce    c10d::allreduce_ [1450,1455), gloo:all_reduce [1455,1600)

By hand. Matrix per step (bytes, dispatch + combine): 0->0 32, 0->1 80, 0->2 32, 1->0 80,
1->1 128, 1->2 80, 2->0 32, 2->1 80, 2->2 32; rank 1 sends and receives 288 bytes a step,
ranks 0 and 2 144. Receive ratio (at the dispatch): rank 1 2.0, others 0.5; send ratio (at
the combine) the same. Cost: stretches from the dispatch's last arrival (10) to the combine's
arrival (455, 1355, 455): 445, 1345, 445 us against 48, 192, 48 bytes: slope 900 / 144 =
6.25 us a byte; at the mean (96 bytes) the hot rank would take 1345 - 6.25 x 96 = 745 us:
cost 600 us a step (its lead over the others: 900 us), 30% of the 2000 us step.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from gpu_trace_helpers import frame, row, step
from traceview.analyses.alltoall import MATRIX_SCHEMA, alltoall, alltoall_calls
from traceview.analyses.dependency_graph import SYNC_SCHEMA
from traceview.cli import main
from traceview.run.run import Run

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "fixtures" / "data" / "scenarios"
US = 1000
TOKEN = 16  # bytes: 4 floats
SENDS = [1, 4, 1]  # tokens every rank sends to ranks 0, 1, 2


def _args(out_rows: int, in_rows: int, out_splits: list[int], in_splits: list[int]) -> str:
    return json.dumps({
        "Concrete Inputs": ["", "", "", str(out_splits), str(in_splits), "False", "-1"],
        "Input type": ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
        "Input Dims": [[out_rows, 4], [in_rows, 4], [], [], [], [], []]})


def _op(name: str, ts: int, dur: int, rank: int, s: int, *, tid: int = 1,
        kind: str = "cpu_op", **kw) -> dict:
    return row(kind, name, ts * US, dur * US, rank=rank, pid=rank + 1, tid=tid, step=s, **kw)


def moe_rows(n_steps: int = 2) -> list[dict]:
    rows = []
    for s in range(1, n_steps + 1):
        t = (s - 1) * 2000
        for r in range(3):
            got = [SENDS[r]] * 3  # from each rank, the tokens it routes to r
            end = t + 100 + 50 + 100 * sum(got)
            rows += [
                {**step(s, t * US, 2000 * US, rank=r), "pid": r + 1},
                _op("c10d::alltoall_base_", t, 5, r, s,
                    args_json=_args(sum(got), sum(SENDS), got, SENDS)),
                _op("gloo:all_to_all", t + 10, 90, r, s, tid=9, kind="user_annotation"),
                _op("aten::mm", t + 100, end - t - 100, r, s),
                _op("c10d::alltoall_base_", end, 5, r, s,
                    args_json=_args(sum(SENDS), sum(got), SENDS, got)),
                _op("gloo:all_to_all", end + 5, t + 1400 - end - 5, r, s, tid=9,
                    kind="user_annotation"),
                _op("c10d::allreduce_", t + 1450, 5, r, s),
                _op("gloo:all_reduce", t + 1455, 145, r, s, tid=9, kind="user_annotation"),
            ]
    return rows


@pytest.fixture(scope="module")
def moe() -> Run:
    return Run.from_events(frame(moe_rows()), align="none")


def test_volumes_matrix_and_imbalance_by_hand(moe: Run) -> None:
    res = moe.alltoall()
    ranks = res["ranks"]
    assert ranks.select("rank", "send_bytes", "recv_bytes", "send_bytes_per_step",
                        "recv_bytes_per_step", "calls").rows() == [
        (0, 288, 288, 144, 144, 4), (1, 576, 576, 288, 288, 4), (2, 288, 288, 144, 144, 4)]
    assert ranks["recv_ratio"].to_list() == [0.5, 2.0, 0.5]
    assert ranks["send_ratio"].to_list() == [0.5, 2.0, 0.5]
    assert ranks["hot"].to_list() == [False, True, False]
    assert (res["hot_rank"], res["imbalance"], res["recv_ratio"]) == (1, 2.0, 2.0)
    step1 = res["matrix"].filter(pl.col("step") == 1).select("src", "dst", "bytes").rows()
    assert step1 == [(0, 0, 32), (0, 1, 80), (0, 2, 32), (1, 0, 80), (1, 1, 128), (1, 2, 80),
                     (2, 0, 32), (2, 1, 80), (2, 2, 32)]
    ex = res["exchanges"]
    assert ex.height == 4 and set(ex["source"]) == {"split_sizes"}
    assert ex["recv_imbalance"].to_list() == [2.0, 1.0, 2.0, 1.0]
    assert ex["max_recv_rank"].to_list()[::2] == [1, 1]


def test_cost_from_the_graph_by_hand(moe: Run) -> None:
    res = moe.alltoall()
    costs = res["costs"]
    assert costs.select("step", "hot_rank", "hot_stretch_ns", "lead_ns", "balanced_ns",
                        "cost_ns").rows() == [(1, 1, 1_345_000, 900_000, 745_000, 600_000),
                                              (2, 1, 1_345_000, 900_000, 745_000, 600_000)]
    assert costs["ns_per_byte"].to_list() == [6250.0, 6250.0]
    assert res["cost_ns_per_step"] == 600_000
    assert res["step_ns"] == 2_000_000 and res["cost_share"] == 0.3


def test_diagnose_names_the_imbalance(moe: Run) -> None:
    found = moe.diagnose()["findings"]
    a2a = found.filter(pl.col("id").str.contains("alltoall_imbalance")).row(0, named=True)
    assert (a2a["rank"], a2a["gain_ns_per_step"]) == (1, 600_000)
    assert "rank 1 receives 2.00x" in a2a["title"]
    assert found.row(0, named=True)["rank"] == 1


def test_a_choice_of_ranks_compares_those_ranks(moe: Run) -> None:
    """Ranks 0 and 1 of the three: rank 1 receives 192 bytes at the dispatch, rank 0 48:
    ratio 192 / 120 = 1.6; the split sizes name three peers, taken as global ranks."""
    res = moe.select(ranks=[0, 1]).alltoall()
    assert res["ranks"]["rank"].to_list() == [0, 1]
    assert res["ranks"]["recv_ratio"].to_list() == [0.4, 1.6]
    assert res["ranks"]["send_bytes"].to_list() == [288, 576]  # its own sends, to all three
    assert any("choice of ranks" in w for w in res.warnings)
    assert any("more peers than the ranks present" in w for w in res.warnings)


def test_a_call_cut_off_pairs_the_others_by_time() -> None:
    """Rank 0's first dispatcher op is missing (a window that began inside it): its other
    calls pair with their instances by time, and the first dispatch's cells come from the
    other ranks' records (all but rank 0's share to itself, 16 bytes). Received at the
    dispatches: rank 0 32 + 48, rank 1 2 x 192, rank 2 2 x 48: ratio 384 / (560 / 3)."""
    rows = moe_rows()
    first = next(i for i, r in enumerate(rows)
                 if r["rank"] == 0 and r["name"] == "c10d::alltoall_base_")
    res = Run.from_events(frame(rows[:first] + rows[first + 1:]), align="none").alltoall()
    assert any("rank 0: 3 all-to-all call(s) with sizes and 4 matched" in w
               for w in res.warnings)
    assert (res["hot_rank"], res["imbalance"]) == (1, pytest.approx(384 / (560 / 3)))
    assert res["ranks"]["send_bytes"].to_list() == [288 - 16, 576, 288]


def test_groups_are_compared_within_themselves() -> None:
    """Two expert-parallel groups in one step: {0, 1} (rank 0 receives 30 bytes, rank 1 10)
    and {2, 3} (100 each). Within the groups: ratios 1.5, 0.5, 1.0, 1.0: rank 0 is hot
    (against the mean of all four, 60 bytes, ranks 2 and 3 would look hot)."""
    cells = [("a#0", "a", 0, 0, 15), ("a#0", "a", 1, 0, 15), ("a#0", "a", 0, 1, 5),
             ("a#0", "a", 1, 1, 5), *(("b#0", "b", s, d, 50) for s in (2, 3) for d in (2, 3))]
    matrix = pl.DataFrame(
        [(i, g, 1, s, d, b, "split_sizes", 0) for i, g, s, d, b in cells],
        schema={**MATRIX_SCHEMA, "ts_ns": pl.Int64}, orient="row")
    res = alltoall(matrix, sync=pl.DataFrame(schema=SYNC_SCHEMA),
                   steps=pl.DataFrame(schema={"step_time_ns": pl.Int64}))
    assert res["ranks"]["recv_ratio"].to_list() == [1.5, 0.5, 1.0, 1.0]
    assert (res["hot_rank"], res["imbalance"]) == (0, 1.5)
    assert res["exchanges"].select("group", "recv_imbalance").rows() == [("a", 1.5),
                                                                         ("b", 1.0)]


def test_even_split_from_the_shapes() -> None:
    """Without split sizes an all-to-all splits its tensors evenly: 6 tokens to 3 ranks."""
    rows = [r for r in moe_rows(1)]
    for r in rows:
        if r["name"] == "c10d::alltoall_base_":
            doc = json.loads(r["args_json"])
            doc["Concrete Inputs"][3:5] = ["[]", "[]"]
            doc["Input Dims"][0] = [6, 4]
            doc["Input Dims"][1] = [6, 4]
            r["args_json"] = json.dumps(doc)
    res = Run.from_events(frame(rows), align="none").alltoall()
    assert res["matrix"].get_column("bytes").unique().to_list() == [64]  # 2 x 2 tokens
    assert set(res["exchanges"]["source"]) == {"shape"}
    assert res["hot_rank"] is None and res["imbalance"] == 1.0
    assert res["cost_ns_per_step"] == 0


def test_nccl_split_sizes_from_record_param_comms() -> None:
    """NCCL's record_param_comms: rows per peer in ``In/Out split size``, the message's
    elements and dtype: 2 x 3 rows of 8 bf16 elements (16 bytes a row)."""
    args = {"Collective name": "all_to_allv", "In split size": "[2, 4]",
            "Out split size": "[2, 1]", "Seq": 7, "Process Group Name": "0"}
    ev = frame([row("cpu_op", "record_param_comms", 0, 10, rank=0, collective="all_to_all",
                    in_nelems=48, out_nelems=24, dtype="BFloat16", seq=7, pg_name="0",
                    args_json=json.dumps(args))])
    calls = alltoall_calls(ev)
    assert calls.select("send_splits", "recv_splits", "send_bytes", "recv_bytes", "source",
                        "seq", "group").row(0) == ([32, 64], [32, 16], 96, 48, "split_sizes",
                                                   7, "0")


def test_a_run_without_all_to_all_answers_empty() -> None:
    res = Run.from_events(frame([_op("aten::mm", 0, 10, 0, 1)]), align="none").alltoall()
    assert res["ranks"].height == 1 and res["ranks"]["send_bytes"].to_list() == [None]
    assert (res["hot_rank"], res["imbalance"], res["cost_ns_per_step"]) == (None, None, None)
    assert res["matrix"].height == 0


# ----------------------------------------------------------------------- the GPU path
@pytest.fixture(scope="module")
def synthetic_moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    from fixtures import synthetic

    spec = synthetic.SyntheticSpec(world_size=4, steps=5, seed=1, slow_rank=None,
                                   alltoall_tokens=56, alltoall_hot_rank=2)
    out = tmp_path_factory.mktemp("moe")
    synthetic.generate(spec, out)
    return str(out), spec


def test_synthetic_nccl_all_to_all(synthetic_moe) -> None:
    """NCCL SendRecv kernels with record_param_comms split sizes: expert 2 receives 4 x 32
    tokens of 8 KiB, the others 4 x 8; its expert takes 20 us a token, so a balanced
    assignment (56 tokens each) saves (128 - 56) x 20 us = 1.44 ms a step, and the others
    wait (128 - 32) x 20 us = 1.92 ms for it."""
    from fixtures import synthetic

    path, spec = synthetic_moe
    run = traceview.open(path)
    res = run.alltoall()
    route = synthetic.alltoall_routing(spec)
    got = [4 * route[e] for e in range(4)]
    assert res["hot_rank"] == 2
    assert res["imbalance"] == pytest.approx(max(got) / (sum(got) / 4))
    assert res["ranks"]["recv_bytes_per_step"].to_list() == [  # dispatch + its tokens back
        (g + spec.alltoall_tokens) * spec.alltoall_token_bytes for g in got]
    assert set(res["exchanges"]["source"]) == {"split_sizes"}
    assert res["cost_ns_per_step"] == pytest.approx(1_440_000, rel=0.01)
    assert res["costs"]["lead_ns"].median() == pytest.approx(1_920_000, rel=0.01)
    assert 0 < res["cost_ns_per_step"] < res["step_ns"]
    flagged = run.stragglers()["ranks"].filter(pl.col("flagged"))["rank"].to_list()
    assert flagged == [2]  # the same rank as the straggler analysis
    found = run.diagnose()["findings"]
    assert found.row(0, named=True)["rank"] == 2
    a2a = found.filter(pl.col("id") == "alltoall_imbalance").row(0, named=True)
    assert a2a["rank"] == 2 and a2a["gain_ns_per_step"] == res["cost_ns_per_step"]


def test_synthetic_without_routing_is_balanced(tmp_path: Path) -> None:
    from fixtures import synthetic

    spec = synthetic.SyntheticSpec(world_size=4, steps=3, seed=2, slow_rank=None,
                                   alltoall_tokens=56)
    synthetic.generate(spec, tmp_path)
    res = traceview.open(str(tmp_path)).alltoall()
    assert res["hot_rank"] is None and res["imbalance"] == 1.0
    assert res["cost_ns_per_step"] == 0 and res["exchanges"].height == 6


# ----------------------------------------------------------------------- the real runs
def _routing(truth: dict) -> list[int]:
    """Tokens every rank sends to each expert: the generator's own record (truth.json
    ``workload``), else its first routing (56 tokens a rank, 4 shares to the hot expert and
    one to each other)."""
    sent = (truth.get("workload") or {}).get("tokens_sent_to_each_expert")
    if sent:
        return list(sent)
    hot, world = truth["slow_rank"], truth["world_size"]
    return [8 * (4 if e == hot else 1) for e in range(world)]


def _scenario(name: str) -> tuple[Path, dict]:
    folder = SCENARIOS / name
    if not (folder / "truth.json").exists():
        pytest.skip(f"{folder} is not there (fixtures/scenarios.py writes it)")
    return folder, json.loads((folder / "truth.json").read_text())


@pytest.mark.parametrize("name", ["a2a_routing_r1", "a2a_routing_r2_noisy"])
def test_real_hot_rank(name: str) -> None:
    folder, truth = _scenario(name)
    hot = truth["slow_rank"]
    run = traceview.open(str(folder))
    res = run.alltoall()
    route = _routing(truth)
    # the hot expert receives route[hot] from each rank; the mean expert receives a rank's
    # tokens (sum(route)): e.g. 4 x 32 / 44 = 2.91, or 4 x 32 / 56 = 2.29
    expected = truth["world_size"] * route[hot] / sum(route)
    assert res["hot_rank"] == hot
    assert res["recv_ratio"] == pytest.approx(expected, rel=0.05)
    assert 0 < res["cost_ns_per_step"] < res["step_ns"]
    flagged = run.stragglers()["ranks"].filter(pl.col("flagged"))["rank"].to_list()
    assert flagged == [hot]
    found = run.diagnose()["findings"]
    assert found.row(0, named=True)["rank"] == hot
    assert found.filter(pl.col("id").str.contains("alltoall_imbalance"))["rank"].to_list() \
        == [hot]


def test_real_balanced_twin() -> None:
    folder, _ = _scenario("a2a_balanced")
    res = traceview.open(str(folder)).alltoall()
    assert res["hot_rank"] is None and res["imbalance"] == pytest.approx(1.0)
    assert res["cost_ns_per_step"] == 0


# ----------------------------------------------------------------------- the command line
def test_cli_json_contract(synthetic_moe, capsys) -> None:
    path, _ = synthetic_moe
    assert main(["alltoall", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"ranks", "hot_rank", "imbalance", "cost_ns_per_step", "matrix",
            "warnings"} <= set(doc)
    assert {"rank", "send_bytes", "recv_bytes"} <= set(doc["ranks"][0])
    assert {"step", "src", "dst", "bytes"} <= set(doc["matrix"][0])
    assert doc["hot_rank"] == 2 and doc == traceview.open(path).alltoall().to_dict()


def test_cli_text(synthetic_moe, capsys) -> None:
    path, _ = synthetic_moe
    assert main(["alltoall", path]) == 0
    out = capsys.readouterr().out
    assert "hot rank 2: receives 2.29x the mean" in out
    assert "sender (row) to receiver (column)" in out


# ----------------------------------------------------------------------- the report
def test_report_section(synthetic_moe) -> None:
    import io

    from traceview.outputs.report import gather, write_html

    path, _ = synthetic_moe
    page = io.StringIO()
    write_html(gather(traceview.open(path)), page)
    html = page.getvalue()
    section = html[html.index('<section id="alltoall">'):]
    section = section[:section.index("</section>")]
    assert "Rank 2 is hot: it receives 2.29x the mean volume" in section
    assert "ms per step" in section and "Plotly.newPlot" in section
    assert '<a href="#alltoall">' in html


def test_no_report_section_without_all_to_all(moe: Run) -> None:
    import io

    from traceview.outputs.report import gather, write_html

    page = io.StringIO()
    write_html(gather(Run.from_events(frame([r for r in moe_rows(1)
                                             if "alltoall" not in r["name"]
                                             and "all_to_all" not in r["name"]]),
                                      align="none")), page)
    assert 'id="alltoall"' not in page.getvalue()


def _with_splits(rows: list[dict], send: str, recv: str, dims: list | None = None) -> list[dict]:
    """``moe_rows`` with every dispatcher op's split sizes (and tensor shapes) replaced."""
    for r in rows:
        if r["name"] == "c10d::alltoall_base_":
            doc = json.loads(r["args_json"])
            doc["Concrete Inputs"][3:5] = [recv, send]
            if dims is not None:
                doc["Input Dims"][0:2] = [dims, dims]
            r["args_json"] = json.dumps(doc)
    return rows


def test_split_lists_longer_than_the_group_take_memory_linear_in_their_length() -> None:
    """5,000 split sizes on each call of a 3-rank group (their peers taken as global ranks):
    each list was copied once per peer, 5,000^2 values per call (~3 GB more here); now each
    is exploded once (~0.2 GB). The growth of a process's peak memory over its imports stays
    far below the quadratic one."""
    code = f"""
import json, resource, sys
sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests')!r}]
from tests.test_alltoall import moe_rows, _with_splits
from gpu_trace_helpers import frame
from traceview.run.run import Run
splits = str([1] * 5000)
rows = frame(_with_splits(moe_rows(1), splits, splits))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
res = Run.from_events(rows, align="none").alltoall()
print(res["matrix"].height, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    cells, grown_kb = map(int, done.stdout.split())
    assert cells == 3 * 5000 * 2 - 9  # every (rank, peer) sent and received, 3 x 3 shared
    assert grown_kb < 1_500_000, grown_kb


def test_split_sizes_beyond_the_bounds_read_as_an_even_split() -> None:
    """A split size beyond int64, a negative one, or a tensor of 2^70 elements: no error,
    the call read as an even split of its tensors (or no bytes), with a warning."""
    huge = "[99999999999999999999999, 1, 1]"
    res = Run.from_events(frame(_with_splits(moe_rows(1), huge, "[-4, 1, 1]")),
                          align="none").alltoall()
    assert any("beyond the bounds" in w for w in res.warnings)
    assert set(res["exchanges"]["source"]) == {"shape"}
    assert res["matrix"]["bytes"].min() >= 0
    big = Run.from_events(frame(_with_splits(moe_rows(1), "[]", "[]", [1 << 35, 1 << 35])),
                          align="none").alltoall()
    assert big["matrix"]["bytes"].fill_null(0).max() == 0  # not modelled: no bytes
    neg = Run.from_events(frame(_with_splits(moe_rows(1), "[]", "[]", [-6, 4])),
                          align="none").alltoall()
    assert neg["matrix"]["bytes"].fill_null(0).max() == 0
