"""Report renderers: pure functions of one Report, one per output format.

One parse feeds every format, so all of them show the same verdict, timeline,
evidence, lever and scan footer; only the layout differs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from preemptdiag.model.errors import DiagError
from preemptdiag.model.gcpause import cyclic_gc_paused
from preemptdiag.model.records import Report
from preemptdiag.render.episodes import TimelineMode

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


# Terminal and markdown are read by people: a month of windows collapses into episodes.
# JSON is read by programs: every window unless asked otherwise.
DEFAULT_TIMELINE = {
    Format.TERMINAL: TimelineMode.EPISODES,
    Format.MARKDOWN: TimelineMode.EPISODES,
    Format.JSON: TimelineMode.FULL,
    Format.SARIF: TimelineMode.FULL,
}


def render(
    report: Report,
    fmt: Format,
    *,
    color: bool = False,
    width: int = 100,
    timeline: TimelineMode | str | None = None,
) -> str:
    """The report as text ending in one newline. `color` and `width` only affect the
    terminal format; the others are for files and pipes and never carry ANSI.
    `timeline` (full|episodes) picks the windows shown one by one; None: the format's
    default. SARIF carries no timeline."""
    return "".join(render_chunks(report, fmt, color=color, width=width, timeline=timeline))


def render_chunks(
    report: Report,
    fmt: Format,
    *,
    color: bool = False,
    width: int = 100,
    timeline: TimelineMode | str | None = None,
    processes: int = 1,
) -> Iterator[str]:
    """render()'s text in pieces to write as they come: JSON a batch of windows at a
    time (a month of them is 60 MB of text; with `processes` above 1, a long
    timeline's second half made in a forked child meanwhile), the other formats
    whole. The format and timeline are checked here, before any piece (or an output
    file) is asked for."""
    fmt = Format(fmt)  # also accepts the plain string value
    mode = DEFAULT_TIMELINE[fmt] if timeline is None else timeline_mode(timeline)
    return _chunks(report, fmt, color, width, mode, processes)


def _chunks(
    report: Report, fmt: Format, color: bool, width: int, mode: TimelineMode, processes: int
) -> Iterator[str]:
    with cyclic_gc_paused():  # a month of windows: a million strings (gcpause.py)
        if fmt is Format.JSON:
            from preemptdiag.render.json_format import json_chunks

            yield from json_chunks(report, timeline=mode, processes=processes)
        elif fmt is Format.TERMINAL:
            terminal: Callable[..., str] = __getattr__("render_terminal")
            yield terminal(report, color=color, width=width, timeline=mode)
        elif fmt is Format.SARIF:
            sarif: Callable[[Report], str] = __getattr__("render_sarif")
            yield sarif(report)
        else:
            plain: Callable[..., str] = __getattr__(_PLAIN[fmt])
            yield plain(report, timeline=mode)


def timeline_mode(text: TimelineMode | str) -> TimelineMode:
    try:
        return TimelineMode(text)
    except ValueError:
        choices = ", ".join(m.value for m in TimelineMode)
        raise DiagError(f"--timeline must be one of {choices}, not {text!r}") from None


__all__ = [
    "DEFAULT_TIMELINE",
    "Format",
    "TimelineMode",
    "render",
    "render_chunks",
    "render_json",
    "render_markdown",
    "render_sarif",
    "render_terminal",
    "timeline_mode",
]
