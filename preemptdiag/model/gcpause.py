"""The cyclic garbage collector paused around the pipeline's bulk stages."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the block runs.

    Scanning, judging and rendering a month of stats lines make millions of small
    objects that stay alive, and each full collection walks all of them again: ~20 %
    of the time after the scan, and ~1 s of the scan itself, measured. The scan makes
    no reference cycles (tests/test_scan.py holds it to that on every shipped and
    fuzzed input) and little after it does; garbage still goes by reference counting,
    and any cycle waits for the next collection after the block.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()
