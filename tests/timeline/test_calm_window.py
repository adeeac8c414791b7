"""timeline/calm.py's CalmWindow: a calm window read from its minute's row when asked.

A month of calm windows as Windows was ~2 KB and ~20 us each; a CalmWindow keeps what
its row says and makes its evidence event only when one is read. These hold it to the
Window the same log makes without calm minutes, field by field and event by event,
and hold the readers that skip its event (the sanitiser, the redactor, the JSON
writer) to what they make of that plain Window. (test_calm.py holds whole reports.)
"""

from __future__ import annotations

import copy
import pickle
import sys
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import FrozenInstanceError, fields, is_dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from test_calm import _assert_same, _day, _write
from test_equivalence import _bench_generator

import preemptdiag.commands.analyze as analyze
import preemptdiag.scan.bulk as bulk
import preemptdiag.scan.passes as passes
from preemptdiag.commands.analyze import Options, _redact_window, run_analysis
from preemptdiag.model.records import (
    Packed,
    ReadWindow,
    Window,
    Windows,
    is_printable,
    micros,
    window_columns,
    window_micros,
    window_runs,
)
from preemptdiag.render.json_format import window_json, windows_json
from preemptdiag.render.redact import Redactor
from preemptdiag.render.sanitise import sanitised
from preemptdiag.timeline import calm
from preemptdiag.timeline.calm import CalmWindow, GroupWindow
from preemptdiag.timeline.events import TimeContext


def _windows(path: Path, calm: bool) -> tuple[Window, ...]:
    opts = Options(files=(str(path),), time=TimeContext(year=2026), calm=calm)
    return run_analysis(opts).report.windows


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Window], list[Window]]:
    """The windows of two hours of an engine's stats lines (calm but for a queue now
    and then, a pinned pool and a warning), with calm minutes and without."""
    log = _write(
        tmp_path_factory.mktemp("calm") / "two-hours.log",
        list(_day(3, datetime(2026, 6, 3, 23, 10), 2.0)),
    )
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bulk, "AFTER_LINES", 0)  # the lane from the first block
        m.setattr(passes, "BLOCK_BYTES", 1 << 16)
        return list(_windows(log, True)), list(_windows(log, False))


def _plain(w: Window) -> Window:
    return Window(*(getattr(w, f.name) for f in fields(Window)))


def _calm(windows: list[Window]) -> list[CalmWindow]:
    return [w for w in windows if isinstance(w, CalmWindow)]


def _strings(obj: Any) -> Iterator[str]:
    """Every str in obj, as the sanitiser walks it (dataclasses, sequences, maps; a
    StrEnum's member is no text to it)."""
    if type(obj) is str:
        yield obj
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            yield from _strings(getattr(obj, f.name))
    elif isinstance(obj, tuple | list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)


def test_a_calm_window_reads_as_the_window_made_without_calm_minutes(
    pair: tuple[list[Window], list[Window]],
) -> None:
    on, off = pair
    assert len(_calm(on)) > 80  # (most of the 120 windows; the rest hold events)
    assert not _calm(off)
    assert [_plain(w) for w in on] == off  # every field, the evidence events' too
    for w, plain in zip(on, off, strict=True):
        assert w.evidence == plain.evidence


def test_what_it_reads_without_making_its_event(pair: tuple[list[Window], list[Window]]) -> None:
    for w in _calm(pair[0]):
        (e,) = w.evidence
        assert w.evidence_line() == (e.source, e.line, e.sig, e.kind, e.text, e.ts)
        for name in (*e.fields, "no_such_field"):
            assert w.evidence_field(name) == e.fields.get(name)
        texts = w.texts()
        assert texts is not None
        assert set(_strings(_plain(w))) <= set(texts)


def test_a_run_of_them_is_written_as_their_plain_windows(
    pair: tuple[list[Window], list[Window]],
) -> None:
    on, off = pair
    assert windows_json(on, "    ") == [window_json(w, "    ") for w in off]
    w = _with_text(_calm(on)[0], "Engine 000: \x1b]0;title\x07 {braces} \u202e")
    run = [w, *_calm(on)[1:4]]
    assert windows_json(run) == [window_json(_plain(x)) for x in run]


