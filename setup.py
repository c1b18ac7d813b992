"""Build the optional C fast path of the Kineto parser (traceview.parsers.kineto._scan).

Everything else is declared in pyproject.toml. The extension is optional: without a compiler
the install still succeeds and the parser uses its pure-Python path (same output, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("traceview.parsers.kineto._scan", ["parsers/kineto/_scan.c"],
                             depends=["parsers/kineto/vendor/xxhash.h"],
                             extra_compile_args=["-O3"], optional=True)])
