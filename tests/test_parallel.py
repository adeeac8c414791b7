"""When --jobs splits a file: large ones, and smaller ones dense in signal lines."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from test_equivalence import _bench_generator

import preemptdiag.parallel as parallel
from preemptdiag.scan import Matcher
from preemptdiag.signatures import load
from preemptdiag.sources import open_source

FINDER = Matcher(load()).finder()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("parallel")
    gen = _bench_generator()
    out = {"dense": d / "dense.log", "sparse": d / "sparse.log"}
    with out["dense"].open("wb") as f:
        gen.generate_dense(f, 300_000, seed=1)
    with out["sparse"].open("wb") as f:
        gen.generate(f, 300_000, seed=1)
    out["dense_gz"] = d / "dense.log.gz"
    out["dense_gz"].write_bytes(gzip.compress(out["dense"].read_bytes(), mtime=0))
    return out


def test_dense_files_split_from_a_few_mib(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 200_000)
    dense, sparse = open_source(str(logs["dense"])), open_source(str(logs["sparse"]))
    assert parallel.can_split(dense, 2, FINDER)
    assert not parallel.can_split(dense, 1, FINDER)  # one job: nothing to split over
    assert not parallel.can_split(dense, 2)  # no prefilter to judge the head with
    # Request logging on: a signal line now and then, not worth forking for.
    assert not parallel.can_split(sparse, 2, FINDER)
    # A gzip stream cannot be cut at byte offsets.
    assert not parallel.can_split(open_source(str(logs["dense_gz"])), 2, FINDER)
    monkeypatch.setattr(parallel, "DENSE_MIN_BYTES", 400_000)
    assert not parallel.can_split(dense, 2, FINDER)  # dense but small


def test_large_files_split_whatever_their_density(
    logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 200_000)
    assert parallel.can_split(open_source(str(logs["sparse"])), 2, FINDER)
    assert parallel.can_split(open_source(str(logs["sparse"])), 2)
