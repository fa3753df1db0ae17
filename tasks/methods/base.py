"""What an index method is: the shared stages hand it layer 0 (``Layer0``) and the run (``MethodContext``); it
returns what it built above layer 0 (``Hierarchy``), and answers one question's method sections (``levels``).

The shared stages (ingest, chunk, extract, merge, embed, validate, publish, the incremental diff) produce layer 0
and never ask which method runs. To add a method, implement ``IndexMethod`` and ``register`` it
(``tasks.methods.registry``): the config's method names, ``--mode`` help, validation's relation kinds, the
answer step and ``strata inspect`` all read the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import pyarrow as pa

from schemas.tables import (
    ChunkRow,
    CommunityRow,
    EntityRow,
    LayerRow,
    QuarantineRow,
    RelationRow,
    ReportRow,
    schema_for,
)
from tasks.errors import TooLargeForTask
from tasks.store.rows import plain_rows, vector_matrix

#: an entity row's fields (``EntityRow``): its table's columns but the vector and the version
ENTITY_FIELDS = tuple(n for n in schema_for("entities", 0).names if n not in ("vector", "version"))

if TYPE_CHECKING:
    from schemas.config import RetrievalConfig, StrataConfig
    from schemas.llm import Stage as LLMStage
    from tasks.retrieval.context import Context
    from tasks.retrieval.view import IndexView
    from tasks.runtime.llm import LLMClient
    from tasks.runtime.llm_client import Usage
    from tasks.runtime.parallel import Mapper
    from tasks.runtime.stages import Stage
    from tasks.store.catalog import Catalog
    from tasks.store.rows import TableDelta
    from tasks.store.spill import SpilledTable


@dataclass
class Layer0:
    """The extracted graph after merge and embed, what every method builds on: what a build's (``BuildLayer0``) and
    an update's (``UpdateLayer0``) share."""

    entities: list[EntityRow]
    vectors: np.ndarray  # aligned with ``entities``
    # the ``relations`` schema (``tasks.store.rows.relation_table``): they outnumber all other rows, and a build's
    # stay in the parts merge wrote (a ``SpilledTable``, read on the workers: ``tasks.methods.graph_parts``)
    relations: pa.Table | SpilledTable
    # this run's new chunks (a build: all of them) with their vectors, in the parts embed wrote (``chunk_rows``)
    chunks: SpilledTable | None = None

    def count(self) -> int:
        return len(self.entities)

    def chunk_rows(self) -> tuple[list[ChunkRow], np.ndarray]:
        """This run's new chunks as rows and their vector matrix, read whole (for a method that needs them all)."""
        table = self.chunks.read_all() if self.chunks is not None else None
        if table is None or not table.num_rows:
            return [], np.zeros((0, 0), np.float32)
        return cast("list[ChunkRow]", plain_rows(table)), vector_matrix(table)


@dataclass
class BuildLayer0(Layer0):
    """A build's layer 0: every entity is new. Its entities stay in the parts merge wrote (``entity_parts``, key
    order; embed adds their vectors): ``entities`` and ``vectors`` are then empty, and a method that needs them all
    in this process reads them (``whole``). Its relations and ``merge_state`` (``state``) stay in parts too."""

    entity_parts: SpilledTable | None = None
    state: SpilledTable | None = None

    def count(self) -> int:
        return self.entity_parts.num_rows if self.entity_parts is not None else len(self.entities)

    def whole(self) -> BuildLayer0:
        """This layer 0 with its entity rows and vectors in memory (``entities``, ``vectors`` aligned with them): for
        a method that clusters them in this process rather than as tasks over the parts."""
        if self.entity_parts is None:
            return self
        table = self.entity_parts.read_all()
        return replace(
            self,
            entities=cast("list[EntityRow]", plain_rows(table)),
            vectors=vector_matrix(table),
            entity_parts=None,
        )


