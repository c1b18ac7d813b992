"""Which profiler step each event belongs to.

Steps are the ``ProfilerStep#N`` ranges (Kineto user annotations, or NVTX ranges of that name in
nsys). A host event belongs to the step whose range contains its start, on any thread of the
rank (the backward thread's ops belong to the step too). A GPU event belongs to the step of the
runtime call that launched it (same ``correlation``): GPU work runs late, so containment in time
would credit it to the wrong step. GPU events with no launching call found fall back to time
containment, which is the best the trace allows.

>>> from traceview.schema import events_frame
>>> ev = events_frame([
...   dict(rank=0, file_id=0, source="kineto", kind="user_annotation", name="ProfilerStep#3",
...        ts_ns=0, dur_ns=100),
...   dict(rank=0, file_id=0, source="kineto", kind="cuda_runtime", name="cudaLaunchKernel",
...        ts_ns=90, dur_ns=5, correlation=7),
...   dict(rank=0, file_id=0, source="kineto", kind="kernel", name="k", ts_ns=150, dur_ns=5,
...        correlation=7)])
>>> assign_steps(ev)["step"].to_list()
[3, 3, 3]
"""

from __future__ import annotations

import polars as pl

from traceview._dependencies import lazy_module
from traceview.schema import GPU_STREAM_KINDS, RUNTIME_KINDS, STEP_PATTERN

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")


