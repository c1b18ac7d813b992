"""Allocator snapshots for the tests (not a test module): a hand-drawn one, a small allocator
simulation that writes consistent ones, and an independent forward replay to check against.

The forward replay follows PyTorch's MemoryViz (``torch/utils/viz/MemoryViz.js``,
``process_alloc_data``): it walks the trace *forwards*, matching frees to allocations by
address; a block freed without its allocation in the trace, or held at snapshot time without
one, was allocated before recording began. traceview replays *backwards* from the snapshot
instead (``analyses.memory_snapshot``): the two must agree byte for byte.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

HELD = ("active_allocated", "active_pending_free", "active_awaiting_free")


def frames(*names: str) -> list[dict[str, Any]]:
    """Innermost first, as the allocator records them."""
    return [{"filename": f"/src/{n.split('.')[0]}.py", "line": 10 + i, "name": n}
            for i, n in enumerate(names)]


def hand_snapshot() -> dict[str, Any]:
    """Device 0: before recording, block P (250 B requested) in segment A and block Q (100 B)
    were held. Recorded: alloc X 200; segment_alloc B 2000; alloc Y 1500; free Q; free Y;
    oom 4000 (10 B free on the device); alloc Z 700. Device 1: one empty 512 B segment, no
    trace.

    By hand: end allocated = P 250 + X 200 + Z 700 = 1150, reserved = 1000 + 2000 = 3000;
    the trace adds 200 + 1500 − 100 − 1500 + 700 = 800, so 350 (P + Q) was allocated
    before recording. After each action: 550, 550, 2050, 2050, 1950, 1950, 450, 450, 1150:
    the peak is 2050 at action 2 (alloc Y), when P, Q, X and Y were held. Reserved: 1000 at
    the start, 3000 from action 1 on. Fragmentation 3000 − 1150 = 1850; the largest free
    block is B's tail, 2000 − 700 = 1300."""
    seg_a = {"device": 0, "address": 1000, "total_size": 1000, "stream": 0,
             "segment_type": "small", "allocated_size": 500, "active_size": 500,
             "blocks": [
                 {"address": 1000, "size": 300, "requested_size": 250,
                  "state": "active_allocated", "frames": frames("init_weights", "main")},
                 {"address": 1300, "size": 200, "requested_size": 200,
                  "state": "active_allocated", "frames": frames("forward", "main")},
                 {"address": 1500, "size": 500, "requested_size": 0, "state": "inactive",
                  "frames": []}]}
    seg_b = {"device": 0, "address": 5000, "total_size": 2000, "stream": 0,
             "segment_type": "large", "allocated_size": 700, "active_size": 700,
             "blocks": [
                 {"address": 5000, "size": 700, "requested_size": 700,
                  "state": "active_allocated", "frames": frames("backward", "main")},
                 {"address": 5700, "size": 1300, "requested_size": 0, "state": "inactive",
                  "frames": []}]}
    seg_c = {"device": 1, "address": 9000, "total_size": 512, "stream": 0,
             "segment_type": "small", "allocated_size": 0, "active_size": 0,
             "blocks": [{"address": 9000, "size": 512, "requested_size": 0,
                         "state": "inactive", "frames": []}]}

    def act(action: str, addr: int, size: int, t: int, *names: str, **kw: Any) -> dict:
        return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
                "frames": frames(*names), **kw}

    trace0 = [
        act("alloc", 1300, 200, 100, "forward", "main"),
        act("segment_alloc", 5000, 2000, 110, "attention", "forward", "main"),
        act("alloc", 5000, 1500, 111, "attention", "forward", "main"),
        act("free_requested", 1500, 100, 120, "step", "main"),
        act("free_completed", 1500, 100, 121, "step", "main"),
        act("free_requested", 5000, 1500, 130, "backward", "main"),
        act("free_completed", 5000, 1500, 131, "backward", "main"),
        {"action": "oom", "size": 4000, "device_free": 10, "stream": 0, "time_us": 140,
         "frames": frames("huge", "main")},
        act("alloc", 5000, 700, 150, "backward", "main"),
    ]
    return {"segments": [seg_a, seg_b, seg_c], "device_traces": [trace0, []]}


def write(path: Path, snapshot: dict[str, Any]) -> Path:
    path.write_bytes(pickle.dumps(snapshot))
    return path


