"""What the ``ingest`` and ``info`` reports say of each rank of a file, learnt from the parse's
key columns before its events are written: the events of each kind, the first start, last end
and steps of the file's events, and the GPU events whose launch is not in the trace. Reading
them back from the events file the ingest has just written cost a 260 MB trace's report 0.19
CPU s of its ~1.8 (docs/performance.md, log 53); here they cost a few numpy passes over
columns already in memory (the step assignment's, ``steps.StepsOfRows``).

The counts follow the analyses' definitions (``classify.gpu_events``: a row of a GPU kind
with a duration >= 0; ``launches.unlaunched_gpu``: with a correlation id that no runtime call
of its rank carries). Rows of kind ``other`` are GPU work or launches by their category (another
accelerator's), which the keys do not hold: their categories are noted on the batches' way to
the writer (``OtherCategories``), and a file where one of them counts has no facts: its report
reads the events back as before. ``tests/test_rank_facts.py`` checks that both ways agree on real
traces. Facts are keyed by the rank as parsed (text: a JSON key); ``by_final_rank`` maps them
to the final ranks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from traceview._dependencies import lazy_module
from traceview.analyses.classify import DEFAULT_PATTERNS, GPU_CATEGORIES
from traceview.parsers._buffers import dictionary_codes
from traceview.schema import (
    ACCELERATOR_DEVICE_CATEGORIES,
    ACCELERATOR_RUNTIME_CATEGORIES,
    GPU_KINDS,
    RUNTIME_KINDS,
)
from traceview.store.steps import StepsOfRows

#: On first use: ingest.py imports this module, and a summary from the cache needs no numpy
#: (tests/test_startup.py).
np = lazy_module("numpy")


#: Rows per pass: the temporaries of a pass are reused by the next (on this VM a first-touched
#: page costs ~5 us: whole-column temporaries made these facts cost 0.25 s, passes 0.03 s).
_PASS_ROWS = 1 << 16


#: Categories that make a row of kind ``other`` GPU work or a launch (``classify._gpu_kind``,
#: ``launches.is_runtime_call``): a file with such rows has no facts.
_TELLING_CATEGORIES = frozenset({*GPU_CATEGORIES, *ACCELERATOR_DEVICE_CATEGORIES,
                                 *ACCELERATOR_RUNTIME_CATEGORIES})


class OtherCategories:
    """The categories of a file's rows of kind ``other``, noted as its batches pass to the
    writer (:meth:`seen`), only when the keys say it has such rows (most files: none; TraceLens's
    H100 traces: two ``overhead`` rows)."""

    def __init__(self, steps: StepsOfRows) -> None:
        codes, kinds = steps.keys.kind_codes
        self.wanted = "other" in kinds and bool((codes == kinds.index("other")).any())
        self.found: set[str | None] = set()

    def seen(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches`` as they are, each noted on its way."""
        for table in batches:
            self.note(table)
            yield table

    def note(self, table: Any) -> None:
        """Note the categories of ``table``'s rows of kind ``other`` (an Arrow table)."""
        if not self.wanted:
            return
        kind, category = table.column("kind"), table.column("category")
        for k, c in zip(kind.chunks, category.chunks, strict=True):
            # the dictionary's values listed, not Array.index: that imports pyarrow.compute
            # (~0.2 s a process, log 53)
            rows = (dictionary_codes(k) == _position(k.dictionary.to_pylist(), "other")
                    if hasattr(k, "dictionary") else
                    k.to_numpy(zero_copy_only=False) == "other")
            if rows.any():
                self.found.update(_category_values(c, rows))


def _position(values: list[Any], value: Any) -> int:
    return values.index(value) if value in values else -1


def _category_values(column: Any, rows: np.ndarray) -> list[str | None]:
    if hasattr(column, "dictionary"):
        codes = np.unique(dictionary_codes(column)[rows])
        values = [*column.dictionary.to_pylist(), None]
        return [values[i] for i in codes]
    return sorted(set(column.to_numpy(zero_copy_only=False)[rows]), key=str)


