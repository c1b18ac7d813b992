"""``traceview NAME PATH...`` for a registered analysis without a command module of its own
(``traceview.run.registry``: a table of tables, ``cli="analysis"``).

Its options are its function's keyword-only parameters, each with the help the registry
gives it: ``--NAME`` (``-`` for ``_``), a flag for a boolean, a whole number for an int, a
number for a float, text otherwise. The text output is the main table (the first
``MAX_ROWS`` rows unless ``--all``); ``--json`` and ``--csv`` are the Result's, as for every
analysis. Every number comes from ``run.NAME(**options)``.
"""

from __future__ import annotations

import argparse
import inspect

from traceview.cli._options import add_all_arg, add_timeline_args, open_run, real, whole
from traceview.cli._render import MAX_ROWS, emit_result, not_shown, table
from traceview.run.methods import keyword_options
from traceview.run.registry import ANALYSES, Analysis, resolve

_INT64 = 2**63 - 1


def configure(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s options on ``p``, from its analysis function, and the function it runs."""
    analysis = _analysis(command)
    add_timeline_args(p)
    add_all_arg(p)
    for option in _options(analysis):
        flag, default = "--" + option.name.replace("_", "-"), option.default
        words = analysis.options.get(option.name)
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true" if not default
                           else argparse.BooleanOptionalAction, default=default, help=words)
        elif isinstance(default, int):
            p.add_argument(flag, type=whole(-_INT64 - 1, _INT64), default=default,
                           metavar="N", help=words)
        elif isinstance(default, float):
            p.add_argument(flag, type=real(-1e300, 1e300), default=default, metavar="X",
                           help=words)
        else:
            p.add_argument(flag, default=default, help=words)
    p.set_defaults(run=run_analysis)


def _analysis(command: str) -> Analysis:
    return next(a for a in ANALYSES.values() if a.command == command)


def _options(analysis: Analysis) -> list[inspect.Parameter]:
    return keyword_options(resolve(analysis.function))


def run_analysis(args: argparse.Namespace) -> int:
    analysis = _analysis(args.command)
    chosen = {o.name: getattr(args, o.name) for o in _options(analysis)}
    result = getattr(open_run(args), analysis.name)(**chosen)
    if emit_result(result, args):
        return 0
    main = result[result.main]
    shown = main if args.all else main.head(MAX_ROWS)
    print(table(main.columns, shown.rows()))
    if shown.height < main.height:
        print(not_shown(shown.height, main.height, analysis.command))
    return 0
