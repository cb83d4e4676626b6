"""Python workers: keep their long-lived heap out of the garbage collector's way.

PySpark's worker daemon runs ``gc.collect()`` after every task. A worker that has imported
pyspark, pyarrow and safepoint tracks some 80,000 objects that live as long as the process, and a
full collection walks them all, every task: on 2 cores the benchmark's py-spy profile put 28% of
the workers' samples there. ``freeze_once`` moves what is alive when a worker process first runs
safepoint code into the permanent generation (``gc.freeze``, as pre-fork servers do), at its
first task, and again at the start of a later task when modules were imported since (a worker
that first ran the source and then a stateful stage imports that stage's modules, pandas among
them, only then: the benchmark's profile still put 17% of the workers' samples in those
collections when freezing stopped after two tasks). At most ``_MAX_FREEZES`` times per process.
What those tasks had alive at that moment and later drop is not collected if it sits in a
reference cycle: a bounded cost per worker process. The workers' daemon
(``streaming/worker_daemon.py``) makes the first freeze before it forks, with what every worker
imports; its workers inherit the count.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_once", "paused"]

_MAX_FREEZES = 8
_done = 0
_modules = 0


def freeze_once() -> None:
    """Collect, then freeze the surviving heap: at a process's first task and whenever modules
    were imported since the last freeze (at most ``_MAX_FREEZES`` times), so what a frozen task
    drops and leaks stays bounded."""
    global _done, _modules  # noqa: PLW0603 - one counter per worker process
    if _done >= _MAX_FREEZES or len(sys.modules) == _modules:
        return
    _done += 1
    gc.collect()
    gc.freeze()
    _modules = len(sys.modules)


@contextmanager
def paused() -> Iterator[None]:
    """No automatic collections inside: a batch's bulk unpacking and processing allocate
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
