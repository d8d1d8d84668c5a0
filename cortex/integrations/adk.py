"""Google ADK on cortex: ``CortexSessionService``, a ``BaseSessionService`` backed by a Store.

How ADK's names map onto cortex:

- ``app_name`` and ``user_id`` become two scope segments beneath the base
  scope (the one given at construction, else the caller's current scope):
  ``<base>/<app>/<user>`` (names that are not valid segments are encoded,
  see :func:`cortex.integrations._backing.segment`). The tenant is the base
  scope's first segment, so row-level security walls tenants apart exactly
  as for every other cortex call.
- An ADK session is a cortex session of agent ``"adk"`` (configurable) at
  the user's scope whose *key* is ADK's session id (trimmed, as ADK trims).
- Each event is one message: the whole event as the payload (JSON, returned
  exactly), its text as ``content`` (for previews and search), ``user`` /
  ``tool`` / ``assistant`` as the role.
- State: ``app:`` keys live in the app scope's state document, ``user:``
  keys in the user scope's, the rest in the session's; cortex merges them
  on every read, so a session's ``state`` is ADK's merged view. ``temp:``
  keys are never stored. The delta of an event is written in the
  transaction that appends the event.
- A long-running function call without a later function response of the
  same id is a pending input: ``inspect_session`` shows it, and
  ``ListFilter(state=SessionState.PAUSED)`` / ``cortex sessions list --state
  paused`` find the session.

Requires the ``adk`` extra (``google-adk``); nothing else in cortex imports
this module.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python
from sqlalchemy.engine import URL

from cortex.errors import Conflict, InvalidInput, NotFound
from cortex.integrations._backing import Backing, segment
from cortex.models import (
    MAX_AGENT_ID_LENGTH,
    MAX_AUTHOR_LENGTH,
    MAX_MESSAGE_LIMIT,
    RESERVED_DATA_PREFIX,
    FunctionResponse,
    ListFilter,
    Message,
    NewMessage,
    RequestedInput,
    Role,
    from_database,
)
from cortex.models import Session as CortexSession
from cortex.scope import Scope, use_scope
from cortex.store import Store

__all__ = [
    "CortexSessionService",
    "SessionExists",
    "SessionMissing",
    "StaleSession",
]

# ADK's Session.last_update_time is the timestamp of the last event (or of
# the creation), which the host chooses; it is kept in the session's own
# state document under this key, written by the same statement as the
# event. Its prefix keeps it out of every state cortex returns (ADK's and
# Session.data): cortex's Session carries it apart, in _reserved_data.
_UPDATED: Final = f"{RESERVED_DATA_PREFIX}adk_last_update_time__"
# Text kept in a message's content: enough for previews and search; the
# whole event is in the payload.
_CONTENT_CHARS: Final = 64 * 1024
_STALE: Final = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)


class SessionExists(AlreadyExistsError, Conflict):
    """ADK's AlreadyExistsError, and a cortex Conflict: the session id is taken."""


class SessionMissing(SessionNotFoundError, NotFound):
    """ADK's SessionNotFoundError, and a cortex NotFound."""


class StaleSession(StaleSessionError, Conflict):
    """ADK's StaleSessionError, and a cortex Conflict: the session moved on since it was read."""


def _json_safe(state: dict[str, Any]) -> dict[str, Any]:
    # What ADK's own database service stores for a value JSON cannot hold
    # (a callable, an object, bytes that are not UTF-8): its string form,
    # not a failed write.
    try:
        return dict(to_jsonable_python(state))
    except (PydanticSerializationError, ValueError):
        return {k: _json_safe_value(v) for k, v in state.items()}


def _json_safe_value(value: Any) -> Any:
    try:
        return to_jsonable_python(value)
    except (PydanticSerializationError, ValueError):
        return str(value)


def _key(session_id: object) -> str:
    """ADK's session id as a cortex key: trimmed, as ADK trims."""
    if not isinstance(session_id, str):
        raise InvalidInput(f"session_id: expected a string, got {type(session_id).__name__}")
    return session_id.strip()


