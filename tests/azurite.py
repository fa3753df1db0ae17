"""Azurite, Azure Storage's emulator, for the tests of an index on az://: its Blob service in memory on a free port.

Installed with npm from the registry the first time (a pinned version, into a cache folder outside the repo), then
reused; a machine without npm cannot run these tests and says so.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

AZURITE_VERSION = "3.37.0"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class Azurite:
    process: subprocess.Popen
    endpoint: str  # http://127.0.0.1:PORT/devstoreaccount1
    port: int

    def options(self, endpoint: str = "") -> dict[str, str]:
        """``storage.options`` for an az:// index on this emulator (what LanceDB and the writer lock both read), or
        on ``endpoint`` (a proxy in front of it)."""
        return {
            "azure_storage_account_name": ACCOUNT,
            "azure_storage_account_key": KEY,
            "azure_storage_endpoint": endpoint or self.endpoint,
            "allow_http": "true",
        }

    def create_container(self, name: str) -> str:
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient(self.endpoint, credential={"account_name": ACCOUNT, "account_key": KEY}).create_container(
            name
        )
        return name

    def blobs(self, container: str, prefix: str = "") -> list[str]:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient(self.endpoint, credential={"account_name": ACCOUNT, "account_key": KEY})
        return [b.name for b in service.get_container_client(container).list_blobs(name_starts_with=prefix)]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _binary() -> Path:
    cache = Path.home() / ".cache" / "strata-tests" / "azurite"
    binary = cache / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("Azurite needs npm (Node.js) to install it: apt-get install npm")
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund", "--prefix", str(cache), f"azurite@{AZURITE_VERSION}"],
        check=True,
        timeout=600,
    )
    return binary


def start_azurite() -> Azurite:
    binary = _binary()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [
            str(binary),
            "--inMemoryPersistence",
            "--skipApiVersionCheck",
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--silent",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Azurite(process, f"http://127.0.0.1:{port}/{ACCOUNT}", port)
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"Azurite exited with {process.returncode}") from None
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("Azurite did not listen within 60 s")
