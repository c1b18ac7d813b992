"""The HTML report's sections: each renders one part of a :class:`~traceview.outputs.report_data.ReportData`
as escaped HTML, scaled to the run (docs/report.md: the spread across ranks and the outlier
ranks rather than a row per rank, heatmaps past 32 ranks, steps binned past 300, tables capped
to their top rows, prose only about flagged ranks, a sentence where a figure would be empty).
:func:`render_body` puts them in order; :mod:`traceview.outputs.report` gathers the data and writes the
page around them.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceview._dependencies import lazy_module
from traceview.analyses.spread import binned_steps, distribution
from traceview.outputs import plots
from traceview.outputs import report_html as H
from traceview.outputs.report_data import ReportData
from traceview.outputs.words import finding_headline, is_note, straggler_sentence

pio = lazy_module("plotly.io", error=plots.PlotsUnavailable, missing=plots.PLOTLY_MISSING)

_SECTIONS = (("verdict", "Verdict"), ("summary", "Run summary"), ("steps", "Steps"),
             ("breakdown", "Compute, exposed communication and idle"),
             ("flops", "FLOPs and MFU"), ("collectives", "Collective skew"),
             ("nccl", "NCCL log"), ("hang", "Hang (flight recorder)"),
             ("stragglers", "Stragglers"), ("pipeline", "Pipeline"),
             ("alltoall", "All-to-all"),
             ("critical-path", "Critical path and what to fix"),
             ("gaps", "Gap causes"), ("kernels", "Top kernels"),
             ("roofline", "Operators against the roofline"), ("memory", "Memory"),
             ("history", "History"))

#: The summary columns whose spread across ranks the summary shows.
_SPREAD = (("step_time_ns_p50", "step time p50 (ms)", "ms"), ("compute_ns", "compute (ms)", "ms"),
           ("comm_ns", "comm (ms)", "ms"), ("exposed_comm_ns", "exposed comm (ms)", "ms"),
           ("idle_fraction", "GPU idle", "pct"))
#: Rank-steps up to which the step timeline draws one bar per step (else a heatmap).
_TIMELINE_BARS = 400
#: Steps from which the report adds the per-step series (binned past plots.MAX_COLUMNS).
_SERIES_STEPS = 10

_e, _ms = H.e, H.ms
table = H.table


class _Figures:
    """Figures as div snippets with deterministic ids (plotly.js is inlined once, separately)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fig: Any) -> str:
        self.count += 1
        return pio.to_html(fig, full_html=False, include_plotlyjs=False,
                           div_id=f"tv-plot-{self.count}",
                           config={"displaylogo": False, "responsive": True})


def _n_ranks(data: ReportData) -> int:
    return int(data.meta.get("ranks") or data.summary.height)


def _summary(data: ReportData) -> list[str]:
    """The run in one screen: its facts, the worst straggler, the spread across ranks, and
    the ranks worth a look (outliers, flagged) before the others."""
    meta = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in data.meta.items())
    out = ['<section id="summary"><h2>Run summary</h2>', f"<table>{meta}</table>"]
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
                  summ.filter(pl.col("note").is_not_null()).select("rank", "note").rows()
                  if not is_note(t)]
    out += [H.notes(summ_notes[:H.VISIBLE_ROWS])
            + (f"<p>({len(summ_notes) - H.VISIBLE_ROWS} more rank notes: traceview summary)</p>"
               if len(summ_notes) > H.VISIBLE_ROWS else ""), "</section>"]
    return out


