"""How readable a snapshot's graph is (``strata inspect --quality``): measures of what a person browsing the
entities, the summaries and the reports sees, each a plain count or share over the published tables.

- ``top_entities_one_lowercase_word``: of the 100 layer-0 entities of highest degree, the share named by one
  lowercase word ("hand", "door": a common noun, not a name a reader would look up);
- ``summaries_named_by_members``: of the summary entities (layer ≥ 1), the share whose name is made of its
  members' names only (each " / "-separated piece the name of an entity it summarises, or a piece of a member
  summary's name), not of key terms;
- ``summaries_listing_names``: summary entities whose description opens with a list of names (a line of names
  and phrases without a sentence: "Lord, Roast, Boiled, Wonderful party, Dear heart and 212 more (said, hope,
  couple)."), the head offline summaries had before 2026-12-07;
- ``labelled_relations``: of the relations between layer-0 entities, the share with a label saying what links them
  (the ``label`` column: a verb or a noun a sentence says of them, or a noun's preposition, not mere co-occurrence);
- ``verb_or_noun_relations``: the share whose label holds a verb or a noun (one that is not a preposition alone:
  "clerk of", "employs", not "of");
- ``descriptions_with_furniture``: layer-0 entity descriptions that hold page furniture — a figure marker
  ("[Illustration]"), a run of three words in capitals (a heading: "STAVE ONE--MARLEY'S GHOST"), or a page number
  glued between two sentences' words ("…Christmas Eve 16 Nobody…");
- ``names_across_a_break``: layer-0 entities whose name runs across a clause break ("Much!'--Marley's voice"), or,
  for a lowercase noun phrase, across a list's comma ("comfortable, oily, rich, fat"), or holds a bracket without its
  partner ("Felipe Solo (");
- ``alias_merges``: layer-0 entities that merged names written otherwise (the ``aliases`` column: "Scrooge" and
  "Ebenezer" into "Ebenezer Scrooge"), and ``aliases`` the names merged;
- ``reports_repeating_or_cut``: community reports whose summary says a passage twice (one sentence's first eight
  words inside another, or again inside itself, or its last eight earlier in it: two overlapping chunks' copies of
  a sentence), opens inside a sentence (its first word in lower case: "said Bob, with…"; "…" in front marks an
  excerpt), or ends without a sentence's end (inside a word or a sentence; "…" after a whole word counts as one).
"""

from __future__ import annotations

import re
from typing import Any

from tasks.methods.reports import sentence_key
from tasks.runtime.text import (
    CLAUSE_BREAK,
    HEAD_WORDS,
    LIST_BREAK,
    SENTENCE_END,
    head_of,
    opens_mid_sentence,
    split_sentences,
    unpaired,
)
from tasks.store.catalog import Catalog

TOP_ENTITIES = 100
_WORDY = re.compile(r"\w")

_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
#: a figure marker, a heading run, or a page number between two sentences' words (not a date: "on 1 January")
_FURNITURE = re.compile(
    r"\[(?i:illustration|figure|plate|image)\b|\b[A-Z]{2,}(?:[\W\d]+[A-Z]{2,}){2,}\b"
    rf"|[a-z] \d{{1,3}}(?:-\d{{1,3}})? (?!(?:{_MONTHS})\b)[A-Z]"
)


def has_furniture(description: str) -> bool:
    return bool(_FURNITURE.search(description))


def across_a_break(name: str, etype: str) -> bool:
    """A word on both sides of a clause break, or of a list's comma in a lowercase noun phrase (a capitalised
    ``concept`` may be a document's title: "Indianola, Iowa"); or a bracket without its partner ("Felipe Solo (")."""
    breaks = LIST_BREAK if etype == "concept" and name.islower() else CLAUSE_BREAK
    found = any(_WORDY.search(name[: m.start()]) and _WORDY.search(name[m.end() :]) for m in breaks.finditer(name))
    return found or unpaired(name)


#: English prepositions: a label that is one of them alone names no verb or role (``statements``: a noun's
#: preposition, "Jan Solovej —from→ University of Copenhagen")
PREPOSITIONS = frozenset(
    "about above across after against along amid among around as at before behind below beneath beside besides "
    "between beyond but by despite down during except for from in inside into like near of off on onto opposite "
    "out outside over past per round since than through throughout till to toward towards under underneath unlike "
    "until unto up upon versus via with within without".split()
)


#: a description's first line that lists names, not a sentence: items split by commas, "and N more", key phrases
#: in brackets, a full stop, then the rest of the description on its own line
_NAME_LIST = re.compile(r"[^\n.!?;:]+(?:, [^\n.!?;:]+)+(?: and \d+ more)?(?: \([^\n]*\))?\.\n")


