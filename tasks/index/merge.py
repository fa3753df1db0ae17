"""Merge: raw mentions -> layer-0 ``entities`` and ``relations``.

Entity resolution by normalised name; the most frequent surface form and type win (ties
broken deterministically); descriptions are the distinct supporting sentences in corpus
order, kept within a token budget; relations are undirected (canonical endpoint order)
and weighted by the number of distinct supporting sentences.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from schemas.tables import schema_for
from tasks.index.aliases import resolved
from tasks.index.merge_state import (
    ENTITY_STATE,
    STATE,
    budgeted,
    count_lists,
    label_counts,
    pick_name,
    pick_type,
    state_table,
    with_labels,
)
from tasks.store.ids import entity_id, make_id, normalize_name, relation_id

if TYPE_CHECKING:
    import pyarrow as pa


_FIRST_SENTENCE = re.compile(r"^(.{20,}?[.!?])(?:\s|$)", re.DOTALL)


def title_mentions(chunks: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """Document titles as entities: one mention of a chunk's ``title`` (its document's ``explicit_title``, if
    any) in the chunk, described by the chunk's first sentence. A chunk elsewhere that names the same entity
    links to it."""
    out = []
    for c in chunks:
        title = c.get("title")
        if title and normalize_name(title):
            text = " ".join(c["text"].split())
            m = _FIRST_SENTENCE.match(text)
            sentence = (m.group(1) if m else text)[:max_chars]
            out.append({"name": title, "type": "concept", "description": sentence, "chunk_id": c["id"]})
    return out


def mention_rows(
    extracted_entities: list[dict[str, Any]],
    extracted_relations: list[dict[str, Any]],
    aliases: dict[str, dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Raw extraction output as ``mentions`` rows, numbered per chunk, in canonical (chunk id, seq) order. A
    mention's key is its name's (``normalize_name``), or what its chunk's ``aliases`` (chunk id -> {key: key},
    ``tasks.index.aliases``) resolve that to; its ``name`` stays as written. A relation whose ends resolve to one
    entity is none."""
    aliases = aliases or {}

    rows: list[dict[str, Any]] = []
    seq: dict[str, int] = defaultdict(int)
    for e in extracted_entities:
        n = seq[e["chunk_id"]]
        seq[e["chunk_id"]] += 1
        rows.append(
            {
                "id": make_id("m", e["chunk_id"], n),
                "chunk_id": e["chunk_id"],
                "seq": n,
                "kind": "entity",
                "key": resolved(aliases, e["chunk_id"], normalize_name(e["name"])),
                "name": e["name"],
                "target": None,
                "type": e["type"],
                "description": e["description"],
                "weight": None,
            }
        )
    for r in extracted_relations:
        raw = normalize_name(r["source"]), normalize_name(r["target"])
        source, target = (resolved(aliases, r["chunk_id"], k) for k in raw)
        if source == target and raw[0] != raw[1]:
            continue  # "Scrooge" and "Ebenezer Scrooge" named together: one person, no relation
        n = seq[r["chunk_id"]]
        seq[r["chunk_id"]] += 1
        a, b = sorted((source, target))
        label = r.get("label")
        rows.append(
            {
                "id": make_id("m", r["chunk_id"], n),
                "chunk_id": r["chunk_id"],
                "seq": n,
                "kind": "relation",
                "key": f"{a}|{b}",
                "name": r["source"],
                "target": r["target"],
                "type": None if not label else (">" if source == a else "<") + label,
                "description": r["description"],
                "weight": r.get("weight", 1.0),
            }
        )
    rows.sort(key=lambda m: (m["chunk_id"], m["seq"]))
    return rows


ChunkOrder = dict[str, tuple[str, int]]  # chunk id -> (document source id, position of the chunk in it)

#: the columns of ``mentions`` that layer 0 is computed from; the text ones may stay categorical (dictionary
#: encoded, as extraction writes them): they are grouped and compared, and turned into strings once aggregated
MENTION_COLUMNS = {
    "chunk_id": "str",
    "seq": "int",
    "kind": "text",
    "key": "str",
    "name": "text",
    "type": "text",
    "description": "text",
    "weight": "float",
}


def dictionary_encoded(table):
    """``table`` with its repeated string columns dictionary encoded (every column but ``id``): a sentence that
    describes five mentions is held once. Written out as plain strings (``Catalog`` decodes batch by batch)."""
    import pyarrow as pa

    for i, f in enumerate(table.schema):
        if f.name != "id" and pa.types.is_string(f.type):
            table = table.set_column(i, f.name, table.column(i).dictionary_encode())
    return table


