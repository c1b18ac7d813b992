"""Never a blended answer: files of two runs or two jobs are refused naming both, or one run is
kept with ``--run-of`` (``traceview/store/runs.py``, docs/formats.md *One run*).

Real runs: ``gloo_ddp_2r`` and ``gloo_ddp_2r_slow1`` are two recordings of one 2-rank job
(other processes, steps counted from 0 again); ``gloo_windows_2r`` is one process per rank
writing three profiling windows.
"""

from __future__ import annotations

import json
import shutil

import pytest

import traceview
from fixtures import nsys_synthetic
from tests.conftest import FIXTURES
from tests.helpers import write_trace
from traceview.cli import main
from traceview.errors import TwoRunsError
from traceview.store.runs import (
    RunIdentity,
    clock_difference,
    nearest_run,
    run_difference,
    runs_of,
)

DDP = FIXTURES / "data" / "gloo_ddp_2r"
DDP_SLOW = FIXTURES / "data" / "gloo_ddp_2r_slow1"
WINDOWS = FIXTURES / "data" / "gloo_windows_2r"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _trace(path, start_us: float, *, rank: int = 0, world: int = 2, pid: int = 1,
           steps=(1,), host: str = "node-a"):
    """One rank's trace: a ProfilerStep per step, 10 µs each from ``start_us``, on ``pid``."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": pid,
               "tid": 1, "ts": start_us + 10 * i, "dur": 10} for i, s in enumerate(steps)]
    return write_trace(path, events, host_name=host,
                       distributedInfo={"rank": rank, "world_size": world, "backend": "nccl"})


# ---- the rule, on identities ----------------------------------------------------------------

def test_what_tells_two_runs_from_two_windows() -> None:
    w0 = RunIdentity("w0", source="kineto", host="a", pid=7, world_size=2, start_ns=0,
                     end_ns=10, first_step=1, last_step=2)
    w1 = RunIdentity("w1", source="kineto", host="a", pid=7, world_size=2, start_ns=20,
                     end_ns=30, first_step=4, last_step=5)
    assert run_difference(w0, w1) is None  # one process, steps counting up: windows
    other = {"source": "nsys", "host": "b", "pid": 8, "world_size": 16, "backend": "gloo",
             "first_step": 0}
    said = {k: run_difference(w0, RunIdentity(**{**w1.__dict__, k: v}))
            for k, v in other.items()}
    assert said == {"source": "a kineto capture and a nsys capture", "host": "host a vs b",
                    "pid": "process id 7 vs 8", "world_size": "world size 2 vs 16",
                    "backend": None,  # w0 records no backend: nothing to compare
                    "first_step": "steps start again (1..2, then 0..5)"}
    # process groups may grow between windows, never lose one
    g1 = '[{"pg_name": "0", "ranks": [0, 1]}]'
    g2 = '[{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": "1", "ranks": [0]}]'
    grown = RunIdentity(**{**w1.__dict__, "pg_config": g2})
    assert run_difference(RunIdentity(**{**w0.__dict__, "pg_config": g1}), grown) is None
    assert "process groups differ" in run_difference(
        RunIdentity(**{**w0.__dict__, "pg_config": g2}),
        RunIdentity(**{**w1.__dict__, "pg_config": g1}))


def test_ranks_of_one_host_that_profiled_one_step_apart_in_time_are_two_runs() -> None:
    # rank 0 and rank 1 on host a, both steps 3..4: one clock, so 1 s apart is two runs
    r0 = RunIdentity("r0", host="a", start_ns=0, end_ns=10**9, first_step=3, last_step=4)
    r1 = RunIdentity("r1", host="a", start_ns=2 * 10**9, end_ns=3 * 10**9, first_step=3,
                     last_step=4)
    assert clock_difference(r0, r1) == ("both profiled step 3..4 on host a, one clock, but "
                                        "the second starts 1.000 s after the first ends")
    # not shown: overlapping times, other steps (ranks on their own schedules), two hosts
    # (their clocks may differ: validate's windows_disjoint), a host name many machines share
    for change in ({"start_ns": 10**9 - 1}, {"first_step": 5, "last_step": 6},
                   {"host": "b"}, {"host": None}, {"first_step": None}):
        assert clock_difference(r0, RunIdentity(**{**r1.__dict__, **change})) is None
    local = {"host": "localhost"}
    assert clock_difference(RunIdentity(**{**r0.__dict__, **local}),
                            RunIdentity(**{**r1.__dict__, **local})) is None


def test_interleaved_runs_are_told_apart_and_the_nearest_is_chosen() -> None:
    # run A (pid 1) at 0 and 200, run B (pid 2) at 100 and 300: each run is one process
    a0, a1 = (RunIdentity(f"a{i}", pid=1, start_ns=t, end_ns=t + 50, first_step=i,
                          last_step=i) for i, t in ((0, 0), (1, 200)))
    b0, b1 = (RunIdentity(f"b{i}", pid=2, start_ns=t, end_ns=t + 50, first_step=i,
                          last_step=i) for i, t in ((0, 100), (1, 300)))
    runs = runs_of([b1, a0, b0, a1])
    assert [[f.path for f in run] for run in runs] == [["a0", "a1"], ["b0", "b1"]]
    # another rank's runs: the one with most time in common with [100, 350) is B's
    other = [[RunIdentity("x", start_ns=0, end_ns=240)],
             [RunIdentity("y", start_ns=95, end_ns=352)]]
    assert nearest_run(other, runs[1])[0].path == "y"
    assert nearest_run([[RunIdentity("z", start_ns=900, end_ns=950)]], runs[1]) is None
    assert nearest_run(other, [RunIdentity("untimed")]) is None  # no span to share


# ---- every command refuses a blend ----------------------------------------------------------

def test_two_jobs_on_one_rank_are_refused_naming_both(capsys, tmp_path) -> None:
    _trace(tmp_path / "job16.json", 0, world=16)
    _trace(tmp_path / "job2.json", 1_000_000, world=2)  # a later, disjoint capture
    for command in ("info", "summary", "stragglers", "critical-path", "diagnose"):
        code, _, err = _run(capsys, command, str(tmp_path))
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
        assert "job16.json" in err and "job2.json" in err and "world size 16 vs 2" in err
    with pytest.raises(TwoRunsError):
        traceview.open(tmp_path)


def test_two_real_runs_of_one_job_are_refused_and_validate_agrees(capsys, tmp_path) -> None:
    for src, tag in ((DDP, "a"), (DDP_SLOW, "b")):
        for f in src.iterdir():
            shutil.copy(f, tmp_path / f"{tag}-{f.name}")
    code, _, err = _run(capsys, "summary", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "a-rank-0" in err and "b-rank-0" in err and "two runs" in err
    code, out, _ = _run(capsys, "validate", str(tmp_path), "--json")
    problems = json.loads(out)["problems"]
    assert code == 1 and {p["code"] for p in problems} == {"mixed_runs"}
    assert sorted(p["rank"] for p in problems) == [0, 1]


def test_ranks_taken_from_two_real_runs_are_refused_and_validate_agrees(capsys,
                                                                        tmp_path) -> None:
    """Rank 0 of one recording and rank 1 of the next: no rank is claimed twice and the job
    is the same, but on one host the same steps 9.8 s apart are two runs."""
    shutil.copy(DDP / "rank-0.gloo_ddp.pt.trace.json.gz", tmp_path)
    shutil.copy(DDP_SLOW / "rank-1.gloo_ddp.pt.trace.json.gz", tmp_path)
    for command in ("info", "summary", "stragglers", "critical-path", "diagnose"):
        code, _, err = _run(capsys, command, str(tmp_path))
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
        assert "rank-0.gloo" in err and "rank-1.gloo" in err and "two runs" in err
        assert "one clock" in err
    code, out, _ = _run(capsys, "validate", str(tmp_path), "--json")
    problems = json.loads(out)["problems"]
    assert code == 1 and [p["code"] for p in problems] == ["mixed_runs"]
    keep = tmp_path / "rank-1.gloo_ddp.pt.trace.json.gz"
    code, out, err = _run(capsys, "info", str(tmp_path), "--run-of", str(keep))
    assert code == 0 and "1 ranks, 1 files" in out
    assert "rank-0.gloo_ddp.pt.trace.json.gz: another run" in out + err
    assert "one clock" in out + err  # the reason for another rank is its time, not its pid


def test_kineto_and_nsys_for_one_rank_are_two_captures(capsys, tmp_path) -> None:
    nsys_synthetic.write_export(tmp_path / "rank0.sqlite", ranks=1)
    _trace(tmp_path / "rank-0.json", 0)
    code, _, err = _run(capsys, "summary", "--skip-bad", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "rank0.sqlite" in err and "rank-0.json" in err


def test_a_job_split_across_ranks_is_refused(capsys, tmp_path) -> None:
    _trace(tmp_path / "rank-0.json", 0, rank=0, world=4)
    _trace(tmp_path / "rank-1.json", 0, rank=1, world=8)
    code, _, err = _run(capsys, "info", str(tmp_path))
    assert code == 2 and "two jobs" in err and "world size 4 vs 8" in err


def test_real_profiling_windows_are_still_one_run(capsys) -> None:
    code, out, _ = _run(capsys, "validate", str(WINDOWS), "--json")
    assert code == 0 and json.loads(out)["ok"]
    assert traceview.open(WINDOWS, cache=False).traceset.windows.height == 6


# ---- --run-of keeps one run -----------------------------------------------------------------

def test_run_of_keeps_one_run_and_answers_as_that_run_alone(capsys, tmp_path) -> None:
    for src, tag in ((DDP, "a"), (DDP_SLOW, "b")):
        for f in src.iterdir():
            shutil.copy(f, tmp_path / f"{tag}-{f.name}")
    keep = tmp_path / "b-rank-1.gloo_ddp.pt.trace.json.gz"
    code, out, err = _run(capsys, "stragglers", str(tmp_path), "--run-of", str(keep), "--json")
    assert code == 0, err
    mixed = json.loads(out)
    code, out, _ = _run(capsys, "stragglers", str(DDP_SLOW), "--json")
    alone = json.loads(out)
    assert mixed["ranks"] == alone["ranks"]
    left = [w for w in mixed["warnings"] if "left out (--run-of)" in w]
    assert len(left) == 2 and all("a-rank-" in w for w in left)
    # the Python API takes the same choice
    run = traceview.open(tmp_path, run_of=keep, cache=False)
    assert sorted(run.traceset.files["path"].str.contains("/b-rank-").to_list()) == [True, True]


def test_run_of_names_an_input(capsys, tmp_path) -> None:
    _trace(tmp_path / "rank-0.json", 0)
    code, _, err = _run(capsys, "info", str(tmp_path), "--run-of", "nowhere.json")
    assert code == 2 and "--run-of nowhere.json" in err and "not one of the traces" in err
