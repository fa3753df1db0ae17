"""One run of the pipeline: what it applies (``Delta``), its state and services (``PipelineRun``, also the
``MethodContext`` an index method receives) and its record in the ``runs`` table (``recorded_run``).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa

from flows.lineage import BuildResult, code_version, deployment_name
from schemas.config import StrataConfig
from schemas.llm import LLM_STAGES, Stage
from schemas.tables import DocumentRow, LayerRow, QuarantineRow, schema_for
from tasks.index import embed as embedding
from tasks.index import merge as merging
from tasks.index.embed import (
    LOCAL_MODEL,
    CachedEmbedder,
    ChildEmbedder,
    EmbeddingCache,
    LocalEmbedder,
    MappedEmbedder,
    check_dimension,
)
from tasks.methods.registry import get_method
from tasks.runtime.llm_client import LiteLLMClient, Usage
from tasks.runtime.llm_cost import CostCap
from tasks.runtime.parallel import DaskPool, Mapper, ProcessMapper
from tasks.runtime.progress import reporter
from tasks.runtime.stages import Stages, TaskRunner, direct_task
from tasks.store import workfs
from tasks.store.catalog import Catalog
from tasks.store.ids import make_id
from tasks.store.rows import ONE_AHEAD, as_declared, plain_rows, snapshot_note
from tasks.store.spill import SpilledTable


# ---------------------------------------------------------------------------- the run
class DocumentPlace(TypedDict):
    """What later stages read of a document once it is chunked (``flows.steps.document_place``)."""

    id: str
    source_id: str
    title: str | None


@dataclass
class Delta:
    """What a run applies: for a build every document is incoming; for an update, the diff."""

    root: str
    incoming: list[DocumentRow] | list[DocumentPlace]  # documents to chunk and extract (new and changed)
    kept: list[DocumentRow] | list[DocumentPlace] = field(default_factory=list)  # previous documents that stay
    gone: set[str] = field(default_factory=set)  # previous document ids deleted or replaced
    gone_chunks: set[str] = field(default_factory=set)  # their chunk ids
    counts: dict[str, int] = field(default_factory=dict)
    digest: str = ""
    n_inputs: int = 0
    ingested: SpilledTable | None = None  # the corpus's documents as ingest wrote them (``flows.steps.ingest``)

    @property
    def empty(self) -> bool:
        return not self.incoming and not self.gone


#: the stages that embed; a stage not among them ends the embedding model's child process, if one runs
EMBEDDING_STAGES = frozenset({"embed", "hierarchy", "attach", "reports"})


class PipelineRun:
    """One run's state and services; it is also the ``MethodContext`` an index method receives."""

    def __init__(
        self,
        corpus: str,
        catalog: Catalog,
        cfg: StrataConfig,
        stages: Stages,
        mapper: Mapper,
        run_id: str,
        version: int,
        snap: dict[str, Any] | None,
        usage: Usage,
    ):
        self.corpus, self.catalog, self.cfg, self.stages, self.mapper = corpus, catalog, cfg, stages, mapper
        self.run_id, self.version, self.snap, self.usage = run_id, version, snap, usage
        self.method = get_method(cfg.index.method)
        #: the run's cost cap in this process (``llm.max_cost_usd``); tasks elsewhere get their share (``cap_for``)
        self.cap = CostCap(cfg.llm.max_cost_usd) if cfg.llm.max_cost_usd is not None else None
        self._llms: dict[str, LiteLLMClient | None] = {}
        self.quarantine: list[QuarantineRow] = []
        self.location = str(Path(corpus).expanduser().resolve())
        self.root = self.location  # the corpus root the documents belong to (see corpus_root)
        self._embedder = None
        #: a small run's child (it extracts with spaCy and validates), once the run is known small (``choose_mapper``)
        self.small_child: ProcessMapper | None = None
        self._previous: dict[tuple[str, tuple[str, ...] | None, str | None], pa.Table] = {}
        workfs.use_storage(cfg.storage)  # the work folder of an index on object storage, as the catalog reaches it

    @property
    def work_root(self) -> str:
        """Where runs keep their work folders (``dask.work``): the index's cache, or under an object-store index's
        URI (``<index>/_work``) that every worker reaches. One writer at a time: what is there is a killed run's."""
        work = self.cfg.dask.work
        if self.catalog.root is None and (work == "index" or (work == "auto" and self.cfg.dask.address)):
            return workfs.join(self.catalog.uri, "_work")
        return str(self.catalog.cache_dir / "spill")

    @property
    def spill_dir(self) -> str:
        """The run's work folder: tables too large for memory until publish, the parts its tasks write and read (a
        path or a URI; removed when the run ends)."""
        return workfs.join(self.work_root, self.run_id)

    @contextlib.contextmanager
    def stage(self, name: str, total: int | None = None):
        """The stage ``name`` (``Stages``), its LLM calls, tokens and cost in its record (``runs.stage_counts``)."""
        # Leiden, validation, publish: not beside the embedding model's process (an update's communities stage only
        # places its new entities, and its reports embed again right after: the child stays)
        if name not in EMBEDDING_STAGES and not (self.snap and name == "communities"):
            self.release_embedder()
        before = self.spent()
        if self.cap is not None:  # what tasks elsewhere spent is known once their stage ended: this process's
            self.cap.spent = before.cost_usd  # share of the cap is what is left of it
        with self.stages(name, total) as st:
            yield st
            after = self.spent()
            if after.calls > before.calls or after.cache_hits > before.cache_hits:
                st.counts.update(
                    llm_calls=after.calls - before.calls,
                    llm_cache_hits=after.cache_hits - before.cache_hits,
                    llm_tokens=after.tokens - before.tokens,
                    llm_prompt_tokens=after.prompt_tokens - before.prompt_tokens,
                    llm_completion_tokens=after.completion_tokens - before.completion_tokens,
                    llm_cost_usd=round(after.cost_usd - before.cost_usd, 6),
                )

    def llm_for(self, stage: Stage) -> LiteLLMClient | None:
        """The client of ``stage``'s model in this process (``llm.<stage>``: one client a stage, made on first use,
        under the run's cost cap), or None where the stage runs offline."""
        if stage not in self._llms:
            cfg = self.cfg.llm.stage(stage)
            self._llms[stage] = LiteLLMClient(cfg, self.catalog.cache_dir, cap=self.cap) if cfg else None
        return self._llms[stage]

    def llm_clients(self) -> list[LiteLLMClient]:
        """The LLM clients of this process: each stage's and, for a litellm embedding model, the embedder's."""
        embedder = getattr(self._embedder.inner, "client", None) if self._embedder is not None else None
        return [c for c in (*(self._llms.get(s) for s in LLM_STAGES), embedder) if c is not None]

    def spent(self) -> Usage:
        """The run's LLM usage so far: what its tasks reported and what this process's clients made."""
        total = Usage()
        total.add(self.usage)
        for client in self.llm_clients():
            total.add(client.usage)
        return total

    def cap_for(self, stage: Stage) -> tuple[str, float] | None:
        """What tasks of ``stage`` in other processes may spend of the cost cap, named for the run's stage: what the
        run has not spent yet (each worker takes its share, ``llm_client.shared_cap``); None without a cap."""
        if self.cap is None:
            return None
        return f"{self.run_id}:{stage}", max(0.0, self.cap.limit - self.spent().cost_usd)

    @property
    def note(self) -> dict[str, Any]:
        """The previous snapshot's note (drift, root locations, method), empty for a build."""
        return snapshot_note(self.snap)

    def open_embedder(self):
        """The run's embedder, cached by text hash; an update checks it gives the index's vector dimension."""

        if self._embedder is None:
            inner = embedding.get_embedder(self.cfg.embedding, self.cfg.llm)
            if self.cfg.dask.address and self.cfg.embedding.model == LOCAL_MODEL and isinstance(self.mapper, DaskPool):
                inner = MappedEmbedder(inner, self.cfg.embedding, self.mapper)  # on the cluster's workers
            elif isinstance(inner, LocalEmbedder):
                inner = ChildEmbedder(inner, self.cfg.embedding)  # a large run's model in a child process
                if self.snap:  # an update holds the index's tables as its build did: the model goes where it went
                    inner.hold_like(self.catalog.open_table("chunks", snap=self.snap).count_rows())
            if getattr(inner, "client", None) is not None:  # a litellm embedding model: under the run's cap too
                inner.client.cap = self.cap
            self._embedder = CachedEmbedder(inner, EmbeddingCache(self.catalog.cache_dir / "embeddings.sqlite"))
            if self.snap:
                check_dimension(self._embedder, self.snap["dim"])
        return self._embedder

    @property
    def embedder(self):
        return self.open_embedder()

    def embed(self, texts: list[str], progress=None) -> np.ndarray:
        return self.embedder.embed(texts, progress)

    def release_embedder(self) -> None:
        """End the embedding model's child process, if one runs (a later embed starts it again)."""
        if self._embedder is not None and hasattr(self._embedder.inner, "release"):
            self._embedder.inner.release()

    def previous(self, name: str, columns: tuple[str, ...] | None = None, where: str | None = None) -> pa.Table:
        """A table of the snapshot this run updates (empty for a build), whole or only ``columns``, all rows or
        those matching the SQL filter ``where``; read once."""
        key = (name, columns, where)
        if key not in self._previous:
            if self.snap:
                table = self.catalog.read(name, snap=self.snap, columns=list(columns) if columns else None, where=where)
            else:
                table = schema_for(name, 0).empty_table()
                table = table.select(list(columns)) if columns else table
            self._previous[key] = table
        return self._previous[key]

    def previous_in(
        self,
        name: str,
        column: str,
        values: list[str],
        columns: tuple[str, ...] | None = None,
        also: str | None = None,
    ) -> pa.Table:
        """``rows_in`` of the snapshot this run updates (empty for a build); not kept."""
        return rows_in(self.catalog, self.snap, name, column, values, columns, also)

    def large(self, more_mentions: int = 0) -> bool:
        """Whether the index is large: its snapshot's mentions and ``more_mentions`` reach ``MERGE_IN_CHILD_ROWS``.
        A large index's extraction and validation run in a child process when no Dask cluster runs them."""

        stored = SnapshotReads(self.catalog, self.snap).rows("mentions") if self.snap else 0
        return stored + more_mentions >= merging.MERGE_IN_CHILD_ROWS

    def forget_previous(self, name: str | None = None) -> None:
        """Drop the previous snapshot's tables read so far, or those of table ``name`` (read again if asked for)."""
        for key in [k for k in self._previous if name in (None, k[0])]:
            del self._previous[key]

    def previous_rows(self, name: str) -> list[dict[str, Any]]:
        return plain_rows(self.previous(name))

    def result(
        self,
        status: str,
        delta: Delta,
        version: int | None = None,
        counts: dict[str, int] | None = None,
        layers: list[LayerRow] | None = None,
        plot: str | None = None,
    ) -> BuildResult:
        return BuildResult(
            run_id=self.run_id,
            version=version if version is not None else (self.snap or {}).get("version"),
            counts=counts or {},
            stages=self.stages.log,
            status=status,
            layers=layers or [],
            layers_plot=plot,
            input_digest=delta.digest,
            n_inputs=delta.n_inputs,
        )


