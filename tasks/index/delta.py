"""The shared part of an incremental refresh: what changed in the corpus, and layer 0 recomputed for it.

* ``diff_documents``: new / changed (same source, new content hash) / deleted / unchanged, scoped to
  one corpus root — an update of one folder never deletes documents that came from another.
* ``recompute_layer0``: layer-0 entities and relations are recomputed exactly, from the stored
  mentions, for the keys the delta touched; the rest are untouched. Ids are content keys, so they
  match a full build.

What a method builds above layer 0 follows in ``tasks.methods`` (``attach``, HiRAG's ``placement``).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import EntityRow, schema_for
from tasks.index.merge import (
    ChunkOrder,
    corpus_places,
    entity_rows,
    graph_from_mentions,
    in_corpus_order,
    mention_frame,
    relation_degrees,
    relation_frame,
)
from tasks.index.merge_state import grow, state_table
from tasks.runtime.stages import release_memory
from tasks.store.ids import entity_id, relation_id
from tasks.store.rows import TableDelta, relation_table


@dataclass
class DocDiff:
    new: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)  # the new versions
    deleted: list[dict[str, Any]] = field(default_factory=list)  # the old rows (deleted or replaced)
    unchanged: list[dict[str, Any]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.new or self.changed or self.deleted)

    def counts(self) -> dict[str, int]:
        replaced = len(self.changed)
        return {
            "new": len(self.new),
            "changed": replaced,
            "deleted": len(self.deleted) - replaced,
            "unchanged": len(self.unchanged),
        }


def diff_documents(
    existing: list[dict[str, Any]], incoming: list[dict[str, Any]], root: str, held: set[str] | None = None
) -> DocDiff:
    """Compare by (root, source_id) and id (the content hash and the boilerplate left out: a document whose
    paragraph became boilerplate, or stopped being one, is changed). Documents of other roots are never touched,
    nor those this run's ingest quarantined (``held``: the files and records it could not read — grown past the
    size limit, unreadable, a record now invalid): they stay as indexed, not deleted."""
    old = {d["source_id"]: d for d in existing if d["root"] == root}
    out = DocDiff()
    seen = set()
    for doc in incoming:
        seen.add(doc["source_id"])
        prev = old.get(doc["source_id"])
        if prev is None:
            out.new.append(doc)
        elif prev["id"] != doc["id"]:
            out.changed.append(doc)
            out.deleted.append(prev)
        else:
            out.unchanged.append(prev)
    for sid, d in sorted(old.items()):
        if sid in seen:
            continue
        kept = held and (d["uri"] in held or d["uri"].split("#", 1)[0] in held)
        (out.unchanged if kept else out.deleted).append(d)
    return out


MentionSelect = Callable[[Any], Any]  # a polars expression -> the mention rows (with ``a``, ``b``) it keeps


def selected_parts(select: MentionSelect, expr) -> Iterable[Any]:
    """The rows ``select(expr)`` keeps, a part at a time where the selection streams them (``parts``: a scan of
    the stored mentions, a batch at a time), else all at once."""
    parts = getattr(select, "parts", None)
    return parts(expr) if parts is not None else [select(expr)]


def _with_ends(frame):
    """Mentions with the two ends ``a`` and ``b`` of a relation key "a|b" (null ``b`` for entities), text as strings."""
    import polars as pl

    return (
        frame.with_columns(pl.col(pl.Categorical).cast(pl.Utf8))
        .with_columns(pl.col("key").str.split_exact("|", 1).struct.rename_fields(["a", "b"]).alias("ab"))
        .unnest("ab")
    )


def mention_select(mentions: Any) -> MentionSelect:
    """Selection from mentions held in memory (rows, an Arrow table or a polars frame)."""

    return _with_ends(mention_frame(mentions)).filter


def stored_mention_select(
    batches: Callable[[], Iterable[pa.RecordBatch]], gone: set[str], new: pa.Table
) -> MentionSelect:
    """Selection from the previous snapshot's mentions (``batches`` scans them), without those of the ``gone``
    chunks, and the ``new`` ones: each selection reads the stored table batch by batch and holds only the rows
    it keeps, so an update never loads the whole table."""
    import polars as pl

    gone_ids = sorted(gone)

    def parts(expr):
        keep = ~pl.col("chunk_id").is_in(gone_ids) & expr
        for b in batches():
            batch = pa.Table.from_batches([b])
            mask = _with_ends(mention_frame(batch)).select(keep).to_series().to_arrow()
            # the rows kept are copied out of the batch by Arrow: a polars filter keeps the batch's whole string
            # buffers alive behind them (1 % of 20k chunks' stored mentions held 460 MB, this ~5 MB)
            yield _with_ends(mention_frame(batch.filter(mask)))
        yield _with_ends(mention_frame(new)).filter(expr)

    def select(expr):
        return pl.concat(list(parts(expr)))

    select.parts = parts  # type: ignore[attr-defined]
    return select


@dataclass
class Grown:
    """What an update knows of the keys whose mentions only grew (``merge_state``): ``keys``, the entity keys and
    relation keys of its new mentions that no chunk leaving names; ``new``, its new mentions (a polars frame of
    ``merge.MENTION_COLUMNS``); ``state(ids)``, the previous snapshot's ``merge_state`` rows of ``ids``."""

    keys: set[str]
    new: Any
    state: Callable[[Iterable[str]], pa.Table]


