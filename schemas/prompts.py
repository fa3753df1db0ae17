"""Every prompt Strata sends a model, in one place, each overridable by name from ``strata.toml``.

A prompt is a system message and a user message; the user message is a template whose ``$fields`` the stage fills
in (the chunk's text, a community's material, the question). ``[llm.prompts.<name>]`` replaces either message:

    [llm.prompts.report]
    system = "You write reports for auditors about communities of a knowledge graph. Answer with JSON only."

An override of ``user`` must use every field of its prompt and no other (checked when the config loads), and
should ask for the JSON shape the default asks for: an answer the stage cannot read is retried once, then falls
back (extraction quarantines the chunk; a summary or report is written offline). The response cache keys the
messages as sent, so an override never reads an answer given to the default. ``strata init`` writes every prompt
into ``strata.toml``, commented out, with its fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from string import Template

from pydantic import Field

from schemas.sections import _Section

#: the entity types the extraction prompt offers
ENTITY_TYPES = ["person", "organization", "location", "event", "technology", "work", "concept", "time", "group"]


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``version`` keys the response cache with the messages; ``fields`` names each ``$field`` of
    ``user`` with what the stage fills in; no ``system`` where the prompt continues a conversation."""

    name: str
    version: str
    about: str
    system: str | None
    user: str
    fields: dict[str, str] = field(default_factory=dict)

    def messages(self, **values: object) -> list[dict[str, str]]:
        """The chat messages with ``values`` in the user template (every field, no other: a stage's bug otherwise)."""
        if set(values) != set(self.fields):
            raise KeyError(f"prompt {self.name} takes {sorted(self.fields)}, got {sorted(values)}")
        user = Template(self.user).substitute({k: str(v) for k, v in values.items()})
        return [
            *([{"role": "system", "content": self.system}] if self.system is not None else []),
            {"role": "user", "content": user},
        ]


_DEFAULTS = (
    Prompt(
        "extract_entities",
        "extract/1",
        "extraction's first pass: the entities of one chunk",
        "You build a knowledge graph from text. Identify every meaningful entity in the text: people, organizations, "
        "places, events, works, technologies, important concepts and dates. Answer with JSON only.",
        'Entity types: $types.\n\nText:\n"""\n$text\n"""\n\n'
        'Return {"entities": [{"name": "<as written in the text>", "type": "<one entity type>", '
        '"description": "<what the text says about it, one or two sentences>"}]}',
        {"types": "the entity types, comma separated", "text": "the chunk's text"},
    ),
    Prompt(
        "extract_gleaning",
        "extract/1",
        "a gleaning pass (llm.gleanings): asked after the entities found so far, as the conversation's next turn",
        None,
        'Some entities were missed. Return only the missing ones, same JSON shape; {"entities": []} if none.',
    ),
    Prompt(
        "extract_relations",
        "extract/1",
        "extraction's second pass: the relations among the entities the first found",
        "You build a knowledge graph from text. Given a text and the entities found in it, identify pairs of entities "
        "that are clearly related in the text. Answer with JSON only.",
        'Entities:\n$entities\n\nText:\n"""\n$text\n"""\n\n'
        'Return {"relations": [{"source": "<entity name>", "target": "<entity name>", '
        '"description": "<how they are related, from the text>", "strength": <1-10>}]}',
        {"entities": 'one line per entity: "- name (type)"', "text": "the chunk's text"},
    ),
    Prompt(
        "extract_packed",
        "extract-packed/2",
        "extraction in one pass over several short chunks (llm.extraction.pack_tokens): the entities of each and the "
        "relations among them, each relation with the words that relate its ends (the chunk's sentences describe them)",
        "You build a knowledge graph from text. For each numbered passage, list every meaningful entity it names "
        "(people, organizations, places, events, works, technologies, important concepts and dates) and the pairs of "
        "those entities the passage clearly relates, each with the verb or role that relates them. Answer with JSON "
        "only.",
        "Entity types: $types.\n\n$passages\n\n"
        'Return {"passages": [{"passage": <its number>, "entities": [["<name as written in the passage>", '
        '"<one entity type>"]], "relations": [["<source entity name>", "<the verb or role relating source to target, '
        'as the passage says it: a few words>", "<target entity name>", <strength 1-10>]]}]}',
        {"types": "the entity types, comma separated", "passages": 'each chunk as "Passage N:" and its quoted text'},
    ),
    Prompt(
        "summary",
        "summary-entities/1",
        "a summary entity of the hierarchy: the concepts above one cluster of entities",
        "You organise a knowledge graph into a hierarchy. Given a cluster of related entities, name the "
        "higher-level concept(s) that summarise them. Answer with JSON only.",
        "Meta categories (use one as each summary's type): $categories.\n"
        "Entities in the cluster:\n$entities\n\n"
        "Return between 1 and $n summary entities that cover these entities, as "
        '{"summary_entities": [{"name": "...", "type": "<meta category>", '
        '"description": "one or two sentences on what the members share"}]}',
        {
            "categories": "hierarchy.meta_entities, comma separated",
            "entities": 'one line per member: "- name (type): description"',
            "n": "how many summary entities at most",
        },
    ),
    Prompt(
        "hygrag_synthesis",
        "hygrag-synthesis/1",
        "HyGRAG's summary node: what a group of passages and entities share",
        "You build one node of a hierarchical index over passages and the entities they mention. Given a "
        "group of passages and entities that belong together, write the node that stands for the group: "
        "what context the passages share, and how the entities relate to each other. Answer with JSON only.",
        "Types to choose from: $types.\nThe group:\n$group\n\nReturn $n node(s) as "
        '{"summary_entities": [{"name": "a short name for the group", "type": "<one of the types>", '
        '"description": "a synthesis of the shared context and of the relations among the entities, '
        'at most $max_tokens tokens, naming the entities it relates"}]}',
        {
            "types": "hierarchy.meta_entities, comma separated",
            "group": 'one line per member: "- [passage|type] name: text"',
            "n": "how many nodes",
            "max_tokens": "extract.max_description_tokens",
        },
    ),
    Prompt(
        "report",
        "community-report/2",
        "a community's report: title, summary, rating with its reason, findings",
        "You write concise, factual reports about communities of a knowledge graph. Answer with JSON only.",
        '$material\n\nReturn {"title": "...", "summary": "...", "rating": <0-10 importance>, "rating_reason": "<why, '
        'in one sentence>", "findings": ["...", "..."]}',
        {"material": "the members with their descriptions and strongest relations, or the sub-communities' reports"},
    ),
    Prompt(
        "answer",
        "answer/1",
        "a query's answer from its context",
        "You answer questions from the knowledge given: entity descriptions, community reports, reasoning "
        "paths between entities and source passages. Use only that knowledge; say so when it is not enough. "
        "Be concise.",
        "$context\n\nQuestion: $question\nAnswer:",
        {"context": "the context's sections as `strata query --context` prints them", "question": "the question"},
    ),
    Prompt(
        "archrag_filter",
        "archrag-map/1",
        "ArchRAG's map step: each retrieved piece rated for the question before the answer",
        "You judge retrieved knowledge before a question is answered from it. Answer with JSON only.",
        "Question: $question\n\nRetrieved pieces:\n$pieces\n\nRate how useful each piece is for answering "
        'the question, from 0 (useless) to 10 (answers it), as {"scores": [one integer per piece, in order]}.',
        {"question": "the question", "pieces": 'one numbered line per piece: "1. text"'},
    ),
)
#: every prompt by name, as shipped
DEFAULT_PROMPTS: dict[str, Prompt] = {p.name: p for p in _DEFAULTS}


