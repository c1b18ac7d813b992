"""The options the commands share, and the Run or TraceSet they describe.

Every ``add_*`` function adds one group of options to a command's parser; ``open_run`` and
``open_traceset`` turn the parsed options into what the command analyses. Printing is
``_render``'s.
"""

from __future__ import annotations

import argparse
import math
import sys

from traceview._dependencies import lazy_module
from traceview.errors import UsageError
from traceview.selection import ALIGN_METHODS
from traceview.store import executors, traceset
from traceview.store.executors import ExecutorSpec
from traceview.store.windows import parse_window

#: The Run, loaded when a command opens one: `ingest` and `info` need only the trace set, and
#: the Run's analyses cost them ~0.15 s of imports (benchmarks/startup.py-style measurement on
#: real corpus files).
run_module = lazy_module("traceview.run.run")


def whole(low: int, high: int):  # -> a type function for argparse
    """An argparse type: an integer from ``low`` to ``high``, else a one-line usage error (a
    negative ``--top`` or a ``--skip-warmup`` of 10**30 reached the analyses)."""
    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"wants {low} to {high}, got {text}")
        return value
    return whole_number


def real(low: float, high: float, *, above_low: bool = False):  # -> a type function
    """An argparse type: a finite number from ``low`` (or above it, ``above_low``) to
    ``high``, else a one-line usage error (nan, inf and 1e400 are refused)."""
    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a number, got {text!r}") from None
        if not math.isfinite(value) or value > high or value < low or (
                above_low and value == low):
            side = "above" if above_low else "from"
            raise argparse.ArgumentTypeError(f"wants a number {side} {low:g} to {high:g}, "
                                             f"got {text}")
        return value
    return number


#: How many rows a --top or --limit may ask for, and how many steps --skip-warmup may skip.
MAX_ROWS = 10_000_000
MAX_RANK = 2**31 - 1


def add_input_args(parser: argparse.ArgumentParser, *, many: bool = True,
                   optional: bool = False) -> None:
    """PATH arguments and the options every command that reads traces accepts (``optional``:
    PATHs may be left out, for a command that takes its runs from another option)."""
    parser.add_argument("paths", nargs="*" if optional else "+" if many else 1, metavar="PATH",
                        help="trace files, directories of traces, or a traceview store")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip unreadable files (listed) instead of failing")
    parser.add_argument("--rank-map", metavar="FILE=RANK", action="append", default=[],
                        help="explicit rank for a file (repeatable)")
    parser.add_argument("--run-of", metavar="FILE", default=None,
                        help="the inputs mix runs (or jobs): keep the run FILE belongs to, "
                             "leaving the others out with a warning")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write a cache")
    parser.add_argument("--cache-dir", metavar="DIR", help="where the Parquet cache lives")
    add_include_osrt_arg(parser)
    add_profiling_window_arg(parser)
    add_executor_args(parser)


def add_include_osrt_arg(parser: argparse.ArgumentParser) -> None:
    """--include-osrt: read nsys exports' OS runtime rows (left out by default)."""
    parser.add_argument("--include-osrt", action="store_true",
                        help="read the OS runtime (OSRT_API) rows of nsys exports too")


def parse_options(args: argparse.Namespace) -> dict[str, object]:
    """The parser options the command line asks for (part of the cache key: empty unless
    asked, so the default shares its cache entries with ``traceview.open``'s)."""
    return {"include_osrt": True} if getattr(args, "include_osrt", False) else {}


def add_profiling_window_arg(parser: argparse.ArgumentParser) -> None:
    """--window N|last: one profiling window of each rank (``traceview.store.windows``)."""
    parser.add_argument("--window", metavar="N|last", default=None,
                        help="analyse one profiling window of each rank (a schedule with "
                             "repeat writes one file per window): its number from 0, or "
                             "'last'; default: every window")


def add_executor_args(parser: argparse.ArgumentParser) -> None:
    """--executor local|dask and --scheduler ADDRESS (where files are parsed)."""
    parser.add_argument("--executor", choices=("local", "dask"), default=None,
                        help="parse files in local processes or on a Dask cluster "
                             "(default: in this process for small inputs, else local)")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="Dask scheduler address (tcp://host:8786); without it "
                             "--executor dask starts and closes a local cluster")
    parser.add_argument("--retries", type=whole(0, 100), default=2, metavar="N",
                        help="retries of a failed worker task (default 2)")


def add_timeline_args(parser: argparse.ArgumentParser) -> None:
    """The inputs, window, ``--time``, alignment and ``--json``/``--csv`` options of the
    commands that answer from one Run's timeline (summary, gaps, overlap, breakdown, ops)."""
    add_input_args(parser)
    add_window_args(parser)
    parser.add_argument("--time", metavar="A:B", help="time window relative to the first "
                        "event, e.g. 0:2s or 100ms:300ms (events are clipped to it)")
    add_align_arg(parser)
    add_json_arg(parser, csv=True)


def add_json_arg(parser: argparse.ArgumentParser, *, csv: bool = False) -> None:
    out = parser.add_mutually_exclusive_group() if csv else parser
    out.add_argument("--json", action="store_true", help="machine-readable output")
    if csv:
        out.add_argument("--csv", action="store_true", help="the main table as CSV")


