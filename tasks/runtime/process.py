"""What each process of a run sets for itself: its priority, and BLAS on one thread (the tables' bits)."""

from __future__ import annotations

import os
from typing import Any


def lower_priority(niceness: int) -> None:
    """Run this process, and the processes it starts from now on, at a niceness of at least ``niceness`` (a
    process cannot raise its own priority back, so it is never lowered twice)."""
    current = os.nice(0)
    if niceness > current:
        os.nice(niceness - current)


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
