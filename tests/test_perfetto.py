"""Merged Chrome-trace export: one process per rank on the aligned clock, gap and wait
annotations, structure Perfetto's and chrome://tracing's JSON importers accept."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from tests.test_report_trace import EVIL, NCCL, two_rank_trace
from traceview.cli import main
from traceview.outputs.perfetto import export

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"
SHIFT = 5_000_000_000  # rank 1's clock runs 5 s ahead


def _export(events) -> tuple[dict, dict]:
    buf = io.StringIO()
    info = export(events, buf)
    return orjson.loads(buf.getvalue()), info


def check_structure(doc: dict) -> None:
    """What the JSON importers need: typed fields, balanced async pairs, and X slices that nest
    properly on each thread (Perfetto drops partially overlapping ones)."""
    assert isinstance(doc["traceEvents"], list)
    per_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    opened: dict[tuple[int, str], int] = defaultdict(int)
    for e in doc["traceEvents"]:
        assert e["ph"] in {"X", "i", "M", "b", "e", "s", "t", "f", "C"}  # flows, counters kept
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] in ("s", "t", "f"):
            assert isinstance(e["id"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
            assert isinstance(e["tid"], int) and isinstance(e.get("args", {}), dict)
            per_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] in ("b", "e"):
            opened[(e["pid"], e["id"])] += 1 if e["ph"] == "b" else -1
    assert all(v == 0 for v in opened.values())
    eps = 1e-6
    for spans in per_thread.values():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start + eps:
                stack.pop()
            assert not stack or end <= stack[-1] + eps, "partially overlapping slices"
            stack.append(end)


def test_export_aligns_ranks_and_annotates() -> None:
    doc, info = _export(two_rank_trace(SHIFT))
    check_structure(doc)
    ev = doc["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    # origin = the earliest aligned event (rank 0's first ProfilerStep at 0)
    assert doc["otherData"]["traceview_origin_ns"] == 0
    assert doc["otherData"]["offsets_ns"] == {"0": 0, "1": SHIFT}
    # the all-reduce completes at 800 us on both ranks after alignment (raw: 5 s apart)
    ends = sorted((e["pid"], e["ts"], e["ts"] + e["dur"]) for e in ev
                  if e.get("ph") == "X" and e["name"] == NCCL)
    assert ends == [(0, 400.0, 800.0), (0, 1400.0, 1800.0), (1, 600.0, 800.0),
                    (1, 1600.0, 1800.0)]
    # names kept byte for byte (JSON, not HTML)
    assert any(e["name"] == EVIL for e in ev)
    # gaps: [800, 1100) us on each rank, cause between_steps
    gaps = sorted((e["pid"], e["ts"], e["dur"], e["args"]["cause"]) for e in ev
                  if e.get("cat") == "traceview.gap")
    assert gaps == [(0, 800.0, 300.0, "between_steps"), (1, 800.0, 300.0, "between_steps")]
    # waits: rank 0 waits 200 us for rank 1 at each all-reduce
    begins = sorted((e["pid"], e["ts"], e["name"], e["args"]["wait_ns"]) for e in ev
                    if e.get("cat") == "traceview.wait" and e["ph"] == "b")
    assert begins == [(0, 400.0, "wait for rank 1: all_reduce", 200_000),
                      (0, 1400.0, "wait for rank 1: all_reduce", 200_000)]
    ends_w = sorted(e["ts"] for e in ev if e.get("cat") == "traceview.wait" and e["ph"] == "e")
    assert ends_w == [600.0, 1600.0]
    assert info["gaps"] == 2 and info["waits"] == 2 and info["ranks"] == 2
    threads = {(e["pid"], e["args"]["name"]) for e in ev if e["name"] == "thread_name"}
    assert (0, "GPU 0 stream 7") in threads and (1, "traceview: GPU idle (device 0)") in threads


def test_ns_precision_is_kept() -> None:
    ev = two_rank_trace().with_columns(ts_ns=__import__("polars").col("ts_ns") + 7)
    doc, _ = _export(ev)
    ts = {e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == EVIL}
    assert ts == {100.0, 1100.0}  # +7 ns everywhere: the origin moves with it
    ev2 = two_rank_trace().with_columns(
        ts_ns=__import__("polars").when(__import__("polars").col("name") == EVIL)
        .then(__import__("polars").col("ts_ns") + 1).otherwise(__import__("polars").col("ts_ns")))
    doc, _ = _export(ev2)
    ts = sorted({e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"] == EVIL})
    assert ts == [100.001, 1100.001]


def test_cli_export_on_slowed_gloo_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "merged.json"
    assert main(["export-perfetto", str(FIX / "gloo_ddp_2r_slow1"), "-o", str(out), "--json",
                 "--no-cache"]) == 0
    info = orjson.loads(capsys.readouterr().out)
    doc = orjson.loads(out.read_bytes())
    check_structure(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "process_name"}
    assert set(procs) == {0, 1} and "straggler" in procs[1]
    assert info["stragglers"] == [1] and info["waits"] > 0
    waited = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "traceview.wait"}
    assert 0 in waited
