"""The operator console: a read-only role across tenants, and an audit trail.

Revision ID: 20261205000025
Revises: 20261205000024
Create Date: 2026-12-05

Why it exists: an operator console lists the sessions waiting on a human
(paused, interrupted, aborted) across every tenant an operator's token
covers, and keeps a record of what operators did. The application role
must not gain that reach: its ``tenant_isolation`` policies stay exactly as
they are. This revision adds:

- the role ``cortex_console`` (NOLOGIN), created when it is missing and the
  migrating role may create roles (a superuser or CREATEROLE); a DBA grants
  it to the console's own login. It gets ``SELECT`` only, and only on the
  columns the listing shows (``sessions`` without its documents,
  ``pending_inputs`` without payloads and schemas, ``session_markers``,
  ``console_actions``), and one more policy per table, ``console_scope``,
  ``FOR SELECT TO cortex_console``: a row is visible when its scope is at or
  beneath the transaction-local setting ``cortex.operator_scope`` (a path
  ending in ``/``; ``/`` alone is every tenant; unset or ``''`` is nothing),
  as ``public.cortex_console_sees(scope)`` decides (plpgsql, SECURITY
  INVOKER, ``search_path = pg_catalog, pg_temp``).
  A pending input is visible when its session is. Policies are permissive
  per role: the application role is not ``cortex_console`` and gets none of
  them, so binding ``cortex.operator_scope`` reads it nothing more;
- ``console_actions``: one row per operator action (``resume``, ``abort``,
  ``mark``, ``unmark``, ``sign_in``, ``sign_out``, ``erase``): ``id``,
  ``scope`` (the session's, or the operator's), ``session_id`` (NULL when
  no session), ``subject`` (the token's ``sub``), ``action``, ``outcome``
  (``ok`` or the ``CortexError`` class name), ``detail`` (a small JSON
  object: ids and counts, never an answer's content) and ``at``. Keyed by
  ``tenant_id`` first, ENABLE + FORCE row-level security with the tenant
  policy every table has; the application writes and reads it (never
  updates or deletes: ``cortex db grant``), the console reads it;
- ``ix_sessions_console_recent``: the non-idle sessions by state, newest
  first across tenants (``state, updated_at DESC, id DESC, tenant_id
  DESC``), so a page across a million sessions is an ordered index scan.

When the migrating role cannot create the missing role, the console's
grants and policies are left out (a warning says so) and everything else is
done: create ``cortex_console`` as a superuser before this revision runs
(docs/deployment/roles.md).

Safe with: every release from 20261201000009 on (they never read the new
table; the new policies apply to no role they use). Online: the table is
new, in this revision's transaction; the index is built CONCURRENTLY; each
policy is one statement under a short lock timeout with retries. Another
role's table, index or policy of these names is refused (ddl_v1), and so is
a ``cortex_console`` role that can log in or bypasses row-level security.

Downgrade drops the index, the table, the console policies and the function, and revokes
the role's grants; the role itself stays (roles belong to the cluster, and
another database may use it). ``data_loss`` counts the audit rows.
"""

from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from alembic import context, op
from cortex._revision_helpers import ddl_v1 as ddl
from cortex._revision_helpers.citus_v1 import distribute

revision: str = "20261205000025"
down_revision: str | Sequence[str] | None = "20261205000024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

