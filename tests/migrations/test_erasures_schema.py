"""Revision 20261205000022: ``erasures`` and ``retention_policies``, tenant tables like ``sessions``.

Both are held to row-level security (ENABLE + FORCE, the tenant policy), in
the application grants (a receipt is never deleted by the application), and
the downgrade says what it would destroy before it drops them.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from cortex.cli import EXIT_USAGE, main
from cortex.migrate import grant_sql, upgrade
from tests.conftest import admin, asyncpg_dsn, with_user
from tests.migrations.legacy import current, execute, fetch

REVISION = "20261205000022"
BEFORE = "20261205000021"
TABLES = ("erasures", "retention_policies")


def _app_role(url: str) -> tuple[str, str]:
    role = f"cortex_app_{uuid.uuid4().hex[:8]}"
    execute(url, f'CREATE ROLE "{role}" LOGIN')
    asyncio.run(admin(url, *grant_sql(role)))
    return role, with_user(url, role)


async def _as_tenant(url: str, tenant: str, *statements: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('cortex.tenant', $1, true)", tenant)
            rows: list[asyncpg.Record] = []
            for statement in statements:
                rows = await conn.fetch(statement)
            return rows
    finally:
        await conn.close()


def test_both_tables_are_held_to_the_tenant_and_granted(blank_db: str) -> None:
    upgrade(blank_db)
    forced = fetch(
        blank_db,
        "SELECT relname FROM pg_class WHERE relrowsecurity AND relforcerowsecurity"
        " AND relname = ANY($1::text[]) ORDER BY relname",
        list(TABLES),
    )
    assert [r["relname"] for r in forced] == list(TABLES)
    role, app = _app_role(blank_db)
    try:
        asyncio.run(
            _as_tenant(
                app,
                "acme",
                "INSERT INTO erasures (tenant_id, id, scope) VALUES"
                f" ('acme', '{uuid.uuid4()}', 'acme/u1')",
                "INSERT INTO retention_policies (tenant_id, scope, keep_last_messages)"
                " VALUES ('acme', 'acme/u1', 10)",
            )
        )
        for table in TABLES:
            seen = asyncio.run(_as_tenant(app, "globex", f"SELECT * FROM {table}"))
            assert seen == [], table
            assert len(asyncio.run(_as_tenant(app, "acme", f"SELECT * FROM {table}"))) == 1
        # Another tenant's row is refused by the policy's WITH CHECK.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            asyncio.run(
                _as_tenant(
                    app,
                    "globex",
                    "INSERT INTO erasures (tenant_id, id, scope) VALUES"
                    f" ('acme', '{uuid.uuid4()}', 'acme/u2')",
                )
            )
        # Receipts are durable: the application may not delete them.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            asyncio.run(_as_tenant(app, "acme", "DELETE FROM erasures"))
        # One running erasure per scope.
        with pytest.raises(asyncpg.UniqueViolationError):
            asyncio.run(
                _as_tenant(
                    app,
                    "acme",
                    "INSERT INTO erasures (tenant_id, id, scope) VALUES"
                    f" ('acme', '{uuid.uuid4()}', 'acme/u1')",
                )
            )
    finally:
        execute(blank_db, f'DROP OWNED BY "{role}"', f'DROP ROLE "{role}"')


def test_a_receipt_s_tenant_is_its_scope_s_first_segment(blank_db: str) -> None:
    upgrade(blank_db)
    with pytest.raises(asyncpg.CheckViolationError):
        execute(
            blank_db,
            f"INSERT INTO erasures (tenant_id, id, scope) VALUES ('acme', '{uuid.uuid4()}',"
            " 'acme-corp/u1')",
        )
    with pytest.raises(asyncpg.CheckViolationError):
        execute(
            blank_db,
            f"INSERT INTO erasures (tenant_id, id, scope, state) VALUES ('acme', '{uuid.uuid4()}',"
            " 'acme/u1', 'done')",
        )


def test_the_downgrade_counts_receipts_and_policies_and_drops_them(
    blank_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(blank_db, REVISION)
    execute(
        blank_db,
        f"INSERT INTO erasures (tenant_id, id, scope) VALUES ('acme', '{uuid.uuid4()}', 'acme')",
        "INSERT INTO retention_policies (tenant_id, scope) VALUES ('acme', 'acme')",
    )
    capsys.readouterr()
    assert main(["--database-url", blank_db, "db", "downgrade", BEFORE]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "1 erasure receipts" in err, err
    assert "1 retention policies" in err, err
    assert current(blank_db) == [REVISION]
    assert main(["--database-url", blank_db, "db", "downgrade", BEFORE, "--allow-data-loss"]) == 0
    assert current(blank_db) == [BEFORE]
    gone = fetch(
        blank_db, "SELECT to_regclass('erasures') AS e, to_regclass('retention_policies') AS r"
    )
    assert (gone[0]["e"], gone[0]["r"]) == (None, None)
    upgrade(blank_db, REVISION)
    assert current(blank_db) == [REVISION]
