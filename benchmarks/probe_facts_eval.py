"""The seventh ranking probe's pick through `strata eval`'s own scoring (issue 64 item 4; no product change): the
question's 5 most similar extracted sentences seed their bridge entities (a quarter of the walk's restart mass, by
rank) and the passages' cosines get hubness reduction (CSLS: k = 10, a = 0.5, on the dense top 50); that walk decides
the top ``--head`` sources (0: the whole ranking) and the walk as it is orders the rest. Per budget and mode (`hi`,
`ppr`): whole-passage recall, R@5, answer in context and in the offline answer, before -> after, questions won / lost,
and the p50 latency of each (the probe walks twice and embeds nothing at query time: the sentence vectors are made
before the questions).

    .venv/bin/python benchmarks/probe_facts_eval.py --index IDX --dataset DIR --budgets 1000 4000 --head 0 3 5 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()

from probe_ranking import Facts, _neighbour_cosines, fact_personalization, graph_sentences, hubness  # noqa: E402

import tasks.query.retrieve as retrieve_module  # noqa: E402
from schemas.config import load_config  # noqa: E402
from tasks.index.embed import question_embedder  # noqa: E402
from tasks.query.answer import TokenVectors, answer_embedder  # noqa: E402
from tasks.query.evaluate import _run_mode, load_queries  # noqa: E402
from tasks.retrieval import graph_rank  # noqa: E402
from tasks.retrieval.view import load_view  # noqa: E402
from tasks.store.catalog import Catalog  # noqa: E402

#: the subset's pick of ``probe_ranking.py --variants facts``
PICK = Facts(5, 0.25, by_rank=True, bridge=True, csls=(10, 0.5, 50))
KEYS = ("passage_recall", "recall_at_5", "answer_in_context", "answer_in_extractive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--budgets", nargs="+", type=int, default=[1000, 4000])
    ap.add_argument("--head", nargs="+", type=int, default=[0, 5])
    args = ap.parse_args()
    cfg = load_config()
    rcfg = cfg.retrieval
    view = load_view(Catalog(args.index, create=False))
    queries = load_queries(Path(args.dataset))
    embed = question_embedder(cfg.embedding, cfg.llm).embed

    _, sents = graph_sentences(view, rcfg)
    sv = question_embedder(cfg.embedding, cfg.llm, threads=None).embed(sents).astype(np.float32)
    asked = {q["question"]: embed([q["question"]])[0].astype(np.float32) for q in queries}
    chunks = view.chunk_vecs.astype(np.float32)
    csls = hubness(chunks, _neighbour_cosines(chunks), *PICK.csls)
    plain, ranking = graph_rank.personalization, retrieve_module.source_ranking
    seeded = fact_personalization(PICK, sv, asked, plain)

    def probed(head: int):
        def source_ranking(view_, question, dense, ent_scores, how, cfg_):
            base, seeds = ranking(view_, question, dense, ent_scores, how, cfg_)
            if how != "ppr":
                return base, seeds
            graph_rank.personalization = seeded
            try:
                new, _ = ranking(view_, question, csls(asked[question]), ent_scores, how, cfg_)
            finally:
                graph_rank.personalization = plain
            top = new[:head] if head else new
            return top + [j for j in base if j not in top], seeds

        return source_ranking

    sentences = TokenVectors(answer_embedder(), None)
    print(f"{len(sv)} extracted sentences embedded", flush=True)
    for budget in args.budgets:
        bcfg = rcfg.model_copy(update={"token_budget": budget})
        for mode in ("hi", "ppr"):
            before, rows_before = _run_mode(view, embed, queries, mode, bcfg, sentences)
            for head in args.head:
                retrieve_module.source_ranking = probed(head)
                after, rows_after = _run_mode(view, embed, queries, mode, bcfg, sentences)
                retrieve_module.source_ranking = ranking
                cells = []
                for key in KEYS:
                    a = np.array([float(r[key] or 0) for r in rows_before])
                    b = np.array([float(r[key] or 0) for r in rows_after])
                    cells.append(f"{key} {np.nanmean(a):.3f} -> {np.nanmean(b):.3f} ({(b > a).sum()}/{(b < a).sum()})")
                print(
                    f"{budget} {mode} head={head}: "
                    + " | ".join(cells)
                    + f" | p50 {before.latency_p50_ms:.1f} -> {after.latency_p50_ms:.1f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
