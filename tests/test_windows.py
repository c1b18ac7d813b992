"""Several profiling windows per rank (traceview/store/windows.py) on real and hand-made traces.

``fixtures/data/gloo_windows_2r``: a real 2-rank gloo run under ``schedule(wait=0, warmup=1,
active=2, repeat=3)`` with ``tensorboard_trace_handler``'s names (``<host>_<pid>.<time>``):
three files per rank, recording steps 1-2, 4-5 and 7-8.
"""

from __future__ import annotations

import json

import pytest

import traceview
from tests.conftest import FIXTURES
from tests.helpers import write_trace
from traceview.cli import main
from traceview.errors import UsageError

WINDOWS = FIXTURES / "data" / "gloo_windows_2r"
STEPS = [(1, 2), (4, 5), (7, 8)]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, *argv: str) -> dict:
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def _steps_of(rank: dict) -> list[tuple[int, int]]:
    return [(w["first_step"], w["last_step"]) for w in rank["windows"]]


# ---- the real fixture ----------------------------------------------------------------------

def test_the_folder_opens_with_three_windows_per_rank(capsys) -> None:
    report = _json(capsys, "info", str(WINDOWS))
    assert report["files"] == 6 and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in report["ranks"]:
        assert [w["window"] for w in rank["windows"]] == [0, 1, 2]
        assert _steps_of(rank) == STEPS
        assert rank["file"] == rank["windows"][0]["file"]  # the contract's field: first window
        times = [(w["start_ns"], w["end_ns"]) for w in rank["windows"]]
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(times, times[1:]))
        assert rank["input_events"] == rank["stored_events"] + sum(rank["dropped"].values())


def test_info_text_lists_the_windows(capsys) -> None:
    code, out, _ = _run(capsys, "info", str(WINDOWS))
    assert code == 0
    assert out.count("window   0  steps 1-2") == 2 and out.count("window   2  steps 7-8") == 2


def test_commands_analyse_every_window_with_the_original_step_numbers(capsys) -> None:
    ranks = _json(capsys, "summary", str(WINDOWS))["ranks"]
    assert [r["steps"] for r in ranks] == [6, 6]
    ranks = _json(capsys, "summary", str(WINDOWS), "--steps", "4:6")["ranks"]
    assert [r["steps"] for r in ranks] == [2, 2]
    assert _json(capsys, "gaps", str(WINDOWS))["causes"] == []  # CPU-only: works, no GPU
    rows = _json(capsys, "sql", str(WINDOWS),
                 "select distinct step from events where rank = 0 and step is not null")
    assert sorted(r["step"] for r in rows) == [1, 2, 4, 5, 7, 8]


@pytest.mark.parametrize("window,steps", [("0", [(1, 2)]), ("last", [(7, 8)]),
                                          ("1", [(4, 5)])])
def test_window_option_selects_one_window_of_each_rank(capsys, window, steps) -> None:
    report = _json(capsys, "info", str(WINDOWS), "--window", window)
    assert report["files"] == 2
    for rank in report["ranks"]:
        assert _steps_of(rank) == steps
        assert rank["windows"][0]["window"] == (2 if window == "last" else int(window))
    ranks = _json(capsys, "summary", str(WINDOWS), "--window", window)["ranks"]
    assert [r["steps"] for r in ranks] == [2, 2]


def test_an_out_of_range_window_is_a_one_line_usage_error(capsys) -> None:
    code, out, err = _run(capsys, "summary", str(WINDOWS), "--window", "9")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "3 windows" in err
    code, _, err = _run(capsys, "info", str(WINDOWS), "--window", "first")
    assert code == 2 and "--window" in err


def test_python_api_and_store_keep_the_windows(tmp_path) -> None:
    ts = traceview.open(WINDOWS)
    assert ts.windows.height == 6 and ts.ranks.height == 2
    last = traceview.open(WINDOWS, window="last")
    assert last.window_spans().select("rank", "window", "first_step").rows() == [
        (0, 2, 7), (1, 2, 7)]
    with pytest.raises(UsageError, match="3 windows"):
        traceview.open(WINDOWS, window=3)
    store = ts.write_store(tmp_path / "store")
    again = traceview.open(store)
    assert again.windows.rows() == ts.windows.rows()
    assert traceview.open(store, window=1).window_spans()["first_step"].to_list() == [4, 4]


# ---- hand-made files -----------------------------------------------------------------------

