"""Community reports: title, summary, rating and findings for every community.

Offline (extractive): the title names the community's most connected named entities, the
summary is its most central members' distinct sentences within a token budget, the findings
are its strongest relations that the summary does not already say, and the rating is its
internal relation weight relative to the strongest community of its level (0-10). With an ``LLMClient``, each report is a JSON answer to a
prompt; reports of one level run concurrently.

Reports are built bottom-up (deepest level first): a community whose own material exceeds
the token budget is described from the reports of its sub-communities instead.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.prompts import PromptSet
from tasks.runtime.llm import LLMClient, ParseError, parse_json, run_sync
from tasks.runtime.text import as_ended, head_of, opens_mid_sentence, split_sentences
from tasks.runtime.text import text_key as sentence_key
from tasks.runtime.tokens import clip_tokens, count_tokens, truncate_tokens
from tasks.store.ids import make_id
from tasks.store.rows import REPORT_COLUMNS, reading_order, relation_table

MAX_FINDINGS = 5
MAX_PROMPT_RELATIONS = 40


class RelationIndex:
    """The relations of G_k by entity, columnar (no dict per relation): what a community's report needs of them."""

    def __init__(self, relations: pa.Table | list[dict[str, Any]], entity_ids: list[str]):
        t = relation_table(relations).select(REPORT_COLUMNS)
        at = {e: i for i, e in enumerate(entity_ids)}
        ids = pa.array(entity_ids, pa.string())
        # entity positions found by Arrow (no Python string per relation end: 2.3M relations at 100k chunks)
        src, tgt = (
            pc.fill_null(pc.index_in(t.column(c), value_set=ids), -1).to_numpy().astype(np.int64)
            for c in ("source_id", "target_id")
        )
        known = np.flatnonzero((src >= 0) & (tgt >= 0))
        # no copy of the table (its descriptions are 260 MB at 100k chunks): a community's rows are taken from
        # the record batches they lie in (a take from the chunked table would concatenate it on every call)
        self.row, self.batches = known, t.to_batches()
        self.offsets = np.cumsum([0] + [b.num_rows for b in self.batches])
        self.src, self.tgt, self.at = src[known], tgt[known], at
        self.weight = t.column("weight").to_numpy()[known]
        self.extracted = pc.equal(t.column("kind"), "extracted").to_numpy(zero_copy_only=False)[known]
        self.labelled = pc.is_valid(t.column("label")).to_numpy(zero_copy_only=False)[known]
        rank = np.empty(t.num_rows, dtype=np.int64)  # order of the relation ids
        rank[pc.sort_indices(t.column("id")).to_numpy()] = np.arange(t.num_rows)
        self.rank = rank[known]
        ends = np.concatenate([self.src, self.tgt])  # adjacency (CSR): entity i's relations are
        order = np.argsort(ends, kind="stable")  # by_node[start[i]:start[i + 1]]
        self.by_node = order % max(1, len(known))
        self.start = np.searchsorted(ends[order], np.arange(len(entity_ids) + 1))

    def inner(self, members: list[str]) -> np.ndarray:
        """The relations between members, strongest first: extracted before summary_of, labelled (a statement)
        before co-occurring, then by weight, then id."""
        m = np.array(sorted({self.at[e] for e in members}), dtype=np.int64)
        if not len(m) or not len(self.src):
            return np.zeros(0, dtype=np.int64)
        cand = np.unique(np.concatenate([self.by_node[self.start[i] : self.start[i + 1]] for i in m]))
        cand = cand[np.isin(self.src[cand], m) & np.isin(self.tgt[cand], m)]
        return cand[np.lexsort((self.rank[cand], -self.weight[cand], ~self.labelled[cand], ~self.extracted[cand]))]

    def rows(self, idx: np.ndarray) -> list[dict[str, Any]]:
        rows = self.row[np.asarray(idx, dtype=np.int64)]
        batch = np.searchsorted(self.offsets, rows, side="right") - 1
        out: list[dict[str, Any]] = [{} for _ in range(len(rows))]
        for b in np.unique(batch):
            at = np.flatnonzero(batch == b)
            for k, row in zip(at, self.batches[b].take(pa.array(rows[at] - self.offsets[b])).to_pylist()):
                out[k] = row
        return out


