"""The offline answer (``tasks.query.answer``) against hand-computed cases: late interaction, the two sentences, the
windows that keep it to sixty words, "no answer", and the remembered word pieces."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from tasks.query.answer import (
    NOT_FOUND,
    TokenVectors,
    answer_kind,
    best_sentences,
    extractive_answer,
    late_scores,
    window,
)
from tasks.retrieval.context import Context


class WordPieces:
    """A word-piece model for tests: one piece per word or punctuation mark, lower-cased, each word its own one-hot
    vector (cosine 1 to itself, 0 to any other word). Counts its calls; ``delay`` makes each one slow."""

    def __init__(self, delay: float = 0.0, dim: int = 512):
        from tasks.query.answer import _SKIP

        self.ids = {w: i for i, w in enumerate(sorted(_SKIP) + [".", "?"])}
        self.delay, self.dim = delay, dim
        self.calls: list[list[str]] = []

    def vocabulary(self) -> dict[str, int]:
        return dict(self.ids)

    def piece_ids(self, texts):
        return [[self.ids.setdefault(w, len(self.ids)) for w in re.findall(r"\w+|[^\w\s]", t.lower())] for t in texts]

    def token_vectors(self, texts):
        self.calls.append(list(texts))
        time.sleep(self.delay)
        ids = [np.asarray(i, dtype=np.int32) for i in self.piece_ids(texts)]
        return [(i, np.eye(self.dim, dtype=np.float32)[i], np.eye(self.dim, dtype=np.float32)[i].mean(0)) for i in ids]


def pieces(ids, vectors):
    """Pieces as ``TokenVectors`` keeps them: int8 with a scale per piece."""
    v = np.asarray(vectors, dtype=np.float32)
    scale = (np.abs(v).max(axis=1) / 127).astype(np.float32)
    return np.asarray(ids, dtype=np.int32), np.round(v / scale[:, None]).astype(np.int8), scale


def context(question, texts):
    return Context(question=question, mode="naive", version=1,
                   chunks=[{"title": title, "text": f"[{title}] {text}"} for title, text in texts],
                   entities=[{"text": "- Bob (person): Scrooge paid Bob fifteen shillings a week."}])


def test_late_scores_by_hand():
    query = pieces([1, 2], [[1, 0], [0, 1]])
    t1, t2, t3 = pieces([1], [[1, 0]]), pieces([3, 2], [[0.6, 0.8], [0, 1]]), pieces([2], [[0, 1]])
    # two texts, each query piece in one: equal weights; t1 finds piece 1 (1.0) but not 2 (0.0); t2 finds 0.6 and 1.0
    assert late_scores(query, [t1, t2]) == pytest.approx([0.5, 0.8], abs=0.01)
    # piece 2 now in two of three texts: weights ln(4/2) + 1 = 1.693 and ln(4/3) + 1 = 1.288, i.e. .568 and .432
    assert late_scores(query, [t1, t2, t3]) == pytest.approx([0.568, 0.568 * 0.6 + 0.432, 0.432], abs=0.01)
    empty = pieces([], np.zeros((0, 2)))
    assert late_scores(query, [empty, t1]).tolist()[0] == 0.0 and late_scores(empty, [t1]).tolist() == [0.0]


def test_the_kind_asked_for_is_read_from_the_question_word():
    from tasks.query.answer import _CAPITAL, _DATE, _NUMBER

    assert answer_kind("When did Scrooge meet Marley?") is _DATE
    assert answer_kind("In which year was the firm founded?") is _DATE
    assert answer_kind("How many spirits visit Scrooge?") is _NUMBER
    # "when" after the question word is a clause, not what is asked for
    assert answer_kind("What did Scrooge see in the knocker when he came home?") is _CAPITAL
    assert answer_kind("Who was the clerk, when the story begins, and how many children had he?") is _CAPITAL


def test_a_window_keeps_the_words_asked_about():
    assert window("a b c d key e f", {"key"}, 3) == "… c d key …"
    assert window("key a b c", {"key"}, 2) == "key a …"
    assert window("a b", {"key"}, 3) == "a b"
    assert window("x y z the employer, then w", {"employed"}, 2) == "… the employer, …"  # the same first five letters


def test_the_first_sentence_is_the_closest_the_second_what_it_leaves_open():
    ctx = context("Where was the clerk of Scrooge born?", [("T", "Bob Cratchit was the clerk of Scrooge. "
                                                                "Bob Cratchit was born in Camden Town. Scrooge was born in London.")])
    model = WordPieces()
    # pieces asked: clerk (in 1 of 3 sentences: weight 1.693), scrooge and born (in 2: 1.288); the clerk sentence
    # .698 (+.1: names Bob, whom the question does not), London .603 (+.1), Camden .302 (+.1)
    # then what the first leaves open, "Where born bob cratchit" (equal weights): Camden 1.0 + .5 x .302 + .6 (names
    # Bob Cratchit, as the first does) + .1 = 1.85; London .333 + .5 x .603 + .1 = .735
    assert best_sentences(ctx, TokenVectors(model)) == [
        ("Bob Cratchit was the clerk of Scrooge.", "T"), ("Bob Cratchit was born in Camden Town.", "T")]
    # the question (its pieces of what it names, Scrooge, are found in the first sentence: no title embedded), then
    # what the first sentence leaves open
    assert model.calls[1:] == [["Where was the clerk of Scrooge born?"], ["Where born bob cratchit"]]
    # without the model, the share of {clerk, scrooge, born}: the clerk and London 2/3 (+.1 each), the earliest wins
    assert best_sentences(ctx, None, k=1) == [("Bob Cratchit was the clerk of Scrooge.", "T")]
    assert best_sentences(context("the of", [("T", "Bob had but fifteen bob.")]), TokenVectors(model)) == []


def test_the_offline_answer_keeps_to_sixty_words_and_says_when_the_index_holds_no_answer():
    long = "Marley was dead " + "and buried " * 40 + "to begin with."  # 86 words
    ctx = context("Who was dead?", [("Stave 1", f"{long} Scrooge signed it with his name.")])
    first, second = best_sentences(ctx, TokenVectors(WordPieces()))
    # the second (6 words, +.1 for naming Scrooge) leaves the first 54 words: a window where it says "dead"
    assert first[0] == " ".join(long.split()[:54]) + " …" and second == ("Scrooge signed it with his name.", "Stave 1")
    assert len([w for w in f"{first[0]} {second[0]}".split() if w != "…"]) == 60
    absent = context("Who was dead?", [("Stave 1", "Scrooge signed it. Bob had a very small fire.")])
    assert best_sentences(absent, TokenVectors(WordPieces())) == []
    assert extractive_answer(absent, TokenVectors(WordPieces())) == NOT_FOUND
    # the relation asked about alone: "capital" (weight 1 of 2.69: .37), but nothing near France in a sentence or title
    face = context("What is the capital of France?", [("Stave 3", "She had a capital face and a ripe little mouth.")])
    assert best_sentences(face, TokenVectors(WordPieces())) == []
    in_title = context("What is the capital of France?", [("France", "Its capital is Paris, on the Seine.")])
    assert best_sentences(in_title, TokenVectors(WordPieces())) == [("Its capital is Paris, on the Seine.", "France")]


def test_word_pieces_are_embedded_once_without_stop_words_and_the_most_recent_kept():
    model = WordPieces()
    vectors = TokenVectors(model, size=2)
    ((ids, q, scale),), again = vectors(["Bob met the clerk."]), vectors(["Bob met the clerk."])
    assert ids.tolist() == [model.ids[w] for w in ("bob", "met", "clerk")] and q.dtype == np.int8  # no "the", no "."
    assert np.allclose(q * scale[:, None], np.eye(model.dim)[ids], atol=0.01) and again[0][0].tolist() == ids.tolist()
    vectors(["Tim."])
    vectors(["Bob met the clerk.", "Fan."])  # over the size: "Tim.", used least recently, goes
    assert list(vectors.seen) == ["Bob met the clerk.", "Fan."]
    assert model.calls == [["Bob met the clerk."], ["Tim."], ["Fan."]] and vectors([]) == []
    # a question: its vector for the retrieval and its pieces for the answer from one model call
    assert vectors.question("Who met Bob?").shape == (model.dim,) and "Who met Bob?" in vectors.seen
    assert vectors(["Who met Bob?"])[0][0].tolist() == [model.ids["met"], model.ids["bob"]] and len(model.calls) == 4


def test_preselect_keeps_the_ranked_head_and_reaches_past_it_by_the_questions_rare_words():
    from tasks.query.candidates import preselect

    filler = [(f"The fog came down on day {i} and the city was quiet.", "book") for i in range(10)]
    cands = [
        *filler[:3],
        ("Scrooge's clerk works in a dismal little cell.", "book"),  # "clerk", "works": both rare
        *filler[3:],
        ("Bob Cratchit was the clerk.", "book"),  # "clerk"
        ("The city lay in fog again.", "book"),  # "city" is in every filler: common, no question word anyway
    ]
    picked = preselect("Who is the clerk that works for Scrooge in the city?", cands, 4)
    # the first two as ranked, then the two of the rest holding the rarest question words, all in context order
    assert picked == [cands[0], cands[1], cands[3], cands[11]]
    assert preselect("Who?", cands[:3], 4) == cands[:3]  # at most k: all of them


def test_preselect_of_candidates_sharing_no_word_with_the_question_keeps_context_order():
    from tasks.query.candidates import preselect

    cands = [(f"Sentence number {i} says nothing.", "doc") for i in range(6)]
    assert preselect("Who founded Acme?", cands, 4) == cands[:4]  # no shared word: the first four, as ranked


def test_a_sources_headings_are_no_candidates_and_its_list_items_are_sentences_of_their_own():
    """``chunk_sentences``: a Markdown heading names a section and answers nothing (the offline answer quoted "# Minutes
    of the Board" for "Who is the CFO?"); a list item is a sentence without its number, not glued to the next one."""
    from tasks.query.candidates import chunk_sentences

    text = "[Minutes] # Minutes of the Board of Directors\n\n## Decisions\n1. The board appointed Grace Chen.\n2. Dana left."
    assert chunk_sentences(text, "Minutes") == ["The board appointed Grace Chen."]  # "Dana left." is under 20 characters
