"""evolve is dataclasses.replace, faster: the same results and the same refusals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from builders import make_event, make_window

from preemptdiag.model.evolve import evolve
from preemptdiag.model.records import Class, Confidence, Kind


def test_a_window_and_an_event_as_replace_makes_them() -> None:
    w = make_window(3, kv_max=99.0)
    got = evolve(w, cls=Class.THRASH_LOOP, confidence=Confidence.HIGH, why="loop")
    assert got == dataclasses.replace(
        w, cls=Class.THRASH_LOOP, confidence=Confidence.HIGH, why="loop"
    )
    assert w.cls is Class.HEALTHY  # the original is untouched
    e = make_event(Kind.STATS, {"kv_usage": 1.0})
    assert evolve(e, text="x") == dataclasses.replace(e, text="x")
    assert evolve(e) == e


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(TypeError):
        evolve(make_window(0), colour="red")


@dataclass(frozen=True)
class Derived:
    a: int
    b: int = field(init=False, default=0)


@dataclass(frozen=True)
class Checked:
    a: int
    b: int

    def __post_init__(self) -> None:
        if self.b < 0:
            raise ValueError("b < 0")


def test_init_false_and_post_init_behave_as_with_replace() -> None:
    assert evolve(Derived(1), a=2) == Derived(2)
    with pytest.raises(ValueError):
        evolve(Derived(1), b=2)
    with pytest.raises(ValueError, match="b < 0"):
        evolve(Checked(1, 2), b=-1)


def test_the_gc_pause_restores_what_it_found() -> None:
    import gc

    from preemptdiag.model.gcpause import cyclic_gc_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), cyclic_gc_paused():
        assert not gc.isenabled()
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()


class _Kept:
    pass


def test_what_the_gc_pause_kept_is_old_and_someone_elses_freeze_stays() -> None:
    import gc

    from preemptdiag.model.gcpause import cyclic_gc_paused

    with cyclic_gc_paused():
        kept = _Kept()
    # in the oldest generation: the next collections do not walk it again
    assert any(o is kept for o in gc.get_objects(generation=2))
    mine = _Kept()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with cyclic_gc_paused():
            young = _Kept()
        assert gc.get_freeze_count() == frozen  # not unfrozen by the pause
        assert not any(o is mine for o in gc.get_objects(generation=2))
        assert any(o is young for o in gc.get_objects(generation=0))
    finally:
        gc.unfreeze()
