"""The Python API (``flows.api``) and the scripts of ``examples/`` that use it, run as a user runs them."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from flows.api import estimate, open_index, settings_of
from tasks.errors import IndexNotFound, UsageError
from tests.conftest import REPO


def example(name: str, *args: str) -> str:
    res = subprocess.run([sys.executable, str(REPO / "examples" / name), *args], capture_output=True, text=True,
                         cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_settings_are_the_toml_keys_dotted():
    cfg = settings_of(None, {"chunking.size": 321, "llm.reports.min_members": 4, "retrieval.token_budget": 900})
    assert (cfg.chunking.size, cfg.llm.reports.min_members, cfg.retrieval.token_budget) == (321, 4, 900)


def test_the_examples_build_query_read_and_refresh(tmp_path, small_corpus):
    corpus, index = tmp_path / "corpus", tmp_path / "index"
    shutil.copytree(small_corpus, corpus)
    with pytest.raises(IndexNotFound):
        open_index(str(index))
    printed = example("build_and_query.py", str(corpus), str(index), "Who was Scrooge's clerk?")
    assert "snapshot v1:" in printed and "answer (extractive, mode hi)" in printed and "source " in printed
    printed = example("read_tables.py", str(index))
    assert "snapshot v1, modes hi" in printed and "degree" in printed and "rating" in printed
    idx = open_index(str(index))
    result = idx.query("Who was Scrooge's clerk?", mode="ppr", budget=800)
    assert result.mode == "ppr" and result.version == 1 and 0 < sum(result.tokens.values()) <= 800
    assert all(s["text"] in result.context for s in result.sources)  # whole sources, in the context
    with pytest.raises(UsageError):
        idx.query("  ")
    (corpus / "new.md").write_text("# Fezziwig\n\nOld Fezziwig kept a warehouse in the City of London.\n")
    assert estimate(corpus, str(index))["documents"] == 1  # an update's delta, nothing written
    spec = importlib.util.spec_from_file_location("nightly_flow", REPO / "examples" / "nightly_flow.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.nightly_refresh.fn(str(corpus), str(index), "Who kept a warehouse?") == 2
    assert idx.refresh() and idx.version == 2