def _runs_of(calm: list[CalmWindow]) -> list[list[CalmWindow]]:
    """Runs the column readers meet: all, one, rows of two frames, rows out of order,
    a row twice."""
    return [calm, calm[:1], calm[3:5], calm[::3], calm[::-1], [calm[2], calm[2], calm[0]]]


def test_a_run_of_them_reads_a_column_at_a_time_as_one_at_a_time(
    pair: tuple[list[Window], list[Window]],
) -> None:
    calm = _calm(pair[0])
    # (rows of several frames: the fixture's blocks are 64 KiB)
    assert len({id(w._c) for w in calm}) > 2
    names = [f.name for f in fields(Window) if f.name != "evidence"]
    for run in _runs_of(calm):
        got, want = CalmWindow.columns(run, names), ReadWindow.columns(run, names)
        assert got == want
        assert [list(map(type, c)) for c in got] == [list(map(type, c)) for c in want]
        assert CalmWindow.evidence_lines(run) == ReadWindow.evidence_lines(run)
        assert CalmWindow.evidence_places(run) == ReadWindow.evidence_places(run)
        assert CalmWindow.printable(run) is ReadWindow.printable(run) is True
        e = run[0].evidence[0]
        for field in (*e.fields, "no_such_field"):
            got_values = CalmWindow.evidence_values(run, field)
            assert got_values == ReadWindow.evidence_values(run, field)
    # (a month's windows: runs of calm windows between event windows)
    on = pair[0]
    assert window_columns(on, names) == [[getattr(w, n) for w in on] for n in names]


@pytest.mark.parametrize(
    ("text", "printable"),
    [
        ("Engine 000: \x1b]0;title\x07 GPU KV", False),
        ("Engine 000: \u202e GPU KV", False),
        ("Engine 000: \u00e9t\u00e9 GPU KV", True),
        ("Engine 000:\tGPU KV", False),
    ],
)
def test_a_run_with_a_text_to_clean_is_not_printable(
    pair: tuple[list[Window], list[Window]], text: str, printable: bool
) -> None:
    calm = _calm(pair[0])
    run = [*calm[:3], _with_text(calm[3], text), *calm[4:9]]
    assert CalmWindow.printable(run) is ReadWindow.printable(run) is printable
    assert is_printable(text) is text.isprintable() is printable
    assert CalmWindow.evidence_lines(run) == ReadWindow.evidence_lines(run)
    # (the sanitiser then walks the run's windows one by one: the text is cleaned)
    cleaned = sanitised(tuple([*run, *pair[1][: 64 - len(run)]]))
    assert [_plain(w) for w in cleaned[: len(run)]] == [sanitised(_plain(w)) for w in run]


def test_a_copy_of_one_is_a_plain_window(pair: tuple[list[Window], list[Window]]) -> None:
    w = _calm(pair[0])[0]
    assert isinstance(w, ReadWindow) and type(w) is not Window
    changed = replace(w, why="changed")
    assert type(changed) is Window
    assert changed == replace(_plain(w), why="changed")
    for made in (pickle.loads(pickle.dumps(w)), copy.copy(w), copy.deepcopy(w)):
        assert type(made) is Window
        assert made == _plain(w)


def test_it_holds_only_its_own_slots_and_is_a_frozen_window_of_its_values(
    pair: tuple[list[Window], list[Window]],
) -> None:
    w, other = _calm(pair[0])[:2]
    # (not a Window at run time: a Window's 32 slots would be ~210 bytes more a window)
    assert sys.getsizeof(w) <= 32 + 8 * len(_slots(CalmWindow))  # (two headers)
    assert is_dataclass(w) and fields(w) == fields(Window)
    assert w == w and w != other and w != _plain(w)
    assert repr(w) == repr(_plain(w)).replace("Window(", "CalmWindow(", 1)
    for name in ("kv_max", "why", "_i", "anything"):
        with pytest.raises(FrozenInstanceError):
            setattr(w, name, 1)
        with pytest.raises(FrozenInstanceError):
            delattr(w, name)
    # every field is read: a slot, a property or a class constant
    assert all(hasattr(w, f.name) for f in fields(Window))
    # (their peak lines' texts are packed, records.Packed: what these tests read)
    assert any(isinstance(w._c[calm._K_TEXT], Packed) for w in _calm(pair[0]))


