"""Report renderers: pure functions of one Report, one per output format.

One parse feeds every format, so all of them show the same verdict, timeline,
evidence, lever and scan footer; only the layout differs.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from preemptdiag.records import Report
from preemptdiag.render.json_format import render_json
from preemptdiag.render.markdown import render_markdown
from preemptdiag.render.sarif import render_sarif
from preemptdiag.render.terminal import render_terminal


class Format(StrEnum):
    TERMINAL = "terminal"
    MARKDOWN = "markdown"
    JSON = "json"
    SARIF = "sarif"


_PLAIN: dict[Format, Callable[[Report], str]] = {
    Format.MARKDOWN: render_markdown,
    Format.JSON: render_json,
    Format.SARIF: render_sarif,
}


def render(report: Report, fmt: Format, *, color: bool = False, width: int = 100) -> str:
    """The report as text ending in one newline. `color` and `width` only affect the
    terminal format; the others are for files and pipes and never carry ANSI."""
    fmt = Format(fmt)  # also accepts the plain string value
    if fmt is Format.TERMINAL:
        return render_terminal(report, color=color, width=width)
    return _PLAIN[fmt](report)


__all__ = [
    "Format",
    "render",
    "render_json",
    "render_markdown",
    "render_sarif",
    "render_terminal",
]
