"""Every analysis command's answer on the fixtures, saved, then compared byte for byte.

For a refactor that must not change behaviour (issue 46's run.py split): ``save`` runs every
command of the table of analyses (``traceview.run.registry``, so a new one is covered), with
and without a few options, on multi-rank CPU runs, a GPU trace, a pipeline, an all-to-all, a
moving stall and a CPU memory trace, ``--json`` and text, and writes one file per command line
(exit code, stdout, stderr); ``compare`` lists every file that differs (exit 1 on any). Kept
answers are off (``TRACEVIEW_ANSWERS=off``) and each save reads through a fresh cache folder.

    python benchmarks/answers_unchanged.py save /tmp/before      # on the old revision
    python benchmarks/answers_unchanged.py save /tmp/after       # on the new one
    python benchmarks/answers_unchanged.py compare /tmp/before /tmp/after

About 40 s on 2 cores (~320 command lines, in this process: imports are shared).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = Path("fixtures") / "data"  # relative, from the checkout: two checkouts' answers compare
INPUTS = {
    "ddp2": FIX / "gloo_ddp_2r_slow1",
    "tpdp": FIX / "gloo_tp_dp_4r_slow2",
    "gpu": FIX / "gpu_real",
    "pipe": FIX / "scenarios" / "pipeline_compute_s2",
    "a2a": FIX / "scenarios" / "a2a_routing_r1",
    "rot": FIX / "replay" / "ddp1b_rotating",
    "mem": FIX / "cpu_memory",
}
#: Options beside the defaults (an empty window included: its usage error is an answer too).
EXTRA = [("gaps", ["--per-stream", "--top", "3"]), ("overlap", ["--per-step"]),
         ("breakdown", ["--top", "2"]), ("summary", ["--steps", "2:4"]),
         ("whatif", ["--scenario", "ranks=all:typical", "--scenario", "comm=x2"]),
         ("pipeline", ["--timeline"]), ("ops", ["--by", "name"]),
         ("stragglers", ["--skip-warmup", "1"]), ("critical-path", ["--top", "3"])]


def save(out: Path) -> int:
    os.environ["TRACEVIEW_ANSWERS"] = "off"
    out = out.resolve()
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    from traceview import cli
    from traceview.run.run import ANALYSES  # a revision before the registry: the same names

    out.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="answers-unchanged-")
    lines = [*((name.replace("_", "-"), []) for name in ANALYSES), *EXTRA]
    for key, path in INPUTS.items():
        for command, extra in lines:
            for mode in (["--json"], []):
                argv = [command, str(path), *extra, *mode, "--cache-dir", cache]
                stdout, stderr = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    try:
                        code = cli.main(argv)
                    except SystemExit as exc:
                        code = exc.code
                name = "_".join([key, command, *extra, *mode])
                for bad in "/=:":
                    name = name.replace(bad, "-")
                (out / name).write_text(f"exit {code}\n{stdout.getvalue()}\n--stderr--\n"
                                        f"{stderr.getvalue().replace(cache, 'CACHE')}")
        print(key, flush=True)
    return 0


def compare(before: Path, after: Path) -> int:
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    differ = [n for n in names if not (before / n).exists() or not (after / n).exists()
              or (before / n).read_bytes() != (after / n).read_bytes()]
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(names) - len(differ)} of {len(names)} command lines identical")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("save").add_argument("out", type=Path)
    both = sub.add_parser("compare")
    both.add_argument("before", type=Path)
    both.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    return save(args.out) if args.what == "save" else compare(args.before, args.after)


if __name__ == "__main__":
    raise SystemExit(main())
