"""Every Kineto file in the shared corpus loads with input_events equal to an independent count
of its traceEvents, or fails with a one-line error naming the file. Never a traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import CORPUS
from traceview.cli import main

KINETO_FILES = sorted(p for p in CORPUS.rglob("*.json*")) if CORPUS.is_dir() else []
NOT_TRACES = {"benchmark_simple_add_et.json.gz", "memory_timeline.raw.gz"}


def _independent_count(path: Path) -> int | None:
    """len(traceEvents) with the standard library, or None when it cannot read the file."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if isinstance(doc, list):
        return len(doc)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    return len(events) if isinstance(events, list) else None


@pytest.mark.parametrize("path", KINETO_FILES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_file_conforms(path: Path, capsys, corpus):
    code = main(["info", str(path), "--json", "--no-cache"])
    out, err = capsys.readouterr()
    expected = _independent_count(path)
    if code == 0:
        report = json.loads(out)
        assert expected is not None
        assert report["input_events"] == expected
        assert report["input_events"] == report["stored_events"] + sum(
            report["dropped"].values())
    else:
        assert code == 2 and "Traceback" not in err
        assert err.count("\n") == 1 and str(path) in err
        assert expected is None or path.name in NOT_TRACES


def test_corpus_is_not_empty(corpus):
    assert len(KINETO_FILES) >= 40
