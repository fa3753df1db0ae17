"""What an estimate expects extraction to find, before it runs: the things each chunk names — a model's, read from
the text as a model lists names (``named``, ``model_mentions``), or the offline extractor's, found by running it
(``offline_mentions``) — and how many distinct things a corpus names, the unit the stated ratios of
``tasks.index.llm_estimate`` are per (``names_in``, ``offline_entities``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from typing import Any

from schemas.sections import ExtractConfig
from tasks.runtime.text import split_sentences
from tasks.store.ids import normalize_name

_NAME = re.compile(r"\b[A-Z][\w'’-]*(?:\s+(?:of\s+|the\s+)?[A-Z][\w'’-]*)*")
_NOT_NAMES = frozenset(
    "a an and as at but by for from he her his i if in it its my no not of on or our she so that the their then "
    "there these they this those to we what when with you your".split()
)


def offline_mentions(
    chunks: Iterable[dict[str, Any]], cfg: ExtractConfig, batch: int = 64
) -> Iterator[tuple[str, list[tuple[str, str, str]], list[tuple[str, str]]]]:
    """What the offline extractor (``cfg``: the run's ``ExtractConfig``) finds in ``chunks`` (``{id, text, title,
    document_id, chunk_index}``, each document's together and in order), a chunk at a time: its id, in order each
    (resolution key, name, description) of a thing it names or of its document's title, and the (key, key) pairs
    of the relations it extracts, keys as merge resolves them (aliases merged within a unit,
    ``tasks.index.aliases``). ``batch`` chunks or so are held at a time."""
    from tasks.index.aliases import alias_maps, resolved, unit_of
    from tasks.index.extract import extract_batch
    from tasks.index.merge import title_mentions

    def place(c: dict[str, Any]) -> tuple[str, int]:
        return unit_of(c["document_id"], c["chunk_index"])

    def whole_units() -> Iterator[list[dict[str, Any]]]:
        pending: list[dict[str, Any]] = []
        for _unit, rows in itertools.groupby(chunks, key=place):
            if len(pending) >= batch:
                yield pending
                pending = []
            pending += rows
        if pending:
            yield pending

    for pending in whole_units():
        found = extract_batch(pending, cfg)
        ok = set(found.ok)
        named = [*found.entities, *title_mentions([c for c in pending if c["id"] in ok], cfg.max_sentence_chars)]
        aliases = alias_maps(named, pending)
        by_chunk: dict[str, list[tuple[str, str, str]]] = {c["id"]: [] for c in pending}
        pairs: dict[str, list[tuple[str, str]]] = {c["id"]: [] for c in pending}
        for e in named:
            key = resolved(aliases, e["chunk_id"], normalize_name(e["name"]))
            by_chunk[e["chunk_id"]].append((key, e["name"], e.get("description") or ""))
        for r in found.relations:
            source, target = (resolved(aliases, r["chunk_id"], normalize_name(r[end])) for end in ("source", "target"))
            pairs[r["chunk_id"]].append((source, target))
        for cid, mentions in by_chunk.items():
            yield cid, mentions, pairs[cid]


def offline_entities(chunks: Iterable[dict[str, Any]], cfg: ExtractConfig, batch: int = 64) -> int:
    """How many layer-0 entities a build of ``chunks`` has with the offline extractor: the distinct resolution keys
    of what it finds and of the documents' titles (``offline_mentions``). Summaries and reports are made from this
    graph, and their prompts scale with it rather than with the corpus's tokens (narrative text names fewer things
    per token than encyclopedic passages: docs/benchmarks.md)."""
    return len({key for _, found, _ in offline_mentions(chunks, cfg, batch) for key, _, _ in found} - {""})


def model_mentions(text: str) -> list[tuple[str, str, str]]:
    """What a model would list of ``text`` (``named``), in order, each as (resolution key, name, the sentence that
    names it: what a model writes of it)."""
    sentences = split_sentences(text)
    return [(normalize_name(n), n, next((s for s in sentences if n in s), text)) for n in named(text)]


def named(text: str) -> list[str]:
    """The things ``text`` names, as written, each once in the order they come: runs of capitalised words that are
    not a sentence's function word (what a model lists first). A word capitalised only where a sentence, a line or
    an item opens ("While", "Please", "Adding") is no name and is dropped from the head of a run ("While Scrooge"),
    nor is a single letter; an acronym is one ("LLM")."""
    mid = {m.group(0) for m in _WORD.finditer(text) if not _opens(text, m.start())}
    out = []
    for m in _NAME.finditer(text):
        words = m.group(0).split()
        if _opens(text, m.start()) and words[0] not in mid:
            words = words[1:]
        name = " ".join(words)
        if not name or name.lower() in _NOT_NAMES:
            continue
        if len(words) > 1 or (len(name) > 1 and (name in mid or (name.isupper() and name.isalpha()))):
            out.append(name)
    return list(dict.fromkeys(out))


_WORD = re.compile(r"\b[A-Z][\w'’-]*")


def _opens(text: str, at: int) -> bool:
    """Whether a sentence, a line or a list item opens at ``at`` (quotes and brackets before it aside)."""
    before = text[max(0, at - 12) : at].rstrip(" \t\"'“‘(")
    return not before or before[-1] in ".!?:\n-*#>"


def names_in(text: str) -> set[str]:
    """The capitalised runs of ``text`` that are not a sentence's function word, case-folded: how many things a
    chunk names, the unit the stated ratios are per (``DEFAULT_RATIOS``; ``named`` is what a model would list of
    them)."""
    return {n for m in _NAME.finditer(text) if (n := m.group(0).lower()) not in _NOT_NAMES}
