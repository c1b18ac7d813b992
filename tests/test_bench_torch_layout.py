"""The harness writes real-derived traces as torch does (``benchmarks/torch_layout.py``, issue
25): a source in Kineto's writer layout is replicated on its own text, whitespace and all, and
a re-encoded source is written the writer's way. Nothing is timed."""

from __future__ import annotations

import gzip

import orjson
import pytest

from benchmarks import inputs, torch_layout

#: Three events as Kineto's writer lays them out (libkineto output_json.cpp), with a nested
#: object in args, a float time with a sub-microsecond fraction and a flow.
TORCH_TEXT = b"""{
  "schemaVersion": 1,
  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 16},
  "traceEvents": [
  {
    "ph": "M", "name": "process_name", "pid": 1, "tid": 0,
    "args": {
      "name": "python"
    }
  },
  {
    "ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 1, "tid": 1,
    "ts": 1000.250, "dur": 50,
    "args": {
      "External id": 4,"Record function id": 0, "Ev Idx": 3, "nested": {"a": [1, {"b": 2}]}
    }
  },
  {
    "ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
    "ts": 1010, "dur": 5,
    "args": {
      "correlation": 9, "External id": 4, "device": 0, "stream": 7
    }
  },
  {
    "ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": 1010,
    "cat": "ac2g", "name": "ac2g", "bp": "e"
  }
  ],
  "traceName": "x.json"
}
"""


def test_each_event_text_is_found_with_its_whitespace():
    events = orjson.loads(TORCH_TEXT)["traceEvents"]
    head, texts, tail = torch_layout.element_texts(TORCH_TEXT, len(events))
    assert head.endswith(b'"traceEvents": [')
    assert [orjson.loads(t) for t in texts] == events
    assert all(t.startswith(b"\n  {") for t in texts)
    assert tail.lstrip().startswith(b"]") and b'"traceName"' in tail
    assert head + b",".join(texts) + tail == TORCH_TEXT  # nothing lost, nothing added


def test_a_count_that_does_not_match_declines():
    assert torch_layout.element_texts(TORCH_TEXT, 5) is None
    assert torch_layout.element_texts(orjson.dumps(orjson.loads(TORCH_TEXT)), 4) is None


def test_shifted_moves_times_ids_and_steps_and_nothing_else():
    _, texts, _ = torch_layout.element_texts(TORCH_TEXT, 4)
    body = b",".join(texts[1:])
    moved = torch_layout.shifted(body, ts_us=100, ids=1000, steps=3)
    before = orjson.loads(b"[" + body + b"]")
    after = orjson.loads(b"[" + moved + b"]")
    assert [e["ts"] for e in after] == [1100.25, 1110, 1110]  # the fraction kept
    assert after[0]["name"] == "ProfilerStep#10"
    assert after[0]["args"]["External id"] == 1004 and after[0]["args"]["Ev Idx"] == 1003
    assert after[0]["args"]["Record function id"] == 1000
    assert after[0]["args"]["nested"] == before[0]["args"]["nested"]
    assert after[1]["args"]["correlation"] == 1009 and after[1]["args"]["stream"] == 7
    assert after[2]["id"] == 1009
    assert after[1]["dur"] == 5 and after[1]["pid"] == 0
    # the layout itself: same lines, same whitespace outside the changed digits
    assert moved.count(b"\n") == body.count(b"\n")


def test_rank_is_rewritten_in_the_header_or_added():
    head = torch_layout.element_texts(TORCH_TEXT, 4)[0]
    info = orjson.loads(torch_layout.with_rank(head, 5, 64) + b"]}")["distributedInfo"]
    assert info == {"backend": "nccl", "rank": 5, "world_size": 64}
    bare = torch_layout.torch_head({"schemaVersion": 1})
    info = orjson.loads(torch_layout.with_rank(bare, 2, 8) + b"]}")["distributedInfo"]
    assert info == {"backend": "nccl", "rank": 2, "world_size": 8}


def test_an_event_written_the_writers_way_reads_back_the_same():
    doc = orjson.loads(TORCH_TEXT)
    for event in doc["traceEvents"]:
        text = torch_layout.torch_event_text(event)
        assert orjson.loads(text) == event
        assert 3 <= text.count(b"\n") <= 7  # one event, a few lines


@pytest.mark.parametrize("compact", [False, True], ids=["torch-source", "re-encoded-source"])
def test_a_real_derived_set_keeps_the_writers_layout(tmp_path, monkeypatch, compact):
    source = TORCH_TEXT if not compact else orjson.dumps(orjson.loads(TORCH_TEXT),
                                                         option=orjson.OPT_INDENT_2)
    (tmp_path / "src.json.gz").write_bytes(gzip.compress(source))
    monkeypatch.setenv("TRACEVIEW_CORPUS", str(tmp_path))
    monkeypatch.setitem(inputs.REAL_SOURCES, "probe", "src.json.gz")
    made = inputs.real_set(tmp_path / "out", "probe", ranks=2, mb_per_rank=0.003,
                           log=lambda *_: None)
    for rank, path in enumerate(made.paths):
        raw = path.read_bytes()
        doc = orjson.loads(raw)
        assert doc["distributedInfo"]["rank"] == rank and doc["traceName"] == "x.json"
        events = doc["traceEvents"]
        stats = torch_layout.layout_stats(raw, len(events))
        assert 4 <= stats["lines_per_event"] <= 8 and 0.15 <= stats["whitespace"] <= 0.45
        if not compact:  # the first replica is the source's own text
            assert TORCH_TEXT.split(b'"traceEvents": [')[1][:200] in raw
        timed = [e for e in events if e["ph"] != "M"]
        assert len(timed) % 3 == 0 and len(timed) > 3
        assert len({e["args"]["Ev Idx"] for e in timed if "Ev Idx" in e.get("args", {})}) \
            == len(timed) // 3  # ids unique per replica
    assert made.mix["layout"].startswith("the source's text" if not compact else "written as")
