"""Writing files safely: never over an input, always whole, and no litter after a killed run.

* :func:`refuse_input_overlap`: an output path (``-o``, ``--junit``, a store folder) that is one
  of the inputs, or lies inside an input folder, is a usage error: the README promises that
  input files are never modified, whatever a command line says.
* :func:`atomic_write`: the bytes go to a temporary name beside the target, then ``os.replace``
  puts them in place, so a reader sees the old file or the new one, never half of one.
* The temporary's name carries the writer's process id (``.NAME.PID.XXXXXXXX.tmp``), so a
  later run can tell a temporary whose writer was killed (that process is gone) from one being
  written right now by a concurrent run, and remove only the former
  (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from traceview.errors import UsageError

#: A temporary older than this is stale even if a process with its writer's id is alive (the id
#: was reused, or the writer runs on another host sharing the folder and is long gone).
STALE_AFTER_S = 24 * 3600


def refuse_input_overlap(target: str | Path, inputs: Iterable[str | Path], *,
                         option: str = "-o") -> None:
    """Raise :class:`UsageError` when writing ``target`` could modify an input: ``target`` is
    an input file (by path, symlink or hard link), or lies in (or is) an input folder."""
    out = Path(target).expanduser().resolve()
    for raw in inputs:
        path = Path(raw).expanduser()
        if not path.exists():
            continue
        source = path.resolve()
        if path.is_dir():
            if out == source or out.is_relative_to(source):
                raise UsageError(f"{option} {target}: inside the input folder {raw}; inputs "
                                 "are never modified: write the output elsewhere")
        elif out == source or (out.exists() and _same_file(out, source)):
            raise UsageError(f"{option} {target}: is the input file {raw}; inputs are never "
                             "overwritten: write the output elsewhere")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_file_target(target: str | Path, *, option: str = "-o") -> Path:
    """``target`` as a file to write: its folder must exist and it must not be a folder."""
    path = Path(target).expanduser()
    if path.is_dir():
        raise UsageError(f"{option} {target}: is a folder; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{option} {target}: folder {parent} does not exist")
    return path


def check_folder_target(target: str | Path, *, option: str = "-o") -> Path:
    """``target`` as a folder to write into: it may exist (as a folder) or not (yet)."""
    path = Path(target).expanduser()
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {target}: is a file, not a folder; give a folder to "
                         "write the store into")
    return path


#: Folders whose stale temporaries this process has removed (``atomic_write``).
_CLEANED: set[str] = set()


def atomic_write(target: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary path beside ``target``, then rename it into place.
    Temporaries of ``target`` left by killed writers are removed first."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # Once per folder and process: listing the folder for every write was quadratic in
        # its files (the cache's ids/ folder holds one file per input: 5,000 inputs listed
        # it 5,000 times; docs/performance.md, log entry 36). A writer killed since then
        # leaves a temporary that the next process removes.
        folder = str(target.parent)
        if folder not in _CLEANED:
            remove_stale_temporaries(target.parent)
            _CLEANED.add(folder)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.",
                                   suffix=".tmp")
    except OSError as exc:  # name what was to be written, not the temporary
        raise OSError(exc.errno, f"cannot write here ({exc.strerror})", str(target)) from None
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~current_umask())  # as open() would: mkstemp made it 0600
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """The process's umask, read without changing it where the system tells (Linux's
    /proc/self/status); else by setting and restoring it, which another thread creating a
    file at that instant could see."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # the strictest value while it is read back
    os.umask(mask)
    return mask


def write_text(target: str | Path, text: str) -> None:
    """``text`` (UTF-8) to ``target``, atomically."""
    atomic_write(Path(target), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def remove_stale_temporaries(folder: Path, name: str | None = None) -> list[Path]:
    """Remove the temporaries in ``folder`` (of the file ``name``, or of any) whose writer is
    gone: a killed run's leftovers. Those of live writers are kept. Returns what was removed."""
    removed = []
    try:
        candidates = list(folder.glob(f".{name}.*.tmp" if name else ".*.tmp"))
    except OSError:
        return removed
    for tmp in candidates:
        if _writer_alive(tmp):
            continue
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass  # gone already (a concurrent run cleaned it) or not ours to remove
    return removed


def _writer_alive(tmp: Path) -> bool:
    """Is the process that named ``tmp`` (``.NAME.PID.XXXXXXXX.tmp``) still running? A name
    without a process id is judged by its age alone."""
    try:
        age = time.time() - tmp.stat().st_mtime
    except OSError:
        return True  # gone already
    if age > STALE_AFTER_S:
        return False
    parts = tmp.name[:-len(".tmp")].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return age < 3600  # an older writer's name: an hour is long enough for any write
    return process_alive(int(parts[1]))


def process_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` runs on this host."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, owned by someone else
    return True
