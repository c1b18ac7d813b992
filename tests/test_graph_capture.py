"""Kernels replayed from a CUDA/HIP graph charged to the ops captured into it
(analyses/graph_capture.py, ``--graph-capture``). Hand-drawn Kineto traces: a replay trace
whose graph launches run the nodes, a capture trace whose ops launched them between
``cudaStreamBeginCapture`` and ``cudaStreamEndCapture``. Every answer derived by hand."""

from __future__ import annotations

import json

import polars as pl
import pytest

import traceview
from tests.helpers import write_trace
from traceview.cli import main

MM_DIMS = [[4, 8], [8, 16]]


def _op(name: str, ts: float, dur: float, dims: list | None = None) -> dict:
    args = {} if dims is None else {"Input Dims": dims, "Input type": ["float"] * len(dims)}
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def _call(name: str, ts: float, dur: float, corr: int, kernel: str | None = None) -> dict:
    args: dict = {"correlation": corr}
    if kernel is not None:
        args["kernel"] = kernel  # ROCm's profiler names the kernel on the launch call
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": args}


def _gpu(name: str, ts: float, dur: float, corr: int, stream: int = 7,
         node: int | None = None) -> dict:
    cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
    args = {"correlation": corr, "stream": stream, "device": 0}
    if node is not None:
        args |= {"graph id": 3, "graph node id": node}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": args}


def _replay_trace(path, nodes: bool = False):
    """Two replays of one graph (launches 500 and 501), each running kA, kB, kA and a copy;
    and a plain launch of kC from aten::mul. Replay 500: kA 10 µs, kB 4, kA 6, copy 1;
    replay 501: kA 8, kB 3, kA 5, copy 1."""
    ev = [_op("CUDAGraph::replay", 0, 100), _call("cudaGraphLaunch", 10, 5, 500),
          _gpu("kA", 20, 10, 500), _gpu("kB", 30, 4, 500), _gpu("kA", 35, 6, 500),
          _gpu("Memcpy DtoD (Device -> Device)", 41, 1, 500),
          _op("CUDAGraph::replay", 200, 100), _call("cudaGraphLaunch", 210, 5, 501),
          _gpu("kA", 220, 8, 501), _gpu("kB", 228, 3, 501), _gpu("kA", 232, 5, 501),
          _gpu("Memcpy DtoD (Device -> Device)", 237, 1, 501),
          _op("aten::mul", 400, 50), _call("cudaLaunchKernel", 410, 5, 600),
          _gpu("kC", 420, 5, 600)]
    return write_trace(path, ev)


def _window(t0: float, corr0: int, names=("kA", "kB", "kA"), mm_dims=MM_DIMS,
            extra: str | None = None) -> list[dict]:
    """One capture from ``t0``: aten::mm launches names[0], aten::relu names[1], aten::add
    names[2], aten::copy_ a copy; ``names`` None: the calls name no kernel (CUPTI)."""
    k = names or (None, None, None)
    ev = [_call("cudaStreamBeginCapture", t0, 2, corr0),
          _op("aten::mm", t0 + 5, 15, mm_dims), _call("cudaLaunchKernel", t0 + 6, 3, corr0 + 1, k[0]),
          _op("aten::relu", t0 + 20, 10, [[4, 16]]),
          _call("cudaLaunchKernel", t0 + 22, 2, corr0 + 2, k[1]),
          _op("aten::add", t0 + 30, 10, [[4, 16], [4, 16]]),
          _call("cudaLaunchKernel", t0 + 32, 2, corr0 + 3, k[2]),
          _op("aten::copy_", t0 + 40, 10, [[4, 16], [4, 16]]),
          _call("cudaMemcpyAsync", t0 + 42, 2, corr0 + 4)]
    if extra is not None:  # a launch the replay does not run
        ev += [_op("aten::zero_", t0 + 50, 5), _call("cudaLaunchKernel", t0 + 51, 2, corr0 + 5,
                                                      extra)]
    return ev + [_call("cudaStreamEndCapture", t0 + 60, 2, corr0 + 9)]


def _capture_trace(path, *windows: list[dict]):
    # a launch outside every capture: not a node of any graph
    outside = [_op("aten::mm", 900, 20, MM_DIMS), _call("cudaLaunchKernel", 905, 3, 990, "kA")]
    return write_trace(path, [e for w in windows for e in w] + outside)


