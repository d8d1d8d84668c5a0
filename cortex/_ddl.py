"""Online schema changes for the migrations: short locks, retries, resumable steps.

Every revision runs while the previous release keeps serving. The rules this
module carries out, so no revision has to remember them:

- every statement that needs a table lock waits at most :data:`LOCK_TIMEOUT`
  for it, then gives up and retries after a backoff. A DDL statement waiting
  for its lock queues every later reader and writer of the table behind it,
  so a long wait would be an outage even if the change itself is instant;
- indexes are built ``CONCURRENTLY`` (an invalid index left by a killed build
  is dropped and built again); constraints are added ``NOT VALID`` and then
  validated, which only takes a lock that lets reads and writes go on;
- each step checks the catalog first, so a revision killed half way (it runs
  in autocommit, step by step) simply runs again from the top;
- before a revision creates anything it checks that no object of those names
  exists that cortex did not make (:func:`check` with :func:`relation_check`,
  :func:`function_check`, :func:`policies_check`, :func:`extension_check`;
  :func:`preflight_check` once per run): a role that may only create in the
  schema could otherwise plant a table, a function or a policy that the
  revision adopts. "Cortex's" means owned by the migrating role
  (``current_user``) or by a superuser, which can act as any role anyway; a
  role the migrating role is merely a member of is not enough (a group role
  may have other members, and a superuser is a member of every role).

In offline mode (``cortex db sql``) each step prints its plain SQL.

It must not hold a transaction open across steps: callers run inside
Alembic's ``autocommit_block``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from alembic import context, op
from cortex._db.engine import DISTRIBUTED_SQL
from cortex.errors import SchemaMismatch, sqlstate_of

__all__ = [
    "CORTEX_TABLES",
    "LOCK_TIMEOUT",
    "REFUSED",
    "TENANT_ISOLATION",
    "Policy",
    "add_check",
    "add_foreign_key",
    "bypasses_rls",
    "check",
    "check_on",
    "constraint_exists",
    "count_rows",
    "create_index",
    "drop_index",
    "drop_trigger_sql",
    "extension_check",
    "function_check",
    "is_partial",
    "key_columns",
    "policies_check",
    "preflight_check",
    "rebuild_index",
    "relation_check",
    "replace_index",
    "run",
    "run_weak",
    "sessions_distributed",
    "unless_distributed_sql",
]

log = logging.getLogger("cortex")

# How long one DDL statement may wait for its table lock before it steps back.
# A probe of the running application (lock_timeout = 1s) queued behind it waits
# this long at most, plus the few milliseconds the change itself takes.
LOCK_TIMEOUT: Final = "200ms"
# Attempts before giving up; backoff doubles from 50 ms up to 2 s (about 90 s in all).
ATTEMPTS: Final = 60
_LOCK_NOT_AVAILABLE: Final = "55P03"
# Tables a where clause of count_rows may read.
_RLS_TABLES: Final = ("sessions", "messages", "pending_inputs", "session_markers", "scope_data")


def _offline() -> bool:
    return context.is_offline_mode()


def _bind() -> Connection:
    return op.get_bind()


def run(*statements: str) -> None:
    """Run ``statements`` atomically with a short lock timeout, retrying on lock timeouts.

    Several statements go in one ``DO`` block: a single statement, so they
    take effect together (the connection is in autocommit mode).

    Raises:
        sqlalchemy.exc.DBAPIError: any other database error, or the lock still
            unavailable after :data:`ATTEMPTS` tries.
    """
    if _offline():
        for statement in statements:
            op.execute(statement)
        return
    if len(statements) == 1:
        sql = statements[0]
    else:
        body = "".join(f"{statement};\n" for statement in statements)
        sql = f"DO $ddl$ BEGIN\n{body}END $ddl$"
    bind = _bind()
    delay = 0.05
    for attempt in range(1, ATTEMPTS + 1):
        bind.execute(sa.text(f"SET lock_timeout = '{LOCK_TIMEOUT}'"))
        try:
            bind.execute(sa.text(sql))
        except DBAPIError as exc:
            if sqlstate_of(exc) != _LOCK_NOT_AVAILABLE or attempt == ATTEMPTS:
                raise
            # Another transaction holds the table: step back so the application's
            # statements queued behind ours run, then try again.
            log.info("lock busy (attempt %d): retrying in %.2fs", attempt, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        else:
            return
        finally:
            bind.execute(sa.text("RESET lock_timeout"))


def run_weak(statement: str) -> None:
    """Run a statement whose lock never blocks reads or writes, outside a transaction.

    For ``CREATE/DROP INDEX CONCURRENTLY`` and ``VALIDATE CONSTRAINT``: they
    take SHARE UPDATE EXCLUSIVE, which conflicts with no DML, so a wait for it
    queues no application statement and needs no short timeout (a timeout
    would only leave an invalid index behind).
    """
    if _offline():
        op.execute(statement)
    else:
        _bind().execute(sa.text(statement))


# --- what a revision may find in its way ----------------------------------------
# Each check is one self-contained DO block, so the offline SQL (`cortex db sql`)
# refuses the same way when a DBA runs it.

# SQLSTATE of a check's refusal (a class of cortex's own): online it becomes SchemaMismatch.
REFUSED: Final = "CX001"
# What relation ``c`` is, in words.
_RELKIND: Final = (
    "CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'i' THEN 'index'"
    " WHEN 'I' THEN 'index' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'"
    " WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table' WHEN 'c' THEN 'type'"
    " ELSE 'relation' END"
)
# Whether role ``r`` is one whose objects cortex takes as its own.
_TRUSTED: Final = "(r.rolname = current_user OR r.rolsuper)"
_SCHEMA: Final = "pg_catalog.current_schema()::regnamespace"
_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")
_AGAIN: Final = "; drop or rename it, then run the migration again"
# Every cortex table and the tables the migrations write: none may be another role's.
CORTEX_TABLES: Final = (
    "alembic_version",
    "cortex_schema_compat",
    "sessions",
    "messages",
    "pending_inputs",
    "session_markers",
    "scope_data",
)


def _identifier(name: str) -> str:
    if _IDENTIFIER.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not a plain SQL identifier")
    return name


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _refuse(message: str, *arguments: str) -> str:
    """A PL/pgSQL statement raising cortex's refusal, ``message`` formatted with ``arguments``."""
    formatted = ", ".join([_literal(message), *arguments])
    return f"RAISE EXCEPTION USING ERRCODE = '{REFUSED}', MESSAGE = pg_catalog.format({formatted});"


