"""Extract, LLM path: HiRAG's two passes per chunk — typed entities, then relations between them —
with optional gleaning; or, with ``llm.extraction.pack_tokens``, one pass for both over several short chunks at
once (the instructions paid once for the pack, the text once instead of twice), the model naming and relating,
the chunk's own sentences describing (most of a model's answer was descriptions). Output rows match the offline
extractor's, so merge is shared.

``extract_batch_llm`` is the parallel unit (one Dask task per batch of chunks); inside it all
calls of the batch run concurrently under the client's limits. A chunk whose answers stay
unusable is quarantined with the reason; the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import asdict
from typing import Any

from schemas.config import ExtractConfig, LLMConfig
from schemas.prompts import ENTITY_TYPES, PromptSet
from tasks.errors import CostCapReached
from tasks.index.extract import ExtractionResult
from tasks.index.statements import MAX_LABEL_WORDS
from tasks.runtime.llm import ParseError, event_loop, parse_json, run_sync
from tasks.runtime.llm_client import shared_client, usage_scope
from tasks.runtime.text import split_sentences, squash_clip
from tasks.runtime.tokens import count_tokens
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
    return [e for e in map(_entity, items) if e is not None]


def _entity(it: Any) -> dict[str, Any] | None:
    """One entity of an answer (a name alone, or an object), or None where it names nothing usable."""
    if isinstance(it, str):
        it = {"name": it}
    if not isinstance(it, dict):
        return None
    name = str(it.get("name") or it.get("entity_name") or "").strip()
    if not name or len(name) > 200:
        return None
    etype = str(it.get("type") or it.get("entity_type") or "concept").strip().lower()
    return {
        "name": name,
        "type": etype if etype in ENTITY_TYPES else "concept",
        "description": str(it.get("description") or "").strip(),
    }


def parse_relations(known: set[str]):
    def parse(text: str) -> list[dict[str, Any]]:
        data = parse_json(text)
        items = data.get("relations", data.get("relationships")) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ParseError("no 'relations' list")
        return [r for r in (_relation(it, known) for it in items) if r is not None]

    return parse


def _relation(it: Any, known: set[str]) -> dict[str, Any] | None:
    """One relation of an answer, or None where it does not join two different entities of ``known`` (lowercase
    names): relations must join extracted entities."""
    if not isinstance(it, dict):
        return None
    src, tgt = str(it.get("source", "")).strip(), str(it.get("target", "")).strip()
    if src.lower() not in known or tgt.lower() not in known or src.lower() == tgt.lower():
        return None
    try:
        raw: Any = it.get("strength", it.get("weight", 1))  # JSON: a null fails float() as a string may
        strength = float(raw)
    except (TypeError, ValueError):
        strength = 1.0
    return {
        "source": src,
        "target": tgt,
        "description": str(it.get("description") or "").strip(),
        "weight": max(0.1, min(strength, 10.0)),
    }


def packs(chunks: list[dict[str, Any]], pack_tokens: int) -> list[list[dict[str, Any]]]:
    """The chunks of a batch in packs of one prompt: consecutive chunks while their texts come to at most
    ``pack_tokens`` tokens (a longer chunk alone). The same batch gives the same packs, so a re-run asks the
    prompts its cache holds."""
    out: list[list[dict[str, Any]]] = []
    size = 0
    for chunk in chunks:
        n = count_tokens(chunk["text"])
        if out and size + n <= pack_tokens:
            out[-1].append(chunk)
            size += n
        else:
            out.append([chunk])
            size = n
    return out


def packed_messages(texts: list[str], prompts: PromptSet) -> list[dict[str, str]]:
    passages = "\n\n".join(f'Passage {i}:\n"""\n{t}\n"""' for i, t in enumerate(texts, 1))
    return prompts["extract_packed"].messages(types=", ".join(ENTITY_TYPES), passages=passages)


def packed_glean_messages(texts: list[str], found: list[list[dict[str, Any]]], prompts: PromptSet):
    """The packed prompt, the entities found so far (by passage) as the model's answer, then the gleaning prompt."""
    listed = [{"passage": p, "entities": [[e["name"], e["type"]] for e in ents]} for p, ents in enumerate(found, 1)]
    return [
        *packed_messages(texts, prompts),
        {"role": "assistant", "content": json.dumps({"passages": listed}, ensure_ascii=False)},
        *prompts["extract_gleaning"].messages(),
    ]


