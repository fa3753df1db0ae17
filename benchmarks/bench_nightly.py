"""The nightly refresh, night after night, as a team runs it (prints figures; not a test).

Builds the corpus minus a held-back share, starts ``strata serve`` over the index with ``--clients`` clients asking
the dataset's questions (each waits ``--think`` seconds after an answer before its next question: a bounded stream,
as a team's users ask; 0 = without pause, which on two cores leaves an update a fraction of a core), then for each of ``--nights`` nights adds, edits and deletes ``--churn`` of
the documents (added ones come from the held-back share; an edit drops a document's last sentence), runs
``strata update`` and ``strata gc --keep K``. Per night it records the update's wall and peak memory (the run
process, the largest other process of its tree — a Dask worker — and the tree's sum, sampled every 0.5 s), the
index's size on disk, and the requests answered and failed meanwhile. At the end: every answer's snapshot version
must be one that was published; layer 0 (entities and relations) is compared with a full build of the final corpus,
and ``strata eval`` runs on both.

    .venv/bin/python benchmarks/bench_nightly.py --corpus ../shared/datasets/musique --nights 30 --churn 0.01 \\
        --keep 7 --clients 4 --json nightly.json [--think 1] [--work ./nightly-work] [--budgets 1000 4000] \\
        [--compact-share S]

``--corpus``: a folder with ``corpus.jsonl`` (id, title, text) and, for the questions and the evaluation,
``queries.jsonl``. The documents are shuffled (``--seed``) before anything is held back: file order means nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
from bench_serve import free_port  # this script's folder is on the path when it runs

STRATA = Path(sys.executable).parent / "strata"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def run_measured(cmd: list[str]) -> dict:
    """Run ``cmd``; its wall and the peak resident memory of the process, of its largest descendant, and of the
    tree's sum (sampled every 0.5 s)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    top = psutil.Process(proc.pid)
    peak_run = peak_other = peak_sum = 0.0
    while proc.poll() is None:
        try:
            procs = [top, *top.children(recursive=True)]
            rss = {p.pid: p.memory_info().rss / 2**20 for p in procs}
        except psutil.Error:
            rss = {}
        peak_run = max(peak_run, rss.get(proc.pid, 0.0))
        peak_other = max([peak_other, *(v for k, v in rss.items() if k != proc.pid)])
        peak_sum = max(peak_sum, sum(rss.values()))
        time.sleep(0.5)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "peak_run_mb": round(peak_run),
        "peak_other_mb": round(peak_other),
        "peak_tree_mb": round(peak_sum),
    }


def dir_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and "_cache" not in f.parts) / 2**20, 1)


