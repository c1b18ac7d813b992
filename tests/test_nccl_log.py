"""parsers/nccl_log.py on hand-written NCCL_DEBUG=INFO logs (formats from the reference notes,
section 5, and NCCL's own INFO format strings), with every expected value derived by hand."""

from __future__ import annotations

import polars as pl

from traceview.parsers.nccl_log import match_trace, parse, parse_text
from traceview.schema import events_frame

# Two processes of a 2-rank job on host n1, interleaved as they would be in one file, plus a
# sub-communicator of size 1 on rank 1 and noise lines.
LOG = """\
n1:100:111 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
n1:100:111 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
n1:200:222 [1] NCCL INFO Channel 00/02 :    0   1
n1:100:111 [0] NCCL INFO Channel 00/02 :    0   1
n1:100:111 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
n1:200:222 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
n1:200:222 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] [send] via NET/IB/0
n1:100:111 [0] NCCL INFO comm 0x55aa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0xabc - Init COMPLETE
n1:200:222 [1] NCCL INFO comm 0x66bb rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 3d000 commId 0xabc - Init COMPLETE
n1:200:222 [1] NCCL INFO comm 0x77cc rank 0 nranks 1 cudaDev 1 nvmlDev 1 busId 3d000 commId 0xdef - Init COMPLETE
n1:100:111 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f01 recvbuff 0x7f01 count 1 datatype 7 op 0 root 0 comm 0x55aa [nranks=2] stream 0x10
n1:200:222 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f02 recvbuff 0x7f02 count 1 datatype 7 op 0 root 0 comm 0x66bb [nranks=2] stream 0x20
n1:100:111 [0] NCCL INFO AllGather: opCount 1 sendbuff 0x7f03 recvbuff 0x7f04 count 1024 datatype 9 op 0 root 0 comm 0x55aa [nranks=2] stream 0x10
n1:200:222 [1] NCCL INFO AllGather: opCount 1 sendbuff 0x7f05 recvbuff 0x7f06 count 1024 datatype 9 op 0 root 0 comm 0x66bb [nranks=2] stream 0x20
n1:200:222 [1] NCCL INFO Broadcast: opCount 0 sendbuff 0x7f07 recvbuff 0x7f07 count 3 datatype 4 op 0 root 0 comm 0x77cc [nranks=1] stream 0x20
n1:100:111 [0] NCCL INFO ReduceScatter: opCount 1a sendbuff 0x7f08 recvbuff 0x7f09 count 7382228 datatype 6 op 2 root 0 comm 0x55aa [nranks=2] stream 0x10
n1:100:111 [0] NCCL WARN Call to ibv_reg_mr failed
"""


def test_calls_by_hand():
    log = parse_text(LOG)
    calls = log.calls.select("line", "rank", "comm_rank", "collective", "op_count", "count",
                             "dtype", "bytes", "reduction", "nranks", "comm", "order").rows()
    assert calls == [
        # line 11: 1 float32 element = 4 bytes
        (11, 0, 0, "all_reduce", 0, 1, "float32", 4, "sum", 2, "0x55aa", 0),
        (12, 1, 1, "all_reduce", 0, 1, "float32", 4, "sum", 2, "0x66bb", 0),
        # 1024 bf16 = 2048 bytes
        (13, 0, 0, "all_gather", 1, 1024, "bfloat16", 2048, "sum", 2, "0x55aa", 1),
        (14, 1, 1, "all_gather", 1, 1024, "bfloat16", 2048, "sum", 2, "0x66bb", 1),
        # rank 1's own 1-rank comm: comm_rank 0, global rank still 1 (its largest comm); 3 int64
        (15, 1, 0, "broadcast", 0, 3, "int64", 24, "sum", 1, "0x77cc", 0),
        # opCount is hex: 0x1a = 26; 7382228 float16 = 14764456 bytes; op 2 = max
        (16, 0, 0, "reduce_scatter", 26, 7382228, "float16", 14764456, "max", 2, "0x55aa", 2),
    ]
    first = log.calls.row(0, named=True)
    assert (first["host"], first["pid"], first["tid"], first["device"]) == ("n1", 100, 111, 0)
    assert first["nccl_name"] == "AllReduce" and first["stream"] == "0x10"


