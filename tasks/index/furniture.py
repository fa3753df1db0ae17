"""Page furniture: what a typeset document carries besides its prose — figure markers, page references, headings.

The offline extractor reads a chunk with its furniture blanked out (``blank``), so that no entity is named by a
heading ("SPIRITS 111 STAVE"), no description glues a caption's page number to the next sentence ("…Christmas Eve
16 Nobody under the bed"), and no relation joins the words of a title page. Blanking replaces each character with a
space (a line break stays one), so every offset into the blanked text is an offset into the chunk as stored: the
chunk itself, which retrieval returns, is never changed.

What counts as furniture is decided by layout, never by a list of words:

* a figure marker: ``[Illustration]``, ``[Figure 3: …]``, ``[Plate IV]``, ``[Image]``, ``[Photo …]``;
* a page reference: a page number (``16``, ``28-29``, ``xi``) or one italic word (``_Frontispiece_``) that ends a
  line after a run of three or more spaces or a tab, as in a table of contents or a list of illustrations; a
  paragraph whose last line ends in one is an entry of such a list (a caption, a title), blanked whole — a caption
  quotes the text it illustrates, and the parser would join it to the next entry without a full stop;
* a heading: a line of letters none of which is lowercase ("STAVE ONE", "ISBN: 0-397-00033-2"), a line of
  numbers and punctuation alone, or a Markdown heading (``# Note 1``, ``## Setup``: the parser would read it as
  the first words of the sentence under it) — only in a chunk that also holds prose (another line with lowercase
  letters), so a chunk that is all headings keeps its words, and never a table row (a line with ``|``);
* italics markers: an underscore that does not join two word characters (``_December, 1843._``);
* layout marks (``tasks.runtime.text.layout_spans``): quote marks, a list item's bullet or number, a table's bars
  and rule rows (the parser took "| Freight forwarding" for a name and a table's header for an organisation).

Where a block of layout ends (``tasks.runtime.text.block_starts``: a heading, a list item, a table row, an e-mail's
header line), the extractor starts a sentence (``tasks.index.extract.parse_ready``).
"""

from __future__ import annotations

import re

from tasks.runtime.text import is_heading, layout_spans

_FIGURE = re.compile(r"\[(?:illustration|figure|fig\.|plate|image|picture|photo)\b[^\]]{0,400}\]", re.IGNORECASE)
_PAGE_REF = re.compile(r"(?:[ ]{3,}|\t)[ \t]*(\d{1,4}(?:[-–]\d{1,4})?|[ivxlcdm]{1,7}|_[A-Za-z]+_)[ \t]*$", re.MULTILINE)
_LINE = re.compile(r"[^\n]+")
#: lines with something on them, one after another (a blank line ends a paragraph)
_PARAGRAPH = re.compile(r"[^\n]*\S[^\n]*(?:\n[^\n]*\S[^\n]*)*")
_LOWER = re.compile(r"[a-z]")
_ITALIC = re.compile(r"(?<![^\W_])_|_(?![^\W_])")


_NOT_BREAK = re.compile(r"[^\n]")


def _spaces(m: re.Match[str]) -> str:
    return _NOT_BREAK.sub(" ", m.group(0))


def blank(text: str) -> str:
    """``text`` with its page furniture replaced by spaces, the same length (offsets kept), line breaks kept."""
    text = _FIGURE.sub(_spaces, text)
    text = _PARAGRAPH.sub(
        lambda m: _spaces(m) if _PAGE_REF.search(m.group(0).rsplit("\n", 1)[-1]) else m.group(0), text
    )
    text = _PAGE_REF.sub(_spaces, text)
    text = _ITALIC.sub(" ", text)
    if any(_prose(line) for line in _LINE.findall(text)):  # prose here: a line without it is a heading
        text = _LINE.sub(lambda m: m.group(0) if _prose(m.group(0)) or "|" in m.group(0) else _spaces(m), text)
    spans = layout_spans(text)
    if spans:
        chars = list(text)
        for start, end in spans:
            chars[start:end] = " " * (end - start)
        text = "".join(chars)
    return text


def _prose(line: str) -> bool:
    return bool(_LOWER.search(line)) and not is_heading(line)
