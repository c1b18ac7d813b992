"""One answer everywhere (issue 17): on every multi-rank fixture of the repository the same rank,
or nobody, is named by ``stragglers`` (flagged), ``summary`` (worst straggler), the largest
``critical-path`` share when a straggler is flagged, ``diagnose``'s straggler finding (severity
high) and the report; and that rank is the one the fixture's generator slowed.

The truth comes from the generators, not from the analyses: ``truth.json`` beside the traces
(written by ``fixtures/scenarios.py``), or, for the older fixtures, the generator command that
their folders document (``fixtures/gloo_ddp.py``, ``gloo_tp_dp.py``, ``gloo_windows.py``,
``fixtures/data/gate_noise/README.md``). A ``weak`` scenario (a delay comparable to the noise)
may name its slow rank or nobody, never another rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import traceview
from traceview.outputs.report import gather

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"

#: The older fixtures' slowed rank, from the generator commands their folders document
#: (None: every rank runs the same job).
DOCUMENTED: dict[str, int | None] = {
    "gloo_ddp_2r": None,                    # python -m fixtures.gloo_ddp --out ...
    "gloo_ddp_2r_slow1": 1,                 # --slow-rank 1 --delay-ms 30
    "gloo_ddp_4r_noisy": None,              # --world-size 4 --threads 3
    "gloo_ddp_4r_noisy_slow2": 2,           # --slow-rank 2 --delay-ms 30
    "gloo_tp_dp_4r_slow2": 2,               # fixtures.gloo_tp_dp --slow-rank 2 --delay-ms 30
    "gloo_windows_2r": None,                # fixtures.gloo_windows (no slow rank)
    "gate_noise/same_1": None, "gate_noise/same_2": None, "gate_noise/same_3": None,
    "gate_noise/slow_1": 1,                 # --slow-rank 1 --delay-ms 40
}


def _truth() -> dict[str, tuple[int | None, bool]]:
    """fixture folder (relative to fixtures/data) -> (slowed rank or None, weak)."""
    out = {name: (rank, False) for name, rank in DOCUMENTED.items()}
    # the replay scenarios too: "expected" is their one steady slow rank, or None (a twin,
    # two slow ranks, a stall on a few steps or a moving one: no single straggler)
    for truth in sorted([*DATA.glob("scenarios/*/truth.json"),
                         *DATA.glob("replay/*/truth.json")]):
        doc = json.loads(truth.read_text())
        out[str(truth.parent.relative_to(DATA))] = (doc.get("expected"), bool(doc.get("weak")))
    return out


TRUTH = _truth()
#: Disagreements known today (issue 46 stays open on them). Strict: one that is fixed fails
#: here until it is taken off.
KNOWN: dict[str, str] = {
    # (replay/tpsp_stall_r3 left the list: the DP all-reduce's group is now told by causality
    # counted per completion, so the replay waits on it and its longest path runs through
    # rank 3, 96% of it)
}


def named_by_every_output(folder: Path) -> dict[str, int | None]:
    """The rank each output names as the straggler (None: nobody), all from one Run."""
    run = traceview.open(folder, cache=False)
    flagged = run.stragglers()["ranks"].filter(pl.col("flagged")).get_column("rank").to_list()
    assert len(flagged) <= 1, f"{folder.name}: several ranks flagged: {flagged}"
    straggler = flagged[0] if flagged else None
    path = run.critical_path()["ranks"].sort("path_ns", "rank", descending=[True, False])
    findings = run.diagnose()["findings"].filter(
        (pl.col("id") == "straggler") & (pl.col("severity") == "high"))
    report = gather(run)
    return {
        "stragglers": straggler,
        "summary": run.summary()["worst_straggler"]["rank"],
        # the path's largest share is asked to agree only when a straggler is flagged
        "critical-path": path.get_column("rank")[0] if straggler is not None else None,
        "diagnose": findings.get_column("rank")[0] if findings.height else None,
        "diagnose (count)": findings.height if findings.height > 1 else None,
        "report": report.worst_straggler.get("rank"),
    }


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[n])) if n in KNOWN else n
    for n in sorted(TRUTH)])
def test_every_output_names_the_slowed_rank_or_nobody(name: str) -> None:
    folder = DATA / name
    if not folder.is_dir():
        pytest.skip(f"fixture {name} is not in this checkout")
    expected, weak = TRUTH[name]
    named = named_by_every_output(folder)
    answers = {v for k, v in named.items() if k != "diagnose (count)"}
    assert named["diagnose (count)"] is None, f"{name}: several high straggler findings"
    if weak:
        assert answers <= {expected, None}, f"{name}: slowed rank {expected}, named {named}"
        assert len(answers) == 1 or answers == {expected, None} and \
            named["stragglers"] is None, f"{name}: the outputs disagree: {named}"
    else:
        assert answers == {expected}, f"{name}: slowed rank {expected}, named {named}"
