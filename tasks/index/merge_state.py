"""Layer 0's description state (the ``merge_state`` table), and an update's rows computed from it.

A layer-0 entity's row is a function of its mentions (``merge``): its name and type are the most frequent ones,
its description the distinct supporting sentences in corpus order up to the token budget, its chunks their union;
a relation's weight is its number of distinct sentences. The state keeps, per entity and relation, the name and
type counts, the descriptions kept with their places in the corpus, the first one the budget left out with its
place (the *cut*), and a relation's distinct sentences hashed. An update that only adds mentions of an entity
(none of its chunks goes) computes its row from the state and the new mentions, as all its mentions would give it:

* a sentence placed after the cut is never kept: the sentences before it already pass the budget;
* a new sentence placed before the cut joins the kept ones where its place puts it (a repeat keeps the earlier
  place), and the budget is applied again; if all of them are kept, the cut stays the first one left out;
* a new mention that repeats the cut's sentence before the cut's place is such a new sentence: every distinct
  sentence placed before the old cut is a kept one, and the kept ones with the cut's sentence pass the budget, so
  the new cut is one of these candidates and nothing after the old cut is needed.

Places are (document source id, chunk position, chunk id, mention seq): the corpus order of ``merge``, which
does not depend on where the corpus lies.
"""

from __future__ import annotations

import hashlib
from typing import Any, cast

import pyarrow as pa

from schemas.tables import schema_for
from tasks.runtime.text import whole_texts
from tasks.runtime.tokens import count_tokens
from tasks.store.ids import normalize_name

#: named types win over the generic noun-phrase type when counts tie
TYPE_PRIORITY = [
    "person",
    "organization",
    "location",
    "event",
    "work",
    "technology",
    "group",
    "law",
    "language",
    "time",
    "concept",
]

#: where a mention is in the corpus: its document's source id, the chunk's position in it, the chunk, the mention's
#: place in the chunk's extraction output (the order of ``merge``'s place, the chunk's rank, then chunk id and seq)
MENTION_PLACE = ("source", "pos", "chunk_id", "seq")

#: the state's columns of kept sentences and of the cut, and the ``MENTION_PLACE`` column each comes from
KEPT = {"kept": "description", "kept_sources": "source", "kept_positions": "pos", "kept_chunks": "chunk_id"}
KEPT["kept_seqs"] = "seq"
CUT = {"cut": "description", "cut_source": "source", "cut_position": "pos", "cut_chunk": "chunk_id", "cut_seq": "seq"}
#: the state columns of an entity's frame, and of a relation's
ENTITY_STATE = ("names", "name_counts", "types", "type_counts", *KEPT, *CUT)
STATE = (*KEPT, *CUT, "hashes", "types", "type_counts")


def budgeted(frame, group: str, max_tokens: int, state: bool = False):
    """Per ``group``: its distinct descriptions in first-seen order, joined with spaces up to the first that would
    pass the token budget (the first is always kept), and how many distinct ones there are. ``frame`` is in
    corpus order. ``state``: with the description state too (``described``)."""
    import polars as pl

    distinct = (
        frame.select(group, "description", *(MENTION_PLACE if state else ()))
        .with_row_index("at")
        .unique([group, "description"], keep="first")
        .with_columns(pl.col("description").cast(pl.Utf8))
    )
    tokens = {t: count_tokens(t) for t in distinct.get_column("description").unique().to_list()}
    distinct = distinct.sort(group, "at").with_columns(
        n=pl.col("description").replace_strict(tokens, return_dtype=pl.Int64)
    )
    distinct = distinct.with_columns(
        used=pl.col("n").cum_sum().over(group), first=pl.int_range(pl.len()).over(group) == 0
    )
    keep = pl.col("first") | (pl.col("used") <= max_tokens)
    kept = distinct.filter(keep)
    # what a reader sees: the kept sentences whole, each once (``whole_texts``: a copy cut at a chunk's edge goes);
    # a function of the kept ones alone, so an update's row equals a build's (the state keeps every kept sentence)
    joined = (
        kept.group_by(group, maintain_order=True)
        .agg(pl.col("description"))
        .with_columns(pl.col("description").map_elements(_whole, return_dtype=pl.Utf8))
    )
    out = joined.join(distinct.group_by(group).agg(parts=pl.len()), on=group)
    return described(out, kept, distinct.filter(~keep), group) if state else out


