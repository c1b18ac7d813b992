"""The progress line of a long ingest: files done of total, MB/s, time left, redrawn in place
on stderr.

Only for a person at a terminal: the caller asks for it when stderr is one and no
machine-read output was asked for (``--json``, ``--csv``; ``cli._options.open_traceset``),
so a pipe, a log file or a CI job never gets carriage returns. The rate is of the input's
uncompressed size (a ``.gz`` file counted as ``ingest._estimated_bytes`` estimates it), over
the files done so far; the time left is the bytes not done at that rate.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

#: Seconds between redraws: often enough to see it move, rarely enough to cost nothing.
REDRAW_S = 0.25


class ProgressLine:
    """``done(i)`` when file ``i`` (of ``sizes``) is done; ``close()`` ends the line."""

    def __init__(self, sizes: list[int], stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sizes = sizes
        self._total = sum(sizes)
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._start = clock()
        self._drawn_at: float | None = None
        self._files = 0
        self._bytes = 0
        self._width = 0

    def done(self, index: int) -> None:
        self._files += 1
        self._bytes += self._sizes[index] if 0 <= index < len(self._sizes) else 0
        now = self._clock()
        if (self._files < len(self._sizes) and self._drawn_at is not None
                and now - self._drawn_at < REDRAW_S):
            return
        self._drawn_at = now
        self._draw(self.text(now - self._start))

    def text(self, elapsed: float) -> str:
        """``traceview: ingested 12/64 files, 1,210 of 6,400 MB, 310 MB/s, ~17 s left``."""
        rate = self._bytes / elapsed if elapsed > 0 else 0.0
        line = (f"traceview: ingested {self._files}/{len(self._sizes)} files, "
                f"{self._bytes / 1e6:,.0f} of {self._total / 1e6:,.0f} MB")
        if rate > 0:
            line += f", {rate / 1e6:,.0f} MB/s"
            if self._files < len(self._sizes):
                line += f", ~{_duration((self._total - self._bytes) / rate)} left"
        return line

    def _draw(self, line: str) -> None:
        pad = max(0, self._width - len(line))  # a shorter line wipes the longer one's end
        self._width = len(line)
        print("\r" + line + " " * pad, end="", file=self._stream, flush=True)

    def close(self) -> None:
        if self._drawn_at is not None:
            print(file=self._stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
