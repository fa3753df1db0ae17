"""Statements of a parsed sentence: which entity mention does what to which, read off spaCy's dependency parse.

A statement is (subject mention, label, object mention), the label a verb or a noun with its preposition as the
sentence writes it, so that a relation reads as the sentence says it:

* subject-verb-object: "Scrooge employs Bob Cratchit" -> (Scrooge, "employs", Bob Cratchit); a preposition or a
  passive's agent joins the verb ("opened in", "founded by"); a negation leads it ("not paid");
* a copula with a noun and a preposition: "Bob Cratchit is the clerk of Scrooge" -> (Bob Cratchit, "clerk of",
  Scrooge); with a noun that is a mention itself: (Paris, "is", capital);
* an appositive: "Bob Cratchit, the clerk of Scrooge" -> (Bob Cratchit, "clerk of", Scrooge);
* a copula's or an appositive's noun with a participle or a relative clause, said of what the noun is said of:
  "Meehan is a community located in Plover" -> (Meehan, "community located in", Plover); "Jane Doe is an actress
  who starred in Alien" -> (Jane Doe, "starred in", Alien); besides the noun's own where it is a mention;
* a participle that modifies a noun: "the Eiffel Tower, designed by Gustave Eiffel" -> ("Eiffel Tower",
  "designed by", Gustave Eiffel); a relative clause's "who"/"which" is the noun it modifies;
* a noun and its preposition's object, where nothing above says more of the pair: "Jan Solovej from the
  University of Copenhagen" -> (Jan Solovej, "from", University of Copenhagen).

Conjoined subjects and objects each make a statement. Only words a reader sees as words enter a label (no
punctuation, numbers or symbols), and a pronoun that names no mention ("It supplies ...") makes none: nothing is
resolved across sentences. Pure functions of the parse; the same parse gives the same statements.
"""

from __future__ import annotations

from typing import Any

_SUBJECTS = {"nsubj", "nsubjpass"}
_OBJECTS = {"dobj", "obj"}
_RELATIVE = {"WDT", "WP", "WP$", "that"}
_MODIFIERS = {"amod", "compound"}
#: the longest label kept (a parse that strings more words together is not one relation)
MAX_LABEL_WORDS = 5


def statements(sent: Any, mention_at: dict[int, int]) -> list[tuple[int, str, int, bool]]:
    """(subject, label, object, bare) of one sentence (a spaCy span), the ends as indices of mentions, ``bare``
    where the label is a noun's preposition alone ("from": the sentence names no verb or role between them);
    ``mention_at`` maps a token's index in the doc to the mention that holds it. In token order, each (subject,
    object) pair once (its first statement)."""
    found: list[tuple[int, str, int, bool]] = []
    seen: set[tuple[int, int]] = set()

    def add(subj: Any, label: list[str], obj: Any, bare: bool = False) -> None:
        s, o = mention_at.get(subj.i), mention_at.get(obj.i)
        words = [w for w in label if w.isalpha()]
        if s is None or o is None or s == o or not words or len(words) > MAX_LABEL_WORDS or (s, o) in seen:
            return
        seen.add((s, o))
        found.append((s, " ".join(words), o, bare))

    for tok in sent:
        if tok.pos_ in ("VERB", "AUX"):
            _verb(tok, add)
        for app in (c for c in tok.children if c.dep_ == "appos"):
            _noun_statements(tok, app, add, plain=["is"])
    for tok in sent:  # after the verbs' and nouns' own statements, which say more of the same pair
        if tok.pos_ in ("NOUN", "PROPN"):
            for prep in (c for c in tok.children if c.dep_ == "prep"):
                for obj in _objects(prep):
                    add(tok, [prep.text.lower()], obj, bare=True)
    return found


