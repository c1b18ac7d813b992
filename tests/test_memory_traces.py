"""``traceview memory`` on traces: hand-made Kineto traces whose answers are derived by hand,
the real CPU fixture against an independent reading of its JSON, and corpus traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from helpers import write_trace
from traceview.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "cpu_memory"
MB = 1_000_000


def mem(ts: int, nbytes: int, allocated: int | None = None, reserved: int | None = None, *,
        dtype: int = 1, device: int = 0, tid: int = 1) -> dict:
    args = {"Device Type": dtype, "Device Id": device, "Bytes": nbytes}
    if allocated is not None:
        args |= {"Total Allocated": allocated, "Total Reserved": reserved}
    return {"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1,
            "tid": tid, "ts": ts, "args": args}


def op(name: str, ts: int, dur: int, *, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {}}


def steps(*bounds: int) -> list[dict]:
    return [op(f"ProfilerStep#{i + 1}", a, b - a, cat="user_annotation")
            for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def gpu_totals_trace(path: Path) -> Path:
    """Rank 0 on a 1,000,000-byte GPU, three 100 µs steps. cuda:0 after each event
    (allocated / reserved): 20 µs 600k/800k (+400k), 50 µs 300k/800k, 120 µs 800k/950k
    (+500k, inside aten::cat inside aten::linear), 150 µs 700k/950k, 250 µs 500k/950k.
    By hand: peak allocated 800,000 at 120 µs in aten::cat; peak reserved 950,000 > 90% of
    the device's 1,000,000: near the limit (800k is 84% of 950k: the cache is not full).
    Allocated 900,000 B over 20..250 µs = 900,000 / 230e-6 s. At the step starts: 0 µs:
    before the first event, 600k − 400k = 200,000; 100 µs: 300,000; 200 µs: 700,000: grown
    500,000, far below a leak. The host allocated 64 B (cpu, reserving nothing)."""
    return write_trace(path, [
        *steps(0, 100, 200, 300),
        op("aten::linear", 100, 50), op("aten::cat", 110, 20), op("aten::mm", 10, 30),
        mem(20, 400_000, 600_000, 800_000), mem(30, 64, 64, 0, dtype=0, device=-1),
        mem(50, -300_000, 300_000, 800_000), mem(120, 500_000, 800_000, 950_000),
        mem(150, -100_000, 700_000, 950_000), mem(250, -200_000, 500_000, 950_000),
    ], distributedInfo={"rank": 0, "world_size": 1},
        deviceProperties=[{"id": 0, "name": "Test GPU", "totalGlobalMem": 1_000_000}])


def bytes_only_trace(path: Path) -> Path:
    """An older trace: Bytes only. cuda:0 running sum 100, 400, 150, 650, 50 at 10..50 µs:
    peak 650 relative to the trace's start, at 40 µs. Steps [0,35) [35,60): allocated 0 at
    the first start, 150 at the second."""
    return write_trace(path, [
        *steps(0, 35, 60), mem(10, 100), mem(20, 300), mem(30, -250), mem(40, 500),
        mem(50, -600)], distributedInfo={"rank": 1, "world_size": 2})


def leak_trace(path: Path, starts_mb: list[int]) -> Path:
    """1,000 MB allocated before the first step (at 1 µs); then one event per 100 µs step,
    halfway through it, taking allocated to 1,000 + ``starts_mb[i+1]`` MB by the next step
    start (reserved 1 MB above it)."""
    n = len(starts_mb)
    events = steps(*range(100, 100 * (n + 2), 100))
    level = 1000 * MB
    events.append(mem(1, level, level, level + MB))
    for i, target in enumerate(starts_mb[1:]):
        new = 1000 * MB + target * MB
        events.append(mem(100 * (i + 1) + 50, new - level, new, new + MB))
        level = new
    return write_trace(path, events, distributedInfo={"rank": 0, "world_size": 1})


def _devices(path: Path, **kw) -> dict[str, dict]:
    res = traceview.open(path, cache=False).memory(**kw)
    return {r["device"]: r for r in res.table("devices").iter_rows(named=True)}


def test_absolute_totals_by_hand(tmp_path: Path) -> None:
    path = gpu_totals_trace(tmp_path / "gpu.json")
    res = traceview.open(path, cache=False).memory()
    d = {r["device"]: r for r in res.table("devices").iter_rows(named=True)}
    gpu, cpu = d["cuda:0"], d["cpu"]
    assert (gpu["basis"], gpu["peak_allocated_bytes"], gpu["peak_reserved_bytes"],
            gpu["peak_time_ns"], gpu["peak_op"]) == ("absolute", 800_000, 950_000, 120_000,
                                                     "aten::cat")
    assert gpu["end_allocated_bytes"] == 500_000 and gpu["events"] == 5
    assert gpu["allocation_rate_bytes_per_s"] == pytest.approx(900_000 / 230e-6)
    assert gpu["device_total_bytes"] == 1_000_000 and gpu["near_limit"]
    assert gpu["pressure"] == "peak reserved 950000 B is above 90% of the device's 1000000 B"
    assert (cpu["peak_allocated_bytes"], cpu["peak_reserved_bytes"], cpu["peak_op"],
            cpu["device_total_bytes"], cpu["near_limit"]) == (64, None, "aten::mm", None, False)
    st = res.table("steps").filter(pl.col("device") == "cuda:0")
    assert st.select("step", "allocated_bytes").rows() == [(1, 200_000), (2, 300_000),
                                                          (3, 700_000)]
    assert gpu["growth_bytes"] == 500_000 and not gpu["leak_suspected"]
    assert any("rank 0 cuda:0: near the limit: peak reserved 950000 B" in w
               for w in res.warnings)


def test_bytes_only_is_relative_to_the_trace_start(tmp_path: Path) -> None:
    res = traceview.open(bytes_only_trace(tmp_path / "old.json"), cache=False).memory()
    row = res.table("devices").row(0, named=True)
    assert (row["rank"], row["device"], row["basis"], row["peak_allocated_bytes"],
            row["peak_reserved_bytes"], row["peak_time_ns"], row["end_allocated_bytes"]) == (
        1, "cuda:0", "relative", 650, None, 40_000, 50)
    assert res.table("steps").select("step", "allocated_bytes").rows() == [(1, 0), (2, 150)]


@pytest.mark.parametrize(("starts_mb", "leak"), [
    ([0, 40, 80, 120], True),              # +120 MB, every step: a leak
    ([0, 200, 100, 150, 120], False),      # +120 MB, but up and down: not steady
    ([0, 30, 60, 90], False),              # steady, +90 MB: under the rule of thumb
    ([0, 150], False),                     # one change is no trend
])
def test_leak_rule_of_thumb(tmp_path: Path, starts_mb: list[int], leak: bool) -> None:
    res = traceview.open(leak_trace(tmp_path / "leak.json", starts_mb), cache=False).memory()
    row = res.table("devices").row(0, named=True)
    assert row["growth_bytes"] == (starts_mb[-1] - starts_mb[0]) * MB
    assert row["leak_suspected"] is leak
    assert any("a leak?" in w for w in res.warnings) is leak
    # reserved is 1 MB above allocated: the cache is full
    assert row["near_limit"] and "above 95% of peak reserved" in row["pressure"]


def test_a_rank_without_allocator_events_is_named(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank-0.json", [*steps(0, 10), mem(5, 10, 10, 20)],
                distributedInfo={"rank": 0, "world_size": 2})
    write_trace(tmp_path / "rank-1.json", steps(0, 10), distributedInfo={"rank": 1,
                                                                          "world_size": 2})
    res = traceview.open(tmp_path, cache=False).memory()
    assert res.table("devices")["rank"].to_list() == [0]
    assert "memory: rank 1: no allocator events (record with profile_memory=True, or nsys " \
        "--cuda-memory-usage=true)" in res.warnings


def test_cli_json_is_the_run_answer_and_text_shows_the_peak(tmp_path: Path, capsys) -> None:
    path = gpu_totals_trace(tmp_path / "gpu.json")
    assert main(["memory", str(path), "--json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == traceview.open(path, cache=False).memory().to_dict()
    first = doc["devices"][0]
    assert list(first)[:7] == ["rank", "device", "peak_allocated_bytes", "peak_reserved_bytes",
                               "peak_time_ns", "peak_op", "basis"]
    assert main(["memory", str(path), "--no-cache"]) == 0
    out, err = capsys.readouterr()
    assert "cuda:0" in out and "aten::cat" in out and "near the limit" in err


def _raw_memory(path: Path) -> list[dict]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    base = doc.get("baseTimeNanoseconds", 0)
    rows = [dict(e["args"], ts_ns=base + round(e["ts"] * 1000)) for e in doc["traceEvents"]
            if e.get("name") == "[memory]"]
    return sorted(rows, key=lambda r: r["ts_ns"])  # stable: file order within a time


def test_real_cpu_trace_against_its_json() -> None:
    """The recorded fixture (torch 2.13.0+cpu, profile_memory=True, a 40 MiB/step leak):
    peak and step-start levels as an independent reading of its JSON gives them."""
    trace = next(FIXTURE.glob("*.json.gz"))
    raw = _raw_memory(trace)
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    base = doc["baseTimeNanoseconds"]
    starts = sorted(base + round(e["ts"] * 1000) for e in doc["traceEvents"]
                    if e.get("name", "").startswith("ProfilerStep#"))
    peak = max(r["Total Allocated"] for r in raw)
    at_start = []
    for s in starts:
        before = [r for r in raw if r["ts_ns"] < s]
        at_start.append(before[-1]["Total Allocated"] if before else
                        raw[0]["Total Allocated"] - raw[0]["Bytes"])
    res = traceview.open(FIXTURE, cache=False).memory()
    row = res.table("devices").row(0, named=True)
    assert (row["device"], row["basis"], row["peak_allocated_bytes"]) == ("cpu", "absolute", peak)
    assert row["peak_time_ns"] == next(r["ts_ns"] for r in raw if r["Total Allocated"] == peak)
    assert res.table("steps")["allocated_bytes"].to_list() == at_start
    assert row["growth_bytes"] == at_start[-1] - at_start[0] == 167_885_100
    assert row["leak_suspected"] and row["peak_op"] == "aten::empty"


def _corpus_trace(corpus: Path, rel: str) -> Path:
    path = corpus / rel
    if not path.exists():
        pytest.skip(f"{rel} not in the corpus")
    return path


def test_corpus_gpu_trace_with_totals(corpus: Path) -> None:
    path = _corpus_trace(corpus, "tracelens/tests/traces/h100/"
                                 "gaunernst_bert-small-uncased__1016001.json.gz")
    raw = [r for r in _raw_memory(path) if r["Device Type"] == 1]
    d = _devices(path)["cuda:0"]
    assert d["basis"] == "absolute"
    assert d["peak_allocated_bytes"] == max(r["Total Allocated"] for r in raw)
    assert d["peak_reserved_bytes"] == max(r["Total Reserved"] for r in raw)
    assert d["device_total_bytes"] == 85018279936 and not d["near_limit"]


def test_corpus_older_gpu_trace_with_bytes_only(corpus: Path) -> None:
    path = _corpus_trace(corpus, "kineto/tb_plugin/samples/resnet50_num_workers_0/"
                                 "worker0.1623143089861.pt.trace.json.gz")
    raw = [r for r in _raw_memory(path) if r["Device Type"] == 1]
    level, peak = 0, 0
    for r in raw:
        level += r["Bytes"]
        peak = max(peak, level)
    d = _devices(path)["cuda:0"]
    assert (d["basis"], d["peak_allocated_bytes"], d["end_allocated_bytes"],
            d["peak_reserved_bytes"]) == ("relative", peak, level, None)
