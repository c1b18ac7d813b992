"""The cross-rank dependency graph behind every verdict: who waited for whom, and whose own
time caused the wait.

Definitions with a worked example: ``docs/metrics.md``, section *Dependency graph and
culprits*. The nodes are **sync points**, one per (matched collective instance, rank) of
:func:`~traceview.analyses.collectives.collective_ranks` (aligned): the rank's *arrival* (when
it was ready) and *release* (when its call ended). Two kinds of edge:

* **program order**: a sync point depends on the rank's previous release, the latest end of
  its sync points at or before its arrival (``prev_instance``, in any process group); the
  stretch between them is the rank's **own time** (``own_ns``): its work and its gaps alike,
  annotated or not (a stall, a slow DataLoader, more compute all land here);
* **cross-rank**: at an instance every member's release depends on the last arrival
  (``last_rank``): ``wait_ns`` = last arrival - own arrival, ``transfer_ns`` = release - last
  arrival.

**Culprit, not victim.** At each instance the last arriver ``L`` leads the second-last ``S``
by ``lateness_ns``. That lead is ``L``'s *own* when ``L``'s own stretch is longer than ``S``'s
by at least half of it; otherwise ``L`` was released late at its previous sync point and only
passes the wait on, and the instance's culprit is that sync point's culprit (followed back
through any number of instances and groups). So the tensor-parallel partner of a slow rank,
late at the data-parallel all-reduce only because it waited for the slow rank, is a victim:
the culprit of its lateness is the slow rank.

The loop runs once per instance (in order of last arrival), never per event.

>>> import polars as pl
>>> rows = pl.DataFrame({  # TP {0,1} and {2,3}, then DP {0,2}: rank 3 stalls 30 before TP
...     "instance": ["tp01", "tp01", "tp23", "tp23", "dp02", "dp02"],
...     "group": ["tp01", "tp01", "tp23", "tp23", "dp02", "dp02"],
...     "rank": [0, 1, 2, 3, 0, 2], "arrival_ns": [10, 11, 10, 40, 14, 43],
...     "end_ns": [12, 12, 41, 41, 45, 45]})
>>> culprits(sync_points(rows)).select("instance", "last_rank", "lateness_ns",
...                                    "culprit_rank", "inherited").rows()
[('tp01', 1, 1, 1, False), ('tp23', 3, 30, 3, False), ('dp02', 2, 29, 3, True)]
"""

from __future__ import annotations

import polars as pl

SYNC_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.String, "group": pl.String, "collective": pl.String, "can_wait": pl.Boolean,
    "role": pl.String, "rank": pl.Int32, "arrival_ns": pl.Int64,
    "end_ns": pl.Int64, "last_arrival_ns": pl.Int64, "last_rank": pl.Int32,
    "wait_ns": pl.Int64, "transfer_ns": pl.Int64, "prev_instance": pl.String,
    "prev_end_ns": pl.Int64, "own_ns": pl.Int64,
}
CULPRIT_SCHEMA: dict[str, pl.DataType] = {
    "instance": pl.String, "group": pl.String, "collective": pl.String,
    "first_ns": pl.Int64, "end_ns": pl.Int64, "last_rank": pl.Int32,
    "second_rank": pl.Int32, "late_from_ns": pl.Int64, "late_to_ns": pl.Int64,
    "lateness_ns": pl.Int64, "own_excess_ns": pl.Int64, "culprit_rank": pl.Int32,  # null: nobody
    "inherited": pl.Boolean, "via": pl.String,
}


