"""Model FLOPs utilisation for ``diagnose``: the model size the user gives, the devices and
their peak from the trace (``analyses.flops.PEAK_TABLE``), and an MFU above 100% refused with a
warning naming the likely wrong input (definitions: ``docs/metrics.md``, *Diagnose*)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from .flops import Peak, peak_tflops


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


def _device_name(devices: pl.DataFrame | None) -> str | None:
    if devices is None or "devices" not in devices.columns:
        return None
    for text in devices.get_column("devices").drop_nulls().to_list():
        names = json.loads(text) if isinstance(text, str) else list(text)
        if names:
            return str(names[0])
    return None


def _devices(devices: pl.DataFrame | None) -> tuple[int, str]:
    """How many devices the job's FLOPs run on: its world size where the files record it
    (the FLOPs per step are all ranks' together, and a trace may hold only some ranks),
    else the ranks in the trace; and where the number comes from."""
    present = devices.height if devices is not None and devices.height else 1
    if devices is not None and "world_size" in devices.columns:
        world = devices.get_column("world_size").drop_nulls().max()
        if world is not None and int(world) > present:  # type: ignore[arg-type]
            return int(world), "world_size"  # type: ignore[arg-type]
    return present, "ranks"


def model_flops_utilisation(model: ModelSize, step_ns: int | None, devices: pl.DataFrame | None,
         table: tuple[Peak, ...]) -> dict[str, Any] | None:
    """MFU = model FLOPs per step / (step time x devices x peak FLOP/s of one device); above
    1 it is refused (null) with a ``warning`` naming the likely wrong input."""
    flops = model.flops()
    if flops is None:
        return None
    device = model.device or _device_name(devices)
    n, n_source = _devices(devices)
    found = peak_tflops(device, model.dtype, table=table) if model.peak_tflops is None else None
    peak = model.peak_tflops if model.peak_tflops is not None else (found.tflops if found
                                                                   else None)
    achieved = flops / (step_ns / 1e9) / n / 1e12 if step_ns else None
    note = None if peak is not None else (
        f"no peak for device {device!r} and dtype {model.dtype!r}: pass --peak-tflops")
    mfu = achieved / peak if achieved is not None and peak else None
    out = {"flops_per_step": flops, "step_ns": step_ns, "devices": n, "device": device,
           "dtype": model.dtype, "achieved_tflops_per_device": achieved, "peak_tflops": peak,
           "peak_source": "user" if model.peak_tflops is not None else (
               found.source if found else None),
           "mfu": mfu, "note": note, "devices_source": n_source, "refused": False,
           "computed_mfu": mfu, "warning": None}
    if mfu is not None and mfu > 1.0:
        out.update(mfu=None, refused=True, warning=_impossible_mfu(model, out, table))
        out["note"] = out["warning"]
    return out


def _impossible_mfu(model: ModelSize, m: dict[str, Any], table: tuple[Peak, ...]) -> str:
    """Why an MFU above 100% cannot be, and the input most likely wrong: a peak below the
    device's (``--peak-tflops``, or ``--dtype`` of a slower precision than the run's), else
    the FLOPs per step (``--tokens-per-step`` with ``--params``, or ``--flops-per-step``),
    with the most the step could have done."""
    step_s = m["step_ns"] / 1e9
    ceiling = step_s * m["devices"] * m["peak_tflops"] * 1e12  # FLOPs at 100%
    head = (f"MFU refused: {m['flops_per_step']:.3g} FLOP per step in {1e3 * step_s:.3f} ms "
            f"on {m['devices']} device(s) ({m['devices_source']}) of {m['peak_tflops']:g} "
            f"TFLOP/s would be {100 * m['computed_mfu']:.1f}% of the peak; a step can do at "
            f"most {ceiling:.3g} FLOP. ")
    device = m["device"]
    if model.peak_tflops is not None:
        listed = peak_tflops(device, model.dtype, table=table)
        if listed is not None and listed.tflops > model.peak_tflops:
            return head + (f"The likely wrong input is --peak-tflops {model.peak_tflops:g}: "
                           f"{device} does {listed.tflops:g} TFLOP/s in {model.dtype}.")
        return head + (f"The likely wrong input is --peak-tflops {model.peak_tflops:g}, or the "
                       "FLOPs per step.")
    if model.dtype.lower() in ("fp32", "tf32", "fp64"):  # a slow precision's peak
        peak = peak_tflops(device, "bf16", table=table)
        if peak is not None and m["flops_per_step"] <= ceiling * peak.tflops / m["peak_tflops"]:
            d = "bf16"
            return head + (f"The likely wrong input is --dtype {model.dtype}: its peak "
                           f"({m['peak_tflops']:g} TFLOP/s) is below the {d} one "
                           f"({peak.tflops:g}); pass the precision the model's matmuls run in.")
    if model.flops_per_step is not None:
        return head + ("The likely wrong input is --flops-per-step: give the FLOPs of one "
                       "traced step (ProfilerStep), all ranks together.")
    per_token = model.flops() / model.tokens_per_step  # type: ignore[operator]
    most = ceiling / per_token
    return head + (f"The likely wrong input is --tokens-per-step {model.tokens_per_step:g} "
                   f"(at most {most:.3g} here: the tokens of one traced step, all ranks "
                   "together, not of an optimizer step with gradient accumulation or of "
                   f"several steps), or --params {model.params:g} (the parameters each "
                   "token goes through: a mixture of experts' active ones, embeddings "
                   "excluded).")
