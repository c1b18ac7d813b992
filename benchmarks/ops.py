"""The measured operations, each run alone in a child process by ``benchmarks/measure.py``.

    python benchmarks/ops.py NAME '{"paths": [...], ...}'

Prints one JSON object on its last stdout line: ``wall_s`` (the operation only, after imports),
``cpu_s`` (CPU seconds of the same span, this process plus its joined workers),
``peak_rss_mb`` (largest resident set of this process or any waited-for child: ingest
workers), and what the operation counted. Nothing here is imported by the test suite.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


_CPU = {"s": 0.0, "modules": 0}  # CPU seconds and modules imported inside the clocks


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _tic() -> tuple[float, float, int]:
    return time.perf_counter(), _cpu(), len(sys.modules)


def _toc(tic: tuple[float, float, int]) -> float:
    """Wall seconds since ``tic``; the CPU seconds (this process and its waited-for workers)
    are added to ``cpu_s``, which is robust to other users' load where wall time is not, and
    the modules imported meanwhile to ``modules_loaded`` (a lazy import timed as work)."""
    wall = time.perf_counter() - tic[0]
    _CPU["modules"] += len(sys.modules) - tic[2]
    _stop_fork_server()
    _CPU["s"] += _cpu() - tic[1]
    return wall


def _stop_fork_server() -> None:
    """Ingest workers fork from multiprocessing's fork server (``executors.local_pool``),
    which waits for them, not this process: their CPU time reaches this process's children
    only once the server exits and is waited for. Stop it (after the wall clock)."""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()  # a no-op when none was started


def _peak_mb() -> dict[str, float]:
    own = _own_peak_kb() / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mb": max(own, kids), "self_rss_mb": own, "children_rss_mb": kids}


def _own_peak_kb() -> float:
    """This process's peak resident set in KiB: Linux's ``VmHWM``. ``ru_maxrss`` survives
    fork and exec: a child of a harness holding 400 MB reported 400 MB for a 14 MB process,
    so every op's peak read as the harness's own (the baseline measured 375 MB, 163 MB
    alone)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # elsewhere: the best there is


def _read(path: Path, inflater: str = "isal") -> bytes:
    raw = path.read_bytes()
    if not raw.startswith(b"\x1f\x8b"):
        return raw
    if inflater == "zlib":
        import gzip
        return gzip.decompress(raw)
    from isal import igzip
    return igzip.decompress(raw)


#: What traceview imports on first use, imported before the clock starts. The parsers' packages
#: are lazy proxies (``from traceview.parsers import kineto`` loads nothing), and
#: ``traceview.open`` imports the Run with every analysis: until log 51 those ~70 modules
#: (0.06-0.08 s) were loaded inside every timed ``ingest``.
_LAZY_MODULES = (
    "polars", "pyarrow.parquet", "xxhash", "gzip", "isal.igzip",
    "traceview.cli", "traceview.store.ingest", "traceview.store.steps",
    "traceview.store.traceset", "traceview.run.run",
    "traceview.parsers.kineto._parse", "traceview.parsers.nsys._parse",
    "polars._utils.parquet",  # DataFrame.write_parquet's helpers (a store's tables)
    "numpy.ma",  # Polars imports it to build a Series from a numpy array
    "pyarrow.compute",  # the pure-Python Kineto path
)


def _warm_imports() -> None:
    """Import what traceview imports lazily, so timings measure work, not module loading."""
    import importlib

    for name in _LAZY_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a library moved a private module: the results' modules_loaded says
            pass


def op_baseline(_: dict[str, Any]) -> dict[str, Any]:
    """Interpreter + the imports an ingest needs: the constant under every peak RSS."""
    t = _tic()
    _warm_imports()
    return {"wall_s": 0.0, "import_s": _toc(t)}


