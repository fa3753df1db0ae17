"""``strata eval``: each retrieval mode's recall on a QA dataset, paired against ``naive``, written as results.json,
per_query.csv and a chart per budget."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from flows.cli.common import ConfigOpt, SetOpt, command, config, console, out, overrides
from tasks.errors import IndexNotFound, NotFoundError, UsageError


@command(name="eval")
def eval_(
    dataset: Path = typer.Option(..., "--dataset", "-d", help="Folder with corpus.jsonl and queries.jsonl."),
    index: str = typer.Option(
        ...,
        "--index",
        "-i",
        help="An existing index: a folder or an s3:// URI (never created by this command, unless --build).",
    ),
    build: bool = typer.Option(
        False, "--build", help="Where --index holds no index yet, build it first from the dataset's corpus.jsonl."
    ),
    modes: Optional[list[str]] = typer.Option(
        None, "--modes", "-m", help="Modes to compare, repeatable (default: all)."
    ),
    budgets: Optional[list[int]] = typer.Option(
        None, "--budgets", "-b", help="Context token budgets, repeatable (default: retrieval.token_budget)."
    ),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Where to write results (default: <index>/eval)."),
    limit: Optional[int] = typer.Option(None, help="Only the first N questions."),
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Context recall of each retrieval mode on a QA dataset (an index missing at --index: exit 3, or built from the
    dataset's corpus.jsonl with --build).

    Per budget and mode: supporting-passage recall (whole passages only), its paired difference to
    naive with a bootstrap 95 % interval and wins/losses, recall@2/5/10 of the ranking, answer-in-context
    rate (the gold answer in the context, and in the offline answer's sentences), mean context tokens and
    retrieval latency p50/p95; with an answer model (llm.model or llm.answers.model), exact match and token F1 of
    its answers (SQuAD normalisation) with F1's paired interval against naive; writes results.json,
    per_query.csv and one bar chart per budget."""
    from tasks.query.evaluate import evaluate, load_queries
    from tasks.query.reader import check_mode, check_modes, open_reader

    check_modes(modes or [])
    small = [b for b in budgets or [] if b < 100]
    if small:
        raise UsageError(f"token budget(s) {small} too small: at least 100 tokens")
    cfg = config(config_path, set_)
    queries = load_queries(dataset)[:limit]
    if build and _published(index, cfg) is None:
        _build_from_dataset(dataset, index, config_path, set_)
    reader = open_reader(index, cfg, warm=False, alone=True)
    for m in modes or []:
        check_mode(reader.view.method, m)
    modes = modes or list(reader.modes)
    budgets = list(dict.fromkeys(budgets or [cfg.retrieval.token_budget]))
    results, rows = evaluate(reader.view, reader.embedder.embed, queries, modes, cfg.retrieval, budgets, reader.client)
    cat = reader.catalog
    target = out_dir or (Path(cat.root) / "eval" if cat.root else Path("eval"))
    by_budget = {b: [r for r in results if r.token_budget == b] for b in budgets}
    summary = _write_eval(target, dataset, cat.uri, reader.view.version, len(queries), by_budget, rows)
    if as_json:
        out.print_json(json.dumps(summary, default=str))
        return
    for b, rs in by_budget.items():
        out.print(_eval_table(dataset.name, len(queries), b, rs, reader.client is not None))
    out.print(f"results: {summary['files']['results']}  plots: {', '.join(summary['files']['plots'])}")


def _build_from_dataset(dataset: Path, index: str, config_path: Path | None, set_: list[str] | None) -> None:
    """``eval --build``: the index built from the dataset's ``corpus.jsonl`` (not there: ``NotFoundError``)."""
    from flows.index_flow import run_flow

    corpus = dataset / "corpus.jsonl"
    if not corpus.is_file():
        raise NotFoundError(
            f"--build: no index at {index}, and {corpus} is not there to build one from (index the corpus the "
            f"questions are about first: strata index CORPUS --index {index})"
        )
    console.print(f"--build: no index at {index}, building it from {corpus}")
    run_flow("index_flow", str(corpus), index, str(config_path) if config_path else None, overrides(set_))


