"""Hostile inputs that asked for unbounded memory, or got an internal error or a wrong exit
code: each is now answered within a bound (docs/formats.md, "Bounds") by one line naming the
file (exit 2), or by a warning and a partial answer. The inputs are built here, in tmp_path;
commands that could eat the machine run in a subprocess under an address-space limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from traceview.cli import main

GLOO = FIXTURES / "data" / "gloo_ddp_2r"
#: The address space a guarded command may use: polars and zstd reserve ~2 GB of it up front,
#: so the bound sits well above that and well below what an unbounded read asks for.
LIMIT = 5 << 30


def _limited(limit: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


def _guarded(*argv: str, limit: int = LIMIT, env: dict[str, str] | None = None,
             timeout: int = 120) -> tuple[int, str]:
    """``traceview ARGV`` in a subprocess under an address-space limit: (exit code, stderr +
    stdout)."""
    done = subprocess.run([sys.executable, "-m", "traceview", *argv], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_limited(limit),
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stderr + done.stdout


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str, *names: str) -> None:
    """One message line (warnings aside) that names each of ``names``; no traceback."""
    lines = [line for line in err.strip().splitlines() if line.startswith("traceview:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    for name in names:
        assert name in lines[0], err


# ------------------------------------------------------------------------------- ranks
def test_a_huge_rank_range_is_compared_with_the_ranks_present():
    code, said = _guarded("summary", str(GLOO), "--ranks", "0-1000000000", "--json",
                          "--no-cache")
    assert code == 0, said
    assert '"ranks": "0-1"' in said


@pytest.mark.parametrize("spec", ["5-1000000000", "3-1", "-4", "0-99999999999"])
def test_a_rank_range_outside_the_run_is_one_line(spec):
    code, err = _guarded("summary", str(GLOO), "--ranks", spec, "--no-cache")
    assert code == 2
    _one_line(err, "--ranks")


# ------------------------------------------------------------------------ option ranges
@pytest.mark.parametrize("argv", [
    ["summary", "--top", "-5"], ["gaps", "--top", "10000000000000"],
    ["summary", "--skip-warmup", "-1"], ["summary", "--skip-warmup", "1" + "0" * 30],
    ["summary", "--steps", "0:99999999999999999999999"], ["summary", "--steps", "-3:2"],
    ["align", "--tolerance-us", "nan"], ["align", "--tolerance-us", "-1"],
    ["align", "--tolerance-us", "1e400"], ["align", "--reference-rank", "-2"],
    ["gaps", "--launch-overhead", "9" * 400 + "s"], ["summary", "--time", "0:1e999s"],
    ["diagnose", "--peak-tflops", "inf"], ["diagnose", "--layers", "0"],
    ["info", "--retries", "100000"], ["summary", "--window", "9" * 40],
])
def test_an_out_of_range_option_is_one_usage_line(capsys, argv):
    code, _, err = _run(capsys, argv[0], str(GLOO), *argv[1:], "--no-cache")
    assert code == 2
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.strip().splitlines()[-1].startswith("traceview:"), err


@pytest.mark.parametrize("argv", [
    ["check", "--alpha", "0"], ["check", "--alpha", "1.5"], ["check", "--noise-k", "-1"],
    ["check", "--tolerance", "all=1e400"], ["check", "--tolerance", "all=-1"],
])
def test_an_out_of_range_gate_option_is_one_usage_line(capsys, tmp_path, argv):
    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(GLOO), "-o", str(base), "--no-cache")[0] == 0
    code, _, err = _run(capsys, argv[0], str(GLOO), "--baseline", str(base), *argv[1:],
                        "--no-cache")
    assert code == 2
    assert "Traceback" not in err and "internal error" not in err, err


# --------------------------------------------------------------------- edited baselines
def _edit_tolerance(doc):
    doc["tolerance_pct"] = {"step_time_p50_ns": "5%"}


def _edit_default(doc):
    doc["default_tolerance_pct"] = "ten"


def _samples(value):
    def edit(doc):
        doc["samples"] = {"step_time_ns": [value]}
    return edit


def _edit_runs(doc):
    doc["metrics"]["step_time_p50_ns"]["runs"] = ["fast"]


def _edit_noise(doc):
    doc["noise"] = {"k": [3]}


EDITS = {"a tolerance as a string": (_edit_tolerance, "tolerance_pct.step_time_p50_ns"),
         "a default as a string": (_edit_default, "default_tolerance_pct"),
         "samples holding strings": (_samples(["1", "2"]), "samples.step_time_ns"),
         "samples holding lists": (_samples([[1], [2]]), "samples.step_time_ns"),
         "samples holding nulls": (_samples([None, 3]), "samples.step_time_ns"),
         "runs holding text": (_edit_runs, "metrics.step_time_p50_ns.runs"),
         "noise k a list": (_edit_noise, "noise.k")}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_hand_edited_baseline_is_one_line_naming_the_field(capsys, tmp_path, edit):
    import orjson
    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(GLOO), "-o", str(base), "--no-cache")[0] == 0
    doc = orjson.loads(base.read_bytes())
    change, field = EDITS[edit]
    change(doc)
    base.write_bytes(orjson.dumps(doc))
    code, _, err = _run(capsys, "check", str(GLOO), "--baseline", str(base), "--no-cache")
    assert code == 2
    _one_line(err, str(base), field)


# --------------------------------------------------------------- classification rules
@pytest.mark.parametrize("pattern", ["a)(b", "(?x)nccl #", "x" * 20_000])
def test_a_comm_pattern_that_breaks_its_group_is_one_line(capsys, pattern):
    code, _, err = _run(capsys, "gaps", str(GLOO), "--comm-pattern", pattern, "--no-cache")
    assert code == 2
    _one_line(err, "--comm-pattern")


def _config(tmp_path, data: bytes) -> Path:
    path = tmp_path / "comm.toml"
    path.write_bytes(data)
    return path


CONFIGS = {
    "nested 100k deep": lambda: b"comm_patterns = " + b"[" * 100_000 + b"]" * 100_000,
    "not UTF-8": lambda: b'comm_patterns = ["nccl\xff\xfe"]\n',
    "200,000 patterns": lambda: b"comm_patterns = [" + b'"a",' * 200_000 + b"]\n",
    "a broken group": lambda: b'comm_patterns = ["(?x)nccl #"]\n',
    "an integer of 5,000 digits": lambda: b"limit = 1" + b"0" * 5000 + b"\n",
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_hostile_comm_config_is_one_line_naming_it(tmp_path, config):
    path = _config(tmp_path, CONFIGS[config]())
    code, err = _guarded("gaps", str(GLOO), "--comm-config", str(path), "--no-cache")
    assert code == 2
    _one_line(err, "--comm-config", str(path))  # a pattern of the file too: the file blamed
    assert "--comm-pattern" not in err


def test_too_many_comm_patterns_are_one_line(capsys, tmp_path):
    argv = [a for i in range(2000) for a in ("--comm-pattern", f"k{i}")]
    code, _, err = _run(capsys, "gaps", str(GLOO), *argv, "--no-cache")
    assert code == 2
    _one_line(err, "--comm-pattern")


# ------------------------------------------------------------------------------ NCCL logs
def _peak_rss(*argv: str, limit: int = LIMIT, env: dict[str, str] | None = None
              ) -> tuple[int, int, str]:
    """(exit code, peak resident bytes, output) of ``traceview ARGV`` in a fresh process
    under an address-space limit."""
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "print(done.stderr + done.stdout)\n")
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "traceview",
                           *argv], capture_output=True, text=True, timeout=300,
                          preexec_fn=_limited(limit), env={**os.environ, **(env or {})})
    first, _, rest = done.stdout.partition("\n")
    code, kib = first.split()
    return int(code), int(kib) * 1024, rest


NCCL_LINES = (b"h:7:9 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 busId 1000 - Init "
              b"COMPLETE\n"
              b"h:7:9 [0] NCCL INFO AllReduce: opCount 1f sendbuff 0x1 recvbuff 0x2 count 10 "
              b"datatype 7 op 0 root 0 comm 0xa [nranks=2] stream 0x3\n")


def test_an_nccl_log_with_numbers_beyond_int64_is_read(tmp_path):
    from traceview.parsers import nccl_log
    log = tmp_path / "nccl.log"
    log.write_bytes(NCCL_LINES + b"h:7:9 [0] NCCL INFO AllReduce: opCount 2f sendbuff 0x1 "
                    b"recvbuff 0x2 count 99999999999999999999999 datatype 7 op 0 root "
                    b"99999999999 comm 0xa [nranks=2] stream 0x3\n")
    calls = nccl_log.parse(log).calls
    assert calls["count"].to_list() == [10, None] and calls["root"].to_list() == [0, None]


def test_an_nccl_log_is_read_a_line_at_a_time(tmp_path):
    small, big = tmp_path / "small.log", tmp_path / "big.log"
    small.write_bytes(NCCL_LINES)
    with open(big, "wb") as fh:
        fh.write(NCCL_LINES)
        for _ in range(300):  # one 300 MB line, then the log goes on
            fh.write(b"x" * (1 << 20))
        fh.write(b"\n" + NCCL_LINES)
    code, base, said = _peak_rss("collectives", str(GLOO), "--no-cache", "--nccl-log", str(small))
    assert code == 0, said
    code, peak, said = _peak_rss("collectives", str(GLOO), "--no-cache", "--nccl-log", str(big))
    assert code == 0, said
    assert peak - base < 100 << 20, (base, peak)


def test_an_nccl_logs_memory_per_line_keeps_its_bound_within_4_gb(tmp_path):
    """1 M call lines: memory grows by well under 0.7 KB a line (the text is turned into
    tables a batch at a time; it was ~0.9 KB, which put the line bound's worst case at
    ~17 GB); the line bound times that stays within 4 GB."""
    from traceview.parsers import nccl_log

    log = tmp_path / "nccl.log"
    call = (b"h:7:9 [0] NCCL INFO AllReduce: opCount 1f sendbuff 0x1 recvbuff 0x2 count 10 "
            b"datatype 7 op 0 root 0 comm 0xa [nranks=2] stream 0x3\n")
    lines = 1_000_000
    with open(log, "wb") as fh:
        fh.write(NCCL_LINES)
        fh.write(call * lines)
    probe = ("import resource, sys\n"
             "from traceview.parsers import nccl_log\n"
             "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "calls = nccl_log.parse(sys.argv[1]).calls\n"
             "print(calls.height, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(log)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    height, grown_kib = map(int, done.stdout.split())
    per_line = grown_kib * 1024 / lines
    assert height > lines and per_line < 700, per_line
    assert nccl_log.MAX_NCCL_LINES * per_line < 4 << 30


# ------------------------------------------------------------------- snapshot pickles
def _amplified() -> bytes:
    """A snapshot whose one block list is named by a million segments (memo references)."""
    import pickle
    blocks = [{"size": 512, "requested_size": 512, "state": "active_allocated",
               "frames": [{"filename": "a.py", "line": 1, "name": "f"}] * 20}] * 100
    segment = {"device": 0, "address": 0, "total_size": 51200, "stream": 0, "blocks": blocks}
    return pickle.dumps({"segments": [segment] * 1_000_000, "device_traces": [[]]}, protocol=4)


def _beyond_int64() -> bytes:
    import pickle
    return pickle.dumps({"segments": [{"device": 0, "address": 2**70, "total_size": 1,
                                       "blocks": []}], "device_traces": [[]]})


def _negative_size() -> bytes:
    import pickle
    block = {"size": -1, "requested_size": 1, "state": "active_allocated", "frames": []}
    return pickle.dumps({"segments": [{"device": 0, "address": 0, "total_size": -10,
                                       "blocks": [block]}], "device_traces": [[]]})


def _key(text: str) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text.encode()  # SHORT_BINUNICODE


def _nested_list(depth: int) -> bytes:
    """Opcodes leaving ``[[[...]]]``, ``depth`` lists deep, on the stack (written by hand:
    ``pickle.dumps`` would itself recurse): EMPTY_LIST ``depth`` times, then APPEND each
    into the one below."""
    return b"]" * depth + b"a" * (depth - 1)


def _nested_tuple(depth: int) -> bytes:
    return b")" + b"\x85" * (depth - 1)  # EMPTY_TUPLE, then TUPLE1 around it


def _snapshot_with(frames: bytes = b"]", state: bytes = _key("active_allocated")) -> bytes:
    """A snapshot of one segment, one block whose ``frames`` and ``state`` are the opcodes
    given."""
    block = (b"}" + _key("size") + b"K\x10s" + _key("requested_size") + b"K\x10s"
             + _key("state") + state + b"s" + _key("frames") + frames + b"s")
    segment = (b"}" + _key("address") + b"K\x00s" + _key("total_size") + b"K\x10s"
               + _key("blocks") + b"]" + block + b"as")
    return (b"\x80\x04}" + _key("segments") + b"]" + segment + b"as" + _key("device_traces")
            + b"]]as.")


PICKLES = {
    "a 200,000-deep list as a block's state": (  # printed: RecursionError
        lambda: _snapshot_with(state=_nested_list(200_000)), "nested more than 64 deep"),
    "a 200,000-deep list of frames": (
        lambda: _snapshot_with(_nested_list(200_000)), "nested more than 64 deep"),
    # hashed as the pickle is read (a dict key): a C recursion no limit stops
    "a 200,000-deep tuple as a dict key": (
        lambda: _snapshot_with(b"}" + _nested_tuple(200_000) + b"K\x01s"),
        "nested more than 64 deep"),
    # a frame's name is hashed (a cache of frame texts) and printed
    "a 200,000-deep tuple as a frame's name": (
        lambda: _snapshot_with(b"]}" + _key("name") + _nested_tuple(200_000) + b"sa"),
        "nested more than 64 deep"),
    "a list holding itself": (  # EMPTY_LIST, MEMOIZE, BINGET 0, APPEND
        lambda: _snapshot_with(b"]\x94h\x00a"), "holds itself"),
    "a memo index of 2**32 - 1": (lambda: b"\x80\x02N" + b"r\xff\xff\xff\xff" + b".",
                                  "not an allocator snapshot"),
    "a memo index of 2**31 then a get": (
        lambda: b"\x80\x02N" + b"r\x00\x00\x00\x80" + b"j\x00\x00\x00\x80" + b".",
        "not an allocator snapshot"),
    "shared references": (_amplified, "rows and frames"),
    "an address beyond int64": (_beyond_int64, "address"),
    "a negative size": (_negative_size, "field total_size holds -10, below 0"),
}


@pytest.mark.parametrize("case", list(PICKLES))
def test_a_hostile_snapshot_pickle_is_one_line_naming_it(tmp_path, case):
    make, said = PICKLES[case]
    path = tmp_path / "rank-0.snapshot.pickle"
    path.write_bytes(make())
    code, err = _guarded("memory", str(path), limit=4 << 30)
    assert code == 2, err
    _one_line(err, str(path), said)


def test_snapshot_nesting_is_bounded_along_its_longest_path():
    """64 levels are read, 65 refused, however the pickle shares its objects: a chain
    reached first by a short path and then by a long one is as deep as the long one, and
    2**60 paths through shared lists are walked once each."""
    import io
    import pickle

    from traceview.parsers.torch_snapshot._unpickle import (
        MAX_NESTING,
        RefusedPickle,
        plain_load,
        plain_loads,
    )

    assert MAX_NESTING == 64
    assert plain_loads(b"\x80\x04" + _nested_list(64) + b".") is not None
    assert plain_loads(b"\x80\x04" + _nested_tuple(64) + b".") is not None
    for too_deep in (_nested_list(65), _nested_tuple(65)):
        with pytest.raises(RefusedPickle, match="nested more than 64 deep"):
            plain_loads(b"\x80\x04" + too_deep + b".")

    chain: list = []
    for _ in range(39):
        chain = [chain]  # 40 levels
    long_way: list = [chain]
    for _ in range(29):
        long_way = [long_way]
    data = pickle.dumps([chain, long_way])  # 1 + 30 + 40 = 71 levels along the long way
    with pytest.raises(RefusedPickle, match="nested more than 64 deep"):
        plain_load(io.BytesIO(data))

    shared: list = []
    for _ in range(60):
        shared = [shared, shared]  # 2**60 paths, 61 lists
    loaded = plain_loads(pickle.dumps(shared))
    levels = 1
    while loaded:
        assert loaded[0] is loaded[1]  # the sharing kept (== would walk every path)
        loaded, levels = loaded[0], levels + 1
    assert levels == 61


# ------------------------------------------------------------------------ store folders
@pytest.fixture
def store_folder(tmp_path, capsys):
    out = tmp_path / "store"
    assert _run(capsys, "ingest", str(GLOO), "-o", str(out), "--cache-dir",
                str(tmp_path / "cache"))[0] == 0
    return out


def _edit_manifest(folder: Path, change) -> Path:
    import orjson
    path = folder / "traceview-store.json"
    doc = orjson.loads(path.read_bytes())
    change(doc)
    path.write_bytes(orjson.dumps(doc))
    return path


@pytest.mark.parametrize("target", ["../outside.parquet", "/etc/passwd", "..", "a/../../b"])
def test_a_store_part_outside_the_folder_is_refused(capsys, tmp_path, store_folder, target):
    outside = tmp_path / "outside.parquet"
    outside.write_bytes((store_folder / "rank-00000.parquet").read_bytes()
                        if (store_folder / "rank-00000.parquet").exists() else b"x")

    def point_outside(doc):
        doc["parts"][0]["file"] = target
    manifest = _edit_manifest(store_folder, point_outside)
    code, _, err = _run(capsys, "info", str(store_folder))
    assert code == 2
    _one_line(err, str(manifest), "outside the store")


def test_a_store_manifest_without_its_integrity_record_is_refused(capsys, store_folder):
    manifest = _edit_manifest(store_folder, lambda doc: doc.pop("files"))
    code, _, err = _run(capsys, "info", str(store_folder))
    assert code == 2
    _one_line(err, str(manifest), "integrity record")


def test_a_store_written_by_workers_records_its_files(capsys, tmp_path):
    out = f"file://{tmp_path / 'remote'}"
    assert _run(capsys, "ingest", str(GLOO), "-o", out, "--no-cache")[0] == 0
    assert _run(capsys, "info", str(tmp_path / "remote"))[0] == 0
    assert _run(capsys, "info", out)[0] == 0
    _edit_manifest(tmp_path / "remote", lambda doc: doc.pop("files"))
    code, _, err = _run(capsys, "info", out)
    assert code == 2
    _one_line(err, "integrity record")


def test_a_store_of_another_schema_version_is_refused(capsys, store_folder):
    """A store written when ``step`` was int32 (schema 2) is not read as if it were int64."""
    _edit_manifest(store_folder, lambda doc: doc.update(schema_version=2))
    code, _, err = _run(capsys, "info", str(store_folder))
    assert code == 2
    _one_line(err, str(store_folder), "ingest the traces again")


# ------------------------------------------------------------------------- step numbers
def _stepped_trace(path: Path, first: str) -> Path:
    """Two steps, ``ProfilerStep#<first>`` then ``ProfilerStep#7``, each with one op."""
    import json
    events = []
    for i, number in enumerate([first, "7"]):
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{number}",
                    "pid": 1, "tid": 1, "ts": 1000 * i, "dur": 900},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                    "ts": 1000 * i + 10, "dur": 100}]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("number", [str(2**32), str(2**63 - 1)])
