"""The ``/v1`` routes: each one a store call in the request's scope (bound by AuthMiddleware).

Routes stay thin: parse, call one Store method, shape the answer. Every
refusal is the store's own CortexError, answered as problem details by
cortex.server.app.

Dependencies are ``async def``: FastAPI runs a plain ``def`` one in its
thread pool, a hop per request. The busiest routes return their model as
a :class:`JSONModel` response, serialized once by pydantic-core, instead of
letting FastAPI validate the model again before encoding it; their
``response_model`` keeps the OpenAPI document exact.

The three hottest routes (an append, a page of sessions, a page of
messages) have a *lane* (:class:`LaneRoute`): a request whose parameters
are plain (no filter, digits for numbers, a JSON body that validates) calls
the endpoint function directly, without FastAPI's per-request dependency
solving; any other request, and every refusal, takes FastAPI's own path,
so its errors are FastAPI's. The routes stay FastAPI routes: the OpenAPI
document, the route template telemetry reads and the exception handlers
are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import ClientDisconnect

from cortex._calls.sessions import listing_digest
from cortex.asgi import ASGIScope, Receive, Send
from cortex.errors import InvalidInput
from cortex.models import (
    ErasureReport,
    ImportReport,
    ListFilter,
    Message,
    RetentionReport,
    Session,
    SessionCursor,
    SessionDetail,
    SessionState,
)
from cortex.scope import Scope, current_scope, use_scope
from cortex.server import bodies as b
from cortex.server.cursors import CursorSigner, InvalidCursor
from cortex.store import Store

__all__ = ["router"]

NDJSON = "application/x-ndjson"


async def _store(request: Request) -> Store:
    # Async on purpose: it runs in the request's context (cortex.asgi says why).
    store: Store = await request.app.state.cortex.store()
    return store


async def _signer(request: Request) -> CursorSigner:
    signer: CursorSigner = request.app.state.cortex.signer
    return signer


class JSONModel(Response):
    """A pydantic model as JSON, serialized by pydantic-core in one pass."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        if isinstance(content, BaseModel):
            return content.__pydantic_serializer__.to_json(content)
        return orjson.dumps(content)


StoreDep = Annotated[Store, Depends(_store)]
SignerDep = Annotated[CursorSigner, Depends(_signer)]

# A lane: (route, request, query) -> the endpoint's response, or None for FastAPI's own path.
Lane = Callable[["LaneRoute", Request, dict[str, str]], Awaitable[Response | None]]
_LANES: dict[Callable[..., Any], tuple[str, frozenset[str], Lane]] = {}


