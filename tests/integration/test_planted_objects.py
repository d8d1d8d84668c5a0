"""Objects cortex did not create: a role that may create in cortex's schema plants them.

PostgreSQL 14 and older grant CREATE on ``public`` to every role, and a
deployment may grant it. Such a role can plant a function under the name and
comment cortex finds its routines by, or an overload that a statement's
varchar binds match exactly. Run by the owner (an operator's CLI), either
would run with the owner's rights. cortex must never run one: it trusts only
routines its owner made, calls its functions by qualified name and exact
argument types, and says loudly when another role may create objects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterator

import asyncpg
import pytest

import cortex
from cortex import ListFilter, NewMessage, SchemaMismatch, ids, use_scope
from cortex._db.executor import compile_statement, routine_key
from cortex._db.routines import _definition
from cortex._sql.predicates import FilterShape
from cortex._sql.sessions import page_statement
from cortex.cli import main
from cortex.migrate import upgrade
from tests.conftest import (
    CITUS_URL,
    Database,
    admin,
    asyncpg_dsn,
    create_database,
    drop_database,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        CITUS_URL is not None, reason="plants objects as a role the Citus lane does not propagate"
    ),
]

# Run with the caller's rights, this lifts row-level security both ways: the
# caller's role gets BYPASSRLS (a superuser caller) and the table loses RLS (its owner).
_ESCALATE = """
    BEGIN
        EXECUTE pg_catalog.format('ALTER ROLE %I BYPASSRLS', '{role}');
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    BEGIN
        EXECUTE 'ALTER TABLE public.sessions DISABLE ROW LEVEL SECURITY';
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
"""

# The whole-tenant search page: not a routine cortex installs (searches keep custom plans).
_SEARCH_PAGE = FilterShape(1, False, False, False, True, None, False)


@pytest.fixture
def db(server_url: str) -> Iterator[Database]:
    """A database of its own: the test changes the schema's rights."""
    database = create_database(server_url)
    yield database
    asyncio.run(admin(database.owner_url, f'DROP OWNED BY "{database.app_role}"'))
    drop_database(server_url, database)


async def _escalated(db: Database) -> tuple[bool, bool]:
    """(the application role has BYPASSRLS, sessions has lost row-level security)."""
    conn = await asyncpg.connect(asyncpg_dsn(db.owner_url))
    try:
        bypass = await conn.fetchval(
            "SELECT rolbypassrls FROM pg_roles WHERE rolname = $1", db.app_role
        )
        enabled = await conn.fetchval(
            "SELECT relrowsecurity FROM pg_class WHERE oid = 'public.sessions'::regclass"
        )
        return bool(bypass), not enabled
    finally:
        await conn.close()


async def _as_app(db: Database, *statements: str) -> None:
    await admin(db.app_url, *statements)


async def _plant_search_routine(db: Database) -> str:
    """As the application role: a routine for the search page that escalates; its name."""
    stmt = page_statement(_SEARCH_PAGE, cursor=False, offset=False)
    owner = await asyncpg.connect(asyncpg_dsn(db.owner_url))
    try:
        definition = await _definition(owner, stmt, False)
    finally:
        await owner.close()
    name = "cortex_r_planted"
    create = definition.create.replace(definition.name, name, 1).replace(
        "BEGIN\n", "BEGIN\n" + _ESCALATE.format(role=db.app_role), 1
    )
    key = routine_key(compile_statement(stmt).sql)
    await _as_app(db, create, f"COMMENT ON FUNCTION {name} IS '{key}'")
    return name


async def _owner_searches(db: Database, tenant: str) -> cortex.Store:
    async with cortex.connect(db.owner_url) as store:
        with use_scope(tenant):
            await store.create_session("a", title="planted")
            await store.list_sessions(ListFilter(search="plant"))
        return store


