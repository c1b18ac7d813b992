"""Collectives across ranks: arrival, wait, skew, transfer time, bandwidth, tails, alpha-beta.

Definitions (with a worked example) are in ``docs/metrics.md``, section *Collectives*. Per
matched instance *k* (see :mod:`traceview.analyses.collective_match`) and rank *r*, on the
aligned timeline (:mod:`traceview.analyses.align`):

* ``arrival_ns`` = aligned start, ``end_ns`` = aligned end, ``dur_ns`` = end - start (own clock);
* ``wait_ns`` = last arrival - own arrival; ``skew_ns`` = last arrival - first arrival;
* ``end_spread_ns`` = last end - first end; ``transfer_ns`` = own end - last arrival;
* ``comm_ns`` = min over ranks of ``dur_ns``: the last arriver waits for nobody, so its duration
  is the transfer time, and it needs no clock alignment;
* ``algbw_gbps`` = bytes / comm_ns (GB/s = bytes/ns); ``busbw_gbps`` = algbw x the nccl-tests
  factor for n ranks: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n;
  broadcast, reduce 1.

>>> from traceview.schema import events_frame
>>> k = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
>>> ev = events_frame([
...     dict(rank=0, file_id=0, source="kineto", kind="kernel", name=k, stream=7, ts_ns=0,
...          dur_ns=1000, bytes=4000, group_size=2),
...     dict(rank=1, file_id=1, source="kineto", kind="kernel", name=k, stream=7, ts_ns=600,
...          dur_ns=400, bytes=4000, group_size=2)])
>>> from traceview.analyses.collective_match import comm_events, match_collectives
>>> match = match_collectives(comm_events(ev))
>>> collectives(match).select("n_ranks", "skew_ns", "last_rank", "comm_ns", "busbw_gbps").row(0)
(2, 600, 1, 400, 10.0)
"""

from __future__ import annotations

import math

import polars as pl

from traceview._dependencies import lazy_module
from traceview.analyses.align import apply_offsets
from traceview.analyses.collective_match import MatchResult
from traceview.analyses.dependency_graph import sync_points
from traceview.analyses.nodes import with_nodes
from traceview.analyses.time_is import label_counts, time_is, wait_share

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")

#: nccl-tests bus-bandwidth factors as functions of the group size n.
BUSBW_FACTORS: dict[str, str] = {
    "all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
    "all_to_all": "(n-1)/n", "broadcast": "1", "reduce": "1",
}


def busbw_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """nccl-tests factor; null for collectives without one (barrier, send/recv, other)."""
    nf = n.cast(pl.Float64)
    return (
        pl.when(collective == "all_reduce").then(2.0 * (nf - 1.0) / nf)
        .when(collective.is_in(["all_gather", "reduce_scatter", "all_to_all"]))
        .then((nf - 1.0) / nf)
        .when(collective.is_in(["broadcast", "reduce"])).then(pl.lit(1.0))
        .otherwise(None)
    )


