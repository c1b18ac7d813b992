"""``Comms Id`` (recent PyTorch's hash of process group, sequence number and ranks) matches
collectives before ``Seq`` and call order (``analyses/collective_match.py``).

torch 2.13's gloo traces carry no ``Comms Id`` (a fresh recording, ``fixtures/gloo_collectives``:
gloo writes no ``record_param_comms``; only NCCL does), so the trace here is drawn by hand in
Kineto's JSON layout, NCCL-style (``record_param_comms`` on the CPU, its args copied onto the
kernel), and read by the real parser."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

import traceview
from traceview.analyses.collective_match import comm_events, match_collectives

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
IDS = ["9223372036854775809", "17446744073709551615", "12345678901234567890"]


def write_rank(folder: Path, rank: int, calls: list[tuple[int, int, int | None, str | None]]
               ) -> None:
    """One rank's trace: per call (start us, duration us, Seq, Comms Id) an NCCL all-reduce
    kernel, launched under ``record_param_comms`` with the same args."""
    events = []
    for i, (ts, dur, seq, cid) in enumerate(calls):
        args = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1024,
                "Out msg nelems": 1024, "Group size": 2, "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
                "Rank": rank}
        if seq is not None:
            args["Seq"] = seq
        if cid is not None:
            args["Comms Id"] = int(cid)
        corr = 100 + i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
             "ts": ts - 20, "dur": 10, "args": {"External id": corr, **args}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": ts - 15, "dur": 4, "args": {"External id": corr, "correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": AR, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
             "args": {"External id": corr, "device": 0, "stream": 7, "correlation": corr,
                      **args}}]
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank,
                                                   "world_size": 2},
           "host_name": "h", "baseTimeNanoseconds": 1_700_000_000_000_000_000,
           "traceEvents": events}
    (folder / f"rank-{rank}.pt.trace.json").write_text(json.dumps(doc))


def test_comms_id_pairs_what_seq_would_pair_wrongly(tmp_path) -> None:
    # Three all-reduces at 1000, 5000 and 9000 us on both ranks (one clock). Rank 1's Seq
    # runs one ahead (2, 3, 4: its counter also counted a call made before the profile) so
    # Seq pairs rank 0's #2 (at 5000) with rank 1's first call (at 1000). The Comms Ids are
    # the calls' own: they pair 1000 with 1000, 5000 with 5000, 9000 with 9000.
    write_rank(tmp_path, 0, [(1000, 50, 1, IDS[0]), (5000, 50, 2, IDS[1]),
                             (9000, 50, 3, IDS[2])])
    write_rank(tmp_path, 1, [(1010, 40, 2, IDS[0]), (5010, 40, 3, IDS[1]),
                             (9010, 40, 4, IDS[2])])
    run = traceview.open(tmp_path, cache=False, align="none")
    inst = run.match.instances
    assert set(inst.get_column("match")) == {"comms_id"}
    assert sorted(set(inst.get_column("comms_id"))) == sorted(IDS)
    pairs = inst.group_by("instance").agg(ts=pl.col("ts_ns").sort(), n=pl.len())
    assert pairs.get_column("n").to_list() == [2, 2, 2]
    # each pair is one call on both ranks: starts 10 us apart
    assert all(b - a == 10_000 for a, b in pairs.get_column("ts").to_list())
    res = run.collectives().to_dict()
    assert sorted(i["skew_ns"] for i in res["instances"]) == [10_000] * 3
    assert res["groups"][0]["match"] == "comms_id" and res["problems"] == []


def test_without_comms_id_seq_decides(tmp_path) -> None:
    # the same calls without Comms Id: Seq pairs them (wrongly here, by construction), and
    # says it matched by seq; Comms Id is what changed the answer above
    write_rank(tmp_path, 0, [(1000, 50, 1, None), (5000, 50, 2, None), (9000, 50, 3, None)])
    write_rank(tmp_path, 1, [(1010, 40, 2, None), (5010, 40, 3, None), (9010, 40, 4, None)])
    run = traceview.open(tmp_path, cache=False, align="none")
    inst = run.match.instances
    assert set(inst.get_column("match")) == {"seq"}
    assert inst.get_column("comms_id").is_null().all()
    two = inst.filter(pl.col("rank").n_unique().over("instance") == 2)
    assert two.get_column("instance").unique().sort().to_list() == ["0#2", "0#3"]


def test_comms_id_on_cpu_calls(tmp_path) -> None:
    # CPU-only ranks (no kernels): the dispatcher's record_param_comms carries the id
    for rank in (0, 1):
        write_rank(tmp_path, rank, [(1000 + 5 * rank, 50, 7 + rank, IDS[0])])
    events = traceview.open(tmp_path, cache=False).events.filter(pl.col("kind") != "kernel")
    m = match_collectives(comm_events(events))
    assert m.instances.get_column("match").to_list() == ["comms_id", "comms_id"]
    assert m.instances.get_column("instance").n_unique() == 1
