"""What a run records about itself: its result, the code and deployment it ran under, its input digest."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schemas.tables import LayerRow


@dataclass
class BuildResult:
    run_id: str
    version: int | None
    counts: dict[str, int]
    stages: dict[str, dict[str, float]]
    status: str
    layers: list[LayerRow] = field(default_factory=list)
    layers_plot: str | None = None
    llm: dict[str, Any] = field(default_factory=dict)
    input_digest: str | None = None
    n_inputs: int = 0


def digest_of(content_hashes: list[str]) -> str:
    """The corpus's digest: of its documents' content hashes, in any order."""
    return hashlib.sha256("\n".join(sorted(content_hashes)).encode()).hexdigest()


def deployment_name() -> str | None:
    try:
        from prefect.runtime import deployment

        return deployment.name
    except Exception:  # noqa: BLE001 - not under Prefect
        return None


def code_version() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"
