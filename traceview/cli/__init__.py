"""The ``traceview`` command: one entry point, one module per group of subcommands.

Each module in ``COMMAND_MODULES`` has ``register(subparsers)``; every subcommand sets
``run=function(args) -> int``. Errors become one line on stderr and an exit code
(0 ok, 1 a check found problems, 2 usage or unreadable input); a traceback only with --debug.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from traceview import __version__
from traceview.errors import TraceviewError

#: The module that registers each subcommand. A command line naming one of them imports that
#: module only: the others and what they import (clock alignment, the report, capture) cost
#: ~25 ms a command, which a CI job running the analyses one by one pays every time. Without a
#: known command name (``--help``, a typo) every module registers, so help and "invalid
#: choice" errors list them all. ``tests/test_cli_commands.py`` checks it against the modules.
#: Each module has ``register(subparsers) -> None``.
COMMANDS: dict[str, str] = {
    **dict.fromkeys(("ingest", "info", "sql"), "traceview.cli.core"),
    **dict.fromkeys(("align", "collectives", "stragglers"), "traceview.cli.distributed"),
    **dict.fromkeys(("gaps", "overlap", "breakdown", "summary"), "traceview.cli.timeline"),
    **dict.fromkeys(("report", "diff", "baseline", "check", "export-perfetto"),
                    "traceview.cli.report"),
    **dict.fromkeys(("validate", "capture"), "traceview.cli.capture"),
    "analyse": "traceview.cli.scale",
}

#: Modules that add subcommands, in the order help lists them.
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on usage errors: keep that
        self.print_usage(sys.stderr)
        self.exit(2, f"traceview: error: {message}\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: with the subcommand ``argv`` names only (see ``COMMANDS``),
    with all of them when ``argv`` is None or names none."""
    parser = _Parser(prog="traceview", description="Analyse PyTorch-profiler and nsys traces.")
    parser.add_argument("--version", action="version", version=f"traceview {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    named = _command_name(argv)
    for module_name in [COMMANDS[named]] if named in COMMANDS else COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def _command_name(argv: Sequence[str] | None) -> str | None:
    """The first argument that is not an option (the top-level options take no values)."""
    return next((a for a in argv if not a.startswith("-")), None) if argv is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.run(args) or 0)
    except TraceviewError as exc:
        if args.debug:
            raise
        print(f"traceview: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: still one line, unless --debug
        if args.debug:
            raise
        print(f"traceview: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
              file=sys.stderr)
        return 2

