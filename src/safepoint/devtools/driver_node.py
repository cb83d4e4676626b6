"""A client's conformance driver (``client_driver.DRIVERS``) run as a process and spoken to: the
tests' live nodes and the benchmark's clients phase drive every client through it.

``Lines`` reads a driver's output as it comes; ``DriverNode`` is one driver as a node of a cluster:
``do`` sends an operation and returns its reply, keeping the expiries the driver reports on the way.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from typing import IO, Any

from safepoint.devtools.client_driver import DRIVERS

__all__ = ["DriverError", "DriverNode", "Lines"]


class DriverError(RuntimeError):
    """A driver that did not answer, ended, or did not say ``ok`` where ``ok`` asked it to."""


class Lines:
    """The driver's output lines as they come (a thread reads them: a line already buffered is never
    waited for at the pipe)."""

    def __init__(self, out: IO[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, args=(out,), daemon=True)
        self.thread.start()

    def _read(self, out: IO[str]) -> None:
        for line in out:
            self.queue.put(line)
        self.queue.put(None)

    def next(self, timeout_s: float) -> str:
        try:
            line = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            msg = f"the driver said nothing for {timeout_s:.0f} s"
            raise TimeoutError(msg) from None
        if line is None:
            msg = "the driver ended its output"
            raise RuntimeError(msg)
        return line

    def rest(self) -> list[str]:
        self.thread.join(30)
        lines = []
        while not self.queue.empty():
            line = self.queue.get()
            if line is not None:
                lines.append(line)
        return lines


class DriverNode:
    """One driver as a node of a live cluster: ``do`` sends an operation and returns its reply; the
    expiries it reports on the way are kept in ``expired`` (a lock keeps one operation at a time).
    ``env``: the driver's environment (default this process's)."""

    def __init__(self, language: str, bootstrap: str, cluster: str, node: str, events_topic: str,
                 directives_topic: str, control_topic: str, status_topic: str, heartbeat_ms: int = 500,
                 incarnation: int = 1, env: Mapping[str, str] | None = None) -> None:
        self.language, self.node = language, node
        argv = [*DRIVERS[language], "--bootstrap", bootstrap, "--cluster", cluster, "--node", node,
                "--incarnation", str(incarnation), "--heartbeat-ms", str(heartbeat_ms),
                "--events-topic", events_topic, "--directives-topic", directives_topic,
                "--control-topic", control_topic, "--status-topic", status_topic]
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by finish; a file: a pipe nobody reads fills
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,  # noqa: S603
                                     text=True, env=None if env is None else dict(env))
        assert self.proc.stdout is not None
        self.lines = Lines(self.proc.stdout)
        self.expired: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def do(self, op: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        timeout_s = int(op.get("timeout_ms", 0)) / 1000 + 60  # a wait answers by its own timeout
        with self._lock:
            self.proc.stdin.write(json.dumps(op) + "\n")
            self.proc.stdin.flush()
            while True:
                try:
                    reply = dict(json.loads(self.lines.next(timeout_s)))
                except (TimeoutError, RuntimeError) as exc:
                    msg = f"{self.language} node {self.node}: {op}: {exc}\n{self.stderr()}"
                    raise DriverError(msg) from exc
                if reply.get("op") == "expired":
                    self.expired.append(reply)
                    continue
                return reply

    def ok(self, op: dict[str, Any]) -> None:
        """``do``, whose reply must be ``"ok": true``."""
        reply = self.do(op)
        if reply.get("ok") is not True:
            msg = f"{self.language} node {self.node}: {op} -> {reply}"
            raise DriverError(msg)

    def stderr(self) -> str:
        """The end of what the driver logged so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-3000:]

    def finish(self, timeout_s: float = 60.0) -> int:
        """End its input: it closes what is open, flushes and exits."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
