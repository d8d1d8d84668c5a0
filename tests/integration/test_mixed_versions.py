"""The previous release, still running during a rolling deploy, and this one share metadata.

The previous release (schema 20261015000007) reads and writes session
metadata in the jsonb column only; this one keeps the host's text verbatim
beside it (revision 20261201000009). This release must read what the
previous one wrote, even over its own verbatim text. (The other way round
the previous release reads ``{}``: documented in the revision.) The
previous release's statements are played as raw SQL as the application role.
"""

from __future__ import annotations

import json

import asyncpg

import cortex
from cortex import use_scope
from cortex.ids import parse_id


async def test_this_release_reads_what_the_previous_one_wrote(
    store: cortex.Store, tenant: str, app_conn: asyncpg.Connection
) -> None:
    with use_scope(f"{tenant}/u"):
        s = await store.create_session("bot", metadata={"plan": "pro", "limit": 1e16})
    sid = parse_id("ses", s.id)
    async with app_conn.transaction():
        await app_conn.execute("SELECT set_config('cortex.tenant', $1, true)", tenant)
        # The previous release rewrites metadata the only way it knows (its update_session).
        await app_conn.execute(
            "UPDATE sessions SET title = 'renamed', metadata = $2::jsonb WHERE id = $1",
            sid,
            json.dumps({"plan": "free"}),
        )
    with use_scope(f"{tenant}/u"):
        got = await store.get_session(s.id)
        assert got.metadata == {"plan": "free"}  # not the stale verbatim text
        assert got.title == "renamed"
        again = await store.update_session(got.model_copy(update={"metadata": {"plan": "team"}}))
        assert again.metadata == {"plan": "team"}
