"""``traceview hang DUMPS…``: why a job hung, from PyTorch flight-recorder dumps.

DUMPS are the per-rank pickles (``<prefix><rank>``, as ``fr_trace`` takes them) or folders of
them. They are read as untrusted input: plain data only, bounded (``parsers.flight_recorder``).
Exit 0 when every process group is consistent, 1 when a hang, a culprit, a mismatch or a
missing dump is found, 2 when a dump cannot be read. Every answer comes from
``traceview.run.hang.hang_result`` (the ``--json`` contract is in its docstring).
"""

from __future__ import annotations

import argparse

from traceview.cli._options import add_json_arg, whole
from traceview.cli._render import emit_result
from traceview.analyses.nodes import rank_ranges, ranks_text
from traceview.run.hang import hang_result


def configure(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument("paths", nargs="+", metavar="DUMPS",
                   help="flight-recorder dumps (one per rank), or folders of them")
    p.add_argument("--world-size", type=whole(1, 1 << 24), default=None, metavar="N",
                   help="ranks in the job (default: the groups' ranks the dumps name, else "
                        "the highest rank dumped + 1): names the ranks whose dump is missing")
    add_json_arg(p, csv=True)
    p.set_defaults(run=run_hang)


def run_hang(args: argparse.Namespace) -> int:
    result = hang_result(args.paths, world_size=args.world_size)
    code = 0 if result["consistent"] else 1
    if emit_result(result, args):
        return code
    dumped = result["dumped_ranks"]
    print(f"{len(dumped)} dump(s): ranks {rank_ranges(dumped)} of {result['world_size']}")
    if result["missing_dumps"]:
        print(f"missing dumps: {ranks_text(result['missing_dumps'])}")
    for g in result["groups"]:
        desc = f" ({g['group_desc']})" if g["group_desc"] else ""
        done = "-" if g["completed_by_all"] is None else f"#{g['completed_by_all']}"
        print(f"group {g['group']}{desc}, ranks {rank_ranges(g['ranks'])}: last collective "
              f"every rank completed: {done}")
        if g["stuck_seq"] is None:
            print(f"  {g['reason']}")
            continue
        who = ranks_text(g["culprits"]) if g["culprits"] else "none"
        print(f"  stuck at #{g['stuck_seq']}: culprit {who} "
              f"(confidence {g['confidence']}): {g['reason']}")
        for w in _grouped_waits(g["waiting"]):
            print(f"  {w['ranks']} wait in {w['op']} #{w['seq']} sizes {w['sizes']} "
                  f"({w['state']})")
    for m in result["mismatches"]:
        calls = ", ".join(f"rank {r}: {op} {sizes}" for r, op, sizes in
                          zip(m["ranks"], m["ops"], m["sizes"], strict=True))
        print(f"mismatch in group {m['group']} at #{m['seq']}: {calls}")
    if result["consistent"]:
        print("every group is consistent: no hang found in these dumps")
    return code


def _grouped_waits(waiting: list[dict]) -> list[dict]:
    """The waiting ranks grouped by what they wait in (one line per op, size, seq, state)."""
    found: dict[tuple, list[int]] = {}
    for w in waiting:
        found.setdefault((w["op"], w["sizes"], w["seq"], w["state"]), []).append(w["rank"])
    return [{"op": op, "sizes": sizes, "seq": seq, "state": state, "ranks": ranks_text(r)}
            for (op, sizes, seq, state), r in found.items()]
