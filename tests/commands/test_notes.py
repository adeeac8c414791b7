"""commands.notes: the note that one replica's stats lines come from several engines."""

from __future__ import annotations

from dataclasses import replace

from builders import make_event

from preemptdiag.commands.notes import engine_notes
from preemptdiag.model.records import Event, Kind


def _stats(replica: str, proc: str | None = None, **fields: object) -> Event:
    return replace(make_event(Kind.STATS, dict(fields)), replica=replica, proc=proc)


def test_vllm_engines_of_one_api_server_are_named() -> None:
    events = [_stats("a.log", "APIServer", engine_idx=i) for i in (1, 0, 1)]
    (note,) = engine_notes([*events, _stats("b.log", "APIServer", engine_idx=0)])
    assert note.startswith(
        "a.log: stats lines of 2 engines (data parallel: Engine 000, Engine 001)"
    )


def test_sglang_data_parallel_ranks_are_named() -> None:
    events = [_stats("s.log", proc) for proc in ("DP0 TP0", "DP1 TP0", "DP0 TP0")]
    (note,) = engine_notes(events)
    assert note.startswith("s.log: stats lines of 2 engines (data parallel: DP0, DP1)")
    assert engine_notes([_stats("s.log", "TP0"), _stats("s.log", "DP0 TP1")]) == []


def test_aggregated_lines_say_what_their_numbers_are() -> None:
    (note,) = engine_notes([_stats("a.log", "APIServer", engines_aggregated=4)])
    assert note.startswith(
        "a.log: stats lines of 4 Engines Aggregated (--aggregate-engine-logging): Running and "
        "Waiting are the engines' sums and KV usage their pools' mean"
    )
    assert engine_notes([_stats("a.log", "APIServer", engines_aggregated=1)]) == []