def _block(declare: str, body: str) -> str:
    return f"DO $check$\nDECLARE\n{declare}\nBEGIN\n{body}\nEND\n$check$"


def _not_ours(what: str, name: str) -> str:
    """``what``: the object's kind, or (quoted) a PL/pgSQL expression giving it."""
    kind = what if what.startswith("hit.") else _literal(what)
    return _refuse(
        "%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it" + _AGAIN,
        kind,
        _literal(name),
        "hit.owner",
        "current_user",
    )


def relation_check(
    name: str,
    kind: str = "table",
    *,
    columns: Sequence[str] | None = None,
    having: Mapping[str, str] | None = None,
    on: str | None = None,
) -> str:
    """Refuse a relation ``name`` that is not cortex's ``kind`` (``table`` or ``index``).

    Passes when there is none (nor, for a table, a type of its name), or when
    it is one the migrating role (or a superuser) owns and, for a table, has
    exactly ``columns`` (``"name type"`` in order, :func:`format_type`'s
    spelling) and every column of ``having`` that exists has that type; an
    index must be on table ``on``.
    """
    table = kind == "table"
    kinds = "('r', 'p')" if table else "('i', 'I')"
    body = [
        f"SELECT c.oid, c.relkind, {_RELKIND} AS kind,"
        f" pg_catalog.pg_get_userbyid(c.relowner) AS owner, {_TRUSTED} AS trusted INTO hit",
        "FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner",
        f"WHERE c.relname = {_literal(_identifier(name))} AND c.relnamespace = {_SCHEMA};",
        "IF NOT FOUND THEN",
    ]
    if table:
        # CREATE TABLE makes a row type of the table's name: a type planted there blocks it.
        body += [
            "    SELECT pg_catalog.pg_get_userbyid(t.typowner) AS owner INTO hit"
            " FROM pg_catalog.pg_type AS t",
            f"    WHERE t.typname = {_literal(name)} AND t.typnamespace = {_SCHEMA};",
            "    IF FOUND THEN",
            "        " + _not_ours("type", name),
            "    END IF;",
        ]
    body += [
        "    RETURN;",
        "END IF;",
        "IF NOT hit.trusted THEN",
        "    " + _not_ours("hit.kind", name),
        "END IF;",
        f"IF hit.relkind NOT IN {kinds} THEN",
        "    "
        + _refuse(
            f"%s is a %s, not a {kind}: cortex did not make it" + _AGAIN,
            _literal(name),
            "hit.kind",
        ),
        "END IF;",
    ]
    if on is not None:
        body += [
            "IF NOT EXISTS (SELECT FROM pg_catalog.pg_index AS i"
            " JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid",
            f"    WHERE i.indexrelid = hit.oid AND t.relname = {_literal(_identifier(on))}"
            f" AND t.relnamespace = {_SCHEMA}) THEN",
            "    "
            + _refuse(
                "an index named %s exists on another table than %s: cortex did not build it"
                + _AGAIN,
                _literal(name),
                _literal(on),
            ),
            "END IF;",
        ]
    if columns is not None:
        expected = ", ".join(columns)
        body += [
            "SELECT pg_catalog.string_agg(a.attname || ' ' ||"
            " pg_catalog.format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)",
            "INTO listed FROM pg_catalog.pg_attribute AS a",
            "WHERE a.attrelid = hit.oid AND a.attnum > 0 AND NOT a.attisdropped;",
            f"IF listed IS DISTINCT FROM {_literal(expected)} THEN",
            "    "
            + _refuse(
                "table %s has the columns (%s), not the ones cortex makes (%s)" + _AGAIN,
                _literal(name),
                "listed",
                _literal(expected),
            ),
            "END IF;",
        ]
    for column, type_ in (having or {}).items():
        body += [
            "SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) INTO listed"
            " FROM pg_catalog.pg_attribute AS a",
            f"WHERE a.attrelid = hit.oid AND a.attname = {_literal(_identifier(column))}"
            " AND NOT a.attisdropped;",
            f"IF FOUND AND listed <> {_literal(type_)} THEN",
            "    "
            + _refuse(
                "column %s.%s is %s, not the %s cortex adds: cortex did not make it" + _AGAIN,
                _literal(name),
                _literal(column),
                "listed",
                _literal(type_),
            ),
            "END IF;",
        ]
    return _block("    hit record;\n    listed text;", "\n".join(body))


