"""CI gate with run-to-run noise: multi-run baselines, the spread and step-test rule, damaged
input, one unit per field. Every expected number is derived by hand in the comments."""

from __future__ import annotations

import gzip
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest

from traceview.outputs import gate
from traceview.cli import main
from traceview.outputs.diff import diff_tables, mann_whitney_u, run_tables

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"
MS = 1_000_000.0


def _run(values: dict[str, float | None], steps: list[float]) -> gate.RunMetrics:
    full = {m: values.get(m) for m in gate.METRICS}
    notes = {m: "n/a" for m in gate.METRICS if full[m] is None}
    return gate.RunMetrics(full, notes, {"step_time_ns": [int(x * MS) for x in steps]})


# three re-runs of one job: step p50 10, 12 and 11 ms (no ties: the exact test applies)
RUNS = [_run({"step_time_p50_ns": 10 * MS}, [9.1, 9.9, 10.1, 10.9]),
        _run({"step_time_p50_ns": 12 * MS}, [11.1, 11.9, 12.1, 12.9]),
        _run({"step_time_p50_ns": 11 * MS}, [10.2, 10.8, 11.2, 11.8])]


def test_multi_run_baseline_by_hand() -> None:
    doc = gate.baseline(RUNS, inputs=[{"files": [f"r{i}"]} for i in range(3)])
    assert doc["traceview_baseline"] == 2 and "inputs" not in doc  # several runs: "runs"
    entry = doc["metrics"]["step_time_p50_ns"]
    # centre = median(10, 11, 12) = 11 ms; |deviations| 1, 1, 0 -> MAD 1 ms -> 1.4826 ms
    assert entry["value"] == entry["centre"] == 11 * MS
    assert entry["runs"] == [10 * MS, 12 * MS, 11 * MS]
    assert entry["spread"] == pytest.approx(1.4826 * MS)
    assert entry["samples"] == "step_time_ns"
    assert doc["samples"]["step_time_ns"][1] == [11.1 * MS, 11.9 * MS, 12.1 * MS, 12.9 * MS]
    assert doc["runs"][2] == {"files": ["r2"], "warnings": []}
    assert doc["metrics"]["gpu_idle_fraction"] == {
        "value": None, "unit": "fraction", "definition": gate.METRICS["gpu_idle_fraction"][1],
        "runs": [None, None, None], "centre": None, "spread": None, "samples": None,
        "note": "n/a"}


def _row(result: gate.CheckResult, metric: str = "step_time_p50_ns") -> dict:
    return next(r for r in result.rows.to_dicts() if r["metric"] == metric)


def test_change_must_exceed_tolerance_and_spread_and_step_test() -> None:
    doc = orjson.loads(orjson.dumps(gate.baseline(RUNS)))  # as read back from the file
    # allowed = max(11 x 1.1, 11 + 0.05, 11 + 3 x 1.4826) = 15.4478 ms
    # 14 ms is +27% (beyond the 10% tolerance) but within the noise: ok
    row = _row(gate.check({"step_time_p50_ns": 14 * MS}, doc,
                          now_samples={"step_time_ns": [13.7 * MS, 14 * MS, 14.3 * MS]}))
    assert row["allowed"] == pytest.approx(15.4478 * MS)
    assert row["noise_allowed"] == pytest.approx(15.4478 * MS)
    assert row["baseline_runs"] == 3 and row["status"] == "ok"
    # 16 ms with every step above all 12 baseline steps: U = 48 of 48, one-sided exact
    # p = 1 / C(16, 4) = 1 / 1820 < 0.01: regression
    res = gate.check({"step_time_p50_ns": 16 * MS}, doc,
                     now_samples={"step_time_ns": [15 * MS, 16.1 * MS, 16.2 * MS, 17 * MS]})
    row = _row(res)
    assert row["p_value"] == pytest.approx(1 / 1820)
    assert row["status"] == "regression" and res.exit_code == 1
    assert row["change_frac"] == pytest.approx(5 / 11)
    assert row["change_pct"] == pytest.approx(100 * 5 / 11)
    # 16 ms but the steps are not shown slower than the baseline's (three sit among them):
    # the test vetoes "regression", and a value beyond allowed that nothing decided is
    # inconclusive, never ok; it passes by default and fails with inconclusive="fail".
    # theta = U / (4 x 12): 9.2 > 1, 10.3 > 4, 11.3 > 8, 16 > 12 baseline steps = 25/48;
    # 4 steps can show no theta below 1/2 + z_0.01 / sqrt(48) = 0.836: "profile more steps"
    res = gate.check({"step_time_p50_ns": 16 * MS}, doc,
                     now_samples={"step_time_ns": [9.2 * MS, 10.3 * MS, 11.3 * MS, 16 * MS]})
    row = _row(res)
    assert row["p_value"] > 0.01 and row["status"] == "inconclusive" and res.exit_code == 0
    assert res.status == "inconclusive" and res.to_dict()["inconclusive_policy"] == "pass"
    assert "cannot tell" in row["note"] and "> allowed" in gate.describe(row)
    assert "52% of pairs" in row["note"] and "profile more steps" in row["note"]
    strict = gate.check({"step_time_p50_ns": 16 * MS}, doc, inconclusive="fail",
                        now_samples={"step_time_ns": [9.2 * MS, 10.3 * MS, 11.3 * MS, 16 * MS]})
    assert strict.exit_code == 1 and strict.status == "inconclusive"
    # a larger k (command line) widens the noise band: 11 + 5 x 1.4826 = 18.413 ms
    assert _row(gate.check({"step_time_p50_ns": 16 * MS}, doc, noise_k=5.0,
                           now_samples={"step_time_ns": [16 * MS, 17 * MS]}))["status"] == "ok"