def test_a_step_number_past_int32_is_a_step(capsys, tmp_path, number):
    import json
    trace = _stepped_trace(tmp_path / "trace.json", number)
    code, out, err = _run(capsys, "sql", str(trace), "select step from events where name = "
                          "'aten::mm' order by ts_ns", "--json", "--cache-dir",
                          str(tmp_path / "cache"))
    assert code == 0, err
    assert json.loads(out) == [{"step": int(number)}, {"step": 7}]
    # that step alone (2^63-1 too: its exclusive end, 2^63, is past every step)
    code, out, err = _run(capsys, "summary", str(trace), "--steps", number, "--json",
                          "--no-cache")
    assert code == 0, err
    said = json.loads(out)["ranks"][0]
    assert (said["steps"], said["step_time_ns_p50"]) == (1, 900_000)


@pytest.mark.parametrize("number", ["9" * 30, str(2**63)])
def test_a_step_number_beyond_int64_is_no_step_with_a_warning(capsys, tmp_path, number):
    import json
    trace = _stepped_trace(tmp_path / "trace.json", number)
    code, out, err = _run(capsys, "summary", str(trace), "--json", "--no-cache")
    assert code == 0, err
    said = json.loads(out)
    assert said["ranks"][0]["steps"] == 1  # step 7; the other marker is no step
    assert any("beyond 2^63-1" in w and str(trace) in w for w in said["warnings"])
    assert "beyond 2^63-1" in err and "Traceback" not in err
    code, out, _ = _run(capsys, "sql", str(trace), "select step from events where name = "
                        "'aten::mm' order by ts_ns", "--json", "--no-cache")
    assert code == 0 and json.loads(out) == [{"step": None}, {"step": 7}]