class PromptText(_Section):
    """Either message of one prompt, replaced (unset: the default's)."""

    system: str | None = Field(None, description="The system message.")
    user: str | None = Field(None, description="The user message: a template of the prompt's $fields.")


def prompt_problems(name: str, text: PromptText) -> list[str]:
    """What is wrong with an override of prompt ``name`` (empty: nothing)."""
    prompt = DEFAULT_PROMPTS.get(name)
    if prompt is None:
        return [f"no prompt named {name!r} (known: {', '.join(DEFAULT_PROMPTS)})"]
    problems = []
    if text.system is not None and prompt.system is None:
        problems.append(f"{name} continues a conversation and has no system message to replace")
    if text.user is not None:
        template = Template(text.user)
        if not template.is_valid():
            problems.append(f"{name}.user has a '$' that starts no field (write '$$' for a dollar sign)")
        else:
            used, wanted = set(template.get_identifiers()), set(prompt.fields)
            if wanted - used:
                problems.append(f"{name}.user must use {', '.join('$' + f for f in sorted(wanted - used))}")
            if used - wanted:
                known = ", ".join("$" + f for f in sorted(wanted)) or "none"
                problems.append(
                    f"{name}.user uses {', '.join('$' + f for f in sorted(used - wanted))}, not a field of it "
                    f"(its fields: {known}; write '$$' for a dollar sign)"
                )
    return problems


class PromptSet:
    """The prompts a client speaks with: the defaults, with the config's overrides (``[llm.prompts]``) in place."""

    def __init__(self, overrides: dict[str, PromptText] | None = None):
        self._prompts = dict(DEFAULT_PROMPTS)
        for name, text in check_overrides(overrides or {}).items():
            default = self._prompts[name]
            self._prompts[name] = replace(
                default,
                system=default.system if text.system is None else text.system,
                user=default.user if text.user is None else text.user,
            )

    def __getitem__(self, name: str) -> Prompt:
        return self._prompts[name]


def check_overrides(overrides: dict[str, PromptText]) -> dict[str, PromptText]:
    """``overrides`` if every one is valid, else a ValueError naming each problem (a usage error at load time)."""
    problems = [p for name, text in overrides.items() for p in prompt_problems(name, text)]
    if problems:
        raise ValueError("; ".join(problems))
    return overrides


def commented_toml() -> list[str]:
    """Every prompt as a commented ``[llm.prompts.<name>]`` table with its fields and default texts."""
    lines = [
        "",
        "# Prompts (schemas/prompts.py): uncomment a table to replace a prompt's system or user message. A user message",
        "# must use each of its $fields and no other ($$ for a dollar sign) and should ask for the same JSON shape.",
    ]
    for p in DEFAULT_PROMPTS.values():
        fields = "; ".join(f"${k} ({v})" for k, v in p.fields.items()) or "none"
        lines += ["", f"# {p.name}: {p.about}.", f"# [llm.prompts.{p.name}]"]
        if p.system is not None:
            lines += ["# # its system message", f"# system = {_toml_string(p.system)}"]
        lines.append(f"# # its user message; fields: {fields}")
        lines += [f"# {line}" if line else "#" for line in f"user = {_toml_string(p.user)}".split("\n")]
    return lines


def _toml_string(text: str) -> str:
    """``text`` as a TOML string: a multi-line literal where it spans lines, else a basic string."""
    if "\n" in text and "'''" not in text:
        return "'''\n" + text + "'''"
    import json

    return json.dumps(text, ensure_ascii=False)