def test_a_shift_within_the_steps_own_noise_is_not_a_regression() -> None:
    doc = orjson.loads(orjson.dumps(gate.baseline(RUNS)))
    # pooled baseline steps (12): median (10.9 + 11.1) / 2 = 11 ms; |deviations| sorted
    # .1 .1 .2 .2 .8 .8 .9 .9 1.1 1.1 1.9 1.9 -> MAD .85 -> robust sd 1.4826 x .85 = 1.26021 ms
    loaded = [16 * MS, 18 * MS, 22 * MS, 30 * MS, 40 * MS, 45 * MS]
    # a run slowed as a whole by a loaded machine: every step above every baseline step
    # (p = 1 / C(18, 6) = 1/18564), p50 26 ms > allowed 15.4478 ms, but its steps scatter:
    # |deviations from 26| 10 8 4 4 14 19 -> MAD 9 -> 13.3434 ms; effect (26 - 11) / 13.3434
    row = _row(gate.check({"step_time_p50_ns": 26 * MS}, doc,
                          now_samples={"step_time_ns": loaded}))
    assert row["p_value"] == pytest.approx(1 / 18564)
    assert row["effect_size"] == pytest.approx(15 / 13.3434, rel=1e-4)
    assert row["status"] == "inconclusive" and "own noise" in row["note"]
    assert "quieter machine" in row["note"]
    # the same run with the effect rule off (--min-effect 0) fails: the rule is what passes it
    assert _row(gate.check({"step_time_p50_ns": 26 * MS}, doc, min_effect=0.0,
                           now_samples={"step_time_ns": loaded}))["status"] == "regression"
    # a slowed rank moves every step by the same 40 ms: median 51.25, MAD .75 -> 1.11195 ms,
    # below the baseline's 1.26021, so effect = 40.25 / 1.26021 = 31.94
    slowed = [50 * MS, 50.5 * MS, 51 * MS, 51.5 * MS, 52 * MS, 52.5 * MS]
    row = _row(gate.check({"step_time_p50_ns": 51.25 * MS}, doc,
                          now_samples={"step_time_ns": slowed}))
    assert row["effect_size"] == pytest.approx(40.25 / 1.26021, rel=1e-4)
    assert row["status"] == "regression"


def test_a_test_that_cannot_reach_alpha_does_not_veto() -> None:
    # one run of 4 steps against 4 steps: the best one-sided p is 1 / C(8, 4) = 1/70 = 0.0143
    one = gate.baseline([RUNS[0]])
    assert one["metrics"]["step_time_p50_ns"]["spread"] == 0.0
    row = _row(gate.check({"step_time_p50_ns": 20 * MS}, one,
                          now_samples={"step_time_ns": [20 * MS, 20.1 * MS, 20.2 * MS,
                                                        20.3 * MS]}))
    assert row["p_value"] == pytest.approx(1 / 70)
    assert "not used" in row["test_method"] and row["status"] == "regression"


def test_one_sided_mann_whitney_by_hand() -> None:
    # x above y in all 9 pairs: one arrangement of C(6, 3) = 20, p = 1/20
    assert mann_whitney_u([4, 5, 6], [1, 2, 3], alternative="greater")["p_value"] == 0.05
    assert mann_whitney_u([1, 2, 3], [4, 5, 6], alternative="greater")["p_value"] == 1.0
    assert mann_whitney_u([1, 2, 3], [4, 5, 6])["p_value"] == 0.1  # two-sided unchanged
    with pytest.raises(ValueError):
        mann_whitney_u([1], [2], alternative="less")


