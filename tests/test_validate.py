"""``traceview validate``: good and bad run directories built from the committed gloo fixtures,
and the pure checks on hand-built tables."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import orjson
import pytest

from fixtures.clock_shift import inject_clock_offsets, read_trace, write_trace
from traceview.cli import main
from traceview.schema import events_frame
from traceview.capture.validate import check_events, check_files, files_frame, validate

GOOD = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gloo_ddp_2r"
R0 = "rank-0.gloo_ddp.pt.trace.json.gz"
R1 = "rank-1.gloo_ddp.pt.trace.json.gz"


def _run(capsys: pytest.CaptureFixture[str], run_dir: Path) -> tuple[int, dict]:
    code = main(["validate", str(run_dir), "--json", "--no-cache"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def _codes(report: dict) -> list[tuple[str, int | None]]:
    return sorted((p["code"], p["rank"]) for p in report["problems"])


def _copy(tmp_path: Path, *names: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for n in names:
        shutil.copy(GOOD / n, run / n)
    return run


def test_good_run_is_fine(tmp_path, capsys):
    code, report = _run(capsys, _copy(tmp_path, R0, R1))
    assert code == 0
    assert report["ok"] is True and report["problems"] == []
    assert report["ranks"] == [0, 1] and report["world_size"] == 2


def test_good_run_text_output(tmp_path, capsys):
    assert main(["validate", str(_copy(tmp_path, R0, R1)), "--no-cache"]) == 0
    assert "ok:" in capsys.readouterr().out


def test_missing_rank_from_trace_world_size(tmp_path, capsys):
    code, report = _run(capsys, _copy(tmp_path, R0))
    assert code == 1
    assert _codes(report) == [("missing_rank", 1)]
    p = report["problems"][0]
    assert set(p) >= {"code", "rank", "file", "message", "fix"}
    assert "world size 2" in p["message"] and "every rank" in p["fix"]


def test_missing_rank_from_run_json(tmp_path, capsys):
    run = _copy(tmp_path, R0, R1)
    (run / "run.json").write_text(json.dumps({
        "world_size": 3, "ranks": [{"rank": 2, "file": "rank-2.h.9.pt.trace.json.gz"}]}))
    code, report = _run(capsys, run)
    assert code == 1
    assert _codes(report) == [("missing_rank", 2)]
    assert report["problems"][0]["file"] == "rank-2.h.9.pt.trace.json.gz"
    assert "run.json" in report["problems"][0]["message"]


def test_duplicated_rank(tmp_path, capsys):
    run = _copy(tmp_path, R0, R1)
    shutil.copy(GOOD / R0, run / "rank-0.old-run.pt.trace.json.gz")
    code, report = _run(capsys, run)
    assert code == 1
    assert _codes(report) == [("duplicate_rank", 0)]
    assert len(report["problems"][0]["files"]) == 2


def test_no_steps(tmp_path, capsys):
    run = _copy(tmp_path, R0)
    doc = read_trace(GOOD / R1)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not str(e.get("name", "")).startswith("ProfilerStep#")]
    write_trace(run / R1, doc)
    code, report = _run(capsys, run)
    assert code == 1
    assert _codes(report) == [("no_steps", 1)]
    assert "prof.step()" in report["problems"][0]["fix"]


def test_truncated_file(tmp_path, capsys):
    run = _copy(tmp_path, R0)
    raw = gzip.decompress((GOOD / R1).read_bytes())
    (run / R1).write_bytes(gzip.compress(raw[: int(len(raw) * 0.6)]))
    code, report = _run(capsys, run)
    assert code == 1
    codes = _codes(report)
    assert ("truncated_file", 1) in codes
    truncated = next(p for p in report["problems"] if p["code"] == "truncated_file")
    assert truncated["file"].endswith(R1) and "truncated" in truncated["message"]


def test_windows_disjoint_with_shared_steps_blames_clocks(tmp_path, capsys):
    run = tmp_path / "shifted"
    inject_clock_offsets(GOOD, run, {1: 3_600_000_000_000})  # rank 1 one hour later
    code, report = _run(capsys, run)
    assert code == 1
    assert _codes(report) == [("windows_disjoint", 1)]
    p = report["problems"][0]
    assert "after" in p["message"] and "clocks differ" in p["message"]
    assert "NTP" in p["fix"]


def test_windows_disjoint_steps_disjoint(tmp_path, capsys):
    """Rank 1 profiled later iterations: renumber its steps and move it 10 s on."""
    run = tmp_path / "later"
    inject_clock_offsets(GOOD, run, {1: 10_000_000_000})
    doc = read_trace(run / R1)
    for e in doc["traceEvents"]:
        name = str(e.get("name", ""))
        if name.startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + 100}"
    write_trace(run / R1, doc)
    code, report = _run(capsys, run)
    assert code == 1
    assert ("windows_disjoint", 1) in _codes(report)
    assert ("steps_disjoint", 1) in _codes(report)
    assert "schedule" in report["problems"][0]["fix"]


def test_no_anchors(tmp_path, capsys):
    """Without gloo/c10d events rank 1 has nothing to match: its clock cannot be aligned."""
    run = _copy(tmp_path, R0)
    doc = read_trace(GOOD / R1)
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not str(e.get("name", "")).startswith(("gloo:", "c10d::"))]
    write_trace(run / R1, doc)
    code, report = _run(capsys, run)
    assert code == 1
    assert ("no_anchors", 1) in _codes(report)
    assert "traceview::sync" in report["problems"][-1]["fix"]


def test_unreadable_file_among_good_ones(tmp_path, capsys):
    run = _copy(tmp_path, R0, R1)
    (run / "rank-2.pt.trace.json").write_text("this is not json")
    code, report = _run(capsys, run)
    assert code == 1
    assert ("unreadable_file", None) in _codes(report)


@pytest.mark.parametrize("make", ["missing", "empty", "garbage_only"])
def test_unreadable_run_exits_2(tmp_path, capsys, make):
    run = tmp_path / "run"
    if make != "missing":
        run.mkdir()
    if make == "garbage_only":
        (run / "rank-0.pt.trace.json").write_text("garbage")
    assert main(["validate", str(run), "--json", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traceview: ") and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- pure checks
def _ann(rank: int, name: str, ts: int, dur: int, **kw) -> dict:
    return dict(rank=rank, file_id=rank, source="kineto", kind="user_annotation", name=name,
                ts_ns=ts, dur_ns=dur, **kw)


def test_window_overlap_by_hand():
    """Rank 0 spans [0, 100), rank 1 [100, 250): touching is not overlapping (100 - 100 = 0);
    moving rank 1 one ns earlier makes them overlap by 1 ns."""
    rows = [_ann(0, "ProfilerStep#2", 0, 100), _ann(1, "ProfilerStep#2", 100, 150)]
    assert [(p.code, p.rank) for p in check_events(events_frame(rows))] == [
        ("no_anchors", 0), ("no_anchors", 1), ("windows_disjoint", 1)]
    rows[1]["ts_ns"] = 99
    assert [p.code for p in check_events(events_frame(rows))] == ["no_anchors", "no_anchors"]


def test_anchors_from_sync_probe_barriers_by_hand():
    """A probe barrier on each rank (gloo:barrier work items) is one anchor per rank."""
    rows = []
    for r in (0, 1):
        rows += [_ann(r, "ProfilerStep#2", 0, 1000),
                 _ann(r, "traceview::sync", 10, 100),
                 dict(rank=r, file_id=r, source="kineto", kind="user_annotation",
                      name="gloo:barrier", ts_ns=20 + 30 * r, dur_ns=80 - 30 * r, tid=99)]
    assert check_events(events_frame(rows)) == []


def test_files_checks_by_hand():
    files = files_frame([
        dict(file_id=0, path="a.json", rank=0, rank_from="distributedInfo", world_size=4),
        dict(file_id=1, path="b.json", rank=0, rank_from="distributedInfo", world_size=4),
        dict(file_id=2, path="c.json", rank=5, rank_from="distributedInfo", world_size=4),
        dict(file_id=3, path="d.json", rank=None, error="bad"),
        dict(file_id=4, path="e.json", rank=1, rank_from="default", world_size=None,
             warnings=orjson.dumps(["gzip stream is truncated; reading what inflates"]).decode()),
    ])
    got = [(p.code, p.rank, p.file) for p in check_files(files)]
    assert got == [
        ("unreadable_file", None, "d.json"),
        ("truncated_file", 1, "e.json"),
        ("no_rank", None, "e.json"),
        ("duplicate_rank", 0, "b.json"),
        ("missing_rank", None, None),  # ranks 2 and 3: one problem
        ("unexpected_rank", 5, "c.json"),
    ]
    missing = [p for p in check_files(files) if p.code == "missing_rank"][0]
    assert missing.ranks == [2, 3] and "ranks 2–3 of world size 4" in missing.message


def test_validate_uses_first_file_of_a_duplicated_rank():
    """Two files claim rank 0; the second one's steps must not hide the first one's absence."""
    rows = [_ann(0, "other", 0, 10), _ann(1, "ProfilerStep#1", 0, 10)]
    rows.append(dict(rows[1], rank=0, file_id=2))
    files = files_frame([dict(file_id=0, path="a", rank=0, world_size=2),
                         dict(file_id=1, path="b", rank=1, world_size=2),
                         dict(file_id=2, path="c", rank=0, world_size=2)])
    codes = [(p.code, p.rank) for p in validate(events_frame(rows), files)]
    assert ("duplicate_rank", 0) in codes and ("no_steps", 0) in codes


# ----------------------------------------------------------------------------- properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_span = st.tuples(st.integers(-10**15, 10**15), st.integers(1, 10**12))


@settings(max_examples=60, deadline=None)
@given(spans=st.lists(st.lists(_span, min_size=1, max_size=4), min_size=2, max_size=4))
def test_windows_disjoint_iff_no_overlap_with_reference(spans):
    """Each rank's window is [min start, max end) of its events; a rank is flagged exactly when
    that window does not overlap rank 0's (a positive-length intersection)."""
    rows = []
    for rank, evs in enumerate(spans):
        rows += [_ann(rank, f"op{i}", ts, dur) for i, (ts, dur) in enumerate(evs)]
    flagged = {p.rank for p in check_events(events_frame(rows)) if p.code == "windows_disjoint"}
    win = [(min(t for t, _ in evs), max(t + d for t, d in evs)) for evs in spans]
    expect = {r for r in range(1, len(spans))
              if min(win[r][1], win[0][1]) - max(win[r][0], win[0][0]) <= 0}
    assert flagged == expect