def _steps(data: ReportData, fig: _Figures) -> list[str]:
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
        lo, hi, mid = spans["dur_ms"].min(), spans["dur_ms"].max(), spans["dur_ms"].median()
        if mid and (hi - lo) < 2 * plots.MIN_COLOUR_SPAN * mid:
            out.append(f"<p>Step times span {lo:.3f}&ndash;{hi:.3f} ms, "
                       f"{100 * (hi - lo) / mid:.1f}% of the median: the colours cover "
                       f"&plusmn;{100 * plots.MIN_COLOUR_SPAN:.0f}% of the median, so a "
                       "spread this small shows as one colour (it is noise, not "
                       "structure).</p>")
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
    # all rows shown: in step order (552 came before 551 with no word why); more than the
    # page shows: the longest first, said so
    many = rows.height > H.VISIBLE_ROWS
    ordered = (rows.sort("window_ns", "rank", "step", descending=[True, False, False],
                         nulls_last=True) if many else
               rows.sort("rank", "device", "step", nulls_last=True))
    out += ["<p>Rank-steps, longest GPU window first:</p>" if many
            else "", table(ordered, [
                ("rank", "rank", "text"), ("device", "device", "text"), ("step", "step", "text"),
                ("window_ns", "window (ms)", "ms"), ("compute_ns", "compute (ms)", "ms"),
                ("exposed_comm_ns", "exposed comm (ms)", "ms"), ("idle_ns", "idle (ms)", "ms"),
                ("idle_fraction", "idle", "pct")], every_row="traceview breakdown --csv"),
            "</section>"]
    return out


