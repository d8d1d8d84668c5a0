"""``cortex audit list`` and ``cortex sessions waiting``: the operator console's reads, on a terminal.

Both read through :class:`cortex.console.OperatorView`, so the URL must be a
login granted ``cortex_console`` (docs/deployment/roles.md); ``--scope``
is the operator scope (default: every tenant). Each prints a table, or
``--json``; ``--cursor`` continues where a page's ``next_cursor`` said.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from rich.table import Table

from cortex._cli_common import EXIT_OK, console, database_url, emit_json, literal, say, when
from cortex.console import (
    MAX_CONSOLE_PAGE,
    ActionPage,
    OperatorView,
    WaitingFilter,
    WaitingPage,
)
from cortex.models import SessionState

__all__ = ["add_console_commands"]

_T = TypeVar("_T")


def _with_view(args: argparse.Namespace, action: Callable[[OperatorView], Awaitable[_T]]) -> _T:
    url = database_url(args)

    async def run() -> _T:
        async with OperatorView(url, operator_scope=args.scope, pool_size=1) as view:
            return await action(view)

    return anyio.run(run)


def _where(args: argparse.Namespace) -> str:
    return "every tenant" if not args.scope else str(args.scope)


def cmd_audit_list(args: argparse.Namespace) -> int:
    page: ActionPage = _with_view(
        args,
        lambda view: view.list_actions(
            tenant=args.tenant, session_id=args.session, limit=args.limit, cursor=args.cursor
        ),
    )
    if args.json:
        emit_json(page.model_dump(mode="json"))
        return EXIT_OK
    if not page.rows:
        say(console(), f"no operator actions in {_where(args)}")
        return EXIT_OK
    table = Table(title=literal(f"operator actions in {_where(args)}"), title_justify="left")
    for column in ("at", "action", "outcome", "subject", "session", "scope", "detail"):
        table.add_column(column, overflow="fold")
    for a in page.rows:
        table.add_row(
            when(a.at),
            literal(a.action.value),
            literal(a.outcome),
            literal(a.subject),
            literal(a.session_id or "-"),
            literal(str(a.scope)),
            literal(", ".join(f"{k}={v}" for k, v in sorted(a.detail.items()))),
        )
    console().print(table)
    if page.next_cursor:
        say(console(), f"more: --cursor {page.next_cursor}")
    return EXIT_OK


def cmd_sessions_waiting(args: argparse.Namespace) -> int:
    flt = WaitingFilter(
        state=SessionState(args.state),
        tenant=args.tenant,
        agent_id=args.agent,
        search=args.search,
        limit=args.limit,
    )
    page: WaitingPage = _with_view(args, lambda view: view.list_waiting(flt, args.cursor))
    if args.json:
        emit_json(page.model_dump(mode="json"))
        return EXIT_OK
    if not page.rows:
        say(console(), f"no {args.state} sessions in {_where(args)}")
        return EXIT_OK
    table = Table(title=literal(f"{args.state} sessions in {_where(args)}"), title_justify="left")
    table.add_column("id", no_wrap=True)
    for column in ("tenant", "scope", "agent", "title", "waits on", "since"):
        table.add_column(column, overflow="fold")
    for r in page.rows:
        table.add_row(
            literal(r.session_id),
            literal(r.tenant),
            literal(str(r.scope)),
            literal(r.agent_id),
            literal(r.title or "-"),
            literal(r.question if r.question is not None else (r.reason or "-")),
            when(r.waiting_since),
        )
    console().print(table)
    if page.next_cursor:
        say(console(), f"more: --cursor {page.next_cursor}")
    return EXIT_OK


def _page_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scope",
        default=None,
        help="the operator scope: this scope and beneath it (default: every tenant)",
    )
    parser.add_argument(
        "--limit", type=int, default=50, help=f"rows per page, 20-{MAX_CONSOLE_PAGE} (default 50)"
    )
    parser.add_argument("--cursor", help="continue after the page that printed this cursor")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_console_commands(
    commands: Any, parser_class: type[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``cortex audit …`` under ``commands``; ``common`` holds the global options."""
    audit = commands.add_parser(
        "audit",
        help="the operator audit trail (a login granted cortex_console)",
        parents=[common],
    )
    sub = audit.add_subparsers(dest="audit_command", required=True, parser_class=parser_class)
    listing = sub.add_parser(
        "list", help="operator actions, newest first, across tenants", parents=[common]
    )
    listing.add_argument("--tenant", help="only this tenant's actions")
    listing.add_argument(
        "--session",
        help="only this session's actions (a ses_… id; with --tenant unless --scope names one)",
    )
    _page_options(listing)
    listing.set_defaults(func=cmd_audit_list)


def add_waiting_command(sessions: Any, common: argparse.ArgumentParser) -> None:
    """Register ``cortex sessions waiting`` under the ``sessions`` subcommands."""
    waiting = sessions.add_parser(
        "waiting",
        help="sessions waiting on a human across tenants (a login granted cortex_console)",
        parents=[common],
    )
    waiting.add_argument(
        "--state",
        choices=["paused", "interrupted", "aborted"],
        default="paused",
        help="which waiting sessions (default: paused)",
    )
    waiting.add_argument("--tenant", help="only this tenant")
    waiting.add_argument("--agent", help="only this agent")
    waiting.add_argument("--search", help="a case-insensitive substring of the title")
    _page_options(waiting)
    waiting.set_defaults(func=cmd_sessions_waiting)
