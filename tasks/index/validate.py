"""Validate: run the great-expectations suites of ``schemas.expectations`` over in-memory tables, and over a
spilled table a part per task (``validate_spilled``)."""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.tables import REFERENCES, SHARED_RELATION_KINDS
from tasks.runtime.stages import release_memory
from tasks.store import workfs
from tasks.store.spill import SpilledTable, key_hash, read_part, write_whole

if TYPE_CHECKING:
    import pandas as pd

    from tasks.store.spill import SpilledTable


class ValidationFailed(RuntimeError):
    def __init__(self, failures: list[dict[str, Any]]):
        self.failures = failures
        lines = [f"{len(failures)} expectation(s) failed; nothing was published:"]
        for f in failures[:20]:
            lines.append(
                f"  - {f['table']}: {f['expectation']}({f['column']}) — {f['unexpected_count']} bad row(s), e.g. {f['sample']}"
            )
        super().__init__("\n".join(lines))


@dataclass
class ValidationReport:
    success: bool
    checked: dict[str, int] = field(default_factory=dict)  # table -> expectations evaluated
    failures: list[dict[str, Any]] = field(default_factory=list)


def warm() -> None:
    """What a validation child loads before its first part (``ProcessMapper.start``): great-expectations and its
    context, ~1.8 s of imports that a small run's child makes while the run extracts and clusters."""
    from schemas import expectations  # noqa: F401

    _context()


@functools.lru_cache(maxsize=1)
def _context():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx

    # this module sets its own logger to INFO at import ("Created temporary directory ... docs site")
    logging.getLogger("great_expectations.data_context.types.base").setLevel(logging.ERROR)
    ctx = gx.get_context(mode="ephemeral")
    try:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    except Exception:  # noqa: BLE001 - cosmetic only
        pass
    return ctx, ctx.data_sources.add_pandas("strata")


def _vector_columns(table: pa.Table) -> dict[str, np.ndarray]:
    col = table.column("vector")
    dims = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    finite = np.ones(len(table), dtype=bool)
    if len(table):
        flat = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float32)
        if len(flat) == int(np.nansum(dims)) and np.all(dims == dims[0]) and dims[0] > 0:
            finite = np.isfinite(flat.reshape(len(table), int(dims[0]))).all(axis=1)
        else:  # ragged: check row by row
            finite = np.array(
                [v is not None and bool(np.isfinite(np.asarray(v, dtype=np.float32)).all()) for v in col.to_pylist()]
            )
    return {"vector_dim": np.nan_to_num(dims.astype(float), nan=-1).astype(int), "vector_finite": finite}


#: the tables whose ids other tables' rows name (``refs``)
REFERENCED = ("documents", "chunks", "entities", "communities")


#: what ``_frame`` reads for a table's derived columns besides its suite's columns: (columns, reference sets)
_DERIVED_INPUTS: dict[str, tuple[set[str], set[str]]] = {
    "entities": ({"layer", "source_chunk_ids", "vector"}, {"chunks"}),
    "relations": ({"source_chunk_ids"}, {"chunks"}),
    "chunks": ({"status", "id", "vector"}, {"quarantine_items"}),
    "community_reports": ({"vector"}, set()),
    "communities": ({"entity_ids", "parent_id"}, {"entities", "communities"}),
}


def frame_inputs(name: str) -> tuple[set[str], set[str]]:
    """The columns and the reference sets (``refs`` keys) that table ``name``'s frame reads beyond its suite's
    columns: what a task validating one part of it must be given."""

    columns, refs = _DERIVED_INPUTS.get(name, (set(), set()))
    references = REFERENCES.get(name, {})
    return columns | set(references), refs | set(references.values())


def _frame(name: str, table: pa.Table, refs: dict[str, set[str]], columns: set[str]) -> pd.DataFrame:
    """The pandas frame a suite reads: the table's ``columns`` that are scalar, plus the derived columns."""

    scalar = [
        f.name
        for f in table.schema
        if f.name in columns and not pa.types.is_list(f.type) and not pa.types.is_fixed_size_list(f.type)
    ]
    df = table.select(scalar).to_pandas()
    if "vector" in table.column_names:
        for k, v in _vector_columns(table).items():
            df[k] = v
    for column, target in REFERENCES.get(name, {}).items():  # the ids the referenced table lacks, else null
        values = table.column(column)
        known = pc.is_in(values, value_set=pa.array(sorted(refs[target]), type=pa.string()))
        df[f"{column}_dangling"] = pc.if_else(known, pa.scalar(None, pa.string()), values).to_pandas()
    if name in ("entities", "relations"):
        chunk_ids = refs["chunks"]
        known = []
        for layer, srcs in zip(
            table.column("layer").to_pylist() if "layer" in table.column_names else [0] * len(table),
            table.column("source_chunk_ids").to_pylist(),
        ):
            srcs = srcs or []
            known.append(all(s in chunk_ids for s in srcs) and (layer > 0 or len(srcs) > 0 or name == "relations"))
        df["sources_known"] = known
    if name == "chunks":
        q_items = refs["quarantine_items"]
        status = table.column("status").to_pylist()
        ids = table.column("id").to_pylist()
        df["accounted"] = [s == "extracted" or (s == "quarantined" and cid in q_items) for s, cid in zip(status, ids)]
    if name == "communities":
        ents, comms = refs["entities"], refs["communities"]
        df["members_known"] = [bool(m) and all(x in ents for x in m) for m in table.column("entity_ids").to_pylist()]
        df["parent_known"] = [p is None or p in comms for p in table.column("parent_id").to_pylist()]
    return df