def _whole(texts) -> str:
    return texts[0] if len(texts) == 1 else " ".join(whole_texts(list(texts)))


def pick_name(counts):
    """Each key's name and aliases, of its (key, name, n) counts. The name: of those written as the key (its
    ``normalize_name``; others came by an alias merge, ``tasks.index.aliases``), the most frequent; then not all
    capitals, no apostrophe, the shortest, the first in code point order. The aliases: the names written
    otherwise, a form each, most frequent first (an empty list where there are none)."""
    import polars as pl

    written = counts.get_column("name").unique().to_list()
    ranked = (
        counts.with_columns(
            norm=pl.col("name").replace_strict(dict(zip(written, map(normalize_name, written))), return_dtype=pl.Utf8)
        )
        .with_columns(
            own=pl.col("norm") == pl.col("key"),
            upper=(pl.col("name") == pl.col("name").str.to_uppercase())
            & (pl.col("name") != pl.col("name").str.to_lowercase()),
            apostrophe=pl.col("name").str.contains("['’]"),
            chars=pl.col("name").str.len_chars(),
        )
        .sort(
            "key",
            "own",
            "n",
            "upper",
            "apostrophe",
            "chars",
            "name",
            descending=[False, True, True, False, False, False, False],
        )
    )
    aliases = (  # a form per alias ("Scrooge", not "Scrooge's" and "SCROOGE" too): its most frequent
        ranked.filter(~pl.col("own"))
        .with_columns(total=pl.col("n").sum().over("key", "norm"))
        .sort(
            "key",
            "total",
            "norm",
            "n",
            "upper",
            "apostrophe",
            "name",
            descending=[False, True, False, True, False, False, False],
        )
        .unique(["key", "norm"], keep="first", maintain_order=True)
        .group_by("key", maintain_order=True)
        .agg(aliases="name")
    )
    return (
        ranked.unique("key", keep="first")
        .select("key", "name")
        .join(aliases, on="key", how="left")
        .with_columns(pl.col("aliases").fill_null(pl.lit([], pl.List(pl.Utf8))))
    )


def pick_type(counts):
    """Each key's type, of its (key, type, n) counts: the most frequent; then the first in ``TYPE_PRIORITY``."""
    import polars as pl

    rank = {t: i for i, t in enumerate(TYPE_PRIORITY)}
    return (
        counts.with_columns(rank=pl.col("type").replace_strict(rank, default=len(rank), return_dtype=pl.Int64))
        .sort("key", "n", "rank", "type", descending=[False, True, False, False])
        .unique("key", keep="first")
        .select("key", "type")
    )


def count_lists(counts, column: str):
    """(key, ``column``s, ``column``_counts) lists of (key, ``column``, n) counts, values in order."""
    return (
        counts.sort("key", column)
        .group_by("key", maintain_order=True)
        .agg(**{f"{column}s": column, f"{column}_counts": "n"})
    )


def label_counts(rels, group: str):
    """(``group``, type, n): the labels of relation mentions as "<id of the end it reads from> <label>", counted.
    ``rels`` holds ``group``, each mention's ``type`` (``mentions``: a label led by ">" or "<") and the ids of its
    key's first and second ends (``ida``, ``idb``)."""
    import polars as pl

    typed = pl.col("type").cast(pl.Utf8)
    end = pl.when(typed.str.starts_with(">")).then(pl.col("ida")).otherwise(pl.col("idb"))
    return (
        rels.filter(typed.is_not_null())
        .select(group, type=pl.concat_str(end, typed.str.slice(1), separator=" "))
        .group_by(group, "type")
        .agg(n=pl.len().cast(pl.Int64))
    )


