"""Offline indexing benchmark (prints figures; not a test).

Indexes a corpus (default: shared/datasets/musique/corpus.jsonl, 1,890 passages) twice, each in a
fresh subprocess with its own empty index and embedding cache:

* direct: the stage functions called in-process (no Prefect, no Dask);
* flow:   the Prefect flow ``strata-index`` with extraction on a local Dask cluster.

Prints per-stage seconds and chunks/s, total wall time, peak RSS, the HiIndex layers, and the
orchestration overhead as the ratio flow / direct.

    .venv/bin/python benchmarks/bench_index.py [--corpus PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO.parent / "shared" / "datasets" / "musique" / "corpus.jsonl"


def child(mode: str, corpus: str, index: str) -> None:
    sys.path.insert(0, str(REPO))
    from flows.env import apply_offline_defaults

    apply_offline_defaults()

    t0 = time.perf_counter()
    if mode == "direct":
        from flows.pipeline import build_index
        from schemas.config import load_config
        from tasks.store.catalog import Catalog

        result = build_index(corpus, Catalog(index), load_config())
        out = {"stages": result.stages, "counts": result.counts, "layers": result.layers}
    else:
        from flows.index_flow import index_flow

        out = index_flow(corpus, index)
        out = {"stages": out["stages"], "counts": out["counts"], "layers": out["layers"]}
    out["wall_s"] = time.perf_counter() - t0
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    out["peak_rss_mb"] = round(self_rss, 1)
    out["peak_rss_children_mb"] = round(child_rss, 1)
    print("RESULT " + json.dumps(out, default=str))


def run(mode: str, corpus: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"strata-bench-{mode}-") as tmp:
        env = dict(os.environ, PREFECT_HOME=str(Path(tmp) / "prefect"))
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--corpus", corpus, "--index", str(Path(tmp) / "index")],
            capture_output=True, text=True, env=env, cwd=REPO,
        )
        outer = time.perf_counter() - t0
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"{mode} run failed:\n{proc.stderr[-4000:]}")
    res = json.loads(line[len("RESULT "):])
    res["process_wall_s"] = outer
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--child", choices=["direct", "flow"])
    ap.add_argument("--index")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.corpus, args.index)
        return
    print(f"corpus: {args.corpus}")
    results = {mode: run(mode, args.corpus) for mode in ("direct", "flow")}
    d, f = results["direct"], results["flow"]
    n_chunks = d["counts"]["chunks"]
    print(f"\nrows: {d['counts']}")
    print(f"\n{'stage':<13}{'direct s':>10}{'chunks/s':>11}{'flow s':>10}{'ratio':>8}")
    for stage, vals in d["stages"].items():
        fs = f["stages"].get(stage, {}).get("seconds", float('nan'))
        rate = n_chunks / vals["seconds"] if vals["seconds"] > 0 else float("inf")
        print(f"{stage:<13}{vals['seconds']:>10.2f}{rate:>11.1f}{fs:>10.2f}{fs / vals['seconds'] if vals['seconds'] else float('nan'):>8.2f}")
    print(f"\n{'total wall (in process)':<28}{d['wall_s']:>9.1f} s direct {f['wall_s']:>9.1f} s flow   ratio {f['wall_s'] / d['wall_s']:.2f}")
    print(f"{'total wall (whole process)':<28}{d['process_wall_s']:>9.1f} s direct {f['process_wall_s']:>9.1f} s flow   ratio {f['process_wall_s'] / d['process_wall_s']:.2f}")
    print(f"{'end-to-end chunks/s':<28}{n_chunks / d['wall_s']:>9.1f}   direct {n_chunks / f['wall_s']:>9.1f}   flow")
    print(f"peak RSS: direct {d['peak_rss_mb']:.0f} MB; flow {f['peak_rss_mb']:.0f} MB (+ largest Dask worker {f['peak_rss_children_mb']:.0f} MB)")
    print("\nHiIndex layers (direct run):")
    for l in d["layers"]:
        cs = "" if l["cluster_sparsity"] is None else f"{l['cluster_sparsity']:.4f}"
        cr = "" if l["change_rate"] is None else f"{l['change_rate']:.4f}"
        print(f"  layer {l['layer']}: n_entities={l['n_entities']} n_clusters={l['n_clusters']} CS={cs} change={cr} "
              f"stop={l['stop_reason'] or '-'} ({l['seconds']:.1f}s)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
