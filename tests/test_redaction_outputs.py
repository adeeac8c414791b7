"""Safe to paste: no credential or prompt text in the evidence reaches any output.

The fixtures put secrets on the very lines that become evidence (preemption warnings,
the hottest stats lines, the CUDA OOM line), inside what the terminal and Markdown show
of a long line (its head and its proof) and beyond it, where only JSON and SARIF reach.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from preemptdiag.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "secrets_in_log"

# Token-shaped fakes are assembled at run time and put in place of the fixtures'
# @NAME@ placeholders, so secret scanners do not flag the repository.
TOKENS = {
    "@SK_LIVE@": "sk-" + "live-" + "Qw3rTy7UiOp9AsDf2GhJ",
    "@HF_TOKEN@": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "@JWT@": "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NSJ9" + ".dBjftJeZ4CVPmB92K27uhbUJU1p1r",
}

# Every credential and piece of user text in the fixtures. Single words only: a
# terminal wrap breaks lines at spaces and must never split a needle and hide a leak.
SECRETS = (
    *TOKENS.values(),
    "Tr0ub4dor-and-3",  # URL password
    "Gr8-Pa55-word",  # URL password
    "ZqSecretValue81",  # api_key= / x-api-key: / "api_key": value
    "marguerite.oyelaran@example.com",
    "kwame.asante@example.org",
    "dmitri.volkov@example.net",
    "Nightjar",  # prompt and message text
    "Halvorsen",
    "078-05-1120",
    "Winter-Harbour-2024",
    "15773",  # prompt token ids
    "31741",
    "80775",
)

# scenario file -> (verdict class, text of the evidence that must survive redaction)
SCENARIOS = {
    "v0_thrash_loop.log": ("thrash_loop", "is preempted by PreemptionMode.RECOMPUTE"),
    # The OOM error sits past the first 200 characters; terminal/Markdown keep it in view.
    "v0_cuda_oom.log": ("allocation_failure", "OutOfMemoryError: CUDA out of memory."),
}
FORMATS = ("terminal", "markdown", "json", "sarif")


def _materialise(name: str, where: Path) -> str:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    for placeholder, token in TOKENS.items():
        text = text.replace(placeholder, token)
    assert "@SK_LIVE@" not in text and "@HF_TOKEN@" not in text and "@JWT@" not in text
    (where / name).write_text(text, encoding="utf-8")
    return name


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Short relative names and a fixed width keep the terminal's evidence column wide,
    # so a long token is never broken across lines (which would hide it from `in`).
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.setenv("NO_COLOR", "1")
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _leaked(out: str) -> list[str]:
    return [s for s in SECRETS if s in out]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_secret_survives_in_any_format(
    workdir: Path, capsys: pytest.CaptureFixture[str], scenario: str, fmt: str
) -> None:
    cls, evidence = SCENARIOS[scenario]
    name = _materialise(scenario, workdir)
    code, out = _run(capsys, ["analyze", "--format", fmt, name])
    assert code == 1, out
    assert _leaked(out) == []
    assert cls in out
    assert evidence in out
    assert "[REDACTED:" in out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_redact_shows_the_secrets(
    workdir: Path, capsys: pytest.CaptureFixture[str], scenario: str, fmt: str
) -> None:
    # Proves the secrets sit where each format shows evidence: the test above can fail.
    name = _materialise(scenario, workdir)
    code, out = _run(capsys, ["analyze", "--no-redact", "--format", fmt, name])
    assert code == 1, out
    assert _leaked(out) != []
    assert "[REDACTED:" not in out


def _evidence_texts(report: dict[str, Any]) -> dict[int, str]:
    """Line number -> text for every evidence event of every window."""
    return {e["line"]: e["text"] for w in report["windows"] for e in w["evidence"]}


def _fixture_line(name: str, lineno: int) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()[lineno - 1]


def test_redaction_keeps_the_evidence_line_shape(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = _materialise("v0_thrash_loop.log", workdir)
    code, out = _run(capsys, ["analyze", "--format", "json", name])
    assert code == 1
    texts = _evidence_texts(json.loads(out))

    # The hottest stats line: URL password and api_key value go, the numbers stay.
    assert texts[28] == (
        _fixture_line(name, 28)
        .replace("Tr0ub4dor-and-3", "[REDACTED:password]")
        .replace("ZqSecretValue81", "[REDACTED:api_key]")
    )
    assert "GPU KV cache usage: 99.9%" in texts[28]

    # A preemption warning with the request's prompt and token ids glued behind it.
    assert texts[48].endswith(
        "total_num_cumulative_preemption=151 while serving chat-f35ec9020a9642f0: "
        "prompt: [REDACTED:prompt 74 chars], prompt_token_ids: [REDACTED:9 token ids]"
    )
    # ... and one with a JSON request body: the messages go, the other keys stay.
    assert texts[42].endswith(
        'request={"model": "meta-llama/Llama-3.1-8B-Instruct", '
        '"messages": [REDACTED:messages 162 chars], "max_tokens": 2048}'
    )


def test_sarif_snippets_are_the_redacted_evidence(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = _materialise("v0_cuda_oom.log", workdir)
    main(["analyze", "--format", "json", name])
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    main(["analyze", "--format", "sarif", name])
    sarif = json.loads(capsys.readouterr().out)
    snippets = [
        loc["physicalLocation"]["region"]["snippet"]["text"]
        for result in sarif["runs"][0]["results"]
        for loc in result["locations"]
    ]
    assert snippets == [e["text"] for e in verdict["evidence"]]
    oom = next(s for s in snippets if "CUDA out of memory" in s)
    assert "user=[REDACTED:email] via https://svc-bot:[REDACTED:password]@api.internal/v1" in oom
    assert '"prompt": "[REDACTED:prompt 36 chars]", "api_key": "[REDACTED:api_key]"}' in oom


def test_check_and_quiet_print_no_secrets(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [_materialise(n, workdir) for n in sorted(SCENARIOS)]
    code, out = _run(capsys, ["check", *names])
    assert code == 1
    lines = out.splitlines()
    assert [ln.split(" ")[:2] for ln in lines] == [
        ["v0_cuda_oom.log:", "allocation_failure"],
        ["v0_thrash_loop.log:", "thrash_loop"],
    ]
    assert _leaked(out) == []

    for name in names:
        code, out = _run(capsys, ["analyze", "--quiet", name])
        assert code == 1
        assert out.count("\n") == 1
        assert out.startswith(SCENARIOS[name][0])
        assert _leaked(out) == []
