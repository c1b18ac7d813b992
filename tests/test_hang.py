"""``traceview hang``: flight-recorder dumps read safely, the hang verdict on hand-drawn dumps
(answers derived by hand), on REAL gloo dumps hung on purpose (``fixtures/data/fr_hangs``,
``fixtures/fr_hangs.py``) against their truth, and against PyTorch's own ``fr_trace``."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from traceview.analyses.hang import hang
from traceview.cli import main
from traceview.parsers.flight_recorder import CONFIG_SCHEMA, ENTRY_SCHEMA, STATUS_SCHEMA
from traceview.run.hang import hang_result

REPO = Path(__file__).resolve().parents[1]
DUMPS = REPO / "fixtures" / "data" / "fr_hangs"
TRUTH = json.loads((DUMPS / "truth.json").read_text())


def entry(rank: int, seq: int, op: str = "all_reduce", sizes: str = "[[4]]",
          state: str = "scheduled", group: str = "1") -> dict:
    return dict(rank=rank, group=group, group_desc="train", seq=seq, is_p2p=False, op=op,
                sizes=sizes, state=state, record_id=seq, time_created_ns=1000 * seq)


def verdict(rows: list[dict], *, dumped: list[int], status: list[dict] = (),
            config: list[dict] = (), world_size: int | None = None) -> dict:
    e = pl.DataFrame(rows, schema={k: ENTRY_SCHEMA[k] for k in rows[0]})
    for k, t in ENTRY_SCHEMA.items():
        if k not in e.columns:
            e = e.with_columns(pl.lit(None, t).alias(k))
    return hang(e.select(list(ENTRY_SCHEMA)),
                pl.DataFrame(list(status), schema=STATUS_SCHEMA),
                pl.DataFrame(list(config), schema=CONFIG_SCHEMA), dumped=dumped,
                world_size=world_size)


def test_lagging_rank_by_hand() -> None:
    # ranks 0, 1, 3 called #1..#5; rank 2 stopped after #3: stuck at #4, culprit 2, the
    # others wait in #4 (the first one rank 2 never called), completed by all: #3 (status)
    rows = [entry(r, s) for r in (0, 1, 3) for s in range(1, 6)] + \
        [entry(2, s) for s in range(1, 4)]
    status = [dict(rank=r, group="1", last_enqueued=5 if r != 2 else 3, last_started=-1,
                   last_completed=5 if r != 2 else 3) for r in range(4)]
    v = verdict(rows, dumped=[0, 1, 2, 3], status=status)
    assert v["culprit_ranks"] == [2] and v["stuck_seq"] == 4 and v["missing_dumps"] == []
    g = v["groups"][0]
    assert g["completed_by_all"] == 3 and g["rule"] == "lagging"
    assert [(w["rank"], w["op"], w["seq"]) for w in g["waiting"]] == [
        (0, "all_reduce", 4), (1, "all_reduce", 4), (3, "all_reduce", 4)]
    assert v["notes"] and "scheduled" in v["notes"][0]  # gloo-like: no states to go by


def test_op_and_size_mismatch_by_hand() -> None:
    rows = [entry(r, s) for r in range(4) for s in (1, 2)] + \
        [entry(r, 3, op="broadcast" if r == 1 else "all_reduce") for r in range(4)]
    v = verdict(rows, dumped=[0, 1, 2, 3])
    assert v["culprit_ranks"] == [1] and v["stuck_seq"] == 3
    assert v["mismatches"] == [{"seq": 3, "ranks": [0, 1, 2, 3],
                                "ops": ["all_reduce", "broadcast", "all_reduce", "all_reduce"],
                                "group": "1", "sizes": ["[[4]]"] * 4}]
    sized = [entry(r, 1, sizes="[[8]]" if r == 0 else "[[4]]") for r in range(3)]
    assert verdict(sized, dumped=[0, 1, 2])["culprit_ranks"] == [0]
    # all-to-all splits may differ by design: sizes are not compared, the op is
    uneven = [entry(r, 1, op="all_to_all", sizes=f"[[{r + 1}]]") for r in range(3)]
    assert verdict(uneven, dumped=[0, 1, 2])["consistent"]
    # a tie (2 against 2) names both sides, with low confidence
    tie = [entry(r, 1, op="broadcast" if r < 2 else "all_reduce") for r in range(4)]
    t = verdict(tie, dumped=[0, 1, 2, 3])
    assert t["culprit_ranks"] == [0, 1, 2, 3] and t["groups"][0]["confidence"] == "low"


def test_missing_dump_and_membership_by_hand() -> None:
    # ranks 0, 2 dumped, world 3 named by pg_config: rank 1's dump is missing; the others
    # last called #2: rank 1 is the (low-confidence) suspect
    rows = [entry(r, s) for r in (0, 2) for s in (1, 2)]
    config = [dict(rank=0, group="1", group_desc="train", ranks=[0, 1, 2])]
    v = verdict(rows, dumped=[0, 2], config=config)
    assert v["missing_dumps"] == [1] and v["culprit_ranks"] == [1] and v["stuck_seq"] == 2
    assert v["groups"][0]["confidence"] == "low" and v["groups"][0]["rule"] == "missing_dump"
    # --world-size names a missing rank no dump knows of
    assert verdict(rows, dumped=[0, 2], world_size=4)["missing_dumps"] == [1, 3]


def test_nccl_states_by_hand() -> None:
    # NCCL-like: at #2, ranks 0 and 1 started, rank 2 only scheduled: rank 2 never started
    rows = [entry(r, 1, state="completed") for r in range(3)] + [
        entry(0, 2, state="started"), entry(1, 2, state="started"), entry(2, 2)]
    v = verdict(rows, dumped=[0, 1, 2])
    assert v["culprit_ranks"] == [2] and v["stuck_seq"] == 2
    assert v["groups"][0]["rule"] == "not_started" and v["groups"][0]["completed_by_all"] == 1
    # everyone inside #2, nobody done: stuck, and no rank to blame
    inside = [entry(r, 1, state="completed") for r in range(3)] + \
        [entry(r, 2, state="started") for r in range(3)]
    w = verdict(inside, dumped=[0, 1, 2])
    assert w["culprit_ranks"] == [] and w["stuck_seq"] == 2
    assert w["groups"][0]["rule"] == "all_inside" and not w["consistent"]
    done = [entry(r, s, state="completed") for r in range(3) for s in (1, 2)]
    assert verdict(done, dumped=[0, 1, 2])["consistent"]


def test_unsafe_or_damaged_dumps_are_one_line_errors(tmp_path, capsys) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    assert main(["hang", str(tmp_path / "rank_0")]) == 2
    err = capsys.readouterr().err
    assert "rank_0" in err and "only plain data" in err and "pwned" not in err
    (tmp_path / "rank_1").write_bytes(b"\x80\x04not a pickle")
    assert main(["hang", str(tmp_path / "rank_1")]) == 2
    (tmp_path / "dump").write_bytes(pickle.dumps({"entries": []}))
    assert main(["hang", str(tmp_path / "dump")]) == 2
    assert "no rank in the file name" in capsys.readouterr().err
    before = (tmp_path / "rank_0").read_bytes()
    assert (tmp_path / "rank_0").read_bytes() == before  # inputs are never modified


@pytest.mark.parametrize("scenario", sorted(TRUTH))
def test_real_gloo_dumps_against_truth(scenario: str, capsys) -> None:
    truth = TRUTH[scenario]
    res = hang_result([DUMPS / scenario])
    assert res["culprit_ranks"] == truth["culprit_ranks"]
    assert res["missing_dumps"] == truth["missing_dumps"]
    assert res["stuck_seq"] == truth["stuck_seq"]
    doc = res.to_dict()
    assert list(doc)[:5] == ["culprit_ranks", "stuck_seq", "missing_dumps", "mismatches",
                             "groups"]
    assert all(set(m) >= {"seq", "ranks", "ops"} for m in doc["mismatches"])
    code = main(["hang", str(DUMPS / scenario), "--json"])
    assert code == (0 if scenario == "healthy" else 1)
    assert json.loads(capsys.readouterr().out)["culprit_ranks"] == truth["culprit_ranks"]
    train = next(g for g in res["groups"] if g["group_desc"] == "train")
    if truth["stuck_seq"] is not None:  # the others wait in the 4th all-reduce
        assert train["completed_by_all"] == 3
        assert {w["op"] for w in train["waiting"]} == {"all_reduce"}
        assert {w["seq"] for w in train["waiting"]} == {4}


def fr_trace(folder: Path, scenario: str, tmp_path: Path) -> str:
    """PyTorch's analyser on copies of the dumps. gloo registers no group in ``pg_config``
    (which fr_trace needs for membership, and fails without: KeyError), so the copies get the
    groups the generator made (truth.json); the entries are untouched."""
    work = tmp_path / scenario
    work.mkdir()
    groups = TRUTH[scenario]["groups"]
    for f in sorted(folder.glob("rank_*")):
        data = pickle.loads(f.read_bytes())  # our own fixture, made by fixtures/fr_hangs.py
        data["pg_config"] = {g: {"name": g, "desc": c["desc"], "ranks": str(c["ranks"])}
                             for g, c in groups.items()}
        (work / f.name).write_bytes(pickle.dumps(data))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                          str(work), "-p", "rank_", "--allow-incomplete-ranks"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


@pytest.mark.parametrize("scenario", sorted(TRUTH))
def test_agrees_with_pytorch_fr_trace(scenario: str, tmp_path) -> None:
    pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
    text = fr_trace(DUMPS / scenario, scenario, tmp_path)
    ours = hang_result([DUMPS / scenario])
    named = set()
    for found in re.findall(r"missing ranks: \{([\d, ]+)\}", text):  # never joined
        named |= {int(r) for r in found.split(",")}
        assert named <= set(ours["culprit_ranks"]), text
    for found in re.findall(r"missed FR dumps from ranks \(\{([\d, ]+)\}\)", text):
        assert {int(r) for r in found.split(",")} == set(ours["missing_dumps"]), text
        named.add(-1)
    if "has errors" in text:
        # fr_trace names the ranks that differ from the entry it started from (its own
        # comment: it may name the normal ranks): the same split as ours, either side
        odd = {int(r) for r in re.findall(r"Culprit rank (\d+)", text)}
        expected = set(range(TRUTH[scenario]["world_size"]))
        ours_odd = set(ours["culprit_ranks"])
        assert odd in (ours_odd, expected - ours_odd), text
        assert [m["seq"] for m in ours["mismatches"]] == [
            int(s) for s in re.findall(r"Collective sequence number: (\d+) has errors", text)]
        named.add(-2)
    if scenario == "healthy":
        assert not named and "Not all ranks" not in text and "has errors" not in text, text
    else:
        assert named, f"fr_trace named nothing on {scenario}: {text}"


def test_exit_scenario_needs_no_world_size(capsys) -> None:
    # rank 1 exited: ranks 0, 2, 3 dumped; the gap in the numbers names it
    assert main(["hang", str(DUMPS / "exit")]) == 1
    out = capsys.readouterr().out
    assert "missing dumps: rank 1" in out and "wait in all_reduce #4" in out


def test_folder_copy_keeps_inputs(tmp_path) -> None:
    shutil.copytree(DUMPS / "skip", tmp_path / "skip")
    before = {f.name: f.read_bytes() for f in (tmp_path / "skip").iterdir()}
    hang_result([tmp_path / "skip"])
    assert {f.name: f.read_bytes() for f in (tmp_path / "skip").iterdir()} == before


def test_python_api_and_report_section(tmp_path) -> None:
    import traceview

    assert traceview.hang(DUMPS / "skip").to_dict() == hang_result([DUMPS / "skip"]).to_dict()
    with pytest.raises(traceview.UsageError, match="flight-recorder dumps, not traces"):
        traceview.open(DUMPS / "skip")
    out = tmp_path / "r.html"
    traces = REPO / "fixtures" / "data" / "gloo_collectives" / "nodes"
    assert main(["report", str(traces), "--fr-dumps", str(DUMPS / "wrong_op"), "-o", str(out),
                 "--no-cache"]) == 0
    page = out.read_text()
    assert 'id="hang"' in page and "rank 3 called broadcast" in page
    assert "host node1: ranks 2–3 all late" in page  # the late node, in the stragglers
    assert "made of (<code>time_is</code>" in page and "inter-node" in page  # time_is rows


def test_point_to_point_by_hand() -> None:
    # NCCL-like pipeline group "pp" of global ranks [4, 6] (local 0 and 1): rank 4 sent twice
    # to rank 6 (local "0->1"), rank 6 posted one receive ("1<-0"): rank 6 never posted the
    # second; rank 4 waits in its second send (p2p seq 2)
    def p2p(rank: int, op: str, meta: str, p2p_seq: int) -> dict:
        src, dst = (int(x) for x in (meta.split("->") if "->" in meta
                                      else reversed(meta.split("<-"))))
        return dict(rank=rank, group="pp", group_desc="pp", seq=0, p2p_seq=p2p_seq,
                    is_p2p=True, op=op, sizes="[[4]]", state="started", record_id=p2p_seq,
                    time_created_ns=p2p_seq, src=src, dst=dst)
    rows = [p2p(4, "send", "0->1", 1), p2p(4, "send", "0->1", 2), p2p(6, "recv", "1<-0", 1)]
    config = [dict(rank=4, group="pp", group_desc="pp", ranks=[4, 6])]
    v = verdict(rows, dumped=[4, 6], config=config, world_size=8)
    g = next(g for g in v["groups"] if g["group"] == "pp")
    assert g["culprits"] == [6] and g["rule"] == "p2p" and g["stuck_p2p_seq"] == 2
    assert [(w["rank"], w["op"], w["p2p_seq"]) for w in g["waiting"]] == [(4, "send", 2)]
    assert 6 in v["culprit_ranks"] and not v["consistent"]


def test_p2p_names_parse_as_fr_trace_reads_them() -> None:
    from traceview.parsers.flight_recorder import _op

    assert _op("nccl:send 0->1") == ("send", 0, 1)
    assert _op("nccl:recv 1<-0") == ("recv", 0, 1)
    assert _op("gloo:all_reduce") == ("all_reduce", None, None)


def test_few_ahead_lowers_confidence() -> None:
    # rank 0 alone called a 3rd collective the other three never called: the rule still names
    # the ranks that never called #3 (as fr_trace's "missing ranks"), with medium confidence,
    # and the reason gives the other reading
    rows = [entry(r, s) for r in range(4) for s in (1, 2)] + [entry(0, 3)]
    g = verdict(rows, dumped=[0, 1, 2, 3])["groups"][0]
    assert g["culprits"] == [1, 2, 3] and g["confidence"] == "medium"
    assert "or rank 0 called a collective the others never call" in g["reason"]


def test_other_files_in_a_dump_folder_are_passed_over_with_a_warning(tmp_path) -> None:
    shutil.copytree(DUMPS / "skip", tmp_path / "d")
    (tmp_path / "d" / "notes.txt").write_text("not a dump")
    res = hang_result([tmp_path / "d"])
    assert res["culprit_ranks"] == [2]
    assert any("passed over 1 file" in w and "notes.txt" in w for w in res.warnings)


def test_json_dumps_read_as_the_pickles(tmp_path) -> None:
    # _dump_fr_trace_json writes the same keys, pg_status counters as text
    for f in sorted((DUMPS / "skip").glob("rank_*")):
        data = pickle.loads(f.read_bytes())
        data["pg_status"] = {g: {k: str(v) for k, v in st.items()}
                             for g, st in data["pg_status"].items()}
        data["entries"] = [{**e, "process_group": list(e["process_group"])}
                           for e in data["entries"]]
        (tmp_path / f.name).write_text(json.dumps(data))
    as_json = hang_result([tmp_path]).to_dict()
    as_pickle = hang_result([DUMPS / "skip"]).to_dict()
    for key in ("culprit_ranks", "stuck_seq", "missing_dumps", "mismatches"):
        assert as_json[key] == as_pickle[key]
    assert as_json["groups"][0]["completed_by_all"] == 3
