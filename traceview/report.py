"""The one-file HTML report: gather the analyses' result frames, then write them.

Two steps, kept apart (renderers take results and a file object):

* :func:`gather` asks one Run for the analyses (summary, step breakdown, collectives,
  stragglers, gaps, top kernels / CPU ops, clock alignment) and returns a :class:`ReportData` of frames, each
  section with the reason it is partial when the traces cannot give it (CPU-only, no steps,
  one rank, no collectives).
* :func:`write_html` writes one self-contained HTML file: plotly.js is inlined once, nothing is
  fetched when the file is opened, and every name from a trace is HTML-escaped.

The page stays readable at any scale (docs/report.md): the spread across ranks and the outlier
ranks rather than a row per rank, heatmaps past 32 ranks, steps binned past 300, tables capped
to their top rows (``report_html``), prose only about flagged ranks, a sentence where a figure
would be empty.

>>> import io, traceview                                         # doctest: +SKIP
>>> data = gather(traceview.open("fixtures/data/gloo_ddp_2r"))  # doctest: +SKIP
>>> write_html(data, io.StringIO())                              # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TextIO

import polars as pl

from traceview import __version__
from traceview import report_html as H

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
    #: the top kernels over all ranks (``analyses.breakdown.kernels_across_ranks``)
    kernel_totals: pl.DataFrame | None = None
    #: achieved FLOP/s and MFU per rank and step, when the trace carries FLOP counts
    flops: pl.DataFrame | None = None
    #: the NCCL debug log's view (``--nccl-log``): ``choices`` and ``calls`` tables
    nccl: dict[str, pl.DataFrame] | None = None
    #: the memory timeline (``analyses.memory.timeline_points``) and the trace rows of
    #: ``run.memory()`` with ``peak_ms`` on the timeline's axis
    memory_points: pl.DataFrame = field(default_factory=pl.DataFrame)
    memory_peaks: pl.DataFrame = field(default_factory=pl.DataFrame)
    #: ``critical-path`` and ``diagnose`` results (``Result`` objects), None when not gathered
    critical_path: Any = None
    diagnose: Any = None

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th>{H.e(k)}</th><td>{H.e(v)}</td></tr>"
                       for k, v in self.meta.items())
        return (f"<p><b>{H.e(self.title)}</b></p><table>{rows}</table>"
                + self.summary._repr_html_())


def gather(source: Any, *, title: str = "traceview report", top: int = 10,
           nccl_logs: list[str] | None = None, **run_options: Any) -> ReportData:
    """The report's tables, all from one Run (``source``: a Run, or events in memory with
    ``RunOptions`` such as ``align=`` and ``ranks=`` for their ranks table; ``nccl_logs``:
    NCCL debug log files whose algorithm and protocol choices the report shows)."""
    from traceview.analyses.align import apply_offsets
    from traceview.analyses.breakdown import kernels_across_ranks
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
    totals = kernels_across_ranks(run.gpu, n=top).with_columns(
        pl.col(pl.Categorical).cast(pl.String))

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
                      warnings=[*run.warnings, *run.table_warnings("gpu", "match", "offsets"),
                                *memory_warnings,
                                *(w for w in (path.warnings if path else ())
                                  if w.startswith("critical path:"))],
                      kernel_totals=totals, flops=run.flops_per_step(),
                      nccl=run.nccl_log_view(nccl_logs) if nccl_logs else None,
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
max-width:24em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
td.prose{text-align:left;max-width:48em}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4em .8em;margin:.5em 0}
.nofig{color:#555;font-style:italic;margin:.8em 0}
.warn{background:#fdecea;border-left:4px solid #d93025;padding:.2em .8em;margin:.5em 0}
.straggler{background:#fdecea}nav a{margin-right:1em}details{margin:.3em 0 1em}
summary{cursor:pointer;color:#1a5fb4}
"""

