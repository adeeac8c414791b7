"""Rotated logs: `vllm.log`, `vllm.log.1`, `vllm.log.2.gz` are one engine's log.

logrotate, docker and the kubelet cut a log into files named after the live one
(`.1`, `.2.gz`, `-20251104`, `.20251104-101010.gz`). Read as separate inputs they
would be separate replicas: the timeline split in two, and V0's cumulative
preemption counter starting over in each file (its first warning then only a lower
bound). Files whose names differ only by such a suffix are one replica when their
time spans follow one another; spans that overlap are different engines that happen
to be named alike, and stay apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from itertools import pairwise

import regex

_COMPRESSED = regex.compile(r"\.(?:gz|bz2|xz|zst)$")
# .1 / .12, -20251104 / .20251104, with an optional time: -20251104-1010, .20251104-101010
_ROTATED = regex.compile(r"(?:\.\d{1,3}|[-.]\d{8}(?:[-_T]?\d{4,6})?)$")
# Lines around a rotation may be a little out of order.
OVERLAP_TOLERANCE = timedelta(seconds=60)

Span = tuple[datetime, datetime]


def rotation_base(name: str) -> str:
    """`name` without a compression and a rotation suffix."""
    return _ROTATED.sub("", _COMPRESSED.sub("", name))


def rotated_sets(spans: Mapping[str, Span | None], order: Sequence[str]) -> dict[str, str]:
    """The replica name (the live file's name: the common base) of each input that
    belongs to a rotated set of two or more, in `order`'s terms.

    `spans`: each input's first and last timestamp; None (no timestamps) cannot show
    that the files follow one another, so such an input stays alone.
    """
    groups: dict[str, list[str]] = {}
    for name in order:
        groups.setdefault(rotation_base(name), []).append(name)
    out: dict[str, str] = {}
    for base, names in groups.items():
        timed = sorted((span, n) for n in names if (span := spans.get(n)) is not None)
        if len(timed) < 2:
            continue
        if all(b[0][0] >= a[0][1] - OVERLAP_TOLERANCE for a, b in pairwise(timed)):
            out.update((n, base) for _, n in timed)
    return out
