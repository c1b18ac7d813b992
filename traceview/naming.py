"""Names that mean the same thing across sources: collectives, dtypes, copy directions.

All functions return Polars expressions so parsers of every format share one vocabulary.

>>> import polars as pl
>>> df = pl.DataFrame({"n": ["allreduce", "ncclDevKernel_AllGather_RING_LL", "_reduce_scatter_base",
...                          "gloo:broadcast", "ncclKernel_SendRecv", "aten::mm"]})
>>> df.select(collective_from_text(pl.col("n"))).to_series().to_list()
['all_reduce', 'all_gather', 'reduce_scatter', 'broadcast', 'send_recv', None]
"""

from __future__ import annotations

import polars as pl

# Order matters: the first pattern that matches wins (reduce_scatter before reduce, ...).
_COLLECTIVE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
)

#: Bytes per element for the dtype names Kineto writes (c10 ScalarType names) and nsys NCCL
#: payloads (ncclFloat32 ...), lower-cased.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "f32": 4, "half": 2, "float16": 2, "f16": 2, "bfloat16": 2,
    "bf16": 2, "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "i64": 8,
    "int": 4, "int32": 4, "i32": 4, "short": 2, "int16": 2, "byte": 1, "uint8": 1, "u8": 1,
    "char": 1, "int8": 1, "i8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complexfloat": 8, "complexdouble": 16,
    "uint32": 4, "uint64": 8, "uint16": 2,
    # the C++ names of the profiler's "Input type" (record_shapes)
    "long int": 8, "short int": 2, "signed char": 1, "unsigned char": 1, "c10::half": 2,
    "c10::bfloat16": 2, "c10::complex<float>": 8, "c10::complex<double>": 16,
}


def collective_from_text(text: pl.Expr) -> pl.Expr:
    """Normalised collective name found in a collective/kernel/op name, else null.

    Only names that look like communication are considered: NCCL/RCCL kernels, c10d/gloo/nccl
    op prefixes, or a bare collective word (Kineto's ``Collective name`` arg).
    """
    squashed = text.cast(pl.String).str.to_lowercase().str.replace_all(r"[^a-z0-9]", "")
    looks_like_comm = (
        squashed.str.contains(r"^(nccl|rccl|gloo|c10d|mpi|hccl)")
        | squashed.str.contains(r"^(all|reduce|broadcast|barrier|gather|scatter|send|recv)")
    )
    # Only the part after a known prefix counts: "ncclDevKernel_AllGather" -> "devkernelallgather".
    body = squashed.str.replace(r"^(nccl|rccl|gloo|c10d|mpi|hccl)", "")
    expr = pl.lit(None, dtype=pl.String)
    for pattern, label in reversed(_COLLECTIVE_PATTERNS):
        expr = pl.when(body.str.contains(pattern, literal=True)).then(pl.lit(label)).otherwise(expr)
    return pl.when(looks_like_comm).then(expr).otherwise(None)


def dtype_bytes(dtype: pl.Expr) -> pl.Expr:
    """Element size in bytes of a dtype name, null when unknown."""
    key = dtype.cast(pl.String).str.to_lowercase().str.replace(r"^(nccl|torch\.)", "")
    return key.replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64)


def copy_kind_from_name(name: pl.Expr) -> pl.Expr:
    """Memcpy direction from a Kineto memcpy name (``Memcpy HtoD (Pageable -> Device)``)."""
    found = name.cast(pl.String).str.extract(r"(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD|AtoH|HtoA)")
    return found
