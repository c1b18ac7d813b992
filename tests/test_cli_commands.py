"""The CLI imports only the module of the subcommand it runs: its table must stay true."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from traceview import cli


def _registered(module_name: str) -> set[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module_name).register(sub)
    return set(sub.choices)


@pytest.mark.parametrize("module_name", cli.COMMAND_MODULES)
def test_every_registered_command_is_in_the_table(module_name):
    assert {name for name, mod in cli.COMMANDS.items() if mod == module_name} \
        == _registered(module_name)


def test_a_named_command_imports_its_module_only():
    code = ("import sys, traceview.cli as c; c.build_parser(['--debug', 'gaps', 'x']); "
            "print(sorted(m for m in sys.modules if m.startswith('traceview.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['traceview.cli._options', 'traceview.cli._render', 'traceview.cli.timeline']"


def test_without_a_known_command_every_command_is_listed(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["gapz", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gapz'" in err
    assert all(name in err for name in cli.COMMANDS)
