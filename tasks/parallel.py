"""Dask execution: a local cluster by default, or an existing scheduler from ``dask.address``.

Work is mapped in coarse batches (one task per batch of chunks); results come back in
submission order whatever order they finish in, so the output is deterministic.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from schemas.config import DaskConfig

T = TypeVar("T")
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
    cluster = LocalCluster(
        n_workers=cfg.n_workers,
        threads_per_worker=1,
        processes=cfg.processes,
        host="127.0.0.1",
        protocol="tcp",
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def batched(items: Sequence[T], size: int) -> list[list[T]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


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
