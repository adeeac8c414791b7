"""Episodes: a report that scales with the incident, not with the log's span."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from builders import healthy_v1_log, make_window
from hypothesis import given, settings
from hypothesis import strategies as st
from test_renderers import thrash_report, win

from preemptdiag.cli import main
from preemptdiag.model.records import Class, Confidence, Report, Verdict
from preemptdiag.render import Format, render
from preemptdiag.render.episodes import Episode, TimelineMode, _worst, episodes, in_episode

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2024, 6, 16, 21, 24, 0, tzinfo=UTC)


def long_report(n: int = 60, thrash: range = range(30, 33)) -> Report:
    """n healthy windows with a thrash loop (7 preemptions a window) at `thrash`."""
    r = thrash_report()
    ws = [win(i, Class.HEALTHY) for i in range(n)]
    for i in thrash:
        ws[i] = win(
            i, Class.THRASH_LOOP, preemptions=7.0, kv_max=99.0 + (i % 10) / 10, waiting_max=i
        )
    v = replace(
        r.verdict,
        start=T0 + timedelta(minutes=thrash.start),
        end=T0 + timedelta(minutes=thrash.stop),
    )
    return replace(r, windows=tuple(ws), verdict=v)


def rows(text: str, section: str) -> list[list[str]]:
    """The cells of a markdown table under the heading starting with `section`."""
    body = text.split(f"#### {section}")[1].split("\n\n", 2)[1]
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in body.splitlines()[2:]]


def minutes_shown(text: str) -> list[int]:
    """Window start minutes (since T0) of the markdown timeline rows."""
    out = []
    for cells in rows(text, "Timeline"):
        if re.fullmatch(r"\d\d:\d\d:00", cells[0]):
            h, m = int(cells[0][:2]), int(cells[0][3:5])
            out.append((h - 21) * 60 + m - 24)
        elif re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:00", cells[0]):
            t = datetime.fromisoformat(cells[0]).replace(tzinfo=UTC)
            out.append(int((t - T0).total_seconds() // 60))
    return out


# ---------------------------------------------------------------- the episode rows


def test_episode_rows_carry_span_class_count_peaks_and_confidence() -> None:
    text = render(long_report(), Format.MARKDOWN)
    assert "#### Episodes (60 windows in 3 runs, one class each)" in text
    assert rows(text, "Episodes") == [
        ["21:24:00 → 21:54:00", "`healthy`", "30", "0", "40.0", "0", "high"],
        ["21:54:00 → 21:57:00", "`thrash_loop` ◀ verdict", "3", "21", "99.2", "32", "high"],
        ["21:57:00 → 22:24:00", "`healthy`", "27", "0", "40.0", "0", "high"],
    ]


def test_focus_episode_and_three_windows_each_side_in_full() -> None:
    text = render(long_report(), Format.MARKDOWN)
    assert minutes_shown(text) == [27, 28, 29, 30, 31, 32, 33, 34, 35]
    assert "… 27 windows omitted …" in text and "… 24 windows omitted …" in text
    assert "around the focus episode" in text


@pytest.mark.parametrize("fmt", [Format.TERMINAL, Format.MARKDOWN])
def test_timeline_full_shows_every_window_and_no_episodes(fmt: Format) -> None:
    text = render(long_report(), fmt, timeline="full")
    assert "Episodes" not in text and "omitted" not in text
    starts = re.findall(r"\b(?:21|22):\d\d:00\b", text.split("Evidence")[0])
    assert len(set(starts)) == 60


@pytest.mark.parametrize("fmt", [Format.TERMINAL, Format.MARKDOWN])
def test_a_short_timeline_is_shown_whole_without_episodes(fmt: Format) -> None:
    for mode in ("episodes", "full"):
        text = render(thrash_report(), fmt, timeline=mode)
        assert "Episodes" not in text and "omitted" not in text
        assert len(set(re.findall(r"\b21:2\d:00\b", text.split("Evidence")[0]))) == 4


def test_a_long_focus_episode_shows_onset_worst_window_and_end() -> None:
    r = long_report(200, range(50, 150))
    ws = list(r.windows)
    ws[120] = replace(ws[120], preemptions=40.0)  # the worst minute of the loop
    text = render(replace(r, windows=tuple(ws)), Format.MARKDOWN)
    assert minutes_shown(text) == [47, 48, 49, 50, 51, 52, 119, 120, 121, 148, 149, 150, 151, 152]
    assert rows(text, "Episodes")[1][:4] == [
        "2024-06-16 22:14 → 23:54",
        "`thrash_loop` ◀ verdict",
        "100",
        str(99 * 7 + 40),
    ]


def test_without_a_dated_verdict_the_focus_is_the_most_severe_episode() -> None:
    r = long_report()
    r = replace(r, verdict=replace(r.verdict, start=None, end=None))
    text = render(r, Format.MARKDOWN)
    assert minutes_shown(text) == [27, 28, 29, 30, 31, 32, 33, 34, 35]
    assert "◀ verdict" not in text


def test_a_flapping_log_keeps_twenty_episode_rows_verdict_and_severe_first() -> None:
    ws = [win(i, Class.QUEUEING if i % 2 else Class.HEALTHY) for i in range(400)]
    ws[300:303] = [win(i, Class.THRASH_LOOP, preemptions=9.0) for i in range(300, 303)]
    r = thrash_report()
    v = replace(r.verdict, start=T0 + timedelta(minutes=300), end=T0 + timedelta(minutes=303))
    text = render(replace(r, windows=tuple(ws), verdict=v), Format.MARKDOWN)
    table = rows(text, "Episodes")
    shown = [c for c in table if not c[1].startswith("_")]
    omitted = [int(c[1].split()[1]) for c in table if c[1].startswith("_")]
    assert len(shown) == 20
    assert len(shown) + sum(omitted) == 398  # 397 single-window runs and the loop
    assert shown[[c[1] for c in shown].index("`thrash_loop` ◀ verdict")][:4] == [
        "2024-06-17 02:24 → 02:27",
        "`thrash_loop` ◀ verdict",
        "3",
        "27",
    ]
    # After the verdict, queueing (more severe) runs are kept before healthy ones.
    assert sum(c[1] == "`queueing`" for c in shown) == 19


def test_silent_windows_do_not_end_a_run_and_are_counted() -> None:
    ws = [win(i) for i in range(30)] + [win(i) for i in range(90, 120)]  # an hour with no line
    r = replace(thrash_report(), windows=tuple(ws))
    r = replace(
        r, verdict=replace(r.verdict, cls=Class.HEALTHY, start=T0, end=T0 + timedelta(minutes=120))
    )
    text = render(r, Format.MARKDOWN)
    assert rows(text, "Episodes") == [
        ["21:24:00 → 23:24:00", "`healthy` ◀ verdict", "60 (+60 silent)", "0", "40.0", "0", "high"]
    ]
    assert "_silent: windows in a run's span without a log line_" in text


def test_mixed_confidence_names_the_minority() -> None:
    ws = [win(i, confidence=Confidence.LOW if i in (3, 7) else Confidence.HIGH) for i in range(50)]
    ws[9] = replace(ws[9], confidence=Confidence.MEDIUM)
    r = replace(thrash_report(), windows=tuple(ws))
    r = replace(
        r, verdict=replace(r.verdict, cls=Class.HEALTHY, start=T0, end=T0 + timedelta(minutes=50))
    )
    assert rows(render(r, Format.MARKDOWN), "Episodes")[0][-1] == "high (2 low, 1 medium)"


def _suspected_run_between_calm_ones(
    first: datetime, before: int, during: int, after: int
) -> Report:
    """Minute windows from `first`: `before` healthy ones (medium confidence), `during`
    insufficient_evidence ones (the verdict's, the longest class name), `after` healthy."""

    def at(i: int, cls: Class, **kw: Any) -> Any:
        start = first + timedelta(minutes=i)
        return win(i, cls, start=start, end=start + timedelta(minutes=1), **kw)

    calm = {"confidence": Confidence.MEDIUM}
    ws = [at(i, Class.HEALTHY, **calm) for i in range(before)]
    ws += [at(i, Class.INSUFFICIENT_EVIDENCE, kv_max=99.0) for i in range(before, before + during)]
    ws += [at(i, Class.HEALTHY, **calm) for i in range(before + during, before + during + after)]
    r = replace(thrash_report(), windows=tuple(ws))
    verdict = replace(
        r.verdict,
        cls=Class.INSUFFICIENT_EVIDENCE,
        start=first + timedelta(minutes=before),
        end=first + timedelta(minutes=before + during),
    )
    return replace(r, verdict=verdict)


def test_terminal_episode_table_keeps_a_run_across_a_new_year_whole_at_100_columns() -> None:
    # A month-long log over New Year: the first run's from → to names both years, and
    # on one line the table was too wide for 100 columns, so its cells were cut to fit
    # (`2026-01-01 01:…`, `medi…`). The span now breaks after its arrow instead.
    r = _suspected_run_between_calm_ones(datetime(2025, 12, 31, 22, 0, tzinfo=UTC), 180, 10, 60)
    text = render(r, Format.TERMINAL, width=100)
    table = text.split("Episodes — ")[1].split("\n\n")[0].splitlines()[3:]
    assert [ln.split()[:4] for ln in table] == [
        ["2025-12-31", "22:00", "→", "healthy"],
        ["2026-01-01", "01:00"],
        ["01-01", "01:00", "→", "insufficient_evidence"],
        ["01:10"],
        ["01-01", "01:10", "→", "healthy"],
        ["02:10"],
    ]
    assert not any("…" in ln for ln in table)
    assert max(len(ln) for ln in text.splitlines()) <= 100
    # Where one line fits, a span stays on one line.
    wide = render(r, Format.TERMINAL, width=160)
    assert "2025-12-31 22:00 → 2026-01-01 01:00  healthy" in wide


def test_terminal_episode_table_fits_80_columns_with_the_longest_class() -> None:
    # `insufficient_evidence ◀` and two-day spans made the table 94 columns wide; at 80
    # the headers and the confidence were cut (`windo…`, `KV m…`, `medi…`). The spans
    # break after the arrow, then the headers at their spaces.
    r = _suspected_run_between_calm_ones(datetime(2026, 6, 16, 22, 0, tzinfo=UTC), 150, 20, 130)
    text = render(r, Format.TERMINAL, width=80)
    table = text.split("Episodes — ")[1].split("\n\n")[0].splitlines()[1:]
    assert table[:2] == [
        "from → to                                                   KV  wait",
        "(UTC)          class                    windows  preempt   max   max  conf.",
    ]
    assert [ln.split()[:3] for ln in table[3:]] == [
        ["06-16", "22:00", "→"],
        ["06-17", "00:30"],
        ["06-17", "00:30", "→"],
        ["00:50"],
        ["06-17", "00:50", "→"],
        ["03:00"],
    ]
    assert "medium" in table[3] and not any("…" in ln for ln in table)
    assert max(len(ln) for ln in text.splitlines()) <= 80


def test_terminal_episode_table_per_replica() -> None:
    a = [win(i, replica="pod-a") for i in range(50)]
    b = [
        win(i, Class.QUEUEING if 20 <= i < 25 else Class.HEALTHY, replica="pod-b")
        for i in range(50)
    ]
    r = replace(thrash_report(), windows=(*a, *b))
    r = replace(
        r,
        verdict=replace(
            r.verdict, cls=Class.HEALTHY, replica="pod-a", start=T0, end=T0 + timedelta(minutes=50)
        ),
    )
    text = render(r, Format.TERMINAL)
    assert "Episodes — 50 windows in 1 run of one class (◀ the verdict's) — pod-a" in text
    assert "Episodes — 50 windows in 3 runs, one class each (◀ the verdict's) — pod-b" in text
    # pod-b has no verdict: its own most severe episode (queueing) is shown in full.
    after_b = text.split("— pod-b")[2]
    assert re.findall(r"^(\d\d:\d\d):00\s+(\w+)", after_b, re.M)[:11] == [
        (f"21:{m}", "healthy") for m in (41, 42, 43)
    ] + [(f"21:{m}", "queueing") for m in (44, 45, 46, 47, 48)] + [
        (f"21:{m}", "healthy") for m in (49, 50, 51)
    ]


# ---------------------------------------------------------------- json


def test_json_keeps_every_window_by_default_and_lists_episodes() -> None:
    doc = json.loads(render(long_report(), Format.JSON))
    assert doc["timeline"] == "full" and len(doc["windows"]) == 60
    assert [(e["class"], e["windows"], e["verdict"]) for e in doc["episodes"]] == [
        ("healthy", 30, False),
        ("thrash_loop", 3, True),
        ("healthy", 27, False),
    ]
    assert doc["episodes"][1] == {
        "replica": "vllm.log",
        "start": "2024-06-16T21:54:00+00:00",
        "end": "2024-06-16T21:57:00+00:00",
        "class": "thrash_loop",
        "windows": 3,
        "silent_windows": 0,
        "preemptions": 21.0,
        "preemptions_lower_bound": False,
        "preemptions_estimated": False,
        "kv_max": 99.2,
        "waiting_max": 32,
        "running_max": 12,
        "confidence": {"high": 3},
        "verdict": True,
    }


def test_json_episodes_mode_keeps_the_windows_shown_in_full() -> None:
    doc = json.loads(render(long_report(), Format.JSON, timeline="episodes"))
    assert doc["timeline"] == "episodes" and len(doc["episodes"]) == 3
    starts = [w["start"][11:16] for w in doc["windows"]]
    assert starts == [f"21:{m}" for m in range(51, 60)]


@pytest.mark.parametrize("mode", list(TimelineMode))
def test_json_streamed_windows_are_plain_json_dumps(mode: TimelineMode) -> None:
    from preemptdiag.render.json_format import report_dict

    r = long_report()
    text = render(r, Format.JSON, timeline=mode)
    assert text == json.dumps(report_dict(r, timeline=mode), indent=2) + "\n"


# ---------------------------------------------------------------- a month of log


def month_report() -> Report:
    """30 days of healthy one-minute windows, with one known peak."""
    n = 30 * 24 * 60
    base = datetime(2026, 1, 1, tzinfo=UTC)
    ws = []
    for i in range(n):
        kv = 61.5 if i == 20_000 else 30.0 + i % 20
        waiting = 4 if i == 30_000 else 0
        ws.append(
            make_window(
                0, start=base + timedelta(minutes=i), end=base + timedelta(minutes=i + 1),
                kv_max=kv, waiting_max=waiting, cls=Class.HEALTHY, confidence=Confidence.HIGH,
            )
        )  # fmt: skip
    v = Verdict(
        cls=Class.HEALTHY, confidence=Confidence.HIGH, start=base,
        end=base + timedelta(days=30), replica="a.log", why="nothing wrong", evidence=(),
    )  # fmt: skip
    return replace(thrash_report(), windows=tuple(ws), verdict=v)


def test_a_month_of_healthy_windows_is_one_page() -> None:
    r = month_report()
    for width in (80, 100):
        term = render(r, Format.TERMINAL, width=width)
        assert len(term.splitlines()) < 60, term
        assert max(len(ln) for ln in term.splitlines()) <= width
        # the year is in the stamps of the verdict's span; the table needs no more
        assert re.search(
            r"^01-01 00:00 → 01-31 00:00\s+healthy ◀\s+43,200\s+0\s+61\.5\s+4\s+high$",
            term,
            re.M,
        ), term
        assert re.search(r"^01-14 21:20\s+healthy\s+0\s+61\.5\s", term, re.M), term
        shown = term.split("Evidence")[0] if width == 100 else term.split("Timeline")[0]
        assert "…" not in shown.replace("omitted …", "").replace("… ", ""), shown
    md = render(r, Format.MARKDOWN)
    assert len(md.splitlines()) < 150 and len(md.encode()) < 25_000
    assert rows(md, "Episodes") == [
        [
            "2026-01-01 00:00 → 01-31 00:00",
            "`healthy` ◀ verdict",
            "43,200",
            "0",
            "61.5",
            "4",
            "high",
        ]
    ]
    # the worst minute (KV 61.5 % at 2026-01-14 21:20) is among the windows shown
    assert "| 2026-01-14 21:20:00 | `healthy` | 0 | 61.5 |" in md
    assert len(json.loads(render(r, Format.JSON))["windows"]) == 43_200


# A pod's log as kubelet names it (pod_namespace_container-<64 hex>): ~120 characters.
_POD_LOG = "var/log/containers/vllm-7d9f8b6c5-x2x9q_default_vllm-" + "3f1e2d3c" * 8 + ".log"


@pytest.mark.parametrize("name", ["day.log", _POD_LOG])
def test_a_day_of_real_stats_lines_gives_a_one_page_terminal_report(
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = datetime(2026, 3, 2, tzinfo=UTC)
    # line 4000 (11:06:40) carries the day's highest KV, line 7000 (19:26:40) its longest queue
    lines = healthy_v1_log(start, 24 * 60, spikes={4000: (0, 77.7), 7000: (3, 41.0)})
    monkeypatch.chdir(tmp_path)  # the evidence column holds the path as given
    log = Path(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(lines) + "\n")
    for columns in ("80", "100"):  # (a day's report is a month's, line for line)
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["analyze", "--year", "2026", str(log)]) == 0
        out = capsys.readouterr().out
        assert len(out.splitlines()) < 60, out
        assert max(map(len, out.splitlines())) <= int(columns)
        assert re.search(r"^  read +8,64\d lines, [\d.]+ MiB \([\d,]+ bytes\)$", out, re.M), out
    assert re.search(
        r"^00:00:00 → 03-03 00:00:00\s+healthy ◀\s+1,440\s+0\s+77\.7\s+3\s+\w+$", out, re.M
    ), out
    assert re.search(r"^11:06:00\s+healthy\s+0\s+77\.7\b", out, re.M)  # the worst minute
    assert main(["analyze", "--year", "2026", "--format", "markdown", str(log)]) == 0
    md = capsys.readouterr().out
    assert rows(md, "Episodes")[0][:6] == [
        "00:00:00 → 03-03 00:00:00", "`healthy` ◀ verdict", "1,440", "0", "77.7", "3",
    ]  # fmt: skip
    assert main(["analyze", "--year", "2026", "--format", "json", str(log)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["windows"]) == 1440
    assert doc["verdict"]["why"].startswith("8,640 stats line(s) in 1,440 window(s), KV max 77.7%")
    (ep,) = doc["episodes"]
    assert (ep["start"], ep["end"], ep["windows"], ep["kv_max"], ep["waiting_max"]) == (
        "2026-03-02T00:00:00+00:00",
        "2026-03-03T00:00:00+00:00",
        1440,
        77.7,
        3,
    )


def test_timeline_option_is_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "a.log"
    log.write_text("\n".join(healthy_v1_log(datetime(2026, 3, 2, tzinfo=UTC), 50)) + "\n")
    assert main(["analyze", "--year", "2026", "--timeline", "all", str(log)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "preemptdiag: error: --timeline must be one of full, episodes, not 'all'"
    assert main(["analyze", "--year", "2026", "--timeline", "full", "-f", "json", str(log)]) == 0
    assert len(json.loads(capsys.readouterr().out)["windows"]) == 50
    assert (
        main(["analyze", "--year", "2026", "--timeline", "episodes", "-f", "json", str(log)]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["timeline"] == "episodes" and len(doc["windows"]) < 50


# ---------------------------------------------------------------- incident reports


INCIDENTS = [
    ["samples/v0_thrash_loop.log"],
    ["samples/v1_thrash_loop.log"],
    ["samples/sglang_thrash.log"],
    ["samples/v1_cuda_oom.log"],
    ["samples/v1_queueing.log"],
    ["samples/v0_benign_preemption.log"],
    ["samples/host_oom_incident/engine.log", "samples/host_oom_incident/dmesg.log",
     "samples/host_oom_incident/describe.txt"],
]  # fmt: skip
ENGINE = ROOT / "tests/fixtures/engine/vllm-0.32.0"
for _case in ("thrash_loop", "queueing", "benign_preemption", "healthy"):
    _scrapes = sorted(str(p.relative_to(ROOT)) for p in (ENGINE / _case).glob("metrics-*.prom"))
    INCIDENTS.append([str((ENGINE / _case / "server.log").relative_to(ROOT)), *_scrapes])


@pytest.mark.parametrize(
    "files", INCIDENTS, ids=[Path(f[0]).parent.name + "/" + Path(f[0]).name for f in INCIDENTS]
)
def test_incident_reports_show_the_verdicts_windows_in_full(
    files: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    main(["analyze", "--year", "2026", "--format", "json", *files])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    v = doc["verdict"]
    mine = [
        w for w in doc["windows"]
        if w["class"] == v["class"] and w["replica"] == v["replica"]
        and v["start"] <= w["start"] and w["start"] < v["end"]
    ]  # fmt: skip
    assert mine, v
    main(["analyze", "--year", "2026", "--format", "markdown", *files])
    md = capsys.readouterr().out
    timeline = md.split("#### Timeline")[1].split("####")[0]
    for w in mine:
        assert re.search(rf"\| {w['start'][11:19]} \|(?: [^|]+ \|)? `{v['class']}` \|", timeline), w
    assert "omitted" not in timeline


def _verdict(start: datetime | None, end: datetime | None, replica: str = "") -> Verdict:
    return Verdict(
        cls=Class.THRASH_LOOP,
        confidence=Confidence.HIGH,
        start=start,
        end=end,
        replica=replica,
        why="",
        evidence=(),
    )


def test_in_episode_same_class_replica_and_span_bounds_included_any_zone() -> None:
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    east = timezone(timedelta(hours=5))
    ws = [
        make_window(0, replica="a", cls=Class.THRASH_LOOP, start=t0),  # the first
        make_window(0, replica="a", cls=Class.THRASH_LOOP, start=t0.astimezone(east)),
        make_window(0, replica="a", cls=Class.THRASH_LOOP, start=t0 + timedelta(minutes=2)),
        make_window(0, replica="a", cls=Class.THRASH_LOOP, start=t0 + timedelta(minutes=3)),
        make_window(0, replica="a", cls=Class.THRASH_LOOP, start=t0 - timedelta(minutes=1)),
        make_window(0, replica="a", cls=Class.QUEUEING, start=t0 + timedelta(minutes=1)),
        make_window(0, replica="b", cls=Class.THRASH_LOOP, start=t0 + timedelta(minutes=1)),
        make_window(0, replica="a", cls=Class.THRASH_LOOP, start=None),
    ]
    until = t0 + timedelta(minutes=2)
    assert in_episode(ws, _verdict(t0, until, "a")) == [True, True, True] + [False] * 5
    # (no replica named: any replica's; no end: open-ended)
    assert in_episode(ws, _verdict(t0, None)) == [True, True, True, True, False, False, True, False]
    assert in_episode(ws, _verdict(None, until, "a")) == [False] * 8


# ------------------------------------- read a column at a time, as a window at a time


def _episode_one_at_a_time(ws: list[Any], first: int, last: int, verdict: bool) -> Episode:
    """episodes._episode as it was, a window and property at a time."""
    run = ws[first : last + 1]
    start, end = run[0].start, run[-1].end
    silent = max(0, round((end - start).total_seconds() / 60) - len(run))
    counts = Counter(w.confidence for w in run)
    order = list(Confidence)

    def peak(values: list[Any]) -> Any:
        present = [v for v in values if v is not None and v == v]
        return max(present) if present else None

    kv, waiting, running = (peak([getattr(w, a) for w in run]) for a in _PEAKS)
    return Episode(
        replica=run[0].replica,
        cls=run[0].cls,
        first=first,
        n=len(run),
        verdict=verdict,
        start=start,
        end=end,
        silent=silent,
        preemptions=round(sum(w.preemptions for w in run), 2),
        preemptions_lower_bound=any(w.preemptions_lower_bound for w in run),
        preemptions_estimated=any(w.preemptions_spread_over and w.preemptions for w in run),
        kv_max=None if kv is None else float(kv),
        waiting_max=None if waiting is None else int(waiting),
        running_max=None if running is None else int(running),
        confidence=tuple(sorted(counts.items(), key=lambda c: (-c[1], order.index(c[0])))),
    )


_PEAKS = ("kv_max", "waiting_max", "running_max")
_WIN = st.builds(
    lambda cls, conf, pre, kv, wait: (cls, conf, pre, kv, wait),
    st.sampled_from([Class.HEALTHY, Class.QUEUEING, Class.THRASH_LOOP]),
    st.sampled_from(list(Confidence)),
    st.sampled_from([0.0, 0.0, 3.0, 7.5]),
    st.one_of(st.none(), st.just(float("nan")), st.floats(0, 100)),
    st.one_of(st.none(), st.integers(0, 9)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WIN, min_size=1, max_size=40), st.integers(0, 40), st.integers(1, 8))
def test_episodes_read_a_column_at_a_time_are_the_window_at_a_time_ones(
    made: list[Any], at: int, span: int
) -> None:
    ws = [
        make_window(
            i,
            cls=cls,
            confidence=conf,
            preemptions=pre,
            kv_max=kv,
            waiting_max=wait,
            running_max=wait,
        )
        for i, (cls, conf, pre, kv, wait) in enumerate(made)
    ]
    v = Verdict(
        cls=ws[min(at, len(ws) - 1)].cls,
        confidence=Confidence.HIGH,
        start=ws[0].start + timedelta(minutes=at),
        end=ws[0].start + timedelta(minutes=at + span),
        replica=ws[0].replica,
        why="",
        evidence=(),
    )
    mine = in_episode(ws, v)
    want, i = [], 0
    while i < len(ws):
        j = i
        while j + 1 < len(ws) and ws[j + 1].cls is ws[i].cls and mine[j + 1] == mine[i]:
            j += 1
        want.append(_episode_one_at_a_time(ws, i, j, mine[i]))
        i = j + 1
    got = episodes(ws, v, 60)
    assert repr(got) == repr(want)  # (repr: a NaN peak is not equal to itself)
    severity = [
        (w.preemptions, w.kv_max if w.kv_max is not None and w.kv_max == w.kv_max else -1.0,
         w.waiting_max if w.waiting_max is not None else -1)
        for w in ws
    ]  # fmt: skip
    assert _worst(ws) == max(range(len(ws)), key=lambda i: (severity[i], -i))