def rows_in(
    catalog: Catalog,
    snap: dict[str, Any] | None,
    name: str,
    column: str,
    values: list[str],
    columns: tuple[str, ...] | None = None,
    also: str | None = None,
) -> pa.Table:
    """The rows of table ``name`` of ``snap`` whose ``column`` (and ``also``, when given) is one of ``values``
    (``columns`` only, or every one), in one pass, the filter pushed down to Lance (it reads ``column`` and takes the
    rows that match: 100k of 2.3M relations at 100k chunks, +76 MB and 0.9 s, where filtering the table's batches here
    held +500 MB)."""
    import pyarrow.compute as pc

    schema = schema_for(name, (snap or {}).get("dim") or 0)
    schema = pa.schema([schema.field(c) for c in columns]) if columns else schema
    if not snap or not values:
        return schema.empty_table()
    dataset = catalog.open_table(name, snap=snap).to_lance()
    among = pa.array(sorted(set(values)), pa.string())
    wanted = pc.field(column).isin(among)
    wanted = wanted & pc.field(also).isin(among) if also else wanted
    stored = [c for c in schema.names if c in dataset.schema.names]  # a column declared since: nulls (``as_declared``)
    read = dataset.scanner(columns=stored, filter=wanted, batch_size=8192, **ONE_AHEAD).to_table()
    return as_declared(read, schema).cast(schema)