def _slots(cls: type) -> list[str]:
    """Every slot an instance of cls has (its bases' too)."""
    return [name for c in cls.__mro__ for name in getattr(c, "__slots__", ())]


def _with_text(w: CalmWindow, text: str) -> CalmWindow:
    """w with another peak line text (the lane never keeps a line with an escape or
    a secret: these are the readers' other paths)."""
    out = object.__new__(CalmWindow)
    for name in _slots(CalmWindow):
        object.__setattr__(out, name, getattr(w, name))
    # (its row's text in a copy of its kept columns)
    texts = list(w._c[calm._K_TEXT])
    texts[w._i] = text
    object.__setattr__(out, "_c", (*w._c[: calm._K_TEXT], texts, *w._c[calm._K_TEXT + 1 :]))
    return out


@pytest.mark.parametrize(
    "text",
    [
        "Engine 000: Avg prompt throughput: 1.0 tokens/s, \x1b]0;title\x07GPU KV cache usage: 9%",
        "Engine 000: Avg prompt throughput: 1.0 tokens/s, key sk-ab12cd34ef56 GPU KV",
        "Engine 000: Avg prompt throughput: 1.0 tokens/s, {braces} \u202e GPU KV",
    ],
)
def test_the_readers_skipping_its_event_give_what_they_give_its_plain_window(
    pair: tuple[list[Window], list[Window]], text: str
) -> None:
    w = _with_text(_calm(pair[0])[0], text)
    plain = _plain(w)
    assert plain.evidence[0].text == text
    # (a window left as it is stays a CalmWindow: compared as the Window it reads as)
    assert _plain(sanitised(w)) == sanitised(plain)
    assert (sanitised(w) is w) == (sanitised(plain) is plain)
    redactor = Redactor(enabled=True)
    assert _plain(_redact_window(w, redactor)) == _redact_window(plain, redactor)
    assert (_redact_window(w, redactor) is w) == (_redact_window(plain, redactor) is plain)
    assert window_json(w, "    ") == window_json(plain, "    ")
    clean = _calm(pair[0])[1]
    assert sanitised(clean) is clean
    assert _redact_window(clean, Redactor(enabled=True)) is clean
    assert window_json(clean) == window_json(_plain(clean))


def test_a_replica_name_with_escapes_is_cleaned_as_without_calm_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (an OSC sequence is dropped, a bare control character becomes U+FFFD)
    log = _write(tmp_path / "a\x1b]0;x\x07b\x01c.log", list(_day(4, datetime(2026, 6, 3), 1.0)))
    spy = _assert_same([log], monkeypatch, capsys)
    assert spy.placed > 30 and not spy.gave_up
    out = log.with_suffix(".True.json").read_text(encoding="utf-8")
    assert out.count('ab\\ufffdc.log"') > 60 and "\x1b" not in out and "\x01" not in out


def test_each_frame_of_calm_rows_goes_once_its_windows_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (a month's frames are ~24 MiB: a list left holding them kept them to the end)
    log = _write(tmp_path / "hour.log", list(_day(5, datetime(2026, 6, 3), 1.0)))
    monkeypatch.setattr(bulk, "AFTER_LINES", 0)
    monkeypatch.setattr(passes, "BLOCK_BYTES", 1 << 14)
    frames: list[weakref.ref[Any]] = []
    alive: list[int] = []
    real = calm.windows

    def spy(placed: list[Any], *args: Any) -> Any:
        frames.extend(weakref.ref(p.rows.frame) for p in placed)
        got = real(placed, *args)
        alive.append(sum(f() is not None for f in frames))
        return got

    monkeypatch.setattr(analyze, "calm_windows", spy)
    windows = _windows(log, True)
    assert len({id(f) for f in frames}) > 1 and alive == [0]
    assert len(_calm(list(windows))) > 30


# A report holds its calm windows as runs of them (calm.CalmRun, in records.Windows):
# a frame's columns and ~20 bytes a window, each window made only when read.


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> tuple[Windows, list[Window]]:
    """The pair's log's report windows as the report holds them, and without calm
    minutes."""
    log = _write(
        tmp_path_factory.mktemp("held") / "two-hours.log",
        list(_day(3, datetime(2026, 6, 3, 23, 10), 2.0)),
    )
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bulk, "AFTER_LINES", 0)
        m.setattr(passes, "BLOCK_BYTES", 1 << 16)
        on = _windows(log, True)
        assert isinstance(on, Windows)
        return on, list(_windows(log, False))