_SECTIONS = (("summary", "Run summary"), ("steps", "Steps"),
             ("breakdown", "Compute, exposed communication and idle"),
             ("flops", "FLOPs and MFU"), ("collectives", "Collective skew"),
             ("nccl", "NCCL log"), ("stragglers", "Stragglers"),
             ("critical-path", "Critical path and what to fix"),
             ("gaps", "Gap causes"), ("kernels", "Top kernels"), ("memory", "Memory"))

#: The summary columns whose spread across ranks the summary shows.
_SPREAD = (("step_time_ns_p50", "step time p50 (ms)", "ms"), ("compute_ns", "compute (ms)", "ms"),
           ("comm_ns", "comm (ms)", "ms"), ("exposed_comm_ns", "exposed comm (ms)", "ms"),
           ("idle_fraction", "GPU idle", "pct"))
#: Rank-steps up to which the step timeline draws one bar per step (else a heatmap).
_TIMELINE_BARS = 400
#: Steps from which the report adds the per-step series (binned past plots.MAX_COLUMNS).
_SERIES_STEPS = 10

_e, _ms = H.e, H.ms
table = H.table  # kept for callers of report.table


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


def _n_ranks(data: ReportData) -> int:
    return int(data.meta.get("ranks") or data.summary.height)


def _summary(data: ReportData) -> list[str]:
    """The run in one screen: its facts, the worst straggler, the spread across ranks, and
    the ranks worth a look (outliers, flagged) before the others."""
    from traceview.analyses.spread import distribution

    meta = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in data.meta.items())
    w = data.worst_straggler
    worst = (f"<b>Worst straggler: rank {_e(w['rank'])}</b> (imposed wait "
             f"{_ms(w.get('imposed_wait_ns'))} ms)" if w.get("rank") is not None else
             f"<b>Worst straggler:</b> none ({_e(w.get('reason'))})")
    out = ['<section id="summary"><h2>Run summary</h2>', f"<table>{meta}</table>",
           f"<p>{worst}</p>"]
    summ = data.summary
    interesting: list[int] = []
    if summ.height >= 3:
        spread = distribution(summ, [c for c, _, _ in _SPREAD])
        fmt = {c: (h, f) for c, h, f in _SPREAD}
        rows = []
        why: dict[int, list[str]] = {}  # outlier rank -> where it stands out
        for r in spread.iter_rows(named=True):
            head, f = fmt[r["metric"]]
            show = H.ms if f == "ms" else H.pct
            values = dict(summ.select("rank", r["metric"]).rows())
            for rank in r["outlier_ranks"]:
                unit = " ms" if f == "ms" else ""
                why.setdefault(rank, []).append(
                    f"{head.split(' (')[0]} {show(values[rank])}{unit} vs median "
                    f"{show(r['median'])}{unit}")
            rows.append(f"<tr><th>{_e(head)}</th><td>{show(r['median'])}</td>"
                        f"<td>{show(r['p90'])}</td><td>{show(r['max'])}</td>"
                        f"<td>{_e(r['max_rank'])}</td>"
                        f"<td>{_e(H.ranks_text(r['outlier_ranks']))}</td></tr>")
            interesting += [x for x in r["outlier_ranks"] if x not in interesting]
        out.append(f"<p>Across {summ.height} ranks (outliers: far from the median by the "
                   "robust rule of docs/metrics.md):</p><table><thead><tr><th>metric</th>"
                   "<th>median</th><th>p90</th><th>max</th><th>max rank</th>"
                   f"<th>outlier ranks</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
        if why:
            items = list(why.items())
            out.append("<p>Outlier ranks: " + "; ".join(
                f"<b>rank {_e(rank)}</b> ({_e(', '.join(texts))})"
                for rank, texts in items[:H.VISIBLE_ROWS])
                + (f"; and {len(items) - H.VISIBLE_ROWS} more" if len(items) > H.VISIBLE_ROWS
                   else "") + ".</p>")
    flagged = (data.stragglers.filter(pl.col("flagged"))["rank"].to_list()
               if data.stragglers.height and "flagged" in data.stragglers.columns else [])
    first = [*flagged, *(r for r in interesting if r not in flagged)]
    ordered = (pl.concat([summ.filter(pl.col("rank").is_in(first)).sort(
        pl.col("rank").replace_strict(first, list(range(len(first))), default=len(first))),
        summ.filter(~pl.col("rank").is_in(first)).sort("rank")])
        if first and summ.height > H.VISIBLE_ROWS else summ)
    if first and summ.height > H.VISIBLE_ROWS:
        out.append(f"<p>Per rank, flagged and outlier ranks first ({len(first)}):</p>")
    out.append(table(ordered, [
        ("rank", "rank", "text"), ("steps", "steps", "text"),
        ("step_time_ns_p50", "step p50 (ms)", "ms"), ("compute_ns", "compute (ms)", "ms"),
        ("comm_ns", "comm (ms)", "ms"), ("exposed_comm_ns", "exposed comm (ms)", "ms"),
        ("hidden_fraction", "comm hidden", "pct"), ("idle_fraction", "GPU idle", "pct"),
        ("top_gap_cause", "top gap cause", "text")],
        visible=min(2 * H.VISIBLE_ROWS, max(H.VISIBLE_ROWS, len(first))),
        every_row="traceview summary --csv"))
    summ_notes = [f"rank {r}: {t}" for r, t in
                  summ.filter(pl.col("note").is_not_null()).select("rank", "note").rows()]
    out += [H.notes(summ_notes[:H.VISIBLE_ROWS])
            + (f"<p>({len(summ_notes) - H.VISIBLE_ROWS} more rank notes: traceview summary)</p>"
               if len(summ_notes) > H.VISIBLE_ROWS else ""), "</section>"]
    return out


def _steps(data: ReportData, fig: _Figures) -> list[str]:
    from traceview import plots
    from traceview.analyses.spread import binned_steps

    spans = data.step_spans
    out = ['<section id="steps"><h2>Steps</h2>', H.notes(data.notes.get("steps", []))]
    if spans.height == 0:
        return [*out, H.sentence("No step timeline: the traces have no ProfilerStep ranges."),
                "</section>"]
    ranks = spans["rank"].n_unique()
    if ranks <= plots.MANY_RANKS and spans.height <= _TIMELINE_BARS:
        out.append(fig(plots.step_timeline(spans)))
    else:
        out.append(fig(plots.rank_step_heatmap(spans)))
    steps = spans["step"].n_unique()
    if steps >= _SERIES_STEPS:
        binned = binned_steps(spans, "dur_ms", bins=plots.MAX_COLUMNS)
        worst = (spans.sort("dur_ms", "rank", descending=[True, False])
                 .unique("step", keep="first", maintain_order=True).head(5)
                 .select("step", "rank", ms="dur_ms"))
        out.append(fig(plots.step_series(binned, worst)))
        out.append("<p>Slowest steps: " + ", ".join(
            f"step {s} ({m:.3f} ms, rank {r})" for s, r, m in worst.rows()) + ".</p>")
    return [*out, "</section>"]


def _breakdown(data: ReportData, fig: _Figures) -> list[str]:
    from traceview import plots

    bd = data.breakdown.filter(pl.col("window_ns").is_not_null())
    out = ['<section id="breakdown"><h2>Compute, exposed communication and idle</h2>',
           "<p>Per GPU step window: window = compute + exposed comm + exposed memcpy + "
           "exposed memset + idle (docs/metrics.md).</p>", H.notes(
               data.notes.get("breakdown", [])[:H.VISIBLE_ROWS])]
    if bd.height == 0:
        return [*out, H.sentence("No GPU time to break down: the traces have no GPU events."),
                "</section>"]
    ranks = bd["rank"].n_unique()
    stepped = bd.filter(pl.col("step").is_not_null())
    parts = [c for c in plots.PART_COLOURS if c in bd.columns]
    per_rank = ((stepped if stepped.height else bd).group_by("rank")
                .agg(*(pl.col(c).mean() for c in parts)).sort("rank"))
    if ranks <= plots.MANY_RANKS and bd.height <= 200:
        out.append(fig(plots.time_breakdown(data.breakdown)))
    elif ranks <= plots.MANY_RANKS:
        out.append(fig(plots.rank_bars(per_rank)))
    else:
        out.append(fig(plots.part_boxes(per_rank)))
    rows = stepped if stepped.height else bd  # the whole-trace rows only without steps
    longest = rows.sort("window_ns", "rank", "step", descending=[True, False, False],
                        nulls_last=True)
    out += ["<p>Rank-steps, longest GPU window first:</p>" if rows.height > H.VISIBLE_ROWS
            else "", table(longest, [
                ("rank", "rank", "text"), ("device", "device", "text"), ("step", "step", "text"),
                ("window_ns", "window (ms)", "ms"), ("compute_ns", "compute (ms)", "ms"),
                ("exposed_comm_ns", "exposed comm (ms)", "ms"), ("idle_ns", "idle (ms)", "ms"),
                ("idle_fraction", "idle", "pct")], every_row="traceview breakdown --csv"),
            "</section>"]
    return out


def _flops(data: ReportData) -> list[str]:
    """Achieved TFLOP/s and MFU per rank, when the trace carries FLOP counts."""
    from traceview.analyses.spread import distribution

    f = data.flops
    if f is None or f.height == 0:
        return []
    per_rank = (f.group_by("rank").agg(
        steps=pl.len(), achieved_tflops=pl.col("achieved_tflops").median(),
        mfu=pl.col("mfu").median(), peak_tflops=pl.col("peak_tflops").first(),
        note=pl.col("note").drop_nulls().first()).sort("rank"))
    spread = distribution(per_rank, ["achieved_tflops", "mfu"]).row(0, named=True)
    mfu = distribution(per_rank, ["mfu"]).row(0, named=True)
    text = (f"Achieved {spread['median']:.1f} TFLOP/s per rank (median over ranks of each "
            f"rank's median step; max {spread['max']:.1f} on rank {spread['max_rank']})")
    text += (f", MFU {100 * mfu['median']:.1f}% of the {per_rank['peak_tflops'][0]:g} TFLOP/s "
             "peak." if mfu["median"] is not None else
             ": no MFU (" + str(per_rank["note"].drop_nulls().first() or "no peak") + ").")
    return ['<section id="flops"><h2>FLOPs and MFU</h2>', f"<p>{_e(text)}</p>",
            "<p>From the FLOP counts the profiler recorded on the host ops "
            "(<code>with_flops=True</code>) over the step time (docs/metrics.md).</p>",
            table(per_rank, [("rank", "rank", "text"), ("steps", "steps", "text"),
                             ("achieved_tflops", "TFLOP/s (median step)", "f3"),
                             ("mfu", "MFU", "pct"), ("peak_tflops", "peak TFLOP/s", "text")],
                  every_row="traceview breakdown --json (field flops)"), "</section>"]


def _collectives(data: ReportData, fig: _Figures) -> list[str]:
    from traceview import plots

    out = ['<section id="collectives"><h2>Collective skew</h2>',
           "<p>Each cell: how far the rank's arrival at the collective lagged the first rank's, "
           "on the aligned clock.</p>", H.notes(data.notes.get("collectives", [])[:20])]
    if data.lateness.height == 0:
        return [*out, H.sentence("No skew to draw: no collective was matched across ranks."),
                "</section>"]
    out.append(fig(plots.skew_heatmap(data.lateness)))
    inst = data.collectives
    if inst.height:
        worst = inst.sort("skew_ns", descending=True, nulls_last=True)
        out += ["<p>Instances, largest skew first:</p>", table(worst, [
            ("instance", "instance", "name"), ("name", "collective", "text"),
            ("n_ranks", "ranks", "text"), ("skew_ns", "skew (ms)", "ms"),
            ("comm_ns", "transfer (ms)", "ms"), ("last_rank", "last rank", "text")],
            every_row="traceview collectives --csv")]
    return [*out, "</section>"]


def _nccl(data: ReportData) -> list[str]:
    if not data.nccl:
        return []
    choices, calls = data.nccl["choices"], data.nccl["calls"]
    out = ['<section id="nccl"><h2>NCCL log</h2>']
    if choices.height:
        out += ["<p>The algorithm and protocol NCCL chose, per collective and message size "
                "(its <code>Bytes -&gt; Algo</code> lines, <code>NCCL_DEBUG_SUBSYS=TUNING</code>"
                " or COLL):</p>", table(choices, [
                    ("collective", "collective", "text"), ("algorithm", "algorithm", "text"),
                    ("protocol", "protocol", "text"), ("calls", "calls", "text"),
                    ("min_bytes", "min bytes", "text"), ("max_bytes", "max bytes", "text")],
                    every_row="traceview collectives --nccl-log FILE --json")]
    else:
        out.append(H.sentence("The log names no algorithm or protocol (it has no "
                              "'Bytes -> Algo' lines: log with NCCL_DEBUG_SUBSYS=TUNING)."))
    if calls.height:
        out += ["<p>Calls in the log:</p>", table(calls, [
            ("collective", "collective", "text"), ("ranks", "ranks", "text"),
            ("calls", "calls", "text"), ("bytes", "bytes", "text"),
            ("dtypes", "dtypes", "text")])]
    return [*out, "</section>"]


def _stragglers(data: ReportData, fig: _Figures) -> list[str]:
    from traceview import plots

    s = data.stragglers
    out = ['<section id="stragglers"><h2>Stragglers</h2>']
    if s.height < 2 or "flagged" not in s.columns:
        reason = data.worst_straggler.get("reason") or "fewer than two ranks"
        return [*out, H.sentence(f"No straggler analysis: {reason}."), "</section>"]
    flagged = s.filter(pl.col("flagged"))
    if s["imposed_wait_ns"].max() or flagged.height:
        out.append(fig(plots.straggler_bars(s)))
    else:
        out.append(H.sentence("No rank imposed any wait on the others."))
    # prose only about the flagged ranks; the others are numbers
    for r in flagged.sort("imposed_wait_ns", descending=True).head(
            H.VISIBLE_ROWS).iter_rows(named=True):
        out.append(f"<p><b>rank {_e(r['rank'])}</b>: {_e(r.get('explanation'))}</p>")
    if flagged.height == 0:
        top = s.sort("imposed_wait_ns", "rank", descending=[True, False]).row(0, named=True)
        out.append(f"<p>No rank flagged among {s.height}; the largest imposed wait is rank "
                   f"{_e(top['rank'])}'s, {_ms(top['imposed_wait_ns'])} ms.</p>")
    shown = s.sort(["flagged", "imposed_wait_ns", "rank"], descending=[True, True, False])
    out += [table(shown, [
        ("rank", "rank", "text"), ("flagged", "flagged", "text"),
        ("imposed_wait_ns", "imposed wait (ms)", "ms"),
        ("last_arrivals", "last arrivals", "text"), ("instances", "instances", "text"),
        *([("confidence", "confidence", "text")] if "confidence" in s.columns else [])],
        row_class="straggler", every_row="traceview stragglers --csv"), "</section>"]
    return out


def _gaps(data: ReportData, fig: _Figures) -> list[str]:
    from traceview import plots

    out = ['<section id="gaps"><h2>Gap causes</h2>', H.notes(data.notes.get("gaps", []))]
    causes = data.gap_causes
    if causes.height == 0:
        return [*out, H.sentence("No idle gaps to draw: " + (
            "the traces have no GPU events." if data.top_kernels.height == 0 else
            "the GPU timeline has no holes.")), "</section>"]
    ranks = causes["rank"].n_unique()
    out.append(fig(plots.gap_causes(causes) if ranks <= plots.MANY_RANKS
                   else plots.cause_totals(causes)))
    out += ["<p>Largest gaps:</p>", table(data.largest_gaps, [
        ("rank", "rank", "text"), ("device", "device", "text"),
        ("gap_ns", "gap (ms)", "ms"), ("cause", "cause", "text"),
        ("prev_name", "before", "name"), ("next_name", "after", "name"),
        ("launch_op", "launched by", "name"), ("ops_during", "host ops during", "name")])
        if data.largest_gaps.height else "", "</section>"]
    return out


def _kernels(data: ReportData, fig: _Figures) -> list[str]:
    from traceview import plots

    out = ['<section id="kernels"><h2>Top kernels</h2>', H.notes(data.notes.get("kernels", []))]
    totals = data.kernel_totals
    if totals is not None and totals.height:
        out += [fig(plots.top_items(totals, title="Top kernels by total time, all ranks")),
                table(totals, [
                    ("name", "kernel", "name"), ("gpu_class", "class", "text"),
                    ("ranks", "ranks", "text"), ("count", "count", "text"),
                    ("total_ns", "total (ms)", "ms"), ("share_of_gpu_time", "share", "pct"),
                    ("rank_median_ns", "per rank median (ms)", "ms"),
                    ("rank_max_ns", "per rank max (ms)", "ms"), ("max_rank", "max rank", "text")],
                    every_row="traceview breakdown --csv")]
    elif data.top_cpu_ops.height:
        ops = (data.top_cpu_ops.group_by("name").agg(
            ranks=pl.col("rank").n_unique(), count=pl.col("count").sum(),
            self_ns=pl.col("self_ns").sum(), total_ns=pl.col("total_ns").sum())
            .sort("self_ns", "name", descending=[True, False]).head(H.VISIBLE_ROWS))
        out += [fig(plots.top_items(ops, value="self_ns",
                                    title="Top host operators by self time, all ranks")),
                table(ops, [("name", "operator", "name"), ("ranks", "ranks", "text"),
                            ("count", "count", "text"), ("self_ns", "self (ms)", "ms"),
                            ("total_ns", "total (ms)", "ms")])]
    else:
        out.append(H.sentence("No kernels and no host operators to rank."))
    return [*out, "</section>"]


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
            H.notes(data.notes.get("memory", [])),
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
                H.notes(failed), "</section>"] if failed else []
    cats = pl.DataFrame([{"category": c, **v} for c, v in cp["categories"].items()])
    todo = dx["findings"].filter(pl.col("severity") != "info")
    info = [f["title"] for f in dx["findings"].filter(pl.col("severity") == "info")
            .iter_rows(named=True)]
    return ['<section id="critical-path"><h2>Critical path and what to fix</h2>',
            "<p>The longest chain of dependent work across ranks, step by step: it jumps to the "
            "rank that arrived last at each collective. A fix's gain is what the path would "
            "lose per step.</p>", H.notes(info),
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
                                ("top_rank", "top rank", "text")]),
            "</section>"]


def render_body(data: ReportData) -> tuple[str, int]:
    """The report's sections as HTML (without plotly.js) and the number of figures."""
    fig = _Figures()
    shown = {"flops": data.flops is not None and data.flops.height > 0, "nccl": bool(data.nccl),
             "memory": data.memory_peaks.height > 0,
             "critical-path": data.critical_path is not None
             or bool(data.notes.get("critical-path"))}
    out = [f"<h1>{_e(data.title)}</h1>", H.warnings(data.warnings),
           "<nav>" + "".join(f'<a href="#{k}">{_e(t)}</a>' for k, t in _SECTIONS
                             if shown.get(k, True)) + "</nav>"]
    out += _summary(data)
    out += _steps(data, fig)
    out += _breakdown(data, fig)
    out += _flops(data)
    out += _collectives(data, fig)
    out += _nccl(data)
    out += _stragglers(data, fig)
    out += _critical_path_section(data)
    out += _gaps(data, fig)
    out += _kernels(data, fig)
    out += _memory_section(data, fig)
    return "\n".join(out), fig.count


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