# ------------------------------------------------------------------------ kineto input
def _gzip_bomb(path: Path, inflated: int) -> None:
    """A gzip trace that opens an events array and then inflates to ``inflated`` bytes of
    spaces: one member holding the opening, then copies of one member of 64 MiB of spaces
    (a few hundred KB of file)."""
    import zlib

    def member(data: bytes) -> bytes:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31)
        return packer.compress(data) + packer.flush()
    spaces = member(b" " * (64 << 20))
    with open(path, "wb") as fh:
        fh.write(member(b'{"traceEvents": ['))
        for _ in range(inflated // (64 << 20)):
            fh.write(spaces)


def test_a_gzip_bomb_is_refused_by_name_at_the_bound(tmp_path):
    bomb = tmp_path / "rank-0.trace.json.gz"
    _gzip_bomb(bomb, 6 << 30)
    assert bomb.stat().st_size < 8 << 20
    code, peak, said = _peak_rss("info", str(bomb), "--no-cache")
    assert code == 2, said
    _one_line(said, str(bomb), "inflates to more than")
    assert peak < 4 << 30, peak


def test_a_gzip_bomb_is_refused_below_a_lowered_bound(tmp_path):
    bomb = tmp_path / "rank-0.trace.json.gz"
    _gzip_bomb(bomb, 1 << 30)
    code, said = _guarded("info", str(bomb), "--no-cache",
                          env={"TRACEVIEW_MAX_INFLATED_BYTES": str(256 << 20)})
    assert code == 2, said
    _one_line(said, str(bomb), "inflates to more than 268435456 bytes")


def _cgroup_tree(root: Path, version: int, limit: int, usage: int) -> None:
    """The kernel's files a process reads, under ``root``: plenty of MemAvailable, and a
    memory control group (v1 or v2, a container's own view) with ``limit`` and ``usage``."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 62914560 kB\n")
    if version == 2:
        (root / "proc" / "self" / "cgroup").write_text("0::/job\n")
        group = root / "sys" / "fs" / "cgroup" / "job"
        group.mkdir(parents=True)
        (group / "memory.max").write_text(f"{limit}\n")
        (group / "memory.current").write_text(f"{usage}\n")
        (group.parent / "memory.max").write_text("max\n")  # the root: no limit
    else:
        (root / "proc" / "self" / "cgroup").write_text("4:memory:/docker/abc\n0::/\n")
        group = root / "sys" / "fs" / "cgroup" / "memory"
        group.mkdir(parents=True)  # the container's own view: its limit at the mount
        (group / "memory.limit_in_bytes").write_text(f"{limit}\n")
        (group / "memory.usage_in_bytes").write_text(f"{usage}\n")


@pytest.mark.parametrize("version", [1, 2])
def test_a_gzip_bomb_is_bounded_by_the_containers_memory_limit(tmp_path, capsys, monkeypatch,
                                                               version):
    """A container's memory limit (its control group's), not only the machine's
    MemAvailable: 60 GiB available on the machine, 512 MiB left in the container; a file
    inflating to 1 GiB is refused at half of that, before the memory is asked for."""
    from traceview.parsers import _memory
    from traceview.parsers.kineto._input import inflate_limit

    _cgroup_tree(tmp_path / "root", version, limit=768 << 20, usage=256 << 20)
    monkeypatch.setattr(_memory, "ROOT", tmp_path / "root")
    assert _memory.available_memory() == 512 << 20
    assert inflate_limit() == 256 << 20
    bomb = tmp_path / "rank-0.trace.json.gz"
    _gzip_bomb(bomb, 1 << 30)
    code, _, err = _run(capsys, "info", str(bomb), "--no-cache")
    assert code == 2
    _one_line(err, str(bomb), "inflates to more than 268435456 bytes")


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_file_of_nul_bytes_is_refused_from_its_first_bytes(tmp_path, gzipped):
    path = tmp_path / ("rank-0.trace.json.gz" if gzipped else "rank-0.trace.json")
    if gzipped:
        import gzip
        path.write_bytes(gzip.compress(b"\0" * (256 << 20), 1))
    else:
        with open(path, "wb") as fh:
            fh.truncate(2 << 30)  # sparse: 2 GB of NUL bytes, no disk
    code, peak, said = _peak_rss("info", str(path), "--no-cache")
    assert code == 2, said
    _one_line(said, str(path), "not JSON")
    assert peak < 600 << 20, peak


@pytest.mark.parametrize("after", ["the array's opening", "a complete event", "half an event"])
def test_nul_bytes_after_a_json_header_are_damage_found_at_once(tmp_path, after):
    """A JSON header, then 1 GiB of NUL (a file preallocated and never written): a NUL is
    in no JSON text, so the damage is where it begins; the salvage looked for a complete
    element behind it through the whole file (66 s here for 1 GiB, 40 GiB ran 300 s)."""
    import time

    path = tmp_path / "rank-0.trace.json"
    head = {"the array's opening": b'{"traceEvents": [',
            "a complete event": b'{"traceEvents": [{"ph":"X","name":"a","pid":0,"tid":0,'
                                b'"ts":1,"dur":1},',
            "half an event": b'{"traceEvents": [{"ph":"X","name":"a'}[after]
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(1 << 30)  # sparse: no disk
    start = time.monotonic()
    code, peak, said = _peak_rss("info", str(path), "--no-cache", "--json")
    assert time.monotonic() - start < 30, said
    assert code == 0 and "input is truncated; kept the" in said
    assert peak < 3 << 29, peak  # the file's pages, mapped and read once by its hash


# ------------------------------------------------------------ kineto: bounds on one event
_EVENT = ('{{"ph":"X","cat":"kernel","name":"k{i}","pid":0,"tid":7,"ts":{ts}.5,"dur":2.25,'
          '"args":{{"stream":7,"device":0,"correlation":{i}}}}}')


def _trace(path: Path, middle: list[str], *, before: int = 3, after: int = 3,
           tail: str = "]}") -> Path:
    """A Kineto trace of small kernels with ``middle`` (event texts) among them."""
    events = [_EVENT.format(i=i, ts=10 * i) for i in range(before)] + middle + [
        _EVENT.format(i=i, ts=10 * i) for i in range(before, before + after)]
    path.write_text('{"traceEvents": [' + ",\n".join(events) + tail)
    return path


def _read(path: Path, pure: bool) -> dict:
    """``info --json`` of one file on the C path or the pure-Python one: its numbers."""
    import orjson
    code, said = _guarded("info", str(path), "--json", "--no-cache",
                          env={"TRACEVIEW_PURE_PYTHON": "1" if pure else "0"})
    assert code == 0, said
    assert "Traceback" not in said and "internal error" not in said, said
    doc = orjson.loads(said[said.index("{"):])
    return {"stored": doc["stored_events"], "input": doc["input_events"],
            "dropped": doc["dropped"],
            "warned": [w.split(": ", 1)[1] for w in doc["warnings"] if "skipped" in w]}


def _nested(depth: int) -> str:
    """An event whose args nest ``depth`` levels in all (its own object is level 1)."""
    inner = depth - 2  # the event's object and args
    return ('{"ph":"X","cat":"kernel","name":"deep","pid":0,"tid":7,"ts":5.5,"dur":1,'
            '"args":{"stream":7,"x":' + "[" * inner + "]" * inner + "}}")


VARIANTS = {  # how the rest of the file sends it down each path
    "well-formed": {},
    "with B/E pairs": {"extra": ['{"ph":"B","name":"b","pid":0,"tid":1,"ts":1}',
                                 '{"ph":"E","name":"b","pid":0,"tid":1,"ts":3}']},
    "truncated": {"tail": ",\n" + _EVENT.format(i=99, ts=990)[:30]},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("depth,skipped", [(64, 0), (65, 1), (1000, 1), (100_000, 1)])
def test_an_event_nested_past_the_bound_is_skipped_alike_on_both_paths(tmp_path, variant,
                                                                         depth, skipped):
    extra = VARIANTS[variant]
    path = _trace(tmp_path / "rank-0.trace.json", [_nested(depth), *extra.get("extra", [])],
                  tail=extra.get("tail", "]}"))
    c, pure = _read(path, pure=False), _read(path, pure=True)
    assert c == pure
    assert c["dropped"].get("event_over_depth_bound", 0) == skipped
    paired = 1 if "extra" in extra else 0  # the E merged into its B
    assert c["stored"] == 6 + 1 - skipped + paired
    assert len(c["warned"]) == skipped
    if skipped:
        assert "nested deeper than 64 levels" in c["warned"][0]


def test_an_event_over_the_size_bound_is_skipped_alike_on_both_paths(tmp_path):
    big = "x" * (40 << 20)  # over the 32 MiB bound: as a kernel name, and in args
    path = _trace(tmp_path / "rank-0.trace.json", [
        '{"ph":"X","cat":"kernel","name":"' + big + '","pid":0,"tid":7,"ts":5.5,"dur":1}',
        _EVENT.format(i=50, ts=500),
        '{"ph":"X","cat":"kernel","name":"n","pid":0,"tid":7,"ts":6.5,"dur":1,'
        '"args":{"stream":7,"v":"' + big + '","w":"}, {"}}'])
    c, pure = _read(path, pure=False), _read(path, pure=True)
    assert c == pure
    assert c["stored"] == 7 and c["dropped"] == {"event_over_size_bound": 2}
    assert "2 events larger than 32 MiB skipped" in c["warned"][0]


@pytest.mark.parametrize("pure", [False, True])
def test_one_huge_string_takes_memory_of_the_file_not_of_its_objects(tmp_path, pure):
    path = _trace(tmp_path / "rank-0.trace.json", [
        '{"ph":"X","cat":"kernel","name":"' + "y" * (300 << 20) + '","pid":0,"tid":7,'
        '"ts":5.5,"dur":1}'])
    small = _trace(tmp_path / "rank-1.trace.json", [])
    env = {"TRACEVIEW_PURE_PYTHON": "1" if pure else "0"}
    code, base, said = _peak_rss("info", str(small), "--no-cache", env=env)
    assert code == 0, said
    code, peak, said = _peak_rss("info", str(path), "--no-cache", env=env)
    assert code == 0, said
    assert "1 events larger than 32 MiB skipped" in said
    assert peak - base < path.stat().st_size + (150 << 20), (base, peak)


def _near_the_end(path: Path, events: int, *, bad: bool) -> Path:
    """``events`` small kernels; with ``bad``, one of them near the end malformed (a key
    without its colon): the scanners decline the file and the salvage reads it."""
    lines = [_EVENT.format(i=i, ts=10 * i) for i in range(events)]
    if bad:
        lines[-50] = lines[-50].replace('"cat":', '"cat" ', 1)
    path.write_text('{"traceEvents": [\n' + ",\n".join(lines) + "\n]}")
    return path


@pytest.mark.parametrize("pure", [False, True])
def test_salvaging_a_large_trace_takes_a_small_multiple_of_the_file(tmp_path, pure):
    good = _near_the_end(tmp_path / "rank-0.trace.json", 400_000, bad=False)  # ~55 MB
    bad = _near_the_end(tmp_path / "rank-1.trace.json", 400_000, bad=True)
    env = {"TRACEVIEW_PURE_PYTHON": "1" if pure else "0"}
    code, base, said = _peak_rss("info", str(good), "--no-cache", limit=3 << 30, env=env)
    assert code == 0, said
    code, peak, said = _peak_rss("info", str(bad), "--no-cache", limit=3 << 30, env=env)
    assert code == 0, said
    assert "kept the 399950 complete events before the damage" in said
    # beyond reading the same file undamaged: measured 2.5x the file on the C path and none
    # on the pure one; before, the whole file as Python objects: 12.9x (1,092 MB against
    # 384 MB), and more than the cap in address space
    assert peak - base < 4 * bad.stat().st_size, (base, peak, bad.stat().st_size)


def _salvaged_whole(data: bytes) -> tuple[list[object], bool]:
    """The salvage as it was, over the whole text at once (the reference for the windows)."""
    import json
    text = data.decode("utf-8", errors="replace")
    decoder, pos = json.JSONDecoder(), text.find("[", text.find('"traceEvents"')) + 1
    out: list[object] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            return out, True
        if text[pos] == "]":
            return out, False
        if text[pos] == ",":
            pos += 1
            continue
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out, True
        out.append(obj)


@pytest.mark.parametrize("window", [1, 7, 64, 1 << 20])
def test_salvage_by_windows_keeps_what_the_whole_text_kept(monkeypatch, window):
    from traceview.parsers.kineto import _salvage
    monkeypatch.setattr(_salvage, "WINDOW", window)
    events = [_EVENT.format(i=i, ts=10 * i) for i in range(40)]
    events[5] = events[5].replace('"k5"', '"kérnel ✓ 名前"')  # characters of 2-3 bytes
    events[9] = "12345"  # a number cut by a window boundary must not read as two
    events[11] = '{"name": "a \\" ] } \\\\", "args": {"v": [[1], {"w": "x"}]}}'
    whole = '{"traceEvents": [' + " ,\n  ".join(events)
    for data in (whole + "]}", whole + ", {\"ph\": ", whole[:-15], whole + ", {\"cat\" 1}]}"):
        salvage = _salvage.Salvage(data.encode())
        got = [value for batch in salvage.batches() for value in batch]
        assert (got, salvage.truncated) == _salvaged_whole(data.encode())


def test_the_structure_of_json_bytes_is_found_as_a_decoder_finds_it():
    import json
    import random

    from traceview.parsers.kineto import _structure
    rng = random.Random(7)

    def value(level: int) -> object:
        roll = rng.random()
        if level > 6 or roll < 0.3:
            return rng.choice([1, 'a\\"]b', "\\", "}{", None, "[", "", "é" * rng.randint(0, 9)])
        if roll < 0.6:
            return [value(level + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}\\": value(level + 1) for i in range(rng.randint(0, 3))}

    def depth(v: object) -> int:
        inner = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else None
        return 0 if inner is None else 1 + max(map(depth, inner), default=0)

    for chunk in (1, 5, 4096):
        _structure.CHUNK = chunk
        try:
            for _ in range(200):
                array = [value(0) for _ in range(rng.randint(0, 5))]
                text = json.dumps(array, indent=rng.choice([None, 1])).encode()
                found = list(_structure.elements(text, 1))
                assert text[found[-1].start:found[-1].start + 1] == b"]"
                assert [(json.loads(text[e.start:e.end]), e.depth) for e in found[:-1]] == [
                    (v, depth(v)) for v in array]
                assert _structure.max_depth(text) == depth(array)
        finally:
            _structure.CHUNK = 4 << 20


# -------------------------------------------------------------------- a small ulimit -v
def _small_limit_run(limit_mb: int) -> subprocess.CompletedProcess[str]:
    """``summary --json`` under ``ulimit -v``, set by a shell that then execs the command (no
    Python between fork and exec: this process may run several at once from threads)."""
    return subprocess.run(["sh", "-c", 'ulimit -v "$0" && exec "$@"', str(limit_mb << 10),
                           sys.executable, "-m", "traceview", "summary", str(GLOO),
                           "--no-cache", "--json"], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("limit_mb", [200, 400, 410, 800, 1300, 1500])
def test_a_small_address_space_limit_is_one_out_of_memory_line_and_exit_2(limit_mb):
    """Under ``ulimit -v`` the command fails wherever memory runs out (an import, a thread,
    an allocation in Polars' Rust code that aborts the process after jemalloc's lines):
    the answer is then one line saying so, exit 2 (never 1, which a CI gate reads as a
    regression; never a traceback or a signal, never a hang), or the command's own answer."""
    done = _small_limit_run(limit_mb)
    assert done.returncode in (0, 2), (done.returncode, done.stderr[-2000:])
    if done.returncode == 2:
        assert done.stderr.count("\n") == 1 and done.stdout == "", done.stderr[-2000:]
        assert done.stderr.startswith("traceview: out of memory within the address-space "
                                      f"limit (ulimit -v: {limit_mb:,} MiB)")
    else:
        assert '"ranks"' in done.stdout


