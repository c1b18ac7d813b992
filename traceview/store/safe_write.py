"""Writing files safely: never over an input, always whole, and no litter after a killed run.

* :func:`refuse_input_overlap`: an output path (``-o``, ``--junit``, a store folder) that is one
  of the inputs, or lies inside an input folder, is a usage error: the README promises that
  input files are never modified, whatever a command line says.
* :func:`atomic_write`: the bytes go to a temporary name beside the target, then ``os.replace``
  puts them in place, so a reader sees the old file or the new one, never half of one. A write
  that fails (a full disk, a file size limit) is an ``OSError`` naming the target, never the
  temporary, and leaves the target as it was.
* :func:`write_folder`: a folder's files written beside it first (a store over an old one):
  they replace the old ones only once every one is complete.
* A temporary's name says that traceview wrote it, on which host and by which process:
  ``.NAME.traceview-HHHHHHHH-PID-TOKEN.tmp`` (:func:`temporary_name`). Only such names are
  ever removed (:func:`remove_stale_temporaries`), and only when their writer is gone: a
  user's ``.notes.tmp`` beside an output, or in a folder traceview writes into, is never ours
  to delete. Sweeps run where traceview writes: a target's own temporaries before it is written
  again; any of ours in the cache's folders and in a store folder being written; never in a
  folder that is only read.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from traceview.errors import UsageError

#: A temporary older than this is stale even if a process with its writer's id is alive (the id
#: was reused), or when it was written on another host sharing the folder (its process cannot be
#: asked about).
STALE_AFTER_S = 24 * 3600

#: This host, as the 8 hex digits temporaries carry (a host name may hold any character).
HOST = hashlib.blake2s(socket.gethostname().encode(errors="surrogateescape"),
                       digest_size=4).hexdigest()

#: The most of a file's name its temporaries keep: with the mark, within a 255-byte name.
_LONGEST = 160

_TEMPORARY = re.compile(
    r"^\.(?P<name>.+)\.traceview-(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})-[0-9a-f]{16}\.tmp$",
    re.DOTALL)


def temporary_name(name: str, *, pid: int | None = None, host: str = HOST) -> str:
    """The name of a fresh temporary for the file ``name``: marked as traceview's, with the
    writer's host and process id and a random token (two writers never share one)."""
    return (f".{name[:_LONGEST]}.traceview-{host}-{os.getpid() if pid is None else pid}-"
            f"{secrets.token_hex(8)}.tmp")


def is_ours(path: Path, name: str | None = None) -> bool:
    """Whether ``path`` is named as a temporary of traceview's (of the file ``name``, or of any)."""
    found = _TEMPORARY.match(path.name)
    return bool(found) and (name is None or found["name"] == name[:_LONGEST])


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
            if out == source or out.is_relative_to(source) or _linked_into(out, source):
                raise UsageError(f"{option} {target}: inside the input folder {raw}; inputs "
                                 "are never modified: write the output elsewhere")
        elif out == source or (out.exists() and _same_file(out, source)):
            raise UsageError(f"{option} {target}: is the input file {raw}; inputs are never "
                             "overwritten: write the output elsewhere")


#: The most entries of an input folder looked through for a hard link of an output.
_MOST_LINK_ENTRIES = 100_000


def _linked_into(out: Path, folder: Path) -> bool:
    """Whether the existing file ``out`` is a hard link of a file inside ``folder`` (writing
    it in place, as a device or pipe is, would change that input; a rename would not, but
    the README promises no input is touched at all). Only files with more than one link
    are looked for, among the folder's first entries (``_MOST_LINK_ENTRIES``)."""
    try:
        st = out.stat()
    except OSError:
        return False
    if st.st_nlink < 2 or not stat.S_ISREG(st.st_mode):
        return False
    seen = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            seen += 1
            if seen > _MOST_LINK_ENTRIES:
                return False
            try:
                found = os.stat(os.path.join(parent, name))
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (st.st_dev, st.st_ino):
                return True
    return False


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


#: The temporaries in each folder ``atomic_write`` has written into, as this process first
#: listed it, by the name of the file they were for.
_LISTED: dict[str, dict[str, list[Path]]] = {}


