"""CI gate: metrics by hand, tolerance arithmetic, JUnit XML, CLI exit codes, determinism."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import orjson
import pytest

from tests.test_report_trace import two_rank_trace
from traceview.outputs import gate
from traceview.cli import main
from traceview.errors import UsageError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def test_extract_metrics_by_hand() -> None:
    # every value derived in tests/test_report_trace.py; a 5 s clock shift on rank 1 changes
    # nothing (alignment from the simultaneous NCCL completions)
    for shift in (0, 5_000_000_000):
        metrics, notes = gate.extract_metrics(two_rank_trace(shift))
        assert notes == {}
        assert metrics == {
            "step_time_p50_ns": 1_000_000.0, "step_time_max_ns": 1_000_000.0,
            "compute_per_step_ns": 400_000.0, "exposed_comm_per_step_ns": 300_000.0,
            "idle_per_step_ns": 150_000.0, "gpu_idle_fraction": pytest.approx(0.6 / 3.4),
            "collective_wait_per_step_ns": 100_000.0,
            "straggler_imposed_wait_per_step_ns": 200_000.0}


def _doc(**values: float | None) -> dict:
    metrics = {m: values.get(m) for m in gate.METRICS}
    return gate.baseline(metrics, {m: "n/a" for m in gate.METRICS if values.get(m) is None})


def test_check_tolerance_slack_and_statuses() -> None:
    doc = _doc(step_time_p50_ns=1_000_000.0, idle_per_step_ns=0.0, gpu_idle_fraction=0.2,
               collective_wait_per_step_ns=100_000.0)
    now = {"step_time_p50_ns": 1_090_000.0,        # +9% <= 10%: ok
           "idle_per_step_ns": 40_000.0,           # baseline 0: allowed = 0 + 50 us slack
           "gpu_idle_fraction": 0.25,              # allowed max(0.22, 0.21) = 0.22: regression
           "collective_wait_per_step_ns": None}    # had a value, now none: missing
    res = gate.check(now, doc)
    rows = {r["metric"]: r for r in res.rows.to_dicts()}
    assert rows["step_time_p50_ns"]["status"] == "ok"
    assert rows["step_time_p50_ns"]["allowed"] == pytest.approx(1_100_000.0)
    assert rows["step_time_p50_ns"]["change_pct"] == pytest.approx(9.0)
    assert rows["idle_per_step_ns"]["status"] == "ok"
    assert rows["idle_per_step_ns"]["allowed"] == 50_000.0
    assert rows["gpu_idle_fraction"]["status"] == "regression"
    assert rows["gpu_idle_fraction"]["allowed"] == pytest.approx(0.22)
    assert rows["collective_wait_per_step_ns"]["status"] == "missing"
    assert rows["compute_per_step_ns"]["status"] == "unavailable"
    assert res.failed and res.exit_code == 1
    # a wider tolerance on the command line beats the default; the missing metric still fails
    res = gate.check(now, doc, tolerances={"gpu_idle_fraction": 30.0})
    assert {r["metric"]: r["status"] for r in res.rows.to_dicts()}["gpu_idle_fraction"] == "ok"
    now["collective_wait_per_step_ns"] = 100_000.0
    assert gate.check(now, doc, tolerances={"gpu_idle_fraction": 30.0}).exit_code == 0


def test_stored_tolerance_and_precedence() -> None:
    metrics = {m: 1_000_000.0 for m in gate.METRICS}
    doc = gate.baseline(metrics, {}, tolerances={"step_time_p50_ns": 50.0})
    now = dict(metrics, step_time_p50_ns=1_400_000.0)
    assert gate.check(now, doc).exit_code == 0                       # stored 50%
    assert gate.check(now, doc, tolerances={"step_time_p50_ns": 20.0}).exit_code == 1


def test_parse_tolerances() -> None:
    assert gate.parse_tolerances(["all=5", "step_time_p50_ns=12.5%"])["step_time_p50_ns"] == 12.5
    assert gate.parse_tolerances(["*=7"])["gpu_idle_fraction"] == 7.0
    for bad in (["nope=3"], ["step_time_p50_ns"], ["step_time_p50_ns=-1"],
                ["step_time_p50_ns=abc"]):
        with pytest.raises(UsageError):
            gate.parse_tolerances(bad)


def test_read_baseline_rejects_non_baselines() -> None:
    for text in (b"{", b"[]", b'{"metrics": {}}',
                 b'{"traceview_baseline": 1, "metrics": {"x": {"value": "7"}}}'):
        with pytest.raises(gate.BaselineError):
            gate.read_baseline(text)


def test_junit_xml() -> None:
    doc = _doc(step_time_p50_ns=1_000_000.0, idle_per_step_ns=100_000.0)
    res = gate.check({"step_time_p50_ns": 2_000_000.0, "idle_per_step_ns": 100_000.0}, doc)
    root = ET.fromstring(gate.junit_xml(res))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(gate.METRICS))
    assert suite.get("failures") == "1" and suite.get("skipped") == str(len(gate.METRICS) - 2)
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    fail = cases["step_time_p50_ns"].find("failure")
    assert fail is not None and "now 2.000 ms (+100.0%) > allowed 1.100 ms" in fail.get("message")
    assert cases["idle_per_step_ns"].find("failure") is None


# ----------------------------------------------------------------------------------- CLI

def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_cli_gate_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "baseline.json"
    code, _ = _run(capsys, "baseline", str(FIX / "gloo_ddp_2r"), "-o", str(base), "--no-cache")
    assert code == 0
    doc = orjson.loads(base.read_bytes())
    assert doc["metrics"]["step_time_p50_ns"]["value"] > 0
    assert doc["metrics"]["gpu_idle_fraction"]["value"] is None  # CPU-only: stated, not failed
    assert "CPU-only" in doc["metrics"]["gpu_idle_fraction"]["note"]

    junit = tmp_path / "same.xml"
    code, out = _run(capsys, "check", str(FIX / "gloo_ddp_2r"), "--baseline", str(base),
                     "--json", "--junit", str(junit), "--no-cache")
    first = out
    assert code == 0
    res = orjson.loads(out)
    assert res["status"] == "ok" and res["exit_code"] == 0
    row = next(m for m in res["metrics"] if m["metric"] == "step_time_p50_ns")
    assert {"baseline", "now", "allowed"} <= set(row) and row["now"] == row["baseline"]
    # deterministic: identical inputs, identical bytes (stdout and JUnit)
    junit_bytes = junit.read_bytes()
    code, out = _run(capsys, "check", str(FIX / "gloo_ddp_2r"), "--baseline", str(base),
                     "--json", "--junit", str(junit), "--no-cache")
    assert out == first and junit.read_bytes() == junit_bytes

    # the slowed run regresses: exit 1, step time and the waits it imposes fail
    code, out = _run(capsys, "check", str(FIX / "gloo_ddp_2r_slow1"), "--baseline", str(base),
                     "--json", "--no-cache")
    assert code == 1
    failed = {m["metric"] for m in orjson.loads(out)["metrics"] if m["status"] == "regression"}
    assert {"step_time_p50_ns", "collective_wait_per_step_ns"} <= failed
    code, out = _run(capsys, "check", str(FIX / "gloo_ddp_2r_slow1"), "--baseline", str(base),
                     "--no-cache")
    assert code == 1 and "FAIL step_time_p50_ns" in out and "check: REGRESSION" in out
    # ... unless the tolerance allows it
    code, _ = _run(capsys, "check", str(FIX / "gloo_ddp_2r_slow1"), "--baseline", str(base),
                   "--tolerance", "all=100000", "--no-cache")
    assert code == 0


def test_cli_gate_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    trace = str(FIX / "gloo_ddp_2r")
    assert main(["check", trace, "--baseline", str(bad), "--no-cache"]) == 2
    assert main(["check", trace, "--baseline", str(tmp_path / "none.json"), "--no-cache"]) == 2
    good = tmp_path / "b.json"
    good.write_text(orjson.dumps(gate.baseline({m: 1.0 for m in gate.METRICS}, {})).decode())
    assert main(["check", trace, "--baseline", str(good), "--tolerance", "x=1",
                 "--no-cache"]) == 2
    assert main(["check", str(tmp_path / "no-such-trace.json"), "--baseline", str(good),
                 "--no-cache"]) == 2
    assert "traceview:" in capsys.readouterr().err


def test_cli_baseline_is_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        assert main(["baseline", str(FIX / "gloo_ddp_2r_slow1"), "-o", str(out),
                     "--no-cache"]) == 0
    assert a.read_bytes() == b.read_bytes()
