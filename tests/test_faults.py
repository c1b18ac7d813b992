"""Faults around the traces: a damaged or unusable cache, outputs aimed at inputs, killed
writers, empty selections. Each is answered by a warning and a full answer, or by one line and
exit 2; never by an internal error, and never by a changed input file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from traceview.store import safe_write
from traceview.cli import main

GLOO = FIXTURES / "data" / "gloo_ddp_2r"
NOISY = FIXTURES / "data" / "gloo_ddp_4r_noisy"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def inputs(tmp_path):
    """A copy of the 2-rank fixture, and its files' digests to check that nothing changed."""
    folder = shutil.copytree(GLOO, tmp_path / "in")
    return folder, _digests(folder)


# ---------------------------------------------------------------------------- damaged cache
def _flip(path, at):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated events": lambda e, m: os.truncate(e, e.stat().st_size // 2),
    "empty events": lambda e, m: e.write_bytes(b""),
    "flipped footer": lambda e, m: _flip(e, -20),
    "flipped page": lambda e, m: _flip(e, e.stat().st_size // 2),
    "missing events": lambda e, m: e.unlink(),
    "garbage meta": lambda e, m: m.write_text("garbage{{"),
    "foreign meta": lambda e, m: m.write_text('{"a": 1}'),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("command", ["summary", "sql", "export-perfetto"])
def test_a_damaged_cache_entry_is_parsed_again_with_one_warning(capsys, tmp_path, damage,
                                                                 command):
    cache = tmp_path / "cache"
    assert _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache))[0] == 0
    entries = [e for e in cache.iterdir() if (e / "meta.json").exists()]
    assert len(entries) == 2
    for entry in entries:
        DAMAGE[damage](entry / "events.parquet", entry / "meta.json")
    argv = {"summary": ["summary", str(GLOO)],
            "sql": ["sql", str(GLOO), "select count(*) as n from events"],
            "export-perfetto": ["export-perfetto", str(GLOO), "-o", str(tmp_path / "o.json")],
            }[command]
    code, out, err = _run(capsys, *argv, "--cache-dir", str(cache))
    assert code == 0, err
    warned = [line for line in err.splitlines() if "cache entry" in line]
    assert len(warned) == 2 and all(str(cache) in line for line in warned)
    assert "internal error" not in err
    # healed: the next run reads the rewritten entries without a word
    code, _, err = _run(capsys, *argv, "--cache-dir", str(cache))
    assert code == 0 and "cache entry" not in err


def test_an_entry_with_a_field_of_a_later_version_is_read_as_it_is(capsys, tmp_path):
    """A later version adds fields to meta.json (``rough_span`` did): this one reads the
    entry without a warning and without parsing the file again."""
    cache = tmp_path / "cache"
    code, first, _ = _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache), "--json")
    entries = [e for e in cache.iterdir() if (e / "meta.json").exists()]
    assert code == 0 and len(entries) == 2
    written = {}
    for entry in entries:
        meta = json.loads((entry / "meta.json").read_text())
        (entry / "meta.json").write_text(json.dumps({**meta, "added_later": {"x": 1}}))
        written[entry] = (entry / "events.parquet").stat().st_mtime_ns
    code, again, err = _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache), "--json")
    assert code == 0 and "cache entry" not in err and again == first
    assert all((e / "events.parquet").stat().st_mtime_ns == t for e, t in written.items())


def test_a_damaged_derived_table_is_computed_again(capsys, tmp_path):
    cache = tmp_path / "cache"
    code, first, _ = _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache), "--json")
    kept = list((cache / "derived").iterdir())
    assert code == 0 and kept
    for path in kept:
        _flip(path, path.stat().st_size // 2)
    code, again, err = _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache), "--json")
    assert code == 0 and "internal error" not in err
    # the same answer, with the one note that the damaged rows were computed again
    again = json.loads(again)
    for key in ("warnings", "warnings_plain"):
        assert [w for w in again.pop(key) if "cache entry" not in w] == []
    assert again == {k: v for k, v in json.loads(first).items()
                     if k not in ("warnings", "warnings_plain")}