_MATCH: Final = "tenant_id = current_setting('cortex.tenant', true)"
FUNCTION: Final = "cortex_console_sees"
# Whether a scope is at or beneath the bound operator scope ('acme/',
# 'acme/eu/'; '/' is every tenant; unset, empty or without its final '/':
# nothing). A function, not an expression in the policy: the planner gives
# an opaque test a third of the rows, so a page still walks the listing
# index in order; the expression's estimate (a few rows) made it sort.
CREATE_FUNCTION: Final = f"""
CREATE OR REPLACE FUNCTION public.{FUNCTION}(scope text) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    bound text := pg_catalog.current_setting('cortex.operator_scope', true);
BEGIN
    IF bound IS NULL OR pg_catalog.right(bound, 1) <> '/' THEN
        RETURN false;
    END IF;
    RETURN bound = '/' OR pg_catalog.starts_with(scope || '/', bound);
END
$fn$
"""
_BENEATH: Final = f"public.{FUNCTION}(scope)"
# A pending input is the console's when its session is (sessions' own policy decides).
_OF_VISIBLE_SESSION: Final = (
    "EXISTS (SELECT FROM public.sessions AS s"
    " WHERE s.tenant_id = pending_inputs.tenant_id AND s.id = pending_inputs.session_id)"
)
# Citus cannot carry a policy holding a subquery to its shards: there a
# pending input is the console's when its tenant is wholly beneath the bound
# scope (an operator of a subtree of a tenant sees none; docs/citus.md).
_OF_VISIBLE_TENANT: Final = f"public.{FUNCTION}(tenant_id)"
CONSOLE_POLICIES: Final = {
    "sessions": _BENEATH,
    "pending_inputs": _OF_VISIBLE_SESSION,
    "session_markers": _BENEATH,
    "console_actions": _BENEATH,
}
ON_CITUS: Final = {"pending_inputs": _OF_VISIBLE_TENANT}
# What the console may read: what a listing shows, never documents, payloads or content.
CONSOLE_GRANTS: Final = (
    "GRANT USAGE ON SCHEMA public TO cortex_console",
    "GRANT SELECT (tenant_id, id, agent_id, scope, title, state, pending_count, is_aborted,"
    " is_interrupted, message_count, created_at, updated_at) ON sessions TO cortex_console",
    "GRANT SELECT (tenant_id, session_id, raised_seq, interrupt_id, message, author, raised_at)"
    " ON pending_inputs TO cortex_console",
    "GRANT SELECT ON session_markers TO cortex_console",
    "GRANT SELECT ON console_actions TO cortex_console",
    f"GRANT EXECUTE ON FUNCTION public.{FUNCTION}(text) TO cortex_console",
)

CONSOLE_ACTIONS: Final = (
    "CREATE TABLE console_actions ("
    ' tenant_id text COLLATE "C" NOT NULL,'
    " id uuid NOT NULL,"
    ' scope text COLLATE "C" NOT NULL,'
    " session_id uuid,"
    " subject text NOT NULL,"
    " action text NOT NULL,"
    " outcome text NOT NULL,"
    " detail jsonb NOT NULL DEFAULT '{}'::jsonb,"
    " at timestamptz NOT NULL DEFAULT now(),"
    " CONSTRAINT pk_console_actions PRIMARY KEY (tenant_id, id),"
    " CONSTRAINT ck_console_actions_scope_tenant CHECK (tenant_id = split_part(scope, '/', 1)),"
    " CONSTRAINT ck_console_actions_action CHECK (action IN"
    " ('resume', 'abort', 'mark', 'unmark', 'sign_in', 'sign_out', 'erase')),"
    " CONSTRAINT ck_console_actions_outcome CHECK (outcome ~ '^(ok|[A-Z][A-Za-z]{0,63})$'),"
    " CONSTRAINT ck_console_actions_subject CHECK (char_length(subject) BETWEEN 1 AND 256),"
    " CONSTRAINT ck_console_actions_detail CHECK"
    " (jsonb_typeof(detail) = 'object' AND octet_length(detail::text) <= 4096))"
)
ACTION_INDEXES: Final = (
    "CREATE INDEX ix_console_actions_recent ON console_actions (at DESC, id DESC)",
    "CREATE INDEX ix_console_actions_tenant_recent ON console_actions"
    " (tenant_id, at DESC, id DESC)",
    "CREATE INDEX ix_console_actions_session ON console_actions"
    " (tenant_id, session_id, at DESC, id DESC) WHERE session_id IS NOT NULL",
)
INDEX: Final = "ix_sessions_console_recent"
INDEX_ON: Final = "sessions (state, updated_at DESC, id DESC, tenant_id DESC) WHERE state <> 'idle'"

_COLUMNS: Final = (
    "tenant_id text",
    "id uuid",
    "scope text",
    "session_id uuid",
    "subject text",
    "action text",
    "outcome text",
    "detail jsonb",
    "at timestamp with time zone",
)
_INDEX_NAMES: Final = (
    "pk_console_actions",
    "ix_console_actions_recent",
    "ix_console_actions_tenant_recent",
    "ix_console_actions_session",
)

# The role: made when missing and the migrating role may; refused when it is not a plain group.
ROLE_SQL: Final = """DO $console$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console') THEN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles
                       WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
            RAISE WARNING 'role cortex_console does not exist and % may not create roles: the'
                ' console''s grants and policies are left out (CREATE ROLE cortex_console'
                ' NOLOGIN as a superuser, before this revision runs)', current_user;
            RETURN;
        END IF;
        CREATE ROLE cortex_console NOLOGIN;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console'
               AND (rolcanlogin OR rolsuper OR rolbypassrls)) THEN
        RAISE EXCEPTION USING ERRCODE = 'CX001', MESSAGE = 'role cortex_console can log in or'
            ' bypasses row-level security: cortex did not make it; drop or rename it, then run'
            ' the migration again';
    END IF;
END
$console$"""


