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
