"""Counting and timing rules of events.py, on small logs built per scenario."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from builders import v1_stats_line

from preemptdiag.commands.analyze import Options, run_analysis
from preemptdiag.commands.options import parse_tz
from preemptdiag.model.records import Kind
from preemptdiag.timeline.events import TimeContext

WARN = (
    "{p}WARNING {md} {hms} scheduler.py:1560] Sequence group {sid} is preempted by "
    "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect "
    "the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to "
    "provide more KV cache memory. total_num_cumulative_preemption={n}{suffix}"
)
INIT = "INFO 01-01 00:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: model='m', max_seq_len=4096, tensor_parallel_size=1)"


def warn(
    n: int, hms: str, p: str = "", sid: str = "cmpl-1", suffix: str = "", md: str = "01-01"
) -> str:
    return WARN.format(p=p, md=md, hms=hms, sid=sid, n=n, suffix=suffix)


def events_of(tmp_path: Path, lines: list[str], name: str = "a.log"):  # type: ignore[no-untyped-def]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    out = run_analysis(Options(files=(str(p),), jobs=1, time=TimeContext(year=2025)))
    return [e for e in out.events if e.kind is Kind.PREEMPTION], out


def test_counter_deltas_not_warning_lines(tmp_path: Path) -> None:
    pre, _ = events_of(
        tmp_path, [INIT, warn(1, "00:01:00"), warn(51, "00:02:00"), warn(101, "00:03:00")]
    )
    assert [e.preemptions for e in pre] == [1, 50, 50]
    assert not any(e.lower_bound for e in pre)


def test_first_counter_without_engine_start_is_a_lower_bound(tmp_path: Path) -> None:
    pre, out = events_of(tmp_path, [warn(151, "00:01:00"), warn(201, "00:02:00")])
    assert [(e.preemptions, e.lower_bound) for e in pre] == [(1, True), (50, False)]
    assert any("lower bounds" in n for n in out.report.notes)


def test_counter_reset_is_a_restart(tmp_path: Path) -> None:
    pre, _ = events_of(
        tmp_path, [INIT, warn(51, "00:01:00"), warn(1, "00:05:00"), warn(51, "00:06:00")]
    )
    assert [e.preemptions for e in pre] == [51, 1, 50]


def test_ray_repeated_multiplies_and_hosts_are_separate_engines(tmp_path: Path) -> None:
    pre, out = events_of(
        tmp_path,
        [
            warn(1, "00:01:00", p="(WorkerDict pid=1, ip=10.0.0.1) "),
            warn(
                1,
                "00:02:00",
                p="(WorkerDict pid=2, ip=10.0.0.2) ",
                suffix=" [repeated 2x across cluster]",
            ),
        ],
    )
    assert [e.preemptions for e in pre] == [1, 2]
    assert out.report.verdict.cls.value == "benign_preemption"


def test_sglang_ranks_count_once(tmp_path: Path) -> None:
    line = "[2025-03-07 21:49:33 TP{r}] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4512 -> 0.8127"
    pre, _ = events_of(tmp_path, [line.format(r=r) for r in range(4)])
    assert sum(e.preemptions for e in pre) == 3


def test_glued_stats_records_keep_their_own_time(tmp_path: Path) -> None:
    rec = (
        "INFO 07-28 06:41:{s:02d} [loggers.py:118] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 239.2 tokens/s, Running: 8 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: {kv}%, Prefix cache hit rate: 0.0%"
    )
    p = tmp_path / "glued.log"
    p.write_text(rec.format(s=9, kv="91.6") + rec.format(s=19, kv="91.9") + "\n")
    opts = Options(files=(str(p),), jobs=1, time=TimeContext(year=2025), rollup=False)
    stats = [e for e in run_analysis(opts).events if e.kind is Kind.STATS]
    assert [(e.ts.second if e.ts else None, e.fields["kv_usage"], e.line) for e in stats] == [
        (9, 91.6, 1),
        (19, 91.9, 1),
    ]
    # Rolled up (the default), the minute's two records are one event; its last
    # member keeps its own time.
    (rolled,) = run_analysis(replace(opts, rollup=True)).events
    assert rolled.rollup is not None
    assert (rolled.ts and rolled.ts.second, rolled.lines) == (9, 2)
    last = rolled.rollup.last
    assert (last.ts and last.ts.second, last.fields["kv_usage"], last.line) == (19, 91.9, 1)


def test_hard_wrapped_stats_line_is_rejoined(tmp_path: Path) -> None:
    p = tmp_path / "wrapped.log"
    p.write_text(
        "2025-10-15T00:02:38.756689123Z (APIServer pid=1) INFO 10-14 17:02:38 [loggers.py:123] "
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughpu\n"
        "t: 843.6 tokens/s, Running: 38 reqs, Waiting: 0 reqs, GPU KV cache usage: 88.5%, "
        "Prefix cache hit rate: 42.4%\n"
    )
    out = run_analysis(Options(files=(str(p),), jobs=1))
    stats = [e for e in out.events if e.kind is Kind.STATS]
    assert [(e.line, e.fields["gen_tput"], e.fields["running"]) for e in stats] == [(1, 843.6, 38)]
    assert stats[0].ts is not None and stats[0].ts.isoformat() == "2025-10-15T00:02:38.756689+00:00"


def test_decoy_prompt_is_not_evidence(tmp_path: Path) -> None:
    decoy = (
        "INFO 01-01 00:01:00 logger.py:39] Received request chatcmpl-9: prompt: 'why does my log say "
        + warn(51, "00:00:00")
        + "?', params: SamplingParams(n=1)"
    )
    pre, out = events_of(tmp_path, [decoy])
    assert pre == []
    assert out.report.stats.skipped == {"decoy in request text": 1}


def test_zero_gpu_blocks_is_an_allocation_failure(tmp_path: Path) -> None:
    _, out = events_of(
        tmp_path, ["INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 0, # CPU blocks: 256"]
    )
    assert out.report.verdict.cls.value == "allocation_failure"
    assert out.report.lever.knob == "--gpu-memory-utilization"


def test_dmesg_uptime_borrows_boot_time_from_journald(tmp_path: Path) -> None:
    j = tmp_path / "journal.log"
    j.write_text(
        "Aug 19 18:00:00 node kernel: [1000.000000] oom_reaper: reaped process 1 (x), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB\n"
    )
    d = tmp_path / "dmesg.log"
    d.write_text(
        "[1100.500000] Memory cgroup out of memory: Killed process 48211 (python3) total-vm:1kB, anon-rss:2097152kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0\n"
    )
    out = run_analysis(Options(files=(str(j), str(d)), jobs=1, time=TimeContext(year=2025)))
    kill = [e for e in out.events if e.kind is Kind.HOST_OOM]
    assert kill and kill[0].ts is not None
    assert kill[0].ts.isoformat() == "2025-08-19T18:01:40.500000+00:00"


def _berlin_fold_log(hot_from_utc: int) -> list[str]:
    """Stats lines every 10 s, stamped on Berlin's wall clock, from 22:00 to 04:00 UTC
    over the night summer time ends (Oct 25 2026: 02:00-03:00 comes twice); Waiting 50
    and KV 99 % for 20 minutes from `hot_from_utc` minutes after 00:00 UTC."""

    berlin = ZoneInfo("Europe/Berlin")
    t0 = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)
    lines = []
    for i in range(-120 * 6, 240 * 6):
        t = t0 + timedelta(seconds=10 * i)
        hot = hot_from_utc * 6 <= i < (hot_from_utc + 20) * 6
        wall = t.astimezone(berlin).replace(tzinfo=None)
        lines.append(v1_stats_line(wall, 10, 50 if hot else 0, 99.0 if hot else 30.0))
    return lines


def test_the_hour_a_dst_change_repeats_is_read_twice_not_merged(tmp_path: Path) -> None:
    # Read as its first pass, the repeated hour's second pass (02:xx CET) landed on the
    # first's windows (twelve lines a minute, its Waiting mixed in), and the next UTC
    # hour was empty. An incident in either pass is placed where it happened.

    for hot, hot_utc in ((30, "00:30"), (90, "01:30")):
        log = tmp_path / f"fold{hot}.log"
        log.write_text("\n".join(_berlin_fold_log(hot)) + "\n")
        opts = Options(files=(str(log),), time=TimeContext(year=2026, tz=parse_tz("Europe/Berlin")))
        report = run_analysis(opts).report
        ws = report.windows
        assert len(ws) == 360 and {w.n_stats for w in ws} == {6}
        assert [w.start for w in ws] == sorted(w.start for w in ws if w.start)
        assert report.verdict.start == datetime.fromisoformat(f"2026-10-25T{hot_utc}:00+00:00")
        hot_windows = [w for w in ws if (w.waiting_max or 0) > 0]
        assert len(hot_windows) == 20
        assert all(w.waiting_first == w.waiting_last == 50 for w in hot_windows)
        assert hot_windows[0].start.astimezone(UTC).strftime("%H:%M") == hot_utc  # type: ignore[union-attr]


def test_sglang_ranks_count_once_in_each_second(tmp_path: Path) -> None:
    # (the copies of one second are interleaved with another record's; the same text a
    # second later is a new record)
    line = "[2025-03-07 21:49:{s} TP{r}] KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_token_ratio: 0.4512 -> 0.8127"
    lines = [line.format(s=33, r=r, n=n) for r in range(4) for n in (3, 2)]
    lines += [line.format(s=34, r=r, n=3) for r in range(4)]
    pre, _ = events_of(tmp_path, lines)
    # (one event: the minute's lines merged, rollup.PreemptionBuilder, as three records)
    assert [(e.preemptions, e.lines) for e in pre] == [(3 + 2 + 3, 3)]
    assert [e.line for e in pre[0].rollup.preempting] == [2, 9]  # type: ignore[union-attr]


def test_sglang_ranks_under_a_wrappers_stamp_count_once(tmp_path: Path) -> None:
    # `kubectl logs --timestamps` stamps each rank's copy with the nanosecond it read
    # it: an engine's copies are told by the second (four copies were four retractions)
    line = "2025-03-07T21:49:33.{ns:09d}Z [2025-03-07 21:49:33 TP{r}] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4512 -> 0.8127"
    for rollup in (False, True):
        lines = [line.format(ns=1_000_000 * (r + 1) + 7, r=r) for r in range(4)]
        p = tmp_path / f"k{rollup}.log"
        p.write_text("\n".join(lines) + "\n")
        opts = Options(files=(str(p),), jobs=1, rollup=rollup, time=TimeContext(year=2025))
        pre = [e for e in run_analysis(opts).events if e.kind is Kind.PREEMPTION]
        assert sum(e.preemptions for e in pre) == 3
        assert {e.proc for e in pre} == {"TP0"}


def test_kernel_lines_microseconds_apart_are_two_records(tmp_path: Path) -> None:
    # The kernel's own stamps (dmesg --time-format iso) have microseconds: two of its
    # lines with equal fields in one second are two lines (vLLM 0.32.0's recorded
    # cgroup OOM: `Tasks state ...` and the task table's header, 38 us apart).
    kill = (
        "2026-12-01T23:21:29,796688+00:00 Memory cgroup out of memory: Killed process 22997 "
        "(VLLM::Worker) total-vm:5675836kB, anon-rss:2310492kB, file-rss:215816kB, "
        "shmem-rss:0kB, UID:0 pgtables:5928kB oom_score_adj:0"
    )
    lines = [
        "2026-12-01T23:21:29,796562+00:00 Tasks state (memory values in pages):",
        "2026-12-01T23:21:29,796600+00:00 [  pid  ]   uid  tgid total_vm      rss rss_anon "
        "rss_file rss_shmem pgtables_bytes swapents oom_score_adj name",
        kill,
    ]
    p = tmp_path / "dmesg.log"
    p.write_text("\n".join(lines) + "\n")
    out = run_analysis(Options(files=(str(p),), jobs=1, time=TimeContext(year=2026)))
    tasks = [e.line for e in out.events if e.sig == "system.kernel.oom_tasks"]
    assert tasks == [1, 2]


def test_copies_across_a_clock_that_went_back_count_once(tmp_path: Path) -> None:
    # Where the stamps go back (here behind an unstamped hit, which _in_time_order
    # does not reorder across), every key is kept, not a second's: the copy after the
    # earlier second is still found.
    from preemptdiag.ingest.sources import open_source
    from preemptdiag.scan.matcher import Matcher
    from preemptdiag.scan.passes import scan_fast
    from preemptdiag.scan.signatures import load
    from preemptdiag.timeline.events import _dedupe_ranks

    line = "[2025-03-07 21:49:33 TP{r}] KV cache pool is full. Retract requests. #retracted_reqs: {n}, #new_token_ratio: 0.4512 -> 0.8127"
    p = tmp_path / "ranks.log"
    p.write_text("\n".join(line.format(r=r, n=n) for r, n in ((0, 3), (0, 2), (1, 3), (0, 1))))
    a0, b, a1, x = scan_fast(open_source(str(p)), Matcher(load(None))).hits
    at = datetime(2025, 3, 7, 21, 49, 40, tzinfo=UTC)
    pairs = [(a0, at), (x, None), (b, at - timedelta(seconds=7)), (a1, at)]
    assert [h for h, _ in _dedupe_ranks(pairs, set())] == [a0, x, b]
    # (forward: the same copies a second apart are two records)
    later = [(a0, at), (b, at + timedelta(seconds=1)), (a1, at + timedelta(seconds=1))]
    assert [h for h, _ in _dedupe_ranks(later, set())] == [a0, b, a1]


def test_a_start_up_failure_every_dp_rank_prints_is_one_event(tmp_path: Path) -> None:
    # (a real DeepSeek DP-attention start, corpus 012: eight ranks print it alike; their
    # retractions are each rank's own, tests/test_rollup.py)
    line = "[2025-07-02 07:41:59 DP{r} TP{r}] max_total_tokens=131072 is larger than the profiled value -561981. Use the profiled value instead."
    p = tmp_path / "dp.log"
    p.write_text("\n".join(line.format(r=r) for r in range(8)) + "\n")
    out = run_analysis(Options(files=(str(p),), jobs=1, time=TimeContext(year=2025)))
    assert [e.kind for e in out.events] == [Kind.ALLOC_FAILURE]
    assert [w.alloc_failures for w in out.report.windows] == [1]
