"""One exception hierarchy. The CLI turns each into a one-line message and an exit code."""

from __future__ import annotations

import re


class TraceviewError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with (2: usage or unreadable input)."""

    exit_code = 2


class UnreadableTraceError(TraceviewError):
    """A file that cannot be read as a trace. The message names the file and the problem."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{_shown(path)}: {problem}")
        self.path = str(path)
        self.problem = problem


class RankConflictError(TraceviewError):
    """Two files claim the same rank, or a rank cannot be determined. ``skippable``: the
    files that ``--skip-bad`` may leave out to resolve it (those without a rank, or the
    damaged or empty one of two that overlap)."""

    def __init__(self, message: str, skippable: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.skippable = skippable


class TwoRunsError(RankConflictError):
    """Files of one rank, or of one job, come from two runs (``traceview.store.runs``)."""


class UsageError(TraceviewError):
    """Bad arguments or options."""


class CheckFailed(TraceviewError):
    """A check found problems (exit code 1)."""

    exit_code = 1


#: Secrets a command was given (a database's password): :func:`redacted` keeps them out of
#: every message, whatever library worded it.
_SECRETS: set[str] = set()


def keep_secret(secret: str | None) -> None:
    """Never print ``secret`` (as it is, or percent-encoded as a URL would carry it)."""
    if secret:
        from urllib.parse import quote

        _SECRETS.update({secret, quote(secret, safe=""), quote(secret)})


def redacted(text: str) -> str:
    """``text`` with every secret given to :func:`keep_secret` as ``***``."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _shown(path: object) -> str:
    """A file name for a message: its control characters (a newline, an escape sequence) as
    ``\\xNN``, so the message stays one line that names the file (the CLI escapes the rest)."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", str(path))

