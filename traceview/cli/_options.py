"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from traceview.errors import UsageError
from traceview.selection import parse_ranks, parse_steps  # noqa: F401 - the options' parsers


def add_input_args(parser: argparse.ArgumentParser, *, many: bool = True) -> None:
    """PATH arguments and the options every command that reads traces accepts."""
    parser.add_argument("paths", nargs="+" if many else 1, metavar="PATH",
                        help="trace files, directories of traces, or a traceview store")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip unreadable files (listed) instead of failing")
    parser.add_argument("--rank-map", metavar="FILE=RANK", action="append", default=[],
                        help="explicit rank for a file (repeatable)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write a cache")
    parser.add_argument("--cache-dir", metavar="DIR", help="where the Parquet cache lives")
    add_executor_args(parser)


def add_executor_args(parser: argparse.ArgumentParser) -> None:
    """--executor local|dask and --scheduler ADDRESS (where files are parsed)."""
    parser.add_argument("--executor", choices=("local", "dask"), default=None,
                        help="parse files in local processes or on a Dask cluster "
                             "(default: in this process for small inputs, else local)")
    parser.add_argument("--scheduler", metavar="ADDRESS", default=None,
                        help="Dask scheduler address (tcp://host:8786); without it "
                             "--executor dask starts and closes a local cluster")
    parser.add_argument("--retries", type=int, default=2, metavar="N",
                        help="retries of a failed worker task (default 2)")


def add_json_arg(parser: argparse.ArgumentParser, *, csv: bool = False) -> None:
    out = parser.add_mutually_exclusive_group() if csv else parser
    out.add_argument("--json", action="store_true", help="machine-readable output")
    if csv:
        out.add_argument("--csv", action="store_true", help="the main table as CSV")


def add_window_args(parser: argparse.ArgumentParser) -> None:
    """--ranks 0-3,7 and --steps 5:9, shared by the analyses."""
    parser.add_argument("--ranks", metavar="SPEC", help="ranks to analyse, e.g. 0-3,7")
    parser.add_argument("--steps", metavar="A:B", help="profiler steps A..B-1, e.g. 5:9")
    parser.add_argument("--skip-warmup", type=int, default=0, metavar="N",
                        help="drop the first N profiler steps of each rank")


#: Clock alignment methods (``traceview.align.METHODS``, not imported: a command that does not
#: align should not pay for loading it).
ALIGN_METHODS: tuple[str, ...] = ("auto", "none", "host", "collectives")


def add_align_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--align", choices=ALIGN_METHODS, default="auto",
                        help="clock alignment: auto (collectives, ranks of one host pooled "
                             "unless contradicted), collectives, host, none")


def parse_rank_map(items: list[str]) -> dict[str, int]:
    mapping: dict[str, int] = {}
    for item in items:
        path, sep, rank = item.rpartition("=")
        if not sep or not rank.strip().isdigit():
            raise UsageError(f"--rank-map wants FILE=RANK, got {item!r}")
        mapping[path] = int(rank)
    return mapping


def executor_spec(args: argparse.Namespace):  # -> ExecutorSpec | None
    """The executor the options ask for, or None (the default placement)."""
    kind = getattr(args, "executor", None)
    scheduler = getattr(args, "scheduler", None)
    if kind is None and scheduler is None:
        return None
    from traceview.executors import ExecutorSpec

    return ExecutorSpec(kind or "dask", scheduler=scheduler,
                        retries=getattr(args, "retries", 2))


def open_traceset(args: argparse.Namespace):  # -> TraceSet
    """Open the command's inputs with the shared options."""
    from traceview import traceset

    return traceset.open(
        args.paths,
        skip_bad=getattr(args, "skip_bad", False),
        rank_map=parse_rank_map(getattr(args, "rank_map", [])),
        cache=not getattr(args, "no_cache", False),
        cache_dir=getattr(args, "cache_dir", None),
        progress=sys.stderr.isatty(),
        executor=executor_spec(args),
    )


def open_run(args: argparse.Namespace):  # -> traceview.run.Run
    """The Run the command's inputs, window and alignment options describe. A bad option
    fails before any file is read."""
    from traceview.run import Run, RunOptions

    options = RunOptions(
        ranks=getattr(args, "ranks", None), steps=getattr(args, "steps", None),
        time=getattr(args, "time", None), skip_warmup=getattr(args, "skip_warmup", 0),
        align=getattr(args, "align", "auto"),
        reference_rank=getattr(args, "reference_rank", None),
        tolerance_us=getattr(args, "tolerance_us", 500.0))
    options.window()
    return Run(open_traceset(args), options)


def emit_result(result: Any, args: argparse.Namespace) -> bool:
    """Print ``result`` as ``--json`` or ``--csv`` when asked (True), after its warnings on
    stderr; False when the command should render its text."""
    for warning in result.warnings:
        print(f"traceview: warning: {warning}", file=sys.stderr)
    if getattr(args, "json", False):
        sys.stdout.write(result.to_json().decode() + "\n")
        return True
    if getattr(args, "csv", False):
        sys.stdout.write(result.to_csv())
        return True
    return False


def ranks_in_window(ts, ranks: Sequence[int] | None) -> list[int] | None:
    """The ranks with events among ``ranks`` (all when None), from the TraceSet's files
    (``TraceSet.ranks_with_events``); None when the files cannot tell."""
    known = ts.ranks_with_events()
    if known is None or ranks is None:
        return known
    wanted = set(ranks)
    return [r for r in known if r in wanted]


def dumps(obj: Any) -> str:
    """JSON text for --json outputs (stable key order as given, NaN -> null)."""
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY,
                        default=_default).decode()


def _default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def emit_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")
