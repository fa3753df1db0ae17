"""The one stage runner: every step of a build or an update is a named stage.

A stage owns its timing, its progress bar (through the run's ``Reporter``), its entry in the run
record (seconds and counts, written to ``runs.stage_counts``) and the wrapping of its work as an
orchestrator task (Prefect in the flows, a plain call in tests and benchmarks)::

    with stages("embed", total=len(texts)) as st:
        vectors = st.run(embedder.embed, texts, st.advance)
        st.done(f"{len(texts)} vectors", vectors=len(texts))
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any

from tasks.runtime.process import glibc
from tasks.runtime.progress import Reporter

#: run(name, fn, *args, **kwargs) -> fn(*args, **kwargs), as an orchestrator task named ``name``
TaskRunner = Callable[..., Any]


def direct_task(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class Stage:
    """A running stage: ``run`` its work as a task, ``advance`` its progress, say what it ``done``."""

    def __init__(self, stages: Stages, name: str):
        self.stages, self.name = stages, name
        self.summary = ""
        self.counts: dict[str, float] = {}

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.stages.task(self.name, fn, *args, **kwargs)

    def advance(self, n: int = 1) -> None:
        self.stages.reporter.advance(self.name, n)

    def done(self, summary: str = "", **counts: float) -> None:
        self.summary = summary
        self.counts.update(counts)


class Stages:
    """The stage runner of one run; ``log`` holds ``{stage: {seconds, counts...}}`` in the order they ran."""

    def __init__(self, reporter: Reporter, task: TaskRunner = direct_task):
        self.reporter, self.task = reporter, task
        self.log: dict[str, dict[str, float]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str, total: int | None = None) -> Iterator[Stage]:
        stage = Stage(self, name)
        self.reporter.start(name, total)
        started = time.perf_counter()
        try:
            yield stage
        except BaseException:
            self.log[name] = {"seconds": round(time.perf_counter() - started, 3), **stage.counts, "failed": 1}
            self.reporter.finish(name, "FAILED")
            raise
        release_memory()
        self.log[name] = {"seconds": round(time.perf_counter() - started, 3), **stage.counts, **memory()}
        self.reporter.finish(name, stage.summary)

    def record(self, name: str, seconds: float, **counts: float) -> None:
        """A log entry for something timed outside a stage (waiting for the Dask cluster)."""
        self.log[name] = {"seconds": round(seconds, 3), **counts}


def release_memory() -> None:
    """Hand what a finished stage freed back to the system. Each allocator keeps freed memory for its own reuse
    only: glibc's (Python objects, token counts, lists of ids), Arrow's pool, polars' jemalloc (told to return
    it by ``flows.env``). What one stage freed in one of them would otherwise stay resident while the next stage
    allocates in another (5k chunks: 110 MB after the merge). No ``gc.collect()``: the rows are freed by
    reference counting, and a full collection of a long-lived process's heap costs seconds."""
    try:
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
    except Exception:  # noqa: BLE001 - a pool without the call
        pass
    if (libc := glibc()) is not None:
        libc.malloc_trim(0)


def limit_malloc_arenas(n: int = 2) -> None:
    """At most ``n`` glibc malloc arenas from now on. glibc gives each thread that allocates concurrently an arena
    of its own (up to 8 per core), and memory freed in one is reused only there: LanceDB's writer threads, the
    embedder's and the Prefect task threads would each keep their own freed memory, and the peak follows the
    number of threads rather than the data. A no-op without glibc."""
    if (libc := glibc()) is not None:
        libc.mallopt(-8, n)  # M_ARENA_MAX


def memory() -> dict[str, float]:
    """The process's resident memory now and at its peak so far, in MB (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            now = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return {}
    return {"rss_mb": round(now, 1), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
