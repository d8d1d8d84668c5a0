"""``cortex retention run``: carry out the retention policies, for a cron job.

With ``--scope PATH`` the run acts on PATH and beneath it, as any role may
(row-level security keeps it in PATH's tenant). Without it the run acts on
every tenant that has a policy, which only a role that reads every
tenant's rows can list: the owner, or a BYPASSRLS role. Each tenant is one
:meth:`cortex.Store.apply_retention`; one that fails does not stop the
others, and the exit code says so (1). Progress goes to stderr (a bar on a
terminal, log lines elsewhere); the report to stdout, or ``--json``.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from typing import Any, Final

import anyio
import sqlalchemy as sa

from cortex._cli_common import EXIT_ERROR, EXIT_OK, UsageError, database_url, echo, emit_json
from cortex._db.engine import make_engine
from cortex._revision_helpers.progress_v1 import Advance, progress
from cortex._sql.retention import tenants_statement
from cortex.errors import CortexError, translate_errors
from cortex.models import RetentionReport
from cortex.scope import Scope, use_scope
from cortex.store import connect

__all__ = ["add_retention_commands"]

# What a report counts, in the order a line names it.
_COUNTED: Final = (
    "sessions",
    "messages",
    "pending_inputs",
    "markers",
    "trimmed_sessions",
    "trimmed_messages",
)

_EVERY_TENANT: Final = (
    "without --scope, `cortex retention run` acts on every tenant, and the role {role}"
    " is held to row-level security, so it cannot list them: connect as the owner (the"
    " role that ran `cortex db upgrade`) or a BYPASSRLS role, or name a tenant with --scope"
)


def _line(report: RetentionReport) -> str:
    verb = "would remove" if report.dry_run else "removed"
    erased = "would be erased" if report.dry_run else "erased"
    return (
        f"retention in {report.scope}: {report.sessions:,} sessions {erased},"
        f" {report.messages:,} messages {verb} ({report.trimmed_messages:,} trimmed from"
        f" {report.trimmed_sessions:,} sessions), {report.pending_inputs:,} pending inputs,"
        f" {report.markers:,} markers"
    )


async def _tenants(url: str) -> list[str]:
    """Every tenant with a policy: one statement across every tenant's rows."""
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with translate_errors():
            async with engine.connect() as conn:
                return [str(t) for t in (await conn.scalars(tenants_statement())).all()]
    finally:
        await engine.dispose()


async def _run(args: argparse.Namespace) -> tuple[list[RetentionReport], list[str]]:
    url = database_url(args)
    scope = None if args.scope is None else Scope.parse(args.scope)
    reports: list[RetentionReport] = []
    failed: list[str] = []
    async with connect(url, pool_size=1, max_overflow=0) as store:
        if scope is None:
            if not store.bypasses_row_level_security:
                raise UsageError(_EVERY_TENANT.format(role=store.engine.url.username or "used"))
            scopes = [Scope.parse(t) for t in await _tenants(url)]
        else:
            scopes = [scope]
        label = "retention (dry run)" if args.dry_run else "retention"
        with ExitStack() as stack:
            advance: Advance = _nothing
            if scope is None:
                advance = stack.enter_context(
                    progress(f"{label}: every tenant", len(scopes), unit="tenants")
                )
            for target in scopes:
                with use_scope(target):
                    try:
                        reports.append(
                            await store.apply_retention(
                                dry_run=args.dry_run,
                                on_progress=None if scope is None else _bar(stack, label, target),
                            )
                        )
                    except CortexError as exc:
                        if scope is not None:
                            raise
                        echo(f"cortex: error: retention in {target}: {exc}", err=True)
                        failed.append(str(target))
                if scope is None:
                    advance(1)
    return reports, failed


def _nothing(done: int) -> None:
    """No bar: a run of one scope draws its own."""


def _bar(stack: ExitStack, label: str, target: Scope) -> Any:
    """An ``on_progress`` that opens the bar when the run knows its candidates."""
    state: dict[str, Any] = {"advance": None, "done": 0}

    def on_progress(examined: int, total: int) -> None:
        if state["advance"] is None:
            state["advance"] = stack.enter_context(
                progress(f"{label} in {target}", total, unit="sessions")
            )
        state["advance"](examined - state["done"])
        state["done"] = examined

    return on_progress


def cmd_run(args: argparse.Namespace) -> int:
    reports, failed = anyio.run(_run, args)
    total = {name: sum(getattr(r, name) for r in reports) for name in _COUNTED}
    if args.json:
        emit_json(
            {
                "dry_run": args.dry_run,
                "tenants": [r.model_dump(mode="json") for r in reports],
                "total": total,
                "failed": failed,
            }
        )
    else:
        for report in reports:
            echo(_line(report))
        if len(reports) != 1:
            echo(
                f"{len(reports):,} scopes: {total['sessions']:,} sessions,"
                f" {total['messages']:,} messages"
                + (f"; {len(failed):,} failed: {', '.join(failed)}" if failed else "")
            )
    return EXIT_ERROR if failed else EXIT_OK


def add_retention_commands(
    commands: Any, parser_class: type[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``cortex retention …`` under ``commands``; ``common`` holds the global options."""
    retention = commands.add_parser(
        "retention", help="carry out the retention policies (a cron job)", parents=[common]
    )
    sub = retention.add_subparsers(
        dest="retention_command", required=True, parser_class=parser_class
    )
    run = sub.add_parser(
        "run",
        help="erase idle sessions and trim long ones, as their policies say",
        parents=[common],
    )
    run.add_argument(
        "--scope",
        help="act on this scope and beneath it (default: every tenant with a policy,"
        " which needs the owner or a BYPASSRLS role)",
    )
    run.add_argument("--dry-run", action="store_true", help="count what would go; remove nothing")
    run.add_argument("--json", action="store_true", help="print JSON")
    run.set_defaults(func=cmd_run)