def _flops(data: ReportData) -> list[str]:
    """Achieved TFLOP/s and MFU per rank, when the trace carries FLOP counts."""
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
    out = ['<section id="collectives"><h2>Collective skew</h2>',
           "<p>Each cell: how far the rank's arrival at the collective lagged the first rank's, "
           "on the aligned clock.</p>", H.notes(data.notes.get("collectives", [])[:20])]
    if data.lateness.height == 0:
        return [*out, H.sentence("No skew to draw: no collective was matched across ranks."),
                "</section>"]
    out.append(fig(plots.skew_heatmap(data.lateness)))
    rows = data.collective_summary
    if rows is not None and rows.height:
        out += ["<p>What each collective's time is made of (<code>time_is</code>: arrival "
                "spread against transfer, docs/metrics.md), per group, op, size and node "
                "span:</p>", table(rows, [
                    ("group", "group", "text"), ("name", "collective", "text"),
                    ("size_bucket", "size", "text"), ("locality", "nodes", "text"),
                    ("instances", "instances", "text"), ("skew_p50_ns", "spread p50 (ms)", "ms"),
                    ("own_spread_p50_ns", "own spread p50 (ms)", "ms"),
                    ("comm_p50_ns", "transfer p50 (ms)", "ms"),
                    ("busbw_p50_gbps", "bus GB/s p50", "f3"), ("time_is", "time is", "text")],
                    every_row="traceview collectives --json (field summary)")]
    inst = data.collectives
    if inst.height:
        worst = inst.sort("skew_ns", descending=True, nulls_last=True)
        out += ["<p>Instances, largest skew first:</p>", table(worst, [
            ("instance", "instance", "name"), ("name", "collective", "text"),
            ("n_ranks", "ranks", "text"), ("skew_ns", "skew (ms)", "ms"),
            ("comm_ns", "transfer (ms)", "ms"), ("last_rank", "last rank", "text"),
            ("time_is", "time is", "text"), ("node_span", "nodes", "text")],
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


def _hang(data: ReportData) -> list[str]:
    """``report --fr-dumps``: the flight-recorder verdict (``traceview hang``)."""
    h = data.hang
    if h is None:
        return []
    out = ['<section id="hang"><h2>Hang (flight recorder)</h2>',
           H.notes(h["notes"]),
           H.sentence(f"Dumps from ranks {', '.join(map(str, h['dumped_ranks']))} of "
                      f"{h['world_size']}; missing: "
                      f"{', '.join(map(str, h['missing_dumps'])) or 'none'}. "
                      + ("Every process group is consistent." if h["consistent"] else
                         f"Culprit ranks: {', '.join(map(str, h['culprit_ranks'])) or 'none'};"
                         f" stuck at collective #{h['stuck_seq']} of group "
                         f"{h['stuck_group']}."))]
    groups = pl.DataFrame([{k: g[k] for k in ("group", "group_desc", "completed_by_all",
                                               "stuck_seq", "confidence", "reason")}
                           | {"culprits": ", ".join(map(str, g["culprits"])),
                              "waiting": "; ".join(f"rank {w['rank']}: {w['op']} #{w['seq']} "
                                                   f"{w['sizes']}" for w in g["waiting"])}
                           for g in h["groups"]], infer_schema_length=None)
    if groups.height:
        out.append(table(groups, [
            ("group", "group", "text"), ("group_desc", "description", "text"),
            ("completed_by_all", "last completed by all", "text"),
            ("stuck_seq", "stuck at", "text"), ("culprits", "culprits", "text"),
            ("confidence", "confidence", "text"), ("reason", "why", "prose"),
            ("waiting", "the others wait in", "prose")], every_row="traceview hang --json"))
    return [*out, "</section>"]


def _stragglers(data: ReportData, fig: _Figures) -> list[str]:
    s = data.stragglers
    out = ['<section id="stragglers"><h2>Stragglers</h2>']
    if s.height < 2 or "flagged" not in s.columns:
        reason = data.worst_straggler.get("reason") or "fewer than two ranks"
        return [*out, H.sentence(f"No straggler analysis: {reason}."), "</section>"]
    flagged = s.filter(pl.col("flagged"))
    out += [H.sentence(f"Node: {n}.") for n in data.notes.get("nodes", [])]
    if s["imposed_wait_ns"].max() or flagged.height:
        out.append(fig(plots.straggler_bars(s)))
    else:
        out.append(H.sentence("No rank imposed any wait on the others."))
    # prose only about the flagged ranks; the others are numbers
    for r in flagged.sort("imposed_wait_ns", descending=True).head(
            H.VISIBLE_ROWS).iter_rows(named=True):
        out.append(f"<p><b>rank {_e(r['rank'])}</b>: {_e(r.get('explanation'))}</p>")
    # the replay's verdict, as `stragglers` prints it (several ranks, intermittent, moving)
    patterns = data.worst_straggler.get("patterns") or {}
    if patterns.get("named"):
        out.append(f"<p>Replay: {_e(patterns['words'])}.</p>")
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


#: Pipeline stages up to which the report draws the timeline (one bar each).
_PIPELINE_BARS = 64


def _pipeline_section(data: ReportData, fig: _Figures) -> list[str]:
    """A run with send/recv pairs: the schedule and its bubble against the ideal, the
    bottleneck stage, one step's timeline per stage with the bubbles marked, and the bubble
    table (``analyses.pipeline``; docs/metrics.md, Pipeline)."""
    res, failed = data.pipeline, data.notes.get("pipeline", [])
    if res is None:
        return ['<section id="pipeline"><h2>Pipeline</h2>', H.notes(failed),
                "</section>"] if failed else []
    out = ['<section id="pipeline"><h2>Pipeline</h2>',
           H.notes([w.removeprefix("pipeline: ") for w in res.warnings
                    if w.startswith("pipeline: ")])]
    stages, sched, b = res["stages"], res["schedule"], res["bottleneck"]
    if stages.height == 0:
        return [*out, H.sentence("No pipeline: the send/recv pairs form no chain of stages."),
                "</section>"]
    m = sched["micro_batches"]
    out.append(f"<p>{_e(sched['kind'] or 'Unknown schedule')}, {_e(sched['stages'])} stages, "
               f"{_e(m if m is not None else '?')} micro-batches per step: the bubble (waits "
               f"while the pipeline fills and drains) is <b>{H.pct(sched['bubble_fraction'])}"
               f"</b> of the step time, against {H.pct(sched['ideal_bubble_fraction'])} for "
               "an ideal one, (p&minus;1)/(m+p&minus;1).</p>")
    if b["rank"] is not None:
        out.append(f"<p><b>Bottleneck: stage {_e(b['stage'])} (rank {_e(b['rank'])})</b>: "
                   f"{_ms(b['gain_ns_per_step'])} ms per step more compute than the median "
                   f"stage; at the median stage's speed a step would take "
                   f"{_ms(b['step_ns_at_median_speed'])} ms instead of {_ms(b['step_ns'])} "
                   "ms.</p>")
    else:
        out.append(f"<p>No clear bottleneck stage: {_e(b['reason'])}.</p>")
    steps, segments = res["steps"], res["timeline"]
    if steps.height and steps.get_column("step").drop_nulls().len():
        # the step whose mean time over the stages is the median one
        means = steps.group_by("step").agg(pl.col("step_ns").mean()).sort("step_ns", "step")
        shown = means.get_column("step")[(means.height - 1) // 2]
        steps = steps.filter(pl.col("step") == shown)
        segments = segments.filter(pl.col("step") == shown)
        what = f"step {shown} (the median step)"
    else:
        what = "the whole window"
    if steps.height <= _PIPELINE_BARS:
        origin = steps.get_column("step_start_ns").min()
        out.append(fig(plots.pipeline_timeline(
            steps.select("rank", "stage", start_ms=(pl.col("step_start_ns") - origin) / 1e6,
                         dur_ms=pl.col("step_ns") / 1e6),
            segments.select("rank", "stage", "part",
                            start_ms=(pl.col("start_ns") - origin) / 1e6,
                            dur_ms=(pl.col("end_ns") - pl.col("start_ns")) / 1e6),
            title=f"Pipeline stages over {what}")))
    per_step = stages.with_columns(
        (pl.col(c) / pl.col("steps")).alias(c) for c in (
            "step_ns", "bubble_ns", "wait_upstream_ns", "wait_downstream_ns",
            "p2p_transfer_ns", "collective_ns"))
    out += ["<p>Per stage, per step (the bubble is part of the waits; definitions: "
            "docs/metrics.md, Pipeline):</p>", table(per_step, [
                ("stage", "stage", "text"), ("rank", "rank", "text"),
                ("step_ns", "step (ms)", "ms"), ("compute_per_step_ns", "compute (ms)", "ms"),
                ("bubble_ns", "bubble (ms)", "ms"), ("bubble_fraction", "bubble", "pct"),
                ("wait_upstream_ns", "wait on upstream (ms)", "ms"),
                ("wait_downstream_ns", "wait on downstream (ms)", "ms"),
                ("p2p_transfer_ns", "send/recv transfer (ms)", "ms"),
                ("collective_ns", "collectives (ms)", "ms"), ("idle_fraction", "idle", "pct")],
                every_row="traceview pipeline --csv"), "</section>"]
    return out


def _alltoall_section(data: ReportData, fig: _Figures) -> list[str]:
    """The all-to-all volume heatmap (sender x receiver, per step), the hot rank and the
    imbalance, and the step time it costs; no section for a run without all-to-alls."""
    res, failed = data.alltoall, data.notes.get("alltoall", [])
    if res is None:
        return ['<section id="alltoall"><h2>All-to-all</h2>', H.notes(failed),
                "</section>"] if failed else []
    steps = max(int(res["steps"] or 1), 1)
    mean = res["matrix"].group_by("src", "dst").agg(pl.col("bytes").sum() / steps)
    hot, cost, step = res["hot_rank"], res["cost_ns_per_step"], res["step_ns"]
    if hot is None:
        verdict = (f"Balanced: the largest volume a rank receives is {res['imbalance'] or 1:.2f}x "
                   "the mean; no rank is hot.")
    else:
        share = f" ({100 * res['cost_share']:.1f}% of the {_ms(step)} ms step)" \
            if res["cost_share"] is not None else ""
        verdict = (f"Rank {hot} is hot: it receives {res['imbalance']:.2f}x the mean volume "
                   f"(max / mean, at each step's most uneven exchange). The imbalance costs "
                   f"{_ms(cost)} ms per step{share} against a balanced assignment of the same "
                   "total (docs/metrics.md, All-to-all).")
    return ['<section id="alltoall"><h2>All-to-all</h2>', H.notes(failed),
            f"<p><b>{_e(verdict)}</b></p>", fig(plots.alltoall_heatmap(mean)),
            table(res["ranks"].sort(["hot", "recv_bytes", "rank"],
                                    descending=[True, True, False]), [
                ("rank", "rank", "text"), ("send_bytes_per_step", "sent (bytes/step)", "text"),
                ("recv_bytes_per_step", "received (bytes/step)", "text"),
                ("recv_ratio", "receive ratio", "f3"), ("send_ratio", "send ratio", "f3")],
                  every_row="traceview alltoall --csv"),
            table(res["costs"], [
                ("step", "step", "text"), ("instance", "exchange", "name"),
                ("hot_rank", "hot rank", "text"), ("lead_ns", "others wait (ms)", "ms"),
                ("cost_ns", "cost (ms)", "ms")], every_row="traceview alltoall --json")
            if res["costs"].height else "", "</section>"]


def _gaps(data: ReportData, fig: _Figures) -> list[str]:
    out = ['<section id="gaps"><h2>Gap causes</h2>', H.notes(data.notes.get("gaps", []))]
    causes = data.gap_causes
    if causes.height == 0:
        return [*out, H.sentence("No idle gaps to draw: " + (
            "the traces have no GPU events." if data.top_kernels.height == 0 else
            "the GPU timeline has no holes.")), "</section>"]
    ranks = causes["rank"].n_unique()
    out.append(fig(plots.gap_causes(causes) if ranks <= plots.MANY_RANKS
                   else plots.cause_totals(causes)))
    # six columns of names: narrower ones, so the table fits the page (full names on hover)
    out += ["<p>Largest gaps:</p>", '<div class="narrow-names">' + table(data.largest_gaps, [
        ("rank", "rank", "text"), ("device", "device", "text"),
        ("gap_ns", "gap (ms)", "ms"), ("cause", "cause", "text"),
        ("prev_name", "before", "name"), ("next_name", "after", "name"),
        ("launch_op", "launched by", "name"), ("ops_during", "host ops during", "name")])
        + "</div>" if data.largest_gaps.height else "", "</section>"]
    return out


def _kernels(data: ReportData, fig: _Figures) -> list[str]:
    out = ['<section id="kernels"><h2>Top kernels</h2>',
           H.notes([n for n in data.notes.get("kernels", []) if _has_gpu(data)])]
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


#: Ops the roofline section's table lists (most time left on the table first).
_ROOFLINE_ROWS = 15


def _roofline(data: ReportData, fig: _Figures) -> list[str]:
    """Each op shape's intensity against its achieved TFLOP/s on the device's roofline, and
    the ops with the most time left on the table (GPU time x (1 - roofline fraction))."""
    res = data.ops
    failed = data.notes.get("roofline", [])
    if res is None:
        return (['<section id="roofline"><h2>Operators against the roofline</h2>',
                 H.notes(failed), "</section>"] if failed else [])
    df = res["ops"]
    peaks = res["peaks"]
    device = res["device"] or "an unnamed device"
    roofs = ", ".join(f"{dt} {v:g} TFLOP/s" for dt, v in peaks["tflops"].items())
    known = peaks["tb_per_s"] is not None and bool(roofs)
    text = (f"On {device} ({roofs}; {peaks['tb_per_s']:g} TB/s). " if known else
            f"{device} is not in the peak table: rates without a roofline. ")
    text += ("FLOPs and bytes come from each op's recorded shapes (docs/metrics.md, "
             "\"Operators against the roofline\"); an op's GPU time is that of the kernels "
             "it launched, counted once.")
    left = (df.filter(pl.col("time_left_ns").is_not_null())
            .sort("time_left_ns", "name", descending=[True, False]).head(_ROOFLINE_ROWS)
            .with_columns(top_kernel=pl.col("kernels").list.first()))
    modelled = df.filter((pl.col("intensity") > 0) & (pl.col("tflops_per_s_total") > 0))
    out = ['<section id="roofline"><h2>Operators against the roofline</h2>',
           H.notes([*failed, *(w for w in res.warnings if w.startswith("ops:"))]),
           f"<p>{_e(text)}</p>",
           fig(plots.roofline(df, peaks)) if modelled.height else H.notes([
               "No op that owns GPU time has a FLOP and byte model (GEMM, attention, "
               "convolution, elementwise, reductions) with recorded shapes: profile with "
               "record_shapes=True to place the ops on the roofline."])]
    if left.height:
        out += ["<p>The ops with the most time left on the table: GPU time x (1 - fraction "
                "of the roofline reached).</p>",
                table(left, [("name", "op", "name"), ("category", "family", "text"),
                             ("input_dims", "shapes", "text"), ("count", "count", "text"),
                             ("kernel_time_ns", "GPU (ms)", "ms"),
                             ("tflops_per_s_total", "TFLOP/s", "f3"),
                             ("intensity", "FLOP/byte", "f3"), ("bound", "bound", "text"),
                             ("roofline_fraction", "of roofline", "pct"),
                             ("time_left_ns", "left (ms)", "ms"),
                             ("top_kernel", "top kernel", "name")],
                      every_row="traceview ops --csv")]
    return [*out, "</section>"]


def _memory_section(data: ReportData, fig: _Figures) -> list[str]:
    """Allocated bytes over time per rank and device, each peak marked, and the peaks; no
    section for traces without allocator events (recorded without profile_memory)."""
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
    to-do list of ``diagnose``, in its order."""
    cp, dx = data.critical_path, data.diagnose
    if cp is None or dx is None:
        failed = data.notes.get("critical-path", [])
        return ['<section id="critical-path"><h2>Critical path and what to fix</h2>',
                H.notes(failed), "</section>"] if failed else []
    cats = pl.DataFrame([{"category": c, **v} for c, v in cp["categories"].items()])
    todo = dx["findings"].filter(pl.col("severity") != "info")
    info = [f["title"] for f in dx["findings"].filter(pl.col("severity") == "info")
            .iter_rows(named=True)]
    # a trace without steps: the gains are the window's, never "per step"
    per = "in the window" if "per" in todo.columns and todo.height \
        and todo["per"][0] == "window" else "per step"
    unit = "ms in the window" if per == "in the window" else "ms/step"
    return ['<section id="critical-path"><h2>Critical path and what to fix</h2>',
            "<p>The longest chain of dependent work across ranks, step by step: it jumps to the "
            "rank that arrived last at each collective. A fix's gain is what the path would "
            f"lose {per}.</p>", H.notes(info),
            table(todo, [("severity", "severity", "text"),
                         ("gain_ns_per_step", f"gain ({unit})", "ms"),
                         ("gain_share", "of the step" if per == "per step" else "of the window",
                          "pct"),
                         ("path_ns_per_step", f"on the path ({unit})", "ms"),
                         ("title", "finding", "prose"), ("confidence", "confidence", "text"),
                         ("recommendation", "what to do", "prose")]),
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
    """The report's sections as HTML (without plotly.js) and the number of figures: the
    verdict first, then the warnings that can change it (damage, low confidence; benign notes
    are collapsed), then the evidence sections that apply to this run."""
    fig = _Figures()
    gpu = _has_gpu(data)
    shown = {"flops": data.flops is not None and data.flops.height > 0, "nccl": bool(data.nccl),
             "hang": data.hang is not None,
             "memory": data.memory_peaks.height > 0,
             "alltoall": data.alltoall is not None or bool(data.notes.get("alltoall")),
             "critical-path": data.critical_path is not None
             or bool(data.notes.get("critical-path")),
             "pipeline": data.pipeline is not None or bool(data.notes.get("pipeline")),
             "breakdown": gpu, "gaps": gpu, "history": data.history is not None,
             "roofline": gpu and data.ops is not None,
             "collectives": _n_ranks(data) > 1, "stragglers": _n_ranks(data) > 1}
    routine = _routine_alignment(data)
    serious = [w for w in data.warnings if not is_note(w) and not routine(w)]
    benign = [w for w in data.warnings if is_note(w) or routine(w)]
    out = [f"<h1>{_e(data.title)}</h1>", *_verdict(data, gpu), H.warnings(serious),
           H.collapsed_notes(benign),
           "<nav>" + "".join(f'<a href="#{k}">{_e(t)}</a>' for k, t in _SECTIONS
                             if shown.get(k, True))
           + "".join(f'<a href="#{k}">{_e(k)}</a>' for k in data.registered) + "</nav>"]
    out += _summary(data)
    out += _steps(data, fig)
    if gpu:
        out += _breakdown(data, fig)
    out += _flops(data)
    if shown["collectives"]:
        out += _collectives(data, fig)
    out += _nccl(data)
    out += _hang(data)
    if shown["stragglers"]:
        out += _stragglers(data, fig)
    out += _pipeline_section(data, fig)
    out += _alltoall_section(data, fig)
    out += _critical_path_section(data)
    if gpu:
        out += _gaps(data, fig)
    out += _kernels(data, fig)
    out += _roofline(data, fig) if gpu else []
    out += _memory_section(data, fig)
    out += _history_section(data, fig)
    out += _registered_sections(data)
    return "\n".join(out), fig.count


def _registered_sections(data: ReportData) -> list[str]:
    """A section per registered analysis that asks for one (``traceview.run.registry``,
    ``report=True``): its help line and its main table (times in ms, names shortened), or
    why it failed."""
    out: list[str] = []
    for command, (words, res) in data.registered.items():
        out += [f'<section id="{_e(command)}"><h2>{_e(command)}</h2>',
                H.sentence(words[:1].upper() + words[1:] + "."),
                H.notes(data.notes.get(command, []))]
        if res is not None:
            main = res[res.main]
            out.append(H.table(main, [
                (c, f"{c.removesuffix('_ns')} (ms)" if c.endswith("_ns") else c,
                 "ms" if c.endswith("_ns") else "name" if c == "name" else "text")
                for c in main.columns], every_row=f"traceview {command} --csv"))
        out.append("</section>")
    return out


def _routine_alignment(data: ReportData) -> Any:
    """Whether a warning is a routine alignment note: on a run whose ranks all share one host
    (one clock: a CPU run on one machine), how well the offsets were estimated changes no
    time the report shows, so the notes go with the collapsed ones, not the warnings box."""
    hosts = (data.offsets.get_column("host").drop_nulls().unique()
             if "host" in data.offsets.columns else pl.Series([], dtype=pl.String))
    one_clock = hosts.len() == 1 and data.offsets.get_column("host").null_count() == 0
    return lambda warning: one_clock and warning.startswith("alignment: ")


def _history_section(data: ReportData, fig: _Figures) -> list[str]:
    """``report --history``: the metric's trend over recorded runs, this run marked."""
    h = data.history
    if h is None:
        return []
    known = h.runs.filter(pl.col("value").is_not_null())
    text = (f"{known.height} recorded run{'s' if known.height != 1 else ''} from "
            f"{_e(h.source)}; this run is the star"
            + ("" if h.current is not None else " (it has no value of this metric)") + ".")
    return ['<section id="history"><h2>History</h2>', f"<p>{text}</p>",
            fig(plots.history_trend(h.runs, h.current, metric=h.metric, unit=h.unit)),
            "</section>"]


def _has_gpu(data: ReportData) -> bool:
    """Does any rank have GPU events (a breakdown window)?"""
    bd = data.breakdown
    return bd.height > 0 and bd.get_column("window_ns").drop_nulls().len() > 0


#: Findings the verdict names, biggest gain first (the rest are in "what to fix").
_VERDICT_FINDINGS = 3


def _verdict(data: ReportData, gpu: bool) -> list[str]:
    """What holds the run back and what to fix first, with the time each fix saves: the
    findings of ``diagnose`` and the worst straggler, in the words the CLI prints."""
    out = ['<section id="verdict"><h2>Verdict</h2>']
    dx = data.diagnose
    if dx is not None:
        findings = dx["findings"]
        todo = findings.filter(pl.col("severity") != "info").head(_VERDICT_FINDINGS)
        bound = [f["title"] for f in findings.filter(pl.col("severity") == "info")
                 .iter_rows(named=True)]
        if todo.height:
            out.append("<p>What holds the run back, biggest gain first:</p><ol>" + "".join(
                f"<li><b>{_e(finding_headline(f))}</b> <span class=\"dim\">({_e(f['severity'])}"
                f" impact, {_e(f['confidence'])} confidence)</span><br>Fix: "
                f"{_e(f['recommendation'])}</li>" for f in todo.iter_rows(named=True)) + "</ol>")
        else:
            out.append("<p>Nothing to fix found on the critical path.</p>")
        out += [f"<p>{_e(b)}.</p>" for b in bound[:1]]
    else:
        failed = data.notes.get("critical-path", [])
        out.append(f"<p>No verdict: {_e('; '.join(failed) or 'the critical path is missing')}"
                   ".</p>")
    if _n_ranks(data) > 1:
        worst = straggler_sentence(data.worst_straggler)  # the CLI's words, as a sentence
        out.append(f"<p>{_e(worst[:1].upper() + worst[1:])}.</p>")
    if not gpu:
        out.append(H.sentence("No GPU events in this run (CPU-only traces): the GPU sections "
                              "(compute and idle, gap causes, kernels) are left out; the host "
                              "operators stand in for the kernels."))
    return [*out, "</section>"]
