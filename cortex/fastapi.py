"""cortex in FastAPI (and Starlette): a scope dependency and an exception handler.

Needs the ``fastapi`` extra (from a checkout: ``pip install -e '.[fastapi]'``).
See :mod:`cortex.asgi` for why the dependency must be ``async``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from cortex.asgi import PROBLEM_JSON, error_body, problem, resolve, status_for
from cortex.errors import CortexError, ScopeMissing
from cortex.scope import Scope, use_scope

__all__ = [
    "cortex_error_handler",
    "install_error_handlers",
    "scope_dependency",
    "validation_error_handler",
]


def scope_dependency(
    scope_from: Callable[[Request], str | Scope | Awaitable[str | Scope | None] | None],
) -> Callable[[Request], AsyncIterator[Scope]]:
    """A FastAPI dependency that binds the request's scope for the endpoint, and yields it.

    ``scope_from(request)`` picks the scope (a header, a verified JWT claim,
    ...); None answers 401. Use it per route, per router or app-wide
    (``FastAPI(dependencies=[Depends(scope_dependency(...))])``). It is an
    ``async`` generator on purpose: FastAPI runs it in the request's own
    context, so the binding reaches ``async def`` and ``def`` endpoints alike.
    """

    async def bind_scope(request: Request) -> AsyncIterator[Scope]:
        try:
            scope = await resolve(scope_from, request)
        except ScopeMissing:
            request.state.cortex_scope_missing = True  # the client's fault: 401, not 500
            raise
        with use_scope(scope):
            yield scope

    return bind_scope


async def cortex_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer a cortex error with its status (see :data:`cortex.asgi.HTTP_STATUS`) and JSON body."""
    if not isinstance(exc, CortexError):  # registered for CortexError only
        raise exc
    # A request that names no scope is the client's fault; an endpoint that
    # runs without one (no binding installed) is the server's.
    status = 401 if isinstance(exc, ScopeMissing) and _no_scope_named(request) else status_for(exc)
    return JSONResponse(error_body(exc, status), status_code=status, media_type=PROBLEM_JSON)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Answer FastAPI's request validation error as cortex answers ``InvalidInput``: 422, problem details."""
    if not isinstance(exc, RequestValidationError):  # registered for it only
        raise exc
    errors = [_strict_json(error) for error in jsonable_encoder(exc.errors())]
    detail = "; ".join(
        f"{'.'.join(str(part) for part in error.get('loc', ()))}: {error.get('msg', '')}"
        for error in errors
    )
    body = problem("InvalidInput", 422, detail or "the request is not valid", errors=errors)
    return JSONResponse(body, status_code=422, media_type=PROBLEM_JSON)


def _strict_json(error: dict[str, Any]) -> dict[str, Any]:
    """One validation error, without the echoed input when strict JSON cannot carry it.

    Python's JSON reads NaN and Infinity in a body, and the error echoes them
    back; a response holding them would not be JSON.
    """
    try:
        json.dumps(error, allow_nan=False)
    except ValueError:
        return {key: value for key, value in error.items() if key not in ("input", "ctx")}
    return error


def _no_scope_named(request: Request) -> bool:
    return getattr(request.state, "cortex_scope_missing", False) is True


def install_error_handlers(app: Starlette) -> None:
    """Answer every :class:`cortex.CortexError` and FastAPI validation error as problem details."""
    app.add_exception_handler(CortexError, cortex_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