def _by_name(run) -> dict[str, tuple[int, int, int]]:
    """op name -> (count, owned GPU ns, direct GPU ns), from ``ops --by name``."""
    table = run.ops(by="name")["ops"]
    return {r["name"]: (r["count"], r["kernel_time_ns"], r["direct_kernel_time_ns"])
            for r in table.iter_rows(named=True)}


def test_replayed_kernels_go_to_the_captured_ops(tmp_path) -> None:
    replay = _replay_trace(tmp_path / "replay.json")
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10))
    run = traceview.open(replay, graph_capture=capture)
    # per replay: aten::mm owns the first kA, relu kB, add the second kA, copy_ the copy;
    # one instance per (op, replay): two of each; kC stays aten::mul's
    assert _by_name(run) == {"aten::mm": (2, 18_000, 18_000), "aten::add": (2, 11_000, 11_000),
                             "aten::relu": (2, 7_000, 7_000), "aten::copy_": (2, 2_000, 2_000),
                             "aten::mul": (1, 5_000, 5_000)}
    res = run.ops(by="shape")
    mm = res["ops"].filter(pl.col("name") == "aten::mm").row(0, named=True)
    assert json.loads(mm["input_dims"]) == MM_DIMS  # the capture's recorded shapes
    assert mm["flops"] == 2 * 4 * 16 * 8  # its model, per instance
    assert not [w for w in res.warnings if "graph" in w]
    _, kernels = run.op_instances
    replayed = kernels.filter(pl.col("graph_replayed"))
    assert replayed.height == 8 and replayed["op_idx"].null_count() == 0
    # the captured launch lies in its captured op (the capture's clock)
    assert replayed.filter((pl.col("op_ts_ns") > pl.col("launch_ts_ns"))
                           | (pl.col("launch_end_ns") > pl.col("op_end_ns"))).height == 0


def test_without_the_capture_they_stay_unattributed(tmp_path) -> None:
    run = traceview.open(_replay_trace(tmp_path / "replay.json"))
    assert _by_name(run) == {"aten::mul": (1, 5_000, 5_000)}
    warned = [w for w in run.ops().warnings if "replayed from CUDA/HIP graphs" in w]
    assert warned and "8 GPU events (0.038 ms)" in warned[0] and "--graph-capture" in warned[0]


def test_a_capture_of_other_graphs_attributes_nothing(tmp_path) -> None:
    replay = _replay_trace(tmp_path / "replay.json")
    other = _capture_trace(tmp_path / "other.json", _window(0, 10, names=("kX", "kB", "kX")))
    run = traceview.open(replay, graph_capture=other)
    assert _by_name(run) == {"aten::mul": (1, 5_000, 5_000)}  # never a blend
    warnings = run.ops().warnings
    assert any("2 of 2 graph replays match no capture" in w for w in warnings)
    assert any("8 GPU events (0.038 ms) were replayed" in w for w in warnings)


def test_a_file_without_captures_says_so(tmp_path) -> None:
    replay = _replay_trace(tmp_path / "replay.json")
    plain = write_trace(tmp_path / "plain.json", [_op("aten::mm", 0, 20, MM_DIMS)])
    warnings = traceview.open(replay, graph_capture=plain).ops().warnings
    assert any("holds no stream capture" in w and "plain.json" in w for w in warnings)


def test_same_kernels_other_shapes_are_not_guessed(tmp_path) -> None:
    # two captures of the same kernels whose aten::mm shapes differ (two batch sizes): the
    # replays cannot say which they are
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10),
                             _window(100, 30, mm_dims=[[8, 8], [8, 16]]))
    run = traceview.open(_replay_trace(tmp_path / "replay.json"), graph_capture=capture)
    assert _by_name(run) == {"aten::mul": (1, 5_000, 5_000)}
    assert any("2 graph replays match several captures" in w for w in run.ops().warnings)


def test_equivalent_captures_are_taken_in_turn(tmp_path) -> None:
    # two captures with the same ops and shapes (vLLM's piecewise graphs: one per layer): the
    # first replay takes the first capture, the second the second
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10), _window(100, 30))
    run = traceview.open(_replay_trace(tmp_path / "replay.json"), graph_capture=capture)
    assert _by_name(run)["aten::mm"] == (2, 18_000, 18_000)
    instances, _ = run.op_instances
    mm = instances.filter(pl.col("name") == "aten::mm").sort("kernel_ns", descending=True)
    start = mm.get_column("ts_ns").to_list()
    assert start[1] - start[0] == 100_000  # replay 500 (10 µs) in capture 1, 501 in capture 2


