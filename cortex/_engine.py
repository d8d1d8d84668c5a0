"""Engine and URL normalisation, and the schema-revision check.

Nothing here runs a store call: :mod:`cortex._db` owns transactions.
"""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from cortex._executor import Row
from cortex.errors import InvalidInput, SchemaMismatch, translate_errors

__all__ = [
    "CHECKOUTS",
    "CONNECT_TIMEOUT",
    "SCHEMA_REVISION",
    "check_schema",
    "driver_dsn",
    "make_engine",
    "normalise_url",
]

# The Alembic revision this code reads and writes. A test keeps it equal to the
# head of alembic/versions.
SCHEMA_REVISION: Final = "20261015000007"


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


# Seconds asyncpg may take to open a connection (its own default is 60). A
# cancelled caller does not wait for it, but the checkout it abandoned runs on
# (cortex._db) and holds a pool slot until the connect succeeds or times out.
CONNECT_TIMEOUT: Final = 10

# Key in a pooled connection's ``info``: how many times the pool handed that
# DBAPI connection out. SQLAlchemy clears ``info`` whenever the pool opens a
# new connection for the slot, so 1 means "opened for this checkout", which is
# how the transaction runner tells a new connection from a pooled one.
CHECKOUTS: Final = "cortex_checkouts"


def _count_checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
    record.info[CHECKOUTS] = record.info.get(CHECKOUTS, 0) + 1


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
    engine = create_async_engine(normalise_url(url), connect_args=connect_args, **pool_options)
    event.listen(engine.sync_engine, "checkout", _count_checkout)
    return engine


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
