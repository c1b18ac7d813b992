"""traceview: offline analysis of PyTorch-profiler (Kineto) and Nsight Systems traces.

>>> import traceview
>>> traceview.__version__ >= "0.1"
True
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

from traceview.errors import TraceviewError, UnreadableTraceError  # noqa: E402

__all__ = ["TraceSet", "TraceviewError", "UnreadableTraceError", "open", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import traceview` stays light (no Polars import until a trace set is opened).
    if name in ("open", "TraceSet"):
        from traceview import traceset

        return getattr(traceset, name)
    raise AttributeError(f"module 'traceview' has no attribute {name!r}")
