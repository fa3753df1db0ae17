"""An index on object storage: LanceDB's storage options from ``storage.*`` settings and the usual environment,
and which store errors are transient (retried). The writer lease is ``tasks.store.leases``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from schemas.config import load_config

if TYPE_CHECKING:
    from schemas.config import StorageConfig


#: attempts at one table write or snapshot commit of a remote index. object_store retries each request with backoff
#: (``storage.max_retries``), but not a commit whose connection dropped before the store got it: Lance then fails
#: the write, which left nothing behind (the next attempt starts again from the pinned version)
STORE_ATTEMPTS = 4


_TRANSIENT = (
    "error sending request",
    "Commit result for version",
    "connection",
    "Connection",
    "SlowDown",
    "503",
    "timed out",
    "reset by peer",
    "Broken pipe",
)


def _disk_full(exc: BaseException) -> bool:
    import errno

    return (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or "No space left on device" in str(exc)


def _transient(exc: BaseException) -> bool:
    return any(s in str(exc) for s in _TRANSIENT)


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


def is_local(uri: str) -> bool:
    """A folder (a path, or a ``file://`` URI) rather than object storage."""
    return "://" not in uri or uri.startswith("file://")


def s3_settings(storage: StorageConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Endpoint, region and credentials of an s3:// index: each ``storage.*`` setting, else its usual AWS variable
    (absent keys: the SDK's own chain decides, e.g. an instance role)."""
    env = os.environ if environ is None else environ
    values = {
        "endpoint": storage.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
        "region": storage.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        "access_key_id": _secret(storage.access_key_id) or env.get("AWS_ACCESS_KEY_ID"),
        "secret_access_key": _secret(storage.secret_access_key) or env.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": _secret(storage.session_token) or env.get("AWS_SESSION_TOKEN"),
    }
    return {k: v for k, v in values.items() if v}


def storage_options(uri: str, storage: StorageConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """LanceDB's ``storage_options`` for a remote index: object_store's client retries (with exponential backoff,
    on 429/503 SlowDown, 5xx and dropped connections), and for s3:// the endpoint, region and credentials. Holds
    secrets: never logged, never stored."""
    opts = {"client_max_retries": str(storage.max_retries), "client_retry_timeout": str(storage.retry_timeout_s)}
    if uri.startswith(("s3://", "s3a://")):
        s3 = s3_settings(storage, environ)
        for key, option in (
            ("endpoint", "aws_endpoint"),
            ("region", "aws_region"),
            ("access_key_id", "aws_access_key_id"),
            ("secret_access_key", "aws_secret_access_key"),
            ("session_token", "aws_session_token"),
        ):
            if key in s3:
                opts[option] = s3[key]
        if s3.get("endpoint", "").startswith("http://"):
            opts["allow_http"] = "true"
    opts.update({k: v.get_secret_value() for k, v in storage.options.items()})
    return opts


def default_storage() -> StorageConfig:
    """The ``storage`` settings of ``$STRATA_CONFIG`` and the environment (``STRATA_STORAGE__*``), for a catalog
    opened without a loaded config (``validate``, ``export``, ``rollback``, ``gc``)."""

    return load_config().storage


# ---------------------------------------------------------------------------- an S3 client of the index's own
def s3_client(storage: StorageConfig) -> Any:
    """A boto3 S3 client for the lock object: the index's endpoint, region and credentials, and the same retries
    (standard mode: 503 SlowDown, 5xx and dropped connections, with backoff)."""
    import boto3
    from botocore.config import Config

    s3 = s3_settings(storage)
    return boto3.client(
        "s3",
        endpoint_url=s3.get("endpoint"),
        region_name=s3.get("region"),
        aws_access_key_id=s3.get("access_key_id"),
        aws_secret_access_key=s3.get("secret_access_key"),
        aws_session_token=s3.get("session_token"),
        config=Config(
            retries={"max_attempts": storage.max_retries + 1, "mode": "standard"}, connect_timeout=5, read_timeout=30
        ),
    )
