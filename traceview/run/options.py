"""RunOptions: what a Run looks at and how it reads the data, checked before any file is read.

Text as the CLI takes it (``ranks="0-3,7"``, ``steps="5:9"``, ``time="100ms:300ms"``) or plain
values; :meth:`RunOptions.window` parses them (``traceview.selection``) and
:meth:`RunOptions.classify_patterns` builds the GPU classification rules, so a bad option is a
one-line usage error before any trace is opened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from traceview import selection
from traceview.analyses.classify import with_comm_patterns
from traceview.analyses.window import Window
from traceview.errors import UsageError
from traceview.parsers import file_problem


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a Run looks at and how it aligns clocks. Text as the CLI takes it, or values.

    ranks:          ``"0-3,7"`` or ranks; None: every rank.
    steps:          ``"5:9"``, ``(5, 9)`` or ``range(5, 9)``: profiler steps 5..8.
    time:           ``"100ms:300ms"`` or ``(start_ns, stop_ns)`` from the first event.
    skip_warmup:    drop each rank's first N steps.
    align:          ``auto``, ``collectives``, ``host`` or ``none`` (see ``traceview.analyses.align``).
    reference_rank: the rank whose clock is the reference (default: the lowest).
    tolerance_us:   how far apart two completions of one collective may be when matching;
                    None (default) learns it per group from the run's own residuals.
    exclude_unlaunched: drop GPU events whose launch is not in the trace (work queued before
                    the profiler started; ``analyses.launches.unlaunched_gpu``). Default: keep
                    them, and say how many there are in the results' warnings.
    comm_patterns:  more kernel-name regexes (Rust regex syntax) that mean communication,
                    beyond the known ones (``comm_kernels.COMM_KERNELS``), e.g. ``^my_allreduce_``
                    (``classify.with_comm_patterns``).
    comm_config:    a TOML file whose ``comm_patterns = [...]`` adds to ``comm_patterns``.
    gpus_per_node:  ranks ``kN .. kN+N-1`` are node k (``analyses.nodes``); None: the host
                    each trace names.
    graph_capture:  traces of the CUDA/HIP-graph captures the run replays (``--graph-capture``):
                    the kernels of each graph launch are charged to the ops captured into the
                    graph (``analyses.graph_capture``); without them they stay unattributed.
    """

    ranks: str | Sequence[int] | None = None
    steps: str | tuple[int | None, int | None] | range | None = None
    time: str | tuple[int | None, int | None] | None = None
    skip_warmup: int = 0
    align: str = "auto"
    reference_rank: int | None = None
    tolerance_us: float | None = None
    exclude_unlaunched: bool = False
    comm_patterns: tuple[str, ...] = ()
    comm_config: str | Path | None = None
    gpus_per_node: int | None = None
    graph_capture: tuple[str | Path, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.graph_capture, (str, Path)):  # one file, not its characters
            object.__setattr__(self, "graph_capture", (self.graph_capture,))
        else:
            object.__setattr__(self, "graph_capture", tuple(self.graph_capture or ()))

    def classify_patterns(self) -> Any:  # analyses.classify.ClassifyPatterns
        """The classification rules: the default, plus ``comm_patterns`` and those of
        ``comm_config``; a usage error for an unreadable file or a bad regex."""
        from_config = _config_patterns(self.comm_config)
        origins = (*(["--comm-pattern"] * len(self.comm_patterns)),
                   *([f"--comm-config {self.comm_config}"] * len(from_config)))
        return with_comm_patterns(_checked_patterns(
            (*self.comm_patterns, *from_config), origins))

    def check(self) -> None:
        """A usage error (before any file is read) when an option does not parse; no rank
        range is expanded (``--ranks 0-1000000000`` is compared with the ranks present)."""
        if self.align not in selection.ALIGN_METHODS:
            raise UsageError(f"--align wants one of {', '.join(selection.ALIGN_METHODS)}, "
                             f"got {self.align!r}")
        if self.gpus_per_node is not None and (not isinstance(self.gpus_per_node, int)
                                               or self.gpus_per_node < 1):
            raise UsageError(f"--gpus-per-node wants a positive whole number, "
                             f"got {self.gpus_per_node!r}")
        if isinstance(self.ranks, str) and self.ranks.strip():
            selection.rank_ranges(self.ranks)
        self.classify_patterns()
        for path in self.graph_capture:
            problem = file_problem(path)
            if problem:
                raise UsageError(f"--graph-capture {path}: {problem}")
        selection.parse_steps(self.steps)
        selection.parse_time_window(self.time)

    def window(self, present: Sequence[int] | None = None) -> Any:  # analyses.window.Window
        """The window these options select, its ranks those of ``present`` (the run's ranks)
        that ``ranks`` names; a usage error when an option does not parse."""
        self.check()
        return Window(ranks=selection.parse_ranks(self.ranks, present),
                      steps=selection.parse_steps(self.steps),
                      time_ns=selection.parse_time_window(self.time),
                      skip_warmup=self.skip_warmup)


