"""Compressed inputs: gzip, bzip2, xz and zstd, from files and from stdin."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import random
import sys
import tarfile
import tracemalloc
import zipfile
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path

import pytest
from builders import Pipe
from hypothesis import given, settings
from hypothesis import strategies as st

from preemptdiag.cli import main
from preemptdiag.ingest.compression import CODECS, DecompressedStream, detect
from preemptdiag.ingest.sources import open_source
from preemptdiag.scan.matcher import Matcher
from preemptdiag.scan.passes import scan_fast
from preemptdiag.scan.signatures import load

try:
    from compression import zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from backports import zstd  # type: ignore[no-redef,unused-ignore]

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
THRASH = SAMPLES / "v0_thrash_loop.log"

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "bzip2": bz2.compress,
    "xz": lzma.compress,
    "zstd": zstd.compress,
}
SUFFIX = {"gzip": ".gz", "bzip2": ".bz2", "xz": ".xz", "zstd": ".zst"}


def _report(capsys: pytest.CaptureFixture[str], path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["analyze", "--format", "json", "--year", "2024", path])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, json.loads(out)


def _same_analysis(a: dict, a_name: str, b: dict, b_name: str) -> None:  # type: ignore[type-arg]
    """The same report, file names in evidence aside."""
    for key in ("verdict", "lever", "windows"):
        assert json.dumps(a[key]).replace(a_name, b_name) == json.dumps(b[key])
    for key in ("lines_read", "bytes_read", "recognised", "skipped"):
        assert a["scan"][key] == b["scan"][key]


def _noisy_log(n_lines: int) -> bytes:
    """Stats lines with random request ids: compresses like a real log (~5:1), so a
    bzip2 block's compressed size exceeds the 64 KiB the sniffer reads first."""
    rng = random.Random(0)
    lines = THRASH.read_text().splitlines()
    out = []
    for i in range(n_lines):
        out.append(f"{lines[i % len(lines)]} req={rng.getrandbits(128):032x}")
    return ("\n".join(out) + "\n").encode()


