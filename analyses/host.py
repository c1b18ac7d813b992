"""The host-side events the GPU analyses read, collected once per command.

A command that runs several analyses (``gaps`` with ``largest_gaps``, ``breakdown``,
``summary``) looks up runtime calls, synchronisations, operators and step markers many times.
Reading them once from the store, with only the columns those lookups use, and filtering the
table in memory costs less than one Parquet scan per lookup. Every analysis also accepts the
full events: this table holds every row of the kinds they read (``HOST_KINDS``), so the answer
is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from traceview.schema import ACCELERATOR_RUNTIME_CATEGORIES

from .launches import RUNTIME_KINDS

Frame = pl.LazyFrame | pl.DataFrame

#: Host-side kinds the GPU analyses read: launches, synchronisations, operators, annotations
#: (step markers, data loading), Python functions and NVTX ranges.
HOST_KINDS: tuple[str, ...] = (*RUNTIME_KINDS, "sync", "cpu_op", "user_annotation",
                               "python_function", "nvtx")

#: The columns they read.
HOST_COLUMNS: tuple[str, ...] = ("rank", "kind", "name", "pid", "tid", "ts_ns", "dur_ns",
                                 "correlation", "external_id")


#: The columns every lookup reads; the others are read by some: ``pid``, ``tid`` (self time),
#: ``correlation`` (launches), ``external_id`` (the op behind a gap's launch).
BASE_COLUMNS: tuple[str, ...] = ("rank", "kind", "name", "ts_ns", "dur_ns")


def host_events(events: Frame, *, without: Sequence[str] = ()) -> pl.DataFrame:
    """The rows of ``events`` of a ``HOST_KINDS`` kind, with ``HOST_COLUMNS``, collected.

    ``without``: columns the caller's lookups do not read (none of ``BASE_COLUMNS``): each is
    1.5 M values to decode and hold on a large trace."""
    if set(without) & set(BASE_COLUMNS):
        raise ValueError(f"host_events needs {', '.join(BASE_COLUMNS)}")
    columns = [c for c in HOST_COLUMNS if c not in without]
    kind = pl.col("kind")
    plain = events.lazy().filter(kind.is_in(HOST_KINDS)).select(columns)
    if "category" not in events.lazy().collect_schema().names() or not _accelerator_runtime(
            events):  # no other accelerator's runtime call: no row changes kind
        return plain.collect()
    # the streaming engine reads the same rows in the same order with ~10% less CPU
    rows = (events.lazy().filter(kind.is_in(HOST_KINDS) | (kind == "other"))
            .select(*columns, "category").collect(engine="streaming"))
    return _other_runtimes_as_cuda(rows).drop("category")


def _accelerator_runtime(events: Frame) -> bool:
    """Whether any row of kind ``other`` is another accelerator's runtime call. Asked of the
    kind and category columns alone (~5 ms on 1 M rows), so that a trace without any (a CUDA
    trace, whose few ``other`` rows are profiler bookkeeping) reads its host rows without the
    category column and without ``_other_runtimes_as_cuda``'s pass over every host row: ~0.1 s
    of a 1 M-row trace's cached ``summary`` (docs/performance.md, log 41)."""
    other = events.lazy().filter(pl.col("kind") == "other").select("category").collect()
    return bool(other.height) and bool(
        other.get_column("category").cast(pl.String).str.to_lowercase()
        .is_in(ACCELERATOR_RUNTIME_CATEGORIES).any())


def _other_runtimes_as_cuda(rows: pl.DataFrame) -> pl.DataFrame:
    """Other accelerators' runtime calls (kind ``other``, an ``ACCELERATOR_RUNTIME_CATEGORIES``
    category) play the part of ``cuda_runtime``, so every launch lookup finds them by kind
    alone; other rows of kind ``other`` go. Their category is tested on those rows only:
    lowercasing every row's category (``is_runtime_call``) was ~0.1 s of 1.5 M host rows."""
    other = rows.get_column("kind") == "other"
    if not other.any():
        return rows
    at = other.arg_true()
    runtime = (rows.get_column("category").gather(at).cast(pl.String).str.to_lowercase()
               .is_in(ACCELERATOR_RUNTIME_CATEGORIES))
    accelerator = pl.repeat(False, rows.height, eager=True).scatter(at, runtime)
    return (rows.with_columns(kind=pl.when(accelerator)
                              .then(pl.lit("cuda_runtime", pl.Categorical))
                              .otherwise(pl.col("kind")))
            .filter(~other | accelerator))
