"""The NCCL debug log's view of a run, as tables a reader scans: which algorithm and protocol
NCCL chose for each collective and message size, and what was called.

Inputs are ``parsers.nccl_log`` tables (``NcclLog.choices`` and ``NcclLog.calls``). Definitions:
docs/metrics.md, section "NCCL debug log".

>>> import polars as pl
>>> from traceview.parsers.nccl_log import parse_text
>>> log = parse_text("NCCL INFO AllReduce: 4096 Bytes -> Algo Tree proto LL\\n"
...                  "NCCL INFO AllReduce: 8388608 Bytes -> Algo Ring proto LL128\\n"
...                  "NCCL INFO AllReduce: 2048 Bytes -> Algo Tree proto LL")
>>> log_choices(log.choices).rows()
[('all_reduce', 'TREE', 'LL', 2, 2048, 4096), ('all_reduce', 'RING', 'LL128', 1, 8388608, 8388608)]
"""

from __future__ import annotations

import polars as pl


def log_choices(choices: pl.DataFrame) -> pl.DataFrame:
    """Per (collective, algorithm, protocol): ``calls`` (lines naming that choice),
    ``min_bytes`` and ``max_bytes`` (the message sizes it was chosen for); smallest messages
    first. A line without a collective name (older NCCL) counts under ``collective`` null."""
    return (choices.group_by("collective", "algorithm", "protocol")
            .agg(calls=pl.len().cast(pl.Int64), min_bytes=pl.col("bytes").min(),
                 max_bytes=pl.col("bytes").max())
            .sort("collective", "min_bytes", "algorithm", "protocol", nulls_last=True))


def log_calls(calls: pl.DataFrame) -> pl.DataFrame:
    """Per collective: ``ranks`` that logged it, ``calls`` (call lines), ``bytes`` (their
    sum) and ``dtypes`` (the element types, comma separated); most calls first."""
    return (calls.group_by("collective")
            .agg(ranks=pl.col("rank").n_unique().cast(pl.Int64), calls=pl.len().cast(pl.Int64),
                 bytes=pl.col("bytes").sum(),
                 dtypes=pl.col("dtype").drop_nulls().unique().sort().str.join(", "))
            .sort("calls", "collective", descending=[True, False]))
