"""The columns a Kineto batch derives (parsers/kineto/_derived.py), checked by hand, and the same
whatever the batch size (each batch reads its rows from the raw columns at an offset)."""

from __future__ import annotations

import dataclasses

import polars as pl
import pyarrow as pa
import pytest

from tests.helpers import write_trace
from traceview.parsers.kineto import _parse as kineto

_DERIVED = ["kind", "flow_phase", "flow_id", "device", "stream", "collective", "copy_kind",
            "bytes"]


def _events() -> list[dict]:
    nccl = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    return [
        # 0: an op with a device arg: no device (host rows have none), its collective from its
        # name's c10d prefix, bytes from the larger element count x Float's 4
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 1,
         "dur": 1, "args": {"device": 3, "In msg nelems": 10, "dtype": "Float"}},
        # 1: the Collective name arg beats the kernel's name; one element count only
        {"ph": "X", "cat": "kernel", "name": nccl, "pid": 0, "tid": 7, "ts": 2, "dur": 1,
         "args": {"Collective name": "broadcast", "Out msg nelems": 8, "dtype": "BFloat16",
                  "device": 0, "stream": 7}},
        # 2: a Collective name no collective word matches is "other"; unknown dtype: no bytes
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
         "ts": 3, "dur": 1, "args": {"Collective name": "zzz", "In msg nelems": 5,
                                     "Out msg nelems": 9, "dtype": "Mystery"}},
        # 3: a memcpy keeps its bytes, its direction from its name
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0,
         "tid": 7, "ts": 4, "dur": 1, "args": {"bytes": 4096, "device": 0, "stream": 7}},
        # 4: a memory event's device is its Device Id; no stream
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 5, "s": "t", "args": {"Device Id": 2, "Bytes": 512, "stream": 4}},
        # 5, 6: flows keep phase and id; other rows with an id keep none
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 1, "tid": 1, "ts": 6},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 0, "tid": 7, "ts": 7,
         "bp": "e"},
        # 7: another accelerator's device work keeps its stream; a kernel name with nccl in
        # an op is no collective
        {"ph": "X", "cat": "mtia_ccp_events", "name": "fused_op", "pid": 2, "tid": 408,
         "ts": 8, "dur": 1, "args": {"stream": 102, "device": 1}},
        {"ph": "X", "cat": "cpu_op", "name": "my_nccl_helper", "pid": 1, "tid": 1, "ts": 9,
         "dur": 1, "args": {"stream": 5}},
        # 9: a memset's bytes; a runtime call's stream is not kept
        {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7,
         "ts": 10, "dur": 1, "args": {"bytes": 64, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "pid": 1, "tid": 1,
         "ts": 11, "dur": 1, "args": {"stream": 7, "device": 0}},
    ]


EXPECTED = [  # kind, flow_phase, flow_id, device, stream, collective, copy_kind, bytes
    ("cpu_op", None, None, None, None, "all_reduce", None, 40),
    ("kernel", None, None, 0, 7, "broadcast", None, 16),
    ("cpu_op", None, None, None, None, "other", None, None),
    ("memcpy", None, None, 0, 7, None, "DtoH", 4096),
    ("memory", None, None, 2, None, None, None, None),
    ("flow", "s", 9, None, None, None, None, None),
    ("flow", "f", 9, None, None, None, None, None),
    ("other", None, None, None, 102, None, None, None),
    ("cpu_op", None, None, None, None, None, None, None),
    ("memset", None, None, 0, 7, None, None, 64),
    ("cuda_runtime", None, None, None, None, None, None, None),
]


def _rows(table: pa.Table) -> list[tuple]:
    df = pl.from_arrow(table).with_columns(pl.col(pl.Categorical).cast(pl.String))
    return df.sort("ts_ns").select(_DERIVED).rows()


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 4, 1 << 16])
def test_derived_columns_by_hand_at_any_batch_size(tmp_path, batch_rows):
    parsed = kineto.parse_batched(write_trace(tmp_path / "t.json", _events()))
    batches = dataclasses.replace(parsed.events, batch_rows=batch_rows)
    assert _rows(batches.table()) == EXPECTED


def test_derived_columns_have_the_schema_types(tmp_path):
    table = kineto.parse(write_trace(tmp_path / "t.json", _events())).events
    types = {name: str(table.schema.field(name).type) for name in _DERIVED[1:]}
    assert types == {"flow_phase": "dictionary<values=string, indices=int32, ordered=0>",
                     "flow_id": "int64", "device": "int32", "stream": "int64",
                     "collective": "dictionary<values=string, indices=int32, ordered=0>",
                     "copy_kind": "dictionary<values=string, indices=int32, ordered=0>",
                     "bytes": "int64"}
