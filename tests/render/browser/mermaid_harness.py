"""Render Mermaid blocks, or a whole markdown report, in a real headless Chromium.

Used by tests/render/test_mermaid_browser.py (what each chart drew) and by
docs/render_charts.py (PNG pictures). The mermaid package is the one pinned in
package.json beside this file (`npm ci` here installs it); Chromium is Debian's
`chromium`. Nothing is fetched from the network: the page loads mermaid from disk.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MERMAID_JS = HERE / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",
    "--hide-scrollbars",
)
MERMAID_BLOCK = re.compile(r"^```mermaid\n(.*?)\n```$", re.S | re.M)
_RESULT = re.compile(r'<pre id="result">(.*?)</pre>', re.S)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def mermaid_blocks(markdown: str) -> list[str]:
    return MERMAID_BLOCK.findall(markdown)


# Runs in the page: render every block, then describe what each SVG drew. Zero-width
# characters (the hidden axis labels) do not count as label text.
_SCRIPT = r"""
const blocks = JSON.parse(document.getElementById('blocks').textContent);
mermaid.initialize({startOnLoad: false, securityLevel: 'strict'});
(async () => {
  const out = [];
  for (let i = 0; i < blocks.length; i++) {
    const r = {ok: false};
    try {
      const {svg} = await mermaid.render('chart' + i, blocks[i]);
      const holder = document.createElement('div');
      holder.innerHTML = svg;
      document.getElementById('charts').appendChild(holder);
      const s = holder.querySelector('svg');
      const texts = (sel) => [...s.querySelectorAll(sel)].map(
        (t) => t.textContent.replace(/[\u200b-\u200d\u2060]/g, '').trim());
      r.ok = true;
      r.error_text = s.textContent.includes('Syntax error');
      r.title = texts('.chart-title text').join(' ');
      r.bars = [...s.querySelectorAll('.plot [class^="bar-plot"]')].map(
        (g) => g.querySelectorAll('rect').length);
      r.lines = [...s.querySelectorAll('.plot [class^="line-plot"] path')].map(
        (p) => (p.getAttribute('d').match(/[ML]/g) || []).length);
      r.x_labels = texts('.bottom-axis .label text').filter((t) => t !== '');
      r.x_categories = s.querySelectorAll('.bottom-axis .label text').length;
      r.legend = texts('.legend .label text');
      const box = s.getBoundingClientRect();
      r.width = box.width; r.height = box.height;
    } catch (e) {
      r.error = String(e && e.message || e);
    }
    out.push(r);
  }
  document.getElementById('result').textContent = JSON.stringify(
    {charts: out, height: document.documentElement.scrollHeight});
})();
"""

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; font-size: 14px;
       color: #1f2328; max-width: 980px; margin: 16px auto; padding: 0 16px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; }
th { background: #f6f8fa; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 12px; }
pre { background: #f6f8fa; padding: 8px; overflow: hidden; white-space: pre-wrap; }
#result { display: none; }
"""


def _page(blocks: list[str], body_html: str = "") -> str:
    payload = json.dumps(blocks).replace("</", "<\\/")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{_STYLE}</style></head>"
        f"<body>{body_html}<div id='charts'></div><pre id='result'></pre>"
        f"<script id='blocks' type='application/json'>{payload}</script>"
        f"<script src='{MERMAID_JS.as_uri()}'></script><script>{_SCRIPT}</script></body></html>"
    )


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
    if not MERMAID_JS.exists():
        raise FileNotFoundError(f"{MERMAID_JS} is missing (run `npm ci` in {HERE})")
    return subprocess.run(
        [exe, *FLAGS, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def render(blocks: list[str], body_html: str = "", *, timeout: float = 60) -> dict[str, Any]:
    """Render the blocks in one page; {"charts": [one dict per block], "height": px}."""
    with tempfile.TemporaryDirectory(prefix="pd-mermaid-") as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(_page(blocks, body_html), encoding="utf-8")
        proc = _run(
            [f"--user-data-dir={tmp}/profile", "--virtual-time-budget=30000", "--dump-dom",
             page.as_uri()],
            timeout,
        )  # fmt: skip
        found = _RESULT.search(proc.stdout)
        if found is None or not found.group(1).strip():
            raise RuntimeError(f"the page gave no result; chromium said: {proc.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
        return result


def report_html(markdown: str) -> tuple[str, list[str]]:
    """The report as HTML (GitHub-like: tables on), its mermaid blocks taken out to be
    drawn where they stood."""
    from markdown_it import MarkdownIt

    blocks = mermaid_blocks(markdown)
    text = markdown
    for i, block in enumerate(blocks):
        text = text.replace(f"```mermaid\n{block}\n```", f"<div id='slot{i}'></div>", 1)
    md = MarkdownIt("commonmark", {"html": True}).enable("table")
    return md.render(text), blocks


# Moves each drawn chart into its slot in the report, once all are drawn.
_PLACE = r"""
<script>
const wait = setInterval(() => {
  if (!document.getElementById('result').textContent) return;
  clearInterval(wait);
  const drawn = document.getElementById('charts').children;
  [...drawn].forEach((d, i) => { const s = document.getElementById('slot' + i); if (s) s.appendChild(d.cloneNode(true)); });
  document.getElementById('charts').remove();
}, 50);
</script>
"""


def screenshot(markdown: str, png: Path, *, width: int = 1000, timeout: float = 60) -> None:
    """A picture of the whole report as a markdown viewer shows it, charts drawn."""
    body, blocks = report_html(markdown)
    height = int(render(blocks, body, timeout=timeout)["height"]) + 40
    with tempfile.TemporaryDirectory(prefix="pd-mermaid-") as tmp:
        page = Path(tmp) / "page.html"
        page.write_text(_page(blocks, body).replace("</body>", _PLACE + "</body>"), "utf-8")
        proc = _run(
            [f"--user-data-dir={tmp}/profile", "--virtual-time-budget=30000",
             f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()],
            timeout,
        )  # fmt: skip
        if not png.exists():
            raise RuntimeError(f"no screenshot; chromium said: {proc.stderr[-2000:]}")


def chart_png(block: str, png: Path, *, width: int = 960, timeout: float = 60) -> None:
    """One chart alone."""
    screenshot(f"```mermaid\n{block}\n```\n", png, width=width, timeout=timeout)
