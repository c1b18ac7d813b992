"""What the numbers were measured on: CPU, cores, RAM, Python, package versions, load."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

PACKAGES = ("traceview", "polars", "pyarrow", "msgspec", "orjson", "isal", "numpy", "psutil")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def git_state(repo: str) -> str:
    """The commit measured, and whether the working tree differs from it (code only)."""
    import subprocess

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
        return out.stdout.strip()

    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "traceview", "parsers",
                "analyses")
    return head + (" (with uncommitted changes in traceview/parsers/analyses)" if dirty else "")


def describe() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        from traceview.parsers.kineto import _scan  # noqa: F401
        c_path = True
    except ImportError:
        c_path = False
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_gb": round(ram_bytes() / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "packages": versions,
        "kineto_c_fast_path": c_path,
    }
