"""Helpers for tests: inline trace writers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def write_trace(path: Path, events: list[dict] | None = None, *, text: str | None = None,
                compress: bool | None = None, **top: object) -> Path:
    """Write a Kineto-like trace: ``{"traceEvents": events, **top}`` or raw ``text``."""
    body = text if text is not None else json.dumps({**top, "traceEvents": events or []})
    data = body.encode() if isinstance(body, str) else body
    if compress if compress is not None else path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path