def atomic_write(target: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary path beside ``target``, then rename it into place.
    Temporaries of ``target`` left by killed writers are removed first. A failure to write
    (a full disk, a size limit, a read-only folder) is an ``OSError`` naming ``target``."""
    target = Path(target)
    descriptor = open_descriptor(target)
    if descriptor is not None:
        _write_through(descriptor, target, write)
        return
    if _is_device_or_pipe(target):
        _write_in_place(target, write)
        return
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        # The folder is listed once per process: listing it for every write was quadratic
        # in its files (the cache's ids/ folder holds one file per input: 5,000 inputs listed
        # it 5,000 times; docs/performance.md, log entry 36). A writer killed since then
        # leaves a temporary that the next process removes.
        # Each write looks only at its own file's temporaries: going through the whole listing
        # each time was quadratic again (a reopen of 5,000 cached files: 25 M name checks,
        # ~45 s; docs/performance.md, log 45).
        folder = str(target.parent)
        if folder not in _LISTED:
            _LISTED[folder] = temporaries_by_name(_entries(target.parent))
        remove_stale_temporaries(target.parent, target.name,
                                 listing=_LISTED[folder].get(target.name[:_LONGEST], []))
        tmp = _new_temporary(target.parent, target.name)
        write(tmp)
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise _naming(exc, target) from None


def _is_device_or_pipe(target: Path) -> bool:
    """Whether ``target`` exists as something other than a file or folder: a device, a FIFO,
    ``/dev/stdout``. Renaming a temporary over it would replace the device node with a file
    (root may write in /dev), so such a target is written in place."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


#: Paths naming one of this process's open descriptors (what /dev/stdout links to).
_DESCRIPTOR_PATH = re.compile(r"^/(?:dev|proc/self|proc/(?P<pid>[0-9]+))/fd/(?P<fd>[0-9]+)$")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def open_descriptor(target: Path) -> int | None:
    """The descriptor of this process that ``target`` names, through any symlinks:
    ``/dev/stdout`` (1), ``/dev/stderr`` (2), ``/dev/fd/N``, ``/proc/self/fd/N``, or a link
    to one; else None. Such a path is the descriptor, not a file: with stdout redirected to
    a file it stats as that regular file, and renaming a temporary over it would replace the
    ``/dev/stdout`` link itself (root may write in /dev) and lose the output."""
    path = os.path.abspath(target)
    for _ in range(40):  # the kernel's own limit on links followed
        if path in _STANDARD:
            return _STANDARD[path]
        found = _DESCRIPTOR_PATH.match(path)
        if found and found["pid"] in (None, str(os.getpid())):
            return int(found["fd"])
        try:
            link = os.readlink(path)
        except OSError:  # not a link (or gone): not a descriptor
            return None
        path = os.path.normpath(os.path.join(os.path.dirname(path), link))
    return None


def _write_through(descriptor: int, target: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a private temporary, then its bytes appended to the open
    ``descriptor`` (after what the process printed there already), as a shell redirection
    expects; a failure (``EBADF``: not open, a full disk) names ``target``."""
    import sys
    import tempfile

    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None and _fileno(stream) == descriptor:
                stream.flush()
        with tempfile.TemporaryDirectory(prefix="traceview-out-") as folder:
            tmp = Path(folder) / target.name
            write(tmp)
            with open(tmp, "rb") as source:
                while chunk := source.read(1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(descriptor, view):]
    except BaseException as exc:
        raise _naming(exc, target) from None


def _fileno(stream: object) -> int | None:
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None


def _write_in_place(target: Path, write: Callable[[Path], None]) -> None:
    """``write(target)`` straight into a device or pipe; its failure (``/dev/full``) names it."""
    try:
        write(target)
    except BaseException as exc:
        raise _naming(exc, target) from None


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


def write_folder(folder: Path, write: Callable[[Path], Sequence[str]]) -> None:
    """Files into ``folder`` all or nothing: ``write(stage)`` writes them into a temporary
    folder inside ``folder`` and returns their names, in the order they are to be put in place
    (the one that makes the folder valid last: a store's manifest); only then is each renamed
    over its old version. A failure leaves ``folder``'s files as they were, and names the file
    of ``folder`` that could not be written."""
    folder.mkdir(parents=True, exist_ok=True)
    stage = None
    try:
        stage = _new_temporary(folder, folder.name, make=os.mkdir)
        names = write(stage)
        for name in names:
            os.replace(stage / name, folder / name)
        # a rename onto a hard link of the same file leaves both names: the stage may not be empty
        shutil.rmtree(stage, ignore_errors=True)
    except BaseException as exc:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise _naming(exc, _in_folder(exc, stage, folder)) from None


def _in_folder(exc: BaseException, stage: Path | None, folder: Path) -> Path:
    """The file of ``folder`` that ``exc`` failed to write in ``stage`` (a copy names its
    source first, its target second), else ``folder``."""
    names = (getattr(exc, "filename2", None), getattr(exc, "filename", None))
    for name in names:
        if stage is not None and name and Path(name).is_relative_to(stage):
            return folder / Path(name).relative_to(stage)
    return folder


@contextmanager
def made_folder(folder: Path) -> Iterator[Path]:
    """``folder`` made (with any missing parents) for the ``with`` block; when the block
    fails (an error, a full disk, Ctrl-C, SIGTERM), the folders it made are removed again
    while empty: an interrupted ``ingest -o NEW`` leaves no empty store behind."""
    made = []
    for path in (folder, *folder.parents):
        if path.exists() or path.is_symlink():
            break
        made.append(path)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for path in made:  # deepest first
            try:
                path.rmdir()
            except OSError:
                break  # not empty (or not ours to remove): left as it is
        raise


def private_folder(parent: Path, name: str) -> Path:
    """A new folder only this user may read, named as a temporary of ``name`` in ``parent``
    (so that :func:`remove_stale_temporaries` may remove it once this process is gone)."""
    return _new_temporary(parent, name, make=lambda p: os.mkdir(p, 0o700))


def _new_temporary(folder: Path, name: str, make: Callable[[Path], None] | None = None) -> Path:
    """A temporary file (or, with ``make``, folder) of ``name`` in ``folder``, created now."""
    while True:
        path = folder / temporary_name(name)
        try:
            if make is None:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            else:
                make(path)
            return path
        except FileExistsError:
            continue  # 64 random bits taken: try another


#: How Polars and Arrow spell an operating system error inside their own messages.
_ERRNO_IN_TEXT = re.compile(r"(?:os error |\[errno )(\d+)", re.IGNORECASE)


def _naming(exc: BaseException, target: Path) -> BaseException:
    """``exc`` as an ``OSError`` that names ``target`` when it was a failure to write (an
    ``OSError``, or a library's error carrying one), else ``exc`` itself."""
    errno = exc.errno if isinstance(exc, OSError) else None
    if errno is None and isinstance(exc, Exception):
        found = _ERRNO_IN_TEXT.search(str(exc))
        errno = int(found.group(1)) if found else None
    if errno is None and not isinstance(exc, OSError):
        return exc
    reason = os.strerror(errno) if errno else (str(exc).splitlines() or [type(exc).__name__])[0]
    return OSError(errno, f"cannot write ({reason})", str(target))


def _entries(folder: Path) -> list[Path]:
    try:
        return [Path(entry.path) for entry in os.scandir(folder)]
    except OSError:
        return []


def temporaries_by_name(entries: Iterable[Path]) -> dict[str, list[Path]]:
    """traceview's temporaries among ``entries``, by the name of the file each was for (cut
    as :func:`temporary_name` cuts it).

    >>> temporaries_by_name([Path("/d/a.json"), Path("/d/.a.json.traceview-0a1b2c3d-7-"
    ...                                           "0123456789abcdef.tmp")])
    {'a.json': [PosixPath('/d/.a.json.traceview-0a1b2c3d-7-0123456789abcdef.tmp')]}
    """
    found: dict[str, list[Path]] = {}
    for path in entries:
        if (match := _TEMPORARY.match(path.name)) is not None:
            found.setdefault(match["name"], []).append(path)
    return found


def remove_stale_temporaries(folder: Path, name: str | None = None, *,
                             listing: list[Path] | None = None) -> list[Path]:
    """Remove traceview's temporaries in ``folder`` (of the file ``name``, or of any) whose
    writer is gone: a killed run's leftovers. Files not named by :func:`temporary_name` are
    never touched, nor are the temporaries of live writers. ``listing``: the folder's entries
    as listed earlier (else it is listed now). Returns what was removed."""
    removed = []
    candidates = _entries(folder) if listing is None else listing
    for tmp in candidates:
        if not is_ours(tmp, name) or _writer_alive(tmp):
            continue
        try:
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass  # gone already (a concurrent run cleaned it) or not ours to remove
    return removed


def _writer_alive(tmp: Path) -> bool:
    """Could the process that named ``tmp`` still be writing it? Yes while a process with its
    id runs on this host; a writer on another host, for a day."""
    try:
        age = time.time() - tmp.lstat().st_mtime
    except OSError:
        return True  # gone already
    found = _TEMPORARY.match(tmp.name)
    if found is None or age > STALE_AFTER_S:
        return found is None
    return found["host"] != HOST or process_alive(int(found["pid"]))


def process_alive(pid: int) -> bool:
    """Whether a process with id ``pid`` runs on this host."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False  # no such process (or an id no process can have)
    except OSError:
        return True  # exists, owned by someone else
    return True