def step_ranges(events: pl.DataFrame | pl.LazyFrame) -> pl.LazyFrame:
    """One row per step and rank: rank, step, step_start_ns, step_end_ns. ``step`` is null
    where the marker's number is beyond int64 (no step: :class:`StepsOfRows` passes it over)."""
    return (
        events.lazy()
        .filter(pl.col("kind").is_in(["user_annotation", "nvtx"])
                & pl.col("name").cast(pl.String).str.contains(STEP_PATTERN))
        .select(
            "rank",
            pl.col("name").cast(pl.String).str.extract(STEP_PATTERN)
            .cast(pl.Int64, strict=False).alias("step"),
            pl.col("ts_ns").alias("step_start_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("step_end_ns"),
        )
        .sort("rank", "step_start_ns")
    )


def step_of_events(events: pl.DataFrame) -> pl.Series:
    """The step of every row of ``events`` (Int64, null outside every step), in row order.

    Works on the few columns it needs (rank, kind, name, ts_ns, dur_ns, correlation); see
    :class:`StepsOfRows`, which answers the same for any range of rows.
    """
    return StepsOfRows(events).rows(0, events.height)


class StepsOfRows:
    """The step of any range of rows of one events table.

    What needs the whole table is small and found first: the step ranges, and the step of the
    earliest runtime call of each (rank, correlation), which its GPU rows take. The first
    range asked for then works out the step of every row at once, by binary search in numpy
    over whole columns (~0.05 s for 1 M rows), and each range is a slice of that column: done
    batch by batch, the conversions and the Polars expression per batch cost more than the
    searches themselves (0.09-0.2 CPU s of a 260 MB ingest; docs/performance.md, log 42).
    """

    def __init__(self, events: pl.DataFrame) -> None:
        self._keys = events.select("rank", "kind", "name", "ts_ns", "dur_ns", "correlation")
        steps = step_ranges(self._keys).collect()
        #: step markers whose number is beyond int64: passed over (their rows have no step)
        self.oversized = steps.get_column("step").null_count()
        steps = steps.drop_nulls("step")
        #: per rank: range starts (sorted), ends and step numbers
        self._ranges = {r: tuple(group.sort("step_start_ns", maintain_order=True)
                                 .get_column(c).to_numpy()
                                 for c in ("step_start_ns", "step_end_ns", "step"))
                        for (r,), group in steps.group_by("rank")}
        self._launches = self._first_launches() if self._ranges else None
        self._column: pl.Series | None = None

    def rows(self, start: int, stop: int) -> pl.Series:
        """Steps of rows ``[start, stop)`` (Int64, null outside every step)."""
        return self.column().slice(start, stop - start)

    def column(self) -> pl.Series:
        """Steps of every row (Int64, null outside every step), worked out on first use."""
        if self._column is None:
            self._column = self._every_row()
        return self._column

    def _every_row(self) -> pl.Series:
        keys = self._keys
        if not self._ranges:
            return pl.repeat(None, keys.height, dtype=pl.Int64, eager=True).alias("step")
        step = self._containing(keys.get_column("ts_ns"), keys.get_column("rank"))
        if self._launches is not None:
            self._through_launches(keys, step)
        return (pl.DataFrame({"s": step})
                .select(pl.when(pl.col("s") >= 0).then(pl.col("s")).alias("step")).to_series())

    def _containing(self, ts: pl.Series, rank: pl.Series, chunk: int = 1 << 18) -> np.ndarray:
        """The step whose range contains each row's start, on the row's rank (else -1; step
        numbers are >= 0). Rows go through in chunks, so the temporaries stay small."""
        out = np.full(len(ts), -1, dtype=np.int64)
        for start in range(0, len(ts), chunk):
            at = ts.slice(start, chunk).fill_null(-1 << 62).to_numpy()
            on = rank.slice(start, chunk).fill_null(-1).to_numpy()
            for r, (starts, ends, numbers) in self._ranges.items():
                i = np.searchsorted(starts, at, side="right") - 1
                inside = (i >= 0) & (on == r) & (at < ends[np.maximum(i, 0)])
                rows = np.flatnonzero(inside)
                out[start + rows] = numbers[i[rows]]
        return out

    def _first_launches(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The earliest runtime call of each (rank, correlation), sorted by them, with its step:
        (ranks, correlations, steps). None when there are none."""
        keys = self._keys
        rows = keys.select("rank", "correlation", "ts_ns").filter(
            keys.get_column("kind").is_in(RUNTIME_KINDS)
            & keys.get_column("correlation").is_not_null())  # names too: 7x slower (cold)
        if rows.is_empty():
            return None
        rank = rows.get_column("rank").fill_null(-1).to_numpy()
        corr = rows.get_column("correlation").to_numpy()
        ts = rows.get_column("ts_ns").fill_null(0).to_numpy()
        order = np.lexsort((ts, corr, rank))
        rank, corr = rank[order], corr[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (rank[1:] != rank[:-1]) | (corr[1:] != corr[:-1])
        step = self._containing(rows.get_column("ts_ns"), rows.get_column("rank"))[order]
        return rank[first], corr[first], step[first]

    def _through_launches(self, keys: pl.DataFrame, step: np.ndarray) -> None:
        """GPU rows (with a correlation) take the step of the runtime call that launched them,
        where that call has a step. Sets ``step`` in place."""
        launch_rank, launch_corr, launch_step = self._launches
        corr = keys.get_column("correlation")
        gpus = np.flatnonzero((keys.get_column("kind").is_in(GPU_STREAM_KINDS)
                               & corr.is_not_null()).to_numpy())
        if not len(gpus):
            return
        rank = keys.get_column("rank").fill_null(-1).to_numpy()[gpus]
        corr = corr.fill_null(0).to_numpy()[gpus]
        at = np.minimum(_search_pairs(launch_rank, launch_corr, rank, corr),
                        len(launch_rank) - 1)
        take = (launch_rank[at] == rank) & (launch_corr[at] == corr) & (launch_step[at] >= 0)
        step[gpus[take]] = launch_step[at][take]


def _search_pairs(sorted_rank: np.ndarray, sorted_corr: np.ndarray, rank: np.ndarray,
                  corr: np.ndarray) -> np.ndarray:
    """searchsorted over (rank, correlation) pairs sorted by rank, then correlation."""
    at = np.zeros(len(rank), dtype=np.int64)
    # one rank per file is the rule; np.unique's first call costs ~10 ms of imports
    ranks = rank[:1] if len(rank) and rank.min() == rank.max() else np.unique(rank)
    for r in ranks:
        lo, hi = np.searchsorted(sorted_rank, [r, r + 1])
        rows = np.flatnonzero(rank == r)
        at[rows] = lo + np.searchsorted(sorted_corr[lo:hi], corr[rows])
    return at


def assign_steps(events: pl.DataFrame) -> pl.DataFrame:
    """``events`` with its ``step`` column filled (null outside every step)."""
    return events.with_columns(step_of_events(events))
