"""Summary entities for a layer's clusters (HiRAG §4.1), guided by meta summary entities.

Two implementations behind one interface, ``summarize_layer(layer, clusters) -> summaries``:

* ``OfflineSummarizer`` (zero tokens): the name is the names of the cluster's leading members
  (``leading_members``: names a reader would look up first, then the best connected), the type is
  the meta summary entity most members map to, and the description is whole, distinct sentences of
  the members it is named by and of those closest to the cluster centroid (no list of names: the
  ``summary_of`` links list the members).
* ``LLMSummarizer``: one prompt per cluster through the ``LLMClient``; all clusters of a layer
  run concurrently. An unusable answer falls back to the offline summary for that cluster and
  is reported, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from schemas.prompts import PromptSet
from tasks.methods.reports import central_sentences
from tasks.runtime.llm import LLMClient, ParseError, parse_json, run_sync
from tasks.runtime.tokens import clip_tokens, truncate_tokens
from tasks.store.ids import make_id, relation_id

#: extracted entity type -> meta summary entity it rolls up to
TYPE_TO_META = {
    "person": "person",
    "group": "organization",
    "organization": "organization",
    "location": "location",
    "event": "event",
    "technology": "technology",
    "work": "work",
    "law": "concept",
    "language": "concept",
    "time": "time",
    "concept": "concept",
}


@dataclass
class Cluster:
    members: list[dict[str, Any]]  # entity rows of the layer below (id, name, type, description)
    vectors: np.ndarray  # their vectors, same order; with ``rows``: the layer's matrix, theirs are those rows
    rows: np.ndarray | None = None

    def matrix(self) -> np.ndarray:
        """The members' vectors, taken from the layer's matrix only when asked (a layer's clusters each holding
        a copy of their rows would copy the matrix once more: ~500 MB at 100k chunks)."""
        return self.vectors if self.rows is None else self.vectors[self.rows]


class Summarizer(Protocol):
    failures: list[dict[str, str]]  # clusters whose LLM summary was unusable (an offline one stands in)

    def summarize_layer(self, layer: int, clusters: list[Cluster]) -> list[list[dict[str, Any]]]:
        """For each cluster, at least one summary entity ``{name, type, description}``."""
        ...


def meta_type(members: list[dict[str, Any]], meta: list[str]) -> str:
    votes = Counter(TYPE_TO_META.get(m["type"], m["type"]) for m in members)
    ranked = sorted(votes, key=lambda t: (-votes[t], t))
    for t in ranked:
        if t in meta:
            return t
    return "concept" if "concept" in meta else meta[0]


#: members' names an offline summary is named by
NAMED_BY = 2


def _centrality(cluster: Cluster) -> np.ndarray:
    """Each member's closeness to the cluster's centroid (dot product with the mean vector)."""
    vectors = cluster.matrix()
    return vectors @ vectors.mean(axis=0) if len(vectors) else np.zeros(len(cluster.members))


def _most(sims: np.ndarray, k: int) -> list[int]:
    """The ``k`` highest of ``sims`` (earlier first among equals)."""
    return [int(i) for i in np.lexsort((np.arange(len(sims)), -sims))[:k]]


#: a name as written by a reader: words of letters and digits joined by spaces, apostrophes, periods or single
#: hyphens ("Mr. Fezziwig", "blind man's-buff"), not a span broken by punctuation ("me;--in life")
_CLEAN_NAME = re.compile(r"[^\W_][\w'’.]*(?:(?: |-)[\w'’.]+)*")


def name_rank(member: dict[str, Any]) -> int:
    """How well a member's name names its summary, best first: 0 a named thing (typed other than ``concept`` or
    ``time``, or written with a capital; a heading in capitals longer than an acronym is not one), 1 a phrase of
    several words or a date ("Iron Maiden", not "January 1980", names a cluster of albums), 2 one lowercase word
    ("hand", "door"), 3 a span broken by punctuation."""
    name = lead_name(member["name"])
    if not _CLEAN_NAME.fullmatch(name):
        return 3
    if member.get("type") == "time":
        return 1
    if (member.get("type") not in (None, "concept") or name != name.lower()) and not (name.isupper() and len(name) > 5):
        return 0
    return 1 if len(name.split()) > 1 else 2


def lead_name(name: str) -> str:
    """The first of a summary's " / "-separated names (a member's own name when it is not a summary)."""
    return name.split(" / ", 1)[0].strip()


def leading_members(members: list[dict[str, Any]], sims: np.ndarray) -> list[int]:
    """The members in the order a summary is named and listed by: the best names first (``name_rank``), then the
    best connected (``degree``: a layer-0 entity's relations, a summary's members),
    then the closest to the centroid (``sims``), then by name (deterministic)."""
    rank = lambda i: (name_rank(members[i]), -int(members[i].get("degree") or 0), -float(sims[i]), members[i]["name"])  # noqa: E731
    return sorted(range(len(members)), key=rank)


def own_text(member: dict[str, Any]) -> str:
    """A member's description without the head line an offline summary of an index built before 2026-12-07 starts
    with (its list of names: an update reads such summaries as members of the layer above)."""
    text = member["description"]
    return text.split("\n", 1)[1] if member.get("layer", 0) and "\n" in text else text


def distinct_names(cluster: Cluster, order: list[int], k: int) -> list[str]:
    """The first ``k`` distinct lead names (``lead_name``) of the members in ``order``."""
    out: list[str] = []
    for i in order:
        name = lead_name(cluster.members[i]["name"])
        if name and name not in out:
            out.append(name)
            if len(out) == k:
                break
    return out


class OfflineSummarizer:
    def __init__(self, meta_entities: list[str], max_description_tokens: int = 250):
        self.meta = meta_entities
        self.max_tokens = max_description_tokens
        self.failures: list[dict[str, str]] = []  # never any: the same interface as the LLM summarizer

    def summarize_layer(self, layer: int, clusters: list[Cluster]) -> list[list[dict[str, Any]]]:
        """Each cluster's summary: named by its leading members' distinct names, described by whole, distinct
        sentences of its first ``NAMED_BY`` leading members (the ones it is named by, unless two share a name),
        then of those closest to its centroid (each one's first sentence before any second: ``central_sentences``),
        within the description budget; no list of names."""
        out = []
        for cluster in clusters:
            sims = _centrality(cluster)
            order = leading_members(cluster.members, sims)
            name = " / ".join(distinct_names(cluster, order, NAMED_BY))
            texts = [own_text(cluster.members[i]) for i in dict.fromkeys(order[:NAMED_BY] + _most(sims, 3))]
            description = " ".join(central_sentences(texts, self.max_tokens))
            out.append([{"name": name, "type": meta_type(cluster.members, self.meta), "description": description}])
        return out


def summary_prompt(
    members: list[dict[str, Any]], meta: list[str], n: int, max_tokens: int, prompts: PromptSet
) -> list[dict[str, str]]:
    """HiRAG's summary entities of one cluster (prompt ``summary``)."""
    listing = "\n".join(f"- {m['name']} ({m['type']}): {truncate_tokens(m['description'], 80)}" for m in members)
    return prompts["summary"].messages(
        categories=", ".join(meta), entities=truncate_tokens(listing, max_tokens * 8), n=n
    )


def synthesis_prompt(
    members: list[dict[str, Any]], meta: list[str], n: int, max_tokens: int, prompts: PromptSet
) -> list[dict[str, str]]:
    """HyGRAG's summary node (prompt ``hygrag_synthesis``): a bucket holds passages (type ``chunk``) and entities;
    the summary synthesises the context the passages share and the relations among the entities, within
    ``max_tokens``."""
    listing = "\n".join(
        f"- [{'passage' if m['type'] == 'chunk' else m['type']}] {m['name']}: {truncate_tokens(m['description'], 120)}"
        for m in members
    )
    return prompts["hygrag_synthesis"].messages(
        types=", ".join(meta), group=truncate_tokens(listing, max_tokens * 8), n=n, max_tokens=max_tokens
    )


#: the prompts a cluster's summary can be asked with (``schemas.prompts``), each with what builds its messages
CLUSTER_PROMPTS = {"summary": summary_prompt, "hygrag_synthesis": synthesis_prompt}


class LLMSummarizer:
    """Summary entities through an LLM; every cluster of a layer is sent concurrently. ``prompt`` names the prompt
    one cluster is asked with (``CLUSTER_PROMPTS``: HiRAG's ``summary`` by default), in the client's wording."""

    def __init__(
        self,
        client: LLMClient,
        meta_entities: list[str],
        per_cluster: int = 1,
        max_description_tokens: int = 250,
        prompt: str = "summary",
        min_members: int = 0,
    ):
        self.prompt = prompt
        self.min_members = min_members  # a smaller cluster gets the offline summary, without a call
        self.client = client
        self.meta = meta_entities
        self.per_cluster = per_cluster
        self.max_tokens = max_description_tokens
        self.fallback = OfflineSummarizer(meta_entities, max_description_tokens)
        self.failures: list[dict[str, str]] = []

    def _parse(self, cluster: Cluster, text: str) -> list[dict[str, Any]]:
        data = parse_json(text)
        items = data.get("summary_entities", data.get("entities")) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ParseError("no summary_entities list")
        out = []
        for item in items[: self.per_cluster]:
            if not isinstance(item, dict) or not str(item.get("name", "")).strip():
                continue
            name = str(item["name"]).strip()
            etype = str(item.get("type", "")).strip().lower()
            out.append(
                {
                    "name": name[:200],
                    "type": etype if etype in self.meta else meta_type(cluster.members, self.meta),
                    "description": clip_tokens(str(item.get("description", "")).strip() or name, self.max_tokens),
                }
            )
        if not out:
            raise ParseError("no summary entity with a name")
        return out

    async def _one(self, cluster: Cluster) -> list[dict[str, Any]] | None:
        prompts = self.client.prompts
        messages = CLUSTER_PROMPTS[self.prompt](cluster.members, self.meta, self.per_cluster, self.max_tokens, prompts)
        try:
            return await self.client.complete(
                messages,
                prompt_version=prompts[self.prompt].version,
                json_mode=True,
                parse=lambda t: self._parse(cluster, t),
            )
        except Exception as exc:  # noqa: BLE001 - fall back, never lose the cluster
            self.failures.append(
                {"item": ",".join(m["id"] for m in cluster.members[:3]), "error": f"{type(exc).__name__}: {exc}"}
            )
            return None

    async def _all(self, clusters: list[Cluster]) -> list[list[dict[str, Any]] | None]:
        return await asyncio.gather(*(self._one(c) for c in clusters))

    def summarize_layer(self, layer: int, clusters: list[Cluster]) -> list[list[dict[str, Any]]]:
        asked = [i for i, c in enumerate(clusters) if len(c.members) >= self.min_members]
        results: list[list[dict[str, Any]] | None] = [None] * len(clusters)
        for i, answer in zip(asked, run_sync(self._all([clusters[i] for i in asked]))):
            results[i] = answer
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            offline = self.fallback.summarize_layer(layer, [clusters[i] for i in missing])
            for i, summary in zip(missing, offline):
                results[i] = summary
        return results  # type: ignore[return-value]


def summary_entity_id(layer: int, member_ids: list[str], j: int) -> str:
    return make_id("ent", layer, "summary", ",".join(sorted(member_ids)), j)


def summary_rows(
    layer: int, clusters: list[Cluster], summaries: list[list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Entity rows of layer ``layer`` and the ``summary_of`` relations (member -> summary)."""
    entities, relations = [], []
    for cluster, items in zip(clusters, summaries):
        member_ids = [m["id"] for m in cluster.members]
        for j, item in enumerate(items):
            sid = summary_entity_id(layer, member_ids, j)
            entities.append(
                {
                    "id": sid,
                    "name": item["name"],
                    "type": item["type"],
                    "description": item["description"],
                    "layer": layer,
                    "source_chunk_ids": [],
                    "degree": len(member_ids),
                }
            )
            for m in cluster.members:
                relations.append(
                    {
                        "id": relation_id(m["id"], sid, "summary_of"),
                        "source_id": m["id"],
                        "target_id": sid,
                        "kind": "summary_of",
                        "description": "",  # a link, not a text: the names are the entities' (a rename
                        # of the summary then rewrites no member link)
                        "weight": 1.0,
                        "source_chunk_ids": [],
                    }
                )
    return entities, relations
