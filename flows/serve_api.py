"""What ``strata serve`` accepts and answers, as the models its OpenAPI document declares: the request, every
route's response and the error body. Context items allow fields beyond the declared ones (an index method may add
its own, as ``strata query --json`` prints them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class QueryRequest(BaseModel):
    question: str = Field(..., max_length=4000, description="The question (not empty).")
    mode: str | None = Field(None, max_length=64, description="Retrieval mode; default: the index method's first mode.")
    token_budget: int | None = Field(
        None, description="Context tokens (100 .. serve.max_budget); default: retrieval.token_budget."
    )
    as_of: int | None = Field(None, description="Answer from this snapshot version instead of the latest.")


class _Item(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str = Field(description="What the context holds of it (cut to the budget when `truncated`).")
    truncated: bool | None = Field(None, description="True when the text was cut to fit the section's budget.")


class EntityItem(_Item):
    id: str | None = None
    name: str | None = None
    type: str | None = None
    layer: int | None = Field(None, description="0: extracted; 1 and up: summary entities of the hierarchy.")
    score: float | None = None


class CommunityItem(_Item):
    id: str | None = None
    level: int | None = None
    title: str | None = None
    rating: float | None = None
    summary: str | None = None
    findings: list[str] | None = None


class BridgeItem(_Item):
    source: str | None = Field(None, description="The entity (id) the path step starts from.")
    target: str | None = None
    kind: str | None = Field(None, description="Relation kind (extracted, summary_of, …).")


class ChunkItem(_Item):
    id: str | None = None
    document_id: str | None = None
    source_id: str | None = Field(None, description="The document's id in its corpus (file path or record id).")
    title: str | None = None
    chunk_number: int | None = Field(None, description="Its place in its document, from 1 (the service adds it).")
    document_chunks: int | None = Field(None, description="How many chunks its document has (the service adds it).")
    score: float | None = None


class Answer(BaseModel):
    kind: Literal["llm", "extractive"]
    text: str = Field(description="The answer with its sources cited; says so when the index holds no answer.")
    note: str | None = Field(None, description="Why an LLM answer fell back to the extractive one, when it did.")


class QueryResponse(BaseModel):
    """The context retrieved for the question (as ``strata query --json``), its answer and the snapshot it used."""

    question: str
    mode: str
    version: int = Field(description="The snapshot version every part of the response comes from.")
    message: str = Field(description="Why the context is empty or short, when it is.")
    tokens: dict[str, int] = Field(description="Tokens used by each section.")
    entities: list[EntityItem]
    communities: list[CommunityItem]
    bridge: list[BridgeItem]
    chunks: list[ChunkItem]
    seeds: dict[str, list[str]] = Field(description="Graph-ranked modes: the entities that seeded the walk, by how.")
    answer: Answer
    retrieval_ms: float


class Snapshot(BaseModel):
    version: int
    created_at: str = Field(description="ISO 8601, UTC.")
    kind: str = Field(description="full or incremental.")
    changes: dict[str, int] | None = Field(
        None, description="What the run that published it changed, in documents (an update: new, changed, deleted…)."
    )


class GraphNode(BaseModel):
    id: str
    label: str
    kind: Literal["entity", "chunk"]
    type: str | None = Field(None, description="An entity's type.")
    layer: int | None = Field(None, description="An entity's layer: 0 extracted, 1 and up summaries.")
    document_id: str | None = Field(None, description="A source chunk's document.")
    chunk_number: int | None = Field(None, description="A source chunk's place in its document, from 1.")
    document_chunks: int | None = Field(None, description="How many chunks a source chunk's document has.")


class GraphEdge(BaseModel):
    source: str
    target: str
    kind: str = Field(description="A relation's kind, or `source` from an entity to a chunk that mentions it.")
    text: str


class Graph(BaseModel):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class ContextGraphRequest(BaseModel):
    entity_ids: list[str] = Field(default_factory=list, max_length=500)
    chunk_ids: list[str] = Field(default_factory=list, max_length=500)
    as_of: int | None = Field(None, description="The snapshot the query was answered from.")


class CommunitySummary(BaseModel):
    id: str
    level: int
    size: int
    title: str
    rating: float
    parent_id: str | None = None


class CommunityCard(CommunitySummary):
    summary: str
    rating_reason: str | None = Field(None, description="Why the rating is what it is (null: an older index).")
    findings: list[str]
    members: list[GraphNode]
    children: list[CommunitySummary]


class EntityCard(GraphNode):
    description: str
    degree: int
    n_sources: int
    sources_of: Literal["entity", "members"]  # a summary entity's sources are its layer-0 members'
    sources: list[GraphNode]
    communities: list[CommunitySummary]


class DocumentSummary(BaseModel):
    id: str
    source_id: str
    title: str
    chunks: int


class QuarantineItem(BaseModel):
    item: str = Field(description="The file, record or chunk that was not indexed.")
    stage: str
    error: str = Field(description="Why.")


class DocumentList(BaseModel):
    documents: list[DocumentSummary]
    quarantine: list[QuarantineItem]


class ChunkText(BaseModel):
    id: str
    text: str


class DocumentCard(BaseModel):
    id: str
    source_id: str
    title: str
    chunks: list[ChunkText]


class IndexInfo(BaseModel):
    """What ``strata inspect --json`` prints, and the retrieval modes the index offers."""

    model_config = ConfigDict(extra="allow")
    index: str
    version: int
    method: str
    created_at: str
    kind: str
    run_id: str
    vector_dim: int
    tables: dict[str, int] = Field(description="Rows per table in this snapshot.")
    problems: list[str] = Field(description="Tables or data files that cannot be read (empty when healthy).")
    layers: list[dict[str, Any]]
    relations_by_kind: dict[str, int]
    relations_labelled: int = Field(0, description="Relations with a label (what one end does to the other).")
    relation_labels: dict[str, int] = Field({}, description="The labels most used, with their relations.")
    nodes: list[dict[str, Any]]
    communities: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    versions: list[Snapshot]
    modes: list[str]


class Status(BaseModel):
    status: Literal["ok", "ready", "loading"]


class ValidationItem(BaseModel):
    loc: list[str | int] = Field(description="Where in the request (at most 8 parts, each at most 200 characters).")
    msg: str
    type: str


class Problem(BaseModel):
    """Every error response: a message, or the list of what failed validation; never what the request sent."""

    detail: str | list[ValidationItem]


#: the error responses every route may give, in the OpenAPI document
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": what}
    for code, what in (
        (400, "Malformed request (bad Content-Length, a body that does not parse)"),
        (401, "Missing or wrong bearer key (serve.api_key_env's, or the token printed at start)"),
        (404, "No such snapshot"),
        (408, "The body did not arrive within serve.body_timeout_s"),
        (413, "The body is over serve.max_request_bytes"),
        (422, "The request does not validate"),
        (500, "Internal error (the service log has the cause)"),
        (
            503,
            "The queue is full (serve.queue_size), no slot within serve.request_timeout_s, still loading, or the "
            "snapshot removed by gc mid-request; see Retry-After",
        ),
    )
}
