"""cortex: an async, multi-tenant, scoped session store for AI-agent backends.

Everything here is the public contract (docs: shared design contract). Import
from ``cortex`` only; modules whose names start with ``_`` are private.
"""

from cortex._calls.messages import SessionHistory
from cortex._version import __version__ as __version__
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
    SessionCursor,
    SessionDetail,
    SessionPage,
    SessionState,
)
from cortex.scope import Scope, current_scope, use_scope
from cortex.store import Store, connect

__all__ = [
    "AlreadyAborted",
    "Conflict",
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
    "SessionCursor",
    "SessionDetail",
    "SessionHistory",
    "SessionPage",
    "SessionState",
    "Store",
    "connect",
    "current_scope",
    "use_scope",
]
