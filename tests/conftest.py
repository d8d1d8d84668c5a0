"""Shared fixtures: a real PostgreSQL, a migrated throwaway database, a plain app role.

Where the server comes from, in order: ``TEST_DATABASE_URL``; else a superuser
login on 127.0.0.1:5432 if one answers. With neither, integration tests skip
locally and *fail* under CI (``CI`` set), so CI can never pass by skipping.

The schema is built by running the migrations (never ``create_all``) as the
server's superuser, the owner. The store under test connects as a fresh
non-superuser role, so row-level security applies exactly as in production.
Tests isolate from one another by tenant: every test gets fresh, random
tenant names (see ``tenant``), and tenancy is what cortex isolates by.

The Citus lane: with ``CORTEX_TEST_CITUS`` set to a coordinator's superuser
URL (``python -m tests.citus_cluster start`` prints one), every throwaway
database and role is made on the coordinator and on each worker
(``CORTEX_TEST_CITUS_WORKERS``, ``host:port,...``; default the coordinator's
host on ports 9701 and 9702), the ``citus`` extension is created in it on
every node and the workers are registered, all before the migrations run;
``cortex db upgrade`` then distributes the tables itself. The tests run
unchanged on it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio.from_thread
import asyncpg
import pytest
from sqlalchemy.engine import make_url

import cortex
from cortex._db.engine import driver_dsn
from cortex.migrate import grant_sql, upgrade

_LOCAL_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
CITUS_URL = os.environ.get("CORTEX_TEST_CITUS") or None


def citus_workers() -> list[tuple[str, int]]:
    """The Citus lane's workers as (host, port); empty outside the lane."""
    if CITUS_URL is None:
        return []
    spec = os.environ.get("CORTEX_TEST_CITUS_WORKERS")
    if not spec:
        host = make_url(CITUS_URL).host or "127.0.0.1"
        return [(host, 9701), (host, 9702)]
    return [(item.rsplit(":", 1)[0], int(item.rsplit(":", 1)[1])) for item in spec.split(",")]


def _node_urls(server: str) -> list[str]:
    """The server URL, then the same login on each Citus worker (outside the lane: the server)."""
    base = make_url(server)
    return [server] + [
        base.set(host=host, port=port).render_as_string(hide_password=False)
        for host, port in citus_workers()
    ]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            item.add_marker(pytest.mark.anyio)
        parts = item.path.parts
        if "integration" in parts:
            item.add_marker(pytest.mark.integration)
        if "migrations" in parts:
            item.add_marker(pytest.mark.migrations)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.figures import FIGURES

    if not FIGURES:
        return
    terminalreporter.section("reliability figures")
    for key in sorted(FIGURES):
        terminalreporter.write_line(f"{key:<62} {FIGURES[key]:>10,}")
    Path("reliability-figures.json").write_text(json.dumps(dict(sorted(FIGURES.items())), indent=2))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def with_database(url: str, database: str, *, user: str | None = None) -> str:
    """The same server URL pointing at another database (and optionally user)."""
    return driver_dsn(url, database=database, user=user)


def with_user(url: str, user: str) -> str:
    """The same server URL and database, logging in as ``user`` (no password)."""
    return driver_dsn(url, user=user)


def with_query(url: str, query: str) -> str:
    """``url`` with ``query`` (``name=value&...``, as written in a URL) added to its own.

    Never ``url + "?" + query``: the embedded server's URL has a query already
    (``?host=<socket folder>``), and a second ``?`` would end up in its value.
    """
    parts = urlsplit(url)
    return urlunsplit(parts._replace(query=f"{parts.query}&{query}" if parts.query else query))


def server_address(url: str) -> tuple[str, int]:
    """Where ``url``'s connections go, as libpq reads it: ``(host, port)``.

    The query's ``host`` and ``port`` win over the URL's own; a host starting
    with ``/`` is the folder of the server's unix socket, ``.s.PGSQL.<port>``
    (the embedded server's URL: ``postgresql://postgres:@/postgres?host=/…/pgdata``).
    """
    parsed = make_url(url)
    host = str(parsed.query.get("host") or parsed.host or "127.0.0.1")
    return host, int(str(parsed.query.get("port") or parsed.port or 5432))


