"""bench/generate.py's kubectl-stamped profiles are the plain ones' lines, each with
the stamp `kubectl logs --timestamps` puts in front (what bench/README.md's `--kubectl`
rows compare against the plain logs)."""

from __future__ import annotations

import io
import re

from test_equivalence import _bench_generator

from preemptdiag.scan.lines import Line, normalise

_KUBECTL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")


def _pairs(profile: str) -> tuple[int, list[tuple[str, Line]]]:
    """The `profile` log's lines and, as many bytes of it `-kubectl` stamped, each of its
    lines as normalise reads it (each the plain one's line, stamped); and how many
    lines the plain one has."""
    gen = _bench_generator()
    plain, stamped = io.BytesIO(), io.BytesIO()
    gen.PROFILES[profile](plain, 200_000, 3)
    gen.PROFILES[f"{profile}-kubectl"](stamped, 200_000, 3)
    ours, theirs = plain.getvalue().decode().splitlines(), stamped.getvalue().decode().splitlines()
    out = []
    for line, wrapped in zip(ours, theirs, strict=False):
        m = _KUBECTL.match(wrapped)
        assert m is not None and wrapped[m.end() :] == line
        out.append((line, normalise(wrapped)))
    return len(ours), out


def test_the_kubectl_profile_is_the_plain_one_stamped() -> None:
    n, pairs = _pairs("vllm-stats")
    assert n == len(pairs) > 800
    for line, got in pairs:
        # (the stamp is the engine's second, a few ms on, as the tool reads it)
        assert (got.text, got.ts_kind) == (line, "iso")
        assert got.ts_wrapper is not None and got.ts_wrapper[5:19].replace("T", " ") in line


def test_the_stamped_thrash_profile_gives_each_ranks_copy_a_later_stamp() -> None:
    n, pairs = _pairs("sglang-thrash-ranks")
    assert n > len(pairs) > 1000  # (as many bytes: fewer, longer lines)
    stamps = []
    for line, got in pairs:
        assert got.ts_wrapper is not None and got.ts_wrapper[:19].replace("T", " ") == line[1:20]
        assert got.rank is not None and got.text == line[line.index("] ") + 2 :]
        stamps.append(got.ts_wrapper)
    # (the wrapper reads the stream in order: a later stamp for every line)
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
