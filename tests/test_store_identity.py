"""The ingested store stays identical: a digest of every stored table against a committed golden.

Each case ingests fixture traces with ``traceview.open`` into a fresh cache and digests the
``events``, ``ranks`` and ``files`` tables: rows sorted by every column (categoricals as text),
one SHA-256 per column over its canonical CSV text, and one over all of them. Any change in what
a parser stores (a value, a null, a row, a dtype, a column) changes a digest, and the failure
names the columns that moved. Optimising a parser must leave this test green.

The golden file ``tests/golden/store_digests.json`` is regenerated ONLY with
``TRACEVIEW_REGEN_GOLDEN=1 pytest tests/test_store_identity.py``, and only for an intended
change of parsed output, stated in the commit message (never to hide a difference).
Corpus cases (``$TRACEVIEW_CORPUS``, else ``../shared/corpus``) skip cleanly when the corpus is absent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import orjson
import polars as pl
import pytest

from tests.conftest import CORPUS, absent

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "store_digests.json"
REGEN = os.environ.get("TRACEVIEW_REGEN_GOLDEN") == "1"

# files-table columns that depend on where the input lies, not on what was parsed
_PLACE_COLUMNS = ("path",)


def _canonical(df: pl.DataFrame) -> pl.DataFrame:
    """Categoricals/enums as text, rows sorted by every column (nulls last)."""
    df = df.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))
    if df.height == 0 or df.width == 0:
        return df
    return df.sort(df.columns, nulls_last=True, maintain_order=True)


def table_digest(df: pl.DataFrame) -> dict[str, object]:
    """Row count, dtypes and one SHA-256 per column over the canonical sorted rows."""
    original = {name: str(dtype) for name, dtype in df.schema.items()}
    canon = _canonical(df)
    columns = {}
    for name in canon.columns:
        text = canon.select(name).write_csv(include_header=False, null_value="\\N")
        columns[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    whole = hashlib.sha256(orjson.dumps([canon.height, original, columns])).hexdigest()[:16]
    return {"rows": canon.height, "dtypes": original, "columns": columns, "all": whole}


def store_digest(paths: list[Path], cache_dir: Path) -> dict[str, object]:
    import traceview

    ts = traceview.open([str(p) for p in paths], cache_dir=cache_dir)
    files = ts.files.drop(*_PLACE_COLUMNS)
    return {"events": table_digest(ts.events.collect()), "ranks": table_digest(ts.ranks),
            "files": table_digest(files)}


# ---- cases: name -> function(tmp dir) -> input paths (None = skip with the returned reason) ----

def _fixture_dir(name: str) -> Callable[[Path], list[Path]]:
    return lambda _tmp: sorted((REPO / "fixtures" / "data" / name).iterdir())


def _synthetic_kineto(gzip: bool) -> Callable[[Path], list[Path]]:
    def make(tmp: Path) -> list[Path]:
        from fixtures.synthetic import SyntheticSpec, generate

        generate(SyntheticSpec(world_size=3, steps=4, seed=7), tmp, gzip=gzip)
        return sorted(p for p in tmp.iterdir() if ".pt.trace.json" in p.name)
    return make


def _synthetic_nsys(tmp: Path) -> list[Path]:
    from fixtures.nsys_synthetic import write_export

    path = tmp / "report.sqlite"
    write_export(path, ranks=2, steps=3)
    return [path]


def _corpus(*relative: str) -> Callable[[Path], list[Path]]:
    def find(_tmp: Path) -> list[Path]:
        paths = [CORPUS / r for r in relative]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            pytest.skip(absent(missing[0]))
        return paths
    return find


_HTA = "hta-tests-data/tests/data/"
CASES: dict[str, Callable[[Path], list[Path]]] = {
    "gloo_ddp_2r": _fixture_dir("gloo_ddp_2r"),
    "gloo_ddp_2r_slow1": _fixture_dir("gloo_ddp_2r_slow1"),
    "synthetic_kineto_3r_gz": _synthetic_kineto(gzip=True),
    "synthetic_kineto_3r_json": _synthetic_kineto(gzip=False),
    "synthetic_nsys_2r": _synthetic_nsys,
    "corpus_sampled_pair": _corpus(_HTA + "trace_filter/sampled_rank-0.json.gz",
                                   _HTA + "trace_filter/sampled_rank-1.json.gz"),
    "corpus_ns_resolution": _corpus(
        _HTA + "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"),
    "corpus_amd_mi250": _corpus(_HTA + "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    "corpus_bare_array": _corpus(
        "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"),
    "corpus_backward_thread_plain": _corpus(_HTA + "call_stack/backward_thread.json"),
    "corpus_cpu_only_full": _corpus(
        "hta-tests-data/_history/b8cce2cd9cbb/tests/data/cpu_only/"
        "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
}


def _load_golden() -> dict[str, object]:
    return orjson.loads(GOLDEN.read_bytes()) if GOLDEN.is_file() else {}


def _diff(expected: dict, actual: dict) -> list[str]:
    out = []
    for table in ("events", "ranks", "files"):
        e, a = expected.get(table, {}), actual[table]
        if e.get("rows") != a["rows"]:
            out.append(f"{table}: rows {e.get('rows')} -> {a['rows']}")
        if e.get("dtypes") != a["dtypes"]:
            out.append(f"{table}: dtypes/columns changed {e.get('dtypes')} -> {a['dtypes']}")
        changed = sorted(c for c in set(e.get("columns", {})) | set(a["columns"])
                         if e.get("columns", {}).get(c) != a["columns"].get(c))
        if changed:
            out.append(f"{table}: columns whose values changed: {', '.join(changed)}")
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_store_matches_golden_digest(case: str, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    paths = CASES[case](inputs)
    actual = store_digest(paths, tmp_path / "cache")
    golden = _load_golden()
    if REGEN:
        golden[case] = actual
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_bytes(orjson.dumps(dict(sorted(golden.items())),
                                        option=orjson.OPT_INDENT_2) + b"\n")
        return
    assert case in golden, (f"no golden digest for {case!r}; run "
                            f"TRACEVIEW_REGEN_GOLDEN=1 pytest {Path(__file__).name}")
    differences = _diff(golden[case], actual)  # type: ignore[arg-type]
    assert not differences, (f"stored tables of {case!r} differ from the golden digest:\n  "
                             + "\n  ".join(differences))
    assert actual == golden[case]


def test_reopen_from_cache_is_identical(tmp_path: Path) -> None:
    """A second open (served from the Parquet cache) stores exactly what the cold ingest did."""
    paths = _fixture_dir("gloo_ddp_2r")(tmp_path)
    cold = store_digest(paths, tmp_path / "cache")
    warm = store_digest(paths, tmp_path / "cache")
    assert warm == cold


def test_digest_sees_one_changed_value_and_ignores_row_order() -> None:
    """The instrument itself: row order does not matter, a single changed value does."""
    from traceview.schema import events_frame

    rows = [{"rank": 0, "kind": "kernel", "name": f"k{i}", "ts_ns": 1000 * i, "dur_ns": 500,
             "source": "kineto", "file_id": 0} for i in range(5)]
    base = events_frame(rows)
    assert table_digest(base) == table_digest(base.reverse())
    changed = events_frame([*rows[:4], {**rows[4], "dur_ns": 501}])
    d0, d1 = table_digest(base), table_digest(changed)
    assert d0["all"] != d1["all"]
    assert [c for c in d0["columns"] if d0["columns"][c] != d1["columns"][c]] == ["dur_ns"]
    nulled = events_frame([*rows[:4], {**rows[4], "dur_ns": None}])
    assert table_digest(nulled)["columns"]["dur_ns"] != d0["columns"]["dur_ns"]
