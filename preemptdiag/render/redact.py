"""Keep prompt text and secrets out of reports.

Evidence lines are echoed into terminals, tickets and runbooks; vLLM's request log
(`Received request ...: prompt: '...'`) and pasted HTTP bodies put user text and
credentials on the same lines. Every echoed line goes through `redact`: one
combined pattern, scanned once, leftmost match wins, and a replacement that keeps
the line's shape: `prompt: [REDACTED:prompt 123 chars]`.

Speed: a pattern of sixteen alternatives tried at every position costs ~150 us on a
200-character line, because no alternative starts with a literal the engine can skip
to. Each alternative therefore has a cheap necessary condition (a substring it cannot
match without); only the alternatives whose condition holds are combined, and that
combination is compiled once and cached. Most log lines trigger none or one.

Markers never match again (every alternative refuses a value that starts with
`[REDACTED:`), and `redact` rescans its own output until it is stable, so
redacting twice changes nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

# The project's mypy config has no override for regex and types-regex is not a
# test dependency yet; `unused-ignore` keeps this quiet once the stubs arrive.
import ahocorasick_rs
import regex  # type: ignore[import-untyped, unused-ignore]

from preemptdiag.model import request_text
from preemptdiag.scan.prefilter import Literals

_MARK = "[REDACTED:"
_MAX_PASSES = 64  # a guard against a bug, not a limit real lines reach

# Each alternative is (name, pattern). Inner groups are prefixed with the name so
# the combined pattern has unique group names. Request text first: its shapes are
# the scanner's decoys too (model/request_text.py), one list for both.
_ALTERNATIVES: tuple[tuple[str, str], ...] = (
    *((s.name, s.pattern) for s in request_text.SHAPES),
    (
        "auth",
        r"(?P<auth_k>(?<![A-Za-z0-9])(?i:(?:proxy-)?authorization)[\"']?\s*+[:=]\s*+[\"']?"
        r"(?:(?P<auth_s>(?i:bearer|basic|token|digest|apikey))\s++)?+)"
        r"(?P<auth_v>(?!\[REDACTED:)[^\s\"',;]++)",
    ),
    # `--api-key X` on a command line (the `=` form is caught by "kv").
    ("cli", r"(?P<cli_k>--(?:api-key|hf-token|password)\s++)(?P<cli_v>(?![-\[])[^\s\"']++)"),
    (
        "kv",
        r"(?P<kv_k>(?<![A-Za-z0-9])"
        r"(?P<kv_n>(?i:x-api-key|api[_-]?key|apikey|access[_-]?token|auth[_-]?token"
        r"|refresh[_-]?token|id[_-]?token|client[_-]?secret|secret(?:[_-]?access)?[_-]?key"
        r"|secret|password|passwd|hf[_-]?token|hub[_-]?token|private[_-]?key))"
        r"(?![A-Za-z0-9])[\"']?\s*+[:=]\s*+)"
        r"(?P<kv_v>(?![\"']?\[REDACTED:|None\b|null\b|\"\"|'')"
        r"(?:\"[^\"\r\n]*+\"?|'[^'\r\n]*+'?|\[[^\]\r\n]*+\]?|[^\s\"',;&)}\]]++))",
    ),
    (
        "bearer",
        r"(?P<bearer_k>(?i:\bbearer)\s++)"
        r"(?P<bearer_v>(?!(?i:tokens?|auth\w*)\b)(?!\[REDACTED:)[A-Za-z0-9\-._~+/:]{6,}+=*+)",
    ),
    (
        "url",
        r"(?P<url_k>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*+://[^/\s:@]*+:)"
        r"(?P<url_v>(?!\[REDACTED:)[^/\s@]++)(?=@)",
    ),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{4,}+\.eyJ[A-Za-z0-9_\-]{4,}+\.[A-Za-z0-9_\-]*+"),
    ("api_key", r"\bsk-(?:proj-|ant-|svcacct-|admin-)?(?=[A-Za-z0-9_\-]*\d)[A-Za-z0-9_\-]{10,}+"),
    ("hf_token", r"\bhf_[A-Za-z0-9]{10,}+"),
    # Stripe, GitLab, PEM private keys, signed-URL parameters, cookies, `token=`
    ("stripe_key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{10,}+"),
    ("gitlab_token", r"\bglpat-[A-Za-z0-9_\-]{16,}+"),
    (
        "pem",
        r"-----BEGIN [A-Z ]{0,30}PRIVATE KEY-----(?:[^\r\n-]|-(?!----END))*+"
        r"(?:-----END [A-Z ]{0,30}PRIVATE KEY-----)?",
    ),
    (
        "sig",
        r"(?P<sig_k>(?<![A-Za-z0-9_-])(?i:x-amz-signature|x-amz-credential|x-amz-security-token"
        r"|x-goog-signature|sig|signature)=)(?P<sig_v>(?!\[REDACTED:)[^&\s\"',;]++)",
    ),
    (
        "cookie",
        r"(?P<cookie_k>(?<![A-Za-z0-9-])(?i:set-cookie|cookie):[ ]?+)(?P<cookie_v>(?!\[REDACTED:)[^\r\n\"']++)",
    ),
    (
        "tokeq",
        r"(?P<tokeq_k>(?<![A-Za-z0-9#_.-])(?i:token)=)(?P<tokeq_v>(?!\[REDACTED:)[^&\s\"',;]++)",
    ),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}+|github_pat_[A-Za-z0-9_]{22,}+)"),
    ("aws_key", r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    ("google_key", r"\bAIza[A-Za-z0-9_\-]{35}"),
    ("slack_token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}+"),
    (
        "email",
        # Linear on long dotted runs: start only where a run of address characters
        # starts, take the domain possessively, then look back at its last label
        # (letters, not a systemd unit type: `user@1000.service` is host-OOM evidence).
        r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]++@[A-Za-z0-9\-]++(?:\.[A-Za-z0-9\-]++)++"
        r"(?<=\.[A-Za-z]{2,})"
        r"(?<!\.(?:service|scope|slice|socket|mount|target|timer|device|swap|path))",
    ),
)

_NAMES = tuple(name for name, _ in _ALTERNATIVES)
_PATTERNS = dict(_ALTERNATIVES)
# Keys of "kv" that end in "token"; bare `token:` is SGLang's `#token: 56049`.
_TOKEN_KEY = regex.compile(r"(?:access|auth|refresh|id|hf|hub)[_-]?token")
_CLI_FLAGS = ("--api-key", "--hf-token", "--password")
_GH_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")


def _any_in(text: str, words: tuple[str, ...]) -> bool:
    return any(w in text for w in words)


def _has_any(words: tuple[str, ...]) -> Callable[[str, str], bool]:
    return lambda t, _: _any_in(t, words)


# Necessary conditions, (text, lowercased text) -> bool, one per alternative: each is
# implied by its pattern, so leaving the others out never changes the result.
_TRIGGERS: dict[str, Callable[[str, str], bool]] = {
    **{s.name: _has_any(s.triggers) for s in request_text.SHAPES},
    "auth": lambda _, low: "authorization" in low,
    "cli": lambda t, _: _any_in(t, _CLI_FLAGS),
    "kv": lambda _, low: (
        _any_in(low, ("key", "secret", "passw"))
        or ("token" in low and _TOKEN_KEY.search(low) is not None)
    ),
    "bearer": lambda _, low: "bearer" in low,
    "url": lambda t, _: "://" in t and "@" in t,
    "jwt": lambda t, _: "eyJ" in t,
    "api_key": lambda t, _: "sk-" in t,
    "stripe_key": lambda t, _: "k_live_" in t or "k_test_" in t,
    "gitlab_token": lambda t, _: "glpat-" in t,
    "pem": lambda t, _: "PRIVATE KEY-----" in t,
    "sig": lambda _, low: "sig" in low and "=" in low,
    "cookie": lambda _, low: "cookie:" in low,
    "tokeq": lambda _, low: "token=" in low,
    "hf_token": lambda t, _: "hf_" in t,
    "github_token": lambda t, _: _any_in(t, _GH_PREFIXES),
    "aws_key": lambda t, _: "AKIA" in t or "ASIA" in t,
    "google_key": lambda t, _: "AIza" in t,
    "slack_token": lambda t, _: "xox" in t,
    "email": lambda t, _: "@" in t,
}


# A text that fires no trigger comes back from `redact` as it is, and telling that by
# the triggers costs ~12 us a line (two dozen tests, twice): a month of stats lines
# spends seconds on it. Every trigger above needs one of these literals, in the text
# (_CASED) or in its lowercase form (_LOWER; kv's token keys spelled out), so a text
# holding none fires none; two Aho-Corasick passes (~2 us) say so. A trigger added
# above needs its literals here: test_redact checks each trigger against this.
_CASED = (
    *request_text.TRIGGERS,
    *_CLI_FLAGS,
    *_GH_PREFIXES,
    *("@", "eyJ", "sk-", "k_live_", "k_test_", "glpat-", "PRIVATE KEY-----", "hf_"),
    *("AKIA", "ASIA", "AIza", "xox"),
)
_LOWER = (
    *("authorization", "key", "secret", "passw", "bearer", "sig", "cookie:", "token="),
    *(
        f"{k}{sep}token"
        for k in ("access", "auth", "refresh", "id", "hf", "hub")
        for sep in ("", "_", "-")
    ),
)
_CASED_AC = ahocorasick_rs.AhoCorasick(list(dict.fromkeys(_CASED)))
_LOWER_AC = ahocorasick_rs.AhoCorasick(list(dict.fromkeys(_LOWER)))


# A long ASCII text (a run of windows' evidence lines, Redactor.keeps) is looked at by
# prefilter.Literals (hyperscan where installed: ~10x these passes, which took ~60 ms
# of a month's windows); its lowercase form is its ASCII letters lowered.
_FOUND_ALL = all(lit.isascii() for lit in (*_CASED, *_LOWER))  # (Literals takes ASCII)
_FOUND_MIN = 4096
_CASED_ONCE, _LOWER_ONCE = tuple(dict.fromkeys(_CASED)), tuple(dict.fromkeys(_LOWER))


def _may_trigger(text: str) -> bool:
    """False only when no trigger can fire on `text` (see _CASED)."""
    if _FOUND_ALL and len(text) >= _FOUND_MIN and text.isascii():
        # (made on first use, as hyperscan compiles them: ~10 ms a run that needs none)
        return bool(
            Literals.of(_CASED_ONCE).found(text.encode("ascii"))
            or Literals.of(_LOWER_ONCE).found(text.lower().encode("ascii"))
        )
    return bool(
        _CASED_AC.find_matches_as_indexes(text) or _LOWER_AC.find_matches_as_indexes(text.lower())
    )


def _triggered(text: str) -> tuple[str, ...]:
    low = text.lower()
    return tuple(name for name in _NAMES if _TRIGGERS[name](text, low))


@functools.lru_cache(maxsize=128)
def _combined(names: tuple[str, ...]) -> regex.Pattern[str]:
    return regex.compile("|".join(f"(?P<{n}>{_PATTERNS[n]})" for n in names), regex.VERSION1)


def _quoted_len(v: str) -> int:
    """Characters between the quotes. A value cut off by truncation has no closing
    quote; a final quote preceded by an odd run of backslashes is escaped, not closing."""
    q, inner = v[0], v[1:]
    if inner.endswith(q):
        backslashes = len(inner) - 1 - len(inner[:-1].rstrip("\\"))
        if backslashes % 2 == 0:
            inner = inner[:-1]
    return len(inner)


def _replace(m: regex.Match[str]) -> str:
    kind = next(n for n, v in m.groupdict().items() if n in _PATTERNS and v is not None)
    if kind == "prompt":
        return f"{m['prompt_k']}{_MARK}prompt {_quoted_len(m['prompt_v'])} chars]"
    if kind == "ids":
        n = len(regex.findall(r"\d+", m["ids_v"]))
        return f"{m['ids_k']}{_MARK}{n} token ids]"
    if kind == "body":
        key, val = m["body_k"], m["body_v"]
        what = regex.sub(r"[\"'\s:]", "", key)
        if val[0] in "\"'":
            return f"{key}{val[0]}{_MARK}{what} {_quoted_len(val)} chars]{val[0]}"
        return f"{key}{_MARK}{what} {len(val)} chars]"
    if kind == "auth":
        scheme = (m["auth_s"] or "").lower()
        return f"{m['auth_k']}{_MARK}{'bearer' if scheme == 'bearer' else 'auth'}]"
    if kind == "cli":
        return f"{m['cli_k']}{_MARK}secret]"
    if kind == "kv":
        name = m["kv_n"].lower().replace("-", "_")
        label = "api_key" if "api" in name else "password" if "pass" in name else "secret"
        val = m["kv_v"]
        if val[0] in "\"'":
            return f"{m['kv_k']}{val[0]}{_MARK}{label}]{val[0]}"
        return f"{m['kv_k']}{_MARK}{label}]"
    if kind == "bearer":
        return f"{m['bearer_k']}{_MARK}bearer]"
    if kind == "url":
        return f"{m['url_k']}{_MARK}password]"
    if kind in ("sig", "cookie", "tokeq"):
        return f"{m[kind + '_k']}{_MARK}{'signature' if kind == 'sig' else 'secret'}]"
    if kind == "reqtext":
        v = m["reqtext_v"]
        return f"{m['reqtext_k']}{v[0]}{_MARK}prompt {_quoted_len(v)} chars]{v[0]}"
    if kind == "rawprompt":
        v = m["rawprompt_v"]
        return f"{m['rawprompt_k']}{_MARK}prompt {len(v)} chars]" if v else m[0]
    return f"{_MARK}{kind}]"


def redact(text: str) -> str:
    """`text` with prompt text and credentials replaced by `[REDACTED:kind]` markers."""
    # A replacement keeps its key (`Authorization: `, `user:` of a URL), and a kept
    # key can hold the start of a match that lost to an earlier, overlapping one
    # (`https://authorization=user:pw@`). Rescan until nothing changes: every
    # changing pass turns at least one character that is not a marker into a
    # marker, so this ends; in practice a second pass confirms and stops.
    #
    # Request text goes first, on its own: a secret's value glued to a request key
    # (`token=abcPrompt after formatting: …`) would otherwise take the key's first
    # word with it, and the prompt after it would no longer look like one.
    if "\r" in text:
        # A \r joins what it separates (request_text.spans): a key cut by one
        # (`mes\rsage='…'`, kept so by the scan for this) is redacted whole.
        joined = text.replace("\r", "")
        out = redact(joined)
        if out != joined:
            return out
    if not _may_trigger(text):
        return text
    if len(text) <= _CACHED_LEN:
        return _redact_cached(text)
    return _redact_triggered(text)


def _redact_triggered(text: str) -> str:
    return _settle(_settle(text, _REQUEST_NAMES), _NAMES)


# The same evidence line is often redacted more than once (a window's and the
# verdict's, a rollup's member in several roles); a line that needs the regexes costs
# 30-150 us, so short ones are remembered (bounded: 4096 lines of at most 2,000 chars).
_CACHED_LEN = 2000
_redact_cached = functools.lru_cache(maxsize=4096)(_redact_triggered)


_REQUEST_NAMES = frozenset(request_text.NAMES)


def _settle(text: str, allowed: Collection[str]) -> str:
    for _ in range(_MAX_PASSES):
        names = tuple(n for n in _triggered(text) if n in allowed)
        if not names:
            return text
        out: str = _combined(names).sub(_replace, text)
        if out == text:
            return text
        text = out
    return text


@dataclass(frozen=True)
class Redactor:
    """The redaction policy for one run; `enabled=False` is `--no-redact`."""

    enabled: bool = True

    def __call__(self, text: str) -> str:
        return redact(text) if self.enabled else text

    def keeps(self, texts: Sequence[str]) -> bool:
        """Whether this leaves every one of `texts` as it is, told by one look at
        them joined (a month of stats lines: one pass a line was most of redaction's
        time): no trigger's literal in the join (none holds a newline, so none spans
        two texts) and no carriage return."""
        if not self.enabled:
            return True
        joined = "\n".join(texts)
        return "\r" not in joined and not _may_trigger(joined)
