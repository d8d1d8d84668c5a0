"""The request and response bodies of ``cortex serve`` that are not cortex's own models.

Fields reuse the store's annotated types (cortex.models), so a request is
held to the same limits as a store call, and refused before it reaches one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cortex.models import (
    AgentId,
    Author,
    Data,
    Erasure,
    Flag,
    InterruptId,
    JsonValue,
    Message,
    Metadata,
    NewMessage,
    Reason,
    RetentionPolicy,
    Seq,
    Session,
    SessionId,
    SessionKey,
    Title,
)
from cortex.scope import Scope

__all__ = [
    "AbortBody",
    "AppendBody",
    "CountView",
    "CreateSessionBody",
    "EraseBody",
    "ErasuresView",
    "ForkBody",
    "MessagePage",
    "MessagesView",
    "Problem",
    "ResolveBody",
    "ResumeBody",
    "RetentionPolicyBody",
    "RetentionPolicyView",
    "RetentionRunBody",
    "RewindBody",
    "ScopeDataView",
    "SessionPageView",
    "UpdateSessionBody",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(BaseModel):
    """An error, as RFC 9457 problem details: ``title`` is cortex's error name."""

    type: str
    title: str
    status: int
    detail: str
    error: str
    errors: list[dict[str, Any]] | None = None


class CreateSessionBody(_Body):
    """``POST /v1/sessions``: Store.create_session's arguments."""

    agent_id: AgentId
    title: Title = ""
    metadata: Metadata | None = None
    is_default: Flag = False
    session_id: SessionId | None = None
    key: SessionKey | None = None
    data: Data | None = None


class UpdateSessionBody(_Body):
    """``PATCH /v1/sessions/{id}``: the host-owned fields to write; those left out stay."""

    title: Title | None = None
    metadata: Metadata | None = None


class AppendBody(_Body):
    """``POST /v1/sessions/{id}/messages``: give each message an ``id`` to make a retry safe."""

    messages: list[NewMessage] = Field(min_length=1, max_length=1000)
    data: Data | None = None
    expected_count: Seq | None = None


class ResumeBody(_Body):
    """``POST /v1/sessions/{id}/resume``: the answer to a pending input."""

    interrupt_id: InterruptId
    response: JsonValue = None
    author: Author = ""


class AbortBody(_Body):
    """``POST /v1/sessions/{id}/abort``."""

    reason: Reason


class ForkBody(_Body):
    """``POST /v1/sessions/{id}/fork``: copy messages 1 to ``through_seq`` (default: all)."""

    through_seq: Seq | None = None
    title: Title | None = None


class RewindBody(_Body):
    """``POST /v1/sessions/{id}/rewind``: delete the messages after ``to_seq``."""

    to_seq: Seq


class ResolveBody(_Body):
    """``POST /v1/agents/{agent_id}/resolve``: a named session, a keyed one, or the default."""

    session_id: SessionId | None = None
    key: SessionKey | None = None


class EraseBody(_Body):
    """``POST /v1/scope/erase``: the scope to erase (default: the request's)."""

    path: Scope | None = None
    dry_run: Flag = False


class RetentionRunBody(_Body):
    """``POST /v1/scope/retention/run``: where to apply (default: the request's scope)."""

    path: Scope | None = None
    dry_run: Flag = False


class RetentionPolicyBody(_Body):
    """``PUT /v1/scope/retention-policy``: a RetentionPolicy; durations in ISO 8601 (``P30D``)."""

    delete_idle_after: timedelta | None = None
    keep_last_messages: int | None = Field(default=None, ge=1, le=2**31 - 1)
    include_paused: bool = False

    def policy(self) -> RetentionPolicy:
        """The store's policy (its own limits checked: InvalidInput)."""
        return RetentionPolicy(**self.model_dump())


class SessionPageView(BaseModel):
    """A page of sessions and the cursor of the next (null: the last page)."""

    items: list[Session]
    next_cursor: str | None = None


class CountView(BaseModel):
    """How many sessions match."""

    count: int


class MessagePage(BaseModel):
    """A page of messages, oldest first, and the cursor of the next (null: none yet)."""

    items: list[Message]
    next_cursor: str | None = None


class MessagesView(BaseModel):
    """The messages an append stored (or found stored, on a retry)."""

    items: list[Message]


class ErasuresView(BaseModel):
    """Erasure receipts, newest first."""

    items: list[Erasure]


class ScopeDataView(BaseModel):
    """A scope's state document."""

    scope: Scope
    data: dict[str, Any]


class RetentionPolicyView(BaseModel):
    """The policy in force at ``path`` (null: none governs it)."""

    path: Scope
    policy: RetentionPolicy | None = None