def _material(comm: dict[str, Any], ents: dict[str, dict[str, Any]], index: RelationIndex):
    """Members ranked for the report, the inner relations that can be shown (strongest first) and the total
    weight of all of them."""
    inner = index.inner(comm["entity_ids"])
    ends = np.stack([index.src[inner], index.tgt[inner]], axis=1).reshape(-1)
    degree = np.zeros(len(index.at), dtype=np.float64)
    np.add.at(degree, ends, np.repeat(index.weight[inner], 2))  # in relation order, as a running sum would
    # concrete (layer-0) entities first, most connected first; summary entities after them
    ranked = sorted(comm["entity_ids"], key=lambda e: (ents[e]["layer"] > 0, -degree[index.at[e]], ents[e]["name"]))
    return ranked, index.rows(inner[:MAX_PROMPT_RELATIONS]), sum(index.weight[inner].tolist())


#: the title's names come from the most central members of the most specific kind first: named things, then
#: times, then concept phrases, then summary entities (a title "1988, East Asia and 17 September" names dates)
_TITLE_RANK = {"time": 1, "concept": 2}


def _title(ranked: list[str], ents: dict[str, dict[str, Any]]) -> str:
    def kind(e: str) -> int:
        ent = ents[e]
        return 3 if ent["layer"] > 0 else _TITLE_RANK.get(ent["type"], 0 if ent["name"][:1].isupper() else 2)

    names: list[str] = []
    for e in sorted(ranked, key=kind):  # stable: most central first within a kind
        if ents[e]["name"] not in names:
            names.append(ents[e]["name"])
        if len(names) == 3:
            break
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _finding(r: dict[str, Any], ents: dict[str, dict[str, Any]], one_sentence: bool = False) -> str:
    """A relation as a finding: "Scrooge employs Bob Cratchit: <its sentences>" where it is a statement (read from
    its subject), "A — B: <its sentences>" where its ends only co-occur, "A belongs to B" for a summary's member.
    ``one_sentence``: the sentence that names both ends (``_naming``; a report a person reads: the same sentence
    from two overlapping chunks, one cut at a chunk's edge, is not pasted twice)."""
    first, second = reading_order(r)
    a, b = ents[first]["name"], ents[second]["name"]
    if r["kind"] == "summary_of":
        return f"{a} belongs to {b}"
    said = f"{a} {r['label']} {b}" if r.get("label") else f"{a} — {b}"
    text = r["description"]
    if one_sentence:
        text = _naming(a, b, [s for s in map(as_ended, _sentences(text)) if s], r.get("label")) or text
        text = f"… {text}" if opens_mid_sentence(text) else text  # a chunk that starts inside it: an excerpt
    return f"{said}: {clip_tokens(text, 60)}"


def _naming(a: str, b: str, sentences: list[str], label: str | None = None) -> str:
    """The first of ``sentences`` that names both ``a`` and ``b`` (any case) and says ``label``'s words (the
    sentence the relation was read from: "employs" where another sentence only names the two), else the first
    that names both, else the first run of up to three consecutive ones that does (a parser's sentence split in
    two: "'Christmas Day." "I'll drink his health for your sake…'"), else the first sentence ("" where there is
    none)."""
    said = re.compile(r"\b" + r"\W+".join(map(re.escape, label.lower().split())) + r"\b") if label else None

    def names(s: str, saying: bool) -> bool:
        low = s.lower()
        return a.lower() in low and b.lower() in low and (not saying or bool(said and said.search(low)))

    for n in (1, 2, 3):
        for saying in (True, False) if said else (False,):
            for i in range(len(sentences) - n + 1):
                if names(run := " ".join(sentences[i : i + n]), saying):
                    return run
    return sentences[0] if sentences else ""


