"""A spilled table validated as tasks on the cluster, a part per task, the results aggregated by the run.

Round 1, a task per part: the table's suite over that part (``validate.check_table``) without its uniqueness
expectations, the ids a reference must resolve to read from the run's work folder; and each column that must be
unique written out in buckets by a hash of its values. Round 2, a task per bucket: the values that occur more
than once across all parts. The run adds up the failure counts (the same report as validating the table in one
process) and holds only them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tasks.store.spill import SpilledTable


def validate_spilled(
    mapper: Any,
    name: str,
    table: SpilledTable,
    refs: dict[str, set[str]],
    dim: int,
    kinds: tuple[str, ...],
    batch_rows: int,
    workdir: Any,
) -> list[dict[str, Any]]:
    """The failures of table ``name``'s suite over the spilled ``table``, checked part by part on ``mapper``."""
    from schemas.expectations import REFERENCES

    work = Path(workdir) / f"validate-{name}"
    work.mkdir(parents=True, exist_ok=True)
    ref_files = {}
    for target in set(REFERENCES.get(name, {}).values()):
        ref_files[target] = str(work / f"ids-{target}.parquet")
        pq.write_table(pa.table({"id": pa.array(sorted(refs[target]), pa.string())}), ref_files[target])
    n = len(table.files)
    jobs = [(str(f), table.order, table.order_by, i) for i, f in enumerate(table.files)]
    checked = mapper(
        check_part,
        jobs,
        name=name,
        dim=dim,
        kinds=kinds,
        refs=ref_files,
        buckets=n,
        workdir=str(work),
        batch_rows=batch_rows,
    )
    failed: dict[tuple[str, str], dict[str, Any]] = {}
    for part in checked:
        for f in part:
            entry = failed.setdefault((f["expectation"], f["column"]), dict(f, unexpected_count=0))
            entry["unexpected_count"] += f["unexpected_count"]
    for column in unique_columns(name, dim, kinds):
        buckets = [[str(work / f"{column}-{b:05d}-{p:05d}.parquet") for p in range(n)] for b in range(n)]
        repeats = mapper(repeated_values, buckets)
        count = sum(c for c, _ in repeats)
        if count:
            failed[("expect_column_values_to_be_unique", column)] = {
                "table": name,
                "expectation": "expect_column_values_to_be_unique",
                "column": column,
                "unexpected_count": count,
                "sample": sorted(v for _, sample in repeats for v in sample)[:3],
            }
    return list(failed.values())


def unique_columns(name: str, dim: int, kinds: tuple[str, ...]) -> list[str]:
    import great_expectations as gx

    from schemas.expectations import suites

    return [e.column for e in suites(dim, kinds)[name] if isinstance(e, gx.expectations.ExpectColumnValuesToBeUnique)]


def check_part(
    job: tuple[str, Any, tuple[str, ...] | None, int],
    name: str,
    dim: int,
    kinds: tuple[str, ...],
    refs: dict[str, str],
    buckets: int,
    workdir: str,
    batch_rows: int,
) -> list[dict[str, Any]]:
    """One part (a task): the suite but uniqueness over its rows, in their canonical order; the values of each
    column that must be unique written to ``buckets`` files by hash. Returns the part's failures."""
    import great_expectations as gx
    import numpy as np

    from schemas.expectations import REFERENCES, suites
    from tasks.index.validate import check_table, suite_columns
    from tasks.store.spill import key_hash

    path, order, order_by, part = job
    unique = unique_columns(name, dim, kinds)
    unique_type = gx.expectations.ExpectColumnValuesToBeUnique
    expectations = [e for e in suites(dim, kinds)[name] if not isinstance(e, unique_type)]
    names = pq.read_schema(path).names
    wanted = suite_columns(expectations) | set(REFERENCES.get(name, {})) | set(unique)
    # with what its canonical order reads (every column when it does not say)
    read = None if order is not None and order_by is None else [c for c in names if c in wanted | set(order_by or ())]
    table = pq.read_table(path, columns=read)
    table = order(table) if order is not None else table
    ids = {target: set(pq.read_table(f).column("id").to_pylist()) for target, f in refs.items()}
    failures = check_table(name, table, expectations, {}, ids, batch_rows)
    for column in unique:
        values = table.column(column)
        bucket = key_hash(values) % np.uint64(buckets)
        for b in range(buckets):
            out = Path(workdir) / f"{column}-{b:05d}-{part:05d}.parquet"
            tmp = out.with_suffix(f".{part}.tmp")
            pq.write_table(pa.table({"v": values.filter(pa.array(bucket == b))}), tmp)
            tmp.replace(out)  # whole or not at all: a retried task writes it again
    return failures


def repeated_values(files: list[str]) -> tuple[int, list[str]]:
    """One bucket (a task): how many of its non-null values occur more than once, and a sample of them."""
    import polars as pl

    frame = pl.concat([pl.read_parquet(f) for f in files]).drop_nulls()
    counts = frame.group_by("v").len().filter(pl.col("len") > 1)
    repeated = counts.get_column("len").sum() if counts.height else 0
    sample = sorted(v for v, k in counts.iter_rows() for _ in range(k))[:3]
    return int(repeated), sample
