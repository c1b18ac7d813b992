"""What a Run's shared tables say about the data, as the warnings of every answer that read
them: collectives that could not be paired (``match``), send/recv calls without their peer
(``p2p``), GPU work without its launch or communication kernels missing (``gpu``), ranks
whose clock could not be aligned or only poorly (``offsets``); in full technical detail
(:func:`table_warnings`) and in plain words (:func:`plain_table_warnings`,
``traceview.run.plain``). Only the tables computed (not failed) speak: an answer's warnings
never depend on what else was asked of the Run before.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceview import selection
from traceview.analyses.align import alignment_warnings
from traceview.analyses.comm_kernels import unseen_comm_warning
from traceview.run import plain

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any


def table_warnings(run: Run, *tables: str) -> list[str]:
    """What the named shared tables say about the data: collectives that could not be
    paired (``match``), GPU work without its launch (``gpu``), ranks whose clock could not
    be aligned or only poorly (``offsets``)."""
    out: list[str] = []
    # computed (not failed) only; the GPU rows also when only a table made from them was
    # read from the cache folder: a warning is the data's, not the cache's (the same
    # command said it on a cold cache)
    made_from_gpu = "overlap_rows" in run.__dict__ or bool(getattr(run, "_gaps", None))
    tables = tuple(t for t in tables
                   if t in run.__dict__ or (t == "gpu" and made_from_gpu))
    if "match" in tables:
        out += _capped([f"collectives: group {g}{'' if r is None else f' rank {r}'}: "
                        f"{p}: {d}" for g, r, p, d in run.match.problems.select(
                            "group", "rank", "problem", "detail").rows()])
    if "p2p" in tables and run.p2p[1].height:
        out += _capped([f"send/recv: rank {r}: {n} {op} call(s) {'to' if op == 'send' else 'from'}"
                        f" rank {peer} (tag {tag}) without a matching "
                        f"{'recv' if op == 'send' else 'send'}"
                        for r, op, peer, tag, n in run.p2p[1].rows()])
    if "p2p" in tables and run.p2p[0].height:
        enqueued = pl.concat([
            run.p2p[0].filter(pl.col("send_timing") == "enqueue").select(rank="src"),
            run.p2p[0].filter(pl.col("recv_timing") == "enqueue").select(rank="dst")])
        out += _capped([f"send/recv: rank {r}: {n} NCCL call(s) without their GPU kernel: "
                        "timed by the CPU call, which only enqueues (their waits and "
                        "transfers are not the exchange's)"
                        for r, n in enqueued.group_by("rank").len().sort("rank").rows()])
    if "gpu" in tables and run.unlaunched.height:
        out.append(_unlaunched_warning(run.unlaunched, run.options.exclude_unlaunched))
    if "gpu" in tables and (unseen := unseen_comm_warning(
            run.gpu, run._world.get("world_size"))):
        out.append(unseen)
    if "offsets" in tables and run.options.align != "none" and len(run._aligned_ranks) > 1:
        out += _capped([*(f"alignment: rank {r}: {note}" for r, note in run.offsets.filter(
            pl.col("method") == "none").select("rank", "note").rows()),
            *alignment_warnings(run.offsets)])
    return out


def plain_table_warnings(run: Run, *tables: str) -> list[str]:
    """``table_warnings`` in plain words (``traceview.run.plain``): one line per
    collective group with problems and per clock-alignment quality, saying what the
    answer leaves out; the others are plain already."""
    tables = tuple(t for t in tables if t in run.__dict__)  # computed (not failed) only
    out: list[str] = []
    if "match" in tables and run.match.problems.height:
        out += _capped(plain.collective_lines(run.match.problems, run.match.groups))
    out += table_warnings(run, *(t for t in tables if t in ("p2p", "gpu")))
    if "offsets" in tables and run.options.align != "none" and len(run._aligned_ranks) > 1:
        out += plain.alignment_lines(run.offsets)
    return out


def _unlaunched_warning(unlaunched: pl.DataFrame, excluded: bool) -> str:
    """One line: how many GPU events have no launch in the trace, on which ranks, and what
    was done with them."""
    ranks = sorted(set(unlaunched.get_column("rank").to_list()))
    shown = selection.describe_ranks(ranks)
    what = ("dropped (--exclude-unlaunched)" if excluded else
            "counted as GPU work; --exclude-unlaunched drops them")
    return (f"gpu: {unlaunched.height} GPU events on rank(s) {shown} have no launch in the "
            f"trace (queued before the profiler started): {what}")


def _capped(lines: list[str], most: int = 20) -> list[str]:
    """At most ``most`` lines: a 1,024-rank run can have a problem per rank."""
    if len(lines) <= most:
        return lines
    return [*lines[:most], f"... and {len(lines) - most} more (see the command's tables)"]
