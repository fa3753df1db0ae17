"""Boilerplate: paragraphs repeated across a corpus's documents (licences, headers, footers, navigation).

A paragraph is a blank-line separated block of a document; its key is a hash of its text with case and
punctuation aside, and its digits too when it holds at most ``MAX_NUMBERS`` numbers ("Copyright 2019" and
"copyright 2020." are one key). A paragraph with more numbers keeps them: templated text that differs only in its
figures ("Firm 1 was founded by Person 1 ... Firm 2", a quarterly report's sentences) is content, not a footer. A key found in at least
``corpus.boilerplate_min_documents`` documents is boilerplate: its paragraphs are left out of the chunks
(``chunk.chunk_document`` chunks what lies between them), unless that would leave a document nothing (a
document that is all boilerplate, such as the same file twice, is kept whole).

The decision is the whole corpus's, made again by every run (every run reads the whole corpus): a document's
spans left out are part of its id (``ingest.document_id``), so an update that makes a paragraph boilerplate, or
stops it being one, changes the ids of the documents that hold it and re-chunks them, as a full build would.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

import numpy as np

#: a paragraph shorter than this (normalised) is never boilerplate: "Chapter I" repeats across books
MIN_CHARS = 40

_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_NOT_WORD = re.compile(r"[\W_]+")
_DIGIT = re.compile(r"\d")
_NUMBER = re.compile(r"\d+")

#: a paragraph with more numbers than this keeps its digits in its key (a footer has a year, a version, a page)
MAX_NUMBERS = 2


def paragraphs(text: str) -> list[tuple[int, int, int]]:
    """(start, end, key) of each paragraph of ``text`` of at least ``MIN_CHARS`` normalised characters, ``start``
    and ``end`` its first and past-last non-blank characters."""
    out: list[tuple[int, int, int]] = []
    at = 0
    for stop, nxt in [*((m.start(), m.end()) for m in _BREAK.finditer(text)), (len(text), len(text))]:
        block = text[at:stop]
        lead = len(block) - len(block.lstrip())
        start, end = at + lead, at + len(block.rstrip())
        block = text[start:end].lower()
        if len(_NUMBER.findall(block)) <= MAX_NUMBERS:
            block = _DIGIT.sub("0", block)
        norm = _NOT_WORD.sub(" ", block).strip()
        if len(norm) >= MIN_CHARS:
            out.append((start, end, key(norm)))
        at = nxt
    return out


def key(normalised: str) -> int:
    return int.from_bytes(hashlib.blake2b(normalised.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def repeated(keys: Iterable[np.ndarray], min_documents: int) -> dict[int, int]:
    """The keys found in at least ``min_documents`` documents (``keys``: each document's distinct keys), with
    their number of documents; none when ``min_documents`` is 0."""
    every = np.concatenate([np.zeros(0, np.int64), *keys])
    if not min_documents or not len(every):
        return {}
    values, counts = np.unique(every, return_counts=True)
    hit = counts >= min_documents
    return dict(zip(values[hit].tolist(), counts[hit].tolist()))


def spans(text: str, boilerplate: dict[int, int] | set[int]) -> list[int]:
    """The boilerplate paragraphs of ``text`` as [start, end, start, end, ...]; none when they are all of its
    text (a document is never left out whole)."""
    found = [(s, e) for s, e, k in paragraphs(text) if k in boilerplate]
    if not found:
        return []
    rest, at = [], 0
    for s, e in found:
        rest.append(text[at:s])
        at = e
    rest.append(text[at:])
    if not "".join(rest).strip():
        return []
    return [x for span in found for x in span]


def segments(length: int, left_out: list[int]) -> list[tuple[int, int]]:
    """The [start, end) ranges of a text of ``length`` characters between its ``left_out`` spans."""
    out, at = [], 0
    for s, e in zip(left_out[::2], left_out[1::2]):
        if s > at:
            out.append((at, s))
        at = e
    if at < length:
        out.append((at, length))
    return out
