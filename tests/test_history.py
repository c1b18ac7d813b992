"""CI history: runs recorded in a real SQLite file and on a real PostgreSQL server, shown,
trended, and used as the gate's baseline; parallel recorders; databases that cannot be used.

The runs are the shipped re-runs of one unchanged 2-rank gloo job (fixtures/data/gate_noise:
same_1..same_3) and the same job with rank 1 slowed by 40 ms per step (slow_1), plus
gloo_ddp_2r_slow1 (fixtures/data/README: a straggler run).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa

from traceview.cli import main
from traceview.outputs import history, history_db
from traceview.outputs import history_schema as S
from traceview.outputs.ci_meta import ci_metadata, parse_meta
from traceview.errors import UsageError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"
NOISE = FIX / "gate_noise"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh history database: a SQLite file path (the default form of --db), or a new
    database on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.db")
    server = request.getfixturevalue("postgres_server")
    return server.create_database(f"h_{uuid.uuid4().hex[:12]}").replace("+psycopg", "")


# ------------------------------------------------------------------------- the sequence

def test_record_check_show_sequence(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # two control runs of the job, labelled main
    for name, commit in (("same_1", "c1"), ("same_2", "c2")):
        code, out, _ = _cli(capsys, "history", "record", str(NOISE / name), "--db", db_url,
                            "--label", "main", "--meta", f"commit={commit}")
        assert code == 0 and "recorded run #" in out, out
    # the third re-run against them passes (the gate's rule, as with a 2-run baseline file)
    code, out, _ = _cli(capsys, "check", str(NOISE / "same_3"), "--history", db_url,
                        "--label", "main", "--json")
    res = orjson.loads(out)
    assert code == 0 and res["exit_code"] == 0, out
    assert res["history_runs"] == [1, 2]
    assert next(r for r in res["metrics"]
                if r["metric"] == "step_time_p50_ns")["baseline_runs"] == 2
    # record it; the straggler run against the last three fails
    code, out, _ = _cli(capsys, "history", "record", str(NOISE / "same_3"), "--db", db_url,
                        "--label", "main", "--meta", "commit=c3", "--json")
    assert code == 0 and orjson.loads(out)["new"] is True and orjson.loads(out)["id"] == 3
    for slowed in (NOISE / "slow_1", FIX / "gloo_ddp_2r_slow1"):
        code, out, _ = _cli(capsys, "check", str(slowed), "--history", db_url, "--last", "3",
                            "--label", "main", "--json")
        res = orjson.loads(out)
        assert code == 1 and res["status"] == "regression", (slowed, out)
        assert res["history_runs"] == [1, 2, 3]
        row = next(r for r in res["metrics"] if r["metric"] == "step_time_p50_ns")
        assert row["status"] == "regression" and row["baseline_runs"] == 3
    # the same inputs under the same label again: a no-op, not a duplicate
    code, out, _ = _cli(capsys, "history", "record", str(NOISE / "same_1"), "--db", db_url,
                        "--label", "main", "--json")
    again = orjson.loads(out)
    assert code == 0 and (again["new"], again["id"]) == (False, 1)
    # ... under another label it is another run
    code, out, _ = _cli(capsys, "history", "record", str(NOISE / "same_1"), "--db", db_url,
                        "--label", "mr-7", "--json")
    other = orjson.loads(out)["id"]  # > 3; PostgreSQL's sequence skips the no-op's number
    assert other > 3 and orjson.loads(out)["new"] is True
    # show: oldest first, with the step metric; --label filters, --last keeps the newest
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url, "--label", "main", "--json")
    runs = orjson.loads(out)["runs"]
    assert code == 0 and [r["id"] for r in runs] == [1, 2, 3]
    assert [r["meta"]["commit"] for r in runs] == ["c1", "c2", "c3"]
    assert [r["label"] for r in runs] == ["main"] * 3
    assert runs == sorted(runs, key=lambda r: r["recorded_at"])
    assert all(set(r) >= {"id", "label", "recorded_at", "meta", "metrics"} for r in runs)
    assert all(r["metrics"]["step_time_p50_ns"] > 0 for r in runs)
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url, "--last", "2", "--json")
    assert [r["id"] for r in orjson.loads(out)["runs"]] == [3, other]
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url, "--label", "main",
                        "--metric", "step_time_p50_ns", "--json")
    doc = orjson.loads(out)
    values = [r["metrics"]["step_time_p50_ns"] for r in runs]
    assert [t["value"] for t in doc["trend"]] == values
    assert doc["trend"][1]["change_frac"] == pytest.approx((values[1] - values[0]) / values[0])
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url, "--label", "main",
                        "--metric", "step_time_p50_ns")
    assert code == 0 and "step_p50_ms" in out and len(out.strip().splitlines()) == 5
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url, "--csv")
    assert out.splitlines()[0].startswith("id,label,recorded_at,commit,branch,host,"
                                          "step_time_p50_ns")
    assert len(out.strip().splitlines()) == 5
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url)
    assert code == 0 and "step_p50_ms" in out and "mr-7" in out


def test_history_baseline_is_the_baseline_files_document(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """check --history builds the same baseline a multi-run `baseline` file holds, so both
    give the same verdict row for row."""
    db = str(tmp_path / "h.db")
    for name in ("same_1", "same_2"):
        assert main(["history", "record", str(NOISE / name), "--db", db, "--label", "main"]) == 0
    assert main(["baseline", "--run", str(NOISE / "same_1"), "--run", str(NOISE / "same_2"),
                 "-o", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    _, by_file, _ = _cli(capsys, "check", str(NOISE / "slow_1"), "--baseline",
                         str(tmp_path / "b.json"), "--json")
    _, by_history, _ = _cli(capsys, "check", str(NOISE / "slow_1"), "--history", db, "--json")
    assert orjson.loads(by_file)["metrics"] == orjson.loads(by_history)["metrics"]
    # a run that was recorded is no evidence about itself: it is left out of its baseline
    code, out, _ = _cli(capsys, "check", str(NOISE / "same_2"), "--history", db, "--json")
    assert orjson.loads(out)["history_runs"] == [1]


def test_report_history_marks_this_run(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly")
    db = str(tmp_path / "h.db")
    for name in ("same_1", "same_2"):
        assert main(["history", "record", str(NOISE / name), "--db", db, "--label", "main"]) == 0
    html = tmp_path / "r.html"
    capsys.readouterr()
    code, out, _ = _cli(capsys, "report", str(NOISE / "slow_1"), "-o", str(html),
                        "--history", db, "--json")
    doc = orjson.loads(out)
    assert code == 0 and doc["history"]["runs"] == [1, 2]
    assert doc["history"]["metric"] == "step_time_p50_ns" and doc["history"]["current"] > 0
    page = html.read_text()
    assert 'id="history"' in page and '"name":"this run"' in page.replace(": ", ":")
    assert '"symbol":"star"' in page.replace(": ", ":")


# --------------------------------------------------------------------- parallel recorders

def _recorders(db: str, jobs: list[tuple[str, str]]) -> list[subprocess.CompletedProcess]:
    """Start every ``(input, label)`` record as its own process at once, as parallel CI jobs
    do, and wait for them all."""
    procs = [subprocess.Popen([sys.executable, "-m", "traceview", "history", "record",
                               str(path), "--db", db, "--label", label, "--no-cache"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=os.environ.copy())
             for path, label in jobs]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def test_concurrent_records_all_land(db_url: str) -> None:
    # six jobs on a database that does not exist yet: they race to create the schema and
    # then to write; two of them record the same inputs under the same label
    jobs = [(NOISE / "same_1", f"job-{i}") for i in range(4)]
    jobs += [(NOISE / "same_2", "twin"), (NOISE / "same_2", "twin")]
    done = _recorders(db_url, jobs)
    assert all(p.returncode == 0 for p in done), [p.stderr for p in done]
    db = history.open_database(db_url, create=False)
    runs = history.recorded_runs(db)
    assert sorted(r.label for r in runs) == ["job-0", "job-1", "job-2", "job-3", "twin"]
    assert all(len(r.measured.samples["step_time_ns"]) == 12 for r in runs)
    twins = [p.stdout for p in done[-2:]]
    assert sum("already recorded" in t for t in twins) == 1, twins
    if db.kind == "sqlite":
        with sqlite3.connect(db_url) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# ------------------------------------------------------------------- schema and upgrades

def test_upgrade_steps_run_in_the_transaction(db_url: str, tmp_path: Path) -> None:
    """A later version's step on a database of this version: the data survive and the
    version moves; a step that fails leaves nothing behind (the version, the tables)."""
    from traceview.outputs import gate

    db = history.open_database(db_url, create=True)
    measured = gate.RunMetrics({"step_time_p50_ns": 1e6}, {}, {"step_time_ns": [1, 2, 3]})
    run_id, _ = history.record(db, measured, label="main", meta={}, inputs=[],
                               inputs_hash="x")

    def add_column(conn: sa.Connection) -> None:  # what a version 2 could do
        conn.execute(sa.text("ALTER TABLE runs ADD COLUMN ci_url VARCHAR(400)"))

    def broken(conn: sa.Connection) -> None:
        conn.execute(sa.text("ALTER TABLE runs ADD COLUMN half VARCHAR(10)"))
        raise RuntimeError("step failed part-way")

    def version(conn: sa.Connection) -> int:
        return conn.execute(sa.select(S.schema_version.c.version)).scalar_one()

    with pytest.raises(RuntimeError), db.engine.begin() as conn:  # raised out of it: rollback
        S.upgrade(conn, S.SCHEMA_VERSION, written_by="test", steps=(*S.UPGRADES, broken))
    with db.engine.connect() as conn:
        cols = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
        assert version(conn) == S.SCHEMA_VERSION and "half" not in cols
    with db.engine.begin() as conn:
        assert S.upgrade(conn, S.SCHEMA_VERSION, written_by="test",
                         steps=(*S.UPGRADES, add_column)) == S.SCHEMA_VERSION + 1
    with db.engine.connect() as conn:
        assert version(conn) == S.SCHEMA_VERSION + 1
        assert conn.execute(sa.select(S.runs.c.id)).scalars().all() == [run_id]
    # this traceview does not know the next version: it refuses the newer database
    with pytest.raises(history.HistoryError, match="newer traceview"):
        history.recorded_runs(db)


def test_a_failed_write_leaves_nothing(db_url: str) -> None:
    db = history.open_database(db_url, create=True)

    def half(conn: sa.Connection) -> None:
        history_db.insert_run(conn, {"label": "x", "inputs_hash": "h", "recorded_at": "t",
                                     "meta": {}, "inputs": [], "warnings": []}, [], [])
        raise RuntimeError("killed part-way")

    # on a new database even the schema it created goes with the failed write
    with pytest.raises(RuntimeError):
        history_db.write(db, half)
    with pytest.raises(history.HistoryError, match="empty database"):
        history.recorded_runs(db)
    from traceview.outputs import gate

    kept = gate.RunMetrics({"step_time_p50_ns": 1e6}, {}, {})
    run_id, _ = history.record(db, kept, label="x", meta={}, inputs=[], inputs_hash="k")
    with pytest.raises(RuntimeError):
        history_db.write(db, half)
    assert [r.id for r in history.recorded_runs(db)] == [run_id]


# ------------------------------------------------------------- databases we cannot use

def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], names: str) -> str:
    code, _, err = _cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("traceview: ") and names in lines[0], err
    return lines[0]


def test_bad_unreachable_and_foreign_databases_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(NOISE / "same_1")
    # a SQLite file of another program: refused, and left as it was
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    before = foreign.read_bytes()
    for argv in (["history", "record", run, "--db", str(foreign)],
                 ["history", "show", "--db", str(foreign)],
                 ["check", run, "--history", str(foreign)]):
        line = _one_line_exit_2(capsys, argv, str(foreign))
        assert "not a traceview history database" in line and "users" in line
    assert foreign.read_bytes() == before
    # a schema_version table of another program
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER)")
        conn.execute("INSERT INTO schema_version VALUES (7)")
    _one_line_exit_2(capsys, ["history", "show", "--db", str(other)], str(other))
    # a file that is not a database at all
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    _one_line_exit_2(capsys, ["history", "record", run, "--db", str(text)], str(text))
    # no such file to read from; an empty database
    missing = tmp_path / "missing.db"
    assert "no such history database" in _one_line_exit_2(
        capsys, ["history", "show", "--db", str(missing)], str(missing))
    assert not missing.exists()
    # URLs: another scheme, an in-memory SQLite, garbage, an unreachable server
    _one_line_exit_2(capsys, ["history", "show", "--db", "mysql://u@h/db"], "mysql://")
    _one_line_exit_2(capsys, ["history", "show", "--db", "sqlite://"], "sqlite://")
    _one_line_exit_2(capsys, ["history", "show", "--db", "postgresql://u@h:notaport/db"],
                     "notaport")
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://tv:secret@127.0.0.1:{port}/none"
    line = _one_line_exit_2(capsys, ["check", run, "--history", url], f"127.0.0.1:{port}")
    assert "secret" not in line  # the password is never printed
    # usage: both or neither of --baseline / --history
    assert main(["check", run]) == 2
    assert main(["check", run, "--history", url, "--baseline", str(foreign)]) == 2
    assert main(["history", "show", "--db", str(foreign), "--metric", "nope"]) == 2


def test_foreign_and_newer_postgresql_databases_exit_2(
        postgres_server, capsys: pytest.CaptureFixture[str]) -> None:
    url = postgres_server.create_database(f"app_{uuid.uuid4().hex[:8]}").replace("+psycopg", "")
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (id SERIAL PRIMARY KEY)"))
    line = _one_line_exit_2(capsys, ["history", "record", str(NOISE / "same_1"), "--db", url],
                            "127.0.0.1")
    assert "orders" in line
    with engine.connect() as conn:  # nothing of ours was written
        assert sa.inspect(conn).get_table_names() == ["orders"]
    engine.dispose()
    _one_line_exit_2(capsys, ["history", "show", "--db",
                              postgres_server.url.rsplit("/", 1)[0] + "/no_such_db"],
                     "no_such_db")


# ------------------------------------------------------------------------- CI metadata

def test_ci_metadata_of_each_system() -> None:
    gh = ci_metadata({"GITHUB_ACTIONS": "true", "GITHUB_SHA": "a1", "GITHUB_REF_NAME": "7/merge",
                      "GITHUB_HEAD_REF": "feature", "GITHUB_RUN_ID": "99"})
    assert gh == {"ci": "github", "commit": "a1", "branch": "feature", "build": "99"}
    gl = ci_metadata({"GITLAB_CI": "true", "CI_COMMIT_SHA": "b2", "CI_COMMIT_REF_NAME": "main",
                      "CI_PIPELINE_ID": "5", "CI_JOB_URL": "https://g/j/1"})
    assert gl == {"ci": "gitlab", "commit": "b2", "branch": "main", "build": "5",
                  "build_url": "https://g/j/1"}
    bk = ci_metadata({"BUILDKITE": "true", "BUILDKITE_COMMIT": "c3", "BUILDKITE_BRANCH": "dev",
                      "BUILDKITE_PULL_REQUEST": "false", "BUILDKITE_BUILD_NUMBER": "12"})
    assert bk == {"ci": "buildkite", "commit": "c3", "branch": "dev", "build": "12"}
    jk = ci_metadata({"JENKINS_URL": "https://j/", "GIT_COMMIT": "d4",
                      "GIT_BRANCH": "origin/release", "BUILD_URL": "https://j/b/3"})
    assert (jk["ci"], jk["commit"], jk["branch"], jk["build_url"]) == \
        ("jenkins", "d4", "release", "https://j/b/3")
    # Jenkins' variables inside a GitHub job are not read: the first marker decides
    assert ci_metadata({"GITHUB_ACTIONS": "true", "GIT_COMMIT": "x"}) == {"ci": "github"}
    assert parse_meta(["k=v", "url=a=b"]) == {"k": "v", "url": "a=b"}
    with pytest.raises(UsageError):
        parse_meta(["novalue"])


def test_record_takes_commit_and_branch_from_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for name in [n for n in os.environ if n in ("GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE",
                                                 "JENKINS_URL", "CIRCLECI", "TF_BUILD")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GITLAB_CI", "true")
    monkeypatch.setenv("CI_COMMIT_SHA", "0123456789abcdef")
    monkeypatch.setenv("CI_COMMIT_REF_NAME", "main")
    db = str(tmp_path / "h.db")
    code, out, _ = _cli(capsys, "history", "record", str(NOISE / "same_1"), "--db", db,
                        "--meta", "host=runner-1", "--json")
    doc = orjson.loads(out)
    assert code == 0 and doc["label"] == "main"  # no --label: the branch
    assert doc["meta"] == {"ci": "gitlab", "commit": "0123456789abcdef", "branch": "main",
                           "host": "runner-1"}
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT commit_sha, branch, host, inputs FROM runs").fetchone()
    assert row[:3] == ("0123456789abcdef", "main", "runner-1")
    assert sorted(i["file"] for i in orjson.loads(row[3])) == sorted(
        p.name for p in (NOISE / "same_1").iterdir() if p.name.endswith(".json.gz"))


# ------------------------------------------------------------------------- secrets

def test_a_postgresql_password_reaches_no_output(
        postgres_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A password in the URL's user info (holding ``@`` and ``/``, not %-encoded) or given as
    ``?password=`` is used, and appears in no output of the history commands: their text,
    --json, --csv, JUnit, the HTML report, and their errors (a database that does not exist,
    a port that is not a number). The server trusts local users, so any password connects."""
    pytest.importorskip("plotly")
    base = postgres_server.create_database(f"h_{uuid.uuid4().hex[:12]}").replace("+psycopg", "")
    user_host, name = base.split("://", 1)[1].rsplit("/", 1)
    user, host = user_host.split("@")
    secrets = ["S3cr@t/pw", "Qs7-secret"]
    urls = [f"postgresql://{user}:{secrets[0]}@{host}/{name}",
            f"postgresql://{user}@{host}/{name}?password={secrets[1]}"]
    outputs: list[str] = []

    def ask(*argv: str) -> int:
        code, out, err = _cli(capsys, *argv)
        outputs.extend([out, err])
        return code

    html, junit = tmp_path / "r.html", tmp_path / "j.xml"
    for url in urls:
        for run in ("same_1", "same_2"):
            assert ask("history", "record", str(NOISE / run), "--db", url, "--label",
                       "main") == 0
        assert ask("history", "record", str(NOISE / "same_3"), "--db", url, "--json") == 0
        for shown in ((), ("--json",), ("--csv",)):
            assert ask("history", "show", "--db", url, *shown) == 0
        assert ask("history", "upgrade", "--db", url) == 0
        assert ask("check", str(NOISE / "same_3"), "--history", url, "--json",
                   "--junit", str(junit)) == 0
        outputs.append(junit.read_text())
        assert ask("report", str(NOISE / "slow_1"), "-o", str(html), "--history", url,
                   "--json") == 0
        outputs.append(html.read_text())
        assert ask("history", "show", "--db", url.replace(f"/{name}", "/no_such_db")) == 2
        assert ask("history", "show", "--db", url.replace(host, host.split(":")[0] + ":x1")) == 2
    assert "S3cr" not in "".join(outputs) and "S3cr%40t" not in "".join(outputs)
    assert secrets[1] not in "".join(outputs)
    assert "***" in "".join(outputs)  # where the URL is named, the password is starred


