"""ingest.sources: opening inputs, with one clear error each."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from preemptdiag.ingest.sources import open_binary, open_source
from preemptdiag.model.errors import DiagError


def test_missing_and_directory_inputs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(DiagError, match=r"nope\.log: no such file$"):
        open_source(str(tmp_path / "nope.log"))
    with pytest.raises(DiagError, match="is a directory"):
        open_source(str(tmp_path))


def test_compression_is_told_by_the_bytes_not_the_name(tmp_path: Path) -> None:
    p = tmp_path / "looks-plain.log"
    p.write_bytes(gzip.compress(b"INFO line one\nINFO line two\n"))
    src = open_source(str(p))
    assert src.codec == "gzip"
    with open_binary(src) as f:
        assert f.read() == b"INFO line one\nINFO line two\n"
