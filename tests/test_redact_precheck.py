"""The precheck in front of redact (_may_trigger): a text it passes over must be one
that no trigger fires on, so skipping the regexes changes nothing."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.render import redact as r

ROOT = Path(__file__).resolve().parent.parent

# One text per trigger that fires it. A trigger added to redact.py without a line
# here fails the first test: its literals must go into _CASED/_LOWER too.
FIRING = {
    "prompt": "Received request x: prompt: 'hello', params",
    "ids": "prompt_token_ids: [1, 2, 3]",
    "body": 'body {"messages": [{"role": "user"}]}',
    "reqtext": "GenerateReqInput(text='hello')",
    "rawprompt": "Prompt after formatting: hello",
    "auth": "AUTHORIZATION: Basic dXNlcjpwdw==",
    "cli": "--hf-token abcdef",
    "kv": "Client_Secret=abc",
    "bearer": "BEARER abcdefghij",
    "url": "redis://user:pw@host:6379",
    "jwt": "t eyJabcd.eyJabcd.sig",
    "api_key": "key sk-abc123def456",
    "stripe_key": "rk_live_abcdefghijkl",
    "gitlab_token": "glpat-abcdefghijklmnopqrst",
    "pem": "-----BEGIN RSA PRIVATE KEY-----abc",
    "sig": "url?X-Amz-Signature=abc",
    "cookie": "Set-Cookie: a=b",
    "tokeq": "?Token=abc",
    "hf_token": "hf_abcdefghijklmnop",
    "github_token": "ghs_" + "a" * 36,
    "aws_key": "ASIA" + "A" * 16,
    "google_key": "AIza" + "b" * 35,
    "slack_token": "xoxb-1234567890ab",
    "email": "mail bob@example.com",
}


def test_every_trigger_has_a_firing_text() -> None:
    assert set(FIRING) == set(r._NAMES)


def test_each_firing_text_passes_the_precheck() -> None:
    for name, text in FIRING.items():
        assert name in r._triggered(text), name
        assert r._may_trigger(text), name


def test_kv_token_keys_pass_and_plain_tokens_do_not() -> None:
    # "tokens/s" of every stats line is no kv key: the precheck must let it through
    # unread, and each spelled-out token key must stop it.
    assert not r._may_trigger("Avg prompt throughput: 353.8 tokens/s, Running: 15 reqs")
    for text in ("ACCESS-TOKEN: x", "hub_token=1", "idtoken: y", "HF-Token=z"):
        assert "kv" in r._triggered(text)
        assert r._may_trigger(text)


def test_unicode_lowercasing_is_read_the_same_way() -> None:
    # U+212A KELVIN SIGN lowercases to "k": the trigger sees "key", so must the precheck.
    text = "\u212aey=hunter2"
    assert "kv" in r._triggered(text)
    assert r._may_trigger(text)
    assert r.redact(text) == redact_slow(text)


def redact_slow(text: str) -> str:
    """redact as it was before the precheck and the cache."""
    return r._settle(r._settle(text, r._REQUEST_NAMES), r._NAMES)


_PIECES = st.sampled_from(
    [
        *r._CASED,
        *r._LOWER,
        *(w.upper() for w in r._LOWER),
        *(w.title() for w in r._LOWER),
        *(t for t in FIRING.values()),
        " ",
        "=",
        ":",
        "'",
        '"',
        "@",
        "\u212a",
        "\u0130",
        "tokens/s",
        "abc123XYZ",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=8).map("".join))
def test_the_precheck_never_skips_a_text_a_trigger_fires_on(text: str) -> None:
    if r._triggered(text):
        assert r._may_trigger(text)
    joined = text.replace("\r", "")
    if "\r" in text and redact_slow(joined) != joined:
        assert r.redact(text) == redact_slow(joined)  # a \r joins what it separates
    else:
        assert r.redact(text) == redact_slow(text)


def _may_trigger_ac(text: str) -> bool:
    """_may_trigger's Aho-Corasick passes, which a text under 4 KiB or outside ASCII
    always takes."""
    return bool(
        r._CASED_AC.find_matches_as_indexes(text)
        or r._LOWER_AC.find_matches_as_indexes(text.lower())
    )


_FILLER = "Avg prompt throughput: 353.8 tokens/s, Running: 15 reqs, Waiting: 0 reqs\n" * 60


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=8).map("".join),
    st.integers(0, len(_FILLER)),
)
def test_a_long_text_is_prechecked_as_its_lines_would_be(text: str, at: int) -> None:
    # (a run of windows' evidence lines joined: prefilter.Literals where it is ASCII)
    long = _FILLER[:at] + text + _FILLER[at:]
    assert len(long) >= r._FOUND_MIN and r._FOUND_ALL
    assert r._may_trigger(long) is _may_trigger_ac(long)
    assert not r._may_trigger(_FILLER)  # (what fires is in the text, or made at its edges)


def test_every_line_of_the_samples_redacts_as_before() -> None:
    files = [*ROOT.glob("samples/**/*.log"), *ROOT.glob("tests/fixtures/**/*.log")]
    assert files
    skipped = 0
    for path in files:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            assert r.redact(line) == redact_slow(line), line
            skipped += not r._may_trigger(line)
    assert skipped > 1000  # the stats lines, mostly


def test_a_cached_line_and_a_long_line_are_redacted_every_time() -> None:
    line = "INFO 11-04 16:02:00 args: Namespace(api_key='" + "k" * 20 + "')"
    want = "INFO 11-04 16:02:00 args: Namespace(api_key='[REDACTED:api_key]')"
    assert r.redact(line) == want
    assert r.redact(line) == want  # from the cache
    long = line + " " + "x" * (r._CACHED_LEN + 10)
    assert r.redact(long) == want + " " + "x" * (r._CACHED_LEN + 10)


def test_evidence_shared_by_two_windows_is_redacted_in_both() -> None:
    import dataclasses

    from builders import make_event, make_window

    from preemptdiag.commands.analyze import _redact_window
    from preemptdiag.model.records import Kind

    secret = dataclasses.replace(
        make_event(Kind.PREEMPTION, {"cumulative": 51}),
        text="WARNING preempted; retry with api_key=" + "Zk" * 10,
    )
    calm = make_event(Kind.STATS, {"kv_usage": 50.0}, minute=1)
    first, second, third = (
        make_window(0, evidence=(secret, calm)),
        make_window(1, evidence=(secret,)),
        make_window(2, evidence=(calm,)),
    )
    redactor = r.Redactor()
    got = [_redact_window(w, redactor) for w in (first, second, third)]
    for w in got[:2]:
        assert w.evidence[0].text == "WARNING preempted; retry with api_key=[REDACTED:api_key]"
    assert got[0].evidence[1] is calm  # nothing to redact: kept, not copied
    assert got[2] is third
    off = [_redact_window(w, r.Redactor(enabled=False)) for w in (first, second)]
    assert off[0] is first and off[1] is second
