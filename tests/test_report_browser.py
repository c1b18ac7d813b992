"""The HTML report in headless Chromium: loads without errors, every plot renders, names from
traces show as text and run no script, nothing is fetched from the network.

A status script is injected at the top of ``<head>`` (before plotly.js): it records
``window.onerror``, unhandled rejections, ``console.error`` and ``alert`` calls, and after the
load event writes a ``<pre id="tv-status">`` JSON that ``--dump-dom`` returns.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_report_trace import EVIL, EVIL_OP, two_rank_trace
from traceview.report import gather, write_html

pytest.importorskip("plotly")

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"

STATUS_SCRIPT = """<script>
window.__tv = {errors: [], alerts: 0};
window.addEventListener('error', function (e) {
  window.__tv.errors.push('error: ' + (e.message || (e.target && e.target.outerHTML) || e.type));
}, true);
window.addEventListener('unhandledrejection', function (e) {
  window.__tv.errors.push('rejection: ' + e.reason); });
(function () { var ce = console.error; console.error = function () {
  window.__tv.errors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
  ce.apply(console, arguments); }; })();
window.alert = function () { window.__tv.alerts += 1; };
window.addEventListener('load', function () { setTimeout(function () {
  var divs = document.querySelectorAll('.plotly-graph-div');
  var ok = 0;
  divs.forEach(function (d) { if (d.querySelector('.main-svg')) { ok += 1; } });
  var needle = __NEEDLE__;
  var count = function (sel) { var n = 0; document.querySelectorAll(sel).forEach(function (e) {
    if (e.textContent.indexOf(needle) >= 0) { n += 1; } }); return n; };
  var remote = performance.getEntriesByType('resource').map(function (r) { return r.name; })
    .filter(function (u) { return !/^(data|blob|file|about):/.test(u); });
  var s = document.createElement('pre'); s.id = 'tv-status';
  s.textContent = JSON.stringify({plots: divs.length, rendered: ok, errors: window.__tv.errors,
    alerts: window.__tv.alerts, imgs: document.querySelectorAll('img').length,
    scripts: document.querySelectorAll('script').length, remote: remote,
    cells: count('td'), svg_texts: count('.main-svg text')});
  document.body.appendChild(s); }, 300); });
</script>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (apt-get install chromium)")


def _instrumented(page: str, needle: str) -> str:
    head = page.index("<head>") + len("<head>")
    return page[:head] + STATUS_SCRIPT.replace("__NEEDLE__", json.dumps(needle)) + page[head:]


def _launch(browser: str, page: Path, profile: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=1500", "--dump-dom", page.as_uri()],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _status(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=120)
    m = re.search(r'<pre id="tv-status">(.*?)</pre>', out, re.S)
    assert m, f"no status element in the dumped DOM (exit {proc.returncode})"
    import html

    return json.loads(html.unescape(m.group(1)))


def _report(events, **kw) -> str:
    buf = io.StringIO()
    write_html(gather(events, **kw), buf)
    return buf.getvalue()


def test_reports_render_in_headless_chromium(tmp_path: Path) -> None:
    import traceview

    browser = _chromium()
    gpu = tmp_path / "gpu.html"
    gpu.write_text(_instrumented(_report(two_rank_trace()), EVIL), encoding="utf-8")
    ts = traceview.open(FIX / "gloo_ddp_2r_slow1", cache=False)
    cpu = tmp_path / "cpu.html"
    cpu.write_text(_instrumented(_report(ts), "rank 1"),
                   encoding="utf-8")
    procs = [_launch(browser, gpu, tmp_path / "p1"), _launch(browser, cpu, tmp_path / "p2")]
    gpu_status, cpu_status = (_status(p) for p in procs)

    for status in (gpu_status, cpu_status):
        assert status["errors"] == []
        assert status["plots"] == 6 and status["rendered"] == 6
        assert status["alerts"] == 0 and status["imgs"] == 0
        assert status["remote"] == []
        assert status["scripts"] == 2 + 6  # status + plotly.js + one per figure
    # the hostile kernel name is text: in the kernel table, and in the bar chart's labels
    assert gpu_status["cells"] >= 2
    assert gpu_status["svg_texts"] >= 1
    # the CPU-only report still names the straggler
    assert cpu_status["cells"] >= 1


def test_hostile_op_name_in_cpu_table_is_text(tmp_path: Path) -> None:
    """The host-op table (shown when there are no kernels) escapes names too."""
    import polars as pl

    ev = two_rank_trace().filter(pl.col("kind").cast(pl.String) != "kernel")
    page = _report(ev)
    assert EVIL_OP not in page and "&lt;script&gt;alert(2)&lt;/script&gt;" in page