def _as_another_user(path: Path, planted: bool) -> None:
    """``path`` as another user left it in a shared cache folder: theirs (root can make
    that), else writable by every user."""
    if planted and os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        os.chmod(path, 0o666)


@pytest.mark.parametrize("what", ["entries", "derived"])
@pytest.mark.parametrize("planted", [False, True], ids=["writable by others", "theirs"])
def test_cache_files_other_users_could_write_are_never_believed(capsys, tmp_path, planted,
                                                               monkeypatch, what):
    """A shared cache folder: an events file, an entry's record or a derived table another
    user could have written is not read (a forged one would change the answer), nor written
    into: the file is parsed again into a private folder, with one note each; the answer is
    the same."""
    monkeypatch.setenv("TRACEVIEW_ANSWERS", "off")  # the cache's tables, not a kept answer
    cache = tmp_path / "cache"
    code, first, _ = _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache), "--json")
    entries = [e for e in cache.iterdir() if (e / "meta.json").exists()]
    derived = sorted((cache / "derived").glob("*.parquet"))
    assert code == 0 and len(entries) == 2 and derived
    if what == "entries":  # the events are then read from private files: no derived table
        _as_another_user(entries[0] / "events.parquet", planted)
        _as_another_user(entries[1] / "meta.json", planted)
    else:
        for path in derived:
            _as_another_user(path, planted)
    before = {p: p.stat().st_mtime_ns for e in entries for p in e.iterdir()}
    code, again, err = _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache), "--json")
    assert code == 0 and "internal error" not in err
    assert err.count("not trusted") == (2 if what == "entries" else len(derived)), err
    strip = ("warnings", "warnings_plain")
    assert {k: v for k, v in json.loads(again).items() if k not in strip} == {
        k: v for k, v in json.loads(first).items() if k not in strip}
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing written into them


# ------------------------------------------------------------------------ unusable cache
@pytest.mark.parametrize("where", ["a file", "under a file", "inside the input folder"])
def test_an_unusable_cache_folder_warns_once_and_the_command_works(capsys, tmp_path, inputs,
                                                                   where):
    folder, before = inputs
    (tmp_path / "f").write_text("x")
    cache = {"a file": tmp_path / "f", "under a file": tmp_path / "f" / "sub",
             "inside the input folder": folder / "cache"}[where]
    code, out, err = _run(capsys, "summary", str(folder), "--cache-dir", str(cache), "--json")
    assert code == 0, err
    warned = [line for line in err.splitlines() if "cache folder" in line]
    assert len(warned) == 1 and str(cache) in warned[0] and "cannot parse" not in err
    assert any("cache folder" in w for w in json.loads(out)["warnings"])
    assert _digests(folder) == before


def test_a_bad_cache_environment_blames_the_cache_not_the_trace(tmp_path):
    (tmp_path / "f").write_text("x")
    env = {**os.environ, "TRACEVIEW_CACHE_DIR": str(tmp_path / "f" / "cache")}
    done = subprocess.run([sys.executable, "-m", "traceview", "info", str(GLOO)], env=env,
                          capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr  # info prints its warnings with its text
    assert done.returncode == 0, said
    assert said.count("cache folder") == 1 and "cannot parse" not in said


# ------------------------------------------------------------------------- outputs
OUTPUT_COMMANDS = {
    "report": lambda i, o: ["report", i, "-o", o],
    "export-perfetto": lambda i, o: ["export-perfetto", i, "-o", o],
    "baseline": lambda i, o: ["baseline", i, "-o", o],
    "baseline --run": lambda i, o: ["baseline", "--run", i, "-o", o],
    "check --junit": lambda i, o: ["check", i, "--baseline", "BASE", "--junit", o],
    "ingest -o": lambda i, o: ["ingest", i, "-o", o],
    "history record --db": lambda i, o: ["history", "record", i, "--db", o],
}


@pytest.mark.parametrize("command", list(OUTPUT_COMMANDS))
@pytest.mark.parametrize("target", ["an input file", "a new file in the input folder",
                                    "the input folder", "a link to an input file",
                                    "a hard link to an input file",
                                    "a hard link to a file in the input folder"])
def test_no_output_lands_on_an_input(capsys, tmp_path, inputs, command, target):
    folder, before = inputs
    first = sorted(folder.iterdir())[0]
    link = tmp_path / "link.json.gz"
    if target == "a link to an input file":
        link.symlink_to(first)
    elif target.startswith("a hard link"):
        os.link(first, link)
    out = {"an input file": first, "a new file in the input folder": folder / "new.out",
           "the input folder": folder}.get(target, link)
    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(GLOO), "-o", str(base))[0] == 0
    # the input named as a file when the output is a link to it (else the folder)
    source = str(first) if "link" in target and "folder" not in target else str(folder)
    argv = [str(base) if a == "BASE" else a for a in OUTPUT_COMMANDS[command](source, str(out))]
    code, _, err = _run(capsys, *argv)
    assert code == 2, err
    assert err.count("\n") == 1 and "internal error" not in err
    assert _digests(folder) == before


