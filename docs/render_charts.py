"""Draw markdown reports, Mermaid charts included, as PNG pictures in headless Chromium.

    python docs/render_charts.py OUT_DIR                 # the standard set of reports
    python docs/render_charts.py OUT_DIR a.md b.md       # given markdown reports
    python docs/render_charts.py --readme                # docs/markdown-report.png

Needs Debian's `chromium` and the pinned mermaid package (`npm ci` in
tests/render/browser/). The standard set: a real vLLM 0.32.0 thrash loop (hundreds of
preemptions a minute), V1 queueing, a day of a healthy server with an idle hour (a gap),
and a start-up failure (no chart). Look at the pictures: the test checks what Mermaid
drew, not whether it reads well.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "render" / "browser"), str(ROOT / "tests")]

import mermaid_harness  # noqa: E402

from preemptdiag.cli import main as cli  # noqa: E402

ENGINE = ROOT / "tests" / "fixtures" / "engine" / "vllm-0.32.0"
README_PICTURE = ROOT / "docs" / "markdown-report.png"


def markdown_report(files: list[str], year: str = "2026") -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        cli(["analyze", "--year", year, "--format", "markdown", *files])
    return buf.getvalue()


def healthy_day_with_gap(tmp: Path) -> list[str]:
    """A day of a calm V1 server that logged nothing from 13:00 to 14:00."""
    from builders import healthy_v1_log

    start = datetime(2026, 3, 2, tzinfo=UTC)
    lines = [
        ln
        for ln in healthy_v1_log(start, 24 * 60, spikes={4000: (0, 77.7), 7000: (3, 41.0)})
        if not ln.split(" INFO ")[1].startswith("03-02 13:")
    ]
    log = tmp / "healthy_day.log"
    log.write_text("\n".join(lines) + "\n")
    return [str(log)]


def standard_set(tmp: Path) -> dict[str, list[str]]:
    def engine(case: str) -> list[str]:
        d = ENGINE / case
        return [str(d / "server.log"), *sorted(str(p) for p in d.glob("metrics-*.prom"))]

    return {
        "thrash_loop_vllm_0.32": engine("thrash_loop"),
        "queueing_v1": [str(ROOT / "samples" / "v1_queueing.log")],
        "healthy_day_with_gap": healthy_day_with_gap(tmp),
        "startup_failure": [str(ROOT / "samples" / "v0_startup_kv_too_small.log")],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", type=Path, help="folder for the PNGs")
    p.add_argument("reports", nargs="*", type=Path, help="markdown reports to draw")
    p.add_argument("--readme", action="store_true", help=f"write {README_PICTURE}")
    args = p.parse_args(argv)
    if args.readme:
        import os

        os.chdir(ROOT)  # the report names the sample as a user would type it
        md = markdown_report(["samples/v0_thrash_loop.log"], year="2025")
        mermaid_harness.screenshot(md, README_PICTURE, width=1000)
        print(README_PICTURE)
        return 0
    if args.out is None:
        p.error("give an output folder, or --readme")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.reports:
            todo = {r.stem: r.read_text(encoding="utf-8") for r in args.reports}
        else:
            todo = {name: markdown_report(f) for name, f in standard_set(Path(tmp)).items()}
        for name, md in todo.items():
            png = args.out / f"{name}.png"
            mermaid_harness.screenshot(md, png)
            print(png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
