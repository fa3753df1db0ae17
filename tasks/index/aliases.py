"""Alias merges within a document: a surname, a first name or a titled form of a person's full name resolves to it.

A document (or each run of ``UNIT_CHUNKS`` chunks of a longer one: a *unit*) is where "Scrooge", "Mr. Scrooge" and
"Ebenezer Scrooge" are one person, as a reader takes them. The rule, deterministic and a function of the unit's
own mentions only (so an update, which extracts whole units, resolves them as a build does):

* a person's name is a key whose most frequent type in the unit is ``person``; its *core* is the name without a
  leading title (Mr, Mrs, Dr, Sir, ...); a *full name* is a person's name whose core has two words or more;
* a titled full name ("Mr. Ebenezer Scrooge") resolves to its core ("Ebenezer Scrooge") where the unit writes
  that too (so that every entity keeps a name written as its key);
* a one-word name (bare or titled: "Scrooge", "Mr. Scrooge", "Ebenezer"; not a rank: "Queen", "Uncle") resolves
  to the one full name of the unit whose first or last word it is, if there is exactly one such full name (two
  people sharing a surname, "Bob Cratchit" and "Martha Cratchit", leave "Cratchit" alone) and the two are named in
  one chunk at least (the text supports it: "Joe" in one scene and "Joe Miller" in another are not merged).

Names of the same word repeated ("Scrooge Scrooge") or holding a function word ("Satanic Rites of Dracula", a film
the parser typed as a person) are no full names. Possessives are already folded by ``normalize_name``. What was
merged stays visible: the entity keeps the names its mentions were written with (``entities.aliases``).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from tasks.index.merge_state import TYPE_PRIORITY
from tasks.store.ids import normalize_name

#: chunks of one document that resolve their names together (a longer document: each run of this many, by
#: position); an extraction task holds whole units (``tasks.index.chunk.regroup``)
UNIT_CHUNKS = 64

#: titles that do not make a name (a form with one resolves as its core does)
_TITLE = re.compile(r"^(?:mr|mrs|ms|mx|miss|dr|prof|professor|sir|dame|madam|madame|mme|mlle|messrs)\.?\s+")
#: words no person's full name holds: a title the parser typed as a person ("Satanic Rites of Dracula") is none
_NOT_IN_NAMES = frozenset("of the and in on for at to with from by a an".split())

#: words a parser takes for a person's name alone that name a rank, not one person ("Queen" is not "Queen Victoria"
#: wherever she is named)
RANKS = frozenset(
    "mr mrs ms miss dr sir dame madam lord lady king queen prince princess duke duchess emperor empress pope saint "
    "st president general captain colonel uncle aunt father mother brother sister".split()
)


def core(key: str) -> str:
    """A person's key without its leading titles."""
    while (shorter := _TITLE.sub("", key)) != key:
        key = shorter
    return key


def _types(mentions: Iterable[tuple[str, str, str]]) -> dict[str, str]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for _chunk, key, kind in mentions:
        counts[key][kind] += 1
    rank = {t: i for i, t in enumerate(TYPE_PRIORITY)}
    return {k: min(c.items(), key=lambda tc: (-tc[1], rank.get(tc[0], len(rank)), tc[0]))[0] for k, c in counts.items()}


def resolve(mentions: list[tuple[str, str, str]]) -> dict[str, str]:
    """The alias map of one unit: its entity mentions as (chunk id, key, type) -> {key: the key it resolves to},
    for the keys that resolve to another only."""
    kinds = _types(mentions)
    people = sorted(k for k, t in kinds.items() if t == "person" and core(k))
    chunks: dict[str, set[str]] = defaultdict(set)
    for chunk, key, _kind in mentions:
        chunks[key].add(chunk)
    out: dict[str, str] = {}
    # a full name -> the chunks it is named in (in any form); every name resolves to one written untitled, so the
    # entity keeps a name that is its key
    full = {
        k: set(chunks[k])
        for k in people
        if core(k) == k and 1 < len(k.split()) == len(set(k.split())) and not _NOT_IN_NAMES & set(k.split())
    }
    for k in people:
        if core(k) != k and core(k) in full:
            full[core(k)] |= chunks[k]
            out[k] = core(k)
    by_word: dict[str, list[str]] = defaultdict(list)
    for name in sorted(full):
        words = name.split()
        for w in {words[0], words[-1]}:
            by_word[w].append(name)
    for k in people:
        word = core(k).rstrip(".")
        if " " in word or word in RANKS or len(by_word.get(word, ())) != 1:
            continue
        name = by_word[word][0]
        if chunks[k] & full[name]:
            out[k] = name
    return out


def unit_of(document_id: str, chunk_index: int) -> tuple[str, int]:
    """The unit a chunk resolves its names in."""
    return document_id, chunk_index // UNIT_CHUNKS


def alias_maps(entities: Iterable[Mapping[str, Any]], chunks: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Raw entities (``name``, ``type``, ``chunk_id``) of whole units -> {chunk id: its unit's alias map} for the
    chunks whose unit resolves some name (``chunks``: their ``id``, ``document_id`` and ``chunk_index``)."""
    units = {c["id"]: unit_of(c["document_id"], c["chunk_index"]) for c in chunks}
    by_unit: dict[tuple[str, int], list[tuple[str, str, str]]] = defaultdict(list)
    for e in entities:
        by_unit[units[e["chunk_id"]]].append((e["chunk_id"], normalize_name(e["name"]), e["type"]))
    maps = {u: m for u, ms in by_unit.items() if (m := resolve(ms))}
    return {c: maps[u] for c, u in units.items() if u in maps}


def resolved(aliases: dict[str, dict[str, str]], chunk_id: str, key: str) -> str:
    """``key`` as a mention in chunk ``chunk_id`` resolves it (``aliases``: ``alias_maps``)."""
    return aliases[chunk_id].get(key, key) if chunk_id in aliases else key
