"""The performance harness: build large inputs, measure traceview against the decode limits and
HTA 0.5.0 in one run, and regenerate the tables of ``docs/performance.md``.

    python benchmarks/run.py                       # full scale (see benchmarks/README.md)
    python benchmarks/run.py --scale 0.1           # quick smoke run
    python benchmarks/run.py --only decode,hta     # some parts only
    python benchmarks/run.py --hta-python /work/hta-venv/bin/python   # reuse an HTA venv

Parts: decode (single rank: read, orjson, msgspec, cold ingest), gzip, ingest (multi-rank cold
and reopen), scaling (1 vs N workers), analyses, bounded (memory vs ranks), nsys, hta.
Every measured operation runs in its own child process (benchmarks/ops.py). Results go to
``benchmarks/out/results-<scale>.json`` and, unless ``--no-docs``, into the generated block
of ``docs/performance.md`` (the hand-written sections around it are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(REPO)):
    if p not in sys.path:
        sys.path.insert(0, p)

import hta  # noqa: E402
import inputs  # noqa: E402
import machine  # noqa: E402
import report  # noqa: E402
from measure import measure, measure_command, run_child  # noqa: E402

PARTS = ("decode", "gzip", "ingest", "scaling", "analyses", "first_answer", "bounded", "nsys",
         "small", "report", "hta")
#: File counts of the many-small-files part (issue 23, item 2); not scaled by --scale.
SMALL_COUNTS = (500, 1000, 2000, 5000)
SUITE = ("align", "collectives", "stragglers", "gaps", "overlap", "breakdown", "summary")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def best(name: str, repeat: int, **kwargs: Any) -> dict[str, Any]:
    """Run an operation ``repeat`` times: the fastest run, with the largest peak RSS seen."""
    return fastest([measure(name, **kwargs) for _ in range(max(1, repeat))])


def alternating(repeat: int, sides: dict[str, dict[str, Any]],
                operation: str = "ingest") -> dict[str, dict[str, Any]]:
    """Runs of several configurations (name -> ``measure`` arguments, ``op`` naming the
    operation when it is not ``operation``), one of each per round for ``repeat`` rounds, in
    the order given: the fastest of each."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for _ in range(max(1, repeat)):
        for name, kwargs in sides.items():
            args = dict(kwargs)
            op = args.pop("op", operation)
            runs[name].append(measure_command(**args) if op == "command" else
                              measure(op, **args))
    return {name: fastest(r) for name, r in runs.items()}


def fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of ``runs`` of one operation, with the largest peak RSS seen."""
    ok = [r for r in runs if not r.get("error")] or runs
    out = dict(min(ok, key=lambda r: r.get("wall_s") or float("inf")))
    out["peak_rss_mb"] = max(r.get("peak_rss_mb", 0) for r in runs)
    out["tree_rss_mb"] = max(r.get("tree_rss_mb", 0) for r in runs)
    out["runs_s"] = [r.get("wall_s") for r in runs]
    return out


def _whole_commands(paths: list[str], store: Path) -> dict[str, dict[str, Any]]:
    """The two forms users type, each a whole command in a fresh process (issue 25: imports
    and the printed report included): ``traceview ingest PATHS --no-cache`` and ``... -o
    DIR``, as ``alternating`` sides."""
    return {"no_cache": dict(op="command", argv=["ingest", *paths, "--no-cache"]),
            "store": dict(op="command", argv=["ingest", *paths, "--no-cache", "-o", str(store)],
                          remove=[str(store)])}


def _paths(s: inputs.InputSet) -> list[str]:
    return [str(p) for p in s.paths]


def _input_row(s: inputs.InputSet) -> dict[str, Any]:
    return {"name": s.name, "ranks": s.ranks, "disk_mb": s.disk_bytes / 1e6,
            "json_mb": s.json_bytes / 1e6, "largest_mb": s.largest_json_bytes / 1e6,
            "events": s.events, **({"mix": s.mix} if s.mix else {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0,
                    help="input sizes relative to the issue's (1 = 300 MB, 8x100 MB, 64x10 MB)")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--repeat", type=int, default=1, help="runs per timing (fastest is kept)")
    ap.add_argument("--hta-venv", type=Path, default=None,
                    help="where the HTA environment lives or is created (default OUT/hta-venv)")
    ap.add_argument("--hta-python", default=None, help="use this interpreter for HTA instead")
    ap.add_argument("--small-counts", default=",".join(map(str, SMALL_COUNTS)),
                    help="file counts of the many-small-files part")
    ap.add_argument("--small-events", default="full,40",
                    help="events per file of the many-small-files part: 'full' (the gloo "
                         "template's 1,039) or a count (a rank file of a few KB)")
    ap.add_argument("--no-real", action="store_true",
                    help="leave out the real-derived sets (built from the corpus when present)")
    ap.add_argument("--analysis-sets", default="single,r8,r64,real,real_r8",
                    help="input sets the analysis suite runs on (r8 is the target's)")
    ap.add_argument("--hta-sets", default="single,r8,r64",
                    help="input sets HTA runs on (also real, real_nccl: the real-derived "
                         "single-rank traces, whose ingest bars then include HTA)")
    ap.add_argument("--real-extra", default="",
                    help="more real-derived single-rank traces for the decode part: a comma "
                         f"list of {', '.join(inputs.EXTRA_REAL_SOURCES)}, or 'all' (each "
                         "corpus GPU trace replicated to 250 MB, with the ingest bar)")
    ap.add_argument("--real-layout", choices=("torch", "compact"), default="torch",
                    help="how the real-derived sets are written: as Kineto's writer lays "
                         "them out (default, ~6 indented lines an event) or compact")
    ap.add_argument("--docs", type=Path, default=REPO / "docs" / "performance.md")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/performance.md")
    ap.add_argument("--from-results", type=Path, default=None, metavar="JSON",
                    help="only render a saved results file (e.g. of an interrupted run)")
    args = ap.parse_args(argv)
    if args.from_results:
        return _emit(json.loads(args.from_results.read_text()), args)
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    extra = (list(inputs.EXTRA_REAL_SOURCES) if args.real_extra.strip() == "all" else
             [k.strip() for k in args.real_extra.split(",") if k.strip()])
    if unknown_sources := sorted(set(extra) - set(inputs.EXTRA_REAL_SOURCES)):
        ap.error(f"--real-extra: unknown source(s) {', '.join(unknown_sources)} "
                 f"(one of {', '.join(inputs.EXTRA_REAL_SOURCES)})")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    s = args.scale
    root = args.out / "inputs"
    caches = args.out / "cache"
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    out_json = args.out / f"results-scale{s:g}.json"

    def checkpoint(part: str) -> None:
        """Save what was measured so far: an interrupted run can still be rendered."""
        res["total_s"] = time.perf_counter() - started
        res["load_end"] = machine.load_average()
        res["completed_parts"] = [*res.get("completed_parts", []), part]
        out_json.write_text(json.dumps(res, indent=1, default=str))

    res: dict[str, Any] = {
        "scale": s, "parts": parts, "repeat": args.repeat,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_start": machine.load_average(), "machine": machine.describe(), "inputs": {},
        "commit": machine.git_state(str(REPO)),
    }
    log(f"scale {s}, parts {parts}, load average {res['load_start']}")

    # ---- inputs (generated once, reused) ----
    single = inputs.kineto_set(root, ranks=1, mb_per_rank=round(300 * s, 1), gzip_files=False, log=log)
    sets = {"single": single}
    if {"gzip"} & set(parts):
        sets["single_gz"] = inputs.gzipped_copy(single, root, log=log)
    if {"ingest", "scaling", "analyses", "first_answer", "hta"} & set(parts):
        sets["r8"] = inputs.kineto_set(root, ranks=8, mb_per_rank=round(100 * s, 1),
                                       gzip_files=False, log=log)
    if {"ingest", "analyses", "first_answer", "bounded", "hta"} & set(parts):
        sets["r64"] = inputs.kineto_set(root, ranks=64, mb_per_rank=round(10 * s, 2),
                                        gzip_files=True, log=log)
    # real-derived sets (issue 23): corpus GPU traces replicated to the synthetic sets' sizes;
    # absent corpus -> skipped, and every table shows only what was built
    hta_sets = [k.strip() for k in args.hta_sets.split(",") if k.strip()] if "hta" in parts else []
    if not args.no_real and ({"decode", "ingest", "analyses", "first_answer"} & set(parts)
                             or "real" in hta_sets):
        real = inputs.real_set(root, "single", ranks=1, mb_per_rank=round(250 * s, 1),
                               log=log, layout=args.real_layout)
        if real is not None:
            sets["real"] = real
    if not args.no_real and ("decode" in parts or "real_nccl" in hta_sets):
        # a second event mix (HTA's NCCL rank 0: 38 % flows), so that no bar rests on one
        nccl = inputs.real_set(root, "ranks", ranks=1, mb_per_rank=round(250 * s, 1),
                               log=log, layout=args.real_layout)
        if nccl is not None:
            sets["real_nccl"] = nccl
    for key in extra if not args.no_real and "decode" in parts else []:
        made = inputs.real_set(root, key, ranks=1, mb_per_rank=round(250 * s, 1),
                               log=log, layout=args.real_layout)
        if made is not None:
            sets[f"real_{key}"] = made
    if not args.no_real and {"ingest", "analyses", "first_answer"} & set(parts):
        real_r8 = inputs.real_set(root, "ranks", ranks=8, mb_per_rank=round(100 * s, 1),
                                  log=log, layout=args.real_layout)
        if real_r8 is not None:
            sets["real_r8"] = real_r8
    if "nsys" in parts:
        sets["nsys"] = inputs.nsys_set(root, kernels=max(100_000, int(2_000_000 * s)), log=log)
    res["inputs"] = {k: _input_row(v) for k, v in sets.items()}
    res["generate_s"] = time.perf_counter() - started

    res["baseline"] = measure("baseline")
    log(f"baseline (interpreter + imports) peak RSS {res['baseline']['peak_rss_mb']:.0f} MB")

    def cache_of(name: str) -> str:
        return str(caches / name)

    if "decode" in parts:
        p = _paths(single)
        d: dict[str, Any] = {}
        for name in ("read", "orjson", "msgspec"):
            d[name] = best(name, args.repeat, paths=p)
            log(f"decode {name}: {d[name].get('wall_s')}")
        d["ingest"] = best("ingest", args.repeat, paths=p, cache_dir=cache_of("single"))
        log(f"decode ingest: {d['ingest'].get('wall_s')}")
        # the two forms users type: `ingest FILE --no-cache` and `... --no-cache -o DIR`,
        # alternating round by round (the store write must cost what the ingest costs), and
        # the first on the pure-Python path (what users without a compiler or wheel get)
        forms = alternating(args.repeat, {
            **_whole_commands(p, args.out / "store-single"),
            "pure": dict(paths=p, cache_dir=cache_of("single-nc"), no_cache=True,
                         pure_python=True)})
        d["ingest_no_cache"], d["ingest_store"] = forms["no_cache"], forms["store"]
        d["ingest_pure"] = forms["pure"]
        log(f"decode ingest --no-cache: {d['ingest_no_cache'].get('wall_s')}, "
            f"-o: {d['ingest_store'].get('wall_s')}, pure: {d['ingest_pure'].get('wall_s')}")
        d["reopen"] = best("reopen", args.repeat, paths=p, cache_dir=cache_of("single"))
        res["decode"] = d
        # the same operations on each real-derived trace, side by side (report.real_singles)
        for key in [k for k in (*report.REAL_SINGLES, *(f"real_{e}" for e in extra))
                    if k in sets]:
            p = _paths(sets[key])
            r = res[f"decode_{key}"] = {name: best(name, args.repeat, paths=p) for name in
                                        ("read", "orjson")}
            r["ingest"] = best("ingest", args.repeat, paths=p, cache_dir=cache_of(key))
            # the two forms users type, as above, alternating with the limit itself: a slow
            # spell of the shared machine weighs on the bar's both sides alike
            real_forms = alternating(args.repeat, {
                "msgspec": dict(op="msgspec", paths=p),
                **_whole_commands(p, args.out / f"store-{key}")})
            r["msgspec"] = real_forms["msgspec"]
            r["ingest_no_cache"] = real_forms["no_cache"]
            r["ingest_store"] = real_forms["store"]
            r["reopen"] = best("reopen", args.repeat, paths=p, cache_dir=cache_of(key))
            log(f"decode {key}: ingest {r['ingest'].get('wall_s')}, --no-cache "
                f"{r['ingest_no_cache'].get('wall_s')}, -o {r['ingest_store'].get('wall_s')}, "
                f"msgspec {r['msgspec'].get('wall_s')}")
        checkpoint("decode")

    if "gzip" in parts:
        gz = sets["single_gz"]
        p = _paths(gz)
        res["gzip"] = {
            "inflate_isal": best("read", args.repeat, paths=p, inflater="isal"),
            "inflate_zlib": best("read", args.repeat, paths=p, inflater="zlib"),
            "ingest": best("ingest", args.repeat, paths=p, cache_dir=cache_of("single_gz")),
        }
        log(f"gzip ingest: {res['gzip']['ingest'].get('wall_s')}")
        checkpoint("gzip")

    if "ingest" in parts:
        res["ingest"] = {}
        for key in [k for k in ("r8", "r64", "real", "real_r8") if k in sets]:
            p = _paths(sets[key])
            cold = best("ingest", args.repeat, paths=p, cache_dir=cache_of(key))
            warm = best("reopen", args.repeat, paths=p, cache_dir=cache_of(key))
            res["ingest"][key] = {"cold": cold, "reopen": warm}
            log(f"ingest {key}: cold {cold.get('wall_s')} reopen {warm.get('wall_s')}")
        checkpoint("ingest")

    if "scaling" in parts:
        p = _paths(sets["r8"])
        # Each comparison alternates its two sides, round by round (see "Suite against
        # ingest" in docs/performance.md: the machine's speed drifts within minutes).
        res["scaling"] = alternating(args.repeat, {
            str(w): dict(paths=p, workers=w, cache_dir=cache_of(f"r8-w{w}")) for w in (1, 2)})
        # The default ingest as a 1-core and a 2-core machine run it (the child pinned to
        # that many cores): how the whole ingest, threads and workers, scales with the cores.
        cores = len(os.sched_getaffinity(0))
        res["scaling_cores"] = alternating(args.repeat, {
            str(c): dict(paths=p, cores=c, cache_dir=cache_of(f"r8-c{c}"))
            for c in sorted({1, cores})})
        log(f"scaling: { {k: v.get('wall_s') for k, v in res['scaling'].items()} }, cores: "
            f"{ {k: v.get('wall_s') for k, v in res['scaling_cores'].items()} }")
        checkpoint("scaling")

    if "analyses" in parts:
        res["analyses"] = {}
        for key in [k.strip() for k in args.analysis_sets.split(",") if k.strip()]:
            if key not in sets:  # a real-derived set without its corpus
                continue
            p = _paths(sets[key])
            cache = cache_of(key)
            if not (Path(cache).is_dir() and any(Path(cache).rglob("*.parquet"))):
                res["analyses"].setdefault("_ingest", {})[key] = measure(
                    "ingest", paths=p, cache_dir=cache)
            # The suite is compared with its cold ingest: both are measured in the same rounds
            # (ingest, then each command, repeated), so a slow spell of the shared machine
            # weighs on both sides alike, not on whichever part it happened to fall in.
            rounds = alternating(args.repeat, {
                "_ingest": dict(paths=p, cache_dir=cache_of(f"{key}-paired")),
                **{c: dict(op="analysis", paths=p, cache_dir=cache, command=c) for c in SUITE}})
            res["analyses"].setdefault("_paired_ingest", {})[key] = rounds.pop("_ingest")
            res["analyses"][key] = rounds
            log(f"analyses {key}: "
                f"{ {c: round(v.get('wall_s') or -1, 2) for c, v in res['analyses'][key].items()} }")
            checkpoint(f"analyses:{key}")

    if "first_answer" in parts:
        # time to first answer: a cold `summary` (ingest included) against the cold ingest
        # alone, alternating round by round
        res["first_answer"] = {}
        for key in [k for k in ("r8", "r64", "real_r8") if k in sets]:
            p = _paths(sets[key])
            res["first_answer"][key] = alternating(args.repeat, {
                "ingest": dict(paths=p, cache_dir=cache_of(f"{key}-first")),
                "summary": dict(op="first_answer", paths=p, cache_dir=cache_of(f"{key}-first"),
                                command="summary")})
            log(f"first answer {key}: "
                f"{ {k: v.get('wall_s') for k, v in res['first_answer'][key].items()} }")
            checkpoint(f"first_answer:{key}")

    if "bounded" in parts:
        full = sets["r64"]
        # ingest.worker_count budgets 3x the estimated inflated size (15x a .gz file) per worker:
        # this budget admits exactly one worker, whatever the number of ranks.
        largest_disk = max(p.stat().st_size for p in full.paths)
        budget_mb = 1.5 * 3 * 15 * largest_disk / 2**20
        res["bounded"] = {"memory_budget_mb": budget_mb, "rows": []}
        for n in (8, 32, 64):
            sub = full.subset(n)
            p = _paths(sub)
            cache = cache_of(f"bounded-{n}")
            row = {"ranks": n, "json_mb": sub.json_bytes / 1e6,
                   "ingest": measure("ingest", paths=p, cache_dir=cache,
                                     memory_budget_mb=budget_mb)}
            row["lazy_scan"] = measure("lazy_scan", paths=p, cache_dir=cache)
            row["summary"] = measure("analysis", paths=p, cache_dir=cache, command="summary")
            res["bounded"]["rows"].append(row)
            log(f"bounded {n}: ingest tree {row['ingest'].get('tree_rss_mb'):.0f} MB, "
                f"summary {row['summary'].get('peak_rss_mb'):.0f} MB")
            checkpoint(f"bounded:{n}")

    if "nsys" in parts:
        res["nsys"] = best("nsys", args.repeat, paths=_paths(sets["nsys"]),
                           cache_dir=cache_of("nsys"))
        log(f"nsys: {res['nsys'].get('wall_s')} s, {res['nsys'].get('kernels')} kernels")
        checkpoint("nsys")

    if "small" in parts:
        # many small files (issue 23, item 2): a run folder of N small rank files, `stragglers`
        # cold (ingest included, empty cache) and again from the cache; time per file should
        # stay flat in N, and so should the peak RSS of the largest process
        res["small"] = []
        sizes = [None if e.strip() == "full" else int(e)
                 for e in args.small_events.split(",") if e.strip()]
        for n, events in [(int(c), e) for e in sizes
                          for c in args.small_counts.split(",") if c.strip()]:
            folder = inputs.many_small_set(root, n, log=log, events=events)
            p = [str(folder.paths[0].parent)]
            cache = cache_of(folder.paths[0].parent.name)
            row = {"files": n, "events_per_file": folder.events // n,
                   "disk_mb": folder.disk_bytes / 1e6,
                   "json_mb": folder.json_bytes / 1e6, "events": folder.events,
                   "cold": measure("first_answer", paths=p, cache_dir=cache,
                                   command="stragglers"),
                   "warm": measure("analysis", paths=p, cache_dir=cache,
                                   command="stragglers"),
                   "load": machine.load_average()}
            shutil.rmtree(cache, ignore_errors=True)
            res["small"].append(row)
            log(f"small {n}: cold {row['cold'].get('wall_s')} s / {row['cold'].get('cpu_s')} "
                f"CPU s, warm {row['warm'].get('wall_s')} s, error "
                f"{row['cold'].get('error') or row['warm'].get('error')}")
            checkpoint(f"small:{n}")

    if "report" in parts:
        # the report at cluster scale (issue 11's bounds): benchmarks/report_scale.py, whose
        # inputs do not scale with --scale (the bounds are for these sizes)
        import report_scale

        if report_scale.chromium() is None:
            res["report"] = {"error": "headless Chromium is not installed"}
        else:
            res["report"] = [report_scale.measure(args.out / "report_scale", shape, args.repeat)
                             for shape in report_scale.SHAPES]
        log(f"report: {res['report']}")
        checkpoint("report")

    if "hta" in parts:
        res["hta"] = {}
        try:
            exe = hta.ensure_venv(args.hta_venv or args.out / "hta-venv", args.hta_python, log=log)
            res["hta"]["versions"] = hta.versions(exe)
            for key in hta_sets:
                folder = hta.trace_dir_for(sets[key].paths, args.out)
                res["hta"][key] = run_child(hta.command(exe, folder), parse=hta.parse_output)
                shutil.rmtree(folder, ignore_errors=True)
                log(f"hta {key}: load {res['hta'][key].get('load_s')} "
                    f"error {res['hta'][key].get('error')}")
                checkpoint(f"hta:{key}")
        except Exception as exc:  # noqa: BLE001 - recorded: HTA failing is a result too
            res["hta"]["error"] = f"{type(exc).__name__}: {exc}"
            log(f"hta: {res['hta']['error']}")

    checkpoint("done")
    log(f"results in {out_json} ({res['total_s']:.0f} s, load average {res['load_end']})")
    return _emit(res, args)


def _emit(res: dict[str, Any], args: argparse.Namespace) -> int:
    text = report.render(res)
    if not args.no_docs:
        report.update_doc(args.docs, text)
        log(f"updated {args.docs}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