class Recomputed(NamedTuple):
    """Layer 0 after an update's delta (``recompute_layer0``)."""

    entities: list[EntityRow]  # every layer-0 row, sorted by id, degrees set
    relations: pa.Table | int  # the extracted relations kept and made (their number, without ``keep_graph``)
    added: set[str]  # entity ids new since the previous snapshot
    removed: set[str]  # entity ids gone
    changed: set[str]  # entity ids whose name, type or description changed
    state_change: TableDelta  # of ``merge_state``
    relation_change: TableDelta  # the previous relation rows that went or were recomputed, and the recomputed rows


def recompute_layer0(
    old_entities: list[dict[str, Any]],
    old_relations: pa.Table | list[dict[str, Any]] | Callable[[], Any],
    mentions: Any,
    touched_keys: set[str],
    max_description_tokens: int,
    order: ChunkOrder | None = None,
    grown: Grown | None = None,
    old_rows: Callable[[list[str]], pa.Table] | None = None,
    keep_graph: bool = True,
) -> Recomputed:
    """Layer-0 entities/extracted relations after the delta (``Recomputed``: the relations a table with the columns
    of ``old_relations``, or without ``keep_graph`` their number; the relations recomputed with every column, most
    as they were: ``publish_steps.relation_change`` keeps those that differ).

    ``old_relations`` may hold only some columns (an update's: the graph's, ``GRAPH_COLUMNS``); ``old_rows(ids)``
    then reads the previous rows of ``ids`` whole (None: ``old_relations`` holds them). A callable is called for
    them (a table, or record batches read one at a time) once the relations are recomputed: the recomputation's
    frames and those rows are not held at once.

    ``mentions`` are all surviving + new mentions (rows, an Arrow table, a polars frame or a ``MentionSelect``
    over them); ``touched_keys`` the entity keys and relation pair keys that appear in removed or new chunks;
    ``order`` places chunks in corpus order (``graph_from_mentions``). The keys of ``grown`` (when the previous
    snapshot has a ``merge_state``) are computed from their state and their new mentions, the others from all
    their mentions."""
    import polars as pl

    ent_keys = {k for k in touched_keys if "|" not in k}
    pair_keys = {k for k in touched_keys if "|" in k}
    select = mentions if callable(mentions) else mention_select(mentions)
    is_relation = pl.col("kind") == "relation"
    old_by_id = {e["id"]: e for e in old_entities if e["layer"] == 0}
    places = corpus_places(order or {})
    grew, states = (grown.keys if grown else set()) & ent_keys - {""}, []
    if grew:  # the entities whose mentions only grew, from their state
        grew_rows, grew_state = _grown_entities(cast(Grown, grown), grew, old_by_id, max_description_tokens, places)
        states.append(grew_state)
    recompute = sorted(ent_keys - grew - {""})  # none: the stored mentions are not scanned at all
    new_ents, state = _refolded_entities(select, recompute, max_description_tokens, places)
    release_memory()  # each step's frames back to the system before the next allocates (in another allocator)
    touched_ids = {entity_id(0, k) for k in ent_keys}
    new_by_id = {e["id"]: e for e in [*new_ents, *(grew_rows if grew else [])] if e["id"] in touched_ids}
    states.append(state)
    entities = [e for e in old_entities if e["layer"] == 0 and e["id"] not in touched_ids] + list(new_by_id.values())
    added = set(new_by_id) - set(old_by_id)
    removed = (touched_ids & set(old_by_id)) - set(new_by_id)
    changed = {
        i
        for i in set(new_by_id) & set(old_by_id)
        if (new_by_id[i]["description"], new_by_id[i]["type"], new_by_id[i]["name"])
        != (old_by_id[i]["description"], old_by_id[i]["type"], old_by_id[i]["name"])
    }
    # relations recomputed: the touched pairs, and every pair of an entity that came or went (a relation
    # exists only between two entities); those of a touched entity that stays, on untouched pairs, stand
    flipped = sorted(k for k in ent_keys if entity_id(0, k) in added | removed)
    live_ids = set(old_by_id) - removed | added

    def old_table() -> pa.Table:
        return relation_table(old_relations() if callable(old_relations) else old_relations)

    def whole(ids: list[str]) -> pa.Table:  # previous relation rows, every column
        if old_rows is not None:
            return old_rows(ids)
        old = old_table()
        return old.filter(pc.is_in(old.column("id"), value_set=pa.array(ids, pa.string())))

    grew_pairs = {k for k in (grown.keys if grown else set()) & pair_keys if not set(k.split("|")) & set(flipped)}
    grew_rels = None
    if grew_pairs:
        grew_rels, grew_state = _grown_relations(
            cast(Grown, grown), grew_pairs, live_ids, whole, max_description_tokens, places
        )
        states.append(grew_state)
        release_memory()
    pairs = sorted(pair_keys - grew_pairs)
    rel = (
        select(is_relation & (pl.col("key").is_in(pairs) | pl.col("a").is_in(flipped) | pl.col("b").is_in(flipped)))
        if pairs or flipped
        else _with_ends(mention_frame([]))
    )
    named = set(rel.get_column("a").to_list()) | set(rel.get_column("b").to_list())
    _, new_rels, state = graph_from_mentions(
        rel.drop("a", "b"),
        max_description_tokens,
        order=order,
        endpoints=[k for k in named if entity_id(0, k) in live_ids],
        state=True,
    )
    states.append(state)
    if grew_rels is not None:
        new_rels = pa.concat_tables([new_rels, grew_rels])
    redone = {
        "|".join(sorted(entity_id(0, p) for p in k.split("|")))
        for k in set(rel.get_column("key").unique().to_list()) | pair_keys
    }
    added_state = pa.concat_tables(states)
    stated = added_state.column("id").combine_chunks()
    ends = pa.array(sorted(removed), pa.string())
    new_rels = new_rels.take(pc.sort_indices(new_rels.column("id")))
    dropped: set[str] = set()
    live, degree = set(new_by_id), Counter[str]()
    kept_parts: list[pa.Table] = []
    count = 0
    # the previous rows a batch at a time (an update's: read so, never held whole): those that go, and of the kept
    # ones their ends' degrees and the state's relation ids that live (no Python string per relation)
    old = old_relations() if callable(old_relations) else old_relations
    batches = relation_table(old).to_batches() if isinstance(old, (pa.Table, list)) else old
    for table in itertools.chain((pa.Table.from_batches([b]) for b in batches), [None]):
        if table is None:  # then the new rows, in id order
            table = new_rels.select(kept_parts[0].column_names).cast(kept_parts[0].schema) if kept_parts else new_rels
            gone = pa.array(np.zeros(table.num_rows, dtype=bool))
        else:
            near = pc.or_(
                pc.is_in(table.column("source_id"), value_set=ends), pc.is_in(table.column("target_id"), value_set=ends)
            )
            gone = pc.or_(near, _pairs_in(table, redone))
            dropped.update(table.column("id").filter(gone).to_pylist())
            gone = pc.or_(gone, pc.not_equal(table.column("kind"), "extracted"))
        kept = table.filter(pc.invert(gone))
        count += kept.num_rows
        degree.update(relation_degrees(kept))
        ids = kept.column("id")
        live.update(ids.filter(pc.is_in(ids, value_set=stated)).to_pylist())
        if keep_graph:
            kept_parts.append(kept)
    relations = pa.concat_tables(kept_parts) if keep_graph else count
    for e in entities:  # rows of this update's own (the caller's rows, read for it): set in place, not copied
        e["degree"] = degree.get(e["id"], 0)
    added_state = added_state.filter(pc.is_in(added_state.column("id"), value_set=pa.array(sorted(live), pa.string())))
    state_delta = TableDelta("id", sorted(touched_ids | dropped), added_state.sort_by("id"))
    return Recomputed(
        cast("list[EntityRow]", sorted(entities, key=lambda e: e["id"])),
        relations,
        added,
        removed,
        changed,
        state_delta,
        TableDelta("id", sorted(dropped), new_rels),
    )


