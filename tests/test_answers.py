"""Answers kept for a command line asked again (traceview/cli/_answers.py): printed again byte
for byte, without the libraries that computed them, and never once anything they depend on
changed: an input, a folder's entries, the environment, the code, the cache itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_gpu_cli import write_trace
from traceview.cli import main
from traceview.run.run import Run
from traceview.store import cache_folder


@pytest.fixture()
def computed(monkeypatch) -> list[str]:
    """The analyses a command computed (a kept answer computes none)."""
    calls: list[str] = []
    for name in ("summary", "stragglers", "gaps"):
        real = getattr(Run, name)
        monkeypatch.setattr(Run, name, lambda self, *a, _real=real, _name=name, **k:
                            calls.append(_name) or _real(self, *a, **k))
    return calls


@pytest.fixture()
def settled(monkeypatch) -> None:
    """Files just written count as settled (the tests write their traces a moment before)."""
    monkeypatch.setattr(cache_folder, "SETTLED_NS", 0)


@pytest.fixture()
def traces(tmp_path: Path) -> list[str]:
    """Two ranks' traces in the folder ``run``."""
    (tmp_path / "run").mkdir()
    return [str(write_trace(tmp_path / "run" / f"rank{r}.json", r)) for r in (0, 1)]


def _ask(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _kept(cache: Path) -> list[Path]:
    return sorted((cache / "answers").glob("*.json"))


def test_the_same_command_line_is_answered_from_its_kept_answer(traces, tmp_path, capsys,
                                                                computed, settled) -> None:
    argv = ["summary", *traces, "--json", "--cache-dir", str(tmp_path / "cache")]
    first = _ask(capsys, *argv)
    assert first[0] == 0 and computed == ["summary"] and len(_kept(tmp_path / "cache")) == 1
    assert _ask(capsys, *argv) == first and computed == ["summary"]  # the same bytes, kept
    # --csv is kept too, under its own command line; text for people is not
    csv = _ask(capsys, "summary", *traces, "--csv", "--cache-dir", str(tmp_path / "cache"))
    assert _ask(capsys, "summary", *traces, "--csv", "--cache-dir",
                str(tmp_path / "cache")) == csv and computed == ["summary"] * 2
    _ask(capsys, "summary", *traces, "--cache-dir", str(tmp_path / "cache"))
    _ask(capsys, "summary", *traces, "--cache-dir", str(tmp_path / "cache"))
    assert computed == ["summary"] * 4


def test_a_changed_input_folder_environment_or_code_is_answered_anew(
        traces, tmp_path, capsys, computed, settled, monkeypatch) -> None:
    run = tmp_path / "run"
    argv = ["stragglers", str(run), "--json", "--cache-dir", str(tmp_path / "cache")]
    _ask(capsys, *argv)
    _ask(capsys, *argv)
    assert computed == ["stragglers"]
    # a trace rewritten (same size, its mtime put back: the ctime still moves)
    st = os.stat(traces[0])
    Path(traces[0]).write_bytes(Path(traces[0]).read_bytes())
    os.utime(traces[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    _ask(capsys, *argv)
    assert computed == ["stragglers"] * 2
    # a rank added to the run folder: another run
    write_trace(run / "rank2.json", 2)
    code, out, _ = _ask(capsys, *argv)
    assert computed == ["stragglers"] * 3 and len(json.loads(out)["ranks"]) == 3
    # an environment variable of traceview's
    monkeypatch.setenv("TRACEVIEW_REMOTE_TIMEOUT", "5")
    _ask(capsys, *argv)
    assert computed == ["stragglers"] * 4
    # other code
    monkeypatch.setattr(cache_folder, "code_identity", lambda: "another build")
    _ask(capsys, *argv)
    assert computed == ["stragglers"] * 5
    _ask(capsys, *argv)
    assert computed == ["stragglers"] * 5


def test_no_cache_or_answers_off_neither_reads_nor_keeps_an_answer(traces, tmp_path, capsys, computed,
                                                    settled, monkeypatch) -> None:
    monkeypatch.setenv("TRACEVIEW_CACHE_DIR", str(tmp_path / "default"))
    for _ in range(2):
        _ask(capsys, "gaps", *traces, "--json", "--no-cache")
    assert computed == ["gaps", "gaps"] and not (tmp_path / "default").exists()
    _ask(capsys, "gaps", *traces, "--json")  # the default cache folder, from the environment
    _ask(capsys, "gaps", *traces, "--json")
    assert computed == ["gaps"] * 3 and len(_kept(tmp_path / "default")) == 1
    # switched off: computed, and nothing more kept
    monkeypatch.setenv("TRACEVIEW_ANSWERS", "off")
    for _ in range(2):
        _ask(capsys, "summary", *traces, "--json")
    assert computed[3:] == ["summary"] * 2 and len(_kept(tmp_path / "default")) == 1


def test_an_answer_is_not_kept_while_its_inputs_may_still_change(traces, tmp_path, capsys,
                                                                 computed) -> None:
    """Files written in the last 2 s: a write within the same timestamp tick would not show."""
    argv = ["summary", *traces, "--json", "--cache-dir", str(tmp_path / "cache")]
    _ask(capsys, *argv)
    _ask(capsys, *argv)
    assert computed == ["summary", "summary"] and not _kept(tmp_path / "cache")


def test_a_run_that_said_how_it_read_the_files_is_not_kept(traces, tmp_path, capsys, computed,
                                                          settled) -> None:
    """A damaged kept table is healed with a note: that note is about this run, not the
    answer, so the next run computes (and keeps) its own."""
    cache = tmp_path / "cache"
    argv = ["summary", *traces, "--json", "--cache-dir", str(cache)]
    _ask(capsys, "gaps", *traces, "--json", "--cache-dir", str(cache))  # keeps the tables
    for kept in (cache / "derived").glob("gaps-*.parquet"):
        kept.write_bytes(b"damaged")
    code, out, err = _ask(capsys, *argv)
    assert code == 0 and "could not be used" in err and not any(
        "summary" in p.read_text() for p in _kept(cache))
    second = _ask(capsys, *argv)
    assert "could not be used" not in second[2] and computed.count("summary") == 2
    assert json.loads(second[1])["ranks"] == json.loads(out)["ranks"]
    assert _ask(capsys, *argv) == second and computed.count("summary") == 2


def test_a_kept_answer_is_printed_without_polars_byte_for_byte(tmp_path) -> None:
    """As a user's shell runs it: the second run prints the first one's stdout and stderr
    (its warnings too) and imports none of the libraries that computed them."""
    trace = write_trace(tmp_path / "rank0.json", 0)
    time.sleep(2.1)  # past cache_folder.SETTLED_NS: the trace's identity can be trusted
    argv = ["-m", "traceview", "summary", str(trace), "--json", "--cache-dir",
            str(tmp_path / "cache")]
    first, second = (subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                                    cwd=tmp_path, env=dict(os.environ)) for _ in range(2))
    assert first.returncode == second.returncode == 0
    assert (second.stdout, second.stderr) == (first.stdout, first.stderr)
    assert json.loads(first.stdout)["ranks"][0]["rank"] == 0
    (tmp_path / "summary.json").write_text(first.stdout)  # a new file in the working folder
    traced = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True,
                            text=True, cwd=tmp_path, env=dict(os.environ))
    imported = {line.rsplit("|", 1)[-1].strip() for line in traced.stderr.splitlines()
                if line.startswith("import time:")}
    assert traced.stdout == first.stdout and "traceview.store.cache_folder" in imported
    assert not imported & {"polars", "pyarrow", "numpy", "traceview.run.run"}


def test_a_damaged_or_unnamed_answer_is_never_printed(traces, tmp_path, capsys, computed,
                                                      settled, monkeypatch) -> None:
    cache = tmp_path / "cache"
    argv = ["summary", *traces, "--json", "--cache-dir", str(cache)]
    first = _ask(capsys, *argv)
    (kept,) = _kept(cache)
    damaged = kept.read_bytes().replace(b"worst_straggler", b"worst_stragglex")
    assert damaged != kept.read_bytes()
    kept.write_bytes(damaged)
    assert _ask(capsys, *argv) == first and computed == ["summary"] * 2  # and kept again
    assert _ask(capsys, *argv) == first and computed == ["summary"] * 2
    # a cache folder argv names only by an abbreviation argparse takes: argv alone does not
    # say where the answer would be, so none is kept
    monkeypatch.setenv("TRACEVIEW_CACHE_DIR", str(tmp_path / "default"))
    for _ in range(2):
        _ask(capsys, "gaps", *traces, "--json", "--cache-d", str(tmp_path / "other"))
    assert computed.count("gaps") == 2
    assert not _kept(tmp_path / "other") and not _kept(tmp_path / "default")


def test_a_cache_folder_that_takes_no_answer_still_answers(traces, tmp_path, capsys, computed,
                                                           settled) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "answers").write_text("a file where the folder would be")
    argv = ["summary", *traces, "--json", "--cache-dir", str(cache)]
    first, second = _ask(capsys, *argv), _ask(capsys, *argv)
    assert first == second and first[0] == 0 and json.loads(first[1])["ranks"]
    assert computed == ["summary", "summary"]


