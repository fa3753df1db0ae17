"""Commands that write an index: ``init``, ``index``, ``update``, ``backfill``. Each runs a Prefect flow."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from flows.cli.common import (
    ConfigOpt,
    IndexOpt,
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
    """Write a commented strata.toml with every setting at its default."""
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
) -> None:
    """Full build: ingest, chunk, extract (Dask), merge, embed, validate and publish one snapshot."""
    set_ = with_cap(set_, max_cost)
    result, seconds = run_writer("index_flow", corpus, index, config_path, set_, quiet, lock_timeout)
    print_summary(result, seconds)
    print_quarantine(index, result, config_path, set_)


def check_corpus(corpus: Path) -> None:
    """A corpus that is not there, or a folder with no file to read, fails before Prefect starts."""
    if not corpus.exists():
        raise NotFoundError(f"corpus not found: {corpus}")
    from tasks.index.ingest import corpus_files

    if corpus.is_dir() and next(corpus_files(corpus), None) is None:
        raise NotFoundError(f"no documents under {corpus}: the folder holds no files (.txt, .md, .jsonl or .parquet)")


def run_writer(
    flow: str, corpus: Path, index: str, config_path: Path | None, set_: list[str] | None, quiet: bool, *args: Any
) -> tuple[dict[str, Any], float]:
    """Check the config and the corpus first, then run a writing flow with progress bars."""
    from flows.pipeline import prewarm_child, release_prewarmed
    from tasks.methods.registry import get_method

    cfg = config(config_path, set_)
    get_method(cfg.index.method)  # fail fast on a bad config, before Prefect starts
    check_corpus(corpus)
    started = time.perf_counter()
    if not cfg.dask.address:  # a run on this machine: a small run's child starts loading now
        prewarm_child(cfg)
    try:
        import flows.index_flow as index_flows  # Prefect: ~1 s of imports, beside the child's

        with progress(quiet):
            result = index_flows.run_flow(
                flow, str(corpus), index, str(config_path) if config_path else None, overrides(set_), *args
            )
    finally:
        release_prewarmed()
    return result, time.perf_counter() - started


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
) -> None:
    """Incremental refresh: new, changed and deleted documents (by content hash) since the last snapshot.

    New entities attach to the most similar summary nodes (HyGRAG), only the touched ancestors, communities
    and reports are refreshed, and one new snapshot is published. Nothing changed means nothing published."""
    set_ = with_cap(set_, max_cost)
    result, seconds = run_writer(
        "refresh_flow", corpus, index, config_path, set_, quiet, lock_timeout, full, replace_root
    )
    diff = result["stages"].get("diff", {})
    if diff.get("new_root"):
        out.print(
            f"new corpus root: {diff.get('new', 0)} documents of {corpus} added next to the index's other roots "
            "(if it is the new location of an indexed root, run again with --replace-root THAT_ROOT after "
            "`strata rollback`)"
        )
    if result["status"] == "nothing-to-do":
        out.print(f"nothing changed under {corpus}: snapshot v{result['version']} stays published, nothing written")
        return
    print_summary(result, seconds)
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


def print_summary(result: dict[str, Any], seconds: float) -> None:
    table = Table(title=f"published snapshot v{result['version']} in {seconds:.1f}s")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("counts")
    for stage, vals in result["stages"].items():
        counts = ", ".join(f"{k}={v}" for k, v in vals.items() if k != "seconds")
        table.add_row(stage, f"{vals['seconds']:.2f}", counts)
    out.print(table)
    rows = Table(title="rows per table")
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name, n in result["counts"].items():
        rows.add_row(name, str(n))
    out.print(rows)


def print_quarantine(index: str, result: dict[str, Any], config_path: Path | None, set_: list[str] | None) -> None:
    """What the published snapshot quarantined, with the reasons (``tasks.query.inspect.quarantine_lines``)."""
    from tasks.query.inspect import quarantine_lines
    from tasks.store.catalog import Catalog

    cat = Catalog(index, create=False, storage=config(config_path, set_).storage)
    for line in quarantine_lines(cat, cat.require_snapshot(result["version"])):
        out.print(line, markup=False, highlight=False)
