"""What a run's LLM calls will cost, before any is made (``strata index|update|backfill --estimate``).

Extraction's prompts are known before the run: each chunk's entity prompt is built as the run builds it, counted
with the model's tokenizer (litellm's, cl100k where litellm has none offline) and looked up in the response cache,
so what a killed or capped run already paid for is subtracted; the relation prompt that follows it is exact where
the entity answer is cached, else the same prompt listing as many entities as the chunk names things (``names_in``:
runs of capitalised words, what a model lists first). Summaries and reports are made from the graph extraction
finds. A HiRAG update walks its own rules on the index it updates, with a client that counts each prompt and
answers none (``CountingClient``, ``tasks.methods.update_estimate``). Otherwise they are scaled by the ratios this
index's latest run of the same kind recorded (``runs.stage_counts``), per corpus token it extracted, else by the
stated ``DEFAULT_RATIOS``, per distinct thing the run's chunks name (a corpus of short passages names many more
things a token than a novel, and its graph is that much larger), growing with the graph (a larger one has a deeper
hierarchy); a build whose stage sends only clusters or communities of ``min_members`` or more is scaled to those
(``SENT``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from schemas.llm import LLMConfig, Stage
from schemas.prompts import PromptSet
from tasks.index.estimate_names import names_in
from tasks.runtime.llm_client import cache_key, request_params
from tasks.runtime.llm_cost import model_prices, register_price
from tasks.runtime.tokens import count_tokens

log = logging.getLogger("strata.llm")

#: the run stages whose LLM calls are each LLM stage's (``runs.stage_counts``)
RUN_STAGES: dict[Stage, tuple[str, ...]] = {
    "extraction": ("extract",),
    "summaries": ("hierarchy", "attach"),
    "reports": ("communities", "reports"),
}


@dataclass(frozen=True)
class Ratios:
    """One stage's calls and prompt tokens per unit (``per``: a corpus token the run extracts, or a thing its chunks
    name), and its completion tokens per prompt token; ``basis`` says where they come from. With ``grow``, the
    calls and tokens per unit are those at ``at`` units and grow as (units / ``at``) ** ``grow`` (a larger graph has
    a deeper hierarchy: more summary layers and community levels, each listing its members again)."""

    calls: float
    prompt: float
    output: float
    basis: str
    per: str = "corpus token"
    at: float = 1.0
    grow: float = 0.0

    def per_unit(self, units: float) -> float:
        """The factor on ``calls`` and ``prompt`` at ``units`` units."""
        return (units / self.at) ** self.grow if self.grow and units > 0 else 1.0


#: stated ratios where this index has no run of the kind to learn from, by stage, extractor ("llm": a model's graph,
#: per distinct thing the run's chunks name; "packed": the same from packed extraction, whose entities carry no
#: description; "nlp": the offline extractor's, per layer-0 entity it finds) and kind of run ("update": a small delta
#: rewrites the summaries and reports of every ancestor it touches; a HiRAG update is walked instead), with every
#: cluster and community sent to the model (``min_members`` 0). Measured with the local server's answers of a
#: model's length (``benchmarks/bench_llm_cost.py``): a model's builds on MuSiQue (12,061 names), the book (684) and
#: this project's docs with the business set (436), the calls and tokens per name at 1,000 names and their growth
#: with the names fitted on the three (their errors, and each left out in turn, in docs/benchmarks.md); the updates
#: and the offline graph's on MuSiQue (1,871 passages, then 19 more).
DEFAULT_RATIOS: dict[str, Ratios] = {
    "summaries/llm/build": Ratios(0.0399, 43.1, 0.11, "default", "name", at=1000, grow=0.24),
    "reports/llm/build": Ratios(0.198, 118.2, 0.51, "default", "name", at=1000, grow=0.17),
    "summaries/packed/build": Ratios(0.0361, 41.9, 0.11, "default", "name", at=1000, grow=0.275),
    "reports/packed/build": Ratios(0.192, 131.6, 0.51, "default", "name", at=1000, grow=0.174),
    "summaries/llm/update": Ratios(0.184, 144.3, 0.15, "default", "name"),
    "reports/llm/update": Ratios(0.380, 286.8, 0.50, "default", "name"),
    "summaries/nlp/build": Ratios(0.0626, 84.6, 0.084, "default", "entity"),
    "summaries/nlp/update": Ratios(0.150, 146.3, 0.084, "default", "entity"),
    "reports/nlp/build": Ratios(0.290, 229.1, 0.38, "default", "entity"),
    "reports/nlp/update": Ratios(0.324, 329.6, 0.38, "default", "entity"),
}
#: an entity's line in a relation prompt ("- Bob Cratchit (person)"), and what a model writes per entity and per
#: relation it finds (a name, a type, a sentence of description), in tokens
LISTED_TOKENS, ENTITY_ANSWER_TOKENS, RELATION_ANSWER_TOKENS = 8, 45, 40
#: a packed answer's entity (``[name, type]``) and relation (``[source, label, target, strength]``) under its
#: passage: no description, no keys (measured on the local server's answers of a model's length: docs/benchmarks.md)
PACKED_ENTITY_TOKENS, PACKED_RELATION_TOKENS = 9, 18


@dataclass
class StageEstimate:
    stage: str
    model: str
    calls: int = 0
    cached: int = 0  # calls answered from the cache: not paid
    input_tokens: int = 0  # of the calls to make
    output_tokens: int = 0  # expected, of the calls to make
    cost_usd: float = 0.0
    basis: str = ""

    def priced(self, llm: LLMConfig) -> StageEstimate:
        register_price(llm)
        cin, cout = model_prices(llm.model)
        self.cost_usd = round(self.input_tokens * cin + self.output_tokens * cout, 6)
        return self

    def row(self) -> dict[str, Any]:
        return asdict(self)


def prompt_tokens(model: str, messages: list[dict[str, str]]) -> int:
    """A chat prompt's tokens as ``model``'s provider bills them: litellm's count (its tokenizer for the model where
    it has one offline), else cl100k's with OpenAI's overhead (3 tokens a message, 3 for the reply)."""
    try:
        import litellm

        return int(litellm.token_counter(model=model, messages=messages))
    except Exception:  # noqa: BLE001 - a tokenizer litellm would fetch, or a model it cannot parse
        return sum(count_tokens(m["content"]) + 3 for m in messages) + 3


def extraction_estimate(
    batches: Iterable[list[str]], llm: LLMConfig, gleanings: int, cache: Any, pack_tokens: int = 0
) -> StageEstimate:
    """The extraction stage's calls and tokens for the chunks' texts, a batch of extraction at a time (``batches``,
    as its tasks read them): HiRAG's entity pass (and ``gleanings``), then the relation pass, as
    ``tasks.index.extract_llm`` sends them; with ``pack_tokens``, one pass per pack of a batch's chunks. Answers in
    ``cache`` (a ``ResponseCache``, or None) are not counted, nor is a relation pass that a cached entity answer
    shows will not be made. Output: the entities a chunk names, and a relation between each and the next, at a
    model's length a piece."""
    from tasks.index.extract_llm import packs

    est = StageEstimate("extraction", llm.model, basis="prompts counted")
    ask = _Asker(llm, cache, est)
    for batch in batches:
        if pack_tokens:
            for pack in packs([{"text": t} for t in batch], pack_tokens):
                ask.pack([c["text"] for c in pack], gleanings)
        else:
            for text in batch:
                ask.chunk(text, gleanings)
    return est.priced(llm)


