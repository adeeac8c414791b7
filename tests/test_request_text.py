"""Request text is evidence-free and never echoed (issue 15, items 2 and 7).

Every shape in which engines and clients log what a user sent, in both quote styles,
quoting the very signal lines the tool counts: the verdict must not move, the decoy
must be counted, and no format may print the text. A real record glued after the
quoted text ends is evidence again. The shapes are one definition shared by the
scanner and the redactor (preemptdiag/model/request_text.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import regex  # type: ignore[import-untyped, unused-ignore]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preemptdiag.cli import main
from preemptdiag.model import request_text
from preemptdiag.render.redact import redact
from preemptdiag.scan.matcher import DECOY

CANARY = "qqcanaryqq"
RETRACT = "KV cache pool is full. Retract requests. #retracted_reqs: 40, #new_token_ratio: 0.7"
PREEMPT = (
    "Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode because there is not "
    "enough KV cache space. total_num_cumulative_preemption=51"
)
SG = "[2026-06-16 12:02:{s:02d} TP0] "
VL = "INFO 06-16 12:02:{s:02d} [logger.py:39] "


def _quoted(text: str, q: str) -> str:
    return q + text.replace("\\", "\\\\").replace(q, "\\" + q) + q


def _shapes(signal: str, q: str) -> dict[str, list[str]]:
    """name -> the line(s) of one request-text shape quoting `signal`."""
    p = f"{CANARY} {signal}"
    v = _quoted(p, q)
    return {
        "vllm_prompt": [VL + f"Received request cmpl-1: prompt: {v}, params: SamplingParams(n=1)"],
        "sglang_receive": [SG + f"Receive: obj=GenerateReqInput(text={v}, rid='a1')"],
        "sglang_finish": [
            SG + f"Finish: obj=GenerateReqInput(rid='a1'), out={{'text': {v}, 'meta_info': {{}}}}"
        ],
        "prompt_eq": [VL + f"request prompt={v} max_tokens=16"],
        "prompt_colon": [VL + f"request prompt:{v} max_tokens=16"],
        "Prompt_raw": [VL + f"Prompt: {p}"],
        "llm_generate": [VL + f"llm.generate(prompt={v}, sampling_params=sp)"],
        "tgi_inputs": ['{"inputs": ' + _quoted(p, '"') + ', "parameters": {"max_new_tokens": 8}}'],
        "json_text": ['{"text": ' + _quoted(p, '"') + "}"],
        "openai_error": [VL + f"openai.BadRequestError: Error code: 400 - message={v}"],
        "langchain": ["Prompt after formatting:", f"Human: {p}"],
        "prompt_text": [VL + f"Request(prompt_text={v}, request_id='r1')"],
        "multiline_prompt": [
            VL + f"Received request cmpl-2: prompt: {q}{CANARY} first line",
            f"{signal} {CANARY}{q}, params: SamplingParams(n=1)",
        ],
    }


SHAPE_NAMES = sorted(_shapes("x", "'"))


def _queueing_log() -> list[str]:
    """An SGLang replica whose queue only grows: queueing, never a thrash loop."""
    lines = [
        "[2026-06-16 11:59:30 TP0] max_total_num_tokens=210968, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=32768"
    ]
    q = 5
    for minute in range(6):
        for sec in (5, 20, 35, 50):
            lines.append(
                f"[2026-06-16 12:{minute:02d}:{sec:02d} TP0] Decode batch, #running-req: 62, "
                "#token: 206000, token usage: 0.97, cuda graph: True, "
                f"gen throughput (token/s): 900.00, #queue-req: {q}"
            )
            q += 4
    return lines


def _run_all_formats(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str]
) -> tuple[int, dict[str, object], str]:
    log = tmp_path / "sglang.log"
    log.write_text("\n".join(lines) + "\n")
    outs = [tmp_path / n for n in ("r.txt", "r.md", "r.json", "r.sarif")]
    argv = ["analyze", str(log), "--color", "never"]
    for f, o in zip(("terminal", "markdown", "json", "sarif"), outs, strict=True):
        argv += ["-f", f, "-o", str(o)]
    code = main(argv)
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, json.loads(outs[2].read_text()), "".join(o.read_text() for o in outs) + err


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    d = tmp_path_factory.mktemp("base")
    log = d / "q.log"
    log.write_text("\n".join(_queueing_log()) + "\n")
    out = d / "r.json"
    code = main(["analyze", str(log), "-f", "json", "-o", str(out)])
    return code, json.loads(out.read_text())["verdict"]["class"]


@pytest.mark.parametrize("quote", ["'", '"'])
@pytest.mark.parametrize("signal", [RETRACT, PREEMPT], ids=["retract", "preempt"])
@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_request_text_quoting_a_signal_is_a_decoy_and_never_printed(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    baseline: tuple[int, str],
    shape: str,
    signal: str,
    quote: str,
) -> None:
    lines = _queueing_log()
    # Ten copies in one minute: counted as evidence they would make a thrash loop.
    for _ in range(10):
        lines[12:12] = _shapes(signal, quote)[shape]
    code, report, text = _run_all_formats(capsys, tmp_path, lines)
    assert (code, report["verdict"]["class"]) == baseline  # type: ignore[index]
    assert report["verdict"]["class"] == "queueing"  # type: ignore[index]
    assert report["scan"]["skipped"].get(DECOY, 0) >= 10  # type: ignore[index]
    assert CANARY not in text


@pytest.mark.parametrize("quote", ["'", '"'])
@pytest.mark.parametrize("shape", SHAPE_NAMES)
def test_the_redactor_knows_every_shape_the_scanner_does(shape: str, quote: str) -> None:
    for line in _shapes(RETRACT, quote)[shape]:
        found = request_text.spans(line)
        if CANARY in line and shape not in ("langchain", "multiline_prompt"):
            # the whole of the user's text sits in request text, and is replaced
            assert request_text.inside(line.index(CANARY), found), line
        if found:
            assert CANARY not in redact(line), line


def test_one_list_of_shapes_serves_both_stages() -> None:
    from preemptdiag.render import redact as redact_mod

    names = [n for n, _ in redact_mod._ALTERNATIVES]
    assert names[: len(request_text.SHAPES)] == list(request_text.NAMES)


def test_a_real_warning_glued_after_a_request_record_counts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The request record ends where its quoted text ends; the retraction glued after
    # it (no newline between, as a paste or a lost flush leaves it) is the engine's.
    lines = _queueing_log()
    glued = (
        SG.format(s=10)
        + "Receive: obj=GenerateReqInput(text='hello there', rid='a1')"
        + SG.format(s=11)
        + RETRACT
    )
    lines[12:12] = [glued] * 3
    _, report, text = _run_all_formats(capsys, tmp_path, lines)
    scan = report["scan"]
    assert scan["recognised"]["preemption"] == 3  # type: ignore[index]
    assert DECOY not in scan["skipped"]  # type: ignore[index]
    evidence = report["verdict"]["evidence"]  # type: ignore[index]
    assert "sglang.retract" in [e["signature"] for e in evidence]  # type: ignore[union-attr]
    assert "hello there" not in text


def test_a_warning_glued_after_a_prompt_still_open_is_a_decoy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = _queueing_log()
    lines[12:12] = [SG.format(s=10) + f"Receive: obj=GenerateReqInput(text='{CANARY} {RETRACT}"]
    _, report, text = _run_all_formats(capsys, tmp_path, lines)
    assert report["verdict"]["class"] == "queueing"  # type: ignore[index]
    assert report["scan"]["skipped"][DECOY] == 1  # type: ignore[index]
    assert CANARY not in text


# --- found by bench/fuzz.py -------------------------------------------------------------


def _wrap(line: str, width: int) -> list[str]:
    return [line[i : i + width] for i in range(0, len(line), width)]


def _glued_pieces(pieces: list[str]) -> list[str]:
    # the first piece glued after another line's end, the middle ones to each other
    assert len(pieces) >= 3
    return ["request processing complete" + pieces[0], "".join(pieces[1:-1]), pieces[-1]]


_TORCH_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def _cr_pieces(pieces: list[str]) -> list[str]:
    # line ends of a wrap, some \n, some \r, some \r\r (an empty piece)
    assert len(pieces) == 4
    return ['"} 0.0\r' + pieces[0], "\r" + pieces[1] + "\r", pieces[2] + "\r" + pieces[3] + "\r\r"]


def _cr_in_a_wrapped_line(record: str) -> list[str]:
    # another record's tail, \r\r, then this one, cut inside its prompt at the
    # physical line's width; the rest on the next line, shorter
    cut = record.index("Prompt: ") + 20
    first = "Z" * 150 + "\r\r" + record[:cut]
    assert len(record) - cut < len(first)
    return [first, record[cut:]]


_OPENAI_ERROR = f"openai.BadRequestError: Error code: 400 - message='{CANARY} {RETRACT} {CANARY}'"
_OPENAI_ERROR_CUT = "openai.BadRequestError: Error code: 400 - mes"  # the first piece


@pytest.mark.parametrize(
    "lines",
    [
        # glued to the line before it (no newline): LangChain's key after a word
        ['INFO:     10.0.5.19:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
         f"Prompt after formatting:{CANARY} {RETRACT}"],
        # a `Prompt:` line a narrow terminal wrapped: the signal text is on a piece
        _wrap(VL.format(s=3) + f"Prompt: {CANARY} {RETRACT} {CANARY}", 80),
        # ...with the key itself cut in two by the wrap
        _wrap(VL.format(s=3) + f"Prompt: {CANARY} {RETRACT} {CANARY}", 49),
        # a quoted prompt wrapped
        _wrap(SG.format(s=3) + f"Receive: obj=GenerateReqInput(text='{CANARY} {RETRACT}')", 60),
        # a JSON body wrapped between the key's quotes: `{"` / `inputs": "…`
        _wrap(SG.format(s=3) + '{"inputs": "' + f'{CANARY} {RETRACT}"}}', len(SG) - 2),
        # a \r inside the line (a tqdm redraw, a CR line end of another machine)
        _wrap(f"cluster]\rPrompt after formatting:\r{CANARY} {RETRACT}", 40),
        # found by bench/fuzz.py (seed 2028, input 18085): a wrapped line whose last
        # piece ends in LangChain's key, cut by the wrap (`…16P` / `rompt after
        # formatting:`), and the prompt body below it, wrapped too
        [
            *_wrap(VL.format(s=3) + 'request prompt="hi" max_tokens=16Prompt after formatting:',
                   len(VL.format(s=3) + 'request prompt="hi" max_tokens=16P')),
            *_wrap(f"{CANARY} {RETRACT} {CANARY}",
                   len(VL.format(s=3) + 'request prompt="hi" max_tokens=16P')),
        ],
        # found by bench/fuzz.py (seed 8081, input 9045): an OpenAI error's `message='`
        # wrapped, the pieces' line ends turned into \r (mixed line ends): one line
        # whose key is cut by a \r
        ["\r".join(_wrap(VL.format(s=3) + _OPENAI_ERROR,
                          len(VL.format(s=3) + _OPENAI_ERROR_CUT)))],
        # found by bench/fuzz.py (seed 8081, input 774): a `Prompt:` line wrapped with
        # its key cut (`…Promp` / `t: …`), the pieces then glued to other lines and to
        # each other: no longer as wide as the wrap, but the key still runs across
        _glued_pieces(_wrap(VL.format(s=3) + f"Prompt: {CANARY} {RETRACT} {CANARY}", 40)),
        # found by bench/fuzz.py (seed 9091, input 5317): the same wrap, some of its
        # newlines turned into \r (mixed line ends): pieces of it on one line
        _cr_pieces(_wrap(VL.format(s=3) + f"Prompt: {CANARY}xxxxx {_TORCH_OOM} {CANARY}", 40)),
        # found by bench/fuzz.py (seed 10101, input 9511): a line wrapped at its width,
        # \r\r inside its first physical line: the pieces are not the wrap, the lines are
        _cr_in_a_wrapped_line(VL.format(s=3) + f"Prompt: {CANARY} {RETRACT} {CANARY}"),
    ],
    ids=[
        "glued_langchain",
        "wrapped_prompt",
        "key_cut_by_wrap",
        "wrapped_quoted",
        "json_key_cut",
        "carriage_return_inside",
        "wrapped_key_at_a_lines_end_then_wrapped_body",
        "seed_8081_index_9045_key_cut_by_a_carriage_return",
        "seed_8081_index_774_key_cut_by_a_wrap_then_glued",
        "seed_9091_index_5317_key_cut_by_a_wrap_pieces_joined_by_cr",
        "seed_10101_index_9511_wrap_of_physical_lines_holding_cr",
    ],
)  # fmt: skip
def test_request_text_in_glued_and_wrapped_lines_stays_a_decoy(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str]
) -> None:
    log = _queueing_log()
    for _ in range(5):
        log[12:12] = lines
    _, report, text = _run_all_formats(capsys, tmp_path, log)
    assert report["verdict"]["class"] == "queueing"  # type: ignore[index]
    assert report["scan"]["skipped"][DECOY] >= 5  # type: ignore[index]
    assert CANARY not in text


def test_lines_below_unquoted_prompt_text_are_records_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # `Prompt: …` text ends with its line; the retractions below it, on lines that do
    # not look wrapped (longer than it), are the engine's own.
    log = _queueing_log()
    log[12:12] = [VL.format(s=3) + "Prompt: hi", "x" * 40 + " " + RETRACT] * 3
    _, report, _ = _run_all_formats(capsys, tmp_path, log)
    assert report["scan"]["recognised"]["preemption"] == 3  # type: ignore[index]
    assert DECOY not in report["scan"]["skipped"]  # type: ignore[index]


@pytest.mark.parametrize(
    "closing",
    [
        # Found by bench/fuzz.py: the closing line holds a CUDA OOM quote, then the
        # engine's own record glued on: the quote once became evidence, printed with
        # the prompt, because the glued record's literal let the line in.
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. {CANARY}', ",
        # Found by the fuzz test (fast path != reference): the closing line quotes a
        # key (`prompt: …`) of its own. Read alone, that key ran to the end of the
        # line and the fast path skipped the line as a decoy; the quote opened above
        # closes first, and the record glued after it counts.
        f"it said prompt: {'words ' * 40}CUDA out of memory {CANARY}', ",
    ],
    ids=["oom-quote", "quoted-key"],
)
def test_a_record_glued_where_a_multi_line_prompt_closes_counts_and_the_prompt_not(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, closing: str
) -> None:
    log = _queueing_log()
    log[12:12] = [
        VL.format(s=3) + f"Received request cmpl-2: prompt: '{CANARY} first line",
        closing + "params: SamplingParams(n=1)" + SG.format(s=4) + RETRACT,
    ]
    _, report, text = _run_all_formats(capsys, tmp_path, log)
    assert report["scan"]["recognised"]["preemption"] == 1  # type: ignore[index]
    assert "alloc" not in str(report["scan"]["recognised"])  # type: ignore[index]
    assert report["scan"]["skipped"][DECOY] == 1  # type: ignore[index]
    assert CANARY not in text


def test_a_record_glued_after_request_text_whose_key_a_carriage_return_cut(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Seen reading the matcher after seed 8081 input 9045: the raw line found the cut
    # key (`mes\rsage='…'`), but the matcher looked for request text again on the
    # normalised line, where the \r is a space, so the quoted retraction became
    # evidence (and its prompt with it) because a real record was glued after it.
    log = _queueing_log()
    log[12:12] = [
        VL.format(s=3)
        + f"400 - mes\rsage='{CANARY} {RETRACT} {CANARY}' "
        + SG.format(s=4)
        + RETRACT
    ]
    _, report, text = _run_all_formats(capsys, tmp_path, log)
    assert report["scan"]["recognised"]["preemption"] == 1  # type: ignore[index]
    assert report["scan"]["skipped"][DECOY] == 1  # type: ignore[index]
    assert CANARY not in text


# The quoted-string bodies as first written: one alternation tried per character.
# request_text writes them unrolled for speed; these are the reference they must equal.
_SQ_ALT = r"'(?!\[REDACTED:)(?:[^'\\\n]|\\[^\n])*+(?:'|\\?(?=\n|\Z))"
_DQ_ALT = r'"(?!\[REDACTED:)(?:[^"\\\n]|\\[^\n])*+(?:"|\\?(?=\n|\Z))'
_SQ_CLOSED_ALT = r"'(?:[^'\\\n]|\\[^\n])*+'"
_DQ_CLOSED_ALT = r'"(?:[^"\\\n]|\\[^\n])*+"'
# Texts built from what the bodies treat specially: quotes, backslashes, newlines,
# brackets, the marker's start and the keys.
_PIECES = st.sampled_from(
    [
        "'",
        '"',
        "\\",
        "\n",
        "\r",
        "a",
        " ",
        "[",
        "]",
        "[REDACTED:",
        "prompt: ",
        "text=",
        '"inputs": ',
    ]
)


@pytest.mark.parametrize(
    ("fast", "reference"),
    [
        (request_text.SQ, _SQ_ALT),
        (request_text.DQ, _DQ_ALT),
        (request_text.SQ_CLOSED, _SQ_CLOSED_ALT),
        (request_text.DQ_CLOSED, _DQ_CLOSED_ALT),
    ],
    ids=["SQ", "DQ", "SQ_CLOSED", "DQ_CLOSED"],
)
@settings(max_examples=400, deadline=None)
@given(text=st.lists(_PIECES, max_size=24).map("".join))
def test_the_unrolled_quote_bodies_match_what_the_alternation_matched(
    fast: str, reference: str, text: str
) -> None:
    got = [(m.start(), m.end()) for m in regex.finditer(fast, text)]
    want = [(m.start(), m.end()) for m in regex.finditer(reference, text)]
    assert got == want


def test_every_shape_built_on_the_reference_bodies_finds_the_same_spans() -> None:
    """The whole shapes, on the lines this file's tests use: the same spans with the
    bodies unrolled as with the alternation."""
    lines = [line for shape in _shapes(PREEMPT, "'").values() for line in shape]
    lines += [line for shape in _shapes(RETRACT, '"').values() for line in shape]
    reference = "|".join(f"(?P<{s.name}>{_as_reference(s.pattern)})" for s in request_text.SHAPES)
    fast = "|".join(f"(?P<{s.name}>{s.pattern})" for s in request_text.SHAPES)
    assert len(lines) > 20
    for line in lines:
        want = [(m.start(), m.end(), m.lastgroup) for m in regex.finditer(reference, line)]
        got = [(m.start(), m.end(), m.lastgroup) for m in regex.finditer(fast, line)]
        assert got == want, line


def _as_reference(pattern: str) -> str:
    for fast, ref in (
        (request_text.SQ, _SQ_ALT),
        (request_text.DQ, _DQ_ALT),
        (request_text.SQ_CLOSED, _SQ_CLOSED_ALT),
        (request_text.DQ_CLOSED, _DQ_CLOSED_ALT),
    ):
        pattern = pattern.replace(fast, ref)
    return pattern


# Texts made of triggers, their pieces and the characters around them.
_TRIGGER_TEXT = st.lists(
    st.sampled_from(
        [*request_text.TRIGGERS, "prompt", "Prompt", ":", "=", "'", '"', " ", "x", "\n"]
    ),
    max_size=12,
).map("".join)


# Texts up to the listing's limit are listed in one pass, longer ones searched: a
# limit of 0 sends these short texts the other way.
_EITHER_WAY = pytest.mark.parametrize("listed_at_most", [None, 0], ids=["listed", "searched"])


@_EITHER_WAY
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_TRIGGER_TEXT)
def test_triggered_finds_each_shape_whose_trigger_the_text_holds(
    monkeypatch: pytest.MonkeyPatch, listed_at_most: int | None, text: str
) -> None:
    if listed_at_most is not None:
        monkeypatch.setattr(request_text, "_LISTED_AT_MOST", listed_at_most)
    want = tuple(s.name for s in request_text.SHAPES if any(t in text for t in s.triggers))
    assert request_text.triggered(text) == want


@_EITHER_WAY
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_TRIGGER_TEXT, cut=st.integers(0, 40), last=st.integers(-1, 60))
def test_trigger_starts_in_is_a_find_of_each_trigger_bounded_by_where_it_starts(
    monkeypatch: pytest.MonkeyPatch, listed_at_most: int | None, text: str, cut: int, last: int
) -> None:
    if listed_at_most is not None:
        monkeypatch.setattr(request_text, "_LISTED_AT_MOST", listed_at_most)
    buf = bytearray(text.encode())
    start = min(cut, len(buf))
    want = any(buf.find(t, start, last + len(t)) != -1 for t in request_text.TRIGGER_BYTES)
    assert request_text.trigger_starts_in(buf, start, last) == want
