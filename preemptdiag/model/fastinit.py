"""A faster __init__ for the frozen slots dataclasses the pipeline makes by the million.

A frozen dataclass's generated __init__ sets each field with object.__setattr__ (the
class's own __setattr__ refuses): ~0.1 us a field, so a Hit (15 fields) cost ~1.5 us
and a month of one-minute windows ~0.9 s of constructors (py-spy). This __init__
turns the new instance, for the time of its assignments, into an unfrozen twin class
with the same slots (so the same memory layout, which is what lets CPython change an
object's class), sets the fields with plain stores, and turns it back: ~0.4 us. The
instance is the same object of the same class with the same values; frozenness after
__init__, equality, hashing, pickling and dataclasses.replace are untouched (they go
through the class, not through __init__'s body).

Applied only where the result is provably what the dataclass's __init__ gives: every
field an init parameter, positional, with no default_factory, and no __post_init__;
an instance of a subclass goes the dataclass's own way.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, TypeVar

T = TypeVar("T")


def _twin(cls: type, names: tuple[str, ...]) -> type | None:
    """An unfrozen class with the slots of `cls` that an instance of `cls` can be
    turned into and back (the same bases: Generic's own layout counts); None if none."""
    bases = getattr(cls, "__orig_bases__", cls.__bases__)  # Generic[T], not Generic
    twin = types.new_class(
        f"_{cls.__name__}Twin", bases, exec_body=lambda ns: ns.update(__slots__=names)
    )
    probe: object = object.__new__(cls)
    try:
        object.__setattr__(probe, "__class__", twin)
        object.__setattr__(probe, "__class__", cls)
    except TypeError:
        return None
    return twin


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen slots dataclass `cls` the faster __init__ (see above); returns
    `cls` unchanged where that __init__ would not be the dataclass's."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = tuple(f.name for f in fields)
    if (
        tuple(cls.__dict__.get("__slots__", ())) != names
        or hasattr(cls, "__post_init__")
        or any(
            not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING for f in fields
        )
    ):
        return cls
    twin = _twin(cls, names)
    if twin is None:
        return cls
    scope: dict[str, Any] = {
        "_set": object.__setattr__,
        "_cls": cls,
        "_twin": twin,
        "_slow": cls.__init__,
    }
    params = []
    for f in fields:
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            scope[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
    body = "".join(f"    self.{n} = {n}\n" for n in names)
    source = (
        f"def __init__(self, {', '.join(params)}):\n"
        "    if type(self) is not _cls:\n"
        f"        return _slow(self, {', '.join(names)})\n"
        "    _set(self, '__class__', _twin)\n"
        f"{body}"
        "    _set(self, '__class__', _cls)\n"
    )
    exec(source, scope)  # generated from the dataclass's own fields, as dataclasses does
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
