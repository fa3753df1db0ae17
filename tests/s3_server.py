"""A real S3 endpoint for tests and benchmarks: moto's standalone server on 127.0.0.1, optionally behind a small
proxy that counts the bytes it returns and fails a share of the requests as an overloaded store does (503 SlowDown,
or the connection dropped without an answer).

Nothing here leaves 127.0.0.1. ``python -m tests.s3_server`` starts one and prints its environment."""

from __future__ import annotations

import http.client
import itertools
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

#: credentials of the fake store (moto accepts any): never real ones
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "strata-test-key", "AWS_SECRET_ACCESS_KEY": "strata-test-secret",
                    "AWS_REGION": "us-east-1"}

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Fault:
    """Fail requests by what they are: those of ``method`` whose path matches ``path`` (a regex searched in it),
    the ``times`` of them after the first ``after``, with ``kind`` (as ``Faults.kinds``); the path is read
    percent-decoded (GCS's XML API encodes a key's every "/" and "_"). Lance's paths:
    ``/_versions/`` a manifest, ``/data/`` a data file, ``/_transactions/`` a transaction file; a GET of the bucket
    itself (``^/[^/]+$``, query aside) is a listing."""

    method: str
    path: str
    kind: str
    times: int = 1
    after: int = 0
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        self.pattern = re.compile(self.path)

    def takes(self, method: str, path: str) -> bool:
        if method != self.method or not self.pattern.search(unquote(path.split("?", 1)[0])):
            return False
        self.seen += 1
        if self.after < self.seen <= self.after + self.times:
            self.fired += 1
            return True
        return False


@dataclass
class Faults:
    """Every ``every``-th request (counting from ``skip`` requests on) fails, taking ``kinds`` in turn: "503" (a
    503 SlowDown answer, nothing done), "drop" (the connection reset before the request reaches the store) or "lost"
    (the store does it, then the connection is reset before the answer). ``every`` 0: none fail. Requests whose
    method is not in ``methods`` are never failed."""

    every: int = 0
    skip: int = 0
    kinds: tuple[str, ...] = ("503", "drop")
    methods: tuple[str, ...] = ("GET", "PUT", "POST", "HEAD", "DELETE")
    seen: int = 0
    rules: list[Fault] = field(default_factory=list)  # tried first, in order: failures by what a request is
    injected: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pick(self, method: str, path: str = "") -> str | None:
        with self.lock:
            for rule in self.rules:
                if rule.takes(method, path):
                    self.injected[rule.kind] = self.injected.get(rule.kind, 0) + 1
                    return rule.kind
            if not self.every or method not in self.methods:
                return None
            self.seen += 1
            if self.seen <= self.skip or (self.seen - self.skip) % self.every:
                return None
            kind = self.kinds[sum(self.injected.values()) % len(self.kinds)]
            self.injected[kind] = self.injected.get(kind, 0) + 1
            return kind

    def off(self) -> None:
        with self.lock:
            self.every = 0
            self.rules = []


@dataclass
class Traffic:
    requests: int = 0
    bytes_out: int = 0  # response bodies sent to the client (what it read from the store)
    bytes_in: int = 0  # request bodies received (what it wrote)
    by_method: dict[str, int] = field(default_factory=dict)
    log: list[tuple[str, str, int, int, dict[str, str]]] = field(default_factory=list)  # method, path, status,
    # bytes sent back, request headers
    keep_log: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.requests = self.bytes_out = self.bytes_in = 0
            self.by_method.clear()
            self.log.clear()


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, upstream: int):
        super().__init__(("127.0.0.1", port), _Handler)
        self.upstream = upstream
        self.delay_s = 0.0  # added to every request: a store farther away than 127.0.0.1
        self.faults = Faults()
        self.traffic = Traffic()


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """A request's body, by its Content-Length or chunked."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = b""
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return out
            out += handler.rfile.read(size)
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _relay(self) -> None:
        body = read_body(self)
        if self.server.delay_s:
            time.sleep(self.server.delay_s)
        fault = self.server.faults.pick(self.command, self.path)
        if fault == "drop":  # a reset: no status line, the socket closed at once
            self._reset()
            return
        if fault == "503":
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOW_DOWN)))
            self.end_headers()
            self.wfile.write(SLOW_DOWN)
            return
        # the length of the body read (one Content-Length whatever its case: Azurite refuses a request with two)
        hop = ("transfer-encoding", "connection", "content-length")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=120)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if fault == "lost":  # done by the store, but the client never hears of it
            self._reset()
            return
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(k, v)
        length = resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        t = self.server.traffic
        with t.lock:
            t.requests += 1
            t.bytes_in += len(body)
            t.bytes_out += len(data) if self.command != "HEAD" else 0
            t.by_method[self.command] = t.by_method.get(self.command, 0) + 1
            if t.keep_log:
                t.log.append((self.command, self.path, resp.status, len(data) if self.command != "HEAD" else 0,
                              dict(self.headers.items())))

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _relay


@dataclass
class S3Server:
    """moto's S3 server, and the proxy in front of it that clients use (``endpoint``)."""

    moto_port: int
    proxy: _Proxy
    process: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.proxy.server_address[1]}"

    @property
    def direct_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    @property
    def faults(self) -> Faults:
        return self.proxy.faults

    @property
    def traffic(self) -> Traffic:
        return self.proxy.traffic

    def env(self) -> dict[str, str]:
        """The environment a client needs: the usual AWS variables, pointing at this server."""
        return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.direct_endpoint, region_name=FAKE_CREDENTIALS["AWS_REGION"],
                            aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """Key -> size of every object under ``prefix``."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def stop(self) -> None:
        self.proxy.shutdown()
        self.proxy.server_close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _die_with_parent() -> None:
    """In the child: ask Linux to end it when the process that started it ends (a crashed test run leaves no server)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_s3_server() -> S3Server:
    """moto's standalone server (``moto[server]``) on a free port of 127.0.0.1, the proxy on another."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                               env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"})
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("moto's S3 server did not start (is moto[server] installed?)") from None
            time.sleep(0.1)
    proxy = _Proxy(free_port(), port)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return S3Server(port, proxy, process)


@contextmanager
def fault_proxy(upstream: int) -> Iterator[_Proxy]:
    """A fault-injecting proxy (``_Proxy``) on a free port in front of the server on port ``upstream``."""
    proxy = _Proxy(free_port(), upstream)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


@contextmanager
def s3_server() -> Iterator[S3Server]:
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


_names = itertools.count(1)


def bucket_name(prefix: str = "strata") -> str:
    return f"{prefix}-{os.getpid()}-{next(_names)}"


if __name__ == "__main__":
    with s3_server() as srv:
        srv.create_bucket("strata")
        for k, v in srv.env().items():
            print(f"export {k}={v}")
        print("# bucket: s3://strata ; Ctrl-C to stop", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
