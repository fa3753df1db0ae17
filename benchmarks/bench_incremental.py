"""Incremental refresh vs full rebuild on MuSiQue (prints figures; not a test).

Builds an index on 80 % of the corpus, then adds the remaining 20 % with `update` in one step and,
on a copy, in four steps; compares with a full build on 100 %: extraction and summarisation
operations (chunks extracted; summaries and reports written — LLM calls on the LLM path), wall
time, and `strata eval` recall / answer-in-context of the final indexes.

    .venv/bin/python benchmarks/bench_incremental.py [--dataset DIR] [--modes hi naive] [--method hirag|hygrag]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()
from flows.pipeline import build_index, update_index  # noqa: E402
from schemas.config import load_config  # noqa: E402
from tasks.store.catalog import Catalog
from tasks.index.embed import get_embedder  # noqa: E402
from tasks.query.evaluate import evaluate, load_queries  # noqa: E402
from tasks.retrieval.view import IndexView


def ops_full(res) -> int:
    s = res.stages
    return s["extract"]["chunks"] + s["hierarchy"]["summary_entities"] + s["reports"]["reports"]


def ops_update(res) -> int:
    s = res.stages
    return s["extract"]["chunks"] + s["attach"]["summary_operations"] + s["reports"]["reports_rewritten"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(REPO.parent / "shared" / "datasets" / "musique"))
    ap.add_argument("--modes", nargs="+", help="default: the method's first mode and naive")
    ap.add_argument("--method", default="hirag", help="index.method of every index built")
    args = ap.parse_args()
    from tasks.methods.registry import index_modes

    args.modes = args.modes or [index_modes(args.method)[0], "naive"]
    dataset = Path(args.dataset)
    lines = (dataset / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    cut = int(len(lines) * 0.8)
    parts = [lines[cut + i * (len(lines) - cut) // 4: cut + (i + 1) * (len(lines) - cut) // 4] for i in range(4)]
    cfg = load_config(overrides={"index": {"method": args.method}})
    queries = load_queries(dataset)
    emb = get_embedder(cfg.embedding)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus"
        corpus.mkdir()
        (corpus / "base.jsonl").write_text("\n".join(lines[:cut]) + "\n")
        t0 = time.perf_counter()
        build_index(str(corpus), Catalog(tmp / "inc1"), cfg)
        t_base = time.perf_counter() - t0
        shutil.copytree(tmp / "inc1", tmp / "inc4")
        # one step: the remaining 20 %
        (corpus / "delta.jsonl").write_text("\n".join(sum(parts, [])) + "\n")
        t0 = time.perf_counter()
        one = update_index(str(corpus), Catalog(tmp / "inc1"), cfg)
        t_one = time.perf_counter() - t0
        # four steps of 5 % on the copy of the base index (same corpus root, delta split in four files)
        (corpus / "delta.jsonl").unlink()
        t_four, four_ops = 0.0, 0
        for i, part in enumerate(parts):
            (corpus / f"delta-{i}.jsonl").write_text("\n".join(part) + "\n")
            t0 = time.perf_counter()
            step = update_index(str(corpus), Catalog(tmp / "inc4"), cfg)
            t_four += time.perf_counter() - t0
            four_ops += ops_update(step)
        t0 = time.perf_counter()
        full = build_index(str(corpus), Catalog(tmp / "full"), cfg)
        t_full = time.perf_counter() - t0
        results = {}
        for name in ("full", "inc1", "inc4"):
            view = IndexView.load(Catalog(tmp / name))
            summary, _ = evaluate(view, emb.embed, queries, args.modes, cfg.retrieval)
            results[name] = {r.mode: r for r in summary}
        print(f"corpus: {len(lines)} passages; base build on {cut} ({t_base:.0f} s)")
        print(f"{'run':<22}{'wall s':>8}{'wall/full':>11}{'ops':>8}{'ops/full':>10}")
        print(f"{'full build 100%':<22}{t_full:>8.1f}{1:>11.2f}{ops_full(full):>8}{1:>10.2f}")
        print(f"{'update 20% (1 step)':<22}{t_one:>8.1f}{t_one / t_full:>11.2f}{ops_update(one):>8}{ops_update(one) / ops_full(full):>10.2f}")
        print(f"{'update 20% (4 steps)':<22}{t_four:>8.1f}{t_four / t_full:>11.2f}{four_ops:>8}{four_ops / ops_full(full):>10.2f}")
        print(f"\n{'index':<8}" + "".join(f"{m + ' recall':>14}{m + ' answer':>14}" for m in args.modes))
        for name, res in results.items():
            print(f"{name:<8}" + "".join(f"{res[m].passage_recall:>14.3f}{res[m].answer_in_context:>14.3f}" for m in args.modes))
        for name in ("inc1", "inc4"):
            diffs = ", ".join(f"{m} recall {100 * (results[name][m].passage_recall - results['full'][m].passage_recall):+.1f} pt"
                              for m in args.modes)
            print(f"{name} vs full: {diffs}")
        print("\nseconds per stage")
        for name, res in (("full build", full), ("update 1 step", one)):
            print(f"  {name:<14}" + ", ".join(f"{k} {v['seconds']:.1f}" for k, v in res.stages.items()))
        print(json.dumps({"t_full": t_full, "t_one": t_one, "t_four": t_four, "drift": one.stages["publish"]["drift"]}))


if __name__ == "__main__":
    main()
