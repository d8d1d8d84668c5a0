"""``cortex demo``: cortex's main job, narrated, on the embedded default or a given database.

It migrates the database, then plays an agent backend serving two tenants:
runs resolve their default sessions concurrently, messages are appended
concurrently, listing, search and count work inside scopes, another tenant
sees nothing, and an operator finds a paused session, resumes and aborts it. Every figure printed is read back from the database.

On the embedded server the demo owns a database of its own (``cortex_demo``,
recreated each run) and connects as a plain application role, so row-level
security is live. On a database you name, it uses tenant names with a
per-run suffix and deletes its sessions afterwards (unless ``--keep``).
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Final

import anyio
import anyio.to_thread
import asyncpg
from rich.console import Console
from rich.table import Table

import cortex
from cortex import ListFilter, NewMessage, RequestedInput, Session, SessionState, use_scope
from cortex._cli_common import literal
from cortex._db.engine import driver_dsn
from cortex.migrate import grant_sql, upgrade

__all__ = ["run_demo"]

DEMO_DATABASE: Final = "cortex_demo"
DEMO_ROLE: Final = "cortex_demo_app"

_QUESTIONS: Final = [
    "My invoice shows the wrong amount",
    "How do I reset my password?",
    "Can I get a refund for last month?",
    "The export to CSV fails",
    "Please change my billing address",
]


async def _prepare_embedded(server_url: str) -> tuple[str, str]:
    """Recreate the demo database and role; return (owner URL, application URL)."""
    conn = await asyncpg.connect(driver_dsn(server_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{DEMO_DATABASE}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{DEMO_DATABASE}"')
        exists = await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", DEMO_ROLE)
        if not exists:
            await conn.execute(f'CREATE ROLE "{DEMO_ROLE}" LOGIN')
    finally:
        await conn.close()
    owner = driver_dsn(server_url, database=DEMO_DATABASE)
    return owner, driver_dsn(server_url, database=DEMO_DATABASE, user=DEMO_ROLE)


async def _grant(owner_url: str) -> None:
    conn = await asyncpg.connect(owner_url)
    try:
        for statement in grant_sql(DEMO_ROLE):
            await conn.execute(statement)
    finally:
        await conn.close()


def _sessions_table(title: str, sessions: list[Session]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("scope", "agent", "title", "msgs", "default", "last message"):
        table.add_column(column, overflow="fold")
    for s in sessions:
        table.add_row(
            literal(str(s.scope)),
            literal(s.agent_id),
            literal(s.title or "-"),  # read back from the database: escaped, never markup
            str(s.message_count),
            "yes" if s.is_default else "",
            literal(s.last_message[:40]),
        )
    return table


def _refund_question(amount: int) -> NewMessage:
    """The agent's message asking a human to approve a refund (the session then pauses)."""
    return NewMessage(
        "assistant",
        f"A refund of ${amount} needs a human.",
        requested_input=RequestedInput(
            interrupt_id="approve-refund",
            message=f"Approve a ${amount} refund?",
            response_schema={
                "type": "object",
                "properties": {"approved": {"type": "boolean"}},
                "required": ["approved"],
            },
        ),
    )


