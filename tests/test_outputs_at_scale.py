"""The CLI at many ranks (distribution and outliers unless --all; --json keeps every row),
and what was computed but hidden: MFU from the trace's FLOP counts, the NCCL log's choices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.cluster_runs import default_slow_rank, many_ranks
from traceview.cli import main


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, Path]:
    """40 ranks x 3 steps (past the 32 ranks where tables turn into distributions)."""
    root = tmp_path_factory.mktemp("wide")
    truth = many_ranks(root / "run", ranks=40, steps=3)
    return root / "run", truth, root / "cache"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_summary_at_many_ranks_prints_the_distribution_and_the_outliers(
        wide, capsys: pytest.CaptureFixture[str]) -> None:
    run, truth, cache = wide
    assert truth.slow_rank == default_slow_rank(40) == 22
    out = _cli(capsys, "summary", str(run), "--cache-dir", str(cache))
    assert "Across 40 ranks: median, p90, max" in out
    lines = [ln for ln in out.splitlines() if ln.strip().split(" ")[0].isdigit()]
    assert 1 <= len(lines) <= 10  # the outlier rows, not 40
    assert any(ln.split()[0] == "22" for ln in lines)  # the slow rank is one of them
    assert "of 40 rows not shown: `traceview summary --all`" in out
    assert "worst straggler: rank 22" in out
    every = _cli(capsys, "summary", str(run), "--cache-dir", str(cache), "--all")
    assert "Across 40 ranks" not in every
    assert len([ln for ln in every.splitlines() if ln.strip().split(" ")[0].isdigit()]) == 40
    doc = json.loads(_cli(capsys, "summary", str(run), "--cache-dir", str(cache), "--json"))
    assert len(doc["ranks"]) == 40  # --json keeps every row


def test_stragglers_at_many_ranks_write_prose_only_about_the_flagged(
        wide, capsys: pytest.CaptureFixture[str]) -> None:
    run, _, cache = wide
    out = _cli(capsys, "stragglers", str(run), "--cache-dir", str(cache))
    ranks = [ln for ln in out.splitlines() if ln.startswith("rank ")]
    assert ranks[0].startswith("rank 22: ") and "STRAGGLER" in ranks[0]
    # one short reason each, no paragraph
    assert all(": not flagged: " in ln and len(ln.split()) < 30 for ln in ranks[1:])
    assert len(ranks) <= 6
    doc = json.loads(_cli(capsys, "stragglers", str(run), "--cache-dir", str(cache), "--json"))
    assert len(doc["ranks"]) == 40


@pytest.mark.parametrize("command", ["breakdown", "overlap", "gaps", "align"])
def test_other_tables_at_many_ranks(wide, capsys: pytest.CaptureFixture[str],
                                    command: str) -> None:
    run, _, cache = wide
    out = _cli(capsys, command, str(run), "--cache-dir", str(cache))
    assert "Across 40 " in out or "Across 120 rank-steps" in out or "over 40 ranks" in out
    every = _cli(capsys, command, str(run), "--cache-dir", str(cache), "--all")
    assert len(every.splitlines()) > len(out.splitlines()) or command == "gaps"


def test_mfu_appears_when_the_trace_carries_flops(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """One forward aten::mm per step carries 1e12 FLOP: achieved TFLOP/s = 1e12 / step time
    (s) / 1e12, MFU = that / 312 (A100, bf16), per rank and step of the ground truth."""
    truth = many_ranks(tmp_path / "run", ranks=2, steps=3, mm_flops=10**12)
    doc = json.loads(_cli(capsys, "breakdown", str(tmp_path / "run"), "--cache-dir",
                          str(tmp_path / "c"), "--json"))
    rows = {(r["rank"], r["step"]): r for r in doc["flops"]}
    assert len(rows) == 6
    for s in truth.step_stats:
        row = rows[(s.rank, s.step)]
        seconds = (s.end_true_ns - s.start_true_ns) / 1e9
        assert row["flops"] == 1e12 and row["flops_source"] == "trace"
        assert row["achieved_tflops"] == pytest.approx(1 / seconds, rel=1e-6)
        assert row["mfu"] == pytest.approx(1 / seconds / 312.0, rel=1e-6)
    text = _cli(capsys, "breakdown", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "c"))
    assert "Achieved TFLOP/s and MFU" in text
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "r.html"),
                 "--cache-dir", str(tmp_path / "c")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert '<section id="flops">' in page and "MFU" in page


def test_no_flops_no_mfu(wide, capsys: pytest.CaptureFixture[str]) -> None:
    run, _, cache = wide
    doc = json.loads(_cli(capsys, "breakdown", str(run), "--cache-dir", str(cache), "--json"))
    assert doc["flops"] is None


NCCL = ("n1:1:1 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 busId 1 - Init COMPLETE\n"
        "n1:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 1024 "
        "datatype 7 op 0 root 0 comm 0xa [nranks=2] stream 0x3\n"
        "n1:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo Ring proto LL128 "
        "channel{Lo..Hi}={0..3}\n")


def test_nccl_log_in_collectives_and_report(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    many_ranks(tmp_path / "run", ranks=2, steps=2)
    log = tmp_path / "nccl_n1_1.log"
    log.write_text(NCCL)
    common = [str(tmp_path / "run"), "--cache-dir", str(tmp_path / "c")]
    doc = json.loads(_cli(capsys, "collectives", *common, "--json", "--nccl-log", str(log)))
    assert doc["nccl_choices"] == [{"collective": "all_reduce", "algorithm": "RING",
                                    "protocol": "LL128", "calls": 1, "min_bytes": 4096,
                                    "max_bytes": 4096}]
    assert doc["nccl_calls"][0]["bytes"] == 4096  # 1024 float32
    text = _cli(capsys, "collectives", *common, "--nccl-log", str(log))
    assert "NCCL log: algorithm and protocol chosen" in text and "LL128" in text
    assert main(["report", *common, "-o", str(tmp_path / "r.html"), "--nccl-log",
                 str(log)]) == 0
    page = (tmp_path / "r.html").read_text()
    assert '<section id="nccl">' in page and "LL128" in page
    capsys.readouterr()
    assert main(["collectives", *common, "--nccl-log", str(tmp_path / "missing.log")]) == 2
    assert "missing.log: NCCL log not found" in capsys.readouterr().err


def test_info_and_analyse_at_many_ranks(wide, capsys: pytest.CaptureFixture[str]) -> None:
    run, _, cache = wide
    out = _cli(capsys, "info", str(run), "--cache-dir", str(cache))
    assert len([ln for ln in out.splitlines() if ln.startswith("  rank ")]) == 8
    assert "(32 more ranks: `traceview info --all`" in out
    every = _cli(capsys, "info", str(run), "--cache-dir", str(cache), "--all")
    assert len([ln for ln in every.splitlines() if ln.startswith("  rank ")]) == 40
    doc = json.loads(_cli(capsys, "info", str(run), "--cache-dir", str(cache), "--json"))
    assert len(doc["ranks"]) == 40
    out = _cli(capsys, "analyse", str(run), "--cache-dir", str(cache))
    assert "Across 40 rank devices" in out and "rank 22 device" in out
    assert "`traceview analyse --all` prints every row; --json holds every row" in out
