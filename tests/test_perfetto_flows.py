"""export-perfetto keeps what the inputs had to show: launch -> kernel arrows land on their
kernels, counters and memory tracks stay, and a ``.gz`` name gets gzip."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from traceview.cli import main

H100 = Path("/work/shared/corpus/tracelens/tests/traces/h100/"
            "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    from fixtures import synthetic

    out = tmp_path_factory.mktemp("gpu2")
    synthetic.main(["--out", str(out), "--world-size", "2", "--steps", "2", "--seed", "1"])
    return str(out)


def _export(capsys, src: str, out: Path) -> list[dict]:
    assert main(["export-perfetto", src, "-o", str(out)]) == 0
    capsys.readouterr()
    raw = out.read_bytes()
    assert raw[:2] == b"\x1f\x8b"  # gzip, as the name says
    return json.loads(gzip.decompress(raw))["traceEvents"]


def _landing(events: list[dict]) -> tuple[int, int]:
    """(flow ends, those inside a slice of their track: where Perfetto draws the arrow to)."""
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    ends = [e for e in events if e["ph"] in ("s", "f")]
    inside = sum(any(a <= e["ts"] <= b for a, b in slices.get((e["pid"], e["tid"]), []))
                 for e in ends)
    return len(ends), inside


def test_synthetic_flows_land_on_launch_and_kernel(gpu_run, tmp_path, capsys) -> None:
    events = _export(capsys, gpu_run, tmp_path / "merged.json.gz")
    phases = Counter(e["ph"] for e in events)
    assert phases["s"] == phases["f"] > 0
    ends, inside = _landing(events)
    assert inside == ends
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(names[(e["pid"], e["tid"])].startswith("GPU ")
               for e in events if e["ph"] == "f")
    # one id per arrow, across ranks: an id has its s and its f on one rank
    ids: dict[int, set[tuple[str, int]]] = {}
    for e in events:
        if e["ph"] in ("s", "f"):
            ids.setdefault(e["id"], set()).add((e["ph"], e["pid"]))
    assert all(len(v) == 2 and len({p for _, p in v}) == 1 for v in ids.values())


def test_plain_json_name_stays_plain(gpu_run, tmp_path, capsys) -> None:
    out = tmp_path / "merged.json"
    assert main(["export-perfetto", gpu_run, "-o", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]


@pytest.mark.skipif(not H100.is_file(), reason="TraceLens corpus not present")
def test_real_h100_trace_keeps_flows_and_memory(tmp_path, capsys) -> None:
    events = _export(capsys, str(H100), tmp_path / "h100.json.gz")
    phases = Counter(e["ph"] for e in events)
    assert phases["s"] > 1000 and phases["f"] > 1000
    ends, inside = _landing(events)
    assert inside >= 0.95 * ends
    memory = [e for e in events if e["ph"] == "C" and e["name"].startswith("memory (")]
    assert len(memory) == 2450  # one sample per allocator event
    assert {"allocated_bytes", "reserved_bytes"} <= set(memory[0]["args"])
    assert sum(e["name"] == "[memory]" and e["ph"] == "i" for e in events) == 2450