#: the least share of a relation's distinct sentences that must make its label's statement: a strong co-occurrence
#: of which one sentence in thirty says something ("Scrooge hung before the Spirit") is not labelled by it
LABEL_SHARE = 1 / 3


def with_labels(frame, counts, group: str, weight, state: bool = False):
    """``frame`` (a row per ``group``) with each relation's ``label`` and ``label_from`` (null: none) of its
    ``label_counts``: the most frequent, then the first label in code point order (then end id) — an order of values,
    not of the corpus, so an update that adds mentions to a state's counts picks what all the mentions would — where
    its mentions are ``LABEL_SHARE`` of the relation's ``weight`` (an expression over ``frame``: its distinct
    sentences) or more. With ``state``, all the counts as the state's ``types`` and ``type_counts`` lists."""
    import polars as pl

    ends = pl.col("type").str.splitn(" ", 2).struct.rename_fields(["label_from", "label"])
    picked = (
        counts.with_columns(ends.alias("ends"))
        .unnest("ends")
        .sort(group, "n", "label", "label_from", descending=[False, True, False, False])
        .unique(group, keep="first", maintain_order=True)
        .select(group, "label", "label_from", "n")
    )
    held = pl.col("n") >= LABEL_SHARE * weight
    out = (
        frame.join(picked, on=group, how="left")
        .with_columns(label=pl.when(held).then(pl.col("label")), label_from=pl.when(held).then(pl.col("label_from")))
        .drop("n")
    )
    if not state:
        return out
    lists = count_lists(counts.rename({group: "key"}), "type").rename({"key": group})
    return out.join(lists, on=group, how="left").with_columns(
        types=pl.col("types").fill_null(pl.lit([], pl.List(pl.Utf8))),
        type_counts=pl.col("type_counts").fill_null(pl.lit([], pl.List(pl.Int64))),
    )


