"""Expand, then contract: at every revision of the chain, the previous release keeps working.

The chain is read from the Alembic script directory, so a revision added later
is walked and checked too. At each revision:

- the legacy release (schema 20260801000001) inserts and reads its rows with
  its own statements, and they are all there;
- from the revision this code was built for (``SCHEMA_REVISION``) on,
  cortex's own calls run through the store, as its application role, with
  the store told that the revision is its own (a release checks the revision
  it was built for; a newer one that is safe with it must serve it). So
  when a revision is added, this test runs the release before it (this
  code, before SCHEMA_REVISION moves) against it.

Every revision also says in its docstring which release it is safe with and
offers ``data_loss`` (what its downgrade would destroy), which the downgrade
guard asks.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

import cortex
from cortex import ListFilter, NewMessage, RequestedInput, use_scope
from cortex._db.engine import SCHEMA_REVISION
from cortex.migrate import alembic_config, backfill, grant_sql, upgrade
from tests.conftest import admin, with_database
from tests.migrations.legacy import LEGACY_READ, execute, fetch, insert_legacy

# The revision this code was built for: from it on, this release must keep
# working while later revisions are applied.
LAST_RELEASE = SCHEMA_REVISION


def chain() -> list[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def test_every_revision_says_what_it_is_safe_with_and_what_a_downgrade_drops() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    for rev in script.walk_revisions():
        assert rev.module.__doc__ is not None
        assert "Safe with" in rev.module.__doc__, (
            f"{rev.revision}: say which release it is safe with"
        )
        assert callable(getattr(rev.module, "data_loss", None)), (
            f"{rev.revision}: define data_loss(conn) -> list[str] (what the downgrade drops)"
        )


async def _last_release_calls(url: str, tenant: str, round_: int) -> None:
    async with cortex.connect(url) as store:
        with use_scope(f"{tenant}/support/u{round_}"):
            session = await store.resolve_session("bot")
            await store.append_messages(
                session.id,
                [
                    NewMessage("user", f"refund please {round_}"),
                    NewMessage(
                        "assistant",
                        "Approve?",
                        requested_input=RequestedInput(
                            interrupt_id="ok",
                            message="Approve?",
                            response_schema={"type": "boolean"},
                        ),
                    ),
                ],
            )
            got = await store.get_session(session.id)
            await store.update_session(got.model_copy(update={"title": f"refund case {round_}"}))
            assert got.message_count == 2
            assert got.state.value == "paused"
            await store.resume(session.id, "ok", True, author="ops")
            await store.mark_interrupted(session.id, "deploy")
            await store.clear_interrupted(session.id)
            assert [m.seq for m in await store.list_messages(session.id)] == [1, 2, 3]
        with use_scope(tenant):
            found = await store.list_sessions(ListFilter(search=f"refund case {round_}"))
            assert [s.id for s in found] == [session.id]
            # one per round, and the backfilled legacy conversation
            assert await store.count_sessions(ListFilter(agent_id="bot")) == round_ + 2


def test_previous_release_works_at_every_revision(
    blank_db: str, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    revisions = chain()
    assert LAST_RELEASE in revisions
    role = f"cortex_app_{uuid.uuid4().hex[:8]}"
    tenant = f"t{uuid.uuid4().hex[:8]}"
    asyncio.run(admin(server_url, f'CREATE ROLE "{role}" LOGIN'))
    app_url = with_database(blank_db, str(make_url(blank_db).database), user=role)
    written: list[str] = []
    try:
        for i, revision in enumerate(revisions):
            upgrade(blank_db, revision)
            # The legacy release: its insert, then its read of the conversation.
            content = f"legacy at {revision}"
            insert_legacy(blank_db, [("bot", f"{tenant}/u1", "user", content)], start=i)
            written.append(content)
            rows = fetch(blank_db, LEGACY_READ, "bot", f"{tenant}/u1")
            assert [r["content"] for r in rows] == written, revision
            if i < revisions.index(LAST_RELEASE):
                continue
            # The last release, as its application role, at a revision it may not know.
            execute(blank_db, *grant_sql(role))
            monkeypatch.setattr("cortex._db.engine.SCHEMA_REVISION", revision)
            asyncio.run(_last_release_calls(app_url, tenant, i - revisions.index(LAST_RELEASE)))
        # Legacy rows written after the backfill revision join their session.
        backfill(blank_db)
        sessions = fetch(
            blank_db,
            "SELECT message_count FROM sessions WHERE agent_id = 'bot' AND scope = $1",
            f"{tenant}/u1",
        )
        assert [r["message_count"] for r in sessions] == [len(written)]
    finally:
        asyncio.run(admin(blank_db, f'DROP OWNED BY "{role}"'))
        asyncio.run(admin(server_url, f'DROP ROLE "{role}"'))
