"""The one LLM client: litellm under bounded concurrency, RPM/TPM limits, retries and a cache.

* concurrency: an ``asyncio.Semaphore``; rate limits: async token buckets (waiting is an
  ``await asyncio.sleep``, never a lock held across ``time.sleep``);
* retries with exponential backoff and full jitter on 429 (``Retry-After`` honoured), 5xx,
  timeouts and connection errors; never on other 4xx (bad request, auth, not found);
* a per-call timeout;
* a persistent SQLite cache keyed by model + messages + parameters + prompt version. An answer
  is stored only after the caller's parser accepted it: failed or unparseable answers never are;
* an unparseable answer is retried once with a reminder; after that ``ParseError`` is raised
  for the caller to quarantine;
* usage (calls, cache hits, tokens, cost) is counted per client and reported to the run;
* embedding requests (``embed``, for a litellm embedding model) share the limits, retries and usage;
* a hard cost cap (``llm_cost.CostCap``, ``llm.max_cost_usd``): a request that could pass it is not sent.

API keys come from the provider's environment variables or ``llm.api_key``; they are passed to
litellm per call and never logged, cached or written to a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from schemas.config import LLMConfig
from schemas.prompts import PromptSet
from tasks.runtime.llm import ParseError
from tasks.runtime.llm_cost import CostCap, model_prices, register_price, shared_cap
from tasks.runtime.tokens import count_tokens

log = logging.getLogger("strata.llm")


class LLMError(RuntimeError):
    """A call that failed for good (non-retryable error, or retries exhausted)."""


@dataclass
class Usage:
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)


_SCOPE: contextvars.ContextVar[Usage | None] = contextvars.ContextVar("strata_llm_usage_scope", default=None)


@contextlib.contextmanager
def usage_scope() -> Iterator[Usage]:
    """Usage of the calls made inside this context (and the tasks it starts) only.

    Several batches may share one client concurrently; each counts its own calls in a scope."""
    scoped = Usage()
    token = _SCOPE.set(scoped)
    try:
        yield scoped
    finally:
        _SCOPE.reset(token)


class AsyncRateLimiter:
    """Token bucket of ``per_minute`` units refilled continuously; ``acquire`` awaits until units are free."""

    def __init__(self, per_minute: float, burst: float | None = None):
        self.rate = per_minute / 60.0
        self.capacity = max(burst if burst is not None else per_minute / 6.0, 1.0)  # default: 10 s worth of burst
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, units: float = 1.0) -> None:
        if self.rate <= 0:
            return
        units = min(units, self.capacity)
        async with self._lock:  # waiters queue in order; the wait itself is an await, not a blocking sleep
            while True:
                now = time.monotonic()
                self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
                self.updated = now
                if self.tokens >= units:
                    self.tokens -= units
                    return
                await asyncio.sleep((units - self.tokens) / self.rate)


class ResponseCache:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), check_same_thread=False, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")  # a cache: consistent after a crash, no fsync per answer
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, text TEXT NOT NULL, created REAL)"
        )
        # prompts whose answers stayed unparseable: remembered so a re-run does not pay for them again
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS unparseable (key TEXT PRIMARY KEY, error TEXT NOT NULL, created REAL)"
        )
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT text FROM responses WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, text: str) -> None:
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?)", (key, text, time.time()))

    def failure(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT error FROM unparseable WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put_failure(self, key: str, error: str) -> None:
        with self._lock, self._conn:
            self._conn.execute("INSERT OR REPLACE INTO unparseable VALUES (?, ?, ?)", (key, error, time.time()))

    def forget_failure(self, key: str) -> None:
        with self._lock, self._conn:
            self._conn.execute("DELETE FROM unparseable WHERE key = ?", (key,))

    def all(self) -> dict[str, str]:
        with self._lock:
            return dict(self._conn.execute("SELECT key, text FROM responses"))


def request_params(cfg: LLMConfig, json_mode: bool) -> dict[str, Any]:
    """A chat request's sampling parameters, part of its cache key (``cache_key``)."""
    params: dict[str, Any] = {"temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
    if json_mode and cfg.json_mode:
        params["response_format"] = {"type": "json_object"}
    return params


def cache_key(model: str, messages: list[dict[str, str]], params: dict[str, Any], prompt_version: str) -> str:
    blob = json.dumps(
        {"m": model, "msg": messages, "p": params, "v": prompt_version}, sort_keys=True, ensure_ascii=False
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code
    resp = getattr(exc, "response", None)
    return getattr(resp, "status_code", None) if resp is not None else None


def _retry_after(exc: BaseException) -> float | None:
    for holder in (getattr(exc, "response", None), exc):
        headers = getattr(holder, "headers", None) or getattr(holder, "litellm_response_headers", None)
        if headers is None:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value is not None:
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None


def is_retryable(exc: BaseException) -> bool:
    import litellm

    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, litellm.Timeout, litellm.APIConnectionError)):
        return True
    if isinstance(exc, (litellm.RateLimitError, litellm.InternalServerError, litellm.ServiceUnavailableError)):
        return True
    code = _status(exc)
    if code is not None:
        return code == 429 or code >= 500
    return False