def _whole_table(expectations: list[Any], table: Any) -> tuple[list[Any], dict[str, np.ndarray]]:
    """Uniqueness is a property of the whole column, not of a slice: it is computed here, over the whole table,
    as a derived ``<column>_unique`` column, and the suite checks that instead (same failure counts)."""
    import great_expectations as gx

    out, derived = [], {}
    for exp in expectations:
        if isinstance(exp, gx.expectations.ExpectColumnValuesToBeUnique):
            derived[f"{exp.column}_unique"] = unique_mask(
                lambda c=exp.column: (t.column(c) for t in _parts(table, [c]))
            )
            exp = gx.expectations.ExpectColumnValuesToBeInSet(column=f"{exp.column}_unique", value_set=[True])
        out.append(exp)
    return out, derived


def unique_mask(columns) -> np.ndarray:
    """True where a value occurs once in the whole column (or is null); ``columns()`` yields the column piece by
    piece. Values are compared by a 64-bit hash, and by value only where hashes repeat, so that a column
    larger than memory (a spilled table's) is checked holding its hashes and the repeated values only."""
    from collections import Counter

    hashes, nulls = [], []
    for col in columns():
        hashes.append(key_hash(col))
        nulls.append(pc.is_null(col).to_numpy(zero_copy_only=False))
    if not hashes:
        return np.zeros(0, dtype=bool)
    h, null = np.concatenate(hashes), np.concatenate(nulls)
    # the hashes that occur twice or more, found in one sorted copy (9.5M mention ids at 100k chunks: a unique
    # with inverse and counts held ~4 arrays of the column's length at the validation's peak)
    ordered = np.sort(h[~null] if null.any() else h)
    twice = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    del ordered
    repeated = np.zeros(len(h), dtype=bool)
    if len(twice):
        repeated = twice[np.minimum(np.searchsorted(twice, h), len(twice) - 1)] == h
        repeated &= ~null
    mask = ~repeated
    if repeated.any():  # the same hash: the same value, unless two values collide
        seen: list[Any] = []  # the values of the repeated hashes
        at, start = np.flatnonzero(repeated), 0
        for col in columns():
            here = at[(at >= start) & (at < start + len(col))]
            seen += col.take(pa.array(here - start)).to_pylist() if len(here) else []
            start += len(col)
        count = Counter(seen)
        mask[at] = [count[v] == 1 for v in seen]
    return mask


def _slices(table: Any, batch_rows: int, columns: list[str] | None = None):
    """(first row, slice) of ``batch_rows`` rows at most, over the whole table (a spilled one: ``columns`` only)."""

    start = 0
    for piece in _parts(table, columns):
        for s in range(0, piece.num_rows, batch_rows):
            part = piece.slice(s, batch_rows)
            yield start, part
            start += part.num_rows
        del piece, part
        release_memory()  # a part's frames (and a table's, after its last), before the next is read


def _parts(table: Any, columns: list[str] | None = None):
    """A table's pieces: an Arrow table whole, a spilled one part by part (only ``columns``, if given)."""

    return table.parts(columns) if isinstance(table, SpilledTable) else [table]


