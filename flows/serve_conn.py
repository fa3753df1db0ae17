"""``strata serve``'s connection limits, below the app: uvicorn's HTTP/1.1 protocol (h11) with a cap on open
connections and a deadline for each request head. uvicorn alone keeps a connection whose head never ends until the
client goes, and takes any number of them; a slow client sending a head a byte at a time would hold a socket each.

- ``serve.max_connections``: a connection past the cap is closed as it opens (refused fast, never queued);
- ``serve.header_timeout_s``: a connection whose request head has not fully arrived this long after it opened, or
  after the first bytes of a later head on it, is closed (the body has its own deadline, ``serve.body_timeout_s``);
- ``serve.max_head_bytes``: a larger request head gets 431 and the connection is closed (h11's own limit holds only
  for a head still incomplete);
- ``serve.keep_alive_s``: uvicorn's keep-alive timeout.

Each closed connection is counted in ``/metrics`` (``strata_connections_closed_total{reason}``). The limits come
from the app each worker process builds (``use``): uvicorn starts the protocol by class, in every worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from schemas.config import ServeConfig

#: this process's limits and metrics, set by the app it serves (``flows.serve.create_app``)
_CURRENT: dict[str, Any] = {}


def use(serve: ServeConfig, metrics: Any) -> None:
    """The limits and the metrics of the app this process serves."""
    _CURRENT.update(serve=serve, metrics=metrics)


def uvicorn_options(serve: ServeConfig) -> dict[str, Any]:
    """uvicorn.Config's settings for these limits."""
    return {
        "http": BoundedH11,
        "timeout_keep_alive": serve.keep_alive_s,
        "h11_max_incomplete_event_size": serve.max_head_bytes,
    }


_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 24\r\n\r\nRequest head too large.\n"
)


def _closed(reason: str) -> None:
    metrics = _CURRENT.get("metrics")
    if metrics is not None:
        metrics.connections_closed.labels(reason).inc()


class BoundedH11(H11Protocol):
    """uvicorn's h11 protocol with the cap on connections and the head's deadline of ``serve``."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0  # of the head arriving now

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        serve = _CURRENT.get("serve")
        if serve is None:
            return
        if len(self.connections) > serve.max_connections:
            _closed("over_limit")
            transport.close()
            return
        self._arm_head()

    def data_received(self, data: bytes) -> None:
        serve = _CURRENT.get("serve")
        if serve is not None and self.conn.their_state is h11.IDLE:  # h11 bounds only a head that is incomplete
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end + 4
            if self._head_bytes > serve.max_head_bytes:
                _closed("head_too_large")
                self.transport.write(_TOO_LARGE)  # raw: h11 sends no response before a request it has parsed
                self.transport.close()
                return
            if end >= 0:
                self._head_bytes = 0
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head has arrived (or the connection failed)
            self._disarm_head()
        elif self._head_timer is None and _CURRENT.get("serve") is not None and not self.transport.is_closing():
            self._arm_head()  # the first bytes of the next head on a kept-alive connection (idle: keep_alive_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        self._disarm_head()
        serve = _CURRENT["serve"]
        self._head_timer = self.loop.call_later(serve.header_timeout_s, self._head_timed_out)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            _closed("header_timeout")
            self.transport.close()
