"""How a Dask worker of a run allocates: large buffers reused within a task, freed memory handed back after it."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

#: glibc's M_MMAP_THRESHOLD: an allocation this large or larger is mapped afresh (32 MiB: where glibc's own adaptive
#: threshold stops growing on a 64-bit machine); and M_TRIM_THRESHOLD, twice that, as the adaptive rule sets it
MMAP_THRESHOLD = 32 * 2**20


class WorkerMemory(WorkerPlugin):
    """On every worker of the cluster, those there now and those that join or restart later.

    A Dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_`` set (``distributed.nanny.pre-spawn-environ``, so
    that freed memory goes back to the system at once), and a threshold set turns glibc's adaptive mmap threshold
    off: every allocation past 128 KiB — each batch's buffers in the embedding model, spaCy's arrays — is then an
    mmap and a munmap of fresh zeroed pages, and a worker embedded about half as many texts a second
    (docs/benchmarks.md, "A worker's large allocations"). ``setup`` puts the thresholds where glibc's adaptive rule
    takes them, so a task reuses what it freed; after each task ``malloc_trim`` hands back what the task left free,
    as the nanny's setting meant to: a worker's memory between tasks is what it holds, not what a task once used.
    A no-op without glibc."""

    def setup(self, worker: Any) -> None:
        libc = _glibc()
        if libc is not None:
            libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
            libc.mallopt(-1, 2 * MMAP_THRESHOLD)  # M_TRIM_THRESHOLD

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        libc = _glibc()
        if start == "executing" and libc is not None:
            libc.malloc_trim(0)


@functools.cache
def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None
