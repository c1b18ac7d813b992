"""Plotly figure builders over analysis result frames. Every function *returns* a figure.

Nothing here computes a metric: each builder takes the frame an analysis returned (named in its
docstring) and only converts units (ns -> ms) and lays it out. Names that come from traces are
HTML-escaped before they reach plotly (plotly renders a subset of HTML in labels), so a kernel
named ``<img src=x onerror=alert(1)>`` is shown as that text.

plotly is imported lazily: ``import traceview`` stays light, and without plotly the builders
raise :class:`PlotsUnavailable` naming the ``plots`` extra.
"""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from traceview._dependencies import lazy_module
from traceview.analyses.names import short_name, unique_short_names
from traceview.analyses.spread import MANY_RANKS
from traceview.errors import TraceviewError
from traceview.outputs.safe_text import printable

_NS_PER_MS = 1e6
#: Past ``MANY_RANKS`` ranks a figure shows the distribution (heatmap, box, top ranks), not
#: a mark per rank.
#: Heatmap columns and series points past which consecutive steps or instances are binned.
MAX_COLUMNS = 300
#: No figure is taller than this (px), however many ranks.
MAX_HEIGHT = 900

#: Colours of the GPU time parts (stable across figures).
PART_COLOURS: dict[str, str] = {
    "compute_ns": "#4C78A8", "exposed_comm_ns": "#F58518", "exposed_memcpy_ns": "#72B7B2",
    "exposed_memset_ns": "#B279A2", "idle_ns": "#BAB0AC",
}
_PART_LABELS = {"compute_ns": "compute", "exposed_comm_ns": "exposed comm",
                "exposed_memcpy_ns": "exposed memcpy", "exposed_memset_ns": "exposed memset",
                "idle_ns": "idle"}


class PlotsUnavailable(TraceviewError):
    """plotly is not installed."""


#: What to install for the figures (the ``plots`` extra), said when plotly is missing.
PLOTLY_MISSING = ("plots need plotly: pip install plotly (in a traceview checkout: "
                  "pip install '.[plots]')")

go = lazy_module("plotly.graph_objects", error=PlotsUnavailable, missing=PLOTLY_MISSING)


def label(text: Any) -> str:
    """A trace-supplied name made safe for a plotly label (shown literally)."""
    return html.escape(printable("" if text is None else str(text)), quote=False)


def short(text: Any, n: int = 60) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def _layout(fig: Any, title: str, **kw: Any) -> Any:
    fig.update_layout(title=title, template="plotly_white", margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.2), **kw)
    return fig


def empty(title: str, reason: str) -> Any:
    """A figure that says why there is nothing to plot."""
    fig = go.Figure()
    fig.add_annotation(text=label(reason), showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=220)


def step_timeline(spans: pl.DataFrame, *, title: str = "Steps per rank (aligned timeline)") -> Any:
    """Per-rank step bars on one time axis.

    ``spans``: ``rank, step, start_ms, dur_ms`` (the report derives them from
    ``analyses.window.step_spans`` on the aligned clock, relative to the earliest step start).
    """
    if spans.height == 0:
        return empty(title, "no ProfilerStep ranges in these traces")
    fig = go.Figure()
    for (rank,), g in spans.sort("rank", "step").group_by("rank", maintain_order=True):
        fig.add_trace(go.Bar(
            y=[f"rank {rank}"] * g.height, x=g["dur_ms"].to_list(), base=g["start_ms"].to_list(),
            orientation="h", name=f"rank {rank}", text=[f"step {s}" for s in g["step"]],
            textposition="inside", insidetextanchor="middle",
            hovertemplate="rank %{y}<br>%{text}<br>start %{base:.3f} ms<br>"
                          "duration %{x:.3f} ms<extra></extra>",
            marker=dict(line=dict(width=1, color="white"))))
    fig.update_yaxes(autorange="reversed", type="category")
    return _layout(fig, title, xaxis_title="time since first step start (ms)", barmode="overlay",
                   showlegend=False)


