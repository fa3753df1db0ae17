"""Expectation suites (great-expectations 1.x) for every table.

Each suite is built from the table's own columns plus a few derived columns that the
validator adds (``vector_dim``, ``vector_finite``, ``sources_known``, and for each reference in
``schemas.tables.REFERENCES`` a ``<column>_dangling`` column holding the ids that the referenced table lacks,
null where the reference resolves). A failing suite stops the publish.
"""

from __future__ import annotations

from typing import Any

import great_expectations as gx

E = gx.expectations

QUARANTINE_STAGES = ["ingest", "chunk", "extract", "merge", "embed", "hierarchy", "communities", "reports"]


def _resolves(column: str) -> Any:
    return E.ExpectColumnValuesToBeNull(column=f"{column}_dangling")


def _ids(column: str = "id") -> list:
    return [E.ExpectColumnValuesToNotBeNull(column=column), E.ExpectColumnValuesToBeUnique(column=column)]


def _vectors(dim: int) -> list:
    return [
        E.ExpectColumnValuesToBeBetween(column="vector_dim", min_value=dim, max_value=dim),
        E.ExpectColumnValuesToBeInSet(column="vector_finite", value_set=[True]),
    ]


def suites(dim: int, relation_kinds: tuple[str, ...]) -> dict[str, list[Any]]:
    """Expectations per table (``dim``: the index's vector dimension)."""
    return {
        "documents": [
            *_ids(),
            E.ExpectColumnValuesToNotBeNull(column="uri"),
            E.ExpectColumnValuesToNotBeNull(column="text"),
            E.ExpectColumnValuesToMatchRegex(column="content_hash", regex=r"^[0-9a-f]{64}$"),
            E.ExpectColumnValuesToBeBetween(column="n_tokens", min_value=1),
        ],
        "chunks": [
            *_ids(),
            _resolves("document_id"),
            E.ExpectColumnValuesToBeBetween(column="start", min_value=0),
            E.ExpectColumnPairValuesAToBeGreaterThanB(column_A="end", column_B="start"),
            E.ExpectColumnValuesToBeInSet(column="status", value_set=["extracted", "quarantined"]),
            E.ExpectColumnValuesToBeInSet(column="accounted", value_set=[True]),
            *_vectors(dim),
        ],
        "entities": [
            *_ids(),
            E.ExpectColumnValuesToNotBeNull(column="name"),
            E.ExpectColumnValuesToNotBeNull(column="type"),
            E.ExpectColumnValuesToBeBetween(column="layer", min_value=0),
            E.ExpectColumnValuesToBeInSet(column="sources_known", value_set=[True]),
            *_vectors(dim),
        ],
        "relations": [
            *_ids(),
            _resolves("source_id"),
            _resolves("target_id"),
            E.ExpectColumnValuesToBeInSet(column="kind", value_set=list(relation_kinds)),
            E.ExpectColumnValuesToBeBetween(column="weight", min_value=0, strict_min=True),
            E.ExpectColumnValuesToBeInSet(column="sources_known", value_set=[True]),
        ],
        "mentions": [
            *_ids(),
            _resolves("chunk_id"),
            E.ExpectColumnValuesToBeInSet(column="kind", value_set=["entity", "relation"]),
            E.ExpectColumnValuesToNotBeNull(column="key"),
        ],
        "merge_state": [
            *_ids(),
            E.ExpectColumnValuesToBeInSet(column="kind", value_set=["entity", "relation"]),
        ],
        "quarantine": [
            *_ids(),
            E.ExpectColumnValuesToNotBeNull(column="item"),
            E.ExpectColumnValuesToNotBeNull(column="error"),
            E.ExpectColumnValuesToBeInSet(column="stage", value_set=QUARANTINE_STAGES),
        ],
        "layers": [
            E.ExpectColumnValuesToBeUnique(column="layer"),
            # eq. 17 is at most 1; heavy soft overlaps may push it below 0, which is allowed
            E.ExpectColumnValuesToBeBetween(column="cluster_sparsity", max_value=1),
            E.ExpectColumnValuesToBeBetween(column="n_clusters", min_value=0),
            E.ExpectColumnValuesToBeBetween(column="n_entities", min_value=0),
        ],
        "communities": [
            *_ids(),
            E.ExpectColumnValuesToBeBetween(column="level", min_value=0),
            E.ExpectColumnValuesToBeBetween(column="size", min_value=1),
            E.ExpectColumnValuesToBeInSet(column="members_known", value_set=[True]),
            E.ExpectColumnValuesToBeInSet(column="parent_known", value_set=[True]),
        ],
        "community_reports": [
            *_ids(),
            E.ExpectColumnValuesToBeUnique(column="community_id"),
            _resolves("community_id"),
            E.ExpectColumnValuesToNotBeNull(column="title"),
            E.ExpectColumnValuesToBeBetween(column="rating", min_value=0, max_value=10),
            *_vectors(dim),
        ],
    }