def text_hash(text: str) -> int:
    """A sentence's 64-bit hash, the same in every process and version (a relation's weight counts them)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def described(out, kept, left, group: str):
    """``out`` (``budgeted``'s rows) with the state of each ``group``: ``kept``, its kept sentences, and
    ``left``, those the budget left out (both in corpus order, with their places); a relation's (``group`` is
    "pair") hashes of all its distinct sentences."""
    import polars as pl

    def strings(c: str):
        return pl.col(c).cast(pl.Utf8)

    lists = kept.group_by(group, maintain_order=True).agg(**{k: strings(c) for k, c in KEPT.items()})
    cut = left.group_by(group, maintain_order=True).first().select(group, **{k: strings(c) for k, c in CUT.items()})
    out = out.join(lists, on=group, how="left").join(cut, on=group, how="left")
    if group != "pair":
        return out
    texts = pl.concat([kept.select(group, "description"), left.select(group, "description")])
    hashes = {t: text_hash(t) for t in texts.get_column("description").unique().to_list()}
    hashed = texts.with_columns(h=pl.col("description").replace_strict(hashes, return_dtype=pl.Int64))
    return out.join(hashed.group_by(group).agg(hashes=pl.col("h").unique().sort()), on=group, how="left")


def state_table(frame, kind: str) -> pa.Table:
    """``merge_state`` rows (version 0) of ``merge.entity_part`` / ``relation_part`` frames with state."""
    import polars as pl

    schema = schema_for("merge_state", 0)
    columns = []
    for f in schema:
        if f.name == "version":
            columns.append(pl.lit(0, pl.Int64).alias("version"))
        elif f.name == "kind":
            columns.append(pl.lit(kind, pl.Utf8).alias("kind"))
        elif f.name in frame.columns:
            columns.append(pl.col(f.name))
        else:  # an entity's hashes, a relation's names and types: not kept
            columns.append(pl.lit([], pl.List(pl.Utf8 if f.type == pa.list_(pa.string()) else pl.Int64)).alias(f.name))
    return frame.select(columns).to_arrow().cast(schema)


def _before():
    """Whether a mention's place comes before its key's cut (no cut: it does)."""
    import polars as pl

    out = None
    for c in reversed(MENTION_PLACE):  # lexicographic: a0 < b0, or a0 == b0 and the rest
        a, b = pl.col(c), pl.col(CUT_PLACE[c])
        out = (a < b) if out is None else (a < b) | ((a == b) & out)
    return pl.col("cut").is_null() | out


#: the cut's column of each ``MENTION_PLACE`` column
CUT_PLACE = {v: k for k, v in CUT.items() if k != "cut"}


def grow(state: pa.Table, new, group: str, max_tokens: int) -> Any:
    """Rows of the ``group`` values (entity keys, or relation pairs) whose ``new`` mentions (a polars frame:
    ``group``, description, name and type for entities, and the ``MENTION_PLACE`` columns) only add to their ``state``
    (``merge_state`` rows, their ``id`` renamed to ``group``; a value without one is new): a frame of ``group``,
    description, and the new state; with names and types (entities), or hashes and labels (relations: ``new`` holds
    ``label_counts``' columns too)."""
    import polars as pl

    old = cast(pl.DataFrame, pl.from_arrow(state)).rename({"id": group})  # a table gives a frame
    new = new.with_columns(pl.col(c).cast(pl.Utf8) for c in ("description", "source", "chunk_id"))
    cuts = old.select(group, *CUT)
    placed = new.join(cuts, on=group, how="left").with_columns(before=_before())
    kept = old.select(group, *KEPT).explode(list(KEPT)).rename(KEPT).drop_nulls("description")
    candidates = pl.concat([kept, placed.filter(pl.col("before")).select(kept.columns)]).sort(group, *MENTION_PLACE)
    rows = budgeted(candidates, group, max_tokens, state=True).drop("parts", "hashes", strict=False)
    # no candidate left out: the old cut is still the first sentence left out
    rows = rows.join(cuts.rename({c: f"old_{c}" for c in CUT}), on=group, how="left").with_columns(
        **{c: pl.when(pl.col("cut").is_null()).then(pl.col(f"old_{c}")).otherwise(pl.col(c)) for c in CUT}
    )
    rows = rows.drop([f"old_{c}" for c in CUT])
    if group == "pair":
        texts = new.get_column("description").unique().to_list()
        # joined, not ``replace_strict``: with no new sentence polars leaves the column a string column
        hashed = pl.DataFrame(
            {"description": texts, "h": [text_hash(t) for t in texts]}, schema={"description": pl.Utf8, "h": pl.Int64}
        )
        hashes = pl.concat(
            [
                old.select(group, "hashes").explode("hashes").rename({"hashes": "h"}),
                new.join(hashed, on="description").select(group, "h"),
            ]
        ).drop_nulls()
        rows = rows.join(hashes.group_by(group).agg(hashes=pl.col("h").unique().sort()), on=group)
        held = old.select(group, "types", "type_counts").explode(["types", "type_counts"])
        held = held.rename({"types": "type", "type_counts": "n"}).drop_nulls()
        labels = (
            pl.concat([held, label_counts(new, group).select(held.columns)])
            .group_by(group, "type")
            .agg(pl.col("n").sum())
        )
        return with_labels(rows, labels, group, pl.col("hashes").list.len(), state=True)
    counts = {}
    for c in ("name", "type"):
        held = old.select(group, f"{c}s", f"{c}_counts").explode([f"{c}s", f"{c}_counts"])
        held = held.rename({group: "key", f"{c}s": c, f"{c}_counts": "n"}).drop_nulls()
        fresh = new.group_by(group, c).agg(n=pl.len()).rename({group: "key"})
        fresh = fresh.with_columns(pl.col(c).cast(pl.Utf8), pl.col("n").cast(pl.Int64)).select(held.columns)
        counts[c] = pl.concat([held, fresh]).group_by("key", c).agg(pl.col("n").sum())
    entity = (
        pick_name(counts["name"])
        .join(pick_type(counts["type"]), on="key")
        .join(count_lists(counts["name"], "name"), on="key")
        .join(count_lists(counts["type"], "type"), on="key")
    )
    return rows.join(entity.rename({"key": group}), on=group)
