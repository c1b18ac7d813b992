"""The command's stdout and stderr while it runs: text for people, so a control character
from a trace (an escape sequence, a bidi override) is written as its escape, and a character
the terminal's encoding lacks as a backslash escape instead of a UnicodeEncodeError.

Text commands print names in many places; guarding the streams covers every one of them, and
what a command prints itself (tables, newlines, tabs, the progress line's carriage return)
passes unchanged. ``--json`` and ``--csv`` keep exact names: ``_render`` writes them to
:func:`unguarded` stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from traceview.errors import redacted
from traceview.outputs.safe_text import one_line, printable


class GuardedStream:
    """``stream`` with unsafe characters (``safe_text.printable``) escaped, but ``keep``."""

    def __init__(self, stream: TextIO, keep: str) -> None:
        self.stream = stream
        self.keep = keep

    def write(self, text: str) -> int:
        self.stream.write(printable(text, keep=self.keep))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno ...
        return getattr(self.stream, name)


@contextmanager
def guarded_streams() -> Iterator[None]:
    """stdout and stderr guarded until the block ends, and never raising UnicodeEncodeError
    (an ASCII locale, ``PYTHONIOENCODING=ascii``)."""
    saved = sys.stdout, sys.stderr
    for stream in saved:
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            pass  # not a TextIOWrapper (a test's stand-in): it encodes as it likes
    sys.stdout = GuardedStream(saved[0], keep="\n\t")  # type: ignore[assignment]
    sys.stderr = GuardedStream(saved[1], keep="\n\t\r")  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def unguarded(stream: Any) -> TextIO:
    """The stream under a guard (or ``stream`` itself): for output that programs read."""
    return stream.stream if isinstance(stream, GuardedStream) else stream


def takes_utf8(stream: Any) -> bool:
    """Whether the stream under any guard encodes UTF-8 (else ``--json`` is written as
    ASCII: a backslash escape of the stream's own would not be JSON)."""
    encoding = getattr(unguarded(stream), "encoding", None) or "utf-8"
    return "utf" in encoding.lower().replace("-", "")


def warning_line(message: str) -> str:
    """A warning as the one line a command writes to stderr."""
    return f"traceview: warning: {redacted(one_line(message))}"
