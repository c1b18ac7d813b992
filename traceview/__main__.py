"""``python -m traceview``: the same command line as ``traceview``."""

import sys

if __name__ == "__main__":
    try:  # Ctrl-C while the command line's own modules load: exit 130, no traceback
        from traceview.cli import console_main
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(console_main())
