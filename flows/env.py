"""The offline, quiet defaults for the libraries underneath: no telemetry, no hub downloads, no cost-map fetch.

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
}


def apply_offline_defaults(environ=None) -> None:
    """Set every default the environment lacks; create the Prefect home's parents (Prefect does not)."""
    env = os.environ if environ is None else environ
    for key, value in OFFLINE_DEFAULTS.items():
        env.setdefault(key, value)
    Path(env["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
