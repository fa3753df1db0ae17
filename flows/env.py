"""The offline, quiet defaults for the libraries underneath: no telemetry, no hub downloads, no cost-map fetch,
freed memory returned to the system.

Applied (only where the user has not set them) by the CLI entry point, the flows and the test
configuration; importing a Strata module never changes the environment.
"""

from __future__ import annotations

import os
from pathlib import Path

OFFLINE_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_HOME": str(Path.home() / ".strata" / "prefect"),
    "GX_ANALYTICS_ENABLED": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    # Lance's own log at its default level writes a WARN line for every table a build's fragments create ("No
    # existing dataset ... it will be created"): errors only
    "LANCE_LOG": "error",
    # polars' jemalloc hands freed pages back to the system within 0.1 s instead of keeping them for reuse: the
    # merge's transient frames otherwise stay in the RSS of every later stage, at the same speed (docs/benchmarks.md,
    # "Figures once in code comments"). Read when polars loads, so it must be set before.
    "_RJEM_MALLOC_CONF": "background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0",
}


def apply_offline_defaults(environ=None) -> None:
    """Set every default the environment lacks; create the Prefect home's parents (Prefect does not)."""
    env = os.environ if environ is None else environ
    for key, value in OFFLINE_DEFAULTS.items():
        env.setdefault(key, value)
    Path(env["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