@pytest.mark.parametrize("change", ["rewritten", "replaced", "added", "removed"])
def test_an_input_changed_while_the_command_read_it_keeps_no_answer(
        traces, tmp_path, capsys, settled, monkeypatch, change) -> None:
    """The inputs' identity is taken before they are read: a rank file rewritten, replaced,
    added or removed during the command (a profiler or a copy still writing) is not the
    answer's input, so nothing is kept (with a warning) and the next run computes anew."""
    run, cache = tmp_path / "run", tmp_path / "cache"
    spare = write_trace(tmp_path / "spare.json", 1)
    calls: list[str] = []
    real = Run.summary

    def summary_while_the_files_change(self, *a, **k):
        if not calls:
            if change == "rewritten":
                Path(traces[0]).write_bytes(Path(traces[0]).read_bytes())
            elif change == "replaced":
                os.replace(spare, traces[1])
            elif change == "added":
                write_trace(run / "rank2.json", 2)
            else:
                os.unlink(traces[1])
        calls.append("summary")
        return real(self, *a, **k)

    monkeypatch.setattr(Run, "summary", summary_while_the_files_change)
    argv = ["summary", str(run), "--json", "--cache-dir", str(cache)]
    code, _, err = _ask(capsys, *argv)
    assert code == 0 and "changed while the command read it" in err and not _kept(cache)
    code, _, err = _ask(capsys, *argv)
    assert code == 0 and calls == ["summary"] * 2 and "changed while" not in err
    assert len(_kept(cache)) == 1


