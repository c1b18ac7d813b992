"""``traceview whatif``: the run's dependency graph replayed, checked, and changed.

:func:`replay_of` gathers what :mod:`traceview.analyses.replay` reads from a Run (its host
ops and matched communication on the aligned timeline) and replays it once; every command
that reads the replay reads that one. :func:`whatif_result` composes the answer that
``Run.whatif`` returns and the CLI prints.

``--json`` contract: ``{"window", "steps": [{"step", "measured_ns", "replayed_ns", "error"}],
"replay_error": {"median", "p90"}, "trusted", "not_reproduced": [{"step", "rank", "role",
"kind", "instance", "drift_ns", "what", "cause"}], "scenarios": [{"spec", "step_ns_mean",
"step_ns_p50", "gain_ns_per_step", "slowdown", "steps": [{"step", "predicted_ns",
"replayed_ns"}]}], "verdict": {"pattern", "culprits": [{"rank", "gain_ns_per_step",
"slowdown", "steps", "cost_ns_per_occurrence", "confidence"}], "combined_gain_ns_per_step",
"moving_cost_ns_per_step", "trusted"}, "ranks": [{"rank", "gain_ns_per_step", "slowdown"
(S_w), "step_gains"}], "types": [{"type", "spec", "gain_ns_per_step", "slowdown" (S_t)}],
"critical_path": {"ranks": [{"rank", "path_ns", "share", "top_kind"}], "kinds": [{"kind",
"ns"}]}, "graph": {"points", "waits", "instances", "forced"}, "notes", "warnings"}``.
Definitions: docs/metrics.md, section "Replay".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from traceview.analyses.align import apply_offsets
from traceview.analyses.collective_match import P2P
from traceview.analyses.replay import build_graph
from traceview.analyses.stream_waits import stream_wait_coverage, stream_wait_notes, stream_waits
from traceview.analyses.replay.verdicts import (
    critical_path,
    culprits,
    path_ranks,
    rank_gains,
    type_slowdowns,
)
from traceview.analyses.replay.check import WHOLE_WINDOW, step_times
from traceview.analyses.replay.findings import replay_named, verdict_words
from traceview.analyses.replay.whatif import Replay, replay_run, replay_scenario, whatif
from traceview.run.result import Result
from traceview.schema import GPU_KINDS, RUNTIME_KINDS

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any

#: The rows the graph reads: host ops and annotations, GPU runtime calls (launches and
#: synchronisations) and GPU work, each with a duration.
_OP_KINDS = ("cpu_op", "user_annotation", *RUNTIME_KINDS, *GPU_KINDS)


def replay_of(run: Run, *, transfers: str = "typical") -> Replay:
    """The run's graph and its replay (one per Run; ``transfers``: ``build_graph``'s, ``own``
    only for the benchmark that tells the transfer model's error from the graph's)."""
    events = run._analysis_events.filter(
        pl.col("kind").is_in(list(_OP_KINDS)) & pl.col("dur_ns").is_not_null()).select(
        "rank", "tid", "kind", "name", "ts_ns", "dur_ns", "collective", "stream",
        "correlation")
    if len(run.ranks_present) > 1:
        events = apply_offsets(events, run.offsets).with_columns(ts_ns="ts_aligned_ns")
    ops = events.select("rank", "tid", "kind", "name", "ts_ns",
                        end_ns=pl.col("ts_ns") + pl.col("dur_ns"),
                        collective="collective", stream="stream",
                        correlation="correlation").collect()
    many = len(run.ranks_present) > 1
    collectives = run.collective_ranks.filter(~pl.col("collective").is_in(list(P2P))) \
        if many else None
    pairs = run.p2p[0] if many else None
    return replay_run(build_graph(ops, collectives if collectives is not None
                                  else pl.DataFrame(), pairs,
                                  stream_waits=_stream_waits(run, ops), transfers=transfers))


def _stream_waits(run: Run, ops: pl.DataFrame) -> pl.DataFrame | None:
    """The window's ``cudaStreamWaitEvent`` waits (``analyses.stream_waits``), on the aligned
    timeline; None without GPU work or sync rows. Read from the rows with ``args_json`` (a
    few sync rows); kept to the window's time."""
    if not ops.filter(pl.col("kind").is_in(list(GPU_KINDS))).height:
        return None
    waits = stream_waits(run._rank_comm_source)
    if waits.height == 0:
        return None
    if len(run.ranks_present) > 1:
        for col in ("record_ts_ns", "call_ts_ns"):
            waits = apply_offsets(waits.with_columns(ts_ns=col), run.offsets).collect() \
                .with_columns(pl.when(pl.col(col).is_not_null()).then(pl.col("ts_aligned_ns"))
                              .alias(col)).drop("ts_aligned_ns", "ts_ns")
    span = ops.group_by("rank").agg(lo=pl.col("ts_ns").min(), hi=pl.col("end_ns").max())
    return waits.join(span, on="rank").filter(
        pl.col("call_ts_ns").is_between(pl.col("lo"), pl.col("hi"))).drop("lo", "hi")