Found = list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]  # (entities, relations) of each passage


def parse_packed(n: int, known: list[set[str]] | None = None):
    """The parser of a packed answer over ``n`` passages: each passage's entities and relations (a relation joins
    two entities of its passage: those of this answer, or ``known``, the lowercase names found before). The answer
    lists its passages, each with its entities as ``[name, type]`` and its relations as ``[source, label, target,
    strength]`` (the prompt's shape: half the tokens of an object per item), or flat lists of objects that each
    say their passage (``{"passage": 2, "name": …}``). An item whose passage number is missing or out of range is
    dropped (one passage: it is that one); an answer with entities none of which names its passage is a ParseError
    (asked again, then the pack's chunks one by one)."""

    def passage(it: Any) -> int | None:
        raw: Any = it.get("passage", 1 if n == 1 else None) if isinstance(it, dict) else (1 if n == 1 else None)
        try:
            p = int(raw)
        except (TypeError, ValueError):
            return None
        return p - 1 if 1 <= p <= n else None

    def parse(text: str) -> Found:
        data = flat(parse_json(text))
        if not isinstance(data, dict) or not isinstance(data.get("entities"), list):
            raise ParseError("no 'entities' list")
        relations = data.get("relations", data.get("relationships")) or []
        if not isinstance(relations, list):
            raise ParseError("'relations' is not a list")
        out: Found = [([], []) for _ in range(n)]
        placed = 0
        for it in data["entities"]:
            p, entity = passage(it), _entity(it)
            if entity is not None and p is not None:
                out[p][0].append(entity)
                placed += 1
        if data["entities"] and not placed:
            raise ParseError(f"no entity names its passage (a number from 1 to {n})")
        names = [{e["name"].lower() for e in ents} | (known[i] if known else set()) for i, (ents, _) in enumerate(out)]
        for it in relations:
            p = passage(it)
            if p is not None and (relation := _relation(it, names[p])) is not None:
                out[p][1].append(dict(relation, label=_label(it.get("label"))))
        return out

    return parse


_ENTITY_KEYS, _RELATION_KEYS = ("name", "type"), ("source", "label", "target", "strength")


def flat(data: Any) -> Any:
    """A packed answer that lists its passages (``{"passages": [{"passage": 1, "entities": [...], "relations":
    [...]}]}``) as flat lists of items that each say their passage, an item given as a list read by position
    (``_ENTITY_KEYS``, ``_RELATION_KEYS``); any other answer as it is."""
    if not isinstance(data, dict) or not isinstance(data.get("passages"), list):
        return data
    out: dict[str, list[Any]] = {"entities": [], "relations": []}
    for block in data["passages"]:
        if not isinstance(block, dict):
            continue
        for key, names in (("entities", _ENTITY_KEYS), ("relations", _RELATION_KEYS)):
            items = block.get(key)
            for it in items if isinstance(items, list) else ():
                item = dict(zip(names, it)) if isinstance(it, list) else {"name": it} if isinstance(it, str) else it
                if isinstance(item, dict):  # one passage: a block without its number is that one's
                    out[key].append({"passage": block["passage"], **item} if "passage" in block else item)
    return out


def _label(raw: Any) -> str | None:
    """A relation's label as the model gave it: its words lowercased, None where it gives none or more than a
    statement's label holds (``statements.MAX_LABEL_WORDS``)."""
    words = str(raw or "").lower().split()
    return " ".join(words) if 0 < len(words) <= MAX_LABEL_WORDS else None


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