def write_corpus(docs: dict[str, dict], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / "corpus.jsonl.tmp"
    with staged.open("w", encoding="utf-8") as fh:
        for d in docs.values():
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    staged.replace(folder / "corpus.jsonl")


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def edited(text: str) -> str:
    """The text without its last sentence (a one-sentence text gets a second one)."""
    parts = _SENTENCE_END.split(text.strip())
    return " ".join(parts[:-1]) if len(parts) > 1 else f"{text} It was revised."


class Clients:
    """``n`` clients asking the questions in turn against ``base`` until stopped; every answer's version kept."""

    def __init__(self, base: str, questions: list[str], n: int, think: float = 0.0):
        self.base, self.questions, self.stop, self.think = base, questions, threading.Event(), think
        self.ok, self.failed, self.versions, self.errors = 0, 0, Counter(), []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def _run(self, k: int) -> None:
        i = k
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                q = self.questions[i % len(self.questions)]
                i += len(self.threads)
                try:
                    res = client.post(f"{self.base}/query", json={"question": q})
                    good, version, error = res.status_code == 200, None, f"{res.status_code} {res.text[:200]}"
                    if good:
                        version = res.json()["version"]
                except httpx.HTTPError as exc:
                    good, version, error = False, None, f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if good:
                        self.ok += 1
                        self.versions[version] += 1
                    else:
                        self.failed += 1
                        self.errors.append(error)
                self.stop.wait(self.think)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.ok, self.failed


def layer0(index: Path) -> dict[str, set]:
    """Layer 0 of the index's latest snapshot, without the fields that name a run (version)."""
    import lancedb  # noqa: F401  (the catalog opens the tables)

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tasks.store.catalog import Catalog

    cat = Catalog(str(index), create=False)
    snap = cat.snapshot()
    ents = cat.read("entities", snap=snap, columns=["id", "name", "type", "description", "source_chunk_ids", "layer"])
    rels = cat.read("relations", snap=snap, columns=["source_id", "target_id", "kind", "description"])
    return {
        "entities": {
            (r["id"], r["name"], r["type"], r["description"], tuple(sorted(r["source_chunk_ids"])))
            for r in ents.to_pylist()
            if r["layer"] == 0
        },
        "relations": {
            (r["source_id"], r["target_id"], r["description"]) for r in rels.to_pylist() if r["kind"] == "extracted"
        },
    }


def evaluate(dataset: Path, index: Path, budgets: list[int]) -> dict:
    out = subprocess.run(
        [
            str(STRATA),
            "eval",
            "--dataset",
            str(dataset),
            "--index",
            str(index),
            "--out",
            str(index.parent / f"eval-{index.name}"),
            "--budgets",
            *map(str, budgets),
            "--json",
        ],
        env=ENV,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {
        f"{m['mode']}@{m['token_budget']}": round(m["passage_recall"], 4)
        for b in json.loads(out)["budgets"]
        for m in b["modes"]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument(
        "--churn", type=float, default=0.01, help="share of the documents added, edited and deleted a night"
    )
    ap.add_argument("--keep", type=int, default=7, help="strata gc --keep")
    ap.add_argument(
        "--compact-share", type=float, default=None, help="strata gc --compact-share (default: gc's own; 1 = never)"
    )
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument(
        "--think", type=float, default=1.0, help="seconds a client waits after an answer (0: none, a saturated service)"
    )
    ap.add_argument("--hold-back", type=float, help="share held back for the nights' additions (default: enough)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[1000, 4000])
    ap.add_argument("--work", type=Path, default=Path("nightly-work"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()

    records = [
        json.loads(line)
        for line in (args.corpus / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    rng = random.Random(args.seed)
    rng.shuffle(records)
    per_night = max(1, round(args.churn * len(records)))
    held_share = args.hold_back if args.hold_back is not None else min(0.5, per_night * args.nights / len(records))
    n_held = min(len(records) - 3 * per_night, max(per_night * args.nights, round(held_share * len(records))))
    held, live = records[:n_held], {str(r["id"]): r for r in records[n_held:]}
    questions = [
        json.loads(line)["question"]
        for line in (args.corpus / "queries.jsonl").read_text().splitlines()
        if line.strip()
    ]

    shutil.rmtree(args.work, ignore_errors=True)
    corpus, index = args.work / "corpus", args.work / "index"
    write_corpus(live, corpus)
    print(
        f"{len(records)} documents: {len(live)} built, {len(held)} held back; {per_night} added, edited and deleted a night",
        flush=True,
    )
    build = run_measured([str(STRATA), "index", str(corpus), "--index", str(index), "--quiet"])
    print(f"build: {json.dumps(build)}", flush=True)

    port = free_port()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark stops its service (finally below)
    log = (args.work / "serve.log").open("w")
    server = subprocess.Popen(
        [str(STRATA), "serve", "--index", str(index), "--port", str(port), "--set", "serve.auth=none"],  # loopback
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    clients = Clients(base, questions, args.clients, args.think)
    for t in clients.threads:
        t.start()
    nights, published = [], {1}
    try:
        for night in range(1, args.nights + 1):
            ids = sorted(live)
            rng.shuffle(ids)
            gone, changed = ids[:per_night], ids[per_night : 2 * per_night]
            for d in gone:
                del live[d]
            for d in changed:
                live[d] = dict(live[d], text=edited(live[d]["text"]))
            for r in held[:per_night]:
                live[str(r["id"])] = r
            held = held[per_night:]
            write_corpus(live, corpus)
            before = clients.counts()
            update = run_measured([str(STRATA), "update", str(corpus), "--index", str(index), "--quiet"])
            versions = json.loads(
                subprocess.run(
                    [str(STRATA), "inspect", "--index", str(index), "--json"],
                    env=ENV,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            published.add(versions["version"])
            share = [] if args.compact_share is None else ["--compact-share", str(args.compact_share)]
            gc = run_measured([str(STRATA), "gc", "--keep", str(args.keep), *share, "--index", str(index)])
            after = clients.counts()
            row = {
                "night": night,
                "version": versions["version"],
                "update": update,
                "gc_wall_s": gc["wall_s"],
                "index_mb": dir_mb(index),
                "documents": len(live),
                "answered": after[0] - before[0],
                "failed": after[1] - before[1],
            }
            nights.append(row)
            print(json.dumps(row), flush=True)
    finally:
        clients.stop.set()
        for t in clients.threads:
            t.join(180)
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    full_dir = args.work / "final"  # the final corpus and the questions, for `strata eval`
    write_corpus(live, full_dir)
    shutil.copy(args.corpus / "queries.jsonl", full_dir / "queries.jsonl")
    full_index = args.work / "full-index"  # built from the same folder as the index: the same root, the same ids
    full = run_measured([str(STRATA), "index", str(corpus), "--index", str(full_index), "--quiet"])
    mine, theirs = layer0(index), layer0(full_index)
    result = {
        "documents": len(records),
        "per_night": per_night,
        "clients": args.clients,
        "think_s": args.think,
        "build": build,
        "nights": nights,
        "full_build": full,
        "requests": {
            "answered": clients.ok,
            "failed": clients.failed,
            "first_errors": clients.errors[:5],
            "versions": dict(sorted(clients.versions.items())),
            "all_published": set(clients.versions) <= published,
        },
        "layer0_equal": {k: mine[k] == theirs[k] for k in mine},
        "layer0_diff": {k: [len(mine[k] - theirs[k]), len(theirs[k] - mine[k])] for k in mine},
        "size_night30_over_night1": round(nights[-1]["index_mb"] / nights[0]["index_mb"], 2) if nights else None,
    }
    result["eval"] = {
        "updated": evaluate(full_dir, index, args.budgets),
        "full": evaluate(full_dir, full_index, args.budgets),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "nights"}, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
