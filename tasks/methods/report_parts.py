"""The reports of a build whose communities and relations stay spilled (``graph_parts``), as tasks over parts on
the run's cluster: no task holds every relation, and the run holds none.

A report reads its community's members and the relations between them, and a parent's report rolls up its
children's, so a community tree (a top-level community and everything under it) is reported by one task. The
trees are grouped into parts of about ``dask.report_part_entities`` members (``plan_task``); a task per
relation and entity file splits its rows among the parts (``split_task``: a relation goes to a part when both
its ends are members there, and is needed by no report otherwise); a task per part then reports its trees
(``reports_task``). An offline rating is relative to the strongest community of its level across all parts, so
a first round of tasks finds each part's strongest (``weights_task``): the reports are those of one task over
everything (``reports.build_reports``), row for row, in the order of their parts.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import schema_for
from tasks.index.embed import report_text
from tasks.index.embed_table import embed_table
from tasks.methods.graph_parts import graph_work
from tasks.methods.reports import build_reports, level_weights
from tasks.runtime.llm_client import Usage, shared_client, usage_scope
from tasks.store import workfs
from tasks.store.rows import REPORT_COLUMNS
from tasks.store.spill import SpilledTable, plain_schema, read_split, write_parts, write_whole

#: what a report reads of an entity
ENTITY_COLUMNS = ["id", "name", "type", "description", "layer"]
ENTITY_SCHEMA = pa.schema([schema_for("entities", 0).field(c) for c in ENTITY_COLUMNS])
COMMUNITY_COLUMNS = ["id", "level", "parent_id", "entity_ids", "size"]
COMMUNITY_SCHEMA = pa.schema([schema_for("communities", 0).field(c) for c in COMMUNITY_COLUMNS])
#: what a report reads of a relation
RELATION_SCHEMA = pa.schema([schema_for("relations", 0).field(c) for c in REPORT_COLUMNS])

#: reports read, embedded and written at a time by the run (a report is ~20 times a chunk's text: 2,048 of them
#: were the run's largest transient at 100k chunks); a multiple of the embedder's batch, as ``EMBED_STEP``
REPORT_STEP = 256 * 2

#: a report as its task writes it: the ``community_reports`` columns but those the run adds as it embeds them
REPORT_SCHEMA = pa.schema(
    [f for f in schema_for("community_reports", 0) if f.name not in ("staleness", "vector", "version")]
)


def reports_on_cluster(
    ctx: Any,
    communities: SpilledTable,
    entities: list[dict[str, Any]],
    relations: SpilledTable,
    layer0: SpilledTable | None = None,
    progress: Any = None,
) -> tuple[SpilledTable, list[dict[str, str]]]:
    """``reports.build_reports`` over spilled ``communities`` and ``relations``, as tasks over parts on the run's
    mapper (with an LLM, each task's own client: same settings and response cache; its usage added to the
    run's); the entities are ``layer0``'s parts, then ``entities``. The reports are then embedded a step at a
    time into the ``community_reports`` table's parts: the run never holds them whole."""

    work = workfs.join(graph_work(ctx), "reports")
    workfs.mkdirs(work)
    above = workfs.join(work, "entities-above.parquet")
    write_whole(pa.table({c: [e[c] for e in entities] for c in ENTITY_COLUMNS}, schema=ENTITY_SCHEMA), above)
    [n_parts] = ctx.mapper(
        plan_task,
        [work],
        communities=communities.files,
        part_entities=ctx.cfg.dask.report_part_entities,
    )
    members = workfs.join(work, "members.parquet")
    sources = {
        "relations": (relations.files, REPORT_COLUMNS, ["source_id", "target_id"]),
        "entities": (
            [*(layer0.files if layer0 is not None else []), above],
            ENTITY_COLUMNS,
            ["id"],
        ),
    }
    split: dict[str, list[str]] = {}
    for name, (files, columns, keys) in sources.items():
        jobs = [(f, workfs.join(work, f"{name}-{i:05d}.parquet")) for i, f in enumerate(files)]
        ctx.mapper(split_task, jobs, columns=columns, keys=keys, members=members)
        split[name] = [out for _, out in jobs]
    inputs = {"communities": workfs.join(work, "communities.parquet"), **split}
    level_max: dict[int, float] = {}
    for strongest in ctx.mapper(weights_task, list(range(n_parts)), **inputs):
        for level, w in strongest.items():
            level_max[level] = max(level_max.get(level, 0.0), w)
    outs = [workfs.join(work, f"reports-{p:05d}.parquet") for p in range(n_parts)]
    failures: list[dict[str, str]] = []
    for part_failures, usage in ctx.mapper(
        reports_task,
        list(enumerate(outs)),
        **inputs,
        level_max=level_max,
        budget=ctx.cfg.communities.report_max_tokens,
        llm=ctx.cfg.llm.stage("reports"),
        min_members=ctx.cfg.llm.reports.min_members,
        cache_dir=str(ctx.catalog.cache_dir),
        share=None,
        cap=ctx.cap_for("reports"),
    ):
        failures.extend(part_failures)
        ctx.usage.add(Usage(**usage))
    staleness = pa.field("staleness", pa.float64())
    parts = (
        pa.Table.from_batches([b]).append_column(staleness, pa.array([0.0] * b.num_rows, pa.float64()))
        for out in outs
        for b in workfs.parquet_file(out).iter_batches(batch_size=REPORT_STEP)
    )

    def texts(t: pa.Table) -> list[str]:
        return [report_text(a, b) for a, b in zip(t.column("title").to_pylist(), t.column("summary").to_pylist())]

    return embed_table(ctx, "community_reports", parts, texts, progress, REPORT_STEP), failures


def plan_task(folder: str, communities: list[str], part_entities: int) -> int:
    """The parts of the reports (a task): every community tree (a top-level community with all under it) goes
    to the part with the fewest members so far, largest tree first, over ``ceil(members / part_entities)``
    parts. Writes ``folder``'s ``communities.parquet`` (the communities, a row group per part, in their order)
    and ``members.parquet`` (every entity's part). Returns the number of parts."""
    table = pa.concat_tables([workfs.read_table(f, columns=COMMUNITY_COLUMNS) for f in communities])
    ids, parents = table.column("id").to_pylist(), table.column("parent_id").to_pylist()
    root: dict[str, str] = {}
    for i in np.argsort(table.column("level").to_numpy(), kind="stable").tolist():  # parents before children
        root[ids[i]] = ids[i] if parents[i] is None else root[parents[i]]
    top = table.filter(pc.is_null(table.column("parent_id")))
    sizes = dict(zip(top.column("id").to_pylist(), top.column("size").to_pylist()))
    n_parts = max(1, min(len(sizes), math.ceil(sum(sizes.values()) / part_entities)))
    load = [(0, p) for p in range(n_parts)]  # (members so far, part): the least loaded part first
    part_of: dict[str, int] = {}
    for cid in sorted(sizes, key=lambda c: (-sizes[c], c)):
        members, p = heapq.heappop(load)
        part_of[cid] = p
        heapq.heappush(load, (members + sizes[cid], p))
    write_parts(table, np.array([part_of[root[c]] for c in ids], np.int32), workfs.join(folder, "communities.parquet"))
    members = top.column("entity_ids").combine_chunks()
    owner = pc.list_parent_indices(members).to_numpy()
    write_whole(
        pa.table(
            {
                "id": pc.list_flatten(members),
                "part": pa.array(np.array([part_of[c] for c in top.column("id").to_pylist()], np.int32)[owner]),
            }
        ),
        workfs.join(folder, "members.parquet"),
    )
    return n_parts


def split_task(job: tuple[str, str], columns: list[str], keys: list[str], members: str) -> int:
    """The rows of the file ``job[0]`` (a task) whose ``keys`` are all members of one part, as the file
    ``job[1]``, a row group per part (``spill.write_parts``). Returns the rows kept."""
    src, out = job
    table = workfs.read_table(src, columns=columns)
    table = table.cast(plain_schema(table.schema))
    if columns == ENTITY_COLUMNS:  # layer 0's parts and the entities above them alike
        table = table.cast(ENTITY_SCHEMA)
    m = workfs.read_table(members)
    ids, part_of = m.column("id").combine_chunks(), m.column("part").to_numpy()

    def part(key: str) -> np.ndarray:
        at = pc.fill_null(pc.index_in(table.column(key), value_set=ids), -1).to_numpy()
        return np.where(at >= 0, part_of[np.maximum(at, 0)], -1)

    first, *others = [part(k) for k in keys]
    keep = (first >= 0) & np.logical_and.reduce([first == o for o in others] or [np.ones(len(first), bool)])
    return write_parts(table.filter(pa.array(keep)), first[keep].astype(np.int32), out)


def _part(p: int, communities: str, relations: list[str], entities: list[str]):
    """Part ``p``'s communities and entities (rows) and relations (a table); every member among the entities.
    A graph with no relations (no file of them, or none inside the part) reads as a table of none."""
    comms = read_split([communities], p, COMMUNITY_SCHEMA).to_pylist()
    ents = read_split(entities, p, ENTITY_SCHEMA).to_pylist()
    known = {e["id"] for e in ents}
    for c in comms:
        if not known.issuperset(c["entity_ids"]):
            raise RuntimeError(f"community {c['id']} has members outside its top-level community (reports part {p})")
    return comms, ents, read_split(relations, p, RELATION_SCHEMA)


def weights_task(p: int, communities: str, relations: list[str], entities: list[str]) -> dict[int, float]:
    """Part ``p``'s strongest community of each level (a task: ``reports.level_weights``)."""

    comms, ents, rels = _part(p, communities, relations, entities)
    return level_weights(comms, [e["id"] for e in ents], rels)


def reports_task(
    job: tuple[int, str],
    communities: str,
    relations: list[str],
    entities: list[str],
    level_max: dict[int, float],
    budget: int,
    llm: Any,
    cache_dir: str,
    share: int = 1,
    cap: tuple[str, float] | None = None,
    min_members: int = 0,
) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """A report per community of part ``job[0]`` (a task), written to ``job[1]`` in row groups of what the run
    reads at a time. Returns the LLM failures (offline reports kept) and the LLM usage."""

    p, out = job
    comms, ents, rels = _part(p, communities, relations, entities)
    client = shared_client(llm, cache_dir, share, cap) if llm is not None else None
    with usage_scope() as usage:
        reports, failures = build_reports(
            comms, ents, rels, budget, client, level_max=level_max, min_members=min_members
        )
    del rels
    write_whole(pa.Table.from_pylist(reports, schema=REPORT_SCHEMA), out, row_group_rows=REPORT_STEP)
    return failures, asdict(usage)
