"""Hot statements as server-side routines: tenant binding and statement in one round trip.

A call inside a transaction costs three round trips: ``BEGIN`` with the
tenant binding, the statement, ``COMMIT``. Most calls run one statement, so
``cortex db upgrade`` installs each hot statement shape as a PL/pgSQL
function that binds the tenant transaction-locally
(``set_config('cortex.tenant', …, true)``) and runs the very SQL cortex
would send, and the store calls it in autocommit: one round trip, one
implicit transaction, the binding gone when it ends (so PgBouncer's
transaction mode stays safe). PL/pgSQL keeps each statement's plan the way a
prepared statement does.

Nothing here is a second copy of cortex's SQL: every routine's body is the
compiled text of a statement builder (cortex._sql.sessions, cortex._sql.messages),
and its signature is what PostgreSQL reports when it prepares that text. The
routine's name is a digest of body and signature; its comment is the digest
of the SQL alone, which is how the store finds it (:func:`available`). A
store that finds no routine for a statement (a database upgraded by older
code, an offline install, a routine dropped by a later upgrade) runs the
statement in its own transaction instead: slower, never different.

Routines are SECURITY INVOKER: the caller's rights and row-level security
apply exactly as to the statement sent directly, and the tenant a routine
binds is one the application role could bind itself (SECURITY.md).
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any, Final, NamedTuple

import asyncpg
import sqlalchemy as sa

from cortex._db.executor import compile_composite, compile_statement, routine_key
from cortex._sql.hot import hot_composites, hot_statements
from cortex._sql.messages import Composite
from cortex._sql.params import NEW_TENANT_ID, SCOPE_TENANT
from cortex._sql.tables import TENANT_SETTING
from cortex.errors import SchemaMismatch

__all__ = [
    "PREFIX",
    "ROUTINE_SETTINGS",
    "available",
    "drop_sql",
    "grant_sql",
    "install",
    "installed_statements",
    "wanted_count",
]

log = logging.getLogger("cortex")

PREFIX: Final = "cortex_r_"

# Every cortex routine in the current schema, as regprocedure (name and argument
# types), with whether cortex's owner (the owner of ``sessions``) made it.
_ROUTINES_SQL: Final = r"""
SELECT p.oid::regprocedure::text AS signature, p.proname::text AS name, p.pronargs AS arguments,
       pg_catalog.obj_description(p.oid, 'pg_proc') AS key,
       pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(p.proname) AS qualified,
       pg_catalog.pg_get_userbyid(p.proowner)::text AS owner,
       p.proowner = (
           SELECT c.relowner FROM pg_catalog.pg_class AS c
           WHERE c.oid = pg_catalog.to_regclass('public.sessions')
       ) AS trusted
FROM pg_catalog.pg_proc AS p
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
WHERE p.pronamespace = 'public'::regnamespace
  AND p.proname LIKE 'cortex\_r\_%'