def validate_tables(
    tables: dict[str, Any],
    dim: int,
    batch_rows: int = 25_000,
    relation_kinds: tuple[str, ...] | None = None,
    mapper: Any = None,
    workdir: Any = None,
    kept_ids: dict[str, set[str]] | None = None,
) -> ValidationReport:
    """Run each table's suite; cross-table references are resolved within ``tables`` and ``kept_ids`` (the ids of
    the rows a table given as a change keeps, ``REFERENCED`` tables only).

    Tables are validated in slices of ``batch_rows`` rows, each read into pandas with only the columns its
    suite names, so memory stays bounded however large a table grows (failure counts add up over slices).
    With a ``mapper`` (the run's Dask workers) every table is validated by tasks, a part per task, with
    ``workdir`` for what the tasks share (``validate_spilled``; a table in memory is written there as one part),
    and this process never loads great-expectations. ``relation_kinds``: the kinds a relation may have (the
    flow passes every registered method's; default: the shared ones, ``SHARED_RELATION_KINDS``)."""

    def ids(name: str) -> list[str]:
        return tables[name].column("id").to_pylist() if name in tables else []

    refs = {n: set(ids(n)) - {None} | (kept_ids or {}).get(n, set()) for n in REFERENCED}
    refs["quarantine_items"] = set(tables["quarantine"].column("item").to_pylist()) if "quarantine" in tables else set()
    kinds = relation_kinds or SHARED_RELATION_KINDS
    report = ValidationReport(success=True)
    if mapper is None:
        from schemas.expectations import suites

        specs = suites(dim, kinds)
    for name, table in tables.items():
        if table.num_rows == 0:
            continue
        if mapper is not None:
            if not isinstance(table, SpilledTable):
                whole = workfs.join(workdir, f"whole-{name}.parquet")
                write_whole(table, whole)
                table = SpilledTable([whole], table.schema, table.num_rows)
            failed, checked = validate_spilled(mapper, name, table, refs, dim, kinds, batch_rows, workdir)
        else:
            if name not in specs:
                continue
            expectations, derived = _whole_table(specs[name], table)
            failed, checked = check_table(name, table, expectations, derived, refs, batch_rows), len(specs[name])
        if checked:
            report.checked[name] = checked
        report.failures += failed
    report.success = not report.failures
    return report


_GX = threading.Lock()


def check_table(
    name: str,
    table: Any,
    expectations: list[Any],
    derived: dict[str, np.ndarray],
    refs: dict[str, set[str]],
    batch_rows: int,
) -> list[dict[str, Any]]:
    """The failures of ``expectations`` over ``table`` (slice by slice), one entry per expectation and column with
    its unexpected rows counted and a sample; ``derived`` columns are added to every slice."""
    import great_expectations as gx

    with _GX:  # great-expectations' context is one per process, not thread-safe (a threaded Dask worker)
        columns = suite_columns(expectations)
        _, source = _context()
        try:
            asset = source.get_asset(name)
        except LookupError:
            asset = source.add_dataframe_asset(name=name)
        try:
            batch_def = asset.get_batch_definition("all")
        except (KeyError, LookupError):
            batch_def = asset.add_batch_definition_whole_dataframe("all")
        suite = gx.ExpectationSuite(name=f"strata-{name}")
        for exp in expectations:
            suite.add_expectation(exp)
        failed: dict[tuple[str, str], dict[str, Any]] = {}
        read = sorted(set(table.column_names) & (columns | frame_inputs(name)[0]))  # of a spilled table
        for start, part in _slices(table, batch_rows, read):
            df = _frame(name, part, refs, columns)
            for column, values in derived.items():
                df[column] = values[start : start + part.num_rows]
            result = batch_def.get_batch(batch_parameters={"dataframe": df}).validate(suite)
            for r in result.results:
                if r.success:
                    continue
                kw = r.expectation_config.kwargs
                column = kw.get("column") or f"{kw.get('column_A')},{kw.get('column_B')}"
                kind = r.expectation_config.type
                sample = (r.result.get("partial_unexpected_list") or [])[:3]
                if column in derived:  # reported as the uniqueness expectation it stands for, with repeated values
                    kind, column = "expect_column_values_to_be_unique", column.removesuffix("_unique")
                    sample = table.column(column).filter(pa.array(~derived[f"{column}_unique"])).to_pylist()[:3]
                entry = failed.setdefault(
                    (kind, column),
                    {"table": name, "expectation": kind, "column": column, "unexpected_count": 0, "sample": sample},
                )
                entry["unexpected_count"] += r.result.get("unexpected_count") or 0
        return list(failed.values())


def suite_columns(expectations: list[Any]) -> set[str]:
    """The columns ``expectations`` name (derived ones included)."""
    return {
        kw[k]
        for e in expectations
        for kw in [e.configuration.kwargs]
        for k in ("column", "column_A", "column_B")
        if kw.get(k)
    }


# ---------------------------------------------------------------------------- a spilled table, a part per task
# A spilled table validated as tasks on the cluster, a part per task, the results aggregated by the run. Round 1,
# a task per part: the table's suite over that part (``check_table``) without its uniqueness expectations, the ids
# a reference must resolve to read from the run's work folder; and each column that must be unique written out
# in buckets by a hash of its values. Round 2, a task per bucket: the values that occur more than once across all
# parts. The run adds up the failure counts (the same report as validating the table in one process) and holds
# only them.

