"""256 small ranks through a local Dask cluster: checks the driver-side cost model (not a test).

    python benchmarks/bench_dask.py [--ranks 256] [--workers 2] [--steps 3]

1. Writes ``--ranks`` synthetic GPU ranks (``fixtures.synthetic``, NCCL all-reduces and
   all-gathers, clock offsets) into ``benchmarks/out/dask-<ranks>/`` (kept for reruns).
2. Per-rank costs in this process (a sample of 8 ranks): parse + cache write, and the per-rank
   summary (``traceview.run.per_rank.summarise``); summary bytes and collective rows per rank.
3. A ``LocalCluster`` (``--workers`` processes, one thread each): cluster start, ingest map
   (workers write their Parquet), per-rank summary map, then the driver-only cross-rank steps
   (matching, alignment, collectives, stragglers), with the driver's RSS before and after.
4. The model: driver cross-rank time on the first 32/64/128/192 ranks' summaries, fitted as
   ``a + b * rows + c * rows * ranks`` (rows = collective calls held), extrapolated to all the
   ranks and compared with the measured time; map time predicted as
   ``ranks * per_rank_cost / workers + ranks * per_task_overhead``.

Prints a table and writes ``benchmarks/out/bench_dask.json``; ``docs/scaling.md`` uses it.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _generate(out: Path, ranks: int, steps: int) -> Path:
    from fixtures.synthetic import SyntheticSpec, generate

    done = out / "ground_truth.json"
    if done.exists() and len(list(out.glob("rank-*.json.gz"))) == ranks:
        return out
    shutil.rmtree(out, ignore_errors=True)
    offsets = tuple(((r * 7919) % 2000 - 1000) * 1000 for r in range(ranks))
    generate(SyntheticSpec(world_size=ranks, steps=steps, kernels_per_step=6,
                           clock_offsets_ns=(0, *offsets[1:]), gpus_per_node=8), out)
    return out


def _fit(xs: list[tuple[float, float]], ys: list[float]) -> list[float]:
    import numpy as np

    a = np.array([[1.0, r, r * n] for r, n in xs])
    coef, *_ = np.linalg.lstsq(a, np.array(ys), rcond=None)
    return [float(c) for c in coef]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    args = ap.parse_args(argv)

    import distributed
    import polars as pl

    import traceview
    from traceview.store.ingest import ingest_file
    from traceview.run.per_rank import cross_rank, map_ranks, summarise

    t = time.perf_counter()
    data = _generate(args.out / f"dask-{args.ranks}", args.ranks, args.steps)
    gen_s = time.perf_counter() - t
    files = sorted(data.glob("rank-*.json.gz"))
    result: dict = {"ranks": args.ranks, "workers": args.workers, "steps": args.steps,
                    "generate_s": round(gen_s, 2),
                    "input_bytes_per_rank": sum(f.stat().st_size for f in files) // len(files)}

    # Per-rank costs, in this process.
    cache = Path(tempfile.mkdtemp(prefix="bench-dask-"))
    parse_s, summ_s, sbytes, rows = [], [], [], []
    for f in files[:8]:
        t = time.perf_counter()
        fr = ingest_file(str(f), str(cache / "solo"), {})
        parse_s.append(time.perf_counter() - t)
        ev = pl.read_parquet(fr.events_path)
        t = time.perf_counter()
        s = summarise(ev)
        summ_s.append(time.perf_counter() - t)
        sbytes.append(s.nbytes())
        rows.append(s.comm.height)
    result.update(parse_s_per_rank=round(sorted(parse_s)[4], 4),
                  summarise_s_per_rank=round(sorted(summ_s)[4], 4),
                  events_per_rank=fr.stored_events, summary_bytes_per_rank=sorted(sbytes)[4],
                  comm_rows_per_rank=rows[4])

    rss0 = _rss_mb()
    t = time.perf_counter()
    cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                       processes=True, dashboard_address=":0",
                                       silence_logs=40, env={"POLARS_MAX_THREADS": "1"})
    client = distributed.Client(cluster)
    ex = client.get_executor(pure=False)
    result["cluster_start_s"] = round(time.perf_counter() - t, 2)
    try:
        t = time.perf_counter()
        ts = traceview.open(data, cache_dir=cache / "dask", executor=ex)
        result["ingest_map_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        summaries, failed = map_ranks(ts, executor=ex)
        result["summary_map_s"] = round(time.perf_counter() - t, 2)
        # Per-task overhead: trivial tasks through the same executor.
        t = time.perf_counter()
        list(ex.map(abs, range(-args.ranks, 0)))
        result["trivial_task_s"] = round((time.perf_counter() - t) / args.ranks, 5)
    finally:
        client.close()
        cluster.close()
    assert not failed, failed
    rss1 = _rss_mb()
    res, best = None, float("inf")
    for _ in range(3):  # best of 3: the driver stage is short and the machine may be shared
        t = time.perf_counter()
        res = cross_rank(summaries, hosts=ts.ranks)
        best = min(best, time.perf_counter() - t)
    result["cross_rank_s"] = round(best, 3)
    rss2 = _rss_mb()
    total_rows = sum(s.comm.height for s in summaries)
    result.update(
        driver_summary_bytes=res.summary_bytes, driver_comm_rows=total_rows,
        driver_rss_mb_before=round(rss0, 1), driver_rss_mb_after_map=round(rss1, 1),
        driver_rss_mb_after_cross=round(rss2, 1),
        instances=res.collectives.height,
        max_uncertainty_ns=res.offsets.get_column("uncertainty_ns").max(),
    )

    # Driver cost model: fit on subsets, predict the full set.
    pts, ys = [], []
    for k in (32, 64, 128, 192):
        if k >= len(summaries):
            break
        sub = summaries[:k]
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            cross_rank(sub, hosts=ts.ranks)
            best = min(best, time.perf_counter() - t)
        ys.append(best)
        pts.append((float(sum(s.comm.height for s in sub)), float(k)))
    if len(pts) >= 3:
        coef = _fit(pts, ys)
        pred = coef[0] + coef[1] * total_rows + coef[2] * total_rows * len(summaries)
        result["driver_fit"] = {"a_s": coef[0], "b_s_per_row": coef[1],
                                "c_s_per_row_rank": coef[2],
                                "subset_s": [round(y, 3) for y in ys]}
        result["cross_rank_predicted_s"] = round(pred, 3)
    workers = args.workers
    map_pred = (args.ranks * (result["parse_s_per_rank"] + result["summarise_s_per_rank"])
                / workers + 2 * args.ranks * result["trivial_task_s"])
    result["map_predicted_s"] = round(map_pred, 2)
    result["map_measured_s"] = round(result["ingest_map_s"] + result["summary_map_s"], 2)
    result["load_average_1m"] = round(__import__("os").getloadavg()[0], 2)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    shutil.rmtree(cache, ignore_errors=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_dask.json").write_text(json.dumps(result, indent=2))
    for k, v in result.items():
        print(f"{k:>28}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
