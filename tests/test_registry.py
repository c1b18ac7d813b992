"""The table of analyses (``traceview.run.registry``): one registration line makes an analysis
a method of every Run, a command with its options, ``--json``, ``--csv`` and text, and (asked)
a section of the report; taken out, it is gone from all of them.

The analysis registered here is docs/architecture.md's recipe, "Adding an analysis": the GPU
kernels of at least a duration, a pure function of the ``gpu`` table."""

from __future__ import annotations

import argparse
import inspect
import io
import json

import polars as pl
import pytest

import traceview
from traceview import cli
from traceview.cli._render import MAX_ROWS
from traceview.run import registry
from traceview.run.registry import Analysis
from traceview.run.run import Run, registered

from tests.conftest import FIXTURES

GPU = str(FIXTURES / "data" / "gpu_real")


def long_kernels(gpu: pl.DataFrame, *, min_ns: int = 1_000_000) -> pl.DataFrame:
    """GPU events of at least ``min_ns``: rank, device, stream, name, ts_ns, dur_ns."""
    return (gpu.filter(pl.col("dur_ns") >= min_ns)
            .select("rank", "device", "stream", "name", "ts_ns", "dur_ns")
            .sort("dur_ns", "ts_ns", descending=[True, False]))


LONG_KERNELS = Analysis("long_kernels", "GPU kernels of at least a duration",
                        function=f"{__name__}:long_kernels", tables=("gpu",),
                        options={"min_ns": "shortest kernel to list (ns)"}, report=True)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def threshold(cache_dir) -> int:
    """A duration that a few of the fixture's GPU events reach, and most do not."""
    durations = traceview.open(GPU, cache_dir=cache_dir).gpu.get_column("dur_ns")
    return int(durations.quantile(0.9))


def test_one_registration_line_makes_a_method_a_command_and_a_section(cache_dir, threshold,
                                                                        capsys) -> None:
    before = dict(registry.ANALYSES)
    with registered(LONG_KERNELS):
        # the Python API: a method of every Run, listed with the others
        run = traceview.open(GPU, cache_dir=cache_dir)
        res = run.long_kernels(min_ns=threshold)
        expected = long_kernels(run.gpu, min_ns=threshold).with_columns(
            pl.col(pl.Categorical).cast(pl.String))
        assert res.main == "rows" and res["rows"].equals(expected)
        assert 0 < expected.height < run.gpu.height
        assert list(res.to_dict())[:2] == ["window", "rows"]
        assert "long_kernels" in dir(run) and "long_kernels" in traceview.ANALYSES
        assert list(inspect.signature(Run.long_kernels).parameters) == ["run", "min_ns"]
        with pytest.raises(TypeError, match="min_us"):
            run.long_kernels(min_us=3)

        # the command line: a command with the function's option, --json is the Result
        assert cli.COMMANDS["long-kernels"] == cli.Command("analysis", LONG_KERNELS.help, True)
        argv = ["long-kernels", GPU, "--min-ns", str(threshold), "--cache-dir", cache_dir]
        assert cli.main([*argv, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == res.to_dict()
        assert cli.main([*argv, "--csv"]) == 0
        assert pl.read_csv(io.StringIO(capsys.readouterr().out)).height == expected.height
        assert cli.main([*argv, "--all"]) == 0  # the text: the main table, every row
        text = capsys.readouterr().out.splitlines()
        assert text[0].split() == expected.columns and len(text) == 1 + expected.height
        assert cli.main(argv) == 0  # past MAX_ROWS rows, the first ones and how to see all
        text = capsys.readouterr().out.splitlines()
        assert expected.height > MAX_ROWS and len(text) == 1 + MAX_ROWS + 1
        assert "`traceview long-kernels --all` prints every row" in text[-1]
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        assert "long-kernels" in capsys.readouterr().out

        # the report: a section with the main table
        from traceview.outputs.report import gather, write_html

        data = gather(run)
        html = io.StringIO()
        write_html(data, html, plotly="")
        shown = data.registered["long-kernels"][1]  # the default options: run.long_kernels()
        assert shown.to_dict() == run.long_kernels().to_dict()
        assert shown["rows"].height == long_kernels(run.gpu).height
        assert '<section id="long-kernels">' in html.getvalue()

        with pytest.raises(ValueError, match="taken"):
            traceview.run.run.register(LONG_KERNELS)

    # taken out: gone from the table, the Run, the command line and the report
    assert registry.ANALYSES == before
    assert not hasattr(Run, "long_kernels") and "long-kernels" not in cli.COMMANDS
    with pytest.raises(SystemExit):
        cli.main(["long-kernels", GPU])
    assert "invalid choice: 'long-kernels'" in capsys.readouterr().err


def test_a_name_of_the_run_cannot_be_registered() -> None:
    with pytest.raises(ValueError, match="taken"):
        traceview.run.run.register(Analysis("gpu", "a table's name",
                                            function=f"{__name__}:long_kernels"))
    assert "gpu" not in registry.ANALYSES


def test_an_analysis_names_one_way_to_answer() -> None:
    with pytest.raises(ValueError, match="answer or function"):
        Analysis("x", "neither")
    with pytest.raises(ValueError, match="answer or function"):
        Analysis("x", "both", answer="m:f", function="m:g")
    with pytest.raises(ValueError, match="for a function"):
        Analysis("x", "composed, with tables", answer="m:f", tables=("gpu",))


@pytest.mark.parametrize("name", list(registry.ANALYSES))
def test_every_analysis_is_a_method_of_the_run_and_a_command(name) -> None:
    analysis = registry.ANALYSES[name]
    assert getattr(Run, name) is registry.resolve(analysis.answer)
    assert inspect.signature(getattr(Run, name)).return_annotation == "Result"
    parser = argparse.ArgumentParser()
    cli.module_of(analysis.command).configure(parser, analysis.command)
    assert callable(parser.get_default("run"))