def forward_replay(snapshot: dict[str, Any], device: int) -> dict[str, int]:
    """Peak and end allocated / reserved bytes of ``device`` by a forward, address-matching
    replay from the inferred start state (MemoryViz's rule)."""
    def run(alloc: set[str], free: set[str], held_at_end: dict[int, int]) -> tuple[int, int]:
        live: dict[int, int] = {}
        start, deltas = 0, []
        for e in snapshot["device_traces"][device]:
            if e["action"] in alloc:
                live[e["addr"]] = e["size"]
                deltas.append(e["size"])
            elif e["action"] in free:
                if e["addr"] in live:
                    del live[e["addr"]]
                else:  # freed, but allocated before recording began
                    start += e["size"]
                deltas.append(-e["size"])
        start += sum(size for addr, size in held_at_end.items() if addr not in live)
        level = peak = start
        for d in deltas:
            level += d
            peak = max(peak, level)
        return peak, level

    segs = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    blocks = {b["address"]: b["requested_size"] for s in segs for b in s["blocks"]
              if b["state"] in HELD}
    peak_a, end_a = run({"alloc"}, {"free_completed"}, blocks)
    peak_r, end_r = run({"segment_alloc"}, {"segment_free"},
                        {s["address"]: s["total_size"] for s in segs})
    return {"peak_allocated": peak_a, "end_allocated": end_a, "peak_reserved": peak_r,
            "end_reserved": end_r}


def simulated_snapshot(seed: int, *, actions: int = 300, keep: int = 120) -> dict[str, Any]:
    """A snapshot written the way the caching allocator writes one, for a random program on
    two devices: each allocation takes a free block of a cached segment or a new segment
    (``segment_alloc``); frees go through ``free_requested`` then ``free_completed``
    (sometimes later, as with ``record_stream``); now and then an empty segment is released
    (``segment_free``). The history is a ring buffer of the last ``keep`` actions per device,
    so what came before them is the start state a replay must infer."""
    rng = random.Random(seed)
    traces: list[list[dict[str, Any]]] = [[], []]
    segments: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    next_addr = 1 << 20
    pending: list[tuple[int, dict[str, Any]]] = []
    for _ in range(actions):
        device = rng.randrange(2)
        held = [(s, b) for s in segments[device] for b in s["blocks"]
                if b["state"] == "active_allocated"]
        roll = rng.random()
        if roll < 0.5 or not held:
            size = rng.choice([256, 512, 4096, 1 << 20]) * rng.randint(1, 4)
            requested = size - rng.randrange(0, 64)
            where = next(((s, b) for s in segments[device] for b in s["blocks"]
                          if b["state"] == "inactive" and b["size"] == size), None)
            if where is None:
                seg = {"device": device, "address": next_addr, "total_size": size,
                       "stream": 0, "segment_type": "large",
                       "blocks": [{"address": next_addr, "size": size, "requested_size": 0,
                                   "state": "inactive", "frames": []}]}
                next_addr += size + 4096
                segments[device].append(seg)
                traces[device].append({"action": "segment_alloc", "addr": seg["address"],
                                       "size": size, "stream": 0})
                where = (seg, seg["blocks"][0])
            block = where[1]
            block.update(requested_size=requested, state="active_allocated",
                         frames=frames(f"op{rng.randrange(4)}", "main"))
            traces[device].append({"action": "alloc", "addr": block["address"],
                                   "size": requested, "stream": 0,
                                   "frames": block["frames"]})
        elif roll < 0.9:
            _, block = rng.choice(held)
            traces[device].append({"action": "free_requested", "addr": block["address"],
                                   "size": block["requested_size"], "stream": 0})
            block["state"] = "active_pending_free"
            pending.append((device, block))
        elif roll < 0.95 and pending:
            pass  # a pending free stays pending for a while
        else:
            empty = [s for s in segments[device] if s["blocks"][0]["state"] == "inactive"]
            if empty:
                seg = rng.choice(empty)
                segments[device].remove(seg)
                traces[device].append({"action": "segment_free", "addr": seg["address"],
                                       "size": seg["total_size"], "stream": 0})
        # most pending frees complete soon; a few stay pending at snapshot time
        still = []
        for dev, block in pending:
            if rng.random() < 0.7:
                traces[dev].append({"action": "free_completed", "addr": block["address"],
                                    "size": block["requested_size"], "stream": 0})
                block.update(state="inactive", requested_size=0)
            else:
                still.append((dev, block))
        pending = still
    for dev in traces:
        for i, e in enumerate(dev):
            e["time_us"] = 1000 + i
    return {"segments": [s for d in (0, 1) for s in segments[d]],
            "device_traces": [t[-keep:] for t in traces]}
