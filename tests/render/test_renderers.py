"""Renderers: every format shows the same report content; format-specific rules hold."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from builders import make_window

from preemptdiag.model.records import (
    Class,
    Confidence,
    EngineInfo,
    Event,
    Fact,
    Kind,
    Lever,
    ReplicaFacts,
    Report,
    ScanStats,
    Verdict,
    Window,
)
from preemptdiag.render import Format, render
from preemptdiag.render.common import sparkline
from preemptdiag.render.markdown import fence_for

ANSI = re.compile(r"\x1b\[")
T0 = datetime(2024, 6, 16, 21, 24, 0, tzinfo=UTC)
THRESHOLDS = {"kv_pressure_pct": 95.0, "thrash_min_windows": 3}


def ev(line: int, text: str, *, kind: Kind = Kind.PREEMPTION, minute: int = 1) -> Event:
    return Event(
        source="vllm.log",
        line=line,
        sig="vllm.v0.preempt_warning",
        kind=kind,
        ts=T0 + timedelta(minutes=minute),
        fields={},
        text=text,
        replica="vllm.log",
    )


def win(i: int, cls: Class = Class.HEALTHY, **kw: Any) -> Window:
    base: dict[str, Any] = dict(
        replica="vllm.log", n_events=6, n_stats=6, kv_max=40.0, kv_mean=35.0, running_max=12,
        running_mean=10.0, swapped_first=None, swapped_last=None, swapped_max=None,
        prompt_tput=800.0, gen_tput=450.5, cls=cls, confidence=Confidence.HIGH,
        waiting_share=None, start=T0 + timedelta(minutes=i), end=T0 + timedelta(minutes=i + 1),
    )  # fmt: skip
    base.update(kw)
    return make_window(i, **base)


PREEMPT_TEXT = (
    "WARNING 06-16 21:25:03 scheduler.py:1089] Sequence group 7 is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
    "total_num_cumulative_preemption=51"
)


def thrash_report() -> Report:
    evidence = (
        ev(120, PREEMPT_TEXT),
        ev(
            245,
            "INFO 06-16 21:26:10 metrics.py:341] Avg prompt throughput: 9120.4 tokens/s, "
            "Running: 48 reqs, Pending: 31 reqs, GPU KV cache usage: 99.8%",
            kind=Kind.STATS,
            minute=2,
        ),
    )
    windows = (
        win(0, Class.HEALTHY),
        win(
            1,
            Class.THRASH_LOOP,
            preemptions=51.0,
            preemptions_lower_bound=True,
            kv_max=99.8,
            running_max=48,
            waiting_first=3,
            waiting_last=31,
            waiting_max=31,
            prompt_tput=9120.4,
            gen_tput=120.0,
            evidence=evidence[:1],
        ),
        win(
            2,
            Class.THRASH_LOOP,
            preemptions=50.0,
            kv_max=100.0,
            running_max=48,
            waiting_first=31,
            waiting_last=40,
            waiting_max=40,
            evidence=evidence[1:],
        ),
        win(
            3,
            Class.THRASH_LOOP,
            preemptions=49.5,
            kv_max=98.5,
            running_max=47,
            waiting_first=40,
            waiting_last=52,
            waiting_max=52,
            prompt_tput=None,
        ),
    )
    verdict = Verdict(
        cls=Class.THRASH_LOOP,
        confidence=Confidence.HIGH,
        start=T0 + timedelta(minutes=1),
        end=T0 + timedelta(minutes=4),
        replica="vllm.log",
        why="preemption in 3 consecutive windows with KV pinned at 98.5-100%",
        evidence=evidence,
    )
    lever = Lever(
        knob="--max-num-seqs",
        current="256",
        proposed="96",
        arithmetic=(
            "KV tokens = 43,664 (GPU KV cache size)",
            "live tokens per seq = 0.998 × 43,664 / 48 = 908",
            "floor(0.9 × 43,664 / 908) = 43 → 96 after the p95 correction",
        ),
        verify="preemptions per minute → 0; completed req/s must not fall",
        do_not="do not push --gpu-memory-utilization toward 1.0",
        rationale="sustained preemption with KV pinned: fewer concurrent sequences fit",
    )
    return Report(
        verdict=verdict,
        lever=lever,
        windows=windows,
        engine=EngineInfo("vllm", "v0", "0.6.3"),
        stats=ScanStats(
            files=("vllm.log",),
            lines_read=1200,
            bytes_read=2_500_000,
            recognised={"vllm.stats": 40, "vllm.preempt": 3},
            skipped={"invalid_utf8": 2},
        ),
        thresholds=THRESHOLDS,
        window_seconds=60,
        notes=("V0 preemption warnings are sampled; counts come from the cumulative counter",),
        tool_version="0.1.0",
    )


def no_evidence_report() -> Report:
    verdict = Verdict(
        cls=Class.INSUFFICIENT_EVIDENCE,
        confidence=Confidence.LOW,
        start=None,
        end=None,
        replica="",
        why="no line matched a known signature",
        evidence=(),
        evidence_found=False,
    )
    lever = Lever(
        knob=None,
        current=None,
        proposed=None,
        arithmetic=(),
        verify="rerun on the engine's stdout",
        do_not="do not guess a knob",
        rationale="nothing to change without evidence",
    )
    return Report(
        verdict=verdict,
        lever=lever,
        windows=(),
        engine=EngineInfo("unknown", None, None),
        stats=ScanStats(("app.log",), 10, 300, {}, {}),
        thresholds=THRESHOLDS,
        window_seconds=60,
        tool_version="0.1.0",
    )


def suspected_report() -> Report:
    stats_ev = Event(
        source="pod/vllm-0/engine",
        line=77,
        sig="vllm.v1.stats",
        kind=Kind.STATS,
        ts=T0,
        fields={},
        text="Engine 000: GPU KV cache usage: 100.0%, Waiting: 12 reqs | `x`",
        replica="pod-a",
    )
    windows = (
        win(0, Class.INSUFFICIENT_EVIDENCE, replica="pod-a", kv_max=100.0, swapped_max=4),
        win(0, Class.HEALTHY, replica="pod-b", kv_max=20.0),
    )
    verdict = Verdict(
        cls=Class.INSUFFICIENT_EVIDENCE,
        confidence=Confidence.LOW,
        start=T0,
        end=T0 + timedelta(minutes=1),
        replica="pod-a",
        why="KV pinned at 100% with a growing queue, but V1 logs no preemptions",
        evidence=(stats_ev,),
        suspected=True,
        capture_next="a /metrics scrape before and after (vllm:num_preemptions_total)",
        cause="host_pressure",
        consequence="allocation_failure",
    )
    lever = Lever(
        knob=None,
        current=None,
        proposed=None,
        arithmetic=(),
        verify="capture metrics",
        do_not="do not lower max-num-seqs blind",
        rationale="preemption not proven",
    )
    return Report(
        verdict=verdict,
        lever=lever,
        windows=windows,
        engine=EngineInfo("vllm", "v1", None),
        stats=ScanStats(("a.log", "b.log"), 50, 5000, {"vllm.stats": 12}, {}),
        thresholds=THRESHOLDS,
        window_seconds=60,
    )


REPORTS = {"thrash": thrash_report, "none": no_evidence_report, "suspected": suspected_report}
ALL = list(Format)


def out(name: str, fmt: Format, **kw: Any) -> str:
    return render(REPORTS[name](), fmt, **kw)


# ---------------------------------------------------------------- content in every format


@pytest.mark.parametrize("fmt", ALL)
@pytest.mark.parametrize("name", list(REPORTS))
def test_verdict_class_and_confidence_in_every_format(name: str, fmt: Format) -> None:
    v = REPORTS[name]().verdict
    text = out(name, fmt)
    assert str(v.cls) in text
    assert str(v.confidence) in text
    assert text.endswith("\n") and not text.endswith("\n\n")


@pytest.mark.parametrize("fmt", [Format.TERMINAL, Format.MARKDOWN])
def test_human_formats_show_evidence_location_lever_and_footer(fmt: Format) -> None:
    text = out("thrash", fmt)
    assert "vllm.log:120" in text and "vllm.log:245" in text
    assert "total_num_cumulative_preemption=51" in text
    assert "--max-num-seqs: 256 → 96" in text
    assert "floor(0.9 × 43,664 / 908) = 43" in text
    assert "preemptions per minute → 0" in text
    assert "do not push --gpu-memory-utilization toward 1.0" in text
    assert "2024-06-16T21:25:00+00:00 → 2024-06-16T21:28:00+00:00" in text
    assert "vllm.preempt=3, vllm.stats=40" in text  # sorted per family
    assert "invalid_utf8=2" in text
    if fmt is Format.MARKDOWN:
        assert "kv_pressure_pct=95, thrash_min_windows=3" in text
    else:  # (a page-long report names only the thresholds changed: none here)
        assert re.search(r"^  thresholds +the defaults \(all listed in --format", text, re.M)
    assert "vllm v0 0.6.3" in text
    assert "2.4 MiB (2,500,000 bytes)" in text
    assert "60 s" in text
    assert "cumulative counter" in text  # the note


def test_a_terminal_report_names_only_the_thresholds_changed() -> None:
    r = replace(thrash_report(), thresholds={**THRESHOLDS, "kv_pressure_pct": 90.0})
    term = render(r, Format.TERMINAL)
    assert re.search(r"^  thresholds +kv_pressure_pct=90; the others the defaults$", term, re.M)
    # (the markdown, for a runbook, lists every one)
    assert "kv_pressure_pct=90, thrash_min_windows=3" in render(r, Format.MARKDOWN)


# A pod's log path as kubelet names it: ~130 characters.
POD_LOG = (
    "/var/log/containers/vllm-7d9f8b6c5-x2x9q_default_vllm-"
    "3f1e2d3c4b5a69788796a5b4c3d2e1f00112233445566778899aabbccddeeff0.log"
)


def _pod_report(files: tuple[str, ...]) -> Report:
    """thrash_report's, read from POD_LOG (and `files`), its replica's facts cited."""
    r = thrash_report()
    evidence = tuple(replace(e, source=POD_LOG) for e in r.verdict.evidence)
    facts = ReplicaFacts(
        replica=POD_LOG,
        engine=EngineInfo("vllm", "v0", "0.6.3"),
        start=datetime(2024, 6, 16, 21, 0, tzinfo=UTC),
        end=datetime(2024, 6, 16, 21, 30, tzinfo=UTC),
        dated_by=("--year 2024",),
        facts=(Fact("max_num_seqs", "256", f"{POD_LOG}:2"), Fact("kv_tokens", "43664", "b.log:7")),
    )
    return replace(
        r,
        verdict=replace(r.verdict, evidence=evidence, replica=POD_LOG),
        stats=replace(r.stats, files=files),
        replicas=(facts,),
    )


@pytest.mark.parametrize("width", [80, 100])
def test_a_long_path_is_said_once_over_its_evidence_lines(width: int) -> None:
    # Beside a 130-character path, an evidence line's text was a column a few words
    # wide: the path now has its row, each line's text the width under it.
    term = render(_pod_report((POD_LOG,)), Format.TERMINAL, width=width)
    shown = term.split("Evidence\n")[1].split("\n\n")[0].splitlines()
    assert "".join(ln.strip() for ln in shown[: -(-(len(POD_LOG) + 2) // width)]) == POD_LOG
    rows = [ln for ln in shown if re.match(r"^    line \d+  ", ln)]
    assert [ln.split()[1] for ln in rows] == ["120", "245"]
    assert rows[0].startswith("    line 120  WARNING 06-16 21:25:03 scheduler.py:1089] Sequence")
    assert max(map(len, term.splitlines())) <= width


def test_the_replica_row_cites_its_own_files_lines_by_number() -> None:
    # One replica named by the one file read: the files row says its name; a fact of
    # its own file is `line N`, of another its file and line.
    term = render(_pod_report((POD_LOG,)), Format.TERMINAL, width=200)
    assert re.search(
        r"^  replica +vllm v0 0\.6\.3, 2024-06-16 21:00–21:30 \(dated by --year 2024\); "
        r"max_num_seqs=256 \[line 2\], kv_tokens=43664 \[b\.log:7\]$",
        term,
        re.M,
    ), term
    two = render(_pod_report((POD_LOG, "b.log")), Format.TERMINAL, width=400)
    assert f"  replica       {POD_LOG}: vllm v0 0.6.3, " in two
    # (the markdown, for a runbook, cites every fact's file)
    assert f"max_num_seqs=256 [{POD_LOG}:2]" in render(_pod_report((POD_LOG,)), Format.MARKDOWN)


@pytest.mark.parametrize("fmt", [Format.TERMINAL, Format.MARKDOWN])
def test_human_formats_say_no_evidence_and_no_change(fmt: Format) -> None:
    text = out("none", fmt)
    assert "no vLLM evidence found" in text
    assert "no timestamps" in text
    assert "no change" in text
    assert "nothing to change without evidence" in text


@pytest.mark.parametrize("fmt", [Format.TERMINAL, Format.MARKDOWN])
def test_human_formats_say_suspected_capture_next_and_cause(fmt: Format) -> None:
    text = out("suspected", fmt)
    assert "suspected, not proven" in text
    assert "a /metrics scrape before and after (vllm:num_preemptions_total)" in text
    assert "host_pressure → consequence: allocation_failure" in text
    assert "pod/vllm-0/engine:77" in text


# ---------------------------------------------------------------- timeline


def test_timeline_cells_date_once_lower_bound_and_dashes() -> None:
    text = out("thrash", Format.MARKDOWN)
    rows = [ln for ln in text.splitlines() if ln.startswith("| 21:")]
    assert rows[1] == ("| 21:25:00 | `thrash_loop` | 51+ | 99.8 | 48 | 3→31 | 9120.4 | 120.0 |")
    assert rows[3].split(" | ")[2] == "50"  # 49.5 rounds half up, no "+": exact count
    assert rows[3].split(" | ")[-2] == "–"  # missing prompt throughput
    assert "#### Timeline (60 s windows, 2024-06-16 UTC)" in text
    assert "replica" not in text.split("#### Timeline")[1].splitlines()[2]  # single replica
    assert "swapped" not in text  # no window has a swapped count


def test_timeline_replica_and_swapped_columns_when_present() -> None:
    text = out("suspected", Format.MARKDOWN)
    assert (
        "| start (UTC) | replica | class | preemptions | KV max % | running max | waiting "
        "| swapped max | prompt tok/s | gen tok/s |"
    ) in text
    assert "| 21:24:00 | pod-b | `healthy` | 0 | 20.0 | 12 | 0→0 | – | 800.0 | 450.5 |" in text


def test_dates_per_row_when_windows_span_days() -> None:
    r = thrash_report()
    r = replace(r, windows=(*r.windows, win(60 * 24, Class.HEALTHY)))
    text = render(r, Format.MARKDOWN)
    assert "| 2024-06-17 21:24:00 |" in text
    assert "#### Timeline (60 s windows)" in text


def test_sparklines_scale_and_label() -> None:
    assert sparkline([0, 1, 200, None]) == "▁▂█·"
    assert sparkline([0.0, 50.0, 100.0], top=100.0) == "▁▅█"
    text = out("thrash", Format.MARKDOWN)
    assert "- KV max %: `▄███` (top = 100)" in text
    assert "- preemptions: `▁███` (top = 51+)" in text


# ---------------------------------------------------------------- markdown


def test_markdown_heading_escaping_and_fenced_evidence() -> None:
    text = out("suspected", Format.MARKDOWN)
    assert "\x1b" not in text
    assert text.startswith("### preemptdiag: insufficient_evidence (low)\n")
    # The evidence line contains a `|` and backticks: it sits in a fenced text block.
    assert (
        # its time in front: the wrapper stamp the scan read off (render/common.stamped)
        "```text\npod/vllm-0/engine:77  [2024-06-16 21:24:00] Engine 000: GPU KV cache "
        "usage: 100.0%, "
        "Waiting: 12 reqs | `x`\n```"
    ) in text
    assert fence_for("a ``` b") == "````"


def test_markdown_table_cell_escapes_pipes() -> None:
    r = suspected_report()
    r = replace(r, windows=tuple(replace(w, replica=w.replica + "|x") for w in r.windows))
    assert "| 21:24:00 | pod-b\\|x | `healthy` |" in render(r, Format.MARKDOWN)


def test_evidence_truncated_and_capped() -> None:
    r = thrash_report()
    many = tuple(ev(i, "x" * 300) for i in range(1, 11))
    r = replace(r, verdict=replace(r.verdict, evidence=many))
    text = render(r, Format.MARKDOWN)
    assert f"vllm.log:1  [2024-06-16 21:25:00] {'x' * 177}…\n" in text
    assert "vllm.log:8  " in text and "vllm.log:9  " not in text
    assert "2 more evidence line(s)" in text
    assert len(json.loads(render(r, Format.JSON))["verdict"]["evidence"]) == 10


# ---------------------------------------------------------------- terminal


def test_terminal_colour_only_when_asked() -> None:
    plain = out("thrash", Format.TERMINAL, color=False)
    coloured = out("thrash", Format.TERMINAL, color=True)
    assert not ANSI.search(plain)
    assert "\x1b[31m" in coloured or "\x1b[1;31m" in coloured  # thrash_loop in red
    assert "\x1b[32mhealthy" in coloured
    assert ANSI.sub("", re.sub(r"\x1b\[[0-9;]*m", "", coloured)) == plain


def test_terminal_never_truncates_the_class_at_default_width() -> None:
    text = out("suspected", Format.TERMINAL)
    rows = [ln.split() for ln in text.splitlines()]
    # Several replicas: one timeline each, titled by the replica, no replica column.
    assert "s windows, " in text and "— pod-a" in text and "— pod-b" in text
    assert [
        "21:24:00",
        "insufficient_evidence",
        "0",
        "100.0",
        "12",
        "0→0",
        "4",
        "800.0",
        "450.5",
    ] in rows
    after_b = text[text.index("— pod-b") :]
    assert ["KV", "max", "%", "▃", "(top", "=", "100)"] in [
        ln.split() for ln in after_b.splitlines()
    ]
    assert not any(ln != ln.rstrip() for ln in out("thrash", Format.TERMINAL).splitlines())


def test_terminal_width_and_markup_safety() -> None:
    r = thrash_report()
    e = replace(r.verdict.evidence[0], text="[bold]not markup[/bold] :smile: \x1b[31mred")
    r = replace(r, verdict=replace(r.verdict, evidence=(e,)))
    text = render(r, Format.TERMINAL, width=80)
    assert "[bold]not markup[/bold] :smile: \ufffd[31mred" in text
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "51+" in text


# ---------------------------------------------------------------- json


def test_json_structure_and_verdict_fields() -> None:
    doc = json.loads(out("thrash", Format.JSON))
    assert list(doc) == [
        "schema",
        "schema_version",
        "tool_version",
        "verdict",
        "lever",
        "windows",
        "engine",
        "scan",
        "thresholds",
        "window_seconds",
        "notes",
        "replicas",
        "timeline",
        "episodes",
    ]
    assert doc["schema"] == "preemptdiag/report" and doc["schema_version"] == 1
    v = doc["verdict"]
    assert {k: v[k] for k in v if k != "evidence"} == {
        "class": "thrash_loop",
        "confidence": "high",
        "start": "2024-06-16T21:25:00+00:00",
        "end": "2024-06-16T21:28:00+00:00",
        "replica": "vllm.log",
        "why": "preemption in 3 consecutive windows with KV pinned at 98.5-100%",
        "evidence_found": True,
        "filtered_out": False,
        "suspected": False,
        "capture_next": None,
        "cause": None,
        "consequence": None,
    }
    assert v["evidence"][0] == {
        "file": "vllm.log",
        "line": 120,
        "signature": "vllm.v0.preempt_warning",
        "kind": "preemption",
        "text": PREEMPT_TEXT,
        "ts": "2024-06-16T21:25:00+00:00",
    }
    assert doc["lever"]["proposed"] == "96" and len(doc["lever"]["arithmetic"]) == 3
    w1 = doc["windows"][1]
    assert (w1["class"], w1["preemptions"], w1["preemptions_lower_bound"]) == (
        "thrash_loop",
        51.0,
        True,
    )
    assert w1["evidence"][0]["line"] == 120
    assert doc["scan"]["recognised"] == {"vllm.preempt": 3, "vllm.stats": 40}
    assert list(doc["scan"]["recognised"]) == ["vllm.preempt", "vllm.stats"]
    assert doc["engine"] == {"engine": "vllm", "generation": "v0", "version": "0.6.3"}
    assert doc["thresholds"] == THRESHOLDS and doc["window_seconds"] == 60
    assert "exit_code" not in doc


def test_json_no_evidence_and_nan() -> None:
    r = no_evidence_report()
    r = replace(r, windows=(win(0, kv_max=float("nan")),))
    doc = json.loads(render(r, Format.JSON))
    assert doc["verdict"]["evidence_found"] is False and doc["verdict"]["start"] is None
    assert doc["verdict"]["evidence"] == [] and doc["lever"]["knob"] is None
    assert doc["windows"][0]["kv_max"] is None  # NaN is not JSON


def test_json_naive_datetime_read_as_utc() -> None:
    r = thrash_report()
    r = replace(r, verdict=replace(r.verdict, start=datetime(2024, 1, 2, 3, 4, 5)))
    assert json.loads(render(r, Format.JSON))["verdict"]["start"] == "2024-01-02T03:04:05+00:00"


# ---------------------------------------------------------------- sarif


def test_sarif_structure() -> None:
    doc = json.loads(out("thrash", Format.SARIF))
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    (run,) = doc["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "preemptdiag" and driver["version"] == "0.1.0"
    assert [r["id"] for r in driver["rules"]] == [str(c) for c in Class]
    assert all(r["shortDescription"]["text"] for r in driver["rules"])
    results = run["results"]
    assert len(results) == 2
    first = results[0]
    assert first["ruleId"] == "thrash_loop" and first["level"] == "error"
    assert driver["rules"][first["ruleIndex"]]["id"] == "thrash_loop"
    assert first["message"]["text"] == thrash_report().verdict.why
    loc = first["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "vllm.log"
    assert loc["region"]["startLine"] == 120
    assert [r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in results] == [
        120,
        245,
    ]


@pytest.mark.parametrize(
    ("cls", "level"),
    [
        (Class.ALLOCATION_FAILURE, "error"),
        (Class.HOST_PRESSURE, "error"),
        (Class.BENIGN_PREEMPTION, "warning"),
        (Class.INSUFFICIENT_EVIDENCE, "warning"),
        (Class.QUEUEING, "note"),
        (Class.HEALTHY, "note"),
    ],
)
def test_sarif_levels(cls: Class, level: str) -> None:
    r = thrash_report()
    r = replace(r, verdict=replace(r.verdict, cls=cls))
    result = json.loads(render(r, Format.SARIF))["runs"][0]["results"][0]
    assert (result["ruleId"], result["level"]) == (str(cls), level)


def test_sarif_no_evidence_and_uri_encoding() -> None:
    run = json.loads(out("none", Format.SARIF))["runs"][0]
    assert run["results"] == []
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert notes[0]["message"]["text"] == "no vLLM evidence found"
    run = json.loads(out("suspected", Format.SARIF))["runs"][0]
    uri = run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "pod/vllm-0/engine"
    r = thrash_report()
    e = replace(r.verdict.evidence[0], source="my logs/v llm.log")
    r = replace(r, verdict=replace(r.verdict, evidence=(e,)))
    loc = json.loads(render(r, Format.SARIF))["runs"][0]["results"][0]["locations"][0]
    assert loc["physicalLocation"]["artifactLocation"]["uri"] == "my%20logs/v%20llm.log"


def test_render_accepts_plain_string_format() -> None:
    assert render(thrash_report(), "json") == render(thrash_report(), Format.JSON)  # type: ignore[arg-type]


def test_every_json_key_is_documented() -> None:
    doc_text = (Path(__file__).parents[2] / "docs" / "json-schema.md").read_text()
    doc = json.loads(out("thrash", Format.JSON))
    objects = [
        doc,
        doc["verdict"],
        doc["verdict"]["evidence"][0],
        doc["lever"],
        doc["engine"],
        doc["scan"],
        doc["windows"][0],
        doc["episodes"][0],
    ]
    keys = {k for o in objects for k in o}
    assert keys and all(f"`{k}`" in doc_text for k in keys), keys


@pytest.mark.parametrize("make", [no_evidence_report, thrash_report])
def test_json_windows_streamed_into_the_text_are_plain_json_dumps(make: Any) -> None:
    from preemptdiag.render.json_format import report_dict

    r = make()
    assert render(r, Format.JSON) == json.dumps(report_dict(r), indent=2) + "\n"


def test_a_long_evidence_line_keeps_its_proof_in_view() -> None:
    from preemptdiag.render.common import truncate

    stats = (
        "(APIServer pid=1) INFO 12-09 14:06:30 [loggers.py:236] Engine 000: Avg prompt "
        "throughput: 942.3 tokens/s, Avg generation throughput: 1309.0 tokens/s, Running: 87 "
        "reqs, Waiting: 20 reqs, Preemptions: 28, GPU KV cache usage: 99.9%, Prefix cache hit "
        "rate: 12.8%, External prefix cache hit rate: 3.0%"
    )
    short = truncate(stats, 150)
    assert len(short) <= 150
    assert short.endswith(
        "Running: 87 reqs, Waiting: 20 reqs, Preemptions: 28, GPU KV cache usage: 99.9%"
    )
    assert short.startswith("(APIServer pid=1) INFO 12-09 14:06:30")
    warn = (
        "WARNING 11-04 16:05:21 scheduler.py:1481] Sequence group chat-1e26 is preempted by "
        "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can "
        "affect the end-to-end performance. Increase gpu_memory_utilization or "
        "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=51"
    )
    cut = truncate(warn, 160)
    assert len(cut) <= 160 and cut.endswith("… total_num_cumulative_preemption=51")
    assert "Sequence group chat-1e26 is preempted" in cut
