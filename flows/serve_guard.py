"""The one guard in front of every route of ``strata serve`` (``RequestGuard``): the bearer key, the body's size
and arrival time, one access-log line and the metrics of every request."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

from flows.serve_metrics import Metrics
from schemas.config import ServeConfig, StrataConfig

#: routes that hold no data: the health checks, the explorer page (its calls carry the key), its favicon and the API
#: docs
OPEN_ROUTES = {"/healthz", "/readyz", "/", "/favicon.ico", "/docs", "/redoc", "/openapi.json"}
STATIC = "/static/"  # Swagger UI and ReDoc from a packaged copy (fastapi-offline), never a CDN
VENDOR = "/vendor/"  # the explorer's graph library (cytoscape.js), vendored with its licence: no data, no CDN

access_log = logging.getLogger("strata.access")


async def _send_json(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
    ]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class RequestGuard:
    """ASGI middleware in front of every route: logs one line per request, checks the bearer key, and reads the
    whole body before the app sees it — at most ``max_bytes`` whether it comes with a Content-Length or chunked
    (413), within ``timeout_s`` (408) — so no route, framework or parser ever meets an oversize or endless body."""

    def __init__(self, app: Any, cfg: StrataConfig, key: str | None, metrics: Metrics):
        self.app, self.cfg, self.key, self.metrics = app, cfg, key, metrics
        self.max_bytes, self.timeout_s = cfg.serve.max_request_bytes, cfg.serve.body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [0]
        state = scope.setdefault("state", {})

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            self._log(scope, state, status[0], seconds * 1000)
            self.metrics.observe(scope["path"], scope.get("method", ""), status[0], state.get("mode"), seconds)

    async def _guarded(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path, headers = scope["path"], dict(scope["headers"])
        # an unauthorized request is answered once its (bounded) body is read: a server that closes a connection
        # holding unread bytes resets it, and the client would see a reset instead of the 401
        unauthorized = (
            self.key is not None
            and path not in OPEN_ROUTES
            and not path.startswith((STATIC, VENDOR))
            and not _authorized(headers, self.key)
        )
        if unauthorized:
            await self._drain(receive)
            await _send_json(send, 401, {"detail": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
            return
        too_large = {"detail": f"request body over {self.max_bytes} bytes"}
        declared = headers.get(b"content-length")
        if declared is not None and not declared.isdigit():
            await _send_json(send, 400, {"detail": "bad Content-Length"})
            return
        if declared is not None and int(declared) > self.max_bytes:
            await _send_json(send, 413, too_large)
            return
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # the client went away: nothing to answer
                    body = message.get("body", b"")
                    size += len(body)
                    if size > self.max_bytes:
                        await _send_json(send, 413, too_large)
                        return
                    chunks.append(body)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _send_json(send, 408, {"detail": f"request body not received within {self.timeout_s:g} s"})
            return
        body, replayed = b"".join(chunks), False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would say it

        await self.app(scope, replay, send)

    async def _drain(self, receive: Any) -> None:
        """Read and drop a request's body, at most ``max_bytes`` within ``timeout_s`` (past either, the connection
        may reset: the client sent more than any route takes)."""
        size = 0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout_s):
                while size <= self.max_bytes:
                    message = await receive()
                    size += len(message.get("body", b""))
                    if message["type"] == "http.disconnect" or not message.get("more_body", False):
                        return

    def _log(self, scope: dict[str, Any], state: dict[str, Any], status: int, ms: float) -> None:
        record: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "method": scope.get("method"),
            "route": scope["path"],
            "status": status,
            "latency_ms": round(ms, 1),
            "snapshot": state.get("snapshot"),
            "mode": state.get("mode"),
        }
        if self.cfg.serve.log_questions and state.get("question") is not None:
            record["question"] = state["question"]
        if self.cfg.serve.log_format == "json":
            access_log.info(json.dumps(record, ensure_ascii=False))
        else:
            extra = " ".join(f"{k}={record[k]}" for k in ("snapshot", "mode") if record[k] is not None)
            question = f" question={json.dumps(record['question'], ensure_ascii=False)}" if "question" in record else ""
            access_log.info(
                f"{record['time']} {record['method']} {record['route']} {status} {record['latency_ms']}ms"
                f"{' ' + extra if extra else ''}{question}"
            )


def _authorized(headers: dict[bytes, bytes], key: str) -> bool:
    """``Authorization: Bearer <key>``, the scheme in any case, the key compared in constant time."""
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def configure_access_log(stream: Any = None) -> None:
    """Access-log lines to ``stream`` (stderr), one per request, as written (no prefix: a JSON line stays JSON)."""
    if any(getattr(h, "_strata", False) for h in access_log.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._strata = True  # type: ignore[attr-defined]
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False


class Admission:
    """The queries admitted at once: ``serve.max_concurrency`` run, the next ``serve.queue_size`` wait for a slot
    at most ``serve.request_timeout_s``; a full queue or a passed deadline is a 503 with Retry-After (counted in
    ``metrics``). Used on the event loop's thread only (its count of waiters needs no lock)."""

    def __init__(self, serve: ServeConfig, metrics: Metrics):
        self.serve, self.metrics = serve, metrics
        self._slots = asyncio.Semaphore(serve.max_concurrency)
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def slot(self):
        """Hold a running slot for the ``async with`` body: at once, or after waiting in the queue."""
        await self._take()
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self.metrics.in_flight.dec()
            self._slots.release()

    async def _take(self) -> None:
        from fastapi import HTTPException

        if not self._slots.locked():
            await self._slots.acquire()
            return
        serve, metrics = self.serve, self.metrics
        busy = f"{serve.max_concurrency} queries running and {self._waiting} waiting"
        if self._waiting >= serve.queue_size:
            metrics.rejected.labels("queue_full").inc()
            raise HTTPException(503, f"{busy} (serve.queue_size): retry shortly", headers={"Retry-After": "1"})
        self._waiting += 1
        metrics.queued.inc()
        try:
            async with asyncio.timeout(serve.request_timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            metrics.rejected.labels("deadline").inc()
            raise HTTPException(
                503,
                f"no free slot within serve.request_timeout_s ({serve.request_timeout_s:g} s): retry shortly",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            self._waiting -= 1
            metrics.queued.dec()
