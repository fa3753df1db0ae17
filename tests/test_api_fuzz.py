"""API fuzzing: schemathesis generates requests from the service's own OpenAPI schema — valid ones and, for every
operation, invalid ones — against the app with auth on, with and without the key. Bounded in examples and time.
Every response: no 5xx, conformant to the schema, and never an echo of more than 200 bytes of what was sent.

Figures for the README come from ``pytest -s tests/test_api_fuzz.py`` (printed at the end of the module)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import checks

from flows.serve import ECHO_LIMIT, create_app
from schemas.config import load_config
from tests.test_serve import OVERRIDES, served_index  # noqa: F401  (the module's index fixture)

KEY_ENV, KEY = "STRATA_TEST_FUZZ_KEY", "fuzz-key-0123456789"
FIGURES: Counter = Counter()


@pytest.fixture(scope="module")
def api_schema(served_index):  # noqa: F811
    import os

    os.environ[KEY_ENV] = KEY
    cfg = load_config(overrides={**OVERRIDES, "serve": {"api_key_env": KEY_ENV, "max_request_bytes": 8192}})
    app = create_app(str(served_index), cfg, load=False)
    app.state.service.load()  # schemathesis calls the app without its lifespan
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    os.environ.pop(KEY_ENV, None)


def _sent_strings(case) -> list[str]:
    """Every string the request carried that is longer than the echo limit (body, query, path, headers)."""
    found: list[str] = []

    def walk(value) -> None:
        if isinstance(value, str):
            if len(value.encode()) > ECHO_LIMIT:
                found.append(value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    for part in (case.body, case.query, case.path_parameters, case.headers):
        walk(part if not isinstance(part, bytes) else part.decode("utf-8", "replace"))
    return found


@schemathesis.check
def no_echo(ctx, response, case):
    """No response carries more than ECHO_LIMIT bytes of anything the request sent."""
    if response.status_code >= 400:
        text = response.text
        for sent in _sent_strings(case):
            probe = sent[: ECHO_LIMIT + 1]
            if probe in text or json.dumps(probe)[1:-1] in text:
                raise AssertionError(f"the {response.status_code} response echoes {len(sent)} characters of the input")


def _fuzz(case) -> None:
    for with_key in (True, False):
        headers = {"Authorization": f"Bearer {KEY}" if with_key else "Bearer wrong"}
        response = case.call(headers=headers)
        FIGURES["examples"] += 1
        FIGURES[f"status {response.status_code // 100}xx"] += 1
        case.validate_response(response, checks=[checks.not_a_server_error, checks.response_schema_conformance, no_echo])
        if not with_key and case.path not in ("/healthz", "/readyz"):
            assert response.status_code == 401, (case.path, response.status_code)


@pytest.mark.slow
def test_the_api_never_fails_open_errs_or_echoes(api_schema):
    """Every operation of the schema, valid and invalid requests (30 examples each, derandomized), with the key
    and with a wrong one; prints the figures the README quotes."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    for operation in operations:
        for mode in schemathesis.GenerationMode:
            run = given(case=operation.as_strategy(generation_mode=mode))(_fuzz)
            try:
                settings(max_examples=30, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(HealthCheck))(run)()
            except Unsatisfiable:  # an operation without parameters or body has no invalid request to make
                assert mode == schemathesis.GenerationMode.NEGATIVE and not operation.body and not operation.query
    print(f"\nschemathesis: {len(operations)} operations ({', '.join(o.label for o in operations)}), "
          f"{FIGURES['examples']} requests, " + ", ".join(f"{k}: {FIGURES[k]}" for k in sorted(FIGURES) if k.startswith("status"))
          + ", failures: 0")
    assert len(operations) >= 5 and FIGURES["examples"] >= 100
