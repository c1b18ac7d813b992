"""The ``ingest`` report learns its counts from the parse (``traceview.store.rank_facts``)
instead of reading back the events it has just written (issue 25): the same answer, from the
key columns in memory. Checked on a hand-drawn trace whose counts are derived by hand, and
against the read-back answer on real traces."""

from __future__ import annotations

import orjson
import pytest

from fixtures.corpus import REPO, absent, corpus_dir
from traceview.cli.core import info_report
from traceview.store import traceset


def _kernel(ts: int, correlation: int | None, dur: int | None = 5) -> dict:
    args = {} if correlation is None else {"correlation": correlation}
    event = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts,
             "args": {"device": 0, "stream": 7, **args}}
    if dur is not None:
        event["dur"] = dur
    return event


def _launch(ts: int, correlation: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
            "tid": 1, "ts": ts, "dur": 2, "args": {"correlation": correlation}}


def _step(ts: int, number: int, dur: int) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}", "pid": 1,
            "tid": 1, "ts": ts, "dur": dur}


@pytest.fixture
def hand_drawn(tmp_path):
    """Two steps (3 and 4, 100-200 us and 200-300 us); four kernels: correlation 1 and 2
    launched in the trace, 9 not (queued before the profiler started), one with no
    correlation at all (its source records no links: not counted); the last event ends at
    350 us (a kernel 340 + 10)."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _step(100, 3, 100), _step(200, 4, 100),
        _launch(110, 1), _kernel(120, 1),
        _launch(210, 2), _kernel(220, 2),
        _kernel(90, 9),
        _kernel(340, None, dur=10),
    ]
    path = tmp_path / "rank-0.pt.trace.json"
    path.write_bytes(orjson.dumps({"distributedInfo": {"rank": 0, "world_size": 1},
                                   "traceEvents": events}))
    return path


def test_the_facts_of_a_hand_drawn_trace(hand_drawn):
    ts = traceset.open(hand_drawn, cache=False)
    assert ts.rank_facts is not None
    (facts,) = ts.rank_facts.values()
    assert facts["kinds"] == {"cuda_runtime": 2, "kernel": 4, "metadata": 1,
                              "user_annotation": 2}
    assert facts["unlaunched_gpu_events"] == 1  # correlation 9 only
    assert facts["span"] == {"start_ns": 90_000, "end_ns": 350_000, "first_step": 3,
                             "last_step": 4}
    report = info_report(ts)
    assert report["unlaunched_gpu_events"] == 1
    assert report["ranks"][0]["windows"][0]["start_ns"] == 90_000
    ts.rank_facts = None  # the same report read back from the events file
    assert info_report(ts) == report


def test_a_rank_of_several_files_reads_back():
    """Profiling windows (a real gloo run: 2 ranks x 3 windows): a GPU event of one window
    may be launched in another, which one file's facts cannot tell, so the report counts
    from the events."""
    ts = traceset.open(REPO / "fixtures" / "data" / "gloo_windows_2r", cache=False)
    assert ts.rank_facts is None
    assert info_report(ts)["ranks"][0]["windows"][2]["window"] == 2


REAL = [
    "hta-tests-data/tests/data/negative_queue_length_values_check/rank0.json.gz",
    "tracelens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz",
    "hta-tests-data/tests/data/trace_filter",  # two ranks, 10 SendRecv kernels each
    "pipit-nsys-sqlite/pipit/tests/data/cloverleaf-nsys/perlmutter-cloverleaf-cuda.sqlite",
    "hta-tests-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]


@pytest.mark.parametrize("name", REAL, ids=lambda n: n.rsplit("/", 1)[-1][:30])
def test_real_traces_answer_the_same_as_read_back(name):
    path = corpus_dir() / name
    if not path.exists():
        pytest.skip(absent(path))
    ts = traceset.open(path, cache=False)
    assert ts.rank_facts is not None
    noted = info_report(ts)
    ts.rank_facts = None
    assert info_report(ts) == noted


def test_an_accelerator_with_calls_told_apart_by_category_reads_back():
    path = corpus_dir() / "hta-tests-data/tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz"
    if not path.exists():
        pytest.skip(absent(path))
    ts = traceset.open(path, cache=False)
    assert ts.rank_facts is None  # rows of kind "other": the keys cannot tell


def test_rows_of_kind_other_that_count_for_nothing_keep_the_facts_and_cost_no_import(
        hand_drawn, tmp_path):
    """An ``overhead`` row (kind other, as TraceLens's H100 traces hold two) is neither GPU
    work nor a launch: the facts stand. Finding such rows must not import pyarrow.compute
    (~0.2 s a process): it once did, through ``Array.index``."""
    import subprocess
    import sys

    doc = orjson.loads(hand_drawn.read_bytes())
    doc["traceEvents"].append({"ph": "X", "cat": "overhead", "name": "Activity Buffer Request",
                               "pid": 0, "tid": 0, "ts": 150, "dur": 1})
    path = tmp_path / "with-other.pt.trace.json"
    path.write_bytes(orjson.dumps(doc))
    probe = ("import sys; from traceview.store import traceset; "
             f"ts = traceset.open({str(path)!r}, cache=False); "
             "(facts,) = ts.rank_facts.values(); "
             "print(facts['kinds'].get('other'), 'pyarrow.compute' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.stdout.split() == ["1", "False"], done.stderr
