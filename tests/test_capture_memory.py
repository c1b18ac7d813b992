"""``traceview.capture.profile(memory=True)``: allocator snapshots per rank on a GPU, a clear
no-op with a note without one."""

from __future__ import annotations

import json
import os

import pytest

import traceview
from traceview.cli import main
from traceview.run.memory import memory_result

torch = pytest.importorskip("torch")


def _train(prof, steps: int, device: str = "cpu") -> list:
    model = torch.nn.Linear(64, 64).to(device)
    kept = []
    for _ in range(steps):
        kept.append(torch.ones(1 << 18, device=device))  # 1 MiB held per step
        model(torch.randn(8, 64, device=device)).sum().backward()
        prof.step()
    return kept


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_memory_without_a_gpu_is_a_noop_with_a_note(tmp_path, monkeypatch, capsys) -> None:
    import traceview.capture as cap

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.warns(UserWarning, match="no CUDA device here: no allocator snapshot"):
        with cap.profile(tmp_path, wait=0, warmup=1, active=2, memory=True,
                         profile_memory=True) as prof:
            _train(prof, 4)
    assert prof.snapshot is None and "no CUDA device" in prof.notes[0]
    assert not list(tmp_path.glob("*.pickle"))
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["memory"] == {"recorded": False, "notes": prof.notes, "snapshot": None}
    assert info["options"]["memory"] is True and info["completed"] is True
    # the trace is written as usual, with its [memory] events (profile_memory=True)
    res = traceview.open(tmp_path, cache=False).memory()
    assert res.table("devices")["device"].to_list() == ["cpu"]
    assert main(["validate", str(tmp_path), "--no-cache"]) == 0
    capsys.readouterr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_memory_on_a_gpu_writes_a_snapshot_per_rank(tmp_path, monkeypatch) -> None:
    import traceview.capture as cap

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    torch.cuda.empty_cache()
    with cap.profile(tmp_path, wait=0, warmup=1, active=2, memory=True) as prof:
        kept = _train(prof, 4, device="cuda")
    assert prof.snapshot == tmp_path / f"rank-0.{prof.identity.host}.{os.getpid()}" \
                                       ".memory_snapshot.pickle"
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["memory"]["recorded"] is True and info["memory"]["snapshot"] == \
        prof.snapshot.name
    assert main(["memory", str(prof.snapshot), "--json"]) == 0
    res = memory_result(None, [str(prof.snapshot)])
    row = res.table("devices").row(0, named=True)
    held = sum(t.numel() * t.element_size() for t in kept)
    assert row["rank"] == 0 and row["device"].startswith("cuda:")
    assert row["allocated_bytes"] >= held and row["peak_allocated_bytes"] >= held
    assert row["reserved_bytes"] >= row["allocated_bytes"]
    assert row["start_allocated_bytes"] >= 0