#: Bounds on the classification rules: the patterns there may be, one pattern's length, and
#: a --comm-config file's size (a TOML file nested 100k deep took the reader's recursion).
MAX_PATTERNS = 1000
MAX_PATTERN_CHARS = 10_000
MAX_CONFIG_BYTES = 1 << 20


def _config_patterns(path: str | Path | None) -> tuple[str, ...]:
    """``comm_patterns`` of a TOML file (``comm_patterns = ["^cross_device_reduce_"]``)."""
    if path is None:
        return ()

    try:
        import tomllib  # Python 3.11+
    except ImportError:
        raise UsageError("--comm-config needs Python 3.11 or later (tomllib); "
                         "use --comm-pattern REGEX instead") from None

    problem = file_problem(path)  # before opening: a FIFO would block the open
    if problem:
        raise UsageError(f"--comm-config {path}: {problem}")
    try:
        with Path(path).open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--comm-config {path}: cannot read ({exc.strerror or exc})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"--comm-config {path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"--comm-config {path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--comm-config {path}: {exc}") from None
    except ValueError as exc:  # a value the decoder will not convert (an int of 5,000 digits)
        raise UsageError(f"--comm-config {path}: {exc}") from None
    except RecursionError:
        raise UsageError(f"--comm-config {path}: nested too deep") from None
    found = config.get("comm_patterns", [])
    if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
        raise UsageError(f"--comm-config {path}: comm_patterns must be a list of strings")
    if len(found) > MAX_PATTERNS:
        raise UsageError(f"--comm-config {path}: {len(found)} comm_patterns, at most "
                         f"{MAX_PATTERNS}")
    return tuple(found)


def _checked_patterns(patterns: tuple[str, ...],
                      origins: Sequence[str] = ()) -> tuple[str, ...]:
    """``patterns`` if each is a regex the classification can run, compiled on its own and in
    the group ``with_comm_patterns`` puts it in; else a one-line usage error naming where
    the pattern came from (``origins``, one per pattern: ``--comm-pattern`` or
    ``--comm-config FILE``)."""
    if len(patterns) > MAX_PATTERNS:
        raise UsageError(f"--comm-pattern: {len(patterns)} patterns, at most {MAX_PATTERNS}")
    for i, p in enumerate(patterns):
        origin = origins[i] if i < len(origins) else "--comm-pattern"
        shown = p if len(p) <= 80 else p[:77] + "..."
        if len(p) > MAX_PATTERN_CHARS:
            raise UsageError(f"{origin}: pattern {shown!r} is longer than "
                             f"{MAX_PATTERN_CHARS} characters")
        try:
            pl.select(pl.lit("").str.contains(p))
            # and in the group it will stand in: a verbose-mode comment, "(?x)nccl #",
            # compiles alone and eats the group's closing bracket
            pl.select(pl.lit("").str.contains(f"(?:{p})|x"))
        except pl.exceptions.PolarsError as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            why = next((line for line in lines if line.startswith("error:")),
                       lines[0] if lines else type(exc).__name__)
            raise UsageError(f"{origin}: pattern {shown!r} is not a valid regex: {why}") \
                from None
    try:  # the rules as one regex, as the classification runs them
        pl.select(pl.lit("").str.contains(with_comm_patterns(patterns).comm))
    except pl.exceptions.PolarsError:
        raise UsageError(f"--comm-pattern: the {len(patterns)} patterns together are too "
                         "large a regex") from None
    return patterns

