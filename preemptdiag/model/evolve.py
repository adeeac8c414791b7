"""A faster dataclasses.replace for the pipeline's hot loops.

dataclasses.replace walks the fields in Python on every call: on a Window (33
fields) that was ~20 us, and classifying a month of one-minute windows copies each
once. This reads the fields with one attrgetter and calls the class as replace does,
so the result (and its __init__/__post_init__ checks) is the same.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")


@cache
def _plan(cls: type) -> tuple[dict[str, int], Callable[[Any], Any]] | None:
    """(init parameter -> position, a getter of their values); None when evolve
    should leave it to dataclasses.replace (init=False fields, keyword-only ones)."""
    fields = dataclasses.fields(cls)
    if len(fields) < 2 or any(not f.init or f.kw_only for f in fields):
        return None
    names = tuple(f.name for f in fields)
    return {n: i for i, n in enumerate(names)}, operator.attrgetter(*names)


def evolve(obj: T, **changes: Any) -> T:
    """dataclasses.replace(obj, **changes), for a dataclass instance."""
    cls: type = type(obj)
    plan = _plan(cls)
    if plan is None or not changes.keys() <= plan[0].keys():
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    where, get = plan
    values = list(get(obj))
    for name, value in changes.items():
        values[where[name]] = value
    # positionally: the parameters of a dataclass's __init__ are its fields in order
    new: T = cls(*values)
    return new


def positional(cls: type) -> Callable[[Any], tuple[Any, ...]] | None:
    """A getter of an instance's field values in __init__ order, when `cls(*values)`
    rebuilds it (as evolve does); None when it does not."""
    plan = _plan(cls)
    return None if plan is None else plan[1]
