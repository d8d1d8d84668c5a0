"""Engine and URL normalisation, and the schema-revision check.

Nothing here runs a store call: :mod:`cortex._db.transaction` owns transactions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, NamedTuple
from urllib.parse import quote, urlencode

import asyncpg
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cortex._db.executor import Row
from cortex._sql.tables import metadata
from cortex.errors import InvalidInput, SchemaMismatch, translate_errors

__all__ = [
    "CHECKOUTS",
    "CONNECT_TIMEOUT",
    "FOREIGN_CREATORS_SQL",
    "SCHEMA_REVISION",
    "SchemaState",
    "check_schema",
    "connect_options",
    "driver_dsn",
    "foreign_creators_warning",
    "make_engine",
    "normalise_url",
    "one_off_connection",
    "one_off_engine",
    "tables_distributed",
]

log = logging.getLogger("cortex")

# The Alembic revision this code reads and writes. A test keeps it equal to the
# head of alembic/versions.
SCHEMA_REVISION: Final = "20261205000026"


# libpq query parameters that managed PostgreSQL URLs carry, which asyncpg's own
# DSN parser implements with libpq's meaning (sslmode and the certificate files
# build its SSL context; application_name and options become startup
# parameters). They are handed to it once, as a query-only DSN.
_LIBPQ_PARAMETERS: Final = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslcrl",
        "application_name",
        "options",
        "target_session_attrs",
    }
)
# asyncpg takes the connect timeout as a keyword, not from a DSN.
_TIMEOUT_PARAMETER: Final = "connect_timeout"
# Kept in the URL SQLAlchemy sees: the embedded server's ``?host=<socket dir>``.
_SQLALCHEMY_PARAMETERS: Final = frozenset({"host", "port"})
_SSL_MODES: Final = frozenset({"disable", "allow", "prefer", "require", "verify-ca", "verify-full"})
_SESSION_ATTRS: Final = frozenset(
    {"any", "primary", "standby", "prefer-standby", "read-write", "read-only"}
)


def _check_query(parsed: URL) -> None:
    known = _LIBPQ_PARAMETERS | _SQLALCHEMY_PARAMETERS | {_TIMEOUT_PARAMETER}
    for key, value in parsed.query.items():
        if key not in known:
            raise InvalidInput(
                f"database URL: query parameter {key!r} is not supported "
                f"(cortex accepts {', '.join(sorted(known))})"
            )
        if not isinstance(value, str):
            raise InvalidInput(f"database URL: query parameter {key!r} is given more than once")
    query = parsed.query
    if "sslmode" in query and query["sslmode"] not in _SSL_MODES:
        raise InvalidInput(
            f"database URL: sslmode {query['sslmode']!r} is not one of {', '.join(sorted(_SSL_MODES))}"
        )
    attrs = query.get("target_session_attrs")
    if attrs is not None and attrs not in _SESSION_ATTRS:
        raise InvalidInput(
            f"database URL: target_session_attrs {attrs!r} is not one of "
            f"{', '.join(sorted(_SESSION_ATTRS))}"
        )
    if _TIMEOUT_PARAMETER in query:
        _connect_timeout(query[_TIMEOUT_PARAMETER])


def _connect_timeout(value: Any) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 86_400:
        raise InvalidInput(f"database URL: connect_timeout {value!r} is not a number of seconds")
    return seconds


def normalise_url(url: str | URL) -> URL:
    """Accept ``postgresql://``, ``postgres://`` or ``postgresql+asyncpg://``; return the asyncpg form.

    libpq query parameters (``sslmode``, ``sslrootcert``, ``sslcert``,
    ``sslkey``, ``sslpassword``, ``sslcrl``, ``application_name``,
    ``connect_timeout``, ``options``, ``target_session_attrs``) are kept, for
    :func:`connect_options` to translate; ``host`` and ``port`` too.

    Raises:
        InvalidInput: for any other driver, an unparsable URL, a port outside
            1-65535, or a query parameter cortex does not translate (named).
    """
    try:
        parsed = make_url(url)
        port = parsed.port
    except (ArgumentError, ValueError):
        raise InvalidInput("database URL: cannot parse it") from None
    if parsed.drivername not in ("postgresql", "postgres", "postgresql+asyncpg"):
        raise InvalidInput(
            f"database URL: expected postgresql:// or postgresql+asyncpg://, got {parsed.drivername}://"
        )
    # Checked here: an out-of-range port would reach the socket layer as OverflowError.
    if port is not None and not 1 <= port <= 65535:
        raise InvalidInput(f"database URL: port {port} is outside 1-65535")
    _check_query(parsed)
    return parsed.set(drivername="postgresql+asyncpg")


def connect_options(url: str | URL) -> tuple[URL, dict[str, Any]]:
    """Split a URL into what SQLAlchemy sees and the asyncpg connect arguments of its query.

    SQLAlchemy's asyncpg dialect passes every query parameter to
    ``asyncpg.connect`` as a keyword, which it refuses for libpq names. So the
    libpq parameters leave the URL here, once: ``connect_timeout`` becomes
    ``timeout``, the rest a query-only ``dsn`` that asyncpg parses with libpq's
    rules (host, port, user and database still come from the URL).

    Raises:
        InvalidInput: as :func:`normalise_url`.
    """
    parsed = normalise_url(url)
    query = parsed.query
    connect_args: dict[str, Any] = {}
    if _TIMEOUT_PARAMETER in query:
        connect_args["timeout"] = _connect_timeout(query[_TIMEOUT_PARAMETER])
    libpq = {key: value for key, value in query.items() if key in _LIBPQ_PARAMETERS}
    if libpq:
        connect_args["dsn"] = "postgresql://?" + urlencode(libpq, quote_via=quote)
    moved = [key for key in query if key not in _SQLALCHEMY_PARAMETERS]
    return parsed.difference_update_query(moved), connect_args


# Seconds asyncpg may take to open a connection (its own default is 60). A
# cancelled caller does not wait for it, but the checkout it abandoned runs on
# (cortex._db.pool) and holds a pool slot until the connect succeeds or times out.
CONNECT_TIMEOUT: Final = 10

# Key in a pooled connection's ``info``: how many times the pool handed that
# DBAPI connection out. SQLAlchemy clears ``info`` whenever the pool opens a
# new connection for the slot, so 1 means "opened for this checkout", which is
# how the transaction runner tells a new connection from a pooled one.
CHECKOUTS: Final = "cortex_checkouts"


async def _set_json_codecs(conn: asyncpg.Connection) -> None:
    for typename in ("json", "jsonb"):
        await conn.set_type_codec(
            typename, schema="pg_catalog", encoder=_encode_json, decoder=json.loads, format="text"
        )


def _encode_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _own_json_codecs(dbapi_connection: Any, record: Any) -> None:
    """Decode json/jsonb with the standard library on every new connection, explicitly.

    cortex executes on the asyncpg connection itself (cortex._db.executor), so
    it must not depend on whatever codecs SQLAlchemy's dialect installed
    (``json_deserializer`` in the pool options would change them). Runs after
    the dialect's own connect hook, so this one is what stays.
    """
    dbapi_connection.run_async(_set_json_codecs)


def _count_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    record.info[CHECKOUTS] = record.info.get(CHECKOUTS, 0) + 1


def driver_dsn(url: str | URL, *, database: str | None = None, user: str | None = None) -> str:
    """The URL in asyncpg's own ``postgresql://`` form, optionally for another database or user.

    Query parameters (such as the embedded server's ``?host=<socket dir>`` and
    ``sslmode``) are kept for asyncpg's DSN parser, except ``connect_timeout``,
    which it would send to the server as a setting.
    """
    parsed = (
        make_url(url).set(drivername="postgresql").difference_update_query([_TIMEOUT_PARAMETER])
    )
    if database is not None:
        parsed = parsed.set(database=database)
    if user is not None:
        parsed = parsed.set(username=user, password=None)
    return parsed.render_as_string(hide_password=False)


def make_engine(
    url: str | URL, *, manual_transactions: bool = False, **pool_options: Any
) -> AsyncEngine:
    """An async engine on asyncpg; ``pool_options`` go to ``create_async_engine``.

    ``manual_transactions``: SQLAlchemy never sends BEGIN/COMMIT itself
    (AUTOCOMMIT at the driver); :func:`run_transaction` sends them, folding
    the tenant binding into the BEGIN round trip.

    Raises:
        InvalidInput: ``isolation_level`` is passed; cortex owns transactions.
    """
    if "isolation_level" in pool_options:
        raise InvalidInput("isolation_level: cortex manages its own transactions")
    target, from_url = connect_options(url)
    # The caller's connect_args win over what the URL's query says.
    connect_args = {**from_url, **(pool_options.pop("connect_args", None) or {})}
    connect_args.setdefault("timeout", CONNECT_TIMEOUT)
    if manual_transactions:
        pool_options["isolation_level"] = "AUTOCOMMIT"
        connect_args["record_class"] = Row
    engine = create_async_engine(target, connect_args=connect_args, **pool_options)
    event.listen(engine.sync_engine, "checkout", _count_checkout)
    event.listen(engine.sync_engine, "connect", _own_json_codecs)
    return engine


@asynccontextmanager
async def one_off_engine(url: str | URL) -> AsyncIterator[AsyncEngine]:
    """An engine for one command, with no pool to outlive it: disposed on the way out."""
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        yield engine
    finally:
        await engine.dispose()


@asynccontextmanager
async def one_off_connection(url: str | URL) -> AsyncIterator[AsyncConnection]:
    """One connection for all of a command's work, on a :func:`one_off_engine`.

    Raises:
        CortexError: every database-layer failure, translated, cause chained.
    """
    with translate_errors():
        async with one_off_engine(url) as engine, engine.connect() as conn:
            yield conn


class SchemaState(NamedTuple):
    """What :func:`check_schema` learnt about the database besides its revision."""

    # The login role is a superuser or BYPASSRLS: the database's second wall protects nothing.
    bypasses_rls: bool
    # cortex's tables are distributed by Citus (see cortex._sql.predicates.search_clause).
    distributed: bool
    # Who could plant objects where this connection's names resolve ("public: PUBLIC").
    foreign_creators: tuple[str, ...] = ()


# pg_dist_partition exists only with the citus extension: asked only then.
_CITUS_SQL: Final = "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL"
_DISTRIBUTED_SQL: Final = """
SELECT EXISTS (
    SELECT FROM pg_catalog.pg_dist_partition
    WHERE logicalrelid = pg_catalog.to_regclass('sessions')
)
"""


def tables_distributed(connection: Connection) -> bool:
    """Whether Citus distributes cortex's tables (``sessions``, the co-location anchor, says)."""
    if not connection.execute(sa.text(_CITUS_SQL)).scalar():
        return False
    return bool(connection.execute(sa.text(_DISTRIBUTED_SQL)).scalar())


