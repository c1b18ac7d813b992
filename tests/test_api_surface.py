"""The Python API as a notebook meets it: tables by attribute and completion, nullable
integers in pandas, every analysis listed, a clean ``dir(traceview)``, the classified GPU rows
in SQL, ``run.diff`` as ``traceview diff``."""

from __future__ import annotations

import copy
import inspect
import json
import pickle
import subprocess
import sys

import polars as pl
import pytest

import traceview
from traceview.cli import main
from traceview.run.run import ANALYSES, Run

from tests.conftest import FIXTURES

GLOO = str(FIXTURES / "data" / "gloo_ddp_2r")
SLOW = str(FIXTURES / "data" / "gloo_ddp_2r_slow1")


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two small synthetic GPU ranks (NCCL kernels, copies, sets)."""
    from fixtures import synthetic

    out = tmp_path_factory.mktemp("gpu2")
    synthetic.main(["--out", str(out), "--world-size", "2", "--steps", "3", "--seed", "1"])
    return str(out)


def test_result_tables_by_attribute_and_completion() -> None:
    s = traceview.open(GLOO).summary()
    assert s.ranks is s["ranks"] and s.worst_straggler == s["worst_straggler"]
    assert s.warnings == s.to_dict()["warnings"] or isinstance(s.warnings, tuple)  # its own
    with pytest.raises(AttributeError, match="nope"):
        s.nope  # noqa: B018
    assert not hasattr(s, "nope") and not hasattr(s, "__array__")
    assert {"ranks", "worst_straggler", "window", "to_pandas"} <= set(dir(s))
    assert s._ipython_key_completions_() == list(s.keys())
    for again in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert again.ranks.equals(s.ranks)


def test_run_to_pandas_keeps_integers_with_nulls(gpu_run) -> None:
    df = traceview.open(gpu_run).to_pandas()
    for col in ("pid", "tid", "device", "stream", "dur_ns", "correlation", "step"):
        assert str(df[col].dtype) in ("Int32", "Int64"), (col, df[col].dtype)
    streams = df["stream"].dropna()
    assert len(streams) and all(float(v).is_integer() and not isinstance(v, float)
                                for v in streams.head())
    assert df["stream"].isna().any()  # host rows have none: still an integer column
    assert str(df["name"].dtype) == "category"


def test_every_analysis_method_is_listed() -> None:
    """A public method of Run answering a Result is an analysis command, diff aside (it
    compares two runs)."""
    answers = {name for name, f in inspect.getmembers(Run, inspect.isfunction)
               if not name.startswith("_")
               and inspect.signature(f).return_annotation in ("Result", traceview.Result)}
    assert answers - {"diff"} == set(ANALYSES)
    assert "critical_path" in traceview.ANALYSES
    assert "diff" in dir(Run)


def test_dir_of_the_package_is_its_public_names() -> None:
    names = dir(traceview)
    assert names == sorted(traceview.__all__)
    assert not {"Any", "annotations", "importlib"} & set(names)
    # listing them imports nothing heavy: the lazy names stay lazy
    code = ("import sys, traceview; dir(traceview); "
            "print('polars' in sys.modules, 'traceview.run.run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def test_sql_has_the_classified_gpu_rows(gpu_run, capsys) -> None:
    run = traceview.open(gpu_run)
    by_class = run.sql("select gpu_class, count(*) as n, sum(dur_ns) as ns from gpu "
                       "group by gpu_class order by gpu_class")
    expected = (run.gpu.group_by("gpu_class").agg(n=pl.len(), ns=pl.col("dur_ns").sum())
                .sort("gpu_class"))
    assert by_class["gpu_class"].to_list() == expected["gpu_class"].to_list()
    assert "comm" in by_class["gpu_class"].to_list()
    assert by_class["n"].to_list() == expected["n"].to_list()
    assert by_class["ns"].to_list() == expected["ns"].to_list()
    with pytest.raises(traceview.UsageError, match="columns of the table gpu"):
        run.sql("select gpu_class from kernels")
    # the window applies, and the CLI has the same table
    assert run.select(steps="1:2").sql("select count(*) as n from gpu").item() \
        == run.gpu.filter(pl.col("step") == 1).height
    assert main(["sql", gpu_run, "select count(*) as n from gpu where gpu_class = 'comm'",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"n": run.gpu.filter(pl.col("gpu_class") == "comm").height}]


def test_run_diff_is_the_cli_diff(capsys) -> None:
    base = traceview.open(GLOO)
    res = base.diff(SLOW)
    assert res.command == "diff" and res.main == "metrics"
    assert res.metrics["metric"].to_list()[0] == "step_time_ns"
    assert main(["diff", GLOO, SLOW, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    # the CLI adds only the inputs as typed on its command line, which a Run does not keep
    assert (cli.pop("base_path"), cli.pop("test_path")) == (GLOO, SLOW)
    assert res.to_dict() == cli
    assert base.diff(traceview.open(SLOW)).to_dict() == res.to_dict()


def test_breakdown_says_which_rows_are_totals(gpu_run) -> None:
    steps = traceview.open(gpu_run).breakdown().to_pandas()
    assert list(steps.columns[:4]) == ["rank", "device", "step", "scope"]
    per_step, whole = steps[steps.scope == "step"], steps[steps.scope == "window"]
    assert per_step.step.notna().all() and whole.step.isna().all()
    assert len(whole) == 2 and len(per_step) == 2 * 3  # one total per rank, 3 steps each
    # the total covers its steps' windows (and what lies between them)
    for rank, rows in per_step.groupby("rank"):
        total = whole[whole["rank"] == rank].iloc[0]
        assert rows.compute_ns.sum() <= total.compute_ns
