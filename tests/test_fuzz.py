"""Mutation fuzzing: shipped fixtures and corpus traces, cut short, with bytes flipped or junk
spliced in (Hypothesis draws where and what), put through every command that reads traces, with a
working cache folder or an unusable one.

Whatever the damage, a command answers (exit 0, or 1 for a check that found problems) or
refuses in one clean line (exit 2): never a traceback, never "internal error", and never a
changed input file. Each example is a two-rank run (an intact rank beside the damaged one,
named as ranks so that the damage, not a missing rank, is what the commands meet), read with
and without ``--skip-bad``. The commands run in this process (``traceview.cli.main``), on one
cache folder per example, so one example costs about a second.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import hashlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import CORPUS, FIXTURES
from traceview.cli import main

#: Small inputs of each kind: gzipped Kineto (shipped fixtures), a synthetic nsys SQLite
#: export, and from the corpus (when present) real traces of other tools: plain JSON, GPU
#: ones, a real nsys export.
SHIPPED = [FIXTURES / "data" / "gloo_ddp_2r" / "rank-1.gloo_ddp.pt.trace.json.gz",
           FIXTURES / "data" / "gloo_tp_dp_4r_slow2" / "rank-2.gloo_tp_dp.pt.trace.json.gz"]
FROM_CORPUS = [
    "hta-tests-data/tests/data/call_stack/backward_thread.json",
    "hta-tests-data/tests/data/trace_compare/test/test.json.gz",
    "hta-tests-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "hta-tests-data/tests/data/trace_filter/sampled_rank-1.json.gz",
    "pipit-nsys-sqlite/pipit/tests/data/cloverleaf-nsys/perlmutter-cloverleaf-cuda.sqlite",
]


def _sources() -> list[Path]:
    found = [p for p in (CORPUS / r for r in FROM_CORPUS) if p.is_file()]
    return [*SHIPPED, _synthetic_nsys(), *found]


def _synthetic_nsys() -> Path:
    """A one-rank nsys SQLite export (the schema-faithful synthetic one): the shipped
    fixtures hold no nsys file, and the corpus may be absent."""
    from fixtures.nsys_synthetic import write_export

    folder = Path(tempfile.mkdtemp(prefix="traceview-fuzz-nsys-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    write_export(folder / "rank0.sqlite", ranks=1, steps=2)
    return folder / "rank0.sqlite"


SOURCES = _sources()
INTACT = FIXTURES / "data" / "gloo_ddp_2r" / "rank-0.gloo_ddp.pt.trace.json.gz"


def _suffix(path: Path) -> str:
    name = path.name
    return ".json.gz" if name.endswith(".json.gz") else path.suffix


# ------------------------------------------------------------------------------ mutations
@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, list[tuple[str, float, bytes]]]:
    """Where the damage goes (``raw`` bytes on disk, or ``inflated`` text re-gzipped) and one
    to three edits: ``cut`` at a fraction of the length, ``flip`` the byte there, ``junk``
    spliced in there."""
    layer = draw(st.sampled_from(["raw", "inflated"]))
    edits = draw(st.lists(st.tuples(
        st.sampled_from(["cut", "flip", "junk"]),
        st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
        st.binary(min_size=1, max_size=24)), min_size=1, max_size=3))
    return layer, edits


def _mutate(data: bytes, edits: list[tuple[str, float, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, where, junk in edits:
        at = min(len(out), int(where * len(out)))
        if kind == "cut":
            del out[at:]
        elif kind == "flip" and out:
            out[min(at, len(out) - 1)] ^= junk[0] or 0xFF
        else:
            out[at:at] = junk
    return bytes(out)


def _damaged(source: Path, layer: str, edits: list[tuple[str, float, bytes]]) -> bytes:
    data = source.read_bytes()
    if layer == "inflated" and data[:2] == b"\x1f\x8b":
        return gzip.compress(_mutate(gzip.decompress(data), edits), mtime=0)
    return _mutate(data, edits)


# ------------------------------------------------------------------------------ commands
def _commands(run: Path, work: Path) -> list[list[str]]:
    """Every command that reads traces, on the run folder ``run``."""
    r = str(run)
    analyses = [[name, r] for name in ("info", "summary", "gaps", "overlap", "breakdown",
                                       "align", "collectives", "stragglers")]
    return [*analyses, ["sql", r, "select kind, count(*) as n from events group by kind"],
            ["report", r, "-o", str(work / "report.html")],
            ["export-perfetto", r, "-o", str(work / "merged.json")],
            ["baseline", r, "-o", str(work / "baseline.json")],
            ["check", r, "--baseline", str(work / "baseline.json"), "--junit",
             str(work / "junit.xml")],
            ["diff", str(INTACT.parent), r],
            ["validate", r],
            ["analyse", r],
            ["ingest", r, "-o", str(work / "store")]]


def _call(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exit: still an exit code
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue() + err.getvalue()


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


#: Examples per run: a few dozen keep the suite's share bounded (~1 s each); set
#: TRACEVIEW_FUZZ_EXAMPLES for a longer hunt.
EXAMPLES = int(os.environ.get("TRACEVIEW_FUZZ_EXAMPLES", "24"))


@pytest.mark.skipif(not SOURCES, reason="no inputs")
@settings(max_examples=EXAMPLES, deadline=None, derandomize="TRACEVIEW_FUZZ_EXAMPLES" not in os.environ,
          database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(source=st.sampled_from(SOURCES), mutation=mutations(), skip_bad=st.booleans(),
       usable_cache=st.booleans())
def test_damaged_inputs_get_clean_answers_from_every_command(source, mutation, skip_bad,
                                                             usable_cache):
    layer, edits = mutation
    with tempfile.TemporaryDirectory(prefix="traceview-fuzz-") as tmp:
        work = Path(tmp)
        run = work / "run"
        run.mkdir()
        (run / "rank-0.trace.json.gz").write_bytes(INTACT.read_bytes())
        (run / f"rank-1.trace{_suffix(source)}").write_bytes(_damaged(source, layer, edits))
        before = _digest(run)
        cache = work / "cache"
        if not usable_cache:  # a file where the cache folder should be: read without one
            cache.write_text("not a folder")
        for argv in _commands(run, work):
            argv = [*argv, "--cache-dir", str(cache)]
            if skip_bad and argv[0] not in ("validate", "diff"):  # validate lists every file
                argv.append("--skip-bad")
            code, said = _call(argv)
            assert code in (0, 1, 2), (argv, code, said)
            assert "Traceback" not in said and "internal error" not in said, (argv, said)
            if code == 2:
                assert said.strip(), argv  # a refusal says why
        assert _digest(run) == before  # inputs are never modified
