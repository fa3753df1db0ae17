"""An index on object storage: LanceDB's storage options from ``storage.*`` settings and the usual environment,
which store errors are transient (retried), and the writer lease — one writer per index, held by an object
written with a conditional put and renewed while the run lasts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tasks.errors import LockTimeout

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


def _default_storage() -> StorageConfig:
    """The ``storage`` settings of ``$STRATA_CONFIG`` and the environment (``STRATA_STORAGE__*``), for a catalog
    opened without a loaded config (``validate``, ``export``, ``rollback``, ``gc``)."""
    from schemas.config import load_config

    return load_config().storage


# ---------------------------------------------------------------------------- the writer lock on S3
def _s3_client(storage: StorageConfig) -> Any:
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


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


#: a conditional write that did not hold (412), or one racing another conditional write on the key (409)
_CONFLICT = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")


_GONE = ("NoSuchKey", "404", "NotFound")


class S3Lease:
    """One writer per s3:// index: the object ``<prefix>/.writer.lock``, naming its holder. It is created with a
    conditional put (``If-None-Match: *``: of two writers, exactly one creates it) and rewritten every third of
    ``storage.lock_ttl_s`` (a heartbeat, ``If-Match`` its own ETag). A lock not rewritten for ``lock_ttl_s`` by the
    store's clock is stale: the next writer takes it over with ``If-Match`` on the stale ETag (again one wins). It is
    deleted at the end; a holder that lost it (stalled past the expiry) is refused at its commit."""

    def __init__(self, uri: str, storage: StorageConfig, client: Any = None):
        bucket, _, prefix = uri.split("://", 1)[1].partition("/")
        self.uri, self.bucket, self.ttl = uri, bucket, storage.lock_ttl_s
        self.key = (prefix.strip("/") + "/" if prefix.strip("/") else "") + ".writer.lock"
        self.token = uuid.uuid4().hex
        self.holder = f"pid {os.getpid()} on {socket.gethostname()}"
        self.since = ""
        self.etag: str | None = None
        self.lost: str | None = None
        self.renewed = 0.0
        self.client = client or _s3_client(storage)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def _put(self, **condition: str) -> str:
        body = json.dumps({"holder": self.holder, "since": self.since, "token": self.token, "ttl_s": self.ttl})
        etag = self.client.put_object(
            Bucket=self.bucket, Key=self.key, Body=body.encode(), ContentType="application/json", **condition
        )["ETag"]
        self.renewed = time.monotonic()
        return etag

    def _read(self) -> tuple[str, dict[str, Any], float] | None:
        """The lock's ETag, its content and its age (seconds since it was last written, by the store's clock)."""
        from email.utils import parsedate_to_datetime

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) in _GONE:
                return None
            raise
        try:
            body = json.loads(resp["Body"].read() or b"{}")
        except ValueError:
            body = {}
        date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date) if date else datetime.now(UTC)
        return resp["ETag"], body, (now - resp["LastModified"]).total_seconds()

    def _try(self) -> str | None:
        """Take the lock: None when taken, else who holds it ("" to try again at once)."""
        try:
            self.etag = self._put(IfNoneMatch="*")
            return None
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) not in _CONFLICT:
                raise
        current = self._read()
        if current is None:
            return ""  # released meanwhile
        etag, body, age = current
        if body.get("token") == self.token:  # our own put, applied though its answer was lost and retried
            self.etag = etag
            return None
        holder = f"{body.get('holder', 'another writer')} since {body.get('since', '?')}"
        if age <= self.ttl:
            return (
                f"{holder} (lock {self.location}, renewed {max(age, 0):.0f}s ago; taken over once not renewed "
                f"for {self.ttl:.0f}s)"
            )
        try:  # stale: take it over, unless another writer renewed it or took it over meanwhile
            self.etag = self._put(IfMatch=etag)
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) not in _CONFLICT + _GONE:
                raise
            return ""
        import logging

        logging.getLogger(__name__).warning(
            "took over the writer lock %s of %s: not renewed for %.0fs", self.location, holder, age
        )
        return None

    def acquire(self, timeout_s: float = 0.0) -> None:
        deadline = time.monotonic() + timeout_s
        self.since = datetime.now(UTC).isoformat(timespec="seconds")
        while (holder := self._try()) is not None:
            if holder and time.monotonic() >= deadline:
                raise LockTimeout(
                    f"index {self.uri} is being written by {holder}; waited {timeout_s:.0f}s "
                    "(raise --lock-timeout to wait longer)"
                )
            time.sleep(0.05 if not holder else min(0.5, max(0.05, deadline - time.monotonic())))
        self._thread = threading.Thread(target=self._heartbeat, name="strata-writer-lock", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.etag = self._put(IfMatch=self.etag or "*")
            except Exception as exc:  # noqa: BLE001
                if _error_code(exc) not in _CONFLICT + _GONE:
                    continue  # the store is unreachable beyond the client's retries: again at the next beat
                current = self._read()
                if current is not None and current[1].get("token") == self.token:
                    self.etag = current[0]  # our own renewal, applied though its answer was lost
                    continue
                taker = current[1].get("holder", "another writer") if current else "nobody (deleted)"
                self.lost = f"the lock {self.location} was taken over by {taker}"
                return

    def check(self) -> None:
        """Refuse when the lock may no longer be ours: taken over, or not renewed for its whole lifetime."""
        if self.lost is None and time.monotonic() - self.renewed > self.ttl:
            self.lost = f"the lock {self.location} was not renewed for {time.monotonic() - self.renewed:.0f}s"
        if self.lost is not None:
            raise LockTimeout(
                f"lost the writer lock of {self.uri}: {self.lost}; nothing was committed by this run, run it again"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.lost is not None:
            return
        try:
            current = self._read()
            if current is not None and current[1].get("token") == self.token:
                self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=current[0])
        except Exception as exc:  # noqa: BLE001 - it expires after lock_ttl_s anyway
            import logging

            logging.getLogger(__name__).warning(
                "could not release the writer lock %s (%s): it expires after %.0fs",
                self.location,
                _error_code(exc) or type(exc).__name__,
                self.ttl,
            )
