"""The harness's real-derived inputs (``benchmarks/inputs.real_set``) are valid JSON whatever
the source holds: a corpus trace without metadata events or top-level values once made a file
whose events array opened with a comma, which only the slow salvage path read (16 s instead of
1 s for 260 MB) and which the harness timed as if it were the fast path. Nothing is timed."""

from __future__ import annotations

import gzip

import orjson
import pytest

from benchmarks import inputs


def _source(folder, doc: dict) -> str:
    path = folder / "source.json.gz"
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    return path.name


def _event(ts: int, name: str = "k", **extra) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 3,
            "args": {"correlation": ts}, **extra}


@pytest.mark.parametrize("doc", [
    # no metadata events and no top-level value besides the events (TraceLens's B200 trace)
    {"traceEvents": [_event(10), _event(20)]},
    # metadata kept once, a header, a step marker
    {"distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "p"}},
        _event(10, "ProfilerStep#4", cat="user_annotation"), _event(20)]},
], ids=["no-metadata-no-header", "metadata-and-header"])
def test_a_real_derived_file_is_valid_json_with_every_replica(tmp_path, monkeypatch, doc):
    monkeypatch.setenv("TRACEVIEW_CORPUS", str(tmp_path))
    monkeypatch.setitem(inputs.REAL_SOURCES, "probe", _source(tmp_path, doc))
    made = inputs.real_set(tmp_path / "out", "probe", ranks=2, mb_per_rank=0.002,
                           log=lambda *_: None)
    timed = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    once = len(doc["traceEvents"]) - len(timed)
    for path in made.paths:
        events = orjson.loads(path.read_bytes())["traceEvents"]  # valid JSON
        replicas = (len(events) - once) // len(timed)
        assert replicas > 1 and len(events) == once + replicas * len(timed)
        assert len({e["args"]["correlation"] for e in events if e["ph"] != "M"}) == \
            replicas * len(timed)  # ids shifted per replica: still unique
    assert made.events == sum(len(orjson.loads(p.read_bytes())["traceEvents"])
                              for p in made.paths)
