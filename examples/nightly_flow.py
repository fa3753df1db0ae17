"""A refresh in a Prefect flow of your own: tonight's delta of a corpus folder, then a check question, with a cost cap
for a model (``deployments/`` has Strata's own deployments; this is how to call it from yours).

    .venv/bin/python examples/nightly_flow.py data ./index          # one run, as the schedule would make it
"""

from __future__ import annotations

import sys

from prefect import flow

from flows.api import open_index, update


@flow(name="my-nightly-refresh", log_prints=True)  # prints go to the flow run's log
def nightly_refresh(corpus: str, index: str, question: str = "What changed?") -> int | None:
    run = update(corpus, index, settings={"llm.max_cost_usd": 5.0})  # the cap matters only with a model set
    print(f"refresh: {run.status}, snapshot v{run.version}, {run.seconds:.0f} s")
    answer = open_index(index).query(question)
    print(f"check question: {answer.answer or answer.message}")
    return run.version


if __name__ == "__main__":
    nightly_refresh(*sys.argv[1:3])