# Every schema on the connection's search path in which a role other than
# cortex's owner (the owner of ``sessions``), a member of it or a superuser may
# create objects: such a role could plant a function or an operator that
# cortex's statements would resolve to and run with the caller's rights.
# pg_database_owner stands for the database's owner, which is checked itself.
FOREIGN_CREATORS_SQL: Final = """
WITH owner AS (
    -- public's own table, not the first sessions on the path: a schema
    -- another role put ahead of public would otherwise name that role the owner.
    SELECT c.relowner AS oid FROM pg_catalog.pg_class AS c
    WHERE c.oid = pg_catalog.to_regclass('public.sessions')
), path AS (
    SELECT n.oid, n.nspname, n.nspacl, n.nspowner
    FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) AS s(name)
    JOIN pg_catalog.pg_namespace AS n ON n.nspname = s.name
    WHERE n.nspname <> 'pg_catalog'
), open_to_all AS (
    SELECT p.oid, p.nspname FROM path AS p
    WHERE EXISTS (
        SELECT FROM pg_catalog.aclexplode(
            coalesce(p.nspacl, pg_catalog.acldefault('n', p.nspowner))
        ) AS a
        WHERE a.grantee = 0 AND a.privilege_type = 'CREATE'
    )
), planted AS (
    -- Named like one of pg_catalog's: such an object outlives the right it was made with.
    SELECT f.pronamespace AS nsp, f.proowner AS role FROM pg_catalog.pg_proc AS f
    WHERE f.pronamespace IN (SELECT oid FROM path) AND EXISTS (
        SELECT FROM pg_catalog.pg_proc AS q
        WHERE q.pronamespace = 'pg_catalog'::regnamespace AND q.proname = f.proname
    )
    UNION
    SELECT o.oprnamespace, o.oprowner FROM pg_catalog.pg_operator AS o
    WHERE o.oprnamespace IN (SELECT oid FROM path) AND EXISTS (
        SELECT FROM pg_catalog.pg_operator AS q
        WHERE q.oprnamespace = 'pg_catalog'::regnamespace AND q.oprname = o.oprname
    )
)
SELECT o.nspname::text || ': PUBLIC' FROM open_to_all AS o
UNION ALL
SELECT p.nspname::text || ': ' || r.rolname::text
FROM path AS p CROSS JOIN owner AS w
JOIN pg_catalog.pg_roles AS r
  ON NOT r.rolsuper
 AND r.oid <> w.oid
 AND r.rolname <> 'pg_database_owner'
 AND NOT pg_catalog.pg_has_role(r.oid, w.oid, 'MEMBER')
 AND (
     pg_catalog.has_schema_privilege(r.oid, p.oid, 'CREATE')
     OR r.oid = p.nspowner
     OR EXISTS (SELECT FROM planted AS d WHERE d.nsp = p.oid AND d.role = r.oid)
 )
WHERE p.oid NOT IN (SELECT oid FROM open_to_all)
ORDER BY 1
"""


