"""Extract, LLM path: HiRAG's two passes per chunk — typed entities, then relations between them —
with optional gleaning. Output rows match the offline extractor's, so merge is shared.

``extract_batch_llm`` is the parallel unit (one Dask task per batch of chunks); inside it all
calls of the batch run concurrently under the client's limits. A chunk whose answers stay
unusable is quarantined with the reason; the run goes on.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from schemas.config import ExtractConfig, LLMConfig
from schemas.prompts import ENTITY_TYPES, PromptSet
from tasks.index.extract import ExtractionResult
from tasks.runtime.llm import ParseError, event_loop, parse_json, run_sync
from tasks.runtime.llm_client import shared_client, usage_scope
from tasks.store.ids import quarantine_row


def entity_messages(text: str, prompts: PromptSet) -> list[dict[str, str]]:
    return prompts["extract_entities"].messages(types=", ".join(ENTITY_TYPES), text=text)


def glean_messages(text: str, found: list[dict[str, Any]], prompts: PromptSet) -> list[dict[str, str]]:
    """The entity prompt, the names found so far as the model's answer, then the gleaning prompt."""
    names = ", ".join(e["name"] for e in found)
    return [
        *entity_messages(text, prompts),
        {"role": "assistant", "content": f'{{"entities": [{names}]}}'},
        *prompts["extract_gleaning"].messages(),
    ]


def relation_messages(text: str, entities: list[dict[str, Any]], prompts: PromptSet) -> list[dict[str, str]]:
    listing = "\n".join(f"- {e['name']} ({e['type']})" for e in entities)
    return prompts["extract_relations"].messages(entities=listing, text=text)


def parse_entities(text: str) -> list[dict[str, Any]]:
    data = parse_json(text)
    items = data.get("entities") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ParseError("no 'entities' list")
    out = []
    for it in items:
        if isinstance(it, str):
            it = {"name": it}
        if not isinstance(it, dict):
            continue
        name = str(it.get("name") or it.get("entity_name") or "").strip()
        if not name or len(name) > 200:
            continue
        etype = str(it.get("type") or it.get("entity_type") or "concept").strip().lower()
        out.append(
            {
                "name": name,
                "type": etype if etype in ENTITY_TYPES else "concept",
                "description": str(it.get("description") or "").strip(),
            }
        )
    return out


def parse_relations(known: set[str]):
    def parse(text: str) -> list[dict[str, Any]]:
        data = parse_json(text)
        items = data.get("relations", data.get("relationships")) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ParseError("no 'relations' list")
        out = []
        for it in items:
            if not isinstance(it, dict):
                continue
            src, tgt = str(it.get("source", "")).strip(), str(it.get("target", "")).strip()
            if src.lower() not in known or tgt.lower() not in known or src.lower() == tgt.lower():
                continue  # relations must join extracted entities
            try:
                raw: Any = it.get("strength", it.get("weight", 1))  # JSON: a null fails float() as a string may
                strength = float(raw)
            except (TypeError, ValueError):
                strength = 1.0
            out.append(
                {
                    "source": src,
                    "target": tgt,
                    "description": str(it.get("description") or "").strip(),
                    "weight": max(0.1, min(strength, 10.0)),
                }
            )
        return out

    return parse


async def extract_chunk_llm(client, chunk: dict[str, Any], gleanings: int) -> tuple[list, list]:
    text, prompts = chunk["text"], client.prompts
    version = prompts["extract_entities"].version
    entities = await client.complete(
        entity_messages(text, prompts), prompt_version=version, json_mode=True, parse=parse_entities
    )
    for _ in range(gleanings):
        more = await client.complete(
            glean_messages(text, entities, prompts), prompt_version=version, json_mode=True, parse=parse_entities
        )
        seen = {e["name"].lower() for e in entities}
        new = [e for e in more if e["name"].lower() not in seen]
        if not new:
            break
        entities += new
    relations: list[dict[str, Any]] = []
    if len(entities) > 1:
        relations = await client.complete(
            relation_messages(text, entities, prompts),
            prompt_version=prompts["extract_relations"].version,
            json_mode=True,
            parse=parse_relations({e["name"].lower() for e in entities}),
        )
    ents = [dict(e, description=e["description"] or e["name"], chunk_id=chunk["id"]) for e in entities]
    rels = [
        dict(r, description=r["description"] or f"{r['source']} and {r['target']}", chunk_id=chunk["id"])
        for r in relations
    ]
    return ents, rels


def warm() -> None:
    """Import litellm and start the loop ahead of the first batch (run on every Dask worker when the run starts).

    Such a worker runs several tasks at once, on threads: polars and pandas are imported whole here, before any
    task, because scikit-learn (the hierarchy's GMM) tells frames from arrays by looking them up in ``sys.modules``,
    where a module another thread is still importing is found half-made (AttributeError: partially initialized
    module 'polars')."""
    import litellm  # noqa: F401  (seconds of import, paid while the run ingests and chunks)
    import pandas  # noqa: F401
    import polars  # noqa: F401

    event_loop()


def extract_batch_llm(
    chunks: list[dict[str, Any]],
    cfg: ExtractConfig,
    llm: LLMConfig,
    cache_dir: str,
    share: int | None = 1,
    client=None,
    cap: tuple[str, float] | None = None,
) -> ExtractionResult:
    """The LLM parallel unit: all chunks of the batch concurrently; per-chunk failures are quarantined (the cost
    cap's too: the run stops after the stage, ``flows.pipeline.stop_at_cap``).

    ``share`` is how many workers split the global concurrency, rate limits and ``cap`` (``shared_client``)."""

    client = client or shared_client(llm, cache_dir, share or 1, cap)

    async def run_all():
        with usage_scope() as usage:  # this batch's calls only, though other batches share the client
            results = await asyncio.gather(
                *(extract_chunk_llm(client, c, llm.gleanings) for c in chunks), return_exceptions=True
            )
        return results, usage

    results, usage = run_sync(run_all())
    out = ExtractionResult(usage=asdict(usage))
    for chunk, res in zip(chunks, results):
        if isinstance(res, BaseException):
            out.quarantine.append(quarantine_row(chunk["id"], "extract", f"{type(res).__name__}: {res}"[:1000]))
            continue
        ents, rels = res
        out.entities.extend(ents)
        out.relations.extend(rels)
        out.ok.append(chunk["id"])
    return out