def _split(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """App, user and session parts of a state or delta (keys kept whole); temp: dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in _json_safe(state).items():
        if key.startswith(State.APP_PREFIX):
            app[key] = value
        elif key.startswith(State.USER_PREFIX):
            user[key] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return app, user, own


def _usable_id(value: str | None) -> str | None:
    if value and len(value) <= MAX_AGENT_ID_LENGTH and value.isprintable() and " " not in value:
        return value
    return None


def _message_of(event: Event) -> NewMessage:
    """One message holding the whole event, with its text, role and operator state."""
    try:
        payload = event.model_dump(mode="json", exclude_none=True)
    except (PydanticSerializationError, ValueError):
        if event.actions and event.actions.state_delta:
            event.actions.state_delta = _json_safe(event.actions.state_delta)
        try:
            payload = event.model_dump(mode="json", exclude_none=True)
        except (PydanticSerializationError, ValueError) as exc:
            raise InvalidInput(f"event: not JSON-serialisable ({exc})") from None
    parts = event.content.parts if event.content and event.content.parts else []
    text = "".join(p.text for p in parts if p.text and not p.thought)[:_CONTENT_CHARS]
    responses = event.get_function_responses()
    role: Role = "user" if event.author == "user" else "tool" if responses else "assistant"
    # Every long-running call is a question pending until a later event
    # answers its id; every function response answers one (ids once each).
    long_running = event.long_running_tool_ids or set()
    asked: dict[str, RequestedInput] = {}
    for call in event.get_function_calls():
        call_id = _usable_id(call.id)
        if call_id and call_id in long_running and call_id not in asked:
            asked[call_id] = RequestedInput(interrupt_id=call_id, message=(call.name or "")[:1000])
    answers: dict[str, FunctionResponse] = {}
    for response in responses:
        response_id = _usable_id(response.id)
        if response_id and response_id not in answers:
            name = (response.name or "")[:MAX_AGENT_ID_LENGTH]
            answers[response_id] = FunctionResponse(id=response_id, name=name)
    # Not validated here: the store validates every message it is given
    # (revalidate_instances), and validating twice cost a fifth of an append.
    # Past MAX_INPUTS_PER_MESSAGE calls (or answers) in one event the store
    # refuses the event (InvalidInput) rather than leave a call unrecorded.
    return from_database(
        NewMessage,
        {
            "role": role,
            "content": text.replace("\x00", ""),
            "author": (event.author or "")[:MAX_AUTHOR_LENGTH].replace("\x00", ""),
            "requested_inputs": list(asked.values()),
            "function_responses": list(answers.values()),
            "metadata": {},
            "id": None,
            "payload": payload,
        },
    )


def _event_of(message: Message) -> Event | None:
    """The ADK event a message holds; for any other message (written through cortex itself), one built from it.

    An operator answering a pending input (``store.resume``, ``cortex
    sessions resume``) appends a function response without an ADK payload:
    it becomes the user's function-response event, so the agent's next run
    sees the answer. Other payload-less messages become plain text events.
    """
    if message.payload is not None:
        try:
            return Event.model_validate(message.payload)
        except ValidationError:
            pass  # not an ADK event: built from the message, as one without a payload
    if message.function_responses:
        parts = [
            types.Part(
                function_response=types.FunctionResponse(
                    id=answer.id,
                    name=answer.name,
                    response=answer.response
                    if isinstance(answer.response, dict)
                    else {"result": answer.response},
                )
            )
            for answer in message.function_responses
        ]
    elif message.content:
        parts = [types.Part(text=message.content)]
    else:
        return None
    role = "model" if message.role == "assistant" else "user"
    return Event(
        id=message.id,
        invocation_id="",
        author=message.author or ("user" if role == "user" else message.role),
        content=types.Content(role=role, parts=parts),
        timestamp=message.created_at.timestamp(),
    )


class CortexSessionService(BaseSessionService):
    """ADK's session service on a cortex store: multi-tenant, scoped, with an operator surface.

    Build it on an existing store (``CortexSessionService(store)``, which
    stays the caller's) or a URL (``CortexSessionService("postgresql://…")``;
    the database must have been prepared by ``cortex db upgrade``, nothing
    else runs). On a URL the store is opened as ``cortex.connect`` opens one,
    at the first call (or ``open()``, or ``async with``), and shared by the
    adapters on that URL with equal pool options in the event loop;
    ``close()`` releases this service's share on the running loop, and the
    last share closed disposes the engine. ``scope``: a base scope for a
    process serving one tenant; without it, every call acts beneath the
    caller's current scope (``with cortex.use_scope("acme"): ...``).

    Concurrency: ``append_event`` refuses a session object that is stale
    (another writer appended since it was read, or it was read from a
    session deleted since, even one created again under the same id) with
    :class:`StaleSession` (ADK's StaleSessionError), checked under the
    session's row lock in the appending statement, so of two writers holding
    the same revision exactly one appends. A session object built by hand
    (no revision marker) is checked as ADK's database service checks one:
    by its ``last_update_time`` and newest event.
    """

    def __init__(
        self,
        store_or_url: Store | str | URL,
        *,
        scope: Scope | str | None = None,
        agent_id: str = "adk",
        **pool_options: Any,
    ) -> None:
        self._backing = Backing(store_or_url, scope, **pool_options)
        self._agent = agent_id
        # (user scope, key) -> ses_ id: saves the key lookup on every append.
        # A stale entry (the session was deleted) is found out and dropped.
        self._ids: dict[tuple[str, str], str] = {}

    @property
    def store(self) -> Store:
        """The cortex store underneath (for operator calls such as ``inspect_session``).

        Raises:
            InvalidInput: built on a URL, and not yet opened on the running loop.
        """
        return self._backing.store

    async def open(self) -> Store:
        """Open the store now (a URL-built service opens it at its first call anyway)."""
        return await self._backing.ready()

    async def __aenter__(self) -> CortexSessionService:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release this service's share of a URL-built store (the last share disposes the engine).

        Call it on each event loop the service was used on; a borrowed store stays open.
        """
        await self._backing.close()

    # --- scopes -------------------------------------------------------------------

    def app_scope(self, app_name: str) -> Scope:
        """The scope holding an app's sessions and its ``app:`` state."""
        return self._backing.base().child(segment(app_name))

    def user_scope(self, app_name: str, user_id: str) -> Scope:
        """The scope holding a user's sessions of an app and its ``user:`` state."""
        return self.app_scope(app_name).child(segment(user_id))

    # --- the service --------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session; ``app:`` and ``user:`` state go to their scopes in the same transaction.

        Raises:
            SessionExists: the user already has a session with this id.
        """
        key = ("" if session_id is None else _key(session_id)) or str(uuid.uuid4())
        if state is not None and not isinstance(state, dict):
            raise InvalidInput(f"state: expected a dict, got {type(state).__name__}")
        app, user, own = _split(state or {})
        created_at = time.time()
        app_scope, user_scope = self.app_scope(app_name), self.user_scope(app_name, user_id)
        scope_data = {str(s): d for s, d in ((app_scope, app), (user_scope, user)) if d}
        store = await self._backing.ready()
        with use_scope(user_scope):
            try:
                stored = await store.create_session(
                    self._agent,
                    key=key,
                    metadata={"app_name": app_name, "user_id": user_id},
                    data={**own, _UPDATED: created_at},
                    scope_data=scope_data or None,
                )
            except Conflict as exc:
                raise SessionExists(f"Session with id {key} already exists.") from exc
        self._ids[(str(user_scope), key)] = stored.id
        return self._session_of(stored, app_name, user_id, [])

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (all, or as ``config`` limits), or None.

        Events come back in ADK's database order (timestamp, then event id);
        ``num_recent_events`` keeps the newest appended, ``after_timestamp``
        those at or after it.
        """
        key = _key(session_id)
        if config is not None and not isinstance(config, GetSessionConfig):
            raise InvalidInput(f"config: expected a GetSessionConfig, got {type(config).__name__}")
        user_scope = self.user_scope(app_name, user_id)
        if not key:
            return None
        recent = None if config is None else config.num_recent_events
        first = MAX_MESSAGE_LIMIT if recent is None else max(1, min(recent, MAX_MESSAGE_LIMIT))
        store = await self._backing.ready()
        with use_scope(user_scope):
            # Two tries: a cached id whose session was deleted (and perhaps
            # created again under the same key elsewhere) is dropped and the
            # key looked up afresh.
            for _ in range(2):
                sid = await self._find(store, user_scope, key)
                if sid is None:
                    return None
                try:
                    stored, messages = await store.get_session_with_messages(sid, limit=first)
                    messages = await _older(store, sid, messages, recent)
                    break
                except NotFound:
                    self._ids.pop((str(user_scope), key), None)
            else:
                return None
        events = [e for e in map(_event_of, messages) if e is not None]
        events.sort(key=lambda e: (e.timestamp, e.id))
        if config is not None and config.after_timestamp is not None:
            events = [e for e in events if e.timestamp >= config.after_timestamp]
        return self._session_of(stored, app_name, user_id, events)

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """A user's sessions (or, without ``user_id``, the app's), least recently active first.

        Each carries its merged state and no events.
        """
        scope = self.app_scope(app_name) if user_id is None else self.user_scope(app_name, user_id)
        flt = ListFilter(agent_id=self._agent, exact=user_id is not None, limit=1000)
        store = await self._backing.ready()
        with use_scope(scope):
            # One page is one statement (one round trip); a full page may
            # have more behind it: then walk them all from one snapshot.
            found = await store.list_sessions(flt)
            if len(found) == flt.limit:
                found = [s async for s in store.iter_sessions(flt)]
        found.reverse()  # cortex lists newest activity first; ADK, oldest
        sessions = [
            self._session_of(s, app_name, str(s.metadata.get("user_id", user_id)), [])
            for s in found
        ]
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete the session with its events; a session that does not exist is no error."""
        key = _key(session_id)
        user_scope = self.user_scope(app_name, user_id)
        if not key:
            return
        store = await self._backing.ready()
        with use_scope(user_scope):
            # Two tries, as in get_session: a cached id may name a session
            # deleted since, and the key another one, which is the one to delete.
            for attempt in range(2):
                sid = await self._find(store, user_scope, key, cached=attempt == 0)
                self._ids.pop((str(user_scope), key), None)
                if sid is None:
                    return
                try:
                    await store.delete_session(sid)
                except NotFound:
                    continue
                return

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's ``user:`` state, keys without the prefix ({} if none)."""
        user_scope = self.user_scope(app_name, user_id)
        store = await self._backing.ready()
        with use_scope(self._backing.base()):
            stored = await store.get_scope_data(str(user_scope))
        return {k.removeprefix(State.USER_PREFIX): v for k, v in stored.items()}

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store the event and its state delta in one transaction, then apply both in memory.

        Partial events are not stored; ``temp:`` keys reach the in-memory
        session only.

        Raises:
            StaleSession: the session object is stale (reload it).
            SessionMissing: the session does not exist (any more).
        """
        if not isinstance(session, Session):
            raise InvalidInput(f"session: expected an ADK Session, got {type(session).__name__}")
        if not isinstance(event, Event):
            raise InvalidInput(f"event: expected an ADK Event, got {type(event).__name__}")
        if event.partial:
            return event
        # temp: keys live in the in-memory session for this invocation only, never stored.
        delta = (event.actions.state_delta if event.actions else None) or {}
        temp = {k: v for k, v in delta.items() if k.startswith(State.TEMP_PREFIX)}
        session.state.update(temp)
        if temp:
            event.actions.state_delta = {k: v for k, v in delta.items() if k not in temp}
            delta = event.actions.state_delta
        app, user, own = _split(delta)
        app_scope = self.app_scope(session.app_name)
        user_scope = app_scope.child(segment(session.user_id))
        scope_data = {str(s): d for s, d in ((app_scope, app), (user_scope, user)) if d}
        marker = session._storage_update_marker
        marked = None if marker is None else _read_marker(marker)
        message = _message_of(event)
        store = await self._backing.ready()
        with use_scope(user_scope):
            # Two tries, as in get_session: a cached id may name a session
            # deleted since (its key then names another one, or none).
            for attempt in range(2):
                sid = await self._find(store, user_scope, session.id, cached=attempt == 0)
                if sid is None:
                    raise SessionMissing(f"Session {session.id} not found.")
                if marker is not None and (marked is None or marked[0] != sid):
                    # Read from another session (one deleted since, whose
                    # key now names this one), or marked by another service.
                    self._ids.pop((str(user_scope), session.id), None)
                    if attempt:
                        raise StaleSession(_STALE)
                    continue
                try:
                    expected = (
                        await _revision_of(store, sid, session) if marked is None else marked[1]
                    )
                    await store.append_messages(
                        sid,
                        [message],
                        data={**own, _UPDATED: event.timestamp},
                        scope_data=scope_data or None,
                        expected_count=expected,
                    )
                    break
                except NotFound as exc:
                    self._ids.pop((str(user_scope), session.id), None)
                    if attempt:
                        raise SessionMissing(f"Session {session.id} not found.") from exc
                except Conflict as exc:
                    raise StaleSession(_STALE) from exc
            else:  # pragma: no cover - the loop breaks or raises
                raise SessionMissing(f"Session {session.id} not found.")
        session.last_update_time = event.timestamp
        # The append matched ``expected`` messages under the row lock and added
        # one (the new seq is further on when retention trimmed the session).
        session._storage_update_marker = _marker(sid, expected + 1)
        return await super().append_event(session, event)

    # --- helpers ------------------------------------------------------------------

    async def _find(
        self, store: Store, user_scope: Scope, key: str, *, cached: bool = True
    ) -> str | None:
        """The id of the session ``key`` names (the cached one unless ``cached`` is False)."""
        known = self._ids.get((str(user_scope), key)) if cached else None
        if known is not None:
            return known
        try:
            found = await store.get_session_by_key(self._agent, key)
        except NotFound:
            return None
        except InvalidInput:  # a key cortex cannot hold names no session
            return None
        if len(self._ids) > 100_000:
            self._ids.clear()
        self._ids[(str(user_scope), key)] = found.id
        return found.id

    def _session_of(
        self, stored: CortexSession, app_name: str, user_id: str, events: list[Event]
    ) -> Session:
        state = dict(stored.data)
        updated = stored._reserved_data.get(_UPDATED)
        # Every value is already of its field's type: built without
        # validation, which cost more than the rest of a listing's row.
        return from_database(
            Session,
            {
                "id": stored.key or stored.id,
                "app_name": app_name,
                "user_id": user_id,
                "state": state,
                "events": events,
                "last_update_time": (
                    float(updated)
                    if isinstance(updated, int | float)
                    else stored.updated_at.timestamp()
                ),
            },
            {"_storage_update_marker": _marker(stored.id, stored.message_count)},
        )


def _marker(sid: str, count: int) -> str:
    """A session object's revision: the cortex session it was read from and its message count.

    The count alone would start again in a session created anew under the
    same id, so an object of the deleted one would pass for current.
    """
    return f"{sid}@{count}"


def _read_marker(marker: str) -> tuple[str, int] | None:
    """The (ses_ id, count) of a marker this service wrote; None for any other."""
    sid, _, count = marker.rpartition("@")
    if not sid or not count.isdigit() or len(count) > 18:
        return None
    return sid, int(count)


async def _revision_of(store: Store, sid: str, session: Session) -> int:
    """The stored revision a session object without a marker stands for, or StaleSession.

    As ADK's database service does for a hand-built session: storage that
    moved past the object's ``last_update_time`` is stale unless its newest
    event is the object's newest (or neither has any). The append then
    checks that revision under the row lock, like a marked object's.
    """
    found = await store.get_session_with_messages(sid, limit=1)
    updated = found.session._reserved_data.get(_UPDATED)
    stored_time = (
        float(updated) if isinstance(updated, int | float) else found.session.updated_at.timestamp()
    )
    if stored_time > session.last_update_time:
        newest = found.messages[-1] if found.messages else None
        newest_id = None if newest is None or newest.payload is None else newest.payload.get("id")
        same = newest is None if not session.events else newest_id == session.events[-1].id
        if not same:
            raise StaleSession(_STALE)
    return found.session.message_count


async def _older(
    store: Store, sid: str, newest: list[Message], wanted: int | None
) -> list[Message]:
    """Page backwards from ``newest`` until ``wanted`` messages (or all) are read."""
    messages = list(newest)
    while messages and messages[0].seq > 1 and (wanted is None or len(messages) < wanted):
        limit = (
            MAX_MESSAGE_LIMIT if wanted is None else min(wanted - len(messages), MAX_MESSAGE_LIMIT)
        )
        page = await store.recent_messages(sid, limit=limit, before_seq=messages[0].seq)
        if not page:
            break
        messages = page + messages
    if wanted is not None:
        messages = messages[-wanted:] if wanted else []
    return messages
