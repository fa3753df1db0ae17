"""The LLM path against a local OpenAI-compatible server that injects faults."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import time

import pytest
from typer.testing import CliRunner

from flows.cli import app
from schemas.config import LLMConfig
from tasks.runtime.llm import ParseError, parse_json
from tasks.runtime.llm_client import AsyncRateLimiter, LiteLLMClient, LLMError
from tasks.store.catalog import Catalog
from tests.fake_llm_server import FakeLLM

ENTITY_MSGS = [
    {"role": "system", "content": "You build a knowledge graph from text. Identify every meaningful entity."},
    {"role": "user", "content": 'Text:\n"""\nAlice Smith met Bob Jones in Paris.\n"""'},
]


@pytest.fixture
def fake():
    server = FakeLLM().start()
    yield server
    server.stop()


def client(fake, tmp_path, **kw) -> LiteLLMClient:
    cfg = LLMConfig(model="openai/fake", api_base=fake.url, api_key="sk-fake", timeout_s=1.0, backoff_base_s=0.05,
                    max_retries=kw.pop("max_retries", 6), **kw)
    return LiteLLMClient(cfg, tmp_path)


def test_429_is_retried_honouring_retry_after(fake, tmp_path):
    fake.faults["rate_limit"] = 1.0
    c = client(fake, tmp_path, max_retries=2)
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="RateLimitError"):
        asyncio.run(c.complete(ENTITY_MSGS, prompt_version="t"))
    assert fake.requests == 3 and c.usage.retries == 2
    assert time.perf_counter() - t0 >= 0.4  # two waits of Retry-After: 0.2


def test_400_is_never_retried(fake, tmp_path):
    fake.faults["bad_request"] = 1.0
    c = client(fake, tmp_path)
    with pytest.raises(LLMError, match="status 400"):
        asyncio.run(c.complete(ENTITY_MSGS, prompt_version="t"))
    assert fake.requests == 1


def test_500_and_hang_are_retried_then_answer_is_cached(fake, tmp_path):
    fake.faults.update(server_error=0.5, hang=0.3)
    fake.hang_s = 2.0
    c = client(fake, tmp_path, max_retries=10)
    value = asyncio.run(c.complete(ENTITY_MSGS, prompt_version="t", parse=parse_json))
    assert [e["name"] for e in value["entities"]] == ["Alice Smith", "Bob Jones", "Paris"]
    n = fake.requests
    again = client(fake, tmp_path)  # a new client, same cache: no call
    assert asyncio.run(again.complete(ENTITY_MSGS, prompt_version="t", parse=parse_json)) == value
    assert fake.requests == n and again.usage.cache_hits == 1
    # another prompt version is another cache key
    fake.faults.update(server_error=0.0, hang=0.0)
    asyncio.run(again.complete(ENTITY_MSGS, prompt_version="t2", parse=parse_json))
    assert fake.requests > n


def test_unparseable_answer_is_retried_once_never_cached_and_remembered(fake, tmp_path):
    fake.faults["malformed"] = 1.0
    c = client(fake, tmp_path)
    with pytest.raises(ParseError, match="after one retry"):
        asyncio.run(c.complete(ENTITY_MSGS, prompt_version="t", parse=parse_json))
    assert fake.requests == 2
    assert c.cache.all() == {}  # nothing faulty stored
    again = client(fake, tmp_path)
    with pytest.raises(ParseError, match="remembered"):
        asyncio.run(again.complete(ENTITY_MSGS, prompt_version="t", parse=parse_json))
    assert fake.requests == 2  # a re-run does not pay again
    fake.faults["malformed"] = 0.0
    retry = client(fake, tmp_path, retry_unparseable=True)
    assert asyncio.run(retry.complete(ENTITY_MSGS, prompt_version="t", parse=parse_json))["entities"]
    assert fake.requests == 3


def test_empty_answer_counts_as_unparseable(fake, tmp_path):
    fake.faults["empty"] = 1.0
    c = client(fake, tmp_path)
    with pytest.raises(ParseError, match="empty answer"):
        asyncio.run(c.complete(ENTITY_MSGS, prompt_version="t"))
    assert fake.requests == 2 and c.cache.all() == {}


def test_concurrency_limit_holds(fake, tmp_path):
    fake.latency_s = 0.2
    c = client(fake, tmp_path, max_concurrency=4, cache=False)

    async def many():
        return await asyncio.gather(*(c.complete(ENTITY_MSGS + [{"role": "user", "content": str(i)}], prompt_version="t")
                                      for i in range(8)))

    t0 = time.perf_counter()
    asyncio.run(many())
    elapsed = time.perf_counter() - t0
    assert 0.4 <= elapsed < 1.5  # 8 calls of 0.2 s at 4 at a time: two waves


def test_rate_limiter_spaces_calls():
    async def go():
        lim = AsyncRateLimiter(per_minute=600, burst=1)  # 10 per second
        t0 = time.perf_counter()
        for _ in range(11):
            await lim.acquire()
        return time.perf_counter() - t0

    assert 0.9 <= asyncio.run(go()) < 2.0


def test_api_key_never_reaches_tables(fake, tmp_path, small_corpus, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    cfg_sets = ["--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}", "--set", "llm.api_key=sk-SECRET-123",
                "--set", "chunking.size=400", "--set", "dask.processes=false", "--set", "hierarchy.enabled=false"]
    index = tmp_path / "index"
    res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *cfg_sets])
    assert res.exit_code == 0, res.output
    for table in ("runs", "quarantine"):
        assert "sk-SECRET-123" not in json.dumps(Catalog(index).read(table).to_pylist(), default=str)
    # nowhere on disk either: every table file, the LLM and embedding caches, the layer plot, and Prefect's
    # database (flow parameters, logs, artifacts) — and not in what the command printed
    import os
    from pathlib import Path

    assert "sk-SECRET-123" not in res.output
    for root in (index, Path(os.environ["PREFECT_HOME"])):
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert b"sk-SECRET-123" not in path.read_bytes(), path
    monkeypatch.delenv("STRATA_LLM__API_KEY", raising=False)


def test_index_completes_under_faults_and_rerun_makes_no_calls(tmp_path, small_corpus, monkeypatch):
    """30 % faults (429, 500, hangs, empty answers) and 10 % malformed answers."""
    fake = FakeLLM(seed=7, hang_s=2.5, rate_limit=0.1, server_error=0.1, hang=0.05, empty=0.05, malformed=0.1).start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        sets = ["--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}", "--set", "llm.timeout_s=1.0",
                "--set", "llm.max_retries=12", "--set", "llm.backoff_base_s=0.05", "--set", "llm.backoff_max_s=0.3",
                "--set", "chunking.size=300", "--set", "chunking.overlap=30", "--set", "extract.batch_size=8",
                "--set", "dask.processes=false"]
        index = tmp_path / "index"
        res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *sets])
        assert res.exit_code == 0, res.output
        assert sum(fake.injected.values()) > 20 and fake.injected["malformed"] > 5
        cat = Catalog(index)
        chunks = cat.read("chunks").to_pylist()
        quarantined = {q["item"]: q["error"] for q in cat.read("quarantine").to_pylist()}
        for c in chunks:  # every chunk is extracted or quarantined with a reason
            assert c["status"] == "extracted" or (c["status"] == "quarantined" and quarantined[c["id"]])
        assert sum(c["status"] == "extracted" for c in chunks) >= len(chunks) * 0.8
        assert cat.read("entities").num_rows > 0 and cat.read("community_reports").num_rows > 0
        with sqlite3.connect(index / "_cache" / "llm_cache.sqlite") as db:
            cached = [t for (t,) in db.execute("SELECT text FROM responses")]
        assert cached and not any("MALFORMED" in t or not t.strip() for t in cached)  # no faulty answer cached
        run1 = cat.runs()[-1]
        assert run1["status"] == "published" and run1["llm_calls"] > 0 and run1["llm_tokens"] > 0
        calls = fake.requests
        res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *sets])
        assert res.exit_code == 0, res.output
        assert fake.requests == calls  # the second run makes zero new calls
        assert Catalog(index).runs()[-1]["llm_calls"] == 0
        again = {c["id"]: c["status"] for c in Catalog(index).read("chunks").to_pylist()}
        assert again == {c["id"]: c["status"] for c in chunks}
    finally:
        fake.stop()


def test_litellm_embeddings_dimension_from_model_retries_and_checked(tmp_path, small_corpus, monkeypatch):
    """Embeddings through litellm: the index takes the model's dimension (64 here), faults are retried,
    calls are counted in the run, and an index is never mixed with another model's vectors."""
    fake = FakeLLM(seed=3, rate_limit=0.15, server_error=0.1).start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        sets = ["--set", "embedding.model=openai/fake-embed", "--set", f"embedding.api_base={fake.url}",
                "--set", "embedding.batch_size=16", "--set", "llm.backoff_base_s=0.05", "--set", "llm.max_retries=12",
                "--set", "chunking.size=400", "--set", "dask.processes=false"]
        index = tmp_path / "index"
        res = CliRunner().invoke(app, ["index", str(small_corpus), "--index", str(index), "--quiet", *sets])
        assert res.exit_code == 0, res.output
        cat = Catalog(index)
        assert cat.snapshot()["dim"] == 64
        for table in ("entities", "chunks", "community_reports"):
            assert {len(v) for v in cat.read(table).column("vector").to_pylist()} == {64}
        run = cat.runs()[-1]
        assert fake.injected["rate_limit"] + fake.injected["server_error"] > 0
        assert run["llm_calls"] == fake.requests and run["llm_tokens"] > 0  # every embedding request is counted, retries too
        res = CliRunner().invoke(app, ["query", "Who wrote the novel?", "--index", str(index), *sets])
        assert res.exit_code == 0, res.output
        # the packaged 384-d model cannot query or update a 64-d index: a clear error, nothing published
        res = CliRunner().invoke(app, ["query", "Who wrote the novel?", "--index", str(index)])
        assert res.exit_code != 0 and "64-d" in res.output and "384-d" in res.output
        corpus = tmp_path / "corpus"
        shutil.copytree(small_corpus, corpus)  # the shared corpus stays as it is
        (corpus / "extra.txt").write_text("Ada Lovelace wrote notes on the Analytical Engine.\n")
        version = cat.snapshot()["version"]
        res = CliRunner().invoke(app, ["update", str(corpus), "--index", str(index), "--quiet",
                                       "--set", "chunking.size=400", "--set", "dask.processes=false"])
        assert res.exit_code != 0 and "64-d" in res.output
        assert Catalog(index).snapshot()["version"] == version
    finally:
        fake.stop()


