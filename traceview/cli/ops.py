"""``traceview ops``: operators against the roofline (``Run.ops``).

Per op (``--by shape``: name and recorded arguments; ``--by name``), its GPU time, FLOPs and
bytes from its shapes, the achieved TFLOP/s and TB/s, the arithmetic intensity, what bounds it
on the device's roofline and how close it came. ``--json`` and ``--csv`` (the ops table, full
kernel names) come from the Result; the text names each op's largest kernel uniquely
(``analyses.names.unique_short_names``).
"""

from __future__ import annotations

import argparse

from traceview.analyses.names import unique_short_names
from traceview.analyses.op_models import CATEGORIES
from traceview.cli._options import MAX_ROWS, add_timeline_args, open_run, whole
from traceview.cli._render import MISSING, emit_result, fixed, ms, pct, table


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``ops``' options on ``p``, and the function it runs."""
    add_timeline_args(p)
    p.add_argument("--by", choices=("shape", "name"), default="shape",
                   help="one row per op name and recorded shapes (default), or per op name")
    p.add_argument("--category", choices=CATEGORIES, help="only this op family")
    p.add_argument("--top", type=whole(0, MAX_ROWS), default=20, metavar="N",
                   help="ops to list")
    p.set_defaults(run=run_ops)


def run_ops(args: argparse.Namespace) -> int:
    result = open_run(args).ops(by=args.by, category=args.category)
    if emit_result(result, args):
        return 0
    df = result["ops"]
    peaks = result["peaks"]
    roof = ", ".join(f"{dt} {v:g} TFLOP/s" for dt, v in peaks["tflops"].items())
    bw = peaks["tb_per_s"]
    print(f"Device: {result['device'] or MISSING}"
          + (f" (peaks: {roof}{'; ' if roof and bw else ''}"
             f"{f'{bw:g} TB/s' if bw else ''})" if roof or bw else ""))
    shown = df.head(args.top)
    labels = unique_short_names([k[0] for k in shown.get_column("kernels").to_list() if k])
    print(f"\nOps by GPU time{' (by name)' if args.by == 'name' else ' and shape'}; "
          "FLOPs and bytes per instance, rates as the mean over instances")
    print(table(
        ["op", "category", "shape", "count", "gpu_ms", "GFLOP", "MB", "TFLOP/s", "TB/s",
         "FLOP/B", "bound", "of roof", "left_ms", "top kernel"],
        [[r["name"], r["category"], r["input_dims"], r["count"], ms(r["kernel_time_ns"]),
          fixed(_scaled(r["flops"], 1e9), 3), fixed(_scaled(r["bytes"], 1e6), 2),
          fixed(r["tflops_per_s"], 2), fixed(r["tb_per_s"], 3), fixed(r["intensity"], 1),
          r["bound"], pct(r["roofline_fraction"]) if r["roofline_fraction"] is not None
          else None, ms(r["time_left_ns"]), labels.get(r["kernels"][0]) if r["kernels"]
          else None] for r in shown.iter_rows(named=True)],
        left={"op", "category", "shape", "bound", "top kernel"}, max_width=None))
    if shown.height < df.height:
        print(f"... {df.height - shown.height} more (--top N, or --csv for all)")
    return 0


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value / scale
