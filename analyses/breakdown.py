"""What a step consists of: GPU time breakdown, idle fraction, top kernels, top CPU ops,
launch delays.

Per step window (see ``window.gpu_step_windows``) and for the whole trace, per (rank, device):

    window = compute + exposed_comm + exposed_memcpy + exposed_memset + idle

with compute = |C|, exposed_comm = |M \\ C|, exposed_memcpy = |Y \\ (C ∪ M)|,
exposed_memset = |S \\ (C ∪ M ∪ Y)|, idle = window − |C ∪ M ∪ Y ∪ S|, so the parts always add
up (no negative "non-compute" time). ``idle_fraction`` = idle / window, which for the
whole-trace row is 1 − |∪ all GPU events| / (last GPU end − first GPU start).

Definitions with worked examples: docs/metrics.md, section "GPU time: step breakdown".
"""

from __future__ import annotations

import polars as pl

from .launches import launch_table, with_launches
from .names import matching
from .op_tree import op_tree
from .overlap import NOTE_NO_STEPS, accounting, accountings, finish, step_windows_for
from .window import gpu_trace_windows

Frame = pl.LazyFrame | pl.DataFrame

_BREAKDOWN_COLUMNS = [
    "rank", "device", "step", "scope", "step_time_ns", "window_start_ns", "window_end_ns", "window_ns",
    "compute_ns", "exposed_comm_ns", "exposed_memcpy_ns", "exposed_memset_ns", "idle_ns",
    "idle_fraction", "comm_ns", "memcpy_ns", "busy_ns", "note",
]


def step_breakdown(
    gpu: pl.DataFrame,
    host_steps: pl.DataFrame,
    ranks: pl.DataFrame,
    *,
    include_trace: bool = True,
    step_windows: str = "gpu",
) -> pl.DataFrame:
    """GPU time per step (and a whole-trace row with step null) per (rank, device).

    ``scope`` says which a row is: ``"step"`` (one step's window) or ``"window"`` (the whole
    window analysed, summed over its steps and what lies between them; step null), so a
    table filtered or summed by step never mixes the two. ``step_time_ns`` is the host ``ProfilerStep#N`` duration (null for the whole-trace row and
    when the step has no host range). Ranks of ``ranks`` without GPU events get a row with a
    note. ``gpu``: ``prepared_gpu`` rows; ``host_steps``: host step ranges (``step_spans``).
    """
    parts = []
    steps, trace = accountings(  # one sweep for the steps and the whole trace
        gpu, [(step_windows_for(gpu, host_steps, step_windows), ["step"]),
              (gpu_trace_windows(gpu), [])])
    spans = host_steps.select("rank", "step", "step_time_ns")
    steps = steps.join(spans, on=["rank", "step"], how="left").with_columns(
        note=pl.lit(None, pl.String))
    parts.append(steps)
    trace = trace.with_columns(step=pl.lit(None, pl.Int64), step_time_ns=pl.lit(None, pl.Int64))
    no_steps = trace.join(steps.select("rank", "device").unique(), on=["rank", "device"],
                          how="anti").select("rank", "device")
    trace = trace.join(no_steps.with_columns(note=pl.lit(NOTE_NO_STEPS)), on=["rank", "device"],
                       how="left")
    if include_trace or no_steps.height:
        if not include_trace:
            trace = trace.join(no_steps, on=["rank", "device"], how="semi")
        parts.append(trace.select(steps.columns))
    out = pl.concat(parts, how="vertical_relaxed").with_columns(
        idle_fraction=pl.when(pl.col("window_ns") > 0)
        .then(pl.col("idle_ns") / pl.col("window_ns")).otherwise(None))
    # after finish: a rank without GPU events gets its one (window) row there
    scope = pl.when(pl.col("step").is_null()).then(pl.lit("window")).otherwise(pl.lit("step"))
    return finish(out, ranks, _BREAKDOWN_COLUMNS).with_columns(scope=scope).select(
        _BREAKDOWN_COLUMNS)


