"""The answers of a Run that read its critical path and its replay: ``critical_path``,
``diagnose`` and ``whatif``.

Each is ``answer(run, **options) -> Result``, the Run's method of that name
(``traceview.run.registry``). The path and the replay are the Run's, computed once
(``run.path``, ``run.replay``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from traceview.analyses.collectives import collective_summary
from traceview.analyses.diagnose import ModelSize
from traceview.analyses.diagnose import diagnose as find_diagnosis
from traceview.analyses.ops import ops as op_table
from traceview.analyses.path_summary import path_categories, path_ranks, path_steps, path_top_ops
from traceview.run.distributed import node_verdicts
from traceview.run.replay import path_ranks_of, replay_path, straggler_gains, whatif_result
from traceview.run.result import Result

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any


def _path_result(run: Run, command: str, fields: dict[str, Any], *, main: str,
                 notes: Sequence[str] = ()) -> Result:
    """A Result of the critical path's commands: their fields, the window, and the
    path's warnings after the tables'."""
    res = run._result(command, {"window": run.window_info, **fields}, main=main,
                      uses=run._gpu_and_alignment)
    return res.with_warnings(*run._path_notes, *notes)


def path_collectives(run: Run) -> pl.DataFrame:
    """The sync points the path can jump through: the matched collectives (a dispatcher
    op that only enqueues work, an asynchronous backend's without its kernels, arrives
    nowhere) and the receiving side of every send/recv pair (a send waits for nobody)."""
    if len(run.ranks_present) < 2:
        return _no_collectives()
    enqueued = run.match.instances.filter(pl.col("enqueue_only")).select(
        "instance", pl.col("rank").cast(pl.Int32))
    rows = run.collective_ranks
    if enqueued.height:
        rows = rows.join(enqueued, on=["instance", "rank"], how="anti")
    received = run._p2p_rows.filter(pl.col("collective") == "recv")
    if received.height == 0:
        return rows
    return pl.concat([rows, received.select(
        "instance", "group", "collective", "name", pl.col("rank").cast(pl.Int32),
        "arrival_ns", "end_ns", "last_arrival_ns", pl.col("last_rank").cast(pl.Int32),
        uncertainty_ns=pl.lit(0, pl.Int64))], how="diagonal_relaxed")


def _no_collectives() -> pl.DataFrame:
    """The path's sync points of a single rank: none, with the columns the walk reads."""
    return pl.DataFrame(schema={"instance": pl.String, "rank": pl.Int32, "name": pl.String,
                                "arrival_ns": pl.Int64, "end_ns": pl.Int64,
                                "last_arrival_ns": pl.Int64, "last_rank": pl.Int32})


def whatif(run: Run, *scenarios: str) -> Result:
    """The replay's self-check and each scenario's predicted steps (SPECs:
    ``docs/metrics.md``, section *Replay*); main table ``steps``."""
    return whatif_result(run, scenarios)


def critical_path(run: Run, *, top: int = 10) -> Result:
    """The cross-rank critical path: per step ``path_ns`` against ``step_ns``, each rank's
    ``share``, the categories and the top ops on it; main table ``steps``."""
    path = run.path
    return _path_result(run, "critical_path", {  # per rank: the replay's path if trusted
        "ranks": path_ranks_of(run.replay, path_ranks(path, run.ranks_table)),
        "steps": path_steps(path),
        "categories": path_categories(path), "top_ops": path_top_ops(path, n=top),
        "replay": replay_path(run.replay)},  # the replay's longest path (docs: Replay)
        main="steps")


def diagnose(run: Run, **model: Any) -> Result:
    """Findings ranked by the time each fix would save per step (``analyses.diagnose``);
    ``model``: :class:`~traceview.analyses.diagnose.ModelSize` fields (params,
    tokens_per_step, flops_per_step, peak_tflops, dtype). Main table ``findings``."""
    notes = []
    verdicts = None
    if len(run.ranks_present) > 1:
        try:
            verdicts = run._stragglers
        except Exception as exc:  # a partial answer with the reason, never a traceback
            notes.append(f"diagnose: straggler analysis failed ({type(exc).__name__}: "
                         f"{exc}): no straggler is rated high")
    staged = None
    if len(run.ranks_present) > 1 and run.p2p[0].height:
        try:
            staged = run._pipeline
        except Exception as exc:  # a partial answer with the reason, never a traceback
            notes.append(f"diagnose: pipeline analysis failed ({type(exc).__name__}: "
                         f"{exc}): no pipeline finding")
    roofline = None
    if run.gpu.height:
        try:
            instances, kernels = run.op_instances
            roofline = op_table(instances, kernels, device=run._device_name())["ops"]
        except Exception as exc:  # a partial answer with the reason, never a traceback
            notes.append(f"diagnose: operator analysis failed ({type(exc).__name__}: "
                         f"{exc}): no roofline finding")
    found = find_diagnosis(run.path, collective_rows=run._path_collectives,
                           stragglers=verdicts,
                           gaps=run.gap_rows() if run.gpu.height else None,
                           gpu_ranks=tuple(run.gpu.get_column("rank").unique().to_list()),
                           devices=run.ranks, model=ModelSize(**model), pipeline=staged,
                           alltoall=run._alltoall if run.has_alltoall else None,
                           host=run.host if run.gpu.height else None, ops=roofline,
                           replayed=straggler_gains(run, verdicts),
                           bound=run.bound, replay_verdict=run.replay_verdict)
    notes += found.pop("notes")  # a refused MFU
    if len(run.ranks_present) > 1:
        found["node_findings"] = node_verdicts(run, verdicts)["node_findings"]
        found["collectives_time_is"] = collective_summary(run.collective_ranks).select(
            "group", "name", "size_bucket", "locality", "node_span", "instances",
            "time_is", "wait_share", "skew_p50_ns", "comm_p50_ns")
    return _path_result(run, "diagnose", found, main="findings", notes=notes)
