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
from traceview.parsers._buffers import dictionary_codes, integers, remembered
from traceview.schema import GPU_STREAM_KINDS, RUNTIME_KINDS, STEP_PATTERN

#: Imported on first use (~0.1-0.2 s): most commands never need it (log 41 of docs/performance.md).
np = lazy_module("numpy")
pa = lazy_module("pyarrow")


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
    The columns are read through their Arrow buffers and the kinds and names once per
    distinct value (:class:`_KeyColumns`): each Polars call cost ~0.2 ms, and a file of a few
    KB made ~16 of them (log 45).
    """

    def __init__(self, events: pl.DataFrame | pa.Table) -> None:
        self._keys = _KeyColumns(events)
        markers, number, number_ok = self._keys.step_markers()
        #: step markers whose number is beyond int64: passed over (their rows have no step)
        self.oversized = int((~number_ok).sum())
        #: per rank: range starts (sorted), ends and step numbers
        self._ranges = self._keys.ranges(markers[number_ok], number[number_ok])
        self._column: pl.Series | None = None

    @property
    def keys(self) -> _KeyColumns:
        """The key columns as numpy arrays (``rank_facts`` counts kinds and launches on them)."""
        return self._keys

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
        step = self._containing(keys.ts, keys.ts_ok, keys.rank)
        launches = self._first_launches()
        if launches is not None:
            self._through_launches(launches, step)
        return _int64_series("step", step, step >= 0)

    def _containing(self, ts: np.ndarray, ts_ok: np.ndarray, rank: np.ndarray,
                    chunk: int = 1 << 18) -> np.ndarray:
        """The step whose range contains each row's start, on the row's rank (else -1; step
        numbers are >= 0). Rows go through in chunks, so the temporaries stay small."""
        out = np.full(len(ts), -1, dtype=np.int64)
        for start in range(0, len(ts), chunk):
            at = np.where(ts_ok[start:start + chunk], ts[start:start + chunk], -1 << 62)
            on = rank[start:start + chunk]
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
        rows = np.flatnonzero(keys.of_kinds(RUNTIME_KINDS) & keys.correlation_ok)
        if not len(rows):
            return None
        rank, corr, ts, ts_ok = keys.rank[rows], keys.correlation[rows], keys.ts[rows], \
            keys.ts_ok[rows]
        order = np.lexsort((np.where(ts_ok, ts, 0), corr, rank))
        step = self._containing(ts, ts_ok, rank)[order]
        rank, corr = rank[order], corr[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (rank[1:] != rank[:-1]) | (corr[1:] != corr[:-1])
        return rank[first], corr[first], step[first]

    def _through_launches(self, launches: tuple[np.ndarray, np.ndarray, np.ndarray],
                          step: np.ndarray) -> None:
        """GPU rows (with a correlation) take the step of the runtime call that launched them,
        where that call has a step. Sets ``step`` in place."""
        launch_rank, launch_corr, launch_step = launches
        keys = self._keys
        gpus = np.flatnonzero(keys.of_kinds(GPU_STREAM_KINDS) & keys.correlation_ok)
        if not len(gpus):
            return
        rank, corr = keys.rank[gpus], keys.correlation[gpus]
        at = np.minimum(_search_pairs(launch_rank, launch_corr, rank, corr),
                        len(launch_rank) - 1)
        take = (launch_rank[at] == rank) & (launch_corr[at] == corr) & (launch_step[at] >= 0)
        step[gpus[take]] = launch_step[at][take]


class _KeyColumns:
    """The columns steps are worked out from, as numpy arrays read from their Arrow buffers:
    rank (null: -1), ts_ns and correlation (each with its validity), and kind and name as
    codes into their distinct values, so that a text test runs once per value. From an Arrow
    table (a parser's keys) the dictionaries are read as they are; a Polars Categorical hands
    its column over rebuilt (~8 ms per 1 M rows)."""

    def __init__(self, events: pl.DataFrame | pa.Table) -> None:
        def column(name: str) -> pa.Array | pa.ChunkedArray:
            if isinstance(events, pl.DataFrame):
                return events.get_column(name).to_arrow()
            return events.column(name)

        self.height = events.height if isinstance(events, pl.DataFrame) else events.num_rows
        self.rank, self.rank_ok = integers(column("rank"), fill=-1)
        self.ts, self.ts_ok = integers(column("ts_ns"))
        self.correlation, self.correlation_ok = integers(column("correlation"))
        self._dur = column("dur_ns")  # read for the markers only
        self._kind, self._kinds = _text_codes(column("kind"))
        self._name, self._names = _text_codes(column("name"))

    @property
    def kind_codes(self) -> tuple[np.ndarray, list[str]]:
        """Each row's kind as a code into the distinct kinds (a null kind: ``len(kinds)``)."""
        return self._kind, self._kinds

    def durations(self) -> tuple[np.ndarray, np.ndarray]:
        """``dur_ns`` and its validity."""
        return integers(self._dur)

    def of_kinds(self, kinds: tuple[str, ...]) -> np.ndarray:
        """Whether each row's kind is one of ``kinds`` (a null kind is none)."""
        return np.array([k in kinds for k in self._kinds] + [False])[self._kind]

    def step_markers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows that are step markers (user annotations or NVTX ranges named
        ``ProfilerStep#N``, as :func:`step_ranges` selects them), their step numbers, and
        whether int64 holds each number."""
        rows = np.flatnonzero(self.of_kinds(("user_annotation", "nvtx")))
        facts = _steps_of_names(self._names)
        named = np.array([marker for marker, _ in facts] + [False])
        rows = rows[named[self._name[rows]]]
        name = self._name[rows]
        number = np.array([n or 0 for _, n in facts] + [0], dtype=np.int64)[name]
        return rows, number, np.array([n is not None for _, n in facts] + [False])[name]

    def ranges(self, markers: np.ndarray, number: np.ndarray
               ) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per rank, the step ranges of the marker rows ``markers`` (numbered ``number``):
        starts (ascending), ends, numbers. A marker without a rank or a time contains no row.
        Ties of start keep the rows' order."""
        placed = self.rank_ok[markers] & self.ts_ok[markers]
        rows, number = markers[placed], number[placed]
        rank, start = self.rank[rows], self.ts[rows]
        dur, dur_ok = integers(self._dur)
        end = start + np.where(dur_ok[rows], dur[rows], 0)
        order = np.lexsort((start, rank))
        rank, start, end, number = rank[order], start[order], end[order], number[order]
        cuts = np.flatnonzero(rank[1:] != rank[:-1]) + 1
        return {int(r[0]): (s, e, n) for r, s, e, n in zip(
            np.split(rank, cuts), np.split(start, cuts), np.split(end, cuts),
            np.split(number, cuts), strict=True) if len(r)}


#: (is it a step marker's name, its step number or None beyond int64) of each name met by
#: this process
_STEP_OF_NAME: dict[str, tuple[bool, int | None]] = {}


def _steps_of_names(names: list[str]) -> list[tuple[bool, int | None]]:
    """For each name, whether it is a ``ProfilerStep#N`` marker's and N (None past int64),
    read by Polars' regex as :func:`step_ranges` reads it; each name once per process."""
    return remembered(_STEP_OF_NAME, names, _work_out_steps)


def _work_out_steps(names: list[str]) -> list[tuple[bool, int | None]]:
    v = pl.col("v")
    return list(pl.DataFrame({"v": names}, schema={"v": pl.String}).select(
        v.str.contains(STEP_PATTERN).alias("marker"),
        v.str.extract(STEP_PATTERN).cast(pl.Int64, strict=False).alias("number")).iter_rows())


def _text_codes(array: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A text column as (each row's code into the distinct values, the distinct values); a
    null row's code is ``len(values)``."""
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else _one_dictionary(array)
    if not pa.types.is_dictionary(array.type):
        array = _one_dictionary(array)
    return dictionary_codes(array), array.dictionary.to_pylist()


def _one_dictionary(array: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    """Text, or several chunks of dictionary text, as one dictionary array (through Polars;
    pyarrow's own would import ``pyarrow.compute``)."""
    series = pl.from_arrow(pa.table({"v": array})).to_series()
    return series.cast(pl.String).cast(pl.Categorical).to_arrow()


def _int64_series(name: str, values: np.ndarray, valid: np.ndarray) -> pl.Series:
    """An Int64 Series of ``values``, null where ``valid`` is false (built on Arrow buffers)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    array = pa.Array.from_buffers(pa.int64(), len(values), [bitmap, pa.py_buffer(values)])
    # through a table: pl.Series(name, array) imports pyarrow.compute (~0.2 s a process)
    return pl.from_arrow(pa.Table.from_arrays([array], names=[name])).to_series()


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
