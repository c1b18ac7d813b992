"""What to fix first: findings ranked by the path time each addresses.

Every gain is a "what if" on the critical path (:mod:`traceview.analyses.critical_path`),
per step of the path (definitions and a worked example: ``docs/metrics.md``, *Diagnose*):

* ``straggler`` (one per rank the straggler analysis flags): the replay's gain of the rank
  as fast as the typical rank (``rank=R:typical``, ``analyses.replay``: the mean step
  replayed less the mean step replayed with each of the rank's stretches at the other ranks'
  median); where there is no replay or it finds no gain, the wait the rank's own time caused
  per step (``stragglers``' ``caused_wait_per_step_ns``); its lateness on the path is
  evidence;
* ``exposed_communication``: communication on the path (transfer and wait) fully hidden
  under compute;
* the host's time on the path of a GPU rank (the GPU idle; ``path_summary.host_time``), by
  what the host runs there: ``runtime_call`` (one per named runtime call: allocations such
  as cudaMalloc, copies such as cudaMemcpyAsync, any other runtime call but launches and
  synchronisations), ``host_sync`` (synchronisation calls; other host time and idle time in
  GPU gaps caused by a sync or a blocking copy), ``launch_bound`` (launch calls and
  framework ops, idle time, in GPU gaps caused by the host or launch overhead and outside
  every gap), ``host_work`` (Python functions there), ``data_loading`` (DataLoader ops; time
  in data-loading gaps; DataLoader time on CPU-only ranks); the gain is that time removed;
* ``pageable_copy``: host-to-device copies from pageable memory on the path, at half their
  time (pinned copies run at about twice the bandwidth, and can overlap compute);
* ``kernels`` (one per kernel family holding ``KERNEL_SHARE`` of the path or more: matrix
  multiplies, attention, convolutions, ...): what the compute is made of; no gain (how much
  faster the kernels can run is not in the trace);
* ``roofline``: the op shapes with the most GPU time left on the table (time x (1 - the
  fraction of their roofline reached), ``analyses.ops``), the top three per step and GPU
  rank, capped at the compute on the path (``roofline_finding``);
* ``pipeline_bottleneck``: the clear bottleneck stage of a pipeline (``analyses.pipeline``) as
  fast as the median stage: its compute per step over the median stage's;
* ``several_stragglers``, ``intermittent_stall``, ``moving_stall``: the replay's verdicts
  where the straggler analysis flags nobody (``replay.findings``): several ranks each with
  their own gain and the combined gain replayed; one rank slow on a few steps, with them; a
  stall that moves between ranks, with no rank;
* ``bound`` and ``mfu``: the run's bound, the one ``summary``, ``overlap`` and the report name
  (``analyses.run_bound``: from the GPU time, given by the Run), with what the path is made of
  beside it under another name (``path``, ``path_shares``), and the model FLOPs utilisation
  when the model size is given (an MFU above 100% is refused, with a warning naming the
  likely wrong input); information, no gain.

Order: the findings whose gain is at least ``MEDIUM`` of the step, largest first; then the
kernel families, largest path time first; then the smaller gains; information last. Each
gain is one change made alone: gains do not add up (fixing the straggler can expose
communication that was hidden behind its lateness).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import polars as pl

from .advice_checks import (checked_comm_fix, checked_fix, lower_precision, op_dtypes,
                            op_names, precision_shares, startup, steady,
                            graph_launch)
from .critical_path import CriticalPath
from .flops import PEAK_TABLE, Peak
from .mfu import ModelSize, model_flops_utilisation
from .names import short_name
from .overlap import BOUND_NO_GPU, bound_of
from .path_summary import host_time, path_categories, path_steps
from .replay.findings import culprit_evidence, replay_findings
from .roofline_finding import roofline_finding
from .run_bound import bound_phrase

#: Gain thresholds, as a share of the median step time: ``high`` and ``medium`` severity;
#: below ``KEEP`` a finding is left out (noise, not worth a line on the to-do list).
HIGH, MEDIUM, KEEP = 0.10, 0.03, 0.01

#: A kernel family gets a finding from this share of the path on.
KERNEL_SHARE = 0.10

FINDING_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String, "title": pl.String, "severity": pl.String, "rank": pl.Int32,
    "gain_ns_per_step": pl.Int64, "gain_share": pl.Float64,
    "evidence": pl.List(pl.Struct({"metric": pl.String, "value": pl.Float64,
                                   "unit": pl.String, "text": pl.String})),
    "recommendation": pl.String,
    # added fields (the ones above are the contract as first published)
    "confidence": pl.String, "path_ns_per_step": pl.Int64, "path_share": pl.Float64,
    "name": pl.String,
    # "step": the gains are per step; "window": the trace has no steps, they are the window's
    "per": pl.String, "window_ns": pl.Int64,
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
    "launch_bound_graphed": (
        "The step already launches through CUDA/HIP graphs: capturing it again is not the "
        "lever. The GPU waits for the host between graph launches: capture "
        "more of the step in one graph (fewer, larger graphs), shrink the Python between "
        "replays (input preparation, bookkeeping), and prepare the next step while this one "
        "runs (asynchronous scheduling)."),
    "host_work": (
        "The GPU waits while the host runs Python code that launches no GPU work (input "
        "preprocessing, decoding, numpy, logging, tensor bookkeeping): move it out of the "
        "step (DataLoader workers with num_workers>0, preprocessing ahead of time or on the "
        "GPU), vectorise it, or overlap it with GPU work (prefetch the next batch while this "
        "one runs); Python in the model's own step goes with CUDA graphs or torch.compile."),
    "pageable_copy": (
        "Copy from pinned memory: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
        ".to(device, non_blocking=True)."),
    "pipeline_bottleneck": (
        "Rebalance the pipeline: move layers from stage {stage} (rank {rank}) to the stages "
        "that wait for it, or split its heaviest ops; more micro-batches shrink the bubble but "
        "not this. Compare its top ops with `traceview breakdown --ranks {rank}`."),
    "alltoall_imbalance": (
        "Balance the all-to-all: rank {rank} receives {ratio:.2f}x the mean volume, so its "
        "share of the work (an expert's tokens) takes longest and the others wait for it. "
        "Strengthen the router's load-balancing loss, cap expert capacity (capacity factor, "
        "dropping or rerouting overflow tokens), replicate the hot expert or place experts by "
        "measured load; `traceview alltoall` shows the volumes per rank and step."),
    "launch_bound_host": (
        "The host is slower than the GPU between launches, though the kernels are long enough "
        "that launch overhead alone does not explain it: see what the host runs there "
        "(py-spy, `traceview critical-path`), cut Python overhead with torch.compile, move "
        "host work off the launching thread."),
    "startup": (
        "Start-up (MPI_Init, CUDA context creation, device selection, the first copies to the "
        "device) runs once per process: CUDA graphs and launch tuning do not shorten it. "
        "Profile steady-state steps (a profiler schedule with wait and warmup steps, "
        "--skip-warmup N, an nsys capture range) to see what the loop itself waits for."),
    "bound": "Work on the largest share first; the findings above say how.",
    "mfu": (
        "Low MFU with a compute-bound path: use bf16/fp16 autocast or TF32 matmuls, larger "
        "matrices per kernel, torch.compile; check the top kernels with `traceview "
        "breakdown`."),
    "mfu_low_precision": (
        "Low MFU with a compute-bound path already in {precision}: larger matrices per kernel "
        "(fused projections, larger batch), fewer small kernels (torch.compile), dimensions "
        "that are multiples of 16 (32 for fp8); check the top kernels with `traceview ops`."),
}

#: Runtime calls by family (the first pattern that matches): what the host waits for in them.
RUNTIME_FAMILIES: tuple[tuple[str, str], ...] = (
    ("sync", r"(?i)^(cuda|hip)(Device|Stream|Event|Ctx)Synchroni[sz]e$"
             r"|^cu(Ctx|Stream|Event)Synchronize"),
    ("allocation", r"(?i)^(cuda|hip)(Malloc|Free|HostAlloc|HostRegister|HostUnregister)"
                   r"|^cuMem(Alloc|Free|HostAlloc|HostRegister|Create|Release|Map|Unmap"
                   r"|AddressReserve|AddressFree|SetAccess)"),
    ("copy", r"(?i)^(cuda|hip)Memcpy|^cuMemcpy"),
    ("launch", r"(?i)^(cuda|hip)(LaunchKernel|LaunchCooperativeKernel|LaunchKernelExC"
               r"|GraphLaunch|ExtLaunchKernel|ModuleLaunchKernel|ExtModuleLaunchKernel)"
               r"|^cu(LaunchKernel|LaunchCooperativeKernel|LaunchKernelEx|GraphLaunch)"),
    ("runtime", r"^(cuda|hip|cu|hsa)[A-Z]\w*$"),
)

#: A Python function as the profiler names it (``with_stack`` / ``python_function`` rows).
PYTHON_PATTERN = r"\.py\(\d+\): |^<built-in |^nn\.Module: "

CALL_FIXES: dict[str, str] = {
    "allocation": (
        "Allocate outside the loop: let PyTorch's caching allocator keep its memory (no "
        "torch.cuda.empty_cache() in the step; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "against fragmentation), reuse preallocated buffers and pinned staging buffers; in "
        "CUDA code allocate once up front, or from a stream-ordered pool (cudaMallocAsync, "
        "cudaMemPool), instead of cudaMalloc/cudaFree each iteration."),
    "copy": (
        "A copy call holds the host: a copy to or from pageable memory is synchronous, "
        "cudaMemcpyAsync included, and a device-to-host read waits for all the GPU work queued "
        "before it. Pin the host buffers (tensor.pin_memory(), DataLoader(pin_memory=True)) "
        "and copy with .to(device, non_blocking=True); keep the values the loop reads on the "
        "GPU (.item(), .cpu(), .tolist(), split sizes, Python branches on GPU values) or read "
        "them every N steps."),
    "runtime": (
        "Move {name} out of the step: create streams, events, handles and modules once, query "
        "device attributes once; per-step runtime calls should be launches and copies only. "
        "A process's first CUDA call also creates its context (seconds): where the trace "
        "holds start-up, profile later steps (--skip-warmup N, or a profiler schedule with "
        "wait and warmup steps)."),
}

#: Kernel families (the first pattern that matches a kernel's name), each with its fix.
KERNEL_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("copy", "GPU copies", r"^Memcpy|^Memset",
     "Copy less: avoid needless .contiguous(), .clone(), dtype casts and torch.cat in the step; "
     "copy from pinned memory with non_blocking=True on a side stream so copies overlap "
     "compute."),
    ("attention", "Attention", r"(?i)flash|fmha|attention|attn|sdpa|mha_|_mha",
     "Use fused attention: torch.nn.functional.scaled_dot_product_attention (flash or "
     "memory-efficient backend) or FlashAttention, in bf16/fp16, with sequence lengths that "
     "are multiples of 64."),
    ("embedding", "Embedding", r"(?i)embedding|fbgemm|tbe_",
     "Embedding lookups: fused table-batched kernels (FBGEMM TBE), deduplicated and sorted "
     "indices, row-wise optimisers fused into backward."),
    ("reduction", "Normalisation and reduction",
     r"(?i)norm|\bbn_|_bn_|softmax|reduce|reduction|welford|triton_red|triton_per|cub::"
     r"|argmax|topk|sort",
     "Memory-bound reductions (norms, softmax, sums): fuse them with their neighbours "
     "(torch.compile), use fused implementations (fused LayerNorm/RMSNorm, fused optimisers)."),
    # MIOpen's implicit-GEMM convolutions: igemm_{fwd,bwd,wrw}_gtc* (before "gemm" below)
    ("convolution", "Convolution", r"(?i)conv|cudnn|winograd|dgrad|wgrad|fprop|miopen"
                                   r"|igemm_(fwd|bwd|wrw)",
     "Convolutions: torch.backends.cudnn.benchmark = True, channels_last memory format, "
     "bf16/fp16 autocast."),
    # CUTLASS's tensor-core tiles (cutlass_80_tensorop_...), not MIOpen's elementwise
    # SubTensorOp*/OpTensor* kernels (a MI210 trace's casts read as matrix multiplies);
    # Tensile's Cijk_* (hipBLASLt and rocBLAS GEMMs on AMD, read as "other" before)
    ("gemm", "Matrix-multiply", r"(?i)gemm|cublas|cutlass|matmul|xmma|nvjet|hipblas|rocblas"
                                r"|wmma|(^|_)tensorop_|\bbmm|addmm|^Cijk_",
     "Matrix multiplies: bf16/fp16 autocast or TF32 (torch.backends.cuda.matmul.allow_tf32 = "
     "True), dimensions that are multiples of 8 (16 for fp8), more work per kernel (larger "
     "batch); compare the achieved FLOP/s with the peak (diagnose --params and "
     "--tokens-per-step give MFU)."),
    ("elementwise", "Elementwise",
     r"(?i)elementwise|vectorized|unrolled|pointwise|triton_poi|triton_|fill|copy_kernel"
     r"|catarray|index|gather|scatter|multi_tensor_apply|foreach|transpose|permute"
     r"|nchwtonhwc|nhwctonchw|subtensorop|optensor",
     "Memory-bound elementwise kernels: fuse them (torch.compile), use foreach/fused "
     "optimisers (fused=True), avoid extra casts and copies."),
    ("other", "Other", r".",
     "Look at the top kernels with a kernel profiler (Nsight Compute, ncu, on NVIDIA GPUs; "
     "rocprof-compute on AMD GPUs): occupancy, memory throughput, tensor-core (matrix-core) "
     "use."),
)


#: Kernels at or above this median length on the path: launch overhead (a few µs a launch)
#: does not explain the GPU's wait, so CUDA graphs are not advised for it.
GRAPH_KERNEL_NS = 100_000


def diagnose(path: CriticalPath, *, collective_rows: pl.DataFrame,
             stragglers: pl.DataFrame | None = None, gaps: pl.DataFrame | None = None,
             gpu_ranks: tuple[int, ...] = (), devices: pl.DataFrame | None = None,
             model: ModelSize = ModelSize(), host: pl.DataFrame | None = None,
             table: tuple[Peak, ...] = PEAK_TABLE,
             pipeline: dict[str, Any] | None = None,
             alltoall: dict[str, Any] | None = None,
             ops: pl.DataFrame | None = None,
             replayed: dict[int, tuple[float, bool]] | None = None,
             bound: dict[str, Any] | None = None,
             replay_verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    """``findings`` (``FINDING_SCHEMA``, in the module docstring's order, information last),
    ``bound``, ``mfu``, ``step_ns`` (the mean step time the gains are shares of) and
    ``notes`` (warnings: a refused MFU).

    ``collective_rows``: ``collectives.collective_ranks`` (aligned); ``stragglers``:
    ``stragglers.stragglers`` (None: one rank); ``gaps``: ``gaps.gaps`` per device (None:
    no GPU) on ``gpu_ranks``, the ranks with GPU work; ``devices``: the ranks table (``rank``,
    ``devices`` as JSON text, ``world_size``); ``host``: ``host.host_events`` rows (on each
    rank's clock), to tell Python functions that launch GPU work from those that do not
    (None: none does); ``pipeline``: ``analyses.pipeline.pipeline`` (None: no send/recv
    pairs); ``alltoall``: the all-to-all answer (``alltoall.alltoall``), when the run has
    any; ``ops``: ``analyses.ops.ops`` rows by shape (the roofline finding; None: none);
    ``replayed``: per straggler rank, the replay's gain of making it typical and whether the
    replay is trusted (``analyses.replay``): the straggler's gain (None: no replay, the wait
    the rank caused stands in); ``replay_verdict``: the replay's culprits
    (``replay.verdicts.culprits``, with ``not_reproduced``), whose several stragglers,
    intermittent and moving stalls are findings where the straggler analysis flags nobody
    (``replay.findings``);
    ``bound``: the run's bound (``run_bound.run_bound``; None: not known, as of a bare path)."""
    steps = path_steps(path)
    n_steps = max(steps.height, 1)
    step_ns = _mean_step(steps)
    cats = path_categories(path)
    total = sum(v["path_ns"] for v in cats.values())
    owned_dtypes = op_dtypes(ops)
    found: list[dict[str, Any]] = []
    causes = (replay_verdict or {}).get("not_reproduced") or []
    found += _stragglers(path, collective_rows, stragglers, n_steps, replayed, causes)
    for f in found:  # the replay's other culprits, beside the flagged one
        f["evidence"] += culprit_evidence(replay_verdict, f["rank"])
    flagged = [] if stragglers is None or "flagged" not in stragglers.columns else \
        stragglers.filter(pl.col("flagged")).get_column("rank").to_list()
    found += replay_findings(replay_verdict, flagged=flagged, causes=causes)
    found.append(_exposed_comm(path, cats, n_steps))
    found += _host_findings(path, gaps, sorted(gpu_ranks), n_steps, total, host)
    found.append(_pageable(path, n_steps))
    found.append(pipeline_bottleneck(pipeline))
    found += _kernel_findings(path, sorted(gpu_ranks), n_steps, total, owned_dtypes,
                              op_names(ops))
    found.append(roofline_finding(ops, n_steps=n_steps, gpu_ranks=len(gpu_ranks),
                                  path_compute_ns_per_step=cats["compute"]["per_step_ns"]))
    found.append(_alltoall_imbalance(alltoall, found))
    found = [f for f in found if f is not None]
    confidence = _straggler_confidence(stragglers)
    for f in found:
        gain = f["gain_ns_per_step"]
        f["gain_share"] = gain / step_ns if step_ns and gain is not None else None
        f.setdefault("path_ns_per_step", gain)  # a straggler: its excess own time
        f["path_share"] = f["path_ns_per_step"] * n_steps / total if total else None
        if f["id"] == "straggler":
            f.setdefault("confidence", confidence.get(f["rank"], "low"))
        f.setdefault("confidence", "low")  # never None: a finding that does not say is unsure
    found = [_with_severity(f) for f in found if f.get("keep") or _kept(f)]
    bound = _bound(cats, cpu_only=not gpu_ranks, run=bound)
    mfu = model_flops_utilisation(model, step_ns, devices, table)
    info = [_bound_finding(bound)] if path.pieces.height else []
    if mfu is not None and mfu.get("mfu") is not None:
        info.append(_mfu_finding(mfu, bound, _path_precision(path, sorted(gpu_ranks),
                                                            owned_dtypes)))
    notes = [mfu["warning"]] if mfu is not None and mfu.get("warning") else []
    rows = _cause_first(sorted(found, key=_order))
    # without steps every gain is the window's: said so, with the window's length
    windowed = path.steps.height == 0
    for f in [*rows, *info]:
        f["per"], f["window_ns"] = ("window", total) if windowed else ("step", None)
        if windowed:
            f["title"] = in_the_window(f["title"], total)
    findings = pl.DataFrame([_row(f) for f in [*rows, *info]], schema=FINDING_SCHEMA)
    return {"step_ns": step_ns, "findings": findings, "bound": bound, "mfu": mfu,
            "notes": notes}


def in_the_window(text: str, window_ns: int) -> str:
    """``text`` with "per step" said of the window: a trace without steps has no step to
    divide by, so its gains are the window's (of ``window_ns``)."""
    return re.sub(r"\bper step\b", f"in the window ({_time(window_ns)})", text)


def _path_precision(path: CriticalPath, gpu_ranks: list[int],
                    op_dtypes: dict[str, str]) -> tuple[float, list[str]]:
    """The compute on the path: the share of its known-precision time below fp32, and
    those precisions (``advice_checks.lower_precision``)."""
    p = path.pieces.filter(pl.col("rank").is_in(gpu_ranks) & (pl.col("category") == "compute"))
    per_name = p.group_by("name").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
    return lower_precision(precision_shares(dict(per_name.drop_nulls("name").iter_rows()),
                                            op_dtypes))


def _cause_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The all-to-all imbalance or pipeline bottleneck that explains a straggler and that
    straggler's finding, together where the earlier of the two ranks, the cause first: the
    same rank, and its cause is what to fix."""
    out = list(rows)
    for f in rows:
        if f["id"] != "straggler":
            continue
        cause = next((c for c in out if c["id"] in ("alltoall_imbalance", "pipeline_bottleneck")
                      and c.get("rank") == f["rank"]), None)
        if cause is not None:
            at = min(out.index(cause), out.index(f))
            out.remove(cause)
            out.remove(f)
            out[at:at] = [cause, f]
    return out


def _kept(f: dict[str, Any]) -> bool:
    """A finding worth a line: its gain is at least ``KEEP`` of the step (a kernel family,
    without a gain: it holds ``KERNEL_SHARE`` of the path, checked where it is made)."""
    if f["gain_ns_per_step"] is None:
        return True
    return f["gain_share"] is not None and f["gain_share"] >= KEEP


def _order(f: dict[str, Any]) -> tuple:
    """Known gains of at least ``MEDIUM`` of the step first, largest first; then the kernel
    families (no gain), by path time; then the smaller gains."""
    gain = f["gain_ns_per_step"]
    if gain is None:
        tier, key = 1, f["path_ns_per_step"] or 0
    else:
        tier, key = (0 if (f["gain_share"] or 0) >= MEDIUM else 2), gain
    return tier, -key, f["id"], f.get("rank") or 0, f.get("name") or ""


def _straggler_confidence(verdicts: pl.DataFrame | None) -> dict[int, str]:
    """Each rank's straggler verdict confidence (``stragglers.stragglers``), when given."""
    if verdicts is None or "confidence" not in verdicts.columns:
        return {}
    return {r: c for r, c in verdicts.select("rank", "confidence").iter_rows() if c}


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
    share = f["gain_share"] if f["gain_ns_per_step"] is not None else f.get("path_share")
    level = "high" if (share or 0.0) >= HIGH else "medium" if (share or 0.0) >= MEDIUM else "low"
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
                n_steps: int, replayed: dict[int, tuple[float, bool]] | None = None,
                causes: list[str] | None = None) -> list[dict[str, Any]]:
    """The straggler finding, severity high, for the rank the straggler analysis flags
    (``analyses.stragglers`` on the dependency graph), and for no other rank: one answer
    everywhere (an unsure lead stays in ``stragglers``, with its low confidence). Its gain is
    the replay's (issue 46): the mean step replayed less the mean step replayed with the rank
    typical (``replayed``), trusted or not (an untrusted replay's evidence names what does not
    reproduce, ``causes``). Where there is no replay, or it finds no gain (a dependency it
    does not see, as a collective whose group the matcher could not tell), the wait the
    rank's own time caused per step (the straggler analysis's figure) stands in, and the
    evidence says so."""
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
    per_rank = {r["rank"]: r for r in on_path.group_by("to_rank").agg(
        jumps=pl.len(), late_ns=pl.col("lateness_ns").sum()).rename(
        {"to_rank": "rank"}).to_dicts()}
    share = _rank_shares(path)
    causes = causes or []
    out = []
    for verdict in named:
        rank = verdict["rank"]
        hops = per_rank.get(rank, {"jumps": 0, "late_ns": 0})
        caused = int(verdict.get("caused_wait_per_step_ns") or 0)
        replay_gain, trusted = replayed.get(rank, (None, False)) if replayed else (None, False)
        replay_gain_kept = replay_gain is not None and replay_gain > 0
        gain = int(round(replay_gain)) if replay_gain_kept else caused
        top = _top_op(path, rank)
        evidence = [
            _ev("lateness_on_path_ns_per_step", int(hops["late_ns"]) // n_steps, "ns"),
            _ev("jumps_to_rank_per_step", hops["jumps"] / n_steps, "count"),
            _ev("path_share", share.get(rank), "ratio"),
            _ev("flagged_by_stragglers", 1.0, "bool"),
            _ev("caused_wait_per_step_ns", verdict.get("caused_wait_per_step_ns"), "ns",
                None if replay_gain_kept else "the finding's gain: the replay has none to give"),
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
        if replay_gain is not None:
            evidence.append(_ev("replay_gain_ns_per_step", int(round(replay_gain)), "ns",
                                "replayed with the rank typical" +
                                ("" if trusted else " (the replay is not trusted)")))
        what = f"; most of its path time is in {top[0]}" if top else ""
        if replay_gain is not None and not trusted:  # what the replay cannot reproduce
            evidence.append(_ev("replay_not_reproduced", len(causes), "count",
                                "; ".join(causes[:5]) or "replay error p90 above 5%"))
        out.append({
            "id": "straggler", "rank": rank, "gain_ns_per_step": gain, "keep": True,
            "title": (f"Rank {rank} holds the others back: its own time causes "
                      f"{_time(caused)} of waiting per step"
                      + (f", {_time(gain)} per step replayed" if replay_gain_kept else "")
                      + what),
            "evidence": evidence, "min_severity": "high",
            "recommendation": RECOMMENDATIONS["straggler"].format(rank=rank),
        })
    return out


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
    fix = RECOMMENDATIONS["exposed_communication"]
    if comm.height:
        per_name = comm.group_by("name").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
                                             n=pl.len()).sort("ns", descending=True)
        top = per_name.row(0)
        evidence.append(_ev("top_collective_ns_per_step", top[1] // n_steps, "ns", str(top[0])))
        # an MoE job's exposed all-to-all is not moved by DDP buckets or FSDP prefetch
        fix, checked = checked_comm_fix(fix, dict(zip(per_name.get_column("name").cast(
            pl.String).fill_null("").to_list(), per_name.get_column("ns").to_list(),
            strict=True)))
        evidence += checked
    return {"id": "exposed_communication", "rank": None, "gain_ns_per_step": gain,
            "confidence": "high",
            "title": f"Communication on the critical path: {_time(gain)} per step not "
                     "hidden under compute",
            "evidence": evidence, "recommendation": fix}


def _family(name: str | None,
            families: tuple[tuple[str, str], ...] = RUNTIME_FAMILIES) -> str | None:
    """The family of the first pattern of ``families`` matching ``name``."""
    for family, pattern in families:
        if name is not None and re.search(pattern, name):
            return family
    return None


#: Why a GPU gap happened -> the finding its host time goes to (None: the host's own work:
#: ``launch_bound``, or ``host_work`` for Python). Causes not listed (``between_steps`` for
#: idle time, ``graph``, ``other``: the GPU waited for something else) go to no finding.
_BY_CAUSE: dict[str | None, str | None] = {
    "sync": "host_sync", "blocking_copy": "host_sync", "data_loading": "data_loading",
    "host": None, "launch_overhead": None, "between_steps": None, None: None}


def _topic(category: str, name: str | None, cause: str | None,
           launching: frozenset[str] = frozenset()) -> tuple[str | None, bool]:
    """Which finding a stretch of host time on the path goes to, and whether it says so
    directly (the host is in the named call, DataLoader op or Python function, or runs the
    ops that launch) rather than through the cause of the GPU gap it lies in. A Python
    function in ``launching`` launches GPU work: its time is the launches' overhead."""
    if category == "data_loading":
        return "data_loading", True
    if category == "launch_host":
        family = _family(name)
        if family == "sync":
            return "host_sync", True
        if family in ("allocation", "copy", "runtime"):
            return "runtime_call", True
        python = name is not None and re.search(PYTHON_PATTERN, name) is not None
        own = "host_work" if python and name not in launching else "launch_bound"
        if cause not in _BY_CAUSE:
            return None, False
        topic = _BY_CAUSE[cause] or own
        return topic, topic == own
    if cause is None or cause == "between_steps" or cause not in _BY_CAUSE:
        return None, False  # nothing recorded runs, and the GPU did not wait for the host
    return _BY_CAUSE[cause] or "launch_bound", False


def _confidence(direct: float, total: float) -> str:
    """``high`` when at least 80% of a finding's time is named on the path (the call, op or
    kernel runs there), ``medium`` from 50%, else ``low`` (inferred from the GPU gaps'
    causes)."""
    share = direct / total if total else 0.0
    return "high" if share >= 0.8 else "medium" if share >= 0.5 else "low"


def launching_functions(host: pl.DataFrame | None, names: list[str]) -> frozenset[str]:
    """The Python functions of ``names`` that launch GPU work: one of their calls in
    ``host`` contains a launch call (``RUNTIME_FAMILIES`` ``launch``) on the same thread.
    Two as-of joins per call: the first launch at or after its start, the last before its
    end."""
    if host is None or not names or host.height == 0:
        return frozenset()
    timed = host.filter(pl.col("dur_ns").is_not_null()).with_columns(
        pl.col("name").cast(pl.String), tid=pl.col("tid").cast(pl.Int64).fill_null(-1)
        if "tid" in host.columns else pl.lit(-1, pl.Int64))
    launch = dict(RUNTIME_FAMILIES)["launch"]
    launches = (timed.filter(pl.col("kind").cast(pl.String).is_in(["cuda_runtime",
                                                                    "cuda_driver"])
                             & pl.col("name").str.contains(launch))
                .select("rank", "tid", _t="ts_ns").sort("rank", "tid", "_t")
                .with_columns(_k=pl.int_range(pl.len()).over("rank", "tid")).sort("_t"))
    calls = (timed.filter(pl.col("name").is_in(names))
             .select("rank", "tid", "name", "ts_ns", _end=pl.col("ts_ns") + pl.col("dur_ns")))
    if launches.height == 0 or calls.height == 0:
        return frozenset()
    first = calls.sort("ts_ns").join_asof(launches.rename({"_k": "_k1"}), left_on="ts_ns",
                                          right_on="_t", by=["rank", "tid"],
                                          strategy="forward", check_sortedness=False)
    both = first.drop("_t").sort("_end").join_asof(
        launches.rename({"_k": "_k2"}), left_on="_end", right_on="_t", by=["rank", "tid"],
        strategy="backward", allow_exact_matches=False, check_sortedness=False)
    hit = both.filter(pl.col("_k1").is_not_null() & pl.col("_k2").is_not_null()
                      & (pl.col("_k2") >= pl.col("_k1")))
    return frozenset(hit.get_column("name").unique().to_list())


def _host_findings(path: CriticalPath, gaps: pl.DataFrame | None, gpu_ranks: list[int],
                   n_steps: int, total: int,
                   host: pl.DataFrame | None = None) -> list[dict[str, Any]]:
    """The host's time on the path of GPU ranks (the GPU idle), by what the host runs there
    (``_topic``): one finding per named runtime call, host synchronisations, launches,
    Python work, data loading (with the path's DataLoader time on CPU-only ranks)."""
    rows = host_time(path, gaps, gpu_ranks) if gpu_ranks else pl.DataFrame(
        schema={"category": pl.String, "name": pl.String, "cause": pl.String,
                "path_ns": pl.Int64})
    python = [n for n in rows.get_column("name").drop_nulls().unique().to_list()
              if re.search(PYTHON_PATTERN, n)]
    launching = launching_functions(host, python)
    early = _startup_time(path, gaps, gpu_ranks)
    begun: dict[str, int] = {}  # start-up time by name: never the step's launch overhead
    per: dict[str, dict[str, Any]] = {}
    calls: dict[str, dict[str, int]] = {}
    for category, name, cause, ns in rows.iter_rows():
        topic, direct = _topic(category, name, cause, launching)
        if topic is None:
            continue
        if topic in ("launch_bound", "host_work"):
            first = min(early.get((category, name, cause), 0), ns)
            if first:
                begun[name or "(idle)"] = begun.get(name or "(idle)", 0) + first
                ns -= first
            if ns <= 0:
                continue
        if topic == "runtime_call":
            c = calls.setdefault(name, {"ns": 0, "pageable": 0})
            c["ns"] += ns
            c["pageable"] += ns if cause == "blocking_copy" else 0
            continue
        t = per.setdefault(topic, {"ns": 0, "direct": 0, "names": {}})
        t["ns"] += ns
        if direct:
            t["direct"] += ns
            t["names"][name] = t["names"].get(name, 0) + ns
    cpu_loading = int(path.pieces.filter(~pl.col("rank").is_in(gpu_ranks)
                                         & (pl.col("category") == "data_loading")).select(
        (pl.col("end_ns") - pl.col("start_ns")).sum()).item() or 0)
    if cpu_loading:
        t = per.setdefault("data_loading", {"ns": 0, "direct": 0, "names": {}})
        t["ns"] += cpu_loading
        t["direct"] += cpu_loading
    out = [_call_finding(name, c, n_steps, total) for name, c in calls.items()]
    for topic, t in per.items():
        out.append(_host_finding(topic, t, path, gpu_ranks, n_steps))
    out.append(_startup_finding(begun, n_steps, total))
    return [f for f in out if f is not None]


def _startup_time(path: CriticalPath, gaps: pl.DataFrame | None,
                  gpu_ranks: list[int]) -> dict[tuple, int]:
    """The host time on the path that is start-up, by ``host_time``'s (category, name,
    cause): in a start-up call (``advice_checks.STARTUP_PATTERN``: MPI_Init, context
    creation, first copies), or before the rank's first GPU work and outside every step when
    the window opens on start-up: a trace with steps (before them), or a start-up call before
    that first GPU work. A window without steps and without a start-up call was opened on a
    running loop: its first host time is the steady state's. Launches and compiled graphs'
    calls (``advice_checks.STEADY_PATTERN``: ``hipGraphLaunch``, ``CompiledFxGraph``) are
    never start-up: they launch the first GPU work, the step's own launch overhead."""
    if not gpu_ranks or path.pieces.height == 0:
        return {}
    first = path.busy.group_by("rank").agg(_first=pl.col("ts_ns").min()) \
        if path.busy.height else pl.DataFrame(schema={"rank": pl.Int32, "_first": pl.Int64})
    named = path.pieces.get_column("name").cast(pl.String).unique().drop_nulls().to_list()
    starting = [n for n in named if startup(n)]
    launching = [n for n in named if steady(n) and not startup(n)]
    early = (pl.col("_first").is_null() | (pl.col("end_ns") <= pl.col("_first"))) \
        & (pl.col("step").is_null() if path.steps.height else pl.lit(True))
    p = path.pieces.join(first.with_columns(pl.col("rank").cast(path.pieces.schema["rank"])),
                         on="rank", how="left")
    opens_on_startup = pl.lit(True) if path.steps.height else \
        (early & pl.col("name").is_in(starting)).any().over("rank")
    p = p.filter(pl.col("name").is_in(starting)
                 | (early & opens_on_startup & ~pl.col("name").is_in(launching))).drop("_first")
    if p.height == 0:
        return {}
    rows = host_time(dataclasses.replace(path, pieces=p), gaps, gpu_ranks)
    return {(c, n, cause): ns for c, n, cause, ns in rows.iter_rows()}


def _startup_finding(begun: dict[str, int], n_steps: int, total: int) -> dict[str, Any] | None:
    """Start-up on the path (``_startup_time``): said as such, with no CUDA-graph or launch
    advice; no gain (it is not the loop's). None below ``KEEP`` of the path."""
    ns = sum(begun.values())
    if not total or ns / total < KEEP:
        return None
    top = _top(begun)
    assert top is not None
    return {"id": "startup", "rank": None, "name": top[0], "gain_ns_per_step": None,
            "path_ns_per_step": ns // n_steps, "confidence": "high", "max_severity": "medium",
            "title": f"Start-up on the critical path: {_time(ns / n_steps)} per step before "
                     f"the first GPU work or in start-up calls (mostly "
                     f"{short_name(top[0], 50)}): not the steady state",
            "evidence": [_ev("startup_ns_per_step", ns // n_steps, "ns"),
                         _ev("top_startup_ns_per_step", top[1] // n_steps, "ns", top[0])],
            "recommendation": RECOMMENDATIONS["startup"]}


def _share_text(ns: float, total: int) -> str:
    return f"{100 * ns / total:.1f}%" if total else "-"


def _call_finding(name: str, c: dict[str, int], n_steps: int, total: int) -> dict[str, Any]:
    """A runtime call holding path time: allocation, copy, or any other call (not launches,
    not synchronisations)."""
    family = _family(name) or "runtime"
    per_step = c["ns"] // n_steps
    what = {"allocation": "allocating memory while the GPU idles",
            "copy": "in copies that hold the host" + (
                ", to or from pageable memory" if c["pageable"] else ""),
            }.get(family, "in this runtime call while the GPU idles")
    evidence = [_ev("call_ns_per_step", per_step, "ns", name),
                _ev("path_share", c["ns"] / total if total else None, "ratio")]
    if family == "copy":
        evidence.append(_ev("in_blocking_copy_gaps_ns_per_step", c["pageable"] // n_steps,
                            "ns", "GPU gaps where a copy to or from pageable memory held the "
                                  "host"))
    return {"id": "runtime_call", "rank": None, "name": name, "gain_ns_per_step": per_step,
            "confidence": "high",
            "title": f"{name} holds {_share_text(c['ns'], total)} of the critical path: "
                     f"{_time(per_step)} per step {what}",
            "evidence": evidence,
            "recommendation": CALL_FIXES[family].format(name=name)}


def _top(names: dict[str, int]) -> tuple[str, int] | None:
    if not names:
        return None
    name, ns = min(names.items(), key=lambda kv: (-kv[1], kv[0]))
    return name, ns


def _host_finding(topic: str, t: dict[str, Any], path: CriticalPath, gpu_ranks: list[int],
                  n_steps: int) -> dict[str, Any]:
    ns, per_step = t["ns"], t["ns"] // n_steps
    top = _top(t["names"])
    base = {"id": topic, "rank": None, "gain_ns_per_step": per_step,
            "confidence": _confidence(t["direct"], ns), "recommendation": RECOMMENDATIONS[topic],
            "name": top[0] if top else None}
    top_ev = [_ev("top_op_ns_per_step", top[1] // n_steps, "ns", top[0])] if top else []
    if topic == "data_loading":
        return {**base, "title": f"Input stalls on the critical path: {_time(ns / n_steps)} "
                                 "per step waiting for the DataLoader",
                "evidence": [_ev("data_loading_ns_per_step", per_step, "ns"), *top_ev]}
    if topic == "host_sync":
        mostly = f" (mostly in {top[0]})" if top else ""
        return {**base, "title": f"Host synchronisations idle the GPU on the path: "
                                 f"{_time(ns / n_steps)} per step{mostly}",
                "evidence": [_ev("sync_gap_ns_per_step", per_step, "ns"),
                             _ev("sync_call_ns_per_step", t["direct"] // n_steps, "ns",
                                 top[0] if top else None)]}
    if topic == "host_work":
        return {**base, "title": f"The GPU waits while the host runs Python that launches "
                                 f"no GPU work: {_time(ns / n_steps)} per step, mostly in "
                                 f"{short_name(top[0] if top else None, 60)}",
                "evidence": [_ev("python_ns_per_step", per_step, "ns"), *top_ev]}
    kernels = path.pieces.filter(pl.col("rank").is_in(gpu_ranks)
                                 & (pl.col("category") == "compute"))
    evidence = [_ev("launch_gap_ns_per_step", per_step, "ns")]
    if kernels.height:
        evidence.append(_ev("median_kernel_piece_ns", kernels.select(
            (pl.col("end_ns") - pl.col("start_ns")).median()).item(), "ns"))
    evidence += top_ev
    mostly = f" (mostly in {short_name(top[0], 50)})" if top else ""
    median = evidence[1]["value"] if len(evidence) > 1 and \
        evidence[1]["metric"] == "median_kernel_piece_ns" else None
    if median is not None and median >= GRAPH_KERNEL_NS:  # long kernels: not launch overhead
        base["recommendation"] = RECOMMENDATIONS["launch_bound_host"]
    replays = sum(v for n, v in t["names"].items() if graph_launch(n))
    if top and (graph_launch(top[0]) or replays * 2 >= sum(t["names"].values())):
        # mostly (the title's "mostly in", or half the named time) graph launches: the step
        # is captured already (a compiled graph launching kernel by kernel is not: there
        # reduce-overhead still applies)
        base["recommendation"] = RECOMMENDATIONS["launch_bound_graphed"]
    return {**base, "title": f"The GPU waits for launches on the path: "
                             f"{_time(ns / n_steps)} per step{mostly}",
            "evidence": evidence}


def _pageable(path: CriticalPath, n_steps: int) -> dict[str, Any] | None:
    copies = path.pieces.filter(pl.col("name").str.contains("(?i)pageable"))
    if copies.height == 0:
        return None
    ns = int(copies.select((pl.col("end_ns") - pl.col("start_ns")).sum()).item())
    return {"id": "pageable_copy", "rank": None, "gain_ns_per_step": ns // 2 // n_steps,
            "path_ns_per_step": ns // n_steps, "confidence": "medium",
            "title": f"Copies from pageable host memory on the path: {_time(ns / n_steps)} "
                     "per step",
            "evidence": [_ev("pageable_copy_ns_per_step", ns // n_steps, "ns")],
            "recommendation": RECOMMENDATIONS["pageable_copy"]}


def _kernel_findings(path: CriticalPath, gpu_ranks: list[int], n_steps: int,
                     total: int, op_dtypes: dict[str, str] | None = None,
                     owners: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One finding per kernel family (``KERNEL_FAMILIES``) holding at least ``KERNEL_SHARE``
    of the path in GPU compute pieces (copies from pageable memory are ``pageable_copy``'s).
    The fix is checked against the family's kernels (``advice_checks.checked_fix``): no precision advice
    to kernels already below fp32, no "use FlashAttention" to fused attention."""
    p = path.pieces.filter(pl.col("rank").is_in(gpu_ranks) & (pl.col("category") == "compute")
                           & ~pl.col("name").str.contains("(?i)pageable"))
    if p.height == 0 or not total:
        return []
    per_name = p.group_by("name").agg(ns=(pl.col("end_ns") - pl.col("start_ns")).sum())
    families = [(key, label, pattern, fix) for key, label, pattern, fix in KERNEL_FAMILIES]
    found: dict[str, dict[str, Any]] = {}
    for name, ns in per_name.iter_rows():
        key = _family(name, tuple((k, pat) for k, _, pat, _ in families)) or "other"
        f = found.setdefault(key, {"ns": 0, "names": {}})
        f["ns"] += ns
        f["names"][name] = ns
    out = []
    for key, label, _, fix in families:
        f = found.get(key)
        if f is None or f["ns"] / total < KERNEL_SHARE:
            continue
        per_step = f["ns"] // n_steps
        top = _top(f["names"])
        assert top is not None
        fix, checked = checked_fix(key, fix, f["names"], op_dtypes or {}, owners)
        out.append({
            "id": "kernels", "rank": None, "name": key, "gain_ns_per_step": None,
            "path_ns_per_step": per_step, "confidence": "high",
            "title": f"{label} kernels hold {_share_text(f['ns'], total)} of the critical "
                     f"path: {_time(per_step)} per step (top: {short_name(top[0], 50)})",
            "evidence": [_ev("kernels_ns_per_step", per_step, "ns"),
                         _ev("path_share", f["ns"] / total, "ratio"),
                         _ev("top_kernel_ns_per_step", top[1] // n_steps, "ns", top[0]),
                         _ev("kernel_names", len(f["names"]), "count"), *checked],
            "max_severity": "medium", "recommendation": fix})
    return out


def pipeline_bottleneck(pipeline: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pipeline's clear bottleneck stage (``analyses.pipeline.bottleneck``) as a finding:
    its gain is its compute per step over the median stage's; None without one."""
    b = (pipeline or {}).get("bottleneck") or {}
    if b.get("rank") is None:
        return None
    stages = pipeline["stages"]
    row = stages.filter(pl.col("rank") == b["rank"]).row(0, named=True)
    gain = int(b["gain_ns_per_step"])
    sched = pipeline.get("schedule") or {}
    evidence = [
        _ev("stage", b["stage"], "index"),
        _ev("compute_per_step_ns", row["compute_per_step_ns"], "ns"),
        _ev("median_stage_compute_per_step_ns", row["compute_per_step_ns"] - gain, "ns"),
        _ev("steps_leading", b.get("steps_leading"), "count",
            f"of {b.get('steps')} steps it computes the most"),
        _ev("idle_fraction", row["idle_fraction"], "ratio"),
        _ev("median_idle_fraction", stages.get_column("idle_fraction").median(), "ratio"),
        _ev("bubble_fraction", sched.get("bubble_fraction"), "ratio",
            f"{sched.get('kind')}, ideal " + (f"{sched['ideal_bubble_fraction']:.1%}"
                                              if sched.get("ideal_bubble_fraction") is not None
                                              else "unknown")),
        _ev("step_ns_at_median_speed", b.get("step_ns_at_median_speed"), "ns"),
    ]
    # how often the stage computes the most: every step, it is the bottleneck for sure
    leading = (b.get("steps_leading") or 0) / max(int(b.get("steps") or 1), 1)
    return {"id": "pipeline_bottleneck", "rank": b["rank"], "gain_ns_per_step": gain,
            "confidence": "high" if leading >= 0.8 else "medium" if leading >= 0.5 else "low",
            "title": (f"Pipeline stage {b['stage']} (rank {b['rank']}) is the bottleneck: "
                      f"{_time(gain)} per step more compute than the median stage, the others "
                      "wait for it"),
            "evidence": evidence,
            "recommendation": RECOMMENDATIONS["pipeline_bottleneck"].format(
                stage=b["stage"], rank=b["rank"])}


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
    # the volumes are counted exactly; the gain is a model's (a balanced assignment)
    return {"id": "alltoall_imbalance", "rank": rank, "gain_ns_per_step": cost,
            "confidence": "medium",
            "title": f"All-to-all imbalance: rank {rank} receives {ratio:.2f}x the mean "
                     f"volume; a balanced assignment would save {_time(cost)} per step",
            "evidence": evidence,
            "recommendation": RECOMMENDATIONS["alltoall_imbalance"].format(rank=rank,
                                                                          ratio=ratio)}


# --- what the run is bound by, and MFU --------------------------------------------------------

def _bound(cats: dict[str, dict[str, Any]], *, cpu_only: bool = False,
           run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's bound, as ``summary`` and ``overlap`` name it: ``bound``, ``bound_share``
    and ``shares`` of ``run`` (``run_bound.run_bound``; without it, ``host-bound`` for a
    CPU-only run, else unknown), and, under other names so that they are not read as the
    bound, what the critical path is made of: ``path_shares`` (compute, communication
    (transfer + wait), input (data loading), host (launching), idle) and ``path``, their
    largest by the rule of every bound (``overlap.bound_of``: at least 1.2x the next, else
    ``balanced``). ``cpu_only`` (no rank has GPU work): the host's ops are the host's time,
    not GPU compute (the path shares show what the host did, its waits in gloo included)."""
    s = {c: (v["share"] or 0.0) for c, v in cats.items()}
    shares = {"compute": s["compute"],
              "communication": s["communication_transfer"] + s["communication_wait"],
              "input": s["data_loading"], "host": s["launch_host"], "idle": s["idle"]}
    if cpu_only:
        shares = {**shares, "compute": 0.0, "host": shares["host"] + shares["compute"]}
        path = "host" if any(shares.values()) else None
    else:
        path = bound_of(shares)
    if run is None:
        run = {"bound": BOUND_NO_GPU if cpu_only and path else None, "bound_share": None,
               "shares": {}}
    out = {**run, "shares": dict(run["shares"]), "path": path, "path_shares": shares}
    return {**out, "cpu_only": True} if cpu_only else out


_KINDS = ("compute", "communication", "input", "host", "idle")


def _bound_finding(bound: dict[str, Any]) -> dict[str, Any]:
    """The run's bound in the words of ``summary`` and ``overlap``, then what the path is
    made of, said as the path's ("path: 54% host, ...") so it is not read as the bound."""
    sh = bound["path_shares"]
    parts = ", ".join(f"{100 * sh[k]:.0f}% {k}" for k in _KINDS)
    return {"id": "bound", "rank": None, "gain_ns_per_step": None, "gain_share": None,
            "severity": "info", "confidence": "high",
            "title": f"Run bound: {bound_phrase(bound)}; path: {parts}",
            "evidence": [*([_ev("bound_share", bound["bound_share"], "ratio")]
                           if bound["bound_share"] is not None else []),
                         *(_ev(f"gpu_{k}_share", v, "ratio") for k, v in bound["shares"].items()),
                         *(_ev(f"path_{k}_share", v, "ratio") for k, v in sh.items())],
            "recommendation": RECOMMENDATIONS["bound"]}


def _mfu_finding(mfu: dict[str, Any], bound: dict[str, Any],
                 precision: tuple[float, list[str]] = (0.0, [])) -> dict[str, Any]:
    low, precisions = precision
    advice = (RECOMMENDATIONS["mfu_low_precision"].format(precision=" and ".join(precisions))
              if low >= 0.5 else RECOMMENDATIONS["mfu"])
    return {"id": "mfu", "rank": None, "gain_ns_per_step": None, "gain_share": None,
            "severity": "info", "confidence": "medium" if mfu["peak_source"] != "user"
            else "high",
            "title": f"MFU {100 * mfu['mfu']:.1f}%: {mfu['achieved_tflops_per_device']:.1f} of "
                     f"{mfu['peak_tflops']:.1f} TFLOP/s per device ({mfu['device'] or 'device'}, "
                     f"{mfu['dtype']})",
            "evidence": [_ev("mfu", mfu["mfu"], "ratio"),
                         _ev("achieved_tflops_per_device", mfu["achieved_tflops_per_device"],
                             "TFLOP/s"),
                         _ev("peak_tflops", mfu["peak_tflops"], "TFLOP/s", mfu["peak_source"]),
                         _ev("flops_per_step", mfu["flops_per_step"], "FLOP"),
                         _ev("devices", mfu["devices"], "count", mfu["devices_source"])],
            "recommendation": advice if bound["path"] == "compute" else
            RECOMMENDATIONS["bound"]}
