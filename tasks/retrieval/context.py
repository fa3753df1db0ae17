"""What a question's retrieval fills: the ``Context`` (sections, token counts, seeds) and the primitives every
mode and method uses to fill it within a token budget (``budgets``, ``fill``, ``top_k``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas.config import RetrievalConfig
from tasks.runtime.tokens import count_tokens, truncate_tokens

if TYPE_CHECKING:
    from tasks.retrieval.view import IndexView


# ---------------------------------------------------------------------------- the three levels
def top_k(scores: np.ndarray, k: int, candidates: np.ndarray | None = None) -> list[int]:
    """Indices of the k best scores, best first, ties broken by index (deterministic)."""
    idx = np.arange(len(scores)) if candidates is None else candidates
    if len(idx) == 0:
        return []
    s = scores[idx]
    if len(idx) > k:
        part = np.argpartition(-s, k - 1)[:k]
        idx, s = idx[part], s[part]
    order = np.lexsort((idx, -s))
    return [int(i) for i in idx[order]]


# ---------------------------------------------------------------------------- context assembly
@dataclass
class Context:
    question: str
    mode: str
    version: int
    entities: list[dict[str, Any]] = field(default_factory=list)
    communities: list[dict[str, Any]] = field(default_factory=list)
    bridge: list[dict[str, Any]] = field(default_factory=list)
    chunks: list[dict[str, Any]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    message: str = ""
    ranked_chunk_ids: list[str] = field(default_factory=list)  # the source ranking before the budget
    seeds: dict[str, list[str]] = field(default_factory=dict)  # graph-ranked sources: entities that seeded the walk
    query_vector: Any = None  # the question's vector (for a method's own search)

    @property
    def empty(self) -> bool:
        return not (self.entities or self.communities or self.bridge or self.chunks)

    def text(self) -> str:
        """The context as an LLM prompt section (also what evaluation searches for the answer)."""
        parts = []
        if self.entities:
            parts.append("## Entities\n" + "\n".join(e["text"] for e in self.entities))
        if self.communities:
            parts.append("## Community reports\n" + "\n".join(c["text"] for c in self.communities))
        if self.bridge:
            parts.append("## Reasoning paths\n" + "\n".join(b["text"] for b in self.bridge))
        if self.chunks:
            parts.append("## Sources\n" + "\n".join(c["text"] for c in self.chunks))
        return "\n\n".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """The context as plain data (``strata query --json``, the service): texts with Unix line ends."""

        def plain(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [
                it | {"text": it["text"].replace("\r\n", "\n")} if "\r" in it.get("text", "") else it for it in items
            ]

        return {
            "question": self.question,
            "mode": self.mode,
            "version": self.version,
            "message": self.message,
            "tokens": self.tokens,
            "entities": plain(self.entities),
            "communities": plain(self.communities),
            "bridge": plain(self.bridge),
            "chunks": plain(self.chunks),
            "seeds": self.seeds,
        }


def source_item(view: IndexView, j: int, scores: np.ndarray) -> dict[str, Any]:
    """Chunk ``j`` as a sources item: whole, its document's title first."""
    doc = view.chunk_doc[j]
    return {
        "id": view.chunk_ids[j],
        "document_id": doc,
        "source_id": view.doc_source.get(doc),
        "title": view.doc_title.get(doc),
        "score": round(float(scores[j]), 4),
        "text": f"[{view.doc_title.get(doc)}] {view.chunk_text[j]}",
    }


def budgets(cfg: RetrievalConfig, sections: tuple[str, ...]) -> dict[str, int]:
    shares = {s: getattr(cfg, f"share_{s}") for s in (*sections, "chunks")}
    total = sum(shares.values()) or 1.0
    return {s: int(cfg.token_budget * v / total) for s, v in shares.items()}


def fill(items: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Items in order while they fit; the first item that does not fit is cut to the remaining budget."""
    out, used = [], 0
    for it in items:
        n = count_tokens(it["text"])
        if used + n > budget:
            left = budget - used
            if left > 20:
                it = dict(it, text=truncate_tokens(it["text"], left), truncated=True)
                out.append(it)
                used += count_tokens(it["text"])
            break
        out.append(it)
        used += n
    return out, used
