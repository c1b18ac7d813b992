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


def copy_with_rank_cut(src: Path, dst: Path, *, rank_marker: str = "rank-1",
                       keep: float = 0.5) -> Path:
    """Copy the gzipped traces of run folder ``src`` to ``dst``, the one whose name holds
    ``rank_marker`` cut off after ``keep`` of its JSON text (a write that stopped part-way)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        if rank_marker in f.name:
            text = gzip.decompress(data)
            data = gzip.compress(text[: int(len(text) * keep)])
        (dst / f.name).write_bytes(data)
    return dst
