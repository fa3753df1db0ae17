"""Index methods: what builds the hierarchy above layer 0, and which retrieval modes it offers.

The shared stages (ingest, chunk, extract, merge, embed, validate, publish, the incremental diff)
produce layer 0 and never ask which method runs. A method gets layer 0 and the run's ``MethodContext``
and returns a ``Hierarchy``: summary nodes with their vectors, their relations, the communities and
their reports (with vectors), and the layer statistics. ``index.method`` picks it by name.

To add one: implement ``IndexMethod`` (``build``, ``update``, ``modes``, ``levels``) in a module of
this package and register it in ``all_methods``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from schemas.tables import CommunityRow, EntityRow, LayerRow, QuarantineRow, RelationRow, ReportRow

if TYPE_CHECKING:
    from schemas.config import StrataConfig
    from tasks.stages import Stage


@dataclass
class Layer0:
    """The extracted graph after merge and embed: what every method builds on."""

    entities: list[EntityRow]
    vectors: np.ndarray  # aligned with ``entities``
    relations: pa.Table  # the ``relations`` schema (``catalog.relation_table``): they outnumber all other rows
    added: set[str] = field(default_factory=set)  # update: ids new since the previous snapshot
    removed: set[str] = field(default_factory=set)  # update: ids gone
    changed: set[str] = field(default_factory=set)  # update: ids whose name, type or description changed
    gone_chunks: set[str] = field(default_factory=set)  # update: chunk ids deleted or replaced
    chunks: list[dict[str, Any]] = field(default_factory=list)  # this run's new chunks (a build: all of them)
    chunk_vectors: np.ndarray | None = None  # aligned with ``chunks``


@dataclass
class Hierarchy:
    """What a method adds above layer 0."""

    entities: list[EntityRow]  # summary nodes (layer >= 1)
    vectors: np.ndarray  # aligned with ``entities``
    relations: pa.Table | list[RelationRow]  # summary_of links and any other method edges (``relation_table``)
    communities: list[CommunityRow]
    reports: list[ReportRow]
    report_vectors: np.ndarray  # aligned with ``reports``
    layers: list[LayerRow] | None  # None: the previous snapshot's layer statistics still hold
    quarantine: list[QuarantineRow] = field(default_factory=list)  # LLM output that fell back to offline


class MethodContext(Protocol):
    """What the pipeline hands a method: settings, named stages, the embedder, the LLM, the previous snapshot."""

    cfg: StrataConfig
    llm: Any  # LiteLLMClient or None (offline)

    def stage(self, name: str, total: int | None = None) -> AbstractContextManager[Stage]: ...
    def embed(self, texts: list[str], progress: Callable[[int], None] | None = None) -> np.ndarray: ...
    def previous(self, name: str, columns: tuple[str, ...] | None = None, where: str | None = None) -> pa.Table: ...


class IndexMethod(Protocol):
    name: str
    #: retrieval modes it offers besides the shared ppr, hybrid and naive: mode -> the context sections it
    #: adds to the graph-ranked sources (entities, communities, bridge)
    modes: dict[str, tuple[str, ...]]

    def build(self, ctx: MethodContext, layer0: Layer0) -> Hierarchy: ...
    def update(self, ctx: MethodContext, layer0: Layer0) -> Hierarchy: ...
    def levels(self, view: Any, ctx: Any, scores: np.ndarray, budgets: dict[str, int], cfg: Any) -> None:
        """Fill the context's method sections for one question (``scores``: similarity of every entity)."""


def all_methods() -> list[IndexMethod]:
    from tasks.methods.archrag import ArchRAG
    from tasks.methods.hirag import HiRAG
    from tasks.methods.hygrag import HyGRAG

    return [HiRAG(), HyGRAG(), ArchRAG()]


#: sources-only modes every index offers, and how each ranks its sources; a method's own modes rank by ppr
SHARED_MODES = {"ppr": "ppr", "hybrid": "hybrid", "naive": "dense"}


def index_modes(method: str) -> tuple[str, ...]:
    """The retrieval modes an index built by ``method`` offers: its own, then the shared ones."""
    return (*get_method(method).modes, *SHARED_MODES)


def modes_help() -> str:
    """Which index offers which mode, for ``--help`` texts: derived from the registered methods."""
    own = "; ".join(f"{m.name} indexes: {' | '.join(m.modes)}" for m in all_methods())
    return f"{own}; any index: {' | '.join(SHARED_MODES)} (graph-ranked, BM25 + dense, dense sources only)"


def get_method(name: str) -> IndexMethod:
    methods = {m.name: m for m in all_methods()}
    if name not in methods:
        raise ValueError(f"unknown index.method {name!r}; choose one of {', '.join(methods)}")
    return methods[name]


#: every retrieval mode of every registered method, then the shared ones
MODES = tuple(dict.fromkeys([*(mode for method in all_methods() for mode in method.modes), *SHARED_MODES]))