def sync_points(collective_rows: pl.DataFrame,
                p2p_rows: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (instance, rank) with ``SYNC_SCHEMA``: arrival, release, the wait and
    transfer of the cross-rank edge, and the program-order edge (``prev_instance``, its end,
    and the rank's own time since it).

    ``p2p_rows``: :func:`~traceview.analyses.p2p.p2p_sync_rows`, point-to-point pairs as
    instances of two: the receiver's release depends on the send's arrival, and a send never
    waits for its receiver (``can_wait`` false)."""
    def columns(frame: pl.DataFrame) -> list[pl.Expr]:
        kind = pl.col("collective") if "collective" in frame.columns else pl.lit(None)
        return [pl.col("instance").cast(pl.String), pl.col("group").cast(pl.String),
                kind.cast(pl.String).alias("collective"), pl.col("rank").cast(pl.Int32),
                pl.col("arrival_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64)]

    parts = [collective_rows.select(*columns(collective_rows), can_wait=pl.lit(True),
                                    role=pl.lit(None, pl.String))] \
        if collective_rows.height else []
    if p2p_rows is not None and p2p_rows.height:
        # a send's role: its direction (down to a higher rank, as a pipeline's forward
        # pass; up, as its backward): the stretch other senders of that role take is what
        # its own stretch is compared with (its receiver does other work meanwhile)
        direction = pl.when(pl.col("instance").str.extract(r"p2p (\d+)->", 1).cast(pl.Int64)
                            < pl.col("instance").str.extract(r"->(\d+)#", 1).cast(pl.Int64)) \
            .then(pl.lit("send down")).otherwise(pl.lit("send up"))
        parts.append(p2p_rows.select(
            *columns(p2p_rows), can_wait=pl.col("collective") != "send",
            role=pl.when(pl.col("collective") == "send").then(direction)))
    if not parts:
        return pl.DataFrame(schema=SYNC_SCHEMA)
    rows = pl.concat(parts)
    over = "instance"
    # what a member waits for: the latest arrival among the others it depends on (all of them
    # at a collective; the sender, at a recv), itself when it arrives last
    rows = rows.with_columns(
        last_arrival_ns=pl.when(pl.col("can_wait")).then(pl.col("arrival_ns").max().over(over))
        .otherwise(pl.col("arrival_ns")),
        last_rank=pl.when(pl.col("can_wait")).then(
            pl.col("rank").sort_by("arrival_ns", "rank").last().over(over))
        .otherwise(pl.col("rank")))
    rows = rows.with_columns(wait_ns=pl.col("last_arrival_ns") - pl.col("arrival_ns"),
                             transfer_ns=pl.col("end_ns") - pl.col("last_arrival_ns"))
    # The release that gated each arrival: the rank's latest end at or before it (its calls
    # in different groups may overlap, so the previous call by start is not always it).
    releases = rows.select("rank", prev_instance="instance", prev_end_ns="end_ns") \
        .sort("prev_end_ns")
    gated = rows.sort("arrival_ns").join_asof(
        releases, left_on="arrival_ns", right_on="prev_end_ns", by="rank",
        strategy="backward", allow_exact_matches=True, check_sortedness=False)
    # an instance is never gated by itself (a zero-length call ends at its arrival)
    own = gated.with_columns(
        pl.when(pl.col("prev_instance") == pl.col("instance")).then(None)
        .otherwise(pl.col("prev_instance")).alias("prev_instance"))
    own = own.with_columns(
        pl.when(pl.col("prev_instance").is_null()).then(None)
        .otherwise(pl.col("prev_end_ns")).alias("prev_end_ns"))
    return own.with_columns(own_ns=pl.col("arrival_ns") - pl.col("prev_end_ns")) \
        .select(list(SYNC_SCHEMA)).cast(SYNC_SCHEMA).sort("arrival_ns", "rank")


def culprits(sync: pl.DataFrame) -> pl.DataFrame:
    """One row per instance of two or more ranks (``CULPRIT_SCHEMA``), in order of last
    arrival: its last and second-last arrivers, the lead between them (``lateness_ns``), the
    last arriver's own excess over the second-last's (``own_excess_ns``), and the rank whose
    own time caused the lead (``culprit_rank``; ``inherited``: passed on by the last arriver,
    ``via``: the instance it was inherited from)."""
    if sync.height == 0:
        return pl.DataFrame(schema=CULPRIT_SCHEMA)
    # the second: the latest arrival among the others that can wait (a send cannot)
    rest = pl.col("can_wait").slice(1)
    ranked = sync.sort("arrival_ns", "rank", descending=[True, True]).group_by(
        "instance", maintain_order=True).agg(
        pl.col("group").first(), pl.col("collective").first(),
        first_ns=pl.col("arrival_ns").min(), end_ns=pl.col("end_ns").max(),
        last_rank=pl.col("rank").first(),
        second_rank=pl.col("rank").slice(1).filter(rest).first(),
        late_to_ns=pl.col("arrival_ns").first(),
        late_from_ns=pl.col("arrival_ns").slice(1).filter(rest).first(),
        second_end=pl.col("end_ns").slice(1).filter(rest).first(),
        last_own=pl.col("own_ns").first(),
        second_own=pl.col("own_ns").slice(1).filter(rest).first(),
        last_prev=pl.col("prev_instance").first(), last_role=pl.col("role").first(),
        n=pl.len()).filter(pl.col("n") >= 2).sort("late_to_ns", "instance")
    # a send's own stretch is compared with the typical stretch of its role's senders
    typical = sync.filter(pl.col("role").is_not_null()).group_by("role").agg(
        role_own=pl.col("own_ns").median().round(0).cast(pl.Int64))
    ranked = ranked.join(typical, left_on="last_role", right_on="role", how="left")
    # nobody waits where no other member can (a recv posted after its send arrived): lateness
    # zero; a waiting member's wait ends at its own release at the latest
    ranked = ranked.with_columns(
        late_from_ns=pl.col("late_from_ns").fill_null(pl.col("late_to_ns")),
        late_to_ns=pl.min_horizontal("late_to_ns", pl.col("second_end").fill_null(
            pl.col("late_to_ns")))).with_columns(
        late_to_ns=pl.max_horizontal("late_to_ns", "late_from_ns")).with_columns(
        lateness_ns=pl.col("late_to_ns") - pl.col("late_from_ns"),
        own_excess_ns=pl.col("last_own") - pl.coalesce("role_own", "second_own"))
    culprit: dict[str, int | None] = {}
    out_culprit, out_inherited, out_via = [], [], []
    for inst, last, lateness, excess, prev in ranked.select(
            "instance", "last_rank", "lateness_ns", "own_excess_ns", "last_prev").iter_rows():
        # Own when the last arriver's own stretch explains at least half of its lead (or
        # nothing can be compared: its first sync point, or a lead of zero). Inherited
        # otherwise, from the culprit of the sync point that released it late; where that
        # has none, nobody's own time made the wait: it is structural (a pipeline's bubble).
        own = excess is None or lateness <= 0 or 2 * excess >= lateness
        who = last if own else culprit.get(prev) if prev is not None else None
        culprit[inst] = who
        out_culprit.append(who)
        out_inherited.append(not own)
        out_via.append(None if own else prev)
    return ranked.with_columns(
        culprit_rank=pl.Series(out_culprit, dtype=pl.Int32),
        inherited=pl.Series(out_inherited, dtype=pl.Boolean),
        via=pl.Series(out_via, dtype=pl.String)).select(list(CULPRIT_SCHEMA)) \
        .cast(CULPRIT_SCHEMA)


__all__ = ["CULPRIT_SCHEMA", "SYNC_SCHEMA", "culprits", "sync_points"]