def test_many_missing_ranks_are_one_problem(tmp_path, capsys):
    """Two files of a 128-rank job: one missing_rank problem naming ranks 2-127, not 126."""
    run = _copy(tmp_path, R0, R1)
    (run / "run.json").write_text(json.dumps({"world_size": 128}))
    assert main(["validate", str(run), "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)["problems"]
    missing = [p for p in problems if p["code"] == "missing_rank"]
    assert len(missing) == 1 and missing[0]["ranks"] == list(range(2, 128))
    assert {"code", "message", "fix", "rank", "file", "files"} <= set(missing[0])
    assert main(["validate", str(run)]) == 1
    text = capsys.readouterr().out
    assert text.count("[missing_rank]") == 1
    assert "ranks 2–127 of world size 128 (from run.json) have no trace (126 ranks)" in text
    assert len(text.splitlines()) < 20


def test_a_step_marker_past_int64_is_no_step_by_hand():
    """``ProfilerStep#<30 digits>`` names no step (ingest warns of it): a rank with only such
    markers has no steps to use."""
    events = events_frame([
        dict(rank=0, file_id=0, source="kineto", kind="user_annotation",
             name="ProfilerStep#" + "9" * 30, ts_ns=0, dur_ns=100),
        dict(rank=0, file_id=0, source="kineto", kind="cpu_op", name="aten::mm", ts_ns=10,
             dur_ns=5)])
    assert [(p.code, p.rank) for p in check_events(events)] == [("no_steps", 0)]
