"""Build an index of a folder and ask it a question, from Python (``flows.api``).

    .venv/bin/python examples/build_and_query.py data ./index "Who employed Bob Cratchit?"
"""

from __future__ import annotations

import sys

from flows.api import build, open_index


def main(corpus: str, index: str, question: str) -> None:
    run = build(corpus, index)  # offline by default; settings={"llm.model": "openai/gpt-4o-mini"} for a model
    print(f"snapshot v{run.version}: {run.counts['chunks']} chunks, {run.counts['entities']} entities, {run.seconds:.0f} s")
    result = open_index(index).query(question, budget=2000)
    print(f"answer ({result.answer_kind}, mode {result.mode}): {result.answer}")
    for source in result.sources[:3]:
        print(f"  source {source['document_id']}: {source['text'][:80]!r}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
