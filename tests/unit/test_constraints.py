"""The constraint-name table: every name a call can violate maps to a cortex error."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from cortex import Conflict, CortexError, InvalidInput
from cortex._calls.constraints import REFUSALS, Writing, refusals
from cortex._db.transaction import RetryTransaction
from cortex._sql.tables import (
    DATA_SIZE_REPORTED,
    PK_MESSAGES,
    PK_SESSIONS,
    UQ_SESSIONS_DEFAULT,
    UQ_SESSIONS_KEY,
    metadata,
)
from cortex.scope import Scope

# Named in the schema, and out of every call's reach: why, for each.
OUT_OF_REACH = {
    "ck_sessions_scope_depth": "a Scope is 1 to 8 segments before any SQL runs",
    "ck_sessions_scope_tenant": "cortex derives tenant_id from the scope it writes",
    "ck_sessions_pending_count": "kept in the transaction that adds or removes the inputs",
    "ck_sessions_message_count": "raised only by the statement that inserts the messages",
    "ck_sessions_data_stored_size": "bounded_data refuses a document long before this size",
    "pk_pending_inputs": "a message's questions have distinct ids, and each message its seq",
    "fk_pending_inputs_tenant_id_session_id_sessions": "written under the session's row lock",
    "ck_messages_session_seq": "cortex writes both columns of every message",
    "fk_messages_tenant_id_session_id_sessions": "written under the session's row lock",
    "uq_messages_session_seq": "seq is assigned under the session's row lock",
    "pk_session_markers": "markers are written with ON CONFLICT",
    "ck_session_markers_kind": "the kinds are cortex's constants",
    "pk_cortex_schema_compat": "written by migrations only",
    "ck_cortex_schema_compat_singleton": "written by migrations only",
    "pk_scope_data": "scope documents are merged with ON CONFLICT",
    "ck_scope_data_scope_tenant": "the tenant comes from the session row",
    "ck_sessions_trimmed_count": "only a retention trim raises it, by the rows it removed",
    "pk_erasures": "a receipt's id is a new UUIDv7",
    "pk_metadata_pairs": "written only by cortex's trigger, with ON CONFLICT DO NOTHING",
    "uq_erasures_running": "an erasure begins with ON CONFLICT DO NOTHING and then joins the running one",
    "ck_erasures_scope_tenant": "cortex derives tenant_id from the scope it erases",
    "pk_console_actions": "an audit row's id is a new UUIDv7",
    "ck_console_actions_scope_tenant": "the scope is the session's or the caller's, in the bound tenant",
    "ck_console_actions_action": "the boundary accepts only an ActionKind",
    "ck_console_actions_outcome": "the boundary checks the same pattern (Outcome)",
    "ck_console_actions_subject": "the boundary checks the same length (Subject)",
    "ck_console_actions_detail": "the boundary allows half its size (ActionDetail)",
    "ck_erasures_state": "the states are cortex's constants",
    "ck_erasures_finished": "the statement that marks a receipt done sets finished_at with it",
    "ck_erasures_counts": "the counts only grow, by the rows each batch removed",
    "pk_retention_policies": "a policy is written with ON CONFLICT on its scope",
    "ck_retention_policies_scope_tenant": "cortex derives tenant_id from the scope it writes",
    "ck_retention_policies_delete_idle_after": "RetentionPolicy refuses a non-positive duration",
    "ck_retention_policies_keep_last_messages": "RetentionPolicy refuses a negative count",
}


def _schema_names() -> set[str]:
    names = {c.name for t in metadata.tables.values() for c in t.constraints}
    names |= {i.name for t in metadata.tables.values() for i in t.indexes if i.unique}
    return {str(n) for n in names if n is not None} | {DATA_SIZE_REPORTED}


def test_every_constraint_is_mapped_or_out_of_reach() -> None:
    names = _schema_names()
    unmapped = names - set(REFUSALS) - set(OUT_OF_REACH)
    assert unmapped == set(), (
        "map these in cortex/_calls/constraints.py (REFUSALS), or list them in"
        f" OUT_OF_REACH with why no call can violate them: {sorted(unmapped)}"
    )
    assert set(REFUSALS) & set(OUT_OF_REACH) == set()
    assert set(REFUSALS) | set(OUT_OF_REACH) <= names, "a name the schema does not have"


SCOPE = Scope.parse("t/u")
WRITING = Writing(SCOPE, session_id=uuid.UUID(int=1), agent_id="a", key="k")


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_each_refusal_is_a_cortex_error(name: str) -> None:
    built = REFUSALS[name].build(WRITING, name)
    assert isinstance(built, Conflict | InvalidInput)


def _unique(name: str | None) -> asyncpg.UniqueViolationError:
    fields = {"C": "23505", "M": "duplicate key"} | ({} if name is None else {"n": name})
    exc = asyncpg.UniqueViolationError.new(fields)
    assert isinstance(exc, asyncpg.UniqueViolationError)
    return exc


def _check(name: str | None) -> asyncpg.CheckViolationError:
    fields = {"C": "23514", "M": "check"} | ({} if name is None else {"n": name})
    exc = asyncpg.CheckViolationError.new(fields)
    assert isinstance(exc, asyncpg.CheckViolationError)
    return exc


def _refused(exc: Exception, could: list[str], retry: list[str] | None = None) -> BaseException:
    raised = (RetryTransaction, CortexError, asyncpg.PostgresError)
    with pytest.raises(raised) as info, refusals(WRITING, could, retry=retry or []):
        raise exc
    return info.value


def test_the_reported_name_decides_also_from_a_shard() -> None:
    could = [UQ_SESSIONS_DEFAULT, UQ_SESSIONS_KEY, PK_SESSIONS]
    assert "default" in str(_refused(_unique("uq_sessions_default_102020"), could))
    assert "keyed 'k'" in str(_refused(_unique(UQ_SESSIONS_KEY), could))
    assert "taken" in str(_refused(_unique(PK_SESSIONS), could))


def test_a_nameless_violation_is_the_first_possible_of_its_sqlstate() -> None:
    could = [UQ_SESSIONS_KEY, PK_SESSIONS, DATA_SIZE_REPORTED]
    assert "keyed" in str(_refused(_unique(None), could))
    refused = _refused(_check(None), could)
    assert isinstance(refused, InvalidInput)
    assert DATA_SIZE_REPORTED in str(refused)


def test_retry_and_cause() -> None:
    exc = _unique(PK_MESSAGES)
    refused = _refused(exc, [PK_MESSAGES], retry=[PK_MESSAGES])
    assert isinstance(refused, RetryTransaction)
    assert refused.__cause__ is exc
    mapped = _refused(exc, [PK_MESSAGES])
    assert isinstance(mapped, CortexError)
    assert mapped.__cause__ is exc


def test_a_name_the_statement_cannot_violate_passes_unchanged() -> None:
    exc = _unique("uq_messages_session_seq")
    assert _refused(exc, [PK_MESSAGES]) is exc
    nameless = _check(None)
    assert _refused(nameless, [PK_MESSAGES]) is nameless
