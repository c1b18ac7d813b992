"""The cross-rank answers of a Run: ``align``, ``collectives``, ``stragglers``, ``pipeline``,
``alltoall``, and the parts other answers share (the worst straggler, late nodes, the
alignment's summary).

Each answer is ``answer(run, **options) -> Result``, the Run's method of that name
(``traceview.run.registry``). The pipeline and all-to-all tables are kept on the Run
(``run._pipeline``, ``run._alltoall``: ``diagnose`` and the report read them too).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from traceview.analyses.align import apply_offsets
from traceview.analyses.alltoall import alltoall as find_alltoall
from traceview.analyses.alltoall import alltoall_calls, alltoall_matrix, pair_calls
from traceview.analyses.collective_match import comm_events, match_collectives
from traceview.analyses.collectives import alpha_beta, collective_summary, instances
from traceview.analyses.dependency_graph import SYNC_SCHEMA
from traceview.analyses.nccl import log_calls, log_choices
from traceview.analyses.nodes import late_nodes, shared_nodes
from traceview.analyses.pipeline import pipeline as find_pipeline
from traceview.errors import UsageError
from traceview.parsers import file_problem, nccl_log
from traceview.run.replay import straggler_fields, worst_with_replay
from traceview.run.result import Result

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any


def align(run: Run) -> Result:
    """Per-rank clock offset, drift and uncertainty; main table ``ranks``."""
    if not run.whole_ranks:
        run._analysis_events  # noqa: B018 - an empty window is an error here too
    summary = alignment_summary(run)
    return run._result("align", {"reference_rank": summary["reference_rank"],
                                 "ranks": run.offsets,
                                 "problems": _whole_match_problems(run)}, main="ranks",
                       uses=("offsets",))


def collectives(run: Run, *, nccl_logs: Sequence[str | Path] = ()) -> Result:
    """Collectives matched across ranks: skew, wait, bandwidth, tails, alpha-beta fits;
    with ``nccl_logs``, also the logs' algorithm and protocol choices (``nccl_choices``)
    and calls (``nccl_calls``); main table ``instances``."""
    per = run.collective_ranks
    inst = instances(per)
    logged = nccl_log_view(nccl_logs) if nccl_logs else {}
    return run._result("collectives", {
        "instances": inst, "summary": collective_summary(per), "alpha_beta": alpha_beta(inst),
        "problems": run.match.problems, "groups": run.match.groups,
        "alignment": alignment_summary(run),
        **{f"nccl_{k}": v for k, v in logged.items()}},
        main="instances", uses=("match", "offsets"))


def nccl_log_view(paths: Sequence[str | Path]) -> dict[str, pl.DataFrame]:
    """NCCL debug logs' view of the run: ``choices`` (algorithm and protocol per
    collective and message size, ``analyses.nccl.log_choices``) and ``calls``
    (``analyses.nccl.log_calls``). An unreadable log is one error naming it."""
    for path in paths:  # before opening: a FIFO would block the open
        if not os.path.lexists(path):
            raise UsageError(f"{path}: NCCL log not found (--nccl-log)")
        if problem := file_problem(path):
            raise UsageError(f"{path}: cannot read NCCL log ({problem}) (--nccl-log)")
    try:
        log = nccl_log.parse(list(paths))
    except OSError as exc:
        raise UsageError(f"{exc.filename}: cannot read NCCL log ({exc.strerror})") from None
    return {"choices": log_choices(log.choices), "calls": log_calls(log.calls)}


def stragglers(run: Run) -> Result:
    """Which rank holds the others back, with evidence; main table ``ranks``, largest
    imposed wait first."""
    # each rank's node is in ``late_nodes``/``shared_nodes``: the ranks table stays the
    # one `traceview analyse` computes per rank too
    return run._result("stragglers", {"ranks": run._stragglers,
                                      "alignment": alignment_summary(run),
                                      **node_verdicts(run, run._stragglers),
                                      **straggler_fields(run, run._stragglers,
                                                         slowdowns=True)},
                       main="ranks", uses=("match", "offsets", "p2p"))


def node_verdicts(run: Run, verdicts: pl.DataFrame | None) -> dict[str, Any]:
    """Late ranks that share a node (``analyses.nodes``): ``late_nodes``, nodes whose
    ranks all arrive late together (which a rank-level lead cannot see), and
    ``shared_nodes``, the nodes holding two or more flagged stragglers; ``node_findings``:
    their sentences ("node 3: ranks 24–31 all late")."""
    late = late_nodes(run.collective_ranks) if len(run.ranks_present) > 1 \
        else late_nodes(run.collective_ranks.clear())
    flagged = [] if verdicts is None or verdicts.height == 0 else \
        verdicts.filter(pl.col("flagged")).get_column("rank").to_list()
    shared = shared_nodes(flagged, run.nodes)
    return {"late_nodes": late, "shared_nodes": shared,
            "node_findings": [*late.filter(pl.col("flagged")).get_column("sentence"),
                              *(d["sentence"] for d in shared)]}


def pipeline_of(run: Run) -> dict[str, Any]:
    """The pipeline from the send/recv pairs (``analyses.pipeline``), on the aligned
    timeline: its stages, per stage and step, bottleneck, schedule and notes."""
    pairs = run.p2p[0]
    many = len(run.ranks_present) > 1
    rows = None
    if many:  # the blocking collectives (a dispatcher op that only enqueues waits nowhere)
        enqueued = run.match.instances.filter(pl.col("enqueue_only")).select(
            "instance", pl.col("rank").cast(pl.Int32))
        rows = run.collective_ranks.join(enqueued, on=["instance", "rank"], how="anti") \
            if enqueued.height else run.collective_ranks
    busy = None
    if pairs.height and "gpu" in pairs.select("send_timing", "recv_timing").unpivot() \
            .get_column("value").to_list():
        # GPU stages: their own device work (no communication), on the aligned timeline
        work = run.gpu.filter(pl.col("gpu_class") != "comm").select(
            pl.col("rank").cast(pl.Int32), "ts_ns", "end_ns")
        if many and work.height:
            work = apply_offsets(work, run.offsets).collect().select(
                "rank", end_ns=pl.col("ts_aligned_ns") + pl.col("end_ns") - pl.col("ts_ns"),
                ts_ns="ts_aligned_ns")
        busy = work
    return find_pipeline(pairs, run.steps, collective_rows=rows,
                         offsets=run.offsets if many else None, device_busy=busy)


def pipeline(run: Run, *, timeline: bool = False) -> Result:
    """Pipeline parallelism from the send/recv pairs: each rank's stage, where each
    stage's steps go (compute, exposed transfer, waits on upstream and downstream, the
    bubble), the schedule against its ideal bubble, and the bottleneck stage with its
    gain; with ``timeline``, the waits, transfers and collectives as segments (what the
    report draws). Main table ``stages`` (``analyses.pipeline``)."""
    found = run._pipeline
    pairs, unmatched = run.p2p
    left = dict(unmatched.group_by("op").agg(pl.col("calls").sum()).iter_rows())
    p2p = {"pairs": pairs.height, "unmatched": int(sum(left.values())),
           "unmatched_sends": int(left.get("send", 0)),
           "unmatched_recvs": int(left.get("recv", 0))}
    res = run._result("pipeline", {
        "window": run.window_info, "stages": found["stages"], "steps": found["steps"],
        "bottleneck": found["bottleneck"], "schedule": found["schedule"], "p2p": p2p,
        **({"timeline": found["timeline"]} if timeline else {})},
        main="stages", uses=("match", "offsets", "p2p"))
    return res.with_warnings(*(f"pipeline: {note}" for note in found["notes"]))


def alltoall_of(run: Run) -> dict[str, Any]:
    """The all-to-all answer (``analyses.alltoall``), with ``warnings``: the window's
    all-to-all calls with their sizes, paired with the matched instances, on the
    dependency graph of the aligned timeline."""
    paired, notes = pair_calls(alltoall_calls(run.events), run.match.instances)
    matrix, more = alltoall_matrix(paired)
    sync = run.sync_points if matrix.height else pl.DataFrame(schema=SYNC_SCHEMA)
    found = find_alltoall(matrix, sync=sync, steps=run.steps, ranks=run.ranks_present)
    if run.window.ranks is not None and matrix.height:
        notes.append("alltoall: the window is a choice of ranks: volumes, ratios and the "
                     "cost compare those ranks only, and an even split (no split sizes) "
                     "is taken over them")
    return {**found, "warnings": [*notes, *more]}


def alltoall(run: Run) -> Result:
    """All-to-all volumes per rank (from the split sizes, else the tensors' shapes), the
    rank x rank matrix per step, the hot rank and the imbalance (max / mean received), and
    the step time the imbalance costs; main table ``ranks``."""
    found = dict(run._alltoall)
    notes = found.pop("warnings")
    res = run._result("alltoall", found, main="ranks", uses=("match", "offsets"))
    return res.with_warnings(*notes)


def _whole_match_problems(run: Run) -> pl.DataFrame:
    """The problems of the matching the offsets came from (``align`` reports them)."""
    if run.whole_ranks:
        return run.match.problems

    return match_collectives(comm_events(run._rank_comm_source), ranks=run.traceset.ranks,
                             tolerance_ns=run._tolerance_ns).problems


def alignment_summary(run: Run) -> dict[str, Any]:
    """The clock alignment in three fields: reference rank, methods, largest uncertainty."""
    offsets = run.offsets
    ref = offsets.filter(pl.col("note").str.starts_with("reference"))
    return {"reference_rank": ref.get_column("rank")[0] if ref.height else None,
            "methods": sorted(set(offsets.get_column("method").to_list())),
            "max_uncertainty_ns": offsets.get_column("uncertainty_ns").max()}


def worst_straggler(run: Run) -> dict[str, Any]:
    """The flagged rank with the largest imposed wait, or why there is none; with the
    replay's culprits and pattern (``traceview.run.replay.worst_with_replay``)."""
    return worst_with_replay(run, _heuristic_worst_straggler(run))


def _heuristic_worst_straggler(run: Run) -> dict[str, Any]:
    if len(run.ranks_present) < 2:
        return {"rank": None, "reason": "a single rank: no straggler analysis"}
    try:
        res = run._stragglers
    except Exception as exc:  # a partial answer with the reason, never a traceback
        return {"rank": None,
                "reason": f"straggler analysis failed: {type(exc).__name__}: {exc}"}
    if res.height == 0 or "flagged" not in res.columns:
        return {"rank": None, "reason": "straggler analysis returned no ranks"}
    flagged = res.filter(pl.col("flagged"))
    if flagged.height == 0:
        unsure = res.filter(pl.col("verdict") == "unsure")
        if unsure.height:
            lead = unsure.row(0, named=True)
            return {"rank": None, "unsure_rank": lead["rank"], "confidence": "low",
                    "reason": f"unsure: rank {lead['rank']} leads, but not clearly above "
                              "the run's noise", "explanation": lead["explanation"]}
        return {"rank": None, "reason": "no rank flagged as a straggler"}
    row = flagged.sort("caused_wait_ns", descending=True).row(0, named=True)
    return {"rank": row["rank"], "imposed_wait_ns": row.get("imposed_wait_ns"),
            "caused_wait_ns": row.get("caused_wait_ns"), "flagged": True,
            "confidence": row.get("confidence"), "explanation": row.get("explanation")}
