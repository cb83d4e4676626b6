"""The HTTP surface: the status API, Prometheus metrics and the live dashboard (FastAPI + uvicorn).

``safepoint serve`` runs it over the status topic alone; ``safepoint run --http-port`` runs it in
the job's process, where ``/healthz`` also says whether the query is active and how far its input
lags. Both read the status through a ``StatusStore``. JSON routes are described by the OpenAPI
document at ``/openapi.json`` (interactive at ``/docs``).
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from safepoint import __version__
from safepoint.errors import SafepointError
from safepoint.tools.metrics import StatusCollector
from safepoint.tools.status_store import StatusStore

__all__ = ["make_app", "HttpServer"]

CLUSTER = Annotated[str, Path(min_length=1, max_length=256, description="cluster id")]


class ErrorOut(BaseModel):
    error: str
    cluster: str | None = None


NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "unknown cluster"}}


def _unknown(cluster: str) -> JSONResponse:
    return JSONResponse({"error": f"unknown cluster {cluster!r}", "cluster": cluster}, status_code=404)


class ServiceHoldIn(BaseModel):
    ts: int = Field(ge=-(1 << 63), le=(1 << 63) - 1, description="the MVCC timestamp the safe point must not pass")
    ttl_ms: int = Field(ge=1, le=31_536_000_000, description="how long it lasts without a renewal")
    label: str | None = Field(default=None, max_length=256)


class PauseIn(BaseModel):
    reason: str = Field(min_length=1, max_length=1024)


ADMIN: dict[int | str, dict[str, Any]] = {
    202: {"description": "the control event was published to the events topic"},
    400: {"model": ErrorOut, "description": "the body is not JSON"},
    401: {"model": ErrorOut, "description": "no or a wrong bearer token"},
    403: {"model": ErrorOut, "description": "admin actions are off (no admin_token configured)"},
    503: {"model": ErrorOut, "description": "the broker did not acknowledge the event"},
}
HOLDER = Annotated[str, Path(min_length=1, max_length=256, description="who holds history: backup, cdc-feed-7, ...")]


def make_app(store: StatusStore, health: Callable[[], dict[str, Any]] | None = None,
             publish: Callable[[dict[str, Any]], None] | None = None, admin_token: str = "") -> FastAPI:
    """The app over ``store``; ``health()`` adds the job's own figures to ``/healthz``; ``publish``
    sends a control event to the events topic for the POST actions, which need ``admin_token``
    as a bearer token (none configured: every POST is 403)."""
    app = FastAPI(title="safepoint", version=__version__,
                  description="What pins MVCC history: each cluster's safe point, its round, its blocker and "
                              "every hold, as the safepoint job publishes them.")
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatusCollector(store))
    page = resources.files("safepoint.tools.dashboard").joinpath("index.html").read_text(encoding="utf-8")

    @app.get("/healthz", summary="the process is up; the job's query and input lag where it runs here")
    def healthz() -> dict[str, Any]:
        out: dict[str, Any] = {"status": "ok", "clusters": len(store.clusters()), "status_messages": store.messages,
                               "status_messages_skipped": store.bad}
        if store.error:
            out["status_topic"] = store.error
        if health is not None:
            out["job"] = health()
        elif store.job is not None:
            out["job"] = store.job
        return out

    @app.get("/api/v1/clusters", summary="every cluster's status")
    def clusters() -> dict[str, Any]:
        return {"clusters": store.all()}

    @app.get("/api/v1/clusters/{cluster}", summary="one cluster's status", responses=NOT_FOUND)
    def cluster(cluster: CLUSTER) -> Any:
        st = store.status(cluster)
        return _unknown(cluster) if st is None else st

    @app.get("/api/v1/clusters/{cluster}/holds", summary="the cluster's holds, oldest first", responses=NOT_FOUND)
    def holds(cluster: CLUSTER, limit: Annotated[int, Query(ge=1, le=100_000)] = 100,
              namespace: Annotated[str | None, Query(max_length=1024, description="only the holds that pin this "
                                                     "namespace: its own and those of every namespace")] = None) -> Any:
        st = store.status(cluster)
        if st is None:
            return _unknown(cluster)
        held = st["holds"] if namespace is None else [h for h in st["holds"] if h.get("namespace") in (namespace, None)]
        return {"holds": held[:limit], "counts": st["hold_counts"]}

    @app.get("/api/v1/clusters/{cluster}/nodes", summary="the cluster's nodes", responses=NOT_FOUND)
    def nodes(cluster: CLUSTER) -> Any:
        st = store.status(cluster)
        return _unknown(cluster) if st is None else {"nodes": st["nodes"]}

    @app.get("/api/v1/clusters/{cluster}/history", summary="recent safe points and lags, oldest first",
             responses=NOT_FOUND)
    def history(cluster: CLUSTER) -> Any:
        if store.status(cluster) is None:
            return _unknown(cluster)
        return {"points": store.history(cluster)}

    def admin(authorization: Annotated[str | None, Header()] = None) -> None:
        if not admin_token or publish is None:
            raise HTTPException(403, "admin actions are off: set the admin_token setting to turn them on")
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), admin_token.encode()):
            raise HTTPException(401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"})

    def act(kind: str, cluster: str, **fields: Any) -> JSONResponse:
        event = {"v": 1, "type": kind, "cluster": cluster, "wall_ms": time.time_ns() // 1_000_000,
                 **{k: v for k, v in fields.items() if v is not None}}
        assert publish is not None
        try:
            publish(event)
        except SafepointError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse({"published": event}, status_code=202)

    admin_dep = [Depends(admin)]

    @app.post("/api/v1/clusters/{cluster}/service-holds/{holder}", status_code=202, responses=ADMIN,
              dependencies=admin_dep, summary="set or renew a service hold (publishes service_hold)")
    def set_hold(cluster: CLUSTER, holder: HOLDER, body: ServiceHoldIn) -> JSONResponse:
        return act("service_hold", cluster, holder=holder, ts=body.ts, ttl_ms=body.ttl_ms, label=body.label)

    @app.post("/api/v1/clusters/{cluster}/service-holds/{holder}/release", status_code=202, responses=ADMIN,
              dependencies=admin_dep, summary="release a service hold (publishes service_release)")
    def release_hold(cluster: CLUSTER, holder: HOLDER) -> JSONResponse:
        return act("service_release", cluster, holder=holder)

    @app.post("/api/v1/clusters/{cluster}/pause", status_code=202, responses=ADMIN, dependencies=admin_dep,
              summary="pause the cluster's safe point (publishes pause)")
    def pause(cluster: CLUSTER, body: PauseIn) -> JSONResponse:
        return act("pause", cluster, reason=body.reason)

    @app.post("/api/v1/clusters/{cluster}/resume", status_code=202, responses=ADMIN, dependencies=admin_dep,
              summary="resume a paused cluster (publishes resume)")
    def resume(cluster: CLUSTER) -> JSONResponse:
        return act("resume", cluster)

    @app.exception_handler(StarletteHTTPException)  # FastAPI's HTTPException and Starlette's (404, bad body)
    def http_error(_request: Any, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    return app


class HttpServer:
    """uvicorn serving ``app`` in a daemon thread (for ``run`` and the demo, next to their main loop;
    uvicorn installs no signal handlers outside the main thread, so the caller keeps its own)."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, name="http", daemon=True)
        self.host = host
        self.url = f"http://{host}:{port}/"

    def start(self, timeout_s: float = 10.0) -> HttpServer:
        self.thread.start()
        deadline = threading.Event()
        for _ in range(int(timeout_s / 0.05)):
            if self.server.started or not self.thread.is_alive():
                break
            deadline.wait(0.05)
        if not self.server.started:
            msg = f"the HTTP server did not start on {self.url} (is the port free?)"
            raise SafepointError(msg)
        bound = [sock.getsockname()[1] for srv in getattr(self.server, "servers", []) for sock in srv.sockets]
        if bound:  # port 0: the one the system chose
            self.url = f"http://{self.host}:{bound[0]}/"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
