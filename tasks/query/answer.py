"""Answer generation from the three-level context (HiRAG Algorithm 2, line 18)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tasks.query.context import Context
from tasks.runtime.llm import run_sync

PROMPT_VERSION = "answer/1"


def answer_messages(ctx: Context) -> list[dict[str, str]]:
    return [
        {
            "role": "system",
            "content": (
                "You answer questions from the knowledge given: entity descriptions, community reports, reasoning "
                "paths between entities and source passages. Use only that knowledge; say so when it is not enough. "
                "Be concise."
            ),
        },
        {"role": "user", "content": f"{ctx.text()}\n\nQuestion: {ctx.question}\nAnswer:"},
    ]


def answer(ctx: Context, client=None, embed=None) -> dict[str, str]:
    """``{"kind": "llm"|"extractive", "text": ..., "note": ...}``; falls back to extractive when the LLM fails
    (``embed``: the question's embedder, which ranks the extractive answer's sentences). The method that owns the
    mode first ``refine``s the context with the LLM (ArchRAG's adaptive filtering)."""
    from tasks.methods.registry import method_of_mode

    if client is None or ctx.empty:
        return {"kind": "extractive", "text": extractive_answer(ctx, embed)}
    note = None
    method = method_of_mode(ctx.mode)
    if method is not None:
        try:
            ctx = method.refine(ctx, client)
        except Exception as exc:  # noqa: BLE001 - the unrefined context still answers
            note = f"{method.name} context refinement failed, whole context used: {type(exc).__name__}: {exc}"
    try:
        text = run_sync(client.complete(answer_messages(ctx), prompt_version=PROMPT_VERSION))
        return {"kind": "llm", "text": str(text).strip(), **({"note": note} if note else {})}
    except Exception as exc:  # noqa: BLE001
        return {
            "kind": "extractive",
            "text": extractive_answer(ctx, embed),
            "note": f"LLM answer failed: {type(exc).__name__}: {exc}",
        }


# ---------------------------------------------------------------------------- extractive answer
_WORD = re.compile(r"[a-z0-9]+")


_TOKEN = re.compile(r"[A-Za-z0-9][\w'-]*")


_STOP = set(
    "the a an of in on at to for and or is was were are be by with from as that this which who what when where how why did does do".split()
)


def answer_candidates(ctx: Context, limit: int | None = None) -> list[tuple[str, str]]:
    """(sentence, its source's title) for every sentence of the context's sources (``split_sentences``: whole
    sentences, abbreviations and initials kept), in context order, without repeats. Entity descriptions, reports
    and reasoning paths are left out: they are stitched from many places (a path's "X belongs to Y / Z" answers
    nothing; taking them lowered the hit rate from 0.28 to 0.23 on MuSiQue's subset, docs/benchmarks.md, "The offline answer").
    With ``limit``, the sources are split only until that many are found (segmentation is the costly part)."""
    out: dict[str, str] = {}
    for c in ctx.chunks:
        if limit is not None and len(out) >= limit:
            break
        label = c.get("title") or c.get("document_id") or ""
        for s in chunk_sentences(c["text"], c.get("title")):
            out.setdefault(s, label)
    return list(out.items())[:limit]


def chunk_sentences(text: str, title: str | None) -> list[str]:
    """A source's candidate sentences: those of its text past its title line, longer than 20 characters."""
    return [s for s in source_sentences(text.removeprefix(f"[{title}] ")) if len(s) > 20]


@functools.lru_cache(maxsize=2048)
def source_sentences(text: str) -> tuple[str, ...]:
    """``split_sentences`` of a source, kept for the next question it answers: pySBD builds a regular expression per
    abbreviation it meets, past what Python's pattern cache holds, so a warm query spent half its time (~45 ms of
    ~90 on MuSiQue) splitting the same sources again."""
    from tasks.runtime.text import split_sentences

    return tuple(split_sentences(text))


#: candidates scored, in context order (the sources' ranking first): embedding them is the answer's cost
MAX_CANDIDATES = 32


#: added to a second sentence that names something the first names and the question does not (the next hop)
CHAIN_BONUS = 0.6


#: the offline answer's length at most: two sentences, this many words (a longer first sentence is cut)
MAX_WORDS = 60


#: below this cosine between the question and its best sentence, the index holds no answer (``NOT_FOUND``). Chosen
#: on MuSiQue's subset: its answerable questions' best sentences score 0.38 at least; its questions asked of the
#: Christmas Carol index (nothing to find there) 0.14 at the median, 0.30 or more for 13 of 200 (two budgets)
NO_ANSWER_BELOW = 0.30


NOT_FOUND = "The index holds no answer to this question: no source sentence is close to it."


#: added to a sentence that holds something of the kind the question asks for and it does not name: a date for
#: "when" / "what year", a number for "how many", else a capitalised word (not a title like "Mrs")
KIND_BONUS = 0.1


_KIND_DATE = re.compile(r"\bwhen\b|\b(?:what|which) (?:year|date|decade|century|month|day)\b")
_KIND_NUMBER = re.compile(
    r"\bhow (?:many|much|old|tall|far|long|big|large|high)\b|\bwhat (?:number|percentage|amount)\b"
)
_DATE = re.compile(
    r"\b(?:1\d{3}|20\d{2})\b|\b(?:January|February|March|April|May|June|July|August|September|October|November|December)\b"
)
_NUMBER = re.compile(r"\b\d[\d,.]*\b")
_CAPITAL = re.compile(r"\b[A-Z][\w'-]+")
_TITLES = set("mr mrs ms miss dr sir lady lord st mister madam master".split())


def answer_kind(question: str) -> re.Pattern[str]:
    """What the question asks for, as the pattern of its answer: a date, a number, or a name."""
    q = question.lower()
    return _DATE if _KIND_DATE.search(q) else _NUMBER if _KIND_NUMBER.search(q) else _CAPITAL


def known_words(known: str) -> set[str]:
    """The words ``holds_new`` does not count as new: those of ``known`` (the question, the sentence before), titles
    and words that are not names."""
    return {w.lower() for w in _TOKEN.findall(known)} | _TITLES | _NOT_NAMES


def holds_new(sentence: str, kind: re.Pattern[str], seen: set[str]) -> bool:
    """Whether ``sentence`` holds something of ``kind`` outside ``seen`` (``known_words``)."""
    return any(m.group(0).lower() not in seen for m in kind.finditer(sentence))


_NAME = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of|the|de|van|von)?\s*[A-Z][\w'-]*)*")


_NOT_NAMES = _STOP | set("he she it they his her its their there these those i we you but if then".split())


def _names(text: str) -> set[str]:
    return {n.lower() for n in _NAME.findall(text)} - _NOT_NAMES


def _scores(question: str, texts: list[str], vecs: np.ndarray | None, embed) -> np.ndarray:
    """Cosine of each text's vector (``vecs``, unit rows) to ``question``'s; without an embedder the share of the
    question's words (stop words aside) each text holds."""
    if vecs is not None:
        q = np.asarray(embed([question])[0], dtype=np.float32)
        return vecs @ (q / max(float(np.linalg.norm(q)), 1e-12))
    qwords = {w for w in _WORD.findall(question.lower()) if w not in _STOP}
    return np.asarray([len(qwords & set(_WORD.findall(t.lower()))) / max(len(qwords), 1) for t in texts])


def best_sentences(
    ctx: Context, embed: Callable[[list[str]], np.ndarray] | None = None, k: int = 2, max_words: int = MAX_WORDS
) -> list[tuple[str, str]]:
    """The sentences, with their sources, that answer the question; empty when none is close enough
    (``NO_ANSWER_BELOW``). Of the first ``MAX_CANDIDATES`` candidates (``answer_candidates``):

    1. the first: the most similar to the question (cosine with ``embed``, the question's embedder; without it,
       the share of the question's words each holds), plus ``KIND_BONUS`` where it holds something of the kind the
       question asks for that the question does not name (``answer_kind``);
    2. the second, a multi-hop answer's next step: the most similar to what the first leaves open — the question's
       words the first does not hold, with the names the first adds (one more text embedded) — plus
       ``CHAIN_BONUS`` where it names what the first names beyond the question, and ``KIND_BONUS`` for an answer
       of the asked kind that neither names. It is taken only where both fit in ``max_words``; a longer first
       sentence is cut there.

    Ties: earlier first. Chosen on MuSiQue's subset (docs/benchmarks.md, "The offline answer"): the second hop's own query
    raised the gold answer's share 0.28 -> 0.33 at 1,000 tokens; the kind bonus kept it (0.36 -> 0.37 at 4,000);
    several first sentences tried in pairs, or weighting names by rarity, did not help."""
    cands = answer_candidates(ctx, MAX_CANDIDATES)
    question = ctx.question
    if not cands or not {w for w in _WORD.findall(question.lower()) if w not in _STOP}:
        return []
    texts = [s for s, _ in cands]
    vecs = None
    if embed is not None and ctx.query_vector is not None:
        vecs = np.asarray(embed(texts), dtype=np.float32)
        vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        q = np.asarray(ctx.query_vector, dtype=np.float32)
        similarity = vecs @ (q / max(float(np.linalg.norm(q)), 1e-12))
    else:
        similarity = _scores(question, texts, None, None)
    if similarity.max() < (NO_ANSWER_BELOW if vecs is not None else 1e-9):
        return []
    kind = answer_kind(question)
    seen = known_words(question)
    score = similarity + KIND_BONUS * np.asarray([holds_new(t, kind, seen) for t in texts])
    order = np.arange(len(cands))
    first = int(np.lexsort((order, -score))[0])
    words = [len(t.split()) for t in texts]
    chosen = [first]
    if k > 1:
        held = {w.lower() for w in _TOKEN.findall(texts[first])}
        hop = _names(texts[first]) - _names(question)
        rest = " ".join([w for w in _TOKEN.findall(question) if w.lower() not in held] + sorted(hop))
        nxt = _scores(rest.strip() or question, texts, vecs, embed)
        seen = known_words(f"{question} {texts[first]}")
        nxt = nxt + np.asarray(
            [CHAIN_BONUS * bool(hop & _names(t)) + KIND_BONUS * holds_new(t, kind, seen) for t in texts]
        )
        nxt[first] = -np.inf
        fits = [int(i) for i in np.lexsort((order, -nxt)) if i != first and words[first] + words[i] <= max_words]
        chosen += [i for i in fits[: k - 1] if nxt[i] > 0]
    out = [cands[i] for i in chosen]
    if words[first] > max_words:
        out[0] = (" ".join(texts[first].split()[:max_words]) + " …", out[0][1])
    return out


#: the offline answer's sentence vectors a reader remembers at least (``SentenceVectors``)
SENTENCE_CACHE = 20_000


class SentenceVectors:
    """``embed`` remembering the vectors of the last ``size`` texts it embedded (least recently used first out;
    None: all of them), safe across threads: the offline answer's candidates come from the same sources question
    after question, and embedding them was most of a query's CPU (~0.3 s of ~0.33 s on two cores)."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray], size: int | None = SENTENCE_CACHE):
        from collections import OrderedDict
        from threading import Lock

        self.embed, self.size = embed, size
        self.seen: OrderedDict[str, np.ndarray] = OrderedDict()
        self.lock = Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self.lock:
            new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        found = dict(zip(new, self.embed(new))) if new else {}  # the model runs outside the lock
        with self.lock:
            for t in texts:
                if t in self.seen:
                    self.seen.move_to_end(t)
                    found.setdefault(t, self.seen[t])
            self.seen.update(found)
            while self.size is not None and len(self.seen) > self.size:
                self.seen.popitem(last=False)
        return np.stack([found[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)

    def save(self, path: Path, model: str) -> None:
        """Write the vectors held (for ``load`` by the next process), aside and moved into place (``write_aside``); a
        read-only or full disk leaves the previous file."""
        import pickle

        from tasks.query.view import write_aside

        with self.lock:
            texts = list(self.seen)
            matrix = np.stack([self.seen[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)
        saved = {"model": model, "texts": texts, "vectors": matrix}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_aside(path, lambda fh: pickle.dump(saved, fh, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass

    def load(self, path: Path, model: str) -> int:
        """Take the vectors a previous process saved with the same ``model`` (none from a missing, damaged or other
        model's file); returns how many."""
        import pickle

        try:
            with open(path, "rb") as fh:
                saved = pickle.load(fh)
            texts, matrix = saved["texts"], np.asarray(saved["vectors"], dtype=np.float32)
            if saved.get("model") != model or len(texts) != len(matrix):
                return 0
        except Exception:  # noqa: BLE001 - a damaged or partial file: embedded again
            return 0
        with self.lock:
            for t, v in zip(texts[-self.size :] if self.size else texts, matrix[-self.size :] if self.size else matrix):
                self.seen[t] = v
        return len(texts)


def warm_sentences(view, vectors: SentenceVectors, limit: int, batch: int = 256) -> int:
    """The candidate sentences of the snapshot's sources (``chunk_sentences``, the chunks in the view's order) into
    ``vectors``, up to ``limit`` sentences, ``batch`` at a time: a question's first sight of a source then costs no
    embedding (~0.2 s of CPU on two cores for a cold query's 32 candidates). Returns the sentences held."""
    todo: list[str] = []
    seen: set[str] = set()
    for text, doc in zip(view.chunk_text, view.chunk_doc):
        for s in chunk_sentences(text, view.doc_title.get(doc)):
            if len(seen) >= limit:
                break
            if s not in seen:
                seen.add(s)
                todo.append(s)
        if len(seen) >= limit:
            break
    with vectors.lock:
        todo = [t for t in todo if t not in vectors.seen]
    for at in range(0, len(todo), batch):
        vectors(todo[at : at + batch])
    return len(seen)


def warm_saved(view, vectors: SentenceVectors, limit: int, path: Path, model: str) -> tuple[int, int]:
    """``warm_sentences`` starting from the vectors saved at ``path`` (for ``model``), saved again when it added
    any; one process at a time (a service's workers start together: the first embeds, the others read what it
    saved). Returns (the sentences held, the vectors read)."""
    from tasks.store.locks import file_lock

    with file_lock(path.with_suffix(".lock")):
        had = vectors.load(path, model)
        held = warm_sentences(view, vectors, limit)
        if len(vectors.seen) != had:
            vectors.save(path, model)
    return held, had


def extractive_answer(ctx: Context, embed: Callable[[list[str]], np.ndarray] | None = None, k: int = 2) -> str:
    """Without an LLM: the sentences of the sources that answer the question (``best_sentences``), each with its
    source; ``NOT_FOUND`` when the context holds something but no sentence close to the question, and nothing for
    an empty context (its message says why)."""
    found = best_sentences(ctx, embed, k)
    if not found:
        return "" if ctx.empty else NOT_FOUND
    return " ".join(f"{s} ({label})" if label else s for s, label in found)