def _pairs_in(relations: pa.Table, pairs: set[str]) -> pa.Array:
    """Whether each relation's "source_id|target_id" is one of ``pairs``: a hash join of the two ends against the
    pairs' (no string made per relation, so the memory is the pairs', not the relations')."""
    ends = [p.split("|", 1) for p in pairs]
    wanted = pa.table(
        {
            "source_id": pa.array([a for a, _ in ends], pa.string()),
            "target_id": pa.array([b for _, b in ends], pa.string()),
        }
    )
    probe = pa.table(
        {
            "source_id": relations.column("source_id"),
            "target_id": relations.column("target_id"),
            "row": pa.array(np.arange(relations.num_rows)),
        }
    )
    rows = probe.join(wanted, keys=["source_id", "target_id"], join_type="left semi").column("row")
    hit = np.zeros(relations.num_rows, dtype=bool)
    hit[rows.to_numpy()] = True
    return pa.array(hit)


#: mention rows folded into the description state at a time when entities are recomputed from their mentions
FOLD_ROWS = 100_000


def _refolded_entities(
    select: MentionSelect, keys: list[str], max_tokens: int, places: Any
) -> tuple[list[dict[str, Any]], pa.Table]:
    """Entity rows of ``keys`` from all their mentions (those that lost some: an edit or delete), and their
    ``merge_state`` rows, as ``graph_from_mentions`` gives them. The mentions are folded into the description
    state a share at a time as the selection streams them (``merge_state.grow``: a state grown by any share of the
    mentions is the state of all of them), so the run holds each key's kept sentences and chunks, not its
    mentions (at 100k chunks, a 1 % update recomputes 79 keys, years among them: 1.16M mentions)."""
    import polars as pl

    state = schema_for("merge_state", 0).empty_table()
    frame, chunks, held, rows = None, [], [], 0

    def fold(state: pa.Table, held: list[Any]) -> tuple[pa.Table, Any]:
        placed = in_corpus_order(pl.concat(held), places, "key", "name", "type", "description")
        chunks.append(placed.select("key", pl.col("chunk_id").cast(pl.Utf8)).unique())
        frame = grow(state, placed, "key", max_tokens).sort("key")
        return state_table(frame.with_columns(id=pl.col("key")), "entity"), frame

    for part in selected_parts(select, (pl.col("kind") == "entity") & pl.col("key").is_in(keys)) if keys else ():
        held.append(part.drop("a", "b"))
        rows += part.height
        if rows >= FOLD_ROWS:
            (state, frame), held, rows = fold(state, held), [], 0
    if held:
        state, frame = fold(state, held)
    if frame is None:
        return [], state
    ids = [entity_id(0, k) for k in frame.get_column("key").to_list()]
    sources = pl.concat(chunks).unique().sort("chunk_id").group_by("key").agg(source_chunk_ids="chunk_id")
    frame = frame.with_columns(id=pl.Series(ids, dtype=pl.Utf8)).join(sources, on="key")
    # rows as a merge makes them (``entity_rows``: key order, degrees set by the caller), the state in that order
    return entity_rows(frame, {}), state.set_column(0, "id", pa.array(ids, pa.string()))