def test_short_form_without_prefix_from_the_notes():
    text = ("NCCL INFO Ring 00 : 0 -> 1 -> 2 -> 3 -> 0\n"
            "NCCL INFO Channel 00/08 : 0[0] -> 1[1] via P2P/CUMEM\n"
            "NCCL INFO AllReduce: opCount 42 bytes 104857600 datatype 7 op 0\n")
    log = parse_text(text)
    c = log.calls.row(0, named=True)
    # opCount is hex in every NCCL version: "42" is 66; bytes given directly
    assert (c["collective"], c["op_count"], c["bytes"], c["count"], c["host"]) == (
        "all_reduce", 66, 104857600, None, None)
    topo = log.topology.select("kind", "channel", "channels", "ring", "src", "dst",
                               "transport", "via").rows()
    assert topo == [("ring", 0, None, "0 1 2 3 0", None, None, None, None),
                    ("connection", 0, 8, None, 0, 1, "P2P", "P2P/CUMEM")]


def test_topology_and_comms_by_hand():
    log = parse_text(LOG)
    topo = log.topology.select("line", "rank", "kind", "channel", "channels", "ring", "src",
                               "dst", "direction", "transport").rows()
    assert topo == [
        (3, 1, "ring", 0, 2, "0 1", None, None, None, None),
        (4, 0, "ring", 0, 2, "0 1", None, None, None, None),
        (5, 0, "connection", 0, 0, None, 0, 1, None, "P2P"),
        (6, 1, "connection", 0, 0, None, 1, 0, None, "P2P"),
        (7, 1, "connection", 1, 0, None, 1, 0, "send", "NET"),
    ]
    assert log.comms.select("comm", "comm_rank", "nranks", "rank", "bus_id").rows() == [
        ("0x55aa", 0, 2, 0, "1b000"), ("0x66bb", 1, 2, 1, "3d000"), ("0x77cc", 0, 1, 1, "3d000")]


def test_parse_files_and_bad_bytes(tmp_path):
    a = tmp_path / "nccl_n1_100.log"
    a.write_bytes(b"\xff\xfe garbage\n" + LOG.encode())
    log = parse([a])
    assert log.calls.height == 6
    assert parse_text("").calls.height == 0


def test_match_trace_finds_the_window_offset():
    """The log has 6 calls of rank 0 (ar ag ar ag rs ar); the trace window saw the last three
    (ag rs ar): the best offset is 3 (all three names agree), so the trace's first kernel is
    log call 3 (opCount 3)."""
    names = ["AllReduce", "AllGather", "AllReduce", "AllGather", "ReduceScatter", "AllReduce"]
    lines = ["h:1:1 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 busId 1 - Init COMPLETE"]
    lines += [f"h:1:1 [0] NCCL INFO {n}: opCount {k:x} sendbuff 0x1 recvbuff 0x1 count "
              f"{100 * (k + 1)} datatype 7 op 0 root 0 comm 0xa [nranks=2] stream 0x1"
              for k, n in enumerate(names)]
    calls = parse_text("\n".join(lines)).calls
    trace = events_frame([
        dict(rank=0, file_id=0, source="kineto", kind="kernel", name=n, ts_ns=1000 * i,
             dur_ns=10, collective=c)
        for i, (n, c) in enumerate([("ncclDevKernel_AllGather_RING_LL", "all_gather"),
                                    ("ncclDevKernel_ReduceScatter_Sum_f32", "reduce_scatter"),
                                    ("ncclDevKernel_AllReduce_Sum_f32", "all_reduce")])
    ]).select("rank", pl.col("collective").cast(pl.String), "ts_ns")
    m = match_trace(calls, trace)
    assert m.select("log_order", "op_count", "count", "bytes_logged", "name_match").rows() == [
        (3, 3, 400, 1600, True), (4, 4, 500, 2000, True), (5, 5, 600, 2400, True)]


# ----------------------------------------------------------------------------- properties
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from traceview.parsers.nccl_log import COLLECTIVES, DATATYPES, REDUCTIONS  # noqa: E402

