"""Every listing index carries ``is_default``, so no default-only page reads a row it drops.

Revision ID: 20261201000015
Revises: 20261201000014
Create Date: 2026-12-01

Why it exists: revision 20261201000014 put ``is_default`` last in the
whole-tenant listing index. The five other listing indexes (by agent, by
exact scope, by agent and exact scope, by depth-2 subtree, by agent and
depth-2 subtree) still made a ``default_only`` page read each session's row
to test it. At 1,000,000 sessions, under the generic plans the
routines run: an exact-scope default-only page of a 200,000-session tenant
4.3 ms, a depth-2 one 4.0 ms, by agent across the tenant 2.0 ms; with the
flag in the index 0.42, 0.80 and 0.44 ms (docs/query-plans.md). The order
each index gives is unchanged (``(updated_at, id)`` is unique), and it is
the same number of indexes, one byte wider per entry: an append writes what
it wrote before.

Safe with: every cortex release from 20261201000009 on (an index change
only; every listing keeps an index in the same order).
Online: each index is built ``CONCURRENTLY`` beside the old one, the old one
dropped ``CONCURRENTLY``, the new one renamed under a short lock timeout
with retries (ddl_v1.rebuild_index); a run killed half way runs again
from the top. Downgrade rebuilds the old forms the same way.
"""

from collections.abc import Sequence

from sqlalchemy.engine import Connection

from alembic import op
from cortex._revision_helpers import ddl_v1 as ddl

revision: str = "20261201000015"
down_revision: str | Sequence[str] | None = "20261201000014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# The oldest code (its SCHEMA_REVISION) that works on a database at this revision.
safe_with_code_from: str = "20261201000009"

_ORDER = "updated_at DESC, id DESC"
_DEPTH_2 = " WHERE scope_depth >= 2"
# Index name: (leading key columns, partial predicate).
INDEXES: dict[str, tuple[str, str]] = {
    "ix_sessions_agent_recent": ("tenant_id, agent_id", ""),
    "ix_sessions_scope_recent": ("tenant_id, scope", ""),
    "ix_sessions_agent_scope_recent": ("tenant_id, agent_id, scope", ""),
    "ix_sessions_l2_recent": ("tenant_id, scope_l2", _DEPTH_2),
    "ix_sessions_agent_l2_recent": ("tenant_id, agent_id, scope_l2", _DEPTH_2),
}


def _definition(leading: str, where: str, *, flag: bool) -> str:
    return f"sessions ({leading}, {_ORDER}{', is_default' if flag else ''}){where}"


def _keys(leading: str, *, flag: bool) -> int:
    return leading.count(",") + 1 + 2 + int(flag)


def upgrade() -> None:
    ddl.check(*(ddl.relation_check(f"{name}_next", "index", on="sessions") for name in INDEXES))
    with op.get_context().autocommit_block():
        for name, (leading, where) in INDEXES.items():
            ddl.rebuild_index(
                name, _definition(leading, where, flag=True), _keys(leading, flag=True)
            )


def data_loss(bind: Connection) -> list[str]:
    """What this revision's downgrade would destroy: nothing (indexes)."""
    return []


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name, (leading, where) in INDEXES.items():
            ddl.rebuild_index(
                name, _definition(leading, where, flag=False), _keys(leading, flag=False)
            )
