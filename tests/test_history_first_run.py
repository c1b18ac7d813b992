"""The CI history example of docs/ci-gate.md on its first run: no database yet, no main run
recorded yet, or the database's secret unset (a pull request from a fork). The gate and the
report go on without recorded runs, saying so; ``record`` refuses an empty URL by name."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from traceview.cli import main

NOISE = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gate_noise"
RUN = str(NOISE / "same_1")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("given", ["no file yet", "empty URL"])
def test_the_first_pull_request_check_passes_and_the_report_is_written(
        given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "new.db") if given == "no file yet" else ""
    junit = tmp_path / "perf-junit.xml"
    code, out, err = _cli(capsys, "check", RUN, "--history", db, "--label", "main", "--last",
                          "5", "--junit", str(junit), "--json")
    res = orjson.loads(out)
    assert code == 0 and res["exit_code"] == 0 and res["history_runs"] == []
    assert {row["status"] for row in res["metrics"]} == {"not_in_baseline"}
    assert ("no such history database" if db else "URL is empty") in err
    assert "going on without recorded runs" in err and "Traceback" not in err
    assert junit.is_file() and 'failures="0"' in junit.read_text()
    report = tmp_path / "perf-report.html"
    code, out, err = _cli(capsys, "report", RUN, "-o", str(report), "--history", db,
                          "--history-label", "main")
    assert code == 0 and report.is_file() and "going on without recorded runs" in err
    if db:
        assert not Path(db).exists()  # check and report never create the database


def test_a_database_without_a_main_run_yet(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "history.db")
    assert _cli(capsys, "history", "record", RUN, "--db", db, "--label", "feature")[0] == 0
    code, out, err = _cli(capsys, "check", str(NOISE / "same_2"), "--history", db, "--label",
                          "main")
    assert code == 0 and "no recorded run matches label main" in err
    assert "baseline: no recorded run yet" in out
    # once main is recorded, the gate compares against it
    assert _cli(capsys, "history", "record", RUN, "--db", db, "--label", "main")[0] == 0
    code, out, _ = _cli(capsys, "check", str(NOISE / "same_2"), "--history", db, "--label",
                        "main", "--json")
    assert code == 0 and orjson.loads(out)["history_runs"] == [2]


def test_record_refuses_an_empty_url(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _cli(capsys, "history", "record", RUN, "--db", "")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "URL is empty" in lines[0]
