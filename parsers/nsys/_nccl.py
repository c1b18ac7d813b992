"""NCCL in nsys exports: collective columns from NCCL kernels and from NCCL's NVTX ranges.

Kernels: an NCCL/RCCL kernel (name contains ``nccl``/``rccl``) gets ``collective`` from its
name with the same function the Kineto parser uses (:func:`traceview.naming.collective_from_text`),
so ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` and ``ncclKernel_AllReduce_RING_LL_Sum_float``
are both ``all_reduce`` whatever the source.

NVTX: ranges in the domain named ``NCCL`` are NCCL API calls. Their text is the API name,
optionally followed by ``key value`` pairs (``ncclAllReduce(): commHash 0x5a.., stream 0x..,
data_size 1024, type_size 4, reduction_op sum, nranks 8``). We read:

============  ======================================  ==========================================
column        from                                    rule
============  ======================================  ==========================================
collective    API name                                ``ncclAllReduce`` -> ``all_reduce``; null for
                                                      ``ncclGroupStart``/``End``, comm init, ...
pg_name       ``commHash`` (or ``comm``)              the communicator, as written
bytes         ``data_size`` (or ``bytes``/``size``)   else ``count`` x ``type_size``
in_nelems     ``count``                               else ``bytes / type_size``
dtype         ``datatype``                            as written
group_size    ``nranks``                              as written
seq           order within (process, pg_name)         0, 1, 2, ... by start time
============  ======================================  ==========================================

An NCCL kernel then inherits ``pg_name``, ``seq``, ``bytes``, ``in_nelems``, ``dtype`` and
``group_size`` from the NCCL range that encloses its launching runtime call on the same thread
(kernel -> runtime call by ``(process, correlation)``; call -> latest collective range on that
thread that started before the call and ends after it).
"""

from __future__ import annotations

import itertools

import polars as pl

from traceview.naming import collective_from_text
from traceview.schema import RUNTIME_KINDS

_NUM = r"(0x[0-9a-fA-F]+|-?\d+)"


def _field(key: str, value: str = _NUM) -> pl.Expr:
    return pl.col("name").str.extract(rf"(?:^|[\s,:(])(?:{key})[\s:=]+{value}", 1)


def _as_int(text: pl.Expr) -> pl.Expr:
    is_hex = text.str.starts_with("0x")
    return (pl.when(is_hex).then(text.str.slice(2).str.to_integer(base=16, strict=False))
            .otherwise(text.str.to_integer(strict=False)))


#: NCCL's NVTX domain name in every letter case. Membership is tested on the Categorical column
#: as it is, where ``str.to_uppercase() == "NCCL"`` would make a string per row; no other
#: character upper-cases to N, C or L, so both tests agree.
_NCCL_SPELLINGS = ["".join(letters) for letters in itertools.product(*zip("nccl", "NCCL"))]


def is_nccl_domain() -> pl.Expr:
    return (pl.col("kind") == "nvtx") & pl.col("category").is_in(_NCCL_SPELLINGS)


def is_comm_kernel_name(name: pl.Expr) -> pl.Expr:
    """An NCCL/RCCL kernel's name (text)."""
    return name.str.contains(r"(?i)nccl|rccl")


def kernel_collective(comm_name: pl.Expr, told: pl.Expr) -> pl.Expr:
    """A kernel's collective: for an NCCL/RCCL kernel (``comm_name``), the one its short name,
    else its name, tells (``told``: :func:`collective_from_text` of that text), else ``other``;
    null for every other kernel."""
    return pl.when(comm_name).then(pl.coalesce(told, pl.lit("other")))


def is_comm_kernel() -> pl.Expr:
    """NCCL/RCCL kernels: the kernels that :func:`kernel_collective` gave a collective."""
    return (pl.col("kind") == "kernel") & pl.col("collective").is_not_null()


def nvtx_collectives(events: pl.DataFrame) -> pl.DataFrame:
    """Fill the collective columns of NCCL-domain NVTX rows (other rows unchanged; row order
    is not kept)."""
    mask = is_nccl_domain()
    if not events.select(mask.any()).item():
        return events
    return pl.concat([events.filter(~mask), _nvtx_collectives(events.filter(mask))],
                     how="vertical_relaxed")


