"""Pipeline parallelism from the send/recv pairs: the stages, where each stage's step goes,
the bubble, the schedule and the bottleneck stage.

Definitions with a worked example: ``docs/metrics.md``, section *Pipeline*. Everything is on
the aligned timeline (``Run.p2p`` pairs, ``collective_ranks`` rows; the steps are moved onto
it with ``offsets``).

* **Stages**: the graph of who sends to whom. Each connected set of ranks that forms a chain
  (or a ring: an interleaved schedule) is one pipeline; its first stage is the end whose first
  send/recv call in a step is a send (it starts the forward pass; the other end receives
  first), and the stages follow the chain from there. A rank's *upstream* is the stage before
  it, its *downstream* the stage after it (in a ring, the last stage's downstream is the first).
* **Per stage and step** (the rank's ``ProfilerStep``): each send/recv call is split into a
  *wait* (until its peer arrived: a recv until the send started, a send until the recv was
  posted, both within the call) and the *transfer* (the rest of the call); ``wait_upstream_ns``
  / ``wait_downstream_ns`` are the waits of the calls with the upstream / downstream stage,
  ``p2p_transfer_ns`` the transfers (exposed: the calls block), ``collective_ns`` the time in
  the rank's blocking collectives (``collective_wait_ns`` of it waiting for the last member),
  and ``compute_ns`` = step - the union of the send/recv and collective calls: the stage's own
  time.
* **GPU stages** (send/recv timed by their NCCL kernels, which wait inside themselves on
  streams beside the compute): every wait, transfer and collective counts only for its part
  outside the stage's own device work (``device_busy``), and ``compute_ns`` = step - the
  exposed part of the calls' union.
* **Bubble**: the waits while the pipeline fills and drains: the wait of the step's first
  recv from upstream (warm-up: nothing to do before the first micro-batch arrives), of its
  first recv from downstream (the forward pass draining and the backward pass filling), and
  the collective waits after the stage's last send/recv call (cool-down: waiting for the
  stages still draining; without a collective there, the wait shows at the next step's first
  recv). ``bubble_fraction`` = bubble / step time. The other waits are imbalance: a stage
  waiting in the steady state for a slower one.
* **Schedule**: ``GPipe`` when every stage makes all its forward calls (send downstream, recv
  from upstream) before its backward calls in most steps, ``1F1B`` when a stage alternates,
  ``interleaved`` for a ring, ``forward-only`` without backward calls. ``micro_batches``
  ``m`` = forward sends per stage and step (median); in a ring of ``v`` chunks the last stage
  sends ``(v - 1) m``, the others ``v m``. Ideal bubble fraction ``(p - 1) / (v m + p - 1)``
  (``v`` = 1 but in a ring).
* **Bottleneck**: the stage with the most compute per step (it idles least); ``gain_ns_per_step``
  = its compute per step - the median of the other stages', what a step would lose were it as
  fast as the median stage; ``clear`` when it leads in most steps by more than the stages' own
  step-to-step jitter (``BOTTLENECK_*``); otherwise ``rank`` and ``stage`` are null and the
  leading stage is ``leading_rank``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceview.analyses.align import apply_offsets
from traceview.analyses.collective_match import P2P
from traceview.analyses.intervals import total_length, union

STAGE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "pipeline": pl.Int32, "stage": pl.Int32, "upstream_rank": pl.Int32,
    "downstream_rank": pl.Int32,
}
#: One row per (stage, step); ``stages`` has the same columns summed over the steps.
PARTS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "pipeline": pl.Int32, "stage": pl.Int32, "step": pl.Int64,
    "step_start_ns": pl.Int64, "step_ns": pl.Int64, "compute_ns": pl.Int64, "p2p_transfer_ns": pl.Int64,
    "wait_upstream_ns": pl.Int64, "wait_downstream_ns": pl.Int64, "collective_ns": pl.Int64,
    "collective_wait_ns": pl.Int64, "bubble_ns": pl.Int64, "bubble_fraction": pl.Float64,
    "idle_ns": pl.Int64, "idle_fraction": pl.Float64, "sends": pl.Int64, "recvs": pl.Int64,
}
STAGES_SCHEMA: dict[str, pl.DataType] = {
    **{k: v for k, v in PARTS_SCHEMA.items() if k not in ("step", "step_start_ns")},
    "steps": pl.Int64, "compute_per_step_ns": pl.Int64, "upstream_rank": pl.Int32,
    "downstream_rank": pl.Int32,
}

#: The stages' waits, transfers and collectives as segments of their timeline (``part``:
#: ``bubble``, ``wait_upstream``, ``wait_downstream``, ``p2p_transfer``, ``collective``).
TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32, "pipeline": pl.Int32, "stage": pl.Int32, "step": pl.Int64,
    "part": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
}

#: A bottleneck is clear when it computes the most in at least this share of the steps ...
BOTTLENECK_STEP_SHARE = 0.75
#: ... and leads the median stage by more than this many times the stages' step-to-step
#: jitter of compute (1.4826 x MAD, pooled over the other stages) ...
BOTTLENECK_NOISE = 3.0
#: ... and by at least this share of the step time.
BOTTLENECK_MIN_SHARE = 0.01

_SUMMED = ("step_ns", "compute_ns", "p2p_transfer_ns", "wait_upstream_ns",
           "wait_downstream_ns", "collective_ns", "collective_wait_ns", "bubble_ns", "idle_ns",
           "sends", "recvs")


def pipeline(pairs: pl.DataFrame, steps: pl.DataFrame | None = None, *,
             collective_rows: pl.DataFrame | None = None,
             offsets: pl.DataFrame | None = None,
             device_busy: pl.DataFrame | None = None) -> dict[str, Any]:
    """``stages`` (``STAGES_SCHEMA``, one row per rank in a pipeline, by pipeline and stage),
    ``steps`` (``PARTS_SCHEMA``), ``bottleneck``, ``schedule``, ``timeline``
    (``TIMELINE_SCHEMA``) and ``notes``.

    ``pairs``: :func:`~traceview.analyses.p2p.pair_p2p` (aligned); ``steps``:
    :func:`~traceview.analyses.window.step_spans` on each rank's clock, moved with
    ``offsets``; ``collective_rows``: :func:`~traceview.analyses.collectives.collective_ranks`
    (aligned; send/recv rows left out); ``device_busy``: ``rank, ts_ns, end_ns`` (aligned),
    the ranks' own device work (kernels, copies and sets that are not communication): on a
    *GPU stage* (its send/recv timed by their kernels) only what of a wait, transfer or
    collective lies outside it counts (module docstring)."""
    notes: list[str] = []
    stages = stage_order(pairs, steps, offsets=offsets, notes=notes)
    if stages.height == 0:
        if pairs.height == 0:
            notes.append("no send/recv pair: no pipeline")
        return {"stages": pl.DataFrame(schema=STAGES_SCHEMA),
                "steps": pl.DataFrame(schema=PARTS_SCHEMA),
                "bottleneck": _no_bottleneck("no pipeline stages"),
                "schedule": _schedule_of(None), "timeline": pl.DataFrame(schema=TIMELINE_SCHEMA),
                "notes": notes}
    spans = _spans(pairs, steps, offsets, notes)
    busy = _gpu_stage_busy(pairs, device_busy)
    calls = _calls(pairs, stages, spans, busy)
    parts, timeline = _parts(calls, stages, spans, collective_rows, busy)
    per_stage = _per_stage(parts, stages)
    return {"stages": per_stage, "steps": parts, "bottleneck": bottleneck(parts, per_stage),
            "schedule": schedule(calls, stages, parts), "timeline": timeline, "notes": notes}


# --- the stages ------------------------------------------------------------------------------

def stage_order(pairs: pl.DataFrame, steps: pl.DataFrame | None = None, *,
                offsets: pl.DataFrame | None = None,
                notes: list[str] | None = None) -> pl.DataFrame:
    """``STAGE_SCHEMA``: each rank's pipeline (a connected set of ranks exchanging send/recv
    pairs that forms a chain or a ring), its stage and its neighbours (module docstring)."""
    notes = notes if notes is not None else []
    if pairs.height == 0:
        return pl.DataFrame(schema=STAGE_SCHEMA)
    edges = pairs.select("src", "dst").unique()
    peers: dict[int, set[int]] = {}
    for a, b in edges.iter_rows():
        if a != b:
            peers.setdefault(a, set()).add(b)
            peers.setdefault(b, set()).add(a)
    first_send = _first_call_is_send(pairs, steps, offsets)
    rows: list[tuple[int, int, int, int | None, int | None]] = []
    seen: set[int] = set()
    for start in sorted(peers):
        if start in seen:
            continue
        component = _component(start, peers)
        seen |= component
        order = _chain_or_ring(component, peers, first_send, pairs)
        if order is None:
            notes.append(f"ranks {sorted(component)}: send/recv with more than two peers (or "
                         "no end to start from): not a pipeline, left out")
            continue
        ring = len(order) > 2 and all(len(peers[r]) == 2 for r in order)
        p = len(order)
        pipe = len({r[1] for r in rows})
        for s, rank in enumerate(order):
            up = order[s - 1] if s > 0 or ring else None
            down = order[(s + 1) % p] if s < p - 1 or ring else None
            rows.append((rank, pipe, s, up, down))
    return pl.DataFrame(rows, schema=STAGE_SCHEMA, orient="row").sort("pipeline", "stage")


def _component(start: int, peers: dict[int, set[int]]) -> set[int]:
    todo, out = [start], {start}
    while todo:
        for q in peers[todo.pop()]:
            if q not in out:
                out.add(q)
                todo.append(q)
    return out


def _chain_or_ring(component: set[int], peers: dict[int, set[int]],
                   first_send: dict[int, float], pairs: pl.DataFrame) -> list[int] | None:
    """The ranks of one pipeline in stage order, or None when they are no chain or ring."""
    if any(len(peers[r]) > 2 for r in component):
        return None
    ends = sorted(r for r in component if len(peers[r]) == 1)
    if len(component) == 1:
        return None
    candidates = ends if ends else sorted(component)
    if len(ends) not in (0, 2):
        return None
    first = max(candidates, key=lambda r: (first_send.get(r, 0.0), -r))
    if ends:  # a chain: follow it from the first stage
        order, prev = [first], None
        while len(order) < len(component):
            nxt = next(q for q in peers[order[-1]] if q != prev)
            prev = order[-1]
            order.append(nxt)
        return order
    # a ring: forward is the neighbour the first stage sends to first
    sent = pairs.filter(pl.col("src") == first).sort("send_ns")
    nxt = sent.get_column("dst")[0] if sent.height else min(peers[first])
    order, prev = [first, nxt], first
    while len(order) < len(component):
        cur = order[-1]
        after = next(q for q in peers[cur] if q != prev)
        prev = cur
        order.append(after)
    return order


def _first_call_is_send(pairs: pl.DataFrame, steps: pl.DataFrame | None,
                        offsets: pl.DataFrame | None) -> dict[int, float]:
    """Per rank, the share of its steps (the window, without steps) whose first send/recv
    call is a send: 1 for the first stage, 0 for the others (they receive first)."""
    sides = _sides(pairs)
    spans = _aligned_steps(steps, offsets)
    if spans is not None and spans.height:
        sides = _in_steps(sides, spans)
    else:
        sides = sides.with_columns(step=pl.lit(0, pl.Int64))
    first = sides.sort("ts_ns", "end_ns").group_by("rank", "step").agg(pl.col("op").first()) \
        .group_by("rank").agg(share=(pl.col("op") == "send").mean())
    return dict(first.iter_rows())


def _sides(pairs: pl.DataFrame) -> pl.DataFrame:
    """One row per send or recv call of the pairs: ``rank, peer, op, ts_ns, end_ns,
    peer_ns`` (when the peer arrived)."""
    timed = "send_timing" in pairs.columns
    send = pairs.select(rank="src", peer="dst", op=pl.lit("send"), ts_ns="send_ns",
                        end_ns="send_end_ns", peer_ns="recv_ns",
                        timing=pl.col("send_timing") if timed else pl.lit("host"))
    recv = pairs.select(rank="dst", peer="src", op=pl.lit("recv"), ts_ns="recv_ns",
                        end_ns="recv_end_ns", peer_ns="send_ns",
                        timing=pl.col("recv_timing") if timed else pl.lit("host"))
    return pl.concat([send, recv]).with_columns(pl.col("rank", "peer").cast(pl.Int32))


# --- steps -----------------------------------------------------------------------------------

def _aligned_steps(steps: pl.DataFrame | None,
                   offsets: pl.DataFrame | None) -> pl.DataFrame | None:
    """``rank, step, step_start_ns, step_end_ns`` on the aligned timeline."""
    if steps is None or steps.height == 0:
        return None
    spans = steps.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64),
                         "step_start_ns", "step_end_ns")
    if offsets is None or offsets.height == 0:
        return spans
    moved = apply_offsets(spans.with_columns(ts_ns="step_start_ns"), offsets).collect()
    return moved.select("rank", "step", step_start_ns="ts_aligned_ns",
                        step_end_ns=pl.col("ts_aligned_ns") + pl.col("step_end_ns")
                        - pl.col("step_start_ns"))


def _spans(pairs: pl.DataFrame, steps: pl.DataFrame | None, offsets: pl.DataFrame | None,
           notes: list[str]) -> pl.DataFrame:
    """The units a stage's time is accounted in: its steps, or (without ProfilerStep ranges)
    the span of its send/recv calls as one step (null)."""
    spans = _aligned_steps(steps, offsets)
    if spans is not None and spans.height:
        return spans
    notes.append("no ProfilerStep ranges: each rank's span of send/recv calls is one step")
    return _sides(pairs).group_by("rank").agg(
        step_start_ns=pl.col("ts_ns").min(), step_end_ns=pl.col("end_ns").max()).select(
        "rank", step=pl.lit(None, pl.Int64), step_start_ns="step_start_ns",
        step_end_ns="step_end_ns")


def _in_steps(frame: pl.DataFrame, spans: pl.DataFrame, *, at: str = "ts_ns") -> pl.DataFrame:
    """``frame`` with ``step``, the rank's step in which ``at`` lies (rows outside any step
    dropped)."""
    return frame.sort(at).join_asof(
        spans.sort("step_start_ns"), left_on=at, right_on="step_start_ns", by="rank",
        strategy="backward", check_sortedness=False).filter(
        pl.col("step_start_ns").is_not_null() & (pl.col(at) < pl.col("step_end_ns"))) \
        .drop("step_start_ns", "step_end_ns")


# --- per stage and step ----------------------------------------------------------------------

def _calls(pairs: pl.DataFrame, stages: pl.DataFrame, spans: pl.DataFrame,
           busy: pl.DataFrame) -> pl.DataFrame:
    """Every send/recv call of a stage with its step, wait, transfer, direction (``forward``:
    send downstream or recv from upstream; ``backward`` the other way) and ``fill``: the
    step's first recv from that side, whose wait is bubble. On a GPU stage the wait and the
    transfer are their exposed parts (outside the stage's own device work, ``busy``)."""
    sides = _sides(pairs).join(stages, on="rank")
    peer_is = pl.when(pl.col("peer") == pl.col("upstream_rank")).then(pl.lit("upstream")) \
        .when(pl.col("peer") == pl.col("downstream_rank")).then(pl.lit("downstream"))
    sides = sides.with_columns(side=peer_is).with_columns(
        direction=pl.when((pl.col("side") == "downstream") == (pl.col("op") == "send"))
        .then(pl.lit("forward")).otherwise(pl.lit("backward")),
        wait_ns=(pl.min_horizontal("peer_ns", "end_ns") - pl.col("ts_ns")).clip(0))
    sides = sides.with_columns(transfer_ns=pl.col("end_ns") - pl.col("ts_ns") - pl.col("wait_ns"))
    if busy.height:  # the wait is [ts, ts + wait), the transfer the rest of the call
        sides = sides.with_columns(_mid=pl.col("ts_ns") + pl.col("wait_ns"))
        sides = _covered(_covered(sides, busy, "ts_ns", "_mid", "_wait_hidden"), busy,
                         "_mid", "end_ns", "_xfer_hidden").with_columns(
            wait_ns=pl.col("wait_ns") - pl.col("_wait_hidden"),
            transfer_ns=pl.col("transfer_ns") - pl.col("_xfer_hidden")).drop(
            "_mid", "_wait_hidden", "_xfer_hidden")
    if spans.get_column("step").null_count() == spans.height:  # one span per rank, step null
        sides = sides.join(spans.select("rank", "step"), on="rank", how="left")
    else:
        sides = _in_steps(sides, spans)
    first = pl.col("ts_ns").rank("ordinal").over("rank", "step", "op", "side") == 1
    return sides.with_columns(fill=(pl.col("op") == "recv") & first).sort("rank", "ts_ns")


def _parts(calls: pl.DataFrame, stages: pl.DataFrame, spans: pl.DataFrame,
           collective_rows: pl.DataFrame | None,
           busy: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``PARTS_SCHEMA`` per stage and step, and the ``TIMELINE_SCHEMA`` segments; on a GPU
    stage (``busy``) only the parts of its calls outside its own device work count."""
    key = ["rank", "step"]
    grid = spans.join(stages.select("rank", "pipeline", "stage"), on="rank")
    by_call = calls.group_by(key).agg(
        wait_upstream_ns=pl.col("wait_ns").filter(pl.col("side") == "upstream").sum(),
        wait_downstream_ns=pl.col("wait_ns").filter(pl.col("side") == "downstream").sum(),
        p2p_transfer_ns=pl.col("transfer_ns").sum(),
        sends=(pl.col("op") == "send").sum().cast(pl.Int64),
        recvs=(pl.col("op") == "recv").sum().cast(pl.Int64),
        last_call_end_ns=pl.col("end_ns").max(),
        fill_ns=pl.col("wait_ns").filter("fill").sum())
    out = grid.join(by_call, on=key, how="left", nulls_equal=True)
    coll = _collectives(collective_rows, stages, spans, busy).join(
        out.select(*key, "last_call_end_ns"), on=key, how="left", nulls_equal=True) \
        .with_columns(cooldown=pl.col("last_call_end_ns").is_null()
                      | (pl.col("ts_ns") >= pl.col("last_call_end_ns")))
    # the time in any send/recv or collective call (a union: they may overlap on threads)
    in_calls = pl.concat([calls.select(*key, "ts_ns", "end_ns"),
                      coll.select(*key, "ts_ns", "end_ns")]).join(
        spans, on=key, how="left", nulls_equal=True).with_columns(
        ts_ns=pl.max_horizontal("ts_ns", "step_start_ns"),
        end_ns=pl.min_horizontal("end_ns", "step_end_ns")).filter(
        pl.col("end_ns") > pl.col("ts_ns"))
    in_comm = _union_length(in_calls, "comm_ns", busy)
    coll_len = _union_length(coll, "collective_ns", busy)
    cool = coll.group_by(key).agg(collective_wait_ns=pl.col("wait_ns").sum(),
                                  cooldown_ns=pl.col("wait_ns").filter("cooldown").sum())
    for extra in (in_comm, coll_len, cool):
        out = out.join(extra.with_columns(pl.col("rank").cast(pl.Int32),
                                          pl.col("step").cast(pl.Int64)),
                       on=key, how="left", nulls_equal=True)
    zero = ["wait_upstream_ns", "wait_downstream_ns", "p2p_transfer_ns", "sends", "recvs",
            "fill_ns", "comm_ns", "collective_ns", "collective_wait_ns", "cooldown_ns"]
    out = out.with_columns(pl.col(zero).fill_null(0)).with_columns(
        step_ns=pl.col("step_end_ns") - pl.col("step_start_ns"))
    out = out.with_columns(
        compute_ns=(pl.col("step_ns") - pl.col("comm_ns")).clip(0),
        bubble_ns=pl.col("fill_ns") + pl.col("cooldown_ns"),
        idle_ns=pl.col("wait_upstream_ns") + pl.col("wait_downstream_ns")
        + pl.col("collective_wait_ns"))
    out = out.with_columns(
        bubble_fraction=_share("bubble_ns", "step_ns"), idle_fraction=_share("idle_ns", "step_ns"))
    parts = out.select(list(PARTS_SCHEMA)).cast(PARTS_SCHEMA).sort("pipeline", "stage", "step")
    return parts, _timeline(calls, coll, stages)


def _timeline(calls: pl.DataFrame, coll: pl.DataFrame, stages: pl.DataFrame) -> pl.DataFrame:
    """The stages' waits, transfers and collectives as segments (``TIMELINE_SCHEMA``); the
    rest of a step is the stage's own time."""
    wait_end = pl.col("ts_ns") + pl.col("wait_ns")
    segments = [
        calls.select("rank", "step", part=pl.when("fill").then(pl.lit("bubble"))
                     .otherwise(pl.format("wait_{}", "side")), start_ns="ts_ns",
                     end_ns=wait_end),
        calls.select("rank", "step", part=pl.lit("p2p_transfer"), start_ns=wait_end,
                     end_ns="end_ns"),
        coll.select("rank", "step", part=pl.when("cooldown").then(pl.lit("bubble"))
                    .otherwise(pl.lit("collective")), start_ns="ts_ns", end_ns=wait_end),
        coll.select("rank", "step", part=pl.lit("collective"), start_ns=wait_end,
                    end_ns="end_ns"),
    ]
    out = pl.concat([s.with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64))
                     for s in segments]).filter(
        pl.col("end_ns") > pl.col("start_ns")).join(
        stages.select("rank", "pipeline", "stage"), on="rank")
    return out.select(list(TIMELINE_SCHEMA)).cast(TIMELINE_SCHEMA).sort(
        "pipeline", "stage", "start_ns")


