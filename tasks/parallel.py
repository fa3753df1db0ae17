"""Dask execution: a local cluster by default, or an existing scheduler from ``dask.address``.

Work is mapped in coarse batches (one task per batch of chunks); results come back in
submission order whatever order they finish in, so the output is deterministic.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from schemas.config import DaskConfig

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
R = TypeVar("R")


@contextlib.contextmanager
def dask_client(cfg: DaskConfig) -> Iterator[Any]:
    from distributed import Client, LocalCluster

    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.core", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.WARNING)

    if cfg.address:
        client = Client(cfg.address, timeout="30s")
        try:
            yield client
        finally:
            client.close()
        return
    saved = {k: os.environ.get(k) for k in _THREAD_VARS}
    try:
        cluster = LocalCluster(
            n_workers=cfg.n_workers,
            threads_per_worker=1,
            processes=cfg.processes,
            host="127.0.0.1",
            protocol="tcp",
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
    finally:  # distributed sets OMP_NUM_THREADS=1 & co. in *this* process too: torch would then embed on one core
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def worker_count(client: Any) -> int:
    return max(1, len(client.scheduler_info().get("workers", {})))


def dask_mapper(cfg: DaskConfig) -> Callable[..., list[Any]]:
    """A mapper that runs batches on Dask: the cluster lives only for the call (the parallel stage).

    A ``share=None`` keyword is filled with the number of workers (each takes its share of global limits)."""

    def mapper(fn: Callable[..., Any], batches: list[Any], on_done=None, **kwargs: Any) -> list[Any]:
        with dask_client(cfg) as client:
            if "share" in kwargs and kwargs["share"] is None:
                kwargs["share"] = worker_count(client)
            return map_batches(client, fn, batches, on_done, **kwargs)

    return mapper


def map_batches(
    client: Any,
    fn: Callable[..., R],
    batches: list[Any],
    on_done: Callable[[int, R], None] | None = None,
    **kwargs: Any,
) -> list[R]:
    """Run ``fn(batch, **kwargs)`` for every batch on the cluster; results in batch order."""
    from distributed import as_completed

    if not batches:
        return []
    futures = client.map(fn, batches, pure=False, **kwargs)
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(batches)
    for fut in as_completed(futures):
        i = index[fut.key]
        results[i] = fut.result()
        if on_done:
            on_done(i, results[i])
    return results