def _check() -> None:
    ddl.check(
        ddl.function_check(FUNCTION, "text"),
        ddl.relation_check("console_actions", columns=_COLUMNS),
        *(ddl.relation_check(name, "index", on="console_actions") for name in _INDEX_NAMES),
        *(
            ddl.policies_check(
                table, {"tenant_isolation": ddl.TENANT_ISOLATION, "console_scope": None}
            )
            for table in CONSOLE_POLICIES
        ),
    )


def _missing(table: str) -> bool:
    if context.is_offline_mode():
        return True
    found = op.get_bind().execute(sa.text("SELECT to_regclass(:t)"), {"t": f"public.{table}"})
    return found.scalar() is None


def _policy(table: str, using: str) -> tuple[str, str]:
    return (
        f"DROP POLICY IF EXISTS console_scope ON {table}",
        f"CREATE POLICY console_scope ON {table} FOR SELECT TO cortex_console USING ({using})",
    )


def console_sql() -> str:
    """The console's grants and policies, in one block that does nothing without the role."""
    body = "".join(f"    EXECUTE {_literal(step)};\n" for step in CONSOLE_GRANTS)
    for table, using in CONSOLE_POLICIES.items():
        plain = "".join(f"        EXECUTE {_literal(step)};\n" for step in _policy(table, using))
        if table not in ON_CITUS:
            body += plain.replace("        ", "    ", 1).replace("\n        ", "\n    ")
            continue
        citus = "".join(
            f"        EXECUTE {_literal(step)};\n" for step in _policy(table, ON_CITUS[table])
        )
        body += (
            "    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN\n"
            f"{citus}    ELSE\n{plain}    END IF;\n"
        )
    return (
        "DO $console$\nBEGIN\n"
        "    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console')"
        " THEN\n        RETURN;\n    END IF;\n"
        f"{body}END\n$console$"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def upgrade() -> None:
    _check()
    ddl.check(ROLE_SQL)
    op.execute(CREATE_FUNCTION)
    # In this revision's transaction: a new table nobody uses yet.
    if _missing("console_actions"):
        op.execute(CONSOLE_ACTIONS)
        distribute("console_actions")  # on Citus only (citus_v1)
        for statement in ACTION_INDEXES:
            op.execute(statement)
        op.execute("ALTER TABLE console_actions ENABLE ROW LEVEL SECURITY")
        op.execute("ALTER TABLE console_actions FORCE ROW LEVEL SECURITY")
        op.execute(
            "CREATE POLICY tenant_isolation ON console_actions"
            f" USING ({_MATCH}) WITH CHECK ({_MATCH})"
        )
    with op.get_context().autocommit_block():
        ddl.run(console_sql())
        ddl.create_index(INDEX, INDEX_ON)


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: the console's audit trail."""
    if bind.execute(sa.text("SELECT to_regclass('public.console_actions')")).scalar() is None:
        return []
    if not ddl.bypasses_rls(bind):
        bind.execute(sa.text("ALTER TABLE console_actions NO FORCE ROW LEVEL SECURITY"))
    n = int(bind.execute(sa.text("SELECT count(*) FROM console_actions")).scalar_one())
    return [f"{n} operator actions (console_actions)"] if n else []


_REVOKE: Final = """DO $console$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'cortex_console') THEN
        REVOKE SELECT ON sessions, pending_inputs, session_markers FROM cortex_console;
        REVOKE SELECT (tenant_id, id, agent_id, scope, title, state, pending_count, is_aborted,
            is_interrupted, message_count, created_at, updated_at) ON sessions FROM cortex_console;
        REVOKE SELECT (tenant_id, session_id, raised_seq, interrupt_id, message, author,
            raised_at) ON pending_inputs FROM cortex_console;
        REVOKE USAGE ON SCHEMA public FROM cortex_console;
    END IF;
END
$console$"""


# Citus drops a function over one connection per node, which the parallel
# DDL of the policies and the table before it would forbid.
_SEQUENTIAL_ON_CITUS: Final = """DO $citus$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        PERFORM pg_catalog.set_config('citus.multi_shard_modify_mode', 'sequential', true);
    END IF;
END
$citus$"""


def downgrade() -> None:
    with op.get_context().autocommit_block():
        ddl.drop_index(INDEX)
    op.execute(_SEQUENTIAL_ON_CITUS)
    for table in ("sessions", "pending_inputs", "session_markers"):
        op.execute(f"DROP POLICY IF EXISTS console_scope ON {table}")
    op.execute("DROP TABLE IF EXISTS console_actions")
    op.execute(f"DROP FUNCTION IF EXISTS public.{FUNCTION}(text)")
    op.execute(_REVOKE)
