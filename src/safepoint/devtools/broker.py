"""The embedded Kafka-protocol broker for local runs and tests: noida-db 0.2.3, pinned.

Not for production: it keeps data in memory with a JSON snapshot and is not crash-safe.
Point ``--bootstrap`` at real Kafka for anything that matters.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from safepoint.errors import BrokerError

__all__ = ["EmbeddedBroker", "Served", "find_binary", "free_port", "serve", "wait_for_kafka"]

BROKER_PACKAGE = "noida-db==0.2.3"


def find_binary() -> str:
    """Path of the pinned noida-db binary installed with the project."""
    try:
        import noida_db
    except ImportError as exc:
        msg = f"the embedded broker is not installed: pip install '{BROKER_PACKAGE}' (it is a project dependency)"
        raise BrokerError(msg) from exc
    candidate = Path(noida_db.__file__).parent / "noida-db"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("noida-db")
    if found:
        return found
    msg = f"noida-db binary not found next to {noida_db.__file__}; reinstall '{BROKER_PACKAGE}'"
    raise BrokerError(msg)


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for sockets bound to port 0 (Linux's default where it cannot be read)."""
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range when there is room.

    A Kafka client keeps reconnecting to a broker that has stopped, and a port of the ephemeral
    range goes to the next socket bound to port 0 anywhere on the machine. In one process running
    many brokers one after the other (the tests, sharing one Spark session) a stopped broker's
    port went to the state server of a Spark task: a Python worker's cached client of that broker
    connected to it first, the state server died on the Kafka bytes, and the task waited forever.
    Below the range, only another ``free_port`` can take the port. Chosen at random, so brokers
    started one after the other do not reuse each other's ports."""
    low, _high = ephemeral_range()
    rng = random.Random()  # noqa: S311 - a port, not a secret
    if low - _LOWEST >= 1000:
        for _ in range(200):
            port = rng.randrange(_LOWEST, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        return found


def wait_for_kafka(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Block until a Kafka client can fetch metadata from ``bootstrap``."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": 0, "logger": _QuietLogger()}
    admin = AdminClient(conf)
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(timeout=2)
            if md.brokers:
                return
        except Exception as exc:  # noqa: BLE001 - any failure means not ready yet
            last = exc
        time.sleep(0.2)
    msg = f"Kafka at {bootstrap} did not answer within {timeout_s:.0f} s ({last})"
    raise BrokerError(msg)


class _QuietLogger:
    def log(self, *args: object) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return lambda *a, **k: None


class EmbeddedBroker:
    """Start and stop the pinned broker as a child process."""

    def __init__(self, port: int | None = None, data_dir: str | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="safepoint-broker-")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(self.data_dir) / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> EmbeddedBroker:
        Path(self.data_dir).mkdir(parents=True, exist_ok=True)
        cmd = [
            find_binary(),
            "start",
            "--only",
            "kafka",
            "--kafka-port",
            str(self.port),
            "--host",
            self.host,
            "--data-dir",
            self.data_dir,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        # a session of its own: a Ctrl-C to the command that runs it (the demo) lets that command stop it last
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    tail = self.log_path.read_text(errors="replace")[-2000:]
                    msg = f"broker exited with code {self.proc.returncode} before it was ready:\n{tail}"
                    raise BrokerError(msg)
                with socket.socket() as s:
                    s.settimeout(0.5)
                    if s.connect_ex((self.host, self.port)) == 0:
                        break
                time.sleep(0.1)
            wait_for_kafka(self.bootstrap, max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    def about(self) -> str:
        return f"the embedded broker ({BROKER_PACKAGE}), its log {self.log_path}"

    def newly_ended(self) -> tuple[list[str], bool]:
        """(what to say of the broker's process if it ended, whether nothing of it is left)."""
        if self.proc is None or self.proc.poll() is not None:
            return [f"the broker process exited; see {self.log_path}"], True
        return [], False

    def kill(self) -> None:
        """Stop without a clean shutdown (the broker may lose its last second of data)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.cleanup()


class Served(Protocol):
    """What ``serve`` runs: the embedded broker or Apache Kafka (``devtools/apache_kafka.py``)."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def pids(self) -> list[int]: ...

    def start(self) -> object: ...

    def stop(self) -> None: ...

    def about(self) -> str: ...

    def newly_ended(self) -> tuple[list[str], bool]: ...


def serve(broker: Served, data_dir: Path, own_dir: bool) -> int:
    """``safepoint broker``: run ``broker`` until SIGINT/SIGTERM and print one ``ready`` line (its
    bootstrap addresses, data folder and process ids), then what it is; a process of it that ends is
    said once, and the command ends (1) when none is left."""
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        broker.start()
        print(f"safepoint broker ready bootstrap={broker.bootstrap} data_dir={data_dir} "
              f"pids={','.join(str(p) for p in broker.pids)}", flush=True)
        print(f"safepoint broker: {broker.about()}", flush=True)
        while not stop:
            said, none_left = broker.newly_ended()
            for line in said:
                print(f"safepoint broker: {line}", file=sys.stderr, flush=True)
            if none_left:
                return 1
            time.sleep(0.2)
        print("safepoint broker stopping", flush=True)
        return 0
    finally:
        broker.stop()
        if own_dir and not os.environ.get("SAFEPOINT_KEEP_BROKER_DATA"):
            shutil.rmtree(data_dir, ignore_errors=True)


def run_foreground(port: int, data_dir: str | None) -> int:
    """``safepoint broker``: the embedded broker until SIGINT/SIGTERM (``serve``)."""
    broker = EmbeddedBroker(port=port, data_dir=data_dir)
    return serve(broker, Path(broker.data_dir), own_dir=data_dir is None)