def mention_frame(mentions: Any):
    """Mentions (rows, an Arrow table or a polars frame) as a polars frame of ``MENTION_COLUMNS``."""
    import polars as pl
    import pyarrow as pa

    types = {"str": pl.Utf8, "int": pl.Int64, "float": pl.Float64, "text": pl.Utf8}
    if isinstance(mentions, pa.Table):
        mentions = pl.from_arrow(mentions.select(list(MENTION_COLUMNS)))
    if isinstance(mentions, pl.DataFrame):
        return mentions.select(
            [
                pl.col(c) if t == "text" and mentions.schema[c] == pl.Categorical else pl.col(c).cast(types[t])
                for c, t in MENTION_COLUMNS.items()
            ]
        )
    schema = {c: types[t] for c, t in MENTION_COLUMNS.items()}
    return pl.from_dicts(mentions, schema=schema) if mentions else pl.DataFrame(schema=schema)


#: the columns ``in_chunk_order`` reads
CHUNK_ORDER = ("chunk_id", "seq")


def in_chunk_order(mentions: pa.Table) -> pa.Table:
    """Mentions in their canonical order, (chunk id, seq): the order merge reads them in and the table keeps."""
    import polars as pl

    rank = (
        cast(pl.DataFrame, pl.from_arrow(mentions.select(list(CHUNK_ORDER))))  # a table gives a frame
        .with_row_index("i")
        .sort(pl.col("chunk_id").cast(pl.Utf8), "seq")
        .get_column("i")
    )
    return mentions.take(rank.to_arrow())


#: a build merges this many mentions or more in a child process (``tasks.runtime.parallel.in_child_process``): at 100k
#: chunks (9.5M mentions) the merge's transient frames left 1.5 GB mapped in the run's process after it
MERGE_IN_CHILD_ROWS = 1_000_000
#: what extraction plans its spill parts with (the offline extractor finds ~90 per chunk of 200 words, an LLM fewer)
MENTIONS_PER_CHUNK = 100


def graph_from_mentions(
    mentions: Any,
    max_description_tokens: int,
    order: ChunkOrder | None = None,
    endpoints: Iterable[str] = (),
    state: bool = False,
):
    """Layer-0 entities and relations from mention rows (list, Arrow table or polars frame), columnar.

    Mentions are read in corpus order: by document source, then position in the document (``order``),
    whatever order the rows come in. Entity resolution is by the normalised name (``key``); the most
    frequent surface form and type win (ties broken deterministically); a description is the distinct
    supporting sentences in corpus order within the token budget, so a document appended later, under a
    source that sorts after the others, does not change the text (nor the vector) of an entity it mentions
    again. Relations are undirected (canonical endpoint order) and weighted by their distinct sentences.
    A spilled table (``tasks.store.spill``) is merged part by part (same result; ``tasks.index.merge_parts``
    merges its parts as tasks on the cluster). ``endpoints``: keys of entities that exist besides those the
    mentions name (an update's untouched ones), which relations may join. ``state``: their ``merge_state`` rows
    (an Arrow table) as a third value."""
    import polars as pl

    places = corpus_places(order or {})
    entity = pl.concat(
        [entity_part(m, places, max_description_tokens, state) for m in _mention_parts(mentions, "entity")]
    )
    keys = entity.get_column("key").to_list()
    ends = sorted(set(endpoints) - set(keys))
    ids = pl.concat([entity.select("key", "id"), key_ids(ends)])
    relation = pl.concat(
        [relation_part(m, places, ids, max_description_tokens, state) for m in _mention_parts(mentions, "relation")]
    )
    if not state:
        return layer0_rows(entity, relation)
    import pyarrow as pa

    return (
        *layer0_rows(entity, relation),
        pa.concat_tables([state_table(entity, "entity"), state_table(relation, "relation")]),
    )


def corpus_places(order: ChunkOrder):
    """Every chunk's rank in the corpus (by document source, then position in it) as a (chunk_id, place, source,
    pos) frame."""
    import polars as pl

    ranked = sorted(order, key=lambda c: (order[c], c))
    return pl.DataFrame(
        {
            "chunk_id": ranked,
            "place": list(range(len(ranked))),
            "source": [order[c][0] for c in ranked],
            "pos": [order[c][1] for c in ranked],
        },
        schema={"chunk_id": pl.Utf8, "place": pl.Int64, "source": pl.Utf8, "pos": pl.Int64},
    )


