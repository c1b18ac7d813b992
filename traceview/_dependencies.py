"""Heavy and optional dependencies, imported on first use (the pattern of polars'
``_dependencies.py``).

A module that needs torch, plotly, pandas, Dask, fsspec or the nsys database drivers names
them at its top like any import, ``torch = lazy_module("torch", ...)``, so a reader sees every
dependency where imports belong; the import itself runs when an attribute is first read. That
keeps ``import traceview`` and commands that never plot or capture free of those imports
(torch alone costs seconds), and an optional package that is missing becomes one clear error
naming what to install, raised where it is first needed.

The same stand-in serves a module of this package that only some commands use, where
importing it up front would cost every command (the Kineto parser on a cache hit): a *lazy
module attribute*, used only where start-up measured more than 10% slower
(``benchmarks/startup.py``).

>>> json_module = lazy_module("json", missing="needs json")
>>> json_module.dumps([1])
'[1]'
>>> lazy_module("no_such_module_here", missing="plots need it: pip install it").anything
Traceback (most recent call last):
traceview.errors.UsageError: plots need it: pip install it (No module named 'no_such_module_here')
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from traceview.errors import TraceviewError, UsageError


class LazyModule(ModuleType):
    """A stand-in for module ``name`` that imports it on first attribute access.

    ``submodules`` are imported with it (``torch.profiler`` is not loaded by ``import torch``).
    When the import fails, ``error(missing + " (" + why + ")")`` is raised: ``missing`` says
    what needs the module and how to install it.
    """

    def __init__(self, name: str, *, missing: str = "", error: type[TraceviewError] = UsageError,
                 submodules: tuple[str, ...] = ()) -> None:
        super().__init__(name)
        self.__dict__.update(_missing=missing, _error=error, _submodules=submodules)

    def _load(self) -> ModuleType:
        # Not cached here: sys.modules answers (a module removed from it, as a test standing
        # in for a machine without it does, is missing again). Looked up there first:
        # import_module's own checks cost ~14 us, and numpy behind a stand-in is read tens of
        # thousands of times by a 1,000-rank run (0.6 s; docs/performance.md, log 44).
        module = sys.modules.get(self.__name__)
        if module is not None and all(sub in sys.modules for sub in self.__dict__["_submodules"]):
            return module
        try:
            module = importlib.import_module(self.__name__)
            for sub in self.__dict__["_submodules"]:
                importlib.import_module(sub)
        except ImportError as exc:
            missing = self.__dict__["_missing"] or f"{self.__name__} could not be imported"
            raise self.__dict__["_error"](f"{missing} ({exc})") from None
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __dir__(self) -> list[str]:
        return dir(self._load())

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy_module(name: str, *, missing: str = "", error: type[TraceviewError] = UsageError,
                submodules: tuple[str, ...] = ()) -> LazyModule:
    """Module ``name``, imported when first used; see :class:`LazyModule`."""
    return LazyModule(name, missing=missing, error=error, submodules=submodules)


def loaded(module: ModuleType) -> ModuleType:
    """The real module behind ``module`` (imported now), for APIs that want a module object."""
    return module._load() if isinstance(module, LazyModule) else module


def available(name: str) -> bool:
    """Whether module ``name`` could be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


__all__ = ["LazyModule", "available", "lazy_module", "loaded"]
