"""The host table (analyses/host.py) holds every row the host-side lookups read: given in
place of the events, they return the same answer."""

from __future__ import annotations

from pathlib import Path

import pytest

import traceview
from traceview.analyses.breakdown import launch_delays, with_self_time
from traceview.analyses.gaps import gaps, largest_gaps
from traceview.analyses.host import HOST_KINDS, host_events
from traceview.analyses.overlap import prepared_gpu
from traceview.analyses.window import STEP_MARKER_KINDS, step_spans

from tests.conftest import CORPUS, absent

ROOT = Path(__file__).resolve().parents[1]
HTA = CORPUS / "hta-tests-data" / "tests" / "data"


def _nsys_export(tmp_path: Path) -> Path:
    from fixtures.nsys_synthetic import write_export

    write_export(tmp_path / "run.sqlite", ranks=2, steps=3)  # NVTX step markers, syncs
    return tmp_path / "run.sqlite"


def test_step_markers_are_host_rows() -> None:
    assert set(STEP_MARKER_KINDS) <= set(HOST_KINDS)


@pytest.mark.parametrize("path", [
    "nsys",
    ROOT / "fixtures" / "data" / "gloo_ddp_2r",
    HTA / "negative_queue_length_values_check" / "rank0.json.gz",
    HTA / "with_gpu_user_annotation" / "step_based_trace_2543932.json.gz",
])
def test_host_table_answers_like_the_events(path: Path | str, tmp_path: Path) -> None:
    if path == "nsys":
        path = _nsys_export(tmp_path)
    if not path.exists():
        pytest.skip(absent(path))
    ev = traceview.open(path, cache_dir=tmp_path / "cache").analysis_events()
    host, gpu = host_events(ev), prepared_gpu(ev)
    assert step_spans(host).equals(step_spans(ev))
    assert with_self_time(host).equals(with_self_time(ev))
    assert launch_delays(gpu, host).equals(launch_delays(gpu, ev))
    g = gaps(gpu, ev)
    assert gaps(gpu, host).equals(g)
    assert largest_gaps(g, host).equals(largest_gaps(g, ev))


def test_other_accelerators_runtime_calls_become_launches() -> None:
    """Rows of kind ``other`` stay only when their category (any case) names another
    accelerator's runtime; they read as ``cuda_runtime``, in their place among the rows."""
    import polars as pl

    ev = pl.DataFrame(
        {"rank": [0] * 5, "kind": ["cpu_op", "other", "other", "kernel", "cuda_runtime"],
         "name": list("abcde"), "pid": [1] * 5, "tid": [1] * 5, "ts_ns": [1, 2, 3, 4, 5],
         "dur_ns": [1] * 5, "correlation": [None, 7, None, 7, 8], "external_id": [None] * 5,
         "category": ["cpu_op", "MTIA_Runtime", "weird", "kernel", "cuda_runtime"]},
        schema_overrides={"kind": pl.Categorical, "category": pl.Categorical,
                          "external_id": pl.Int64})
    host = host_events(ev)
    assert host.select("name", pl.col("kind").cast(pl.String)).rows() == [
        ("a", "cpu_op"), ("b", "cuda_runtime"), ("e", "cuda_runtime")]
    assert host_events(ev.filter(pl.col("kind") != "other")).get_column("name").to_list() == [
        "a", "e"]
    # other rows, none a runtime call (a CUDA trace's bookkeeping): the plain host rows
    no_runtime = ev.filter(pl.col("name") != "b")
    assert host_events(no_runtime).select("name", pl.col("kind").cast(pl.String)).rows() == [
        ("a", "cpu_op"), ("e", "cuda_runtime")]
    assert host_events(no_runtime.lazy()).equals(host_events(no_runtime))
