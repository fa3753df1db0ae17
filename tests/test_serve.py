"""`strata serve`: every route, bad requests, auth, saturation, and queries while an update publishes."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flows.pipeline import build_index, update_index
from flows.serve import create_app
from schemas.config import load_config
from tasks.store.catalog import Catalog
from tests.conftest import SMALL

OVERRIDES = {"chunking": SMALL["chunking"], "extract": SMALL["extract"], "dask": {"processes": False}}


@pytest.fixture(scope="module")
def served_index(small_corpus, tmp_path_factory) -> Path:
    index = tmp_path_factory.mktemp("serve") / "index"
    build_index(str(small_corpus), Catalog(index), load_config(overrides=OVERRIDES))
    return index


def _client(index: Path, **serve) -> TestClient:
    """The app in process; without a key variable, with ``serve.auth = "none"`` (the tests of auth say otherwise)."""
    serve = serve if "api_key_env" in serve or "auth" in serve else {"auth": "none", **serve}
    return TestClient(create_app(str(index), load_config(overrides={**OVERRIDES, "serve": serve})))


def test_routes_answer_as_the_cli_does_and_bad_requests_get_a_4xx_with_a_message(served_index):
    with _client(served_index, max_budget=8000, max_request_bytes=2000) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"status": "ready"}
        # ready once the sources' sentences are embedded (the offline answer's), and saved for the next start
        sentences = client.app.state.service.reader.sentences
        assert len(sentences.seen) > 100 and (served_index / "_cache" / "views" / "sentences.pkl").exists()
        held = dict(sentences.seen)
        res = client.post("/query", json={"question": "Who was Scrooge's clerk?"})
        assert res.status_code == 200, res.text
        # the question (its vector and pieces from one model pass) and the second sentence's query; no source sentence
        assert "Who was Scrooge's clerk?" in sentences.seen and len(set(sentences.seen) - set(held)) <= 2
        body = res.json()
        assert body["version"] == 1 and body["mode"] == "hi" and body["answer"]["kind"] == "extractive"
        assert body["chunks"] and all(c["source_id"] for c in body["chunks"]) and "retrieval_ms" in body
        naive = client.post("/query", json={"question": "Who was Scrooge's clerk?", "mode": "naive", "token_budget": 500})
        assert naive.json()["mode"] == "naive" and sum(naive.json()["tokens"].values()) <= 500
        assert [s["version"] for s in client.get("/snapshots").json()] == [1]
        info = client.get("/index").json()
        assert info["method"] == "hirag" and "hi" in info["modes"] and info["tables"]["chunks"] > 0
        assert "/query" in client.get("/openapi.json").json()["paths"] and client.get("/docs").status_code == 200
        assert 'id="question"' in client.get("/").text
        for payload, status, says in (
            ({"question": "   "}, 422, "question is empty"),
            ({"question": "q", "mode": "fast"}, 422, "unknown mode 'fast'"),
            ({"question": "q", "mode": "hygrag"}, 422, "not offered by this hirag index"),
            ({"question": "q", "token_budget": 50}, 422, "between 100 and 8000"),
            ({"question": "q", "token_budget": 9000}, 422, "between 100 and 8000"),
            ({"question": "q", "as_of": 7}, 404, "snapshot version 7 not found"),
            ({"question": "x" * 3000}, 413, "over 2000 bytes"),
        ):
            res = client.post("/query", json=payload)
            assert res.status_code == status and says in str(res.json()["detail"]), (payload, res.text)
        assert client.post("/query", json={"mode": "hi"}).status_code == 422  # no question at all


def test_auth_guards_every_route_but_the_health_checks_and_the_docs(served_index, monkeypatch, caplog):
    monkeypatch.setenv("STRATA_TEST_SERVE_KEY", "s3cret-token")
    with _client(served_index, api_key_env="STRATA_TEST_SERVE_KEY") as client:
        assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200
        for path in ("/", "/docs", "/redoc", "/openapi.json"):  # no data in any: the docs' calls need the key
            assert client.get(path).status_code == 200
        for path in ("/snapshots", "/index"):
            assert client.get(path).status_code == 401
        assert client.post("/query", json={"question": "Who was Scrooge's clerk?"}).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.post("/query", json={"question": "q"}, headers=wrong).status_code == 401
        right = {"Authorization": "Bearer s3cret-token"}
        assert client.post("/query", json={"question": "Who was Scrooge's clerk?"}, headers=right).status_code == 200
        assert client.get("/snapshots", headers=right).status_code == 200
    assert "s3cret-token" not in caplog.text
    with _client(served_index, auth="none") as client:  # no key only when asked for
        assert client.get("/snapshots").status_code == 200


def _metrics(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed with prometheus-client's own parser: (sample name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    res = client.get("/metrics")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(res.text)
        for s in family.samples
    }


def test_a_busy_service_queues_queries_up_to_a_deadline_and_only_a_full_queue_or_a_passed_deadline_gets_503(
    served_index, monkeypatch
):
    from flows import serve

    entered, release = threading.Event(), threading.Event()
    real = serve.Service.answer

    def slow(self, req, state):
        if req.question == "Scrooge?":
            entered.set()
            release.wait(30)
        return real(self, req, state)

    def ask(question: str, into: dict) -> threading.Thread:
        worker = threading.Thread(target=lambda: into.update(res=client.post("/query", json={"question": question})))
        worker.start()
        return worker

    monkeypatch.setattr(serve.Service, "answer", slow)
    with _client(served_index, max_concurrency=1, queue_size=1, request_timeout_s=1.0) as client:
        first: dict = {}
        running = ask("Scrooge?", first)
        assert entered.wait(30)
        late: dict = {}
        ask("Marley?", late).join(30)  # waits in the queue, the one slot stays taken: the deadline passes
        assert late["res"].status_code == 503 and late["res"].headers["Retry-After"] == "1"
        assert "serve.request_timeout_s (1 s)" in late["res"].json()["detail"]
        queued: dict = {}
        waiting = ask("Who was Marley?", queued)
        while client.app.state.service.metrics.queued._value.get() < 1:  # noqa: SLF001 - the gauge, read directly
            threading.Event().wait(0.01)
        full = client.post("/query", json={"question": "Fezziwig?"})  # the one queue place is taken
        assert full.status_code == 503 and full.headers["Retry-After"] == "1"
        assert "1 queries running and 1 waiting (serve.queue_size)" in full.json()["detail"]
        release.set()
        running.join(60)
        waiting.join(60)
        assert first["res"].status_code == 200 and queued["res"].status_code == 200  # the queued one got its turn
        seen = _metrics(client)
    rejected = {dict(k[1])["reason"]: v for k, v in seen.items() if k[0] == "strata_queries_rejected_total"}
    assert rejected == {"queue_full": 1, "deadline": 1, "loading": 0, "snapshot_gone": 0}
    assert seen[("strata_queries_in_flight", ())] == 0 and seen[("strata_queries_queued", ())] == 0
    answered = {k: v for k, v in seen.items() if k[0] == "strata_requests_total" and ("route", "/query") in k[1]}
    assert answered[("strata_requests_total", (("method", "POST"), ("mode", "hi"), ("route", "/query"), ("status", "200")))] == 2
    assert answered[("strata_requests_total", (("method", "POST"), ("mode", ""), ("route", "/query"), ("status", "503")))] == 2


def test_metrics_are_prometheus_text_and_move_with_the_requests(served_index, monkeypatch):
    monkeypatch.setenv("STRATA_TEST_SERVE_KEY", "s3cret-token")
    right = {"Authorization": "Bearer s3cret-token"}
    with _client(served_index, api_key_env="STRATA_TEST_SERVE_KEY") as client:
        assert client.get("/metrics").status_code == 401  # it says how the index is used: the key guards it
        client.headers.update(right)
        before = _metrics(client)
        for _ in range(2):
            assert client.post("/query", json={"question": "Who was Scrooge's clerk?", "mode": "naive"}).status_code == 200
        client.get("/no-such-route")
        after = _metrics(client)
    names = {name for name, _ in after}
    for name in (
        "strata_requests_total",
        "strata_request_duration_seconds_bucket",
        "strata_request_duration_seconds_count",
        "strata_queries_in_flight",
        "strata_queries_queued",
        "strata_queries_rejected_total",
        "strata_snapshot_version",
        "strata_view_load_seconds_count",
    ):
        assert name in names, name
    ok = ("strata_requests_total", (("method", "POST"), ("mode", "naive"), ("route", "/query"), ("status", "200")))
    assert after[ok] - before.get(ok, 0) == 2
    latency = ("strata_request_duration_seconds_count", (("route", "/query"),))
    assert after[latency] - before.get(latency, 0) == 2
    assert after[("strata_snapshot_version", ())] == 1
    assert after[("strata_view_load_seconds_count", ())] >= 1  # the snapshot loaded at start, timed
    assert ("strata_requests_total", (("method", "GET"), ("mode", ""), ("route", "other"), ("status", "404"))) in after
    assert not any("no-such-route" in str(labels) for _, labels in after)  # unknown paths do not grow the label set


def test_queries_during_a_publish_all_succeed_on_one_version_each_and_the_new_one_is_picked_up(
        served_index, small_corpus, tmp_path):
    index, corpus = tmp_path / "index", tmp_path / "corpus"
    shutil.copytree(served_index, index)
    shutil.copytree(small_corpus, corpus)
    (corpus / "fezziwig.md").write_text("# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge "
                                        "was apprenticed.\n", encoding="utf-8")
    cfg = load_config(overrides=OVERRIDES)
    with _client(index, snapshot_check_s=0) as client:  # every request checks for a newer snapshot
        versions, failures = [], []
        done = threading.Event()

        def publish():
            try:
                update_index(str(corpus), Catalog(index), cfg, replace_root=str(small_corpus))
            finally:
                done.set()

        threading.Thread(target=publish).start()
        while not done.is_set() or not versions:
            res = client.post("/query", json={"question": "Who was apprenticed to Fezziwig?", "mode": "naive"})
            (versions if res.status_code == 200 else failures).append(res.json().get("version", res.text))
        assert not failures and set(versions) <= {1, 2}
        after = client.post("/query", json={"question": "Who was apprenticed to Fezziwig?", "mode": "naive"}).json()
        assert after["version"] == 2 and any("Fezziwig" in c["text"] for c in after["chunks"])
        pinned = client.post("/query", json={"question": "Who was apprenticed to Fezziwig?", "as_of": 1}).json()
        assert pinned["version"] == 1
        assert [s["version"] for s in client.get("/snapshots").json()] == [2, 1]
        # gc removes v1 under a request that resolved it before: a retryable 503 naming gc, then the newest answers
        from tasks.retrieval.view import IndexView, load_view

        resolved = IndexView.load(Catalog(index), 1)  # its passage graph not built yet: read on first use
        held = load_view(Catalog(index), 2)
        done = Catalog(index).gc(keep=1, compact_share=0.0)
        assert done["dropped"] == [1] and "entities" in done["compacted"], done
        # v2's tables written again (the rows only v1 read dropped): its view is loaded again, from the new pins
        again = load_view(Catalog(index), 2)
        assert again is not held
        assert again.snap["tables"] == Catalog(index).snapshot(2)["tables"]
        svc = client.app.state.service
        svc.view, stale = (lambda _as_of: resolved), svc.view
        res = client.post("/query", json={"question": "Who was apprenticed to Fezziwig?"})
        assert res.status_code == 503 and res.headers["Retry-After"] == "1", res.text
        assert "snapshot v1 was removed or rewritten by `strata gc`" in res.json()["detail"]
        svc.view = stale
        assert client.post("/query", json={"question": "Who was apprenticed to Fezziwig?"}).json()["version"] == 2
        gone = client.post("/query", json={"question": "Who was apprenticed to Fezziwig?", "as_of": 1})
        assert gone.status_code == 404 and "snapshot version 1 not found" in gone.json()["detail"]


def test_the_latest_snapshot_is_looked_up_at_most_once_per_snapshot_check_interval(served_index, monkeypatch):
    import tasks.retrieval.view as views

    looked = []
    load = views.load_view
    monkeypatch.setattr(views, "load_view", lambda catalog, as_of=None: looked.append(as_of) or load(catalog, as_of))
    with _client(served_index, snapshot_check_s=3600) as client:
        for _ in range(3):
            assert client.post("/query", json={"question": "Who was Scrooge's clerk?", "mode": "naive"}).status_code == 200
        assert client.post("/query", json={"question": "Who?", "mode": "naive", "as_of": 1}).json()["version"] == 1
    assert looked.count(None) == 2 and looked.count(1) == 1  # the service's first load, then one request's


def test_a_request_beside_the_load_of_a_new_version_is_answered_from_the_view_it_has(served_index, monkeypatch):
    """One request looks up (and loads) the latest snapshot; the others do not wait for it: they answer from the
    published view the service holds (a load that blocked them all was the p99 of a service beside updates)."""
    import tasks.retrieval.view as views

    load, started, release = views.load_view, threading.Event(), threading.Event()

    def slow(catalog, as_of=None):
        started.set()
        release.wait(60)
        return load(catalog, as_of)

    with _client(served_index, snapshot_check_s=0) as client:
        version = client.app.state.service.view(None).version
        monkeypatch.setattr(views, "load_view", slow)
        checker = threading.Thread(target=client.app.state.service.view, args=(None,))
        checker.start()
        assert started.wait(30)
        answered: list[int] = []
        asker = threading.Thread(target=lambda: answered.append(
            client.post("/query", json={"question": "Who was Scrooge's clerk?", "mode": "naive"}).json()["version"]))
        asker.start()
        asker.join(30)
        assert answered == [version] and not release.is_set()  # answered while the load was still held up
        release.set()
        checker.join(30)


def test_serve_refuses_an_index_that_is_not_there(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "none")])
    assert res.exit_code == 3 and "no index at" in res.output and not (tmp_path / "none").exists()
    (tmp_path / "empty" / "lance").mkdir(parents=True)
    res = CliRunner().invoke(app, ["serve", "--index", str(tmp_path / "empty")])
    assert res.exit_code == 3 and "no published index" in res.output


def test_serve_workers_share_the_port_the_token_and_one_scrape_sums_their_metrics(served_index, tmp_path):
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx
    import psutil

    from tests.helpers import stop_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from flows.serve import TOKEN_ENV

    strata = Path(sys.executable).parent / "strata"
    log = tmp_path / "serve.log"
    with log.open("w") as stream:  # no key configured: the token it prints is every worker's
        server = subprocess.Popen(
            [str(strata), "serve", "--index", str(served_index), "--port", str(port), "--set", "serve.workers=2"],
            env={k: v for k, v in os.environ.items() if k != TOKEN_ENV} | {"HF_HUB_OFFLINE": "1"},
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # ready when both workers answer (each loads the snapshot itself)
            try:
                if all(httpx.get(f"{base}/readyz", timeout=5).status_code == 200 for _ in range(8)):
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, log.read_text()
            time.sleep(0.5)
        found = re.search(r"/\?token=([A-Za-z0-9_-]+)", log.read_text())
        assert found, log.read_text()
        right = {"Authorization": f"Bearer {found.group(1)}"}
        workers = [p for p in psutil.Process(server.pid).children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in workers]
        with httpx.Client(timeout=60) as client:
            for _ in range(6):
                question = {"question": "Who was Scrooge's clerk?", "mode": "naive"}
                assert client.post(f"{base}/query", json=question).status_code == 401
                res = client.post(f"{base}/query", json=question, headers=right)
                assert res.status_code == 200 and res.json()["version"] == 1
            text = client.get(f"{base}/metrics", headers=right).text
        from prometheus_client.parser import text_string_to_metric_families

        answered = sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "strata_requests_total" and s.labels.get("route") == "/query" and s.labels.get("status") == "200"
        )
        assert answered == 6  # whichever worker answered each, one scrape counts them all
    finally:
        stop_server(server, signal.SIGINT)
