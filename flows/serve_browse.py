"""``strata serve``'s browsing routes (the explorer's graph, communities and documents), each over one snapshot's
view (``as_of``, or the latest) through ``tasks.query.browse``; a missing entity, community or document is 404;
and the pages that hold no data: the explorer, the API docs, their packaged assets."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from fastapi import FastAPI, HTTPException, Query
from fastapi.concurrency import run_in_threadpool

from flows.serve_api import (
    CommunityCard,
    CommunitySummary,
    ContextGraphRequest,
    DocumentCard,
    DocumentList,
    EntityCard,
    Graph,
    GraphNode,
)
from flows.serve_guard import STATIC, VENDOR
from tasks.errors import NotFoundError, SnapshotGone


class Views(Protocol):
    """What the routes need of ``flows.serve.Service`` (named here without importing it: serve imports this)."""

    catalog: Any

    def view(self, as_of: int | None) -> Any: ...

    def forget_latest(self) -> None: ...


#: the browsing routes' path prefixes: /metrics labels a request by its prefix, never by the id it names
PREFIXES = ("/graph/entity/", "/entities/", "/communities/", "/documents/")
AsOf = Query(None, description="This snapshot version instead of the latest.")


def add_browse_routes(app: FastAPI, service: Views, bearer: list[Any]) -> None:
    from tasks.query import browse

    async def on_view(as_of: int | None, fn, *args: Any) -> Any:
        def call() -> Any:
            return fn(service.view(as_of), *args)

        try:
            return await run_in_threadpool(call)
        except NotFoundError as exc:
            raise HTTPException(404, str(exc)) from exc
        except SnapshotGone as exc:  # gc removed it meanwhile: the next request reads the newest
            service.forget_latest()
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from exc

    @app.get(
        "/graph/entity/{entity_id}",
        summary="An entity and its neighbours, as a graph",
        dependencies=bearer,
        response_model=Graph,
    )
    async def graph_entity(
        entity_id: str, limit: int = Query(browse.NEIGHBOURS, ge=1, le=200), as_of: int | None = AsOf
    ) -> dict[str, Any]:
        return await on_view(as_of, browse.neighbourhood, entity_id, limit)

    @app.post(
        "/graph/context",
        summary="A query's context (its entities and sources) as a graph",
        dependencies=bearer,
        response_model=Graph,
    )
    async def graph_context(req: ContextGraphRequest) -> dict[str, Any]:
        return await on_view(req.as_of, browse.context_graph, req.entity_ids, req.chunk_ids)

    @app.get("/entities", summary="Entities whose name holds `q`", dependencies=bearer, response_model=list[GraphNode])
    async def entities(
        q: str = Query(..., min_length=1, max_length=200),
        limit: int = Query(20, ge=1, le=200),
        as_of: int | None = AsOf,
    ) -> list[dict[str, Any]]:
        return await on_view(as_of, browse.search_entities, q, limit)

    @app.get(
        "/entities/{entity_id}",
        summary="An entity: description, sources, communities",
        dependencies=bearer,
        response_model=EntityCard,
    )
    async def entity(entity_id: str, as_of: int | None = AsOf) -> dict[str, Any]:
        return await on_view(as_of, browse.entity_card, entity_id)

    @app.get(
        "/communities",
        summary="Communities of a level (all when none is given), the highest rated first",
        dependencies=bearer,
        response_model=list[CommunitySummary],
    )
    async def communities(level: int | None = Query(None, ge=0), as_of: int | None = AsOf) -> list[dict[str, Any]]:
        return await on_view(as_of, browse.communities, level)

    @app.get(
        "/communities/{community_id}",
        summary="A community's report and its members",
        dependencies=bearer,
        response_model=CommunityCard,
    )
    async def community(community_id: str, as_of: int | None = AsOf) -> dict[str, Any]:
        return await on_view(as_of, browse.community_card, community_id)

    @app.get(
        "/documents",
        summary="The indexed documents and the quarantine (what was not indexed, and why)",
        dependencies=bearer,
        response_model=DocumentList,
    )
    async def documents(as_of: int | None = AsOf) -> dict[str, Any]:
        def listing(view: Any) -> dict[str, Any]:
            quarantine = service.catalog.read("quarantine", snap=view.snap).to_pylist() if view.snap else []
            return browse.documents(view, quarantine)

        return await on_view(as_of, listing)

    @app.get(
        "/documents/{document_id}",
        summary="A document's chunks, in order",
        dependencies=bearer,
        response_model=DocumentCard,
    )
    async def document(document_id: str, as_of: int | None = AsOf) -> dict[str, Any]:
        return await on_view(as_of, browse.document_card, document_id)


PAGE = Path(__file__).resolve().parent / "explorer.html"


def add_page_routes(app: FastAPI) -> None:
    """The explorer page, the API docs (Swagger UI, ReDoc) and their assets, served from packaged copies (no CDN)."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
    from fastapi.responses import HTMLResponse, Response
    from fastapi.staticfiles import StaticFiles

    app.mount(STATIC.rstrip("/"), StaticFiles(directory=_docs_assets()), name="static")
    app.mount(VENDOR.rstrip("/"), StaticFiles(directory=PAGE.parent / "vendor"), name="vendor")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def explorer() -> str:
        return PAGE.read_text(encoding="utf-8")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:  # no icon, and no 401 in a browser's console
        return Response(status_code=204)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="Strata API",
            swagger_js_url=f"{STATIC}swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC}swagger-ui.css",
            swagger_favicon_url=f"{STATIC}favicon.png",
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": True},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title="Strata API",
            redoc_js_url=f"{STATIC}redoc.standalone.js",
            redoc_favicon_url=f"{STATIC}favicon.png",
            with_google_fonts=False,
        )


def _docs_assets() -> str:
    """The folder of the packaged Swagger UI and ReDoc files (fastapi-offline ships them; no CDN is ever asked)."""
    import fastapi_offline

    return str(Path(fastapi_offline.__file__).resolve().parent / "static")
