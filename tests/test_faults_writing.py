"""Faults in what traceview writes and prints: a user's files beside an output or in a store
are never removed, a store written over another on a full disk leaves the old one whole,
every error is one line naming its file, names from a trace never reach a terminal, an XML
or an HTML page as control characters, ranks come from per-rank file names, and accelerator
device events keep the stream their trace gives them.

Full disks are real: a small tmpfs where the tests may mount one (as root), else a file size
limit (RLIMIT_FSIZE) in a child process, which makes its writes fail with EFBIG."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.helpers import write_trace
from traceview.cli import main
from traceview.store import safe_write

GLOO = FIXTURES / "data" / "gloo_ddp_2r"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _gone_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    return int(child.stdout)


def _tiny_trace(path: Path, rank: int = 0) -> Path:
    """A one-rank Kineto trace of a few events."""
    return write_trace(path, [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10,
         "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12, "dur": 3,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
    ], distributedInfo={"rank": rank, "world_size": 1})


def _mount_tmpfs(folder: Path, size: str) -> bool:
    """A tmpfs of ``size`` at ``folder`` (made), when this process may mount one."""
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True)
    return done.returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB filesystem of its own (tmpfs), unmounted afterwards; skips where none can be
    mounted."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture
def other_filesystem(tmp_path):
    """A folder on another filesystem than ``tmp_path`` (so a store there cannot hard-link the
    cache's files and copies them): a tmpfs, else /dev/shm; skips where there is neither."""
    disk = tmp_path / "other"
    if _mount_tmpfs(disk, "64m"):
        try:
            yield disk
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        return
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem to write to")
    folder = Path(tempfile.mkdtemp(dir=shm))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _fill(disk: Path) -> None:
    """Fill the filesystem of ``disk`` to the last byte."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _limited(file_bytes: int):
    """For a child process: files it writes stop at ``file_bytes`` (EFBIG, not SIGXFSZ)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    return limit


def _traceview(*argv: str, file_bytes: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceview", *argv], capture_output=True,
                          text=True, preexec_fn=_limited(file_bytes) if file_bytes else None)


# ------------------------------------------------------------- 1. a user's files are theirs
def _users_files(folder: Path) -> list[Path]:
    """Hidden ``.tmp`` files a user (or another tool) keeps, aged two hours, one named as an
    older traceview named its temporaries, with the id of a process that is gone."""
    files = [folder / ".notes.tmp", folder / ".swap.tmp",
             folder / f".rank-00000.parquet.{_gone_pid()}.abcd1234.tmp"]
    old = time.time() - 7200
    for path in files:
        path.write_text("mine")
        os.utime(path, (old, old))
    return files


def test_a_users_tmp_files_in_a_store_or_beside_an_output_are_never_removed(capsys, tmp_path):
    store, outputs, cache = tmp_path / "store", tmp_path / "outputs", tmp_path / "cache"
    assert _run(capsys, "ingest", str(GLOO), "-o", str(store), "--cache-dir", str(cache))[0] == 0
    outputs.mkdir()
    (cache / "ids").mkdir(exist_ok=True)
    kept = [*_users_files(store), *_users_files(outputs), *_users_files(cache / "ids")]
    assert _run(capsys, "info", str(store))[0] == 0
    assert _run(capsys, "summary", str(store))[0] == 0
    assert _run(capsys, "info", str(GLOO), "--cache-dir", str(cache))[0] == 0
    assert _run(capsys, "baseline", str(GLOO), "-o", str(outputs / "base.json"),
                "--cache-dir", str(cache))[0] == 0
    assert _run(capsys, "export-perfetto", str(GLOO), "-o", str(outputs / "t.json"),
                "--cache-dir", str(cache))[0] == 0
    assert _run(capsys, "ingest", str(GLOO), "-o", str(store), "--cache-dir", str(cache))[0] == 0
    assert [p for p in kept if not p.exists()] == []
    assert all(p.read_text() == "mine" for p in kept)


def test_a_users_folder_in_the_temporary_folder_is_never_removed(capsys, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = tmp_path / f"traceview-{_gone_pid()}-results"  # named like an older private cache
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert _run(capsys, "info", str(GLOO), "--no-cache")[0] == 0
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_store_that_is_only_read_is_not_swept_and_one_written_is(capsys, tmp_path):
    store = tmp_path / "store"
    assert _run(capsys, "ingest", str(GLOO), "-o", str(store))[0] == 0
    ours = store / safe_write.temporary_name("rank-00001.parquet", pid=_gone_pid())
    ours.write_bytes(b"PAR1half")
    assert _run(capsys, "info", str(store))[0] == 0
    assert ours.exists()  # reading never removes anything
    assert _run(capsys, "ingest", str(GLOO), "-o", str(store))[0] == 0
    assert not ours.exists()  # writing the store again sweeps a killed writer's leftovers


def test_temporaries_are_named_as_traceviews_and_only_those_are_removed(tmp_path):
    gone = _gone_pid()
    ours_dead = tmp_path / safe_write.temporary_name("x.parquet", pid=gone)
    ours_alive = tmp_path / safe_write.temporary_name("x.parquet")
    elsewhere = tmp_path / safe_write.temporary_name("x.parquet", pid=gone, host="0badc0de")
    other_file = tmp_path / safe_write.temporary_name("y.parquet", pid=gone)
    for path in (ours_dead, ours_alive, elsewhere, other_file):
        path.write_text("half")
    assert safe_write.is_ours(ours_dead, "x.parquet") and not safe_write.is_ours(
        tmp_path / ".x.parquet.123.abcdefgh.tmp")
    safe_write.write_text(tmp_path / "x.parquet", "whole")
    assert not ours_dead.exists()
    assert ours_alive.exists() and elsewhere.exists() and other_file.exists()
    assert (tmp_path / "x.parquet").read_text() == "whole"


# ------------------------------------------------- 2. a store over a store on a full disk
def _store_ranks(store: Path) -> list[tuple[int, str]]:
    said = json.loads(_traceview("info", str(store), "--json").stdout)
    return [(r["rank"], Path(r["file"]).name) for r in said["ranks"]]


def test_a_store_over_a_store_on_a_full_disk_leaves_the_old_store_whole(capsys, tmp_path,
                                                                       small_disk):
    tiny = _tiny_trace(tmp_path / "tiny.json")
    store = small_disk / "store"
    assert _run(capsys, "ingest", str(tiny), "-o", str(store))[0] == 0
    assert _run(capsys, "info", str(GLOO))[0] == 0  # in the cache, on the other disk
    before = sorted(p.name for p in store.iterdir())
    _fill(small_disk)
    code, out, err = _run(capsys, "ingest", str(GLOO), "-o", str(store))
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err, err
    assert "No space left on device" in err and str(store) in err
    assert sorted(p.name for p in store.iterdir()) == before  # nothing left half-written
    (small_disk / "filler").unlink()
    assert _store_ranks(store) == [(0, "tiny.json")]  # the old store reads, whole


def test_a_store_over_a_store_past_a_file_size_limit_leaves_the_old_store_whole(
        capsys, tmp_path, other_filesystem):
    tiny = _tiny_trace(tmp_path / "tiny.json")
    store = other_filesystem / "store"
    assert _run(capsys, "ingest", str(tiny), "-o", str(store))[0] == 0
    assert _run(capsys, "info", str(GLOO))[0] == 0  # cached: the child only copies
    before = sorted(p.name for p in store.iterdir())
    # the tiny trace's files fit in 20 kB; the run's 37 kB rank files do not
    done = _traceview("ingest", str(GLOO), "-o", str(store), file_bytes=20_000)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "rank-0000" in done.stderr
    assert "File too large" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in store.iterdir()) == before
    assert _store_ranks(store) == [(0, "tiny.json")]
    assert _run(capsys, "ingest", str(GLOO), "-o", str(store))[0] == 0  # with room: replaced
    assert _store_ranks(store) == [(0, "rank-0.gloo_ddp.pt.trace.json.gz"),
                                   (1, "rank-1.gloo_ddp.pt.trace.json.gz")]


# ------------------------------------------------------------------- 3. one line, its file
@pytest.mark.parametrize("command", ["report", "export-perfetto", "baseline", "junit"])
def test_an_output_on_a_full_disk_is_one_line_naming_it(capsys, tmp_path, command):
    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(GLOO), "-o", str(base))[0] == 0
    target = tmp_path / "out" / {"junit": "results.xml", "baseline": "b.json"}.get(
        command, "out.html")
    target.parent.mkdir()
    argv = (["check", str(GLOO), "--baseline", str(base), "--junit", str(target)]
            if command == "junit" else [command, str(GLOO), "-o", str(target)])
    assert _run(capsys, *argv)[0] == 0  # the cache warm: the child writes only the output
    target.unlink()
    done = _traceview(*argv, file_bytes=200)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "internal error" not in done.stderr
    assert f"{target}: cannot write (File too large)" in done.stderr
    assert list(target.parent.iterdir()) == []  # no temporary left beside it


