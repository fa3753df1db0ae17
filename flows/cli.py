"""The ``strata`` command line: build, inspect, validate and export a hierarchical graph-RAG index.

Every command that writes goes through a Prefect flow; reads resolve one published snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.env import apply_offline_defaults
from schemas.config import ConfigError, default_toml, load_config, parse_overrides
from schemas.tables import ALL_TABLES, SNAPSHOT_TABLES

app = typer.Typer(
    name="strata",
    help=(
        "Strata builds and serves a hierarchical knowledge-graph index (HiRAG) for graph RAG.\n\n"
        "Typical use:\n\n"
        "  strata init                      # write a commented strata.toml\n\n"
        "  strata index data/ --index ./index   # full build, offline by default\n\n"
        "  strata inspect --index ./index       # what is in the published snapshot\n\n"
        "  strata export --index ./index --format parquet --out ./export"
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
out = Console()

IndexOpt = typer.Option(..., "--index", "-i", help="Index location: a folder (created if missing) or an s3:// URI.")
ConfigOpt = typer.Option(None, "--config", "-c", help="strata.toml to use (default: $STRATA_CONFIG or built-in defaults).")
SetOpt = typer.Option(None, "--set", help="Override one setting, e.g. --set chunking.size=600 (repeatable).")


def _overrides(pairs: list[str] | None) -> dict[str, Any]:
    data = parse_overrides(pairs or [])
    key = data.get("llm", {}).pop("api_key", None)
    if key is not None:  # never a flow parameter (Prefect records those): hand it over by environment
        os.environ["STRATA_LLM__API_KEY"] = str(key)
    return data


class RichReporter:
    """Progress bars per stage on stderr."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.ids: dict[str, Any] = {}

    def start(self, stage: str, total: int | None) -> None:
        self.ids[stage] = self.progress.add_task(stage, total=total)

    def advance(self, stage: str, n: int = 1) -> None:
        if stage in self.ids:
            self.progress.advance(self.ids[stage], n)

    def finish(self, stage: str, summary: str = "") -> None:
        if stage in self.ids:
            tid = self.ids[stage]
            task = self.progress.tasks[[t.id for t in self.progress.tasks].index(tid)]
            self.progress.update(tid, total=task.total or max(task.completed, 1), completed=task.total or max(task.completed, 1),
                                 description=f"{stage}: {summary}" if summary else stage)


def _fail(exc: BaseException, code: int = 1) -> None:
    console.print(f"[bold red]error:[/] {exc}")
    raise typer.Exit(code)


@app.command()
def init(path: Path = typer.Argument(Path("strata.toml"), help="Where to write the config."),
         force: bool = typer.Option(False, "--force", help="Overwrite an existing file.")) -> None:
    """Write a commented strata.toml with every setting at its default."""
    if path.exists() and not force:
        _fail(FileExistsError(f"{path} exists (use --force to overwrite)"))
    path.write_text(default_toml(), encoding="utf-8")
    console.print(f"wrote {path}")


