"""Commands that look after an index: ``inspect``, ``validate``, ``export`` (read only), ``rollback``, ``gc``."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.common import AsOfOpt, ConfigOpt, LockOpt, ReadIndexOpt, SetOpt, command, open_catalog, out
from schemas.tables import ALL_TABLES, SNAPSHOT_TABLES
from tasks.errors import EXIT_CODES, UsageError
from tasks.store.gc import COMPACT_SHARE
from tasks.store.ids import make_id


def _table(title: str, columns: tuple[str, ...], rows: list[list[str]], justify: str = "left") -> Table:
    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*row)
    return t


@command()
def inspect(
    index: str = ReadIndexOpt,
    as_of: Optional[int] = AsOfOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    runs: int = typer.Option(5, help="How many recent runs to show."),
    versions: bool = typer.Option(False, "--versions", help="List every published snapshot."),
    quality: bool = typer.Option(
        False,
        "--quality",
        help="Also measure how readable the graph is (generic entity names, summary names, "
        "labelled relations, reports that repeat a sentence or stop mid-sentence).",
    ),
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """Row counts of the published snapshot, its version, the layer statistics and the last runs (exit 4 when a
    table of the snapshot cannot be read)."""
    from tasks.query.inspect import inspect_data, quarantine_lines, quarantined

    cat = open_catalog(index, config_path, set_)
    data = inspect_data(cat, as_of, runs)
    if quality and not data["problems"]:
        from tasks.query.quality import graph_quality

        data["quality"] = graph_quality(cat, cat.require_snapshot(data["version"]))
    damaged = typer.Exit(EXIT_CODES["damaged"]) if data["problems"] else None
    readable = "quarantine" not in " ".join(data["problems"])  # a damaged quarantine table is reported as such
    if as_json:
        if readable:
            count, rows = quarantined(cat, cat.require_snapshot(data["version"]))
            data["quarantine"] = {"count": count, "rows": rows}
        out.print_json(json.dumps(data, default=str))
        if damaged:
            raise damaged
        return
    out.print(
        f"[bold]{escape(data['index'])}[/]  snapshot v{data['version']} ({data['kind']}, {data['created_at']}), "
        f"method {data['method']}"
    )
    for problem in data["problems"]:
        out.print(f"[bold red]damaged:[/] {escape(problem)}", highlight=False)
    out.print(_table("tables", ("table", "rows"), [[k, str(v)] for k, v in data["tables"].items()]))
    if readable:
        for line in quarantine_lines(cat, cat.require_snapshot(data["version"])):
            out.print(line, markup=False, highlight=False)
    cols = ("layer", "n_entities", "n_clusters", "cluster_sparsity", "change_rate", "stop_reason")
    if data["layers"]:
        out.print(
            _table(
                "hierarchy layers",
                cols,
                [
                    [("" if l[c] is None else f"{l[c]:.4f}" if isinstance(l[c], float) else str(l[c])) for c in cols]
                    for l in data["layers"]
                ],
            )
        )
    if data["nodes"] and len(data["nodes"][0]) > 2:  # the method's own relation kinds, counted per layer
        keys = tuple(data["nodes"][0])
        out.print(
            _table(
                f"{data['method']} links per layer", keys, [[str(n[k]) for k in keys] for n in data["nodes"]], "right"
            )
        )
    if data["relation_labels"]:
        total = sum(data["relations_by_kind"].values())
        out.print(
            _table(
                f"relation labels: {data['relations_labelled']} of {total} relations, the most used",
                ("label", "relations"),
                [[k, str(v)] for k, v in data["relation_labels"].items()],
            )
        )
    if data["communities"]:
        keys = ("level", "count", "min_size", "median_size", "max_size")
        out.print(
            _table("communities per level", keys, [[str(c[k]) for k in keys] for c in data["communities"]], "right")
        )
    if data.get("quality"):
        q = data["quality"]
        measures = {
            "layer-0 entities of highest degree named by one lowercase word": (
                "top_entities_one_lowercase_word",
                "top_entities",
            ),
            "summary entities named by their members' names": ("summaries_named_by_members", "summary_entities"),
            "summary entities described by a list of names": ("summaries_listing_names", "summary_entities"),
            "layer-0 relations with a label (not co-occurrence)": ("labelled_relations", "layer0_relations"),
            "  of which a verb or a noun (not a preposition alone)": ("verb_or_noun_relations", "layer0_relations"),
            "layer-0 descriptions with page furniture": ("descriptions_with_furniture", "layer0_entities"),
            "layer-0 names across a clause break, a list or a bracket": ("names_across_a_break", "layer0_entities"),
            "layer-0 entities that merged aliases (a surname, a first name, a title)": (
                "alias_merges",
                "layer0_entities",
            ),
            "reports whose summary repeats a passage, opens or stops mid-sentence": (
                "reports_repeating_or_cut",
                "reports",
            ),
        }
        shown = [[m, str(q[v]), str(q[n])] for m, (v, n) in measures.items()]
        out.print(_table("graph quality", ("measure", "value", "of"), shown))
    if versions:
        out.print(
            _table(
                "snapshots",
                ("version", "created_at", "kind"),
                [[str(v["version"]), v["created_at"], v["kind"]] for v in data["versions"]],
            )
        )
    out.print(
        _table(
            "recent runs",
            ("started_at", "flow", "status", "snapshot", "LLM models (calls, USD)", "error"),
            [
                [
                    r["started_at"] or "",
                    r["flow"],
                    r["status"],
                    str(r["snapshot_version"] or ""),
                    escape(_models(r)),
                    escape((r["error"] or "")[:80]),
                ]
                for r in data["runs"]
            ],
        )
    )
    if damaged:
        raise damaged


def _models(run: dict[str, Any]) -> str:
    """Which model each LLM stage of a run used, and what the run's calls cost: "offline" when none used one."""
    used = {stage: model for stage, model in (run.get("llm") or {}).items() if model != "offline"}
    if not used:
        return "offline"
    cost = f"{run['llm_calls']} calls, ${run['llm_cost_usd']:.4f}"
    return "; ".join(f"{stage}: {model}" for stage, model in used.items()) + f" ({cost})"


