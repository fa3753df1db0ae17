"""Text helpers shared by the stages."""

from __future__ import annotations

import re

_SPACE = re.compile(r"\s+")


def squash_clip(text: str, limit: int) -> str:
    """Whitespace runs folded to one space; past ``limit`` characters, cut and marked with an ellipsis."""
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def clip_at_word(text: str, limit: int) -> str:
    """At most ``limit`` characters, cut back to the last whole word (no marker: for embedding texts)."""
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


_SENTENCIZER = None


def split_sentences(text: str) -> list[str]:
    """``text`` as sentences, whitespace folded, a blank line always ending one: spaCy's rule-based sentencizer
    over its English tokenizer, whose exceptions keep abbreviations and initials whole ("Mrs. Cratchit", "Michael S. Hart", "the U.S. Army"); a piece
    that starts in lower case continues the sentence before it (``He said "Go away!" and left.``)."""
    global _SENTENCIZER
    if _SENTENCIZER is None:
        import spacy

        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        _SENTENCIZER = nlp
    out: list[str] = []
    for paragraph in _PARAGRAPH.split(text):
        out += _paragraph_sentences(_SENTENCIZER, _SPACE.sub(" ", paragraph).strip())
    return out


_PARAGRAPH = re.compile(r"\n\s*\n")


def _paragraph_sentences(nlp, text: str) -> list[str]:
    out: list[str] = []
    carry = ""  # an opening quote the sentencizer left at the end of the sentence before
    for sent in nlp(text).sents:
        s = carry + sent.text.strip()
        carry = ""
        if _OPENING_QUOTE.search(s):
            s, carry = s[:-1].rstrip(), s[-1]
        if not s:
            continue
        if out and (s[0].islower() or not any(ch.isalnum() for ch in s)):
            out[-1] = f"{out[-1]} {s}"
        else:
            out.append(s)
    if carry and out:
        out[-1] += f" {carry}"
    return out


_OPENING_QUOTE = re.compile(r"\s[\"“‘']$")
