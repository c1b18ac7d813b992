"""Build the wheel, install it into a clean venv, import every module, run the CLI."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO


#: import name of each source folder (pyproject.toml's package-dir)
FOLDERS = {"traceview": "traceview", "traceview.parsers": "parsers", "traceview.analyses": "analyses"}


def _modules() -> list[str]:
    """Every module and package under the source folders, sub-packages included (the wheel
    leaves out a sub-package pyproject.toml does not list), and the C scanner when this
    environment could build it."""
    names = []
    for package, folder in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":  # a package: its own name
                parts = parts[:-1]
            names.append(".".join((package, *parts)))
    if importlib.util.find_spec("traceview.parsers.kineto._scan") is not None:
        names.append("traceview.parsers.kineto._scan")
    return sorted(names)


@pytest.mark.slow
def test_wheel_installs_and_imports_every_module(tmp_path):
    # Built here without isolation, so with this environment's tools: the dev extra's.
    pytest.importorskip("build", reason="needs the dev extra (build)")
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (pyproject.toml's license "
                    "field): install the dev extra")
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(dist), str(REPO)], check=True, capture_output=True)
    wheel = next(dist.glob("traceview-*.whl"))
    env_dir = tmp_path / "venv"
    # The clean venv sees this interpreter's site-packages only for dependencies, so the
    # test needs no network; traceview itself comes from the wheel alone.
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    python = env_dir / "bin" / "python"
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    (next((env_dir / "lib").glob("python*")) / "site-packages" / "deps.pth").write_text(
        str(site) + "\n")
    # --ignore-installed: the dependencies' folder may hold a traceview too (a normal install
    # of the checkout); the wheel goes into the clean venv all the same, and nothing is
    # uninstalled from that folder.
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--ignore-installed", str(wheel)], check=True, capture_output=True)
    modules = _modules()
    code = ("import importlib, sys\n"
            f"mods = {modules!r}\n"
            "for m in mods:\n"
            "    mod = importlib.import_module(m)\n"
            f"    assert (mod.__file__ or '').startswith({str(env_dir)!r}), (m, mod.__file__)\n"
            "print(len(mods))\n")
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True,
                         cwd=tmp_path)
    assert int(out.stdout.strip()) == len(modules)
    version = subprocess.run([str(env_dir / "bin" / "traceview"), "--version"], check=True,
                             capture_output=True, text=True)
    assert version.stdout.startswith("traceview ")


def test_import_traceview_is_light():
    code = ("import sys, traceview\n"
            "heavy = [m for m in ('torch', 'plotly', 'IPython', 'polars') if m in sys.modules]\n"
            "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    assert out.stdout.strip() == "[]"


def test_wheels_are_built_with_the_scanner_for_linux_and_macos():
    """pyproject.toml's [tool.cibuildwheel] and the workflow that runs it: manylinux and macOS
    wheels on both architectures, each tested for the C scanner (other platforms build the
    sdist, with the pure-Python path where there is no compiler)."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert set(config["linux"]["archs"]) == {"x86_64", "aarch64"}
    assert set(config["macos"]["archs"]) == {"x86_64", "arm64"}
    assert any("parser_path() == ('C scanner', None)" in c for c in config["test-command"])
    workflow = (REPO / ".github" / "workflows" / "wheels.yml").read_text()
    assert "uses: pypa/cibuildwheel@" in workflow
    for runner in ("ubuntu-24.04", "ubuntu-24.04-arm", "macos-14"):
        assert f"os: {runner}\n" in workflow
