"""Allocator snapshots: the restricted reader, the replay against a hand-derived answer and an
independent forward replay, and ``traceview memory`` on pickles."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import sys
from pathlib import Path

import polars as pl
import pytest

from snapshot_helpers import forward_replay, hand_snapshot, simulated_snapshot, write
from traceview.cli import main
from traceview.errors import UnreadableTraceError
from traceview.run.memory import memory_result
from traceview.parsers import torch_snapshot


def _devices(paths) -> pl.DataFrame:
    return memory_result(None, [str(p) for p in paths]).table("devices")


# ------------------------------------------------------------------ by hand

def test_hand_snapshot_state_peak_and_fragmentation(tmp_path: Path) -> None:
    res = memory_result(None, [str(write(tmp_path / "rank-3.snapshot.pickle", hand_snapshot()))])
    d0, d1 = res.table("devices").iter_rows(named=True)
    assert (d0["rank"], d0["device"], d0["basis"], d0["source"]) == (3, "cuda:0", "absolute",
                                                                     "snapshot")
    assert d0["segments"] == 2 and d0["allocated_bytes"] == 1150 and d0["reserved_bytes"] == 3000
    assert d0["allocated_block_bytes"] == 300 + 200 + 700  # rounded sizes of P, X, Z
    assert d0["fragmentation_bytes"] == 1850 and d0["largest_free_block_bytes"] == 1300
    assert d0["start_allocated_bytes"] == 350
    assert d0["peak_allocated_bytes"] == 2050 and d0["peak_reserved_bytes"] == 3000
    assert d0["peak_time_ns"] == 111_000 and d0["peak_op"] == "attention.py:10:attention"
    assert d0["ooms"] == 1
    assert (d1["device"], d1["segments"], d1["allocated_bytes"], d1["reserved_bytes"],
            d1["peak_allocated_bytes"], d1["peak_reserved_bytes"]) == ("cuda:1", 1, 0, 512, 0, 512)
    stacks = res.table("top_stacks").filter(pl.col("device") == "cuda:0")
    # held at the peak: Y 1500 (attention), P 250 (init_weights), X 200 (forward), Q 100
    # (allocated before recording: its stack is where it was freed)
    assert stacks.select("bytes", "blocks").rows() == [(1500, 1), (250, 1), (200, 1), (100, 1)]
    assert stacks["stack"].to_list()[0] == "main.py:12:main;forward.py:11:forward;" \
                                           "attention.py:10:attention"
    assert stacks["bytes"].sum() == d0["peak_allocated_bytes"]
    segs = res.table("segments").filter(pl.col("device") == "cuda:0")
    assert segs.select("address", "total_size", "blocks", "allocated_bytes", "free_bytes",
                       "largest_free_block_bytes").rows() == [(5000, 2000, 2, 700, 1300, 1300),
                                                              (1000, 1000, 3, 450, 500, 500)]
    oom = res.table("ooms").row(0, named=True)
    assert (oom["requested_bytes"], oom["device_free_bytes"], oom["seq"]) == (4000, 10, 7)
    assert any("out of memory: 4000 bytes requested, 10 bytes free" in w for w in res.warnings)


def test_hand_snapshot_agrees_with_the_forward_replay(tmp_path: Path) -> None:
    snap = hand_snapshot()
    row = _devices([write(tmp_path / "s.pickle", snap)]).row(0, named=True)
    fwd = forward_replay(snap, 0)
    assert fwd == {"peak_allocated": 2050, "end_allocated": 1150, "peak_reserved": 3000,
                   "end_reserved": 3000}
    assert (row["peak_allocated_bytes"], row["allocated_bytes"], row["peak_reserved_bytes"],
            row["reserved_bytes"]) == (2050, 1150, 3000, 3000)


@pytest.mark.parametrize("seed", range(12))
def test_replay_equals_an_independent_forward_replay(tmp_path: Path, seed: int) -> None:
    """Random programs on a simulated allocator, the history cut to a ring buffer: peaks and
    end states byte for byte equal to the forward replay's."""
    snap = simulated_snapshot(seed)
    rows = {r["device"]: r for r in _devices([write(tmp_path / "s.pickle", snap)])
            .iter_rows(named=True)}
    for device in (0, 1):
        fwd = forward_replay(snap, device)
        r = rows[f"cuda:{device}"]
        assert (r["peak_allocated_bytes"], r["allocated_bytes"], r["peak_reserved_bytes"],
                r["reserved_bytes"]) == (fwd["peak_allocated"], fwd["end_allocated"],
                                         fwd["peak_reserved"], fwd["end_reserved"])
        assert r["start_allocated_bytes"] >= 0


def test_top_stacks_sum_to_the_peak_on_simulated_snapshots(tmp_path: Path) -> None:
    for seed in range(5):
        res = memory_result(None, [str(write(tmp_path / f"s{seed}.pickle",
                                             simulated_snapshot(seed)))], top=1000)
        held = res.table("top_stacks").group_by("device").agg(pl.col("bytes").sum())
        peaks = res.table("devices").select("device", "peak_allocated_bytes")
        joined = peaks.join(held, on="device", how="left").fill_null(0)
        assert joined["bytes"].to_list() == joined["peak_allocated_bytes"].to_list()