def on_unix_socket(url: str) -> bool:
    """Whether ``url`` reaches its server on a unix socket (the embedded server's only way)."""
    return server_address(url)[0].startswith("/")


def on_local_port(url: str, port: int) -> str:
    """``url`` (same login, database and other parameters) sent to 127.0.0.1:``port``.

    For a proxy or pooler in front of the server: the query's ``host`` and
    ``port`` go, or they would win over the new address.
    """
    through = make_url(url).difference_update_query(["host", "port"])
    return through.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def asyncpg_dsn(url: str) -> str:
    return driver_dsn(url)


async def admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _can_login(url: str) -> bool:
    try:
        conn = await asyncpg.connect(asyncpg_dsn(url), timeout=3)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """A superuser URL on a real PostgreSQL server.

    ``TEST_DATABASE_URL``; else a login on 127.0.0.1:5432; else a throwaway
    embedded server (the ``embedded`` extra) in a folder deleted afterwards.
    ``CORTEX_TEST_EMBEDDED=1`` skips straight to the embedded server.
    """
    url = CITUS_URL or os.environ.get("TEST_DATABASE_URL")
    if url:
        yield url
        return
    if not os.environ.get("CORTEX_TEST_EMBEDDED") and asyncio.run(_can_login(_LOCAL_DEFAULT)):
        yield _LOCAL_DEFAULT
        return
    from cortex.embedded import EmbeddedUnavailable, embedded_server

    # Not pytest's tmp_path: as root the embedded server widens every ancestor
    # of its data folder, and pytest's 0700 parent is not ours to widen.
    base = Path(tempfile.mkdtemp(prefix="cortex-test-pg-"))
    try:
        with embedded_server(base / "pgdata", delete=True) as embedded:
            yield embedded
    except EmbeddedUnavailable as exc:
        message = f"no PostgreSQL: set TEST_DATABASE_URL or start one on 127.0.0.1:5432 ({exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI must not skip integration tests)")
        pytest.skip(message)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass(frozen=True)
class Database:
    """A migrated throwaway database and the two URLs that reach it."""

    name: str
    owner_url: str  # superuser: ran the migrations, owns the tables
    app_url: str  # plain role: what the store connects as
    app_role: str


def create_database(server: str) -> Database:
    """Create, migrate and grant a fresh database; the caller drops it."""
    suffix = uuid.uuid4().hex[:10]
    name, role = f"cortex_t_{suffix}", f"cortex_app_{suffix}"
    for node in _node_urls(server):
        # On Citus, databases and roles are made on each node: one made
        # outside a Citus database is not propagated.
        asyncio.run(admin(node, f'CREATE DATABASE "{name}"', f'CREATE ROLE "{role}" LOGIN'))
    owner = with_database(server, name)
    if CITUS_URL is not None:
        asyncio.run(make_citus(server, name))
    upgrade(owner)
    asyncio.run(admin(owner, *grant_sql(role)))
    return Database(name, owner, with_database(server, name, user=role), role)


async def make_citus(server: str, name: str) -> None:
    """The extension on every node of database ``name``; the workers registered on the coordinator."""
    for node in _node_urls(server):
        await admin(with_database(node, name), "CREATE EXTENSION citus")
    coordinator = make_url(server)
    await admin(
        with_database(server, name),
        f"SELECT citus_set_coordinator_host('{coordinator.host}', {coordinator.port or 5432})",
        *(f"SELECT citus_add_node('{host}', {port})" for host, port in citus_workers()),
    )


def drop_database(server: str, db: Database) -> None:
    for node in _node_urls(server):
        asyncio.run(
            admin(
                node,
                f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)',
                f'DROP ROLE IF EXISTS "{db.app_role}"',
            )
        )


@pytest.fixture(scope="session")
def database(server_url: str) -> Iterator[Database]:
    """One migrated database for the whole run; tests isolate by tenant."""
    db = create_database(server_url)
    yield db
    drop_database(server_url, db)


