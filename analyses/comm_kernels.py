"""The communication kernels known by name: one table, each row with the library it comes from
and where its names are defined, so a reader can check (and extend) what counts as
communication. ``classify.ClassifyPatterns.comm`` is this table's union; ``--comm-pattern``
adds to it.

A kernel that moves data between GPUs (a collective, an all-to-all, a one-sided put) is
communication whichever library launched it: NCCL and RCCL; DeepEP's MoE dispatch and combine
(over NVLink and NVSHMEM/IBGDA); NVSHMEM; the custom all-reduce kernels of vLLM, SGLang and
TensorRT-LLM; PyTorch's symmetric-memory collectives; MSCCL and MSCCL++. Each pattern is
anchored on a namespace or a name specific to its library, so a compute kernel named
``dispatch`` or ``combine`` elsewhere is not caught (Rust regex syntax, matched anywhere in
the kernel name).

When a multi-rank job shows none of these, :func:`likely_comm_names` lists the kernel names
that look like communication, for the ``--comm-pattern`` hint of ``summary`` and
``diagnose``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

Frame = pl.LazyFrame | pl.DataFrame


@dataclass(frozen=True)
class CommKernels:
    """One library's communication kernels: ``pattern`` (a regex on the kernel name),
    ``example`` (a name it matches), ``source`` (where the names are defined)."""

    library: str
    pattern: str
    example: str
    source: str


#: The known communication kernels (docs/metrics.md, "Communication kernels").
COMM_KERNELS: tuple[CommKernels, ...] = (
    CommKernels("NCCL / RCCL", r"(?i)nccl|rccl", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "github.com/NVIDIA/nccl src/device (ncclKernel_*, ncclDevKernel_*); "
                "github.com/ROCm/rccl"),
    CommKernels("DeepEP", r"deep_ep::(?:\w+::)*(?:\w*notify\w*|dispatch|combine)\b",
                "void deep_ep::intranode::dispatch<8, 768, 6144>(...)",
                "github.com/deepseek-ai/DeepEP csrc/kernels/{intranode,internode,"
                "internode_ll}.cu: notify_dispatch, cached_notify_dispatch, dispatch, "
                "cached_notify, cached_notify_combine, combine (not layout::get_dispatch_layout, "
                "which computes the layout locally)"),
    CommKernels("DeepEP (dpsk::ep build)", r"dpsk::ep::",
                "void dpsk::ep::internode::dispatch<...>(...)",
                "DeepEP built under the dpsk::ep namespace (a 64-rank MoE training trace, "
                "issue 49)"),
    CommKernels("DeepEP (no namespace)",
                r"^(?:void )?(?:notify_dispatch|cached_notify\w*|notify_combine|"
                r"dispatch|combine)<",
                "void cached_notify_dispatch<8>(...)",
                "DeepEP's kernel names where a build strips the namespace (issue 49's "
                "--comm-pattern: dispatch<, combine<, notify_dispatch, cached_notify)"),
    CommKernels("NVSHMEM", r"(?i)nvshmem", "nvshmemi_transfer_rma_nbi_kernel",
                "github.com/NVIDIA/nvshmem (nvshmem_*, nvshmemi_*, nvshmemx_* device code)"),
    CommKernels("vLLM / SGLang custom all-reduce",
                r"cross_device_reduce_|quickreduce::|custom_all_reduce",
                "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(...)",
                "github.com/vllm-project/vllm csrc/custom_all_reduce.cuh "
                "(cross_device_reduce_1stage, _2stage), csrc/quickreduce; "
                "github.com/sgl-project/sglang sgl-kernel (the same kernels)"),
    CommKernels("TensorRT-LLM custom all-reduce",
                r"(?:one|two)[Ss]hotAllReduceKernel|tensorrt_llm::kernels::(?:\w+::)*"
                r"\w*(?i:all_?reduce|allgather|reducescatter|alltoall)",
                "void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8>(...)",
                "github.com/NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/"
                "customAllReduceKernels.cu, communicationKernels/"),
    CommKernels("PyTorch symmetric memory", r"c10d::symmetric_memory::",
                "void c10d::symmetric_memory::one_shot_all_reduce_kernel<...>(...)",
                "github.com/pytorch/pytorch torch/csrc/distributed/c10d/symm_mem/"),
    CommKernels("MSCCL / MSCCL++", r"(?i)msccl", "mscclpp::executionKernel<...>",
                "github.com/microsoft/mscclpp (mscclpp:: kernels); github.com/Azure/msccl"),
)

#: NCCL's and RCCL's kernels: the collective calls ``collective_match`` pairs across ranks.
NCCL_KERNELS: str = COMM_KERNELS[0].pattern

#: The union of the table: a kernel is communication when any row matches.
DEFAULT_COMM_PATTERN: str = "|".join(f"(?:{k.pattern})" for k in COMM_KERNELS)

#: Words in a kernel name that suggest communication the table does not know: what the
#: ``--comm-pattern`` hint proposes.
_LOOKS_LIKE_COMM = (r"(?i)all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|a2a|"
                    r"broadcast|sendrecv|send_recv|dispatch|combine|\bep::|p2p|peer|"
                    r"barrier|multimem|lamport|ipc")


def likely_comm_names(gpu: Frame, *, n: int = 5) -> list[str]:
    """The ``n`` kernel names (most GPU time first) of ``gpu`` (classified rows) that look
    like communication but are classified compute: the ``--comm-pattern`` candidates."""
    rows = (gpu.lazy().filter(pl.col("gpu_class").cast(pl.String) == "compute")
            .group_by("name").agg(total=pl.col("dur_ns").sum())
            .with_columns(pl.col("name").cast(pl.String))
            .filter(pl.col("name").str.contains(_LOOKS_LIKE_COMM))
            .sort("total", "name", descending=[True, False]).head(n).collect())
    return rows.get_column("name").to_list()


def unseen_comm_warning(gpu: Frame, world_size: int | None) -> str | None:
    """The warning for a multi-rank job (``world_size`` > 1) whose GPU rows (classified) hold
    GPU work but no communication kernel: its communication hides in kernels the table does
    not know, so every communication share would read 0. Names the likely kernels for
    ``--comm-pattern``; None when the job has one rank, no GPU work, or communication."""
    if not world_size or world_size < 2:
        return None
    classes = gpu.lazy().select(pl.col("gpu_class").cast(pl.String)).unique().collect()
    found = set(classes.get_column("gpu_class").to_list())
    if "comm" in found or "compute" not in found:
        return None
    names = likely_comm_names(gpu)
    hint = ("; the likeliest names: " + ", ".join(_cut(n) for n in names)
            + f" (e.g. --comm-pattern '{_suggested_pattern(names)}')") if names else \
        "; none of its kernel names looks like communication either"
    return (f"gpu: a job of world size {world_size} shows no communication kernels: its "
            "communication may run in kernels traceview does not know (communication shares "
            "read 0); name them with --comm-pattern REGEX" + hint)


def _cut(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _suggested_pattern(names: list[str]) -> str:
    """A regex matching ``names``: each one's function name (``ns::dispatch`` of ``void
    ns::dispatch<8>(int*)``), escaped."""
    heads = []
    for name in names:
        head = re.sub(r"^void\s+", "", name).split("(")[0].split("<")[0].strip()
        if head and re.escape(head) not in heads:
            heads.append(re.escape(head))
    return "|".join(heads)
