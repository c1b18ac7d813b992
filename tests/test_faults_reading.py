"""Faults while reading: inputs that are no regular file (link loops, FIFOs, devices), caches
damaged or poisoned, files that change or shrink while read, wrapped clocks, WAL-mode exports on
read-only media, remote inputs with no network, and a driver terminated mid-run. Each is
answered by one line naming the file and exit 2, or by a warning and a full answer; never by a
traceback, a hang, a crash by signal or a file beside an input."""

from __future__ import annotations

import json
import os
import sqlite3
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from traceview.cli import main

GLOO = FIXTURES / "data" / "gloo_ddp_2r"
ROOT = Path(__file__).resolve().parent.parent


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _cli(*argv: str, timeout: float = 60, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    """``traceview ARGV`` in its own process (a hang fails the test, not the suite)."""
    env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "traceview", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


# ------------------------------------------------------------------ inputs that are no file
def test_a_looping_symlink_is_one_line_naming_it(capsys, tmp_path):
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    code, _, err = _run(capsys, "info", str(loop), "--cache-dir", str(tmp_path / "c"))
    assert code == 2 and str(loop) in _one_line(err) and "link loop" in err


def test_a_looping_symlink_in_a_folder_is_skipped_with_a_warning(capsys, tmp_path):
    folder = shutil.copytree(GLOO, tmp_path / "in")
    loop = folder / "rank-2.pt.trace.json"
    loop.symlink_to(loop.name)
    cache = str(tmp_path / "c")
    code, _, err = _run(capsys, "info", str(folder), "--cache-dir", cache)
    assert code == 2 and str(loop) in _one_line(err)
    code, out, err = _run(capsys, "info", str(folder), "--skip-bad", "--cache-dir", cache,
                          "--json")
    assert code == 0 and "internal error" not in err
    assert any(str(loop) in line and "link loop" in line for line in err.splitlines())
    assert '"ranks"' in out and out.count('"rank":') == 2


@pytest.mark.parametrize("what", ["a FIFO", "/dev/zero"])
@pytest.mark.parametrize("role", ["trace", "--comm-config", "--baseline", "--nccl-log"])
def test_a_fifo_or_device_is_refused_before_it_is_opened(tmp_path, what, role):
    if what == "a FIFO":
        target = tmp_path / "trace.json"
        os.mkfifo(target)  # opening it for reading would block until a writer comes
    else:
        target = Path("/dev/zero")  # reading it never ends
    cache = ["--cache-dir", str(tmp_path / "c")]
    argv = {"trace": ["info", str(target)],
            "--comm-config": ["summary", str(GLOO), "--comm-config", str(target)],
            "--baseline": ["check", str(GLOO), "--baseline", str(target)],
            "--nccl-log": ["collectives", str(GLOO), "--nccl-log", str(target)]}[role]
    done = _cli(*argv, *cache, timeout=60)
    line = _one_line(done.stderr)
    assert done.returncode == 2 and str(target) in line and "not a regular file" in line


# ------------------------------------------------------------------ WAL-mode nsys exports
def _wal_export(folder: Path) -> Path:
    from fixtures.nsys_synthetic import write_export
    folder.mkdir()
    path = folder / "run.sqlite"
    write_export(path)
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.close()  # the last connection checkpoints and removes -wal and -shm
    assert sorted(p.name for p in folder.iterdir()) == ["run.sqlite"]
    return path


def test_a_wal_mode_export_on_read_only_media_is_read_without_side_files(capsys, tmp_path):
    path = _wal_export(tmp_path / "ro")
    before = path.read_bytes()
    path.parent.chmod(0o555)  # as root this does not stop writes: no side files is the check
    try:
        code, out, err = _run(capsys, "info", str(path), "--cache-dir", str(tmp_path / "c"),
                              "--json")
    finally:
        path.parent.chmod(0o755)
    assert code == 0, err
    assert '"stored_events"' in out and "cannot be read" not in err
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.sqlite"]
    assert path.read_bytes() == before


def test_a_wal_mode_export_with_changes_only_in_its_wal_is_one_line(capsys, tmp_path):
    path = _wal_export(tmp_path / "live")
    writer = sqlite3.connect(path)  # a writer still at work: its changes are in the -wal
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE extra(x)")
    writer.commit()
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("run.sqlite", "run.sqlite-wal"):  # copied while open, without the -shm
        shutil.copyfile(path.parent / name, copy / name)
    writer.close()
    code, _, err = _run(capsys, "info", str(copy / "run.sqlite"), "--cache-dir",
                        str(tmp_path / "c"))
    line = _one_line(err)
    assert code == 2 and str(copy / "run.sqlite") in line and "run.sqlite-wal" in line
    assert sorted(p.name for p in copy.iterdir()) == ["run.sqlite", "run.sqlite-wal"]


# ------------------------------------------------------------------ wrapped clocks
_EVENTS = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 100.5, "dur": 3},
           {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 200, "dur": 3,
            "args": {"device": 0, "stream": 7, "correlation": 1}}]


