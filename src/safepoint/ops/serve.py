"""``safepoint serve`` and the HTTP surface of ``safepoint run --http-port``.

Both serve ``ops/http_api.py`` over a ``StatusStore`` following the status topic; in the job's
process ``/healthz`` also has the query's own figures (``ops/job_status.py``), which the job
publishes to the status topic for ``serve``.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from safepoint.connectors.kafka.producer import ProducerSlot, producer_conf
from safepoint.connectors.kafka.topics import check_reachable, quiet
from safepoint.errors import ConfigError, SafepointError
from safepoint.ops.control_cli import publisher
from safepoint.ops.http_api import HttpServer, make_app
from safepoint.ops.job_status import JobStatus
from safepoint.ops.status_store import StatusStore
from safepoint.settings import Secret, Settings

__all__ = ["JobSurface", "serve", "serve_args"]


def admin_of(settings: Settings) -> dict[str, Any]:
    """The POST actions' publisher and token (``make_app``'s keywords). The control publisher is
    made at the first action (the broker is checked then, not at start) and kept."""
    made: list[Any] = []
    lock = threading.Lock()

    def publish(event: dict[str, Any]) -> str:
        with lock:
            if not made:
                made.append(publisher(settings))
        return str(made[0].publish(event))

    return {"publish": publish, "admin_token": admin_tokens(settings)}


def admin_tokens(settings: Settings) -> dict[str, str]:
    """Operator name -> bearer token: ``admin_tokens`` (``name:token,...``), and ``admin_token`` as
    ``admin``. A malformed entry is a ``ConfigError`` that never shows a token."""
    def reveal(value: str) -> str:
        return value.get() if isinstance(value, Secret) else str(value)

    tokens: dict[str, str] = {}
    if reveal(settings.admin_token):
        tokens["admin"] = reveal(settings.admin_token)
    for i, entry in enumerate(t for t in reveal(settings.admin_tokens).split(",") if t.strip()):
        name, sep, token = entry.strip().partition(":")
        if not sep or not name.strip() or not token.strip() or not re.fullmatch(r"[A-Za-z0-9_.@-]{1,64}", name.strip()):
            msg = (f"admin_tokens entry {i + 1} is not name:token (a name of letters, digits, _ . @ -, then a "
                   "non-empty token)")
            raise ConfigError(msg)
        if name.strip() in tokens:
            msg = f"admin_tokens names {name.strip()!r} twice (or beside admin_token, whose name is admin)"
            raise ConfigError(msg)
        tokens[name.strip()] = token.strip()
    return tokens


def http_server(app: Any, settings: Settings, port: int) -> HttpServer:
    return HttpServer(app, settings.http_host, port, certfile=settings.http_tls_certfile,
                      keyfile=settings.http_tls_keyfile).start()


class JobSurface:
    """What ``safepoint run`` shows of itself: its progress record (published to the status topic)
    and, with ``http_port``, the HTTP surface in its process."""

    def __init__(self, settings: Settings, active: Callable[[], bool], name: str = "safepoint run",
                 port: int | None = None) -> None:
        """``active()`` says whether the query runs; ``port`` overrides ``http_port`` (0: any free
        port). Built before the Spark session, so that nothing else takes the port meanwhile."""
        conf = quiet(producer_conf(settings.librdkafka(), linger_ms=50))
        self.producer = ProducerSlot("confluent", conf) if settings.status_topic else None
        self.store: StatusStore | None = None
        self.server: HttpServer | None = None
        port = settings.http_port if port is None else port
        if settings.http_port or port is not None and port >= 0:
            self.store = StatusStore()
            if settings.status_topic:
                self.store.follow(settings.librdkafka(), settings.status_topic)
        self.job = JobStatus(self.producer, settings.status_topic, self.store)
        if self.store is not None:
            app = make_app(self.store, health=lambda: self.job.health(active()), mvcc_unit=settings.mvcc_unit,
                           **admin_of(settings))
            self.server = http_server(app, settings, port)
            print(f"{name}: status API, metrics and dashboard at {self.server.url}", flush=True)

    def batch(self, progress: dict[str, Any], counts: dict[str, int], rows: int) -> None:
        self.job.batch(progress, counts, rows)

    def close(self) -> None:
        self.job.stopped()
        if self.producer is not None:
            with contextlib.suppress(Exception):  # best effort, like every publish of the job's figures
                self.producer.producer.flush(5)
        if self.server is not None:
            self.server.stop()
        if self.store is not None:
            self.store.close()


def serve_args(args: Any, settings: Settings) -> int:
    return serve(settings)


def serve(settings: Settings) -> int:
    """``safepoint serve``: the HTTP surface over the status topic, until SIGINT or SIGTERM."""
    if not settings.http_port:
        msg = "safepoint serve needs --http-port P (or SAFEPOINT_HTTP_PORT)"
        raise SafepointError(msg)
    if not settings.status_topic:
        msg = "safepoint serve needs a status topic (--status-topic; the job's status_topic setting)"
        raise SafepointError(msg)
    check_reachable(settings.librdkafka())
    store = StatusStore()
    store.follow(settings.librdkafka(), settings.status_topic)
    server = http_server(make_app(store, mvcc_unit=settings.mvcc_unit, **admin_of(settings)), settings, settings.http_port)
    print(f"safepoint serve: {server.url} (status from {settings.status_topic} at {settings.bootstrap}); Ctrl-C stops",
          flush=True)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    try:
        while not stopping.wait(0.5):
            if not server.thread.is_alive():
                print("safepoint serve: the HTTP server stopped", file=sys.stderr)
                return 1
    finally:
        server.stop()
        store.close()
    print("safepoint serve: stopped", flush=True)
    return 0
