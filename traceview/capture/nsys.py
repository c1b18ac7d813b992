"""Build, run and export Nsight Systems captures that traceview reads well.

:func:`nsys_command` builds the ``nsys profile`` command line: CUDA + NVTX tracing (OS runtime
optional), CUDA memory usage, a capture range driven by the CUDA profiler API
(``cudaProfilerStart/Stop``; ``traceview.capture.profile(..., cuda_profiler_api=True)`` calls
them around each active window), and one report per rank named with ``%q{RANK}``.

``%q{RANK}`` is expanded by the ``nsys`` process from *its own* environment. Wrapping a launcher
(``nsys profile torchrun ...``) would give one report for all ranks, named with an empty
``RANK``. So when the command starts with ``torchrun`` (or ``python -m torch.distributed.run``)
nsys is put *inside* the launcher: ``torchrun <launcher options> --no-python nsys profile ...
python script.py ...``, and every rank gets its own report. Under SLURM ``srun`` sets
``SLURM_PROCID``; pass ``--rank-var SLURM_PROCID``.

:func:`export_command` is ``nsys export --type sqlite``. Nothing here imports torch.

>>> nsys_command(["python", "train.py"], output_dir="runs/n1")[:4]
['nsys', 'profile', '--trace=cuda,nvtx', '--cuda-memory-usage=true']
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

#: torchrun options that take no value (every other ``--option`` takes one, or ``--opt=v``).
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module",
                   "--run-path", "--run_path", "--virtual-local-rank", "--virtual_local_rank",
                   "-h", "--help"}
_MODULE_FLAGS = {"-m", "--module"}
_NO_PYTHON = {"--no-python", "--no_python"}

REPORT_STEM = "rank"
CAPTURE_RANGES = ("cudaProfilerApi", "none")


def _is_torchrun(command: Sequence[str]) -> int:
    """Length of the launcher head: 1 for ``torchrun``, 3 for ``python -m torch.distributed.run``,
    0 when the command is not a torchrun launch."""
    if not command:
        return 0
    if Path(command[0]).name == "torchrun":
        return 1
    if (len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1] == "-m"
            and command[2] in ("torch.distributed.run", "torch.distributed.launch")):
        return 3
    return 0


def split_torchrun(command: Sequence[str]) -> tuple[list[str], list[str], bool, bool] | None:
    """``(launcher incl. its options, program and its args, module, no_python)`` or None.

    >>> split_torchrun(["torchrun", "--nproc_per_node", "2", "--standalone", "train.py", "-x"])
    (['torchrun', '--nproc_per_node', '2', '--standalone'], ['train.py', '-x'], False, False)
    """
    head = _is_torchrun(command)
    if not head:
        return None
    i = head
    module = no_python = False
    while i < len(command):
        arg = command[i]
        if not arg.startswith("-"):
            break
        if arg == "--":
            i += 1
            break
        module |= arg in _MODULE_FLAGS
        no_python |= arg in _NO_PYTHON
        i += 1 if ("=" in arg or arg in _TORCHRUN_FLAGS) else 2
    return list(command[:i]), list(command[i:]), module, no_python


def nsys_command(command: Sequence[str], *, output_dir: str | os.PathLike[str],
                 nsys: str = "nsys", osrt: bool = False, cuda_memory_usage: bool = True,
                 capture_range: str = "cudaProfilerApi", rank_var: str = "RANK",
                 python: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command to run (see the module docstring). ``command`` is the user's command."""
    if not command:
        raise ValueError("no command to profile")
    if capture_range not in CAPTURE_RANGES:
        raise ValueError(f"capture range must be one of {CAPTURE_RANGES}, got {capture_range!r}")
    trace = "cuda,nvtx" + (",osrt" if osrt else "")
    output = str(Path(output_dir) / f"{REPORT_STEM}%q{{{rank_var}}}")
    profile = [nsys, "profile", f"--trace={trace}",
               f"--cuda-memory-usage={'true' if cuda_memory_usage else 'false'}"]
    if capture_range != "none":
        profile += [f"--capture-range={capture_range}", "--capture-range-end=stop"]
    profile += ["--force-overwrite=true", f"--output={output}", *extra]
    split = split_torchrun(command)
    if split is None:
        return profile + list(command)
    launcher, program, module, no_python = split
    if not program:
        raise ValueError("torchrun command has no training script")
    if no_python:
        return launcher + profile + program
    py = python or sys.executable or "python"
    body = [py, "-m", *program] if module else [py, *program]
    head = _is_torchrun(command)
    launcher = launcher[:head] + [a for a in launcher[head:] if a not in _MODULE_FLAGS]
    return launcher + ["--no-python"] + profile + body


def export_command(report: str | os.PathLike[str], *, nsys: str = "nsys") -> list[str]:
    """``nsys export --type sqlite`` of one report, next to it (``.sqlite``)."""
    rep = Path(report)
    return [nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
            "--output", str(rep.with_suffix(".sqlite")), str(rep)]


def find_nsys(nsys: str = "nsys") -> str | None:
    """Path of the nsys executable, or None."""
    return shutil.which(nsys)


NOT_INSTALLED = ("nsys (Nsight Systems) is not installed or not on PATH: install the Nsight "
                 "Systems CLI (it ships with the CUDA toolkit, or as the nsight-systems-cli "
                 "package), or pass --nsys /path/to/nsys")
