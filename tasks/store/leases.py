"""The writer lease of an index on object storage: one writer per index, held by an object written with a
conditional write and renewed while the run lasts.

One protocol (``Lease``) over each store's conditional writes:

* s3:// (and any S3-compatible endpoint): ``If-None-Match: *`` creates, ``If-Match: <ETag>`` replaces and deletes
  (``S3Lease``);
* az:// and abfs[s]:// (Azure Blob Storage, Azurite): the same HTTP preconditions on the Blob service
  (``AzureLease``);
* gs:// (Google Cloud Storage): generation preconditions, ``ifGenerationMatch=0`` creates, ``ifGenerationMatch=<the
  generation>`` replaces and deletes (``GCSLease``); the object's generation is its ETag here.

The object ``<prefix>/.writer.lock`` names its holder. Of two writers creating it, exactly one succeeds; the holder
rewrites it every third of ``storage.lock_ttl_s`` (a heartbeat, conditional on its own ETag). A lock not rewritten
for ``lock_ttl_s`` by the store's clock is stale: the next writer takes it over with a write conditional on the
stale ETag (again exactly one wins). It is deleted at the end; a holder that lost it (stalled past the expiry) is
refused at its commit (``check``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.errors import LockTimeout, UsageError
from tasks.store.remote import s3_client

if TYPE_CHECKING:
    from schemas.config import StorageConfig

log = logging.getLogger(__name__)


class Conflict(Exception):
    """A conditional write that did not hold: the object exists (create), or has another ETag (replace)."""


class Gone(Exception):
    """The object is not there."""


class Lease:
    """The protocol of the module docstring; a store's subclass says how to create, replace, read and delete the
    lock object (``_create``, ``_replace``, ``_read``, ``_delete``), raising ``Conflict`` / ``Gone``."""

    location = ""

    def __init__(self, uri: str, storage: StorageConfig):
        self.uri, self.ttl = uri, storage.lock_ttl_s
        self.token = uuid.uuid4().hex
        self.holder = f"pid {os.getpid()} on {socket.gethostname()}"
        self.since = ""
        self.etag: str | None = None
        self.lost: str | None = None
        self.renewed = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ what a store provides
    def _create(self, body: bytes) -> str:
        """Write the object where none is (``Conflict`` otherwise); its ETag."""
        raise NotImplementedError

    def _replace(self, body: bytes, etag: str) -> str:
        """Rewrite the object whose ETag is ``etag`` (``Conflict``: another one; ``Gone``: none); its new ETag."""
        raise NotImplementedError

    def _read(self) -> tuple[str, dict[str, Any], float] | None:
        """The object's ETag, its content and its age (seconds since it was last written, by the store's clock)."""
        raise NotImplementedError

    def _delete(self, etag: str) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ the protocol
    def _write(self, etag: str | None) -> str:
        """Create the object (``etag`` None) or replace the one with ``etag``; ``renewed`` is when the write that
        held was sent (what the store's clock ages it from, at the latest)."""
        sent = time.monotonic()
        body = json.dumps({"holder": self.holder, "since": self.since, "token": self.token, "ttl_s": self.ttl})
        new = self._create(body.encode()) if etag is None else self._replace(body.encode(), etag)
        self.renewed = sent
        return new

    def _try(self) -> str | None:
        """Take the lock: None when taken, else who holds it ("" to try again at once)."""
        try:
            self.etag = self._write(None)
            return None
        except Conflict:
            pass
        current = self._read()
        if current is None:
            return ""  # released meanwhile
        etag, body, age = current
        if body.get("token") == self.token:  # our own write, applied though its answer was lost and retried
            self.etag, self.renewed = etag, time.monotonic() - max(age, 0)
            return None
        holder = f"{body.get('holder', 'another writer')} since {body.get('since', '?')}"
        if age <= self.ttl:
            return (
                f"{holder} (lock {self.location}, renewed {max(age, 0):.0f}s ago; taken over once not renewed "
                f"for {self.ttl:.0f}s)"
            )
        try:  # stale: take it over, unless another writer renewed it or took it over meanwhile
            self.etag = self._write(etag)
        except (Conflict, Gone):
            return ""
        log.warning("took over the writer lock %s of %s: not renewed for %.0fs", self.location, holder, age)
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
                self.etag = self._write(self.etag or "*")
            except (Conflict, Gone):
                current = self._read()
                if current is not None and current[1].get("token") == self.token:
                    # our own renewal, applied though its answer was lost: renewed when the store says
                    self.etag, self.renewed = current[0], time.monotonic() - max(current[2], 0)
                    continue
                taker = current[1].get("holder", "another writer") if current else "nobody (deleted)"
                self.lost = f"the lock {self.location} was taken over by {taker}"
                return
            except Exception:  # noqa: BLE001 - the store is unreachable beyond the client's retries: next beat
                continue

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
                self._delete(current[0])
        except Exception as exc:  # noqa: BLE001 - it expires after lock_ttl_s anyway
            log.warning(
                "could not release the writer lock %s (%s): it expires after %.0fs",
                self.location,
                type(exc).__name__,
                self.ttl,
            )


def _lock_key(prefix: str) -> str:
    return (prefix.strip("/") + "/" if prefix.strip("/") else "") + ".writer.lock"


def _body_of(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


# ---------------------------------------------------------------------------------------------------- S3
def _s3_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


#: a conditional write that did not hold (412), or one racing another conditional write on the key (409)
_S3_CONFLICT = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
_S3_GONE = ("NoSuchKey", "404", "NotFound")


class S3Lease(Lease):
    """The lease on an s3:// index (boto3, the index's endpoint, region, credentials and retries)."""

    def __init__(self, uri: str, storage: StorageConfig, client: Any = None):

        super().__init__(uri, storage)
        self.bucket, _, prefix = uri.split("://", 1)[1].partition("/")
        self.key = _lock_key(prefix)
        self.location = f"s3://{self.bucket}/{self.key}"
        self.client = client or s3_client(storage)

    def _put(self, body: bytes, **condition: str) -> str:
        try:
            return str(
                self.client.put_object(
                    Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json", **condition
                )["ETag"]
            )
        except Exception as exc:
            code = _s3_code(exc)
            if code in _S3_CONFLICT:
                raise Conflict(code) from exc
            if code in _S3_GONE:
                raise Gone(code) from exc
            raise

    def _create(self, body: bytes) -> str:
        return self._put(body, IfNoneMatch="*")

    def _replace(self, body: bytes, etag: str) -> str:
        return self._put(body, IfMatch=etag)

    def _read(self) -> tuple[str, dict[str, Any], float] | None:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as exc:  # noqa: BLE001
            if _s3_code(exc) in _S3_GONE:
                return None
            raise
        body = _body_of(resp["Body"].read())
        date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date) if date else datetime.now(UTC)
        return resp["ETag"], body, (now - resp["LastModified"]).total_seconds()

    def _delete(self, etag: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag)


# ------------------------------------------------------------------------------------------------- Azure
#: Azurite's well-known development account (``azure_storage_use_emulator``), as object_store uses it
_EMULATOR_ACCOUNT = "devstoreaccount1"
_EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azure_location(uri: str) -> tuple[str, str | None, str]:
    """(container, account or None, prefix) of an ``az://container/prefix``, ``azure://…`` or
    ``abfs[s]://container@account.dfs.core.windows.net/prefix`` URI."""
    rest = uri.split("://", 1)[1]
    head, _, prefix = rest.partition("/")
    container, at, host = head.partition("@")
    return container, (host.split(".", 1)[0] if at else None), prefix


def _azure_client(uri: str, storage: StorageConfig, environ: dict[str, str] | None = None) -> Any:
    """A Blob client for the lock object of an Azure index, from the settings LanceDB is given (``storage.options``:
    ``azure_storage_account_name`` / ``_account_key`` / ``_sas_token`` / ``_endpoint`` / ``_use_emulator``),
    else the usual AZURE_STORAGE_* variables; the same retries as the index's requests."""
    from azure.storage.blob import BlobServiceClient

    env = os.environ if environ is None else environ
    opts = {k.lower(): v.get_secret_value() for k, v in storage.options.items()}

    def setting(name: str) -> str:
        return (
            opts.get(f"azure_storage_{name}")
            or opts.get(f"azure_{name}")
            or env.get(f"AZURE_STORAGE_{name.upper()}", "")
        )

    container, account, prefix = azure_location(uri)
    emulator = setting("use_emulator").lower() in ("true", "1")
    account = setting("account_name") or account or (_EMULATOR_ACCOUNT if emulator else "")
    if not account:
        raise UsageError(
            f"no Azure storage account for {uri}: set storage.options.azure_storage_account_name "
            "(or $AZURE_STORAGE_ACCOUNT_NAME), or name it in the URI (abfss://container@account.dfs.core.windows.net/…)"
        )
    endpoint = setting("endpoint") or (
        f"{env.get('AZURITE_BLOB_STORAGE_URL', 'http://127.0.0.1:10000').rstrip('/')}/{account}"
        if emulator
        else f"https://{account}.blob.core.windows.net"
    )
    key = setting("account_key") or (_EMULATOR_KEY if emulator else "")
    credential: Any = {"account_name": account, "account_key": key} if key else (setting("sas_token") or None)
    if credential is None:
        raise UsageError(
            f"no credential for the writer lock of {uri}: set storage.options.azure_storage_account_key or "
            'azure_storage_sas_token (or $AZURE_STORAGE_ACCOUNT_KEY / $AZURE_STORAGE_SAS_TOKEN), or storage.writer_lock = "off"'
        )
    service = BlobServiceClient(
        endpoint, credential=credential, retry_total=storage.max_retries, connection_timeout=5, read_timeout=30
    )
    return service.get_blob_client(container, _lock_key(prefix))


class AzureLease(Lease):
    """The lease on an az:// or abfs[s]:// index (Azure Blob Storage's ETag preconditions, as on S3)."""

    def __init__(self, uri: str, storage: StorageConfig, client: Any = None):
        super().__init__(uri, storage)
        self.client = client or _azure_client(uri, storage)
        self.location = f"{uri.split('://', 1)[0]}://{self.client.container_name}/{self.client.blob_name}"

    def _upload(self, body: bytes, **condition: Any) -> str:
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        try:
            return str(self.client.upload_blob(body, **condition)["etag"])
        except (ResourceExistsError, ResourceModifiedError) as exc:
            raise Conflict(str(getattr(exc, "error_code", ""))) from exc
        except ResourceNotFoundError as exc:
            raise Gone(str(getattr(exc, "error_code", ""))) from exc

    def _create(self, body: bytes) -> str:
        return self._upload(body, overwrite=False)  # If-None-Match: *

    def _replace(self, body: bytes, etag: str) -> str:
        from azure.core import MatchConditions

        if etag == "*":
            return self._upload(body, overwrite=True, etag="*", match_condition=MatchConditions.IfPresent)
        return self._upload(body, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified)

    def _read(self) -> tuple[str, dict[str, Any], float] | None:
        from azure.core.exceptions import ResourceNotFoundError

        dates: list[str] = []
        hook = lambda r: dates.append(r.http_response.headers.get("Date", ""))  # noqa: E731 - the store's clock
        try:
            blob = self.client.download_blob(raw_response_hook=hook)
        except ResourceNotFoundError:
            return None
        body = _body_of(blob.readall())
        now = parsedate_to_datetime(dates[0]) if dates and dates[0] else datetime.now(UTC)
        return str(blob.properties.etag), body, (now - blob.properties.last_modified).total_seconds()

    def _delete(self, etag: str) -> None:
        from azure.core import MatchConditions

        self.client.delete_blob(etag=etag, match_condition=MatchConditions.IfNotModified)


# --------------------------------------------------------------------------------------------------- GCS
_GCS_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


def _gcs_setting(opts: dict[str, str], env: Any, names: tuple[str, ...], variable: str) -> str:
    """A GCS setting by any of object_store's names for it in ``storage.options``, else its GOOGLE_* variable."""
    return next((opts[n] for n in names if opts.get(n)), "") or env.get(variable, "")


def _gcs_bucket(uri: str, storage: StorageConfig, environ: dict[str, str] | None = None) -> Any:
    """The bucket of a gs:// index, for its lock object, reached with the settings LanceDB is given
    (``storage.options``: ``google_service_account_key`` (the key's JSON), ``google_service_account`` (its path) or
    ``google_application_credentials``, else the GOOGLE_* variables, else the machine's application default
    credentials). A key with ``gcs_base_url`` and ``disable_oauth`` (how object_store reaches an emulator)
    is read the same way here."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError
    from google.cloud import storage as gcs

    env = os.environ if environ is None else environ
    opts = {k.lower(): v.get_secret_value() for k, v in storage.options.items()}
    key = _gcs_setting(opts, env, ("google_service_account_key", "service_account_key"), "GOOGLE_SERVICE_ACCOUNT_KEY")
    path = _gcs_setting(
        opts,
        env,
        ("google_service_account", "service_account", "google_service_account_path", "service_account_path"),
        "GOOGLE_SERVICE_ACCOUNT",
    ) or _gcs_setting(opts, env, ("google_application_credentials",), "GOOGLE_APPLICATION_CREDENTIALS")
    try:
        info = json.loads(key) if key else (json.loads(Path(path).read_text()) if path else None)
    except (OSError, ValueError) as exc:
        raise UsageError(f"the GCS service-account key of {uri} cannot be read ({exc})") from exc
    try:
        if info is not None and info.get("disable_oauth"):
            credentials: Any = AnonymousCredentials()
        elif info is not None:
            credentials, _ = google.auth.load_credentials_from_dict(info, scopes=[_GCS_SCOPE])
        else:
            credentials, _ = google.auth.default(scopes=[_GCS_SCOPE])
    except (DefaultCredentialsError, ValueError) as exc:
        raise UsageError(
            f"no credential for the writer lock of {uri}: set storage.options.google_service_account (a key file) "
            "or $GOOGLE_APPLICATION_CREDENTIALS, run where application default credentials exist, or set "
            f'storage.writer_lock = "off" ({exc})'
        ) from exc
    endpoint = (info or {}).get("gcs_base_url")
    client = gcs.Client(
        project=(info or {}).get("project_id") or "strata",
        credentials=credentials,
        client_options={"api_endpoint": endpoint} if endpoint else None,
    )
    return client.bucket(uri.split("://", 1)[1].partition("/")[0])


class GCSLease(Lease):
    """The lease on a gs:// index (Google Cloud Storage's generation preconditions; the generation is the ETag).
    Requests are retried on 429, 5xx and dropped connections for up to ``storage.retry_timeout_s``, as LanceDB's
    are; every write carries a precondition, so a retried one cannot overwrite another writer's."""

    def __init__(self, uri: str, storage: StorageConfig):
        from google.cloud.storage.retry import DEFAULT_RETRY

        super().__init__(uri, storage)
        self.bucket = _gcs_bucket(uri, storage)
        self.key = _lock_key(uri.split("://", 1)[1].partition("/")[2])
        self.location = f"gs://{self.bucket.name}/{self.key}"
        self.calls: dict[str, Any] = {"retry": DEFAULT_RETRY.with_timeout(storage.retry_timeout_s), "timeout": (5, 30)}
        self._dates = threading.local()
        session = self.bucket.client._http  # the store's clock: the Date of the last answer in this thread
        session.hooks["response"].append(lambda r, *a, **k: setattr(self._dates, "last", r.headers.get("Date", "")))

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from google.api_core.exceptions import Conflict as Conflict409
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            return fn(*args, **kwargs, **self.calls)
        except (PreconditionFailed, Conflict409) as exc:
            raise Conflict(str(exc.code)) from exc
        except NotFound as exc:
            raise Gone(str(exc.code)) from exc

    def _upload(self, body: bytes, **condition: int) -> str:
        blob = self.bucket.blob(self.key)
        self._call(blob.upload_from_string, body, content_type="application/json", **condition)
        return str(blob.generation)

    def _create(self, body: bytes) -> str:
        return self._upload(body, if_generation_match=0)

    def _replace(self, body: bytes, etag: str) -> str:
        if etag == "*":
            return self._upload(body, if_generation_not_match=0)  # whatever generation, but one that exists
        return self._upload(body, if_generation_match=int(etag))

    def _read(self) -> tuple[str, dict[str, Any], float] | None:
        self._dates.last = ""
        blob = self._call(self.bucket.get_blob, self.key)
        if blob is None:
            return None
        date = self._dates.last
        try:  # that generation's content (a newer one is another write: read again next time)
            raw = self._call(blob.download_as_bytes, checksum=None)
        except Gone:
            return None
        now = parsedate_to_datetime(date) if date else datetime.now(UTC)
        return str(blob.generation), _body_of(raw), (now - blob.updated).total_seconds()

    def _delete(self, etag: str) -> None:
        self._call(self.bucket.blob(self.key).delete, if_generation_match=int(etag))


def lease_for(uri: str, storage: StorageConfig) -> Lease | None:
    """The lease class of ``uri``'s store, None for a store without one."""
    scheme = uri.split("://", 1)[0].lower()
    if scheme in ("s3", "s3a"):
        return S3Lease(uri, storage)
    if scheme in ("az", "azure", "abfs", "abfss"):
        return AzureLease(uri, storage)
    if scheme == "gs":
        return GCSLease(uri, storage)
    return None