def test_update_quarantines_a_failed_llm_summary(tmp_path, small_corpus, monkeypatch):
    """An update whose LLM summaries come back unusable keeps offline summaries and says so in quarantine."""
    from flows.pipeline import build_index, update_index
    from schemas.config import load_config

    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    (corpus / "notes" / "fezziwig.md").unlink(missing_ok=True)
    base = {"chunking": {"size": 200, "overlap": 20}, "dask": {"processes": False}, "extract": {"method": "nlp"}}
    build_index(str(corpus), Catalog(tmp_path / "index"), load_config(overrides=base))
    (corpus / "notes" / "fezziwig.md").write_text(
        "# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge was apprenticed in London.\n")
    fake = FakeLLM(malformed=1.0).start()  # every LLM answer is unparseable
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        cfg = load_config(overrides={**base, "incremental": {"refresh_staleness": 0.0},
                                     "llm": {"model": "openai/fake", "api_base": fake.url, "max_retries": 0}})
        result = update_index(str(corpus), Catalog(tmp_path / "index"), cfg)
    finally:
        fake.stop()
    assert result.status == "published" and result.stages["attach"]["refreshed"] > 0
    rows = Catalog(tmp_path / "index").read("quarantine").to_pylist()
    summaries = [q for q in rows if q["stage"] == "hierarchy"]
    assert summaries and all(q["error"].startswith("LLM summary unusable, offline summary used: ") for q in summaries)
    assert any(q["stage"] == "reports" for q in rows)
