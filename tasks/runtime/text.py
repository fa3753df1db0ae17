"""Text helpers shared by the stages."""

from __future__ import annotations

import functools
import re
from typing import Any

_SPACE = re.compile(r"\s+")
#: punctuation that ends a clause: a span across it is two phrases the parser joined ("Much!'--Marley's voice"); a
#: noun phrase across a comma, a colon or a quote is a list or a quotation ("comfortable, oily, rich, fat"), where a
#: named entity may hold them ("Washington, D.C.", "Star Wars: Episode IV", 'Dwayne "The Rock" Johnson'); an en
#: dash joins ("1939–1945", "Mexican–American War")
CLAUSE_BREAK = re.compile(r"\s*(?:-{2,}|[!?;—])\s*")
LIST_BREAK = re.compile(r"\s*(?:-{2,}|[!?;:,—\"“”])\s*")
_BRACKETS = r"\s*[()\[\]]\s*"
#: where a noun phrase breaks: a list's breaks and any bracket ("(power) line frequency": "power", "line frequency")
PHRASE_BREAK = re.compile(f"{LIST_BREAK.pattern}|{_BRACKETS}")
#: where a name holding a bracket without its partner (``unpaired``) breaks: a clause break or a bracket
CLAUSE_OR_BRACKET = re.compile(f"{CLAUSE_BREAK.pattern}|{_BRACKETS}")


def unpaired(text: str) -> bool:
    """A bracket without its partner in ``text`` ("Felipe Solo (", "500) Days of Summer"): a span the parser cut
    inside a parenthesis."""
    return text.count("(") != text.count(")") or text.count("[") != text.count("]")


def squash_clip(text: str, limit: int) -> str:
    """Whitespace runs folded to one space; past ``limit`` characters, cut and marked with an ellipsis."""
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def clip_at_word(text: str, limit: int) -> str:
    """At most ``limit`` characters, cut back to the last whole word (no marker: for embedding texts)."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


def split_sentences(text: str) -> list[str]:
    """``text`` as sentences, whitespace folded, a blank line always ending one: pySBD's rule-based segmenter, which
    keeps abbreviations, initials and quotations whole ("Mrs. Cratchit", "Michael S. Hart", "the U.S. Army",
    ``"Bah!" said Scrooge.``) and imports in milliseconds (spaCy's sentencizer would load spaCy and, through thinc,
    PyTorch: ~3 s on every cold query). A piece that starts in lower case, or follows a title pySBD does not know
    ("Hon. Winnie Kiiza", "Fr. Brown"), continues the sentence before it."""
    segmenter = _segmenter_class()(language="en", clean=False)  # a fresh one per call: nothing shared across threads
    out: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        for piece in segmenter.segment(_SPACE.sub(" ", paragraph).strip()) if paragraph.strip() else []:
            piece = piece.strip()
            if not piece:
                continue
            if out and (piece[0].islower() or not any(ch.isalnum() for ch in piece) or _TITLE_END.search(out[-1])):
                out[-1] = f"{out[-1]} {piece}"
            else:
                out.append(piece)
    return out


@functools.lru_cache(maxsize=1)
def _segmenter_class() -> Any:
    r"""pySBD's segmenter, its sentences found back in the text without a regular expression per sentence.

    pySBD maps each sentence it made back to the text with ``re.finditer(re.escape(sentence) + r"\s*")``, compiling
    one pattern per sentence, which no cache holds: two fifths of its time on short texts (docs/benchmarks.md). The
    same search with ``str.find`` gives the same spans: the first occurrence, continuing past each match as
    ``finditer`` does, whose end (trailing whitespace taken) passes the previous sentence's end."""
    import pysbd
    from pysbd.utils import TextSpan

    class Segmenter(pysbd.Segmenter):
        def sentences_with_char_spans(self, sentences: list[str]) -> list[Any]:
            if not all(sentences):  # an empty pattern matches everywhere: pySBD's own search
                return super().sentences_with_char_spans(sentences)
            text, spans, prior_end = self.original_text, [], 0
            for sent in sentences:
                at = text.find(sent)
                while at >= 0:
                    end = at + len(sent)
                    while end < len(text) and _WHITE.match(text, end):
                        end += 1
                    if end > prior_end:
                        spans.append(TextSpan(text[at:end], at, end))
                        prior_end = end
                        break
                    at = text.find(sent, end)
            return spans

    return Segmenter


