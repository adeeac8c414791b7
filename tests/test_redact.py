from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.render.redact import Redactor, redact

# Fake credentials are assembled at run time so secret scanners do not flag the
# source; they have the real shapes.
BEARER = "eyJhbGciOi" + "JIUzI1NiJ9x" + "Q7vKp2"
SK = "sk-" + "proj-" + "Ab12Cd34Ef56Gh78Ij90Kl12"
SK_ANT = "sk-" + "ant-api03-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3"
HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
GHP = "ghp_" + "A1b2C3d4E5" * 4
GHO = "gho_" + "Z9y8X7w6V5" * 4
GH_PAT = "github_pat_" + "11ABCDEFG0123456789_" + "abcdefghijklmnopqrstuv"
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NSJ9" + ".dBjftJeZ4CVPmB92K27uhbUJU1p1r"

PREFIX = "WARNING 09-11 17:21:29 scheduler.py:1560] Sequence group cmpl-71c6-0 "

# (line, the secret, the line as it must come out)
SECRET_LINES = [
    (
        f'{PREFIX}curl -H "Authorization: Bearer {BEARER}" http://localhost:8000/v1/completions',
        BEARER,
        f'{PREFIX}curl -H "Authorization: Bearer [REDACTED:bearer]" '
        "http://localhost:8000/v1/completions",
    ),
    (
        f"{PREFIX}forwarded with bearer {BEARER} to backend",
        BEARER,
        f"{PREFIX}forwarded with bearer [REDACTED:bearer] to backend",
    ),
    (
        f"{PREFIX}headers: {{'authorization': 'Basic dXNlcjpodW50ZXIy'}}",
        "dXNlcjpodW50ZXIy",
        f"{PREFIX}headers: {{'authorization': 'Basic [REDACTED:auth]'}}",
    ),
    (f"{PREFIX}client key {SK} loaded", SK, f"{PREFIX}client key [REDACTED:api_key] loaded"),
    (f"{PREFIX}judge={SK_ANT}", SK_ANT, f"{PREFIX}judge=[REDACTED:api_key]"),
    (
        f"{PREFIX}env OPENAI_API_KEY=Zq81secretvalue python bench.py",
        "Zq81secretvalue",
        f"{PREFIX}env OPENAI_API_KEY=[REDACTED:api_key] python bench.py",
    ),
    (
        f'{PREFIX}body {{"model": "m", "api_key": "Zq81secretvalue", "n": 1}}',
        "Zq81secretvalue",
        f'{PREFIX}body {{"model": "m", "api_key": "[REDACTED:api_key]", "n": 1}}',
    ),
    (
        f"{PREFIX}x-api-key: Zq81secretvalue",
        "Zq81secretvalue",
        f"{PREFIX}x-api-key: [REDACTED:api_key]",
    ),
    (
        "INFO 10-05 09:20:01 [utils.py:326] non-default args: {'model': 'meta-llama/Llama-3.1-8B',"
        " 'api_key': ['Zq81secretvalue', 'second'], 'max_num_seqs': 256}",
        "Zq81secretvalue",
        "INFO 10-05 09:20:01 [utils.py:326] non-default args: {'model': 'meta-llama/Llama-3.1-8B',"
        " 'api_key': [REDACTED:api_key], 'max_num_seqs': 256}",
    ),
    (
        f"{PREFIX}vllm serve m --api-key Zq81secretvalue --port 8000",
        "Zq81secretvalue",
        f"{PREFIX}vllm serve m --api-key [REDACTED:secret] --port 8000",
    ),
    (f"{PREFIX}HF_TOKEN={HF}", HF, f"{PREFIX}HF_TOKEN=[REDACTED:secret]"),
    (f"{PREFIX}downloading with {HF} now", HF, f"{PREFIX}downloading with [REDACTED:hf_token] now"),
    (f"{PREFIX}aws {AWS} us-east-1", AWS, f"{PREFIX}aws [REDACTED:aws_key] us-east-1"),
    (f"{PREFIX}git {GHP} ok", GHP, f"{PREFIX}git [REDACTED:github_token] ok"),
    (f"{PREFIX}git {GHO} ok", GHO, f"{PREFIX}git [REDACTED:github_token] ok"),
    (f"{PREFIX}git {GH_PAT} ok", GH_PAT, f"{PREFIX}git [REDACTED:github_token] ok"),
    (f"{PREFIX}session {JWT} expired", JWT, f"{PREFIX}session [REDACTED:jwt] expired"),
    (
        f"{PREFIX}cache redis://default:hunter2pw@redis.svc:6379/0",
        "hunter2pw",
        f"{PREFIX}cache redis://default:[REDACTED:password]@redis.svc:6379/0",
    ),
    (
        f"{PREFIX}owner alice.smith@example.com paged",
        "alice.smith@example.com",
        f"{PREFIX}owner [REDACTED:email] paged",
    ),
    (
        f"{PREFIX}login password=hunter2pw&user=bob",
        "hunter2pw",
        f"{PREFIX}login password=[REDACTED:password]&user=bob",
    ),
]