def test_torch_reads_our_snapshot_as_we_do(tmp_path: Path) -> None:
    """PyTorch's own reader of snapshots (``torch.cuda._memory_viz``) counts the same held
    block bytes per segment at snapshot time."""
    viz = pytest.importorskip("torch.cuda._memory_viz")
    snap = simulated_snapshot(3)
    res = memory_result(None, [str(write(tmp_path / "s.pickle", snap))])
    seg = torch_snapshot.read(tmp_path / "s.pickle").segments
    assert seg["total_size"].sum() == sum(s["total_size"] for s in snap["segments"])
    # calc_active: sum of block sizes of active_allocated blocks (ours: requested bytes of
    # held blocks, so compare the rounded sizes through our blocks table)
    blocks = torch_snapshot.read(tmp_path / "s.pickle").blocks
    ours = blocks.filter(pl.col("state") == "active_allocated")["size"].sum()
    assert ours == sum(viz.calc_active(s) for s in snap["segments"])
    assert res.table("devices")["reserved_bytes"].sum() == seg["total_size"].sum()
    pending = blocks.filter(pl.col("state") == "active_pending_free")["size"].sum()
    assert res.table("devices")["allocated_block_bytes"].sum() == ours + pending


def test_legacy_blocks_and_missing_history(tmp_path: Path) -> None:
    """Old snapshots keep requested sizes and frames in ``history`` and no block address;
    without ``device_traces`` the state at snapshot time is the peak, with a warning."""
    snap = {"segments": [{"device": 0, "address": 100, "total_size": 300, "stream": 0,
                          "blocks": [{"size": 100, "state": "active_allocated",
                                      "history": [{"real_size": 90, "frames": frames_()}]},
                                     {"size": 200, "state": "inactive"}]}]}
    res = memory_result(None, [str(write(tmp_path / "old.pickle", snap))])
    row = res.table("devices").row(0, named=True)
    assert (row["allocated_bytes"], row["peak_allocated_bytes"], row["reserved_bytes"],
            row["largest_free_block_bytes"]) == (90, 90, 300, 200)
    assert any("no device_traces" in w for w in res.warnings)


def frames_():
    return [{"filename": "/a/m.py", "line": 1, "name": "f"}]


# ------------------------------------------------------------------ untrusted input

