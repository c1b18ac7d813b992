"""How much reading an allocator snapshot costs over the pickle load it cannot avoid.

    python benchmarks/memory_snapshot.py [--entries 100000] [--frames 30] [--repeat 3]

Writes a snapshot of a simulated allocator history (``tests/snapshot_helpers``) with
``--frames`` stack frames per entry and block, then times, fastest of ``--repeat``:

* ``pickle.loads`` of the file (the standard, unsafe reader: the floor);
* ``traceview.run.memory.memory_result(None, [file])``: the restricted read, the tables, the
  replay, the top stacks.

Target (a ratio, never a timed unit test): the whole ``memory`` answer within 3x the bare
pickle load. Measured here (2 shared cores, 99,814 entries x 30 frames, 56.2 MB, fastest of
2): 1.90 s load, 2.86 s answer: 1.50x.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 3.0


def _snapshot(entries: int, frames: int) -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    from snapshot_helpers import simulated_snapshot

    snap = simulated_snapshot(1, actions=int(entries * 0.63), keep=entries)
    stack = [{"filename": f"/site-packages/torch/nn/modules/m{i}.py", "line": i,
              "name": f"forward{i}"} for i in range(frames)]
    for trace in snap["device_traces"]:
        for e in trace:
            e["frames"] = [dict(f) for f in stack]
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            b["frames"] = [dict(f) for f in stack]
    return snap


def _fastest(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--frames", type=int, default=30)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    from traceview.run.memory import memory_result

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rank-0.snapshot.pickle"
        snap = _snapshot(args.entries, args.frames)
        path.write_bytes(pickle.dumps(snap))
        n = sum(len(t) for t in snap["device_traces"])
        load = _fastest(lambda: pickle.loads(path.read_bytes()), args.repeat)
        answer = _fastest(lambda: memory_result(None, [str(path)]), args.repeat)
        ratio = answer / load
        print(f"{n:,} entries x {args.frames} frames, {path.stat().st_size / 1e6:.1f} MB: "
              f"pickle.loads {load:.2f} s, memory answer {answer:.2f} s, ratio {ratio:.2f} "
              f"(target <= {TARGET_RATIO})")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