def test_outputs_that_cannot_be_files_or_folders_are_clean_errors(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    for argv, words in [
            (["report", str(GLOO), "-o", str(tmp_path)], "is a folder"),
            (["export-perfetto", str(GLOO), "-o", str(tmp_path / "no" / "x.json")],
             "does not exist"),
            (["ingest", str(GLOO), "-o", str(tmp_path / "file")], "is a file")]:
        code, _, err = _run(capsys, *argv)
        assert code == 2 and words in err and "internal error" not in err


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    dead = tmp_path / safe_write.temporary_name("events.parquet", pid=int(gone))
    alive = tmp_path / safe_write.temporary_name("events.parquet", pid=os.getppid())  # live
    dead.write_text("half")
    alive.write_text("being written")
    safe_write.write_text(tmp_path / "events.parquet", "whole")
    assert not dead.exists() and alive.exists()
    assert (tmp_path / "events.parquet").read_text() == "whole"


def test_a_killed_ingest_leaves_nothing_behind_in_the_cache(capsys, tmp_path):
    cache = tmp_path / "cache"
    assert _run(capsys, "info", str(GLOO), "--cache-dir", str(cache))[0] == 0
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    for entry in [e for e in cache.iterdir() if (e / "meta.json").exists()]:
        (entry / "meta.json").unlink()  # killed before the entry was complete
        (entry / safe_write.temporary_name("events.parquet", pid=int(gone))
         ).write_bytes(b"PAR1half")
    assert _run(capsys, "info", str(GLOO), "--cache-dir", str(cache))[0] == 0
    assert not list(cache.glob("*/.*.tmp"))


# -------------------------------------------------------------------- empty selections
@pytest.mark.parametrize("option,names", [
    (["--ranks", "7"], "ranks present: 0-3"),
    (["--steps", "9:2"], "steps present: 2–7"),
    (["--steps", "100:200"], "steps present: 2–7"),
    (["--skip-warmup", "50"], "steps present: 2–7"),
])
@pytest.mark.parametrize("command", ["summary", "gaps", "overlap", "breakdown", "align",
                                     "collectives", "stragglers"])
def test_an_empty_selection_exits_2_naming_what_exists(capsys, command, option, names):
    code, out, err = _run(capsys, command, str(NOISY), *option)
    assert code == 2 and names in err and out == ""


def test_an_empty_selection_in_python_names_what_exists():
    import traceview

    with pytest.raises(traceview.UsageError, match="ranks present: 0-1"):
        traceview.open(GLOO, ranks="5").summary()


# ------------------------------------------------------------------------------ --skip-bad
def _half_written(src, dst, *, keep_rank: bool):
    """``src`` (a gzipped trace) written to ``dst`` cut off half way, without its
    ``distributedInfo`` unless ``keep_rank``: a file whose writer was killed."""
    import gzip

    doc = json.loads(gzip.decompress(src.read_bytes()))
    if not keep_rank:
        doc.pop("distributedInfo")
    text = json.dumps(doc).encode()
    dst.write_bytes(text[: len(text) // 2])


@pytest.mark.parametrize("keep_rank", [False, True], ids=["no rank", "rank 1 again"])
@pytest.mark.parametrize("command", ["summary", "info", "gaps", "stragglers", "sql"])
def test_skip_bad_skips_a_half_written_file_and_lists_it(capsys, inputs, keep_rank, command):
    folder, _ = inputs
    _half_written(sorted(folder.iterdir())[1], folder / "profile.json", keep_rank=keep_rank)
    extra = ["select count(*) as n from events"] if command == "sql" else []
    code, _, err = _run(capsys, command, str(folder), *extra)
    assert code == 2 and "profile.json" in err  # without --skip-bad: one line, exit 2
    code, out, err = _run(capsys, command, str(folder), *extra, "--skip-bad", "--json")
    assert code == 0, err
    assert "skipped" in err and "profile.json" in err and "internal error" not in err
    if command != "sql":  # sql's --json is its rows alone
        listed = json.loads(out)["skipped"]
        assert [Path(s["file"]).name for s in listed] == ["profile.json"]
    if command == "summary":  # the text names it too: its rank is missing from the table
        _, out, _ = _run(capsys, command, str(folder), "--skip-bad")
        assert "skipped: " in out and "profile.json" in out


# ----------------------------------------------------------------------- ranks from names
def test_per_rank_copies_that_record_one_rank_take_their_ranks_from_their_names(capsys,
                                                                                 tmp_path):
    from fixtures.nsys_synthetic import write_export

    for rank, name in enumerate(["trace_rank0.sqlite", "trace_rank1.sqlite"]):
        # rank_offset 0 for both: each report records rank 0 (one report copied per rank)
        write_export(tmp_path / name, ranks=1, world_size=2)
    code, out, err = _run(capsys, "info", str(tmp_path), "--json")
    assert code == 0, err
    ranks = json.loads(out)["ranks"]
    assert [(r["rank"], r["rank_from"], r["file"].rsplit("/", 1)[1]) for r in ranks] == [
        (0, "file name", "trace_rank0.sqlite"), (1, "file name", "trace_rank1.sqlite")]
    assert any("taken from the file name" in w for w in json.loads(out)["warnings"])


@pytest.mark.parametrize("names", [["trace_rank0", "trace_rank1"], ["rank-0", "rank-1"],
                                   ["rank_0", "rank_1"], ["worker0", "worker1"]])
def test_nsys_exports_named_per_rank_need_no_rank_map(capsys, tmp_path, names):
    from fixtures.nsys_synthetic import write_export

    for rank, name in enumerate(names):
        write_export(tmp_path / f"{name}.sqlite", ranks=1, rank_offset=rank, world_size=2,
                     rank_source="none")
    code, out, err = _run(capsys, "info", str(tmp_path), "--json")
    assert code == 0, err
    assert [(r["rank"], r["rank_from"]) for r in json.loads(out)["ranks"]] == [
        (0, "file name"), (1, "file name")]


def test_gaps_text_shows_where_a_gap_is_not_its_epoch_time(capsys, tmp_path):
    from fixtures.nsys_synthetic import write_export

    write_export(tmp_path / "rank0.sqlite", ranks=1)
    code, out, _ = _run(capsys, "gaps", str(tmp_path / "rank0.sqlite"))
    assert code == 0 and "at_ms" in out and "start_ns" not in out
    largest = out.split("Largest", 1)[1].splitlines()[2:]
    assert largest and all(len(line.split()[2]) < 12 for line in largest if line.strip())


# ------------------------------------------------------------------- which parser runs
def test_version_names_the_kineto_parser_path(capsys, monkeypatch):
    from traceview.parsers.kineto import _parse

    with pytest.raises(SystemExit):
        main(["--version"])
    active = "C scanner" if _parse._kineto_scan is not None else "pure Python"
    assert f"Kineto parser: {active}" in capsys.readouterr().out
    monkeypatch.setattr(_parse, "_kineto_scan", None)
    monkeypatch.setattr(_parse, "_SCAN_MISSING", "No module named '_scan'")
    with pytest.raises(SystemExit):
        main(["--version"])
    said = capsys.readouterr().out
    assert "Kineto parser: pure Python" in said and "C compiler" in said


def test_a_large_ingest_on_the_pure_path_says_so_once(capsys, monkeypatch, tmp_path):
    from traceview.store import ingest
    from traceview.parsers.kineto import _parse

    monkeypatch.setattr(_parse, "_kineto_scan", None)
    monkeypatch.setattr(ingest, "SLOW_PATH_NOTICE_BYTES", 1)  # the fixture counts as large
    code, _, err = _run(capsys, "info", str(GLOO), "--cache-dir", str(tmp_path))
    notes = [line for line in err.splitlines() if "pure Python" in line]
    assert code == 0 and len(notes) == 1 and "C compiler" in notes[0]
    code, _, err = _run(capsys, "info", str(GLOO), "--cache-dir", str(tmp_path))
    assert code == 0 and "pure Python" not in err  # cached: nothing parsed, nothing to say


# ------------------------------------------------------------------------- damaged stores
@pytest.mark.parametrize("damage", ["truncated rank file", "flipped rank file",
                                    "garbage manifest", "garbage ranks table",
                                    "missing files table", "missing rank file",
                                    "foreign ranks table", "ranks of text", "negative rank",
                                    "foreign files table"])
def test_a_damaged_store_is_one_line_naming_the_file(capsys, tmp_path, damage):
    out = tmp_path / "store"
    assert _run(capsys, "ingest", str(GLOO), "-o", str(out))[0] == 0
    name = {"truncated rank file": "rank-00000.parquet", "flipped rank file": "rank-00001.parquet",
            "garbage manifest": "traceview-store.json", "garbage ranks table": "ranks.parquet",
            "missing files table": "files.parquet", "missing rank file": "rank-00000.parquet",
            "foreign ranks table": "ranks.parquet", "ranks of text": "ranks.parquet",
            "negative rank": "ranks.parquet", "foreign files table": "files.parquet",
            }[damage]
    target = out / name
    if damage.startswith("truncated"):
        os.truncate(target, 100)
    elif damage.startswith("flipped"):
        _flip(target, target.stat().st_size // 2)
    elif damage.startswith("garbage"):
        target.write_text("garbage")
    elif damage.startswith("foreign"):  # another program's Parquet in its place
        import polars as pl
        pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}).write_parquet(target)
    elif damage in ("ranks of text", "negative rank"):
        import polars as pl
        table = pl.read_parquet(target)
        table.with_columns(rank=pl.lit("x") if damage == "ranks of text"
                           else -pl.col("rank") - 1).write_parquet(target)
    else:
        target.unlink()
    for command in ("info", "summary"):
        code, _, err = _run(capsys, command, str(out))
        assert code == 2 and name in err and err.count("\n") == 1, err
        assert "internal error" not in err


def _foreign_events(real: bytes, kind: str) -> bytes:
    """Another program's Parquet in an events file's place, or the real events file with its
    ``ts_ns`` column turned to text (traceview's schema version kept in its metadata)."""
    import io

    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    if kind == "foreign":
        pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}).write_parquet(sink)
    else:
        table = pq.read_table(io.BytesIO(real))
        at = table.schema.get_field_index("ts_ns")
        table = table.set_column(at, "ts_ns", table["ts_ns"].cast(pa.string()))
        pq.write_table(table, sink)
    return sink.getvalue()


