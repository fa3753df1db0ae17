"""LLM-stage efficiency against a local fake server with a fixed latency (prints figures; not a test).

Runs the Prefect flow (extraction on Dask, LLM path) over chunks of the MuSiQue corpus with
the server (its own process, as a remote service would be) answering every call after
``--latency`` seconds and no faults, at several concurrency limits. Reports the extraction-stage wall time divided by the ideal
``calls x latency / concurrency``, and calls and tokens per chunk. The run's Dask cluster starts
while the run ingests and chunks; what is left of that start when extraction begins is printed
as "cluster wait" (it is not part of the stage: a deployment on a standing cluster has none). Each run uses a fresh index
and cache, so every call is real.

    .venv/bin/python benchmarks/bench_llm.py [--concurrency 8 32 128] [--latency 0.2 1.0] [--passages 600]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flows.env import apply_offline_defaults  # noqa: E402

apply_offline_defaults()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--latency", type=float, nargs="+", default=[0.2])
    ap.add_argument("--passages", type=int, default=1890, help="MuSiQue passages to index (one chunk each)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default="hosted_vllm/fake",
                    help="litellm route to the server: hosted_vllm/... (litellm's HTTP client) or openai/... (OpenAI SDK)")
    args = ap.parse_args()
    os.environ.setdefault("OPENAI_API_KEY", "sk-fake")
    from flows.index_flow import index_flow

    src = REPO.parent / "shared" / "datasets" / "musique" / "corpus.jsonl"
    lines = src.read_text(encoding="utf-8").splitlines()[: args.passages]
    for latency in args.latency:
        print(f"model route {args.model}, latency {latency * 1000:.0f} ms, {len(lines)} passages, {args.workers} workers")
        print(f"{'concurrency':>11}{'calls':>7}{'llm s':>8}{'ideal s':>9}{'ratio':>7}{'calls/chunk':>12}{'tokens/chunk':>13}"
              f"{'cluster wait s':>15}")
        for conc in args.concurrency:
            server = subprocess.Popen([sys.executable, "-m", "tests.fake_llm_server", "--latency", str(latency)],
                                      cwd=REPO, stdout=subprocess.PIPE, text=True)
            try:
                url = server.stdout.readline().strip()
                with tempfile.TemporaryDirectory() as tmp:
                    corpus = Path(tmp) / "corpus.jsonl"
                    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
                    per_worker = max(1, conc // args.workers)
                    overrides = {
                        "llm": {"model": args.model, "api_base": url, "max_concurrency": conc, "timeout_s": 30},
                        "extract": {"method": "llm", "batch_size": max(8, per_worker)},
                        "dask": {"n_workers": args.workers, "processes": True},
                        "hierarchy": {"enabled": False},
                    }
                    res = index_flow(str(corpus), str(Path(tmp) / "index"), None, overrides)
                    ext = res["stages"]["extract"]
                    calls = ext["llm_calls"]
                    ideal = calls * latency / conc
                    chunks = ext["chunks"] + ext["quarantined"]
                    print(f"{conc:>11}{calls:>7}{ext['seconds']:>8.1f}{ideal:>9.1f}{ext['seconds'] / ideal:>7.2f}"
                          f"{calls / chunks:>12.2f}{ext['llm_tokens'] / chunks:>13.0f}"
                          f"{res['stages'].get('dask-start', {}).get('seconds', 0.0):>15.1f}", flush=True)
            finally:
                server.kill()
                server.wait()


if __name__ == "__main__":
    main()
