from __future__ import annotations

import pytest

import cortex
from cortex.asgi import error_body, status_for


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (cortex.NotFound("x"), 404),
        (cortex.InvalidInput("x"), 422),
        (cortex.InvalidScope("x"), 422),
        (cortex.ScopeViolation("x"), 403),
        (cortex.ScopeMissing("x"), 500),
        (cortex.Conflict("x"), 409),
        (cortex.AlreadyAborted("x"), 409),
        (cortex.SessionAborted("x"), 409),
        (cortex.SchemaMismatch("x"), 503),
        (cortex.DatabaseUnavailable("x"), 503),
        (cortex.OperationTimeout("x"), 504),
        (cortex.DatabaseError("x"), 500),
        (cortex.CortexError("x"), 500),
    ],
)
def test_every_cortex_error_has_a_status(error: cortex.CortexError, status: int) -> None:
    assert status_for(error) == status
    name = type(error).__name__
    assert error_body(error) == {
        "type": f"urn:cortex:error:{name}",
        "title": name,
        "status": status,
        "detail": "x",
        "error": name,
    }


def test_every_public_error_class_is_mapped_deliberately() -> None:
    from cortex.asgi import HTTP_STATUS

    mapped = {cls for cls, _ in HTTP_STATUS}
    public = {
        getattr(cortex, n)
        for n in cortex.__all__
        if isinstance(getattr(cortex, n), type) and issubclass(getattr(cortex, n), Exception)
    }
    assert public <= mapped


async def _get(app: object, path: str) -> tuple[int, str]:
    import httpx

    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # an ASGI callable
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.get(path)
    return response.status_code, response.text


@pytest.mark.anyio
async def test_exempt_paths_pass_through_unbound() -> None:
    from cortex.asgi import ASGIScope, Receive, ScopeMiddleware, Send
    from cortex.scope import current_scope

    async def app(scope: ASGIScope, receive: Receive, send: Send) -> None:
        try:
            body = str(current_scope()).encode()
        except cortex.ScopeMissing:
            body = b"None"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    wrapped = ScopeMiddleware(
        app, scope_from=lambda request: None, exempt=("/healthz", "/docs", "/static/")
    )
    assert await _get(wrapped, "/healthz") == (200, "None")
    assert await _get(wrapped, "/docs") == (200, "None")
    assert await _get(wrapped, "/static/app.css") == (200, "None")
    # Whole paths only: no other path is let through by a shared beginning.
    assert (await _get(wrapped, "/docs-private"))[0] == 401
    assert (await _get(wrapped, "/healthz/x"))[0] == 401
    assert (await _get(wrapped, "/static"))[0] == 401
    assert (await _get(wrapped, "/v1/sessions"))[0] == 401
    with pytest.raises(cortex.InvalidInput):
        ScopeMiddleware(app, scope_from=lambda request: None, exempt=("healthz",))


@pytest.mark.parametrize(
    ("root_path", "path"),
    [
        ("", "/v1/sessions"),
        ("/api", "/api/v1/sessions"),
        ("/api", "/api"),
        ("/api", "/apiv1/sessions"),
        ("/api", "/v1/sessions"),
        ("/api/", "/api/v1/sessions"),
        ("/a/b", "/a/b/healthz"),
    ],
)
def test_route_path_is_what_the_router_matches(root_path: str, path: str) -> None:
    from starlette._utils import get_route_path

    from cortex.asgi import route_path

    scope = {"type": "http", "path": path, "root_path": root_path}
    assert route_path(scope) == get_route_path(scope)


@pytest.mark.anyio
async def test_exempt_paths_are_route_paths_under_a_root_path() -> None:
    import httpx

    from cortex.asgi import ASGIScope, Receive, ScopeMiddleware, Send

    async def app(scope: ASGIScope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = ScopeMiddleware(app, scope_from=lambda request: None, exempt=("/healthz",))
    transport = httpx.ASGITransport(app=wrapped, root_path="/api")
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/api/healthz")).status_code == 200
        assert (await client.get("/api/v1/sessions")).status_code == 401
