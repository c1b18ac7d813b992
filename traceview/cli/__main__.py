"""``python -m traceview.cli``: the same command line as ``traceview``."""

import sys

from traceview.cli import console_main

if __name__ == "__main__":
    sys.exit(console_main())
