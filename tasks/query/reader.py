"""Opening an index to answer questions: the one set-up of ``strata query``, ``shell``, ``eval`` and ``serve``.

``open_reader`` opens an existing index (never creates one), loads the latest snapshot's view (or ``as_of``'s),
the question embedder (checked against the index's vector dimension) and the LLM client when one is
configured; ``Reader.ask`` retrieves a context for a question and answers it. Which modes an index offers is
checked here and nowhere else (``check_mode``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from schemas.config import StrataConfig
from tasks.errors import UsageError
from tasks.index.embed import check_dimension, question_embedder
from tasks.methods.registry import all_modes, index_modes
from tasks.runtime import process
from tasks.runtime.tokens import get_encoding
from tasks.store.catalog import Catalog


def check_mode(method: str, mode: str | None) -> str:
    """``mode`` (default: the method's first) if an index built by ``method`` offers it, else a usage error."""
    offered = index_modes(method)
    if mode is None:
        return offered[0]
    if mode not in all_modes():
        raise UsageError(f"unknown mode {mode[:64]!r}; choose one of {', '.join(all_modes())}")
    if mode not in offered:
        raise UsageError(f"mode {mode!r} is not offered by this {method} index; it offers {', '.join(offered)}")
    return mode


def check_modes(modes: list[str]) -> None:
    """Every mode named is one some index offers (before anything is loaded)."""
    bad = [m for m in modes if m not in all_modes()]
    if bad:
        what = "mode" if len(bad) == 1 else "modes"
        raise UsageError(f"unknown {what} {', '.join(map(repr, bad))}; choose from {', '.join(all_modes())}")


@dataclass
class Reader:
    cfg: StrataConfig
    catalog: Catalog
    view: Any  # tasks.retrieval.view.IndexView of the snapshot read
    embedder: Any
    client: Any  # LiteLLMClient, or None: offline (extractive) answers
    sentences: Any = None  # the offline answer's sentence pieces, remembered (``answer.TokenVectors``)

    @property
    def modes(self) -> tuple[str, ...]:
        return index_modes(self.view.method)

    def refresh(self) -> bool:
        """Move to the newest published snapshot; True when it changed."""
        from tasks.retrieval.view import load_view  # lazy: open_reader imports it beside the model's loading

        view = load_view(self.catalog)
        changed, self.view = view.version != self.view.version, view
        return changed

    def ask(
        self, question: str, mode: str | None = None, budget: int | None = None, view: Any = None
    ) -> tuple[Any, dict[str, Any], float]:
        """Retrieve a context for ``question`` from ``view`` (default: the reader's) and answer it: the context,
        the answer (``tasks.query.answer.answer``) and the retrieval's milliseconds."""
        # lazy: open_reader imports them beside the model's loading
        from tasks.query.answer import answer
        from tasks.query.retrieve import retrieve
        from tasks.retrieval.view import removed_meanwhile

        view = view or self.view
        mode = check_mode(view.method, mode)
        cfg = self.cfg.retrieval if budget is None else self.cfg.retrieval.model_copy(update={"token_budget": budget})
        t0 = time.perf_counter()
        if self.client is None and self.sentences is not None and self.sentences.embedder is self.embedder:
            vector = self.sentences.question(question)  # one model pass: the retrieval's vector, the answer's pieces
        else:
            vector = self.embedder.embed([question])[0]
        with removed_meanwhile(self.catalog, view.version, (view.snap or {}).get("tables")):  # read on first use
            ctx = retrieve(view, question, vector, mode, cfg)
        ms = (time.perf_counter() - t0) * 1000
        return ctx, answer(ctx, self.client, self.sentences), ms


def open_reader(
    index: str,
    cfg: StrataConfig,
    as_of: int | None = None,
    mode: str | None = None,
    warm: bool = True,
    alone: bool = False,
) -> Reader:
    """The index at ``index`` ready to answer: view, embedder (``warm``: its model loaded now, beside the view;
    ``alone``: for a command that asks on its own, on every core, not a service's one), LLM client. A missing index, an unknown snapshot or a mode the index does not offer fail before any model
    loads where they can. BLAS runs on one thread in this process from here on (``one_blas_thread``): a query's
    products are small, and a second OpenBLAS thread only spins (``strata eval`` on MuSiQue's subset: 41 s of CPU
    with it, 28 s without, the same wall time and figures)."""
    process.one_blas_thread(with_scipy=False)  # a query's scipy is sparse products and graph searches, no BLAS

    if mode is not None:
        check_modes([mode])
    catalog = Catalog(index, create=False, storage=cfg.storage)
    embedder = question_embedder(cfg.embedding, cfg.llm, threads=None if alone else 1)
    # the model and token tables load while the query's modules import and the snapshot is read
    loading = _warm_up(embedder) if warm else None
    try:
        # lazy: imported here, beside the model's loading (``ask`` uses retrieve)
        import tasks.query.retrieve  # noqa: F401
        from tasks.query.answer import SENTENCE_CACHE, TokenVectors, answer_embedder
        from tasks.retrieval.view import load_view
        from tasks.runtime.llm_client import LiteLLMClient

        view = load_view(catalog, as_of)
    finally:  # a native library still loading when the process exits aborts it: wait, whatever happened
        if loading is not None:
            loading.join()
    check_mode(view.method, mode)
    check_dimension(embedder, view.dim)
    answers = cfg.llm.stage("answers")
    client = LiteLLMClient(answers, catalog.cache_dir) if answers is not None else None
    sentences = TokenVectors(answer_embedder(embedder), max(SENTENCE_CACHE, cfg.serve.warm_sentences))
    return Reader(cfg, catalog, view, embedder, client, sentences)


def _warm_up(embedder: Any) -> threading.Thread:
    """A thread that loads what a query needs besides its snapshot: the embedding model's session and tokenizer
    (``prepare``, where the embedder has one) and the token-count tables (native code, which runs beside the
    snapshot's unpickling; a cold query is ~0.2 s shorter on two cores)."""

    def load() -> None:
        with contextlib.suppress(Exception):  # a failure shows again, with its message, where the query embeds
            getattr(embedder, "prepare", lambda: None)()
            get_encoding()

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread
