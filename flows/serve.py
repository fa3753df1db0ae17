"""``strata serve``: the published snapshot as an HTTP query service (FastAPI), safe while refreshes publish.

Each request resolves its snapshot once — the latest, or ``as_of`` — and answers from that snapshot's view
alone, so a publish during a request never mixes versions; the response names the version it used. Views
are loaded once per version and kept (``tasks.retrieval.view.load_view``), the question embedder once per
process. At most ``serve.max_concurrency`` queries run at once; the next ``serve.queue_size`` wait for a slot up to
``serve.request_timeout_s``; only a full queue or a passed deadline gets 503 with ``Retry-After``. ``/metrics``
(``flows.serve_metrics``) counts all of it for Prometheus.

Closed by default: every route but the health checks, the explorer page, the favicon and the API docs (which hold
no data) needs ``Authorization: Bearer <key>``. The key is the one in the variable ``serve.api_key_env`` names (the
service refuses to start when it is unset), else a random token made once per ``strata serve`` (``TOKEN_ENV``,
shared by its worker processes through their environment, never a file); only ``serve.auth = "none"`` serves
without a key, and only on a loopback interface. Every request body passes one guard (``RequestGuard``): at most
``serve.max_request_bytes``, chunked or not, arriving within ``serve.body_timeout_s``. Error responses never
echo what was sent. One access-log line per request (``serve.log_format``), never the key, and the question
only with ``serve.log_questions``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer

from flows.serve_api import ERRORS, IndexInfo, QueryRequest, QueryResponse, Snapshot, Status
from flows.serve_browse import PREFIXES, add_browse_routes, add_page_routes
from flows.serve_conn import use as connection_limits
from flows.serve_guard import OPEN_ROUTES, Admission, RequestGuard, configure_access_log
from flows.serve_metrics import Metrics
from schemas.config import StrataConfig, load_config
from tasks.errors import NotFoundError, RefusedError, SnapshotGone, UsageError

if TYPE_CHECKING:
    from tasks.query.reader import Reader
    from tasks.retrieval.view import IndexView

#: the paths /metrics labels by name (the browsing routes that name an id: by their prefix, ``serve_browse.PREFIXES``)
ROUTES = {
    "/query",
    "/snapshots",
    "/index",
    "/metrics",
    "/graph/context",
    "/entities",
    "/communities",
    "/documents",
    *OPEN_ROUTES,
}
ECHO_LIMIT = 200  # no error response carries more than this many characters of anything the client sent


#: where ``strata serve`` keeps the token it made (no ``serve.api_key_env``): its worker processes inherit it from
#: the environment, so every worker accepts the one token printed; it is never written to a file or a log
TOKEN_ENV = "STRATA_SERVE_TOKEN"


def api_key(cfg: StrataConfig, fresh: bool = False) -> str | None:
    """The bearer key the service requires: the one in the variable ``serve.api_key_env`` names, else this process's
    token (``TOKEN_ENV``: made by the first call, or by every ``fresh`` one, with ``secrets.token_urlsafe``; a
    worker process finds its parent's); None only with ``serve.auth = "none"``. A named variable that is unset or
    empty is a refusal, never an open service."""
    name = cfg.serve.api_key_env
    if name:
        if cfg.serve.auth == "none":
            raise UsageError(
                f'serve.auth = "none" and serve.api_key_env = "{name}" contradict each other: keep one of them'
            )
        key = os.environ.get(name, "")
        if not key.strip():
            raise RefusedError(
                f"serve.api_key_env names ${name}, which is not set (or empty): refusing to serve the index "
                f'without the key. Export {name}=<key>, or set serve.api_key_env = "" for a token made at start'
            )
        return key
    if cfg.serve.auth == "none":
        return None
    if fresh or not os.environ.get(TOKEN_ENV, "").strip():
        os.environ[TOKEN_ENV] = secrets.token_urlsafe(32)
    return os.environ[TOKEN_ENV]


def is_loopback(host: str) -> bool:
    """``host`` names this machine alone: ``localhost``, 127.0.0.0/8 or ::1."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_open_network(cfg: StrataConfig, host: str) -> None:
    """No key (``serve.auth = "none"``) is allowed on a loopback interface alone: elsewhere the whole index would
    be open to the network."""
    if not cfg.serve.api_key_env and cfg.serve.auth == "none" and not is_loopback(host):
        raise RefusedError(
            f'serve.auth = "none" serves without a key, allowed on a loopback interface only (127.0.0.1, ::1, '
            f'localhost), not on {host}: refusing. Leave serve.auth = "token" (a token made at start) or set '
            "serve.api_key_env"
        )


def _short(text: Any) -> str:
    text = str(text)
    return text if len(text) <= ECHO_LIMIT else text[:ECHO_LIMIT] + "…"


class Service:
    """What the app holds: the index opened for reading (``tasks.query.reader``: catalog, embedder, LLM client),
    loaded once; each request answers from the view of its own snapshot."""

    def __init__(self, index: str, cfg: StrataConfig, metrics: Metrics):
        from tasks.store.catalog import Catalog

        self.index, self.cfg, self.metrics = index, cfg, metrics
        self.catalog = Catalog(index, create=False, storage=cfg.storage)
        self.reader: Reader | None = None
        self.ready = False
        self._lock = threading.Lock()
        self._latest: tuple[float, IndexView] | None = None  # (when, the latest snapshot's view then)
        self._checking = False  # a request is looking up (and loading) the latest snapshot
        self._loaded: set[int] = set()  # versions whose view load was measured

    def load(self) -> None:
        from tasks.query.reader import open_reader

        reader = open_reader(self.index, self.cfg)
        reader.embedder.embed(["warm up"])
        if reader.client is None and self.cfg.serve.warm_sentences:
            self.warm_sentences(reader)
        self.reader, self.ready = reader, True

    def warm_sentences(self, reader: Reader) -> None:
        """The offline answer's sentence pieces (``answer.TokenVectors``), before the service reports ready: those the
        last process left (``views/sentences.pkl``), then the snapshot's sources' up to ``serve.warm_sentences``; saved
        again (one worker at a time: ``answer.warm_saved``)."""
        from tasks.query.answer import warm_saved

        path = self.catalog.cache_dir / "views" / "sentences.pkl"
        embedder = reader.sentences.embedder
        model = f"{getattr(embedder, 'cache_name', embedder.name)} pieces"
        started = time.perf_counter()
        held, had = warm_saved(reader.view, reader.sentences, self.cfg.serve.warm_sentences, path, model)
        logging.getLogger("strata.serve").warning(  # one line at start-up, before the service reports ready
            "offline answers: %d source sentences ready in %.1f s (%d read from %s)",
            held,
            time.perf_counter() - started,
            had,
            path,
        )

    def view(self, as_of: int | None) -> IndexView:
        """The view of ``as_of``, or of the latest snapshot: the one found less than ``serve.snapshot_check_s`` ago,
        else the index is checked again (a folder listing, one LIST request on s3://). One request checks, and
        loads a newly published version; the requests beside it go on with the view they have (a published
        snapshot) instead of waiting for the load, so a publish never stalls the requests in flight."""
        from tasks.retrieval.view import load_view

        with self._lock:  # one load per new version, however many requests ask for it at once
            if as_of is not None:
                return self._timed(load_view, as_of)
            latest = self._latest
            if latest is None:  # nothing to answer from meanwhile: the first request loads, the others wait
                self._latest = (time.monotonic(), self._timed(load_view, None))
                return self._latest[1]
            if self._checking or time.monotonic() - latest[0] < self.cfg.serve.snapshot_check_s:
                return latest[1]
            self._checking = True
        try:
            view = self._timed(load_view, None)
            with self._lock:
                self._latest = (time.monotonic(), view)
            return view
        finally:
            self._checking = False

    def forget_latest(self) -> None:
        """The latest snapshot is looked up again by the next request (the one found was removed by gc)."""
        self._latest = None

    def _timed(self, load, as_of: int | None) -> IndexView:
        started = time.perf_counter()
        view = load(self.catalog, as_of)
        if view.version not in self._loaded:  # a version seen before came from the view cache
            self._loaded.add(view.version)
            self.metrics.view_load.observe(time.perf_counter() - started)
        return view

    def answer(self, req: QueryRequest, state: dict[str, Any]) -> dict[str, Any]:

        reader = self.reader
        assert reader is not None  # requests reach here once loaded (``Depends(ready)``)
        try:
            view = self.view(req.as_of)
            state["snapshot"] = view.version
            if req.as_of is None:
                self.metrics.snapshot.set(view.version)
            ctx, answer, ms = reader.ask(req.question, req.mode, req.token_budget, view=view)
        except UsageError as exc:  # a mode this index does not offer
            raise HTTPException(422, str(exc)) from exc
        except SnapshotGone as exc:  # gc removed it mid-request: the retry reads the newest (or 404 with as_of)
            self.forget_latest()
            self.metrics.rejected.labels("snapshot_gone").inc()
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from exc
        state["mode"] = ctx.mode
        return _placed(ctx.as_dict(), view) | {"answer": answer, "retrieval_ms": round(ms, 1)}


def _placed(context: dict[str, Any], view: IndexView) -> dict[str, Any]:
    """The context with each source's place in its document (``chunk_number`` of ``document_chunks``)."""
    from tasks.query.browse import chunk_place

    for chunk in context.get("chunks") or []:
        j = view.chunk_index.get(chunk.get("id"))
        if j is not None:
            chunk["chunk_number"], chunk["document_chunks"] = chunk_place(view, j)
    return context


def _validation_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's errors without what was sent: no ``input``, no ``ctx``, short locations and messages."""
    return [
        {
            "loc": [_short(part) for part in e.get("loc", ())][:8],
            "msg": _short(e.get("msg", "")),
            "type": _short(e.get("type", "")),
        }
        for e in errors[:20]
    ]


# ---------------------------------------------------------------------------- the app
def create_app(index: str, cfg: StrataConfig, load: bool = True) -> FastAPI:
    """The service over the index at ``index``; ``load``: load the latest snapshot and the model at startup.
    Refuses (``RefusedError``) when ``serve.api_key_env`` names a variable that holds no key; without one (and
    without ``serve.auth = "none"``) it requires this process's token (``api_key``)."""
    from contextlib import asynccontextmanager

    key = api_key(cfg)
    metrics = Metrics(ROUTES, PREFIXES)
    connection_limits(cfg.serve, metrics)  # this process's connections (``flows.serve_conn``)
    service = Service(index, cfg, metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if load:
            await run_in_threadpool(service.load)
        yield

    app = FastAPI(
        title="Strata",
        description="Queries over a Strata index's published snapshots. Use **Authorize** with the service's key: "
        "the one in the variable serve.api_key_env names, else the token `strata serve` printed at start.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        responses=ERRORS,
    )
    app.state.service = service
    app.add_middleware(RequestGuard, cfg=cfg, key=key, metrics=metrics)
    bearer = (
        [
            Depends(
                HTTPBearer(
                    auto_error=False,
                    description="The key in the variable serve.api_key_env names, else the token strata serve "
                    "printed at start (the ?token= of its explorer URL)",
                )
            )
        ]
        if key
        else []
    )
    _error_handlers(app)
    _query_route(app, service, Admission(cfg.serve, metrics), bearer)
    _status_routes(app, service, bearer)
    add_browse_routes(app, service, bearer)
    add_page_routes(app)
    return app


def _error_handlers(app: FastAPI) -> None:
    """Errors as short JSON: a request's validation errors without what it sent, an HTTP error's detail clipped,
    anything else a 500 whose cause goes to the service log only."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_errors(list(exc.errors()))}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": _short(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal(_request: Request, exc: Exception) -> JSONResponse:
        logging.getLogger("strata.serve").error("internal error: %s: %s", type(exc).__name__, _short(exc))
        return JSONResponse({"detail": "internal error; the service log has the cause"}, status_code=500)


def _query_route(app: FastAPI, service: Service, admission: Admission, bearer: list[Any]) -> None:
    """``POST /query``: a question checked, admitted (``Admission``), answered on a worker thread."""
    serve = service.cfg.serve

    def ready() -> Service:
        if not service.ready:
            service.metrics.rejected.labels("loading").inc()
            raise HTTPException(503, "the snapshot is still loading", headers={"Retry-After": "1"})
        return service

    @app.post(
        "/query",
        summary="Retrieve a context for a question and answer it (as `strata query --json`)",
        dependencies=bearer,
        response_model=QueryResponse,
    )
    async def query(req: QueryRequest, request: Request, svc: Service = Depends(ready)) -> dict[str, Any]:
        request.state.question = req.question
        if not req.question.strip():
            raise HTTPException(422, "the question is empty")
        if req.token_budget is not None and not 100 <= req.token_budget <= serve.max_budget:
            raise HTTPException(422, f"token_budget must be between 100 and {serve.max_budget}")
        async with admission.slot():
            try:
                return await run_in_threadpool(svc.answer, req, request.scope["state"])
            except NotFoundError as exc:  # an as_of that was never published
                raise HTTPException(404, str(exc)) from exc


def _status_routes(app: FastAPI, service: Service, bearer: list[Any]) -> None:
    """What the service and its index are: ``/metrics``, ``/snapshots``, ``/index``, ``/healthz``, ``/readyz``."""

    @app.get(
        "/metrics",
        summary="Prometheus metrics (text format): requests, latency, queue, rejections, snapshot, view loads",
        dependencies=bearer,
        response_class=Response,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format"}},
    )
    async def metrics_page() -> Response:
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    @app.get(
        "/snapshots",
        summary="Every published snapshot, newest first",
        dependencies=bearer,
        response_model=list[Snapshot],
    )
    async def snapshots() -> list[dict[str, Any]]:
        from tasks.store.rows import snapshot_note

        return [
            {
                "version": s["version"],
                "created_at": s["created_at"].isoformat(),
                "kind": s["kind"],
                "changes": snapshot_note(s).get("diff"),
            }
            for s in reversed(await run_in_threadpool(service.catalog.snapshots))
        ]

    @app.get(
        "/index",
        summary="What `strata inspect --json` prints, and the retrieval modes the index offers",
        dependencies=bearer,
        response_model=IndexInfo,
    )
    async def index_info() -> dict[str, Any]:
        from tasks.methods.registry import index_modes
        from tasks.query.inspect import inspect_data

        data = await run_in_threadpool(inspect_data, service.catalog, None, 5)
        return data | {"modes": list(index_modes(data["method"]))}

    @app.get("/healthz", summary="The process is up", response_model=Status)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        summary="A snapshot and the model are loaded",
        response_model=Status,
        responses={503: {"model": Status, "description": "Still loading; see Retry-After"}},
    )
    async def readyz() -> JSONResponse:
        if not service.ready:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ready"})


#: where ``strata serve`` puts, for its worker processes (``serve.workers > 1``), the index and settings it resolved
APP_ENV = "STRATA_SERVE_APP"


def app_from_env() -> FastAPI:
    """The app of one worker process of ``strata serve`` (uvicorn's factory): the index and the settings (file and
    overrides) the command resolved, from ``APP_ENV``; each process loads the snapshot and the model itself."""

    spec = json.loads(os.environ[APP_ENV])
    configure_access_log()
    return create_app(spec["index"], load_config(spec["config"], spec["overrides"]))
