"""Strata from Python: what the CLI runs, as functions a notebook, a scheduler's task or a Prefect flow of your own
can call. The CLI's writing commands and its queries go through here.

    from flows.api import build, open_index, update

    run = build("docs/", "index/", settings={"chunking.size": 600})   # one snapshot published
    index = open_index("index/")
    result = index.query("Who employed Bob Cratchit?", budget=2000)
    print(result.answer, [s["document_id"] for s in result.sources])
    update("docs/", "index/")                                          # tonight's delta

Settings are the ``strata.toml`` keys, dotted (``{"llm.model": "openai/gpt-4o-mini"}``), over ``config`` (a TOML file,
default ``$STRATA_CONFIG``) and the ``STRATA_*`` environment. Failures raise the errors of ``tasks.errors`` (the CLI
maps them to its exit codes), e.g. ``CostCapReached`` for a run the cost cap stopped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.config import StrataConfig, load_config
from tasks.errors import NotFoundError, UsageError

__all__ = ["Index", "QueryResult", "RunResult", "build", "estimate", "open_index", "settings_of", "update"]


@dataclass(frozen=True)
class RunResult:
    """What a build or update did: ``status`` "published" or "nothing-to-do", the snapshot ``version``, each stage's
    seconds and counts, each table's rows, the LLM usage, and the command's seconds."""

    status: str
    version: int | None
    stages: dict[str, dict[str, float]]
    counts: dict[str, int]
    llm: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def of(cls, result: Mapping[str, Any], seconds: float) -> RunResult:
        return cls(
            result["status"], result["version"], result["stages"], result["counts"], result.get("llm", {}), seconds
        )


@dataclass(frozen=True)
class QueryResult:
    """A question's context and answer: ``answer`` (``answer_kind`` "extractive" offline, "llm" with an answer model),
    the sources whose whole text is in the context, the entities, community reports and bridge paths beside them,
    the context as an LLM reads it (``context``), and the retrieval's milliseconds."""

    question: str
    mode: str
    version: int
    answer: str
    answer_kind: str
    sources: list[dict[str, Any]]
    entities: list[dict[str, Any]]
    communities: list[dict[str, Any]]
    bridge: list[dict[str, Any]]
    context: str
    tokens: dict[str, int]
    retrieval_ms: float
    message: str = ""


