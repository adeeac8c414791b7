"""Every shipped signature passes its own examples, and no two co-match undeclared."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from preemptdiag.model.errors import DiagError
from preemptdiag.model.records import Kind
from preemptdiag.scan.signatures import (
    Signature,
    check_examples,
    load_dir,
    load_file,
    overlaps,
    validate,
)

SIG_DIR = Path(__file__).resolve().parent.parent / "signatures"
ALL: list[Signature] = load_dir(SIG_DIR)


def test_ids_are_unique() -> None:
    ids = [s.id for s in ALL]
    assert sorted({i for i in ids if ids.count(i) > 1}) == []


@pytest.mark.parametrize("sig", ALL, ids=lambda s: s.id)
def test_examples(sig: Signature) -> None:
    assert check_examples(sig) == []


@pytest.mark.parametrize("sig", ALL, ids=lambda s: s.id)
def test_has_enough_examples(sig: Signature) -> None:
    assert len(sig.matches) >= 2
    assert len(sig.no_matches) >= 1


def test_builtin_load_defers_compiling_but_reads_the_same() -> None:
    # Built-ins skip the compile at load (start-up time); the user path above
    # compiled and checked the very same files.
    lazy = load_dir(SIG_DIR, builtin=True)
    assert [replace(s, builtin=False) for s in lazy] == ALL


def test_no_undeclared_overlaps() -> None:
    assert overlaps(ALL) == []


STATS = [s for s in ALL if s.kind is Kind.STATS and len(s.matches) >= 2]


@pytest.mark.parametrize("sig", STATS, ids=lambda s: s.id)
def test_glued_stats_records_stay_apart(sig: Signature) -> None:
    # Records glued without a newline (a lost flush) must still yield one match each.
    a, b = sig.matches[0].line, sig.matches[1].line
    alone = len(list(sig.finditer(a))) + len(list(sig.finditer(b)))
    assert len(list(sig.finditer(a + b))) == alone


GOOD = """
[[signature]]
id = "{id}"
family = "test"
engine = "any"
kind = "{kind}"
prefilter = ["boom"]
pattern = '''{pattern}'''
[signature.fields]
{fields}
[[signature.match]]
line = '''{line}'''
"""


def _write(tmp_path: Path, **kw: str) -> Path:
    values = {
        "id": "user.test.boom",
        "kind": "context",
        "pattern": r"boom (?P<n>\d+)",
        "fields": 'n = "int"',
        "line": "boom 3",
    }
    values.update(kw)
    path = tmp_path / "user.toml"
    path.write_text(GOOD.format(**values), encoding="utf-8")
    return path


def test_good_user_file_loads(tmp_path: Path) -> None:
    [sig] = load_file(_write(tmp_path))
    assert sig.id == "user.test.boom"
    assert check_examples(sig) == []
    assert sig.extract(next(iter(sig.finditer("x boom 42")))) == {"n": 42}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"id": ""}, "a [[signature]] has no 'id'"),
        ({"kind": "meltdown"}, "signature 'user.test.boom': unknown kind 'meltdown' (known: "),
        (
            {"pattern": r"boom (?P<n>\d+) (?P<m>\w+)", "line": "boom 3 x"},
            "named groups and [fields] differ (untyped: ['m'], no group: [])",
        ),
        ({"fields": 'n = "decimal"'}, "field 'n' has unknown type 'decimal'"),
    ],
)
def test_loader_rejects_bad_files(tmp_path: Path, kw: dict[str, str], message: str) -> None:
    path = _write(tmp_path, **kw)
    with pytest.raises(DiagError) as err:
        load_file(path)
    text = str(err.value)
    assert text.startswith(f"invalid signature file {path}")
    assert message in text


def test_missing_id_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "noid.toml"
    path.write_text(
        '[[signature]]\nfamily = "f"\nengine = "any"\nkind = "context"\n'
        'prefilter = ["x"]\npattern = "x"\n',
        encoding="utf-8",
    )
    with pytest.raises(DiagError, match=r"noid\.toml: a \[\[signature\]\] has no 'id'$"):
        load_file(path)


def test_nested_group_quantifier_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, pattern=r"(a+)+(?P<n>\d)", line="boom aa1")
    with pytest.raises(DiagError, match=r"'user\.test\.boom': pattern has a nested unbounded"):
        load_file(path)


def test_example_that_does_not_match_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, line="boom without a number")
    [sig] = load_file(path)
    assert check_examples(sig) == ["match example does not match: 'boom without a number'"]
    with pytest.raises(DiagError) as err:
        validate([sig])
    assert str(err.value) == (
        f"invalid signature file {path}: signature 'user.test.boom': "
        "match example does not match: 'boom without a number'"
    )


def test_example_without_prefilter_literal_is_reported(tmp_path: Path) -> None:
    [sig] = load_file(_write(tmp_path, pattern=r"(?P<n>\d+) bang", line="7 bang"))
    assert check_examples(sig) == ["match example contains no prefilter literal: '7 bang'"]


def test_wrong_expected_field_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path)
    path.write_text(path.read_text(encoding="utf-8") + "fields = { n = 4 }\n", encoding="utf-8")
    [sig] = load_file(path)
    assert check_examples(sig) == ["field 'n': expected 4, got 3 in 'boom 3'"]


def test_no_match_example_that_matches_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path)
    path.write_text(
        path.read_text(encoding="utf-8") + "[[signature.no_match]]\nline = 'boom 9'\n",
        encoding="utf-8",
    )
    [sig] = load_file(path)
    assert check_examples(sig) == ["no_match example matches: 'boom 9'"]


def test_undeclared_overlap_is_reported_and_declared_one_is_not(tmp_path: Path) -> None:
    [a] = load_file(_write(tmp_path))
    (tmp_path / "b").mkdir()
    [b] = load_file(_write(tmp_path / "b", id="user.test.boom2", pattern=r"boom (?P<n>3)"))
    assert overlaps([a, b]) == [
        ("user.test.boom", "user.test.boom2", "boom 3"),
        ("user.test.boom2", "user.test.boom", "boom 3"),
    ]
    (tmp_path / "c").mkdir()
    declared = _write(tmp_path / "c", id="user.test.boom2", pattern=r"boom (?P<n>3)")
    declared.write_text(
        declared.read_text(encoding="utf-8").replace(
            'prefilter = ["boom"]', 'prefilter = ["boom"]\noverlaps = ["user.test.boom"]'
        ),
        encoding="utf-8",
    )
    [c] = load_file(declared)
    assert overlaps([a, c]) == []


def _plain_file(tmp_path: Path, plain: str, line: str = "boom 34!") -> Path:
    path = _write(tmp_path, pattern=r"boom (?P<n>\d+)(?=!)", line=line)
    text = path.read_text(encoding="utf-8")
    path.write_text(
        text.replace("[signature.fields]", f"plain = '''{plain}'''\n[signature.fields]"),
        encoding="utf-8",
    )
    return path


def test_a_plain_shape_that_stands_for_the_pattern_passes(tmp_path: Path) -> None:
    plain = r"(?P<plain_pre_>)(?P<plain_match_>boom (?P<n>\d+))!"
    [sig] = load_file(_plain_file(tmp_path, plain))
    assert sig.plain == plain
    assert check_examples(sig) == []


@pytest.mark.parametrize(
    "plain",
    [r"(?P<plain_pre_>)boom (?P<n>\d+)!", r"(?P<plain_pre_>)(?P<plain_match_>boom (?P<m>\d+))!"],
)
def test_a_plain_shape_without_its_groups_or_with_other_ones_is_refused(
    tmp_path: Path, plain: str
) -> None:
    with pytest.raises(DiagError) as err:
        load_file(_plain_file(tmp_path, plain))
    assert str(err.value).endswith(
        "signature 'user.test.boom': 'plain' needs groups 'plain_pre_' and 'plain_match_',"
        " and only fields besides"
    )


@pytest.mark.parametrize(
    ("plain", "problem"),
    [
        (
            r"(?P<plain_pre_>)(?P<plain_match_>boom (?P<n>\d)\d*)!",
            "plain shape reads other fields than the pattern: 'boom 34!'",
        ),
        (
            r"(?P<plain_pre_>)(?P<plain_match_>boom) (?P<n>\d+)!",
            "plain shape fits an example the pattern does not match once on its span: 'boom 34!'",
        ),
        (r"(?P<plain_pre_>)(?P<plain_match_>boom (?P<n>\d+))\?", "plain shape fits none of the"),
    ],
)
def test_a_plain_shape_that_reads_the_examples_otherwise_is_reported(
    tmp_path: Path, plain: str, problem: str
) -> None:
    [sig] = load_file(_plain_file(tmp_path, plain))
    assert [p[: len(problem)] for p in check_examples(sig)] == [problem]


def test_a_plain_shape_that_fits_a_no_match_example_is_reported(tmp_path: Path) -> None:
    path = _plain_file(tmp_path, r"(?P<plain_pre_>)(?P<plain_match_>boom (?P<n>\d+))!?")
    path.write_text(
        path.read_text(encoding="utf-8") + "[[signature.no_match]]\nline = 'boom 9'\n",
        encoding="utf-8",
    )
    [sig] = load_file(path)
    assert check_examples(sig) == ["plain shape fits a no_match example: 'boom 9'"]
