"""Hand-built event rows shared by the GPU analysis tests (not a test module)."""

from __future__ import annotations

from traceview.schema import events_frame


def row(kind: str, name: str, ts: int, dur: int | None, *, rank: int = 0, **kw) -> dict:
    r = {"rank": rank, "file_id": rank, "source": "kineto", "kind": kind, "name": name,
         "ts_ns": ts, "dur_ns": dur}
    if kind in ("kernel", "memcpy", "memset"):
        r.update(device=0, stream=7)
    r.update(kw)
    return r


def kernel(name: str, ts: int, dur: int, *, corr: int | None = None, step: int | None = None,
           stream: int = 7, rank: int = 0, **kw) -> dict:
    return row("kernel", name, ts, dur, rank=rank, correlation=corr, step=step, stream=stream,
               **kw)


def launch(ts: int, dur: int, corr: int, *, rank: int = 0, step: int | None = None,
           name: str = "cudaLaunchKernel") -> dict:
    return row("cuda_runtime", name, ts, dur, rank=rank, correlation=corr, step=step, pid=1,
               tid=1)


def step(n: int, ts: int, dur: int, *, rank: int = 0) -> dict:
    return row("user_annotation", f"ProfilerStep#{n}", ts, dur, rank=rank, step=n, pid=1, tid=1)


def frame(rows: list[dict]):
    return events_frame(rows)


def two_step_trace():
    """Rank 0: two steps of compute + NCCL (+ one H2D copy); rank 1: CPU only.

    step 1 (host [0,100)):  compute [10,40) [50,70) on stream 7, nccl [30,60) on stream 20,
                            memcpy HtoD [75,80)
    step 2 (host [100,200)): compute [110,150), nccl [140,160)
    """
    return frame([
        step(1, 0, 100), step(2, 100, 100),
        launch(5, 3, 1, step=1), launch(6, 3, 2, step=1), launch(8, 3, 3, step=1),
        launch(9, 3, 4, step=1, name="cudaMemcpyAsync"),
        launch(105, 3, 5, step=2), launch(106, 3, 6, step=2),
        kernel("sgemm", 10, 30, corr=1, step=1),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 30, corr=2, step=1, stream=20),
        kernel("elementwise", 50, 20, corr=3, step=1),
        row("memcpy", "Memcpy HtoD (Pageable -> Device)", 75, 5, correlation=4, step=1),
        kernel("sgemm", 110, 40, corr=5, step=2),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 140, 20, corr=6, step=2, stream=20),
        row("cpu_op", "aten::mm", 0, 50, rank=1, pid=2, tid=2),
    ])
