"""The OpenAI Agents SDK on cortex: ``CortexSession``, a ``Session`` backed by a Store.

How the SDK's names map onto cortex:

- A ``CortexSession("user-123", store)`` is the cortex session of agent
  ``"openai-agents"`` (configurable) whose key is ``"user-123"``, at the
  base scope: the one given at construction, else the caller's current
  scope (``with cortex.use_scope("acme"): ...``). The tenant is that scope's
  first segment; row-level security walls tenants apart.
- Each item is one message: the item dict as the payload (stored verbatim
  and returned identical), its text as ``content`` and its role (``user``,
  ``assistant``, ``system``; ``tool`` for calls, outputs and reasoning).
- The cortex session is created by the first ``add_items`` (concurrent
  first writes share it); reading or clearing a session that was never
  written creates nothing.

Requires the ``openai-agents`` extra; nothing else in cortex imports this
module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, TypeVar, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings
from pydantic import ValidationError
from sqlalchemy.engine import URL

from cortex.errors import InvalidInput, NotFound
from cortex.integrations._backing import Backing
from cortex.models import MAX_APPEND_BATCH, MAX_MESSAGE_LIMIT, Message, NewMessage, Role
from cortex.scope import Scope, use_scope
from cortex.store import Store

__all__ = ["CortexSession"]

_ROLES: Final[dict[str, Role]] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
}
# Text kept in a message's content, for previews and search; the whole item
# is the payload.
_CONTENT_CHARS: Final = 64 * 1024
# Lookups of the key per call: a cached id, then the key twice (a session
# deleted between its lookup and its use is looked up once more).
_TRIES: Final = 3
# Base scopes whose session id one object remembers.
_MAX_CACHED: Final = 10_000

T = TypeVar("T")


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    else:
        text = str(item.get("output", "")) if isinstance(item.get("output"), str) else ""
    return text[:_CONTENT_CHARS].replace("\x00", "")


def _messages_of(items: object) -> list[NewMessage]:
    """One message per item, or InvalidInput for an input that is not a list of item dicts."""
    if isinstance(items, str | bytes | bytearray | Mapping) or not isinstance(items, Iterable):
        raise InvalidInput(f"items: expected a list of item dicts, got {type(items).__name__}")
    batch = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInput(f"items[{index}]: expected an item dict, got {type(item).__name__}")
        role = _ROLES.get(str(item.get("role", "")), "tool")
        batch.append(NewMessage(role, _text(item), payload=item))
    return batch


def _item_of(message: Message) -> TResponseInputItem:
    """The item a message holds; for one written through cortex itself, a message item of its text."""
    if isinstance(message.payload, dict):
        return cast(TResponseInputItem, message.payload)
    role = message.role if message.role in ("assistant", "system") else "user"
    return cast(TResponseInputItem, {"role": role, "content": message.content})


class CortexSession:
    """An Agents SDK session on a cortex store (implements ``agents.memory.Session``).

    ``session_id`` is the host's name for the conversation. It is stored as
    a cortex session key, which is trimmed: an id with leading or trailing
    whitespace is refused (InvalidInput) rather than silently sharing the
    history of its trimmed form. Case matters (``"Foo"`` and ``"foo"`` are
    two sessions).

    Build it on a store (``CortexSession("user-123", store)``, which stays
    the caller's) or a URL (the database must have been prepared by ``cortex
    db upgrade``). On a URL the store is opened as ``cortex.connect`` opens
    one, at the first call (or ``open()``), and shared by the adapters on
    that URL with equal pool options in the event loop (one pool for them
    all); ``close()`` releases this session's share on the running loop,
    and the last share closed disposes the engine. ``session_settings``:
    the default ``limit`` of ``get_items`` (a ``SessionSettings`` or a dict).
    Every method is cancellation-safe: a cancelled call's transaction is
    either committed or rolled back whole (cortex's transaction runner).
    """

    def __init__(
        self,
        session_id: str,
        store_or_url: Store | str | URL,
        *,
        scope: Scope | str | None = None,
        agent_id: str = "openai-agents",
        session_settings: SessionSettings | dict[str, Any] | None = None,
        **pool_options: Any,
    ) -> None:
        if not isinstance(session_id, str) or not session_id or session_id != session_id.strip():
            raise InvalidInput(
                "session_id: must be a non-empty string, without leading or trailing whitespace"
            )
        self.session_id = session_id
        try:
            resolved = SessionSettings().resolve(session_settings)
        except ValidationError as exc:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise InvalidInput(f"session_settings: {reasons}") from None
        except TypeError as exc:
            raise InvalidInput(f"session_settings: {exc}") from None
        self.session_settings: SessionSettings | None = resolved
        self._backing = Backing(store_or_url, scope, **pool_options)
        self._agent = agent_id
        # Base scope -> ses_ id of the session under this key there, once known
        # to exist; an id found deleted is dropped and the key looked up again.
        self._ids: dict[str, str] = {}

    @property
    def store(self) -> Store:
        """The cortex store underneath.

        Raises:
            InvalidInput: built on a URL, and not yet opened on the running loop.
        """
        return self._backing.store

    async def open(self) -> Store:
        """Open the store now (a URL-built session opens it at its first call anyway)."""
        return await self._backing.ready()

    async def close(self) -> None:
        """Release this session's share of a URL-built store (the last share disposes the engine).

        Call it on each event loop the session was used on; a borrowed store stays open.
        """
        await self._backing.close()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items (default: ``session_settings.limit``, else all), oldest first."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidInput(f"limit: expected an integer or None, got {type(limit).__name__}")
        wanted = limit if limit is not None else self._default_limit()
        if wanted is not None and wanted <= 0:
            return []

        async def read(store: Store, sid: str) -> list[Message]:
            messages: list[Message] = []
            before: int | None = None
            while wanted is None or len(messages) < wanted:
                page_size = MAX_MESSAGE_LIMIT
                if wanted is not None:
                    page_size = min(wanted - len(messages), MAX_MESSAGE_LIMIT)
                page = await store.recent_messages(sid, limit=page_size, before_seq=before)
                messages = page + messages
                if len(page) < page_size or page[0].seq == 1:
                    break
                before = page[0].seq
            return messages

        found = await self._on_session(read, create=False)
        return [] if found is None else [_item_of(m) for m in found]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items in order; up to 1,000 (and 64 MiB) are stored in one transaction.

        A longer list is stored 1,000 at a time, each chunk atomic.

        Raises:
            InvalidInput: ``items`` is not a list of dicts (nothing is
                stored), or an item is not JSON or breaks a limit (its chunk
                is not stored).
        """
        batch = _messages_of(items)
        for start in range(0, len(batch), MAX_APPEND_BATCH):
            chunk = batch[start : start + MAX_APPEND_BATCH]

            async def append(store: Store, sid: str, chunk: list[NewMessage] = chunk) -> None:
                await store.append_messages(sid, chunk)

            await self._on_session(append, create=True)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item (None if there is none); concurrent pops take distinct items."""

        async def pop(store: Store, sid: str) -> Message | None:
            return await store.pop_message(sid)

        popped = await self._on_session(pop, create=False)
        return None if popped is None else _item_of(popped)

    async def clear_session(self) -> None:
        """Remove every item; the session (and its key) remain."""

        async def clear(store: Store, sid: str) -> None:
            await store.clear_messages(sid)

        await self._on_session(clear, create=False)

    def _default_limit(self) -> int | None:
        return None if self.session_settings is None else self.session_settings.limit

    async def _on_session(
        self, act: Callable[[Store, str], Awaitable[T]], *, create: bool
    ) -> T | None:
        """``act`` on the session this key names now in the base scope; None if there is none.

        A cached id whose session is gone (deleted, perhaps created again
        under this key by another worker) is dropped and the key resolved
        afresh; ``create`` makes the session when the key names none.
        """
        store = await self._backing.ready()
        base = self._backing.base()
        where = str(base)
        with use_scope(base):
            for attempt in range(_TRIES):
                sid = self._ids.get(where) if attempt == 0 else None
                if sid is None:
                    try:
                        if create:
                            sid = (await store.resolve_session(self._agent, key=self.session_id)).id
                        else:
                            sid = (await store.get_session_by_key(self._agent, self.session_id)).id
                    except NotFound:
                        return None
                    if len(self._ids) >= _MAX_CACHED:
                        self._ids.clear()
                    self._ids[where] = sid
                try:
                    return await act(store, sid)
                except NotFound:
                    if self._ids.get(where) == sid:
                        del self._ids[where]
                    if attempt == _TRIES - 1 and create:
                        raise
        return None