def in_corpus_order(frame, places, *columns):
    """Mention rows (``frame``) in corpus order, placed by ``corpus_places``: with their place, source and position,
    then ``columns``; a chunk the order does not know sorts first."""
    import polars as pl

    return (
        frame.join(places, on="chunk_id", how="left", maintain_order="left")
        .with_columns(pl.col("place").fill_null(-1), pl.col("source").fill_null(""), pl.col("pos").fill_null(-1))
        .select("place", "chunk_id", "seq", "source", "pos", *columns)
        .sort("place", "chunk_id", "seq")
    )


def key_ids(keys: list[str]):
    """A (key, id) frame: each entity key with its layer-0 id."""
    import polars as pl

    return pl.DataFrame({"key": keys, "id": [entity_id(0, k) for k in keys]}, schema={"key": pl.Utf8, "id": pl.Utf8})


def entity_part(mentions, places, max_description_tokens: int, state: bool = False):
    """The entities (key, id, name, type, description, source_chunk_ids) of a frame of entity mentions that holds
    every mention of its keys, sorted by key; with ``state``, their description state's columns too."""
    import polars as pl

    ents = in_corpus_order(mentions.filter(pl.col("key") != ""), places, "key", "name", "type", "description")
    entity = _entity_part(ents, max_description_tokens, state).sort("key")
    ids = key_ids(entity.get_column("key").to_list())
    return entity.with_columns(id=ids.get_column("id")).select(
        "key", "id", "name", "aliases", "type", "description", "source_chunk_ids", *(ENTITY_STATE if state else ())
    )


def relation_part(mentions, places, ids, max_description_tokens: int, state: bool = False):
    """The relations (``relations`` columns but version) of a frame of relation mentions that holds every mention
    of its pairs, sorted by endpoints; ``ids`` is the (key, id) frame of every entity (a relation needs both);
    with ``state``, their description state's columns too."""
    import polars as pl

    relation = _relation_part(
        in_corpus_order(mentions, places, "key", "type", "description"), ids, max_description_tokens, state
    ).sort("source_id", "target_id")
    pairs = zip(relation.get_column("source_id").to_list(), relation.get_column("target_id").to_list())
    return relation.with_columns(
        id=pl.Series([relation_id(a, b, "extracted") for a, b in pairs], dtype=pl.Utf8),
        kind=pl.lit("extracted"),
        weight=pl.col("parts").cast(pl.Float64),
    ).drop("parts")


def layer0_rows(entity: Any, relation: Any) -> tuple[list[dict[str, Any]], Any]:
    """Layer 0 from merged parts: entity rows (dicts, sorted by key) with their degrees, and the relations as an
    Arrow table sorted by endpoints. ``entity``: frames of ``entity_part``; ``relation``: of ``relation_part``."""
    relations = relation_frame(relation.sort("source_id", "target_id"))
    return entity_rows(entity, relation_degrees(relations)), relations


def entity_rows(entity: Any, degree: dict[str, int]) -> list[dict[str, Any]]:
    """Layer-0 entity rows (dicts, sorted by key) of ``entity_part`` frames, with their ``degree`` (relations an
    entity is an end of)."""
    entity = entity.sort("key")
    shared: dict[str, str] = {}  # one string per chunk id across all entities (3.1M ids at 100k chunks: -190 MB)
    return [
        {
            "id": e["id"],
            "name": e["name"],
            "type": e["type"],
            "description": e["description"],
            "layer": 0,
            "source_chunk_ids": [shared.setdefault(c, c) for c in e["source_chunk_ids"]],
            "degree": degree.get(e["id"], 0),
            "aliases": e["aliases"],
        }
        for e in entity.iter_rows(named=True)
    ]


def _mention_parts(mentions: Any, kind: str):
    """The mentions of one ``kind`` as polars frames, each holding every mention of the keys it has: a spilled
    table's parts (split by key hash when they were written), anything else whole."""
    import polars as pl

    from tasks.store.spill import SpilledTable

    if not isinstance(mentions, SpilledTable):
        yield mention_frame(mentions).filter(pl.col("kind") == kind)
        return
    empty = True
    for t in mentions.parts(list(MENTION_COLUMNS), where=("kind", kind), ordered=False, encoded=True):
        empty = False
        yield mention_frame(t)
    if empty:
        yield mention_frame([])