def function_check(name: str, arguments: str) -> str:
    """Refuse a function ``name`` that cortex did not make, or another signature of the name.

    ``arguments``: the argument types as :func:`oidvectortypes` spells them
    (``"text, text"``; ``""`` for none). A function of cortex's own with
    this signature passes: the revision's ``CREATE OR REPLACE`` then sets its
    body, security and settings. Another signature is refused whoever owns
    it: PostgreSQL may resolve a call meant for cortex's to the better match.
    """
    body = f"""
FOR hit IN
    SELECT p.oid::pg_catalog.regprocedure::text AS signature, p.prokind,
           pg_catalog.oidvectortypes(p.proargtypes) AS arguments,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner, {_TRUSTED} AS trusted
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
    WHERE p.proname = {_literal(_identifier(name))} AND p.pronamespace = {_SCHEMA}
LOOP
    IF NOT hit.trusted THEN
        {
        _refuse(
            "function %s exists, owned by %s, not by the migrating role %s: cortex did not make it"
            + _AGAIN,
            "hit.signature",
            "hit.owner",
            "current_user",
        )
    }
    END IF;
    IF hit.arguments <> {_literal(arguments)} OR hit.prokind <> 'f' THEN
        {
        _refuse(
            "function %s (owned by %s) is not cortex's %s(%s): a call meant for cortex's could"
            " run it" + _AGAIN,
            "hit.signature",
            "hit.owner",
            _literal(name),
            _literal(arguments),
        )
    }
    END IF;
END LOOP;"""
    return _block("    hit record;", body)