def _union_length(frame: pl.DataFrame, name: str, busy: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step), the length of the union of ``[ts_ns, end_ns)``, without what of it
    lies in the rank's ``busy`` device work (a GPU stage's own time)."""
    key = ["rank", "step"]
    if frame.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, name: pl.Int64})
    merged = union(frame.select(*key, "ts_ns", "end_ns"), by=key)
    if busy.height == 0:
        return total_length(merged, by=key, name=name)
    merged = _covered(merged.with_columns(pl.col("rank").cast(pl.Int32)), busy, "ts_ns",
                      "end_ns", "_hidden")
    return merged.group_by(key).agg(
        (pl.col("end_ns") - pl.col("ts_ns") - pl.col("_hidden")).sum().alias(name))


def _gpu_stage_busy(pairs: pl.DataFrame, device_busy: pl.DataFrame | None) -> pl.DataFrame:
    """The merged own device work of the GPU stages (ranks with a send/recv timed by its
    kernel), with ``before_ns``: the busy time before each interval (for :func:`_covered`)."""
    schema = {"rank": pl.Int32, "ts_ns": pl.Int64, "end_ns": pl.Int64, "before_ns": pl.Int64}
    if device_busy is None or device_busy.height == 0 or pairs.height == 0:
        return pl.DataFrame(schema=schema)
    on_gpu = _sides(pairs).filter(pl.col("timing") == "gpu").get_column("rank").unique()
    work = device_busy.select(pl.col("rank").cast(pl.Int32), "ts_ns", "end_ns").filter(
        pl.col("rank").is_in(on_gpu.implode()) & (pl.col("end_ns") > pl.col("ts_ns")))
    if work.height == 0:
        return pl.DataFrame(schema=schema)
    merged = union(work, by=["rank"]).sort("rank", "ts_ns")
    return merged.with_columns(
        before_ns=(pl.col("end_ns") - pl.col("ts_ns")).cum_sum().shift(1, fill_value=0)
        .over("rank")).select(list(schema)).cast(schema)


def _covered(frame: pl.DataFrame, busy: pl.DataFrame, lo: str, hi: str,
             name: str) -> pl.DataFrame:
    """``frame`` with ``name``: the length of ``[lo, hi)`` that the rank's merged ``busy``
    intervals cover (busy time before ``hi`` - busy time before ``lo``, each by an as-of
    lookup of the last busy interval starting at or before it); 0 on ranks not in ``busy``."""
    table = busy.select("rank", _s="ts_ns", _e="end_ns", _b="before_ns").sort("_s")

    def before(at: str, out: str) -> pl.DataFrame:
        looked = frame.with_row_index("_row").with_columns(_at=pl.col(at)).sort("_at").join_asof(
            table, left_on="_at", right_on="_s", by="rank", strategy="backward",
            check_sortedness=False)
        inside = (pl.min_horizontal("_at", "_e") - pl.col("_s")).clip(0)
        return looked.select("_row", (pl.col("_b") + inside).fill_null(0).alias(out))

    low, high = before(lo, "_lo_b"), before(hi, "_hi_b")
    out = frame.with_row_index("_row").join(low, on="_row").join(high, on="_row")
    return out.with_columns(
        pl.max_horizontal(pl.col("_hi_b") - pl.col("_lo_b"), pl.lit(0)).alias(name)).drop(
        "_row", "_lo_b", "_hi_b")


def _share(part: str, whole: str) -> pl.Expr:
    return pl.when(pl.col(whole) > 0).then(pl.col(part) / pl.col(whole))


def _collectives(rows: pl.DataFrame | None, stages: pl.DataFrame,
                 spans: pl.DataFrame, busy: pl.DataFrame) -> pl.DataFrame:
    """The stages' collective calls (send/recv left out): ``rank, step, ts_ns, end_ns,
    wait_ns`` (the wait within the call; on a GPU stage, its part outside ``busy``)."""
    schema = {"rank": pl.Int32, "step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64,
              "wait_ns": pl.Int64}
    if rows is None or rows.height == 0:
        return pl.DataFrame(schema=schema)
    if "collective" in rows.columns:
        rows = rows.filter(~pl.col("collective").is_in(list(P2P)))
    calls = rows.select(pl.col("rank").cast(pl.Int32), ts_ns="arrival_ns", end_ns="end_ns",
                        wait_ns=pl.min_horizontal(
                            (pl.col("last_arrival_ns") - pl.col("arrival_ns")).clip(0),
                            pl.col("end_ns") - pl.col("arrival_ns"))).join(
        stages.select("rank"), on="rank")
    if busy.height:
        calls = _covered(calls.with_columns(_mid=pl.col("ts_ns") + pl.col("wait_ns")), busy,
                         "ts_ns", "_mid", "_hidden").with_columns(
            wait_ns=pl.col("wait_ns") - pl.col("_hidden")).drop("_mid", "_hidden")
    if spans.get_column("step").null_count() == spans.height:
        return calls.join(spans.select("rank", "step"), on="rank").select(list(schema)) \
            .cast(schema)
    return _in_steps(calls, spans).select(list(schema)).cast(schema)


def _per_stage(parts: pl.DataFrame, stages: pl.DataFrame) -> pl.DataFrame:
    per = parts.group_by("rank", "pipeline", "stage").agg(
        *(pl.col(c).sum() for c in _SUMMED), steps=pl.len().cast(pl.Int64))
    per = per.with_columns(
        bubble_fraction=_share("bubble_ns", "step_ns"), idle_fraction=_share("idle_ns", "step_ns"),
        compute_per_step_ns=(pl.col("compute_ns") / pl.col("steps")).round(0).cast(pl.Int64))
    per = per.join(stages.select("rank", "upstream_rank", "downstream_rank"), on="rank")
    return per.select(list(STAGES_SCHEMA)).cast(STAGES_SCHEMA).sort("pipeline", "stage")


# --- the bottleneck and the schedule ---------------------------------------------------------

def _no_bottleneck(reason: str) -> dict[str, Any]:
    return {"rank": None, "stage": None, "gain_ns_per_step": None, "clear": False,
            "leading_rank": None, "leading_stage": None, "step_ns": None,
            "step_ns_at_median_speed": None, "steps_leading": None, "steps": None,
            "noise_ns": None, "reason": reason}


def bottleneck(parts: pl.DataFrame, per_stage: pl.DataFrame) -> dict[str, Any]:
    """The stage with the most compute per step, its gain (module docstring) and whether it
    is clear; ``rank`` and ``stage`` only when it is."""
    if per_stage.height < 2:
        return _no_bottleneck("fewer than two stages")
    ranked = per_stage.sort("compute_per_step_ns", "rank", descending=[True, False])
    lead = ranked.row(0, named=True)
    median = float(ranked.get_column("compute_per_step_ns").slice(1).median())
    gain = int(round(lead["compute_per_step_ns"] - median))
    step_ns = int(round(float((per_stage.get_column("step_ns")
                               / per_stage.get_column("steps")).median())))
    # per step: who computes most, and the leader's lead over the step's median stage
    stepped = parts.filter(pl.col("step").is_not_null())
    top = stepped.sort("compute_ns", "rank", descending=[True, False]).group_by(
        "step", maintain_order=True).agg(top=pl.col("rank").first(),
                                         median=pl.col("compute_ns").median())
    n_steps = top.height
    leading = int((top.get_column("top") == lead["rank"]).sum()) if n_steps else 0
    others = stepped.filter(pl.col("rank") != lead["rank"])
    jitter = others.with_columns(
        dev=(pl.col("compute_ns") - pl.col("compute_ns").median().over("rank")).abs()) \
        .get_column("dev").median() if others.height else None
    noise = int(round(1.4826 * jitter)) if jitter is not None else 0
    clear = (gain > 0 and gain > BOTTLENECK_NOISE * noise
             and gain >= BOTTLENECK_MIN_SHARE * step_ns
             and (n_steps == 0 or leading >= BOTTLENECK_STEP_SHARE * n_steps))
    reason = (f"stage {lead['stage']} (rank {lead['rank']}) computes the most in {leading} of "
              f"{n_steps} steps, {gain / 1e6:.3f} ms a step above the median stage "
              f"(jitter {noise / 1e6:.3f} ms)")
    return {"rank": lead["rank"] if clear else None, "stage": lead["stage"] if clear else None,
            "gain_ns_per_step": gain, "clear": clear, "leading_rank": lead["rank"],
            "leading_stage": lead["stage"], "step_ns": step_ns,
            "step_ns_at_median_speed": step_ns - max(gain, 0), "steps_leading": leading,
            "steps": n_steps, "noise_ns": noise,
            "reason": reason if clear else f"no clear bottleneck: {reason}"}


def _schedule_of(kind: str | None, *, stages: int | None = None, m: int | None = None,
                 v: int | None = None, measured: float | None = None) -> dict[str, Any]:
    ideal = (stages - 1) / ((v or 1) * m + stages - 1) if kind and stages and m else None
    return {"kind": kind, "stages": stages, "micro_batches": m, "chunks": v,
            "ideal_bubble_fraction": ideal, "bubble_fraction": measured}


def schedule(calls: pl.DataFrame, stages: pl.DataFrame, parts: pl.DataFrame) -> dict[str, Any]:
    """The detected schedule, its micro-batches and ideal bubble fraction against the measured
    one (the bubble over the step time, all stages and steps; module docstring)."""
    p = int(stages.group_by("pipeline").len().get_column("len").max())
    measured = parts.select(pl.col("bubble_ns").sum() / pl.col("step_ns").sum()).item() \
        if parts.get_column("step_ns").sum() else None
    ring = bool(stages.filter(pl.col("stage") == 0).get_column("upstream_rank")
                .is_not_null().any())
    fwd = calls.filter((pl.col("op") == "send") & (pl.col("direction") == "forward"))
    per = fwd.group_by("rank", "step").agg(n=pl.len()).join(
        stages.select("rank", "stage", "pipeline"), on="rank")
    if per.height == 0:
        return _schedule_of(None, stages=p, measured=measured)
    last = per.join(stages.group_by("pipeline").agg(last=pl.col("stage").max()), on="pipeline")
    mid = last.filter(pl.col("stage") != pl.col("last")).get_column("n").median()
    v = None
    if ring:
        wrap = last.filter(pl.col("stage") == pl.col("last")).get_column("n").median() or 0
        m = int(round(mid - wrap)) if mid is not None else None
        v = int(round(mid / m)) if m else None
        kind = "interleaved"
    else:
        m = int(round(mid)) if mid is not None else int(round(per.get_column("n").median()))
        if calls.filter(pl.col("direction") == "backward").height == 0:
            kind = "forward-only"
        else:
            # a stage-step alternates when a forward call comes after a backward one
            order = calls.sort("ts_ns", "end_ns").group_by("rank", "step").agg(
                alternates=((pl.col("direction") == "forward")
                            & (pl.col("direction") == "backward").cum_sum().gt(0)).any())
            per_step = order.group_by("step").agg(pl.col("alternates").any())
            kind = "1F1B" if per_step.get_column("alternates").mean() > 0.5 else "GPipe"
    return _schedule_of(kind, stages=p, m=m, v=v, measured=measured)


__all__ = ["PARTS_SCHEMA", "STAGES_SCHEMA", "STAGE_SCHEMA", "TIMELINE_SCHEMA", "bottleneck",
           "pipeline", "schedule", "stage_order"]
