"""Operators against the roofline: per op (name, or name and shape), its GPU time, FLOPs and
bytes from its shapes, the achieved TFLOP/s and TB/s, and how close it came to what the
device allows.

For each op instance that owns GPU time (``op_kernels.op_kernel_times``), with ``t`` its
owned GPU time, ``F`` its FLOPs and ``B`` its ideal bytes (``op_models``; ``F`` is the trace's
``args.flops`` where no model applies and the profiler recorded one):

    achieved TFLOP/s = F / t,   achieved TB/s = B / t,   intensity = F / B (FLOP/byte)
    roofline time    = max(F / peak FLOP/s of its dtype, B / peak bandwidth)
    bound            = compute when F / peak FLOP/s >= B / peak bandwidth, else memory

and per group (sums over its instances): ``roofline_fraction = sum roofline time / sum t``
(1: the op ran as fast as the device allows), ``time_left_ns = sum t - sum roofline time``
(never below 0): what a kernel at the roofline would save. Summing per-instance time left
gives the group's, so the fraction is time-weighted. The peaks are ``analyses.flops``'s
``PEAK_TABLE`` (dense TFLOP/s per dtype, and the ``hbm`` rows); a device not in it gets the
rates without a bound, and a warning. Definitions with a worked example: ``docs/metrics.md``,
"Operators against the roofline".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import polars as pl

from .flops import PEAK_TABLE, Peak, peak_bandwidth, peak_tflops
from .op_models import CATEGORIES, checked_model

Frame = pl.LazyFrame | pl.DataFrame

#: The recorded arguments read per instance (Kineto ``args`` keys), as JSON text.
ARG_KEYS: dict[str, str] = {"input_dims": "Input Dims", "dtypes": "Input type",
                            "strides": "Input Strides", "concrete_inputs": "Concrete Inputs"}

#: How ``ops`` groups instances: by name alone, or by name and recorded arguments.
GROUPINGS: dict[str, tuple[str, ...]] = {
    "name": ("name",), "shape": ("name", *ARG_KEYS)}


def _ordered(grouped: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Largest GPU time first; ties in a total order (name, then the grouping's recorded
    arguments), so that the rows do not follow the order instances were read in (which
    differed between the C scanner and the pure-Python reader)."""
    ties = [pl.col(k).list.join("\x1f") if isinstance(grouped.schema[k], pl.List) else pl.col(k)
            for k in keys]
    return grouped.sort([pl.col("kernel_time_ns"), *ties],
                        descending=[True] + [False] * len(ties), nulls_last=True)


def op_args(events: Frame, instances: pl.DataFrame) -> pl.DataFrame:
    """``instances`` (``op_kernels`` rows) with the ``ARG_KEYS`` columns (JSON text, null when
    not recorded) and ``trace_flops`` (``args.flops``) of their events. Only those ops' rows
    are read, and only their ``args`` paths are parsed."""
    key = ["rank", "pid", "tid", "ts_ns", "name"]
    wanted = instances.select(key).unique()
    found = (events.lazy()
             .filter(pl.col("kind").cast(pl.String) == "cpu_op")
             .with_columns(pl.col("name").cast(pl.String))
             .join(wanted.lazy(), on=key, how="semi")
             .select(*key, trace_flops="flops", **{
                 col: pl.col("args_json").str.json_path_match(f"$['{arg}']")
                 for col, arg in ARG_KEYS.items()})
             .collect()
             .unique(key, keep="first"))
    return instances.join(found, on=key, how="left", maintain_order="left")