def test_no_hang_when_polars_async_runtime_cannot_start_all_its_threads():
    """Under ~410 MB the first Polars query builds its async (tokio) runtime when one worker
    thread can start and the next cannot: tokio panicked and, unwinding, waited for ever for
    the started worker (gdb: RuntimeManager::new -> BlockingPool::shutdown; 5 hangs in 135
    runs, alone or beside 3 other such runs). The supervised child gets one async worker
    (POLARS_ASYNC_THREAD_COUNT=1): 24 runs, 3 at a time (the hang came more often beside
    others), each ends, exit 2 with one line (a hang is the 60 s timeout)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as runs:
        done = list(runs.map(_small_limit_run, [410] * 24))
    for run in done:
        assert run.returncode in (0, 2), (run.returncode, run.stderr[-2000:])
        assert run.returncode == 0 or run.stderr.count("\n") == 1, run.stderr[-2000:]


def test_a_command_under_a_roomy_limit_answers_as_without_one():
    argv = [sys.executable, "-m", "traceview", "summary", str(GLOO), "--no-cache", "--json"]
    free = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    limited = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                             preexec_fn=_limited(LIMIT))
    assert (limited.returncode, limited.stdout, limited.stderr) == \
        (free.returncode, free.stdout, free.stderr)


# ------------------------------------------------------------------------ odd rank values
@pytest.mark.parametrize("rank, world, why", [
    (2**31, 4, "is no rank of a world of 4"), (-1, 4, "is no rank of a world of 4"),
    (7, 4, "is no rank of a world of 4"), (2**31, None, "is no rank (0 to 2^31-1)"),
    (0, 2**63, "world_size 9223372036854775808 is out of bounds")])
def test_a_rank_or_world_size_out_of_bounds_is_left_out_with_a_warning(tmp_path, capsys,
                                                                       rank, world, why):
    """distributedInfo's rank of 2^31 (ranks are int32), -1, 7 of 4, a world of 2^63: a
    warning saying so and the rank left out (taken from the file name, else 0), never an
    internal error and never taken silently."""
    import json

    info = {"rank": rank, **({} if world is None else {"world_size": world})}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"distributedInfo": info, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}))
    code, out, err = _run(capsys, "info", str(path), "--no-cache", "--json")
    assert code == 0, err
    assert why in err and "internal error" not in err
    (only,) = json.loads(out)["ranks"]
    assert 0 <= only["rank"] < 2**31


def test_a_kineto_file_name_rank_beyond_int32_is_left_out_with_a_warning(tmp_path, capsys):
    import json

    path = tmp_path / "trace_rank2147483648.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}))
    code, out, err = _run(capsys, "info", str(path), "--no-cache", "--json")
    assert code == 0 and "internal error" not in err, err
    assert "file name rank 2147483648 is no rank (0 to 2^31-1): left out" in err
    assert [r["rank"] for r in json.loads(out)["ranks"]] == [0]


#: nsys exports whose rank evidence is out of bounds: (write_export options, SQL run on the
#: export after, file name, what the warning says)
NSYS_RANKS = {
    "MPI_RANKS rank 2^31": (dict(rank_source="mpi", rank_offset=2**31, ranks=1, world_size=4),
                            None, "export.sqlite",
                            "rank 2147483648 (MPI_RANKS) is no rank (0 to 2^31-1)"),
    "MPI_RANKS rank -1": (dict(rank_source="mpi", ranks=1), "UPDATE MPI_RANKS SET rank = -1",
                          "export.sqlite", "rank -1 (MPI_RANKS) is no rank (0 to 2^31-1)"),
    "RANK 7 of WORLD_SIZE 4": (dict(rank_source="env", rank_offset=7, ranks=1, world_size=4),
                               None, "export.sqlite",
                               "rank 7 (RANK in environment of PROCESS_0) is no rank of a "
                               "world of 4"),
    "WORLD_SIZE 2^63": (dict(rank_source="env", ranks=1, world_size=2**63), None,
                        "export.sqlite", "world size beyond int64 (RANK in environment of "
                        "PROCESS_0) is out of bounds (1 to 2^31)"),
    "NCCL rank 7 of nranks 4": (dict(rank_source="nccl", rank_offset=7, ranks=1, world_size=4),
                                None, "export.sqlite",
                                "rank 7 (NCCL NVTX) is no rank of a world of 4"),
    "NCCL rank of 30 digits": (
        dict(rank_source="nccl", ranks=1),
        "UPDATE NVTX_EVENTS SET text = replace(text, 'rank 0 ', "
        "'rank 123456789012345678901234567890 ') WHERE text LIKE 'commHash%'",
        "export.sqlite", "rank beyond int64 (NCCL NVTX) is no rank of a world of 1"),
    "thread name MPI Rank of 30 digits": (
        dict(rank_source="none", ranks=1),
        "UPDATE StringIds SET value = 'MPI Rank 123456789012345678901234567890' "
        "WHERE id = (SELECT nameId FROM ThreadNames LIMIT 1)",
        "export.sqlite", "rank beyond int64 (NVTX thread name) is no rank (0 to 2^31-1)"),
    "file name rank 2^31": (dict(rank_source="none", ranks=1), None,
                            "trace_rank2147483648.sqlite",
                            "file name rank 2147483648 is no rank (0 to 2^31-1)"),
}


@pytest.mark.parametrize("case", list(NSYS_RANKS))
def test_an_nsys_rank_out_of_bounds_is_left_out_with_a_warning(tmp_path, capsys, case):
    """A rank of 2^31, -1, 7 in a world of 4, a world of 2^63, a number of 30 digits, in
    MPI_RANKS, the recorded environment, NCCL's NVTX texts, a thread's name or the file name
    of a real SQLite export: as the Kineto path does, a warning naming the value and its
    source, and the rank left out (the next evidence, else 0), never an internal error."""
    import json
    import sqlite3

    from fixtures.nsys_synthetic import write_export

    options, sql, name, why = NSYS_RANKS[case]
    path = tmp_path / name
    write_export(path, **options)
    if sql:
        with sqlite3.connect(path) as con:
            assert con.execute(sql).rowcount == 1
    code, out, err = _run(capsys, "info", str(path), "--no-cache", "--json")
    assert code == 0, err
    assert why in err and "internal error" not in err, err
    (only,) = json.loads(out)["ranks"]
    assert 0 <= only["rank"] < 2**31 and (only["world_size"] or 1) < 2**31


def test_a_rank_map_beyond_int32_is_a_usage_error(capsys):
    first = sorted(GLOO.iterdir())[0]
    code, _, err = _run(capsys, "info", str(first), "--no-cache", "--rank-map",
                        f"{first.name}=99999999999")
    assert code == 2
    _one_line(err, "--rank-map", "0 to 2^31-1")


@pytest.mark.parametrize("option", ["--cache-dir", "--db"])
def test_a_loop_of_symbolic_links_is_one_line_naming_it(tmp_path, capsys, option):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    argv = (["summary", str(GLOO), "--cache-dir", str(tmp_path / "a")] if option == "--cache-dir"
            else ["history", "record", str(GLOO), "--db", str(tmp_path / "a")])
    code, _, err = _run(capsys, *argv)
    assert code == 2
    _one_line(err, str(tmp_path / "a"), "loop of symbolic links")