def test_format_1_baselines_still_work() -> None:
    # a file written by the previous release: one value per metric, no spread, no samples
    old = (b'{"traceview_baseline": 1, "default_tolerance_pct": 10.0, "metrics": '
           b'{"step_time_p50_ns": {"value": 1000000.0, "unit": "ns", "definition": "x"}}}')
    doc = gate.read_baseline(old)
    ok = gate.check({"step_time_p50_ns": 1_090_000.0}, doc,
                    now_samples={"step_time_ns": [1_090_000] * 8})
    row = _row(ok)
    assert (row["status"], row["allowed"], row["spread"]) == ("ok", pytest.approx(1.1 * MS), 0.0)
    assert row["p_value"] is None  # no baseline samples: tolerance only, as before
    assert _row(gate.check({"step_time_p50_ns": 1_200_000.0}, doc))["status"] == "regression"
    with pytest.raises(gate.BaselineError):
        gate.read_baseline(b'{"traceview_baseline": 3, "metrics": {}}')
    with pytest.raises(gate.BaselineError):
        gate.read_baseline(b'{"traceview_baseline": 2, "metrics": {}, "samples": {"a": [1]}}')


def test_diff_change_frac_is_its_change_pct() -> None:
    base = run_tables(_load("gloo_ddp_2r"))
    res = diff_tables(base, run_tables(_load("gloo_ddp_2r_slow1"))).to_dict()
    row = next(m for m in res["metrics"] if m["metric"] == "step_time_ns")
    # diff's change_pct has always been a fraction: (36.650 - 8.810) / 8.810 = 3.16
    assert row["change_frac"] == row["change_pct"] == pytest.approx(3.16, abs=0.01)


def _load(name: str):
    import traceview

    return traceview.open(FIX / name)


# ------------------------------------------------------------------------- damaged input

