"""Engine, URL normalisation, the transaction helper and the schema-revision check.

:func:`run_transaction` is the only way the store touches the database: one
transaction per call, the tenant bound for row-level security with a
transaction-local ``set_config``, rollback unless the body returns, bounded
retries of serialization failures and deadlocks, and every driver error
translated to a :class:`~cortex.errors.CortexError`. The functions it runs
never commit.
"""

from __future__ import annotations

import logging
from asyncio import CancelledError
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, TypeVar

import anyio
import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import asyncpg as pg_asyncpg
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cortex._tables import TENANT_SETTING
from cortex.errors import (
    RETRYABLE_SQLSTATES,
    CortexError,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    SchemaMismatch,
    sqlstate_of,
    translate,
    translate_errors,
)
from cortex.scope import Scope

__all__ = [
    "SCHEMA_REVISION",
    "Result",
    "Row",
    "Tx",
    "check_schema",
    "driver_dsn",
    "make_engine",
    "normalise_url",
    "run_transaction",
]

log = logging.getLogger("cortex")

# The Alembic revision this code reads and writes. A test keeps it equal to the
# head of alembic/versions.
SCHEMA_REVISION: Final = "20261015000007"

# Serialization failures and deadlocks are retried this many times in all; the
# backoff doubles from 5 ms so that two colliding transactions fall apart.
MAX_ATTEMPTS: Final = 5
_BACKOFF_SECONDS: Final = 0.005

T = TypeVar("T")


class _StaleConnection(Exception):
    """The connection failed before the transaction began; nothing was written."""


class RetryTransaction(Exception):
    """Raised by a transaction body to be run again from the start on a new snapshot."""


class Row(asyncpg.Record):
    """asyncpg's record with attribute access (``row.id``), as cortex reads columns."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Result:
    """The rows of one statement, read the way cortex reads them."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[Row]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)

    def all(self) -> list[Row]:
        return self._rows

    def first(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def one(self) -> Row:
        if len(self._rows) != 1:
            raise AssertionError(f"expected one row, got {len(self._rows)}")
        return self._rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]

    def scalar_one_or_none(self) -> Any:
        row = self.first()
        return None if row is None else row[0]


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: tuple[str, ...]
    defaults: dict[str, Any]


_DIALECT: Final = pg_asyncpg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves dialect __init__ unannotated


@cache
def _compile(stmt: sa.ClauseElement) -> _Compiled:
    # Statement shapes are built once (cortex._filters) and compiled once here;
    # values embedded in a shape (e.g. kind = 'interrupted') are its defaults.
    compiled = stmt.compile(dialect=_DIALECT)
    order = getattr(compiled, "positiontup", None) or ()  # asyncpg's $n style is positional
    return _Compiled(str(compiled), tuple(order), dict(compiled.params))


class Tx:
    """One transaction's statements, executed straight on the asyncpg connection.

    SQLAlchemy builds and compiles each statement shape once; asyncpg prepares
    and caches it per connection. Executing on the driver skips SQLAlchemy's
    per-call execution machinery (greenlet hops, result processing), which
    cost more CPU than PostgreSQL spent running the hot statements.
    """

    __slots__ = ("driver",)

    def __init__(self, driver: asyncpg.Connection) -> None:
        self.driver = driver

    async def execute(
        self, stmt: sa.ClauseElement, params: Mapping[str, Any] | None = None
    ) -> Result:
        """Run a statement with named parameters; its rows (possibly none)."""
        compiled = _compile(stmt)
        given = params or {}
        args = [
            given[name] if name in given else compiled.defaults[name] for name in compiled.order
        ]
        rows: list[Row] = await self.driver.fetch(compiled.sql, *args, record_class=Row)
        return Result(rows)


