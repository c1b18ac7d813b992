"""PyTorch-profiler (Kineto) Chrome-trace JSON -> events: :func:`parse` (one table) and
:func:`parse_batched` (row batches, for ingest).

The hot path is the C scanner (``_scan.c``): one pass over the bytes, two threads on large
arrays, straight into compact columns (times as exact int64 ns parsed from their decimal text,
so ``1712195495406752.8`` µs becomes exactly ``1712195495406752800`` ns; repeating text
interned; sparse integers as (row, value) pairs; ``args`` kept raw). The kind, times and steps
are then derived for every row, and the rest one batch of rows at a time, so ingest never holds
the finished table whole.

Without the scanner (no compiler, no wheel), well-formed input is read by msgspec a 4 MB batch
at a time (``_stream.py``). Damaged input (truncated writes, NaN tokens, invalid UTF-8, values
of the wrong type, B/E pairs) falls back to the slower whole-file msgspec reader
(``_tolerant.py``), which keeps every complete event and says what it dropped; all paths store
identical tables (tests).

Behind the entry points, one job per private module:

* ``_input.py``: the file's bytes (memory map, gzip inflated by ISA-L), repairs
* ``_scan.c``: the C scanner (optional at install; without it ``_stream.py`` and
  ``_tolerant.py`` read all)
* ``_stream.py``: the pure-Python reader of well-formed input, a batch of bytes at a time
* ``_tolerant.py``: the whole-file msgspec reader for what the others decline
* ``_salvage.py``: the complete events before damage, a window of bytes at a time
* ``_bounds.py``: the bounds on one event (size, nesting), the same on every path
* ``_structure.py``: where elements end and how deep they nest, from the bytes
* ``_events.py``: decoded events turned into the scanner's column layout
* ``_columns.py``: the scanned columns, sparse ones as (row, value) pairs
* ``_parse.py``: the two entry points, and the scanner's columns handed over to Arrow
* ``_rows.py``: kind and exact times of every row; the rest built one batch of rows at a time
* ``_ranks.py``: the rank from ``distributedInfo``, else from the file name
* ``_arrow_types.py``: the batches' type changes on buffers (no pyarrow.compute/pandas import)

>>> from pathlib import Path; import tempfile, os
>>> p = Path(tempfile.mkdtemp()) / "rank-1.json"
>>> _ = p.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
...                  '"tid": 7, "ts": 1.5, "dur": 2.25, "args": {"stream": 7, "device": 0}}]}')
>>> parsed = parse(p)
>>> parsed.events.column("ts_ns").to_pylist(), parsed.events.column("dur_ns").to_pylist()
([1500], [2250])
"""

from __future__ import annotations

from traceview.parsers.kineto._parse import SCANNER_FIX, parse, parse_batched, parser_path

__all__ = ["SCANNER_FIX", "parse", "parse_batched", "parser_path"]