def _cut_rank0(tmp_path: Path) -> Path:
    """gloo_ddp_2r with rank 0's trace cut off at 50% of its text (a write that stopped)."""
    out = tmp_path / "cut"
    out.mkdir()
    for f in sorted((FIX / "gloo_ddp_2r").iterdir()):
        data = f.read_bytes()
        if f.name.startswith("rank-0"):
            text = gzip.decompress(data)
            data = gzip.compress(text[: len(text) // 2])
        (out / f.name).write_bytes(data)
    return out


def test_check_fails_damaged_input_and_names_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "b.json"
    assert main(["baseline", str(FIX / "gloo_ddp_2r"), "-o", str(base), "--no-cache"]) == 0
    cut = _cut_rank0(tmp_path)
    capsys.readouterr()
    # wide tolerance: the only thing wrong is the input, and that alone fails the check
    code = main(["check", str(cut), "--baseline", str(base), "--tolerance", "all=100000",
                 "--json", "--no-cache"])
    res = orjson.loads(capsys.readouterr().out)
    assert code == 1 and res["exit_code"] == 1
    assert res["status"] == "damaged_input" and res["damaged_input"] is True
    assert res["warnings"] and all("rank-0.gloo_ddp.pt.trace.json.gz" in w
                                   for w in res["warnings"])
    code = main(["check", str(cut), "--baseline", str(base), "--tolerance", "all=100000",
                 "--junit", str(tmp_path / "j.xml"), "--no-cache"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL damaged input:" in out and "rank-0.gloo_ddp" in out
    case = ET.parse(tmp_path / "j.xml").getroot().find("testsuite/testcase[@name='input']")
    assert case is not None and case.find("failure") is not None
    # --allow-partial judges what is there; the warnings stay in the answer
    code = main(["check", str(cut), "--baseline", str(base), "--tolerance", "all=100000",
                 "--allow-partial", "--json", "--no-cache"])
    res = orjson.loads(capsys.readouterr().out)
    assert code == 0 and res["status"] == "ok" and res["warnings"]
    assert res["damaged_input"] is False
    # a baseline of damaged input records the warnings, per run and in all
    assert main(["baseline", str(cut), "-o", str(base), "--no-cache"]) == 0
    doc = orjson.loads(base.read_bytes())
    assert doc["warnings"] and doc["runs"][0]["warnings"] == doc["warnings"]


def test_baseline_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "b.json")
    assert main(["baseline", "-o", out]) == 2
    assert main(["baseline", str(FIX / "gloo_ddp_2r"), "--run", str(FIX / "gloo_ddp_2r"),
                 "-o", out]) == 2
    assert "not both" in capsys.readouterr().err


# ------------------------------------------------------------- real re-runs of one job

NOISE = FIX / "gate_noise"  # fixtures/data/gate_noise/README.md: how they were made


@pytest.fixture(scope="module")
def reruns() -> dict[str, gate.RunMetrics]:
    """Three unchanged re-runs of one gloo job and one run with rank 1 slowed by 40 ms/step."""
    import traceview

    return {name: gate.measure(traceview.open(NOISE / name))
            for name in ("same_1", "same_2", "same_3", "slow_1")}


def _judge(run: gate.RunMetrics, doc: dict) -> gate.CheckResult:
    doc = orjson.loads(orjson.dumps(doc))  # as `check` reads it from the file
    return gate.check(run.values, doc, now_notes=run.notes, now_samples=run.samples,
                      warnings=run.warnings)


def test_two_run_baseline_passes_a_rerun_and_fails_a_slowed_rank(
        reruns: dict[str, gate.RunMetrics]) -> None:
    doc = gate.baseline([reruns["same_1"], reruns["same_2"]])
    a, b = (reruns[n].values["step_time_p50_ns"] for n in ("same_1", "same_2"))
    entry = doc["metrics"]["step_time_p50_ns"]
    # two runs: centre is their mean, MAD is half their difference
    assert entry["centre"] == pytest.approx((a + b) / 2)
    assert entry["spread"] == pytest.approx(1.4826 * abs(a - b) / 2)
    assert [len(xs) for xs in doc["samples"]["step_time_ns"]] == [12, 12]  # 2 ranks x 6 steps
    rerun = _judge(reruns["same_3"], doc)
    assert rerun.exit_code == 0 and rerun.status == "ok", rerun.rows
    slowed = _judge(reruns["slow_1"], doc)
    assert slowed.exit_code == 1 and slowed.status == "regression"
    failed = slowed.rows.filter(slowed.rows["status"] == "regression")
    assert "step_time_p50_ns" in failed["metric"].to_list()
    assert (failed["p_value"] < gate.DEFAULT_ALPHA).all()  # the steps are slower too


def test_single_run_baseline_on_real_reruns(reruns: dict[str, gate.RunMetrics]) -> None:
    doc = gate.baseline([reruns["same_1"]])
    row = _row(_judge(reruns["same_3"], doc))
    # one run: no spread, the tolerance decides (12 steps against 12 can reach alpha)
    assert (row["baseline_runs"], row["spread"], row["status"]) == (1, 0.0, "ok")
    assert row["allowed"] == pytest.approx(max(row["baseline"] * 1.1,
                                               row["baseline"] + gate.SLACK["ns"]))
    slowed = _judge(reruns["slow_1"], doc)
    assert slowed.exit_code == 1
    assert _row(slowed)["status"] == "regression"


# ------------------------------------------------- a baseline too small to decide (corpus)

CORPUS = Path(os.environ.get("TRACEVIEW_CORPUS")
              or Path(__file__).resolve().parents[1].parent / "shared" / "corpus")
RESNET = CORPUS / "kineto" / "tb_plugin" / "samples"
RESNET_BASE = RESNET / "resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz"
RESNET_NOW = RESNET / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"


@pytest.mark.skipif(not (RESNET_BASE.exists() and RESNET_NOW.exists()),
                    reason=f"the ResNet-50 sample traces are not under {RESNET}")
def test_resnet50_plus_39_percent_is_never_ok(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A one-run baseline of 6 steps (116-182 ms) and a run whose median step is +39%, 5 of
    its 6 steps slower: U = 30 of 36, exact one-sided p = 0.032 >= 0.01. The step test cannot
    decide, so the metric is inconclusive (it was `ok`); at theta = 30/36 the estimate says
    15 baseline steps, 3 runs of 6, would decide."""
    base = tmp_path / "resnet.json"
    assert main(["baseline", str(RESNET_BASE), "-o", str(base)]) == 0
    capsys.readouterr()
    code = main(["check", str(RESNET_NOW), "--baseline", str(base), "--json"])
    res = orjson.loads(capsys.readouterr().out)
    row = next(r for r in res["metrics"] if r["metric"] == "step_time_p50_ns")
    assert row["change_pct"] == pytest.approx(39.3, abs=0.1)
    assert row["p_value"] == pytest.approx(0.0325, abs=1e-4)
    assert row["status"] == "inconclusive"
    assert "3 baseline runs (15 steps) would decide" in row["note"]
    assert code == res["exit_code"] == 1  # gpu_idle_fraction +69% fails on its tolerance
    # --inconclusive fail marks the undecided metric as failing in the text too
    assert main(["check", str(RESNET_NOW), "--baseline", str(base),
                 "--inconclusive", "fail"]) == 1
    assert "FAIL inconclusive: step_time_p50_ns" in capsys.readouterr().out