def op_read(a: dict[str, Any]) -> dict[str, Any]:
    """Read (and inflate) the bytes: the floor under any parser; ``inflater`` isal or zlib."""
    t = _tic()
    total = sum(len(_read(Path(p), a.get("inflater", "isal"))) for p in a["paths"])
    return {"wall_s": _toc(t), "bytes": total}


def op_orjson(a: dict[str, Any]) -> dict[str, Any]:
    """``orjson.loads`` of the (already read) bytes into Python objects, gc disabled."""
    import orjson

    gc.disable()
    spent, events, total = 0.0, 0, 0
    for p in a["paths"]:
        data = _read(Path(p))
        total += len(data)
        t = _tic()
        doc = orjson.loads(data)
        spent += _toc(t)
        events += len(doc["traceEvents"] if isinstance(doc, dict) else doc)
        del doc, data
    return {"wall_s": spent, "bytes": total, "events": events}


class _Event(msgspec.Struct, gc=False):
    """The Kineto event fields, typed; ``args`` kept as raw JSON text (the decode limit)."""

    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"null")


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []  # noqa: N815, RUF012 - Kineto's key; msgspec copies defaults


def op_msgspec(a: dict[str, Any]) -> dict[str, Any]:
    """Typed msgspec decode into Structs with the Kineto event fields, ``args`` left raw."""
    decoder = msgspec.json.Decoder(_Trace)
    spent, events, total = 0.0, 0, 0
    for p in a["paths"]:
        data = _read(Path(p))
        total += len(data)
        t = _tic()
        doc = decoder.decode(data)
        spent += _toc(t)
        events += len(doc.traceEvents)
        del doc, data
    return {"wall_s": spent, "bytes": total, "events": events}


def op_ingest(a: dict[str, Any]) -> dict[str, Any]:
    """Cold ingest into an empty cache folder (removed first): ``traceview.open``, or with
    ``workers``/``memory_budget_mb`` the ingest pool sized by ``ingest.worker_count``.
    ``no_cache``: as ``traceview ingest --no-cache`` (a temporary cache, removed at exit);
    ``pure_python``: on the pure-Python Kineto path (``TRACEVIEW_PURE_PYTHON=1``, see ``main``);
    ``store_dir``: then write the store there, as ``ingest -o DIR`` (timed with the ingest)."""
    cache = Path(a["cache_dir"])
    shutil.rmtree(cache, ignore_errors=True)
    store_dir = a.get("store_dir")
    if store_dir:
        shutil.rmtree(store_dir, ignore_errors=True)
    import traceview

    t = _tic()
    if a.get("no_cache"):
        ts = traceview.open(a["paths"], cache=False)
        workers = None
    elif a.get("workers") is None and a.get("memory_budget_mb") is None:
        ts = traceview.open(a["paths"], cache_dir=cache)
        workers = None
    else:
        from traceview.store.executors import local_pool
        from traceview.store.ingest import discover, ingest, worker_count
        from traceview.store.traceset import _from_ingest

        files = discover(a["paths"])
        budget = a.get("memory_budget_mb")
        workers = a.get("workers") or worker_count(
            files, memory_budget=None if budget is None else int(budget * 2**20))
        with local_pool(workers) as pool:  # the pool traceview.open would start
            ts = _from_ingest(ingest(files, cache_dir=cache, executor=pool))
    if store_dir:
        ts.write_store(store_dir)
    wall = _toc(t)
    files = ts.files
    written = Path(store_dir) if store_dir else cache
    return {"wall_s": wall, "workers": workers,
            "input_events": int(files["input_events"].sum()),
            "stored_events": int(files["stored_events"].sum()),
            "store_bytes": sum(p.stat().st_size for p in written.rglob("*.parquet"))}


def op_first_answer(a: dict[str, Any]) -> dict[str, Any]:
    """Time to first answer: ``traceview COMMAND PATHS --json`` with an empty cache (removed
    first), the ingest included; the command's modules are imported before the clock starts,
    as for ``analysis``."""
    shutil.rmtree(a["cache_dir"], ignore_errors=True)
    return op_analysis(a)