def _verb(verb: Any, add, subjects: list[Any] | None = None) -> None:
    subjects = _subjects(verb) if subjects is None else subjects
    if not subjects:
        return
    neg = ["not"] if any(c.dep_ == "neg" for c in verb.children) else []
    particle = [c.text.lower() for c in verb.children if c.dep_ == "prt"]
    if verb.lemma_ == "be":
        for attr in (a for c in verb.children if c.dep_ in ("attr", "acomp") for a in _with_conjuncts(c)):
            for s in subjects:
                _noun_statements(s, attr, add, plain=[*neg, verb.text.lower()])
        return
    _arguments(verb, subjects, [*neg, verb.text.lower(), *particle], add)


def _arguments(verb: Any, subjects: list[Any], words: list[str], add) -> None:
    """``verb``'s objects, labelled ``words``, and its prepositions' (or a passive's agent's) objects, labelled
    ``words`` and the preposition, each said of every one of ``subjects``."""
    for c in verb.children:
        if c.dep_ in _OBJECTS:
            for s in subjects:
                for o in _with_conjuncts(c):
                    add(s, words, o)
        elif c.dep_ in ("prep", "agent"):
            for o in _objects(c):
                for s in subjects:
                    add(s, [*words, c.text.lower()], o)


def _subjects(verb: Any) -> list[Any]:
    """The tokens a verb says something of: its subjects (a relative pronoun read as the noun its clause modifies),
    a participle's noun ("the tower, designed by ..."), a conjoined verb's first verb's subjects."""
    subjects = [c for c in verb.children if c.dep_ in _SUBJECTS]
    if verb.dep_ == "relcl":
        subjects = [verb.head if _relative(s) else s for s in subjects]
    if not subjects and verb.dep_ == "acl" and verb.tag_ == "VBN":
        subjects = [verb.head]
    if not subjects and verb.dep_ == "conj" and verb.head.pos_ in ("VERB", "AUX"):
        subjects = [c for c in verb.head.children if c.dep_ in _SUBJECTS]
    return [each for s in subjects for each in _with_conjuncts(s)]


def _relative(tok: Any) -> bool:
    """A relative pronoun ("who", "which", "that")."""
    return tok.tag_ in _RELATIVE or tok.lower_ in _RELATIVE


def _noun_statements(subj: Any, noun: Any, add, plain: list[str]) -> None:
    """What a noun says of ``subj`` (a copula's complement, an appositive): a common noun with its preposition to
    that preposition's object ("clerk of" Scrooge), and ``plain`` ("is") to the noun where it is a mention itself
    (a name is no role: "the editor is Jan Solovej from ..." says nothing "Jan Solovej from" of the editor)."""
    if noun.pos_ == "NOUN":
        words = [t.text if t.pos_ == "PROPN" else t.text.lower() for t in noun.lefts if t.dep_ in _MODIFIERS]
        for prep in (c for c in noun.children if c.dep_ == "prep"):
            for obj in _objects(prep):
                add(subj, [*words, noun.text.lower(), prep.text.lower()], obj)
        for part in (c for c in noun.children if c.dep_ == "acl" and c.pos_ == "VERB"):  # "a community located in"
            _arguments(part, [subj], [noun.text.lower(), part.text.lower()], add)
        for clause in (c for c in noun.children if c.dep_ == "relcl" and c.pos_ in ("VERB", "AUX")):
            if any(t.dep_ in _SUBJECTS and _relative(t) for t in clause.children):
                _verb(clause, add, subjects=[subj])  # "an actress who starred in Alien": she starred in it
    add(subj, plain, noun)


def _objects(prep: Any) -> list[Any]:
    """A preposition's objects, each with its conjuncts ("in Oslo and Bergen")."""
    return [each for obj in prep.children if obj.dep_ == "pobj" for each in _with_conjuncts(obj)]


def _with_conjuncts(tok: Any) -> list[Any]:
    """A token and the tokens conjoined with it ("Scrooge and Marley")."""
    return [tok, *(c for c in tok.conjuncts if c.i > tok.i)]
