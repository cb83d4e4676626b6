"""The HTTP surface: the status API, Prometheus metrics and the live dashboard (FastAPI + uvicorn).

``safepoint serve`` runs it over the status topic alone; ``safepoint run --http-port`` runs it in
the job's process, where ``/healthz`` also says whether the query is active and how far its input
lags. Both read the status through a ``StatusStore``. JSON routes are described by the OpenAPI
document at ``/openapi.json`` (interactive at ``/docs``).

The admin POST routes sit behind ``AdminGate``, an ASGI layer that checks the bearer token before
a byte of the body is read and refuses a body over ``MAX_ADMIN_BODY`` (413). Each action gets an
``action_id``; ``GET /api/v1/clusters/{c}/actions/{id}`` shows its outcome once the job reports
it. Every error is a JSON object ``{"error": ...}`` (422 keeps FastAPI's ``detail``), never a
bare 500.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from safepoint import __version__
from safepoint.connectors.actions import ControlPublisher
from safepoint.core.signing import owner_digest
from safepoint.core.status import by_cost
from safepoint.errors import SafepointError
from safepoint.ops.metrics import StatusCollector
from safepoint.ops.status_store import StatusStore

__all__ = ["MAX_ADMIN_BODY", "AdminGate", "HttpServer", "make_app"]

log = logging.getLogger("safepoint.http")
admin_log = logging.getLogger("safepoint.admin")
"""Every admin action, with who sent it (shown at INFO: the log of record of the HTTP surface's actions)."""
admin_log.setLevel(logging.INFO)
ADMIN_SCOPE = "safepoint.admin"
"""The ASGI scope key where ``AdminGate`` puts the name of the token an action came with."""
MAX_ADMIN_BODY = 16_384
"""Largest body an admin POST may send, in bytes (a service hold's is under 400)."""
ADMIN_PATH = re.compile(r"/api/v1/clusters/[^/]+/(service-holds/[^/]+(/release)?|pause|resume)")
"""The admin POST routes (``AdminGate`` guards them; another POST is the app's own 404 or 405)."""
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

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
    owner_token: str | None = Field(default=None, min_length=1, max_length=256,
                                    description="makes the hold its owner's: renewed, moved and released only with it")
    force: bool = Field(default=False, description="an operator's override of another owner's hold (recorded)")


class ReleaseIn(BaseModel):
    owner_token: str | None = Field(default=None, min_length=1, max_length=256,
                                    description="the hold's owner token (needed for a hold with an owner)")
    force: bool = Field(default=False, description="release a hold of another owner (recorded as forced)")


class PauseIn(BaseModel):
    reason: str = Field(min_length=1, max_length=1024)


class ActionOut(BaseModel):
    action_id: str
    outcome: str = Field(description="the job's outcome once it applied the action (see the actions route)")
    published: dict[str, Any]


class OutcomeOut(BaseModel):
    id: str
    outcome: str = Field(description="pending (not in the cluster's status yet), applied, refused, ignored or expired")
    type: str | None = None
    holder: str | None = None
    reason: str | None = None
    detail: str | None = None
    cluster_wall_ms: int | None = None


ADMIN: dict[int | str, dict[str, Any]] = {
    202: {"model": ActionOut, "description": "the control event was published to the control topic"},
    400: {"model": ErrorOut, "description": "the body is not JSON"},
    401: {"model": ErrorOut, "description": "no or a wrong bearer token"},
    403: {"model": ErrorOut, "description": "admin actions are off (no admin_token configured)"},
    413: {"model": ErrorOut, "description": f"the body is over {MAX_ADMIN_BODY} bytes"},
    503: {"model": ErrorOut, "description": "the broker did not acknowledge the event"},
}


async def _json_error(send: Send, status: int, error: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class AdminGate:
    """ASGI layer in front of the app: a POST is answered 403 (no token configured), 401 (no or a
    wrong bearer token) or 413 (a body over ``max_body`` bytes) before the app reads its body;
    an accepted body is read here, bounded, and handed on."""

    def __init__(self, app: Any, tokens: Mapping[str, str], max_body: int = MAX_ADMIN_BODY) -> None:
        self.app, self.max_body = app, max_body
        self.tokens = {name: token.encode() for name, token in tokens.items() if token}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not ADMIN_PATH.fullmatch(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if not self.tokens:
            await _json_error(send, 403, "admin actions are off: set the admin_token (or admin_tokens) setting to "
                                         "turn them on")
            return
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        # every token compared, none skipped: the time taken does not tell which name came close
        matches = [name for name, token in self.tokens.items() if hmac.compare_digest(given.strip(), token)]
        if scheme.lower() != b"bearer" or not matches:
            await _json_error(send, 401, "a valid bearer token is required", [(b"www-authenticate", b"Bearer")])
            return
        scope = {**scope, ADMIN_SCOPE: matches[0]}  # who sent the action: the routes record it
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _json_error(send, 413, f"the body must be at most {self.max_body} bytes")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await _json_error(send, 413, f"the body must be at most {self.max_body} bytes")
                return
            if not message.get("more_body"):
                break
        handed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
HOLDER = Annotated[str, Path(min_length=1, max_length=256, description="who holds history: backup, cdc-feed-7, ...")]


def make_app(store: StatusStore, health: Callable[[], dict[str, Any]] | None = None,  # noqa: C901 - flat list of small routes
             publish: Callable[[dict[str, Any]], str] | None = None, admin_token: str | Mapping[str, str] = "",
             mvcc_unit: str = "none") -> Any:
    """The app over ``store``, behind ``AdminGate``; ``health()`` adds the job's own figures to
    ``/healthz``; ``publish`` sends a control event to the control topic for the POST actions
    (returns its action id), which need ``admin_token`` as a bearer token (none configured, or
    no ``publish``: every POST is 403). ``mvcc_unit``: the dashboard shows MVCC times as UTC times
    and spans as durations when it is a time unit (``ns``, ``us``, ``ms``, ``s``)."""
    app = FastAPI(title="safepoint", version=__version__,
                  description="What pins MVCC history: each cluster's safe point, its round, its blocker and "
                              "every hold, as the safepoint job publishes them.")
    registry = CollectorRegistry(auto_describe=True)
    registry.register(StatusCollector(store))
    page = resources.files("safepoint.ops.dashboard").joinpath("index.html").read_text(encoding="utf-8")
    page = page.replace('"__MVCC_UNIT__"', json.dumps(mvcc_unit))

    @app.get("/healthz", summary="the process is up; the job's query and input lag where it runs here",
             responses={503: {"description": "the status follower is stalled (status: stalled, with why)"}})
    def healthz() -> JSONResponse:
        stalled = store.stalled()
        out: dict[str, Any] = {"status": "stalled" if stalled else "ok", "clusters": len(store.clusters()),
                               "status_messages": store.messages, "status_messages_skipped": store.bad,
                               "skipped": dict(store.skipped)}
        if stalled:
            out["stalled"] = stalled
        if store.error:
            out["status_topic"] = store.error
        if health is not None:
            out["job"] = health()
        elif store.job is not None:
            out["job"] = store.job
        return JSONResponse(out, status_code=503 if stalled else 200)

    @app.get("/api/v1/clusters", summary="every cluster's status")
    def clusters() -> dict[str, Any]:
        return {"clusters": store.all()}

    @app.get("/api/v1/clusters/{cluster}", summary="one cluster's status", responses=NOT_FOUND)
    def cluster(cluster: CLUSTER) -> Any:
        st = store.status(cluster)
        return _unknown(cluster) if st is None else st

    @app.get("/api/v1/clusters/{cluster}/holds", summary="the cluster's holds, oldest or costliest first",
             responses=NOT_FOUND)
    def holds(cluster: CLUSTER, limit: Annotated[int, Query(ge=1, le=100_000)] = 100,
              namespace: Annotated[str | None, Query(max_length=1024, description="only the holds that pin this "
                                                     "namespace: its own and those of every namespace")] = None,
              order: Annotated[Literal["age", "cost"], Query(description="age: oldest first; cost: the bytes of "
                                                             "history each alone keeps, most first (unknown last)")]
              = "age") -> Any:
        st = store.status(cluster)
        if st is None:
            return _unknown(cluster)
        held = st["holds"] if namespace is None else [h for h in st["holds"] if h.get("namespace") in (namespace, None)]
        if order == "cost":
            held = by_cost(held)
        return {"holds": held[:limit], "counts": st["hold_counts"]}

    @app.get("/api/v1/clusters/{cluster}/nodes", summary="the cluster's nodes (each one's minimum, incarnation, "
             "seq and lease: what a directive's basis lists for its lowest few), by name, a page at a time",
             responses=NOT_FOUND)
    def nodes(cluster: CLUSTER, limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
              offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> Any:
        st = store.status(cluster)
        if st is None:
            return _unknown(cluster)
        listed = st["nodes"][offset:] if limit is None else st["nodes"][offset:offset + limit]
        return {"nodes": listed, "total": len(st["nodes"]), "offset": offset}

    @app.get("/api/v1/clusters/{cluster}/history", summary="recent safe points and lags, oldest first",
             responses=NOT_FOUND)
    def history(cluster: CLUSTER) -> Any:
        if store.status(cluster) is None:
            return _unknown(cluster)
        return {"points": store.history(cluster)}

    @app.get("/api/v1/clusters/{cluster}/actions/{action_id}", summary="what the job did with an admin action",
             response_model=OutcomeOut)
    def action(cluster: CLUSTER, action_id: Annotated[str, Path(min_length=1, max_length=128)]) -> Any:
        st = store.status(cluster)
        found = next((a for a in (st or {}).get("actions", []) if a.get("id") == action_id), None)
        return found if found is not None else {"id": action_id, "outcome": "pending"}

    def authorization_doc(authorization: Annotated[str | None, Header(description="Bearer <admin_token>")] = None) -> None:
        """Documents the header; ``AdminGate`` checked it before the body was read."""

    def act(kind: str, cluster: str, request: Request, **fields: Any) -> JSONResponse:
        by = request.scope.get(ADMIN_SCOPE)
        event = ControlPublisher.event(kind, cluster, by=by, **fields)
        admin_log.info("admin action by %s: %s of cluster %s%s (action %s)", by or "-", kind, cluster,
                       f", holder {fields['holder']}" if fields.get("holder") else "", event["action_id"])
        if publish is None:  # AdminGate lets no POST through without a publisher; kept for a direct call
            return JSONResponse({"error": "admin actions are off"}, status_code=403)
        try:
            aid = publish(event)
        except SafepointError as exc:
            return JSONResponse({"error": str(exc)}, status_code=503)
        return JSONResponse({"action_id": aid, "outcome": f"/api/v1/clusters/{cluster}/actions/{aid}",
                             "published": event}, status_code=202)

    admin_dep = [Depends(authorization_doc)]

    @app.post("/api/v1/clusters/{cluster}/service-holds/{holder}", status_code=202, responses=ADMIN,
              dependencies=admin_dep, summary="set or renew a service hold (publishes service_hold)")
    def set_hold(cluster: CLUSTER, holder: HOLDER, body: ServiceHoldIn, request: Request) -> JSONResponse:
        return act("service_hold", cluster, request, holder=holder, ts=body.ts, ttl_ms=body.ttl_ms, label=body.label,
                   owner=owner_digest(body.owner_token) if body.owner_token else None, force=body.force or None)

    @app.post("/api/v1/clusters/{cluster}/service-holds/{holder}/release", status_code=202, responses=ADMIN,
              dependencies=admin_dep, summary="release a service hold (publishes service_release)")
    def release_hold(cluster: CLUSTER, holder: HOLDER, request: Request, body: ReleaseIn | None = None) -> JSONResponse:
        body = body or ReleaseIn()
        return act("service_release", cluster, request, holder=holder, owner_token=body.owner_token, force=body.force or None)

    @app.post("/api/v1/clusters/{cluster}/pause", status_code=202, responses=ADMIN, dependencies=admin_dep,
              summary="pause the cluster's safe point (publishes pause)")
    def pause(cluster: CLUSTER, body: PauseIn, request: Request) -> JSONResponse:
        return act("pause", cluster, request, reason=body.reason)

    @app.post("/api/v1/clusters/{cluster}/resume", status_code=202, responses=ADMIN, dependencies=admin_dep,
              summary="resume a paused cluster (publishes resume)")
    def resume(cluster: CLUSTER, request: Request) -> JSONResponse:
        return act("resume", cluster, request)

    @app.exception_handler(StarletteHTTPException)  # FastAPI's HTTPException and Starlette's (404, bad body)
    def http_error(_request: Any, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)  # FastAPI's 422, without echoing the input (an inf is no JSON)
    def invalid(_request: Any, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": str(e.get("type"))}
                                        for e in exc.errors()]}, status_code=422)

    @app.exception_handler(Exception)  # anything else: logged, answered as JSON
    def internal_error(_request: Any, exc: Exception) -> JSONResponse:
        log.error("HTTP request failed", exc_info=exc)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}"}, status_code=500)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse(page)

    tokens = {"admin": admin_token} if isinstance(admin_token, str) else dict(admin_token)
    return AdminGate(app, tokens if publish is not None else {})


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpServer:
    """uvicorn serving ``app`` in a daemon thread (for ``run`` and the demo, next to their main loop;
    uvicorn installs no signal handlers outside the main thread, so the caller keeps its own)."""

    def __init__(self, app: Any, host: str, port: int, *, certfile: str = "", keyfile: str = "") -> None:
        import uvicorn

        tls = bool(certfile)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                                    ssl_certfile=certfile or None, ssl_keyfile=keyfile or None))
        self.thread = threading.Thread(target=self.server.run, name="http", daemon=True)
        self.host = host
        self.scheme = "https" if tls else "http"
        self.url = f"{self.scheme}://{host}:{port}/"
        if isinstance(app, AdminGate) and app.tokens and not tls and not _loopback(host):
            log.warning("the admin routes are served with a token on %s without TLS: the bearer token crosses the "
                        "network in clear text (set http_tls_certfile and http_tls_keyfile, or bind 127.0.0.1 "
                        "behind a TLS proxy)", host)

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
            self.url = f"{self.scheme}://{self.host}:{bound[0]}/"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
