"""fast_init gives a frozen slots dataclass the same instances its own __init__ gives."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pytest

from preemptdiag.model import records
from preemptdiag.model.fastinit import fast_init

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str = "b"
    c: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Carrier(Generic[T]):
    inner: T
    n: int = 0


class Sub(Plain):
    __slots__ = ("extra",)


# Their own __init__, kept before fast_init replaces it.
_OWN = {cls: cls.__init__ for cls in (Plain, Carrier)}
for _cls in (Plain, Carrier):
    fast_init(_cls)


def test_the_records_made_a_minute_take_it() -> None:
    for cls in (
        records.Hit,
        records.Event,
        records.Window,
        records.Rollup,
        records.RollupStats,
        records.WrapperStamp,
    ):
        assert "_twin" in cls.__init__.__globals__, cls


@pytest.mark.parametrize(
    ("cls", "args"), [(Plain, (1, "x", (2, 3))), (Plain, (1,)), (Carrier, ([1],))]
)
def test_instances_are_the_dataclass_s_own(cls: type, args: tuple[Any, ...]) -> None:
    assert cls.__init__ is not _OWN[cls]
    made = cls(*args)
    reference = object.__new__(cls)
    _OWN[cls](reference, *args)
    assert type(made) is cls
    assert made == reference
    assert [getattr(made, f.name) for f in dataclasses.fields(cls)] == [
        getattr(reference, f.name) for f in dataclasses.fields(cls)
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, 2)  # frozen after its __init__
    assert pickle.loads(pickle.dumps(made)) == made
    if cls is Plain:
        assert hash(made) == hash(reference)


def test_defaults_keywords_and_replace() -> None:
    assert Plain(1, c=(2,)) == Plain(a=1, b="b", c=(2,))
    assert Plain(1).b == "b" and Plain(1).c == ()
    assert dataclasses.replace(Plain(1), b="x") == Plain(1, "x")
    with pytest.raises(TypeError):
        Plain()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Plain(1, "b", (), 4)  # type: ignore[call-arg]


def test_a_subclass_goes_the_dataclass_s_way() -> None:
    s = Sub(1)
    assert type(s) is Sub and s.a == 1 and s.b == "b"


@dataclass(frozen=True, slots=True)
class Factory:
    a: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Posted:
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("negative")


@dataclass(frozen=True, slots=True)
class KeywordOnly:
    a: int = field(kw_only=True)


@dataclass(frozen=True)
class NoSlots:
    a: int


@pytest.mark.parametrize("cls", [Factory, Posted, KeywordOnly, NoSlots])
def test_what_it_cannot_make_the_same_way_it_leaves(cls: type) -> None:
    before = cls.__init__
    assert fast_init(cls) is cls
    assert cls.__init__ is before
