"""Run one measured operation in its own child process; wall time and peak RSS.

Peak RSS is taken two ways and both are kept:

* ``peak_rss_mb``: the largest resident set of any single process of the operation
  (``getrusage`` of the child for itself and for its waited-for descendants: ingest workers);
* ``tree_rss_mb``: the largest *sum* of resident sets over the child and all its descendants,
  sampled every 20 ms with psutil (what the machine must hold at once when workers run in
  parallel; shared pages count once per process, so this is an upper bound).

The child prints one JSON object as its last stdout line; its in-process timings (``wall_s``)
exclude interpreter start-up and imports, which ``outer_s`` includes.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]


def _sample_tree(pid: int, stop: threading.Event, out: dict[str, float]) -> None:
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    cpu: dict[int, float] = {}  # pid -> its CPU seconds when last seen
    while not stop.is_set():
        total = 0
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                total += p.memory_info().rss
                times = p.cpu_times()
                cpu[p.pid] = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        out["tree"] = max(out.get("tree", 0), total)
        out["procs"] = max(out.get("procs", 0), len(procs))
        out["cpu"] = sum(cpu.values())
        stop.wait(0.02)


def run_child(argv: list[str], *, timeout: float = 1800, env: dict[str, str] | None = None,
              parse=None, cores: int | None = None) -> dict[str, Any]:
    """Run ``argv``; return its JSON result plus outer wall time and both peak RSS figures.
    ``cores``: pin the child (and so its threads and workers) to the first N cores, as a
    machine with N cores would run it (Polars and ``os.sched_getaffinity`` both follow it)."""
    pinned = None
    if cores is not None:
        allowed = sorted(os.sched_getaffinity(0))[:cores]
        pinned = lambda: os.sched_setaffinity(0, allowed)  # noqa: E731
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=pinned)
    stop, sampled = threading.Event(), {}
    sampler = threading.Thread(target=_sample_tree, args=(proc.pid, stop, sampled), daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f"\n(killed after {timeout} s)"
    stop.set()
    sampler.join()
    outer = time.perf_counter() - t
    result: dict[str, Any]
    try:
        result = parse(stdout) if parse else _last_json(stdout)
    except Exception as exc:  # noqa: BLE001 - a failed measurement is recorded, not raised
        result = {"error": f"no result ({type(exc).__name__})"}
    if proc.returncode != 0 and not result.get("error"):
        result["error"] = f"exit {proc.returncode}: {stderr.strip().splitlines()[-1:] }"
    if result.get("error"):
        result["stderr_tail"] = stderr[-1500:]
    if result.get("modules_loaded"):  # imports timed as work: add them to ops._LAZY_MODULES
        print(f"note: {' '.join(argv[2:3])} loaded {result['modules_loaded']} module(s) "
              "inside its clock", file=sys.stderr)
    result["outer_s"] = outer
    result["tree_rss_mb"] = sampled.get("tree", 0) / 2**20
    result["most_processes"] = sampled.get("procs", 0)
    result["tree_cpu_s"] = sampled.get("cpu", 0.0)
    return result


def _last_json(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line")


def op(name: str, **kwargs: Any) -> list[str]:
    """The command line of one ``benchmarks/ops.py`` operation."""
    return [sys.executable, str(REPO / "benchmarks" / "ops.py"), name, json.dumps(kwargs)]


def measure(name: str, *, cores: int | None = None, **kwargs: Any) -> dict[str, Any]:
    return run_child(op(name, **kwargs), cores=cores)


def compiled_checkout() -> None:
    """Compile the checkout's ``traceview`` to bytecode (``__pycache__``, ignored by git), as
    ``pip install`` does for a user's copy. Without it, a process started with
    PYTHONDONTWRITEBYTECODE=1 (as the project's sessions are) compiles every traceview module
    it imports from source, every time: +0.03-0.05 CPU s on each whole command (log 54)."""
    import compileall

    compileall.compile_dir(str(REPO / "traceview"), quiet=1)


def measure_command(argv: list[str], *, remove: list[str] | None = None,
                    env: dict[str, str] | None = None, keep_output: bool = False
                    ) -> dict[str, Any]:
    """A whole ``traceview`` command as a user runs it: ``python -m traceview ARGV`` in a
    fresh process, interpreter start, imports and the printed report included (issue 25: the
    bars are on what a user waits for). ``wall_s`` is the process's whole life, ``cpu_s`` the
    user + system time of it and every process it waited for (this process's
    ``RUSAGE_CHILDREN`` before and after: the harness runs one measurement at a time);
    ``tree_rss_mb`` as ``run_child``'s. ``remove``: folders removed first (an ``-o DIR`` of an
    earlier round, which the command would refuse); ``keep_output``: its stdout as
    ``output`` (to compare two runs' answers)."""
    for folder in remove or ():
        shutil.rmtree(folder, ignore_errors=True)
    compiled_checkout()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_child([sys.executable, "-m", "traceview", *argv], env=env,
                       parse=lambda out: {"output_bytes": len(out),
                                          **({"output": out} if keep_output else {})})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["wall_s"] = result["outer_s"]
    # the children it waited for, or (more, when its workers were children of a fork server
    # that exits unwaited) the sum of every process of its tree as last sampled
    result["cpu_s"] = max((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
                          result["tree_cpu_s"])
    result["peak_rss_mb"] = result["tree_rss_mb"]
    result["whole_command"] = True
    return result