#: characters of a description read for its sentences (the summary takes a few of each member's first ones)
SENTENCE_PREFIX_CHARS = 400


@functools.lru_cache(maxsize=1 << 15)
def _sentences(text: str) -> tuple[str, ...]:
    """The whole sentences in the first ``SENTENCE_PREFIX_CHARS`` of ``text`` (one cut there is dropped; a first
    sentence longer than that is read to its end); kept for the next report that reads the same description (an
    entity is a member at every level of the community hierarchy: about half the splits of a build are repeats)."""
    found = split_sentences(text[:SENTENCE_PREFIX_CHARS])
    if len(text) <= SENTENCE_PREFIX_CHARS:
        return tuple(found)
    if len(found) > 1:
        return tuple(found[:-1])
    return tuple(split_sentences(text)[:1])


def _taken(sentence: str, seen: set[str]) -> bool:
    """``sentence`` is one of ``seen`` (their keys), or overlaps one ("…" of a cut or opened one aside): its head
    (``head_of``) inside one, or one's head inside it — the copies of one sentence two overlapping chunks give, one
    cut at the chunk's edge."""
    key = sentence_key(sentence.removeprefix("… ").removesuffix("…"))
    head = head_of(key)
    return key in seen or any(head in k or head_of(k) in key for k in seen)


def central_sentences(texts: list[str], budget: int) -> list[str]:
    """Distinct sentences of ``texts`` (most central first) within ``budget`` tokens: each text's first sentence
    not yet taken, round after round, so the summary covers the central members before it goes deep into one;
    no sentence twice, nor one that a sentence taken holds whole (a fragment of it). Each reads as a sentence
    (``as_ended``); a text's sentence that opens mid-sentence (``opens_mid_sentence``: a chunk that starts inside one)
    is read only where the text has nothing else, marked "…" in front. A first sentence over the budget is cut to it
    (a summary is never empty)."""
    pending: list[list[str] | None] = [None] * len(texts)  # each text split when its turn first comes
    out: list[str] = []
    seen: set[str] = set()
    used = 0
    while any(q is None or q for q in pending):
        for i, queue in enumerate(pending):
            if queue is None:  # each sentence as a reader sees it, so two that read the same are one
                queue = pending[i] = _whole_first([s for s in map(as_ended, _sentences(texts[i])) if s])
            while queue and _taken(queue[0], seen):
                queue.pop(0)
            if not queue:
                continue
            sentence = queue.pop(0)
            n = count_tokens(sentence)
            if used + n > budget:
                if not out:
                    out.append(clip_tokens(sentence, budget))
                return _read_once(out)
            out.append(sentence)
            seen.add(sentence_key(sentence))
            used += n
    return _read_once(out)


def _whole_first(sentences: list[str]) -> list[str]:
    """``sentences`` without those that open mid-sentence, or, where every one does, the first marked "…" in front."""
    whole = [s for s in sentences if not opens_mid_sentence(s)]
    return whole if whole or not sentences else [f"… {sentences[0]}"]


def _read_once(sentences: list[str]) -> list[str]:
    """``sentences`` as a reader splits them once joined, each once: two taken from different descriptions can
    differ as taken (one cut after a quotation, one not) and split into the same sentence once side by side."""
    keys = [sentence_key(s) for s in sentences]
    if not any(k[:30] in o or k[-30:] in o for i, k in enumerate(keys) for j, o in enumerate(keys) if i != j):
        return sentences  # no two share a head or a tail: nothing can split into one sentence twice (no re-split)
    out: list[str] = []
    seen: set[str] = set()
    for s in split_sentences(" ".join(sentences)):
        if sentence_key(s) not in seen:
            seen.add(sentence_key(s))
            out.append(s)
    return out


