"""What a trace already does, read before any advice is given: the precision its kernels run
in, whether its attention is already fused, which host time is start-up rather than steady
state. ``diagnose`` asks here first, so it never tells an FP8 run to use bf16 autocast, a run on
FlashAttention-3 to use FlashAttention, or a process's ``MPI_Init`` to capture CUDA graphs.
Each finding and the evidence it needs: ``docs/metrics.md``, "Diagnose: advice and its
evidence".

>>> [kernel_precision(n) for n in ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n",
...     "ampere_bf16_s16816gemm_bf16_128x64", "ampere_h16816gemm_256x128", "volta_sgemm_128x64_nn",
...     "nvjet_tst_192x192_64x4_1x2_h_bz_coopA_TNT", "flash_fwd_kernel")]
['fp8', 'bf16', 'fp16', 'fp32', 'bf16', None]
>>> fused_attention("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>(...)")
True
>>> fused_attention("void at::native::softmax_warp_forward<float, float, float, 10>(...)")
False
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import polars as pl

from .op_models import PEAK_DTYPES

#: Kernel-name rules for precision, the first that matches wins (lower precisions first, so
#: ``bf16bf16_bf16f32``, which accumulates in fp32, reads bf16). Tokens from cuBLAS/cuBLASLt
#: (``h16816gemm``, ``bf16_s16816gemm``, ``sgemm``), CUTLASS (``e4m3``, ``half_t``,
#: ``bfloat16_t``), PyTorch templates (``c10::Half``, ``c10::BFloat16``), CUDA types
#: (``__half``, ``__nv_bfloat16``, ``__nv_fp8_e4m3``) and cuBLASLt's ``nvjet_`` type letters
#: (``tst`` bf16, as the corpus B200 trace's bf16 ``addmm`` shows; ``hsh`` fp16, ``sss``
#: fp32, ``qq``/``ee`` fp8 operands) and Tensile's (hipBLASLt, rocBLAS on AMD) type token after
#: the transposes: ``Cijk_Alik_Bljk_BBS_...`` bf16 in and out, ``..._HHS_...`` fp16.
PRECISION_RULES: tuple[tuple[str, str], ...] = (
    ("fp4", r"(?i)e2m1|nvfp4|mxfp4|\bfp4"),
    ("fp8", r"(?i)e4m3|e5m2|fp8|float8|_f8_|\bf8f8|qgmma|mxf8|^nvjet_[qe]{2}"),
    ("bf16", r"(?i)bf16|bfloat16|__nv_bfloat|^nvjet_tst|^Cijk_[a-z]+_[a-z]+_BB"),
    ("fp16", r"(?i)fp16|f16|\bhalf\b|c10::half|__half|half_t|h16816|h1688|hgemm|hmma"
             r"|^nvjet_hsh|^Cijk_[a-z]+_[a-z]+_HH"),
    ("tf32", r"(?i)tf32|xf32|s1688gemm"),
    ("fp32", r"(?i)sgemm|\bfp32\b|f32f32_f32f32|<float\b|\bfloat,|^nvjet_sss"),
)

#: Precisions below fp32: matmul advice to lower the precision does not apply to them.
LOWER: frozenset[str] = frozenset({"fp4", "fp8", "bf16", "fp16", "tf32"})

#: Fused attention kernels: FlashAttention 1-3 (``flash_fwd``, ``flash::``,
#: ``FlashAttnFwdSm90``), PyTorch's memory-efficient (xFormers/CUTLASS ``fmha_cutlass``,
#: ``mem_eff``), cuDNN's (``cudnn``, ``sdpa`` graphs), TensorRT-LLM's and FlashInfer's
#: (``fmha``, ``xqa``, ``flashinfer``), AMD's CK/aiter (``fmha_fwd``, ``aiter``), Triton's
#: (``_attn_fwd``) and AOTriton's, PyTorch's flash backend on ROCm (``attn_fwd``,
#: ``attn_bwd``), vLLM's and SGLang's paged and unified attention (``paged_attention_v1``,
#: ``paged_attention_ll4mi_QKV_mfma16``, ``kernel_unified_attention_2d``). The same pattern
#: read on the op that owns a kernel (``_scaled_dot_product_flash_attention``,
#: ``_efficient_attention_forward``, ``FlashAttnVarlenFunc``) says the kernel is fused whatever
#: its own name (``checked_fix``'s ``op_names``).
FUSED_ATTENTION = (r"(?i)flash|fmha|mem_eff|efficient_attention|cudnn|sdpa|xqa|flashinfer"
                   r"|(^|[^a-z])attn_(fwd|bwd)|aiter|paged_attention|unified_attention")

#: Start-up calls: done once per process, not a step's launches (MPI and CUDA initialisation,
#: context creation, device selection, the first copies to a device: numba's and CuPy's
#: ``to_device``, PyTorch's lazy CUDA init and process-group set-up).
STARTUP_PATTERN = (r"(?i)^p?mpi_init|^cuInit$|^cu(Ctx|DevicePrimaryCtx)(Create|Retain)"
                   r"|^cudaSetDevice$|^cudaGetDeviceCount$|^cuDeviceGet|to_device"
                   r"|_lazy_init|init_process_group|cudaDeviceReset")


#: Steady-state calls a window can open on: kernel and graph launches (``cudaLaunchKernel``,
#: ``hipGraphLaunch``, ``cuLaunchKernelEx``, ``hipModuleLaunchKernel``) and compiled graphs'
#: calls (torch.compile's ``CompiledFxGraph``, ``CompiledFunction``, ``torch-compiled
#: region``, a CUDA graph's ``replay``). Before the first GPU work they are that work's own
#: launch, never start-up (``diagnose._startup_time``).
STEADY_PATTERN = (r"(?i)^(cu|cuda|hip)\w*launch|graphlaunch|compiled ?(fx ?graph|function)"
                  r"|torch-compiled region|cudagraph\w*\.replay|^graph_replay")


#: Replays of a captured graph: CUDA/HIP graph launches, PyTorch's ``CUDAGraph.replay``.
GRAPH_LAUNCH = r"(?i)graphlaunch|cudagraph\w*\.replay|^graph_replay"


def kernel_precision(name: str | None) -> str | None:
    """The precision a kernel's name says it runs in (``PRECISION_RULES``), else None."""
    if not name:
        return None
    for precision, pattern in PRECISION_RULES:
        if re.search(pattern, name):
            return precision
    return None


