"""The one-file HTML report: gather the analyses' result frames, then write them.

Two steps, kept apart (renderers take results and a file object):

* :func:`gather` asks one Run for the analyses (summary, step breakdown, collectives,
  stragglers, pipeline, gaps, top kernels / CPU ops, clock alignment) and returns a :class:`ReportData` of frames, each
  section with the reason it is partial when the traces cannot give it (CPU-only, no steps,
  one rank, no collectives).
* :func:`write_html` writes one self-contained HTML file: plotly.js is inlined once, nothing is
  fetched when the file is opened, and every name from a trace is HTML-escaped.

The sections themselves are :mod:`traceview.outputs.report_sections` (readable at any scale:
docs/report.md), built from the escaped HTML pieces of :mod:`traceview.outputs.report_html`.

>>> import io, traceview                                         # doctest: +SKIP
>>> data = gather(traceview.open("fixtures/data/gloo_ddp_2r"))  # doctest: +SKIP
>>> write_html(data, io.StringIO())                              # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

import polars as pl

from traceview import __version__
from traceview._dependencies import lazy_module
from traceview.analyses.align import apply_offsets
from traceview.analyses.breakdown import kernels_across_ranks
from traceview.analyses.collectives import collective_summary, instances
from traceview.analyses.gaps import gap_causes, largest_gaps
from traceview.analyses.memory import timeline_points
from traceview.analyses.run_bound import bound_phrase
from traceview.outputs import report_html as H
from traceview.outputs.plots import PLOTLY_MISSING, PlotsUnavailable
from traceview.outputs.report_data import ReportData
from traceview.outputs.report_sections import render_body
from traceview.run.hang import hang_result
from traceview.run.registry import ANALYSES
from traceview.run.run import as_run
from traceview.store.safe_write import atomic_write

plotly_offline = lazy_module("plotly.offline", error=PlotsUnavailable, missing=PLOTLY_MISSING)

Frame = pl.LazyFrame | pl.DataFrame

__all__ = ["ReportData", "gather", "render_body", "write_html"]


def gather(source: Any, *, title: str = "traceview report", top: int = 10,
           nccl_logs: list[str] | None = None, fr_dumps: list[str] | None = None,
           **run_options: Any) -> ReportData:
    """The report's tables, all from one Run (``source``: a Run, or events in memory with
    ``RunOptions`` such as ``align=`` and ``ranks=`` for their ranks table; ``nccl_logs``:
    NCCL debug log files whose algorithm and protocol choices the report shows; ``fr_dumps``:
    flight-recorder dumps whose hang verdict it shows)."""
    run = as_run(source, **run_options)
    notes: dict[str, list[str]] = {}
    n_ranks = len(run.ranks_present)
    summ = run.summary()
    offsets = run.offsets
    per = run.collective_ranks
    straggling = run.stragglers()
    strag = straggling["ranks"]
    if straggling["node_findings"]:  # late ranks sharing a node: a host problem
        notes["nodes"] = list(straggling["node_findings"])

    spans = run.steps
    if spans.height:
        aligned = apply_offsets(spans.with_columns(ts_ns=pl.col("step_start_ns")),
                                offsets).collect()
        origin = aligned["ts_aligned_ns"].min()
        spans = aligned.select("rank", "step", start_ms=(pl.col("ts_aligned_ns") - origin) / 1e6,
                               dur_ms=pl.col("step_time_ns") / 1e6,
                               step_time_ns="step_time_ns")
    else:
        notes["steps"] = ["no ProfilerStep ranges: no step timeline (whole trace is one window)"]
        spans = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, "start_ms": pl.Float64,
                                     "dur_ms": pl.Float64, "step_time_ns": pl.Int64})

    breakdown = run.breakdown(top=top)
    bd = breakdown["steps"]
    no_gpu = bd.filter(pl.col("window_ns").is_null() & pl.col("note").is_not_null())
    if no_gpu.height:
        notes["breakdown"] = [f"rank {r}: {n}" for r, n in no_gpu.select("rank", "note").rows()]
    if per.height:
        lateness = per.select(
            instance_label=pl.col("instance") + pl.lit(" ") + pl.col("collective"),
            rank="rank", lateness_ns=pl.col("arrival_ns") - pl.col("first_arrival_ns"),
            _t=pl.col("first_arrival_ns")).sort("_t", "rank").drop("_t")
        inst = instances(per).sort("first_arrival_ns")
    else:
        lateness = pl.DataFrame(schema={"instance_label": pl.String, "rank": pl.Int32,
                                        "lateness_ns": pl.Int64})
        inst = pl.DataFrame()
        notes["collectives"] = [
            "no collective was matched across ranks" + (" (a single rank)" if n_ranks < 2
                                                        else "")]
    problems = run.match.problems
    if problems.height:
        notes.setdefault("collectives", []).extend(
            f"group {g}{'' if r is None else f' rank {r}'}: {p}: {d}"
            for g, r, p, d in problems.select("group", "rank", "problem", "detail").rows())

    g = run.gap_rows()
    causes = gap_causes(g, by=["rank"])
    biggest = largest_gaps(g, run.host, n=top)
    if g.height == 0:
        notes["gaps"] = ["no GPU idle gaps: " + ("no GPU events (CPU-only trace)"
                                                 if no_gpu.height == n_ranks else
                                                 "the GPU timeline has no holes")]
    kernels = breakdown["top_kernels"]
    ops = breakdown["top_cpu_ops_by_self"]
    if kernels.height == 0:
        notes["kernels"] = ["no GPU kernels: the top host operators by self time are shown"]
    totals = kernels_across_ranks(run.gpu, n=top).with_columns(
        pl.col(pl.Categorical).cast(pl.String))

    memory_points, memory_peaks, memory_warnings = _memory(run, notes)
    try:  # a partial report with the reason, never none
        path, todo = run.critical_path(top=top), run.diagnose()
    except Exception as exc:
        path = todo = None
        notes["critical-path"] = [f"critical path failed: {type(exc).__name__}: {exc}"]

    pipe = None
    try:  # only for a run with send/recv pairs: no section otherwise
        if run.p2p[0].height:
            pipe = run.pipeline(timeline=True)
    except Exception as exc:
        notes["pipeline"] = [f"pipeline analysis failed: {type(exc).__name__}: {exc}"]
    alltoall = None
    if run.has_alltoall:
        try:  # a partial report with the reason, never none
            alltoall = run.alltoall()
        except Exception as exc:
            notes["alltoall"] = [f"all-to-all analysis failed: {type(exc).__name__}: {exc}"]

    roofline = None
    if run.gpu.height:
        try:  # a partial report with the reason, never none
            roofline = run.ops()
        except Exception as exc:
            notes["roofline"] = [f"operator analysis failed: {type(exc).__name__}: {exc}"]

    registered: dict[str, tuple[str, Any]] = {}
    for analysis in ANALYSES.values():  # a section of its own: the main table
        if analysis.report:
            try:  # a partial report with the reason, never none
                res = getattr(run, analysis.name)()
            except Exception as exc:
                res = None
                notes[analysis.command] = [f"{analysis.command} failed: "
                                           f"{type(exc).__name__}: {exc}"]
            registered[analysis.command] = (analysis.help, res)

    ranks = run.ranks
    meta = {
        "ranks": n_ranks,
        "events": run.events.select(pl.len()).collect().item(),
        "world size": _first(ranks, "world_size"),
        "backend": _first(ranks, "backend"),
        "steps per rank (median)": int(spans.group_by("rank").len()["len"].median())
        if spans.height else 0,
        "clock alignment": ", ".join(sorted(set(offsets["method"].to_list())))
        if offsets.height else "none",
        "run bound": bound_phrase(summ["bound"]),  # summary's, overlap's and diagnose's words
        "traceview": __version__,
    }
    return ReportData(title=title, meta=meta, summary=summ["ranks"], worst_straggler=summ["worst_straggler"],
                      step_spans=spans, breakdown=bd, lateness=lateness, collectives=inst,
                      stragglers=strag, gap_causes=causes, largest_gaps=biggest,
                      top_kernels=kernels, top_cpu_ops=ops, offsets=offsets, notes=notes,
                      warnings=[*run.warnings, *run.table_warnings("gpu", "match", "offsets"),
                                *memory_warnings,
                                *(w for w in (path.warnings if path else ())
                                  if w.startswith("critical path:"))],
                      kernel_totals=totals, flops=run.flops_per_step(),
                      nccl=run.nccl_log_view(nccl_logs) if nccl_logs else None,
                      hang=hang_result(fr_dumps).to_dict() if fr_dumps else None,
                      collective_summary=collective_summary(per) if n_ranks > 1 else None,
                      memory_points=memory_points, memory_peaks=memory_peaks,
                      critical_path=path, diagnose=todo, pipeline=pipe,
                      alltoall=alltoall, ops=roofline, bound=summ["bound"],
                      registered=registered)


#: The memory timeline shows at most this many ranks (those with the highest peaks).
MEMORY_RANKS = 16


def _memory(run: Any, notes: dict[str, list[str]]) -> tuple[pl.DataFrame, pl.DataFrame,
                                                             list[str]]:
    """The memory section's timeline points and peaks (``run.memory()``), and the warnings
    that answer adds to the run's (none for traces without allocator events: no section)."""
    res = run.memory()
    peaks = res["devices"].filter(pl.col("source") == "trace")
    levels = run.memory_levels
    ranks = (peaks.group_by("rank").agg(pl.col("peak_allocated_bytes").max())
             .sort("peak_allocated_bytes", "rank", descending=[True, False])["rank"])
    if ranks.len() > MEMORY_RANKS:
        notes["memory"] = [f"the {MEMORY_RANKS} ranks with the highest peaks of {ranks.len()} "
                           "are drawn; the table lists every rank"]
        levels = levels.filter(pl.col("rank").is_in(ranks.head(MEMORY_RANKS).to_list()))
    origin = levels.group_by("rank").agg(origin=pl.col("ts_ns").min())
    drawn = (peaks.join(origin, on="rank")
             .with_columns(peak_ms=(pl.col("peak_time_ns") - pl.col("origin")) / 1e6))
    return (timeline_points(levels), peaks.join(drawn.select("rank", "device", "peak_ms"),
                                                on=["rank", "device"], how="left"),
            [w for w in res.warnings if w not in set(run.warnings)] if peaks.height else [])