class SnapshotReads:
    """What an update's merge reads of the snapshot it updates (``flows.merge_steps.update_layer0``), by table name; it
    pickles as the index's address, so a child process opens the catalog again (``in_child_process``)."""

    def __init__(self, catalog: Catalog, snap: dict[str, Any]):
        self.catalog, self.snap = catalog, snap

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.catalog.uri, "storage": self.catalog._storage, "work": workfs._storage, "snap": self.snap}

    def __setstate__(self, state: dict[str, Any]) -> None:
        workfs.use_storage(state["work"])
        self.catalog, self.snap = Catalog(state["uri"], create=False, storage=state["storage"]), state["snap"]

    def has(self, name: str) -> bool:
        return name in self.snap["tables"]

    def rows(self, name: str) -> int:
        return self.catalog.open_table(name, snap=self.snap).count_rows() if self.has(name) else 0

    def read(self, name: str, columns: tuple[str, ...], where: str | None = None) -> pa.Table:
        return self.catalog.read(name, snap=self.snap, columns=list(columns), where=where)

    def batches(self, name: str, columns: list[str]):
        return self.catalog.batches(name, self.snap, columns)

    def rows_in(self, name: str, column: str, values: list[str], columns: tuple[str, ...] | None = None) -> pa.Table:
        return rows_in(self.catalog, self.snap, name, column, values, columns)