def time_breakdown(breakdown: pl.DataFrame, *,
                   title: str = "GPU time per rank and step") -> Any:
    """Stacked compute / exposed comm / exposed memcpy / exposed memset / idle bars.

    ``breakdown``: ``analyses.breakdown.step_breakdown`` rows (one bar per rank, device, step;
    the whole-trace row, step null, is used when a rank has no steps).
    """
    rows = breakdown.filter(pl.col("window_ns").is_not_null())
    if rows.height == 0:
        return empty(title, "no GPU events: compute / communication / idle need GPU kernels")
    has_step = rows.filter(pl.col("step").is_not_null()).select("rank", "device").unique()
    rows = pl.concat([
        rows.filter(pl.col("step").is_not_null()),
        rows.filter(pl.col("step").is_null()).join(has_step, on=["rank", "device"], how="anti"),
    ]).sort("rank", "device", "step", nulls_last=True)
    x = [[f"rank {r}" + (f" dev {d}" if d is not None else "") for r, d in
          zip(rows["rank"], rows["device"])],
         ["all" if s is None else f"step {s}" for s in rows["step"]]]
    fig = go.Figure()
    for col, colour in PART_COLOURS.items():
        fig.add_trace(go.Bar(x=x, y=(rows[col] / _NS_PER_MS).to_list(), name=_PART_LABELS[col],
                             marker_color=colour,
                             hovertemplate=f"{_PART_LABELS[col]} %{{y:.3f}} ms<extra></extra>"))
    return _layout(fig, title, barmode="stack", yaxis_title="ms")


def skew_heatmap(lateness: pl.DataFrame, *,
                 title: str = "Collective arrival behind the first rank (ms)") -> Any:
    """Rank x collective instance heatmap.

    ``lateness``: ``instance_label, rank, lateness_ns`` (from
    ``analyses.collectives.collective_ranks``: arrival − first arrival of the instance), in the
    order the instances should appear. Past ``MAX_COLUMNS`` instances, consecutive ones are
    binned and a cell shows the rank's largest lateness in the bin.
    """
    if lateness.height == 0:
        return empty(title, "no collective was matched across ranks")
    order = lateness["instance_label"].unique(maintain_order=True).to_list()
    width = _bin_columns(len(order))
    position = pl.DataFrame({"instance_label": order, "col": [i // width for i in
                                                              range(len(order))]})
    cells = (lateness.join(position, on="instance_label")
             .group_by("rank", "col").agg(ms=pl.col("lateness_ns").max() / _NS_PER_MS))
    cols = sorted(cells["col"].unique().to_list())
    wide = cells.pivot(on="col", index="rank", values="ms").sort("rank")
    z = [[row.get(str(c)) for c in cols] for row in wide.iter_rows(named=True)]
    if width == 1:
        x = [label(short(o, 40)) for o in order]
        where = "%{x}"
    else:
        x = [f"{c * width}-{min(len(order), (c + 1) * width) - 1}" for c in cols]
        where = "instances %{x} (largest shown)"
    ranks = wide["rank"].to_list()
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=_rank_axis(ranks), colorscale="Reds", colorbar=dict(title="ms"),
        hovertemplate=f"rank %{{y}}<br>{where}<br>behind first: %{{z:.3f}} ms<extra></extra>"))
    _mark_largest(fig, z, x, _rank_axis(ranks), "latest arrival")
    _rank_yaxis(fig, ranks)
    fig.update_xaxes(type="category", showticklabels=len(x) <= 60)
    return _layout(fig, title, height=_rank_height(len(ranks)),
                   xaxis_title="collective instance (time order)" if width == 1 else
                   f"collective instances in time order, {width} per column")


#: An all-to-all heatmap shows at most this many ranks a side; past it consecutive ranks are
#: binned (a cell sums the bytes between the two bins' ranks).
MATRIX_SIDE = 64


