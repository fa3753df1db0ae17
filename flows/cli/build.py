"""Commands that write an index: ``init``, ``index``, ``update``, ``backfill``. Each runs a Prefect flow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from flows.api import RunResult, check_corpus, write
from flows.cli.common import (
    ConfigOpt,
    EstimateOpt,
    IndexOpt,
    JsonOpt,
    LockOpt,
    MaxCostOpt,
    QuietOpt,
    SetOpt,
    command,
    config,
    console,
    out,
    overrides,
    progress,
    with_cap,
)
from schemas.config import default_toml
from tasks.errors import NotFoundError, RefusedError, UsageError


@command()
def init(
    path: Path = typer.Argument(Path("strata.toml"), help="Where to write the config."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
) -> None:
    """Write a commented strata.toml with every setting at its default, and every LLM prompt (commented out)."""
    if path.exists() and not force:
        raise RefusedError(f"{path} exists (use --force to overwrite)")
    path.write_text(default_toml(), encoding="utf-8")
    console.print(f"wrote {path}")


@command()
def index(
    corpus: Path = typer.Argument(..., help="A folder of .txt/.md/.jsonl/.parquet files, or one such file."),
    index: str = IndexOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    lock_timeout: float = LockOpt,
    quiet: bool = QuietOpt,
    max_cost: Optional[float] = MaxCostOpt,
    estimate: bool = EstimateOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Full build: ingest, chunk, extract (Dask), merge, embed, validate and publish one snapshot."""
    set_ = with_cap(set_, max_cost)
    if estimate:
        return print_estimates([estimate_of(corpus, index, config_path, set_, full=True)], as_json)
    result = run_writer("index_flow", corpus, index, config_path, set_, quiet, lock_timeout)
    print_summary(result)
    print_quarantine(index, result, config_path, set_)


def run_writer(
    flow: str, corpus: Path, index: str, config_path: Path | None, set_: list[str] | None, quiet: bool, *args: Any
) -> RunResult:
    """A writing flow through the Python API (``flows.api``), with progress bars."""

    with progress(quiet):
        return write(flow, corpus, index, config_path, overrides(set_), *args)


