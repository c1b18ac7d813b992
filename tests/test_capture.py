"""traceview.capture in one process (no torch.distributed), the lazy torch import, and the
``capture nsys`` command construction and orchestration."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import traceview
from tests.conftest import needs_torch
from traceview.capture.nsys import export_command, nsys_command, split_torchrun
from traceview.capture.sync_probe import identity, trace_file_name
from traceview.cli import main

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# ----------------------------------------------------------------------------- light import
def test_import_traceview_and_cli_never_import_torch():
    code = ("import sys, traceview, traceview.capture, traceview.capture.nsys, "
            "traceview.capture.validate, traceview.cli.capture, traceview.cli; "
            "traceview.cli.build_parser(); print('torch' in sys.modules)")
    out = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_torch_says_how_to_install_it(tmp_path, monkeypatch):
    import traceview.capture as cap

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    # the package torch, or the checkout's extra: traceview is not on PyPI
    with pytest.raises(cap.CaptureUnavailable, match=r"pip install torch .*'\.\[capture\]'"):
        with cap.profile(tmp_path):
            pass
    assert not any(tmp_path.iterdir())


def test_identity_from_environment(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert (identity(None).rank, identity(None).rank_from) == (0, "default")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert (identity(None).rank, identity(None).rank_from) == (2, "LOCAL_RANK")
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    ident = identity(None)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.rank_from) == (5, 8, 2, "RANK")
    assert trace_file_name(ident, 1) == f"rank-5.{ident.host}.{os.getpid()}.w1.pt.trace.json.gz"


# ----------------------------------------------------------------------------- single process
def _train(prof, steps: int, fail_at: int | None = None) -> None:
    import torch

    model = torch.nn.Linear(8, 4)
    for i in range(steps):
        if i == fail_at:
            raise RuntimeError("boom")
        model(torch.randn(2, 8)).sum().backward()
        prof.step()


@needs_torch
def test_profile_without_distributed(tmp_path, monkeypatch, capsys):
    """No torch.distributed: one gzipped rank-0 file, run.json, no probe, and it validates."""
    import traceview.capture as cap

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with cap.profile(tmp_path, wait=1, warmup=1, active=2) as prof:
        _train(prof, 5)
    assert prof.sync_timings == [] and prof.steps == 5
    name = f"rank-0.{prof.identity.host}.{os.getpid()}.pt.trace.json.gz"
    assert [p.name for p in prof.files] == [name]
    assert (tmp_path / name).read_bytes()[:2] == b"\x1f\x8b"
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["world_size"] == 1 and info["distributed"] is False
    assert info["completed"] is True and info["files_written"] == [name]
    assert info["schedule"] == {"wait": 1, "warmup": 1, "active": 2, "repeat": 1,
                                "skip_first": 0}
    assert info["sync_probe"]["enabled"] is False and info["torch"]
    assert info["options"]["cuda_sync_events"] is False  # no CUDA profiled here
    ts = traceview.open(tmp_path, cache=False)
    steps = ts.sql("select distinct step from events where step is not null order by step")
    assert steps["step"].to_list() == [2, 3]  # steps wait + warmup .. + active - 1
    assert main(["validate", str(tmp_path), "--no-cache"]) == 0
    capsys.readouterr()


@needs_torch
def test_cuda_sync_events_asked_for_whenever_cuda_is_profiled():
    """Kineto writes the stream-wait edges a replay needs only with enable_cuda_sync_events."""
    import torch

    from traceview.capture.profiler import cuda_sync_config

    cpu, cuda = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
    assert cuda_sync_config(torch, [cpu]) is None
    config = cuda_sync_config(torch, [cpu, cuda])
    experimental = torch._C._profiler._ExperimentalConfig
    assert config.__getstate__() == experimental(enable_cuda_sync_events=True).__getstate__()
    assert config.__getstate__() != experimental().__getstate__()


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@needs_torch
def test_profile_rank_from_env_and_repeat(tmp_path, monkeypatch):
    """RANK=3 without torch.distributed: rank-3 files, one per window, no run.json (rank 0's)."""
    import traceview.capture as cap

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with cap.profile(tmp_path, wait=0, warmup=1, active=1, repeat=2) as prof:
        _train(prof, 5)
    assert [p.name for p in prof.files] == [
        f"rank-3.{prof.identity.host}.{os.getpid()}.w{k}.pt.trace.json.gz" for k in (0, 1)]
    assert not (tmp_path / "run.json").exists()


@needs_torch
def test_profile_exception_propagates_and_is_recorded(tmp_path, monkeypatch):
    import traceview.capture as cap

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="boom"):
        with cap.profile(tmp_path, wait=0, warmup=1, active=3) as prof:
            _train(prof, 5, fail_at=2)
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["completed"] is False and info["steps"] == 2


@needs_torch
def test_bad_schedule_is_an_error(tmp_path):
    import traceview.capture as cap

    with pytest.raises(traceview.TraceviewError, match="active=0"):
        with cap.profile(tmp_path, active=0):
            pass


# ----------------------------------------------------------------------------- nsys commands
def test_nsys_command_plain():
    cmd = nsys_command(["python", "train.py", "--lr", "1"], output_dir="out")
    assert cmd == ["nsys", "profile", "--trace=cuda,nvtx", "--cuda-memory-usage=true",
                   "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                   "--force-overwrite=true", "--output=out/rank%q{RANK}",
                   "python", "train.py", "--lr", "1"]


