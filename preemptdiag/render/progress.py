"""A progress bar on stderr for long inputs, when stderr is a terminal."""

from __future__ import annotations

import sys
import threading
from typing import Any


def progress_factory(enabled: bool) -> Any:
    if not enabled or sys.stderr is None or not sys.stderr.isatty():
        return None
    from rich.progress import BarColumn, Progress, TransferSpeedColumn

    def factory(total: int) -> Any:
        if total < (32 << 20):
            return None
        prog = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            TransferSpeedColumn(),
            transient=True,
            console=__import__("rich.console").console.Console(stderr=True),
        )
        prog.start()
        task = prog.add_task("scanning", total=total)
        done = [0]
        lock = threading.Lock()  # --jobs threads report into one bar

        def advance(n: int) -> None:
            with lock:
                done[0] += n
                prog.update(task, completed=done[0])
                if done[0] >= total:
                    prog.stop()

        return advance

    return factory
