"""What to fix first: findings ranked by the time each fix would save per step.

Every gain is a "what if" on the critical path (:mod:`traceview.analyses.critical_path`),
per step of the path (definitions and a worked example: ``docs/metrics.md``, *Diagnose*):

* ``straggler`` (one per rank): the rank as fast as the median rank. At each collective
  where the path jumps to it, its stretch on the path (from the collective the path passed
  before to its arrival: all its own time, or the path would have jumped) would take only
  the median rank's own time over the same stretch (``path_summary.stretch_own``: the time
  to its own arrival, less its waits on communication):
  ``gain = clamp(own_R - median_q own_q, 0, own_R)``. Own time, not arrival times: when the
  others' arrivals wait for the straggler through earlier collectives (NCCL kernels of one
  stream run in order), its lead over the second-to-last arrival (``lateness``, in the
  evidence) hides most of its cost;
* ``exposed_communication``: communication on the path (transfer and wait) fully hidden
  under compute;
* ``data_loading``, ``host_sync``, ``launch_bound``: the path's time in GPU gaps of one cause
  removed (``analyses.gaps``: data_loading; sync; host and launch_overhead, with the path's
  launch/host time where the GPU is idle), plus, for data loading, the path's time in
  DataLoader ops on CPU-only ranks;
* ``pageable_copy``: host-to-device copies from pageable memory on the path, at half their
  time (pinned copies run at about twice the bandwidth, and can overlap compute);
* ``bound`` and ``mfu``: what the path is made of, and the model FLOPs utilisation when the
  model size is given; information, no gain.

Each gain is one change made alone: gains do not add up (fixing the straggler can expose
communication that was hidden behind its lateness).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from .critical_path import CriticalPath
from .flops import PEAK_TABLE, Peak, peak_tflops
from .intervals import clip
from .path_summary import path_categories, path_steps, stretch_own

#: Gain thresholds, as a share of the median step time: ``high`` and ``medium`` severity;
#: below ``KEEP`` a finding is left out (noise, not worth a line on the to-do list).
HIGH, MEDIUM, KEEP = 0.10, 0.03, 0.01

FINDING_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String, "title": pl.String, "severity": pl.String, "rank": pl.Int32,
    "gain_ns_per_step": pl.Int64, "gain_share": pl.Float64,
    "evidence": pl.List(pl.Struct({"metric": pl.String, "value": pl.Float64,
                                   "unit": pl.String, "text": pl.String})),
    "recommendation": pl.String,
}

RECOMMENDATIONS: dict[str, str] = {
    "straggler": (
        "Investigate rank {rank}: it is the rank the others wait for. Compare its top ops on "
        "the path with a median rank's; check what only it does or suffers: CPU contention or "
        "throttling on its host, a slower data shard or input pipeline, extra work on its code "
        "path, a slow link or GPU."),
    "exposed_communication": (
        "Overlap communication with compute: tune DDP bucket_cap_mb (larger buckets pay the "
        "latency less often, smaller ones start earlier in backward), keep "
        "gradient_as_bucket_view, prefetch in FSDP (forward_prefetch, backward_prefetch), use "
        "no_sync() for gradient accumulation; check bus bandwidth with `traceview "
        "collectives`."),
    "data_loading": (
        "Feed the loop ahead of time: DataLoader(num_workers>0, pin_memory=True, "
        "prefetch_factor, persistent_workers=True); move decoding and augmentation out of the "
        "training process."),
    "host_sync": (
        "Remove host synchronisations from the step: .item(), .cpu(), .tolist(), printing "
        "tensors, torch.cuda.synchronize()/cudaDeviceSynchronize; log metrics every N steps "
        "and copy with non_blocking=True."),
    "launch_bound": (
        "The GPU waits for kernel launches: capture the step with CUDA graphs "
        "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs), fuse small kernels "
        "with torch.compile, or give each kernel more work (larger batch)."),
    "pageable_copy": (
        "Copy from pinned memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
        ".to(device, non_blocking=True)."),
    "alltoall_imbalance": (
        "Balance the all-to-all: rank {rank} receives {ratio:.2f}x the mean volume, so its "
        "share of the work (an expert's tokens) takes longest and the others wait for it. "
        "Strengthen the router's load-balancing loss, cap expert capacity (capacity factor, "
        "dropping or rerouting overflow tokens), replicate the hot expert or place experts by "
        "measured load; `traceview alltoall` shows the volumes per rank and step."),
    "bound": "Work on the largest share first; the findings above say how.",
    "mfu": (
        "Low MFU with a compute-bound path: use bf16/fp16 autocast or TF32 matmuls, larger "
        "matrices per kernel, torch.compile; check the top kernels with `traceview "
        "breakdown`."),
}


@dataclass(frozen=True)
class ModelSize:
    """What the user says about the model, for MFU. ``flops_per_step`` (whole job, all
    ranks) wins; else 6 x ``params`` x ``tokens_per_step`` (training: forward and backward),
    plus 12 x ``layers`` x ``hidden`` x ``seq_len`` per token (attention) when all three are
    given. ``peak_tflops`` overrides the device table (``analyses.flops.PEAK_TABLE``),
    looked up by the device name in the trace (or ``device``) and ``dtype``."""

    params: float | None = None
    tokens_per_step: float | None = None
    flops_per_step: float | None = None
    layers: int | None = None
    hidden: int | None = None
    seq_len: int | None = None
    peak_tflops: float | None = None
    dtype: str = "bf16"
    device: str | None = None

    def flops(self) -> float | None:
        if self.flops_per_step is not None:
            return float(self.flops_per_step)
        if self.params is None or self.tokens_per_step is None:
            return None
        per_token = 6.0 * self.params
        if None not in (self.layers, self.hidden, self.seq_len):
            per_token += 12.0 * self.layers * self.hidden * self.seq_len  # type: ignore[operator]
        return per_token * self.tokens_per_step


def diagnose(path: CriticalPath, *, collective_rows: pl.DataFrame,
             stragglers: pl.DataFrame | None = None, gaps: pl.DataFrame | None = None,
             gpu_ranks: tuple[int, ...] = (), devices: pl.DataFrame | None = None, model: ModelSize = ModelSize(),
             table: tuple[Peak, ...] = PEAK_TABLE,
             alltoall: dict[str, Any] | None = None) -> dict[str, Any]:
    """``findings`` (``FINDING_SCHEMA``, largest gain first, information last), ``bound``,
    ``mfu`` and ``step_ns``: the mean step time the gains are shares of.

    ``collective_rows``: ``collectives.collective_ranks`` (aligned); ``stragglers``:
    ``stragglers.stragglers`` (None: one rank); ``gaps``: ``gaps.gaps`` per device (None:
    no GPU) on ``gpu_ranks``, the ranks with GPU work; ``devices``: the ranks table (``rank``, ``devices`` as JSON text);
    ``alltoall``: the all-to-all answer (``alltoall.alltoall``), when the run has any."""
    steps = path_steps(path)
    n_steps = max(steps.height, 1)
    step_ns = _mean_step(steps)
    cats = path_categories(path)
    found: list[dict[str, Any]] = []
    found += _stragglers(path, collective_rows, stragglers, n_steps, step_ns)
    found.append(_exposed_comm(path, cats, n_steps))
    found += _gap_findings(path, gaps, sorted(gpu_ranks), n_steps)
    found.append(_pageable(path, n_steps))
    found.append(_alltoall_imbalance(alltoall, found))
    found = [f for f in found if f is not None]
    for f in found:
        f["gain_share"] = f["gain_ns_per_step"] / step_ns if step_ns else None
    found = [_with_severity(f) for f in found
             if f.get("keep") or (f["gain_share"] is not None and f["gain_share"] >= KEEP)]
    bound = _bound(cats)
    mfu = _mfu(model, step_ns, devices, table)
    info = [_bound_finding(bound)] if path.pieces.height else []
    if mfu is not None and mfu.get("mfu") is not None:
        info.append(_mfu_finding(mfu, bound))
    rows = sorted(found, key=lambda f: (-f["gain_ns_per_step"], f["id"], f.get("rank") or 0))
    findings = pl.DataFrame([_row(f) for f in [*rows, *info]], schema=FINDING_SCHEMA)
    return {"step_ns": step_ns, "findings": findings, "bound": bound, "mfu": mfu}


def _mean_step(steps: pl.DataFrame) -> int | None:
    """The mean step time (the gains are means per step too); the path's when no steps."""
    col = steps.get_column("step_ns").drop_nulls()
    if col.len() == 0:
        col = steps.get_column("path_ns")
    mean = col.mean()
    return int(round(mean)) if mean is not None else None