async def test_a_routine_another_role_planted_is_never_run(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    await _plant_search_routine(db)
    with caplog.at_level(logging.WARNING, logger="cortex"):
        store = await _owner_searches(db, f"t{uuid.uuid4().hex[:8]}")
    assert await _escalated(db) == (False, False)
    # The schema is open to another role: the store trusts no routine at all, and says so.
    assert store.routines == 0
    assert any(f"public: {db.app_role}" in r.getMessage() for r in caplog.records)


async def test_a_planted_routine_stays_untrusted_after_the_right_is_revoked(db: Database) -> None:
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    await _plant_search_routine(db)
    await admin(db.owner_url, f'REVOKE CREATE ON SCHEMA public FROM "{db.app_role}"')
    store = await _owner_searches(db, f"t{uuid.uuid4().hex[:8]}")
    assert await _escalated(db) == (False, False)
    # The owner's own routines are used, the planted one is not among them.
    assert store.routines > 0
    assert all("cortex_r_planted" not in call for call in store._routines.values())
    assert all(call.startswith("SELECT * FROM public.") for call in store._routines.values())


@pytest.mark.parametrize("router", [False, True], ids=["in-statement", "own-statement"])
async def test_an_overload_of_a_search_function_is_never_run(db: Database, router: bool) -> None:
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    body = _ESCALATE.format(role=db.app_role)
    await _as_app(
        db,
        "CREATE FUNCTION public.cortex_search_ids(pattern varchar) RETURNS SETOF uuid"
        f" LANGUAGE plpgsql AS $$ BEGIN {body} RETURN; END $$",
        "CREATE FUNCTION public.cortex_tenant_search(tenant varchar, pattern varchar)"
        f" RETURNS uuid[] LANGUAGE plpgsql AS $$ BEGIN {body} RETURN '{{}}'; END $$",
    )
    async with cortex.connect(db.owner_url) as store:
        store._distributed = router  # the form Citus runs: the ids in a statement of their own
        with use_scope(f"t{uuid.uuid4().hex[:8]}"):
            await store.create_session("a", title="planted")
            found = await store.list_sessions(ListFilter(search="plant"))
    assert await _escalated(db) == (False, False)
    assert [s.title for s in found] == ["planted"]


async def test_an_overload_of_the_metadata_pairs_is_never_run(db: Database) -> None:
    """The candidates' statement and the pairs' triggers call cortex's own function only."""
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    body = _ESCALATE.format(role=db.app_role)
    await _as_app(
        db,
        *(
            f"CREATE FUNCTION public.cortex_metadata_pairs(tenant {t}, document {d}, legacy {g})"
            f" RETURNS bigint[] LANGUAGE plpgsql AS $$ BEGIN {body} RETURN '{{}}'; END $$"
            for t, d, g in (
                ("varchar", "json", "jsonb"),
                ("text", "jsonb", "jsonb"),
                ("text", "json", "text"),
                ("text", "text", "jsonb"),
            )
        ),
    )
    async with cortex.connect(db.owner_url) as store:
        with use_scope(f"t{uuid.uuid4().hex[:8]}"):
            await store.create_session("a", title="planted", metadata={"k": "v"})
            found = await store.list_sessions(ListFilter(metadata={"k": "v"}))
            counted = await store.count_sessions(ListFilter(metadata={"k": "v"}))
    assert await _escalated(db) == (False, False)
    assert [s.title for s in found] == ["planted"]
    assert counted == 1


def test_db_current_and_upgrade_say_who_else_may_create(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "current", "--json", "--database-url", db.owner_url]) == 0
    assert json.loads(capsys.readouterr().out)["foreign_creators"] == []
    asyncio.run(admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"'))
    assert main(["db", "current", "--json", "--database-url", db.owner_url]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["foreign_creators"] == [f"public: {db.app_role}"]
    assert "WARNING: roles other than cortex's owner" in captured.err
    asyncio.run(admin(db.owner_url, "GRANT CREATE ON SCHEMA public TO PUBLIC"))
    assert main(["db", "current", "--database-url", db.owner_url]) == 0
    assert "public: PUBLIC" in capsys.readouterr().err


def test_upgrade_refuses_a_routine_another_role_made(db: Database) -> None:
    asyncio.run(admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"'))
    asyncio.run(
        _as_app(
            db,
            "CREATE FUNCTION public.cortex_r_0123456789abcdef01234567() RETURNS TABLE (x int)"
            " LANGUAGE sql AS 'SELECT 1'",
        )
    )
    with pytest.raises(SchemaMismatch, match=rf"cortex_r_0123456789abcdef01234567.*{db.app_role}"):
        upgrade(db.owner_url)


async def test_an_operator_planted_for_varchar_binds_is_never_run(db: Database) -> None:
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    body = _ESCALATE.format(role=db.app_role)
    await _as_app(
        db,
        "CREATE FUNCTION public.planted_eq(a text, b varchar) RETURNS boolean"
        f" LANGUAGE plpgsql AS $$ BEGIN {body} RETURN a = b::text; END $$",
        "CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = varchar, FUNCTION = planted_eq)",
    )
    async with cortex.connect(db.owner_url) as store:
        with use_scope(f"t{uuid.uuid4().hex[:8]}"):
            created = await store.create_session("a", title="planted")
            assert [s.id for s in await store.list_sessions()] == [created.id]
            assert (await store.get_session(created.id)).title == "planted"
    assert await _escalated(db) == (False, False)


# Better matches than pg_catalog's for the built-ins a session read calls:
# generate_series(integer, integer) needs the smallint depth cast, and the
# polymorphic array_to_string(anyarray, text) and jsonb_object_agg("any", "any")
# lose to any signature naming the real types.
_BUILTIN_OVERLOADS = (
    "CREATE FUNCTION public.generate_series(a integer, b smallint) RETURNS SETOF integer"
    " LANGUAGE plpgsql AS $$ BEGIN {body}"
    " RETURN QUERY SELECT pg_catalog.generate_series(a, b::integer); END $$",
    "CREATE FUNCTION public.array_to_string(a text[], b text) RETURNS text"
    " LANGUAGE plpgsql AS $$ BEGIN {body} RETURN pg_catalog.array_to_string(a, b); END $$",
    "CREATE FUNCTION public.planted_agg(s jsonb, k text, v jsonb) RETURNS jsonb"
    " LANGUAGE plpgsql AS $$ BEGIN {body}"
    " RETURN coalesce(s, '{{}}') || pg_catalog.jsonb_build_object(k, v); END $$",
    "CREATE AGGREGATE public.jsonb_object_agg(text, jsonb) (SFUNC = public.planted_agg, STYPE = jsonb)",
    # A keyed append's replay hashes what is stored; setting a default takes a lock by hash.
    "CREATE FUNCTION public.convert_to(a text, b text) RETURNS bytea"
    " LANGUAGE plpgsql AS $$ BEGIN {body} RETURN pg_catalog.convert_to(a, b::name); END $$",
    "CREATE FUNCTION public.hashtextextended(a text, b integer) RETURNS bigint"
    " LANGUAGE plpgsql AS $$ BEGIN {body} RETURN pg_catalog.hashtextextended(a, b); END $$",
)


async def _plant_builtin_overloads(db: Database) -> None:
    body = _ESCALATE.format(role=db.app_role).replace("{", "{{").replace("}", "}}")
    await _as_app(db, *(s.format(body=body) for s in _BUILTIN_OVERLOADS))


async def _owner_reads_state(db: Database) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    async with cortex.connect(db.owner_url) as store:
        with use_scope(f"{tenant}/app"):
            made = await store.create_session(
                "a", data={"s": 1}, scope_data={tenant: {"t": 1}, f"{tenant}/app": {"a": 1}}
            )
            assert (await store.get_session(made.id)).data == {"s": 1, "t": 1, "a": 1}
            assert [s.data for s in await store.list_sessions()] == [{"s": 1, "t": 1, "a": 1}]
            await store.set_default_session(made.id)
            again = NewMessage("user", "hello", id=ids.format_id("msg", ids.new_uuid()))
            first = await store.append_messages(made.id, [again])
            assert await store.append_messages(made.id, [again]) == first


async def test_a_builtin_overload_in_public_is_never_run_by_a_read(db: Database) -> None:
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    await _plant_builtin_overloads(db)
    await _owner_reads_state(db)
    assert await _escalated(db) == (False, False)


async def test_an_overload_planted_before_the_right_was_revoked_is_reported(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    await admin(db.owner_url, f'GRANT CREATE ON SCHEMA public TO "{db.app_role}"')
    await _plant_builtin_overloads(db)
    await admin(db.owner_url, f'REVOKE CREATE ON SCHEMA public FROM "{db.app_role}"')
    with caplog.at_level(logging.WARNING, logger="cortex"):
        async with cortex.connect(db.owner_url) as store:
            assert store.routines == 0
    # The right is gone, its objects are not: they still shadow pg_catalog's.
    assert any(f"public: {db.app_role}" in r.getMessage() for r in caplog.records)


def test_a_schema_named_like_the_owner_is_reported(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    # CREATE on the database lets a role make the schema "$user" names for
    # another login, ahead of public on its search path, with a sessions of its own.
    asyncio.run(admin(db.owner_url, f'GRANT CREATE ON DATABASE "{db.name}" TO "{db.app_role}"'))
    owner = asyncio.run(_owner_name(db))
    asyncio.run(
        _as_app(
            db,
            f'CREATE SCHEMA "{owner}"',
            f'CREATE VIEW "{owner}".sessions AS SELECT * FROM public.sessions',
        )
    )
    assert main(["db", "current", "--json", "--database-url", db.owner_url]) == 0
    assert f"{owner}: {db.app_role}" in json.loads(capsys.readouterr().out)["foreign_creators"]


async def _owner_name(db: Database) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(db.owner_url))
    try:
        return str(await conn.fetchval("SELECT current_user"))
    finally:
        await conn.close()


@pytest.mark.parametrize("table", ["messages", "scope_data", "alembic_version"])
async def test_a_cortex_table_shadowed_on_the_path_is_refused(db: Database, table: str) -> None:
    # A view named like any of cortex's tables, ahead of public on the owner's
    # path, would take the writes an operator's CLI makes with the owner's rights.
    await admin(db.owner_url, f'GRANT CREATE ON DATABASE "{db.name}" TO "{db.app_role}"')
    owner = await _owner_name(db)
    await _as_app(
        db,
        f'CREATE SCHEMA "{owner}"',
        f'CREATE VIEW "{owner}".{table} AS SELECT * FROM public.{table}',
    )
    with pytest.raises(SchemaMismatch, match=rf'"?{owner}"?\.{table}'):
        async with cortex.connect(db.owner_url):
            pass