#: values of a unique column a bucket task holds at most (about 100 MB of ids): a bucket per this many rows, not a
#: bucket per part, so the files written (parts x buckets) do not grow with the square of the parts
UNIQUE_BUCKET_ROWS = 1_000_000


def validate_spilled(
    mapper: Any,
    name: str,
    table: SpilledTable,
    refs: dict[str, set[str]],
    dim: int,
    kinds: tuple[str, ...],
    batch_rows: int,
    workdir: Any,
) -> tuple[list[dict[str, Any]], int]:
    """The failures of table ``name``'s suite over the spilled ``table``, checked part by part on ``mapper``, and
    the number of expectations its suite has (0: none)."""

    work = workfs.join(workdir, f"validate-{name}")
    workfs.mkdirs(work)
    ref_files = {}
    for target in sorted(frame_inputs(name)[1]):
        ref_files[target] = workfs.join(work, f"ids-{target}.parquet")
        write_whole(pa.table({"id": pa.array(sorted(refs[target]), pa.string())}), ref_files[target])
    n, buckets = len(table.files), max(1, -(-table.num_rows // UNIQUE_BUCKET_ROWS))
    jobs = [(f, table.order, table.order_by, i) for i, f in enumerate(table.files)]
    checked = mapper(
        check_part,
        jobs,
        name=name,
        dim=dim,
        kinds=kinds,
        refs=ref_files,
        buckets=buckets,
        workdir=work,
        batch_rows=batch_rows,
    )
    failed: dict[tuple[str, str], dict[str, Any]] = {}
    for part, _, _ in checked:
        for f in part:
            entry = failed.setdefault((f["expectation"], f["column"]), dict(f, unexpected_count=0))
            entry["unexpected_count"] += f["unexpected_count"]
    _, expectations, unique = checked[0]
    for column in unique:
        files = [[workfs.join(work, f"{column}-{b:05d}-{p:05d}.parquet") for p in range(n)] for b in range(buckets)]
        repeats = mapper(repeated_values, files)
        count = sum(c for c, _ in repeats)
        if count:
            failed[("expect_column_values_to_be_unique", column)] = {
                "table": name,
                "expectation": "expect_column_values_to_be_unique",
                "column": column,
                "unexpected_count": count,
                "sample": sorted(v for _, sample in repeats for v in sample)[:3],
            }
    return list(failed.values()), expectations


def check_part(
    job: tuple[str, Any, tuple[str, ...] | None, int],
    name: str,
    dim: int,
    kinds: tuple[str, ...],
    refs: dict[str, str],
    buckets: int,
    workdir: str,
    batch_rows: int,
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """One part (a task): the suite but uniqueness over its rows, in their canonical order; the values of each
    column that must be unique written to ``buckets`` files by hash. Returns the part's failures, the number of
    expectations of the table's suite (0: it has none) and the columns that must be unique."""
    import great_expectations as gx
    import numpy as np

    from schemas.expectations import suites

    path, order, order_by, part = job
    suite = suites(dim, kinds).get(name, [])
    unique_type = gx.expectations.ExpectColumnValuesToBeUnique
    unique = [e.column for e in suite if isinstance(e, unique_type)]
    expectations = [e for e in suite if not isinstance(e, unique_type)]
    wanted = suite_columns(expectations) | frame_inputs(name)[0] | set(unique)
    table = read_part(path, order, order_by, [c for c in workfs.read_schema(path).names if c in wanted])
    ids = {target: set(workfs.read_table(f).column("id").to_pylist()) for target, f in refs.items()}
    failures = check_table(name, table, expectations, {}, ids, batch_rows) if table.num_rows and suite else []
    for column in unique:
        values = table.column(column)
        bucket = key_hash(values) % np.uint64(buckets)
        for b in range(buckets):
            out = workfs.join(workdir, f"{column}-{b:05d}-{part:05d}.parquet")
            write_whole(pa.table({"v": values.filter(pa.array(bucket == b))}), out)
    return failures, len(suite), unique


def repeated_values(files: list[str]) -> tuple[int, list[str]]:
    """One bucket (a task): how many of its non-null values occur more than once, and a sample of them."""
    import polars as pl

    frame = pl.concat([cast(pl.DataFrame, pl.from_arrow(workfs.read_table(f))) for f in files]).drop_nulls()
    counts = frame.group_by("v").len().filter(pl.col("len") > 1)
    repeated = counts.get_column("len").sum() if counts.height else 0
    sample = sorted(v for v, k in counts.iter_rows() for _ in range(k))[:3]
    return int(repeated), sample