def _first(ranks: pl.DataFrame | None, col: str) -> Any:
    if ranks is None or col not in ranks.columns or ranks.height == 0:
        return None
    return ranks[col][0]


# --------------------------------------------------------------------------------- writing

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;
padding:1em 2em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.25em .5em;text-align:right;vertical-align:top}
th{background:#f5f5f5}td.name{text-align:left;font-family:ui-monospace,monospace;
max-width:24em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
td.prose{text-align:left;max-width:48em;min-width:16em}.narrow-names td.name{max-width:11em}
.scroll{max-width:100%;overflow-x:auto}.dim{color:#555}
#verdict{background:#eef5ff;border-left:4px solid #1a5fb4;padding:.2em 1em;margin:.5em 0}
#verdict h2{margin-top:.6em;border:0}#verdict li{margin:.3em 0}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4em .8em;margin:.5em 0}
.nofig{color:#555;font-style:italic;margin:.8em 0}
.warn{background:#fdecea;border-left:4px solid #d93025;padding:.2em .8em;margin:.5em 0}
.straggler{background:#fdecea}nav a{margin-right:1em}details{margin:.3em 0 1em}
summary{cursor:pointer;color:#1a5fb4}
"""

#: ``write_html``'s ``plotly``: the library inside the file, or a script tag naming plotly's
#: CDN; any other value is the path of a shared copy (``report --plotly``).
PLOTLY_INLINE, PLOTLY_CDN = "inline", "cdn"


def shared_plotly(path: Path) -> None:
    """Write plotly.js to ``path`` unless the same version is there already: the copy that
    reports written with ``plotly=`` its path share."""
    js = plotly_offline.get_plotlyjs()
    try:
        if path.read_text(encoding="utf-8") == js:
            return
    except (OSError, UnicodeDecodeError):
        pass
    atomic_write(path, lambda tmp: tmp.write_text(js, encoding="utf-8"))


def write_html(data: ReportData, fp: TextIO, *, plotly: str = PLOTLY_INLINE) -> int:
    """Write the report to ``fp``; returns the number of figures. ``plotly``: ``inline`` (one
    self-contained file, ~4.9 MB of it plotly.js), ``cdn`` (a script tag loading the same
    plotly.js version from cdn.plot.ly when the file is opened) or a URL or path relative to
    the report of a shared copy (``shared_plotly`` writes one): reports of many runs then
    hold only their own data."""
    get_plotlyjs = plotly_offline.get_plotlyjs  # plotly missing: the install hint, before writing

    body, count = render_body(data)
    fp.write('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
             '<meta name="viewport" content="width=device-width, initial-scale=1">'
             f'<meta name="generator" content="traceview {__version__}">'
             f"<title>{H.e(data.title)}</title><style>{_CSS}</style>")
    if plotly == PLOTLY_INLINE:
        fp.write('<script type="text/javascript">')
        fp.write(get_plotlyjs())
        fp.write("</script>")
    else:
        source = (f"https://cdn.plot.ly/plotly-{plotly_offline.get_plotlyjs_version()}.min.js"
                  if plotly == PLOTLY_CDN else plotly)
        fp.write(f'<script type="text/javascript" src="{H.e(source)}" charset="utf-8">'
                 "</script>")
    fp.write("</head><body>\n")
    fp.write(body)
    fp.write("\n</body></html>\n")
    return count
