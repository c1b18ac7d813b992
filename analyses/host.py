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

from .launches import RUNTIME_KINDS, is_runtime_call

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
    # Other accelerators' runtime calls (stored as kind ``other``) play the part of
    # ``cuda_runtime`` here, so every launch lookup finds them by kind alone.
    runtime = is_runtime_call(events)
    kind = (pl.when(pl.col("kind") == "other").then(pl.lit("cuda_runtime", pl.Categorical))
            .otherwise(pl.col("kind")))
    return (events.lazy().filter(pl.col("kind").is_in(HOST_KINDS) | runtime)
            .with_columns(kind=kind).select(columns).collect())
