"""The one-file HTML report: gather the analyses' result frames, then write them.

Two steps, kept apart (renderers take results and a file object):

* :func:`gather` asks one Run for the analyses (summary, step breakdown, collectives,
  stragglers, gaps, top kernels / CPU ops, clock alignment) and returns a :class:`ReportData` of frames, each
  section with the reason it is partial when the traces cannot give it (CPU-only, no steps,
  one rank, no collectives).
* :func:`write_html` writes one self-contained HTML file: plotly.js is inlined once, nothing is
  fetched when the file is opened, and every name from a trace is HTML-escaped.

>>> import io, traceview                                         # doctest: +SKIP
>>> data = gather(traceview.open("fixtures/data/gloo_ddp_2r"))  # doctest: +SKIP
>>> write_html(data, io.StringIO())                              # doctest: +SKIP
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, TextIO

import polars as pl

from traceview import __version__

Frame = pl.LazyFrame | pl.DataFrame


@dataclass(frozen=True)
class ReportData:
    """Result frames behind the report. ``notes[section]`` says why a section is partial."""

    title: str
    meta: dict[str, Any]
    summary: pl.DataFrame
    worst_straggler: dict[str, Any]
    step_spans: pl.DataFrame
    breakdown: pl.DataFrame
    lateness: pl.DataFrame
    collectives: pl.DataFrame
    stragglers: pl.DataFrame
    gap_causes: pl.DataFrame
    largest_gaps: pl.DataFrame
    top_kernels: pl.DataFrame
    top_cpu_ops: pl.DataFrame
    offsets: pl.DataFrame
    notes: dict[str, list[str]] = field(default_factory=dict)
    #: what the inputs and the shared tables said about the data (shown first in the page)
    warnings: list[str] = field(default_factory=list)
    #: the memory timeline (``analyses.memory.timeline_points``) and the trace rows of
    #: ``run.memory()`` with ``peak_ms`` on the timeline's axis
    memory_points: pl.DataFrame = field(default_factory=pl.DataFrame)
    memory_peaks: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: ``critical-path`` and ``diagnose`` results (``Result`` objects), None when not gathered
    critical_path: Any = None
    diagnose: Any = None

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in self.meta.items())
        return (f"<p><b>{_e(self.title)}</b></p><table>{rows}</table>"
                + self.summary._repr_html_())


def gather(source: Any, *, title: str = "traceview report", top: int = 10,
           **run_options: Any) -> ReportData:
    """The report's tables, all from one Run (``source``: a Run, or events in memory with
    ``RunOptions`` such as ``align=`` and ``ranks=`` for their ranks table)."""
    from traceview.analyses.align import apply_offsets
    from traceview.analyses.collectives import instances
    from traceview.analyses.gaps import gap_causes, largest_gaps
    from traceview.run import as_run

    run = as_run(source, **run_options)
    notes: dict[str, list[str]] = {}
    n_ranks = len(run.ranks_present)
    summ = run.summary()
    offsets = run.offsets
    per = run.collective_ranks
    strag = run.stragglers()["ranks"]

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
        spans = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32, "start_ms": pl.Float64,
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

    memory_points, memory_peaks, memory_warnings = _memory(run, notes)
    try:  # a partial report with the reason, never none
        path, todo = run.critical_path(top=top), run.diagnose()
    except Exception as exc:
        path = todo = None
        notes["critical-path"] = [f"critical path failed: {type(exc).__name__}: {exc}"]
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
        "traceview": __version__,
    }
    return ReportData(title=title, meta=meta, summary=summ["ranks"], worst_straggler=summ["worst_straggler"],
                      step_spans=spans, breakdown=bd, lateness=lateness, collectives=inst,
                      stragglers=strag, gap_causes=causes, largest_gaps=biggest,
                      top_kernels=kernels, top_cpu_ops=ops, offsets=offsets, notes=notes,
                      warnings=[*run.warnings, *run.table_warnings("match", "offsets"),
                                *memory_warnings,
                                *(w for w in (path.warnings if path else ())
                                  if w.startswith("critical path:"))],
                      memory_points=memory_points, memory_peaks=memory_peaks,
                      critical_path=path, diagnose=todo)


#: The memory timeline shows at most this many ranks (those with the highest peaks).
MEMORY_RANKS = 16


def _memory(run: Any, notes: dict[str, list[str]]) -> tuple[pl.DataFrame, pl.DataFrame,
                                                             list[str]]:
    """The memory section's timeline points and peaks (``run.memory()``), and the warnings
    that answer adds to the run's (none for traces without allocator events: no section)."""
    from traceview.analyses.memory import timeline_points

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
max-width:40em;overflow-wrap:anywhere}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4em .8em;margin:.5em 0}
.warn{background:#fdecea;border-left:4px solid #d93025;padding:.2em .8em;margin:.5em 0}
.straggler{background:#fdecea}nav a{margin-right:1em}
"""

_SECTIONS = (("summary", "Run summary"), ("steps", "Step timeline"),
             ("breakdown", "Compute, exposed communication and idle"),
             ("collectives", "Collective skew"), ("stragglers", "Stragglers"),
             ("critical-path", "Critical path and what to fix"),
             ("gaps", "Gap causes"), ("kernels", "Top kernels"))


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v / 1e6:.3f}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table(df: pl.DataFrame, columns: list[tuple[str, str, str]], *, row_class: str | None = None,
          limit: int = 200) -> str:
    """An escaped HTML table. ``columns``: (column, header, format) with format ``ms``, ``pct``,
    ``name`` (left-aligned text), ``f3`` or ``text``."""
    if df.height == 0:
        return "<p>(no rows)</p>"
    head = "".join(f"<th>{_e(h)}</th>" for _, h, _ in columns)
    body = []
    for row in df.head(limit).iter_rows(named=True):
        cells = []
        for col, _, fmt in columns:
            v = row.get(col)
            if fmt == "ms":
                cells.append(f"<td>{_ms(v)}</td>")
            elif fmt == "pct":
                cells.append(f"<td>{_pct(v)}</td>")
            elif fmt == "f3":
                cells.append(f"<td>{'-' if v is None else f'{v:.3f}'}</td>")
            elif fmt == "name":
                text = ", ".join(map(str, v)) if isinstance(v, list) else v
                cells.append(f'<td class="name">{_e(text)}</td>')
            else:
                cells.append(f"<td>{_e('-' if v is None else v)}</td>")
        cls = f' class="{row_class}"' if row_class and row.get("flagged") else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    more = f"<p>({df.height - limit} more rows not shown)</p>" if df.height > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def _notes(items: list[str]) -> str:
    return "".join(f'<p class="note">{_e(n)}</p>' for n in items)


def _warnings(items: list[str]) -> str:
    """The warnings, first thing on the page: every number below is read in their light."""
    if not items:
        return ""
    rows = "".join(f"<li>{_e(w)}</li>" for w in items)
    return (f'<section id="warnings" class="warn"><h2>Warnings ({len(items)})</h2>'
            f"<ul>{rows}</ul></section>")


class _Figures:
    """Figures as div snippets with deterministic ids (plotly.js is inlined once, separately)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fig: Any) -> str:
        import plotly.io as pio

        self.count += 1
        return pio.to_html(fig, full_html=False, include_plotlyjs=False,
                           div_id=f"tv-plot-{self.count}",
                           config={"displaylogo": False, "responsive": True})


def render_body(data: ReportData) -> tuple[str, int]:
    """The report's sections as HTML (without plotly.js) and the number of figures."""
    from traceview import plots

    fig = _Figures()
    n = data.notes
    sections = _SECTIONS + ((("memory", "Memory"),) if data.memory_peaks.height else ())
    out = [f"<h1>{_e(data.title)}</h1>", _warnings(data.warnings),
           "<nav>" + "".join(f'<a href="#{k}">{_e(t)}</a>' for k, t in sections) + "</nav>"]

    meta = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in data.meta.items())
    w = data.worst_straggler
    worst = (f"rank {w['rank']} (imposed wait {_ms(w.get('imposed_wait_ns'))} ms)"
             if w.get("rank") is not None else f"none ({w.get('reason')})")
    summ_notes = [f"rank {r}: {t}" for r, t in
                  data.summary.filter(pl.col("note").is_not_null()).select("rank", "note").rows()]
    out += ['<section id="summary"><h2>Run summary</h2>', f"<table>{meta}</table>",
            f"<p><b>Worst straggler:</b> {_e(worst)}</p>",
            table(data.summary, [
                ("rank", "rank", "text"), ("steps", "steps", "text"),
                ("step_time_ns_p50", "step p50 (ms)", "ms"), ("compute_ns", "compute (ms)", "ms"),
                ("comm_ns", "comm (ms)", "ms"), ("exposed_comm_ns", "exposed comm (ms)", "ms"),
                ("hidden_fraction", "comm hidden", "pct"), ("idle_fraction", "GPU idle", "pct"),
                ("top_gap_cause", "top gap cause", "text")]),
            _notes(summ_notes), "</section>"]

    out += ['<section id="steps"><h2>Step timeline</h2>', _notes(n.get("steps", [])),
            fig(plots.step_timeline(data.step_spans)), "</section>"]

    bd = data.breakdown.filter(pl.col("window_ns").is_not_null())
    out += ['<section id="breakdown"><h2>Compute, exposed communication and idle</h2>',
            "<p>Per GPU step window: window = compute + exposed comm + exposed memcpy + "
            "exposed memset + idle (docs/metrics.md).</p>",
            _notes(n.get("breakdown", [])), fig(plots.time_breakdown(data.breakdown)),
            table(bd, [("rank", "rank", "text"), ("device", "device", "text"),
                       ("step", "step", "text"), ("window_ns", "window (ms)", "ms"),
                       ("compute_ns", "compute (ms)", "ms"),
                       ("exposed_comm_ns", "exposed comm (ms)", "ms"),
                       ("idle_ns", "idle (ms)", "ms"), ("idle_fraction", "idle", "pct")])
            if bd.height else "", "</section>"]

    coll = (table(data.collectives, [
        ("instance", "instance", "name"), ("name", "collective", "text"),
        ("n_ranks", "ranks", "text"), ("skew_ns", "skew (ms)", "ms"),
        ("comm_ns", "transfer (ms)", "ms"), ("last_rank", "last rank", "text")], limit=50)
        if data.collectives.height else "")
    out += ['<section id="collectives"><h2>Collective skew</h2>',
            "<p>Each cell: how far the rank's arrival at the collective lagged the first rank's, "
            "on the aligned clock.</p>", _notes(n.get("collectives", [])),
            fig(plots.skew_heatmap(data.lateness)), coll, "</section>"]

    out += ['<section id="stragglers"><h2>Stragglers</h2>',
            fig(plots.straggler_bars(data.stragglers)),
            table(data.stragglers, [
                ("rank", "rank", "text"), ("flagged", "flagged", "text"),
                ("imposed_wait_ns", "imposed wait (ms)", "ms"),
                ("last_arrivals", "last arrivals", "text"), ("instances", "instances", "text"),
                ("explanation", "explanation", "name")], row_class="straggler"),
            "</section>"]

    out += _critical_path_section(data)

    out += ['<section id="gaps"><h2>Gap causes</h2>', _notes(n.get("gaps", [])),
            fig(plots.gap_causes(data.gap_causes)),
            table(data.largest_gaps, [
                ("rank", "rank", "text"), ("device", "device", "text"),
                ("gap_ns", "gap (ms)", "ms"), ("cause", "cause", "text"),
                ("prev_name", "before", "name"), ("next_name", "after", "name"),
                ("launch_op", "launched by", "name"), ("ops_during", "host ops during", "name")])
            if data.largest_gaps.height else "", "</section>"]

    if data.top_kernels.height:
        top = (fig(plots.top_items(data.top_kernels)) + table(data.top_kernels, [
            ("rank", "rank", "text"), ("gpu_class", "class", "text"), ("count", "count", "text"),
            ("total_ns", "total (ms)", "ms"), ("share_of_gpu_time", "share", "pct"),
            ("name", "kernel", "name")]))
    else:
        top = (fig(plots.top_items(data.top_cpu_ops, value="self_ns",
                                   title="Top host operators by self time"))
               + table(data.top_cpu_ops, [("rank", "rank", "text"), ("count", "count", "text"),
                                          ("self_ns", "self (ms)", "ms"),
                                          ("total_ns", "total (ms)", "ms"),
                                          ("name", "operator", "name")]))
    out += ['<section id="kernels"><h2>Top kernels</h2>', _notes(n.get("kernels", [])), top,
            "</section>"]
    out += _memory_section(data, fig)
    return "\n".join(out), fig.count


