"""Which path parses Kineto JSON here, told without importing the parser (``--version``).

``traceview.parsers.kineto.parser_path()`` answers the same, but importing the parser package
imports Polars, pyarrow and numpy (~1 s of the ~1.7 s that ``traceview --version`` took;
docs/performance.md, log entry 37). This loads only the compiled scanner, under its own
module name, so a later import of the parser finds it already loaded.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

_NAME = "traceview.parsers.kineto._scan"
_FOLDER = Path(__file__).resolve().parent / "parsers" / "kineto"


def parser_path() -> tuple[str, str | None]:
    """``("C scanner", None)`` or ``("pure Python", why)``, as the parser's own says."""
    missing = ""
    if _NAME not in sys.modules:
        try:
            _load()
        except ImportError as exc:
            built = [p for p in _FOLDER.glob("_scan.*") if p.suffix != ".c"]
            missing = (f"the compiled {built[0].name} does not load ({exc})" if built else
                       "traceview was installed without compiling it (no C compiler)")
    if not missing and os.environ.get("TRACEVIEW_PURE_PYTHON") != "1":
        return "C scanner", None
    return "pure Python", (f"no C scanner: {missing}" if missing
                           else "the C scanner is turned off (TRACEVIEW_PURE_PYTHON=1)")


def _load() -> None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _FOLDER / f"_scan{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(_NAME, path)
            if spec is None or spec.loader is None:
                break
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[_NAME] = module
            return
    raise ImportError(f"No module named {_NAME!r}")
