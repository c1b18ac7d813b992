"""How much memory this process may still take: the machine's (``MemAvailable``) and its
control group's (a container's or a job's memory limit, which ``MemAvailable`` does not see:
a gzip bomb sized against the machine's free memory was killed by the container's limit)."""

from __future__ import annotations

from pathlib import Path

#: The root the kernel's files are read under (a test points it at a folder of its own).
ROOT = Path("/")

#: Limits at or above this are "no limit" (cgroup v1 writes 2^63 rounded to a page).
_NO_LIMIT = 1 << 60


def available_memory() -> int | None:
    """Bytes this process may still allocate: the least of ``MemAvailable`` and, for each
    memory control group it is in (v2 ``memory.max`` less ``memory.current``, v1
    ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``; its own and its ancestors'),
    what is left under its limit. None when none of them can be read."""
    found = [m for m in (_meminfo_available(), *_cgroup_room()) if m is not None]
    return min(found) if found else None


def _meminfo_available() -> int | None:
    try:
        with open(ROOT / "proc" / "meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> list[int]:
    """What is left under each memory limit of this process's control groups."""
    base = ROOT / "sys" / "fs" / "cgroup"
    folders = [(base, "memory.max", "memory.current"),  # v2, a container's own view
               (base / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes")]  # v1
    try:
        lines = (ROOT / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1].split(","), Path(parts[2].lstrip("/"))
        chain = [path, *path.parents]  # its own group and every one above it
        if parts[0] == "0" and parts[1] == "":
            folders += [(base / p, "memory.max", "memory.current") for p in chain]
        elif "memory" in controllers:
            folders += [(base / "memory" / p, "memory.limit_in_bytes",
                         "memory.usage_in_bytes") for p in chain]
    room = []
    for folder, limit_name, usage_name in dict.fromkeys(folders):
        limit, usage = _number(folder / limit_name), _number(folder / usage_name)
        if limit is not None and limit < _NO_LIMIT:
            room.append(max(0, limit - (usage or 0)))
    return room


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit
