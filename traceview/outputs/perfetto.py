"""One Chrome-trace JSON file for all ranks on the aligned timeline (Perfetto UI,
chrome://tracing).

Layout: one process per rank (``pid`` = rank, named ``rank R``, flagged stragglers say so),
one thread per source thread (``pid P tid T``) and per GPU stream (``GPU D stream S``), plus
traceview's annotation tracks:

* ``traceview: GPU idle (device D)``: every GPU idle gap (``analyses.gaps``) as a slice named
  ``idle: <cause>`` with the gap's cause and neighbours in ``args``;
* ``collective waits``: for every matched collective and rank that arrived before the last
  rank, an async slice ``wait for rank L: <collective>`` from the rank's arrival to the last
  arrival (``analyses.collectives``), so straggler waits line up across ranks. Async slices
  (``ph`` b/e) because waits of collectives in flight together overlap.

The inputs' flow arrows (``ph`` s/t/f: launch -> kernel ``ac2g``, ``fwdbwd`` ...) are kept, on
the thread their end lies on (a GPU end on its stream's track) and with ids made unique across
ranks (each file numbers its own); their counters (``ph`` C) too; allocator events stay
instants with their args, and each device's allocated and reserved bytes are a counter track
(``memory (device D)``). The files' metadata rows are replaced by traceview's track names.

Times: ``ts`` = (aligned time − origin) in µs with ns precision (three decimals); the origin
(earliest aligned event, epoch ns) is in ``otherData.traceview_origin_ns``.
"""

from __future__ import annotations

from typing import Any, TextIO

import orjson
import polars as pl

from traceview import __version__
from traceview.analyses.align import apply_offsets
from traceview.run.run import as_run
from traceview.schema import GPU_STREAM_KINDS

Frame = pl.LazyFrame | pl.DataFrame

GAP_TID_BASE = 1_000_000_000
PATH_TID = 2_000_000_000
WAIT_CAT = "traceview.wait"
_SKIP_KINDS = ["metadata"]  # traceview names the tracks itself
#: Exported by their own rules, not as slices or instants.
_OWN_RULES = ["flow", "counter"]


def _us(ns: pl.Expr) -> pl.Expr:
    return ns.cast(pl.Float64) / 1000.0


def _with_args(obj: pl.Expr, args: pl.Expr) -> pl.Expr:
    """Splice a JSON object text ``args`` into the JSON object text ``obj``."""
    return obj.str.head(-1) + pl.lit(',"args":') + args + pl.lit("}")


def _meta(pid: pl.Expr, tid: pl.Expr, name: str, value: pl.Expr, key: str = "name") -> pl.Expr:
    return _with_args(
        pl.struct(name=pl.lit(name), ph=pl.lit("M"), pid=pid, tid=tid).struct.json_encode(),
        pl.struct(value.alias(key)).struct.json_encode())


