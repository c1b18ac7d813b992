"""Build the optional C fast path of the Kineto parser (traceview._kineto_scan).

Everything else is declared in pyproject.toml. The extension is optional: without a compiler
the install still succeeds and the parser uses its pure-Python path (same output, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("traceview._kineto_scan", ["traceview/_kineto_scan.c"],
                             extra_compile_args=["-O3"], optional=True)])