def _calm_runs(on: Windows) -> list[calm.CalmRun]:
    return [p for p in on.parts if isinstance(p, calm.CalmRun)]


def test_a_reports_calm_windows_are_runs_not_windows(
    held: tuple[Windows, list[Window]],
) -> None:
    on, off = held
    runs = _calm_runs(on)
    # (several frames, and event windows between them: each a made Window)
    assert len(runs) > 2 and sum(map(len, runs)) > 60
    assert not any(isinstance(w, CalmWindow) for p in on.parts if type(p) is list for w in p)
    assert [_plain(w) for w in on] == off


def test_a_calm_run_reads_as_the_windows_it_stands_for(
    held: tuple[Windows, list[Window]],
) -> None:
    for run in _calm_runs(held[0]):
        made = list(run)
        assert all(type(w) is CalmWindow for w in made)
        assert [run[i] for i in range(len(made))] == made
        assert [run[i] for i in range(-len(made), 0)] == made
        for i in (len(made), -len(made) - 1):
            with pytest.raises(IndexError):
                run[i]
        part = run[2:-1]
        assert isinstance(part, calm.CalmRun) and list(part) == made[2:-1]
        assert list(part[1:3]) == made[2:-1][1:3] and list(run[::3]) == made[::3]
        assert len(run[5:2]) == 0
        for name in ("replica", "start", "end", "confidence", "why", "_ts"):
            assert run.own(name) == [getattr(w, name) for w in made], name
            assert part.own(name) == [getattr(w, name) for w in made[2:-1]], name
        for name in ("start", "end"):
            assert list(run.micros(name)) == [micros(getattr(w, name)) for w in made]
        assert list(part.ts_micros() or ()) == [micros(w._ts) for w in made[2:-1]]
        assert sum(b - a for _, _, a, b in part.spans()) == len(part)
        assert [part.order_key(i) for i in range(len(part))] == list(map(calm._order, part))
        # (a copy is the plain windows: records.ReadWindow's __reduce__)
        assert pickle.loads(pickle.dumps(run)) == [_plain(w) for w in made]
        assert [type(w) for w in pickle.loads(pickle.dumps(run))] == [Window] * len(made)


def test_the_column_readers_read_a_run_as_they_read_its_windows(
    held: tuple[Windows, list[Window]],
) -> None:
    on = held[0]
    names = [f.name for f in fields(Window) if f.name != "evidence"]
    assert window_columns(on, names) == [[getattr(w, n) for w in on] for n in names]
    assert list(window_micros(on, "start")) == [micros(w.start) for w in on]
    runs = [(k, r) for k, r in window_runs(on) if k is CalmWindow]
    # (a few runs of calm windows, each of several frames' runs: records.Windows.runs)
    assert runs and all(isinstance(r, Windows | calm.CalmRun) for _, r in runs)
    for _, run in runs:
        made = list(run)
        assert CalmWindow.columns(run, names) == ReadWindow.columns(made, names)
        assert CalmWindow.evidence_lines(run) == ReadWindow.evidence_lines(made)
        assert CalmWindow.evidence_places(run) == ReadWindow.evidence_places(made)
        assert CalmWindow.evidence_texts(run) == ReadWindow.evidence_texts(made)
        assert CalmWindow.evidence_values(run, "kv_usage") == ReadWindow.evidence_values(
            made, "kv_usage"
        )
        assert CalmWindow.printable(run) is ReadWindow.printable(made) is True
        for name in ("start", "end"):
            assert CalmWindow.micros(run, name) == ReadWindow.micros(made, name)
        assert list(CalmWindow.evidence_micros(run) or ()) == [micros(w._ts) for w in made]
        assert ReadWindow.evidence_micros(made) is None
        assert CalmWindow.evidence_untimed(run) == ReadWindow.evidence_untimed(made)


