"""``python -m traceview.cli``: the same command line as ``traceview``."""

import sys

from traceview.cli import main

if __name__ == "__main__":
    sys.exit(main())