def cached_answer(cache: Any, llm: LLMConfig, key: str) -> str | None:
    """The answer the run would take from ``cache`` for ``key`` without asking: the cached one, or "" where the
    prompt is remembered as unparseable and ``llm`` does not ask again; None where the run would pay."""
    hit = cache.get(key)
    if hit is None and not llm.retry_unparseable and cache.failure(key) is not None:
        return ""
    return hit


class _Asker:
    """What extraction would ask, counted into ``est``: a prompt whose answer ``cache`` holds costs nothing."""

    def __init__(self, llm: LLMConfig, cache: Any, est: StageEstimate):
        self.llm, self.cache, self.est = llm, cache, est
        self.params = request_params(llm, json_mode=True)  # the client's, so that the keys are the client's
        self.prompts = PromptSet(llm.prompts)  # the client's

    def cached(self, messages: list[dict[str, str]], prompt: str) -> str | None:
        if self.cache is None:
            return None
        return cached_answer(
            self.cache, self.llm, cache_key(self.llm.model, messages, self.params, self.prompts[prompt].version)
        )

    def pay(self, messages: list[dict[str, str]], more_prompt: int, answer: int) -> None:
        self.est.calls += 1
        self.est.input_tokens += prompt_tokens(self.llm.model, messages) + more_prompt
        self.est.output_tokens += answer

    def chunk(self, text: str, gleanings: int) -> None:
        """HiRAG's two passes over one chunk."""
        from tasks.index.extract_llm import entity_messages, glean_messages, parse_entities, relation_messages

        prompts = self.prompts
        first = entity_messages(text, prompts)
        answer = self.cached(first, "extract_entities")
        if answer is None:
            n = max(len(names_in(text)), 1)
            self.pay(first, 0, n * ENTITY_ANSWER_TOKENS)
            for _ in range(gleanings):  # the first answer's names listed, and a line more to ask
                self.pay(first, n * LISTED_TOKENS + 30, 2 * ENTITY_ANSWER_TOKENS)
            if n > 1:
                self.pay(relation_messages(text, [], prompts), n * LISTED_TOKENS, (n - 1) * RELATION_ANSWER_TOKENS)
            return
        self.est.cached += 1
        try:
            entities = parse_entities(answer) if answer else []
        except Exception:  # noqa: BLE001 - an unparseable answer: the chunk is quarantined, no relation pass
            return
        exact = True
        for _ in range(gleanings):  # each gleaning prompt lists what the passes before it found
            more = glean_messages(text, entities, prompts)
            found = self.cached(more, "extract_entities")
            if found is None:
                self.pay(more, 0, 2 * ENTITY_ANSWER_TOKENS)
                exact = False  # what it would add is not known: the relation pass is counted on what is
                break
            self.est.cached += 1
            seen = {e["name"].lower() for e in entities}
            new = [e for e in (parse_entities(found) if found else []) if e["name"].lower() not in seen]
            if not new:
                break
            entities += new
        if len(entities) > 1 or not exact:
            second = relation_messages(text, entities, prompts)
            if exact and self.cached(second, "extract_relations") is not None:
                self.est.cached += 1
            else:
                self.pay(second, 0, max(len(entities) - 1, 1) * RELATION_ANSWER_TOKENS)

    def pack(self, texts: list[str], gleanings: int) -> None:
        """One pass over a pack of chunks: names, types and labelled pairs, no descriptions."""
        from tasks.index.extract_llm import packed_glean_messages, packed_messages, parse_packed

        messages = packed_messages(texts, self.prompts)
        answer = self.cached(messages, "extract_packed")
        names = [max(len(names_in(t)), 1) for t in texts]
        if answer is None:
            self.pay(messages, 0, sum(n * PACKED_ENTITY_TOKENS + (n - 1) * PACKED_RELATION_TOKENS for n in names))
            for _ in range(gleanings):
                self.pay(messages, sum(names) * (LISTED_TOKENS + 5) + 30, 2 * PACKED_ENTITY_TOKENS * len(texts))
            return
        self.est.cached += 1
        try:
            if not answer:
                raise ValueError("remembered as unparseable")
            found = [ents for ents, _ in parse_packed(len(texts))(answer)]
        except Exception:  # noqa: BLE001 - a pack's chunks are asked again one by one; a chunk alone is quarantined
            for text in texts if len(texts) > 1 else ():
                self.pack([text], gleanings)
            return
        for _ in range(gleanings):
            more = packed_glean_messages(texts, found, self.prompts)
            hit = self.cached(more, "extract_packed")
            if hit is None:
                self.pay(more, 0, 2 * PACKED_ENTITY_TOKENS * len(texts))
                return
            self.est.cached += 1
            seen = [{e["name"].lower() for e in ents} for ents in found]
            new = [
                [e for e in ents if e["name"].lower() not in seen[i]]
                for i, (ents, _) in enumerate(parse_packed(len(texts), seen)(hit) if hit else [])
            ]
            if not any(new):
                return
            found = [ents + new[i] for i, ents in enumerate(found)]


