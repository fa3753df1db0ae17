"""What each process of a run sets for itself: its priority, BLAS on one thread (the tables' bits), and on a Dask
worker the threads one task may use (its share of its machine's cores) and the allocator's thresholds around its
embedding and extraction tasks."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from typing import Any


def lower_priority(niceness: int) -> None:
    """Run this process, and the processes it starts from now on, at a niceness of at least ``niceness`` (a
    process cannot raise its own priority back, so it is never lowered twice)."""
    current = os.nice(0)
    if niceness > current:
        os.nice(niceness - current)


#: the threads one task of this process may use; set on a Dask worker (``share_cores``), None elsewhere
_TASK_THREADS: int | None = None


def task_threads() -> int | None:
    """The threads one task of this process may give a thread pool of its own (the embedding model's): on a Dask
    worker its share of its machine's cores (``share_cores``), else None (the library's default, a thread a core)."""
    return _TASK_THREADS


def share_cores(shares: dict[str, int], dask_worker: Any = None) -> None:
    """On a Dask worker (``client.run`` hands it ``dask_worker``): take its entry of ``shares`` (worker address ->
    threads, ``core_shares``) as ``task_threads``."""
    global _TASK_THREADS
    _TASK_THREADS = shares.get(dask_worker.address) if dask_worker is not None else None


def core_shares(workers: dict[str, dict[str, Any]], cpus: dict[str, int | None]) -> dict[str, int]:
    """Each worker's share of its machine's cores, one task at a time: its host's cores (``cpus``, by worker
    address) over the threads of every worker on that host (``workers``: the scheduler's ``{address: {"host",
    "nthreads"}}``), at least one: two one-thread workers on two cores whose embedding model each took a thread a
    core ran four threads on two cores, slower than one thread each (docs/benchmarks.md, "A core each")."""
    on_host: dict[str, int] = {}
    for w in workers.values():
        on_host[w["host"]] = on_host.get(w["host"], 0) + int(w.get("nthreads") or 1)
    return {a: max(1, (cpus.get(a) or 1) // max(on_host[w["host"]], 1)) for a, w in workers.items()}


def set_up_workers(client: Any) -> None:
    """Every worker of ``client``'s cluster: BLAS on one thread (the tables' bits, ``one_blas_thread``), and its share
    of its machine's cores for a task's own thread pools, the embedding model's (``share_cores``)."""
    client.run(one_blas_thread)
    client.run(share_cores, core_shares(client.scheduler_info().get("workers", {}), client.run(usable_cpus)))


#: glibc's M_MMAP_THRESHOLD within ``large_buffers_reused``: an allocation this large or larger is mapped afresh (32
#: MiB, where glibc's own adaptive threshold stops growing on a 64-bit machine; its trim threshold twice that, as
#: the adaptive rule sets it); and the mmap threshold glibc fixes where a threshold is set, 128 KiB
MMAP_THRESHOLD, FIXED_MMAP_THRESHOLD = 32 * 2**20, 128 * 2**10


@contextlib.contextmanager
def large_buffers_reused() -> Iterator[None]:
    """Within the block, a buffer freed is reused by the next allocation rather than mapped afresh, where this
    process runs with glibc's thresholds fixed: a Dask nanny starts its worker with ``MALLOC_TRIM_THRESHOLD_`` set
    (``distributed.nanny.pre-spawn-environ``, so that freed memory goes back to the system at once), which turns
    glibc's adaptive mmap threshold off, and every allocation past 128 KiB — each batch's buffers in the embedding
    model, spaCy's arrays — is an mmap and a munmap of fresh zeroed pages: a worker embedded about half as many
    texts a second (docs/benchmarks.md, "A worker's large buffers"). Around the embedding and extraction tasks
    only, which allocate such buffers by the thousand; after the block the nanny's thresholds are back and what
    the block left free goes back to the system (``malloc_trim``), so the other stages' peaks stay as they were.
    A no-op elsewhere (no fixed threshold, or not glibc)."""
    fixed, libc = os.environ.get("MALLOC_TRIM_THRESHOLD_"), glibc()
    if fixed is None or not fixed.isdigit() or libc is None:
        yield
        return
    libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 2 * MMAP_THRESHOLD)  # M_TRIM_THRESHOLD
    try:
        yield
    finally:
        libc.mallopt(-3, FIXED_MMAP_THRESHOLD)
        libc.mallopt(-1, int(fixed))
        libc.malloc_trim(0)


@functools.cache
def glibc() -> Any:
    """The C library's allocator calls (``mallopt``, ``malloc_trim``), loaded once; None where it is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def usable_cpus() -> int:
    """The cores this process may run on (its CPU affinity, where the system tells it: a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_memory() -> int:
    """Bytes of memory this machine has."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def one_blas_thread(with_scipy: bool = True) -> None:
    """BLAS (OpenBLAS under numpy and scipy) on one thread in this process. In a build's processes (the run's, its
    children, its Dask workers, an external cluster's included) so that its tables are the same bits whatever the
    machine's cores or the environment's ``OPENBLAS_NUM_THREADS``: a float32 product's sums are split by thread, so
    their last bits follow the thread count (``archrag``'s similarity edges, and the communities and reports they
    shape, differed on 400 MuSiQue passages between 1 and 2 threads). Dask's own workers already ran so
    (``distributed.nanny.pre-spawn-environ``). In a query's: its products are small (a question against MuSiQue's
    21,888 entity vectors: 1.3 ms of CPU on one thread), and in a busy service a second BLAS thread only spins
    beside the other requests (7 ms of CPU, 30 ms of wall). No environment variable is set. ``with_scipy=False``: numpy's
    BLAS only, for a process that never calls scipy's (a query: sparse products only), so it need not load it."""
    blas_on_one_thread(with_scipy)


def blas_on_one_thread(with_scipy: bool = True) -> Any:
    """``one_blas_thread``'s limit (a ``threadpoolctl`` limiter: as a context manager, the previous setting comes
    back at its end). numpy's and scipy's BLAS (scipy ships its own copy) are loaded first: a limit holds only for
    the libraries loaded when it is set."""
    import numpy  # noqa: F401

    if with_scipy:
        import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    return threadpool_limits(1, user_api="blas")