# Every table cortex's statements name unqualified: Alembic's and the metadata's,
# so a table added to cortex._sql.tables is checked without another list to keep.
CORTEX_TABLES: Final = ("alembic_version", *sorted(metadata.tables))

# cortex's tables whose unqualified name resolves to another relation than
# public's (a view or table ahead of public on the search path, such as in a
# schema named like the login): its statements would read and write that one.
SHADOWED_TABLES_SQL: Final = f"""
SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
FROM pg_catalog.unnest(ARRAY[{", ".join(f"'{name}'" for name in CORTEX_TABLES)}]) AS t(name)
JOIN pg_catalog.pg_class AS c ON c.oid = pg_catalog.to_regclass(t.name)
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname <> 'public'
ORDER BY 1
"""


def foreign_creators_warning(creators: tuple[str, ...] | list[str]) -> str:
    """What cortex says when roles other than its owner may create objects on its search path."""
    shown = ", ".join(creators[:5]) + (
        f" and {len(creators) - 5} more" if len(creators) > 5 else ""
    )
    return (
        f"roles other than cortex's owner may create objects in cortex's schema or on the"
        f" search path ({shown}): such a role can plant a function or an operator that"
        " cortex's statements would run with the caller's rights, so the store uses no"
        " routines. Revoke it (REVOKE CREATE ON SCHEMA public FROM PUBLIC, or from the"
        " role), drop the functions and operators such a role made there, and see"
        " SECURITY.md, Schema rights"
    )


