"""Answer generation from the three-level context (HiRAG Algorithm 2, line 18)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from schemas.config import EmbeddingConfig
from schemas.prompts import PromptSet
from tasks.index.embed import question_embedder
from tasks.query.candidates import MAX_CANDIDATES, STOP_WORDS, WORD, answer_candidates, chunk_sentences, preselect
from tasks.retrieval.context import Context
from tasks.runtime.llm import run_sync
from tasks.store.locks import file_lock


def answer_messages(ctx: Context, prompts: PromptSet) -> list[dict[str, str]]:
    return prompts["answer"].messages(context=ctx.text(), question=ctx.question)


def answer(ctx: Context, client=None, tokens=None) -> dict[str, str]:
    """``{"kind": "llm"|"extractive", "text": ..., "note": ...}``; falls back to extractive when the LLM fails
    (``tokens``: a ``TokenVectors``, which ranks the extractive answer's sentences). The method that owns the
    mode first ``refine``s the context with the LLM (ArchRAG's adaptive filtering)."""
    from tasks.methods.registry import method_of_mode

    if client is None or ctx.empty:
        return {"kind": "extractive", "text": extractive_answer(ctx, tokens)}
    note = None
    method = method_of_mode(ctx.mode)
    if method is not None:
        try:
            ctx = method.refine(ctx, client)
        except Exception as exc:  # noqa: BLE001 - the unrefined context still answers
            note = f"{method.name} context refinement failed, whole context used: {type(exc).__name__}: {exc}"
    try:
        prompts = client.prompts
        text = run_sync(client.complete(answer_messages(ctx, prompts), prompt_version=prompts["answer"].version))
        return {"kind": "llm", "text": str(text).strip(), **({"note": note} if note else {})}
    except Exception as exc:  # noqa: BLE001
        return {
            "kind": "extractive",
            "text": extractive_answer(ctx, tokens),
            "note": f"LLM answer failed: {type(exc).__name__}: {exc}",
        }


# ---------------------------------------------------------------------------- extractive answer
_TOKEN = re.compile(r"[A-Za-z0-9][\w'-]*")


#: added to a second sentence that names something the first names and the question does not (the next hop)
CHAIN_BONUS = 0.6


#: the offline answer's length at most: two sentences, this many words (a longer first sentence is cut)
MAX_WORDS = 60


#: below this score between the question and its best sentence (``late_scores``), or between what the question names
#: and every candidate and title (``names_found``), the index holds no answer (``NOT_FOUND``). Chosen on MuSiQue's
#: subset: its answerable questions' best sentences score 0.357 at least, and 2 of 200 miss the names; its questions
#: asked of the Christmas Carol index score 0.20 at the median, and 10 of 215 pass both (docs/benchmarks.md)
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


_ASKED = re.compile(r"\b(?:what|which|when|who|whom|whose|where|how|why)\b")


def answer_kind(question: str) -> re.Pattern[str]:
    """What the question asks for, as the pattern of its answer: a date, a number, or a name, read from its first
    question word on ("What did he see when he came home?" asks for a thing, not a date)."""
    q = question.lower()
    asked = _ASKED.search(q)
    q = q[asked.start() :] if asked else q
    return _DATE if _KIND_DATE.match(q) else _NUMBER if _KIND_NUMBER.match(q) else _CAPITAL


def known_words(known: str) -> set[str]:
    """The words ``holds_new`` does not count as new: those of ``known`` (the question, the sentence before), titles
    and words that are not names."""
    return {w.lower() for w in _TOKEN.findall(known)} | _TITLES | _NOT_NAMES


def holds_new(sentence: str, kind: re.Pattern[str], seen: set[str]) -> bool:
    """Whether ``sentence`` holds something of ``kind`` outside ``seen`` (``known_words``)."""
    return any(m.group(0).lower() not in seen for m in kind.finditer(sentence))


_NAME = re.compile(r"\b[A-Z][\w'-]*(?:\s+(?:of|the|de|van|von)?\s*[A-Z][\w'-]*)*")


_NOT_NAMES = STOP_WORDS | set("he she it they his her its their there these those i we you but if then".split())


def _names(text: str) -> set[str]:
    return {n.lower() for n in _NAME.findall(text)} - _NOT_NAMES


#: added to the second sentence's score: this share of its score against the whole question (the first hop's names
#: stay in view of the second)
QUESTION_SHARE = 0.5


#: where two sentences pass ``MAX_WORDS``, the first keeps at least this many words (a window of it; the second
#: takes the rest)
MIN_FIRST_WORDS = 20


#: word pieces a question and a sentence are not compared on, with punctuation: stop words and the words questions
#: are phrased with ("what is the name / term / kind of")
_SKIP = STOP_WORDS | set("name called term kind type".split())


Pieces = tuple[np.ndarray, np.ndarray, np.ndarray]  # word-piece ids, their vectors as int8, each one's scale


Stack = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # lengths, float32 pieces, piece ids, texts holding each


def stacked(texts: list[Pieces]) -> Stack:
    """``texts``' pieces as one float32 matrix with each text's length, and how many texts hold each piece id: what
    ``late_scores`` needs of them, computed once for several queries."""
    lens = np.asarray([len(t[0]) for t in texts], dtype=np.int64)
    if not lens.any():
        return lens, np.zeros((0, 0), np.float32), np.zeros(0, np.int32), np.zeros(0, np.int64)
    pieces = np.concatenate([t[1] for t in texts]).astype(np.float32) * np.concatenate([t[2] for t in texts])[:, None]
    each = np.unique(
        np.repeat(np.arange(len(texts), dtype=np.int64), lens) << 32 | np.concatenate([t[0] for t in texts])
    )
    ids, df = np.unique(each & 0xFFFFFFFF, return_counts=True)  # (text, piece) pairs once each, then per piece
    return lens, pieces, ids, df


def late_scores(query: Pieces, texts: list[Pieces], stack: Stack | None = None) -> np.ndarray:
    """Each text's late-interaction score against ``query`` (ColBERT's MaxSim on MiniLM's word pieces): for each
    of the query's pieces its closest piece in the text (cosine), averaged with weights by rarity among ``texts``
    (ln((n + 1) / (df + 1)) + 1; ``stack``: ``stacked(texts)``, when it is at hand). Pieces keep what a mean-pooled
    sentence vector blurs — the relation a question asks for beside the name it asks about: on MuSiQue's subset the
    sentence holding the answer was the best sentence for 0.14 of the questions against 0.12 by cosine, one of the
    best two for 0.30 against 0.17."""
    lens, pieces, ids, df = stack if stack is not None else stacked(texts)
    qids, qv, qs = query
    out = np.zeros(len(lens))
    if not len(qids) or not lens.any():
        return out
    at = np.minimum(np.searchsorted(ids, qids), len(ids) - 1)
    weight = np.log((len(lens) + 1) / (np.where(ids[at] == qids, df[at], 0) + 1.0)) + 1.0
    # einsum, not a BLAS product: OpenBLAS would run this small product on every core and then keep them spinning,
    # CPU spent on threads that only wait
    sims = np.einsum("ij,kj->ik", qv.astype(np.float32) * qs[:, None], pieces)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    held = lens > 0
    out[held] = (weight / weight.sum()) @ np.maximum.reduceat(sims, starts[held], axis=1)
    return out


def _word_share(question: str, texts: list[str]) -> np.ndarray:
    """Without a model: the share of the question's words (stop words aside) each text holds."""
    qwords = {w for w in WORD.findall(question.lower()) if w not in STOP_WORDS}
    return np.asarray([len(qwords & set(WORD.findall(t.lower()))) / max(len(qwords), 1) for t in texts])


def only(pieces: Pieces, ids: np.ndarray) -> Pieces:
    """The pieces whose ids are among ``ids``."""
    keep = np.isin(pieces[0], ids)
    return pieces[0][keep], pieces[1][keep], pieces[2][keep]


def names_found(named: Pieces, pieces: list[Pieces], stack: Stack, titles: Callable[[], list[Pieces]]) -> bool:
    """Whether the candidates (``pieces``, ``stack``: ``stacked(pieces)``) or their sources' titles (``titles()``,
    asked for only when no candidate does) come close (``NO_ANSWER_BELOW``) to what the question names (``named``:
    the pieces of its capitalised names; True where it names none): a sentence that shares only the relation asked
    about ("the capital" of a face) answers nothing."""
    if not len(named[0]) or late_scores(named, pieces, stack).max() >= NO_ANSWER_BELOW:
        return True
    found = titles()
    return bool(found) and bool(late_scores(named, found).max() >= NO_ANSWER_BELOW)


def window(text: str, keys: set[str], words: int) -> str:
    """``text`` cut to ``words`` words where it holds the most of ``keys`` (a word counts when its first five letters
    are a key's), earliest first; each cut marked with an ellipsis."""
    ws = text.split()
    if len(ws) <= words:
        return text
    stems = {k[:5] for k in keys}
    hits = np.cumsum([0] + [re.sub(r"\W", "", w.lower())[:5] in stems for w in ws])
    start = int(np.argmax(hits[words:] - hits[: len(ws) - words + 1]))
    return ("… " if start else "") + " ".join(ws[start : start + words]) + (" …" if start + words < len(ws) else "")


def best_sentences(
    ctx: Context, tokens: TokenVectors | None = None, k: int = 2, max_words: int = MAX_WORDS
) -> list[tuple[str, str]]:
    """The sentences, with their sources, that answer the question; empty when none is close enough
    (``NO_ANSWER_BELOW``). Of ``MAX_CANDIDATES`` candidates (``answer_candidates``, ``preselect``):

    1. the first: the best by ``late_scores`` against the question (``tokens``: ``TokenVectors``; without it, the
       share of the question's words each holds), plus ``KIND_BONUS`` where it holds something of the kind the
       question asks for that the question does not name (``answer_kind``);
    2. the second, a multi-hop answer's next step: the best against what the first leaves open — the question's
       words the first does not hold, with the names the first adds — plus ``QUESTION_SHARE`` of its score against
       the question, ``CHAIN_BONUS`` where it names what the first names beyond the question, and ``KIND_BONUS``
       for an answer of the asked kind that neither names.

    Where the two pass ``max_words``, each is cut to a window (``window``) holding the most of the words it was
    chosen for: the first keeps at least ``MIN_FIRST_WORDS``, the second the rest. Ties: earlier first. Chosen on
    MuSiQue's subset (docs/benchmarks.md, "The offline answer, third version"): late interaction and the windows
    raised the gold answer's share from 0.32 / 0.35 to 0.40 / 0.41 (`hi`, 1,000 / 4,000 tokens)."""
    question = ctx.question
    cands = preselect(question, answer_candidates(ctx), MAX_CANDIDATES)
    qwords = {w for w in WORD.findall(question.lower()) if w not in STOP_WORDS}
    if not cands or not qwords:
        return []
    texts = [s for s, _ in cands]
    if tokens is not None:
        pieces = tokens(texts)
        asked, stack = tokens([question])[0], stacked(pieces)
        similarity = late_scores(asked, pieces, stack)
        named = only(asked, tokens.ids_of(" ".join(sorted(_names(question)))))
        titles = sorted({label for _, label in cands if label})
        if similarity.max() < NO_ANSWER_BELOW or not names_found(named, pieces, stack, lambda: tokens(titles)):
            return []
    else:
        similarity = _word_share(question, texts)
        if similarity.max() <= 0:
            return []
    kind = answer_kind(question)
    seen = known_words(question)
    score = similarity + KIND_BONUS * np.asarray([holds_new(t, kind, seen) for t in texts])
    order = np.arange(len(cands))
    first = int(np.lexsort((order, -score))[0])
    words = [len(t.split()) for t in texts]
    chosen, rest = [first], question
    if k > 1:
        held = {w.lower() for w in _TOKEN.findall(texts[first])}
        hop = _names(texts[first]) - _names(question)
        rest = " ".join([w for w in _TOKEN.findall(question) if w.lower() not in held] + sorted(hop)).strip() or rest
        # embedded as a text of its own: the question's and the first sentence's pieces of those words, taken from
        # them, found the gold answer less often (0.37 against 0.40 on MuSiQue's subset, `hi` at 1,000 tokens)
        nxt = late_scores(tokens([rest])[0], pieces, stack) if tokens is not None else _word_share(rest, texts)
        seen = known_words(f"{question} {texts[first]}")
        nxt = nxt + QUESTION_SHARE * similarity
        nxt += np.asarray([CHAIN_BONUS * bool(hop & _names(t)) + KIND_BONUS * holds_new(t, kind, seen) for t in texts])
        nxt[first] = -np.inf
        chosen += [int(i) for i in np.lexsort((order, -nxt))[: k - 1] if int(i) != first and nxt[i] > 0]
    keys = [{w.lower() for w in _TOKEN.findall(q)} - STOP_WORDS for q in (question, rest)]
    if sum(words[i] for i in chosen) <= max_words:
        return [cands[i] for i in chosen]
    if len(chosen) == 1:
        return [(window(texts[first], keys[0], max_words), cands[first][1])]
    a, b = words[first], words[chosen[1]]
    head = min(a, max(max_words - b, MIN_FIRST_WORDS))
    return [
        (window(texts[first], keys[0], head), cands[first][1]),
        (window(texts[chosen[1]], keys[1], max_words - head), cands[chosen[1]][1]),
    ]


#: the offline answer's sentences whose word pieces a reader remembers at least (``TokenVectors``)
SENTENCE_CACHE = 10_000


class TokenVectors:
    """The content word pieces of texts with their vectors (``LocalEmbedder.token_vectors``; stop words and
    punctuation left out, ``_SKIP``; int8 with a scale per piece: a quarter of float32's memory, cosines within
    ~0.01), remembering the last ``size`` texts (least recently used first out; None: all of them), safe across
    threads: the offline answer's candidates come from the same sources question after question, and embedding them
    was most of a query's CPU (~0.3 s of ~0.33 s on two cores). ~7 KB a sentence."""

    def __init__(self, embedder, size: int | None = SENTENCE_CACHE):
        from collections import OrderedDict
        from threading import Lock

        self.embedder, self.size = embedder, size
        vocab = embedder.vocabulary()
        self.skip = np.asarray(
            sorted(i for w, i in vocab.items() if w in _SKIP or not (w.isalnum() or any(c.isalnum() for c in w))),
            dtype=np.int32,
        )
        self.seen: OrderedDict[str, Pieces] = OrderedDict()
        self.lock = Lock()

    def _kept(self, ids: np.ndarray, vectors: np.ndarray) -> Pieces:
        keep = ~np.isin(ids, self.skip)
        ids, vectors = ids[keep], vectors[keep]
        scale = (np.abs(vectors).max(axis=1) / 127).astype(np.float32)
        return ids, np.round(vectors / np.maximum(scale, 1e-12)[:, None]).astype(np.int8), scale

    def question(self, text: str) -> np.ndarray:
        """``text``'s vector as the embedder's ``embed`` gives it, its pieces kept: one model pass for a question's
        retrieval and its offline answer (~5 ms of CPU a question)."""
        ids, vectors, pooled = self.embedder.token_vectors([text])[0]
        self._remember({text: self._kept(ids, vectors)}, [text])
        return pooled

    def ids_of(self, text: str) -> np.ndarray:
        """The content piece ids of ``text`` (the tokenizer alone)."""
        ids = np.asarray(self.embedder.piece_ids([text])[0], dtype=np.int32)
        return ids[~np.isin(ids, self.skip)]

    def __call__(self, texts: list[str]) -> list[Pieces]:
        with self.lock:
            new = [t for t in dict.fromkeys(texts) if t not in self.seen]
        # the model runs outside the lock
        found = {t: self._kept(ids, v) for t, (ids, v, _) in zip(new, self.embedder.token_vectors(new))} if new else {}
        return self._remember(found, texts)

    def _remember(self, found: dict[str, Pieces], texts: list[str]) -> list[Pieces]:
        with self.lock:
            for t in texts:
                if t in self.seen:
                    self.seen.move_to_end(t)
                    found.setdefault(t, self.seen[t])
            self.seen.update(found)
            while self.size is not None and len(self.seen) > self.size:
                self.seen.popitem(last=False)
        return [found[t] for t in texts]

    def save(self, path: Path, model: str) -> None:
        """Write the pieces held (for ``load`` by the next process), aside and moved into place (``write_aside``); a
        read-only or full disk leaves the previous file."""
        import pickle

        from tasks.retrieval.view import write_aside

        with self.lock:
            saved = {"model": model, "texts": list(self.seen), "pieces": list(self.seen.values())}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_aside(path, lambda fh: pickle.dump(saved, fh, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError:
            pass

    def load(self, path: Path, model: str) -> int:
        """Take the pieces a previous process saved with the same ``model`` (none from a missing, damaged or other
        model's file); returns how many."""
        import pickle

        try:
            with open(path, "rb") as fh:
                saved = pickle.load(fh)
            texts, pieces = saved["texts"], saved["pieces"]
            if saved.get("model") != model or len(texts) != len(pieces):
                return 0
        except Exception:  # noqa: BLE001 - a damaged, partial or older file: embedded again
            return 0
        keep = slice(-self.size, None) if self.size else slice(None)
        with self.lock:
            self.seen.update(zip(texts[keep], pieces[keep]))
        return len(texts)


def answer_embedder(embedder=None):
    """What the offline answer compares texts with: ``embedder`` where it gives word-piece vectors (the packaged
    model), else the packaged model on ONNX Runtime (an index embedded by an API model answers offline too)."""
    if embedder is not None and hasattr(embedder, "token_vectors"):
        return embedder

    return question_embedder(EmbeddingConfig())


def warm_sentences(view, vectors: TokenVectors, limit: int, batch: int = 256) -> int:
    """The candidate sentences of the snapshot's sources (``chunk_sentences``, the chunks in the view's order) and
    their documents' titles (``names_found`` reads them) into ``vectors``, up to ``limit`` texts, ``batch`` at a
    time: a question's first sight of a source then costs no embedding (~0.2 s of CPU on two cores for a cold
    query's 32 candidates). Returns the texts held."""
    todo: list[str] = []
    seen: set[str] = set()
    for text, doc in zip(view.chunk_text, view.chunk_doc):
        title = view.doc_title.get(doc)
        for s in ([title] if title else []) + chunk_sentences(text, title):
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


def warm_saved(view, vectors: TokenVectors, limit: int, path: Path, model: str) -> tuple[int, int]:
    """``warm_sentences`` starting from the vectors saved at ``path`` (for ``model``), saved again when it added
    any; one process at a time (a service's workers start together: the first embeds, the others read what it
    saved). Returns (the sentences held, the vectors read)."""

    with file_lock(path.with_suffix(".lock")):
        had = vectors.load(path, model)
        held = warm_sentences(view, vectors, limit)
        if len(vectors.seen) != had:
            vectors.save(path, model)
    return held, had


def extractive_answer(ctx: Context, tokens: TokenVectors | None = None, k: int = 2) -> str:
    """Without an LLM: the sentences of the sources that answer the question (``best_sentences``), each with its
    source; ``NOT_FOUND`` when the context holds something but no sentence close to the question, and nothing for
    an empty context (its message says why). When the best-ranked related source did not fit the budget (the
    message of a context that holds something says so), that cause is the answer, not ``NOT_FOUND``: the answer
    quotes sources only, so a sentence of the entities section is never one."""
    found = best_sentences(ctx, tokens, k)
    if not found:
        if ctx.empty:
            return ""
        return (
            f"The context holds no source sentence close to the question: {ctx.message}." if ctx.message else NOT_FOUND
        )
    return " ".join(f"{s} ({label})" if label else s for s, label in found)
