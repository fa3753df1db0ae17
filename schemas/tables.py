"""Arrow schemas of every Strata table (DESIGN §6).

Every content table has a deterministic string ``id`` (a hash of its content key) and the
index ``version`` it was written in. Vector columns are fixed-size float32 lists whose
dimension comes from the embedding model.
"""

from __future__ import annotations

from datetime import datetime
from typing import NotRequired, TypedDict

import pyarrow as pa

STR_LIST = pa.list_(pa.string())


def vector_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


def documents_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("uri", pa.string()),
            ("root", pa.string()),  # the corpus root this document was ingested from
            ("source_id", pa.string()),  # id inside its source (JSONL/Parquet id, or relative path)
            ("title", pa.string()),
            ("text", pa.string()),
            ("content_hash", pa.string()),
            ("n_tokens", pa.int64()),
            ("ingested_at", pa.timestamp("us", tz="UTC")),
            ("version", pa.int64()),
        ]
    )


def chunks_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("document_id", pa.string()),
            ("chunk_index", pa.int64()),
            ("text", pa.string()),
            ("n_tokens", pa.int64()),
            ("start", pa.int64()),  # character offsets into documents.text
            ("end", pa.int64()),
            ("status", pa.string()),  # extracted | quarantined: every chunk is accounted for
            ("vector", vector_type(dim)),
            ("version", pa.int64()),
        ]
    )


def entities_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("name", pa.string()),
            ("type", pa.string()),
            ("description", pa.string()),
            ("layer", pa.int64()),  # 0 = extracted, >= 1 summary layers
            ("source_chunk_ids", STR_LIST),
            ("degree", pa.int64()),
            ("staleness", pa.float64()),  # summaries: share of members changed since the text was written
            ("vector", vector_type(dim)),
            ("version", pa.int64()),
        ]
    )


def relations_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("source_id", pa.string()),
            ("target_id", pa.string()),
            ("kind", pa.string()),  # extracted | summary_of
            ("description", pa.string()),
            ("weight", pa.float64()),
            ("source_chunk_ids", STR_LIST),
            ("version", pa.int64()),
        ]
    )


def layers_schema() -> pa.Schema:
    return pa.schema(
        [
            ("layer", pa.int64()),  # the layer whose entities were clustered to try layer+1
            ("n_entities", pa.int64()),
            ("n_clusters", pa.int64()),
            ("cluster_sparsity", pa.float64()),
            ("change_rate", pa.float64()),  # null for the first clustering
            ("stopped", pa.bool_()),
            ("stop_reason", pa.string()),
            ("seconds", pa.float64()),
            ("version", pa.int64()),
        ]
    )


def communities_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("level", pa.int64()),
            ("parent_id", pa.string()),
            ("entity_ids", STR_LIST),
            ("size", pa.int64()),
            ("version", pa.int64()),
        ]
    )


def community_reports_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("community_id", pa.string()),
            ("level", pa.int64()),
            ("title", pa.string()),
            ("summary", pa.string()),
            ("rating", pa.float64()),
            ("findings", STR_LIST),
            ("full_text", pa.string()),
            ("staleness", pa.float64()),  # share of members added since the report was written
            ("vector", vector_type(dim)),
            ("version", pa.int64()),
        ]
    )


def runs_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("flow", pa.string()),
            ("parameters", pa.string()),  # JSON
            ("started_at", pa.timestamp("us", tz="UTC")),
            ("ended_at", pa.timestamp("us", tz="UTC")),
            ("status", pa.string()),  # running | published | failed | nothing-to-do
            ("stage_counts", pa.string()),  # JSON {stage: {count, seconds}}
            ("llm_calls", pa.int64()),
            ("llm_tokens", pa.int64()),
            ("llm_cost_usd", pa.float64()),
            ("error", pa.string()),
            ("snapshot_version", pa.int64()),
            ("code_version", pa.string()),
            ("deployment", pa.string()),  # Prefect deployment that started the run, if any
            ("input_digest", pa.string()),  # sha256 over the sorted content hashes of the input documents
            ("n_inputs", pa.int64()),
            ("version", pa.int64()),
        ]
    )