def _nested(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Dotted keys (``{"chunking.size": 600}``) as the nested settings they name."""
    nested: dict[str, Any] = {}
    for key, value in (settings or {}).items():
        node = nested
        *path, last = [p for p in key.split(".") if p]
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def settings_of(config: str | Path | None = None, settings: Mapping[str, Any] | None = None) -> StrataConfig:
    """The config: defaults < ``config`` (or ``$STRATA_CONFIG``) < environment < ``settings`` (dotted keys)."""
    return load_config(config, _nested(settings))


def _overrides(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """``settings`` as the nested overrides a flow takes, without an API key (Prefect records a flow's parameters):
    that is handed over by the environment, as ``--set llm.api_key=…`` is."""
    import os

    rest = dict(settings or {})
    if "llm.api_key" in rest:
        os.environ["STRATA_LLM__API_KEY"] = str(rest.pop("llm.api_key"))
    return _nested(rest)


def write(
    flow: str, corpus: str | Path, index: str, config: str | Path | None, overrides: dict[str, Any], *args: Any
) -> RunResult:
    """Check the config (``overrides``: nested settings) and the corpus, then run the writing flow ``flow`` of
    ``flows.index_flow`` (a local run's child process starts loading the extractor while this one imports the flow)."""
    from flows.pipeline import prewarm_child, release_prewarmed
    from tasks.methods.registry import get_method

    cfg = load_config(config, overrides)
    get_method(cfg.index.method)  # fail fast on a bad config, before Prefect starts
    check_corpus(Path(corpus))
    started = time.perf_counter()
    if not cfg.dask.address:
        prewarm_child(cfg)
    try:
        import flows.index_flow as index_flows  # Prefect: ~1 s of imports, beside the child's

        result = index_flows.run_flow(flow, str(corpus), str(index), str(config) if config else None, overrides, *args)
    finally:
        release_prewarmed()
    return RunResult.of(result, time.perf_counter() - started)


def check_corpus(corpus: Path) -> None:
    """A corpus that is not there, or a folder with no file to read, fails before Prefect starts."""
    from tasks.index.ingest import corpus_files

    if not corpus.exists():
        raise NotFoundError(f"corpus not found: {corpus}")
    if corpus.is_dir() and next(corpus_files(corpus), None) is None:
        raise NotFoundError(f"no documents under {corpus}: the folder holds no files (.txt, .md, .jsonl or .parquet)")


def build(
    corpus: str | Path,
    index: str,
    config: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    lock_timeout: float = 0.0,
) -> RunResult:
    """A full build of ``index`` (a folder or an object-store URI, created if missing) from ``corpus``: one snapshot."""
    return write("index_flow", corpus, index, config, _overrides(settings), lock_timeout)


def update(
    corpus: str | Path,
    index: str,
    config: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    lock_timeout: float = 0.0,
    full: bool = False,
    replace_root: str | None = None,
) -> RunResult:
    """The documents of ``corpus`` that are new, changed or gone since the published snapshot, applied as one new
    snapshot (status "nothing-to-do" and no snapshot when nothing changed); ``full`` rebuilds everything."""
    return write("refresh_flow", corpus, index, config, _overrides(settings), lock_timeout, full, replace_root)


def estimate(
    corpus: str | Path,
    index: str,
    config: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    kind: str = "update",
    replace_root: str | None = None,
) -> dict[str, Any]:
    """What a ``kind`` ("build" or "update") run would spend on LLM calls, per stage, without calling a model or
    writing the index (``strata index|update --estimate --json``)."""
    from flows.estimate import estimate_run

    if kind not in ("build", "update"):
        raise ValueError(f"kind is 'build' or 'update', not {kind!r}")
    check_corpus(Path(corpus))
    return estimate_run(str(corpus), index, settings_of(config, settings), kind == "build", replace_root)


class Index:
    """An index open for questions at its latest snapshot (or ``as_of`` one): the embedding model loaded once, the
    snapshot's view kept; ``refresh()`` moves to a newer snapshot."""

    def __init__(self, reader: Any):
        self._reader = reader

    @property
    def version(self) -> int:
        return int(self._reader.view.version)

    @property
    def modes(self) -> tuple[str, ...]:
        """The retrieval modes this index's method offers (the first is its default)."""
        return tuple(self._reader.modes)

    def refresh(self) -> bool:
        """Move to the newest published snapshot; True when it changed."""
        return bool(self._reader.refresh())

    def query(self, question: str, mode: str | None = None, budget: int | None = None) -> QueryResult:
        """Retrieve a context of at most ``budget`` tokens (default ``retrieval.token_budget``) in ``mode`` (default
        the method's) and answer from it."""

        if not question.strip():
            raise UsageError("the question is empty")
        ctx, answer, ms = self._reader.ask(question, mode, budget)
        return QueryResult(
            question=question,
            mode=ctx.mode,
            version=ctx.version,
            answer=answer.get("text") or "",
            answer_kind=answer.get("kind", "extractive"),
            sources=list(ctx.chunks),
            entities=list(ctx.entities),
            communities=list(ctx.communities),
            bridge=list(ctx.bridge),
            context=ctx.text(),
            tokens=dict(ctx.tokens),
            retrieval_ms=round(ms, 1),
            message=ctx.message,
        )

    def table(self, name: str, columns: list[str] | None = None) -> Any:
        """One table of the snapshot read (``documents``, ``chunks``, ``entities``, ``relations``, ``communities``,
        ``community_reports``, ...) as a pyarrow Table; ``polars.from_arrow`` makes it a frame."""
        reader = self._reader
        return reader.catalog.read(name, snap=reader.view.snap, columns=columns)


def open_index(
    index: str,
    config: str | Path | None = None,
    settings: Mapping[str, Any] | None = None,
    as_of: int | None = None,
) -> Index:
    """The index at ``index`` (never created: a missing one raises ``IndexNotFound``), ready for questions."""
    from tasks.query.reader import open_reader

    return Index(open_reader(index, settings_of(config, settings), as_of, alone=True))