def _memory_section(data: ReportData, fig: _Figures) -> list[str]:
    """Allocated bytes over time per rank and device, each peak marked, and the peaks; no
    section for traces without allocator events (recorded without profile_memory)."""
    from traceview import plots

    peaks = data.memory_peaks
    if peaks.height == 0:
        return []
    return ['<section id="memory"><h2>Memory</h2>',
            "<p>Allocated bytes per rank and device over time, the peak marked (basis "
            "<i>absolute</i>: the allocator's totals; <i>relative</i>: from the trace's "
            "start). Definitions: docs/metrics.md, Memory timelines.</p>",
            _notes(data.notes.get("memory", [])),
            fig(plots.memory_timeline(data.memory_points,
                                      peaks.filter(pl.col("peak_ms").is_not_null()))),
            table(peaks.with_columns(
                peak_allocated_mib=pl.col("peak_allocated_bytes") / 2**20,
                peak_reserved_mib=pl.col("peak_reserved_bytes") / 2**20,
                growth_mib=pl.col("growth_bytes") / 2**20), [
                ("rank", "rank", "text"), ("device", "device", "text"),
                ("basis", "basis", "text"), ("peak_allocated_mib", "peak allocated (MiB)", "f3"),
                ("peak_reserved_mib", "peak reserved (MiB)", "f3"),
                ("peak_op", "op at the peak", "name"),
                ("growth_mib", "growth over steps (MiB)", "f3"),
                ("near_limit", "near limit", "text"), ("leak_suspected", "leak?", "text")]),
            "</section>"]


