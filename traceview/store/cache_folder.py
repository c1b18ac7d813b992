"""Where the cache folder is, when a file's identity on disk stands for its bytes, and what
names the code that computed what the cache keeps.

Polars-free, so that a command line whose answer was kept (``traceview.cli._answers``) is
answered without importing the libraries that computed it.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import orjson
import xxhash

from traceview import __version__

#: A file modified this recently is hashed every time: within one timestamp tick it could change
#: again without its size, mtime or ctime changing (git calls this the "racy" case).
SETTLED_NS = 2_000_000_000


def default_cache_dir() -> Path:
    """``$TRACEVIEW_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceview``, else ``~/.cache/traceview``."""
    explicit = os.environ.get("TRACEVIEW_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "traceview"


def identity(st: os.stat_result) -> tuple[int, ...]:
    """A file's identity on disk: device, inode, size, mtime and ctime in ns (as git's index
    and ccache have it). Any write changes the ctime, which no tool can set back."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def is_settled(st: os.stat_result) -> bool:
    """Whether a file of this identity was last written long enough ago that any later write
    shows in its identity (mtime and ctime tick past it)."""
    return time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLED_NS


def untrusted(st: os.stat_result) -> str | None:
    """Why a file of the cache folder (a kept answer, a cache entry, a derived table, a
    remembered content id) must not be believed, or None: in a folder other users can
    write to (a shared cache, /tmp), another user could plant an answer or an events file
    under a name a command would look up. So only the user's own files are read (root's
    own as well), and none that others may write: writable by every user, or by a group
    other than the user's own (user-private groups are the usual umask 002 setup)."""
    me = os.geteuid()
    if st.st_uid != me:
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != os.getegid()):
        return "writable by other users"
    return None


def untrusted_files(*paths: Path) -> tuple[Path, str] | None:
    """The first of ``paths`` that must not be believed (:func:`untrusted`) and why; None
    when every one that exists is the user's own (a missing one is the caller's to find)."""
    for path in paths:
        try:
            problem = untrusted(os.stat(path))
        except OSError:
            continue
        if problem:
            return path, problem
    return None


def same_identity(a: os.stat_result, b: os.stat_result) -> bool:
    """Whether two stats of a file are of the same bytes: any write between them changes one."""
    return identity(a) == identity(b)


@functools.cache
def code_identity() -> str:
    """A hash naming the code that computes what the cache keeps (derived tables, answers):
    traceview's version and the identity of each of its source files and compiled modules
    (a checkout's version stays the same across edits), every folder on ``sys.path`` but the
    working folder (installing, upgrading or removing a library changes its folder's
    entries), and the Python. ~250 stats, ~3 ms, once per process."""
    package = Path(__file__).resolve().parents[1]  # traceview/
    digest = xxhash.xxh3_128()
    digest.update(orjson.dumps([__version__, sys.version, sys.executable]))
    for folder, _dirs, files in sorted(os.walk(package, followlinks=True)):
        for name in sorted(files):
            if name.endswith((".py", ".so", ".pyd")):
                try:
                    st = os.stat(os.path.join(folder, name))
                except OSError:  # gone meanwhile (an install under way): named as missing
                    st = None
                digest.update(orjson.dumps([folder, name, st and (st.st_size, st.st_mtime_ns)]))
    cwd = os.path.realpath(".")
    for entry in sys.path:
        # Not the working folder (`python -m` puts it first): every file a user writes there
        # would change it, and no library is installed into it.
        if not entry or os.path.realpath(entry) == cwd:
            continue
        try:
            st = os.stat(entry)
        except OSError:
            continue
        digest.update(orjson.dumps([entry, st.st_ino, st.st_mtime_ns]))
    return digest.hexdigest()