def _parsed(text: str, parse: Callable[[str], Any] | None) -> Any:
    if not text.strip():
        raise ParseError("empty answer")
    return parse(text) if parse else text


class LiteLLMClient:
    """Implements ``tasks.runtime.llm.LLMClient`` over litellm."""

    def __init__(
        self,
        cfg: LLMConfig,
        cache_dir: Path | None = None,
        share: int = 1,
        completion: Callable | None = None,
        cap: CostCap | None = None,
    ):
        if not cfg.model:
            raise ValueError("llm.model is empty: set it (e.g. 'openai/gpt-4o-mini') to use the LLM path")
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        import litellm

        litellm.suppress_debug_info = True
        # this client does the retrying; litellm's OpenAI embedding path reads max_retries=0 as "use the default (2)"
        litellm.DEFAULT_MAX_RETRIES = 0  # type: ignore[misc]  # litellm declares it Final; overridden on purpose
        logging.getLogger("LiteLLM").setLevel(logging.ERROR)
        self.cfg = cfg
        self.prompts = PromptSet(cfg.prompts)  # the prompts this client's stage speaks with
        share = max(1, share)  # this client's share of the global limits (one per Dask worker)
        self.concurrency = max(1, cfg.max_concurrency // share)
        self._sem: asyncio.Semaphore | None = None
        self._rpm = AsyncRateLimiter(cfg.rpm / share) if cfg.rpm else None
        self._tpm = AsyncRateLimiter(cfg.tpm / share) if cfg.tpm else None
        self.cache = ResponseCache(cache_dir / "llm_cache.sqlite") if (cfg.cache and cache_dir) else None
        self.usage = Usage()
        self._completion = completion
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cap = cap  # the run's cost cap (``CostCap``), or None
        self.priced = register_price(cfg)

    def _count(self, **fields: float) -> None:
        for usage in (self.usage, _SCOPE.get()):
            if usage is not None:
                for k, v in fields.items():
                    setattr(usage, k, getattr(usage, k) + v)

    def _params(self, json_mode: bool) -> dict[str, Any]:
        return request_params(self.cfg, json_mode)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # asyncio primitives belong to one loop; bucket levels carry over
            self._loop = loop
            self._sem = asyncio.Semaphore(self.concurrency)
            for limiter in (self._rpm, self._tpm):
                if limiter:
                    limiter._lock = asyncio.Lock()

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        prompt_version: str,
        json_mode: bool = False,
        parse: Callable[[str], Any] | None = None,
    ) -> Any:
        """The (parsed) answer. Cached answers are served without a call; only parsed answers are cached."""
        params = self._params(json_mode)
        key = cache_key(self.cfg.model, messages, params, prompt_version)
        known = None
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                try:
                    value = parse(hit) if parse else hit
                    self._count(cache_hits=1)
                    return value
                except Exception:  # noqa: BLE001 - a parser change: treat as a miss
                    pass
            known = self.cache.failure(key)
            if known is not None and not self.cfg.retry_unparseable:
                self._count(cache_hits=1)
                raise ParseError(f"{known} (remembered from an earlier run; set llm.retry_unparseable to ask again)")
        text = await self._call(messages, params)
        try:
            value = _parsed(text, parse)
        except Exception as first:  # noqa: BLE001 - one retry with a reminder, then give up
            retry_messages = messages + [
                {"role": "assistant", "content": text or ""},
                {
                    "role": "user",
                    "content": "That answer could not be parsed. Reply again with valid JSON only, no prose.",
                },
            ]
            text = await self._call(retry_messages, params)
            try:
                value = _parsed(text, parse)
            except Exception as second:  # noqa: BLE001
                error = f"unparseable answer after one retry: {second} (first: {first})"
                if self.cache is not None:
                    self.cache.put_failure(key, error)
                raise ParseError(error) from None
        if self.cache is not None:
            self.cache.put(key, text)
            if known is not None:  # asked again (retry_unparseable) and parsed this time
                self.cache.forget_failure(key)
        return value

    async def _call(self, messages: list[dict[str, str]], params: dict[str, Any]) -> str:
        import litellm

        completion = self._completion or litellm.acompletion
        est_tokens = sum(len(m["content"]) for m in messages) // 4 + params["max_tokens"] // 4
        worst = self.worst_cost(messages, params["max_tokens"]) if self.cap is not None else 0.0
        resp = await self._request(
            worst,
            lambda: completion(
                model=self.cfg.model,
                messages=messages,
                api_base=self.cfg.api_base or None,
                api_key=self.cfg.api_key.get_secret_value() if self.cfg.api_key else None,
                timeout=self.cfg.timeout_s,
                num_retries=0,
                max_retries=0,
                **params,
            ),
            est_tokens,
        )
        return resp.choices[0].message.content or ""

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Embedding vectors of ``texts`` (one request) from ``cfg.model``, under the same limits and retries."""
        import litellm

        worst = self.worst_cost([{"content": t} for t in texts], 0) if self.cap is not None else 0.0
        resp = await self._request(
            worst,
            lambda: litellm.aembedding(
                model=self.cfg.model,
                input=texts,
                api_base=self.cfg.api_base or None,
                api_key=self.cfg.api_key.get_secret_value() if self.cfg.api_key else None,
                timeout=self.cfg.timeout_s,
                num_retries=0,
                max_retries=0,
            ),
            sum(len(t) for t in texts) // 4,
        )
        data = sorted(resp.data, key=lambda d: d["index"] if isinstance(d, dict) else d.index)
        vectors = [d["embedding"] if isinstance(d, dict) else d.embedding for d in data]
        if len(vectors) != len(texts):
            raise LLMError(f"embedding model {self.cfg.model} returned {len(vectors)} vectors for {len(texts)} texts")
        return vectors

    def worst_cost(self, messages: list[dict[str, str]], max_tokens: int) -> float:
        """The most a request of ``messages`` answered in ``max_tokens`` may cost (``CostCap``), in USD."""

        prompt = sum(max(count_tokens(m["content"]), len(m["content"]) // 3) + 4 for m in messages) + 4
        return prompt * self.prices[0] + max_tokens * self.prices[1]

    @property
    def prices(self) -> tuple[float, float]:
        """USD per prompt token and per completion token of the model (litellm's, or the configured ones)."""
        return model_prices(self.cfg.model)

    async def _request(self, worst: float, send: Callable[[], Any], est_tokens: int) -> Any:
        """One provider request with the client's rate limits, concurrency, timeout and retries; usage counted. Each
        attempt first reserves ``worst`` USD of the cost cap (``CostCap``): one that could pass it is not sent."""
        self._bind_loop()
        attempt = 0
        while True:
            if self._rpm:
                await self._rpm.acquire(1)
            if self._tpm:
                await self._tpm.acquire(est_tokens)
            assert self._sem is not None
            async with self._sem:
                if self.cap is not None:
                    self.cap.reserve(worst)
                cost = 0.0
                try:
                    self._count(calls=1)
                    resp = await asyncio.wait_for(send(), timeout=self.cfg.timeout_s + 5)
                    cost = self._account(resp)
                    return resp
                except Exception as exc:  # noqa: BLE001
                    if not is_retryable(exc) or attempt >= self.cfg.max_retries:
                        self._count(failures=1)
                        raise LLMError(f"{type(exc).__name__} (status {_status(exc)}): {str(exc)[:300]}") from None
                    delay = _retry_after(exc)
                    if delay is None:
                        delay = random.uniform(0, min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt))
                    attempt += 1
                    self._count(retries=1)
                    log.warning("LLM call failed (%s), retry %d in %.1fs", type(exc).__name__, attempt, delay)
                finally:
                    if self.cap is not None:
                        self.cap.settle(worst, cost)
            await asyncio.sleep(delay)  # outside the semaphore: a backing-off call holds no slot

    def _account(self, resp: Any) -> float:
        """Count a response's tokens and cost; returns the cost (USD)."""
        usage = getattr(resp, "usage", None)
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = hidden.get("response_cost") if isinstance(hidden, dict) else getattr(hidden, "response_cost", None)
        self._count(
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0) if usage is not None else 0,
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0) if usage is not None else 0,
            cost_usd=float(cost or 0.0),  # litellm prices every response already: no second cost lookup
        )
        return float(cost or 0.0)


_CLIENTS: dict[tuple[str, str, int, str | None], LiteLLMClient] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(llm: LLMConfig, cache_dir: str, share: int = 1, cap: tuple[str, float] | None = None):
    """One client per process, config and cap: its concurrency and rate-limit state span every task of a worker.
    ``share``: how many processes split the global limits; ``cap``: (name, USD) what the run's tasks of a stage may
    spend (``PipelineRun.cap_for``), of which this process takes its share (``shared_cap``). Clients of an earlier
    run's cap are dropped."""
    key = (llm.model_dump_json(), cache_dir, share, cap[0] if cap else None)
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            if cap is not None:
                for old in [k for k in _CLIENTS if k[3] is not None]:
                    del _CLIENTS[old]
            held = shared_cap(cap[0], cap[1] / share) if cap is not None else None
            _CLIENTS[key] = LiteLLMClient(llm, Path(cache_dir), share=share, cap=held)
        return _CLIENTS[key]
