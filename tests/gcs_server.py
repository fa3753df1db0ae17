"""A Google Cloud Storage stand-in for the tests of an index on gs://: objects in memory, served on 127.0.0.1 over
both of GCS's HTTP APIs as far as Strata's two clients use them, with GCS's generation preconditions.

* the XML API, which LanceDB's object_store speaks: object PUT (``x-goog-if-generation-match``; a copy with
  ``x-goog-copy-source``), GET (``Range``), HEAD, DELETE, multipart uploads, and the bucket listing
  (``list-type=2``);
* the JSON API, which google-cloud-storage speaks for the writer lock: a media or multipart upload, an object's
  metadata, its download and its delete, each with ``ifGenerationMatch`` / ``ifGenerationNotMatch``.

Why not ``gcp-storage-emulator`` (PyPI): it ignores every generation precondition (two writers would both "create"
the lock) and has no XML listing (LanceDB cannot open a table on it). The rules here are GCS's documented ones:
every write gives the object a new generation; ``ifGenerationMatch=0`` holds only where no live object is; a
failed precondition is 412 and changes nothing; a missing object is 404.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

from tests.s3_server import read_body


@dataclass
class Obj:
    data: bytes
    generation: int
    updated: datetime
    content_type: str = "application/octet-stream"

    @property
    def etag(self) -> str:
        return '"' + hashlib.md5(self.data).hexdigest() + '"'

    @property
    def md5_b64(self) -> str:
        return base64.b64encode(hashlib.md5(self.data).digest()).decode()


@dataclass
class Store:
    """Buckets of objects; every change under one lock (a precondition checked and the write done at once)."""

    buckets: dict[str, dict[str, Obj]] = field(default_factory=dict)
    uploads: dict[str, dict[int, bytes]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    generations: itertools.count = field(default_factory=lambda: itertools.count(1_700_000_000_000_001))

    def put(self, bucket: str, key: str, data: bytes, match: str | None, not_match: str | None,
            content_type: str = "application/octet-stream") -> Obj | int:
        """The new object, or the HTTP status that refuses the write (404: no bucket, 412: a precondition)."""
        with self.lock:
            objects = self.buckets.get(bucket)
            if objects is None:
                return 404
            if not self._holds(objects.get(key), match, not_match):
                return 412
            obj = objects[key] = Obj(data, next(self.generations), datetime.now(UTC), content_type)
            return obj

    def delete(self, bucket: str, key: str, match: str | None, not_match: str | None) -> int:
        with self.lock:
            objects = self.buckets.get(bucket, {})
            if key not in objects:
                return 404
            if not self._holds(objects[key], match, not_match):
                return 412
            del objects[key]
            return 204

    def get(self, bucket: str, key: str) -> Obj | None:
        with self.lock:
            return self.buckets.get(bucket, {}).get(key)

    @staticmethod
    def _holds(current: Obj | None, match: str | None, not_match: str | None) -> bool:
        generation = current.generation if current else 0
        if match is not None and int(match) != generation:
            return False
        return not (not_match is not None and int(not_match) == generation)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, store: Store):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    # ------------------------------------------------------------------ plumbing
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/xml") -> None:
        self.send_response(status)
        for k, v in {"Content-Type": content_type, **(headers or {})}.items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        if self._json_api():
            body = json.dumps({"error": {"code": status, "message": code, "errors": [{"reason": code}]}}).encode()
            self._send(status, body, content_type="application/json")
        else:
            self._send(status, f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code></Error>".encode())

    def _json_api(self) -> bool:
        return self.path.startswith(("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/"))

    def _route(self) -> None:
        body = read_body(self)
        split = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        if self._json_api():
            m = re.fullmatch(r"/(upload/|download/)?storage/v1/b/([^/]+)/o(?:/(.+))?", split.path)
            if m is None:
                return self._error(501, "NotImplemented")
            kind, bucket, key = m.group(1), m.group(2), unquote(m.group(3) or "")
            return self._json(kind or "", bucket, key, query, body)
        bucket, _, key = split.path.lstrip("/").partition("/")
        return self._xml(unquote(bucket), unquote(key), query, body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _route

    # ------------------------------------------------------------------ the XML API (object_store)
    def _object_headers(self, obj: Obj) -> dict[str, str]:
        return {
            "ETag": obj.etag,
            "Last-Modified": format_datetime(obj.updated, usegmt=True),
            "x-goog-generation": str(obj.generation),
            "x-goog-metageneration": "1",
            "x-goog-hash": f"md5={obj.md5_b64}",
        }

    def _xml(self, bucket: str, key: str, query: dict[str, str], body: bytes) -> None:
        store = self.server.store
        if bucket not in store.buckets:
            return self._error(404, "NoSuchBucket")
        match = self.headers.get("x-goog-if-generation-match")
        not_match = self.headers.get("x-goog-if-generation-not-match")
        if not key:
            if self.command == "GET" and query.get("list-type") == "2":
                return self._list(bucket, query)
            return self._error(501, "NotImplemented")
        if self.command == "POST" and "uploads" in query:
            upload = uuid.uuid4().hex
            store.uploads[upload] = {}
            return self._send(200, (
                "<?xml version='1.0' encoding='UTF-8'?><InitiateMultipartUploadResult>"
                f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key><UploadId>{upload}</UploadId>"
                "</InitiateMultipartUploadResult>").encode())
        if self.command == "PUT" and "uploadId" in query:
            parts = store.uploads.get(query["uploadId"])
            if parts is None:
                return self._error(404, "NoSuchUpload")
            parts[int(query["partNumber"])] = body
            return self._send(200, headers={"ETag": '"' + hashlib.md5(body).hexdigest() + '"'})
        if self.command == "POST" and "uploadId" in query:
            parts = store.uploads.pop(query["uploadId"], None)
            if parts is None:
                return self._error(404, "NoSuchUpload")
            numbers = [int(n) for n in re.findall(r"<PartNumber>(\d+)</PartNumber>", body.decode())]
            return self._write(bucket, key, b"".join(parts[n] for n in numbers), match, not_match)
        if self.command == "DELETE" and "uploadId" in query:
            store.uploads.pop(query["uploadId"], None)
            return self._send(204)
        if self.command == "PUT":
            source = self.headers.get("x-goog-copy-source")
            if source:
                src_bucket, _, src_key = unquote(source).lstrip("/").partition("/")
                src = store.get(src_bucket, src_key)
                if src is None:
                    return self._error(404, "NoSuchKey")
                body = src.data
            return self._write(bucket, key, body, match, not_match)
        if self.command == "DELETE":
            status = store.delete(bucket, key, match, not_match)
            return self._send(status) if status == 204 else self._error(status, "NoSuchKey")
        obj = store.get(bucket, key)
        if obj is None:
            return self._error(404, "NoSuchKey")
        if self.command == "HEAD":
            return self._send(200, headers={**self._object_headers(obj), "Content-Length": str(len(obj.data))},
                              content_type=obj.content_type)
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if ranged is None:
            return self._send(200, obj.data, self._object_headers(obj), obj.content_type)
        size = len(obj.data)
        start_s, end_s = ranged.groups()
        start, end = (int(start_s), min(int(end_s or size - 1), size - 1)) if start_s else (size - int(end_s), size - 1)
        if start >= size:
            return self._error(416, "InvalidRange")
        headers = {**self._object_headers(obj), "Content-Range": f"bytes {start}-{end}/{size}"}
        return self._send(206, obj.data[start:end + 1], headers, obj.content_type)

    def _write(self, bucket: str, key: str, data: bytes, match: str | None, not_match: str | None) -> None:
        result = self.server.store.put(bucket, key, data, match, not_match,
                                       self.headers.get("Content-Type", "application/octet-stream"))
        if isinstance(result, int):
            return self._error(result, "PreconditionFailed" if result == 412 else "NoSuchBucket")
        return self._send(200, headers=self._object_headers(result))

    def _list(self, bucket: str, query: dict[str, str]) -> None:
        prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
        start = query.get("continuation-token") or query.get("start-after", "")
        with self.server.store.lock:
            objects = sorted(self.server.store.buckets[bucket].items())
        contents, prefixes = [], []
        for key, obj in objects:
            if not key.startswith(prefix) or key <= start:
                continue
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0] + delimiter
                if common not in prefixes:
                    prefixes.append(common)
                continue
            contents.append(
                f"<Contents><Key>{escape(key)}</Key><Size>{len(obj.data)}</Size>"
                f"<LastModified>{obj.updated.isoformat().replace('+00:00', 'Z')}</LastModified>"
                f"<ETag>{escape(obj.etag)}</ETag></Contents>"
            )
        common_xml = "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
        xml = (
            "<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>"
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(contents)}</KeyCount>"
            f"<IsTruncated>false</IsTruncated>{''.join(contents)}{common_xml}</ListBucketResult>"
        )
        self._send(200, xml.encode())

    # ------------------------------------------------------------------ the JSON API (google-cloud-storage)
    def _resource(self, bucket: str, key: str, obj: Obj) -> dict[str, str]:
        host = f"http://{self.headers.get('Host', '127.0.0.1')}"
        return {
            "kind": "storage#object",
            "bucket": bucket,
            "name": key,
            "generation": str(obj.generation),
            "metageneration": "1",
            "size": str(len(obj.data)),
            "contentType": obj.content_type,
            "md5Hash": obj.md5_b64,
            "etag": obj.etag.strip('"'),
            "updated": obj.updated.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "timeCreated": obj.updated.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "mediaLink": f"{host}/download/storage/v1/b/{bucket}/o/{quote(key, safe='')}"
                         f"?generation={obj.generation}&alt=media",
        }

    def _json(self, kind: str, bucket: str, key: str, query: dict[str, str], body: bytes) -> None:
        store = self.server.store
        match, not_match = query.get("ifGenerationMatch"), query.get("ifGenerationNotMatch")
        if kind == "upload/" and self.command == "POST":
            if query.get("uploadType") == "multipart":
                boundary = self.headers.get_content_type() and self.headers.get_param("boundary")
                parts = body.split(b"--" + str(boundary).encode())
                meta_raw, data_raw = parts[1].split(b"\r\n\r\n", 1)[1], parts[2].split(b"\r\n\r\n", 1)[1]
                meta = json.loads(meta_raw.strip())
                key, data = meta["name"], data_raw[: -2] if data_raw.endswith(b"\r\n") else data_raw
                content_type = meta.get("contentType", "application/octet-stream")
            elif query.get("uploadType") == "media":
                key, data, content_type = query["name"], body, self.headers.get("Content-Type", "")
            else:
                return self._error(501, "NotImplemented")
            result = store.put(bucket, key, data, match, not_match, content_type or "application/octet-stream")
            if isinstance(result, int):
                return self._error(result, "conditionNotMet" if result == 412 else "notFound")
            return self._send(200, json.dumps(self._resource(bucket, key, result)).encode(),
                              content_type="application/json")
        if not key:
            return self._error(501, "NotImplemented")
        if self.command == "DELETE":
            status = store.delete(bucket, key, match, not_match)
            return self._send(204) if status == 204 else self._error(status, "conditionNotMet" if status == 412
                                                                        else "notFound")
        obj = store.get(bucket, key)
        wanted = query.get("generation")
        if obj is None or (wanted and int(wanted) != obj.generation):
            return self._error(404, "notFound")
        if not Store._holds(obj, match, not_match):
            return self._error(412, "conditionNotMet")
        if kind == "download/" or query.get("alt") == "media":
            return self._send(200, obj.data, self._object_headers(obj), obj.content_type)
        return self._send(200, json.dumps(self._resource(bucket, key, obj)).encode(), content_type="application/json")


@dataclass
class GCSServer:
    """The store and its server; ``endpoint`` is what clients are given (``key_json`` for LanceDB and the lock)."""

    store: Store
    server: _Server

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_bucket(self, name: str) -> str:
        with self.store.lock:
            self.store.buckets.setdefault(name, {})
        return name

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        with self.store.lock:
            return sorted(k for k in self.store.buckets.get(bucket, {}) if k.startswith(prefix))

    def options(self, endpoint: str = "") -> dict[str, str]:
        """``storage.options`` for a gs:// index on this server (or on ``endpoint``, a proxy in front of it): a
        service-account key that object_store reads as an emulator's (``gcs_base_url``, ``disable_oauth``), read
        the same way by the writer lock."""
        key = {
            "gcs_base_url": endpoint or self.endpoint,
            "disable_oauth": True,
            "client_email": "",  # object_store reads a service-account key: these fields must be there
            "private_key": "",
            "private_key_id": "",
        }
        return {"google_service_account_key": json.dumps(key), "allow_http": "true"}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_gcs_server() -> GCSServer:
    store = Store()
    server = _Server(store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return GCSServer(store, server)
