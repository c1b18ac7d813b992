"""Many small tasks on an executor, a batch of them per submission.

A run folder of thousands of small rank files is thousands of tasks of a few tens of ms each;
one submission per task paid a pool round trip and a worker wake-up each (docs/performance.md,
log 43). :func:`plan_batches` groups small tasks (by a weight, e.g. estimated bytes) into
batches, keeping enough batches for every worker to stay busy; :func:`run_batched` runs each
batch as one submission and keeps :func:`~traceview.store.executors.run_tasks`' promise per
task: an attempt that raises is retried (alone), and a task that keeps failing comes back as
a :class:`~traceview.store.executors.TaskFailure` that counts every attempt, so one bad task
never takes its batch down.

>>> plan_batches([1, 1, 1, 1, 50, 1], workers=1, budget=10, most=3, per_worker=1)
[[0, 1, 2], [3], [4], [5]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from traceview.store.executors import DEFAULT_RETRIES, TaskFailure, one_line, run_tasks

#: Most tasks in one batch, and batches per worker at least (when there are enough tasks):
#: small enough that the last batches finish together on every worker.
MOST_PER_BATCH = 64
BATCHES_PER_WORKER = 4


def plan_batches(weights: Sequence[int], *, workers: int, budget: int,
                 most: int = MOST_PER_BATCH, per_worker: int = BATCHES_PER_WORKER,
                 ) -> list[list[int]]:
    """Task indices in order, grouped: consecutive tasks whose weights add up to at most
    ``budget`` (a heavier task goes alone), at most ``most`` of them, and no more than
    ``len(weights) / (workers x per_worker)`` so that every worker gets several batches."""
    size = max(1, min(most, math.ceil(len(weights) / max(1, workers * per_worker))))
    batches: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, weight in enumerate(weights):
        if current and (len(current) >= size or held + weight > budget):
            batches.append(current)
            current, held = [], 0
        current.append(i)
        held += weight
    if current:
        batches.append(current)
    return batches


@dataclass(frozen=True)
class Raised:
    """A task of a batch whose attempt raised (``error``: one line), to be tried again alone."""

    error: str


def call_each(fn: Callable[..., Any], tasks: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``[fn(*t) for t in tasks]`` with a task that raises answered as :class:`Raised`, so that
    the others of its batch still count. Runs in the worker."""
    out: list[Any] = []
    for args in tasks:
        try:
            out.append(fn(*args))
        except Exception as exc:  # noqa: BLE001 - retried alone by run_batched
            out.append(Raised(one_line(exc)))
    return out


def run_batched(
    executor: Executor,
    fn: Callable[..., Any],
    tasks: Sequence[tuple[Any, ...]],
    batches: list[list[int]],
    *,
    retries: int = DEFAULT_RETRIES,
    on_result: Callable[[int, Any], None] | None = None,
    replace_pool: Callable[[], Executor] | None = None,
) -> list[Any]:
    """``[fn(*t) for t in tasks]`` on ``executor``, one submission per batch of ``batches``
    (lists of task indices), in task order; retries as :func:`run_tasks`.

    A task whose attempt raised in its batch is tried again alone, ``retries`` times more in
    all. A batch that failed as a whole (its worker died) is retried as a batch; when it keeps
    failing, each of its tasks is tried alone (the one that kills its worker then fails by
    itself). ``on_result(index, value)`` per task, as its answer is known.
    """
    results: list[Any] = [None] * len(tasks)
    again: list[int] = []      # tried once in a batch (it raised): retries - 1 more alone
    alone: list[int] = []      # their batch kept failing: every attempt alone

    def settle(i: int, value: Any) -> None:
        results[i] = value
        if on_result:
            on_result(i, value)

    def batch_done(b: int, value: Any) -> None:
        members = batches[b]
        if isinstance(value, TaskFailure):
            if len(members) == 1:
                settle(members[0], TaskFailure(tuple(tasks[members[0]]), value.error,
                                               value.attempts))
            else:
                alone.extend(members)
            return
        for i, answer in zip(members, value, strict=True):
            if not isinstance(answer, Raised):
                settle(i, answer)
            elif retries == 0:
                settle(i, TaskFailure(tuple(tasks[i]), answer.error, 1))
            else:
                again.append(i)

    broke: list[Executor] = []

    def replacement() -> Executor:  # run_tasks shuts its replacements down when it returns
        broke.append(replace_pool())  # type: ignore[misc]
        return broke[-1]

    run_tasks(executor, call_each, [(fn, [tasks[i] for i in members]) for members in batches],
              retries=retries, on_result=batch_done,
              replace_pool=replacement if replace_pool else None)
    indices = sorted(again + alone)
    if not indices:
        return results
    # the caller's pool is broken when a worker died: the tasks tried alone get a new one
    pool = replace_pool() if broke and replace_pool else executor
    try:
        for group, extra, tries in ((sorted(again), 1, retries - 1), (sorted(alone), 0, retries)):
            answers = run_tasks(pool, fn, [tasks[i] for i in group], retries=tries,
                                replace_pool=replace_pool) if group else []
            for i, answer in zip(group, answers, strict=True):
                settle(i, TaskFailure(answer.args, answer.error, answer.attempts + extra)
                       if isinstance(answer, TaskFailure) else answer)
    finally:
        if pool is not executor:
            pool.shutdown(wait=True)
    return results


__all__ = ["Raised", "call_each", "plan_batches", "run_batched"]
