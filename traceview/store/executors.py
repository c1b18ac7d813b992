"""Executors: where per-file and per-rank work runs (local processes, or a Dask cluster).

Everything parallel in traceview goes through a ``concurrent.futures.Executor``:

* ``local`` (default): a ``ProcessPoolExecutor`` whose workers fork from multiprocessing's
  fork server (Linux; the start method CPython 3.14 makes the default there), or are spawned
  (elsewhere). Never fork the calling process: forking a process whose Polars thread pool is
  running deadlocks the child. The fork server imports the parsers once and runs nothing.
  It stays up, idle, until the calling process exits.
* ``dask``: ``distributed.Client(address).get_executor(pure=False)``. Without an address a
  ``LocalCluster`` is started for the duration of the ``with`` block and closed after it.
  On a real cluster (``dask-jobqueue`` under SLURM, ``dask scheduler`` + ``dask worker``) pass
  the scheduler address; traceview schedules nothing itself.

:func:`run_tasks` maps a function over task arguments on such an executor and retries a task
whose attempt *raised* (a worker that died, a transient I/O error) up to ``retries`` more times;
a task that keeps failing comes back as a :class:`TaskFailure` naming the error, so one bad rank
never takes the others down. With a pool this module owns, a pool broken by a dead worker
process is replaced before the retry.

>>> from traceview.store.executors import ExecutorSpec, open_executor, run_tasks
>>> with open_executor(ExecutorSpec("local", max_workers=1)) as ex:      # doctest: +SKIP
...     run_tasks(ex, abs, [(-1,), (2,)])
[1, 2]
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import forkserver
from typing import Any

from traceview._dependencies import lazy_module
from traceview.errors import UsageError
from traceview.store import orphans

KINDS: tuple[str, ...] = ("local", "dask")

#: Retries after a failed attempt (so up to ``1 + DEFAULT_RETRIES`` attempts per task).
DEFAULT_RETRIES = 2


@dataclass(frozen=True)
class ExecutorSpec:
    """How to run parallel work.

    ``kind``: ``local`` or ``dask``; ``scheduler``: a Dask scheduler address
    (``tcp://host:8786``), None starts a local cluster; ``max_workers``: local processes or
    local-cluster workers (None: one per core); ``retries``: extra attempts per failed task;
    ``processes``: for a local Dask cluster, worker processes (True) or threads in this
    process (False: quick to start, used by tests).
    """

    kind: str = "local"
    scheduler: str | None = None
    max_workers: int | None = None
    retries: int = DEFAULT_RETRIES
    processes: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"--executor wants one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.scheduler and self.kind != "dask":
            raise UsageError("--scheduler needs --executor dask")
        if self.retries < 0:
            raise UsageError(f"retries must be >= 0, got {self.retries}")


@dataclass(frozen=True)
class TaskFailure:
    """A task that raised on every attempt. ``error`` is one line: ``Type: message``."""

    args: tuple[Any, ...]
    error: str
    attempts: int


def cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


#: What the fork server imports once for all its workers (see ``local_pool``).
_PRELOAD = ["traceview.store.fork_server", "traceview.store.ingest", "traceview.parsers.kineto", "traceview.store.steps", "pyarrow.parquet"]


def local_pool(max_workers: int | None = None) -> ProcessPoolExecutor:
    """A process pool whose workers fork from a fork server that imported the parsers once, on
    Linux; spawned workers elsewhere. Never fork this process: see the module docstring. The
    fork server runs no Polars query, so it has no thread pool to copy; a spawned worker
    paid ~0.35 CPU s of imports on its own (docs/performance.md, log 22)."""
    return ProcessPoolExecutor(max_workers=max_workers or cores(), mp_context=_pool_context(),
                               initializer=orphans.guard_worker)


def warm_local_pool() -> None:
    """Start the fork server of :func:`local_pool` now, without waiting for it: its imports
    (~0.35 s on one core) then run while this process does other work (hashing the inputs)
    instead of after it. Nothing to do where workers are spawned."""
    if sys.platform.startswith("linux"):
        _pool_context()
        forkserver.ensure_running()


#: What the fork server imports where it cannot be given this process's import path (below):
#: third-party modules only, so the workers import traceview after ``sys.path`` is set.
_THIRD_PARTY_PRELOAD = [name for name in _PRELOAD if not name.startswith("traceview")]


def _pool_context() -> Any:
    if sys.platform.startswith("linux"):
        context = multiprocessing.get_context("forkserver")
        if _can_pin_import_path():
            context.set_forkserver_preload(_PRELOAD)
            with _parent_import_path():
                forkserver.ensure_running()
        else:
            context.set_forkserver_preload(_THIRD_PARTY_PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


def _can_pin_import_path() -> bool:
    """Whether the fork server can be started on this process's ``sys.path``: PYTHONSAFEPATH
    needs Python 3.11, and ``-E``/``-I`` make the server ignore the environment."""
    return sys.version_info >= (3, 11) and not sys.flags.ignore_environment


@contextmanager
def _parent_import_path() -> Iterator[None]:
    """The fork server started while the environment gives it this process's ``sys.path``.

    The server runs ``python -c``, so its ``sys.path`` starts with its working folder, and
    before CPython 3.12.8/3.13.1 (gh-117378) it ignores the path it is sent when it preloads.
    From a traceview checkout's root it then imported the checkout's uncompiled sources, not
    the installed package this process runs (``No module named
    'traceview.parsers.kineto._scan'`` on every file), and from a notebook that put a checkout
    on ``sys.path`` it imported whatever else was installed. PYTHONSAFEPATH drops the working
    folder and PYTHONPATH puts this process's path first, in its order: the workers it forks
    import the same traceview as this process. Both are set for the start only."""
    original = multiprocessing.process.ORIGINAL_DIR
    path = [os.path.abspath(entry) if entry else original for entry in sys.path]
    saved = {name: os.environ.get(name) for name in ("PYTHONSAFEPATH", "PYTHONPATH")}
    os.environ["PYTHONSAFEPATH"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def release_fork_server() -> None:
    """Stop the fork server :func:`local_pool`'s workers came from, once no pool will be asked
    for again (a command whose ingest is done: ``cli._options.open_traceset``). It holds the
    parsers' imports, ~130 MB, which a 64-rank ``summary`` carried to its peak, when the
    driver holds the analysed events (docs/performance.md, log 53). A later pool starts it
    again. A no-op when none runs, and while any worker of it lives (a pool kept open: the
    server would wait for it)."""
    if sys.platform.startswith("linux") and not multiprocessing.active_children():
        forkserver._forkserver._stop()


def stop_local_workers() -> None:
    """Terminate this process's pool workers and the fork server they came from, now (a
    terminated command: ``cli.main`` on SIGTERM). Left alone they outlive it: a worker parsing
    a large file runs to the end of its task, and both hold the caller's stdout and stderr
    open, so whoever reads them waits. The resource tracker leaves on its own once they are
    gone."""
    for child in multiprocessing.active_children():  # the workers (the fork server's children)
        child.terminate()
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if server:
        try:
            os.kill(server, signal.SIGTERM)
        except OSError:
            pass  # gone already


distributed = lazy_module("distributed", missing="--executor dask needs Dask: pip install "
                          "'dask[distributed]' (in a traceview checkout: pip install '.[dask]')")


@contextmanager
def open_executor(spec: ExecutorSpec | str = "local") -> Iterator[Executor]:
    """An executor for ``spec``, shut down (and a local Dask cluster closed) on exit."""
    if isinstance(spec, str):
        spec = ExecutorSpec(spec)
    if spec.kind == "local":
        pool = local_pool(spec.max_workers)
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    cluster = None
    if spec.scheduler:
        client = distributed.Client(spec.scheduler)
    else:
        workers = spec.max_workers or cores()
        # One task per worker at a time: one Polars thread each, or the workers' thread pools
        # oversubscribe the cores (measured: ingest of 256 small ranks on 2 cores 25 s -> 17 s).
        extra = {"env": {"POLARS_MAX_THREADS": "1"}} if spec.processes else {}
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=spec.processes,
            dashboard_address=":0", silence_logs=40, **extra)
        client = distributed.Client(cluster)
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def is_dask(executor: Executor) -> bool:
    return type(executor).__module__.startswith("distributed")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_tasks(
    executor: Executor,
    fn: Callable[..., Any],
    tasks: Sequence[tuple[Any, ...]],
    *,
    retries: int = DEFAULT_RETRIES,
    on_result: Callable[[int, Any], None] | None = None,
    replace_pool: Callable[[], Executor] | None = None,
) -> list[Any]:
    """``[fn(*t) for t in tasks]`` on ``executor``, in task order, retrying failed attempts.

    An attempt that raises is submitted again, up to ``retries`` more times; after that the
    task's slot holds a :class:`TaskFailure`. ``on_result(index, value)`` is called as each
    task finishes (for progress). When a local process pool breaks (a worker process died),
    ``replace_pool()`` gives a fresh one for the remaining attempts; without it the remaining
    tasks fail with the pool's error.
    """
    results: list[Any] = [None] * len(tasks)
    attempts = [0] * len(tasks)
    pending: dict[Future, int] = {}
    pool = executor
    created: list[Executor] = []  # replacement pools: ours to shut down

    def submit(i: int) -> None:
        attempts[i] += 1
        try:
            pending[pool.submit(fn, *tasks[i])] = i
        except BrokenProcessPool as exc:  # the pool died between two submissions
            failed: Future = Future()
            failed.set_exception(exc)
            pending[failed] = i

    for i in range(len(tasks)):
        submit(i)
    while pending:
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        broken = False
        retry: list[int] = []
        for future in done:
            i = pending.pop(future)
            exc = future.exception()
            if exc is None:
                results[i] = future.result()
                if on_result:
                    on_result(i, results[i])
                continue
            broken = broken or isinstance(exc, BrokenProcessPool)
            if attempts[i] <= retries:
                retry.append(i)
            else:
                results[i] = TaskFailure(tuple(tasks[i]), one_line(exc), attempts[i])
                if on_result:
                    on_result(i, results[i])
        if broken and replace_pool is not None:
            # Every other future of a broken pool fails too: collect them, resubmit on a new pool.
            for future in list(pending):
                exc = future.exception()
                i = pending.pop(future)
                if exc is None:
                    results[i] = future.result()
                    if on_result:
                        on_result(i, results[i])
                elif attempts[i] <= retries:
                    retry.append(i)
                else:
                    results[i] = TaskFailure(tuple(tasks[i]), one_line(exc), attempts[i])
                    if on_result:
                        on_result(i, results[i])
            old, pool = pool, replace_pool()
            old.shutdown(wait=False, cancel_futures=True)
            created.append(pool)
        for i in sorted(retry):
            submit(i)
    for extra in created:
        extra.shutdown(wait=True)
    return results


__all__ = ["DEFAULT_RETRIES", "KINDS", "ExecutorSpec", "TaskFailure", "cores", "is_dask",
           "local_pool", "one_line", "open_executor", "run_tasks", "stop_local_workers"]
