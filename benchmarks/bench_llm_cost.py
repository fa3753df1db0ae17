"""LLM tokens per corpus token, and ``--estimate`` against the run that follows it (prints figures; not a test).

For each corpus and mix, against the local OpenAI-compatible server answering at a model's length
(``tests/fake_llm_server.py --realistic``): ``strata index --estimate --json`` on a fresh index, the build, then
the same for an update that adds ~1 % more of the corpus. Prints, per stage, the estimate's input tokens and calls
beside what the run recorded (``runs.stage_counts``), and the run's prompt + completion tokens per corpus token.

Mixes: ``full`` (every stage calls the model), ``fast`` (offline extraction; summaries and reports by the model:
GraphRAG's "fast" mix), and each with ``-min10``: only clusters and communities of 10 entities or more sent to the
model (``llm.summaries.min_members``, ``llm.reports.min_members``); ``fast-top``: the fast mix with only those of 100
or more (the top of the hierarchy, what a global question reads first); ``reports-top``: that with offline summaries
too, the model writing only the large communities' reports (GraphRAG's "fast" method has no summary layers); ``packed`` (``-min10``, ``-top``): every stage on
the model, extraction in one pass over packs of chunks of up to 1,200 tokens (``llm.extraction.pack_tokens``).
Corpora: a .jsonl file of passages (``{"title", "text"}`` rows; the update adds the last 1 % of them, shuffled), a
.txt book or a folder of documents (the update adds the last 1 % of the characters, of the book or of the folder's
largest document).

    .venv/bin/python benchmarks/bench_llm_cost.py ../shared/datasets/musique/corpus.jsonl \\
        ../shared/datasets/christmas_carol/book.txt [--mixes full fast] [--passages 1890] [--no-update]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PAYS = ["--set", "llm.summaries.min_members=10", "--set", "llm.reports.min_members=10"]
PACK = ["--set", "llm.extraction.pack_tokens=1200"]
#: the model only for the top of the hierarchy: clusters and communities of 100 entities or more
TOP = ["--set", "llm.summaries.min_members=100", "--set", "llm.reports.min_members=100"]
MIXES = {
    "full": [],
    "fast": ["--set", "llm.extraction.model=offline"],
    "full-min10": PAYS,
    "fast-min10": ["--set", "llm.extraction.model=offline", *PAYS],
    "fast-top": ["--set", "llm.extraction.model=offline", *TOP],
    "reports-top": ["--set", "llm.extraction.model=offline", "--set", "llm.summaries.model=offline", *TOP],
    "packed": PACK,
    "packed-min10": [*PACK, *PAYS],
    "packed-top": [*PACK, *TOP],
}
STAGES = ("extraction", "summaries", "reports")


def split_corpus(source: Path, folder: Path, passages: int, share: float) -> tuple[Path, Path]:
    """``source`` as a corpus folder without its last ``share`` (shuffled passages, or the last characters of a
    book or of a folder's largest document), and that share as a file to add for the update."""
    base, extra = folder / "corpus", folder / "extra"
    base.mkdir(parents=True)
    extra.mkdir()
    if source.suffix == ".jsonl":
        rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        random.Random(7).shuffle(rows)  # file order is no signal
        rows = rows[:passages]
        cut = max(1, round(len(rows) * share))
        for name, part in (("base", rows[:-cut]), ("added", rows[-cut:])):
            target = base if name == "base" else extra
            (target / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")
    else:  # a book, or a folder of documents whose largest gives its last characters
        files = sorted(f for f in source.rglob("*") if f.is_file()) if source.is_dir() else [source]
        texts = {f: f.read_text(encoding="utf-8") for f in files}
        largest = max(files, key=lambda f: (len(texts[f]), f.name))
        for f in files:
            if f != largest:
                (base / f.name).write_text(texts[f], encoding="utf-8")
        text = texts[largest]
        cut = text.rfind("\n\n", 0, round(len(text) - share * sum(len(t) for t in texts.values())))
        (base / largest.name).write_text(text[:cut], encoding="utf-8")
        (extra / f"added-{largest.name}").write_text(text[cut:], encoding="utf-8")
    return base, extra


def strata(*args: str) -> str:
    res = subprocess.run([str(REPO / ".venv/bin/strata"), *args], capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise SystemExit(f"strata {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return res.stdout


def recorded(index: Path) -> tuple[int, dict[str, dict[str, int]]]:
    """The last run's corpus tokens and, per LLM stage, its calls and prompt and completion tokens."""
    from tasks.index.llm_estimate import RUN_STAGES
    from tasks.store.catalog import Catalog

    counts = json.loads(Catalog(index, create=False).runs()[-1]["stage_counts"])
    out = {}
    for stage, names in RUN_STAGES.items():
        rows = [counts[n] for n in names if n in counts]
        out[stage] = {k: sum(r.get(f"llm_{k}", 0) for r in rows) for k in ("calls", "prompt_tokens", "completion_tokens")}
    return int(counts["chunk"]["tokens"]), out


def measure(label: str, command: list[str], index: Path, flags: list[str]) -> dict:
    est = json.loads(strata(*command, "--index", str(index), *flags, "--estimate", "--json"))
    strata(*command, "--index", str(index), *flags, "--quiet")
    tokens, got = recorded(index)
    rows = []
    for stage in STAGES:
        e = next((r for r in est["stages"] if r["stage"] == stage), None)
        g = got[stage]
        if e is None and not g["calls"]:
            continue
        est_in = e["input_tokens"] if e else 0
        rows.append(
            {
                "stage": stage,
                "est_calls": e["calls"] if e else 0,
                "calls": g["calls"],
                "est_input": est_in,
                "input": g["prompt_tokens"],
                "error_pct": round(100 * (est_in - g["prompt_tokens"]) / g["prompt_tokens"], 1) if g["prompt_tokens"] else None,
                "per_corpus_token": round((g["prompt_tokens"] + g["completion_tokens"]) / tokens, 3),
                "basis": e["basis"] if e else "",
            }
        )
    est_total, total = sum(r["est_input"] for r in rows), sum(r["input"] for r in rows)
    every = sum(g["prompt_tokens"] + g["completion_tokens"] for g in got.values())
    summary = {
        "run": label,
        "corpus_tokens": tokens,
        "names": est.get("names"),
        "entities": est.get("entities"),  # the offline graph's, where extraction is offline
        "stages": rows,
        "est_input": est_total,
        "input": total,
        "error_pct": round(100 * (est_total - total) / total, 1) if total else None,
        "per_corpus_token": round(every / tokens, 3),
    }
    print(f"\n{label}: {tokens:,} corpus tokens, {summary['per_corpus_token']} LLM tokens per corpus token "
          f"(input estimated {est_total:,} vs {total:,}: {summary['error_pct']} %; entities {est.get('entities')})",
          flush=True)
    print(f"  {'stage':<11}{'calls est/run':>16}{'input est':>12}{'input run':>12}{'error %':>9}{'tok/corpus tok':>16}  basis")
    for r in rows:
        print(f"  {r['stage']:<11}{r['est_calls']:>7,}/{r['calls']:<8,}{r['est_input']:>12,}{r['input']:>12,}"
              f"{str(r['error_pct']):>9}{r['per_corpus_token']:>16}  {r['basis']}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpora", nargs="+", type=Path)
    ap.add_argument("--mixes", nargs="+", default=["full", "fast"], choices=list(MIXES))
    ap.add_argument("--passages", type=int, default=1890, help="passages of a .jsonl corpus to index")
    ap.add_argument("--update-share", type=float, default=0.01)
    ap.add_argument("--no-update", action="store_true")
    ap.add_argument("--out", type=Path, help="write every figure as JSON here")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "strata-cost",
                    help="where the embedding cache of each corpus is kept between runs")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from tests.fake_llm_server import FakeLLM

    os.environ.setdefault("OPENAI_API_KEY", "sk-fake")
    fake = FakeLLM(realistic=True).start()
    results = []
    try:
        for source in args.corpora:
            for mix in args.mixes:
                with tempfile.TemporaryDirectory(prefix="strata-cost-") as tmp:
                    base, extra = split_corpus(source, Path(tmp), args.passages, args.update_share)
                    flags = ["--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}",
                             "--set", "llm.input_cost_per_mtok=0.15", "--set", "llm.output_cost_per_mtok=0.6",
                             *MIXES[mix]]
                    index = Path(tmp) / "index"
                    # the embedding model's vectors carried from run to run of a corpus (no LLM token depends on them)
                    vectors = args.work / f"embeddings-{source.stem}.sqlite"
                    if vectors.exists():
                        (index / "_cache").mkdir(parents=True)
                        shutil.copy(vectors, index / "_cache" / "embeddings.sqlite")
                    results.append(measure(f"{source.name} {mix} build", ["index", str(base)], index, flags))
                    if not args.no_update:
                        for f in extra.iterdir():
                            f.rename(base / f.name)
                        results.append(measure(f"{source.name} {mix} update", ["update", str(base)], index, flags))
                    with sqlite3.connect(index / "_cache" / "embeddings.sqlite") as db:  # its WAL into the file
                        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    shutil.copy(index / "_cache" / "embeddings.sqlite", vectors)
    finally:
        fake.stop()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
