"""Without the compiled scanner every Kineto trace is read, with the same answers.

A traceview whose ``_scan`` was never compiled (no C compiler, a source tree, an unusual
platform) is made for real: the package's sources copied without the compiled file, run by
``python -m traceview`` from the copy's root, as from a fresh checkout. Its ``--json`` is
compared with the compiled path's on fixtures and corpus traces, a folder of more than 32 rank
files (the local pool) and a trace cut short included. No parser is mocked.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.corpus import absent
from tests.conftest import CORPUS, FIXTURES, REPO

GLOO = FIXTURES / "data" / "gloo_ddp_2r"
GPU = FIXTURES / "data" / "gpu_real" / "sampled_rank-0.json.gz"
ALEXNET = (CORPUS / "hta-tests-data/tests/data/critical_path/alexnet"
           / "benchmark_result_2869224_1695835535_trace.json.gz")
#: the oldest layout: a top-level JSON array
RESNET = CORPUS / "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz"
#: times with a sub-microsecond fraction
NS_TIMES = (CORPUS / "hta-tests-data/tests/data/ns_resolution_trace"
            / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")


def _sources_without_scanner(dest: Path) -> Path:
    """The package as a checkout's root holds it, links resolved, without the compiled
    scanner (or any other build output)."""
    import traceview

    shutil.copytree(Path(traceview.__file__).resolve().parent, dest / "traceview",
                    ignore=shutil.ignore_patterns("_scan.*.so", "_scan.*.pyd", "__pycache__"))
    return dest


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The traces compared: shipped fixtures, a 40-rank run (a pool parses it), a trace cut
    short, and corpus traces when the corpus is there."""
    from fixtures.synthetic import SyntheticSpec, generate

    tmp = tmp_path_factory.mktemp("pure-inputs")
    generate(SyntheticSpec(world_size=40, steps=2), tmp / "forty")
    (tmp / "forty" / "ground_truth.json").unlink()
    text = gzip.decompress(GPU.read_bytes())
    cut = tmp / "cut" / "rank-0.json"
    cut.parent.mkdir()
    cut.write_bytes(text[: len(text) * 2 // 3])
    found = {"gloo": GLOO, "gpu": GPU, "forty": tmp / "forty", "cut": cut,
             "alexnet": ALEXNET, "resnet": RESNET, "ns_times": NS_TIMES}
    return {name: path for name, path in found.items() if path.exists()}


@pytest.fixture(scope="module")
def pure_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sources_without_scanner(tmp_path_factory.mktemp("checkout-without-scanner"))


def _traceview(args: list[str], *, root: Path | None, cache: Path) -> subprocess.CompletedProcess:
    """``python -m traceview ARGS``: from ``root`` without the scanner (the working folder
    first on the path, as a checkout's root puts it), else the traceview under test."""
    env = {**os.environ, "TRACEVIEW_CACHE_DIR": str(cache)}
    if root is not None:
        for name in ("PYTHONSAFEPATH", "PYTHONPATH"):
            env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "traceview", *args], cwd=root or REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_version_says_the_pure_path_is_active(pure_root: Path, tmp_path: Path) -> None:
    said = _traceview(["--version"], root=pure_root, cache=tmp_path).stdout
    assert "Kineto parser: pure Python: no C scanner" in said and "C compiler" in said


#: (input, command): every trace read by both paths, answers compared whole
CASES = [("gloo", "summary"), ("gloo", "stragglers"), ("gpu", "gaps"), ("gpu", "ops"),
         ("forty", "stragglers"), ("cut", "info"), ("alexnet", "summary"),
         ("resnet", "breakdown"), ("ns_times", "info")]


@pytest.mark.parametrize(("name", "command"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_pure_path_gives_the_compiled_paths_json(name: str, command: str, inputs: dict,
                                                 pure_root: Path, tmp_path: Path) -> None:
    if name not in inputs:
        pytest.skip(absent(CORPUS))
    compiled = _traceview(["--version"], root=None, cache=tmp_path).stdout
    if "C scanner" not in compiled:
        pytest.skip("the traceview under test has no compiled scanner to compare with")
    args = [command, str(inputs[name]), "--json"]
    fast = _traceview(args, root=None, cache=tmp_path / "c")
    pure = _traceview(args, root=pure_root, cache=tmp_path / "pure")
    assert pure.returncode == fast.returncode == 0, pure.stderr[-3000:] + fast.stderr[-3000:]
    assert json.loads(pure.stdout) == json.loads(fast.stdout)