async def run_demo(url: str, *, embedded: bool, keep: bool, console: Console) -> None:
    """Narrate cortex's main job against ``url`` (a superuser URL when ``embedded``)."""
    started = time.perf_counter()
    console.rule("[bold]cortex demo")
    if embedded:
        console.print("PostgreSQL: the embedded server (a wheel, no install) at", url)
        owner_url, app_url = await _prepare_embedded(url)
        suffix = ""
    else:
        console.print("PostgreSQL: the database you named (--database-url or CORTEX_DATABASE_URL)")
        owner_url = app_url = url
        suffix = "-" + uuid.uuid4().hex[:6]

    console.print("Migrating: [bold]cortex db upgrade[/] (Alembic, advisory-locked)")
    await anyio.to_thread.run_sync(upgrade, owner_url)
    if embedded:
        await _grant(owner_url)
        console.print(
            f"The service connects as [bold]{DEMO_ROLE}[/]: a plain role, so row-level security applies"
        )

    acme, globex = f"acme{suffix}", f"globex{suffix}"
    users = [f"{acme}/support/user-{i}" for i in (1, 2, 3)] + [f"{globex}/sales/user-9"]
    agents = ["support-bot", "billing-bot"]
    async with cortex.connect(app_url) as store:
        if store.bypasses_row_level_security:
            console.print(
                "[bold red]Warning:[/] this URL logs in as a superuser or BYPASSRLS role, so "
                "PostgreSQL's row-level security does not apply: only cortex's own predicates "
                "keep tenants apart. A service connects as a plain role (`cortex db grant ROLE`)."
            )
        console.rule("1. Runs resolve their default session, concurrently")
        resolved: dict[tuple[str, str], set[str]] = {}

        async def run(scope: str, agent: str) -> None:
            with use_scope(scope):
                session = await store.resolve_session(agent)
            resolved.setdefault((scope, agent), set()).add(session.id)

        async with anyio.create_task_group() as tg:
            for _ in range(5):  # five runs race for each (scope, agent)
                for scope in users:
                    for agent in agents:
                        tg.start_soon(run, scope, agent)
        calls = 5 * len(users) * len(agents)
        ones = sum(len(ids) == 1 for ids in resolved.values())
        console.print(
            f"{calls} concurrent resolve_session calls -> {len(resolved)} (scope, agent) pairs, "
            f"each with exactly one default: [bold]{ones == len(resolved)}[/]"
        )

        console.rule("2. Messages appended concurrently; counters kept in the same transaction")
        rng = random.Random(7)
        targets: list[tuple[str, str]] = []
        for (scope, _agent), ids in resolved.items():
            targets.extend((scope, sid) for sid in ids)

        async def converse(scope: str, session_id: str, question: str) -> None:
            with use_scope(scope):
                await store.append_messages(
                    session_id,
                    [
                        NewMessage("user", question),
                        NewMessage("assistant", f"On it: {question.lower()}"),
                    ],
                )

        async with anyio.create_task_group() as tg:
            for i in range(40):
                scope, sid = targets[i % len(targets)]
                tg.start_soon(converse, scope, sid, rng.choice(_QUESTIONS))
        with use_scope(acme):
            titled = await store.list_sessions(ListFilter(agent_id="billing-bot", limit=1))
            if titled:
                titled[0].title = "Billing dispute"
                await store.update_session(titled[0])
            listed = await store.list_sessions(ListFilter(limit=100))
        total = sum(s.message_count for s in listed)
        console.print(
            f"40 concurrent appends of 2 messages; acme's sessions count {total} messages"
        )
        console.print(_sessions_table(f"{acme}: every session in the tenant (subtree)", listed))

        console.rule("3. Listing, search and count inside a scope")
        with use_scope(f"{acme}/support/user-1"):
            mine = await store.list_sessions(ListFilter(exact=True))
        console.print(f"{acme}/support/user-1, exact: {len(mine)} sessions (its two agents)")
        with use_scope(f"{acme}/support"):
            # Search matches the title and the last message's preview (docs/search.md):
            # the title set in scene 2 makes this the same on every run.
            disputes = await store.list_sessions(ListFilter(search="dispute"))
            n_disputes = await store.count_sessions(ListFilter(search="dispute"))
            n_bot = await store.count_sessions(ListFilter(agent_id="support-bot"))
            n_default = await store.count_sessions(ListFilter(default_only=True))
        console.print(
            f"{acme}/support: search 'dispute' (title or last message) -> {len(disputes)} listed, "
            f"count {n_disputes}; support-bot sessions {n_bot}; defaults {n_default}"
        )
        with use_scope(acme):
            pages = [s.id async for s in store.iter_sessions(ListFilter(limit=2))]
        console.print(
            f"iter_sessions with 2 per page walked {len(pages)} sessions by keyset cursor"
        )

        console.rule("4. Tenants are isolated")
        victim = listed[0]
        with use_scope(globex):
            seen = await store.count_sessions()
            try:
                await store.get_session(victim.id)
                verdict = "[red]LEAK[/]"
            except cortex.NotFound:
                verdict = "NotFound (no hint it exists)"
        console.print(
            f"{globex} counts {seen} sessions of its own; reading acme's {victim.id}: {verdict}"
        )
        with use_scope(f"{acme}-corp"):
            console.print(
                f"{acme}-corp (a look-alike tenant) sees {await store.count_sessions()} sessions"
            )

        console.rule("5. Switching the default thread")
        scope = users[0]
        with use_scope(scope):
            fresh = await store.create_session("support-bot", title="Second thread")
            await store.set_default_session(fresh.id)
            now = await store.resolve_session("support-bot")
            defaults = await store.count_sessions(
                ListFilter(agent_id="support-bot", exact=True, default_only=True)
            )
        console.print(
            f"{scope}: set_default_session -> resolve_session now returns {now.title!r}; "
            f"defaults for support-bot: {defaults}"
        )

        console.rule("6. Operators: a paused session, its resume, an abort")
        with use_scope(users[1]):
            ticket = await store.resolve_session("billing-bot")
            await store.append_message(ticket.id, _refund_question(140))
        with use_scope(acme):
            waiting = await store.list_sessions(ListFilter(state=SessionState.PAUSED))
            detail = await store.inspect_session(ticket.id)
        question = detail.pending[0]
        console.print(
            literal(
                f"paused in {acme}: {len(waiting)} session(s); {ticket.id} asks "
                f"{question.message!r}, expecting {question.response_schema}"
            )
        )
        with use_scope(users[1]):
            try:
                await store.resume(ticket.id, "approve-refund", {"approved": "yes"})
            except cortex.InvalidInput as exc:
                console.print(literal(f"a malformed answer is refused: {exc}"))
            await store.resume(ticket.id, "approve-refund", {"approved": True}, author="ops@acme")
            after = await store.inspect_session(ticket.id)
            console.print(f"resumed by ops@acme -> state {after.state.value}")
            await store.abort_session(ticket.id, "customer withdrew the request")
            aborted = await store.inspect_session(ticket.id)
        console.print(
            literal(f"aborted -> state {aborted.state.value}, reason {aborted.abort_reason!r}")
        )

        if keep:
            # A question left waiting, to practise the operator's loop on.
            with use_scope(users[0]):
                practice = await store.create_session("billing-bot", title="Refund 77")
                await store.append_message(practice.id, _refund_question(77))
            console.print(
                literal(
                    f"left {practice.id} paused in {users[0]} to practise on: cortex sessions"
                    f" list --state paused --scope {acme}, then show, then resume it"
                ),
                soft_wrap=True,
            )

        if not embedded and not keep:
            for tenant in (acme, globex):
                with use_scope(tenant):
                    async for s in store.iter_sessions(ListFilter(limit=200)):
                        await store.delete_session(s.id)
            console.print("Removed the demo's sessions from your database.")

    console.rule()
    console.print(f"Done in {time.perf_counter() - started:.1f} s.")
    if embedded and keep:
        from cortex.embedded import data_dir

        # Unwrapped, so a URL or a command copies whole.
        console.print(
            f"The server keeps running. Owner: {owner_url}\nApplication: {app_url}",
            markup=False,
            soft_wrap=True,
        )
        console.print(
            "Stop it with: cortex demo --stop  "
            f"(it runs pg_ctl -D {data_dir() / 'pgdata'} stop as the server's user)",
            markup=False,
            soft_wrap=True,
        )