def fused_attention(name: str | None) -> bool:
    """Whether an attention kernel is a fused one (``FUSED_ATTENTION``)."""
    return bool(name) and re.search(FUSED_ATTENTION, name or "") is not None


def precision_shares(kernel_ns: Mapping[str, int],
                     op_dtypes: Mapping[str, str] | None = None) -> dict[str, int]:
    """GPU time by precision of ``kernel_ns`` (name -> ns): from each kernel's name, else the
    dtype of the op that owns it (``op_dtypes``: kernel name -> ``ops``' dtype), else
    ``unknown``."""
    out: dict[str, int] = {}
    for name, ns in kernel_ns.items():
        p = kernel_precision(name) or (op_dtypes or {}).get(name) or "unknown"
        out[p] = out.get(p, 0) + int(ns)
    return out


def lower_precision(shares: Mapping[str, int]) -> tuple[float, list[str]]:
    """The share of known-precision time already below fp32, and those precisions (most time
    first); ``(0.0, [])`` when no time has a known precision."""
    known = {p: ns for p, ns in shares.items() if p != "unknown"}
    total = sum(known.values())
    if not total:
        return 0.0, []
    lower = sorted((p for p in known if p in LOWER), key=lambda p: -known[p])
    return sum(known[p] for p in lower) / total, lower


def startup(name: str | None) -> bool:
    """Whether a host call is start-up (``STARTUP_PATTERN``)."""
    return bool(name) and re.search(STARTUP_PATTERN, name or "") is not None


def graph_launch(name: str | None) -> bool:
    """Whether a host call replays a captured graph (``GRAPH_LAUNCH``)."""
    return bool(name) and re.search(GRAPH_LAUNCH, name or "") is not None


def steady(name: str | None) -> bool:
    """Whether a host call is steady-state launching (``STEADY_PATTERN``), never start-up."""
    return bool(name) and re.search(STEADY_PATTERN, name or "") is not None


