"""Several replicas on one timeline: per-replica windows, who failed first, time filters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preemptdiag.cli import main

STATS = (
    "INFO 03-02 11:{m:02d}:{s:02d} metrics.py:351] Avg prompt throughput: 2500.0 tokens/s, "
    "Avg generation throughput: 400.0 tokens/s, Running: 50 reqs, Swapped: 0 reqs, "
    "Pending: {p} reqs, GPU KV cache usage: 99.5%, CPU KV cache usage: 0.0%."
)
WARN = (
    "WARNING 03-02 11:{m:02d}:{s:02d} scheduler.py:1560] Sequence group g{n} is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect "
    "the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to "
    "provide more KV cache memory. total_num_cumulative_preemption={n}"
)


def thrashing_replica(path: Path, first_minute: int) -> None:
    lines = []
    for k, m in enumerate(range(first_minute, first_minute + 4)):
        lines.append(WARN.format(m=m, s=1, n=1 + 50 * k))
        lines += [STATS.format(m=m, s=s, p=10 * k + s // 10) for s in range(5, 60, 10)]
    path.write_text("\n".join(lines) + "\n")


def test_first_replica_to_fail_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b = tmp_path / "replica-a.log", tmp_path / "replica-b.log"
    thrashing_replica(a, first_minute=10)
    thrashing_replica(b, first_minute=5)
    code = main(["analyze", "--year", "2025", "-f", "json", str(a), str(b)])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["verdict"]["class"] == "thrash_loop"
    assert report["verdict"]["replica"] == str(b)
    assert {w["replica"] for w in report["windows"]} == {str(a), str(b)}
    assert f"first replica to fail: {b}; order: {b} (thrash_loop at 11:05:00), then {a}" in (
        " ".join(report["notes"])
    )


def test_since_and_until_cut_the_timeline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    p = tmp_path / "r.log"
    thrashing_replica(p, first_minute=10)
    main(
        [
            "analyze",
            "--year",
            "2025",
            "-f",
            "json",
            "--since",
            "2025-03-02T11:11:00Z",
            "--until",
            "2025-03-02T11:13:00Z",
            str(p),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert [w["start"][11:16] for w in report["windows"]] == ["11:11", "11:12"]


def healthy_replica(path: Path, first_minute: int) -> None:
    lines = [
        STATS.format(m=m, s=s, p=0).replace("99.5%", "20.0%")
        for m in range(first_minute, first_minute + 4)
        for s in range(5, 60, 10)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("fmt", ["terminal", "markdown"])
def test_reports_lead_with_the_verdicts_replica(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    # Name order put the healthy a-0 above the thrashing b-1 the verdict names.
    a, b = tmp_path / "a-0.log", tmp_path / "b-1.log"
    healthy_replica(a, first_minute=5)
    thrashing_replica(b, first_minute=5)
    assert main(["analyze", "--year", "2025", "-f", fmt, str(a), str(b)]) == 1
    out = capsys.readouterr().out
    timeline = out[out.index("Timeline") :]
    thrash, healthy = timeline.index("thrash_loop"), timeline.index("healthy")
    assert thrash < healthy
    assert timeline.index(str(b)) < timeline.index(str(a)) < healthy


def test_json_keeps_replicas_in_name_order(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = tmp_path / "a-0.log", tmp_path / "b-1.log"
    healthy_replica(a, first_minute=5)
    thrashing_replica(b, first_minute=5)
    main(["analyze", "--year", "2025", "-f", "json", str(a), str(b)])
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["replica"] == str(b)
    assert [w["replica"] for w in report["windows"]] == [str(a)] * 4 + [str(b)] * 4


@pytest.mark.parametrize(
    ("args", "tail"),
    [
        ([], "read as UTC: cross-file order is approximate (use --year/--tz)"),
        (["--year", "2025"], "read as UTC: cross-file order is approximate (use --tz)"),
        (
            ["--year", "2025", "--tz", "Europe/Berlin"],
            "read as Europe/Berlin: cross-file order holds if every file was written in that zone",
        ),
    ],
)
def test_the_alignment_note_asks_only_for_what_was_not_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], tail: str
) -> None:
    a, b = tmp_path / "a-0.log", tmp_path / "b-1.log"
    healthy_replica(a, first_minute=5)
    thrashing_replica(b, first_minute=5)
    main(["analyze", "-f", "json", *args, str(a), str(b)])
    notes = json.loads(capsys.readouterr().out)["notes"]
    aligned = [n for n in notes if n.startswith("timestamps without a year/zone in ")]
    assert len(aligned) == 1
    assert aligned[0].endswith(tail)


def stats_over(path: Path, stamps: list[str]) -> None:
    """One healthy V0 stats line at each `MM-DD HH:MM:SS` stamp."""
    line = STATS.replace("03-02 11:{m:02d}:{s:02d}", "{ts}").replace("99.5%", "20.0%")
    path.write_text("".join(line.format(ts=ts, p=0) + "\n" for ts in stamps))


def test_a_time_of_day_the_span_holds_on_several_dates_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Three days of log: "--since 03:00" read on the first date was a guess that put
    # the report two days before the incident asked about.
    p = tmp_path / "week.log"
    stats_over(p, [f"03-0{d} {h:02d}:00:05" for d in (2, 3, 4) for h in range(24)])
    assert main(["analyze", "--year", "2025", "--since", "03:00", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "preemptdiag: error: --since 03:00:00: a time of day, and the log's span "
        "(2025-03-02 00:00 to 2025-03-04 23:00 UTC) holds it on 3 dates; give the date too "
        "(--since 2025-03-04T03:00:00)"
    )


def test_a_time_of_day_is_placed_on_the_date_of_the_span_that_holds_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 23:00 to 02:00 over midnight: 01:00 is on the second date, not the first.
    p = tmp_path / "night.log"
    stats_over(p, ["03-02 23:00:05", "03-02 23:30:05", "03-03 00:30:05", "03-03 01:30:05"])
    main(["analyze", "--year", "2025", "-f", "json", "--since", "01:00", str(p)])
    windows = json.loads(capsys.readouterr().out)["windows"]
    assert [w["start"] for w in windows] == ["2025-03-03T01:30:00+00:00"]
    # An --until clock is the first such time after --since.
    main(
        ["analyze", "--year", "2025", "-f", "json", "--since", "23:15", "--until", "00:45", str(p)]
    )
    windows = json.loads(capsys.readouterr().out)["windows"]
    assert [w["start"] for w in windows] == [
        "2025-03-02T23:30:00+00:00",
        "2025-03-03T00:30:00+00:00",
    ]
