"""Python workers: keep their long-lived heap out of the garbage collector's way.

PySpark's worker daemon runs ``gc.collect()`` after every task. A worker that has imported
pyspark, pyarrow and safepoint tracks some 80,000 objects that live as long as the process, and a
full collection walks them all, every task: on 2 cores the benchmark's py-spy profile put 28% of
the workers' samples there. ``freeze_once`` moves what is alive when a worker process first runs
safepoint code into the permanent generation (``gc.freeze``, as pre-fork servers do), at its
first two tasks, so later collections walk only what the tasks themselves create. What those
tasks had alive at that moment and later drop is not collected if it sits in a reference cycle:
a bounded, one-time cost per worker process.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_once", "paused"]

_FREEZES = 2
_done = 0


def freeze_once() -> None:
    """Collect, then freeze the surviving heap: at the first two tasks of a process only (the
    second catches the modules the first task imported lazily), so what a frozen task drops
    and leaks stays bounded."""
    global _done  # noqa: PLW0603 - one counter per worker process
    if _done >= _FREEZES:
        return
    _done += 1
    gc.collect()
    gc.freeze()


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collections inside: a batch's bulk unpickling and processing allocate
    hundreds of thousands of acyclic objects, and each threshold crossing would walk them all
    (measured: unpickling one 50,000-message batch took 4x longer). Reference counting still frees
    them; the worker's ``gc.collect()`` after the task takes any cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