class Policy(NamedTuple):
    """A permissive ``FOR ALL`` policy to every role, as PostgreSQL prints it back (``pg_get_expr``)."""

    using: str
    checked: str


# The tenant policy of every cortex table, as PostgreSQL prints its expressions back.
_TENANT_MATCH: Final = "(tenant_id = current_setting('cortex.tenant'::text, true))"
TENANT_ISOLATION: Final = Policy(_TENANT_MATCH, _TENANT_MATCH)


def policies_check(table: str, policies: Mapping[str, Policy | None]) -> str:
    """Refuse a policy on ``table`` other than ``policies`` (a name mapped to None: any form).

    Policies are compared as the server prints them with only ``pg_catalog``
    on the search path, so an expression calling anything outside it shows
    that function's schema and differs. Only the table's owner can make a
    policy, so a difference means a change cortex did not make.
    """
    allowed = ", ".join(_literal(_identifier(policy)) for policy in policies) or "NULL"
    compare = []
    for policy, form in policies.items():
        if form is None:
            continue
        compare.append(
            f"    IF hit.name = {_literal(policy)} AND (NOT hit.polpermissive"
            f" OR hit.polcmd <> '*' OR hit.roles <> ARRAY['public']"
            f" OR hit.qual IS DISTINCT FROM {_literal(form.using)}"
            f" OR hit.checked IS DISTINCT FROM {_literal(form.checked)}) THEN\n"
            "        "
            + _refuse(
                "policy %s on %s is not the one cortex makes (%s to %s, USING %s WITH CHECK %s)"
                + _AGAIN,
                "hit.name",
                _literal(table),
                "CASE WHEN hit.polpermissive THEN 'permissive' ELSE 'restrictive' END",
                "hit.roles",
                "hit.qual",
                "hit.checked",
            )
            + "\n    END IF;"
        )
    body = f"""
SELECT c.oid INTO relation FROM pg_catalog.pg_class AS c
WHERE c.relname = {_literal(_identifier(table))} AND c.relnamespace = {_SCHEMA};
PERFORM pg_catalog.set_config('search_path', 'pg_catalog', true);
FOR hit IN
    SELECT p.polname::text AS name, p.polpermissive, p.polcmd,
           ARRAY(SELECT CASE WHEN o = 0 THEN 'public' ELSE pg_catalog.pg_get_userbyid(o)::text END
                 FROM pg_catalog.unnest(p.polroles) AS o ORDER BY 1) AS roles,
           pg_catalog.pg_get_expr(p.polqual, p.polrelid) AS qual,
           pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid) AS checked
    FROM pg_catalog.pg_policy AS p WHERE p.polrelid = relation
LOOP
    IF hit.name NOT IN ({allowed}) THEN
        {
        _refuse(
            "policy %s on %s is not cortex's: cortex did not make it" + _AGAIN,
            "hit.name",
            _literal(table),
        )
    }
    END IF;
{chr(10).join(compare)}
END LOOP;
PERFORM pg_catalog.set_config('search_path', path, true);"""
    return _block(
        "    hit record;\n    relation oid;\n"
        "    path text := pg_catalog.current_setting('search_path');",
        body,
    )


