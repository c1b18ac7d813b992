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

from traceview.errors import TraceviewError

_NS_PER_MS = 1e6

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


def _go() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError:  # pragma: no cover - depends on the environment
        raise PlotsUnavailable("plots need plotly: pip install plotly (in a traceview "
                               "checkout: pip install '.[plots]')") from None
    return go


def label(text: Any) -> str:
    """A trace-supplied name made safe for a plotly label (shown literally)."""
    return html.escape("" if text is None else str(text), quote=False)


def short(text: Any, n: int = 60) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= n else s[: n - 1] + "…"


def _layout(fig: Any, title: str, **kw: Any) -> Any:
    fig.update_layout(title=title, template="plotly_white", margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.2), **kw)
    return fig


def empty(title: str, reason: str) -> Any:
    """A figure that says why there is nothing to plot."""
    go = _go()
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
    go = _go()
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
    go = _go()
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
    order the instances should appear.
    """
    go = _go()
    if lateness.height == 0:
        return empty(title, "no collective was matched across ranks")
    order = lateness["instance_label"].unique(maintain_order=True).to_list()
    ranks = sorted(lateness["rank"].unique().to_list())
    wide = lateness.pivot(on="instance_label", index="rank", values="lateness_ns",
                          aggregate_function="first").sort("rank")
    z = [[None if v is None else v / _NS_PER_MS for v in (wide[c].to_list() if c in wide.columns
                                                          else [None] * len(ranks))]
         for c in order]
    z_t = [list(row) for row in zip(*z)] if z else []
    fig = go.Figure(go.Heatmap(
        z=z_t, x=[label(short(o, 40)) for o in order], y=[f"rank {r}" for r in wide["rank"]],
        colorscale="Reds", colorbar=dict(title="ms"),
        hovertemplate="%{y}<br>%{x}<br>behind first: %{z:.3f} ms<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", showticklabels=len(order) <= 60)
    return _layout(fig, title, xaxis_title="collective instance (time order)")


def straggler_bars(ranking: pl.DataFrame, *, title: str = "Imposed wait per rank") -> Any:
    """``analyses.stragglers.stragglers`` rows: imposed wait per rank, flagged ranks marked."""
    go = _go()
    if ranking.height == 0:
        return empty(title, "no ranks")
    r = ranking.sort("rank")
    fig = go.Figure(go.Bar(
        x=[f"rank {v}" for v in r["rank"]], y=(r["imposed_wait_ns"] / _NS_PER_MS).to_list(),
        marker_color=["#E45756" if f else "#4C78A8" for f in r["flagged"]],
        hovertemplate="%{x}<br>imposed wait %{y:.3f} ms<extra></extra>"))
    fig.update_xaxes(type="category")
    return _layout(fig, title, yaxis_title="ms (others waiting for this rank alone)")


def gap_causes(causes: pl.DataFrame, *, title: str = "GPU idle gaps by cause") -> Any:
    """``analyses.gaps.gap_causes(..., by=["rank"])`` rows: stacked idle time per cause."""
    go = _go()
    if causes.height == 0:
        return empty(title, "no GPU idle gaps (or no GPU events)")
    fig = go.Figure()
    for (cause,), g in causes.sort("cause", "rank").group_by("cause", maintain_order=True):
        fig.add_trace(go.Bar(x=[f"rank {v}" for v in g["rank"]],
                             y=(g["total_gap_ns"] / _NS_PER_MS).to_list(), name=label(cause),
                             hovertemplate=f"{label(cause)} %{{y:.3f}} ms<extra></extra>"))
    fig.update_xaxes(type="category")
    return _layout(fig, title, barmode="stack", yaxis_title="ms")


def top_items(top: pl.DataFrame, *, value: str = "total_ns", name: str = "name",
              title: str = "Top kernels by total time") -> Any:
    """Horizontal bars of ``value`` per ``name`` (``analyses.breakdown.top_kernels`` or
    ``top_cpu_ops`` rows; one trace per rank)."""
    go = _go()
    if top.height == 0:
        return empty(title, "nothing to rank")
    fig = go.Figure()
    for (rank,), g in top.group_by("rank", maintain_order=True):
        fig.add_trace(go.Bar(
            y=[label(short(n, 50)) for n in g[name]], x=(g[value] / _NS_PER_MS).to_list(),
            orientation="h", name=f"rank {rank}",
            customdata=[label(n) for n in g[name]],
            hovertemplate="%{customdata}<br>%{x:.3f} ms<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, xaxis_title="ms", barmode="group",
                   height=max(350, 40 + 22 * top.height))


def diff_bars(contributors: pl.DataFrame, *,
              title: str = "Top contributors to the change (per rank and step)") -> Any:
    """``traceview.diff`` contributors: ``kind, name, delta_ns`` bars (positive = slower)."""
    go = _go()
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
