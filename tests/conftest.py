"""Shared test fixtures: the corpus location, an isolated cache, inline trace writers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Timing-based failures are not failures of the code: CI machines are shared and slow.
settings.register_profile("traceview", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("traceview")

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
FIXTURES = REPO / "fixtures"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Never touch the user's cache from tests."""
    monkeypatch.setenv("TRACEVIEW_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"shared corpus not present at {CORPUS}")
    return CORPUS
