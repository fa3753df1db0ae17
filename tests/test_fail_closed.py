"""Fail closed, fail clean: the service refuses what it must, never echoes, logs every request; every command ends
a failure with one line and the exit code of its kind (README: exit codes)."""

from __future__ import annotations

import http.client
import io
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from flows.cli import app
from flows.serve import create_app
from schemas.config import load_config
from tasks.errors import EXIT_CODES, RefusedError
from tests.test_serve import OVERRIDES, served_index  # noqa: F401  (the module's index fixture)

runner = CliRunner()
KEY_ENV = "STRATA_TEST_FAIL_CLOSED_KEY"


def _cfg(**serve):
    """Without a key variable: no auth (``serve.auth = "none"``), as these tests of bodies and logs need."""
    return load_config(overrides={**OVERRIDES, "serve": serve if "api_key_env" in serve else {"auth": "none", **serve}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """The app under a real uvicorn on 127.0.0.1 (HTTP framing, chunked bodies and slow clients are real)."""

    def __init__(self, index: Path, **serve):
        import uvicorn

        self.port = _free_port()
        config = uvicorn.Config(create_app(str(index), _cfg(**serve)), host="127.0.0.1", port=self.port,
                                log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the service did not become ready")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 30) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            res = conn.getresponse()
            return res.status, res.read()
        finally:
            conn.close()


def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = 10) -> bytes:
    """Send a request's head and the start of its body, send nothing more, and read what the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(head + body)
        reply = b""
        while True:
            try:
                data = conn.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            reply += data
        return reply


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CHUNKED = b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


# ---------------------------------------------------------------------------- the service
def test_a_key_variable_that_is_not_set_refuses_to_start(served_index, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(RefusedError, match=f"{KEY_ENV}, which is not set"):
        create_app(str(served_index), _cfg(api_key_env=KEY_ENV))
    res = runner.invoke(app, ["serve", "--index", str(served_index), "--port", str(_free_port()),
                              "--set", f"serve.api_key_env={KEY_ENV}"])
    assert res.exit_code == EXIT_CODES["refused"] and "serving" not in res.output and "not set" in res.output
    monkeypatch.setenv(KEY_ENV, "  ")  # empty is not a key either
    with pytest.raises(RefusedError):
        create_app(str(served_index), _cfg(api_key_env=KEY_ENV))


def test_bodies_over_the_limit_are_refused_chunked_or_not_and_nothing_is_echoed(served_index):
    with LiveServer(served_index, max_request_bytes=4096, body_timeout_s=2) as live:
        # the first 64 KiB of a chunked 20 MB body: refused at once, the rest never read
        reply = raw_request(live.port, CHUNKED, chunk(b"x" * 65536))
        assert reply.startswith(b"HTTP/1.1 413 ") and len(reply) < 400, reply[:400]
        question = json.dumps({"question": "q" * 2_000_000}).encode()
        reply = raw_request(live.port, CHUNKED, chunk(question[:65536]))
        assert reply.startswith(b"HTTP/1.1 413 ") and b"qqqq" not in reply
        small = json.dumps({"question": "q" * 5000}).encode()  # a whole chunked body, just over the limit
        reply = raw_request(live.port, CHUNKED, chunk(small[:2000]) + chunk(small[2000:]) + b"0\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 413 ")
        head = b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\n\r\n"
        assert raw_request(live.port, head, b"{").startswith(b"HTTP/1.1 413 ")
        # a body that stops arriving: 408 within the deadline, not a held connection
        head = b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        started = time.monotonic()
        assert raw_request(live.port, head, b'{"q').startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 8
        assert live.request("POST", "/query", body=json.dumps({"question": "Who was Scrooge's clerk?"}),
                            headers={"Content-Type": "application/json"})[0] == 200


def test_error_responses_never_echo_the_input(served_index):
    with TestClient(create_app(str(served_index), _cfg(max_request_bytes=60000))) as client:
        long = "é" * 3000
        for payload in ({"question": long * 2}, {"question": "q", "mode": long}, {"question": 12345, "mode": ["x" * 500]},
                        {"question": "q", "token_budget": long}, {"question": "q", "as_of": long}):
            res = client.post("/query", json=payload)
            assert 400 <= res.status_code < 500 and len(res.content) < 2000, (payload.keys(), res.text[:300])
            assert "éééééé" not in res.text and "x" * 201 not in res.text
        res = client.post("/query", content=b"{" * 20000, headers={"Content-Type": "application/json"})
        assert 400 <= res.status_code < 500 and len(res.content) < 2000
        res = client.post("/query", content=b'{"question": "\xff\xfe"}', headers={"Content-Type": "application/json"})
        assert 400 <= res.status_code < 500


def test_the_bearer_scheme_is_case_insensitive_and_the_docs_load_offline_with_auth_on(served_index, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "s3cret-token")
    with TestClient(create_app(str(served_index), _cfg(api_key_env=KEY_ENV))) as client:
        for scheme in ("Bearer", "bearer", "BEARER"):
            res = client.get("/snapshots", headers={"Authorization": f"{scheme} s3cret-token"})
            assert res.status_code == 200, scheme
        assert client.get("/snapshots", headers={"Authorization": "Basic s3cret-token"}).status_code == 401
        assert client.get("/snapshots").status_code == 401
        for page, asset in (("/docs", "/static/swagger-ui-bundle.js"), ("/redoc", "/static/redoc.standalone.js")):
            html = client.get(page)
            assert html.status_code == 200 and asset in html.text
            assert "cdn" not in html.text.lower() and not re.search(r'(src|href)="https?://', html.text)
            js = client.get(asset)
            assert js.status_code == 200 and len(js.content) > 100_000
        schema = client.get("/openapi.json").json()  # the docs read the schema: it holds no data
        assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
        assert {"HTTPBearer": []} in schema["paths"]["/query"]["post"]["security"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_request_is_logged_once_without_the_key_or_the_question(served_index, monkeypatch, fmt):
    monkeypatch.setenv(KEY_ENV, "s3cret-token")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("strata.access")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        right = {"Authorization": "Bearer s3cret-token"}
        with TestClient(create_app(str(served_index), _cfg(api_key_env=KEY_ENV, log_format=fmt))) as client:
            assert client.post("/query", json={"question": "Who was Scrooge's secret clerk?", "mode": "naive"},
                               headers=right).status_code == 200
            assert client.get("/snapshots").status_code == 401
            assert client.get("/healthz").status_code == 200
        with TestClient(create_app(str(served_index), _cfg(log_format=fmt, log_questions=True))) as client:
            client.post("/query", json={"question": "Who was Scrooge's logged clerk?"})
    finally:
        log.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert "s3cret-token" not in stream.getvalue() and "secret clerk" not in stream.getvalue()
    if fmt == "json":
        records = [json.loads(line) for line in lines]
        assert [(r["route"], r["status"]) for r in records] == [("/query", 200), ("/snapshots", 401), ("/healthz", 200),
                                                                 ("/query", 200)]
        assert records[0]["snapshot"] == 1 and records[0]["mode"] == "naive" and records[0]["latency_ms"] > 0
        assert records[3]["question"] == "Who was Scrooge's logged clerk?" and records[3]["mode"] == "hi"
    else:
        assert " POST /query 200 " in lines[0] and "snapshot=1 mode=naive" in lines[0]
        assert " GET /snapshots 401 " in lines[1] and "logged clerk" in lines[3]


def test_serve_refuses_a_bad_port_and_a_port_in_use_in_one_line(served_index):
    res = runner.invoke(app, ["serve", "--index", str(served_index), "--port", "99999"])
    assert res.exit_code == EXIT_CODES["usage"] and "Traceback" not in res.output and len(res.output.splitlines()) < 8
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        res = runner.invoke(app, ["serve", "--index", str(served_index), "--port", str(taken.getsockname()[1])])
    assert res.exit_code == EXIT_CODES["refused"] and "serving" not in res.output and "cannot listen" in res.output


# ---------------------------------------------------------------------------- the commands
@pytest.mark.parametrize("command", [["query", "Who?"], ["inspect"], ["validate"], ["export", "--out", "OUT"],
                                     ["serve"], ["gc", "--keep", "1"], ["rollback", "--to", "1"], ["shell"],
                                     ["eval", "--dataset", "DATASET"]])
def test_read_commands_never_create_an_index(tmp_path, command):
    missing = tmp_path / "typo"
    (tmp_path / "ds").mkdir()  # eval's dataset: a corpus it could build from, only with --build
    (tmp_path / "ds" / "queries.jsonl").write_text('{"question": "Who?"}\n')
    (tmp_path / "ds" / "corpus.jsonl").write_text('{"id": "p1", "title": "A", "text": "Scrooge."}\n')
    args = [a.replace("OUT", str(tmp_path / "out")).replace("DATASET", str(tmp_path / "ds")) for a in command]
    res = runner.invoke(app, [*args, "--index", str(missing)])
    assert res.exit_code == EXIT_CODES["not_found"] and "no index at" in res.output, res.output
    assert not missing.exists() and not (tmp_path / "out").exists()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    res = runner.invoke(app, [*args, "--index", str(a_file)])
    assert res.exit_code == EXIT_CODES["usage"] and "is a file" in res.output and "Errno" not in res.output
    assert "(never created" in _flat(runner.invoke(app, [command[0], "--help"]).output)


def test_index_on_an_empty_or_unreadable_folder_says_so_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["index", str(tmp_path / "empty"), "--index", str(tmp_path / "i1"), "-q"])
    assert res.exit_code == EXIT_CODES["not_found"] and res.output.strip().startswith("error: no documents")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.bin").write_bytes(b"\x00\x01")
    res = runner.invoke(app, ["index", str(tmp_path / "junk"), "--index", str(tmp_path / "i2"), "-q",
                              "--set", "dask.processes=false"])
    assert res.exit_code == EXIT_CODES["not_found"] and "no readable documents" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 2, res.output


def _flat(text: str) -> str:
    """Help text without the panel borders and line breaks rich adds."""
    return " ".join(text.replace("│", " ").split())


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_gc_removes_versions_and_never_grows_the_index(served_index, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(served_index, index)
    for _ in range(2):
        assert runner.invoke(app, ["rollback", "--index", str(index), "--to", "1"]).exit_code == 0
    before = _size(index / "lance")
    res = runner.invoke(app, ["gc", "--index", str(index), "--keep", "1"])
    assert res.exit_code == 0, res.output
    removed = int(res.output.split("table versions removed:")[1].split()[0].rstrip(";"))
    assert removed > 0 and _size(index / "lance") <= before
    assert runner.invoke(app, ["validate", "--index", str(index)]).exit_code == 0
    res = runner.invoke(app, ["gc", "--index", str(index), "--keep", "0"])
    assert res.exit_code == EXIT_CODES["usage"]


def test_a_deleted_data_file_fails_query_as_it_fails_inspect(served_index, tmp_path):
    index = tmp_path / "index"
    shutil.copytree(served_index, index)
    ask = ["query", "Who was Scrooge's clerk?", "--index", str(index), "--mode", "naive"]
    assert runner.invoke(app, ask).exit_code == 0  # leaves the view's copy on disk
    data = sorted((index / "lance" / "chunks.lance" / "data").iterdir())
    data[0].unlink()
    from tasks.retrieval import view as views

    views._VIEWS.clear()  # a new process: only the copy on disk remains
    for args in (ask, ["inspect", "--index", str(index)], ["validate", "--index", str(index)]):
        res = runner.invoke(app, args)
        assert res.exit_code == EXIT_CODES["damaged"] and "chunks" in res.output, (args, res.output)
        assert ".rs:" not in res.output


def test_modes_budgets_config_errors_help_and_output_are_clean(served_index):
    index = str(served_index)
    assert runner.invoke(app, ["query", "q", "--index", index, "--mode", "bogus"]).exit_code == EXIT_CODES["usage"]
    assert runner.invoke(app, ["query", "q", "--index", index, "--mode", "hygrag"]).exit_code == EXIT_CODES["usage"]
    assert runner.invoke(app, ["shell", "--index", index, "--mode", "hygrag"]).exit_code == EXIT_CODES["usage"]
    res = runner.invoke(app, ["eval", "--dataset", index, "--index", index, "--modes", "bogus"])
    assert res.exit_code == EXIT_CODES["usage"]
    res = runner.invoke(app, ["query", "q", "--index", index, "--set", "retrieval.token_budget=abc"])
    assert res.exit_code == EXIT_CODES["usage"] and "(defaults + --set)" in res.output
    assert runner.invoke(app, ["query", "q", "--index", index, "--as-of", "9"]).exit_code == EXIT_CODES["not_found"]
    assert "Settings under [serve]" in _flat(runner.invoke(app, ["serve", "--help"]).output)
    helptext = _flat(runner.invoke(app, ["query", "--help"]).output)
    assert "archrag" in helptext and "--budget" in helptext
    res = runner.invoke(app, ["query", "Who was Scrooge's clerk?", "--index", index, "--mode", "naive", "--budget", "300",
                              "--json"])
    data = json.loads(res.output)
    assert sum(data["tokens"].values()) <= 300 and all("\r" not in c["text"] for c in data["chunks"])
    res = runner.invoke(app, ["query", "Who was Scrooge's clerk?", "--index", index, "--mode", "naive"])
    assert max(len(line) for line in res.output.splitlines()) > 100  # piped: never hard-wrapped at 80 columns
    assert runner.invoke(app, ["query", "q", "--index", index, "--budget", "50"]).exit_code == EXIT_CODES["usage"]


def test_a_run_does_not_warn_about_the_dask_dashboard_port():
    import warnings

    from schemas.config import DaskConfig
    from tasks.runtime.parallel import dask_client

    with socket.socket() as taken, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            taken.bind(("127.0.0.1", 8787))
            taken.listen(1)
        except OSError:
            pass  # something already holds it, which is the case this test is about
        with dask_client(DaskConfig(n_workers=1, processes=False)) as client:
            assert client.submit(sum, [1, 2]).result() == 3
    assert not [w for w in caught if "8787" in str(w.message)]


def test_an_internal_error_is_one_line_unless_debug_asks(tmp_path, monkeypatch):
    import flows.cli.admin as admin

    def boom(*_a, **_k):
        raise KeyError("surprise")

    monkeypatch.setattr("tasks.query.inspect.inspect_data", boom)
    index = tmp_path / "i"
    (index / "lance").mkdir(parents=True)
    res = runner.invoke(app, ["inspect", "--index", str(index)])
    assert res.exit_code == EXIT_CODES["internal"] and "KeyError" in res.output and "Traceback" not in res.output
    monkeypatch.setitem(os.environ, "STRATA_DEBUG", "1")
    assert "Traceback" in runner.invoke(app, ["inspect", "--index", str(index)]).output
    assert admin  # the module whose command failed
