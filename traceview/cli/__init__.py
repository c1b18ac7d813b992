"""The cli room: the ``traceview`` command, one table of subcommands and one module per group
of them; it may import every other room, and nothing imports it but ``__main__``.

``COMMANDS`` names each subcommand, the module under ``traceview.cli`` that adds its options
(``configure(parser, command)``, which also sets ``run=function(args) -> int``) and its help
line; the analysis commands come from the Run's table of analyses (``traceview.run.registry``). Errors become one line on stderr and an exit code (0 ok, 1 a check found problems, 2
usage or unreadable input); a traceback only with --debug. Printing is ``_render``'s, the
shared options ``_options``'; while a command runs, stdout and stderr escape control
characters (``_streams``), and --json / --csv write past that guard. An analysis command's
--json / --csv answer is kept for the same command line on unchanged inputs and printed
again before any command module is imported (``_answers``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from traceview import __version__
from traceview._dependencies import lazy_module
from traceview.cli import _memory_limit
from traceview.cli._streams import guarded_streams
from traceview.run import registry
from traceview.errors import TraceviewError, redacted
from traceview.outputs.safe_text import one_line, printable

#: Asked only by ``--version``: every other command would pay for the parser's imports.
kineto = lazy_module("traceview.parsers.kineto")


class Command(NamedTuple):
    module: str  #: under ``traceview.cli``: ``configure(parser, command)`` and the run functions
    help: str
    #: an analysis command (``traceview.run.registry``): its --json / --csv answer can be kept
    #: (``_answers``), so a command line asked again is answered before anything is imported
    answers: bool = False


#: The subcommands that are not analyses of a Run, in the order help lists them: the first
#: three before the analyses, the rest after.
_OTHER_COMMANDS: dict[str, Command] = {
    "ingest": Command("core", "parse traces into the Parquet store"),
    "info": Command("core", "ranks, files, event counts"),
    "sql": Command("core", "SQL over the tables events, kernels, ranks, files, windows, "
                                "gpu (classified GPU rows)"),
    "report": Command("report", "one self-contained HTML report of a run"),
    "diff": Command("report", "compare two runs: step time, comm, idle, kernels, collectives, "
                              "with a significance test"),
    "baseline": Command("report", "write the CI gate's baseline metrics of a run"),
    "check": Command("report", "CI gate: exit 1 if a metric regressed past its tolerance"),
    "history": Command("history", "CI history: record runs' gate metrics in a database "
                                  "(SQLite or PostgreSQL), show them and their trends"),
    "export-perfetto": Command("report",
                               "all ranks on the aligned timeline in one Chrome-trace file"),
    "validate": Command("capture", "check a run directory before analysing it"),
    "capture": Command("capture", "record traces that analyse well"),
    "analyse": Command("scale", "per-rank analyses on local processes or a Dask cluster; "
                                "alignment, collectives, stragglers, overlap"),
    "hang": Command("hang", "why a job hung, from flight-recorder dumps: per process group the "
                            "last collective all completed, culprit ranks, mismatches"),
}


class _CommandTable(Mapping[str, Command]):
    """Every subcommand, in the order help lists them: the analysis commands are the Run's
    analyses (``traceview.run.registry``, read as it is now: one registered later is a
    command too), each with the module that prints its text and its help."""

    def _table(self) -> dict[str, Command]:
        first = ("ingest", "info", "sql")
        return {**{name: _OTHER_COMMANDS[name] for name in first},
                **{a.command: Command(a.cli, a.help, True) for a in registry.ANALYSES.values()},
                **{n: c for n, c in _OTHER_COMMANDS.items() if n not in first}}

    def __getitem__(self, name: str) -> Command:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


#: Every subcommand, in the order help lists them. A command line naming one imports its
#: module only: the others and what they import (clock alignment, the report, capture) cost
#: ~25 ms a command, which a CI job running the analyses one by one pays every time. Without a
#: known command name (``--help``, a typo) every command is added, so help and "invalid
#: choice" errors list them all.
COMMANDS: Mapping[str, Command] = _CommandTable()


def module_of(command: str):  # -> types.ModuleType
    """The module that adds ``command``'s options and runs it (imported now)."""
    return importlib.import_module(f"{__name__}.{COMMANDS[command].module}")