class CountingClient:
    """An LLM client for an estimate (``tasks.runtime.llm.LLMClient``'s interface): each prompt it is asked is
    counted into ``est`` as the run would send it (cached where ``cache`` holds its answer, a model's answer of
    ``output`` completion tokens per prompt token expected otherwise), and none is answered: the caller's offline
    fallback stands in, so that a walk of a stage's rules goes on without a call."""

    def __init__(self, llm: LLMConfig, cache: Any, est: StageEstimate, output: float):
        self.llm, self.cache, self.est, self.output = llm, cache, est, output
        self.prompts = PromptSet(llm.prompts)  # the client's

    async def complete(
        self, messages: list[dict[str, str]], *, prompt_version: str, json_mode: bool = False, parse: Any = None
    ) -> Any:
        key = cache_key(self.llm.model, messages, request_params(self.llm, json_mode=json_mode), prompt_version)
        if self.cache is not None and cached_answer(self.cache, self.llm, key) is not None:
            self.est.cached += 1
        else:
            prompt = prompt_tokens(self.llm.model, messages)
            self.est.calls += 1
            self.est.input_tokens += prompt
            self.est.output_tokens += round(prompt * self.output)
        raise EstimateOnly("an estimate answers no prompt")


class EstimateOnly(RuntimeError):
    """What ``CountingClient`` answers: the caller falls back to its offline result."""