def _time(ns: float) -> str:
    """A duration for a title: ms from 1 ms, else us, else ns."""
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us" if ns >= 1e3 \
        else f"{ns:.0f} ns"


def _ev(metric: str, value: float | None = None, unit: str | None = None,
        text: str | None = None) -> dict[str, Any]:
    return {"metric": metric, "value": None if value is None else float(value), "unit": unit,
            "text": text}


def _row(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in FINDING_SCHEMA}


def _with_severity(f: dict[str, Any]) -> dict[str, Any]:
    share = f["gain_share"] or 0.0
    level = "high" if share >= HIGH else "medium" if share >= MEDIUM else "low"
    cap, least = f.pop("max_severity", None), f.pop("min_severity", None)
    order = ["low", "medium", "high"]
    if cap is not None and order.index(level) > order.index(cap):
        level = cap
    if least is not None and order.index(level) < order.index(least):
        level = least
    f.pop("keep", None)
    return {**f, "severity": level}


# --- the findings ----------------------------------------------------------------------------

def _stragglers(path: CriticalPath, rows: pl.DataFrame, verdicts: pl.DataFrame | None,
                n_steps: int, step_ns: int | None) -> list[dict[str, Any]]:
    """The straggler finding, severity high, for the rank the straggler analysis flags
    (``analyses.stragglers`` on the dependency graph), and for no other rank: one answer
    everywhere (an unsure lead stays in ``stragglers``, with its low confidence). Its gain is
    what the path's jumps to it would lose were it as fast as the median rank; where the path
    does not jump to it, the wait its own time caused per step."""
    named = [] if verdicts is None else verdicts.filter(pl.col("flagged")).to_dicts()
    if not named:
        return []
    jumps = path.segments.filter(pl.col("kind") == "transfer")
    late = rows.group_by("instance").agg(
        last_rank=pl.col("last_rank").first(),
        lateness_ns=pl.col("arrival_ns").max() - pl.col("arrival_ns").sort(descending=True)
        .get(1, null_on_oob=True).fill_null(pl.col("arrival_ns").max())) \
        if rows.height else pl.DataFrame(schema={"instance": pl.String, "last_rank": pl.Int32,
                                                 "lateness_ns": pl.Int64})
    on_path = jumps.join(late, on="instance").filter(pl.col("to_rank") == pl.col("last_rank"))
    per_rank = {r["rank"]: r for r in on_path.join(
        jump_gains(path, rows), on="instance", how="left").group_by("to_rank").agg(
        jumps=pl.len(), late_ns=pl.col("lateness_ns").sum(),
        gain_ns=pl.col("gain_ns").fill_null(0).sum()).rename({"to_rank": "rank"}).to_dicts()} \
        if on_path.height else {}
    share = _rank_shares(path)
    out = []
    for verdict in named:
        rank = verdict["rank"]
        hops = per_rank.get(rank, {"jumps": 0, "late_ns": 0, "gain_ns": 0})
        gain = int(hops["gain_ns"]) // n_steps or int(verdict.get("caused_wait_per_step_ns") or 0)
        top = _top_op(path, rank)
        evidence = [
            _ev("lateness_on_path_ns_per_step", int(hops["late_ns"]) // n_steps, "ns"),
            _ev("jumps_to_rank_per_step", hops["jumps"] / n_steps, "count"),
            _ev("path_share", share.get(rank), "ratio"),
            _ev("flagged_by_stragglers", 1.0, "bool"),
            _ev("caused_wait_per_step_ns", verdict.get("caused_wait_per_step_ns"), "ns"),
            _ev("confidence_score", verdict.get("confidence_score"), "ratio",
                verdict.get("confidence")),
            _ev("evidence_steps", len(verdict.get("evidence_steps") or []), "count",
                ", ".join(map(str, verdict.get("evidence_steps") or []))),
            _ev("evidence_instances", len(verdict.get("evidence_instances") or []), "count",
                ", ".join(verdict.get("evidence_instances") or [])),
        ]
        if verdict.get("imposed_wait_per_step_ns") is not None:
            evidence.append(_ev("imposed_wait_per_step_ns", verdict["imposed_wait_per_step_ns"],
                                "ns"))
        if verdict.get("step_ratio") is not None:
            evidence.append(_ev("step_ratio", verdict["step_ratio"], "ratio"))
        if top is not None:
            evidence.append(_ev("top_op_on_path_ns_per_step", top[1] // n_steps, "ns", top[0]))
        what = f"; most of its path time is in {top[0]}" if top else ""
        out.append({
            "id": "straggler", "rank": rank, "gain_ns_per_step": gain, "keep": True,
            "title": (f"Rank {rank} holds the others back: its own time causes "
                      f"{_time(int(verdict.get('caused_wait_per_step_ns') or 0))} of waiting "
                      f"per step, {_time(gain)} per step on the path{what}"),
            "evidence": evidence, "min_severity": "high",
            "recommendation": RECOMMENDATIONS["straggler"].format(rank=rank),
        })
    return out


def jump_gains(path: CriticalPath, collective_rows: pl.DataFrame) -> pl.DataFrame:
    """``instance, gain_ns``: what each jump of the path would lose were its last arriver as
    fast as the median rank (module docstring)."""
    st = stretch_own(path, collective_rows)
    last = st.filter(pl.col("rank") == pl.col("to_rank")).select("instance", "own_ns")
    others = st.filter(pl.col("rank") != pl.col("to_rank")).group_by("instance").agg(
        median_own_ns=pl.col("own_ns").median())
    gain = (pl.col("own_ns") - pl.col("median_own_ns")).clip(0)
    return last.join(others, on="instance").select(
        "instance", gain_ns=pl.min_horizontal(gain, "own_ns").round(0).cast(pl.Int64))


def _rank_shares(path: CriticalPath) -> dict[int, float]:
    p = path.pieces.with_columns(_l=pl.col("end_ns") - pl.col("start_ns"))
    total = p.get_column("_l").sum()
    return {r: ns / total for r, ns in p.group_by("rank").agg(pl.col("_l").sum()).iter_rows()} \
        if total else {}


def _top_op(path: CriticalPath, rank: int) -> tuple[str, int] | None:
    p = path.pieces.filter((pl.col("rank") == rank) & (pl.col("category") != "idle")
                           & (pl.col("category") != "communication_transfer"))
    if p.height == 0:
        return None
    top = p.group_by("name").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum()).sort(
        "ns", "name", descending=[True, False]).row(0)
    return str(top[0]), int(top[1])


def _exposed_comm(path: CriticalPath, cats: dict[str, dict[str, Any]],
                  n_steps: int) -> dict[str, Any]:
    transfer = cats["communication_transfer"]["path_ns"]
    wait = cats["communication_wait"]["path_ns"]
    gain = (transfer + wait) // n_steps
    comm = path.pieces.filter(pl.col("category").is_in(["communication_transfer",
                                                        "communication_wait"]))
    evidence = [_ev("transfer_ns_per_step", transfer // n_steps, "ns"),
                _ev("wait_ns_per_step", wait // n_steps, "ns"),
                _ev("path_share", (cats["communication_transfer"]["share"] or 0)
                    + (cats["communication_wait"]["share"] or 0), "ratio")]
    if comm.height:
        top = comm.group_by("name").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
                                        n=pl.len()).sort("ns", descending=True).row(0)
        evidence.append(_ev("top_collective_ns_per_step", top[1] // n_steps, "ns", str(top[0])))
    return {"id": "exposed_communication", "rank": None, "gain_ns_per_step": gain,
            "title": f"Communication on the critical path: {_time(gain)} per step not "
                     "hidden under compute",
            "evidence": evidence, "recommendation": RECOMMENDATIONS["exposed_communication"]}


def _gap_findings(path: CriticalPath, gaps: pl.DataFrame | None, gpu_ranks: list[int],
                  n_steps: int) -> list[dict[str, Any]]:
    """Data loading, host syncs and launch-bound time on the path, by the cause of the GPU
    gap each piece lies in (GPU ranks); data loading on CPU-only ranks from the categories."""
    p = path.pieces.filter(pl.col("category").is_in(["launch_host", "idle", "data_loading"]))
    by_cause: dict[str, int] = {}
    if gpu_ranks:
        on_gpu = p.filter(pl.col("rank").is_in(gpu_ranks))
        gaps = gaps if gaps is not None else pl.DataFrame(
            schema={"rank": pl.Int32, "cause": pl.String, "gap_start_ns": pl.Int64,
                    "gap_end_ns": pl.Int64})
        windows = gaps.select(pl.col("rank").cast(pl.Int32), "cause",
                              window_start_ns="gap_start_ns", window_end_ns="gap_end_ns")
        # one device per rank: its gaps are disjoint (several: the union would be needed)
        windows = windows.unique(["rank", "window_start_ns"]).sort("rank", "window_start_ns")
        inside = clip(on_gpu, windows, by=["rank"], start="start_ns", end="end_ns",
                      window_keys=["cause"])
        by_cause = dict(inside.group_by("cause").agg(
            (pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows())
        # outside every gap (before a step's first kernel, say), launch/host time is the
        # host's and DataLoader time data loading's
        def length(frame: pl.DataFrame, category: str) -> int:
            return int(frame.filter(pl.col("category") == category).select(
                (pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)

        for category, cause in (("launch_host", "host"), ("data_loading", "data_loading")):
            outside = length(on_gpu, category) - length(inside, category)
            by_cause[cause] = by_cause.get(cause, 0) + max(outside, 0)
    cpu_loading = int(p.filter(~pl.col("rank").is_in(gpu_ranks)
                               & (pl.col("category") == "data_loading")).select(
        (pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)
    out = []
    loading = by_cause.get("data_loading", 0) + cpu_loading
    if loading:
        out.append({"id": "data_loading", "rank": None, "gain_ns_per_step": loading // n_steps,
                    "title": f"Input stalls on the critical path: {_time(loading / n_steps)} "
                             "per step waiting for the DataLoader",
                    "evidence": [_ev("data_loading_ns_per_step", loading // n_steps, "ns")],
                    "recommendation": RECOMMENDATIONS["data_loading"]})
    sync = by_cause.get("sync", 0)
    if sync:
        out.append({"id": "host_sync", "rank": None, "gain_ns_per_step": sync // n_steps,
                    "title": f"Host synchronisations idle the GPU on the path: "
                             f"{_time(sync / n_steps)} per step",
                    "evidence": [_ev("sync_gap_ns_per_step", sync // n_steps, "ns")],
                    "recommendation": RECOMMENDATIONS["host_sync"]})
    launch = by_cause.get("host", 0) + by_cause.get("launch_overhead", 0)
    if launch:
        kernels = path.pieces.filter(pl.col("rank").is_in(gpu_ranks)
                                     & (pl.col("category") == "compute"))
        evidence = [_ev("launch_gap_ns_per_step", launch // n_steps, "ns")]
        if kernels.height:
            evidence.append(_ev("median_kernel_piece_ns", kernels.select(
                (pl.col("end_ns") - pl.col("start_ns")).median()).item(), "ns"))
        out.append({"id": "launch_bound", "rank": None, "gain_ns_per_step": launch // n_steps,
                    "title": f"The GPU waits for launches on the path: "
                             f"{_time(launch / n_steps)} per step",
                    "evidence": evidence, "recommendation": RECOMMENDATIONS["launch_bound"]})
    return out


def _pageable(path: CriticalPath, n_steps: int) -> dict[str, Any] | None:
    copies = path.pieces.filter(pl.col("name").str.contains("(?i)pageable"))
    if copies.height == 0:
        return None
    ns = int(copies.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item())
    return {"id": "pageable_copy", "rank": None, "gain_ns_per_step": ns // 2 // n_steps,
            "title": f"Copies from pageable host memory on the path: {_time(ns / n_steps)} "
                     "per step",
            "evidence": [_ev("pageable_copy_ns_per_step", ns // n_steps, "ns")],
            "recommendation": RECOMMENDATIONS["pageable_copy"]}


def _alltoall_imbalance(alltoall: dict[str, Any] | None,
                        found: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The all-to-all imbalance finding (``analyses.alltoall``): the hot rank, its receive
    ratio, and as the gain the step time a balanced assignment of the same total would save
    (``cost_ns_per_step``). A straggler finding for the same rank stays (its gain is another
    what-if: the rank as fast as the median one), and says that the rank is the all-to-all's
    hot rank; its gain joins the evidence here."""
    if not alltoall or alltoall.get("hot_rank") is None \
            or not alltoall.get("cost_ns_per_step"):
        return None
    rank, ratio = int(alltoall["hot_rank"]), float(alltoall["imbalance"])
    cost = int(alltoall["cost_ns_per_step"])
    costs = alltoall.get("costs")
    lead = int(costs.get_column("lead_ns").sum()) // max(int(alltoall.get("steps") or 1), 1) \
        if costs is not None and costs.height else None
    evidence = [_ev("recv_ratio", ratio, "x", "received bytes over the mean, at each "
                    "step's most uneven exchange"),
                _ev("cost_ns_per_step", cost, "ns"),
                _ev("lead_ns_per_step", lead, "ns", "the others' wait for the hot rank after "
                    "the uneven exchanges"),
                _ev("cost_share", alltoall.get("cost_share"), "ratio")]
    straggler = next((f for f in found if f is not None and f.get("id") == "straggler"
                      and f.get("rank") == rank), None)
    if straggler is not None:
        evidence.append(_ev("straggler_gain_ns_per_step", straggler["gain_ns_per_step"], "ns",
                            "the straggler finding names this rank too"))
        straggler["title"] += (f"; it is the all-to-all's hot rank ({ratio:.2f}x the mean "
                               "volume: alltoall_imbalance)")
        straggler["evidence"] = [*straggler["evidence"],
                                 _ev("alltoall_recv_ratio", ratio, "x", "alltoall_imbalance")]
        straggler["recommendation"] = (
            f"Rank {rank} receives {ratio:.2f}x the mean all-to-all volume: balance the "
            "routing first (alltoall_imbalance). " + straggler["recommendation"])
    return {"id": "alltoall_imbalance", "rank": rank, "gain_ns_per_step": cost,
            "title": f"All-to-all imbalance: rank {rank} receives {ratio:.2f}x the mean "
                     f"volume; a balanced assignment would save {_time(cost)} per step",
            "evidence": evidence,
            "recommendation": RECOMMENDATIONS["alltoall_imbalance"].format(rank=rank,
                                                                          ratio=ratio)}


# --- what the run is bound by, and MFU --------------------------------------------------------

def _bound(cats: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Shares of the path: compute, communication (transfer + wait), input (data loading),
    host (launching), idle; ``bound``: the largest (``idle``: the path is mostly time where
    nothing recorded runs)."""
    s = {c: (v["share"] or 0.0) for c, v in cats.items()}
    shares = {"compute": s["compute"],
              "communication": s["communication_transfer"] + s["communication_wait"],
              "input": s["data_loading"], "host": s["launch_host"], "idle": s["idle"]}
    kinds = ("compute", "communication", "input", "host", "idle")
    bound = max(kinds, key=lambda k: shares[k]) if any(shares[k] for k in kinds) else None
    return {"bound": bound, "shares": shares}


def _bound_finding(bound: dict[str, Any]) -> dict[str, Any]:
    sh = bound["shares"]
    parts = ", ".join(f"{100 * sh[k]:.0f}% {k}" for k in
                      ("compute", "communication", "input", "host", "idle"))
    what = ("mostly idle: nothing recorded runs there (untraced work, or time outside the "
            "profiler)" if bound["bound"] == "idle" else f"{bound['bound']}-bound"
            if bound["bound"] else "not bound by any category")
    return {"id": "bound", "rank": None, "gain_ns_per_step": None, "gain_share": None,
            "severity": "info", "title": f"The run is {what}: the critical path is {parts}",
            "evidence": [_ev(f"{k}_share", v, "ratio") for k, v in sh.items()],
            "recommendation": RECOMMENDATIONS["bound"]}


def _device_name(devices: pl.DataFrame | None) -> str | None:
    if devices is None or "devices" not in devices.columns:
        return None
    for text in devices.get_column("devices").drop_nulls().to_list():
        names = json.loads(text) if isinstance(text, str) else list(text)
        if names:
            return str(names[0])
    return None


def _mfu(model: ModelSize, step_ns: int | None, devices: pl.DataFrame | None,
         table: tuple[Peak, ...]) -> dict[str, Any] | None:
    """MFU = model FLOPs per step / (step time x devices x peak FLOP/s of one device)."""
    flops = model.flops()
    if flops is None:
        return None
    device = model.device or _device_name(devices)
    n = devices.height if devices is not None and devices.height else 1
    found = peak_tflops(device, model.dtype, table=table) if model.peak_tflops is None else None
    peak = model.peak_tflops if model.peak_tflops is not None else (found.tflops if found
                                                                   else None)
    achieved = flops / (step_ns / 1e9) / n / 1e12 if step_ns else None
    note = None if peak is not None else (
        f"no peak for device {device!r} and dtype {model.dtype!r}: pass --peak-tflops")
    return {"flops_per_step": flops, "step_ns": step_ns, "devices": n, "device": device,
            "dtype": model.dtype, "achieved_tflops_per_device": achieved, "peak_tflops": peak,
            "peak_source": "user" if model.peak_tflops is not None else (
                found.source if found else None),
            "mfu": achieved / peak if achieved is not None and peak else None, "note": note}


def _mfu_finding(mfu: dict[str, Any], bound: dict[str, Any]) -> dict[str, Any]:
    return {"id": "mfu", "rank": None, "gain_ns_per_step": None, "gain_share": None,
            "severity": "info",
            "title": f"MFU {100 * mfu['mfu']:.1f}%: {mfu['achieved_tflops_per_device']:.1f} of "
                     f"{mfu['peak_tflops']:.1f} TFLOP/s per device ({mfu['device'] or 'device'}, "
                     f"{mfu['dtype']})",
            "evidence": [_ev("mfu", mfu["mfu"], "ratio"),
                         _ev("achieved_tflops_per_device", mfu["achieved_tflops_per_device"],
                             "TFLOP/s"),
                         _ev("peak_tflops", mfu["peak_tflops"], "TFLOP/s", mfu["peak_source"]),
                         _ev("flops_per_step", mfu["flops_per_step"], "FLOP")],
            "recommendation": RECOMMENDATIONS["mfu"] if bound["bound"] == "compute" else
            RECOMMENDATIONS["bound"]}
