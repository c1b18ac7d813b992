"""Out of memory under an address-space limit (``ulimit -v``): one line, exit 2.

Under a small ``ulimit -v`` a command fails wherever the next allocation happens to be:
Python's ``MemoryError`` in an import, a library's import error worded as anything ("failed
to map segment", "can't start new thread"), or an allocation in Polars' Rust code, which
aborts the process after printing its own lines (jemalloc's, thousands of them). Exit 1 (a
CI gate reads it as a regression), a traceback, or SIGABRT is no answer.

So, only while such a limit is set (``RLIMIT_AS`` finite), the program runs the command in a
child process under the same limit and watches it (:func:`supervised`): its stdout goes
straight through; its stderr is kept and passed on whole when it ends on its own, or
replaced by one line (:func:`out_of_memory_line`) when it died of a signal or said that
memory ran out. Without a limit nothing changes (no child, no cost). A ``MemoryError`` or
an import that failed for memory inside one process is the same line
(:func:`is_out_of_memory`).
"""

from __future__ import annotations

import os
import resource
import signal
import sys
from pathlib import Path

#: Set in the supervised child: it runs the command itself.
CHILD = "TRACEVIEW_SUPERVISED_CHILD"

#: What a process says when memory ran out, in Python, glibc, jemalloc and Rust's words.
_SAID = ("MemoryError", "Cannot allocate memory", "cannot allocate memory", "out of memory",
         "memory allocation of", "<jemalloc>", "failed to map segment",
         "can't start new thread", "can't spawn worker thread", "std::bad_alloc",
         "Memory allocation",  # OpenBLAS, which then exits 1
         # a traceback is never this program's answer: under a limit, memory ran out
         "Traceback (most recent call last)")


def address_space_limit() -> int | None:
    """The soft ``RLIMIT_AS`` in bytes, None when there is none."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, AttributeError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is memory running out (an import's failure included) rather than a
    bug: a ``MemoryError``, or an error saying so while an address-space limit is set (a
    ``SystemError`` of an import, a Rust panic that could not start a thread)."""
    if isinstance(exc, MemoryError):
        return True
    if address_space_limit() is None:
        return False
    text = f"{type(exc).__name__}: {exc}"
    return (isinstance(exc, SystemError) or any(words in text for words in _SAID)
            or "os error 11" in text or "os error 12" in text)


def out_of_memory_line() -> str:
    limit = address_space_limit()
    within = (f" within the address-space limit (ulimit -v: {limit / 2**20:,.0f} MiB)"
              if limit is not None else "")
    return (f"traceview: out of memory{within}: raise the limit, or give fewer or smaller "
            "inputs")


def supervised(argv: list[str]) -> int | None:
    """The command's exit status, run in a watched child process when an address-space
    limit is set (module docstring); None when it runs here (no limit, or this is the
    child)."""
    if os.environ.get(CHILD) or address_space_limit() is None:
        return None
    import subprocess  # only under a limit

    source = str(Path(__file__).resolve().parents[2])  # the folder traceview imports from
    env = {**os.environ, CHILD: "1",
           "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH"))
                                         if p)}
    # Polars' async (tokio) runtime, built on the first query, starts one worker thread per
    # core; when one starts and a later one cannot (no address space left for its stack),
    # tokio panics and, unwinding, waits for the started worker to stop, which only the
    # runtime it never finished would tell it to do: the process hangs for ever (seen 5 times
    # in 135 runs of `summary` under 410 MB, gdb: RuntimeManager::new ->
    # BlockingPool::shutdown, beside a tokio-rt-worker in epoll_wait). One worker either
    # starts or not, and a failure is then the panic, which is this line. Its work is I/O
    # waits: one worker does them (docs/formats.md, *Bounds*: address space).
    env.setdefault("POLARS_ASYNC_THREAD_COUNT", "1")
    try:
        # the child goes with this process (a supervisor killed by a timeout leaves no
        # orphan holding the caller's pipes)
        from traceview.store.orphans import die_with_parent

        child = subprocess.Popen([sys.executable, "-m", "traceview", *argv], env=env,
                                 stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    except OSError:  # no memory even for the child: say so
        print(out_of_memory_line(), file=sys.stderr)
        return 2
    def stop(signum: int, _frame: object) -> None:
        # a child stuck in a native lock (a thread pool that could not start all its threads
        # under the limit) never runs its Python handler: SIGKILL it if SIGTERM did not do
        child.send_signal(signum)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()

    before = signal.signal(signal.SIGTERM, stop)
    try:
        # its stderr is read as it comes (a pipe filled would stop it), kept until it ends
        said = child.stderr.read() if child.stderr is not None else b""
        status = child.wait()
    except KeyboardInterrupt:  # the child has its Ctrl-C too (one process group)
        child.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, before)
    text = said.decode("utf-8", "replace")
    if status == 128 + signal.SIGTERM or status == -signal.SIGTERM:
        sys.stderr.write(text)
        return 128 + signal.SIGTERM
    if status < 0 or (status != 0 and any(words in text for words in _SAID)):
        print(out_of_memory_line(), file=sys.stderr)
        return 2
    sys.stderr.buffer.write(said) if hasattr(sys.stderr, "buffer") else sys.stderr.write(text)
    sys.stderr.flush()
    return status