def op_reopen(a: dict[str, Any]) -> dict[str, Any]:
    """Open again from the Parquet cache, then count the events (touches every file)."""
    import polars as pl

    import traceview

    t0 = time.perf_counter()
    t = _tic()
    ts = traceview.open(a["paths"], cache_dir=a["cache_dir"])
    opened = _toc(t)
    n = ts.events.select(pl.len()).collect().item()
    return {"wall_s": opened, "with_count_s": time.perf_counter() - t0, "stored_events": int(n)}


def op_analysis(a: dict[str, Any]) -> dict[str, Any]:
    """One analysis command as a user runs it (``traceview CMD PATHS --json``), from the cache.
    Its modules (the command's CLI module, the Run, the analyses, clock alignment) are imported before
    the clock starts, as the ingest's parser modules are: every time here excludes imports."""
    import importlib
    import pkgutil

    import traceview.analyses
    import traceview.analyses.align  # noqa: F401
    import traceview.store.derived  # noqa: F401
    import traceview.store.remote  # noqa: F401
    import traceview.run.run  # noqa: F401 - the Run (and its Result) every command asks
    from traceview.cli import main, module_of

    module_of(a["command"])
    for module in pkgutil.iter_modules(traceview.analyses.__path__):
        importlib.import_module(f"traceview.analyses.{module.name}")
    sink = io.StringIO()
    # what the command computes from the cache, not an answer kept by an earlier run of the
    # same command line (benchmarks/startup.py times that)
    os.environ["TRACEVIEW_ANSWERS"] = "off"
    t = _tic()
    with contextlib.redirect_stdout(sink):
        rc = main([a["command"], *a["paths"], "--json", "--cache-dir", a["cache_dir"]])
    return {"wall_s": _toc(t), "rc": rc, "output_bytes": len(sink.getvalue()),
            "error": None if rc == 0 else f"exit code {rc}"}


def op_lazy_scan(a: dict[str, Any]) -> dict[str, Any]:
    """A streaming aggregate over the whole store (kernel time per rank): lazy Parquet scan."""
    import polars as pl

    import traceview

    ts = traceview.open(a["paths"], cache_dir=a["cache_dir"])
    t = _tic()
    out = (ts.events.filter(pl.col("kind") == "kernel").group_by("rank")
           .agg(pl.col("dur_ns").sum().alias("kernel_ns"), pl.len().alias("kernels"))
           .collect(engine="streaming"))
    return {"wall_s": _toc(t), "ranks": out.height,
            "kernels": int(out["kernels"].sum())}


def op_nsys(a: dict[str, Any]) -> dict[str, Any]:
    """Cold ingest of an nsys SQLite export; kernel rows counted from the store."""
    import polars as pl

    cache = Path(a["cache_dir"])
    shutil.rmtree(cache, ignore_errors=True)
    import traceview

    t = _tic()
    ts = traceview.open(a["paths"], cache_dir=cache)
    wall = _toc(t)
    kernels = ts.events.filter(pl.col("kind") == "kernel").select(pl.len()).collect().item()
    return {"wall_s": wall, "kernels": int(kernels),
            "stored_events": int(ts.files["stored_events"].sum())}


OPS = {name[3:]: fn for name, fn in globals().items() if name.startswith("op_")}


def main(argv: list[str]) -> int:
    name, args = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    if args.get("pure_python"):  # before any import of the parser: the path without a scanner
        os.environ["TRACEVIEW_PURE_PYTHON"] = "1"
    if name not in ("baseline", "read", "orjson", "msgspec"):
        _warm_imports()
    try:
        result = OPS[name](args)
    except Exception as exc:  # noqa: BLE001 - recorded in the results table, not raised
        import traceback
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if name != "baseline":  # whose clock times the imports themselves
        result["modules_loaded"] = _CPU["modules"]
    result.update(_peak_mb())
    result["cpu_s"] = _CPU["s"]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
