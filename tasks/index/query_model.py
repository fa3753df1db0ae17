"""The ONNX export that questions are embedded with, made by the build that first needs it on a machine (so that
the first query after a build does not pay for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schemas.config import EmbeddingConfig
from tasks.index import embed


def query_model_missing(cfg: EmbeddingConfig) -> bool:
    """Whether questions on this machine would first have to export the packaged model to ONNX
    (``question_embedder``: ONNX Runtime even where the build embedded with PyTorch)."""
    return (
        cfg.model == embed.LOCAL_MODEL
        and cfg.runtime == "auto"
        and not embed._local(32, "fp32", "onnx").onnx_path().exists()
    )


def export_query_model(built_with: Any = None) -> Path:
    """The ONNX export questions are embedded with, made now: from ``built_with`` (a ``LocalEmbedder`` whose PyTorch
    model the build loaded) when given, else from the packaged weights loaded for it. The build that first needs
    the model makes it, so that the first query after a build does not (an export costs seconds and ~1 GB)."""
    onnx = embed._local(32, "fp32", "onnx")
    path = onnx.onnx_path()
    if not path.exists():
        model = getattr(built_with, "_model", None)
        embed.export_onnx(model if model is not None else onnx._load(), path)
        onnx._model = None
    return path
