"""Classified GPU rows kept in the cache folder (traceview/store/derived.py): read back exactly, keyed
by everything they depend on, never used where the key cannot name the inputs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.store import derived
from traceview.analyses.overlap import prepared_gpu
from traceview.cli import main

from tests.test_gpu_cli import write_trace


@pytest.fixture()
def traces(tmp_path: Path) -> list[str]:
    return [str(write_trace(tmp_path / f"rank{r}.json", r)) for r in (0, 1)]


def _trace_set(*args, **kwargs):
    return traceview.open(*args, **kwargs).traceset


def _kept(cache: Path) -> list[Path]:
    return sorted((cache / "derived").glob("gpu-*.parquet"))


def _never() -> pl.DataFrame:
    raise AssertionError("computed again: the kept rows were not used")


def test_kept_rows_read_back_exactly(traces, tmp_path) -> None:
    cache = tmp_path / "cache"
    ts = _trace_set(traces, cache_dir=cache)
    fresh = prepared_gpu(ts.analysis_events())
    first = derived.cached_gpu(ts, None, lambda: fresh, cache)
    assert first.equals(fresh) and len(_kept(cache)) == 1
    again = derived.cached_gpu(_trace_set(traces, cache_dir=cache), None, _never, cache)
    assert again.equals(fresh) and again.schema == fresh.schema  # Categorical names too


def test_the_key_names_the_ranks_the_files_and_the_definition(traces, tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    ts = _trace_set(traces, cache_dir=cache)
    events = ts.analysis_events()
    derived.cached_gpu(ts, None, lambda: prepared_gpu(events), cache)
    one = derived.cached_gpu(ts, [1], lambda: prepared_gpu(events).filter(pl.col("rank") == 1),
                             cache)
    assert one["rank"].unique().to_list() == [1] and len(_kept(cache)) == 2
    only_rank0 = _trace_set(traces[:1], cache_dir=cache)  # another set of files
    derived.cached_gpu(only_rank0, None, lambda: prepared_gpu(only_rank0.analysis_events()),
                       cache)
    assert len(_kept(cache)) == 3
    # an edit to the code that classifies: a new key, so the rows are computed again
    monkeypatch.setattr(derived, "GPU_ROWS_VERSION", derived.GPU_ROWS_VERSION + 1)
    calls = []
    derived.cached_gpu(ts, None, lambda: calls.append(1) or prepared_gpu(events), cache)
    assert calls == [1] and len(_kept(cache)) == 4


def test_inputs_outside_the_cache_folder_are_never_kept(traces, tmp_path) -> None:
    ts = _trace_set(traces, cache=False)  # events in a temporary folder
    calls = []
    for _ in range(2):
        derived.cached_gpu(ts, None, lambda: calls.append(1) or prepared_gpu(
            ts.analysis_events()), tmp_path / "cache")
    assert calls == [1, 1] and not (tmp_path / "cache").exists()


def test_an_unreadable_kept_file_is_computed_again(traces, tmp_path) -> None:
    cache = tmp_path / "cache"
    ts = _trace_set(traces, cache_dir=cache)
    fresh = prepared_gpu(ts.analysis_events())
    derived.cached_gpu(ts, None, lambda: fresh, cache)
    _kept(cache)[0].write_bytes(b"not parquet")
    assert derived.cached_gpu(ts, None, lambda: fresh, cache).equals(fresh)
    assert derived.cached_gpu(ts, None, _never, cache).equals(fresh)  # and kept again


@pytest.mark.parametrize("command", [["gaps"], ["overlap", "--per-step"], ["breakdown"],
                                     ["summary"]])
def test_commands_answer_the_same_from_kept_rows(traces, tmp_path, capsys, command) -> None:
    cache = str(tmp_path / "cache")
    answers = []
    for options in (["--no-cache"], ["--cache-dir", cache], ["--cache-dir", cache]):
        assert main([*command, *traces, "--json", *options]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert answers[0] == answers[1] == answers[2]
    assert len(_kept(Path(cache))) == 1


def test_windows_of_steps_compute_their_rows(traces, tmp_path) -> None:
    """A window of steps is collected in memory: its rows are not kept."""
    run = traceview.open(traces, steps="2:3", cache_dir=tmp_path / "cache")
    assert run.gpu["step"].unique().to_list() == [2]
    assert not _kept(tmp_path / "cache")
