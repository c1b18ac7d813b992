"""The CLI's table of commands, its one renderer, and ``--csv`` on every analysis command.

The table must stay true: a command line imports only the module of the command it runs."""

from __future__ import annotations

import argparse
import io
import subprocess
import sys

import polars as pl
import pytest

import traceview
from traceview import cli
from traceview.cli._render import cut, duration, ms, pct, short, table
from traceview.run.run import ANALYSES

from tests.conftest import FIXTURES


# ----------------------------------------------------------------------------- the table
@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_command_in_the_table_configures_and_runs(command):
    parser = argparse.ArgumentParser()
    cli.module_of(command).configure(parser, command)
    assert callable(parser.get_default("run"))


def test_the_analysis_commands_are_those_whose_answers_are_kept():
    assert {name for name, command in cli.COMMANDS.items() if command.answers} == \
        {name.replace("_", "-") for name in ANALYSES}


def test_a_named_command_imports_its_module_only():
    code = ("import sys, traceview.cli as c; c.build_parser(['--debug', 'gaps', 'x']); "
            "print(sorted(m for m in sys.modules if m.startswith('traceview.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['traceview.cli._answers', 'traceview.cli._memory_limit', " \
                          "'traceview.cli._options', " \
                          "'traceview.cli._render', 'traceview.cli._streams', " \
                          "'traceview.cli.timeline']"


def test_without_a_known_command_every_command_is_listed(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["gapz", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gapz'" in err
    assert all(name in err for name in cli.COMMANDS)


def test_every_analysis_of_a_run_is_a_command():
    assert {name.replace("_", "-") for name in ANALYSES} <= set(cli.COMMANDS)


# ----------------------------------------------------------------------------- the renderer
def test_table_cuts_long_names_and_shows_none_as_a_dash():
    text = table(["rank", "name", "total_ms"],
                 [[0, "k" * 100, ms(2_000_000)], [1, None, None]], left={"name"}, max_width=20)
    header, first, second = text.splitlines()
    assert header.split() == ["rank", "name", "total_ms"]
    assert first.split() == ["0", "k" * 19 + "…", "2.000"]
    assert second.split() == ["1", "-", "-"]
    assert len(first) == len(header) == len("rank  " + "k" * 20 + "  total_ms")


def test_table_aligns_numbers_right_and_left_columns_left():
    lines = table(["n", "name"], [[5, "a"], [12345, "bcd"]], left={"name"}).splitlines()
    assert lines == ["    n  name", "    5  a", "12345  bcd"]


def test_table_without_a_width_limit_keeps_every_character():
    assert "x" * 500 in table(["note"], [["x" * 500]], max_width=None)


def test_table_without_rows_is_its_header():
    assert table(["rank", "total_ms"], []) == "rank  total_ms"


def test_cells():
    assert (ms(None), pct(None), short(None), short("")) == ("-", "-", "-", "-")
    assert (ms(1_234_567), pct(0.125), cut("abcdef", 4)) == ("1.235", "12.5%", "abc…")
    assert [duration(v) for v in (None, 500, 10_000, 1_500_000, 2_000_000_000)] \
        == ["inf", "500ns", "10us", "1.5ms", "2s"]


# ----------------------------------------------------------------------------- --csv
@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.mark.parametrize("command", ANALYSES)
def test_csv_header_is_the_main_tables_columns(command, cache_dir, capsys):
    path = str(FIXTURES / "data" / "gloo_ddp_2r")
    assert cli.main([command.replace("_", "-"), path, "--csv", "--cache-dir", cache_dir]) == 0
    out = capsys.readouterr().out
    expected = getattr(traceview.open(path, cache_dir=cache_dir), command)().to_polars()
    assert out.splitlines()[0].split(",") == expected.columns
    assert pl.read_csv(io.StringIO(out)).height == expected.height


@pytest.mark.parametrize("command", ANALYSES)
def test_csv_and_json_are_one_choice(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([command.replace("_", "-"), "x", "--csv", "--json"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_csv_of_a_frame_with_a_list_column(capsys):
    from traceview.cli._render import emit_result
    from traceview.run.result import Result

    res = Result("demo", {"rows": pl.DataFrame({"rank": [0], "ops": [["a", "b"]]})}, "rows")
    assert emit_result(res, argparse.Namespace(json=False, csv=True))
    assert capsys.readouterr().out == "rank,ops\n0,a;b\n"
