"""Save, then compare, the ``--json`` output of the analysis suite on a set of inputs.

The suite's ``--json`` outputs are contracts: a change made for speed must leave them identical.
``save`` runs every suite command (with and without window options) on every input and writes
one file per run (stdout, stderr's last line, exit code); ``compare`` checks two such folders
value by value (floats exactly, no tolerance) and lists every difference.

    python benchmarks/suite_outputs.py prepare                # generated inputs under /tmp
    python benchmarks/suite_outputs.py save OUT --cache-dir DIR [--big PATH]
    python benchmarks/suite_outputs.py compare BEFORE AFTER   # exit 1 on any difference

The runs call ``traceview.cli.main`` in this process (imports are shared, outputs are not).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the fixtures package lives at the repository root
from fixtures.corpus import corpus_dir  # noqa: E402

CORPUS = corpus_dir()  # $TRACEVIEW_CORPUS, else ../shared/corpus
HTA = CORPUS / "hta-tests-data" / "tests" / "data"
GENERATED = Path("/tmp/suite-outputs-inputs")

SUITE = ("align", "collectives", "stragglers", "gaps", "overlap", "breakdown", "summary")
GPU = ("gaps", "overlap", "breakdown", "summary")
DIST = ("align", "collectives", "stragglers")


def inputs(big: str | None) -> dict[str, list[str]]:
    """Named inputs: the fixtures, generated sets, corpus oddities, and the big set if given."""
    named = {
        "gloo_ddp_2r": [str(ROOT / "fixtures/data/gloo_ddp_2r")],
        "gloo_ddp_2r_slow1": [str(ROOT / "fixtures/data/gloo_ddp_2r_slow1")],
        "syn4": [str(GENERATED / "syn4")],
        "syn3_shifted": [str(GENERATED / "syn3_shifted")],
        "nsys_synthetic": [str(GENERATED / "nsys" / "export.sqlite")],
        "sampled_pair": [str(HTA / "trace_filter/sampled_rank-0.json.gz"),
                         str(HTA / "trace_filter/sampled_rank-1.json.gz")],
        "rank_non_gpu": [str(HTA / "rank_non_gpu/rank_non_gpu.json.gz")],
        "nccl_rank0_of_16": [str(HTA / "negative_queue_length_values_check/rank0.json.gz")],
        "gpu_user_annotation": [str(HTA / "with_gpu_user_annotation/"
                                    "step_based_trace_2543932.json.gz")],
        "amd_mi250": [str(HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")],
        "no_steps_autograd": [str(CORPUS / "kineto/tb_plugin/samples/"
                                  "resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz")],
        "nsys_cloverleaf": [str(CORPUS / "pipit-nsys-sqlite/pipit/tests/data/cloverleaf-nsys/"
                                "perlmutter-cloverleaf-cuda.sqlite")],
    }
    if big:
        named["big"] = [big]
    return named


#: Window and per-command options exercised on some inputs (name -> extra argv).
VARIANTS: dict[str, list[str]] = {
    "plain": [],
    "steps": ["--steps", "2:4"],
    "warmup": ["--skip-warmup", "1"],
    "ranks": ["--ranks", "0,2-3"],
    "time": ["--time", "1ms:40ms"],
    "per_step": ["--per-step"],
    "per_stream": ["--per-stream"],
}
#: Which variants run for which commands (a variant a command lacks is skipped).
VARIANT_COMMANDS: dict[str, tuple[str, ...]] = {
    "plain": SUITE, "steps": SUITE, "warmup": SUITE, "ranks": SUITE, "time": GPU,
    "per_step": ("overlap",), "per_stream": ("gaps",),
}
#: Inputs on which every variant runs (the others run ``plain`` only).
ALL_VARIANTS_ON = ("syn4", "gloo_ddp_2r_slow1", "nsys_synthetic", "big")


def runs(named: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    out = []
    for name, paths in named.items():
        variants = VARIANTS if name in ALL_VARIANTS_ON else {"plain": []}
        for vname, extra in variants.items():
            for cmd in VARIANT_COMMANDS[vname]:
                out.append((f"{name}__{cmd}__{vname}", [cmd, *paths, *extra, "--json"]))
    return out


def prepare() -> None:
    """Write the generated inputs (deterministic: same bytes every time)."""
    from fixtures import clock_shift, nsys_synthetic, synthetic

    synthetic.main(["--out", str(GENERATED / "syn4"), "--world-size", "4", "--steps", "5",
                    "--seed", "0"])
    synthetic.main(["--out", str(GENERATED / "syn3"), "--world-size", "3", "--steps", "6",
                    "--seed", "3", "--slow-rank", "2"])
    clock_shift.inject_clock_offsets(GENERATED / "syn3", GENERATED / "syn3_shifted",
                                     {1: 2_500_000_123, 2: -1_750_000_077})
    (GENERATED / "nsys").mkdir(parents=True, exist_ok=True)
    target = GENERATED / "nsys" / "export.sqlite"
    target.unlink(missing_ok=True)
    nsys_synthetic.write_export(target, ranks=4, steps=5)


def save(out: Path, cache_dir: str, big: str | None, only: str | None) -> None:
    from traceview.cli import main

    out.mkdir(parents=True, exist_ok=True)
    for key, argv in runs(inputs(big)):
        if only and only not in key:
            continue
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            rc = main([*argv, "--cache-dir", cache_dir])
        text = stdout.getvalue()
        try:
            body: Any = json.loads(text) if text.strip() else None
        except json.JSONDecodeError:
            body = text
        err = stderr.getvalue().strip().splitlines()
        record = {"argv": argv, "rc": rc, "stdout": body, "stderr_last": err[-1] if err else ""}
        (out / f"{key}.json").write_text(json.dumps(record, indent=1, sort_keys=False))
        print(f"{key}: rc={rc}", file=sys.stderr)


def _diff(a: Any, b: Any, where: str, out: list[str]) -> None:
    if type(a) is not type(b):
        out.append(f"{where}: {a!r} != {b!r} (type)")
    elif isinstance(a, dict):
        # Fields may be added (the contracts say so), never renamed, dropped or reordered.
        kept = [k for k in b if k in a]
        if list(a) != kept:
            out.append(f"{where}: keys {list(a)} != {kept}")
        for k in a.keys() & b.keys():
            _diff(a[k], b[k], f"{where}.{k}", out)
    elif isinstance(a, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} items != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out)
    elif a != b:
        out.append(f"{where}: {a!r} != {b!r}")


def compare(before: Path, after: Path, only: str | None = None) -> int:
    names_a = {p.name for p in before.glob("*.json") if not only or only in p.name}
    names_b = {p.name for p in after.glob("*.json") if not only or only in p.name}
    problems = [f"only in {before}: {n}" for n in sorted(names_a - names_b)]
    problems += [f"only in {after}: {n}" for n in sorted(names_b - names_a)]
    for name in sorted(names_a & names_b):
        diffs: list[str] = []
        _diff(json.loads((before / name).read_text()), json.loads((after / name).read_text()),
              name[:-5], diffs)
        problems += diffs
    print(f"compared {len(names_a & names_b)} runs: "
          f"{'identical' if not problems else f'{len(problems)} differences'}")
    for p in problems[:200]:
        print(p)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare")
    s = sub.add_parser("save")
    s.add_argument("out", type=Path)
    s.add_argument("--cache-dir", required=True)
    s.add_argument("--big", help="a large input (e.g. the 8-rank benchmark set)")
    s.add_argument("--only", help="only runs whose key contains this text")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--only", help="only runs whose key contains this text")
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare()
        return 0
    if args.cmd == "save":
        save(args.out, args.cache_dir, args.big, args.only)
        return 0
    return compare(args.before, args.after, args.only)


if __name__ == "__main__":
    sys.exit(main())