def trace_lines(
    events: Frame,
    *,
    offsets: pl.DataFrame | None = None,
    gap_frame: pl.DataFrame | None = None,
    waits: pl.DataFrame | None = None,
    straggler_ranks: dict[int, str] | None = None,
    path_pieces: pl.DataFrame | None = None,
) -> tuple[list[str], int]:
    """Chrome-trace event objects (JSON texts) and the origin (epoch ns).

    ``offsets``: ``traceview.analyses.align.estimate_offsets`` (None: raw clocks); ``gap_frame``:
    ``analyses.gaps.gaps`` rows; ``waits``: ``analyses.collectives.collective_ranks`` rows
    (already on the aligned clock); ``straggler_ranks``: rank -> label for flagged ranks.
    """
    kind = pl.col("kind").cast(pl.String)
    lf = events.lazy().filter(~kind.is_in(_SKIP_KINDS))
    if offsets is not None and offsets.height:
        lf = apply_offsets(lf, offsets)
    else:
        lf = lf.with_columns(ts_aligned_ns=pl.col("ts_ns"))
    is_gpu = kind.is_in(GPU_STREAM_KINDS) & pl.col("device").is_not_null()
    ev = lf.with_columns(
        _thread=pl.when(is_gpu)
        .then(pl.format("GPU {} stream {}", pl.col("device"), pl.col("stream").fill_null(0)))
        .otherwise(pl.format("pid {} tid {}", pl.col("pid").fill_null(0),
                             pl.col("tid").fill_null(0))),
        _gpu=is_gpu,
    ).select("rank", "name", "category", "kind", "ts_aligned_ns", "dur_ns", "args_json",
             "_thread", "_gpu", "pid", "tid", "device", "flow_id", "flow_phase",
             "mem_total_allocated", "mem_total_reserved").collect()
    ev = _flows_on_gpu_tracks(ev)
    origin_parts = [ev["ts_aligned_ns"].min()]
    gap_frame = gap_frame if gap_frame is not None else pl.DataFrame()
    if gap_frame.height:
        gap_frame = apply_offsets(gap_frame.with_columns(ts_ns=pl.col("gap_start_ns")),
                                  offsets if offsets is not None and offsets.height else
                                  pl.DataFrame({"rank": [], "offset_ns": [], "drift_ppm": []},
                                               schema={"rank": pl.Int32, "offset_ns": pl.Int64,
                                                       "drift_ppm": pl.Float64})).collect()
        origin_parts.append(gap_frame["ts_aligned_ns"].min())
    waits = (waits.filter(pl.col("wait_ns") > 0) if waits is not None and waits.height
             else pl.DataFrame())
    if waits.height:
        origin_parts.append(waits["arrival_ns"].min())
    origin_parts = [v for v in origin_parts if v is not None]
    if not origin_parts:
        return [], 0
    origin = int(min(origin_parts))

    threads = (ev.filter(kind != "counter").select("rank", "_thread", "_gpu").unique()
               .sort("rank", "_gpu", "_thread")
               .with_columns(_tid=pl.int_range(1, pl.len() + 1).over("rank").cast(pl.Int64)))
    ev = ev.join(threads.select("rank", "_thread", "_tid"), on=["rank", "_thread"], how="left")
    ts = _us(pl.col("ts_aligned_ns") - origin)
    name = pl.col("name").cast(pl.String).fill_null("")
    cat = pl.coalesce(pl.col("category").cast(pl.String), kind)
    args = pl.col("args_json").fill_null("{}").replace("", "{}")
    own = ev.filter(kind.is_in(_OWN_RULES))
    ev = ev.filter(~kind.is_in(_OWN_RULES))
    slices = ev.filter(pl.col("dur_ns").is_not_null()).select(_with_args(pl.struct(
        name=name, cat=cat, ph=pl.lit("X"), ts=ts, dur=_us(pl.col("dur_ns").clip(0)),
        pid=pl.col("rank").cast(pl.Int64), tid=pl.col("_tid")).struct.json_encode(), args
    ).alias("j"))
    instants = ev.filter(pl.col("dur_ns").is_null()).select(_with_args(pl.struct(
        name=name, cat=cat, ph=pl.lit("i"), s=pl.lit("t"), ts=ts,
        pid=pl.col("rank").cast(pl.Int64), tid=pl.col("_tid")).struct.json_encode(), args
    ).alias("j"))

    labels = {int(r): f"rank {r}" for r in ev["rank"].unique().to_list()}
    for r, text in (straggler_ranks or {}).items():
        labels[int(r)] = f"rank {r} ({text})"
    procs = pl.DataFrame({"rank": list(labels), "label": list(labels.values())},
                         schema={"rank": pl.Int64, "label": pl.String}).sort("rank")
    meta = [
        procs.select(_meta(pl.col("rank"), pl.lit(0), "process_name", pl.col("label")).alias("j")),
        procs.select(_meta(pl.col("rank"), pl.lit(0), "process_sort_index", pl.col("rank"),
                           "sort_index").alias("j")),
        threads.select(_meta(pl.col("rank").cast(pl.Int64), pl.col("_tid"), "thread_name",
                             pl.col("_thread")).alias("j")),
        threads.select(_meta(pl.col("rank").cast(pl.Int64), pl.col("_tid"), "thread_sort_index",
                             pl.col("_tid"), "sort_index").alias("j")),
    ]
    parts = [*meta, slices, instants, *_flow_and_counter_lines(own, ev, name, cat, ts)]
    if gap_frame.height:
        gtid = pl.lit(GAP_TID_BASE, pl.Int64) + pl.col("device").cast(pl.Int64).fill_null(0)
        gthreads = gap_frame.select("rank", "device").unique().sort("rank", "device")
        parts.append(gthreads.select(_meta(
            pl.col("rank").cast(pl.Int64), gtid, "thread_name",
            pl.format("traceview: GPU idle (device {})", pl.col("device"))).alias("j")))
        parts.append(gap_frame.select(_with_args(pl.struct(
            name=pl.lit("idle: ") + pl.col("cause"), cat=pl.lit("traceview.gap"),
            ph=pl.lit("X"), ts=_us(pl.col("ts_aligned_ns") - origin),
            dur=_us(pl.col("gap_ns")), pid=pl.col("rank").cast(pl.Int64), tid=gtid
        ).struct.json_encode(), pl.struct(
            "gap_ns", "cause", pl.col("prev_name"), pl.col("next_name"),
            pl.col("prev_step"), pl.col("next_step")).struct.json_encode()).alias("j")))
    if waits.height:
        w = waits.sort("arrival_ns", "rank").with_row_index("_id").with_columns(
            _name=pl.format("wait for rank {}: {}", pl.col("last_rank"), pl.col("collective")))
        common = dict(name=pl.col("_name"), cat=pl.lit(WAIT_CAT),
                      id=pl.format("0x{}", pl.col("_id")), pid=pl.col("rank").cast(pl.Int64),
                      tid=pl.lit(0, pl.Int64))
        parts.append(w.select(_with_args(pl.struct(
            **common, ph=pl.lit("b"), ts=_us(pl.col("arrival_ns") - origin)).struct.json_encode(),
            pl.struct("instance", "collective", "wait_ns", "last_rank", "skew_ns")
            .struct.json_encode()).alias("j")))
        parts.append(w.select(pl.struct(
            **common, ph=pl.lit("e"), ts=_us(pl.col("last_arrival_ns") - origin))
            .struct.json_encode().alias("j")))
    if path_pieces is not None and path_pieces.height:
        parts += _path_lines(path_pieces, origin)
    lines = pl.concat(parts)["j"].to_list()
    return lines, origin


