"""Large realistic inputs, generated once and reused (under ``benchmarks/out/inputs``).

Kineto sets come from ``python -m fixtures.synthetic`` (seed 0, deterministic); the nsys export
from ``fixtures.nsys_synthetic.write_bulk``. A set is reused when its ``manifest.json`` exists
(written last), so an interrupted generation is redone. Sizes scale with ``--scale``.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class InputSet:
    name: str
    paths: list[Path]
    disk_bytes: int
    json_bytes: int  # uncompressed (the JSON text, or the SQLite file)
    largest_json_bytes: int
    events: int | None

    @property
    def ranks(self) -> int:
        return len(self.paths)

    def subset(self, n: int) -> InputSet:
        frac = n / len(self.paths)
        return InputSet(f"{self.name}[:{n}]", self.paths[:n], round(self.disk_bytes * frac),
                        round(self.json_bytes * frac), self.largest_json_bytes,
                        None if self.events is None else round(self.events * frac))


def _manifest(folder: Path) -> dict | None:
    path = folder / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _load(name: str, folder: Path, m: dict) -> InputSet:
    return InputSet(name, [folder / f for f in m["files"]], m["disk_bytes"], m["json_bytes"],
                    m["largest_json_bytes"], m.get("events"))


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