def idle_fraction(gpu: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, device): busy_ns, span_ns, idle_ns, idle_fraction = 1 − busy / span."""
    acc = accounting(gpu, gpu_trace_windows(gpu))
    out = acc.select(
        "rank", "device", "busy_ns", pl.col("window_ns").alias("span_ns"), "idle_ns",
        idle_fraction=pl.when(pl.col("window_ns") > 0)
        .then(1 - pl.col("busy_ns") / pl.col("window_ns")).otherwise(None),
    )
    return finish(out, ranks, ["rank", "device", "busy_ns", "span_ns", "idle_ns",
                                "idle_fraction", "note"])


def top_kernels(gpu: pl.DataFrame, *, n: int = 20) -> pl.DataFrame:
    """The ``n`` GPU events (by name) with the most total time, per rank.

    Columns: rank, name, gpu_class, count, total_ns, mean_ns, p50_ns, p99_ns, max_ns,
    share_of_gpu_time (total / sum of all GPU event durations of the rank; a sum of
    durations, so concurrent kernels count twice). Quantiles interpolate linearly.
    ``gpu``: ``prepared_gpu`` rows.
    """
    d = pl.col("dur_ns")
    out = (
        gpu.group_by("rank", "name", "gpu_class")
        .agg(count=pl.len().cast(pl.Int64), total_ns=d.sum(), mean_ns=d.mean(),
             p50_ns=d.quantile(0.5, "linear"), p99_ns=d.quantile(0.99, "linear"), max_ns=d.max())
        .with_columns(pl.col("name").cast(pl.String),
                      share_of_gpu_time=pl.col("total_ns") / pl.col("total_ns").sum().over("rank"))
        .sort(["rank", "total_ns", "name"], descending=[False, True, False])
    )
    return out.group_by("rank", maintain_order=True).head(n)


def kernels_across_ranks(gpu: pl.DataFrame, *, n: int = 20) -> pl.DataFrame:
    """The ``n`` GPU events (by name) with the most total time over all ranks.

    Columns: name, gpu_class, ranks (ranks that ran it), count, total_ns (sum over ranks),
    share_of_gpu_time (total / sum of all GPU event durations of all ranks), rank_median_ns
    (median over those ranks of a rank's total), rank_max_ns and max_rank (the rank with the
    largest total; ties: the lowest rank). ``gpu``: ``prepared_gpu`` rows.
    """
    per_rank = (gpu.group_by("rank", "name", "gpu_class")
                .agg(count=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum()))
    all_ns = per_rank["total_ns"].sum()
    return (
        per_rank.sort("total_ns", "rank", descending=[True, False])
        .group_by("name", "gpu_class")
        .agg(ranks=pl.len().cast(pl.Int64), count=pl.col("count").sum(),
             total_ns=pl.col("total_ns").sum(), rank_median_ns=pl.col("total_ns").median(),
             rank_max_ns=pl.col("total_ns").first(), max_rank=pl.col("rank").first())
        .with_columns(pl.col("name").cast(pl.String),
                      share_of_gpu_time=pl.col("total_ns") / all_ns if all_ns
                      else pl.lit(None, pl.Float64))
        .sort(["total_ns", "name"], descending=[True, False]).head(n)
        .select("name", "gpu_class", "ranks", "count", "total_ns", "share_of_gpu_time",
                "rank_median_ns", "rank_max_ns", "max_rank"))


def top_cpu_ops(ops: pl.DataFrame, *, n: int = 20, by: str = "self_ns") -> pl.DataFrame:
    """Host operators (kind ``cpu_op``) by self or total time, per rank.

    self time = duration − durations of the direct children on the same thread, the
    children from the one op tree (``analyses/op_tree.py``: :func:`with_self_time`). Columns: rank, name, count, total_ns, self_ns, mean_ns,
    mean_self_ns. ``ops``: ``with_self_time(host rows)`` (both rankings share it).
    """
    out = (
        ops.group_by("rank", "name")
        .agg(count=pl.len().cast(pl.Int64), total_ns=pl.col("dur_ns").sum(),
             self_ns=pl.col("self_ns").sum(), mean_ns=pl.col("dur_ns").mean(),
             mean_self_ns=pl.col("self_ns").mean())
        .with_columns(pl.col("name").cast(pl.String))
        .sort(["rank", by, "name"], descending=[False, True, False])
    )
    return out.group_by("rank", maintain_order=True).head(n)


def with_self_time(events: Frame, *, kinds: tuple[str, ...] = ("cpu_op",)) -> pl.DataFrame:
    """Host ops (rank, pid, tid, name as stored, ts_ns, dur_ns, _idx) with ``depth``,
    ``parent_idx`` (``op_tree``) and ``self_ns`` columns added."""
    thread = ["rank", "pid", "tid"]
    ops = (
        events.lazy()
        .filter(pl.col("kind").is_in(list(kinds)) & pl.col("dur_ns").is_not_null()
                & (pl.col("dur_ns") >= 0))
        .select(*thread, "name", "ts_ns", "dur_ns",
                # identical intervals: an op around its runtime call around a driver call
                _level=pl.col("kind").cast(pl.String).replace_strict(
                    {"cpu_op": 0, "cuda_runtime": 1}, default=2, return_dtype=pl.Int8))
        .with_row_index("_idx")
        .with_columns(_end=pl.col("ts_ns") + pl.col("dur_ns"))
        .collect()
    )
    # the one tree (analyses/op_tree.py)
    tree = op_tree(ops, thread=tuple(thread), level=pl.col("_level"))
    ops = ops.with_columns(tree.get_column("depth"), tree.get_column("parent_idx"))
    child = ops.filter(pl.col("parent_idx").is_not_null()).group_by("parent_idx").agg(
        _child_ns=pl.col("dur_ns").sum())
    child_ns = pl.Series("_child_ns", [0] * 0, dtype=pl.Int64).extend_constant(0, ops.height) \
        .scatter(child.get_column("parent_idx"), child.get_column("_child_ns"))
    return (
        ops.with_columns(child_ns)
        .with_columns(self_ns=pl.max_horizontal(pl.col("dur_ns") - pl.col("_child_ns"),
                                                pl.lit(0)))
        .drop("_child_ns", "_end", "_level")
    )


def launch_delays(gpu: pl.DataFrame, host: Frame) -> pl.DataFrame:
    """Per GPU event with a launching runtime call (same rank and correlation):
    rank, device, stream, name, gpu_class, launch_name, launch_ts_ns, ts_ns,
    launch_delay_ns = GPU start − runtime call start, and
    queue_delay_ns = max(0, GPU start − runtime call end), in (rank, ts_ns) order."""
    return (
        launch_delay_rows(gpu, host).lazy()
        .with_columns(pl.col("name", "launch_name").cast(pl.String))
        .sort("rank", "ts_ns", maintain_order=True)
        .collect()
    )


def launch_delay_rows(gpu: pl.DataFrame, host: Frame) -> pl.DataFrame:
    """``launch_delays`` in the GPU events' order, names as stored (categorical): what
    ``launch_delay_summary`` needs, without turning 700 k names into strings and sorting.
    ``gpu``: ``prepared_gpu`` rows; ``host``: the host rows with the runtime calls."""
    rt = launch_table(host, launch_name=pl.col("name").first(),
                      launch_ts_ns=pl.col("ts_ns").min(),
                      _launch_end=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max())
    return with_launches(gpu.select("rank", "device", "stream", "name", "gpu_class", "ts_ns",
                                    "correlation"), rt, how="inner").select(
        "rank", "device", "stream", "name", "gpu_class", "launch_name", "launch_ts_ns", "ts_ns",
        launch_delay_ns=pl.col("ts_ns") - pl.col("launch_ts_ns"),
        queue_delay_ns=pl.max_horizontal(pl.col("ts_ns") - pl.col("_launch_end"), pl.lit(0)))


def launch_delay_summary(delays: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, device): count, p50/p99/max of launch_delay_ns and queue_delay_ns, and how
    many GPU events came from CUDA/HIP graph launches (their delay is from the graph launch).
    ``delays``: ``launch_delays`` or ``launch_delay_rows``."""
    ld, qd = pl.col("launch_delay_ns"), pl.col("queue_delay_ns")
    # the name rule runs once per distinct launch name
    graph = matching(delays.select(name="launch_name").unique(), r"(?i)GraphLaunch").collect()
    return (
        delays.group_by("rank", "device")
        .agg(count=pl.len().cast(pl.Int64), launch_delay_p50_ns=ld.quantile(0.5, "linear"),
             launch_delay_p99_ns=ld.quantile(0.99, "linear"), launch_delay_max_ns=ld.max(),
             queue_delay_p50_ns=qd.quantile(0.5, "linear"),
             queue_delay_p99_ns=qd.quantile(0.99, "linear"),
             graph_launched=pl.col("launch_name").is_in(graph.get_column("name").implode())
             .sum().cast(pl.Int64))
        .sort("rank", "device")
    )
