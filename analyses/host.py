"""The host-side events the GPU analyses read, collected once per command.

A command that runs several analyses (``gaps`` with ``largest_gaps``, ``breakdown``,
``summary``) looks up runtime calls, synchronisations, operators and step markers many times.
Reading them once from the store, with only the columns those lookups use, and filtering the
table in memory costs less than one Parquet scan per lookup. Every analysis also accepts the
full events: this table holds every row of the kinds they read (``HOST_KINDS``), so the answer
is the same.
"""

from __future__ import annotations

import polars as pl

from .launches import RUNTIME_KINDS

Frame = pl.LazyFrame | pl.DataFrame

#: Host-side kinds the GPU analyses read: launches, synchronisations, operators, annotations
#: (step markers, data loading), Python functions and NVTX ranges.
HOST_KINDS: tuple[str, ...] = (*RUNTIME_KINDS, "sync", "cpu_op", "user_annotation",
                               "python_function", "nvtx")

#: The columns they read.
HOST_COLUMNS: tuple[str, ...] = ("rank", "kind", "name", "pid", "tid", "ts_ns", "dur_ns",
                                 "correlation", "external_id")


def host_events(events: Frame) -> pl.DataFrame:
    """The rows of ``events`` of a ``HOST_KINDS`` kind, with ``HOST_COLUMNS``, collected."""
    return (events.lazy().filter(pl.col("kind").is_in(HOST_KINDS)).select(HOST_COLUMNS)
            .collect())
