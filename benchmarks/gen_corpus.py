"""Scale corpus generator: N documents of connected prose, deterministic by seed.

Synthetic mode (default) writes passages about a fixed vocabulary of people, companies, places, products
and events made with Faker. Entities are drawn with Zipf-distributed frequency, so a few recur in
thousands of documents and most in a handful, as in real corpora; every sentence connects two or three
of them, so extraction finds relations as well as names. Most documents are passage-sized (one chunk);
``--long-share`` of them run to several chunks.

Mixed mode (``--real``) repeats the shared MuSiQue passages and Christmas Carol paragraphs with new ids
(a ``#rN`` suffix) until N documents are written: real text, real entity distribution, duplicated
content under distinct identities.

    .venv/bin/python benchmarks/gen_corpus.py OUT.jsonl --docs 20000 [--seed 7] [--real]

Output: JSONL with ``id``, ``title`` and ``text``, the format ``strata index`` reads.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "datasets"

VERBS_PP = ["joined {org} in {place}", "founded {org} with {person2}", "left {org} for {org2}",
            "led the {product} project at {org}", "moved from {place} to {place2}",
            "met {person2} at the {event}", "presented {product} at the {event} in {place}",
            "signed an agreement between {org} and {org2}", "was born in {place}",
            "wrote a report on {product} for {org}"]
VERBS_ORG = ["{org} acquired {org2} after the {event}", "{org} opened an office in {place}",
             "{org} released {product} in {year}", "{org} sponsored the {event} held in {place}",
             "{org} and {org2} merged their {place} divisions", "{org} hired {person} as head of research"]
VERBS_PLACE = ["{place} hosted the {event} in {year}", "the {event} moved from {place} to {place2}",
               "{product} was first sold in {place}", "{person} described {place} as the home of {product}"]
OPENERS = ["In {year}, ", "Later, ", "According to {person2}, ", "By {year}, ", "", "", "", "Meanwhile, "]


class Vocabulary:
    """Named entities by kind, each kind drawn with Zipf frequency (rank r has weight 1/r^s)."""

    def __init__(self, rng: np.random.Generator, seed: int, size: int, zipf_s: float = 1.1):
        from faker import Faker

        fake = Faker("en_US")
        fake.seed_instance(seed)
        kinds = {
            "person": lambda: fake.name(),
            "org": lambda: fake.company(),
            "place": lambda: fake.city(),
            "product": lambda: f"{fake.color_name()} {fake.word().capitalize()}",
            "event": lambda: f"{fake.city()} {random.Random(fake.random_int()).choice(['Summit', 'Fair', 'Congress', 'Expo'])}",
        }
        self.rng = rng
        self.names: dict[str, list[str]] = {}
        for kind, make in kinds.items():
            seen: dict[str, None] = {}
            for _ in range(size * 3):
                if len(seen) == size:
                    break
                seen.setdefault(make(), None)
            self.names[kind] = list(seen)
        weights = {k: 1.0 / np.arange(1, len(v) + 1) ** zipf_s for k, v in self.names.items()}
        # what Generator.choice(p=...) computes on every call, once: a draw is then O(log size), not O(size)
        cdf = {k: (w / w.sum()).cumsum() for k, w in weights.items()}
        self.cdf = {k: c / c[-1] for k, c in cdf.items()}

    def draw(self, kind: str) -> str:
        return self.names[kind][int(self.cdf[kind].searchsorted(self.rng.random(), side="right"))]


def sentence(vocab: Vocabulary, rng: np.random.Generator, subject: str) -> str:
    fill = {"person": subject, "person2": vocab.draw("person"), "org": vocab.draw("org"), "org2": vocab.draw("org"),
            "place": vocab.draw("place"), "place2": vocab.draw("place"), "product": vocab.draw("product"),
            "event": vocab.draw("event"), "year": str(int(rng.integers(1950, 2025)))}
    pool = rng.choice(3, p=[0.5, 0.3, 0.2])
    template = [VERBS_PP, VERBS_ORG, VERBS_PLACE][pool]
    body = template[int(rng.integers(len(template)))].format(**fill)
    if pool == 0:
        body = f"{subject} {body}"
    opener = OPENERS[int(rng.integers(len(OPENERS)))].format(**fill)
    text = opener + body
    return text[0].upper() + text[1:] + "."


def synthetic(n_docs: int, seed: int, vocab_size: int, long_share: float):
    rng = np.random.default_rng(seed)
    vocab = Vocabulary(rng, seed, vocab_size)
    for i in range(n_docs):
        subject = vocab.draw("person")
        n_sentences = int(rng.integers(80, 160)) if rng.random() < long_share else int(rng.integers(5, 10))
        sentences = [sentence(vocab, rng, subject if rng.random() < 0.6 else vocab.draw("person"))
                     for _ in range(n_sentences)]
        paragraphs = [" ".join(sentences[j : j + 6]) for j in range(0, len(sentences), 6)]
        yield {"id": f"syn-{i:07d}", "title": subject, "text": "\n\n".join(paragraphs)}


def real(n_docs: int, seed: int):
    base = [json.loads(line) for line in (SHARED / "musique" / "corpus.jsonl").open(encoding="utf-8")]
    book = (SHARED / "christmas_carol" / "book.txt").read_text(encoding="utf-8")
    paras = [" ".join(p.split()) for p in book.split("\n\n") if len(p.split()) >= 40]
    base += [{"id": f"carol-{i:04d}", "title": "A Christmas Carol", "text": p} for i, p in enumerate(paras)]
    order = np.random.default_rng(seed).permutation(len(base))  # no file-order leak between related passages
    for i in range(n_docs):
        d = base[int(order[i % len(base)])]
        yield {"id": f"{d['id']}#r{i // len(base)}", "title": d.get("title", ""), "text": d["text"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=5000, help="documents to write")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=0, help="names per entity kind (default: docs / 4, at least 200)")
    ap.add_argument("--long-share", type=float, default=0.02, help="share of multi-chunk documents")
    ap.add_argument("--real", action="store_true", help="repeat the shared MuSiQue and Christmas Carol text instead")
    args = ap.parse_args()
    random.seed(args.seed)
    docs = real(args.docs, args.seed) if args.real else synthetic(
        args.docs, args.seed, args.vocab or max(200, args.docs // 4), args.long_share)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as fh:
        for d in docs:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {args.docs} documents to {args.out}")


if __name__ == "__main__":
    main()
