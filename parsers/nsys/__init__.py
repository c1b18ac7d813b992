"""Nsight Systems SQLite exports (``nsys export --type sqlite``) -> the traceview event store:
:func:`parse`.

The same concept gets the same kind and columns as in Kineto traces, so every analysis runs on
either source:

=====================================  ===============  ======================================
table                                  kind             notes
=====================================  ===============  ======================================
CUPTI_ACTIVITY_KIND_KERNEL             kernel           name = demangled name; short name and
                                                        launch geometry in args_json; NCCL
                                                        kernels get ``collective``
CUPTI_ACTIVITY_KIND_RUNTIME            cuda_runtime     ``eventClass`` 1 -> cuda_driver; the
                                                        ``_v7000`` suffix is dropped from names
CUPTI_ACTIVITY_KIND_MEMCPY             memcpy           ``Memcpy HtoD (Pageable -> Device)``,
                                                        copy_kind, bytes
CUPTI_ACTIVITY_KIND_MEMSET             memset           ``Memset (Device)``, bytes
CUPTI_ACTIVITY_KIND_SYNCHRONIZATION    sync             ``Stream Sync``, ``Event Sync``, ...
NVTX_EVENTS                            nvtx             ranges (dur_ns) and marks (dur_ns null);
                                                        category = domain name (``default``);
                                                        NCCL domain -> collective columns
OSRT_API (``include_osrt=True``)       os_runtime       off by default: often the largest table
ThreadNames, PROCESSES                 metadata         ``thread_name`` / ``process_name`` rows
                                                        with ``{"name": ...}`` as in Kineto
=====================================  ===============  ======================================

Times: ``ts_ns = start + TARGET_INFO_SESSION_START_TIME.utcEpochNs`` (epoch ns, comparable across
reports and with Kineto's ``baseTimeNanoseconds``); without that table (2020-era exports) the
session-relative time is kept and a warning says so. ``dur_ns = end - start``.

Counts: ``input_events`` = rows read from the event tables ingested (the CUPTI tables above,
NVTX_EVENTS, OSRT_API when asked) + the name rows of the traced processes and threads;
``input_events == stored + sum(dropped.values())``.

Behind the entry point, one job per private module:

* ``_parse.py``: the entry point; combines the tables, drops rows without a process or rank
* ``_db.py``: read-only access to the export (SQLAlchemy; ADBC for numeric tables), chunked reads
* ``_read_ahead.py``: the kernel table read while the export is opened
* ``_tables.py``: one reader per table, into the staging columns
* ``_ranks.py``: which process is which rank (the caller's map, the report, devices, pid order)
* ``_nccl.py``: collectives from the NCCL NVTX domain and from NCCL kernel names
* ``_arrow.py``: the hand-over to Arrow, in time order, without copies
* ``_sql.py``: names quoted for SQL (an export may hold any table name)
* ``_typed.py``: cells not of their column's type: rows skipped and counted, at no cost to
  good tables
"""

from __future__ import annotations

from traceview.parsers.nsys._parse import parse

__all__ = ["parse"]
