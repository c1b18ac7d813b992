"""The registry's analyses as the Run's methods (``traceview.run.registry``).

A composed analysis's ``answer(run, **options)`` is the method as it is. A table of tables
gets one built here: the Run's shared tables it names, handed to the pure function with the
keyword options, and its output as the Result (the window first, then a frame as ``rows`` or
a dict's fields; the warnings of the shared tables it read).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import polars as pl

from traceview.run.registry import Analysis, resolve
from traceview.run.result import Result

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any

#: The shared tables whose problems are the answer's warnings (``Run.table_warnings``).
_WARNING_TABLES = ("gpu", "match", "offsets", "p2p")


def method_of(analysis: Analysis) -> Callable[..., Result]:
    """``analysis`` as a method of the Run: ``method(run, **options) -> Result``."""
    if analysis.answer is not None:
        return resolve(analysis.answer)
    function = resolve(analysis.function)
    options = keyword_options(function)

    def answer(run: Run, **chosen: Any) -> Result:
        unknown = sorted(set(chosen) - {p.name for p in options})
        if unknown:
            raise TypeError(f"{analysis.name}() got unexpected keyword(s) {', '.join(unknown)}")
        found = function(*(getattr(run, t) for t in analysis.tables), **chosen)
        fields = found if isinstance(found, dict) else {"rows": found}
        main = next((k for k, v in fields.items() if isinstance(v, pl.DataFrame)), None)
        if main is None:
            raise TypeError(f"{analysis.function} returned no table")
        uses = tuple(t for t in analysis.tables if t in _WARNING_TABLES)
        return run._result(analysis.name, {"window": run.window_info, **fields}, main=main,
                           uses=uses)

    answer.__name__ = answer.__qualname__ = analysis.name
    answer.__doc__ = function.__doc__
    answer.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("run", inspect.Parameter.POSITIONAL_ONLY), *options],
        return_annotation="Result")
    return answer


def keyword_options(function: Callable[..., Any]) -> list[inspect.Parameter]:
    """``function``'s keyword-only parameters: a table of tables' options."""
    return [p for p in inspect.signature(function).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY]
