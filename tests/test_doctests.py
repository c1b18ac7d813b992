"""The examples in the docstrings are part of the documentation: they must run and be right."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import traceview
import traceview.analyses
import traceview.parsers

# capture needs torch at import of its examples' objects; the rest run anywhere
_SKIP = ("traceview.capture",)
MODULES = sorted({m.name for package in (traceview, traceview.parsers, traceview.analyses)
                  for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
                  if not m.name.startswith(_SKIP) and not m.name.endswith("__main__")})


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failures == 0, name
