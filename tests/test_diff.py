"""Run comparison: Mann-Whitney U by hand and against brute-force enumeration, a hand-built
two-run diff, the CLI contract on the real slowed gloo run."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceview.cli import main
from traceview.outputs.diff import diff, mann_whitney_u
from traceview.schema import events_frame

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def test_mann_whitney_by_hand() -> None:
    # complete separation, 3 vs 3: U = 0, P(U <= 0) = 1 / C(6, 3) = 1/20, two-sided 0.1
    assert mann_whitney_u([1, 2, 3], [4, 5, 6]) == {"u": 0.0, "p_value": 0.1, "method": "exact"}
    # interleaved: ranks of x = 1, 3, 5 -> U = 9 - 6 = 3; counts of U = 0..3 for 3 vs 3 are
    # 1, 1, 2, 3 -> P(U <= 3) = 7/20; two-sided p = 0.7
    assert mann_whitney_u([1, 3, 5], [2, 4, 6])["p_value"] == pytest.approx(0.7)
    # ties: x = [1, 1], y = [2, 2]: U = 0, N = 4, tie term (6 + 6) / 12 = 1,
    # var = 4/12 * (5 - 1) = 4/3, z = (2 - 0.5) / sqrt(4/3), p = erfc(z / sqrt 2)
    r = mann_whitney_u([1, 1], [2, 2])
    z = 1.5 / math.sqrt(4 / 3)
    assert r["u"] == 0.0 and r["p_value"] == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert r["method"].startswith("normal")
    assert mann_whitney_u([], [1])["p_value"] is None
    assert mann_whitney_u([5, 5], [5, 5])["p_value"] == 1.0


def _brute_p(x: list[int], y: list[int]) -> float:
    """Two-sided exact p by enumerating every split of the pooled values."""
    pooled = x + y
    m = len(x)

    def u_of(a: list[int], b: list[int]) -> float:
        return sum((ai > bi) + 0.5 * (ai == bi) for ai in a for bi in b)

    u_obs = u_of(x, y)
    us = []
    for idx in itertools.combinations(range(len(pooled)), m):
        a = [pooled[i] for i in idx]
        b = [pooled[i] for i in range(len(pooled)) if i not in idx]
        us.append(u_of(a, b))
    low = sum(u <= u_obs for u in us) / len(us)
    high = sum(u >= u_obs for u in us) / len(us)
    return min(1.0, 2 * min(low, high))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=5, unique=True).flatmap(
    lambda xs: st.tuples(st.just(xs), st.lists(st.integers(0, 10_000).filter(
        lambda v: v not in xs), min_size=1, max_size=5, unique=True))))
def test_exact_p_matches_enumeration(xy: tuple[list[int], list[int]]) -> None:
    x, y = xy
    r = mann_whitney_u(x, y)
    assert r["method"] == "exact"
    assert r["p_value"] == pytest.approx(_brute_p(x, y), abs=1e-9)
    # symmetric in the two samples, invariant to a common shift
    assert mann_whitney_u(y, x)["p_value"] == pytest.approx(r["p_value"])
    assert mann_whitney_u([v + 7 for v in x], [v + 7 for v in y])["p_value"] == \
        pytest.approx(r["p_value"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=40),
       st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_p_value_is_a_probability(x: list[int], y: list[int]) -> None:
    r = mann_whitney_u(x, y)
    assert 0.0 <= r["p_value"] <= 1.0
    assert 0.0 <= r["u"] <= len(x) * len(y)


def _run(step_ms: list[int], kernel_ns: int) -> object:
    """One rank; step k lasts step_ms[k] ms; one kernel "k" of kernel_ns at step start + 0.1 ms."""
    rows, t = [], 0
    for s, ms in enumerate(step_ms):
        rows += [
            dict(rank=0, file_id=0, source="kineto", kind="user_annotation",
                 name=f"ProfilerStep#{s}", ts_ns=t, dur_ns=ms * 1_000_000, step=s, pid=1, tid=1),
            dict(rank=0, file_id=0, source="kineto", kind="kernel", name="k", device=0,
                 stream=7, ts_ns=t + 100_000, dur_ns=kernel_ns, step=s),
        ]
        t += ms * 1_000_000
    return events_frame(rows)


def test_diff_by_hand() -> None:
    # base steps 1, 2, 3 ms with a 100 us kernel; test steps 4, 5, 6 ms with a 300 us kernel.
    res = diff(_run([1, 2, 3], 100_000), _run([4, 5, 6], 300_000))
    m = {r["metric"]: r for r in res.metrics.to_dicts()}
    st_ = m["step_time_ns"]
    assert (st_["base"], st_["test"], st_["change"]) == (2e6, 5e6, 3e6)
    assert st_["change_pct"] == pytest.approx(1.5)
    assert st_["p_value"] == pytest.approx(0.1) and st_["significant"] is False
    assert m["compute_ns"]["base"] == 100_000 and m["compute_ns"]["test"] == 300_000
    # GPU step windows tile from kernel start to the next step's kernel start:
    # base idle 0.9, 1.9, 0 ms -> median 0.9 ms; test 3.7, 4.7, 0 ms -> median 3.7 ms
    assert m["idle_ns"]["base"] == 900_000 and m["idle_ns"]["test"] == 3_700_000
    assert m["exposed_comm_ns"]["base"] == 0
    # per rank-step totals: 300k / 3 = 100 us vs 900k / 3 = 300 us; mean step time +3 ms
    top = res.contributors.row(0, named=True)
    assert (top["kind"], top["name"], top["base_ns"], top["test_ns"], top["delta_ns"]) == \
        ("kernel", "k", 100_000.0, 300_000.0, 200_000.0)
    assert top["share_of_step_change"] == pytest.approx(200_000 / 3_000_000)
    assert res.base_rank_steps == 3 and res.test_rank_steps == 3


def test_diff_cpu_only_metrics_are_stated() -> None:
    import traceview

    a = traceview.open(FIX / "gloo_ddp_2r", cache=False)
    res = diff(a.events, a.events)
    m = {r["metric"]: r for r in res.metrics.to_dicts()}
    assert m["step_time_ns"]["change"] == 0 and m["step_time_ns"]["significant"] is False
    assert m["idle_ns"]["base"] is None and "CPU-only" in m["idle_ns"]["note"]


def test_cli_diff_json_on_the_slowed_run(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diff", str(FIX / "gloo_ddp_2r"), str(FIX / "gloo_ddp_2r_slow1"), "--json",
                 "--no-cache"])
    assert code == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["test"] == "mann-whitney-u (two-sided)"
    st_ = next(r for r in out["metrics"] if r["metric"] == "step_time_ns")
    for key in ("base", "test", "change", "change_pct", "p_value", "significant",
                "test_method"):
        assert key in st_
    # every one of the 8 slowed (rank, step) durations exceeds every one of the 8 base ones:
    # U = 0, exact two-sided p = 2 / C(16, 8)
    assert st_["u"] == 0 and st_["p_value"] == pytest.approx(2 / math.comb(16, 8))
    assert st_["significant"] is True and st_["change"] > 0
    top = out["contributors"][0]
    assert {"kind", "name", "base_ns", "test_ns", "delta_ns"} <= set(top)
    assert (top["kind"], top["name"]) == ("collective", "all_reduce")  # waits for rank 1
    # one language with `check`: the statistical test under a name that is not a run's side,
    # the fraction under a name that says so, and the inputs compared
    assert out["stat_test"] == out["test"]
    assert st_["change_frac"] == st_["change_pct"]
    assert (out["base_path"], out["test_path"]) == (str(FIX / "gloo_ddp_2r"),
                                                    str(FIX / "gloo_ddp_2r_slow1"))
    # calls per rank-step beside the totals: 2 ranks x 4 steps = 8 rank-steps a run
    coll = next(r for r in out["collectives"] if r["name"] == "all_reduce")
    assert coll["base_count_per_step"] == pytest.approx(coll["base_count"] / 8)
    assert coll["test_count_per_step"] == pytest.approx(coll["test_count"] / 8)
    # the step markers are the step time itself, and an unchanged total explains nothing
    assert not any(r["name"].startswith("ProfilerStep#") for r in out["contributors"])
    assert all(r["delta_ns"] != 0 for r in out["contributors"])
    assert main(["diff", str(FIX / "gloo_ddp_2r"), str(FIX / "gloo_ddp_2r_slow1"),
                 "--no-cache"]) == 0
    assert "Mann-Whitney" in capsys.readouterr().out


def test_diff_and_export_carry_the_warnings(tmp_path, capsys) -> None:
    """A test run with rank 1 cut off part-way: `diff --json` and `export-perfetto --json` list
    the warning naming the file, as every command does."""
    import json

    from tests.helpers import copy_with_rank_cut

    damaged = copy_with_rank_cut(FIX / "gloo_ddp_2r", tmp_path / "damaged")
    assert main(["diff", str(FIX / "gloo_ddp_2r"), str(damaged), "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert any("rank-1" in w and "truncated" in w for w in doc["warnings"]), doc["warnings"]
    assert "truncated" in out.err
    merged = tmp_path / "merged.json"
    assert main(["export-perfetto", str(damaged), "-o", str(merged), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert any("rank-1" in w for w in doc["warnings"])
