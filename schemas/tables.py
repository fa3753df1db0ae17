"""Every Strata table, declared once: a typed row per table, from which its Arrow schema is derived.

Every content table has a deterministic string ``id`` (a hash of its content key) and the
index ``version`` it was written in. Vector columns are fixed-size float32 lists whose
dimension comes from the embedding model.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Annotated, NotRequired, TypedDict, get_args, get_origin, get_type_hints

import pyarrow as pa

#: The Arrow type of each column kind; a table's schema is its row type's fields, in order, with these types.
Str = Annotated[str, pa.string()]
OptStr = Annotated["str | None", pa.string()]
Int = Annotated[int, pa.int64()]
Float = Annotated[float, pa.float64()]
OptFloat = Annotated["float | None", pa.float64()]
Bool = Annotated[bool, pa.bool_()]
Time = Annotated[datetime, pa.timestamp("us", tz="UTC")]
OptTime = Annotated["datetime | None", pa.timestamp("us", tz="UTC")]
StrList = Annotated[list[str], pa.list_(pa.string())]
IntList = Annotated[list[int], pa.list_(pa.int64())]
OptInt = Annotated["int | None", pa.int64()]
Vector = Annotated[list[float], "vector"]  # float32 x the embedding model's dimension (vectors travel as matrices)


def vector_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


# ---------------------------------------------------------------------------- one row type per table
# What stages pass each other, and (field by field, in order) the table's Arrow schema: each table is declared
# here once. ``vector`` travels apart, as a matrix aligned with the rows, and ``version`` is stamped when a table
# is written: both are NotRequired in a row.


class DocumentRow(TypedDict):
    id: Str
    uri: Str
    root: Str  # the corpus root this document was ingested from
    source_id: Str  # id inside its source (JSONL/Parquet id, or relative path)
    title: Str
    text: Str
    content_hash: Str
    n_tokens: Int
    ingested_at: Time
    version: NotRequired[Int]


class ChunkRow(TypedDict):
    id: Str
    document_id: Str
    chunk_index: Int
    text: Str
    n_tokens: Int
    start: Int  # character offsets into documents.text
    end: Int
    status: NotRequired[Str]  # set by extraction: extracted | quarantined (every chunk is accounted for)
    vector: NotRequired[Vector]
    version: NotRequired[Int]


class EntityRow(TypedDict):
    id: Str
    name: Str
    type: Str
    description: Str
    layer: Int  # 0 = extracted, >= 1 summary layers
    source_chunk_ids: StrList
    degree: Int
    # layer 0: the names its mentions were written with that resolved to it within their document (a surname, a
    # first name, a title dropped: ``tasks.index.aliases``), a form each, most frequent first; null in summaries
    aliases: StrList
    staleness: NotRequired[Float]  # summaries: share of members changed since the text was written
    vector: NotRequired[Vector]
    version: NotRequired[Int]


class RelationRow(TypedDict):
    id: Str
    source_id: Str
    target_id: Str
    kind: Str  # extracted | summary_of | a method's own kinds (``tasks.methods.registry.relation_kinds``)
    description: Str
    weight: Float
    source_chunk_ids: StrList
    # what the relation's sentences most often say one end does to the other ("employs", "clerk of"; offline, from
    # the parse: ``tasks.index.statements``), read from the end ``label_from``; null where they only co-occur
    label: OptStr
    label_from: OptStr
    version: NotRequired[Int]


class LayerRow(TypedDict):
    layer: Int  # the layer whose entities were clustered to try layer+1
    n_entities: Int
    n_clusters: Int
    cluster_sparsity: OptFloat
    change_rate: OptFloat  # null for the first clustering
    stopped: Bool
    stop_reason: OptStr
    seconds: Float
    version: NotRequired[Int]


class CommunityRow(TypedDict):
    id: Str
    level: Int
    parent_id: OptStr
    entity_ids: StrList
    size: Int
    version: NotRequired[Int]


class ReportRow(TypedDict):
    id: Str
    community_id: Str
    level: Int
    title: Str
    summary: Str
    rating: Float
    rating_reason: OptStr  # why the rating is what it is (null: written before reasons were kept)
    findings: StrList
    full_text: Str
    staleness: NotRequired[Float]  # share of members added since the report was written
    vector: NotRequired[Vector]
    version: NotRequired[Int]


class RunRow(TypedDict):
    id: Str
    flow: Str
    parameters: Str  # JSON
    started_at: Time
    ended_at: OptTime
    status: Str  # running | published | failed | nothing-to-do
    stage_counts: OptStr  # JSON {stage: {count, seconds}}
    llm_calls: Int
    llm_tokens: Int
    llm_cost_usd: Float
    error: OptStr
    snapshot_version: Annotated[int | None, pa.int64()]
    code_version: OptStr
    deployment: OptStr  # Prefect deployment that started the run, if any
    input_digest: OptStr  # sha256 over the sorted content hashes of the input documents
    n_inputs: Int
    version: NotRequired[Int]


class MentionRow(TypedDict):
    """Raw extraction output per chunk, kept so layer 0 can be recomputed exactly when chunks go away."""

    id: Str
    chunk_id: Str
    seq: Int  # position in the chunk's extraction output
    kind: Str  # entity | relation
    key: Str  # normalised name, or "a|b" normalised endpoint pair
    name: Str  # entity surface form, or relation source
    target: OptStr  # relation target
    type: OptStr  # an entity's type; a relation's label, led by ">" where it reads from the key's first end to its
    # second, "<" where from the second to the first (null: no statement, the ends co-occur)
    description: Str
    weight: OptFloat
    version: NotRequired[Int]


class MergeStateRow(TypedDict):
    """What a layer-0 entity's or relation's row is computed from, besides its chunks: an update that only adds
    mentions of it computes the row from this and the new mentions, without its old ones
    (``tasks.index.merge_state``)."""

    id: Str  # the entity's or the relation's id
    kind: Str  # entity | relation
    names: StrList  # an entity's surface forms, and how many of its mentions use each
    name_counts: IntList
    types: StrList  # an entity's types, and how many mentions give each; a relation's labels as "<end id> <label>"
    type_counts: IntList
    kept: StrList  # the distinct descriptions its description joins, in corpus order, with their places
    kept_sources: StrList
    kept_positions: IntList
    kept_chunks: StrList
    kept_seqs: IntList
    cut: OptStr  # the first distinct description the budget left out (null: none), and its place
    cut_source: OptStr
    cut_position: OptInt
    cut_chunk: OptStr
    cut_seq: OptInt
    hashes: IntList  # a relation's distinct descriptions, hashed and sorted: its weight is their number
    version: NotRequired[Int]


class QuarantineRow(TypedDict):
    id: Str
    item: Str  # uri or chunk id
    stage: Str
    error: Str
    version: NotRequired[Int]


#: the relation kinds every index may hold, whatever its method: extraction's, and a summary entity's members';
#: a method declares its own (``IndexMethod.relation_kinds``)
SHARED_RELATION_KINDS = ("extracted", "summary_of")

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
    "merge_state",
    "quarantine",
)
#: Append-only log, not pinned: every run is recorded whether or not it published.
LOG_TABLES = ("runs",)

# table -> column -> the table whose ids it must name (referential integrity, ``schemas.expectations``)
REFERENCES: dict[str, dict[str, str]] = {
    "chunks": {"document_id": "documents"},
    "relations": {"source_id": "entities", "target_id": "entities"},
    "mentions": {"chunk_id": "chunks"},
    "community_reports": {"community_id": "communities"},
}
#: the log of snapshots: one row per published version, pinning a version of every table
SNAPSHOTS = "_snapshots"
#: its rows: the version, when, by which run, the kind of run, each table's Lance version, the vector dimension, a note
SNAPSHOT_SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
        ("kind", pa.string()),
        ("tables", pa.string()),  # JSON {table: lance version}
        ("dim", pa.int64()),
        ("note", pa.string()),
    ]
)
ALL_TABLES = SNAPSHOT_TABLES + LOG_TABLES


ROWS: dict[str, type] = {
    "documents": DocumentRow,
    "chunks": ChunkRow,
    "entities": EntityRow,
    "relations": RelationRow,
    "layers": LayerRow,
    "communities": CommunityRow,
    "community_reports": ReportRow,
    "runs": RunRow,
    "mentions": MentionRow,
    "merge_state": MergeStateRow,
    "quarantine": QuarantineRow,
}


@functools.lru_cache(maxsize=64)
def schema_for(table: str, dim: int) -> pa.Schema:
    """The Arrow schema of ``table``: its row type's fields in order (vectors of ``dim`` float32)."""
    if table not in ROWS:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(ALL_TABLES)}")
    fields = []
    for name, hint in get_type_hints(ROWS[table], include_extras=True).items():
        while get_origin(hint) is NotRequired:  # NotRequired[Annotated[...]]
            hint = get_args(hint)[0]
        arrow = hint.__metadata__[0]
        fields.append((name, vector_type(dim) if arrow == "vector" else arrow))
    return pa.schema(fields)