def add_window_args(parser: argparse.ArgumentParser) -> None:
    """--ranks 0-3,7 and --steps 5:9, shared by the analyses."""
    parser.add_argument("--ranks", metavar="SPEC", help="ranks to analyse, e.g. 0-3,7")
    parser.add_argument("--steps", metavar="A:B", help="profiler steps A..B-1, e.g. 5:9")
    parser.add_argument("--skip-warmup", type=whole(0, MAX_ROWS), default=0, metavar="N",
                        help="drop the first N profiler steps of each rank")
    add_gpu_rule_args(parser)


def add_gpu_rule_args(parser: argparse.ArgumentParser) -> None:
    """Which GPU events count and how they are classified (``RunOptions``)."""
    parser.add_argument("--exclude-unlaunched", action="store_true",
                        help="drop GPU events whose launch is not in the trace (queued before "
                             "the profiler started); default: keep them, with a warning")
    parser.add_argument("--comm-pattern", metavar="REGEX", action="append", default=[],
                        help="kernel names that are communication besides NCCL/RCCL, e.g. "
                             "'^cross_device_reduce_' (repeatable)")
    parser.add_argument("--comm-config", metavar="FILE", default=None,
                        help="TOML file with comm_patterns = [REGEX, ...]")
    parser.add_argument("--graph-capture", metavar="FILE", action="append", default=[],
                        help="a trace of the CUDA/HIP-graph capture the run replays: the "
                             "replayed kernels are charged to the captured ops (repeatable)")




def add_align_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--align", choices=ALIGN_METHODS, default="auto",
                        help="clock alignment: auto (collectives, ranks of one host pooled "
                             "unless contradicted), collectives, host, none")
    parser.add_argument("--gpus-per-node", type=int, default=None, metavar="N",
                        help="ranks kN..kN+N-1 are node k (default: the host each trace "
                             "names)")


def parse_rank_map(items: list[str]) -> dict[str, int]:
    mapping: dict[str, int] = {}
    for item in items:
        path, sep, rank = item.rpartition("=")
        if not sep or not rank.strip().isdigit():
            raise UsageError(f"--rank-map wants FILE=RANK, got {item!r}")
        if int(rank) > (1 << 31) - 1:  # ranks are int32 in the store
            raise UsageError(f"--rank-map {item!r}: a rank is 0 to 2^31-1")
        mapping[path] = int(rank)
    return mapping


def executor_spec(args: argparse.Namespace):  # -> ExecutorSpec | None
    """The executor the options ask for, or None (the default placement)."""
    kind = getattr(args, "executor", None)
    scheduler = getattr(args, "scheduler", None)
    if kind is None and scheduler is None:
        return None

    return ExecutorSpec(kind or "dask", scheduler=scheduler,
                        retries=getattr(args, "retries", 2))


def open_traceset(args: argparse.Namespace):  # -> TraceSet
    """Open the command's inputs with the shared options. Once they are read, the ingest's
    fork server is stopped, unless the command maps per rank on local workers next
    (``analyse``): it would hold ~130 MB until the command's end."""
    ts = traceset.open(
        args.paths,
        skip_bad=getattr(args, "skip_bad", False),
        rank_map=parse_rank_map(getattr(args, "rank_map", [])),
        cache=not getattr(args, "no_cache", False),
        cache_dir=getattr(args, "cache_dir", None),
        # a person at a terminal only: never beside --json / --csv, a pipe or a log file
        progress=(sys.stderr.isatty() and not getattr(args, "json", False)
                  and not getattr(args, "csv", False)),
        executor=executor_spec(args),
        window=parse_window(getattr(args, "window", None)),
        options=parse_options(args),
        run_of=getattr(args, "run_of", None),
    )
    if getattr(args, "command", None) != "analyse":
        executors.release_fork_server()
    return ts


def open_run(args: argparse.Namespace):  # -> traceview.run.run.Run
    """The Run the command's inputs, window and alignment options describe. A bad option
    fails before any file is read."""
    options = run_module.RunOptions(
        ranks=getattr(args, "ranks", None), steps=getattr(args, "steps", None),
        time=getattr(args, "time", None), skip_warmup=getattr(args, "skip_warmup", 0),
        align=getattr(args, "align", "auto"),
        reference_rank=getattr(args, "reference_rank", None),
        tolerance_us=getattr(args, "tolerance_us", None),
        exclude_unlaunched=getattr(args, "exclude_unlaunched", False),
        comm_patterns=tuple(getattr(args, "comm_pattern", None) or ()),
        comm_config=getattr(args, "comm_config", None),
        gpus_per_node=getattr(args, "gpus_per_node", None),
        graph_capture=tuple(getattr(args, "graph_capture", None) or ()))
    options.check()
    return run_module.Run(open_traceset(args), options)


def add_all_arg(parser: argparse.ArgumentParser) -> None:
    """--all: every row of a text table, however many ranks (else the distribution across
    ranks and the outlier rows past a few dozen ranks; --json and --csv always hold every
    row)."""
    parser.add_argument("--all", action="store_true",
                        help="print every row (default past 32 ranks or 64 rows: the "
                             "distribution across ranks and the outliers)")