def test_cupti_capture_pairs_by_graph_node_id(tmp_path) -> None:
    # CUPTI names no kernel on the capture's calls: nodes pair by kind and order. kB runs
    # first, on another stream; its graph node id (2) puts it after the first kA (1)
    ev = [_op("CUDAGraph::replay", 0, 100), _call("cudaGraphLaunch", 10, 5, 500),
          _gpu("kB", 20, 4, 500, stream=8, node=2), _gpu("kA", 21, 10, 500, node=1),
          _gpu("kA", 35, 6, 500, node=3), _gpu("Memcpy DtoD (Device -> Device)", 41, 1, 500,
                                               node=4)]
    replay = write_trace(tmp_path / "replay.json", ev)
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10, names=None))
    got = _by_name(traceview.open(replay, graph_capture=capture))
    assert got == {"aten::mm": (1, 10_000, 10_000), "aten::relu": (1, 4_000, 4_000),
                   "aten::add": (1, 6_000, 6_000), "aten::copy_": (1, 1_000, 1_000)}


def test_a_replay_short_of_one_named_node_still_matches(tmp_path) -> None:
    # the capture also launched kZ, which the replay never ran (a dropped record)
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10, extra="kZ"))
    run = traceview.open(_replay_trace(tmp_path / "replay.json"), graph_capture=capture)
    got = _by_name(run)
    assert got["aten::mm"] == (2, 18_000, 18_000) and got["aten::add"] == (2, 11_000, 11_000)
    assert "aten::zero_" not in got


def test_cli_option_and_bad_files(capsys, tmp_path) -> None:
    replay = _replay_trace(tmp_path / "replay.json")
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10))
    assert main(["ops", str(replay), "--by", "name", "--json", "--graph-capture",
                 str(capture)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["count"] for r in out["ops"]}["aten::relu"] == 2
    assert main(["ops", str(replay), "--graph-capture", str(tmp_path / "absent.json")]) == 2
    err = capsys.readouterr().err
    assert "absent.json" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    bad = write_trace(tmp_path / "bad.json", text="{not json")
    assert main(["ops", str(replay), "--graph-capture", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "Traceback" not in err


def test_two_capture_files_are_read_together(tmp_path) -> None:
    # two files of one process (no rank in either), each a capture with the same ops: the
    # replays take them in turn, as two captures of one file
    first = _capture_trace(tmp_path / "capture_a.json", _window(0, 10))
    second = _capture_trace(tmp_path / "capture_b.json", _window(5_000, 30))
    run = traceview.open(_replay_trace(tmp_path / "replay.json"), graph_capture=[first, second])
    assert _by_name(run)["aten::add"] == (2, 11_000, 11_000)
    assert not [w for w in run.ops().warnings if "graph" in w]


def test_a_captured_launch_outside_every_op_stays_unattributed(tmp_path) -> None:
    # the capture's copy was called outside any op: its replayed copies have no owner and
    # stay in the kernels table, unattributed (2 of 1 µs), the others are charged
    window = [e for e in _window(0, 10) if e["name"] != "aten::copy_"]
    capture = _capture_trace(tmp_path / "capture.json", window)
    run = traceview.open(_replay_trace(tmp_path / "replay.json"), graph_capture=capture)
    assert "aten::copy_" not in _by_name(run) and _by_name(run)["aten::mm"][0] == 2
    _, kernels = run.op_instances
    left = kernels.filter(pl.col("graph_replayed") & pl.col("op_idx").is_null())
    assert left.get_column("name").to_list() == ["Memcpy DtoD (Device -> Device)"] * 2
    assert any("2 GPU events (0.002 ms) were replayed" in w for w in run.ops().warnings)


@pytest.mark.parametrize("given", ["one", "tuple"])
def test_api_takes_one_path_or_several(tmp_path, given) -> None:
    capture = _capture_trace(tmp_path / "capture.json", _window(0, 10))
    path = str(capture) if given == "one" else (capture,)
    run = traceview.open(_replay_trace(tmp_path / "replay.json"), graph_capture=path)
    assert run.options.graph_capture == (path if given == "tuple" else (path,))
    assert _by_name(run)["aten::relu"] == (2, 7_000, 7_000)
