"""``strata serve``'s connection limits (``flows.serve_conn``) on a real uvicorn server over real sockets: a head
that never ends is closed at its deadline (a byte at a time too), a connection past the cap is closed as it opens,
a head past its size gets 431, an idle kept-alive connection is closed; each counted in the metrics, and a normal
request beside them is answered."""

from __future__ import annotations

import socket
import threading
import time

import pytest


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture()
def server():
    """A uvicorn server of ``_app`` with the limits given, in a thread; yields (start, metrics)."""
    import uvicorn

    import flows.serve_conn as conn
    from flows.serve_metrics import Metrics
    from schemas.config import ServeConfig

    saved = dict(conn._CURRENT)
    running: list = []

    def start(**limits):
        serve = ServeConfig(**limits)
        metrics = Metrics(set())
        conn.use(serve, metrics)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        cfg = uvicorn.Config(_app, log_level="critical", access_log=False, lifespan="off", **conn.uvicorn_options(serve))
        srv = uvicorn.Server(cfg)
        thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not srv.started:
            time.sleep(0.01)
        running.append((srv, thread))
        return sock.getsockname()[1], metrics

    yield start
    for srv, thread in running:
        srv.should_exit = True
        thread.join(5)
    conn._CURRENT.clear()
    conn._CURRENT.update(saved)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the server closes ``sock`` within ``seconds`` (what it sends before is read and dropped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False


def _get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        s.settimeout(5)
        return s.recv(4096)


def _count(metrics, reason: str) -> float:
    return metrics.connections_closed.labels(reason)._value.get()


def test_a_head_that_never_ends_is_closed_at_its_deadline_even_a_byte_at_a_time(server):
    port, metrics = server(header_timeout_s=0.6, keep_alive_s=30)
    silent = socket.create_connection(("127.0.0.1", port))
    loris = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    assert _get(port).startswith(b"HTTP/1.1 200")  # answered beside them
    cut = None
    for ch in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " * 4:  # one byte every 50 ms: never a whole head
        try:
            loris.sendall(bytes([ch]))
        except OSError:  # the server closed it
            cut = time.monotonic() - t0
            break
        time.sleep(0.05)
    assert cut is not None and 0.5 < cut < 2.0, cut
    assert _closed_within(silent, 2)
    assert _count(metrics, "header_timeout") == 2


def test_a_connection_past_the_cap_is_closed_as_it_opens_and_a_slot_freed_serves_again(server):
    port, metrics = server(max_connections=2, header_timeout_s=30)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", port))
    assert _closed_within(extra, 1)
    assert _count(metrics, "over_limit") == 1
    held.pop().close()
    time.sleep(0.2)
    assert _get(port).startswith(b"HTTP/1.1 200")
    for s in held:
        s.close()


def test_a_head_past_its_size_gets_431_and_an_idle_kept_alive_connection_is_closed(server):
    port, metrics = server(max_head_bytes=2048, keep_alive_s=0.5, header_timeout_s=30)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 431")
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert _closed_within(s, 3) and time.monotonic() - t0 < 2
    assert _count(metrics, "head_too_large") == 1
    assert _count(metrics, "header_timeout") == 0  # idle between requests is keep-alive's, not a slow head