def _trace(path, start_us: float, *, rank: int | None = 0, steps=(1,)):
    """A trace of one rank: one ProfilerStep per step, 10 µs each from ``start_us``."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1,
               "tid": 1, "ts": start_us + 10 * i, "dur": 10} for i, s in enumerate(steps)]
    top = {"distributedInfo": {"rank": rank, "world_size": 1}} if rank is not None else {}
    return write_trace(path, events, **top)


def test_overlapping_files_of_one_rank_are_refused_naming_both(capsys, tmp_path) -> None:
    _trace(tmp_path / "a.json", 0, steps=(1, 2))     # [0, 20) µs
    _trace(tmp_path / "b.json", 15, steps=(3, 4))    # [15, 35) µs: overlaps a
    code, _, err = _run(capsys, "info", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "a.json" in err and "b.json" in err and "rank 0" in err and "overlap" in err


def test_disjoint_files_of_one_rank_are_windows_in_time_order(capsys, tmp_path) -> None:
    _trace(tmp_path / "a.json", 100, steps=(5,))
    _trace(tmp_path / "b.json", 0, steps=(1,))       # earlier: window 0, whatever its name
    rank = _json(capsys, "info", str(tmp_path))["ranks"][0]
    assert [(w["window"], w["file"].rsplit("/", 1)[1]) for w in rank["windows"]] == [
        (0, "b.json"), (1, "a.json")]


def test_rankless_files_of_one_process_are_rank_0(capsys, tmp_path) -> None:
    for i, start in enumerate((0, 100, 200)):
        _trace(tmp_path / f"host-a_4242.{1000 + i}.pt.trace.json", start, rank=None,
               steps=(i,))
    report = _json(capsys, "info", str(tmp_path))
    assert [r["rank"] for r in report["ranks"]] == [0]
    assert len(report["ranks"][0]["windows"]) == 3
    assert any("one process (host-a_4242)" in w for w in report["warnings"])


def test_rankless_files_of_two_processes_still_need_a_rank_map(capsys, tmp_path) -> None:
    _trace(tmp_path / "host-a_1.1000.pt.trace.json", 0, rank=None)
    _trace(tmp_path / "host-a_2.1000.pt.trace.json", 0, rank=None)
    code, _, err = _run(capsys, "info", str(tmp_path))
    assert code == 2 and "--rank-map" in err


def test_validate_accepts_the_windows_and_still_flags_overlap(capsys, tmp_path) -> None:
    code, out, _ = _run(capsys, "validate", str(WINDOWS), "--json")
    assert code == 0 and json.loads(out)["ok"]
    _trace(tmp_path / "a.json", 0, steps=(1, 2))
    _trace(tmp_path / "b.json", 15, steps=(3, 4))
    code, out, _ = _run(capsys, "validate", str(tmp_path), "--json")
    assert code == 1 and [p["code"] for p in json.loads(out)["problems"]] == ["duplicate_rank"]


# ---- a file's span, from the footer or from the parse's columns -----------------------------

@pytest.mark.parametrize("with_steps", [True, False], ids=["steps", "no-step-markers"])
def test_the_span_an_ingest_records_is_the_one_its_events_file_holds(tmp_path, monkeypatch,
                                                                     with_steps):
    """Hand-drawn: a marker 100-400 ns (when there are steps), an op 150-250, a kernel
    starting last at 500 for 300 ns. With step markers the footer's statistics answer (the end
    is the last start, 500); without them the span comes from the parse's own columns, as
    reading the file back would give it (the end is the last end, 800)."""
    from traceview.store import ingest as ingest_module
    from traceview.store.parquet import scan_events
    from traceview.store.windows import file_span, span_of_rows

    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 0.15,
               "dur": 0.1},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0.5,
               "dur": 0.3}]
    if with_steps:
        events.insert(0, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3",
                          "pid": 1, "tid": 1, "ts": 0.1, "dur": 0.3})
    path = write_trace(tmp_path / "rank0.pt.trace.json", events)
    from traceview.store import windows

    def read_back(_):
        raise AssertionError("the ingest read its events file back for its span")

    with monkeypatch.context() as patched:
        patched.setattr(windows, "file_span", read_back)
        result = ingest_module.ingest([path], cache_dir=tmp_path / "cache").files[0]
    span = result.rough_span
    start = 100 if with_steps else 150
    assert (span["start_ns"], span["end_ns"]) == (start, 500 if with_steps else 800)
    assert (span["first_step"], span["last_step"]) == ((3, 3) if with_steps else (None, None))
    if not with_steps:  # what reading the file back says
        read = file_span(result.events_path)
        assert (read.start_ns, read.end_ns, read.first_step, read.last_step) == \
            (150, 800, None, None)
        frame = scan_events(result.events_path).collect()
        again = span_of_rows(frame["ts_ns"], frame["dur_ns"], frame["step"])
        assert again == read.__class__(**{**read.__dict__, "pid": None})