def _write_eval(
    target: Path,
    dataset: Path,
    index_uri: str,
    version: int,
    n_queries: int,
    by_budget: dict[int, list[Any]],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """``results.json`` (each budget's modes, ``by_budget``; the first budget's also at the top level, as before
    budgets were many), ``per_query.csv`` and a bar chart per budget in ``target``; returns the summary with their
    paths."""
    import csv
    import dataclasses

    from tasks.query.evaluate import plot_results

    target.mkdir(parents=True, exist_ok=True)
    per_budget = [{"token_budget": b, "modes": [dataclasses.asdict(r) for r in rs]} for b, rs in by_budget.items()]
    summary = {
        "dataset": str(dataset),
        "index": index_uri,
        "version": version,
        "n_queries": n_queries,
        **per_budget[0],
        "budgets": per_budget,
    }
    (target / "results.json").write_text(json.dumps(summary, indent=2))
    with (target / "per_query.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["mode", "token_budget"])
        writer.writeheader()
        writer.writerows(rows)
    plots = [
        plot_results(rs, target / f"recall-{b}.png", f"{dataset.name}: {n_queries} questions, v{version}, budget {b}")
        for b, rs in by_budget.items()
    ]
    summary["files"] = {
        "results": str(target / "results.json"),
        "per_query": str(target / "per_query.csv"),
        "plots": [str(p) for p in plots],
    }
    return summary


def _eval_table(name: str, n: int, budget: int, results: list[Any], generated: bool = False) -> Table:
    cols = [
        "mode",
        "recall",
        "Δ naive [95% CI]",
        "W/L",
        "R@2",
        "R@5",
        "R@10",
        "answer",
        "offline",
        *(["EM", "F1", "F1 Δ naive [95% CI]"] if generated else []),
        "tokens",
        "p50 ms",
        "p95 ms",
    ]
    t = Table(
        title=f"{name}: {n} questions, budget {budget} tokens (recall: whole supporting passages in the context; "
        "answer: gold answer in the context; offline: in the offline answer's sentences"
        + ("; EM / F1: the answer model's answers" if generated else "")
        + ")"
    )
    for col in cols:
        t.add_column(col, justify="right" if col != "mode" else "left", no_wrap=True)

    def share(x: float) -> str:  # NaN: no question of the dataset measures it (no supporting passages, no answer)
        return "—" if math.isnan(x) else f"{x:.3f}"

    def interval(v: dict[str, Any] | None) -> str:
        return f"{v['mean_diff']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]" if v else "—"

    for r in results:
        v = r.vs_naive if r.vs_naive and not math.isnan(r.vs_naive["mean_diff"]) else None
        f = r.f1_vs_naive if r.f1_vs_naive and not math.isnan(r.f1_vs_naive["mean_diff"]) else None
        t.add_row(
            r.mode,
            share(r.passage_recall),
            interval(v),
            f"{v['wins']}/{v['losses']}" if v else "—",
            share(r.recall_at_2),
            share(r.recall_at_5),
            share(r.recall_at_10),
            share(r.answer_in_context),
            share(r.answer_in_extractive),
            *([share(r.exact_match), share(r.f1), interval(f)] if generated else []),
            f"{r.mean_context_tokens:.0f}",
            f"{r.latency_p50_ms:.1f}",
            f"{r.latency_p95_ms:.1f}",
        )
    return t


def _published(index: str, cfg) -> dict | None:
    """The snapshot an index publishes, None where there is no index yet (nothing is created to find out)."""
    from tasks.store.catalog import Catalog

    try:
        return Catalog(index, storage=cfg.storage, create=False).snapshot()
    except IndexNotFound:
        return None