def alltoall_heatmap(matrix: pl.DataFrame, *,
                     title: str = "All-to-all volume per step, sender to receiver (KiB)") -> Any:
    """Rank x rank heatmap of the bytes each rank sends each rank per step, the hot cell
    circled. ``matrix``: ``src, dst, bytes`` (``analyses.alltoall.alltoall``'s matrix summed
    over steps and divided by them). Past ``MATRIX_SIDE`` ranks, consecutive ranks share a
    row and a column."""
    if matrix.height == 0:
        return empty(title, "no all-to-all was matched across ranks")
    ranks = sorted({*matrix["src"].to_list(), *matrix["dst"].to_list()})
    width = _bin_columns(len(ranks), MATRIX_SIDE)
    index = {r: i // width for i, r in enumerate(ranks)}
    cells = (matrix.with_columns(row=pl.col("src").replace_strict(index),
                                 col=pl.col("dst").replace_strict(index))
             .group_by("row", "col").agg(kib=pl.col("bytes").sum() / 1024))
    bins = sorted(set(index.values()))
    value = {(r, c): v for r, c, v in cells.rows()}
    z = [[value.get((r, c)) for c in bins] for r in bins]
    names = ([str(ranks[b]) for b in bins] if width == 1 else
             [f"{ranks[b * width]}-{ranks[min(len(ranks), (b + 1) * width) - 1]}" for b in bins])
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, colorscale="Blues", colorbar=dict(title="KiB"),
        hovertemplate="from rank %{y} to rank %{x}<br>%{z:.1f} KiB per step<extra></extra>"))
    _mark_largest(fig, z, names, names, "largest", unit="KiB")
    fig.update_xaxes(type="category", title="receiver")
    fig.update_yaxes(type="category", autorange="reversed", title="sender")
    side = min(MAX_HEIGHT, max(360, 140 + 18 * len(bins)))
    return _layout(fig, title if width == 1 else f"{title}, {width} ranks a row and column",
                   height=side)


def straggler_bars(ranking: pl.DataFrame, *, title: str = "Imposed wait per rank",
                   most: int = 20) -> Any:
    """``analyses.stragglers.stragglers`` rows: imposed wait per rank, flagged ranks marked.
    Past ``MANY_RANKS`` ranks, the ``most`` ranks with the largest imposed wait (and every
    flagged one) are shown."""
    if ranking.height == 0:
        return empty(title, "no ranks")
    r = ranking.sort("rank")
    if r.height > MANY_RANKS:
        top = r.sort("imposed_wait_ns", "rank", descending=[True, False]).head(most)
        r = pl.concat([top, r.filter(pl.col("flagged"))]).unique("rank").sort(
            "imposed_wait_ns", "rank", descending=[True, False])
        title = f"{title}: the {r.height} largest of {ranking.height} ranks"
    fig = go.Figure(go.Bar(
        x=[f"rank {v}" for v in r["rank"]], y=(r["imposed_wait_ns"] / _NS_PER_MS).to_list(),
        marker_color=["#E45756" if f else "#4C78A8" for f in r["flagged"]],
        hovertemplate="%{x}<br>imposed wait %{y:.3f} ms<extra></extra>"))
    fig.update_xaxes(type="category")
    return _layout(fig, title, yaxis_title="ms (others waiting for this rank alone)",
                   height=400)


#: Colours of a pipeline stage's timeline parts (``analyses.pipeline.TIMELINE_SCHEMA``).
PIPELINE_COLOURS: dict[str, str] = {
    "compute": "#4C78A8", "bubble": "#E45756", "wait_upstream": "#F58518",
    "wait_downstream": "#ECA82C", "p2p_transfer": "#72B7B2", "collective": "#B279A2",
}
_PIPELINE_LABELS = {"compute": "own time (compute)", "bubble": "bubble (fill / drain wait)",
                    "wait_upstream": "waiting on upstream", "wait_downstream":
                    "waiting on downstream", "p2p_transfer": "send/recv transfer",
                    "collective": "collective"}


