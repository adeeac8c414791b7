"""Report renderers: pure functions of one Report, one per output format.

One parse feeds every format, so all of them show the same verdict, timeline,
evidence, lever and scan footer; only the layout differs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from preemptdiag.model.records import Report

if TYPE_CHECKING:
    from preemptdiag.render.json_format import render_json
    from preemptdiag.render.markdown import render_markdown
    from preemptdiag.render.sarif import render_sarif
    from preemptdiag.render.terminal import render_terminal


class Format(StrEnum):
    TERMINAL = "terminal"
    MARKDOWN = "markdown"
    JSON = "json"
    SARIF = "sarif"


# Each renderer is imported when its format is asked for: the terminal one pulls in
# rich (~30 ms), which a --format json run never needs.
_MODULES = {
    "render_json": "json_format",
    "render_markdown": "markdown",
    "render_sarif": "sarif",
    "render_terminal": "terminal",
}
_PLAIN = {
    Format.MARKDOWN: "render_markdown",
    Format.JSON: "render_json",
    Format.SARIF: "render_sarif",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def render(report: Report, fmt: Format, *, color: bool = False, width: int = 100) -> str:
    """The report as text ending in one newline. `color` and `width` only affect the
    terminal format; the others are for files and pipes and never carry ANSI."""
    fmt = Format(fmt)  # also accepts the plain string value
    if fmt is Format.TERMINAL:
        terminal: Callable[..., str] = __getattr__("render_terminal")
        return terminal(report, color=color, width=width)
    plain: Callable[[Report], str] = __getattr__(_PLAIN[fmt])
    return plain(report)


__all__ = [
    "Format",
    "render",
    "render_json",
    "render_markdown",
    "render_sarif",
    "render_terminal",
]
