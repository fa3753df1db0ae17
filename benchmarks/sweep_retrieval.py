"""The retrieval parameter sweep behind the defaults, printed as figures (not a test).

Parameters are chosen on a subset and confirmed on the full set, never per question: each row
changes one setting of the graph ranker (or the sources' budget share) from its default and
reports whole-passage recall of ``ppr`` and ``hi`` at 1,000 and 4,000 tokens, next to ``naive``.

    .venv/bin/python benchmarks/sweep_retrieval.py --index ./mq-sub-index --dataset ../shared/datasets/musique/subset100

The index is the one ``strata eval --dataset DIR --index DIR --build`` builds (from a shuffled copy of
``corpus.jsonl`` if you want to be sure file order cannot matter).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()
from schemas.config import load_config  # noqa: E402
from tasks.store.catalog import Catalog
from tasks.index.embed import get_embedder  # noqa: E402
from tasks.query.evaluate import load_queries, passage_recall, retrieved_passages  # noqa: E402
from tasks.retrieval.view import load_view
from tasks.query.retrieve import retrieve

GRID: list[dict] = [
    {},
    {"ppr_prior_weight": 0.01}, {"ppr_prior_weight": 0.2}, {"ppr_prior_weight": 1.0},
    {"ppr_chain_chunks": 0}, {"ppr_chain_chunks": 3}, {"ppr_chain_chunks": 10},
    {"ppr_vector_seeds": 0}, {"ppr_vector_seeds": 10}, {"ppr_vector_threshold": 0.3}, {"ppr_vector_threshold": 0.5},
    {"ppr_relation_share": 0.0}, {"ppr_relation_share": 0.6},
    {"ppr_max_df": 0.01}, {"ppr_max_df": 0.2},
    {"ppr_damping": 0.3}, {"ppr_damping": 0.7},
    {"safety_top": 0},
    {"share_chunks": 0.8}, {"share_chunks": 0.9},
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--budgets", type=int, nargs="+", default=[1000, 4000])
    args = ap.parse_args()
    cfg = load_config()
    view = load_view(Catalog(args.index))
    queries = [q for q in load_queries(Path(args.dataset)) if q["supporting_passage_ids"]]
    vecs = get_embedder(cfg.embedding).embed([q["question"] for q in queries])

    def recall(mode: str, rcfg) -> float:
        return float(np.mean([passage_recall(q["supporting_passage_ids"],
                                             retrieved_passages(retrieve(view, q["question"], v, mode, rcfg), view))
                              for q, v in zip(queries, vecs)]))

    heads = "".join(f"{m}@{b:<7}" for b in args.budgets for m in ("naive", "ppr", "hi"))
    print(f"{len(queries)} questions, {len(view.chunk_ids)} chunks\n{'setting':34s}{heads}")
    for change in GRID:
        row = ""
        for b in args.budgets:
            rcfg = cfg.retrieval.model_copy(update={"token_budget": b, **change})
            row += "".join(f"{recall(m, rcfg):<{len(m) + 8}.3f}" for m in ("naive", "ppr", "hi"))
        print(f"{json.dumps(change) if change else 'defaults':34s}{row}", flush=True)


if __name__ == "__main__":
    main()