@command()
def validate(
    index: str = ReadIndexOpt,
    as_of: Optional[int] = AsOfOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """Run the expectation suites over a published snapshot (exit 4 when any fails or a table cannot be read)."""
    from tasks.index.validate import validate_tables
    from tasks.methods.registry import relation_kinds

    cat = open_catalog(index, config_path, set_)
    snap = cat.require_snapshot(as_of)
    tables = {name: cat.read(name, snap=snap) for name in SNAPSHOT_TABLES}
    report = validate_tables(tables, snap["dim"], relation_kinds=relation_kinds())
    for name, n in report.checked.items():
        out.print(f"{name}: {n} expectations")
    if report.success:
        out.print(f"[green]snapshot v{snap['version']}: all expectations passed[/]")
        return
    for f in report.failures:
        out.print(
            f"[red]FAIL[/] {f['table']}: {f['expectation']}({f['column']}) — {f['unexpected_count']} bad row(s), "
            f"e.g. {escape(str(f['sample']))}"
        )
    raise typer.Exit(EXIT_CODES["damaged"])


@command()
def rollback(
    index: str = ReadIndexOpt,
    to: int = typer.Option(..., "--to", help="The snapshot version to return to (see `strata inspect --versions`)."),
    lock_timeout: float = LockOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """Undo a bad refresh in seconds: publish a new snapshot that pins the tables of an earlier one (nothing rewritten)."""
    from datetime import datetime

    cat = open_catalog(index, config_path, set_)
    with cat.writer_lock(lock_timeout):
        started = datetime.now(UTC)
        run_id = make_id("run", started.isoformat(), "rollback", to)
        cat.log_run(
            {
                "id": run_id,
                "flow": "rollback",
                "started_at": started,
                "status": "running",
                "parameters": json.dumps({"index": cat.uri, "to": to}),
            }
        )
        version = cat.rollback(to, run_id)
        cat.finish_run(run_id, {"status": "published", "ended_at": datetime.now(UTC), "snapshot_version": version})
    out.print(f"snapshot v{version} published: the tables of v{to}")


@command()
def gc(
    index: str = ReadIndexOpt,
    keep: int = typer.Option(..., "--keep", min=1, help="How many of the newest snapshots to keep (at least 1)."),
    compact_share: float = typer.Option(
        COMPACT_SHARE,
        "--compact-share",
        min=0.0,
        max=1.0,
        help="Write a table's history again once its files hold more than this share (of the rows the kept "
        "snapshots read) of rows that no kept snapshot reads: each kept snapshot then reads the same rows from "
        "files that hold only those (1: never).",
    ),
    lock_timeout: float = LockOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """Drop old snapshots and the table versions no kept snapshot needs (never a version a kept snapshot pins),
    and write again the tables whose files hold many rows that no kept snapshot reads."""
    cat = open_catalog(index, config_path, set_)
    with cat.writer_lock(lock_timeout):
        done = cat.gc(keep, compact_share=compact_share if compact_share < 1 else None)
    out.print(gc_summary(done), highlight=False)


def gc_summary(done: dict[str, Any]) -> str:
    """What ``strata gc`` removed and what the index's files lost, as measured (``tasks.store.gc``)."""
    compacted = ", ".join(f"{t} ({n} rows no snapshot reads dropped)" for t, n in done["compacted"].items())
    files = done["files_removed"]
    deleted = ", ".join(f"{n} {kind}" for kind, n in files.items()) or "none"
    versions = sum(done["versions_removed"].values())
    shared = (
        "; no data file deleted: the kept snapshots still read every one"
        if versions and not files.get("data files")
        else ""
    )
    return (
        f"kept snapshots {done['kept']}, dropped {done['dropped'] or 'none'}; table versions removed: {versions}; "
        f"files deleted: {deleted}{shared}"
        + (f"; compacted: {compacted}" if compacted else "")
        + f"; freed {size(done['bytes_removed'])} (the index: {size(done['bytes_before'])} -> "
        f"{size(done['bytes_after'])})"
    )


def size(n: int) -> str:
    """Bytes in the largest unit that keeps a figure >= 1 (B, kB, MB, GB; powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@command()
def export(
    index: str = ReadIndexOpt,
    out_dir: Path = typer.Option(..., "--out", "-o", help="Folder for <table>.parquet files (created if missing)."),
    fmt: str = typer.Option("parquet", "--format", help="Only 'parquet' for now."),
    tables: Optional[list[str]] = typer.Option(None, "--table", help="Export only these tables (repeatable)."),
    as_of: Optional[int] = AsOfOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """Write every table of a snapshot as <table>.parquet (load them with polars or duckdb)."""
    import pyarrow.parquet as pq

    if fmt != "parquet":
        raise UsageError(f"unsupported format {fmt!r}: only 'parquet'")
    names = tables or list(ALL_TABLES)
    unknown = [n for n in names if n not in ALL_TABLES]
    if unknown:
        raise UsageError(f"unknown table(s) {unknown}; known: {', '.join(ALL_TABLES)}")
    cat = open_catalog(index, config_path, set_)
    snap = cat.require_snapshot(as_of)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file, not a folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        data = cat.read(name, snap=snap)
        pq.write_table(data, out_dir / f"{name}.parquet")
        out.print(f"{name}: {data.num_rows} rows -> {out_dir / (name + '.parquet')}")
