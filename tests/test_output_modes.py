"""Files people get are created as open() creates them: mode 0666 less the umask (0644 under
the usual 022), not mkstemp's 0600 -- every -o, --junit and the store of ingest -o."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from traceview.cli import main
from traceview.store.safe_write import atomic_write, current_umask

from tests.conftest import FIXTURES

GLOO = str(FIXTURES / "data" / "gloo_ddp_2r")


@pytest.fixture
def umask():
    """Set the umask for one test, then give the old one back."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_umask_is_read_without_changing_it(umask) -> None:
    for mask in (0o022, 0o077, 0o002):
        umask(mask)
        assert current_umask() == mask and current_umask() == mask


def test_atomic_write_respects_the_umask(tmp_path, umask) -> None:
    for mask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        umask(mask)
        target = tmp_path / f"out-{mask:o}.txt"
        atomic_write(target, lambda tmp: tmp.write_text("x"))
        plain = tmp_path / f"open-{mask:o}.txt"
        plain.write_text("x")
        assert _mode(target) == _mode(plain) == mode


def test_every_output_file_is_0644_under_umask_022(tmp_path, umask, capsys) -> None:
    umask(0o022)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "out"
    out.mkdir()
    assert main(["report", GLOO, "-o", str(out / "r.html"), *cache]) == 0
    assert main(["baseline", GLOO, "-o", str(out / "b.json"), *cache]) == 0
    main(["check", GLOO, "--baseline", str(out / "b.json"), "--junit", str(out / "j.xml"),
          *cache])
    assert main(["export-perfetto", GLOO, "-o", str(out / "p.json.gz"), *cache]) == 0
    assert main(["ingest", GLOO, "-o", str(tmp_path / "store"), *cache]) == 0
    capsys.readouterr()
    written = [*out.iterdir(), *(tmp_path / "store").iterdir()]
    assert {p.name for p in out.iterdir()} == {"r.html", "b.json", "j.xml", "p.json.gz"}
    assert len(written) > 5
    assert {p.name: oct(_mode(p)) for p in written} == {p.name: "0o644" for p in written}