# --- the advice, checked ----------------------------------------------------------------------

#: Fixes for kernel families whose kernels already run lower precision or fused attention
#: (``checked_fix``): the precision or fusion advice would contradict the trace.
KERNEL_FIXES_CHECKED: dict[str, str] = {
    "gemm": (
        "Matrix multiplies already run in {precision}: a lower precision is not the lever. "
        "Use dimensions that are multiples of 16 (32 for fp8), more work per kernel (fused "
        "projections, larger batch), and compare the achieved FLOP/s with the {top} peak "
        "(`traceview ops`; diagnose --params and --tokens-per-step give MFU)."),
    "convolution": (
        "Convolutions, already in {precision}: torch.backends.cudnn.benchmark = True, "
        "channels_last memory format."),
    "attention": (
        "Attention already runs fused kernels ({fused}): tune its shapes instead: sequence "
        "lengths that are multiples of 64 (128 for FlashAttention-3), variable-length packing "
        "instead of padding, grouped-query attention{fp8}."),
    "attention_unfused": (
        "Use fused attention: torch.nn.functional.scaled_dot_product_attention (flash or "
        "memory-efficient backend) or FlashAttention, with sequence lengths that are multiples "
        "of 64{precision}."),
}


def op_dtypes(ops: pl.DataFrame | None) -> dict[str, str]:
    """Kernel name -> the dtype of the op that owns it (``ops`` rows by shape): its model's,
    else its first recorded floating input type (an op without a model, ``_scaled_mm`` of
    ``c10::Float8_e4m3fn`` inputs, still says fp8)."""
    if ops is None or ops.height == 0 or not {"kernels", "dtype"} <= set(ops.columns):
        return {}
    recorded = (pl.col("dtypes").list.eval(pl.element().replace_strict(
        PEAK_DTYPES, default=None, return_dtype=pl.String).drop_nulls()).list.first()
        if "dtypes" in ops.columns else pl.lit(None, pl.String))
    rows = (ops.select("kernels", dtype=pl.coalesce("dtype", recorded))
            .explode("kernels").drop_nulls()
            .unique("kernels", keep="first", maintain_order=True))
    return dict(rows.iter_rows())



def op_names(ops: pl.DataFrame | None) -> dict[str, str]:
    """Kernel name -> the name of the op that owns it (``ops`` rows, most GPU time first)."""
    if ops is None or ops.height == 0 or not {"kernels", "name"} <= set(ops.columns):
        return {}
    rows = (ops.select("kernels", "name").explode("kernels").drop_nulls()
            .unique("kernels", keep="first", maintain_order=True))
    return dict(rows.iter_rows())


def checked_fix(family: str, fix: str, names: dict[str, int],
                 op_dtypes: dict[str, str], op_names: dict[str, str] | None = None,
                 ) -> tuple[str, list[dict[str, Any]]]:
    """A ``diagnose`` kernel family's fix (``fix``, for kernels ``names``: name -> ns) once
    the trace is read, and the evidence read (``diagnose`` evidence rows): matrix multiplies and convolutions already below fp32 for most of their known
    time get no precision advice; attention that is mostly fused (flash, memory-efficient,
    cuDNN) gets no "use fused attention": a kernel is fused when its name or its owning op's
    (``op_names``: kernel name -> op name) says so."""
    if family not in ("gemm", "convolution", "attention"):
        return fix, []
    low, precisions = lower_precision(precision_shares(names, op_dtypes))
    said = ", ".join(precisions) or "unknown"
    evidence = [_evidence("lower_precision_share", low, "ratio",
                    f"of the known-precision time, below fp32: {said}")]
    lowered = low >= 0.5
    if family == "attention":
        owner = op_names or {}
        fused = {n: ns for n, ns in names.items()
                 if fused_attention(n) or fused_attention(owner.get(n))}
        share = sum(fused.values()) / max(sum(names.values()), 1)
        evidence.append(_evidence("fused_attention_share", share, "ratio",
                            max(fused, key=fused.__getitem__) if fused
                            else None))
        if share >= 0.5:
            kinds = _fused_kinds({f"{n} {owner.get(n, '')}": ns for n, ns in fused.items()})
            fp8 = "" if "fp8" in precisions or "fp4" in precisions else \
                ", fp8 attention (FlashAttention-3) where accuracy allows"
            return KERNEL_FIXES_CHECKED["attention"].format(fused=kinds, fp8=fp8), evidence
        return KERNEL_FIXES_CHECKED["attention_unfused"].format(
            precision="" if lowered else ", in bf16/fp16"), evidence
    if lowered:
        return KERNEL_FIXES_CHECKED[family].format(precision=" and ".join(precisions),
                                                   top=precisions[0]), evidence
    return fix, evidence