def lists_names(description: str) -> bool:
    return bool(_NAME_LIST.match(description))


def verb_or_noun(label: str | None) -> bool:
    return bool(label) and label not in PREPOSITIONS


def one_lowercase_word(name: str) -> bool:
    return len(name.split()) == 1 and name.islower()


def named_by_members(name: str, member_names: set[str]) -> bool:
    pieces = [p.strip() for p in name.split(" / ")]
    return bool(pieces) and all(p in member_names for p in pieces)


def repeats_or_is_cut(summary: str) -> bool:
    text = summary.strip()
    if not text:
        return False
    keys = [sentence_key(s) for s in split_sentences(text)]
    return (
        any(_twice(k) or any(head_of(k) in o for o in keys[:i] + keys[i + 1 :]) for i, k in enumerate(keys))
        or opens_mid_sentence(text)
        or not SENTENCE_END.search(text)
    )


def _twice(key: str) -> bool:
    """A copy of one sentence pasted into it: its first ``HEAD_WORDS`` words again further on (a copy cut at a
    chunk's end, then the whole), or its last ones earlier (the whole, then a copy cut at the next chunk's start).
    A writer's own repetition inside a sentence ("the chuckle with which he paid for the turkey, and the chuckle
    with which he paid for the cab") is neither."""
    words = key.split()
    if len(words) < 2 * HEAD_WORDS:
        return False
    head, tail = " ".join(words[:HEAD_WORDS]), " ".join(words[-HEAD_WORDS:])
    return key.find(head, 1) > 0 or key.find(tail) < len(key) - len(tail)


def graph_quality(cat: Catalog, snap: dict[str, Any]) -> dict[str, Any]:
    """The measures of the module docstring for one snapshot, with the counts behind each share."""
    columns = ["id", "name", "type", "layer", "degree", "description", "aliases"]
    ents = cat.read("entities", snap=snap, columns=columns).to_pylist()
    rels = cat.read("relations", snap=snap, columns=["source_id", "target_id", "kind", "label"]).to_pylist()
    summaries = cat.read("community_reports", snap=snap, columns=["summary"]).column("summary").to_pylist()
    layer = {e["id"]: e["layer"] for e in ents}
    name = {e["id"]: e["name"] for e in ents}

    base = sorted((e for e in ents if e["layer"] == 0), key=lambda e: (-e["degree"], e["id"]))[:TOP_ENTITIES]
    members: dict[str, set[str]] = {}
    for r in rels:
        if r["kind"] == "summary_of" and r["target_id"] in name and r["source_id"] in name:
            member = name[r["source_id"]]
            members.setdefault(r["target_id"], set()).update([member, *(p.strip() for p in member.split(" / "))])
    upper = [e for e in ents if e["layer"] > 0]
    flat = [r for r in rels if layer.get(r["source_id"]) == 0 and layer.get(r["target_id"]) == 0]
    labelled = [r for r in flat if r["label"]]
    bad = sum(repeats_or_is_cut(s or "") for s in summaries)
    furnished = sum(has_furniture(e["description"] or "") for e in ents if e["layer"] == 0)
    broken = sum(across_a_break(e["name"] or "", e["type"] or "") for e in ents if e["layer"] == 0)

    def share(part: int, whole: int) -> float | None:
        return round(part / whole, 4) if whole else None

    lower = sum(one_lowercase_word(e["name"]) for e in base)
    by_members = sum(named_by_members(e["name"], members.get(e["id"], set())) for e in upper)
    listing = sum(lists_names(e["description"] or "") for e in upper)
    return {
        "top_entities_one_lowercase_word": share(lower, len(base)),
        "top_entities": len(base),
        "summaries_named_by_members": share(by_members, len(upper)),
        "summaries_listing_names": share(listing, len(upper)),
        "summary_entities": len(upper),
        "labelled_relations": share(len(labelled), len(flat)),
        "verb_or_noun_relations": share(sum(verb_or_noun(r["label"]) for r in labelled), len(flat)),
        "layer0_relations": len(flat),
        "descriptions_with_furniture": furnished,
        "names_across_a_break": broken,
        "layer0_entities": sum(e["layer"] == 0 for e in ents),
        "alias_merges": sum(bool(e["aliases"]) for e in ents),
        "aliases": sum(len(e["aliases"] or ()) for e in ents),
        "reports_repeating_or_cut": bad,
        "reports": len(summaries),
    }