# ---------------------------------------------------------------------------- the run record
@contextlib.contextmanager
def recorded_run(
    catalog: Catalog,
    run_id: str | None,
    flow_name: str,
    corpus: str,
    cfg: StrataConfig,
    version: int,
    task: TaskRunner = direct_task,
):
    """A ``runs`` row for the whole run: 'running' at the start, then its outcome, stage log, usage and lineage.

    Yields (run_id, stages, usage, done); ``done(result)`` records the result and returns it."""

    started = datetime.now(UTC)
    run_id = run_id or make_id("run", started.isoformat(), corpus)
    stages, usage = Stages(reporter(), task), Usage()
    catalog.log_run(
        {
            "id": run_id,
            "flow": flow_name,
            "started_at": started,
            "status": "running",
            "parameters": json.dumps({"corpus": str(corpus), "index": catalog.uri, "config": cfg.fingerprint()}),
            "llm_calls": 0,
            "llm_tokens": 0,
            "llm_cost_usd": 0.0,
            "code_version": code_version(),
            "deployment": deployment_name(),
            "version": version,
        }
    )

    def done(result: BuildResult) -> BuildResult:
        catalog.finish_run(
            run_id,
            {
                "status": result.status,
                "ended_at": datetime.now(UTC),
                "stage_counts": json.dumps(stages.log),
                "snapshot_version": result.version if result.status == "published" else None,
                "input_digest": result.input_digest,
                "n_inputs": result.n_inputs,
                **_usage_columns(usage),
            },
        )
        result.llm = asdict(usage)
        return result

    try:
        yield run_id, stages, usage, done
    except BaseException as exc:
        catalog.finish_run(
            run_id,
            {
                "status": "failed",
                "ended_at": datetime.now(UTC),
                "error": f"{type(exc).__name__}: {exc}"[:4000],
                "stage_counts": json.dumps(stages.log),
                **_usage_columns(usage),
            },
        )
        raise


def _usage_columns(usage: Usage) -> dict[str, Any]:
    return {"llm_calls": usage.calls, "llm_tokens": usage.tokens, "llm_cost_usd": round(usage.cost_usd, 6)}