VERBOSE_HELP = ("warnings in full technical detail (default: what they mean for the answer, "
                "in plain words, each once; --json always holds both)")


class _Version(argparse.Action):
    """``--version``: the version and the active Kineto parser path (the C scanner, or the
    3-4.6x slower pure-Python path, with why and the fix), computed only when asked."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # noqa: ANN001
        print(version_text())
        parser.exit()


def version_text() -> str:
    from traceview._kineto_path import parser_path  # the scanner alone: no Polars, no pyarrow

    path, why = parser_path() if "traceview.parsers.kineto._parse" not in sys.modules \
        else kineto.parser_path()
    return (f"traceview {__version__} (Kineto parser: {path}"
            + (f": {why}; {kineto.SCANNER_FIX})" if why else ")"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 on usage errors: keep that
        self.print_usage(sys.stderr)
        self.exit(2, f"traceview: error: {one_line(message)}\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: with the subcommand ``argv`` names only (see ``COMMANDS``),
    with all of them when ``argv`` is None or names none."""
    parser = _Parser(prog="traceview", description="Analyse PyTorch-profiler and nsys traces.")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="the version, and which path parses Kineto JSON")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    named = _command_name(argv)
    if named not in COMMANDS and argv is not None and "--version" in argv:
        return parser  # the version is all it will print: no command's imports
    # No command named (`traceview --help`, a misspelt command): the top-level help and the
    # choices need only the table, not each command's options, whose modules import Polars
    # (docs/performance.md, log entry 37). argv None (the whole parser) still configures all.
    configure = named in COMMANDS or argv is None
    for command in [named] if named in COMMANDS else COMMANDS:
        command_parser = sub.add_parser(command, help=COMMANDS[command].help)
        if not configure:
            continue
        module_of(command).configure(command_parser, command)
        # after the command too (`traceview summary X --verbose`); SUPPRESS keeps a
        # `traceview --verbose summary X` from being reset by the command's default
        command_parser.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                                    help=VERBOSE_HELP)
    return parser


def _command_name(argv: Sequence[str] | None) -> str | None:
    """The first argument that is not an option (the top-level options take no values)."""
    return next((a for a in argv if not a.startswith("-")), None) if argv is not None else None


# Imported only when a command is terminated.
executors = lazy_module("traceview.store.executors")
# Imported only for an analysis command.
answers = lazy_module("traceview.cli._answers")


