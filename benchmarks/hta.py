"""HTA 0.5.0 side by side: its own virtual environment, and a timed load + analyses in it.

The environment is created on first use (``python -m venv`` then
``pip install HolisticTraceAnalysis==0.5.0 "pandas<3"``: under pandas 3 HTA 0.5.0 fails to load
some real traces, see shared/reference/hta-baseline.md). ``--hta-python`` reuses an existing one.
HTA runs in a child process of that interpreter with the script below; every analysis call is
timed on its own and an exception is recorded (type and message), never raised.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

HTA_REQUIREMENTS = ["HolisticTraceAnalysis==0.5.0", "pandas<3"]

# Runs inside the HTA venv: argv = trace_dir; prints one JSON object on the last line of stdout.
HTA_SCRIPT = r'''
import gc, json, sys, time, traceback, resource, logging
logging.disable(logging.WARNING)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
out = {"load_s": None, "analyses": {}, "error": None}
t0 = time.perf_counter()
try:
    from hta.trace_analysis import TraceAnalysis
    out["import_s"] = time.perf_counter() - t0
    t, c = time.perf_counter(), cpu()
    analyzer = TraceAnalysis(trace_dir=sys.argv[1])
    out["load_s"] = time.perf_counter() - t
    out["load_cpu_s"] = cpu() - c
    ranks = list(analyzer.t.traces.keys())
    out["ranks"] = len(ranks)
    out["events"] = int(sum(len(df) for df in analyzer.t.traces.values()))
    calls = [
        ("temporal_breakdown", lambda: analyzer.get_temporal_breakdown(visualize=False)),
        ("idle_time_breakdown", lambda: analyzer.get_idle_time_breakdown(ranks=ranks, visualize=False)),
        ("comm_comp_overlap", lambda: analyzer.get_comm_comp_overlap(visualize=False)),
        ("gpu_kernel_breakdown", lambda: analyzer.get_gpu_kernel_breakdown(visualize=False)),
        ("queue_length_summary", lambda: analyzer.get_queue_length_summary(ranks=ranks)),
        ("cuda_kernel_launch_stats", lambda: analyzer.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)),
        ("memory_bw_summary", lambda: analyzer.get_memory_bw_summary(ranks=ranks)),
    ]
    if len(ranks) > 1:
        calls.append(("potential_stragglers", lambda: analyzer.get_potential_stragglers(visualize=False)))
    for name, call in calls:
        t = time.perf_counter()
        try:
            call()
            out["analyses"][name] = {"s": time.perf_counter() - t, "error": None}
        except Exception as exc:
            out["analyses"][name] = {"s": time.perf_counter() - t,
                                     "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    out["traceback"] = traceback.format_exc()[-1500:]
out["total_s"] = time.perf_counter() - t0
print(json.dumps(out))
'''


def ensure_venv(venv_dir: Path, python: str | None = None, log=print) -> Path:
    """The interpreter of an environment with HTA 0.5.0 in it; created when missing."""
    if python:
        return Path(python)
    exe = venv_dir / "bin" / "python"
    if exe.exists() and _has_hta(exe):
        return exe
    log(f"creating the HTA environment in {venv_dir} (pip install {' '.join(HTA_REQUIREMENTS)})")
    venv.EnvBuilder(with_pip=True, clear=True).create(venv_dir)
    subprocess.run([str(exe), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *HTA_REQUIREMENTS], check=True)
    if not _has_hta(exe):
        raise RuntimeError(f"HTA did not install into {venv_dir}")
    return exe


def _has_hta(exe: Path) -> bool:
    probe = subprocess.run([str(exe), "-c", "import hta, importlib.metadata as m; "
                            "print(m.version('HolisticTraceAnalysis'), m.version('pandas'))"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.startswith("0.5.0")


def versions(exe: Path) -> str:
    probe = subprocess.run([str(exe), "-c", "import importlib.metadata as m, sys; print("
                            "'HTA', m.version('HolisticTraceAnalysis'), 'pandas', m.version('pandas'),"
                            " 'python', sys.version.split()[0])"], capture_output=True, text=True)
    return probe.stdout.strip() or probe.stderr.strip()[-200:]


def trace_dir_for(paths: list[Path], work: Path) -> Path:
    """HTA reads a folder: one of symlinks to exactly these files."""
    folder = Path(tempfile.mkdtemp(prefix="hta-input-", dir=work))
    for p in paths:
        (folder / p.name).symlink_to(p.resolve())
    return folder


def command(exe: Path, trace_dir: Path) -> list[str]:
    return [str(exe), "-c", HTA_SCRIPT, str(trace_dir)]


def parse_output(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": "no result printed", "analyses": {}}


if __name__ == "__main__":  # python benchmarks/hta.py VENV_DIR: create the environment only
    print(ensure_venv(Path(sys.argv[1])))