@pytest.mark.parametrize("location", ["folder", "file://", "memory://"])
@pytest.mark.parametrize("damage", ["foreign ranks.parquet", "foreign files.parquet",
                                    "foreign windows.parquet", "foreign rank-00000.parquet",
                                    "ts_ns of text in rank-00001.parquet"])
def test_foreign_parquet_in_a_store_anywhere_is_one_line_naming_it(capsys, tmp_path, location,
                                                                   damage):
    """Every file of a store is checked against what traceview writes there, whether the
    store is a folder, a file:// URL or an fsspec one (memory://, as gs:// goes): another
    program's Parquet as a small table or an events file (the manifest's size and hash
    updated to match it, as a store assembled by hand would be), or an events file with a
    column of another type, is one line naming the file, exit 2, never an internal error
    ("rank" not found, "extra column in file outside of expected schema")."""
    fsspec = pytest.importorskip("fsspec")
    import traceview
    import xxhash

    if location == "memory://":
        fs, base = fsspec.filesystem("memory"), f"/traceview-foreign/{tmp_path.name}"
        url = f"memory://{base.lstrip('/')}"
    else:
        fs, base = fsspec.filesystem("file"), str(tmp_path / "store")
        url = base if location == "folder" else f"file://{base}"
    traceview.open(GLOO, cache=False).write_store(url)
    name = damage.split()[-1]
    target = f"{base}/{name}"
    if name.startswith("rank-"):
        bad = _foreign_events(fs.cat_file(target), damage.split()[0])
        manifest = json.loads(fs.cat_file(f"{base}/traceview-store.json"))
        manifest["files"][name] = {"bytes": len(bad), "xxh3": xxhash.xxh3_128(bad).hexdigest()}
        fs.pipe_file(f"{base}/traceview-store.json", json.dumps(manifest).encode())
    else:
        bad = _foreign_events(b"", "foreign")
    fs.pipe_file(target, bad)
    for command in ("info", "summary"):
        code, _, err = _run(capsys, command, url, "--no-cache")
        assert code == 2 and name in err and err.count("\n") == 1, err
        assert "internal error" not in err and ("not a traceview" in err), err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_an_output_the_file_system_refuses_is_one_line(capsys):
    code, _, err = _run(capsys, "baseline", str(GLOO), "-o", "/proc/self/no/baseline.json")
    assert code == 2 and "baseline.json" in err and err.count("\n") == 1
    assert "internal error" not in err