def offline_report(comm, ents, index, child_reports: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """A title naming the community's most central named entities, a summary of its most central distinct
    sentences within ``budget / 3`` tokens, and findings from its strongest relations that the summary does
    not already say (a community over ``budget`` is summarised from its sub-communities' reports instead)."""
    ranked, rels, weight = _material(comm, ents, index)
    title = _title(ranked, ents)
    own = sum(count_tokens(ents[e]["description"]) for e in ranked)
    if child_reports and own > budget:
        # too big to describe directly: roll up the sub-community reports (bottom-up)
        kids = sorted(child_reports, key=lambda c: (-c["rating"], c["title"]))
        sentences = central_sentences([c["summary"] for c in kids], budget // 3)
        candidates = [f for c in kids for f in c["findings"][:1]]
    else:
        sentences = central_sentences([ents[e]["description"] for e in ranked], budget // 3)
        # what its members say of each other; a summary's membership ("A belongs to B") says nothing to a reader
        candidates = [_finding(r, ents, one_sentence=True) for r in rels if r["kind"] != "summary_of"]
    said, findings = [sentence_key(s) for s in sentences], []
    for f in candidates:
        key = sentence_key(f.split(": ", 1)[-1].removesuffix("…"))
        if key and not any(key.startswith(k) or k.startswith(key) for k in said):
            said.append(key)
            findings.append(f)
        if len(findings) == MAX_FINDINGS:
            break
    return {"title": title, "summary": " ".join(sentences), "findings": findings, "weight": weight}


def report_prompt(comm, ents, index, child_reports, budget: int, prompts: PromptSet) -> list[dict[str, str]]:
    ranked, rels, _ = _material(comm, ents, index)
    if child_reports and sum(count_tokens(ents[e]["description"]) for e in ranked) > budget:
        material = "Sub-community reports:\n" + "\n".join(f"- {c['title']}: {c['summary']}" for c in child_reports)
    else:
        material = "Entities:\n" + "\n".join(
            f"- {ents[e]['name']} ({ents[e]['type']}): {ents[e]['description']}" for e in ranked
        )
        material += "\nRelations:\n" + "\n".join(f"- {_finding(r, ents)}" for r in rels)
    return prompts["report"].messages(material=truncate_tokens(material, budget))


def build_reports(
    communities: list[dict[str, Any]],
    entities: list[dict[str, Any]],
    relations: pa.Table | list[dict[str, Any]],
    budget: int,
    client: LLMClient | None = None,
    only: set[str] | None = None,
    existing: dict[str, dict[str, Any]] | None = None,
    level_max: dict[int, float] | None = None,
    min_members: int = 0,
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One report per community, deepest level first. Returns (reports, failures that fell back to offline).

    With ``only``, just those communities are (re)written; the others keep their ``existing`` report. An offline
    rating is relative to the strongest community of its level written here, or to ``level_max`` (a level's
    strongest of every community, ``level_weights``: the reports of a build are written a part at a time). Only a
    community of at least ``min_members`` entities is sent to ``client``; a smaller one keeps its offline report."""
    ents = {e["id"]: e for e in entities}
    index = RelationIndex(relations, list(ents))
    children: dict[str, list[str]] = defaultdict(list)
    for c in communities:
        if c["parent_id"]:
            children[c["parent_id"]].append(c["id"])
    done: dict[str, dict[str, Any]] = dict(existing or {})
    failures: list[dict[str, str]] = []
    for level in sorted({c["level"] for c in communities}, reverse=True):
        batch = [
            c for c in communities if c["level"] == level and (only is None or c["id"] in only or c["id"] not in done)
        ]
        if not batch:
            continue
        drafts = [offline_report(c, ents, index, [done[k] for k in children[c["id"]]], budget) for c in batch]
        max_w = max((d["weight"] for d in drafts), default=0.0) if level_max is None else level_max.get(level, 0.0)
        for c, d in zip(batch, drafts):
            d["rating"] = round(10 * math.log1p(d["weight"]) / math.log1p(max_w), 2) if max_w > 0 else 0.0
            d["rating_reason"] = rating_reason(len(c["entity_ids"]), d["weight"], max_w, level)
        if client is not None:
            asked = [(c, d) for c, d in zip(batch, drafts) if len(c["entity_ids"]) >= min_members]
            answers = run_sync(_llm_level(client, [c for c, _ in asked], ents, index, children, done, budget))
            for (c, d), a in zip(asked, answers):
                if isinstance(a, dict):
                    d.update(a)
                else:
                    failures.append({"item": c["id"], "error": a})
        for c, d in zip(batch, drafts):
            done[c["id"]] = {
                "id": make_id("report", c["id"]),
                "community_id": c["id"],
                "level": c["level"],
                "title": d["title"],
                "summary": d["summary"],
                "rating": float(d["rating"]),
                "rating_reason": d["rating_reason"],
                "findings": list(d["findings"]),
                "full_text": f"# {d['title']}\n\n{d['summary']}\n\n"
                + "\n".join(f"- {f}" for f in d["findings"])
                + f"\n\nRating {float(d['rating']):g} of 10: {d['rating_reason']}",
            }
    return [done[c["id"]] for c in communities], failures


def rating_reason(members: int, weight: float, strongest: float, level: int) -> str:
    """Why an offline rating is what it is: 10 × log(1 + w) / log(1 + W), w the total weight of the community's
    inner relations (an extracted relation weighs its distinct supporting sentences), W that of the strongest
    community of its level."""
    if strongest <= 0:
        return f"its {members} members share no relation, nor does any community of level {level}"
    w, top = round(weight, 2), round(strongest, 2)
    return (
        f"its {members} members' relations weigh {w:g} together, against {top:g} in the strongest community of "
        f"level {level}: 10 × log(1 + {w:g}) / log(1 + {top:g})"
    )


def level_weights(communities: list[dict[str, Any]], entity_ids: list[str], relations: pa.Table) -> dict[int, float]:
    """The strongest community of each level: the total weight of its inner relations (what a report's rating is
    relative to)."""
    index, out = RelationIndex(relations, entity_ids), dict[int, float]()
    for c in communities:
        out[c["level"]] = max(out.get(c["level"], 0.0), sum(index.weight[index.inner(c["entity_ids"])].tolist()))
    return out


def parse_report(text: str) -> dict[str, Any]:
    data = parse_json(text)
    if not isinstance(data, dict) or not str(data.get("title", "")).strip():
        raise ParseError("report without a title")
    try:
        rating = float(data.get("rating", 0))
    except (TypeError, ValueError):
        rating = 0.0
    findings = data.get("findings") or []
    if not isinstance(findings, list):
        findings = [findings]
    findings = [
        f
        if isinstance(f, str)
        else (f.get("summary") or f.get("explanation") or json.dumps(f))
        if isinstance(f, dict)
        else str(f)
        for f in findings
    ]
    reason = " ".join(str(data.get("rating_reason") or "").split())[:300]
    return {
        "title": str(data["title"]).strip()[:300],
        "summary": str(data.get("summary", "")).strip(),
        "rating": min(10.0, max(0.0, rating)),
        "rating_reason": reason or "rated by the model, which gave no reason",
        "findings": [str(f) for f in findings][:10],
    }


async def _llm_level(client, batch, ents, index, children, done, budget) -> list[dict[str, Any] | str]:
    async def one(c):
        messages = report_prompt(c, ents, index, [done[k] for k in children[c["id"]]], budget, client.prompts)
        try:
            return await client.complete(
                messages, prompt_version=client.prompts["report"].version, json_mode=True, parse=parse_report
            )
        except Exception as exc:  # noqa: BLE001 - keep the offline draft
            return f"{type(exc).__name__}: {exc}"

    return await asyncio.gather(*(one(c) for c in batch))
