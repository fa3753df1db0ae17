"""Merge: raw mentions -> layer-0 ``entities`` and ``relations``.

Entity resolution by normalised name; the most frequent surface form and type win (ties
broken deterministically); descriptions are the distinct supporting sentences in corpus
order, kept within a token budget; relations are undirected (canonical endpoint order)
and weighted by the number of distinct supporting sentences.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from tasks.chunk import count_tokens
from tasks.ids import make_id, normalize_name

#: named types win over the generic noun-phrase type when counts tie
TYPE_PRIORITY = ["person", "organization", "location", "event", "work", "technology", "group", "law", "language", "time", "concept"]

DescriptionMerger = Callable[[str, list[str]], str]


def entity_id(layer: int, key: str) -> str:
    return make_id("ent", layer, key)


def relation_id(source_id: str, target_id: str, kind: str) -> str:
    return make_id("rel", source_id, target_id, kind)


def _pick(counter: Counter, priority: list[str] | None = None) -> str:
    rank = {t: i for i, t in enumerate(priority or [])}
    return min(counter, key=lambda v: (-counter[v], rank.get(v, len(rank)), v))


def _pick_name(counter: Counter) -> str:
    """Most frequent surface form; ties prefer normal casing over ALL CAPS, no possessive, then shortest."""
    return min(counter, key=lambda v: (-counter[v], v.isupper(), "'" in v or "’" in v, len(v), v))


def join_within_budget(parts: list[str], max_tokens: int) -> str:
    """Distinct parts in order, joined with spaces, stopping before the token budget is exceeded (at least one)."""
    out, used, seen = [], 0, set()
    for p in parts:
        if p in seen:
            continue
        seen.add(p)
        n = count_tokens(p)
        if out and used + n > max_tokens:
            break
        out.append(p)
        used += n
    return " ".join(out)


def extractive_merge(max_tokens: int) -> DescriptionMerger:
    return lambda _name, parts: join_within_budget(parts, max_tokens)


_DISAMBIGUATION = re.compile(r"\s*\([^()]*\)\s*$")
_FIRST_SENTENCE = re.compile(r"^(.{20,}?[.!?])(?:\s|$)", re.DOTALL)


def explicit_title(doc: dict[str, Any]) -> str | None:
    """A document's own title (JSONL/Parquet ``title``, Markdown heading), without a trailing
    disambiguation such as "(band)"; None when the title is only the file or record name."""
    title = (doc.get("title") or "").strip()
    source = doc.get("source_id") or ""
    if not title or title in (source, PurePath(source).stem):
        return None
    return _DISAMBIGUATION.sub("", title).strip() or title


def title_mentions(chunks: list[dict[str, Any]], documents: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """Document titles as entities: one mention of the title in every chunk of a titled document,
    described by the chunk's first sentence. A chunk elsewhere that names the same entity links to it."""
    titles = {d["id"]: explicit_title(d) for d in documents}
    out = []
    for c in chunks:
        title = titles.get(c["document_id"])
        if title and normalize_name(title):
            text = " ".join(c["text"].split())
            m = _FIRST_SENTENCE.match(text)
            sentence = (m.group(1) if m else text)[:max_chars]
            out.append({"name": title, "type": "concept", "description": sentence, "chunk_id": c["id"]})
    return out


def mention_rows(extracted_entities: list[dict[str, Any]], extracted_relations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Raw extraction output as ``mentions`` rows, numbered per chunk, in canonical (chunk id, seq) order."""
    rows: list[dict[str, Any]] = []
    seq: dict[str, int] = defaultdict(int)
    for e in extracted_entities:
        n = seq[e["chunk_id"]]
        seq[e["chunk_id"]] += 1
        rows.append({"id": make_id("m", e["chunk_id"], n), "chunk_id": e["chunk_id"], "seq": n, "kind": "entity",
                     "key": normalize_name(e["name"]), "name": e["name"], "target": None, "type": e["type"],
                     "description": e["description"], "weight": None})
    for r in extracted_relations:
        n = seq[r["chunk_id"]]
        seq[r["chunk_id"]] += 1
        a, b = sorted((normalize_name(r["source"]), normalize_name(r["target"])))
        rows.append({"id": make_id("m", r["chunk_id"], n), "chunk_id": r["chunk_id"], "seq": n, "kind": "relation",
                     "key": f"{a}|{b}", "name": r["source"], "target": r["target"], "type": None,
                     "description": r["description"], "weight": r.get("weight", 1.0)})
    rows.sort(key=lambda m: (m["chunk_id"], m["seq"]))
    return rows


def graph_from_mentions(mentions: list[dict[str, Any]], max_description_tokens: int, merge_descriptions=None):
    """Layer-0 entities and relations from mention rows (canonical order makes the result order-independent)."""
    ordered = sorted(mentions, key=lambda m: (m["chunk_id"], m["seq"]))
    ents = [{"name": m["name"], "type": m["type"], "description": m["description"], "chunk_id": m["chunk_id"]}
            for m in ordered if m["kind"] == "entity"]
    rels = [{"source": m["name"], "target": m["target"], "description": m["description"], "weight": m["weight"],
             "chunk_id": m["chunk_id"]} for m in ordered if m["kind"] == "relation"]
    return merge_graph(ents, rels, max_description_tokens, merge_descriptions)


def merge_graph(
    raw_entities: list[dict[str, Any]],
    raw_relations: list[dict[str, Any]],
    max_description_tokens: int,
    merge_descriptions: DescriptionMerger | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Resolve raw mentions into layer-0 entities and relations (inputs in corpus order)."""
    merge_descriptions = merge_descriptions or extractive_merge(max_description_tokens)
    names: dict[str, Counter] = defaultdict(Counter)
    types: dict[str, Counter] = defaultdict(Counter)
    descs: dict[str, list[str]] = defaultdict(list)
    chunks: dict[str, set[str]] = defaultdict(set)
    for e in raw_entities:
        key = normalize_name(e["name"])
        if not key:
            continue
        names[key][e["name"]] += 1
        types[key][e["type"]] += 1
        descs[key].append(e["description"])
        chunks[key].add(e["chunk_id"])

    ids = {key: entity_id(0, key) for key in names}
    rel_desc: dict[tuple[str, str], list[str]] = defaultdict(list)
    rel_chunks: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in raw_relations:
        a, b = normalize_name(r["source"]), normalize_name(r["target"])
        if a == b or a not in ids or b not in ids:
            continue
        pair = tuple(sorted((ids[a], ids[b])))
        rel_desc[pair].append(r["description"])
        rel_chunks[pair].add(r["chunk_id"])

    relations = []
    degree: Counter = Counter()
    for (src, tgt) in sorted(rel_desc):
        parts = rel_desc[(src, tgt)]
        relations.append(
            {
                "id": relation_id(src, tgt, "extracted"),
                "source_id": src,
                "target_id": tgt,
                "kind": "extracted",
                "description": join_within_budget(parts, max_description_tokens),
                "weight": float(len(set(parts))),
                "source_chunk_ids": sorted(rel_chunks[(src, tgt)]),
            }
        )
        degree[src] += 1
        degree[tgt] += 1

    entities = []
    for key in sorted(names):
        name = _pick_name(names[key])
        entities.append(
            {
                "id": ids[key],
                "name": name,
                "type": _pick(types[key], TYPE_PRIORITY),
                "description": merge_descriptions(name, descs[key]),
                "layer": 0,
                "source_chunk_ids": sorted(chunks[key]),
                "degree": degree[ids[key]],
            }
        )
    return entities, relations