def test_a_healed_cache_or_an_unusable_one_is_no_damage_to_the_ci_gate(capsys, tmp_path):
    cache = tmp_path / "cache"
    base = tmp_path / "base.json"
    assert _run(capsys, "baseline", str(GLOO), "-o", str(base), "--cache-dir", str(cache))[0] == 0
    for entry in [e for e in cache.iterdir() if (e / "meta.json").exists()]:
        (entry / "events.parquet").write_bytes(b"")
    code, out, err = _run(capsys, "check", str(GLOO), "--baseline", str(base), "--json",
                          "--cache-dir", str(cache))
    said = json.loads(out)
    assert code == 0 and said["damaged_input"] is False and said["warnings"] == []
    assert len(said["notes"]) == 2 and err.count("cache entry") == 2
    (tmp_path / "f").write_text("x")
    code, out, err = _run(capsys, "check", str(GLOO), "--baseline", str(base), "--json",
                          "--cache-dir", str(tmp_path / "f"))
    assert code == 0 and "cache folder" in err and json.loads(out)["damaged_input"] is False


def test_leftovers_of_killed_writers_in_the_cache_and_a_store_are_swept(capsys, tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "store"
    assert _run(capsys, "summary", str(GLOO), "--cache-dir", str(cache))[0] == 0
    assert _run(capsys, "ingest", str(GLOO), "-o", str(out), "--cache-dir", str(cache))[0] == 0
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    left = [cache / "ids" / safe_write.temporary_name("abc.txt", pid=int(gone)),
            cache / "derived" / safe_write.temporary_name("gpu-x.parquet", pid=int(gone)),
            out / safe_write.temporary_name("rank-00001.parquet", pid=int(gone))]
    for path in left:
        path.write_bytes(b"half")
    assert _run(capsys, "info", str(GLOO), "--cache-dir", str(cache))[0] == 0
    # a store is swept when it is written again (never when it is only read)
    assert _run(capsys, "ingest", str(GLOO), "-o", str(out), "--cache-dir", str(cache))[0] == 0
    assert not any(path.exists() for path in left)