def _entity_part(ents, max_description_tokens: int, state: bool = False):
    """Entity rows (key, name, type, description, source_chunk_ids) of entity mentions in corpus order; with
    ``state``, the description state's columns too (``merge_state``)."""
    import polars as pl

    counts = {
        c: ents.group_by("key", c).agg(n=pl.len()).with_columns(pl.col(c).cast(pl.Utf8)) for c in ("name", "type")
    }
    chunks = ents.group_by("key").agg(pl.col("chunk_id").unique().sort().alias("source_chunk_ids"))
    out = (
        pick_name(counts["name"])
        .join(pick_type(counts["type"]), on="key")
        .join(budgeted(ents, "key", max_description_tokens, state), on="key")
        .join(chunks, on="key")
    )
    if not state:
        return out.select("key", "name", "aliases", "type", "description", "source_chunk_ids")
    return (
        out.drop("parts")
        .join(count_lists(counts["name"], "name"), on="key")
        .join(count_lists(counts["type"], "type"), on="key")
    )


def _relation_part(rels, ids, max_description_tokens: int, state: bool = False):
    """Relation rows (source_id, target_id, description, parts, source_chunk_ids) of relation mentions in corpus
    order; ``ids`` maps every entity key to its id (a relation needs both endpoints)."""
    import polars as pl

    pair_of = (
        rels.select(pl.col("key").unique())  # relation key "a|b" -> "id(a)|id(b)", ids in order
        .with_columns(pl.col("key").str.split_exact("|", 1).struct.rename_fields(["a", "b"]).alias("ab"))
        .unnest("ab")
        .filter(pl.col("a") != pl.col("b"))
        .join(ids.rename({"key": "a", "id": "ida"}), on="a")
        .join(ids.rename({"key": "b", "id": "idb"}), on="b")
        .select(
            "key",
            "ida",
            "idb",
            pair=pl.concat_str(pl.min_horizontal("ida", "idb"), pl.max_horizontal("ida", "idb"), separator="|").cast(
                pl.Categorical
            ),
        )
    )
    # the ends' ids joined to the labelled mentions only (most mentions are co-occurrences: no string per one)
    labels = label_counts(rels.filter(pl.col("type").is_not_null()).join(pair_of, on="key"), "pair")
    rels = rels.join(pair_of.select("key", "pair"), on="key", maintain_order="left").drop("key", "type")
    described = budgeted(rels, "pair", max_description_tokens, state)
    return (
        with_labels(described, labels, "pair", pl.col("parts"), state)
        .join(rels.group_by("pair").agg(pl.col("chunk_id").unique().sort().alias("source_chunk_ids")), on="pair")
        .with_columns(
            pl.col("pair")
            .cast(pl.Utf8)
            .str.split_exact("|", 1)
            .struct.rename_fields(["source_id", "target_id"])
            .alias("st")
        )
        .unnest("st")
        .select(
            "source_id",
            "target_id",
            "description",
            "parts",
            "source_chunk_ids",
            "label",
            "label_from",
            *(STATE if state else ()),
        )
    )


def relation_frame(frame, version: int = 0):
    """A polars frame with the relation columns as an Arrow table of the ``relations`` schema (stamped
    ``version``)."""
    import polars as pl

    schema = schema_for("relations", 0)
    return frame.with_columns(version=pl.lit(version, pl.Int64)).select(schema.names).to_arrow().cast(schema)


def relation_degrees(relations) -> dict[str, int]:
    """Entity id -> number of relations it is an endpoint of (an Arrow table of relations), counted by Arrow over
    the two columns' chunks (no copy of 1.9M relations' ends at 100k chunks)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ends = [c.cast(pa.string()) for name in ("source_id", "target_id") for c in relations.column(name).chunks]
    counts = pc.value_counts(pa.chunked_array(ends, pa.string()))
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))


def merge_graph(
    raw_entities: list[dict[str, Any]],
    raw_relations: list[dict[str, Any]],
    max_description_tokens: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Resolve raw mentions (extractor output, in corpus order) into layer-0 entities and relations."""
    order: ChunkOrder = {}
    for r in [*raw_entities, *raw_relations]:
        order.setdefault(r["chunk_id"], ("", len(order)))
    return graph_from_mentions(mention_rows(raw_entities, raw_relations), max_description_tokens, order)