def extension_check(name: str) -> str:
    """Refuse extension ``name`` where another role created it, or put it in a schema cortex does not trust.

    Its owner may drop it (and, with CASCADE, the indexes built on it) or
    move it; the owner of its schema may drop its members.
    """
    body = f"""
SELECT pg_catalog.pg_get_userbyid(e.extowner) AS owner, {_TRUSTED} AS trusted,
       n.nspname AS schema, pg_catalog.pg_get_userbyid(n.nspowner) AS schema_owner,
       (n.oid IN ({_SCHEMA}, 'pg_catalog'::regnamespace) OR EXISTS (
           SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid = n.nspowner AND {_TRUSTED}
       )) AS schema_trusted
INTO hit
FROM pg_catalog.pg_extension AS e
JOIN pg_catalog.pg_roles AS r ON r.oid = e.extowner
JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace
WHERE e.extname = {_literal(_identifier(name))};
IF NOT FOUND THEN
    RETURN;
END IF;
IF NOT hit.trusted THEN
    {
        _refuse(
            "extension %s exists, created by %s, not by the migrating role %s or a superuser:"
            " cortex did not create it; drop it (or have a superuser create it), then run the"
            " migration again",
            _literal(name),
            "hit.owner",
            "current_user",
        )
    }
END IF;
IF NOT hit.schema_trusted THEN
    {
        _refuse(
            "extension %s is in schema %s, owned by %s: its owner could drop what cortex builds on"
            " it; move it, then run the migration again",
            _literal(name),
            "hit.schema",
            "hit.schema_owner",
        )
    }
END IF;"""
    return _block("    hit record;", body)


def preflight_check() -> str:
    """What every migration run refuses first: another role's objects that cortex's statements would reach.

    A function or operator in the schema named like one of ``pg_catalog``'s:
    PostgreSQL resolves an unqualified call to the best-matching signature in
    any schema on the search path, so ``public.pg_column_size(jsonb)`` would
    take a call cortex means for ``pg_catalog.pg_column_size("any")`` and run
    as the migrating role. A function named ``cortex…``, and any of
    :data:`CORTEX_TABLES`: another role's copy would be adopted or written to.
    """
    tables = ", ".join(_literal(table) for table in CORTEX_TABLES)
    body = f"""
SELECT f.kind, f.name, f.owner INTO hit FROM (
    SELECT 'function' AS kind, p.oid::pg_catalog.regprocedure::text AS name,
           pg_catalog.pg_get_userbyid(p.proowner) AS owner
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid = p.proowner
    WHERE p.pronamespace = {_SCHEMA} AND NOT {_TRUSTED}
      AND (p.proname LIKE 'cortex%' OR EXISTS (
          SELECT FROM pg_catalog.pg_proc AS q
          WHERE q.pronamespace = 'pg_catalog'::regnamespace AND q.proname = p.proname))
    UNION ALL
    SELECT 'operator', o.oid::pg_catalog.regoperator::text, pg_catalog.pg_get_userbyid(o.oprowner)
    FROM pg_catalog.pg_operator AS o JOIN pg_catalog.pg_roles AS r ON r.oid = o.oprowner
    WHERE o.oprnamespace = {_SCHEMA} AND NOT {_TRUSTED}
      AND EXISTS (
          SELECT FROM pg_catalog.pg_operator AS q
          WHERE q.oprnamespace = 'pg_catalog'::regnamespace AND q.oprname = o.oprname)
    UNION ALL
    SELECT {_RELKIND}, c.relname::text, pg_catalog.pg_get_userbyid(c.relowner)
    FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_roles AS r ON r.oid = c.relowner
    WHERE c.relnamespace = {_SCHEMA} AND NOT {_TRUSTED} AND c.relname IN ({tables})
) AS f ORDER BY f.kind, f.name LIMIT 1;
IF FOUND THEN
    {
        _refuse(
            "%s %s exists, owned by %s, not by the migrating role %s: cortex did not make it, and"
            " its statements could reach it" + _AGAIN,
            "hit.kind",
            "hit.name",
            "hit.owner",
            "current_user",
        )
    }
END IF;"""
    return _block("    hit record;", body)


