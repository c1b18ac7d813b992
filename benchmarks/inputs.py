"""Large realistic inputs, generated once and reused (under ``benchmarks/out/inputs``).

Kineto sets come from ``python -m fixtures.synthetic`` (seed 0, deterministic); the nsys export
from ``fixtures.nsys_synthetic.write_bulk``. A set is reused when its ``manifest.json`` exists
(written last), so an interrupted generation is redone. Sizes scale with ``--scale``.
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # as benchmarks.inputs (the tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_layout  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class InputSet:
    name: str
    paths: list[Path]
    disk_bytes: int
    json_bytes: int  # uncompressed (the JSON text, or the SQLite file)
    largest_json_bytes: int
    events: int | None
    mix: dict | None = None  # real-derived sets: event mix and layout (``real_set``)

    @property
    def ranks(self) -> int:
        return len(self.paths)

    def subset(self, n: int) -> InputSet:
        frac = n / len(self.paths)
        return InputSet(f"{self.name}[:{n}]", self.paths[:n], round(self.disk_bytes * frac),
                        round(self.json_bytes * frac), self.largest_json_bytes,
                        None if self.events is None else round(self.events * frac), self.mix)


def _manifest(folder: Path) -> dict | None:
    path = folder / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _load(name: str, folder: Path, m: dict) -> InputSet:
    return InputSet(name, [folder / f for f in m["files"]], m["disk_bytes"], m["json_bytes"],
                    m["largest_json_bytes"], m.get("events"), m.get("mix"))


def _uncompressed(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    from isal import igzip

    with igzip.open(path, "rb") as fh:
        return sum(len(b) for b in iter(lambda: fh.read(1 << 24), b""))


def _write_manifest(folder: Path, files: list[Path], events: int | None) -> dict:
    sizes = [_uncompressed(p) for p in files]
    m = {"files": [p.name for p in files], "disk_bytes": sum(p.stat().st_size for p in files),
         "json_bytes": sum(sizes), "largest_json_bytes": max(sizes), "events": events}
    (folder / "manifest.json").write_text(json.dumps(m, indent=1))
    return m


#: Compute kernels per profiler step. Real large traces hold a few to a few hundred steps of
#: thousands of kernels; the generator's default (12) would give a 300 MB trace ~13,000 steps,
#: which no real trace has and which makes HTA's per-event step lookup (O(steps) per event,
#: hta/common/trace.py ``_get_profiler_step``) quadratic. 4000 gives ~70 steps in 300 MB.
KERNELS_PER_STEP = 4000


def kineto_set(root: Path, *, ranks: int, mb_per_rank: float, gzip_files: bool,
               kernels_per_step: int = KERNELS_PER_STEP, log=print) -> InputSet:
    """``ranks`` synthetic Kineto traces of ~``mb_per_rank`` MB of JSON each."""
    name = (f"kineto-{ranks}r-{mb_per_rank:g}mb-{'gz' if gzip_files else 'json'}"
            f"-kps{kernels_per_step}")
    folder = root / name
    m = _manifest(folder)
    if m is None:
        shutil.rmtree(folder, ignore_errors=True)
        log(f"generating {name} ...")
        t = time.perf_counter()
        cmd = [sys.executable, "-m", "fixtures.synthetic", "--out", str(folder),
               "--world-size", str(ranks), "--seed", "0", "--target-mb", f"{mb_per_rank:g}",
               "--kernels-per-step", str(kernels_per_step)]
        if not gzip_files:
            cmd.append("--no-gzip")
        out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
        events = sum(int(line.split("\t")[2].split()[0]) for line in out.splitlines()
                     if line.count("\t") == 2)
        files = sorted(folder.glob("rank-*.json*"), key=lambda p: int(p.name.split("-")[1].split(".")[0]))
        m = _write_manifest(folder, files, events)
        log(f"  {len(files)} files, {m['json_bytes'] / 1e6:.0f} MB JSON in "
            f"{time.perf_counter() - t:.0f} s")
    return _load(name, folder, m)


def gzipped_copy(source: InputSet, root: Path, log=print) -> InputSet:
    """The same single trace gzipped (zlib level 6, as ``gzip`` does by default)."""
    name = source.name.replace("-json-", "-gz6-")
    folder = root / name
    m = _manifest(folder)
    if m is None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        log(f"gzipping {source.name} ...")
        files = []
        for p in source.paths:
            target = folder / (p.name + ".gz")
            with open(p, "rb") as src, gzip.GzipFile(target, "wb", compresslevel=6, mtime=0) as dst:
                shutil.copyfileobj(src, dst, 1 << 24)
            files.append(target)
        m = _write_manifest(folder, files, source.events)
    return _load(name, folder, m)


def nsys_set(root: Path, *, kernels: int, log=print) -> InputSet:
    """A generation-3 nsys export with ``kernels`` kernel rows (4 processes)."""
    name = f"nsys-{kernels}-kernels"
    folder = root / name
    m = _manifest(folder)
    if m is None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        log(f"generating {name} ...")
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        from fixtures.nsys_synthetic import write_bulk

        path = folder / "bulk.sqlite"
        counts = write_bulk(path, kernels=kernels)
        m = _write_manifest(folder, [path], sum(counts.values()))
    return _load(name, folder, m)


# ---- many small files (issue 23, item 2) ----

#: The template of the many-small-files sets: a real 2-rank gloo DDP run's rank 0 (26 KB gzip,
#: 1,039 events: CPU ops, gloo collectives, fwd/bwd flows).
SMALL_TEMPLATE = REPO / "fixtures" / "data" / "gloo_ddp_2r" / "rank-0.gloo_ddp.pt.trace.json.gz"


def many_small_set(root: Path, n: int, log=print, events: int | None = None) -> InputSet:
    """A run folder of ``n`` small rank files: the gloo template copied with its rank (and the
    world's size and ranks in ``distributedInfo``) rewritten, and its clock shifted by a few
    microseconds per rank so that ranks differ. The events are the template's, or with
    ``events=K`` only K of them (:func:`tiny_events`: a large job's rank file of a few KB)."""
    import orjson

    count = events
    name = f"small-{n}-gloo" if count is None else f"tiny-{n}-gloo-{count}ev"
    folder = root / name
    m = _manifest(folder)
    if m is None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        log(f"generating {name} ...")
        t = time.perf_counter()
        with gzip.open(SMALL_TEMPLATE, "rb") as fh:
            doc = orjson.loads(fh.read())
        events = doc.pop("traceEvents")
        if count is not None:
            events = tiny_events(events, count)
        info = doc["distributedInfo"]
        info["world_size"] = n
        for pg in info.get("pg_config", []):
            pg["pg_size"], pg["ranks"] = n, list(range(n))
        head = orjson.dumps(doc)[:-1]
        files = []
        for rank in range(n):
            info["rank"] = rank
            head = orjson.dumps(doc)[:-1]
            shift = 3 * (rank % 97)
            body = orjson.dumps([_shifted(e, shift) for e in events] if shift else events)
            path = folder / f"rank-{rank}.gloo_ddp.pt.trace.json.gz"
            path.write_bytes(gzip.compress(head + b',"traceEvents":' + body + b"}",
                                           compresslevel=1, mtime=0))
            files.append(path)
        m = _write_manifest(folder, files, n * len(events))
        log(f"  {n} files, {m['disk_bytes'] / 1e6:.1f} MB in {time.perf_counter() - t:.0f} s")
    return _load(name, folder, m)


#: Events a cut-down rank keeps first: metadata, the profiler steps and the collectives
#: (what ``traceview stragglers`` reads); then others, in the template's order.
_TINY_FIRST = ("ProfilerStep#", "gloo:", "c10d::", "record_param_comms")


def tiny_events(events: list[dict], count: int) -> list[dict]:
    """``count`` of ``events`` in their order: metadata, step markers and collectives first,
    then the earliest others (a large job's per-rank trace of a few KB)."""
    def first(e: dict) -> bool:
        return e.get("ph") == "M" or str(e.get("name", "")).startswith(_TINY_FIRST)

    kept = [i for i, e in enumerate(events) if first(e)][:count]
    kept += [i for i, e in enumerate(events) if not first(e)][:count - len(kept)]
    return [events[i] for i in sorted(kept)]


def _shifted(event: dict, us: float) -> dict:
    ts = event.get("ts")
    if isinstance(ts, (int, float)) and event.get("ph") != "M":
        event = dict(event)
        event["ts"] = ts + us
    return event


# ---- real-derived sets (issue 23, item 1) ----

#: Corpus GPU traces the real-derived sets replicate (relative to ``fixtures.corpus``).
#: ``single``: TraceLens's owlv2 H100 inference trace (132,152 events: Python functions, CPU
#: ops, CUDA runtime and driver calls, kernels, memsets, memcpys, 13,474 memory events, 14,457
#: flow events); ``ranks``: rank 0 of 16 of an NCCL training job in HTA's tests (108,936
#: events, 5 profiler steps, 80 NCCL kernels, 41,671 flow events).
REAL_SOURCES = {
    "single": "tracelens/tests/traces/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz",
    "ranks": "hta-tests-data/tests/data/negative_queue_length_values_check/rank0.json.gz",
    # the other corpus GPU traces, for the sweep (run.py --real-extra): other event mixes
    # and layouts than the two the code was measured on
    "b200": "tracelens/tests/traces/b200/eager_trace.json.gz",  # 62 % Python functions
    "mi300": "tracelens/tests/traces/mi300/resnet_act_checkpoint.json.gz",  # AMD HIP
    "mtia": "hta-tests-data/tests/data/mtia_trace_single_rank/mtia_rank_0.json.gz",  # no CUDA
    "timesformer": "tracelens/tests/traces/h100/"
                   "facebook_timesformer-base-finetuned-k400__1016002.json.gz",
    "ns_resolution": "hta-tests-data/tests/data/ns_resolution_trace/"
                     "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",  # sub-us float times
    "param_resnet": "param/et_replay/tests/inputs/resnet_kineto.json.gz",
    # issue 25's mixes (``ranks`` is the flow-heavy one, 38 % flows; as 8 or 64 ranks, the
    # multi-rank NCCL job): instant-heavy (17 % instant memory events, 24 % flows, 57 % of
    # the bytes args: 2021 Kineto, cat Operator), args-heavy (38 % of the bytes args, input
    # shapes of every op), CPU-only (a gloo rank: no GPU event, 47 % args)
    "instant": "kineto/tb_plugin/samples/resnet50_num_workers_0/"
               "worker0.1623143089861.pt.trace.json.gz",
    "args": "kineto/tb_plugin/samples/resnet50_num_workers_4/worker0.pt.trace.json.gz",
    "cpu_only": "hta-tests-data/_history/b8cce2cd9cbb/tests/data/cpu_only/"
                "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
}

#: The sweep's sources (every entry but the two the harness always builds).
EXTRA_REAL_SOURCES = tuple(k for k in REAL_SOURCES if k not in ("single", "ranks"))

#: Integer ids in ``args`` that must stay unique per replica (shifted by the replica's offset).
_ID_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Record function id",
            "Ev Idx", "Fwd thread id", "Sequence number")


def real_source(kind: str) -> Path | None:
    """The corpus trace a real-derived set is built from, or None when the corpus is absent."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from fixtures.corpus import corpus_dir

    path = corpus_dir() / REAL_SOURCES[kind]
    return path if path.is_file() else None


def real_set(root: Path, kind: str, *, ranks: int, mb_per_rank: float,
             log=print, layout: str = "torch") -> InputSet | None:
    """``ranks`` files of at least ``mb_per_rank`` MB of JSON each, built from the corpus trace
    ``REAL_SOURCES[kind]`` by replicating its events (every event kept: kernels, runtime calls,
    flows, memory events, steps) one copy after the other in time. Each replica shifts the
    timestamps past the previous one's end, and the correlation, external, Python and flow ids
    and the profiler-step numbers by a per-replica offset, so they stay unique; metadata
    events (``ph: M``) and the trace-span events are kept once. With several ranks, each rank
    is the same with ``distributedInfo`` rank/world_size rewritten and its clock offset by
    rank x 7 us. None (and nothing written) when the corpus is absent.

    ``layout="torch"`` (the default, issue 25): the text as Kineto's writer lays it out, ~6
    indented lines an event (``torch_layout``): the source's own event texts when it was
    written that way, shifted on the text; otherwise each event written the writer's way.
    ``layout="compact"``: ``orjson.dumps`` of the events, no whitespace (the harness's
    inputs until log 52). The manifest's ``mix`` says what the file holds and how it is laid
    out, beside the source's layout."""
    source = real_source(kind)
    if source is None:
        log(f"real-derived set '{kind}' skipped: corpus absent ({REAL_SOURCES[kind]})")
        return None
    prefix = "real" if layout == "compact" else "torch"
    name = f"{prefix}-{kind}-{ranks}r-{mb_per_rank:g}mb"
    folder = root / name
    m = _manifest(folder)
    if m is not None:
        return _load(name, folder, m)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    log(f"generating {name} from {source.name} ...")
    t = time.perf_counter()
    text = _replicable(source, layout)
    replicas = max(1, -(-int(mb_per_rank * 1e6) // len(text.timed)))
    files, total_events = [], 0
    for rank in range(ranks):
        head = text.head
        if text.has_distributed_info or ranks > 1:
            head = torch_layout.with_rank(head, rank, ranks)
        path = folder / f"rank-{rank}.{source.name.split('.')[0]}.x{replicas}.pt.trace.json"
        with open(path, "wb") as out:
            out.write(head)
            # elements joined by commas: a source without metadata events (TraceLens's B200
            # trace) once began the array with one, which no JSON reader accepts
            pieces = itertools.chain([text.once] if text.once else [], (
                torch_layout.shifted(text.timed, k * text.span + rank * 7, k * text.ids,
                                     k * text.step_span)
                for k in range(replicas)))  # one replica in memory at a time
            for i, piece in enumerate(pieces):
                out.write((b"," if i else b"") + piece)
            out.write(text.tail)
        total_events += text.once_count + replicas * text.timed_count
        files.append(path)
    m = _write_manifest(folder, files, total_events)
    m["mix"] = {**text.mix, "source": REAL_SOURCES[kind], "replicas": replicas}
    (folder / "manifest.json").write_text(json.dumps(m, indent=1))
    log(f"  {ranks} files x {replicas} replicas, {m['json_bytes'] / 1e6:.0f} MB JSON in "
        f"{time.perf_counter() - t:.0f} s; {torch_layout.describe_mix(m['mix'])}")
    return _load(name, folder, m)


@dataclass(frozen=True)
class _Replicable:
    """A source's events as text ready to replicate: the header, the events kept once, the
    timed events (one replica), the closing text, and the per-replica shifts."""

    head: bytes
    once: bytes
    timed: bytes
    tail: bytes
    once_count: int
    timed_count: int
    span: int  # us between replicas
    ids: int  # id offset between replicas
    step_span: int
    has_distributed_info: bool
    mix: dict


def _replicable(source: Path, layout: str) -> _Replicable:
    import orjson

    with gzip.open(source, "rb") as fh:
        raw = fh.read()
    doc = orjson.loads(raw)
    events = doc.pop("traceEvents")
    is_once = [e.get("ph") == "M" or e.get("cat") == "Trace"
               or not isinstance(e.get("ts"), (int, float)) for e in events]
    timed = [e for e, once in zip(events, is_once) if not once]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    steps = [int(e["name"].rsplit("#", 1)[1]) for e in timed
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    mix = {**torch_layout.event_mix(events, raw),
           **{f"source_{k}": v for k, v in torch_layout.layout_stats(raw, len(events)).items()}}
    if layout == "compact":
        head, tail = _opening(doc), b"]}"
        texts = [orjson.dumps(e) for e in events]
        mix["layout"] = "compact (orjson)"
    else:
        split = (torch_layout.element_texts(raw, len(events))
                 if torch_layout.is_torch_layout(raw, len(events)) else None)
        if split is not None:
            head, texts, tail = split
            mix["layout"] = "the source's text (Kineto's writer)"
        else:
            head, tail = torch_layout.torch_head(doc), torch_layout.TORCH_TAIL
            texts = [torch_layout.torch_event_text(e) for e in events]
            mix["layout"] = "written as Kineto's writer does (the source was re-encoded)"
    once = b",".join(t for t, o in zip(texts, is_once) if o)
    body = b",".join(t for t, o in zip(texts, is_once) if not o)
    one_replica = head + b",".join(p for p in (once, body) if p) + tail
    mix.update(torch_layout.layout_stats(one_replica, len(events)))
    return _Replicable(
        head=head, once=once, timed=body, tail=tail, once_count=len(events) - len(timed),
        timed_count=len(timed), span=int(end - start) + 1000, ids=_id_span(timed),
        step_span=(max(steps) - min(steps) + 1) if steps else 0,
        has_distributed_info="distributedInfo" in doc, mix=mix)


def _opening(doc: dict) -> bytes:
    """The document's top-level values and the opening of its events array."""
    import orjson

    head = orjson.dumps(doc)[:-1]
    return head + (b"," if doc else b"") + b'"traceEvents":['


def _id_span(events: list[dict]) -> int:
    """One more than the largest id of any kind in ``events`` (flow ids and the id args)."""
    top = 0
    for e in events:
        i = e.get("id")
        if isinstance(i, int):
            top = max(top, i)
        args = e.get("args")
        if args:
            for key in _ID_ARGS:
                v = args.get(key)
                if isinstance(v, int):
                    top = max(top, v)
    return top + 1
