"""Prefect flow ``strata-index``: the full build, every stage a Prefect task, extraction on Dask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.env import apply_offline_defaults
from flows.pipeline import build_index, dask_pool, update_index
from schemas.config import load_config
from schemas.tables import LayerRow
from tasks.store.catalog import Catalog


def run_flow(name: str, *args: Any) -> Any:
    """The flow ``name`` of this module as a Prefect flow run when Prefect has an API to report to (``PREFECT_API_URL``
    or its profile's ``api.url``: a server, Prefect Cloud), else its function in this process: the same stages, run
    record and tables, without the temporary Prefect server a flow run starts when none is configured (seconds per
    command, for a flow run nobody can see once the command ends). The CLI's writing commands run through here."""
    from prefect.settings import get_current_settings

    flow_ = globals()[name]
    return flow_(*args) if get_current_settings().api.url else flow_.fn(*args)


def _in_flow_run() -> bool:
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def prefect_runner(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run one stage as a Prefect task inside a flow run (called outside one, by ``run_flow``: the stage itself).
    Arguments are quoted: Prefect must not walk 100k-row inputs."""
    if not _in_flow_run():
        return fn(*args, **kwargs)
    # task(**options)(fn): what task(fn, **options) does, in the form prefect's overloads declare
    stage = task(name=name, cache_policy=NO_CACHE, persist_result=False, retries=0)(fn)
    return stage(*[quote(a) for a in args], **{k: quote(v) for k, v in kwargs.items()})


def _flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run

        return f"run-{flow_run.id}" if flow_run.id else None
    except Exception:  # noqa: BLE001
        return None


@flow(name="strata-index", persist_result=False, log_prints=False)
def index_flow(
    corpus: str,
    index: str,
    config_path: str | None = None,
    overrides: dict[str, Any] | None = None,
    lock_timeout: float = 0.0,
) -> dict[str, Any]:
    """Full build of the index at ``index`` from the corpus at ``corpus``; publishes one snapshot."""
    apply_offline_defaults()
    cfg = load_config(config_path, overrides)
    catalog = Catalog(index, storage=cfg.storage)
    with catalog.writer_lock(lock_timeout), dask_pool(cfg) as pool:
        result = build_index(
            corpus, catalog, cfg, task=prefect_runner, mapper=pool, run_id=_flow_run_id(), flow_name="strata-index"
        )
    publish_layer_artifacts(result.layers, result.layers_plot)
    return asdict(result)


def publish_layer_artifacts(layers: list[LayerRow], plot: str | None) -> None:
    """The layer table and the CS plot (HiRAG Fig. 4) as Prefect artifacts of the flow run."""
    import base64
    from pathlib import Path

    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    if not layers or not _in_flow_run():
        return
    create_table_artifact(
        key="strata-layers",
        table=layers,  # type: ignore[arg-type]  # prefect asks list[dict[str, Any]]: TypedDict rows are plain dicts
        description="HiIndex layers: cluster sparsity per clustering",
    )
    if plot and Path(plot).exists():
        data = base64.b64encode(Path(plot).read_bytes()).decode()
        create_markdown_artifact(
            key="strata-layers-plot",
            markdown=f"![cluster sparsity per layer](data:image/png;base64,{data})\n\nFile: `{plot}`",
            description="Cluster sparsity and change rate per layer",
        )


@flow(name="strata-refresh", persist_result=False, log_prints=False)
def refresh_flow(
    corpus: str,
    index: str,
    config_path: str | None = None,
    overrides: dict[str, Any] | None = None,
    lock_timeout: float = 0.0,
    full: bool = False,
    replace_root: str | None = None,
) -> dict[str, Any]:
    """Incremental update of ``index`` from ``corpus`` (new, changed and deleted documents by content hash).

    Builds the index when it is empty; ``full`` forces a rebuild. Publishes nothing when nothing changed.
    ``replace_root``: the indexed corpus root that ``corpus`` is the new location of."""
    apply_offline_defaults()
    cfg = load_config(config_path, overrides)
    catalog = Catalog(index, storage=cfg.storage)
    with catalog.writer_lock(lock_timeout), dask_pool(cfg) as pool:
        result = update_index(
            corpus,
            catalog,
            cfg,
            task=prefect_runner,
            mapper=pool,
            run_id=_flow_run_id(),
            flow_name="strata-refresh",
            full=full,
            replace_root=replace_root,
        )
    publish_layer_artifacts(result.layers, result.layers_plot)
    return asdict(result)


@flow(name="strata-backfill", persist_result=False, log_prints=False)
def backfill_flow(
    partitions: list[str],
    index: str,
    config_path: str | None = None,
    overrides: dict[str, Any] | None = None,
    lock_timeout: float = 0.0,
) -> list[dict[str, Any]]:
    """Apply corpus partitions in order, each as an incremental update scoped to its own folder.

    On an empty index the first partition builds it. A partition already applied has nothing to do,
    so re-running a backfill after a failure redoes only the failed and the remaining partitions."""
    apply_offline_defaults()
    cfg = load_config(config_path, overrides)
    catalog = Catalog(index, storage=cfg.storage)
    results = []
    with dask_pool(cfg) as pool:  # one pool for all partitions: up while each extracts, prestarted during its ingest
        for part in partitions:
            with catalog.writer_lock(lock_timeout):
                result = update_index(
                    part,
                    catalog,
                    cfg,
                    task=prefect_runner,
                    mapper=pool,
                    run_id=None,
                    flow_name=f"strata-backfill:{part}",
                )
            results.append({"partition": part, "status": result.status, "version": result.version})
    return results
