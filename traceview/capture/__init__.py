"""The capture room: recording traces that analyse well (torch.profiler and nsys wrappers,
the clock-sync probe) and checking a run directory before analysis; it may import the store,
the analyses and the vocabulary, never the Run, the outputs or the CLI.

``traceview.capture.profile`` is the public entry; the names below are its module's.
"""

from __future__ import annotations

from traceview.capture.profiler import (
    RUN_FILE,
    SYNC_NAME,
    Capture,
    CaptureUnavailable,
    import_torch,
    profile,
)

__all__ = ["Capture", "CaptureUnavailable", "RUN_FILE", "SYNC_NAME", "import_torch", "profile"]