def collective_ranks(match: MatchResult, *, offsets: pl.DataFrame | None = None,
                     nodes: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (instance, rank) of ``match`` (``match_collectives``) with the per-rank
    metrics of the module docstring.

    ``offsets`` from :func:`traceview.analyses.align.estimate_offsets` (None: raw clocks).
    Also carries instance-level columns (``skew_ns``, ``last_rank``, ``n_ranks`` ...), and
    ``uncertainty_ns``: the largest alignment uncertainty among the instance's ranks.
    ``nodes``: :func:`traceview.analyses.nodes.rank_nodes` (None: unknown), for ``node``,
    the instance's ``node_span`` and ``locality``.
    """
    inst = match.instances
    inst = inst.filter(pl.col("rank").n_unique().over("instance") >= 2)
    if offsets is not None and offsets.height:
        al = apply_offsets(inst, offsets).collect()
        unc = offsets.select(pl.col("rank").cast(pl.Int32),
                             unc=pl.col("uncertainty_ns").fill_null(0))
        al = al.join(unc, on="rank", how="left").with_columns(pl.col("unc").fill_null(0))
    else:
        al = inst.with_columns(ts_aligned_ns=pl.col("ts_ns"), unc=pl.lit(0, pl.Int64))
    over = "instance"
    al = al.with_columns(
        arrival_ns=pl.col("ts_aligned_ns"),
        end_ns=pl.col("ts_aligned_ns") + pl.col("dur_ns"),
    )
    last_arr = pl.col("arrival_ns").max().over(over)
    n = pl.col("rank").n_unique().over(over).cast(pl.Int32)
    size = pl.coalesce(pl.col("group_size").max().over(over), n)
    out = al.with_columns(
        n_ranks=n,
        group_size_used=size.cast(pl.Int32),
        first_arrival_ns=pl.col("arrival_ns").min().over(over),
        last_arrival_ns=last_arr,
        wait_ns=last_arr - pl.col("arrival_ns"),
        skew_ns=last_arr - pl.col("arrival_ns").min().over(over),
        end_spread_ns=pl.col("end_ns").max().over(over) - pl.col("end_ns").min().over(over),
        transfer_ns=pl.col("end_ns") - last_arr,
        comm_ns=pl.col("dur_ns").min().over(over),
        bytes=pl.col("bytes").max().over(over),
        last_rank=pl.col("rank").sort_by("arrival_ns", "rank").last().over(over),
        first_rank=pl.col("rank").sort_by("arrival_ns", "rank").first().over(over),
        uncertainty_ns=pl.col("unc").max().over(over),
    )
    algbw = pl.when(pl.col("comm_ns") > 0).then(
        pl.col("bytes").cast(pl.Float64) / pl.col("comm_ns")).otherwise(None)
    out = out.with_columns(algbw_gbps=algbw).with_columns(
        busbw_gbps=pl.col("algbw_gbps") * busbw_factor(pl.col("collective"),
                                                       pl.col("group_size_used")))
    out = with_nodes(out, nodes)
    return out.select(
        "instance", "group", "position", "collective", "name", "rank", "side", "match",
        "arrival_ns", "end_ns", "dur_ns", "wait_ns", "transfer_ns", "n_ranks",
        "group_size_used", "first_arrival_ns", "last_arrival_ns", "skew_ns", "end_spread_ns",
        "comm_ns", "bytes", "algbw_gbps", "busbw_gbps", "last_rank", "first_rank",
        "uncertainty_ns", "node", "node_span", "locality",
    ).sort("first_arrival_ns", "instance", "rank")


def collectives(match: MatchResult, *, offsets: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per matched instance: group, seq, name, n_ranks, bytes, skew_ns, last_rank, ...

    ``seq`` is the sequence number when the trace has one, else the position in the group.
    ``skew_resolved`` is false when the skew is within twice the alignment uncertainty: the
    arrival order is then not established by the data. ``time_is``: what the instance's time
    is made of (:mod:`traceview.analyses.time_is`).
    """
    return instances(collective_ranks(match, offsets=offsets))


def instances(per: pl.DataFrame) -> pl.DataFrame:
    """One row per instance from :func:`collective_ranks` rows."""
    if "locality" not in per.columns:  # rows drawn without nodes
        per = with_nodes(per, None)
    # each member's previous release on the graph (program order): how much of the last
    # arriver's lateness it spent still held in an earlier collective
    gate = sync_points(per).select("instance", "rank", "prev_end_ns") if per.height else \
        pl.DataFrame(schema={"instance": pl.String, "rank": pl.Int32, "prev_end_ns": pl.Int64})
    per = per.join(gate, on=["instance", "rank"], how="left")
    return (
        per.group_by("instance", maintain_order=True)
        .agg(
            group=pl.col("group").first(), seq=pl.col("position").first(),
            name=pl.col("collective").first(), kernel=pl.col("name").first(),
            match=pl.col("match").first(), side=pl.col("side").first(),
            n_ranks=pl.col("n_ranks").first(), group_size=pl.col("group_size_used").first(),
            bytes=pl.col("bytes").first(),
            first_arrival_ns=pl.col("first_arrival_ns").first(),
            last_arrival_ns=pl.col("last_arrival_ns").first(),
            skew_ns=pl.col("skew_ns").first(), end_spread_ns=pl.col("end_spread_ns").first(),
            transfer_ns=pl.col("transfer_ns").median().round(0).cast(pl.Int64),
            dur_max_ns=pl.col("dur_ns").max(), comm_ns=pl.col("comm_ns").first(),
            algbw_gbps=pl.col("algbw_gbps").first(), busbw_gbps=pl.col("busbw_gbps").first(),
            last_rank=pl.col("last_rank").first(), first_rank=pl.col("first_rank").first(),
            uncertainty_ns=pl.col("uncertainty_ns").first(),
            node_span=pl.col("node_span").first(), locality=pl.col("locality").first(),
            _held_until=pl.col("prev_end_ns").sort_by("arrival_ns", "rank").last(),
        )
        .with_columns(own_spread_ns=own_spread(pl.col("first_arrival_ns"),
                                               pl.col("last_arrival_ns"), pl.col("_held_until")))
        .drop("_held_until")
        .with_columns(skew_resolved=pl.col("skew_ns") > 2 * pl.col("uncertainty_ns"),
                      time_is=time_is(pl.col("own_spread_ns"), pl.col("comm_ns"),
                                      pl.col("uncertainty_ns")),
                      wait_share=wait_share(pl.col("own_spread_ns"), pl.col("comm_ns")))
    )


def own_spread(first: pl.Expr, last: pl.Expr, held_until: pl.Expr) -> pl.Expr:
    """The arrival spread the last arriver's own time made: last arrival minus the later of
    the first arrival and the last arriver's previous release (null: it had none, the whole
    spread). A rank let go last by the previous collective arrives last without being slow:
    that part of the spread is the previous collective's staggered release, not skew."""
    start = pl.max_horizontal(first, held_until.fill_null(first))
    return (last - start).clip(0)


def size_bucket(bytes_: pl.Expr) -> pl.Expr:
    """Power-of-two size bucket label, e.g. ``[64 KiB, 128 KiB)``; ``unknown`` when null."""
    lo = (2.0 ** bytes_.cast(pl.Float64).clip(1.0).log(2).floor()).cast(pl.Int64)

    def label(e: pl.Expr) -> pl.Expr:
        return (
            pl.when(e >= 1 << 30).then((e // (1 << 30)).cast(pl.String) + " GiB")
            .when(e >= 1 << 20).then((e // (1 << 20)).cast(pl.String) + " MiB")
            .when(e >= 1 << 10).then((e // (1 << 10)).cast(pl.String) + " KiB")
            .otherwise(e.cast(pl.String) + " B")
        )

    return pl.when(bytes_.is_null()).then(pl.lit("unknown")).otherwise(
        pl.lit("[") + label(lo) + pl.lit(", ") + label(lo * 2) + pl.lit(")"))


SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "name": pl.String, "size_bucket": pl.String, "instances": pl.UInt32,
    "samples": pl.UInt32, "p50_ns": pl.Float64, "p90_ns": pl.Float64, "p99_ns": pl.Float64,
    "tail_ratio": pl.Float64, "comm_p50_ns": pl.Float64, "skew_p50_ns": pl.Float64,
    "busbw_p50_gbps": pl.Float64, "group": pl.String, "locality": pl.String,
    "node_span": pl.Int32, "uncertainty_p50_ns": pl.Float64, "own_spread_p50_ns": pl.Float64,
    "time_is": pl.String,
    "wait_share": pl.Float64, "time_is_transfer": pl.Int64, "time_is_skew": pl.Int64,
    "time_is_mixed": pl.Int64, "time_is_inconclusive": pl.Int64,
}


def collective_summary(per_rank: pl.DataFrame) -> pl.DataFrame:
    """Per (process group, collective, size bucket, locality): count, p50/p90/p99 of per-rank
    duration, tail ratio, and what the time is.

    Takes :func:`collective_ranks` output. ``tail_ratio`` = p99 / p50 of ``dur_ns``;
    ``comm_p50_ns`` is the median of the instances' ``comm_ns`` (clock-free transfer time).
    Percentiles use linear interpolation. ``time_is`` labels the row's medians (own spread
    ``own_spread_p50_ns`` against transfer ``comm_p50_ns``, clocks ``uncertainty_p50_ns``)
    by the instances' rule; ``time_is_<label>`` count its instances by their own label.
    ``node_span``: the most nodes one of its instances spans; ``locality``: intra- or
    inter-node (rows are split by it, so bandwidths of the two never mix).
    """
    if per_rank.height == 0:
        return pl.DataFrame(schema=SUMMARY_SCHEMA)
    inst = instances(per_rank).select(
        "instance", "group", "name", "bytes", "comm_ns", "uncertainty_ns", "node_span",
        "locality", "time_is", "own_spread_ns", busbw="busbw_gbps", skew="skew_ns")
    inst = inst.with_columns(size_bucket=size_bucket(pl.col("bytes")),
                             _lo=pl.col("bytes").fill_null(-1))
    keys = ["group", "name", "size_bucket", "locality"]
    per = per_rank.drop("group", "locality", "name").rename({"collective": "name"}).join(
        inst.select("instance", "group", "size_bucket", "locality", "_lo"), on="instance")
    q = pl.col("dur_ns").cast(pl.Float64)
    durs = per.group_by(keys).agg(
        samples=pl.len(), min_bytes=pl.col("_lo").min(),
        p50_ns=q.quantile(0.5, "linear"), p90_ns=q.quantile(0.9, "linear"),
        p99_ns=q.quantile(0.99, "linear"))
    per_inst = inst.group_by(keys).agg(
        instances=pl.len(), comm_p50_ns=pl.col("comm_ns").cast(pl.Float64).median(),
        skew_p50_ns=pl.col("skew").cast(pl.Float64).median(),
        own_spread_p50_ns=pl.col("own_spread_ns").cast(pl.Float64).median(),
        busbw_p50_gbps=pl.col("busbw").median(),
        uncertainty_p50_ns=pl.col("uncertainty_ns").cast(pl.Float64).median(),
        node_span=pl.col("node_span").max(), *label_counts(pl.col("time_is")))
    return (
        per_inst.join(durs, on=keys)
        .with_columns(tail_ratio=pl.col("p99_ns") / pl.col("p50_ns"),
                      time_is=time_is(pl.col("own_spread_p50_ns"), pl.col("comm_p50_ns"),
                                      pl.col("uncertainty_p50_ns")),
                      wait_share=wait_share(pl.col("own_spread_p50_ns"),
                                            pl.col("comm_p50_ns")))
        .sort("group", "name", "min_bytes", "locality").drop("min_bytes")
        .select("name", "size_bucket", "instances", "samples", "p50_ns", "p90_ns", "p99_ns",
                "tail_ratio", "comm_p50_ns", "skew_p50_ns", "busbw_p50_gbps", "group",
                "locality", "node_span", "uncertainty_p50_ns", "own_spread_p50_ns", "time_is",
                "wait_share",
                "time_is_transfer", "time_is_skew", "time_is_mixed", "time_is_inconclusive")
    )


#: Above this relative RMS error the α–β line does not describe the times (docs/metrics.md):
#: a quarter off on a typical call is more scatter than model, so no α or β is offered as one.
MAX_FIT_REL_RMS = 0.25


def alpha_beta(instances: pl.DataFrame, *, time_col: str = "comm_ns") -> pl.DataFrame:
    """Latency-bandwidth fit ``t = alpha + bytes / beta`` per collective and locality (intra-
    or inter-node: two links, two lines), in relative terms.

    Minimises sum(((alpha + bytes/beta) - t) / t)^2 so a 1 KiB message counts as much as a
    1 GiB one. Needs >= 3 instances with >= 2 distinct sizes. ``rel_rms_error`` is the fit's
    root-mean-square relative error; a negative alpha is refitted with alpha = 0, a
    non-positive slope leaves ``beta_gbps`` null (no size dependence in the data).
    ``meaningful``: the error is at most ``MAX_FIT_REL_RMS`` (null without a fit); a fit above
    it is kept for the record but is no model of the times. Takes :func:`collectives` output.
    """
    schema = {"name": pl.String, "instances": pl.Int64, "sizes": pl.Int64,
              "alpha_ns": pl.Float64, "beta_gbps": pl.Float64, "rel_rms_error": pl.Float64,
              "note": pl.String, "meaningful": pl.Boolean, "locality": pl.String}
    rows = []
    usable = instances.filter(pl.col("bytes").is_not_null() & (pl.col(time_col) > 0))
    if "locality" not in usable.columns:
        usable = usable.with_columns(locality=pl.lit("unknown"))
    for (name, locality), g in usable.group_by("name", "locality", maintain_order=True):
        x = g.get_column("bytes").cast(pl.Float64).to_numpy()
        t = g.get_column(time_col).cast(pl.Float64).to_numpy()
        sizes = int(np.unique(x).size)
        if len(t) < 3 or sizes < 2:
            rows.append({"name": name, "instances": len(t), "sizes": sizes, "alpha_ns": None,
                         "beta_gbps": None, "rel_rms_error": None,
                         "note": "needs >= 3 instances and >= 2 sizes", "meaningful": None,
                         "locality": locality})
            continue
        a = np.column_stack([1.0 / t, x / t])
        (alpha, slope), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        note = ""
        if alpha < 0:
            slope = float(np.sum(x / t) / np.sum((x / t) ** 2))
            alpha, note = 0.0, "alpha < 0 refitted with alpha = 0"
        if slope <= 0:
            alpha = float(np.sum(1 / t) / np.sum((1 / t) ** 2))
            slope, note = 0.0, "no size dependence: beta undetermined"
        rel = (alpha + slope * x - t) / t
        rms = float(math.sqrt(float(np.mean(rel**2))))
        if rms > MAX_FIT_REL_RMS:
            note = "; ".join(filter(None, [note, f"relative RMS error above "
                                           f"{MAX_FIT_REL_RMS:.0%}: not a meaningful fit"]))
        rows.append({"name": name, "instances": len(t), "sizes": sizes,
                     "alpha_ns": float(alpha),
                     "beta_gbps": (1.0 / slope) if slope > 0 else None,
                     "rel_rms_error": rms, "note": note, "meaningful": rms <= MAX_FIT_REL_RMS,
                     "locality": locality})
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