def _nvtx_collectives(events: pl.DataFrame) -> pl.DataFrame:
    name_type = events.schema["name"]
    events = events.with_columns(pl.col("name").cast(pl.String))  # the fields are in the text
    nccl = is_nccl_domain()
    api = pl.col("name").str.extract(r"^\s*((?:nccl|rccl)\w+)", 1)
    type_size = _as_int(_field("type_size|typeSize"))
    count = _as_int(_field("count|nelems"))
    data_size = _as_int(_field("data_size|dataSize|bytes|size"))
    out = events.with_columns(
        pl.when(nccl).then(collective_from_text(api)).otherwise(pl.col("collective"))
        .alias("collective"),
    ).with_columns(
        pl.when(nccl & pl.col("collective").is_not_null()).then(
            pl.coalesce(_field("commHash|comm", r"(0x[0-9a-fA-F]+|\d+)"), pl.col("pg_name")))
        .otherwise(pl.col("pg_name")).alias("pg_name"),
        pl.when(nccl & pl.col("collective").is_not_null()).then(
            pl.coalesce(data_size, count * type_size)).otherwise(pl.col("bytes")).alias("bytes"),
        pl.when(nccl & pl.col("collective").is_not_null()).then(
            pl.coalesce(count, data_size // type_size)).otherwise(pl.col("in_nelems"))
        .alias("in_nelems"),
        pl.when(nccl & pl.col("collective").is_not_null()).then(
            _field("datatype|dtype", r"([A-Za-z]\w*)")).otherwise(pl.col("dtype")).alias("dtype"),
        pl.when(nccl & pl.col("collective").is_not_null()).then(
            _group_size(_as_int(_field("nranks")))).otherwise(pl.col("group_size"))
        .alias("group_size"),
    )
    keyed = nccl & pl.col("collective").is_not_null() & pl.col("pg_name").is_not_null()
    return out.with_columns(
        pl.when(keyed).then(
            pl.col("ts_ns").rank("ordinal").over(["gpid", pl.when(keyed).then(
                pl.col("pg_name"))]).cast(pl.Int64) - 1)
        .otherwise(pl.col("seq")).alias("seq"),
        pl.col("name").cast(name_type))


def _group_size(nranks: pl.Expr) -> pl.Expr:
    """A collective's ``nranks``: 1 to 2^31-1 (an int32, as ranks are), else unknown (null)."""
    return pl.when(nranks.is_between(1, (1 << 31) - 1)).then(nranks).cast(pl.Int32)


def kernel_collectives(events: pl.DataFrame) -> pl.DataFrame:
    """NCCL kernels (their collective set from their name by :func:`kernel_collective`): the
    fields of the NCCL range that encloses their launch (see the module docstring)."""
    if not events.select(is_comm_kernel().any()).item():
        return events
    ranges = (events.filter(is_nccl_domain() & pl.col("collective").is_not_null()
                            & pl.col("dur_ns").is_not_null())
              .select("gpid", "tid", pl.col("ts_ns").alias("r_start"),
                      (pl.col("ts_ns") + pl.col("dur_ns")).alias("r_end"),
                      pl.col("collective").alias("r_collective"),
                      pl.col("pg_name").alias("r_pg"), pl.col("seq").alias("r_seq"),
                      pl.col("bytes").alias("r_bytes"), pl.col("in_nelems").alias("r_nelems"),
                      pl.col("dtype").alias("r_dtype"), pl.col("group_size").alias("r_group"))
              .sort("r_start"))
    if ranges.is_empty():
        return events
    launches = (events.select("kind", "gpid", "tid", "correlation", "ts_ns")
                .filter(pl.col("kind").is_in(RUNTIME_KINDS)
                        & pl.col("correlation").is_not_null())
                .select("gpid", "tid", "correlation", pl.col("ts_ns").alias("call_ts"))
                .sort("call_ts"))
    matched = (launches.join_asof(ranges, left_on="call_ts", right_on="r_start",
                                  by=["gpid", "tid"], strategy="backward",
                                  check_sortedness=False)
               .filter(pl.col("call_ts") < pl.col("r_end"))
               .unique(["gpid", "correlation"], keep="first")
               .drop("tid", "call_ts", "r_start", "r_end"))
    if matched.is_empty():
        return events
    with_row = events.with_row_index("_row")
    kernels = (with_row.select("_row", "kind", "collective", "gpid", "correlation")
               .filter(is_comm_kernel()).drop("kind", "collective")
               .join(matched, on=["gpid", "correlation"], how="inner"))
    if kernels.is_empty():
        return events
    joined = with_row.join(kernels.drop("gpid", "correlation"), on="_row", how="left",
                           maintain_order="left")
    hit = pl.col("r_seq").is_not_null() | pl.col("r_pg").is_not_null()
    return joined.with_columns(
        pl.when(pl.col("collective").is_in(["other"]) & pl.col("r_collective").is_not_null())
        .then(pl.col("r_collective")).otherwise(pl.col("collective")).alias("collective"),
        pl.when(hit).then(pl.col("r_pg")).otherwise(pl.col("pg_name")).alias("pg_name"),
        pl.when(hit).then(pl.col("r_seq")).otherwise(pl.col("seq")).alias("seq"),
        pl.when(hit).then(pl.col("r_bytes")).otherwise(pl.col("bytes")).alias("bytes"),
        pl.when(hit).then(pl.col("r_nelems")).otherwise(pl.col("in_nelems")).alias("in_nelems"),
        pl.when(hit).then(pl.col("r_dtype")).otherwise(pl.col("dtype")).alias("dtype"),
        pl.when(hit).then(pl.col("r_group")).otherwise(pl.col("group_size")).alias("group_size"),
    ).drop("_row", "r_collective", "r_pg", "r_seq", "r_bytes", "r_nelems", "r_dtype", "r_group")


def rank_hints(nvtx_rows: pl.DataFrame) -> pl.DataFrame:
    """``(gpid, rank, nranks)`` from NCCL communicator-init texts such as
    ``commHash 0x.. commId 0x.. rank 3 nranks 8 pid 1234`` (the largest communicator per
    process is taken as the world)."""
    found = nvtx_rows.filter(pl.col("name").str.contains(r"(?:^|\s)rank\s+\d+.*nranks\s+\d+"))
    if found.is_empty():
        return pl.DataFrame(schema={"gpid": pl.Int64, "rank": pl.Int64, "nranks": pl.Int64})
    # a number beyond int64 stands as 2^63-1, which the rank's bounds then refuse by name
    return (found.select(
        "gpid",
        _digits(pl.col("name").str.extract(r"(?:^|\s)rank\s+(\d+)", 1)).alias("rank"),
        _digits(pl.col("name").str.extract(r"nranks\s+(\d+)", 1)).alias("nranks"))
        .sort("nranks", descending=True).unique("gpid", keep="first"))


def _digits(text: pl.Expr) -> pl.Expr:
    """Digits as an Int64, 2^63-1 beyond it."""
    return text.cast(pl.Int64, strict=False).fill_null(
        pl.when(text.is_not_null()).then(pl.lit((1 << 63) - 1)))
