"""LLM-stage efficiency against a local fake server with a fixed latency (prints figures; not a test).

Runs the Prefect flow (extraction on Dask, LLM path) over chunks of the MuSiQue corpus with
the server answering every call after ``--latency`` seconds and no faults, at several
concurrency limits. Reports the extraction-stage wall time divided by the ideal
``calls x latency / concurrency``, and calls and tokens per chunk. Each run uses a fresh index
and cache, so every call is real.

    .venv/bin/python benchmarks/bench_llm.py [--concurrency 8 32 128] [--latency 0.2] [--passages 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import flows  # noqa: E402,F401
from tests.fake_llm_server import FakeLLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--passages", type=int, default=600, help="MuSiQue passages to index (one chunk each)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-fake")
    from flows.index_flow import index_flow

    src = REPO.parent / "shared" / "datasets" / "musique" / "corpus.jsonl"
    lines = src.read_text(encoding="utf-8").splitlines()[: args.passages]
    print(f"{'concurrency':>11}{'calls':>7}{'llm s':>8}{'ideal s':>9}{'ratio':>7}{'calls/chunk':>12}{'tokens/chunk':>13}")
    for conc in args.concurrency:
        fake = FakeLLM(latency_s=args.latency).start()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                corpus = Path(tmp) / "corpus.jsonl"
                corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
                per_worker = max(1, conc // args.workers)
                overrides = {
                    "llm": {"model": "openai/fake", "api_base": fake.url, "max_concurrency": conc, "timeout_s": 30},
                    "extract": {"method": "llm", "batch_size": max(16, 8 * per_worker)},
                    "dask": {"n_workers": args.workers, "processes": True},
                    "hierarchy": {"enabled": False},
                }
                res = index_flow(str(corpus), str(Path(tmp) / "index"), None, overrides)
                ext = res["stages"]["extract"]
                calls = ext["llm_calls"]
                ideal = calls * args.latency / conc
                chunks = ext["chunks"] + ext["quarantined"]
                print(f"{conc:>11}{calls:>7}{ext['seconds']:>8.1f}{ideal:>9.1f}{ext['seconds'] / ideal:>7.2f}"
                      f"{calls / chunks:>12.2f}{ext['llm_tokens'] / chunks:>13.0f}", flush=True)
        finally:
            fake.stop()


if __name__ == "__main__":
    main()
