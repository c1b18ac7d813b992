"""traceview: offline analysis of PyTorch-profiler (Kineto) and Nsight Systems traces.

``traceview.open(PATH, ranks=, steps=, align=)`` gives a :class:`Run`; every analysis command
is a method of it (``run.summary()``, ``run.stragglers()`` ...) whose result's ``to_dict()``
is that command's ``--json``.

>>> import traceview
>>> traceview.__version__ >= "0.1"
True
>>> "open" in dir(traceview) and "Run" in dir(traceview)
True
"""

import importlib as _importlib

__version__ = "0.1.0"

from traceview.errors import (  # noqa: E402
    CheckFailed,
    RankConflictError,
    TraceviewError,
    TwoRunsError,
    UnreadableTraceError,
    UsageError,
)

#: Public names loaded on first use, so `import traceview` stays light (no Polars import until
#: a trace set is opened): name -> module. A name that is its module's own last part is that
#: module (``from traceview import plots``: the notebook figures).
_LAZY: dict[str, str] = {
    "open": "traceview.run.run",
    "hang": "traceview.run.run",
    "Run": "traceview.run.run",
    "RunOptions": "traceview.run.run",
    "ANALYSES": "traceview.run.run",
    "Result": "traceview.run.result",
    "TraceSet": "traceview.store.traceset",
    "plots": "traceview.outputs.plots",
}

__all__ = ["ANALYSES", "CheckFailed", "RankConflictError", "Result", "Run", "RunOptions",
           "TraceSet", "TraceviewError", "TwoRunsError", "UnreadableTraceError", "UsageError", "hang",
           "open", "plots",
           "__version__"]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'traceview' has no attribute {name!r}")
    loaded = _importlib.import_module(module)
    return loaded if module.rpartition(".")[2] == name else getattr(loaded, name)


def __dir__() -> list[str]:
    """The public names only (tab completion lists the lazy ones without importing them; the
    room's submodules and helpers stay out)."""
    return sorted(__all__)
