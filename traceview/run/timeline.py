"""The GPU timeline answers of a Run: ``gaps``, ``overlap``, ``breakdown``, ``summary``.

Each is ``answer(run, **options) -> Result``, the Run's method of that name
(``traceview.run.registry``): the shared tables it names, handed to the analyses.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import polars as pl

from traceview.analyses.breakdown import (
    kernels_across_ranks,
    launch_delay_rows,
    launch_delay_summary,
    step_breakdown,
    top_cpu_ops,
    top_kernels,
    with_self_time,
)
from traceview.analyses.gaps import gap_causes, gap_histogram, largest_gaps, no_gpu_ranks
from traceview.analyses.overlap import overlap as overlap_rows
from traceview.analyses.summary import summary as summary_rows
from traceview.run.distributed import worst_straggler
from traceview.run.result import Result
from traceview.run.summary_by_rank import summary_by_rank

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any


def gaps(run: Run, *, per_stream: bool = False, top: int = 10,
         launch_overhead: str | int = "10us") -> Result:
    """GPU idle gaps per device (or stream) with their causes; main table ``causes``."""
    g = run.gap_rows(per_stream=per_stream, launch_overhead=launch_overhead)
    by = ["rank", "device", "stream"] if per_stream else ["rank", "device"]
    return run._result("gaps", {
        "window": run.window_info, "per_stream": per_stream,
        "causes": gap_causes(g, by=by), "histogram": gap_histogram(g, by=by),
        "largest": _from_gpu_start(run, largest_gaps(g, run.host, n=top)),
        "notes": no_gpu_ranks(run.ranks_table, run.gpu)}, main="causes", uses=("gpu",))


def _from_gpu_start(run: Run, largest: pl.DataFrame) -> pl.DataFrame:
    """``largest`` with ``gap_start_from_gpu_start_ns``: where each gap starts, from its
    rank's first GPU event in the window (epoch nanoseconds mean nothing to a reader)."""
    first = run.gpu.group_by("rank").agg(_first_ns=pl.col("ts_ns").min())
    return (largest.join(first, on="rank", how="left", maintain_order="left")
            .with_columns(gap_start_from_gpu_start_ns=pl.col("gap_start_ns")
                          - pl.col("_first_ns")).drop("_first_ns"))


def overlap(run: Run, *, per_step: bool = False) -> Result:
    """Compute/communication overlap per rank and device (and step); main table ``rows``."""
    if not per_step:
        return run._result("overlap", {"window": run.window_info,
                                       "rows": run.overlap_rows, "bound": run.bound},
                           main="rows", uses=("gpu",))
    per_step_rows = overlap_rows(run.gpu, run.ranks_table, steps=run.steps, per_step=True)
    # Every device also gets its whole-trace row (step null): the per-step rows already
    # hold it for devices without steps, so it is added to the others only.
    whole = run.overlap_rows.filter(pl.col("device").is_not_null())
    has_whole = per_step_rows.filter(pl.col("step").is_null()).select("rank", "device")
    df = pl.concat([per_step_rows, whole.join(has_whole, on=["rank", "device"], how="anti")],
                   how="diagonal_relaxed").sort("rank", "device", "step", nulls_last=True)
    return run._result("overlap", {"window": run.window_info, "rows": df,
                                   "bound": run.bound}, main="rows", uses=("gpu",))


def breakdown(run: Run, *, top: int = 10) -> Result:
    """Per-step GPU time, top kernels (per rank and over all ranks) and CPU ops, launch
    delays, achieved FLOP/s and MFU per step when the trace carries FLOP counts (``flops``,
    else None); main table ``steps``."""
    host = run.host  # read first: the steps and the launches come from it too
    with ThreadPoolExecutor(1) as beside:  # the host side beside the GPU side
        ops = beside.submit(with_self_time, host)  # shared by both rankings
        gpu = run.gpu
        steps = step_breakdown(gpu, run.steps, run.ranks_table)
        kernels = top_kernels(gpu, n=top)
        ops = ops.result()
    return run._result("breakdown", {
        "window": run.window_info, "steps": steps, "top_kernels": kernels,
        "top_cpu_ops_by_self": top_cpu_ops(ops, n=top, by="self_ns"),
        "top_cpu_ops_by_total": top_cpu_ops(ops, n=top, by="total_ns"),
        "launch_delay": launch_delay_summary(launch_delay_rows(gpu, host)),
        "kernels_across_ranks": kernels_across_ranks(gpu, n=top),
        "flops": run.flops_per_step()},
        main="steps", uses=("gpu",))


def summary(run: Run) -> Result:
    """One row per rank: steps, step time, compute, comm, idle, top gap cause; and the
    worst straggler. Main table ``ranks``."""
    # Independent parts run side by side (mostly in Polars, which leaves the GIL; the
    # first command on a trace set waits for all of them): the straggler analysis reads
    # other rows; the GPU rows are classified while the host rows are read; then the
    # overlap and the launch lookup behind the warnings run beside the steps and the
    # gaps. Gaps an earlier command kept need no host rows: the steps and the launches
    # then come from the events' few columns they read.
    # A large run of several ranks is summarised rank by rank on workers instead, so that
    # no process holds every rank's rows (``traceview.run.summary_by_rank``).
    by_rank = summary_by_rank(run)
    if by_rank is not None:
        driver, df = by_rank
        return summary_result(driver, df, worst_straggler(driver))
    with ThreadPoolExecutor(3) as beside:
        straggler = beside.submit(worst_straggler, run)
        gpu = beside.submit(lambda: run.gpu)
        if not run._kept_gaps():
            _ = run.host  # the steps and the gaps come from it
        gpu.result()
        overlap = beside.submit(lambda: run.overlap_rows)
        unlaunched = beside.submit(lambda: run.unlaunched)
        steps = run.steps
        gap_rows = run.gap_rows()
        df = summary_rows(overlap.result(), steps, gap_rows, run.ranks_table)
        straggler, _ = straggler.result(), unlaunched.result()
    return summary_result(run, df, straggler)


def summary_result(run: Run, ranks: pl.DataFrame, straggler: dict[str, Any]) -> Result:
    """``summary``'s Result from its rows and the worst straggler."""
    return run._result("summary", {"window": run.window_info, "ranks": ranks,
                                   "worst_straggler": straggler, "bound": run.bound},
                       main="ranks", uses=run._gpu_and_alignment)
