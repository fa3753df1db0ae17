"""The shared part of an incremental refresh: what changed in the corpus, and layer 0 recomputed for it.

* ``diff_documents``: new / changed (same source, new content hash) / deleted / unchanged, scoped to
  one corpus root — an update of one folder never deletes documents that came from another.
* ``recompute_layer0``: layer-0 entities and relations are recomputed exactly, from the stored
  mentions, for the keys the delta touched; the rest are untouched. Ids are content keys, so they
  match a full build.

What a method builds above layer 0 follows in ``tasks.methods`` (``attach``, HiRAG's ``placement``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import EntityRow
from tasks.index.merge import ChunkOrder, graph_from_mentions
from tasks.store.rows import relation_table


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


def diff_documents(existing: list[dict[str, Any]], incoming: list[dict[str, Any]], root: str) -> DocDiff:
    """Compare by (root, source_id) and id (the content hash and the boilerplate left out: a document whose
    paragraph became boilerplate, or stopped being one, is changed). Documents of other roots are never touched."""
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
    out.deleted += [d for sid, d in sorted(old.items()) if sid not in seen]
    return out


MentionSelect = Callable[[Any], Any]  # a polars expression -> the mention rows (with ``a``, ``b``) it keeps


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
    from tasks.index.merge import mention_frame

    return _with_ends(mention_frame(mentions)).filter


def stored_mention_select(
    batches: Callable[[], Iterable[pa.RecordBatch]], gone: set[str], new: pa.Table
) -> MentionSelect:
    """Selection from the previous snapshot's mentions (``batches`` scans them), without those of the ``gone``
    chunks, and the ``new`` ones: each selection reads the stored table batch by batch and holds only the rows
    it keeps, so an update never loads the whole table."""
    import polars as pl

    from tasks.index.merge import mention_frame

    gone_ids = sorted(gone)

    def select(expr):
        keep, parts = ~pl.col("chunk_id").is_in(gone_ids) & expr, []
        for b in batches():
            batch = pa.Table.from_batches([b])
            mask = _with_ends(mention_frame(batch)).select(keep).to_series().to_arrow()
            # the rows kept are copied out of the batch by Arrow: a polars filter keeps the batch's whole string
            # buffers alive behind them (1 % of 20k chunks' stored mentions held 460 MB, this ~5 MB)
            parts.append(_with_ends(mention_frame(batch.filter(mask))))
        return pl.concat([*parts, _with_ends(mention_frame(new)).filter(expr)])

    return select


def recompute_layer0(
    old_entities: list[dict[str, Any]],
    old_relations: pa.Table | list[dict[str, Any]],
    mentions: Any,
    touched_keys: set[str],
    max_description_tokens: int,
    order: ChunkOrder | None = None,
) -> tuple[list[EntityRow], pa.Table, set[str], set[str], set[str]]:
    """Layer-0 entities/extracted relations after the delta. Returns (entities, relations (a table), added,
    removed, changed ids).

    ``mentions`` are all surviving + new mentions (rows, an Arrow table, a polars frame or a ``MentionSelect``
    over them); ``touched_keys`` the entity keys and relation pair keys that appear in removed or new chunks;
    ``order`` places chunks in corpus order (``graph_from_mentions``)."""
    import polars as pl

    from tasks.index.merge import entity_id, relation_degrees

    ent_keys = {k for k in touched_keys if "|" not in k}
    pair_keys = {k for k in touched_keys if "|" in k}
    select = mentions if callable(mentions) else mention_select(mentions)
    is_entity, is_relation = pl.col("kind") == "entity", pl.col("kind") == "relation"
    old_by_id = {e["id"]: e for e in old_entities if e["layer"] == 0}
    # the touched entities, recomputed from all their mentions
    new_ents, _ = graph_from_mentions(
        select(is_entity & pl.col("key").is_in(sorted(ent_keys))).drop("a", "b"), max_description_tokens, order=order
    )
    touched_ids = {entity_id(0, k) for k in ent_keys}
    new_by_id = {e["id"]: e for e in new_ents if e["id"] in touched_ids}
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
    rel = select(
        is_relation & (pl.col("key").is_in(sorted(pair_keys)) | pl.col("a").is_in(flipped) | pl.col("b").is_in(flipped))
    )
    named = set(rel.get_column("a").to_list()) | set(rel.get_column("b").to_list())
    live_ids = set(old_by_id) - removed | added
    _, new_rels = graph_from_mentions(
        rel.drop("a", "b"),
        max_description_tokens,
        order=order,
        endpoints=[k for k in named if entity_id(0, k) in live_ids],
    )
    redone = {
        "|".join(sorted(entity_id(0, p) for p in k.split("|")))
        for k in set(rel.get_column("key").unique().to_list()) | pair_keys
    }
    old = relation_table(old_relations)
    ends = pa.array(sorted(removed), pa.string())
    gone = pc.or_(
        pc.or_(pc.is_in(old.column("source_id"), value_set=ends), pc.is_in(old.column("target_id"), value_set=ends)),
        pc.is_in(
            pc.binary_join_element_wise(old.column("source_id"), old.column("target_id"), "|"),
            value_set=pa.array(sorted(redone), pa.string()),
        ),
    )
    kept = np.flatnonzero(
        pc.and_(pc.equal(old.column("kind"), "extracted"), pc.invert(gone)).to_numpy(zero_copy_only=False)
    )
    # the kept rows and the new ones in id order, taken in one copy (the previous relations are the largest
    # table an update holds: a filtered copy and a sorted copy beside them would triple it)
    rows = np.concatenate([kept, np.arange(new_rels.num_rows) + old.num_rows])
    ids = pa.chunked_array([*old.column("id").take(pa.array(kept)).chunks, *new_rels.column("id").chunks], pa.string())
    relations = pa.concat_tables([old, new_rels]).take(pa.array(rows[pc.sort_indices(ids).to_numpy()]))
    degree = relation_degrees(relations)
    entities = [dict(e, degree=degree.get(e["id"], 0)) for e in entities]
    return cast("list[EntityRow]", sorted(entities, key=lambda e: e["id"])), relations, added, removed, changed
