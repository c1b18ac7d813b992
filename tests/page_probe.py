"""Open an HTML report in headless Chromium and say what a reader would see.

A status script is injected at the top of ``<head>`` (before plotly.js). It records
``window.onerror``, unhandled rejections, ``console.error`` and ``alert`` calls while the page
loads; in the load event (every inline script, so every figure, has run by then) it measures
the page and writes a ``<pre id="tv-status">`` JSON that ``--dump-dom`` returns:

* ``load_ms``: ``performance.now()`` at the load event (navigation start to load, real time
  unless a virtual time budget is given);
* ``height``: the document's scroll height (px) at a 1280 px wide window (``width`` picks
  another); ``width`` / ``viewport``: the document's scroll width and the window's (a page
  wider than its window scrolls sideways); ``verdict_top`` / ``verdict_text``: where the
  verdict section starts (px from the top) and its text; ``no_gpu_mentions``: how often the
  visible text says "no GPU events" (any case);
* ``figures``: per plotly div, its ``id``, ``height`` (px), ``marks`` (drawn data marks:
  bar, point and line paths, heatmap images, under the figure's plot layer: ``.overplot``
  in plotly.js 3, ``.plot`` before) and whether its
  ``.main-svg`` exists (``rendered``);
* ``errors``, ``alerts``, ``remote`` (resources fetched from anything but ``data:``,
  ``blob:``, ``file:`` or ``about:``), ``imgs``, ``scripts``;
* ``cells`` / ``svg_texts``: table cells and SVG texts containing ``needle``; ``text_has``:
  whether the page's visible text (``innerText``) contains it.

Nothing here times anything for a test: tests read heights, marks, errors and requests;
``benchmarks/report_scale.py`` reads ``load_ms`` as well.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

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
window.addEventListener('load', function () {
  var loadMs = performance.now();
  var MARKS = '.main-svg .overplot path, .main-svg .overplot image, .main-svg .plot path, '
    + '.main-svg .plot image';
  var marksOf = function (d) {
    var n = 0;
    d.querySelectorAll(MARKS).forEach(function (e) {
      var p = e.getAttribute('d');
      if (e.tagName.toLowerCase() === 'image' || (p && p !== 'M0,0Z' && p.length > 4)) { n += 1; }
    });
    return n;
  };
  var divs = document.querySelectorAll('.plotly-graph-div');
  var figures = [];
  divs.forEach(function (d) { figures.push({id: d.id, height: d.getBoundingClientRect().height,
    marks: marksOf(d), rendered: !!d.querySelector('.main-svg')}); });
  var needle = __NEEDLE__;
  var count = function (sel) { var n = 0; document.querySelectorAll(sel).forEach(function (e) {
    if (e.textContent.indexOf(needle) >= 0) { n += 1; } }); return n; };
  var remote = performance.getEntriesByType('resource').map(function (r) { return r.name; })
    .filter(function (u) { return !/^(data|blob|file|about):/.test(u); });
  var verdict = document.getElementById('verdict');
  var s = document.createElement('pre'); s.id = 'tv-status';
  s.textContent = JSON.stringify({load_ms: loadMs,
    height: document.documentElement.scrollHeight, figures: figures,
    plots: divs.length, rendered: figures.filter(function (f) { return f.rendered; }).length,
    errors: window.__tv.errors, alerts: window.__tv.alerts,
    imgs: document.querySelectorAll('img').length,
    scripts: document.querySelectorAll('script').length, remote: remote,
    cells: count('td'), svg_texts: count('.main-svg text'),
    text_has: document.body.innerText.indexOf(needle) >= 0,
    width: document.documentElement.scrollWidth, viewport: window.innerWidth,
    verdict_top: verdict ? verdict.getBoundingClientRect().top : null,
    verdict_text: verdict ? verdict.innerText : null,
    no_gpu_mentions: document.body.innerText.toLowerCase().split('no gpu events').length - 1});
  document.body.appendChild(s); });
</script>"""


def chromium() -> str | None:
    """The headless browser's executable, or None when none is installed."""
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def instrumented(page: str, needle: str = "") -> str:
    """``page`` with the status script first in its ``<head>``."""
    head = page.index("<head>") + len("<head>")
    return page[:head] + STATUS_SCRIPT.replace("__NEEDLE__", json.dumps(needle)) + page[head:]


def launch(browser: str, page: Path, profile: Path, *,
           virtual_time_ms: int | None = 1500, width: int = 1280) -> subprocess.Popen:
    """Start Chromium dumping ``page``'s DOM after load; no request leaves the machine
    (every host resolves to nothing). ``virtual_time_ms`` None: real time (for load times)."""
    budget = [] if virtual_time_ms is None else [f"--virtual-time-budget={virtual_time_ms}"]
    return subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
         f"--window-size={width},1000", *budget, "--dump-dom", page.as_uri()],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def status(proc: subprocess.Popen, timeout: float = 180) -> dict[str, Any]:
    """The status JSON the page wrote (AssertionError when it wrote none)."""
    out, _ = proc.communicate(timeout=timeout)
    m = re.search(r'<pre id="tv-status">(.*?)</pre>', out, re.S)
    assert m, f"no status element in the dumped DOM (exit {proc.returncode})"
    return json.loads(html.unescape(m.group(1)))


def probe(browser: str, page_html: str, work: Path, *, needle: str = "",
          virtual_time_ms: int | None = 1500) -> dict[str, Any]:
    """Write ``page_html`` instrumented under ``work`` and return its status."""
    work.mkdir(parents=True, exist_ok=True)
    page = work / "page.html"
    page.write_text(instrumented(page_html, needle), encoding="utf-8")
    return status(launch(browser, page, work / "profile", virtual_time_ms=virtual_time_ms))