@pytest.mark.parametrize(("line", "secret", "expected"), SECRET_LINES)
def test_secrets_are_replaced_and_the_rest_kept(line: str, secret: str, expected: str) -> None:
    out = redact(line)
    assert secret not in out
    assert out == expected


VLLM_REQUEST = (
    "INFO 09-11 17:21:29 logger.py:39] Received request chatcmpl-1: prompt: "
    r"'tell me about \'x\' Bearer abcdef0123456789', "
    "params: SamplingParams(n=1, temperature=0.7, max_tokens=512), "
    "prompt_token_ids: [128000, 15339, 757, 922], lora_request: None."
)


def test_vllm_request_log_prompt_with_escaped_quotes() -> None:
    # 43 = the repr between the quotes: "tell me about " 14, "\'x\'" 5, " Bearer " 8, 16.
    assert redact(VLLM_REQUEST) == (
        "INFO 09-11 17:21:29 logger.py:39] Received request chatcmpl-1: prompt: "
        "[REDACTED:prompt 43 chars], "
        "params: SamplingParams(n=1, temperature=0.7, max_tokens=512), "
        "prompt_token_ids: [REDACTED:4 token ids], lora_request: None."
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # cut off by a log collector: no closing quote, redact to the end of the line
        (
            "Received request cmpl-9: prompt: 'Summarize the doc: it\\'s about sk-",
            "Received request cmpl-9: prompt: [REDACTED:prompt 34 chars]",  # \' counts 2
        ),
        # cut right after a backslash
        (
            "Received request cmpl-9: prompt: 'abc\\",
            "Received request cmpl-9: prompt: [REDACTED:prompt 4 chars]",
        ),
        # cut after an escaped quote: that quote does not close the repr
        (
            "Received request cmpl-9: prompt: 'abc\\'",
            "Received request cmpl-9: prompt: [REDACTED:prompt 5 chars]",
        ),
        # only this line is cut; the next line is untouched
        (
            "Received request cmpl-9: prompt: 'abc\nINFO next line",
            "Received request cmpl-9: prompt: [REDACTED:prompt 3 chars]\nINFO next line",
        ),
        # repr picks double quotes when the text holds an apostrophe
        (
            "Received request cmpl-9: prompt: \"it's Bob's\", params: SamplingParams(n=1)",
            "Received request cmpl-9: prompt: [REDACTED:prompt 10 chars], "
            "params: SamplingParams(n=1)",
        ),
        (
            "Request cmpl-9 details: prompt_token_ids: [128000, 791, 1176, 315",
            "Request cmpl-9 details: prompt_token_ids: [REDACTED:4 token ids]",
        ),
    ],
)
def test_truncated_and_other_prompt_forms(line: str, expected: str) -> None:
    assert redact(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            'POST /v1/completions {"model": "m", "prompt": "my \\"secret\\" plan", "max_tokens": 8}',
            'POST /v1/completions {"model": "m", "prompt": "[REDACTED:prompt 18 chars]", '
            '"max_tokens": 8}',
        ),
        (
            '{"model": "m", "messages": [{"role": "user", "content": "hi [there] {x}"}],'
            ' "stream": true}',
            '{"model": "m", "messages": [REDACTED:messages 47 chars], "stream": true}',
        ),
        # a body cut mid-array: the rest of the line goes
        (
            '{"model": "m", "messages": [{"role": "user", "content": "hi',
            '{"model": "m", "messages": [REDACTED:messages 32 chars]',
        ),
        (
            '  "content": "the quarterly numbers are",',
            '  "content": "[REDACTED:content 25 chars]",',
        ),
        (
            "{'role': 'user', 'content': 'Bob\\'s secret'}",
            "{'role': 'user', 'content': '[REDACTED:content 13 chars]'}",
        ),
        (
            '{"input": ["embed me", "and me"], "model": "e5"}',
            '{"input": [REDACTED:input 22 chars], "model": "e5"}',
        ),
    ],
)
def test_json_bodies(line: str, expected: str) -> None:
    assert redact(line) == expected