async def check_schema(engine: AsyncEngine, expected: str = SCHEMA_REVISION) -> SchemaState:
    """Raise SchemaMismatch unless the database serves this code (revision ``expected``).

    It does when it is at that revision, or at a later one whose every step
    declared itself safe with this code (the record revision 20261201000010
    keeps): a rolling deploy migrates first and replaces the processes after.

    Returns:
        Whether the login role bypasses row-level security, and whether the
        tables are distributed (a Citus coordinator).

    Raises:
        SchemaMismatch: naming the revision found and what fixes it.
        DatabaseUnavailable: if the database cannot be reached.
    """
    with translate_errors():
        async with engine.connect() as conn:
            exists = await conn.scalar(sa.text("SELECT to_regclass('alembic_version') IS NOT NULL"))
            found = (
                (await conn.execute(sa.text("SELECT version_num FROM alembic_version")))
                .scalars()
                .all()
                if exists
                else []
            )
            recorded = await conn.scalar(
                sa.text("SELECT to_regclass('cortex_schema_compat') IS NOT NULL")
            )
            serves_from = (
                await conn.scalar(sa.text("SELECT oldest_code_revision FROM cortex_schema_compat"))
                if recorded
                else None
            )
            bypasses = await conn.scalar(
                sa.text(
                    "SELECT rolsuper OR rolbypassrls FROM pg_catalog.pg_roles"
                    " WHERE rolname = current_user"
                )
            )
            distributed = await conn.run_sync(tables_distributed)
            shadowed = (await conn.scalars(sa.text(SHADOWED_TABLES_SQL))).all()
            creators = tuple(
                str(c) for c in (await conn.scalars(sa.text(FOREIGN_CREATORS_SQL))).all()
            )
    state = SchemaState(bool(bypasses), distributed, creators)
    if shadowed:
        raise SchemaMismatch(
            f"{', '.join(map(str, shadowed))}: named like cortex's tables and found on this"
            " login's search path before schema public: cortex lives in public; drop or rename what"
            " another role made there (SECURITY.md, Schema rights)"
        )
    if list(found) == [expected]:
        return state
    if (
        len(found) == 1
        and found[0] > expected
        and serves_from is not None
        and serves_from <= expected
    ):
        log.info("database at %s, which serves code from %s on", found[0], serves_from)
        return state
    have = ", ".join(found) or "no cortex schema"
    if len(found) == 1 and found[0] > expected:
        raise SchemaMismatch(
            f"database is at {have}, newer than this cortex ({expected}) and not safe with it: "
            "upgrade cortex"
        )
    raise SchemaMismatch(
        f"database is at {have}, this cortex needs {expected}: run `cortex db upgrade`"
    )
