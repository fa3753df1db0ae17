"""``strata serve``: the published snapshot as an HTTP query service (FastAPI), safe while refreshes publish.

Each request resolves its snapshot once — the latest, or ``as_of`` — and answers from that snapshot's view
alone, so a publish during a request never mixes versions; the response names the version it used. Views
are loaded once per version and kept (``tasks.retrieve.load_view``), the question embedder once per
process. At most ``serve.max_concurrency`` queries run at once; one more gets 503 with ``Retry-After``.
With ``serve.api_key_env`` naming a set environment variable, every route but the health checks and the
explorer page (``/``, which holds no data) needs ``Authorization: Bearer <that value>``; the key is never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field

from schemas.config import StrataConfig

PAGE = Path(__file__).resolve().parent / "explorer.html"
OPEN_ROUTES = {"/healthz", "/readyz", "/"}  # "/": the explorer page holds no data; its calls carry the token


class QueryRequest(BaseModel):
    question: str = Field(..., max_length=4000, description="The question (not empty).")
    mode: str | None = Field(None, description="Retrieval mode; default: the index method's first mode.")
    token_budget: int | None = Field(None, description="Context tokens (100 .. serve.max_budget); default: retrieval.token_budget.")
    as_of: int | None = Field(None, description="Answer from this snapshot version instead of the latest.")


class Service:
    """What the app holds: the catalog, the embedder and the LLM client, loaded once."""

    def __init__(self, index: str, cfg: StrataConfig):
        from tasks.catalog import Catalog

        self.cfg, self.catalog = cfg, Catalog(index)
        self.embedder = self.client = None
        self.ready = False
        self._lock = threading.Lock()

    def load(self) -> None:
        from tasks.embed import check_dimension, question_embedder
        from tasks.llm_client import LiteLLMClient
        from tasks.retrieve import load_view

        view = load_view(self.catalog)
        embedder = question_embedder(self.cfg.embedding, self.cfg.llm)
        check_dimension(embedder, view.dim)
        embedder.embed(["warm up"])
        self.embedder = embedder
        self.client = LiteLLMClient(self.cfg.llm, self.catalog.cache_dir) if self.cfg.llm.model else None
        self.ready = True

    def view(self, as_of: int | None):
        from tasks.retrieve import load_view

        with self._lock:  # one load per new version, however many requests ask for it at once
            return load_view(self.catalog, as_of)

    def answer(self, req: QueryRequest) -> dict[str, Any]:
        from tasks.answer import answer as make_answer
        from tasks.retrieve import index_modes, retrieve

        view = self.view(req.as_of)
        mode = req.mode or index_modes(view.method)[0]
        if mode not in index_modes(view.method):
            raise HTTPException(422, f"mode {mode!r} is not offered by this {view.method} index; choose one of "
                                     f"{', '.join(index_modes(view.method))}")
        budget = req.token_budget or self.cfg.retrieval.token_budget
        cfg = self.cfg.retrieval.model_copy(update={"token_budget": budget})
        t0 = time.perf_counter()
        ctx = retrieve(view, req.question, self.embedder.embed([req.question])[0], mode, cfg)
        ms = (time.perf_counter() - t0) * 1000
        return ctx.as_dict() | {"answer": make_answer(ctx, self.client, self.embedder.embed), "retrieval_ms": round(ms, 1)}


def create_app(index: str, cfg: StrataConfig, load: bool = True) -> FastAPI:
    """The service over the index at ``index``; ``load``: load the latest snapshot and the model at startup."""
    from contextlib import asynccontextmanager

    service = Service(index, cfg)
    slots = asyncio.Semaphore(cfg.serve.max_concurrency)
    key = os.environ.get(cfg.serve.api_key_env) if cfg.serve.api_key_env else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if load:
            await run_in_threadpool(service.load)
        yield

    app = FastAPI(title="Strata", description="Queries over a Strata index's published snapshots.", lifespan=lifespan)
    app.state.service = service

    @app.middleware("http")
    async def guard(request: Request, call_next):
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > cfg.serve.max_request_bytes:
            return JSONResponse({"detail": f"request body over {cfg.serve.max_request_bytes} bytes"}, status_code=413)
        if key and request.url.path not in OPEN_ROUTES:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return JSONResponse({"detail": "missing or wrong bearer token"}, status_code=401,
                                    headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    def ready() -> Service:
        if not service.ready:
            raise HTTPException(503, "the snapshot is still loading", headers={"Retry-After": "1"})
        return service

    @app.post("/query", summary="Retrieve a context for a question and answer it (as `strata query --json`)")
    async def query(req: QueryRequest, svc: Service = Depends(ready)) -> dict[str, Any]:
        from tasks.catalog import IndexError_

        if not req.question.strip():
            raise HTTPException(422, "the question is empty")
        if req.token_budget is not None and not 100 <= req.token_budget <= cfg.serve.max_budget:
            raise HTTPException(422, f"token_budget must be between 100 and {cfg.serve.max_budget}")
        if slots.locked():
            raise HTTPException(503, f"{cfg.serve.max_concurrency} queries already running; retry shortly",
                                headers={"Retry-After": "1"})
        async with slots:
            try:
                return await run_in_threadpool(svc.answer, req)
            except IndexError_ as exc:  # an as_of that was never published
                raise HTTPException(404, str(exc)) from exc

    @app.get("/snapshots", summary="Every published snapshot, newest first")
    async def snapshots() -> list[dict[str, Any]]:
        return [{"version": s["version"], "created_at": s["created_at"].isoformat(), "kind": s["kind"]}
                for s in reversed(await run_in_threadpool(service.catalog.snapshots))]

    @app.get("/index", summary="What `strata inspect --json` prints, and the retrieval modes the index offers")
    async def index_info() -> dict[str, Any]:
        from flows.cli import inspect_data
        from tasks.retrieve import index_modes

        data = await run_in_threadpool(inspect_data, index, None, 5)
        return data | {"modes": list(index_modes(data["method"]))}

    @app.get("/healthz", summary="The process is up")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="A snapshot and the model are loaded")
    async def readyz() -> JSONResponse:
        if not service.ready:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"status": "ready"})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def explorer() -> str:
        return PAGE.read_text(encoding="utf-8")

    return app