ORDINARY = [
    # V0 stats line
    "INFO 09-11 17:21:19 metrics.py:351] Avg prompt throughput: 1520.3 tokens/s, Avg generation "
    "throughput: 48.1 tokens/s, Running: 48 reqs, Swapped: 0 reqs, Pending: 31 reqs, "
    "GPU KV cache usage: 99.4%, CPU KV cache usage: 0.0%.",
    # V1 stats line
    "(APIServer pid=1) INFO 10-05 09:20:01 [loggers.py:123] Engine 000: Avg prompt throughput: "
    "0.0 tokens/s, Avg generation throughput: 812.3 tokens/s, Running: 61 reqs, Waiting: 40 reqs,"
    " GPU KV cache usage: 99.9%, Prefix cache hit rate: 12.5%, Preemptions: 7",
    # preemption warning
    "WARNING 09-11 17:21:29 scheduler.py:1560] Sequence group cmpl-71c6c2702c07450bb38a3a497140d0eb-0"
    " is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
    "This can affect the end-to-end performance. Increase gpu_memory_utilization or "
    "tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=51",
    # CUDA OOM with per-process memory
    "(EngineCore_DP0 pid=312) ERROR 10-05 09:20:01 [core.py:700] torch.OutOfMemoryError: CUDA out "
    "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.21 "
    "GiB is free. Process 133288 has 22.97 GiB memory in use. Including non-PyTorch memory, this "
    "process has 54.97 GiB memory in use. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    # SGLang batch and retract lines
    "[2025-03-01 10:00:00 TP0] Decode batch. #running-req: 12, #token: 56049, token usage: 0.95, "
    "gen throughput (token/s): 812.3, #queue-req: 4",
    "[2025-03-01 10:00:01 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
    "#new_token_ratio: 0.5000 -> 0.8000",
    # host OOM evidence
    "Jun 16 21:24:15 node-3 kernel: Out of memory: Killed process 133288 (python3) "
    "total-vm:123456kB, anon-rss:98765432kB, file-rss:0kB, shmem-rss:0kB, UID:0",
    "Jun 16 21:24:15 node-3 systemd[1]: user@1000.service: A process of this unit has been killed"
    " by the OOM killer.",
    "    State:          Terminated\n      Reason:       OOMKilled\n      Exit Code:    137",
    # config echo with secrets unset
    "INFO 10-05 09:20:01 [api_server.py:1]  args: Namespace(host=None, port=8000, api_key=None, "
    "max_num_seqs=256, max_num_batched_tokens=8192, gpu_memory_utilization=0.9)",
    "INFO 09-11 17:20:11 gpu_executor.py:122] # GPU blocks: 27215, # CPU blocks: 2048",
]


@pytest.mark.parametrize("line", ORDINARY)
def test_ordinary_log_lines_are_unchanged(line: str) -> None:
    assert redact(line) == line


def test_redactor_can_be_switched_off() -> None:
    assert Redactor()(VLLM_REQUEST) == redact(VLLM_REQUEST) != VLLM_REQUEST
    assert Redactor(enabled=False)(VLLM_REQUEST) == VLLM_REQUEST


def test_overlapping_candidates_settle_in_one_call() -> None:
    # The URL match keeps `https://authorization=user:`, which itself starts an
    # Authorization header; one call must already give the stable answer.
    out = redact("https://authorization=user:pw@host")
    assert out == "https://authorization=[REDACTED:auth]"
    assert redact(out) == out


FRAGMENTS = [
    "prompt: ", "'", '"', "\\", "\n", " ", "Bearer ", "Authorization: ", "api_key", "x-api-key",
    "password", "secret", "access_token", "=", ":", ",", "sk-", "sk-proj-", "A" * 16, "hf_",
    "x" * 30, "@", "b.com", ".", "[", "]", "{", "}", "[REDACTED:", "[REDACTED:x]", "eyJ",
    "eyJabcd.", "https://", "user:pw@", "--api-key ", '"messages": ', '"content": ',
    "'prompt': ", "prompt_token_ids: ", "None", "token", "AKIA", "ghp_", "github_pat_", "AIza",
    "xoxb-", "1.service", "é", "İ", "\u212a", "0",
]  # fmt: skip
FRAGMENT_TEXT = st.lists(
    st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=30
).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), FRAGMENT_TEXT))
def test_never_raises_and_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.text(), FRAGMENT_TEXT), max_size=6))
def test_texts_redaction_keeps_at_once_it_keeps_one_by_one(texts: list[str]) -> None:
    # (keeps may say no where each is kept: then each is redacted on its own)
    if Redactor().keeps(texts):
        assert [redact(t) for t in texts] == texts
    assert Redactor(enabled=False).keeps(texts)


