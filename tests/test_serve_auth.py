"""`strata serve` closed by default: with no key configured it makes a token at start, prints the explorer's URL
with it once and requires it everywhere but the health checks, the page, the favicon and the docs; the token is in
no access-log line and no file under the index; no key at all needs ``serve.auth = "none"``, on loopback only."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from flows.serve import TOKEN_ENV, create_app, refuse_open_network
from schemas.config import load_config
from tasks.errors import EXIT_CODES, RefusedError
from tests.helpers import stop_server
from tests.test_serve import OVERRIDES, served_index  # noqa: F401  (the module's index fixture)

STRATA = Path(sys.executable).parent / "strata"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_app_without_a_key_configured_requires_the_token_it_made(served_index, monkeypatch):  # noqa: F811
    monkeypatch.setenv(TOKEN_ENV, "")  # none inherited: the app makes one (and the variable is unset afterwards)
    with TestClient(create_app(str(served_index), load_config(overrides=OVERRIDES))) as client:
        token = os.environ[TOKEN_ENV]
        assert len(token) >= 32
        assert client.get("/snapshots").status_code == 401
        assert client.post("/query", json={"question": "Who was Scrooge's clerk?"}).status_code == 401
        wrong = client.get("/index", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and token not in wrong.text
        right = {"Authorization": f"Bearer {token}"}
        assert client.get("/snapshots", headers=right).status_code == 200
        assert client.get("/favicon.ico").status_code == 204  # no 401 in the browser's console
        assert client.get("/healthz").status_code == 200 and 'id="question"' in client.get(f"/?token={token}").text


def test_no_auth_is_served_on_loopback_only(served_index, tmp_path):  # noqa: F811
    from flows.cli import app

    res = CliRunner().invoke(
        app,
        ["serve", "--index", str(tmp_path / "none"), "--host", "0.0.0.0", "--set", "serve.auth=none"],
    )
    assert res.exit_code == EXIT_CODES["refused"], res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "loopback" in lines[0] and "serving" not in res.output
    cfg = load_config(overrides={**OVERRIDES, "serve": {"auth": "none"}})
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        refuse_open_network(cfg, host)
    for host in ("0.0.0.0", "::", "192.168.1.7", "example.com"):
        with pytest.raises(RefusedError):
            refuse_open_network(cfg, host)
    with TestClient(create_app(str(served_index), cfg)) as client:  # on loopback: no token needed
        assert client.get("/snapshots").status_code == 200
        assert client.post("/query", json={"question": "Who was Scrooge's clerk?", "mode": "naive"}).status_code == 200


def test_serve_prints_a_token_once_requires_it_and_stops_without_a_writers_message(served_index, tmp_path):  # noqa: F811
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {"HF_HUB_OFFLINE": "1"}
    with log.open("w") as stream:
        server = subprocess.Popen(
            [str(STRATA), "serve", "--index", str(served_index), "--port", str(port)],
            env=env,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and "?token=" not in log.read_text():
            assert server.poll() is None, log.read_text()
            time.sleep(0.2)
        found = re.search(rf"{re.escape(base)}/\?token=([A-Za-z0-9_-]+)", log.read_text())
        assert found, log.read_text()
        token = found.group(1)
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        question = {"question": "Who was Scrooge's clerk?", "mode": "naive"}
        assert httpx.post(f"{base}/query", json=question, timeout=60).status_code == 401
        assert httpx.get(f"{base}/favicon.ico", timeout=10).status_code == 204
        assert httpx.get(f"{base}/?token={token}", timeout=10).status_code == 200  # the printed URL
        right = {"Authorization": f"Bearer {token}"}
        assert httpx.post(f"{base}/query", json=question, headers=right, timeout=60).status_code == 200
        assert httpx.get(f"{base}/snapshots", headers=right, timeout=10).status_code == 200
    finally:
        stop_server(server, signal.SIGTERM)
    text = log.read_text()
    # the token: on the two lines that print it, in no access-log line, in no file under the index
    assert [line for line in text.splitlines() if token in line] == [
        f"open the explorer: {base}/?token={token}",
        f"API calls: -H 'Authorization: Bearer {token}'",
    ]
    assert " GET / 200 " in text and " POST /query 401 " in text
    leaked = [p for p in served_index.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert not leaked
    assert "previous snapshot" not in text and text.rstrip().endswith("stopped"), text[-500:]
    assert server.returncode == 0
