"""``ops``, the Run's answer on operators against the roofline (``analyses.ops``).

``answer(run, **options) -> Result``, the Run's method of that name
(``traceview.run.registry``); the op instances are the Run's (``run.op_instances``, which
``diagnose`` and the report read too).
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from traceview.analyses.ops import ops as op_table
from traceview.errors import UsageError
from traceview.run.result import Result

#: A :class:`traceview.run.run.Run`, not imported: run.py imports this module, and the package
#: has no import cycles (tests/test_layout.py), type-checking ones included.
Run = Any


def ops(run: Run, *, by: str = "shape", category: str | None = None) -> Result:
    """Per op (``by``: ``shape`` or ``name``): its GPU time, FLOPs and bytes from its
    shapes, achieved TFLOP/s and TB/s, intensity, roofline bound and fraction
    (``analyses.ops``); ``category``: gemm, sdpa, conv, elementwise or reduce. Main table
    ``ops``."""
    if by not in ("shape", "name"):
        raise UsageError(f"--by must be shape or name, not {by!r}")
    instances, kernels = run.op_instances
    found = op_table(instances, kernels, device=run._device_name(), by=by, category=category)
    res = run._result("ops", {"window": run.window_info, "ops": found["ops"],
                              "device": found["device"], "peaks": found["peaks"]},
                      main="ops", uses=("gpu",))
    return res.with_warnings(*run._op_attribution[2], *found["warnings"])


def device_name(ranks: pl.DataFrame) -> str | None:
    """The first GPU's name in a ranks table (the files' ``deviceProperties``): the device
    whose peaks the roofline and MFU use."""
    if "devices" not in ranks.columns:
        return None
    for text in ranks.get_column("devices").drop_nulls().to_list():
        try:
            names = json.loads(text)
        except ValueError:
            continue
        if names:
            return str(names[0])
    return None
