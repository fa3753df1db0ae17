"""The ``[llm]`` settings: the default model and its client's limits, and a model per stage.

Each stage that can call a model — ``extraction`` (HiRAG's two passes), ``summaries`` (summary entities),
``reports`` (community reports) and ``answers`` (query answers) — has a subsection (``[llm.reports]``) that inherits
the ``[llm]`` model, says ``offline``, or names a model and endpoint of its own: offline extraction with LLM
summaries and reports is GraphRAG's "fast" mix, a small model for extraction and a stronger one for reports
another. ``LLMConfig.stage`` resolves what one stage calls (or None: offline); the client's limits, retries and
cache settings are the ``[llm]`` ones for every stage.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from schemas.prompts import PromptText, check_overrides
from schemas.sections import _Section

Stage = Literal["extraction", "summaries", "reports", "answers"]
#: the stages that can call a model, in the order a run reaches them
LLM_STAGES: tuple[Stage, ...] = ("extraction", "summaries", "reports", "answers")
OFFLINE = "offline"


class LLMStageConfig(_Section):
    """One stage's model: the ``[llm]`` one unless set here."""

    model: str = Field(
        "",
        description='Empty: the [llm] model; "offline": no model for this stage (the offline extractor, summaries, '
        "reports or extractive answers); else a litellm model string of its own.",
    )
    api_base: str = Field(
        "",
        description="Empty: [llm].api_base where this stage uses the [llm] model, else the provider's endpoint; or "
        "an OpenAI-compatible server of its own.",
    )
    input_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million prompt tokens of this stage's model (unset: [llm]'s, same model)."
    )
    output_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million completion tokens of this stage's model (see above)."
    )
    min_members: int = Field(
        0,
        ge=0,
        description="Summaries and reports: only a cluster or community of at least this many entities is sent to the "
        "model, a smaller one gets the offline summary or report (0: every one). Most communities are small and most "
        "of a report stage's calls are theirs: docs/benchmarks.md measures the tokens this saves.",
    )
    pack_tokens: int = Field(
        0,
        ge=0,
        description="Extraction: consecutive chunks of a batch packed into one prompt of up to this many tokens of "
        "text, entities and relations asked in one pass (a longer chunk alone, in one pass too); 0: HiRAG's two passes "
        "per chunk. On short passages most of a call is instructions: docs/benchmarks.md measures the tokens this saves.",
    )


class LLMConfig(_Section):
    model: str = Field(
        "", description="litellm model string, e.g. 'openai/gpt-4o-mini', 'deepseek/deepseek-chat'; empty = offline."
    )
    api_base: str = Field(
        "", description="OpenAI-compatible server (vLLM, llama.cpp, Ollama), e.g. http://127.0.0.1:8000/v1."
    )
    api_key: SecretStr | None = Field(
        None, description="Prefer the provider's environment variable (OPENAI_API_KEY, ...)."
    )
    temperature: float = Field(0.0, description="Sampling temperature of every LLM call (0: the most repeatable).")
    max_tokens: int = Field(2000, gt=0, description="Completion tokens per call.")
    max_concurrency: int = Field(32, gt=0, description="Calls in flight at once, across all workers.")
    rpm: int = Field(0, ge=0, description="Requests per minute across all workers (0 = unlimited).")
    tpm: int = Field(0, ge=0, description="Tokens per minute across all workers (0 = unlimited).")
    timeout_s: float = Field(120.0, gt=0, description="Per-call timeout.")
    max_retries: int = Field(
        6, ge=0, description="Retries on 429, 5xx, timeouts and connection errors (never on other 4xx)."
    )
    backoff_base_s: float = Field(1.0, gt=0, description="First retry delay; doubles per attempt, with full jitter.")
    backoff_max_s: float = Field(60.0, gt=0, description="Longest delay between two retries, in seconds.")
    json_mode: bool = Field(True, description="Ask for response_format=json_object where the provider supports it.")
    gleanings: int = Field(0, ge=0, description="Extra 'anything missed?' extraction passes per chunk.")
    cache: bool = Field(True, description="Persistent response cache (never stores failed or unparseable answers).")
    retry_unparseable: bool = Field(
        False, description="Ask again for prompts whose answer was unparseable in an earlier run."
    )
    input_cost_per_mtok: float | None = Field(
        None, ge=0, description="USD per million prompt tokens, for models litellm has no price for (local servers)."
    )
    output_cost_per_mtok: float | None = Field(None, ge=0, description="USD per million completion tokens (see above).")
    max_cost_usd: float | None = Field(
        None,
        gt=0,
        description="Hard cap on what one index, update or backfill partition may spend on LLM calls (USD; --max-cost): "
        "the run stops before the call that would pass it, publishes nothing, keeps every paid answer in the cache "
        "and exits 5; the same command with a higher cap resumes without paying again. Unset: no cap.",
    )
    extraction: LLMStageConfig = Field(
        default_factory=LLMStageConfig, description="The extraction stage's model (entities, then relations)."
    )
    summaries: LLMStageConfig = Field(
        default_factory=LLMStageConfig, description="The summary entities' model (the hierarchy's layers)."
    )
    reports: LLMStageConfig = Field(default_factory=LLMStageConfig, description="The community reports' model.")
    answers: LLMStageConfig = Field(default_factory=LLMStageConfig, description="The query answers' model.")
    prompts: dict[str, PromptText] = Field(
        default_factory=dict,
        description="Prompts replaced by name ([llm.prompts.report] system = ...), for every stage: schemas/prompts.py; "
        "`strata init` writes each one, commented out.",
    )

    @field_validator("prompts")
    @classmethod
    def _known_prompts(cls, value: dict[str, PromptText]) -> dict[str, PromptText]:
        return check_overrides(value)

    def stage(self, name: Stage) -> LLMConfig | None:
        """What stage ``name`` calls, as a config of its own (the stages' subsections left at their defaults), or None
        where it runs offline: the stage's model, else ``model``; an endpoint, prices and key of the [llm] model only
        where the stage uses that model, the stage's own where it sets them."""
        own = getattr(self, name)
        model = own.model or self.model
        if not model or model == OFFLINE:
            return None
        inherits = model == self.model
        return self.model_copy(
            update={
                "model": model,
                "api_base": own.api_base or (self.api_base if inherits else ""),
                "api_key": self.api_key if inherits else None,
                "input_cost_per_mtok": _own(own.input_cost_per_mtok, self.input_cost_per_mtok, inherits),
                "output_cost_per_mtok": _own(own.output_cost_per_mtok, self.output_cost_per_mtok, inherits),
                **{s: LLMStageConfig() for s in LLM_STAGES},
            }
        )


def _own(value: float | None, default: float | None, inherits: bool) -> float | None:
    return value if value is not None else (default if inherits else None)