_WHITE = re.compile(r"\s")
_PARAGRAPH = re.compile(r"\n\s*\n")
#: what ends a sentence as a reader sees it: its end mark, then any closing quotes or brackets ("…" after a whole word
#: counts: a text cut for a budget is marked so)
SENTENCE_END = re.compile(r"""[.!?…]["'”’)\]]*$""")
#: a sentence's tail that belongs to no sentence: a quote mark after a space, which a splitter left behind
#: ("…yesterday. '"), or a table's column bars ("…the transcriber. |")
_STRAY_TAIL = re.compile(r"""(?:\s+['"‘“”’]|\s*\|)+\s*$""")


def as_ended(sentence: str) -> str:
    """``sentence`` for a summary a person reads: without a stray tail (``_STRAY_TAIL``), and where it stops without
    ending (a splitter's fragment, a quotation cut off), ended at its last whole word with "…"; "" where it holds
    no word."""
    s = _STRAY_TAIL.sub("", sentence.strip())
    if not any(ch.isalnum() for ch in s):  # punctuation only: no sentence
        return ""
    if SENTENCE_END.search(s):
        return s
    s = s.rstrip(" ,;:-—–'\"‘“`")  # what follows the last word, an end mark before it kept ("…the country. ''")
    return s if not s or SENTENCE_END.search(s) else s + "…"


def opens_mid_sentence(sentence: str) -> bool:
    """``sentence`` is the tail of one begun before it: its first word is in lower case ("said Bob, with a sudden
    declension…", where a chunk starts inside a quotation's sentence); a name written in lower case with a capital
    inside ("iPhone", "eBay") is a start."""
    first = sentence.lstrip(" '\"‘“`([").split(" ", 1)[0]
    return bool(first) and first[0].islower() and first.islower()


#: words of a text's head that, found inside a longer text, make it a copy of that one cut at a chunk's edge
HEAD_WORDS = 8


def text_key(text: str) -> str:
    """What makes two texts the same: case and whitespace aside."""
    return " ".join(text.lower().split())


def head_of(key: str) -> str:
    """The first ``HEAD_WORDS`` words of a ``text_key`` (all of a shorter one)."""
    return " ".join(key.split(" ", HEAD_WORDS)[:HEAD_WORDS])


def whole_texts(texts: list[str]) -> list[str]:
    """``texts`` (sentences of one entity or relation, in corpus order, whitespace folded) as a reader wants them:
    two overlapping chunks give one sentence twice, one copy cut at a chunk's edge. A text that is a piece of a longer
    one (its head, ``head_of``, inside it: "The house-fronts looked black enough, … with the smooth white" beside
    the whole sentence; "fashioned silver teaspoons, … boots." beside "Sheets and towels, … two old fashioned silver
    teaspoons, … boots.") goes; one whose head starts another's tail ("…Hurrah! And Martha warn't as late … 'Here's"
    and "And Martha warn't as late … 'Here's Martha, mother!' said a girl.") is joined to it, in the first one's place."""
    out = list(texts)
    changed = True
    while changed:
        changed = False
        keys = [text_key(t) for t in out]
        for i, k in enumerate(keys):
            head = head_of(k)
            for j, o in enumerate(keys):
                if i == j or not k or head not in o:
                    continue
                at = o.find(head)
                if len(o) > len(k) and k in o or o[at:] == k[: len(o) - at]:
                    # i is inside j, or j's tail is i's head: j, and i's text past the overlap, at j's place
                    joined = out[j] if k in o else out[j][:at] + out[i]
                    out = [joined if n == j else t for n, t in enumerate(out) if n != i]
                    changed = True
                    break
            if changed:
                break
    return out


_TITLE_END = re.compile(r"\b(?:Hon|Rt|Fr|Msgr|Revd|Pres|Ft|Insp|Pvt|Amb|Cdr|Comdr|Mme|Mlle|Atty)\.$")