def _grown_entities(
    grown: Grown, keys: set[str], old_by_id: dict[str, dict[str, Any]], max_tokens: int, places: Any
) -> tuple[list[dict[str, Any]], pa.Table]:
    """Entity rows of ``keys`` from their state and new mentions (``merge_state.grow``), and their ``merge_state``
    rows."""
    import polars as pl

    ids = {entity_id(0, k): k for k in keys}
    state = _state_by(grown, ids)
    new = grown.new.filter((pl.col("kind") == "entity") & pl.col("key").is_in(sorted(keys)))
    placed = in_corpus_order(new, places, "key", "name", "type", "description")
    frame = grow(state, placed, "key", max_tokens)
    chunks = placed.group_by("key").agg(pl.col("chunk_id").cast(pl.Utf8).unique().alias("new_chunks"))
    frame = frame.join(chunks, on="key")
    frame = frame.with_columns(
        id=pl.Series([entity_id(0, k) for k in frame.get_column("key").to_list()], dtype=pl.Utf8)
    )
    rows = [
        {
            "id": r["id"],
            "name": r["name"],
            "type": r["type"],
            "description": r["description"],
            "layer": 0,
            "source_chunk_ids": sorted(
                set(old_by_id.get(r["id"], {}).get("source_chunk_ids") or []) | set(r["new_chunks"])
            ),
            "degree": 0,
            "aliases": r["aliases"],
        }
        for r in frame.select("id", "name", "aliases", "type", "description", "new_chunks").iter_rows(named=True)
    ]
    return rows, state_table(frame, "entity")