def _models(instances: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """One model per distinct (name, arguments): category, model_flops, bytes, dtype; and
    the warnings for shapes out of bounds (``op_models.checked_model``: not modelled)."""
    distinct = instances.select("name", "input_dims", "dtypes", "concrete_inputs").unique()
    out = []
    refused: dict[str, list[str]] = {}
    for name, dims, types, concrete in distinct.iter_rows():
        m, why = checked_model(name, _json(dims), _json(types), _json(concrete))
        if why is not None:
            refused.setdefault(why, []).append(name)
        out.append({"name": name, "input_dims": dims, "dtypes": types,
                    "concrete_inputs": concrete, "category": m and m.category,
                    "model_flops": m and m.flops, "bytes": m and m.bytes,
                    "dtype": m and m.dtype})
    schema = {"name": pl.String, "input_dims": pl.String, "dtypes": pl.String,
              "concrete_inputs": pl.String, "category": pl.String, "model_flops": pl.Int64,
              "bytes": pl.Int64, "dtype": pl.String}
    warnings = [f"ops: {len(names)} shape(s) with {why} not modelled (first: "
                f"{sorted(names)[0]})" for why, names in sorted(refused.items())]
    return pl.DataFrame(out, schema=schema), warnings


def _json(text: str | None) -> Any:
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def device_peaks(device: str | None, dtypes: Sequence[str], *,
                 table: Sequence[Peak] = PEAK_TABLE) -> dict[str, Any]:
    """``{"tflops": {dtype: TFLOP/s}, "tb_per_s": TB/s, "sources": [...]}`` of the device
    for ``dtypes`` (a dtype without a row is left out; no device row: empty and None)."""
    tflops: dict[str, float] = {}
    sources: set[str] = set()
    for dt in sorted(set(dtypes)):
        p = peak_tflops(device, dt, table=table)
        if p is not None:
            tflops[dt] = p.tflops
            sources.add(p.source)
    bw = peak_bandwidth(device, table=table)
    if bw is not None:
        sources.add(bw.source)
    return {"tflops": tflops, "tb_per_s": bw.tflops if bw else None, "sources": sorted(sources)}


def ops(instances: pl.DataFrame, kernels: pl.DataFrame, *, device: str | None,
        by: str = "shape", category: str | None = None,
        table: Sequence[Peak] = PEAK_TABLE) -> dict[str, Any]:
    """``{"ops": table, "device", "peaks", "warnings"}``. ``instances``: ``op_args`` rows;
    ``kernels``: ``op_kernels`` GPU events with their owner's ``op_idx``. One row per group
    (``by``: ``name`` or ``shape``), largest GPU time first; ``category`` keeps one family.

    Columns: name, category, input_dims (JSON text), dtypes, strides, concrete_inputs (shape
    grouping; null by name), count, kernel_time_ns (owned, summed over instances),
    direct_kernel_time_ns, subtree_kernel_time_ns, flops and bytes (mean per instance),
    flops_source (``model`` or ``trace``), model_flops, trace_flops, dtype, tflops_per_s and
    tb_per_s (mean over instances; ``_median``, ``_min``, ``_max`` beside them),
    tflops_per_s_total (the group's FLOPs over its GPU time: the roofline plot's y), intensity,
    peak_tflops, peak_tb_per_s, bound, roofline_time_ns, roofline_fraction, time_left_ns,
    kernels (the GPU events' full names, most time first)."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, not {category!r}")
    models, refused = _models(instances)
    inst = instances.join(models, on=["name", "input_dims", "dtypes", "concrete_inputs"],
                          how="left", nulls_equal=True, maintain_order="left")
    dtypes = inst.get_column("dtype").drop_nulls().unique().to_list()
    peaks = device_peaks(device, dtypes, table=table)
    inst = _rates(inst, peaks)
    if category is not None:
        inst = inst.filter(pl.col("category") == category)
    keys = list(GROUPINGS[by])
    grouped = _with_kernels(_grouped(inst, keys), kernels, inst, keys)
    return {"ops": _ordered(grouped, keys),
            "device": device, "peaks": peaks,
            "warnings": [*refused, *_no_shapes(inst), *_warnings(device, dtypes, peaks),
                         *_replayed_warning(kernels)]}


def _replayed_warning(kernels: pl.DataFrame) -> list[str]:
    """GPU events replayed from CUDA/HIP graphs that no captured op took (``op_kernels``,
    ``graph_capture``): in no op's row."""
    if "graph_replayed" not in kernels.columns:
        return []
    replayed = kernels.filter(pl.col("graph_replayed") & pl.col("op_idx").is_null())
    if replayed.height == 0:
        return []
    ms = replayed.get_column("dur_ns").sum() / 1e6
    return [f"ops: {replayed.height} GPU events ({ms:.3f} ms) were replayed from CUDA/HIP "
            "graphs: unattributed (the ops captured into the graphs launched them: give "
            "their capture trace with --graph-capture FILE)"]


def _rates(inst: pl.DataFrame, peaks: dict[str, Any]) -> pl.DataFrame:
    """Per instance: flops (the model's, else the trace's) and its source, the achieved
    rates, and the roofline time."""
    flops = pl.coalesce(pl.col("model_flops"), pl.col("trace_flops"))
    source = (pl.when(pl.col("model_flops").is_not_null()).then(pl.lit("model"))
              .when(pl.col("trace_flops").is_not_null()).then(pl.lit("trace")))
    peak_f = pl.col("dtype").replace_strict(peaks["tflops"], default=None,
                                            return_dtype=pl.Float64)
    bw = pl.lit(peaks["tb_per_s"], pl.Float64)
    t = pl.col("kernel_ns").cast(pl.Float64)
    return inst.with_columns(flops=flops, flops_source=source, peak_tflops=peak_f,
                             peak_tb_per_s=bw).with_columns(
        tflops_per_s=pl.col("flops") / t / 1e3,  # FLOP/ns = GFLOP/s
        tb_per_s=pl.col("bytes") / t / 1e3,
        _compute_ns=pl.col("flops") / (pl.col("peak_tflops") * 1e3),
        _memory_ns=pl.col("bytes") / (pl.col("peak_tb_per_s") * 1e3),
    ).with_columns(_roof_ns=pl.when(pl.col("_compute_ns").is_not_null()
                                    & pl.col("_memory_ns").is_not_null())
                   .then(pl.max_horizontal("_compute_ns", "_memory_ns")))


def _stats(col: str) -> list[pl.Expr]:
    return [pl.col(col).mean().alias(col), pl.col(col).median().alias(f"{col}_median"),
            pl.col(col).min().alias(f"{col}_min"), pl.col(col).max().alias(f"{col}_max")]


def _grouped(inst: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    by_shape = len(keys) > 1
    out = inst.group_by(keys).agg(
        category=pl.col("category").drop_nulls().first(),
        shapes=pl.struct("input_dims", "dtypes", "strides", "concrete_inputs").n_unique(),
        count=pl.len().cast(pl.Int64),
        kernel_time_ns=pl.col("kernel_ns").sum(),
        direct_kernel_time_ns=pl.col("direct_ns").sum(),
        subtree_kernel_time_ns=pl.col("subtree_ns").sum(),
        flops=pl.col("flops").mean(), bytes=pl.col("bytes").mean(),
        flops_source=pl.col("flops_source").drop_nulls().first(),
        model_flops=pl.col("model_flops").mean(), trace_flops=pl.col("trace_flops").mean(),
        dtype=pl.col("dtype").drop_nulls().first(),
        # in floats: the sums of many large models stay out of int64's wrap
        _f=pl.col("flops").cast(pl.Float64).sum(), _b=pl.col("bytes").cast(pl.Float64).sum(),
        _compute=pl.col("_compute_ns").sum(), _memory=pl.col("_memory_ns").sum(),
        _roof=pl.col("_roof_ns").sum(), _known=pl.col("_roof_ns").is_not_null().all(),
        peak_tflops=pl.col("peak_tflops").first(), peak_tb_per_s=pl.col("peak_tb_per_s").first(),
        *_stats("tflops_per_s"), *_stats("tb_per_s"),
    )
    t = pl.col("kernel_time_ns")
    roof = pl.when(pl.col("_known")).then(pl.col("_roof"))
    out = out.with_columns(
        intensity=pl.when(pl.col("_b") > 0).then(pl.col("_f") / pl.col("_b")),
        tflops_per_s_total=pl.col("_f") / t.cast(pl.Float64) / 1e3,
        bound=pl.when(pl.col("_known")).then(
            pl.when(pl.col("_compute") >= pl.col("_memory")).then(pl.lit("compute"))
            .otherwise(pl.lit("memory"))),
        roofline_time_ns=roof.round(0).cast(pl.Int64),
        roofline_fraction=roof / t,
        time_left_ns=(t - roof).clip(0).round(0).cast(pl.Int64),
    )
    if not by_shape:
        out = out.with_columns(input_dims=pl.lit(None, pl.String),
                               dtypes=pl.lit(None, pl.String), strides=pl.lit(None, pl.String),
                               concrete_inputs=pl.lit(None, pl.String))
    return out.select(
        "name", "category", "input_dims", "dtypes", "strides", "concrete_inputs", "shapes",
        "count", "kernel_time_ns", "direct_kernel_time_ns", "subtree_kernel_time_ns", "flops",
        "bytes", "flops_source", "model_flops", "trace_flops", "dtype", "tflops_per_s",
        "tflops_per_s_median", "tflops_per_s_min", "tflops_per_s_max", "tb_per_s",
        "tb_per_s_median", "tb_per_s_min", "tb_per_s_max", "tflops_per_s_total", "intensity",
        "peak_tflops",
        "peak_tb_per_s", "bound", "roofline_time_ns", "roofline_fraction", "time_left_ns")


def _with_kernels(grouped: pl.DataFrame, kernels: pl.DataFrame, inst: pl.DataFrame,
                  keys: list[str]) -> pl.DataFrame:
    """``grouped`` with ``kernels``: the distinct GPU event names each group owns, most
    time first; ``dtypes`` parsed from its JSON text into a list."""
    lists = (kernels.rename({"name": "_kernel"})
             .join(inst.select("op_idx", *keys), on="op_idx")
             .group_by(*keys, "_kernel").agg(pl.col("dur_ns").sum())
             .sort("dur_ns", "_kernel", descending=[True, False])
             .group_by(keys, maintain_order=True).agg(kernels=pl.col("_kernel")))
    return (grouped.join(lists, on=keys, how="left", nulls_equal=True, maintain_order="left")
            .with_columns(pl.col("kernels").fill_null(pl.lit([], pl.List(pl.String))),
                          pl.col("dtypes").map_elements(_string_list, skip_nulls=True,
                                                        return_dtype=pl.List(pl.String))))


def _string_list(text: str) -> list[str] | None:
    value = _json(text)
    return [str(v) for v in value] if isinstance(value, list) else None


def _no_shapes(inst: pl.DataFrame) -> list[str]:
    """Why every shape, FLOP and rate column is empty: no op recorded its inputs (the
    profiler ran without ``record_shapes``). An op table of dashes said nothing of it."""
    if inst.height == 0 or inst.get_column("input_dims").drop_nulls().len() > 0:
        return []
    return ["ops: the trace records no input shapes (profiled without record_shapes=True): "
            "GPU time per op only, no FLOPs, bytes, rates or roofline; profile with "
            "torch.profiler.profile(record_shapes=True) for them"]


def _warnings(device: str | None, dtypes: list[str], peaks: dict[str, Any]) -> list[str]:
    """What the roofline could not say, when an op has a model: no device, a device not in
    the table, a dtype without a peak."""
    if not dtypes:
        return []  # no modelled op (a CPU-only run, no recorded shapes): nothing to bound
    if not device:
        return ["ops: the trace names no device: achieved rates without a roofline bound"]
    if peaks["tb_per_s"] is None and not peaks["tflops"]:
        return [f"ops: device {device!r} is not in the peak table (analyses.flops.PEAK_TABLE): "
                "achieved rates without a roofline bound"]
    out = []
    if peaks["tb_per_s"] is None:
        out.append(f"ops: no memory bandwidth for {device!r} in the peak table: no bound")
    missing = sorted(set(dtypes) - set(peaks["tflops"]))
    if missing:
        out.append(f"ops: no {', '.join(missing)} peak for {device!r} in the peak table: "
                   "those ops have rates without a bound")
    return out