def test_nsys_command_options():
    cmd = nsys_command(["./a.out"], output_dir="o", osrt=True, cuda_memory_usage=False,
                       capture_range="none", rank_var="SLURM_PROCID", nsys="/opt/nsys")
    assert cmd == ["/opt/nsys", "profile", "--trace=cuda,nvtx,osrt",
                   "--cuda-memory-usage=false", "--force-overwrite=true",
                   "--output=o/rank%q{SLURM_PROCID}", "./a.out"]


def test_nsys_goes_inside_torchrun():
    """nsys wrapping torchrun would expand %q{RANK} once, in a process where RANK is unset."""
    cmd = nsys_command(["torchrun", "--nproc_per_node=2", "--nnodes", "1", "--standalone",
                        "train.py", "--epochs", "1"], output_dir="o", python="py")
    i = cmd.index("nsys")
    assert cmd[:i] == ["torchrun", "--nproc_per_node=2", "--nnodes", "1", "--standalone",
                       "--no-python"]
    assert cmd[i + 1] == "profile" and "--output=o/rank%q{RANK}" in cmd
    assert cmd[-4:] == ["py", "train.py", "--epochs", "1"]


def test_nsys_inside_torchrun_module_and_no_python():
    cmd = nsys_command(["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                        "pkg.train", "x"], output_dir="o", python="py")
    assert cmd[:6] == ["python", "-m", "torch.distributed.run", "--nproc-per-node", "2",
                       "--no-python"]
    assert cmd[-4:] == ["py", "-m", "pkg.train", "x"]
    cmd = nsys_command(["torchrun", "--no-python", "./bin"], output_dir="o")
    assert cmd[:3] == ["torchrun", "--no-python", "nsys"] and cmd[-1] == "./bin"
    assert split_torchrun(["python", "t.py"]) is None
    with pytest.raises(ValueError):
        nsys_command(["torchrun", "--standalone"], output_dir="o")


def test_export_command():
    assert export_command("o/rank1.nsys-rep") == [
        "nsys", "export", "--type", "sqlite", "--force-overwrite", "true",
        "--output", "o/rank1.sqlite", "o/rank1.nsys-rep"]


def test_capture_nsys_dry_run_json(tmp_path, capsys):
    code = main(["capture", "nsys", "--output", str(tmp_path), "--dry-run", "--json", "--",
                 "python", "train.py"])
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert code == 0 and out["returncode"] is None and out["reports"] == []
    assert out["command"][:2] == ["nsys", "profile"] and out["command"][-2:] == ["python",
                                                                                   "train.py"]
    assert shlex.split(out["command_line"]) == out["command"]
    assert out["command_line"] in captured.err


def test_capture_nsys_not_installed(tmp_path, capsys):
    code = main(["capture", "nsys", "--nsys", str(tmp_path / "no-such-nsys"), "-o",
                 str(tmp_path), "--", "python", "-c", "pass"])
    captured = capsys.readouterr()
    assert code == 2
    assert "nsys profile" in captured.out  # the command is printed before the check
    assert "not installed" in captured.err and "Nsight Systems" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_capture_nsys_needs_a_command(capsys):
    assert main(["capture", "nsys", "--"]) == 2
    assert "command" in capsys.readouterr().err


FAKE_NSYS = '''#!{py}
"""Stand-in for nsys (which cannot run here): profile runs the command and writes a report
named like nsys would; export writes a schema-faithful synthetic SQLite export."""
import os, re, subprocess, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
args = sys.argv[1:]
if args[0] == "profile":
    i = 1
    while args[i].startswith("-"):
        i += 1
    out = next(a.split("=", 1)[1] for a in args if a.startswith("--output="))
    out = re.sub(r"%q\\{{(\\w+)\\}}", lambda m: os.environ.get(m.group(1), ""), out)
    rc = subprocess.call(args[i:])
    Path(out + ".nsys-rep").write_bytes(b"not a real report")
    sys.exit(rc)
if args[0] == "export":
    from fixtures.nsys_synthetic import write_export
    write_export(args[args.index("--output") + 1], ranks=2, steps=3)
'''


def test_capture_nsys_runs_exports_and_validates(tmp_path, capsys):
    """The orchestration around nsys (run, find the reports, export each, validate)."""
    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS.format(py=PY, repo=str(REPO)))
    fake.chmod(0o755)
    out = tmp_path / "run"
    code = main(["capture", "nsys", "--nsys", str(fake), "-o", str(out), "--json", "--",
                 PY, "-c", "print('training')"])
    res = json.loads(capsys.readouterr().out)
    assert code == 0, res
    assert res["returncode"] == 0 and res["problems"] == []
    assert [Path(p).name for p in res["reports"]] == ["rank.nsys-rep"]
    assert [Path(p).name for p in res["exports"]] == ["rank.sqlite"]


def test_capture_nsys_reports_a_failing_program(tmp_path, capsys):
    fake = tmp_path / "nsys"
    fake.write_text(FAKE_NSYS.format(py=PY, repo=str(REPO)))
    fake.chmod(0o755)
    code = main(["capture", "nsys", "--nsys", str(fake), "-o", str(tmp_path / "r"), "--",
                 PY, "-c", "raise SystemExit(3)"])
    assert code == 1
    assert "SQLite export" in capsys.readouterr().out
