"""Deterministic ids: a hash of a content key, never a random uuid."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas.tables import QuarantineRow


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def quarantine_row(item: str, stage: str, error: str) -> QuarantineRow:
    """The one constructor of ``quarantine`` rows (every stage): what, where, why, with a content id."""
    return {"id": make_id("q", stage, item, error), "item": item, "stage": stage, "error": error}


def make_id(kind: str, *parts: object) -> str:
    """``kind-<24 hex>`` from the content key ``parts`` (joined unambiguously)."""
    key = "\x1f".join([kind, *map(str, parts)])
    return f"{kind}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]}"


def entity_id(layer: int, key: str) -> str:
    """An entity's id: its layer and its resolution key (layer 0: the normalised name)."""
    return make_id("ent", layer, key)


def relation_id(source_id: str, target_id: str, kind: str) -> str:
    """A relation's id: its ends (in canonical order) and its kind."""
    return make_id("rel", source_id, target_id, kind)


_PUNCT = re.compile(r"[^\w\s&+#.-]")
_SPACE = re.compile(r"\s+")
_LEADING = re.compile(r"^(the|a|an|this|that|these|those|his|her|its|their|our|my|your)\s+")


def normalize_name(name: str) -> str:
    """Entity-resolution key: NFKC, casefold, possessive and leading articles dropped, punctuation and spaces folded."""
    text = unicodedata.normalize("NFKC", name).casefold().replace("’", "'")
    text = re.sub(r"'s\b", "", text)
    text = _PUNCT.sub(" ", text)
    text = _SPACE.sub(" ", text).strip(" .-")
    text = _LEADING.sub("", text)
    return text