def test_texts_redaction_keeps_at_once() -> None:
    kept = Redactor()
    # (the ordinary lines that hold no trigger's literal: a stats line's shapes)
    stats = [line for line in ORDINARY if kept.keeps([line])]
    assert len(stats) >= 5 and all(redact(line) == line for line in stats)
    assert kept.keeps(stats) and kept.keeps([]) and kept.keeps(["", ""])
    assert not kept.keeps([*stats, "key sk-ab12cd34ef56 used"])
    assert not kept.keeps(["a\rb"])  # (a carriage return joins what it separates)
    # each half of a secret's literal alone, in two texts, is no trigger
    assert kept.keeps(["ends with s", "k-ab12cd34ef56"])


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("redis://:S3cretPass@cache:6379/0", "redis://:[REDACTED:password]@cache:6379/0"),
        ("GenerateReqInput(text='Summarise the minutes')", "GenerateReqInput(text='[REDACTED:prompt 21 chars]')"),
        ('llm.generate(prompt="about Halvorsen")', 'llm.generate(prompt="[REDACTED:prompt 15 chars]")'),
        ("Request(prompt_text='secret words')", "Request(prompt_text='[REDACTED:prompt 12 chars]')"),
        ("Authorization: Bearer tok:AbCdEf123456", "Authorization: Bearer [REDACTED:bearer]"),
        ("key sk-ab12cd34ef56 used", "key [REDACTED:api_key] used"),
        ("hf_AbCdEf123456 loaded", "[REDACTED:hf_token] loaded"),
        ("url?token=abcdef123&x=1", "url?token=[REDACTED:secret]&x=1"),
        ("Cookie: session=abc123; other=1", "Cookie: [REDACTED:secret]"),
        ("glpat-AbCdEfGhIjKlMnOpQrSt", "[REDACTED:gitlab_token]"),
        ("sk_live_AbCdEf1234567890", "[REDACTED:stripe_key]"),
        ("-----BEGIN RSA PRIVATE KEY-----MIIEpAIBAAK-----END RSA PRIVATE KEY-----", "[REDACTED:pem]"),
        ("x?X-Amz-Signature=abcdef0123&y=1", "x?X-Amz-Signature=[REDACTED:signature]&y=1"),
        ("c/x?sv=2020&sig=AbCd%2Bef%3D", "c/x?sv=2020&sig=[REDACTED:signature]"),
        ('{"inputs": "my question", "parameters": {}}', '{"inputs": "[REDACTED:inputs 11 chars]", "parameters": {}}'),
    ],
    ids=[
        "redis_empty_user", "sglang_text", "generate_prompt", "prompt_text", "bearer_with_colon",
        "short_sk", "short_hf", "token_param", "cookie", "gitlab", "stripe", "pem", "amz_sig",
        "azure_sig", "tgi_inputs",
    ],
)  # fmt: skip
def test_more_secret_and_request_text_shapes(line: str, want: str) -> None:
    assert redact(line) == want


@pytest.mark.parametrize(
    "line",
    [
        "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 1, #token: 56049, token usage: 0.97",
        "scikit-learn sk-learn ok",
        "(EngineCore pid=1) INFO 12-01 22:38:23 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGINT",
        "max_model_len=2048, context='x'",
    ],
)
def test_log_shapes_that_only_look_like_secrets_are_kept(line: str) -> None:
    assert redact(line) == line


def test_a_secret_glued_to_a_request_key_takes_neither_with_it() -> None:
    # Found by bench/fuzz.py: `token=…` took the glued key's first word as its value
    # ("…SecretPrompt"), and the prompt after it no longer looked like one.
    line = "#queue-req: 5, token=Zqx7Secret9Prompt after formatting:my private plan KV cache"
    out = redact(line)
    assert "Zqx7Secret9" not in out and "private plan" not in out
    assert redact(out) == out