def whatif_result(run: Run, scenarios: Sequence[str] = ()) -> Result:
    """The self-check and each scenario (``SpecError`` for an unreadable SPEC, before any
    replay)."""
    from traceview.analyses.replay.scenarios import parse_scenario
    for spec in scenarios:
        parse_scenario(spec)
    replay = run.replay
    check, found = whatif(replay.graph, scenarios, base=replay.base)
    notes = replay_notes(replay) + gpu_wait_notes(run)
    gains = rank_gains(replay)
    return run._result("whatif", {
        "window": run.window_info,
        "steps": check.steps,
        "replay_error": check.to_dict(),
        "trusted": check.trusted,
        "not_reproduced": check.causes,
        "scenarios": found,
        "verdict": culprits(replay, gains),
        "ranks": gains,
        "types": type_slowdowns(replay),
        "critical_path": replay_path(replay),
        "graph": graph_counts(replay),
        "notes": notes,
    }, main="steps", uses=("match", "offsets", "p2p"))


def straggler_gains(run: Run, verdicts: pl.DataFrame | None
                    ) -> dict[int, tuple[float, bool]] | None:
    """Per rank the straggler analysis flags, the replay's gain of making it typical and
    whether the replay is trusted: ``diagnose``'s straggler gain (one replay per flagged
    rank). None when nothing is flagged or the replay cannot be built (diagnose then gives
    the wait the rank caused, the straggler analysis's figure)."""
    if verdicts is None or "flagged" not in verdicts.columns:
        return None
    flagged = verdicts.filter(pl.col("flagged")).get_column("rank").to_list()
    if not flagged:
        return None
    try:
        replay = run.replay
    except Exception:  # noqa: BLE001 - a partial answer: diagnose gives the caused wait
        return None
    if replay.check.steps.height == 0:
        return None
    steps = replay.check.steps.select("step", "replayed_ns")
    out = {}
    for rank in flagged:
        found = step_times(replay.graph.points,
                           replay_scenario(replay.graph, f"rank={rank}:typical").time)
        both = steps.join(found.select("step", s="replayed_ns"), on="step")
        out[int(rank)] = (float((both.get_column("replayed_ns") - both.get_column("s")).mean()),
                          replay.check.trusted)
    return out


#: The replay's verdict is worth its cost (a replay per candidate rank) when one rank's own
#: time makes the others wait at least this share of the median step, the floor under which
#: ``verdicts.culprits`` names nobody anyway (``MIN_GAIN_SHARE``).
WORTH_REPLAYING_SHARE = 0.05


def worth_replaying(run: Run) -> bool:
    """Whether the cheap collective data shows cross-rank waiting worth explaining: a flagged
    straggler, or a rank causing waits of ``WORTH_REPLAYING_SHARE`` of the median step.
    Decided on the data alone, never on whether the Run already holds a replay: the answer
    must not depend on which command ran first."""
    verdicts = run._stragglers
    if verdicts.height == 0 or "caused_wait_per_step_ns" not in verdicts.columns:
        return False
    if verdicts.get_column("flagged").any():
        return True
    step = run.steps.get_column("step_time_ns").median() if run.steps.height else None
    caused = verdicts.get_column("caused_wait_per_step_ns").max()
    if step is None or caused is None:
        return False
    return float(caused) >= WORTH_REPLAYING_SHARE * float(step)


