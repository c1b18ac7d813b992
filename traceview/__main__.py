"""``python -m traceview``: the same command line as ``traceview``."""

import sys

if __name__ == "__main__":
    try:  # Ctrl-C while the command line's own modules load, or as it ends: 130, no traceback
        from traceview.cli import console_main

        status = console_main()
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)
