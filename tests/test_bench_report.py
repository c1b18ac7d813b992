"""The harness's verdict on issue 23's ingest bar (``benchmarks/report.py``), on results made
by hand: which rows a real-derived trace gets, and where each bar falls. Nothing is timed."""

from __future__ import annotations

from benchmarks import report


def _form(wall: float, cpu: float, tree_mb: float) -> dict[str, float]:
    return {"wall_s": wall, "cpu_s": cpu, "tree_rss_mb": tree_mb, "peak_rss_mb": tree_mb}


def _results(**decode: dict) -> dict:
    inputs = {"real": {"name": "owlv2", "json_mb": 200.0},
              "real_nccl": {"name": "nccl", "json_mb": 100.0}}
    return {"inputs": inputs, "hta": {"real": {"load_s": 30.0}},
            **{f"decode_{k}": v for k, v in decode.items()}}


def test_each_form_gets_the_wall_cpu_hta_and_memory_bars():
    # limit 1.0 s wall, 1.2 CPU s; the plain form at 1.5 s / 2.4 CPU s is exactly at 2/3 and
    # 1/2; -o DIR at 1.6 s / 2.5 s just misses both; HTA's 30 s is 20x of 1.5 s
    res = _results(real={"msgspec": _form(1.0, 1.2, 700),
                         "ingest_no_cache": _form(1.5, 2.4, 449),
                         "ingest_store": _form(1.6, 2.5, 451)})
    rows = {label: (measured, met) for label, measured, met in report._ingest_bar(res, "real")}
    plain, store = "owlv2: ingest --no-cache", "owlv2: ingest --no-cache -o DIR"
    assert rows[f"{plain} >= 2/3 of the typed-decode limit (wall)"][1] == "yes"
    assert rows[f"{plain} >= 1/2 of the limit per CPU second"][1] == "yes"
    assert rows[f"{plain} >= 20x HTA's load (wall)"] == ("20.0x of 30.0 s", "yes")
    assert rows[f"{store} >= 2/3 of the typed-decode limit (wall)"][1] == "**no**"
    assert rows[f"{store} >= 1/2 of the limit per CPU second"][1] == "**no**"
    assert rows[f"{store} >= 20x HTA's load (wall)"][1] == "**no**"
    # 1.5 x 200 MB + 150 MB = 450 MB, the interpreter included
    assert rows[f"{plain}: tree RSS <= 1.5x file + 150 MB"] == ("449 MB against 450 MB", "yes")
    assert rows[f"{store}: tree RSS <= 1.5x file + 150 MB"] == ("451 MB against 450 MB",
                                                                 "**no**")


def test_a_set_hta_did_not_run_on_has_no_hta_row_and_both_sets_are_side_by_side():
    real = {"msgspec": _form(1.0, 1.2, 700), "ingest_no_cache": _form(1.2, 1.8, 400)}
    res = _results(real=real, real_nccl=dict(real))
    labels = [label for label, _, _ in report._ingest_bar(res, "real_nccl")]
    assert labels == ["nccl: ingest --no-cache >= 2/3 of the typed-decode limit (wall)",
                      "nccl: ingest --no-cache >= 1/2 of the limit per CPU second",
                      "nccl: ingest --no-cache: tree RSS <= 1.5x file + 150 MB"]
    res["decode"] = dict(real)
    res["inputs"]["single"] = {"name": "synthetic", "json_mb": 300.0}
    table = report._real_side_by_side(res)
    assert "synthetic: wall s" in table and "owlv2: wall s" in table and "nccl: wall s" in table


def test_the_sweep_traces_get_the_bar_after_the_two_the_harness_always_builds():
    # run.py --real-extra mtia,b200: their results sit beside the two, in the order asked
    res = _results(real_mtia={}, real_nccl={}, real_b200={}, real={})
    assert report.real_singles(res) == ["real", "real_nccl", "real_mtia", "real_b200"]
    res["inputs"]["real_mtia"] = {"name": "mtia", "json_mb": 300.0}
    res["decode_real_mtia"] = {"msgspec": _form(0.7, 0.8, 900),
                               "ingest_no_cache": _form(1.2, 1.7, 601)}  # bound 600
    rows = {label: met for label, _, met in report._ingest_bar(res, "real_mtia")}
    assert rows["mtia: ingest --no-cache >= 2/3 of the typed-decode limit (wall)"] == "**no**"
    assert rows["mtia: ingest --no-cache >= 1/2 of the limit per CPU second"] == "**no**"
    assert rows["mtia: ingest --no-cache: tree RSS <= 1.5x file + 150 MB"] == "**no**"


def test_each_real_derived_input_is_shown_with_its_mix_and_layout():
    mix = {"source": "hta/rank0.json.gz", "layout": "the source's text (Kineto's writer)",
           "flow": 0.38, "instant": 0.0, "gpu": 0.07, "cpu_op": 0.23, "args_bytes": 0.24,
           "whitespace": 0.226, "lines_per_event": 6.71, "source_whitespace": 0.23,
           "source_lines_per_event": 6.7}
    table = report.mix_table({"real_nccl": {"name": "torch-ranks-1r-250mb", "mix": mix},
                              "single": {"name": "synthetic"}})
    row = next(line for line in table.splitlines() if "torch-ranks" in line)
    assert "rank0.json.gz" in row and "38 %" in row and "23 %, 6.7" in row
    assert "synthetic" not in table  # no mix: not a real-derived set