def pipeline_timeline(steps: pl.DataFrame, segments: pl.DataFrame, *,
                      title: str = "Pipeline stages over one step") -> Any:
    """One bar per stage over its step(s), the bubbles marked: ``steps`` are
    ``analyses.pipeline`` per-step rows (``rank, stage, start_ms, dur_ms``), ``segments`` its
    ``timeline`` rows (``rank, stage, part, start_ms, dur_ms``), on one axis (ms from the
    earliest step start). What no segment covers is the stage's own time."""
    if steps.height == 0:
        return empty(title, "no pipeline stages")
    fig = go.Figure()
    order = steps.select("stage", "rank").unique().sort("stage", "rank")
    names = {(s, r): f"stage {s} (rank {r})" for s, r in order.rows()}
    fig.add_trace(go.Bar(
        y=[names[(s, r)] for s, r in zip(steps["stage"], steps["rank"])],
        x=steps["dur_ms"].to_list(), base=steps["start_ms"].to_list(), orientation="h",
        name=_PIPELINE_LABELS["compute"], marker_color=PIPELINE_COLOURS["compute"],
        hovertemplate="%{y}<br>step from %{base:.3f} ms, %{x:.3f} ms<extra></extra>"))
    for part, colour in PIPELINE_COLOURS.items():
        g = segments.filter(pl.col("part") == part)
        if part == "compute" or g.height == 0:
            continue
        fig.add_trace(go.Bar(
            y=[names.get((s, r), f"stage {s} (rank {r})") for s, r in zip(g["stage"], g["rank"])],
            x=g["dur_ms"].to_list(), base=g["start_ms"].to_list(), orientation="h",
            name=_PIPELINE_LABELS[part], marker_color=colour,
            hovertemplate=f"%{{y}}<br>{_PIPELINE_LABELS[part]}<br>from %{{base:.3f}} ms, "
                          "%{x:.3f} ms<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category", categoryorder="array",
                     categoryarray=list(names.values()))
    return _layout(fig, title, xaxis_title="time since the earliest stage's step start (ms)",
                   barmode="overlay", height=min(MAX_HEIGHT, 160 + 40 * len(names)))


def gap_causes(causes: pl.DataFrame, *, title: str = "GPU idle gaps by cause") -> Any:
    """``analyses.gaps.gap_causes(..., by=["rank"])`` rows: stacked idle time per cause."""
    if causes.height == 0:
        return empty(title, "no GPU idle gaps (or no GPU events)")
    fig = go.Figure()
    for (cause,), g in causes.sort("cause", "rank").group_by("cause", maintain_order=True):
        fig.add_trace(go.Bar(x=[f"rank {v}" for v in g["rank"]],
                             y=(g["total_gap_ns"] / _NS_PER_MS).to_list(), name=label(cause),
                             hovertemplate=f"{label(cause)} %{{y:.3f}} ms<extra></extra>"))
    ranks = sorted(causes["rank"].unique().to_list())
    fig.update_xaxes(type="category", categoryorder="array",
                     categoryarray=[f"rank {v}" for v in ranks])
    return _layout(fig, title, barmode="stack", yaxis_title="ms")


def top_items(top: pl.DataFrame, *, value: str = "total_ns", name: str = "name",
              title: str = "Top kernels by total time") -> Any:
    """Horizontal bars of ``value`` per ``name``, one bar per name: ``top`` is
    ``analyses.breakdown.kernels_across_ranks`` rows, or ``top_kernels`` / ``top_cpu_ops`` rows
    (several ranks' rows are summed per name). The label is the short name
    (``analyses.names.unique_short_names``: distinct names never share a label, so no bar
    stacks two kernels), the hover the full one.
    """
    if top.height == 0:
        return empty(title, "nothing to rank")
    if "rank" in top.columns and top["rank"].n_unique() > 1:  # per-rank rows: one bar a name
        top = (top.group_by(name).agg(pl.col(value).sum())
               .sort(value, name, descending=[True, False]))
    labels = unique_short_names(top[name].to_list(), 50)  # one bar per kernel, never merged
    fig = go.Figure(go.Bar(
        y=[label(labels.get(str(n), short_name(n, 50))) for n in top[name]],
        x=(top[value] / _NS_PER_MS).to_list(),
        orientation="h", marker_color="#4C78A8", customdata=[label(n) for n in top[name]],
        hovertemplate="%{customdata}<br>%{x:.3f} ms<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    return _layout(fig, title, xaxis_title="ms", showlegend=False,
                   height=min(MAX_HEIGHT, max(300, 90 + 24 * top.height)))


#: Colours of the op families on the roofline (stable across reports).
CATEGORY_COLOURS: dict[str, str] = {"gemm": "#4C78A8", "sdpa": "#F58518", "conv": "#54A24B",
                                    "elementwise": "#B279A2", "reduce": "#E45756"}


def roofline(ops: pl.DataFrame, peaks: dict[str, Any], *,
             title: str = "Operators against the roofline") -> Any:
    """``analyses.ops.ops`` rows (by shape) on log-log axes: intensity (FLOP/byte) against
    achieved TFLOP/s (``tflops_per_s_total``), one point per op shape, its area by GPU time,
    coloured by family; the device's roofline per dtype (``peaks``: ``device_peaks``) drawn
    when known: ``min(peak TFLOP/s, intensity x TB/s)``."""
    drawn = ops.filter((pl.col("intensity") > 0) & (pl.col("tflops_per_s_total") > 0))
    if drawn.height == 0:
        return empty(title, "no op with a FLOP and byte model owns GPU time")
    fig = go.Figure()
    biggest = drawn["kernel_time_ns"].max() or 1
    for (cat,), g in drawn.sort("category").group_by("category", maintain_order=True):
        text = [label(f"{n} {d or ''}") for n, d in zip(g["name"], g["input_dims"])]
        fig.add_trace(go.Scatter(
            x=g["intensity"].to_list(), y=g["tflops_per_s_total"].to_list(), mode="markers",
            name=label(cat), customdata=(g["kernel_time_ns"] / _NS_PER_MS).to_list(),
            text=text, marker={"color": CATEGORY_COLOURS.get(cat, "#888"), "sizemode": "area",
                               "size": (g["kernel_time_ns"] / biggest * 900).to_list(),
                               "sizemin": 4, "opacity": 0.75},
            hovertemplate="%{text}<br>%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s, "
                          "%{customdata:.3f} ms<extra></extra>"))
    bw = peaks.get("tb_per_s")
    lo = min(drawn["intensity"].min(), 0.01) / 2
    hi = max(drawn["intensity"].max(), 1000) * 2
    for dt, peak in sorted(peaks.get("tflops", {}).items(), key=lambda kv: -kv[1]):
        if bw is None:
            break
        ridge = peak / bw
        xs = [lo, ridge, hi] if lo < ridge < hi else [lo, hi]
        fig.add_trace(go.Scatter(x=xs, y=[min(peak, x * bw) for x in xs], mode="lines",
                                 name=f"roofline {dt} ({peak:g} TFLOP/s, {bw:g} TB/s)",
                                 line={"dash": "dot", "width": 1.5}, hoverinfo="skip"))
    # powers of ten, not SI prefixes: "1µ" on a TFLOP/s axis read as a unit
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP/byte)",
                     exponentformat="power")
    fig.update_yaxes(type="log", title_text="achieved TFLOP/s", exponentformat="power")
    return _layout(fig, title, height=520)


