"""Why a job hung, from flight-recorder dumps: per process group, where each rank stopped.

Definitions and what gloo dumps can and cannot say: ``docs/metrics.md``, section *Hangs from
flight-recorder dumps*. Tables from :mod:`traceview.parsers.flight_recorder`. Per group and
member rank:

* ``last_enqueued``: the highest collective sequence number the rank called (its entries, or
  ``pg_status``); ``last_completed``: the highest it finished (``pg_status``, else entries
  whose state is ``completed``); ``last_started`` likewise (null when nothing says);
* ``completed_by_all``: the last collective every member finished (the minimum);
* the **stuck** collective, first rule that applies:

  1. *lagging*: some members never called a collective that others did: the stuck sequence
     number is the first one a member did not call; the culprits are the members that never
     called it (``never started``);
  2. *mismatch*: members called different ops, or the same op on different sizes, at one
     sequence number (a desynchronised job): the culprits are the minority (all of them
     on a tie);
  3. *missing dumps*: a member wrote no dump: it is the suspect (it exited, or died before
     dumping), the stuck collective the last one the others called (low confidence);
  4. *states* (NCCL, whose entries move from ``scheduled`` to ``started`` to
     ``completed``): at the last collective, members still ``scheduled`` while others
     started never started it (culprits); when all started and none completed, the group
     is stuck with no culprit (the network or the library, not one rank).

  5. *point-to-point* (NCCL: gloo records no send or recv): between two members, the
     sends one posted to the other and the receives the other posted from it differ in
     number: the side with fewer never posted its half (culprit, confidence medium; counted
     over the entries both ranks' buffers still hold). Its seq is ``stuck_p2p_seq``.

  Otherwise the group is consistent.

>>> import polars as pl
>>> from traceview.parsers.flight_recorder import ENTRY_SCHEMA, STATUS_SCHEMA, CONFIG_SCHEMA
>>> e = pl.DataFrame([dict(rank=r, group="1", seq=s, op="all_reduce", sizes="[[4]]",
...                        state="scheduled", is_p2p=False)
...                   for r in (0, 1, 2) for s in (1, 2, 3) if not (r == 1 and s == 3)],
...                  schema_overrides={k: v for k, v in ENTRY_SCHEMA.items()
...                                    if k in ("rank", "seq")})
>>> found = hang(e, pl.DataFrame(schema=STATUS_SCHEMA), pl.DataFrame(schema=CONFIG_SCHEMA),
...              dumped=[0, 1, 2])
>>> found["culprit_ranks"], found["stuck_seq"], found["groups"][0]["waiting"][0]["op"]
([1], 3, 'all_reduce')
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceview.analyses.nodes import ranks_text as _ranks
from traceview.parsers.flight_recorder import ENTRY_SCHEMA

#: Ops whose per-rank sizes may differ by design (uneven splits): only the op is compared.
UNEVEN_SIZES: tuple[str, ...] = ("all_to_all", "alltoall", "alltoall_base", "all_to_all_single",
                                 "gather", "scatter", "all_gatherv", "reduce_scatterv")


def hang(entries: pl.DataFrame, status: pl.DataFrame, config: pl.DataFrame, *,
         dumped: list[int], world_size: int | None = None) -> dict[str, Any]:
    """The verdict over every dump's tables: ``culprit_ranks``, ``stuck_seq``,
    ``missing_dumps``, ``mismatches`` (``seq``, ``ranks``, ``ops``, ``group``, ``sizes``),
    ``groups`` (one dict per process group, with its evidence) and ``notes``."""
    dumped = sorted(set(dumped))
    entries = entries.with_columns(pl.lit(None, t).alias(k) for k, t in ENTRY_SCHEMA.items()
                                   if k not in entries.columns)  # older dumps lack some
    configured = sorted({r for rs in config.get_column("ranks").to_list() for r in rs}) \
        if config.height else []
    world = world_size or (max([*dumped, *configured, -1]) + 1)
    missing = sorted(set(range(world)) - set(dumped))
    coll = entries.filter(~pl.col("is_p2p").fill_null(False) & pl.col("seq").is_not_null()
                          & pl.col("group").is_not_null())
    p2p = entries.filter(pl.col("is_p2p").fill_null(False) & pl.col("group").is_not_null()
                         & pl.col("op").is_in(["send", "recv"]))
    notes = []
    states = set(coll.get_column("state").drop_nulls().unique().to_list())
    if coll.height and states <= {"scheduled"}:
        notes.append("every entry is 'scheduled' (gloo records no start or completion in "
                      "its entries): ranks are compared by the collectives they called "
                      "(sequence numbers) and pg_status' last completed one, which on gloo "
                      "counts a call that failed or timed out as completed; whether a rank "
                      "that called the stuck collective was still inside it cannot be told; "
                      "and gloo records no send or recv, so a point-to-point hang is not in "
                      "these dumps")
    mismatches = _mismatches(coll)
    groups = []
    for group in sorted({*coll.get_column("group").unique().to_list(),
                         *p2p.get_column("group").unique().to_list()}):
        g = coll.filter(pl.col("group") == group)
        members, members_from = _members(group, entries.filter(pl.col("group") == group),
                                         config, dumped, world)
        found = _group(group, g, status.filter(pl.col("group") == group), members,
                       [m for m in missing if m in members],
                       [m for m in mismatches if m["group"] == group])
        found["members_from"] = members_from
        if members_from == "entries" and missing:
            found["reason"] += (f" (members as far as the dumps show: the group's ranks are "
                                f"not recorded, and {_ranks(missing)} wrote no dump)")
        if found["stuck_seq"] is None:
            _p2p_verdict(found, p2p.filter(pl.col("group") == group), members)
        groups.append(found)
    stuck = [g for g in groups if g["stuck_seq"] is not None]
    # the root: the stuck collective created first (the others waited behind it)
    stuck.sort(key=lambda g: (g["stuck_created_ns"] is None, g["stuck_created_ns"] or 0,
                              g["group"]))
    culprits = sorted({r for g in groups for r in g["culprits"]})
    return {"culprit_ranks": culprits, "stuck_seq": stuck[0]["stuck_seq"] if stuck else None,
            "missing_dumps": missing,
            "mismatches": [{k: m[k] for k in ("seq", "ranks", "ops", "group", "sizes")}
                           for m in mismatches],
            "groups": groups, "stuck_group": stuck[0]["group"] if stuck else None, "world_size": world, "dumped_ranks": dumped, "notes": notes,
            "consistent": not culprits and not stuck and not missing and not mismatches}


def _members(group: str, g: pl.DataFrame, config: pl.DataFrame, dumped: list[int],
             world: int) -> tuple[list[int], str]:
    """The group's ranks and where they come from: its ``pg_config`` where a dump names them;
    else every rank of the world when every dump has the group's entries (a world group, or
    one whose membership gloo did not record); else the dumped ranks that have its
    entries."""
    named = config.filter(pl.col("group") == group)
    if named.height:
        return sorted({r for rs in named.get_column("ranks").to_list() for r in rs}), \
            "pg_config"
    having = sorted(set(g.get_column("rank").to_list()))
    return (list(range(world)), "every dump") if having == dumped else (having, "entries")


def _p2p_verdict(found: dict[str, Any], p2p: pl.DataFrame, members: list[int]) -> None:
    """Rule 5 on ``found`` (a group with no stuck collective): sends and receives between
    two members that differ in number. Group-local ranks in the entries' names are mapped to
    global ones through the sorted members."""
    if p2p.height == 0:
        return
    index = pl.DataFrame({"local": list(range(len(members))), "global": members},
                         schema={"local": pl.Int32, "global": pl.Int32})
    calls = p2p.filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null()) \
        .join(index.rename({"local": "src", "global": "src_rank"}), on="src", how="left") \
        .join(index.rename({"local": "dst", "global": "dst_rank"}), on="dst", how="left")
    # both ends' buffers must still hold a call: from the later of the two first entries
    first = p2p.group_by("rank").agg(since=pl.col("time_created_ns").min())
    calls = calls.join(first.rename({"rank": "src_rank", "since": "s_since"}), on="src_rank",
                       how="left").join(first.rename({"rank": "dst_rank", "since": "d_since"}),
                                        on="dst_rank", how="left")
    calls = calls.filter(pl.col("time_created_ns").is_null()
                         | (pl.col("time_created_ns") >= pl.max_horizontal("s_since",
                                                                           "d_since")))
    counts = calls.group_by("src_rank", "dst_rank").agg(
        sends=(pl.col("op") == "send").sum(), recvs=(pl.col("op") == "recv").sum())
    odd = counts.filter(pl.col("sends") != pl.col("recvs")).sort("src_rank", "dst_rank")
    if odd.height == 0:
        return
    culprits, reasons, waiting = set(), [], []
    for src, dst, sends, recvs in odd.select("src_rank", "dst_rank", "sends", "recvs").rows():
        short, other, missing = (dst, src, "receive") if sends > recvs else (src, dst, "send")
        culprits.add(short)
        reasons.append(f"rank {short} never posted the {missing} matching rank {other}'s "
                       f"({sends} send(s) {src}->{dst}, {recvs} receive(s))")
        last = calls.filter((pl.col("rank") == other) & (pl.col("src_rank") == src)
                            & (pl.col("dst_rank") == dst)).sort("record_id").tail(1)
        waiting += [{"rank": r["rank"], "op": r["op"], "sizes": r["sizes"], "seq": None,
                     "p2p_seq": r["p2p_seq"], "state": r["state"], "frame": r["frame"]}
                    for r in last.iter_rows(named=True)]
    found.update(culprits=sorted(culprits), rule="p2p", confidence="medium",
                 reason="; ".join(reasons), waiting=waiting,
                 stuck_p2p_seq=min((w["p2p_seq"] for w in waiting
                                    if w["p2p_seq"] is not None), default=None))


def _mismatches(coll: pl.DataFrame) -> list[dict[str, Any]]:
    """Sequence numbers at which the ranks' calls differ in op, or in input sizes (except
    ops whose sizes may differ by design)."""
    if coll.height == 0:
        return []
    key = pl.when(pl.col("op").is_in(list(UNEVEN_SIZES))).then(pl.col("op")) \
        .otherwise(pl.col("op") + pl.lit(" ") + pl.col("sizes").fill_null("?"))
    calls = coll.sort("rank", "record_id").unique(["group", "seq", "rank"], keep="last") \
        .with_columns(call=key)
    bad = calls.group_by("group", "seq").agg(
        n=pl.col("call").n_unique(), ranks=pl.col("rank").sort(),
        ops=pl.col("op").sort_by("rank"), sizes=pl.col("sizes").sort_by("rank"),
        calls=pl.col("call").sort_by("rank"),
        created=pl.col("time_created_ns").min()).filter(pl.col("n") > 1).sort("group", "seq")
    return bad.drop("n").to_dicts()


def _last(g: pl.DataFrame, status: pl.DataFrame, members: list[int]) -> pl.DataFrame:
    """Per member with a dump: last enqueued, started, completed sequence numbers."""
    seen = g.group_by("rank").agg(
        enq=pl.col("seq").max(),
        started=pl.col("seq").filter(pl.col("state").is_in(["started", "completed"])).max(),
        completed=pl.col("seq").filter(pl.col("state") == "completed").max())
    st = status.select("rank", s_enq="last_enqueued",
                       s_started=pl.when(pl.col("last_started") >= 0).then("last_started"),
                       s_completed=pl.when(pl.col("last_completed") >= 0)
                       .then("last_completed"))
    return (pl.DataFrame({"rank": members}, schema={"rank": pl.Int32})
            .join(seen, on="rank", how="left").join(st, on="rank", how="left")
            .select("rank",
                    last_enqueued=pl.max_horizontal("enq", "s_enq"),
                    last_started=pl.max_horizontal("started", "s_started"),
                    last_completed=pl.max_horizontal("completed", "s_completed")))


def _group(group: str, g: pl.DataFrame, status: pl.DataFrame, members: list[int],
           missing: list[int], mismatches: list[dict[str, Any]]) -> dict[str, Any]:
    dumped = [m for m in members if m not in missing]
    last = _last(g, status, dumped)
    last = last.with_columns(pl.col("last_enqueued").fill_null(0))
    enq = dict(last.select("rank", "last_enqueued").iter_rows())
    done = [v for v in last.get_column("last_completed").to_list()]
    by_all = None if not done or any(v is None for v in done) else min(done)
    desc = g.get_column("group_desc").drop_nulls().first() if g.height else None
    culprits: set[int] = set()
    stuck, rule, confidence = None, None, None
    reasons = []
    top, low = max(enq.values(), default=0), min(enq.values(), default=0)
    if top > low:  # 1. lagging
        stuck = low + 1
        lag = sorted(r for r, v in enq.items() if v < stuck)
        culprits |= set(lag)
        rule, confidence = "lagging", "high"
        reasons.append(f"{_ranks(lag)} never called collective #{stuck} "
                       f"(their last: #{low}); the others did")
        ahead = sorted(r for r, v in enq.items() if v >= stuck)
        if len(ahead) < len(lag):  # the few ahead may have called one the others never do
            confidence = "medium"
            reasons.append(f"or {_ranks(ahead)} called a collective the others never call "
                           f"(they are fewer): check #{stuck} on {_ranks(ahead)}")
    if mismatches:  # 2. desynchronised
        m = mismatches[0]
        counts: dict[str, int] = {}
        for c in m["calls"]:
            counts[c] = counts.get(c, 0) + 1
        most = max(counts.values())
        major = [c for c, n in counts.items() if n == most]
        odd = [r for r, c in zip(m["ranks"], m["calls"], strict=True)
               if len(major) > 1 or c != major[0]]
        culprits |= set(odd)
        stuck = m["seq"] if stuck is None else min(stuck, m["seq"])
        rule = rule or "mismatch"
        confidence = confidence or ("high" if len(major) == 1 else "low")
        reasons.append(f"at collective #{m['seq']} {_ranks(odd)} called "
                       f"{', '.join(sorted({c for r, c in zip(m['ranks'], m['calls'], strict=True) if r in odd}))}"
                       f" while the others called {' / '.join(major) if len(major) == 1 else 'other ops'}")
    if stuck is None and missing:  # 3. missing dumps
        culprits |= set(missing)
        stuck = top if top else None
        rule, confidence = "missing_dump", "low"
        reasons.append(f"{_ranks(missing)} wrote no dump (exited, or died before "
                       f"dumping); the others last called collective #{top}")
    if stuck is None and top:  # 4. states (NCCL)
        at = g.filter(pl.col("seq") == top).unique("rank", keep="last")
        state = dict(at.select("rank", "state").iter_rows())
        moved = [r for r, s in state.items() if s in ("started", "completed")]
        waiting = sorted(r for r, s in state.items() if s == "scheduled")
        finished = [r for r, s in state.items() if s == "completed"]
        if moved and waiting:
            culprits |= set(waiting)
            stuck, rule, confidence = top, "not_started", "high"
            reasons.append(f"{_ranks(waiting)} never started collective #{top}; "
                           f"the others did")
        elif moved and not finished and len(state) == len(dumped):
            stuck, rule, confidence = top, "all_inside", "medium"
            reasons.append(f"every rank started collective #{top} and none completed it: "
                           f"not one rank's doing (network, library or device)")
    at_stuck = g.filter(pl.col("seq") == stuck).unique("rank", keep="last").sort("rank") \
        if stuck is not None else g.clear()
    waiting_rows = [{"rank": r["rank"], "op": r["op"], "sizes": r["sizes"], "seq": r["seq"],
                     "state": r["state"], "frame": r["frame"]}
                    for r in at_stuck.iter_rows(named=True) if r["rank"] not in culprits]
    created = at_stuck.get_column("time_created_ns").min() if at_stuck.height else None
    return {
        "group": group, "group_desc": desc, "ranks": members, "missing_dumps": missing,
        "completed_by_all": by_all, "stuck_seq": stuck, "rule": rule,
        "confidence": confidence, "culprits": sorted(culprits),
        "reason": "; ".join(reasons) if reasons else "consistent: every rank called and "
                                                      "completed the same collectives",
        "waiting": waiting_rows, "stuck_created_ns": created, "stuck_p2p_seq": None,
        "per_rank": last.sort("rank").to_dicts(),
    }


__all__ = ["UNEVEN_SIZES", "hang"]
