"""All-to-alls whose split sizes the trace does not record (param's 8-rank DLRM, 2023: every
rank sends 3,392 ints, rank 3 receives 13,312, rank 0 768), and split sizes that both ranks
recorded and that disagree (analyses/alltoall.py ``_unrecorded_splits``). The hand-drawn
3-rank MoE run of tests/test_alltoall.py, one step, its dispatch's sizes rewritten; a token is
16 bytes. Numbers derived by hand in each docstring."""

from __future__ import annotations

import json

import polars as pl
import pytest

import traceview
from gpu_trace_helpers import frame
from test_alltoall import moe_rows
from traceview.run.run import Run

#: tokens each rank receives at the dispatch (every rank sends 6: 96 bytes)
RECEIVED = [3, 12, 3]


def _dispatch_rewritten(out_rows: list[int], out_splits: list[list[int]] | None) -> Run:
    """Step 1 of the MoE run without its combine (each rank's second all-to-all), the
    dispatch receiving ``out_rows[rank]`` tokens; ``out_splits``: each rank's recorded output
    split (None: no split sizes on either side, ``[]``, every rank's input 6 tokens)."""
    rows, seen = [], {"c10d::alltoall_base_": set(), "gloo:all_to_all": set()}
    for r in moe_rows(1):
        if r["name"] in seen:
            if r["rank"] in seen[r["name"]]:
                continue  # the combine
            seen[r["name"]].add(r["rank"])
        if r["name"] == "c10d::alltoall_base_":
            doc = json.loads(r["args_json"])
            doc["Input Dims"][0] = [out_rows[r["rank"]], 4]
            if out_splits is None:
                doc["Concrete Inputs"][3:5] = ["[]", "[]"]
                doc["Input Dims"][1] = [6, 4]
            else:
                doc["Concrete Inputs"][3] = str(out_splits[r["rank"]])
            r = {**r, "args_json": json.dumps(doc)}
        rows.append(r)
    return Run.from_events(frame(rows), align="none")


def _dispatch_cells(res: dict) -> list[tuple[int, int, int]]:
    return res["matrix"].sort("src", "dst").select("src", "dst", "bytes").rows()


def test_unrecorded_uneven_split_keeps_both_sides_totals() -> None:
    """No split sizes; every rank sends 6 tokens (96 bytes), ranks 0, 1, 2 receive 3, 12, 3
    (48, 192, 48 bytes; 288 = 3 x 96: the trace agrees with itself). Each cell src -> dst is
    96 x received(dst) / 288: 16, 64, 16. Rank 1 receives 192 of a mean 96: ratio 2.0, the
    hot rank. The even guesses (32 sent, 16/64/16 received) disagreed: no disagreement
    warning, one that says the splits are not recorded and how the cells are estimated."""
    res = _dispatch_rewritten([3 * r for r in (1, 4, 1)], None).alltoall()
    assert _dispatch_cells(res) == [(s, d, [16, 64, 16][d]) for s in range(3)
                                    for d in range(3)]
    dispatch = res["exchanges"].row(0, named=True)
    assert (dispatch["recv_imbalance"], dispatch["max_recv_rank"]) == (2.0, 1)
    assert res["hot_rank"] == 1
    assert not any("disagree" in w for w in res.warnings)
    said = [w for w in res.warnings if "record no split sizes and are uneven" in w]
    assert len(said) == 1
    assert "send [96, 96, 96] and receive [48, 192, 48] bytes" in said[0]


def test_unrecorded_totals_that_do_not_add_up_keep_the_senders_even_split() -> None:
    """No split sizes; rank 1 receives 10 tokens: 48 + 160 + 48 = 256 bytes received against
    288 sent: the trace's totals do not add up, so no estimate: the sender's even split, 32
    bytes a cell, with a warning naming both totals."""
    res = _dispatch_rewritten([3, 10, 3], None).alltoall()
    assert {b for _, _, b in _dispatch_cells(res)} == {32}
    assert any("senders (288 bytes in all" in w and "receivers (256)" in w
               for w in res.warnings)


def test_recorded_splits_that_disagree_are_named() -> None:
    """Split sizes recorded on both sides. Rank 1 records receiving [3, 5, 4] tokens (12 rows)
    where ranks 0, 1, 2 each record sending it 4: cells 0->1 (64 sent, 48 received) and 1->1
    (64, 80) disagree; 2->1 (64, 64) agrees. The warning names both cells, the sender's
    kept."""
    splits = [[1, 1, 1], [3, 5, 4], [1, 1, 1]]
    res = _dispatch_rewritten([3, 12, 3], splits).alltoall()
    said = [w for w in res.warnings if "disagree" in w]
    assert len(said) == 1 and said[0].startswith("alltoall: 2 (instance, sender, receiver)")
    assert "0->1: rank 0's split sends 64, rank 1's split receives 48 bytes" in said[0]
    assert "1->1: rank 1's split sends 64, rank 1's split receives 80 bytes" in said[0]
    assert "2->1" not in said[0]
    assert _dispatch_cells(res)[1] == (0, 1, 64)


def test_param_dlrm_uneven_embedding_exchange(tmp_path) -> None:
    """param's 8-rank DLRM (corpus): the last of its 5 all-to-alls, an embedding exchange, has
    no split sizes (``c10d::alltoall_base_`` without ``Concrete Inputs``); every rank's input
    is 3,392 ints (13,568 bytes), the outputs 768, 1792, 2304, 13312, 4736, 768, 1536, 1920
    ints (sum 27,136 = 8 x 3,392: the trace agrees with itself). Rank 3 receives 53,248 bytes
    of a mean 13,568: 3.92x. No disagreement is reported: it was our two even guesses."""
    from test_gpu_beyond import _dlrm

    res = traceview.open(_dlrm(tmp_path)).alltoall()
    assert not any("disagree" in w for w in res.warnings)
    received = [4 * n for n in (768, 1792, 2304, 13312, 4736, 768, 1536, 1920)]
    uneven = [w for w in res.warnings if "record no split sizes and are uneven" in w]
    assert len(uneven) == 1 and f"receive {received} bytes" in uneven[0]
    hot = res["exchanges"].filter(pl.col("recv_imbalance") > 1.05)
    assert hot.select("max_recv_rank", "bytes").rows() == [(3, 8 * 13568)]
    assert hot.get_column("recv_imbalance").item() == pytest.approx(53248 / 13568)