@pytest.mark.parametrize("command", ["report", "export-perfetto", "baseline", "junit"])
def test_an_output_that_is_a_pipe_is_written_through_it_and_stays_a_pipe(capsys, tmp_path,
                                                                         command):
    """``-o /dev/stdout`` or a named pipe: the bytes go through it. A temporary renamed over it
    would replace the pipe (or, as root, a device node such as /dev/full) with a file."""
    import threading

    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(GLOO), "-o", str(base))[0] == 0
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    argv = (["check", str(GLOO), "--baseline", str(base), "--junit", str(pipe)]
            if command == "junit" else [command, str(GLOO), "-o", str(pipe)])
    code, _, err = _run(capsys, *argv)
    reader.join(timeout=60)
    assert code == 0, err
    assert received and len(received[0]) > 100
    assert pipe.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json", "pipe"]


@pytest.mark.parametrize("command", ["report", "export-perfetto", "baseline", "junit"])
@pytest.mark.parametrize("link", ["/dev/stdout", "/proc/self/fd/1"])
def test_an_output_naming_stdout_redirected_to_a_file_is_written_through_it(tmp_path, command,
                                                                           link):
    """``-o /dev/stdout`` with stdout redirected to a file (a CI log): the path stats as that
    regular file, but it is the descriptor, not a name to rename over; as root a rename
    replaced the /dev/stdout link itself and lost the output. Here a link of the test's own
    stands for /dev/stdout (the machine's is never put at risk): the bytes reach the file
    stdout was redirected to, after what was printed before, and the link stays a link."""
    base = tmp_path / "base.json"
    assert _traceview("baseline", str(GLOO), "-o", str(base)).returncode == 0
    out = tmp_path / "stdout.txt"
    alias = tmp_path / "my-stdout"
    alias.symlink_to(link)
    argv = (["check", str(GLOO), "--baseline", str(base), "--junit", str(alias)]
            if command == "junit" else [command, str(GLOO), "-o", str(alias)])
    with open(out, "wb") as stdout:
        stdout.write(b"BEFORE\n")
        stdout.flush()
        done = subprocess.run([sys.executable, "-m", "traceview", *argv], stdout=stdout,
                              stderr=subprocess.PIPE, text=True)
    assert done.returncode == 0, done.stderr
    assert alias.is_symlink() and os.readlink(alias) == link
    written = out.read_bytes()
    assert written.startswith(b"BEFORE\n") and len(written) > 200
    marker = {"report": b"<html", "export-perfetto": b"traceEvents", "baseline": b"metrics",
              "junit": b"<testsuite"}[command]
    assert marker in written.lower() if command == "report" else marker in written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.json", "my-stdout",
                                                          "stdout.txt"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_an_output_that_is_a_full_device_is_one_line_and_the_device_stays(capsys, tmp_path):
    full = tmp_path / "full"
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers
    code, _, err = _run(capsys, "baseline", str(GLOO), "-o", str(full))
    assert code == 2 and err == f"traceview: {full}: cannot write (No space left on device)\n"
    assert stat.S_ISCHR(full.stat().st_mode)