def normalise_url(url: str | URL) -> URL:
    """Accept ``postgresql://``, ``postgres://`` or ``postgresql+asyncpg://``; return the asyncpg form.

    Raises:
        InvalidInput: for any other driver or an unparsable URL.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidInput("database URL: cannot parse it") from None
    if parsed.drivername in ("postgresql", "postgres", "postgresql+asyncpg"):
        return parsed.set(drivername="postgresql+asyncpg")
    raise InvalidInput(
        f"database URL: expected postgresql:// or postgresql+asyncpg://, got {parsed.drivername}://"
    )


# Seconds asyncpg may take to open a connection (its own default is 60): a
# checkout is shielded from cancellation, so this bounds how long a cancelled
# caller can wait for one.
CONNECT_TIMEOUT: Final = 10


def driver_dsn(url: str | URL, *, database: str | None = None, user: str | None = None) -> str:
    """The URL in asyncpg's own ``postgresql://`` form, optionally for another database or user.

    Query parameters (such as the embedded server's ``?host=<socket dir>``) are kept.
    """
    parsed = make_url(url).set(drivername="postgresql")
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
    connect_args = dict(pool_options.pop("connect_args", None) or {})
    connect_args.setdefault("timeout", CONNECT_TIMEOUT)
    if manual_transactions:
        pool_options["isolation_level"] = "AUTOCOMMIT"
        connect_args["record_class"] = Row
    return create_async_engine(normalise_url(url), connect_args=connect_args, **pool_options)


async def check_schema(engine: AsyncEngine) -> None:
    """Raise SchemaMismatch unless the database is at :data:`SCHEMA_REVISION`.

    Raises:
        SchemaMismatch: naming the revision found and the command that fixes it.
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
    if list(found) != [SCHEMA_REVISION]:
        have = ", ".join(found) or "no cortex schema"
        raise SchemaMismatch(
            f"database is at {have}, this cortex needs {SCHEMA_REVISION}: run `cortex db upgrade`"
        )


async def run_transaction(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    *,
    custom_plans: bool = False,
) -> T:
    """Run ``body`` in one transaction bound to ``scope``'s tenant; commit if it returns.

    Concurrency: a serialization failure or deadlock rolls back and runs the
    whole body again (at most :data:`MAX_ATTEMPTS` times), so ``body`` must
    have no side effects outside the database. Cancellation of the caller
    rolls back; cleanup and COMMIT are shielded from it, so a cancelled call
    either committed completely or wrote nothing, and the pooled connection
    is returned clean or discarded, never poisoned.

    Raises:
        CortexError: every database-layer failure, translated, cause chained.
    """
    delay = _BACKOFF_SECONDS
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with translate_errors():
                return await _attempt(engine, scope, body, custom_plans)
        except DatabaseError as exc:
            state = sqlstate_of(exc.__cause__) if exc.__cause__ is not None else None
            if state not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                raise
        except RetryTransaction:
            if attempt == MAX_ATTEMPTS:
                raise DatabaseError(
                    f"gave up after {MAX_ATTEMPTS} attempts: the transaction kept colliding"
                ) from None
        except _StaleConnection as exc:
            # Nothing was sent but BEGIN: safe to run again on a fresh connection.
            if attempt == MAX_ATTEMPTS:
                mapped = translate(exc.__cause__) if exc.__cause__ is not None else None
                raise (mapped or DatabaseUnavailable("no usable database connection")) from (
                    exc.__cause__
                )
            log.debug("pooled connection was dead; retrying on a new one")
            continue
        log.debug("retrying transaction (attempt %d)", attempt)
        await anyio.sleep(delay)
        delay *= 2
    raise AssertionError("unreachable")  # pragma: no cover


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    raw = (await conn.get_raw_connection()).driver_connection
    if not isinstance(raw, asyncpg.Connection):
        raise DatabaseUnavailable("the pooled connection has no live asyncpg connection")
    return raw


def _begin_sql(scope: Scope, *, custom_plans: bool) -> str:
    # One simple-protocol round trip: BEGIN and the tenant binding together
    # (a bind parameter would need the extended protocol and a second round
    # trip). The tenant is a validated scope segment ([A-Za-z0-9._:-], no
    # quote), so the literal cannot break out; quotes are doubled regardless.
    tenant = scope.tenant.replace("'", "''")
    sql = f"BEGIN; SELECT set_config('{TENANT_SETTING}', '{tenant}', true)"
    if custom_plans:
        # Searches: a term's selectivity decides the plan (a rare term wants
        # the trigram index, a common one the listing index), so a plan
        # cached for one term is wrong for the next (docs/query-plans.md, P4).
        sql += "; SET LOCAL plan_cache_mode = force_custom_plan"
    return sql


async def _attempt(
    engine: AsyncEngine,
    scope: Scope,
    body: Callable[[Tx], Awaitable[T]],
    custom_plans: bool,
) -> T:
    # Checkout is shielded: cancelling it mid-handshake would tear down a
    # half-open connection (asyncpg then reports a lost connection on a
    # future nobody awaits). A cancelled caller instead waits for the
    # checkout, bounded by pool_timeout and the connect timeout, then rolls
    # back cleanly at its next await.
    with anyio.CancelScope(shield=True):
        conn = await engine.connect()
    try:
        driver = await _driver(conn)
        try:
            # Row-level security reads the tenant setting; it lives until
            # COMMIT/ROLLBACK only, so a pooled connection never carries a
            # tenant into its next checkout.
            try:
                await driver.execute(_begin_sql(scope, custom_plans=custom_plans))
            except (
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.InternalClientError,
                OSError,
            ) as exc:
                # A pooled connection the server closed while it sat idle (a
                # restart, an idle timeout, a managed database reaping it).
                raise _StaleConnection from exc
            result = await body(Tx(driver))
            with anyio.CancelScope(shield=True):
                await driver.execute("COMMIT")
        except BaseException as failure:
            with anyio.CancelScope(shield=True):
                await _discard_transaction(conn, driver, failure)
            raise
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()
    return result


async def _discard_transaction(
    conn: AsyncConnection, driver: asyncpg.Connection, failure: BaseException
) -> None:
    """Roll back after ``failure``; a connection that cannot be trusted leaves the pool.

    An error PostgreSQL reported (or one cortex raised, or a cancellation,
    which asyncpg recovers from) leaves the protocol in order: ROLLBACK, and
    the connection goes back to the pool. Anything else (a lost socket, a
    client-side protocol error) means its state is unknown: terminate it and
    let the pool open a new one. ROLLBACK is sent unconditionally on the first
    path because after a cancelled statement the client-side transaction
    status can lag the server's.
    """
    orderly = isinstance(
        failure, asyncpg.PostgresError | CortexError | RetryTransaction | CancelledError
    ) and not isinstance(failure, asyncpg.PostgresConnectionError)
    if orderly and not driver.is_closed():
        try:
            await driver.execute("ROLLBACK")
        except Exception:  # the driver may raise anything on a dying socket
            log.debug("rollback failed; dropping the connection", exc_info=True)
        else:
            return
    try:
        driver.terminate()
    except Exception:  # already gone
        log.debug("terminate failed", exc_info=True)
    try:
        await conn.invalidate()
    except Exception:  # the pool drops it either way
        log.debug("invalidate failed", exc_info=True)