def test_redaction_and_the_sanitiser_keep_a_clean_run_as_the_run_it_is(
    held: tuple[Windows, list[Window]],
) -> None:
    on = held[0]
    for redactor in (Redactor(enabled=True), Redactor(enabled=False)):
        got = analyze._redact_windows(on, redactor)
        assert (
            got == on
            and _calm_runs(got)
            and sum(map(len, _calm_runs(got))) == sum(map(len, _calm_runs(on)))
        )
    assert sanitised(on) is on


def test_a_secret_in_a_calm_minutes_line_is_redacted_as_without_calm_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (a minute's every line ends in a key, so its window's evidence line holds it; the
    # chunk of calm windows holding it is redacted window by window, the rest kept)
    secret = "sk-" + "A1b2C3d4" * 4
    lines = list(_day(6, datetime(2026, 6, 3), 1.0))
    lines = [f"{t} api_key={secret}" if "23:31:" in t or " 00:31:" in t else t for t in lines]
    assert sum(secret in t for t in lines) == 6
    log = _write(tmp_path / "keyed.log", lines)
    monkeypatch.setattr(analyze, "_REDACT_CHUNK", 4)
    spy = _assert_same([log], monkeypatch, capsys)
    assert spy.placed > 30 and not spy.gave_up
    for out in tmp_path.glob("keyed.*.*"):
        text = out.read_text(encoding="utf-8")
        assert secret not in text and "A1b2C3d4" not in text, out.name


@pytest.fixture(scope="module")
def sglang_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Window], list[Window]]:
    """The windows of bench's dense SGLang log (a decode and a prefill stream: a
    minute of each a window), with calm minutes and without."""
    path = tmp_path_factory.mktemp("calm") / "sglang.log"
    with path.open("wb") as f:
        _bench_generator().PROFILES["sglang-dense"](f, 1_500_000, 4)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(passes, "BLOCK_BYTES", 1 << 18)
        return list(_windows(path, True)), list(_windows(path, False))


def _groups(windows: list[Window]) -> list[GroupWindow]:
    return [w for w in windows if isinstance(w, GroupWindow)]


def test_a_window_of_several_calm_minutes_reads_as_the_window_made_without_them(
    sglang_pair: tuple[list[Window], list[Window]],
) -> None:
    on, off = sglang_pair
    groups = _groups(on)
    assert len(groups) > 20 and len(groups) * 2 > len(on)  # (nearly every minute has both)
    assert [_plain(w) for w in on] == off  # every field, the evidence events' too
    for w, plain in zip(on, off, strict=True):
        assert w.evidence == plain.evidence
    # its evidence is either stream's peak line: the highest KV, the first such
    assert {w.evidence_line()[2] for w in groups} == {
        "sglang.stats.decode",
        "sglang.stats.prefill",
    }


def test_a_window_of_several_reads_without_making_its_event_and_copies_as_a_window(
    sglang_pair: tuple[list[Window], list[Window]],
) -> None:
    groups = _groups(sglang_pair[0])
    for w in groups:
        (e,) = w.evidence
        assert w.evidence_line() == (e.source, e.line, e.sig, e.kind, e.text, e.ts)
        for name in (*e.fields, "no_such_field"):
            assert w.evidence_field(name) == e.fields.get(name)
        texts = w.texts()
        assert texts is not None and set(_strings(_plain(w))) <= set(texts)
    w, other = groups[:2]
    # its numbers held, its evidence read from its minute's frame: no Window, no event
    assert sys.getsizeof(w) <= 32 + 8 * len(_slots(GroupWindow))
    assert w == w and w != other and fields(w) == fields(Window)
    with pytest.raises(FrozenInstanceError):
        w.why = "changed"  # type: ignore[misc]
    for made in (pickle.loads(pickle.dumps(w)), copy.copy(w), replace(w, why=w.why)):
        assert type(made) is Window and made == _plain(w)
    names = [f.name for f in fields(Window) if f.name != "evidence"]
    assert window_columns(groups, names) == [[getattr(w, n) for w in groups] for n in names]
