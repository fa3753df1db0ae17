"""Strata flows (Prefect) and the ``strata`` CLI.

Importing this package sets the offline/quiet defaults for the libraries underneath
(only where the user has not set them): no telemetry, no hub downloads, no cost-map fetch.
"""

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
for _k, _v in OFFLINE_DEFAULTS.items():
    os.environ.setdefault(_k, _v)
# Prefect creates its home but not the parents of it
Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
