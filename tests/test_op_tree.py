"""The one host op tree (analyses/op_tree.py) at equal timestamps, 0-duration ops and
rounded (crossing) ends; and its consumers: self times, the op each launch is charged to
(op_kernels), the critical path's innermost op. Every answer derived by hand."""

from __future__ import annotations

import polars as pl

from gpu_trace_helpers import frame, kernel, launch, row
from traceview.analyses.breakdown import with_self_time
from traceview.analyses.host import host_events
from traceview.analyses.op_kernels import op_kernel_times
from traceview.analyses.op_tree import innermost_open, op_tree
from traceview.analyses.overlap import prepared_gpu


def op(name: str, ts: int, dur: int, tid: int = 1) -> dict:
    return row("cpu_op", name, ts, dur, pid=1, tid=tid)


def _tree(rows: list[dict]) -> dict[str, tuple[int, str | None, int]]:
    """name -> (depth, parent name, self_ns)."""
    t = with_self_time(frame(rows))
    names = t.get_column("name").cast(pl.String).to_list()
    return {n: (d, None if p is None else names[p], s)
            for n, d, p, s in zip(names, t["depth"], t["parent_idx"], t["self_ns"], strict=True)}


def test_zero_duration_op_is_a_leaf() -> None:
    # the case: a 0-µs aten::reshape inside the step; its later siblings must not
    # become its children (an end sorted before its own start gave it the parent's depth)
    got = _tree([op("step", 0, 1000), op("aten::reshape", 100, 0), op("bwd", 250, 500),
                 op("flash_bwd", 300, 100)])
    assert got == {"step": (1, None, 500), "aten::reshape": (2, "step", 0),
                   "bwd": (2, "step", 400), "flash_bwd": (3, "bwd", 100)}


def test_equal_starts_parent_first_and_zero_ops_inside() -> None:
    # P and Q start together: the longer is the parent; Z (0 µs) at that start goes into the
    # innermost (Q); Z2 at Q's end, when R starts: Q has closed, Z2 is inside R (R opens
    # at 300 and Z2 comes after it in pre-order)
    got = _tree([op("Z", 100, 0), op("Q", 100, 200), op("P", 100, 900), op("R", 300, 100),
                 op("Z2", 300, 0)])
    assert got == {"P": (1, None, 600), "Q": (2, "P", 200), "Z": (3, "Q", 0),
                   "R": (2, "P", 100), "Z2": (3, "R", 0)}


def test_equal_ends_inner_closes_first() -> None:
    # A [0,100), B [40,100), C [70,100) end together: a chain, not siblings; D starts at 100
    got = _tree([op("A", 0, 100), op("B", 40, 60), op("C", 70, 30), op("D", 100, 10)])
    assert got == {"A": (1, None, 40), "B": (2, "A", 30), "C": (3, "B", 30),
                   "D": (1, None, 10)}


def test_identical_ops_nest_in_written_order_and_zero_ops_nest_so() -> None:
    got = _tree([op("aten::to", 0, 18), op("aten::_to_copy", 0, 18), op("z1", 0, 0),
                 op("z2", 0, 0)])
    # z1 and z2: 0 µs at the same start: each a leaf in the innermost op, neither in the other
    assert got == {"aten::to": (1, None, 0), "aten::_to_copy": (2, "aten::to", 18),
                   "z1": (3, "aten::_to_copy", 0), "z2": (3, "aten::_to_copy", 0)}


def test_rounded_child_past_its_parent_moves_up() -> None:
    # µs rounding: C ends 1 past P; X starts at P's end and lies inside C alone: C contains
    # X, P does not. Y after both: a root.
    got = _tree([op("P", 10, 10), op("C", 15, 6), op("X", 20, 1), op("Y", 30, 5)])
    assert got["X"][1] in ("C", None)
    assert got["Y"] == (1, None, 5)
    t = op_tree(frame([op("P", 10, 10), op("C", 15, 6), op("X", 20, 1)])
                .select("rank", "pid", "tid", "ts_ns", "dur_ns"))
    ts, end = [10, 15, 20], [20, 21, 21]
    for i, p in enumerate(t["parent_idx"].to_list()):  # a parent always contains its child
        assert p is None or (ts[p] <= ts[i] and end[i] <= end[p])