def check_on(bind: Connection, *checks: str) -> None:
    """Run ``checks`` on ``bind``.

    Raises:
        SchemaMismatch: a check refused, naming the object and its owner.
    """
    for statement in checks:
        try:
            bind.execute(sa.text(statement))
        except DBAPIError as exc:
            if sqlstate_of(exc) != REFUSED:
                raise
            cause = exc.orig.__cause__ if exc.orig is not None else None
            message = getattr(cause, "message", None) or str(exc.orig)
            raise SchemaMismatch(message) from None


def check(*checks: str) -> None:
    """Inside a revision, before it creates anything: run ``checks`` (offline: print them)."""
    if _offline():
        for statement in checks:
            op.execute(statement)
        return
    check_on(_bind(), *checks)


def _scalar(sql: str, **params: object) -> object:
    return _bind().execute(sa.text(sql), params).scalar()


def constraint_exists(name: str, table: str) -> bool:
    """Whether ``table`` has a constraint of this name (offline: assume not).

    Only on ``table``: another role's table may carry a constraint of any name.
    """
    if _offline():
        return False
    return bool(
        _scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_constraint"
            " WHERE conname = :n AND conrelid = pg_catalog.to_regclass(:t))",
            n=name,
            t=table,
        )
    )


def _index_state(name: str) -> bool | None:
    """True: a valid index; False: an invalid one (a killed CONCURRENTLY build); None: none.

    :func:`relation_check` has made sure an index of that name is cortex's.
    """
    valid = _scalar(
        "SELECT i.indisvalid FROM pg_catalog.pg_index AS i"
        " JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid"
        f" WHERE c.relname = :n AND c.relnamespace = {_SCHEMA}",
        n=name,
    )
    return None if valid is None else bool(valid)