@pytest.fixture(scope="module")
def module_database(server_url: str) -> Iterator[Database]:
    """A migrated database of one module's own, for tests whose plans depend on every row's statistics."""
    db = create_database(server_url)
    yield db
    drop_database(server_url, db)


@pytest.fixture
def blank_db(server_url: str) -> Iterator[str]:
    """An empty database (no revision applied); yields its owner URL."""
    name = f"cortex_m_{uuid.uuid4().hex[:10]}"
    asyncio.run(admin(server_url, f'CREATE DATABASE "{name}"'))
    yield with_database(server_url, name)
    asyncio.run(admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def portal() -> Iterator[anyio.from_thread.BlockingPortal]:
    """An event loop in a thread, for hypothesis tests (which are synchronous)."""
    with anyio.from_thread.start_blocking_portal("asyncio") as p:
        yield p


@pytest.fixture(scope="module")
def portal_store(
    database: Database, portal: anyio.from_thread.BlockingPortal
) -> Iterator[cortex.Store]:
    """A store living on ``portal``'s loop, shared by a module's hypothesis examples."""
    cm = cortex.connect(database.app_url)
    store = portal.call(cm.__aenter__)
    yield store
    portal.call(cm.__aexit__, None, None, None)


@pytest.fixture(scope="module")
def portal_router_store(
    database: Database, portal: anyio.from_thread.BlockingPortal
) -> Iterator[cortex.Store]:
    """``portal_store`` sending the statements it sends on Citus (``Store.distributed``).

    On plain PostgreSQL: the router forms (two-statement appends, rows in
    chunks, questions and answers as separate statements, searches through
    ``cortex_tenant_search``) run in every lane, against the same models.
    """
    cm = cortex.connect(database.app_url)
    store = portal.call(cm.__aenter__)
    store._distributed = True
    yield store
    portal.call(cm.__aexit__, None, None, None)


def store_url(database: Database) -> str:
    """What the ``store`` fixture connects to; in the Citus lane, one that refuses fan-out.

    ``citus.multi_task_query_log_level = error`` makes any statement Citus
    would send to more than one shard an error, so every store call in the
    lane proves it was a single-tenant router query.
    """
    if CITUS_URL is None:
        return database.app_url
    return with_query(database.app_url, "options=-c%20citus.multi_task_query_log_level%3Derror")


@pytest.fixture
async def store(database: Database) -> AsyncIterator[cortex.Store]:
    async with cortex.connect(store_url(database), pool_size=10, max_overflow=40) as s:
        yield s


@pytest.fixture
def tenant() -> str:
    """A tenant name no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def other_tenant() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


async def _connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def owner_conn(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """A superuser connection for checking what is really stored (bypasses RLS)."""
    async for conn in _connection(database.owner_url):
        yield conn


@pytest.fixture
async def app_conn(database: Database) -> AsyncIterator[asyncpg.Connection]:
    """A raw connection as the application role: row-level security applies."""
    async for conn in _connection(database.app_url):
        yield conn


def current_at_head() -> dict[str, object]:
    """What ``cortex db current --json`` says of a plain database at this code's head."""
    from cortex._db.engine import SCHEMA_REVISION
    from cortex._db.routines import wanted_count

    return {
        "revision": SCHEMA_REVISION,
        "expected": SCHEMA_REVISION,
        "up_to_date": True,
        "serves_this_code": True,
        "pending": [],
        "distributed": False,
        "distribution": "not distributed (plain PostgreSQL)",
        "routines": wanted_count(),
        "routines_expected": wanted_count(),
        "leftover_indexes": [],
        "foreign_creators": [],
    }


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions cortex._db.pool runs through ``greenlet_spawn``, by name, in call order."""
    from sqlalchemy.util import greenlet_spawn

    from cortex._db import pool

    seen: list[str] = []

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(fn, "__name__", repr(fn)))
        return await greenlet_spawn(fn, *args, **kwargs)

    monkeypatch.setattr(pool, "greenlet_spawn", counted)
    return seen
