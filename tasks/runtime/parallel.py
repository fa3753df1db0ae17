"""Dask execution: a local cluster by default, or an existing scheduler from ``dask.address``.

A run holds one ``DaskPool``: its cluster starts in the background when the run begins (so it
comes up, and its workers import what they need, while the run ingests and chunks), serves the
extraction stage, and is released right after it. Work is mapped in coarse batches (one task per batch of chunks);
results come back in submission order whatever order they finish in, so the output is deterministic.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from schemas.config import DaskConfig
from tasks.runtime.process import machine_memory, one_blas_thread, set_up_workers
from tasks.runtime.stages import limit_malloc_arenas

R = TypeVar("R")


@contextlib.contextmanager
def dask_client(cfg: DaskConfig, threads_per_worker: int = 1) -> Iterator[Any]:
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
    with _environ_kept(_nanny_environ()):
        cluster = LocalCluster(
            n_workers=cfg.n_workers,
            threads_per_worker=threads_per_worker,
            processes=cfg.processes,
            host="127.0.0.1",
            protocol="tcp",
            dashboard_address=None,
            # no dashboard, and the scheduler's small HTTP server (health routes) on a free port: its default, 8787,
            # warned "Port 8787 is already in use" whenever anything else held it
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.ERROR,
        )
    client = Client(cluster)
    try:
        yield client
    finally:
        with _environ_kept(_nanny_environ()), _nanny_kills_unlogged():  # a worker restarted meanwhile set them again
            client.close()
            cluster.close()


@contextlib.contextmanager
def _nanny_kills_unlogged() -> Iterator[None]:
    """No "Worker process still alive after 4.0 seconds, killing" warning while the run's own cluster closes: the run
    has fetched every result by then, and a worker that loaded spaCy or torch can take longer than the nanny's 4 s
    to tear its interpreter down on a busy machine; the nanny then kills it, which loses nothing. Errors still show."""
    nanny = logging.getLogger("distributed.nanny")
    level = nanny.level
    nanny.setLevel(logging.ERROR)
    try:
        yield
    finally:
        nanny.setLevel(level)


def _nanny_environ() -> tuple[str, ...]:
    """What a Dask nanny writes into *this* process's environment before it spawns a worker
    (``distributed.nanny.pre-spawn-environ``: OMP_NUM_THREADS=1 & co., MALLOC_TRIM_THRESHOLD_=65536)."""
    import dask
    import distributed  # noqa: F401 - loads distributed's configuration

    return tuple(dask.config.get("distributed.nanny.pre-spawn-environ", default=None) or ())


@contextlib.contextmanager
def _environ_kept(names: tuple[str, ...]) -> Iterator[None]:
    """These environment variables as they were before the block, whatever it set. The nanny's values are meant for
    its workers; left in the run's environment they reach every process it starts later: torch in the embedding
    child on one core, or glibc with a fixed trim threshold (which turns off its adaptive mmap threshold: each
    large tensor an mmap and munmap, the 20k corpus embedded in 333 s instead of 170 s)."""
    saved = {k: os.environ.get(k) for k in names}
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Mapper(Protocol):
    """Runs ``fn(batch, **kwargs)`` over batches, results in batch order; ``on_done(i, result)`` as each ends
    (``keep=False``: results go to ``on_done`` only, and the list returned holds None — a stage that stores each
    result as it comes does not hold them all twice).

    ``start`` may bring its workers up in the background, ``ready`` waits for them, ``release`` frees them
    once the parallel stage is over. A ``share=None`` keyword is filled with the number of workers (each
    takes its share of global limits)."""

    def start(self) -> Any: ...
    def ready(self) -> Any: ...
    def release(self) -> None: ...
    def task_memory(self) -> int: ...  # bytes one task may hold
    def __call__(
        self, fn: Callable[..., R], batches: list[Any], on_done=None, keep: bool = True, **kwargs: Any
    ) -> list[R]: ...


class LocalMapper:
    """In-process and sequential: the baseline the orchestration overhead is measured against."""

    def start(self) -> LocalMapper:
        return self

    def task_memory(self) -> int:
        return machine_memory()  # a task runs in this process

    def ready(self) -> None:
        return None

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalMapper:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def __call__(
        self, fn: Callable[..., R], batches: list[Any], on_done=None, keep: bool = True, **kwargs: Any
    ) -> list[R]:
        if "share" in kwargs and kwargs["share"] is None:
            kwargs["share"] = 1
        out: list[Any] = []
        for i, b in enumerate(batches):
            out.append(fn(b, **kwargs))
            if on_done:
                on_done(i, out[-1])
            if not keep:
                out[-1] = None
        return out


class ProcessMapper:
    """One spawned child process (none of the parent's heap), kept from its first map until ``release``; results
    in batch order. For work whose libraries are large and stay resident once loaded (PyTorch and the packaged
    model: ~600 MB that a long run would otherwise carry through every later stage)."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._busy = 0
        self._lock = threading.Lock()
        self._then: Callable[[], Any] | None = None

    @property
    def started(self) -> bool:
        return self._pool is not None

    def task_memory(self) -> int:
        return machine_memory()  # a task runs in the child, on this machine

    def start(self, warm: Callable[[], Any] | None = None, then: Callable[[], Any] | None = None) -> ProcessMapper:
        """The child, started now; ``warm`` (imports, loads) runs in it first, while this process goes on (the
        first map waits for it; a failure in it shows again where a task needs what it loads); ``then``, another
        warm-up, right after the first map's tasks (what only a later map needs does not hold up the first)."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_setup
            )
            _LIVE.add(self)
            if warm is not None:
                self._pool.submit(warm)
            self._then = then
        return self

    def ready(self) -> None:
        self.start()

    def release(self, idle_only: bool = False) -> None:
        """End the child (its memory goes back to the system); with ``idle_only``, not while a map runs."""
        with self._lock:
            if self._pool is None or (idle_only and self._busy):
                return
            pool, self._pool = self._pool, None
            _LIVE.discard(self)
        pool.shutdown(wait=True, cancel_futures=True)

    def __call__(
        self, fn: Callable[..., R], batches: list[Any], on_done=None, keep: bool = True, **kwargs: Any
    ) -> list[R]:
        from concurrent.futures.process import BrokenProcessPool

        if "share" in kwargs and kwargs["share"] is None:
            kwargs["share"] = 1
        with self._lock:
            self._busy += 1
            futures = [self.start()._pool.submit(fn, b, **kwargs) for b in batches]
            if self._then is not None:
                self._pool.submit(self._then)
                self._then = None
        out: list[Any] = []
        try:
            for i, fut in enumerate(futures):
                out.append(fut.result())
                if on_done:
                    on_done(i, out[-1])
                if not keep:
                    out[-1] = None
        except BrokenProcessPool as exc:
            self.release()
            raise RuntimeError(
                f"{getattr(fn, '__qualname__', fn)}: its child process ended unexpectedly (killed: out of memory?)"
            ) from exc
        finally:
            with self._lock:
                self._busy -= 1
        return out


#: the ProcessMappers whose child runs now (``release_idle_children``)
_LIVE: weakref.WeakSet[ProcessMapper] = weakref.WeakSet()


def release_idle_children() -> None:
    """End the child of every ProcessMapper not mapping now; each starts a new one on its next map. Called before a
    one-off child starts (``in_child_process``): an idle embedding child (~1 GB at 100k chunks) beside it would
    add up to more than either stage needs alone."""
    for mapper in list(_LIVE):
        mapper.release(idle_only=True)


class DaskPool:
    """A run's Dask cluster, usable as a mapper: ``pool(fn, batches, on_done, **kwargs)``.

    ``start()`` brings the cluster up on a background thread and runs ``warm`` once on every
    worker (imports, model loads); the first map waits for that. A ``share=None`` keyword is
    filled with the number of workers (each takes its share of global limits). Close it (or use
    it as a context manager) to shut the cluster down."""

    def __init__(self, cfg: DaskConfig, threads_per_worker: int = 1, warm: Callable[[], None] | None = None):
        self.cfg = cfg
        self.threads_per_worker = threads_per_worker
        self.warm = warm
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="strata-dask-start")
        self._started: Future | None = None

    @property
    def local(self) -> bool:
        """Whether the pool starts a cluster of its own (no ``dask.address``)."""
        return not self.cfg.address

    @property
    def started(self) -> bool:
        return self._started is not None

    def start(self) -> DaskPool:
        if self._started is None:
            self._started = self._executor.submit(self._open)
        return self

    def _open(self) -> tuple[contextlib.ExitStack, Any]:
        stack = contextlib.ExitStack()
        client = stack.enter_context(dask_client(self.cfg, self.threads_per_worker))
        set_up_workers(client)  # an external cluster's workers too
        if self.warm is not None:
            try:
                client.run(self.warm)
            except Exception as exc:  # noqa: BLE001 - the real task reports the same problem with its context
                logging.getLogger("strata").debug("worker warm-up failed: %s", exc)
        return stack, client

    def ready(self) -> Any:
        """The client, once the cluster is up and warm (starting it now if nobody did)."""
        return self.start()._started.result()[1]  # type: ignore[union-attr]

    def task_memory(self) -> int:
        """The smallest memory limit of the cluster's workers (started if need be), else this machine's memory."""
        workers = self.ready().scheduler_info().get("workers", {}).values()
        limits = [int(w.get("memory_limit") or 0) for w in workers]
        return min((m for m in limits if m > 0), default=machine_memory())

    def __call__(
        self, fn: Callable[..., Any], batches: list[Any], on_done=None, keep: bool = True, **kwargs: Any
    ) -> list[Any]:
        client = self.ready()
        if "share" in kwargs and kwargs["share"] is None:
            kwargs["share"] = worker_count(client)
        return map_batches(client, fn, batches, on_done, keep, **kwargs)

    def release(self) -> None:
        """Shut the cluster down now: idle workers still cost the CPU-bound stages that follow extraction
        (~15 % of embedding throughput on two cores). A later ``start()`` or map brings it up again."""
        if self._started is not None:
            try:
                stack, _ = self._started.result()
                stack.close()
            except Exception:  # noqa: BLE001 - a cluster that never came up has nothing to close
                pass
            self._started = None

    def close(self) -> None:
        self.release()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> DaskPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: distributed makes a keyword argument of ``Client.map`` larger than this a graph node keyed by the keyword's name
#: alone, which the scheduler fails to run ("AssertionError: <TaskState 'rows' processing>", distributed 2026.8)
LARGE_ARGUMENT_BYTES = 100_000


def _by_reference(client: Any, value: Any) -> Any:
    """``value`` as it goes into a map's keywords: a large one scattered to the workers first, under a key of
    its own (sent to the workers, not through the scheduler), a small one as it is."""
    from dask.sizeof import sizeof

    return client.scatter([value], hash=False)[0] if sizeof(value) > LARGE_ARGUMENT_BYTES // 2 else value


def worker_count(client: Any) -> int:
    return max(1, len(client.scheduler_info().get("workers", {})))


def map_batches(
    client: Any,
    fn: Callable[..., R],
    batches: list[Any],
    on_done: Callable[[int, R], None] | None = None,
    keep: bool = True,
    **kwargs: Any,
) -> list[R]:
    """Run ``fn(batch, **kwargs)`` for every batch on the cluster; results in batch order (``Mapper``). A result
    fetched is released on the cluster at once: no worker holds the results of a stage until its end.

    The batches are scattered to the workers first: the task graph carries references, not the chunk
    text (a corpus inside the graph makes the scheduler hold and forward all of it). A batch whose scattered
    copy was lost with its worker (killed, out of memory) is scattered and submitted again, up to
    ``LOST_BATCH_TRIES`` times; a task that raised is not."""
    from distributed import as_completed
    from distributed.client import FutureCancelledError

    if not batches:
        return []
    kwargs = {k: _by_reference(client, v) for k, v in kwargs.items()}
    futures = client.map(fn, client.scatter(batches), pure=False, **kwargs)
    index = {f.key: i for i, f in enumerate(futures)}
    tries = [1] * len(batches)
    results: list[Any] = [None] * len(batches)
    pending = as_completed(futures)
    for fut in pending:
        i = index.pop(fut.key)
        try:
            results[i] = fut.result()
        except FutureCancelledError:
            if tries[i] >= LOST_BATCH_TRIES:
                raise
            tries[i] += 1
            logging.getLogger("strata").warning(
                "batch %d of %s lost with its worker: submitted again", i, getattr(fn, "__name__", fn)
            )
            again = client.submit(fn, client.scatter(batches[i]), pure=False, **kwargs)
            index[again.key] = i
            pending.add(again)
            continue
        fut.release()
        if on_done:
            on_done(i, results[i])
        if not keep:
            results[i] = None
    return results


#: how many times a batch lost with its worker is submitted in all
LOST_BATCH_TRIES = 3


def in_child_process(fn: Callable[..., R], *args: Any, workdir: os.PathLike[str] | str) -> R:
    """``fn(*args)`` run in a fresh Python process, its arguments and result passed as pickle files in ``workdir``.

    For a step whose transient memory is much larger than its result (the build's merge: 2.6 GB of polars
    frames for 0.8 GB of layer 0 at 100k chunks). Memory freed in a long-lived process stays mapped in its
    allocators' arenas (what was freed around what lives on); a child's goes back to the system when it exits,
    and the result is read back into fresh, compact allocations. ``fn`` must be importable by name."""
    import pickle
    import subprocess
    import sys

    release_idle_children()
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    inp, out = work / "call.pkl", work / "result.pkl"
    with inp.open("wb") as fh:
        _dump((fn, args), fh, work / "call")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = "import sys; from tasks.runtime.parallel import _child_main; _child_main(sys.argv[1], sys.argv[2])"
    proc = subprocess.run([sys.executable, "-c", code, str(inp), str(out)], env=env, capture_output=True, text=True)
    inp.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-15:]
        raise RuntimeError(
            f"{getattr(fn, '__qualname__', fn)} failed in its child process (exit {proc.returncode}"
            f"{', killed: out of memory?' if proc.returncode in (-9, 137) else ''}):\n" + "\n".join(tail)
        )
    try:
        with out.open("rb") as fh:
            return pickle.load(fh)
    finally:
        out.unlink(missing_ok=True)


def _child_main(call: str, result: str) -> None:
    import pickle

    limit_malloc_arenas()  # as in the run's process: freed memory reused across the child's threads
    one_blas_thread()  # as every process of a run: the same bits (``one_blas_thread``)

    with open(call, "rb") as fh:
        fn, args = pickle.load(fh)
    value = fn(*args)
    with open(result + ".part", "wb") as fh:
        _dump(value, fh, Path(result).parent / "result")
    os.replace(result + ".part", result)


def _dump(value: Any, fh: Any, tables: Path) -> None:
    """``pickle.dump`` with each Arrow table or batch written to a stream file of its own, ``tables``-<n>: pickled,
    a slice carries its parent's whole buffers (an update's merge: 3.1 GB pickled for its 1.9M relations, ~0.2
    GB as a stream), and a stream file is written a batch at a time, not built in memory first."""
    import pickle

    import pyarrow as pa

    class Pickler(pickle.Pickler):
        written = 0

        def reducer_override(self, obj: Any) -> Any:
            if not isinstance(obj, pa.Table | pa.RecordBatch):
                return NotImplemented
            path = f"{tables}-{self.written}.arrows"
            self.written += 1
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, obj.schema) as writer:
                writer.write(obj)
            return _from_stream, (path, isinstance(obj, pa.Table))

    Pickler(fh, protocol=pickle.HIGHEST_PROTOCOL).dump(value)


def _from_stream(path: str, table: bool) -> Any:
    import pyarrow as pa

    with pa.OSFile(path) as source:
        whole = pa.ipc.open_stream(source).read_all()
    os.unlink(path)
    if table:
        return whole
    return pa.RecordBatch.from_arrays([c.combine_chunks() for c in whole.columns], schema=whole.schema)


def _child_setup() -> None:
    """A ``ProcessMapper`` child's start: BLAS on one thread (``one_blas_thread``), and an end without the
    interpreter's teardown. The child ends only when its parent releases it, every result returned; tearing down
    its modules (great-expectations, pandas, spaCy) would keep the parent waiting ~1 s for nothing. Registered
    first, the handler runs after every other exit handler (they run last-registered first)."""
    one_blas_thread()
    atexit.register(_end_now)


def _end_now() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(0)