@dataclass(kw_only=True)
class UpdateLayer0(Layer0):
    """An update's layer 0: what changed against the snapshot it updates. ``entities`` holds only the rows it writes
    (recomputed, or a new degree), ``kept`` the ids of the others (the snapshot's rows: ``rows_of``); ``vectors`` is
    empty and ``fresh`` holds the vectors this run embedded (added and changed), the others read by id
    (``vectors_of``; 176 MB for all of them at 100k chunks); ``relations`` is empty and ``relation_change`` holds the
    extracted relations recomputed (the ids of the previous rows that went or were recomputed, the recomputed rows
    with every column): the rest of the graph is the snapshot's (``tasks.methods.common.update_graph``)."""

    relation_change: TableDelta
    relation_count: int  # the relations layer 0 holds after the update
    added: set[str] = field(default_factory=set)  # ids new since the previous snapshot
    removed: set[str] = field(default_factory=set)  # ids gone
    changed: set[str] = field(default_factory=set)  # ids whose name, type or description changed
    gone_chunks: set[str] = field(default_factory=set)  # chunk ids deleted or replaced
    state: TableDelta | None = None  # ``merge_state``'s change (None: the snapshot it updates has none)
    fresh: dict[str, np.ndarray] | None = None
    kept: set[str] = field(default_factory=set)

    def count(self) -> int:
        return len(self.entities) + len(self.kept)

    def ids(self) -> set[str]:
        """Every layer-0 entity's id: those it writes and those it keeps."""
        return {e["id"] for e in self.entities} | self.kept

    def layer_of(self, summaries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Every entity id after the update, with its layer: layer 0's ids, then the ``summaries``'."""
        return {**dict.fromkeys(sorted(self.ids()), 0), **{s["id"]: s["layer"] for s in summaries}}

    def rows_of(self, ctx: MethodContext, ids: Iterable[str]) -> list[EntityRow]:
        """Layer-0 entities ``ids``' rows (of those that are live), in id order: this run's, or the snapshot's for
        the ones it keeps."""
        wanted, mine = set(ids), {e["id"]: e for e in self.entities}
        stored = sorted(i for i in wanted & self.kept if i not in mine)
        rows: list[Any] = [mine[i] for i in wanted if i in mine]
        rows += plain_rows(ctx.previous_in("entities", "id", stored, ENTITY_FIELDS))
        return cast("list[EntityRow]", sorted(rows, key=lambda e: e["id"]))

    def vectors_of(self, ctx: MethodContext, ids: list[str]) -> np.ndarray:
        """The vectors of layer-0 entities ``ids``, in order: this run's (``fresh``), or the snapshot's (an entity
        whose text did not change keeps its vector), read for those ids only."""
        fresh = self.fresh or {}
        stored = ctx.previous_in("entities", "id", [i for i in ids if i not in fresh], ("id", "vector"))
        kept = dict(zip(stored.column("id").to_pylist(), vector_matrix(stored)))
        if missing := [i for i in ids if i not in fresh and i not in kept]:
            raise ValueError(f"entities: {len(missing)} kept layer-0 entities have no vector in the snapshot")
        dim = stored.schema.field("vector").type.list_size
        return np.stack([fresh[i] if i in fresh else kept[i] for i in ids]) if ids else np.zeros((0, dim), np.float32)

    def whole(self, ctx: MethodContext) -> UpdateLayer0:
        """This layer 0 with every entity's row and vector in memory (``entities``, ``vectors`` aligned with them):
        for a method that reads them all rather than by id (``ctx`` reads the snapshot's)."""
        if self.fresh is None:
            return self
        rows = self.rows_of(ctx, self.ids())
        return replace(
            self, entities=rows, vectors=self.vectors_of(ctx, [e["id"] for e in rows]), fresh=None, kept=set()
        )


@dataclass
class Hierarchy:
    """What a method adds above layer 0."""

    entities: list[EntityRow]  # summary nodes (layer >= 1)
    vectors: np.ndarray  # aligned with ``entities``
    # summary_of links and any other method edges (``relation_table``; spilled: a build's, ``graph_parts``)
    relations: pa.Table | list[RelationRow] | SpilledTable
    communities: list[CommunityRow] | SpilledTable  # spilled: a build's, made on the cluster (``graph_parts``)
    reports: list[ReportRow] | SpilledTable  # spilled: the ``community_reports`` rows with their vectors
    report_vectors: np.ndarray  # aligned with ``reports`` (none when they are spilled)
    layers: list[LayerRow] | None  # None: the previous snapshot's layer statistics still hold
    quarantine: list[QuarantineRow] = field(default_factory=list)  # LLM output that fell back to offline
    #: layer 0's relations and ``relations`` as the one table the method already built them into (``with_above``)
    graph_relations: pa.Table | None = None


class MethodContext(Protocol):
    """What the pipeline hands a method: settings, named stages, the embedder, the LLM, the previous snapshot."""

    cfg: StrataConfig
    mapper: Mapper  # where tasks run: the run's Dask cluster
    version: int  # the snapshot the run writes
    usage: Usage  # the run's LLM usage: a task's own client adds its share
    catalog: Catalog  # the index (its ``cache_dir`` holds the LLM response cache)

    @property
    def spill_dir(self) -> str:  # the run's work folder (a path or a URI), which every worker reaches
        ...

    def stage(self, name: str, total: int | None = None) -> AbstractContextManager[Stage]: ...
    def llm_for(self, stage: LLMStage) -> LLMClient | None:  # the stage's client in this process, or None (offline)
        ...
    def cap_for(self, stage: LLMStage) -> tuple[str, float] | None:  # what the stage's tasks may spend (USD), named
        ...
    def embed(self, texts: list[str], progress: Callable[[int], None] | None = None) -> np.ndarray: ...
    def previous(self, name: str, columns: tuple[str, ...] | None = None, where: str | None = None) -> pa.Table: ...
    def previous_in(
        self,
        name: str,
        column: str,
        values: list[str],
        columns: tuple[str, ...] | None = None,
        also: str | None = None,
    ) -> pa.Table: ...


#: the share of a process's memory one task, or a build handed layer 0 whole, is planned to take (a Dask worker
#: pauses at 80 % and restarts at 95 %; in the run's process the rest is the interpreter and what it holds)
TASK_MEMORY_SHARE = 0.8


class IndexMethod(Protocol):
    name: str
    #: retrieval modes it offers besides the shared ppr, hybrid and naive: mode -> the context sections it
    #: adds to the graph-ranked sources (entities, communities, bridge)
    modes: dict[str, tuple[str, ...]]
    #: relation kinds it writes besides ``extracted`` and ``summary_of`` (validation accepts them; ``strata
    #: inspect`` counts them per layer)
    relation_kinds: tuple[str, ...]
    #: a build reads layer 0 in parts (``BuildLayer0.entity_parts``); False: the pipeline hands it whole
    reads_parts: bool
    #: an update reads only the layer-0 vectors it needs (``UpdateLayer0.vectors_of``); False: handed every vector
    vectors_by_id: bool
    #: a method handed layer 0 whole (not ``reads_parts``): the memory its build takes in the run's process per
    #: layer-0 entity (its relations and vectors with it), in bytes, measured (docs/benchmarks.md); checked before
    #: the build starts (``check_whole_memory``); 0: not stated, not checked
    whole_bytes_per_entity: int

    def build(self, ctx: MethodContext, layer0: BuildLayer0) -> Hierarchy:
        """Everything above a build's layer 0: its rows and vectors in ``entities`` and ``vectors``, or, for a
        method that ``reads_parts`` (HiRAG), only in ``entity_parts``, which tasks read."""

    def update(self, ctx: MethodContext, layer0: UpdateLayer0) -> Hierarchy:
        """Everything above an update's layer 0: its rows in ``entities`` and their vectors in ``vectors``, or, for
        a method with ``vectors_by_id`` (the built-in ones), only those this run embedded (``fresh``),
        the others read for the ids it needs (``UpdateLayer0.vectors_of``)."""

    def levels(
        self, view: IndexView, ctx: Context, scores: np.ndarray, budgets: dict[str, int], cfg: RetrievalConfig
    ) -> None:
        """Fill the context's method sections for one question (``scores``: similarity of every entity)."""

    def refine(self, ctx: Context, client: LLMClient) -> Context:
        """What the answer step reads of a context of this method's modes, given an LLM (identity: all of it)."""


def fits_memory(need: int, room: int) -> bool:
    """Whether ``need`` bytes are at most ``TASK_MEMORY_SHARE`` of ``room``: what ``check_memory`` lets start."""
    return need <= TASK_MEMORY_SHARE * room


def check_memory(need: int, room: int, what: str, where: str, remedy: str) -> None:
    """Refuse, before it starts, a step that runs as one task (or in the run's process) and would need ``need``
    bytes, more than ``TASK_MEMORY_SHARE`` of ``room`` (``where``: the process's memory, in bytes): a clear error
    saying ``what`` needs it and the ``remedy``, not a process killed for memory hours in."""
    if not fits_memory(need, room):
        raise TooLargeForTask(
            f"{what} need about {need / 2**30:.1f} GB, more than {TASK_MEMORY_SHARE:.0%} of the "
            f"{room / 2**30:.1f} GB {where}. {remedy}"
        )


def check_whole_memory(method: IndexMethod, entities: int, room: int) -> None:
    """Refuse, before its build starts, a method handed layer 0 whole whose ``entities`` would not fit in the run's
    machine (``room`` bytes, ``check_memory``)."""
    check_memory(
        entities * method.whole_bytes_per_entity,
        room,
        f"the {method.name} method builds its hierarchy over the whole of layer 0 in the run's process: its "
        f"{entities:,} entities",
        "this machine has",
        'Run it on a machine with more memory, or build with the hirag method (index.method = "hirag"), whose '
        "hierarchy runs as tasks over parts of layer 0.",
    )
