"""Text helpers shared by the stages."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
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
    """``text`` as sentences, whitespace folded, the end of a block always ending one (``blocks``: a blank line, a
    heading, a list item, a table row, an e-mail's header line): pySBD's rule-based segmenter, which
    keeps abbreviations, initials and quotations whole ("Mrs. Cratchit", "Michael S. Hart", "the U.S. Army",
    ``"Bah!" said Scrooge.``) and imports in milliseconds (spaCy's sentencizer would load spaCy and, through thinc,
    PyTorch: ~3 s on every cold query). A piece that starts in lower case, or follows a title pySBD does not know
    ("Hon. Winnie Kiiza", "Fr. Brown"), continues the sentence before it."""
    segmenter = _segmenter_class()(language="en", clean=False)  # a fresh one per call: nothing shared across threads
    out: list[str] = []
    for block in blocks(text):
        for k, piece in enumerate(segmenter.segment(_SPACE.sub(" ", block).strip())):
            piece = piece.strip()
            alnum = any(c.isalnum() for c in piece)
            if not piece or not (k or alnum):  # a block of punctuation alone ("* * *") is no sentence
                continue
            if k and out and (piece[0].islower() or not alnum or _TITLE_END.search(out[-1])):
                out[-1] = f"{out[-1]} {piece}"
            else:
                out.append(piece)
    return out


# A line's layout (``block_starts``, ``blocks``), read from its first characters, never from a list of words.
_QUOTED = re.compile(r"[ \t]{0,3}>[ \t>]*")
_HEADING = re.compile(r"[ \t]{0,3}#{1,6}(?:[ \t]|$)")
_ROW = re.compile(r"[ \t]*\|")
_BULLET = re.compile(r"[ \t]*[-*+•▪◦‣][ \t]+(?=\S)")
#: an item's number: "1.", "(2)", "3)", or a clause's "3.1" / "3.1." before a capital ("3.5 million" is prose)
_NUMBERED = re.compile(r"[ \t]*(?:\(?\d{1,2}[.)]|\d{1,2}(?:\.\d{1,2})+\.?(?=[ \t]+[A-Z]))[ \t]+(?=\S)")
_FIELD = re.compile(r"[ \t]*[A-Z][\w'-]*(?: [\w'-]+){0,2}:[ \t]+\S")
_ENDED = re.compile(r"""[.!?:;]["'”’)\]]*\s*$""")  # \s: a line of a file with CRLF line ends keeps its \r
#: the kinds of line that open a block whatever the line before, and those after which the next line opens one
_OPENS, _CLOSES = {"heading", "row", "bullet"}, {"heading", "row"}


def _layout(line: str) -> tuple[bool, str, int]:
    """(quoted, kind, the length of the line's layout marker: quote marks, a bullet or a number)."""
    quote = _QUOTED.match(line)
    at = quote.end() if quote else 0
    if not line[at:].strip():
        return bool(quote), "blank", at
    for kind, pattern in (("heading", _HEADING), ("row", _ROW), ("bullet", _BULLET), ("number", _NUMBERED)):
        m = pattern.match(line, at)
        if m:
            return bool(quote), kind, at if kind in ("heading", "row") else m.end()
    return bool(quote), "field" if _FIELD.match(line, at) else "text", at


def _lines(text: str) -> Iterator[tuple[int, str, str, int, bool]]:
    """Each line of ``text``: (its offset, the line, its kind, its marker's length, whether it opens a block)."""
    pos, prev, closes = 0, (False, "blank", ""), False
    for line in text.split("\n"):
        quoted, kind, marker = _layout(line)
        opens = kind != "blank" and (
            not pos
            or prev[1] == "blank"
            or kind in _OPENS
            or (closes and not line[marker:].lstrip()[:1].islower())
            or quoted != prev[0]
            or (kind in ("number", "field") and (prev[1] in (kind, "bullet") or bool(_ENDED.search(prev[2]))))
        )
        yield pos, line, kind, marker, opens
        closes = kind in _CLOSES or (kind == "field" and opens)
        prev = (quoted, kind, line)
        pos += len(line) + 1


def block_starts(text: str) -> list[int]:
    """The offsets of the lines of ``text`` that open a block of their own, where no sentence runs across: the
    first line after a blank one; a Markdown heading or table row, and the line after it; a bulleted item; a
    numbered item or a "Key: value" line (an e-mail's header, a minute's "Present:") where the line before ends a
    sentence or is itself such an item, and the line after such a "Key: value" line unless it goes on in lower
    case; the first line of a quotation ("> ") and the first after it. Prose wrapped at a line's end never opens a
    block ("weigh everything by / Gain: or, choosing her" is one sentence), so plain text is read as before."""
    return [pos for pos, _, _, _, opens in _lines(text) if opens and pos]


def _rule(kind: str, line: str) -> bool:
    """A table's rule row ("|---|---:|"): a row without a letter or digit."""
    return kind == "row" and not any(ch.isalnum() for ch in line)


def _mark_end(line: str, kind: str, marker: int, opens: bool) -> int:
    """Where a line's layout marks end: its quote marks, and its bullet or number where the item opens a block (a
    number that does not is the wrapped prose's own word)."""
    if opens or kind not in ("bullet", "number"):
        return marker
    quote = _QUOTED.match(line)
    return quote.end() if quote else 0


def layout_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the layout marks of ``text``'s lines, which a parser should not read as words: quote marks,
    the bullet or number of an item that opens a block, a table row's bars, a table's rule row whole."""
    out = []
    for pos, line, kind, marker, opens in _lines(text):
        if _rule(kind, line):
            out.append((pos, pos + len(line)))
        elif kind == "row":
            out += [(pos + i, pos + i + 1) for i, ch in enumerate(line) if ch == "|"]
        elif end := _mark_end(line, kind, marker, opens):
            out.append((pos, pos + end))
    return out


def blocks(text: str) -> list[str]:
    """``text`` cut at its ``block_starts``, each line without its layout marks (``layout_spans``). A table row is
    its cells, each after its column's heading where the table has one (the row above its rule row, then left out:
    "Segment: Last-mile delivery; Q3 2026: $9.5M"), else joined by " | "; the rule row is dropped."""
    lines = list(_lines(text))
    out: list[list[str]] = []
    header: list[str] = []
    for i, (_, line, kind, marker, opens) in enumerate(lines):
        body = line[_mark_end(line, kind, marker, opens) :]
        if kind == "row":
            cells = [c.strip() for c in body.strip().strip("|").split("|")]
            if i + 1 < len(lines) and _rule(lines[i + 1][2], lines[i + 1][1]):
                header, body = cells, ""
            elif _rule(kind, line):
                body = ""
            elif len(header) == len(cells):
                body = "; ".join(f"{h}: {c}" if h else c for h, c in zip(header, cells) if c)
            else:
                body = " | ".join(cells)
        else:
            header = []
        if opens or not out:
            out.append([])
        out[-1].append(body)
    return [block for block in map("\n".join, out) if block.strip()]


def is_heading(sentence: str) -> bool:
    """A Markdown heading ("## Summary"): a line, or the sentence of its own ``split_sentences`` makes of it."""
    return bool(_HEADING.match(sentence))


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