@app.command()
def index(
    corpus: Path = typer.Argument(..., help="A folder of .txt/.md/.jsonl/.parquet files, or one such file."),
    index: str = IndexOpt,
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    lock_timeout: float = typer.Option(0.0, help="Seconds to wait if another run is writing this index."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Full build: ingest, chunk, extract (Dask), merge, embed, validate and publish one snapshot."""
    result, seconds = _run_writer("index_flow", corpus, index, config, set_, quiet, lock_timeout)
    _print_summary(result, seconds)


@contextlib.contextmanager
def _progress(quiet: bool):
    """Progress bars per stage on the console (a log line per stage with ``--quiet``)."""
    from tasks.progress import LogReporter, use_reporter

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=quiet)
    with progress, use_reporter(LogReporter() if quiet else RichReporter(progress)):
        yield


def _run_writer(flow: str, corpus: Path, index: str, config, set_, quiet: bool, *args: Any) -> tuple[dict[str, Any], float]:
    """Validate the config and corpus first (exit 2), then run a writing flow with progress bars (exit 1 on failure)."""
    import flows.index_flow as index_flows

    try:
        load_config(config, _overrides(set_))  # fail fast on a bad config, before Prefect starts
    except ConfigError as exc:
        _fail(exc, 2)
    if not corpus.exists():
        _fail(FileNotFoundError(f"corpus not found: {corpus}"), 2)
    started = time.perf_counter()
    try:
        with _progress(quiet):
            result = getattr(index_flows, flow)(str(corpus), index, str(config) if config else None, _overrides(set_), *args)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    return result, time.perf_counter() - started


@app.command()
def update(
    corpus: Path = typer.Argument(..., help="The corpus root to refresh from (documents of other roots are left alone)."),
    index: str = IndexOpt,
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    full: bool = typer.Option(False, "--full", help="Rebuild everything instead of applying the delta."),
    replace_root: Optional[str] = typer.Option(
        None, "--replace-root", help="An indexed corpus root that CORPUS is the new location of (a moved mount, a new "
        "export folder): diff against its documents instead of adding CORPUS as a new root. Remembered afterwards."),
    lock_timeout: float = typer.Option(0.0, help="Seconds to wait if another run is writing this index."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Incremental refresh: new, changed and deleted documents (by content hash) since the last snapshot.

    New entities attach to the most similar summary nodes (HyGRAG), only the touched ancestors, communities
    and reports are refreshed, and one new snapshot is published. Nothing changed means nothing published."""
    result, seconds = _run_writer("refresh_flow", corpus, index, config, set_, quiet, lock_timeout, full, replace_root)
    diff = result["stages"].get("diff", {})
    if diff.get("new_root"):
        out.print(f"new corpus root: {diff.get('new', 0)} documents of {corpus} added next to the index's other roots "
                  "(if it is the new location of an indexed root, run again with --replace-root THAT_ROOT after "
                  "`strata rollback`)")
    if result["status"] == "nothing-to-do":
        out.print(f"nothing changed under {corpus}: snapshot v{result['version']} stays published, nothing written")
        return
    _print_summary(result, seconds)


def date_partitions(pattern: str, start: str, end: str) -> list[str]:
    """Folders for every day from ``start`` to ``end`` (inclusive): ``pattern`` is formatted with ``date``."""
    import datetime as dt

    day, last = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    if last < day:
        raise ValueError(f"--to {end} is before --from {start}")
    out = []
    while day <= last:
        out.append(pattern.format(date=day))
        day += dt.timedelta(days=1)
    return out


@app.command()
def backfill(
    partitions: Optional[list[Path]] = typer.Argument(None, help="Corpus folders, applied in the order given."),
    index: str = IndexOpt,
    date_from: Optional[str] = typer.Option(None, "--from", help="First day (YYYY-MM-DD) of a date range."),
    date_to: Optional[str] = typer.Option(None, "--to", help="Last day (YYYY-MM-DD) of a date range."),
    pattern: str = typer.Option("{date:%Y-%m-%d}", help="Folder of a day, e.g. 'corpus/{date:%Y/%m/%d}'."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    lock_timeout: float = typer.Option(0.0, help="Seconds to wait for another writer per partition."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Apply partitions in order, each as an incremental update of its own folder (resumable).

    Partitions are folders given as arguments, or days from --from to --to mapped to folders by --pattern.
    Finished partitions have nothing to do on a re-run; a failed one is retried."""
    try:
        parts = [str(p) for p in partitions or []]
        if date_from or date_to:
            if not (date_from and date_to):
                raise ConfigError("--from and --to go together")
            parts += date_partitions(pattern, date_from, date_to)
        if not parts:
            raise ConfigError("give partition folders, or --from/--to with --pattern")
        missing = [p for p in parts if not Path(p).exists()]
        if missing:
            raise ConfigError(f"partition folder(s) not found: {', '.join(missing)}")
        load_config(config, _overrides(set_))
    except (ConfigError, ValueError) as exc:
        _fail(exc, 2)
    from flows.index_flow import backfill_flow

    try:
        with _progress(quiet):
            results = backfill_flow(parts, index, str(config) if config else None, _overrides(set_), lock_timeout)
    except Exception as exc:  # noqa: BLE001
        _fail(Exception(f"{exc}\nre-run the same command to resume: finished partitions are skipped"))
    t = Table(title="backfill")
    for col in ("partition", "status", "snapshot"):
        t.add_column(col)
    for r in results:
        t.add_row(r["partition"], r["status"], str(r["version"]))
    out.print(t)


def _print_summary(result: dict[str, Any], seconds: float) -> None:
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


def inspect_data(index: str, as_of: int | None, runs: int) -> dict[str, Any]:
    import statistics

    from tasks.catalog import Catalog, snapshot_note

    cat = Catalog(index)
    snap = cat.require_snapshot(as_of)
    layers = cat.read("layers", snap=snap).to_pylist()
    kinds = cat.read("relations", snap=snap, columns=["kind"]).column("kind").value_counts().to_pylist()
    comms = cat.read("communities", snap=snap, columns=["level", "size"])
    sizes: dict[int, list[int]] = {}
    for level, size in zip(comms.column("level").to_pylist(), comms.column("size").to_pylist()):
        sizes.setdefault(level, []).append(size)
    counted = {k["values"] for k in kinds}
    return {
        "index": cat.uri,
        "version": snap["version"],
        "method": snapshot_note(snap).get("method", "hirag"),
        "created_at": snap["created_at"].isoformat(),
        "kind": snap["kind"],
        "run_id": snap["run_id"],
        "vector_dim": snap["dim"],
        "tables": cat.counts(snap),
        "problems": cat.verify(snap),
        "layers": [
            {k: l[k] for k in ("layer", "n_entities", "n_clusters", "cluster_sparsity", "change_rate", "stop_reason")}
            for l in sorted(layers, key=lambda r: r["layer"])
        ],
        "relations_by_kind": {k["values"]: k["counts"] for k in sorted(kinds, key=lambda k: k["values"])},
        "nodes": node_counts(cat, snap, with_links=bool(counted & {"chnsw", "chnsw_down"})),
        "communities": [{"level": level, "count": len(v), "min_size": min(v), "median_size": statistics.median(v),
                         "max_size": max(v)} for level, v in sorted(sizes.items())],
        "runs": [
            {
                "id": r["id"], "flow": r["flow"], "status": r["status"],
                "started_at": r["started_at"].isoformat() if r["started_at"] else None,
                "ended_at": r["ended_at"].isoformat() if r["ended_at"] else None,
                "snapshot_version": r["snapshot_version"], "error": r["error"],
            }
            for r in cat.runs(limit=runs)
        ],
        "versions": [{"version": s["version"], "created_at": s["created_at"].isoformat(), "kind": s["kind"]} for s in cat.snapshots()],
    }


def node_counts(cat, snap: dict[str, Any], with_links: bool) -> list[dict[str, int]]:
    """Entities per layer and, for an ArchRAG index, its C-HNSW links per layer: ``chnsw`` (within the layer, counted
    at the node they leave) and ``chnsw_down`` (from the layer to the one below)."""
    import polars as pl

    ents = pl.from_arrow(cat.read("entities", snap=snap, columns=["id", "layer"]))
    per = ents.group_by("layer").agg(nodes=pl.len())
    if with_links:
        links = (pl.from_arrow(cat.read("relations", snap=snap, columns=["source_id", "kind"]))
                 .filter(pl.col("kind").is_in(["chnsw", "chnsw_down"]))
                 .join(ents.rename({"id": "source_id"}), on="source_id")
                 .group_by("layer").agg(chnsw=(pl.col("kind") == "chnsw").sum(), chnsw_down=(pl.col("kind") == "chnsw_down").sum()))
        per = per.join(links, on="layer", how="left").fill_null(0)
    return per.sort("layer").to_dicts()


@app.command()
def inspect(
    index: str = IndexOpt,
    as_of: Optional[int] = typer.Option(None, "--as-of", help="Read this snapshot version instead of the latest."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    runs: int = typer.Option(5, help="How many recent runs to show."),
    versions: bool = typer.Option(False, "--versions", help="List every published snapshot."),
) -> None:
    """Row counts of the published snapshot, its version, the layer statistics and the last runs."""
    try:
        data = inspect_data(index, as_of, runs)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    if as_json:
        out.print_json(json.dumps(data, default=str))
        raise typer.Exit(1 if data["problems"] else 0)
    out.print(f"[bold]{data['index']}[/]  snapshot v{data['version']} ({data['kind']}, {data['created_at']}), "
              f"method {data['method']}")
    for problem in data["problems"]:
        out.print(f"[bold red]damaged:[/] {problem}", markup=True, highlight=False)
    t = Table(title="tables")
    t.add_column("table")
    t.add_column("rows", justify="right")
    for k, v in data["tables"].items():
        t.add_row(k, str(v))
    out.print(t)
    if data["layers"]:
        lt = Table(title="hierarchy layers")
        for col in ("layer", "n_entities", "n_clusters", "cluster_sparsity", "change_rate", "stop_reason"):
            lt.add_column(col)
        for l in data["layers"]:
            lt.add_row(*[("" if l[c] is None else f"{l[c]:.4f}" if isinstance(l[c], float) else str(l[c])) for c in
                         ("layer", "n_entities", "n_clusters", "cluster_sparsity", "change_rate", "stop_reason")])
        out.print(lt)
    if any("chnsw" in n for n in data["nodes"]):
        nt = Table(title="C-HNSW links per layer")
        for col in ("layer", "nodes", "chnsw", "chnsw_down"):
            nt.add_column(col, justify="right")
        for n in data["nodes"]:
            nt.add_row(*(str(n[k]) for k in ("layer", "nodes", "chnsw", "chnsw_down")))
        out.print(nt)
    if data["communities"]:
        ct = Table(title="communities per level")
        for col in ("level", "count", "min_size", "median_size", "max_size"):
            ct.add_column(col, justify="right")
        for c in data["communities"]:
            ct.add_row(*(str(c[k]) for k in ("level", "count", "min_size", "median_size", "max_size")))
        out.print(ct)
    if versions:
        vt = Table(title="snapshots")
        for col in ("version", "created_at", "kind"):
            vt.add_column(col)
        for v in data["versions"]:
            vt.add_row(str(v["version"]), v["created_at"], v["kind"])
        out.print(vt)
    rt = Table(title="recent runs")
    for col in ("started_at", "flow", "status", "snapshot", "error"):
        rt.add_column(col)
    for r in data["runs"]:
        rt.add_row(r["started_at"] or "", r["flow"], r["status"], str(r["snapshot_version"] or ""), (r["error"] or "")[:80])
    out.print(rt)
    if data["problems"]:
        raise typer.Exit(1)


@app.command()
def validate(
    index: str = IndexOpt,
    as_of: Optional[int] = typer.Option(None, "--as-of", help="Validate this snapshot version."),
) -> None:
    """Run the expectation suites over a published snapshot (exit 1 when any fails)."""
    from tasks.catalog import Catalog
    from tasks.validate import validate_tables

    try:
        cat = Catalog(index)
        snap = cat.require_snapshot(as_of)
        tables = {name: cat.read(name, snap=snap) for name in SNAPSHOT_TABLES}
        report = validate_tables(tables, snap["dim"])
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    for name, n in report.checked.items():
        out.print(f"{name}: {n} expectations")
    if report.success:
        out.print(f"[green]snapshot v{snap['version']}: all expectations passed[/]")
        return
    for f in report.failures:
        out.print(f"[red]FAIL[/] {f['table']}: {f['expectation']}({f['column']}) — {f['unexpected_count']} bad row(s), e.g. {f['sample']}")
    raise typer.Exit(1)


@app.command()
def rollback(
    index: str = IndexOpt,
    to: int = typer.Option(..., "--to", help="The snapshot version to return to (see `strata inspect --versions`)."),
    lock_timeout: float = typer.Option(0.0, help="Seconds to wait if another run is writing this index."),
) -> None:
    """Undo a bad refresh in seconds: publish a new snapshot that pins the tables of an earlier one (nothing rewritten)."""
    from datetime import datetime, timezone

    from tasks.catalog import Catalog
    from tasks.ids import make_id

    try:
        cat = Catalog(index)
        with cat.writer_lock(lock_timeout):
            started = datetime.now(timezone.utc)
            run_id = make_id("run", started.isoformat(), "rollback", to)
            cat.log_run({"id": run_id, "flow": "rollback", "started_at": started, "status": "running",
                         "parameters": json.dumps({"index": cat.uri, "to": to})})
            version = cat.rollback(to, run_id)
            cat.finish_run(run_id, {"status": "published", "ended_at": datetime.now(timezone.utc),
                                    "snapshot_version": version})
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    out.print(f"snapshot v{version} published: the tables of v{to}")


@app.command()
def gc(
    index: str = IndexOpt,
    keep: int = typer.Option(..., "--keep", help="How many of the newest snapshots to keep (at least 1)."),
    lock_timeout: float = typer.Option(0.0, help="Seconds to wait if another run is writing this index."),
) -> None:
    """Drop old snapshots and the table versions no kept snapshot needs (never a version a kept snapshot pins)."""
    from tasks.catalog import Catalog

    if keep < 1:
        _fail(ValueError("--keep must be at least 1: the latest snapshot is always kept"), 2)
    try:
        cat = Catalog(index)
        with cat.writer_lock(lock_timeout):
            done = cat.gc(keep)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    out.print(f"kept snapshots {done['kept']}, dropped {done['dropped'] or 'none'}; table versions removed: "
              f"{sum(done['versions_removed'].values())}")


@app.command()
def export(
    index: str = IndexOpt,
    out_dir: Path = typer.Option(..., "--out", "-o", help="Folder for <table>.parquet files."),
    fmt: str = typer.Option("parquet", "--format", help="Only 'parquet' for now."),
    tables: Optional[list[str]] = typer.Option(None, "--table", help="Export only these tables (repeatable)."),
    as_of: Optional[int] = typer.Option(None, "--as-of", help="Export this snapshot version."),
) -> None:
    """Write every table of a snapshot as <table>.parquet (load them with polars or duckdb)."""
    import pyarrow.parquet as pq

    from tasks.catalog import Catalog

    if fmt != "parquet":
        _fail(ValueError(f"unsupported format {fmt!r}: only 'parquet'"), 2)
    names = tables or list(ALL_TABLES)
    unknown = [n for n in names if n not in ALL_TABLES]
    if unknown:
        _fail(ValueError(f"unknown table(s) {unknown}; known: {', '.join(ALL_TABLES)}"), 2)
    try:
        cat = Catalog(index)
        snap = cat.require_snapshot(as_of)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in names:
            data = cat.read(name, snap=snap)
            pq.write_table(data, out_dir / f"{name}.parquet")
            out.print(f"{name}: {data.num_rows} rows -> {out_dir / (name + '.parquet')}")
    except Exception as exc:  # noqa: BLE001
        _fail(exc)


@app.command()
def query(
    question: str = typer.Argument(..., help="The question to answer."),
    index: str = IndexOpt,
    mode: Optional[str] = typer.Option(
        None, help="Default: the index method's first mode. hirag indexes: hi (three levels + graph-ranked sources) | "
                   "hi-nobridge | flat; hygrag indexes: hygrag (communities, entities and relation triples + graph-ranked "
                   "sources); any index: ppr (graph-ranked sources only) | hybrid (BM25 + dense) | naive (dense); all at "
                   "the same token budget."),
    as_of: Optional[int] = typer.Option(None, "--as-of", help="Query this snapshot version."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Retrieve local entities, community reports and bridge paths for a question, then answer it.

    Without an LLM configured the answer is extractive: the context sentences that best match the question."""
    from tasks.catalog import Catalog
    from tasks.embed import check_dimension, question_embedder
    from tasks.answer import answer as make_answer
    from tasks.llm_client import LiteLLMClient
    from tasks.retrieve import MODES, index_modes, load_view, remember_view, retrieve

    if not question.strip():
        _fail(ValueError("the question is empty: ask something, e.g. strata query \"Who employed Bob Cratchit?\""), 2)
    if mode is not None and mode not in MODES:
        _fail(ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}"), 2)
    try:
        cfg = load_config(config, _overrides(set_))
        cat = Catalog(index)
        embedder = question_embedder(cfg.embedding, cfg.llm)
        warm = _warm_up(embedder)  # the model and token tables load while the snapshot is read
        view = load_view(cat, as_of)
        mode = mode or index_modes(view.method)[0]
        warm.join()
        check_dimension(embedder, view.dim)
        t0 = time.perf_counter()
        ctx = retrieve(view, question, embedder.embed([question])[0], mode, cfg.retrieval)
        ms = (time.perf_counter() - t0) * 1000
        client = LiteLLMClient(cfg.llm, cat.cache_dir) if cfg.llm.model else None
        answer = make_answer(ctx, client, embedder.embed)
    except ConfigError as exc:
        _fail(exc, 2)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    remember_view(view)  # the next `strata query` on this snapshot starts from it
    data = ctx.as_dict() | {"answer": answer, "retrieval_ms": round(ms, 1)}
    if as_json:
        out.print_json(json.dumps(data, default=str))
        return
    out.print(f"[bold]Q:[/] {question}   [dim](mode {mode}, snapshot v{ctx.version}, {ms:.0f} ms, "
              f"{sum(ctx.tokens.values())} context tokens)[/]")
    if ctx.message:
        out.print(f"[yellow]{ctx.message}[/]")
    sections = [("Local: entities", ctx.entities), ("Global: community reports", ctx.communities),
                ("Bridge: reasoning-path triples", ctx.bridge), ("Sources: chunks", ctx.chunks)]
    if ctx.seeds:
        out.print(f"[dim]graph seeds — named in the question: {', '.join(ctx.seeds.get('named', [])) or '(none)'}; "
                  f"nearest to it: {', '.join(ctx.seeds.get('similar', [])) or '(none)'}; "
                  f"chained from the best sentences: {', '.join(ctx.seeds.get('chained', [])) or '(none)'}[/]")
    for title, items in sections:
        if not items:
            continue
        out.rule(f"{title} ({len(items)})")
        for it in items:
            out.print(it["text"], markup=False, highlight=False)
    if answer.get("note"):
        out.print(f"[yellow]{answer['note']}[/]")
    out.rule("Answer (extractive: the best-matching context sentences, no LLM)" if answer["kind"] == "extractive"
             else f"Answer ({cfg.llm.model})")
    out.print(answer["text"] or "(no sentence of the context matches the question)", markup=False, highlight=False)


def _warm_up(embedder) -> threading.Thread:
    """A thread that loads what a query needs besides its snapshot: the embedding model's session and tokenizer
    (``prepare``, where the embedder has one) and the token-count tables (native code, which runs beside the
    snapshot's unpickling; a cold query is ~0.2 s shorter on two cores)."""
    from tasks.chunk import get_encoding

    def load() -> None:
        with contextlib.suppress(Exception):  # a failure shows again, with its message, where the query embeds
            getattr(embedder, "prepare", lambda: None)()
            get_encoding()

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    return thread


SHELL_HELP = """questions are answered from the published snapshot (a newer one is picked up before each question)
  :mode NAME     retrieval mode (the index's: {modes})
  :budget N      context token budget (at least 100)
  :sources       show or hide the source passages of each answer
  :json          print each answer as the JSON of `strata query --json`, or not
  :help          this text
  :quit          leave (also Ctrl-D)"""


@app.command()
def shell(
    index: str = IndexOpt,
    mode: Optional[str] = typer.Option(None, help="Starting mode (default: the index method's first)."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """An interactive prompt: the snapshot and the embedding model are loaded once, each question is answered in
    well under a second, and a newly published snapshot is picked up without leaving. History in ~/.strata_history."""
    import readline

    from tasks.answer import answer as make_answer
    from tasks.catalog import Catalog
    from tasks.embed import check_dimension, question_embedder
    from tasks.llm_client import LiteLLMClient
    from tasks.retrieve import MODES, index_modes, load_view, retrieve

    if mode is not None and mode not in MODES:
        _fail(ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}"), 2)
    try:
        cfg = load_config(config, _overrides(set_))
        cat = Catalog(index)
        view = load_view(cat)
        modes = index_modes(view.method)
        if mode is not None and mode not in modes:
            raise ConfigError(f"mode {mode!r} is not offered by this {view.method} index; it offers {', '.join(modes)}")
        embedder = question_embedder(cfg.embedding, cfg.llm)
        check_dimension(embedder, view.dim)
        embedder.embed(["warm up"])
        client = LiteLLMClient(cfg.llm, cat.cache_dir) if cfg.llm.model else None
    except ConfigError as exc:
        _fail(exc, 2)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    history = Path.home() / ".strata_history"
    with contextlib.suppress(OSError):
        readline.read_history_file(history)
    state = {"mode": mode or modes[0], "budget": cfg.retrieval.token_budget, "sources": False, "json": False}
    out.print(f"snapshot v{view.version} of {cat.uri} ({view.method}; {len(view.ent_ids)} entities, "
                  f"{len(view.chunk_ids)} chunks), mode {state['mode']}, budget {state['budget']}; :help for commands")
    while True:
        try:
            line = input("strata> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.print()
            break
        if not line:
            continue
        if line.startswith(":"):
            cmd, _, arg = line[1:].partition(" ")
            arg = arg.strip()
            if cmd in ("q", "quit", "exit"):
                break
            elif cmd == "help":
                out.print(SHELL_HELP.format(modes=", ".join(modes)), markup=False, highlight=False)
            elif cmd == "mode" and arg in modes:
                state["mode"] = arg
                out.print(f"mode {arg}")
            elif cmd == "mode":
                console.print(f"[bold red]error:[/] unknown mode {arg!r}; this index offers {', '.join(modes)}")
            elif cmd == "budget" and arg.isdigit() and int(arg) >= 100:
                state["budget"] = int(arg)
                out.print(f"budget {arg} tokens")
            elif cmd == "budget":
                console.print(f"[bold red]error:[/] the budget must be a whole number of at least 100 tokens, not {arg!r}")
            elif cmd in ("sources", "json"):
                state[cmd] = not state[cmd]
                out.print(f"{cmd} {'on' if state[cmd] else 'off'}")
            else:
                console.print(f"[bold red]error:[/] unknown command :{cmd}; :help lists them")
            continue
        latest = cat.snapshot()
        if latest and latest["version"] != view.version:
            view = load_view(cat)
            out.print(f"[dim]snapshot v{view.version} loaded[/]")
        t0 = time.perf_counter()
        ctx = retrieve(view, line, embedder.embed([line])[0], state["mode"],
                       cfg.retrieval.model_copy(update={"token_budget": state["budget"]}))
        result = make_answer(ctx, client, embedder.embed)
        ms = (time.perf_counter() - t0) * 1000
        if state["json"]:
            print(json.dumps(ctx.as_dict() | {"answer": result, "retrieval_ms": round(ms, 1)}, default=str))
            continue
        label = "extractive" if result["kind"] == "extractive" else cfg.llm.model
        out.print(f"[bold]answer[/] [dim]({label}; mode {state['mode']}, snapshot v{ctx.version}, {ms:.0f} ms, "
                      f"{sum(ctx.tokens.values())} context tokens)[/]")
        out.print(result["text"] or ctx.message or "(no sentence of the context matches the question)",
                      markup=False, highlight=False)
        if state["sources"]:
            for c in ctx.chunks:
                out.print(f"  [{c['score']:.3f}] {c['title']}: {c['text'][:160]}", markup=False, highlight=False)
    with contextlib.suppress(OSError):
        readline.write_history_file(history)


@app.command()
def serve(
    index: str = IndexOpt,
    host: Optional[str] = typer.Option(None, help="Interface to bind (default serve.host: 127.0.0.1, this machine only)."),
    port: Optional[int] = typer.Option(None, help="Port (default serve.port: 8000)."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """An HTTP query service over the published snapshot, safe while updates publish new ones.

    POST /query {question, mode?, token_budget?, as_of?} answers as `strata query --json` does; GET /snapshots,
    /index (inspect --json), /healthz, /readyz; OpenAPI at /docs; a query explorer page at /. A newly published
    snapshot is used from the next request on, without a restart; each response names its version. Settings
    under [serve]: max_concurrency (then 503 + Retry-After), max_budget, max_request_bytes, api_key_env (bearer
    token auth)."""
    import uvicorn

    from flows.serve import create_app

    try:
        cfg = load_config(config, _overrides(set_))
        from tasks.catalog import Catalog

        Catalog(index).require_snapshot()
    except ConfigError as exc:
        _fail(exc, 2)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    host, port = host or cfg.serve.host, port or cfg.serve.port
    auth = "bearer token from $" + cfg.serve.api_key_env if cfg.serve.api_key_env and os.environ.get(cfg.serve.api_key_env) else "none"
    console.print(f"serving {index} on http://{host}:{port}  (docs /docs, explorer /, auth: {auth})")
    uvicorn.run(create_app(index, cfg), host=host, port=port, log_level="warning")


@app.command(name="eval")
def eval_(
    dataset: Path = typer.Option(..., "--dataset", "-d", help="Folder with corpus.jsonl and queries.jsonl."),
    index: str = IndexOpt,
    modes: Optional[list[str]] = typer.Option(None, "--modes", "-m", help="Modes to compare, repeatable (default: all)."),
    budgets: Optional[list[int]] = typer.Option(
        None, "--budgets", "-b", help="Context token budgets, repeatable (default: retrieval.token_budget)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write results (default: <index>/eval)."),
    limit: Optional[int] = typer.Option(None, help="Only the first N questions."),
    config: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Context recall of each retrieval mode on a QA dataset; builds the index from its corpus.jsonl if needed.

    Per budget and mode: supporting-passage recall (whole passages only), its paired difference to
    naive with a bootstrap 95 % interval and wins/losses, recall@2/5/10 of the ranking, answer-in-context
    rate (the gold answer in the context, and in the offline answer's sentences), mean context tokens and
    retrieval latency p50/p95; writes results.json, per_query.csv and one bar chart per budget."""
    import csv
    import dataclasses

    from tasks.catalog import Catalog
    from tasks.embed import check_dimension, question_embedder
    from tasks.evaluate import evaluate, load_queries, plot_results
    from tasks.retrieve import MODES, index_modes, load_view

    bad = [m for m in modes or [] if m not in MODES]
    if bad:
        _fail(ValueError(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}"), 2)
    small = [b for b in budgets or [] if b < 100]
    if small:
        _fail(ValueError(f"token budget(s) {small} too small: at least 100 tokens"), 2)
    try:
        cfg = load_config(config, _overrides(set_))
        queries = load_queries(dataset)[:limit]
        cat = Catalog(index)
        if cat.snapshot() is None:
            corpus = dataset / "corpus.jsonl"
            console.print(f"no index at {index}: building it from {corpus}")
            from flows.index_flow import index_flow

            index_flow(str(corpus), index, str(config) if config else None, _overrides(set_))
        view = load_view(cat)
        offered = list(index_modes(view.method))
        if modes and set(modes) - set(offered):
            _fail(ValueError(f"mode(s) {sorted(set(modes) - set(offered))} not offered by this {view.method} index; "
                             f"it offers {', '.join(offered)}"), 2)
        modes = modes or offered
        embedder = question_embedder(cfg.embedding, cfg.llm)
        check_dimension(embedder, view.dim)
        budgets = list(dict.fromkeys(budgets or [cfg.retrieval.token_budget]))
        results, rows = evaluate(view, embedder.embed, queries, modes, cfg.retrieval, budgets)
    except typer.Exit:
        raise
    except ConfigError as exc:
        _fail(exc, 2)
    except Exception as exc:  # noqa: BLE001
        _fail(exc)
    target = out_dir or (Path(cat.root) / "eval" if cat.root else Path("eval"))
    target.mkdir(parents=True, exist_ok=True)
    by_budget = {b: [r for r in results if r.token_budget == b] for b in budgets}
    per_budget = [{"token_budget": b, "modes": [dataclasses.asdict(r) for r in rs]} for b, rs in by_budget.items()]
    summary = {"dataset": str(dataset), "index": cat.uri, "version": view.version, "n_queries": len(queries),
               **per_budget[0], "budgets": per_budget}
    (target / "results.json").write_text(json.dumps(summary, indent=2))
    with (target / "per_query.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["mode", "token_budget"])
        writer.writeheader()
        writer.writerows(rows)
    plots = [plot_results(rs, target / f"recall-{b}.png",
                          f"{dataset.name}: {len(queries)} questions, v{view.version}, budget {b}")
             for b, rs in by_budget.items()]
    summary["files"] = {"results": str(target / "results.json"), "per_query": str(target / "per_query.csv"),
                        "plots": [str(p) for p in plots]}
    if as_json:
        out.print_json(json.dumps(summary, default=str))
        return
    cols = ("mode", "recall", "Δ naive [95% CI]", "W/L", "R@2", "R@5", "R@10", "answer", "offline", "tokens", "p50 ms",
            "p95 ms")
    for b, rs in by_budget.items():
        t = Table(title=f"{dataset.name}: {len(queries)} questions, budget {b} tokens "
                        "(recall: whole supporting passages in the context; answer: gold answer in the context; "
                        "offline: in the offline answer's sentences)")
        for col in cols:
            t.add_column(col, justify="right" if col != "mode" else "left", no_wrap=True)
        for r in rs:
            v = r.vs_naive
            delta = f"{v['mean_diff']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]" if v else "—"
            t.add_row(r.mode, f"{r.passage_recall:.3f}", delta, f"{v['wins']}/{v['losses']}" if v else "—",
                      f"{r.recall_at_2:.3f}", f"{r.recall_at_5:.3f}", f"{r.recall_at_10:.3f}",
                      f"{r.answer_in_context:.3f}", f"{r.answer_in_extractive:.3f}", f"{r.mean_context_tokens:.0f}",
                      f"{r.latency_p50_ms:.1f}", f"{r.latency_p95_ms:.1f}")
        out.print(t)
    out.print(f"results: {target / 'results.json'}  plots: {', '.join(str(p) for p in plots)}")


#: list options that also take several values after one flag (``--budgets 1000 4000``)
MULTI_VALUE_OPTIONS = ("--budgets", "-b", "--modes", "-m")


def spread_multi_values(argv: list[str]) -> list[str]:
    """``--budgets 1000 4000`` -> ``--budgets 1000 --budgets 4000`` (typer repeats the flag per value)."""
    out: list[str] = []
    flag = None
    for arg in argv:
        if arg.startswith("-"):
            flag = arg if arg in MULTI_VALUE_OPTIONS else None
            out.append(arg)
        elif flag and out[-1] != flag:
            out += [flag, arg]
        else:
            out.append(arg)
    return out


def main() -> None:  # console-script entry point
    apply_offline_defaults()
    try:
        app(args=spread_multi_values(sys.argv[1:]))
    except KeyboardInterrupt:
        console.print("interrupted; the previous snapshot is still the published one")
        sys.exit(130)


if __name__ == "__main__":
    main()