#: a build with ``min_members`` K sends a stage the clusters (summaries) or communities (reports) of K entities or
#: more: about c · N / K of them for N entities (units), each prompt of about p tokens (the large ones near the
#: stage's input cap). (K, c, p) measured with the offline graph at K = 10 and 100 on full MuSiQue and the book
#: (``benchmarks/bench_llm_cost.py --mixes fast-min10 fast-top``; the two corpora within about a third of each other),
#: interpolated in log K between, held outside; an update's touched ancestors do not follow N / K (upper bound kept).
SENT: dict[str, tuple[tuple[int, float, float], tuple[int, float, float]]] = {
    "summaries": ((10, 0.41, 1514.0), (100, 0.52, 2121.0)),
    "reports": ((10, 0.70, 1174.0), (100, 0.345, 1547.0)),
}


def sent_per_entity(stage: str, k: int) -> tuple[float, float]:
    """(c, p) of ``SENT`` at ``min_members`` ``k``: calls c · N / k, p prompt tokens each."""
    (k0, c0, p0), (k1, c1, p1) = SENT[stage]
    t = min(max((math.log(k) - math.log(k0)) / (math.log(k1) - math.log(k0)), 0.0), 1.0)
    return c0 + t * (c1 - c0), p0 + t * (p1 - p0)


def scaled_estimate(
    stage: Stage, llm: LLMConfig, units: dict[str, int], ratios: Ratios, min_members: int = 0, kind: str = "build"
) -> StageEstimate:
    """A stage whose prompts are made from what extraction finds: ``ratios`` of the run's ``units`` ("corpus token":
    the corpus tokens it extracts; "name": the distinct things its chunks name; "entity": the layer-0 entities the
    offline extractor finds in them, ``offline_entities``). With the stage's ``min_members`` and the stated ratios
    (which send every cluster and community), a build sends only the large ones (``SENT``); ratios learned from a
    run with the same ``min_members`` already count only those."""
    n = units[ratios.per]
    prompt = round(n * ratios.prompt * ratios.per_unit(n))
    calls = max(round(n * ratios.calls * ratios.per_unit(n)), 1) if prompt else 0
    basis = ratios.basis if ratios.basis != "default" else f"default, per {ratios.per}"
    if min_members > 1 and ratios.basis == "default" and kind == "build" and calls:
        c, p = sent_per_entity(stage, min_members)
        sent = min(calls, max(round(c * n / min_members), 1))
        calls, prompt = sent, min(prompt, round(sent * p))
        basis = f"{basis}, of {min_members}+ members"
    return StageEstimate(
        stage, llm.model, calls=calls, input_tokens=prompt, output_tokens=round(prompt * ratios.output), basis=basis
    ).priced(llm)


def run_kind(stage_counts: dict[str, Any]) -> str:
    """ "update" for a run that applied a diff to a snapshot, else "build"."""
    return "update" if "diff" in stage_counts else "build"