class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_malicious_pickle_is_refused_and_runs_nothing(tmp_path: Path, capsys) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [], "x": _Evil(marker)}))
    assert "system" in "".join(str(op[1]) for op in pickletools.genops(evil.read_bytes()))
    with pytest.raises(UnreadableTraceError, match="refused: the pickle asks for .*system"):
        torch_snapshot.read(evil)
    assert main(["memory", str(evil)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"traceview: {evil}: refused")
    assert not marker.exists()
    pickle.loads(evil.read_bytes())  # the standard reader runs it: the test can fail
    assert marker.exists()


@pytest.mark.parametrize("payload", [
    b"cbuiltins\neval\n(S'1'\ntR.",                      # GLOBAL + REDUCE (protocol 0)
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x82\x01.",  # EXT1: copyreg's registry
    b"\x80\x02Pfoo\n.",                                   # a persistent id
])
def test_globals_extensions_and_persistent_ids_are_refused(tmp_path: Path, payload) -> None:
    path = tmp_path / "x.pickle"
    path.write_bytes(payload)
    with pytest.raises(UnreadableTraceError, match="refused|not a readable pickle"):
        torch_snapshot.read(path)


@pytest.mark.parametrize(("content", "problem"), [
    (b"not a pickle at all", "not a readable pickle"),
    (pickle.dumps([1, 2, 3]), "not an allocator snapshot"),
    (pickle.dumps({"segments": [{"address": 1}]}), "malformed allocator snapshot"),
])
def test_bad_snapshots_are_one_line_exit_2(tmp_path: Path, capsys, content, problem) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert main(["memory", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and problem in err[0] and str(path) in err[0]


# ------------------------------------------------------------------ the command

def test_memory_command_on_snapshots_text_and_json(tmp_path: Path, capsys) -> None:
    a = write(tmp_path / "rank-0.snapshot.pickle", hand_snapshot())
    b = write(tmp_path / "rank-1.snapshot.pickle", simulated_snapshot(1))
    assert main(["memory", str(a), str(b), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(d["rank"], d["device"]) for d in doc["devices"]] == [
        (0, "cuda:0"), (0, "cuda:1"), (1, "cuda:0"), (1, "cuda:1")]
    for d in doc["devices"]:
        assert {"rank", "device", "peak_allocated_bytes", "peak_reserved_bytes",
                "peak_time_ns", "peak_op", "basis", "allocated_bytes", "reserved_bytes",
                "segments"} <= set(d)
    assert doc["devices"][0]["peak_allocated_bytes"] == 2050
    assert [s["rank"] for s in doc["snapshots"]] == [0, 1]
    assert main(["memory", str(a)]) == 0
    out = capsys.readouterr().out
    assert "Top allocation stacks at the peak" in out and "attention.py:10:attention" in out


def test_memory_command_mixes_traces_and_snapshots(tmp_path: Path, capsys) -> None:
    trace = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "cpu_memory"
    snap = write(tmp_path / "rank-0.snapshot.pickle", hand_snapshot())
    assert main(["memory", str(trace), str(snap), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(d["source"], d["device"]) for d in doc["devices"]] == [
        ("trace", "cpu"), ("snapshot", "cuda:0"), ("snapshot", "cuda:1")]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_an_unreadable_snapshot_names_the_file(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "gone.pickle"
    assert main(["memory", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_expandable_segments_and_modern_keys(tmp_path: Path) -> None:
    """An expandable segment grows by ``segment_map`` (reserved +) and the snapshot carries
    the keys recent PyTorch writes (pool ids as tuples, allocator settings ...). By hand:
    map 2048, alloc 1000, map 2048, alloc 1500, free 1000 → allocated 1000, 1000, 2500, 1500
    from 0; reserved 2048 → 4096. At snapshot time one 4096 B segment holds the 1500 B block
    at 2048 (its first half free): fragmentation 4096 − 1500 = 2596."""
    snap = {
        "segments": [{"device": 0, "address": 0, "total_size": 4096, "allocated_size": 2048,
                      "active_size": 2048, "requested_size": 1500, "stream": 0,
                      "segment_type": "large", "segment_pool_id": (0, 0),
                      "is_expandable": True, "frames": [],
                      "blocks": [{"address": 0, "size": 2048, "requested_size": 0,
                                  "state": "inactive", "frames": []},
                                 {"address": 2048, "size": 2048, "requested_size": 1500,
                                  "state": "active_allocated", "frames": frames_()}]}],
        "device_traces": [[
            {"action": "segment_map", "addr": 0, "size": 2048, "stream": 0, "frames": [],
             "time_us": 1, "compile_context": "N/A", "user_metadata": ""},
            {"action": "alloc", "addr": 0, "size": 1000, "stream": 0, "frames": [],
             "time_us": 2},
            {"action": "segment_map", "addr": 2048, "size": 2048, "stream": 0, "frames": [],
             "time_us": 3},
            {"action": "alloc", "addr": 2048, "size": 1500, "stream": 0, "frames": frames_(),
             "time_us": 4},
            {"action": "free_requested", "addr": 0, "size": 1000, "stream": 0, "frames": [],
             "time_us": 5},
            {"action": "free_completed", "addr": 0, "size": 1000, "stream": 0, "frames": [],
             "time_us": 5},
            {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": [],
             "time_us": 6}]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "external_annotations": [],
    }
    row = _devices([write(tmp_path / "x.pickle", snap)]).row(0, named=True)
    assert (row["start_allocated_bytes"], row["peak_allocated_bytes"], row["allocated_bytes"],
            row["peak_reserved_bytes"], row["reserved_bytes"], row["fragmentation_bytes"],
            row["peak_time_ns"], row["peak_op"]) == (0, 2500, 1500, 4096, 4096, 2596, 4000,
                                                     "m.py:1:f")


def test_a_history_that_does_not_belong_to_the_snapshot_is_named(tmp_path: Path) -> None:
    """A history whose allocation is neither freed nor held at snapshot time (500 B allocated,
    nothing held): undone from the snapshot, the start state is −500 B. Named, not hidden."""
    snap = {"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 1, "size": 500, "stream": 0}]]}
    path = write(tmp_path / "odd.pickle", snap)
    res = memory_result(None, [str(path)])
    assert res.table("devices")["start_allocated_bytes"].to_list() == [-500]
    assert any(w.startswith(f"{path}: rank 0 cuda:0: the history does not belong to this "
                            "snapshot: undoing it from the snapshot gives a start state of "
                            "-500 B") for w in res.warnings)


def test_a_run_directory_gives_its_traces_and_its_snapshots(tmp_path: Path, capsys) -> None:
    """``traceview.capture`` writes traces and ``.memory_snapshot.pickle`` files side by side:
    the folder alone gives both; a folder of snapshots only gives them."""
    import shutil

    from traceview.cli.memory import split_inputs

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "data" / "cpu_memory", run)
    write(run / "rank-0.host.1.memory_snapshot.pickle", hand_snapshot())
    assert split_inputs([str(run)]) == ([str(run)],
                                        [str(run / "rank-0.host.1.memory_snapshot.pickle")])
    assert main(["memory", str(run), "--json", "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["source"] for d in doc["devices"]] == ["trace", "snapshot", "snapshot"]
    only = tmp_path / "snaps"
    only.mkdir()
    write(only / "rank-2.snapshot.pickle", hand_snapshot())
    assert split_inputs([str(only)]) == ([], [str(only / "rank-2.snapshot.pickle")])
    assert main(["memory", str(only), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["rank"] == 2
