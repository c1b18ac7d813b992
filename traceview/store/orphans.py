"""Pool processes that leave with the command that started them, even when it is killed.

SIGTERM is handled (``cli._workers_stopped_on_sigterm``), but SIGKILL cannot be: without
this, the fork server and the workers it forked outlived a killed command, each holding the
caller's stdout and stderr open (a worker parsing a large file ran to the end of its task),
so whoever read them waited. Two guards, Linux first:

* a worker asks the kernel for SIGKILL when its parent, the fork server, exits
  (``PR_SET_PDEATHSIG``): a worker deep in the C scanner holding the GIL goes too;
* the fork server (its preload imports :mod:`traceview.store.fork_server`) watches its own
  parent, the command: once reparented, it exits, taking its workers with it. A worker
  spawned elsewhere (not Linux) watches the command the same way.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

#: prctl(2)'s option: the signal this process gets when its parent exits.
PR_SET_PDEATHSIG = 1
#: How often a watcher looks at its parent (a thread asleep in between: no CPU to speak of).
WATCH_EVERY_S = 0.2


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent exits; False where it cannot
    (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def leave_when_orphaned(parent: int | None = None) -> None:
    """A daemon thread that ends this process (no clean-up: its parent is gone, and nobody
    waits for what it would finish) once its parent ``parent`` (now's, by default) is
    gone: the process is then another's child."""
    watched = os.getppid() if parent is None else parent

    def watch() -> None:
        while os.getppid() == watched:
            time.sleep(WATCH_EVERY_S)
        os._exit(1)

    threading.Thread(target=watch, name="traceview-orphan-watch", daemon=True).start()


def guard_worker() -> None:
    """A pool worker's initializer: it leaves when the fork server (its parent) or, spawned,
    the command does."""
    if not die_with_parent():
        leave_when_orphaned()
    elif os.getppid() == 1:  # the parent was gone before the kernel was asked
        os._exit(1)
