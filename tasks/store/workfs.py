"""The run's work folder on a disk or on object storage: where a run's tasks write and read their parts (Parquet
files, NumPy arrays, pickled models), each named by a string location — a path, or a URI (``s3://bucket/key``).

Every file is written whole or not at all: on a disk under a temporary name, then renamed; on object storage in
one upload (a PUT, or a multipart upload that appears only when it completes). A task retried after its worker
died writes the same name again. Each process reaches object storage with its own environment's settings
(``storage.*`` of ``$STRATA_CONFIG``, else the usual AWS variables): credentials never travel in a task.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

Loc = str | os.PathLike[str]


def is_remote(loc: Loc) -> bool:
    """On object storage (a URI other than ``file://``) rather than a disk."""
    from tasks.store.remote import is_local

    return not is_local(str(loc))


def join(loc: Loc, *names: str) -> str:
    """``loc``'s child ``names`` (a URI stays a URI: ``Path`` would fold its ``//``)."""
    if is_remote(loc):
        return "/".join([str(loc).rstrip("/"), *names])
    return str(Path(_local(loc), *names))


def _local(loc: Loc) -> str:
    text = str(loc)
    return text[len("file://") :] if text.startswith("file://") else text


_storage: Any = None  # the run's ``storage`` settings, in the run's process (``use_storage``)


def use_storage(storage: Any) -> None:
    """This process reaches object storage with ``storage`` (the run's settings: its config file's too) rather
    than its environment's."""
    global _storage
    _storage = storage
    _s3.cache_clear()


@functools.lru_cache(maxsize=1)
def _s3() -> pafs.FileSystem:
    """This process's S3 client: the endpoint, region and credentials of the run's settings in the run's process,
    of its own environment elsewhere, with retries."""
    from tasks.store.remote import default_storage, s3_settings

    storage = _storage or default_storage()
    s3 = s3_settings(storage)
    endpoint = s3.get("endpoint")
    return pafs.S3FileSystem(
        access_key=s3.get("access_key_id"),
        secret_key=s3.get("secret_access_key"),
        session_token=s3.get("session_token"),
        region=s3.get("region"),
        endpoint_override=endpoint.split("://", 1)[-1] if endpoint else None,
        scheme="http" if endpoint and endpoint.startswith("http://") else "https",
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=storage.max_retries + 1),
        allow_delayed_open=True,  # a small file in one PUT, not a multipart upload's three requests
    )


def resolve(loc: Loc) -> tuple[pafs.FileSystem | None, str]:
    """The filesystem and path of ``loc``: None and the path for a disk (pyarrow's own local reads)."""
    if not is_remote(loc):
        return None, _local(loc)
    scheme, rest = str(loc).split("://", 1)
    if scheme not in ("s3", "s3a"):
        return pafs.FileSystem.from_uri(str(loc))  # gs://, abfs://: pyarrow's own settings
    return _s3(), rest


def mkdirs(loc: Loc) -> None:
    """``loc`` as a folder (object storage has none to make)."""
    if not is_remote(loc):
        Path(_local(loc)).mkdir(parents=True, exist_ok=True)


def exists(loc: Loc) -> bool:
    fs, path = resolve(loc)
    if fs is None:
        return os.path.exists(path)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def remove_tree(loc: Loc) -> None:
    """``loc`` and everything under it, if it exists."""
    fs, path = resolve(loc)
    if fs is None:
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError, OSError):
        fs.delete_dir(path)


def remove(loc: Loc) -> None:
    """The file ``loc``, if it exists."""
    fs, path = resolve(loc)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path) if fs is None else fs.delete_file(path)


@contextlib.contextmanager
def _whole(loc: Loc) -> Iterator[tuple[pafs.FileSystem | None, str]]:
    """Where to write ``loc`` so that it appears whole or not at all: a temporary name renamed on success (a
    disk), or the object itself (one upload; removed again if the writing failed)."""
    fs, path = resolve(loc)
    if fs is not None:
        try:
            yield fs, path
        except BaseException:  # a writer's close on the way out uploads what it had: not a file to read
            with contextlib.suppress(Exception):
                fs.delete_file(path)
            raise
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        yield None, tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_table(table: pa.Table, loc: Loc, row_group_size: int | None = None) -> None:
    """``table`` as the Parquet file ``loc``, whole or not at all."""
    with _whole(loc) as (fs, path):
        pq.write_table(table, path, row_group_size=row_group_size, filesystem=fs)


@contextlib.contextmanager
def parquet_writer(loc: Loc, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
    """A Parquet writer of ``loc`` (a row group per ``write_table``), the file whole once the block ends."""
    with _whole(loc) as (fs, path), pq.ParquetWriter(path, schema, filesystem=fs) as writer:
        yield writer


def source(loc: Loc) -> Any:
    """What ``pyarrow.parquet`` reads ``loc`` from: its path on a disk; on object storage the object opened once
    (one HEAD, then ranged GETs: a footer, the row groups read), not the dataset discovery of a URI."""
    fs, path = resolve(loc)
    return path if fs is None else fs.open_input_file(path)


def read_table(loc: Loc, **kwargs: Any) -> pa.Table:
    """``pyarrow.parquet.read_table`` of ``loc`` (columns, filters, read_dictionary as there)."""
    return pq.read_table(source(loc), **kwargs)


def read_schema(loc: Loc) -> pa.Schema:
    return pq.read_schema(source(loc))


def parquet_file(loc: Loc) -> pq.ParquetFile:
    """The Parquet file ``loc``, opened for its metadata and row groups."""
    return pq.ParquetFile(source(loc))


def save_array(x: np.ndarray, loc: Loc) -> None:
    """``x`` as the ``.npy`` file ``loc``, whole or not at all."""
    save_bytes(_npy(x), loc)


def _npy(x: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def load_array(loc: Loc) -> np.ndarray:
    import io

    return np.load(io.BytesIO(load_bytes(loc)))


def save_object(value: Any, loc: Loc) -> None:
    """``value`` pickled as ``loc``, whole or not at all."""
    save_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), loc)


def load_object(loc: Loc) -> Any:
    return pickle.loads(load_bytes(loc))


def save_bytes(data: bytes, loc: Loc) -> None:
    with _whole(loc) as (fs, path):
        if fs is None:
            Path(path).write_bytes(data)
        else:
            with fs.open_output_stream(path) as out:
                out.write(data)


def load_bytes(loc: Loc) -> bytes:
    fs, path = resolve(loc)
    if fs is None:
        return Path(path).read_bytes()
    with fs.open_input_stream(path) as src:
        return src.read()
