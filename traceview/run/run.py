"""Run: one window of one trace set, the only place where analyses are wired together.

``traceview.open(PATH, ranks=, steps=, time=, skip_warmup=, align=)`` gives a Run. It computes
each shared table once, on first use, and hands it to every analysis that names it:

* ``events``: the window's events, every column (what ``sql`` and pandas see);
* ``gpu``: classified GPU rows (``analyses.overlap.prepared_gpu``), kept on disk;
* ``host``: host rows: launches, syncs, ops, annotations (``analyses.host``);
* ``steps``: host ``ProfilerStep`` ranges (``analyses.window.step_spans``);
* ``ranks_table``: the window's ranks with events (from the files' footers where they tell);
* ``match``: collective calls paired across ranks, with the problems found;
* ``offsets``: per-rank clock offsets, drift and uncertainty, from the ranks' whole traces;
* ``collective_ranks``: one row per (collective instance, rank) on the aligned timeline;
* ``overlap_rows``: whole-trace compute/communication accounting per (rank, device);
* ``gap_rows()``: GPU idle gaps with their causes, once per option set;
* ``memory_levels``: every allocator event with the bytes allocated after it (the memory
  timeline);
* ``warnings``: what the input files said about the data (``table_warnings``: what the match
  and the alignment said).

Every analysis command NAME is a method ``run.NAME(**options)`` returning a
:class:`~traceview.run.result.Result` whose ``to_dict()`` is ``traceview NAME PATH --json``:
the CLI is ``run.NAME`` and a renderer, so the two cannot disagree. The methods come from one
table, ``traceview.run.registry`` (which the CLI reads too), and are written in the run
room's modules by group (``timeline``, ``distributed``, ``diagnosis``, ``ops``, ``memory``);
this module keeps the window and the shared tables. Clock alignment applies by default
(``align="auto"``), in Python as on the command line.

>>> import traceview                                       # doctest: +SKIP
>>> run = traceview.open("fixtures/data/gloo_ddp_2r")      # doctest: +SKIP
>>> run.stragglers().to_polars()                           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import cached_property
from html import escape
from pathlib import Path
from typing import Any

import polars as pl

from traceview import selection
from traceview.analyses.align import apply_offsets, estimate_offsets
from traceview.analyses.collective_match import P2P, comm_events, match_collectives
from traceview.analyses.collectives import collective_ranks
from traceview.analyses.critical_path import critical_path
from traceview.analyses.dependency_graph import culprits, sync_points
from traceview.analyses.flops import achieved_flops
from traceview.analyses.gaps import GapOptions, gaps
from traceview.analyses.host import host_events
from traceview.analyses.launches import unlaunched_gpu
from traceview.analyses.memory import memory_levels
from traceview.analyses.nodes import rank_nodes
from traceview.analyses.op_kernels import op_kernel_times
from traceview.analyses.op_models import family
from traceview.analyses.ops import op_args
from traceview.analyses.overlap import overlap, prepared_gpu
from traceview.analyses.p2p import p2p_calls, p2p_sync_rows, pair_p2p
from traceview.analyses.path_summary import path_warnings
from traceview.analyses.run_bound import run_bound
from traceview.analyses.stragglers import stragglers
from traceview.analyses.window import Window, ranks_present, select, step_spans
from traceview.errors import UsageError
from traceview.parsers import flight_recorder
from traceview.run.compare import diff_tables, run_tables
from traceview.run.diagnosis import path_collectives
from traceview.run.distributed import alltoall_of, nccl_log_view, pipeline_of
from traceview.run.graph_capture import attribute_replays
from traceview.run.hang import hang_result
from traceview.run.methods import method_of
from traceview.run.ops import device_name
from traceview.run.options import RunOptions
from traceview.run.registry import ANALYSES, Analysis
from traceview.run.replay import replay_of, replay_verdict
from traceview.run.result import Result, to_pandas
from traceview.run.table_warnings import plain_table_warnings, table_warnings
from traceview.run.window_checks import check_window_not_empty, steps_short_note
from traceview.store import derived, traceset
from traceview.store.traceset import TraceSet

__all__ = ["ANALYSES", "Analysis", "Result", "Run", "RunOptions", "as_run", "hang", "open",
           "register", "registered", "unregister"]


class Run:
    """One window of one :class:`~traceview.store.traceset.TraceSet` (see the module docstring)."""

    def __init__(self, traceset: TraceSet, options: RunOptions = RunOptions()) -> None:
        self.traceset = traceset
        self.options = options
        self.window = options.window(traceset.ranks["rank"].to_list())
        self._gaps: dict[tuple[bool, int], pl.DataFrame] = {}

    @classmethod
    def from_events(cls, events: pl.LazyFrame | pl.DataFrame, *,
                    ranks_table: pl.DataFrame | None = None, **options: Any) -> Run:
        """A Run over events already in memory; ``ranks_table``: their ranks table (hosts
        for clock alignment), ``options``: :class:`RunOptions`."""
        return cls(TraceSet.from_frame(events, ranks_table), RunOptions(**options))

    def select(self, **changes: Any) -> Run:
        """A Run over another window of the same trace set: ``run.select(steps="5:9")``."""
        return Run(self.traceset, dataclasses.replace(self.options, **changes))

    # --- the window -------------------------------------------------------------------------

    @property
    def whole_ranks(self) -> bool:
        """True when the window is a choice of whole ranks (no steps, time or warm-up cut)."""
        w = self.window
        return w.steps is None and w.time_ns is None and not w.skip_warmup

    @property
    def window_info(self) -> dict[str, Any]:
        """The window as the GPU commands' ``--json`` ``window`` field describes it."""
        return {"ranks": selection.describe_ranks(self.window.ranks),
                "steps": selection.describe_steps(self.window.steps),
                "time": selection.describe_time(self.options.time),
                "skip_warmup": self.window.skip_warmup}

    @cached_property
    def ranks_present(self) -> list[int]:
        """The window's ranks that have events, sorted."""
        self._check_ranks_exist()
        known = self.ranks_with_events()  # from the files' footers: no event read
        if known is not None:
            return known

        return ranks_present(self._analysis_events).get_column("rank").to_list()

    @cached_property
    def ranks_table(self) -> pl.DataFrame:
        """``ranks_present`` as the one-column table (``rank``) the analyses report on."""
        return pl.DataFrame({"rank": self.ranks_present}, schema={"rank": pl.Int32})

    @cached_property
    def _aligned_ranks(self) -> list[int]:
        """The ranks with events in the window's ranks' whole traces (what alignment sees)."""
        if self.whole_ranks:
            return self.ranks_present
        known = self.traceset.ranks_with_events()
        if known is not None:
            wanted = self.window.ranks
            return known if wanted is None else [r for r in known if r in set(wanted)]

        return ranks_present(self._rank_events).get_column("rank").to_list()

    @property
    def events(self) -> pl.LazyFrame:
        """The window's events with every column of ``traceview.schema``."""
        self._check_ranks_exist()
        if not self.whole_ranks:
            self._analysis_events  # noqa: B018 - collected once; raises for an empty window
        return select(self.traceset.events, self.window)

    @cached_property
    def _rank_events(self) -> pl.LazyFrame:
        """The window's ranks, every step: clock alignment reads the ranks' whole traces."""
        self._check_ranks_exist()
        return select(self.traceset.analysis_events(), Window(ranks=self.window.ranks))

    def _check_ranks_exist(self) -> None:
        """A ``ranks`` choice that names none of the run's ranks is a usage error naming the
        ranks there are (from the ranks table: no event is read)."""
        selection.require_known_ranks(self.window.ranks, self.traceset.ranks["rank"].to_list(),
                                      self.options.ranks)

    @property
    def _rank_comm_source(self) -> pl.LazyFrame:
        """The window's ranks, every step, with ``args_json``: collective matching reads the
        recorded shapes of the few backend work items that carry no message size (gloo)."""
        return select(self.traceset.events, Window(ranks=self.window.ranks))

    @cached_property
    def _analysis_events(self) -> pl.LazyFrame:
        """The window's events without ``args_json``: every column an analysis reads.

        Whole ranks stay a lazy scan (each analysis reads only the rows and columns it
        selects); a window of steps or time joins and aggregates over the whole selection, so
        it is collected once rather than in every query."""
        if self.whole_ranks:
            return self._rank_events

        self._check_ranks_exist()
        selected = select(self.traceset.analysis_events(), self.window).collect()
        check_window_not_empty(self, selected)
        self._window_notes = steps_short_note(self, selected)
        return selected.lazy()

    # --- the shared tables --------------------------------------------------------------------

    @cached_property
    def gpu(self) -> pl.DataFrame:
        """Classified GPU rows (``RunOptions.comm_patterns`` applied); without the unlaunched
        ones when ``exclude_unlaunched``."""
        if not self.options.exclude_unlaunched or self.unlaunched.height == 0:
            return self._classified_gpu
        return self._classified_gpu.join(self.unlaunched.select("rank", "correlation"),
                                         on=["rank", "correlation"], how="anti")

    @cached_property
    def _classified_gpu(self) -> pl.DataFrame:
        """Every classified GPU row; for a window of whole ranks, kept in the cache folder
        under a key that names the classification rules."""
        patterns = self.options.classify_patterns()
        return derived.cached("gpu", derived.gpu_definition(patterns), self._kept_inputs,
                              lambda: prepared_gpu(self._analysis_events, patterns=patterns),
                              warn=self.traceset.notes.append)

    @cached_property
    def _kept_inputs(self) -> derived.Inputs | None:
        """What tables derived from the events are kept under: the events files in the cache
        folder, for a window of whole ranks (other windows are collected in memory and
        computed each time)."""
        return derived.inputs_of(self.traceset, self.window.ranks,
                                 self.traceset.cache_dir if self.whole_ranks else None)

    def _kept(self, kind: str, compute: Callable[[], pl.DataFrame], *,
              definition: Any = None) -> pl.DataFrame:
        """``compute()``, a table of the window's events under the run's classification
        rules (and ``definition``), kept in the cache folder by the first command that
        needs it (``traceview.store.derived``)."""
        return derived.cached(kind, self._derivation(definition), self._kept_inputs, compute,
                              warn=self.traceset.notes.append)

    def _derivation(self, definition: Any = None) -> list[Any]:
        """What a kept table depends on besides the events and the code: the GPU rows'
        classification rules, the unlaunched rows left out or not, its own options."""
        return [derived.gpu_definition(self.options.classify_patterns()),
                self.options.exclude_unlaunched, definition]

    @cached_property
    def unlaunched(self) -> pl.DataFrame:
        """GPU rows whose launch is not in the trace (queued before the profiler started)."""
        # The launches from the host rows when a command read them; else from the lazy scan,
        # which reads only the runtime calls' rank and correlation (overlap needs no host row).
        # A window of steps, time or warm-up keeps kernels whose launch (a graph's launch
        # replays its kernels long after) lies before it: launched, earlier, so the launches
        # come from the ranks' whole traces.
        launches = (self.host if "host" in self.__dict__ else self._analysis_events) \
            if self.whole_ranks else self._rank_events
        return self._kept("unlaunched", lambda: unlaunched_gpu(self._classified_gpu, launches))

    @cached_property
    def host(self) -> pl.DataFrame:
        """Host rows the GPU analyses look up (``analyses.host.host_events``)."""
        return host_events(self._analysis_events)

    @cached_property
    def steps(self) -> pl.DataFrame:
        """Host step ranges: ``rank, step, step_start_ns, step_end_ns, step_time_ns``."""
        # From the host rows when a command already read them; else from the events, whose
        # lazy scan reads only the step markers' four columns (the straggler and alignment
        # commands need no other host row, and the whole table costs them ~40% more).
        return self._kept("steps", lambda: step_spans(
            self.host if "host" in self.__dict__ else self._analysis_events))

    @cached_property
    def match(self) -> Any:  # MatchResult
        """The window's collective calls paired across ranks."""
        return match_collectives(self._comm_calls, ranks=self.traceset.ranks,
                                 tolerance_ns=self._tolerance_ns)

    @cached_property
    def _comm_calls(self) -> pl.DataFrame:
        """One row per collective call per rank (``comm_events``: rank-local, so a per-rank
        summary's driver gets them from the ranks' workers)."""
        return comm_events(self.events, ranks=self.ranks_present)

    @cached_property
    def offsets(self) -> pl.DataFrame:
        """Per-rank clock offsets (``traceview.analyses.align.OFFSETS_SCHEMA``), estimated from the
        ranks' whole traces: a window of steps has fewer anchors but the same clocks."""
        whole = self.match if self.whole_ranks else match_collectives(
            comm_events(self._rank_comm_source), ranks=self.traceset.ranks,
            tolerance_ns=self._tolerance_ns)
        return estimate_offsets(whole, self._aligned_ranks, method=self.options.align,
                                reference_rank=self.options.reference_rank,
                                hosts=self.traceset.ranks)

    @cached_property
    def collective_ranks(self) -> pl.DataFrame:
        """One row per (collective instance, rank) on the aligned timeline."""
        return collective_ranks(self.match, offsets=self.offsets, nodes=self.nodes)

    @cached_property
    def nodes(self) -> pl.DataFrame:
        """Each rank's node (``analyses.nodes.rank_nodes``): ``--gpus-per-node``, else the
        host its trace names."""
        return rank_nodes(self.traceset.ranks, gpus_per_node=self.options.gpus_per_node)

    @cached_property
    def overlap_rows(self) -> pl.DataFrame:
        """Whole-trace overlap per (rank, device) (``analyses.overlap.overlap``)."""
        return self._kept("overlap", lambda: overlap(self.gpu, self.ranks_table))

    @cached_property
    def bound(self) -> dict[str, Any]:
        """The run's bound, the one every output names (``analyses.run_bound``): from the
        GPU time of the whole-trace overlap rows, never from the critical path (cheap)."""
        return run_bound(self.overlap_rows)

    @cached_property
    def p2p(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Point-to-point pairs on the aligned timeline and the calls left unpaired
        (``analyses.p2p.pair_p2p``): every send matched to its recv."""
        calls = self._p2p_calls
        if calls.height and len(self.ranks_present) > 1:
            calls = apply_offsets(calls, self.offsets).collect().with_columns(
                end_ns=pl.col("ts_aligned_ns") + pl.col("end_ns") - pl.col("ts_ns"),
                ts_ns="ts_aligned_ns").drop("ts_aligned_ns")
        return pair_p2p(calls)

    @cached_property
    def _p2p_calls(self) -> pl.DataFrame:
        """Send/recv calls on the ranks' own clocks (``p2p_calls``: rank-local)."""
        return p2p_calls(self.events)

    @cached_property
    def _p2p_rows(self) -> pl.DataFrame:
        return p2p_sync_rows(self.p2p[0])

    @cached_property
    def sync_points(self) -> pl.DataFrame:
        """The dependency graph's nodes and edges (``analyses.dependency_graph``): one row per
        (collective instance or send/recv pair, rank), aligned, with its wait, transfer and
        the release that gated it."""
        return sync_points(self.collective_ranks.filter(~pl.col("collective").is_in(list(P2P))),
                           self._p2p_rows)

    @cached_property
    def culprits(self) -> pl.DataFrame:
        """Per instance of the dependency graph: who waited, and whose own time caused it;
        every cross-rank verdict (stragglers, summary's worst, diagnose, the report) reads
        it."""
        return culprits(self.sync_points)

    @cached_property
    def _stragglers(self) -> pl.DataFrame:
        return stragglers(self.collective_ranks, self.steps, self.ranks_table,
                          p2p_rows=self._p2p_rows, graph=self.culprits)

    def gap_rows(self, *, per_stream: bool = False,
                 launch_overhead: str | int = GapOptions.launch_overhead_ns) -> pl.DataFrame:
        """Every GPU idle gap with its cause (``analyses.gaps.gaps``), once per option set."""
        key = (per_stream, selection.parse_duration(launch_overhead))
        if key not in self._gaps:
            self._gaps[key] = self._kept("gaps", lambda: self._found_gaps(*key),
                                         definition=_gap_options(*key))
        return self._gaps[key]

    def _kept_gaps(self) -> bool:
        """True when an earlier command kept the default gap rows (now read): a command
        that needs the host rows only for the gaps then reads none."""
        key = (False, GapOptions.launch_overhead_ns)
        if key not in self._gaps:
            found = derived.kept("gaps", self._derivation(_gap_options(*key)),
                                 self._kept_inputs)
            if found is None:
                return False
            self._gaps[key] = found
        return True

    def _found_gaps(self, per_stream: bool, launch_overhead_ns: int) -> pl.DataFrame:
        with ThreadPoolExecutor(1) as beside:  # the host rows beside the GPU rows
            host = beside.submit(lambda: self.host)
            gpu = self.gpu
            host = host.result()
        return gaps(gpu, host, per_stream=per_stream,
                    options=GapOptions(launch_overhead_ns=launch_overhead_ns))

    @property
    def warnings(self) -> list[str]:
        """What reading the run said: how it was read (``TraceSet.notes``: the cache), then
        ``data_warnings``, then what the window could not give (steps asked past the
        trace's, once the window is read)."""
        return [*self.traceset.notes, *self.data_warnings,
                *self.__dict__.get("_window_notes", ())]

    @property
    def data_warnings(self) -> list[str]:
        """What the run's files said about the data: damaged input, skipped files (what the
        CI gate counts as damaged input)."""
        return [*self.traceset.data_warnings,
                *(f"skipped: {reason}" if reason.startswith(str(path)) else
                  f"{path}: skipped: {reason}" for path, reason in self.traceset.skipped)]

    def table_warnings(self, *tables: str) -> list[str]:
        """What the named shared tables say about the data (``traceview.run.table_warnings``):
        collectives that could not be paired (``match``), send/recv calls without their peer
        (``p2p``), GPU work without its launch (``gpu``), ranks whose clock could not be
        aligned or only poorly (``offsets``)."""
        return table_warnings(self, *tables)

    def plain_table_warnings(self, *tables: str) -> list[str]:
        """``table_warnings`` in plain words (``traceview.run.table_warnings``)."""
        return plain_table_warnings(self, *tables)

    @property
    def _tolerance_ns(self) -> int | None:
        tol = self.options.tolerance_us
        return None if tol is None else int(tol * 1000)

    def _result(self, command: str, fields: dict[str, Any], main: str,
                uses: tuple[str, ...] = ()) -> Result:
        """The command's Result, with the files' warnings and those of the shared tables it
        ``uses`` (named per command, so an answer's warnings never depend on what else was
        asked of the Run before)."""
        # Names in results are plain strings, so `.str.contains` and pandas' `.str` work on
        # them as they are (the store keeps them Categorical; a result's tables are small).
        plain = {k: v.with_columns(pl.col(pl.Categorical).cast(pl.String))
                 if isinstance(v, pl.DataFrame) else v for k, v in fields.items()}
        # the files --skip-bad left out, in every answer (their ranks are missing from it)
        plain["skipped"] = [{"file": f, "error": e} for f, e in self.traceset.skipped]
        warnings = [*self.warnings, *self.table_warnings(*uses)]
        return Result(command, plain, main, tuple(warnings),
                      plain=(*self.warnings, *self.plain_table_warnings(*uses)),
                      reading_notes=tuple(self.traceset.notes))

    # --- the tables the analyses share beyond these (the analyses are methods too: each
    # registered one, installed below from ``traceview.run.registry``) ---------------------

    @cached_property
    def _pipeline(self) -> dict[str, Any]:
        """The pipeline from the send/recv pairs (``traceview.run.distributed.pipeline_of``):
        ``pipeline``, ``diagnose`` and the report read it."""
        return pipeline_of(self)

    @cached_property
    def _alltoall(self) -> dict[str, Any]:
        """The all-to-all answer with its warnings (``traceview.run.distributed.alltoall_of``):
        ``alltoall``, ``diagnose`` and the report read it."""
        return alltoall_of(self)

    @property
    def has_alltoall(self) -> bool:
        """Whether an all-to-all was matched across ranks in the window."""
        inst = self.match.instances
        return bool(inst.height) and bool(
            inst.get_column("collective").cast(pl.String).eq("all_to_all").any())

    #: NCCL debug logs' view of the run (``traceview.run.distributed.nccl_log_view``)
    nccl_log_view = staticmethod(nccl_log_view)

    @cached_property
    def memory_levels(self) -> pl.DataFrame:
        """Every allocator event with the bytes allocated (and reserved) after it, per rank and
        device (``analyses.memory.memory_levels``): the memory timeline."""
        return memory_levels(self.events.filter(pl.col("kind") == "memory"))

    @cached_property
    def path(self) -> Any:  # analyses.critical_path.CriticalPath
        """The critical path across ranks (``analyses.critical_path``), on the aligned
        timeline: its segments (the walk), its pieces with category and step, the steps."""
        many = len(self.ranks_present) > 1
        _ = self.host  # read first: the steps come from it too
        return critical_path(self._path_collectives, self.steps, self.gpu, self.host,
                             offsets=self.offsets if many else None)

    @property
    def _world(self) -> dict[str, int | None]:
        """The job's world size (from the files) and the ranks in the window, when the window
        is the whole job (a choice of ranks leaves the others out on purpose)."""
        if self.window.ranks is not None or "world_size" not in self.ranks.columns:
            return {}
        sizes = self.ranks.get_column("world_size").drop_nulls()
        return {"world_size": int(sizes.max()) if sizes.len() else None,
                "ranks": len(self.ranks_present)}

    @cached_property
    def _path_collectives(self) -> pl.DataFrame:
        """The sync points the critical path can jump through
        (``traceview.run.diagnosis.path_collectives``)."""
        return path_collectives(self)

    @cached_property
    def _path_notes(self) -> tuple[str, ...]:
        """What the critical path could not follow (``path_summary.path_warnings``): both
        ``critical_path`` and ``diagnose`` answer with it."""
        return tuple(path_warnings(self.path, self._path_collectives, **self._world))

    @property
    def _gpu_and_alignment(self) -> tuple[str, ...]:
        """The shared tables whose warnings a GPU answer across ranks carries."""
        return ("gpu", "match", "offsets") if len(self.ranks_present) > 1 else ("gpu",)

    @cached_property
    def replay(self) -> Any:  # analyses.replay.whatif.Replay
        """The window's dependency graph replayed once, with its self-check
        (``traceview.run.replay``); every verdict that reads the replay reads this one."""
        return replay_of(self)

    @cached_property
    def replay_verdict(self) -> dict[str, Any] | None:
        """The replay's culprits and pattern, read by every straggler verdict; None where
        there is nothing worth replaying (``traceview.run.replay.replay_verdict``)."""
        return replay_verdict(self)

    def diff(self, other: Run | str | Path | Iterable[str | Path], *, alpha: float = 0.05,
             top: int = 10, **open_options: Any) -> Result:
        """This run (the base) against ``other`` (the test): a Run, or traces to open with
        this run's window and alignment (``open_options``: how to read them, as
        :func:`open`). Per-step medians with a Mann-Whitney U test, the kernel, operator and
        collective totals per rank-step and the top contributors (``traceview.run.compare``);
        ``to_dict()`` is ``traceview diff BASE TEST --json``. Main table ``metrics``."""
        test = other if isinstance(other, Run) else Run(traceset.open(other, **open_options),
                                                        self.options)
        found = diff_tables(run_tables(self), run_tables(test), alpha=alpha, top=top)
        # both runs' warnings, each naming its file, and what their matches said
        warnings = [*self.warnings, *self.table_warnings("match", "offsets"),
                    *test.warnings, *test.table_warnings("match", "offsets")]
        words = [*self.warnings, *self.plain_table_warnings("match", "offsets"),
                 *test.warnings, *test.plain_table_warnings("match", "offsets")]
        return Result("diff", found.fields(), "metrics", tuple(warnings), plain=tuple(words))

    @cached_property
    def op_instances(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Each op instance that owns GPU time, with its recorded arguments, and each
        launched GPU event with its owner (``analyses.op_kernels``, ``analyses.ops.op_args``):
        what ``ops``, the report's roofline and ``diagnose`` read."""
        return self._op_attribution[:2]

    @cached_property
    def _op_attribution(self) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
        """``op_instances`` and the warnings of charging graph replays to their capture
        (``RunOptions.graph_capture``; ``traceview.run.graph_capture``)."""
        modelled = lambda name: family(name) is not None  # noqa: E731
        instances, kernels = op_kernel_times(self.gpu, self.host, modelled=modelled)
        instances = op_args(self.events, instances)
        if not self.options.graph_capture:
            return instances, kernels, []
        return attribute_replays(self.events, instances, kernels,
                                 self.options.graph_capture, modelled=modelled)

    def flops_per_step(self, *, dtype: str = "bf16", peak: float | None = None,
                       model_flops_per_step: float | None = None) -> pl.DataFrame | None:
        """Achieved TFLOP/s and MFU per rank and step (``analyses.flops.achieved_flops``),
        when the window's host ops carry FLOP counts (``with_flops=True``) or the model's
        FLOPs per step are given; None otherwise. The peak is the first device's of the
        ranks table for ``dtype``, unless ``peak`` (TFLOP/s) is given."""
        events = self._analysis_events
        if model_flops_per_step is None and not events.filter(
                pl.col("flops").is_not_null()).select(pl.len()).collect().item():
            return None
        return achieved_flops(events, device_name=self._device_name(), dtype=dtype, peak=peak,
                              model_flops_per_step=model_flops_per_step)

    def _device_name(self) -> str | None:
        """The first GPU's name in the ranks table (``traceview.run.ops.device_name``)."""
        return device_name(self.ranks)

    # --- the trace set, as a notebook uses it ------------------------------------------------

    @property
    def ranks(self) -> pl.DataFrame:
        """The ranks table (rank, world size, host, backend, clock base ...) of the window."""
        table = self.traceset.ranks
        wanted = self.window.ranks
        return table if wanted is None else table.filter(pl.col("rank").is_in(list(wanted)))

    @property
    def files(self) -> pl.DataFrame:
        return self.traceset.files

    @property
    def windows(self) -> pl.DataFrame:
        """``rank, window, file_id``: each rank's profiling windows (``traceview.store.windows``)."""
        return self.traceset.windows

    def window_spans(self) -> pl.DataFrame:
        """The windows with their file, first and last step and time range."""
        return self.traceset.window_spans()

    @property
    def skipped(self) -> list[tuple[str, str]]:
        return self.traceset.skipped

    @property
    def cache_dir(self) -> str | Path | None:
        return self.traceset.cache_dir

    def ranks_with_events(self) -> list[int] | None:
        """The window's ranks with events, from the files' footers when they can tell (see
        ``TraceSet.ranks_with_events``); None otherwise."""
        known = self.traceset.ranks_with_events()
        if known is None or not self.whole_ranks:
            return None
        wanted = self.window.ranks
        return known if wanted is None else [r for r in known if r in set(wanted)]

    def analysis_events(self) -> pl.LazyFrame:
        """The window's events without ``args_json`` (see ``TraceSet.analysis_events``)."""
        return select(self.traceset.analysis_events(), self.window)

    def kernels(self) -> pl.LazyFrame:
        return self.events.filter(pl.col("kind") == "kernel")

    def sql(self, query: str) -> pl.DataFrame:
        """SQL over the window's ``events``, ``kernels``, ``ranks``, ``files``, ``windows``
        and ``gpu``: the classified GPU rows (``run.gpu``: kernels, copies and sets with
        ``gpu_class`` compute/comm/memcpy/memset and ``gpu_subclass``), made only when the
        query names it."""
        gpu = {"gpu": lambda: self.gpu.lazy()}
        if self.window == type(self.window)():
            return self.traceset.sql(query, tables=gpu)
        return self.traceset.sql(query, events=self.events, tables=gpu)

    def to_pandas(self) -> Any:
        """The window's events in pandas: categoricals stay categorical, integer columns with
        missing values stay integers (nullable ``Int32``/``Int64``, as Result tables)."""
        return to_pandas(self.events.collect())

    def write_store(self, out_dir: str | Path) -> Path | str:
        """Write the trace set as a self-contained store folder (see ``TraceSet``)."""
        return self.traceset.write_store(out_dir)

    def __dir__(self) -> Iterable[str]:
        return sorted({*super().__dir__(), *ANALYSES, "diff"})

    def __repr__(self) -> str:
        w = {k: v for k, v in self.window_info.items() if v}
        where = f" window {w}" if w else ""
        return f"<Run {len(self.ranks_present)} ranks{where} of {self.traceset!r}>"

    def _repr_html_(self) -> str:
        return f"<p>{escape(repr(self))}</p>" + self.traceset._repr_html_()



# The analyses: one method each, ``run.NAME(**options) -> Result``, from the one table of them
# (``traceview.run.registry``), which the command line and the report read too.
for _analysis in ANALYSES.values():
    setattr(Run, _analysis.name, method_of(_analysis))
del _analysis


def register(analysis: Analysis) -> None:
    """Add ``analysis`` to the table of analyses (``traceview.run.registry``) after this
    module was imported (a plugin's, a test's): a method of every Run, a command of the
    command line and, with ``report=True``, a section of the report. Its name must be new."""
    if analysis.name in ANALYSES or hasattr(Run, analysis.name):
        raise ValueError(f"analysis {analysis.name!r}: the name is taken")
    method = method_of(analysis)  # an unknown function fails here, before the table changes
    ANALYSES[analysis.name] = analysis
    setattr(Run, analysis.name, method)


def unregister(name: str) -> None:
    """Take the analysis ``name`` out of the table, and its method off the Run."""
    del ANALYSES[name]
    delattr(Run, name)


@contextmanager
def registered(analysis: Analysis) -> Iterator[Analysis]:
    """``analysis`` registered for the ``with`` block only."""
    register(analysis)
    try:
        yield analysis
    finally:
        unregister(analysis.name)


def _gap_options(per_stream: bool, launch_overhead_ns: int) -> list[Any]:
    """The gap rows' options, as a kept table's definition names them."""
    return [per_stream, dataclasses.asdict(GapOptions(launch_overhead_ns=launch_overhead_ns))]


def as_run(source: Run | pl.LazyFrame | pl.DataFrame, **options: Any) -> Run:
    """``source`` as a Run: a Run as it is, events in memory through :meth:`Run.from_events`
    (what the report, the gate and the exports take from a notebook's frame)."""
    return source if isinstance(source, Run) else Run.from_events(source, **options)


def open(paths: str | Path | Iterable[str | Path], *,  # noqa: A001 - as the builtin, by design
         ranks: str | Sequence[int] | None = None,
         steps: str | tuple[int | None, int | None] | range | None = None,
         time: str | tuple[int | None, int | None] | None = None, skip_warmup: int = 0,
         align: str = "auto", reference_rank: int | None = None,
         tolerance_us: float | None = None, exclude_unlaunched: bool = False,
         comm_patterns: Sequence[str] = (), comm_config: str | Path | None = None,
         gpus_per_node: int | None = None,
         graph_capture: str | Path | Sequence[str | Path] = (), **open_options: Any) -> Run:
    """Open traces (files, folders of per-rank traces, a store folder or URL) as a Run.

    The window, alignment and classification keywords are :class:`RunOptions`; the others
    (``skip_bad``, ``rank_map``, ``cache``, ``cache_dir``, ``progress``, ``executor``,
    ``scheduler``, ``options``, ``window``, ``run_of``) are how the files are read (:func:`traceview.store.traceset.open`).
    """
    options = RunOptions(ranks=ranks, steps=steps, time=time, skip_warmup=skip_warmup,
                         align=align, reference_rank=reference_rank, tolerance_us=tolerance_us,
                         exclude_unlaunched=exclude_unlaunched,
                         comm_patterns=tuple(comm_patterns), comm_config=comm_config,
                         gpus_per_node=gpus_per_node, graph_capture=graph_capture)  # type: ignore[arg-type]
    options.check()  # a bad option fails before any file is read
    named = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if named and all(flight_recorder.looks_like_dumps(p) for p in named):
        raise UsageError(f"{', '.join(map(str, named))}: flight-recorder dumps, not traces: "
                         f"traceview.hang(PATHS) (or `traceview hang DUMPS`) reads them")
    return Run(traceset.open(paths, **open_options), options)


def hang(paths: str | Path | Iterable[str | Path], *, world_size: int | None = None) -> Result:
    """Why a job hung, from flight-recorder dumps (``traceview hang DUMPS --json``;
    ``traceview.run.hang``): per process group the last collective all completed, the
    culprit ranks, mismatches and missing dumps."""
    named = [paths] if isinstance(paths, (str, Path)) else list(paths)
    return hang_result(named, world_size=world_size)