@command()
def update(
    corpus: Path = typer.Argument(
        ..., help="The corpus root to refresh from (documents of other roots are left alone)."
    ),
    index: str = IndexOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    full: bool = typer.Option(False, "--full", help="Rebuild everything instead of applying the delta."),
    replace_root: Optional[str] = typer.Option(
        None,
        "--replace-root",
        help="An indexed corpus root that CORPUS is the new location of (a moved mount, a new "
        "export folder): diff against its documents instead of adding CORPUS as a new root. Remembered afterwards.",
    ),
    lock_timeout: float = LockOpt,
    quiet: bool = QuietOpt,
    max_cost: Optional[float] = MaxCostOpt,
    estimate: bool = EstimateOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Incremental refresh: new, changed and deleted documents (by content hash) since the last snapshot.

    New entities attach to the most similar summary nodes (HyGRAG), only the touched ancestors, communities
    and reports are refreshed, and one new snapshot is published. Nothing changed means nothing published."""
    set_ = with_cap(set_, max_cost)
    if estimate:
        return print_estimates([estimate_of(corpus, index, config_path, set_, full, replace_root)], as_json)
    result = run_writer("refresh_flow", corpus, index, config_path, set_, quiet, lock_timeout, full, replace_root)
    diff = result.stages.get("diff", {})
    if diff.get("new_root"):
        out.print(
            f"new corpus root: {diff.get('new', 0)} documents of {corpus} added next to the index's other roots "
            "(if it is the new location of an indexed root, run again with --replace-root THAT_ROOT after "
            "`strata rollback`)"
        )
    if result.status == "nothing-to-do":
        out.print(f"nothing changed under {corpus}: snapshot v{result.version} stays published, nothing written")
        return
    print_summary(result)
    print_quarantine(index, result, config_path, set_)


def date_partitions(pattern: str, start: str, end: str) -> list[str]:
    """Folders for every day from ``start`` to ``end`` (inclusive): ``pattern`` is formatted with ``date``."""
    import datetime as dt

    try:
        day, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    except ValueError as exc:
        raise UsageError(f"--from/--to take dates as YYYY-MM-DD: {exc}") from None
    if last < day:
        raise UsageError(f"--to {end} is before --from {start}")
    folders = []
    while day <= last:
        folders.append(pattern.format(date=day))
        day += dt.timedelta(days=1)
    return folders


@command()
def backfill(
    partitions: Optional[list[Path]] = typer.Argument(None, help="Corpus folders, applied in the order given."),
    index: str = IndexOpt,
    date_from: Optional[str] = typer.Option(None, "--from", help="First day (YYYY-MM-DD) of a date range."),
    date_to: Optional[str] = typer.Option(None, "--to", help="Last day (YYYY-MM-DD) of a date range."),
    pattern: str = typer.Option("{date:%Y-%m-%d}", help="Folder of a day, e.g. 'corpus/{date:%Y/%m/%d}'."),
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    lock_timeout: float = typer.Option(0.0, help="Seconds to wait for another writer per partition (then exit 5)."),
    quiet: bool = QuietOpt,
    max_cost: Optional[float] = typer.Option(
        None, "--max-cost", min=0.0, help="The LLM cost cap of each partition's run, in USD (llm.max_cost_usd)."
    ),
    estimate: bool = EstimateOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Apply partitions in order, each as an incremental update of its own folder (resumable).

    Partitions are folders given as arguments, or days from --from to --to mapped to folders by --pattern.
    Finished partitions have nothing to do on a re-run; a failed one is retried."""
    from flows.index_flow import backfill_flow

    set_ = with_cap(set_, max_cost)
    parts = [str(p) for p in partitions or []]
    if date_from or date_to:
        if not (date_from and date_to):
            raise UsageError("--from and --to go together")
        parts += date_partitions(pattern, date_from, date_to)
    if not parts:
        raise UsageError("give partition folders, or --from/--to with --pattern")
    missing = [p for p in parts if not Path(p).exists()]
    if missing:
        raise NotFoundError(f"partition folder(s) not found: {', '.join(missing)}")
    config(config_path, set_)
    if estimate:  # each partition against the snapshot of now: a finished one has nothing to do
        return print_estimates([estimate_of(Path(p), index, config_path, set_) for p in parts], as_json)
    try:
        with progress(quiet):
            results = backfill_flow(
                parts, index, str(config_path) if config_path else None, overrides(set_), lock_timeout
            )
    except Exception as exc:
        exc.args = (f"{exc}\nre-run the same command to resume: finished partitions are skipped",)
        raise
    t = Table(title="backfill")
    for col in ("partition", "status", "snapshot"):
        t.add_column(col)
    for r in results:
        t.add_row(r["partition"], r["status"], str(r["version"]))
    out.print(t)


def estimate_of(
    corpus: Path,
    index: str,
    config_path: Path | None,
    set_: list[str] | None,
    full: bool = False,
    replace_root: str | None = None,
) -> dict[str, Any]:
    """What the run on ``corpus`` would spend on LLM calls (``flows.estimate.estimate_run``)."""
    from flows.estimate import estimate_run

    cfg = config(config_path, set_)
    check_corpus(corpus)
    return estimate_run(str(corpus), index, cfg, full, replace_root)


def print_estimates(estimates: list[dict[str, Any]], as_json: bool) -> None:
    """Each estimate as a table of its LLM stages (or as JSON), then the total and the cap it would meet."""
    if as_json:
        out.print_json(json.dumps(estimates[0] if len(estimates) == 1 else estimates))
        return
    for est in estimates:
        title = (
            f"LLM estimate, {est['kind']} of {est['corpus']}: {est['documents']} documents, {est['chunks']} chunks, "
            f"{est['corpus_tokens']:,} tokens"
        )
        if not est["stages"]:
            out.print(f"{title}: no LLM call (nothing to do, or every stage offline)")
            continue
        t = Table(title=title)
        for col in ("stage", "model", "calls", "cached", "input tokens", "output tokens", "USD", "basis"):
            t.add_column(col, justify="right" if col in ("calls", "cached", "USD") or "tokens" in col else "left")
        for r in [*est["stages"], {"stage": "total", "model": "", "basis": "", **est["total"]}]:
            t.add_row(
                r["stage"],
                r["model"],
                f"{r['calls']:,}",
                f"{r['cached']:,}",
                f"{r['input_tokens']:,}",
                f"~{r['output_tokens']:,}",
                f"{r['cost_usd']:.4f}",
                r["basis"],
            )
        out.print(t)
        cap = est.get("max_cost_usd")
        if cap is not None and est["total"]["cost_usd"] > cap:
            out.print(f"the cap of ${cap:.4f} (llm.max_cost_usd) would stop this run before its end")
    out.print("an estimate only: no model was called, the index was not written")


def print_summary(result: RunResult) -> None:
    table = Table(title=f"published snapshot v{result.version} in {result.seconds:.1f}s")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("counts")
    for stage, vals in result.stages.items():
        counts = ", ".join(f"{k}={v}" for k, v in vals.items() if k != "seconds")
        table.add_row(stage, f"{vals['seconds']:.2f}", counts)
    out.print(table)
    rows = Table(title="rows per table")
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name, n in result.counts.items():
        rows.add_row(name, str(n))
    out.print(rows)


def print_quarantine(index: str, result: RunResult, config_path: Path | None, set_: list[str] | None) -> None:
    """What the published snapshot quarantined, with the reasons (``tasks.query.inspect.quarantine_lines``)."""
    from tasks.query.inspect import quarantine_lines
    from tasks.store.catalog import Catalog

    cat = Catalog(index, create=False, storage=config(config_path, set_).storage)
    for line in quarantine_lines(cat, cat.require_snapshot(result.version)):
        out.print(line, markup=False, highlight=False)
