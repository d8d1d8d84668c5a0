"""cortex: an async, multi-tenant, scoped session store for AI-agent backends.

Everything here is the public contract (docs: shared design contract). Import
from ``cortex`` only; modules whose names start with ``_`` are private.
"""

from cortex._calls.messages import SessionHistory
from cortex._version import __version__ as __version__
from cortex.console import (
    ActionKind,
    ActionPage,
    ConsoleAction,
    OperatorView,
    WaitingFilter,
    WaitingPage,
    WaitingSession,
)
from cortex.errors import (
    AlreadyAborted,
    Conflict,
    CortexError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidScope,
    NotFound,
    OperationTimeout,
    SchemaMismatch,
    ScopeMissing,
    ScopeViolation,
    SessionAborted,
)
from cortex.models import (
    Erasure,
    ErasureReport,
    ErasureState,
    ForkedFrom,
    FunctionResponse,
    ImportReport,
    ListFilter,
    Message,
    NewMessage,
    PendingInput,
    RequestedInput,
    RetentionPolicy,
    RetentionReport,
    Session,
    SessionDetail,
    SessionState,
)
from cortex.scope import Scope, current_scope, use_scope
from cortex.store import Store, connect

__all__ = [
    "ActionKind",
    "ActionPage",
    "AlreadyAborted",
    "Conflict",
    "ConsoleAction",
    "CortexError",
    "DatabaseError",
    "DatabaseUnavailable",
    "Erasure",
    "ErasureReport",
    "ErasureState",
    "ForkedFrom",
    "FunctionResponse",
    "ImportReport",
    "InvalidInput",
    "InvalidScope",
    "ListFilter",
    "Message",
    "NewMessage",
    "NotFound",
    "OperationTimeout",
    "OperatorView",
    "PendingInput",
    "RequestedInput",
    "RetentionPolicy",
    "RetentionReport",
    "SchemaMismatch",
    "Scope",
    "ScopeMissing",
    "ScopeViolation",
    "Session",
    "SessionAborted",
    "SessionDetail",
    "SessionHistory",
    "SessionState",
    "Store",
    "WaitingFilter",
    "WaitingPage",
    "WaitingSession",
    "connect",
    "current_scope",
    "use_scope",
]