def _flows_on_gpu_tracks(ev: pl.DataFrame) -> pl.DataFrame:
    """Flow ends written with a GPU's pid and stream's tid (Kineto's ``f`` of ``ac2g``) moved
    to that stream's track, so the arrow lands on the kernel it points at."""
    gpu = ev.filter(pl.col("_gpu")).select("rank", "_thread").unique()
    on_gpu = pl.format("GPU {} stream {}", pl.col("pid"), pl.col("tid"))
    flows = ev.filter(pl.col("kind").cast(pl.String) == "flow").with_columns(_g=on_gpu)
    if flows.height == 0 or gpu.height == 0:
        return ev
    moved = flows.join(gpu.with_columns(_hit=pl.lit(True)), left_on=["rank", "_g"],
                       right_on=["rank", "_thread"], how="left", maintain_order="left")
    moved = moved.with_columns(_thread=pl.when(pl.col("_hit")).then(pl.col("_g"))
                               .otherwise(pl.col("_thread")),
                               _gpu=pl.col("_hit").fill_null(False)).drop("_g", "_hit")
    return pl.concat([ev.filter(pl.col("kind").cast(pl.String) != "flow"), moved])


def _flow_and_counter_lines(own: pl.DataFrame, ev: pl.DataFrame, name: pl.Expr, cat: pl.Expr,
                            ts: pl.Expr) -> list[pl.DataFrame]:
    """The inputs' flow ends and counter samples, and a counter track of the allocated and
    reserved bytes per rank and device from the allocator events."""
    kind = pl.col("kind").cast(pl.String)
    pid = pl.col("rank").cast(pl.Int64)
    flows = own.filter((kind == "flow") & pl.col("flow_id").is_not_null())
    # each file numbers its flows from its own counter: (rank, id) -> one id of the merge
    flow_id = pl.struct("rank", "flow_id").rank("dense").cast(pl.Int64)
    phase = pl.col("flow_phase").cast(pl.String).fill_null("s")
    lines = [flows.select(pl.struct(
        name=name, cat=cat, ph=phase, id=flow_id, ts=ts, pid=pid, tid=pl.col("_tid"),
        bp=pl.when(phase == "f").then(pl.lit("e"))).struct.json_encode()
        .str.replace(',"bp":null', "", literal=True).alias("j"))]
    counters = own.filter(kind == "counter")
    lines.append(counters.select(_with_args(pl.struct(
        name=name, cat=cat, ph=pl.lit("C"), ts=ts, pid=pid).struct.json_encode(),
        pl.col("args_json").fill_null("{}").replace("", "{}")).alias("j")))
    memory = ev.filter((kind == "memory") & pl.col("mem_total_allocated").is_not_null())
    device = pl.when(pl.col("device").is_null() | (pl.col("device") < 0)).then(pl.lit("CPU")) \
        .otherwise(pl.format("device {}", pl.col("device")))
    lines.append(memory.select(_with_args(pl.struct(
        name=pl.format("memory ({})", device), cat=pl.lit("traceview.memory"), ph=pl.lit("C"),
        ts=ts, pid=pid).struct.json_encode(), pl.struct(
        allocated_bytes="mem_total_allocated", reserved_bytes="mem_total_reserved")
        .struct.json_encode()).alias("j")))
    return lines


