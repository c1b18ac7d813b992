"""Show a ``traceview.plots`` figure with a static PNG beside it, so that a notebook saved with its
outputs still shows the figure where no JavaScript runs (GitHub, nbviewer, an editor's preview).

plotly's own static export (kaleido >= 1) needs a Chrome it downloads itself, which the machines
this project runs on cannot fetch; so the PNG is drawn with matplotlib from the figure's bar
traces, the only kind the notebooks show. JupyterLab and VS Code pick the interactive plotly
output of the bundle; viewers without plotly's renderer pick the PNG.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from IPython.display import display
from matplotlib.figure import Figure

#: plotly's default colours, for traces that name none.
COLOURS = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692",
           "#B6E880", "#FF97FF", "#FECB52"]


def show(fig: Any) -> None:
    """Display ``fig`` as one output: the plotly figure and its PNG."""
    display({"application/vnd.plotly.v1+json": json.loads(fig.to_json()),
             "image/png": base64.b64encode(png(fig)).decode(),
             "text/plain": f"<figure: {_text(fig.layout.title.text)}>"}, raw=True)


def png(fig: Any, *, dpi: int = 80) -> bytes:
    """The figure's bar traces (stacked, grouped or overlaid), title, axes, legend and notes as a
    PNG. Other trace kinds are left out."""
    layout = fig.layout
    bars = [t for t in fig.data if t.type == "bar"]
    horizontal = bool(bars) and bars[0].orientation == "h"
    slots = {c: i for i, c in enumerate(dict.fromkeys(
        c for t in bars for c in _categories(t.y if horizontal else t.x)))}
    out = Figure(figsize=(8, max(2.4, (layout.height or 420) / 100)), dpi=dpi)
    ax = out.add_subplot()
    top = [0.0] * len(slots)  # the stack's height so far, per category
    for k, t in enumerate(bars):
        at = [slots[c] for c in _categories(t.y if horizontal else t.x)]
        values = [float(v or 0) for v in (t.x if horizontal else t.y)]
        base = list(t.base) if t.base is not None else None
        if layout.barmode in ("stack", "relative"):
            base = [top[i] for i in at]
            for i, v in zip(at, values):
                top[i] += v
        colour = t.marker.color if isinstance(t.marker.color, str) else COLOURS[k % len(COLOURS)]
        draw = ax.barh if horizontal else ax.bar
        draw(at, values, 0.8, base, color=colour, label=_text(t.name))
    names = [_text(c) for c in slots]
    if horizontal:
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()  # the first (largest) item on top, as in the plotly figure
    else:
        ax.set_xticks(range(len(names)), names, fontsize=8, rotation=30 if len(names) > 4 else 0,
                      ha="right" if len(names) > 4 else "center")
    ax.set_title(_text(layout.title.text), fontsize=11, loc="left")
    ax.set_xlabel(_text(layout.xaxis.title.text))
    ax.set_ylabel(_text(layout.yaxis.title.text))
    if len(bars) > 1 and layout.showlegend is not False:
        ax.legend(fontsize=8, frameon=False, ncols=min(len(bars), 5), loc="upper center",
                  bbox_to_anchor=(0.5, -0.18 if horizontal or len(names) <= 4 else -0.3))
    for note in layout.annotations:  # an empty figure's reason
        ax.text(0.5, 0.5, _text(note.text), ha="center", va="center", transform=ax.transAxes)
    if not bars:
        ax.set_axis_off()
    ax.grid(axis="y" if not horizontal else "x", alpha=0.3)
    buffer = io.BytesIO()
    out.savefig(buffer, format="png", bbox_inches="tight")
    return buffer.getvalue()


def _categories(values: Any) -> list[str]:
    """Axis values as category labels; plotly's two-level axis ([outer], [inner]) joined."""
    values = list(values or [])
    if len(values) == 2 and all(isinstance(v, (list, tuple)) for v in values):
        return [f"{a}\n{b}" for a, b in zip(*values)]
    return [str(v) for v in values]


def _text(text: Any) -> str:
    """A plotly label as plain text: traceview.plots escapes names for plotly's HTML subset, and
    matplotlib would read a ``$`` as the start of a formula."""
    return html.unescape("" if text is None else str(text)).replace("$", r"\$")