def _forge(kept: Path, stdout: str) -> None:
    """Rewrite a kept answer with ``stdout``, its digest made to match (as a planter would)."""
    from traceview.cli import _answers

    record = json.loads(kept.read_bytes())
    record["stdout"] = stdout
    record.pop("digest")
    record["digest"] = _answers._digest(record)
    kept.write_text(json.dumps(record))


def test_an_answer_others_could_write_or_holding_control_characters_is_never_printed(
        traces, tmp_path, capsys, computed, settled) -> None:
    """A shared cache folder: a kept answer (digest and all) writable by other users, or
    owned by another user (root only can make one here), is not believed; nor is one whose
    text holds raw control characters (what this program prints escapes them)."""
    cache = tmp_path / "cache"
    argv = ["summary", *traces, "--json", "--cache-dir", str(cache)]
    first = _ask(capsys, *argv)
    (kept,) = _kept(cache)
    _forge(kept, '{"forged": "\x1b]8;;http://evil\x07click\x1b]8;;\x07"}\n')
    code, out, _ = _ask(capsys, *argv)
    assert (code, out) == (0, first[1]) and computed == ["summary"] * 2  # kept again, anew
    _forge(kept, '{"forged": true}\n')
    os.chmod(kept, 0o666)
    assert _ask(capsys, *argv)[1] == first[1] and computed == ["summary"] * 3
    if os.geteuid() == 0:
        _forge(kept, '{"forged": true}\n')
        os.chmod(kept, 0o644)
        os.chown(kept, 65534, 65534)
        assert _ask(capsys, *argv)[1] == first[1] and computed == ["summary"] * 4
