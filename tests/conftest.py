"""Shared fixtures. Everything runs offline with a throw-away Prefect home."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_HOME = Path(tempfile.mkdtemp(prefix="strata-test-home-"))
os.environ["PREFECT_HOME"] = str(_HOME / "prefect")
os.environ["STRATA_HOME"] = str(_HOME / "strata")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
for key in [k for k in os.environ if k.startswith("STRATA_") and k not in ("STRATA_HOME",)]:
    del os.environ[key]

from flows.env import OFFLINE_DEFAULTS, apply_offline_defaults  # noqa: E402

for key in OFFLINE_DEFAULTS:  # the test run's own settings, whatever the developer's shell has
    if key not in ("PREFECT_HOME", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):
        os.environ.pop(key, None)
apply_offline_defaults()

REPO = Path(__file__).resolve().parent.parent
CAROL = REPO / "data" / "a_christmas_carol.txt"
MUSIQUE_SAMPLE = Path(__file__).resolve().parent / "data" / "musique_sample.jsonl"

#: small chunks so a small corpus still gives several chunks per document
SMALL = {"chunking": {"size": 200, "overlap": 20}, "extract": {"batch_size": 4}, "dask": {"n_workers": 2, "processes": False}}


def musique_passages(n: int) -> list[dict]:
    rows = [json.loads(line) for line in MUSIQUE_SAMPLE.read_text(encoding="utf-8").splitlines()[:n]]
    assert len(rows) == n, f"the sample holds {len(rows)} passages, {n} asked"
    return rows


def write_small_corpus(root: Path) -> Path:
    """A small real corpus: two slices of A Christmas Carol, a Markdown note and 12 MuSiQue passages as JSONL."""
    root.mkdir(parents=True, exist_ok=True)
    text = CAROL.read_text(encoding="utf-8")
    start = text.index("STAVE ONE")
    (root / "carol_1.txt").write_text(text[start : start + 5000], encoding="utf-8")
    (root / "carol_2.txt").write_text(text[start + 60000 : start + 64000], encoding="utf-8")
    (root / "notes").mkdir(exist_ok=True)
    (root / "notes" / "scrooge.md").write_text(
        "# Scrooge and Marley\n\nEbenezer Scrooge ran the counting-house of Scrooge and Marley in London. "
        "Jacob Marley, his partner, died seven years before Christmas Eve. Bob Cratchit was Scrooge's clerk.\n",
        encoding="utf-8",
    )
    with (root / "passages.jsonl").open("w", encoding="utf-8") as fh:
        for row in musique_passages(12):
            fh.write(json.dumps(row) + "\n")
    return root


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    return write_small_corpus(tmp_path_factory.mktemp("corpus") / "small")


@pytest.fixture(scope="session", autouse=True)
def _cleanup_home():
    yield
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def azurite():
    """Azurite's Blob service (npm ``azurite``, installed under ~/.cache/strata-tests on first use from the npm
    registry) on a free port of 127.0.0.1, in memory; started once per session, only by the
    tests that ask for it. Yields its Blob endpoint for the well-known development account."""
    from tests.azurite import start_azurite

    server = start_azurite()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server():
    """A Google Cloud Storage stand-in on a free port of 127.0.0.1, in memory (``tests/gcs_server.py``: GCS's XML
    and JSON APIs with its generation preconditions); started once per session, only by the tests that ask for it."""
    from tests.gcs_server import start_gcs_server

    server = start_gcs_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server():
    """moto's standalone S3 server on a free port of 127.0.0.1, behind a proxy that counts bytes and injects faults
    on demand (``tests/s3_server.py``); started once per session, only by the tests that ask for it."""
    from tests.s3_server import start_s3_server

    server = start_s3_server()
    yield server
    server.stop()
