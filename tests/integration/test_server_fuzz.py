"""Every route of the OpenAPI document, fuzzed by schemathesis against a real uvicorn server.

Each operation gets generated requests, valid and invalid, sent with a
token (so they reach the routes) and without one (so the auth layer is
held to the document too). Every answer must be a non-5xx status the
document declares for that operation, with a declared content type,
headers and a body its schema accepts. ``CORTEX_SERVER_FUZZ_EXAMPLES``
raises the examples per operation (default kept small for ``make test``).
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cortex.server import SigningKey, create_app, issue_token
from tests.conftest import Database
from tests.serving import running

pytestmark = pytest.mark.slow

KEY = secrets.token_urlsafe(32)
EXAMPLES = int(os.environ.get("CORTEX_SERVER_FUZZ_EXAMPLES", "25"))
MAX_BODY = 64 * 1024
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)

# An import body is bytes (JSON Lines): sent as generated, like any binary body.
schemathesis.serializer.alias("application/x-ndjson", "application/octet-stream")
# The document is the app's own, read without a database (the app connects on start).
document = schemathesis.openapi.from_dict(
    create_app("postgresql://nobody@127.0.0.1:1/none", signing_key=KEY).openapi()
)


@pytest.fixture(scope="module")
def base_url(database: Database) -> Iterator[str]:
    with running(create_app(database.app_url, signing_key=KEY, max_body_bytes=MAX_BODY)) as url:
        yield url


@pytest.fixture(scope="module")
def bearer() -> dict[str, str]:
    # A tenant of its own: the fuzzer erases, imports and deletes in it.
    tenant = f"fz{uuid.uuid4().hex[:10]}"
    token = issue_token(SigningKey.parse(KEY), scope=tenant, role="operator")
    return {"Authorization": f"Bearer {token}"}


@document.parametrize()
@FUZZ
def test_every_route_conforms_with_a_token(
    case: Any, base_url: str, bearer: dict[str, str]
) -> None:
    case.call_and_validate(base_url=base_url, headers=bearer, checks=CHECKS, timeout=30)


@document.parametrize()
@FUZZ
def test_every_route_conforms_without_a_token(case: Any, base_url: str) -> None:
    response = case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=30)
    path: str = case.operation.path
    if path.startswith("/v1/") and path != "/v1/openapi.json":
        if response.status_code == 413:
            # The body bound sits outside the token check: an oversized body is refused unread.
            assert len(response.request.body or b"") > MAX_BODY
        else:
            assert response.status_code == 401, (case.method, path, response.text)