@pytest.mark.parametrize("base", ["9223372036854775000", "18446744073709551615", "-5"])
@pytest.mark.parametrize("path", ["C scanner", "pure Python"])
@pytest.mark.parametrize("gz", [False, True])
def test_a_clock_base_that_wraps_the_times_is_refused_naming_the_field(tmp_path, base, path,
                                                                       gz):
    import gzip
    import json
    text = f'{{"baseTimeNanoseconds": {base}, "traceEvents": {json.dumps(_EVENTS)}}}'.encode()
    trace = tmp_path / ("trace.json.gz" if gz else "trace.json")
    trace.write_bytes(gzip.compress(text) if gz else text)
    env = {"TRACEVIEW_PURE_PYTHON": "1"} if path == "pure Python" else {}
    done = _cli("info", str(trace), "--no-cache", env=env)
    line = _one_line(done.stderr)
    assert done.returncode == 2 and str(trace) in line and "baseTimeNanoseconds" in line


def test_a_clock_base_near_the_limit_that_fits_is_kept(capsys, tmp_path):
    import json
    base = 2**63 - 1 - 1_000_000  # 1 ms of room: the events end 0.2 ms after it
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"baseTimeNanoseconds": base, "traceEvents": _EVENTS}))
    code, out, err = _run(capsys, "sql", str(trace), "select min(ts_ns) as t from events",
                          "--no-cache", "--json")
    assert code == 0, err
    assert json.loads(out) == [{"t": base + 100_500}]


