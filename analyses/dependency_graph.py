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
by ``lateness_ns``. The lead is followed back along ``L``'s own timeline: the *excess* of each
own stretch (over what the others take for the same stretch) is ``L``'s own; each wait at an
earlier sync point passes on to that point's causes, in their proportions, through any
number of instances and groups; what is left when the timeline runs out is nobody's (a
structural wait, such as a pipeline's bubble). The culprit is the rank with at least half of
the lead. So the tensor-parallel partner of a slow rank, late at the data-parallel all-reduce
only because it waited for the slow rank, is a victim: the culprit is the slow rank.

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
            role=pl.when(pl.col("collective") == "send").then(direction)
            .otherwise(direction.str.replace("send", "recv"))))
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
    last arriver's own excess (``own_excess_ns``), and the rank whose own time caused most of
    the lead (``culprit_rank``, null when nobody's own time caused half of it: a structural
    wait such as a pipeline's bubble; ``inherited``: the last arriver only passed it on,
    ``via``: the instance it came through)."""
    if sync.height == 0:
        return pl.DataFrame(schema=CULPRIT_SCHEMA)
    rows = _with_excess(sync)
    # the second: the latest arrival among the others that can wait (a send cannot)
    rest = pl.col("can_wait").slice(1)
    ranked = rows.sort("arrival_ns", "rank", descending=[True, True]).group_by(
        "instance", maintain_order=True).agg(
        pl.col("group").first(), pl.col("collective").first(),
        first_ns=pl.col("arrival_ns").min(), end_ns=pl.col("end_ns").max(),
        last_rank=pl.col("rank").first(),
        second_rank=pl.col("rank").slice(1).filter(rest).first(),
        late_to_ns=pl.col("arrival_ns").first(),
        late_from_ns=pl.col("arrival_ns").slice(1).filter(rest).first(),
        second_end=pl.col("end_ns").slice(1).filter(rest).first(),
        own_excess_ns=pl.col("excess_ns").first(),
        n=pl.len()).filter(pl.col("n") >= 2).sort("late_to_ns", "instance")
    # nobody waits where no other member can (a recv posted after its send arrived): lateness
    # zero; a waiting member's wait ends at its own release at the latest
    ranked = ranked.with_columns(
        late_from_ns=pl.col("late_from_ns").fill_null(pl.col("late_to_ns")),
        late_to_ns=pl.min_horizontal("late_to_ns", pl.col("second_end").fill_null(
            pl.col("late_to_ns")))).with_columns(
        late_to_ns=pl.max_horizontal("late_to_ns", "late_from_ns")).with_columns(
        lateness_ns=pl.col("late_to_ns") - pl.col("late_from_ns"))
    node = {(i, r): (prev, excess, wait) for i, r, prev, excess, wait in rows.select(
        "instance", "rank", "prev_instance", "excess_ns", "held_ns").iter_rows()}
    blame: dict[str, dict[int, float]] = {}
    out_culprit, out_inherited, out_via = [], [], []
    for inst, last, lateness in ranked.select("instance", "last_rank", "lateness_ns") \
            .iter_rows():
        shares = _blame(inst, last, lateness, node, blame)
        blame[inst] = shares
        who = max(shares, key=lambda r: (shares[r], -r)) if shares else None
        if who is not None and 2 * shares[who] < lateness:
            who = None  # nobody's own time made most of it
        out_culprit.append(who)
        out_inherited.append(who != last)
        out_via.append(None if who == last else node[(inst, last)][0])
    return ranked.with_columns(
        culprit_rank=pl.Series(out_culprit, dtype=pl.Int32),
        inherited=pl.Series(out_inherited, dtype=pl.Boolean),
        via=pl.Series(out_via, dtype=pl.String)).select(list(CULPRIT_SCHEMA)) \
        .cast(CULPRIT_SCHEMA)


#: How far back a lead is followed along the last arriver's timeline (sync points).
MAX_HOPS = 64


def _blame(inst: str, last: int, lateness: int, node: dict, blame: dict) -> dict[int, float]:
    """Who caused ``lateness`` at ``inst``: walking back along the last arriver's own timeline,
    each own stretch's excess is its own, each wait at an earlier sync point is passed to
    that point's causes (in their proportions), until the lead is used up; what is left was
    nobody's (structural). The last arriver's first sync point, with nothing to compare its
    own time with, keeps the rest of the lead."""
    shares: dict[int, float] = {}
    left = float(lateness)
    at = inst
    for hop in range(MAX_HOPS):
        if left <= 0:
            break
        prev, excess, _ = node[(at, last)]
        own = left if excess is None and hop == 0 and prev is None else max(excess or 0, 0)
        take = min(left, own)
        if take > 0:
            shares[last] = shares.get(last, 0.0) + take
            left -= take
        if left <= 0 or prev is None or (prev, last) not in node:
            break
        waited = min(left, max(node[(prev, last)][2] or 0, 0))
        causes = blame.get(prev) or {}
        total = sum(causes.values())
        if waited > 0 and total > 0:
            for rank, part in causes.items():
                shares[rank] = shares.get(rank, 0.0) + waited * part / total
        left -= waited
        at = prev
    return shares


def _with_excess(sync: pl.DataFrame) -> pl.DataFrame:
    """``sync`` with ``excess_ns``, each own stretch against what others take for the same
    stretch: at a collective, the mean of the other members' own time; for a send or recv,
    the median of its role's (direction and side) over the window, since its partner does
    other work meanwhile; and ``held_ns``: how long the call waited for others (its wait, up
    to its own end)."""
    n = pl.col("own_ns").count().over("instance")
    others = (pl.col("own_ns").sum().over("instance") - pl.col("own_ns")) / (n - 1)
    typical = pl.col("own_ns").median().over("role")
    return sync.with_columns(
        excess_ns=(pl.col("own_ns") - pl.when(pl.col("role").is_not_null()).then(typical)
                   .otherwise(pl.when(n > 1).then(others))).round(0).cast(pl.Int64),
        held_ns=pl.when(pl.col("can_wait")).then(
            (pl.min_horizontal("last_arrival_ns", "end_ns") - pl.col("arrival_ns")).clip(0))
        .otherwise(0))


__all__ = ["CULPRIT_SCHEMA", "SYNC_SCHEMA", "culprits", "sync_points"]