_call = st.fixed_dictionaries({
    "name": st.sampled_from(sorted(COLLECTIVES)), "op_count": st.integers(0, 2**40),
    "count": st.integers(0, 2**40), "datatype": st.sampled_from(sorted(DATATYPES)),
    "op": st.sampled_from(sorted(REDUCTIONS)), "root": st.integers(0, 7),
    "nranks": st.integers(1, 4096), "pid": st.integers(1, 99999), "dev": st.integers(0, 7)})


@settings(max_examples=40, deadline=None)
@given(calls=st.lists(_call, min_size=1, max_size=20))
def test_call_lines_round_trip(calls):
    """Formatting calls the way NCCL does (%lx opCount, %zu count) and parsing them back gives
    the same fields; bytes = count x element size; order counts per (host, pid, comm)."""
    lines = [f"node-{c['pid'] % 3}:{c['pid']}:{c['pid'] + 1} [{c['dev']}] NCCL INFO "
             f"{c['name']}: opCount {c['op_count']:x} sendbuff 0x7f00 recvbuff 0x7f01 "
             f"count {c['count']} datatype {c['datatype']} op {c['op']} root {c['root']} "
             f"comm 0xc{c['pid']} [nranks={c['nranks']}] stream 0x5" for c in calls]
    got = parse_text("\n".join(lines)).calls
    assert got.height == len(calls)
    seen: dict[int, int] = {}
    for row, c in zip(got.iter_rows(named=True), calls):
        assert (row["nccl_name"], row["op_count"], row["count"], row["datatype"], row["root"],
                row["nranks"], row["pid"], row["device"]) == (
            c["name"], c["op_count"], c["count"], c["datatype"], c["root"], c["nranks"],
            c["pid"], c["dev"])
        assert row["bytes"] == c["count"] * DATATYPES[c["datatype"]][1]
        assert row["reduction"] == REDUCTIONS[c["op"]]
        assert row["order"] == seen.get(c["pid"], 0)
        seen[c["pid"]] = seen.get(c["pid"], 0) + 1


def test_algorithm_and_protocol_choices_by_hand():
    """Both forms of NCCL's choice line: names (2.20+, with the channel range) and codes
    (older: Algo 1 = RING, proto 2 = SIMPLE, LL = 0; the collective name may be missing)."""
    from traceview.analyses.nccl import log_choices

    text = ("n1:100:111 [0] NCCL INFO comm 0x55aa rank 0 nranks 2 cudaDev 0 busId 1b000 "
            "- Init COMPLETE\n"
            "n1:100:111 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo Tree proto LL "
            "channel{Lo..Hi}={0..1}\n"
            "n1:100:111 [0] NCCL INFO AllReduce: 268435456 Bytes -> Algo NVLS proto Simple "
            "channel{Lo..Hi}={0..15}\n"
            "node-0:309:309 [0] NCCL INFO AllGather: 37756928 Bytes -> Algo 1 proto 2 time "
            "2860.208008\n"
            "NCCL INFO 1024 Bytes -> Algo 0 proto 0 time 12.5\n")
    ch = parse_text(text).choices
    assert ch.select("line", "rank", "collective", "bytes", "algorithm", "protocol",
                     "channel_lo", "channel_hi", "time_us").rows() == [
        (2, 0, "all_reduce", 4096, "TREE", "LL", 0, 1, None),
        (3, 0, "all_reduce", 268435456, "NVLS", "SIMPLE", 0, 15, None),
        (4, None, "all_gather", 37756928, "RING", "SIMPLE", None, None, 2860.208008),
        (5, None, None, 1024, "TREE", "LL", None, None, 12.5),
    ]
    assert log_choices(ch).rows() == [
        ("all_gather", "RING", "SIMPLE", 1, 37756928, 37756928),
        ("all_reduce", "TREE", "LL", 1, 4096, 4096),
        ("all_reduce", "NVLS", "SIMPLE", 1, 268435456, 268435456),
        (None, "TREE", "LL", 1, 1024, 1024),
    ]
    # the call lines of the module's LOG are no choice lines
    assert parse_text(LOG).choices.height == 0
