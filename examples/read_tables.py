"""Read a published snapshot's tables with polars: the most connected entities and the largest communities.

    .venv/bin/python examples/read_tables.py ./index
"""

from __future__ import annotations

import sys

import polars as pl

from flows.api import open_index


def main(index: str) -> None:
    idx = open_index(index)
    entities = pl.from_arrow(idx.table("entities", ["name", "type", "layer", "degree"]))
    print(f"snapshot v{idx.version}, modes {', '.join(idx.modes)}")
    print(entities.filter(pl.col("layer") == 0).sort("degree", descending=True).head(5))
    reports = pl.from_arrow(idx.table("community_reports", ["level", "title", "rating"]))
    print(reports.sort("rating", descending=True).head(5))


if __name__ == "__main__":
    main(sys.argv[1])