def mentions_schema() -> pa.Schema:
    """Raw extraction output per chunk, kept so layer 0 can be recomputed exactly when chunks go away."""
    return pa.schema(
        [
            ("id", pa.string()),
            ("chunk_id", pa.string()),
            ("seq", pa.int64()),  # position in the chunk's extraction output
            ("kind", pa.string()),  # entity | relation
            ("key", pa.string()),  # normalised name, or "a|b" normalised endpoint pair
            ("name", pa.string()),  # entity surface form, or relation source
            ("target", pa.string()),  # relation target
            ("type", pa.string()),
            ("description", pa.string()),
            ("weight", pa.float64()),
            ("version", pa.int64()),
        ]
    )


def quarantine_schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("item", pa.string()),  # uri or chunk id
            ("stage", pa.string()),
            ("error", pa.string()),
            ("version", pa.int64()),
        ]
    )


# ---------------------------------------------------------------------------- typed rows
# What stages pass each other: one row type per table (vectors travel apart, as matrices aligned with
# the rows, and ``version`` is added when a table is written).


class DocumentRow(TypedDict):
    id: str
    uri: str
    root: str
    source_id: str
    title: str
    text: str
    content_hash: str
    n_tokens: int
    ingested_at: datetime


class ChunkRow(TypedDict):
    id: str
    document_id: str
    chunk_index: int
    text: str
    n_tokens: int
    start: int
    end: int
    status: NotRequired[str]  # set by extraction: extracted | quarantined


class EntityRow(TypedDict):
    id: str
    name: str
    type: str
    description: str
    layer: int
    source_chunk_ids: list[str]
    degree: int
    staleness: NotRequired[float]


class RelationRow(TypedDict):
    id: str
    source_id: str
    target_id: str
    kind: str
    description: str
    weight: float
    source_chunk_ids: list[str]


class LayerRow(TypedDict):
    layer: int
    n_entities: int
    n_clusters: int
    cluster_sparsity: float | None
    change_rate: float | None
    stopped: bool
    stop_reason: str | None
    seconds: float


class CommunityRow(TypedDict):
    id: str
    level: int
    parent_id: str | None
    entity_ids: list[str]
    size: int


class ReportRow(TypedDict):
    id: str
    community_id: str
    level: int
    title: str
    summary: str
    rating: float
    findings: list[str]
    full_text: str
    staleness: NotRequired[float]


class MentionRow(TypedDict):
    id: str
    chunk_id: str
    seq: int
    kind: str
    key: str
    name: str
    target: str | None
    type: str | None
    description: str
    weight: float | None


class QuarantineRow(TypedDict):
    id: str
    item: str
    stage: str
    error: str


#: Tables pinned by a snapshot, in publish order.
SNAPSHOT_TABLES = (
    "documents",
    "chunks",
    "entities",
    "relations",
    "layers",
    "communities",
    "community_reports",
    "mentions",
    "quarantine",
)
#: Append-only log, not pinned: every run is recorded whether or not it published.
LOG_TABLES = ("runs",)
ALL_TABLES = SNAPSHOT_TABLES + LOG_TABLES


def schema_for(table: str, dim: int) -> pa.Schema:
    builders = {
        "documents": documents_schema,
        "chunks": lambda: chunks_schema(dim),
        "entities": lambda: entities_schema(dim),
        "relations": relations_schema,
        "layers": layers_schema,
        "communities": communities_schema,
        "community_reports": lambda: community_reports_schema(dim),
        "runs": runs_schema,
        "mentions": mentions_schema,
        "quarantine": quarantine_schema,
    }
    if table not in builders:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(ALL_TABLES)}")
    return builders[table]()