def test_launch_charged_to_the_op_that_contains_it() -> None:
    ev = frame([
        op("step", 0, 1000),
        op("aten::reshape", 100, 0),           # 0 µs: owns nothing
        op("FlashAttnBackward", 250, 500),     # the launch at 400 lies here
        op("aten::mul", 250, 20),              # starts with it: its first child
        launch(260, 5, 1), kernel("mul_kernel", 2000, 50, corr=1),
        launch(400, 5, 2), kernel("flash_bwd_kernel", 3000, 700, corr=2),
        op("aten::add", 800, 0),               # 0 µs at the same time as the next launch
        launch(800, 0, 3), kernel("add_kernel", 4000, 10, corr=3),
    ])
    _, kernels = op_kernel_times(prepared_gpu(ev), host_events(ev))
    rows = host_events(ev).filter(pl.col("kind").cast(pl.String).is_in(
        ["cpu_op", "cuda_runtime"]))
    names = rows.get_column("name").cast(pl.String).to_list()
    got = {k: names[o] for k, o in kernels.select("name", "launch_op_idx").iter_rows()}
    assert got == {"mul_kernel": "aten::mul", "flash_bwd_kernel": "FlashAttnBackward",
                   "add_kernel": "step"}  # aten::add is 0 µs: a leaf, never an owner
    outside = kernels.filter((pl.col("op_ts_ns") > pl.col("launch_ts_ns"))
                             | (pl.col("op_end_ns") < pl.col("launch_end_ns")))
    assert outside.height == 0


def test_innermost_open_at_a_time() -> None:
    rows = frame([op("A", 0, 100), op("B", 10, 20), op("C", 10, 0), op("D", 50, 10)]) \
        .select("rank", "pid", "tid", "ts_ns", "dur_ns", "name")
    tree = op_tree(rows)
    points = pl.DataFrame({"rank": [0] * 5, "pid": [1] * 5, "tid": [1] * 5,
                           "ts_ns": [10, 29, 30, 55, 100]})
    got = innermost_open(points, rows, tree).to_list()
    names = rows.get_column("name").cast(pl.String).to_list()
    # at 10: B (C is 0 µs, closed); at 29: B; at 30: B closed -> A; 55: D; 100: none
    assert [None if i is None else names[i] for i in got] == ["B", "B", "A", "D", None]


def test_kernels_replayed_from_a_graph_are_unattributed() -> None:
    """``CUDAGraph::replay`` [0,100) holds a cudaGraphLaunch [10,15) (correlation 7) whose
    two kernels (30 + 50 ns) the graph's captured ops launched, not the replay op: they are
    marked ``graph_replayed`` with no owner; a plain launch in the same op stays its own."""
    from traceview.analyses.ops import ops

    ev = frame([op("CUDAGraph::replay", 0, 100), launch(10, 5, 7, name="cudaGraphLaunch"),
                kernel("captured_gemm", 200, 30, corr=7), kernel("captured_add", 240, 50, corr=7),
                launch(50, 5, 8), kernel("plain", 300, 20, corr=8)])
    inst, kernels = op_kernel_times(prepared_gpu(ev), host_events(ev))
    replayed = kernels.filter(pl.col("graph_replayed"))
    assert sorted(replayed["name"].to_list()) == ["captured_add", "captured_gemm"]
    assert replayed["op_idx"].null_count() == 2
    assert inst.select("name", "kernel_ns").rows() == [("CUDAGraph::replay", 20)]
    none = pl.lit(None, pl.String)
    found = ops(inst.with_columns(input_dims=none, dtypes=none, strides=none,
                                  concrete_inputs=none, trace_flops=pl.lit(None, pl.Int64)),
                kernels, device=None)
    assert any("2 GPU events (0.000 ms) were replayed from CUDA/HIP graphs" in w
               for w in found["warnings"])


def test_an_op_and_its_call_with_the_same_interval_nest_op_outside() -> None:
    """µs rounding makes an op and the one runtime call it makes identical, [10,13): whatever
    the written order, the call is the op's child, so its kernel is the op's."""
    for rows in ([launch(10, 3, 1), op("aten::fill_", 10, 3)],
                 [op("aten::fill_", 10, 3), launch(10, 3, 1)]):
        ev = frame([op("step", 0, 100), *rows, kernel("fill_kernel", 20, 5, corr=1)])
        _, kernels = op_kernel_times(prepared_gpu(ev), host_events(ev))
        names = host_events(ev).filter(pl.col("kind").cast(pl.String).is_in(
            ["cpu_op", "cuda_runtime"])).get_column("name").cast(pl.String).to_list()
        assert names[kernels["launch_op_idx"][0]] == "aten::fill_"