class LaneRoute(APIRoute):
    """A FastAPI route that answers a plain request through its lane, if it has one."""

    async def handle(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        """The lane's response; FastAPI's path when there is none or the lane declines."""
        lane = _LANES.get(self.endpoint)
        app = scope.get("app")
        if (
            lane is not None
            and scope["method"] == lane[0]
            and app is not None
            and not app.dependency_overrides  # a host's override is FastAPI's to apply
        ):
            query = _plain_query(scope, lane[1])
            if query is not None:
                body = None
                if scope["method"] == "POST":
                    # Read here, so FastAPI's path can be given it again if the lane declines.
                    body = await _read_body(receive)
                    receive = _replay(body)
                response = await lane[2](self, Request(scope, receive, send), query)
                if response is not None:
                    await response(scope, receive, send)
                    return
                if body is not None:
                    receive = _replay(body)
        await super().handle(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    """The whole request body, as Starlette reads it (its bound is BodyLimit's, around the app)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _plain_query(scope: ASGIScope, allowed: frozenset[str]) -> dict[str, str] | None:
    """The query's parameters (Starlette's parsing), if each is allowed and given once."""
    raw = scope.get("query_string", b"")
    if not raw:
        return {}
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    query = dict(pairs)
    if len(query) != len(pairs) or not allowed.issuperset(query):
        return None
    return query


def _digits(query: Mapping[str, str], name: str, low: int, high: int, default: int) -> int | None:
    """The parameter as an int within [low, high], or None (FastAPI's path answers the rest)."""
    text = query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 10):
        return None
    value = int(text)
    return value if low <= value <= high else None


def _replay(body: bytes) -> Receive:
    """A receive that gives the body already read, for FastAPI's path after a lane declined."""
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given:
            return {"type": "http.disconnect"}
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _json_body(request: Request) -> bool:
    """Whether the request says its body is JSON, as FastAPI reads the header."""
    kind = request.headers.get("content-type", "")
    return kind.split(";", 1)[0].strip().lower() == "application/json"


router = APIRouter(prefix="/v1", route_class=LaneRoute)


# --- listing parameters -----------------------------------------------------------


async def _filter(
    agent_id: Annotated[str | None, Query(description="only this agent's sessions")] = None,
    exact: Annotated[bool, Query(description="only sessions at exactly this scope")] = False,
    default_only: Annotated[bool, Query(description="only default sessions")] = False,
    search: Annotated[str | None, Query(description="title or last message contains")] = None,
    state: Annotated[SessionState | None, Query()] = None,
    metadata: Annotated[
        str | None,
        Query(description='a JSON object: each key must hold that value, e.g. {"channel":"web"}'),
    ] = None,
    created_after: Annotated[datetime | None, Query(description="ISO 8601, with offset")] = None,
    created_before: Annotated[datetime | None, Query(description="ISO 8601, with offset")] = None,
    updated_after: Annotated[datetime | None, Query(description="ISO 8601, with offset")] = None,
    updated_before: Annotated[datetime | None, Query(description="ISO 8601, with offset")] = None,
) -> ListFilter:
    wanted: Any = None
    if metadata is not None:
        try:
            wanted = json.loads(metadata)
        except ValueError:
            raise InvalidInput("metadata: not JSON; give a JSON object") from None
        except RecursionError:
            raise InvalidInput("metadata: nested too deeply; give a flat JSON object") from None
        if not isinstance(wanted, dict):
            raise InvalidInput("metadata: give a JSON object")
    return ListFilter(
        agent_id=agent_id,
        exact=exact,
        default_only=default_only,
        search=search,
        state=state,
        metadata=wanted,
        created_after=created_after,
        created_before=created_before,
        updated_after=updated_after,
        updated_before=updated_before,
    )


FilterDep = Annotated[ListFilter, Depends(_filter)]
PathQuery = Annotated[
    str | None, Query(description="a scope at or beneath the request's (default: it)")
]


# --- sessions ---------------------------------------------------------------------


@router.post("/sessions", status_code=201, tags=["sessions"], response_model=Session)
async def create_session(body: b.CreateSessionBody, store: StoreDep) -> Response:
    """Create a session at exactly the request's scope."""
    created = await store.create_session(
        body.agent_id,
        title=body.title,
        metadata=body.metadata,
        is_default=body.is_default,
        session_id=body.session_id,
        key=body.key,
        data=body.data,
    )
    return JSONModel(created, status_code=201)


@router.get("/sessions", tags=["sessions"], response_model=b.SessionPageView)
async def list_sessions(
    flt: FilterDep,
    store: StoreDep,
    signer: SignerDep,
    limit: Annotated[int, Query(ge=0, le=1000, description="page size (0: 50)")] = 0,
    cursor: Annotated[str | None, Query(description="next_cursor of the page before")] = None,
) -> Response:
    """Visible sessions, newest activity first, a page at a time (keyset cursors)."""
    flt.limit = limit
    position = None
    if cursor is not None:
        try:
            # JSON mode: the strict datetime field takes its ISO 8601 text there.
            opened = json.dumps(signer.open("sessions", cursor))
            position = SessionCursor.model_validate_json(opened)
        except InvalidCursor:
            raise
        except InvalidInput as exc:
            raise InvalidCursor(f"cursor: {exc}") from None
        if position.listing != listing_digest(current_scope(), flt):
            raise InvalidCursor("cursor: it continues another listing (another scope or filter)")
    page = await store.list_sessions_page(flt, cursor=position)
    following = page.next_cursor
    # Constructed, not validated: the store's sessions are checked already.
    return JSONModel(
        b.SessionPageView.model_construct(
            items=page.items,
            next_cursor=None
            if following is None
            else signer.sign("sessions", following.model_dump(mode="json")),
        )
    )


@router.get("/sessions/count", tags=["sessions"])
async def count_sessions(flt: FilterDep, store: StoreDep) -> b.CountView:
    """How many sessions the listing would return, all pages together."""
    return b.CountView(count=await store.count_sessions(flt))


@router.get("/sessions/{session_id}", tags=["sessions"], response_model=Session)
async def get_session(session_id: str, store: StoreDep) -> Response:
    """The session, if visible from the request's scope (404 otherwise, another tenant's too)."""
    return JSONModel(await store.get_session(session_id))


@router.patch("/sessions/{session_id}", tags=["sessions"])
async def update_session(session_id: str, body: b.UpdateSessionBody, store: StoreDep) -> Session:
    """Write the title and/or metadata; every other field is cortex's."""
    session = await store.get_session(session_id)
    if body.title is not None:
        session.title = body.title
    if body.metadata is not None:
        session.metadata = body.metadata
    return await store.update_session(session)


@router.delete("/sessions/{session_id}", status_code=204, tags=["sessions"])
async def delete_session(session_id: str, store: StoreDep) -> Response:
    """Delete the session with its messages."""
    await store.delete_session(session_id)
    return Response(status_code=204)


@router.get("/sessions/{session_id}/detail", tags=["operators"])
async def inspect_session(session_id: str, store: StoreDep) -> SessionDetail:
    """The session with its state, pending inputs and marker reasons."""
    return await store.inspect_session(session_id)


# --- messages ---------------------------------------------------------------------


@router.post(
    "/sessions/{session_id}/messages",
    status_code=201,
    tags=["messages"],
    response_model=b.MessagesView,
)
async def append_messages(session_id: str, body: b.AppendBody, store: StoreDep) -> Response:
    """Append messages in one transaction; a retry with the same message ids writes nothing."""
    stored = await store.append_messages(
        session_id, body.messages, data=body.data, expected_count=body.expected_count
    )
    return JSONModel(b.MessagesView.model_construct(items=stored), status_code=201)


@router.get("/sessions/{session_id}/messages", tags=["messages"], response_model=b.MessagePage)
async def list_messages(
    session_id: str,
    store: StoreDep,
    signer: SignerDep,
    after_seq: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    limit: Annotated[int, Query(ge=0, le=1000, description="page size (0: 100)")] = 0,
    cursor: Annotated[str | None, Query(description="next_cursor of the page before")] = None,
    newest: Annotated[
        int | None, Query(ge=1, le=1000, description="the newest N instead, oldest first")
    ] = None,
) -> Response:
    """Messages oldest first after ``after_seq``, a page at a time; or the newest N."""
    if newest is not None:
        if cursor is not None or after_seq:
            raise InvalidInput("newest: give newest, or after_seq and cursor, not both")
        recent = await store.recent_messages(session_id, limit=newest)
        return JSONModel(b.MessagePage.model_construct(items=recent, next_cursor=None))
    if cursor is not None:
        position = signer.open("messages", cursor)
        if position.get("session_id") != session_id or not isinstance(position.get("seq"), int):
            raise InvalidCursor("cursor: it continues another session's messages")
        after_seq = position["seq"]
    size = limit or 100
    items = await store.list_messages(session_id, after_seq=after_seq, limit=size)
    following = None
    if len(items) == size:
        following = signer.sign("messages", {"session_id": session_id, "seq": items[-1].seq})
    return JSONModel(b.MessagePage.model_construct(items=items, next_cursor=following))


async def _sessions_lane(
    route: LaneRoute, request: Request, query: dict[str, str]
) -> Response | None:
    limit = _digits(query, "limit", 0, 1000, 0)
    if limit is None:
        return None
    holder = request.app.state.cortex
    return await list_sessions(
        await _filter(), await holder.store(), holder.signer, limit, query.get("cursor")
    )


_LANES[list_sessions] = ("GET", frozenset({"limit", "cursor"}), _sessions_lane)


async def _messages_lane(
    route: LaneRoute, request: Request, query: dict[str, str]
) -> Response | None:
    after_seq = _digits(query, "after_seq", 0, 2**31 - 1, 0)
    limit = _digits(query, "limit", 0, 1000, 0)
    newest = _digits(query, "newest", 1, 1000, 0)
    if after_seq is None or limit is None or newest is None:
        return None
    holder = request.app.state.cortex
    return await list_messages(
        request.path_params["session_id"],
        await holder.store(),
        holder.signer,
        after_seq,
        limit,
        query.get("cursor"),
        newest or None,
    )


_LANES[list_messages] = (
    "GET",
    frozenset({"after_seq", "limit", "cursor", "newest"}),
    _messages_lane,
)


async def _append_lane(
    route: LaneRoute, request: Request, query: dict[str, str]
) -> Response | None:
    if query or route.body_field is None or not _json_body(request):
        return None
    try:
        document = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return None
    # FastAPI's own body field: what it would accept, validated as FastAPI validates it.
    body, errors = route.body_field.validate(document, {}, loc=("body",))
    if errors:
        return None
    store = await request.app.state.cortex.store()
    return await append_messages(request.path_params["session_id"], body, store)


_LANES[append_messages] = ("POST", frozenset(), _append_lane)


@router.post("/sessions/{session_id}/resume", tags=["operators"])
async def resume(session_id: str, body: b.ResumeBody, store: StoreDep) -> Message:
    """Answer a pending input; an answer its response schema refuses is 422."""
    return await store.resume(session_id, body.interrupt_id, body.response, author=body.author)


@router.post("/sessions/{session_id}/abort", tags=["operators"])
async def abort_session(session_id: str, body: b.AbortBody, store: StoreDep) -> Session:
    """Write a durable abort marker; pending inputs are cleared."""
    return await store.abort_session(session_id, body.reason)


@router.post("/sessions/{session_id}/fork", status_code=201, tags=["sessions"])
async def fork_session(session_id: str, body: b.ForkBody, store: StoreDep) -> Session:
    """A new session holding copies of messages 1 to ``through_seq`` (default: all)."""
    return await store.fork_session(session_id, through_seq=body.through_seq, title=body.title)


@router.post("/sessions/{session_id}/rewind", tags=["sessions"])
async def rewind_session(session_id: str, body: b.RewindBody, store: StoreDep) -> Session:
    """Delete the messages after ``to_seq``."""
    return await store.rewind_session(session_id, to_seq=body.to_seq)


@router.post("/agents/{agent_id}/resolve", tags=["sessions"])
async def resolve_session(
    agent_id: str, store: StoreDep, body: b.ResolveBody | None = None
) -> Session:
    """The session a run of the agent uses: named, keyed, or the default (created if absent)."""
    body = body or b.ResolveBody()
    return await store.resolve_session(agent_id, body.session_id, key=body.key)


# --- scope state ------------------------------------------------------------------


@router.get("/scope-data", tags=["scope"])
async def get_scope_data(
    store: StoreDep,
    scope: Annotated[str | None, Query(description="the request's scope, above or beneath")] = None,
) -> b.ScopeDataView:
    """The state document stored at exactly ``scope``."""
    target = current_scope() if scope is None else Scope.parse(scope)
    return b.ScopeDataView(scope=target, data=await store.get_scope_data(str(target)))


@router.patch("/scope-data", tags=["scope"])
async def patch_scope_data(
    patch: Annotated[dict[str, Any], Body(description="a JSON merge patch (RFC 7386)")],
    store: StoreDep,
    scope: PathQuery = None,
) -> b.ScopeDataView:
    """Merge a patch into the state document at ``scope``: null removes a key."""
    target = current_scope() if scope is None else Scope.parse(scope)
    return b.ScopeDataView(scope=target, data=await store.update_scope_data(patch, scope=target))


@router.put("/scope-data", tags=["scope"])
async def put_scope_data(
    document: Annotated[dict[str, Any], Body(description="the whole document")],
    store: StoreDep,
    scope: PathQuery = None,
) -> b.ScopeDataView:
    """Replace the state document at ``scope``."""
    target = current_scope() if scope is None else Scope.parse(scope)
    data = await store.update_scope_data(document, scope=target, replace=True)
    return b.ScopeDataView(scope=target, data=data)


# --- a scope's lifecycle ----------------------------------------------------------


@router.post("/scope/erase", tags=["scope"])
async def erase_scope(store: StoreDep, body: b.EraseBody | None = None) -> ErasureReport:
    """Remove everything at and beneath ``path`` (dry_run: count only)."""
    body = body or b.EraseBody()
    return await store.erase_scope(body.path, dry_run=body.dry_run)


@router.get("/scope/erasures", tags=["scope"])
async def list_erasures(store: StoreDep, path: PathQuery = None) -> b.ErasuresView:
    """The receipts of erasures at or beneath ``path``, newest first."""
    return b.ErasuresView(items=await store.list_erasures(path))


@router.get(
    "/scope/export",
    tags=["scope"],
    response_class=StreamingResponse,
    responses={200: {"content": {NDJSON: {}}, "description": "JSON Lines, one record a line"}},
)
async def export_scope(store: StoreDep, path: PathQuery = None) -> StreamingResponse:
    """Every record of ``path``'s subtree from one snapshot, as JSON Lines."""
    records = store.export_scope(path)
    first = await anext(records)  # refusals and an unreachable database answer before the 200

    async def lines() -> AsyncIterator[bytes]:
        yield orjson.dumps(first) + b"\n"
        async for record in records:
            yield orjson.dumps(record) + b"\n"

    return StreamingResponse(lines(), media_type=NDJSON)


@router.post(
    "/scope/import",
    tags=["scope"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {NDJSON: {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def import_scope(request: Request, store: StoreDep, into: PathQuery = None) -> ImportReport:
    """Restore an export (JSON Lines), in one transaction; into: where its root goes."""
    return await store.import_scope(_records(request), into=into)


async def _records(request: Request) -> AsyncIterator[Any]:
    """The body's JSON Lines as records, read as they arrive."""
    rest = b""
    number = 0
    async for chunk in request.stream():
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            number += 1
            if line.strip():
                yield _record(line, number)
    if rest.strip():
        yield _record(rest, number + 1)


def _record(line: bytes, number: int) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        raise InvalidInput(f"records: line {number} is not JSON") from None


@router.get("/scope/retention-policy", tags=["scope"])
async def get_retention_policy(store: StoreDep, path: PathQuery = None) -> b.RetentionPolicyView:
    """The policy in force at ``path``: the nearest at or above it (null: none)."""
    target = current_scope() if path is None else Scope.parse(path)
    return b.RetentionPolicyView(path=target, policy=await store.get_retention_policy(target))


@router.put("/scope/retention-policy", tags=["scope"])
async def set_retention_policy(
    body: b.RetentionPolicyBody, store: StoreDep, path: PathQuery = None
) -> b.RetentionPolicyView:
    """Set the policy of ``path``; durations as ISO 8601 (``P30D``)."""
    target = current_scope() if path is None else Scope.parse(path)
    await store.set_retention_policy(body.policy(), target)
    return b.RetentionPolicyView(path=target, policy=await store.get_retention_policy(target))


@router.delete("/scope/retention-policy", status_code=204, tags=["scope"])
async def delete_retention_policy(store: StoreDep, path: PathQuery = None) -> Response:
    """Remove the policy set at exactly ``path`` (a policy above may then govern it)."""
    await store.set_retention_policy(None, path)
    return Response(status_code=204)


@router.post("/scope/retention/run", tags=["scope"])
async def run_retention(store: StoreDep, body: b.RetentionRunBody | None = None) -> RetentionReport:
    """Carry out the policies over ``path``'s sessions (dry_run: count only)."""
    body = body or b.RetentionRunBody()
    if body.path is None:
        return await store.apply_retention(dry_run=body.dry_run)
    with use_scope(body.path):  # narrowing only: outside the request's scope is 403
        return await store.apply_retention(dry_run=body.dry_run)