def test_an_input_whose_name_is_not_utf8_is_one_line_naming_it(capsys, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(GLOO / "rank-1.gloo_ddp.pt.trace.json.gz", folder)
    odd = os.fsdecode(bytes(folder) + b"/rank-0.\xff.pt.trace.json.gz")
    shutil.copy(GLOO / "rank-0.gloo_ddp.pt.trace.json.gz", odd)
    code, out, err = _run(capsys, "info", str(folder))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "rank-0.\\udcff.pt.trace.json.gz: its name is not valid UTF-8" in err
    code, out, err = _run(capsys, "info", str(folder), "--skip-bad")
    assert code == 0 and "skipped: " in out + err and "not valid UTF-8" in out + err


def test_a_file_name_with_a_newline_is_one_line_naming_it(capsys, tmp_path):
    bad = tmp_path / "two\nlines\x1b[2J.json"
    bad.write_text("garbage{")
    code, out, err = _run(capsys, "info", str(bad))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "two\\x0alines\\x1b[2J.json: not JSON" in err


def test_a_library_message_of_several_lines_is_one_line():
    from traceview.cli import error_line
    from traceview.errors import UsageError

    said = error_line(UsageError("SQL error: no column x\n\nResolved plan until failure:\n"
                                 "\t---> FAILED HERE RESOLVING 'sink' <---\n\x1b[31mDF\n"))
    assert "\n" not in said and "\x1b" not in said and "\t" not in said
    assert said.startswith("SQL error: no column x / Resolved plan until failure: / ")
    said = error_line(OSError(28, "No space\nleft", "/out/a\nb.html"))
    assert said == "/out/a\\x0ab.html: No space / left"


# ------------------------------------------------------------ 4. names never drive a screen
EVIL = ("gemm\x1b[2J\x1b]8;;https://x.example\x07link\x1b]8;;\x07\u202eevil\x85\x7f\x00"
        "\u2066z\u2028\ud7ff\u00e9\u4e2d\n\tq")
#: What must never reach an output for people as itself.
RAW = ["\x1b", "\x07", "\x00", "\x85", "\x7f", "\u202e", "\u2066", "\u2028"]


def _evil_run(folder: Path, name: str = EVIL) -> Path:
    """Two ranks of two steps each, their kernel and op named ``name``."""
    folder.mkdir()
    for rank in (0, 1):
        events = []
        for start in (0, 100):
            events += [
                {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{start // 100}",
                 "pid": 1, "tid": 1, "ts": start, "dur": 100},
                {"ph": "X", "cat": "cpu_op", "name": "op" + name, "pid": 1, "tid": 1,
                 "ts": start + 5, "dur": 50},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                 "tid": 1, "ts": start + 10, "dur": 5, "args": {"correlation": start + 1}},
                {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
                 "ts": start + 20, "dur": 30,
                 "args": {"correlation": start + 1, "device": 0, "stream": 7}}]
        write_trace(folder / f"rank-{rank}.json", events,
                    distributedInfo={"rank": rank, "world_size": 2})
    return folder


@pytest.mark.parametrize("command", ["breakdown", "gaps", "critical-path", "diagnose"])
def test_names_reach_the_terminal_escaped_and_json_keeps_them(capsys, tmp_path, command):
    run = _evil_run(tmp_path / "run")
    code, out, err = _run(capsys, command, str(run))
    assert code == 0, err
    assert "gemm\\x1b[2J\\x1b]8;;" in out
    assert not [c for c in RAW if c in out + err]
    code, out, _ = _run(capsys, command, str(run), "--json")
    assert code == 0 and EVIL in _strings(json.loads(out))  # --json: the exact name


def _strings(obj) -> set[str]:
    """Every string in a JSON document, keys and values."""
    if isinstance(obj, dict):
        return set(obj) | {s for v in obj.values() for s in _strings(v)}
    if isinstance(obj, list):
        return {s for v in obj for s in _strings(v)}
    return {obj} if isinstance(obj, str) else set()


def test_warnings_and_errors_reach_the_terminal_escaped(capsys, tmp_path):
    run = _evil_run(tmp_path / "run")
    cut = run / f"rank-1{EVIL.replace(chr(0), '').replace('/', '')}.json"
    data = (run / "rank-1.json").read_bytes()
    (run / "rank-1.json").unlink()
    cut.write_bytes(data[: len(data) * 2 // 3])  # a damaged file: a warning names it
    code, out, err = _run(capsys, "summary", str(run))
    assert code == 0 and "warning" in err and "\\x1b[2J" in err
    assert not [c for c in RAW if c in out + err]


def test_junit_with_hostile_names_is_valid_xml(capsys, tmp_path):
    import xml.etree.ElementTree as ET

    run = _evil_run(tmp_path / "run")
    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(run), "-o", str(base))[0] == 0
    cut = run / f"rank-1{EVIL.replace(chr(0), '').replace('/', '')}.json"
    data = (run / "rank-1.json").read_bytes()
    (run / "rank-1.json").unlink()
    cut.write_bytes(data[: len(data) * 2 // 3])
    junit = tmp_path / "results.xml"
    code, _, err = _run(capsys, "check", str(run), "--baseline", str(base), "--junit",
                        str(junit))
    assert code == 1, err  # the damaged input fails the check
    text = junit.read_text(encoding="utf-8")
    root = ET.fromstring(text.encode())  # XML 1.0: would raise on a raw control character
    failure = root.find(".//failure[@type='damaged_input']")
    assert failure is not None and "\\x1b[2J" in failure.get("message")
    assert not [c for c in RAW if c in text]


def test_the_report_shows_hostile_names_visibly(capsys, tmp_path):
    pytest.importorskip("plotly")
    run = _evil_run(tmp_path / "run")
    report = tmp_path / "r.html"
    assert _run(capsys, "report", str(run), "-o", str(report))[0] == 0
    page = report.read_text(encoding="utf-8")
    assert "gemm\\x1b[2J" in page and "\\u202eevil" in page
    # plotly.js itself holds a few raw control characters in its string literals: look only
    # where the names are
    around = [page[i - 10: i + 120] for i in range(len(page)) if page.startswith("gemm", i)]
    assert around and not [c for c in RAW for text in around if c in text]


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
                                  "PYTHONIOENCODING": ""}])
def test_non_ascii_names_on_an_ascii_stdout(tmp_path, env):
    run = _evil_run(tmp_path / "run", name="gemm_\u00e9_\u4e2d_\U0001f600")
    environ = {**os.environ, **env}
    text = subprocess.run([sys.executable, "-m", "traceview", "breakdown", str(run)],
                          capture_output=True, env=environ)
    assert text.returncode == 0, text.stderr
    assert b"gemm_\\xe9_\\u4e2d_\\U0001f600" in text.stdout
    said = subprocess.run([sys.executable, "-m", "traceview", "breakdown", str(run), "--json"],
                          capture_output=True, env=environ)
    assert said.returncode == 0, said.stderr
    said.stdout.decode("ascii")
    names = [k["name"] for k in json.loads(said.stdout)["top_kernels"]]
    assert "gemm_\u00e9_\u4e2d_\U0001f600" in names


# ------------------------------------------------------------------ 5. ranks from the name
@pytest.mark.parametrize("name,rank", [
    ("trace_rank0.sqlite", 0), ("trace_rank_12.json", 12), ("trace-rank-3.json.gz", 3),
    ("RANK7_trace.json", 7), ("job.Rank_2.pt.trace.json", 2), ("traceRank5.json", 5),
    ("node1rank4.json", 4), ("worker_9.json", 9), ("rank0of8.json", 0)])
def test_the_rank_in_a_file_name_anywhere(name, rank):
    from traceview.parsers import rank_from_file_name

    assert rank_from_file_name(name) == rank


@pytest.mark.parametrize("name", ["frank0.json", "tank_rank.json", "cranky3.json",
                                  "rankings_2.json", "trace.json", "rank.json",
                                  "local_rank0.json", "trace_localrank1.json"])
def test_no_rank_in_names_that_only_look_like_one(name):
    from traceview.parsers import rank_from_file_name

    assert rank_from_file_name(name) is None


def test_per_rank_nsys_exports_whose_contents_name_no_rank(capsys, tmp_path, corpus):
    """A real export copied per rank, every trace of its rank removed (environment, system
    environment): the ranks come from the names."""
    import sqlite3

    source = next(corpus.rglob("*.sqlite"))
    for rank in (0, 1):
        copy = tmp_path / f"trace_rank{rank}.sqlite"
        shutil.copyfile(source, copy)
        with sqlite3.connect(copy) as con:
            con.execute("delete from META_DATA_CAPTURE where value like '%RANK%' "
                        "or value like '%PROCID%'")
            con.execute("delete from TARGET_INFO_SYSTEM_ENV")
        con.close()
    code, out, err = _run(capsys, "info", str(tmp_path), "--json")
    assert code == 0, err
    assert [(r["rank"], r["rank_from"], Path(r["file"]).name)
            for r in json.loads(out)["ranks"]] == [(0, "file name", "trace_rank0.sqlite"),
                                                    (1, "file name", "trace_rank1.sqlite")]


# ------------------------------------------------------ 6. accelerator streams from args
def _mtia_trace(path: Path) -> Path:
    """An MTIA-like trace: two launches and their device events on threads 4 and 408, whose
    ``args.stream`` say streams 1 and 102, and a DMA event with no stream (thread 801)."""
    return write_trace(path, [
        {"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunch", "pid": 1, "tid": 1,
         "ts": 10, "dur": 2, "args": {"correlation": 5}},
        {"ph": "X", "cat": "mtia_runtime", "name": "mtiaLaunch", "pid": 1, "tid": 1,
         "ts": 20, "dur": 2, "args": {"correlation": 6}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "kernel_a", "pid": 9, "tid": 4,
         "ts": 15, "dur": 10, "args": {"stream": 1, "correlation": 5}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 9, "tid": 408,
         "ts": 25, "dur": 5, "args": {"stream": 102, "correlation": 6, "size": 16}},
        {"ph": "X", "cat": "mtia_ccp_events", "name": "dma_request", "pid": 9, "tid": 801,
         "ts": 40, "dur": 3, "args": {"size": 16}},
    ], distributedInfo={"rank": 0, "world_size": 1})


def _device_streams(path: Path) -> list[int]:
    """The streams of the device work of ``path``, as the analyses see them."""
    import traceview

    return sorted(traceview.open(path, cache=False).gpu.get_column("stream").unique())


@pytest.mark.parametrize("scanner", [True, False], ids=["C scanner", "pure Python"])
def test_accelerator_device_events_take_their_stream_from_args(tmp_path, monkeypatch,
                                                              scanner):
    from traceview.parsers.kineto import _parse

    if not scanner:
        monkeypatch.setattr(_parse, "_kineto_scan", None)
    elif _parse._kineto_scan is None:
        pytest.skip("the C scanner is not built")
    trace = _mtia_trace(tmp_path / "mtia.json")
    assert _device_streams(trace) == [1, 102, 801]  # 801: a thread's events with no stream


def test_the_corpus_mtia_trace_has_the_streams_it_names(corpus):
    trace = corpus / "hta-tests-data/tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz"
    if not trace.is_file():
        pytest.skip(f"{trace} not in the corpus")
    assert _device_streams(trace) == [1, 102, 801]  # 801: a thread's events with no stream


# ------------------------------------------------------- 7. a cache that will not take writes
def _without_warnings(text: str) -> dict:
    return {k: v for k, v in json.loads(text).items() if k not in ("warnings", "warnings_plain")}


CACHE_COMMANDS = {
    "summary": ["summary", str(GLOO), "--json"],
    "sql": ["sql", str(GLOO), "select count(*) as n, sum(step) as s, sum(ts_ns) as t "
            "from events", "--json"],
    "info": ["info", str(GLOO), "--json"],
}


@pytest.mark.parametrize("command", list(CACHE_COMMANDS))
def test_a_cache_past_a_file_size_limit_is_not_blamed_on_the_trace(capsys, tmp_path, command):
    """The cache's events files cannot be written (EFBIG): the trace was read, so the answer
    comes from the parse in memory, with one warning naming the cache folder and the reason."""
    argv = CACHE_COMMANDS[command]
    code, truth, _ = _run(capsys, *argv, "--no-cache")
    assert code == 0
    cache = tmp_path / "cache"
    done = _traceview(*argv, "--cache-dir", str(cache), file_bytes=20_000)
    assert done.returncode == 0, done.stderr
    assert "cannot parse" not in done.stderr and "Traceback" not in done.stderr
    warned = [line for line in done.stderr.splitlines() if "cache not written" in line]
    assert len(warned) == 1 and f"{cache}: File too large" in warned[0], done.stderr
    if command == "sql":  # --json is the query's rows alone; the warning is on stderr
        assert json.loads(done.stdout) == json.loads(truth)
        return
    said = json.loads(done.stdout)
    assert [w for w in said["warnings"] if "cache not written" in w] == [
        warned[0].removeprefix("traceview: warning: ")]
    if command == "summary":
        assert _without_warnings(done.stdout) == _without_warnings(truth)
    else:  # info lists the files it read, from the cache or not
        assert [r["stored_events"] for r in said["ranks"]] == \
            [r["stored_events"] for r in json.loads(truth)["ranks"]]


def test_temporary_files_past_a_file_size_limit_are_not_blamed_on_the_trace(capsys):
    argv = CACHE_COMMANDS["sql"]
    code, truth, _ = _run(capsys, *argv, "--no-cache")
    done = _traceview(*argv, "--no-cache", file_bytes=20_000)
    assert done.returncode == 0 and json.loads(done.stdout) == json.loads(truth), done.stderr
    assert done.stderr.count("temporary files not written") == 1, done.stderr
    assert "File too large" in done.stderr


def test_a_full_cache_disk_is_not_blamed_on_the_trace_and_a_store_is_still_written(
        capsys, tmp_path, small_disk):
    code, truth, _ = _run(capsys, "summary", str(GLOO), "--json", "--no-cache")
    cache = small_disk / "cache"
    cache.mkdir()
    _fill(small_disk)
    code, out, err = _run(capsys, "summary", str(GLOO), "--json", "--cache-dir", str(cache))
    assert code == 0, err
    assert err.count(f"cache not written: {cache}: No space left on device") == 1, err
    assert _without_warnings(out) == _without_warnings(truth)
    # -o on another disk: the store gets the events from memory, whole, and reads back
    store = tmp_path / "store"
    code, out, _ = _run(capsys, "ingest", str(GLOO), "-o", str(store), "--cache-dir", str(cache))
    assert code == 0 and out.count("warning: cache not written") == 1, out
    query = "select rank, count(*) as n, sum(ts_ns) as t from events group by rank order by rank"
    code, from_store, _ = _run(capsys, "sql", str(store), query, "--json")
    assert code == 0
    assert from_store == _run(capsys, "sql", str(GLOO), query, "--json", "--no-cache")[1]


def test_a_new_store_that_could_not_be_written_leaves_no_folder(capsys, tmp_path,
                                                                other_filesystem):
    """``ingest -o NEW/STORE`` past a file size limit (as a full disk): the folders it made
    are removed again, not left empty for the next command to take for a store."""
    assert _run(capsys, "info", str(GLOO))[0] == 0  # cached: the child only copies
    store = other_filesystem / "new" / "store"
    done = _traceview("ingest", str(GLOO), "-o", str(store), file_bytes=20_000)
    assert done.returncode == 2 and "File too large" in done.stderr, done.stderr
    assert not (other_filesystem / "new").exists()