@contextmanager
def _workers_stopped_on_sigterm() -> Iterator[None]:
    """While a command runs, SIGTERM stops its pool workers and fork server before it exits
    (128 + 15): by default they would outlive it, holding the caller's pipes open. The handler
    before is put back after (``main`` is called in-process too, by tests and notebooks)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def stop(signum: int, _frame: object) -> None:
        executors.stop_local_workers()
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _one_blas_thread(command: str | None) -> None:
    """OpenBLAS (numpy's) keeps one thread per core, which spins ~0.1 s after numpy is
    imported, waiting for work a command never gives it: 0.15 CPU s of every command that
    reads a trace (the Kineto parser uses numpy; traceview does no linear algebra worth a
    thread). The program is its own process, so it asks for one thread unless the user chose
    (docs/performance.md, log 50). Not for ``capture``: the job it starts inherits the
    environment, and its numpy (or an OpenBLAS build of torch) must keep its threads. A
    library caller's process is left alone."""
    if command != "capture" and "numpy" not in sys.modules:  # read when OpenBLAS loads
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def console_main() -> int:
    """``traceview`` as a program (the console script, ``python -m traceview``): :func:`main`
    on ``sys.argv``, a kept answer looked up before the command's imports. The cyclic garbage
    collector is kept off while the named command's module and Polars are imported (tens of
    thousands of objects, no garbage: each collection walked them all again), which then stay
    out of its way (``gc.freeze``); at the end, what is left is collected once and frozen, so
    that the interpreter's exit does not walk every object again. Together ~0.2 CPU s of
    every command (docs/performance.md, log 41). Not for callers in a process that goes on:
    frozen objects are never collected.

    Ctrl-C anywhere in it, the imports and the final collection included, is exit 130
    without a traceback."""
    try:
        status = _memory_limit.supervised(sys.argv[1:])  # under ulimit -v: watched
        return _program(sys.argv[1:]) if status is None else status
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the imports failed, or a Rust panic
        # (pyo3's PanicException is no Exception): no traceback either
        if "--debug" in sys.argv:
            raise
        print(_memory_limit.out_of_memory_line() if _memory_limit.is_out_of_memory(exc)
              else f"traceview: internal error: {type(exc).__name__}: "
                   f"{redacted(one_line(str(exc)))} (rerun with --debug)", file=sys.stderr)
        return 2


def _program(argv: list[str]) -> int:
    """:func:`console_main`'s work; its caller turns a KeyboardInterrupt into 130."""
    with guarded_streams():
        if _kept_answer_printed(argv):  # then none of the imports below is needed
            return 0
    named = _command_name(argv)
    _one_blas_thread(named)
    gc.disable()
    try:
        if named in COMMANDS:
            module_of(named)
    finally:
        gc.freeze()
        gc.enable()
    try:
        with guarded_streams():
            return _command(argv)
    finally:
        gc.collect()  # garbage is collected (and finalized) now, as at a normal exit
        gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    with guarded_streams():
        return 0 if _kept_answer_printed(argv) else _command(argv)


def _kept_answer_printed(argv: list[str]) -> bool:
    """Whether an analysis command's answer kept for ``argv`` was printed (``_answers``)."""
    named = _command_name(argv)
    if named not in COMMANDS or not COMMANDS[named].answers:
        return False  # --version, --help, ingest ...: not even the module is imported
    return answers.replay(argv)


def _command(argv: list[str]) -> int:
    """Parse ``argv`` and run its command (its answer not kept, or not asked before)."""
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help(sys.stderr)
        return 2
    # the inputs as they are before the command reads them: a kept answer must describe them
    named = _command_name(argv)
    before = (answers.inputs_before(argv) if named in COMMANDS and COMMANDS[named].answers
              else None)
    try:
        with _workers_stopped_on_sigterm():
            status = int(args.run(args) or 0)
        if status == 0:
            answers.keep(argv, args, before)
        return status
    except TraceviewError as exc:
        if args.debug:
            raise
        print(f"traceview: {error_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # the file system said no (permissions, a full disk): not a bug
        if args.debug:
            raise
        print(f"traceview: {error_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug: still one line, unless --debug
        if args.debug:
            raise
        if isinstance(exc, RuntimeError) and str(exc).startswith("Symlink loop from"):
            # pathlib's word for ELOOP (a link loop named as --db, the cache folder ...)
            print(f"traceview: {printable(str(exc).split(' from ', 1)[1].strip(chr(39)))}: "
                  "a loop of symbolic links (Too many levels of symbolic links)",
                  file=sys.stderr)
            return 2
        if _memory_limit.is_out_of_memory(exc):
            print(_memory_limit.out_of_memory_line(), file=sys.stderr)
            return 2
        print(f"traceview: internal error: {type(exc).__name__}: "
              f"{redacted(one_line(str(exc)))} (rerun "
              "with --debug)", file=sys.stderr)
        return 2


def error_line(exc: BaseException) -> str:
    """An error as one printable line, naming its file: a name's own newlines and control
    characters escaped, a message of several lines (a library's) joined into one."""
    if isinstance(exc, OSError):
        where = f"{printable(str(exc.filename))}: " if exc.filename else ""
        return redacted(where + one_line(exc.strerror or str(exc)))
    return redacted(one_line(str(exc)))