"""

# The same, cortex's own only: what a migration may drop or grant.
_OWN_ROUTINES_SQL: Final = f"SELECT * FROM ({_ROUTINES_SQL}) AS r WHERE r.trusted"


# Generic plans from the first call, because the plan cache re-plans a ``LIMIT $n``
# statement on every call (docs/query-plans.md, P9); a function's SET lasts for
# the call only, and Citus cannot route a generic plan, so not there.
ROUTINE_SETTINGS: Final = "SET plan_cache_mode = force_generic_plan"


def _settings(distributed: bool) -> str:
    return "" if distributed else ROUTINE_SETTINGS


# Parameters that carry the caller's tenant (cortex._sql.predicates.scope_params, cortex._calls.sessions.scope_columns).
_TENANT_PARAMS: Final = (SCOPE_TENANT, NEW_TENANT_ID)


def installed_statements(distributed: bool = False) -> list[sa.ClauseElement]:
    """The hot statements (cortex._sql.hot) installed as routines, each SQL text once."""
    # Shapes that compile alike (an exact-scope listing is one shape at every depth) are one.
    distinct = {compile_statement(stmt).key: stmt for stmt in hot_statements(distributed)}
    return list(distinct.values())


def wanted_count(distributed: bool = False) -> int:
    """How many routines this code installs (statements and two-statement shapes)."""
    return len(installed_statements(distributed)) + len(hot_composites(distributed))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _type_names(driver: asyncpg.Connection, oids: list[int]) -> list[str]:
    rows = await driver.fetch(
        "SELECT pg_catalog.format_type(t.oid, NULL) AS name"
        " FROM unnest($1::oid[]) WITH ORDINALITY AS t(oid, i) ORDER BY t.i",
        oids,
    )
    return [row["name"] for row in rows]


class _Definition(NamedTuple):
    name: str
    create: str
    key: str
    signature: str  # name(argument types), as regprocedure prints it
    tenant: int  # the position of the tenant argument, from 1


async def _definition(
    driver: asyncpg.Connection, stmt: sa.ClauseElement, distributed: bool
) -> _Definition:
    """How one statement shape becomes a routine.

    Raises:
        ValueError: the shape cannot be a routine (no tenant parameter, no
            result columns, or two result columns with one name).
    """
    compiled = compile_statement(stmt)
    # The bound tenant: the scope's, or (an INSERT that reads nothing back) the new row's.
    bound = [name for name in _TENANT_PARAMS if name in compiled.order]
    if not bound:
        raise ValueError("the statement binds no tenant")
    prepared = await driver.prepare(compiled.sql)
    params = await _type_names(driver, [t.oid for t in prepared.get_parameters()])
    attributes = prepared.get_attributes()
    columns = [a.name for a in attributes]
    if not columns or len(set(columns)) != len(columns):
        raise ValueError("a routine needs result columns with distinct names")
    results = await _type_names(driver, [a.type.oid for a in attributes])
    tenant = compiled.order.index(bound[0]) + 1
    signature = ", ".join(params)
    returns = ", ".join(f"{_quote(c)} {t}" for c, t in zip(columns, results, strict=True))
    digest = hashlib.sha256(
        f"{compiled.sql}\n{signature}\n{returns}\n{_settings(distributed)}".encode()
    ).hexdigest()
    name = PREFIX + digest[:24]
    run = f"  RETURN QUERY {compiled.sql};\n"
    create = _create(name, signature, returns, tenant, "", run, _settings(distributed))
    return _Definition(name, create, routine_key(compiled.sql), f"{name}({signature})", tenant)


def _create(
    name: str, signature: str, returns: str, tenant: int, declare: str, run: str, settings: str
) -> str:
    """CREATE FUNCTION for a routine: bind the tenant argument, then ``run`` (PL/pgSQL lines)."""
    body = (
        "#variable_conflict use_column\n"
        + (f"DECLARE\n{declare}" if declare else "")
        + "BEGIN\n"
        + f"  PERFORM pg_catalog.set_config('{TENANT_SETTING}', ${tenant}, true);\n"
        + run
        + "END\n"
    )
    if "$cortex$" in body:  # never: the SQL is compiled from cortex's own builders
        raise ValueError("the statement contains the body's quote tag")
    return (
        f"CREATE FUNCTION {name}({signature}) RETURNS TABLE ({returns})"
        f" LANGUAGE plpgsql VOLATILE {settings} AS $cortex${body}$cortex$"
    )


_PLACEHOLDER: Final = re.compile(r"\$([0-9]+)")


async def _composite_definition(
    driver: asyncpg.Connection, composite: Composite, distributed: bool
) -> _Definition:
    """How a two-statement shape becomes a routine: ``first ... INTO`` variables, then ``then``."""
    first, then = compile_statement(composite.first), compile_statement(composite.then)
    compiled = compile_composite(composite)
    order = compiled.order
    fed = dict(composite.fed)
    bound = [name for name in _TENANT_PARAMS if name in order]
    if not bound:
        raise ValueError("the statements bind no tenant")
    one = await driver.prepare(first.sql)
    two = await driver.prepare(then.sql)
    first_types = await _type_names(driver, [t.oid for t in one.get_parameters()])
    then_types = dict(
        zip(
            then.order,
            await _type_names(driver, [t.oid for t in two.get_parameters()]),
            strict=True,
        )
    )
    params = [*first_types, *(then_types[name] for name in order[len(first.order) :])]
    returned = one.get_attributes()
    variables = {a.name: f"v_{a.name}" for a in returned}
    variable_types = await _type_names(driver, [a.type.oid for a in returned])
    attributes = two.get_attributes()
    columns = [a.name for a in attributes]
    if (
        not columns
        or len(set(columns)) != len(columns)
        or not set(fed.values()) <= variables.keys()
    ):
        raise ValueError("a routine needs distinct result columns and the variables it feeds")
    results = await _type_names(driver, [a.type.oid for a in attributes])

    def renumber(match: re.Match[str]) -> str:
        name = then.order[int(match.group(1)) - 1]
        return variables[fed[name]] if name in fed else f"${order.index(name) + 1}"

    then_sql = _PLACEHOLDER.sub(renumber, then.sql)
    signature = ", ".join(params)
    returns = ", ".join(f"{_quote(c)} {t}" for c, t in zip(columns, results, strict=True))
    declare = "".join(
        f"  {variable} {kind};\n"
        for variable, kind in zip(variables.values(), variable_types, strict=True)
    )
    digest = hashlib.sha256(
        f"{first.sql}\n;\n{then_sql}\n{signature}\n{returns}\n{_settings(distributed)}".encode()
    ).hexdigest()
    name = PREFIX + digest[:24]
    tenant = order.index(bound[0]) + 1
    run = (
        f"  {first.sql} INTO {', '.join(variables.values())};\n"
        "  IF NOT FOUND THEN RETURN; END IF;\n"
        f"  RETURN QUERY {then_sql};\n"
    )
    create = _create(name, signature, returns, tenant, declare, run, _settings(distributed))
    return _Definition(name, create, compiled.key, f"{name}({signature})", tenant)


def drop_sql() -> str:
    """One statement that drops every cortex routine in the current schema (after a downgrade)."""
    return (
        "DO $cortex$ DECLARE f text; BEGIN"
        f" FOR f IN SELECT signature FROM ({_OWN_ROUTINES_SQL}) AS r LOOP"
        " EXECUTE 'DROP FUNCTION ' || f; END LOOP; END $cortex$"
    )


def grant_sql(role: str) -> str:
    """One statement granting EXECUTE on every cortex routine to ``role`` (a plain identifier)."""
    return (
        "DO $cortex$ DECLARE f text; BEGIN"
        f" FOR f IN SELECT signature FROM ({_OWN_ROUTINES_SQL}) AS r LOOP"
        f" EXECUTE 'GRANT EXECUTE ON FUNCTION ' || f || ' TO {_quote(role)}'; END LOOP; END $cortex$"
    )


async def install(
    driver: asyncpg.Connection, roles: list[str], *, distributed: bool = False
) -> tuple[int, int]:
    """Make the current schema's routines exactly this code's hot statements; (created, dropped).

    Routines this code does not use (an older release's, or ones whose
    statement no longer prepares against the schema) are dropped; a store
    that still calls one falls back to a transaction (cortex._db.executor).
    Existing routines with this code's name are kept as they are: the name
    is a digest of the body and the signature. ``roles`` (the application
    roles) get EXECUTE on each. Run as the owner, under the migration lock.

    ``distributed`` (a Citus coordinator): each routine is distributed by
    its tenant argument and co-located with ``sessions``, so Citus pushes a
    call down to the worker holding the tenant's shards, where the binding
    and the statement run next to the data (docs/citus.md).
    """
    wanted: dict[str, _Definition] = {}
    shapes: list[Any] = [*installed_statements(distributed), *hot_composites(distributed)]
    for shape in shapes:
        # A shape PostgreSQL refuses costs its routine only, not the
        # transaction the rest are installed in.
        await driver.execute("SAVEPOINT cortex_routine")
        try:
            if isinstance(shape, Composite):
                definition = await _composite_definition(driver, shape, distributed)
            else:
                definition = await _definition(driver, shape, distributed)
        except (ValueError, asyncpg.PostgresError) as exc:
            await driver.execute("ROLLBACK TO SAVEPOINT cortex_routine")
            log.warning("statement not installed as a routine: %s", exc)
            continue
        finally:
            await driver.execute("RELEASE SAVEPOINT cortex_routine")
        wanted[definition.name] = definition
    rows = await driver.fetch(_ROUTINES_SQL)
    for row in rows:
        if not row["trusted"]:
            # Another role made it: cortex neither adopts, grants nor runs it.
            raise SchemaMismatch(
                f"function {row['signature']} is owned by {row['owner']}, not by cortex's"
                " owner: cortex did not create it; drop it (it may be hostile) and run the"
                " upgrade again"
            )
    present = {row["name"]: row["signature"] for row in rows}
    dropped = 0
    for name, signature in present.items():
        if name not in wanted:
            await driver.execute(f"DROP FUNCTION {signature}")
            dropped += 1
    created = 0
    for name, definition in wanted.items():
        if name not in present:
            await driver.execute(definition.create)
            await driver.execute(f"COMMENT ON FUNCTION {name} IS '{definition.key}'")
            if distributed:
                await driver.execute(
                    "SELECT pg_catalog.create_distributed_function($1::regprocedure, $2,"
                    " colocate_with := 'sessions')",
                    definition.signature,
                    f"${definition.tenant}",
                )
            created += 1
        for role in roles:
            await driver.execute(f"GRANT EXECUTE ON FUNCTION {name} TO {_quote(role)}")
    return created, dropped


async def available(driver: asyncpg.Connection) -> dict[str, str]:
    """The routines installed: statement key (:func:`cortex._db.executor.routine_key`) to call SQL.

    Only routines cortex's owner made count, and each is called by its
    schema-qualified name, so no function another role planted is ever run.
    """
    found: dict[str, str] = {}
    clashes: set[str] = set()
    for row in await driver.fetch(_ROUTINES_SQL):
        key: Any = row["key"]
        if not isinstance(key, str) or not row["trusted"]:
            continue
        placeholders = ", ".join(f"${i}" for i in range(1, row["arguments"] + 1))
        if key in found:
            clashes.add(key)
        found[key] = f"SELECT * FROM {row['qualified']}({placeholders})"
    for key in clashes:  # two routines claim one statement: trust neither
        del found[key]
    return found