def rank_facts(steps: StepsOfRows, others: OtherCategories | None = None
               ) -> dict[str, dict[str, Any]] | None:
    """Parsed rank -> ``kinds`` (kind -> events), ``span`` (``start_ns``, ``end_ns``,
    ``first_step``, ``last_step``) and ``unlaunched_gpu_events``; None when the keys cannot
    tell: rows of kind ``other`` whose category makes them GPU work or launches (or whose
    categories were not noted: ``others``), or GPU names the classification ignores."""
    keys = steps.keys
    codes, kinds = keys.kind_codes
    of = [*kinds, None]
    every = np.bincount(codes, minlength=len(of))  # the kinds are an enumeration: most absent
    if DEFAULT_PATTERNS.ignore:
        return None
    if "other" in kinds and every[kinds.index("other")]:
        told = {str(c).lower() for c in (others.found if others else {"unknown"})}
        if others is None or not others.found or told & _TELLING_CATEGORIES:
            return None
    if not keys.height:
        return {}
    gpu_kind = np.array([k in GPU_KINDS for k in of[:-1]] + [False])
    runtime_kind = np.array([k in RUNTIME_KINDS for k in of[:-1]] + [False])
    dur, dur_ok = keys.durations()
    step = steps.column()
    one_rank = keys.rank.min() == keys.rank.max()  # every Kineto file: no sort, no mask
    out: dict[str, dict[str, Any]] = {}
    for rank in keys.rank[:1] if one_rank else np.unique(keys.rank):
        rows = None if one_rank else keys.rank == rank
        start, end = _INT64_MAX, _INT64_MIN
        gpu_ids, call_ids = [], []
        for a in range(0, keys.height, _PASS_ROWS):
            part = slice(a, a + _PASS_ROWS)
            timed = keys.ts_ok[part] if rows is None else keys.ts_ok[part] & rows[part]
            ts, d, d_ok = keys.ts[part], dur[part], dur_ok[part]
            start = min(start, ts.min(where=timed, initial=_INT64_MAX))
            end = max(end, ts.max(where=timed & ~d_ok, initial=_INT64_MIN),
                      (ts + d).max(where=timed & d_ok, initial=_INT64_MIN))
            kind = codes[part]
            linked = keys.correlation_ok[part] if rows is None else \
                keys.correlation_ok[part] & rows[part]
            correlation = keys.correlation[part]
            gpu_ids.append(correlation[gpu_kind[kind] & d_ok & (d >= 0) & linked])
            call_ids.append(correlation[runtime_kind[kind] & linked])
        counts = every if rows is None else np.bincount(codes[rows], minlength=len(of))
        steps_of = step if rows is None else step.filter(rows)
        has_time = start != _INT64_MAX
        out[str(rank) if rank >= 0 else "None"] = {
            "kinds": {of[i]: int(n) for i, n in enumerate(counts) if n and of[i] is not None},
            "span": {"start_ns": int(start) if has_time else None,
                     "end_ns": int(end) if has_time else None,
                     "first_step": steps_of.min(), "last_step": steps_of.max()},
            "unlaunched_gpu_events": _unlaunched(np.concatenate(gpu_ids),
                                                 np.concatenate(call_ids))}
    return out


_INT64_MAX, _INT64_MIN = (1 << 63) - 1, -(1 << 63)  # numpy's int64 bounds, without importing it


def _unlaunched(gpu: np.ndarray, calls: np.ndarray) -> int:
    """GPU events (their correlation ids) whose id no runtime call carries: a sort and a
    binary search (``np.isin`` hashes both sides: 0.14 s for 1.4 M rows, this 0.02 s)."""
    if not len(gpu):
        return 0
    if not len(calls):
        return len(gpu)
    launched = np.sort(calls)
    at = np.searchsorted(launched, gpu).clip(max=len(launched) - 1)
    return int((launched[at] != gpu).sum())


def by_final_rank(files: list[Any], rank_of: dict[tuple[int, Any], int]
                  ) -> dict[tuple[int, int], dict[str, Any]] | None:
    """(final rank, file index) -> that rank's facts in that file, for the results of one
    ingest (``files``: FileResults; ``rank_of``: (file index, rank as parsed) -> final rank);
    None when a file's entry holds none (written before them, or a file the keys could not
    tell), or when a final rank gathers several files: the launch lookup matches GPU events
    to calls across a rank's files, which one file's facts cannot tell."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    finals: set[int] = set()
    for (index, parsed), final in rank_of.items():
        facts = files[index].rank_facts
        if facts is None or final in finals:
            return None
        finals.add(final)
        if len(files[index].ranks) == 1:  # every row is the file's one rank, whatever it reads
            found = next(iter(facts.values()), None)
        else:
            found = facts.get(str(parsed) if parsed is not None else "None")
        out[(final, index)] = found or {"kinds": {}, "unlaunched_gpu_events": 0,
                                        "span": dict.fromkeys(("start_ns", "end_ns",
                                                               "first_step", "last_step"))}
    return out