def _path_lines(pieces: pl.DataFrame, origin: int) -> list[pl.DataFrame]:
    """The critical path's pieces (already on the aligned timeline) as slices on a
    ``traceview: critical path`` thread of each rank they lie on."""
    tid = pl.lit(PATH_TID, pl.Int64)
    ranks = pieces.select(pl.col("rank").cast(pl.Int64)).unique().sort("rank")
    return [
        ranks.select(_meta(pl.col("rank"), tid, "thread_name",
                           pl.lit("traceview: critical path")).alias("j")),
        pieces.select(_with_args(pl.struct(
            name=pl.lit("path: ") + pl.col("category"), cat=pl.lit("traceview.path"),
            ph=pl.lit("X"), ts=_us(pl.col("start_ns") - origin),
            dur=_us(pl.col("end_ns") - pl.col("start_ns")), pid=pl.col("rank").cast(pl.Int64),
            tid=tid).struct.json_encode(),
            pl.struct("name", "category", "step").struct.json_encode()).alias("j")),
    ]


def write_trace(lines: list[str], origin_ns: int, fp: TextIO, *,
                extra: dict[str, Any] | None = None) -> int:
    """Write the Chrome-trace object; returns the number of events written."""
    other = {"traceview_version": __version__, "traceview_origin_ns": origin_ns,
             "time": "aligned clock, ts in us since traceview_origin_ns", **(extra or {})}
    fp.write('{"displayTimeUnit":"ns","otherData":')
    fp.write(orjson.dumps(other).decode())
    fp.write(',"traceEvents":[\n')
    fp.write(",\n".join(lines))
    fp.write("\n]}\n")
    return len(lines)


def export(source: Any, fp: TextIO, *, critical_path: bool = False,
           **run_options: Any) -> dict[str, Any]:
    """Write the run's ranks on its aligned timeline, gaps and collective waits annotated, to
    ``fp`` (``source``: a Run, or events in memory with ``RunOptions`` such as ``align=``);
    ``critical_path``: draw the cross-rank critical path too.

    Returns counts: events, gaps, waits, ranks, stragglers, the origin and the alignment.
    """
    run = as_run(source, **run_options)
    ev = run.events.collect()  # every column: the args travel into the merged trace
    offsets = run.offsets
    g = run.gap_rows()
    per = run.collective_ranks
    strag = run.stragglers()["ranks"]
    flagged = {r: f"straggler: imposes {w / 1e6:.1f} ms" for r, w in
               strag.filter(pl.col("flagged")).select("rank", "imposed_wait_ns").rows()}
    pieces = run.path.pieces if critical_path else None
    lines, origin = trace_lines(ev, offsets=offsets, gap_frame=g, waits=per,
                                straggler_ranks=flagged, path_pieces=pieces)
    methods = sorted(set(offsets["method"].to_list())) if offsets.height else []
    n = write_trace(lines, origin, fp, extra={
        "alignment": methods,
        "offsets_ns": {str(r): o for r, o in offsets.select("rank", "offset_ns").rows()}})
    return {"events": n, "gaps": g.height,
            "waits": int(per.filter(pl.col("wait_ns") > 0).height) if per.height else 0,
            "ranks": len(run.ranks_present),
            "stragglers": sorted(flagged), "origin_ns": origin, "alignment": methods,
            **({"path_pieces": pieces.height} if pieces is not None else {})}