def test_postgresql_waits_for_a_held_lock_no_longer_than_its_timeout(
        postgres_server, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """Another session holds the writers' advisory lock (record) or locks the runs table
    (show): each command gives up after the lock timeout, one line naming the database,
    exit 2, instead of waiting forever."""
    import time

    import psycopg

    url = postgres_server.create_database(f"h_{uuid.uuid4().hex[:12]}").replace("+psycopg", "")
    assert main(["history", "record", str(NOISE / "same_1"), "--db", url]) == 0
    monkeypatch.setattr(history_db, "PG_LOCK_TIMEOUT_S", 1)
    with psycopg.connect(url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (history_db.PG_LOCK_KEY,))
        start = time.monotonic()
        line = _one_line_exit_2(capsys, ["history", "record", str(NOISE / "same_2"), "--db",
                                         url], "127.0.0.1")
        assert "lock timeout" in line and time.monotonic() - start < 30
        other.rollback()
        other.execute(f"LOCK TABLE {S.runs.name} IN ACCESS EXCLUSIVE MODE")
        start = time.monotonic()
        line = _one_line_exit_2(capsys, ["history", "show", "--db", url], "127.0.0.1")
        assert "lock timeout" in line and time.monotonic() - start < 30


def test_history_show_csv_writes_no_formula(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A label and a branch from a fork (``=HYPERLINK(...)``, ``+cmd``) reach ``history show
    --csv`` with a leading ``'``: a spreadsheet shows them as text (OWASP)."""
    import csv
    import io

    db = str(tmp_path / "h.db")
    assert main(["history", "record", str(NOISE / "same_1"), "--db", db, "--label",
                 '=HYPERLINK("http://evil","x")', "--meta", "branch=+cmd|calc",
                 "--meta", "commit=@c1"]) == 0
    capsys.readouterr()
    code, out, _ = _cli(capsys, "history", "show", "--db", db, "--csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and rows[0]["label"] == "'=HYPERLINK(\"http://evil\",\"x\")"
    assert (rows[0]["branch"], rows[0]["commit"]) == ("'+cmd|calc", "'@c1")


def test_long_labels_commits_branches_and_hosts_are_taken_by_both_backends(
        db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """PostgreSQL refused what SQLite took (a label over 200 characters, a commit over 100,
    a branch or host over 255): both take them now (TEXT), and a label over 512 characters
    (the unique index's bound on PostgreSQL) is a usage error on both. A version 1
    database (its VARCHAR columns) is upgraded on the next record."""
    with history_db.open_database(db_url, create=True).engine.begin() as conn:
        S.upgrade(conn, 0, written_by="test", steps=S.UPGRADES[:1])  # a version 1 database
    code, _, err = _cli(capsys, "history", "show", "--db", db_url)  # read as it is
    assert code == 0 and "no recorded run matches" in err
    label, commit, branch, host = "L" * 300, "c" * 150, "b" * 400, "h" * 300
    code, out, err = _cli(capsys, "history", "record", str(NOISE / "same_1"), "--db", db_url,
                          "--label", label, "--meta", f"commit={commit}", "--meta",
                          f"branch={branch}", "--meta", f"host={host}", "--json")
    assert code == 0, err
    code, out, _ = _cli(capsys, "history", "show", "--db", db_url, "--json")
    (run,) = orjson.loads(out)["runs"]
    assert (run["label"], run["meta"]["commit"], run["meta"]["branch"], run["meta"]["host"]) \
        == (label, commit, branch, host)
    code, _, err = _cli(capsys, "history", "record", str(NOISE / "same_2"), "--db", db_url,
                        "--label", "x" * 513)
    assert code == 2 and "at most 512 characters" in err


def test_a_sqlite_url_opened_read_only_is_read_and_never_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sqlite:///FILE?mode=ro``: show and check read it; record and upgrade refuse it
    (one line, exit 2) before any trace is read, and the file is not changed; an unknown
    parameter is refused by name (it was a raw SQLAlchemy warning, then ignored)."""
    db = tmp_path / "h.db"
    assert main(["history", "record", str(NOISE / "same_1"), "--db", str(db)]) == 0
    before = db.read_bytes()
    url = f"sqlite:///{db}?mode=ro"
    capsys.readouterr()
    code, out, _ = _cli(capsys, "history", "show", "--db", url, "--json")
    assert code == 0 and len(orjson.loads(out)["runs"]) == 1
    for argv in (["history", "record", str(NOISE / "same_2"), "--db", url],
                 ["history", "upgrade", "--db", url]):
        line = _one_line_exit_2(capsys, argv, str(db))
        assert "read-only" in line
    assert db.read_bytes() == before
    assert main(["check", str(NOISE / "same_2"), "--history", url]) in (0, 1)
    line = _one_line_exit_2(capsys, ["history", "show", "--db", f"sqlite:///{db}?nolock=1"],
                            str(db))
    assert "nolock" in line


ODD_ROWS = {
    "a label that is a blob": "UPDATE runs SET label = x'ff00'",
    "meta that is not JSON": "UPDATE runs SET meta = 'not json'",
    "meta that is a list": "UPDATE runs SET meta = '[1, 2]'",
    "inputs that are an object": "UPDATE runs SET inputs = '{\"a\": 1}'",
    "inputs without a file": "UPDATE runs SET inputs = '[{\"bytes\": 1}]'",
    "warnings of numbers": "UPDATE runs SET warnings = '[1, 2]'",
    "a metric of text": "UPDATE metrics SET value = 'abc'",
    "a metric of infinity": "UPDATE metrics SET value = 9e999",
    "a note that is a blob": "UPDATE metrics SET note = x'00ff'",
    "samples that are text": "UPDATE samples SET steps = '\"x\"'",
    "samples holding text": "UPDATE samples SET steps = '[1, \"a\"]'",
    "samples that are not JSON": "UPDATE samples SET steps = '[1,'",
}


@pytest.mark.parametrize("odd", list(ODD_ROWS))
def test_rows_this_program_did_not_write_are_one_line_naming_the_database(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], odd: str) -> None:
    """Rows edited by hand or by another program: show, show --json/--csv, check and report
    --history say so in one line naming the database (exit 2), never an internal error."""
    db = tmp_path / "h.db"
    for run in ("same_1", "same_2"):
        assert main(["history", "record", str(NOISE / run), "--db", str(db)]) == 0
    with sqlite3.connect(db) as conn:
        conn.execute(ODD_ROWS[odd])
    capsys.readouterr()
    for argv in (["history", "show", "--db", str(db)],
                 ["history", "show", "--db", str(db), "--json"],
                 ["history", "show", "--db", str(db), "--csv",
                  "--metric", "step_time_p50_ns"],
                 ["check", str(NOISE / "same_3"), "--history", str(db)]):
        line = _one_line_exit_2(capsys, argv, str(db))
        assert "a row this traceview did not write" in line, line


def test_a_label_or_meta_that_is_not_utf8_is_a_usage_error(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch) -> None:
    """Bytes the shell passed that are not UTF-8 (kept by Python as lone surrogates): a
    usage error naming the option; a CI variable's, kept as U+FFFD."""
    db = str(tmp_path / "h.db")
    bad = os.fsdecode(b"br\xff")
    for argv in (["--label", bad], ["--meta", f"k={bad}"]):
        line = _one_line_exit_2(capsys, ["history", "record", str(NOISE / "same_1"), "--db",
                                         db, *argv], argv[0])
        assert "not valid UTF-8" in line
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REF_NAME", bad)
    assert main(["history", "record", str(NOISE / "same_1"), "--db", db]) == 0
    capsys.readouterr()
    code, out, _ = _cli(capsys, "history", "show", "--db", db, "--json")
    assert orjson.loads(out)["runs"][0]["label"] == "br\ufffd"
