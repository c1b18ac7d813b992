"""One fact, one number (issue 48, item 8): what the outputs say of the same run agrees, and
each number is what its name says."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import traceview
from traceview.cli import main


@pytest.fixture(scope="module")
def first_step_unmarked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank synthetic run (rank 1 slow) whose first ProfilerStep marker was lost: the
    collectives of that step come before the first step."""
    from fixtures.synthetic import SyntheticSpec, generate

    folder = tmp_path_factory.mktemp("unmarked")
    generate(SyntheticSpec(world_size=2, steps=4), folder)
    (folder / "ground_truth.json").unlink()
    for trace in folder.glob("*.json.gz"):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "ProfilerStep#0"]
        trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return folder


def test_evidence_names_no_step_before_the_first(first_step_unmarked: Path, capsys) -> None:
    ranking = traceview.open(first_step_unmarked, cache=False).stragglers().to_polars()
    slow = ranking.filter(ranking["rank"] == 1).row(0, named=True)
    assert slow["flagged"] and slow["evidence_steps"] == [1, 2, 3]
    assert main(["diagnose", str(first_step_unmarked), "--no-cache", "--json"]) == 0
    text = capsys.readouterr().out
    assert "-1" not in json.dumps([f["evidence"] for f in json.loads(text)["findings"]])


SCENARIOS = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "scenarios"


@pytest.mark.parametrize("scenario", ["pipeline_compute_s2", "a2a_routing_r1"])
def test_every_finding_says_how_sure_it_is(scenario: str, capsys) -> None:
    """The pipeline bottleneck and the all-to-all imbalance had confidence None."""
    assert main(["diagnose", str(SCENARIOS / scenario), "--no-cache", "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert findings and {f["confidence"] for f in findings} <= {"low", "medium", "high"}


def test_diagnose_text_names_times_without_ns_and_says_its_order(capsys) -> None:
    assert main(["diagnose", str(SCENARIOS / "a2a_routing_r1"), "--no-cache"]) == 0
    out = capsys.readouterr().out
    head, evidence = out.splitlines()[0], [ln for ln in out.splitlines() if "evidence:" in ln]
    # the all-to-all cause (smaller gain) comes before its straggler: the header says so
    assert head.startswith("to do, biggest gain first, a straggler's cause just before it")
    assert "(mean step " in head  # the gains' step: the mean (summary's p50 is the median)
    for line in evidence:  # a time in ms is never shown under an ``_ns`` name
        for item in line.split("evidence: ", 1)[1].split("; "):
            name, _, value = item.partition("=")
            assert not ("_ns" in name and (" ms" in value or " µs" in value)), item


def test_summary_and_stragglers_define_their_words(capsys) -> None:
    gloo = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gloo_ddp_2r_slow1"
    assert main(["summary", str(gloo), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "else balanced" in out and "run bound: host-bound (no GPU work)" in out
    assert main(["stragglers", str(gloo), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "imposed: the others' wait" in out and "caused: the part" in out