def replay_verdict(run: Run) -> dict[str, Any] | None:
    """The replay's culprits (``verdicts.culprits``) with the per-rank gains (S_w) they come
    from and what does not reproduce; None for one rank, a window with no cross-rank waiting
    worth explaining (``worth_replaying``: summary stays cheap on 1,000 ranks), or a replay
    that cannot be built (the other analyses still answer)."""
    if len(run.ranks_present) < 2:
        return None
    try:
        if not worth_replaying(run):
            return None
        replay = run.replay
        steps = replay.check.steps
        if steps.height == 0 or not (steps.get_column("replayed_ns").mean() or 0) > 0:
            return None  # nothing replayed: no step time to be a share of
        gains = rank_gains(replay)
        verdict = culprits(replay, gains)
    except Exception:  # noqa: BLE001 - a partial answer: the heuristics answer alone
        return None
    return {**verdict, "ranks": gains, "replay_error": replay.check.to_dict(),
            "not_reproduced": replay.check.causes.get_column("what").to_list()}


def straggler_fields(run: Run, verdicts: pl.DataFrame | None, *,
                     slowdowns: bool = False) -> dict[str, Any]:
    """The replay's verdict as the fields ``stragglers`` and ``summary``'s worst straggler
    add: ``replay_culprits`` (each rank with its own gain, steps and confidence),
    ``patterns`` (``pattern``: ``steady``/``few_steps``/``moving``/``none``; ``named``: the
    replay-only verdict every command gives, ``several``/``few_steps``/``moving`` or None;
    ``ranks``; ``combined_gain_ns_per_step`` (replayed); ``moving_cost_ns_per_step``;
    ``trusted``; ``replay_error``; ``words``); with ``slowdowns``, the study's S_w
    (``rank_slowdowns``) and S_t (``type_slowdowns``). Empty lists and a null pattern where
    nothing was worth replaying."""
    verdict = run.replay_verdict
    flagged = [] if verdicts is None or "flagged" not in verdicts.columns else \
        verdicts.filter(pl.col("flagged")).get_column("rank").to_list()
    if verdict is None:
        out: dict[str, Any] = {"replay_culprits": [], "patterns": None}
        if slowdowns:
            out |= {"rank_slowdowns": None, "type_slowdowns": None}
        return out
    named = replay_named(verdict, flagged=flagged)
    ranks = verdict.get("moving_ranks") if verdict["pattern"] == "moving" else \
        [c["rank"] for c in verdict["culprits"]]
    out = {"replay_culprits": verdict["culprits"], "patterns": {
        "pattern": verdict["pattern"], "named": named, "ranks": ranks or [],
        "combined_gain_ns_per_step": verdict["combined_gain_ns_per_step"],
        "moving_cost_ns_per_step": verdict["moving_cost_ns_per_step"],
        "trusted": verdict["trusted"], "replay_error": verdict["replay_error"],
        "words": verdict_words(verdict)}}
    if slowdowns:
        out |= {"rank_slowdowns": verdict["ranks"], "type_slowdowns": type_slowdowns(run.replay)}
    return out


def worst_with_replay(run: Run, worst: dict[str, Any]) -> dict[str, Any]:
    """``summary``'s worst straggler with the replay's verdict: ``replay_culprits``,
    ``patterns`` (``straggler_fields``) and ``ranks``, every rank named (the flagged one, or
    the replay's several or intermittent ranks; none for a moving stall). Where the straggler
    analysis flags nobody and the replay names a pattern, ``reason`` says it ("moving
    stall ...", "intermittent stall on steps ..."). One rank or a failed straggler analysis:
    unchanged. The replay is built only where nobody is flagged and a rank causes waiting
    worth explaining (``worth_replaying``)."""
    if len(run.ranks_present) < 2:
        return worst
    if worst.get("rank") is not None:
        # a flagged straggler is summary's answer whatever the replay adds: no replay here,
        # so a 1,000-rank summary with a clear straggler costs what it did (stragglers and
        # diagnose give the replay's gains and further culprits)
        return {**worst, "replay_culprits": [], "patterns": None, "ranks": [worst["rank"]]}
    try:
        verdicts = run._stragglers
    except Exception:  # noqa: BLE001 - the heuristic's answer already says why
        return worst
    fields = straggler_fields(run, verdicts)
    patterns = fields["patterns"] or {}
    named = patterns.get("named")
    ranks = [worst["rank"]] if worst.get("rank") is not None else \
        patterns["ranks"] if named in ("several", "few_steps") else []
    out = {**worst, **fields, "ranks": ranks}
    if named is not None:
        # replay-only: no second analysis backs it (replay.findings)
        out |= {"reason": patterns["words"],
                "confidence": "medium" if patterns["trusted"] else "low"}
    return out


