"""A node process's incarnation: a number that grows at every process start.

The job drops a node's readers and unprepared transactions when its incarnation grows (the old
process died with them) and ignores events of an older incarnation, so the number must grow
across restarts, clock steps and lost state files alike.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from safepoint.errors import SafepointError

__all__ = ["MAX_INCARNATION", "default_incarnation", "wall_clock_ms"]

log = logging.getLogger("safepoint.reporter")

MAX_INCARNATION = 2**53 - 1  # the schema's bound: exact in every JSON reader
_MAX_INCARNATION = MAX_INCARNATION


def wall_clock_ms() -> int:
    """The default wall clock: milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


# -- incarnation -------------------------------------------------------------------------

_issued_lock = threading.Lock()
_issued: dict[tuple[str, str], int] = {}


def default_incarnation(
    node: str,
    cluster: str = "default",
    state_dir: str | os.PathLike[str] | None = None,
    wall_clock: Callable[[], int] = wall_clock_ms,
) -> int:
    """An incarnation number that grows at every process start of ``node``.

    Without ``state_dir`` it is the wall clock in milliseconds at start: it grows across restarts
    as long as the clock does not step back by more than the restart takes. With ``state_dir`` the
    last number is persisted in ``<state_dir>/<cluster>.<node>.incarnation`` and the new one is
    ``max(last + 1, wall clock ms)``: it grows even if the clock steps back (the file remembers) and
    even if the file is lost or corrupt (the clock does). Within one process, two reporters of the
    same node never get the same number.
    """
    candidate = wall_clock()
    if state_dir is not None:
        candidate = _persisted_incarnation(Path(state_dir), cluster, node, candidate)
    with _issued_lock:
        previous = _issued.get((cluster, node))
        if previous is not None and candidate <= previous:
            candidate = previous + 1
        _issued[(cluster, node)] = candidate
    if not 0 <= candidate <= _MAX_INCARNATION:
        msg = f"incarnation {candidate} is outside 0..2**53-1; check the wall clock or the state file in {state_dir}"
        raise SafepointError(msg)
    return candidate


def _persisted_incarnation(state_dir: Path, cluster: str, node: str, now_ms: int) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{quote(cluster, safe='')}.{quote(node, safe='')}"
    path = state_dir / f"{stem}.incarnation"
    lock_path = state_dir / f"{stem}.incarnation.lock"
    with open(lock_path, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            last = int(path.read_text(encoding="ascii").strip())
        except FileNotFoundError:
            last = -1
        except (ValueError, OSError) as exc:
            log.warning("incarnation file %s is unreadable (%s); falling back to the wall clock", path, exc)
            last = -1
        value = max(last + 1, now_ms)
        tmp = path.with_suffix(".incarnation.tmp")
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{value}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # make the rename durable where the platform allows it
            dir_fd = os.open(state_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    return value
