"""The ``strata`` command line: build, inspect, validate, export, query and serve a hierarchical graph-RAG index.

Commands by group: ``build`` (init, index, update, backfill: they run Prefect flows), ``admin`` (inspect,
validate, export, rollback, gc) and ``ask`` (query, shell, serve), ``evaluate`` (eval). Every failure ends as one ``error:``
line and the exit code of its kind (``tasks.errors``); reads resolve one published snapshot.
"""

from flows.cli import build, admin, ask, evaluate  # noqa: F401, I001  (each registers its commands, in this order in --help)
from flows.cli.build import date_partitions
from flows.cli.common import app, main, script, spread_multi_values

__all__ = ["app", "date_partitions", "main", "script", "spread_multi_values"]