def path_ranks_of(replay: Replay, measured: pl.DataFrame) -> pl.DataFrame:
    """``critical-path``'s per-rank table (``rank, path_ns, share, top_category``, every rank
    of ``measured``, the path's own table) from the replay's longest path: it crosses to
    another rank wherever the replay waited there, which the measured path cannot see inside
    a framework's hidden waits (issue 46). ``top_category`` is then the replay's edge kind
    (``work``, ``transfer``, ``wait``, ...). Column ``source``: ``replay``, or ``path`` (the
    measured path's table, kept where the replay has no path); ``measured_path_ns``,
    ``measured_share``: the measured path's beside it (what ``traceview export
    --critical-path`` draws).

    A replay that reproduced no step (no self-check) gives no path: the measured walk's table
    is kept. A run where the replay found no wait gets the replay's path too (a GPU step whose
    host never synchronises is done when its GPU work is: ``verdicts.step_finish``). An
    untrusted replay's path is used (``replay.trusted`` says so): on every multi-rank
    fixture with a flagged straggler (29 runs, 12 untrusted) the replay path's largest share
    is that rank, where the measured path missed it on FSDP2."""
    kept = measured.with_columns(source=pl.lit("path"), measured_path_ns=pl.col("path_ns"),
                                 measured_share=pl.col("share"))
    found = path_ranks(critical_path(replay))
    if found.height == 0 or replay.check.median is None:
        return kept
    return measured.select("rank", measured_path_ns="path_ns", measured_share="share").join(
        found.select("rank", "path_ns", "share", top_category="top_kind"), on="rank",
        how="left").with_columns(pl.col("path_ns").fill_null(0), pl.col("share").fill_null(0.0),
                                 source=pl.lit("replay")).select(
        "rank", "path_ns", "share", "top_category", "source", "measured_path_ns",
        "measured_share").sort(
        "path_ns", "rank", descending=[True, False])


def replay_path(replay: Replay) -> dict[str, Any]:
    """The replay's critical path for ``critical-path --json`` (field ``replay``): its time per
    rank and per kind of edge, with the self-check that says whether to believe it."""
    path = critical_path(replay)
    return {"trusted": replay.check.trusted, "replay_error": replay.check.to_dict(),
            "ranks": path_ranks(path).to_dicts(),
            "kinds": path.group_by("kind").agg(ns=pl.col("ns").sum())
            .sort("ns", descending=True).to_dicts()}


def gpu_wait_notes(run: Run) -> list[str]:
    """The GPU stream waits the replay cannot see, as causes of its error
    (``analyses.stream_waits.stream_wait_notes``): one note per cause, naming its ranks (the
    first rank's words). Empty for a CPU run or one whose waits all have their edges."""
    notes = stream_wait_notes(stream_wait_coverage(run._rank_comm_source))
    if notes.height == 0:
        return []
    per = notes.group_by("cause", maintain_order=True).agg(
        pl.col("rank").sort(), pl.col("note").first())
    return [f"replay: rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {note}"
            for ranks, note in per.select("rank", "note").rows()]


def graph_counts(replay: Replay) -> dict[str, Any]:
    pts = replay.graph.points
    return {"points": pts.height,
            "waits": int((pts.get_column("kind") == "wait").sum()),
            "instances": replay.graph.instances.height, "forced": replay.base.forced}


def replay_notes(replay: Replay) -> list[str]:
    """What the reader should know about the replay: no steps, untrusted and why."""
    check = replay.check
    if check.steps.height == 0:
        return ["replay: no events to replay in the window"]
    notes = []
    if check.steps.get_column("step").to_list() == [WHOLE_WINDOW]:
        notes.append("replay: no step markers (ProfilerStep#N): the window is replayed as one "
                     "step (step -1), from each rank's first point to its last")
    if check.trusted:
        return notes
    notes += [f"replay: not trusted: replay error p90 {check.p90:.1%} (above 5%): verdicts "
             "built on it have low confidence"]
    if check.forced:
        notes.append(f"replay: {check.forced} node(s) taken out of dependency order (the "
                     "graph's edges form a cycle: a wrong edge)")
    notes += [f"replay: {what}" for what in check.causes.get_column("what").head(5)]
    return notes


__all__ = ["gpu_wait_notes", "path_ranks_of", "replay_of", "replay_path", "replay_verdict", "straggler_fields", "straggler_gains",
           "whatif_result", "worst_with_replay", "worth_replaying"]
