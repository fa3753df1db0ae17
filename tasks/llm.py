"""The LLM interface the stages program against, and robust parsing of model output.

Stages never call a provider directly: they take an ``LLMClient`` (anything with an async
``complete``), so tests plug in a local fake and production plugs in the litellm client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol


class LLMClient(Protocol):
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
    """Every top-level {...} or [...] span, in order (string-aware)."""
    out, depth, start, in_str, esc = [], 0, None, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"' and depth:
            in_str = True
        elif ch in "{[":
            if depth == 0:
                start = i
            depth += 1
        elif ch in "}]" and depth:
            depth -= 1
            if depth == 0 and start is not None:
                out.append(text[start : i + 1])
                start = None
    if depth and start is not None:  # truncated answer: try to close it
        tail = text[start:]
        stack = []
        in_str = esc = False
        for ch in tail:
            if in_str:
                if esc:
                    esc = False
                elif ch == "\\":
                    esc = True
                elif ch == '"':
                    in_str = False
                continue
            if ch == '"':
                in_str = True
            elif ch in "{[":
                stack.append("}" if ch == "{" else "]")
            elif ch in "}]" and stack:
                stack.pop()
        closers = ('"' if in_str else "") + "".join(reversed(stack))
        out.append(tail.rstrip().rstrip(",") + closers)
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
