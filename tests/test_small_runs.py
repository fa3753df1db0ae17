"""Small jobs pay only for what they use: no local Dask cluster below ``dask.min_chunks``, no temporary Prefect
server for a CLI run when no Prefect API is configured, no nanny warning when the run's cluster closes."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest


def _pool(**dask):
    from schemas.config import load_config
    from tasks.runtime.parallel import DaskPool

    cfg = load_config(overrides={"dask": {"min_chunks": 10, **dask}})
    pool = DaskPool(cfg.dask)
    pool._open = lambda: (contextlib.ExitStack(), None)  # type: ignore[method-assign]  # no real cluster
    return SimpleNamespace(mapper=pool, cfg=cfg), pool


def test_a_run_below_dask_min_chunks_runs_in_its_own_process():
    from flows.pipeline import choose_mapper
    from tasks.runtime.parallel import LocalMapper

    run, pool = _pool()
    choose_mapper(run, 3, final=False)  # 3 documents: maybe more chunks, so nothing decided yet
    assert run.mapper is pool and not pool.started
    choose_mapper(run, 9, final=True)
    assert isinstance(run.mapper, LocalMapper) and not pool.started
    pool.close()


@pytest.mark.parametrize(("count", "final"), [(10, False), (10, True), (500, False)])
def test_a_run_at_dask_min_chunks_starts_its_cluster(count, final):
    from flows.pipeline import choose_mapper

    run, pool = _pool()
    choose_mapper(run, count, final=final)
    assert run.mapper is pool and pool.started
    choose_mapper(run, 1, final=True)  # started: it stays
    assert run.mapper is pool
    pool.close()


def test_an_external_cluster_is_used_whatever_the_size():
    from flows.pipeline import choose_mapper

    run, pool = _pool(address="tcp://127.0.0.1:8786")
    choose_mapper(run, 1, final=True)
    assert run.mapper is pool and pool.started
    pool.close()


def test_the_cli_runs_a_flow_without_prefect_when_no_api_is_configured(monkeypatch):
    import flows.index_flow as index_flows

    calls = []

    class Flow:
        def __call__(self, *args):
            calls.append(("flow run", args))

        def fn(self, *args):
            calls.append(("in process", args))

    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setattr(index_flows, "index_flow", Flow())
    with temporary_settings({PREFECT_API_URL: None}):
        index_flows.run_flow("index_flow", "corpus", "index")
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        index_flows.run_flow("index_flow", "corpus", "index")
    assert calls == [("in process", ("corpus", "index")), ("flow run", ("corpus", "index"))]


def test_a_stage_outside_a_flow_run_is_called_as_it_is():
    from flows.index_flow import prefect_runner

    assert prefect_runner("stage", lambda a, b=0: a + b, 1, b=2) == 3


def test_closing_the_runs_cluster_logs_no_nanny_kill_and_keeps_errors():
    from tasks.runtime.parallel import _nanny_kills_unlogged

    nanny = logging.getLogger("distributed.nanny")
    before = nanny.level
    with _nanny_kills_unlogged():
        assert not nanny.isEnabledFor(logging.WARNING) and nanny.isEnabledFor(logging.ERROR)
    assert nanny.level == before


def test_the_build_that_first_needs_the_query_model_exports_it_with_a_line(tmp_path, monkeypatch):
    from flows.steps import prepare_query_model
    from schemas.config import load_config
    from tasks.index import embed, query_model
    from tasks.runtime.progress import LineReporter, use_reporter

    monkeypatch.setenv("STRATA_MODEL_CACHE", str(tmp_path))
    exported = []

    def export(model, path):
        exported.append(model)
        path.write_bytes(b"onnx")

    monkeypatch.setattr(embed, "export_onnx", export)
    built = embed.LocalEmbedder(runtime="torch")
    built._model = "the run's PyTorch model"
    run = SimpleNamespace(cfg=load_config(), embedder=SimpleNamespace(inner=built))
    lines: list[str] = []
    with use_reporter(LineReporter(lines.append)):
        prepare_query_model(run)
        prepare_query_model(run)  # made: the next build does nothing
    assert exported == ["the run's PyTorch model"]
    assert len(lines) == 1 and "exported to ONNX" in lines[0] and str(tmp_path) in lines[0]
    assert not query_model.query_model_missing(run.cfg.embedding)
