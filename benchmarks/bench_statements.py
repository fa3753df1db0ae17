"""What labelling relations by the parse (``tasks.index.statements``) adds to the offline extractor (prints figures;
not a test).

Parses the first N passages of a corpus once, then times ``extract_doc`` over the parsed docs with the statements
and with them switched off, alternating rounds in one process (the parse, the extractor's largest cost, is timed
once and reported beside them); prints the share of relation mentions that carry a label and the labels most used.

    .venv/bin/python benchmarks/bench_statements.py [--corpus PATH] [--n 600] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_CORPUS = REPO.parent / "shared" / "datasets" / "musique" / "corpus.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="a corpus.jsonl (text per line)")
    ap.add_argument("--n", type=int, default=600, help="passages to parse")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of each variant")
    args = ap.parse_args()

    import tasks.index.extract as extract
    from schemas.config import ExtractConfig
    from tasks.index import furniture

    texts = []
    with args.corpus.open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts.append(str(row.get("text") or ""))
            if len(texts) == args.n:
                break
    cfg = ExtractConfig()
    nlp = extract.load_nlp(cfg.spacy_model)
    started = time.perf_counter()
    docs = list(nlp.pipe([furniture.blank(t) for t in texts], batch_size=cfg.batch_size))
    parse = time.perf_counter() - started

    labelled = extract.statements

    def run(with_statements: bool) -> tuple[float, list]:
        extract.statements = labelled if with_statements else (lambda sent, at: [])
        t0 = time.perf_counter()
        rels = [r for i, d in enumerate(docs) for r in extract.extract_doc(d, f"c{i}", cfg)[1]]
        return time.perf_counter() - t0, rels

    times: dict[bool, list[float]] = {True: [], False: []}
    rels: dict[bool, list] = {}
    for _ in range(args.rounds):
        for variant in (False, True):
            seconds, rels[variant] = run(variant)
            times[variant].append(seconds)
    extract.statements = labelled
    off, on = statistics.median(times[False]), statistics.median(times[True])
    with_label = [r for r in rels[True] if r.get("label")]
    print(f"{len(docs)} passages, {sum(len(t.split()) for t in texts):,} words: parse {parse:.2f} s")
    print(f"extract_doc without statements {off:.3f} s, with {on:.3f} s (median of {args.rounds})")
    print(f"extraction (parse + extract_doc): {(parse + on) / (parse + off):.3f}x")
    print(
        f"relation mentions {len(rels[False]):,} -> {len(rels[True]):,}; labelled {len(with_label):,} "
        f"({len(with_label) / max(1, len(rels[True])):.1%})"
    )
    print("labels most used:", ", ".join(f"{k} ({n})" for k, n in Counter(r["label"] for r in with_label).most_common(15)))


if __name__ == "__main__":
    main()
