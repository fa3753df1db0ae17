"""One typed config model for every stage.

Sources, later ones win: built-in defaults, a TOML file (``strata.toml``), then
environment variables ``STRATA_<SECTION>__<KEY>`` (for example
``STRATA_CHUNKING__SIZE=800`` or ``STRATA_DASK__ADDRESS=tcp://10.0.0.5:8786``).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from schemas.llm import LLM_STAGES, LLMConfig, LLMStageConfig
from schemas.prompts import commented_toml
from schemas.sections import (
    ArchRAGConfig,
    ChunkingConfig,
    CommunityConfig,
    CorpusConfig,
    DaskConfig,
    EmbeddingConfig,
    ExtractConfig,
    HierarchyConfig,
    HyGRAGConfig,
    IncrementalConfig,
    IndexConfig,
    RetrievalConfig,
    ServeConfig,
    StorageConfig,
    _Section,
)

__all__ = [
    "ArchRAGConfig",
    "ChunkingConfig",
    "CommunityConfig",
    "ConfigError",
    "CorpusConfig",
    "DaskConfig",
    "EmbeddingConfig",
    "ExtractConfig",
    "HierarchyConfig",
    "HyGRAGConfig",
    "IncrementalConfig",
    "IndexConfig",
    "LLMConfig",
    "LLMStageConfig",
    "LLM_STAGES",
    "RetrievalConfig",
    "ServeConfig",
    "StorageConfig",
    "StrataConfig",
    "default_toml",
    "load_config",
    "parse_overrides",
]

ENV_PREFIX = "STRATA_"


class ConfigError(ValueError):
    """A config file or override that does not validate; the message says where and why."""


class StrataConfig(_Section):
    seed: int = Field(
        42,
        description="Seed of every seeded step (samples, PCA/UMAP, GMMs, Leiden): the same corpus, config and "
        "seed give the same tables.",
    )
    index: IndexConfig = Field(default_factory=IndexConfig)
    corpus: CorpusConfig = Field(default_factory=CorpusConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    dask: DaskConfig = Field(default_factory=DaskConfig)
    hierarchy: HierarchyConfig = Field(default_factory=HierarchyConfig)
    hygrag: HyGRAGConfig = Field(default_factory=HyGRAGConfig)
    archrag: ArchRAGConfig = Field(default_factory=ArchRAGConfig)
    communities: CommunityConfig = Field(default_factory=CommunityConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    incremental: IncrementalConfig = Field(default_factory=IncrementalConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)

    def fingerprint(self) -> dict[str, Any]:
        """The parameters a run records: never the API key."""
        data = self.model_dump(mode="json", exclude={"llm": {"api_key"}})
        data["llm"]["api_key"] = "***" if self.llm.api_key else None
        return data


def _set_nested(data: dict[str, Any], path: list[str], raw: str) -> None:
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {'.'.join(path)}: {key} is not a section")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    node[path[-1]] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``section.key=value`` pairs (``--set``) as a nested dict, values parsed as JSON when they can be."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set expects section.key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        _set_nested(out, [p for p in key.strip().split(".") if p], raw)
    return out


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Collect ``STRATA_SECTION__KEY=value`` variables into a nested dict (values parsed as JSON when they can be)."""
    environ = dict(os.environ if environ is None else environ)
    out: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ("STRATA_CONFIG", "STRATA_HOME"):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        # STRATA_SEED is a setting, STRATA_REPO is not; STRATA_X__Y always is (so a typo there is reported)
        if path and (len(path) > 1 or path[0] in StrataConfig.model_fields):
            _set_nested(out, path, raw)
    return out


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_errors(err: ValidationError, origin: str) -> str:
    lines = [f"invalid Strata config ({origin}):"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"  - {where}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> StrataConfig:
    """Defaults < TOML file < environment < explicit overrides, validated as one model."""
    data: dict[str, Any] = {}
    origin = "defaults"
    if path is None and os.environ.get("STRATA_CONFIG"):
        path = os.environ["STRATA_CONFIG"]
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
        origin = str(p)
    data = _deep_merge(data, env_overrides(environ))
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return StrataConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, _origin(origin, bool(env_overrides(environ)), bool(overrides)))) from None


def _origin(source: str, environment: bool, overrides: bool) -> str:
    """Where the settings that failed came from: the file or the defaults, plus the environment and --set as used."""
    return " + ".join([source] + (["environment (STRATA_*)"] if environment else []) + (["--set"] if overrides else []))


def _toml_value(value: Any) -> str:
    if value is None:
        return '""'
    return json.dumps(value) if not isinstance(value, bool) else ("true" if value else "false")


def default_toml() -> str:
    """A commented ``strata.toml`` with every setting at its default."""
    lines = [
        "# Strata configuration. Every key is optional; these are the defaults.",
        "# Environment overrides: STRATA_<SECTION>__<KEY>=value (e.g. STRATA_LLM__MODEL=openai/gpt-4o-mini).",
    ]
    cfg = StrataConfig()
    for key, field in StrataConfig.model_fields.items():  # the top-level settings (seed) first, each with its comment
        if not isinstance(getattr(cfg, key), BaseModel):
            lines += ["", f"# {field.description}", f"{key} = {_toml_value(getattr(cfg, key))}"]
    for section_name in StrataConfig.model_fields:
        section = getattr(cfg, section_name)
        if isinstance(section, BaseModel):
            lines += _toml_section(section_name, section)
    return "\n".join(lines + commented_toml()) + "\n"


def _toml_section(name: str, section: BaseModel, about: str | None = None) -> list[str]:
    """``[name]`` with each setting, its comment above it, then its subsections (``[llm.reports]``)."""
    lines = ["", *([f"# {about}"] if about else []), f"[{name}]"]
    subsections = []
    for key, sub in type(section).model_fields.items():
        value = getattr(section, key)
        if isinstance(value, BaseModel):
            subsections.append((f"{name}.{key}", value, sub.description))
            continue
        if isinstance(value, dict):  # a table of named entries ([llm.prompts]): written by its own module
            continue
        if sub.description:
            lines.append(f"# {sub.description}")
        line = f"{key} = {_toml_value(value)}"
        lines.append(("# " + line) if value is None else line)
    for sub_name, value, description in subsections:
        lines += _toml_section(sub_name, value, description)
    return lines