# ------------------------------------------------------------------ damaged caches
def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:  # in place: same inode, as a bad disk or a stray write does
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("first", ["sql", "info", "summary"])
def test_a_flipped_byte_in_a_cached_events_file_is_healed_for_sql(capsys, tmp_path, first):
    cache = str(tmp_path / "cache")
    query = ["sql", str(GLOO), "select count(*) as n, sum(ts_ns) as t from events", "--json"]
    argv = {"sql": query, "info": ["info", str(GLOO)], "summary": ["summary", str(GLOO)]}[first]
    assert _run(capsys, *argv, "--cache-dir", cache)[0] == 0
    code, truth, _ = _run(capsys, *query, "--cache-dir", cache)
    entries = [e for e in Path(cache).iterdir() if (e / "meta.json").exists()]
    assert code == 0 and len(entries) == 2
    for entry in entries:
        events = entry / "events.parquet"
        _flip(events, events.stat().st_size // 2)
    code, out, err = _run(capsys, *query, "--cache-dir", cache)
    assert code == 0 and out == truth
    assert len([line for line in err.splitlines() if "cache entry" in line]) == 2


@pytest.mark.parametrize("command", ["summary", "sql"])
def test_every_cached_parquet_file_flipped_in_the_middle_is_healed(capsys, tmp_path, command):
    """Issue 19's case: a byte flipped at half the length of every Parquet file in the cache
    (events entries and derived GPU rows; the byte lands in page data, not the footer), then a
    command: the same answer, with the warning that the cache was damaged and rebuilt."""
    trace = FIXTURES / "data" / "gpu_real"  # GPU rows: summary keeps derived rows too
    cache = str(tmp_path / "cache")
    argv = {"summary": ["summary", str(trace), "--json"],
            "sql": ["sql", str(trace), "select count(*) as n, sum(ts_ns) as t, sum(step) as s "
                    "from events", "--json"]}[command]
    assert _run(capsys, "summary", str(trace), "--cache-dir", cache)[0] == 0
    code, truth, _ = _run(capsys, *argv, "--cache-dir", cache)
    flipped = sorted(Path(cache).rglob("*.parquet"))
    assert code == 0 and {p.parent.name == "derived" for p in flipped} == {True, False}
    for path in flipped:
        _flip(path, path.stat().st_size // 2)
    # the answer kept for this command line would be printed without reading them
    shutil.rmtree(Path(cache) / "answers", ignore_errors=True)
    code, out, err = _run(capsys, *argv, "--cache-dir", cache)
    assert code == 0 and "internal error" not in err, err
    assert "cache entry" in err and "could not be used" in err
    if command == "sql":
        assert out == truth
    else:
        said, first = json.loads(out), json.loads(truth)
        assert any("cache entry" in w for w in said.pop("warnings"))
        said.pop("warnings_plain"), first.pop("warnings"), first.pop("warnings_plain")
        assert said == first


@pytest.mark.parametrize("at", ["middle", "first", "last"])
def test_a_damaged_content_id_memo_is_hashed_again(capsys, tmp_path, at):
    """The cache remembers each file's content id by its identity on disk (ids/*.txt). A memo
    with a byte flipped (invalid UTF-8 in the middle, or another hex digit) is not used: the
    file is hashed again, so the cache key and the files' content_id stay right."""
    cache = tmp_path / "cache"
    query = ["sql", str(GLOO), "select path, content_id, stored_events from files order by path",
             "--json", "--cache-dir", str(cache)]
    assert _run(capsys, *query)[0] == 0
    memos = sorted((cache / "ids").glob("*.txt"))
    assert len(memos) == 2  # the inputs are old: their ids are remembered
    code, truth, _ = _run(capsys, *query)
    for memo in memos:
        size = memo.stat().st_size
        where = {"middle": size // 2, "first": 0, "last": size - 1}[at]
        with open(memo, "r+b") as fh:
            fh.seek(where)
            byte = fh.read(1)[0]
            fh.seek(where)
            # in the middle: not UTF-8; elsewhere another hex digit ('0' <-> '1', 'a' <-> 'b')
            fh.write(bytes([byte ^ (0xFF if at == "middle" else 0x01)]))
    code, out, err = _run(capsys, *query)
    assert code == 0 and "internal error" not in err, err
    assert json.loads(out) == json.loads(truth)
    assert "cache entry" not in err  # the entries themselves were found, whole


@pytest.mark.parametrize("damage", ["truncated", "flipped", "emptied", "record garbage"])
def test_damaged_derived_gpu_rows_are_computed_again_with_one_warning(capsys, tmp_path,
                                                                      damage):
    from fixtures.nsys_synthetic import write_export
    trace = tmp_path / "run.sqlite"
    write_export(trace)  # GPU rows: the derived table is kept
    cache = str(tmp_path / "cache")
    code, first, _ = _run(capsys, "summary", str(trace), "--cache-dir", cache, "--json")
    kept = sorted((Path(cache) / "derived").glob("gpu-*.parquet"))
    assert code == 0 and len(kept) == 1
    rows, record = kept[0], kept[0].with_name(kept[0].name + ".json")
    {"truncated": lambda: os.truncate(rows, rows.stat().st_size // 2),
     "flipped": lambda: _flip(rows, rows.stat().st_size // 2),
     "emptied": lambda: rows.write_bytes(b""),
     "record garbage": lambda: record.write_text("garbage{{")}[damage]()
    code, again, err = _run(capsys, "summary", str(trace), "--cache-dir", cache, "--json")
    assert code == 0 and "internal error" not in err
    warned = [line for line in err.splitlines() if "cache entry" in line]
    assert len(warned) == 1 and str(rows) in warned[0]
    assert any("cache entry" in w for w in json.loads(again)["warnings"])
    strip = lambda text: {k: v for k, v in json.loads(text).items()  # noqa: E731
                          if k not in ("warnings", "warnings_plain")}
    assert strip(again) == strip(first)
    code, third, err = _run(capsys, "summary", str(trace), "--cache-dir", cache, "--json")
    assert code == 0 and "cache entry" not in err and third == first  # healed


# ------------------------------------------------------------------ a file changing while read
#: Trace sizes: a few events (hashed before the parse), and past 1 MB (uncompressed Kineto
#: from ``kineto._parse.FOLLOW_FROM_BYTES``: mapped, and once settled parsed first, keyed by
#: the bytes it read)
SIZES = {"small": 0, "large": 1 << 20}


def _trace_text(n: int, padding: int = 0) -> str:
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1,
               "ts": 100 + 10 * i, "dur": 5} for i in range(n)]
    return json.dumps({"traceEvents": events, "padding": "x" * padding})


def _growing_while_parsed(monkeypatch, trace: Path, every_read: bool, padding: int = 0
                          ) -> list[int]:
    """The real parser, with the file grown (rewritten with one more event, as a profiler
    still writing it would) while each read is under way: after the cache key was hashed
    (or, for a file parsed first, after its bytes were read)."""
    from traceview.store import ingest
    real, reads = ingest.parse_batched, []

    def parse_while_it_grows(path, **options):
        parsed = real(path, **options)
        if every_read or not reads:
            trace.write_text(_trace_text(5 + len(reads) + 1, padding))
        reads.append(parsed.input_events)
        return parsed

    monkeypatch.setattr(ingest, "parse_batched", parse_while_it_grows)
    return reads


@pytest.mark.parametrize("settled", [False, True], ids=["just-written", "settled"])
@pytest.mark.parametrize("size", SIZES)
def test_a_file_that_grows_while_read_never_poisons_the_cache(capsys, tmp_path, monkeypatch,
                                                              size, settled):
    """Written in the last two seconds, a file's identity on disk cannot tell a change (it is
    hashed again); settled, its identity tells."""
    import time

    import xxhash
    trace = tmp_path / "trace.json"
    trace.write_text(_trace_text(5, SIZES[size]))
    if settled:
        time.sleep(2.1)  # past store.cache_folder.SETTLED_NS
    old_hash = xxhash.xxh3_128_hexdigest(trace.read_bytes())
    cache = tmp_path / "cache"
    reads = _growing_while_parsed(monkeypatch, trace, every_read=False, padding=SIZES[size])
    code, out, err = _run(capsys, "info", str(trace), "--cache-dir", str(cache), "--json")
    assert code == 0, err
    assert reads == [5, 6] and json.loads(out)["stored_events"] == 6  # the file as it is now
    assert any("changed while it was read" in line and str(trace) in line
               for line in err.splitlines())
    # every complete entry holds the parse of the bytes its meta.json names
    from traceview.store.parquet import read_cache_meta
    complete = [read_cache_meta(e, cache) for e in cache.iterdir() if (e / "meta.json").exists()]
    assert [m["content_id"] for m in complete] == [
        xxhash.xxh3_128_hexdigest(trace.read_bytes())] != [old_hash]
    assert [m["stored_events"] for m in complete] == [6]
    # and the old bytes, read again, are parsed as what they are
    monkeypatch.undo()
    trace.write_text(_trace_text(5, SIZES[size]))
    code, out, err = _run(capsys, "info", str(trace), "--cache-dir", str(cache), "--json")
    assert code == 0 and json.loads(out)["stored_events"] == 5 and "changed" not in err


@pytest.mark.parametrize("size", SIZES)
def test_a_file_that_keeps_changing_while_read_is_one_line(capsys, tmp_path, monkeypatch, size):
    trace = tmp_path / "trace.json"
    trace.write_text(_trace_text(5, SIZES[size]))
    cache = tmp_path / "cache"
    _growing_while_parsed(monkeypatch, trace, every_read=True, padding=SIZES[size])
    code, _, err = _run(capsys, "info", str(trace), "--cache-dir", str(cache))
    line = _one_line(err)
    assert code == 2 and str(trace) in line and "kept changing while it was read" in line
    assert not [e for e in cache.iterdir() if (e / "meta.json").exists()]


# ------------------------------------------------------------------ a terminated driver
@pytest.fixture(scope="module")
def large_ranks(tmp_path_factory):
    """Two ranks large enough that a pool's workers are busy parsing for a while."""
    out = tmp_path_factory.mktemp("large") / "run"
    subprocess.run([sys.executable, "-m", "fixtures.synthetic", "--out", str(out),
                    "--world-size", "2", "--target-mb", "60", "--no-gzip"], check=True,
                   capture_output=True, cwd=ROOT, env=dict(os.environ))
    (out / "ground_truth.json").unlink()
    return out


def _eof_within(pipe, seconds: float) -> bool:
    """Whether ``pipe`` reaches its end (every writer gone) within ``seconds``."""
    import select
    import time
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([pipe], [], [], left)[0] and not os.read(pipe.fileno(), 1 << 16):
            return True
    return False


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGKILL"])
def test_a_stopped_driver_stops_the_pool_workers_and_frees_the_callers_pipes(
        large_ranks, tmp_path, signum):
    """SIGTERM: the driver stops its workers and fork server. SIGKILL: it cannot, so each
    worker watches it (and the fork server its own end of the driver's pipe): they leave
    within seconds instead of parsing to the end, holding the caller's pipes."""
    import signal
    import time

    psutil = pytest.importorskip("psutil")
    driver = subprocess.Popen(
        [sys.executable, "-m", "traceview", "info", str(large_ranks), "--executor", "local",
         "--cache-dir", str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env=dict(os.environ))
    family: list = []
    try:
        deadline, workers = time.monotonic() + 90, []
        while time.monotonic() < deadline and driver.poll() is None and len(workers) < 2:
            family = psutil.Process(driver.pid).children(recursive=True)
            workers = [p for p in family if p.ppid() != driver.pid]  # the fork server's
            time.sleep(0.05)
        assert driver.poll() is None and len(workers) >= 2, "no pool workers seen at work"
        sent = getattr(signal, signum)
        driver.send_signal(sent)
        assert driver.wait(timeout=15) == (128 + sent if sent == signal.SIGTERM else -sent)
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, f"outlived the driver: {alive}"
        assert _eof_within(driver.stdout, 10) and _eof_within(driver.stderr, 10)
    finally:
        if driver.poll() is None:
            driver.kill()
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


# From 0.2 s: the interpreter's own start (its site, runpy) comes before any code of ours, and
# a Ctrl-C there is Python's traceback for every program; measured here it ends by ~0.05 s.
@pytest.mark.parametrize("after_s", [0.2, 0.5])
def test_ctrl_c_while_the_program_starts_is_exit_130_without_a_traceback(tmp_path, after_s):
    """SIGINT while the command's libraries are still being imported (before ``main``'s own
    handler) was a KeyboardInterrupt traceback and death by the signal."""
    import signal
    import time

    driver = subprocess.Popen(
        [sys.executable, "-m", "traceview", "summary", str(GLOO), "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=dict(os.environ))
    time.sleep(after_s)
    driver.send_signal(signal.SIGINT)
    _, err = driver.communicate(timeout=60)
    # 0: it had already answered; -SIGINT: the signal came as the interpreter was exiting
    # after the answer, when Python has handed SIGINT back to the system (a shell reports
    # that as 130 too; nothing is printed)
    assert driver.returncode in (0, 130, -signal.SIGINT), err
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err


def test_ctrl_c_in_the_final_collection_is_exit_130(monkeypatch):
    """The program's last step, collecting what the command left, is after its own handlers:
    a Ctrl-C there (CI caught one at 0.5 s) was a KeyboardInterrupt traceback."""
    import gc

    from traceview import cli

    def interrupted() -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.gc, "collect", interrupted)
    monkeypatch.setattr(sys, "argv", ["traceview"])  # no command: help, then the collection
    try:
        assert cli.console_main() == 130
    finally:
        gc.unfreeze()  # console_main froze this process's objects, as at a program's end


# ------------------------------------------------------------------ remote inputs, no network
def test_a_remote_store_that_never_answers_is_one_line_in_bounded_time(tmp_path):
    import socket
    import time
    server = socket.socket()  # accepts connections, never answers: a network that hangs
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    url = (f"s3://bucket/run7?endpoint_override=127.0.0.1:{server.getsockname()[1]}"
           "&scheme=http")
    began = time.monotonic()
    try:
        done = _cli("info", url, "--no-cache", timeout=60, env={
            "TRACEVIEW_REMOTE_TIMEOUT": "2", "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y", "AWS_EC2_METADATA_DISABLED": "true"})
    finally:
        server.close()
    line = _one_line(done.stderr)
    assert done.returncode == 2 and url in line and "no answer in 2 s" in line
    assert time.monotonic() - began < 30


def test_a_url_of_an_unknown_scheme_fails_fast(tmp_path):
    done = _cli("info", "nosuchscheme://bucket/run7", "--no-cache", timeout=60)
    assert done.returncode == 2 and "nosuchscheme://bucket/run7" in _one_line(done.stderr)


# ------------------------------------------------------------------ a file cut while scanned
def _cut_at_first_read(path: Path, keep: int):
    """``open``, but the real file is cut to ``keep`` bytes (by another writer, as it were)
    between its size being taken and its first block read: the cut lands mid-read, every
    time (a mapped file lost its pages there: SIGBUS)."""
    def opener(name, mode):
        fh = open(name, mode)
        first = fh.readinto

        def readinto(buffer):
            os.truncate(path, keep)
            fh.readinto = first
            return first(buffer)

        fh.readinto = readinto
        return fh
    return opener


@pytest.mark.parametrize("follow", [False, True])
def test_a_file_cut_while_it_is_read_is_a_failed_read_not_a_signal(tmp_path, follow):
    from traceview.parsers.kineto import _input
    trace = tmp_path / "trace.json"
    trace.write_text(_trace_text(200_000))  # ~ 20 MB: several blocks
    size = trace.stat().st_size
    opener = _cut_at_first_read(trace, size // 3)
    if follow:
        reading = _input._InflatingMap(trace, size, 1 << 20, opener=opener)
        reading._thread.join()
        got, state = reading.progress[:8], reading.progress[8:16]
        from traceview.parsers.kineto import _scan
        assert int.from_bytes(state, "little", signed=True) == _scan.FAILED
        assert int.from_bytes(got, "little") < size
        reading.stop()
        reading.map.close()
    else:
        assert _input._read_into_map(trace, size, opener) is None  # not what was sized


@pytest.fixture(scope="module")
def mid_ranks(tmp_path_factory):
    """Two ranks small enough together (< 64 MB) to be parsed in the driver itself."""
    out = tmp_path_factory.mktemp("mid") / "run"
    subprocess.run([sys.executable, "-m", "fixtures.synthetic", "--out", str(out),
                    "--world-size", "2", "--target-mb", "25", "--no-gzip"], check=True,
                   capture_output=True, cwd=ROOT, env=dict(os.environ))
    (out / "ground_truth.json").unlink()
    return out


@pytest.mark.parametrize("ranks", ["in the driver", "in pool workers"])
def test_a_rank_cut_while_the_folder_is_scanned_never_kills_the_process(
        request, tmp_path, ranks):
    """A real concurrent truncation: another process cuts a rank's file as soon as a traceview
    process has it open or mapped (its scan under way: a mapped file's lost pages killed the
    worker with SIGBUS, and the run with it). The answer is an exit code and words."""
    import time
    psutil = pytest.importorskip("psutil")
    source = request.getfixturevalue("mid_ranks" if ranks == "in the driver" else "large_ranks")
    folder = shutil.copytree(source, tmp_path / "run")
    victim = sorted(folder.iterdir())[-1]
    driver = subprocess.Popen(
        [sys.executable, "-m", "traceview", "info", str(folder), "--skip-bad", "--no-cache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ))

    def reading_it(p) -> bool:
        try:
            held = [f.path for f in p.open_files()] + [m.path for m in p.memory_maps()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        return str(victim) in held

    deadline = time.monotonic() + 120
    while driver.poll() is None and time.monotonic() < deadline:
        me = psutil.Process(driver.pid)
        if any(reading_it(p) for p in [me, *me.children(recursive=True)]):
            break
    subprocess.run([sys.executable, "-c", f"import os; os.truncate({str(victim)!r}, "
                    f"{victim.stat().st_size // 3})"], check=True)
    out, err = driver.communicate(timeout=300)
    assert driver.returncode in (0, 2), (driver.returncode, err)  # SIGBUS: -7, no word said
    assert "Traceback" not in err and "internal error" not in err
    if driver.returncode == 2:
        assert str(victim) in _one_line(err)
    else:  # a partial answer, and why (info prints its warnings with its text)
        assert str(victim) in out


def test_a_dangling_symlink_in_a_folder_is_skipped_with_a_warning(capsys, tmp_path):
    """A link whose target is gone (a 'latest' link after a clean-up) is no reason to refuse
    the folder: the others are read, the link is named in a warning. Named alone, it is an
    error (tests/test_cli_core.py)."""
    folder = shutil.copytree(GLOO, tmp_path / "in")
    link = folder / "rank-2.pt.trace.json"
    link.symlink_to(tmp_path / "gone.json")
    code, out, err = _run(capsys, "info", str(folder), "--cache-dir", str(tmp_path / "c"),
                          "--json")
    assert code == 0 and out.count('"rank":') == 2
    said = [line for line in err.splitlines() if str(link) in line]
    assert len(said) == 1 and "does not exist" in said[0] and "warning" in said[0]


def test_sql_says_a_damaged_kept_table_was_made_again(capsys, tmp_path):
    """A flipped byte in a kept table that a query reads (the classified GPU rows) is found
    and the table made again; sql says so on stderr, as every other command does, and its
    answer is the undamaged one."""
    gpu = FIXTURES / "data" / "gpu_real"
    cache = str(tmp_path / "c")
    query = "select count(*) as n, sum(dur_ns) as busy from gpu"
    code, before, _ = _run(capsys, "sql", str(gpu), query, "--cache-dir", cache, "--json")
    assert code == 0
    kept = next((tmp_path / "c" / "derived").glob("gpu-*.parquet"))
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0x01
    kept.write_bytes(bytes(data))
    code, after, err = _run(capsys, "sql", str(gpu), query, "--cache-dir", cache, "--json")
    assert code == 0 and after == before
    assert str(kept) in err and "could not be used" in err


def test_the_same_trace_named_twice_is_read_once(capsys, tmp_path):
    """The same file twice, a folder and one of its files, or a link beside its target: one
    file, read once (it was refused as two files claiming rank 0)."""
    first = sorted(GLOO.iterdir())[0]
    link = tmp_path / "link.pt.trace.json.gz"
    link.symlink_to(first)
    code, alone, _ = _run(capsys, "info", str(GLOO), "--json", "--no-cache")
    assert code == 0
    for argv in ([str(first), str(first)], [str(GLOO), str(first)],
                 [str(first), str(GLOO)], [str(GLOO), str(link)]):
        code, out, err = _run(capsys, "info", *argv, "--json", "--no-cache")
        assert code == 0, (argv, err)
        doc = json.loads(out)
        assert doc["files"] == (json.loads(alone)["files"] if str(GLOO) in argv else 1)
