"""The LLM interface the stages program against, and robust parsing of model output.

Stages never call a provider directly: they take an ``LLMClient`` (anything with an async
``complete``), so tests plug in a local fake and production plugs in the litellm client.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import re
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from schemas.prompts import PromptSet

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()
T = TypeVar("T")


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's LLM event loop, on a daemon thread. Every stage's calls run on it (extraction
    batches on several worker threads at once, so one batch's tail overlaps the next batch's first calls),
    and litellm's background tasks live on one loop for the whole process."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="strata-llm-loop", daemon=True).start()
            atexit.register(_stop_loop, _LOOP)
        return _LOOP


def _stop_loop(loop: asyncio.AbstractEventLoop) -> None:
    """At exit: cancel what litellm left running on the loop (its logging worker), then stop the loop."""

    async def cancel_rest() -> None:
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    try:
        asyncio.run_coroutine_threadsafe(cancel_rest(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
    except Exception:  # noqa: BLE001 - best effort at interpreter exit
        pass


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on the process's LLM loop and wait for its result (from synchronous code, never
    from a coroutine on that loop). Interrupted (Ctrl-C), it cancels the coroutine's calls."""
    future = asyncio.run_coroutine_threadsafe(coro, event_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


class LLMClient(Protocol):
    #: the prompts to build messages from (``[llm.prompts]`` over the defaults)
    prompts: PromptSet

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        prompt_version: str,
        json_mode: bool = False,
        parse: Callable[[str], Any] | None = None,
    ) -> Any:
        """The answer to ``messages``, passed through ``parse`` when given (which raises on a bad answer).

        Implementations cache only answers that ``parse`` accepted and retry an unparseable one once."""
        ...


class ParseError(ValueError):
    pass


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


def _balanced_candidates(text: str) -> list[str]:
    """Every top-level {...} or [...] span, in order (string-aware); a span cut off at the end is closed."""
    out: list[str] = []
    stack: list[str] = []
    start, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"' and stack:
            in_str = True
        elif ch in "{[":
            if not stack:
                start = i
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
            if not stack:
                out.append(text[start : i + 1])
    if stack:  # truncated answer: close what is open
        out.append(text[start:].rstrip().rstrip(",") + ('"' if in_str else "") + "".join(reversed(stack)))
    return out


def parse_json(text: str) -> Any:
    """JSON from a model answer: bare, fenced, with trailing prose, trailing commas, or cut off mid-way."""
    if text is None or not str(text).strip():
        raise ParseError("empty answer")
    text = str(text).strip()
    candidates = [text]
    candidates += [m.strip() for m in _FENCE.findall(text)]
    candidates += _balanced_candidates(text)
    for cand in candidates:
        for attempt in (cand, re.sub(r",\s*([}\]])", r"\1", cand)):
            try:
                return json.loads(attempt)
            except json.JSONDecodeError:
                continue
    raise ParseError(f"no JSON found in answer ({text[:80]!r}...)")