def diff_bars(contributors: pl.DataFrame, *,
              title: str = "Top contributors to the change (per rank and step)") -> Any:
    """``traceview.outputs.diff`` contributors: ``kind, name, delta_ns`` bars (positive = slower)."""
    if contributors.height == 0:
        return empty(title, "no change to attribute")
    fig = go.Figure(go.Bar(
        y=[label(f"{k}: {short(n, 50)}") for k, n in zip(contributors["kind"],
                                                           contributors["name"])],
        x=(contributors["delta_ns"] / _NS_PER_MS).to_list(), orientation="h",
        marker_color=["#E45756" if v > 0 else "#54A24B" for v in contributors["delta_ns"]],
        hovertemplate="%{y}<br>%{x:.3f} ms<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, xaxis_title="ms per rank-step (test − base)")


def history_trend(trend: pl.DataFrame, current: float | None, *, metric: str, unit: str,
                  title: str | None = None) -> Any:
    """One gate metric over recorded runs (``traceview.outputs.history.trend``: ``id, label,
    recorded_at, commit, value``, oldest first) with this run's value as a distinct point at
    the end (None: this run has no value). ns are drawn in ms."""
    title = title or f"{metric}: recorded runs and this run"
    if trend.height == 0 and current is None:
        return empty(title, "no recorded run and no value in this run")
    scale, axis = (_NS_PER_MS, "ms") if unit == "ns" else (1.0, unit)
    runs = trend.filter(pl.col("value").is_not_null())
    x = [f"#{i}" for i in runs["id"]]
    fig = go.Figure(go.Scatter(
        x=x, y=(runs["value"] / scale).to_list(), mode="lines+markers", name="recorded runs",
        customdata=[[label(lb), label(ts[:19]), label((c or "")[:12])]
                    for lb, ts, c in runs.select("label", "recorded_at", "commit").rows()],
        hovertemplate="run %{x} (%{customdata[0]})<br>%{customdata[1]} UTC<br>commit "
                      "%{customdata[2]}<br>%{y:.3f} " + axis + "<extra></extra>",
        marker=dict(color="#4C78A8", size=7)))
    if current is not None:
        fig.add_trace(go.Scatter(
            x=["this run"], y=[current / scale], mode="markers", name="this run",
            marker=dict(color="#E45756", size=14, symbol="star"),
            hovertemplate="this run<br>%{y:.3f} " + axis + "<extra></extra>"))
    fig.update_xaxes(type="category")
    return _layout(fig, title, xaxis_title="recorded run (oldest first), then this run",
                   yaxis_title=axis)


def memory_timeline(points: pl.DataFrame, peaks: pl.DataFrame, *,
                    title: str = "Memory allocated per rank and device") -> Any:
    """Allocated bytes over time, one line per (rank, device), each peak marked.

    ``points``: ``analyses.memory.timeline_points`` rows (``t_ms`` after the rank's first
    allocator event); ``peaks``: the ``memory`` result's trace rows (``rank, device,
    peak_allocated_bytes, peak_time_ns, peak_op, basis``) with ``peak_ms`` on the same axis.
    """
    if points.height == 0:
        return empty(title, "no allocator events (record with profile_memory=True)")
    fig = go.Figure()
    for (rank, device), g in points.group_by("rank", "device", maintain_order=True):
        fig.add_trace(go.Scatter(
            x=g["t_ms"].to_list(), y=(g["allocated_bytes"] / 2**20).to_list(), mode="lines",
            name=label(f"rank {rank} {device} ({g['basis'][0]})"), line=dict(shape="hv"),
            hovertemplate=f"rank {rank} {label(device)}<br>%{{x:.3f}} ms<br>"
                          "%{y:.1f} MiB<extra></extra>"))
    if peaks.height:
        fig.add_trace(go.Scatter(
            x=peaks["peak_ms"].to_list(), y=(peaks["peak_allocated_bytes"] / 2**20).to_list(),
            mode="markers+text", name="peak", marker=dict(symbol="triangle-down", size=11,
                                                          color="#E45756"),
            text=[f"peak r{r} {label(d)}" for r, d in zip(peaks["rank"], peaks["device"])],
            textposition="top center",
            customdata=[label(short(o or "-", 50)) for o in peaks["peak_op"]],
            hovertemplate="%{text}<br>%{x:.3f} ms<br>%{y:.1f} MiB<br>op %{customdata}"
                          "<extra></extra>"))
    return _layout(fig, title, xaxis_title="ms after the rank's first allocator event",
                   yaxis_title="MiB allocated")


# ------------------------------------------------------------------------ figures at scale
def _rank_height(ranks: int) -> int:
    """A rank-per-row figure's height: readable rows for a few ranks, capped for many."""
    return min(MAX_HEIGHT, max(320, 140 + (18 if ranks <= MANY_RANKS else 3) * ranks))


def _rank_axis(ranks: list[int]) -> list[Any]:
    """A heatmap's rows: one category per rank for a few ranks; past ``MANY_RANKS``, the rank
    numbers on a numeric axis, so plotly picks readable ticks instead of 256 labels."""
    return [str(r) for r in ranks] if len(ranks) <= MANY_RANKS else list(ranks)


def _rank_yaxis(fig: Any, ranks: list[int]) -> None:
    fig.update_yaxes(autorange="reversed", title="rank",
                     type="category" if len(ranks) <= MANY_RANKS else "linear")


def _mark_largest(fig: Any, z: list[list[Any]], x: list[Any], y: list[Any], what: str,
                  unit: str = "ms") -> None:
    """Circle a heatmap's largest cell, so the worst rank and step (or collective) is found at
    a glance however many cells there are."""
    best = max(((v, i, j) for i, row in enumerate(z) for j, v in enumerate(row)
                if v is not None), default=None)
    if best is None:
        return
    v, i, j = best
    fig.add_trace(go.Scatter(
        x=[x[j]], y=[y[i]], mode="markers", name=what, showlegend=False,
        marker=dict(symbol="circle-open", size=14, color="#E45756", line=dict(width=2)),
        hovertemplate=f"{what}: rank %{{y}}, %{{x}}<br>{v:.3f} {unit}<extra></extra>"))


def _bin_columns(n: int, most: int = MAX_COLUMNS) -> int:
    """How many consecutive columns go into one bin so that at most ``most`` remain."""
    return max(1, -(-n // most))


#: A step-time heatmap's colours span at least this fraction of the median on each side, so
#: that a spread of a few tenths of a percent (noise) does not fill the whole colour scale and
#: look like structure.
MIN_COLOUR_SPAN = 0.10


def anchored_range(values: pl.Series) -> tuple[float, float]:
    """The colour range of a step-time heatmap: the values' range, widened to at least
    ``MIN_COLOUR_SPAN`` x the median on each side of it.

    >>> anchored_range(pl.Series([6.31, 6.33, 6.35]))
    (5.697, 6.963)
    """
    v = values.drop_nulls()
    if v.len() == 0:
        return 0.0, 1.0
    median = float(v.median())
    lo, hi = float(v.min()), float(v.max())
    return (round(min(lo, median * (1 - MIN_COLOUR_SPAN)), 6),
            round(max(hi, median * (1 + MIN_COLOUR_SPAN)), 6))


def rank_step_heatmap(spans: pl.DataFrame, *,
                      title: str = "Step time per rank and step (ms)") -> Any:
    """Rank x step heatmap of the step time. ``spans``: ``rank, step, dur_ms``. Past
    ``MAX_COLUMNS`` steps, consecutive steps are binned and a cell shows the bin's slowest
    step, so the worst steps stay visible."""
    if spans.height == 0:
        return empty(title, "no ProfilerStep ranges in these traces")
    lo = spans["step"].min()
    width = _bin_columns(spans["step"].max() - lo + 1)
    cells = (spans.with_columns(col=(pl.col("step") - lo) // width)
             .group_by("rank", "col").agg(ms=pl.col("dur_ms").max(),
                                          first=pl.col("step").min(), last=pl.col("step").max()))
    ranks = sorted(cells["rank"].unique().to_list())
    cols = sorted(cells["col"].unique().to_list())
    wide = cells.pivot(on="col", index="rank", values="ms").sort("rank")
    z = [[row.get(str(c)) for c in cols] for row in wide.iter_rows(named=True)]
    x = [int(lo + c * width) for c in cols]
    what = "step" if width == 1 else f"steps (bins of {width}, slowest shown) from"
    zmin, zmax = anchored_range(cells["ms"])
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=_rank_axis(ranks), colorscale="Viridis", colorbar=dict(title="ms"),
        zmin=zmin, zmax=zmax,
        hovertemplate=f"rank %{{y}}<br>{what} %{{x}}<br>%{{z:.3f}} ms<extra></extra>"))
    _mark_largest(fig, z, x, _rank_axis(ranks), "slowest step")
    _rank_yaxis(fig, ranks)
    return _layout(fig, title, xaxis_title="step" if width == 1 else
                   f"step (each column: {width} steps, the slowest shown)",
                   height=_rank_height(len(ranks)))


def step_series(binned: pl.DataFrame, worst: pl.DataFrame, *,
                title: str = "Step time along the run (ms)") -> Any:
    """Per-step series: the median and the slowest rank-step of each bin of steps
    (``analyses.spread.binned_steps`` rows, values in ms), and the ``worst`` steps (``step,
    ms, rank``) marked one by one."""
    if binned.height == 0:
        return empty(title, "no ProfilerStep ranges in these traces")
    x = binned["first_step"].to_list()
    span = [f"steps {a}-{b}" if a != b else f"step {a}"
            for a, b in zip(binned["first_step"], binned["last_step"])]
    fig = go.Figure([
        go.Scatter(x=x, y=binned["median"].to_list(), mode="lines", name="median",
                   line=dict(color="#4C78A8"), customdata=span,
                   hovertemplate="%{customdata}<br>median %{y:.3f} ms<extra></extra>"),
        go.Scatter(x=x, y=binned["max"].to_list(), mode="lines", name="slowest",
                   line=dict(color="#F58518", width=1), customdata=span,
                   hovertemplate="%{customdata}<br>slowest %{y:.3f} ms<extra></extra>"),
    ])
    if worst.height:
        fig.add_trace(go.Scatter(
            x=worst["step"].to_list(), y=worst["ms"].to_list(), mode="markers",
            name="worst steps", marker=dict(color="#E45756", size=9, symbol="x"),
            customdata=[f"rank {r}" for r in worst["rank"]],
            hovertemplate="step %{x}, %{customdata}<br>%{y:.3f} ms<extra></extra>"))
    return _layout(fig, title, xaxis_title="step", yaxis_title="ms", height=380)


def part_boxes(per_rank: pl.DataFrame, *,
               title: str = "GPU time per step across ranks (ms)") -> Any:
    """One box per GPU time part over the ranks (``rank`` and the ``PART_COLOURS`` columns,
    ns per step): the median, quartiles and whiskers of the many, each outlier rank a point
    named on hover."""
    parts = [c for c in PART_COLOURS if c in per_rank.columns]
    if per_rank.height == 0 or not parts:
        return empty(title, "no GPU events: compute / communication / idle need GPU kernels")
    fig = go.Figure()
    names = [f"rank {r}" for r in per_rank["rank"]]
    for col in parts:
        fig.add_trace(go.Box(
            y=(per_rank[col] / _NS_PER_MS).to_list(), name=_PART_LABELS[col], text=names,
            boxpoints="outliers", marker_color=PART_COLOURS[col],
            hovertemplate="%{text}<br>%{y:.3f} ms<extra></extra>"))
    return _layout(fig, title, yaxis_title="ms per step", showlegend=False, height=420)


def rank_bars(per_rank: pl.DataFrame, *, title: str = "GPU time per rank (ms per step)") -> Any:
    """Stacked parts per rank (``rank`` and the ``PART_COLOURS`` columns, ns per step)."""
    parts = [c for c in PART_COLOURS if c in per_rank.columns]
    if per_rank.height == 0 or not parts:
        return empty(title, "no GPU events: compute / communication / idle need GPU kernels")
    x = [f"rank {r}" for r in per_rank["rank"]]
    fig = go.Figure([go.Bar(x=x, y=(per_rank[c] / _NS_PER_MS).to_list(), name=_PART_LABELS[c],
                            marker_color=PART_COLOURS[c],
                            hovertemplate=f"%{{x}}<br>{_PART_LABELS[c]} %{{y:.3f}} ms"
                                          "<extra></extra>") for c in parts])
    fig.update_xaxes(type="category")
    return _layout(fig, title, barmode="stack", yaxis_title="ms per step", height=420)


def cause_totals(causes: pl.DataFrame, *,
                 title: str = "GPU idle gaps by cause, all ranks (ms)") -> Any:
    """``analyses.gaps.gap_causes(..., by=["rank"])`` rows summed over the ranks: one bar
    per cause, the hover naming the rank with the most of it."""
    if causes.height == 0:
        return empty(title, "no GPU idle gaps (or no GPU events)")
    per = (causes.sort("total_gap_ns", "rank", descending=[True, False])
           .group_by("cause", maintain_order=True)
           .agg(total=pl.col("total_gap_ns").sum(), top_rank=pl.col("rank").first(),
                top=pl.col("total_gap_ns").first(), ranks=pl.col("rank").n_unique())
           .sort("total", descending=True))
    fig = go.Figure(go.Bar(
        y=[label(c) for c in per["cause"]], x=(per["total"] / _NS_PER_MS).to_list(),
        orientation="h", marker_color="#BAB0AC",
        customdata=[f"{n} ranks; most on rank {r} ({t / _NS_PER_MS:.3f} ms)"
                    for n, r, t in zip(per["ranks"], per["top_rank"], per["top"])],
        hovertemplate="%{y}<br>%{x:.3f} ms<br>%{customdata}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    return _layout(fig, title, xaxis_title="ms", showlegend=False,
                   height=max(260, 120 + 30 * per.height))