#: What exposed communication is, from its kernels' names: expert-parallel all-to-all (DeepEP's
#: dispatch/combine, any all-to-all) first, then the collectives of data parallelism.
COMM_KINDS: tuple[tuple[str, str], ...] = (
    ("all_to_all", r"(?i)deep_ep::|dpsk::ep::|notify_dispatch|cached_notify|^(void )?"
                   r"(dispatch|combine)<|all_?to_?all|a2a"),
    ("all_reduce", r"(?i)all_?reduce|cross_device_reduce"),
    ("all_gather", r"(?i)all_?gather"),
    ("reduce_scatter", r"(?i)reduce_?scatter"),
)

#: The exposed-communication fix for expert-parallel all-to-all: the data-parallel levers
#: (DDP buckets, FSDP prefetch) do not move a MoE layer's dispatch and combine.
ALL_TO_ALL_FIX = (
    "Overlap the expert-parallel all-to-all (dispatch, combine) with compute: split each "
    "step into two micro-batches and run one's dispatch and combine under the other's "
    "attention and expert GEMMs (DualPipe, two-batch overlap in SGLang and Megatron), keep "
    "the communication kernels on few SMs (DeepEP's num_sms), route each token to experts "
    "on few nodes (node-limited routing), and balance the experts (`traceview alltoall` "
    "shows the imbalance).")


def comm_kind(name: str | None) -> str | None:
    """The kind of a communication kernel by its name (``COMM_KINDS``), else None."""
    for kind, pattern in COMM_KINDS:
        if name and re.search(pattern, name):
            return kind
    return None


def checked_comm_fix(fix: str, names: Mapping[str, int]) -> tuple[str, list[dict[str, Any]]]:
    """The exposed-communication fix (``fix``: the data-parallel one) for the exposed
    communication kernels ``names`` (name -> ns on the path): the all-to-all fix when most of
    that time is all-to-all, with the kind that holds most of it as evidence."""
    kinds: dict[str, int] = {}
    for name, ns in names.items():
        kind = comm_kind(name) or "other"
        kinds[kind] = kinds.get(kind, 0) + int(ns)
    total = sum(kinds.values())
    if not total:
        return fix, []
    top = max(kinds, key=kinds.__getitem__)
    evidence = [_evidence("exposed_comm_kind_share", kinds[top] / total, "ratio", top)]
    return (ALL_TO_ALL_FIX if top == "all_to_all" and kinds[top] * 2 >= total else fix,
            evidence)


def _fused_kinds(fused: dict[str, int]) -> str:
    """Which fused attention the kernels are, most time first (FlashAttention, cuDNN,
    memory-efficient, other fused)."""
    kinds: dict[str, int] = {}
    for name, ns in fused.items():
        kind = ("FlashAttention-3" if re.search(r"(?i)sm90|FlashAttnFwdSm9|hopper|fa3", name)
                and re.search(r"(?i)flash", name) else
                "FlashAttention" if re.search(r"(?i)flash", name) else
                "cuDNN" if re.search(r"(?i)cudnn", name) else
                "memory-efficient" if re.search(r"(?i)fmha_cutlass|mem_eff|efficient", name)
                else "fused")
        kinds[kind] = kinds.get(kind, 0) + ns
    return ", ".join(sorted(kinds, key=lambda k: -kinds[k]))


def _evidence(metric: str, value: float | None = None, unit: str | None = None,
              text: str | None = None) -> dict[str, Any]:
    """One ``diagnose`` evidence row."""
    return {"metric": metric, "value": None if value is None else float(value), "unit": unit,
            "text": text}