def grounded_rows(chunk: dict[str, Any], found: tuple[list, list], max_chars: int) -> tuple[list, list]:
    """A chunk's entities and relations from a packed answer, described by the chunk's own sentences (the model
    gives names, types and labels, not descriptions, as the offline extractor does): an entity mention per sentence
    that names it (as whole words, whitespace and case aside: "Al" is not named by "also"), or one described by its
    name where none does (a name across a paragraph break); a relation by the first sentence that names both ends,
    else by its statement ("Scrooge employs Bob Cratchit.")."""
    entities, relations = found
    sentences = [(squash_clip(s, max_chars), " ".join(s.split()).lower()) for s in split_sentences(chunk["text"])]

    def naming(*names: str) -> list[str]:
        wanted = [re.compile(rf"(?<!\w){re.escape(' '.join(n.split()).lower())}(?!\w)") for n in names]
        return [said for said, low in sentences if all(w.search(low) for w in wanted)]

    ents = [
        dict(e, description=said, chunk_id=chunk["id"])
        for e in entities
        for said in naming(e["name"]) or [" ".join(e["name"].split())]
    ]
    rels = []
    for r in relations:
        both = naming(r["source"], r["target"])
        statement = f"{r['source']} {r['label'] or 'and'} {r['target']}."
        rels.append(dict(r, description=both[0] if both else statement, chunk_id=chunk["id"]))
    return ents, rels


async def extract_pack_llm(client, pack: list[dict[str, Any]], gleanings: int) -> Found:
    """One pack's entities and relations in one pass (and ``gleanings``), each chunk's apart."""
    texts, prompts = [c["text"] for c in pack], client.prompts
    version = prompts["extract_packed"].version
    found = await client.complete(
        packed_messages(texts, prompts), prompt_version=version, json_mode=True, parse=parse_packed(len(pack))
    )
    for _ in range(gleanings):
        seen = [{e["name"].lower() for e in ents} for ents, _ in found]
        more = await client.complete(
            packed_glean_messages(texts, [ents for ents, _ in found], prompts),
            prompt_version=version,
            json_mode=True,
            parse=parse_packed(len(pack), seen),
        )
        new = [[e for e in ents if e["name"].lower() not in seen[i]] for i, (ents, _) in enumerate(more)]
        if not any(new):
            break
        found = [(ents + new[i], rels + more[i][1]) for i, (ents, rels) in enumerate(found)]
    return found


async def extract_packed_llm(
    client, pack: list[dict[str, Any]], gleanings: int, max_chars: int
) -> list[tuple[list, list] | BaseException]:
    """A pack's chunks' rows (``grounded_rows``); where the pack's answer stays unusable, each of its chunks asked
    alone (so one bad answer costs no other chunk), and a chunk that fails alone is the exception it failed with."""
    try:
        found = await extract_pack_llm(client, pack, gleanings)
    except Exception as exc:  # noqa: BLE001 - the pack fails as a whole: its chunks one by one
        if len(pack) == 1 or isinstance(exc, CostCapReached):  # past the cap no chunk is asked again
            return [exc] * len(pack)
        alone = await asyncio.gather(*(extract_packed_llm(client, [c], gleanings, max_chars) for c in pack))
        return [one[0] for one in alone]
    return [grounded_rows(chunk, one, max_chars) for chunk, one in zip(pack, found)]


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
    pack_tokens: int = 0,
) -> ExtractionResult:
    """The LLM parallel unit: all chunks of the batch concurrently (HiRAG's two passes per chunk; with
    ``pack_tokens``, one pass per pack of chunks, ``packs``); per-chunk failures are quarantined (the cost cap's
    too: the run stops after the stage, ``flows.pipeline.stop_at_cap``).

    ``share`` is how many workers split the global concurrency, rate limits and ``cap`` (``shared_client``)."""

    client = client or shared_client(llm, cache_dir, share or 1, cap)

    async def run_all():
        with usage_scope() as usage:  # this batch's calls only, though other batches share the client
            if not pack_tokens:
                results = await asyncio.gather(
                    *(extract_chunk_llm(client, c, llm.gleanings) for c in chunks), return_exceptions=True
                )
            else:
                by_pack = await asyncio.gather(
                    *(
                        extract_packed_llm(client, p, llm.gleanings, cfg.max_sentence_chars)
                        for p in packs(chunks, pack_tokens)
                    )
                )
                results = [r for rows in by_pack for r in rows]
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