def stage_settings(fingerprint: dict[str, Any], stage: Stage) -> dict[str, Any]:
    """What of a run's config (``StrataConfig.fingerprint``) shapes ``stage``'s prompts beyond the graph: the
    stage's own model settings (``min_members`` included: how many clusters or communities are sent), the ``[llm]``
    model it may inherit, and the prompts."""
    llm = fingerprint.get("llm") or {}
    return {"stage": llm.get(stage), "model": llm.get("model"), "prompts": llm.get("prompts")}


def learned_ratios(
    runs: list[dict[str, Any]], kind: str, fingerprint: dict[str, Any] | None = None
) -> dict[Stage, Ratios]:
    """Each LLM stage's ratios as the latest run of ``kind`` of this index recorded them (a run that made that stage's
    calls and recorded their prompt and completion tokens, ``PipelineRun.stage``), per corpus token it extracted.
    With ``fingerprint`` (this run's config), a stage learns only from a run whose ``stage_settings`` were the same:
    a run with another model or another ``min_members`` sent other prompts (a run recorded without its config
    counts as the same)."""
    import json

    learned: dict[Stage, Ratios] = {}
    for run in reversed(runs):
        counts = run.get("stage_counts") or "{}"
        stages = json.loads(counts) if isinstance(counts, str) else counts
        if run.get("status") != "published" or run_kind(stages) != kind:
            continue
        corpus = float(stages.get("chunk", {}).get("tokens") or 0)
        if corpus <= 0:
            continue
        config = (json.loads(run.get("parameters") or "{}") or {}).get("config")
        for stage, names in RUN_STAGES.items():
            if stage in learned:
                continue
            if (
                fingerprint is not None
                and config
                and stage_settings(config, stage) != stage_settings(fingerprint, stage)
            ):
                continue
            rows = [stages[n] for n in names if n in stages]
            calls = sum(r.get("llm_calls", 0) for r in rows)
            prompt = sum(r.get("llm_prompt_tokens", 0) for r in rows)
            completion = sum(r.get("llm_completion_tokens", 0) for r in rows)
            if calls and prompt:
                basis = f"learned from run v{run.get('version', '?')}"
                learned[stage] = Ratios(calls / corpus, prompt / corpus, completion / prompt, basis)
    return learned


def comparable(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """What of a run's config shapes its prompts: all but where it ran and its cost cap."""
    kept = {k: v for k, v in fingerprint.items() if k not in ("dask", "serve", "storage")}
    kept["llm"] = {k: v for k, v in kept.get("llm", {}).items() if k not in ("max_cost_usd", "max_concurrency")}
    return kept


def answered_by(runs: list[dict[str, Any]], kind: str, digest: str, fingerprint: dict[str, Any]) -> dict | None:
    """The stage counts of the latest published run of ``kind`` on the same documents (``digest``) and the same
    settings as this one: where extraction's answers are all cached, that run's summaries and reports were made from
    the same graph, so their prompts are the same ones, answered in the cache too."""
    import json

    want = comparable(fingerprint)
    for run in reversed(runs):
        stages = json.loads(run.get("stage_counts") or "{}")
        params = json.loads(run.get("parameters") or "{}")
        if (
            run.get("status") == "published"
            and run.get("input_digest") == digest
            and run_kind(stages) == kind
            and comparable(params.get("config") or {}) == want
        ):
            return stages
    return None


def cached_stage(stage: Stage, llm: LLMConfig, stages: dict[str, Any]) -> StageEstimate:
    """``stage`` as the run whose ``stages`` counts made it: every call of it answered in the cache."""
    rows = [stages[n] for n in RUN_STAGES[stage] if n in stages]
    hits = sum(r.get("llm_calls", 0) + r.get("llm_cache_hits", 0) for r in rows)
    return StageEstimate(stage, llm.model, cached=hits, basis="cached: the same graph's prompts were answered")


def stage_ratios(stage: Stage, extraction: str, kind: str, learned: dict[Stage, Ratios]) -> Ratios:
    """What ``stage`` is scaled by: this index's own record, else the stated default (``extraction``: "llm",
    "packed" or "nlp", the extractor the run uses, whose graph the summaries and reports are made from — a packed
    one's the model's too, "llm"'s where no default of its own is stated; ``kind``: "build" or "update")."""
    if stage in learned:
        return learned[stage]
    default = DEFAULT_RATIOS.get(f"{stage}/{extraction}/{kind}")
    return default if default is not None else DEFAULT_RATIOS[f"{stage}/llm/{kind}"]