def _compressed(tmp_path: Path, stem: str, codec: str, *parts: bytes) -> Path:
    """A file of `parts`, each compressed on its own, one after the other."""
    p = tmp_path / f"{stem}{SUFFIX[codec]}"
    p.write_bytes(b"".join(COMPRESS[codec](part) for part in parts))
    return p


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_compressed_file_reads_like_the_plain_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, codec: str
) -> None:
    data = THRASH.read_bytes()
    p = _compressed(tmp_path, "X", codec, data)
    plain = tmp_path / "X"
    plain.write_bytes(data)
    code, report = _report(capsys, str(p))
    assert code == 1
    assert report["verdict"]["class"] == "thrash_loop"
    _same_analysis(report, str(p), _report(capsys, str(plain))[1], str(plain))


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_concatenated_members_are_all_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, codec: str
) -> None:
    # `cat a.gz b.gz > c.gz` (or .bz2/.xz/.zst) is a valid file: every part counts.
    data = THRASH.read_bytes()
    p = _compressed(tmp_path, "two", codec, data, data)
    _, report = _report(capsys, str(p))
    assert report["scan"]["lines_read"] == 2 * data.count(b"\n")
    assert report["scan"]["bytes_read"] == 2 * len(data)
    assert report["scan"]["skipped"] == {}


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_truncated_keeps_what_was_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, codec: str
) -> None:
    # Several MB so every format has finished blocks before the cut (bzip2 blocks
    # are up to 900 kB, zstd's 128 KiB).
    data = _noisy_log(40_000)
    blob = COMPRESS[codec](data)
    p = tmp_path / f"cut{SUFFIX[codec]}"
    p.write_bytes(blob[: len(blob) * 3 // 4])
    _, report = _report(capsys, str(p))
    skipped = dict(report["scan"]["skipped"])
    # The cut can fall inside a stats line: that one line is named as unparsed.
    assert skipped.pop("unparsed: vllm.v1.stats", 0) <= 1
    assert skipped == {f"truncated {codec}: input ended early": 1}
    assert 0 < report["scan"]["lines_read"] < 40_000
    assert report["verdict"]["class"] == "thrash_loop"


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_nothing_decodable_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, codec: str
) -> None:
    blob = COMPRESS[codec](THRASH.read_bytes())
    p = tmp_path / f"stub{SUFFIX[codec]}"
    p.write_bytes(blob[:12])  # the magic and little else
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"preemptdiag: error: {p}: corrupt or truncated {codec} data at the start"


@pytest.mark.parametrize("codec", [None, *sorted(COMPRESS)])
def test_stdin_compressed_or_not(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, codec: str | None
) -> None:
    # 3 MB: a bzip2 stream yields nothing until its first 900 kB block is whole, far
    # past the first 64 KiB read from the pipe; the sniffer must read on, and the
    # scan must still see every byte.
    data = _noisy_log(20_000)
    blob = data if codec is None else COMPRESS[codec](data)
    if codec == "bzip2":
        assert bz2.BZ2Decompressor().decompress(blob[: 64 << 10]) == b""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(blob))))
    assert main(["analyze", "--format", "json", "-"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["scan"]["bytes_read"] == len(data)
    assert report["scan"]["lines_read"] == 20_000
    assert report["verdict"]["class"] == "thrash_loop"


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_memory_stays_flat_on_a_1000_to_1_member(codec: str) -> None:
    # Tens of MB of one repeated line compress to a few kB: one uncapped decompress
    # call would hold all of it.
    line = THRASH.read_bytes().splitlines(keepends=True)[0]
    size = (16 if codec == "bzip2" else 64) << 20  # bzip2 compresses at ~10 MB/s
    data = line * (size // len(line))
    blob = COMPRESS[codec](data)
    assert len(blob) * 100 < len(data)
    stream = io.BufferedReader(DecompressedStream(CODECS[codec], io.BytesIO(blob)), 1 << 20)
    tracemalloc.start()
    try:
        total = 0
        while chunk := stream.read(1 << 20):
            total += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == len(data)
    # Output is capped at 1 MiB a call; xz's own dictionary (8 MiB at its default
    # preset) is the largest fixed part. Uncapped, one call held all of `data`.
    assert peak < min(16 << 20, len(data) // 2)


def test_detection_is_by_content_not_name() -> None:
    assert {detect(COMPRESS[c](b"x\n")): c for c in COMPRESS} == {c: c for c in COMPRESS}
    assert detect(bz2.compress(b"")) == "bzip2"  # an empty stream has only the end magic
    # A text log may start with "BZh": it is bzip2 only with a block or end magic after.
    assert detect(b"BZh9 is the first word of this log line\n") is None
    assert detect(b"INFO 09-11 17:21:29 metrics.py:351] ...") is None


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip"])
def test_archives_are_refused_with_a_hint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    p = tmp_path / f"bundle.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(p, "w") as z:
            z.write(THRASH, "vllm.log")
    else:
        with tarfile.open(p, "w:gz" if kind.endswith("gz") else "w") as t:
            t.add(THRASH, "vllm.log")
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"preemptdiag: error: {p}: a {kind.split('.')[0]} archive, not a log: "
        "extract it and pass the log files inside"
    )


@pytest.mark.parametrize("codec", [None, *sorted(COMPRESS)])
def test_progress_counts_bytes_on_disk(tmp_path: Path, codec: str | None) -> None:
    # The bar's total is the file's size: a compressed file must not overshoot it
    # (3 MB of log in a ~1 MB .xz would finish the bar a third of the way in).
    data = _noisy_log(20_000)
    if codec is None:
        p = tmp_path / "plain.log"
        p.write_bytes(data)
    else:
        p = _compressed(tmp_path, "packed", codec, data)
    steps: list[int] = []
    result = scan_fast(open_source(str(p)), Matcher(load()), progress=steps.append)
    assert result.bytes_read == len(data)
    assert sum(steps) == p.stat().st_size
    assert len(steps) > 1 and all(n >= 0 for n in steps)


def _decode_all(codec: str, blob: bytes, step: int) -> tuple[bytes, bool]:
    stream = DecompressedStream(CODECS[codec], io.BufferedReader(Pipe(blob, step), step))
    out = io.BufferedReader(stream, 1 << 16).read()
    return out, stream.truncated


@settings(max_examples=60, deadline=None)
@given(
    codec=st.sampled_from(sorted(COMPRESS)),
    parts=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
    step=st.integers(min_value=1, max_value=5000),
    cut=st.floats(min_value=0.0, max_value=1.0),
)
def test_stream_gives_back_every_byte_and_only_a_prefix_when_cut(
    codec: str, parts: list[bytes], step: int, cut: float
) -> None:
    # Members one after the other, read through a pipe of any read size: the bytes
    # compressed, exactly. Cut between two members: the whole members before it (the
    # file looks complete). Cut anywhere else: a prefix of the bytes, and `truncated`.
    members = [COMPRESS[codec](p) for p in parts]
    blob, data = b"".join(members), b"".join(parts)
    assert _decode_all(codec, blob, step) == (data, False)
    n = int(len(blob) * cut)
    got, truncated = _decode_all(codec, blob[:n], step)
    ends = list(accumulate(map(len, members)))
    if n in ends:
        assert (got, truncated) == (b"".join(parts[: ends.index(n) + 1]), False)
    else:
        assert truncated
        assert data.startswith(got)


def test_zstd_without_a_zstd_module_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.14 built without zstd, and no backport installed.
    import sys

    monkeypatch.setitem(sys.modules, "compression", None)
    monkeypatch.setitem(sys.modules, "backports", None)
    p = _compressed(tmp_path, "x.log", "zstd", THRASH.read_bytes())
    assert main(["analyze", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"preemptdiag: error: {p}: zstd-compressed input, but this Python has no zstd module"
    )
    assert "\n" not in err


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_zero_padding_after_the_last_member_is_not_damage(codec: str) -> None:
    # xz allows stream padding; tape and dd pad to a block with zeros.
    data = THRASH.read_bytes()
    for pad in (4, 1000, 300_000):
        blob = COMPRESS[codec](data) + b"\0" * pad
        assert _decode_all(codec, blob, 65536) == (data, False)
    # Zeros and then something else are damage after all.
    blob = COMPRESS[codec](data) + b"\0" * 8 + b"junk"
    assert _decode_all(codec, blob, 65536) == (data, True)


# --- issue 15 item 9: damage keeps what came before it; zstd --long=31 windows -------

_LOG_254 = "".join(
    f"INFO 06-16 12:{i // 60 % 60:02d}:{i % 60:02d} [x.py:1] line {i} {'abcdefgh' * (i % 7)}\n"
    for i in range(254)
).encode()


# gzip and xz decode as they go; bzip2 and zstd decode whole blocks (a damaged block
# yields nothing, in their own tools too), so a one-block file is corrupt at its start.
@pytest.mark.parametrize("codec", ["gzip", "xz"])
def test_a_small_damaged_file_keeps_everything_before_the_damage(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, codec: str
) -> None:
    # One flipped byte two thirds in: the decompress call that meets it raises, and
    # its output (here: the whole file) was once dropped, so a small file was refused
    # as "corrupt at the start". What a streaming decoder gives before the error is
    # read now; the damage is noted, not called an early end.
    blob = bytearray(COMPRESS[codec](_LOG_254))
    blob[len(blob) * 2 // 3] ^= 0xFF
    p = tmp_path / f"damaged.log{SUFFIX[codec]}"
    p.write_bytes(bytes(blob))
    before = _streamed_until_error(codec, bytes(blob))
    code, report = _report(capsys, str(p))
    assert code == 0
    skipped = dict(report["scan"]["skipped"])
    skipped.pop("invalid UTF-8 (replaced)", None)  # garbage a decoder let through
    assert skipped == {f"damaged {codec} data: read up to the damage": 1}
    whole_lines = before.count(b"\n") + (0 if before.endswith(b"\n") else 1)
    assert report["scan"]["lines_read"] == whole_lines
    assert report["scan"]["bytes_read"] == len(before)
    assert whole_lines > 100  # most of the 254 lines


def _streamed_until_error(codec: str, blob: bytes) -> bytes:
    """What a decoder fed one byte at a time yields before it raises: the most any
    streaming reader (gzip -dc, xz -dc) can hand on."""
    d = CODECS[codec].new()
    out = bytearray()
    try:
        for i in range(len(blob)):
            out += d.decompress(blob[i : i + 1])
    except CODECS[codec].errors():
        pass
    return bytes(out)


def test_a_truncated_gzip_reads_what_gzip_dc_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blob = gzip.compress(_LOG_254)
    p = tmp_path / "cut.log.gz"
    p.write_bytes(blob[: len(blob) * 2 // 3])
    ref = _streamed_until_error("gzip", p.read_bytes())
    code, report = _report(capsys, str(p))
    assert code == 0
    assert report["scan"]["bytes_read"] == len(ref) > 0
    assert report["scan"]["skipped"] == {"truncated gzip: input ended early": 1}


def test_a_zstd_frame_with_a_2_gib_window_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # `zstd --long=31` on a big log declares a window past the decoder's default
    # 128 MiB limit. Made small here: the frame header's window descriptor says 2 GiB.
    params = zstd.CompressionParameter
    c = zstd.ZstdCompressor(options={params.window_log: 20, params.content_size_flag: 0})
    blob = bytearray(c.compress(_LOG_254, mode=zstd.ZstdCompressor.FLUSH_FRAME))
    assert blob[4] & 0x20 == 0  # not single-segment: byte 5 is the window descriptor
    blob[5] = (31 - 10) << 3  # exponent 21, mantissa 0: 2^31 bytes
    with pytest.raises(zstd.ZstdError, match="too much memory"):
        zstd.ZstdDecompressor().decompress(bytes(blob))
    p = tmp_path / "long31.log.zst"
    p.write_bytes(bytes(blob))
    code, report = _report(capsys, str(p))
    assert code == 0
    assert report["scan"]["lines_read"] == 254
    assert report["scan"]["skipped"] == {}