def _critical_path_section(data: ReportData) -> list[str]:
    """The cross-rank critical path (each rank's share, the categories, the top ops) and the
    to-do list of ``diagnose``, biggest gain first."""
    cp, dx = data.critical_path, data.diagnose
    if cp is None or dx is None:
        failed = data.notes.get("critical-path", [])
        return ['<section id="critical-path"><h2>Critical path and what to fix</h2>',
                _notes(failed), "</section>"] if failed else []
    cats = pl.DataFrame([{"category": c, **v} for c, v in cp["categories"].items()])
    todo = dx["findings"].filter(pl.col("severity") != "info")
    info = [f["title"] for f in dx["findings"].filter(pl.col("severity") == "info")
            .iter_rows(named=True)]
    return ['<section id="critical-path"><h2>Critical path and what to fix</h2>',
            "<p>The longest chain of dependent work across ranks, step by step: it jumps to the "
            "rank that arrived last at each collective. A fix's gain is what the path would "
            "lose per step.</p>", _notes(info),
            table(todo, [("severity", "severity", "text"),
                         ("gain_ns_per_step", "gain (ms/step)", "ms"),
                         ("gain_share", "of the step", "pct"), ("title", "finding", "name"),
                         ("recommendation", "what to do", "name")]),
            table(cp["ranks"].filter(pl.col("path_ns") > 0), [
                ("rank", "rank", "text"), ("path_ns", "path (ms)", "ms"),
                ("share", "share", "pct"), ("top_category", "mostly", "text")]),
            table(cats, [("category", "category", "name"),
                         ("per_step_ns", "per step (ms)", "ms"), ("share", "share", "pct")]),
            table(cp["top_ops"], [("name", "op on the path", "name"),
                                  ("category", "category", "text"), ("ranks", "ranks", "name"),
                                  ("per_step_ns", "per step (ms)", "ms"),
                                  ("share", "share", "pct")]),
            table(cp["steps"], [("step", "step", "text"), ("path_ns", "path (ms)", "ms"),
                                ("step_ns", "step (ms)", "ms"), ("coverage", "coverage", "pct"),
                                ("top_rank", "top rank", "text")], limit=50),
            "</section>"]


def write_html(data: ReportData, fp: TextIO) -> int:
    """Write the self-contained report to ``fp``; returns the number of figures."""
    from traceview.plots import _go

    _go()  # fail early with the install hint when plotly is missing
    from plotly.offline import get_plotlyjs

    body, count = render_body(data)
    fp.write('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
             '<meta name="viewport" content="width=device-width, initial-scale=1">'
             f'<meta name="generator" content="traceview {__version__}">'
             f"<title>{_e(data.title)}</title><style>{_CSS}</style>"
             '<script type="text/javascript">')
    fp.write(get_plotlyjs())
    fp.write("</script></head><body>\n")
    fp.write(body)
    fp.write("\n</body></html>\n")
    return count