def _grown_relations(
    grown: Grown,
    keys: set[str],
    live_ids: set[str],
    old_rows: Callable[[list[str]], pa.Table],
    max_tokens: int,
    places: Any,
) -> tuple[pa.Table, pa.Table]:
    """Relation rows of the relation ``keys`` whose two ends live, from their state and new mentions, and their
    ``merge_state`` rows. ``old_rows(ids)``: the previous rows of ``ids``."""
    import polars as pl

    pairs, first, second = {}, {}, {}  # key -> the pair of ids in order, the id of the key's first end, its second's
    for k in keys:
        a, b = k.split("|", 1)
        first[k], second[k] = entity_id(0, a), entity_id(0, b)
        if a != b and {first[k], second[k]} <= live_ids:
            pairs[k] = "|".join(sorted((first[k], second[k])))
    rel_ids = {relation_id(*_ends(p), "extracted"): p for p in set(pairs.values())}
    state = _state_by(grown, rel_ids)
    new = grown.new.filter((pl.col("kind") == "relation") & pl.col("key").is_in(sorted(pairs)))
    key = pl.col("key").cast(pl.Utf8)
    new = new.with_columns(
        pair=key.replace_strict(pairs, return_dtype=pl.Utf8),
        ida=key.replace_strict(first, return_dtype=pl.Utf8, default=None),
        idb=key.replace_strict(second, return_dtype=pl.Utf8, default=None),
    )
    placed = in_corpus_order(new, places, "pair", "type", "ida", "idb", "description")
    frame = grow(state, placed, "pair", max_tokens)
    held = old_rows(sorted(rel_ids))
    before = dict(zip(held.column("id").to_pylist(), held.column("source_chunk_ids").to_pylist()))
    chunks = dict(placed.group_by("pair").agg(pl.col("chunk_id").cast(pl.Utf8).unique()).iter_rows())
    pair = frame.get_column("pair").to_list()
    ids = [relation_id(*_ends(p), "extracted") for p in pair]
    frame = frame.with_columns(
        id=pl.Series(ids, dtype=pl.Utf8),
        source_id=pl.Series([p.split("|")[0] for p in pair], dtype=pl.Utf8),
        target_id=pl.Series([p.split("|")[1] for p in pair], dtype=pl.Utf8),
        kind=pl.lit("extracted"),
        weight=pl.col("hashes").list.len().cast(pl.Float64),
        source_chunk_ids=pl.Series(
            [sorted(set(before.get(i) or []) | set(chunks[p])) for i, p in zip(ids, pair)], dtype=pl.List(pl.Utf8)
        ),
    )
    return relation_frame(frame), state_table(frame, "relation")


def _state_by(grown: Grown, keys: dict[str, str]) -> pa.Table:
    """The ``merge_state`` rows of the ids of ``keys`` (id -> key), each ``id`` replaced by its key."""
    state = grown.state(keys)
    return state.set_column(0, "id", pa.array([keys[i] for i in state.column("id").to_pylist()], pa.string()))


def _ends(pair: str) -> tuple[str, str]:
    source, target = pair.split("|", 1)
    return source, target
