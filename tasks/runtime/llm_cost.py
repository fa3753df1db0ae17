"""What LLM calls cost: the model's prices (litellm's cost map, or the configured ones) and the run's hard cap
(``CostCap``, ``llm.max_cost_usd``), which a request that could pass it is never sent past."""

from __future__ import annotations

import logging
import threading
from typing import Any

from schemas.config import LLMConfig
from tasks.errors import CostCapReached

log = logging.getLogger("strata.llm")


class CostCap:
    """A hard limit on what calls may cost (USD), shared by the clients that hold it, safe across threads and tasks.

    Before a request is sent it reserves its worst case — its prompt's tokens (counted high: the larger of cl100k's
    count and a token per three characters, four a message and four a request more) at the input price and
    ``max_tokens`` at the output price — and it is not sent where that could pass the limit; once answered, the
    reservation becomes what the request cost. So what is spent never passes the limit, whatever is in flight."""

    def __init__(self, limit_usd: float, spent_usd: float = 0.0):
        self.limit, self.spent, self.reserved = limit_usd, spent_usd, 0.0
        self.refused = 0
        self._lock = threading.Lock()

    def reserve(self, worst_usd: float) -> None:
        with self._lock:
            if self.spent + self.reserved + worst_usd > self.limit:
                self.refused += 1
                raise CostCapReached(
                    f"the LLM cost cap of ${self.limit:.4f} would be passed by the next call "
                    f"(${self.spent:.4f} spent, ${self.reserved:.4f} in flight, up to ${worst_usd:.4f} for it)"
                )
            self.reserved += worst_usd

    def settle(self, worst_usd: float, cost_usd: float) -> None:
        with self._lock:
            self.reserved -= worst_usd
            self.spent += cost_usd


_CAPS: dict[str, CostCap] = {}
_CAPS_LOCK = threading.Lock()


def shared_cap(key: str, limit_usd: float) -> CostCap:
    """The process's cap named ``key`` (a run's stage: its tasks on one worker share it), made on first use; the caps
    of other keys are dropped (a worker serves one run at a time)."""
    with _CAPS_LOCK:
        if key not in _CAPS:
            _CAPS.clear()
            _CAPS[key] = CostCap(limit_usd)
        return _CAPS[key]


def model_prices(model: str) -> tuple[float, float]:
    """USD per prompt token and per completion token of ``model``: litellm's (its cost map, or what
    ``register_price`` told it), (0, 0) where it has none."""
    import litellm

    try:
        info: Any = litellm.get_model_info(model)
    except Exception:  # noqa: BLE001 - not in the cost map
        info = litellm.model_cost.get(model) or {}
    return float(info.get("input_cost_per_token") or 0.0), float(info.get("output_cost_per_token") or 0.0)


_PRICED: dict[str, bool] = {}


def register_price(cfg: LLMConfig) -> bool:
    """Make sure litellm has a price for ``cfg.model`` (configured, or 0 for a model it does not know).

    Without one, litellm searches its whole cost map on every response (milliseconds of CPU per call,
    the bottleneck at hundreds of calls per second). Returns whether the cost reported is real."""
    key = f"{cfg.model}|{cfg.input_cost_per_mtok}|{cfg.output_cost_per_mtok}"
    if key in _PRICED:
        return _PRICED[key]
    import litellm

    configured = cfg.input_cost_per_mtok is not None or cfg.output_cost_per_mtok is not None
    try:
        litellm.get_model_info(cfg.model)
        known = True
    except Exception:  # noqa: BLE001 - not in the local cost map
        known = False
    if configured or not known:
        try:
            provider = litellm.get_llm_provider(cfg.model)[1]
        except Exception:  # noqa: BLE001
            provider = cfg.model.split("/", 1)[0]
        litellm.register_model(
            {
                cfg.model: {
                    "input_cost_per_token": (cfg.input_cost_per_mtok or 0.0) / 1e6,
                    "output_cost_per_token": (cfg.output_cost_per_mtok or 0.0) / 1e6,
                    "litellm_provider": provider,
                    "mode": "chat",
                }
            }
        )
        if not configured:
            log.info(
                "litellm has no price for %s: cost is reported as 0 (set llm.input_cost_per_mtok and "
                "llm.output_cost_per_mtok to count it)",
                cfg.model,
            )
    _PRICED[key] = configured or known
    return _PRICED[key]
