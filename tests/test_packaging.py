"""Build the wheel once, install it into clean venvs (one without the compiled scanner),
import every module, and run the CLI where users stand: the clone's root, on 40 rank files."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
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


def _venv_with_wheel(where: Path, wheel: Path) -> Path:
    """A clean venv at ``where`` holding the wheel; it sees this interpreter's site-packages
    only for dependencies (a .pth), so no network is needed. Its ``bin`` folder."""
    venv.create(where, with_pip=True, system_site_packages=False)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    (next((where / "lib").glob("python*")) / "site-packages" / "deps.pth").write_text(
        str(site) + "\n")
    # --ignore-installed: the dependencies' folder may hold a traceview too (a normal install
    # of the checkout); the wheel goes into the clean venv all the same, and nothing is
    # uninstalled from that folder.
    subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                    "--no-index", "-q", "--ignore-installed", str(wheel)], check=True,
                   capture_output=True)
    return where / "bin"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel, built once for this module's tests, and what the build printed."""
    # Built here without isolation, so with this environment's tools: the dev extra's.
    pytest.importorskip("build", reason="needs the dev extra (build)")
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (pyproject.toml's license "
                    "field): install the dev extra")
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                            "--outdir", str(dist), str(REPO)], check=True, capture_output=True,
                           text=True)
    return next(dist.glob("traceview-*.whl")), built.stdout + built.stderr


@pytest.fixture(scope="module")
def installed(wheel: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bin`` of a venv where the wheel is installed, as users install it."""
    return _venv_with_wheel(tmp_path_factory.mktemp("venv"), wheel[0])


@pytest.fixture(scope="module")
def installed_without_scanner(wheel: tuple[Path, str],
                              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same install with the compiled scanner removed: what a platform without a wheel
    or a compiler gets."""
    bin_dir = _venv_with_wheel(tmp_path_factory.mktemp("venv-pure"), wheel[0])
    package = next((bin_dir.parent / "lib").glob("python*/site-packages/traceview"))
    for built in (package / "parsers" / "kineto").glob("_scan.*"):
        built.unlink()
    return bin_dir


@pytest.fixture(scope="module")
def checkout_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone's root: the source folders as git holds them, nothing built in them (a
    traceview/ the interpreter would import from the working folder)."""
    root = tmp_path_factory.mktemp("clone")
    built = shutil.ignore_patterns("*.so", "*.pyd", "__pycache__")
    for folder in FOLDERS.values():
        shutil.copytree(REPO / folder, root / folder, symlinks=True, ignore=built)
    return root


@pytest.fixture(scope="module")
def forty_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40-file run: more than 32 new files go to the local pool."""
    from fixtures.synthetic import SyntheticSpec, generate

    folder = tmp_path_factory.mktemp("forty")
    generate(SyntheticSpec(world_size=40, steps=2), folder)
    (folder / "ground_truth.json").unlink()
    return folder


def _user_env(cache: Path) -> dict[str, str]:
    """A user's shell: no test-run path settings (tests/conftest.py sets them for children)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return {**env, "TRACEVIEW_CACHE_DIR": str(cache)}


@pytest.mark.slow
def test_wheel_installs_and_imports_every_module(wheel, installed, tmp_path):
    assert "absent from the `packages` configuration" not in wheel[1]  # nothing left out
    modules = _modules()
    code = ("import importlib, sys\n"
            f"mods = {modules!r}\n"
            "for m in mods:\n"
            "    mod = importlib.import_module(m)\n"
            f"    assert (mod.__file__ or '').startswith({str(installed.parent)!r}), "
            "(m, mod.__file__)\n"
            "print(len(mods))\n")
    out = subprocess.run([str(installed / "python"), "-c", code], check=True,
                         capture_output=True, text=True, cwd=tmp_path)
    assert int(out.stdout.strip()) == len(modules)
    version = subprocess.run([str(installed / "traceview"), "--version"], check=True,
                             capture_output=True, text=True)
    assert version.stdout.startswith("traceview ")


#: The commands compared between the installs: (command, input: forty or a fixture).
_COMMANDS = [("stragglers", "forty"), ("summary", "forty"),
             ("gaps", "fixtures/data/gpu_real/sampled_rank-0.json.gz")]


def _answers(bin_dir: Path, cwd: Path, forty: Path, cache: Path) -> list[dict]:
    answers = []
    for command, given in _COMMANDS:
        path = forty if given == "forty" else REPO / given
        done = subprocess.run([str(bin_dir / "traceview"), command, str(path), "--json"],
                              cwd=cwd, env=_user_env(cache), capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command} from {cwd}: {done.stderr[-3000:]}"
        answers.append(json.loads(done.stdout))
    return answers


@pytest.mark.slow
def test_installed_cli_from_the_clones_root_reads_forty_files(installed, checkout_root,
                                                             forty_ranks, tmp_path):
    """``pip install .`` then ``traceview stragglers FOLDER`` where the README leaves the user:
    the clone's root. Before, the pool's workers imported the uncompiled sources there."""
    from_root = _answers(installed, checkout_root, forty_ranks, tmp_path / "root")
    elsewhere = _answers(installed, tmp_path, forty_ranks, tmp_path / "elsewhere")
    assert from_root == elsewhere
    assert len(from_root[0]["ranks"]) == 40


@pytest.mark.slow
def test_installed_without_the_scanner_gives_the_same_json(installed, installed_without_scanner,
                                                           checkout_root, forty_ranks, tmp_path):
    version = subprocess.run([str(installed_without_scanner / "traceview"), "--version"],
                             check=True, capture_output=True, text=True).stdout
    assert "Kineto parser: pure Python: no C scanner" in version
    pure = _answers(installed_without_scanner, checkout_root, forty_ranks, tmp_path / "pure")
    assert pure == _answers(installed, checkout_root, forty_ranks, tmp_path / "compiled")


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