def create_index(name: str, definition: str, *, unique: bool = False) -> None:
    """``CREATE [UNIQUE] INDEX CONCURRENTLY name ON definition``, rebuilt if left invalid.

    ``definition`` starts with the table's name (``sessions (tenant_id, …)``).

    Raises:
        SchemaMismatch: the table is not cortex's, or a relation of that
            name is not cortex's index of it. Only ``table``'s owner can
            index it, but any role that may create in the schema can take a
            free name: cortex neither keeps nor drops what it did not build.
    """
    table = definition.split(maxsplit=1)[0]
    sql = f"CREATE {'UNIQUE ' if unique else ''}INDEX CONCURRENTLY {name} ON {definition}"
    check(relation_check(table), relation_check(name, "index", on=table))
    if _offline():
        op.execute(sql)
        return
    state = _index_state(name)
    if state is True:
        return
    if state is False:
        run_weak(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    run_weak(sql)


def drop_index(name: str) -> None:
    """``DROP INDEX CONCURRENTLY IF EXISTS name``."""
    run_weak(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def _index_fact(name: str, expression: str) -> object:
    """``expression`` over index ``name``'s ``pg_index`` row (``i``); None: no such index, or offline."""
    if _offline():
        return None
    return _scalar(
        f"SELECT {expression} FROM pg_catalog.pg_index AS i"
        " WHERE i.indexrelid = pg_catalog.to_regclass(:n)",
        n=name,
    )


def key_columns(name: str) -> int | None:
    """How many key columns index ``name`` has (None: no such index; offline: unknown)."""
    found = _index_fact(name, "i.indnkeyatts")
    return None if found is None else int(str(found))


def is_partial(name: str) -> bool | None:
    """Whether index ``name`` has a predicate (None: no such index; offline: unknown)."""
    found = _index_fact(name, "i.indpred IS NOT NULL")
    return None if found is None else bool(found)


def rebuild_index(name: str, definition: str, keys: int) -> None:
    """Make ``name`` the index ``definition`` (``keys`` key columns), online.

    An index that already has ``keys`` key columns is left alone, so a run
    killed at any step runs again from the top (the key count tells the two
    forms apart). See :func:`replace_index`.
    """
    if key_columns(name) == keys:
        return
    replace_index(name, definition)


def replace_index(name: str, definition: str) -> None:
    """Make ``name`` the index ``definition``, online; the caller tells when it is done already.

    The new form is built ``CONCURRENTLY`` beside the old one as
    ``<name>_next``, the old one dropped ``CONCURRENTLY``, and the new one
    renamed under a short lock timeout with retries. Killed at any step, it
    runs again from the top: a valid ``<name>_next`` is kept, an invalid one
    rebuilt.
    """
    building = f"{name}_next"
    create_index(building, definition)
    drop_index(name)
    run(f"ALTER INDEX IF EXISTS {building} RENAME TO {name}")


def add_check(table: str, name: str, condition: str) -> None:
    """Add a CHECK constraint without a long lock: ``NOT VALID``, then ``VALIDATE``."""
    if not constraint_exists(name, table):
        run(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    run_weak(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def add_foreign_key(
    table: str, name: str, columns: Sequence[str], target: str, *, on_delete: str
) -> None:
    """Add a foreign key without a long lock: ``NOT VALID``, then ``VALIDATE``."""
    if not constraint_exists(name, table):
        run(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({', '.join(columns)}) "
            f"REFERENCES {target} ON DELETE {on_delete} NOT VALID"
        )
    run_weak(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def bypasses_rls(bind: Connection | None = None) -> bool:
    """Whether the role running the migrations (or on ``bind``) is exempt from row-level security."""
    if bind is None and _offline():
        return True
    conn = bind if bind is not None else _bind()
    return bool(
        conn.execute(
            sa.text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user")
        ).scalar()
    )


def count_rows(bind: Connection, table: str, where: str = "true") -> int:
    """Exact rows of ``table`` matching ``where``, whatever row-level security says.

    For a role held to FORCE ROW LEVEL SECURITY it lifts FORCE first: the
    caller must be inside a transaction it rolls back (as the downgrade check
    is), so the change never commits.
    """
    if bind.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
        return 0
    if not bypasses_rls(bind):
        for name in _RLS_TABLES:
            if bind.execute(sa.text("SELECT to_regclass(:t)"), {"t": name}).scalar() is not None:
                bind.execute(sa.text(f"ALTER TABLE {name} NO FORCE ROW LEVEL SECURITY"))
    return int(bind.execute(sa.text(f"SELECT count(*) FROM {table} WHERE {where}")).scalar_one())


def unless_distributed_sql(table: str, body: str) -> str:
    """A ``DO`` block that runs ``body`` (PL/pgSQL statements) unless Citus distributes ``table``.

    For triggers: Citus refuses them on distributed tables, and a Citus
    database serves only the current release, which needs none.
    ``pg_dist_partition`` is asked only where the extension created it.
    """
    return f"""
DO $ddl$
BEGIN
    IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        IF EXISTS (
            SELECT FROM pg_catalog.pg_dist_partition
            WHERE logicalrelid = pg_catalog.to_regclass('{table}')
        ) THEN
            RETURN;
        END IF;
    END IF;
{body}
END
$ddl$
"""


def drop_trigger_sql(name: str, table: str) -> str:
    """Drop trigger ``name`` only where it exists.

    Citus refuses even ``DROP TRIGGER IF EXISTS`` on a distributed table,
    which never had it (:func:`unless_distributed_sql`).
    """
    return f"""
DO $ddl$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_trigger
        WHERE tgname = '{name}' AND tgrelid = pg_catalog.to_regclass('{table}')
    ) THEN
        DROP TRIGGER {name} ON {table};
    END IF;
END
$ddl$
"""


def sessions_distributed(bind: Connection) -> bool:
    """Whether Citus distributes ``sessions`` (its catalog is asked only where the extension is)."""
    citus = bind.execute(
        sa.text("SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
    ).scalar()
    return bool(citus) and bool(bind.execute(sa.text(DISTRIBUTED_SQL)).scalar())
